"""Training in float64 (``dtype="float64"``): scikit-learn's numbers to machine precision.

From the same start, on float64 data, the estimators follow MLPRegressor and
MLPClassifier (which compute in the dtype of X) within 1e-9 relative; the
gradients of the built-in losses agree with central finite differences; the
double ONNX export gives ``predict``'s numbers; convex templates reach
scikit-learn's own solution.
"""

import copy
import pickle
import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
import scipy.sparse as sp
from _helpers import rel_error
from sklearn import linear_model as lm
from sklearn import svm
from sklearn.base import clone
from sklearn.datasets import load_diabetes, load_iris, make_multilabel_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LinearRegression, LogisticRegression, PoissonRegressor, Ridge
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn import losses as L
from onnxgrad_sklearn._graph import GraphBuilder
from onnxgrad_sklearn.engine import TrainingEngine
from onnxgrad_sklearn.losses import (
    Hinge,
    Huber,
    LogLoss,
    OnnxLoss,
    PoissonDeviance,
    Quantile,
    SquaredError,
)
from onnxgrad_sklearn.optim import LBFGS, SGD, Adam, Momentum, Nesterov
from onnxgrad_sklearn.templates import convert_template

TIGHT = 1e-9

SOLVERS = {
    "sgd": (SGD(), dict(solver="sgd", momentum=0.0)),
    "momentum": (Momentum(0.9), dict(solver="sgd", momentum=0.9, nesterovs_momentum=False)),
    "nesterov": (Nesterov(0.9), dict(solver="sgd", momentum=0.9, nesterovs_momentum=True)),
    "adam": (Adam(), dict(solver="adam")),
}

COMMON = dict(
    batch_size=32,
    shuffle=False,
    alpha=1e-4,
    max_iter=5,
    tol=0.0,
    n_iter_no_change=1000,
)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        # max_iter reached; template settings that do not carry over
        warnings.simplefilter("ignore", ConvergenceWarning)
        warnings.simplefilter("ignore", UserWarning)
        yield


def _data(n=150, d=6, seed=3):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * rng.randn(n)
    return X, y


@pytest.fixture(scope="module")
def fitted_regressor():
    X, y = _data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPRegressor(hidden_layer_sizes=(16, 8), max_iter=3, random_state=0).fit(X, y)
    assert mlp.coefs_[0].dtype == np.float64
    return mlp, X, y


@pytest.fixture(scope="module", params=[2, 3], ids=["binary", "multiclass"])
def fitted_classifier(request):
    X, y = _data(seed=5)
    labels = np.digitize(y, np.quantile(y, np.linspace(0, 1, request.param + 1)[1:-1]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        mlp = MLPClassifier(hidden_layer_sizes=(12,), max_iter=3, random_state=0).fit(X, labels)
    return mlp, X, labels


def _params(est):
    return list(est.coefs_) + list(est.intercepts_)


def _assert_same_model(ours, ref, X, start=None, bound=TIGHT):
    trained = ours.estimator_
    for a, b in zip(_params(trained), _params(ref)):
        assert a.dtype == np.float64
        assert rel_error(a, b) < bound
    if start is not None:  # the start was really moved
        assert rel_error(ref.coefs_[0], start.coefs_[0]) > 1e-4
    assert ours.predict(X).dtype == np.float64
    assert rel_error(ours.predict(X), ref.predict(X)) < bound


def _continue_regressor(mlp, X, y, name, learning_rate="constant", lr=0.01, **fit):
    optimizer, sk_params = SOLVERS[name]
    common = dict(COMMON, learning_rate_init=lr, learning_rate=learning_rate)
    ref = copy.deepcopy(mlp).set_params(warm_start=True, **sk_params, **common)
    ours = OrtGradientRegressor(mlp, optimizer=optimizer, dtype="float64", **common)
    ref.fit(X, y, **fit)
    ours.fit(X, y, **fit)
    return ours, ref


SCHEDULES = [
    pytest.param(name, "constant", 0.01, id=f"{name}-constant") for name in sorted(SOLVERS)
] + [
    # MLPRegressor's learning_rate schedules apply to solver="sgd" only
    pytest.param(name, "invscaling", 0.5, id=f"{name}-invscaling")
    for name in ("sgd", "momentum", "nesterov")
]


@pytest.mark.parametrize("name, learning_rate, lr", SCHEDULES)
def test_regressor_follows_mlpregressor_in_float64(fitted_regressor, name, learning_rate, lr):
    mlp, X, y = fitted_regressor
    ours, ref = _continue_regressor(mlp, X, y, name, learning_rate, lr)
    assert ours.backend_ == "standard"
    _assert_same_model(ours, ref, X, start=mlp)
    assert len(ours.loss_curve_) == 5
    assert rel_error(ours.loss_curve_, ref.loss_curve_[-5:]) < TIGHT
    assert ours.t_ == ref.t_
    if name != "adam":  # scikit-learn's Adam keeps its bias-corrected rate there
        assert ours._schedule.learning_rate == pytest.approx(
            ref._optimizer.learning_rate, rel=1e-15
        )


def test_adaptive_schedule_follows_mlpregressor_in_float64(fitted_regressor):
    """A tolerance no epoch meets: the rate is divided by 5 at the same epochs."""
    mlp, X, y = fitted_regressor
    optimizer, sk_params = SOLVERS["sgd"]
    common = dict(COMMON, learning_rate="adaptive", learning_rate_init=0.05, tol=10.0)
    common.update(max_iter=8, n_iter_no_change=1)
    ref = copy.deepcopy(mlp).set_params(warm_start=True, **sk_params, **common)
    # MLPRegressor's warm start carries its stopping state over, this estimator's fit
    # starts afresh from the template's weights: the same start for both
    ref._no_improvement_count, ref.best_loss_ = 0, np.inf
    ref.fit(X, y)
    ours = OrtGradientRegressor(mlp, optimizer=optimizer, dtype="float64", **common).fit(X, y)
    assert ref._optimizer.learning_rate < 0.05  # the schedule did change the rate
    assert ours._schedule.learning_rate == pytest.approx(ref._optimizer.learning_rate, rel=1e-15)
    _assert_same_model(ours, ref, X)
    assert rel_error(ours.loss_curve_, ref.loss_curve_[-len(ours.loss_curve_) :]) < TIGHT


def test_sample_weights_follow_mlpregressor_in_float64(fitted_regressor):
    mlp, X, y = fitted_regressor
    sw = np.random.RandomState(0).uniform(0.2, 3.0, len(y))
    ours, ref = _continue_regressor(mlp, X, y, "adam", sample_weight=sw)
    _assert_same_model(ours, ref, X, start=mlp)
    assert rel_error(ours.loss_curve_, ref.loss_curve_[-5:]) < TIGHT
    plain, _ = _continue_regressor(mlp, X, y, "adam")  # the weights do change the result
    assert rel_error(plain.estimator_.coefs_[0], ours.estimator_.coefs_[0]) > 1e-4


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_partial_fit_sequence_follows_mlpregressor_in_float64(name):
    """Three partial_fit calls from an unfitted template: Glorot draws in float64 too."""
    X, y = _data(n=180)
    optimizer, sk_params = SOLVERS[name]
    common = dict(batch_size=25, shuffle=False, alpha=1e-3, learning_rate_init=0.01)
    ref = MLPRegressor(hidden_layer_sizes=(10,), random_state=4, **sk_params, **common)
    ours = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(10,)),
        optimizer=optimizer,
        random_state=4,
        dtype="float64",
        **common,
    )
    for rows in (slice(0, 60), slice(60, 120), slice(120, 180)):
        ref.partial_fit(X[rows], y[rows])
        ours.partial_fit(X[rows], y[rows])
        assert ours.loss_ == pytest.approx(ref.loss_, rel=TIGHT)
    _assert_same_model(ours, ref, X)
    assert ours.t_ == ref.t_ == 180


def test_early_stopping_follows_mlpregressor_in_float64():
    """Validation scores, the stopping epoch and the weights of the epoch kept."""
    X, y = _data(n=200)
    params = dict(
        hidden_layer_sizes=(20,),
        learning_rate_init=0.2,
        batch_size=20,
        max_iter=40,
        random_state=2,
        early_stopping=True,
        n_iter_no_change=3,
        tol=1e-3,
        validation_fraction=0.2,
    )
    ref = MLPRegressor(solver="sgd", momentum=0.9, **params).fit(X, y)
    template = MLPRegressor(hidden_layer_sizes=params.pop("hidden_layer_sizes"))
    ours = OrtGradientRegressor(template, optimizer="nesterov", dtype="float64", **params)
    ours.fit(X, y)
    assert ours.n_iter_ == ref.n_iter_ < 40  # stopped early, at the same epoch
    kept = int(np.argmax(ref.validation_scores_))
    assert kept < ref.n_iter_ - 1  # the weights kept are not the last epoch's
    assert rel_error(ours.validation_scores_, ref.validation_scores_) < TIGHT
    assert ours.best_validation_score_ == pytest.approx(ref.best_validation_score_, rel=TIGHT)
    assert rel_error(ours.loss_curve_, ref.loss_curve_) < TIGHT
    _assert_same_model(ours, ref, X)


@pytest.mark.parametrize("name", ["sgd", "nesterov", "adam"])
def test_classifier_follows_mlpclassifier_in_float64(fitted_classifier, name):
    mlp, X, labels = fitted_classifier
    optimizer, sk_params = SOLVERS[name]
    common = dict(COMMON, learning_rate_init=0.05)
    ref = copy.deepcopy(mlp).set_params(warm_start=True, **sk_params, **common).fit(X, labels)
    ours = OrtGradientClassifier(mlp, optimizer=optimizer, dtype="float64", **common)
    ours.fit(X, labels)
    _assert_same_model_classifier(ours, ref, X, mlp)
    assert rel_error(ours.loss_curve_, ref.loss_curve_[-5:]) < TIGHT


def _assert_same_model_classifier(ours, ref, X, start=None):
    for a, b in zip(_params(ours.estimator_), _params(ref)):
        assert a.dtype == np.float64
        assert rel_error(a, b) < TIGHT
    if start is not None:
        assert rel_error(ref.coefs_[0], start.coefs_[0]) > 1e-4
    proba = ours.predict_proba(X)
    assert proba.dtype == np.float64
    assert rel_error(proba, ref.predict_proba(X)) < TIGHT
    np.testing.assert_array_equal(ours.predict(X), ref.predict(X))


def test_classifier_sample_weights_and_early_stopping_in_float64():
    X, y = _data(n=240, seed=7)
    labels = (y > np.median(y)).astype(int)
    sw = np.random.RandomState(1).uniform(0.5, 2.0, len(y))
    params = dict(
        learning_rate_init=0.1,
        batch_size=24,
        max_iter=30,
        random_state=3,
        early_stopping=True,
        n_iter_no_change=3,
        tol=1e-4,
    )
    ref = MLPClassifier(hidden_layer_sizes=(8,), solver="adam", **params)
    ref.fit(X, labels, sample_weight=sw)
    ours = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(8,)), optimizer="adam", dtype="float64", **params
    ).fit(X, labels, sample_weight=sw)
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.validation_scores_, ref.validation_scores_, rtol=TIGHT)
    assert rel_error(ours.loss_curve_, ref.loss_curve_) < TIGHT
    _assert_same_model_classifier(ours, ref, X)


def test_lbfgs_follows_mlpregressor_lbfgs_in_float64(fitted_regressor):
    mlp, X, y = fitted_regressor
    ref = copy.deepcopy(mlp).set_params(
        warm_start=True, solver="lbfgs", max_iter=20, tol=0.0, alpha=1e-3
    )
    ref.fit(X, y)
    ours = OrtGradientRegressor(
        mlp, optimizer="lbfgs", max_iter=20, tol=0.0, alpha=1e-3, dtype="float64"
    ).fit(X, y)
    assert ours.n_iter_ == ref.n_iter_ == 20
    assert ours.loss_ == pytest.approx(ref.loss_, rel=1e-8)
    _assert_same_model(ours, ref, X, start=mlp, bound=1e-8)


# gradients -----------------------------------------------------------------------------
def _engine(loss, n_outputs, X, alpha=0.0, l1_ratio=0.0):
    rng = np.random.RandomState(2)
    est = LinearRegression()
    est.coef_ = 0.3 * rng.randn(n_outputs, X.shape[1])
    est.intercept_ = 0.1 * rng.randn(n_outputs)
    est.n_features_in_ = X.shape[1]
    conv = convert_template(est, X.shape[1], np.float64)
    assert conv.model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    names = conv.initializer_names
    engine = TrainingEngine(
        conv.model, conv.output_name, names, names[:1], n_outputs, loss, SGD(), alpha, l1_ratio
    )
    assert engine.backend == "standard"
    return engine


GRADIENT_CASES = {
    "squared_error": (SquaredError(), "real"),
    "huber": (Huber(epsilon=0.5), "real"),
    "quantile": (Quantile(quantile=0.7), "real"),
    "poisson": (PoissonDeviance(), "counts"),
    "log_loss": (LogLoss(), "onehot"),
    "hinge": (Hinge(), "onehot"),
    "absolute_error": (L.AbsoluteError(), "real"),
    "epsilon_insensitive": (L.EpsilonInsensitive(epsilon=0.2), "real"),
    "squared_epsilon_insensitive": (L.SquaredEpsilonInsensitive(epsilon=0.2), "real"),
    "gamma": (L.GammaDeviance(), "positive"),
    "tweedie": (L.TweedieDeviance(power=1.5), "counts"),
    "squared_hinge": (L.SquaredHinge(), "onehot"),
    "modified_huber": (L.ModifiedHuber(), "onehot"),
    "perceptron": (L.Perceptron(), "onehot"),
}


def test_gradient_cases_cover_every_built_in_loss():
    assert set(GRADIENT_CASES) == set(L.REGRESSION_LOSSES + L.CLASSIFICATION_LOSSES)
    assert len(GRADIENT_CASES) == 14
    for name, (loss, _) in GRADIENT_CASES.items():
        assert type(loss) is type(L.get_loss(name))


@pytest.mark.parametrize("penalty", [(0.0, 0.0), (0.3, 0.5)], ids=["plain", "elastic-net"])
@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_float64_gradients_match_central_differences(name, penalty):
    loss, kind = GRADIENT_CASES[name]
    rng = np.random.RandomState(0)
    X = rng.randn(40, 3)
    n_outputs = 2
    if kind == "real":
        y = rng.randn(40, n_outputs)
    elif kind == "counts":
        y = rng.poisson(1.5, (40, n_outputs)).astype(np.float64)
    elif kind == "positive":
        y = rng.uniform(0.5, 3.0, (40, n_outputs))
    else:
        y = np.eye(n_outputs)[rng.randint(0, n_outputs, 40)]
    sw = rng.uniform(0.5, 2.0, 40)
    engine = _engine(loss, n_outputs, X, *penalty)
    loss_value, grads = engine.loss_and_gradients(X, y, sw)
    assert isinstance(loss_value, float) and all(g.dtype == np.float64 for g in grads)
    weights = engine.get_weights()
    assert all(w.dtype == np.float64 for w in weights)
    h = 1e-6
    for k, grad in enumerate(grads):
        numeric = np.zeros_like(grad)
        for j in range(grad.size):
            values = []
            for sign in (1, -1):
                moved = [w.copy() for w in weights]
                moved[k].ravel()[j] += sign * h
                engine.set_weights(moved)
                values.append(engine.loss(X, y, sw))
            numeric.ravel()[j] = (values[0] - values[1]) / (2 * h)
        engine.set_weights(weights)
        assert rel_error(grad, numeric) < 1e-7, (name, k)


# ONNX export ---------------------------------------------------------------------------
def _run(model, X):
    sess = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return sess.run(None, {sess.get_inputs()[0].name: X})


def test_double_export_equals_predict(fitted_regressor):
    mlp, X, y = fitted_regressor
    ours, _ = _continue_regressor(mlp, X, y, "adam")
    model = ours.to_onnx()
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    (pred,) = _run(model, X)
    assert pred.dtype == np.float64
    np.testing.assert_allclose(pred.ravel(), ours.predict(X), rtol=1e-12, atol=0)
    # a float32 graph of the same model, for deployment
    single = ours.to_onnx(dtype="float32")
    assert single.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    (pred32,) = _run(single, X.astype(np.float32))
    assert pred32.dtype == np.float32
    assert 1e-9 < rel_error(pred32.ravel(), ours.predict(X)) < 1e-5
    assert ours.to_onnx(dtype="float64").SerializeToString() == model.SerializeToString()
    with pytest.raises(ValueError, match="float32"):
        ours.to_onnx(dtype="float16")


def test_double_export_equals_predict_proba(fitted_classifier):
    mlp, X, labels = fitted_classifier
    ours = OrtGradientClassifier(mlp, optimizer="adam", dtype="float64", **COMMON)
    ours.fit(X, labels)
    model = ours.to_onnx()
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    label, proba = _run(model, X)
    assert proba.dtype == np.float64
    np.testing.assert_allclose(proba, ours.predict_proba(X), rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(ours.classes_[label.astype(int)], ours.predict(X))
    _, proba32 = _run(ours.to_onnx(dtype="float32"), X.astype(np.float32))
    np.testing.assert_allclose(proba32, ours.predict_proba(X), atol=1e-5)


# every template family in float64 ------------------------------------------------------
def _float64_arrays(est):
    """The trained arrays of a fitted template (linear or MLP)."""
    names = ("coefs_", "intercepts_") if hasattr(est, "coefs_") else ("coef_", "intercept_")
    arrays = []
    for name in names:
        value = getattr(est, name)
        arrays.extend(value if isinstance(value, list) else [value])
    return [np.asarray(a) for a in arrays]


def _family_data(target):
    X, y = load_diabetes(return_X_y=True)
    X, y = StandardScaler().fit_transform(X[:200]), y[:200]
    if target == "positive":  # GLMs with a log link, Gamma: y > 0
        return X, y / y.mean()
    return X, (y - y.mean()) / y.std()


REGRESSION_FAMILIES = {
    "LinearRegression": (lm.LinearRegression(), "real"),
    # Lasso() and QuantileRegressor() (alpha=1.0, their L1 penalty carried over) have
    # all-zero coefficients on these data, as scikit-learn's own fits do
    "Lasso": (lm.Lasso(alpha=0.01), "real"),
    "SGDRegressor": (lm.SGDRegressor(), "real"),
    "SGDRegressor-huber": (lm.SGDRegressor(loss="huber"), "real"),
    "SGDRegressor-epsilon_insensitive": (lm.SGDRegressor(loss="epsilon_insensitive"), "real"),
    "SGDRegressor-squared_epsilon_insensitive": (
        lm.SGDRegressor(loss="squared_epsilon_insensitive"),
        "real",
    ),
    "HuberRegressor": (lm.HuberRegressor(), "real"),
    "QuantileRegressor": (lm.QuantileRegressor(quantile=0.7, alpha=0.01), "real"),
    "LinearSVR": (svm.LinearSVR(epsilon=0.1), "real"),
    "LinearSVR-squared": (svm.LinearSVR(loss="squared_epsilon_insensitive"), "real"),
    "PoissonRegressor": (lm.PoissonRegressor(), "positive"),
    "GammaRegressor": (lm.GammaRegressor(), "positive"),
    "TweedieRegressor-1.5": (lm.TweedieRegressor(power=1.5), "positive"),
    "TweedieRegressor-0-identity": (lm.TweedieRegressor(power=0.0), "real"),
    "MLPRegressor": (MLPRegressor(hidden_layer_sizes=(5, 5)), "real"),
    "MLPRegressor-poisson": (MLPRegressor(hidden_layer_sizes=(5,), loss="poisson"), "positive"),
}


@pytest.mark.parametrize("name", sorted(REGRESSION_FAMILIES))
def test_every_regression_family_trains_predicts_and_exports_in_float64(name):
    template, target = REGRESSION_FAMILIES[name]
    X, y = _family_data(target)
    est = OrtGradientRegressor(template, dtype="float64", max_iter=5, random_state=0).fit(X, y)
    assert est.backend_ == "standard"
    arrays = _float64_arrays(est.estimator_)
    assert all(a.dtype == np.float64 for a in arrays)
    assert np.abs(arrays[0]).max() > 0  # trained (linear templates start from zeros)
    pred = est.predict(X)
    assert pred.dtype == np.float64 and pred.shape == y.shape
    # scikit-learn's own predict with the trained float64 weights
    assert rel_error(est.estimator_.predict(X), pred) < 1e-12
    model = est.to_onnx()
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    (exported,) = _run(model, X)[:1]
    assert exported.dtype == np.float64
    np.testing.assert_allclose(exported.ravel(), pred, rtol=1e-12, atol=1e-14)


CLASSIFICATION_FAMILIES = {
    "LogisticRegression": lm.LogisticRegression(),
    "SGDClassifier-log_loss": lm.SGDClassifier(loss="log_loss"),
    "SGDClassifier-hinge": lm.SGDClassifier(loss="hinge"),
    "SGDClassifier-squared_hinge": lm.SGDClassifier(loss="squared_hinge"),
    "SGDClassifier-modified_huber": lm.SGDClassifier(loss="modified_huber"),
    "SGDClassifier-perceptron": lm.SGDClassifier(loss="perceptron"),
    "Perceptron": lm.Perceptron(),
    "LinearSVC": svm.LinearSVC(),
    "LinearSVC-hinge": svm.LinearSVC(loss="hinge"),
    "RidgeClassifier": lm.RidgeClassifier(),
    "MLPClassifier": MLPClassifier(hidden_layer_sizes=(5, 5)),
}


def _check_classifier_in_float64(est, X):
    arrays = _float64_arrays(est.estimator_)
    assert all(a.dtype == np.float64 for a in arrays)
    assert np.abs(arrays[0]).max() > 0
    labels = est.predict(X)
    np.testing.assert_array_equal(est.estimator_.predict(X), labels)
    decision = est.decision_function(X)
    assert decision.dtype == np.float64
    if hasattr(est.estimator_, "decision_function"):
        assert rel_error(est.estimator_.decision_function(X), decision) < 1e-12
    model = est.to_onnx()
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE
    exported_labels, second = _run(model, X)
    np.testing.assert_array_equal(exported_labels.reshape(labels.shape), labels)
    assert second.dtype == np.float64
    if hasattr(est, "predict_proba"):
        proba = est.predict_proba(X)
        assert proba.dtype == np.float64
        # scikit-learn's probabilities of the trained weights (modified Huber's clipped ones)
        assert rel_error(est.estimator_.predict_proba(X), proba) < 1e-12
        np.testing.assert_allclose(second, proba, rtol=1e-12, atol=1e-15)
    else:  # the decision values: (n, 1) or [-f, f] for two classes, one per class otherwise
        scores = second.reshape(len(X), -1)
        expected = decision.reshape(len(X), -1)
        np.testing.assert_allclose(scores[:, -expected.shape[1] :], expected, rtol=1e-12)
    # the float32 export of the same model, for deployment: the same outputs, rounded
    _, second32 = _run(est.to_onnx(dtype="float32"), X.astype(np.float32))
    assert second32.dtype == np.float32 and second32.shape == second.shape
    np.testing.assert_allclose(second32, second, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_classes", [2, 3])
@pytest.mark.parametrize("name", sorted(CLASSIFICATION_FAMILIES))
def test_every_classification_family_trains_predicts_and_exports_in_float64(name, n_classes):
    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    if n_classes == 2:
        X, y = X[y > 0], y[y > 0]
    template = CLASSIFICATION_FAMILIES[name]
    est = OrtGradientClassifier(template, dtype="float64", max_iter=5, random_state=0).fit(X, y)
    assert est.backend_ == "standard"
    probabilistic = ("LogisticRegression", "SGDClassifier-log_loss", "MLPClassifier")
    gives_proba = name in probabilistic or name == "SGDClassifier-modified_huber"
    assert hasattr(est, "predict_proba") == gives_proba
    _check_classifier_in_float64(est, X)


@pytest.mark.parametrize("n_labels", [2, 3])
def test_multilabel_mlp_classifier_trains_predicts_and_exports_in_float64(n_labels):
    X, Y = make_multilabel_classification(
        n_samples=150, n_features=5, n_classes=n_labels, random_state=0
    )
    template = MLPClassifier(hidden_layer_sizes=(6,))
    est = OrtGradientClassifier(template, dtype="float64", max_iter=5, random_state=0).fit(X, Y)
    assert est.predict(X).shape == Y.shape
    _check_classifier_in_float64(est, X)


# the parameter -------------------------------------------------------------------------
def _fit_small(dtype, X, y):
    return OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(4,)), max_iter=2, random_state=0, dtype=dtype
    ).fit(X, y)


def test_dtype_none_follows_x():
    X, y = _data(n=40, d=3)
    for data, expected in (
        (X.astype(np.float32), np.float32),
        (X, np.float64),
        (np.round(X * 10).astype(np.int64), np.float64),
    ):
        est = _fit_small(None, data, y)
        assert est.estimator_.coefs_[0].dtype == expected
        elem = est.to_onnx().graph.input[0].type.tensor_type.elem_type
        assert elem == onnx.helper.np_dtype_to_tensor_dtype(np.dtype(expected))
    # the default stays float32 whatever X is
    assert _fit_small("float32", X, y).estimator_.coefs_[0].dtype == np.float32
    # a continued fit keeps the model's dtype; an explicit other one is refused
    est = _fit_small(None, X, y).set_params(warm_start=True)
    est.fit(X.astype(np.float32), y)
    assert est.estimator_.coefs_[0].dtype == np.float64
    with pytest.raises(ValueError, match="warm_start=False"):
        est.set_params(dtype="float32").fit(X, y)


def test_agent_backend_with_float64_is_refused_before_conversion(monkeypatch):
    import onnxgrad_sklearn._setup as base

    def no_conversion(*args, **kwargs):
        raise AssertionError("converted before the backend was checked")

    monkeypatch.setattr(base, "convert_template", no_conversion)
    X, y = _data(n=30, d=3)
    est = OrtGradientRegressor(backend="agent", dtype="float64")
    with pytest.raises(ValueError, match="backend='standard'"):
        est.fit(X, y)
    assert not hasattr(est, "estimator_")


def test_dtype_is_an_ordinary_parameter(tmp_path):
    X, y = _data(n=60, d=3)
    est = OrtGradientRegressor(Ridge(), dtype="float64", max_iter=50)
    assert clone(est).dtype == "float64"
    assert OrtGradientClassifier(dtype=None).get_params()["dtype"] is None
    search = GridSearchCV(est, {"alpha": [0.1, 1.0]}, cv=2).fit(X, y)
    assert search.best_estimator_.dtype == "float64"
    assert search.best_estimator_.estimator_.coef_.dtype == np.float64
    est.fit(X, y)
    back = pickle.loads(pickle.dumps(est))
    assert back.dtype == "float64"
    np.testing.assert_array_equal(back.predict(X), est.predict(X))
    sio = pytest.importorskip("skops.io")
    import onnxgrad_sklearn

    path = tmp_path / "model.skops"
    sio.dump(est, path)
    loaded = sio.load(path, trusted=onnxgrad_sklearn.SKOPS_TRUSTED_TYPES)
    assert loaded.dtype == "float64"
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    with pytest.raises(ValueError, match="dtype"):
        OrtGradientRegressor(dtype="float16").fit(X, y)


# losses and builders in the training dtype ---------------------------------------------
def test_graph_builder_constants_follow_its_dtype():
    g = GraphBuilder(dtype=np.float64)
    name = g.const(0.5)
    assert g.initializers[-1].data_type == onnx.TensorProto.DOUBLE
    assert g.const([1, 2], np.int64) != name
    assert g.initializers[-1].data_type == onnx.TensorProto.INT64
    assert GraphBuilder().initializers == [] and GraphBuilder().elem_type == onnx.TensorProto.FLOAT
    with pytest.raises(ValueError, match="float32 or float64"):
        GraphBuilder(dtype=np.float16)


def _half_squared_loss(elem=onnx.TensorProto.FLOAT, cast_to=None):
    """0.5 * sum((y - p) ** 2) per sample, written with a float constant and a Cast."""
    h = onnx.helper
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    nodes = [
        h.make_node("Sub", ["pred", "true"], ["r"]),
        h.make_node("Mul", ["r", "r"], ["r2"]),
        h.make_node("Constant", [], ["half"], value_float=0.5),
        h.make_node("Cast", ["half"], ["half_cast"], to=cast_to or elem),
        h.make_node("Mul", ["r2", "half_cast"], ["scaled"]),
        h.make_node("ReduceSum", ["scaled", "axes"], ["loss"], keepdims=0),
    ]
    graph = h.make_graph(
        nodes,
        "half_squared",
        [
            h.make_tensor_value_info("pred", elem, None),
            h.make_tensor_value_info("true", elem, None),
        ],
        [h.make_tensor_value_info("loss", elem, None)],
        initializer=[
            onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
            onnx.numpy_helper.from_array(np.array(1.0, dtype), "unused_one"),
        ],
    )
    return h.make_model(graph)


def test_float32_onnx_loss_is_retyped_for_float64(fitted_regressor):
    mlp, X, y = fitted_regressor
    common = dict(COMMON, learning_rate_init=0.01)
    builtin = OrtGradientRegressor(mlp, optimizer="adam", dtype="float64", **common).fit(X, y)
    custom = OrtGradientRegressor(
        mlp, loss=OnnxLoss(_half_squared_loss()), optimizer="adam", dtype="float64", **common
    ).fit(X, y)
    for a, b in zip(_params(custom.estimator_), _params(builtin.estimator_)):
        assert rel_error(a, b) < 1e-14
    # in float32 the same graph trains as it is
    OrtGradientRegressor(mlp, loss=OnnxLoss(_half_squared_loss()), max_iter=1).fit(X, y)


def test_onnx_loss_that_cannot_be_retyped_is_refused(fitted_regressor):
    mlp, X, y = fitted_regressor
    narrow = OnnxLoss(_half_squared_loss(cast_to=onnx.TensorProto.FLOAT16))
    with pytest.raises(ValueError, match="float16"):
        OrtGradientRegressor(mlp, loss=narrow, dtype="float64", max_iter=1).fit(X, y)
    double = OnnxLoss(_half_squared_loss(onnx.TensorProto.DOUBLE))
    with pytest.raises(ValueError, match="dtype='float64'"):
        OrtGradientRegressor(mlp, loss=double, max_iter=1).fit(X, y)
    # written in double, it trains in float64 as it is
    OrtGradientRegressor(mlp, loss=double, dtype="float64", max_iter=1).fit(X, y)


# convex templates against scikit-learn's own solution ----------------------------------
# (the non-smooth ones, QuantileRegressor, LinearSVR and the hinge, by objective value in
# both dtypes: tests/test_convex.py)
#: scipy's default ftol (2.2e-9, as MLPRegressor) stops 3e-7 (LogisticRegression) to
#: 1e-5 (PoissonRegressor) away; scikit-learn's linear models pass 64 * eps
SKLEARN_LBFGS = LBFGS(ftol=64 * np.finfo(float).eps)


def _convex_data():
    rng = np.random.RandomState(0)
    X = rng.randn(200, 5)
    w = np.array([0.5, -1.0, 0.25, 0.0, 0.8])
    return X, X @ w, rng


def _assert_close_coefficients(ours, ref, bound=1e-6):
    coef = np.r_[np.ravel(ours.coef_), np.ravel(ours.intercept_)]
    expected = np.r_[np.ravel(ref.coef_), np.ravel(ref.intercept_)]
    assert coef.dtype == np.float64
    assert rel_error(coef, expected) < bound


def test_logistic_regression_reaches_sklearn_solution_in_float64():
    X, z, rng = _convex_data()
    labels = (z + 0.5 * rng.randn(len(z)) > 0).astype(int)
    C = 0.5
    ref = LogisticRegression(C=C, tol=1e-12, max_iter=10_000).fit(X, labels)
    ours = OrtGradientClassifier(
        LogisticRegression(C=C),
        alpha=1 / C,
        tol=1e-12,
        max_iter=10_000,
        optimizer=SKLEARN_LBFGS,
        dtype="float64",
    ).fit(X, labels)
    _assert_close_coefficients(ours.estimator_, ref)


def test_ridge_reaches_sklearn_solution_in_float64():
    X, z, rng = _convex_data()
    y = z + 0.1 * rng.randn(len(z))
    ref = Ridge(alpha=3.0).fit(X, y)  # closed form
    ours = OrtGradientRegressor(
        Ridge(alpha=3.0),
        alpha=3.0,
        tol=1e-12,
        max_iter=10_000,
        optimizer=SKLEARN_LBFGS,
        dtype="float64",
    ).fit(X, y)
    _assert_close_coefficients(ours.estimator_, ref)


def test_poisson_regressor_reaches_sklearn_solution_in_float64():
    X, z, rng = _convex_data()
    y = rng.poisson(np.exp(0.3 * z)).astype(np.float64)
    a = 0.01
    ref = PoissonRegressor(alpha=a, tol=1e-12, max_iter=10_000).fit(X, y)
    ours = OrtGradientRegressor(
        PoissonRegressor(alpha=a),
        alpha=a * len(y),
        tol=1e-12,
        max_iter=10_000,
        optimizer=SKLEARN_LBFGS,
        dtype="float64",
    ).fit(X, y)
    _assert_close_coefficients(ours.estimator_, ref)


def _imbalanced_iris():
    X, y = load_iris(return_X_y=True)
    keep = np.r_[0:50, 50:65, 100:140]  # 50, 15 and 40 samples
    return StandardScaler().fit_transform(X[keep]), y[keep]


def test_class_weights_of_template_and_estimator_reach_sklearn_solution_in_float64():
    X, y = _imbalanced_iris()
    C, weights = 0.5, {0: 0.5, 1: 3.0, 2: 1.0}
    solver = dict(alpha=1 / C, tol=1e-12, max_iter=10_000, optimizer=SKLEARN_LBFGS)
    for class_weight in ("balanced", weights):
        ref = LogisticRegression(C=C, class_weight=class_weight, tol=1e-12, max_iter=10_000)
        ref.fit(X, y)
        template = LogisticRegression(C=C, class_weight=class_weight)
        from_template = OrtGradientClassifier(template, dtype="float64", **solver).fit(X, y)
        own = OrtGradientClassifier(
            LogisticRegression(C=C), class_weight=class_weight, dtype="float64", **solver
        ).fit(X, y)
        _assert_close_coefficients(from_template.estimator_, ref)
        _assert_close_coefficients(own.estimator_, ref)
        plain = LogisticRegression(C=C, tol=1e-12, max_iter=10_000).fit(X, y)
        assert rel_error(plain.coef_, ref.coef_) > 1e-2  # the weights change the solution


def test_fine_tuning_a_fitted_linear_template_starts_from_its_float64_weights():
    """One full-batch SGD step from a fitted template: numpy's step, to 1e-12."""
    X, z, rng = _convex_data()
    n, lr, alpha = len(z), 0.05, 0.3
    step = dict(optimizer="sgd", learning_rate_init=lr, batch_size=n, shuffle=False)
    step.update(max_iter=1, alpha=alpha, dtype="float64")

    y = z + 0.1 * rng.randn(n)
    fitted = Ridge(alpha=10.0).fit(X, y)
    before = fitted.coef_.copy()
    est = OrtGradientRegressor(fitted, **step).fit(X, y)
    residual = X @ fitted.coef_ + fitted.intercept_ - y
    coef = fitted.coef_ - lr * (X.T @ residual / n + alpha * fitted.coef_ / n)
    intercept = fitted.intercept_ - lr * residual.mean()
    assert rel_error(est.estimator_.coef_, coef) < 1e-12
    assert est.estimator_.intercept_ == pytest.approx(intercept, rel=1e-12)
    assert rel_error(coef, fitted.coef_) > 1e-5  # the step is not nothing
    np.testing.assert_array_equal(fitted.coef_, before)  # the template is not modified

    labels = (z + 0.5 * rng.randn(n) > 0).astype(int)
    fitted = LogisticRegression(C=0.1).fit(X, labels)
    est = OrtGradientClassifier(fitted, **step).fit(X, labels)
    proba = 1 / (1 + np.exp(-(X @ fitted.coef_.ravel() + fitted.intercept_)))
    coef = fitted.coef_ - lr * ((proba - labels) @ X / n + alpha * fitted.coef_ / n)
    intercept = fitted.intercept_ - lr * np.mean(proba - labels)
    assert rel_error(est.estimator_.coef_, coef) < 1e-12
    assert rel_error(est.estimator_.intercept_, intercept) < 1e-12
    assert rel_error(coef, fitted.coef_) > 1e-5


SPARSE_CASES = {
    "ridge-lbfgs": (OrtGradientRegressor, Ridge(), dict(optimizer=SKLEARN_LBFGS, max_iter=200)),
    "mlp-adam": (
        OrtGradientRegressor,
        MLPRegressor(hidden_layer_sizes=(6,)),
        dict(optimizer="adam", batch_size=32, max_iter=3, learning_rate_init=0.01),
    ),
    "logistic-lbfgs": (
        OrtGradientClassifier,
        LogisticRegression(),
        dict(optimizer=SKLEARN_LBFGS, max_iter=200),
    ),
}


@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_sparse_csr_input_trains_the_dense_weights_in_float64(case):
    cls, template, params = SPARSE_CASES[case]
    X = sp.random(150, 12, density=0.3, format="csr", random_state=0, dtype=np.float64)
    rng = np.random.RandomState(1)
    y = X @ rng.randn(12) + 0.1 * rng.randn(150)
    if cls is OrtGradientClassifier:
        y = np.digitize(y, np.quantile(y, [0.33, 0.66]))
    est = cls(template, dtype="float64", random_state=0, tol=0.0, **params)
    dense = clone(est).fit(X.toarray(), y)
    sparse = clone(est).fit(X, y)
    for a, b in zip(_float64_arrays(sparse.estimator_), _float64_arrays(dense.estimator_)):
        assert a.dtype == np.float64
        assert rel_error(a, b) < 1e-12
    assert np.abs(_float64_arrays(dense.estimator_)[0]).max() > 0
    np.testing.assert_allclose(sparse.predict(X), dense.predict(X.toarray()), rtol=1e-12)
