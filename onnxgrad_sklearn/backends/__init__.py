"""Training backends behind one interface, and the choice between them.

Two backends run the training step of a fit:

* ``"agent"`` (:mod:`.agent`): onnxruntime-training's gradient builder and
  ``TrainingAgent``; needs the training build (``onnxruntime-training-cpu``
  1.19.2, Python <= 3.12).
* ``"standard"`` (:mod:`.standard`): the gradient graph in standard ONNX
  operators from ``onnx_ad.reverse``, the update merged into it, one
  ``InferenceSession`` call per batch; any onnxruntime >= 1.20 (and the training
  build's), on the CPU or, with onnxruntime-gpu, on CUDA.

Both give the fit loop the methods of :class:`Backend`. A backend module is
imported only when it is chosen (:func:`make_backend`): the agent's module is
the only one touching the private training bindings.

What a backend runs comes from a :class:`Plan`: the graphs of one structure
(training, predict, and the backend's own: the agent's gradient and update
graphs, the standard backend's step graphs) as ONNX bytes and JSON metadata, a
training artifact (:mod:`onnxgrad_sklearn.artifacts`) built once and found again
by later fits, in this process or another. A backend made from a plan found in
the cache imports no onnx: its sessions are made from the bytes, and shared by
the fits of the process (:data:`onnxgrad_sklearn.runtime.SESSIONS`) unless the
model is large.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Sequence

import numpy as np

from .. import artifacts, runtime
from .._lazy import lazy
from ..runtime import (
    SESSIONS,
    OrtValue,
    device_to_providers,
    make_session,
    options_key,
    ortvalue_view,
    run_with_ortvalues,
    session_options,
    session_providers,
)

# imported on first use: a fit whose plan is cached parses no graph
onnx = lazy("onnx")

__all__ = [
    "AGENT_GRADIENT_OPS",
    "BACKENDS",
    "Backend",
    "Plan",
    "agent_available",
    "agent_unsupported_ops",
    "check_backend",
    "backend_class",
    "build_plan",
    "choose_backend",
    "find_plan",
    "make_backend",
    "shared_session",
]

logger = logging.getLogger("onnxgrad_sklearn")

BACKENDS = ("agent", "standard")

#: Operators onnxruntime-training 1.19's gradient builder can differentiate
#: (``orttraining/core/graph/gradient_builder_registry.cc``), and operators whose
#: outputs carry no gradient (comparisons, shapes), which it steps over.
AGENT_GRADIENT_OPS = frozenset(
    {
        "Abs", "Add", "ArgMax", "ArgMin", "AveragePool", "BatchNormalization", "Cast",
        "Clip", "Concat", "Constant", "ConstantOfShape", "Conv", "ConvTranspose", "Cos",
        "Div", "Dropout", "Einsum", "Equal", "Erf", "Exp", "Expand", "Flatten", "Gather",
        "GatherElements", "GatherND", "Gelu", "Gemm", "GlobalAveragePool", "Greater",
        "GreaterOrEqual", "Identity", "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu",
        "Less", "LessOrEqual", "Log", "LogSoftmax", "MatMul", "Max", "MaxPool", "Min",
        "Mul", "Neg", "NonZero", "Not", "Pad", "Pow", "Reciprocal", "ReduceL2", "ReduceLogSumExp",
        "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Relu", "Reshape",
        "ScatterElements", "ScatterND", "Shape", "Sigmoid", "Sin", "Size", "Slice",
        "Softmax", "SoftmaxCrossEntropyLoss", "Split", "Sqrt", "Squeeze", "Sub", "Sum",
        "Tanh", "Tile", "TopK", "Transpose", "Trilu", "Unsqueeze", "Where",
    }
)  # fmt: skip

#: Operators whose derivative is zero almost everywhere: a loss reaching the
#: weights only through them cannot move the weights.
ZERO_DERIVATIVE_OPS = frozenset(
    {
        "Round", "Floor", "Ceil", "Sign", "Equal", "Greater", "GreaterOrEqual", "Less",
        "LessOrEqual", "ArgMax", "ArgMin", "Hardmax", "OneHot", "IsNaN", "IsInf",
    }
)  # fmt: skip


@functools.lru_cache(maxsize=1)
def agent_available() -> bool:
    """Return whether the installed onnxruntime has the training bindings the agent needs."""
    try:
        from . import agent  # noqa: F401
    except ImportError as exc:
        logger.debug("TrainingAgent backend unavailable: %s", exc)
        return False
    return True


def agent_unsupported_ops(training: onnx.ModelProto, weight_names: Sequence[str]) -> list[str]:
    """Operators on the differentiated path of ``training`` the TrainingAgent cannot handle.

    Parameters
    ----------
    training : onnx.ModelProto
        The training graph (output ``loss``).
    weight_names : list of str
        The trained initializers.

    Returns
    -------
    list of str
        Sorted operator types (``domain:op`` outside the default domain).
    """
    from .._passes import differentiated_nodes

    path = differentiated_nodes(training, weight_names, "loss")
    return sorted(
        {
            n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
            for n in path
            if n.domain not in ("", "ai.onnx") or n.op_type not in AGENT_GRADIENT_OPS
        }
    )


def zero_derivative_nodes(
    training: onnx.ModelProto, weight_names: Sequence[str]
) -> list[onnx.NodeProto]:
    """The nodes on the differentiated path whose derivative is zero almost everywhere."""
    from .._passes import differentiated_nodes

    path = differentiated_nodes(training, weight_names, "loss")
    return [n for n in path if n.domain in ("", "ai.onnx") and n.op_type in ZERO_DERIVATIVE_OPS]


def _check_name(backend: str) -> None:
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"backend={backend!r} is not valid: use 'auto', 'agent' or 'standard'.")


def check_backend(backend: str, device: str, dtype=np.float32) -> None:
    """Refuse an explicit backend that cannot run here, before any conversion.

    Parameters
    ----------
    backend : {"auto", "agent", "standard"}
        The estimator's ``backend`` parameter.
    device : str
        The estimator's ``device``.
    dtype : numpy dtype, default=numpy.float32
        The training dtype: float64 trains on the standard backend only (the
        TrainingAgent's gradient kernels are float32), and on the CPU only.

    Raises
    ------
    ValueError
        Naming what is missing and the other backend.
    """
    _check_name(backend)
    if np.dtype(dtype) == np.float64:
        if backend == "agent":
            raise ValueError(
                "backend='agent' cannot train in float64: onnxruntime-training's "
                "TrainingAgent has float32 gradient kernels only. Use backend='standard' "
                "(or 'auto', which picks it for float64), or dtype='float32'."
            )
        if device_to_providers(device)[0][0] != "CPUExecutionProvider":
            # Refused rather than untested: no test has run it on a GPU, and which
            # operators have double CUDA kernels (the others fall back to the CPU)
            # was not checked; consumer GPUs also run float64 products at 1/32 to
            # 1/64 of the float32 rate.
            raise ValueError(
                f"dtype='float64' trains on the CPU only in this version, and "
                f"device={device!r} was asked for: use device='cpu', or dtype='float32' "
                "(both backends train float32 on CUDA)."
            )
    on_cpu = device_to_providers(device)[0][0] == "CPUExecutionProvider"
    if backend == "agent" and not agent_available():
        from ..runtime import import_onnxruntime

        onnxruntime = import_onnxruntime()
        if on_cpu:
            build = "'pip install onnxruntime-training-cpu==1.19.2' (Python <= 3.12)"
        else:
            build = "'pip install onnxruntime-training==1.19.2' (CUDA 11.8, Python <= 3.11)"
        raise ValueError(
            "backend='agent' needs onnxruntime-training (the TrainingAgent), but the "
            f"installed onnxruntime {onnxruntime.__version__} is the plain build. Use "
            "backend='standard' (or 'auto'), which runs on it, or install the training build "
            f"in its place: 'pip uninstall -y {' '.join(_installed_runtimes())}' then {build}."
        )


def choose_backend(
    backend: str, training: onnx.ModelProto, weight_names: Sequence[str], device: str
) -> str:
    """Return the backend that trains ``training``: ``"agent"`` or ``"standard"``.

    ``"auto"`` picks the TrainingAgent where the training build is installed and
    its gradient builder knows every operator on the differentiated path, and the
    standard backend otherwise (always for a float64 training graph: the agent's
    kernels are float32), on the CPU as on CUDA; the choice is logged at INFO.

    Parameters
    ----------
    backend : {"auto", "agent", "standard"}
        What was asked for.
    training : onnx.ModelProto
        The training graph.
    weight_names : list of str
        The trained initializers.
    device : str
        ``"cpu"`` or ``"cuda[:N]"``.

    Raises
    ------
    ValueError
        When an explicit choice cannot train this graph here.
    """
    name, message = _choose(backend, training, weight_names, device)
    if message:
        logger.info(message)
    return name


def _choose(backend, training, weight_names, device) -> tuple[str, str | None]:
    """:func:`choose_backend`'s choice and the line it logs (None: none)."""
    double = _is_double(training)
    check_backend(backend, device, np.float64 if double else np.float32)
    if backend == "standard":
        return backend, None
    if double:
        return "standard", "backend: standard (the training graph is float64)"
    unsupported = agent_unsupported_ops(training, weight_names)
    if backend == "agent":
        if unsupported:
            raise ValueError(
                f"backend='agent' cannot differentiate the operator(s) {unsupported} of the "
                "training graph (onnxruntime-training has no gradient for them). Use "
                "backend='standard' (or 'auto'), which differentiates them with onnx-ad, "
                "or write the loss with other operators."
            )
        return backend, None
    if not agent_available():
        reason = "onnxruntime-training is not installed"
    elif unsupported:
        reason = f"the TrainingAgent has no gradient for {unsupported}"
    else:
        return "agent", "backend: agent (onnxruntime-training is installed)"
    return "standard", f"backend: standard ({reason})"


def _installed_runtimes() -> list[str]:
    from ..runtime import _installed_distributions

    return _installed_distributions() or ["onnxruntime"]


def _is_double(training: onnx.ModelProto) -> bool:
    inputs = training.graph.input
    return bool(inputs) and inputs[0].type.tensor_type.elem_type == onnx.TensorProto.DOUBLE


def backend_class(name: str) -> type:
    """The class of the backend ``name`` (its module is imported here, on first use)."""
    if name == "agent":
        from .agent import AgentBackend

        return AgentBackend
    if name == "standard":
        from .standard import StandardBackend

        return StandardBackend
    _check_name(name)
    raise ValueError(f"backend={name!r}: choose it with choose_backend first.")


def make_backend(name: str, **kwargs) -> Backend:
    """Create the backend ``name`` (its module is imported here, on first use)."""
    return backend_class(name)(**kwargs)


class Plan:
    """The graphs a fit of one structure runs: a training artifact and its key.

    Built once by :func:`build_plan` (onnx, the backend's gradient builder), found
    again by :func:`find_plan` in the process or the disk cache. Every blob is a
    serialized ONNX model; what a fit reads about them (input names, the agent's
    graph info, the backend chosen and why) is in :attr:`meta`, so that a fit from
    a cached plan parses none.

    Parameters
    ----------
    key : str
        The artifact's key.
    artifact : onnxgrad_sklearn.artifacts.Artifact
        Its blobs and metadata.

    Attributes
    ----------
    key : str
    blobs : dict of str to bytes
        ``"training.onnx"`` (the training graph, weights as inputs),
        ``"predict.onnx"`` (the inference graph, weights as inputs; absent without
        one), and each backend's own.
    meta : dict
        ``"backend"``, ``"log"`` (the line the choice logs, or None), and each
        backend's own.
    """

    def __init__(self, key: str, artifact):
        self.key = key
        self.artifact = artifact
        self.blobs = artifact.blobs
        self.meta = artifact.meta

    @property
    def backend(self) -> str:
        """The backend the plan is for, ``"agent"`` or ``"standard"``."""
        return self.meta["backend"]

    def model(self, name: str) -> onnx.ModelProto:
        """The blob ``name`` parsed (onnx imported): a new model at each call."""
        return onnx.load_from_string(self.blobs[name])

    def digest(self, name: str) -> str:
        """The digest of the blob ``name`` (what its sessions are shared by)."""
        return self.artifact.digest(name)


def find_plan(key: str | None) -> Plan | None:
    """The plan of ``key`` built earlier (in memory or on disk), or None."""
    found = artifacts.get(key)
    if found is None or "backend" not in found.meta:
        return None
    return Plan(key, found)


def build_plan(
    backend: str,
    training: onnx.ModelProto,
    model: onnx.ModelProto | None,
    weight_names: Sequence[str],
    shapes: Sequence[tuple],
    optimizer,
    device: str,
    key: str | None = None,
) -> Plan:
    """Choose the backend for ``training``, build its graphs, keep them (:func:`find_plan`).

    Parameters
    ----------
    backend : {"auto", "agent", "standard"}
        What was asked for (:func:`choose_backend`).
    training : onnx.ModelProto
        The training graph, weights as initializers holding their starting values.
    model : onnx.ModelProto or None
        The inference graph, for :meth:`Backend.predict`.
    weight_names : list of str
        The trained initializers.
    shapes : list of tuple of int
        Their shapes.
    optimizer : BaseOptimizer
        The update rule (the agent's update graph; the standard backend's step graphs).
    device : str
        ``"cpu"`` or ``"cuda[:N]"``.
    key : str, optional
        The plan's key, made by the caller from the structure; None: made here from
        the graphs (digests of their bytes).
    """
    from .._passes import initializers_as_inputs, pin_versions

    name, message = _choose(backend, training, weight_names, device)
    if message:
        logger.info(message)
    inputs = pin_versions(initializers_as_inputs(training, weight_names))
    shapes = [tuple(int(d) for d in shape) for shape in shapes]
    blobs = {"training.onnx": inputs.SerializeToString()}
    if model is not None:
        blobs["predict.onnx"] = initializers_as_inputs(model, weight_names).SerializeToString()
    if key is None:
        key = graph_key(name, blobs, weight_names, optimizer, shapes, device)
        found = find_plan(key)
        if found is not None:
            return found
    meta = {"backend": name, "log": message}
    own_blobs, own_meta = backend_class(name).build_graphs(
        inputs, training, list(weight_names), shapes, optimizer, device
    )
    blobs["training.onnx"] = inputs.SerializeToString()  # as the backend left it
    blobs.update(own_blobs)
    meta.update(own_meta)
    plan = Plan(key, artifacts.Artifact(blobs, meta))
    artifacts.put(key, plan.artifact)
    return plan


def graph_key(name, blobs, weight_names, optimizer, shapes, device) -> str:
    """The key of a plan described by its graphs' bytes (a structure without a key):
    the training and predict graphs in ``blobs``, the update rule and the device."""
    if artifacts.describable(optimizer):
        rule = optimizer
    else:  # a rule of the user's: what it builds
        update = optimizer.build_update_model([tuple(s) for s in shapes], flat=False)
        rule = artifacts.digest(update.SerializeToString())
    graphs = sorted((n, artifacts.digest(b)) for n, b in blobs.items())
    parts = (name, graphs, list(weight_names), rule, device_to_providers(device))
    return artifacts.make_key("plan", parts)


def all_finite(array: np.ndarray, chunk: int = 1 << 16) -> bool:
    """Return whether every value of ``array`` is finite, by chunks of ``chunk`` values.

    ``np.isfinite(array).all()`` makes a boolean array of the weight's size, at the
    end of each fit, while the step session still holds its memory.
    """
    flat = np.asarray(array).reshape(-1)
    return all(np.isfinite(flat[i : i + chunk]).all() for i in range(0, flat.size, chunk))


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
    training : onnx.ModelProto or None
        The training graph (:func:`onnxgrad_sklearn.engine.build_training_graph`):
        inputs the model's, ``y_true`` and ``sample_weight`` (and the penalty's
        coefficients, ``constants``); output ``loss``. Read only without a ``plan``:
        its plan is then built here (:func:`build_plan`).
    model : onnx.ModelProto or None
        The inference graph, for :meth:`predict` (only without a ``plan``).
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
    plan : Plan, optional
        The graphs to run (:func:`build_plan`, :func:`find_plan`).
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
        training,
        model,
        output_name,
        weight_names,
        start,
        optimizer,
        device="cpu",
        options=None,
        update_options=None,
        plan=None,
        constants=None,
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
        self.step = 0
        self._predict = None
        #: The training dtype (float32 or float64): that of the weights.
        self.dtype = np.asarray(start[0]).dtype if len(start) else np.dtype(np.float32)
        if plan is None:
            plan = build_plan(
                self.name, training, model, weight_names, self.shapes, optimizer, device
            )
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
            self._predict = self.session("predict.onnx")
        names = [i.name for i in self._predict.get_inputs()]
        X = np.ascontiguousarray(X, dtype=self.dtype)
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
