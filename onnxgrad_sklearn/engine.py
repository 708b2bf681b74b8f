"""The training loop's inner machinery: training graph, batches, updates.

:func:`build_training_graph` appends the loss (weighted by the sample weights)
and the elastic-net penalty to the converted model, so the gradient graph
returns the gradient of the very number reported as the loss, and the backward
pass is fed a constant 1.

:class:`TrainingEngine` is what the fit loop talks to: it finds the plan of the
fit's structure (:class:`~onnxgrad_sklearn.backends.Plan`, a training artifact
keyed by the converted template's structure, the loss, the penalty's form, the
update rule, the backend asked for and the device) or builds it (the training
graph, the backend's choice and graphs), makes the backend
(:mod:`onnxgrad_sklearn.backends`: the TrainingAgent or the standard-ONNX one)
and hands every call to it. A fit whose plan is cached imports no onnx. The
backend owns everything that lives in the runtime during a fit: the weights and
the optimizer state as ``OrtValue`` objects, and the sessions (the process's,
shared by the fits of a structure). One call of :meth:`TrainingEngine.train_batch`
runs forward, backward and the update.

:class:`EngineRecipe` is what an engine is built from besides the loss, the update
rule, the penalty and the threads (the converted template, its output, the trained
and penalized weights, the device, the backend): the estimator builds its engines
through one, and a fit on a dask cluster sends one to its workers, which build theirs.

The penalty's coefficients are inputs of the training graph (:data:`PENALTY_INPUTS`),
as the learning rate is of the update: fits that differ in ``alpha`` share a plan.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from . import artifacts, backends, runtime
from ._config import get_config
from ._lazy import lazy
from ._names import BATCH, LOSS, ONNX_TEMPLATE_KEY, PENALTY_INPUTS, SAMPLE_WEIGHT, Y_TRUE
from .backends import Backend, build_plan, find_plan, make_backend
from .losses import BaseLoss
from .optim import BaseOptimizer

if TYPE_CHECKING:
    import onnxruntime

# imported on first use: a fit whose plan is cached parses no graph
onnx = lazy("onnx")

__all__ = [
    "PENALTY_INPUTS",
    "EngineRecipe",
    "TrainingEngine",
    "build_training_graph",
    "penalty_coefficients",
    "weights_as_inputs",
]

logger = logging.getLogger("onnxgrad_sklearn")


def penalty_coefficients(alpha: float, l1_ratio: float, penalized: Sequence[str]) -> dict:
    """The penalty's coefficients by input name (:data:`PENALTY_INPUTS`), for the terms
    the training graph has: ``0.5 * alpha * (1 - l1_ratio)`` for the squares when
    ``l1_ratio < 1``, ``alpha * l1_ratio`` for the absolute values when ``l1_ratio > 0``;
    none when ``alpha == 0`` or nothing is penalized."""
    if not (alpha > 0 and len(penalized)):
        return {}
    found = {}
    if l1_ratio < 1:
        found[PENALTY_INPUTS[0]] = 0.5 * alpha * (1 - l1_ratio)
    if l1_ratio > 0:
        found[PENALTY_INPUTS[1]] = alpha * l1_ratio
    return found


def build_training_graph(
    model: onnx.ModelProto,
    output_name: str,
    n_outputs: int,
    loss: BaseLoss,
    alpha: float = 0.0,
    l1_ratio: float = 0.0,
    penalized: Sequence[str] = (),
    loss_input=None,
    keep_outputs=(),
) -> onnx.ModelProto:
    """Return ``model`` extended with the loss and penalty as its only output (with
    ``keep_outputs``, those outputs of ``model`` after it).

    The new graph has the inputs of ``model`` plus ``y_true``
    (``(n_samples, n_outputs)``) and ``sample_weight`` (``(n_samples,)``), of the
    model's float type (float32, or float64 for a double model, whose loss and
    penalty constants are then double too),
    and one scalar output ``loss``::

        sum_i w_i * loss_i / sum_i w_i
        + alpha * ((1 - l1_ratio) / 2 * sum ||W||_2^2 + l1_ratio * sum ||W||_1) / sum_i w_i

    the sums running over the ``penalized`` initializers (with ``l1_ratio=0``
    and unit weights, MLPRegressor's loss). The two coefficients are scalar inputs
    after ``sample_weight`` (:func:`penalty_coefficients` gives their values), for
    the terms ``alpha`` and ``l1_ratio`` make: the graph depends on which terms
    there are, not on the values.

    Parameters
    ----------
    model : onnx.ModelProto
        Inference graph; not modified.
    output_name : str
        Its prediction output.
    n_outputs : int
        Number of targets per sample.
    loss : BaseLoss
        Per-sample loss.
    alpha, l1_ratio : float
        Penalty strength and L1 share.
    penalized : list of str
        Initializers the penalty applies to.
    loss_input : callable, optional
        ``loss_input(g, prediction) -> name`` turns the prediction of shape
        ``(n_samples, n_outputs)`` into what the loss receives. The width of
        ``y_true`` is that of what the loss receives, or the loss's
        ``target_width`` where it sets one.
    """
    from ._graph import GraphBuilder, model_dtype

    g = GraphBuilder("train", dtype=model_dtype(model))  # the loss computes in the model's type
    pred = g.op("Reshape", output_name, g.const([-1, n_outputs], np.int64))
    if loss_input is not None:
        pred = loss_input(g, pred)
    per_sample = loss.build(g, pred, Y_TRUE)
    sw_sum = g.sum(SAMPLE_WEIGHT)
    total = g.div(g.sum(g.mul(per_sample, SAMPLE_WEIGHT)), sw_sum)
    coefficients = penalty_coefficients(alpha, l1_ratio, penalized)
    if coefficients:
        total = g.add(total, g.div(_penalty(g, coefficients, penalized), sw_sum))
    g.identity(total, LOSS)
    out = _with_loss_part(model, g, coefficients, keep_outputs)
    # With every shape of the loss part known (no Reshape to -1, the width of y_true
    # given), the gradient builder resolves its broadcasting at build time too.
    renamed, shapes = _drop_noop_reshapes(out)
    _match_constant_ranks(out, shapes, keep={i.name for i in model.graph.initializer})
    while pred in renamed:
        pred = renamed[pred]
    while per_sample in renamed:
        per_sample = renamed[per_sample]
    _check_per_sample_shape(loss, shapes.get(per_sample))
    width = loss.target_width or shapes.get(pred, [None])[-1]
    if isinstance(width, int):
        y_true = next(i for i in out.graph.input if i.name == Y_TRUE)
        y_true.type.tensor_type.shape.dim[1].dim_value = width
    return out


def _training_graphs(model, settings):
    """The training graph (:func:`build_training_graph` with ``settings``, its arguments
    after the model) and the inference graph of ``model`` (a converted template, or an
    ONNX model).

    For Dropout or BatchNormalization in training mode (``model.training``), both have
    the running statistics as inputs; the training graph is the training-mode graph, also
    outputs the statistics' updated values, and says what its masks and statistics are
    in its metadata (:data:`~onnxgrad_sklearn.backends.training_mode.METADATA_KEY`).
    """
    import json

    from ._passes import initializers_as_inputs
    from .backends.training_mode import METADATA_KEY

    graph = model.model if hasattr(model, "skeleton") else model
    mode = getattr(model, "training", None)
    if not mode:
        built = build_training_graph(graph, *settings)
        if getattr(model, "origin", None) == "onnx":  # backends.choose_backend reads it
            entry = built.metadata_props.add()
            entry.key, entry.value = ONNX_TEMPLATE_KEY, "1"
        return built, graph
    stats = [s[0] for s in mode["statistics"]]
    outputs = [s[1] for s in mode["statistics"]]
    built = build_training_graph(model.training_model(), *settings, keep_outputs=outputs)
    entry = built.metadata_props.add()
    entry.key, entry.value = ONNX_TEMPLATE_KEY, "1"
    built = initializers_as_inputs(built, stats)
    meta = {k: mode[k] for k in ("masks", "statistics")}
    entry = built.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, json.dumps(meta)
    return built, initializers_as_inputs(graph, stats)


def _penalty(g, coefficients, penalized) -> str:
    """The penalty's terms for the coefficients the graph has (:data:`PENALTY_INPUTS`):
    the squares and the absolute values of the ``penalized`` weights, each times its
    coefficient input."""
    l2 = l1 = None
    for name in penalized:
        if PENALTY_INPUTS[0] in coefficients:
            sq = g.sum(g.mul(name, name))
            l2 = sq if l2 is None else g.add(l2, sq)
        if PENALTY_INPUTS[1] in coefficients:
            ab = g.sum(g.abs(name))
            l1 = ab if l1 is None else g.add(l1, ab)
    terms = []
    if l2 is not None:
        terms.append(g.mul(l2, PENALTY_INPUTS[0]))
    if l1 is not None:
        terms.append(g.mul(l1, PENALTY_INPUTS[1]))
    return terms[0] if len(terms) == 1 else g.add(*terms)


def _with_loss_part(model, g, coefficients, keep_outputs=()) -> onnx.ModelProto:
    """A copy of ``model`` with the nodes of ``g`` appended, the inputs ``y_true``,
    ``sample_weight`` (unless ``model`` has it: a BatchNormalization's rows in training
    mode) and the penalty's coefficients, and ``loss`` as its output (then
    ``keep_outputs``)."""
    from ._graph import tensor_info

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    graph.node.extend(g.nodes)
    graph.initializer.extend(g.initializers)
    # One symbol for the batch dimension of every input tells onnxruntime's gradient
    # builder (broadcasting resolved when it builds the graph) and
    # ortgrad.rewrite_batch_sums which tensors share it.
    for value in graph.input:
        dims = value.type.tensor_type.shape.dim
        if len(dims) and not dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH
    declared = {value.name for value in graph.input}
    graph.input.extend(
        [tensor_info(Y_TRUE, [BATCH, None], g.elem_type)]
        + ([] if SAMPLE_WEIGHT in declared else [tensor_info(SAMPLE_WEIGHT, [BATCH], g.elem_type)])
        + [tensor_info(name, [], g.elem_type) for name in coefficients]
    )
    kept = [o for name in keep_outputs for o in graph.output if o.name == name]
    del graph.output[:]
    graph.output.append(tensor_info(LOSS, [], g.elem_type))
    graph.output.extend(kept)
    return out


def _check_per_sample_shape(loss, shape) -> None:
    """Refuse a loss whose output is not one value per sample (it would broadcast)."""
    if shape is None or len(shape) == 1:
        return
    shown = "(" + ", ".join("n_samples" if d in (BATCH, None) else str(d) for d in shape) + ")"
    raise ValueError(
        f"The loss {type(loss).__name__} returns a tensor of shape {shown}: a loss must "
        "return one value per sample, shape (n_samples,), or it broadcasts against the "
        "sample weights. Reduce its last axis (ReduceSum with axes=[1], keepdims=0) or "
        "reshape it to (n_samples,)."
    )


def _is_noop_reshape(source, target) -> bool:
    # Reshape(x, target) of x with shape ``source`` gives x's own shape: the same
    # rank, the batch dimension kept (-1 or 0), every other dimension known and kept.
    if source is None or len(source) != len(target) or not len(target):
        return False
    first_kept = target[0] in (0, source[0]) if isinstance(source[0], int) else target[0] in (-1, 0)
    return (
        first_kept
        and source[0] is not None
        and all(isinstance(s, int) and t in (0, s) for s, t in zip(source[1:], target[1:]))
    )


#: Broadcasting operators whose one-value constant takes the rank of the other input.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})


def _match_constant_ranks(model: onnx.ModelProto, shapes: dict, keep=()) -> None:
    """Give the one-value initializers of elementwise operators the rank of the other
    input (``(1, 1)`` against ``(n, 1)``), in place; those named in ``keep`` (the
    model's own: its weights keep their shapes) through a ``Reshape`` node.

    onnxruntime (1.19.2 and 1.32 measured) broadcasts a scalar over a tensor whose last
    dimension is 1 one element at a time: ``Mul`` of ``(83886, 1)`` by a scalar
    takes 1.0 ms on one thread, by a ``(1, 1)`` constant 0.04 ms. Every loss of one
    output, and a binary classifier's, has such products (and their gradients, made
    from the same constants), and a model of one output adds its intercept so. The
    results are the same: the other input has the output's rank.
    """
    graph = model.graph
    constants = {i.name: i for i in graph.initializer}
    made, nodes = {}, []
    for node in graph.node:
        if node.op_type in _ELEMENTWISE and node.domain in ("", "ai.onnx"):
            for k, name in enumerate(node.input[:2]):
                init = constants.get(name)
                other = shapes.get(node.input[1 - k])
                if init is None or other is None or len(other) < 2 or len(init.dims) >= len(other):
                    continue
                if int(np.prod(init.dims)) != 1:
                    continue
                key = (name, len(other))
                if key not in made:
                    made[key] = f"{name}_rank{len(other)}"
                    if name in keep:
                        shape = onnx.numpy_helper.from_array(
                            np.ones(len(other), dtype=np.int64), f"{made[key]}_shape"
                        )
                        graph.initializer.append(shape)
                        nodes.append(
                            onnx.helper.make_node(
                                "Reshape", [name, shape.name], [made[key]], name=made[key]
                            )
                        )
                    else:
                        value = onnx.numpy_helper.to_array(init).reshape((1,) * len(other))
                        graph.initializer.append(onnx.numpy_helper.from_array(value, made[key]))
                node.input[k] = made[key]
    if nodes:  # before every node: their inputs are initializers
        everything = nodes + list(graph.node)
        del graph.node[:]
        graph.node.extend(everything)
    used = {name for n in graph.node for name in n.input}
    for name in {name for name, _ in made} - used - set(keep):
        graph.initializer.remove(constants[name])


def _drop_noop_reshapes(model: onnx.ModelProto) -> dict:
    """Remove the ``Reshape`` nodes that keep their input's shape, in place.

    skl2onnx and :func:`build_training_graph` reshape predictions to
    ``(-1, n_outputs)``; with the batch dimension a symbol, shape inference loses
    it after such a node and onnxruntime's gradient builder then computes the
    broadcasting of every later operator at run time (``Shape``,
    ``BroadcastGradientArgs``, ``ReduceSum``, ``Reshape`` nodes at each batch).
    Returns ``{removed output: its input}`` and the shapes of the graph left.
    """
    from ._passes import static_shapes

    graph = model.graph
    kept_names = {o.name for o in graph.output}
    renamed = {}
    shape_constants = set()
    while True:
        shapes = static_shapes(model)
        constants = {i.name: i for i in graph.initializer}
        node = next(
            (
                n
                for n in graph.node
                if n.op_type == "Reshape"
                and n.input[1] in constants
                and n.output[0] not in kept_names
                and not any(a.name == "allowzero" and a.i for a in n.attribute)
                and _is_noop_reshape(
                    shapes.get(n.input[0]),
                    onnx.numpy_helper.to_array(constants[n.input[1]]).tolist(),
                )
            ),
            None,
        )
        if node is None:
            break  # ``shapes`` are those of the graph as it is now
        old, new = node.output[0], node.input[0]
        graph.node.remove(node)
        shape_constants.add(node.input[1])
        for other in graph.node:
            for i, name in enumerate(other.input):
                if name == old:
                    other.input[i] = new
        renamed[old] = new
    used = {name for n in graph.node for name in n.input}
    unused = [i for i in graph.initializer if i.name in shape_constants - used]
    for init in unused:
        graph.initializer.remove(init)
    return renamed, shapes


def weights_as_inputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """Return a copy of ``model`` where the initializers ``names`` are graph inputs.

    Their values are not copied (:func:`onnxgrad_sklearn._passes.initializers_as_inputs`).
    """
    from ._passes import initializers_as_inputs

    return initializers_as_inputs(model, names)


def session_options(threads: int = 0, spinning: bool = True) -> onnxruntime.SessionOptions:
    """Session options of the package's sessions (``threads=0``: the runtime's default;
    :func:`onnxgrad_sklearn.runtime.session_options`)."""
    return runtime.session_options(threads, spinning)


def _start_weights(model, converted, weight_names) -> tuple:
    """The training dtype and the starting values of ``weight_names``: a
    :class:`ConvertedTemplate`'s (``converted``) or the ONNX ``model``'s initializers."""
    if converted is not None:
        return converted.dtype, converted.named_values(weight_names)
    from ._graph import model_dtype

    inits = {i.name: i for i in model.graph.initializer}
    return model_dtype(model), [onnx.numpy_helper.to_array(inits[n]) for n in weight_names]


class TrainingEngine:
    """Weights, gradients and optimizer state of one fit, kept in the runtime.

    Parameters
    ----------
    model : ConvertedTemplate or onnx.ModelProto
        The converted template (:class:`~onnxgrad_sklearn.templates.ConvertedTemplate`),
        whose artifact's key names the structure and whose values are the starting
        weights: the plan is looked for in the cache before anything is built; or
        an inference graph holding the starting weights (the plan is then keyed by
        the graphs' bytes).
    output_name : str
        Its prediction output.
    weight_names : list of str
        Initializers to train.
    penalized : list of str
        Subset of ``weight_names`` the penalty applies to.
    n_outputs : int
        Width of the targets.
    loss : BaseLoss
        The loss.
    optimizer : BaseOptimizer
        The update rule.
    alpha, l1_ratio : float
        Elastic-net penalty (:func:`penalty_coefficients`: inputs of the graphs).
    device : str
        ``"cpu"`` or ``"cuda[:N]"``.
    loss_input : callable, optional
        See :func:`build_training_graph`.
    backend : {"auto", "agent", "standard"}, default="auto"
        Which backend trains (:func:`onnxgrad_sklearn.backends.choose_backend`):
        ``"agent"`` onnxruntime-training's TrainingAgent, ``"standard"`` onnx-ad
        gradients on any onnxruntime, ``"auto"`` the agent where it is installed
        and can differentiate the graph.
    threads : int, default=0
        Intra-op threads of the training and inference sessions (0: the
        runtime's default); a separate update session runs on one thread.
    loss_input_key : hashable, optional
        What ``loss_input`` does, for the plan's key; without it a ``loss_input``
        keys the plan by the training graph's bytes (built at each fit).

    Attributes
    ----------
    backend : str
        The backend that runs, ``"agent"`` or ``"standard"``.
    dtype : numpy.dtype
        The training dtype, that of the model (float64 for a double graph).
    plan : Plan
        The graphs the backend runs (:class:`~onnxgrad_sklearn.backends.Plan`).
    training : onnx.ModelProto
        The training graph (:func:`build_training_graph`) with the weights as
        inputs, parsed from the plan when read.
    optimizer : BaseOptimizer
        The update rule.
    weight_names : list of str
        The trained initializers.
    shapes : list of tuple of int
        Their shapes.
    """

    def __init__(
        self,
        model,
        output_name: str,
        weight_names: Sequence[str],
        penalized: Sequence[str],
        n_outputs: int,
        loss: BaseLoss,
        optimizer: BaseOptimizer,
        alpha: float = 0.0,
        l1_ratio: float = 0.0,
        device: str = "cpu",
        loss_input=None,
        backend: str = "auto",
        threads: int = 0,
        loss_input_key=None,
    ):
        self.device = device
        self.weight_names = list(weight_names)
        self.output_name = output_name
        self.optimizer = optimizer
        converted = model if hasattr(model, "skeleton") else None  # a ConvertedTemplate
        self.dtype, start = _start_weights(model, converted, self.weight_names)
        self.shapes = [w.shape for w in start]
        #: Whether the model has :data:`~onnxgrad_sklearn.runtime.LARGE_MODEL` weights or more.
        self.large = sum(w.size for w in start) >= runtime.LARGE_MODEL
        if self.large:  # before the sessions
            runtime.map_large_blocks(get_config()["malloc_mmap_threshold"])
        coefficients = penalty_coefficients(alpha, l1_ratio, penalized)
        # What the graphs depend on: the structure (the converted template's key), the
        # loss and what feeds it, the penalty's terms, the update rule, the backend
        # asked for (and for "auto" whether the agent is there), the device.
        key = None
        if getattr(converted, "key", None) is not None and (
            loss_input is None or loss_input_key is not None
        ):
            key = artifacts.stable_key(
                "plan",
                (
                    converted.key, output_name, self.weight_names, list(penalized),
                    int(n_outputs), loss, loss_input_key if loss_input is not None else None,
                    sorted(coefficients), optimizer, backend,
                    backends.agent_available() if backend == "auto" else None,
                    runtime.device_to_providers(device),
                ),
            )  # fmt: skip
        training_mode = getattr(converted, "training", None)
        plan = self.plan = self._plan(
            key,
            lambda: _training_graphs(
                converted if converted is not None else model,
                (output_name, n_outputs, loss, alpha, l1_ratio, penalized, loss_input),
            ),
            backend,
        )
        self.backend = plan.backend
        self._backend: Backend = make_backend(
            self.backend,
            plan=plan,
            output_name=output_name,
            weight_names=self.weight_names,
            start=start,
            optimizer=optimizer,
            device=device,
            options=session_options(threads),
            update_options=session_options(threads=1),
            inference_options=session_options(threads, spinning=False),
            constants=coefficients,
        )
        if self.backend == "standard":
            # a short batch may be padded with rows of weight 0 when rows do not mix
            self._backend.pad_batches = bool(getattr(loss, "rowwise", True))

        if self.backend == "standard" and training_mode:
            stats = [s[0] for s in training_mode["statistics"]]
            self._backend.run_state(training_mode, converted.named_values(stats))

    def _plan(self, key, training_graph, backend):
        """The plan of ``key`` found again, or built from ``training_graph()`` (the
        training graph and the inference graph) and kept."""
        plan = find_plan(key)
        if plan is None:
            training, graph = training_graph()
            return build_plan(
                backend, training, graph, self.weight_names, self.shapes, self.optimizer,
                self.device, key,
            )  # fmt: skip
        if plan.meta.get("log"):
            logger.info(plan.meta["log"])  # the choice, as when the plan was built
        return plan

    @property
    def training(self) -> onnx.ModelProto:
        """The training graph with the weights as inputs (parsed from the plan)."""
        return self.plan.model("training.onnx")

    @property
    def step(self) -> int:
        """Number of updates since the optimizer state was created."""
        return self._backend.step

    def train_batch(
        self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray, learning_rate: float
    ) -> float:
        """Run forward, backward and the update on one batch; return its loss.

        A non-finite loss is returned without any update.

        Parameters
        ----------
        X, y, sample_weight : ndarray (the training dtype, C-contiguous)
            The batch; they must stay alive during the call.
        learning_rate : float
            Current learning rate of the schedule.
        """
        return self._backend.train_batch(X, y, sample_weight, learning_rate)

    def apply_gradients(self, gradients: Sequence[np.ndarray], learning_rate: float):
        """Update the weights with gradients computed elsewhere; return what
        :meth:`restore` takes to undo it.

        One step of the optimizer, as :meth:`train_batch` makes after its backward
        pass: the data-parallel fit on a dask cluster sums the gradients of a batch
        over the workers and updates the weights here.

        Parameters
        ----------
        gradients : list of ndarray
            The gradient of the loss for each trained weight.
        learning_rate : float
            Current learning rate of the schedule.
        """
        return self._backend.apply_gradients(gradients, learning_rate)

    def checkpoint(self):
        """Return the current weights and optimizer state (for :meth:`restore`)."""
        return self._backend.checkpoint()

    def restore(self, checkpoint) -> None:
        """Go back to a state returned by :meth:`checkpoint`."""
        self._backend.restore(checkpoint)

    def undo_last_step(self) -> None:
        """Go back to the weights and state before the last update (if any)."""
        self._backend.undo_last_step()

    def release_sessions(self) -> None:
        """Free what the training sessions hold at the end of a fit (see the backend's)."""
        self._backend.release_sessions()

    def reset_optimizer(self) -> None:
        """Start the optimizer state afresh (``init_state`` of each weight), step count 0."""
        self._backend.reset_optimizer()

    def weights_finite(self) -> bool:
        """Return whether every weight is finite."""
        return self._backend.weights_finite()

    def is_finite(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray) -> bool:
        """Return whether every weight, and the loss on a batch, are finite."""
        return self._backend.is_finite(X, y, sample_weight)

    @property
    def has_masks(self) -> bool:
        """Whether the model has Dropout in training mode (masks drawn at each step)."""
        state = getattr(self._backend, "_run_state", None)
        return state is not None and bool(state.masks)

    def seed_masks(self, seed: int) -> None:
        """Draw the next dropout masks from ``numpy.random.RandomState(seed)``."""
        self._backend._run_state.seed(seed)

    def statistics(self) -> dict:
        """The running statistics of BatchNormalization in training mode, by name
        (empty for other models)."""
        found = getattr(self._backend, "statistics", None)
        return {} if found is None else found()

    def set_statistics(self, statistics) -> None:
        """Set the running statistics (:meth:`statistics`'s, by name; None or empty:
        unchanged)."""
        if statistics:
            self._backend._run_state.set({"statistics": statistics})

    def snapshot(self) -> tuple:
        """Copies of the current weights and running statistics (:meth:`statistics`):
        what a callback's ``fitted_estimator`` predicts with."""
        return self.get_weights(), self.statistics()

    def get_weights(self) -> list[np.ndarray]:
        """Return copies of the current weights."""
        return self._backend.get_weights()

    def set_weights(self, arrays: Sequence[np.ndarray]) -> None:
        """Replace the weights by copies of ``arrays``."""
        self._backend.set_weights(arrays)

    def get_state(self) -> dict:
        """Return the optimizer state as numpy arrays, with its names (for pickling)."""
        return self._backend.get_state()

    def set_state(self, saved: dict) -> None:
        """Restore an optimizer state returned by :meth:`get_state`, matched by name."""
        self._backend.set_state(saved)

    def _arrays(self, X, y, sample_weight):
        X = runtime.input_array(X, self.dtype)
        y = np.ascontiguousarray(np.reshape(y, (X.shape[0], -1)), dtype=self.dtype)
        if sample_weight is None:
            sample_weight = np.ones(X.shape[0], dtype=self.dtype)
        return X, y, np.ascontiguousarray(sample_weight, dtype=self.dtype)

    def loss(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None) -> float:
        """Return the loss (penalty included) on ``X``, ``y`` with the current weights.

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features)
            Samples.
        y : ndarray of shape (n_samples, n_outputs)
            Targets.
        sample_weight : ndarray of shape (n_samples,), default=None
            Weights (ones by default).
        """
        return self._backend.loss(*self._arrays(X, y, sample_weight))

    def loss_and_gradients(
        self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None
    ) -> tuple[float, list[np.ndarray]]:
        """Return the loss and its gradient for each trained weight, without updating.

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features)
            Samples.
        y : ndarray of shape (n_samples, n_outputs)
            Targets.
        sample_weight : ndarray of shape (n_samples,), default=None
            Weights (ones by default).
        """
        return self._backend.loss_and_gradients(*self._arrays(X, y, sample_weight))

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Return the model's predictions for ``X`` with the current weights."""
        return self._backend.predict(X)


@dataclasses.dataclass(frozen=True)
class EngineRecipe:
    """What a :class:`TrainingEngine` is built from, besides the loss, the update rule,
    the penalty and the threads: small and picklable (a fit on a dask cluster sends one
    to its workers, which build their engines from it).

    Parameters
    ----------
    converted : ConvertedTemplate
        The converted template (:class:`~onnxgrad_sklearn.templates.ConvertedTemplate`):
        its artifact's key names the structure, its values are the starting weights.
    output_name : str
        Its prediction output.
    weight_names : tuple of str
        The initializers to train.
    penalized : tuple of str
        Those the penalty applies to.
    n_outputs : int
        Width of the targets.
    device : str, default="cpu"
        ``"cpu"`` or ``"cuda[:N]"``.
    backend : {"auto", "agent", "standard"}, default="auto"
        Which backend trains (see :class:`TrainingEngine`).
    """

    converted: object
    output_name: str
    weight_names: tuple
    penalized: tuple
    n_outputs: int
    device: str = "cpu"
    backend: str = "auto"

    @classmethod
    def of(cls, converted, n_outputs, device="cpu", backend="auto") -> EngineRecipe:
        """The recipe that trains ``converted``'s trainable parameters, the penalty on
        those it marks penalized.

        Parameters
        ----------
        converted : ConvertedTemplate
            The converted template.
        n_outputs : int
            Width of the targets.
        device : str, default="cpu"
            ``"cpu"`` or ``"cuda[:N]"``.
        backend : {"auto", "agent", "standard"}, default="auto"
            Which backend trains.

        Returns
        -------
        EngineRecipe
        """
        names = converted.initializer_names
        trained = [k for k, p in enumerate(converted.params) if p.trainable]
        return cls(
            converted,
            converted.output_name,
            tuple(names[k] for k in trained),
            tuple(names[k] for k in trained if converted.params[k].penalized),
            n_outputs,
            device,
            backend,
        )

    def with_weights(self, weights: Sequence[np.ndarray]) -> EngineRecipe:
        """This recipe, its converted template (a copy) holding ``weights`` as the
        values of :attr:`weight_names`: what a large model's engine holds alone while
        it trains (``_base._release_trained_values``).

        Parameters
        ----------
        weights : list of ndarray
            A value for each of :attr:`weight_names`, in that order.

        Returns
        -------
        EngineRecipe
        """
        conv = copy.copy(self.converted)
        where = {name: k for k, name in enumerate(conv.initializer_names)}
        indices = [where[name] for name in self.weight_names]
        values = conv.initializer_values(skip=set(indices))
        for k, w in zip(indices, weights):
            values[k] = w
        conv.model = conv.with_values(values)
        return dataclasses.replace(self, converted=conv)

    def build(
        self,
        loss: BaseLoss,
        optimizer: BaseOptimizer,
        alpha: float = 0.0,
        l1_ratio: float = 0.0,
        threads: int = 0,
    ) -> TrainingEngine:
        """A training engine of this recipe.

        Parameters
        ----------
        loss : BaseLoss
            The loss.
        optimizer : BaseOptimizer
            The update rule.
        alpha, l1_ratio : float, default=0.0
            Elastic-net penalty.
        threads : int, default=0
            Intra-op threads of the sessions (0: the runtime's default).

        Returns
        -------
        TrainingEngine
        """
        return TrainingEngine(
            self.converted,  # its artifact's key names the structure; its values are the start
            self.output_name,
            self.weight_names,
            self.penalized,
            self.n_outputs,
            loss,
            optimizer,
            alpha=alpha,
            l1_ratio=l1_ratio,
            device=self.device,
            backend=self.backend,
            threads=threads,
        )
