"""From a scikit-learn model to a trainable ONNX graph, and back.

A *template* is the scikit-learn model the user passes: a regressor or
classifier, or a Pipeline ending in one. This module

* recognises the final model's family and lists its parameters
  (:class:`ParamRef`: attribute, index, penalised or not, trained or not);
* initialises the parameters of an unfitted model (Glorot uniform for MLPs as
  scikit-learn does, zeros for linear models);
* converts the template to ONNX with skl2onnx and finds, for every parameter,
  the initializer that holds it (:class:`ConvertedTemplate`);
* writes trained initializers back into a copy of the template.

Initializers are found by value: the final model is converted once with every
parameter filled with distinct random values, then each float initializer is
compared with each parameter (as is, reshaped or transposed). The graph keeps
the names skl2onnx gave; the real values are then written into it.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from ._lazy import lazy
from .families import ParamRef, family_of, supported_names

# imported on first use (``import onnxgrad_sklearn`` does not import onnx)
onnx = lazy("onnx")
numpy_helper = lazy("onnx.numpy_helper")
TensorProto = lazy("onnx", "TensorProto")

__all__ = ["ConvertedTemplate", "ParamRef", "convert_template", "final_estimator"]

logger = logging.getLogger("onnxgrad_sklearn")


def trained_view(est):
    """Return ``est`` with its final model replaced by the model whose graph is trained.

    For a classifier, a regressor giving its logits (one column for a binary
    problem, one per class otherwise); for a GLM, its linear predictor; the
    template itself for the other families. The replacement shares the final
    model's parameter arrays, so the parameters located in its ONNX graph are
    written back into the final model.
    """
    final = final_estimator(est)
    view = family_of(final).trained_view(final)
    if view is None:
        return est
    if isinstance(est, Pipeline):
        return Pipeline(est.steps[:-1] + [(est.steps[-1][0], view)])
    return view


def export_model(est, n_features: int, dtype=np.float32) -> onnx.ModelProto:
    """Convert a fitted template with skl2onnx, as the estimators export it.

    Parameters
    ----------
    est : estimator or Pipeline
        Fitted (or with its parameters set).
    n_features : int
        Number of input features (input ``X``).
    dtype : numpy dtype, default=numpy.float32
        Type of the input ``X`` and of the whole graph: skl2onnx converts with a
        float initial type (float32 weights) or, for float64, a double one
        (double weights, every operator in double).

    Returns
    -------
    onnx.ModelProto
        Opsets and IR version accepted by onnxruntime-training 1.19;
        classifiers have a label output and a probabilities output (no ZipMap).
    """
    from skl2onnx import to_onnx

    from ._passes import MAX_ML_OPSET, MAX_OPSET, pin_versions

    final = final_estimator(est)
    family = family_of(final)
    options = family.export_options(final, dtype)
    link = family.output_link(final)
    if link is not None:  # converted without its output function, appended below
        view = family.trained_view(final)
        est = Pipeline(est.steps[:-1] + [(est.steps[-1][0], view)]) if est is not final else view
    model = to_onnx(
        est,
        np.zeros((1, n_features), dtype=_float_dtype(dtype)),
        target_opset={"": MAX_OPSET, "ai.onnx.ml": MAX_ML_OPSET},
        black_op=set(family.black_op),
        options={id(final): options} if options else None,
    )
    n_outputs = getattr(final, "n_outputs_", 1)
    if type(final).__name__ == "MLPRegressor" and n_outputs > 1:
        _reshape_output(model, n_outputs)
    if link is not None:
        _append_to_output(model, link)
    family.fix_export(final, model)
    return pin_versions(model)


def _append_to_output(model: onnx.ModelProto, op_type: str) -> None:
    """Apply the unary operator ``op_type`` to the first output, which keeps its name."""
    output = model.graph.output[0].name
    raw = output + "_raw"
    for node in model.graph.node:
        for k, name in enumerate(node.output):
            if name == output:
                node.output[k] = raw
    model.graph.node.append(onnx.helper.make_node(op_type, [raw], [output], name=raw + "_link"))


def _float_dtype(dtype) -> np.dtype:
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    return dtype


def _reshape_output(model: onnx.ModelProto, n_outputs: int) -> None:
    """Make the final Reshape of a multi-output MLPRegressor give (n_samples, n_outputs).

    skl2onnx reshapes every MLPRegressor's prediction to ``(-1, 1)``, which
    flattens several outputs into one column.
    """
    output = model.graph.output[0]
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.output[0] == output.name:
            name = output.name + "_shape"
            model.graph.initializer.append(
                numpy_helper.from_array(np.array([-1, n_outputs], dtype=np.int64), name)
            )
            previous, node.input[1] = node.input[1], name
            if all(previous not in n.input for n in model.graph.node):
                # onnxruntime warns about unused initializers on stderr
                unused = [i for i in model.graph.initializer if i.name == previous]
                for init in unused:
                    model.graph.initializer.remove(init)
            dims = output.type.tensor_type.shape.dim
            if len(dims) == 2:
                dims[1].dim_value = n_outputs
            return


def final_estimator(template):
    """Return the last step of a Pipeline, or the template itself."""
    if isinstance(template, Pipeline):
        return template.steps[-1][1]
    return template


def unfitted_head_steps(template) -> list[str]:
    """Names of the steps in front of a Pipeline's final model that are not fitted yet."""
    if not isinstance(template, Pipeline):
        return []
    return [
        name
        for name, step in template.steps[:-1]
        if step not in (None, "passthrough") and not is_fitted(step)
    ]


def is_fitted(est) -> bool:
    """Whether scikit-learn's ``check_is_fitted`` finds ``est`` fitted (False for
    anything it cannot tell, such as an object that is not an estimator)."""
    try:
        check_is_fitted(est)
    except Exception:
        return False
    return True


def check_template(template, task: str, estimator_name: str) -> None:
    """Raise a ValueError when ``template`` cannot be trained for ``task``.

    Parameters
    ----------
    template : estimator or Pipeline
        The model to check.
    task : {"regression", "classification"}
        What the estimator does.
    estimator_name : str
        The estimator's class name, for the messages.
    """
    if isinstance(template, type):
        raise ValueError(
            f"estimator={template.__name__} is a class: pass an instance, such as "
            f"estimator={template.__name__}()."
        )
    final = final_estimator(template)
    name = type(final).__name__
    where = f"the last step of the Pipeline, {name}," if final is not template else name
    family = family_of(final)
    if family is None:
        if hasattr(final, "tree_") or "Tree" in name or "Forest" in name or "Boosting" in name:
            why = "its predictions are piecewise constant splits, with no gradient to follow"
        elif "Neighbors" in name:
            why = "it stores training samples instead of weights, so there is nothing to train"
        else:
            why = "it is not one of the supported models"
        raise ValueError(
            f"{where} cannot be trained by gradient descent: {why}. Supported final models: "
            f"{', '.join(supported_names(task))}."
        )
    if family.task != task:
        other = (
            "OrtGradientClassifier" if family.task == "classification" else ("OrtGradientRegressor")
        )
        raise ValueError(
            f"{where} is a {family.task} model and {estimator_name} does {task}: use "
            f"{other}({name}(...)), or a {task} template such as "
            f"{', '.join(supported_names(task)[:4])}."
        )
    family.check(final)


def _match(init: np.ndarray, value: np.ndarray):
    """Return 'reshape' or 'transpose' if ``init`` holds ``value``, else None."""
    if init.size != value.size or init.size == 0:
        return None
    target = value.astype(init.dtype)
    if np.array_equal(init.ravel(), target.ravel()):
        return "reshape"
    if target.ndim == 2 and np.array_equal(init.ravel(), target.T.ravel()):
        return "transpose"
    return None


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
    key : str or None
        The key of the conversion's artifact (:mod:`onnxgrad_sklearn.artifacts`);
        None where the template's structure has none (it is converted at each fit).
    """

    skeleton: bytes
    params: list[ParamRef]
    initializer_names: list[str]
    layouts: list[str]
    output_name: str
    values: list
    dims: list
    float_type: str
    input_width: int
    key: str | None = None

    def __setattr__(self, name, value):
        if name in ("skeleton", "values", "initializer_names"):
            self.__dict__.pop("_model", None)  # made again from the new values when asked
        object.__setattr__(self, name, value)

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_model", None)
        return state

    def __setstate__(self, state):
        state = dict(state)
        if "skeleton" not in state:  # pickled by a version that kept the ModelProto
            model = state.pop("model")
            model = onnx.load_from_string(model) if isinstance(model, bytes) else model
            state.update(_split_model(model, state["initializer_names"]))
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
        for name, value in _split_model(model, self.initializer_names).items():
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
            _set_values(model, [n for n, _ in given], [v for _, v in given])
        return model

    def session(self, options, providers, provider_options=None, **kwargs):
        """An ``InferenceSession`` of the graph holding :attr:`values`, made without onnx.

        The skeleton's bytes, the values given by
        ``SessionOptions.add_external_initializers`` (``options`` is changed: pass
        options of its own). The session keeps copies of the values (it reads them,
        it does not copy them); ``kwargs`` go to
        :func:`~onnxgrad_sklearn.runtime.make_session`.
        """
        from .runtime import import_onnxruntime, make_session

        if any(v is None for v in self.values):
            raise RuntimeError("the parameters' values are held by a training engine.")
        OrtValue = import_onnxruntime().OrtValue  # the Python class the options take
        # copies: not estimator_'s arrays, which a user may change
        kept = [OrtValue.ortvalue_from_numpy(np.array(v, copy=True)) for v in self.values]
        options.add_external_initializers(list(self.initializer_names), kept)
        session = make_session(
            self.skeleton, options, providers, provider_options, strict=False, **kwargs
        )
        session._onnxgrad_initializers = kept  # alive as long as the session
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


def _split_model(model: onnx.ModelProto, names, read_values: bool = True) -> dict:
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


def prepare_template(template, X, n_outputs, random_state):
    """Return a copy of ``template`` ready to convert: fitted preprocessing, parameters set.

    Parameters
    ----------
    template : estimator or Pipeline
        What the user passed; never modified.
    X : ndarray of shape (n_samples, n_features)
        Training data, used to fit unfitted preprocessing steps; its dtype
        (the training dtype) is that of an unfitted MLP's initial weights.
    n_outputs : int
        Width of the output layer of an unfitted model.
    random_state : RandomState
        Draws the initial weights of an unfitted MLP.

    Returns
    -------
    estimator : estimator or Pipeline
        The copy.
    fine_tuned : bool
        Whether the final model came fitted (training starts from its weights).
    """
    est = copy.deepcopy(template)
    final = final_estimator(est)
    if is_fitted(final):
        n_in = getattr(final, "n_features_in_", None)
        if n_in is not None and isinstance(est, Pipeline):
            expected = est[:-1].transform(X[:1]).shape[1]
            if expected != n_in:
                raise ValueError(
                    f"the fitted {type(final).__name__} expects {n_in} features, the "
                    f"Pipeline in front of it gives {expected}."
                )
        return est, True
    if isinstance(est, Pipeline):
        head = est[:-1]
        Xt = (
            head.transform(X[:1])  # only its width is read
            if all(is_fitted(s) for _, s in head.steps)
            else head.fit_transform(X)
        )
        n_features = Xt.shape[1] if hasattr(Xt, "shape") else np.asarray(Xt).shape[1]  # sparse too
    else:
        n_features = X.shape[1]
    dtype = X.dtype if X.dtype in (np.float32, np.float64) else np.float32
    family_of(final).initialize(final, n_features, n_outputs, random_state, dtype=dtype)
    return est, False


def convert_template(est, n_features: int, dtype=np.float32) -> ConvertedTemplate:
    """Convert a prepared template to ONNX and locate its parameters.

    Parameters
    ----------
    est : estimator or Pipeline
        Fitted or initialised by :func:`prepare_template`.
    n_features : int
        Number of input features.
    dtype : numpy dtype, default=numpy.float32
        The graph's float type (:func:`export_model`): float64 gives a double
        graph holding the parameters in double.

    Returns
    -------
    ConvertedTemplate
    """
    from . import artifacts

    final = final_estimator(est)
    family = family_of(final)
    params = family.params(final)
    values = [ref.get(final) for ref in params]
    # The graph depends on the structure only: converted once per structure, kept as
    # an artifact (for the process and on disk), given this model's values.
    key = artifacts.stable_key("converted", _structure(est, final, params, n_features, dtype))
    cached = artifacts.get(key)
    if cached is not None:
        if "not_located" in cached.meta:  # found before: skl2onnx is not run again
            raise ValueError(cached.meta["not_located"])
        converted = _from_artifact(cached, params, final, key)
        if converted is not None:
            return converted
    # skl2onnx writes initializers element by element: an MLP is converted with
    # small hidden layers (its graph does not depend on their sizes), then the
    # initializers get the real arrays. Full-size markers are the fallback.
    for shapes in (family.marker_shapes(values), [v.shape for v in values]):
        try:
            converted = _convert_with_markers(est, final, params, values, shapes, n_features, dtype)
        except _LayoutError:
            continue
        except _NotLocated as exc:
            artifacts.put(key, artifacts.Artifact({}, {"not_located": str(exc)}))
            raise
        converted.key = key
        artifacts.put(key, _to_artifact(converted))
        return converted
    raise AssertionError("unreachable: full-size markers always have a layout")


#: Attributes of a fitted or initialised model that record its training, not its
#: structure: skl2onnx's converters do not read them (the initial weights' copies, the
#: random state, the loss curve), so that they stay out of the conversion's key.
_HISTORY = frozenset(
    {
        "_best_coefs",
        "_best_intercepts",
        "_random_state",
        "_no_improvement_count",
        "_optimizer",
        "loss_curve_",
        "best_loss_",
        "validation_scores_",
        "best_validation_score_",
        "n_iter_",
        "t_",
    }
)


def _structure(est, final, params, n_features, dtype):
    """What the converted graph depends on: all of ``est`` but the trained values.

    Attributes not listed as history (:data:`_HISTORY`) are part of it, whatever they
    are: an unknown one can only make two structures differ (a cache miss).
    """
    trained = {ref.attr for ref in params}
    state = {k: v for k, v in vars(final).items() if k not in trained and k not in _HISTORY}
    head = est.steps[:-1] if isinstance(est, Pipeline) else []
    shapes = [np.shape(ref.get(final)) for ref in params]
    return (type(final), state, shapes, head, int(n_features), np.dtype(dtype).str)


def _to_artifact(converted: ConvertedTemplate):
    from .artifacts import Artifact

    return Artifact(
        {"model.onnx": converted.skeleton},
        {
            "params": [[r.attr, r.index, r.penalized, r.trainable] for r in converted.params],
            "initializer_names": converted.initializer_names,
            "layouts": converted.layouts,
            "output_name": converted.output_name,
            "dims": [list(d) for d in converted.dims],
            "float_type": converted.float_type,
            "input_width": converted.input_width,
        },
    )


def _from_artifact(artifact, params, final, key) -> ConvertedTemplate | None:
    """The converted template of a cached artifact, holding ``final``'s values (no onnx)."""
    meta = artifact.meta
    if meta.get("params") != [[r.attr, r.index, r.penalized, r.trainable] for r in params]:
        return None
    converted = ConvertedTemplate(
        artifact.blobs["model.onnx"],
        params,
        list(meta["initializer_names"]),
        list(meta["layouts"]),
        meta["output_name"],
        values=[],
        dims=[tuple(d) for d in meta["dims"]],
        float_type=meta["float_type"],
        input_width=int(meta["input_width"]),
        key=key,
    )
    converted.values = converted.values_from(final)
    return converted


class _LayoutError(Exception):
    """The real shape of an initializer cannot be told from the small markers."""


class _NotLocated(ValueError):
    """A parameter is not held by exactly one initializer of the converted graph (a
    binary linear classifier's coefficients are node attributes, for example)."""


def _copy_sharing_arrays(est):
    """A deep copy of ``est`` that shares its numpy arrays instead of copying them.

    The markers replace the parameters in the copy and skl2onnx only reads the
    rest, so nothing is written into a shared array; the copy ends up in
    skl2onnx's reference cycles, which would otherwise keep weight-sized copies
    (an MLP's ``_best_coefs``) until the garbage collector runs.
    """
    memo = {}

    def share(value, depth):
        if isinstance(value, np.ndarray):
            memo[id(value)] = value
        elif depth < 3 and isinstance(value, (list, tuple)):
            for item in value:
                share(item, depth + 1)
        elif depth < 3 and hasattr(value, "__dict__") and not isinstance(value, type):
            # a fitted MLP's _optimizer holds weight-sized velocities or moments
            for item in vars(value).values():
                share(item, depth + 1)

    share(est, 0)
    return copy.deepcopy(est, memo)


def _convert_with_markers(est, final, params, values, shapes, n_features, dtype=np.float32):
    marker_final = _copy_sharing_arrays(final)
    rng = np.random.RandomState(1234)
    markers = []
    for ref, shape in zip(params, shapes):
        marker = rng.uniform(1.0, 2.0, size=shape).astype(np.float32).astype(np.float64)
        if len(shape) == 0:
            marker = marker.reshape(())
        ref.set(marker_final, marker)
        markers.append(np.asarray(marker))
    if isinstance(est, Pipeline):
        marker_est = Pipeline(est.steps[:-1] + [(est.steps[-1][0], marker_final)])
    else:
        marker_est = marker_final
    model = export_model(marker_est, n_features, dtype)

    names, layouts = [], []
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(_float_dtype(dtype))
    floats = [i for i in model.graph.initializer if i.data_type == elem_type]
    for ref, marker in zip(params, markers):
        found = [
            (init.name, _match(numpy_helper.to_array(init), marker))
            for init in floats
            if _match(numpy_helper.to_array(init), marker)
        ]
        if len(found) != 1:
            raise _NotLocated(
                f"could not locate {type(final).__name__}.{ref.label} in the ONNX graph "
                f"skl2onnx produced ({len(found)} candidates); this model cannot be trained."
            )
        names.append(found[0][0])
        layouts.append(found[0][1])
    by_name = {i.name: i for i in model.graph.initializer}
    for name, layout, marker, value in zip(names, layouts, markers, values):
        dims = _real_dims(tuple(by_name[name].dims), layout, marker.shape, value.shape)
        del by_name[name].dims[:]
        by_name[name].dims.extend(dims)  # the values are written next
    converted = ConvertedTemplate(
        params=params,
        initializer_names=names,
        layouts=layouts,
        output_name=model.graph.output[0].name,
        **_split_model(model, names, read_values=False),  # the markers' values
    )
    converted.values = converted.values_from(final)
    return converted


def _set_values(model: onnx.ModelProto, names: Sequence[str], values) -> None:
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


def _real_dims(dims, layout, marker_shape, real_shape):
    """Dimensions of an initializer holding ``real_shape`` where the marker gave ``dims``."""
    marker_shape, real_shape = tuple(marker_shape), tuple(real_shape)
    if marker_shape == real_shape:
        return dims
    if layout == "transpose":
        return real_shape[::-1]
    if dims == marker_shape:
        return real_shape
    if dims == (1,) + marker_shape:
        return (1,) + real_shape
    if dims == marker_shape + (1,):
        return real_shape + (1,)
    raise _LayoutError(f"initializer dims {dims} for a parameter of shape {marker_shape}")
