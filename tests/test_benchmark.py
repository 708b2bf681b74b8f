"""The benchmark script's quick mode runs and writes complete results (no timed assertions)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench.py")
WORKLOADS = ("mlp_reg_b256", "mlp_reg_b32", "mlp_clf_b64", "linear_b1024")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """Run ``bench.py --quick`` once; return its output folder and completed process."""
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    return out, proc


def test_quick_run_exits_cleanly(quick_run):
    _, proc = quick_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _positive_finite(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_json_has_every_workload(quick_run):
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "latest.json") as f:
        doc = json.load(f)
    assert doc["meta"]["mode"] == "quick"
    frameworks = ["ort", "sklearn"]
    if importlib.util.find_spec("torch") is not None:
        frameworks.append("torch")
    assert set(WORKLOADS) <= set(doc["workloads"])
    for name in WORKLOADS:
        cells = doc["workloads"][name]["frameworks"]
        for fw in frameworks:
            value = cells[fw]["s_per_epoch"]
            assert _positive_finite(value), (name, fw, cells[fw])


def test_memory_scaling_is_measured(quick_run):
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(out / "latest.json") as f:
        doc = json.load(f)
    ort = doc["memory_scaling"]["frameworks"]["ort"]
    sizes = [p["hidden"][0] for p in ort["points"]]
    assert len(sizes) >= 2 and sizes == sorted(sizes)
    state = [p["weights_grads_state_mb"] for p in ort["points"]]
    assert state == sorted(state) and state[0] > 0
    assert all(_positive_finite(p["peak_above_data_mb"]) for p in ort["points"])
    assert math.isfinite(ort["slope"])
    target = next(t for t in doc["targets"] if t["target"].startswith("peak RSS per MB"))
    assert target["measured"] == ort["slope"]


def test_png_is_written(quick_run):
    out, proc = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    png = out / "benchmark.png"
    assert png.exists()
    data = png.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000
