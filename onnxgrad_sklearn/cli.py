"""Command line of onnxgrad-sklearn.

``onnxgrad-sklearn fit`` trains a model on a CSV file with onnxruntime and
writes the trained ONNX model, the fitted estimator (skops) and its loss
curve; ``onnxgrad-sklearn predict`` runs a written model (ONNX or saved
estimator) on a CSV file; ``onnxgrad-sklearn demo`` runs the demo of the
README. Run ``onnxgrad-sklearn COMMAND --help`` for the flags. Errors are
reported on one line of stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from . import demo as _demo_module
from . import losses as _losses
from . import optim as _optim
from ._export import (
    META_CLASSES,
    META_FEATURES,
    META_FEATURES_JSON,
    _scaling,
    export_onnx,
)

__all__ = ["build_parser", "infer_task", "main"]

PROG = "onnxgrad-sklearn"

#: With ``--task auto``, a numeric target of whole numbers with at most this many
#: distinct values is a classification target.
MAX_AUTO_CLASSES = 20


#: The loss names of each task, from :mod:`onnxgrad_sklearn.losses`.
REGRESSION_LOSSES = tuple(_losses.REGRESSION_LOSSES)
CLASSIFICATION_LOSSES = tuple(_losses.CLASSIFICATION_LOSSES)
#: Losses of positive targets (log link): their targets are never standardised.
POSITIVE_TARGET_LOSSES = ("poisson", "gamma", "tweedie")
#: The optimizer names :func:`onnxgrad_sklearn.optim.get_optimizer` knows.
OPTIMIZERS = tuple(sorted(_optim._OPTIMIZERS))
#: Loss parameters set from a flag: flag -> (parameter, the loss it implies).
LOSS_FLAGS = {"quantile": ("quantile", "quantile"), "epsilon": ("epsilon", "huber")}

PICKLE_SUFFIXES = (".pkl", ".pickle", ".joblib")
SKOPS_SUFFIXES = (".skops",)
ONNX_SUFFIXES = (".onnx",)

_MATPLOTLIB_HINT = "pip install matplotlib, or pip install 'onnxgrad-sklearn[plot]'"
_SKOPS_HINT = "pip install skops, or pip install 'onnxgrad-sklearn[skops]'"


class CLIError(Exception):
    """An error reported to the user on one line, with exit code 2."""


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line on stderr (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


# argument types ---------------------------------------------------------------
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


# templates ----------------------------------------------------------------------
def _mlp_template(task: str, hidden, loss=None):
    from sklearn.neural_network import MLPClassifier, MLPRegressor

    cls = MLPClassifier if task == "classification" else MLPRegressor
    return cls(hidden_layer_sizes=hidden or (64,))


def _linear_template(task: str, hidden, loss=None):
    from sklearn import linear_model as lm

    if task == "classification":
        return lm.LogisticRegression()
    # a log-link loss needs a linear model that predicts exp of its output: the GLM
    glm = {
        "poisson": lm.PoissonRegressor,
        "gamma": lm.GammaRegressor,
        "tweedie": lambda: lm.TweedieRegressor(link="log"),
    }.get(loss)
    return lm.LinearRegression() if glm is None else glm()  # --alpha is the penalty


#: ``--model KIND``: the final model of each template kind (after a StandardScaler).
TEMPLATES = {"mlp": _mlp_template, "linear": _linear_template}
_TEMPLATE_HELP = {
    "mlp": "StandardScaler + MLPRegressor or MLPClassifier",
    "linear": (
        "StandardScaler + LinearRegression (PoissonRegressor, GammaRegressor or "
        "TweedieRegressor(link='log') with those losses) or LogisticRegression"
    ),
}


# parser -------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``onnxgrad-sklearn`` command.

    Returns
    -------
    argparse.ArgumentParser
        Parser with the subcommands ``fit``, ``predict`` and ``demo``. Its
        errors print one line on stderr and exit with code 2.
    """
    from ._version import __version__

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
            "reads."
        ),
        epilog=(
            f"Example: {PROG} fit --data train.csv --target price --hidden 64,64 "
            "--optimizer adam --learning-rate 0.01 --epochs 100 --out price.onnx; then "
            f"{PROG} fit --data new.csv --target price --init price.skops --epochs 10 "
            "--out tuned.onnx fine-tunes it. "
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
        metavar="|".join(TEMPLATES),
        help=(
            f"the template to train from scratch: {kinds} (default: mlp). Deprecated: a "
            "model file given here is read as --init PATH"
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
        default="float32",
        help=(
            "the float type training computes in, and of the ONNX model's float inputs: "
            "float32 (default, the fastest) or float64 (scikit-learn's own precision, on "
            "the standard backend)"
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


# helpers --------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _quoted(names: Sequence[Any], limit: int = 10) -> str:
    shown = ", ".join(repr(str(n)) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def infer_task(y: Any) -> str:
    """Tell whether a target column is a regression or a classification target.

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        The target values (without missing values).

    Returns
    -------
    str
        ``"classification"`` when ``y`` is not numeric (strings, booleans,
        categories) or holds only whole numbers with at most
        ``MAX_AUTO_CLASSES`` (20) distinct values; ``"regression"`` otherwise.
    """
    import numpy as np
    import pandas as pd

    series = pd.Series(y)
    if series.dtype == bool or not pd.api.types.is_numeric_dtype(series):
        return "classification"
    values = series.to_numpy(dtype=np.float64)
    whole = bool(np.all(np.isfinite(values)) and np.all(values == np.round(values)))
    if whole and np.unique(values).size <= MAX_AUTO_CLASSES:
        return "classification"
    return "regression"


def _read_csv(path: str):
    try:
        import pandas as pd
    except ImportError as exc:
        raise ImportError(
            f"{PROG} reads CSV files with pandas, which is not installed: pip install pandas"
        ) from exc
    if not os.path.exists(path):
        raise CLIError(f"data file not found: {path}")
    if not os.path.isfile(path):
        raise CLIError(f"data path is not a file: {path}")
    try:
        frame = pd.read_csv(path)
    except (ValueError, OSError) as exc:  # ParserError, EmptyDataError, UnicodeDecodeError
        raise CLIError(f"cannot read CSV file {path}: {_one_line(exc)}") from exc
    if frame.shape[0] == 0:
        raise CLIError(f"CSV file {path} has no data rows")
    return frame.set_axis([str(c) for c in frame.columns], axis=1)


def _text_columns(frame, features: Sequence[str]) -> list[str]:
    """The feature columns that are not numeric (strings, categories): one-hot encoded."""
    import pandas as pd

    return [c for c in features if not pd.api.types.is_numeric_dtype(frame[c])]


def _feature_frame(frame, features: Sequence[str], text: Sequence[str] = ()):
    """The feature columns once checked complete: numeric ones as float64, text as str.

    Text columns (strings, categories, and those in ``text``: a model's text
    columns, whatever their values in this file) are one-hot encoded inside the model.
    """
    import numpy as np

    features = list(features)
    missing = frame[features].isna().sum()
    missing = missing[missing > 0]
    if len(missing):
        column, count = missing.index[0], int(missing.iloc[0])
        raise CLIError(
            f"feature column {column!r} has {count} missing values"
            + (f" (and {len(missing) - 1} more columns have some)" if len(missing) > 1 else "")
            + ": fill or drop them first"
        )
    text = set(_text_columns(frame, features)) | set(text)
    return frame[features].astype({c: (str if c in text else np.float64) for c in features})


def _load_model(path: str, trust: bool, what: str = "the model"):
    """Load a saved estimator (skops, pickle or joblib)."""
    lower = path.lower()
    if lower.endswith(SKOPS_SUFFIXES):
        return _load_skops(path, trust)
    if lower.endswith(PICKLE_SUFFIXES):
        import joblib

        try:
            return joblib.load(path)
        except Exception as exc:  # a corrupt or foreign file fails in many ways
            raise CLIError(f"cannot load {what} in {path}: {_one_line(exc)}") from exc
    raise CLIError(
        f"cannot tell how to load {path}: a model file ends with "
        f"{', '.join(SKOPS_SUFFIXES + PICKLE_SUFFIXES)}"
    )


def _load_skops(path: str, trust: bool):
    try:
        import skops.io as sio
    except ImportError as exc:
        raise ImportError(
            f"loading {path} needs skops, which is not installed: {_SKOPS_HINT}"
        ) from exc
    from ._trusted import SKOPS_TRUSTED_TYPES

    try:
        untrusted = sio.get_untrusted_types(file=path)
    except Exception as exc:  # not a skops file (zipfile.BadZipFile, ...)
        raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc
    unknown = [t for t in untrusted if t not in SKOPS_TRUSTED_TYPES]
    if unknown and not trust:
        raise CLIError(
            f"{path} holds types skops does not trust by default: {', '.join(unknown)}; "
            "check them and pass --trust to load it"
        )
    try:
        return sio.load(path, trusted=list(SKOPS_TRUSTED_TYPES) + unknown)
    except Exception as exc:
        raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc


def _is_fitted(model) -> bool:
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    try:
        check_is_fitted(model)
    except (NotFittedError, TypeError):
        return False
    return True


def _parent(path: str) -> None:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"cannot create the folder {folder}: {exc.strerror or exc}") from exc


# fit: data --------------------------------------------------------------------------
@dataclass
class _Data:
    path: str
    target: str
    X: Any  # DataFrame of the feature columns: float64, and str for the text ones
    y: Any  # ndarray
    features: list[str]
    text: list[str] = field(default_factory=list)  # the text columns, one-hot encoded


def _read_training_data(args) -> _Data:
    frame = _read_csv(args.data)
    columns = list(frame.columns)
    if args.target not in columns:
        close = difflib.get_close_matches(args.target, columns, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CLIError(
            f"target column {args.target!r} not found in {args.data}{hint}; its columns are "
            f"{_quoted(columns)}"
        )
    features = [c for c in columns if c != args.target]
    if not features:
        raise CLIError(
            f"{args.data} has no feature column: every column but the target is a feature"
        )
    X = _feature_frame(frame, features)
    y = frame[args.target]
    if y.isna().any():
        raise CLIError(
            f"target column {args.target!r} has {int(y.isna().sum())} missing values: "
            "drop those rows first"
        )
    import pandas as pd

    if isinstance(y.dtype, pd.CategoricalDtype) or y.dtype == bool:
        y = y.astype(str)
    return _Data(args.data, args.target, X, y.to_numpy(), features, _text_columns(X, features))


# fit: choose the template -----------------------------------------------------------
@dataclass
class _Template:
    template: Any
    task: str
    how: str  # how the task was chosen, for the summary
    origin: str = ""  # where the template comes from, for the summary
    fitted: bool = False  # a fitted template: fine-tuned from its weights
    target_scaler: Any = None  # the --init model's fitted target scaler
    loss: Any = None  # the --init estimator's loss


def _choose_template(args, data: _Data) -> _Template:
    init = args.init
    if args.model is not None and args.model not in TEMPLATES:
        if init is not None or not _looks_like_path(args.model):
            raise CLIError(
                f"--model takes {' or '.join(TEMPLATES)}, got {args.model!r} (a saved model "
                "to fine-tune goes to --init PATH)"
            )
        _warn(f"--model PATH is deprecated, use --init {args.model}")
        init = args.model
    elif args.model is not None and init is not None:
        raise CLIError(
            f"--model {args.model} trains a new template, --init fine-tunes a saved model: "
            "give one of them"
        )
    if init is None:
        return _new_template(args, data, args.model or "mlp")
    if args.hidden is not None:
        raise CLIError("--hidden applies to --model mlp only, not to an --init model")
    return _init_template(args, data, init)


def _looks_like_path(text: str) -> bool:
    return os.path.exists(text) or text.lower().endswith(
        SKOPS_SUFFIXES + PICKLE_SUFFIXES + (os.sep, "/")
    )


def _new_template(args, data: _Data, kind: str) -> _Template:
    if args.hidden is not None and kind != "mlp":
        raise CLIError("--hidden applies to --model mlp only")
    task = infer_task(data.y) if args.task == "auto" else args.task
    final = TEMPLATES[kind](task, args.hidden, args.loss)
    how = " (auto)" if args.task == "auto" else ""
    return _Template(_preprocessed(final, data), task, how)


def _preprocessed(final, data: _Data):
    """``final`` after a StandardScaler, or with text columns after a ColumnTransformer.

    The ColumnTransformer scales the numeric columns and one-hot encodes the text
    ones (a category unseen in training encodes as zeros), selecting them by name:
    the estimator then trains on the DataFrame, and its ONNX model takes one
    input per column.
    """
    from sklearn.compose import ColumnTransformer
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    if not data.text:
        return make_pipeline(StandardScaler(), final)
    numeric = [c for c in data.features if c not in data.text]
    columns = ColumnTransformer(
        [("scale", StandardScaler(), numeric)] * bool(numeric)
        + [("onehot", OneHotEncoder(handle_unknown="ignore"), list(data.text))]
    )
    return Pipeline([("columns", columns), (type(final).__name__.lower(), final)])


def _init_template(args, data: _Data, path: str) -> _Template:
    from sklearn.base import is_classifier, is_regressor

    if not os.path.exists(path):
        raise CLIError(
            f"model file not found: {path} (--init takes the path of a "
            f"{', '.join(SKOPS_SUFFIXES + PICKLE_SUFFIXES)} file)"
        )
    loaded = _load_model(path, args.trust)
    if not (hasattr(loaded, "fit") and hasattr(loaded, "predict")):
        raise CLIError(
            f"{path} does not hold a scikit-learn estimator (got {type(loaded).__name__})"
        )
    template, scaler, saved = _unwrap(loaded, path)
    if is_classifier(template):
        task = "classification"
    elif is_regressor(template):
        task = "regression"
    else:
        raise CLIError(
            f"the model in {path} ({type(template).__name__}) is neither a regressor nor "
            "a classifier"
        )
    if args.task not in ("auto", task):
        raise CLIError(f"--task {args.task}, but the model in {path} is a {task} model")
    fitted = _is_fitted(template)
    reordered = _order_columns(data, loaded, template, fitted, path)
    origin = f", {'fine-tuned from' if fitted else 'initialised, unfitted, from'} {path}"
    if reordered:
        origin += ", columns reordered as the model was fitted"
    how = f" (from {path})" if args.task == "auto" else ""
    loss = getattr(saved, "loss", None)
    return _Template(template, task, how, origin, fitted, scaler, loss)


def _unwrap(loaded, path: str):
    """The template inside a loaded model, its target scaler, and the estimator of ours."""
    from sklearn.compose import TransformedTargetRegressor

    from ._base import BaseOrtGradient

    scaler = None
    model = loaded
    if isinstance(model, TransformedTargetRegressor):
        if not _is_fitted(model):
            raise CLIError(f"the TransformedTargetRegressor in {path} is not fitted")
        scaler = model.transformer_
        if not (hasattr(scaler, "mean_") or hasattr(scaler, "scale_")):
            raise CLIError(
                f"the target transformer of the model in {path} ({type(scaler).__name__}) "
                "is not a StandardScaler: only a standardised target can be fine-tuned"
            )
        model = model.regressor_
    if isinstance(model, BaseOrtGradient):
        if not _is_fitted(model):
            return model._template(), scaler, model
        return model.estimator_, scaler, model
    return model, scaler, None


def _order_columns(data: _Data, loaded, template, fitted: bool, path: str) -> bool:
    """Put the data's columns in the order the fitted model takes; True if reordered."""
    if not fitted:
        return False
    names = getattr(loaded, "feature_names_in_", None)
    if names is None:
        names = getattr(template, "feature_names_in_", None)
    n_in = getattr(template, "n_features_in_", None)
    if names is None:
        if n_in is not None and n_in != len(data.features):
            raise CLIError(
                f"the model in {path} expects {n_in} features, the data has "
                f"{len(data.features)} feature columns (every column but the target)"
            )
        return False
    names = [str(n) for n in names]
    absent = [n for n in names if n not in data.features]
    if absent:
        raise CLIError(
            f"the model in {path} was fitted on columns missing from the data: {_quoted(absent)}"
        )
    extra = [n for n in data.features if n not in names]
    if extra:
        raise CLIError(
            f"the data has feature columns the model in {path} was not fitted on: "
            f"{_quoted(extra)}; drop them from the CSV"
        )
    if names == data.features:
        return False
    data.X, data.features = data.X[names], names
    return True


# fit: check the target and the loss -------------------------------------------------
def _check_target(data: _Data, task: str):
    import numpy as np

    y = np.asarray(data.y)
    if task == "regression":
        if not np.issubdtype(y.dtype, np.number):
            raise CLIError(
                f"target column {data.target!r} is not numeric, a regression needs numbers "
                "(use --task classification for labels)"
            )
        return y.astype(np.float64)
    if np.issubdtype(y.dtype, np.floating) and not np.all(y == np.round(y)):
        raise CLIError(
            f"target column {data.target!r} holds continuous values, a classification "
            "needs labels (use --task regression)"
        )
    return y


def _choose_loss(args, chosen: _Template):
    """The loss to train with: a name, or a loss object when a flag sets its parameter."""
    from sklearn.base import clone

    flags = {flag: getattr(args, flag) for flag in LOSS_FLAGS if getattr(args, flag) is not None}
    name = args.loss
    if name is None and flags:
        implied = {LOSS_FLAGS[flag][1] for flag in flags}
        if len(implied) > 1:
            raise CLIError(
                f"{' and '.join('--' + f for f in flags)} set different losses: give one"
            )
        name = implied.pop()
    if name is None:
        if chosen.loss is not None and chosen.task == "regression":
            return chosen.loss if isinstance(chosen.loss, str) else clone(chosen.loss)
        name = "log_loss" if chosen.task == "classification" else "squared_error"
    allowed = CLASSIFICATION_LOSSES if chosen.task == "classification" else REGRESSION_LOSSES
    if name not in allowed:
        raise CLIError(f"--loss {name} does not apply to {chosen.task}: use {', '.join(allowed)}")
    if not flags:
        return name
    loss = _losses.get_loss(name)
    params = loss.get_params()
    for flag, value in flags.items():
        param = LOSS_FLAGS[flag][0]
        if param not in params:
            raise CLIError(f"--{flag} applies to --loss {LOSS_FLAGS[flag][1]} only, not {name}")
        loss.set_params(**{param: value})
    return loss


def _loss_text(loss) -> str:
    if isinstance(loss, str):
        return loss
    names = [n for n, cls in _losses._LOSSES.items() if type(loss) is cls]
    params = ", ".join(f"{k}={v!r}" for k, v in loss.get_params().items())
    return (names[0] if names else type(loss).__name__) + (f" ({params})" if params else "")


def _loss_name(loss) -> str:
    if isinstance(loss, str):
        return loss
    names = [n for n, cls in _losses._LOSSES.items() if type(loss) is cls]
    return names[0] if names else type(loss).__name__


# fit: split and target scaling ------------------------------------------------------
@dataclass
class _Split:
    X_train: Any
    X_test: Any
    y_train: Any
    y_test: Any


def _split(X, y, task: str, test_size: float, random_state) -> _Split:
    if test_size == 0:
        return _Split(X, None, y, None)
    from sklearn.model_selection import train_test_split

    n_test = math.ceil(test_size * len(y))
    if len(y) - n_test < 2:
        raise CLIError(
            f"--test-size {test_size} leaves {len(y) - n_test} training rows out of {len(y)}: "
            "use a smaller --test-size (0 trains on all rows)"
        )
    if task == "classification":
        try:
            return _Split(
                *train_test_split(X, y, test_size=test_size, random_state=random_state, stratify=y)
            )
        except ValueError:  # a class too rare to stratify: split without it
            pass
    return _Split(*train_test_split(X, y, test_size=test_size, random_state=random_state))


def _target_scaler(args, chosen: _Template, loss, y_train):
    """The fitted StandardScaler of the training target, or None (and why not)."""
    if chosen.task != "regression":
        return None, ""
    if chosen.target_scaler is not None:
        if not args.scale_target:
            raise CLIError(
                "--no-scale-target: the --init model was trained on a standardised target, "
                "its weights only hold with its scaling (drop --no-scale-target)"
            )
        return chosen.target_scaler, "the --init model's scaling"
    if not args.scale_target:
        return None, "raw (--no-scale-target)"
    if chosen.fitted:
        return None, "raw (the fitted --init model predicts raw targets)"
    name = _loss_name(loss)
    if name.startswith(POSITIVE_TARGET_LOSSES):
        return None, f"raw (loss {name} takes positive targets)"
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit(y_train.reshape(-1, 1)), "standardised for training"


# fit: train -------------------------------------------------------------------------
def _make_estimator(args, chosen: _Template, loss):
    from .classifier import OrtGradientClassifier
    from .regressor import OrtGradientRegressor

    cls = OrtGradientClassifier if chosen.task == "classification" else OrtGradientRegressor
    # every setting explicit, so that the CLI does not follow the estimators' defaults
    return cls(
        chosen.template,
        loss=loss,
        optimizer=args.optimizer,
        learning_rate="constant",
        learning_rate_init=args.learning_rate,
        batch_size=args.batch_size,
        max_iter=args.epochs,
        alpha=args.alpha,
        random_state=args.random_state,
        verbose=1 if args.verbose else 0,
        dtype=args.dtype,
    )


def _train(est, split: _Split, scaler):
    """Fit ``est`` (on the scaled target); return the model that predicts raw targets."""
    from sklearn.exceptions import ConvergenceWarning

    from .runtime import import_onnxruntime

    onnxruntime = import_onnxruntime()  # without the training build's Python modules
    # the runtime's own warnings (graph clean-ups when sessions are built) would
    # interleave with the progress bar; errors still show
    onnxruntime.set_default_logger_severity(3)
    y = split.y_train
    if scaler is not None:
        y = scaler.transform(y.reshape(-1, 1)).ravel()
    begin = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(split.X_train, y)
    seconds = time.perf_counter() - begin
    for message in dict.fromkeys(str(w.message) for w in caught):
        _warn(" ".join(message.split()))
    return (est if scaler is None else _with_target_scaling(est, scaler)), seconds


def _with_target_scaling(est, scaler):
    """A fitted TransformedTargetRegressor of ``est`` (trained on scaled targets)."""
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.preprocessing import StandardScaler

    model = TransformedTargetRegressor(regressor=est, transformer=StandardScaler())
    # what TransformedTargetRegressor.fit sets, without training a clone of est again
    model.regressor_ = est
    model.transformer_ = scaler
    model._training_dim = 1
    if hasattr(est, "feature_names_in_"):
        model.feature_names_in_ = est.feature_names_in_
    return model


# fit: report ------------------------------------------------------------------------
def _print_summary(args, data: _Data, chosen: _Template, loss, split: _Split, scaling: str):
    import numpy as np

    encoded = f"; text columns one-hot encoded in the model: {_quoted(data.text, 8)}"
    print(
        f"data: {data.path}, {len(data.y)} rows, {len(data.features)} features "
        f"({_quoted(data.features, 8)}), target {data.target!r}" + encoded * bool(data.text)
    )
    task_text = f"task: {chosen.task}{chosen.how}"
    if chosen.task == "classification":
        classes = np.unique(data.y)
        task_text += f", {len(classes)} classes: {_quoted(list(classes), 8)}"
    print(task_text)
    print(
        f"model: {_describe(chosen.template)}{chosen.origin}; loss {_loss_text(loss)}, "
        f"optimizer {args.optimizer}, learning rate {args.learning_rate:g}, batch size "
        f"{args.batch_size}, {args.epochs} epochs, alpha {args.alpha:g}, {args.dtype}"
    )
    if scaling:
        print(f"target: {scaling}")
    held = f", {len(split.y_test)} test rows" if split.y_test is not None else ", no test rows"
    print(f"split: {len(split.y_train)} training rows{held}")


def _describe(template) -> str:
    steps = getattr(template, "steps", None)
    if not steps:
        return _describe_one(template)
    return "Pipeline(" + ", ".join(_describe_one(step) for _, step in steps) + ")"


def _describe_one(model) -> str:
    hidden = getattr(model, "hidden_layer_sizes", None)
    if hidden is not None and hasattr(model, "activation"):
        sizes = (hidden,) if isinstance(hidden, int) else tuple(hidden)
        return f"{type(model).__name__}(hidden_layer_sizes={sizes})"
    return type(model).__name__


def _print_training(est, args, seconds: float, scaled: bool) -> None:
    stopped = ""
    if est.n_iter_ < args.epochs:
        stopped = (
            f" (stopped early: the training loss improved by less than {est.tol:g} "
            f"for {est.n_iter_no_change} epochs)"
        )
    on = " (of the standardised target)" if scaled else ""
    print(
        f"trained {est.n_iter_} epochs in {seconds:.2f} s, final training loss "
        f"{est.loss_curve_[-1]:.6g}{on}{stopped}"
    )


def _metrics(model, task: str, X, y) -> dict[str, float]:
    import numpy as np
    from sklearn.metrics import accuracy_score, mean_absolute_error, r2_score

    if task == "regression":
        pred = model.predict(X)
        r2 = r2_score(y, pred) if len(y) > 1 else float("nan")
        return {"R2": r2, "MAE": mean_absolute_error(y, pred)}
    log_proba = model.predict_log_proba(X)
    pred = model.classes_[log_proba.argmax(axis=1)]
    known = np.isin(y, model.classes_)  # a test label absent from training has no probability
    index = np.searchsorted(model.classes_, y[known])
    picked = log_proba[known][np.arange(index.size), index]
    logloss = float(-picked.mean()) if index.size else float("nan")
    return {"accuracy": accuracy_score(y, pred), "log-loss": logloss}


def _print_metrics(model, task: str, split: _Split) -> None:
    train = _metrics(model, task, split.X_train, split.y_train)
    test = _metrics(model, task, split.X_test, split.y_test) if split.y_test is not None else None
    print(f"{'':12s}{'train':>12s}" + (f"{'test':>12s}" if test is not None else ""))
    for name, value in train.items():
        line = f"{name:12s}{value:12.6g}"
        if test is not None:
            line += f"{test[name]:12.6g}"
        print(line)


# fit: write outputs -----------------------------------------------------------------
@dataclass
class _Outputs:
    onnx: str
    skops: str
    png: str


def _output_paths(args) -> _Outputs:
    out = os.path.abspath(args.out)
    paths = _Outputs(
        out,
        os.path.splitext(out)[0] + SKOPS_SUFFIXES[0],
        os.path.abspath(args.plot or os.path.splitext(args.out)[0] + ".png"),
    )
    _parent(paths.onnx)  # fail before training, not after
    _parent(paths.png)
    return paths


def _write_onnx(model, data: _Data, path: str) -> None:
    onnx_model = export_onnx(model, data.features, data.target)
    try:
        with open(path, "wb") as f:
            f.write(onnx_model.SerializeToString())
    except OSError as exc:
        raise CLIError(f"cannot write the ONNX model to {path}: {exc.strerror or exc}") from exc
    outputs = ", ".join(o.name for o in onnx_model.graph.output)
    inputs = list(onnx_model.graph.input)
    if len(inputs) == 1:
        kind = _onnx_type(inputs[0])
        described = (
            f"input {inputs[0].name}: {kind} of shape (n, {len(data.features)}), columns "
            f"{_quoted(data.features, 8)}"
        )
    else:
        shown = ", ".join(f"{i.name!r}: {_onnx_type(i)}" for i in inputs[:8])
        more = f" and {len(inputs) - 8} more" if len(inputs) > 8 else ""
        described = f"{len(inputs)} inputs of shape (n, 1), one per column: {shown}{more}"
    print(f"ONNX model written to {path} ({described}; outputs {outputs})")


def _onnx_type(value_info) -> str:
    """The element type of an ONNX input, as numpy names it (float32, str, ...)."""
    from onnx import helper

    elem = value_info.type.tensor_type.elem_type
    return "string" if elem == 8 else str(helper.tensor_dtype_to_np_dtype(elem))


def _write_estimator(model, path: str) -> None:
    try:
        import skops.io as sio
    except ImportError:
        _warn(f"saved estimator skipped: skops is not installed ({_SKOPS_HINT})")
        return
    from ._trusted import SKOPS_TRUSTED_TYPES

    try:
        sio.dump(model, path)
    except OSError as exc:
        raise CLIError(f"cannot write the estimator to {path}: {exc.strerror or exc}") from exc
    unknown = [t for t in sio.get_untrusted_types(file=path) if t not in SKOPS_TRUSTED_TYPES]
    if unknown:
        _warn(f"loading {path} needs --trust, it holds the types {', '.join(unknown)}")
    print(
        f"estimator written to {path} (skops.io.load(path, "
        "trusted=onnxgrad_sklearn.SKOPS_TRUSTED_TYPES); fine-tune it with --init)"
    )


def _write_plot(est, path: str) -> None:
    """Write the loss-curve PNG; a warning instead when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        _warn(f"loss-curve PNG skipped: matplotlib is not installed ({_MATPLOTLIB_HINT})")
        return
    from .plotting import plot_loss_curve

    fig = Figure(figsize=(7, 4.5))
    plot_loss_curve(est, ax=fig.subplots())
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise CLIError(f"cannot write the loss curve to {path}: {exc.strerror or exc}") from exc
    print(f"loss curve written to {path}")


# commands -------------------------------------------------------------------------
def _fit(args: argparse.Namespace) -> int:
    data = _read_training_data(args)
    chosen = _choose_template(args, data)
    y = _check_target(data, chosen.task)
    loss = _choose_loss(args, chosen)
    paths = _output_paths(args)
    split = _split(data.X, y, chosen.task, args.test_size, args.random_state)
    scaler, scaling = _target_scaler(args, chosen, loss, split.y_train)
    if scaler is not None:
        mean, scale = _scaling(scaler)
        scaling += f" (mean {mean:.6g}, std {scale:.6g}); the outputs predict raw values"
    _print_summary(args, data, chosen, loss, split, scaling)

    est = _make_estimator(args, chosen, loss)
    model, seconds = _train(est, split, scaler)
    _print_training(est, args, seconds, scaler is not None)
    _print_metrics(model, chosen.task, split)

    _write_onnx(model, data, paths.onnx)
    _write_estimator(model, paths.skops)
    _write_plot(est, paths.png)
    return 0


class _OnnxPredictor:
    """Predictions of an ONNX model written by ``fit``.

    Its input is one matrix ``X`` of the feature columns, or one ``(n, 1)`` input
    per column (text columns encoded inside the model), named after the columns.
    """

    def __init__(self, path: str):
        from .runtime import import_onnxruntime

        onnxruntime = import_onnxruntime()
        onnxruntime.set_default_logger_severity(3)
        try:
            self.session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise CLIError(f"cannot load the ONNX model in {path}: {_one_line(exc)}") from exc
        self.inputs = self.session.get_inputs()
        meta = self.session.get_modelmeta().custom_metadata_map
        if META_FEATURES_JSON in meta:
            self.features = json.loads(meta[META_FEATURES_JSON])
        elif META_FEATURES in meta:
            self.features = meta[META_FEATURES].split(",")
        elif len(self.inputs) > 1:  # one input per column, named after it
            self.features = [i.name for i in self.inputs]
        else:
            self.features = None
        if len(self.inputs) > 1 and len(self.features) != len(self.inputs):
            raise CLIError(
                f"the ONNX model in {path} has {len(self.inputs)} inputs and its metadata "
                f"names {len(self.features)} feature columns: predict runs a model of one "
                "input (the matrix of the features) or of one input per feature column"
            )
        self.text = [
            column
            for i, column in zip(self.inputs, self.features or [])
            if len(self.inputs) > 1 and i.type == "tensor(string)"
        ]
        shape = self.inputs[0].shape
        width = shape[-1] if len(self.inputs) == 1 and len(shape) == 2 else None
        self.n_features = width if isinstance(width, int) else len(self.inputs)
        self.classes = json.loads(meta[META_CLASSES]) if META_CLASSES in meta else None

    def _feed(self, X) -> dict:
        """The session's inputs: ``X`` as one matrix, or each column as ``(n, 1)``."""
        import numpy as np

        def typed(values, kind: str):
            if kind == "tensor(string)":
                return values.astype(str).to_numpy(dtype=object)
            if kind in ("tensor(int64)", "tensor(int32)"):
                return values.to_numpy(dtype=np.int64 if kind.endswith("64)") else np.int32)
            return values.to_numpy(dtype=np.float64 if kind == "tensor(double)" else np.float32)

        if len(self.inputs) == 1:
            return {self.inputs[0].name: typed(X, self.inputs[0].type)}
        # the inputs come in the order of the feature columns
        return {
            i.name: typed(X[column], i.type).reshape(-1, 1)
            for i, column in zip(self.inputs, self.features)
        }

    def predict(self, X):
        import numpy as np

        outputs = self.session.run(None, self._feed(X))
        if len(outputs) < 2:  # a regressor
            return _table(outputs[0])
        labels, proba = outputs[0], outputs[1]
        classes = self.classes
        if isinstance(proba, list):  # a ZipMap: one dict per row
            classes = classes or list(proba[0])
            proba = np.array([[row[c] for c in classes] for row in proba])
        return _table(labels, proba, classes)


class _EstimatorPredictor:
    """Predictions of a saved estimator."""

    def __init__(self, path: str, trust: bool):
        self.model = _load_model(path, trust)
        if not hasattr(self.model, "predict"):
            raise CLIError(f"{path} does not hold an estimator (got {type(self.model).__name__})")
        if not _is_fitted(self.model):
            raise CLIError(f"the model in {path} is not fitted: train it first (fit)")
        names = getattr(self.model, "feature_names_in_", None)
        self.features = None if names is None else [str(n) for n in names]
        self.n_features = getattr(self.model, "n_features_in_", None)
        ours = getattr(self.model, "regressor_", self.model)  # a TransformedTargetRegressor's
        columns = getattr(ours, "_raw_columns", None) or []  # trained on a DataFrame's columns
        self.text = [name for name, kind in columns if kind == "string"]

    def predict(self, X):
        from sklearn.base import is_classifier

        X = X if self.features is not None else X.to_numpy()
        pred = self.model.predict(X)
        if is_classifier(self.model) and hasattr(self.model, "predict_proba"):
            return _table(pred, self.model.predict_proba(X), list(self.model.classes_))
        return _table(pred)


def _table(pred, proba=None, classes=None):
    """The predictions as a DataFrame: 'prediction' (or one per output), 'proba_CLASS'."""
    import numpy as np
    import pandas as pd

    pred = np.asarray(pred)
    if pred.ndim == 2 and pred.shape[1] == 1:
        pred = pred.ravel()
    if pred.ndim == 1:
        table = pd.DataFrame({"prediction": pred})
    else:
        table = pd.DataFrame(pred, columns=[f"prediction_{k}" for k in range(pred.shape[1])])
    if proba is not None:
        proba = np.asarray(proba, dtype=np.float64).reshape(len(pred), -1)
        classes = classes if classes is not None else list(range(proba.shape[1]))
        for k, cls in enumerate(classes):
            table[f"proba_{cls}"] = proba[:, k]
    return table


def _load_predictor(path: str, trust: bool):
    if not os.path.exists(path):
        raise CLIError(f"model file not found: {path}")
    if path.lower().endswith(ONNX_SUFFIXES):
        return _OnnxPredictor(path)
    if path.lower().endswith(SKOPS_SUFFIXES + PICKLE_SUFFIXES):
        return _EstimatorPredictor(path, trust)
    raise CLIError(
        f"cannot tell how to load {path}: a model file ends with "
        f"{', '.join(ONNX_SUFFIXES + SKOPS_SUFFIXES + PICKLE_SUFFIXES)}"
    )


def _prediction_features(frame, predictor, data_path: str, model_path: str):
    """The model's feature columns of ``frame``, by name (or all of them, by position)."""
    columns = list(frame.columns)
    names = predictor.features
    if names is None:
        width = predictor.n_features
        if width is not None and width != len(columns):
            raise CLIError(
                f"the model in {model_path} records no feature names and takes {width} "
                f"columns, {data_path} has {len(columns)}: keep only its feature columns, "
                "in order"
            )
        return _feature_frame(frame, columns)
    missing = [n for n in names if n not in columns]
    if missing:
        which = (
            f"feature column {missing[0]!r} is"
            if len(missing) == 1
            else f"feature columns {_quoted(missing)} are"
        )
        raise CLIError(
            f"{which} missing from {data_path}: the model in {model_path} takes {_quoted(names)}"
        )
    return _feature_frame(frame, names, predictor.text)


def _predict(args: argparse.Namespace) -> int:
    predictor = _load_predictor(args.model, args.trust)
    frame = _read_csv(args.data)
    X = _prediction_features(frame, predictor, args.data, args.model)
    table = predictor.predict(X)
    if args.out is None:
        table.to_csv(sys.stdout, index=False)
        return 0
    out = os.path.abspath(args.out)
    _parent(out)
    try:
        table.to_csv(out, index=False)
    except OSError as exc:
        raise CLIError(f"cannot write the predictions to {out}: {exc.strerror or exc}") from exc
    print(f"predictions of {len(table)} rows written to {out} (columns {_quoted(table.columns)})")
    return 0


def _demo(args: argparse.Namespace) -> int:
    return _demo_module.run(epochs=args.epochs, out=args.out)


_COMMANDS = {"fit": _fit, "predict": _predict, "demo": _demo}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``onnxgrad-sklearn`` command.

    Parameters
    ----------
    argv : sequence of str, default=None
        The arguments after the program name; ``None`` reads ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit code: 0 on success (and for ``--help``), 2 for a bad flag or
        a problem with the data, a file or the model (reported on one line of
        stderr, ``onnxgrad-sklearn: error: ...``), 130 when interrupted.
    """
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, --version, or argparse's one-line error
        return exc.code if isinstance(exc.code, int) else 2
    if extra:
        print(
            f"{PROG}: error: unrecognized arguments: {' '.join(extra)} "
            f"(see '{PROG} {args.command} --help')",
            file=sys.stderr,
        )
        return 2
    try:
        return _COMMANDS[args.command](args)
    except BrokenPipeError:  # the reader of the output went away (| head): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (CLIError, ValueError, OSError, ImportError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
