"""Training on a dask cluster: issue 31's figures, the cluster and one process side by side.

Run from the repository root::

    python benchmarks/dask_cluster.py                 # every part, full sizes (a few minutes)
    python benchmarks/dask_cluster.py --part lbfgs    # one part: memory, round, lbfgs or minibatch
    python benchmarks/dask_cluster.py --quick         # small sizes, under a minute: checks it runs
    python benchmarks/dask_cluster.py --repeats 3     # fits per column in the lbfgs part (5)
    python benchmarks/dask_cluster.py --max-wait 0    # do not wait for a quiet machine
    python benchmarks/dask_cluster.py --out DIR       # where dask_cluster.json goes

Each part starts its own ``LocalCluster(n_workers=2, threads_per_worker=1)`` (worker
processes, no dashboard) and compares it with this process fitting with 2 threads
(the estimator's ``n_jobs=2``). The workers import the package of this repository
(the script puts the repository first on ``PYTHONPATH``, which they inherit). The
parts, run in this order (:data:`PARTS`, a registry a later part is added to):

* ``memory``: the data made and persisted on the workers, the client's peak RSS
  during a fit of ``OrtGradientClassifier(LogisticRegression())`` on the cluster,
  minus its RSS just before, against the size of the data (target: < 10%). Two fits
  in a row: the first of the process (the converter and onnxruntime sessions made
  for the first time) and a second one; the peak is the kernel's ``VmHWM`` after
  resetting it (``/proc/self/clear_refs``), and a thread's samples of the RSS.
* ``round``: the latency of one round of the fit's machinery with nothing to
  compute. (a) one task per worker pinned to it that returns at once, submitted and
  gathered (what a validation set's predictions take); (a') a call of one actor per
  worker that returns at once, as ``DaskRows.serve`` calls the fit's servers for
  every training round; (b) a real evaluation of the fit's objective
  on tiny partitions (16 rows each), called repeatedly at the first point of the
  fit through a wrapper of ``scipy.optimize.minimize`` (the fit then runs as
  usual), with the ``dask round`` DEBUG records of the package's logger (the
  client's time in ``DaskRows.sums``); (c) the same objective in one process on the
  same rows computed to NumPy. Median and 95th percentile.
* ``lbfgs``: L-BFGS on a binary logistic regression (1,000,000 x 50 float32: 49
  standard normal columns and a constant column, y drawn from a fixed coefficient
  vector), made by ``dask.array.random`` on the workers and persisted there. Four
  fits, taking turns, ``--repeats`` times: ours on the cluster, ours in this
  process at 2 threads on the same rows gathered to NumPy block by block, the same
  at 1 thread (for information), and dask-ml's ``LogisticRegression(solver="lbfgs")``
  on the cluster. Then one more fit on the cluster, not timed, with each worker
  timing its work in each round: each round's time on the client, split into the
  compute of the slower worker and the rest (the calls' trips, transfers, waits).
  Time per evaluation = fit time / evaluations of the objective (ours: ``nfev`` of
  each ``scipy.optimize.minimize`` the fit calls; dask-ml: calls of the function
  given to ``scipy.optimize.fmin_l_bfgs_b``, counted by a wrapper); medians. Targets:
  cluster / one process <= 1.25; dask-ml / ours on the cluster >= 3; the
  objective at each side's final weights equal within 1e-5 relative.

The objective both sides minimise, with ``fit_intercept=False`` on both (dask-glm
penalises the intercept it adds; the constant column stands for it, penalised on
both sides): ``sum_i log(1 + exp(x_i w)) - y_i x_i w + ||w||^2 / (2 C)``, C = 1.
scikit-learn's ``C * sum_i l_i + ||w||^2 / 2`` (what ours minimises, divided by the
number of rows) is the same up to the factor C; dask-glm's lbfgs minimises
``sum_i l_i + (1 / C) ||w||^2 / 2`` (a sum over the rows, ``lamduh = 1 / C``),
with ``normalize=False`` in ``solver_kwargs`` (its default standardises the
columns, which changes what the penalty weighs). Both objective values are computed
here with one formula, in float64 on the cluster, at each side's final weights.
Same ``tol`` (1e-4) and ``max_iter`` (100) on both sides: ours is scipy's ``gtol``
on the mean loss's gradient, dask-glm's ``pgtol`` on the sum's (a million times
tighter on the mean's scale), so the numbers of iterations differ; both are
reported.

The machine may be shared: before each timed fit (and each series of rounds) the
script waits, ``--max-wait`` seconds at most, until other processes use less than
20% of the CPUs (``/proc/stat`` minus the CPU time of this process and of the
cluster's), records the share they used during the fit, and fits again, at most 3
more times, when it was above 10% (the last fit is kept; ``attempts`` in the JSON).

``--quick``: 20,000 x 10 in 4 partitions, 30 rounds, 1 repeat, no waits or retries.

Output: ``DIR/dask_cluster.json`` (meta: date, commit, versions, CPUs, load before
and after, sizes; each part's measurements and targets) and, printed, a Markdown
table of the figures and ratios with the targets met or not.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.metadata as md
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# this repository's package, here and in the workers (they inherit the environment)
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
# distributed's INFO records off (the scheduler runs in this process), here and in the
# workers: dask reads its configuration from the environment when first imported
os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")

from bench_common import cpu_ticks, git_state, package_log  # noqa: E402

#: Threads of the one-process fits (the estimator's ``n_jobs``), and of the cluster.
THREADS = 2
N_WORKERS, WORKER_THREADS = 2, 1
#: Both sides' settings (the same on both).
C, TOL, MAX_ITER = 1.0, 1e-4, 100
SEED = 0
#: A timed fit during which other processes used more than this share of the CPUs is
#: measured again (``retries`` times at most; the last one is kept).
BUSY_RETRY = 0.1
#: Issue 31's targets.
TARGET_CLUSTER_OVER_LOCAL = 1.25
TARGET_DASKML_OVER_OURS = 3.0
TARGET_OBJECTIVE_RTOL = 1e-5
TARGET_MEMORY_SHARE = 0.10

FULL = {
    "rows": 1_000_000,
    "columns": 50,
    "partitions": 8,
    "rounds": 200,
    "tiny_rows": 16,
    "repeats": 5,
    "retries": 3,
    "mlp_rows": 50_000,
    "mlp_epochs": (2, 6),
    "mlp_repeats": 3,
    "sync_rows": 10_000,
}
QUICK = {
    "rows": 20_000,
    "columns": 10,
    "partitions": 4,
    "rounds": 30,
    "tiny_rows": 16,
    "repeats": 1,
    "retries": 0,
    "mlp_rows": 3_000,
    "mlp_epochs": (1, 2),
    "mlp_repeats": 1,
    "sync_rows": 1_000,
}

DISTRIBUTIONS = (
    "numpy",
    "scipy",
    "scikit-learn",
    "onnxruntime-training-cpu",
    "onnxruntime",
    "dask",
    "distributed",
    "dask-ml",
    "dask-glm",
    "psutil",
)


# ---------------------------------------------------------------------------
# measurement helpers
# ---------------------------------------------------------------------------
def rss_bytes() -> int:
    """The resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset the kernel's peak RSS of this process (``VmHWM``); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


class RssSampler:
    """The highest RSS of this process, sampled by a thread every ``interval`` seconds."""

    def __init__(self, interval=0.002):
        self.interval, self.peak, self.samples = interval, 0, 0
        self._stop = threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self):
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        return False


def family_cpu_s() -> float:
    """CPU seconds of this process and of its children (the cluster's processes)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


class OthersCpu:
    """Share of the CPUs used by processes outside this one and its cluster meanwhile."""

    def __enter__(self):
        self._ticks, self._own, self.share = cpu_ticks(), family_cpu_s(), None
        return self

    def __exit__(self, *exc):
        ticks = cpu_ticks()
        if self._ticks and ticks and ticks[1] > self._ticks[1]:
            own = (family_cpu_s() - self._own) * os.sysconf("SC_CLK_TCK")
            others = ticks[0] - self._ticks[0] - own
            self.share = round(max(0.0, others / (ticks[1] - self._ticks[1])), 3)
        return False


def wait_quiet(max_wait: float, threshold: float = 0.2) -> dict:
    """Wait until other processes use less than ``threshold`` of the CPUs over half a
    second, or ``max_wait`` seconds; return the last share seen and the time waited."""
    t0, share = time.perf_counter(), None
    while max_wait > 0:
        with OthersCpu() as others:
            time.sleep(0.5)
        share = others.share
        if share is None or share < threshold or time.perf_counter() - t0 >= max_wait:
            break
    return {"share": share, "waited_s": round(time.perf_counter() - t0, 2)}


def load() -> dict:
    """The load averages and ``uptime``'s line."""
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        line = None
    return {"loadavg": [round(v, 2) for v in os.getloadavg()], "uptime": line}


def summary(values) -> dict:
    """Median, 95th percentile, min, max and count of ``values`` (seconds)."""
    values = np.asarray(values, dtype=float)
    if not len(values):
        return {"n": 0}
    return {
        "n": int(len(values)),
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def ratio(a, b):
    return None if a is None or b in (None, 0) else a / b


def _timed(fun, times):
    """``fun``, appending the seconds of each call to ``times``."""

    def timed(x, *a):
        t0 = time.perf_counter()
        out = fun(x, *a)
        times.append(time.perf_counter() - t0)
        return out

    return timed


@contextlib.contextmanager
def watch_minimize(before_first=None):
    """Record each ``scipy.optimize.minimize`` call's ``nfev``, ``nit`` and the time of
    each objective call; ``before_first(fun, x0)`` runs before the first one."""
    import scipy.optimize

    real = scipy.optimize.minimize
    calls = []

    def wrapper(fun, x0, *args, **kwargs):
        times = []
        timed = _timed(fun, times)
        if before_first is not None and not calls:
            before_first(fun, np.array(x0, dtype=np.float64))
        result = real(timed, x0, *args, **kwargs)
        calls.append({"nfev": int(result.nfev), "nit": int(result.nit), "eval_s": times})
        return result

    scipy.optimize.minimize = wrapper
    try:
        yield calls
    finally:
        scipy.optimize.minimize = real


@contextlib.contextmanager
def watch_dask_glm():
    """Record dask-glm's ``fmin_l_bfgs_b`` calls: function calls (counted and timed)
    and scipy's ``info``."""
    import dask_glm.algorithms as algorithms

    real = algorithms.fmin_l_bfgs_b
    calls = []

    def wrapper(func, x0, *args, **kwargs):
        times = []
        timed = _timed(func, times)
        beta, value, info = real(timed, x0, *args, **kwargs)
        calls.append(
            {
                "nfev": int(info["funcalls"]),
                "nit": int(info["nit"]),
                "calls": len(times),
                "eval_s": times,
                "warnflag": int(info["warnflag"]),
                "task": str(info.get("task")),
                "loss": float(value),
            }
        )
        return beta, value, info

    algorithms.fmin_l_bfgs_b = wrapper
    try:
        yield calls
    finally:
        algorithms.fmin_l_bfgs_b = real


class RoundLog(logging.Handler):
    """The package's ``dask round`` DEBUG records: ``(tasks, chunks, seconds)`` each."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.rounds = []

    def emit(self, record):
        # the L-BFGS rounds' records (a local-SGD round's record has other fields)
        if str(record.msg).startswith("dask round") and len(record.args) == 4:
            _, tasks, chunks, seconds = record.args
            self.rounds.append((int(tasks), int(chunks), float(seconds)))


def round_log():
    """A :class:`RoundLog` on the package's logger (DEBUG, not propagated) meanwhile."""
    return package_log(RoundLog(), logging.DEBUG)


# ---------------------------------------------------------------------------
# the cluster, the data, the estimators
# ---------------------------------------------------------------------------
def _worker_info():
    import onnxruntime

    import onnxgrad_sklearn

    return {"package": onnxgrad_sklearn.__file__, "onnxruntime": onnxruntime.__version__}


def _noop(i):
    return i


class _Echo:
    """An actor answering at once: what a round of the fit's servers costs with nothing
    to compute (``DaskRows.serve``)."""

    def echo(self, i):
        return i


@contextlib.contextmanager
def cluster():
    """A fresh ``LocalCluster(n_workers=2, threads_per_worker=1)`` and its client; the
    workers import the package and onnxruntime before anything is measured."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=N_WORKERS,
            threads_per_worker=WORKER_THREADS,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        ) as local,
        Client(local) as client,
    ):
        info = client.run(_worker_info)
        expected = os.path.join(ROOT, "onnxgrad_sklearn", "__init__.py")
        for address, found in info.items():
            if os.path.realpath(found["package"]) != os.path.realpath(expected):
                raise RuntimeError(f"worker {address} imports {found['package']}, not {expected}")
        yield client


def true_coef(columns: int) -> np.ndarray:
    """The coefficients y is drawn from (the last one: the constant column's)."""
    beta = np.random.RandomState(1).normal(scale=0.3, size=columns)
    beta[-1] = 0.25
    return beta


def _add_constant(block):
    return np.hstack([block, np.ones((block.shape[0], 1), dtype=block.dtype)])


def make_data(client, rows: int, columns: int, partitions: int, seed: int = SEED):
    """X (float32, its last column constant) and y (0/1, int64), made by
    ``dask.array.random`` on the workers and persisted there: (X, y, placement)."""
    import dask.array as da
    from distributed import wait
    from scipy.special import expit

    chunk = -(-rows // partitions)
    rs = da.random.RandomState(seed)
    Z = rs.normal(size=(rows, columns - 1), chunks=(chunk, columns - 1)).astype(np.float32)
    X = Z.map_blocks(_add_constant, chunks=(Z.chunks[0], (columns,)), dtype=np.float32)
    p = (X @ true_coef(columns)).map_blocks(expit, dtype=np.float64)
    y = (rs.uniform(size=rows, chunks=(chunk,)) < p).astype(np.int64)
    X, y = client.persist([X, y])
    wait([X, y])
    return X, y, placement(client, X)


def placement(client, X) -> dict:
    """Rows of X held by each worker (a block held by two counts for both)."""
    from distributed import futures_of

    holders = client.who_has(futures_of(X))
    rows = {}
    for key, n in zip(_block_keys(X), X.chunks[0]):
        for address in holders.get(key, ()):
            rows[address] = rows.get(address, 0) + int(n)
    return rows


def ours(threads=THREADS):
    """``OrtGradientClassifier(LogisticRegression(fit_intercept=False))``: its default
    solver, L-BFGS; ``n_jobs``: the threads of a fit in this process (on a cluster,
    each worker uses its own)."""
    from sklearn.linear_model import LogisticRegression

    from onnxgrad_sklearn import OrtGradientClassifier

    return OrtGradientClassifier(
        LogisticRegression(C=C, fit_intercept=False),
        max_iter=MAX_ITER,
        tol=TOL,
        n_jobs=threads,
    )


def to_numpy(client, *collections):
    """Dask arrays persisted on the cluster as NumPy arrays here, their blocks gathered
    one by one (``compute`` would copy every block to the worker that concatenates
    them, and the copies would stay there a while)."""
    from distributed import futures_of

    out = []
    for v in collections:
        futures = {f.key: f for f in futures_of(v)}
        out.append(np.concatenate(client.gather([futures[k] for k in _block_keys(v)])))
    return out


def _block_keys(v):
    """The keys of the blocks of a dask array, in the order of its rows."""
    keys = v.__dask_keys__()
    return [k[0] if isinstance(k, list) else k for k in keys]


def dask_ml_estimator():
    from dask_ml.linear_model import LogisticRegression

    return LogisticRegression(
        solver="lbfgs",
        penalty="l2",
        C=C,
        fit_intercept=False,
        tol=TOL,
        max_iter=MAX_ITER,
        solver_kwargs={"normalize": False},
    )


def our_weights(est) -> np.ndarray:
    return np.asarray(est.estimator_.coef_, dtype=np.float64).ravel()


def _block_loss(X, y, w):
    z = X.astype(np.float64) @ w
    return np.array([np.sum(np.logaddexp(0.0, z) - y * z)])


def objective(X, y, w) -> float:
    """``sum_i log(1 + exp(x_i w)) - y_i x_i w + ||w||^2 / (2 C)`` in float64: the
    rows' part on the workers, block by block, added here in their order."""
    import dask

    w = np.asarray(w, dtype=np.float64)
    xs, ys = X.to_delayed().ravel(), y.to_delayed().ravel()
    parts = dask.compute(*[dask.delayed(_block_loss)(a, b, w) for a, b in zip(xs, ys)])
    return float(np.sum(np.concatenate(parts))) + float(w @ w) / (2 * C)


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def timed_fit(est, X, y, watch):
    """Fit; return the estimator, wall seconds, what ``watch`` recorded and the share
    of the CPUs other processes used."""
    gc.collect()
    with watch as calls, OthersCpu() as others:
        t0 = time.perf_counter()
        quiet(est.fit, X, y)
        wall = time.perf_counter() - t0
    return est, wall, calls, others.share


# ---------------------------------------------------------------------------
# the parts (a registry: a function per part, taking the sizes, returning a dict
# with "targets" and "figures" rows for the table)
# ---------------------------------------------------------------------------
PARTS: dict = {}


def part(name):
    def register(fn):
        PARTS[name] = fn
        return fn

    return register


def target(name, measured, limit, op, note=""):
    """A target of issue 31: ``measured op limit`` (op: "<", "<=" or ">=")."""
    checks = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">=": lambda a, b: a >= b}
    met = None if measured is None else bool(checks[op](measured, limit))
    return {
        "target": name,
        "issue": 31,
        "measured": measured,
        "limit": f"{op} {limit:g}",
        "met": met,
        "note": note,
    }


@part("memory")
def part_memory(sizes: dict) -> dict:
    """Client peak RSS during cluster fits minus the RSS before, against the data size."""
    import onnxruntime  # noqa: F401 - imported before the baseline, as a user's session

    import onnxgrad_sklearn  # noqa: F401

    out = {"fits": []}
    with cluster() as client:
        X, y, where = make_data(client, sizes["rows"], sizes["columns"], sizes["partitions"])
        data_bytes = int(X.nbytes + y.nbytes)
        out.update(data_bytes=data_bytes, placement=where)
        for label in ("first fit of the process", "second fit"):
            gc.collect()
            time.sleep(0.5)
            before = rss_bytes()
            can_reset = reset_peak()
            with RssSampler() as sampler, watch_minimize() as calls:
                t0 = time.perf_counter()
                est = quiet(ours().fit, X, y)
                wall = time.perf_counter() - t0
            hwm = _status_kb("VmHWM")
            peak = max(sampler.peak, hwm * 1024 if (can_reset and hwm) else 0)
            growth = peak - before
            out["fits"].append(
                {
                    "fit": label,
                    "rss_before_mb": before / 2**20,
                    "peak_mb": peak / 2**20,
                    "sampled_peak_mb": sampler.peak / 2**20,
                    "vmhwm_mb": hwm / 1024 if (can_reset and hwm) else None,
                    "samples": sampler.samples,
                    "growth_mb": growth / 2**20,
                    "growth_over_data": growth / data_bytes,
                    "fit_s": wall,
                    "evaluations": sum(c["nfev"] for c in calls),
                    "n_iter_": int(est.n_iter_),
                }
            )
            del est
    first, second = out["fits"]
    out["figures"] = [
        (
            f"client peak RSS - RSS before, {label} (data: {data_bytes / 2**20:.1f} MB)",
            f"{f['growth_mb']:.1f} MB = {100 * f['growth_over_data']:.2f}% of the data",
        )
        for label, f in (("first fit", first), ("second fit", second))
    ]
    out["targets"] = [
        target(
            "client peak RSS growth during the cluster fit / data size (first fit of the process)",
            first["growth_over_data"],
            TARGET_MEMORY_SHARE,
            "<",
        ),
        target(
            "client peak RSS growth during the cluster fit / data size (second fit)",
            second["growth_over_data"],
            TARGET_MEMORY_SHARE,
            "<",
        ),
    ]
    return out


@part("round")
def part_round(sizes: dict) -> dict:
    """One empty round: pinned no-op tasks, actor calls (how the fit's rounds go), and
    the fit's objective on tiny partitions."""
    n_rounds = sizes["rounds"]
    out = {"rounds": n_rounds}
    with cluster() as client:
        addresses = sorted(client.nthreads())

        def bare_round():
            futures = [
                client.submit(_noop, k, workers=[a], allow_other_workers=False, pure=False)
                for k, a in enumerate(addresses)
            ]
            return client.gather(futures)

        out["waited_for_quiet"] = []

        def timed(one_round):
            """``one_round`` warmed up 10 times, then timed ``n_rounds`` times."""
            for _ in range(10):
                one_round()
            out["waited_for_quiet"].append(wait_quiet(sizes["max_wait"]))
            times = []
            with OthersCpu() as others:
                for _ in range(n_rounds):
                    t0 = time.perf_counter()
                    one_round()
                    times.append(time.perf_counter() - t0)
            return {**summary(times), "others_cpu": others.share}

        out["pinned_noop_task_per_worker"] = timed(bare_round)

        # (a') the same through actors, one per worker, as the fit's rounds go
        servers = [
            client.submit(_Echo, workers=[a], allow_other_workers=False, actor=True)
            for a in addresses
        ]
        actors = client.gather(servers)

        def call_round():
            calls = [actor.echo(k) for k, actor in enumerate(actors)]
            return [c.result() for c in calls]

        out["actor_call_per_worker"] = timed(call_round)
        actors = servers = None  # released: the workers drop them

        # (b) the fit's own objective on tiny partitions, at the fit's first point
        columns, tiny = sizes["columns"], sizes["tiny_rows"]
        X, y, where = make_data(client, tiny * 2 * N_WORKERS, columns, 2 * N_WORKERS, seed=1)
        out["tiny_placement"] = where
        recorded = {}

        def repeat_objective(fun, x0):
            for _ in range(10):  # warm-up
                fun(x0)
            out["waited_for_quiet"].append(wait_quiet(sizes["max_wait"]))
            times = []
            for _ in range(n_rounds):
                t0 = time.perf_counter()
                fun(x0)
                times.append(time.perf_counter() - t0)
            recorded["times"] = times

        with round_log() as log, OthersCpu() as others:
            with watch_minimize(before_first=repeat_objective):
                quiet(ours().fit, X, y)
        sums = [s for _, _, s in log.rounds[10 : 10 + n_rounds]]
        out["objective_on_cluster"] = {**summary(recorded["times"]), "others_cpu": others.share}
        out["dask_rows_sums"] = summary(sums)
        out["tasks_per_round"] = sorted({t for t, _, _ in log.rounds})

        # (c) the same objective in this process, on the same rows in memory
        Xn, yn = to_numpy(client, X, y)
        with watch_minimize(before_first=repeat_objective):
            quiet(ours().fit, Xn, yn)
        out["objective_in_process"] = summary(recorded["times"])
        del X, y

    noop, call, obj, local = (
        out["pinned_noop_task_per_worker"],
        out["actor_call_per_worker"],
        out["objective_on_cluster"],
        out["objective_in_process"],
    )

    def ms(s):
        return f"{1e3 * s['median']:.2f} ms (p95 {1e3 * s['p95']:.2f})"

    out["figures"] = [
        ("empty round: one pinned no-op task per worker, submit + gather", ms(noop)),
        ("empty round: a call of one actor per worker (the fit's rounds)", ms(call)),
        (f"empty round: the fit's objective on {2 * N_WORKERS} x {tiny} rows", ms(obj)),
        ("  of which DaskRows.sums (the DEBUG 'dask round' record)", ms(out["dask_rows_sums"])),
        ("the same objective in one process (rows in memory)", ms(local)),
        (
            "objective call: cluster / one process (median)",
            f"{ratio(obj['median'], local['median']):.1f} x",
        ),
    ]
    out["targets"] = []  # reported, no target
    return out


@part("lbfgs")
def part_lbfgs(sizes: dict) -> dict:
    """L-BFGS per evaluation: ours on the cluster, ours in one process, dask-ml."""
    repeats = sizes["repeats"]
    runs = {name: [] for name in COLUMNS}
    out = {"settings": {"C": C, "tol": TOL, "max_iter": MAX_ITER, "threads": THREADS}}
    with cluster() as client:
        X, y, where = make_data(client, sizes["rows"], sizes["columns"], sizes["partitions"])
        out.update(data_bytes=int(X.nbytes + y.nbytes), placement=where)
        # warm-up: each path once on small data (imports, converter, workers' modules)
        Xs, ys, _ = make_data(client, 2000, sizes["columns"], 2, seed=2)
        quiet(ours().fit, Xs, ys)
        quiet(dask_ml_estimator().fit, Xs, ys)
        quiet(ours().fit, *to_numpy(client, Xs, ys))
        del Xs, ys
        # the same rows in this process, for the one-process fits (gathered block by
        # block: a compute would copy every block to the worker that concatenates them)
        Xn, yn = to_numpy(client, X, y)
        data = {"cluster": (X, y), "process": (Xn, yn), "process_1_thread": (Xn, yn)}
        data["dask_ml"] = (X, y)
        weights, waits = {}, []
        for r in range(repeats):
            for name, (make, watch) in COLUMNS.items():
                attempts = 0
                while True:  # again if other processes took the CPUs meanwhile
                    attempts += 1
                    waits.append(wait_quiet(sizes["max_wait"]))
                    held = placement(client, X)
                    with round_log() as log:
                        est, wall, calls, others = timed_fit(make(), *data[name], watch())
                    if others is None or others <= BUSY_RETRY or attempts > sizes["retries"]:
                        break
                if name == "dask_ml":
                    run = _dask_ml_run(est, wall, calls, others)
                    weights[name] = np.asarray(est.coef_, dtype=np.float64).ravel()
                else:
                    run = _our_run(est, wall, calls, others)
                    weights[name] = our_weights(est)
                if name == "cluster":
                    if sorted({t for t, _, _ in log.rounds}) != [N_WORKERS]:
                        print(
                            f"  warning: rounds of {sorted({t for t, _, _ in log.rounds})} "
                            f"tasks, not {N_WORKERS} (rows held: {held})",
                            flush=True,
                        )
                    run.update(
                        placement=held,
                        rounds_logged=len(log.rounds),
                        round_s=summary([sec for _, _, sec in log.rounds]),
                        tasks_per_round=sorted({t for t, _, _ in log.rounds}),
                    )
                run["attempts"] = attempts
                runs[name].append(run)
            print(
                f"  repeat {r + 1}/{repeats}, s per evaluation: "
                + ", ".join(f"{k} {v[-1]['s_per_evaluation']:.4f}" for k, v in runs.items())
                + ", others' CPU share: "
                + ", ".join(f"{v[-1]['others_cpu']}" for v in runs.values()),
                flush=True,
            )
        del Xn, yn, data
        attempts = 0
        while True:
            attempts += 1
            waits.append(wait_quiet(sizes["max_wait"]))
            with OthersCpu() as others:
                split = round_split(client, X, y)
            share = others.share
            if share is None or share <= BUSY_RETRY or attempts > sizes["retries"]:
                break
        out["where_the_time_goes"] = split | {"others_cpu": share, "attempts": attempts}
        values = {k: objective(X, y, w) for k, w in weights.items()}
        out["objective"] = values
        out["weights"] = {k: w.tolist() for k, w in weights.items()}
        out["true_coef"] = true_coef(sizes["columns"]).tolist()
        out["waited_for_quiet"] = waits
        del X, y
    out["runs"] = runs
    med = {
        k: {
            "s_per_evaluation": statistics.median(r["s_per_evaluation"] for r in v),
            "fit_s": statistics.median(r["fit_s"] for r in v),
            "evaluation_s": statistics.median(r["evaluation_s"]["median"] for r in v),
            "evaluations": [r["evaluations"] for r in v],
            "iterations": [r["iterations"] for r in v],
            "others_cpu": [r["others_cpu"] for r in v],
        }
        for k, v in runs.items()
    }
    out["medians"] = med
    c, p, p1, d = (med[k] for k in COLUMNS)
    rel = {
        f"{a}_vs_{b}": abs(values[a] - values[b]) / abs(values[b])
        for a, b in (("cluster", "dask_ml"), ("process", "dask_ml"), ("cluster", "process"))
    }
    out["objective_rel_diff"] = rel
    out["weights_max_abs_diff_cluster_vs_process"] = float(
        np.max(np.abs(weights["cluster"] - weights["process"]))
    )
    out["ratios"] = {
        "cluster_over_process": ratio(c["s_per_evaluation"], p["s_per_evaluation"]),
        "dask_ml_over_cluster": ratio(d["s_per_evaluation"], c["s_per_evaluation"]),
        "cluster_over_process_1_thread": ratio(c["s_per_evaluation"], p1["s_per_evaluation"]),
        "cluster_over_process_in_solver": ratio(c["evaluation_s"], p["evaluation_s"]),
        "dask_ml_over_cluster_in_solver": ratio(d["evaluation_s"], c["evaluation_s"]),
    }
    shape = f"{sizes['rows']:,} x {sizes['columns']}"
    ratios, split = out["ratios"], out["where_the_time_goes"]

    def row(name, m):
        others = ", ".join("-" if o is None else f"{o:.2f}" for o in m["others_cpu"])
        return (
            f"{name}: s per evaluation (fit / evaluations); one evaluation in the solver; fit",
            f"{m['s_per_evaluation']:.4f}; {m['evaluation_s']:.4f}; {m['fit_s']:.2f} s "
            f"(evaluations {m['evaluations']}, iterations {m['iterations']}; "
            f"others' CPU share {others})",
        )

    out["figures"] = [
        row(f"ours on the cluster, {shape}", c),
        row(f"ours in one process, {THREADS} threads", p),
        row("ours in one process, 1 thread (for information)", p1),
        row("dask-ml LogisticRegression(solver='lbfgs') on the cluster", d),
        (
            "cluster / one process, per evaluation (in the solver)",
            f"{ratios['cluster_over_process']:.2f} x "
            f"({ratios['cluster_over_process_in_solver']:.2f} x); against 1 thread "
            f"{ratios['cluster_over_process_1_thread']:.2f} x",
        ),
        (
            "dask-ml / ours on the cluster, per evaluation (in the solver)",
            f"{ratios['dask_ml_over_cluster']:.2f} x "
            f"({ratios['dask_ml_over_cluster_in_solver']:.2f} x)",
        ),
        (
            "a cluster round (one more fit, the workers timing their work): on the "
            "client; compute of the slower worker; the rest",
            "; ".join(
                f"{1e3 * split[k]['median']:.1f} ms"
                for k in ("round_s", "slowest_task_compute_s", "rest_s")
            )
            + " (medians)",
        ),
        (
            "objective (float64, sum form): cluster; one process; dask-ml",
            f"{values['cluster']:.6f}; {values['process']:.6f}; {values['dask_ml']:.6f}",
        ),
        (
            "objective relative difference: cluster vs dask-ml; one process vs dask-ml",
            f"{rel['cluster_vs_dask_ml']:.2e}; {rel['process_vs_dask_ml']:.2e}",
        ),
    ]
    out["targets"] = [
        target(
            "L-BFGS s per evaluation, cluster / one process",
            ratios["cluster_over_process"],
            TARGET_CLUSTER_OVER_LOCAL,
            "<=",
        ),
        target(
            "L-BFGS s per evaluation, dask-ml / ours on the cluster",
            ratios["dask_ml_over_cluster"],
            TARGET_DASKML_OVER_OURS,
            ">=",
        ),
        target(
            "objective at the final weights, abs(ours on the cluster - dask-ml) / dask-ml",
            rel["cluster_vs_dask_ml"],
            TARGET_OBJECTIVE_RTOL,
            "<=",
        ),
    ]
    return out


def _time_evaluations(collect=False):
    """On a worker: wrap the package's ``_evaluate`` (``onnxgrad_sklearn._dask.worker``:
    what a server's round runs, by its module's name) to record (start, seconds) of
    each call; with ``collect``, return the records and unwrap. This script's
    functions are pickled by value (``__main__``): the records are kept as attributes
    of the worker's module (``_bench_records``, ``_bench_original``: this benchmark's,
    not the package's)."""
    import time as _time

    from onnxgrad_sklearn._dask import worker

    if collect:
        records = list(getattr(worker, "_bench_records", []))
        worker._evaluate = getattr(worker, "_bench_original", worker._evaluate)
        return records
    original = worker._evaluate
    worker._bench_original, worker._bench_records = original, []

    def timed(*args, **kwargs):
        start = _time.time()
        try:
            return original(*args, **kwargs)
        finally:
            worker._bench_records.append((start, _time.time() - start))

    worker._evaluate = timed


def round_split(client, X, y) -> dict:
    """One more fit on the cluster (not timed), each worker timing its rounds' work
    (``_evaluate``, called by its server): for each round, its time on the client (the
    DEBUG record) and the compute time of each worker, the rest being the calls'
    trips, the (de)serialisation and the waits."""
    client.run(_time_evaluations)
    try:
        with round_log() as log:
            quiet(ours().fit, X, y)
    finally:
        found = client.run(_time_evaluations, True)
    tasks = sorted((start, w, sec) for w, recs in found.items() for start, sec in recs)
    per_round = max(1, max((n for n, _, _ in log.rounds), default=1))
    groups = [tasks[k : k + per_round] for k in range(0, len(tasks), per_round)]
    rounds = [sec for _, _, sec in log.rounds]
    slowest = [max(sec for _, _, sec in g) for g in groups]
    n = min(len(rounds), len(slowest))
    by_worker = {}
    for _, worker, seconds in tasks:
        by_worker.setdefault(worker, []).append(seconds)
    return {
        "rounds": len(rounds),
        "tasks": len(tasks),
        "round_s": summary(rounds),
        "slowest_task_compute_s": summary(slowest),
        "rest_s": summary([rounds[k] - slowest[k] for k in range(n)]),
        "compute_s_by_worker": {w: summary(v) for w, v in sorted(by_worker.items())},
    }


#: The lbfgs part's columns: the estimator and what records its solver's calls.
COLUMNS = {
    "cluster": (lambda: ours(), watch_minimize),
    "process": (lambda: ours(), watch_minimize),
    "process_1_thread": (lambda: ours(threads=1), watch_minimize),
    "dask_ml": (lambda: dask_ml_estimator(), watch_dask_glm),
}


def _dask_ml_run(est, wall, calls, others) -> dict:
    (call,) = calls
    return {
        "fit_s": wall,
        "evaluations": call["nfev"],
        "function_calls": call["calls"],
        "iterations": call["nit"],
        "s_per_evaluation": wall / max(call["nfev"], 1),
        "evaluation_s": summary(call["eval_s"]),
        "others_cpu": others,
        "warnflag": call["warnflag"],
        "task": call["task"],
    }


def _our_run(est, wall, calls, others) -> dict:
    evaluations = sum(c["nfev"] for c in calls)
    return {
        "fit_s": wall,
        "evaluations": evaluations,
        "iterations": int(est.n_iter_),
        "s_per_evaluation": wall / max(evaluations, 1),
        "evaluation_s": summary([t for c in calls for t in c["eval_s"]]),
        "others_cpu": others,
    }


def _mlp_data(rows: int, features: int = 100):
    """The bench.py workload ``mlp_reg_b256``'s data: X standard normal, y a smooth
    function of a random projection plus noise (float32)."""
    rng = np.random.default_rng(SEED)
    X = rng.standard_normal((rows, features), dtype=np.float32)
    w = rng.standard_normal(features).astype(np.float32) / np.sqrt(features)
    y = (np.tanh(X @ w) + 0.1 * rng.standard_normal(rows)).astype(np.float32)
    return X, y


def _mlp(threads=None, **params):
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientRegressor

    return OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(256, 256)),
        optimizer="nesterov",
        batch_size=256,
        learning_rate_init=0.001,
        random_state=0,
        n_jobs=threads,
        **params,
    )


def _epoch_seconds(make, X, y, epochs, repeats, max_wait):
    """Seconds an epoch from the difference of two fits (``epochs[0]`` and ``[1]``
    epochs: the set-up cancels out), medians over ``repeats``; the longer fit's
    final training loss."""
    times = {e: [] for e in epochs}
    loss = None
    for _ in range(repeats):
        for e in epochs:
            wait_quiet(max_wait)
            est, wall, _, _ = timed_fit(make(e), X, y, contextlib.nullcontext([]))
            times[e].append(wall)
            if e == epochs[1]:
                loss = float(est.loss_curve_[-1])
    short, long_ = (float(np.median(times[e])) for e in epochs)
    per_epoch = (long_ - short) / (epochs[1] - epochs[0])
    return per_epoch, short - epochs[0] * per_epoch, loss, times


@part("minibatch")
def part_minibatch(sizes: dict) -> dict:
    """Mini-batch throughput: the batch-256 MLP (100-256-256-1, Nesterov) on the
    cluster with ``sync_every=16`` (local SGD) and ``sync_every=1`` (synchronous),
    against one process at 2 threads; epochs per second from the difference of a
    short and a long fit, and the final training loss after the same epochs."""
    import dask.array as da

    rows, epochs = sizes["mlp_rows"], sizes["mlp_epochs"]
    X, y = _mlp_data(rows)
    repeats, max_wait = sizes["mlp_repeats"], sizes["max_wait"]
    out = {"rows": rows, "epochs": list(epochs), "runs": {}}
    quiet(_mlp(THREADS, max_iter=1).fit, X, y)  # the sessions of this process, warm
    per, setup, loss, times = _epoch_seconds(
        lambda e: _mlp(THREADS, max_iter=e), X, y, epochs, repeats, max_wait
    )
    out["runs"]["one process"] = dict(epoch_s=per, setup_s=setup, loss=loss, times=times)
    with cluster() as client:
        Xd = client.persist(da.from_array(X, chunks=(-(-rows // 4), -1)))
        yd = client.persist(da.from_array(y, chunks=-(-rows // 4)))
        for k, label in ((16, "sync_every=16"), (1, "sync_every=1")):
            if k == 1:  # one round a step: a shorter measure
                e1 = (1, 2)
                rows_1 = min(rows, sizes["sync_rows"])
                Xd, yd = Xd[:rows_1], yd[:rows_1]
            else:
                e1, rows_1 = epochs, rows
            quiet(_mlp(max_iter=1, sync_every=k).fit, Xd, yd)  # the workers' engines, warm
            per_k, setup_k, loss_k, times_k = _epoch_seconds(
                lambda e, k=k: _mlp(max_iter=e, sync_every=k), Xd, yd, e1, repeats, max_wait
            )
            out["runs"][label] = dict(
                epoch_s=per_k, setup_s=setup_k, loss=loss_k, times=times_k, rows=rows_1
            )
    one = out["runs"]["one process"]
    local = out["runs"]["sync_every=16"]
    sync = out["runs"]["sync_every=1"]
    rows_per_s = {name: r.get("rows", rows) / r["epoch_s"] for name, r in out["runs"].items()}
    out["rows_per_s"] = rows_per_s
    throughput = rows_per_s["sync_every=16"] / rows_per_s["one process"]
    loss_gap = local["loss"] / one["loss"] - 1
    out["figures"] = [
        (
            f"one process (2 threads), {rows:,} rows",
            f"{one['epoch_s']:.3f} s an epoch; loss after {epochs[1]} epochs {one['loss']:.5f}",
        ),
        (
            "sync_every=16 (local SGD)",
            f"{local['epoch_s']:.3f} s an epoch = {throughput:.2f} x the one process's "
            f"throughput; loss {local['loss']:.5f} ({100 * loss_gap:+.2f}%)",
        ),
        (
            f"sync_every=1 (one round a step), {sync['rows']:,} rows",
            f"{sync['rows'] / sync['epoch_s']:,.0f} rows/s = "
            f"{rows_per_s['sync_every=1'] / rows_per_s['one process']:.3f} x the one process's",
        ),
    ]
    out["targets"] = [
        target("local SGD (sync_every=16) throughput / one process", throughput, 0.8, ">="),
        target(
            f"local SGD final training loss / one process's - 1 (after {epochs[1]} epochs)",
            abs(loss_gap),
            0.02,
            "<=",
        ),
    ]
    return out


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------
def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def run(parts: list[str], quick: bool, repeats: int | None, max_wait: float | None) -> dict:
    import onnxgrad_sklearn

    sizes = dict(QUICK if quick else FULL)
    if repeats:
        sizes["repeats"] = repeats
    sizes["max_wait"] = max_wait if max_wait is not None else (0.0 if quick else 30.0)
    meta = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        **git_state("onnxgrad_sklearn"),
        "mode": "quick" if quick else "full",
        "parts": parts,
        "sizes": sizes,
        "cluster": f"LocalCluster(n_workers={N_WORKERS}, threads_per_worker={WORKER_THREADS})",
        "one_process_threads": THREADS,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {d: version(d) for d in DISTRIBUTIONS},
        "package": {"file": onnxgrad_sklearn.__file__, "version": onnxgrad_sklearn.__version__},
        "load_before": load(),
    }
    print(f"load before: {meta['load_before']['uptime']}", flush=True)
    doc = {"meta": meta, "parts": {}}
    t0 = time.perf_counter()
    for name in parts:
        print(f"part {name} ...", flush=True)
        t = time.perf_counter()
        load_start = load()["loadavg"]
        result = PARTS[name](sizes)
        result["wall_s"] = time.perf_counter() - t
        result["load_start"], result["load_end"] = load_start, load()["loadavg"]
        doc["parts"][name] = result
    meta["wall_s"] = time.perf_counter() - t0
    meta["load_after"] = load()
    return doc


def markdown(doc: dict) -> str:
    meta = doc["meta"]
    s = meta["sizes"]
    lines = [
        f"Dask cluster, {meta['date']}, commit {meta['commit']}"
        + (" with uncommitted changes to the package" if meta["uncommitted_changes"] else "")
        + f", {meta['mode']} mode ({s['rows']:,} x {s['columns']}, {s['partitions']} "
        f"partitions), {meta['cluster']} against one process at {meta['one_process_threads']} "
        f"threads, {meta['cpu_count']} CPUs",
        f"load before: {meta['load_before']['uptime']}",
        f"load after: {meta['load_after']['uptime']}",
        "",
        "| part | measure | value |",
        "|---|---|---|",
    ]
    for name, result in doc["parts"].items():
        for measure, value in result.get("figures", []):
            lines.append(f"| {name} | {measure} | {value} |")
    lines += ["", "| target (issue 31) | measured | limit | met |", "|---|---|---|---|"]
    for result in doc["parts"].values():
        for t in result.get("targets", []):
            met = {True: "met", False: "not met", None: "-"}[t["met"]]
            value = "-" if t["measured"] is None else f"{t['measured']:.3g}"
            lines.append(f"| {t['target']} | {value} | {t['limit']} | {met} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--part",
        action="append",
        choices=sorted(PARTS),
        default=None,
        help="a part to run (repeatable; default: all, in the order " + ", ".join(PARTS) + ")",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes: checks that it runs")
    parser.add_argument("--repeats", type=int, default=None, help="fits per lbfgs column (5)")
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds to wait, before each timed fit of the lbfgs part, for other processes "
        "to use less than 20%% of the CPUs (30; quick: 0)",
    )
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="output folder")
    args = parser.parse_args(argv)
    parts = [p for p in PARTS if args.part is None or p in args.part]
    doc = run(parts, args.quick, args.repeats, args.max_wait)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "dask_cluster.json")
    if args.part is not None and os.path.exists(path):  # the other parts' last results stay
        with open(path) as f:
            kept = json.load(f)
        if kept.get("meta", {}).get("mode") == doc["meta"]["mode"]:
            kept["parts"].update(doc["parts"])
            kept.setdefault("runs_meta", {}).update({name: doc["meta"] for name in doc["parts"]})
            doc = kept
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print()
    print(markdown(doc))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
