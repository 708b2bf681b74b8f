"""Train scikit-learn models on onnxruntime-training.

The estimators :class:`OrtGradientRegressor` and :class:`OrtGradientClassifier`
take a scikit-learn model (or a Pipeline ending in one), convert it to ONNX with
skl2onnx, and train its weights with onnxruntime-training's forward/backward
``TrainingAgent`` and optimizers written as ONNX graphs.
"""

import logging

from .ortgrad import OrtGradientForwardBackward, TrainingAgent  # checks the runtime first
from ._graph import GraphBuilder
from .classifier import OrtGradientClassifier
from .exceptions import ConvergenceError
from .regressor import OrtGradientRegressor

__all__ = [
    "ConvergenceError",
    "SKOPS_TRUSTED_TYPES",
    "GraphBuilder",
    "OrtGradientClassifier",
    "OrtGradientForwardBackward",
    "OrtGradientRegressor",
    "TrainingAgent",
]

__version__ = "0.1.0"

#: Types to pass as ``trusted`` to ``skops.io.load`` for a fitted estimator of
#: this package (besides scikit-learn's own, which skops trusts by default).
SKOPS_TRUSTED_TYPES = [
    "onnxgrad_sklearn.classifier.OrtGradientClassifier",
    "onnxgrad_sklearn.regressor.OrtGradientRegressor",
    "onnxgrad_sklearn.templates.ConvertedTemplate",
    "onnxgrad_sklearn.templates.ParamRef",
    "onnxgrad_sklearn.optim.LearningRateSchedule",
    "onnxgrad_sklearn.optim.SGD",
    "onnxgrad_sklearn.optim.Momentum",
    "onnxgrad_sklearn.optim.Nesterov",
    "onnxgrad_sklearn.optim.Adam",
    "onnxgrad_sklearn.losses.SquaredError",
    "onnxgrad_sklearn.losses.AbsoluteError",
    "onnxgrad_sklearn.losses.Huber",
    "onnxgrad_sklearn.losses.Quantile",
    "onnxgrad_sklearn.losses.LogLoss",
    "onnxgrad_sklearn.losses.OneVsRestLogLoss",
]

logging.getLogger("onnxgrad_sklearn").addHandler(logging.NullHandler())
