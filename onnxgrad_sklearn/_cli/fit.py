"""The ``fit`` command: read the data, choose, train, report and write the outputs."""

from __future__ import annotations

import argparse
import time
import warnings

from .._export import _scaling
from .choose import _choose_loss, _choose_template, _target_scaler, _Template
from .common import _warn
from .data import _check_target, _read_training_data, _Split, _split
from .report import (
    _onnx_metadata,
    _output_paths,
    _print_metrics,
    _print_summary,
    _print_training,
    _write_estimator,
    _write_onnx,
    _write_plot,
)

__all__ = ["fit_command"]


# train --------------------------------------------------------------------------------
def _make_estimator(args, chosen: _Template, loss):
    from ..classifier import OrtGradientClassifier
    from ..regressor import OrtGradientRegressor

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
        dtype=chosen.dtype,
    )


def _train(est, split: _Split, scaler):
    """Fit ``est`` (on the scaled target); return the model that predicts raw targets."""
    from sklearn.exceptions import ConvergenceWarning

    from ..runtime import import_onnxruntime

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


def fit_command(args: argparse.Namespace) -> int:
    """Run ``onnxgrad-sklearn fit`` with the parsed ``args``; return the exit code (0).

    Errors raise :class:`~onnxgrad_sklearn._cli.common.CLIError` (or ``ValueError``,
    ``OSError``, ``ImportError``), which :func:`onnxgrad_sklearn.cli.main` reports.
    """
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

    _write_onnx(model, data, paths.onnx, _onnx_metadata(chosen))
    _write_estimator(model, paths.skops)
    _write_plot(est, paths.png)
    return 0
