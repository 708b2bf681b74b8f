"""Forward and backward passes of an ONNX graph on onnxruntime-training.

This is the only module of the package that touches the private training
bindings of onnxruntime (``OrtModuleGraphBuilder``, ``TrainingAgent``,
``PartialGraphExecutionState``). Everything above it works with
:class:`onnx.ModelProto` objects and ``OrtValue`` objects.

Two public classes live here:

* :class:`TrainingAgent` wraps the runtime's agent: ``run_forward`` runs the
  gradient graph until its ``YieldOp``, ``run_backward`` resumes it from there.
* :class:`OrtGradientForwardBackward` builds the gradient graph of any ONNX
  model for a chosen list of initializers (the weights to train), and exposes a
  training forward pass, a backward pass and an inference forward pass, all on
  ``OrtValue`` objects.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto

try:
    import onnxruntime
    from onnxruntime.capi import _pybind_state as _C
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "onnxgrad_sklearn needs onnxruntime-training. Install it with "
        "'pip install onnxruntime-training-cpu==1.19.2' (or "
        "'onnxruntime-training==1.19.2' for the CUDA build)."
    ) from exc

if not hasattr(_C, "TrainingAgent") or not hasattr(_C, "OrtModuleGraphBuilder"):
    raise ImportError(
        "The installed onnxruntime ({}) has no training bindings: it is the plain "
        "inference build, or another package overwrote onnxruntime-training's files. "
        "Fix it with 'pip uninstall -y onnxruntime onnxruntime-training-cpu && "
        "pip install onnxruntime-training-cpu==1.19.2'.".format(
            getattr(onnxruntime, "__version__", "unknown")
        )
    )

__all__ = [
    "OrtGradientForwardBackward",
    "OrtValue",
    "TrainingAgent",
    "device_to_providers",
    "ortvalue_view",
    "to_ortvalue",
]

logger = logging.getLogger("onnxgrad_sklearn")

OrtValue = _C.OrtValue
OrtValueVector = _C.OrtValueVector

#: Highest versions onnxruntime-training 1.19 accepts.
MAX_OPSET = 21
MAX_ML_OPSET = 5
MAX_IR_VERSION = 10


def device_to_providers(device: str) -> tuple[list[str], int]:
    """Return the execution providers and the device index for a device name.

    Parameters
    ----------
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Returns
    -------
    providers : list of str
        Execution providers, in order of precedence.
    device_index : int
        Index of the device (0 for the CPU).

    Raises
    ------
    ValueError
        If the name is not one of the forms above, or if CUDA is asked for and
        the installed runtime has no CUDA provider.
    """
    if not isinstance(device, str):
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}.")
    name = device.strip().lower()
    if name == "cpu":
        return ["CPUExecutionProvider"], 0
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name[5:] if name.startswith("cuda:") else "0"
        if not index_text.isdigit():
            raise ValueError(f"device={device!r} is not valid: use 'cuda' or 'cuda:N'.")
        available = onnxruntime.get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise ValueError(
                f"device={device!r} needs the CUDA build of onnxruntime-training, but the "
                f"installed runtime only has {available}. Install it in place of the CPU "
                "build: 'pip uninstall -y onnxruntime-training-cpu && pip install "
                "onnxruntime-training==1.19.2' (CUDA 11.8, Python <= 3.11), or use "
                "device='cpu'."
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"], int(index_text)
    raise ValueError(f"device={device!r} is not valid: use 'cpu', 'cuda' or 'cuda:N'.")


def _ort_device(provider: str, device_index: int):
    if provider == "CUDAExecutionProvider":
        kind = _C.OrtDevice.cuda()
    else:
        kind = _C.OrtDevice.cpu()
        device_index = 0
    return _C.OrtDevice(kind, _C.OrtDevice.default_memory(), device_index)


def to_ortvalue(array: np.ndarray, device: str = "cpu") -> OrtValue:
    """Copy a numpy array into a new ``OrtValue`` owned by the runtime.

    ``OrtValue.ortvalue_from_numpy`` shares the array's memory on CPU without
    keeping the array alive; this function allocates runtime memory instead, so
    the result stays valid whatever happens to ``array``.

    Parameters
    ----------
    array : numpy.ndarray
        Values to copy. Non-contiguous arrays are made contiguous first.
    device : str, default="cpu"
        Device of the new value, ``"cpu"`` or ``"cuda[:N]"``.

    Returns
    -------
    OrtValue
    """
    array = np.ascontiguousarray(array)
    providers, index = device_to_providers(device)
    value = OrtValue.ortvalue_from_shape_and_type(
        list(array.shape), array.dtype.type, _ort_device(providers[0], index)
    )
    value.update_inplace(array)
    return value


def ortvalue_view(array: np.ndarray, device: str = "cpu") -> OrtValue:
    """Wrap a C-contiguous numpy array as an ``OrtValue`` without copying it on CPU.

    On CPU the result points to ``array``'s memory and does not keep it alive:
    the caller must hold a reference to ``array`` for as long as the value is
    used. On CUDA the values are copied to the device.

    Parameters
    ----------
    array : numpy.ndarray
        C-contiguous array.
    device : str, default="cpu"
        ``"cpu"`` or ``"cuda[:N]"``.

    Returns
    -------
    OrtValue
    """
    if not array.flags.c_contiguous:
        raise ValueError("ortvalue_view needs a C-contiguous array.")
    providers, index = device_to_providers(device)
    return OrtValue.ortvalue_from_numpy(array, _ort_device(providers[0], index))


def _vector(values: Sequence[OrtValue]) -> OrtValueVector:
    vec = OrtValueVector()
    vec.reserve(len(values))
    for value in values:
        vec.push_back(value)
    return vec


def run_with_ortvalues(
    session: onnxruntime.InferenceSession,
    input_names: Sequence[str],
    inputs: Sequence[OrtValue],
    output_names: Sequence[str] | None = None,
) -> list[OrtValue]:
    """Run ``session`` on ``OrtValue`` inputs and return ``OrtValue`` outputs.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The session to run.
    input_names : list of str
        Names of the inputs, matched with ``inputs`` by position.
    inputs : list of OrtValue
        The values; nothing is copied.
    output_names : list of str, optional
        Outputs to fetch, all of them by default.

    Returns
    -------
    list of OrtValue
    """
    if output_names is None:
        output_names = [o.name for o in session.get_outputs()]
    feeds = dict(zip(input_names, inputs))
    return list(session._sess.run_with_ort_values(feeds, list(output_names), None))


class BoundRun:
    """Calls of one session that write their outputs into given ``OrtValue`` objects.

    The runtime's IO binding: inputs and outputs bound once are kept from call
    to call; :meth:`run` binds the inputs that change, then runs. Nothing is
    allocated for the outputs.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The session to run.
    inputs : dict of str to OrtValue
        Inputs bound for every call (an input changed with
        ``OrtValue.update_inplace`` is read anew at each call).
    outputs : dict of str to OrtValue
        Every output of the session and the value it is written into.
    """

    def __init__(
        self,
        session: onnxruntime.InferenceSession,
        inputs: dict[str, OrtValue],
        outputs: dict[str, OrtValue],
    ):
        missing = {o.name for o in session.get_outputs()} - set(outputs)
        if missing:
            raise ValueError(f"outputs {sorted(missing)} are not bound.")
        self._session = session
        self._binding = _C.SessionIOBinding(session._sess)
        self._run_options = onnxruntime.RunOptions()
        for name, value in inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        for name, value in outputs.items():
            self._binding.bind_ortvalue_output(name, value)

    def run(self, inputs: dict[str, OrtValue]) -> None:
        """Bind ``inputs`` (name to value) and run the session."""
        for name, value in inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        self._session._sess.run_with_iobinding(self._binding, self._run_options)


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

    Same values; onnxruntime 1.19's ReluGrad kernel is about 4x slower than
    these three element-wise kernels on a 256 x 256 tensor on 2 CPU cores
    (196 us against 51 us). Returns the number of nodes replaced.
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


def static_shapes(model: onnx.ModelProto) -> dict:
    """Inferred shapes by tensor name: lists of ints and symbol names (None: unknown)."""
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
        graph = onnx.shape_inference.infer_shapes(light).graph
    except Exception:  # noqa: BLE001 - no shapes, nothing to simplify
        return {}
    return {
        vi.name: [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in vi.type.tensor_type.shape.dim
        ]
        for vi in [*graph.input, *graph.value_info, *graph.output]
        if vi.type.tensor_type.HasField("shape")
    }


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
    once per batch symbol from the shape of the first such ``dY``. Same values;
    onnxruntime 1.19 sums a 256 x 256 tensor over its first axis in about 34 us
    on 2 CPU cores, the matrix product takes about 6 us. The batch axis is one
    whose size is a symbol (``batch`` in the engine's training graph). Returns
    the number of nodes replaced.
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
    ):
        providers = list(providers)
        self.session = onnxruntime.InferenceSession(
            model_bytes, sess_options=session_options, providers=providers
        )
        device = _ort_device(providers[0], device_index)
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
        fetches = OrtValueVector()
        self._agent.run_forward(_vector(feeds), fetches, state, _C.OrtValueCache())
        return list(fetches)

    def run_backward(self, grad_outputs: Sequence[OrtValue], state) -> list[OrtValue]:
        """Resume the graph after the ``YieldOp`` and return the gradients.

        Parameters
        ----------
        grad_outputs : list of OrtValue
            Gradient of the objective with respect to each differentiable user
            output of the forward pass.
        state : PartialGraphExecutionState
            The state given to :meth:`run_forward` for the same batch.

        Returns
        -------
        list of OrtValue
            One value per name of ``bw_fetches_names``.
        """
        fetches = OrtValueVector()
        self._agent.run_backward(_vector(grad_outputs), fetches, state)
        return list(fetches)


class OrtGradientForwardBackward:
    """Build the gradient graph of an ONNX model and run it on ``OrtValue`` objects.

    ``OrtModuleGraphBuilder`` turns the listed initializers into graph inputs
    and appends the backward graph. The resulting object offers three passes:

    * :meth:`forward` (training): returns the user outputs and an execution
      state to give to :meth:`backward`;
    * :meth:`backward`: takes the gradient of the objective with respect to
      each differentiable output, returns the gradients of the inputs listed in
      ``input_names_require_grad`` followed by those of ``weights_to_train``;
    * :meth:`forward_inference`: the forward graph alone, weights given as
      inputs, nothing kept for a backward pass.

    Parameters
    ----------
    onnx_model : onnx.ModelProto
        The model. Its IR version and opsets are lowered to what the runtime
        accepts (a copy is made).
    weights_to_train : list of str
        Float initializers to differentiate with respect to, in the order in
        which they are fed and their gradients returned.
    input_names_require_grad : list of str, default=()
        Graph inputs whose gradients are wanted too.
    device : str, default="cpu"
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    session_options : onnxruntime.SessionOptions, optional
        Options for both sessions (threads, optimisation level).

    Attributes
    ----------
    input_names : list of str
        User inputs of the model, in feeding order.
    output_names : list of str
        User outputs of the model.
    graph_info : GraphInfo
        What the builder reports (frontier map, non-differentiable outputs...).
    gradient_model : onnx.ModelProto
        The forward and backward graph the training session runs.
    forward_model : onnx.ModelProto
        The forward graph with the weights as inputs.
    differentiable_output_indices : list of int
        Indices in ``output_names`` of the outputs :meth:`backward` needs a
        gradient for.
    """

    def __init__(
        self,
        onnx_model: onnx.ModelProto,
        weights_to_train: Sequence[str],
        input_names_require_grad: Sequence[str] = (),
        device: str = "cpu",
        session_options: onnxruntime.SessionOptions | None = None,
    ):
        model = onnx.ModelProto()
        model.CopyFrom(onnx_model)
        pin_versions(model)
        self.weights_to_train = list(weights_to_train)
        self.input_names_require_grad = list(input_names_require_grad)
        self.device = device
        self.providers, self.device_index = device_to_providers(device)
        self._check_weights(model)
        initializer_names = [i.name for i in model.graph.initializer]
        self.input_names = [i.name for i in model.graph.input if i.name not in initializer_names]
        self.output_names = [o.name for o in model.graph.output]

        config = _C.OrtModuleGraphBuilderConfiguration()
        config.initializer_names = self.weights_to_train
        config.initializer_names_to_train = self.weights_to_train
        config.input_names_require_grad = self.input_names_require_grad
        config.build_gradient_graph = True
        config.enable_caching = False
        config.loglevel = type(config.loglevel).ERROR
        builder = _C.OrtModuleGraphBuilder()
        logger.debug(
            "building the gradient graph: inputs=%r outputs=%r weights=%r",
            self.input_names,
            self.output_names,
            self.weights_to_train,
        )
        builder.initialize(model.SerializeToString(), config)
        builder.build(_C.TrainingGraphTransformerConfiguration())
        gradient_bytes = builder.get_gradient_model()
        forward_bytes = builder.get_forward_model()
        self.graph_info = builder.get_graph_info()
        self.gradient_model = onnx.load_from_string(gradient_bytes)
        rewritten = rewrite_relu_grad(self.gradient_model)
        rewritten += rewrite_batch_sums(self.gradient_model)
        if rewritten:
            gradient_bytes = self.gradient_model.SerializeToString()
        self.forward_model = onnx.load_from_string(forward_bytes)
        self._name_unnamed_nodes(self.gradient_model)
        self._name_unnamed_nodes(self.forward_model)

        non_diff = set(self.graph_info.output_grad_indices_non_differentiable)
        self.differentiable_output_indices = [
            i for i in range(len(self.output_names)) if i not in non_diff
        ]
        grad_inputs = [i.name for i in self.gradient_model.graph.input]
        bw_fetches = [o.name for o in self.gradient_model.graph.output]
        n_fw_outputs = len(self.graph_info.user_output_names) + len(
            self.graph_info.frontier_node_arg_map
        )
        expected = len(self.input_names_require_grad) + len(self.weights_to_train)
        if len(bw_fetches) != expected:
            raise RuntimeError(
                f"the gradient graph returns {len(bw_fetches)} gradients, expected {expected} "
                f"({self.input_names_require_grad + self.weights_to_train})."
            )
        self.agent = TrainingAgent(
            gradient_bytes,
            grad_inputs,
            n_fw_outputs,
            bw_fetches,
            providers=self.providers,
            device_index=self.device_index,
            session_options=session_options,
        )
        self._n_user_outputs = len(self.graph_info.user_output_names)
        self._forward_bytes = forward_bytes
        self._session_options = session_options
        self._eval_session = None
        logger.debug(
            "gradient graph built: %d nodes, %d forward outputs",
            len(self.gradient_model.graph.node),
            n_fw_outputs,
        )

    def _check_weights(self, model: onnx.ModelProto) -> None:
        types = {i.name: i.data_type for i in model.graph.initializer}
        if len(set(self.weights_to_train)) != len(self.weights_to_train):
            raise ValueError(f"weights_to_train has duplicates: {self.weights_to_train}.")
        for name in self.weights_to_train:
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
        state = self.agent.new_state()
        outputs = self.agent.run_forward(list(inputs) + list(weights), state)
        return outputs[: self._n_user_outputs], state

    def backward(self, grad_outputs: Sequence[OrtValue], state) -> list[OrtValue]:
        """Run the backward pass of the batch whose forward pass produced ``state``.

        Parameters
        ----------
        grad_outputs : list of OrtValue
            One value per index of ``differentiable_output_indices``.
        state : PartialGraphExecutionState
            Returned by :meth:`forward`; a state serves one backward pass.

        Returns
        -------
        list of OrtValue
            Gradients of ``input_names_require_grad`` then of ``weights_to_train``.
        """
        if len(grad_outputs) != len(self.differentiable_output_indices):
            raise ValueError(
                f"backward expects {len(self.differentiable_output_indices)} output "
                f"gradients, got {len(grad_outputs)}."
            )
        return self.agent.run_backward(grad_outputs, state)

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
            self._eval_session = onnxruntime.InferenceSession(
                self._forward_bytes, sess_options=self._session_options, providers=self.providers
            )
        return self._eval_session
