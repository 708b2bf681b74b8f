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
from collections.abc import Sequence

import numpy as np

from .. import artifacts
from .._lazy import lazy
from .._names import LOSS, ONNX_TEMPLATE_KEY
from ..runtime import device_to_providers
from .base import Backend, shared_session

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


@functools.lru_cache(maxsize=1)
def agent_available() -> bool:
    """Return whether the installed onnxruntime has the training bindings the agent needs."""
    try:
        from . import agent  # noqa: F401
    except ImportError as exc:
        logger.debug("TrainingAgent backend unavailable: %s", exc)
        return False
    return True


#: Operators whose gradient onnxruntime-training 1.19.2 builds wrong or fails to build
#: (measured against PyTorch's autograd on exported models): the TrainingAgent is
#: not given a graph that differentiates them.
AGENT_WRONG_GRADIENTS = {
    "BatchNormalization": "its gradient of BatchNormalization is wrong (one SGD step of a "
    "small CNN 3.7x off PyTorch's)",
    "LayerNormalization": "its gradient builder fails on a LayerNormalization with one output",
}


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

    path = differentiated_nodes(training, weight_names, LOSS)
    return sorted(
        {
            n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
            for n in path
            if n.domain not in ("", "ai.onnx")
            or n.op_type not in AGENT_GRADIENT_OPS
            or n.op_type in AGENT_WRONG_GRADIENTS
        }
    )


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
    from .training_mode import METADATA_KEY

    keys = {p.key for p in training.metadata_props}
    if METADATA_KEY in keys:
        if backend == "agent":
            raise ValueError(
                "backend='agent' cannot train Dropout or BatchNormalization in training "
                "mode (fresh masks and batch statistics at each step): use "
                "backend='standard' (or 'auto', which picks it for these models)."
            )
        return "standard", "backend: standard (Dropout or BatchNormalization in training mode)"
    if backend == "auto" and ONNX_TEMPLATE_KEY in keys:
        return "standard", (
            "backend: standard (an ONNX template: onnxruntime-training's gradient builder "
            "is not trusted with graphs it was not checked on; backend='agent' asks for it)"
        )
    if double:
        return "standard", "backend: standard (the training graph is float64)"
    unsupported = agent_unsupported_ops(training, weight_names)
    if backend == "agent":
        if unsupported:
            wrong = "".join(
                f" For {op}, {AGENT_WRONG_GRADIENTS[op]}."
                for op in unsupported
                if op in AGENT_WRONG_GRADIENTS
            )
            raise ValueError(
                f"backend='agent' cannot differentiate the operator(s) {unsupported} of the "
                f"training graph (onnxruntime-training has no right gradient for them).{wrong} Use "
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
    from .._ort_import import _installed_distributions

    return _installed_distributions() or ["onnxruntime"]


def _is_double(training: onnx.ModelProto) -> bool:
    from .._graph import model_dtype

    return model_dtype(training) == np.float64


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
