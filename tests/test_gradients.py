"""Gradients computed by the runtime against float64 finite differences."""

import warnings

import numpy as np
import pytest
from _helpers import BACKENDS, rel_error
from sklearn.decomposition import PCA
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import ElasticNet, Lasso, LinearRegression, Ridge, SGDRegressor
from sklearn.neural_network import MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, PolynomialFeatures, StandardScaler

from onnxgrad_sklearn.engine import TrainingEngine
from onnxgrad_sklearn.losses import AbsoluteError, Huber, Quantile, SquaredError
from onnxgrad_sklearn.optim import SGD
from onnxgrad_sklearn.templates import convert_template, final_estimator

TEMPLATES = {
    "LinearRegression": lambda: LinearRegression(),
    "LinearRegression-2out": lambda: LinearRegression(),
    "Ridge": lambda: Ridge(),
    "Lasso": lambda: Lasso(alpha=0.01),
    "ElasticNet": lambda: ElasticNet(alpha=0.01),
    "SGDRegressor": lambda: SGDRegressor(random_state=0),
    "MLP-relu": lambda: MLPRegressor(hidden_layer_sizes=(7, 5), random_state=0, max_iter=20),
    "MLP-tanh": lambda: MLPRegressor(
        hidden_layer_sizes=(6,), activation="tanh", random_state=0, max_iter=20
    ),
    "MLP-logistic": lambda: MLPRegressor(
        hidden_layer_sizes=(6,), activation="logistic", random_state=0, max_iter=20
    ),
    "MLP-identity": lambda: MLPRegressor(
        hidden_layer_sizes=(6,), activation="identity", random_state=0, max_iter=20
    ),
    "MLP-2out": lambda: MLPRegressor(
        hidden_layer_sizes=(6,), activation="tanh", random_state=0, max_iter=20
    ),
    "Pipeline-scalers": lambda: make_pipeline(StandardScaler(), MinMaxScaler(), Ridge()),
    "Pipeline-pca-poly": lambda: make_pipeline(PCA(3), PolynomialFeatures(2), LinearRegression()),
    "Pipeline-mlp": lambda: make_pipeline(
        StandardScaler(), MLPRegressor(hidden_layer_sizes=(5,), max_iter=20, random_state=0)
    ),
}

LOSSES = {
    "squared_error": (SquaredError(), lambda r: 0.5 * (r**2).sum(axis=1)),
    "absolute_error": (AbsoluteError(), lambda r: np.abs(r).sum(axis=1)),
    "huber": (
        Huber(epsilon=0.3),
        lambda r: np.where(np.abs(r) <= 0.3, 0.5 * r**2, 0.3 * np.abs(r) - 0.045).sum(axis=1),
    ),
    "quantile": (Quantile(quantile=0.8), lambda r: np.maximum(0.8 * r, -0.2 * r).sum(axis=1)),
}


def _data(n_outputs):
    rng = np.random.RandomState(0)
    X = rng.randn(40, 4).astype(np.float32).astype(np.float64)
    y = np.c_[np.sin(X[:, 0]) + X[:, 1], X[:, 2] * X[:, 3]][:, :n_outputs]
    sw = rng.uniform(0.5, 2.0, 40).astype(np.float32).astype(np.float64)
    return X, y.astype(np.float32).astype(np.float64), sw


def _reference_loss(est, conv, values, X, y, sw, per_sample, alpha, l1_ratio, penalized):
    conv.write_back(final_estimator(est), values)
    pred = np.asarray(est.predict(X), dtype=np.float64).reshape(y.shape)
    loss = np.sum(sw * per_sample(y - pred)) / sw.sum()
    l2 = sum(np.sum(values[k] ** 2) for k in penalized)
    l1 = sum(np.sum(np.abs(values[k])) for k in penalized)
    return loss + alpha * (0.5 * (1 - l1_ratio) * l2 + l1_ratio * l1) / sw.sum()


def _check(template_name, loss_name, alpha=0.0, l1_ratio=0.0, backend="auto"):
    n_outputs = 2 if template_name.endswith("2out") else 1
    X, y, sw = _data(n_outputs)
    est = TEMPLATES[template_name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y.ravel() if n_outputs == 1 else y)
    conv = convert_template(est, X.shape[1])
    trained = [k for k, p in enumerate(conv.params) if p.trainable]
    penalized = [k for k in trained if conv.params[k].penalized]
    loss_obj, per_sample = LOSSES[loss_name]
    engine = TrainingEngine(
        conv.model,
        conv.output_name,
        [conv.initializer_names[k] for k in trained],
        [conv.initializer_names[k] for k in penalized],
        n_outputs,
        loss_obj,
        SGD(),
        alpha=alpha,
        l1_ratio=l1_ratio,
        backend=backend,
    )
    assert engine.backend == backend
    loss, grads = engine.loss_and_gradients(X, y, sw)
    values = [v.astype(np.float64) for v in conv.initializer_values()]
    ref_loss = _reference_loss(est, conv, values, X, y, sw, per_sample, alpha, l1_ratio, penalized)
    assert loss == pytest.approx(ref_loss, rel=1e-4)

    rng = np.random.RandomState(1)
    h = 1e-5
    for k, grad in zip(trained, grads):
        flat = values[k].ravel()
        picks = rng.choice(flat.size, size=min(flat.size, 6), replace=False)
        numeric = []
        for j in picks:
            shifted = []
            for sign in (1, -1):
                moved = [v.copy() for v in values]
                moved[k].ravel()[j] = flat[j] + sign * h
                shifted.append(
                    _reference_loss(
                        est, conv, moved, X, y, sw, per_sample, alpha, l1_ratio, penalized
                    )
                )
            numeric.append((shifted[0] - shifted[1]) / (2 * h))
        assert rel_error(grad.ravel()[picks], numeric) < 1e-3, conv.params[k].label


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("template_name", sorted(TEMPLATES))
def test_squared_error_gradients_of_every_template(template_name, backend):
    _check(template_name, "squared_error", backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss_name", sorted(LOSSES))
@pytest.mark.parametrize("template_name", ["LinearRegression", "MLP-tanh", "Pipeline-mlp"])
def test_gradients_of_every_loss(template_name, loss_name, backend):
    _check(template_name, loss_name, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("l1_ratio", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("template_name", ["Ridge", "MLP-relu", "LinearRegression-2out"])
def test_gradients_with_elastic_net_penalty(template_name, l1_ratio, backend):
    _check(template_name, "squared_error", alpha=0.3, l1_ratio=l1_ratio, backend=backend)
