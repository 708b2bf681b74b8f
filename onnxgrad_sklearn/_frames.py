"""DataFrames through a template Pipeline's head: raw columns in, one ONNX input per column.

A template Pipeline whose head selects columns by name or encodes strings (a
``ColumnTransformer`` with ``OneHotEncoder``, ``OrdinalEncoder``, scalers,
``passthrough``) cannot take the matrix ``validate_data`` makes of a DataFrame.
When it receives a pandas DataFrame, the head (fitted on the frame at ``fit``
when it is not fitted yet, then frozen) runs in scikit-learn and the final
model's graph trains on its numeric output, which is fixed because the head does
not train. The export is the whole Pipeline, converted by skl2onnx with one input
per raw column, named after it, of shape ``(n, 1)``: float columns
``tensor(float)`` (``tensor(double)`` after a float64 fit), integer and boolean
columns ``tensor(int64)``, string, object and categorical columns
``tensor(string)``.
"""

from __future__ import annotations

import copy
import sys

import numpy as np
from sklearn.utils.validation import check_array, check_X_y, validate_data

#: The kinds of raw columns, as the ONNX input types they become.
FLOAT, INT64, STRING = "float", "int64", "string"


def is_pandas_frame(X) -> bool:
    """Whether ``X`` is a pandas DataFrame (pandas is not imported to tell)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(X, pd.DataFrame)


def needs_raw_columns(template, X) -> bool:
    """Whether ``X`` goes through the template's head as a DataFrame, not as a matrix.

    True for a pandas DataFrame given to a Pipeline with steps in front of its
    final model when one of them is a ``ColumnTransformer`` (columns selected by
    name, per-column encoders) or a column of the frame is not numeric.
    """
    from sklearn.pipeline import Pipeline

    if not is_pandas_frame(X) or not isinstance(template, Pipeline) or len(template.steps) < 2:
        return False
    head = [step for _, step in template.steps[:-1] if step not in (None, "passthrough")]
    if not head:
        return False
    # a ColumnTransformer's module is imported where there is one (importing it for
    # the check would import scikit-learn's linear models)
    compose = sys.modules.get("sklearn.compose")
    if compose is not None and any(isinstance(s, compose.ColumnTransformer) for s in head):
        return True
    return any(column_kind(dtype) == STRING for dtype in X.dtypes)


def column_kind(dtype) -> str:
    """The kind of a DataFrame column of ``dtype``: FLOAT, INT64 or STRING."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_integer_dtype(dtype):
        return INT64
    if pd.api.types.is_float_dtype(dtype):
        return FLOAT
    if (
        pd.api.types.is_object_dtype(dtype)
        or pd.api.types.is_string_dtype(dtype)
        or isinstance(dtype, pd.CategoricalDtype)
    ):
        return STRING
    return "unsupported"


def raw_columns(X) -> list[tuple[str, str]]:
    """``(name, kind)`` of each column of the DataFrame ``X``, in order."""
    names = list(X.columns)
    if not all(isinstance(name, str) for name in names):
        raise ValueError(
            "A DataFrame going through the template's ColumnTransformer needs string column "
            f"names (they name the ONNX inputs); got {names[:5]!r}: rename the columns, for "
            "example X.columns = X.columns.astype(str)."
        )
    columns = [(name, column_kind(dtype)) for name, dtype in X.dtypes.items()]
    bad = [(name, str(X.dtypes[name])) for name, kind in columns if kind == "unsupported"]
    if bad:
        raise ValueError(
            f"Column {bad[0][0]!r} of the DataFrame has dtype {bad[0][1]}: the ONNX model "
            "takes float, integer, boolean and string (object, categorical) columns; "
            "convert it first (for example to numbers or strings)."
        )
    return columns


def initial_types(columns, dtype) -> list:
    """skl2onnx's ``initial_types`` of the raw ``columns``: one ``(n, 1)`` input each."""
    from skl2onnx.common.data_types import (
        DoubleTensorType,
        FloatTensorType,
        Int64TensorType,
        StringTensorType,
    )

    floats = DoubleTensorType if np.dtype(dtype) == np.float64 else FloatTensorType
    types = {FLOAT: floats, INT64: Int64TensorType, STRING: StringTensorType}
    return [(name, types[kind]([None, 1])) for name, kind in columns]


def column_feed(X, columns, input_names, dtype) -> dict:
    """The inputs of the exported model: each raw column as an ``(n, 1)`` array."""
    feed = {}
    for (name, kind), input_name in zip(columns, input_names):
        values = X[name]
        if kind == FLOAT:
            array = values.to_numpy(dtype=dtype)
        elif kind == INT64:
            array = values.to_numpy(dtype=np.int64)
        else:
            # skl2onnx writes each category as str() does (None as 'None', NaN as
            # 'nan'): pandas >= 3's astype(str) would keep missing values missing
            array = np.array(
                [v if isinstance(v, str) else str(v) for v in values.to_numpy(dtype=object)],
                dtype=object,
            )
        feed[input_name] = array.reshape(-1, 1)
    return feed


def _head(template):
    """The steps in front of the final model, as a Pipeline (a view: the same steps)."""
    return template[:-1]


def validate_fit_data(est, X, y, *, reset, **check_params):
    """``validate_data`` for ``fit``, or for raw columns the head's output and ``y``.

    For a DataFrame the template's head needs as a frame (:func:`needs_raw_columns`,
    decided at the first fit and kept by continued fits), the feature names and
    number of columns are recorded as scikit-learn records them, the head is
    fitted on the frame if it is not fitted yet (a copy: the template is never
    modified) and kept for ``_initialize`` in ``est._fitted_head``, and its
    numeric output is checked and returned in place of ``X``.
    """
    from .templates import unfitted_head_steps

    if reset:
        est.__dict__.pop("_raw_columns", None)
        est.__dict__.pop("_fitted_head", None)
        est.__dict__.pop("_head_onnx", None)
        template = est._template()
        if not needs_raw_columns(template, X):
            return validate_data(est, X, y, reset=True, **check_params)
        columns = raw_columns(X)
        validate_data(est, X, reset=True, skip_check_array=True)
        head = copy.deepcopy(_head(template))
        if unfitted_head_steps(template):
            Xt = head.fit_transform(X, y)
        else:
            Xt = head.transform(X)
        final = template.steps[-1][1]
        n_in = getattr(final, "n_features_in_", None)
        if n_in is not None and n_in != Xt.shape[1]:
            raise ValueError(
                f"the fitted {type(final).__name__} expects {n_in} features, the Pipeline "
                f"in front of it gives {Xt.shape[1]}."
            )
        est._raw_columns = columns
        est._fitted_head = head
    elif "_raw_columns" in est.__dict__:
        check_raw_frame(est, X)
        Xt = _head(est.estimator_).transform(X)
    else:
        return validate_data(est, X, y, reset=False, **check_params)
    return check_X_y(Xt, y, **check_params)


def check_raw_frame(est, X) -> None:
    """Refuse what is not a DataFrame with the columns ``est`` was fitted on."""
    if not is_pandas_frame(X):
        names = [name for name, _ in est._raw_columns]
        raise ValueError(
            f"{type(est).__name__} was fitted on a DataFrame whose columns go through the "
            f"template's ColumnTransformer by name ({names[:8]!r}"
            f"{' ...' if len(names) > 8 else ''}): pass a DataFrame with these columns, "
            f"got {type(X).__name__}."
        )
    validate_data(est, X, reset=False, skip_check_array=True)
    missing = [name for name, _ in est._raw_columns if name not in X.columns]
    if missing:
        raise ValueError(f"X has no column {missing[0]!r}, which the model was fitted on.")


def join_head(est, model, dtype=None):
    """``model``, or after a fit on raw columns the head's graph joined in front of it.

    The head (the fitted steps in front of the final model) is converted by
    skl2onnx with one input per raw column (:func:`initial_types`), its output
    cast to ``dtype`` (the training dtype by default) and fed to the input ``X``
    of ``model``, the final model's graph, whose output names are kept.
    """
    if "_raw_columns" not in est.__dict__:
        return model
    from onnx import compose, helper, load_from_string

    dtype = np.dtype(est._converted.dtype if dtype is None else dtype)
    cached = est.__dict__.get("_head_onnx")
    if cached is not None and cached[0] == dtype.str:
        head = load_from_string(cached[1])
    else:
        head = _convert_head(_head(est.estimator_), est._raw_columns, dtype)
        if dtype == est._converted.dtype:
            est._head_onnx = (dtype.str, head.SerializeToString())
    head = compose.add_prefix(head, "head_", rename_inputs=False)  # the columns' names stay
    final = compose.add_prefix(model, "final_", rename_outputs=False)  # so do the outputs'
    versions = {}
    for opset in list(head.opset_import) + list(final.opset_import):
        versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    for part in (head, final):
        del part.opset_import[:]
        part.opset_import.extend(helper.make_opsetid(d, v) for d, v in versions.items())
        part.ir_version = min(head.ir_version, final.ir_version)
    joined = compose.merge_models(
        head, final, io_map=[(head.graph.output[0].name, final.graph.input[0].name)]
    )
    joined.graph.name = model.graph.name
    return joined


def _convert_head(head, columns, dtype):
    """The head's graph: raw columns in, its output cast to ``dtype`` as ``head_features``."""
    from onnx import helper
    from skl2onnx import to_onnx

    from ._passes import MAX_ML_OPSET, MAX_OPSET, pin_versions

    model = to_onnx(
        head,
        initial_types=initial_types(columns, dtype),
        target_opset={"": MAX_OPSET, "ai.onnx.ml": MAX_ML_OPSET},
    )
    graph = model.graph
    out = graph.output[0]
    cast = helper.make_node(
        "Cast",
        [out.name],
        ["head_features"],
        to=helper.np_dtype_to_tensor_dtype(dtype),
        name="head_features_cast",
    )
    graph.node.append(cast)
    width = [
        d.dim_value if d.HasField("dim_value") else None for d in out.type.tensor_type.shape.dim
    ]
    graph.output.remove(out)
    graph.output.append(
        helper.make_tensor_value_info(
            "head_features", helper.np_dtype_to_tensor_dtype(dtype), [None] + width[1:]
        )
    )
    return pin_versions(model)


def with_head(head, template, final):
    """The fitted Pipeline of ``head``'s steps and the trained ``final`` model."""
    from sklearn.pipeline import Pipeline

    return Pipeline(list(head.steps) + [(template.steps[-1][0], final)])


def run_raw(est, X, session, trained_graph: bool) -> dict:
    """Outputs by name of ``session``: the exported model's on the raw columns of ``X``,
    or the trained graph's on the head's output (``trained_graph``), run in
    scikit-learn."""
    from ._data import as_rows, run_by_chunks

    check_raw_frame(est, X)
    dtype = est._converted.dtype
    if not trained_graph:
        inputs = [i.name for i in session.get_inputs()]
        names = [o.name for o in session.get_outputs()]
        feed = column_feed(X, est._raw_columns, inputs, dtype)
        return dict(zip(names, session.run(None, feed)))
    Xt = check_array(
        _head(est.estimator_).transform(X), accept_sparse=["csr", "csc"], dtype=[dtype]
    )
    return run_by_chunks(session, as_rows(Xt, dtype))  # a sparse output densified by chunks


def validate_validation_data(est, X_val, dtype):
    """``X_val`` given to ``fit``, checked as ``X`` was and in the training ``dtype``.

    After ``X`` went through the template's head as a DataFrame (raw columns),
    the same head transforms ``X_val``: the one fitted on ``X`` in this fit, or
    that of ``estimator_`` in a continued fit. Otherwise ``X_val`` is a matrix of
    the features ``X`` had (names included), which the trained graph takes as it
    takes ``X``: the head of a template Pipeline is part of that graph.
    """
    from ._data import as_rows

    if "_raw_columns" in est.__dict__:
        check_raw_frame(est, X_val)
        head = est.__dict__.get("_fitted_head")
        head = _head(est.estimator_) if head is None else head
        X_val = check_array(head.transform(X_val), accept_sparse=["csr", "csc"], dtype=dtype)
    else:
        X_val = validate_data(est, X_val, reset=False, accept_sparse=["csr", "csc"], dtype=dtype)
    return as_rows(X_val, dtype)
