"""Train the benchmark MLP on CPU and on CUDA and compare the loss curves.

Run with ``python benchmarks/gpu_check.py [--rows N] [--epochs N] [--device cuda:N]``.
It needs a CUDA build of onnxruntime and a GPU: ``onnxruntime-gpu`` in place of
the CPU build for the standard backend (``benchmarks/gpu_device.sh`` installs it
from wheels), and also onnxruntime-training's CUDA build for the TrainingAgent
(``onnxruntime-training==1.19.2``, CUDA 11.8, Python <= 3.11), which is checked
where it is installed. Without a CUDA provider it says so and exits with status
0 (nothing to check).

For each backend it trains the MLP (100 features, 256-256, Nesterov, batch 256)
on the CPU, on CUDA with TF32 off (the package's default), and on CUDA with TF32
allowed (``config_context(allow_tf32=True)``), and prints the three timings and
loss curves. It exits with status 1 when a CUDA fit with TF32 off fails, or its
loss curve differs from the CPU's by more than 1e-3 relative; the TF32 gap is
printed, not checked. Timings are whole fits (graph building and session
creation included) after a small warm-up fit on each device.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import numpy as np

LIMIT = 1e-3


def _fit(device: str, X, y, epochs: int, backend: str, allow_tf32: bool = False):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientRegressor, config_context
    from onnxgrad_sklearn.optim import Nesterov

    reg = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(256, 256)),
        optimizer=Nesterov(momentum=0.9),
        learning_rate_init=0.001,
        batch_size=256,
        max_iter=epochs,
        shuffle=False,
        random_state=0,
        device=device,
        backend=backend,
    )
    with warnings.catch_warnings(), config_context(allow_tf32=allow_tf32):
        warnings.simplefilter("ignore", ConvergenceWarning)
        begin = time.perf_counter()
        reg.fit(X, y)
        seconds = time.perf_counter() - begin
    return reg, seconds


def _gap(curve, reference) -> float:
    curve, reference = np.asarray(curve), np.asarray(reference)
    if curve.shape != reference.shape:
        return float("inf")
    return float(np.max(np.abs(curve - reference) / np.abs(reference)))


def _check_backend(backend: str, device: str, X, y, epochs: int) -> bool:
    """Fit on the CPU and on CUDA (TF32 off, then on); print; return whether it passed."""
    _fit("cpu", X[:512], y[:512], 1, backend)  # warm-up: libraries, thread pools
    cpu, cpu_seconds = _fit("cpu", X, y, epochs, backend)
    print(f"[{backend}] cpu          {cpu_seconds:8.2f} s  loss curve {_rounded(cpu)}")
    try:
        _fit(device, X[:512], y[:512], 1, backend)  # warm-up: CUDA context, cuBLAS
        gpu, gpu_seconds = _fit(device, X, y, epochs, backend)
    except Exception:  # noqa: BLE001 - reported, then the check fails
        traceback.print_exc()
        print(f"[{backend}] {device}: the fit failed (traceback above)")
        return False
    assert gpu.backend_ == backend, gpu.backend_
    gap = _gap(gpu.loss_curve_, cpu.loss_curve_)
    print(f"[{backend}] {device:6s} tf32 off {gpu_seconds:8.2f} s  loss curve {_rounded(gpu)}")
    try:
        tf32, tf32_seconds = _fit(device, X, y, epochs, backend, allow_tf32=True)
        tf32_gap = _gap(tf32.loss_curve_, cpu.loss_curve_)
        print(
            f"[{backend}] {device:6s} tf32 on  {tf32_seconds:8.2f} s  loss curve {_rounded(tf32)}"
        )
        tf32_text = f"{tf32_gap:.2e} with tf32 on (not checked)"
    except Exception:  # noqa: BLE001 - reported; TF32 on is informative only
        traceback.print_exc()
        tf32_text = "tf32 on: the fit failed (traceback above)"
    rows = X[:1000]
    pred_gap = float(np.max(np.abs(gpu.predict(rows) - cpu.predict(rows))))
    engine_gap = float(np.max(np.abs(gpu._engine.predict(rows) - cpu._engine.predict(rows))))
    print(
        f"[{backend}] largest relative gap between the loss curves: {gap:.2e} with tf32 off "
        f"(limit {LIMIT:g}), {tf32_text}"
    )
    print(
        f"[{backend}] largest gap between predictions on 1000 rows: {pred_gap:.2e} "
        f"(estimator), {engine_gap:.2e} (training backend)"
    )
    return gap <= LIMIT


def _rounded(reg) -> list:
    return np.round(np.asarray(reg.loss_curve_), 6).tolist()


def main(argv=None) -> int:
    """Run the check; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000, help="training rows (default 50000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    parser.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    args = parser.parse_args(argv)

    import onnxruntime

    from onnxgrad_sklearn.backends import agent_available

    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        print(f"no CUDA provider in this onnxruntime build ({providers}): nothing to check")
        return 0
    print(
        f"onnxruntime {onnxruntime.__version__}, providers {providers}, Python "
        f"{sys.version.split()[0]}"
    )
    rng = np.random.RandomState(0)
    X = rng.randn(args.rows, 100).astype(np.float32)
    y = (np.sin(X[:, :10]).sum(axis=1) + 0.1 * rng.randn(args.rows)).astype(np.float32)
    print(f"rows {args.rows}, MLP (256, 256), Nesterov 0.9, batch 256, {args.epochs} epochs")
    backends = ["standard"] + (["agent"] if agent_available() else [])
    if not agent_available():
        print("[agent] skipped: onnxruntime-training (the TrainingAgent) is not installed")
    passed = [_check_backend(b, args.device, X, y, args.epochs) for b in backends]
    print("gpu check: " + ("passed" if all(passed) else "FAILED"))
    return 0 if all(passed) else 1


if __name__ == "__main__":
    sys.exit(main())
