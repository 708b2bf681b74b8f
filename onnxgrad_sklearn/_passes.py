"""Graph rewrites both backends use: version pinning, shape inference, passes.

The TrainingAgent's gradient graph (:mod:`onnxgrad_sklearn.backends.agent`) and
the standard backend's (:mod:`onnxgrad_sklearn.backends.standard`, made by
``onnx_ad.reverse``) go through the passes here before a session runs them:
removing nodes no output needs, bias gradients as matrix products, the update
rule merged into the same graph.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import onnx
from onnx import TensorProto

__all__ = [
    "MAX_IR_VERSION",
    "MAX_ML_OPSET",
    "MAX_OPSET",
    "constant_input",
    "copy_fields",
    "differentiated_nodes",
    "drop_identities",
    "fix_dimension",
    "initializers_as_inputs",
    "merge_duplicate_nodes",
    "merge_update",
    "needed_nodes",
    "op_types",
    "pin_versions",
    "prune",
    "rewrite_batch_sums",
    "rewrite_broadcast_expands",
    "rewrite_leading_sums",
    "rewrite_noop_expands",
    "rewrite_reshape_chains",
    "rewrite_relu_grad",
    "rewrite_repeated_terms",
    "rewrite_sigmoid_adjoints",
    "rewrite_sum_of_squares",
    "rewrite_unit_reductions",
    "rewrite_unit_transposes",
    "static_shapes",
]

#: Highest versions onnxruntime-training 1.19 accepts (plain onnxruntime >= 1.20
#: accepts them too): every graph the package builds is pinned to them.
MAX_OPSET = 21
MAX_ML_OPSET = 5
MAX_IR_VERSION = 10


def pin_versions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Lower the IR version and opsets of ``model`` to what the runtime accepts.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place.

    Returns
    -------
    onnx.ModelProto
        The same object.
    """
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > MAX_OPSET:
            opset.version = MAX_OPSET
        elif opset.domain == "ai.onnx.ml" and opset.version > MAX_ML_OPSET:
            opset.version = MAX_ML_OPSET
    return model


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


class Shapes(dict):
    """Inferred shapes by tensor name (a ``dict``), with the element types of the same inference.

    Attributes
    ----------
    types : dict of str to int
        What :func:`static_types` gives for the same graph: ``TensorProto`` element
        types by tensor name, initializers included.
    """

    types: dict


def static_shapes(model: onnx.ModelProto) -> Shapes:
    """Inferred shapes by tensor name: lists of ints and symbol names (None: unknown).

    One shape inference gives the element types too (:attr:`Shapes.types`): the
    passes that read both do not infer the graph a second time.
    """
    graph = _inferred_graph(model)
    shapes = Shapes()
    shapes.types = types = {i.name: i.data_type for i in model.graph.initializer}
    if graph is None:
        return shapes
    for vi in itertools.chain(graph.input, graph.value_info, graph.output):
        tensor = vi.type.tensor_type
        if tensor.elem_type:
            types[vi.name] = tensor.elem_type
        if tensor.HasField("shape"):
            shapes[vi.name] = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim
            ]
    return shapes


def static_types(model: onnx.ModelProto) -> dict:
    """Inferred element types (``TensorProto`` values) by tensor name, initializers included."""
    return static_shapes(model).types


def _inferred_graph(model: onnx.ModelProto):
    """The graph of ``model`` after onnx's shape inference (None when it fails)."""
    # Shape inference copies the model it is given: large initializers go in as
    # inputs of the same type and shape (no data), small ones (shape constants) as they are.
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.graph.node.extend(model.graph.node)
    light.graph.input.extend(model.graph.input)
    light.graph.output.extend(model.graph.output)
    declared = {i.name for i in model.graph.input}
    for init in model.graph.initializer:
        if math.prod(init.dims) <= 64:
            light.graph.initializer.append(init)
        elif init.name not in declared:
            light.graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    try:
        return onnx.shape_inference.infer_shapes(light).graph
    except Exception:  # noqa: BLE001 - no shapes, nothing to simplify
        return None


def _value_shapes(model: onnx.ModelProto) -> dict:
    """Shapes of a gradient graph's tensors, as :func:`static_shapes` gives them.

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


def fix_dimension(model: onnx.ModelProto, symbol: str, value: int) -> onnx.ModelProto:
    """Give the dimension named ``symbol`` the size ``value`` everywhere it appears, in place.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place.
    symbol : str
        A ``dim_param`` of the graph's inputs, outputs or value infos.
    value : int
        Its size.

    Returns
    -------
    onnx.ModelProto
        The same object.
    """
    graph = model.graph
    for info in [*graph.input, *graph.output, *graph.value_info]:
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param == symbol:
                dim.dim_value = int(value)
    return model


def copy_fields(source, target, skip: str):
    """Copy every field of protobuf message ``source`` but ``skip`` into ``target``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        repeated = getattr(field, "is_repeated", None)  # protobuf >= 5.29: label is gone
        if repeated is None:
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(target, field.name).extend(value)
        elif field.type == field.TYPE_MESSAGE:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)
    return target


def initializers_as_inputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """Return a copy of ``model`` where the initializers ``names`` are graph inputs.

    The same graph as ``engine.weights_as_inputs`` gives (the other initializers
    in their order, one input per name appended in the order of ``names``), but
    the values of ``names`` are never copied: a ``CopyFrom`` of the whole model
    followed by deleting them keeps their bytes alive as long as the copy (protobuf
    frees a message's memory with the message), one copy of the weights per graph.

    A name that is a graph input already stays as it is (the function can be
    applied to its own result).

    Raises
    ------
    KeyError
        When one of ``names`` is neither an initializer nor an input of ``model``.
    """
    wanted = set(names)
    out = copy_fields(model, onnx.ModelProto(), skip="graph")
    graph = copy_fields(model.graph, out.graph, skip="initializer")
    moved = {}
    for init in model.graph.initializer:
        if init.name in wanted:
            moved[init.name] = (init.data_type, list(init.dims))
        else:
            graph.initializer.add().CopyFrom(init)
    declared = {i.name for i in model.graph.input}
    for name in names:
        if name in moved:
            elem_type, dims = moved[name]
            graph.input.append(onnx.helper.make_tensor_value_info(name, elem_type, dims))
        elif name not in declared:
            raise KeyError(f"{name!r} is neither an initializer nor an input of the graph.")
    return out


def differentiated_nodes(
    model: onnx.ModelProto, inputs: Iterable[str], output: str
) -> list[onnx.NodeProto]:
    """The nodes a derivative of ``output`` with respect to ``inputs`` goes through.

    A node is on that path when one of its inputs depends on ``inputs`` and
    ``output`` depends on one of its outputs (subgraphs of control-flow nodes
    are not entered).

    Parameters
    ----------
    model : onnx.ModelProto
        The graph.
    inputs : iterable of str
        The tensors differentiated against (the weights).
    output : str
        The differentiated tensor (the loss).

    Returns
    -------
    list of onnx.NodeProto
        In graph order.
    """
    nodes = list(model.graph.node)
    depends = set(inputs)
    forward = []
    for node in nodes:
        if any(name in depends for name in node.input):
            forward.append(node)
            depends.update(node.output)
    needed = {output}
    path = []
    for node in reversed(forward):
        if any(name in needed for name in node.output):
            path.append(node)
            needed.update(node.input)
    return path[::-1]


def needed_nodes(graph: onnx.GraphProto, outputs: Iterable[str]) -> tuple[list[bool], set]:
    """Which nodes of ``graph`` the tensors ``outputs`` need, and the names they read.

    Returns a flag per node (in order) and the set of tensor names read on the way,
    ``outputs`` and the names subgraphs read from the outer scope included.
    """
    needed = set(outputs)
    used = [False] * len(graph.node)
    for i in range(len(graph.node) - 1, -1, -1):
        node = graph.node[i]
        if needed.isdisjoint(node.output):
            continue
        used[i] = True
        needed.update(node.input)
        for sub in _subgraphs(node):  # names a subgraph reads from the outer scope
            needed.update(name for n in sub.node for name in n.input)
    return used, needed


def prune(model: onnx.ModelProto) -> int:
    """Remove the nodes and initializers no graph output needs, in place.

    Returns the number of nodes removed.
    """
    graph = model.graph
    used, needed = needed_nodes(graph, [o.name for o in graph.output])
    removed = {i: [] for i, keep in enumerate(used) if not keep}
    _edit_nodes(graph, removed)
    unused = [i for i in graph.initializer if i.name not in needed]
    for init in unused:
        graph.initializer.remove(init)
    return len(removed)


_GRAPH_ATTRIBUTES = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


def _subgraphs(node: onnx.NodeProto) -> list:
    """The subgraphs of a control-flow node (none for most nodes, checked without copies)."""
    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def _edit_nodes(graph: onnx.GraphProto, edits: dict) -> None:
    """Apply ``edits`` (node index to the nodes replacing it, none: removed) to ``graph``.

    Removals and one-for-one replacements are made in place: rebuilding the node
    list copies every node, and the passes change a few of them.
    """
    if any(len(new) > 1 for new in edits.values()):
        nodes = []
        for i, node in enumerate(graph.node):
            nodes.extend(edits.get(i, [node]))
        del graph.node[:]
        graph.node.extend(nodes)
        return
    for i in sorted(edits, reverse=True):
        if edits[i]:
            graph.node[i].CopyFrom(edits[i][0])
        else:
            del graph.node[i]


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _reduced_axes(node: onnx.NodeProto, constants: dict, rank: int) -> list[int] | None:
    """The sorted, non-negative axes a ``Reduce*`` node reduces (None: not known statically).

    Axes come from the second input (a constant initializer, opset 13 and later
    for ``ReduceSum``) or the ``axes`` attribute; no axes means every axis, or
    none with ``noop_with_empty_axes=1``.
    """
    att = _attributes(node)
    if len(node.input) > 1 and node.input[1]:
        if node.input[1] not in constants:
            return None
        axes = onnx.numpy_helper.to_array(constants[node.input[1]]).ravel().tolist()
    else:
        axes = list(att.get("axes", []))
    if not axes:
        return [] if att.get("noop_with_empty_axes", 0) else list(range(rank))
    normalized = sorted({int(a) + rank if int(a) < 0 else int(a) for a in axes})
    if any(a < 0 or a >= rank for a in normalized):
        return None
    return normalized


def rewrite_unit_reductions(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Replace each ``ReduceSum`` over axes of size 1 only by ``Identity`` or ``Squeeze``, in place.

    onnx-ad sums every adjoint over the axes a forward operand was broadcast
    along, and along its seed axis: on ``(batch, 1, 1)`` tensors these sums run
    over an axis of size 1 and return their input, yet onnxruntime 1.19 spends
    about 25 us on each (a few per layer). A sum of one term is that term:
    ``keepdims=1`` gives an ``Identity``, ``keepdims=0`` a ``Squeeze`` of those
    axes. Returns the number of nodes replaced.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    constants = {i.name: i for i in model.graph.initializer}
    edits, extra = {}, []
    for i, node in enumerate(model.graph.node):
        shape = shapes.get(node.input[0]) if node.op_type == "ReduceSum" else None
        axes = None
        if shape is not None and node.domain in ("", "ai.onnx"):
            axes = _reduced_axes(node, constants, len(shape))
        if axes is None or any(shape[a] != 1 for a in axes):
            continue
        base = f"UnitReduction/{node.output[0]}"
        if not axes or _attributes(node).get("keepdims", 1):
            edits[i] = [
                onnx.helper.make_node("Identity", [node.input[0]], list(node.output), name=base)
            ]
            continue
        extra.append(onnx.numpy_helper.from_array(np.array(axes, np.int64), base + "_axes"))
        edits[i] = [
            onnx.helper.make_node(
                "Squeeze", [node.input[0], base + "_axes"], list(node.output), name=base
            )
        ]
    if edits:
        _edit_nodes(model.graph, edits)
        model.graph.initializer.extend(extra)
    return len(edits)


def rewrite_leading_sums(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Replace each ``ReduceSum`` over the first axis of a static tensor by a ``MatMul``, in place.

    ``ReduceSum(x)`` over axis 0 (and possibly over axes of size 1 besides) with
    ``x`` of static shape ``(n, *rest)``, ``n > 1`` and ``rest`` not empty
    (onnx-ad's bias gradients: ``(batch, width, 1)`` over axis 0, and
    ``(batch, 1, 1)`` over axes 0 and 1 for a layer of one unit) becomes
    ``Reshape(MatMul(ones(1, n), Reshape(x, (n, -1))), out_shape)``: same values,
    and onnxruntime's matrix product is several times faster than its reduction
    over the first axis. Returns the number of nodes replaced.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    constants = {i.name: i for i in model.graph.initializer}
    rewritten, ones, count = [], {}, 0
    extra = []
    types = getattr(shapes, "types", None)  # else inferred at the first rewrite
    for node in model.graph.node:
        shape = shapes.get(node.input[0]) if node.op_type == "ReduceSum" else None
        axes = None
        if (
            shape is not None
            and node.domain in ("", "ai.onnx")
            and len(shape) >= 2
            and all(isinstance(d, int) for d in shape)
        ):
            axes = _reduced_axes(node, constants, len(shape))
        if axes is None or [a for a in axes if shape[a] != 1] != [0] or shape[0] < 2:
            rewritten.append(node)
            continue
        att = _attributes(node)
        if types is None:
            types = static_types(model)
        elem_type = types.get(node.input[0], TensorProto.FLOAT)
        if elem_type not in (TensorProto.FLOAT, TensorProto.DOUBLE):
            rewritten.append(node)
            continue
        count += 1
        n, rest = shape[0], shape[1:]
        key = n, elem_type
        if key not in ones:
            ones[key] = f"LeadingSum/ones_{n}" + ("_f64" if elem_type == TensorProto.DOUBLE else "")
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
            extra.append(onnx.numpy_helper.from_array(np.ones((1, n), dtype), ones[key]))
        base = f"LeadingSum/{node.output[0]}"
        flat_shape, out_shape = base + "_flat_shape", base + "_shape"
        kept_dims = (
            [1, *rest]
            if att.get("keepdims", 1)
            else [d for i, d in enumerate(shape) if i not in axes]
        )
        flat = [n, math.prod(rest)]
        operand, total = node.input[0], base + "_sum"
        if list(shape) != flat:  # no reshape where the tensor is a matrix already
            operand = base + "_2d"
            extra.append(onnx.numpy_helper.from_array(np.array(flat, np.int64), flat_shape))
            rewritten.append(
                onnx.helper.make_node("Reshape", [node.input[0], flat_shape], [operand])
            )
            shapes[operand] = flat  # the next passes may reuse these shapes
        if kept_dims == [1, flat[1]]:
            total = node.output[0]
        rewritten.append(onnx.helper.make_node("MatMul", [ones[key], operand], [total]))
        shapes[total] = [1, flat[1]]
        if total != node.output[0]:
            extra.append(onnx.numpy_helper.from_array(np.array(kept_dims, np.int64), out_shape))
            rewritten.append(
                onnx.helper.make_node("Reshape", [total, out_shape], list(node.output))
            )
    if count:
        del model.graph.node[:]
        model.graph.node.extend(rewritten)
        model.graph.initializer.extend(extra)
    return count


def rewrite_unit_transposes(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Replace each ``Transpose`` that only moves axes of size 1 by a ``Reshape``, in place.

    onnx-ad moves its seed axis (of size 1 here) between the front and the back
    of the adjoints around every matrix product: with that axis of size 1 the
    data order does not change, and a ``Reshape`` costs no copy. Returns the
    number of nodes replaced.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    edits, extra = {}, []
    for i, node in enumerate(model.graph.node):
        shape = shapes.get(node.input[0]) if node.op_type == "Transpose" else None
        if shape is None or not all(isinstance(d, int) for d in shape):
            continue
        perm = _attributes(node).get("perm", list(range(len(shape)))[::-1])
        moved = [a for a in perm if shape[a] != 1]
        if moved != sorted(moved):
            continue
        name = f"UnitTranspose/{node.output[0]}_shape"
        extra.append(
            onnx.numpy_helper.from_array(np.array([shape[a] for a in perm], np.int64), name)
        )
        edits[i] = [onnx.helper.make_node("Reshape", [node.input[0], name], list(node.output))]
    if edits:
        _edit_nodes(model.graph, edits)
        model.graph.initializer.extend(extra)
    return len(edits)


def rewrite_noop_expands(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Replace each ``Expand`` whose input already has the target shape by ``Identity``.

    Returns the number of nodes replaced.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    constants = {i.name: i for i in model.graph.initializer}
    count = 0
    for node in model.graph.node:
        if node.op_type != "Expand" or node.input[1] not in constants:
            continue
        shape = shapes.get(node.input[0])
        target = onnx.numpy_helper.to_array(constants[node.input[1]]).ravel().tolist()
        if shape is None or not all(isinstance(d, int) for d in shape):
            continue
        if len(target) <= len(shape) and all(
            t in (1, s) for t, s in zip(target[::-1], shape[::-1])
        ):
            del node.input[1:]
            node.op_type = "Identity"
            count += 1
    return count


def _rename_inputs(graph: onnx.GraphProto, renamed: dict) -> None:
    """Make every node of ``graph`` (subgraphs included) read ``renamed[name]`` for ``name``."""
    for node in graph.node:
        if not renamed.keys().isdisjoint(node.input):
            node.input[:] = [renamed.get(name, name) for name in node.input]
        for sub in _subgraphs(node):
            _rename_inputs(sub, renamed)


def _resolve(renamed: dict, name: str) -> str:
    while name in renamed:
        name = renamed[name]
    return name


def drop_identities(model: onnx.ModelProto) -> int:
    """Remove each ``Identity`` node whose output is not a graph output, in place.

    Its readers read its input instead. onnxruntime removes most of them itself;
    removing them here lets the other passes see through them (a ``Reshape`` of
    a ``Reshape``, nodes that compute the same thing). Returns the number removed.
    """
    graph = model.graph
    outputs = {o.name for o in graph.output}
    renamed, removed = {}, {}
    for i, node in enumerate(graph.node):
        if (
            node.op_type == "Identity"
            and node.domain in ("", "ai.onnx")
            and len(node.input) == 1
            and node.output[0] not in outputs
        ):
            renamed[node.output[0]] = _resolve(renamed, node.input[0])
            removed[i] = []
    if renamed:
        renamed = {k: _resolve(renamed, k) for k in renamed}
        _edit_nodes(graph, removed)
        _rename_inputs(graph, renamed)
    return len(renamed)


#: Operators whose outputs differ from one call to the next: never merged.
_NONDETERMINISTIC = {
    "Bernoulli",
    "Dropout",
    "Multinomial",
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
}


def merge_duplicate_nodes(model: onnx.ModelProto) -> int:
    """Remove each node that repeats an earlier one (same operator, inputs, attributes), in place.

    onnx-ad differentiates ``W * W`` (the L2 penalty) and ``d * d`` (the squared
    error) once per operand: two equal products, and their sums, each computed
    twice. The readers of a repeated node read the first one's outputs instead
    (the values are the same bits); a repeated node that writes a graph output
    becomes an ``Identity``. Nodes with subgraphs and random operators are kept.
    Returns the number of nodes merged.
    """
    graph = model.graph
    outputs = {o.name for o in graph.output}
    seen, renamed, edits = {}, {}, {}
    for i, node in enumerate(graph.node):
        if renamed and not renamed.keys().isdisjoint(node.input):
            node.input[:] = [renamed.get(name, name) for name in node.input]
        attributes = node.attribute
        if (
            node.op_type in _NONDETERMINISTIC
            or not node.output
            or any(a.type in _GRAPH_ATTRIBUTES for a in attributes)
        ):
            continue
        attributes = (
            tuple(sorted((a.name, a.SerializeToString(deterministic=True)) for a in attributes))
            if attributes
            else ()
        )
        key = (
            node.domain or "ai.onnx",
            node.op_type,
            tuple(node.input),
            attributes,
            tuple(bool(o) for o in node.output),
        )
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        edits[i] = []
        for mine, theirs in zip(node.output, first.output):
            if not mine:
                continue
            if mine in outputs:
                edits[i].append(onnx.helper.make_node("Identity", [theirs], [mine]))
            else:
                renamed[mine] = theirs
    if edits:
        _edit_nodes(graph, edits)
        _rename_inputs(graph, renamed)  # readers inside subgraphs
    return len(edits)


def _broadcast(*shapes) -> list | None:
    """Numpy's broadcast of static shapes (None when one is unknown or they do not broadcast)."""
    if any(s is None or not all(isinstance(d, int) for d in s) for s in shapes):
        return None
    try:
        return list(np.broadcast_shapes(*(tuple(s) for s in shapes)))
    except ValueError:
        return None


def rewrite_broadcast_expands(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Let element-wise operators broadcast what an ``Expand`` feeding them would repeat, in place.

    onnx-ad fills the adjoint of a sum with ``Expand(seed, shape)`` before
    multiplying it with a tensor of that shape (the L2 penalty's gradient):
    ``Mul(Expand(c, s), W)`` is ``Mul(c, W)`` when ``W`` has shape ``s`` already,
    without writing the repeated values first. Applied to ``Add``, ``Sub``,
    ``Mul`` and ``Div`` reading the ``Expand`` when the other operand keeps the
    result's shape; the ``Expand`` goes when nothing else reads it (:func:`prune`).
    Returns the number of operands replaced.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    expands = {
        n.output[0]: n.input[0]
        for n in model.graph.node
        if n.op_type == "Expand" and n.domain in ("", "ai.onnx")
    }
    count = 0
    for node in model.graph.node:
        if (
            node.op_type not in ("Add", "Sub", "Mul", "Div")
            or node.domain not in ("", "ai.onnx")
            or len(node.input) != 2
        ):
            continue
        for k in range(2):
            mine, other = node.input[k], node.input[1 - k]
            if mine not in expands or mine == other:
                continue
            source = expands[mine]
            out = _broadcast(shapes.get(mine), shapes.get(other))
            if out is None or _broadcast(shapes.get(source), shapes.get(other)) != out:
                continue
            node.input[k] = source
            count += 1
    return count


def _readers(graph: onnx.GraphProto) -> dict:
    """Tensor name -> the nodes of ``graph`` reading it (a node once per input it fills)."""
    readers: dict = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def rewrite_sum_of_squares(model: onnx.ModelProto) -> int:
    """Replace each ``ReduceSum(Mul(x, x))`` by ``ReduceSumSquare(x)``, in place.

    The L2 penalty is ``sum(W * W)``: the product is a tensor the size of the
    weight, written then summed, one per weight matrix in every training step
    (16 MB for a 2048 x 2048 layer). ``ReduceSumSquare`` sums the squares
    without it. Applied where nothing else reads the product; the axes and
    attributes stay (``ReduceSumSquare`` takes its axes as an input from opset
    18, as an attribute before). Returns the number of sums replaced.
    """
    graph = model.graph
    outputs = {o.name for o in graph.output}
    readers = _readers(graph)
    producers = {out: (i, n) for i, n in enumerate(graph.node) for out in n.output}
    constants = {i.name: i for i in graph.initializer}
    opset = _opset(model)
    edits = {}
    for node in graph.node:
        if node.op_type != "ReduceSum" or node.domain not in ("", "ai.onnx"):
            continue
        square = node.input[0]
        index, product = producers.get(square, (None, None))
        if (
            product is None
            or product.op_type != "Mul"
            or product.domain not in ("", "ai.onnx")
            or product.input[0] != product.input[1]
            or square in outputs
            or len(readers.get(square, ())) != 1
        ):
            continue
        axes_input = len(node.input) > 1 and node.input[1]
        if opset < 18 and axes_input:
            if node.input[1] not in constants:
                continue
            axes = onnx.numpy_helper.to_array(constants[node.input[1]]).ravel().tolist()
            node.attribute.append(onnx.helper.make_attribute("axes", [int(a) for a in axes]))
            del node.input[1:]
        node.op_type = "ReduceSumSquare"
        node.input[0] = product.input[0]
        edits[index] = []
    if edits:
        _edit_nodes(graph, edits)
    return len(edits)


def rewrite_repeated_terms(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Add a product repeated in a ``Sum`` once, its smaller operand scaled, in place.

    onnx-ad differentiates ``W * W`` once per operand; with the two equal
    adjoints merged (:func:`merge_duplicate_nodes`), the weight's gradient is
    ``Sum(t, t, g)`` with ``t = Mul(s, W)``: two weight-sized tensors besides
    the data gradient ``g``. ``Mul(s * 2, W)`` added to ``g`` (an ``Add``, which
    onnxruntime may compute in ``g``'s memory) makes one. Applied where ``t`` is
    a ``Mul`` read by that ``Sum`` only, whose one operand has fewer elements
    than ``t`` (static shapes of a float type). Returns the number of sums
    rewritten.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    types = getattr(shapes, "types", None) or static_types(model)
    graph = model.graph
    outputs = {o.name for o in graph.output}
    readers = _readers(graph)
    producers = {out: (i, n) for i, n in enumerate(graph.node) for out in n.output}
    floats = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}

    def size(name):
        shape = shapes.get(name)
        if shape is None or not all(isinstance(d, int) for d in shape):
            return None
        return math.prod(shape)

    edits, extra, count_rewritten = {}, [], 0
    for i, node in enumerate(graph.node):
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or i in edits:
            continue
        terms = list(node.input)
        for term in dict.fromkeys(terms):
            count = terms.count(term)
            index, product = producers.get(term, (None, None))
            if (
                count < 2
                or product is None
                or index in edits
                or product.op_type != "Mul"
                or product.domain not in ("", "ai.onnx")
                or term in outputs
                or any(r is not node for r in readers.get(term, ()))
                or size(term) is None
            ):
                continue
            sizes = [size(x) for x in product.input]
            small = min(range(2), key=lambda k: sizes[k] if sizes[k] is not None else math.inf)
            operand = product.input[small]
            dtype = floats.get(types.get(operand))
            if sizes[small] is None or sizes[small] >= size(term) or dtype is None:
                continue
            base = f"RepeatedTerm/{term}"
            extra.append(onnx.numpy_helper.from_array(np.array(count, dtype), base + "_count"))
            scaled = onnx.helper.make_node(
                "Mul", [operand, base + "_count"], [base + "_scaled"], name=base
            )
            changed = onnx.NodeProto()
            changed.CopyFrom(product)
            changed.input[small] = base + "_scaled"
            edits[index] = [scaled, changed]
            first = terms.index(term)
            terms = [x for k, x in enumerate(terms) if x != term or k == first]
        if len(terms) == len(node.input):
            continue
        op = {1: "Identity", 2: "Add"}.get(len(terms), "Sum")
        edits[i] = [onnx.helper.make_node(op, terms, list(node.output), name=node.name)]
        count_rewritten += 1
    if edits:
        _edit_nodes(graph, edits)
        graph.initializer.extend(extra)
    return count_rewritten


#: Operators that only give their input another shape (no copy in onnxruntime).
_VIEWS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def rewrite_reshape_chains(model: onnx.ModelProto, shapes: dict | None = None) -> int:
    """Shorten the reshapes of reshapes and drop the reshapes that keep the shape, in place.

    ``Reshape(v, s)`` where ``v`` is itself a ``Reshape``, ``Squeeze``,
    ``Unsqueeze``, ``Flatten`` or ``Identity`` of ``x`` reads ``x`` (when ``s``
    is a constant without zeros: no size copied from ``v``), and a ``Reshape``
    to the static shape its input already has becomes an ``Identity``. The same
    values, fewer kernel calls (the passes' seed-axis reshapes meet the update
    rule's flattening). Returns the number of nodes changed.
    """
    shapes = static_shapes(model) if shapes is None else shapes
    constants = {i.name: i for i in model.graph.initializer}
    producer = {}
    count = 0
    for node in model.graph.node:
        if (
            node.op_type == "Reshape"
            and node.domain in ("", "ai.onnx")
            and len(node.input) == 2
            and node.input[1] in constants
        ):
            target = onnx.numpy_helper.to_array(constants[node.input[1]]).ravel().tolist()
            before = producer.get(node.input[0])
            if 0 not in target and before is not None:
                node.input[0] = before.input[0]
                count += 1
            shape = shapes.get(node.input[0])
            if (
                shape is not None
                and all(isinstance(d, int) for d in shape)
                and shapes.get(node.output[0]) == shape
            ):
                del node.input[1:]
                node.op_type = "Identity"
                del node.attribute[:]
                count += 1
        if node.op_type in _VIEWS and node.domain in ("", "ai.onnx") and node.input:
            producer[node.output[0]] = node
    return count


def merge_update(
    model: onnx.ModelProto,
    update: onnx.ModelProto,
    connect: dict[str, str],
    prefix: str = "update/",
) -> dict[str, str]:
    """Append the update graph ``update`` to ``model``, in place.

    Every name of ``update`` is prefixed, except its inputs listed in ``connect``
    (input name to the tensor of ``model`` that feeds it). Its other inputs
    become inputs of ``model`` and its outputs outputs of ``model``.

    Parameters
    ----------
    model : onnx.ModelProto
        The gradient graph; modified.
    update : onnx.ModelProto
        The optimizer's update graph.
    connect : dict of str to str
        Which tensors of ``model`` its inputs are.
    prefix : str, default="update/"
        Prefix of the other names.

    Returns
    -------
    dict of str to str
        The new name of each input and output of ``update`` that was not connected.
    """

    def name(old: str) -> str:
        if not old:
            return old
        return connect.get(old, prefix + old)

    graph = model.graph
    for node in update.graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = prefix + (node.name or node.output[0])
        copy.input[:] = [name(n) for n in node.input]
        copy.output[:] = [name(n) for n in node.output]
        graph.node.append(copy)
    for init in update.graph.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(init)
        copy.name = name(init.name)
        graph.initializer.append(copy)
    renamed = {}
    for info in update.graph.input:
        if info.name in connect:
            continue
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(info)
        copy.name = renamed[info.name] = name(info.name)
        graph.input.append(copy)
    for info in update.graph.output:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(info)
        copy.name = renamed[info.name] = name(info.name)
        graph.output.append(copy)
    return renamed


def constant_input(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    """Turn the graph input ``name`` into an initializer holding ``value``, in place."""
    graph = model.graph
    info = next(i for i in graph.input if i.name == name)
    graph.input.remove(info)
    graph.initializer.append(onnx.numpy_helper.from_array(value, name))


def op_types(nodes: Sequence[onnx.NodeProto]) -> list[str]:
    """The distinct operator types of ``nodes`` (``domain:op`` outside ai.onnx), sorted."""
    return sorted(
        {n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in nodes}
    )


def rewrite_sigmoid_adjoints(model: onnx.ModelProto) -> int:
    """Reorder onnx-ad's Sigmoid adjoint ``dY * lift(Y * (1 - Y))`` as ``(dY * Y) * (1 - Y)``.

    The TrainingAgent's ``SigmoidGrad`` multiplies in that order; with it the two
    backends' gradients agree to the last bits instead of about 1e-5 relative on
    some entries. In place; returns the number of adjoints reordered.
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    sigmoid_outputs = {n.output[0] for n in graph.node if n.op_type == "Sigmoid"}
    replaced = {}
    for node in graph.node:
        if node.op_type != "Mul" or len(node.input) != 2:
            continue
        lift = producer.get(node.input[1])
        if lift is None or lift.op_type != "Unsqueeze":
            continue
        d = producer.get(lift.input[0])
        if d is None or d.op_type != "Mul" or d.input[0] not in sigmoid_outputs:
            continue
        y = d.input[0]
        s = producer.get(d.input[1])
        if s is None or s.op_type != "Sub" or s.input[1] != y:
            continue
        base = f"SigmoidAdjoint/{node.output[0]}"
        replaced[id(node)] = [
            onnx.helper.make_node("Unsqueeze", [y, lift.input[1]], [base + "_y"]),
            onnx.helper.make_node("Unsqueeze", [d.input[1], lift.input[1]], [base + "_1my"]),
            onnx.helper.make_node("Mul", [node.input[0], base + "_y"], [base + "_dyy"]),
            onnx.helper.make_node("Mul", [base + "_dyy", base + "_1my"], list(node.output)),
        ]
    if replaced:
        nodes = []
        for node in graph.node:
            nodes.extend(replaced.get(id(node), [node]))
        del graph.node[:]
        graph.node.extend(nodes)
    return len(replaced)
