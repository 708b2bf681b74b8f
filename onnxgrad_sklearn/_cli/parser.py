"""The argument parser of the ``onnxgrad-sklearn`` command: its flags and their types."""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from .. import demo as _demo_module
from .._export import META_FEATURES
from .choose import _TEMPLATE_HELP, ONNX_TEMPLATE_HELP, TEMPLATES
from .common import (
    CLASSIFICATION_LOSSES,
    MAX_AUTO_CLASSES,
    OPTIMIZERS,
    PICKLE_SUFFIXES,
    POSITIVE_TARGET_LOSSES,
    PROG,
    REGRESSION_LOSSES,
    SKOPS_SUFFIXES,
)

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


# argument types -----------------------------------------------------------------------
def _checked(convert, accept, expected: str):
    """An argparse type: ``convert`` the text, then refuse values ``accept`` rejects."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _checked(int, lambda v: v >= 1, "a positive integer")
_positive_float = _checked(float, lambda v: v > 0 and math.isfinite(v), "a positive number")
_non_negative_float = _checked(float, lambda v: v >= 0 and math.isfinite(v), "a number >= 0")
_fraction = _checked(float, lambda v: 0 <= v < 1, "a number in [0, 1)")
_open_fraction = _checked(float, lambda v: 0 < v < 1, "a number in (0, 1)")


def _batch_size(text: str) -> str | int:
    if text == "auto":
        return "auto"
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected 'auto' or a positive integer, got {text!r}"
        ) from None


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive layer sizes such as 64,64, got {text!r}"
        )
    return sizes


# parser -------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``onnxgrad-sklearn`` command.

    Returns
    -------
    argparse.ArgumentParser
        Parser with the subcommands ``fit``, ``predict`` and ``demo``. Its
        errors print one line on stderr and exit with code 2.
    """
    from .._version import __version__

    parser = _Parser(
        prog=PROG,
        description="Train scikit-learn models on onnxruntime and export them to ONNX.",
        epilog=f"Run '{PROG} COMMAND --help' (fit, predict, demo) for the flags of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_fit_parser(commands)
    _add_predict_parser(commands)
    _add_demo_parser(commands)
    return parser


def _add_fit_parser(commands) -> argparse.ArgumentParser:
    fit = commands.add_parser(
        "fit",
        help="train a model on a CSV file, write the ONNX model and the fitted estimator",
        description=(
            "Train a scikit-learn model's weights with onnxruntime on a CSV file "
            "(a header row, one column per feature, every column but the target is a "
            "feature: numeric, or text one-hot encoded inside the model), print train and "
            "test metrics, write the trained ONNX model, the fitted estimator (skops, same "
            "path with .skops) and a PNG of the loss curve. With numeric columns only, the "
            "ONNX model takes one float input 'X' whose columns are the feature columns in "
            "the order of the CSV; with text columns, one input per column, named after it, "
            "of shape (n, 1): float for numeric columns, string for text ones. The names "
            f"are in its metadata ('{META_FEATURES}', comma-joined), which '{PROG} predict' "
            "reads. With --model PATH.onnx, an ONNX model of yours is the template: trained "
            "as it is (no StandardScaler in front), it is written back with the trained "
            "weights, its own input and outputs."
        ),
        epilog=(
            f"Example: {PROG} fit --data train.csv --target price --hidden 64,64 "
            "--optimizer adam --learning-rate 0.01 --epochs 100 --out price.onnx; then "
            f"{PROG} fit --data new.csv --target price --init price.skops --epochs 10 "
            "--out tuned.onnx fine-tunes it; "
            f"{PROG} fit --data train.csv --target price --model net.onnx --frozen 'encoder.*' "
            "--epochs 20 --out trained.onnx trains an ONNX model's other weights. "
            "Exit status: 0 on success, 2 on an error (reported on one line of stderr)."
        ),
    )
    _add_fit_data_flags(fit.add_argument_group("data"))
    _add_fit_model_flags(fit.add_argument_group("model"))
    _add_fit_loss_flags(fit.add_argument_group("loss and target"))
    _add_fit_training_flags(fit.add_argument_group("training"))
    _add_fit_output_flags(fit.add_argument_group("output"))
    return fit


def _add_fit_data_flags(group) -> None:
    group.add_argument(
        "--data", required=True, metavar="CSV", help="CSV file to train on (required)"
    )
    group.add_argument(
        "--target",
        required=True,
        metavar="COLUMN",
        help="name of the column to predict (required); every other column is a feature",
    )
    group.add_argument(
        "--test-size",
        type=_fraction,
        default=0.2,
        metavar="FRACTION",
        help=(
            "share of the rows held out for the test metrics, in [0, 1); 0 trains on all "
            "rows and prints train metrics only (default: 0.2)"
        ),
    )
    group.add_argument(
        "--task",
        choices=("auto", "regression", "classification"),
        default="auto",
        help=(
            "'auto' (default): the task of the model given to --init; otherwise "
            "classification when the target column is not numeric (strings, booleans) or "
            f"holds only whole numbers with at most {MAX_AUTO_CLASSES} distinct values, "
            "regression otherwise"
        ),
    )


def _add_fit_model_flags(group) -> None:
    kinds = "; ".join(f"'{k}': {_TEMPLATE_HELP.get(k, k)}" for k in TEMPLATES)
    group.add_argument(
        "--model",
        default=None,
        metavar="|".join(TEMPLATES) + "|PATH.onnx",
        help=(
            f"the template to train from scratch: {kinds} (default: mlp); or PATH.onnx: "
            f"{ONNX_TEMPLATE_HELP}. Deprecated: another model file (.skops, pickle) given "
            "here is read as --init PATH"
        ),
    )
    group.add_argument(
        "--init",
        default=None,
        metavar="PATH",
        help=(
            "fine-tune a saved model instead: the .skops file a previous fit wrote (its "
            "weights and target scaling carry over), or a scikit-learn model or Pipeline "
            f"saved with skops (.skops) or pickle/joblib ({', '.join(PICKLE_SUFFIXES)}: only "
            "load files you trust, unpickling runs code), fine-tuned from its weights if "
            "fitted"
        ),
    )
    group.add_argument(
        "--trust",
        action="store_true",
        help=(
            "load the types of a .skops file that neither skops nor onnxgrad_sklearn "
            "trusts (without it such a file is refused, and the types are listed)"
        ),
    )
    group.add_argument(
        "--hidden",
        type=_hidden,
        default=None,
        metavar="N[,N...]",
        help="hidden layer sizes of --model mlp, comma-separated (default: 64)",
    )
    group.add_argument(
        "--trainable",
        nargs="+",
        action="extend",
        default=None,
        metavar="PATTERN",
        help=(
            "with --model PATH.onnx: the initializers to train, names or glob patterns "
            "such as 'fc.*' (default: every floating-point initializer the prediction "
            "depends on, but shapes, indices and BatchNormalization's running statistics)"
        ),
    )
    group.add_argument(
        "--frozen",
        nargs="+",
        action="extend",
        default=None,
        metavar="PATTERN",
        help=(
            "with --model PATH.onnx: initializers not to train, names or glob patterns "
            "(transfer learning): they are written back bit for bit"
        ),
    )
    group.add_argument(
        "--output",
        default=None,
        metavar="NAME",
        help=(
            "with --model PATH.onnx: the graph output that is the prediction (default: "
            "its first output); the written model keeps all its outputs"
        ),
    )


def _add_fit_loss_flags(group) -> None:
    group.add_argument(
        "--loss",
        choices=REGRESSION_LOSSES + CLASSIFICATION_LOSSES,
        default=None,
        metavar="NAME",
        help=(
            f"training loss: {', '.join(REGRESSION_LOSSES)} for regression (default: "
            f"squared_error, or the loss of the --init estimator), "
            f"{', '.join(CLASSIFICATION_LOSSES)} for classification (default: log_loss)"
        ),
    )
    group.add_argument(
        "--quantile",
        type=_open_fraction,
        default=None,
        metavar="Q",
        help=(
            "the quantile the quantile loss estimates, in (0, 1): the prediction leaves a "
            "share Q of the targets below it; implies --loss quantile (default: 0.5)"
        ),
    )
    group.add_argument(
        "--epsilon",
        type=_positive_float,
        default=None,
        metavar="E",
        help=(
            "the epsilon of huber (where it turns linear, default 1.35) or of the "
            "epsilon-insensitive losses, in units of the training target (standard "
            "deviations when the target is scaled); implies --loss huber"
        ),
    )
    group.add_argument(
        "--no-scale-target",
        dest="scale_target",
        action="store_false",
        help=(
            "train on the raw regression target. By default it is standardised for "
            "training (mean and standard deviation of the training rows) for losses on "
            f"real values (not {', '.join(POSITIVE_TARGET_LOSSES)}), and the ONNX model and "
            "the saved estimator predict raw values. A fitted --init model keeps its own "
            "scaling"
        ),
    )


def _add_fit_training_flags(group) -> None:
    group.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        default="adam",
        help="update rule, as in MLPRegressor (default: adam)",
    )
    group.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=0.001,
        metavar="LR",
        help="initial learning rate (default: 0.001)",
    )
    group.add_argument(
        "--batch-size",
        type=_batch_size,
        default="auto",
        metavar="auto|N",
        help="rows per batch; auto means min(200, training rows) (default: auto)",
    )
    group.add_argument(
        "--epochs", type=_positive_int, default=50, metavar="N", help="epochs (default: 50)"
    )
    group.add_argument(
        "--alpha",
        type=_non_negative_float,
        default=0.0001,
        help="L2 penalty on the weight matrices, as in MLPRegressor (default: 0.0001)",
    )
    group.add_argument(
        "--dtype",
        choices=("float32", "float64"),
        default=None,
        help=(
            "the float type training computes in, and of the ONNX model's float inputs: "
            "float32 (default, the fastest) or float64 (scikit-learn's own precision, on "
            "the standard backend); with --model PATH.onnx, the model's own float type "
            "by default (another one casts the graph)"
        ),
    )
    group.add_argument(
        "--random-state",
        type=int,
        default=None,
        metavar="N",
        help=(
            "seed of the initial weights, the shuffling and the train/test split "
            "(default: not seeded)"
        ),
    )


def _add_fit_output_flags(group) -> None:
    group.add_argument(
        "--out",
        default="model.onnx",
        metavar="PATH",
        help=(
            "where to write the trained ONNX model (default: model.onnx); the fitted "
            "estimator goes beside it with .skops (skipped with a warning when skops is "
            "not installed)"
        ),
    )
    group.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help=(
            "where to write the loss-curve PNG (default: the --out path with .png); "
            "skipped with a warning when matplotlib is not installed"
        ),
    )
    verbosity = group.add_mutually_exclusive_group()
    verbosity.add_argument(
        "--verbose",
        dest="verbose",
        action="store_true",
        default=True,
        help="show a progress bar over epochs on stderr (the default)",
    )
    verbosity.add_argument(
        "--quiet",
        dest="verbose",
        action="store_false",
        help="no progress bar; the summary, metrics and paths are still printed",
    )


def _add_predict_parser(commands) -> argparse.ArgumentParser:
    predict = commands.add_parser(
        "predict",
        help="predict with a written model (ONNX or saved estimator) on a CSV file",
        description=(
            "Run a model written by 'fit' on a CSV file: the ONNX model (.onnx) or the "
            f"saved estimator ({', '.join(SKOPS_SUFFIXES + PICKLE_SUFFIXES)}). The model's "
            "feature columns are taken by name (the ONNX model's metadata, the estimator's "
            "feature_names_in_); other columns, such as the target of a training CSV, are "
            "ignored. Writes a CSV with a 'prediction' column, and for a classifier one "
            "'proba_CLASS' column per class."
        ),
        epilog=(
            f"Example: {PROG} predict --model price.onnx --data new.csv --out pred.csv. "
            "Exit status: 0 on success, 2 on an error (reported on one line of stderr)."
        ),
    )
    predict.add_argument(
        "--model",
        required=True,
        metavar="PATH",
        help=(
            "the model: a .onnx file, or an estimator saved with skops (.skops) or "
            f"pickle/joblib ({', '.join(PICKLE_SUFFIXES)}: only load files you trust) "
            "(required)"
        ),
    )
    predict.add_argument(
        "--data", required=True, metavar="CSV", help="CSV file to predict on (required)"
    )
    predict.add_argument(
        "--out",
        default=None,
        metavar="CSV",
        help="where to write the predictions (default: the standard output)",
    )
    predict.add_argument(
        "--trust",
        action="store_true",
        help="load the types of a .skops file that neither skops nor onnxgrad_sklearn trusts",
    )
    return predict


def _add_demo_parser(commands) -> argparse.ArgumentParser:
    demo = commands.add_parser(
        "demo",
        help="train an MLP on scikit-learn's diabetes data (the README's demo)",
        description=(
            "Train an MLP on scikit-learn's diabetes data with onnxruntime-training, compare "
            "it with MLPRegressor, write the ONNX model and its loss curve."
        ),
    )
    return _demo_module.add_arguments(demo)
