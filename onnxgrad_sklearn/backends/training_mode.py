"""Dropout and BatchNormalization in training mode, rewritten in operators onnx-ad differentiates.

``onnx_ad.reverse`` refuses ``Dropout`` and ``BatchNormalization`` in training mode
(what ``torch.onnx.export(..., training=TrainingMode.TRAINING)`` writes). The passes
of this module are pure graph rewrites (numpy and onnx only):

* :func:`training_mode` gives a copy where every ``Dropout`` multiplies its input by
  a mask fed as a new graph input (drawn by :func:`draw_masks` for each step), and
  every ``BatchNormalization`` in training mode normalizes with the statistics of the
  batch's real rows (``sample_weight > 0``), the updated running mean and variance
  appended as graph outputs (:class:`RunningStatistic`);
* :func:`inference_mode` gives the copy to predict with and to export: ``Dropout``
  as ``Identity``, ``BatchNormalization`` with its running statistics;
* :func:`keep_outputs` puts graph outputs back in a gradient graph; onnx-ad 0.3.0
  keeps every output of the graph it differentiates, so it is only needed where a
  later pass removed them.

Opsets: ``Dropout`` from opset 7, ``BatchNormalization`` in training mode from opset
9 (before, its ``spatial`` and ``is_test`` attributes mean something else), up to
every later opset whose ``Dropout`` (last changed at 22) and ``BatchNormalization``
(last changed at 15) the installed onnx knows to be those versions. The nodes the
rewrites add exist at every one of these opsets (``ReduceSum`` takes its axes as an
attribute before opset 13 and as an input from 13 on). A model outside this range
raises :class:`ValueError` when it holds a node to rewrite. Nodes inside subgraphs
(``If``, ``Loop``, ``Scan`` bodies) are not rewritten: one in training mode raises
:class:`ValueError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .._names import BATCH, SAMPLE_WEIGHT

__all__ = [
    "METADATA_KEY",
    "DropoutMask",
    "RunState",
    "RunningStatistic",
    "TrainingMode",
    "describe",
    "draw_masks",
    "inference_mode",
    "keep_outputs",
    "training_mode",
    "training_nodes",
]

#: The versions of the two operators the rewrites know: ``since_version`` of each
#: operator's schema at the model's opset (7, 10, 12, 13, 22 for Dropout; 9, 14, 15
#: for BatchNormalization).
_KNOWN_VERSIONS = {"Dropout": (7, 10, 12, 13, 22), "BatchNormalization": (9, 14, 15)}
_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass(frozen=True)
class DropoutMask:
    """The mask of one rewritten ``Dropout`` node, a graph input of the training-mode model.

    Attributes
    ----------
    input : str
        Name of the new graph input holding the mask: 0 for a dropped value,
        ``1 / (1 - ratio)`` for a kept one (inverted dropout, as torch and ONNX).
    node : str
        The ``Dropout`` node's name (its first output's name when it has none).
    ratio : float
        The probability of dropping a value.
    shape : tuple
        The mask's shape (the shape of the node's input): None for the first
        (batch) dimension, ints elsewhere.
    dtype : numpy.dtype
        The mask's element type (the node's input's).
    """

    input: str
    node: str
    ratio: float
    shape: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class RunningStatistic:
    """A running mean or variance of a rewritten ``BatchNormalization`` node.

    Attributes
    ----------
    initializer : str
        The initializer (or graph input) holding the running mean or variance the
        node reads (through ``Identity`` nodes, if any).
    output : str
        The new graph output holding its value updated by this batch:
        ``running * momentum + batch_statistic * (1 - momentum)``, or the running
        value unchanged when the batch has no real row.
    """

    initializer: str
    output: str


@dataclass
class TrainingMode:
    """What :func:`training_mode` gives: the rewritten model and what it needs at each step.

    Attributes
    ----------
    model : onnx.ModelProto
        The rewritten copy. Its inputs are the original ones, then
        :data:`~onnxgrad_sklearn._names.SAMPLE_WEIGHT` (when a BatchNormalization
        was rewritten and the model did not declare it), then one mask per
        Dropout; its outputs are the original ones in their order, then one per
        running statistic.
    masks : list of DropoutMask
        The masks to feed (:func:`draw_masks`), in node order.
    statistics : list of RunningStatistic
        The running means and variances, each node's mean then variance, in node
        order.
    rows : str or None
        The name of the ``(batch,)`` input whose entries that are not positive mark
        the rows left out of the batch statistics (padding rows, rows of weight
        0): :data:`~onnxgrad_sklearn._names.SAMPLE_WEIGHT` when a
        BatchNormalization was rewritten, None otherwise.
    """

    model: onnx.ModelProto
    masks: list[DropoutMask] = field(default_factory=list)
    statistics: list[RunningStatistic] = field(default_factory=list)
    rows: str | None = None


# ---------------------------------------------------------------------------
# Reading the graph


def _opset(model: onnx.ModelProto) -> int:
    for opset in model.opset_import:
        if opset.domain in _DEFAULT_DOMAINS:
            return int(opset.version)
    raise ValueError("The model imports no opset of the default ONNX domain.")


def _is_default(node: onnx.NodeProto) -> bool:
    return node.domain in _DEFAULT_DOMAINS


def _attribute(node: onnx.NodeProto, name: str, default=None):
    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _label(node: onnx.NodeProto) -> str:
    return node.name or next((o for o in node.output if o), node.op_type)


def _is_training_batchnorm(node: onnx.NodeProto) -> bool:
    """A ``BatchNormalization`` computing batch statistics: ``training_mode=1`` or extra outputs."""
    if node.op_type != "BatchNormalization" or not _is_default(node):
        return False
    return bool(_attribute(node, "training_mode", 0)) or sum(1 for o in node.output if o) > 1


def _subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _check_subgraphs(graph: onnx.GraphProto, inside: bool = False) -> None:
    for node in graph.node:
        if inside and _is_default(node):
            if node.op_type == "Dropout" or _is_training_batchnorm(node):
                raise ValueError(
                    f"{node.op_type} node {_label(node)!r} is inside a subgraph (If, Loop, "
                    "Scan): only the main graph's nodes are rewritten for training."
                )
        for sub in _subgraphs(node):
            _check_subgraphs(sub, inside=True)


def training_nodes(model: onnx.ModelProto) -> tuple[list, list]:
    """The nodes :func:`training_mode` rewrites.

    Parameters
    ----------
    model : onnx.ModelProto
        The model (its main graph; subgraphs are not searched).

    Returns
    -------
    dropouts : list of onnx.NodeProto
        Every ``Dropout`` node, whatever its ``training_mode`` input says.
    batchnorms : list of onnx.NodeProto
        The ``BatchNormalization`` nodes in training mode: attribute
        ``training_mode=1`` (opset 14 and later) or more than one output (the
        running statistics, opsets 9 to 13). Both lists are in graph order.
    """
    nodes = list(model.graph.node)
    dropouts, batchnorms = _training_indices(nodes)
    return [nodes[i] for i in dropouts], [nodes[i] for i in batchnorms]


def _training_indices(nodes) -> tuple[list[int], list[int]]:
    """The indices of :func:`training_nodes`'s nodes in ``nodes``."""
    dropouts, batchnorms = [], []
    for i, node in enumerate(nodes):
        if node.op_type == "Dropout" and _is_default(node):
            dropouts.append(i)
        elif _is_training_batchnorm(node):
            batchnorms.append(i)
    return dropouts, batchnorms


def _check_versions(model: onnx.ModelProto, nodes) -> int:
    opset = _opset(model)
    for node in nodes:
        low = 7 if node.op_type == "Dropout" else 9
        if opset < low:
            raise ValueError(
                f"{node.op_type} node {_label(node)!r}: opset {opset} is not supported; the "
                f"training-mode rewrite handles {node.op_type} from opset {low} on."
            )
        try:
            since = onnx.defs.get_schema(node.op_type, opset).since_version
        except Exception as exc:  # noqa: BLE001 - an opset this onnx does not know
            raise ValueError(
                f"{node.op_type} node {_label(node)!r}: opset {opset} is unknown to onnx "
                f"{onnx.__version__}; the training-mode rewrite cannot check it."
            ) from exc
        if since not in _KNOWN_VERSIONS[node.op_type]:
            raise ValueError(
                f"{node.op_type} node {_label(node)!r}: version {since} of the operator (opset "
                f"{opset}) is newer than the training-mode rewrite knows "
                f"({_KNOWN_VERSIONS[node.op_type][-1]})."
            )
    return opset


class _Graph:
    """Names, producers, readers and inferred types of one graph, and new unique names."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.initializers = {i.name: i for i in graph.initializer}
        self.inputs = {i.name: i for i in graph.input}
        self.outputs = {o.name for o in graph.output}
        # The nodes as one list, so that they are told apart by their index there.
        self.nodes = list(graph.node)
        self.producer = {}  # tensor name: index of the node writing it
        self.readers = {}  # tensor name: indices of the nodes reading it (once per read)
        used = set(self.initializers) | set(self.inputs) | self.outputs
        used.update(v.name for v in graph.value_info)
        for i, node in enumerate(self.nodes):
            used.add(node.name)
            used.update(node.input)
            used.update(node.output)
            for name in node.output:
                self.producer[name] = i
            for name in node.input:
                self.readers.setdefault(name, []).append(i)
            for sub in _subgraphs(node):
                for name in _outer_names(sub):
                    self.readers.setdefault(name, []).append(i)
                    used.add(name)
        used.discard("")
        self.used = used

    def unique(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.used:
            k += 1
            name = f"{hint}_{k}"
        self.used.add(name)
        return name

    def needed(self, name: str) -> bool:
        """Whether a node or a graph output reads the tensor ``name``."""
        return bool(name) and (name in self.outputs or bool(self.readers.get(name)))

    def constant(self, name: str):
        """The value of ``name``: an initializer or a ``Constant``'s output (else None)."""
        name = self.through_identities(name)
        if name in self.initializers and name not in self.inputs:
            return numpy_helper.to_array(self.initializers[name])
        node = self.node(name)
        if node is not None and node.op_type == "Constant" and _is_default(node):
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t)
                if attr.name == "value_float":
                    return np.asarray(attr.f, dtype=np.float32)
                if attr.name == "value_int":
                    return np.asarray(attr.i, dtype=np.int64)
        return None

    def node(self, name: str):
        """The node writing the tensor ``name`` (None: an input, an initializer)."""
        i = self.producer.get(name)
        return None if i is None else self.nodes[i]

    def through_identities(self, name: str) -> str:
        """The tensor ``name`` copies through a chain of ``Identity`` nodes."""
        seen = set()
        while name not in seen:
            seen.add(name)
            node = self.node(name)
            if node is None or node.op_type != "Identity" or not _is_default(node):
                break
            name = node.input[0]
        return name


def _outer_names(graph: onnx.GraphProto) -> set:
    """The names the nodes of ``graph`` (and their subgraphs) read."""
    names = set()
    for node in graph.node:
        names.update(node.input)
        for sub in _subgraphs(node):
            names |= _outer_names(sub)
    return names


def _inferred(model: onnx.ModelProto) -> dict:
    """Shapes and element types by tensor name from onnx's shape inference (data propagated).

    Returns a dict of name to ``(elem_type, dims)``: ``dims`` a list of ints and
    symbol names (None: unknown), or None when the rank is unknown.
    """
    try:
        graph = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
    except Exception:  # noqa: BLE001 - then only the declared shapes are known
        graph = model.graph
    found = {}
    for init in model.graph.initializer:
        found[init.name] = (init.data_type, list(init.dims))
    for info in [*graph.input, *graph.value_info, *graph.output]:
        tensor = info.type.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                for d in tensor.shape.dim
            ]
        found[info.name] = (tensor.elem_type, dims)
    return found


# ---------------------------------------------------------------------------
# Writing nodes


class _Writer:
    """Adds nodes named from a prefix, and constants as initializers, to a rewrite."""

    def __init__(self, names: _Graph, prefix: str, opset: int):
        self.names = names
        self.prefix = prefix
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def op(self, op_type: str, *inputs: str, output: str | None = None, **attrs) -> str:
        out = output or self.names.unique(f"{self.prefix}/{op_type}_output")
        name = self.names.unique(f"{self.prefix}/{op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def const(self, value, dtype) -> str:
        name = self.names.unique(f"{self.prefix}/const")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def reduce_sum(self, x: str, axes, keepdims: int) -> str:
        """``ReduceSum`` over ``axes`` (None: all), its axes an input from opset 13 on."""
        if axes is None:
            return self.op("ReduceSum", x, keepdims=keepdims)
        if self.opset >= 13:
            return self.op("ReduceSum", x, self.const(list(axes), np.int64), keepdims=keepdims)
        return self.op("ReduceSum", x, axes=list(axes), keepdims=keepdims)


def _np_type(elem_type: int) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _float_type(elem_type: int, node: onnx.NodeProto, what: str) -> int:
    if elem_type not in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16):
        raise ValueError(
            f"{node.op_type} node {_label(node)!r}: the element type of {what} is not known "
            "(or not float16, float or double); export the model with static shapes."
        )
    return elem_type


# ---------------------------------------------------------------------------
# Training mode


def _dropout_ratio(node: onnx.NodeProto, names: _Graph, opset: int) -> float:
    if opset < 12:
        ratio = _attribute(node, "ratio", 0.5)
    elif len(node.input) > 1 and node.input[1]:
        value = names.constant(node.input[1])
        if value is None:
            raise ValueError(
                f"Dropout node {_label(node)!r}: its ratio {node.input[1]!r} is not a constant "
                "(an initializer or a Constant node)."
            )
        ratio = value.item()
    else:
        ratio = 0.5
    ratio = float(ratio)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"Dropout node {_label(node)!r}: ratio {ratio} is not in [0, 1].")
    return ratio


def _rewrite_dropout(node, names: _Graph, shapes: dict, opset: int):
    """The nodes replacing a Dropout in training mode, its mask and the mask's graph input."""
    label = _label(node)
    x = node.input[0]
    elem_type, dims = shapes.get(x, (0, None))
    if dims is None or not dims or any(not isinstance(d, int) for d in dims[1:]):
        raise ValueError(
            f"Dropout node {label!r}: the shape of its input {x!r} is not known beyond the "
            f"batch (first) dimension (inferred: {dims}); export the model with static shapes "
            "(only the batch dimension dynamic) so that its mask can be drawn."
        )
    elem_type = _float_type(elem_type, node, f"its input {x!r}")
    ratio = _dropout_ratio(node, names, opset)
    write = _Writer(names, label, opset)
    mask = names.unique(f"{label}/mask")
    write.op("Mul", x, mask, output=node.output[0])
    if len(node.output) > 1 and names.needed(node.output[1]):
        write.op("Cast", mask, output=node.output[1], to=TensorProto.BOOL)
    info = helper.make_tensor_value_info(mask, elem_type, [BATCH, *dims[1:]])
    spec = DropoutMask(mask, label, ratio, (None, *dims[1:]), _np_type(elem_type))
    return write, info, spec


def _statistic_source(index: int, k: int, names: _Graph, claimed: dict) -> str:
    """The initializer (or graph input) a BatchNormalization's running statistic reads."""
    node = names.nodes[index]
    label = _label(node)
    name = node.input[k]
    source = names.through_identities(name)
    if source not in names.initializers and source not in names.inputs:
        raise ValueError(
            f"BatchNormalization node {label!r}: its running statistic {name!r} is computed, "
            "not an initializer or a graph input: it cannot be updated."
        )
    chain = {name}
    current = name
    while current != source:
        current = names.node(current).input[0]
        chain.add(current)
    # Every reader of the chain's tensors is the chain itself or this node, at input k only.
    for tensor in chain:
        for i in names.readers.get(tensor, []):
            reader = names.nodes[i]
            if i == index:
                if [j for j, read in enumerate(node.input) if read == tensor] == [k]:
                    continue
            elif reader.op_type == "Identity" and reader.output[0] in chain:
                continue
            raise ValueError(
                f"BatchNormalization node {label!r}: its running statistic {source!r} is also "
                f"read by node {_label(reader)!r} (the legacy torch exporter merges "
                "initializers of equal values: give the running mean, running variance, "
                "weight and bias distinct values before exporting)."
            )
    if source in claimed:
        raise ValueError(
            f"BatchNormalization node {label!r}: its running statistic {source!r} is also one "
            f"of node {claimed[source]!r}'s."
        )
    claimed[source] = label
    return source


def _rewrite_batchnorm(index: int, names: _Graph, shapes: dict, opset: int, rows: str, claimed):
    """The nodes replacing a BatchNormalization in training mode, and its statistics."""
    node = names.nodes[index]
    label = _label(node)
    x, scale, bias, mean_in, var_in = node.input[:5]
    elem_type, dims = shapes.get(x, (0, None))
    if dims is None or len(dims) < 2:
        raise ValueError(
            f"BatchNormalization node {label!r}: the rank of its input {x!r} is not known "
            f"(inferred: {dims}); export the model with static shapes."
        )
    elem_type = _float_type(elem_type, node, f"its input {x!r}")
    dtype = _np_type(elem_type)
    stat_type = shapes.get(mean_in, (elem_type, None))[0] or elem_type
    stat_dtype = _np_type(stat_type)
    rank = len(dims)
    epsilon = float(_attribute(node, "epsilon", 1e-5))
    momentum = float(_attribute(node, "momentum", 0.9))
    sources = [_statistic_source(index, k, names, claimed) for k in (3, 4)]

    write = _Writer(names, label, opset)
    axes = [0, *range(2, rank)]
    broadcast = [-1] + [1] * (rank - 1)
    per_channel = [1, -1] + [1] * (rank - 2)
    # r: 1 for a real row, 0 for a padding row, shaped to broadcast over X.
    weight_type = shapes.get(rows, (elem_type, None))[0] or elem_type
    real = write.op("Greater", rows, write.const(0, _np_type(weight_type)))
    real = write.op("Cast", real, to=elem_type)
    real_b = write.op("Reshape", real, write.const(broadcast, np.int64))
    n_rows = write.reduce_sum(real, None, keepdims=0)
    spatial = dims[2:]
    if all(isinstance(d, int) for d in spatial):
        size = math.prod(spatial)
        count = n_rows if size == 1 else write.op("Mul", n_rows, write.const(size, dtype))
    else:
        shape = write.op("Shape", x)
        tail = write.op(
            "Slice",
            shape,
            write.const([2], np.int64),
            write.const([rank], np.int64),
            write.const([0], np.int64),
        )
        size = write.op("Cast", write.op("ReduceProd", tail, keepdims=0), to=elem_type)
        count = write.op("Mul", n_rows, size)
    # A batch without a real row divides by 1 (finite outputs) and keeps the running values.
    count = write.op("Max", count, write.const(1, dtype))
    total = write.reduce_sum(write.op("Mul", x, real_b), axes, keepdims=1)
    mean = write.op("Div", total, count)
    centered = write.op("Sub", x, mean)
    squares = write.op("Mul", write.op("Mul", centered, centered), real_b)
    var = write.op("Div", write.reduce_sum(squares, axes, keepdims=1), count)
    std = write.op("Sqrt", write.op("Add", var, write.const(epsilon, dtype)))
    normalized = write.op("Div", centered, std)
    shape_c = write.const(per_channel, np.int64)
    scaled = write.op("Mul", normalized, write.op("Reshape", scale, shape_c))
    write.op("Add", scaled, write.op("Reshape", bias, shape_c), output=node.output[0])

    flat = write.const([-1], np.int64)
    batch_stats = []
    for stat in (mean, var):
        stat = write.op("Reshape", stat, flat)
        if stat_type != elem_type:
            stat = write.op("Cast", stat, to=stat_type)
        batch_stats.append(stat)
    any_real = write.op("Greater", n_rows, write.const(0, dtype))
    keep = write.const(momentum, stat_dtype)
    take = write.const(1.0 - momentum, stat_dtype)
    statistics, infos = [], []
    extra = list(node.output[1:])
    for k, (running, batch_stat, source) in enumerate(zip((mean_in, var_in), batch_stats, sources)):
        updated = write.op("Add", write.op("Mul", running, keep), write.op("Mul", batch_stat, take))
        output = names.unique(f"{source}_updated")
        write.op("Where", any_real, updated, running, output=output)
        statistics.append(RunningStatistic(source, output))
        channels = shapes.get(source, (stat_type, None))[1]
        infos.append(helper.make_tensor_value_info(output, stat_type, channels))
        if k < len(extra) and names.needed(extra[k]):
            write.op("Identity", output, output=extra[k])
    # Opsets 9 to 13: saved_mean and saved_var, the batch's mean and (population) variance.
    for k, batch_stat in ((2, batch_stats[0]), (3, batch_stats[1])):
        if k < len(extra) and names.needed(extra[k]):
            write.op("Identity", batch_stat, output=extra[k])
    return write, statistics, infos


def _remove_unread(model: onnx.ModelProto, names) -> None:
    """Remove the Constant nodes and initializers among ``names`` no node or output reads now."""
    graph = model.graph
    read = _outer_names(graph) | {o.name for o in graph.output}
    inputs = {i.name for i in graph.input}
    gone = {n for n in names if n and n not in read}
    if not gone:
        return
    keep = [
        n
        for n in graph.node
        if not (n.op_type == "Constant" and _is_default(n) and set(n.output) <= gone)
    ]
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    for init in [i for i in graph.initializer if i.name in gone and i.name not in inputs]:
        graph.initializer.remove(init)


def _rows_input(names, shapes, first) -> list:
    """The declaration of the rows' weights (:data:`SAMPLE_WEIGHT`, ``(batch,)`` in the
    type of the input of ``first``, a BatchNormalization) the rewrite adds, or none when
    the model declares them."""
    rows = SAMPLE_WEIGHT
    if rows in names.inputs:
        return []
    if rows in names.used:
        raise ValueError(
            f"The model has a tensor named {rows!r} that is not a graph input: the "
            "BatchNormalization rewrite needs that name for the rows' weights."
        )
    x = first.input[0]
    elem_type = _float_type(shapes.get(x, (0, None))[0], first, f"input {x!r}")
    names.used.add(rows)
    shapes[rows] = (elem_type, [BATCH])
    return [helper.make_tensor_value_info(rows, elem_type, [BATCH])]


def training_mode(model: onnx.ModelProto) -> TrainingMode:
    """Rewrite Dropout and BatchNormalization in training mode into differentiable operators.

    Every ``Dropout`` drops, whatever its ``training_mode`` input says:
    ``Y = X * mask``, the mask a new graph input of ``X``'s shape (its first
    dimension named :data:`~onnxgrad_sklearn._names.BATCH`) holding 0 or
    ``1 / (1 - ratio)`` (:func:`draw_masks`); its optional mask output, when read,
    is ``Cast(mask, to=bool)``. ``X``'s shape comes from onnx's shape inference
    (with data propagation).

    Every ``BatchNormalization`` in training mode (see :func:`training_nodes`)
    normalizes ``X`` of shape ``(N, C, d1, ...)`` with the statistics of the
    batch's real rows, ``r = (sample_weight > 0)``: with
    ``count = sum(r) * d1 * ...``, ``mean = sum(X * r) / count`` and
    ``var = sum((X - mean)**2 * r) / count`` over every axis but 1 (the
    population variance, ONNX's convention),
    ``Y = (X - mean) / sqrt(var + epsilon) * scale + B``. Its running mean and
    variance are updated as ONNX specifies,
    ``running * momentum + statistic * (1 - momentum)`` (the same population
    variance; torch updates with the sample variance), and kept when the batch has
    no real row. Each updated value is a new graph output
    (:class:`RunningStatistic`); the node's own running-statistic outputs, where
    read, give the same values. ``sample_weight`` is declared as an input of shape
    ``(batch,)`` in ``X``'s type unless the model declares it.

    BatchNormalization in inference mode and every other node are left as they are.

    Parameters
    ----------
    model : onnx.ModelProto
        The model, not modified.

    Returns
    -------
    TrainingMode
        The rewritten copy, its masks, its running statistics and its rows input.

    Raises
    ------
    ValueError
        When a Dropout's input shape is not known beyond the batch dimension (or a
        BatchNormalization's input rank), a ratio is not constant, a running
        statistic is not an initializer of its own (merged with another by the
        exporter), a node is inside a subgraph, or the model's opset is out of the
        supported range (see the module's docstring).
    """
    _check_subgraphs(model.graph)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    names = _Graph(graph)
    dropouts, batchnorms = _training_indices(names.nodes)
    if not dropouts and not batchnorms:
        return TrainingMode(result)
    opset = _check_versions(model, [names.nodes[i] for i in [*dropouts, *batchnorms]])
    shapes = _inferred(model)

    rows = SAMPLE_WEIGHT if batchnorms else None
    rows_input = _rows_input(names, shapes, names.nodes[batchnorms[0]]) if batchnorms else []
    replaced, masks, mask_inputs, statistics, stat_outputs, initializers = {}, [], [], [], [], []
    dropped = set()
    claimed = {}
    for i in dropouts:
        node = names.nodes[i]
        write, info, spec = _rewrite_dropout(node, names, shapes, opset)
        replaced[i] = write.nodes
        initializers += write.initializers
        mask_inputs.append(info)
        masks.append(spec)
        dropped.update(node.input[1:])
    for i in batchnorms:
        write, stats, infos = _rewrite_batchnorm(i, names, shapes, opset, rows, claimed)
        replaced[i] = write.nodes
        initializers += write.initializers
        statistics += stats
        stat_outputs += infos

    nodes = []
    for i, node in enumerate(names.nodes):
        nodes.extend(replaced.get(i, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)
    graph.input.extend(rows_input + mask_inputs)
    graph.output.extend(stat_outputs)
    _remove_unread(result, dropped)
    return TrainingMode(result, masks, statistics, rows)


# ---------------------------------------------------------------------------
# Inference mode


def inference_mode(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` to predict with: Dropout as Identity, BatchNormalization as inference.

    Each ``Dropout`` becomes ``Identity`` of its input (its mask output, where
    read, all true: ``ConstantOfShape(Shape(X))``). Each ``BatchNormalization``
    in training mode gets ``training_mode=0`` (where it has the attribute) and only
    its first output: an extra output that was a graph output is no longer one,
    and the running mean and variance outputs, where a node reads them, are the
    running values it was given (unchanged).

    Parameters
    ----------
    model : onnx.ModelProto
        The model, not modified.

    Returns
    -------
    onnx.ModelProto
        The rewritten copy.

    Raises
    ------
    ValueError
        When a node reads the saved mean or variance output of a BatchNormalization
        (opsets 9 to 13), or a node to rewrite is inside a subgraph.
    """
    _check_subgraphs(model.graph)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    names = _Graph(graph)
    dropouts, batchnorms = _training_indices(names.nodes)
    if not dropouts and not batchnorms:
        return result
    opset = _opset(model)
    replaced, dropped, removed_outputs = {}, set(), set()
    for i in dropouts:
        node = names.nodes[i]
        label = _label(node)
        write = _Writer(names, label, opset)
        write.op("Identity", node.input[0], output=node.output[0])
        if len(node.output) > 1 and names.needed(node.output[1]):
            shape = write.op("Shape", node.input[0])
            true = helper.make_tensor("true", TensorProto.BOOL, [1], [True])
            write.op("ConstantOfShape", shape, output=node.output[1], value=true)
        replaced[i] = write.nodes
        dropped.update(node.input[1:])
    for i in batchnorms:
        node = names.nodes[i]
        label = _label(node)
        write = _Writer(names, label, opset)
        new = onnx.NodeProto()
        new.CopyFrom(node)
        del new.output[1:]
        for attr in new.attribute:
            if attr.name == "training_mode":
                attr.i = 0
        write.nodes.append(new)
        for k, name in enumerate(node.output[1:], start=1):
            if not name:
                continue
            removed_outputs.add(name)
            if names.readers.get(name):
                if k > 2:
                    reader = names.nodes[names.readers[name][0]]
                    raise ValueError(
                        f"BatchNormalization node {label!r}: node {_label(reader)!r} reads its "
                        f"saved statistic {name!r}, which inference mode does not compute."
                    )
                write.op("Identity", node.input[k + 2], output=name)
                removed_outputs.discard(name)
        replaced[i] = write.nodes
    nodes = []
    for i, node in enumerate(names.nodes):
        nodes.extend(replaced.get(i, [node]))
    del graph.node[:]
    graph.node.extend(nodes)
    for output in [o for o in graph.output if o.name in removed_outputs]:
        graph.output.remove(output)
    _remove_unread(result, dropped)
    return result


# ---------------------------------------------------------------------------
# Masks


def draw_masks(masks, batch: int, rng: np.random.RandomState) -> dict:
    """Fresh dropout masks for one step.

    For each mask in order, with ``shape = (batch, *mask.shape[1:])``: a ratio of 0
    gives ones and a ratio of 1 zeros, drawing nothing; otherwise
    ``(rng.random_sample(shape) >= ratio) / (1 - ratio)`` (computed in float64,
    then cast to the mask's dtype), drawing ``prod(shape)`` uniform numbers in C
    order. The same ``rng`` state and masks give the same arrays.

    Parameters
    ----------
    masks : sequence of DropoutMask
        :attr:`TrainingMode.masks`.
    batch : int
        The rows of the step (padding rows included).
    rng : numpy.random.RandomState
        Drawn from in the order of ``masks``.

    Returns
    -------
    dict of str to numpy.ndarray
        The arrays by input name (:attr:`DropoutMask.input`).
    """
    drawn = {}
    for mask in masks:
        shape = (int(batch), *mask.shape[1:])
        if mask.ratio <= 0.0:
            value = np.ones(shape, dtype=mask.dtype)
        elif mask.ratio >= 1.0:
            value = np.zeros(shape, dtype=mask.dtype)
        else:
            keep = rng.random_sample(shape) >= mask.ratio
            value = (keep / (1.0 - mask.ratio)).astype(mask.dtype)
        drawn[mask.input] = value
    return drawn


# ---------------------------------------------------------------------------
# Gradient graphs


def keep_outputs(gradient_model: onnx.ModelProto, forward_model: onnx.ModelProto, names) -> int:
    """Make the tensors ``names`` of ``forward_model`` outputs of ``gradient_model``, in place.

    ``onnx_ad.reverse`` (0.3.0) keeps the forward graph's nodes and outputs as the
    start of the gradient graph, so the running statistics of :func:`training_mode`
    are outputs already: a name already an output is left as it is. A name that is
    not one (a later pass removed it) is appended with the forward model's type,
    when a node of the gradient graph still computes it.

    Parameters
    ----------
    gradient_model : onnx.ModelProto
        The gradient graph, modified in place.
    forward_model : onnx.ModelProto
        The graph it was made from (for the outputs' types).
    names : iterable of str
        The forward graph's outputs to keep (:attr:`RunningStatistic.output`).

    Returns
    -------
    int
        The number of outputs appended.

    Raises
    ------
    ValueError
        When no node of the gradient graph computes one of ``names``.
    """
    graph = gradient_model.graph
    present = {o.name for o in graph.output}
    produced = {name for node in graph.node for name in node.output}
    infos = {o.name: o for o in forward_model.graph.output}
    added = 0
    for name in names:
        if name in present:
            continue
        if name not in produced:
            raise ValueError(f"No node of the gradient graph computes {name!r}.")
        info = infos.get(name) or helper.make_empty_tensor_value_info(name)
        graph.output.append(info)
        present.add(name)
        added += 1
    return added


# ---------------------------------------------------------------------------
# At run time

#: The training graph's metadata key describing its training-mode inputs and outputs.
METADATA_KEY = "onnxgrad_sklearn.training_mode"


class RunState:
    """What a training-mode graph reads and writes at each step besides the batch.

    The dropout masks, drawn afresh for each step from a random state of their own
    (:meth:`seed`, from the fit's ``random_state``), and the running statistics: the
    values a step reads (:attr:`current`) and the values it writes (its outputs), which
    become the current ones when the step is kept (:meth:`commit`); :meth:`undo` goes
    back one step.

    Parameters
    ----------
    masks : list of DropoutMask
        The graph's mask inputs.
    statistics : list of RunningStatistic
        The running statistics: an input (the initializer's name) and an output each.
    start : list of numpy.ndarray
        The starting value of each statistic.
    """

    def __init__(self, masks, statistics, start):
        self.masks = list(masks)
        self.statistics = list(statistics)
        self.current = [np.array(v, copy=True) for v in start]
        self._next = [np.empty_like(v) for v in self.current]
        self._previous = None
        self.rng = np.random.RandomState(0)

    @classmethod
    def from_meta(cls, meta: dict, start) -> RunState:
        """The state of a graph described by :func:`describe` (``start``: the statistics'
        values)."""
        masks = [
            DropoutMask(m[0], m[1], float(m[2]), tuple(m[3]), np.dtype(m[4]))
            for m in meta.get("masks", [])
        ]
        stats = [RunningStatistic(s[0], s[1]) for s in meta.get("statistics", [])]
        return cls(masks, stats, start)

    def seed(self, seed: int) -> None:
        """Draw the next masks from ``RandomState(seed)``."""
        self.rng = np.random.RandomState(seed)

    def step_inputs(self, batch: int, train: bool = True) -> dict:
        """The masks (fresh draws; all ones without ``train``) and the current
        statistics, by input name."""
        if train:
            feeds = draw_masks(self.masks, batch, self.rng)
        else:
            feeds = {
                m.input: np.ones((int(batch), *m.shape[1:]), dtype=m.dtype) for m in self.masks
            }
        feeds.update((s.initializer, v) for s, v in zip(self.statistics, self.current))
        return feeds

    def step_outputs(self) -> dict:
        """The arrays a step writes its updated statistics into, by output name."""
        return {s.output: v for s, v in zip(self.statistics, self._next)}

    def bind(self, binding, batch: int) -> list:
        """Bind fresh masks and the statistics a step reads and writes to ``binding``
        (an IO binding: CPU values, copied to the device when bound); return the arrays
        and views bound, to keep alive until the run returns (a view does not hold its
        array)."""
        from ..runtime import ortvalue_view

        alive = []
        for name, value in self.step_inputs(batch).items():
            view = ortvalue_view(value)
            alive.extend((value, view))
            binding.bind_ortvalue_input(name, view)
        for name, value in self.step_outputs().items():
            view = ortvalue_view(value)
            alive.extend((value, view))
            binding.bind_ortvalue_output(name, view)
        return alive

    def commit(self) -> None:
        """The step is kept: its statistics become the current ones."""
        self._previous = self.current
        self.current, self._next = self._next, [np.empty_like(v) for v in self._next]

    def undo(self) -> None:
        """Back to the statistics before the last kept step (once)."""
        if self._previous is not None:
            self.current, self._previous = self._previous, None

    def get(self) -> dict:
        """Copies of the statistics by initializer name, and the masks' random state."""
        return {
            "statistics": {s.initializer: v.copy() for s, v in zip(self.statistics, self.current)},
            "mask_random_state": self.rng.get_state(),
        }

    def set(self, saved: dict) -> None:
        """Restore what :meth:`get` returned."""
        stats = saved.get("statistics", {})
        self.current = [
            np.array(stats.get(s.initializer, v), dtype=v.dtype, copy=True)
            for s, v in zip(self.statistics, self.current)
        ]
        self._previous = None
        if saved.get("mask_random_state") is not None:
            self.rng.set_state(saved["mask_random_state"])


def describe(masks, statistics) -> dict:
    """The training graph's metadata (:data:`METADATA_KEY`) for its masks and statistics."""
    return {
        "masks": [
            [m.input, m.node, float(m.ratio), list(m.shape), np.dtype(m.dtype).str] for m in masks
        ],
        "statistics": [[s.initializer, s.output] for s in statistics],
    }
