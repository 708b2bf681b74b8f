"""Side-by-side training benchmark: onnxgrad_sklearn, PyTorch and scikit-learn on CPU.

Run from the repository root::

    python benchmarks/bench.py              # full run, several minutes
    python benchmarks/bench.py --quick      # small data, under a minute
    python benchmarks/bench.py --out DIR    # where latest.json and benchmark.png go
    python benchmarks/bench.py --max-wait 0 # do not wait for other processes to go quiet
    python benchmarks/bench.py --no-snapshot  # import the package's files, not a copy

Every measurement runs in a fresh process (this script with the hidden ``--worker``
flag, answering with one JSON line on stdout), the frameworks taking turns
(ORT, PyTorch, scikit-learn, ORT, PyTorch, ...), all limited to 2 threads. The
workers import a copy of the package made at the start, so that one run measures
one state of its sources. Each worker records the share of the CPUs other
processes took during its measurements; in full mode a worker is run again when
that share exceeds 10%.
The same data (same seed) and the same model (same architecture, same initial
weights for the MLPs, equivalent update formulas) are trained by

* ``OrtGradientRegressor`` / ``OrtGradientClassifier`` (column ``ort``);
* an equivalent PyTorch CPU training loop (column ``torch``, skipped with a
  message when torch is not importable);
* scikit-learn's ``MLPRegressor`` / ``MLPClassifier`` (``solver="sgd"`` or
  ``"adam"``), and ``SGDRegressor`` for the linear workload (per-sample SGD,
  not mini-batch; column ``sklearn``).

Reported: seconds per epoch (median over the repeats of ``fit`` with a few
epochs), ratios to PyTorch, the per-batch split of the ORT loop (data,
forward, backward, update), the fit start-up time, peak RSS of each worker,
RSS growth over epochs, and (full mode) a few measurements of the runtime's
per-call costs and session options. Results go to ``latest.json`` and a bar
chart ``benchmark.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from importlib import metadata

import numpy as np

THREADS = 2
SEED = 0
EPOCHS = 3
PHASE_EPOCHS = 3
RESULT_MARK = "BENCH_RESULT "
FRAMEWORKS = ("ort", "torch", "sklearn")
HERE = os.path.dirname(os.path.abspath(__file__))

#: The workloads: data, model and optimizer; ``quick_rows`` replaces ``rows`` with --quick.
WORKLOADS = {
    "mlp_reg_b256": {
        "title": "MLP regression 100-256-256-1, Nesterov, batch 256",
        "kind": "mlp_reg",
        "rows": 50_000,
        "quick_rows": 3_000,
        "features": 100,
        "hidden": (256, 256),
        "optimizer": "nesterov",
        "batch": 256,
        "lr": 0.001,
    },
    "mlp_reg_b32": {
        "title": "MLP regression 100-256-256-1, Nesterov, batch 32",
        "kind": "mlp_reg",
        "rows": 50_000,
        "quick_rows": 1_500,
        "features": 100,
        "hidden": (256, 256),
        "optimizer": "nesterov",
        "batch": 32,
        "lr": 0.001,
    },
    "mlp_clf_b64": {
        "title": "MLP classification 100-128-3, Adam, batch 64",
        "kind": "mlp_clf",
        "rows": 50_000,
        "quick_rows": 3_000,
        "features": 100,
        "hidden": (128,),
        "classes": 3,
        "optimizer": "adam",
        "batch": 64,
        "lr": 0.001,
    },
    "linear_b1024": {
        "title": "LinearRegression 20 features, plain SGD, batch 1024",
        "kind": "linear",
        "rows": 1_000_000,
        "quick_rows": 50_000,
        "features": 20,
        "optimizer": "sgd",
        "batch": 1024,
        "lr": 0.01,
    },
}

SKLEARN_NOTE = {
    "linear_b1024": "SGDRegressor: per-sample SGD (not mini-batch)",
}


# ---------------------------------------------------------------------------
# measurements shared by the workers
# ---------------------------------------------------------------------------


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


def make_data(spec: dict, rows: int):
    """Return ``X`` (float32, C-contiguous) and ``y`` for a workload, from a fixed seed."""
    rng = np.random.default_rng(SEED)
    n_features = spec["features"]
    X = rng.standard_normal((rows, n_features), dtype=np.float32)
    w = rng.standard_normal(n_features).astype(np.float32) / np.sqrt(n_features)
    if spec["kind"] == "mlp_clf":
        W = rng.standard_normal((n_features, spec["classes"])).astype(np.float32)
        y = np.argmax(X @ W + 0.5 * rng.standard_normal((rows, spec["classes"])), axis=1)
        return X, y.astype(np.int64)
    z = X @ w
    if spec["kind"] == "mlp_reg":
        z = z + 0.5 * np.sin(2 * X[:, 0]) * X[:, 1]
    y = z + 0.1 * rng.standard_normal(rows).astype(np.float32)
    return X, np.ascontiguousarray(y, dtype=np.float32)


def glorot_weights(units, seed: int = SEED):
    """Return MLPRegressor's initial (coefs, intercepts) for ``units``, relu activation."""
    rng = np.random.RandomState(seed)
    coefs, intercepts = [], []
    for fan_in, fan_out in zip(units[:-1], units[1:]):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        coefs.append(rng.uniform(-bound, bound, (fan_in, fan_out)))
        intercepts.append(rng.uniform(-bound, bound, fan_out))
    return coefs, intercepts


def n_outputs(spec: dict) -> int:
    """Width of the model's last layer."""
    return spec["classes"] if spec["kind"] == "mlp_clf" else 1


def layer_units(spec: dict) -> list[int]:
    """Units of every layer of an MLP workload, input and output included."""
    return [spec["features"], *spec["hidden"], n_outputs(spec)]


def time_calls(fn, n: int) -> float:
    """Return the mean duration of ``fn()`` over ``n`` calls, in microseconds."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def cpu_ticks() -> tuple[int, int] | None:
    """Return (busy, total) clock ticks of all CPUs from /proc/stat, None elsewhere."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(values) - values[3] - values[4], sum(values)


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


def own_cpu_s() -> float:
    """CPU time of this process (all threads), user + system, in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
def epoch_clock():
    """Give an :class:`EpochClock` on the package's logger (INFO, not propagated) meanwhile."""
    logger = logging.getLogger("onnxgrad_sklearn")
    clock = EpochClock()
    saved = logger.level, logger.propagate
    logger.addHandler(clock)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield clock
    finally:
        logger.removeHandler(clock)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


# ---------------------------------------------------------------------------
# ORT worker
# ---------------------------------------------------------------------------


class Probe:
    """Time the calls of functions or methods, looked up by name and replaced while active.

    ``wrap(owner, attr, label)`` replaces ``owner.attr`` (a module global, a class
    attribute) by a timed version; the original comes back on :meth:`restore`.
    Attributes that do not exist are listed in ``missing`` instead. Each timed call
    costs about a microsecond more than the call itself.
    """

    def __init__(self):
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.missing: list[str] = []
        self._saved: list = []

    def wrap(self, owner, attr: str, label: str) -> None:
        """Time ``owner.attr`` under ``label``."""
        fn = getattr(owner, attr, None)
        if fn is None:
            self.missing.append(label)
            return
        total, calls = self.total, self.calls

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                total[label] += time.perf_counter() - t0
                calls[label] += 1

        own = attr in vars(owner)
        self._saved.append((owner, attr, vars(owner).get(attr), own))
        setattr(owner, attr, timed)

    def restore(self) -> None:
        """Put every original back."""
        for owner, attr, original, own in reversed(self._saved):
            if own:
                setattr(owner, attr, original)
            else:
                delattr(owner, attr)
        self._saved.clear()

    def reset(self) -> None:
        """Forget the times recorded so far."""
        self.total.clear()
        self.calls.clear()


def ort_estimator(spec: dict, max_iter: int, batch: int | None = None):
    """Return the onnxgrad_sklearn estimator of a workload (no penalty, fixed seed)."""
    from sklearn.linear_model import LinearRegression
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

    common = dict(
        optimizer=spec["optimizer"],
        learning_rate_init=spec["lr"],
        batch_size=batch or spec["batch"],
        max_iter=max_iter,
        alpha=0.0,
        random_state=SEED,
        warm_start=True,
        tol=0.0,
        n_iter_no_change=10**6,
        n_jobs=THREADS,  # the estimator's own thread setting (onnxruntime ignores OMP_*)
    )
    if spec["kind"] == "mlp_reg":
        return OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=spec["hidden"]), **common)
    if spec["kind"] == "mlp_clf":
        return OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=spec["hidden"]), **common)
    return OrtGradientRegressor(LinearRegression(), **common)


def quiet_fit(est, X, y):
    """``est.fit(X, y)`` without the convergence warnings of short fits."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y)


def ort_phase_split(est, X, y) -> dict:
    """Split ``PHASE_EPOCHS`` epochs of ``est.fit`` (warm start) into phases, per batch in us.

    The engine's objects are timed in place during a normal epoch:
    ``OrtGradientForwardBackward.forward`` (training forward up to the loss),
    ``.backward`` (gradients; the loss gradient is computed inside it, the loss
    being part of the training graph), ``run_with_ortvalues`` and ``BoundRun.run``
    as the engine calls them (the update session), ``TrainingEngine._feed``
    (zero-copy OrtValues of the batch), ``TrainingEngine.train_batch`` (the whole
    step), the epoch shuffle and
    ``_run_epochs`` (the whole loop). ``glue`` is what ``train_batch`` spends
    outside the timed calls (loss read-back, learning-rate OrtValue, feed lists,
    bookkeeping); ``loop`` what the epoch loop spends outside ``train_batch``
    and the shuffle (batch slicing, loss accumulation).
    """
    import onnxgrad_sklearn._base as base_module
    import onnxgrad_sklearn.engine as engine_module
    from onnxgrad_sklearn.ortgrad import OrtGradientForwardBackward

    probe = Probe()
    probe.wrap(OrtGradientForwardBackward, "forward", "forward")
    probe.wrap(OrtGradientForwardBackward, "backward", "backward")
    probe.wrap(engine_module, "run_with_ortvalues", "update_run")  # one output per weight
    probe.wrap(engine_module.BoundRun, "run", "update_run")  # flat vectors, IO binding
    probe.wrap(engine_module.TrainingEngine, "_feed", "feed_wrap")
    probe.wrap(engine_module.TrainingEngine, "train_batch", "train_batch")
    probe.wrap(base_module, "shuffle", "shuffle")
    probe.wrap(base_module.BaseOrtGradient, "_run_epochs", "epoch_loop")
    est.max_iter = PHASE_EPOCHS
    try:
        quiet_fit(est, X, y)
    finally:
        probe.restore()
    t, c = probe.total, probe.calls
    nb = c.get("train_batch", 0)
    if not nb:
        return {"error": f"train_batch was not called; missing: {probe.missing}"}
    out = {k: t[k] / nb * 1e6 for k in ("forward", "backward", "update_run", "feed_wrap")}
    out["train_batch"] = t["train_batch"] / nb * 1e6
    out["glue"] = out["train_batch"] - sum(
        out[k] for k in ("forward", "backward", "update_run", "feed_wrap")
    )
    out["shuffle"] = t.get("shuffle", 0.0) / nb * 1e6
    out["epoch_loop"] = t.get("epoch_loop", 0.0) / nb * 1e6
    out["loop"] = out["epoch_loop"] - out["train_batch"] - out["shuffle"]
    out["data"] = out["shuffle"] + out["loop"] + out["feed_wrap"]
    out["update"] = out["update_run"]
    out["sum"] = out["epoch_loop"]
    out["batches"] = nb
    out["calls"] = dict(c)
    out["missing"] = probe.missing
    out["loss_gradient"] = "inside backward (the loss is part of the training graph)"
    return out


def ort_startup(spec: dict, X, y, repeats: int) -> dict:
    """Time the start-up of ``fit``: a new estimator, ``max_iter=1``, 256 rows (one batch).

    The library's own functions are timed in place (inclusive times, in ms):
    ``prepare_template``, ``convert_template`` (of which ``export_model``, the
    skl2onnx conversion), ``TrainingEngine`` construction (of which
    ``build_training_graph``, ``OrtGradientForwardBackward``: gradient graph and
    its two sessions), every ``InferenceSession`` creation, ``_run_epochs`` (the
    one batch). ``startup`` is the whole fit minus ``_run_epochs``. The first
    repetition (cold: first conversion, lazy imports) is reported apart from the
    median of the others.
    """
    import onnxruntime

    import onnxgrad_sklearn._base as base_module
    import onnxgrad_sklearn.engine as engine_module
    import onnxgrad_sklearn.templates as templates_module

    Xs, ys = X[:256], y[:256]
    runs = []
    for _ in range(repeats + 1):
        probe = Probe()
        probe.wrap(base_module, "prepare_template", "prepare_template")
        probe.wrap(base_module, "convert_template", "convert_template")
        probe.wrap(templates_module, "export_model", "export_model")
        probe.wrap(base_module, "TrainingEngine", "training_engine")
        probe.wrap(engine_module, "build_training_graph", "build_training_graph")
        probe.wrap(engine_module, "OrtGradientForwardBackward", "forward_backward")
        probe.wrap(onnxruntime.InferenceSession, "__init__", "session_creation")
        probe.wrap(base_module.BaseOrtGradient, "_run_epochs", "epoch_loop")
        est = ort_estimator(spec, 1, batch=256)
        try:
            t0 = time.perf_counter()
            quiet_fit(est, Xs, ys)
            fit_s = time.perf_counter() - t0
        finally:
            probe.restore()
        run = {k + "_ms": v * 1e3 for k, v in probe.total.items()}
        run["fit_ms"] = fit_s * 1e3
        run["startup_ms"] = (fit_s - probe.total.get("epoch_loop", 0.0)) * 1e3
        run["sessions_created"] = probe.calls.get("session_creation", 0)
        runs.append(run)
    keys = sorted(set().union(*runs))
    out = {k: statistics.median(r.get(k, 0.0) for r in runs[1:]) for k in keys}
    out["cold"] = runs[0]
    out["missing"] = probe.missing
    return out


def ort_rss_growth(spec: dict, X, y, epochs: int, marks) -> dict:
    """Train a new estimator for ``epochs`` epochs in one fit; report RSS after each mark."""
    est = ort_estimator(spec, epochs)
    with epoch_clock() as clock:
        quiet_fit(est, X, y)
    rss = clock.rss
    how = "one fit, RSS read at each epoch's log record"
    if len(rss) < epochs:
        # No log record per epoch (library changed): one fit per epoch instead.
        est = ort_estimator(spec, 1)
        rss = []
        for _ in range(epochs):
            quiet_fit(est, X, y)
            rss.append(rss_mb())
        how = "one warm-start fit per epoch"
    out = {f"rss_after_epoch_{m}_mb": rss[m - 1] for m in marks}
    out["growth_mb"] = rss[marks[-1] - 1] - rss[marks[0] - 1]
    out["rss_per_epoch_mb"] = [round(v, 2) for v in rss]
    out["epochs"] = epochs
    out["how"] = how
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def model_memory(spec: dict) -> dict:
    """Parameters of a workload's model and bytes of weights + gradients + optimizer state."""
    if spec["kind"] == "linear":
        n = spec["features"] + 1
    else:
        units = layer_units(spec)
        n = sum(a * b + b for a, b in zip(units[:-1], units[1:]))
    n_state = {"sgd": 0, "nesterov": 1, "adam": 2}[spec["optimizer"]]
    return {"n_params": n, "weights_grads_state_mb": n * 4 * (2 + n_state) / 2**20}


def ort_session_variants():
    """Session options to compare for the whole batch step: (name, changes).

    ``changes`` is applied to the options the library asks for (so a session the
    library gives one thread keeps it, except where the variant sets threads).
    """
    import onnxruntime

    def spinning_off(so):
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")

    def one_thread(so):
        so.intra_op_num_threads = 1

    def basic(so):
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC

    # execution_mode=ORT_PARALLEL is refused by the agent's partial runs
    # ("Only sequential mode is supported").
    return [
        ("library default", None),
        ("allow_spinning=0", spinning_off),
        ("intra_op_num_threads=1", one_thread),
        ("graph_optimization_level=BASIC", basic),
    ]


def fit_with_options(spec: dict, X, y, change):
    """Fit a new estimator for one epoch, ``change(options)`` applied to its sessions' options."""
    import onnxgrad_sklearn.engine as engine_module

    saved = engine_module.session_options

    def patched(*args, **kwargs):
        so = saved(*args, **kwargs)
        if change is not None:
            change(so)
        return so

    engine_module.session_options = patched
    try:
        return quiet_fit(ort_estimator(spec, 1), X, y)
    finally:
        engine_module.session_options = saved


def copy_options(so, **changes):
    """Return new SessionOptions with the settings of ``so`` that matter here, then ``changes``."""
    import onnxruntime

    new = onnxruntime.SessionOptions()
    if so is not None:
        for attr in (
            "intra_op_num_threads",
            "inter_op_num_threads",
            "graph_optimization_level",
            "execution_mode",
            "log_severity_level",
        ):
            setattr(new, attr, getattr(so, attr))
        key = "session.intra_op.allow_spinning"
        try:
            new.add_session_config_entry(key, so.get_session_config_entry(key))
        except Exception:  # noqa: BLE001 - entry not set
            pass
    for attr, value in changes.items():
        setattr(new, attr, value)
    return new


def profile_engine(spec: dict, X, y, n_batches: int) -> dict:
    """Profile one epoch of ``n_batches`` batches with onnxruntime's profiler.

    Returns the kernel time per batch by phase and op type. Nodes named ``opt_*``
    are the update graph's; nodes whose name holds ``_Grad`` or starts with
    ``AccumulateGrad`` belong to the backward part of the training graph, the
    others to the forward part (the few shape nodes of the backward run during
    the forward count as backward; they cost next to nothing).
    """
    import shutil

    import onnxruntime

    tmp = tempfile.mkdtemp(prefix="ortprof")
    original = onnxruntime.InferenceSession.__init__
    counter = iter(range(10**6))

    def profiled_init(self, path_or_bytes, sess_options=None, providers=None, **kwargs):
        # one options object, hence one profile file, per session
        so = copy_options(
            sess_options,
            enable_profiling=True,
            profile_file_prefix=os.path.join(tmp, f"session{next(counter)}"),
        )
        original(self, path_or_bytes, sess_options=so, providers=providers, **kwargs)

    try:
        rows = min(X.shape[0], n_batches * spec["batch"])
        n_batches = math.ceil(rows / spec["batch"])
        onnxruntime.InferenceSession.__init__ = profiled_init
        try:
            t0 = time.perf_counter()
            est = quiet_fit(ort_estimator(spec, 1), X[:rows], y[:rows])
            wall = time.perf_counter() - t0
        finally:
            onnxruntime.InferenceSession.__init__ = original
        eng = est._engine
        paths = {eng.forward_backward.agent.session.end_profiling(), eng._update.end_profiling()}
        by_op = defaultdict(float)
        part_total = defaultdict(float)
        decoder = json.JSONDecoder()
        for path in paths:
            with open(path) as f:
                text = f.read()
            pos = 0
            while pos < len(text):
                if text[pos].isspace():
                    pos += 1
                    continue
                events, pos = decoder.raw_decode(text, pos)
                for ev in events:
                    name = ev.get("name", "")
                    if ev.get("cat") != "Node" or not name.endswith("_kernel_time"):
                        continue
                    node = name[: -len("_kernel_time")]
                    op = ev.get("args", {}).get("op_name", "?")
                    if node.startswith("opt_"):  # the update graph's GraphBuilder prefix
                        phase = "update"
                    elif "_Grad" in node or node.startswith("AccumulateGrad"):
                        phase = "backward"
                    else:
                        phase = "forward"
                    by_op[(phase, op)] += ev["dur"]
                    part_total[phase] += ev["dur"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ops = sorted(by_op.items(), key=lambda kv: -kv[1])
    return {
        "batches": n_batches,
        "fit_wall_s_profiled": wall,
        "kernel_us_per_batch": {k: v / n_batches for k, v in part_total.items()},
        "top_ops_us_per_batch": [
            {"phase": ph, "op": op, "us": round(v / n_batches, 1)} for (ph, op), v in ops[:16]
        ],
    }


def ort_update_variants(est) -> dict:
    """Time one update of the engine's weights: one graph output per weight (new
    OrtValues at every call) against the flat vectors written through IO binding
    (what the engine uses for element-wise optimizers on CPU)."""
    import onnxruntime

    from onnxgrad_sklearn.engine import _FlatBuffers, session_options
    from onnxgrad_sklearn.ortgrad import run_with_ortvalues, to_ortvalue

    eng = est._engine
    opt = eng.optimizer
    shapes = eng.shapes
    lr = to_ortvalue(np.array(1e-3, dtype=np.float32))
    grads = [to_ortvalue(np.zeros(shape, np.float32)) for shape in shapes]
    per_tensor = onnxruntime.InferenceSession(
        opt.build_update_model(shapes).SerializeToString(), sess_options=session_options(1)
    )
    names = [i.name for i in per_tensor.get_inputs()]
    feeds = [lr]
    for shape, grad in zip(shapes, grads):
        feeds.append(to_ortvalue(np.zeros(shape, np.float32)))
        feeds.append(grad)
        feeds.extend(to_ortvalue(np.zeros(shape, np.float32)) for _ in opt.state_names)
    out = {
        "n_weight_tensors": len(shapes),
        "n_params": int(sum(int(np.prod(s)) for s in shapes)),
        "update_graph_nodes_per_tensor": len(opt.build_update_model(shapes).graph.node),
    }
    reps = 300
    timings = {"per_tensor_us": []}
    calls = {"per_tensor_us": lambda: run_with_ortvalues(per_tensor, names, feeds)}
    if opt.elementwise:
        flat_model = opt.build_update_model(shapes, flat=True)
        out["update_graph_nodes_flat"] = len(flat_model.graph.node)
        flat = onnxruntime.InferenceSession(
            flat_model.SerializeToString(), sess_options=session_options(1)
        )
        buffers = _FlatBuffers(shapes, opt.state_names, flat, lr)
        bound = dict(zip(buffers.grad_names, grads))
        timings["flat_iobinding_us"] = []

        def flat_call():
            buffers.runs[buffers.current].run(bound)
            buffers.current ^= 1

        calls["flat_iobinding_us"] = flat_call
    for _ in range(5):
        for key, call in calls.items():
            timings[key].append(time_calls(call, reps))
    out.update({key: statistics.median(v) for key, v in timings.items()})
    out["best_of_5_us"] = {key: min(v) for key, v in timings.items()}
    return out


def ort_call_costs(est, X) -> dict:
    """Per-call costs of the objects the engine creates at every batch, in microseconds."""
    from onnxruntime.capi import _pybind_state as C

    from onnxgrad_sklearn.ortgrad import ortvalue_view, to_ortvalue

    xb = np.ascontiguousarray(X[: est.batch_size])
    values = [ortvalue_view(xb)] * 3 + list(est._engine.weights)

    def vector():
        vec = C.OrtValueVector()
        vec.reserve(len(values))
        for v in values:
            vec.push_back(v)
        return vec

    n = 2000
    return {
        "new_execution_state_us": time_calls(C.PartialGraphExecutionState, n),
        "ortvalue_vector_of_feeds_us": time_calls(vector, n),
        "n_feeds": len(values),
        "ortvalue_view_us": time_calls(lambda: ortvalue_view(xb), n),
        "scalar_to_ortvalue_us": time_calls(lambda: to_ortvalue(np.array(0.1, np.float32)), n),
        "new_ortvalue_cache_us": time_calls(C.OrtValueCache, n),
    }


def ort_session_option_times(spec: dict, X, y) -> dict:
    """Mean ``train_batch`` time (us) with the engine's sessions under several options.

    One estimator per option set, each timed over one epoch of at most 400 (batch
    < 128) or 120 batches, five times in turn; median and best of the five.
    """
    import onnxgrad_sklearn.engine as engine_module

    batch = spec["batch"]
    n_batches = 400 if batch < 128 else 120
    rows = min(X.shape[0], n_batches * batch)
    Xs, ys = X[:rows], y[:rows]
    fitted = [(name, fit_with_options(spec, Xs, ys, ch)) for name, ch in ort_session_variants()]
    times = defaultdict(list)
    for _ in range(5):
        for name, est in fitted:
            probe = Probe()
            probe.wrap(engine_module.TrainingEngine, "train_batch", "train_batch")
            try:
                quiet_fit(est, Xs, ys)
            finally:
                probe.restore()
            times[name].append(probe.total["train_batch"] / probe.calls["train_batch"] * 1e6)
    return {
        "median_us": {name: statistics.median(v) for name, v in times.items()},
        "best_of_5_us": {name: min(v) for name, v in times.items()},
        "batches": probe.calls["train_batch"],
    }


def ort_backward_op_costs(spec: dict) -> dict:
    """Time single backward kernels of a hidden layer and graph rewrites that compute the same.

    For a (batch, width) activation: ``ReluGrad`` (what the gradient builder emits)
    against ``Where(Greater(X, 0), dY, 0)`` and ``Mul(dY, Cast(Greater(X, 0)))``;
    the bias gradient ``ReduceSum(dY, axes=[0])`` against ``MatMul(ones(1, batch),
    dY)``; and ``Identity`` as the cost of one session call. Microseconds per call
    (session call included), best of 5 rounds.
    """
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    from onnxgrad_sklearn.engine import session_options
    from onnxgrad_sklearn.ortgrad import ortvalue_view

    batch, width = spec["batch"], spec["hidden"][0]
    rng = np.random.default_rng(0)
    arrays = {
        "dY": rng.standard_normal((batch, width), dtype=np.float32),
        "X": rng.standard_normal((batch, width), dtype=np.float32),
    }
    consts = [
        numpy_helper.from_array(np.zeros((), np.float32), "zero"),
        numpy_helper.from_array(np.ones((1, batch), np.float32), "ones"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    graphs = {
        "ReluGrad": [helper.make_node("ReluGrad", ["dY", "X"], ["o"], domain="com.microsoft")],
        "Where(Greater)": [
            helper.make_node("Greater", ["X", "zero"], ["m"]),
            helper.make_node("Where", ["m", "dY", "zero"], ["o"]),
        ],
        "Mul(Cast(Greater))": [
            helper.make_node("Greater", ["X", "zero"], ["m"]),
            helper.make_node("Cast", ["m"], ["c"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["dY", "c"], ["o"]),
        ],
        "ReduceSum(axis 0)": [helper.make_node("ReduceSum", ["dY", "axis0"], ["o"], keepdims=1)],
        "MatMul(ones, dY)": [helper.make_node("MatMul", ["ones", "dY"], ["o"])],
        "Identity": [helper.make_node("Identity", ["dY"], ["o"])],
    }
    values = {k: ortvalue_view(v) for k, v in arrays.items()}
    so = session_options()
    out = {"batch": batch, "width": width}
    for name, nodes in graphs.items():
        used = {i for n in nodes for i in n.input}
        graph = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info(k, TensorProto.FLOAT, [batch, width]) for k in arrays],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)],
            initializer=[c for c in consts if c.name in used],
        )
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 8
        sess = onnxruntime.InferenceSession(model.SerializeToString(), sess_options=so)
        feeds = {i.name: values[i.name] for i in sess.get_inputs()}
        time_calls(
            lambda sess=sess, feeds=feeds: sess._sess.run_with_ort_values(feeds, ["o"], None), 50
        )
        out[name + "_us"] = min(
            time_calls(
                lambda sess=sess, feeds=feeds: sess._sess.run_with_ort_values(feeds, ["o"], None),
                500,
            )
            for _ in range(5)
        )
    return out


def ort_levers(est, X, y, spec: dict) -> dict:
    """Measurements that size the possible speed-ups of the ORT loop."""
    n_batches = 400 if spec["batch"] < 128 else 120
    return {
        "call_costs": guarded(ort_call_costs, est, X),
        "backward_op_costs": guarded(ort_backward_op_costs, spec),
        "update_variants": guarded(ort_update_variants, est),
        "train_batch_us_by_session_options": guarded(ort_session_option_times, spec, X, y),
        "profile": guarded(profile_engine, spec, X, y, n_batches),
    }


def run_ort(spec: dict, task: dict, X, y) -> dict:
    """Worker for the onnxgrad_sklearn estimator: epoch timings and, on request, extras."""
    res: dict = {}
    est = ort_estimator(spec, 1)
    samples, shares, in_loop = [], [], []
    with epoch_clock() as clock:
        quiet_fit(est, X[:512], y[:512])  # conversion, engine and sessions, two small batches
        res["rss_after_engine_mb"] = rss_mb()
        quiet_fit(est, X, y)  # warm-up: one epoch on the whole data (same engine)
        res["rss_after_warmup_mb"] = rss_mb()
        est.max_iter = task["epochs"]
        for _ in range(task["repeats"]):
            clock.times.clear()
            with CpuWindow() as window:
                t0 = time.perf_counter()
                quiet_fit(est, X, y)
                samples.append((time.perf_counter() - t0) / task["epochs"])
            shares.append(window.share)
            if len(clock.times) == task["epochs"]:
                in_loop.extend(np.diff(clock.times).tolist())
    res["samples"] = samples
    res["samples_others_share"] = shares
    res["epoch_in_loop_s"] = in_loop
    res["peak_rss_timing_mb"] = peak_rss_mb()
    res["memory"] = model_memory(spec)
    extras = task.get("extras", [])
    calls = {
        "phases_us": (ort_phase_split, est, X, y),
        "startup": (ort_startup, spec, X, y, task.get("startup_repeats", 5)),
        "rss_growth": (ort_rss_growth, spec, X, y, task["growth_epochs"], task["growth_marks"]),
        "levers": (ort_levers, est, X, y, spec),
    }
    res["extras_others_share"] = {}
    for key, (fn, *args) in calls.items():
        if key.removesuffix("_us") in extras:
            with CpuWindow() as window:
                res[key] = guarded(fn, *args)
            res["extras_others_share"][key] = window.share
    return res


def guarded(fn, *args):
    """Call ``fn``; return its result, or the error text if it fails (library changed)."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported, not hidden
        return {"error": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------------------
# PyTorch worker
# ---------------------------------------------------------------------------


def run_torch(spec: dict, task: dict, X, y) -> dict:
    """Worker for the PyTorch loop: same model, initial weights, optimizer formulas, batches."""
    import torch

    torch.set_num_threads(THREADS)
    torch.manual_seed(SEED)
    nn = torch.nn
    if spec["kind"] == "linear":
        model = nn.Linear(spec["features"], 1)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
    else:
        units = layer_units(spec)
        coefs, intercepts = glorot_weights(units)
        layers = []
        for i, (c, b) in enumerate(zip(coefs, intercepts)):
            lin = nn.Linear(c.shape[0], c.shape[1])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(c.T.astype(np.float32)))
                lin.bias.copy_(torch.from_numpy(b.astype(np.float32)))
            layers.append(lin)
            if i < len(coefs) - 1:
                layers.append(nn.ReLU())
        model = nn.Sequential(*layers)
    params = list(model.parameters())
    if spec["optimizer"] == "nesterov":
        # torch keeps buf = m*buf + g and steps p -= lr*(g + m*buf): scikit-learn's
        # v = m*v - lr*g; p += m*v - lr*g with v = -lr*buf (constant learning rate).
        opt = torch.optim.SGD(params, lr=spec["lr"], momentum=0.9, nesterov=True)
    elif spec["optimizer"] == "adam":
        opt = torch.optim.Adam(params, lr=spec["lr"], betas=(0.9, 0.999), eps=1e-8)
    else:
        opt = torch.optim.SGD(params, lr=spec["lr"])
    if spec["kind"] == "mlp_clf":

        def loss_fn(out, target):
            return torch.nn.functional.cross_entropy(out, target)

    else:

        def loss_fn(out, target):
            return 0.5 * torch.mean((out - target) ** 2)

    y_model = y if spec["kind"] == "mlp_clf" else y.reshape(-1, 1)
    batch = spec["batch"]
    n = X.shape[0]
    rng = np.random.RandomState(SEED)

    def epoch(phases=None):
        t0 = time.perf_counter()
        idx = rng.permutation(n)
        Xe = torch.from_numpy(X[idx])
        ye = torch.from_numpy(y_model[idx])
        if phases is not None:
            phases["shuffle"] += time.perf_counter() - t0
        total = 0.0
        for start in range(0, n, batch):
            t0 = time.perf_counter()
            xb, yb = Xe[start : start + batch], ye[start : start + batch]
            t1 = time.perf_counter()
            out = model(xb)
            loss = loss_fn(out, yb)
            value = loss.item()
            t2 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            t3 = time.perf_counter()
            opt.step()
            t4 = time.perf_counter()
            total += value * xb.shape[0]
            if phases is not None:
                phases["slice"] += t1 - t0
                phases["forward"] += t2 - t1
                phases["backward"] += t3 - t2
                phases["update"] += t4 - t3
        return total / n

    epoch()  # warm-up
    samples, shares = [], []
    for _ in range(task["repeats"]):
        with CpuWindow() as window:
            t0 = time.perf_counter()
            for _ in range(task["epochs"]):
                epoch()
            samples.append((time.perf_counter() - t0) / task["epochs"])
        shares.append(window.share)
    res = {
        "samples": samples,
        "samples_others_share": shares,
        "peak_rss_timing_mb": peak_rss_mb(),
    }
    if "phases" in task.get("extras", []):
        phases = defaultdict(float)
        with CpuWindow() as window:
            for _ in range(PHASE_EPOCHS):
                epoch(phases)
        nb = math.ceil(n / batch) * PHASE_EPOCHS
        out = {k: v / nb * 1e6 for k, v in phases.items()}
        out["sum"] = sum(out.values())
        out["data"] = out["shuffle"] + out["slice"]
        res["phases_us"] = out
        res["extras_others_share"] = {"phases_us": window.share}
    res["torch_version"] = torch.__version__
    res["threads"] = torch.get_num_threads()
    return res


# ---------------------------------------------------------------------------
# scikit-learn worker
# ---------------------------------------------------------------------------


def run_sklearn(spec: dict, task: dict, X, y) -> dict:
    """Worker for scikit-learn: MLPRegressor/MLPClassifier, or SGDRegressor (per sample)."""
    from sklearn.linear_model import SGDRegressor
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    if spec["kind"] == "linear":
        est = SGDRegressor(
            max_iter=1,
            tol=None,
            penalty=None,
            learning_rate="constant",
            eta0=spec["lr"],
            random_state=SEED,
            warm_start=True,
        )
    else:
        cls = MLPClassifier if spec["kind"] == "mlp_clf" else MLPRegressor
        est = cls(
            hidden_layer_sizes=spec["hidden"],
            solver="adam" if spec["optimizer"] == "adam" else "sgd",
            momentum=0.9,
            nesterovs_momentum=True,
            learning_rate_init=spec["lr"],
            batch_size=spec["batch"],
            alpha=0.0,
            max_iter=1,
            tol=0.0,
            n_iter_no_change=10**6,
            random_state=SEED,
            warm_start=True,
        )
    samples, shares = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)  # warm-up
        est.set_params(max_iter=task["epochs"])
        for _ in range(task["repeats"]):
            with CpuWindow() as window:
                t0 = time.perf_counter()
                est.fit(X, y)
                samples.append((time.perf_counter() - t0) / task["epochs"])
            shares.append(window.share)
    return {
        "samples": samples,
        "samples_others_share": shares,
        "peak_rss_timing_mb": peak_rss_mb(),
        "model": type(est).__name__,
    }


# ---------------------------------------------------------------------------
# worker entry point and driver
# ---------------------------------------------------------------------------


def worker_main(payload: str) -> int:
    """Run the jobs of one framework given as JSON; print the results as one JSON line.

    ``payload`` holds ``framework`` and ``jobs`` (workload, rows, extras) plus the
    settings of :func:`plan`. The answer maps each workload to its result.
    """
    task = json.loads(payload)
    framework = task["framework"]
    runners = {"ort": run_ort, "torch": run_torch, "sklearn": run_sklearn}
    if framework == "torch" and importlib.util.find_spec("torch") is None:
        print(RESULT_MARK + json.dumps({"skipped": "torch is not importable"}))
        return 0
    # Import first, so that the RSS after imports is the fixed cost of the framework.
    if framework == "torch":
        import torch  # noqa: F401
    elif framework == "ort":
        import onnxgrad_sklearn  # noqa: F401
    else:
        import sklearn.linear_model  # noqa: F401
        import sklearn.neural_network  # noqa: F401
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
        res.update(runners[framework](spec, {**task, **job}, X, y))
        res["peak_rss_mb"] = peak_rss_mb()
        res["model_memory"] = model_memory(spec)
        results[job["workload"]] = res
        del X, y
    usage = resource.getrusage(resource.RUSAGE_SELF)
    answer = {"results": results, "cpu_s": usage.ru_utime + usage.ru_stime}
    if framework == "ort":
        answer["library"] = library_fingerprint()
        answer["library_path"] = os.path.dirname(sys.modules["onnxgrad_sklearn"].__file__)
    print(RESULT_MARK + json.dumps(answer))
    return 0


def library_fingerprint() -> str | None:
    """SHA-256 (first 12 hex digits) of the package's source files, to tell library states apart."""
    import hashlib

    spec = importlib.util.find_spec("onnxgrad_sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        if name.endswith(".py"):
            digest.update(name.encode())
            with open(os.path.join(folder, name), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()[:12]


def snapshot_library() -> str | None:
    """Copy the package's sources to a temporary folder; return the folder (None if not found).

    Workers import the copy (first on PYTHONPATH), so that every worker of a run
    measures the same state of the library even if its files change meanwhile.
    """
    import shutil

    spec = importlib.util.find_spec("onnxgrad_sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = list(spec.submodule_search_locations)[0]
    tmp = tempfile.mkdtemp(prefix="bench_onnxgrad_")
    shutil.copytree(
        folder,
        os.path.join(tmp, "onnxgrad_sklearn"),
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return tmp


def worker_env(snapshot: str | None = None) -> dict:
    """Environment of the worker processes: 2 threads for OpenMP, MKL and OpenBLAS.

    With ``snapshot``, the library's copy there comes first on PYTHONPATH.
    """
    env = dict(os.environ)
    if snapshot:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (snapshot, env.get("PYTHONPATH")) if p)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(THREADS)
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def busy_share(window: float = 1.0) -> float | None:
    """Share of all CPUs busy over ``window`` seconds (this process sleeps meanwhile)."""
    start = cpu_ticks()
    time.sleep(window)
    end = cpu_ticks()
    if start is None or end is None or end[1] == start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


def wait_quiet(max_wait: float, threshold: float = 0.2) -> tuple[float | None, float]:
    """Wait until other processes use less than ``threshold`` of the CPUs, or ``max_wait`` s.

    Returns the last busy share seen and the time waited.
    """
    t0 = time.perf_counter()
    share = None
    while True:
        share = busy_share(0.5)
        waited = time.perf_counter() - t0
        if share is None or share < threshold or waited >= max_wait:
            return share, waited


def launch(task: dict, timeout: float, max_wait: float, env: dict | None = None) -> dict:
    """Run one worker process and return its JSON answer (or an ``error`` entry).

    Before it, wait (at most ``max_wait`` s) for the machine to be quiet; after it,
    record the share of CPU time other processes took while it ran.
    """
    before, waited = wait_quiet(max_wait) if max_wait > 0 else (None, 0.0)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(task)]
    ticks0 = cpu_ticks()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=env or worker_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    wall = time.perf_counter() - t0
    ticks1 = cpu_ticks()
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            res = json.loads(line[len(RESULT_MARK) :])
            if "cpu_s" not in res:
                return res
            res["process_wall_s"] = wall
            res["busy_share_before"] = before
            res["waited_s"] = waited
            if ticks0 and ticks1 and "cpu_s" in res and ticks1[1] > ticks0[1]:
                hz = os.sysconf("SC_CLK_TCK")
                others = (ticks1[0] - ticks0[0]) - res["cpu_s"] * hz
                res["others_cpu_share"] = max(0.0, others / (ticks1[1] - ticks0[1]))
            return res
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": f"worker exited with {proc.returncode}: {tail}"}


def versions() -> dict:
    """Versions of the packages involved, read from their metadata."""
    out = {"python": platform.python_version()}
    names = {
        "onnxruntime": ("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime"),
        "torch": ("torch",),
        "scikit-learn": ("scikit-learn",),
        "numpy": ("numpy",),
        "skl2onnx": ("skl2onnx",),
        "onnx": ("onnx",),
    }
    for key, candidates in names.items():
        for dist in candidates:
            try:
                out[key] = f"{metadata.version(dist)} ({dist})"
                break
            except metadata.PackageNotFoundError:
                continue
        else:
            out[key] = None
    return out


def cpu_model() -> str:
    """The CPU model name from lscpu (platform.processor() when lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in text.splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or "unknown"


def plan(quick: bool) -> dict:
    """Sizes of the run: rounds (processes per cell), repeats per process, extras."""
    if quick:
        return {
            "rounds": 1,
            "repeats": 3,
            "epochs": 2,
            "growth_epochs": 6,
            "growth_marks": [2, 6],
            "startup_repeats": 1,
            "startup_workloads": ["mlp_reg_b256"],
            "levers": False,
            "max_wait": 0.0,
            "attempts": 1,
            "retry_above": 1.0,
            "memory_hidden": [32, 64],
            "memory_rows": 1_000,
        }
    return {
        "rounds": 5,
        "repeats": 1,
        "epochs": EPOCHS,
        "growth_epochs": 50,
        "growth_marks": [5, 50],
        "startup_repeats": 10,
        "startup_workloads": list(WORKLOADS),
        "levers": True,
        "max_wait": 60.0,
        "attempts": 4,
        "retry_above": 0.10,
        "memory_hidden": [256, 1024, 2048],
        "memory_rows": 4_096,
    }


def extras_for(name: str, framework: str, cfg: dict) -> list[str]:
    """The extra measurements (besides the epoch timings) made for a workload."""
    if framework == "sklearn":
        return []
    extras = ["phases"]
    if framework == "ort":
        if name in cfg["startup_workloads"]:
            extras.append("startup")
        if name == "mlp_reg_b256":
            extras.append("rss_growth")
        if cfg["levers"] and WORKLOADS[name]["kind"] == "mlp_reg":
            extras.append("levers")
    return extras


def contention(res: dict, timing: bool = True, extras: bool = True) -> float | None:
    """Largest share of the CPUs other processes took during one of a worker's measurements."""
    shares = list(res.get("samples_others_share", [])) if timing else []
    if extras:
        shares += list(res.get("extras_others_share", {}).values())
    shares = [v for v in shares if v is not None]
    return max(shares) if shares else None


def run_worker(fw: str, jobs: list, settings: dict, cfg: dict, timeout: float, what: str) -> dict:
    """Launch a worker; measure again (up to ``cfg["attempts"]`` times) if others took the CPUs.

    ``what`` is ``"timing"`` (judge the epoch timings), ``"extras"`` (judge the
    extra measurements) or ``"all"``. Returns ``{workload: result}``.
    """
    discarded = []
    while True:
        answer = launch(
            {"framework": fw, "jobs": jobs, **settings}, timeout, cfg["max_wait"], cfg.get("env")
        )
        results = answer.get("results")
        if results is None:  # skipped or failed: the same answer for every workload
            return {job["workload"]: dict(answer) for job in jobs}
        worst = max(
            (
                contention(r, timing=what != "extras", extras=what != "timing") or 0.0
                for r in results.values()
            ),
            default=0.0,
        )
        if worst <= cfg["retry_above"] or len(discarded) + 1 >= cfg["attempts"]:
            break
        discarded.append(worst)
        names = ", ".join(job["workload"] for job in jobs)
        print(f"  {fw} {names} ({what}): others took {worst:.0%} of the CPUs, measuring again")
    for res in results.values():
        for key in ("process_wall_s", "others_cpu_share", "busy_share_before"):
            res["process_" + key.removeprefix("process_")] = answer.get(key)
        if answer.get("library"):
            res["library"] = answer["library"]
        res["discarded_attempts_others_share"] = discarded
    return results


def run_all(quick: bool, max_wait: float | None = None, snapshot: str | None = None) -> dict:
    """Run the workers in turn (frameworks alternating) and gather the results.

    Full mode starts one process per workload, framework and round for the epoch
    timings, then one per workload and framework for the extra measurements;
    quick mode one process per framework doing every workload and its extras.
    """
    cfg = plan(quick)
    if max_wait is not None:
        cfg["max_wait"] = max_wait
    cfg["env"] = worker_env(snapshot)
    cfg["snapshot"] = snapshot is not None
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        print("torch is not importable: the PyTorch column is skipped.")
    frameworks = [f for f in FRAMEWORKS if f != "torch" or have_torch]
    groups = [list(WORKLOADS)] if quick else [[name] for name in WORKLOADS]
    settings = {k: cfg[k] for k in ("epochs", "growth_epochs", "growth_marks")}
    settings["startup_repeats"] = cfg["startup_repeats"]
    cells = defaultdict(list)
    extras_cells = {}
    timeout = 300 if quick else 1800
    rows = "quick_rows" if quick else "rows"
    for r in range(cfg["rounds"]):
        for group in groups:
            for fw in frameworks:
                jobs = [
                    {
                        "workload": name,
                        "rows": WORKLOADS[name][rows],
                        "extras": extras_for(name, fw, cfg) if quick and r == 0 else [],
                    }
                    for name in group
                ]
                what = "all" if quick else "timing"
                timing = {**settings, "repeats": cfg["repeats"]}
                results = run_worker(fw, jobs, timing, cfg, timeout, what)
                for name in group:
                    res = results[name]
                    report_line(f"round {r + 1}/{cfg['rounds']}", name, fw, res)
                    cells[(name, fw)].append(res)
                    if quick and r == 0:
                        extras_cells[(name, fw)] = res
    if not quick:
        for name in WORKLOADS:
            for fw in frameworks:
                jobs = [{"workload": name, "rows": WORKLOADS[name][rows]}]
                jobs[0]["extras"] = extras_for(name, fw, cfg)
                if not jobs[0]["extras"]:
                    continue
                extras = {**settings, "repeats": 0}
                res = run_worker(fw, jobs, extras, cfg, timeout, "extras")[name]
                report_line("extras", name, fw, res)
                extras_cells[(name, fw)] = res
    doc = summarise(cells, extras_cells, frameworks, quick, cfg)
    doc["memory_scaling"] = memory_scaling(frameworks, settings, cfg, timeout)
    doc["targets"] = targets(doc)
    return doc


def memory_scaling(frameworks, settings: dict, cfg: dict, timeout: float) -> dict:
    """Peak RSS of ``mlp_reg_b256`` with larger hidden layers, one process per size and framework.

    The slope between the two largest models, in MB of peak RSS per MB of weights +
    gradients + optimizer state, is what the memory target's 1.2 x applies to; the
    rest is the fixed overhead of the runtime.
    """
    out = {"rows": cfg["memory_rows"], "epochs": 2, "frameworks": {}}
    for hidden in cfg["memory_hidden"]:
        for fw in frameworks:
            job = {
                "workload": "mlp_reg_b256",
                "rows": cfg["memory_rows"],
                "hidden": [hidden, hidden],
                "extras": [],
            }
            run = {**settings, "repeats": 1, "epochs": 2}
            res = run_worker(fw, [job], run, cfg, timeout, "timing")["mlp_reg_b256"]
            if "peak_rss_mb" not in res:
                continue
            above = res["peak_rss_mb"] - res["rss_after_data_mb"]
            point = {
                "hidden": [hidden, hidden],
                "n_params": res["model_memory"]["n_params"],
                "weights_grads_state_mb": res["model_memory"]["weights_grads_state_mb"],
                "peak_above_data_mb": above,
            }
            print(f"  memory {fw:7s} hidden {hidden:5d}: peak {above:7.1f} MB above imports + data")
            out["frameworks"].setdefault(fw, {"points": []})["points"].append(point)
    for entry in out["frameworks"].values():
        a, b = entry["points"][-2:] if len(entry["points"]) > 1 else (None, None)
        if a and b and b["weights_grads_state_mb"] > a["weights_grads_state_mb"]:
            entry["slope"] = (b["peak_above_data_mb"] - a["peak_above_data_mb"]) / (
                b["weights_grads_state_mb"] - a["weights_grads_state_mb"]
            )
            entry["intercept_mb"] = (
                b["peak_above_data_mb"] - entry["slope"] * (b["weights_grads_state_mb"])
            )
    return out


def report_line(stage: str, name: str, fw: str, res: dict) -> None:
    """Print the progress line of one worker's result."""
    if "skipped" in res:
        print(f"  {name:14s} {fw:8s} skipped: {res['skipped']}")
    elif "error" in res:
        print(f"  {name:14s} {fw:8s} FAILED: {res['error']}")
    else:
        timing = f"{statistics.median(res['samples']):8.4f} s/epoch" if res.get("samples") else ""
        print(
            f"  {stage:9s} {name:14s} {fw:8s} {timing:16s} peak RSS {res['peak_rss_mb']:7.1f} MB"
            f"  others' CPU {fmt(contention(res), '.0%')}"
        )


def summarise(cells, extras_cells, frameworks, quick: bool, cfg: dict) -> dict:
    """Turn the raw worker answers (timings, extra measurements) into the JSON document."""
    doc = {
        "meta": {
            "mode": "quick" if quick else "full",
            "command": "python benchmarks/bench.py" + (" --quick" if quick else ""),
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "threads": THREADS,
            "versions": versions(),
            "epochs_per_measurement": cfg["epochs"],
            "rounds": cfg["rounds"],
            "repeats_per_process": cfg["repeats"],
            "extras": "first round's workers" if quick else "separate workers after the timings",
            "max_wait_for_quiet_s": cfg["max_wait"],
            "library_snapshot": cfg["snapshot"],
            "measure_again_above_others_share": cfg["retry_above"],
            "attempts_per_worker": cfg["attempts"],
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
        "workloads": {},
    }
    for name, spec in WORKLOADS.items():
        entry = {
            "title": spec["title"],
            "rows": spec["quick_rows"] if quick else spec["rows"],
            "features": spec["features"],
            "batch": spec["batch"],
            "sklearn_note": SKLEARN_NOTE.get(name, "MLP, same batch size and epochs"),
            "frameworks": {},
        }
        for fw in frameworks:
            runs = cells.get((name, fw), [])
            good = [r for r in runs if "samples" in r]
            samples = [s for r in good for s in r["samples"]]
            cell = {
                "s_per_epoch": statistics.median(samples) if samples else None,
                "min": min(samples) if samples else None,
                "max": max(samples) if samples else None,
                "samples": samples,
                "peak_rss_mb": max((r["peak_rss_timing_mb"] for r in good), default=None),
                "peak_rss_end_mb": max((r["peak_rss_mb"] for r in good), default=None),
                "errors": [r["error"] for r in runs if "error" in r],
                "skipped": next((r["skipped"] for r in runs if "skipped" in r), None),
                "others_cpu_share": [contention(r, extras=False) for r in good],
                "samples_others_share": [
                    v for r in good for v in r.get("samples_others_share", [])
                ],
                "discarded_attempts": sum(
                    len(r.get("discarded_attempts_others_share", [])) for r in good
                ),
                "process_wall_s": [r.get("process_wall_s") for r in good],
                "library": sorted({r["library"] for r in good if r.get("library")}),
            }
            if good:
                first = good[0]
                for key in (
                    "rss_after_import_mb",
                    "rss_after_data_mb",
                    "rss_after_engine_mb",
                    "rss_after_warmup_mb",
                    "peak_rss_timing_mb",
                    "data_mb",
                    "memory",
                    "threads",
                ):
                    if key in first:
                        cell[key] = first[key]
            extra = extras_cells.get((name, fw)) or {}
            for key in ("phases_us", "startup", "rss_growth", "levers", "extras_others_share"):
                if key in extra:
                    cell[key] = extra[key]
            if extra.get("discarded_attempts_others_share"):
                cell["extras_discarded_attempts"] = len(extra["discarded_attempts_others_share"])
            in_loop = [s for r in good for s in r.get("epoch_in_loop_s", [])]
            if in_loop:
                cell["epoch_in_loop_s"] = statistics.median(in_loop)
            entry["frameworks"][fw] = cell
        entry["ratios"] = ratios(entry["frameworks"])
        doc["workloads"][name] = entry
    states = sorted(
        {r["library"] for runs in cells.values() for r in runs if r.get("library")}
        | {r["library"] for r in extras_cells.values() if r.get("library")}
    )
    doc["meta"]["library_source_sha256"] = states
    return doc


def ratios(cells: dict) -> dict:
    """Ratios of seconds per epoch: each framework to PyTorch, scikit-learn to ORT."""

    def s(fw):
        return cells.get(fw, {}).get("s_per_epoch")

    out = {}
    if s("torch"):
        for fw in ("ort", "sklearn"):
            if s(fw):
                out[f"{fw}_over_torch"] = s(fw) / s("torch")
    if s("ort") and s("sklearn"):
        out["sklearn_over_ort"] = s("sklearn") / s("ort")
    return out


def targets(doc: dict) -> list[dict]:
    """Check the project's targets against the measurements."""
    w = doc["workloads"]
    out = []

    def add(what, value, limit, ok_if_below=True, unit=""):
        met = None if value is None else (value <= limit if ok_if_below else value >= limit)
        out.append({"target": what, "measured": value, "limit": limit, "met": met, "unit": unit})

    add(
        "MLP regression batch 256: ORT s/epoch / PyTorch s/epoch <= 0.8",
        w["mlp_reg_b256"]["ratios"].get("ort_over_torch"),
        0.8,
    )
    add(
        "MLP regression batch 32: ORT s/epoch / PyTorch s/epoch <= 0.6",
        w["mlp_reg_b32"]["ratios"].get("ort_over_torch"),
        0.6,
    )
    for name, entry in w.items():
        add(
            f"{name}: scikit-learn s/epoch / ORT s/epoch >= 2.5",
            entry["ratios"].get("sklearn_over_ort"),
            2.5,
            ok_if_below=False,
        )
    for name in ("mlp_reg_b256", "mlp_clf_b64"):
        startup = w[name]["frameworks"]["ort"].get("startup") or {}
        add(
            f"{name}: fit start-up (fit(max_iter=1) on 256 rows minus its training loop) <= 50 ms",
            startup.get("startup_ms"),
            50.0,
            unit="ms",
        )
    growth = w["mlp_reg_b256"]["frameworks"]["ort"].get("rss_growth") or {}
    add("RSS growth between the two marked epochs < 1 MB", growth.get("growth_mb"), 1.0, unit="MB")
    ort = w["mlp_reg_b256"]["frameworks"]["ort"]
    if "memory" in ort and ort.get("peak_rss_timing_mb"):
        excess = ort["peak_rss_timing_mb"] - ort["rss_after_import_mb"] - ort["data_mb"]
        budget = 1.2 * ort["memory"]["weights_grads_state_mb"]
        out.append(
            {
                "target": "MLP b256 peak RSS - RSS after imports - data <= 1.2 x "
                "(weights+grads+state) (runtime overhead beyond imports counted in)",
                "measured": excess,
                "limit": budget,
                "met": excess <= budget,
                "unit": "MB",
            }
        )
    slope = doc.get("memory_scaling", {}).get("frameworks", {}).get("ort", {}).get("slope")
    add(
        "peak RSS per MB of weights+grads+state, between the two largest MLPs <= 1.2 "
        "(the intercept is the fixed overhead)",
        slope,
        1.2,
    )
    return out


def fmt(value, spec=".3f") -> str:
    """Format a number or a missing value."""
    return "-" if value is None else format(value, spec)


def print_report(doc: dict) -> None:
    """Print the tables of a run."""
    meta = doc["meta"]
    print()
    print(f"{meta['cpu']}, {meta['cores']} cores, {meta['threads']} threads; {meta['versions']}")
    states = meta.get("library_source_sha256") or []
    print(f"onnxgrad_sklearn sources: {', '.join(states) or '?'}")
    if len(states) > 1:
        print("WARNING: the library's sources changed during the run.")
    if meta["mode"] == "quick":
        print("Quick run: small data, one process per framework; the figures only show that")
        print("everything runs, they do not measure the workloads.")
    print()
    head = (
        f"{'workload':15s} {'ort s/ep':>9s} {'torch s/ep':>10s} {'sklearn s/ep':>12s} "
        f"{'ort/torch':>9s} {'skl/torch':>9s} {'skl/ort':>8s}  {'peak RSS MB o/t/s':>17s}  "
        f"{'others CPU':>10s}"
    )
    print(head)
    print("-" * len(head))
    for name, e in doc["workloads"].items():
        f, r = e["frameworks"], e["ratios"]

        def cell(fw, key="s_per_epoch", fspec=".3f", f=f):
            return fmt(f.get(fw, {}).get(key), fspec)

        rss = "/".join(cell(fw, "peak_rss_mb", ".0f") for fw in FRAMEWORKS)
        shares = [v for c in f.values() for v in c.get("others_cpu_share", []) if v is not None]
        busy = max(shares) if shares else None
        print(
            f"{name:15s} {cell('ort'):>9s} {cell('torch'):>10s} {cell('sklearn'):>12s} "
            f"{fmt(r.get('ort_over_torch'), '.2f'):>9s} "
            f"{fmt(r.get('sklearn_over_torch'), '.2f'):>9s} "
            f"{fmt(r.get('sklearn_over_ort'), '.2f'):>8s}  "
            f"{rss:>17s}  {fmt(busy, '.0%'):>10s}"
        )
    for name, note in SKLEARN_NOTE.items():
        print(f"  {name}: scikit-learn column is {note}.")
    print("  others CPU: largest share of the CPUs other processes took during a timed fit.")
    for name, e in doc["workloads"].items():
        loop = e["frameworks"].get("ort", {}).get("epoch_in_loop_s")
        if loop:
            print(f"  {name}: ORT epoch inside the fit loop (no per-fit work) {loop:.3f} s")
    print()
    print("Per batch, microseconds. data = epoch shuffle (copy of the rows) + slicing")
    print("(+ zero-copy OrtValues for ORT);")
    print("the loss gradient is computed inside backward (the loss is part of the training")
    print("graph); glue = rest of train_batch (loss read-back, learning-rate value, feed lists).")
    for name, e in doc["workloads"].items():
        ort = e["frameworks"].get("ort", {}).get("phases_us") or {}
        tch = e["frameworks"].get("torch", {}).get("phases_us") or {}
        if "error" in ort:
            print(f"  {name}: ORT split unavailable ({ort['error']})")
        elif ort:
            print(
                f"  {name:14s} ORT   data {ort['data']:6.1f} "
                f"forward {ort['forward']:6.1f} backward {ort['backward']:7.1f} "
                f"update {ort['update']:6.1f} glue {ort['glue']:5.1f} total {ort['sum']:7.1f}"
            )
        if tch:
            print(
                f"  {name:14s} torch data {tch['data']:6.1f} "
                f"forward {tch['forward']:6.1f} backward {tch['backward']:7.1f} "
                f"update {tch['update']:6.1f}            total {tch['sum']:7.1f}"
            )
    print()
    for name, e in doc["workloads"].items():
        st = e["frameworks"].get("ort", {}).get("startup") or {}
        if "startup_ms" in st:

            def ms(key, st=st):
                return f"{st.get(key + '_ms', 0):5.1f}"

            print(
                f"  start-up {name:14s} {ms('startup')} ms: convert_template "
                f"{ms('convert_template')} (skl2onnx {ms('export_model')}), TrainingEngine "
                f"{ms('training_engine')} (gradient graph + 2 sessions {ms('forward_backward')}), "
                f"{st.get('sessions_created', 0):.0f} sessions {ms('session_creation')}"
            )
        elif st:
            print(f"  start-up {name}: {st}")
    scaling = doc.get("memory_scaling", {}).get("frameworks", {})
    for fw, entry in scaling.items():
        points = ", ".join(
            f"{p['hidden'][0]}: {p['peak_above_data_mb']:.1f} MB "
            f"for {p['weights_grads_state_mb']:.1f}"
            for p in entry["points"]
        )
        print(
            f"  peak RSS above imports + data by hidden size, {fw}: {points} MB of "
            f"weights+grads+state; slope {fmt(entry.get('slope'), '.2f')}, "
            f"intercept {fmt(entry.get('intercept_mb'), '.1f')} MB"
        )
    growth = doc["workloads"]["mlp_reg_b256"]["frameworks"].get("ort", {}).get("rss_growth")
    if growth:
        print(f"  RSS growth, ORT mlp_reg_b256: {growth}")
    for name, e in doc["workloads"].items():
        lev = e["frameworks"].get("ort", {}).get("levers")
        if lev:
            print(f"\n  runtime costs, {name}:")
            for key, value in lev.items():
                print(f"    {key}: {json.dumps(value)}")
    print()
    for t in doc["targets"]:
        status = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        print(f"  [{status:12s}] {t['target']}: measured {fmt(t['measured'], '.3f')} {t['unit']}")


def plot(doc: dict, path: str) -> None:
    """Write a grouped bar chart of seconds per epoch (workloads x frameworks)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["workloads"])
    labels = {"ort": "onnxgrad_sklearn (ORT)", "torch": "PyTorch", "sklearn": "scikit-learn"}
    colors = {"ort": "#1f77b4", "torch": "#ff7f0e", "sklearn": "#2ca02c"}
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.27
    x = np.arange(len(names))
    for k, fw in enumerate(FRAMEWORKS):
        values, lo, hi = [], [], []
        for name in names:
            cell = doc["workloads"][name]["frameworks"].get(fw, {})
            v = cell.get("s_per_epoch")
            values.append(v if v is not None else 0.0)
            lo.append(v - cell["min"] if v is not None else 0.0)
            hi.append(cell["max"] - v if v is not None else 0.0)
        if not any(values):
            continue
        bars = ax.bar(
            x + (k - 1) * width,
            values,
            width,
            yerr=[lo, hi],
            capsize=3,
            label=labels[fw],
            color=colors[fw],
        )
        ax.bar_label(bars, labels=[f"{v:.2f}" if v else "" for v in values], fontsize=7)
    ticks = []
    for name in names:
        e = doc["workloads"][name]
        ticks.append(f"{name}\n{e['rows']:,} rows, batch {e['batch']}")
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_ylabel("seconds per epoch (median; bars: min-max)")
    meta = doc["meta"]
    ax.set_title(
        f"Training time per epoch, {meta['threads']} threads, {meta['cpu']} ({meta['mode']} run)",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    """Command line: run the benchmark, print the tables, write JSON and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data, fewer repeats")
    parser.add_argument(
        "--out", default=os.path.join(HERE, "results"), help="folder for latest.json and the PNG"
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds to wait for other processes to go quiet before each worker "
        "(default: 60 full, 0 quick)",
    )
    parser.add_argument(
        "--no-snapshot",
        action="store_true",
        help="workers import the library's files as they are, not a copy made at the start",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    snapshot = None if args.no_snapshot else snapshot_library()
    try:
        doc = run_all(args.quick, args.max_wait, snapshot)
    finally:
        if snapshot:
            import shutil

            shutil.rmtree(snapshot, ignore_errors=True)
    doc["meta"]["total_wall_s"] = time.perf_counter() - t0
    json_path = os.path.join(args.out, "latest.json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=1)
    png_path = os.path.join(args.out, "benchmark.png")
    plot(doc, png_path)
    print_report(doc)
    print(f"\nwrote {json_path} and {png_path} ({doc['meta']['total_wall_s']:.0f} s)")
    failed = [
        f"{name}/{fw}"
        for name, e in doc["workloads"].items()
        for fw in ("ort", "sklearn")
        if e["frameworks"][fw]["s_per_epoch"] is None
    ]
    if failed:
        print(f"failed measurements: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
