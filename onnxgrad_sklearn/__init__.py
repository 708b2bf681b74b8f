"""Train scikit-learn models on onnxruntime.

The estimators :class:`OrtGradientRegressor` and :class:`OrtGradientClassifier`
take a scikit-learn model (or a Pipeline ending in one), convert it to ONNX with
skl2onnx, and train its weights with optimizers written as ONNX graphs, on one of
two backends: onnxruntime-training's forward/backward ``TrainingAgent``, or
gradient graphs in standard ONNX operators (onnx-ad) on any onnxruntime.
"""

import logging

# onnx, skl2onnx and onnxruntime are imported on first use (fit, predict, to_onnx,
# unpickling), which also checks the onnxruntime installation (runtime.bindings).
from . import families, templates  # noqa: F401  (imported with the package, as before)
from ._config import config_context, get_config, set_config
from .classifier import OrtGradientClassifier
from .exceptions import CheckpointError, ConvergenceError
from .onnx_template import OnnxTemplate
from .regressor import OrtGradientRegressor
from ._trusted import SKOPS_TRUSTED_TYPES
from ._version import __version__  # noqa: F401

__all__ = [
    "CheckpointError",
    "ConvergenceError",
    "SKOPS_TRUSTED_TYPES",
    "GraphBuilder",
    "OnnxTemplate",
    "OrtGradientClassifier",
    "OrtGradientRegressor",
    "config_context",
    "get_config",
    "set_config",
]

logging.getLogger("onnxgrad_sklearn").addHandler(logging.NullHandler())

_AGENT_NAMES = ("OrtGradientForwardBackward", "TrainingAgent")


def __getattr__(name):
    # Imported on first use: GraphBuilder needs onnx, the TrainingAgent classes
    # onnxruntime-training.
    if name == "GraphBuilder":
        from ._graph import GraphBuilder

        return GraphBuilder
    if name in _AGENT_NAMES:
        from .backends import agent

        return getattr(agent, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
