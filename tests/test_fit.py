"""The fit object (``onnxgrad_sklearn._fit.Fit``): one fit's state and loop.

The estimator makes a Fit, runs it and reads its results: the loop writes no
estimator attribute while it runs (the callbacks' task shows the progress to the
callbacks), and a Fit run by hand trains what ``fit`` trains.
"""

import warnings

import numpy as np
import pytest
from _helpers import count_random_state_copies
from sklearn.datasets import load_diabetes
from sklearn.exceptions import ConvergenceWarning
from sklearn.neural_network import MLPRegressor
from sklearn.preprocessing import StandardScaler

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn._fit import PROGRESS, SETTINGS, Fit


def _diabetes():
    X, y = load_diabetes(return_X_y=True)
    return StandardScaler().fit_transform(X), (y - y.mean()) / y.std()


def _estimator(**params):
    params = {"random_state": 0, "max_iter": 4, **params}
    return OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(8,)), **params)


def _snapshot(est):
    """The estimator's attributes: each value, and a copy of the lists' contents."""
    return {k: (v, list(v) if isinstance(v, list) else None) for k, v in est.__dict__.items()}


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_the_loop_writes_no_estimator_attribute_and_the_estimator_reads_its_results(
    optimizer, monkeypatch
):
    X, y = _diabetes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        reference = _estimator(optimizer=optimizer).fit(X, y)
    est = _estimator(optimizer=optimizer)
    method = "run_epochs" if optimizer == "adam" else "run_lbfgs"
    original, seen = getattr(Fit, method), {}

    def watched(self):
        before = _snapshot(est)
        original(self)
        after = _snapshot(est)
        assert after.keys() == before.keys()
        for name, (value, items) in before.items():
            assert after[name][0] is value, name  # not replaced
            assert after[name][1] == items, name  # nor changed in place
        seen["progress"] = self.progress()

    monkeypatch.setattr(Fit, method, watched)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est.fit(X, y)
    progress = seen["progress"]
    assert set(progress) == set(PROGRESS)
    assert est.n_iter_ == progress["n_iter_"] == reference.n_iter_
    assert est.loss_curve_ == progress["loss_curve_"] == reference.loss_curve_
    assert est._random_state is progress["_random_state"]
    np.testing.assert_array_equal(est.predict(X), reference.predict(X))


def test_the_estimator_reads_the_fits_progress_at_its_end():
    X, y = _diabetes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        est = _estimator(early_stopping=True).fit(X, y)
    assert est.n_iter_ == len(est.loss_curve_) == len(est.validation_scores_)
    assert est.best_validation_score_ == max(est.validation_scores_)
    assert est.t_ == est.n_iter_ * (len(y) - int(np.ceil(0.1 * len(y))))
    assert est.estimator_.n_iter_ == est.n_iter_


def test_the_settings_a_fit_reads_are_estimator_parameters():
    params = _estimator().get_params(deep=False)
    assert set(SETTINGS) <= set(params)
    fit = Fit(
        {name: params[name] for name in SETTINGS},
        {"n_iter_": 3},
        engine=None,
        rows=None,
        loss=None,
        optimizer=None,
        penalty=(0.0, 0.0),
        penalized=[],
        recipe=None,
        threads=0,
        score_validation=None,
        stratify=None,
        name="OrtGradientRegressor",
        classifier=False,
    )
    assert fit.max_iter == 4 and fit.batch_size == "auto"
    assert fit.progress() == {"n_iter_": 3}  # unset attributes are not results


@pytest.mark.parametrize("optimizer", ["adam", "lbfgs"])
def test_a_fit_stopped_by_ctrl_c_leaves_its_completed_progress(optimizer, monkeypatch):
    X, y = _diabetes()
    est = _estimator(optimizer=optimizer, max_iter=50)
    calls = []
    original = Fit._run_epoch if optimizer == "adam" else Fit._end_lbfgs

    def interrupted(self, *args, **kwargs):
        calls.append(len(self.loss_curve_))
        if len(self.loss_curve_) >= 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    if optimizer == "adam":
        monkeypatch.setattr(Fit, "_run_epoch", interrupted)
        with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="interrupted"):
            est.fit(X, y)
        assert est.n_iter_ == 2 and len(est.loss_curve_) == 2
    else:
        monkeypatch.setattr(Fit, "_end_lbfgs", interrupted)
        with pytest.raises(KeyboardInterrupt):
            est.fit(X, y)
        assert len(est.loss_curve_) >= 2  # the L-BFGS iterations completed
    assert np.all(np.isfinite(est.predict(X)))


def test_the_fit_copies_the_random_state_when_it_first_draws(monkeypatch):
    """The fit draws from a copy of the estimator's random state, made when it first
    draws: an L-BFGS fit (it draws nothing) leaves the estimator's as the initial
    weights left it, without a copy (100-200 us); a stochastic fit copies it once."""
    made = count_random_state_copies(monkeypatch)
    X, y = load_diabetes(return_X_y=True)
    X = StandardScaler().fit_transform(X)

    def fit(optimizer, max_iter):
        template = MLPRegressor(hidden_layer_sizes=(8,))
        est = OrtGradientRegressor(
            template, optimizer=optimizer, max_iter=max_iter, random_state=0, shuffle=True
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            return est.fit(X, y)

    one, five = fit("lbfgs", 1), fit("lbfgs", 5)
    assert made == []
    for a, b in zip(one._random_state.get_state(), five._random_state.get_state()):
        np.testing.assert_array_equal(a, b)  # the state the initial weights left
    sgd = fit("nesterov", 3)
    assert len(made) == 1
    again = fit("nesterov", 3)  # the same shuffles: the same weights and final state
    np.testing.assert_array_equal(again.predict(X), sgd.predict(X))
    for a, b in zip(again._random_state.get_state(), sgd._random_state.get_state()):
        np.testing.assert_array_equal(a, b)
    assert sgd._random_state.get_state()[2] != one._random_state.get_state()[2]  # it drew
