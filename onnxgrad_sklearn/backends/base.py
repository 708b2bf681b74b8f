"""What every training backend shares: the :class:`Backend` interface the fit loop
talks to, the process's shared sessions, and the checks of a trained graph."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

import numpy as np

from .. import runtime
from .._lazy import lazy
from .._names import LOSS
from ..runtime import (
    SESSIONS,
    OrtValue,
    device_to_providers,
    input_array,
    make_session,
    options_key,
    ortvalue_view,
    run_with_ortvalues,
    session_options,
    session_providers,
)

onnx = lazy("onnx")

logger = logging.getLogger("onnxgrad_sklearn")


#: Operators whose derivative is zero almost everywhere: a loss reaching the
#: weights only through them cannot move the weights.
ZERO_DERIVATIVE_OPS = frozenset(
    {
        "Round", "Floor", "Ceil", "Sign", "Equal", "Greater", "GreaterOrEqual", "Less",
        "LessOrEqual", "ArgMax", "ArgMin", "Hardmax", "OneHot", "IsNaN", "IsInf",
    }
)  # fmt: skip


def zero_derivative_nodes(
    training: onnx.ModelProto, weight_names: Sequence[str]
) -> list[onnx.NodeProto]:
    """The nodes on the differentiated path whose derivative is zero almost everywhere."""
    from .._passes import differentiated_nodes

    path = differentiated_nodes(training, weight_names, LOSS)
    return [n for n in path if n.domain in ("", "ai.onnx") and n.op_type in ZERO_DERIVATIVE_OPS]


def all_finite(array: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Return whether every value of ``array`` is finite, by chunks of ``chunk`` values.

    ``np.isfinite(array).all()`` makes a boolean array of the weight's size, at the
    end of each fit, while the step session still holds its memory.
    """
    flat = np.asarray(array).reshape(-1)
    return all(np.isfinite(flat[i : i + chunk]).all() for i in range(0, flat.size, chunk))


def batch_key(arrays) -> tuple:
    """Where a batch's arrays are: the address, shape and dtype of each."""
    return tuple((a.__array_interface__["data"][0], a.shape, a.dtype.str) for a in arrays)


class LastBatch:
    """The arrays a step was last given (kept alive, so that their ids stay theirs), their
    :func:`batch_key`, and what the backend made for them (``value``).

    The fit loop gathers shuffled batches into the same array objects, whose memory
    does not move: :meth:`holds` tells them without working out their addresses.
    """

    __slots__ = ("arrays", "key", "value")

    def __init__(self, arrays, key, value=None):
        self.arrays, self.key, self.value = tuple(arrays), key, value

    def holds(self, arrays) -> bool:
        """Whether ``arrays`` are these very arrays, in the same shapes (an array's shape
        can be set in place)."""
        return all(a is b and a.shape == k[1] for a, b, k in zip(arrays, self.arrays, self.key))


def shared_session(
    blob: bytes, digest, options, providers, provider_options=None, weights=0, **kwargs
):
    """The process's session of the graph ``blob`` (:data:`~onnxgrad_sklearn.runtime.SESSIONS`),
    found by ``digest`` and the session's settings; ``digest=None``: a new one.
    ``weights``: those of the model, what bounds the pool's memory."""

    def make():
        return make_session(blob, options, providers, provider_options, **kwargs)

    if digest is None:
        return make()
    key = (digest, options_key(options, providers, provider_options, **kwargs))
    return SESSIONS.shared(key, make, weights)


class Backend:
    """What the fit loop asks of a training backend.

    One object owns the weights and the optimizer state of one fit in the
    runtime, runs a training step per batch and can go back: to a checkpoint,
    or to before the last step.

    Parameters
    ----------
    plan : Plan
        The graphs to run (:func:`~onnxgrad_sklearn.backends.build_plan`,
        :func:`~onnxgrad_sklearn.backends.find_plan`): the training graph
        (:func:`onnxgrad_sklearn.engine.build_training_graph`, inputs the model's,
        ``y_true`` and ``sample_weight`` and the penalty's coefficients, output
        ``loss``), the inference graph, and the backend's own.
    output_name : str
        Its prediction output.
    weight_names : list of str
        The trained initializers.
    start : list of numpy.ndarray
        Their starting values.
    optimizer : BaseOptimizer
        The update rule.
    device : str
        ``"cpu"`` or ``"cuda[:N]"``.
    options : onnxruntime.SessionOptions
        Options of the training sessions.
    update_options : onnxruntime.SessionOptions
        Options of a separate update session (one thread), where there is one.
    inference_options : onnxruntime.SessionOptions
        Options of the sessions that run now and then during a fit (predictions of a
        validation set, the loss alone): the training sessions' threads, not spinning
        (:func:`~onnxgrad_sklearn.runtime.session_options`).
    constants : dict of str to float, optional
        Inputs of the training graph that keep their value for the whole fit (the
        penalty's coefficients), by name.

    Attributes
    ----------
    name : str
        ``"agent"`` or ``"standard"``.
    step : int
        Updates since the optimizer state was created.
    plan : Plan
        The graphs it runs.
    shared : bool
        Whether its sessions are the process's (:data:`~onnxgrad_sklearn.runtime.SESSIONS`,
        shared with the other fits of the structure): all but those of a model of
        :data:`~onnxgrad_sklearn.runtime.LARGE_MODEL` weights or more, whose sessions
        hold enough memory to be freed with the fit.
    """

    name = ""

    def __init__(
        self,
        plan,
        output_name,
        weight_names,
        start,
        optimizer,
        device="cpu",
        options=None,
        update_options=None,
        constants=None,
        inference_options=None,
    ):
        self.output_name = output_name
        self.weight_names = list(weight_names)
        self.shapes = [tuple(np.shape(w)) for w in start]
        self.optimizer = optimizer
        self.device = device
        self.providers, self.device_index = device_to_providers(device)
        # read now, at fit time: every session of this fit (CUDA: device_id, use_tf32)
        _, self.provider_options = session_providers(device)
        self.options = session_options() if options is None else options
        self.update_options = session_options(1) if update_options is None else update_options
        if inference_options is None:
            inference_options = session_options(self.options.intra_op_num_threads, spinning=False)
        self.inference_options = inference_options
        self.step = 0
        self._predict = None
        #: The training dtype (float32 or float64): that of the weights.
        self.dtype = np.asarray(start[0]).dtype if len(start) else np.dtype(np.float32)
        self.plan = plan
        self.constants = {
            name: np.asarray(value, dtype=self.dtype) for name, value in (constants or {}).items()
        }
        #: The number of weights trained.
        self.n_weights = sum(int(np.prod(shape)) for shape in self.shapes)
        self.shared = self.n_weights < runtime.LARGE_MODEL

    @property
    def model(self) -> onnx.ModelProto | None:
        """The inference graph with the weights as inputs (parsed at each call), or None."""
        return self.plan.model("predict.onnx") if "predict.onnx" in self.plan.blobs else None

    def session(self, blob: str, digest: str | None = None, options=None, **kwargs):
        """A session of ``blob`` (a name in :attr:`plan`, or bytes and their ``digest``).

        The process's when :attr:`shared` (made by the first fit that asks, then
        found by the others), else one of this backend's own. ``options``: the
        training sessions' by default; ``kwargs`` go to ``make_session``.
        """
        if isinstance(blob, str):
            blob, digest = self.plan.blobs[blob], self.plan.digest(blob)
        options = self.options if options is None else options
        return shared_session(
            blob, digest if self.shared else None, options, self.providers, self.provider_options,
            weights=self.n_weights, **kwargs,
        )  # fmt: skip

    # what each backend implements --------------------------------------
    @property
    def weights(self) -> list[OrtValue]:
        """The current weights, one ``OrtValue`` per trained tensor."""
        raise NotImplementedError

    @property
    def state(self) -> list[list[OrtValue]]:
        """``state[i][k]``: the optimizer state ``k`` (``state_names`` order) of weight ``i``."""
        raise NotImplementedError

    def train_batch(self, X, y, sample_weight, learning_rate: float) -> float:
        """Run forward, backward and the update on one batch; return its loss.

        A non-finite loss is returned without any update.
        """
        raise NotImplementedError

    def loss(self, X, y, sample_weight) -> float:
        """The loss (penalty included) on a batch with the current weights."""
        raise NotImplementedError

    def loss_and_gradients(self, X, y, sample_weight) -> tuple[float, list[np.ndarray]]:
        """The loss and its gradient for each weight, without updating."""
        raise NotImplementedError

    def checkpoint(self):
        """Return the current weights and optimizer state (for :meth:`restore`)."""
        raise NotImplementedError

    def restore(self, checkpoint) -> None:
        """Go back to a state returned by :meth:`checkpoint`."""
        raise NotImplementedError

    def undo_last_step(self) -> None:
        """Go back to the weights and state before the last update (if any)."""
        raise NotImplementedError

    def set_weights(self, arrays) -> None:
        """Replace the weights by copies of ``arrays``."""
        raise NotImplementedError

    def _load_state(self, per_weight) -> None:
        raise NotImplementedError

    # shared --------------------------------------------------------------
    def release_sessions(self) -> None:
        """Free what the training sessions hold at the end of a fit; nothing by default.

        A backend that frees its sessions makes them again at the next step.
        """

    def reset_optimizer(self) -> None:
        """Start the optimizer state afresh (``init_state`` of each weight), step count 0."""
        self.step = 0
        self._previous = None
        names = self.optimizer.state_names
        initial = [self.optimizer.init_state(w) for w in self._current_weights()]
        self._load_state([[st[name] for name in names] for st in initial])

    def _current_weights(self) -> list[np.ndarray]:
        """The current weights, to read only: views where the backend has them, else copies."""
        return self.get_weights()

    def get_weights(self) -> list[np.ndarray]:
        """Return copies of the current weights."""
        return [w.numpy().copy() for w in self.weights]

    def get_state(self) -> dict:
        """Return the optimizer state as numpy arrays, with its names (for pickling)."""
        return {
            "step": self.step,
            "state_names": list(self.optimizer.state_names),
            "weight_names": list(self.weight_names),
            "state": self._state_arrays(),
        }

    def _state_arrays(self) -> list[list[np.ndarray]]:
        """Copies of the optimizer state, ``[weight][state]`` (as :attr:`state`)."""
        return [[s.numpy().copy() for s in st] for st in self.state]

    def set_state(self, saved: dict) -> None:
        """Restore an optimizer state returned by :meth:`get_state` (by either backend).

        States are matched by name (``state_names`` and ``weight_names`` when
        ``saved`` has them, positions otherwise); a state the saved one lacks
        starts from ``init_state``.
        """
        self.step = int(saved["step"])
        self._previous = None
        names = list(self.optimizer.state_names)
        saved_names = list(saved.get("state_names", names))
        by_weight = dict(zip(saved.get("weight_names", self.weight_names), saved["state"]))
        per_weight = []
        for weight_name, weight in zip(self.weight_names, self.get_weights()):
            values = dict(zip(saved_names, by_weight.get(weight_name, [])))
            initial = self.optimizer.init_state(weight)
            row = []
            for name in names:
                value = values.get(name)
                if value is None or np.shape(value) != np.shape(weight):
                    if value is not None or weight_name in by_weight:
                        logger.info(
                            "optimizer state %r of %s not in the saved state: starts afresh",
                            name,
                            weight_name,
                        )
                    value = initial[name]
                row.append(value)
            per_weight.append(row)
        self._load_state(per_weight)

    def weights_finite(self) -> bool:
        """Return whether every weight is finite."""
        return all(all_finite(w) for w in self.get_weights())

    def is_finite(self, X, y, sample_weight) -> bool:
        """Return whether every weight, and the loss on a batch, are finite."""
        if not self.weights_finite():
            return False
        return bool(np.isfinite(self.loss(X, y, sample_weight)))

    def _feed(self, array: np.ndarray) -> OrtValue:
        # Zero copy on CPU: the caller keeps ``array`` alive until the batch ends.
        return ortvalue_view(array, self.device)

    def predict(self, X) -> np.ndarray:
        """Return the model's predictions for ``X`` with the current weights."""
        if self._predict is None:
            self._predict = self.session("predict.onnx", options=self.inference_options)
        names = [i.name for i in self._predict.get_inputs()]
        X = input_array(X, self.dtype)
        feeds = [self._feed(X)] + list(self.weights)
        out = run_with_ortvalues(self._predict, names, feeds, [self.output_name])
        return out[0].numpy().copy()

    def apply_gradients(self, gradients, learning_rate: float):
        """Update the weights with gradients computed elsewhere (a dask cluster's sums).

        Runs the optimizer's update graph, as :meth:`train_batch` does after its
        backward pass, on the current weights and state and ``gradients`` (one array
        per trained weight, cast to the training dtype). The update session is made at
        the first call. Returns what :meth:`restore` takes to undo the update.
        """
        previous = self.checkpoint()
        if getattr(self, "_apply_session", None) is None:
            model = self.optimizer.build_update_model(self.shapes, dtype=self.dtype)
            self._apply_session = make_session(model, self.update_options, ["CPUExecutionProvider"])
            self._apply_names = [i.name for i in self._apply_session.get_inputs()]
        names = self.optimizer.state_names
        feeds = [np.array(self.optimizer.step_learning_rate(learning_rate, self.step + 1))]
        for w, g, st in zip(self.get_weights(), gradients, self._state_arrays()):
            feeds.extend([w, np.asarray(g).reshape(w.shape), *st])
        feeds = {
            n: np.ascontiguousarray(v, dtype=self.dtype) for n, v in zip(self._apply_names, feeds)
        }
        out = self._apply_session.run(None, feeds)
        k = 1 + len(names)
        self.set_weights(out[::k])
        self._load_state([out[i * k + 1 : (i + 1) * k] for i in range(len(self.shapes))])
        self.step = previous[2] + 1
        return previous


def zero_derivative_warning(training: onnx.ModelProto, weight_names: Sequence[str]):
    """The warning of a loss reaching the weights through an operator of zero
    derivative (None: it does not), as a fit gives it (:func:`warn`)."""
    nodes = zero_derivative_nodes(training, weight_names)
    if not nodes:
        return None
    named = ", ".join(sorted({f"{n.op_type} ({n.name or n.output[0]})" for n in nodes}))
    return (
        f"The training graph's loss depends on the weights through {named}, whose "
        "derivative is zero almost everywhere: no gradient flows back through it, so "
        "whatever the loss computes from its output cannot move the weights. Expected only "
        "where it selects values (a mask, a Where condition); otherwise write the loss "
        "with differentiable operators."
    )


def warn(message: str | None) -> None:
    """Give a warning a plan recorded (at each fit of it), pointing at the fit."""
    if message:
        warnings.warn(message, UserWarning, stacklevel=7)
