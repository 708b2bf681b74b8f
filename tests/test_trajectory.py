"""The same numbers as MLPRegressor: weights and loss curves, epoch by epoch."""

import copy
import warnings

import numpy as np
import pytest
from _helpers import BACKENDS, rel_error
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.optim import SGD, Adam, Momentum, Nesterov

SOLVERS = {
    "sgd": (SGD(), dict(solver="sgd", momentum=0.0)),
    "momentum": (
        Momentum(momentum=0.9),
        dict(solver="sgd", momentum=0.9, nesterovs_momentum=False),
    ),
    "nesterov": (Nesterov(momentum=0.9), dict(solver="sgd", momentum=0.9, nesterovs_momentum=True)),
    "adam": (Adam(), dict(solver="adam")),
}


@pytest.fixture(scope="module")
def fitted_mlp():
    rng = np.random.RandomState(3)
    X = rng.randn(150, 6).astype(np.float32).astype(np.float64)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(150)).astype(np.float32)
    y = y.astype(np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(16, 8), max_iter=3, random_state=0).fit(X, y)
    return mlp, X, y


def _continue_both(
    mlp, X, y, optimizer, sk_params, learning_rate="constant", lr=0.01, backend="auto"
):
    common = dict(
        batch_size=32,
        shuffle=False,
        alpha=1e-4,
        max_iter=5,
        tol=0.0,
        n_iter_no_change=1000,
        learning_rate_init=lr,
        learning_rate=learning_rate,
    )
    ref = copy.deepcopy(mlp).set_params(warm_start=True, **sk_params, **common)
    ours = OrtGradientRegressor(mlp, optimizer=optimizer, backend=backend, **common)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref.fit(X, y)
        ours.fit(X, y)
    return ours, ref


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_weights_and_loss_curve_match_mlpregressor(fitted_mlp, name, backend):
    mlp, X, y = fitted_mlp
    optimizer, sk_params = SOLVERS[name]
    ours, ref = _continue_both(mlp, X, y, optimizer, sk_params, backend=backend)
    assert ours.backend_ == backend
    trained = ours.estimator_
    # the starting point was really moved, by the same amounts
    assert rel_error(ref.coefs_[0], mlp.coefs_[0]) > 1e-3
    for a, b in zip(trained.coefs_ + trained.intercepts_, ref.coefs_ + ref.intercepts_):
        assert rel_error(a, b) < 1e-4
    assert len(ours.loss_curve_) == 5
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_[-5:], rtol=1e-4)
    assert ours.n_iter_ == 5
    assert ours.t_ == ref.t_


@pytest.mark.parametrize("name", sorted(SOLVERS))
def test_the_two_set_step_of_large_models_matches_mlpregressor(fitted_mlp, name, monkeypatch):
    """The standard backend's step for models of 1M weights and more (two sets of
    buffers, the update applied only after a finite loss), here on a small one."""
    from onnxgrad_sklearn.backends import standard

    monkeypatch.setattr(standard, "TWO_SETS_FROM", 0)
    mlp, X, y = fitted_mlp
    optimizer, sk_params = SOLVERS[name]
    ours, ref = _continue_both(mlp, X, y, optimizer, sk_params, backend="standard")
    assert ours._engine._backend.guarded
    trained = ours.estimator_
    for a, b in zip(trained.coefs_ + trained.intercepts_, ref.coefs_ + ref.intercepts_):
        assert rel_error(a, b) < 1e-4
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_[-5:], rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["sgd", "nesterov"])
def test_invscaling_schedule_matches_mlpregressor(fitted_mlp, name, backend):
    mlp, X, y = fitted_mlp
    optimizer, sk_params = SOLVERS[name]
    ours, ref = _continue_both(
        mlp, X, y, optimizer, sk_params, "invscaling", lr=0.5, backend=backend
    )
    trained = ours.estimator_
    for a, b in zip(trained.coefs_ + trained.intercepts_, ref.coefs_ + ref.intercepts_):
        assert rel_error(a, b) < 1e-4
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_[-5:], rtol=1e-4)
    assert ours._schedule.learning_rate == pytest.approx(ref._optimizer.learning_rate)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unfitted_mlp_follows_mlpregressor_from_the_same_seed(backend):
    """Glorot initialisation, shuffling and updates draw from random_state as MLPRegressor."""
    rng = np.random.RandomState(1)
    X = rng.randn(90, 4).astype(np.float32).astype(np.float64)
    y = (X[:, 0] - 2 * X[:, 1] + 0.1 * rng.randn(90)).astype(np.float32).astype(np.float64)
    params = dict(learning_rate_init=0.01, batch_size=20, max_iter=4, random_state=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = MLPRegressor(hidden_layer_sizes=(10,), solver="sgd", momentum=0.9, **params).fit(X, y)
        ours = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(10,)), optimizer="nesterov", backend=backend, **params
        ).fit(X, y)
    for a, b in zip(ours.estimator_.coefs_, ref.coefs_):
        assert rel_error(a, b) < 1e-4
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-4)
