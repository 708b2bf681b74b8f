"""The ``predict`` command: a written model (ONNX or saved estimator) run on a CSV file."""

from __future__ import annotations

import argparse
import json
import os
import sys

from .._export import META_CLASSES, META_FEATURES, META_FEATURES_JSON
from ..templates import is_fitted
from .common import (
    META_OUTPUT_ACTIVATION,
    META_PREDICTION_OUTPUT,
    ONNX_SUFFIXES,
    PICKLE_SUFFIXES,
    SKOPS_SUFFIXES,
    CLIError,
    _feature_frame,
    _load_model,
    _one_line,
    _parent,
    _quoted,
    _read_csv,
)

__all__ = ["predict_command"]


class _OnnxPredictor:
    """Predictions of an ONNX model written by ``fit``.

    Its input is one matrix of the feature columns (named ``X``, or the input of an
    ONNX model trained as the template), or one ``(n, 1)`` input per column (text
    columns encoded inside the model), named after the columns. An ONNX template's
    model gives its prediction in the output its metadata names (a classifier's:
    probabilities or logits, turned into labels and probabilities here).
    """

    def __init__(self, path: str):
        from ..runtime import import_onnxruntime

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
        self.output = meta.get(META_PREDICTION_OUTPUT)  # an ONNX template's prediction
        self.activation = meta.get(META_OUTPUT_ACTIVATION, "none")
        names = [o.name for o in self.session.get_outputs()]
        if self.output is not None and self.output not in names:
            raise CLIError(
                f"the ONNX model in {path} names {self.output!r} as its prediction "
                f"('{META_PREDICTION_OUTPUT}' in its metadata), but its outputs are {names}"
            )

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

        if self.output is not None:  # an ONNX template: its prediction output only
            (out,) = self.session.run([self.output], self._feed(X))
            if self.classes is None:  # a regressor
                return _table(out)
            proba = _template_proba(np.asarray(out, dtype=np.float64), self.activation)
            labels = np.asarray(self.classes, dtype=object)[proba.argmax(axis=1)]
            return _table(labels, proba, self.classes)
        outputs = self.session.run(None, self._feed(X))
        if len(outputs) < 2:  # a regressor
            return _table(outputs[0])
        labels, proba = outputs[0], outputs[1]
        classes = self.classes
        if isinstance(proba, list):  # a ZipMap: one dict per row
            classes = classes or list(proba[0])
            proba = np.array([[row[c] for c in classes] for row in proba])
        return _table(labels, proba, classes)


def _template_proba(out, activation: str):
    """The class probabilities of an ONNX template classifier's output (its rows):
    as the estimator's ``predict_proba`` gives them from the logits."""
    import numpy as np

    out = out.reshape(len(out), -1)
    if activation == "Softmax":
        return out
    if activation == "LogSoftmax":
        return np.exp(out)
    if activation == "Sigmoid":
        if out.shape[1] == 1:  # binary: the second class's probability
            return np.c_[1 - out, out]
        tiny = np.finfo(np.float32).tiny
        p = np.clip(out, tiny, 1 - np.finfo(np.float32).eps)
        out = np.log(p) - np.log1p(-p)  # back to the logits
    if out.shape[1] == 1:  # one logit of a binary problem
        out = np.c_[np.zeros_like(out), out]
    z = out - out.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


class _EstimatorPredictor:
    """Predictions of a saved estimator."""

    def __init__(self, path: str, trust: bool):
        self.model = _load_model(path, trust)
        if not hasattr(self.model, "predict"):
            raise CLIError(f"{path} does not hold an estimator (got {type(self.model).__name__})")
        if not is_fitted(self.model):
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


def predict_command(args: argparse.Namespace) -> int:
    """Run ``onnxgrad-sklearn predict`` with the parsed ``args``; return the exit code (0).

    Errors raise :class:`~onnxgrad_sklearn._cli.common.CLIError` (or ``ValueError``,
    ``OSError``, ``ImportError``), which :func:`onnxgrad_sklearn.cli.main` reports.
    """
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
