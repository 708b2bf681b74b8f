"""The benchmark script's quick mode runs and writes complete results (no timed assertions)."""

import importlib.util
import json
import math
import os
import re
import sys

import _benchmark_runs
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = ("mlp_reg_b256", "mlp_reg_b32", "mlp_clf_b64", "linear_b1024")
FITS = ("fit_diabetes_nesterov", "fit_5k_adam", "fit_diabetes_nesterov_f64", "fit_5k_adam_f64")
BACKENDS = ("agent", "standard")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _have_agent():
    try:
        from onnxgrad_sklearn.backends import agent_available
    except ImportError:
        return False
    return agent_available()


@pytest.fixture(scope="module")
def quick_run():
    """``bench.py --quick`` (run in the background: tests/_benchmark_runs.py); its output
    folder and completed process."""
    return _benchmark_runs.result("quick_run")


@pytest.fixture(scope="module")
def doc(quick_run):
    out, proc = quick_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "latest.json") as f:
        return json.load(f)


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _frameworks(dtype="float32"):
    fws = ["standard", "sklearn"]
    if dtype == "float32" and _have_agent():
        fws.append("agent")
    if HAVE_TORCH:
        fws.append("torch")
    return fws


@pytest.mark.slow
def test_quick_run_exits_cleanly(quick_run):
    _, proc = quick_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_json_has_every_workload_and_framework(doc):
    assert doc["meta"]["mode"] == "quick"
    assert doc["meta"]["uptime_start"] is None or "load average" in doc["meta"]["uptime_start"]
    assert set(WORKLOADS) <= set(doc["workloads"])
    for name in WORKLOADS:
        cells = doc["workloads"][name]["frameworks"]
        for fw in _frameworks():
            assert _positive_finite(cells[fw]["s_per_epoch"]), (name, fw, cells[fw])
            assert set(cells[fw]["by_threads"]) == {"1", "2"}, (name, fw)
        for fw in BACKENDS:
            if fw in cells and cells[fw]["s_per_epoch"] is not None:
                assert cells[fw]["backend_"] == fw  # what ran, from the fitted estimator
        ratios = doc["workloads"][name]["ratios"]
        if _have_agent():
            assert _positive_finite(ratios["standard_over_agent"])


@pytest.mark.slow
def test_floor_column_in_json(doc):
    """The NumPy floor runs on every epoch workload, in a process without any framework."""
    for name in WORKLOADS:
        entry = doc["workloads"][name]
        floor = entry["frameworks"]["floor"]
        assert _positive_finite(floor["s_per_epoch"]), (name, floor)
        assert set(floor["by_threads"]) == {"1", "2"}, name
        assert floor["framework_modules_loaded"] == [], name  # numpy and threadpoolctl only
        assert floor["blas"], name
        for fw in _frameworks():
            ratio = entry["ratios"][f"{fw}_over_floor"]
            cell = entry["frameworks"][fw]
            assert ratio == pytest.approx(cell["s_per_epoch"] / floor["s_per_epoch"]), (name, fw)
            assert _positive_finite(entry["ratios"][f"{fw}_over_floor_best"]), (name, fw)
            if fw in ("agent", "standard"):  # the epochs alone, as the floor is timed
                in_loop = entry["ratios"][f"{fw}_in_loop_over_floor"]
                expected = cell["epoch_in_loop_s"] / floor["median"]
                assert in_loop == pytest.approx(expected), (name, fw)
        assert _positive_finite(
            entry["ratios"]["standard_over_torch" if HAVE_TORCH else "sklearn_over_standard"]
        )
    for name in FITS:  # the floor is a column of the epoch workloads only
        assert "floor" not in doc["fits"][name]["frameworks"]


@pytest.mark.slow
def test_floor_column_in_report(quick_run, doc):
    _, proc = quick_run
    label = "NumPy floor (matrix products and activations only)"
    header = next(line for line in proc.stdout.splitlines() if line.startswith("| s/epoch"))
    assert label in header
    standard = doc["workloads"]["mlp_reg_b256"]["frameworks"]["standard"]["s_per_epoch"]
    ratio = doc["workloads"]["mlp_reg_b256"]["ratios"]["standard_over_floor"]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| `mlp_reg_b256`"))
    assert f"| {standard:.3f} ({ratio:.2f}x) |" in row
    assert re.search(r"\| \d+\.\d{3} \((1|2); \d+\.\d{2}x\) \|", proc.stdout)  # best
    assert "not a framework, a floor" in proc.stdout
    alone = doc["workloads"]["mlp_reg_b256"]["ratios"]
    cells = [f"{alone[f'{fw}_in_loop_over_floor']:.2f}" for fw in ("agent", "standard")]
    assert f"| `mlp_reg_b256` | {cells[0]} | {cells[1]} |" in proc.stdout


@pytest.mark.slow
def test_small_data_fits_are_measured(doc):
    assert set(FITS) <= set(doc["fits"])
    for name in FITS:
        entry = doc["fits"][name]
        for fw in _frameworks(entry["dtype"]):
            assert _positive_finite(entry["frameworks"][fw]["s_per_fit"]), (name, fw)
        assert "agent" not in entry["frameworks"] or entry["dtype"] == "float32"
        assert _positive_finite(entry["ratios"]["standard_over_sklearn"])


@pytest.mark.slow
def test_daily_use_rows(doc):
    daily = doc["daily_use"]
    ort = daily["predict"]["ort"]
    for who in ("standard", "InferenceSession"):
        for rows in ("1", "1000"):
            assert _positive_finite(ort[who][rows]["median_us"]), (who, rows)
    assert _positive_finite(daily["predict"]["sklearn"]["MLPRegressor"]["1"]["median_us"])
    for fw in ("standard", "sklearn"):
        assert _positive_finite(daily["grid"][fw]["first_s"]), daily["grid"][fw]
    imports = daily["import"]
    assert _positive_finite(imports["sklearn.neural_network"]["import_s"])
    standard = imports["onnxgrad_sklearn, standard"]
    assert _positive_finite(standard["import_s"]) and _positive_finite(standard["first_fit_s"])


@pytest.mark.slow
def test_memory_scaling_is_measured(doc):
    for fw in ("standard", "agent") if _have_agent() else ("standard",):
        entry = doc["memory_scaling"]["frameworks"][fw]
        sizes = [p["hidden"][0] for p in entry["points"]]
        assert len(sizes) >= 2 and sizes == sorted(sizes)
        state = [p["weights_grads_state_mb"] for p in entry["points"]]
        assert state == sorted(state) and state[0] > 0
        assert all(_positive_finite(p["peak_above_data_mb"]) for p in entry["points"])
        assert math.isfinite(entry["slope"])
    target = next(t for t in doc["targets"] if t["target"].startswith("peak RSS per MB"))
    assert target["measured"] == doc["memory_scaling"]["frameworks"]["standard"]["slope"]


@pytest.mark.slow
def test_targets_name_their_issue(doc):
    assert {t["issue"] for t in doc["targets"]} == {18, 20}
    for t in doc["targets"]:
        assert t["met"] in (True, False, None)
        assert t["met"] is None or _positive_finite(abs(t["measured"]) + 1)


@pytest.mark.slow
def test_png_is_written(quick_run):
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    png = out / "benchmark.png"
    assert png.exists()
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000


# ---------------------------------------------------------------------------
# the floor's work: the right products, on tiny workloads
# ---------------------------------------------------------------------------


@pytest.fixture
def workloads(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "benchmarks"))
    import bench_workloads

    return bench_workloads


def _tiny(kind):
    rng = np.random.default_rng(3)
    spec = {"kind": kind, "features": 7, "batch": 9}
    if kind == "mlp_reg":
        spec["hidden"] = (5, 4)
    elif kind == "mlp_clf":
        spec.update(hidden=(6,), classes=3)
    X = rng.standard_normal((9, 7))
    y = rng.integers(0, 3, 9) if kind == "mlp_clf" else rng.standard_normal((9, 1))
    return spec, X, y


def _floor_inputs(workloads, kind):
    spec, X, y = _tiny(kind)
    weights = [w.astype(np.float64) for w in workloads.floor_weights(spec)]
    if kind == "linear":  # the floor starts from zeros, as the PyTorch loop: use others
        weights = [np.random.default_rng(4).standard_normal((7, 1))]
    return spec, X, y, weights


@pytest.mark.parametrize("kind", ["mlp_reg", "mlp_clf", "linear"])
def test_floor_gradients_match_autograd(workloads, kind):
    """Every weight gradient of one batch equals autograd's: no product missing or transposed."""
    torch = pytest.importorskip("torch")
    spec, X, y, weights = _floor_inputs(workloads, kind)
    assert [w.shape for w in weights] == (
        [(7, 1)]
        if kind == "linear"
        else list(zip(workloads.layer_units(spec)[:-1], workloads.layer_units(spec)[1:]))
    )
    grads = workloads.floor_step(weights, X, y, kind)
    ws = [torch.tensor(w, requires_grad=True) for w in weights]
    a = torch.tensor(X)
    for w in ws[:-1]:
        a = torch.relu(a @ w)
    z = a @ ws[-1]
    if kind == "mlp_clf":  # d/dZ = softmax(Z) - onehot(y)
        loss = torch.nn.functional.cross_entropy(z, torch.tensor(y), reduction="sum")
    else:  # d/dZ = Z - y
        loss = 0.5 * ((z - torch.tensor(y)) ** 2).sum()
    loss.backward()
    assert len(grads) == len(ws)
    for g, w in zip(grads, ws):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_floor_gradients_match_finite_differences(workloads):
    """The same without torch: central differences of 0.5 * sum((Z - y)^2), 2 layers."""
    spec, X, y, weights = _floor_inputs(workloads, "mlp_reg")
    weights = weights[1:]  # 5-4-1 on the first 5 features: two weight matrices
    X = X[:, :5]

    def loss(ws):
        h = np.maximum(X @ ws[0], 0)
        return 0.5 * np.sum((h @ ws[1] - y) ** 2)

    grads = workloads.floor_step(weights, X, y, "mlp_reg")
    for k, w in enumerate(weights):
        numeric = np.zeros_like(w)
        for idx in np.ndindex(w.shape):
            plus = [v.copy() for v in weights]
            minus = [v.copy() for v in weights]
            plus[k][idx] += 1e-6
            minus[k][idx] -= 1e-6
            numeric[idx] = (loss(plus) - loss(minus)) / 2e-6
        np.testing.assert_allclose(grads[k], numeric, rtol=1e-5, atol=1e-7)


def test_floor_epoch_visits_the_shuffled_batches(workloads, monkeypatch):
    """An epoch: float32, the PyTorch loop's permutation and slices, weights unchanged."""
    spec = {**workloads.WORKLOADS["mlp_reg_b256"], "batch": 64}
    X, y = workloads.make_data(spec, 300)
    calls = []
    real = workloads.floor_step

    def spy(weights, xb, yb, kind):
        calls.append((xb.copy(), yb.copy(), [w.copy() for w in weights]))
        return real(weights, xb, yb, kind)

    monkeypatch.setattr(workloads, "floor_step", spy)
    epoch = workloads.floor_trainer(spec, X, y)
    epoch()
    idx = np.random.RandomState(workloads.SEED).permutation(300)
    assert [len(c[0]) for c in calls] == [64, 64, 64, 64, 44]
    np.testing.assert_array_equal(np.concatenate([c[0] for c in calls]), X[idx])
    np.testing.assert_array_equal(np.concatenate([c[1] for c in calls]).ravel(), y[idx])
    first, last = calls[0][2], calls[-1][2]
    assert all(w.dtype == np.float32 for w in first)
    assert all(np.array_equal(a, b) for a, b in zip(first, last))  # no update
    coefs, _ = workloads.glorot_weights(workloads.layer_units(spec))
    assert all(np.array_equal(a, c.astype(np.float32)) for a, c in zip(first, coefs))


# ---------------------------------------------------------------------------
# benchmarks/cold_start.py: first model, second fit, GridSearchCV in new processes
# ---------------------------------------------------------------------------

COLD_PARTS = ("defaults", "nesterov", "grid_1", "grid_2")
HEAVY_MODULES = {"torch", "onnxruntime", "onnxruntime.training", "onnx", "skl2onnx", "onnx_ad"}


@pytest.fixture(scope="module")
def cold_start():
    """``cold_start.py --quick`` (this interpreter only); its JSON and process."""
    out, proc = _benchmark_runs.result("cold_start")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "cold_start.json") as f:
        return json.load(f), proc


@pytest.mark.slow
def test_cold_start_meta(cold_start):
    doc, proc = cold_start
    meta = doc["meta"]
    assert meta["quick"] is True and meta["repeats"] == 1 and meta["threads"] == 2
    assert meta["commit"] and isinstance(meta["uncommitted_changes"], bool)
    assert meta["uptime_start"] is None or "load average" in meta["uptime_start"]
    assert list(doc["interpreters"]) == [sys.executable]
    assert "### Python" in proc.stdout and "| target (issue 30) |" in proc.stdout


@pytest.mark.slow
def test_cold_start_every_part_is_measured(cold_start):
    doc, _ = cold_start
    entry = doc["interpreters"][sys.executable]
    assert entry["info"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert entry["info"]["torch_installed"] == HAVE_TORCH
    assert set(entry["parts"]) == set(COLD_PARTS)
    for part in COLD_PARTS:
        cells = entry["parts"][part]
        assert set(cells) == {"sklearn", "agent", "standard", "torch"}
        assert "skipped" in cells["agent"] and "skipped" in cells["torch"]  # quick mode
        for fw in ("sklearn", "standard"):
            cell = cells[fw]
            assert "error" not in cell, (part, fw, cell)
            for key in ("first_model_s", "import_s", "first_fit_s", "process_s"):
                assert _positive_finite(cell[key]), (part, fw, key, cell.get(key))
            assert cell["first_model_s"] >= cell["import_s"]
            assert set(cell["modules_after_first_fit"]) == HEAVY_MODULES
            if part.startswith("grid"):
                assert math.isfinite(cell["best_score"]), (part, fw)
            else:
                assert _positive_finite(cell["second_fit_s"]), (part, fw)
        assert cells["standard"]["modules_after_first_fit"]["onnxruntime"]
        assert not cells["sklearn"]["modules_after_first_fit"]["onnxruntime"]
        ratios = entry["ratios"][part]["standard"]
        assert _positive_finite(ratios["first_model_s"]) and _positive_finite(ratios["process_s"])
    standard = entry["parts"]["defaults"]["standard"]
    assert standard["first"]["backend_"] == "standard"
    if entry["cache_env"]:  # the package has an on-disk cache: measured empty too
        assert standard["cache"] == "on_disk"
        assert _positive_finite(standard["empty_cache"]["first_model_s"])


@pytest.mark.slow
def test_cold_start_targets(cold_start):
    doc, _ = cold_start
    targets = doc["interpreters"][sys.executable]["targets"]
    names = {t["target"] for t in targets}
    assert "second fit, diabetes defaults" in names
    assert {"GridSearchCV n_jobs=1, whole process", "GridSearchCV n_jobs=2, whole process"} <= names
    for t in targets:
        assert t["issue"] == 30 and t["backend"] == "standard"
        assert t["met"] in (True, False) and _positive_finite(t["measured"])


# ---------------------------------------------------------------------------
# benchmarks/dask_cluster.py: issue 31's figures, a LocalCluster against one process
# ---------------------------------------------------------------------------

DASK_PARTS = ("memory", "round", "lbfgs", "minibatch")
DASK_COLUMNS = ("cluster", "process", "process_1_thread", "dask_ml")


@pytest.fixture(scope="module")
def dask_cluster():
    """``dask_cluster.py --quick`` (about 20 s); its JSON and process."""
    for module in _benchmark_runs.RUNS["dask_cluster"].needs:
        pytest.importorskip(module)
    out, proc = _benchmark_runs.result("dask_cluster")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "dask_cluster.json") as f:
        return json.load(f), proc


@pytest.mark.slow
def test_dask_cluster_meta(dask_cluster):
    doc, proc = dask_cluster
    meta = doc["meta"]
    assert meta["mode"] == "quick" and meta["parts"] == list(DASK_PARTS)
    assert meta["commit"] and meta["cpu_count"] >= 1
    assert meta["cluster"] == "LocalCluster(n_workers=2, threads_per_worker=1)"
    assert meta["one_process_threads"] == 2
    assert meta["package"]["file"].startswith(ROOT)  # this checkout's package
    for key in ("load_before", "load_after"):
        assert len(meta[key]["loadavg"]) == 3
    assert {"rows", "columns", "partitions", "rounds", "repeats"} <= set(meta["sizes"])
    assert "| target (issue 31) |" in proc.stdout


@pytest.mark.slow
def test_dask_cluster_parts_are_measured(dask_cluster):
    doc, _ = dask_cluster
    parts = doc["parts"]
    assert list(parts) == list(DASK_PARTS)
    memory = parts["memory"]
    assert memory["data_bytes"] > 0 and len(memory["fits"]) == 2
    for fit in memory["fits"]:
        assert _positive_finite(fit["peak_mb"]) and fit["evaluations"] > 0
    rounds = parts["round"]
    for key in ("pinned_noop_task_per_worker", "objective_on_cluster", "objective_in_process"):
        summary = rounds[key]
        assert _positive_finite(summary["median"]) and summary["p95"] >= summary["median"]
    assert set(rounds["tasks_per_round"]) <= {1, 2}  # one task per worker holding rows
    lbfgs = parts["lbfgs"]
    for column in DASK_COLUMNS:
        run = lbfgs["runs"][column][0]
        assert run["evaluations"] > 0 and run["iterations"] > 0, column
        assert _positive_finite(run["s_per_evaluation"]), column
    cluster = lbfgs["runs"]["cluster"][0]
    assert set(cluster["tasks_per_round"]) <= {1, 2}
    assert cluster["rounds_logged"] == cluster["evaluations"]
    # the same objective on both sides: equal at both sides' final weights
    assert lbfgs["objective_rel_diff"]["cluster_vs_dask_ml"] < 1e-6
    minibatch = parts["minibatch"]
    for name in ("one process", "sync_every=16", "sync_every=1"):
        # the difference of two short fits: finite (it may be noise in a quick run)
        assert math.isfinite(minibatch["rows_per_s"][name]), name
        assert _positive_finite(minibatch["runs"][name]["loss"]), name


@pytest.mark.slow
def test_dask_cluster_targets(dask_cluster):
    doc, _ = dask_cluster
    targets = [t for part in doc["parts"].values() for t in part["targets"]]
    assert len(targets) == 7
    for t in targets:
        assert t["issue"] == 31 and t["met"] in (True, False)
        assert math.isfinite(t["measured"])


# ---------------------------------------------------------------------------
# benchmarks/callbacks.py: what scikit-learn's callbacks add, beside scikit-learn
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def callbacks_run():
    pytest.importorskip("sklearn.callback", reason="scikit-learn < 1.9: no callback API")
    out, proc = _benchmark_runs.result("callbacks_run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "callbacks.json") as f:
        return json.load(f)


@pytest.mark.slow
def test_callbacks_every_case_and_column_is_measured(callbacks_run):
    meta, cases = callbacks_run["meta"], callbacks_run["cases"]
    assert meta["quick"] is True and meta["repeats"] == 1 and meta["commit"]
    assert set(cases) == {"logistic_iris", "mlp_classifier_iris", "mlp_regressor_diabetes"}
    for name, row in cases.items():
        sides = ("ours", "scikit-learn") if name == "logistic_iris" else ("ours",)
        assert set(row) >= set(sides)
        for side in sides:
            per = row[side]["ms_per_iteration"]
            assert set(per) == {"none", "scoring_monitor", "fitted_estimator"}
            assert all(_positive_finite(v) for v in per.values()), (name, side, per)
            for column, added in row[side]["added_ms"].items():
                assert added == pytest.approx(per[column] - per["none"])
    assert "scoring_monitor_added_ratio" in cases["logistic_iris"]


@pytest.mark.slow
def test_callbacks_slope_is_the_added_time_between_two_budgets(callbacks_run):
    found = callbacks_run["cases"]["logistic_iris"]["per_iteration_slope"]
    lo, hi = callbacks_run["meta"]["slope"]
    for side in ("ours", "scikit-learn"):
        m = found[side]
        assert m["iterations"] == [lo, hi], (side, m)  # both sides run every iteration
        best = {key: min(values) for key, values in m["times"].items()}
        added = [best[f"{b}/monitor"] - best[f"{b}/none"] for b in (lo, hi)]
        assert m["added_ms_per_fit"] == pytest.approx(added)
        assert m["added_ms_per_iteration"] == pytest.approx((added[1] - added[0]) / (hi - lo))
        assert m["added_ms_once_per_fit"] == pytest.approx(
            added[0] - lo * m["added_ms_per_iteration"]
        )
    assert found["ratio"] == pytest.approx(
        found["ours"]["added_ms_per_iteration"] / found["scikit-learn"]["added_ms_per_iteration"]
    )
