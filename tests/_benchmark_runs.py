"""The benchmark scripts' quick runs that tests/test_benchmark.py checks, run in the background.

Each is a subprocess of half a minute to a minute and a half (``bench.py --quick``
is the longest). When the session starts (``conftest.py``), the runs the selected
tests need start one after another in a thread, and those tests run last: the runs
go on while the rest of the suite does, on the core it leaves free. A test's fixture
takes its run's result with :func:`result` (waiting for it if need be); a run
that was not started (the hook not called) is made then, as before.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Run:
    """One script's quick run: ``script --quick --out DIR``."""

    script: str
    timeout: float
    #: modules without which the run is not made (its tests skip)
    needs: tuple = ()

    def available(self) -> bool:
        """Whether every module the run needs can be imported."""
        try:
            return all(importlib.util.find_spec(m) is not None for m in self.needs)
        except ImportError:  # a parent package is missing
            return False


#: The runs, by the name of the fixture that takes them.
RUNS = {
    "quick_run": Run("bench.py", 600),
    "dask_cluster": Run("dask_cluster.py", 300, ("distributed", "dask_ml", "dask_glm", "psutil")),
    "cold_start": Run("cold_start.py", 300),
    "callbacks_run": Run("callbacks.py", 300, ("sklearn.callback",)),
}

_results: dict = {}
_events: dict = {}
_running: list = []
_lock = threading.Lock()


def _execute(name: str) -> tuple:
    run = RUNS[name]
    out = Path(tempfile.mkdtemp(prefix=f"onnxgrad-{name}-"))
    argv = [sys.executable, str(ROOT / "benchmarks" / run.script), "--quick", "--out", str(out)]
    proc = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ
    )
    with _lock:
        _running.append(proc)
    try:
        stdout, stderr = proc.communicate(timeout=run.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f"\n{run.script} --quick ran past {run.timeout} s and was stopped."
    finally:
        with _lock:
            _running.remove(proc)
    return out, subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def start(names) -> None:
    """Start the runs ``names`` (those available) one after another in a thread."""
    names = [n for n in RUNS if n in set(names) and RUNS[n].available() and n not in _events]
    if not names:
        return
    for name in names:
        _events[name] = threading.Event()

    def work():
        for name in names:
            try:
                _results[name] = _execute(name)
            except BaseException as exc:  # given to the test that waits for it
                _results[name] = exc
            _events[name].set()

    threading.Thread(target=work, name="benchmark-runs", daemon=True).start()


def result(name: str) -> tuple:
    """``(output folder, completed process)`` of run ``name``: the background run's
    (waited for), else made now."""
    event = _events.get(name)
    if event is None:
        found = _execute(name)
    else:
        event.wait()
        found = _results[name]
    if isinstance(found, BaseException):
        raise found
    return found


def stop() -> None:
    """Stop the runs still going (the session ends: an interrupted or selective run)."""
    with _lock:
        for proc in _running:
            proc.kill()
