"""The standard-ONNX backend: onnx-ad gradient graphs on any onnxruntime.

The gradient graph comes from ``onnx_ad.reverse`` (standard ONNX operators, no
training kernels) on the training graph with the weights as inputs and the
batch dimension fixed (one graph per batch size met, a handful in a fit). The
passes of :mod:`onnxgrad_sklearn._passes` and
:mod:`onnxgrad_sklearn.backends.standard_passes` follow: the seed made a constant,
nodes no output needs removed, seed-axis transposes made reshapes, batch sums
made matrix products, and the optimizer's update rule merged in. One call of
the session through IO binding then runs forward, loss, backward and update,
reading one set of :class:`~onnxgrad_sklearn.backends.buffers.DoubleBuffers` (CPU) or
:class:`~onnxgrad_sklearn.backends.buffers.DeviceBuffers` (CUDA: device memory bound by
address) and writing another: nothing is allocated per batch and undoing the
last step is free. A batch with a non-finite loss must leave the set the undo goes
back to as it was: small models keep a third set to write into; from
:data:`TWO_SETS_FROM` weights on, the update is applied only after a finite loss
(:func:`guard_update`, an ``If`` in the graph) and two sets are enough.

The step graph of each batch shape is a training artifact of its own, keyed by the
fit's plan (:class:`~onnxgrad_sklearn.backends.Plan`) and the batch shape: a fit
finding them imports neither onnx nor onnx-ad, and its sessions are the process's,
shared with the other fits of the structure (the weights, state, batch, learning
rate and penalty coefficients are bound by each fit).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from .. import artifacts
from .._lazy import lazy
from .._names import BATCH, LOSS, PENALTY_INPUTS, SAMPLE_WEIGHT, TARGETS, UPDATE, Y_TRUE
from ..runtime import (
    LARGE_MODEL,
    bindings,
    import_onnxruntime,
    input_array,
    ort_device,
    ortvalue_view,
    to_ortvalue,
)
from .base import (
    Backend,
    LastBatch,
    all_finite,
    batch_key,
    warn,
    zero_derivative_warning,
)
from .buffers import (
    PIECES_DISABLED_OPTIMIZERS,
    UPDATE_PIECE,
    DeviceBuffers,
    DoubleBuffers,
    pieces,
)

# imported on first use: a fit whose graphs are cached imports neither
onnx = lazy("onnx")
onnx_ad = lazy("onnx_ad")

if TYPE_CHECKING:
    import onnxruntime

__all__ = [
    "DEVICE_BUFFERS_ON_CPU",
    "StandardBackend",
    "gradient_graph",
    "step_graph",
    "unsupported_ops",
]

logger = logging.getLogger("onnxgrad_sklearn")

SEED = "adj_loss"
#: onnxruntime graph optimizers turned off for double graphs: they emit operators
#: that have float32 kernels only.
DOUBLE_DISABLED_OPTIMIZERS = ["MatmulTransposeFusion", "MatMulScaleFusion"]
#: Graphs kept per kind (batch sizes); a fit meets one or two.
_CACHED = 4
#: From this many weights on, a fit keeps two sets of weights and optimizer state
#: instead of three, its step graph applying the update only after a finite loss
#: (:func:`guard_update`): one set fewer (8 MB per million weights and state
#: vector), for about 5 us per step that the ``If`` costs, which only small models,
#: whose steps take tens of microseconds, would notice.
TWO_SETS_FROM = LARGE_MODEL
#: Elements of a piece of the update of a model of :data:`TWO_SETS_FROM` weights or
#: more on the CPU (:func:`step_graph`'s ``chunk``): the update's temporaries and
#: the gradients' concatenation are then about a megabyte instead of three times the
#: weights' size. 0: one flat update.
STEP_UPDATE_CHUNK = UPDATE_PIECE


def memory_pattern_grows() -> bool:
    """Whether the runtime's memory pattern would double a large step's memory on the CPU.

    From the second run on, onnxruntime allocates the whole plan of a run in one
    block: measured on a 100-2048-2048-1 MLP's step, onnxruntime 1.32 keeps that
    block besides what the first run allocated (11.4 against 6.9 times the weights'
    size, for the same step time), while 1.19 (the training build) reuses it (5.6
    with the pattern, 5.7 without). Small models keep the pattern either way: without
    it a 10-64-1 step takes 36 us instead of 30.
    """
    version = getattr(import_onnxruntime(), "__version__", "0")
    parts = [int(p) if p.isdigit() else 0 for p in version.split("+")[0].split(".")[:2]]
    return tuple(parts) >= (1, 20)


#: Train CPU fits through the device code path
#: (:class:`~onnxgrad_sklearn.backends.buffers.DeviceBuffers` in runtime memory, bound
#: by address, everything rebound at each call) instead of
#: numpy buffers: the code CUDA runs, for tests on machines without a GPU.
DEVICE_BUFFERS_ON_CPU = False


def gradient_graph(
    graph: onnx.ModelProto, weight_names, batch: int, targets: int | None = None
) -> onnx.ModelProto:
    """Return the loss and its gradients (``adj_<weight>``, trailing seed axis of 1).

    Parameters
    ----------
    graph : onnx.ModelProto
        Training graph with the weights as inputs (not modified).
    weight_names : list of str
        Inputs to differentiate.
    batch : int
        Size given to the batch dimension.
    targets : int, optional
        Size given to the width of ``y_true`` where it is a symbol.

    Raises
    ------
    ValueError
        When onnx-ad has no rule for an operator on the differentiated path.
    """
    from .._passes import constant_input, fix_dimension, pin_versions
    from .standard_passes import rewrite_sigmoid_adjoints

    fixed = onnx.ModelProto()
    fixed.CopyFrom(graph)
    fix_dimension(fixed, BATCH, batch)
    if targets is not None:
        fix_dimension(fixed, TARGETS, targets)
    try:
        grad = onnx_ad.reverse(fixed, inputs=list(weight_names), outputs=[LOSS], layout="onnx")
    except onnx_ad.UnsupportedOperator as exc:
        raise ValueError(
            f"backend='standard' cannot differentiate the training graph: onnx-ad "
            f"{onnx_ad.__version__} says: {exc}. Write the loss or the model with other "
            "operators, or try backend='agent'."
        ) from exc
    rewrite_sigmoid_adjoints(grad)
    seed = next(i for i in grad.graph.input if i.name == SEED).type.tensor_type.elem_type
    constant_input(grad, SEED, np.ones(1, dtype=onnx.helper.tensor_dtype_to_np_dtype(seed)))
    fix_dimension(grad, "nadj", 1)
    pin_versions(grad)
    return grad


def unsupported_ops(training: onnx.ModelProto, weight_names) -> list[str]:
    """Operators on the differentiated path of ``training`` onnx-ad has no rule for.

    Operators outside the default domain, and default-domain operators that have
    neither a rule nor a function body in the ONNX specification (which onnx-ad
    expands). Sorted, ``domain:op`` outside the default domain.
    """
    from onnx_ad import rules

    from .._passes import differentiated_nodes

    found = set()
    for node in differentiated_nodes(training, weight_names, LOSS):
        if node.domain not in ("", "ai.onnx"):
            found.add(f"{node.domain}:{node.op_type}")
        elif node.op_type not in rules.REVERSE:
            try:
                schema = onnx.defs.get_schema(node.op_type)
            except onnx.defs.SchemaError:
                found.add(node.op_type)
                continue
            if not (schema.has_function or schema.has_context_dependent_function):
                found.add(node.op_type)
    return sorted(found)


def _simplify(model: onnx.ModelProto) -> None:
    """The passes on a gradient or step graph, in place.

    The shapes are inferred once: the first rewrites keep the names and shapes of
    the tensors they replace, and the leading sums record the shapes of those they
    make (same graphs as with a second inference on the 12 graphs checked).
    """
    from .._passes import drop_identities, merge_duplicate_nodes, prune, static_shapes
    from .standard_passes import (
        fold_shape_computations,
        merge_maxpool_indices,
        rewrite_broadcast_expands,
        rewrite_leading_sums,
        rewrite_maxpool_scatters,
        rewrite_noop_expands,
        rewrite_repeated_terms,
        rewrite_reshape_chains,
        rewrite_scaled_expands,
        rewrite_sum_of_squares,
        rewrite_unit_reductions,
        rewrite_unit_transposes,
        rewrite_weight_gradient_convs,
    )

    prune(model)
    folded = fold_shape_computations(model)
    shapes = static_shapes(model)
    counts = {
        "folded shapes": folded,
        "weight-gradient convolutions": rewrite_weight_gradient_convs(model, shapes),
        "unit transposes": rewrite_unit_transposes(model, shapes),
        "no-op expands": rewrite_noop_expands(model, shapes),
        "broadcast expands": rewrite_broadcast_expands(model, shapes),
        "scaled expands": rewrite_scaled_expands(model, shapes),
        "max-pool scatters": rewrite_maxpool_scatters(model, shapes),
        "max-pool indices": merge_maxpool_indices(model),
        "unit reductions": rewrite_unit_reductions(model, shapes),
        "identities": drop_identities(model),
        "duplicates": merge_duplicate_nodes(model),
        "sums of squares": rewrite_sum_of_squares(model),
    }
    counts["repeated terms"] = rewrite_repeated_terms(model, shapes)
    counts["leading sums"] = rewrite_leading_sums(model, shapes)
    counts["reshape chains"] = rewrite_reshape_chains(model, shapes)
    counts["identities"] += drop_identities(model)
    counts["pruned"] = prune(model)
    logger.debug("standard backend passes: %s", counts)
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"N{i}"


def step_graph(
    graph: onnx.ModelProto,
    weight_names,
    shapes,
    optimizer,
    batch: int,
    targets: int | None = None,
    pads=None,
    guard: bool = False,
    forward_outputs=(),
    chunk: int | None = None,
) -> tuple[onnx.ModelProto, bool]:
    """Return the fused training step for one batch size, and whether it updates flat vectors.

    Inputs: the batch, the weights (by name), ``update/learning_rate`` and the
    optimizer state; for an element-wise rule ``update/param`` (all weights end
    to end) and ``update/<state>`` vectors, else ``update/<state>_<i>`` per weight.
    Outputs: ``loss`` and ``update/new_param`` / ``update/new_<state>`` (flat) or
    ``update/new_param_<i>`` / ``update/new_<state>_<i>`` (per weight).

    ``pads[i]`` (flat rules only): unused elements after weight ``i`` in the
    vectors (:class:`~onnxgrad_sklearn.backends.buffers.DeviceBuffers` aligns each weight);
    their gradient is zero, so an element-wise rule leaves them as they are.

    ``guard=True``: the backward pass and the update run only after a finite loss
    (:func:`guard_update`), with an input ``update/kept_<x>`` per output.

    ``forward_outputs``: outputs of the training graph the step also gives (the running
    statistics of a BatchNormalization in training mode), computed by the forward pass.

    ``chunk`` (flat rules without ``pads``): the update runs over pieces of at most
    ``chunk`` elements (:func:`~onnxgrad_sklearn.backends.buffers.pieces`), with
    inputs ``update/param_<j>``, ``update/<state>_<j>`` and outputs
    ``update/new_param_<j>``, ``update/new_<state>_<j>`` per piece ``j``, bound to
    views of the vectors: no concatenation of the gradients, and the update's
    temporaries are a piece's (:data:`STEP_UPDATE_CHUNK`). The same values: the rule
    is element-wise.

    Built at each call (onnx-ad and the passes): :class:`StandardBackend` keeps what
    it builds as a training artifact.
    """
    from .._graph import model_dtype
    from .._passes import merge_update, piece_gradients

    flat = bool(optimizer.elementwise)
    dtype = model_dtype(graph)
    pads = pads if flat and pads is not None and any(pads) else None
    spans = pieces(shapes, chunk) if flat and chunk and pads is None else None
    if spans:  # each piece a weight of its own to the rule
        layout = [(n,) for _, _, n in spans]
    elif pads:  # the padding as weights of their own, between the real ones
        layout = []
        for shape, pad in zip(shapes, pads):
            layout.extend([shape, (pad,)] if pad else [shape])
    else:
        layout = list(shapes)
    # an optimizer of its own may not take a dtype
    kwargs = {} if dtype == np.float32 else {"dtype": dtype}
    update = optimizer.build_update_model(layout, flat=flat and not spans, **kwargs)
    grad = gradient_graph(graph, weight_names, batch, targets)
    kept = [o for o in grad.graph.output[1:] if o.name in set(forward_outputs)]
    adjoints = [o.name for o in grad.graph.output[1:] if o.name not in set(forward_outputs)]
    del grad.graph.output[1:]
    if spans:
        connect = piece_gradients(grad, adjoints, spans, prefix=UPDATE)
    elif flat:  # the flat rule reshapes each gradient to a vector itself
        sources = _padded_gradients(grad, adjoints, pads, dtype)
        connect = {f"grad_{i}": a for i, a in enumerate(sources)}
    else:
        connect = _weight_gradients(grad, adjoints, shapes, weight_names)
    merge_update(grad, update, connect, prefix=UPDATE)
    grad.graph.output.extend(kept)
    _simplify(grad)
    if guard:
        guard_update(grad, forward_outputs)
    return grad, flat


def _padded_gradients(grad: onnx.ModelProto, adjoints, pads, dtype) -> list[str]:
    """The gradients with, after weight ``i``, ``pads[i]`` zeros (a constant of ``grad``)."""
    if pads is None:
        return list(adjoints)
    sources = []
    for a, pad in zip(adjoints, pads):
        sources.append(a)
        if pad:
            zeros = f"padding_gradient_{pad}"
            if zeros not in {init.name for init in grad.graph.initializer}:
                grad.graph.initializer.append(
                    onnx.numpy_helper.from_array(np.zeros(pad, dtype=dtype), zeros)
                )
            sources.append(zeros)
    return sources


def _weight_gradients(grad: onnx.ModelProto, adjoints, shapes, weight_names) -> dict[str, str]:
    """Connect a rule that is not element-wise to each gradient in its weight's shape,
    and to the weight itself."""
    connect = {}
    for i, (a, shape) in enumerate(zip(adjoints, shapes)):
        target = f"{a}_shape"
        grad.graph.initializer.append(
            onnx.numpy_helper.from_array(np.array(shape, dtype=np.int64), target)
        )
        grad.graph.node.append(onnx.helper.make_node("Reshape", [a, target], [f"{a}_w"]))
        connect[f"grad_{i}"] = f"{a}_w"
        connect[f"param_{i}"] = weight_names[i]
    return connect


def _constant_names(model) -> set:
    """The inputs of a training graph a fit gives once (the penalty's coefficients)."""
    return {i.name for i in model.graph.input} & set(PENALTY_INPUTS)


def kept_name(output: str) -> str:
    """The input of the step graph holding what ``output`` keeps after a non-finite loss."""
    return output.replace(UPDATE + "new_", UPDATE + "kept_", 1)


def guard_update(model: onnx.ModelProto, forward_outputs=()) -> None:
    """Apply the update only when the loss is finite, in place (an ``If`` on the loss).

    The nodes the loss does not need (the backward pass and the update) move
    into the ``then`` branch of an ``If`` whose condition is ``loss - loss == 0``
    (false for an infinite or NaN loss): a non-finite loss costs no backward
    pass. The ``else`` branch returns, for each output ``update/new_<x>``, a new
    input ``update/kept_<x>``: the backend binds it to the very memory the output
    is written to, so a batch with a non-finite loss leaves the set it writes as it
    was. Two sets of buffers are then enough for the undo of the last step.
    onnxruntime writes a branch's outputs into the ``If``'s own (the bound
    buffers), and its ``Identity`` does not copy a tensor onto itself.
    """
    from .._passes import needed_nodes

    graph = model.graph
    targets = [o for o in graph.output if o.name != LOSS and o.name not in forward_outputs]
    names = {o.name for o in targets}
    # everything the loss does not need (the backward pass and the update) moves
    for_loss, _ = needed_nodes(graph, [LOSS, *forward_outputs])
    inside = [n for n, keep in zip(graph.node, for_loss) if not keep]
    outside = [n for n, keep in zip(graph.node, for_loss) if keep]
    renamed = {name: name + "_finite" for name in names}
    then_nodes = []
    for node in inside:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.input[:] = [renamed.get(i, i) for i in copy.input]
        copy.output[:] = [renamed.get(o, o) for o in copy.output]
        then_nodes.append(copy)
    missing = names - {o for n in inside for o in n.output}
    if missing:  # an update output the loss needs, or no node writes: not a step graph
        raise ValueError(
            f"guard_update: the outputs {sorted(missing)} are not computed after the loss."
        )

    def infos(suffix):
        out = []
        for o in targets:
            info = onnx.ValueInfoProto()
            info.CopyFrom(o)
            info.name = o.name + suffix
            out.append(info)
        return out

    then_branch = onnx.helper.make_graph(then_nodes, "finite_loss", [], infos("_finite"))
    else_nodes = [
        onnx.helper.make_node("Identity", [kept_name(o.name)], [o.name + "_kept"]) for o in targets
    ]
    else_branch = onnx.helper.make_graph(else_nodes, "non_finite_loss", [], infos("_kept"))
    for o in targets:
        info = onnx.ValueInfoProto()
        info.CopyFrom(o)
        info.name = kept_name(o.name)
        graph.input.append(info)
    loss_type = next(o for o in graph.output if o.name == LOSS).type.tensor_type.elem_type
    zero = UPDATE + "guard_zero"
    graph.initializer.append(
        onnx.numpy_helper.from_array(
            np.zeros((), dtype=onnx.helper.tensor_dtype_to_np_dtype(loss_type)), zero
        )
    )
    del graph.node[:]
    graph.node.extend(outside)
    graph.node.extend(_guard(zero, [o.name for o in targets], then_branch, else_branch))


def _guard(zero, outputs, then_branch, else_branch) -> list:
    """The nodes of the guard: ``If(loss - loss == zero)`` giving ``outputs`` from one
    branch or the other."""
    return [
        onnx.helper.make_node(
            "Sub", [LOSS, LOSS], [UPDATE + "loss_minus_loss"], name=UPDATE + "guard_sub"
        ),
        onnx.helper.make_node(
            "Equal",
            [UPDATE + "loss_minus_loss", zero],
            [UPDATE + "loss_is_finite"],
            name=UPDATE + "guard_finite",
        ),
        onnx.helper.make_node(
            "If",
            [UPDATE + "loss_is_finite"],
            outputs,
            name=UPDATE + "guard",
            then_branch=then_branch,
            else_branch=else_branch,
        ),
    ]


def pad_batch(pads: dict, sizes, X, y, sample_weight):
    """The batch as rows of a larger step graph already made, or as it is.

    The last batch of an epoch is smaller than the others when the batch size
    does not divide the rows: rather than a graph and a session of its own
    (onnx-ad, the passes and onnxruntime again, about 11 ms for a 100-256-256-1
    MLP, and one more arena), it is padded to the next size a graph exists
    for, the extra rows copies of its first one with a sample weight of zero:
    the loss and its gradients are sums weighted by the sample weights,
    divided by their sum, and a zero weight on a finite row adds zeros.
    ``sizes``: the ``(batch, targets)`` of the step graphs made; ``pads``: the
    padded batches' arrays by size, kept from call to call.
    """
    n, width = X.shape[0], y.shape[1]
    if (n, width) in sizes:
        return X, y, sample_weight
    larger = [size for size, w in sizes if w == width and size > n]
    if not larger:
        return X, y, sample_weight
    size = min(larger)
    key = size, width, X.shape[1:], X.dtype.str
    if key not in pads:
        pads[key] = (
            np.empty((size, *X.shape[1:]), X.dtype),
            np.empty((size, width), y.dtype),
            np.zeros(size, sample_weight.dtype),
        )
    padded = pads[key]
    for target, value in zip(padded, (X, y, sample_weight)):
        target[:n] = value
    padded[0][n:] = X[:1]
    padded[1][n:] = y[:1]
    padded[2][n:] = 0
    return padded


class _StepRun:
    """One (read set, write set) pair of the fused step: its session and IO binding."""

    __slots__ = ("binding", "flat", "inputs", "read", "session", "write")

    def __init__(self, session, binding, flat: bool, read: int, write: int):
        self.session, self.binding, self.flat = session, binding, flat
        self.read, self.write = read, write
        #: ``(function, arguments)`` binding each input the step reads (not the batch)
        self.inputs: list = []


class StandardBackend(Backend):
    """The training step in one ``InferenceSession`` call: forward, loss, backward, update.

    See :class:`~onnxgrad_sklearn.backends.Backend` for the parameters. On the
    CPU the weights and optimizer state live in numpy memory
    (:class:`~onnxgrad_sklearn.backends.buffers.DoubleBuffers`); on CUDA in device memory
    (:class:`~onnxgrad_sklearn.backends.buffers.DeviceBuffers`, bound by address), where
    they stay from batch to batch: only the batch and the learning rate go to
    the device, and the loss comes back. :data:`DEVICE_BUFFERS_ON_CPU` runs a
    CPU fit through the device code.
    """

    name = "standard"

    def __init__(self, plan, output_name, weight_names, start, optimizer, **kwargs):
        super().__init__(plan, output_name, weight_names, start, optimizer, **kwargs)
        on_device = self.providers[0] != "CPUExecutionProvider"
        if on_device and self.dtype == np.float64:
            raise ValueError(
                f"backend='standard' trains in float64 on the CPU only, device={self.device!r} "
                "was asked for: use dtype='float32' on CUDA, or device='cpu'."
            )
        #: The batch's inputs of the training graph (X, y_true, sample_weight).
        self.input_names = list(self.plan.meta["batch_names"])
        warn(self.plan.meta["warning"])
        n_state = len(optimizer.state_names)
        #: Whether the buffers are runtime memory bound by address (CUDA, or the CPU
        #: through the same code), rather than numpy memory bound as OrtValue views.
        self.device_buffers = on_device or DEVICE_BUFFERS_ON_CPU
        #: Whether the step applies its update only after a finite loss (two sets of
        #: buffers, :func:`guard_update`) rather than writing a third set (small models).
        self.guarded = sum(int(np.prod(shape)) for shape in self.shapes) >= TWO_SETS_FROM
        self._n_sets = n_sets = 2 if self.guarded else 3
        if self.guarded and not on_device and memory_pattern_grows():
            self.options.enable_mem_pattern = False  # these options are this backend's own
        #: Elements of a piece of the step's update, or None (:data:`STEP_UPDATE_CHUNK`).
        self.chunk = None
        if self.guarded and optimizer.elementwise and not self.device_buffers:
            self.chunk = STEP_UPDATE_CHUNK or None
        if self.device_buffers:
            self._buffers = DeviceBuffers(
                self.shapes, n_state, n_sets=n_sets, dtype=self.dtype, device=self.device
            )
        else:
            self._buffers = DoubleBuffers(self.shapes, n_state, n_sets=n_sets, dtype=self.dtype)
        #: the pieces the step's update runs over (:func:`~.buffers.pieces`), or None
        self._spans = pieces(self.shapes, self.chunk) if self.chunk else None
        self._buffers.write(0, start)
        # The batches (X, y, sample_weight) and the learning rate are CPU values on every
        # device, bound as OrtValue views of their numpy memory: onnxruntime copies a CPU
        # input of a CUDA session to the device when it is bound (IOBinding::BindInput
        # copies inputs across devices then, not at each run). Chosen over device staging
        # buffers copied into once per batch: that bind is the one copy a batch needs
        # anyway, there is no device buffer per batch size to keep, and on the CPU the
        # same code copies nothing. Because the copy is made at bind time, the device path
        # binds them, and the weights and state, anew at every call (see train_batch).
        # The loss, bound once as a CPU output, is copied back at the end of each run:
        # the one host round trip of a batch.
        self._lr_array = np.zeros((), dtype=self.dtype)
        self._lr = ortvalue_view(self._lr_array)
        self._loss_array = np.zeros((), dtype=self.dtype)
        self._loss = ortvalue_view(self._loss_array)
        self._cpu = ort_device("CPUExecutionProvider", 0)
        self._run_options = import_onnxruntime().RunOptions()
        self._steps: OrderedDict = OrderedDict()  # (batch, targets) -> {(read, write): run}
        self._pads: dict = {}  # (batch, targets, ...) -> the padded batch's arrays
        #: Whether a short batch may be padded (the loss's rows do not mix: BaseLoss.rowwise)
        self.pad_batches = True
        self._bound: dict = {}  # run -> the LastBatch it has bound
        self._gradients: OrderedDict = OrderedDict()  # batch size -> session
        self._forward = None
        self._previous = None
        # the graph's inputs a fit gives once (the penalty's coefficients), as views
        self._constants = {n: ortvalue_view(v) for n, v in self.constants.items()}
        #: Dropout masks and running statistics of a training-mode graph (run_state)
        self._run_state = None
        self.reset_optimizer()

    @classmethod
    def build_graphs(cls, inputs, training, weight_names, shapes, optimizer, device):
        """The standard backend's part of a plan (:func:`~onnxgrad_sklearn.backends.build_plan`).

        No graph of its own (the step graphs are made per batch shape, see
        :meth:`_step_graph`): ``inputs``, the training graph with the weights as
        inputs, gets a symbol for the width of the targets; the metadata names the
        batch's inputs and the warning a fit gives (:func:`zero_derivative_warning`).

        Raises
        ------
        ValueError
            When onnx-ad has no rule for an operator on the differentiated path.
        """
        unsupported = unsupported_ops(training, weight_names)
        if unsupported:
            raise ValueError(
                f"backend='standard' cannot differentiate the operator(s) {unsupported} of "
                f"the training graph: onnx-ad {onnx_ad.__version__} has no rule for them. "
                "Write the loss or the model with other operators, or try backend='agent' "
                "(see docs/how_it_works.md for what each backend differentiates)."
            )
        # The width of the targets is taken from the batches (the classifier's binary
        # targets have two columns for one logit), like the batch size.
        for info in inputs.graph.input:
            if info.name == Y_TRUE:
                info.type.tensor_type.shape.dim[1].dim_param = TARGETS
        import json

        from .training_mode import METADATA_KEY

        found = [p.value for p in inputs.metadata_props if p.key == METADATA_KEY]
        mode = json.loads(found[-1]) if found else None
        # the masks and running statistics a training-mode graph reads are not the batch's
        other = set() if mode is None else {m[0] for m in mode["masks"]}
        other |= set() if mode is None else {s[0] for s in mode["statistics"]}
        weights = set(weight_names)
        names = [
            i.name
            for i in inputs.graph.input
            if i.name not in weights
            and i.name not in _constant_names(inputs)
            and i.name not in other
        ]
        # X first, then y_true and sample_weight (a training-mode graph declares its
        # sample_weight before y_true)
        batch_names = [n for n in names if n not in (Y_TRUE, SAMPLE_WEIGHT)]
        batch_names += [n for n in (Y_TRUE, SAMPLE_WEIGHT) if n in names]
        meta = {
            "batch_names": batch_names,
            "warning": zero_derivative_warning(training, weight_names),
        }
        if mode is not None:
            meta["training_mode"] = mode
        return {}, meta

    def run_state(self, meta: dict, start) -> None:
        """Train a graph with Dropout or BatchNormalization in training mode: its masks
        and running statistics (:class:`~onnxgrad_sklearn.backends.training_mode.RunState`;
        ``start``: the statistics' values)."""
        from .training_mode import RunState

        self._run_state = RunState.from_meta(meta, start)

    @property
    def training_model(self) -> onnx.ModelProto:
        """The training graph with the weights as inputs, parsed from the plan once per
        backend (when its first step graph of a batch shape is built: the passes copy it,
        none modifies it)."""
        found = self.__dict__.get("_training_model")
        if found is None:
            found = self.__dict__["_training_model"] = self.plan.model("training.onnx")
        return found

    # storage -------------------------------------------------------------
    @property
    def weights(self):
        """The current weights as ``OrtValue`` objects: views on the CPU, CPU copies otherwise."""
        if self.device_buffers:
            return [to_ortvalue(w) for w in self._buffers.read(0)]
        return self._buffers.weights()

    @property
    def state(self):
        """The optimizer state as ``OrtValue`` objects (as :attr:`weights`)."""
        if self.device_buffers:
            return [[to_ortvalue(s) for s in st] for st in self._state_arrays()]
        return self._buffers.state()

    def get_weights(self):
        return self._buffers.read(0)

    def weights_finite(self) -> bool:
        return all(all_finite(w) for w in self._current_weights())  # views on the CPU

    def _current_weights(self):
        if self.device_buffers:
            return self.get_weights()
        return list(self._buffers.views[self._buffers.current][0])  # no copy of the weights

    def _state_arrays(self):
        per_k = [self._buffers.read(1 + k) for k in range(self._buffers.n_state)]
        return [[s[i] for s in per_k] for i in range(len(self.shapes))]

    def _load_state(self, per_weight) -> None:
        for k in range(len(self.optimizer.state_names)):
            self._buffers.write(1 + k, [st[k] for st in per_weight])

    def checkpoint(self):
        """Return a copy of the current weights and optimizer state (host memory), and
        of a training-mode graph's running statistics and masks' random state."""
        kept = None if self._run_state is None else self._run_state.get()
        return self._buffers.copy(), kept, self.step

    def restore(self, checkpoint) -> None:
        vectors, kept, step = checkpoint
        self.step = step
        self._previous = None
        self._buffers.load(vectors)
        if kept is not None and self._run_state is not None:
            self._run_state.set(kept)

    def release_sessions(self) -> None:
        """Free the sessions of a model of :data:`TWO_SETS_FROM` weights or more.

        At the end of a fit, before the estimator makes its predict session: the
        step session's memory (its temporaries: about twice the weights and state)
        goes back to the system. The next step makes the session again from the
        process's step graph (no onnx-ad), milliseconds beside the seconds a fit of
        such a model takes; a small model keeps its sessions for the next fit.
        """
        if not self.guarded:
            return
        self._steps.clear()
        self._bound.clear()
        self.__dict__.pop("_training_model", None)
        self._gradients.clear()
        self._forward = self._predict = None

    def undo_last_step(self) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            self._buffers.current, self.step = previous  # that set is untouched since
            if self._run_state is not None:
                self._run_state.undo()

    def set_weights(self, arrays) -> None:
        self._previous = None
        self._buffers.write(0, arrays)

    # sessions --------------------------------------------------------------
    def _session(
        self, blob, digest=None, inference=False, pieces=False
    ) -> onnxruntime.InferenceSession:
        """The session of ``blob`` (a name in the plan, or bytes and their digest);
        ``inference``: one that runs now and then (its threads do not spin); ``pieces``:
        a step graph updating by pieces
        (:data:`~onnxgrad_sklearn.backends.buffers.PIECES_DISABLED_OPTIMIZERS`)."""
        # onnxruntime fuses Transpose + MatMul into com.microsoft.FusedMatMul, whose
        # CPU kernel is float32 only: a double graph would fail to load.
        disabled = list(DOUBLE_DISABLED_OPTIMIZERS) if self.dtype == np.float64 else []
        if pieces:
            disabled += PIECES_DISABLED_OPTIMIZERS
        disabled = disabled or None
        options = self.inference_options if inference else None
        return self.session(blob, digest, options=options, disabled_optimizers=disabled)

    def _artifact(self, kind: str, batch: int, targets: int, build):
        """The graph ``kind`` (``"step"``, ``"gradients"``) of a batch shape, with its
        metadata: a training artifact of the plan, made by ``build()`` (which returns a
        model and its metadata) the first time."""
        parts = (self.plan.key, batch, targets, self._buffers.pads, self.guarded)
        if self.chunk:
            parts += (self.chunk,)
        key = artifacts.make_key(kind, parts)
        found = artifacts.get(key)
        if found is None:
            model, meta = build()
            found = artifacts.Artifact({f"{kind}.onnx": model.SerializeToString()}, meta)
            artifacts.put(key, found)
        return found

    @staticmethod
    def _cached(cache: OrderedDict, key, make):
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        value = cache[key] = make()
        while len(cache) > _CACHED:
            cache.popitem(last=False)
        return value

    def _step_graph(self, batch: int, targets: int):
        model, flat = step_graph(
            self.training_model,
            self.weight_names,
            self.shapes,
            self.optimizer,
            batch,
            targets,
            pads=self._buffers.pads,
            guard=self.guarded,
            forward_outputs=[s.output for s in self._run_state.statistics]
            if self._run_state
            else (),
            chunk=self.chunk,
        )
        logger.debug(
            "standard backend: step graph for batch %d, %d nodes", batch, len(model.graph.node)
        )
        return model, {"flat": flat}

    def _make_step(self, batch: int, targets: int):
        found = self._artifact("step", batch, targets, lambda: self._step_graph(batch, targets))
        flat = bool(found.meta["flat"])
        session = self._session(
            found.blobs["step.onnx"], found.digest("step.onnx"), pieces=bool(self.chunk)
        )
        runs = {}
        for p, q in itertools.permutations(range(self._n_sets), 2):  # read p, write q
            binding = bindings().SessionIOBinding(session._sess)
            run = runs[p, q] = _StepRun(session, binding, flat, p, q)
            run.inputs = self._step_inputs(run)
            self._bind_step(run)
            self._bind_step_outputs(run)
        return runs

    def _step_inputs(self, run: _StepRun) -> list:
        """What the step reads: the weights and state of set ``run.read``, the rate, and
        when guarded, set ``run.write`` as what a non-finite loss keeps."""
        b, binding, p, q = self._buffers, run.binding, run.read, run.write
        inputs = [(binding.bind_ortvalue_input, (UPDATE + "learning_rate", self._lr))]
        inputs.extend((binding.bind_ortvalue_input, item) for item in self._constants.items())
        for i, name in enumerate(self.weight_names):
            inputs.append(b.binder(binding, name, p, 0, i))
        names = self.optimizer.state_names
        if self._spans is not None:  # by pieces: always guarded
            vectors = ("param", *names)
            bind = binding.bind_ortvalue_input
            inputs.extend((bind, item) for item in b.named(p, vectors, UPDATE, self._spans).items())
            kept = b.named(q, vectors, UPDATE + "kept_", self._spans)
            inputs.extend((bind, item) for item in kept.items())
            return inputs
        kept = []  # (input name, vector, weight) of what a guarded step keeps
        if run.flat:
            inputs.append(b.binder(binding, UPDATE + "param", p, 0))
            kept.append((UPDATE + "kept_param", 0, None))
            for k, name in enumerate(names):
                inputs.append(b.binder(binding, UPDATE + name, p, 1 + k))
                kept.append((UPDATE + f"kept_{name}", 1 + k, None))
        else:
            for i in range(len(self.shapes)):
                kept.append((UPDATE + f"kept_param_{i}", 0, i))
                for k, name in enumerate(names):
                    inputs.append(b.binder(binding, UPDATE + f"{name}_{i}", p, 1 + k, i))
                    kept.append((UPDATE + f"kept_{name}_{i}", 1 + k, i))
        if self.guarded:
            inputs.extend(b.binder(binding, name, q, k, i) for name, k, i in kept)
        return inputs

    @staticmethod
    def _bind_step(run: _StepRun) -> None:
        for bind, args in run.inputs:
            bind(*args)

    def _bind_step_outputs(self, run: _StepRun) -> None:
        """Bind what the step writes: the loss, and set ``run.write`` (bound once)."""
        b, binding, q = self._buffers, run.binding, run.write
        binding.bind_ortvalue_output(LOSS, self._loss)
        names = self.optimizer.state_names
        if self._spans is not None:
            written = b.named(q, ("param", *names), UPDATE + "new_", self._spans)
            for name, view in written.items():
                binding.bind_ortvalue_output(name, view)
        elif run.flat:
            b.bind(binding, UPDATE + "new_param", q, 0, output=True)
            for k, name in enumerate(names):
                b.bind(binding, UPDATE + f"new_{name}", q, 1 + k, output=True)
        else:
            for i in range(len(self.shapes)):
                b.bind(binding, UPDATE + f"new_param_{i}", q, 0, i, output=True)
                for k, name in enumerate(names):
                    b.bind(binding, UPDATE + f"new_{name}_{i}", q, 1 + k, i, output=True)

    def _make_gradients(self, batch: int, targets: int):
        found = self._artifact(
            "gradients", batch, targets, lambda: (self._gradient_graph(batch, targets), {})
        )
        return self._session(found.blobs["gradients.onnx"], found.digest("gradients.onnx"))

    def _gradient_graph(self, batch: int, targets: int):
        """The loss and the gradient of each weight, shaped as the weight."""
        model = gradient_graph(self.training_model, self.weight_names, batch, targets)
        for out, shape in zip(model.graph.output[1:], self.shapes):
            dims = out.type.tensor_type.shape.dim
            del dims[len(shape) :]  # the seed axis, squeezed below
            target = f"{out.name}_shape"
            model.graph.initializer.append(
                onnx.numpy_helper.from_array(np.array(shape, dtype=np.int64), target)
            )
            node = next(n for n in model.graph.node if out.name in n.output)
            node.output[list(node.output).index(out.name)] = out.name + "_seeded"
            model.graph.node.append(
                onnx.helper.make_node("Reshape", [out.name + "_seeded", target], [out.name])
            )
        _simplify(model)
        return model

    def _feeds(self, X, y, sample_weight):
        X = input_array(X, self.dtype)
        y = np.ascontiguousarray(np.reshape(y, (X.shape[0], -1)), dtype=self.dtype)
        if sample_weight is None:
            sample_weight = np.ones(X.shape[0], dtype=self.dtype)
        sample_weight = np.ascontiguousarray(sample_weight, dtype=self.dtype)
        return X, y, sample_weight

    def _run(self, session, binding) -> None:
        session._sess.run_with_iobinding(binding, self._run_options)
        if self.device_buffers:
            binding.synchronize_outputs()  # the device's work done before the host reads

    def _run_once(self, session, arrays: dict, output_names) -> list[np.ndarray]:
        """Run ``session`` on CPU ``arrays`` (by name) and the current weights; host outputs."""
        binding = bindings().SessionIOBinding(session._sess)
        views = {name: ortvalue_view(np.ascontiguousarray(a)) for name, a in arrays.items()}
        inputs = {i.name for i in session.get_inputs()}
        views.update((n, v) for n, v in self._constants.items() if n in inputs)
        if self._run_state is not None:  # no dropout, the current running statistics
            batch = next(iter(arrays.values())).shape[0]
            feeds = self._run_state.step_inputs(batch, train=False)
            kept = [v for n, v in feeds.items() if n in inputs]  # alive until the run returns
            views.update((n, ortvalue_view(v)) for n, v in feeds.items() if n in inputs)
        for name, value in views.items():
            binding.bind_ortvalue_input(name, value)
        for i, name in enumerate(self.weight_names):
            self._buffers.bind(binding, name, None, 0, i)
        for name in output_names:
            binding.bind_output(name, self._cpu)
        self._run(session, binding)
        kept = None  # noqa: F841  (the run state's arrays were alive until here)
        # arrays of their own, in one call (OrtValue.numpy() then a copy: 9 us an output)
        return binding.copy_outputs_to_cpu()

    def train_batch(self, X, y, sample_weight, learning_rate):
        if self.pad_batches:
            X, y, sample_weight = pad_batch(self._pads, self._steps, X, y, sample_weight)
        key = X.shape[0], y.shape[1]
        runs = self._cached(self._steps, key, lambda: self._make_step(*key))
        b = self._buffers
        if self.guarded:  # the other set: what undo goes back to, written after a finite loss
            target = 1 - b.current
        else:  # neither the current set nor the one undo goes back to
            before = self._previous[0] if self._previous is not None else (b.current + 2) % 3
            target = 3 - b.current - before
        self._lr_array[...] = self.optimizer.step_learning_rate(learning_rate, self.step + 1)
        run = runs[b.current, target]
        arrays = (X, y, sample_weight)
        if self.device_buffers:
            # Everything the step reads, bound anew (see __init__): a weight whose
            # consumer onnxruntime placed on the CPU (a kernel the CUDA provider lacks)
            # would otherwise be read from the copy made when it was first bound.
            self._bind_step(run)
            views = [ortvalue_view(a) for a in arrays]  # alive until the run returns
            for name, value in zip(self.input_names, views):
                run.binding.bind_ortvalue_input(name, value)
        else:
            for name, value in self._batch_feeds(run, arrays).items():
                run.binding.bind_ortvalue_input(name, value)
        state = self._run_state
        if state is not None:  # fresh masks, the statistics read and written
            alive = state.bind(run.binding, X.shape[0])
        self._run(run.session, run.binding)
        loss = float(self._loss_array)
        if not math.isfinite(loss):
            return loss  # the set undo goes back to is as it was (kept, or not written)
        if state is not None:
            del alive
            state.commit()
        # one assignment, no call between its parts: a KeyboardInterrupt (raised at a
        # call) finds the step applied or not
        self._previous, self.step, b.current = (b.current, self.step), self.step + 1, target
        return loss

    def get_state(self) -> dict:
        state = super().get_state()
        if self._run_state is not None:
            state["training_mode"] = self._run_state.get()
        return state

    def set_state(self, saved: dict) -> None:
        super().set_state(saved)
        if self._run_state is not None and saved.get("training_mode") is not None:
            self._run_state.set(saved["training_mode"])

    def statistics(self) -> dict:
        """A training-mode graph's current running statistics by initializer name."""
        if self._run_state is None:
            return {}
        return self._run_state.get()["statistics"]

    def _batch_feeds(self, run, arrays):
        """The batch inputs ``run`` must bind (CPU): none when it reads these very buffers.

        The fit loop gathers shuffled batches into the same buffers (the same array
        objects, whose memory does not move): their ``OrtValue`` views are bound once,
        not at every batch.
        """
        bound = self._bound.get(run)
        if bound is not None and bound.holds(arrays):
            return {}
        key = batch_key(arrays)
        self._bound[run] = LastBatch(arrays, key)
        if bound is not None and bound.key == key:
            return {}
        return dict(zip(self.input_names, (ortvalue_view(a) for a in arrays)))

    def loss(self, X, y, sample_weight):
        if self._forward is None:
            self._forward = self._session("training.onnx", inference=True)
        arrays = dict(zip(self.input_names, self._feeds(X, y, sample_weight)))
        return float(self._run_once(self._forward, arrays, [LOSS])[0])

    def loss_and_gradients(self, X, y, sample_weight):
        arrays = self._feeds(X, y, sample_weight)
        key = arrays[0].shape[0], arrays[1].shape[1]
        session = self._cached(self._gradients, key, lambda: self._make_gradients(*key))
        outputs = [o.name for o in session.get_outputs()]
        out = self._run_once(session, dict(zip(self.input_names, arrays)), outputs)
        return float(out[0]), out[1:]

    def predict(self, X) -> np.ndarray:
        if self._predict is None:
            self._predict = self._session("predict.onnx", inference=True)  # weights as inputs
        weights = set(self.weight_names)
        names = [i.name for i in self._predict.get_inputs() if i.name not in weights]
        X = input_array(X, self.dtype)
        return self._run_once(self._predict, {names[0]: X}, [self.output_name])[0]
