"""What every command of the command line uses: constants, errors and helpers.

The program's name and the flags' choices, :class:`CLIError` (an error reported on
one line with exit code 2), reading a CSV file and its feature columns, loading a
saved estimator (skops, pickle or joblib) and :func:`infer_task`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from .. import losses as _losses
from .. import optim as _optim

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

#: Keys ``fit`` adds to the ``metadata_props`` of the ONNX file it writes for an ONNX
#: model trained as the template (``--model PATH.onnx``), which ``predict`` reads: the
#: output that is the prediction (the graph keeps all its outputs), and for a
#: classifier the operator that makes it from the logits (Softmax, LogSoftmax, Sigmoid,
#: or "none": the output is the logits).
META_PREDICTION_OUTPUT = "prediction_output"
META_OUTPUT_ACTIVATION = "output_activation"


_MATPLOTLIB_HINT = "pip install matplotlib, or pip install 'onnxgrad-sklearn[plot]'"
_SKOPS_HINT = "pip install skops, or pip install 'onnxgrad-sklearn[skops]'"


class CLIError(Exception):
    """An error reported to the user on one line, with exit code 2."""


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


def trusted_types() -> list[str]:
    """The types of this package the command line loads from a .skops file without
    ``--trust``: ``SKOPS_TRUSTED_TYPES``."""
    from .._trusted import SKOPS_TRUSTED_TYPES

    return list(SKOPS_TRUSTED_TYPES)


def _load_skops(path: str, trust: bool):
    try:
        import skops.io as sio
    except ImportError as exc:
        raise ImportError(
            f"loading {path} needs skops, which is not installed: {_SKOPS_HINT}"
        ) from exc
    trusted = trusted_types()
    try:
        untrusted = sio.get_untrusted_types(file=path)
    except Exception as exc:  # not a skops file (zipfile.BadZipFile, ...)
        raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc
    unknown = [t for t in untrusted if t not in trusted]
    if unknown and not trust:
        raise CLIError(
            f"{path} holds types skops does not trust by default: {', '.join(unknown)}; "
            "check them and pass --trust to load it"
        )
    try:
        return sio.load(path, trusted=trusted + unknown)
    except Exception as exc:
        raise CLIError(f"cannot load the model in {path}: {_one_line(exc)}") from exc


def _parent(path: str) -> None:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise CLIError(f"cannot create the folder {folder}: {exc.strerror or exc}") from exc
