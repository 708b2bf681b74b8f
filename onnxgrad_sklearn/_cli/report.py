"""What ``fit`` prints (summary, training, metrics) and the files it writes.

The ONNX model (made by :func:`onnxgrad_sklearn._export.export_onnx`), the fitted
estimator (skops) and the loss-curve PNG.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._export import export_onnx
from .choose import _loss_text, _Template
from .common import (
    _MATPLOTLIB_HINT,
    _SKOPS_HINT,
    META_OUTPUT_ACTIVATION,
    META_PREDICTION_OUTPUT,
    SKOPS_SUFFIXES,
    CLIError,
    _parent,
    _quoted,
    _warn,
    trusted_types,
)
from .data import _Data, _Split


# report -------------------------------------------------------------------------------
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
        f"{args.batch_size}, {args.epochs} epochs, alpha {args.alpha:g}, {chosen.dtype}"
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


# write outputs ------------------------------------------------------------------------
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


def _onnx_metadata(chosen: _Template) -> dict[str, str]:
    """What ``predict`` reads of an ONNX template besides the export's metadata: the
    output that is the prediction, and how a classifier's is made from the logits."""
    spec = chosen.spec
    if spec is None:
        return {}
    meta = {META_PREDICTION_OUTPUT: spec.output}
    if chosen.task == "classification":
        meta[META_OUTPUT_ACTIVATION] = spec.activation or "none"
    return meta


def _set_metadata(onnx_model, meta: dict[str, str]) -> None:
    """Set ``meta`` in the model's metadata; one entry per key, the last one set (an
    ONNX model given as the template may hold keys of its own, from an earlier fit)."""
    values = {p.key: p.value for p in onnx_model.metadata_props}
    values.update(meta)
    del onnx_model.metadata_props[:]
    for key, value in values.items():
        onnx_model.metadata_props.add(key=key, value=value)


def _write_onnx(model, data: _Data, path: str, meta: dict[str, str] | None = None) -> None:
    onnx_model = export_onnx(model, data.features, data.target)
    _set_metadata(onnx_model, meta or {})
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
    from .._trusted import SKOPS_TRUSTED_TYPES

    try:
        sio.dump(model, path)
    except OSError as exc:
        raise CLIError(f"cannot write the estimator to {path}: {exc.strerror or exc}") from exc
    untrusted = sio.get_untrusted_types(file=path)
    unknown = [t for t in untrusted if t not in trusted_types()]
    if unknown:
        _warn(f"loading {path} needs --trust, it holds the types {', '.join(unknown)}")
    # the types the command line trusts that SKOPS_TRUSTED_TYPES does not list
    more = [t for t in untrusted if t not in SKOPS_TRUSTED_TYPES and t not in unknown]
    more_text = f" + {more!r}" if more else ""
    print(
        f"estimator written to {path} (skops.io.load(path, "
        f"trusted=onnxgrad_sklearn.SKOPS_TRUSTED_TYPES{more_text}); fine-tune it with --init)"
    )


def _write_plot(est, path: str) -> None:
    """Write the loss-curve PNG; a warning instead when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        _warn(f"loss-curve PNG skipped: matplotlib is not installed ({_MATPLOTLIB_HINT})")
        return
    from ..plotting import plot_loss_curve

    fig = Figure(figsize=(7, 4.5))
    plot_loss_curve(est, ax=fig.subplots())
    try:
        fig.savefig(path, dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise CLIError(f"cannot write the loss curve to {path}: {exc.strerror or exc}") from exc
    print(f"loss curve written to {path}")
