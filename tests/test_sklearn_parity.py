"""Where the estimators must behave as scikit-learn's MLPs and GLMs do.

A loss given to the estimator predicts on the scale it trains (a log-link loss
makes the model predict ``exp`` of its output, as ``MLPRegressor(loss="poisson")``;
an identity-link loss on a log-link template is computed on the predicted
mean), and a continued fit refuses other classes as MLPClassifier does.
"""

import warnings

import numpy as np
import pytest
import scipy.optimize
from _helpers import BACKENDS, onnx_predict
from sklearn.datasets import load_iris
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import (
    GammaRegressor,
    LogisticRegression,
    PoissonRegressor,
    Ridge,
    TweedieRegressor,
)
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn import losses as L

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _counts(n=400, seed=0):
    """Poisson counts with means from 2.7 to 7.4, as a user's count data."""
    rng = np.random.RandomState(seed)
    X = rng.rand(n, 2)
    mu = np.exp(1.0 + 0.5 * X[:, 0] + 0.5 * X[:, 1])
    return X, rng.poisson(mu).astype(np.float64)


def _linear_mlp():
    return MLPRegressor(hidden_layer_sizes=(1,), activation="identity")


def _check_outputs_agree(est, X):
    pred = est.predict(X)
    np.testing.assert_allclose(est.estimator_.predict(X), pred, rtol=1e-5)
    np.testing.assert_allclose(onnx_predict(est.to_onnx(), X).ravel(), pred, rtol=1e-5)
    return pred


@pytest.mark.parametrize("backend", BACKENDS)
def test_poisson_loss_given_to_the_estimator_predicts_the_means(backend):
    X, y = _counts()
    ref = PoissonRegressor(alpha=0.0, tol=1e-10, max_iter=1000).fit(X, y)
    ours = OrtGradientRegressor(
        _linear_mlp(), loss="poisson", optimizer="lbfgs", backend=backend, random_state=0
    ).fit(X, y)
    pred = _check_outputs_agree(ours, X)
    # the linear predictor (about 1 to 2) before; the means (2.7 to 7.4) now
    np.testing.assert_allclose(pred, ref.predict(X), rtol=2e-3)
    assert ours.estimator_.out_activation_ == "exp"
    # the same model as the template's own loss gives
    own = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(1,), activation="identity", loss="poisson"),
        optimizer="lbfgs",
        backend=backend,
        random_state=0,
    ).fit(X, y)
    np.testing.assert_allclose(pred, own.predict(X), rtol=1e-6)


@pytest.mark.parametrize(
    "loss, glm",
    [
        (L.GammaDeviance(), GammaRegressor(alpha=0.0, tol=1e-10, max_iter=1000)),
        (
            L.TweedieDeviance(power=1.5),
            TweedieRegressor(power=1.5, link="log", alpha=0.0, tol=1e-10, max_iter=1000),
        ),
    ],
    ids=["gamma", "tweedie"],
)
def test_log_link_losses_on_an_mlp_predict_exp_of_the_output(loss, glm):
    X, y = _counts()
    y = y + 0.5  # positive for the gamma deviance
    ours = OrtGradientRegressor(_linear_mlp(), loss=loss, optimizer="lbfgs", random_state=0)
    pred = _check_outputs_agree(ours.fit(X, y), X)
    # a linear MLP with an exp output is the GLM with a log link: the same means
    np.testing.assert_allclose(pred, glm.fit(X, y).predict(X), rtol=2e-3)


def test_tweedie_template_with_identity_link_switches_to_the_log_link_of_the_loss():
    X, y = _counts()
    template = TweedieRegressor(power=0.0, alpha=0.0)  # its link="auto" is the identity
    ours = OrtGradientRegressor(template, loss="poisson").fit(X, y)
    assert ours.estimator_.link == "log" and template.link == "auto"
    pred = _check_outputs_agree(ours, X)
    ref = PoissonRegressor(alpha=0.0, tol=1e-10, max_iter=1000).fit(X, y)
    np.testing.assert_allclose(pred, ref.predict(X), rtol=2e-3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_squared_error_on_a_poisson_template_fits_the_predicted_means(backend):
    X, y = _counts()
    ours = OrtGradientRegressor(
        PoissonRegressor(alpha=0.0), loss="squared_error", backend=backend
    ).fit(X, y)
    pred = _check_outputs_agree(ours, X)
    final = ours.estimator_

    def objective(w):  # 0.5 * mean((exp(X w + b) - y) ** 2), scikit-learn's squared error
        r = np.exp(X @ w[:2] + w[2]) - y
        return 0.5 * np.mean(r**2), np.r_[X.T @ (r * (r + y)), np.sum(r * (r + y))] / len(y)

    best = scipy.optimize.minimize(objective, np.zeros(3), jac=True, method="L-BFGS-B").fun
    theirs = objective(np.r_[final.coef_, final.intercept_])[0]
    # exp(eta) fitted to y (before: eta fitted to y, predictions 140 to 260)
    assert theirs <= best * (1 + 1e-4)
    assert 2 < pred.min() and pred.max() < 10


def test_a_log_link_loss_on_a_model_without_one_is_refused_before_training():
    X, y = _counts()
    est = OrtGradientRegressor(Ridge(), optimizer="lbfgs").fit(X, y)
    before = est.predict(X)
    with pytest.raises(ValueError, match="log link.*Ridge predicts its linear output"):
        est.set_params(loss="poisson").fit(X, y)
    np.testing.assert_array_equal(est.predict(X), before)
    with pytest.raises(ValueError, match="PoissonRegressor"):
        OrtGradientRegressor(Ridge(), loss=L.GammaDeviance()).fit(X, y + 1)


def test_warm_start_into_a_log_link_loss_is_refused():
    X, y = _counts()
    est = OrtGradientRegressor(_linear_mlp(), warm_start=True, max_iter=5).fit(X, y)
    before = est.predict(X)
    with pytest.raises(ValueError, match="continued fit.*warm_start=False"):
        est.set_params(loss="poisson").fit(X, y)
    np.testing.assert_array_equal(est.predict(X), before)
    est.set_params(warm_start=False).fit(X, y)  # fitted anew: the exp output
    assert est.estimator_.out_activation_ == "exp"


def test_warm_start_with_other_classes_raises_as_mlpclassifier():
    X, y = load_iris(return_X_y=True)
    two = y < 2
    ref = MLPClassifier(max_iter=5, warm_start=True).fit(X, y)
    with pytest.raises(ValueError) as theirs:
        ref.fit(X[two], y[two])
    for template in (MLPClassifier(), LogisticRegression()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            est = OrtGradientClassifier(template, warm_start=True, max_iter=5).fit(X, y)
        proba = est.predict_proba(X)
        with pytest.raises(ValueError) as ours:
            est.fit(X[two], y[two])
        assert str(ours.value) == str(theirs.value)
        np.testing.assert_array_equal(est.classes_, [0, 1, 2])
        np.testing.assert_array_equal(est.predict_proba(X), proba)
        est.fit(X[::-1], y[::-1])  # the same classes: continues


def test_partial_fit_with_other_classes_raises_as_mlpclassifier():
    X, y = load_iris(return_X_y=True)
    ref = MLPClassifier().partial_fit(X, y, classes=[0, 1, 2])
    with pytest.raises(ValueError) as theirs:
        ref.partial_fit(X, y, classes=[0, 1, 2, 3])
    est = OrtGradientClassifier(MLPClassifier()).partial_fit(X, y, classes=[0, 1, 2])
    with pytest.raises(ValueError) as ours:
        est.partial_fit(X, y, classes=[0, 1, 2, 3])
    assert str(ours.value) == str(theirs.value)
    est.partial_fit(X, y, classes=np.array([2, 1, 0]))  # the same classes, any order
    np.testing.assert_array_equal(est.classes_, [0, 1, 2])


def test_epoch_order_is_sklearn_shuffles():
    from sklearn.utils import shuffle

    from onnxgrad_sklearn._data import shuffled as _shuffled

    ours, theirs = np.random.RandomState(3), np.random.RandomState(3)
    a = b = np.arange(57)
    for _ in range(4):  # each epoch permutes the last one's order
        a, b = _shuffled(a, ours), shuffle(b, random_state=theirs)
        np.testing.assert_array_equal(a, b)
    assert ours.randint(1 << 30) == theirs.randint(1 << 30)  # the same draws


@pytest.mark.parametrize("n, size", [(10, 3), (9, 3), (1, 200), (442, 200), (5, 1)])
def test_batches_are_gen_batches(n, size):
    from sklearn.utils import gen_batches

    from onnxgrad_sklearn._data import slices as _slices

    assert _slices(n, size) == list(gen_batches(n, size))


def test_partial_fit_after_an_early_stopped_fit_goes_on():
    from sklearn.datasets import load_diabetes

    X, y = load_diabetes(return_X_y=True)
    est = OrtGradientRegressor(MLPRegressor(), early_stopping=True, max_iter=5, random_state=0)
    est.fit(X, y)
    assert est.best_loss_ is None  # as MLPRegressor with early stopping
    curve = list(est.loss_curve_)
    est.set_params(early_stopping=False).partial_fit(X, y)  # MLPRegressor: TypeError
    assert est.n_iter_ == 1 and len(est.loss_curve_) == len(curve) + 1
    assert est.best_loss_ == est.loss_curve_[-1]
