"""Bad input, divergence, interruption, threads and garbage collection."""

import gc
import threading
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import BACKENDS, QuietCallback, onnx_predict
from _isolated import run_isolated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import ConvergenceError, OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn.engine import TrainingEngine

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")


def _data(kind, n=60, d=4, seed=0):
    rng = np.random.RandomState(seed)
    X = rng.randn(n, d)
    y = X[:, 0] - X[:, 1] if kind == "regressor" else (X[:, 0] > 0).astype(int)
    return X, y


def _fitted(kind):
    X, y = _data(kind)
    cls = OrtGradientRegressor if kind == "regressor" else OrtGradientClassifier
    template = (
        MLPRegressor(hidden_layer_sizes=(5,))
        if kind == "regressor"
        else MLPClassifier(hidden_layer_sizes=(5,))
    )
    return (
        cls(template, optimizer="adam", learning_rate_init=0.01, max_iter=5, random_state=0).fit(
            X, y
        ),
        X,
        y,
    )


def _bad_inputs(X, y):
    X_nan = X.copy()
    X_nan[3, 1] = np.nan
    X_inf = X.copy()
    X_inf[0, 0] = np.inf
    X_str = X.astype(object)
    X_str[2, 2] = "a"
    return {
        "nan in X": (X_nan, y, ValueError, "Input X contains NaN"),
        "inf in X": (X_inf, y, ValueError, "Input X contains infinity"),
        "1-D X": (X[:, 0], y, ValueError, "Expected 2D array, got 1D array"),
        "3-D X": (X[:, :, None], y, ValueError, "Found array with dim 3"),
        "empty X": (X[:0], y[:0], ValueError, "0 sample"),
        "object X": (X_str, y, ValueError, "could not convert string to float"),
        "complex X": (X + 1j, y, ValueError, "Complex data not supported"),
        "sparse X with inf": (sp.csr_matrix(X_inf), y, ValueError, "Input X contains infinity"),
        "too few features": (X[:, :3], y, ValueError, "X has 3 features, but .* expecting 4"),
    }


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
@pytest.mark.parametrize("method", ["fit", "partial_fit", "predict", "predict_proba", "score"])
def test_bad_input_raises_the_documented_error_and_keeps_the_model(kind, method):
    est, X, y = _fitted(kind)
    if method == "predict_proba" and kind == "regressor":
        pytest.skip("regressors have no predict_proba")
    before = est.predict(X)
    weights = [w.copy() for w in est.estimator_.coefs_]
    for name, (Xb, yb, exc, match) in _bad_inputs(X, y).items():
        if name == "too few features" and method == "fit":
            continue  # a new fit may change the number of features
        call = getattr(est, method)
        args = (Xb, yb) if method in ("fit", "partial_fit", "score") else (Xb,)
        with pytest.raises(exc, match=match):
            call(*args)
        np.testing.assert_array_equal(est.predict(X), before, err_msg=name)
    for a, b in zip(est.estimator_.coefs_, weights):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_bad_targets_raise_before_training(kind):
    est, X, y = _fitted(kind)
    before = est.predict(X)
    with pytest.raises(ValueError, match="inconsistent numbers of samples"):
        est.fit(X, y[:-1])
    if kind == "regressor":
        y_nan = y.astype(float)
        y_nan[4] = np.nan
        with pytest.raises(ValueError, match="Input y contains NaN"):
            est.fit(X, y_nan)
    else:
        with pytest.raises(ValueError, match="only one class"):
            est.fit(X, np.zeros(len(y), dtype=int))
    with pytest.raises(ValueError, match="sample_weight.shape"):
        est.fit(X, y, sample_weight=np.ones(3))
    # a new fit may change the number of features, but a failed one changes nothing
    with pytest.raises(ValueError, match="sample_weight.shape"):
        est.fit(X[:, :3], y, sample_weight=np.ones(3))
    assert est.n_features_in_ == 4
    np.testing.assert_array_equal(est.predict(X), before)


def test_pandas_with_a_text_column_is_refused():
    pd = pytest.importorskip("pandas")
    X, y = _data("regressor")
    df = pd.DataFrame(X, columns=list("abcd"))
    df["b"] = ["x"] * len(df)
    with pytest.raises(ValueError, match="could not convert string to float"):
        OrtGradientRegressor().fit(df, y)


def test_float64_input_trains_in_float32_like_float32_input():
    X, y = _data("regressor")
    params = dict(optimizer="adam", max_iter=5, random_state=0)
    a = OrtGradientRegressor(**params).fit(X, y)
    b = OrtGradientRegressor(**params).fit(X.astype(np.float32), y.astype(np.float32))
    np.testing.assert_array_equal(a.estimator_.coef_, b.estimator_.coef_)


@pytest.mark.parametrize("kind", ["regressor", "classifier"])
def test_divergence_raises_convergence_error_and_keeps_finite_weights(kind):
    X, y = _data(kind, n=200)
    X = X * 100
    cls = OrtGradientRegressor if kind == "regressor" else OrtGradientClassifier
    template = (
        MLPRegressor(hidden_layer_sizes=(8,))
        if kind == "regressor"
        else MLPClassifier(hidden_layer_sizes=(8,))
    )
    est = cls(
        template,
        learning_rate_init=1e6,
        optimizer="sgd",
        max_iter=20,
        random_state=0,
        batch_size=20,
    )
    with pytest.raises(ConvergenceError, match="diverged.*smaller learning_rate_init") as info:
        est.fit(X, y)
    assert isinstance(info.value, ValueError)
    assert np.all(np.isfinite(est.predict_proba(X) if kind == "classifier" else est.predict(X)))
    assert all(np.isfinite(c).all() for c in est.estimator_.coefs_)
    assert len(est.loss_curve_) == est.n_iter_ and np.all(np.isfinite(est.loss_curve_))

    est.set_params(on_divergence="warn")
    with pytest.warns(ConvergenceWarning, match="diverged"):
        est.fit(X, y)
    assert np.all(np.isfinite(est.predict_proba(X) if kind == "classifier" else est.predict(X)))
    assert est.n_iter_ < 20


def _steps_with(monkeypatch, action):
    """Patch ``TrainingEngine.train_batch``: ``action(n, step)`` runs call ``n``;
    ``step(rate=None)`` makes it (at another learning rate if given)."""
    original = TrainingEngine.train_batch
    calls = {"n": 0}

    def train_batch(self, X, y, sample_weight, lr):
        calls["n"] += 1
        return action(calls["n"], lambda rate=lr: original(self, X, y, sample_weight, rate))

    monkeypatch.setattr(TrainingEngine, "train_batch", train_batch)


def _interrupt_at(number):
    def action(n, step):
        if n == number:
            raise KeyboardInterrupt
        return step()

    return action


def _interrupted_fit(monkeypatch, backend, action, early_stopping=False):
    """The weights after each step of a reference fit, and the fit ``action`` interrupts.

    100 rows in batches of 20: 5 steps per epoch (with early stopping, 90 rows: 5 too).
    """
    X, y = _data("regressor", n=100)

    def make():
        return OrtGradientRegressor(
            MLPRegressor(hidden_layer_sizes=(6,)),
            optimizer="adam",
            batch_size=20,
            max_iter=10,
            random_state=0,
            backend=backend,
            early_stopping=early_stopping,
        )

    reference = make()
    after = {}

    def record(n, step):
        loss = step()
        after[n] = reference._engine.get_weights()
        return loss

    _steps_with(monkeypatch, record)
    reference.fit(X, y)
    monkeypatch.undo()
    _steps_with(monkeypatch, action)
    est = make()
    with pytest.warns(UserWarning, match="interrupted.*n_iter_=2") as caught:
        with pytest.raises(KeyboardInterrupt):
            est.fit(X, y)
    monkeypatch.undo()
    assert est.n_iter_ == 2 and est.loss_curve_ == reference.loss_curve_[:2]
    return X, y, reference, after, est, str(caught[0].message)


def _keeps(est, weights, X):
    """``est`` holds ``weights``, and predict, ``estimator_`` and the ONNX export agree."""
    for a, b in zip(est._engine.get_weights(), weights):
        np.testing.assert_array_equal(a, b)
    predicted = est.predict(X)
    np.testing.assert_allclose(est.estimator_.predict(X), predicted, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        onnx_predict(est.to_onnx(), X).ravel(), predicted, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyboard_interrupt_keeps_the_last_completed_batch_as_mlp_regressor(monkeypatch, backend):
    # Ctrl-C before the third batch of the third epoch: the 12 steps done are kept
    X, y, _, after, est, message = _interrupted_fit(monkeypatch, backend, _interrupt_at(13))
    assert "2 updates into epoch 3" in message
    _keeps(est, after[12], X)
    est.partial_fit(X, y)  # and training goes on from them
    assert est._engine.step == 12 + 5  # one more epoch

    def as_the_step_returns(n, step):
        loss = step()
        if n == 13:
            raise KeyboardInterrupt
        return loss

    X, _, _, after, est, _ = _interrupted_fit(monkeypatch, backend, as_the_step_returns)
    _keeps(est, after[13], X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyboard_interrupt_between_a_diverging_step_and_its_check_keeps_finite_weights(
    monkeypatch, backend
):
    def diverge(n, step):
        if n == 13:
            step(rate=np.inf)  # infinite weights, or a non-finite loss
            raise KeyboardInterrupt
        return step()

    X, _, _, after, est, _ = _interrupted_fit(monkeypatch, backend, diverge)
    _keeps(est, after[12], X)
    assert np.all(np.isfinite(est.predict(X)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_keyboard_interrupt_with_early_stopping_keeps_the_best_epoch(monkeypatch, backend):
    X, _, reference, after, est, message = _interrupted_fit(
        monkeypatch, backend, _interrupt_at(13), early_stopping=True
    )
    assert "best epoch" in message
    assert est.validation_scores_ == reference.validation_scores_[:2]
    best = int(np.argmax(est.validation_scores_)) + 1
    _keeps(est, after[best * 5], X)


def test_two_fits_in_two_threads_equal_sequential_fits():
    X, y = _data("regressor", n=300)
    Xc, yc = _data("classifier", n=300, seed=1)

    def make():
        return (
            OrtGradientRegressor(
                MLPRegressor(hidden_layer_sizes=(16,)),
                optimizer="adam",
                max_iter=10,
                batch_size=16,
                random_state=0,
            ),
            OrtGradientClassifier(
                MLPClassifier(hidden_layer_sizes=(16,)),
                optimizer="nesterov",
                max_iter=10,
                batch_size=16,
                random_state=0,
            ),
        )

    seq_r, seq_c = make()
    seq_r.fit(X, y)
    seq_c.fit(Xc, yc)
    par_r, par_c = make()
    threads = [
        threading.Thread(target=par_r.fit, args=(X, y)),
        threading.Thread(target=par_c.fit, args=(Xc, yc)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    np.testing.assert_array_equal(par_r.predict(X), seq_r.predict(X))
    np.testing.assert_array_equal(par_c.predict_proba(Xc), seq_c.predict_proba(Xc))


def test_predict_from_several_threads_on_one_estimator():
    est, X, _ = _fitted("classifier")
    expected = est.predict_proba(X)
    results = [None] * 8

    def work(i):
        for _ in range(20):
            results[i] = est.predict_proba(X)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in results:
        np.testing.assert_array_equal(r, expected)


@pytest.mark.slow
def test_garbage_collection_between_batches_changes_nothing(monkeypatch):
    X, y = _data("regressor", n=120)
    params = dict(
        optimizer="nesterov", learning_rate_init=0.01, batch_size=16, max_iter=4, random_state=0
    )
    plain = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(8,)), **params).fit(X, y)
    original = TrainingEngine.train_batch

    def train_batch(self, X_batch, y_batch, w_batch, lr):
        # the batch arrays are views: collect everything collectable, then
        # overwrite freed memory with a fresh allocation before the runtime reads
        gc.collect()
        np.full(X_batch.size * 4, 7.0)
        return original(self, X_batch, y_batch, w_batch, lr)

    monkeypatch.setattr(TrainingEngine, "train_batch", train_batch)
    collected = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(8,)), **params).fit(X, y)
    np.testing.assert_array_equal(collected.predict(X), plain.predict(X))
    assert collected.loss_curve_ == plain.loss_curve_


def _fit_case(kind, X, y):
    """Fit and predict on arbitrary input in a child process; say what happened."""
    warnings.simplefilter("ignore")
    cls = OrtGradientRegressor if kind == "regressor" else OrtGradientClassifier
    est = cls(max_iter=2, random_state=0)
    try:
        est.fit(X, y)
    except (ValueError, TypeError) as exc:
        return ("refused", type(exc).__name__)
    pred = est.predict(X)
    finite = kind == "classifier" or bool(np.all(np.isfinite(pred)))
    return ("trained", finite)


SPECIAL = st.sampled_from([0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e38, -1e38, 1e-45, 3e30])


@st.composite
def _cases(draw):
    n = draw(st.integers(0, 12))
    d = draw(st.integers(0, 4))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.int64, np.bool_, object]))
    values = draw(st.lists(st.one_of(SPECIAL, st.floats(-10, 10)), min_size=n * d, max_size=n * d))
    X = np.array(values, dtype=np.float64).reshape(n, d)
    with np.errstate(invalid="ignore", over="ignore"):
        X = X.astype(dtype) if dtype is not np.int64 else np.nan_to_num(X).astype(np.int64)
    if draw(st.booleans()):
        X = X.ravel() if draw(st.booleans()) else X[..., None]
    n_y = n + draw(st.sampled_from([0, 0, 0, 1, -1]))
    kind = draw(st.sampled_from(["regressor", "classifier"]))
    y_values = draw(
        st.lists(
            st.one_of(SPECIAL, st.integers(0, 2).map(float)),
            min_size=max(n_y, 0),
            max_size=max(n_y, 0),
        )
    )
    y = np.array(y_values, dtype=np.float64)
    if kind == "classifier" and draw(st.booleans()):
        with np.errstate(invalid="ignore", over="ignore"):
            y = np.nan_to_num(y).astype(np.int64).astype(str)
    return kind, X, y


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_cases())
def test_fuzzed_inputs_never_abort_the_process(case):
    kind, X, y = case
    exitcode, status, payload = run_isolated(_fit_case, kind, X, y)
    assert exitcode == 0, f"the process died (exit code {exitcode}) on {kind} X={X!r} y={y!r}"
    assert status == "ok", payload
    outcome, detail = payload
    assert outcome in ("refused", "trained")
    if outcome == "trained":
        assert detail, f"non-finite predictions on X={X!r}"


def test_partial_fit_divergence_on_the_last_update_is_caught():
    X, y = _data("regressor", n=60)
    est = OrtGradientRegressor(learning_rate_init=1e38, batch_size=60)
    with pytest.raises(ConvergenceError, match="the last update of epoch 1"):
        est.partial_fit(X, y)
    assert np.all(np.isfinite(est.predict(X)))
    est.set_params(on_divergence="warn")
    with pytest.warns(ConvergenceWarning, match="diverged"):
        est.partial_fit(X, y)
    assert np.all(np.isfinite(est.predict(X)))


def test_a_fit_stopped_while_storing_its_weights_leaves_a_usable_estimator(monkeypatch):
    X, y = _data("regressor", n=100)
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(6,)), max_iter=2, warm_start=True, random_state=0
    ).fit(X, y)
    from onnxgrad_sklearn import _model

    def broken(est, now=False, defer=False):
        raise RuntimeError("export failed")

    with monkeypatch.context() as patch:
        patch.setattr(_model, "export", broken)
        with pytest.raises(RuntimeError, match="export failed"):
            est.fit(X, y)
    # the sessions dropped before the new model was made are made again on demand
    predicted = est.predict(X)
    assert np.all(np.isfinite(predicted))

    exported = onnx_predict(est.to_onnx(), X).ravel()
    np.testing.assert_allclose(exported, predicted, rtol=1e-5, atol=1e-6)


class _RaisesAt(QuietCallback):
    """Raises in the middle of a fit: at the end of epoch ``at``."""

    def __init__(self, at):
        self.at = at

    def on_fit_task_end(self, estimator, context):
        if context.task_name == "epoch" and estimator.n_iter_ == self.at:
            raise RuntimeError("the callback failed")
        return False


def _raising_mlp(**params):
    params = {"max_iter": 5, "random_state": 0, **params}
    return OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(6,)), **params)


def test_a_callback_raising_mid_fit_leaves_an_unfitted_estimator_unfitted():
    X, y = _data("regressor", n=100)
    est = _raising_mlp()
    est.set_callbacks(_RaisesAt(3))
    with pytest.raises(RuntimeError, match="the callback failed") as raised:
        est.fit(X, y)
    with pytest.raises(NotFittedError):
        est.predict(X)
    assert not hasattr(est, "n_iter_") and not hasattr(est, "estimator_")
    if hasattr(raised.value, "add_note"):
        assert "the fit did not complete, so it is unfitted" in str(raised.value.__notes__)
    est.set_callbacks()  # the same estimator fits afterwards as a new one does
    with pytest.warns(ConvergenceWarning):
        est.fit(X, y)
    with pytest.warns(ConvergenceWarning):
        fresh = _raising_mlp().fit(X, y)
    np.testing.assert_array_equal(est.predict(X), fresh.predict(X))


def test_a_callback_raising_in_a_continued_fit_keeps_the_previous_model():
    X, y = _data("regressor", n=100)
    with pytest.warns(ConvergenceWarning):
        est = _raising_mlp(warm_start=True).fit(X, y)
    predicted, curve, n_iter = est.predict(X), list(est.loss_curve_), est.n_iter_
    exported = onnx_predict(est.to_onnx(), X).ravel()
    est.set_callbacks(_RaisesAt(2))
    with pytest.raises(RuntimeError, match="the callback failed") as raised:
        est.fit(X, y)
    if hasattr(raised.value, "add_note"):
        assert "keeps the model of its previous fit" in str(raised.value.__notes__)
    np.testing.assert_array_equal(est.predict(X), predicted)  # not 2 epochs further
    np.testing.assert_array_equal(onnx_predict(est.to_onnx(), X).ravel(), exported)
    assert est.loss_curve_ == curve and est.n_iter_ == n_iter
    est.set_callbacks()
    with pytest.warns(ConvergenceWarning):
        est.fit(X, y)  # goes on from the previous model
    assert len(est.loss_curve_) == len(curve) + 5


def test_a_callback_raising_in_a_new_fit_of_a_fitted_estimator_leaves_it_unfitted():
    """A new fit (warm_start=False) replaces the model: keeping the previous one in
    case of failure would hold a second copy of the weights during the fit."""
    X, y = _data("regressor", n=100)
    with pytest.warns(ConvergenceWarning):
        est = _raising_mlp().fit(X, y)
    est.set_callbacks(_RaisesAt(2))
    with pytest.raises(RuntimeError, match="the callback failed"):
        est.fit(X, y)
    with pytest.raises(NotFittedError):
        est.predict(X)
    assert est.get_params()["max_iter"] == 5 and est.__dict__["_skl_callbacks"]


def test_ctrl_c_from_a_callback_still_keeps_the_completed_epochs():
    """Not a failure of the fit: Ctrl-C keeps the last completed batch's weights."""
    X, y = _data("regressor", n=100)
    est = _raising_mlp()

    class Interrupts(QuietCallback):
        def on_fit_task_end(self, estimator, context):
            if context.task_name == "epoch" and estimator.n_iter_ == 2:
                raise KeyboardInterrupt
            return False

    est.set_callbacks(Interrupts())
    with pytest.raises(KeyboardInterrupt):
        est.fit(X, y)
    assert est.n_iter_ == 2 and len(est.loss_curve_) == 2  # fitted, two epochs
    assert np.all(np.isfinite(est.predict(X)))
