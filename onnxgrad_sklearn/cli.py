"""Command line of onnxgrad-sklearn.

``onnxgrad-sklearn fit`` trains a model on a CSV file with onnxruntime-training
and writes the trained ONNX model and its loss curve; ``onnxgrad-sklearn demo``
runs the demo of the README. Run ``onnxgrad-sklearn fit --help`` for the flags.
Errors are reported on one line of stderr with exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["build_parser", "infer_task", "main"]

PROG = "onnxgrad-sklearn"

#: With ``--task auto``, a numeric target of whole numbers with at most this many
#: distinct values is a classification target.
MAX_AUTO_CLASSES = 20

REGRESSION_LOSSES = ("squared_error", "absolute_error", "huber", "quantile")
CLASSIFICATION_LOSSES = ("log_loss",)
PICKLE_SUFFIXES = (".pkl", ".pickle", ".joblib")
SKOPS_SUFFIXES = (".skops",)

_MATPLOTLIB_HINT = "pip install matplotlib, or pip install 'onnxgrad-sklearn[plot]'"


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


# parser -------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """Build the argument parser of the ``onnxgrad-sklearn`` command.

    Returns
    -------
    argparse.ArgumentParser
        Parser with the subcommands ``fit`` and ``demo``. Its errors print one
        line on stderr and exit with code 2.
    """
    from . import __version__

    parser = _Parser(
        prog=PROG,
        description="Train scikit-learn models on onnxruntime-training and export them to ONNX.",
        epilog=f"Run '{PROG} fit --help' or '{PROG} demo --help' for the flags of a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    fit = commands.add_parser(
        "fit",
        help="train a model on a CSV file and write the trained ONNX model",
        description=(
            "Train a scikit-learn model's weights with onnxruntime-training on a CSV file "
            "(a header row, one column per feature, every column but the target is a "
            "numeric feature), print train and test metrics, write the trained ONNX model "
            "and a PNG of the loss curve. The ONNX model takes one float32 input 'X' whose "
            "columns are the feature columns in the order of the CSV."
        ),
        epilog=(
            f"Example: {PROG} fit --data train.csv --target price --hidden 64,64 "
            "--optimizer adam --learning-rate 0.01 --epochs 100 --out price.onnx. "
            "Exit status: 0 on success, 2 on an error (reported on one line of stderr)."
        ),
    )
    fit.add_argument("--data", required=True, metavar="CSV", help="CSV file to train on (required)")
    fit.add_argument(
        "--target",
        required=True,
        metavar="COLUMN",
        help="name of the column to predict (required); every other column is a feature",
    )
    fit.add_argument(
        "--model",
        default="mlp",
        metavar="mlp|linear|PATH",
        help=(
            "'mlp': StandardScaler + MLPRegressor or MLPClassifier; 'linear': StandardScaler "
            "+ LinearRegression or LogisticRegression; PATH: a scikit-learn model (or "
            "Pipeline) saved with pickle/joblib (.pkl, .pickle, .joblib: only load files you "
            "trust, unpickling runs code) or skops (.skops), fine-tuned from its weights if "
            "fitted (default: mlp)"
        ),
    )
    fit.add_argument(
        "--trust",
        action="store_true",
        help=(
            "load the types of a .skops file that skops does not trust by default "
            "(without it such a file is refused, and the types are listed)"
        ),
    )
    fit.add_argument(
        "--hidden",
        type=_hidden,
        default=None,
        metavar="N[,N...]",
        help="hidden layer sizes of --model mlp, comma-separated (default: 64)",
    )
    fit.add_argument(
        "--task",
        choices=("auto", "regression", "classification"),
        default="auto",
        help=(
            "'auto' (default): the task of the model given as PATH; otherwise classification "
            "when the target column is not numeric (strings, booleans) or holds only whole "
            f"numbers with at most {MAX_AUTO_CLASSES} distinct values, regression otherwise"
        ),
    )
    fit.add_argument(
        "--loss",
        choices=REGRESSION_LOSSES + CLASSIFICATION_LOSSES,
        default=None,
        help=(
            "training loss: squared_error, absolute_error, huber or quantile for regression "
            "(default: squared_error), log_loss for classification (the default)"
        ),
    )
    fit.add_argument(
        "--optimizer",
        choices=("sgd", "momentum", "nesterov", "adam"),
        default="adam",
        help="update rule, as in MLPRegressor (default: adam)",
    )
    fit.add_argument(
        "--learning-rate",
        type=_positive_float,
        default=0.001,
        metavar="LR",
        help="initial learning rate (default: 0.001)",
    )
    fit.add_argument(
        "--batch-size",
        type=_batch_size,
        default="auto",
        metavar="auto|N",
        help="rows per batch; auto means min(200, training rows) (default: auto)",
    )
    fit.add_argument(
        "--epochs", type=_positive_int, default=50, metavar="N", help="epochs (default: 50)"
    )
    fit.add_argument(
        "--alpha",
        type=_non_negative_float,
        default=0.0001,
        help="L2 penalty on the weight matrices, as in MLPRegressor (default: 0.0001)",
    )
    fit.add_argument(
        "--random-state",
        type=int,
        default=None,
        metavar="N",
        help=(
            "seed of the initial weights, the shuffling and the train/test split "
            "(default: not seeded)"
        ),
    )
    fit.add_argument(
        "--test-size",
        type=_fraction,
        default=0.2,
        metavar="FRACTION",
        help=(
            "share of the rows held out for the test metrics, in [0, 1); 0 trains on all "
            "rows and prints train metrics only (default: 0.2)"
        ),
    )
    fit.add_argument(
        "--out",
        default="model.onnx",
        metavar="PATH",
        help="where to write the trained ONNX model (default: model.onnx)",
    )
    fit.add_argument(
        "--plot",
        default=None,
        metavar="PATH",
        help=(
            "where to write the loss-curve PNG (default: the --out path with .png); "
            "skipped with a warning when matplotlib is not installed"
        ),
    )
    verbosity = fit.add_mutually_exclusive_group()
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

    demo = commands.add_parser(
        "demo",
        help="train an MLP on scikit-learn's diabetes data (the README's demo)",
        description=(
            "Train an MLP on scikit-learn's diabetes data with onnxruntime-training, compare "
            "it with MLPRegressor, write the ONNX model and its loss curve."
        ),
    )
    demo.add_argument(
        "--epochs", type=_positive_int, default=None, metavar="N", help="epochs (default: 60)"
    )
    demo.add_argument(
        "--out",
        default=None,
        metavar="FOLDER",
        help="folder for the ONNX model and the PNG (default: demo_output)",
    )
    return parser


# helpers --------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _quoted(names: Sequence[Any], limit: int = 10) -> str:
    shown = ", ".join(repr(str(n)) for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


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
            "the fit command reads CSV files with pandas, which is not installed: "
            "pip install pandas"
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
    return frame


def _split_columns(frame, target: str, path: str):
    import numpy as np
    import pandas as pd

    columns = [str(c) for c in frame.columns]
    if target not in columns:
        close = difflib.get_close_matches(target, columns, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CLIError(
            f"target column {target!r} not found in {path}{hint}; its columns are "
            f"{_quoted(columns)}"
        )
    frame = frame.set_axis(columns, axis=1)
    features = [c for c in columns if c != target]
    if not features:
        raise CLIError(f"{path} has no feature column: every column but the target is a feature")
    text = [c for c in features if not pd.api.types.is_numeric_dtype(frame[c])]
    if text:
        sample = frame[text[0]].dropna()
        example = f" (values such as {str(sample.iloc[0])!r})" if len(sample) else ""
        which = (
            f"feature column {text[0]!r} is not numeric{example}"
            if len(text) == 1
            else f"feature columns {_quoted(text)} are not numeric"
        )
        raise CLIError(
            f"{which}: feature columns must be numeric, encode it first (for example one-hot) "
            "or drop it from the CSV"
        )
    missing = frame[features].isna().sum()
    missing = missing[missing > 0]
    if len(missing):
        column, count = missing.index[0], int(missing.iloc[0])
        raise CLIError(
            f"feature column {column!r} has {count} missing values"
            + (f" (and {len(missing) - 1} more columns have some)" if len(missing) > 1 else "")
            + ": fill or drop them first"
        )
    y = frame[target]
    if y.isna().any():
        raise CLIError(
            f"target column {target!r} has {int(y.isna().sum())} missing values: "
            "drop those rows first"
        )
    if isinstance(y.dtype, pd.CategoricalDtype) or y.dtype == bool:
        y = y.astype(str)
    X = frame[features].to_numpy(dtype=np.float64)
    return X, y.to_numpy(), features


def _load_model(path: str, trust: bool):
    lower = path.lower()
    if lower.endswith(SKOPS_SUFFIXES):
        try:
            import skops.io as sio
        except ImportError as exc:
            raise ImportError(
                f"loading {path} needs skops, which is not installed: pip install skops"
            ) from exc
        try:
            untrusted = sio.get_untrusted_types(file=path)
        except Exception as exc:  # not a skops file (zipfile.BadZipFile, ...)
            raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc
        if untrusted and not trust:
            raise CLIError(
                f"{path} holds types skops does not trust by default: {', '.join(untrusted)}; "
                "check them and pass --trust to load it"
            )
        try:
            return sio.load(path, trusted=untrusted or None)
        except Exception as exc:
            raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc
    if lower.endswith(PICKLE_SUFFIXES):
        import joblib

        try:
            return joblib.load(path)
        except Exception as exc:  # a corrupt or foreign file fails in many ways
            raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc
    raise CLIError(
        f"cannot tell how to load {path}: a model file ends with "
        f"{', '.join(PICKLE_SUFFIXES + SKOPS_SUFFIXES)}"
    )


def _is_fitted(model) -> bool:
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    try:
        check_is_fitted(model)
    except (NotFittedError, TypeError):
        return False
    return True


def _loaded_template(args, features):
    """The template loaded from ``--model PATH``, its task, and the column order it needs."""
    from sklearn.base import is_classifier, is_regressor

    path = args.model
    if not os.path.exists(path):
        raise CLIError(
            f"model file not found: {path} (--model takes mlp, linear, or the path of a "
            f"{', '.join(PICKLE_SUFFIXES + SKOPS_SUFFIXES)} file)"
        )
    model = _load_model(path, args.trust)
    if not (hasattr(model, "fit") and hasattr(model, "predict")):
        raise CLIError(
            f"{path} does not hold a scikit-learn estimator (got {type(model).__name__})"
        )
    if is_classifier(model):
        task = "classification"
    elif is_regressor(model):
        task = "regression"
    else:
        raise CLIError(
            f"the model in {path} ({type(model).__name__}) is neither a regressor nor a classifier"
        )
    if args.task not in ("auto", task):
        raise CLIError(f"--task {args.task}, but the model in {path} is a {task} model")
    order = list(features)
    fitted = _is_fitted(model)
    names = getattr(model, "feature_names_in_", None)
    n_in = getattr(model, "n_features_in_", None)
    if fitted and names is not None:
        names = [str(n) for n in names]
        absent = [n for n in names if n not in features]
        if absent:
            raise CLIError(
                f"the model in {path} was fitted on columns missing from the data: "
                f"{_quoted(absent)}"
            )
        extra = [n for n in features if n not in names]
        if extra:
            raise CLIError(
                f"the data has feature columns the model in {path} was not fitted on: "
                f"{_quoted(extra)}; drop them from the CSV"
            )
        order = names
    elif fitted and n_in is not None and n_in != len(features):
        raise CLIError(
            f"the model in {path} expects {n_in} features, the data has {len(features)} "
            "feature columns (every column but the target)"
        )
    return model, task, fitted, order


def _builtin_template(kind: str, task: str, hidden):
    from sklearn.linear_model import LinearRegression, LogisticRegression
    from sklearn.neural_network import MLPClassifier, MLPRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if kind == "mlp":
        cls = MLPClassifier if task == "classification" else MLPRegressor
        final = cls(hidden_layer_sizes=hidden or (64,))
    else:
        final = LogisticRegression() if task == "classification" else LinearRegression()
    return make_pipeline(StandardScaler(), final)


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


def _split(X, y, task: str, test_size: float, random_state):
    if test_size == 0:
        return X, None, y, None
    from sklearn.model_selection import train_test_split

    n_test = math.ceil(test_size * len(y))
    if len(y) - n_test < 2:
        raise CLIError(
            f"--test-size {test_size} leaves {len(y) - n_test} training rows out of {len(y)}: "
            "use a smaller --test-size (0 trains on all rows)"
        )
    if task == "classification":
        try:
            return train_test_split(
                X, y, test_size=test_size, random_state=random_state, stratify=y
            )
        except ValueError:  # a class too rare to stratify: split without it
            pass
    return train_test_split(X, y, test_size=test_size, random_state=random_state)


def _metrics(est, task: str, X, y) -> dict[str, float]:
    import numpy as np
    from sklearn.metrics import accuracy_score, mean_absolute_error, r2_score

    if task == "regression":
        pred = est.predict(X)
        r2 = r2_score(y, pred) if len(y) > 1 else float("nan")
        return {"R2": r2, "MAE": mean_absolute_error(y, pred)}
    log_proba = est.predict_log_proba(X)
    pred = est.classes_[log_proba.argmax(axis=1)]
    known = np.isin(y, est.classes_)  # a test label absent from training has no probability
    index = np.searchsorted(est.classes_, y[known])
    picked = log_proba[known][np.arange(index.size), index]
    logloss = float(-picked.mean()) if index.size else float("nan")
    return {"accuracy": accuracy_score(y, pred), "log-loss": logloss}


def _print_metrics(train: dict[str, float], test: dict[str, float] | None) -> None:
    header = f"{'':12s}{'train':>12s}" + (f"{'test':>12s}" if test is not None else "")
    print(header)
    for name, value in train.items():
        line = f"{name:12s}{value:12.6g}"
        if test is not None:
            line += f"{test[name]:12.6g}"
        print(line)


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr)


def _write_plot(est, path: str) -> bool:
    """Write the loss-curve PNG; False (and a warning) when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        _warn(f"loss-curve PNG skipped: matplotlib is not installed ({_MATPLOTLIB_HINT})")
        return False
    from .plotting import plot_loss_curve

    fig = Figure(figsize=(7, 4.5))
    plot_loss_curve(est, ax=fig.subplots())
    fig.savefig(path, dpi=100, bbox_inches="tight")
    return True


def _parent(path: str) -> None:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"cannot create the folder {folder}: {exc.strerror or exc}") from exc


# commands -------------------------------------------------------------------------
def _fit(args: argparse.Namespace) -> int:
    frame = _read_csv(args.data)
    X, y, features = _split_columns(frame, args.target, args.data)

    if args.model in ("mlp", "linear"):
        if args.hidden is not None and args.model != "mlp":
            raise CLIError("--hidden applies to --model mlp only")
        task = infer_task(y) if args.task == "auto" else args.task
        how = " (auto)" if args.task == "auto" else ""
        template = _builtin_template(args.model, task, args.hidden)
        origin = ""
    else:
        if args.hidden is not None:
            raise CLIError("--hidden applies to --model mlp only, not to a model file")
        template, task, fitted, order = _loaded_template(args, features)
        if order != features:
            X = X[:, [features.index(n) for n in order]]
            features = order
            origin_note = ", columns reordered as the model was fitted"
        else:
            origin_note = ""
        how = f" (from {args.model})" if args.task == "auto" else ""
        origin = f", {'fine-tuned from' if fitted else 'initialised, unfitted, from'} {args.model}"
        origin += origin_note

    import numpy as np

    if task == "regression":
        if not np.issubdtype(np.asarray(y).dtype, np.number):
            raise CLIError(
                f"target column {args.target!r} is not numeric, a regression needs numbers "
                "(use --task classification for labels)"
            )
        y = np.asarray(y, dtype=np.float64)
    else:
        values = np.asarray(y)
        if np.issubdtype(values.dtype, np.floating) and not np.all(values == np.round(values)):
            raise CLIError(
                f"target column {args.target!r} holds continuous values, a classification "
                "needs labels (use --task regression)"
            )
    loss = args.loss or ("log_loss" if task == "classification" else "squared_error")
    allowed = CLASSIFICATION_LOSSES if task == "classification" else REGRESSION_LOSSES
    if loss not in allowed:
        raise CLIError(f"--loss {loss} does not apply to {task}: use {', '.join(allowed)}")

    out = os.path.abspath(args.out)
    png = os.path.abspath(args.plot or os.path.splitext(args.out)[0] + ".png")
    _parent(out)  # fail before training, not after
    _parent(png)

    X_train, X_test, y_train, y_test = _split(X, y, task, args.test_size, args.random_state)
    print(
        f"data: {args.data}, {len(y)} rows, {len(features)} features "
        f"({_quoted(features, 8)}), target {args.target!r}"
    )
    task_text = f"task: {task}{how}"
    if task == "classification":
        classes = np.unique(y)
        task_text += f", {len(classes)} classes: {_quoted(list(classes), 8)}"
    print(task_text)
    print(
        f"model: {_describe(template)}{origin}; loss {loss}, optimizer {args.optimizer}, "
        f"learning rate {args.learning_rate:g}, batch size {args.batch_size}, "
        f"{args.epochs} epochs, alpha {args.alpha:g}"
    )
    held = f", {len(y_test)} test rows" if y_test is not None else ", no test rows"
    print(f"split: {len(y_train)} training rows{held}")

    import onnxruntime
    from sklearn.exceptions import ConvergenceWarning

    from . import OrtGradientClassifier, OrtGradientRegressor

    # the runtime's own warnings (graph clean-ups when sessions are built) would
    # interleave with the progress bar; errors still show
    onnxruntime.set_default_logger_severity(3)

    cls = OrtGradientClassifier if task == "classification" else OrtGradientRegressor
    est = cls(
        template,
        loss=loss,
        optimizer=args.optimizer,
        learning_rate_init=args.learning_rate,
        batch_size=args.batch_size,
        max_iter=args.epochs,
        alpha=args.alpha,
        random_state=args.random_state,
        verbose=1 if args.verbose else 0,
    )
    begin = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X_train, y_train)
    seconds = time.perf_counter() - begin
    for message in dict.fromkeys(str(w.message) for w in caught):
        _warn(" ".join(message.split()))

    stopped = ""
    if est.n_iter_ < args.epochs:
        stopped = (
            f" (stopped early: the training loss improved by less than {est.tol:g} "
            f"for {est.n_iter_no_change} epochs)"
        )
    print(
        f"trained {est.n_iter_} epochs in {seconds:.2f} s, final training loss "
        f"{est.loss_curve_[-1]:.6g}{stopped}"
    )
    train_metrics = _metrics(est, task, X_train, y_train)
    test_metrics = _metrics(est, task, X_test, y_test) if y_test is not None else None
    _print_metrics(train_metrics, test_metrics)

    model = est.to_onnx()
    try:
        with open(out, "wb") as f:
            f.write(model.SerializeToString())
    except OSError as exc:
        raise CLIError(f"cannot write the ONNX model to {out}: {exc.strerror or exc}") from exc
    inputs = ", ".join(i.name for i in model.graph.input)
    outputs = ", ".join(o.name for o in model.graph.output)
    print(
        f"ONNX model written to {out} (input {inputs}: float32 of shape (n, {len(features)}), "
        f"columns {_quoted(features, 8)}; outputs {outputs})"
    )
    try:
        written = _write_plot(est, png)
    except OSError as exc:
        raise CLIError(f"cannot write the loss curve to {png}: {exc.strerror or exc}") from exc
    if written:
        print(f"loss curve written to {png}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from .demo import main as demo_main

    argv: list[str] = []
    if args.epochs is not None:
        argv += ["--epochs", str(args.epochs)]
    if args.out is not None:
        argv += ["--out", args.out]
    return demo_main(argv)


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
        return _fit(args) if args.command == "fit" else _demo(args)
    except (CLIError, ValueError, OSError, ImportError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
