"""The ONNX model of a fitted estimator as the command line writes it.

:func:`export_onnx` returns the trained graph of a fitted estimator of this
package with the metadata that ``onnxgrad-sklearn predict`` reads (the keys
``META_*``), and for a TransformedTargetRegressor of one (a target standardised
for training) the graph edit that turns its prediction back into raw target
values (:func:`_append_affine`). The command line (:mod:`onnxgrad_sklearn.cli`)
writes what this module returns; it holds no ONNX graph logic of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

__all__ = [
    "META_CLASSES",
    "META_FEATURES",
    "META_FEATURES_JSON",
    "META_TARGET",
    "META_TARGET_SCALING",
    "export_onnx",
]

#: Keys of the trained ONNX model's ``metadata_props``.
META_FEATURES = "feature_names"  # comma-joined
META_FEATURES_JSON = "feature_names_json"  # the same as a JSON list (names may hold commas)
META_TARGET = "target"
META_CLASSES = "classes"  # JSON list, classifiers only
META_TARGET_SCALING = "target_scaling"  # JSON {"mean": ..., "scale": ...}, when scaled


def _scaling(scaler) -> tuple[float, float]:
    """``(mean, scale)`` of a fitted StandardScaler-like transformer."""
    mean = getattr(scaler, "mean_", None)
    scale = getattr(scaler, "scale_", None)
    mean = 0.0 if mean is None else float(mean[0])
    scale = 1.0 if scale is None else float(scale[0])
    return mean, scale


def export_onnx(model, features: Sequence[str], target: str | None = None):
    """The ONNX model of a model written by ``fit``, raw target scale and metadata included.

    Parameters
    ----------
    model : OrtGradientRegressor, OrtGradientClassifier or TransformedTargetRegressor
        A fitted estimator of this package, or a TransformedTargetRegressor of
        a fitted OrtGradientRegressor with a fitted StandardScaler.
    features : sequence of str
        Names of the columns of the input ``X``, in order.
    target : str, optional
        Name of the target column.

    Returns
    -------
    onnx.ModelProto
        The trained graph; for a TransformedTargetRegressor its prediction
        output is followed by ``* scale + mean`` (same output name), so that
        it returns raw targets. ``metadata_props`` hold ``feature_names``
        (comma-joined), ``feature_names_json``, ``target``, ``classes`` (JSON,
        classifiers) and ``target_scaling`` (JSON, when scaled).
    """
    from sklearn.compose import TransformedTargetRegressor

    meta = {META_FEATURES: ",".join(features), META_FEATURES_JSON: json.dumps(list(features))}
    if target is not None:
        meta[META_TARGET] = str(target)
    if isinstance(model, TransformedTargetRegressor):
        onnx_model = model.regressor_.to_onnx()
        mean, scale = _scaling(model.transformer_)
        _append_affine(onnx_model, scale, mean, _prediction_output(model.regressor_))
        meta[META_TARGET_SCALING] = json.dumps({"mean": mean, "scale": scale})
    else:
        onnx_model = model.to_onnx()
    if hasattr(model, "classes_"):
        meta[META_CLASSES] = json.dumps(model.classes_.tolist())
    for key, value in meta.items():
        onnx_model.metadata_props.add(key=key, value=value)
    return onnx_model


def _prediction_output(regressor):
    """The exported graph's prediction output of a fitted regressor (None: its first)."""
    from .families import family_of
    from .templates import final_estimator

    final = final_estimator(regressor.estimator_)
    return family_of(final).prediction_output(final)


def _append_affine(model, scale: float, offset: float, output=None) -> None:
    """Turn the output ``output`` (default: the first) ``y`` into ``y * scale + offset``,
    keeping its name."""
    import numpy as np
    from onnx import helper, numpy_helper

    graph = model.graph
    out = graph.output[0].name if output is None else output
    taken = {n for node in graph.node for n in (*node.input, *node.output)}
    taken |= {i.name for i in graph.initializer} | {i.name for i in graph.input}

    def unique(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    inner, scaled = unique(f"{out}_standardised"), unique(f"{out}_times_scale")
    for node in graph.node:
        for names in (node.input, node.output):
            for i, name in enumerate(names):
                if name == out:
                    names[i] = inner
    info = next(o for o in graph.output if o.name == out)
    dtype = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
    scale_name, offset_name = unique("target_scale"), unique("target_mean")
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([scale], dtype=dtype), scale_name),
            numpy_helper.from_array(np.array([offset], dtype=dtype), offset_name),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Mul", [inner, scale_name], [scaled], name=unique("target_mul")),
            helper.make_node("Add", [scaled, offset_name], [out], name=unique("target_add")),
        ]
    )
