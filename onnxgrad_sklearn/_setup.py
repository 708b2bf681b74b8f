"""A fit's set-up: what the estimator checks and derives before training.

The checks of everything ``fit`` receives (X, y, sample weights, a validation set,
the dtype, the device and backend), before anything reaches the runtime; the penalty
trained; and the fitted state of a first fit (:func:`initialize`: the template
prepared and converted, the counters reset). Functions of the estimator, which
calls them from ``_fit``.
"""

from __future__ import annotations

import copy
import logging
import warnings

import numpy as np
from sklearn.base import is_classifier
from sklearn.exceptions import DataConversionWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import _check_sample_weight

from ._callbacks import holds_out_validation, uses_validation_data
from ._data import MemoryValidation, as_rows, dask_input, is_rows
from ._frames import with_head
from ._inputs import template_input
from .families import dropped_settings, family_of
from .optim import LearningRateSchedule
from .runtime import device_to_providers
from .templates import (
    ConvertedTemplate,
    check_template,
    convert_template,
    final_estimator,
    prepare_template,
    unfitted_head_steps,
)

logger = logging.getLogger("onnxgrad_sklearn")


def validate_fit_input(est, X, y, sample_weight, first_call, incremental, classes):
    """Check everything a fit receives, before anything reaches the runtime."""
    if est.early_stopping and incremental:
        raise ValueError("partial_fit does not support early_stopping=True")
    template = est._template()
    check_template(template, est._task, type(est).__name__)
    if incremental and first_call:
        refuse_unfitted_head(template)
    final = final_estimator(template)
    loss = est._objective(final)
    optimizer = est._solver(final, incremental)
    dtype = fit_dtype(est, first_call)  # None: X's own, as MLPRegressor
    if is_rows(X):  # partitions on a dask cluster (_dask.py): checked where they are
        dtype = X.training_dtype(dtype)
        check_runtime(est, dtype)
        X, y2d, sample_weight, fitted = X.validate(
            est, y, sample_weight, first_call, incremental, classes, dtype
        )
        check_outputs(est, y2d, first_call)
        return X, y2d, sample_weight, fitted, loss, optimizer
    X, y, dtype = template_input(template).fit(est, template, X, y, first_call, dtype)
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn(
            "A column-vector y was passed when a 1d array was expected. Please "
            "change the shape of y to (n_samples,), for example using ravel().",
            DataConversionWarning,
            stacklevel=4,
        )
        y = y.ravel()
    dtype = X.dtype if dtype is None else dtype
    X = as_rows(X, dtype)  # a sparse X stays sparse: batches are densified one by one
    y2d, fitted = est._validate_targets(y, first_call, incremental, classes)
    y2d = np.ascontiguousarray(y2d, dtype=dtype)
    sample_weight = _check_sample_weight(sample_weight, X, dtype=dtype)
    sample_weight = est._adjust_sample_weight(y2d, sample_weight, fitted)
    if not np.any(sample_weight):
        raise ValueError("Sample weights must contain at least one non-zero number.")
    check_runtime(est, dtype)
    check_outputs(est, y2d, first_call)
    return X, y2d, sample_weight, fitted, loss, optimizer


def check_batches_needed(est, optimizer):
    """Refuse a full-batch solver for a model with Dropout or BatchNormalization in
    training mode (masks and statistics are drawn from each batch)."""
    if optimizer.full_batch and getattr(est._converted, "training", None):
        raise ValueError(
            f"optimizer={est.optimizer!r} trains on all the rows at once, and the ONNX "
            "template has Dropout or BatchNormalization in training mode, which draw "
            "masks and batch statistics from each batch: use a stochastic optimizer "
            "('adam', 'sgd', ...), or export the model in inference mode."
        )


def check_runtime(est, dtype):
    """Refuse a bad device, or a backend that cannot run here, before any work."""
    from .backends import check_backend  # imports onnx and onnxruntime: on first use

    device_to_providers(est.device)  # refuses a bad device before any work
    check_backend(est.backend, est.device, dtype)  # and a backend that cannot run here


def check_outputs(est, y2d, first_call):
    """A continued fit keeps the number of outputs; a template that fixes its outputs'
    width (an ONNX model) has y's."""
    final = final_estimator(est._template())
    width = family_of(final).output_width(final)
    if width is not None and width != est._n_model_outputs(y2d):
        name = family_of(final).prediction_output(final)
        what = (
            f"{y2d.shape[1]} classes"
            if is_classifier(est) and not est._multilabel
            else f"{y2d.shape[1]} values per sample"
        )
        raise ValueError(
            f"the ONNX template's output {name!r} gives {width} values per sample, and y "
            f"has {what}: export the model with an output of {est._n_model_outputs(y2d)} "
            "(or pass output= another output of the model)."
        )
    if not first_call and est._n_model_outputs(y2d) != est.n_outputs_:
        raise ValueError(
            f"y has {est._n_model_outputs(y2d)} outputs, the estimator was fitted "
            f"with {est.n_outputs_}."
        )


def validate_validation_data(est, validation, y2d, fitted, optimizer, X=None):
    """Check ``(X_val, y_val, sample_weight_val)`` given to ``fit`` as the training
    data is checked (X_val through the template's head, y_val encoded as y);
    return them in the training dtype, or None when none is given. A dask X_val of
    a fit on a dask cluster (``X``: its training rows) stays on the workers, checked
    and scored there (``_dask.DaskRows.validation_set``)."""
    if validation is None or all(v is None for v in validation):
        return None
    X_val, y_val, sw_val = validation
    if X_val is None and y_val is None:
        raise ValueError("sample_weight_val is provided, but X_val and y_val are not.")
    if X_val is None or y_val is None:  # HistGradientBoosting's messages
        given, missing = ("X_val", "y_val") if y_val is None else ("y_val", "X_val")
        raise ValueError(f"{given} is provided, but {missing} was not provided.")
    if not est.early_stopping and not uses_validation_data(est):
        raise ValueError(
            "X_val and y_val are passed to fit while early_stopping is False: set "
            "early_stopping=True to stop on their score (they replace the "
            "validation_fraction split), or set a callback that reads the validation "
            "scores (one with uses_validation_data=True)."
        )
    if optimizer.full_batch:
        raise ValueError(
            "X_val and y_val are scored at each epoch of a stochastic optimizer; the "
            "full-batch L-BFGS solver has no epochs and no early stopping (as "
            f"{'MLPClassifier' if is_classifier(est) else 'MLPRegressor'}"
            "(solver='lbfgs')): use optimizer='adam' (or another stochastic one), or "
            "fit without them."
        )
    if is_rows(X) and dask_input(X_val):
        return X.validation_set(est, X_val, y_val, sw_val, y2d.shape[1])
    template = est._template()
    X_val = template_input(template).validation(est, template, X_val, y2d.dtype)
    y_val = np.ascontiguousarray(est._validation_targets(y_val, fitted), dtype=y2d.dtype)
    if y_val.shape[0] != X_val.shape[0] or y_val.shape[1] != y2d.shape[1]:
        raise ValueError(
            f"y_val has shape {y_val.shape[:1]} x {y_val.shape[1]} outputs, for X_val's "
            f"{X_val.shape[0]} rows and y's {y2d.shape[1]} outputs."
        )
    sw_val = _check_sample_weight(sw_val, X_val, dtype=y2d.dtype)
    if not np.any(sw_val):
        raise ValueError("sample_weight_val must contain at least one non-zero number.")
    return MemoryValidation(X_val), y_val, sw_val


def fit_dtype(est, first_call):
    """The training dtype asked for (None: X's), or for a continued fit the model's."""
    asked = None if est.dtype is None else np.dtype(est.dtype)
    if first_call:
        return asked
    trained = est._converted.dtype
    if asked is not None and asked != trained:
        raise ValueError(
            f"dtype={est.dtype!r}, but the estimator was fitted in {trained} and a "
            f"continued fit (warm_start, partial_fit) keeps its weights in {trained}: "
            f"pass dtype={str(trained)!r} (or None), or fit anew with warm_start=False "
            f"to train in {asked}."
        )
    return trained


def templates_penalty(est, n_samples, full_batch, held_out=True):
    """The template's penalty as ``(alpha, l1_ratio)``, for the rows of one batch.

    All rows at full batch, so that the objective is the template's own
    (families.Family.penalty). ``held_out``: early stopping trains on the rows
    its split leaves (False: on all of them, the validation set being given).
    """
    rows = n_samples
    if not full_batch:
        if held_out and (est.early_stopping or holds_out_validation(est)):
            n_samples -= int(np.ceil(est.validation_fraction * n_samples))
        size = 200 if est.batch_size == "auto" else est.batch_size
        rows = max(1, min(size, n_samples))
    final = final_estimator(est._template())
    return family_of(final).penalty(final, max(n_samples, 1), rows)


def resolve_penalty(est):
    """``(alpha, l1_ratio)`` trained: the estimator's, or with ``"auto"`` the template's."""
    alpha, l1_ratio = est._template_penalty
    alpha = alpha if est.alpha == "auto" else float(est.alpha)
    l1_ratio = l1_ratio if est.l1_ratio == "auto" else float(est.l1_ratio)
    logger.info(
        "penalty: alpha=%.6g, l1_ratio=%.6g (%s)",
        alpha,
        l1_ratio,
        "the template's" if est.alpha == "auto" else "the estimator's",
    )
    return alpha, l1_ratio


def warn_dropped_settings(est, final, n_samples):
    lines = dropped_settings(final, n_samples, penalty_carried=est.alpha == "auto")
    if lines:
        warnings.warn(
            f"These settings of the template {type(final).__name__} do not carry over "
            "(its structure, weights, loss, class weights and, with alpha='auto', its "
            "penalty do; the estimator's own training parameters apply): " + "; ".join(lines) + ".",
            UserWarning,
            stacklevel=5,
        )


def initialize(est, X, y2d, fitted, loss):
    template = est._template()
    warn_dropped_settings(est, final_estimator(template), X.shape[0])
    random_state = check_random_state(est.random_state)
    n_outputs = est._n_model_outputs(y2d)
    head = est.__dict__.pop("_fitted_head", None)  # raw columns: X is the head's output
    fitted_head = est.__dict__.pop("_cluster_head", None)  # fitted on a dask cluster
    if fitted_head is not None:
        template = copy.copy(template)
        template.steps = [*fitted_head.steps, template.steps[-1]]
    model, fine_tuned = prepare_template(
        template if head is None else final_estimator(template), X, n_outputs, random_state
    )
    family_of(final_estimator(model)).prepare(final_estimator(model), est._task)
    est._setup_template(model, fine_tuned, fitted, loss)
    converted = convert_template(est._trained_view(model), X.shape[1], y2d.dtype)
    # Every step that can fail is done: the fitted state is replaced at once.
    for name, value in fitted.items():
        setattr(est, name, value)
    est._random_state = random_state
    est._converted: ConvertedTemplate = converted
    est.estimator_ = model if head is None else with_head(head, template, model)
    est.n_outputs_ = n_outputs
    final = final_estimator(model)
    est.t_ = int(getattr(final, "t_", 0)) if fine_tuned else 0
    est.n_iter_ = 0
    est.loss_curve_ = []
    est._no_improvement_count = 0
    if est.early_stopping:
        est.validation_scores_ = []
        est.best_validation_score_ = -np.inf
        est.best_loss_ = None
    else:
        est.validation_scores_ = None
        est.best_validation_score_ = None
        est.best_loss_ = np.inf
    est._schedule = LearningRateSchedule(est.learning_rate, est.learning_rate_init, est.power_t)
    est._engine_key = None
    for stale in ("_engine", "_optimizer_state", "_export_converted"):
        est.__dict__.pop(stale, None)
    logger.info(
        "%s %s: %d trained tensors (%s)",
        "fine-tuning" if fine_tuned else "training",
        type(final).__name__,
        sum(p.trainable for p in converted.params),
        ", ".join(p.label for p in converted.params if p.trainable),
    )


def refuse_unfitted_head(template):
    """partial_fit would fit the preprocessing of the template on its first chunk only."""
    unfitted = unfitted_head_steps(template)
    if unfitted:
        raise ValueError(
            f"partial_fit cannot fit the preprocessing step(s) {unfitted} of the template "
            "Pipeline: they would see the first chunk of data only (a scaler's statistics, "
            "an encoder's categories would miss the later chunks). Fit them first on "
            "enough of the data, for example 'template[:-1].fit(X_sample)' (the final "
            "model may stay unfitted), or pass a Pipeline whose preprocessing is fitted, "
            "or use fit on the whole data."
        )
