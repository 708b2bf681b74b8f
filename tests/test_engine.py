"""The training engine's two update paths: one flat vector (element-wise rules on
CPU) and one output per weight (any other rule), with undo and checkpoints."""

import numpy as np
import onnxruntime
import pytest
from sklearn.neural_network import MLPRegressor

from onnxgrad_sklearn import OrtGradientRegressor
from onnxgrad_sklearn.backends import agent_available
from onnxgrad_sklearn.optim import SGD, Adam, BaseOptimizer, Nesterov

# the agent's engine: its flat and per-tensor update paths, its gradient graph
pytestmark = pytest.mark.skipif(
    not agent_available(), reason="onnxruntime-training (the TrainingAgent) not installed"
)


class PerTensorNesterov(Nesterov):
    elementwise = False


class PerTensorAdam(Adam):
    elementwise = False


class SignSGD(BaseOptimizer):
    def update(self, g, param, grad, state, learning_rate):
        return g.sub(param, g.mul(learning_rate, g.op("Sign", grad))), {}


@pytest.fixture(scope="module")
def data():
    rng = np.random.RandomState(0)
    X = rng.randn(300, 6).astype(np.float32)
    y = (np.sin(X[:, 0]) + X[:, 1] * X[:, 2]).astype(np.float32)
    return X, y


def _fit(optimizer, X, y, **kw):
    params = dict(batch_size=32, max_iter=3, random_state=0, learning_rate_init=0.01, alpha=1e-3)
    params.update(kw)
    return OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=(16, 8)), optimizer=optimizer, **params
    ).fit(X, y)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize(
    "flat, per_tensor", [(Nesterov(0.9), PerTensorNesterov(0.9)), (Adam(), PerTensorAdam())]
)
def test_flat_and_per_tensor_updates_give_the_same_training(data, flat, per_tensor):
    X, y = data
    a, b = _fit(flat, X, y), _fit(per_tensor, X, y)
    assert a._engine._backend._flat is not None and b._engine._backend._flat is None
    np.testing.assert_allclose(a.loss_curve_, b.loss_curve_, rtol=1e-6)
    for wa, wb in zip(a._engine.get_weights(), b._engine.get_weights()):
        np.testing.assert_allclose(wa, wb, rtol=1e-5, atol=1e-7)
    for sa, sb in zip(a._engine.get_state()["state"], b._engine.get_state()["state"]):
        for va, vb in zip(sa, sb):
            np.testing.assert_allclose(va, vb, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=1e-5, atol=1e-6)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("optimizer", [Nesterov(0.9), PerTensorAdam(), SignSGD()])
def test_undo_last_step_and_restore(data, optimizer):
    X, y = data
    engine = _fit(optimizer, X, y, max_iter=1)._engine
    y2d = y.reshape(-1, 1)
    sw = np.ones(len(X), np.float32)
    batches = [(X[i : i + 32], y2d[i : i + 32], sw[i : i + 32]) for i in range(0, 96, 32)]
    engine.train_batch(*batches[0], 0.01)
    before = engine.get_weights(), engine.get_state()
    engine.train_batch(*batches[1], 0.01)
    after = engine.get_weights()
    assert any(not np.array_equal(w0, w1) for w0, w1 in zip(before[0], after))
    engine.undo_last_step()
    assert engine.step == before[1]["step"]
    for w0, w1 in zip(before[0], engine.get_weights()):
        np.testing.assert_array_equal(w0, w1)
    for s0, s1 in zip(before[1]["state"], engine.get_state()["state"]):
        for v0, v1 in zip(s0, s1):
            np.testing.assert_array_equal(v0, v1)
    engine.undo_last_step()  # a second undo changes nothing
    for w0, w1 in zip(before[0], engine.get_weights()):
        np.testing.assert_array_equal(w0, w1)
    # the same batch again gives the same update
    engine.train_batch(*batches[1], 0.01)
    for w0, w1 in zip(after, engine.get_weights()):
        np.testing.assert_array_equal(w0, w1)

    # a checkpoint is not changed by later updates, and restore goes back to it
    saved = engine.checkpoint()
    weights, state = engine.get_weights(), engine.get_state()
    for batch in batches * 2:
        engine.train_batch(*batch, 0.01)
    engine.restore(saved)
    assert engine.step == state["step"]
    for w0, w1 in zip(weights, engine.get_weights()):
        np.testing.assert_array_equal(w0, w1)
    for s0, s1 in zip(state["state"], engine.get_state()["state"]):
        for v0, v1 in zip(s0, s1):
            np.testing.assert_array_equal(v0, v1)
    np.testing.assert_allclose(
        engine.predict(X[:5]).ravel(),
        _predict_numpy(weights, X[:5]),
        rtol=1e-5,
        atol=1e-6,
    )


def _predict_numpy(weights, X):
    # MLP (16, 8) with relu: coefficients then intercepts, in the engine's order
    coefs, intercepts = weights[:3], weights[3:]
    h = X
    for k, (w, b) in enumerate(zip(coefs, intercepts)):
        h = h @ w + b.reshape(1, -1)
        if k < 2:
            h = np.maximum(h, 0)
    return h.ravel()


@pytest.mark.parametrize(
    "optimizer, state_names",
    [(SGD(), ()), (Nesterov(0.9), ("velocity",)), (Adam(), ("m", "v"))],
)
def test_flat_update_graph_matches_per_tensor_graph(optimizer, state_names):
    rng = np.random.RandomState(3)
    shapes = [(4, 3), (3,), (1, 2)]
    params = [rng.randn(*s).astype(np.float32) for s in shapes]
    grads = [rng.randn(*s).astype(np.float32) for s in shapes]
    states = [[rng.rand(*s).astype(np.float32) for _ in state_names] for s in shapes]
    lr = np.array(0.05, np.float32)

    def run(model, feeds):
        sess = onnxruntime.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        return sess.run(None, feeds)

    feeds = {"learning_rate": lr}
    for i, (p, g, st) in enumerate(zip(params, grads, states)):
        feeds[f"param_{i}"], feeds[f"grad_{i}"] = p, g
        feeds.update({f"{n}_{i}": v for n, v in zip(state_names, st)})
    per_tensor = run(optimizer.build_update_model(shapes), feeds)
    flat_feeds = {"learning_rate": lr, "param": np.concatenate([p.ravel() for p in params])}
    flat_feeds.update({f"grad_{i}": g for i, g in enumerate(grads)})
    for k, n in enumerate(state_names):
        flat_feeds[n] = np.concatenate([st[k].ravel() for st in states])
    flat = run(optimizer.build_update_model(shapes, flat=True), flat_feeds)
    k = 1 + len(state_names)
    for j in range(k):  # new_param, then each new state
        expected = np.concatenate([per_tensor[i * k + j].ravel() for i in range(len(shapes))])
        # equal up to the last bit of float32 (vectorised kernels round tails apart)
        np.testing.assert_allclose(flat[j], expected, rtol=1e-6, atol=1e-7)
    # and the per-tensor graph is the formula: plain SGD moves against the gradient
    if not state_names:
        np.testing.assert_allclose(per_tensor[0], params[0] - lr * grads[0], rtol=1e-6)


def test_flat_update_refuses_rules_that_are_not_elementwise():
    with pytest.raises(ValueError, match="not element-wise"):
        SignSGD().build_update_model([(2, 2)], flat=True)
    assert SignSGD().elementwise is False and Adam().elementwise is True


class HalfWeightMomentum(Nesterov):
    """An element-wise rule whose state starts from the weights (per weight, flat path)."""

    def init_state(self, param):
        return {
            "velocity": 0.5 * param
            + 1e-6 * np.arange(param.size, dtype=np.float32).reshape(param.shape)
        }


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("optimizer", [HalfWeightMomentum(0.9), Adam()])
def test_reset_optimizer_gives_init_state_of_each_weight(data, optimizer):
    X, y = data
    engine = _fit(optimizer, X, y)._engine
    assert engine._backend._flat is not None
    weights = engine.get_weights()
    engine.reset_optimizer()
    assert engine.step == 0
    for w, state in zip(weights, engine.get_state()["state"]):
        expected = optimizer.init_state(w)
        for name, value in zip(optimizer.state_names, state):
            np.testing.assert_array_equal(value, expected[name])
    np.testing.assert_array_equal(
        np.concatenate([w.ravel() for w in weights]),
        np.concatenate([w.ravel() for w in engine.get_weights()]),
    )
