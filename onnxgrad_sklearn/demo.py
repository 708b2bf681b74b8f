"""Demo: train an MLP on scikit-learn's diabetes data with onnxruntime-training.

Run with ``python -m onnxgrad_sklearn.demo [--epochs N] [--out FOLDER]``. It
prints the loss per epoch, the test R2 next to MLPRegressor's trained with the
same architecture, optimizer and epochs, and where the ONNX file and the PNG
of the loss curve (when matplotlib is installed) were written.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np

#: The defaults of the demo, shared by ``python -m onnxgrad_sklearn.demo`` and
#: ``onnxgrad-sklearn demo``.
DEFAULT_EPOCHS = 60
DEFAULT_OUT = "demo_output"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the demo's flags (``--epochs``, ``--out``) and their defaults to ``parser``."""
    parser.add_argument(
        "--epochs",
        type=_positive_int,
        default=DEFAULT_EPOCHS,
        metavar="N",
        help=f"training epochs (default: {DEFAULT_EPOCHS})",
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        metavar="FOLDER",
        help=f"folder for the ONNX model and the loss-curve PNG (default: {DEFAULT_OUT})",
    )
    return parser


def main(argv=None) -> int:
    """Parse the demo's flags, run it; return the exit code."""
    parser = add_arguments(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    return run(epochs=args.epochs, out=args.out)


def run(epochs: int = DEFAULT_EPOCHS, out: str = DEFAULT_OUT) -> int:
    """Run the demo for ``epochs`` epochs, writing its files into the folder ``out``."""
    from sklearn.datasets import load_diabetes
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import r2_score
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPRegressor
    from sklearn.preprocessing import StandardScaler

    from .optim import Nesterov
    from .regressor import OrtGradientRegressor
    from .runtime import import_onnxruntime

    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    y_mean, y_std = y_train.mean(), y_train.std()
    y_train_s = (y_train - y_mean) / y_std

    settings = dict(
        learning_rate_init=0.01, alpha=3.0, batch_size=32, max_iter=epochs, random_state=0
    )
    print(
        f"Diabetes: {X_train.shape[0]} training rows, {X_train.shape[1]} features; "
        f"MLP (64,), Nesterov momentum 0.9, alpha 3.0, {epochs} epochs"
    )

    def ours():
        template = MLPRegressor(hidden_layer_sizes=(64,))
        return OrtGradientRegressor(template, optimizer=Nesterov(momentum=0.9), **settings)

    def theirs():
        return MLPRegressor(
            hidden_layer_sizes=(64,),
            solver="sgd",
            momentum=0.9,
            nesterovs_momentum=True,
            **settings,
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        # each timed twice: the first fit of the process (onnx and onnxruntime imported,
        # the graphs built or read from the cache), then a second one
        ort_seconds, skl_seconds = [], []
        for _ in range(2):
            begin = time.perf_counter()
            reg = ours().fit(X_train, y_train_s)
            ort_seconds.append(time.perf_counter() - begin)
            begin = time.perf_counter()
            ref = theirs().fit(X_train, y_train_s)
            skl_seconds.append(time.perf_counter() - begin)

    for epoch, loss in enumerate(reg.loss_curve_, 1):
        print(f"epoch {epoch:3d}  loss {loss:.6f}")

    r2_ort = r2_score(y_test, reg.predict(X_test) * y_std + y_mean)
    r2_skl = r2_score(y_test, ref.predict(X_test) * y_std + y_mean)
    for name, r2, seconds in (
        ("OrtGradientRegressor:", r2_ort, ort_seconds),
        ("MLPRegressor (sgd):  ", r2_skl, skl_seconds),
    ):
        print(
            f"test R2  {name} {r2:.4f}  (first fit of the process {seconds[0]:.2f} s, "
            f"second fit {seconds[1]:.2f} s)"
        )

    os.makedirs(out, exist_ok=True)
    path = os.path.abspath(os.path.join(out, "diabetes_mlp.onnx"))
    with open(path, "wb") as f:
        f.write(reg.to_onnx().SerializeToString())
    sess = import_onnxruntime().InferenceSession(path, providers=["CPUExecutionProvider"])
    onnx_pred = sess.run(None, {"X": X_test.astype(np.float32)})[0].ravel()
    gap = np.max(np.abs(onnx_pred - reg.predict(X_test)))
    print(f"trained ONNX model written to {path}")
    print(f"onnxruntime on that file matches predict() to {gap:.2e}")

    png = os.path.splitext(path)[0] + ".png"
    try:
        import matplotlib
    except ImportError:
        print("loss-curve PNG skipped: matplotlib is not installed (pip install matplotlib)")
    else:
        matplotlib.use("Agg")  # write files only, no window
        import matplotlib.pyplot as plt

        from .plotting import plot_loss_curve

        fig, ax = plt.subplots(figsize=(7, 4.5))
        plot_loss_curve(reg, ax=ax)
        fig.savefig(png, dpi=100, bbox_inches="tight")
        plt.close(fig)
        print(f"loss curve written to {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
