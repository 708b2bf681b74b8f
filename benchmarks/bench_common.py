"""Measurement helpers shared by the benchmark's workers and driver.

Memory (RSS, peak RSS), CPU shares of other processes (``/proc/stat``), the
package logger's epoch clock, and :func:`session_options_hook`, which changes the
package's ``SessionOptions`` through its documented hook
(``onnxgrad_sklearn.runtime.SESSION_OPTIONS_HOOKS``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time
import warnings

THREADS = 2
SEED = 0
RESULT_MARK = "BENCH_RESULT "
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def rss_mb() -> float:
    """Return the current resident set size of this process, in MB."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        import psutil

        return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    """Return the peak resident set size of this process, in MB (Linux: ru_maxrss in KB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def own_cpu_s() -> float:
    """CPU time of this process (all threads), user + system, in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_ticks() -> tuple[int, int] | None:
    """Return (busy, total) clock ticks of all CPUs from /proc/stat, None elsewhere."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(values) - values[3] - values[4], sum(values)


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``uptime``), None where unavailable."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


class CpuWindow:
    """Share of the CPUs that other processes used while the ``with`` block ran.

    From /proc/stat (all CPUs) minus this process's own CPU time; ``share`` stays
    None where /proc/stat is missing.
    """

    def __enter__(self):
        self._ticks = cpu_ticks()
        self._own = own_cpu_s()
        self.share = None
        return self

    def __exit__(self, *exc):
        ticks = cpu_ticks()
        if self._ticks and ticks and ticks[1] > self._ticks[1]:
            own = (own_cpu_s() - self._own) * os.sysconf("SC_CLK_TCK")
            others = ticks[0] - self._ticks[0] - own
            self.share = max(0.0, others / (ticks[1] - self._ticks[1]))
        return False


def time_calls(fn, n: int) -> float:
    """Return the mean duration of ``fn()`` over ``n`` calls, in microseconds."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


class EpochClock(logging.Handler):
    """Record the time and RSS at each "Iteration" log record of the estimators."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.times: list[float] = []
        self.rss: list[float] = []

    def emit(self, record):
        if str(record.msg).startswith("Iteration"):
            self.times.append(time.perf_counter())
            self.rss.append(rss_mb())


@contextlib.contextmanager
def package_log(handler: logging.Handler, level: int):
    """``handler`` on the package's logger at ``level`` (not propagated) meanwhile."""
    logger = logging.getLogger("onnxgrad_sklearn")
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def epoch_clock():
    """Give an :class:`EpochClock` on the package's logger (INFO, not propagated) meanwhile."""
    return package_log(EpochClock(), logging.INFO)


def git_state(*paths: str) -> dict:
    """The repository's commit and whether ``paths`` (all: the whole tree) have
    uncommitted changes (read only)."""
    import subprocess

    def git(*args):
        try:
            proc = subprocess.run(
                ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    status = git("status", "--short", "--", *paths)
    return {"commit": git("rev-parse", "--short", "HEAD"), "uncommitted_changes": bool(status)}


@contextlib.contextmanager
def session_options_hook(hook):
    """Apply ``hook(options, threads)`` to every session the package makes meanwhile.

    Through the package's documented hook, ``runtime.SESSION_OPTIONS_HOOKS``.
    """
    from onnxgrad_sklearn import runtime

    runtime.SESSION_OPTIONS_HOOKS.append(hook)
    try:
        yield
    finally:
        runtime.SESSION_OPTIONS_HOOKS.remove(hook)


def quiet_fit(est, X, y, **kwargs):
    """``est.fit(X, y)`` without the convergence warnings of short fits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y, **kwargs)


def guarded(fn, *args, **kwargs):
    """Call ``fn``; return its result, or the error text if it fails (library changed)."""
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return {"error": f"{type(exc).__name__}: {exc}"}


def fmt(value, spec=".3f") -> str:
    """Format a number or a missing value."""
    return "-" if value is None else format(value, spec)
