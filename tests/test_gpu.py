"""The CUDA path: runs only where the CUDA build of onnxruntime-training and a GPU exist."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor

HAS_CUDA = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
needs_cuda = pytest.mark.skipif(
    not HAS_CUDA,
    reason="the installed onnxruntime-training has no CUDA provider (CPU build or no GPU)",
)
ROOT = Path(__file__).resolve().parent.parent


@needs_cuda
def test_cuda_training_matches_cpu_training():
    rng = np.random.RandomState(0)
    X = rng.randn(500, 8)
    y = X[:, 0] - X[:, 1] ** 2
    params = dict(
        optimizer="adam",
        learning_rate_init=0.01,
        max_iter=5,
        batch_size=50,
        random_state=0,
        shuffle=False,
    )
    cpu = OrtGradientRegressor(**params).fit(X, y)
    gpu = OrtGradientRegressor(device="cuda", **params).fit(X, y)
    np.testing.assert_allclose(gpu.loss_curve_, cpu.loss_curve_, rtol=1e-3)
    np.testing.assert_allclose(gpu.predict(X), cpu.predict(X), rtol=1e-3, atol=1e-4)
    clf = OrtGradientClassifier(device="cuda:0", **params).fit(X, y > 0)
    assert clf.score(X, y > 0) > 0.7


@needs_cuda
def test_gpu_check_script_passes():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--rows", "5000"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "largest relative gap" in out.stdout


def test_gpu_check_script_explains_a_missing_cuda_build():
    if HAS_CUDA:
        pytest.skip("the CUDA build is installed")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    assert "no CUDA provider" in out.stdout
