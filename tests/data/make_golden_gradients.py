"""Write golden_gradients.npz: TrainingAgent gradients for the standard backend's tests.

Run with onnxruntime-training installed (Python <= 3.12)::

    python tests/data/make_golden_gradients.py

For each case the file holds the training graph (serialized, with the weights as
initializers), one batch (X, y, sample weights), the weight names, and the loss
and gradients ``TrainingEngine(backend="agent").loss_and_gradients`` gives
(the weights: those after one epoch of training).
"""

import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.losses import AbsoluteError, Huber, Quantile, SquaredError

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _golden import float64_gradients  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = os.path.join(HERE, "golden_gradients.npz")

LOSSES = {
    "squared": SquaredError(),
    "huber": Huber(epsilon=0.5),
    "absolute": AbsoluteError(),
    "quantile": Quantile(quantile=0.7),
}


def cases():
    """Name -> (estimator, task); every estimator fits with alpha > 0."""
    out = {}
    for activation in ("relu", "tanh", "logistic"):
        for name, loss in LOSSES.items():
            mlp = MLPRegressor(hidden_layer_sizes=(8, 4), activation=activation)
            out[f"mlp_{activation}_{name}"] = (OrtGradientRegressor(mlp, loss=loss), "reg")
    out["linear_elastic_net"] = (OrtGradientRegressor(LinearRegression(), l1_ratio=0.5), "reg")
    out["scaler_mlp"] = (
        OrtGradientRegressor(
            make_pipeline(StandardScaler(), MLPRegressor(hidden_layer_sizes=(6,)))
        ),
        "reg",
    )
    for n_classes in (2, 3):
        out[f"mlp_classifier_{n_classes}"] = (
            OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=(7,))),
            n_classes,
        )
        out[f"logistic_regression_{n_classes}"] = (
            OrtGradientClassifier(LogisticRegression()),
            n_classes,
        )
    return out


def data(task, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(64, 5).astype(np.float32)
    if task == "reg":
        y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2]).astype(np.float32)
    else:
        y = np.digitize(X[:, 0] + 0.5 * X[:, 1], [-0.4, 0.4][: task - 1])
    sw = rng.uniform(0.5, 2.0, len(X)).astype(np.float32)
    return X, y, sw


def main():
    arrays = {}
    for name, (est, task) in cases().items():
        X, y, sw = data(task)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est.set_params(max_iter=1, alpha=1e-2, random_state=0, backend="agent").fit(X, y)
        engine = est._engine
        # the training graph with the weights after one epoch (nonzero for linear models)
        training = onnx.ModelProto()
        training.CopyFrom(engine.training)
        current = dict(zip(engine.weight_names, engine.get_weights()))
        for init in training.graph.initializer:
            if init.name in current:
                init.CopyFrom(numpy_helper.from_array(current[init.name], init.name))
        y2d, _ = est._validate_targets(y, False)
        y2d = np.ascontiguousarray(y2d, dtype=np.float32)
        loss, grads = engine.loss_and_gradients(X, y2d, sw)
        arrays[f"{name}/model"] = np.frombuffer(training.SerializeToString(), dtype=np.uint8)
        arrays[f"{name}/X"], arrays[f"{name}/y"], arrays[f"{name}/sw"] = X, y2d, sw
        arrays[f"{name}/weight_names"] = np.array(engine.weight_names)
        arrays[f"{name}/loss"] = np.array(loss)
        for i, g in enumerate(grads):
            arrays[f"{name}/grad_{i}"] = g
        # the same in float64: how far the float32 reference itself is from exact
        _, exact = float64_gradients(training, engine.weight_names, (X, y2d, sw))
        for i, g in enumerate(exact):
            arrays[f"{name}/grad64_{i}"] = g
        print(name, loss, [g.shape for g in grads])
    np.savez_compressed(PATH, **arrays)
    print("wrote", PATH, os.path.getsize(PATH), "bytes")


if __name__ == "__main__":
    main()
