"""Pipelines, searches, metadata routing, partial_fit, persistence and dask."""

import copy
import io
import pickle
import warnings

import joblib
import numpy as np
import pytest
import sklearn
from _helpers import rel_error
from sklearn.base import clone
from sklearn.compose import ColumnTransformer
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import get_scorer
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.neural_network import MLPClassifier, MLPRegressor
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils._param_validation import InvalidParameterError

from onnxgrad_sklearn import SKOPS_TRUSTED_TYPES, OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.optim import SGD, Momentum, Nesterov

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _regression(n=160, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, 4).astype(np.float32).astype(np.float64) * [1, 10, 0.1, 1]
    y = (np.sin(X[:, 0]) + 0.1 * X[:, 1] - 5 * X[:, 2] + 0.1 * rng.randn(n)).astype(np.float32)
    return X, y.astype(np.float64)


def _classification(n=160, seed=0):
    X, _ = _regression(n, seed)
    y = (X[:, 0] + 0.1 * X[:, 1] > 0).astype(int) + (X[:, 3] > 1).astype(int)
    return X, y


GRID = {
    "ortgradientregressor__estimator__hidden_layer_sizes": [(8,), (16,)],
    "ortgradientregressor__optimizer": ["sgd", Nesterov(momentum=0.8)],
    "ortgradientregressor__optimizer__momentum": [0.5, 0.9],
    "ortgradientregressor__learning_rate_init": [0.01, 0.03],
    "ortgradientregressor__loss": ["squared_error", "huber"],
}


def _search(n_jobs):
    X, y = _regression()
    pipe = make_pipeline(
        StandardScaler(),
        OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(4,)), batch_size=32, max_iter=8, random_state=0
        ),
    )
    return GridSearchCV(pipe, GRID, cv=2, n_jobs=n_jobs).fit(X, y)


def test_grid_search_over_nested_parameters_same_with_one_or_two_jobs():
    one, two = _search(1), _search(2)
    scores = one.cv_results_["mean_test_score"]
    assert len(scores) == 32 and np.all(np.isfinite(scores))
    np.testing.assert_array_equal(scores, two.cv_results_["mean_test_score"])
    assert one.best_params_ == two.best_params_ or (
        one.best_params_.keys() == two.best_params_.keys()
    )
    # the nested values really reached the objects
    best = one.best_estimator_[-1]
    assert best.estimator_.hidden_layer_sizes == best.estimator.hidden_layer_sizes
    assert len(set(np.round(scores, 8))) > 8


def test_nested_momentum_turns_an_optimizer_name_into_its_object():
    reg = OrtGradientRegressor(optimizer="nesterov").set_params(optimizer__momentum=0.7)
    assert isinstance(reg.optimizer, Nesterov) and reg.optimizer.momentum == 0.7
    reg = OrtGradientRegressor(optimizer="sgd").set_params(optimizer__momentum=0.5)
    assert reg.optimizer == SGD(momentum=0.5) or reg.optimizer.momentum == 0.5
    reg = OrtGradientRegressor(loss="huber").set_params(loss__epsilon=2.0)
    assert reg.loss.epsilon == 2.0
    cloned = clone(reg)
    assert cloned.loss is not reg.loss and cloned.loss.epsilon == 2.0
    with pytest.raises(ValueError, match="Invalid parameter 'beta_1'"):
        OrtGradientRegressor(optimizer="sgd").set_params(optimizer__beta_1=0.5)


@pytest.mark.parametrize(
    "param,value",
    [
        ("learning_rate_init", -1.0),
        ("batch_size", 0),
        ("optimizer", "rmsprop"),
        ("loss", "hinge"),
        ("learning_rate", "cosine"),
        ("l1_ratio", 2.0),
    ],
)
def test_bad_parameter_raises_invalid_parameter_error_naming_it(param, value):
    X, y = _regression()
    with pytest.raises(InvalidParameterError, match=f"'{param}' parameter"):
        OrtGradientRegressor(**{param: value}).fit(X, y)


def test_cross_val_score_and_column_transformer():
    pd = pytest.importorskip("pandas")
    X, y = _regression()
    df = pd.DataFrame(X, columns=["a", "b", "c", "d"])
    pipe = make_pipeline(
        ColumnTransformer([("scale", StandardScaler(), ["a", "b", "c"])], remainder="passthrough"),
        OrtGradientRegressor(
            optimizer="adam", learning_rate_init=0.05, max_iter=30, random_state=0
        ),
    )
    scores = cross_val_score(pipe, df, y, cv=3)
    assert scores.shape == (3,) and scores.mean() > 0.5


def test_sample_weight_is_routed_through_pipeline_and_grid_search():
    X, y = _regression()
    sw = np.random.RandomState(1).uniform(0.1, 3.0, len(y))
    params = dict(
        optimizer="momentum",
        learning_rate_init=0.01,
        batch_size=40,
        max_iter=5,
        random_state=0,
        shuffle=False,
    )
    with sklearn.config_context(enable_metadata_routing=True):
        est = OrtGradientRegressor(**params).set_fit_request(sample_weight=True)
        est.set_score_request(sample_weight=True)
        pipe = make_pipeline(StandardScaler().set_fit_request(sample_weight=False), est)
        scorer = get_scorer("r2").set_score_request(sample_weight=True)
        search = GridSearchCV(
            pipe, {"ortgradientregressor__alpha": [1e-4, 1.0]}, cv=2, scoring=scorer
        )
        search.fit(X, y, sample_weight=sw)
        routed = search.best_estimator_[-1]
    Xs = StandardScaler().fit_transform(X)
    alpha = search.best_params_["ortgradientregressor__alpha"]
    direct = OrtGradientRegressor(alpha=alpha, **params).fit(Xs, y, sample_weight=sw)
    unweighted = OrtGradientRegressor(alpha=alpha, **params).fit(Xs, y)
    assert rel_error(routed.estimator_.coef_, direct.estimator_.coef_) < 1e-6
    assert rel_error(unweighted.estimator_.coef_, direct.estimator_.coef_) > 1e-3


def _chunks(X, y):
    return [(X[i : i + 32], y[i : i + 32]) for i in range(0, 160, 32)]


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_partial_fit_follows_mlp_partial_fit_and_survives_pickling(kind):
    if kind == "regressor":
        X, y = _regression()
        X = StandardScaler().fit_transform(X)
        mlp = MLPRegressor(hidden_layer_sizes=(10,), max_iter=3, random_state=0).fit(X, y)
        ours = OrtGradientRegressor(mlp)
    else:
        X, y = _classification()
        X = StandardScaler().fit_transform(X)
        mlp = MLPClassifier(hidden_layer_sizes=(10,), max_iter=3, random_state=0).fit(X, y)
        ours = OrtGradientClassifier(mlp)
    common = dict(learning_rate_init=0.02, batch_size=8, shuffle=False, alpha=1e-4)
    ours.set_params(optimizer=Momentum(momentum=0.9), **common)
    ref = copy.deepcopy(mlp).set_params(
        solver="sgd", momentum=0.9, nesterovs_momentum=False, **common
    )
    del ref._optimizer  # the reference's optimizer state starts empty, as ours does
    for k, (Xc, yc) in enumerate(_chunks(X, y)):
        ref.partial_fit(Xc, yc)
        ours.partial_fit(Xc, yc)
        if k == 2:
            ours = pickle.loads(pickle.dumps(ours))
    for a, b in zip(
        ours.estimator_.coefs_ + ours.estimator_.intercepts_, ref.coefs_ + ref.intercepts_
    ):
        assert rel_error(a, b) < 1e-4
    assert rel_error(ref.coefs_[0], mlp.coefs_[0]) > 1e-3
    assert ours.n_iter_ == ref.n_iter_ and ours.t_ == ref.t_


def test_partial_fit_of_classifier_needs_classes_first():
    X, y = _classification()
    clf = OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=(4,)))
    with pytest.raises(ValueError, match="classes must be passed on the first call"):
        clf.partial_fit(X[:20], y[:20])
    clf.partial_fit(X[:20], y[:20], classes=[0, 1, 2])
    np.testing.assert_array_equal(clf.classes_, [0, 1, 2])
    assert clf.predict_proba(X).shape == (len(y), 3)


def test_max_iter_without_convergence_warns():
    X, y = _regression()
    with pytest.warns(ConvergenceWarning, match=r"Maximum iterations \(2\) reached"):
        with warnings.catch_warnings():
            warnings.simplefilter("always", ConvergenceWarning)
            OrtGradientRegressor(optimizer="adam", max_iter=2).fit(X, y)
    # L-BFGS (the default for a linear template) warns as MLPRegressor(solver="lbfgs")
    with pytest.warns(ConvergenceWarning, match=r"lbfgs failed to converge after 2 iteration"):
        est = OrtGradientRegressor(max_iter=2).fit(X, y)
    assert est.n_iter_ == 2 and len(est.loss_curve_) == 2


def test_classifier_early_stopping_keeps_the_best_validation_accuracy():
    X, y = _classification(n=600)
    X = StandardScaler().fit_transform(X)
    common = dict(
        learning_rate_init=0.05,
        batch_size=16,
        max_iter=300,
        random_state=0,
        early_stopping=True,
        n_iter_no_change=4,
    )
    ours = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(32,)), optimizer="adam", **common
    ).fit(X, y)
    ref = MLPClassifier(hidden_layer_sizes=(32,), solver="adam", **common).fit(X, y)
    assert ours.n_iter_ < 300
    assert ours.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(ours.validation_scores_, ref.validation_scores_)
    assert ours.best_validation_score_ == max(ours.validation_scores_)
    for a, b in zip(ours.estimator_.coefs_, ref.coefs_):
        assert rel_error(a, b) < 1e-3


def _skops_round_trip(est):
    sio = pytest.importorskip("skops.io")
    data = sio.dumps(est)
    assert set(sio.get_untrusted_types(data=data)) <= set(SKOPS_TRUSTED_TYPES)
    return sio.loads(data, trusted=SKOPS_TRUSTED_TYPES)


def _joblib_round_trip(est):
    buffer = io.BytesIO()
    joblib.dump(est, buffer)
    buffer.seek(0)
    return joblib.load(buffer)


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
@pytest.mark.parametrize("how", ["pickle", "joblib", "skops"])
def test_persistence_round_trip_predicts_identically_and_continues(kind, how):
    if kind == "regressor":
        X, y = _regression()
        est = OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(6,)),
            optimizer=Nesterov(),
            max_iter=3,
            random_state=0,
        )
    else:
        X, y = _classification()
        est = OrtGradientClassifier(
            MLPClassifier(hidden_layer_sizes=(6,)),
            optimizer="adam",
            max_iter=3,
            random_state=0,
        )
    est.fit(X, y)
    loaded = {
        "pickle": lambda e: pickle.loads(pickle.dumps(e)),
        "joblib": _joblib_round_trip,
        "skops": _skops_round_trip,
    }[how](est)
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    if kind == "classifier":
        np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
    loaded.partial_fit(X, y)
    est.partial_fit(X, y)
    np.testing.assert_array_equal(loaded.predict(X), est.predict(X))
    assert loaded.to_onnx().SerializeToString() == est.to_onnx().SerializeToString()


def test_grid_search_on_a_dask_cluster_matches_one_process():
    distributed = pytest.importorskip("dask.distributed", reason="dask is not installed")
    X, y = _regression()
    grid = {"learning_rate_init": [0.005, 0.02], "optimizer": ["sgd", "adam"]}
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(8,)), batch_size=32, max_iter=10, random_state=0
    )
    local = GridSearchCV(est, grid, cv=3, n_jobs=1).fit(X, y)
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        with distributed.Client(cluster):
            with joblib.parallel_backend("dask"):
                remote = GridSearchCV(est, grid, cv=3, n_jobs=-1).fit(X, y)
    assert remote.best_params_ == local.best_params_
    assert remote.best_score_ == local.best_score_
    np.testing.assert_array_equal(
        remote.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"]
    )


def test_trained_mlp_continues_with_scikit_learn_partial_fit():
    X, y = _regression()
    X = StandardScaler().fit_transform(X)
    reg = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(6,), solver="sgd", learning_rate_init=0.01),
        optimizer="momentum",
        max_iter=4,
        random_state=0,
    ).fit(X, y)
    mlp = reg.estimator_
    assert mlp.n_iter_ == 4 and mlp.t_ == reg.t_
    assert mlp.loss_curve_ == reg.loss_curve_
    before = mlp.predict(X)
    mlp.partial_fit(X, y)
    assert mlp.t_ == reg.t_ + len(y)
    assert rel_error(mlp.predict(X), before) > 1e-4


def test_randomized_search_and_tags_follow_the_template():
    from scipy.stats import loguniform
    from sklearn.linear_model import LinearRegression, SGDRegressor
    from sklearn.model_selection import RandomizedSearchCV
    from sklearn.utils import get_tags

    X, y = _regression()
    search = RandomizedSearchCV(
        OrtGradientRegressor(optimizer="adam", max_iter=5, random_state=0),
        {"learning_rate_init": loguniform(1e-3, 1e-1), "alpha": [1e-4, 1e-2]},
        n_iter=4,
        cv=2,
        random_state=0,
    ).fit(X, y)
    assert len(search.cv_results_["mean_test_score"]) == 4
    assert search.best_estimator_.n_iter_ == 5
    assert get_tags(OrtGradientRegressor(LinearRegression())).target_tags.multi_output
    assert get_tags(OrtGradientRegressor(MLPRegressor())).target_tags.multi_output
    assert not get_tags(OrtGradientRegressor(SGDRegressor())).target_tags.multi_output
    assert not get_tags(OrtGradientClassifier()).target_tags.multi_output
    assert get_tags(OrtGradientClassifier()).estimator_type == "classifier"
    assert get_tags(OrtGradientRegressor()).estimator_type == "regressor"
