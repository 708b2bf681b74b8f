"""ONNX templates (PyTorch exports): epochs, first fits and memory beside PyTorch (issue 41).

Run from the repository root::

    python benchmarks/onnx_templates.py              # medians of 3 (5 minutes on 2 quiet cores)
    python benchmarks/onnx_templates.py --quick      # small data, 1 repeat: checks that it runs
    python benchmarks/onnx_templates.py --repeats 5 --out DIR --max-wait 0 --retries 0

Three workloads, synthetic data of fixed seeds, each trained by
``OrtGradientClassifier(OnnxTemplate(path, frozen=...))`` with ``backend="standard"``
and ``backend="agent"`` (a refusal is recorded as such) and by a plain PyTorch loop of
the same module: same initial weights (the module is exported by the legacy exporter,
``dynamo=False, do_constant_folding=False``, from the same seed), the same batches in
order (``shuffle=False``), Adam with lr 1e-3, cross-entropy of the logits, no penalty:

* ``text``: Embedding(20,000, 64), mean over T=32 tokens, Linear(64, 4); 20,000 rows
  of int64 token ids, batch 256;
* ``cnn``: Conv(1->8, 3x3) ReLU MaxPool2, Conv(8->16, 3x3) ReLU MaxPool2, Flatten,
  Linear(400, 10); 10,000 float32 images 1 x 28 x 28, batch 64;
* ``cnn_frozen``: the same CNN, every weight but the last Linear frozen
  (``frozen=["c1.*", "c2.*"]``; PyTorch: ``requires_grad=False`` on them).

Each measurement runs in a new process (``python -c``, in a folder of its own so that
the snapshot of the package comes first on the path), 2 threads everywhere
(``torch.set_num_threads(2)``, ``n_jobs=2``, ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
/ ``OPENBLAS_NUM_THREADS=2``), the frameworks taking turns, ``--repeats`` rounds;
medians are reported. A process:

1. starts its clock at its first line, before any import (numpy included), imports
   the framework, makes the data and does the first fit (ours: ``max_iter=1``;
   PyTorch: module, optimizer and one epoch): the *first model*. Ours reads the
   training artifacts from a cache folder on disk filled by an unrecorded process
   beforehand (``ONNXGRAD_SKLEARN_CACHE_DIR``); separate processes measure it with a
   new, empty folder (*cold cache*);
2. then, warm, the seconds per epoch: ours, the slope between a 1-epoch and a 3-epoch
   fit of new estimators (the per-fit costs cancel out), and the median time between
   the epochs of the 3-epoch fit (the package logger's per-epoch records); PyTorch,
   the median of 3 more epochs;
3. records RSS after the imports and after the data, and the peak
   (``getrusage(...).ru_maxrss``), beside the MB of the model's weights + gradients +
   Adam's two moments (float32).

The machine may be shared, and PyTorch's 2 OpenMP threads slow down many times over
when another process holds one of the 2 cores: before each process the script waits
(``--max-wait``, 20 s) for other processes to use less than 20% of the CPUs, measures
their share while it runs (``/proc/stat`` minus the process's own CPU time, over the
timed epochs and over the whole process) and runs it again, ``--retries`` (2) times at
most, while that share is above ``--busy`` (10%); the quietest try is kept.

Then, in other processes not timed, the steps of ``cnn``, ``cnn_frozen`` and ``text``
are profiled for each framework: onnxruntime's profiler
(``SessionOptions.enable_profiling`` through the package's ``SESSION_OPTIONS_HOOKS``:
every session of a fit of 2 s or more, epochs over ``--profile-batches`` batches),
kernel time per batch by operator, and ``torch.profiler`` over as many batches after a
warm-up epoch (self CPU time by operator).

Output: ``DIR/onnx_templates.json`` and a Markdown table, printed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from bench_common import (  # noqa: E402
    RESULT_MARK,
    SEED,
    THREADS,
    CpuWindow,
    epoch_clock,
    fmt,
    git_state,
    load_average,
    peak_rss_mb,
    rss_mb,
)

#: The working folder of the measured processes (``python -c`` puts it first on sys.path).
RUN_DIR = tempfile.gettempdir()
CACHE_ENV = "ONNXGRAD_SKLEARN_CACHE_DIR"
OURS = ("standard", "agent")
FRAMEWORKS = ("standard", "agent", "torch")
TITLES = {"standard": "standard", "agent": "agent", "torch": "PyTorch"}
#: The workloads: the module, rows (quick rows), batch, frozen weights, issue 41's goal.
WORKLOADS = {
    "text": {
        "module": "text",
        "rows": 20_000,
        "quick_rows": 4_000,
        "batch": 256,
        "frozen": None,
        "title": "text: Embedding(20,000, 64), mean of 32 tokens, Linear(64, 4); 20,000 rows, "
        "batch 256",
    },
    "cnn": {
        "module": "cnn",
        "rows": 10_000,
        "quick_rows": 1_280,
        "batch": 64,
        "frozen": None,
        "title": "CNN: Conv(1->8) ReLU MaxPool, Conv(8->16) ReLU MaxPool, Linear(400, 10); "
        "10,000 x 1 x 28 x 28, batch 64",
    },
    "cnn_frozen": {
        "module": "cnn",
        "rows": 10_000,
        "quick_rows": 1_280,
        "batch": 64,
        "frozen": ["c1.*", "c2.*"],
        "title": "CNN, both convolutions frozen (only Linear(400, 10) trained)",
    },
}
#: Issue 41's goals.
GOALS = {"text": 1.0, "cnn": 1.5, "frozen_over_full": 0.75}
LR = 1e-3
TIMED_EPOCHS = 3
DISTRIBUTIONS = (
    "onnxruntime-training-cpu",
    "onnxruntime",
    "onnx",
    "onnx-ad",
    "torch",
    "numpy",
    "scikit-learn",
)
#: The benchmark's own modules (the commit's state of these is recorded).
SOURCES = ("onnx_templates", "bench_common", "bench_driver")
#: Nodes whose profiled time includes their subgraphs' nodes (counted apart).
CONTROL_FLOW = ("If", "Loop", "Scan")
HEAVY_MODULES = ("torch", "onnxruntime", "onnxruntime.training", "onnx", "onnx_ad", "skl2onnx")

# ---------------------------------------------------------------------------
# models and data (imported lazily: the measured processes time their imports)
# ---------------------------------------------------------------------------


def torch_module(kind: str):
    """The PyTorch module of a workload, its weights drawn from ``SEED``."""
    import torch

    nn = torch.nn

    class Text(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20_000, 64)
            self.fc = nn.Linear(64, 4)

        def forward(self, ids):
            return self.fc(self.emb(ids).mean(dim=1))

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(1, 8, 3)
            self.c2 = nn.Conv2d(8, 16, 3)
            self.fc = nn.Linear(16 * 5 * 5, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
            x = nn.functional.max_pool2d(torch.relu(self.c2(x)), 2)
            return self.fc(torch.flatten(x, 1))

    torch.manual_seed(SEED)
    return Text() if kind == "text" else CNN()


def torch_trainer(name: str):
    """The module of a workload and its Adam optimizer; the frozen weights (the
    workload's patterns) with ``requires_grad=False``, left out of the optimizer."""
    import fnmatch

    import torch

    spec = WORKLOADS[name]
    module = torch_module(spec["module"])
    for pname, p in module.named_parameters():
        if any(fnmatch.fnmatch(pname, pattern) for pattern in spec["frozen"] or []):
            p.requires_grad_(False)
    opt = torch.optim.Adam([p for p in module.parameters() if p.requires_grad], lr=LR)
    return module, opt


def make_data(name: str, rows: int):
    """Synthetic data of a workload (fixed seed): ``X``, integer classes ``y``."""
    import numpy as np

    rng = np.random.RandomState(SEED)
    if WORKLOADS[name]["module"] == "text":
        X = rng.randint(0, 20_000, size=(rows, 32)).astype(np.int64)
        y = (X[:, :4].sum(axis=1) % 4).astype(np.int64)
    else:
        X = rng.rand(rows, 1, 28, 28).astype(np.float32)
        y = (X[:, 0, :14, :14].mean(axis=(1, 2)) * 10).astype(np.int64) % 10
        y[:10] = np.arange(10)  # every class present
    return X, y


def export_models(folder: str) -> dict:
    """Export each module to ``folder/<kind>.onnx``; their initializers and sizes."""
    import io

    import onnx
    import torch

    out = {}
    for kind, name, example in (
        ("text", "ids", torch.zeros(2, 32, dtype=torch.int64)),
        ("cnn", "x", torch.zeros(2, 1, 28, 28)),
    ):
        module = torch_module(kind)
        f = io.BytesIO()
        torch.onnx.export(
            module,
            (example,),
            f,
            dynamo=False,
            do_constant_folding=False,
            input_names=[name],
            output_names=["out"],
            dynamic_axes={name: {0: "batch"}, "out": {0: "batch"}},
            opset_version=17,
        )
        model = onnx.load_from_string(f.getvalue())
        path = os.path.join(folder, f"{kind}.onnx")
        onnx.save(model, path)
        out[kind] = {
            "path": path,
            "initializers": {i.name: [int(d) for d in i.dims] for i in model.graph.initializer},
            "ops": [n.op_type for n in model.graph.node],
            "parameters": {n: int(p.numel()) for n, p in module.named_parameters()},
        }
    return out


def model_sizes(models: dict, name: str) -> dict:
    """Parameters (all, trained) and the MB of weights + gradients + Adam's moments."""
    import fnmatch

    spec = WORKLOADS[name]
    params = models[spec["module"]]["parameters"]
    frozen = spec["frozen"] or []
    trained = {n: c for n, c in params.items() if not any(fnmatch.fnmatch(n, p) for p in frozen)}
    n_all, n_trained = sum(params.values()), sum(trained.values())
    return {
        "parameters": n_all,
        "trained_parameters": n_trained,
        "trained_names": sorted(trained),
        "weights_grads_adam_mb": (n_all + 3 * n_trained) * 4 / 2**20,
    }


# ---------------------------------------------------------------------------
# the measured processes
# ---------------------------------------------------------------------------


def worker(task: dict, t0: float) -> dict:
    """One measurement process (``t0``: the clock at its first line). See the module doc."""
    fw, name = task["framework"], task["workload"]
    spec = WORKLOADS[name]
    out = {"framework": fw, "workload": name, "mode": task["mode"]}
    if fw == "torch":
        import numpy as np  # noqa: F401
        import torch

        torch.set_num_threads(THREADS)
    else:
        import numpy as np  # noqa: F401

        from onnxgrad_sklearn import OnnxTemplate, OrtGradientClassifier
    t1 = time.perf_counter()
    out["rss_after_imports_mb"] = rss_mb()
    X, y = make_data(name, task["rows"])
    out["data_mb"] = (X.nbytes + y.nbytes) / 2**20
    t2 = time.perf_counter()
    out["rss_after_data_mb"] = rss_mb()
    out["import_s"], out["data_s"] = t1 - t0, t2 - t1
    if fw == "torch":
        Xt, yt = torch.from_numpy(X), torch.from_numpy(y)
        module, opt = torch_trainer(name)
        batch = spec["batch"]

        def epoch():
            for start in range(0, len(Xt), batch):
                xb, yb = Xt[start : start + batch], yt[start : start + batch]
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(module(xb), yb)
                loss.backward()
                opt.step()
                loss.item()

        epoch()
        t3 = time.perf_counter()
        out["first_fit_s"], out["first_model_s"] = t3 - t2, t3 - t0
        out["modules_after_first_fit"] = {m: m in sys.modules for m in HEAVY_MODULES}
        if task["mode"] == "first":
            return out
        times = []
        with CpuWindow() as cpu:
            for _ in range(TIMED_EPOCHS):
                t = time.perf_counter()
                epoch()
                times.append(time.perf_counter() - t)
        out["epochs_s"] = times
        out["epoch_s"] = statistics.median(times)
        out["others_cpu"] = cpu.share
        out["peak_rss_mb"] = peak_rss_mb()
        return out

    def make(max_iter):
        template = OnnxTemplate(task["model_path"], frozen=spec["frozen"])
        return OrtGradientClassifier(
            template,
            optimizer="adam",
            learning_rate_init=LR,
            alpha=0.0,
            batch_size=spec["batch"],
            max_iter=max_iter,
            shuffle=False,
            backend=fw,
            n_jobs=THREADS,
            random_state=SEED,
        )

    import warnings

    warnings.simplefilter("ignore")  # convergence warnings of 1- and 3-epoch fits
    try:
        est = make(1).fit(X, y)
    except Exception as exc:  # noqa: BLE001 - a refusal or an error is the result
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    t3 = time.perf_counter()
    out["first_fit_s"], out["first_model_s"] = t3 - t2, t3 - t0
    out["backend_"] = est.backend_
    out["modules_after_first_fit"] = {m: m in sys.modules for m in HEAVY_MODULES}
    if task["mode"] == "first":
        return out
    with CpuWindow() as cpu:
        t = time.perf_counter()
        make(1).fit(X, y)
        fit1 = time.perf_counter() - t
        with epoch_clock() as clock:
            t = time.perf_counter()
            make(TIMED_EPOCHS).fit(X, y)
            fit3 = time.perf_counter() - t
    diffs = [b - a for a, b in zip(clock.times, clock.times[1:])]
    out.update(
        fit_1_epoch_s=fit1,
        fit_3_epochs_s=fit3,
        slope_s=(fit3 - fit1) / (TIMED_EPOCHS - 1),
        in_fit_epochs_s=diffs,
        in_fit_epoch_s=statistics.median(diffs) if diffs else None,
        others_cpu=cpu.share,
        peak_rss_mb=peak_rss_mb(),
    )
    out["epoch_s"] = out["slope_s"]
    return out


def profile_worker(task: dict) -> dict:
    """Kernel time per CNN batch by operator: onnxruntime's profiler or torch.profiler."""
    from collections import defaultdict

    fw, name = task["framework"], task["workload"]
    spec = WORKLOADS[name]
    n_batches = task["batches"]
    X, y = make_data(name, n_batches * spec["batch"])
    by_op, count, control = defaultdict(float), defaultdict(int), defaultdict(float)
    skipped = 0
    if fw == "torch":
        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.set_num_threads(THREADS)
        module, opt = torch_trainer(name)
        Xt, yt = torch.from_numpy(X), torch.from_numpy(y)

        def epoch():
            for start in range(0, len(Xt), spec["batch"]):
                xb, yb = Xt[start : start + spec["batch"]], yt[start : start + spec["batch"]]
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(module(xb), yb)
                loss.backward()
                opt.step()
                loss.item()

        epoch()  # warm-up
        epochs = 1
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            epoch()
            wall = time.perf_counter() - t
        for ev in prof.key_averages():
            by_op[ev.key] += ev.self_cpu_time_total
            count[ev.key] += ev.count
    else:
        import gc
        import warnings

        from onnxgrad_sklearn import OnnxTemplate, OrtGradientClassifier
        from onnxgrad_sklearn.runtime import SESSION_OPTIONS_HOOKS, SESSIONS

        warnings.simplefilter("ignore")
        tmp = tempfile.mkdtemp(prefix="onnx_templates_prof_")
        counter = iter(range(10**6))

        def make(max_iter):
            return OrtGradientClassifier(
                OnnxTemplate(task["model_path"], frozen=spec["frozen"]),
                optimizer="adam",
                learning_rate_init=LR,
                alpha=0.0,
                batch_size=spec["batch"],
                max_iter=max_iter,
                n_iter_no_change=max_iter + 1,
                shuffle=False,
                backend=fw,
                n_jobs=THREADS,
                random_state=SEED,
            )

        def profiling(so, threads):
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, f"s{next(counter)}")

        # onnxruntime names a profile after its options' prefix and the second the
        # session was made, and writes it when the session ends its profiling (at the
        # latest when it is freed): two sessions made from the same options in the same
        # second write the same file, the second over the first. So the sessions of the
        # profiled fit stay alive (a large model's fit would free its step sessions at
        # its end) and each one's profile is read as soon as it is written. The profiled
        # fit (new sessions: the hook is part of the pool's key) lasts 2 s or more: as
        # many epochs over the batches as an unprofiled fit says.
        import onnxruntime

        from onnxgrad_sklearn.backends.standard import StandardBackend

        t = time.perf_counter()
        make(1).fit(X, y)
        epochs = min(50, max(2, int(2.0 / (time.perf_counter() - t)) + 1))
        SESSION_OPTIONS_HOOKS.append(profiling)
        release = StandardBackend.release_sessions
        StandardBackend.release_sessions = lambda self: None
        try:
            t = time.perf_counter()
            est = make(epochs).fit(X, y)
            wall = time.perf_counter() - t
        finally:
            SESSION_OPTIONS_HOOKS.remove(profiling)
            StandardBackend.release_sessions = release
        epochs = est.n_iter_
        n_batches *= epochs
        lines = []
        for obj in gc.get_objects():
            if isinstance(obj, onnxruntime.InferenceSession):
                path = obj.end_profiling()
                if path and os.path.exists(path):
                    with open(path) as f:
                        lines.extend(f.read().splitlines())
                    os.remove(path)
        del est
        SESSIONS.clear()
        gc.collect()
        for fname in os.listdir(tmp):  # the sessions freed during the fit
            with open(os.path.join(tmp, fname)) as f:
                lines.extend(f.read().splitlines())
        # Read event by event (one a line): a file may hold a second session's events
        # written over the start of a first's.
        for line in lines:
            line = line.strip().rstrip(",")
            if not line.startswith("{"):
                continue
            try:
                ev = json.loads(line)
            except ValueError:
                skipped += 1
                continue
            if ev.get("cat") != "Node":
                continue
            if ev.get("name", "").endswith("_kernel_time"):
                op = ev.get("args", {}).get("op_name", "?")
                if op in CONTROL_FLOW:  # its subgraph's nodes have their own events
                    control[op] += ev["dur"]
                    continue
                by_op[op] += ev["dur"]
                count[op] += 1
        shutil.rmtree(tmp, ignore_errors=True)
    ops = sorted(by_op.items(), key=lambda kv: -kv[1])
    return {
        "framework": fw,
        "batches": n_batches,
        "epochs": epochs,
        "wall_us_per_batch_profiled": wall / n_batches * 1e6,
        "kernel_us_per_batch": sum(by_op.values()) / n_batches,
        "control_flow_us_per_batch": {op: v / n_batches for op, v in control.items()},
        "profile_lines_unreadable": skipped,
        "top_ops_us_per_batch": [
            {"op": op, "us": round(v / n_batches, 1), "calls_per_batch": count[op] / n_batches}
            for op, v in ops[:12]
        ],
    }


# ---------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------

CHILD = """\
import time
_T0 = time.perf_counter()
import sys
sys.path.insert(0, {here!r})
import json
import onnx_templates
print({mark!r} + json.dumps(onnx_templates.{fn}({task!r}{t0})))
"""


def run_child(fn: str, task: dict, env: dict, timeout: float) -> dict:
    """Run ``fn(task)`` in a new process; its answer (or an ``error``) with its wall time."""
    code = CHILD.format(
        here=HERE, mark=RESULT_MARK, fn=fn, task=task, t0=", _T0" if fn == "worker" else ""
    )
    import resource

    from bench_common import cpu_ticks

    ticks = cpu_ticks()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=RUN_DIR,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s", "process_s": timeout}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            res = json.loads(line[len(RESULT_MARK) :])
            res["process_s"] = time.perf_counter() - t0
            end, after = cpu_ticks(), resource.getrusage(resource.RUSAGE_CHILDREN)
            if ticks and end and end[1] > ticks[1]:
                child = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
                busy = end[0] - ticks[0] - child * os.sysconf("SC_CLK_TCK")
                res["others_cpu_process"] = max(0.0, busy / (end[1] - ticks[1]))
            return res
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": f"exited with {proc.returncode}: {tail}"}


def measure(task: dict, env: dict, cfg: dict, cold_in: str | None = None) -> dict:
    """One measurement: wait for a quiet machine, run; again (``--retries``) while other
    processes took more than ``--busy`` of the CPUs (the timed epochs' window, or the
    whole process for a first fit). Keeps the quietest try (the others' shares in
    ``tries_others_cpu``). ``cold_in``: each try gets a new, empty cache folder there."""
    from bench_driver import wait_quiet

    tries = []
    for _ in range(1 + cfg["retries"]):
        busy = wait_quiet(cfg["max_wait"])[0] if cfg["max_wait"] > 0 else None
        load = load_average()
        folder = tempfile.mkdtemp(prefix="cold_", dir=cold_in) if cold_in else None
        penv = dict(env, **{CACHE_ENV: folder}) if folder else env
        res = run_child("worker", task, penv, cfg["timeout"])
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        res["busy_before"], res["load_before"] = busy, load
        tries.append(res)
        if "error" in res or others(res) <= cfg["busy"]:
            break
    best = min(tries, key=lambda r: ("error" in r, others(r)))
    best = dict(best, attempts=len(tries))
    if len(tries) > 1:
        best["tries_others_cpu"] = [others(r) for r in tries]
    return best


def others(res: dict) -> float:
    """The share of the CPUs other processes used during a measurement (0 if unknown)."""
    values = [res.get("others_cpu"), res.get("others_cpu_process")]
    return max([v for v in values if v is not None], default=0.0)


def versions() -> dict:
    import importlib.metadata as md

    out = {}
    for dist in DISTRIBUTIONS:
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    return out


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def median_of(runs: list[dict], key: str):
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(runs: list[dict]) -> dict:
    good = [r for r in runs if "error" not in r]
    entry = {"runs": runs}
    if not good:
        entry["error"] = runs[-1]["error"] if runs else "not run"
        return entry
    for key in (
        "first_model_s",
        "import_s",
        "data_s",
        "first_fit_s",
        "epoch_s",
        "in_fit_epoch_s",
        "fit_1_epoch_s",
        "fit_3_epochs_s",
        "rss_after_imports_mb",
        "rss_after_data_mb",
        "peak_rss_mb",
        "others_cpu",
        "others_cpu_process",
        "attempts",
        "process_s",
    ):
        value = median_of(good, key)
        if value is not None:
            entry[key] = value
            values = [r[key] for r in good if r.get(key) is not None]
            entry[key + "_range"] = [min(values), max(values)]
    if entry.get("peak_rss_mb") is not None:
        entry["peak_over_data_mb"] = entry["peak_rss_mb"] - entry["rss_after_data_mb"]
    entry["backend_"] = good[-1].get("backend_")
    entry["modules_after_first_fit"] = good[-1].get("modules_after_first_fit")
    return entry


def ratio(a, b):
    return a / b if a is not None and b else None


def analyse(cells: dict) -> tuple[dict, list[dict]]:
    """Ratios to PyTorch, frozen over full, and issue 41's goals (met / not met)."""
    ratios, targets = {}, []
    for name, by_fw in cells.items():
        torch_cell = by_fw["torch"]
        ratios[name] = {}
        for fw in OURS:
            cell = by_fw[fw]
            ratios[name][fw] = {
                "epoch_over_torch": ratio(cell.get("epoch_s"), torch_cell.get("epoch_s")),
                "first_model_over_torch": ratio(
                    cell.get("first_model_s"), torch_cell.get("first_model_s")
                ),
                "first_model_cold_cache_over_torch": ratio(
                    cell.get("cold_cache", {}).get("first_model_s"),
                    torch_cell.get("first_model_s"),
                ),
            }
    for fw in FRAMEWORKS:
        full = cells["cnn"][fw].get("epoch_s")
        frozen = cells["cnn_frozen"][fw].get("epoch_s")
        ratios["cnn_frozen"].setdefault(fw, {})["frozen_over_full"] = ratio(frozen, full)

    def add(target, backend, measured, limit):
        targets.append(
            {
                "issue": 41,
                "target": target,
                "backend": backend,
                "measured": measured,
                "limit": limit,
                "met": None if measured is None else measured <= limit,
            }
        )

    for name in ("text", "cnn"):
        values = {fw: ratios[name][fw]["epoch_over_torch"] for fw in OURS}
        for fw in OURS:
            add(f"{name}: epoch / PyTorch's", fw, values[fw], GOALS[name])
        known = [v for v in values.values() if v is not None]
        add(f"{name}: epoch / PyTorch's", "faster", min(known) if known else None, GOALS[name])
    for fw in FRAMEWORKS:
        add(
            "CNN frozen convolutions: epoch / full CNN's epoch",
            fw,
            ratios["cnn_frozen"][fw]["frozen_over_full"],
            GOALS["frozen_over_full"],
        )
    return ratios, targets


def run(cfg: dict) -> dict:
    from bench_driver import snapshot_library, uptime, worker_env

    t_start = time.perf_counter()
    snapshot = None if cfg["no_snapshot"] else snapshot_library()
    env = worker_env(snapshot)
    if snapshot:
        subprocess.run([sys.executable, "-m", "compileall", "-q", snapshot], env=env, check=False)
    tmp = tempfile.mkdtemp(prefix="onnx_templates_")
    try:
        models = run_child("export_models", tmp, env, 600)
        if "error" in models:
            raise RuntimeError(f"export failed: {models['error']}")
        models = {kind: models[kind] for kind in ("text", "cnn")}
        cache = os.path.join(tmp, "cache")
        os.makedirs(cache)
        env_disk = dict(env, **{CACHE_ENV: cache})
        tasks = {}
        for name, spec in WORKLOADS.items():
            rows = spec["quick_rows"] if cfg["quick"] else spec["rows"]
            for fw in FRAMEWORKS:
                tasks[(name, fw)] = {
                    "workload": name,
                    "framework": fw,
                    "rows": rows,
                    "model_path": models[spec["module"]]["path"],
                    "mode": "full",
                }
        print(f"load: {uptime()}")
        for (name, fw), task in tasks.items():  # the artifacts on disk, not recorded
            if fw in OURS:
                res = run_child("worker", dict(task, mode="first"), env_disk, cfg["timeout"])
                state = res.get("error", "")[-300:] or f"{res['first_model_s']:.2f} s"
                print(f"  cache filled by {name} {fw}: {state}")
        raw: dict = {}
        order = list(FRAMEWORKS)
        for r in range(cfg["repeats"]):
            for name in WORKLOADS:
                # ours and torch taking turns; the order turns with the rounds
                seq = order[r % 3 :] + order[: r % 3]
                seq = [f for f in seq if f != "torch"]
                seq = [seq[0], "torch", *seq[1:]]
                for fw in seq:
                    res = measure(tasks[(name, fw)], env_disk, cfg)
                    raw.setdefault((name, fw, "disk"), []).append(res)
                    report(r, name, fw, "", res)
                if cfg["cold_cache"]:
                    for fw in OURS:
                        task = dict(tasks[(name, fw)], mode="first")
                        res = measure(task, env, cfg, cold_in=tmp)
                        raw.setdefault((name, fw, "cold"), []).append(res)
                        report(r, name, fw, " (cold cache)", res)
        profiles = {}
        for name in ("cnn", "cnn_frozen", "text"):
            for fw in FRAMEWORKS:
                task = {
                    "workload": name,
                    "framework": fw,
                    "batches": cfg["profile_batches"],
                    "model_path": models[WORKLOADS[name]["module"]]["path"],
                }
                res = run_child("profile_worker", task, env_disk, cfg["timeout"])
                profiles.setdefault(name, {})[fw] = res
                print(f"  profile {name} {fw}: {str(res)[:200]}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if snapshot:
            shutil.rmtree(snapshot, ignore_errors=True)
    cells = {}
    for name in WORKLOADS:
        cells[name] = {}
        for fw in FRAMEWORKS:
            cell = summarise(raw.get((name, fw, "disk"), []))
            if (name, fw, "cold") in raw:
                cold = summarise(raw[(name, fw, "cold")])
                cold.pop("runs")
                cell["cold_cache"] = cold
                cell["cold_cache_runs"] = raw[(name, fw, "cold")]
            cells[name][fw] = cell
    ratios, targets = analyse(cells)
    for name in models:
        models[name].pop("path", None)
    return {
        "meta": {
            "date": datetime.date.today().isoformat(),
            **git_state("onnxgrad_sklearn", *(f"benchmarks/{m}.py" for m in SOURCES)),
            "python": sys.version.split()[0],
            "versions": versions(),
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "threads": THREADS,
            "repeats": cfg["repeats"],
            "quick": cfg["quick"],
            "rows": {n: t["rows"] for (n, fw), t in tasks.items() if fw == "torch"},
            "timed_epochs": TIMED_EPOCHS,
            "uptime_start": cfg["uptime_start"],
            "uptime_end": uptime(),
            "wall_s": time.perf_counter() - t_start,
            "goals": GOALS,
        },
        "models": models,
        "sizes": {name: model_sizes(models, name) for name in WORKLOADS},
        "cells": cells,
        "ratios": ratios,
        "targets": targets,
        "profiles": profiles,
    }


def report(r: int, name: str, fw: str, tag: str, res: dict) -> None:
    head = f"  round {r + 1} {name:10s} {fw + tag:21s}"
    if "error" in res:
        print(f"{head} FAILED: {res['error'][-600:]}")
        return
    line = (
        f"{head} first model {res['first_model_s']:6.2f} s (imports {res['import_s']:.2f}, "
        f"fit {res['first_fit_s']:.2f})"
    )
    if res.get("epoch_s") is not None:
        line += f", epoch {res['epoch_s']:.3f} s, peak RSS {res['peak_rss_mb']:.0f} MB"
    line += f", others' CPU {others(res):.0%}"
    if res.get("attempts", 1) > 1:
        line += f" (try {res['attempts']}: {res['tries_others_cpu']})"
    print(line, flush=True)


def markdown(doc: dict) -> str:
    meta, cells, ratios, sizes = doc["meta"], doc["cells"], doc["ratios"], doc["sizes"]
    lines = [
        f"ONNX templates (PyTorch exports), {meta['date']}, commit {meta['commit']}"
        + (" with uncommitted changes" if meta["uncommitted_changes"] else "")
        + f"; {meta['threads']} threads, medians of {meta['repeats']} processes"
        + (" (quick)" if meta["quick"] else ""),
        "",
        "| workload | | epoch (s) | epoch / PyTorch | first model, cache on disk (s) "
        "| / PyTorch | first model, cold cache (s) | / PyTorch | peak RSS (MB) "
        "| peak - RSS after data (MB) | weights + grads + Adam (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, spec in WORKLOADS.items():
        for i, fw in enumerate(FRAMEWORKS):
            cell = cells[name][fw]
            title = spec["title"] if i == 0 else ""
            if "error" in cell:
                lines.append(f"| {title} | {TITLES[fw]} | {cell['error'][:160]} |" + " |" * 8)
                continue
            r = ratios[name].get(fw, {})
            cold = cell.get("cold_cache", {})
            lines.append(
                f"| {title} | {TITLES[fw]} | {fmt(cell.get('epoch_s'))} "
                f"| {fmt(r.get('epoch_over_torch'), '.2f')} "
                f"| {fmt(cell.get('first_model_s'), '.2f')} "
                f"| {fmt(r.get('first_model_over_torch'), '.2f')} "
                f"| {fmt(cold.get('first_model_s'), '.2f')} "
                f"| {fmt(r.get('first_model_cold_cache_over_torch'), '.2f')} "
                f"| {fmt(cell.get('peak_rss_mb'), '.0f')} "
                f"| {fmt(cell.get('peak_over_data_mb'), '.0f')} "
                f"| {fmt(sizes[name]['weights_grads_adam_mb'], '.2f') if i == 0 else ''} |"
            )
    lines += [
        "",
        "| CNN, frozen convolutions: epoch / full CNN's epoch | "
        + " | ".join(TITLES[f] for f in FRAMEWORKS)
        + " |",
        "|---|---|---|---|",
        "| ratio | "
        + " | ".join(
            fmt(ratios["cnn_frozen"][f].get("frozen_over_full"), ".2f") for f in FRAMEWORKS
        )
        + " |",
        "",
        "| target (issue 41) | backend | measured | limit | |",
        "|---|---|---|---|---|",
    ]
    for t in doc["targets"]:
        met = {True: "met", False: "not met", None: "-"}[t["met"]]
        lines.append(
            f"| {t['target']} | {t['backend']} | {fmt(t['measured'], '.2f')}x "
            f"| <= {t['limit']}x | {met} |"
        )
    lines += [
        "",
        "Microseconds per batch: the timed epochs' (epoch / batches), then the kernels' under "
        "the profiler (onnxruntime's for ours, torch.profiler's self CPU time for PyTorch), "
        "by operator (the sum over the batches profiled, per batch; ours: every session of "
        "a fit of 2 s or more):",
        "",
    ]
    for name, by_fw in doc["profiles"].items():
        n_batches = -(-meta["rows"][name] // WORKLOADS[name]["batch"])
        for fw, prof in by_fw.items():
            epoch = cells[name][fw].get("epoch_s")
            per_batch = epoch / n_batches * 1e6 if epoch else None
            head = f"- {name}, {TITLES[fw]}: {fmt(per_batch, '.0f')} us"
            if "error" in prof:
                lines.append(f"{head}; the profile failed: {prof['error'][-300:]}")
                continue
            ops = ", ".join(f"{o['op']} {o['us']:.0f}" for o in prof["top_ops_us_per_batch"][:8])
            lines.append(
                f"{head}; kernels {prof['kernel_us_per_batch']:.0f} us "
                f"({prof['batches']} batches): {ops}"
            )
    lines += [
        "",
        f"Load: {meta['uptime_start']} at the start, {meta['uptime_end']} at the end; "
        f"{meta['wall_s']:.0f} s in all.",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="processes per cell (3)")
    parser.add_argument("--quick", action="store_true", help="small data, 1 repeat")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="output folder")
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds to wait for a quiet machine before each process (20; quick: 0)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=None,
        help="measure again, at most this many times, while other processes were busy (2)",
    )
    parser.add_argument(
        "--busy",
        type=float,
        default=0.1,
        help="share of the CPUs used by other processes above which a measurement is redone",
    )
    parser.add_argument("--no-cold-cache", action="store_true", help="skip the empty-cache runs")
    parser.add_argument("--profile-batches", type=int, default=None, help="CNN batches (40)")
    parser.add_argument(
        "--no-snapshot", action="store_true", help="import the package's files, not a copy"
    )
    args = parser.parse_args(argv)
    from bench_driver import uptime

    cfg = {
        "quick": args.quick,
        "repeats": args.repeats or (1 if args.quick else 3),
        "max_wait": args.max_wait if args.max_wait is not None else (0.0 if args.quick else 20.0),
        "cold_cache": not args.no_cold_cache,
        "profile_batches": args.profile_batches or (10 if args.quick else 40),
        "no_snapshot": args.no_snapshot,
        "retries": args.retries if args.retries is not None else (0 if args.quick else 2),
        "busy": args.busy,
        "timeout": 300 if args.quick else 600,
        "uptime_start": uptime(),
    }
    doc = run(cfg)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "onnx_templates.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print()
    print(markdown(doc))
    print(f"\nwrote {path}")
    failed = [
        f"{name}/{fw}"
        for name, by_fw in doc["cells"].items()
        for fw, cell in by_fw.items()
        if "error" in cell
    ]
    if failed:
        print("failed measurements: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
