"""Fit time in float64 and float32, against MLPRegressor at the same precision.

One workload: MLPRegressor(hidden_layer_sizes=(64,)) trained with Adam on the
diabetes data (442 rows, 10 features, standardised target), batch size 32, a fixed
number of epochs. Each row is the best of ``--repeat`` fits::

    python benchmarks/float64.py [--epochs 50] [--repeat 3] [--threads 1]

Prints one line per configuration and the ratios: float64 / float32 for each
library, and this package against MLPRegressor at each precision. The package's
float32 row runs the backend ``"auto"`` picks (the TrainingAgent where
onnxruntime-training is installed); its float64 row always runs the standard
backend, and the "standard" row shows that backend in float32 too. A fit's time
includes converting the template and building the training graphs.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn import OrtGradientRegressor


def _settings(epochs: int) -> dict:
    return dict(
        batch_size=32,
        learning_rate_init=1e-3,
        max_iter=epochs,
        tol=0.0,
        n_iter_no_change=10**6,
        shuffle=True,
        random_state=0,
    )


def _best_time(make, X, y, repeat: int) -> float:
    best = np.inf
    for _ in range(repeat):
        est = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            start = time.perf_counter()
            est.fit(X, y)
            best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> dict:
    """Run the benchmark; return the times in seconds by configuration."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="numpy/BLAS threads (0: leave as is)"
    )
    args = parser.parse_args(argv)
    if args.threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(args.threads)
    X, y = load_diabetes(return_X_y=True)
    y = (y - y.mean()) / y.std()
    settings = _settings(args.epochs)
    times = {}
    for dtype in ("float32", "float64"):
        Xd, yd = X.astype(dtype), y.astype(dtype)
        times["MLPRegressor", dtype] = _best_time(
            lambda: MLPRegressor(hidden_layer_sizes=(64,), solver="adam", **settings),
            Xd,
            yd,
            args.repeat,
        )
        times["OrtGradientRegressor", dtype] = _best_time(
            lambda dtype=dtype: OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(64,)), optimizer="adam", dtype=dtype, **settings
            ),
            Xd,
            yd,
            args.repeat,
        )
    times["OrtGradientRegressor standard", "float32"] = _best_time(
        lambda: OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(64,)), optimizer="adam", backend="standard", **settings
        ),
        X.astype("float32"),
        y.astype("float32"),
        args.repeat,
    )
    times["OrtGradientRegressor standard", "float64"] = times["OrtGradientRegressor", "float64"]
    print(f"MLP (64,), 442 x 10, Adam, batch 32, {args.epochs} epochs, best of {args.repeat}")
    print(f"{'':31s}{'float32 (s)':>12s}{'float64 (s)':>12s}{'f64 / f32':>11s}")
    for name in ("MLPRegressor", "OrtGradientRegressor", "OrtGradientRegressor standard"):
        t32, t64 = times[name, "float32"], times[name, "float64"]
        print(f"{name:31s}{t32:12.3f}{t64:12.3f}{t64 / t32:11.2f}")
    for dtype in ("float32", "float64"):
        ratio = times["OrtGradientRegressor", dtype] / times["MLPRegressor", dtype]
        print(f"OrtGradientRegressor / MLPRegressor in {dtype}: {ratio:.2f}")
    return times


if __name__ == "__main__":
    main()
