"""Cold start and warm fits: the time to the first trained model, the second fit, GridSearchCV.

Run from the repository root::

    python benchmarks/cold_start.py                    # this interpreter, medians of 3
    python benchmarks/cold_start.py --python A --python B   # several interpreters, side by side
    python benchmarks/cold_start.py --repeats 5 --grid-repeats 1
    python benchmarks/cold_start.py --quick            # checks that it runs (under a minute)
    python benchmarks/cold_start.py --out DIR          # where cold_start.json goes

Every measurement runs in a new process (``python -c``), whose clock starts at its
first line, before any import (numpy included), with 2 threads (``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, as the rest of the benchmark). For
each interpreter, the frameworks taking turns:

* first model: import the framework, ``load_diabetes``, build the estimator and fit
  it, on diabetes with every default (``MLPRegressor()``,
  ``OrtGradientRegressor(MLPRegressor(), backend=...)`` for each backend, an
  equivalent PyTorch loop) and on the benchmark's ``fit_diabetes_nesterov`` workload
  (MLP (64,), Nesterov, batch 32, 100 epochs); then, in the same process, a second
  fit of a new estimator on the same data, and which heavy modules the first fit
  imported;
* ``GridSearchCV(Pipeline([StandardScaler(), MLP (32,)]))``, 3 learning rates x 2
  alphas, cv=5, 100 epochs, ``n_jobs=1`` and ``n_jobs=2`` (each loky worker a fresh
  process): the whole process, from its start to its exit (the driver's clock).

The agent's rows are skipped where onnxruntime-training is missing, PyTorch's where
torch does not import. The package's sources are copied at the start and compiled
for each interpreter (as :mod:`bench_driver` does), so that every process of a run
imports the same state of the library from bytecode already written.

The package's on-disk cache of training artifacts (the folder named by
``onnxgrad_sklearn.artifacts.CACHE_ENV``, or ``--cache-env NAME``): its rows are
measured with the artifact on disk (a temporary folder that a first, unrecorded
process per interpreter fills by running every fit of the package's rows) and, for
the first model on diabetes defaults, with an empty cache (a new folder per process).
The user's own cache folder is never used. ``--cache-env ''`` turns the disk cache
off; where it is off or the package has none, one measurement stands for both.

``--quick``: 1 repeat, a grid of 2 candidates (cv=2, 5 epochs), ``MLPRegressor`` and
the standard backend only, no ``-X importtime`` process: it checks that the script
runs.

Output: ``DIR/cold_start.json`` and, printed, a Markdown table per interpreter
(absolute seconds, ratios to ``MLPRegressor``, the targets of issue 30: met / not met).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_common import HERE, RESULT_MARK, THREADS, fmt, git_state, load_average  # noqa: E402
from bench_driver import (  # noqa: E402
    snapshot_library,
    uptime,
    wait_quiet,
    worker_env,
)

ROOT = os.path.dirname(HERE)
#: The working folder of the measured processes (see :func:`run_child`).
RUN_DIR = tempfile.gettempdir()
#: Columns: scikit-learn, this package with each backend, PyTorch.
FRAMEWORKS = ("sklearn", "agent", "standard", "torch")
OURS = ("agent", "standard")
#: What the parts measure: the first model and second fit of two workloads, two grids.
PARTS = ("defaults", "nesterov", "grid_1", "grid_2")
#: Modules whose presence after the first fit is recorded.
HEAVY_MODULES = ("torch", "onnxruntime", "onnxruntime.training", "onnx", "skl2onnx", "onnx_ad")
#: Issue 30's figures before the work on the cold start (fresh processes, medians of 3,
#: 2 threads, Python 3.11, training build, torch installed): ours / MLPRegressor.
BEFORE = {
    "defaults_first_model_ratio": 13.4,
    "defaults_first_model_s": 4.18,
    "defaults_first_model_sklearn_s": 0.31,
    "nesterov_first_model_ratio": 11.0,
    "nesterov_second_fit_ratio": 1.15,
    "python313_first_model_ratio": 2.5,
    "grid_1_ratio": 2.71,
    "grid_2_ratio": 2.55,
}
DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-training-cpu",
    "onnxruntime-training",
    "torch",
    "scikit-learn",
    "numpy",
    "onnx",
    "skl2onnx",
    "onnx-ad",
)

# ---------------------------------------------------------------------------
# the child processes
# ---------------------------------------------------------------------------

#: A measurement process. Its clock starts at the first line; ``fit(make())`` is the
#: first fit, a second one follows in the same process when ``second`` is true.
CHILD = """\
import time
_T0 = time.perf_counter()
import sys
{setup}
{imports}
_T1 = time.perf_counter()
{data}
_T2 = time.perf_counter()
_first = fit(make())
_T3 = time.perf_counter()
_modules = {{m: m in sys.modules for m in {heavy!r}}}
_second = None
if {second}:
    _t = time.perf_counter()
    _second = fit(make())
    _second_s = time.perf_counter() - _t
import importlib.util
import json
out = {{
    "first_model_s": _T3 - _T0,
    "import_s": _T1 - _T0,
    "data_s": _T2 - _T1,
    "first_fit_s": _T3 - _T2,
    "modules_after_first_fit": _modules,
    "first": _first,
    "torch_installed": importlib.util.find_spec("torch") is not None,
    "package_file": getattr(sys.modules.get("onnxgrad_sklearn"), "__file__", None),
}}
if {second}:
    out.update(second_fit_s=_second_s, second=_second)
print({mark!r} + json.dumps(out))
"""

DIABETES = "from sklearn.datasets import load_diabetes\nX, y = load_diabetes(return_X_y=True)\n"
TORCH_DIABETES = (
    DIABETES
    + "Xt = torch.from_numpy(X.astype(np.float32))\n"
    + "yt = torch.from_numpy(y.astype(np.float32).reshape(-1, 1))\n"
)
WORKLOAD_DATA = "X, y = make_data(SPEC)\n"

SKLEARN_IMPORT = "from sklearn.neural_network import MLPRegressor\n"
OURS_IMPORT = SKLEARN_IMPORT + "from onnxgrad_sklearn import OrtGradientRegressor\n"
TORCH_IMPORT = "import numpy as np\nimport torch\ntorch.set_num_threads({threads})\n"
WORKLOAD_IMPORT = (
    "from bench_workloads import FITS, make_data, ort_estimator, sklearn_estimator, "
    "torch_trainer\nSPEC = FITS['fit_diabetes_nesterov']\n"
)

FIT_ESTIMATOR = """
def fit(est):
    est.fit(X, y)
    return {"n_iter": int(est.n_iter_), "backend_": getattr(est, "backend_", None)}
"""

# MLPRegressor() with every default: 10-100-1 relu, Adam lr 1e-3, batch min(200, n),
# shuffled epochs, squared error / 2, 200 epochs (no L2 penalty; alpha=1e-4 there).
TORCH_DEFAULTS = """
def make():
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 100), torch.nn.ReLU(), torch.nn.Linear(100, 1)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def fit(pair):
    model, opt = pair
    n = Xt.shape[0]
    for _ in range(200):
        perm = torch.randperm(n)
        for start in range(0, n, 200):
            idx = perm[start : start + 200]
            opt.zero_grad(set_to_none=True)
            loss = 0.5 * torch.mean((model(Xt[idx]) - yt[idx]) ** 2)
            loss.backward()
            opt.step()
            loss.item()
    return {"n_iter": 200}
"""

TORCH_WORKLOAD = """
def make():
    return torch_trainer(SPEC, X, y)


def fit(epoch):
    for _ in range(SPEC["epochs"]):
        epoch()
    return {"n_iter": SPEC["epochs"]}
"""

GRID_IMPORT = (
    "from sklearn.model_selection import GridSearchCV\n"
    "from sklearn.pipeline import Pipeline\n"
    "from sklearn.preprocessing import StandardScaler\n"
)
GRID_FIT = """
def make():
    pipe = Pipeline([("scale", StandardScaler()), ("mlp", {estimator})])
    return GridSearchCV(pipe, {grid!r}, cv={cv}, n_jobs={n_jobs})


def fit(search):
    search.fit(X, y)
    return {{"best_score": float(search.best_score_), "best_params": search.best_params_}}
"""


def grid_settings(quick: bool) -> dict:
    """The grid: 3 learning rates x 2 alphas, cv=5, 100 epochs (quick: 1 x 2, cv=2, 5 epochs)."""
    if quick:
        return {
            "grid": {"mlp__learning_rate_init": [1e-3], "mlp__alpha": [1e-4, 1e-2]},
            "cv": 2,
            "max_iter": 5,
        }
    return {
        "grid": {"mlp__learning_rate_init": [1e-3, 3e-3, 1e-2], "mlp__alpha": [1e-4, 1e-2]},
        "cv": 5,
        "max_iter": 100,
    }


def child_code(part: str, fw: str, quick: bool) -> str:
    """The code of the process measuring ``fw`` on ``part``."""
    setup, second = "", True
    if part == "defaults":
        if fw == "torch":
            imports = TORCH_IMPORT.format(threads=THREADS) + TORCH_DEFAULTS
            data = TORCH_DIABETES
        else:
            imports = SKLEARN_IMPORT if fw == "sklearn" else OURS_IMPORT
            estimator = (
                "MLPRegressor()"
                if fw == "sklearn"
                else f"OrtGradientRegressor(MLPRegressor(), backend={fw!r})"
            )
            imports += f"\ndef make():\n    return {estimator}\n" + FIT_ESTIMATOR
            data = DIABETES
    elif part == "nesterov":
        setup = f"sys.path.insert(0, {HERE!r})"
        if fw == "torch":
            imports = TORCH_IMPORT.format(threads=THREADS) + WORKLOAD_IMPORT + TORCH_WORKLOAD
        else:
            imports = (SKLEARN_IMPORT if fw == "sklearn" else OURS_IMPORT) + WORKLOAD_IMPORT
            estimator = (
                "sklearn_estimator(SPEC, SPEC['epochs'], warm_start=False)"
                if fw == "sklearn"
                else f"ort_estimator(SPEC, {fw!r}, SPEC['epochs'], warm_start=False)"
            )
            imports += f"\ndef make():\n    return {estimator}\n" + FIT_ESTIMATOR
        data = WORKLOAD_DATA
    else:
        second = False
        settings = grid_settings(quick)
        max_iter = settings["max_iter"]
        if fw == "sklearn":
            imports = GRID_IMPORT + SKLEARN_IMPORT
            estimator = f"MLPRegressor(hidden_layer_sizes=(32,), max_iter={max_iter})"
        else:
            imports = GRID_IMPORT + OURS_IMPORT
            estimator = (
                "OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(32,)), "
                f"max_iter={max_iter}, backend={fw!r})"
            )
        imports += GRID_FIT.format(
            estimator=estimator,
            grid=settings["grid"],
            cv=settings["cv"],
            n_jobs=int(part.split("_")[1]),
        )
        data = DIABETES
    return CHILD.format(
        setup=setup,
        imports=imports,
        data=data,
        heavy=HEAVY_MODULES,
        second=second,
        mark=RESULT_MARK,
    )


PROBE = """\
import importlib.metadata as md
import importlib.util
import json
import platform
import sys
import warnings

warnings.simplefilter("ignore")


def version(dist):
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


out = {{"python": platform.python_version(), "executable": sys.executable}}
out["versions"] = {{d: version(d) for d in {dists!r}}}
out["training_build"] = bool(
    version("onnxruntime-training-cpu") or version("onnxruntime-training")
)
out["torch_installed"] = importlib.util.find_spec("torch") is not None
out["agent_available"] = False
try:
    import numpy as np
    from sklearn.neural_network import MLPRegressor

    import onnxgrad_sklearn
    from onnxgrad_sklearn import OrtGradientRegressor
    from onnxgrad_sklearn.backends import agent_available

    out["package_file"] = onnxgrad_sklearn.__file__
    out["agent_available"] = agent_available()
    if importlib.util.find_spec("onnxgrad_sklearn.artifacts") is not None:
        import os

        from onnxgrad_sklearn import artifacts

        out["cache_env"] = getattr(artifacts, "CACHE_ENV", None)
        if out["cache_env"]:
            os.environ[out["cache_env"]] = ""  # this fit writes no cache
    if {fit_auto}:
        X = np.random.RandomState(0).standard_normal((40, 3))
        est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2)
        out["auto_backend"] = est.fit(X, X[:, 0]).backend_
except Exception as exc:
    out["package_error"] = f"{{type(exc).__name__}}: {{exc}}"
out["torch_imports"] = False
if out["torch_installed"]:
    try:
        import torch  # noqa: F401

        out["torch_imports"] = True
    except Exception as exc:
        out["torch_error"] = f"{{type(exc).__name__}}: {{exc}}"
print({mark!r} + json.dumps(out))
"""


def run_child(cmd: list[str], env: dict, timeout: float) -> tuple[dict, float, str]:
    """Run ``cmd``; return its ``RESULT_MARK`` answer (or an ``error``), wall time and stderr.

    The process runs in a folder of its own: ``python -c`` puts the working folder
    first on ``sys.path``, before ``PYTHONPATH``, and the repository root would hide
    the snapshot of the package.
    """
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=RUN_DIR
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}, timeout, ""
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :]), wall, proc.stderr
    tail = (proc.stderr or proc.stdout)[-2000:]
    return {"error": f"exited with {proc.returncode}: {tail}"}, wall, proc.stderr


def probe(python: str, env: dict, fit_auto: bool = True) -> dict:
    """What an interpreter has: versions, training build, torch, the backend "auto" picks.

    It also imports everything once, so that the libraries are in the OS page cache
    before the first measured process. ``fit_auto=False`` skips the fit that tells
    which backend "auto" picks.
    """
    code = PROBE.format(dists=DISTRIBUTIONS, mark=RESULT_MARK, fit_auto=fit_auto)
    res, _, _ = run_child([python, "-c", code], env, 600)
    return res


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------


def library_hash(folder: str | None) -> str | None:
    """SHA-256 prefix of the package's sources in ``folder`` (the snapshot)."""
    if not folder:
        return None
    digest = hashlib.sha256()
    base = os.path.join(folder, "onnxgrad_sklearn")
    for dirpath, _, files in sorted(os.walk(base)):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                digest.update(os.path.relpath(path, base).encode())
                with open(path, "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:12]


def interpreter_label(info: dict) -> str:
    """A short name: Python version, onnxruntime distribution, torch."""
    versions = info.get("versions", {})
    if versions.get("onnxruntime-training-cpu"):
        ort = f"onnxruntime-training-cpu {versions['onnxruntime-training-cpu']}"
    elif versions.get("onnxruntime-training"):
        ort = f"onnxruntime-training {versions['onnxruntime-training']}"
    else:
        ort = f"onnxruntime {versions.get('onnxruntime')}"
    torch = f"torch {versions['torch']}" if info.get("torch_imports") else "no torch"
    return f"Python {info.get('python')}, {ort}, {torch}"


def columns_for(info: dict, part: str, quick: bool = False) -> list[str]:
    """The frameworks measured on ``part`` in this interpreter (quick: sklearn, standard)."""
    cols = ["sklearn", "standard"]
    if quick:
        return cols
    if info.get("agent_available"):
        cols.insert(1, "agent")
    if info.get("torch_imports") and not part.startswith("grid"):
        cols.append("torch")
    return cols


def skipped_reason(info: dict, fw: str, part: str, quick: bool = False) -> str:
    """Why ``fw`` has no measurement on ``part`` here."""
    if quick:
        return "quick mode: MLPRegressor and the standard backend only"
    if fw == "agent":
        return "onnxruntime-training is not installed (or its agent does not load)"
    if fw == "torch" and part.startswith("grid"):
        return "no PyTorch grid search"
    if fw == "torch":
        return info.get("torch_error") or "torch is not installed"
    return "not measured"


def measure(python: str, code: str, env: dict, cfg: dict) -> dict:
    """Run one measurement process; return its answer with the process's wall time and load."""
    if cfg["max_wait"] > 0:
        wait_quiet(cfg["max_wait"])
    load = load_average()
    res, wall, _ = run_child([python, "-c", code], env, cfg["timeout"])
    res["process_s"] = wall
    res["load_before"] = load
    return res


def cache_states(cfg: dict, python: str, fw: str, part: str) -> list[str]:
    """The cache states a cell is measured in: "as_is", or "on_disk" and "empty"."""
    if not cfg["cache_envs"].get(python) or fw not in OURS:
        return ["as_is"]
    if part == "defaults":
        return ["on_disk", "empty"]
    return ["on_disk"]


def cache_env(env: dict, cfg: dict, state: str, python: str) -> tuple[dict, str | None]:
    """The environment of a process in a cache state, and a folder to remove after it."""
    if state == "as_is":
        off = cfg["cache_off"].get(python)
        return (dict(env, **{off: ""}) if off else env), None
    env = dict(env)
    name = cfg["cache_envs"][python]
    if state == "on_disk":
        env[name] = cfg["cache_dirs"][python]
        return env, None
    folder = tempfile.mkdtemp(prefix="cold_start_empty_")
    env[name] = folder
    return env, folder


def prime_cache(python: str, info: dict, env: dict, cfg: dict) -> None:
    """Fill the interpreter's cache folder: one unrecorded process runs every fit of ours.

    It runs the code of each measurement process of the package's rows (the grid
    with ``n_jobs=1``: its workers fit the same models).
    """
    folder = tempfile.mkdtemp(prefix="cold_start_cache_")
    cfg["cache_dirs"][python] = folder
    primed = dict(env, **{cfg["cache_envs"][python]: folder})
    codes = [
        child_code(part, fw, cfg["quick"])
        for part in ("defaults", "nesterov", "grid_1")
        for fw in columns_for(info, part, cfg["quick"])
        if fw in OURS
    ]
    code = f"for code in {codes!r}:\n    exec(code, {{'__name__': '__main__'}})\n"
    res, wall, _ = run_child([python, "-c", code], primed, 900)
    entries = len(os.listdir(folder))
    if "error" in res:
        print(f"  filling the cache failed: {res['error'][-800:]}")
    print(f"  cache filled in {wall:.1f} s: {entries} entries")


def summarise(runs: list[dict]) -> dict:
    """Medians (and ranges) of a cell's processes; what the last good one reported."""
    good = [r for r in runs if "first_model_s" in r]
    entry: dict = {"runs": runs}
    if not good:
        entry["error"] = runs[-1].get("error", "no measurement") if runs else "not run"
        return entry
    keys = ("first_model_s", "import_s", "data_s", "first_fit_s", "second_fit_s", "process_s")
    for key in keys:
        values = [r[key] for r in good if r.get(key) is not None]
        if values:
            entry[key] = statistics.median(values)
            entry[key + "_range"] = [min(values), max(values)]
    scores = [r["first"]["best_score"] for r in good if "best_score" in (r.get("first") or {})]
    if scores:
        entry["best_score"] = statistics.median(scores)
    last = good[-1]
    for key in ("modules_after_first_fit", "torch_installed", "package_file"):
        entry[key] = last.get(key)
    entry["first"] = last.get("first")
    entry["second"] = last.get("second")
    return entry


def ratio(a, b):
    """``a / b``, None where either is missing."""
    return a / b if a is not None and b else None


#: The figure of each part that the ratios and targets use.
MAIN_KEY = {"defaults": "first_model_s", "nesterov": "first_model_s"}


def part_ratios(cells: dict) -> dict:
    """``fw / sklearn`` of each quantity of a part, for every other framework."""
    base = cells.get("sklearn", {})
    out = {}
    for fw, entry in cells.items():
        if fw == "sklearn" or "error" in entry or "skipped" in entry:
            continue
        keys = ("first_model_s", "import_s", "first_fit_s", "second_fit_s", "process_s")
        out[fw] = {k: ratio(entry.get(k), base.get(k)) for k in keys}
        if "empty_cache" in entry and "error" not in entry["empty_cache"]:
            out[fw]["first_model_s_empty_cache"] = ratio(
                entry["empty_cache"].get("first_model_s"), base.get("first_model_s")
            )
    return out


def interpreter_targets(info: dict, parts: dict, ratios: dict, cached: bool) -> list[dict]:
    """Issue 30's targets that apply to this interpreter, each backend: met or not."""
    version = tuple(int(v) for v in info["python"].split(".")[:2])
    torch_build = info.get("training_build") and info.get("torch_installed")
    plain = not info.get("training_build")
    disk = "artifact on disk" if cached else "no on-disk cache: one figure for both"
    out = []

    def add(text, backend, measured, limit, note=""):
        out.append(
            {
                "issue": 30,
                "target": text,
                "backend": backend,
                "measured": measured,
                "limit": limit,
                "met": None if measured is None else measured <= limit,
                "note": note,
            }
        )

    for backend in OURS:
        if backend not in ratios.get("defaults", {}):
            continue
        r = ratios["defaults"][backend]
        if version < (3, 13) and torch_build:
            add(
                "first model (import + first fit), diabetes defaults: ours / MLPRegressor",
                backend,
                r["first_model_s"],
                2.0,
                disk,
            )
            add(
                "first model, empty cache: no worse than before (13.4x)",
                backend,
                r.get("first_model_s_empty_cache", r["first_model_s"]),
                BEFORE["defaults_first_model_ratio"],
                "" if cached else "no on-disk cache: the same processes",
            )
        elif version >= (3, 13) and plain:
            add(
                "first model (import + first fit), diabetes defaults: ours / MLPRegressor",
                backend,
                r["first_model_s"],
                1.5,
                disk,
            )
        add("second fit, diabetes defaults", backend, r["second_fit_s"], 0.8)
        if backend in ratios.get("nesterov", {}):
            add(
                "second fit, diabetes MLP (64,) Nesterov b32 100 epochs",
                backend,
                ratios["nesterov"][backend]["second_fit_s"],
                0.8,
            )
        for part, n in (("grid_1", 1), ("grid_2", 2)):
            if backend in ratios.get(part, {}):
                add(
                    f"GridSearchCV n_jobs={n}, whole process",
                    backend,
                    ratios[part][backend]["process_s"],
                    1.0,
                )
    return out


def run(pythons: list[str], cfg: dict) -> dict:
    """Measure every part for every interpreter, frameworks taking turns; the JSON document."""
    t_start = time.perf_counter()
    snapshot = cfg["snapshot"]
    env = worker_env(snapshot)
    meta = {
        "date": datetime.date.today().isoformat(),
        **git_state(),
        "library_source_sha256": library_hash(snapshot),
        "snapshot": snapshot is not None,
        "threads": THREADS,
        "repeats": cfg["repeats"],
        "grid_repeats": cfg["grid_repeats"],
        "quick": cfg["quick"],
        "grid": grid_settings(cfg["quick"]),
        "cpu_count": os.cpu_count(),
        "uptime_start": uptime(),
        "before": BEFORE,
    }
    print(f"load: {meta['uptime_start']}")
    infos = {}
    for python in pythons:
        if snapshot:
            subprocess.run([python, "-m", "compileall", "-q", snapshot], env=env, check=False)
        info = probe(python, env, fit_auto=not cfg["quick"])
        info["requested"] = python
        infos[python] = info
        print(f"{python}: {interpreter_label(info)}; backend='auto' -> {info.get('auto_backend')}")
        if "package_error" in info:
            print(f"  the package fails there: {info['package_error']}")
        if "package_error" not in info:
            name = cfg["cache_env"] if cfg["cache_env"] is not None else info.get("cache_env")
            cfg["cache_envs"][python] = name or None
            if name:
                print(f"  on-disk cache ({name}): filled by a first, unrecorded process")
                prime_cache(python, info, env, cfg)
            elif info.get("cache_env"):
                cfg["cache_off"][python] = info["cache_env"]  # --cache-env '': off
                print(f"  on-disk cache off ({info['cache_env']}='')")
    raw = {p: {part: {} for part in PARTS} for p in pythons}
    for r in range(max(cfg["repeats"], cfg["grid_repeats"])):
        for python in pythons:
            info = infos[python]
            for part in PARTS:
                limit = cfg["grid_repeats"] if part.startswith("grid") else cfg["repeats"]
                if r >= limit:
                    continue
                for fw in columns_for(info, part, cfg["quick"]):
                    code = child_code(part, fw, cfg["quick"])
                    for state in cache_states(cfg, python, fw, part):
                        penv, remove = cache_env(env, cfg, state, python)
                        res = measure(python, code, penv, cfg)
                        if remove:
                            shutil.rmtree(remove, ignore_errors=True)
                        raw[python][part].setdefault((fw, state), []).append(res)
                        progress(r, python, part, fw, state, res)
    out = {"meta": meta, "interpreters": {}}
    for python in pythons:
        info = infos[python]
        parts = {}
        for part in PARTS:
            cells = {}
            for fw in FRAMEWORKS:
                if fw not in columns_for(info, part, cfg["quick"]):
                    cells[fw] = {"skipped": skipped_reason(info, fw, part, cfg["quick"])}
                    continue
                states = cache_states(cfg, python, fw, part)
                cells[fw] = summarise(raw[python][part][(fw, states[0])])
                cells[fw]["cache"] = states[0]
                if "empty" in states:
                    cells[fw]["empty_cache"] = summarise(raw[python][part][(fw, "empty")])
            parts[part] = cells
        ratios = {part: part_ratios(cells) for part, cells in parts.items()}
        out["interpreters"][python] = {
            "label": interpreter_label(info),
            "info": info,
            "parts": parts,
            "ratios": ratios,
            "cache_env": cfg["cache_envs"].get(python),
            "targets": interpreter_targets(
                info, parts, ratios, bool(cfg["cache_envs"].get(python))
            ),
        }
        if cfg["importtime"] and "package_error" not in info:
            state = "on_disk" if cfg["cache_envs"].get(python) else "as_is"
            penv, _ = cache_env(env, cfg, state, python)
            out["interpreters"][python]["importtime_standard"] = importtime(python, penv)
    meta["uptime_end"] = uptime()
    loads = [
        r["load_before"][0]
        for p in raw.values()
        for part in p.values()
        for runs in part.values()
        for r in runs
        if r.get("load_before")
    ]
    if loads:
        meta["load_1min_before_processes"] = {
            "median": statistics.median(loads),
            "min": min(loads),
            "max": max(loads),
        }
    meta["wall_s"] = time.perf_counter() - t_start
    return out


def progress(r: int, python: str, part: str, fw: str, state: str, res: dict) -> None:
    """Print one line per measurement process."""
    head = f"  round {r + 1} {os.path.basename(os.path.dirname(os.path.dirname(python)))}"
    tag = fw if state in ("as_is", "on_disk") else f"{fw} (empty cache)"
    if "error" in res:
        print(f"{head} {part:9s} {tag:10s} FAILED: {res['error'][-800:]}")
        return
    second = res.get("second_fit_s")
    print(
        f"{head} {part:9s} {tag:10s} first model {res['first_model_s']:7.3f} s "
        f"(imports {res['import_s']:.3f}, fit {res['first_fit_s']:.3f}), "
        f"second fit {fmt(second)} s, process {res['process_s']:.3f} s, "
        f"load {fmt((res.get('load_before') or [None])[0], '.2f')}"
    )


def importtime(python: str, env: dict, top: int = 12) -> dict:
    """``python -X importtime`` of the standard backend's first model on diabetes defaults.

    Returns (microseconds, as the interpreter reports them) the top-level imports by
    cumulative time, each with the chain of its heaviest sub-imports (the child of
    largest cumulative time at each level, down to the module of largest own time on
    that path), and the modules by own time. Imports made during the fit (the
    package's lazy ones) are top-level entries too.
    """
    code = child_code("defaults", "standard", quick=False)
    res, _, stderr = run_child([python, "-X", "importtime", "-c", code], env, 600)
    if "error" in res:
        return {"error": res["error"]}
    nodes, pending = [], []
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        fields = line[len("import time:") :].split("|")
        if len(fields) != 3:
            continue
        name = fields[2]
        node = {
            "name": name.strip(),
            "depth": (len(name) - len(name.lstrip())) // 2,
            "self": int(fields[0]),
            "cumulative": int(fields[1]),
            "children": [],
        }
        # A module is reported after its sub-imports (one level deeper).
        while pending and pending[-1]["depth"] > node["depth"]:
            node["children"].insert(0, pending.pop())
        pending.append(node)
        nodes.append(node)
    tops = sorted(pending, key=lambda n: -n["cumulative"])[:top]

    def chain(node):
        path = [node]
        while path[-1]["children"]:
            path.append(max(path[-1]["children"], key=lambda n: n["cumulative"]))
        heaviest = max(path, key=lambda n: n["self"])
        return [[n["name"], n["cumulative"]] for n in path[1 : path.index(heaviest) + 1]]

    selfs = sorted(nodes, key=lambda n: -n["self"])[:top]
    return {
        "top_level_cumulative_us": [[n["name"], n["cumulative"], chain(n)] for n in tops],
        "self_us": [[n["name"], n["self"]] for n in selfs],
        "total_top_level_us": sum(n["cumulative"] for n in pending),
    }


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------

ROWS = (
    (
        "defaults",
        "first_model_s",
        "diabetes defaults: first model",
        "clock at the process's first line: imports, load_diabetes, build, fit",
    ),
    (
        "defaults",
        "import_s",
        "of which imports",
        "the framework (numpy, scikit-learn, ours / torch)",
    ),
    (
        "defaults",
        "first_fit_s",
        "of which first fit",
        "build + fit; ours: onnxruntime, onnx, skl2onnx imported on first use, conversion, "
        "graphs, sessions",
    ),
    ("defaults", "second_fit_s", "diabetes defaults: second fit", "a new estimator, same process"),
    (
        "nesterov",
        "first_model_s",
        "MLP (64,) Nesterov b32 100 ep.: first model",
        "as above, standardised diabetes, float32",
    ),
    ("nesterov", "first_fit_s", "of which first fit", "build + fit"),
    ("nesterov", "second_fit_s", "MLP (64,) Nesterov: second fit", "a new estimator, same process"),
    (
        "grid_1",
        "process_s",
        "GridSearchCV n_jobs=1",
        "whole process, start to exit: imports, 30 fits + refit",
    ),
    (
        "grid_2",
        "process_s",
        "GridSearchCV n_jobs=2",
        "whole process, 2 loky workers (fresh processes, 1 thread each)",
    ),
)
TITLES = {"sklearn": "MLPRegressor", "agent": "agent", "standard": "standard", "torch": "PyTorch"}


def markdown(doc: dict) -> str:
    """The Markdown tables of a run: one per interpreter, then its targets."""
    meta = doc["meta"]
    lines = [
        f"Cold start and warm fits, {meta['date']}, commit {meta['commit']}"
        + (" with uncommitted changes" if meta["uncommitted_changes"] else "")
        + f", sources `{meta['library_source_sha256']}`; {THREADS} threads, medians of "
        f"{meta['repeats']} processes ({meta['grid_repeats']} for the grids); load: "
        f"{meta['uptime_start']}",
        "",
    ]
    for python, entry in doc["interpreters"].items():
        info, parts, ratios = entry["info"], entry["parts"], entry["ratios"]
        lines += [
            f"### {entry['label']}",
            "",
            f"`{python}`; backend='auto' picks `{info.get('auto_backend')}`; torch installed: "
            f"{info.get('torch_installed')}.",
            "",
        ]
        head = "| figure | what it includes | " + " | ".join(TITLES[f] for f in FRAMEWORKS)
        head += " | agent / sklearn | standard / sklearn | PyTorch / sklearn |"
        lines += [head, "|" + "---|" * (2 + len(FRAMEWORKS) + 3)]
        for part, key, name, what in ROWS:
            cells = parts[part]
            values = [fmt(cells[f].get(key), ".3f") for f in FRAMEWORKS]
            rs = [fmt(ratios[part].get(f, {}).get(key), ".2f") for f in ("agent", "standard")]
            rs.append(fmt(ratios[part].get("torch", {}).get(key), ".2f"))
            lines.append(f"| {name} | {what} | " + " | ".join(values + rs) + " |")
            for fw in OURS:
                empty = cells[fw].get("empty_cache")
                if key == "first_model_s" and empty:
                    values = [fmt(empty.get(key)) if f == fw else "" for f in FRAMEWORKS]
                    rs = [
                        fmt(ratios[part][fw].get(key + "_empty_cache"), ".2f") if f == fw else ""
                        for f in ("agent", "standard", "torch")
                    ]
                    lines.append(
                        f"| {name}, empty cache | a new cache folder | "
                        + " | ".join(values + rs)
                        + " |"
                    )
        scores = [
            f"n_jobs={p[-1]}: "
            + ", ".join(
                f"{TITLES[f]} {fmt(parts[p][f].get('best_score'))}"
                for f in FRAMEWORKS
                if parts[p][f].get("best_score") is not None
            )
            for p in ("grid_1", "grid_2")
        ]
        lines += ["", "GridSearchCV best_score_ (R2): " + "; ".join(scores) + "."]
        mods = []
        for f in FRAMEWORKS:
            m = parts["defaults"][f].get("modules_after_first_fit")
            if m:
                names = [k for k, v in m.items() if v]
                mods.append(f"{TITLES[f]}: {', '.join(names) or 'none of them'}")
        lines += [
            "",
            "Heavy modules imported after the first fit (diabetes defaults): "
            + "; ".join(mods)
            + ".",
            "",
            "| target (issue 30) | backend | measured | limit | |",
            "|---|---|---|---|---|",
        ]
        for t in entry["targets"]:
            met = {True: "met", False: "not met", None: "-"}[t["met"]]
            note = f" ({t['note']})" if t["note"] else ""
            lines.append(
                f"| {t['target']}{note} | {t['backend']} | {fmt(t['measured'], '.2f')}x | "
                f"<= {t['limit']}x | {met} |"
            )
        imp = entry.get("importtime_standard")
        if imp and "top_level_cumulative_us" in imp:
            top = []
            for name, cum, path in imp["top_level_cumulative_us"][:5]:
                via = f" ({path[0][0]} {path[0][1] / 1e6:.2f} s" if path else ""
                if len(path) > 1:
                    via += f" ... {path[-1][0]} {path[-1][1] / 1e6:.2f} s"
                top.append(f"{name} {cum / 1e6:.2f} s{via + ')' if via else ''}")
            lines += [
                "",
                "`-X importtime` of the standard backend's first model (artifact on disk), "
                "top-level imports (the heaviest chain under each): " + "; ".join(top) + ".",
            ]
        lines.append("")
    loads = meta.get("load_1min_before_processes")
    if loads:
        lines.append(
            f"1-minute load average before the processes: median {loads['median']:.2f} "
            f"({loads['min']:.2f}-{loads['max']:.2f}) on {meta['cpu_count']} CPUs; "
            f"at the end: {meta.get('uptime_end')}; {meta['wall_s']:.0f} s in all."
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Command line: measure, write ``cold_start.json``, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="processes per cell (3)")
    parser.add_argument(
        "--grid-repeats", type=int, default=None, help="processes per grid cell (--repeats)"
    )
    parser.add_argument(
        "--python",
        action="append",
        default=None,
        help="an interpreter to measure (repeatable; default: this one)",
    )
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="output folder")
    parser.add_argument(
        "--quick", action="store_true", help="1 repeat, a tiny grid, sklearn and standard only"
    )
    parser.add_argument(
        "--max-wait",
        type=float,
        default=None,
        help="seconds to wait for a quiet machine before each process (3; quick: 0)",
    )
    parser.add_argument(
        "--no-snapshot", action="store_true", help="import the package's files, not a copy"
    )
    parser.add_argument(
        "--cache-env",
        default=None,
        help="environment variable naming the package's on-disk cache folder (default: "
        "onnxgrad_sklearn.artifacts.CACHE_ENV where the package has it; '' turns it off)",
    )
    parser.add_argument(
        "--no-importtime", action="store_true", help="skip the -X importtime process"
    )
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    cfg = {
        "quick": args.quick,
        "repeats": repeats,
        "grid_repeats": args.grid_repeats or repeats,
        "max_wait": args.max_wait if args.max_wait is not None else (0.0 if args.quick else 3.0),
        "timeout": 300 if args.quick else 900,
        "cache_env": args.cache_env,
        "cache_dirs": {},
        "cache_envs": {},
        "cache_off": {},
        "importtime": not (args.quick or args.no_importtime),
    }
    pythons = args.python or [sys.executable]
    cfg["snapshot"] = None if args.no_snapshot else snapshot_library()
    try:
        doc = run(pythons, cfg)
    finally:
        for folder in [cfg["snapshot"], *cfg["cache_dirs"].values()]:
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cold_start.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print()
    print(markdown(doc))
    print(f"\nwrote {path}")
    failed = [
        f"{python}: {part}/{fw}"
        for python, entry in doc["interpreters"].items()
        for part, cells in entry["parts"].items()
        for fw, cell in cells.items()
        if "error" in cell
    ]
    if failed:
        print("failed measurements: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
