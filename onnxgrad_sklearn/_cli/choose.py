"""What ``fit`` trains: the template (new or ``--init``), the loss and the target scaling."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .. import losses as _losses
from ..templates import is_fitted
from .common import (
    CLASSIFICATION_LOSSES,
    LOSS_FLAGS,
    PICKLE_SUFFIXES,
    POSITIVE_TARGET_LOSSES,
    REGRESSION_LOSSES,
    SKOPS_SUFFIXES,
    CLIError,
    _load_model,
    _quoted,
    _warn,
    infer_task,
)
from .data import _Data


# templates ----------------------------------------------------------------------------
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


# choose the template ------------------------------------------------------------------
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
    fitted = is_fitted(template)
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

    from .._base import BaseOrtGradient

    scaler = None
    model = loaded
    if isinstance(model, TransformedTargetRegressor):
        if not is_fitted(model):
            raise CLIError(f"the TransformedTargetRegressor in {path} is not fitted")
        scaler = model.transformer_
        if not (hasattr(scaler, "mean_") or hasattr(scaler, "scale_")):
            raise CLIError(
                f"the target transformer of the model in {path} ({type(scaler).__name__}) "
                "is not a StandardScaler: only a standardised target can be fine-tuned"
            )
        model = model.regressor_
    if isinstance(model, BaseOrtGradient):
        if not is_fitted(model):
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


# the loss and the target scaling ------------------------------------------------------
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
