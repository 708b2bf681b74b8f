"""scikit-learn's callbacks (sklearn.callback, scikit-learn >= 1.9) and the validation data
given to fit (X_val, y_val, sample_weight_val)."""

import copy
import pickle
import subprocess
import sys
import warnings

import numpy as np
import onnxruntime
import pytest
import sklearn
from _helpers import (
    BACKENDS,
    QuietCallback,
    count_random_state_copies,
    small_mlp,
    smooth_regression,
)
from sklearn.compose import ColumnTransformer
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler

from onnxgrad_sklearn import OrtGradientClassifier, _model
from onnxgrad_sklearn._model import FedSession

callback = pytest.importorskip("sklearn.callback", reason="scikit-learn < 1.9: no callback API")
ScoringMonitor = callback.ScoringMonitor

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _regression(n=120, seed=0):
    return smooth_regression(n, seed, noise=0.1)


def _classification(n=150, seed=0):
    X, _ = _regression(n, seed)
    y = np.array(["a", "b", "c"])[(X[:, 0] + 0.5 * X[:, 1] > 0).astype(int) + (X[:, 3] > 0.5)]
    return X, y


def _mlp(backend, **params):
    return small_mlp(backend, **{"learning_rate_init": 0.01, "max_iter": 6, **params})


def _logistic(backend, **params):
    return OrtGradientClassifier(
        LogisticRegression(), **{"max_iter": 12, "tol": 0.0, "backend": backend, **params}
    )


def _rows(monitor, task_name=None):
    rows = monitor.get_logs().data
    return [r for r in rows if task_name is None or r["task_name"] == task_name]


class StopAt(QuietCallback):
    """Returns True at the end of epoch (or L-BFGS iteration) ``number`` (1-based)."""

    def __init__(self, number):
        self.number = number

    def on_fit_task_end(self, estimator, context):
        return context.parent is not None and context.task_id == self.number - 1


class Keep(QuietCallback):
    """Keeps the ``fitted_estimator`` of every task's end, as a checkpoint would."""

    def __init__(self, validation=False):
        self.fitted = []
        self.uses_validation_data = validation
        self.scores = []

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None):
        if context.parent is not None:
            self.fitted.append(fitted_estimator)
            if self.uses_validation_data:  # what the fit has recorded by this epoch's end
                self.scores.append(list(estimator.validation_scores_))


# -- ScoringMonitor, per epoch and per L-BFGS iteration --------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_monitor_scores_each_epoch_as_if_the_fit_stopped_there(backend):
    X, y = _regression()
    monitor = ScoringMonitor(scoring="r2")
    reg = _mlp(backend).set_callbacks(monitor).fit(X, y)
    rows = monitor.get_logs().data
    assert [r["task_name"] for r in rows] == ["fit"] + ["epoch"] * 6
    assert [r["task_id_path"] for r in rows[1:]] == [(0, k) for k in range(6)]
    assert {r["estimator_name"] for r in rows} == {"OrtGradientRegressor"}
    # the last epoch and the root task: the fitted estimator's score on the training data
    # a snapshot predicts through a session fed its weights (not pre-packed): the same
    # score to float32 rounding
    assert rows[-1]["r2"] == pytest.approx(rows[0]["r2"], rel=1e-6)
    assert rows[0]["r2"] == reg.score(X, y)
    # epoch 3 scores what a fit of 3 epochs gives
    three = _mlp(backend, max_iter=3).fit(X, y)
    assert rows[3]["r2"] == pytest.approx(three.score(X, y), rel=1e-6)
    assert len({r["r2"] for r in rows[1:]}) == 6  # the weights move each epoch


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_monitor_scores_each_lbfgs_iteration_as_logistic_regression(backend):
    X, y = _classification()
    monitor = ScoringMonitor(scoring="accuracy")
    clf = _logistic(backend).set_callbacks(monitor).fit(X, y)
    rows = monitor.get_logs().data
    assert clf.n_iter_ == 12
    assert [r["task_name"] for r in rows] == ["fit"] + ["lbfgs-iter"] * 12
    assert rows[-1]["accuracy"] == rows[0]["accuracy"] == clf.score(X, y)
    assert rows[5]["accuracy"] == _logistic(backend, max_iter=5).fit(X, y).score(X, y)
    # scikit-learn's LogisticRegression reports the same tasks: a root and one per iteration
    reference = ScoringMonitor(scoring="accuracy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        LogisticRegression(max_iter=12, tol=0.0).set_callbacks(reference).fit(X, y)
    expected = reference.get_logs().data
    assert [r["task_name"] for r in expected] == [r["task_name"] for r in rows]
    assert [r["task_id_path"] for r in expected] == [r["task_id_path"] for r in rows]


@pytest.mark.parametrize("backend", BACKENDS)
def test_fitted_estimator_of_an_epoch_is_a_snapshot_that_pickles(backend):
    X, y = _regression()
    keep = Keep()
    reg = _mlp(backend, max_iter=4).set_callbacks(keep).fit(X, y)
    assert len(keep.fitted) == 4
    two = _mlp(backend, max_iter=2).fit(X, y)
    # kept by the callback, the copy of epoch 2 still predicts with epoch 2's weights,
    # through the process's session of the graph fed them (not pre-packed: float32's
    # last bits may differ from the fitted estimator's session)
    snapshots = [f._logit_session for f in keep.fitted]
    assert all(isinstance(s, FedSession) for s in snapshots)
    np.testing.assert_allclose(keep.fitted[1].predict(X), two.predict(X), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(keep.fitted[-1].predict(X), reg.predict(X), rtol=1e-5, atol=1e-6)
    assert np.abs(keep.fitted[1].predict(X) - reg.predict(X)).max() > 1e-3  # other weights
    assert len({id(s._made()) for s in snapshots}) == 1  # one session for the four copies
    assert keep.fitted[1].n_iter_ == 2 and keep.fitted[1].loss_curve_ == two.loss_curve_
    loaded = pickle.loads(pickle.dumps(keep.fitted[1]))  # a session of its own: exact
    assert not isinstance(loaded._logit_session, FedSession)
    np.testing.assert_array_equal(loaded.predict(X), two.predict(X))
    assert not hasattr(loaded, "_callback_fit_ctx")  # the fit's callback context stays behind
    assert loaded._optimizer_state  # Adam's moments of epoch 2: partial_fit goes on from them
    loaded.partial_fit(X, y)
    assert loaded.n_iter_ == 1 and loaded.t_ == 3 * len(X)


def test_a_classifiers_fitted_estimator_makes_only_the_session_it_predicts_with():
    """A classifier predicts from its trained graph; its exported graph (here
    LogisticRegression's own, with its label output) is another session, which a
    callback's fitted_estimator makes only when something needs it (to_onnx's model
    run, modified Huber's probabilities), not at its first prediction."""
    X, y = _classification()
    keep = Keep()
    clf = _logistic("standard", max_iter=3).set_callbacks(keep).fit(X, y)
    snapshot = keep.fitted[2]  # the third iteration's: the fit's last
    assert clf.n_iter_ == 3
    assert snapshot._export_model is _model.DEFERRED  # given its weights when first used
    assert snapshot.__dict__.get("_session") is None
    fed = snapshot._logit_session  # the process's session of the trained graph, fed
    assert isinstance(fed, FedSession) and fed._session is None  # none before it predicts
    np.testing.assert_array_equal(snapshot.predict(X), clf.predict(X))
    np.testing.assert_allclose(snapshot.predict_proba(X), clf.predict_proba(X), rtol=1e-5)
    assert fed._session is not None
    assert snapshot.__dict__.get("_session") is None
    # the exported graph's session, when asked for, gives the same labels
    labels = _model.run_onnx(snapshot, X)[_model.export_session(snapshot).get_outputs()[0].name]
    np.testing.assert_array_equal(labels, clf.predict(X))
    # the fitted estimator itself made the trained graph's at the end of its fit
    assert clf._logit_session is not None and clf.__dict__.get("_session") is None


def test_a_fitted_estimators_export_holds_its_own_iterations_weights():
    """The exported graph of a snapshot (LogisticRegression's own, converted once per
    fit) is given the weights of the snapshot's iteration when first used: its ONNX
    model and probabilities are that iteration's, not the fit's last."""
    X, y = _classification()
    keep = Keep()
    clf = _logistic("standard", max_iter=3).set_callbacks(keep).fit(X, y)
    first, last = keep.fitted[0], keep.fitted[2]
    assert "_export_converted" in clf.__dict__  # the template converted once, in the fit
    for snapshot in (first, last):
        assert snapshot._export_model is _model.DEFERRED
        assert snapshot._export_converted is clf._export_converted
    session = onnxruntime.InferenceSession(
        first.to_onnx().SerializeToString(), providers=["CPUExecutionProvider"]
    )
    labels, probabilities = session.run(None, {"X": X.astype(np.float32)})
    np.testing.assert_array_equal(labels, first.predict(X))
    np.testing.assert_allclose(probabilities, first.predict_proba(X), rtol=1e-5, atol=1e-6)
    assert np.abs(first.predict_proba(X) - clf.predict_proba(X)).max() > 1e-3
    np.testing.assert_allclose(last.predict_proba(X), clf.predict_proba(X), rtol=1e-5)
    # pickled before its first use, the copy makes its export from its own weights
    loaded = pickle.loads(pickle.dumps(keep.fitted[1]))
    assert loaded._export_model is _model.DEFERRED
    np.testing.assert_allclose(
        loaded.predict_proba(X), keep.fitted[1].predict_proba(X), rtol=1e-5, atol=1e-6
    )
    assert np.abs(loaded.predict_proba(X) - clf.predict_proba(X)).max() > 1e-4


class KeepWithRandomState(Keep):
    """Keeps each ``fitted_estimator`` and its random state's state as it was given."""

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None):
        if context.parent is not None and fitted_estimator is not None:  # not an empty task
            super().on_fit_task_end(estimator, context, fitted_estimator=fitted_estimator)
            self.scores.append(fitted_estimator._random_state.get_state())


def _same_state(a, b):
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_fitted_estimators_keep_the_random_state_they_were_given():
    """A fitted_estimator shares the fit's random state rather than copying it; the fit
    draws from a copy of its own afterwards. So each snapshot keeps the state of its
    epoch while the fit shuffles on (and after), and the fit's weights are those of a
    fit without callbacks."""
    X, y = _regression()
    keep = KeepWithRandomState()
    reg = _mlp("standard", max_iter=4, shuffle=True).set_callbacks(keep).fit(X, y)
    alone = _mlp("standard", max_iter=4, shuffle=True).fit(X, y)
    np.testing.assert_array_equal(reg.predict(X), alone.predict(X))
    states = [f._random_state.get_state() for f in keep.fitted]
    assert all(_same_state(a, b) for a, b in zip(states, keep.scores))
    assert not _same_state(states[1], states[2])  # each epoch's shuffle drew from it
    # a snapshot trained further draws from a copy of its own
    third = keep.fitted[2]
    third.set_callbacks()
    third.partial_fit(X, y)
    assert not _same_state(third._random_state.get_state(), keep.scores[2])
    others = [(f, k) for i, (f, k) in enumerate(zip(keep.fitted, keep.scores)) if i != 2]
    assert all(_same_state(f._random_state.get_state(), k) for f, k in others)
    # after L-BFGS, the snapshots and the estimator hold one random state: a warm fit
    # with shuffles leaves the snapshots' as it was
    Xc, yc = _classification()
    keep = KeepWithRandomState()
    clf = _logistic("standard", max_iter=3).set_callbacks(keep).fit(Xc, yc)
    clf.set_callbacks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clf.set_params(optimizer="sgd", max_iter=2, warm_start=True).fit(Xc, yc)
    assert not _same_state(clf._random_state.get_state(), keep.scores[-1])
    assert all(
        _same_state(f._random_state.get_state(), k) for f, k in zip(keep.fitted, keep.scores)
    )


class CopiesInHook(QuietCallback):
    """Takes ``copy.copy(estimator)`` at each epoch's end (no fitted_estimator)."""

    def __init__(self):
        self.copies, self.states = [], []

    def on_fit_task_end(self, estimator, context):
        if context.parent is not None:
            self.copies.append(copy.copy(estimator))
            self.states.append(estimator._random_state.get_state())


def test_the_fit_copies_its_random_state_only_after_a_copy_shared_it(monkeypatch):
    """A callback that takes no copy of the estimator costs no copy of the random state
    per epoch (100-200 us); a copy taken in a hook keeps the state it was given."""
    made = count_random_state_copies(monkeypatch)
    X, y = _regression()
    alone = _mlp("standard", max_iter=5, shuffle=True).fit(X, y)
    made.clear()
    quiet = _mlp("standard", max_iter=5, shuffle=True).set_callbacks(QuietCallback()).fit(X, y)
    assert len(made) == 1  # the fit's own, at its start: none per epoch
    np.testing.assert_array_equal(quiet.predict(X), alone.predict(X))
    made.clear()
    copies = CopiesInHook()
    reg = _mlp("standard", max_iter=5, shuffle=True).set_callbacks(copies).fit(X, y)
    assert len(made) == 1 + 4  # and one after each epoch a copy shared it, but the last
    np.testing.assert_array_equal(reg.predict(X), alone.predict(X))
    assert all(
        _same_state(c._random_state.get_state(), k) for c, k in zip(copies.copies, copies.states)
    )
    assert "_onnxgrad_rng_shared" not in vars(reg)


def test_a_fitted_estimators_template_shares_only_arrays_and_random_states():
    """A fitted_estimator's ``estimator_`` (the MLP with the weights of its epoch) is a
    copy of the fit's: its own weight lists, the template's arrays and random state
    shared (a random state's copy costs 100-250 us, at every epoch)."""
    X, y = _regression()
    keep = Keep()
    reg = _mlp("standard", max_iter=2).set_callbacks(keep).fit(X, y)
    first, final = keep.fitted[0].estimator_, reg.estimator_
    assert first is not final and first.coefs_ is not final.coefs_
    assert not np.array_equal(first.coefs_[0], final.coefs_[0])  # epoch 1's weights
    assert first._random_state is final._random_state
    np.testing.assert_array_equal(keep.fitted[1].estimator_.coefs_[0], final.coefs_[0])
    assert keep.fitted[0]._converted is not reg._converted  # the graph holding its weights
    # scikit-learn's copy.copy after the reconstruction was told what it would be given
    # (not to copy it first): nothing of that is left on the estimator
    assert not any(k.startswith("_onnxgrad") for k in reg.__dict__)
    clone = copy.copy(reg)  # a copy made later copies the template as before
    assert clone.estimator_ is not reg.estimator_ and clone._converted is not reg._converted


def test_a_fitted_estimator_is_the_copy_its_reconstruction_made(monkeypatch):
    """scikit-learn's fitted_estimator is ``copy.copy(estimator)`` given the
    reconstruction's attributes. The reconstruction makes that copy and ``copy.copy``
    returns it: the estimator's state is copied once per task, not twice (the root task's
    copy, with no reconstruction, is a plain copy)."""
    from onnxgrad_sklearn import _base, _callbacks

    made = {"task": 0, "plain": 0}
    real = _callbacks.shallow_state

    def counting(kind):
        def shallow_state(estimator, *args, **kwargs):
            made[kind] += 1
            return real(estimator, *args, **kwargs)

        return shallow_state

    monkeypatch.setattr(_callbacks, "shallow_state", counting("task"))
    monkeypatch.setattr(_base, "shallow_state", counting("plain"))
    X, y = _regression()
    keep = Keep()
    reg = _mlp("standard", max_iter=3).set_callbacks(keep).fit(X, y)
    assert made == {"task": 3, "plain": 1}
    two = _mlp("standard", max_iter=2).fit(X, y)
    second = keep.fitted[1]
    assert second.n_iter_ == 2 and second.loss_curve_ == two.loss_curve_
    assert second.loss_curve_ is not reg.loss_curve_ and second._skl_callbacks == []
    np.testing.assert_allclose(second.predict(X), two.predict(X), rtol=1e-5, atol=1e-6)
    assert "_engine" not in vars(second) and second._optimizer_state["step"] > 0
    assert not any(k.startswith("_onnxgrad") for k in vars(reg))


def test_a_pipelines_fitted_estimator_has_a_final_step_of_its_own():
    """In a Pipeline template, a fitted_estimator's final step holds its epoch's
    weights; the steps before it (fitted before the training, not changed by it) are
    shared with the fit's."""
    X, y = _regression()
    keep = Keep()
    template = make_pipeline(StandardScaler(), small_mlp("standard").estimator)
    reg = small_mlp("standard", max_iter=3, learning_rate_init=0.01)
    reg.set_params(estimator=template).set_callbacks(keep).fit(X, y)
    first, final = keep.fitted[0].estimator_, reg.estimator_
    assert first is not final and first[-1] is not final[-1]
    assert first[0] is final[0]  # the scaler
    assert not np.array_equal(first[-1].coefs_[0], final[-1].coefs_[0])
    np.testing.assert_array_equal(keep.fitted[-1].estimator_[-1].coefs_[0], final[-1].coefs_[0])
    np.testing.assert_allclose(keep.fitted[-1].predict(X), reg.predict(X), rtol=1e-5, atol=1e-6)


def test_copy_of_a_fitted_estimator_is_independent():
    X, y = _regression()
    reg = _mlp("standard", optimizer="adam").fit(X, y)
    before, coefs = reg.predict(X), [c.copy() for c in reg.estimator_.coefs_]
    clone = copy.copy(reg)
    np.testing.assert_array_equal(clone.predict(X), before)
    clone.partial_fit(X, y)
    assert not np.array_equal(clone.predict(X), before)
    np.testing.assert_array_equal(reg.predict(X), before)
    for got, expected in zip(reg.estimator_.coefs_, coefs):  # its weights stay its own
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(reg)).predict(X), before)
    assert len(reg.loss_curve_) == 6 and len(clone.loss_curve_) == 7


# -- a callback stops the fit --------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_callback_stops_the_fit_after_its_epoch(backend):
    X, y = _regression()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # a stop is not a failure
        stopped = _mlp(backend, max_iter=50).set_callbacks(StopAt(4)).fit(X, y)
    assert stopped.n_iter_ == 4 and len(stopped.loss_curve_) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        four = _mlp(backend, max_iter=4).fit(X, y)
    for got, expected in zip(stopped.estimator_.coefs_, four.estimator_.coefs_):
        np.testing.assert_array_equal(got, expected)
    assert stopped.loss_curve_ == four.loss_curve_


@pytest.mark.parametrize("backend", BACKENDS)
def test_callback_stop_with_early_stopping_keeps_the_best_epoch(backend):
    X, y = _regression()
    settings = dict(early_stopping=True, learning_rate_init=0.05)
    stopped = _mlp(backend, max_iter=50, **settings).set_callbacks(StopAt(5)).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        five = _mlp(backend, max_iter=5, **settings).fit(X, y)
    assert stopped.n_iter_ == 5 and stopped.validation_scores_ == five.validation_scores_
    assert stopped.best_validation_score_ == max(stopped.validation_scores_)
    np.testing.assert_array_equal(stopped.predict(X), five.predict(X))


@pytest.mark.parametrize("backend", BACKENDS)
def test_scoring_monitor_root_row_scores_the_epoch_early_stopping_kept(backend):
    X, y = _regression()
    monitor = ScoringMonitor(scoring="r2")
    reg = _mlp(backend, max_iter=60, early_stopping=True, n_iter_no_change=3, tol=0.0)
    reg.set_callbacks(monitor).fit(X, y)
    rows = monitor.get_logs().data
    kept = int(np.argmax(reg.validation_scores_))
    assert reg.n_iter_ < 60 and kept < reg.n_iter_ - 1  # it stopped, and not on its best
    assert rows[0]["r2"] == reg.score(X, y)
    assert rows[1 + kept]["r2"] == pytest.approx(rows[0]["r2"], rel=1e-6)
    assert rows[0]["r2"] != rows[-1]["r2"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_callback_stops_lbfgs_after_its_iteration(backend):
    X, y = _classification()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        stopped = _logistic(backend, max_iter=50).set_callbacks(StopAt(4)).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        four = _logistic(backend, max_iter=4).fit(X, y)
    assert stopped.n_iter_ == 4 and len(stopped.loss_curve_) == 4
    np.testing.assert_array_equal(stopped.estimator_.coef_, four.estimator_.coef_)
    np.testing.assert_array_equal(stopped.estimator_.intercept_, four.estimator_.intercept_)
    assert stopped.loss_ == four.loss_


# -- ProgressBar, Pipeline, GridSearchCV ---------------------------------------------------


def test_progress_bar_alone_and_in_a_pipeline(capsys):
    pytest.importorskip("rich", reason="ProgressBar needs rich")
    X, y = _regression()
    reg = _mlp("standard", max_iter=3).set_callbacks(callback.ProgressBar()).fit(X, y)
    assert reg.n_iter_ == 3
    assert "OrtGradientRegressor - fit" in capsys.readouterr().out
    pipe = make_pipeline(StandardScaler(), _mlp("standard", max_iter=3))
    pipe.set_callbacks(callback.ProgressBar()).fit(X, y)  # propagated to the final step
    out = capsys.readouterr().out
    assert "Pipeline - fit" in out and "OrtGradientRegressor - fit" in out


def test_scoring_monitor_in_a_pipeline_scores_the_transformed_data():
    X, y = _regression()
    X = X * [1, 100, 0.01, 1]
    monitor = ScoringMonitor(scoring="r2")
    pipe = make_pipeline(StandardScaler(), _mlp("standard").set_callbacks(monitor)).fit(X, y)
    rows = _rows(monitor)
    assert [r["task_name"] for r in rows] == ["fit"] + ["epoch"] * 6
    assert pipe.score(X, y) == pipe[-1].score(pipe[0].transform(X), y)
    assert rows[-1]["r2"] == pytest.approx(pipe.score(X, y), rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_callbacks_through_grid_search_with_two_processes(backend, capsys):
    pytest.importorskip("rich", reason="ProgressBar needs rich")
    X, y = _regression()
    monitor = ScoringMonitor(scoring="r2")
    est = _mlp(backend, max_iter=4).set_callbacks(monitor)
    search = GridSearchCV(est, {"learning_rate_init": [0.01, 0.03]}, cv=2, n_jobs=2)
    search.set_callbacks(callback.ProgressBar()).fit(X, y)
    rows = monitor.get_logs().data  # one run: the search's, rows sent by the workers
    assert len(rows) == 5 * (1 + 4)  # 2 candidates x 2 folds and the refit
    epochs = [r for r in rows if r["task_name"] == "epoch"]
    assert len(epochs) == 20 and {r["task_id"] for r in epochs} == {0, 1, 2, 3}
    assert {r["estimator_name"] for r in rows} == {"OrtGradientRegressor"}
    roots = {r["task_id_path"]: r["r2"] for r in rows if r["task_name"] == "fit"}
    last = {r["parent_task_id_path"]: r["r2"] for r in epochs if r["task_id"] == 3}
    assert roots.keys() == last.keys()  # each fit's root row is its last epoch's
    for path, score in roots.items():
        assert last[path] == pytest.approx(score, rel=1e-6)
    refit = [p for p in roots if len(p) == min(len(q) for q in roots)]
    assert [roots[p] for p in refit] == [search.best_estimator_.score(X, y)]
    out = capsys.readouterr().out
    assert "GridSearchCV - fit" in out and "OrtGradientRegressor - fit" in out


class RecordsValidation(QuietCallback):
    """Records whether scikit-learn's parameter validation is skipped in each hook."""

    def __init__(self):
        self.skipped = []

    def on_fit_task_begin(self, estimator, context):
        self.skipped.append(sklearn.get_config()["skip_parameter_validation"])

    def on_fit_task_end(self, estimator, context):
        self.skipped.append(sklearn.get_config()["skip_parameter_validation"])


def test_loops_and_hooks_skip_nested_validation_as_scikit_learns_fits():
    # scikit-learn's own estimators fit under _fit_context(prefer_skip_nested_validation=
    # True): the hooks' scorers, a validation score, skip the checks of their parameters
    X, y = _classification()
    theirs, ours, epochs = RecordsValidation(), RecordsValidation(), RecordsValidation()
    LogisticRegression(max_iter=3).set_callbacks(theirs).fit(X, y)
    _logistic("standard", max_iter=3).set_callbacks(ours).fit(X, y)
    _mlp("standard", early_stopping=True).set_callbacks(epochs).fit(*_regression())
    assert theirs.skipped and set(theirs.skipped) == {True}
    assert len(ours.skipped) >= 8 and set(ours.skipped) == {True}  # root, 3 iterations
    assert len(epochs.skipped) >= 8 and set(epochs.skipped) == {True}
    assert sklearn.get_config()["skip_parameter_validation"] is False  # put back
    # the fit itself still validates what it fits: a template's unfitted steps
    template = make_pipeline(StandardScaler(with_mean="yes"), LogisticRegression())
    est = OrtGradientClassifier(template, max_iter=3).set_callbacks(RecordsValidation())
    with pytest.raises(sklearn.utils._param_validation.InvalidParameterError, match="with_mean"):
        est.fit(X, y)


class WarnsAtIteration(QuietCallback):
    """Warns (RuntimeWarning) at the end of every subtask."""

    def on_fit_task_end(self, estimator, context):
        if context.parent is not None:
            warnings.warn("from a callback", RuntimeWarning, stacklevel=1)


def test_a_callbacks_warnings_reach_the_user_during_lbfgs():
    # the L-BFGS fit silences scipy's own RuntimeWarnings, not its callbacks'
    X, y = _classification()
    est = _logistic("standard", max_iter=3).set_callbacks(WarnsAtIteration())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(X, y)
    ours = [w for w in caught if str(w.message) == "from a callback"]
    # every iteration's task, and the one begun after the last (ended as an empty task)
    assert est.n_iter_ == 3 and len(ours) == 4


def test_partial_fit_is_one_task_without_subtasks():
    X, y = _regression()
    monitor = ScoringMonitor(scoring="r2")
    reg = _mlp("standard", optimizer="adam").set_callbacks(monitor, StopAt(1))
    for _ in range(2):
        reg.partial_fit(X, y)
        rows = monitor.get_logs().data
        assert [r["task_name"] for r in rows] == ["fit"]
        assert rows[0]["r2"] == reg.score(X, y)
    assert len(monitor.get_logs(select="all")) == 2 and reg.t_ == 2 * len(X)


def test_without_the_callback_api_the_estimators_fit_as_before():
    # scikit-learn < 1.9 as this package sees it: sklearn.callback without its names
    # (scikit-learn's own modules, imported first, keep theirs)
    code = (
        "import numpy as np\n"
        "import sklearn.callback as api, sklearn.compose, sklearn.model_selection\n"
        "from sklearn.neural_network import MLPRegressor\n"
        "names = api.CallbackSupportMixin, api.with_callbacks\n"
        "del api.CallbackSupportMixin, api.with_callbacks\n"
        "from onnxgrad_sklearn import OrtGradientRegressor\n"
        "api.CallbackSupportMixin, api.with_callbacks = names\n"
        "X = np.random.RandomState(0).randn(50, 3); y = X[:, 0]\n"
        "reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(4,)), max_iter=3,\n"
        "                           backend='standard', random_state=0).fit(X, y)\n"
        "print(reg.n_iter_, hasattr(reg, 'set_callbacks'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["3", "False"]


# -- validation data given to fit ----------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_given_validation_set_replaces_the_split(backend):
    X, y = _regression()
    X_val, y_val = _regression(40, seed=1)
    sw_val = np.random.RandomState(2).uniform(0.5, 2, 40)
    reg = _mlp(backend, max_iter=30, early_stopping=True, n_iter_no_change=3, tol=1e-3)
    reg.fit(X, y, X_val=X_val, y_val=y_val, sample_weight_val=sw_val)
    assert reg.t_ == reg.n_iter_ * len(X)  # every row of X trained
    assert len(reg.validation_scores_) == reg.n_iter_ < 30  # it stopped on them
    assert reg.best_validation_score_ == max(reg.validation_scores_)
    # the kept weights score the best score on the given set
    assert reg.score(X_val, y_val, sample_weight=sw_val) == pytest.approx(
        reg.best_validation_score_, abs=1e-6
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_given_validation_labels_are_encoded_as_y(backend):
    X, y = _classification()
    X_val, y_val = _classification(60, seed=1)
    clf = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(8,)),
        learning_rate_init=0.02,
        max_iter=15,
        early_stopping=True,
        random_state=0,
        backend=backend,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(X, y, X_val=X_val, y_val=y_val)
    assert clf.best_validation_score_ == clf.score(X_val, y_val)
    assert clf.validation_scores_[-1] != clf.validation_scores_[0]
    with pytest.raises(ValueError, match=r"y_val contains labels \['z'\]"):
        clf.fit(X, y, X_val=X_val, y_val=np.where(y_val == "a", "z", y_val))
    assert clf.best_validation_score_ == clf.score(X_val, y_val)  # unchanged by the refusal


def test_given_validation_frame_goes_through_the_templates_head():
    pd = pytest.importorskip("pandas")
    X, y = _classification(200)
    frame = pd.DataFrame({"city": np.where(X[:, 3] > 0.5, "x", "y"), "a": X[:, 0], "b": X[:, 1]})
    columns = ColumnTransformer(
        [("city", OneHotEncoder(), ["city"]), ("num", StandardScaler(), ["a", "b"])]
    )
    template = Pipeline([("columns", columns), ("mlp", MLPClassifier(hidden_layer_sizes=(8,)))])
    clf = OrtGradientClassifier(
        template, learning_rate_init=0.02, max_iter=10, early_stopping=True, random_state=0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(frame[:150], y[:150], X_val=frame[150:], y_val=y[150:])
    assert clf.best_validation_score_ == clf.score(frame[150:], y[150:])
    assert len(clf.validation_scores_) == clf.n_iter_


def test_validation_data_refusals():
    X, y = _regression()
    reg = _mlp("standard", early_stopping=True)
    with pytest.raises(ValueError, match="X_val is provided, but y_val was not provided"):
        reg.fit(X, y, X_val=X)
    with pytest.raises(ValueError, match="y_val is provided, but X_val was not provided"):
        reg.fit(X, y, y_val=y)
    with pytest.raises(ValueError, match="sample_weight_val is provided, but X_val and y_val"):
        reg.fit(X, y, sample_weight_val=np.ones(len(X)))
    with pytest.raises(ValueError, match="early_stopping is False"):
        _mlp("standard").fit(X, y, X_val=X, y_val=y)
    with pytest.raises(ValueError, match="L-BFGS"):
        _mlp("standard", early_stopping=True, optimizer="lbfgs").fit(X, y, X_val=X, y_val=y)
    with pytest.raises(ValueError, match="2 features"):
        reg.fit(X, y, X_val=X[:, :2], y_val=y)
    assert not hasattr(reg, "n_iter_")  # nothing was trained


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_callback_that_reads_the_validation_scores_takes_x_val(backend):
    X, y = _regression()
    X_val, y_val = _regression(40, seed=1)
    keep = Keep(validation=True)
    reg = _mlp(backend, max_iter=5).set_callbacks(keep).fit(X, y, X_val=X_val, y_val=y_val)
    assert reg.n_iter_ == 5 and [len(s) for s in keep.scores] == [1, 2, 3, 4, 5]
    # scored each epoch, nothing stops on them, the last epoch's weights are kept
    assert reg.validation_scores_[-1] == pytest.approx(reg.score(X_val, y_val), abs=1e-6)
    assert keep.scores[2][-1] == pytest.approx(keep.fitted[2].score(X_val, y_val), abs=1e-6)


def test_validation_data_routed_through_grid_search_and_pipeline():
    X, y = _regression()
    X_val, y_val = _regression(40, seed=1)
    X, X_val = X * [1, 100, 0.01, 1], X_val * [1, 100, 0.01, 1]
    with sklearn.config_context(enable_metadata_routing=True):
        est = _mlp("standard", max_iter=10, early_stopping=True).set_fit_request(
            X_val=True, y_val=True
        )
        search = GridSearchCV(est, {"learning_rate_init": [0.01, 0.03]}, cv=2)
        search.fit(X, y, X_val=X_val, y_val=y_val)
        best = search.best_estimator_
        assert best.best_validation_score_ == pytest.approx(best.score(X_val, y_val), abs=1e-6)
        # an outer Pipeline transforms X_val by its steps in front, as X
        pipe = Pipeline(
            [("scale", StandardScaler()), ("reg", clone_of(est))], transform_input=["X_val"]
        ).fit(X, y, X_val=X_val, y_val=y_val)
        reg = pipe[-1]
        assert reg.best_validation_score_ == pytest.approx(pipe.score(X_val, y_val), abs=1e-6)
        assert reg.t_ == reg.n_iter_ * len(X)


def clone_of(est):
    from sklearn.base import clone

    return clone(est)
