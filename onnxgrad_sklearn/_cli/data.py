"""``fit``'s training data: the CSV file read and checked, the target, the split."""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Any

from .common import CLIError, _feature_frame, _quoted, _read_csv, _text_columns


# read the data ------------------------------------------------------------------------
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


# check the target ---------------------------------------------------------------------
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


# split --------------------------------------------------------------------------------
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
