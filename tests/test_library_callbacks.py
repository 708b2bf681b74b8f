"""The library's callbacks (onnxgrad_sklearn.callbacks): EarlyStopping, LRScheduler."""

import json
import logging
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from _helpers import BACKENDS, PausedFit, QuietCallback, small_mlp, smooth_regression
from sklearn.metrics import accuracy_score, mean_squared_error
from sklearn.neural_network import MLPClassifier

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.engine import TrainingEngine

pytest.importorskip("sklearn.callback", reason="scikit-learn < 1.9: no callback API")
from onnxgrad_sklearn.callbacks import Checkpoint, EarlyStopping, LRScheduler  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _regression(n=160, seed=0):
    return smooth_regression(n, seed, noise=0.3)


def _mlp(backend, **params):
    return small_mlp(backend, **{"learning_rate_init": 0.05, "max_iter": 40, **params})


def _weights(est):
    final = est.estimator_[-1] if hasattr(est.estimator_, "steps") else est.estimator_
    return final.coefs_ + final.intercepts_


def _same_weights(a, b):
    wa, wb = _weights(a), _weights(b)
    return len(wa) == len(wb) and all(np.array_equal(u, v) for u, v in zip(wa, wb))


def _rule(scores, patience, tol):
    """EarlyStopping's rule, written again: (best epoch, stopped epoch or None)."""
    best, best_epoch, waited = -np.inf, None, 0
    for epoch, score in enumerate(scores, 1):
        if best_epoch is None or score > best + tol:
            best, best_epoch, waited = score, epoch, 0
            continue
        waited += 1
        if waited >= patience:
            return best_epoch, epoch
    return best_epoch, None


# -- EarlyStopping ----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_early_stopping_stops_where_the_rule_says_and_keeps_the_best_epoch(backend):
    X, y = _regression()
    X_tr, y_tr, X_val, y_val = X[:120], y[:120], X[120:], y[120:]
    stop = EarlyStopping(scoring="neg_mean_squared_error", patience=3, tol=1e-3)
    reg = _mlp(backend).set_callbacks(stop).fit(X_tr, y_tr, X_val=X_val, y_val=y_val)
    assert stop.stopped_epoch_ is not None and reg.n_iter_ == stop.stopped_epoch_ < 40
    # the scores again, from fits of k epochs (the validation set does not train)
    scores = [
        -mean_squared_error(y_val, _mlp(backend, max_iter=k).fit(X_tr, y_tr).predict(X_val))
        for k in range(1, reg.n_iter_ + 1)
    ]
    # the epochs' copies predict through a session fed their weights: float32's rounding
    np.testing.assert_allclose(stop.scores_, scores, rtol=1e-6)
    best, stopped = _rule(scores, patience=3, tol=1e-3)
    assert (stop.best_epoch_, stop.stopped_epoch_) == (best, stopped)
    assert stop.best_score_ == stop.scores_[best - 1]
    assert len(reg.loss_curve_) == reg.n_iter_  # every epoch run is counted
    # the weights of the best epoch, bit for bit
    reference = _mlp(backend, max_iter=best).fit(X_tr, y_tr)
    assert _same_weights(reg, reference)
    np.testing.assert_array_equal(reg.predict(X), reference.predict(X))


@pytest.mark.parametrize("backend", BACKENDS)
def test_early_stopping_without_restore_keeps_the_last_epoch(backend):
    X, y = _regression()
    stop = EarlyStopping(scoring="neg_mean_squared_error", patience=2, tol=1e-3, restore_best=False)
    reg = _mlp(backend).set_callbacks(stop).fit(X[:120], y[:120], X_val=X[120:], y_val=y[120:])
    assert reg.n_iter_ == stop.stopped_epoch_ and stop.best_epoch_ < reg.n_iter_
    assert _same_weights(reg, _mlp(backend, max_iter=reg.n_iter_).fit(X[:120], y[:120]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_early_stopping_holds_out_validation_fraction_as_early_stopping_does(backend):
    X, y = _regression()
    stop = EarlyStopping(patience=3, tol=1e-3)  # the estimator's score: R2
    reg = _mlp(backend, validation_fraction=0.2).set_callbacks(stop).fit(X, y)
    assert stop.stopped_epoch_ == reg.n_iter_ < 40
    # the same rows held out as early_stopping=True's split: the same training
    builtin = _mlp(backend, validation_fraction=0.2, early_stopping=True, max_iter=reg.n_iter_)
    builtin.fit(X, y)
    assert reg.loss_curve_ == builtin.loss_curve_
    # and the same validation rows: R2 on them, as the built-in one scores them
    np.testing.assert_allclose(stop.scores_, builtin.validation_scores_, rtol=1e-5, atol=1e-6)
    assert reg.validation_scores_ == builtin.validation_scores_  # recorded as well
    # the best epoch's weights: those of the same fit run for that many epochs
    again = EarlyStopping(patience=10**6, restore_best=False)
    reference = _mlp(backend, validation_fraction=0.2, max_iter=stop.best_epoch_)
    assert _same_weights(reg, reference.set_callbacks(again).fit(X, y))


@pytest.mark.parametrize("backend", BACKENDS)
def test_early_stopping_with_the_built_in_one_and_a_classifier(backend):
    X, _ = _regression(200)
    y = np.array(["low", "mid", "high"])[(X[:, 0] > 0).astype(int) + (X[:, 1] > 0.5)]
    stop = EarlyStopping(scoring="accuracy", patience=2, tol=0.0)
    clf = OrtGradientClassifier(
        MLPClassifier(hidden_layer_sizes=(8,)),
        learning_rate_init=0.05,
        batch_size=32,
        max_iter=60,
        early_stopping=True,
        n_iter_no_change=1000,
        random_state=0,
        backend=backend,
    ).set_callbacks(stop)
    clf.fit(X, y)
    assert clf.n_iter_ == stop.stopped_epoch_ < 60  # the callback's rule came first
    # the built-in score is the accuracy on the same held-out rows
    np.testing.assert_allclose(stop.scores_, clf.validation_scores_)
    assert stop.best_score_ == max(stop.scores_)
    assert accuracy_score(y, clf.predict(X)) > 0.5


def test_early_stopping_leaves_lbfgs_and_partial_fit_alone():
    X, y = _regression()
    stop = EarlyStopping(patience=1)
    reg = _mlp("standard", max_iter=3).set_callbacks(stop)
    reg.partial_fit(X, y)
    assert stop.scores_ == [] and reg.n_iter_ == 1
    from sklearn.linear_model import Ridge

    ridge = OrtGradientRegressor(Ridge(), backend="standard").set_callbacks(stop).fit(X, y)
    assert stop.scores_ == [] and ridge.n_iter_ >= 1


def test_early_stopping_refuses_bad_parameters():
    with pytest.raises(ValueError, match="patience"):
        EarlyStopping(patience=0)
    with pytest.raises(ValueError, match="tol"):
        EarlyStopping(tol=-1)


# -- LRScheduler ------------------------------------------------------------------------------


@pytest.fixture
def used_rates(monkeypatch):
    """The learning rate of every update (train_batch) of the fits in the test."""
    rates = []
    train_batch = TrainingEngine.train_batch

    def recording(self, X, y, sample_weight, learning_rate):
        rates.append(learning_rate)
        return train_batch(self, X, y, sample_weight, learning_rate)

    monkeypatch.setattr(TrainingEngine, "train_batch", recording)
    return rates


def _per_epoch(rates, batches):
    """One rate per epoch, checking that every batch of an epoch had it."""
    epochs = [rates[k : k + batches] for k in range(0, len(rates), batches)]
    assert all(len(set(e)) == 1 for e in epochs)
    return [e[0] for e in epochs]


def _cosine(e, lr0, max_iter, warmup, min_lr):
    if e < warmup:
        return lr0 * (e + 1) / warmup
    progress = (e - warmup) / (max_iter - warmup)
    return min_lr + (lr0 - min_lr) * (1 + math.cos(math.pi * progress)) / 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "scheduler, formula",
    [
        (
            LRScheduler("cosine", warmup=2, min_lr=1e-4),
            lambda e: _cosine(e, 0.05, 8, 2, 1e-4),
        ),
        (LRScheduler("step", step_size=3, gamma=0.5), lambda e: 0.05 * 0.5 ** (e // 3)),
        (LRScheduler(lambda e: 0.01 / (1 + e)), lambda e: 0.01 / (1 + e)),
    ],
    ids=["cosine", "step", "callable"],
)
def test_scheduler_sets_the_rate_of_each_epoch(backend, scheduler, formula, used_rates):
    X, y = _regression(128)
    reg = _mlp(backend, max_iter=8).set_callbacks(scheduler).fit(X, y)
    expected = [formula(e) for e in range(8)]
    assert reg.n_iter_ == 8
    assert _per_epoch(used_rates, 4) == pytest.approx(expected, rel=1e-15)
    assert scheduler.learning_rates_ == _per_epoch(used_rates, 4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scheduled_fit_equals_partial_fits_with_the_rates_set_by_hand(backend):
    X, y = _regression(128)
    scheduler = LRScheduler("step", step_size=2, gamma=0.3)
    reg = _mlp(backend, max_iter=6, shuffle=False).set_callbacks(scheduler).fit(X, y)
    by_hand = _mlp(backend, max_iter=6, shuffle=False)
    for epoch in range(6):
        if epoch:  # the first partial_fit makes the schedule, at learning_rate_init
            by_hand._schedule.learning_rate = 0.05 * 0.3 ** (epoch // 2)
        by_hand.partial_fit(X, y)
    assert _same_weights(reg, by_hand)
    assert reg.loss_curve_ == by_hand.loss_curve_


@pytest.mark.parametrize("backend", BACKENDS)
def test_plateau_reduces_the_rate_when_the_loss_stalls(backend, used_rates):
    X, y = _regression(128)
    scheduler = LRScheduler("plateau", factor=0.5, patience=2, threshold=0.02, min_lr=0.01)
    reg = _mlp(backend, max_iter=15).set_callbacks(scheduler).fit(X, y)
    # the rule again, on the training losses
    rate, best, waited, expected = 0.05, np.inf, 0, []
    for loss in reg.loss_curve_:
        expected.append(rate)
        if loss < best - 0.02:
            best, waited = loss, 0
        else:
            waited += 1
            if waited >= 2:
                rate, waited = max(rate * 0.5, 0.01), 0
    assert _per_epoch(used_rates, 4) == expected
    assert min(expected) < 0.05  # it did reduce


def test_plateau_on_a_validation_score_takes_x_val_without_early_stopping(used_rates):
    X, y = _regression(160)
    scheduler = LRScheduler("plateau", monitor="validation_score", factor=0.5, patience=1)
    reg = _mlp("standard", max_iter=10).set_callbacks(scheduler)
    reg.fit(X[:128], y[:128], X_val=X[128:], y_val=y[128:])
    assert len(reg.validation_scores_) == 10
    rate, best, expected = 0.05, np.inf, []
    for score in reg.validation_scores_:
        expected.append(rate)
        if -score < best - 1e-4:
            best = -score
        else:
            rate *= 0.5  # patience=1: each epoch without improvement
    assert _per_epoch(used_rates, 4) == expected


def test_scheduler_refuses_bad_parameters():
    with pytest.raises(ValueError, match="schedule"):
        LRScheduler("linear")
    with pytest.raises(ValueError, match="monitor"):
        LRScheduler("plateau", monitor="accuracy")


# -- Checkpoint -------------------------------------------------------------------------------

_KILLED_FIT = """
import json, os, signal, sys, warnings
import numpy as np
warnings.simplefilter("ignore")
from sklearn.neural_network import MLPRegressor
from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.callbacks import Checkpoint

path, backend = sys.argv[1], sys.argv[2]
early_stopping, kill_at = sys.argv[3] == "1", int(sys.argv[4])
params, every = json.loads(sys.argv[5]), int(sys.argv[6])
rng = np.random.RandomState(0)
X = rng.randn(160, 4)
y = np.sin(X[:, 0]) + 0.5 * X[:, 1] - X[:, 2] + 0.3 * rng.randn(160)


class Kill:
    def setup(self, estimator, context):
        pass

    def on_fit_task_begin(self, estimator, context):
        pass

    def on_fit_task_end(self, estimator, context):
        if context.task_name == "epoch" and estimator.n_iter_ == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def teardown(self, estimator, context):
        pass


params.setdefault("n_iter_no_change", np.inf)
reg = OrtGradientRegressor(
    MLPRegressor(hidden_layer_sizes=(8,)), learning_rate_init=0.05, batch_size=32,
    random_state=0, backend=backend, early_stopping=early_stopping, **params,
)
reg.set_callbacks(Checkpoint(path, every=every), Kill()).fit(X, y)
"""


class _Rates(QuietCallback):
    """Records the schedule's learning rate at the start of each epoch."""

    def __init__(self):
        self.rates = []

    def on_fit_task_begin(self, estimator, context):
        if context.task_name == "epoch":
            self.rates.append(estimator._schedule.learning_rate)


# (params, every, the epoch killed after, the epoch saved last before it)
_KILLS = {
    "plain": (dict(max_iter=10), 2, 5, 4),
    "early_stopping": (dict(max_iter=10, early_stopping=True), 2, 5, 4),
    # the adaptive rate is divided by 5 at the end of epochs 6, 8, 10 (and 12, 14)
    "adaptive": (
        dict(max_iter=16, learning_rate="adaptive", tol=0.05, n_iter_no_change=1),
        1,
        11,
        11,
    ),
}


def _meta(path):
    with np.load(path, allow_pickle=False) as saved:
        return json.loads(str(saved["meta"]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(_KILLS))
def test_a_killed_fit_started_again_ends_as_an_uninterrupted_one(backend, case, tmp_path):
    params, every, kill_at, saved_at = _KILLS[case]
    early_stopping = params.get("early_stopping", False)
    path = tmp_path / "fit.ckpt.npz"
    script = {k: v for k, v in params.items() if k != "early_stopping"}
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            _KILLED_FIT,
            str(path),
            backend,
            str(int(early_stopping)),
            str(kill_at),
            json.dumps(script),
            str(every),
        ],
        capture_output=True,
        text=True,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]  # SIGKILL after epoch kill_at
    assert path.is_file() and not list(tmp_path.glob("*.tmp"))
    assert _meta(path)["finished"] is False
    X, y = _regression()
    rates = _Rates()
    whole = _mlp(backend, **params).set_callbacks(rates).fit(X, y)
    max_iter = params["max_iter"]
    assert whole.n_iter_ == max_iter
    if params.get("learning_rate") == "adaptive":  # divided before the kill, and after it
        assert len(set(rates.rates[:kill_at])) > 1
        assert len(set(rates.rates[kill_at:])) > 1
    checkpoint = Checkpoint(path, every=every)
    again_rates = _Rates()
    again = _mlp(backend, **params).set_callbacks(checkpoint, again_rates).fit(X, y)
    assert checkpoint.resumed_from_ == saved_at  # the last epoch saved before the kill
    assert checkpoint.saved_epochs_ == list(range(saved_at + every, max_iter + 1, every))
    assert again_rates.rates == rates.rates[saved_at:]
    assert again.loss_curve_ == whole.loss_curve_ and again.n_iter_ == whole.n_iter_
    assert again.t_ == whole.t_
    assert again._schedule.learning_rate == whole._schedule.learning_rate
    assert again.best_loss_ == whole.best_loss_
    assert again._no_improvement_count == whole._no_improvement_count
    assert _same_weights(again, whole)
    if early_stopping:
        assert again.validation_scores_ == whole.validation_scores_
        assert again.best_validation_score_ == whole.best_validation_score_
    meta = _meta(path)  # the fit is over: its checkpoint is marked finished
    assert meta["finished"] is True and meta["final_epoch"] == max_iter
    assert not os.path.exists(str(path) + ".lock")


class _Interrupt(QuietCallback):
    """Raises KeyboardInterrupt at the end of epoch ``at``."""

    def __init__(self, at):
        self.at = at

    def on_fit_task_end(self, estimator, context):
        if context.task_name == "epoch" and estimator.n_iter_ == self.at:
            raise KeyboardInterrupt


def test_a_scheduled_fit_goes_on_from_a_checkpoint_with_its_rates(tmp_path, used_rates):
    X, y = _regression(128)
    path = tmp_path / "fit.ckpt.npz"

    def scheduled(*callbacks):
        scheduler = LRScheduler("step", step_size=2, gamma=0.5)
        return _mlp("standard", max_iter=8).set_callbacks(scheduler, *callbacks), scheduler

    whole, _ = scheduled()
    whole.fit(X, y)
    rates = _per_epoch(used_rates, 4)
    with pytest.raises(KeyboardInterrupt):
        scheduled(Checkpoint(path), _Interrupt(3))[0].fit(X, y)
    used_rates.clear()
    again, scheduler = scheduled(Checkpoint(path))
    again.fit(X, y)
    assert scheduler.learning_rates_ == rates[3:] == _per_epoch(used_rates, 4)
    assert again.loss_curve_ == whole.loss_curve_ and _same_weights(again, whole)


def test_a_checkpoint_of_other_parameters_or_data_is_refused(tmp_path):
    path = tmp_path / "fit.ckpt.npz"
    X, y = _regression()
    weight = np.ones(len(y))
    _mlp("standard", max_iter=2).set_callbacks(Checkpoint(path)).fit(X, y, sample_weight=weight)
    with np.load(path, allow_pickle=False) as saved:  # arrays and a JSON document, no pickle
        assert "meta" in saved.files and "weight_0" in saved.files
    cases = [
        (dict(learning_rate_init=0.01), (X, y, weight), "other parameters.*learning_rate_init"),
        ({}, (X + 1, y, weight), "other data.*X"),
        ({}, (X, y + 1, weight), "other data.*y"),
        ({}, (X, y, 2 * weight), "other data.*sample_weight"),
    ]
    for params, (Xc, yc, wc), message in cases:
        reg = _mlp("standard", max_iter=2, **params).fit(Xc, yc)
        before = reg.predict(X)
        with pytest.raises(ValueError, match=message):  # refused before training
            reg.set_callbacks(Checkpoint(path)).fit(Xc, yc, sample_weight=wc)
        np.testing.assert_array_equal(reg.predict(X), before)
    # the same parameters and data: the fit was finished, this one starts afresh
    checkpoint = Checkpoint(path)
    reg = _mlp("standard", max_iter=2).set_callbacks(checkpoint)
    reg.fit(X, y, sample_weight=weight)
    assert checkpoint.resumed_from_ is None and reg.n_iter_ == 2
    with pytest.raises(ValueError, match="every"):
        Checkpoint(path, every=0)


def test_a_finished_checkpoint_is_marked_and_a_new_fit_starts_afresh(tmp_path, caplog):
    X, y = _regression(128)
    path = tmp_path / "fit.ckpt.npz"
    first = _mlp("standard", max_iter=5).set_callbacks(Checkpoint(path, every=2)).fit(X, y)
    meta = _meta(path)  # epoch 4 saved, the fit ended at epoch 5
    assert meta["finished"] is True and meta["final_epoch"] == 5
    assert meta["fit"]["n_iter_"] == 4
    checkpoint = Checkpoint(path, every=2)
    with caplog.at_level(logging.INFO, logger="onnxgrad_sklearn"):
        again = _mlp("standard", max_iter=5).set_callbacks(checkpoint).fit(X, y)
    assert "finished fit" in caplog.text and "starting afresh" in caplog.text
    assert checkpoint.resumed_from_ is None and checkpoint.saved_epochs_ == [2, 4]
    assert again.loss_curve_ == first.loss_curve_ and _same_weights(again, first)
    assert _meta(path)["finished"] is True
    # a fit stopped by a callback completes too; one interrupted does not
    with pytest.raises(KeyboardInterrupt):
        _mlp("standard", max_iter=5).set_callbacks(Checkpoint(path), _Interrupt(3)).fit(X, y)
    assert _meta(path)["finished"] is False and _meta(path)["fit"]["n_iter_"] == 3
    assert not os.path.exists(str(path) + ".lock")  # released on the interruption
    checkpoint = Checkpoint(path)
    _mlp("standard", max_iter=5).set_callbacks(checkpoint, _StopAt(4)).fit(X, y)
    assert checkpoint.resumed_from_ == 3 and checkpoint.saved_epochs_ == [4]
    meta = _meta(path)
    assert meta["finished"] is True and meta["final_epoch"] == 4


class _StopAt(QuietCallback):
    """Stops the fit at the end of epoch ``at``."""

    def __init__(self, at):
        self.at = at

    def on_fit_task_end(self, estimator, context):
        return context.task_name == "epoch" and estimator.n_iter_ == self.at


def test_two_fits_writing_one_checkpoint_at_once_are_refused(tmp_path):
    X, y = _regression(128)
    path = tmp_path / "fit.ckpt.npz"
    lock = tmp_path / "fit.ckpt.npz.lock"
    pause = PausedFit(tmp_path)
    first = _mlp("standard", max_iter=3).set_callbacks(Checkpoint(path), pause)
    with pause.fitting(first.fit, X, y) as errors:
        assert lock.read_text() == str(os.getpid())
        second = _mlp("standard", max_iter=3).set_callbacks(Checkpoint(path))
        with pytest.raises(ValueError, match=f"{path}.*process {os.getpid()}"):
            second.fit(X, y)
        assert lock.exists()  # the refused fit leaves the other one's lock
    assert not errors and first.n_iter_ == 3
    assert not lock.exists()  # released at the end of the fit


def test_a_lock_held_by_another_live_process_refuses_and_a_stale_one_is_taken_over(
    tmp_path, caplog
):
    X, y = _regression(128)
    path = tmp_path / "fit.ckpt.npz"
    lock = tmp_path / "fit.ckpt.npz.lock"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    fitted = _mlp("standard", max_iter=2).fit(X, y)
    before = fitted.predict(X)
    try:
        lock.write_text(str(sleeper.pid))
        with pytest.raises(ValueError, match=f"{path}.*process {sleeper.pid}"):
            _mlp("standard", max_iter=2).set_callbacks(Checkpoint(path)).fit(X, y)
        # refused before training: a fitted estimator keeps what it predicted
        with pytest.raises(ValueError, match=f"{path}.*process {sleeper.pid}"):
            fitted.set_callbacks(Checkpoint(path)).fit(X[::-1], y[::-1])
        np.testing.assert_array_equal(fitted.predict(X), before)
        assert lock.read_text() == str(sleeper.pid) and not path.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    # the process is gone: its lock is stale, taken over with a warning
    with caplog.at_level(logging.WARNING, logger="onnxgrad_sklearn"):
        reg = _mlp("standard", max_iter=2).set_callbacks(Checkpoint(path)).fit(X, y)
    assert f"process {sleeper.pid}" in caplog.text and "taking it over" in caplog.text
    assert reg.n_iter_ == 2 and path.exists() and not lock.exists()


# -- without scikit-learn's callback API ------------------------------------------------------


def test_the_module_imports_without_the_callback_api():
    code = (
        "import sys\n"
        "import sklearn.linear_model, sklearn.neural_network, sklearn.model_selection\n"
        "import sklearn.pipeline, sklearn.compose, sklearn.preprocessing\n"
        "sys.modules['sklearn.callback'] = None  # scikit-learn < 1.9 as this package sees it\n"
        "from onnxgrad_sklearn.callbacks import Checkpoint, EarlyStopping, LRScheduler\n"
        "for make in (EarlyStopping, lambda: LRScheduler('step'), lambda: Checkpoint('c')):\n"
        "    try:\n"
        "        make()\n"
        "    except ImportError as exc:\n"
        "        print('>= 1.9' in str(exc))\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "True", "True"]
