"""The agent backend's rewrites of onnxruntime-training's gradient graphs.

:class:`~onnxgrad_sklearn.backends.agent.OrtGradientForwardBackward` applies them
to the graph ``OrtModuleGraphBuilder`` builds: the same values, faster kernels on
onnxruntime 1.19 (figures in ``benchmarks/README.md``). The general passes they
build on (shape inference, version pinning) are :mod:`onnxgrad_sklearn._passes`'.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from .._passes import static_shapes

__all__ = ["rewrite_batch_sums", "rewrite_relu_grad"]


def rewrite_relu_grad(model: onnx.ModelProto) -> int:
    """Replace each ``ReluGrad(dY, Y)`` node by ``Mul(dY, Cast(Greater(Y, 0)))``, in place.

    Same values, faster than onnxruntime 1.19's ReluGrad kernel (figures in
    benchmarks/README.md). Returns the number of nodes replaced.
    """
    nodes = list(model.graph.node)
    if not any(n.op_type == "ReluGrad" and n.domain == "com.microsoft" for n in nodes):
        return 0
    zero = "relu_grad_rewrite_zero"
    model.graph.initializer.append(
        onnx.numpy_helper.from_array(np.array(0.0, dtype=np.float32), zero)
    )
    rewritten, count = [], 0
    for node in nodes:
        if node.op_type != "ReluGrad" or node.domain != "com.microsoft":
            rewritten.append(node)
            continue
        count += 1
        grad, activation = node.input
        base = f"{node.name or node.output[0]}_rewrite"
        rewritten.extend(
            [
                onnx.helper.make_node(
                    "Greater", [activation, zero], [base + "_positive"], name=base + "_gt"
                ),
                onnx.helper.make_node(
                    "Cast",
                    [base + "_positive"],
                    [base + "_mask"],
                    to=TensorProto.FLOAT,
                    name=base + "_cast",
                ),
                onnx.helper.make_node(
                    "Mul", [grad, base + "_mask"], list(node.output), name=base + "_mul"
                ),
            ]
        )
    del model.graph.node[:]
    model.graph.node.extend(rewritten)
    return count


def _value_shapes(model: onnx.ModelProto) -> dict:
    """Shapes of a gradient graph's tensors, as :func:`.static_shapes` gives them.

    onnx's shape inference gives the shapes of the forward part; in the backward
    part (after the ``YieldOp``) the gradient ``T_grad`` of a tensor ``T`` has
    ``T``'s shape (the gradient builder's naming rule).
    """
    shapes = static_shapes(model)
    if not shapes:
        return shapes
    backward = False  # the naming rule holds for what the builder adds after the YieldOp
    for node in model.graph.node:
        backward = backward or node.op_type == "YieldOp"
        for out in node.output if backward else ():
            if out.endswith("_grad") and out not in shapes and out[:-5] in shapes:
                shapes[out] = shapes[out[:-5]]
    return shapes


def rewrite_batch_sums(model: onnx.ModelProto) -> int:
    """Replace each ``ReduceSum`` over the batch axis of a 2-D tensor by a ``MatMul``, in place.

    ``ReduceSum(dY, axes=[0])`` (the gradient of a bias row added to every
    sample) becomes ``MatMul(ones, dY)`` with ``ones`` of shape ``(1, n)``, made
    once per batch symbol from the shape of the first such ``dY``. Same values,
    and the product is faster than the reduction (benchmarks/README.md). The
    batch axis is one whose size is a symbol (``batch`` in the engine's training
    graph). Returns the number of nodes replaced.
    """
    nodes = list(model.graph.node)
    if not any(n.op_type == "ReduceSum" for n in nodes):
        return 0
    shapes = _value_shapes(model)
    constants = {init.name: onnx.numpy_helper.to_array(init) for init in model.graph.initializer}
    rewritten, ones, count = [], {}, 0
    for node in nodes:
        att = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        grad = node.input[0] if node.input else ""
        shape = shapes.get(grad)
        axes = constants.get(node.input[1]) if len(node.input) > 1 else None
        if (
            node.op_type != "ReduceSum"
            or node.domain not in ("", "ai.onnx")
            or shape is None
            or len(shape) != 2
            or not isinstance(shape[0], str)
            or axes is None
            or [int(a) for a in np.ravel(axes)] not in ([0], [-2])
        ):
            rewritten.append(node)
            continue
        count += 1
        symbol = shape[0]
        if symbol not in ones:
            base = f"BatchSum_Grad/ones_{len(ones)}"
            rewritten.extend(
                [
                    onnx.helper.make_node("Shape", [grad], [base + "_n"], end=1, name=base + "_n"),
                    onnx.helper.make_node(
                        "ConstantOfShape",
                        [base + "_n"],
                        [base + "_vector"],
                        value=onnx.numpy_helper.from_array(np.ones(1, np.float32)),
                        name=base + "_vector",
                    ),
                    onnx.helper.make_node(
                        "Unsqueeze", [base + "_vector", "batch_sum_axis0"], [base], name=base
                    ),
                ]
            )
            ones[symbol] = base
        base = f"{node.name or node.output[0]}_matmul"
        if att.get("keepdims", 1):
            rewritten.append(
                onnx.helper.make_node("MatMul", [ones[symbol], grad], list(node.output), name=base)
            )
        else:
            rewritten.extend(
                [
                    onnx.helper.make_node("MatMul", [ones[symbol], grad], [base], name=base),
                    onnx.helper.make_node(
                        "Squeeze", [base, "batch_sum_axis0"], list(node.output), name=base + "_1d"
                    ),
                ]
            )
    if count:
        model.graph.initializer.append(
            onnx.numpy_helper.from_array(np.array([0], dtype=np.int64), "batch_sum_axis0")
        )
        del model.graph.node[:]
        model.graph.node.extend(rewritten)
    return count
