"""The training loop's inner machinery: training graph, batches, updates.

:func:`build_training_graph` appends the loss (weighted by the sample weights)
and the elastic-net penalty to the converted model, so the gradient graph
returns the gradient of the very number reported as the loss, and the backward
pass is fed a constant 1.

:class:`TrainingEngine` owns everything that lives in the runtime during a fit:
the forward/backward object, the optimizer's update session, the weights and
the optimizer state as ``OrtValue`` objects. One call of
:meth:`TrainingEngine.train_batch` runs forward, backward and the update.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime

from ._graph import GraphBuilder, tensor_info
from .losses import BaseLoss
from .optim import BaseOptimizer
from .ortgrad import (
    BoundRun,
    OrtGradientForwardBackward,
    OrtValue,
    device_to_providers,
    ortvalue_view,
    run_with_ortvalues,
    static_shapes,
    to_ortvalue,
)

__all__ = ["TrainingEngine", "build_training_graph", "weights_as_inputs"]

logger = logging.getLogger("onnxgrad_sklearn")

Y_NAME = "y_true"
SW_NAME = "sample_weight"
LOSS_NAME = "loss"
BATCH = "batch"


def build_training_graph(
    model: onnx.ModelProto,
    output_name: str,
    n_outputs: int,
    loss: BaseLoss,
    alpha: float = 0.0,
    l1_ratio: float = 0.0,
    penalized: Sequence[str] = (),
    loss_input=None,
) -> onnx.ModelProto:
    """Return ``model`` extended with the loss and penalty as its only output.

    The new graph has the inputs of ``model`` plus ``y_true`` (float32,
    ``(n_samples, n_outputs)``) and ``sample_weight`` (float32, ``(n_samples,)``),
    and one scalar output ``loss``::

        sum_i w_i * loss_i / sum_i w_i
        + alpha * ((1 - l1_ratio) / 2 * sum ||W||_2^2 + l1_ratio * sum ||W||_1) / sum_i w_i

    the sums running over the ``penalized`` initializers (with ``l1_ratio=0``
    and unit weights, MLPRegressor's loss).

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
        ``(n_samples, n_outputs)`` into what the loss receives (the classifier
        adds the zero logit of a binary problem's first class).
    """
    g = GraphBuilder("train")
    pred = g.op("Reshape", output_name, g.const([-1, n_outputs], np.int64))
    if loss_input is not None:
        pred = loss_input(g, pred)
    per_sample = loss.build(g, pred, Y_NAME)
    sw_sum = g.sum(SW_NAME)
    total = g.div(g.sum(g.mul(per_sample, SW_NAME)), sw_sum)
    if alpha > 0 and penalized:
        l2 = l1 = None
        for name in penalized:
            if l1_ratio < 1:
                sq = g.sum(g.mul(name, name))
                l2 = sq if l2 is None else g.add(l2, sq)
            if l1_ratio > 0:
                ab = g.sum(g.abs(name))
                l1 = ab if l1 is None else g.add(l1, ab)
        terms = []
        if l2 is not None:
            terms.append(g.mul(l2, g.const(0.5 * alpha * (1 - l1_ratio))))
        if l1 is not None:
            terms.append(g.mul(l1, g.const(alpha * l1_ratio)))
        penalty = terms[0] if len(terms) == 1 else g.add(*terms)
        total = g.add(total, g.div(penalty, sw_sum))
    g.identity(total, LOSS_NAME)

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
    graph.input.extend([tensor_info(Y_NAME, [BATCH, None]), tensor_info(SW_NAME, [BATCH])])
    del graph.output[:]
    graph.output.append(tensor_info(LOSS_NAME, []))
    # With every shape of the loss part known (no Reshape to -1, the width of y_true
    # given), the gradient builder resolves its broadcasting at build time too.
    renamed, shapes = _drop_noop_reshapes(out)
    while pred in renamed:
        pred = renamed[pred]
    width = shapes.get(pred, [None])[-1]
    if isinstance(width, int):
        graph.input[-2].type.tensor_type.shape.dim[1].dim_value = width
    return out


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


def _drop_noop_reshapes(model: onnx.ModelProto) -> dict:
    """Remove the ``Reshape`` nodes that keep their input's shape, in place.

    skl2onnx and :func:`build_training_graph` reshape predictions to
    ``(-1, n_outputs)``; with the batch dimension a symbol, shape inference loses
    it after such a node and onnxruntime's gradient builder then computes the
    broadcasting of every later operator at run time (``Shape``,
    ``BroadcastGradientArgs``, ``ReduceSum``, ``Reshape`` nodes at each batch).
    Returns ``{removed output: its input}`` and the shapes of the graph left.
    """
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
    """Return a copy of ``model`` where the initializers ``names`` are graph inputs."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    wanted = set(names)
    kept = [i for i in out.graph.initializer if i.name not in wanted]
    moved = {i.name: i for i in out.graph.initializer if i.name in wanted}
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    for name in names:
        init = moved[name]
        out.graph.input.append(tensor_info(name, list(init.dims), init.data_type))
    return out


def session_options(threads: int = 0) -> onnxruntime.SessionOptions:
    """Session options of the package's sessions (``threads=0``: the runtime's default)."""
    so = onnxruntime.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    return so


class _FlatBuffers:
    """Weights and optimizer state as two sets of vectors the update alternates between.

    Each set holds the weights end to end in one float32 vector, and each state
    (velocity, moments) in another. The update graph reads the current set and
    writes the other through IO binding: nothing is allocated per batch, and
    the values before the last update stay intact until the next one. Forward,
    backward and predict read the weights through zero-copy per-tensor views.
    """

    def __init__(self, shapes, state_names, session, learning_rate):
        sizes = [math.prod(shape) for shape in shapes]
        offsets = np.cumsum([0, *sizes])
        n_state = len(state_names)
        # arrays[parity][k]: vector k (0 the weights, 1.. the states) of one set
        self.arrays = [
            [np.zeros(int(offsets[-1]), dtype=np.float32) for _ in range(1 + n_state)]
            for _ in range(2)
        ]
        self.views = [
            [
                [v[o : o + n].reshape(shape) for o, n, shape in zip(offsets, sizes, shapes)]
                for v in vectors
            ]
            for vectors in self.arrays
        ]
        tensors = [[[ortvalue_view(a) for a in views] for views in p] for p in self.views]
        self.weights = [p[0] for p in tensors]
        self.state = [
            [[p[1 + k][i] for k in range(n_state)] for i in range(len(shapes))] for p in tensors
        ]
        names = ["param", *state_names]
        vectors = [[ortvalue_view(v) for v in p] for p in self.arrays]
        self.runs = [
            BoundRun(
                session,
                {"learning_rate": learning_rate, **dict(zip(names, vectors[p]))},
                {f"new_{n}": v for n, v in zip(names, vectors[1 - p])},
            )
            for p in (0, 1)
        ]
        self._vectors = vectors  # the runs read them
        self.grad_names = [f"grad_{i}" for i in range(len(shapes))]
        self.current = 0

    def write(self, k: int, arrays, start: int = 0) -> None:
        """Copy ``arrays`` (weights ``start``, ``start + 1``...) into vector ``k`` of this set."""
        for view, array in zip(self.views[self.current][k][start:], arrays):
            np.copyto(view, np.asarray(array, dtype=np.float32).reshape(view.shape))


class TrainingEngine:
    """Weights, gradients and optimizer state of one fit, kept in the runtime.

    Parameters
    ----------
    model : onnx.ModelProto
        Inference graph holding the starting weights.
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
        Elastic-net penalty.
    device : str
        ``"cpu"`` or ``"cuda[:N]"``.
    loss_input : callable, optional
        See :func:`build_training_graph`.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
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
    ):
        self.device = device
        self.providers, self.device_index = device_to_providers(device)
        self.weight_names = list(weight_names)
        self.output_name = output_name
        self.optimizer = optimizer
        so = session_options()
        training = build_training_graph(
            model, output_name, n_outputs, loss, alpha, l1_ratio, penalized, loss_input
        )
        self.forward_backward = OrtGradientForwardBackward(
            training, self.weight_names, device=device, session_options=so
        )
        inits = {i.name: i for i in model.graph.initializer}
        start = [onnx.numpy_helper.to_array(inits[n]) for n in self.weight_names]
        self.shapes = [w.shape for w in start]
        # On CPU an element-wise rule updates one flat vector per set (see
        # _FlatBuffers); otherwise each weight has its own outputs.
        flat = device == "cpu" and optimizer.elementwise
        update_model = optimizer.build_update_model(self.shapes, flat=flat)
        # The update session runs on one thread. A second pool of threads competes
        # with the training session's: measured in separate processes, 20,000 rows,
        # batch 256, the flat update on the default pool takes an epoch of the
        # 100-256-256-1 MLP from 0.105 s to 0.14-0.17 s.
        self._update = onnxruntime.InferenceSession(
            update_model.SerializeToString(),
            sess_options=session_options(threads=1),
            providers=self.providers,
        )
        self._update_inputs = [i.name for i in self._update.get_inputs()]
        self._model = model  # its predict session is made on first use
        self._predict = None
        self._one = to_ortvalue(np.array(1.0, dtype=np.float32), device)
        self._lr = to_ortvalue(np.array(0.0, dtype=np.float32), device)
        self._previous = None
        self._flat = None
        if flat:
            self._flat = _FlatBuffers(self.shapes, optimizer.state_names, self._update, self._lr)
            self._flat.write(0, start)
            self._use_set(0)
        else:
            self.weights: list[OrtValue] = [to_ortvalue(w, device) for w in start]
        self.reset_optimizer()

    # state -------------------------------------------------------------
    def _use_set(self, parity: int) -> None:
        flat = self._flat
        flat.current = parity
        self.weights = flat.weights[parity]
        self.state = flat.state[parity]

    def reset_optimizer(self) -> None:
        """Start the optimizer state afresh (``init_state`` of each weight), step count 0."""
        self.step = 0
        self._previous = None
        names = self.optimizer.state_names
        if self._flat is None:
            initial = [self.optimizer.init_state(w) for w in self.get_weights()]
            self._load_state([[st[name] for name in names] for st in initial])
            return
        # One weight at a time: no copy of all the weights and states at once.
        for i in range(len(self.shapes)):
            weight = self._flat.views[self._flat.current][0][i].copy()
            initial = self.optimizer.init_state(weight)
            for k, name in enumerate(names):
                self._flat.write(1 + k, [initial[name]], start=i)

    def _load_state(self, per_weight) -> None:
        # per_weight[i][k]: state k (in state_names order) of weight i
        if self._flat is not None:
            for k in range(len(self.optimizer.state_names)):
                self._flat.write(1 + k, [st[k] for st in per_weight])
            return
        self.state = [[to_ortvalue(s, self.device) for s in st] for st in per_weight]

    def checkpoint(self):
        """Return the current weights and optimizer state.

        References to the runtime's values (no copy) when each update makes new
        ones; a copy when the engine updates its buffers in turn.
        """
        if self._flat is not None:
            arrays = [v.copy() for v in self._flat.arrays[self._flat.current]]
            return arrays, None, self.step
        return list(self.weights), [list(s) for s in self.state], self.step

    def restore(self, checkpoint) -> None:
        """Go back to a state returned by :meth:`checkpoint`."""
        weights, state, step = checkpoint
        self.step = step
        self._previous = None
        if self._flat is not None:
            for target, saved in zip(self._flat.arrays[self._flat.current], weights):
                np.copyto(target, saved)
            return
        self.weights, self.state = list(weights), [list(s) for s in state]

    def undo_last_step(self) -> None:
        """Go back to the weights and state before the last update (if any)."""
        previous, self._previous = self._previous, None
        if previous is None:
            return
        if self._flat is not None:
            parity, self.step = previous  # that set has not been written since
            self._use_set(parity)
        else:
            self.restore(previous)

    def is_finite(self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray) -> bool:
        """Return whether every weight, and the loss on a batch, are finite."""
        if not all(np.isfinite(w.numpy()).all() for w in self.weights):
            return False
        return bool(np.isfinite(self.loss(X, y, sample_weight)))

    def get_weights(self) -> list[np.ndarray]:
        """Return copies of the current weights."""
        return [w.numpy().copy() for w in self.weights]

    def set_weights(self, arrays: Sequence[np.ndarray]) -> None:
        """Replace the weights by copies of ``arrays``."""
        self._previous = None
        if self._flat is not None:
            self._flat.write(0, arrays)
            return
        self.weights = [
            to_ortvalue(np.asarray(a, dtype=np.float32).reshape(s), self.device)
            for a, s in zip(arrays, self.shapes)
        ]

    def get_state(self) -> dict:
        """Return the optimizer state as numpy arrays (for pickling)."""
        return {"step": self.step, "state": [[s.numpy().copy() for s in st] for st in self.state]}

    def set_state(self, saved: dict) -> None:
        """Restore an optimizer state returned by :meth:`get_state`."""
        self.step = int(saved["step"])
        self._previous = None
        self._load_state(saved["state"])

    # passes ------------------------------------------------------------
    def _feed(self, array: np.ndarray) -> OrtValue:
        # Zero copy on CPU: the caller keeps ``array`` alive until the batch ends.
        return ortvalue_view(array, self.device)

    def train_batch(
        self, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray, learning_rate: float
    ) -> float:
        """Run forward, backward and the update on one batch; return its loss.

        A non-finite loss is returned without any update.

        Parameters
        ----------
        X, y, sample_weight : ndarray (float32, C-contiguous)
            The batch; they must stay alive during the call.
        learning_rate : float
            Current learning rate of the schedule.
        """
        fb = self.forward_backward
        outputs, state = fb.forward(
            [self._feed(X), self._feed(y), self._feed(sample_weight)], self.weights
        )
        loss = float(outputs[0].numpy())
        if not np.isfinite(loss):
            return loss  # no update: the caller decides what to do
        grads = fb.backward([self._one], state)
        flat = self._flat
        # What undo_last_step goes back to, without a copy: the update either
        # returns new values (the previous ones stay valid) or writes the other
        # set of buffers (the set it reads stays as it is until the next update).
        self._previous = self.checkpoint() if flat is None else (flat.current, self.step)
        self.step += 1
        lr = self.optimizer.step_learning_rate(learning_rate, self.step)
        self._lr.update_inplace(np.array(lr, dtype=np.float32))
        if flat is not None:
            flat.runs[flat.current].run(dict(zip(flat.grad_names, grads)))
            self._use_set(1 - flat.current)
            return loss
        feeds = [self._lr]
        for w, gr, st in zip(self.weights, grads, self.state):
            feeds.append(w)
            feeds.append(gr)
            feeds.extend(st)
        results = run_with_ortvalues(self._update, self._update_inputs, feeds)
        k = 1 + len(self.optimizer.state_names)
        self.weights = [results[i * k] for i in range(len(self.weights))]
        self.state = [results[i * k + 1 : (i + 1) * k] for i in range(len(self.weights))]
        return loss

    def _forward(self, X, y, sample_weight):
        X = np.ascontiguousarray(X, dtype=np.float32)
        y = np.ascontiguousarray(np.reshape(y, (X.shape[0], -1)), dtype=np.float32)
        if sample_weight is None:
            sample_weight = np.ones(X.shape[0], dtype=np.float32)
        sample_weight = np.ascontiguousarray(sample_weight, dtype=np.float32)
        outputs, state = self.forward_backward.forward(
            [self._feed(X), self._feed(y), self._feed(sample_weight)], self.weights
        )
        # The backward pass reads the batch through the state: the caller keeps
        # the arrays (third item) alive until it is done.
        return float(outputs[0].numpy()), state, (X, y, sample_weight)

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
        return self._forward(X, y, sample_weight)[0]

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
        loss, state, batch = self._forward(X, y, sample_weight)
        grads = self.forward_backward.backward([self._one], state)
        del batch  # no longer read
        return loss, [g.numpy().copy() for g in grads]

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Return the model's predictions for ``X`` with the current weights."""
        if self._predict is None:
            self._predict = onnxruntime.InferenceSession(
                weights_as_inputs(self._model, self.weight_names).SerializeToString(),
                sess_options=session_options(),
                providers=self.providers,
            )
        names = [i.name for i in self._predict.get_inputs()]
        X = np.ascontiguousarray(X, dtype=np.float32)
        feeds = [self._feed(X)] + self.weights
        out = run_with_ortvalues(self._predict, names, feeds, [self.output_name])
        return out[0].numpy().copy()
