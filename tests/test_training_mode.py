"""Dropout and BatchNormalization in training mode rewritten for onnx-ad
(onnxgrad_sklearn.backends.training_mode): the rewritten forward, its gradients through
onnx-ad and the inference-mode copy against torch, and graphs made with onnx.helper at
other opsets."""

from __future__ import annotations

import copy
import io
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnxgrad_sklearn._passes import fix_dimension, initializers_as_inputs
from onnxgrad_sklearn.backends.training_mode import (
    DropoutMask,
    RunningStatistic,
    draw_masks,
    inference_mode,
    keep_outputs,
    training_mode,
    training_nodes,
)

ort = pytest.importorskip("onnxruntime")


#: onnxruntime's CPU kernel of the FusedMatMul these fusions make is float32 only.
_DOUBLE_DISABLED = ["MatmulTransposeFusion", "MatMulScaleFusion"]


def _run(model, feeds, outputs=None):
    session = ort.InferenceSession(
        model.SerializeToString(),
        providers=["CPUExecutionProvider"],
        disabled_optimizers=_DOUBLE_DISABLED,
    )
    return session.run(outputs, feeds)


def _rel(actual, expected, floor=0.0):
    """The largest error relative to the largest expected value (at least ``floor``)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), floor))


def _checked(model):
    onnx.checker.check_model(model, full_check=True)
    names = [n.name for n in model.graph.node]
    assert len(names) == len(set(names)), "node names are not unique"
    return model


# ---------------------------------------------------------------------------
# torch models, exported in training mode


def _torch_models():
    torch = pytest.importorskip("torch")

    class MLP(torch.nn.Module):
        """Linear -> ReLU -> Dropout(0.3) -> Linear; ``mask`` set: ``h * mask`` for the dropout."""

        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(5, 16)
            self.drop = torch.nn.Dropout(0.3)
            self.l2 = torch.nn.Linear(16, 3)
            self.mask = None

        def forward(self, x):
            h = torch.relu(self.l1(x))
            h = self.drop(h) if self.mask is None else h * self.mask
            return self.l2(h)

    class CNN(torch.nn.Module):
        """Conv2d -> BatchNorm2d -> ReLU -> MaxPool -> Flatten -> Linear."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(2, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)
            self.pool = torch.nn.MaxPool2d(2)
            self.fc = torch.nn.Linear(4 * 3 * 3, 3)

        def forward(self, x):
            h = self.pool(torch.relu(self.bn(self.conv(x))))
            return self.fc(torch.flatten(h, 1))

    class Dense(torch.nn.Module):
        """Linear -> (N, 4, 6) -> BatchNorm1d -> ReLU -> Flatten -> Linear (no Conv: it runs in
        double, where onnxruntime's CPU Conv does not)."""

        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(5, 24)
            self.bn = torch.nn.BatchNorm1d(4)
            self.l2 = torch.nn.Linear(24, 3)

        def forward(self, x):
            h = self.bn(self.l1(x).reshape(-1, 4, 6))
            return self.l2(torch.flatten(torch.relu(h), 1))

    return torch, MLP, CNN, Dense


def _export(torch, module, x):
    """``module`` exported in training mode (a copy: the export's trace updates BatchNorm)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            copy.deepcopy(module),
            (x,),
            buffer,
            dynamo=False,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
            opset_version=17,
            input_names=["x"],
            dynamic_axes={"x": {0: "batch"}},
        )
    return onnx.load_from_string(buffer.getvalue())


def _mlp(dtype="float32"):
    torch, MLP, _, _ = _torch_models()
    torch.manual_seed(0)
    module = MLP().to(getattr(torch, dtype))
    x = torch.from_numpy(np.random.RandomState(0).randn(12, 5).astype(dtype))
    return torch, module, x, _export(torch, module, x)


def _distinct(torch, bn):
    """Distinct BatchNorm values: the exporter merges equal initializers."""
    with torch.no_grad():
        bn.weight.copy_(torch.tensor([1.2, 0.8, 1.5, 0.6]))
        bn.bias.copy_(torch.tensor([0.1, -0.2, 0.3, 0.05]))
        bn.running_mean.copy_(torch.tensor([0.05, -0.1, 0.2, 0.15]))
        bn.running_var.copy_(torch.tensor([1.1, 0.9, 1.3, 0.7]))


def _cnn(dtype="float32"):
    torch, _, CNN, _ = _torch_models()
    torch.manual_seed(0)
    module = CNN().to(getattr(torch, dtype))
    _distinct(torch, module.bn)
    x = torch.from_numpy(np.random.RandomState(0).randn(8, 2, 8, 8).astype(dtype))
    return torch, module, x, _export(torch, module, x)


def _dense(dtype="float32"):
    torch, _, _, Dense = _torch_models()
    torch.manual_seed(0)
    module = Dense().to(getattr(torch, dtype))
    _distinct(torch, module.bn)
    x = torch.from_numpy(np.random.RandomState(0).randn(8, 5).astype(dtype))
    return torch, module, x, _export(torch, module, x)


def _initializers(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def test_dropout_forward_equals_torch_with_the_same_mask():
    torch, module, x, model = _mlp()
    dropouts, batchnorms = training_nodes(model)
    assert len(dropouts) == 1 and batchnorms == []
    tm = training_mode(model)
    _checked(tm.model)
    assert training_nodes(tm.model) == ([], [])
    (mask,) = tm.masks
    assert mask == DropoutMask(mask.input, dropouts[0].name, mask.ratio, (None, 16), mask.dtype)
    assert mask.ratio == pytest.approx(0.3) and mask.dtype == np.float32
    assert tm.statistics == [] and tm.rows is None
    info = next(i for i in tm.model.graph.input if i.name == mask.input)
    assert [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim] == ["batch", 16]
    assert [o.name for o in tm.model.graph.output] == [o.name for o in model.graph.output]

    masks = draw_masks(tm.masks, 12, np.random.RandomState(3))
    assert 0 < (masks[mask.input] == 0).sum() < masks[mask.input].size
    (y,) = _run(tm.model, {"x": x.numpy(), **masks})
    module.train()
    module.mask = torch.from_numpy(masks[mask.input])
    expected = module(x).detach().numpy()
    assert _rel(y, expected) < 1e-6
    # Another mask, another output: the mask is what drops.
    other = draw_masks(tm.masks, 12, np.random.RandomState(4))
    assert _rel(_run(tm.model, {"x": x.numpy(), **other})[0], expected) > 1e-3


def _bn_statistics(z, running_mean, running_var, momentum):
    """ONNX's update of the running mean and variance (population variance), in float64."""
    z = z.astype(np.float64)
    mean, var = z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3))
    momentum = np.float64(np.float32(momentum))
    return (
        running_mean * momentum + mean * (1 - momentum),
        running_var * momentum + var * (1 - momentum),
    )


def test_batchnorm_forward_and_running_statistics_equal_torch():
    torch, module, x, model = _cnn()
    inits = _initializers(model)
    assert len({inits[f"bn.{k}"].tobytes() for k in ("weight", "bias", "running_mean")}) == 3
    tm = training_mode(model)
    _checked(tm.model)
    assert tm.rows == "sample_weight" and tm.masks == []
    assert [s.initializer for s in tm.statistics] == ["bn.running_mean", "bn.running_var"]
    assert [o.name for o in tm.model.graph.output] == [
        model.graph.output[0].name,
        *(s.output for s in tm.statistics),
    ]
    y, mean, var = _run(tm.model, {"x": x.numpy(), "sample_weight": np.ones(8, np.float32)})

    # torch from the exported values (the export's trace moved the module's running stats)
    module.load_state_dict({k: torch.tensor(v) for k, v in inits.items()}, strict=False)
    module.train()
    expected = module(x).detach().numpy()
    assert _rel(y, expected) < 1e-5
    assert _rel(mean, module.bn.running_mean.numpy()) < 1e-6
    assert _rel(var, module.bn.running_var.numpy()) < 1e-3  # torch: the sample variance

    z = module.conv(x).detach().numpy()
    want_mean, want_var = _bn_statistics(z, inits["bn.running_mean"], inits["bn.running_var"], 0.9)
    assert _rel(mean, want_mean) < 1e-6
    assert _rel(var, want_var) < 1e-6
    sample = inits["bn.running_var"] * 0.9 + z.var(axis=(0, 2, 3), ddof=1) * 0.1
    assert _rel(var, sample) > 1e-5  # not torch's sample-variance update (1e-4 away)


def test_padding_rows_leave_the_statistics_and_the_real_rows_unchanged():
    _, _, x, model = _cnn()
    tm = training_mode(model)
    x = x.numpy()
    alone = _run(tm.model, {"x": x, "sample_weight": np.ones(8, np.float32)})
    padding = np.random.RandomState(5).randn(4, *x.shape[1:]).astype(np.float32) * 10
    weights = np.r_[np.linspace(0.5, 2.0, 8), np.zeros(4)].astype(np.float32)
    padded = _run(tm.model, {"x": np.concatenate([x, padding]), "sample_weight": weights})
    assert _rel(padded[0][:8], alone[0]) < 1e-6
    assert _rel(padded[1], alone[1]) < 1e-6
    assert _rel(padded[2], alone[2]) < 1e-6
    # A batch of padding rows only keeps the running values, and its outputs are finite.
    none = _run(tm.model, {"x": padding, "sample_weight": np.zeros(4, np.float32)})
    inits = _initializers(model)
    assert np.isfinite(none[0]).all()
    np.testing.assert_array_equal(none[1], inits["bn.running_mean"])
    np.testing.assert_array_equal(none[2], inits["bn.running_var"])


# ---------------------------------------------------------------------------
# Gradients through onnx-ad


def _gradient_graph(tm, weights, statistics, batch, coefficients):
    """A loss ``sum(y * y * coefficients)`` appended to ``tm.model``, differentiated by onnx-ad.

    The weights and the running statistics are inputs (the statistics are fed, not
    differentiated); the graph's outputs: the loss, then the statistics' updates.
    """
    onnx_ad = pytest.importorskip("onnx_ad")
    model = initializers_as_inputs(tm.model, [*weights, *statistics])
    graph = model.graph
    y = graph.output[0].name
    elem_type = helper.np_dtype_to_tensor_dtype(coefficients.dtype)
    graph.initializer.append(numpy_helper.from_array(coefficients, "loss_coefficients"))
    graph.node.extend(
        [
            helper.make_node("Mul", [y, y], ["loss_squares"]),
            helper.make_node("Mul", ["loss_squares", "loss_coefficients"], ["loss_terms"]),
            helper.make_node("ReduceSum", ["loss_terms"], ["loss"], keepdims=0),
        ]
    )
    kept = list(graph.output[1:])
    del graph.output[:]
    graph.output.extend([helper.make_tensor_value_info("loss", elem_type, []), *kept])
    fix_dimension(model, "batch", batch)
    model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    grad = onnx_ad.reverse(model, inputs=list(weights), outputs=["loss"], layout="onnx")
    return model, grad


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("float64", 1e-9)])
def test_dropout_gradients_equal_torch_autograd(dtype, tol):
    torch, module, x, model = _mlp(dtype)
    tm = training_mode(model)
    weights = ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
    coefficients = np.random.RandomState(1).randn(12, 3).astype(dtype)
    _, grad = _gradient_graph(tm, weights, [], 12, coefficients)
    inits = _initializers(model)
    feeds = {"x": x.numpy(), **{w: inits[w] for w in weights}}
    feeds.update(draw_masks(tm.masks, 12, np.random.RandomState(7)))
    feeds["adj_loss"] = np.ones(1, dtype)
    names = [o.name for o in grad.graph.output]
    found = dict(zip(names, _run(grad, feeds)))

    module.train()
    module.mask = torch.from_numpy(feeds[tm.masks[0].input])
    out = module(x)
    loss = (out * out * torch.from_numpy(coefficients)).sum()
    loss.backward()
    assert _rel(found["loss"], loss.item()) < tol
    for name, parameter in module.named_parameters():
        assert _rel(found[f"adj_{name}"][..., 0], parameter.grad.numpy()) < tol, name


@pytest.mark.parametrize(
    "make, dtype, tol",
    [(_cnn, "float32", 1e-4), (_dense, "float32", 1e-4), (_dense, "float64", 1e-9)],
)
def test_batchnorm_gradients_equal_torch_autograd(make, dtype, tol):
    torch, module, x, model = make(dtype)
    tm = training_mode(model)
    weights = [name for name, _ in module.named_parameters()]
    statistics = [s.initializer for s in tm.statistics]
    coefficients = np.random.RandomState(1).randn(8, 3).astype(dtype)
    forward, grad = _gradient_graph(tm, weights, statistics, 8, coefficients)

    # onnx-ad keeps the forward graph's outputs: the running statistics' updates stay.
    names = [o.name for o in grad.graph.output]
    assert names[:3] == ["loss", *(s.output for s in tm.statistics)]
    assert keep_outputs(grad, forward, [s.output for s in tm.statistics]) == 0

    inits = _initializers(model)
    feeds = {"x": x.numpy(), "sample_weight": np.ones(8, dtype), "adj_loss": np.ones(1, dtype)}
    feeds.update({w: inits[w] for w in [*weights, *statistics]})
    found = dict(zip(names, _run(grad, feeds)))

    module.load_state_dict({k: torch.tensor(v) for k, v in inits.items()}, strict=False)
    module.train()
    out = module(x)
    loss = (out * out * torch.from_numpy(coefficients)).sum()
    loss.backward()
    assert _rel(found["loss"], loss.item()) < tol
    scale = max(np.abs(p.grad.numpy()).max() for p in module.parameters())
    for name, parameter in module.named_parameters():
        # the bias before the BatchNorm has a gradient of 0 (the batch mean takes it out):
        # measured against the largest
        floor = scale if name in ("conv.bias", "l1.bias") else 0.0
        assert _rel(found[f"adj_{name}"][..., 0], parameter.grad.numpy(), floor) < tol, name
    assert _rel(found["bn.running_mean_updated"], module.bn.running_mean.numpy()) < 1e-6
    # The statistics come from the fed running values (inputs, not folded constants).
    feeds["bn.running_mean"] = feeds["bn.running_mean"] + 1
    moved = dict(zip(names, _run(grad, feeds)))
    np.testing.assert_allclose(
        moved["bn.running_mean_updated"], found["bn.running_mean_updated"] + 0.9, rtol=1e-6
    )


def test_keep_outputs_puts_back_a_removed_statistic():
    _, _, x, model = _cnn()
    tm = training_mode(model)
    stripped = onnx.ModelProto()
    stripped.CopyFrom(tm.model)
    del stripped.graph.output[1:]
    names = [s.output for s in tm.statistics]
    assert keep_outputs(stripped, tm.model, names) == 2
    assert [o.name for o in stripped.graph.output] == [o.name for o in tm.model.graph.output]
    feeds = {"x": x.numpy(), "sample_weight": np.ones(8, np.float32)}
    for a, b in zip(_run(stripped, feeds), _run(tm.model, feeds)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="nowhere"):
        keep_outputs(stripped, tm.model, ["nowhere"])


# ---------------------------------------------------------------------------
# Inference mode


@pytest.mark.parametrize("make", [_mlp, _cnn, _dense])
def test_inference_mode_equals_torch_eval(make):
    torch, module, x, model = make()
    inits = _initializers(model)
    module.load_state_dict({k: torch.tensor(v) for k, v in inits.items()}, strict=False)
    module.eval()
    expected = module(x).detach().numpy()
    plain = _checked(inference_mode(model))
    assert training_nodes(plain) == ([], [])
    assert [i.name for i in plain.graph.input] == ["x"]
    assert [o.name for o in plain.graph.output] == [o.name for o in model.graph.output]
    (y,) = _run(plain, {"x": x.numpy()})
    assert _rel(y, expected) < 1e-5
    assert not {"Dropout"} & {n.op_type for n in plain.graph.node}


# ---------------------------------------------------------------------------
# Graphs made with onnx.helper


def _model(nodes, inputs, outputs, opset, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_opset11_dropout_with_a_ratio_attribute():
    model = _model(
        [
            helper.make_node("Relu", ["X"], ["H"], name="relu"),
            helper.make_node("Dropout", ["H"], ["Y"], name="drop", ratio=0.25),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3, 4])],
        opset=11,
    )
    tm = training_mode(model)
    _checked(tm.model)
    (mask,) = tm.masks
    assert (mask.node, mask.ratio, mask.shape) == ("drop", 0.25, (None, 3, 4))
    x = np.random.RandomState(0).randn(5, 3, 4).astype(np.float32)
    masks = draw_masks(tm.masks, 5, np.random.RandomState(0))
    (y,) = _run(tm.model, {"X": x, **masks})
    np.testing.assert_allclose(y, np.maximum(x, 0) * masks[mask.input], rtol=1e-7)
    assert set(np.unique(masks[mask.input])) <= {0.0, np.float32(1 / 0.75)}
    (plain,) = _run(_checked(inference_mode(model)), {"X": x})
    np.testing.assert_array_equal(plain, np.maximum(x, 0))


@pytest.mark.parametrize("constant", ["initializer", "node"])
def test_opset12_dropout_with_ratio_and_training_mode_inputs_and_its_mask_output(constant):
    nodes, initializers = [], []
    values = {"ratio": np.array(0.4, np.float32), "training": np.array(False)}
    for name, value in values.items():
        if constant == "initializer":
            initializers.append(numpy_helper.from_array(value, name))
        else:
            tensor = numpy_helper.from_array(value, name)
            nodes.append(helper.make_node("Constant", [], [name], value=tensor, name=name))
    nodes.append(
        helper.make_node("Dropout", ["X", "ratio", "training"], ["Y", "M"], name="d", seed=3)
    )
    model = _model(
        nodes,
        [helper.make_tensor_value_info("X", TensorProto.DOUBLE, ["n", 6])],
        [
            helper.make_tensor_value_info("Y", TensorProto.DOUBLE, ["n", 6]),
            helper.make_tensor_value_info("M", TensorProto.BOOL, ["n", 6]),
        ],
        opset=12,
        initializers=initializers,
    )
    tm = training_mode(model)
    _checked(tm.model)
    (mask,) = tm.masks
    assert mask.ratio == pytest.approx(0.4) and mask.dtype == np.float64
    # the ratio and training-mode constants are read by nothing now: gone
    assert not ({"ratio", "training"} & {i.name for i in tm.model.graph.initializer})
    assert [n.op_type for n in tm.model.graph.node] == ["Mul", "Cast"]
    x = np.random.RandomState(0).randn(7, 6)
    masks = draw_masks(tm.masks, 7, np.random.RandomState(1))
    y, m = _run(tm.model, {"X": x, **masks})  # training_mode False: it drops all the same
    np.testing.assert_array_equal(y, x * masks[mask.input])
    np.testing.assert_array_equal(m, masks[mask.input] != 0)
    assert m.dtype == np.bool_ and 0 < m.sum() < m.size

    plain = _checked(inference_mode(model))
    y, m = _run(plain, {"X": x})
    np.testing.assert_array_equal(y, x)
    assert m.dtype == np.bool_ and m.shape == x.shape and m.all()


def test_dropout_of_an_unknown_shape_names_the_node():
    model = _model(
        [helper.make_node("Dropout", ["X"], ["Y"], name="the_dropout")],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", "features"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", "features"])],
        opset=13,
    )
    with pytest.raises(ValueError, match="'the_dropout'.*static shapes"):
        training_mode(model)


def _bn_model(opset, spatial=(5,), outputs=3, graph_outputs=None, elem=TensorProto.FLOAT):
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    rs = np.random.RandomState(2)
    values = {
        "scale": rs.uniform(0.5, 1.5, 3),
        "B": rs.randn(3),
        "mean": rs.randn(3),
        "var": rs.uniform(0.5, 1.5, 3),
    }
    inits = [numpy_helper.from_array(v.astype(dtype), k) for k, v in values.items()]
    names = ["Y", "running_mean", "running_var", "saved_mean", "saved_var"][:outputs]
    attrs = {"epsilon": 1e-3, "momentum": 0.8}
    if opset >= 14:
        attrs["training_mode"] = 1
    node = helper.make_node(
        "BatchNormalization", ["X", "scale", "B", "mean", "var"], names, name="bn", **attrs
    )
    x_shape = ["N", 3, *spatial]
    shapes = {"Y": x_shape, "running_mean": [3], "running_var": [3]}
    shapes.update(saved_mean=[3], saved_var=[3])
    graph_outputs = graph_outputs or names
    model = _model(
        [node],
        [helper.make_tensor_value_info("X", elem, x_shape)],
        [helper.make_tensor_value_info(n, elem, shapes[n]) for n in graph_outputs],
        opset=opset,
        initializers=inits,
    )
    return model, {k: v.astype(dtype) for k, v in values.items()}


def _bn_reference(x, values, weights, epsilon=1e-3, momentum=0.8):
    """BatchNormalization over the rows of positive weight, in float64."""
    x64 = x.astype(np.float64)
    axes = (0, *range(2, x.ndim))
    real = x64[weights > 0]
    mean, var = real.mean(axis=axes), real.var(axis=axes)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x64 - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + epsilon)
    y = y * values["scale"].reshape(shape) + values["B"].reshape(shape)
    m = np.float64(np.float32(momentum))
    return y, values["mean"] * m + mean * (1 - m), values["var"] * m + var * (1 - m), mean, var


@pytest.mark.parametrize(
    "opset, spatial, outputs",
    [
        (15, (5,), 3),  # training_mode attribute; ReduceSum axes as input
        (15, ("L",), 3),  # symbolic spatial dimension: counted at run time
        (13, (2, 3), 5),  # extra outputs mean training (opsets 9 to 13)
        (12, (4,), 3),  # ReduceSum's axes as an attribute
        (9, (), 3),  # (N, C): no spatial dimension
    ],
)
def test_batchnorm_made_with_helper(opset, spatial, outputs):
    model, values = _bn_model(opset, spatial, outputs)
    tm = training_mode(model)
    _checked(tm.model)
    assert tm.rows == "sample_weight"
    assert tm.statistics == [
        RunningStatistic("mean", "mean_updated"),
        RunningStatistic("var", "var_updated"),
    ]
    names = [o.name for o in model.graph.output]
    assert [o.name for o in tm.model.graph.output] == [*names, "mean_updated", "var_updated"]
    declared = next(i for i in tm.model.graph.input if i.name == "sample_weight")
    assert [d.dim_param for d in declared.type.tensor_type.shape.dim] == ["batch"]
    size = [4 if isinstance(d, str) else d for d in spatial]
    x = np.random.RandomState(3).randn(6, 3, *size).astype(np.float32) * 2 + 1
    weights = np.array([1, 0.5, 0, 2, 1, 0], np.float32)
    found = dict(
        zip(
            names + ["mean_updated", "var_updated"],
            _run(tm.model, {"X": x, "sample_weight": weights}),
        )
    )
    y, running_mean, running_var, mean, var = _bn_reference(x, values, weights)
    assert _rel(found["Y"], y) < 1e-5
    for name, want in [("mean_updated", running_mean), ("var_updated", running_var)]:
        assert _rel(found[name], want) < 1e-6, name
    # the node's own running-statistic outputs (graph outputs here) are the same values
    np.testing.assert_array_equal(found["running_mean"], found["mean_updated"])
    np.testing.assert_array_equal(found["running_var"], found["var_updated"])
    if outputs == 5:
        assert _rel(found["saved_mean"], mean) < 1e-6
        assert _rel(found["saved_var"], var) < 1e-5

    plain = _checked(inference_mode(model))
    assert [o.name for o in plain.graph.output] == ["Y"]
    (y,) = _run(plain, {"X": x})
    shape = (1, -1) + (1,) * len(spatial)
    want = (x - values["mean"].reshape(shape)) / np.sqrt(values["var"].reshape(shape) + 1e-3)
    want = want * values["scale"].reshape(shape) + values["B"].reshape(shape)
    assert _rel(y, want) < 1e-5


def test_batchnorm_running_outputs_read_by_nodes_and_a_declared_sample_weight():
    model, values = _bn_model(15, graph_outputs=["Y"])
    graph = model.graph
    graph.node.append(helper.make_node("Add", ["running_mean", "running_var"], ["S"], name="s"))
    graph.output.append(helper.make_tensor_value_info("S", TensorProto.FLOAT, [3]))
    graph.input.append(helper.make_tensor_value_info("sample_weight", TensorProto.FLOAT, ["N"]))
    tm = training_mode(model)
    _checked(tm.model)
    assert [i.name for i in tm.model.graph.input] == ["X", "sample_weight"]
    assert [o.name for o in tm.model.graph.output] == ["Y", "S", "mean_updated", "var_updated"]
    x = np.random.RandomState(3).randn(4, 3, 5).astype(np.float32)
    _, s, mean, var = _run(tm.model, {"X": x, "sample_weight": np.ones(4, np.float32)})
    np.testing.assert_allclose(s, mean + var, rtol=1e-6)

    plain = _checked(inference_mode(model))  # reads the running values given
    _, s = _run(plain, {"X": x, "sample_weight": np.ones(4, np.float32)})
    np.testing.assert_allclose(s, values["mean"] + values["var"], rtol=1e-6)


def test_batchnorm_in_inference_mode_is_left_as_it_is():
    model, _ = _bn_model(15, outputs=1)
    for attr in model.graph.node[0].attribute:
        if attr.name == "training_mode":
            attr.i = 0
    assert training_nodes(model) == ([], [])
    tm = training_mode(model)
    assert tm.model == model and tm.rows is None and tm.statistics == []


def test_merged_running_statistics_are_refused():
    model, _ = _bn_model(15, graph_outputs=["Y"])
    node = model.graph.node[0]
    # the legacy exporter's merge: the bias and the running mean read one initializer
    node.input[2] = "B_copy"
    node.input[3] = "mean_copy"
    model.graph.node.insert(0, helper.make_node("Identity", ["mean"], ["B_copy"], name="i1"))
    model.graph.node.insert(1, helper.make_node("Identity", ["mean"], ["mean_copy"], name="i2"))
    with pytest.raises(ValueError, match="'mean' is also read by node 'i1'.*distinct values"):
        training_mode(model)


def test_opsets_out_of_range_are_refused():
    model = _model(
        [helper.make_node("Dropout", ["X"], ["Y"], name="old")],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3])],
        opset=6,
    )
    with pytest.raises(ValueError, match="'old': opset 6 is not supported"):
        training_mode(model)
    model, _ = _bn_model(15)
    model.opset_import[0].version = 8
    with pytest.raises(ValueError, match="'bn': opset 8 is not supported"):
        training_mode(model)


def test_new_names_do_not_collide_with_the_graphs():
    model = _model(
        [
            helper.make_node("Relu", ["X"], ["d/mask"], name="d/Mul"),
            helper.make_node("Dropout", ["d/mask"], ["Y"], name="d", ratio=0.5),
        ],
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3])],
        opset=11,
    )
    tm = training_mode(model)
    _checked(tm.model)
    assert tm.masks[0].input not in {"d/mask", "X", "Y"}
    assert len({n.name for n in tm.model.graph.node}) == 2


# ---------------------------------------------------------------------------
# Masks


def test_draw_masks_is_reproducible_and_inverted():
    masks = [
        DropoutMask("a", "n1", 0.3, (None, 50, 20), np.dtype(np.float32)),
        DropoutMask("b", "n2", 0.0, (None, 4), np.dtype(np.float64)),
        DropoutMask("c", "n3", 0.5, (None,), np.dtype(np.float64)),
    ]
    first = draw_masks(masks, 100, np.random.RandomState(0))
    again = draw_masks(masks, 100, np.random.RandomState(0))
    other = draw_masks(masks, 100, np.random.RandomState(1))
    assert list(first) == ["a", "b", "c"]
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
    assert not np.array_equal(first["a"], other["a"])
    a = first["a"]
    assert a.shape == (100, 50, 20) and a.dtype == np.float32
    assert set(np.unique(a)) == {0.0, np.float32(1 / 0.7)}
    assert abs(a.mean() - 1) < 0.01 and abs((a == 0).mean() - 0.3) < 0.01
    np.testing.assert_array_equal(first["b"], np.ones((100, 4)))
    assert first["c"].shape == (100,) and first["c"].dtype == np.float64
    # what it draws, exactly
    rng = np.random.RandomState(0)
    drawn = (rng.random_sample((100, 50, 20)) >= 0.3) / (1 - 0.3)
    np.testing.assert_array_equal(a, drawn.astype(np.float32))
