"""The TrainingAgent backend: onnxruntime-training's gradient builder and agent.

This is the only module of the package that touches the private training
bindings of onnxruntime (``OrtModuleGraphBuilder``, ``TrainingAgent``,
``PartialGraphExecutionState``); it is imported only when this backend is
chosen, and fails to import (``ImportError`` saying how to fix it) where the
installed onnxruntime is not the training build.

* :class:`TrainingAgent` wraps the runtime's agent: ``run_forward`` runs the
  gradient graph until its ``YieldOp``, ``run_backward`` resumes it from there.
* :class:`OrtGradientForwardBackward` builds the gradient graph of any ONNX
  model for a chosen list of initializers (the weights to train), and exposes a
  training forward pass, a backward pass and an inference forward pass, all on
  ``OrtValue`` objects.
* :class:`AgentBackend` is the training step of the fit loop on them: forward,
  backward, then the optimizer's update graph in its own session.

The graphs are built once per structure and kept in the fit's plan (a training
artifact, :func:`~onnxgrad_sklearn.backends.build_plan`); a TrainingAgent is not
thread-safe, so a fit takes one out of the process's pool for its duration and puts
it back at its end (:meth:`OrtGradientForwardBackward.release`): the fits of a
GridSearchCV reuse them, two fits at once in two threads each get their own.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from .._lazy import lazy
from .._names import UPDATE
from ..runtime import (
    LARGE_MODEL,
    SESSIONS,
    OrtValue,
    device_to_providers,
    options_key,
    ort_device,
    ortvalue_list,
    ortvalue_view,
    release_model_bytes,
    run_with_ortvalues,
    session_providers,
    to_ortvalue,
)
from .base import Backend, LastBatch, batch_key, shared_session
from .buffers import PIECES_DISABLED_OPTIMIZERS, UPDATE_PIECE, DoubleBuffers, pieces

# imported on first use: a fit whose plan is cached parses no graph
onnx = lazy("onnx")
TensorProto = lazy("onnx", "TensorProto")

try:
    import onnxruntime
    from onnxruntime.capi import _pybind_state as _C
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "The TrainingAgent backend needs onnxruntime-training. Install it with "
        "'pip install onnxruntime-training-cpu==1.19.2' (Python <= 3.12), or use "
        "backend='standard' (plain onnxruntime)."
    ) from exc

if not hasattr(_C, "TrainingAgent") or not hasattr(_C, "OrtModuleGraphBuilder"):
    raise ImportError(
        "The installed onnxruntime ({}) has no training bindings: it is the plain "
        "inference build, or another package overwrote onnxruntime-training's files. "
        "Use backend='standard', or install the training build with "
        "'pip uninstall -y onnxruntime onnxruntime-training-cpu && "
        "pip install onnxruntime-training-cpu==1.19.2' (Python <= 3.12).".format(
            getattr(onnxruntime, "__version__", "unknown")
        )
    )

__all__ = ["AgentBackend", "OrtGradientForwardBackward", "TrainingAgent"]

logger = logging.getLogger("onnxgrad_sklearn")

OrtValueVector = _C.OrtValueVector

#: From this many weights on, the update in the backward run goes over pieces of at
#: most :data:`UPDATE_CHUNK` elements (:func:`fuse_update`) instead of the whole
#: vector: the update's temporaries (the gradients concatenated, ``learning_rate *
#: grad``, ``momentum * velocity``...) are then the size of a piece, not of the
#: model. onnxruntime's arena grows by powers of two, so those of the whole vector
#: held about 9 times the weights' size on a 100-2048-2048-1 MLP (docs/performance.md,
#: "Memory"). Same values: the rule is element-wise. Small models keep one flat
#: update (a node per piece costs microseconds).
CHUNKED_UPDATE_FROM = LARGE_MODEL
#: Elements of a piece of the update by pieces.
UPDATE_CHUNK = UPDATE_PIECE


def _vector(values: Sequence[OrtValue]) -> OrtValueVector:
    vec = OrtValueVector()
    vec.reserve(len(values))
    for value in values:
        vec.push_back(value)
    return vec


class TrainingAgent:
    """Run the forward and backward halves of a gradient graph.

    A thin wrapper over onnxruntime-training's ``TrainingAgent`` (the machinery
    ORTModule uses). The gradient graph holds a ``YieldOp`` between the forward
    part and the backward part: :meth:`run_forward` executes up to it and
    returns the user outputs, :meth:`run_backward` resumes with the gradients
    of those outputs and returns the requested gradients. An execution state
    (:meth:`new_state`) carries the intermediate results from one call to the
    other; use a new one for every batch.

    Parameters
    ----------
    model_bytes : bytes
        Serialized gradient graph, as built by ``OrtModuleGraphBuilder``.
    fw_feed_names : list of str
        Names of the graph inputs fed to the forward pass, in feeding order.
    n_fw_outputs : int
        Number of outputs of the forward pass: the user outputs plus the
        entries of the graph's frontier node map.
    bw_fetches_names : list of str
        Names of the graph outputs fetched by the backward pass.
    providers : list of str, default=("CPUExecutionProvider",)
        Execution providers.
    device_index : int, default=0
        Device index for CUDA.
    session_options : onnxruntime.SessionOptions, optional
        Options of the underlying session.
    provider_options : list of dict, optional
        One dict of options per provider (``runtime.session_providers``: on CUDA
        ``device_id`` and ``use_tf32``).
    """

    def __init__(
        self,
        model_bytes: bytes,
        fw_feed_names: Sequence[str],
        n_fw_outputs: int,
        bw_fetches_names: Sequence[str],
        providers: Sequence[str] = ("CPUExecutionProvider",),
        device_index: int = 0,
        session_options: onnxruntime.SessionOptions | None = None,
        provider_options: Sequence[dict] | None = None,
        disabled_optimizers: Sequence[str] | None = None,
    ):
        providers = list(providers)
        self.session = onnxruntime.InferenceSession(
            model_bytes,
            sess_options=session_options,
            providers=providers,
            provider_options=provider_options,
            disabled_optimizers=list(disabled_optimizers) if disabled_optimizers else None,
        )
        release_model_bytes(self.session)
        device = ort_device(providers[0], device_index)
        # One device per forward output: a wrong count aborts the process in
        # C++, so the count is computed by the caller from the graph info.
        self._fw_devices = [device] * int(n_fw_outputs)
        self._bw_devices = [device] * len(bw_fetches_names)
        self.fw_feed_names = list(fw_feed_names)
        self.bw_fetches_names = list(bw_fetches_names)
        self._agent = _C.TrainingAgent(
            self.session._sess,
            self.fw_feed_names,
            self._fw_devices,
            self.bw_fetches_names,
            self._bw_devices,
            0,
        )

    @staticmethod
    def new_state():
        """Return a new execution state, one per forward/backward pair."""
        return _C.PartialGraphExecutionState()

    def run_forward(self, feeds: Sequence[OrtValue], state) -> list[OrtValue]:
        """Run the graph from its inputs up to the ``YieldOp``.

        Parameters
        ----------
        feeds : list of OrtValue
            One value per name of ``fw_feed_names``, in that order.
        state : PartialGraphExecutionState
            A state from :meth:`new_state`, later given to :meth:`run_backward`.

        Returns
        -------
        list of OrtValue
            The forward outputs (user outputs first).
        """
        if len(feeds) != len(self.fw_feed_names):
            raise ValueError(
                f"run_forward expects {len(self.fw_feed_names)} feeds "
                f"({self.fw_feed_names}), got {len(feeds)}."
            )
        return ortvalue_list(self.run_forward_vector(_vector(feeds), state))

    def run_forward_vector(self, feeds: OrtValueVector, state):
        """:meth:`run_forward` with the feeds as the runtime takes them (an
        ``OrtValueVector`` of ``fw_feed_names``' length, made once for many runs)."""
        fetches = OrtValueVector()
        # no cache: it holds the values of the forward pass a gradient accumulation
        # keeps from run to run (ORTModule passes none without it), one made per run
        self._agent.run_forward(feeds, fetches, state, None)
        return fetches

    def run_backward_vector(self, grad_outputs: OrtValueVector, into: OrtValueVector, state):
        """:meth:`run_backward` writing into ``into`` (an ``OrtValueVector`` of
        ``bw_fetches_names``' length), the arguments as the runtime takes them."""
        self._agent.run_backward(grad_outputs, into, state)

    def run_backward(
        self, grad_outputs: Sequence[OrtValue], state, into: Sequence[OrtValue] | None = None
    ) -> list[OrtValue]:
        """Resume the graph after the ``YieldOp`` and return the gradients.

        Parameters
        ----------
        grad_outputs : list of OrtValue
            Gradient of the objective with respect to each differentiable user
            output of the forward pass.
        state : PartialGraphExecutionState
            The state given to :meth:`run_forward` for the same batch.
        into : list of OrtValue, optional
            One value per name of ``bw_fetches_names``, of its shape and type: the
            runtime writes the outputs into them (nothing is allocated for them).
            None: the runtime allocates the outputs.

        Returns
        -------
        list of OrtValue
            One value per name of ``bw_fetches_names`` (``into`` when given).
        """
        if into is None:
            fetches = OrtValueVector()
        else:
            if len(into) != len(self.bw_fetches_names):  # a shorter vector is read past
                raise ValueError(
                    f"run_backward writes {len(self.bw_fetches_names)} outputs "
                    f"({self.bw_fetches_names}), got {len(into)} values to write into."
                )
            fetches = _vector(into)
        self.run_backward_vector(_vector(grad_outputs), fetches, state)
        return list(into) if into is not None else ortvalue_list(fetches)


class OrtGradientForwardBackward:
    """Build the gradient graph of an ONNX model and run it on ``OrtValue`` objects.

    ``OrtModuleGraphBuilder`` turns the listed initializers into graph inputs
    and appends the backward graph (:meth:`build`: the graphs as bytes and what
    the runs need to know about them). The resulting object offers three passes:

    * :meth:`forward` (training): returns the user outputs and an execution
      state to give to :meth:`backward`;
    * :meth:`backward`: takes the gradient of the objective with respect to
      each differentiable output, returns the gradients of the inputs listed in
      ``input_names_require_grad`` followed by those of ``weights_to_train``;
    * :meth:`forward_inference`: the forward graph alone, weights given as
      inputs, nothing kept for a backward pass.

    Parameters
    ----------
    onnx_model : onnx.ModelProto or None
        The model. Its IR version and opsets are lowered to what the runtime
        accepts (a copy is made). None with ``graphs``.
    weights_to_train : list of str
        Float initializers to differentiate with respect to, in the order in
        which they are fed and their gradients returned.
    input_names_require_grad : list of str, default=()
        Graph inputs whose gradients are wanted too.
    device : str, default="cpu"
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    session_options : onnxruntime.SessionOptions, optional
        Options for both sessions (threads, optimisation level).
    provider_options : list of dict, optional
        Options of each provider of ``device``; by default
        ``runtime.session_providers(device)`` (on CUDA ``device_id`` and
        ``use_tf32`` as the package's settings say).
    graphs : Plan, optional
        The graphs :meth:`build` made, kept in a plan (``onnx_model`` is not read):
        made into sessions without onnx.
    shared : bool, default=False
        Whether the sessions are the process's
        (:data:`~onnxgrad_sklearn.runtime.SESSIONS`): the forward session shared,
        the TrainingAgent (not thread-safe) taken out of the pool when first used
        and put back by :meth:`release`.
    n_weights : int, default=0
        The number of weights trained (what bounds the pool's memory).

    Attributes
    ----------
    input_names : list of str
        User inputs of the model, in feeding order.
    output_names : list of str
        User outputs of the model.
    gradient_model : onnx.ModelProto
        The forward and backward graph the training session runs (parsed when read).
    forward_model : onnx.ModelProto
        The forward graph with the weights as inputs (parsed when read).
    differentiable_output_indices : list of int
        Indices in ``output_names`` of the outputs :meth:`backward` needs a
        gradient for.
    """

    def __init__(
        self,
        onnx_model: onnx.ModelProto | None,
        weights_to_train: Sequence[str],
        input_names_require_grad: Sequence[str] = (),
        device: str = "cpu",
        session_options: onnxruntime.SessionOptions | None = None,
        provider_options: Sequence[dict] | None = None,
        graphs=None,
        shared: bool = False,
        n_weights: int = 0,
    ):
        if graphs is None:
            from .. import artifacts

            blobs, meta = self.build(onnx_model, weights_to_train, input_names_require_grad)
            graphs = artifacts.Artifact(blobs, meta)
        self.graphs = graphs
        meta = graphs.meta
        self.weights_to_train = list(meta["weights_to_train"])
        self.input_names_require_grad = list(meta["input_names_require_grad"])
        self.device = device
        self.providers, self.device_index = device_to_providers(device)
        if provider_options is None:
            provider_options = session_providers(device)[1]
        self.provider_options = list(provider_options)
        self.input_names = list(meta["input_names"])
        self.output_names = list(meta["output_names"])
        self.differentiable_output_indices = list(meta["differentiable_output_indices"])
        self._n_user_outputs = int(meta["n_user_outputs"])
        self._session_options = session_options
        self.shared = shared
        self._n_weights = n_weights  # what bounds the pool's memory
        self._agent_key = None
        if shared:
            self._agent_key = (
                graphs.digest("gradient.onnx"),
                options_key(session_options, self.providers, self.provider_options),
            )
        self._agent = None
        self._eval_session = None

    @classmethod
    def build(
        cls,
        onnx_model: onnx.ModelProto,
        weights_to_train: Sequence[str],
        input_names_require_grad: Sequence[str] = (),
    ) -> tuple[dict, dict]:
        """The gradient and forward graphs of ``onnx_model``, and what the runs need.

        Returns
        -------
        blobs : dict of str to bytes
            ``"gradient.onnx"`` (forward and backward, a ``YieldOp`` between them,
            ``ReluGrad`` and batch sums rewritten) and ``"forward.onnx"``.
        meta : dict
            Input and output names, the forward feeds and backward fetches, the
            number of forward outputs, the differentiable outputs.
        """
        from .._passes import pin_versions

        model = onnx.ModelProto()
        model.CopyFrom(onnx_model)
        pin_versions(model)
        weights_to_train = list(weights_to_train)
        input_names_require_grad = list(input_names_require_grad)
        cls._check_weights(model, weights_to_train)
        initializer_names = [i.name for i in model.graph.initializer]
        input_names = [i.name for i in model.graph.input if i.name not in initializer_names]
        output_names = [o.name for o in model.graph.output]
        logger.debug(
            "building the gradient graph: inputs=%r outputs=%r weights=%r",
            input_names,
            output_names,
            weights_to_train,
        )
        gradient_model, forward_model, graph_info = cls._run_builder(
            model, weights_to_train, input_names_require_grad
        )

        non_diff = set(graph_info.output_grad_indices_non_differentiable)
        grad_inputs = [i.name for i in gradient_model.graph.input]
        bw_fetches = [o.name for o in gradient_model.graph.output]
        n_fw_outputs = len(graph_info.user_output_names) + len(graph_info.frontier_node_arg_map)
        expected = len(input_names_require_grad) + len(weights_to_train)
        if len(bw_fetches) != expected:
            raise RuntimeError(
                f"the gradient graph returns {len(bw_fetches)} gradients, expected {expected} "
                f"({input_names_require_grad + weights_to_train})."
            )
        logger.debug(
            "gradient graph built: %d nodes, %d forward outputs",
            len(gradient_model.graph.node),
            n_fw_outputs,
        )
        blobs = {
            "gradient.onnx": gradient_model.SerializeToString(),
            "forward.onnx": forward_model.SerializeToString(),
        }
        meta = {
            "weights_to_train": weights_to_train,
            "input_names_require_grad": input_names_require_grad,
            "input_names": input_names,
            "output_names": output_names,
            "fw_feed_names": grad_inputs,
            "bw_fetches_names": bw_fetches,
            "n_fw_outputs": n_fw_outputs,
            "n_user_outputs": len(graph_info.user_output_names),
            "differentiable_output_indices": [
                i for i in range(len(output_names)) if i not in non_diff
            ],
        }
        return blobs, meta

    @classmethod
    def _run_builder(
        cls, model: onnx.ModelProto, weights_to_train: list, input_names_require_grad: list
    ):
        """The runtime's ``OrtModuleGraphBuilder`` on ``model``: ``(gradient model,
        forward model, graph info)``, the gradient graph's ``ReluGrad`` and batch sums
        rewritten (:mod:`onnxgrad_sklearn.backends.agent_passes`), every node named."""
        from .agent_passes import rewrite_batch_sums, rewrite_relu_grad

        config = _C.OrtModuleGraphBuilderConfiguration()
        config.initializer_names = weights_to_train
        config.initializer_names_to_train = weights_to_train
        config.input_names_require_grad = input_names_require_grad
        config.build_gradient_graph = True
        config.enable_caching = False
        config.loglevel = type(config.loglevel).ERROR
        builder = _C.OrtModuleGraphBuilder()
        builder.initialize(model.SerializeToString(), config)
        builder.build(_C.TrainingGraphTransformerConfiguration())
        graph_info = builder.get_graph_info()
        gradient_model = onnx.load_from_string(builder.get_gradient_model())
        rewrite_relu_grad(gradient_model)
        rewrite_batch_sums(gradient_model)
        forward_model = onnx.load_from_string(builder.get_forward_model())
        cls._name_unnamed_nodes(gradient_model)
        cls._name_unnamed_nodes(forward_model)
        return gradient_model, forward_model, graph_info

    @staticmethod
    def _check_weights(model: onnx.ModelProto, weights_to_train) -> None:
        types = {i.name: i.data_type for i in model.graph.initializer}
        if len(set(weights_to_train)) != len(weights_to_train):
            raise ValueError(f"weights_to_train has duplicates: {weights_to_train}.")
        for name in weights_to_train:
            if name not in types:
                raise ValueError(f"{name!r} is not an initializer of the model.")
            if types[name] == TensorProto.DOUBLE:
                raise ValueError(
                    f"initializer {name!r} is float64: this runtime has no float64 "
                    "gradient kernels, convert the model to float32."
                )
            if types[name] != TensorProto.FLOAT:
                raise ValueError(
                    f"initializer {name!r} is not a float32 tensor and cannot be trained."
                )

    @staticmethod
    def _name_unnamed_nodes(model: onnx.ModelProto) -> None:
        for i, node in enumerate(model.graph.node):
            if not node.name:
                node.name = f"N{i}"

    @property
    def gradient_model(self) -> onnx.ModelProto:
        """The forward and backward graph (parsed at each read)."""
        return onnx.load_from_string(self.graphs.blobs["gradient.onnx"])

    @property
    def forward_model(self) -> onnx.ModelProto:
        """The forward graph with the weights as inputs (parsed at each read)."""
        return onnx.load_from_string(self.graphs.blobs["forward.onnx"])

    @property
    def agent(self) -> TrainingAgent:
        """The TrainingAgent this object runs: taken from the pool (or made) on first use."""
        if self._agent is None:
            self._agent = SESSIONS.checkout(self._agent_key, self._make_agent)
        return self._agent

    def _make_agent(self) -> TrainingAgent:
        meta = self.graphs.meta
        return TrainingAgent(
            self.graphs.blobs["gradient.onnx"],
            meta["fw_feed_names"],
            meta["n_fw_outputs"],
            meta["bw_fetches_names"],
            providers=self.providers,
            device_index=self.device_index,
            session_options=self._session_options,
            provider_options=self.provider_options,
            # the update by pieces: its slices not fused into one Split (see standard)
            disabled_optimizers=PIECES_DISABLED_OPTIMIZERS if meta.get("pieces") else None,
        )

    def release(self) -> None:
        """Put the TrainingAgent back into the pool, or free it (not shared: a large
        model's, whose session memory, its gradients and arena, goes with it); a
        later pass takes or makes one again."""
        if self._agent is not None:
            agent, self._agent = self._agent, None
            if self.shared:
                SESSIONS.give_back(self._agent_key, agent, self._n_weights)

    def forward(self, inputs: Sequence[OrtValue], weights: Sequence[OrtValue]):
        """Run the training forward pass.

        Parameters
        ----------
        inputs : list of OrtValue
            One value per name of ``input_names``.
        weights : list of OrtValue
            One value per name of ``weights_to_train``.

        Returns
        -------
        outputs : list of OrtValue
            One value per user output.
        state : PartialGraphExecutionState
            To give to :meth:`backward`.
        """
        if len(inputs) != len(self.input_names) or len(weights) != len(self.weights_to_train):
            raise ValueError(
                f"forward expects {len(self.input_names)} inputs and "
                f"{len(self.weights_to_train)} weights, got {len(inputs)} and {len(weights)}."
            )
        agent = self.agent
        state = agent.new_state()
        outputs = agent.run_forward([*inputs, *weights], state)
        return outputs[: self._n_user_outputs], state

    def backward(
        self, grad_outputs: Sequence[OrtValue], state, into: Sequence[OrtValue] | None = None
    ) -> list[OrtValue]:
        """Run the backward pass of the batch whose forward pass produced ``state``.

        Parameters
        ----------
        grad_outputs : list of OrtValue
            One value per index of ``differentiable_output_indices``.
        state : PartialGraphExecutionState
            Returned by :meth:`forward`; a state serves one backward pass.
        into : list of OrtValue, optional
            Where the runtime writes the outputs (:meth:`TrainingAgent.run_backward`).

        Returns
        -------
        list of OrtValue
            Gradients of ``input_names_require_grad`` then of ``weights_to_train``
            (after an appended update's outputs: :func:`fuse_update`).
        """
        if len(grad_outputs) != len(self.differentiable_output_indices):
            raise ValueError(
                f"backward expects {len(self.differentiable_output_indices)} output "
                f"gradients, got {len(grad_outputs)}."
            )
        return self.agent.run_backward(grad_outputs, state, into)

    def forward_inference(
        self, inputs: Sequence[OrtValue], weights: Sequence[OrtValue]
    ) -> list[OrtValue]:
        """Run the forward graph alone with the given weights.

        Parameters
        ----------
        inputs : list of OrtValue
            One value per name of ``input_names``.
        weights : list of OrtValue
            One value per name of ``weights_to_train``.

        Returns
        -------
        list of OrtValue
            One value per user output.
        """
        session = self.eval_session
        names = [i.name for i in session.get_inputs()]
        return run_with_ortvalues(session, names, list(inputs) + list(weights))

    @property
    def eval_session(self) -> onnxruntime.InferenceSession:
        """Session on the forward graph with the weights as inputs (made on first use)."""
        if self._eval_session is None:
            digest = self.graphs.digest("forward.onnx") if self.shared else None
            self._eval_session = shared_session(
                self.graphs.blobs["forward.onnx"],
                digest,
                self._session_options,
                self.providers,
                self.provider_options,
                weights=self._n_weights,
            )
        return self._eval_session


class AgentBackend(Backend):
    """The training step on onnxruntime-training: forward, backward, then the update.

    :class:`OrtGradientForwardBackward` runs forward and backward. On CPU an
    element-wise rule updates one flat vector per set of
    :class:`~onnxgrad_sklearn.backends.buffers.DoubleBuffers` (nothing allocated
    per batch, a free undo) in the backward run itself, the update appended to the
    gradient graph (:func:`fuse_update`; by pieces for a large model,
    :data:`CHUNKED_UPDATE_FROM`). Otherwise the optimizer's update graph runs in a
    second session and returns new values per weight. See
    :class:`~onnxgrad_sklearn.backends.Backend` for the parameters.
    """

    name = "agent"

    def __init__(self, plan, output_name, weight_names, start, optimizer, **kwargs):
        super().__init__(plan, output_name, weight_names, start, optimizer, **kwargs)
        self.forward_backward = OrtGradientForwardBackward(
            None,
            self.weight_names,
            device=self.device,
            session_options=self.options,
            provider_options=self.provider_options,
            graphs=self.plan,
            shared=self.shared,
            n_weights=self.n_weights,
        )
        # the training graph's inputs after the batch (the penalty's coefficients)
        self._constant_feeds = [
            self._feed(self.constants[name])
            for name in self.forward_backward.input_names
            if name in self.constants
        ]
        meta = self.plan.meta
        flat = bool(meta["flat"])
        self._one = to_ortvalue(np.array(1.0, dtype=np.float32), self.device)
        # The learning rate: on the CPU a view of a NumPy scalar that each step writes
        # (no call into the runtime); on a GPU a device value updated in place.
        self._lr_array = np.zeros((), dtype=np.float32)
        on_cpu = self.providers[0] == "CPUExecutionProvider"
        self._lr = (ortvalue_view if on_cpu else to_ortvalue)(self._lr_array, self.device)
        self._lr_is_view = on_cpu
        self._previous = None
        self._flat = None
        self._fused = None
        self._update = None
        if flat:  # the update in the backward run
            self._flat = DoubleBuffers(self.shapes, len(optimizer.state_names))
            self._flat.write(0, start)
            self._fused = _FusedUpdate(meta, optimizer, self._flat, self._lr, self._one)
        else:
            # The update session runs on one thread: a second pool of threads competes
            # with the training session's (benchmarks/README.md).
            self._update = self.session("update.onnx", options=self.update_options)
            self._update_inputs = [i.name for i in self._update.get_inputs()]
            self._weights = [to_ortvalue(np.asarray(w, np.float32), self.device) for w in start]
            self._state = [[] for _ in start]
        self.reset_optimizer()

    @classmethod
    def build_graphs(cls, inputs, training, weight_names, shapes, optimizer, device):
        """The agent's graphs of a plan (:func:`~onnxgrad_sklearn.backends.build_plan`):
        the gradient and forward graphs (:meth:`OrtGradientForwardBackward.build`)
        and the update graph (one flat vector per state on the CPU for an
        element-wise rule)."""
        blobs, meta = OrtGradientForwardBackward.build(training, weight_names)
        flat = device == "cpu" and bool(optimizer.elementwise)
        meta["flat"] = flat
        if flat:
            large = sum(math.prod(s) for s in shapes) >= CHUNKED_UPDATE_FROM
            fuse_update(blobs, meta, optimizer, shapes, UPDATE_CHUNK if large else None)
        else:
            update = optimizer.build_update_model([tuple(s) for s in shapes])
            blobs["update.onnx"] = update.SerializeToString()
        return blobs, meta

    def release_sessions(self) -> None:
        """Put the TrainingAgent back into the process's pool at the end of a fit."""
        self.forward_backward.release()

    @property
    def weights(self):
        return self._flat.weights() if self._flat is not None else self._weights

    @property
    def state(self):
        return self._flat.state() if self._flat is not None else self._state

    def reset_optimizer(self) -> None:
        if self._flat is None:
            super().reset_optimizer()
            return
        self.step = 0
        self._previous = None
        # One weight at a time, read in place (the states are other vectors): no copy
        # of the weights, no state of all the weights at once.
        for i in range(len(self.shapes)):
            weight = self._flat.views[self._flat.current][0][i]
            initial = self.optimizer.init_state(weight)
            for k, name in enumerate(self.optimizer.state_names):
                self._flat.write(1 + k, [initial[name]], start=i)

    def _load_state(self, per_weight) -> None:
        if self._flat is not None:
            for k in range(len(self.optimizer.state_names)):
                self._flat.write(1 + k, [st[k] for st in per_weight])
            return
        self._state = [
            [to_ortvalue(np.asarray(s, np.float32), self.device) for s in st] for st in per_weight
        ]

    def checkpoint(self):
        """Return the current weights and optimizer state.

        References to the runtime's values (no copy) when each update makes new
        ones; a copy when the engine updates its buffers in turn.
        """
        if self._flat is not None:
            return self._flat.copy(), None, self.step
        return list(self._weights), [list(s) for s in self._state], self.step

    def restore(self, checkpoint) -> None:
        weights, state, step = checkpoint
        self.step = step
        self._previous = None
        if self._flat is not None:
            self._flat.load(weights)
            return
        self._weights, self._state = list(weights), [list(s) for s in state]

    def undo_last_step(self) -> None:
        previous, self._previous = self._previous, None
        if previous is None:
            return
        if self._flat is not None:
            self._flat.current, self.step = previous  # that set has not been written since
        else:
            self.restore(previous)

    def set_weights(self, arrays) -> None:
        self._previous = None
        if self._flat is not None:
            self._flat.write(0, arrays)
            return
        self._weights = [
            to_ortvalue(np.asarray(a, dtype=np.float32).reshape(s), self.device)
            for a, s in zip(arrays, self.shapes)
        ]

    def train_batch(self, X, y, sample_weight, learning_rate):
        if self._fused is not None:
            return self._train_fused(X, y, sample_weight, learning_rate)
        # the update in a session of its own, new values per weight
        fb = self.forward_backward
        outputs, state = fb.forward(
            [self._feed(X), self._feed(y), self._feed(sample_weight), *self._constant_feeds],
            self.weights,
        )
        loss = float(outputs[0].numpy())
        if not math.isfinite(loss):
            return loss  # no update: the caller decides what to do
        grads = fb.backward([self._one], state)
        # What undo_last_step goes back to, without a copy: the update returns new
        # values, the previous ones stay valid.
        previous = self.checkpoint()
        self._set_learning_rate(learning_rate)
        feeds = [self._lr]
        for w, gr, st in zip(self._weights, grads, self._state):
            feeds.append(w)
            feeds.append(gr)
            feeds.extend(st)
        results = run_with_ortvalues(self._update, self._update_inputs, feeds)
        k = 1 + len(self.optimizer.state_names)
        n = len(self._weights)
        weights = [results[i * k] for i in range(n)]
        state = [results[i * k + 1 : (i + 1) * k] for i in range(n)]
        # The update's results are taken in one assignment, without a call between its
        # parts: a KeyboardInterrupt (raised at a call) finds the step applied or not.
        self._previous, self.step, self._weights, self._state = (
            previous,
            self.step + 1,
            weights,
            state,
        )
        return loss

    def _set_learning_rate(self, learning_rate):
        """Give the update the next step's learning rate (the optimizer's schedule)."""
        lr = self.optimizer.step_learning_rate(learning_rate, self.step + 1)
        if self._lr_is_view:
            self._lr_array[...] = lr
        else:
            self._lr.update_inplace(np.array(lr, dtype=np.float32))

    def _train_fused(self, X, y, sample_weight, learning_rate):
        """:meth:`train_batch` with the update in the backward run (:func:`fuse_update`):
        it writes the weights and state of the set of buffers not read."""
        flat, fused = self._flat, self._fused
        parity = flat.current
        self._set_learning_rate(learning_rate)
        loss, state = self._fused_forward(X, y, sample_weight, batch=True)
        if not math.isfinite(loss):
            return loss  # no update: the caller decides what to do
        self.forward_backward.agent.run_backward_vector(fused.one, fused.into[parity], state)
        # taken in one assignment (see train_batch); the set read is what undo goes back to
        self._previous, self.step, flat.current = (parity, self.step), self.step + 1, 1 - parity
        return loss

    def _forward(self, X, y, sample_weight):
        if self._fused is not None:
            return self._fused_forward(X, y, sample_weight)
        outputs, state = self.forward_backward.forward(
            [self._feed(X), self._feed(y), self._feed(sample_weight), *self._constant_feeds],
            self.weights,
        )
        return float(outputs[0].numpy()), state

    def _fused_forward(self, X, y, sample_weight, batch=False):
        """The forward run of the graph with the update appended: the batch, the
        constants, the weights and the update's inputs of the set read, as the runtime
        takes them, made again only when the batch's arrays move (the loop gathers
        shuffled batches into the same buffers): 5-7 us a step. ``batch``: a training
        step's, whose arrays are kept to be told by identity next time (a batch's
        size: not the rows a loss is computed on)."""
        fused, parity = self._fused, self._flat.current
        arrays = (X, y, sample_weight)
        last = fused.last[parity] if batch else None  # the same arrays as the last batch
        if last is not None and last.holds(arrays):
            feeds = last.value
        else:
            key = batch_key(arrays)
            feeds = fused.cached_feeds.get((parity, key))
            if feeds is None:
                if len(fused.cached_feeds) >= 4:
                    fused.cached_feeds.clear()
                inputs = [self._feed(X), self._feed(y), self._feed(sample_weight)]
                feeds = fused.cached_feeds[parity, key] = _vector(
                    [*inputs, *self._constant_feeds, *self.weights, *fused.feeds[parity]]
                )
            if batch:
                fused.last[parity] = LastBatch(arrays, key, feeds)
        agent = self.forward_backward.agent
        state = agent.new_state()
        return float(agent.run_forward_vector(feeds, state)[0].numpy()), state

    def loss(self, X, y, sample_weight):
        return self._forward(X, y, sample_weight)[0]

    def loss_and_gradients(self, X, y, sample_weight):
        loss, state = self._forward(X, y, sample_weight)
        if self._fused is None:
            grads = self.forward_backward.backward([self._one], state)
        else:  # the update's outputs go to buffers of their own: no weight changes
            self.forward_backward.backward([self._one], state, self._fused.scratch())
            return loss, [g.copy() for g in self._fused.gradient_arrays]
        return loss, [g.numpy().copy() for g in grads]


def fuse_update(blobs: dict, meta: dict, optimizer, shapes, chunk=None) -> None:
    """Append the optimizer's element-wise update to the gradient graph of ``blobs``, in place.

    The backward run then updates the weights as well: its outputs are the update's
    (``update/new_param`` and ``update/new_<state>``, all weights end to end; with
    ``chunk``, ``update/new_param_<j>`` and ``update/new_<state>_<j>`` for each piece
    ``j`` of at most ``chunk`` elements, :func:`~onnxgrad_sklearn.backends.buffers.pieces`),
    then the gradients as before; the update's other inputs (``update/learning_rate``,
    ``update/param``, ``update/<state>``, or per piece) follow the weights in the
    forward run's feeds. ``meta`` gains their names (``"update_feeds"``), the update's
    outputs (``"update_outputs"``) and the pieces (``"pieces"``, or None). One run for
    the backward pass and the update instead of two: a separate update session cost
    about 220 us a step at batch 32, on a step of about 650 us (docs/performance.md).
    """
    from .._passes import merge_update, piece_gradients

    model = onnx.load_from_string(blobs["gradient.onnx"])
    gradients = list(model.graph.output)
    spans = pieces(shapes, chunk) if chunk else None
    if spans:  # each piece a weight of its own to the rule
        update = optimizer.build_update_model([(n,) for _, _, n in spans])
        connect = piece_gradients(model, [g.name for g in gradients], spans, prefix=UPDATE)
    else:
        update = optimizer.build_update_model([tuple(s) for s in shapes], flat=True)
        connect = {f"grad_{i}": g.name for i, g in enumerate(gradients)}
    del model.graph.output[:]
    known = {i.name for i in model.graph.input}
    merge_update(model, update, connect, prefix=UPDATE)
    meta["update_outputs"] = [o.name for o in model.graph.output]
    model.graph.output.extend(gradients)
    meta["update_feeds"] = [i.name for i in model.graph.input if i.name not in known]
    meta["pieces"] = [list(span) for span in spans] if spans else None
    meta["fw_feed_names"] = [i.name for i in model.graph.input]
    meta["bw_fetches_names"] = [o.name for o in model.graph.output]
    blobs["gradient.onnx"] = model.SerializeToString()


class _FusedUpdate:
    """Where the backward run of a gradient graph with the update appended
    (:func:`fuse_update`) reads and writes, for each set of
    :class:`~onnxgrad_sklearn.backends.buffers.DoubleBuffers`.

    ``feeds[p]``: the update's inputs after the weights when set ``p`` holds the
    weights (the learning rate, then the weights and each state as vectors of set
    ``p``, or their pieces); ``into[p]``: the backward run's outputs, the new weights
    and state in the other set, then the gradients in buffers of their own (views of
    one vector), as the runtime takes them (an ``OrtValueVector``, made once).
    """

    def __init__(self, meta, optimizer, flat: DoubleBuffers, lr, one):
        names = ("param", *optimizer.state_names)
        spans = meta.get("pieces")
        self.feeds, self.into = [], []
        self.n_update = len(meta["update_outputs"])
        self._gradient = np.zeros(flat.size, dtype=flat.dtype)
        #: the gradients as the backward run writes them (views of one vector)
        self.gradient_arrays = [
            self._gradient[o : o + w.size].reshape(w.shape)
            for o, w in zip(flat.offsets, flat.views[0][0])
        ]
        self.gradients = [ortvalue_view(a) for a in self.gradient_arrays]
        for p in (0, 1):
            known = {f"{UPDATE}learning_rate": lr, **flat.named(p, names, UPDATE, spans)}
            self.feeds.append([known[name] for name in meta["update_feeds"]])
            written = flat.named(1 - p, names, UPDATE + "new_", spans)
            self.into.append(
                _vector([*(written[n] for n in meta["update_outputs"]), *self.gradients])
            )
        self.one = _vector([one])
        #: the forward feeds of the last batches' arrays (``AgentBackend._train_fused``)
        self.cached_feeds = {}
        #: per set read: the last batch's arrays and their feeds (a LastBatch)
        self.last = [None, None]
        self._scratch = None

    def scratch(self) -> list:
        """What a backward run that must change no weight writes into: buffers of the
        update's outputs of their own (made at the first call), then the gradients'."""
        if self._scratch is None:
            shapes = [self.into[0][k].shape() for k in range(self.n_update)]
            self._arrays = [np.zeros(shape, self._gradient.dtype) for shape in shapes]
            self._scratch = [*(ortvalue_view(a) for a in self._arrays), *self.gradients]
        return self._scratch
