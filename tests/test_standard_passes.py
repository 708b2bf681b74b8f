"""The standard backend's graph passes: what they rewrite, and that the values stay the same.

onnx-ad's gradient graph sums the bias adjoints over the batch axis, sums every
``(batch, 1, 1)`` adjoint over axes of size 1, fills penalty adjoints with
``Expand`` and computes ``W * W``'s adjoint twice: the passes of
:mod:`onnxgrad_sklearn._passes` and :mod:`onnxgrad_sklearn.backends.standard_passes`
turn the batch sums into products with a row of
ones and remove the rest. The gradients of the rewritten graph are those of
onnx-ad's graph as it comes (within float32 rounding of a sum in another order).
"""

import warnings

import numpy as np
import onnx
import onnxruntime
import pytest
from _helpers import no_artifacts
from onnx import TensorProto, helper
from sklearn.neural_network import MLPClassifier, MLPRegressor

from onnxgrad_sklearn import OrtGradientClassifier, OrtGradientRegressor, _passes
from onnxgrad_sklearn.backends import build_plan, standard, standard_passes
from onnxgrad_sklearn.optim import SGD, Adam

pytestmark = pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")

BATCHES = (1, 7, 64)


@pytest.fixture(autouse=True)
def _no_step_graphs_kept(monkeypatch):
    # the tests build the same step graphs with and without the passes: none is kept
    no_artifacts(monkeypatch, kept=False)


@pytest.fixture
def unguarded(monkeypatch):
    """``step_graph`` without the ``If`` on the loss: its nodes all in the main graph."""

    def step_graph(*args, **kwargs):
        with monkeypatch.context() as patch:
            patch.setattr(standard, "guard_update", lambda model: None)
            return standard.step_graph(*args, **kwargs)

    return step_graph


def _backend(estimator, n_features=5, n=64, seed=0):
    """The standard backend of ``estimator`` fitted one epoch on random data."""
    rng = np.random.RandomState(seed)
    X = rng.randn(n, n_features).astype(np.float32)
    if isinstance(estimator, OrtGradientClassifier):
        y = (X[:, 0] + X[:, 1] > 0).astype(np.int64) + (X[:, 2] > 1)
    else:
        y = (X[:, 0] - 2 * X[:, 1] + 0.1 * rng.randn(n)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        estimator.fit(X, y)
    return estimator._engine._backend


def _regressor(activation="relu", hidden=(16, 8), optimizer="sgd"):
    return OrtGradientRegressor(
        MLPRegressor(hidden_layer_sizes=hidden, activation=activation),
        backend="standard",
        optimizer=optimizer,
        batch_size=16,
        max_iter=1,
        random_state=0,
    )


def _batch(backend, batch, seed=1):
    rng = np.random.RandomState(seed)
    n_features = backend.shapes[0][0]
    X = rng.randn(batch, n_features).astype(np.float32)
    y = rng.randn(batch, 1).astype(np.float32)
    sw = rng.uniform(0.5, 2.0, batch).astype(np.float32)
    return X, y, sw


def _reductions(model):
    """``(input shape, reduced axes)`` of each ``ReduceSum`` of ``model``."""
    shapes = _passes.static_shapes(model)
    constants = {i.name: i for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type == "ReduceSum":
            shape = shapes[node.input[0]]
            found.append((shape, standard_passes._reduced_axes(node, constants, len(shape))))
    return found


def _names_only(model):
    """The passes the comparisons are made against: none (the nodes only get names)."""
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"N{i}"


# --- the rewrites happen ------------------------------------------------------------


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("batch", [7, 64, 256])
def test_no_batch_sum_or_unit_sum_left_in_the_mlp_step_graph(batch, optimizer, unguarded):
    backend = _backend(_regressor(hidden=(16, 8, 1), optimizer=optimizer))
    model, _ = unguarded(
        backend.training_model,
        backend.weight_names,
        backend.shapes,
        backend.optimizer,
        batch,
        1,
    )
    reductions = _reductions(model)
    for shape, axes in reductions:
        assert axes is not None
        # over the batch axis of a matrix or more: a MatMul with a row of ones now
        assert not (len(shape) >= 2 and shape[0] == batch and 0 in axes), (shape, axes)
        # over axes of size 1 only: an Identity or a Squeeze, then nothing
        assert any(shape[a] != 1 for a in axes), (shape, axes)
    # the bias gradients (one per layer, the 1-unit layers included) are products now
    ones = {i.name for i in model.graph.initializer if i.name.startswith("LeadingSum/ones_")}
    products = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] in ones]
    assert len(products) >= len(backend.shapes) // 2
    assert "Expand" not in _passes.op_types(model.graph.node)


def test_the_passes_remove_nodes_from_the_step_graph(monkeypatch, unguarded):
    backend = _backend(_regressor())

    def graph():
        return unguarded(
            backend.training_model, backend.weight_names, backend.shapes, backend.optimizer, 32, 1
        )[0]

    rewritten = graph()
    monkeypatch.setattr(standard, "_simplify", _names_only)
    plain = graph()
    assert len(rewritten.graph.node) < 0.8 * len(plain.graph.node)
    counts = {}
    for node in plain.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    assert counts.get("ReduceSum", 0) > sum(n.op_type == "ReduceSum" for n in rewritten.graph.node)


# --- same gradients ----------------------------------------------------------------


def _gradients(estimator_factory, batch, monkeypatch, rewrite):
    with monkeypatch.context() as patch:
        if not rewrite:
            patch.setattr(standard, "_simplify", _names_only)
        backend = _backend(estimator_factory())
        return backend.loss_and_gradients(*_batch(backend, batch))


def _assert_close(got, ref, rel=1e-6):
    assert got.shape == ref.shape
    scale = max(np.abs(ref).max(), 1e-30)
    assert np.abs(got.astype(np.float64) - ref).max() <= rel * scale, (
        np.abs(got - ref).max() / scale
    )


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("activation", ["relu", "tanh", "logistic"])
def test_rewritten_gradients_equal_onnx_ad_ones(batch, activation, monkeypatch):
    def factory():
        return _regressor(activation=activation)

    loss, grads = _gradients(factory, batch, monkeypatch, rewrite=True)
    ref_loss, ref_grads = _gradients(factory, batch, monkeypatch, rewrite=False)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    assert len(grads) == len(ref_grads)
    for got, ref in zip(grads, ref_grads):
        _assert_close(got, ref)


@pytest.mark.parametrize("batch", BATCHES)
def test_rewritten_classifier_gradients_equal_onnx_ad_ones(batch, monkeypatch):
    def factory():
        return OrtGradientClassifier(
            MLPClassifier(hidden_layer_sizes=(12,)),
            backend="standard",
            batch_size=16,
            max_iter=1,
            random_state=0,
        )

    loss, grads = _gradients(factory, batch, monkeypatch, rewrite=True)
    ref_loss, ref_grads = _gradients(factory, batch, monkeypatch, rewrite=False)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for got, ref in zip(grads, ref_grads):
        _assert_close(got, ref)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("optimizer", [SGD(), Adam()], ids=["sgd", "adam"])
def test_rewritten_step_gives_the_same_update(batch, optimizer, monkeypatch):
    """The fused step (update merged in) of both graphs: the same new weights."""

    def step(rewrite):
        with monkeypatch.context() as patch:
            if not rewrite:
                patch.setattr(standard, "_simplify", _names_only)
            estimator = _regressor(hidden=(16, 1, 4))
            backend = _backend(estimator)
            names, start = backend.weight_names, backend.get_weights()
            shapes = [w.shape for w in start]
            training = estimator._engine.training
            plan = build_plan("standard", training, None, names, shapes, optimizer, "cpu")
            fresh = standard.StandardBackend(
                plan=plan,
                output_name=None,
                weight_names=backend.weight_names,
                start=backend.get_weights(),
                optimizer=optimizer,
                constants=backend.constants,  # the penalty's coefficients
            )
            loss = fresh.train_batch(*_batch(fresh, batch), 0.01)
            return loss, fresh.get_weights()

    loss, weights = step(True)
    ref_loss, ref_weights = step(False)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    for got, ref in zip(weights, ref_weights):
        _assert_close(got, ref)


# --- the passes one by one, on small graphs --------------------------------------


def _run(model, feeds):
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, feeds)


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _copy(model):
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _info(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _const(name, values):
    return onnx.numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("keepdims", [0, 1])
def test_unit_reductions_become_identities_or_squeezes(keepdims):
    out_shape = [6, 1, 4] if keepdims else [6, 4]
    model = _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=keepdims)],
        [_info("x", [6, 1, 4])],
        [_info("y", out_shape)],
        [_const("axes", [-2])],
    )
    x = np.random.RandomState(0).randn(6, 1, 4).astype(np.float32)
    expected = _run(model, {"x": x})[0]
    rewritten = _copy(model)
    assert standard_passes.rewrite_unit_reductions(rewritten) == 1
    assert _passes.op_types(rewritten.graph.node) == (["Identity"] if keepdims else ["Squeeze"])
    np.testing.assert_array_equal(_run(rewritten, {"x": x})[0], expected)


def test_sums_over_the_batch_and_unit_axes_become_products():
    model = _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
        [_info("x", [9, 1, 1])],
        [_info("y", [1, 1, 1])],
        [_const("axes", [0, 1])],
    )
    x = np.random.RandomState(0).randn(9, 1, 1).astype(np.float32)
    expected = _run(model, {"x": x})[0]
    rewritten = _copy(model)
    assert standard_passes.rewrite_leading_sums(rewritten) == 1
    assert "ReduceSum" not in _passes.op_types(rewritten.graph.node)
    np.testing.assert_allclose(_run(rewritten, {"x": x})[0], expected, rtol=1e-6)


def test_duplicate_nodes_are_merged_and_graph_outputs_kept():
    model = _model(
        [
            helper.make_node("Mul", ["x", "x"], ["a"]),
            helper.make_node("Mul", ["x", "x"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["c"]),
            helper.make_node("Mul", ["x", "x"], ["d"]),
        ],
        [_info("x", [3])],
        [_info("c", [3]), _info("d", [3])],
    )
    x = np.array([1.0, -2.0, 3.5], np.float32)
    expected = _run(model, {"x": x})
    rewritten = _copy(model)
    assert _passes.merge_duplicate_nodes(rewritten) == 2
    assert [n.op_type for n in rewritten.graph.node] == ["Mul", "Add", "Identity"]
    for got, ref in zip(_run(rewritten, {"x": x}), expected):
        np.testing.assert_array_equal(got, ref)


def test_random_nodes_are_not_merged():
    model = _model(
        [
            helper.make_node("RandomNormalLike", ["x"], ["a"]),
            helper.make_node("RandomNormalLike", ["x"], ["b"]),
            helper.make_node("Sub", ["a", "b"], ["c"]),
        ],
        [_info("x", [3])],
        [_info("c", [3])],
    )
    assert _passes.merge_duplicate_nodes(model) == 0


def test_expands_feeding_element_wise_operators_are_broadcast():
    model = _model(
        [
            helper.make_node("Expand", ["s", "shape"], ["e"]),
            helper.make_node("Mul", ["e", "w"], ["y"]),
            helper.make_node("Sub", ["v", "e"], ["z"]),  # v broadcasts: e is needed
        ],
        [_info("s", [1, 1]), _info("w", [4, 3]), _info("v", [1, 3])],
        [_info("y", [4, 3]), _info("z", [4, 3])],
        [_const("shape", [4, 3])],
    )
    rng = np.random.RandomState(0)
    feeds = {
        "s": rng.randn(1, 1).astype(np.float32),
        "w": rng.randn(4, 3).astype(np.float32),
        "v": rng.randn(1, 3).astype(np.float32),
    }
    expected = _run(model, feeds)
    rewritten = _copy(model)
    assert standard_passes.rewrite_broadcast_expands(rewritten) == 1
    assert list(rewritten.graph.node[1].input) == ["s", "w"]
    assert list(rewritten.graph.node[2].input) == ["v", "e"]
    for got, ref in zip(_run(rewritten, feeds), expected):
        np.testing.assert_array_equal(got, ref)


def test_reshape_chains_are_shortened():
    model = _model(
        [
            helper.make_node("Unsqueeze", ["x", "last"], ["a"]),
            helper.make_node("Reshape", ["a", "s1"], ["b"]),
            helper.make_node("Reshape", ["b", "flat"], ["c"]),
            helper.make_node("Reshape", ["b", "zero"], ["d"]),  # 0 copies a size of b: kept
            helper.make_node("Reshape", ["x", "same"], ["e"]),
        ],
        [_info("x", [2, 3])],
        [_info("c", [6]), _info("d", [1, 2, 3]), _info("e", [2, 3])],
        [
            _const("last", [-1]),
            _const("s1", [1, 6]),
            _const("flat", [-1]),
            _const("zero", [0, 2, -1]),
            _const("same", [2, 3]),
        ],
    )
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = _run(model, {"x": x})
    rewritten = _copy(model)
    assert standard_passes.rewrite_reshape_chains(rewritten) == 3
    nodes = {n.output[0]: n for n in rewritten.graph.node}
    assert nodes["b"].input[0] == "x"
    assert nodes["c"].input[0] == "x"
    assert nodes["d"].input[0] == "b"
    assert nodes["e"].op_type == "Identity"
    for got, ref in zip(_run(rewritten, {"x": x}), expected):
        np.testing.assert_array_equal(got, ref)


def test_identities_are_dropped_but_graph_outputs_kept():
    model = _model(
        [
            helper.make_node("Identity", ["x"], ["a"]),
            helper.make_node("Identity", ["a"], ["b"]),
            helper.make_node("Neg", ["b"], ["c"]),
            helper.make_node("Identity", ["c"], ["d"]),
        ],
        [_info("x", [3])],
        [_info("d", [3])],
    )
    assert _passes.drop_identities(model) == 2
    assert [(n.op_type, list(n.input)) for n in model.graph.node] == [
        ("Neg", ["x"]),
        ("Identity", ["c"]),
    ]


# --- copies and shape inference -------------------------------------------------


def test_initializers_as_inputs_is_the_engine_graph_without_copying_the_weights():
    from onnxgrad_sklearn.engine import weights_as_inputs

    estimator = _regressor(hidden=(64, 32))
    names = _backend(estimator).weight_names
    model = estimator._converted.model  # the inference graph, weights as initializers
    lean = _passes.initializers_as_inputs(model, names)
    ref = weights_as_inputs(model, names)
    assert lean.SerializeToString(deterministic=True) == ref.SerializeToString(deterministic=True)
    # applied to its own result it changes nothing; a name it does not know is refused
    again = _passes.initializers_as_inputs(lean, names)
    assert again.SerializeToString(deterministic=True) == lean.SerializeToString(deterministic=True)
    with pytest.raises(KeyError, match="neither an initializer nor an input"):
        _passes.initializers_as_inputs(model, ["no_such_weight"])


def test_initializers_as_inputs_keeps_no_bytes_of_the_moved_values():
    big = onnx.numpy_helper.from_array(np.ones((512, 512), np.float32), "w")
    model = _model(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        [_info("x", [2, 512])],
        [_info("y", [2, 512])],
        [big],
    )
    lean = _passes.initializers_as_inputs(model, ["w"])
    assert lean.ByteSize() < 4096  # the 1 MB of values are neither copied nor kept
    assert [i.name for i in lean.graph.input] == ["x", "w"]
    assert not lean.graph.initializer


def test_static_shapes_gives_the_element_types_of_the_same_inference():
    model = _model(
        [
            helper.make_node("Cast", ["x"], ["c"], to=TensorProto.DOUBLE),
            helper.make_node("Shape", ["c"], ["s"]),
        ],
        [_info("x", [2, 3])],
        [helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
        [_const("unused", [1])],
    )
    shapes = _passes.static_shapes(model)
    assert isinstance(shapes, dict)
    assert shapes["c"] == [2, 3] and shapes["s"] == [2]
    assert shapes.types == _passes.static_types(model)
    assert shapes.types["c"] == TensorProto.DOUBLE
    assert shapes.types["s"] == TensorProto.INT64
    assert shapes.types["unused"] == TensorProto.INT64


def test_leading_sums_record_the_shapes_of_the_tensors_they_make():
    model = _model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
        [_info("x", [9, 4, 1])],
        [_info("y", [4, 1])],
        [_const("axes", [0])],
    )
    shapes = _passes.static_shapes(model)
    assert standard_passes.rewrite_leading_sums(model, shapes) == 1
    made = [o for n in model.graph.node for o in n.output if o != "y"]
    assert made and all(name in shapes for name in made)
    assert shapes == _passes.static_shapes(model)  # what a new inference gives


def test_passes_edit_the_nodes_in_place_and_keep_their_order():
    model = _model(
        [
            helper.make_node("Neg", ["x"], ["unused"]),
            helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),  # x is (1, 3)
            helper.make_node("Identity", ["t"], ["i"]),
            helper.make_node("Relu", ["i"], ["r"]),
            helper.make_node("Relu", ["i"], ["r2"]),
            helper.make_node("Add", ["r", "r2"], ["y"]),
        ],
        [_info("x", [1, 3])],
        [_info("y", [3, 1])],
    )
    x = np.array([[1.0, -2.0, 3.0]], np.float32)
    expected = _run(model, {"x": x})[0]
    assert _passes.prune(model) == 1
    assert standard_passes.rewrite_unit_transposes(model) == 1
    assert _passes.drop_identities(model) == 1
    assert _passes.merge_duplicate_nodes(model) == 1
    assert [(n.op_type, list(n.input)) for n in model.graph.node] == [
        ("Reshape", ["x", "UnitTranspose/t_shape"]),
        ("Relu", ["t"]),
        ("Add", ["r", "r"]),
    ]
    np.testing.assert_array_equal(_run(model, {"x": x})[0], expected)


@pytest.mark.parametrize("opset", [17, 18])
def test_sums_of_squares_become_reduce_sum_square(opset):
    model = _model(
        [
            helper.make_node("Mul", ["w", "w"], ["sq"]),
            helper.make_node("ReduceSum", ["sq", "axes"], ["y"], keepdims=0),
            helper.make_node("Mul", ["v", "v"], ["sq2"]),
            helper.make_node("ReduceSum", ["sq2"], ["z"], keepdims=0),
            helper.make_node("Identity", ["sq2"], ["kept"]),  # the product read elsewhere
        ],
        [_info("w", [5, 3]), _info("v", [4])],
        [_info("y", [3]), _info("z", []), _info("kept", [4])],
        [_const("axes", [0])],
    )
    model.opset_import[0].version = opset
    rng = np.random.RandomState(0)
    feeds = {"w": rng.randn(5, 3).astype(np.float32), "v": rng.randn(4).astype(np.float32)}
    expected = _run(model, feeds)
    rewritten = _copy(model)
    assert standard_passes.rewrite_sum_of_squares(rewritten) == 1
    types = _passes.op_types(rewritten.graph.node)
    assert types.count("ReduceSumSquare") == 1 and types.count("Mul") == 1
    for got, ref in zip(_run(rewritten, feeds), expected):
        np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_a_repeated_product_in_a_sum_is_added_once_with_its_scale_doubled():
    model = _model(
        [
            helper.make_node("Mul", ["s", "w"], ["t"]),
            helper.make_node("Sum", ["t", "g", "t"], ["y"]),
            helper.make_node("Mul", ["s", "w"], ["u"]),
            helper.make_node("Sum", ["u", "u"], ["z"]),
            helper.make_node("Mul", ["w", "w"], ["r"]),
            helper.make_node("Sum", ["r", "r", "g"], ["kept"]),  # no smaller operand
        ],
        [_info("s", [1, 1]), _info("w", [4, 3]), _info("g", [4, 3])],
        [_info("y", [4, 3]), _info("z", [4, 3]), _info("kept", [4, 3])],
    )
    rng = np.random.RandomState(0)
    feeds = {n: rng.randn(*s).astype(np.float32) for n, s in (("s", (1, 1)), ("w", (4, 3)))}
    feeds["g"] = rng.randn(4, 3).astype(np.float32)
    expected = _run(model, feeds)
    rewritten = _copy(model)
    assert standard_passes.rewrite_repeated_terms(rewritten) == 2
    by_output = {n.output[0]: n for n in rewritten.graph.node}
    assert by_output["y"].op_type == "Add" and sorted(by_output["y"].input) == ["g", "t"]
    assert by_output["z"].op_type == "Identity"
    assert by_output["kept"].op_type == "Sum"
    for got, ref in zip(_run(rewritten, feeds), expected):
        np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_l2_penalty_makes_no_weight_sized_products_in_the_step_graph(optimizer, unguarded):
    # MLPRegressor's alpha=1e-4 by default: sum(W * W) and its two equal adjoints
    # were three weight-sized tensors per layer before the passes
    backend = _backend(_regressor(hidden=(16, 8), optimizer=optimizer))
    model, _ = unguarded(
        backend.training_model, backend.weight_names, backend.shapes, backend.optimizer, 32, 1
    )
    weights = set(backend.weight_names)
    products = [n for n in model.graph.node if n.op_type == "Mul" and n.input[0] == n.input[1]]
    assert not [n for n in products if n.input[0] in weights]
    squares = [n for n in model.graph.node if n.op_type == "ReduceSumSquare"]
    assert len(squares) == 3  # one per coefficient matrix
    shapes = _passes.static_shapes(model)
    sizes = {int(np.prod(s)) for s in backend.shapes if len(s) == 2}
    for node in model.graph.node:  # the weights' gradients: no term added twice
        shape = shapes.get(node.output[0])
        if node.op_type == "Sum" and shape and int(np.prod(shape)) in sizes:
            assert len(set(node.input)) == len(node.input), node
    scaled = [n for n in model.graph.node if any(i.endswith("_scaled") for i in n.input)]
    assert len(scaled) == 3  # each matrix's penalty gradient, once


def test_shape_computations_of_static_tensors_become_constants():
    # onnx-ad's zeros for a MaxPool adjoint: (numel of x, size of the seed) at run time
    model = _model(
        [
            helper.make_node("Size", ["x"], ["size"]),
            helper.make_node("Reshape", ["size", "one"], ["numel"]),
            helper.make_node("Shape", ["seed"], ["seed_shape"]),
            helper.make_node("Slice", ["seed_shape", "zero", "one"], ["nseed"]),
            helper.make_node("Concat", ["numel", "nseed"], ["dims"], axis=0),
            helper.make_node("ConstantOfShape", ["dims"], ["zeros"]),
            helper.make_node("Shape", ["x"], ["tail"], start=1),
            helper.make_node("Gather", ["tail", "zero"], ["width"], axis=0),
            helper.make_node("Unsqueeze", ["width", "zero"], ["width_1"]),
            helper.make_node("Cast", ["width_1"], ["width_f"], to=TensorProto.FLOAT),
            helper.make_node("Reshape", ["zeros", "dims"], ["z"]),
            helper.make_node("Add", ["z", "width_f"], ["y"]),
        ],
        [_info("x", [3, 4])],
        [_info("y", None)],
        [
            onnx.numpy_helper.from_array(np.ones(1, np.float32), "seed"),
            _const("zero", [0]),
            _const("one", [1]),
        ],
    )
    x = np.zeros((3, 4), np.float32)
    expected = _run(model, {"x": x})[0]
    assert standard_passes.fold_shape_computations(model) == 9
    assert [n.op_type for n in model.graph.node] == ["ConstantOfShape", "Reshape", "Add"]
    folded = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    np.testing.assert_array_equal(folded["dims"], [12, 1])
    assert folded["width_f"].dtype == np.float32 and folded["width_f"].tolist() == [[4.0]]
    assert _passes.static_shapes(model)["zeros"] == [12, 1]  # known to the passes after it
    np.testing.assert_array_equal(_run(model, {"x": x})[0], expected)
    assert expected.shape == (12, 1) and (expected == 4).all()


def test_shape_computations_of_unknown_or_large_values_stay():
    model = _model(
        [
            helper.make_node("Shape", ["x"], ["s"]),  # x's first axis is a symbol
            helper.make_node("ConstantOfShape", ["s"], ["y"]),
            helper.make_node("Reshape", ["big", "flat"], ["b"]),  # 100 elements: data
            helper.make_node("Identity", ["b"], ["b2"]),
        ],
        [_info("x", ["n", 4])],
        [_info("y", None), _info("b2", [100])],
        [onnx.numpy_helper.from_array(np.ones((10, 10), np.float32), "big"), _const("flat", [-1])],
    )
    assert standard_passes.fold_shape_computations(model) == 0


@pytest.mark.parametrize(
    ("shape", "perm", "reduced"),
    [
        ([6, 4, 5, 5, 1], [1, 4, 0, 2, 3], [1, 0, 2]),  # onnx-ad's seed-first filters
        ([1, 6, 4, 5, 5], [2, 0, 1, 3, 4], [1, 0, 2]),
        ([6, 4, 1, 3, 3], [1, 0, 3, 4, 2], [1, 0, 2]),  # the weight adjoint back in place
        ([6, 4, 5], [2, 0, 1], [1, 0]),
        ([2, 3, 4, 5], [3, 1, 0, 2], [3, 1, 0, 2]),  # nothing to merge: left as it is
    ],
)
def test_transposes_move_their_fewest_axes(shape, perm, reduced):
    out = [shape[a] for a in perm]
    model = _model(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=perm),
            helper.make_node("Neg", ["t"], ["y"]),
        ],
        [_info("x", shape)],
        [_info("y", out)],
    )
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    changed = standard_passes.rewrite_unit_transposes(model)
    transposes = [n for n in model.graph.node if n.op_type == "Transpose"]
    assert [list(t.attribute[0].ints) for t in transposes] == [reduced]
    assert changed == (reduced != perm)
    y = _run(model, {"x": x})[0]
    assert y.shape == tuple(out)
    np.testing.assert_array_equal(y, -x.transpose(perm))


@pytest.mark.parametrize(("op", "k"), [("Div", 0), ("Mul", 0), ("Mul", 1)])
def test_scalars_scale_what_an_expand_repeats(op, k):
    # onnx-ad's ReduceMean adjoint: Expand(dY, shape) / n, then read by a scatter
    scaled = [["big", "n"], ["n", "big"]][k]
    model = _model(
        [
            helper.make_node("Expand", ["x", "shape"], ["big"]),
            helper.make_node("Cast", ["count"], ["n"], to=TensorProto.FLOAT),
            helper.make_node(op, scaled, ["q"]),
            helper.make_node("Neg", ["q"], ["y"]),
        ],
        [_info("x", [4, 1, 3]), helper.make_tensor_value_info("count", TensorProto.INT64, [])],
        [_info("y", [4, 5, 3])],
        [_const("shape", [4, 5, 3])],
    )
    x = np.random.RandomState(0).rand(4, 1, 3).astype(np.float32)
    count = np.array(7, np.int64)
    expected = _run(model, {"x": x, "count": count})[0]
    assert standard_passes.rewrite_scaled_expands(model) == 1
    _passes.prune(model)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Cast", op, "Expand", "Neg"]  # the scalar before the copies
    assert _passes.static_shapes(model)["ScaledExpand/q"] == [4, 1, 3]
    np.testing.assert_array_equal(_run(model, {"x": x, "count": count})[0], expected)


def test_expands_read_twice_or_scaled_by_tensors_stay():
    model = _model(
        [
            helper.make_node("Expand", ["x", "shape"], ["big"]),
            helper.make_node("Div", ["big", "s"], ["q"]),  # s has 3 values
            helper.make_node("Expand", ["x", "shape"], ["big2"]),
            helper.make_node("Div", ["big2", "one"], ["q2"]),
            helper.make_node("Add", ["q", "q2"], ["sum"]),
            helper.make_node("Add", ["sum", "big2"], ["y"]),  # big2 read twice
        ],
        [_info("x", [4, 1, 3]), _info("s", [3]), _info("one", [1])],
        [_info("y", [4, 5, 3])],
        [_const("shape", [4, 5, 3])],
    )
    assert standard_passes.rewrite_scaled_expands(model) == 0


@pytest.mark.parametrize(
    ("height", "pool", "rewritten"),
    [
        (8, {"kernel_shape": [2, 2], "strides": [2, 2]}, 1),
        (9, {"kernel_shape": [2, 2], "strides": [2, 2]}, 1),  # a row left out
        (8, {"kernel_shape": [3, 3], "strides": [3, 2]}, 0),  # windows overlap: kept
        (8, {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}, 0),
    ],
)
def test_maxpool_adjoint_as_maxunpool_has_the_same_values(height, pool, rewritten):
    """Conv -> Relu -> MaxPool -> sum of squares: onnx-ad's ScatterND of the pooled
    adjoint becomes a MaxUnpool where the windows do not overlap; the gradient is the
    same bit for bit, ties in a window included (a constant region)."""
    rng = np.random.RandomState(0)
    W = rng.randn(3, 1, 3, 3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], **pool),
        helper.make_node("Mul", ["p", "p"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "pool",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1, height, 8]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [3, 1, 3, 3]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    grad = standard.gradient_graph(model, ["W"], batch=4)
    standard_passes.fold_shape_computations(grad)
    assert "ScatterND" in {n.op_type for n in grad.graph.node}
    changed = _copy(grad)
    assert standard_passes.rewrite_maxpool_scatters(changed) == rewritten
    ops = {n.op_type for n in changed.graph.node}
    assert ("MaxUnpool" in ops) == bool(rewritten) and ("ScatterND" in ops) != bool(rewritten)
    # the forward pass's pooling gives the indices: one MaxPool instead of two
    assert [n.op_type for n in changed.graph.node].count("MaxPool") == 2
    assert standard_passes.merge_maxpool_indices(changed) == 1
    pools = [n for n in changed.graph.node if n.op_type == "MaxPool"]
    assert len(pools) == 1 and len(pools[0].output) == 2
    x = rng.randn(4, 1, height, 8).astype(np.float32)
    x[:, :, :4, :4] = 0.5  # a constant region: ties in its windows
    feeds = {"x": x, "W": W}
    for a, b in zip(_run(grad, feeds), _run(changed, feeds)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("channels", "conv", "rewritten"),
    [
        (1, {"pads": [1, 1, 1, 1]}, 1),
        (3, {"pads": [0, 1, 2, 0]}, 1),  # unequal padding
        (8, {}, 1),
        (8, {"strides": [2, 2]}, 0),  # strided: onnx-ad's convolution kept
        (17, {}, 0),  # 17 x 3 x 3 inputs per filter: beyond PATCH_CONV_MAX_INPUTS
    ],
)
def test_weight_gradient_of_a_conv_as_patches_equals_onnx_ads(channels, conv, rewritten):
    """Conv -> Relu -> sum of squares: the filters' gradient written as one-hot
    patches times the output's adjoint equals onnx-ad's convolution over the batch
    within float32 rounding; the input's gradient is untouched."""
    rng = np.random.RandomState(0)
    W = rng.randn(4, channels, 3, 3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], kernel_shape=[3, 3], **conv),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Mul", ["r", "r"], ["sq"]),
        helper.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, channels, 9, 8]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, channels, 3, 3]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    grad = standard.gradient_graph(model, ["W", "x"], batch=5)
    standard_passes.fold_shape_computations(grad)
    changed = _copy(grad)
    assert standard_passes.rewrite_weight_gradient_convs(changed) == rewritten
    assert any(n.name.startswith("PatchConv") or "PatchConv" in "".join(n.output)
               for n in changed.graph.node) == bool(rewritten)  # fmt: skip
    feeds = {"x": rng.randn(5, channels, 9, 8).astype(np.float32), "W": W}
    before, after = _run(grad, feeds), _run(changed, feeds)
    assert [a.shape for a in before] == [b.shape for b in after]
    for a, b in zip(before, after):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-4)
    assert np.abs(before[1]).max() > 1  # a gradient worth comparing
