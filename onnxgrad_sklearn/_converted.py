"""A template converted to ONNX: its graph, and where its parameters are.

:class:`ConvertedTemplate` is what every kind of template becomes (a scikit-learn
model converted by skl2onnx, :mod:`onnxgrad_sklearn.templates`; an ONNX model,
:mod:`onnxgrad_sklearn.onnx_template`) and what the engine, the export and the
artifacts cache use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ._lazy import lazy

onnx = lazy("onnx")
numpy_helper = lazy("onnx.numpy_helper")
TensorProto = lazy("onnx", "TensorProto")

__all__ = ["GIVEN_AT_RUN_TIME", "ConvertedTemplate", "set_values", "split_model"]


@dataclass(eq=False)  # compared by identity: its values are arrays
class ConvertedTemplate:
    """A template converted to ONNX, with its parameters located in the graph.

    The graph is kept as bytes whose parameters' initializers hold no data (the
    *skeleton*, what the artifact cache stores), beside the parameters' values as
    numpy arrays: a session is made from the two without onnx (:meth:`session`),
    and the ONNX model is made only when asked for (:attr:`model`).

    Attributes
    ----------
    skeleton : bytes
        The serialized inference graph (input ``X``, float32 or double:
        :attr:`dtype`), the parameters' initializers with their names, types and
        dims but no data: marked as external data (:data:`GIVEN_AT_RUN_TIME`), which
        onnxruntime takes from ``SessionOptions.add_external_initializers`` before it
        optimizes the graph (an initializer without data, or with placeholder values,
        given by ``add_initializer`` instead, is read by its graph optimizers: wrong
        values or a crash).
    params : list of ParamRef
        Parameters of the final model.
    initializer_names : list of str
        Name of the initializer holding each parameter.
    layouts : list of str
        ``'reshape'`` or ``'transpose'``: how each initializer relates to the
        scikit-learn attribute.
    output_name : str
        Name of the prediction output.
    values : list of numpy.ndarray
        The value of each parameter's initializer (its dims, the graph's float
        type); None where a large model's training holds it (see
        ``_release_trained_values``). Replaced as a whole, never written into.
    dims : list of tuple of int
        The dims of each parameter's initializer.
    float_type : str
        ``"float32"`` or ``"float64"``.
    input_width : int
        Number of columns of the input ``X``.
    training : dict or None
        For a model with Dropout or BatchNormalization in training mode: its training
        graph's skeleton (``"skeleton"``), its dropout masks (``"masks"``: input, node,
        ratio, shape, dtype) and running statistics (``"statistics"``: initializer,
        output of its updated value); None otherwise.
    origin : {"scikit-learn", "onnx"}
        What the template was: a scikit-learn model converted by skl2onnx, or an ONNX
        model (:class:`~onnxgrad_sklearn.OnnxTemplate`).
    key : str or None
        The key of the conversion's artifact (:mod:`onnxgrad_sklearn.artifacts`);
        None where the template's structure has none (it is converted at each fit).
    """

    skeleton: bytes
    params: list  # of families.ParamRef
    initializer_names: list[str]
    layouts: list[str]
    output_name: str
    values: list
    dims: list
    float_type: str
    input_width: int
    key: str | None = None
    training: dict | None = None
    origin: str = "scikit-learn"

    def __setattr__(self, name, value):
        if name in ("skeleton", "values", "initializer_names"):
            self.__dict__.pop("_model", None)  # made again from the new values when asked
        object.__setattr__(self, name, value)

    def copy(self, **changes) -> ConvertedTemplate:
        """A copy sharing the arrays, with the fields ``changes`` set: what
        ``dataclasses.replace`` gives (its ONNX model made again when asked for),
        without checking every field again (a callback's ``fitted_estimator`` makes one
        an epoch)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.pop("_model", None)
        new.__dict__.update(changes)
        return new

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_model", None)
        return state

    def __setstate__(self, state):
        state = dict(state)
        if "skeleton" not in state:  # pickled by a version that kept the ModelProto
            model = state.pop("model")
            model = onnx.load_from_string(model) if isinstance(model, bytes) else model
            state.update(split_model(model, state["initializer_names"]))
        self.__dict__.update(state)

    @property
    def model(self) -> onnx.ModelProto:
        """The inference graph, its parameters' initializers holding :attr:`values`.

        Made (onnx imported) on first use after the values change.
        """
        found = self.__dict__.get("_model")
        if found is None:
            found = self.__dict__["_model"] = self.with_values(self.values)
        return found

    @model.setter
    def model(self, model: onnx.ModelProto) -> None:
        for name, value in split_model(model, self.initializer_names).items():
            setattr(self, name, value)
        self.__dict__["_model"] = model

    @property
    def dtype(self) -> np.dtype:
        """The graph's float type: float32, or float64 for a double graph."""
        return np.dtype(self.float_type)

    def initializer_values(self, skip=()) -> list[np.ndarray]:
        """Return copies of the values of the parameters' initializers (in :attr:`dtype`).

        The positions in ``skip`` (indices into :attr:`initializer_names`) are
        None: values about to be replaced are not copied.
        """
        return [None if k in skip or v is None else v.copy() for k, v in enumerate(self.values)]

    def named_values(self, names) -> list[np.ndarray]:
        """The values of the initializers ``names`` (the arrays kept, not copies)."""
        index = {name: k for k, name in enumerate(self.initializer_names)}
        return [self.values[index[name]] for name in names]

    def training_model(self, values=None) -> onnx.ModelProto:
        """The training-mode graph (Dropout and BatchNormalization in training mode,
        :attr:`training`), its parameters holding ``values`` (default: :attr:`values`)."""
        model = onnx.load_from_string(self.training["skeleton"])
        names = set(self.initializer_names)
        for init in model.graph.initializer:
            if init.name in names:
                init.ClearField("external_data")
                init.ClearField("data_location")
        values = self.values if values is None else values
        given = [(n, v) for n, v in zip(self.initializer_names, values) if v is not None]
        set_values(model, [n for n, _ in given], [v for _, v in given])
        return model

    def with_values(self, values) -> onnx.ModelProto:
        """Return the graph as a new model whose parameter initializers hold ``values``.

        ``values=None`` (or a None among them): those initializers keep their
        names, types and dims, and hold no data (a model to give values later,
        not to run).
        """
        model = onnx.load_from_string(self.skeleton)
        names = set(self.initializer_names)
        for init in model.graph.initializer:
            if init.name in names:  # no longer external data (see skeleton)
                init.ClearField("external_data")
                init.ClearField("data_location")
        if values is not None:
            given = [(n, v) for n, v in zip(self.initializer_names, values) if v is not None]
            set_values(model, [n for n, _ in given], [v for _, v in given])
        return model

    def session(self, options, providers, provider_options=None, **kwargs):
        """An ``InferenceSession`` of the graph holding :attr:`values`, made without onnx.

        The skeleton's bytes, the values given by
        ``SessionOptions.add_external_initializers`` (``options`` is changed: pass
        options of its own). onnxruntime copies the values into the session (measured
        with 1.19 and 1.32: a change made to them afterwards does not change what the
        session computes), so they are given as they are, not copied first;
        ``kwargs`` go to :func:`~onnxgrad_sklearn.runtime.make_session`.
        """
        from .runtime import import_onnxruntime, make_session

        if any(v is None for v in self.values):
            raise RuntimeError("the parameters' values are held by a training engine.")
        OrtValue = import_onnxruntime().OrtValue  # the Python class the options take
        kept = [OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for v in self.values]
        options.add_external_initializers(list(self.initializer_names), kept)
        session = make_session(
            self.skeleton, options, providers, provider_options, strict=False, **kwargs
        )
        session._onnxgrad_initializers = kept  # alive as long as the session, all the same
        return session

    def values_from(self, final) -> list[np.ndarray]:
        """Return the parameters of ``final`` laid out as this graph's initializers."""
        values = []
        dtype = self.dtype
        for ref, layout, dims in zip(self.params, self.layouts, self.dims):
            value = ref.get(final).astype(dtype)
            value = value.T if layout == "transpose" else value
            values.append(np.ascontiguousarray(value).reshape(dims))
        return values

    def write_back(self, final, values) -> None:
        """Store initializer ``values`` into the parameters of ``final`` (in place)."""
        for ref, layout, value in zip(self.params, self.layouts, values):
            old = ref.get(final)
            value = np.asarray(value)
            # the parameter's own float type, widened to the trained one (float64
            # training gives float64 arrays, float32 training keeps a float64 coef_)
            dtype = old.dtype if np.issubdtype(old.dtype, np.floating) else np.float64
            dtype = np.promote_types(dtype, value.dtype)
            if layout == "transpose":
                new = value.reshape(old.shape[::-1]).T
            else:
                new = value.reshape(old.shape)
            ref.set(final, np.ascontiguousarray(new, dtype=dtype))


def split_model(model: onnx.ModelProto, names, read_values: bool = True) -> dict:
    """The fields of a :class:`ConvertedTemplate` that ``model`` gives: its skeleton, the
    values (None without ``read_values``), dims and float type of the initializers
    ``names``, the input's width."""
    from ._graph import model_dtype
    from ._passes import copy_fields

    wanted = set(names)
    skeleton = copy_fields(model, onnx.ModelProto(), skip="graph")
    graph = copy_fields(model.graph, skeleton.graph, skip="initializer")
    found = {}
    for init in model.graph.initializer:
        new = graph.initializer.add()
        if init.name in wanted:
            new.name, new.data_type = init.name, init.data_type
            new.dims.extend(init.dims)
            new.data_location = TensorProto.EXTERNAL  # given to each session
            entry = new.external_data.add()
            entry.key, entry.value = "location", GIVEN_AT_RUN_TIME
            found[init.name] = init
        else:
            new.CopyFrom(init)
    values = [
        numpy_helper.to_array(found[n]).copy() if read_values and _has_data(found[n]) else None
        for n in names
    ]
    dims = [tuple(found[n].dims) for n in names]
    return {
        "skeleton": skeleton.SerializeToString(),
        "values": values,
        "dims": dims,
        "float_type": str(model_dtype(model)),
        "input_width": model.graph.input[0].type.tensor_type.shape.dim[1].dim_value,
    }


#: The file name a skeleton's parameters point to as external data: none is read, the
#: values are given to each session (:meth:`ConvertedTemplate.session`).
GIVEN_AT_RUN_TIME = "onnxgrad-sklearn: values given at run time"


def _has_data(init) -> bool:
    return bool(init.raw_data or init.float_data or init.double_data or math.prod(init.dims) == 0)


def set_values(model: onnx.ModelProto, names: Sequence[str], values) -> None:
    """Write ``values`` into the initializers ``names`` of ``model``, keeping their dims.

    A double initializer gets float64 values, any other float32 ones.
    """
    index = {name: k for k, name in enumerate(names)}
    for init in model.graph.initializer:
        if init.name in index:
            double = init.data_type == TensorProto.DOUBLE
            array = np.asarray(values[index[init.name]], dtype=np.float64 if double else np.float32)
            if array.size != math.prod(init.dims):
                raise ValueError(
                    f"initializer {init.name!r} has dims {list(init.dims)}, got {array.shape}."
                )
            init.ClearField("float_data")
            init.ClearField("double_data")
            init.ClearField("external_data")
            init.ClearField("data_location")
            init.data_type = TensorProto.DOUBLE if double else TensorProto.FLOAT
            little = "<f8" if double else "<f4"
            init.raw_data = np.ascontiguousarray(array).astype(little, copy=False).tobytes()
