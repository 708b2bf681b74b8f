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

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.pipeline import Pipeline
from sklearn.utils.validation import check_is_fitted

from ._converted import GIVEN_AT_RUN_TIME, ConvertedTemplate, split_model  # noqa: F401 (re-exported)
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
    exported = family.export(final, n_features, dtype)
    if exported is not None:  # a template that is a graph already (an ONNX model)
        return exported
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
    anything it cannot tell, such as an object that is not an estimator); an object
    that says it (an :class:`~onnxgrad_sklearn.OnnxTemplate`) as it says."""
    says = getattr(est, "__sklearn_is_fitted__", None)
    if says is not None and not hasattr(est, "fit"):
        return bool(says())
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
    if not family.serves(task):
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
    converted = family.convert(final, n_features, dtype)
    if converted is not None:  # a template that is a graph already (an ONNX model)
        return converted
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
    (an MLP's ``_best_coefs``) until the garbage collector runs. Its random states
    (an MLP's ``_random_state``) are shared too: nothing here draws from them, and a
    copy of one costs 100-250 us (a callback's ``fitted_estimator`` copies
    ``estimator_`` at every epoch).
    """
    memo = {}

    def share(value, depth):
        if isinstance(value, (np.ndarray, np.random.RandomState)):
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


def copy_for_weights(est):
    """A copy of ``est`` whose final model can take other weights, sharing the rest.

    What :func:`~onnxgrad_sklearn._model.store_weights` writes is the final model's
    attributes and items of its lists (an MLP's ``coefs_[i]``): the copy has a final
    model (and list attributes) of its own, a Pipeline's other steps and every array
    shared. Made at each epoch for a callback's ``fitted_estimator``: a few
    microseconds where :func:`_copy_sharing_arrays` (a deep copy) takes tens.
    """
    if isinstance(est, Pipeline):
        new = _shallow_copy(est)
        name, final = est.steps[-1]
        new.steps = [*est.steps[:-1], (name, copy_for_weights(final))]
        return new
    new = _shallow_copy(est)
    for key, value in vars(new).items():
        if isinstance(value, list):
            new.__dict__[key] = list(value)
    return new


def _shallow_copy(est):
    """``copy.copy(est)``: for a class that copies as scikit-learn's estimators do
    (``BaseEstimator``'s ``__getstate__`` and ``__setstate__``, nothing of its own), its
    ``__dict__`` copied at once (under 1 us where ``copy.copy`` takes 3.5-4.5 us)."""
    cls = type(est)
    plain = _PLAIN_COPY.get(cls)
    if plain is None:
        plain = _PLAIN_COPY[cls] = (
            getattr(cls, "__copy__", None) is None
            and cls.__new__ is object.__new__
            and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__
            and cls.__getstate__ is BaseEstimator.__getstate__
            and cls.__setstate__ is BaseEstimator.__setstate__
            and not getattr(cls, "__slots__", None)  # as BaseEstimator.__getstate__ checks
        )
    if not plain:
        return copy.copy(est)
    new = object.__new__(cls)
    new.__dict__.update(est.__dict__)
    return new


#: class -> whether :func:`_shallow_copy` copies its ``__dict__`` at once.
_PLAIN_COPY: dict = {}


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
        **split_model(model, names, read_values=False),  # the markers' values
    )
    converted.values = converted.values_from(final)
    return converted


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
