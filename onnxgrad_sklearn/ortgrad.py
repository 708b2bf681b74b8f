"""Former home of the TrainingAgent wrappers, kept for the names it exported.

The runtime helpers now live in :mod:`onnxgrad_sklearn.runtime` (:class:`BoundRun` in
:mod:`onnxgrad_sklearn.backends.buffers`), version pinning and shape inference in
:mod:`onnxgrad_sklearn._passes`, the rewrites of the TrainingAgent's gradient graph
(:func:`rewrite_relu_grad`, :func:`rewrite_batch_sums`) in
:mod:`onnxgrad_sklearn.backends.agent_passes`, and the TrainingAgent classes in
:mod:`onnxgrad_sklearn.backends.agent` (imported on first use of
:class:`TrainingAgent` or :class:`OrtGradientForwardBackward` here, which needs
onnxruntime-training).
"""

from __future__ import annotations

from ._passes import MAX_IR_VERSION, MAX_ML_OPSET, MAX_OPSET, pin_versions, static_shapes
from .backends.agent_passes import rewrite_batch_sums, rewrite_relu_grad
from .backends.buffers import BoundRun
from .runtime import (
    OrtValue,
    device_to_providers,
    ortvalue_view,
    run_with_ortvalues,
    to_ortvalue,
)

__all__ = [
    "MAX_IR_VERSION",
    "MAX_ML_OPSET",
    "MAX_OPSET",
    "BoundRun",
    "OrtValue",
    "device_to_providers",
    "ortvalue_view",
    "pin_versions",
    "rewrite_batch_sums",
    "rewrite_relu_grad",
    "run_with_ortvalues",
    "static_shapes",
    "to_ortvalue",
]

_AGENT_NAMES = ("OrtGradientForwardBackward", "TrainingAgent")


def __getattr__(name):
    if name in _AGENT_NAMES:
        from .backends import agent

        return getattr(agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
