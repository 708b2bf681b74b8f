"""Train scikit-learn models on onnxruntime-training.

The estimators :class:`OrtGradientRegressor` take a scikit-learn model (or a
Pipeline ending in one), convert it to ONNX with skl2onnx, and train its
weights with onnxruntime-training's forward/backward ``TrainingAgent`` and
optimizers written as ONNX graphs.
"""

import logging

from .ortgrad import OrtGradientForwardBackward, TrainingAgent  # checks the runtime first
from ._graph import GraphBuilder
from .classifier import OrtGradientClassifier
from .regressor import OrtGradientRegressor

__all__ = [
    "GraphBuilder",
    "OrtGradientClassifier",
    "OrtGradientForwardBackward",
    "OrtGradientRegressor",
    "TrainingAgent",
]

__version__ = "0.1.0"

logging.getLogger("onnxgrad_sklearn").addHandler(logging.NullHandler())
