"""Helpers of the golden-gradient fixtures: float64 copies of training graphs."""

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, numpy_helper

from onnxgrad_sklearn.backends.standard import gradient_graph
from onnxgrad_sklearn.engine import weights_as_inputs


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64: tensors, initializers and casts."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        if info.type.tensor_type.elem_type == TensorProto.FLOAT:
            info.type.tensor_type.elem_type = TensorProto.DOUBLE
    for init in graph.initializer:
        if init.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(init).astype(np.float64)
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    for node in graph.node:
        for att in node.attribute:
            if node.op_type == "Cast" and att.name == "to" and att.i == TensorProto.FLOAT:
                att.i = TensorProto.DOUBLE
    return out


def _session(model):
    # no fusions: some fused kernels (FusedMatMul) are float32 only
    so = onnxruntime.SessionOptions()
    so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return onnxruntime.InferenceSession(
        model.SerializeToString(), so, providers=["CPUExecutionProvider"]
    )


def _with_targets(model, batch):
    for info in model.graph.input:
        if info.name == "y_true":
            info.type.tensor_type.shape.dim[1].dim_value = batch[1].shape[1]
    return model


def float64_gradients(model, names, batch):
    """Loss and gradients of the training graph ``model`` in float64 (onnx-ad, onnxruntime)."""
    f64 = _with_targets(to_float64(weights_as_inputs(model, names)), batch)
    sess = _session(gradient_graph(f64, names, len(batch[0])))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    values = [b.astype(np.float64) for b in batch] + [inits[n].astype(np.float64) for n in names]
    out = sess.run(None, dict(zip([i.name for i in sess.get_inputs()], values)))
    return float(out[0]), [g[..., 0] for g in out[1:]]


def float64_loss(model, names, batch):
    """A function ``(weights) -> loss`` of the training graph in float64."""
    f64 = _with_targets(to_float64(weights_as_inputs(model, names)), batch)
    sess = _session(f64)
    feeds = dict(zip([i.name for i in sess.get_inputs()], [b.astype(np.float64) for b in batch]))

    def loss(weights):
        return float(sess.run(None, {**feeds, **dict(zip(names, weights))})[0])

    return loss
