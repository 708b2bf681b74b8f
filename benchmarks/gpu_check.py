"""Train the benchmark MLP on CPU and on CUDA and compare the loss curves.

Run with ``python benchmarks/gpu_check.py [--rows N] [--epochs N]``. It needs
the CUDA build of onnxruntime-training (``pip uninstall -y
onnxruntime-training-cpu && pip install onnxruntime-training==1.19.2``) and a
GPU; without them it says so and exits with status 0 (nothing to check). It
exits with status 1 when the two loss curves differ by more than 1e-3
relative, and prints both timings.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np


def _fit(device: str, X, y, epochs: int):
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    from onnxgrad_sklearn import OrtGradientRegressor
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
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        begin = time.perf_counter()
        reg.fit(X, y)
        seconds = time.perf_counter() - begin
    return reg, seconds


def main(argv=None) -> int:
    """Run the check; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000, help="training rows (default 50000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    parser.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    args = parser.parse_args(argv)

    import onnxruntime

    providers = onnxruntime.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        print(f"no CUDA provider in this onnxruntime build ({providers}): nothing to check")
        return 0

    rng = np.random.RandomState(0)
    X = rng.randn(args.rows, 100).astype(np.float32)
    y = (np.sin(X[:, :10]).sum(axis=1) + 0.1 * rng.randn(args.rows)).astype(np.float32)
    cpu, cpu_seconds = _fit("cpu", X, y, args.epochs)
    gpu, gpu_seconds = _fit(args.device, X, y, args.epochs)
    cpu_curve, gpu_curve = np.array(cpu.loss_curve_), np.array(gpu.loss_curve_)
    gap = float(np.max(np.abs(gpu_curve - cpu_curve) / np.abs(cpu_curve)))
    print(f"rows {args.rows}, MLP (256, 256), Nesterov 0.9, batch 256, {args.epochs} epochs")
    print(f"cpu  {cpu_seconds:8.2f} s  loss curve {np.round(cpu_curve, 6).tolist()}")
    print(f"{args.device:4s} {gpu_seconds:8.2f} s  loss curve {np.round(gpu_curve, 6).tolist()}")
    pred_gap = float(np.max(np.abs(gpu.predict(X[:1000]) - cpu.predict(X[:1000]))))
    print(f"largest relative gap between the loss curves: {gap:.2e} (limit 1e-3)")
    print(f"largest gap between predictions on 1000 rows: {pred_gap:.2e}")
    return 0 if gap <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
