"""Every template trains what it states: its loss, link, class weights and solver."""

import copy
import warnings

import numpy as np
import onnxruntime
import pytest
from _helpers import rel_error
from sklearn.datasets import load_breast_cancer, load_diabetes, load_iris, make_classification
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import (
    ElasticNet,
    GammaRegressor,
    HuberRegressor,
    Lasso,
    LinearRegression,
    LogisticRegression,
    Perceptron,
    PoissonRegressor,
    QuantileRegressor,
    Ridge,
    RidgeClassifier,
    SGDClassifier,
    SGDRegressor,
)
from sklearn.metrics import balanced_accuracy_score, mean_pinball_loss
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC, LinearSVR

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn import losses as L
from onnxgrad_sklearn.optim import LBFGS, Adam


def _diabetes(scale_target=True):
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    if scale_target:
        y = (y - y.mean()) / y.std()
    return X, y


def _onnx_predict(est, X):
    sess = onnxruntime.InferenceSession(est.to_onnx().SerializeToString())
    return sess.run(None, {sess.get_inputs()[0].name: X.astype(np.float32)})


# the template's objective is the default objective -----------------------------------


@pytest.mark.parametrize(
    "template, expected",
    [
        (QuantileRegressor(quantile=0.9), L.Quantile(quantile=0.9)),
        (HuberRegressor(epsilon=1.7), L.Huber(epsilon=1.7)),
        (SGDRegressor(loss="huber", epsilon=0.3), L.Huber(epsilon=0.3)),
        (
            SGDRegressor(loss="epsilon_insensitive", epsilon=0.2),
            L.EpsilonInsensitive(epsilon=0.2),
        ),
        (
            LinearSVR(loss="squared_epsilon_insensitive", epsilon=0.05),
            L.SquaredEpsilonInsensitive(epsilon=0.05),
        ),
        (PoissonRegressor(), L.PoissonDeviance(link="log")),
        (GammaRegressor(), L.GammaDeviance(link="log")),
        (LinearRegression(), L.SquaredError()),
    ],
)
def test_loss_auto_is_the_templates_own_loss(template, expected):
    est = OrtGradientRegressor(template)
    loss = est._objective(template)
    assert type(loss) is type(expected)
    assert loss.get_params() == expected.get_params()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_quantile_template_trains_its_quantile_not_squared_error(dtype):
    X, y = _diabetes(scale_target=False)
    template = QuantileRegressor(quantile=0.9, alpha=0.0)
    est = OrtGradientRegressor(template, dtype=dtype).fit(X, y)
    assert est._penalty == (0.0, 0.0)  # the template's alpha=0
    below = np.mean(y < est.predict(X))
    assert 0.87 < below < 0.93  # squared error gives about 0.5
    ref = QuantileRegressor(quantile=0.9, alpha=0.0).fit(X, y)
    ours = mean_pinball_loss(y, est.predict(X), alpha=0.9)
    theirs = mean_pinball_loss(y, ref.predict(X), alpha=0.9)
    # the linear-programming optimum; measured 1.4e-5 (float32) and 1.3e-5 (float64)
    # above, in 135 and 142 iterations. Without rounding the kinks first
    # (LBFGS(smoothing=None)) L-BFGS-B stopped at a kink 1.1e-2 above in float32
    assert theirs <= ours < theirs * (1 + 1e-4)


def test_template_class_weight_applies_when_the_estimators_is_none():
    X, y = make_classification(
        n_samples=600, weights=[0.9], flip_y=0.05, class_sep=0.6, random_state=0
    )
    plain = OrtGradientClassifier(LogisticRegression()).fit(X, y)
    balanced = OrtGradientClassifier(LogisticRegression(class_weight="balanced")).fit(X, y)
    explicit = OrtGradientClassifier(LogisticRegression(), class_weight="balanced").fit(X, y)
    np.testing.assert_allclose(balanced.decision_function(X), explicit.decision_function(X))
    assert not np.allclose(plain.decision_function(X), balanced.decision_function(X), atol=1e-2)
    # the minority class gets more of the decision
    assert np.mean(balanced.predict(X) == 1) > np.mean(plain.predict(X) == 1)
    assert balanced_accuracy_score(y, balanced.predict(X)) > 0.02 + balanced_accuracy_score(
        y, plain.predict(X)
    )


def test_explicit_loss_overrides_and_a_loss_of_the_other_task_is_refused():
    X, y = _diabetes()
    est = OrtGradientRegressor(QuantileRegressor(), loss="squared_error")
    assert type(est._objective(est.estimator)) is L.SquaredError
    with pytest.raises(ValueError, match=r"loss=Hinge\(\) is a classification loss"):
        OrtGradientRegressor(loss=L.Hinge()).fit(X, y)
    Xc, yc = load_iris(return_X_y=True)
    with pytest.raises(ValueError, match="trains probabilities.*no predict_proba"):
        OrtGradientClassifier(SGDClassifier(loss="hinge"), loss="log_loss").fit(Xc, yc)


# the template must fit the task ---------------------------------------------------------


def test_a_template_of_the_other_task_or_a_class_is_refused_before_conversion():
    X, y = _diabetes()
    with pytest.raises(
        ValueError, match="MLPRegressor is a regression model.*OrtGradientRegressor"
    ):
        OrtGradientClassifier(MLPRegressor()).fit(X, y > 0)
    with pytest.raises(
        ValueError, match="LogisticRegression is a classification model.*OrtGradientClassifier"
    ):
        OrtGradientRegressor(LogisticRegression()).fit(X, y)
    with pytest.raises(ValueError, match=r"is a class: pass an instance.*MLPRegressor\(\)"):
        OrtGradientRegressor(MLPRegressor).fit(X, y)


def test_template_settings_that_do_not_carry_over_are_named_with_their_conversion():
    X, y = load_iris(return_X_y=True)
    # alpha="auto": the template's C carries over; its max_iter does not
    with pytest.warns(UserWarning, match="do not carry over") as record:
        est = OrtGradientClassifier(LogisticRegression(C=0.1, max_iter=500)).fit(X, y)
    (message,) = [str(w.message) for w in record if "do not carry over" in str(w.message)]
    assert "max_iter=500: set max_iter=500 on the estimator" in message
    assert "C=" not in message
    assert est._penalty == pytest.approx((10.0, 0.0))  # 1 / C at full batch (L-BFGS)
    # an explicit alpha replaces the template's penalty: its C is named, with the conversion
    with pytest.warns(UserWarning, match=r"C=0.1: set alpha=10.0 .*alpha = 1 / C"):
        est = OrtGradientClassifier(LogisticRegression(C=0.1), alpha=1e-4).fit(X, y)
    assert est._penalty == (1e-4, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # defaults: nothing to say
        OrtGradientClassifier(LogisticRegression()).fit(X, y)


def test_an_unfitted_cross_validated_template_says_its_penalty_is_unknown():
    from sklearn.linear_model import LassoCV

    X, y = _diabetes()
    with pytest.warns(UserWarning, match="LassoCV chooses by cross-validation is not known"):
        est = OrtGradientRegressor(LassoCV(), max_iter=5).fit(X, y)
    assert est._penalty == (0.0, 0.0)
    fitted = LassoCV(cv=3).fit(X, y)
    est = OrtGradientRegressor(fitted, max_iter=5).fit(X, y)  # its chosen alpha_ carries over
    assert est._penalty == pytest.approx((fitted.alpha_ * len(y), 1.0))


_N = 442  # rows of the diabetes data


@pytest.mark.parametrize(
    "template, optimizer, expected",
    [
        # (template, solver, (alpha, l1_ratio)): objective mean loss + lam * P(w) gives
        # alpha = lam * rows, rows = n at full batch, min(200, n) for Adam's batches
        (LinearRegression(), "auto", (0.0, 0.0)),
        (Ridge(alpha=3.0), "auto", (3.0, 0.0)),
        (Ridge(alpha=3.0), "adam", (3.0 * 200 / _N, 0.0)),
        (MLPRegressor(alpha=0.01), "auto", (0.01, 0.0)),
        (MLPRegressor(alpha=0.01), "lbfgs", (0.01, 0.0)),  # MLP's own per-batch term
        (SGDRegressor(alpha=0.01), "auto", (0.01 * _N, 0.0)),
        (SGDRegressor(alpha=0.01), "adam", (0.01 * 200, 0.0)),
        (SGDRegressor(penalty="elasticnet", l1_ratio=0.3), "auto", (1e-4 * _N, 0.3)),
        (SGDRegressor(penalty=None), "auto", (0.0, 0.0)),
        (HuberRegressor(alpha=0.5), "auto", (1.0, 0.0)),
        (QuantileRegressor(alpha=0.1), "auto", (0.1 * _N, 1.0)),
        (LinearSVR(C=0.5), "auto", (2.0, 0.0)),
        (PoissonRegressor(alpha=0.1), "auto", (0.1 * _N, 0.0)),
    ],
)
def test_alpha_auto_is_the_templates_penalty_for_the_batch_rows(template, optimizer, expected):
    X, y = _diabetes()
    y = np.abs(y) + 0.1 if isinstance(template, PoissonRegressor) else y
    est = OrtGradientRegressor(template, optimizer=optimizer, max_iter=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    assert est._penalty == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "template",
    [LogisticRegression(C=0.5), LinearSVC(C=0.5), SGDClassifier(alpha=0.01), Perceptron()],
)
def test_alpha_auto_for_classifier_templates(template):
    X, y = load_iris(return_X_y=True)
    est = OrtGradientClassifier(template, max_iter=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    expected = {
        "LogisticRegression": (2.0, 0.0),
        "LinearSVC": (2.0, 0.0),
        "SGDClassifier": (0.01 * len(y), 0.0),
        "Perceptron": (0.0, 0.0),  # penalty=None
    }[type(template).__name__]
    assert est._penalty == pytest.approx(expected, rel=1e-12)


def test_default_logistic_regression_template_gives_scikit_learns_coefficients():
    X, y = load_breast_cancer(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    ref = LogisticRegression(C=0.5, tol=1e-10, max_iter=10_000).fit(X, y)
    est = OrtGradientClassifier(LogisticRegression(C=0.5), dtype="float64", tol=1e-8)
    est.fit(X, y)  # the template's C=0.5, no alpha set
    coefficients = np.r_[est.estimator_.coef_.ravel(), est.estimator_.intercept_]
    # measured 1.1e-4; with the estimator's old default alpha=1e-4 the coefficients were
    # 4 times larger
    assert rel_error(coefficients, np.r_[ref.coef_.ravel(), ref.intercept_]) < 1e-3


# classifiers without probabilities, kinks as scikit-learn ------------------------------


@pytest.mark.parametrize(
    "template",
    [
        SGDClassifier(loss="hinge"),
        Perceptron(),
        LinearSVC(),
        RidgeClassifier(),
        SGDClassifier(loss="squared_hinge"),
    ],
)
@pytest.mark.parametrize("n_classes", [2, 3])
def test_classifiers_without_probabilities_predict_and_export(template, n_classes):
    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    if n_classes == 2:
        X, y = X[y > 0], y[y > 0]
    est = OrtGradientClassifier(template, random_state=0).fit(X, y)
    assert not hasattr(est, "predict_proba") and not hasattr(est, "predict_log_proba")
    label = _onnx_predict(est, X)[0]
    np.testing.assert_array_equal(label.ravel(), est.predict(X))
    np.testing.assert_array_equal(est.estimator_.predict(X), est.predict(X))
    np.testing.assert_allclose(
        est.estimator_.decision_function(X), est.decision_function(X), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize(
    "template",
    [
        SGDClassifier(loss="hinge"),
        Perceptron(),
        LinearSVC(),
        RidgeClassifier(),
        SGDClassifier(loss="squared_hinge"),
    ],
)
@pytest.mark.parametrize("n_classes", [2, 3])
def test_margin_classifiers_with_defaults_score_as_the_template_fitted_by_scikit_learn(
    template, n_classes
):
    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    if n_classes == 2:
        X, y = X[y > 0], y[y > 0]
    est = OrtGradientClassifier(template, random_state=0).fit(X, y)
    ref = copy.deepcopy(template).set_params(random_state=0).fit(X, y)
    assert est.score(X, y) >= ref.score(X, y) - 0.02


def test_perceptron_from_zero_weights_moves():
    X, y = load_iris(return_X_y=True)
    X, y = X[y < 2], y[y < 2]
    est = OrtGradientClassifier(Perceptron(), optimizer="sgd", max_iter=1, batch_size=len(y))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    coef = est.estimator_.coef_
    assert np.abs(coef).max() > 0  # f = 0 on every sample: the hinge at 0 still updates
    # one step of -lr * mean(dloss) = lr * mean(y * x), y in {-1, 1}
    expected = 0.001 * np.mean((2 * y - 1)[:, None] * X, axis=0)
    np.testing.assert_allclose(coef.ravel(), expected, rtol=1e-4)


def test_modified_huber_gives_scikit_learns_probabilities():
    X, y = load_iris(return_X_y=True)
    X = StandardScaler().fit_transform(X)
    est = OrtGradientClassifier(SGDClassifier(loss="modified_huber"), random_state=0).fit(X, y)
    ref = copy.deepcopy(est.estimator_)  # the trained weights, scikit-learn's formulas
    np.testing.assert_allclose(est.predict_proba(X), ref.predict_proba(X), atol=1e-5)
    np.testing.assert_array_equal(est.predict(X), ref.predict(X))


# GLM templates ---------------------------------------------------------------------


def test_poisson_template_trains_its_deviance_and_exports_the_exp_link():
    X, y = _diabetes(scale_target=False)
    n = len(y)
    est = OrtGradientRegressor(PoissonRegressor(alpha=0.0), alpha=0.0).fit(X, y)
    onnx_pred = _onnx_predict(est, X)[0].ravel()
    np.testing.assert_allclose(onnx_pred, est.predict(X), rtol=1e-5)
    np.testing.assert_allclose(est.estimator_.predict(X), est.predict(X), rtol=1e-4)
    ref = PoissonRegressor(alpha=1e-3, tol=1e-10, max_iter=1000).fit(X, y)
    est = OrtGradientRegressor(PoissonRegressor(), alpha=1e-3 * n, tol=1e-10, max_iter=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
    assert rel_error(est.estimator_.coef_, ref.coef_) < 1e-3
    assert est.estimator_.intercept_ == pytest.approx(ref.intercept_, rel=1e-3)


# solvers: L-BFGS for linear and GLM templates, Adam for MLPs and the perceptron ----------


def test_auto_optimizer_is_the_template_familys_solver():
    for template, solver in [
        (MLPRegressor(), Adam),
        (SGDRegressor(), LBFGS),
        (Ridge(), LBFGS),
        (LinearSVR(), LBFGS),
        (PoissonRegressor(), LBFGS),
    ]:
        assert type(OrtGradientRegressor(template)._solver(template, False)) is solver
        assert type(OrtGradientRegressor(template)._solver(template, True)) is Adam
    for template, solver in [
        (MLPClassifier(), Adam),
        (Perceptron(), Adam),
        (SGDClassifier(loss="perceptron"), Adam),  # its criterion's minimum is w = 0
        (SGDClassifier(), LBFGS),
        (SGDClassifier(loss="log_loss"), LBFGS),
        (LogisticRegression(), LBFGS),
        (LinearSVC(), LBFGS),
    ]:
        assert type(OrtGradientClassifier(template)._solver(template, False)) is solver
    assert hasattr(OrtGradientRegressor(), "partial_fit")  # auto: Adam in partial_fit
    assert not hasattr(OrtGradientRegressor(optimizer="lbfgs"), "partial_fit")


def test_ridge_and_logistic_regression_reach_scikit_learns_solution():
    X, y = _diabetes()
    ref = Ridge(alpha=3.0).fit(X, y)
    est = OrtGradientRegressor(Ridge(), alpha=3.0, tol=1e-8).fit(X, y)
    assert rel_error(est.estimator_.coef_, ref.coef_) < 1e-3
    Xc, yc = load_breast_cancer(return_X_y=True)
    Xc = StandardScaler().fit_transform(Xc)
    ref = LogisticRegression(C=0.5, tol=1e-10, max_iter=10_000).fit(Xc, yc)
    est = OrtGradientClassifier(LogisticRegression(), alpha=2.0, tol=1e-8, max_iter=1000)
    est.fit(Xc, yc)
    assert rel_error(est.estimator_.coef_, ref.coef_) < 1e-3


def test_lbfgs_follows_mlpregressor_lbfgs_from_the_same_start():
    X, y = _diabetes()
    X, y = X.astype(np.float32), y.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = MLPRegressor(hidden_layer_sizes=(8,), max_iter=2, random_state=0).fit(X, y)
        ref = copy.deepcopy(start).set_params(
            solver="lbfgs", warm_start=True, max_iter=10, tol=0.0, alpha=1e-4
        )
        ref.fit(X, y)
        est = OrtGradientRegressor(start, optimizer="lbfgs", max_iter=10, tol=0.0, alpha=1e-4)
        est.fit(X, y)
    assert est.n_iter_ == ref.n_iter_ == 10
    for ours, theirs in zip(
        est.estimator_.coefs_ + est.estimator_.intercepts_, ref.coefs_ + ref.intercepts_
    ):
        assert np.abs(ours - theirs).max() <= 1e-4 * np.abs(theirs).max()
    assert est.loss_ == pytest.approx(ref.loss_, rel=1e-4)


def test_lbfgs_over_chunks_gives_the_whole_sets_loss_and_gradient(monkeypatch):
    from onnxgrad_sklearn import _data

    X, y = _diabetes()
    whole = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(5,)), optimizer="lbfgs")
    weights = np.random.RandomState(0).rand(len(y)) + 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        whole.set_params(max_iter=5, random_state=0, alpha=0.1).fit(X, y, sample_weight=weights)
        monkeypatch.setattr(_data.FullBatchObjective, "chunk_values", 10 * 37)  # 37 rows
        chunked = copy.deepcopy(whole).set_params(warm_start=False).fit(X, y, weights)
    np.testing.assert_allclose(chunked.loss_curve_, whole.loss_curve_, rtol=1e-5)
    for a, b in zip(chunked.estimator_.coefs_, whole.estimator_.coefs_):
        assert rel_error(a, b) < 1e-4


@pytest.mark.parametrize(
    "cls, template, target",
    [
        (OrtGradientRegressor, MLPRegressor, "reg"),
        (OrtGradientClassifier, MLPClassifier, "clf"),
    ],
)
def test_default_parameters_give_the_mlps_own_weights(cls, template, target):
    X, y = _diabetes()
    if target == "clf":
        y = np.digitize(y, [-0.5, 0.5])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = cls(template(hidden_layer_sizes=(6, 6)), max_iter=8, random_state=0).fit(X, y)
        ref = template(hidden_layer_sizes=(6, 6), max_iter=8, random_state=0).fit(X, y)
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-3)
    for a, b in zip(ours.estimator_.coefs_, ref.coefs_):
        assert rel_error(a, b) < 1e-3


@pytest.mark.parametrize("hidden", [(6, 6), (6, 6, 6)])
@pytest.mark.parametrize("task", ["reg", "clf"])
def test_equal_width_layers_are_written_back_in_their_order(hidden, task):
    X, y = _diabetes()
    if task == "reg":
        est = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=hidden), random_state=0)
    else:
        y = np.digitize(y, [-0.5, 0.5])
        est = OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=hidden), random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.set_params(max_iter=20).fit(X, y)
    if task == "reg":
        np.testing.assert_allclose(est.estimator_.predict(X), est.predict(X), atol=1e-5)
        np.testing.assert_allclose(_onnx_predict(est, X)[0].ravel(), est.predict(X), atol=1e-5)
    else:
        proba = est.predict_proba(X)
        np.testing.assert_allclose(est.estimator_.predict_proba(X), proba, atol=1e-5)
        np.testing.assert_allclose(_onnx_predict(est, X)[1], proba, atol=1e-5)
        np.testing.assert_array_equal(est.estimator_.predict(X), est.predict(X))


def test_default_parameters_score_as_scikit_learn_on_bundled_data():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import quality

    results = list(quality.rows(folds=3, datasets_wanted={"diabetes (scaled y)", "iris"}))
    assert len(results) == 8
    for name, template, ours, theirs, _, _ in results:
        assert ours >= theirs - 0.02, (name, template, ours, theirs)
        if template.startswith("MLP"):  # the same trajectory as scikit-learn's own
            assert ours == pytest.approx(theirs, abs=2e-3), (name, template)


def test_poisson_mlp_template_gives_mlpregressors_own_fit_and_exports_its_exp_output():
    rng = np.random.RandomState(0)
    X = rng.randn(300, 4)
    y = rng.poisson(np.exp(0.5 * X[:, 0] - 0.3 * X[:, 1]))
    params = dict(hidden_layer_sizes=(8,), max_iter=10, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = MLPRegressor(loss="poisson", **params).fit(X, y)
        template = MLPRegressor(loss="poisson", hidden_layer_sizes=(8,))
        ours = OrtGradientRegressor(template, max_iter=10, random_state=0).fit(X, y)
    assert type(ours._loss_) is L.PoissonDeviance
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-5)
    for a, b in zip(ours.estimator_.coefs_, ref.coefs_):
        assert rel_error(a, b) < 1e-4
    np.testing.assert_allclose(_onnx_predict(ours, X)[0].ravel(), ours.predict(X), rtol=1e-6)
    np.testing.assert_allclose(ours.estimator_.predict(X), ours.predict(X), rtol=1e-5)
    assert (ours.predict(X) > 0).all()  # the exp link, in the export too


@pytest.mark.parametrize("n_labels", [2, 3])
def test_multilabel_mlp_classifier_follows_mlpclassifier(n_labels):
    from sklearn.datasets import make_multilabel_classification

    X, Y = make_multilabel_classification(
        n_samples=200, n_features=5, n_classes=n_labels, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ref = MLPClassifier(hidden_layer_sizes=(6,), max_iter=10, random_state=0).fit(X, Y)
        template = MLPClassifier(hidden_layer_sizes=(6,))
        ours = OrtGradientClassifier(template, max_iter=10, random_state=0).fit(X, Y)
    assert ours.n_outputs_ == n_labels
    np.testing.assert_array_equal(ours.classes_, ref.classes_)
    np.testing.assert_allclose(ours.loss_curve_, ref.loss_curve_, rtol=1e-5)
    for a, b in zip(ours.estimator_.coefs_, ref.coefs_):
        assert rel_error(a, b) < 1e-4
    proba = ours.predict_proba(X)
    assert proba.shape == (200, n_labels)
    np.testing.assert_allclose(proba, ours.estimator_.predict_proba(X), atol=1e-5)
    np.testing.assert_array_equal(ours.predict(X), ours.estimator_.predict(X))
    label, onnx_proba = _onnx_predict(ours, X)
    np.testing.assert_allclose(onnx_proba, proba, atol=1e-5)
    np.testing.assert_array_equal(label, ours.predict(X))
    np.testing.assert_allclose(np.exp(ours.predict_log_proba(X)), proba, rtol=1e-10)
    with pytest.raises(ValueError, match="Multilabel targets need an MLPClassifier template"):
        OrtGradientClassifier(LogisticRegression()).fit(X, Y)


def test_partial_fit_takes_a_new_alpha_and_keeps_the_templates_rows():
    X, y = _diabetes()
    est = OrtGradientRegressor(SGDRegressor(alpha=0.01), random_state=0)
    est.partial_fit(X, y)
    assert est._penalty == pytest.approx((0.01 * 200, 0.0))  # Adam's batch of 200 rows
    est.partial_fit(X[:50], y[:50])  # a smaller chunk: the same penalty, the same engine
    assert est._penalty == pytest.approx((0.01 * 200, 0.0))
    engine = est._engine
    est.set_params(alpha=0.5).partial_fit(X, y)
    assert est._penalty == (0.5, 0.0)
    assert est._engine is not engine  # the penalty is part of the training graph


@pytest.mark.parametrize(
    "template",
    [
        Ridge(alpha=3.0),
        Lasso(alpha=0.1),
        ElasticNet(alpha=0.1, l1_ratio=0.3),
        SGDRegressor(alpha=0.01, penalty="elasticnet"),
        SGDClassifier(alpha=0.01, penalty="l1"),
        Perceptron(penalty="l2", alpha=0.01),
        HuberRegressor(alpha=0.5),
        QuantileRegressor(alpha=0.1),
        LogisticRegression(C=0.5),
        LogisticRegression(C=0.5, penalty="elasticnet", l1_ratio=0.4, solver="saga"),
        LinearSVC(C=0.5),
        LinearSVR(C=0.5),
        PoissonRegressor(alpha=0.1),
        RidgeClassifier(alpha=2.0),
    ],
    ids=lambda t: f"{type(t).__name__}({t.get_params().get('penalty', '')})",
)
def test_the_penalty_advice_is_the_penalty_alpha_auto_trains(template):
    """The warning's advice for a penalty setting is the family's own conversion."""
    import re

    from onnxgrad_sklearn.families import dropped_settings, family_of

    n = 100
    alpha, l1_ratio = family_of(template).penalty(template, n, n)
    lines = [line for line in dropped_settings(template, n) if "set alpha=" in line]
    assert lines  # every penalty setting that differs from its default is named
    for line in lines:
        found = re.search(r"set alpha=([^ ,(]+)(?:, l1_ratio=([^ (]+))? \(", line)
        assert found, line
        assert float(found.group(1)) == pytest.approx(alpha, rel=1e-5), line
        assert float(found.group(2) or 0.0) == pytest.approx(l1_ratio), line
