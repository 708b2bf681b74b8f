"""The package's general graph passes: version pinning, shape inference, graph edits.

:data:`MAX_OPSET`, :data:`MAX_ML_OPSET` and :data:`MAX_IR_VERSION`, the versions
every graph the package builds is pinned to (:func:`pin_versions`); shape and type
inference (:func:`static_shapes`); and passes that hold for any graph: weights as
inputs without copies (:func:`initializers_as_inputs`), the nodes a derivative
goes through (:func:`differentiated_nodes`), removing the nodes no output needs
(:func:`prune`), identities (:func:`drop_identities`) and repeated nodes
(:func:`merge_duplicate_nodes`); an optimizer's update graph appended to a gradient
graph (:func:`merge_update`: both backends train with one run of the two). The
rewrites made for one backend's gradient graphs live beside it:
:mod:`onnxgrad_sklearn.backends.agent_passes` (the TrainingAgent's) and
:mod:`onnxgrad_sklearn.backends.standard_passes` (onnx-ad's).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import onnx

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


def constant_input(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    """Turn the graph input ``name`` into an initializer holding ``value``, in place."""
    graph = model.graph
    info = next(i for i in graph.input if i.name == name)
    graph.input.remove(info)
    graph.initializer.append(onnx.numpy_helper.from_array(value, name))


def piece_gradients(model: onnx.ModelProto, adjoints, spans, prefix: str) -> dict[str, str]:
    """Add to ``model`` each piece of the gradients ``adjoints`` as a vector, in place.

    ``spans``: ``(weight, offset, length)`` of each piece
    (:func:`~onnxgrad_sklearn.backends.buffers.pieces`). A weight in one piece is its
    gradient reshaped (no copy), else each piece a slice of it. Returns the inputs
    ``grad_<j>`` of an update graph with one "weight" per piece (:func:`merge_update`'s
    ``connect``), connected to them; the new names start with ``prefix``.
    """
    graph = model.graph

    def constant(name, values):
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    minus_one = constant(prefix + "pieces_flat", [-1])
    zero = constant(prefix + "pieces_axis", [0])
    connect, flats = {}, {}
    whole = {i for i, s, _ in spans if s == 0} - {i for i, s, _ in spans if s > 0}
    for j, (i, start, n) in enumerate(spans):
        if i not in flats:
            flats[i] = f"{prefix}{adjoints[i]}_flat"
            graph.node.append(
                onnx.helper.make_node("Reshape", [adjoints[i], minus_one], [flats[i]])
            )
        if i in whole:
            connect[f"grad_{j}"] = flats[i]
            continue
        name = f"{prefix}piece_{j}"
        bounds = [constant(f"{name}_{b}", [v]) for b, v in (("start", start), ("end", start + n))]
        graph.node.append(onnx.helper.make_node("Slice", [flats[i], *bounds, zero], [name]))
        connect[f"grad_{j}"] = name
    return connect


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


def op_types(nodes: Sequence[onnx.NodeProto]) -> list[str]:
    """The distinct operator types of ``nodes`` (``domain:op`` outside ai.onnx), sorted."""
    return sorted(
        {n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in nodes}
    )
