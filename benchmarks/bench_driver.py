"""The benchmark's driver: the plan of a run, one process per measurement, retries.

Every measurement runs in a new process (``bench.py --worker JSON``), the
frameworks taking turns; the workers import a copy of the package made at the
start (PYTHONPATH), so that one run measures one state of its sources. Before each
worker the driver waits (at most ``max_wait`` s) for the machine to be quiet and
records the load average; a worker whose measurements saw other processes take
more than ``retry_above`` of the CPUs is run again (``attempts`` in all).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from importlib import metadata

from bench_common import HERE, RESULT_MARK, THREADS, cpu_ticks, fmt, load_average
from bench_workloads import FITS, FLOOR, FRAMEWORKS, ORT_BACKENDS, WORKLOADS, frameworks_for

SCRIPT = os.path.join(HERE, "bench.py")


def plan(quick: bool) -> dict:
    """Sizes of the run: rounds (processes per cell), repeats per process, extras."""
    if quick:
        return {
            "quick": True,
            "rounds": 1,
            "repeats": 3,
            "epochs": 2,
            "growth_epochs": 6,
            "growth_marks": [2, 6],
            "startup_repeats": 1,
            "profile": False,
            "fit_rounds": 1,
            "fit_repeats": 1,
            "import_repeats": 1,
            "max_wait": 0.0,
            "attempts": 1,
            "retry_above": 1.0,
            "memory_hidden": [32, 64],
            "memory_rows": 1_000,
            "threads": [2, 1],
            "timeout": 300,
        }
    return {
        "quick": False,
        "rounds": 3,
        "repeats": 1,
        "epochs": 3,
        "growth_epochs": 50,
        "growth_marks": [5, 50],
        "startup_repeats": 10,
        "profile": True,
        "fit_rounds": 3,
        "fit_repeats": 2,
        "import_repeats": 3,
        "max_wait": 5.0,
        "attempts": 1,
        "retry_above": 0.5,
        "memory_hidden": [256, 1024, 2048],
        "memory_rows": 4_096,
        "threads": [2, 1],
        "timeout": 1800,
    }


def extras_for(name: str, framework: str, cfg: dict) -> list[str]:
    """The extra measurements (besides the epoch timings) made for a workload."""
    if framework in ("sklearn", FLOOR):
        return []
    if framework == "torch":
        return ["phases"]
    extras = ["startup"]
    if name == "mlp_reg_b256":
        extras.append("rss_growth")
    if cfg["profile"] and WORKLOADS[name]["kind"] == "mlp_reg":
        extras.append("profile")
    return extras


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------


def snapshot_library() -> str | None:
    """Copy the package's sources to a temporary folder; return the folder (None if not found).

    Workers import the copy (first on PYTHONPATH), so that every worker of a run
    measures the same state of the library even if its files change meanwhile.
    """
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
    while True:
        share = busy_share(0.5)
        waited = time.perf_counter() - t0
        if share is None or share < threshold or waited >= max_wait:
            return share, waited


def run_process(cmd: list[str], env: dict, timeout: float) -> tuple[dict, float]:
    """Run ``cmd``; return its ``RESULT_MARK`` JSON answer (or an ``error``) and the wall time."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}, timeout
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :]), wall
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": f"worker exited with {proc.returncode}: {tail}"}, wall


def launch(task: dict, cfg: dict) -> dict:
    """Run one worker process and return its JSON answer (or an ``error`` entry).

    Before it, wait (at most ``max_wait`` s) for the machine to be quiet; after it,
    record the share of CPU time other processes took while it ran.
    """
    max_wait = cfg["max_wait"]
    before, waited = wait_quiet(max_wait) if max_wait > 0 else (None, 0.0)
    load = load_average()
    ticks0 = cpu_ticks()
    cmd = [sys.executable, SCRIPT, "--worker", json.dumps(task)]
    res, wall = run_process(cmd, cfg["env"], cfg["timeout"])
    ticks1 = cpu_ticks()
    if "cpu_s" not in res:
        return res
    res.update(process_wall_s=wall, busy_share_before=before, waited_s=waited, load_before=load)
    if ticks0 and ticks1 and ticks1[1] > ticks0[1]:
        others = (ticks1[0] - ticks0[0]) - res["cpu_s"] * os.sysconf("SC_CLK_TCK")
        res["others_cpu_share"] = max(0.0, others / (ticks1[1] - ticks0[1]))
    return res


def contention(res: dict, timing: bool = True, extras: bool = True) -> float | None:
    """Largest share of the CPUs other processes took during one of a worker's measurements."""
    shares = list(res.get("samples_others_share", [])) if timing else []
    if extras:
        shares += list(res.get("extras_others_share", {}).values())
    shares = [v for v in shares if v is not None]
    return max(shares) if shares else None


def run_worker(task: dict, cfg: dict, label: str) -> dict:
    """Launch a worker; measure again (up to ``cfg["attempts"]`` times) if others took the CPUs.

    Returns the answer's ``results`` (``{name: result}``), each result with the
    process's figures; a skipped or failed worker gives ``{"skipped"|"error": ...}``.
    """
    discarded = []
    while True:
        answer = launch(task, cfg)
        results = answer.get("results")
        if results is None:
            return {"_failed": answer}
        rows = results.values() if task["kind"] in ("epochs", "fits") else [results]
        worst = max((contention(r) or r.get("others_share") or 0.0 for r in rows), default=0.0)
        if worst <= cfg["retry_above"] or len(discarded) + 1 >= cfg["attempts"]:
            break
        discarded.append(worst)
        print(f"  {label}: others took {worst:.0%} of the CPUs, measuring again")
    for res in rows:
        for key in ("process_wall_s", "others_cpu_share", "busy_share_before", "load_before"):
            res["process_" + key.removeprefix("process_")] = answer.get(key)
        if answer.get("library"):
            res["library"] = answer["library"]
        res["discarded_attempts_others_share"] = discarded
    return results


# ---------------------------------------------------------------------------
# the parts of a run
# ---------------------------------------------------------------------------


def available_frameworks() -> list[str]:
    """The columns this environment can run (torch skipped where it is not importable)."""
    have_torch = importlib.util.find_spec("torch") is not None
    if not have_torch:
        print("torch is not importable: the PyTorch column is skipped.")
    return [f for f in FRAMEWORKS if f != "torch" or have_torch]


def epoch_columns(frameworks) -> list[str]:
    """The columns of the epoch workloads: the frameworks, then the NumPy floor."""
    return [*frameworks, FLOOR]


def run_epoch_workloads(frameworks, cfg: dict) -> tuple[dict, dict]:
    """One process per column and round, doing every epoch workload; extras in round 1.

    The columns are the frameworks and the floor (:func:`epoch_columns`), taking turns.
    """
    cells = defaultdict(list)
    extras_cells = {}
    rows = "quick_rows" if cfg["quick"] else "rows"
    settings = {k: cfg[k] for k in ("epochs", "growth_epochs", "growth_marks", "startup_repeats")}
    for r in range(cfg["rounds"]):
        for fw in epoch_columns(frameworks):
            jobs = [
                {
                    "workload": name,
                    "rows": WORKLOADS[name][rows],
                    "extras": extras_for(name, fw, cfg) if r == 0 else [],
                }
                for name in WORKLOADS
            ]
            task = {
                "kind": "epochs",
                "framework": fw,
                "jobs": jobs,
                "repeats": cfg["repeats"],
                "threads": cfg["threads"],
                **settings,
            }
            results = run_worker(task, cfg, f"epochs {fw} round {r + 1}")
            for name in WORKLOADS:
                res = results.get(name, results.get("_failed", {}))
                report_line(f"round {r + 1}/{cfg['rounds']}", name, fw, res)
                cells[(name, fw)].append(res)
                if r == 0:
                    extras_cells[(name, fw)] = res
    return cells, extras_cells


def run_fit_workloads(frameworks, cfg: dict) -> dict:
    """Whole fits of the small-data workloads: one process per framework and round."""
    cells = defaultdict(list)
    for r in range(cfg["fit_rounds"]):
        for fw in frameworks:
            names = [n for n, spec in FITS.items() if fw in frameworks_for(spec)]
            task = {
                "kind": "fits",
                "framework": fw,
                "fits": names,
                "repeats": cfg["fit_repeats"],
                "threads": cfg["threads"],
                "quick": cfg["quick"],
            }
            results = run_worker(task, cfg, f"fits {fw} round {r + 1}")
            for name in names:
                res = results.get(name, results.get("_failed", {}))
                report_line(f"fits {r + 1}/{cfg['fit_rounds']}", name, fw, res, per="s/fit")
                cells[(name, fw)].append(res)
    return cells


def run_daily_use(frameworks, cfg: dict) -> dict:
    """Daily-use rows: predict latency, GridSearchCV(n_jobs=2), import and first fit."""
    out = {"predict": {}, "grid": {}}
    for fw in ("ort", "sklearn"):
        task = {"kind": "predict", "framework": fw, "quick": cfg["quick"]}
        res = run_worker(task, cfg, f"predict {fw}")
        out["predict"][fw] = res.get("_failed", res)
    for fw in (*ORT_BACKENDS, "sklearn"):
        task = {"kind": "grid", "framework": fw, "quick": cfg["quick"]}
        res = run_worker(task, cfg, f"grid {fw}")
        out["grid"][fw] = res.get("_failed", res)
        print(
            f"  GridSearchCV(n_jobs=2) {fw:8s} {fmt(res.get('first_s'))} s first call, "
            f"{fmt(res.get('second_s'))} s second"
        )
    out["import"] = import_times(cfg)
    return out


IMPORT_CODE = r"""
import json, sys, time
if {hide_torch}:
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError("No module named 'torch' (hidden by the benchmark)")
    sys.meta_path.insert(0, _NoTorch())
t0 = time.perf_counter()
import {module}
out = {{"import_s": time.perf_counter() - t0, "torch_after_import": "torch" in sys.modules}}
if {backend!r}:
    import warnings
    warnings.simplefilter("ignore")
    sys.path.insert(0, {here!r})
    from bench_workloads import FITS, make_data, ort_estimator
    spec = FITS["fit_diabetes_nesterov"]
    X, y = make_data(spec)
    for key in ("first_fit_s", "second_fit_s"):
        est = ort_estimator(spec, {backend!r}, 10, warm_start=False)
        t0 = time.perf_counter()
        est.fit(X, y)
        out[key] = time.perf_counter() - t0
    out["torch_after_fit"] = "torch" in sys.modules
with open("/proc/self/status") as f:
    out["peak_rss_mb"] = next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
print({mark!r} + json.dumps(out))
"""

IMPORT_VARIANTS = {
    "sklearn.neural_network": ("sklearn.neural_network", "", False),
    "onnxgrad_sklearn, standard": ("onnxgrad_sklearn", "standard", False),
    "onnxgrad_sklearn, agent": ("onnxgrad_sklearn", "agent", False),
    "onnxgrad_sklearn, standard, torch hidden": ("onnxgrad_sklearn", "standard", True),
    "onnxgrad_sklearn, agent, torch hidden": ("onnxgrad_sklearn", "agent", True),
}


def import_times(cfg: dict) -> dict:
    """Wall time of the import in a new process, and of the first and second fit after it.

    "torch hidden": a meta-path finder makes ``import torch`` fail, as where torch
    is not installed (onnxruntime-training's own ``__init__`` imports it when it can).
    """
    out = {name: [] for name in IMPORT_VARIANTS}
    for _ in range(cfg["import_repeats"]):
        for name, (module, backend, hide) in IMPORT_VARIANTS.items():
            code = IMPORT_CODE.format(
                hide_torch=hide, module=module, backend=backend, here=HERE, mark=RESULT_MARK
            )
            if cfg["max_wait"] > 0:
                wait_quiet(cfg["max_wait"])
            load = load_average()
            res, wall = run_process([sys.executable, "-c", code], cfg["env"], cfg["timeout"])
            res["load_before"] = load
            out[name].append(res)
    summary = {}
    for name, runs in out.items():
        good = [r for r in runs if "import_s" in r]
        entry = {"runs": runs}
        for key in ("import_s", "first_fit_s", "second_fit_s", "peak_rss_mb"):
            values = [r[key] for r in good if key in r]
            if values:
                entry[key] = sorted(values)[len(values) // 2]
                entry[key + "_range"] = [min(values), max(values)]
        summary[name] = entry
        print(
            f"  import {name:42s} {fmt(entry.get('import_s'))} s, first fit "
            f"{fmt(entry.get('first_fit_s'))} s, second {fmt(entry.get('second_fit_s'))} s"
        )
    return summary


def memory_scaling(frameworks, cfg: dict) -> dict:
    """Peak RSS of ``mlp_reg_b256`` with larger hidden layers, one process per size and framework.

    The slope between the two largest models, in MB of peak RSS per MB of weights +
    gradients + optimizer state, is what the memory target applies to; the rest is
    the fixed overhead of the runtime.
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
            task = {
                "kind": "epochs",
                "framework": fw,
                "jobs": [job],
                "repeats": 1,
                "epochs": 2,
                "growth_epochs": 2,
                "growth_marks": [1, 2],
            }
            res = run_worker(task, cfg, f"memory {fw} {hidden}").get("mlp_reg_b256", {})
            if "peak_rss_mb" not in res:
                print(f"  memory {fw:8s} hidden {hidden:5d}: failed {res}")
                continue
            above = res["peak_rss_mb"] - res["rss_after_data_mb"]
            point = {
                "hidden": [hidden, hidden],
                "n_params": res["model_memory"]["n_params"],
                "weights_grads_state_mb": res["model_memory"]["weights_grads_state_mb"],
                "peak_above_data_mb": above,
                "rss_after_import_mb": res["rss_after_import_mb"],
            }
            print(f"  memory {fw:8s} hidden {hidden:5d}: peak {above:7.1f} MB above imports + data")
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


def report_line(stage: str, name: str, fw: str, res: dict, per: str = "s/epoch") -> None:
    """Print the progress line of one worker's result."""
    if "skipped" in res:
        print(f"  {name:24s} {fw:8s} skipped: {res['skipped']}")
    elif "error" in res:
        print(f"  {name:24s} {fw:8s} FAILED: {res['error'][-600:]}")
    elif res.get("samples"):
        value = sorted(res["samples"])[len(res["samples"]) // 2]
        print(
            f"  {stage:11s} {name:24s} {fw:8s} {value:8.4f} {per:8s}"
            f" peak RSS {res.get('peak_rss_mb', 0):7.1f} MB"
            f"  others' CPU {fmt(contention(res), '.0%')}"
        )


# ---------------------------------------------------------------------------
# the machine
# ---------------------------------------------------------------------------


def versions() -> dict:
    """Versions of the packages involved, read from their metadata."""
    out = {"python": platform.python_version()}
    names = {
        "onnxruntime": ("onnxruntime-training-cpu", "onnxruntime-training", "onnxruntime"),
        "onnx-ad": ("onnx-ad",),
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


def uptime() -> str | None:
    """The output of ``uptime`` (the load of the machine), None where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
