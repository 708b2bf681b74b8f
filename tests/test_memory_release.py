"""Issue 42: what a large model's fit frees stays freed (the agent's chunked update,
the previous fit's weights while training, the TrainingAgent at the end of a fit)."""

import warnings
import weakref

import numpy as np
import pytest
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn import OrtGradientRegressor, runtime
from onnxgrad_sklearn._fit import Fit

pytest.importorskip("onnxruntime.capi._pybind_state")
agent = pytest.importorskip("onnxgrad_sklearn.backends.agent")


def _data():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 12)).astype(np.float32)
    return X, X[:, :3].sum(1)


def _fit(optimizer, **kwargs):
    X, y = _data()
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(40, 20)), backend="agent", optimizer=optimizer,
        batch_size=64, max_iter=2, random_state=0, **kwargs,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(X, y)


@pytest.mark.parametrize("optimizer", ["nesterov", "adam", "sgd"])
def test_chunked_update_is_the_flat_update(monkeypatch, optimizer):
    """The update by pieces gives the very weights and losses of one flat call."""
    flat = _fit(optimizer)
    calls = []
    run = agent._ChunkedUpdate.run
    monkeypatch.setattr(agent, "CHUNKED_UPDATE_FROM", 0)
    monkeypatch.setattr(agent, "UPDATE_CHUNK", 100)  # pieces across and inside weights
    monkeypatch.setattr(agent._ChunkedUpdate, "run", lambda *a: calls.append(1) or run(*a))
    chunked = _fit(optimizer)
    assert calls
    final_a, final_b = flat.estimator_, chunked.estimator_
    for a, b in zip(final_a.coefs_ + final_a.intercepts_, final_b.coefs_ + final_b.intercepts_):
        np.testing.assert_array_equal(a, b)
    assert flat.loss_curve_ == chunked.loss_curve_


def _large_fit_case(backend):
    """In a child process (every model made large there): whether the previous fit's
    stored weights are gone when the warm fit trains, and the agent's TrainingAgent after."""
    runtime.LARGE_MODEL = 1  # every model is large (this process only)
    X, y = _data()
    est = OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(40, 20)), backend=backend, batch_size=64,
        max_iter=1, warm_start=True, random_state=0,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, y)
        stored = [weakref.ref(v) for v in est._converted.values if v is not None]
        seen = []
        run_epochs = Fit.run_epochs

        def checked(fit):
            seen.append([r() is None for r in stored])
            return run_epochs(fit)

        Fit.run_epochs = checked
        est.fit(X, y)
    freed = backend != "agent" or est._engine._backend.forward_backward._agent is None
    return seen, freed


@pytest.mark.parametrize("backend", ["agent", "standard"])
def test_large_model_fit_holds_no_previous_weights(backend):
    """While a large model trains, the previous fit's stored weights are gone (no
    _best_coefs view keeps them), and after the fit the agent's TrainingAgent is freed.
    Run in a child process: a fit of a large model sets process-wide state (glibc's mmap
    threshold, the sessions' pool) that later tests would see."""
    from _isolated import run_isolated

    code, status, payload = run_isolated(_large_fit_case, backend)
    assert code == 0 and status == "ok", payload
    seen, freed = payload
    assert seen and all(seen[0]), seen
    assert freed
