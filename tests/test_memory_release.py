"""Issue 42: what a large model's fit frees stays freed (the agent's chunked update,
the previous fit's weights while training, the TrainingAgent at the end of a fit)."""

import warnings
import weakref

import numpy as np
import pytest
from _helpers import no_artifacts
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


def _same_fits(a, b):
    final_a, final_b = a.estimator_, b.estimator_
    for x, y in zip(final_a.coefs_ + final_a.intercepts_, final_b.coefs_ + final_b.intercepts_):
        np.testing.assert_array_equal(x, y)
    assert a.loss_curve_ == b.loss_curve_


def _per_weight(name):
    """The optimizer ``name`` as a rule that is not element-wise: the agent runs it in a
    session of its own after the backward run, weight by weight."""
    from onnxgrad_sklearn.optim import get_optimizer

    rule = get_optimizer(name)
    per_weight = type(f"PerWeight{type(rule).__name__}", (type(rule),), {"elementwise": False})
    return per_weight(**rule.get_params())


@pytest.mark.parametrize("optimizer", ["nesterov", "adam", "sgd"])
def test_update_in_the_backward_run_is_the_update_session(monkeypatch, optimizer):
    """The update appended to the TrainingAgent's gradient graph (one run for the
    backward pass and the update) gives the very weights and losses of the update
    graph run in a session of its own after the backward run."""
    no_artifacts(monkeypatch, kept=False)  # each fit builds its graphs
    fused = _fit(optimizer)
    assert fused._engine._backend._fused is not None
    assert fused._engine._backend._update is None  # no update session made
    separate = _fit(_per_weight(optimizer))
    assert separate._engine._backend._fused is None
    assert separate._engine._backend._update is not None
    _same_fits(fused, separate)


def test_backward_run_checks_what_it_writes_into():
    """A list of buffers to write into of another length than the outputs is refused
    (the runtime would read past it)."""
    est = _fit("nesterov")
    backend = est._engine._backend
    X, y = _data()
    loss, state = backend._forward(X[:8], y[:8, None].astype(np.float32), np.ones(8, np.float32))
    with pytest.raises(ValueError, match="run_backward writes"):
        backend.forward_backward.backward([backend._one], state, backend._fused.gradients)


@pytest.mark.parametrize("optimizer", ["nesterov", "adam", "sgd"])
def test_chunked_update_is_the_flat_update(monkeypatch, optimizer):
    """The update by pieces in the backward run (a large model's) gives the very
    weights and losses of one flat update."""
    no_artifacts(monkeypatch, kept=False)  # the second fit builds its graphs again
    flat = _fit(optimizer)
    assert flat._engine._backend.plan.meta["pieces"] is None
    monkeypatch.setattr(agent, "CHUNKED_UPDATE_FROM", 0)
    monkeypatch.setattr(agent, "UPDATE_CHUNK", 100)  # pieces across and inside weights
    chunked = _fit(optimizer)
    spans = chunked._engine._backend.plan.meta["pieces"]
    assert any(start > 0 for _, start, _ in spans)  # a weight cut into pieces
    assert any(start == 0 and n < 100 for _, start, n in spans)  # a weight in one piece
    _same_fits(flat, chunked)


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
