"""Any ONNX model as a template: :class:`OnnxTemplate`.

A model exported by PyTorch, taken from a model zoo or written by another converter
is trained as the scikit-learn templates are: its data input is ``X`` (any rank,
float or integer), the prediction is one of its outputs, and the weights trained are
floating-point initializers chosen by name (:func:`trainable_names`). The template
declares its family (:class:`OnnxFamily`), through which the package converts it
(the graph itself, its trained initializers located by name), writes the trained
weights back (into the fitted copy's :attr:`OnnxTemplate.weights_`) and exports it
(the same graph, inputs, outputs and opset, holding the trained weights).
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
import os
from dataclasses import dataclass

import numpy as np
from sklearn.base import BaseEstimator, is_classifier
from sklearn.utils._param_validation import HasMethods

from ._lazy import lazy
from .families import Family, ParamRef

onnx = lazy("onnx")
numpy_helper = lazy("onnx.numpy_helper")

__all__ = [
    "cast_float_type",
    "OnnxFamily",
    "OnnxModelConstraint",
    "OnnxTemplate",
    "TemplateSpec",
    "conform_input",
    "input_spec",
    "is_onnx_model",
    "trainable_names",
    "validate_onnx_input",
]

logger = logging.getLogger("onnxgrad_sklearn")

#: Operators whose output gives probabilities from the logits before them: a
#: classifier trains those logits (the cross-entropy computed from them), and
#: ``predict_proba`` gives the probabilities.
PROBABILITY_OPS = ("Softmax", "LogSoftmax", "Sigmoid")

#: Node inputs that are not weights, whatever their type: shapes, indices, a
#: dropout's ratio and mode, BatchNormalization's running statistics.
_NOT_WEIGHTS = {
    "Reshape": {1},
    "Expand": {1},
    "Tile": {1},
    "Slice": {1, 2, 3, 4},
    "Gather": {1},
    "GatherElements": {1},
    "GatherND": {1},
    "ScatterND": {1},
    "Pad": {1, 2, 3},
    "Resize": {1, 2, 3},
    "Upsample": {1},
    "Dropout": {1, 2},
    "BatchNormalization": {3, 4},
    "Clip": {1, 2},
    "ConstantOfShape": {0},
    "Range": {0, 1, 2},
    "OneHot": {1, 2},
    "TopK": {1},
    "Split": {1},
    "Squeeze": {1},
    "Unsqueeze": {1},
    "ReduceSum": {1},
    "ReduceMean": {1},
    "ReduceMax": {1},
    "ReduceMin": {1},
    "ReduceProd": {1},
    "ReduceL2": {1},
    "ReduceSumSquare": {1},
    "ReduceLogSumExp": {1},
    "CumSum": {1},
    "Trilu": {1},
    "Pow": {1},
}

_FLOAT_TYPES = {1: np.float32, 11: np.float64}  # TensorProto.FLOAT, DOUBLE
_INT_TYPES = {6: np.int32, 7: np.int64}  # TensorProto.INT32, INT64


class OnnxTemplate(BaseEstimator):
    """An ONNX model to train, scikit-learn style.

    Pass it as the ``estimator`` of :class:`~onnxgrad_sklearn.OrtGradientRegressor`
    or :class:`~onnxgrad_sklearn.OrtGradientClassifier`: the model's floating-point
    weights are trained on ``X`` (the model's one data input, its first dimension
    the batch) and ``y``, and the fitted estimator's ``to_onnx()`` is the same
    graph (inputs, outputs, opset) holding the trained weights.

    Parameters
    ----------
    model : onnx.ModelProto, bytes or path-like
        The model, its serialized bytes, or the path of an ``.onnx`` file (its
        external-data files, next to it, are read too). Never modified.
    trainable : str or list of str, default=None
        Names or glob patterns (``fnmatch``) of the initializers to train. None:
        every floating-point initializer of at least one dimension on the
        output's path, except the inputs that are not weights (shapes, indices, a
        BatchNormalization's running mean and variance, which are statistics).
    frozen : str or list of str, default=None
        Names or glob patterns removed from the trained set (transfer learning):
        these weights come back bit for bit.
    output : str, default=None
        The graph output that is the prediction (None: the first). A
        classifier's output made by Softmax, LogSoftmax or Sigmoid is trained
        through the logits before it; any other output is taken as logits.

    Attributes
    ----------
    weights_ : dict of str to ndarray
        Set on the copy a fitted estimator holds (``estimator_``): the trained
        weights by initializer name.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import TensorProto, helper, numpy_helper
    >>> from onnxgrad_sklearn import OnnxTemplate, OrtGradientRegressor
    >>> W = numpy_helper.from_array(np.zeros((3, 1), np.float32), "W")
    >>> graph = helper.make_graph(
    ...     [helper.make_node("MatMul", ["X", "W"], ["y"])], "linear",
    ...     [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n", 3])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 1])], [W])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    >>> X = np.random.RandomState(0).randn(64, 3).astype(np.float32)
    >>> reg = OrtGradientRegressor(OnnxTemplate(model), max_iter=5).fit(X, X @ [1.0, 2.0, 3.0])
    >>> reg.predict(X[:2]).shape
    (2,)
    """

    def __init__(self, model, *, trainable=None, frozen=None, output=None):
        self.model = model
        self.trainable = trainable
        self.frozen = frozen
        self.output = output

    def __sklearn_is_fitted__(self):
        return True  # an ONNX model holds its weights: training starts from them

    def __getstate__(self):
        # the model as its bytes (a skops file holds no protobuf object), its parse and
        # reading made again when first needed
        state = self.__dict__.copy()
        state.pop("_loaded", None)
        state.pop("_spec", None)
        if type(state.get("model")).__name__ == "ModelProto":
            state["model"] = state["model"].SerializeToString()
        return state

    def load(self):
        """The model as an ``onnx.ModelProto`` (read once; the parameter is not modified).

        Returns
        -------
        onnx.ModelProto
        """
        found = self.__dict__.get("_loaded")
        if found is not None and found[0] is self.model:
            return found[1]
        model = self.model
        if isinstance(model, (str, os.PathLike)):
            model = onnx.load(os.fspath(model))
        elif isinstance(model, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model))
        elif not isinstance(model, onnx.ModelProto):
            raise TypeError(
                f"OnnxTemplate(model=...) takes an onnx.ModelProto, its serialized bytes or "
                f"the path of an .onnx file, got {type(model).__name__}."
            )
        self.__dict__["_loaded"] = (self.model, model)
        return model

    def spec(self) -> TemplateSpec:
        """What the package reads from the model: its data input, its prediction,
        the weights it trains (:class:`TemplateSpec`); checked, ValueError otherwise.

        Returns
        -------
        TemplateSpec
        """
        key = (id(self.model), _names_key(self.trainable), _names_key(self.frozen), self.output)
        found = self.__dict__.get("_spec")
        if found is not None and found[0] == key:
            return found[1]
        spec = _describe(self.load(), self.trainable, self.frozen, self.output)
        self.__dict__["_spec"] = (key, spec)
        return spec

    def predict(self, X):
        """The model's prediction output on ``X``, run by onnxruntime as it is (its
        :attr:`weights_` after a fit; Dropout and BatchNormalization in inference mode).

        Parameters
        ----------
        X : array-like
            The model's input, the batch first.

        Returns
        -------
        numpy.ndarray
            The output :attr:`output` (the first by default).
        """
        from .backends.training_mode import inference_mode
        from .runtime import import_onnxruntime

        spec = self.spec()
        X = conform_input(X, spec, spec.float_type)
        session = import_onnxruntime().InferenceSession(
            inference_mode(self.to_onnx()).SerializeToString(),
            providers=["CPUExecutionProvider"],
        )
        return session.run([spec.output], {spec.input: X})[0]

    def to_onnx(self):
        """The model holding :attr:`weights_` (the given weights before a fit).

        Returns
        -------
        onnx.ModelProto
        """
        model = onnx.ModelProto()
        model.CopyFrom(self.load())
        weights = self.__dict__.get("weights_")
        if weights:
            for init in model.graph.initializer:
                if init.name in weights:
                    init.CopyFrom(
                        numpy_helper.from_array(_as_type(weights[init.name], init), init.name)
                    )
        return model


def is_onnx_model(value) -> bool:
    """Whether ``value`` is an ONNX model given as a template directly: an
    ``onnx.ModelProto``, its bytes, or the path of an ``.onnx`` file."""
    if type(value).__name__ == "ModelProto" or isinstance(value, (bytes, bytearray)):
        return True
    return isinstance(value, (str, os.PathLike)) and os.fspath(value).endswith(".onnx")


class OnnxModelConstraint(HasMethods):
    """scikit-learn's parameter validation of an ONNX model given as ``estimator``
    (a :class:`~sklearn.utils._param_validation.HasMethods` only to be taken as a
    constraint)."""

    def __init__(self):
        super().__init__([])

    def is_satisfied_by(self, value) -> bool:
        return is_onnx_model(value)

    def __str__(self):
        return "an ONNX model (onnx.ModelProto, its bytes, or the path of an .onnx file)"


def input_spec(template) -> TemplateSpec | None:
    """The :class:`TemplateSpec` of an ONNX template, or of a Pipeline's final ONNX
    template (None for any other template)."""
    final = template.steps[-1][1] if hasattr(template, "steps") else template
    return final.spec() if isinstance(final, OnnxTemplate) else None


def conform_input(X, spec: TemplateSpec, dtype, what: str = "X") -> np.ndarray:
    """``X`` checked against the ONNX template's data input, in the type it takes.

    Parameters
    ----------
    X : ndarray
        The samples, the batch first.
    spec : TemplateSpec
        The template's.
    dtype : numpy dtype
        The float type the graph computes in (a float input's type).
    what : str, default="X"
        The argument's name, for the messages.

    Returns
    -------
    numpy.ndarray
        C-contiguous: floats in ``dtype``, integers in the input's type.

    Raises
    ------
    ValueError
        Another rank, a declared dimension that differs, floats for an integer input.
    """
    X = np.asarray(X)
    shown = ", ".join(["n_samples"] + ["?" if d is None else str(d) for d in spec.input_shape])
    if X.ndim != 1 + len(spec.input_shape) or any(
        want is not None and got != want for got, want in zip(X.shape[1:], spec.input_shape)
    ):
        raise ValueError(
            f"{what} has shape {X.shape}; the ONNX template's input {spec.input!r} takes "
            f"({shown}). Reshape {what} (a Pipeline step in front, a FunctionTransformer, "
            "can do it)."
        )
    if spec.input_dtype.kind in "iu":
        if X.dtype.kind not in "iub":
            raise ValueError(
                f"the ONNX template's input {spec.input!r} takes {spec.input_dtype} values "
                f"(indices, token ids); {what} is {X.dtype}: pass integers."
            )
        return np.ascontiguousarray(X, dtype=spec.input_dtype)
    return np.ascontiguousarray(X, dtype=dtype)


def validate_onnx_input(est, X, y, spec, reset, what="X"):
    """scikit-learn's checks of ``X`` (any rank, its own type) and ``y`` for an ONNX
    template; ``n_features_in_`` is recorded for a 2-D ``X`` only."""
    from sklearn.utils.validation import validate_data

    if hasattr(X, "toarray") and hasattr(X, "nnz"):
        raise TypeError(
            f"The ONNX template's input {spec.input!r} takes a dense array: {what} is "
            "sparse. Pass X.toarray()."
        )
    kwargs = {"allow_nd": True, "dtype": None, "accept_sparse": False}
    if y is None:
        X = validate_data(est, X, reset=reset, **kwargs)
    else:
        X, y = validate_data(
            est, X, y, reset=reset, multi_output=True, y_numeric=not is_classifier(est), **kwargs
        )
    if reset and np.ndim(X) != 2:
        est.__dict__.pop("n_features_in_", None)  # features are columns of a 2-D X only
    return X, y


def _as_type(value, init):
    dtype = numpy_helper.helper.tensor_dtype_to_np_dtype(init.data_type)
    return np.asarray(value, dtype=dtype).reshape(tuple(init.dims))


def _names_key(names):
    if names is None or isinstance(names, str):
        return names
    return tuple(names)


@dataclass(frozen=True)
class TemplateSpec:
    """What an ONNX template is, as read from its graph.

    Attributes
    ----------
    input : str
        The data input.
    input_dtype : numpy.dtype
        Its type (float32, float64, int32 or int64).
    input_shape : tuple
        Its dimensions after the batch: an int where declared, None where not.
    output : str
        The prediction output.
    logits : str
        What a classifier trains: the input of the Softmax, LogSoftmax or
        Sigmoid that makes :attr:`output`, or :attr:`output` itself.
    activation : str or None
        That operator (None: the output is taken as logits).
    output_width : int or None
        The output's size after the batch, where the graph declares it.
    float_type : numpy.dtype
        The float type of the prediction (float32 or float64).
    trainable : tuple of str
        The initializers trained, in graph order.
    """

    input: str
    input_dtype: np.dtype
    input_shape: tuple
    output: str
    logits: str
    activation: str | None
    output_width: int | None
    float_type: np.dtype
    trainable: tuple


def _as_list(names):
    if names is None:
        return None
    return [names] if isinstance(names, str) else list(names)


def trainable_names(model, trainable=None, frozen=None, output=None) -> list[str]:
    """The initializers of ``model`` an :class:`OnnxTemplate` trains.

    Parameters
    ----------
    model : onnx.ModelProto
        The model.
    trainable, frozen : str or list of str, default=None
        Names or glob patterns (see :class:`OnnxTemplate`).
    output : str, default=None
        The prediction output (None: the first).

    Returns
    -------
    list of str
        In the order of the graph's initializers.

    Raises
    ------
    ValueError
        A pattern matches no initializer, or nothing is left to train.
    """
    graph = model.graph
    output = output or graph.output[0].name
    from ._passes import needed_nodes

    needed, _ = needed_nodes(graph, [output])
    weight_slots, other_slots = set(), set()
    for keep, node in zip(needed, graph.node):
        if not keep:
            continue
        skip = _NOT_WEIGHTS.get(node.op_type, set()) if node.domain in ("", "ai.onnx") else set()
        for k, name in enumerate(node.input):
            (other_slots if k in skip else weight_slots).add(name)
    inits = list(graph.initializer)
    floats = [i.name for i in inits if i.data_type in _FLOAT_TYPES]
    asked = _as_list(trainable)
    if asked is None:
        candidates = [
            i.name
            for i in inits
            if i.data_type in _FLOAT_TYPES
            and len(i.dims) > 0
            and i.name in weight_slots
            and i.name not in other_slots
        ]
    else:
        candidates = _matching(asked, floats, "trainable")
    removed = set(_matching(_as_list(frozen) or [], floats, "frozen"))
    names = [n for n in candidates if n not in removed]
    unused = [n for n in names if n not in weight_slots and n not in other_slots]
    if unused:
        raise ValueError(
            f"trainable={trainable!r} names initializers the output {output!r} does not "
            f"depend on: {unused}. Train the weights on its path."
        )
    if not names:
        raise ValueError(
            f"the ONNX template has no weight to train (trainable={trainable!r}, "
            f"frozen={frozen!r}): its floating-point initializers on the output's path are "
            f"{[n for n in floats if n in weight_slots] or 'none'}."
        )
    return names


def _matching(patterns, names, what) -> list[str]:
    found = []
    for pattern in patterns:
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            shown = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")
            raise ValueError(
                f"{what}={pattern!r} matches no floating-point initializer of the ONNX "
                f"template (they are: {shown or 'none'})."
            )
        found.extend(n for n in matched if n not in found)
    return [n for n in names if n in found]


def _describe(model, trainable, frozen, output) -> TemplateSpec:
    graph = model.graph
    ml = sorted({n.op_type for n in graph.node if n.domain == "ai.onnx.ml"})
    if ml:
        raise ValueError(
            f"the ONNX template has ai.onnx.ml operators ({', '.join(ml)}): a graph made by "
            "skl2onnx from a scikit-learn model. Pass the scikit-learn model itself as the "
            "template."
        )
    inits = {i.name for i in graph.initializer}
    data = [i for i in graph.input if i.name not in inits]
    if len(data) != 1:
        names = [i.name for i in data]
        raise ValueError(
            f"an ONNX template takes one data input (the batch first), this one has "
            f"{len(data)}: {names}. Give the others initializers (their values), or export "
            "the model with one input."
        )
    (x,) = data
    tensor = x.type.tensor_type
    if tensor.elem_type not in _FLOAT_TYPES and tensor.elem_type not in _INT_TYPES:
        kind = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        raise ValueError(
            f"the ONNX template's input {x.name!r} is {kind}: float32, float64, int32 or "
            "int64 inputs are supported."
        )
    if not tensor.HasField("shape") or len(tensor.shape.dim) == 0:
        raise ValueError(
            f"the ONNX template's input {x.name!r} declares no shape: export it with the "
            "batch as its first dimension."
        )
    dtype = np.dtype(_FLOAT_TYPES.get(tensor.elem_type) or _INT_TYPES[tensor.elem_type])
    shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim[1:])
    outputs = [o.name for o in graph.output]
    if output is None:
        output = outputs[0]
    elif output not in outputs:
        raise ValueError(f"output={output!r} is not an output of the ONNX template: {outputs}.")
    info = next(o for o in graph.output if o.name == output)
    out_type = info.type.tensor_type.elem_type
    if out_type not in _FLOAT_TYPES:
        raise ValueError(
            f"the ONNX template's output {output!r} is not float32 or float64: it cannot be "
            "trained as a prediction (pass output= the name of a float output)."
        )
    dims = info.type.tensor_type.shape.dim
    width = None
    if info.type.tensor_type.HasField("shape"):
        rest = [d.dim_value if d.HasField("dim_value") else None for d in dims[1:]]
        width = int(np.prod(rest)) if all(r is not None for r in rest) else None
    producer = next((n for n in graph.node if output in n.output), None)
    activation, logits = None, output
    if (
        producer is not None
        and producer.op_type in PROBABILITY_OPS
        and producer.domain in ("", "ai.onnx")
    ):
        axis = next((a.i for a in producer.attribute if a.name == "axis"), -1)
        rank = len(dims) if info.type.tensor_type.HasField("shape") else None
        if producer.op_type == "Sigmoid" or axis == -1 or (rank is not None and axis == rank - 1):
            activation, logits = producer.op_type, producer.input[0]
    names = trainable_names(model, trainable, frozen, output)
    return TemplateSpec(
        input=x.name,
        input_dtype=dtype,
        input_shape=shape,
        output=output,
        logits=logits,
        activation=activation,
        output_width=width,
        float_type=np.dtype(_FLOAT_TYPES[out_type]),
        trainable=tuple(names),
    )


class OnnxFamily(Family):
    """The family of :class:`OnnxTemplate`: a regression or classification model, its
    weights the trainable initializers (``weights_[name]``)."""

    kind = "onnx"
    task = "any"
    solver = "adam"
    carried: frozenset = frozenset({"model", "trainable", "frozen", "output"})
    penalty_settings: frozenset = frozenset()

    def params(self, est):
        inits = {i.name: i for i in est.load().graph.initializer}
        return [
            ParamRef("weights_", name, penalized=len(inits[name].dims) >= 2)
            for name in est.spec().trainable
        ]

    def initialize(self, est, n_features, n_outputs, rng, dtype=np.float32):
        raise AssertionError("an ONNX template holds its weights")  # never unfitted

    def loss_for(self, est, task):
        return "log_loss" if task == "classification" else "squared_error"

    def gives_proba(self, est):
        return True

    def trained_view(self, est):
        return getattr(est, "_logit_view", None)

    def output_width(self, est):
        return est.spec().output_width

    def one_vs_rest(self, est):
        return est.spec().activation == "Sigmoid"  # one sigmoid per class

    def prediction_output(self, est):
        return est.spec().output

    def conversion(self, name, value, est, n_samples):
        return None

    def prepare(self, est, task):
        """Make the fitted copy ``est`` ready: its weights read from the graph, and for
        a classifier the view that outputs the logits."""
        spec = est.spec()
        inits = {i.name: i for i in est.load().graph.initializer}
        from .backends.training_mode import training_nodes

        kept = list(spec.trainable)
        for node in training_nodes(est.load())[1]:  # the running statistics, updated too
            kept += [n for n in node.input[3:5] if n in inits and n not in kept]
        # a fitted template (an estimator_) goes on from its trained weights
        given = est.__dict__.get("weights_") or {}
        est.weights_ = {
            name: np.array(given[name]) if name in given else numpy_helper.to_array(inits[name])
            for name in kept
        }
        if task == "classification" and spec.logits != spec.output:
            view = OnnxTemplate(
                est.model, trainable=est.trainable, frozen=est.frozen, output=est.output
            )
            view.__dict__["_loaded"] = est.__dict__["_loaded"]
            view.weights_ = est.weights_  # shared: the trained values written back reach est
            view._trained_output = spec.logits
            est._logit_view = view

    def convert(self, est, n_features, dtype):
        """The :class:`~onnxgrad_sklearn._converted.ConvertedTemplate` of ``est``: its
        graph, the trainable initializers located by name (no conversion).

        A model with Dropout or BatchNormalization in training mode has two graphs: the
        inference graph (predictions, the export: Dropout as Identity, the running
        statistics) and the training graph
        (:func:`~onnxgrad_sklearn.backends.training_mode.training_mode`: masks drawn at
        each step, batch statistics), kept in ``converted.training``; the running
        statistics are parameters not trained by gradient (the training graph's outputs
        update them).
        """
        from ._converted import ConvertedTemplate, split_model
        from .backends.training_mode import (
            describe,
            inference_mode,
            training_mode,
            training_nodes,
        )

        spec = est.spec()
        model = onnx.ModelProto()
        model.CopyFrom(est.load())
        if np.dtype(dtype) != spec.float_type:  # dtype="float64" on a float32 model...
            cast_float_type(model, np.dtype(dtype))
            _check_kernels(inference_mode(model), dtype)
        _batch_symbol(model, spec.input)
        output = getattr(est, "_trained_output", None)
        dropouts, batchnorms = training_nodes(model)
        names = list(spec.trainable)
        params = self.params(est)
        training = None
        if dropouts or batchnorms:
            mode = training_mode(model)
            statistics = [s.initializer for s in mode.statistics]
            names += statistics
            params += [ParamRef("weights_", n, False, trainable=False) for n in statistics]
            kept = [output or spec.output, *(s.output for s in mode.statistics)]
            _keep_outputs(mode.model, kept, dtype)
            training = {
                "skeleton": split_model(mode.model, names, read_values=False)["skeleton"],
                **describe(mode.masks, mode.statistics),
            }
            model = inference_mode(model)
        if output is not None:  # a classifier's logits: the graph up to them
            _keep_outputs(model, [output], dtype)
        else:
            output = spec.output
        fields = split_model(model, names, read_values=False)
        fields["input_width"] = spec.input_shape[0] if len(spec.input_shape) == 1 else 0
        parts = [fields["skeleton"]] + ([] if training is None else [training["skeleton"]])
        digest = hashlib.sha256(b"".join(parts)).hexdigest()
        from . import artifacts

        converted = ConvertedTemplate(
            params=params,
            initializer_names=names,
            layouts=["reshape"] * len(names),
            output_name=output,
            key=artifacts.stable_key("onnx-template", (digest, names, output)),
            training=training,
            origin="onnx",
            **fields,
        )
        converted.values = converted.values_from(est)
        return converted

    def export(self, est, n_features, dtype):
        """The template's own graph holding the trained weights (in the float type
        ``dtype``)."""
        from ._passes import pin_versions

        model = est.to_onnx()
        if np.dtype(dtype) != est.spec().float_type:
            cast_float_type(model, np.dtype(dtype))
        return pin_versions(model)


def cast_float_type(model, dtype) -> None:
    """Make ``model`` compute in the float type ``dtype`` (float32 or float64), in place.

    Every float32 tensor becomes float64 or the other way: initializers, inputs,
    outputs and intermediate types, ``Cast`` targets, constants and tensor attributes,
    in subgraphs too. Integer tensors are unchanged.
    """
    FLOAT, DOUBLE = onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE
    source, target = (FLOAT, DOUBLE) if np.dtype(dtype) == np.float64 else (DOUBLE, FLOAT)
    new_np = np.float64 if target == DOUBLE else np.float32

    def tensor(t):
        if t.data_type == source:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(new_np), t.name))

    def value_types(values):
        for v in values:
            if v.type.tensor_type.elem_type == source:
                v.type.tensor_type.elem_type = target

    def graph(g):
        for init in g.initializer:
            tensor(init)
        value_types([*g.input, *g.output, *g.value_info])
        for node in g.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT:
                    attr.i = target if attr.i == source else attr.i
                elif attr.type == onnx.AttributeProto.TENSOR:
                    tensor(attr.t)
                elif attr.type == onnx.AttributeProto.GRAPH:
                    graph(attr.g)
                elif attr.type == onnx.AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        graph(sub)

    graph(model.graph)


def _check_kernels(model, dtype) -> None:
    """Refuse a cast model onnxruntime has no kernel for (no float64 Conv on the CPU)."""
    from .runtime import import_onnxruntime

    ort = import_onnxruntime()
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:  # NOT_IMPLEMENTED: a kernel missing in this type
        if "NOT_IMPLEMENTED" not in str(exc) and "implementation" not in str(exc):
            raise
        raise ValueError(
            f"dtype={str(np.dtype(dtype))!r}: onnxruntime cannot run this ONNX template in "
            f"{np.dtype(dtype)} ({str(exc).split(':')[-1].strip()}). Train it with dtype=None "
            "(the model's own float type)."
        ) from None


def _keep_outputs(model, outputs, dtype) -> None:
    """Make ``outputs`` the model's only outputs (nodes' outputs promoted where needed),
    and remove the nodes they do not need."""
    from ._passes import prune

    graph = model.graph
    known = {v.name: v for v in [*graph.value_info, *graph.output]}
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    kept = []
    for name in outputs:
        info = known.get(name)
        kept.append(
            info if info is not None else onnx.helper.make_tensor_value_info(name, elem, None)
        )
    del graph.output[:]
    graph.output.extend(kept)
    prune(model)


def _batch_symbol(model, input_name) -> None:
    """The data input's first dimension named :data:`~onnxgrad_sklearn._names.BATCH`, and
    the same symbol wherever the graph's shapes name it (an exporter's ``s0`` or
    ``batch_size``): the gradient builders tell the tensors that share the batch from it.
    A model exported with a fixed batch gets the symbol on its input, and its recorded
    intermediate shapes, which held that size, are dropped."""
    from ._names import BATCH

    graph = model.graph
    dim = next(v for v in graph.input if v.name == input_name).type.tensor_type.shape.dim[0]
    if dim.HasField("dim_value"):
        dim.dim_param = BATCH
        del graph.value_info[:]
        for value in graph.output:
            dims = value.type.tensor_type.shape.dim
            if len(dims) and dims[0].HasField("dim_value"):
                dims[0].dim_param = BATCH
        return
    old = dim.dim_param
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for d in value.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param == old:
                d.dim_param = BATCH


OnnxTemplate._onnxgrad_family = OnnxFamily()
