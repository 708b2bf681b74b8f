"""The lower layer: OrtGradientForwardBackward and TrainingAgent on a plain ONNX model."""

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxgrad_sklearn.backends import agent_available
from onnxgrad_sklearn.runtime import to_ortvalue

pytestmark = pytest.mark.skipif(
    not agent_available(), reason="onnxruntime-training (the TrainingAgent) not installed"
)
if agent_available():
    from onnxgrad_sklearn.backends.agent import OrtGradientForwardBackward


def _model(W, b, batch=None):
    """Y = tanh(X @ W + b); ``batch`` names the batch dimension (None: unnamed)."""
    X = helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, W.shape[0]])
    Y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, W.shape[1]])
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["z"]),
        helper.make_node("Tanh", ["z"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [X],
        [Y],
        [numpy_helper.from_array(W, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def _numpy_forward(X, W, b):
    return np.tanh(X @ W + b)


def test_forward_backward_match_numpy_and_finite_differences():
    rng = np.random.RandomState(0)
    W = rng.randn(3, 2).astype(np.float32)
    b = rng.randn(2).astype(np.float32)
    X = rng.randn(5, 3).astype(np.float32)
    G = rng.randn(5, 2).astype(np.float32)  # gradient of the objective w.r.t. Y
    fb = OrtGradientForwardBackward(_model(W, b), ["W", "b"], input_names_require_grad=["X"])
    assert fb.input_names == ["X"] and fb.output_names == ["Y"]
    weights = [to_ortvalue(W), to_ortvalue(b)]
    outputs, state = fb.forward([to_ortvalue(X)], weights)
    np.testing.assert_allclose(outputs[0].numpy(), _numpy_forward(X, W, b), rtol=1e-5)
    grad_X, grad_W, grad_b = (g.numpy() for g in fb.backward([to_ortvalue(G)], state))

    def objective(X, W, b):
        return float(np.sum(G.astype(np.float64) * _numpy_forward(X, W, b)))

    X64, W64, b64 = X.astype(np.float64), W.astype(np.float64), b.astype(np.float64)
    for value, grad in ((X64, grad_X), (W64, grad_W), (b64, grad_b)):
        numeric = np.zeros_like(value)
        for idx in np.ndindex(value.shape):
            old = value[idx]
            value[idx] = old + 1e-6
            up = objective(X64, W64, b64)
            value[idx] = old - 1e-6
            down = objective(X64, W64, b64)
            value[idx] = old
            numeric[idx] = (up - down) / 2e-6
        np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-5)

    inference = fb.forward_inference([to_ortvalue(X)], weights)[0].numpy()
    sess = onnxruntime.InferenceSession(
        _model(W, b).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    np.testing.assert_allclose(inference, sess.run(None, {"X": X})[0], rtol=1e-6)


@pytest.mark.parametrize("bias_shape", [(4,), (1, 4)])
def test_batch_sums_become_matmuls_with_the_same_gradients(bias_shape):
    # With a named batch dimension the bias gradient is a sum over the batch axis,
    # which rewrite_batch_sums turns into MatMul(ones, dY); without a name the
    # builder keeps its run-time broadcasting nodes. Both give the same numbers,
    # for every batch size the one session sees.
    rng = np.random.RandomState(2)
    W = rng.randn(3, 4).astype(np.float32)
    b = rng.randn(*bias_shape).astype(np.float32)
    named = OrtGradientForwardBackward(_model(W, b, batch="batch"), ["W", "b"])
    plain = OrtGradientForwardBackward(_model(W, b), ["W", "b"])
    ops = [n.op_type for n in named.gradient_model.graph.node]
    assert "ReduceSum" not in ops and "BroadcastGradientArgs" not in ops
    assert ops.count("MatMul") == 2  # forward, and the bias gradient
    assert "ReduceSum" in [n.op_type for n in plain.gradient_model.graph.node]
    weights = [to_ortvalue(W), to_ortvalue(b)]
    for n in (1, 7, 64):
        X = rng.randn(n, 3).astype(np.float32)
        G = rng.randn(n, 4).astype(np.float32)
        dz = G * (1 - np.tanh(X @ W + b) ** 2)
        for fb in (named, plain):
            _, state = fb.forward([to_ortvalue(X)], weights)
            grad_W, grad_b = (g.numpy() for g in fb.backward([to_ortvalue(G)], state))
            np.testing.assert_allclose(grad_W, X.T @ dz, rtol=1e-4, atol=1e-5)
            assert grad_b.shape == bias_shape
            np.testing.assert_allclose(
                grad_b, dz.sum(axis=0).reshape(bias_shape), rtol=1e-4, atol=1e-5
            )


def test_interleaved_states_and_one_backward_per_state():
    rng = np.random.RandomState(1)
    W = rng.randn(3, 2).astype(np.float32)
    b = np.zeros(2, np.float32)
    fb = OrtGradientForwardBackward(_model(W, b), ["W"])
    weights = [to_ortvalue(W)]
    X1, X2 = rng.randn(4, 3).astype(np.float32), rng.randn(4, 3).astype(np.float32)
    ones = to_ortvalue(np.ones((4, 2), np.float32))
    _, s1 = fb.forward([to_ortvalue(X1)], weights)
    _, s2 = fb.forward([to_ortvalue(X2)], weights)
    g2 = fb.backward([ones], s2)[0].numpy()
    g1 = fb.backward([ones], s1)[0].numpy()
    for X, g in ((X1, g1), (X2, g2)):
        expected = X.T @ (1 - np.tanh(X @ W) ** 2)
        np.testing.assert_allclose(g, expected, rtol=1e-4, atol=1e-6)


def test_wrong_counts_and_weights_raise_instead_of_aborting():
    W = np.ones((3, 2), np.float32)
    b = np.zeros(2, np.float32)
    with pytest.raises(ValueError, match="'V' is not an initializer"):
        OrtGradientForwardBackward(_model(W, b), ["V"])
    with pytest.raises(ValueError, match="duplicates"):
        OrtGradientForwardBackward(_model(W, b), ["W", "W"])
    fb = OrtGradientForwardBackward(_model(W, b), ["W", "b"])
    X = to_ortvalue(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="forward expects 1 inputs and 2 weights"):
        fb.forward([X], [to_ortvalue(W)])
    _, state = fb.forward([X], [to_ortvalue(W), to_ortvalue(b)])
    with pytest.raises(ValueError, match="backward expects 1 output gradients"):
        fb.backward([], state)
