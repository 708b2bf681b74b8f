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
    ONNX_SUFFIXES,
    PICKLE_SUFFIXES,
    POSITIVE_TARGET_LOSSES,
    REGRESSION_LOSSES,
    SKOPS_SUFFIXES,
    CLIError,
    _load_model,
    _one_line,
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
#: ``--model PATH.onnx``: what it trains, for the help.
ONNX_TEMPLATE_HELP = (
    "the ONNX model in that file (a path ending with .onnx) as the template, taken as it "
    "is (no StandardScaler in front): the feature columns, in the order of the CSV, are "
    "its one input, of shape (n, number of features), its prediction is its first output "
    "(--output NAME: another one; a classifier's Softmax, LogSoftmax or Sigmoid output is "
    "trained through the logits before it), and its floating-point weights are trained "
    "(--trainable, --frozen), on the raw target"
)
#: The flags that only apply to an ONNX model (``--model PATH.onnx``, or ``--init`` of an
#: estimator fitted with one), and their ``OnnxTemplate`` parameters.
ONNX_FLAGS = ("trainable", "frozen", "output")


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
    dtype: str = "float32"  # the float type training computes in (--dtype)
    spec: Any = None  # an ONNX template's TemplateSpec (None for the other templates)


def _choose_template(args, data: _Data) -> _Template:
    chosen = _template_of_flags(args, data)
    asked = getattr(args, "dtype", None)
    if asked is not None:
        chosen.dtype = asked
    elif chosen.spec is not None:  # an ONNX model: its own float type
        chosen.dtype = str(chosen.spec.float_type)
    return chosen


def _template_of_flags(args, data: _Data) -> _Template:
    init = args.init
    if args.model is not None and _is_onnx_path(args.model):
        if init is not None:
            raise CLIError(
                f"--model {args.model} trains that ONNX model, --init fine-tunes a saved "
                "estimator: give one of them"
            )
        return _onnx_template(args, data, args.model)
    if args.model is not None and args.model not in TEMPLATES:
        if init is not None or not _looks_like_path(args.model):
            raise CLIError(
                f"--model takes {' or '.join(TEMPLATES)}, got {args.model!r} (or the path of "
                "an ONNX model to train, ending with .onnx; a saved model to fine-tune goes "
                "to --init PATH)"
            )
        _warn(f"--model PATH is deprecated, use --init {args.model}")
        init = args.model
    elif args.model is not None and init is not None:
        raise CLIError(
            f"--model {args.model} trains a new template, --init fine-tunes a saved model: "
            "give one of them"
        )
    if init is None:
        _refuse_onnx_flags(args, f"--model {args.model or 'mlp'}")
        return _new_template(args, data, args.model or "mlp")
    if args.hidden is not None:
        raise CLIError("--hidden applies to --model mlp only, not to an --init model")
    return _init_template(args, data, init)


def _is_onnx_path(text: str) -> bool:
    return text.lower().endswith(ONNX_SUFFIXES)


def _refuse_onnx_flags(args, what: str) -> None:
    for flag in ONNX_FLAGS:
        if getattr(args, flag, None) is not None:
            raise CLIError(
                f"--{flag} applies to an ONNX model (--model PATH.onnx, or --init of an "
                f"estimator fitted with one) only, not to {what}"
            )


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


# an ONNX model as the template ------------------------------------------------------
def _onnx_template(args, data: _Data, path: str) -> _Template:
    """``--model PATH.onnx``: the model in that file, trained as it is."""
    if args.hidden is not None:
        raise CLIError(
            f"--hidden applies to --model mlp only, not to an ONNX model (--model {path}): "
            "its layers are those of its graph"
        )
    if not os.path.exists(path):
        raise CLIError(f"ONNX model file not found: {path}")
    import onnx

    try:
        model = onnx.load(path)  # its external-data files too, into the model
    except Exception as exc:  # not an ONNX file (DecodeError, ...)
        raise CLIError(f"cannot read the ONNX model in {path}: {_one_line(exc)}") from exc
    from ..onnx_template import OnnxTemplate

    # the bytes, not the path: the saved estimator holds the model, whatever becomes
    # of the file (and skops saves bytes without a type to trust)
    template = OnnxTemplate(
        model.SerializeToString(),
        trainable=args.trainable,
        frozen=args.frozen,
        output=args.output,
    )
    spec = _onnx_spec(template, path)
    _check_onnx_input(spec, data, path)
    task = infer_task(data.y) if args.task == "auto" else args.task
    how = " (auto)" if args.task == "auto" else ""
    origin = f" of {path} ({_onnx_text(template, spec, len(data.features))})"
    return _Template(template, task, how, origin, spec=spec)


def _onnx_spec(template, path: str):
    """The template's :class:`~onnxgrad_sklearn.onnx_template.TemplateSpec`; its
    refusals (several inputs, ai.onnx.ml operators, no weight to train...) as CLIError."""
    try:
        return template.spec()
    except ValueError as exc:
        hint = ""
        if "ai.onnx.ml" in str(exc):  # an ONNX file fit wrote from a scikit-learn template
            hint = "; to fine-tune a model fit wrote, pass its .skops file to --init"
        message = _one_line(exc)
        for flag in ONNX_FLAGS:  # the messages name OnnxTemplate's parameters
            message = message.replace(f"{flag}=", f"--{flag} ")
        raise CLIError(f"the ONNX model in {path}: {message}{hint}") from exc


def _check_onnx_input(spec, data: _Data, path: str) -> None:
    """Refuse, before training, data the ONNX model's input cannot take."""
    if data.text:
        raise CLIError(
            f"the ONNX model in {path} takes numbers, and the feature columns "
            f"{_quoted(data.text)} are text: encode them as numbers in the CSV (the model "
            "is trained as it is, nothing is added in front of it)"
        )
    if len(spec.input_shape) != 1:
        shown = ", ".join(["n"] + ["?" if d is None else str(d) for d in spec.input_shape])
        raise CLIError(
            f"the ONNX model in {path} takes an input {spec.input!r} of shape ({shown}); fit "
            "feeds it the feature columns of the CSV, a matrix of shape (n, "
            f"{len(data.features)}): give a model whose input is (n, number of features)"
        )
    if spec.input_dtype.kind in "iu":
        raise CLIError(
            f"the ONNX model in {path} takes {spec.input_dtype} values (indices, token ids) "
            f"in its input {spec.input!r}: fit feeds it the feature columns as floats"
        )
    (width,) = spec.input_shape
    if width is not None and width != len(data.features):
        raise CLIError(
            f"the ONNX model in {path} takes {width} features (its input {spec.input!r} is "
            f"(n, {width})), and {data.path} has {len(data.features)} feature columns "
            "(every column but the target): give a CSV of its features, or a model of "
            f"{len(data.features)} inputs"
        )


def _onnx_text(template, spec, n_features: int) -> str:
    """What the summary says of an ONNX template."""
    model = template.load()
    floats = [i.name for i in model.graph.initializer if i.data_type in (1, 11)]  # float, double
    output = repr(spec.output)
    if spec.activation is not None:
        output += f" (a {spec.activation} of the logits {spec.logits!r})"
    trained = _quoted(list(spec.trainable), 8)
    left = [n for n in floats if n not in spec.trainable]
    kept = f"; kept as they are: {_quoted(left, 8)}" if left else ""
    return (
        f"input {spec.input!r} of shape (n, {n_features}), {spec.input_dtype}; output "
        f"{output}; trains {len(spec.trainable)} of its {len(floats)} floating-point "
        f"initializers: {trained}{kept}; no StandardScaler in front, the feature columns "
        "go to the model as they are"
    )


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
    from ..onnx_template import OnnxTemplate

    spec = None
    if isinstance(template, OnnxTemplate):
        template, spec = _onnx_init(args, data, template, path)
    else:
        _refuse_onnx_flags(args, f"the model in {path} (not an ONNX model)")
    if saved is not None:  # our estimator: its task (its template may be an ONNX model)
        task = "classification" if is_classifier(saved) else "regression"
    elif is_classifier(template):
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
    return _Template(template, task, how, origin, fitted, scaler, loss, spec=spec)


def _onnx_init(args, data: _Data, template, path: str):
    """The ONNX template of an estimator ``--init`` gives, holding its trained weights
    (a fitted copy's weights_ are only read back from its graph: it is rebuilt from the
    graph that holds them), with the --trainable, --frozen and --output given."""
    from ..onnx_template import OnnxTemplate

    given = {flag: getattr(args, flag, None) for flag in ONNX_FLAGS}
    params = {
        k: (v if given[k] is None else given[k])
        for k, v in template.get_params().items()
        if k in ONNX_FLAGS
    }
    try:
        model = template.to_onnx()
    except Exception as exc:  # its model file (a path) gone, or unreadable
        raise CLIError(f"cannot read the ONNX model of {path}: {_one_line(exc)}") from exc
    rebuilt = OnnxTemplate(model.SerializeToString(), **params)
    spec = _onnx_spec(rebuilt, path)
    _check_onnx_input(spec, data, path)
    return rebuilt, spec


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
    if chosen.spec is not None:
        return None, "raw (an ONNX model is trained as it is: its output predicts the target)"
    name = _loss_name(loss)
    if name.startswith(POSITIVE_TARGET_LOSSES):
        return None, f"raw (loss {name} takes positive targets)"
    from sklearn.preprocessing import StandardScaler

    return StandardScaler().fit(y_train.reshape(-1, 1)), "standardised for training"
