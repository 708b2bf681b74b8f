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
    data = _diabetes()
    X_train = data[0]
    print(
        f"Diabetes: {X_train.shape[0]} training rows, {X_train.shape[1]} features; "
        f"MLP (64,), Nesterov momentum 0.9, alpha 3.0, {epochs} epochs"
    )
    reg, ref, seconds = _train(data, epochs)
    for epoch, loss in enumerate(reg.loss_curve_, 1):
        print(f"epoch {epoch:3d}  loss {loss:.6f}")
    _report(reg, ref, data, seconds)
    path = _write_onnx(reg, data[1], out)
    _write_plot(reg, os.path.splitext(path)[0] + ".png")
    return 0


def _diabetes():
    """The diabetes data split 3:1, the features standardised on the training rows:
    ``(X_train, X_test, y_train, y_test, y_mean, y_std)``."""
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    X, y = load_diabetes(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(X_train)
    X_train, X_test = scaler.transform(X_train), scaler.transform(X_test)
    return X_train, X_test, y_train, y_test, y_train.mean(), y_train.std()


def _train(data, epochs):
    """The package's fit and MLPRegressor's on the scaled targets, each timed twice: the
    first fit of the process (onnx and onnxruntime imported, the graphs built or read
    from the cache), then a second one. Returns both models and their seconds."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    from .optim import Nesterov
    from .regressor import OrtGradientRegressor

    X_train, _, y_train, _, y_mean, y_std = data
    y_scaled = (y_train - y_mean) / y_std
    settings = dict(
        learning_rate_init=0.01, alpha=3.0, batch_size=32, max_iter=epochs, random_state=0
    )

    def ours():
        template = MLPRegressor(hidden_layer_sizes=(64,))
        return OrtGradientRegressor(template, optimizer=Nesterov(momentum=0.9), **settings)

    def theirs():
        return MLPRegressor(
            hidden_layer_sizes=(64,), solver="sgd", momentum=0.9, nesterovs_momentum=True,
            **settings,
        )  # fmt: skip

    seconds = {"ours": [], "theirs": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for _ in range(2):
            for name, make in (("ours", ours), ("theirs", theirs)):
                begin = time.perf_counter()
                model = make().fit(X_train, y_scaled)
                seconds[name].append(time.perf_counter() - begin)
                if name == "ours":
                    reg = model
                else:
                    ref = model
    return reg, ref, seconds


def _report(reg, ref, data, seconds):
    """Print both models' test R2 and their fits' seconds."""
    from sklearn.metrics import r2_score

    _, X_test, _, y_test, y_mean, y_std = data
    for name, model, key in (
        ("OrtGradientRegressor:", reg, "ours"),
        ("MLPRegressor (sgd):  ", ref, "theirs"),
    ):
        r2 = r2_score(y_test, model.predict(X_test) * y_std + y_mean)
        first, second = seconds[key]
        print(
            f"test R2  {name} {r2:.4f}  (first fit of the process {first:.2f} s, "
            f"second fit {second:.2f} s)"
        )


def _write_onnx(reg, X_test, out) -> str:
    """Write the trained ONNX model into ``out``, check onnxruntime's predictions on it
    against ``predict``; return its path."""
    from .runtime import import_onnxruntime

    os.makedirs(out, exist_ok=True)
    path = os.path.abspath(os.path.join(out, "diabetes_mlp.onnx"))
    with open(path, "wb") as f:
        f.write(reg.to_onnx().SerializeToString())
    sess = import_onnxruntime().InferenceSession(path, providers=["CPUExecutionProvider"])
    onnx_pred = sess.run(None, {"X": X_test.astype(np.float32)})[0].ravel()
    gap = np.max(np.abs(onnx_pred - reg.predict(X_test)))
    print(f"trained ONNX model written to {path}")
    print(f"onnxruntime on that file matches predict() to {gap:.2e}")
    return path


def _write_plot(reg, png):
    """Write the loss curve to ``png`` where matplotlib is installed."""
    try:
        import matplotlib
    except ImportError:
        print("loss-curve PNG skipped: matplotlib is not installed (pip install matplotlib)")
        return
    matplotlib.use("Agg")  # write files only, no window
    import matplotlib.pyplot as plt

    from .plotting import plot_loss_curve

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plot_loss_curve(reg, ax=ax)
    fig.savefig(png, dpi=100, bbox_inches="tight")
    plt.close(fig)
    print(f"loss curve written to {png}")


if __name__ == "__main__":
    raise SystemExit(main())
