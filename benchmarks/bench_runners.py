"""The benchmark's workers: what one process measures, answered as one JSON line.

``bench.py --worker JSON`` calls :func:`worker_main`. A task names its ``kind``:

* ``epochs``: seconds per epoch of the epoch workloads for one framework, and on
  request the extras (per-batch split, start-up, RSS growth, profile);
* ``fits``: whole fits of new estimators on the small-data workloads;
* ``predict``: predict latency (1 row, 1,000 rows);
* ``grid``: ``GridSearchCV(n_jobs=2)`` over a small grid.

The package is reached through its documented hooks only: ``n_jobs`` (threads),
``backend`` and ``backend_``, ``to_onnx``, the package logger's epoch records,
and ``onnxgrad_sklearn.runtime.SESSION_OPTIONS_HOOKS`` (session options, here for
onnxruntime's profiler).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict

import numpy as np
from bench_common import (
    RESULT_MARK,
    THREADS,
    CpuWindow,
    epoch_clock,
    guarded,
    peak_rss_mb,
    quiet_fit,
    rss_mb,
    session_options_hook,
    time_calls,
)
from bench_workloads import (
    FITS,
    FLOOR,
    ORT_BACKENDS,
    WORKLOADS,
    floor_trainer,
    make_data,
    model_memory,
    ort_estimator,
    sklearn_estimator,
    torch_trainer,
)

PHASE_EPOCHS = 3

# ---------------------------------------------------------------------------
# epoch workloads
# ---------------------------------------------------------------------------


def ort_startup(spec: dict, backend: str, X, y, repeats: int) -> dict:
    """Time ``fit(max_iter=1)`` of a new estimator on 256 rows (one batch), in ms.

    What a fit costs besides its epochs: conversion, training graph, gradient
    graph, sessions. The first repetition (cold: first conversion of the process)
    is reported apart from the median of the others.
    """
    Xs, ys = X[:256], y[:256]
    runs = []
    for _ in range(repeats + 1):
        est = ort_estimator(spec, backend, 1, batch=256)
        t0 = time.perf_counter()
        quiet_fit(est, Xs, ys)
        runs.append((time.perf_counter() - t0) * 1e3)
    return {"fit_one_batch_ms": statistics.median(runs[1:]), "cold_ms": runs[0], "runs": runs}


def ort_rss_growth(spec: dict, backend: str, X, y, epochs: int, marks) -> dict:
    """Train a new estimator for ``epochs`` epochs in one fit; report RSS after each mark."""
    est = ort_estimator(spec, backend, epochs)
    with epoch_clock() as clock:
        quiet_fit(est, X, y)
    rss = clock.rss
    if len(rss) < epochs:
        return {"error": f"{len(rss)} epoch log records for {epochs} epochs"}
    out = {f"rss_after_epoch_{m}_mb": rss[m - 1] for m in marks}
    out["growth_mb"] = rss[marks[-1] - 1] - rss[marks[0] - 1]
    out["rss_per_epoch_mb"] = [round(v, 2) for v in rss]
    out["epochs"] = epochs
    out["how"] = "one fit, RSS read at each epoch's log record"
    return out


def ort_profile(spec: dict, backend: str, X, y, n_batches: int) -> dict:
    """Kernel time per batch of one epoch under onnxruntime's profiler, by op type.

    Profiling is turned on through ``SESSION_OPTIONS_HOOKS`` (one file prefix per
    options object); the sessions write their profiles when they are freed, after
    the fit. ``kernel_us`` is the time inside the kernels, to set against the
    wall time per batch of the timed epochs (the rest is the runtime's and the
    loop's overhead).
    """
    tmp = tempfile.mkdtemp(prefix="ortprof")
    counter = iter(range(10**6))

    def profiling(so, threads):
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(tmp, f"options{next(counter)}")

    rows = min(X.shape[0], n_batches * spec["batch"])
    n_batches = rows // spec["batch"]
    rows = n_batches * spec["batch"]  # whole batches: one step graph
    try:
        with session_options_hook(profiling):
            est = ort_estimator(spec, backend, 1)
            t0 = time.perf_counter()
            quiet_fit(est, X[:rows], y[:rows])
            wall = time.perf_counter() - t0
            est = None
            gc.collect()
        by_op = defaultdict(float)
        decoder = json.JSONDecoder()
        files = [os.path.join(tmp, n) for n in os.listdir(tmp)]
        for path in files:
            with open(path) as f:
                text = f.read()
            pos = 0
            while pos < len(text):
                if text[pos].isspace() or text[pos] in ",":
                    pos += 1
                    continue
                events, pos = decoder.raw_decode(text, pos)
                for ev in events if isinstance(events, list) else [events]:
                    name = ev.get("name", "")
                    if ev.get("cat") != "Node" or not name.endswith("_kernel_time"):
                        continue
                    by_op[ev.get("args", {}).get("op_name", "?")] += ev["dur"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ops = sorted(by_op.items(), key=lambda kv: -kv[1])
    return {
        "batches": n_batches,
        "profile_files": len(files),
        "fit_wall_s_profiled": wall,
        "kernel_us_per_batch": sum(by_op.values()) / n_batches,
        "top_ops_us_per_batch": [{"op": op, "us": round(v / n_batches, 1)} for op, v in ops[:12]],
    }


def _timed_fits(est, X, y, task, clock=None) -> tuple[list, list, list]:
    """``repeats`` warm-start fits of ``epochs`` epochs: seconds per epoch, CPU shares, in-loop."""
    samples, shares, in_loop = [], [], []
    est.max_iter = task["epochs"]
    for _ in range(task["repeats"]):
        if clock is not None:
            clock.times.clear()
        with CpuWindow() as window:
            t0 = time.perf_counter()
            quiet_fit(est, X, y)
            samples.append((time.perf_counter() - t0) / task["epochs"])
        shares.append(window.share)
        if clock is not None and len(clock.times) == task["epochs"]:
            in_loop.extend(np.diff(clock.times).tolist())
    return samples, shares, in_loop


def run_ort_epochs(spec: dict, task: dict, X, y) -> dict:
    """Seconds per epoch of a warm estimator (engine made), and the requested extras.

    Timed with ``n_jobs=THREADS``, then (``task["threads"]``) with the other thread
    counts, each on an estimator of its own.
    """
    backend = task["backend"]
    res: dict = {"samples_by_threads": {}}
    for k, threads in enumerate(task.get("threads", [THREADS])):
        est = ort_estimator(spec, backend, 1, threads=threads)
        with epoch_clock() as clock:
            quiet_fit(est, X[:512], y[:512])  # conversion, engine and sessions
            if k == 0:
                res["rss_after_engine_mb"] = rss_mb()
                res["backend_"] = est.backend_
            quiet_fit(est, X, y)  # warm-up: one epoch on the whole data (same engine)
            if k == 0:
                res["rss_after_warmup_mb"] = rss_mb()
            samples, shares, in_loop = _timed_fits(est, X, y, task, clock)
        res["samples_by_threads"][str(threads)] = samples
        if k == 0:
            res["samples"] = samples
            res["samples_others_share"] = shares
            res["epoch_in_loop_s"] = in_loop
            if in_loop:
                n_batches = math.ceil(X.shape[0] / spec["batch"])
                res["batch_in_loop_us"] = statistics.median(in_loop) / n_batches * 1e6
            res["peak_rss_timing_mb"] = peak_rss_mb()
        est = None
    extras = task.get("extras", [])
    n_profile = 400 if spec["batch"] < 128 else 120
    calls = {
        "startup": (ort_startup, spec, backend, X, y, task.get("startup_repeats", 5)),
        "rss_growth": (
            ort_rss_growth,
            spec,
            backend,
            X,
            y,
            task["growth_epochs"],
            task["growth_marks"],
        ),
        "profile": (ort_profile, spec, backend, X, y, n_profile),
    }
    res["extras_others_share"] = {}
    for key, (fn, *args) in calls.items():
        if key in extras:
            with CpuWindow() as window:
                res[key] = guarded(fn, *args)
            res["extras_others_share"][key] = window.share
    return res


def _timed_epochs(epoch, task) -> tuple[list, list]:
    """Seconds per epoch of ``epoch()`` after a warm-up, ``task["repeats"]`` times over
    ``task["epochs"]`` epochs, and the other processes' CPU share during each."""
    epoch()  # warm-up
    samples, shares = [], []
    for _ in range(task["repeats"]):
        with CpuWindow() as window:
            t0 = time.perf_counter()
            for _ in range(task["epochs"]):
                epoch()
            samples.append((time.perf_counter() - t0) / task["epochs"])
        shares.append(window.share)
    return samples, shares


def run_torch_epochs(spec: dict, task: dict, X, y) -> dict:
    """The PyTorch loop: seconds per epoch for each thread count, on request the split."""
    import torch

    res: dict = {"samples_by_threads": {}}
    for k, threads in enumerate(task.get("threads", [THREADS])):
        epoch = torch_trainer(spec, X, y, threads=threads)
        samples, shares = _timed_epochs(epoch, task)
        res["samples_by_threads"][str(threads)] = samples
        if k == 0:
            res.update(samples=samples, samples_others_share=shares)
            res["peak_rss_timing_mb"] = peak_rss_mb()
            if "phases" in task.get("extras", []):
                phases = defaultdict(float)
                with CpuWindow() as window:
                    for _ in range(PHASE_EPOCHS):
                        epoch(phases)
                nb = math.ceil(X.shape[0] / spec["batch"]) * PHASE_EPOCHS
                out = {k: v / nb * 1e6 for k, v in phases.items()}
                out["sum"] = sum(out.values())
                out["data"] = out["shuffle"] + out["slice"]
                res["phases_us"] = out
                res["extras_others_share"] = {"phases_us": window.share}
    torch.set_num_threads(THREADS)
    res["torch_version"] = torch.__version__
    return res


def run_sklearn_epochs(spec: dict, task: dict, X, y) -> dict:
    """scikit-learn: MLPRegressor/MLPClassifier, or SGDRegressor (per sample).

    The BLAS threads are set with threadpoolctl for each thread count.
    """
    from threadpoolctl import threadpool_limits

    res: dict = {"samples_by_threads": {}}
    for k, threads in enumerate(task.get("threads", [THREADS])):
        est = sklearn_estimator(spec, 1)
        samples, shares = [], []
        with threadpool_limits(threads), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.fit(X, y)  # warm-up
            est.set_params(max_iter=task["epochs"])
            for _ in range(task["repeats"]):
                with CpuWindow() as window:
                    t0 = time.perf_counter()
                    est.fit(X, y)
                    samples.append((time.perf_counter() - t0) / task["epochs"])
                shares.append(window.share)
        res["samples_by_threads"][str(threads)] = samples
        if k == 0:
            res.update(samples=samples, samples_others_share=shares)
            res["peak_rss_timing_mb"] = peak_rss_mb()
            res["model"] = type(est).__name__
    return res


#: Modules the floor's process must not load (its imports: numpy and threadpoolctl).
FRAMEWORK_MODULES = ("torch", "sklearn", "onnx", "onnxruntime", "onnxgrad_sklearn")


def run_floor_epochs(spec: dict, task: dict, X, y) -> dict:
    """The floor: NumPy's matrix products and activations of every batch, per epoch.

    :func:`bench_workloads.floor_step` over the epoch shuffle of the PyTorch loop,
    float32, the BLAS threads set with threadpoolctl for each thread count (as
    :func:`run_sklearn_epochs`); a warm-up epoch, then ``repeats`` x ``epochs``.
    """
    from threadpoolctl import threadpool_info, threadpool_limits

    res: dict = {"samples_by_threads": {}}
    for k, threads in enumerate(task.get("threads", [THREADS])):
        with threadpool_limits(threads):
            samples, shares = _timed_epochs(floor_trainer(spec, X, y), task)
        res["samples_by_threads"][str(threads)] = samples
        if k == 0:
            res.update(samples=samples, samples_others_share=shares)
            res["peak_rss_timing_mb"] = peak_rss_mb()
    res["blas"] = [
        {key: pool.get(key) for key in ("internal_api", "version", "num_threads")}
        for pool in threadpool_info()
    ]
    res["framework_modules_loaded"] = [
        m for m in FRAMEWORK_MODULES if any(k == m or k.startswith(m + ".") for k in sys.modules)
    ]
    return res


def epochs_runner(framework: str):
    """The epoch worker of a framework (or of the floor)."""
    if framework in ORT_BACKENDS:
        return run_ort_epochs
    runners = {"torch": run_torch_epochs, "sklearn": run_sklearn_epochs, FLOOR: run_floor_epochs}
    return runners[framework]


# ---------------------------------------------------------------------------
# whole fits on small data
# ---------------------------------------------------------------------------


def whole_fit(framework: str, spec: dict, X, y, epochs: int, threads: int):
    """Return ``fit()``: one whole fit of a new model of ``framework`` (seconds)."""
    from threadpoolctl import threadpool_limits

    if framework in ORT_BACKENDS:

        def fit():
            est = ort_estimator(spec, framework, epochs, warm_start=False, threads=threads)
            t0 = time.perf_counter()
            quiet_fit(est, X, y)
            return time.perf_counter() - t0

    elif framework == "sklearn":

        def fit():
            est = sklearn_estimator(spec, epochs, warm_start=False)
            with threadpool_limits(threads):
                t0 = time.perf_counter()
                quiet_fit(est, X, y)
                return time.perf_counter() - t0

    else:

        def fit():
            t0 = time.perf_counter()
            epoch = torch_trainer(spec, X, y, threads=threads)  # model, weights, optimizer
            for _ in range(epochs):
                epoch()
            return time.perf_counter() - t0

    return fit


def run_fits(task: dict) -> dict:
    """Whole fits of the small-data workloads: a warm-up fit, then ``repeats`` timed.

    For each thread count of ``task["threads"]`` (the first one is the table's).
    """
    framework = task["framework"]
    results = {}
    for name in task["fits"]:
        spec = FITS[name]
        X, y = make_data(spec)
        epochs = spec["quick_epochs"] if task["quick"] else spec["epochs"]
        res = {"samples_by_threads": {}, "epochs": epochs, "memory": model_memory(spec)}
        for k, threads in enumerate(task.get("threads", [THREADS])):
            fit = whole_fit(framework, spec, X, y, epochs, threads)
            fit()  # warm-up: lazy imports, first conversion (see the import rows)
            samples, shares = [], []
            for _ in range(task["repeats"]):
                with CpuWindow() as window:
                    samples.append(fit())
                shares.append(window.share)
            res["samples_by_threads"][str(threads)] = samples
            if k == 0:
                res.update(samples=samples, samples_others_share=shares)
        res["peak_rss_mb"] = peak_rss_mb()
        results[name] = res
    return results


# ---------------------------------------------------------------------------
# predict latency and GridSearchCV (daily use)
# ---------------------------------------------------------------------------

PREDICT_SPEC = FITS["fit_diabetes_nesterov"]


def _latency_us(fn, X) -> dict:
    """Median and best per-call time of ``fn(X)`` over 5 rounds, in microseconds."""
    n = 2000 if X.shape[0] == 1 else 200
    fn(X)
    rounds = [time_calls(lambda: fn(X), n) for _ in range(5)]
    return {"median_us": statistics.median(rounds), "best_us": min(rounds), "calls": n}


def run_predict(task: dict) -> dict:
    """Predict latency of a fitted model, 1 row and 1,000 rows.

    ``ort``: ``OrtGradientRegressor.predict`` after a fit with each backend, and a
    bare ``InferenceSession.run`` on its ``to_onnx()`` graph (same threads);
    ``sklearn``: ``MLPRegressor.predict``.
    """
    spec = PREDICT_SPEC
    X, y = make_data(spec)
    epochs = 5
    rows = {"1": X[:1], "1000": np.ascontiguousarray(np.resize(X, (1000, X.shape[1])))}
    out = {}
    with CpuWindow() as window:
        if task["framework"] == "sklearn":
            est = quiet_fit(sklearn_estimator(spec, epochs, warm_start=False), X, y)
            out["MLPRegressor"] = {k: _latency_us(est.predict, v) for k, v in rows.items()}
        else:
            import onnxruntime

            for backend in ORT_BACKENDS:
                est = ort_estimator(spec, backend, epochs, warm_start=False)
                quiet_fit(est, X, y)
                out[backend] = {k: _latency_us(est.predict, v) for k, v in rows.items()}
            so = onnxruntime.SessionOptions()
            so.intra_op_num_threads = THREADS
            sess = onnxruntime.InferenceSession(est.to_onnx().SerializeToString(), sess_options=so)
            feed = sess.get_inputs()[0].name
            out["InferenceSession"] = {
                k: _latency_us(lambda a: sess.run(None, {feed: a}), v) for k, v in rows.items()
            }
    out["others_share"] = window.share
    return out


def run_grid(task: dict) -> dict:
    """``GridSearchCV(n_jobs=2)`` of the diabetes MLP: a first call (new workers) and a second.

    4 candidates x 3 folds + the refit, ``max_iter`` 50 (quick mode: 2 x 2, 10
    epochs, the first call only). The
    package's estimators take their threads from joblib's inner limit
    (``n_jobs=None``).
    """
    from sklearn.model_selection import GridSearchCV

    spec = PREDICT_SPEC
    X, y = make_data(spec)
    epochs = 10 if task["quick"] else 50
    fw = task["framework"]
    if fw == "sklearn":
        est = sklearn_estimator(spec, epochs, warm_start=False)
    else:
        est = ort_estimator(spec, fw, epochs, warm_start=False).set_params(n_jobs=None)
    grid = {"alpha": [1e-4, 1e-2], "learning_rate_init": [1e-3, 1e-2]}
    calls, folds = ("first_s", "second_s"), 3
    if task["quick"]:
        grid, calls, folds = {"alpha": [1e-4, 1e-2]}, ("first_s",), 2
    out = {"candidates": math.prod(map(len, grid.values())), "folds": folds, "epochs": epochs}
    with CpuWindow() as window:
        for key in calls:
            search = GridSearchCV(est, grid, cv=folds, n_jobs=2)
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                search.fit(X, y)
            out[key] = time.perf_counter() - t0
    out["best_score"] = float(search.best_score_)
    out["others_share"] = window.share
    return out


# ---------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------


def run_epochs(task: dict) -> dict:
    """Epoch workloads of one framework: ``{workload: result}``."""
    framework = task["framework"]
    rss_import = rss_mb()
    results = {}
    for job in task["jobs"]:
        spec = WORKLOADS[job["workload"]]
        if job.get("hidden"):  # memory scaling: the same workload with other layer sizes
            spec = {**spec, "hidden": tuple(job["hidden"])}
        X, y = make_data(spec, job["rows"])
        res = {
            "rss_after_import_mb": rss_import,
            "data_mb": (X.nbytes + y.nbytes) / 2**20,
            "rss_after_data_mb": rss_mb(),
        }
        run = epochs_runner(framework)
        res.update(run(spec, {**task, **job, "backend": framework}, X, y))
        res["peak_rss_mb"] = peak_rss_mb()
        res["model_memory"] = model_memory(spec)
        results[job["workload"]] = res
        del X, y
    return results


def worker_main(payload: str) -> int:
    """Run one task given as JSON; print the results as one JSON line (``RESULT_MARK``)."""
    task = json.loads(payload)
    framework = task["framework"]
    if framework == "torch" and importlib.util.find_spec("torch") is None:
        print(RESULT_MARK + json.dumps({"skipped": "torch is not importable"}))
        return 0
    # Import first, so that the RSS after imports is the fixed cost of the framework.
    if framework == "torch":
        import torch  # noqa: F401
    elif framework == "sklearn":
        import sklearn.linear_model  # noqa: F401
        import sklearn.neural_network  # noqa: F401
    elif framework == FLOOR:
        import threadpoolctl  # noqa: F401  (numpy is imported with this module)
    else:
        import onnx  # noqa: F401
        import onnx_ad  # noqa: F401
        import skl2onnx  # noqa: F401

        from onnxgrad_sklearn.runtime import import_onnxruntime

        import_onnxruntime()  # the package imports it on first use: counted in the baseline
    kinds = {"epochs": run_epochs, "fits": run_fits, "predict": run_predict, "grid": run_grid}
    results = kinds[task["kind"]](task)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    answer = {"results": results, "cpu_s": usage.ru_utime + usage.ru_stime}
    if "onnxgrad_sklearn" in sys.modules:
        answer["library"] = library_fingerprint()
        answer["library_path"] = os.path.dirname(sys.modules["onnxgrad_sklearn"].__file__)
    print(RESULT_MARK + json.dumps(answer))
    return 0


def library_fingerprint() -> str | None:
    """SHA-256 (first 12 hex digits) of the package's source files, to tell states apart."""
    import hashlib

    spec = importlib.util.find_spec("onnxgrad_sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    digest = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(folder)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                digest.update(os.path.relpath(path, folder).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:12]
