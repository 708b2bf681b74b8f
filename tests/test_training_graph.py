"""The training graph gives onnxruntime's gradient builder every shape of the loss
part, so that the broadcasting of its gradients is resolved when the graph is built."""

from collections import Counter

import numpy as np
import onnx
import pytest
from _helpers import BACKENDS, no_artifacts
from onnx import TensorProto, helper, numpy_helper
from sklearn.linear_model import LinearRegression, LogisticRegression
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor
from onnxgrad_sklearn import engine as engine_module
from onnxgrad_sklearn._names import Y_TRUE
from onnxgrad_sklearn.backends import agent_available
from onnxgrad_sklearn.losses import LogLoss
from onnxgrad_sklearn.ortgrad import static_shapes

RNG = np.random.RandomState(0)
X = RNG.randn(120, 5).astype(np.float32)
Y1 = (X[:, 0] - 2 * X[:, 1]).astype(np.float32)
Y2 = np.c_[Y1, X[:, 2] * X[:, 3]].astype(np.float32)
C3 = np.digitize(X[:, 0], [-0.5, 0.5])
C2 = (X[:, 1] > 0).astype(int)

CASES = {
    "mlp_regressor": (lambda: OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(7,))), Y1),
    "mlp_regressor_2_outputs": (
        lambda: OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(7,))),
        Y2,
    ),
    "linear_regression": (lambda: OrtGradientRegressor(LinearRegression()), Y1),
    "mlp_classifier_3": (
        lambda: OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=(7,))),
        C3,
    ),
    "mlp_classifier_2": (
        lambda: OrtGradientClassifier(MLPClassifier(hidden_layer_sizes=(7,))),
        C2,
    ),
    "logistic_regression_3": (lambda: OrtGradientClassifier(LogisticRegression()), C3),
    "logistic_regression_2": (lambda: OrtGradientClassifier(LogisticRegression()), C2),
}


def _fit(name):
    factory, y = CASES[name]
    return factory().set_params(max_iter=1, random_state=0, alpha=1e-3, backend="agent").fit(X, y)


def _targets(est, y):
    if y.dtype.kind == "f":
        return y.reshape(len(y), -1)
    return np.eye(max(2, len(est.classes_)), dtype=np.float32)[y]


def _nodes(est):
    # the gradient graph's own nodes, without the update appended to it (fuse_update)
    nodes = est._engine._backend.forward_backward.gradient_model.graph.node
    return [n for n in nodes if not n.name.startswith("update/")]


def _graph(est):
    model = est._engine._backend.forward_backward.gradient_model
    y_true = next(i for i in model.graph.input if i.name == Y_TRUE)
    dims = [d.dim_value or d.dim_param for d in y_true.type.tensor_type.shape.dim]
    return Counter(n.op_type for n in _nodes(est)), dims


def assert_same_loss_and_gradients(est, other, y2d):
    """``other``'s engine, at ``est``'s weights, gives ``est``'s loss and gradients."""
    other._engine.set_weights(est._engine.get_weights())
    sw = np.linspace(0.5, 2.0, len(X)).astype(np.float32)
    loss, grads = est._engine.loss_and_gradients(X, y2d, sw)
    other_loss, other_grads = other._engine.loss_and_gradients(X, y2d, sw)
    assert loss == pytest.approx(other_loss, rel=1e-6)
    for g, k in zip(grads, other_grads, strict=True):
        np.testing.assert_allclose(g, k, rtol=1e-5, atol=1e-7)


@pytest.mark.skipif(
    not agent_available(), reason="onnxruntime-training (the TrainingAgent) not installed"
)
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("name", list(CASES))
def test_loss_part_is_built_with_known_shapes(name, monkeypatch):
    est = _fit(name)
    y2d = _targets(est, CASES[name][1])
    ops, dims = _graph(est)
    assert dims == [engine_module.BATCH, y2d.shape[1]]
    # the only Reshape nodes: a one-value weight given the rank of what it is added
    # to (its intercept: _match_constant_ranks), and its gradient's
    reshapes = [n for n in _nodes(est) if n.op_type == "Reshape"]
    assert all("_rank2" in n.name for n in reshapes), reshapes
    assert ops["BroadcastGradientArgs"] == 0 and ops["Reshape"] == len(reshapes), ops

    # The graph with the Reshape nodes kept gives the same loss and gradients.
    no_artifacts(monkeypatch, kept=False)  # built again, not found
    monkeypatch.setattr(
        engine_module, "_drop_noop_reshapes", lambda model: ({}, static_shapes(model))
    )
    kept = _fit(name)
    kept_ops, _ = _graph(kept)
    assert kept_ops["Reshape"] > 0
    assert kept_ops.total() > ops.total()
    assert_same_loss_and_gradients(est, kept, y2d)


@pytest.mark.parametrize(
    "source, target, allowzero, removed",
    [
        (["batch", 3], [-1, 3], 0, True),
        (["batch", 3], [0, 3], 0, True),
        (["batch"], [-1], 0, True),
        ([4, 3], [4, 3], 0, True),
        (["batch", 4], [-1, 2], 0, False),  # changes the width
        (["batch", 3], [-1, 3, 1], 0, False),  # changes the rank
        ([None, 3], [-1, 3], 0, False),  # batch dimension unknown
        (["batch", None], [-1, 3], 0, False),
        (["batch", 3], [0, 3], 1, False),  # 0 is a zero-size dimension here
    ],
)
def test_drop_noop_reshapes(source, target, allowzero, removed):
    shape = numpy_helper.from_array(np.array(target, dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], allowzero=allowzero),
        helper.make_node("Neg", ["r"], ["y"]),
    ]
    out_shape = [None] * len(target)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, source)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    renamed, _ = engine_module._drop_noop_reshapes(model)
    ops = [n.op_type for n in model.graph.node]
    if removed:
        assert renamed == {"r": "x"}
        assert ops == ["Neg"] and list(model.graph.node[0].input) == ["x"]
        assert not model.graph.initializer  # the unused shape constant goes too
        onnx.checker.check_model(model)
    else:
        assert renamed == {} and ops == ["Reshape", "Neg"]
        assert len(model.graph.initializer) == 1


def test_drop_noop_reshapes_keeps_a_graph_output():
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
        [numpy_helper.from_array(np.array([-1, 3], dtype=np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    assert engine_module._drop_noop_reshapes(model)[0] == {}
    assert [n.op_type for n in model.graph.node] == ["Reshape"]


# one-value constants take the rank of what they multiply (onnxruntime's slow path) ---
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["linear_regression", "mlp_regressor", "logistic_regression_2"])
def test_one_value_constants_take_the_rank_of_the_other_input(name, backend, monkeypatch):
    """Scalars against ``(n, 1)`` tensors become ``(1, 1)`` (a model's own one-value
    weight, its intercept, through a Reshape: its shape is kept): the loss and the
    gradients of the graph without the change, and no such scalar left."""
    factory, y = CASES[name]
    params = dict(max_iter=1, random_state=0, alpha=1e-3, backend=backend)
    no_artifacts(monkeypatch, kept=False)
    est = factory().set_params(**params).fit(X, y)
    training = onnx.load_from_string(est._engine.plan.blobs["training.onnx"])
    shapes = static_shapes(training)
    values = {i.name: i for i in training.graph.initializer}
    for node in training.graph.node:
        if node.op_type in ("Add", "Sub", "Mul", "Div"):
            ranks = [len(values[i].dims) if i in values else len(shapes[i]) for i in node.input]
            for k, name_k in enumerate(node.input):
                if name_k in values and int(np.prod(values[name_k].dims)) == 1:
                    assert ranks[k] >= ranks[1 - k], (node, ranks)

    monkeypatch.setattr(engine_module, "_match_constant_ranks", lambda *a, **k: None)
    plain = factory().set_params(**params).fit(X, y)
    assert [w.shape for w in plain._engine.get_weights()] == [
        w.shape for w in est._engine.get_weights()
    ]
    assert_same_loss_and_gradients(est, plain, _targets(est, y))


def test_match_constant_ranks_on_a_small_graph():
    """A scalar constant is reshaped in place; a kept one-value initializer (a weight)
    is reshaped by a node; one against a rank-1 tensor stays as it is."""
    import onnxruntime

    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    bias = numpy_helper.from_array(np.array([0.5], dtype=np.float32), "bias")
    nodes = [
        helper.make_node("Mul", ["x", "two"], ["a"]),
        helper.make_node("Add", ["bias", "a"], ["b"]),
        helper.make_node("ReduceSum", ["b", "axes"], ["s"], keepdims=0),
        helper.make_node("Mul", ["s", "two"], ["y"]),
    ]
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        [two, bias, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    x = np.arange(6, dtype=np.float32).reshape(6, 1)
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    engine_module._match_constant_ranks(model, static_shapes(model), keep={"bias"})
    onnx.checker.check_model(model)
    inputs = {n.output[0]: list(n.input) for n in model.graph.node}
    assert inputs["a"] == ["x", "two_rank2"] and inputs["y"] == ["s", "two"]
    assert inputs["b"] == ["bias_rank2", "a"] and inputs["bias_rank2"][0] == "bias"
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    assert values["two_rank2"].shape == (1, 1) and values["bias"].shape == (1,)
    got = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, expected)


class _TwoColumnLogLoss(LogLoss):
    """The log-loss as a subclass receives it: the zero logit and the logit."""


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("template", [LogisticRegression(), MLPClassifier((7,))])
def test_binary_log_loss_from_one_logit_is_the_two_column_log_loss(template, backend):
    """LogLoss of a binary problem, computed as softplus(z) - t z from the one logit:
    the loss and gradients of -sum_k t_k log_softmax([0, z])_k (a subclass, given the
    two columns); the LogSoftmax is gone from the graph."""
    params = dict(max_iter=1, random_state=0, alpha=1e-3, backend=backend)
    est = OrtGradientClassifier(template, **params).fit(X, C2)
    two = OrtGradientClassifier(template, loss=_TwoColumnLogLoss(), **params).fit(X, C2)
    ops = Counter(
        n.op_type for n in onnx.load_from_string(est._engine.plan.blobs["training.onnx"]).graph.node
    )
    assert ops["LogSoftmax"] == 0 and ops["Concat"] == 0, ops
    assert_same_loss_and_gradients(est, two, _targets(est, C2))
