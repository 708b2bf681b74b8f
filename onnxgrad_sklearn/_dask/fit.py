"""``fit`` on dask collections (``_base._fit`` sends them here): on the workers of a
``distributed`` cluster, or computed into memory and fitted in this process, which
an INFO log says (no client, or what this version trains in one process).
"""

from __future__ import annotations

import logging

import numpy as np

from .blocks import _kind, _lazy, _numeric_frame, _scipy_sparse
from .client import _check_workers, _client_context, _compute, _get_client
from .placement import DaskRows

logger = logging.getLogger("onnxgrad_sklearn")


def fit_dask(est, X, y, sample_weight, incremental, classes, validation):
    """``est._fit`` on dask collections: on the workers, or computed into memory here.

    Parameters
    ----------
    est : BaseOrtGradient
        The estimator being fitted.
    X : dask collection or array-like
        The rows (``y``, ``sample_weight`` or the validation set may be the dask
        collections).
    y, sample_weight : dask collection, array-like or None
        The targets and the sample weights.
    incremental : bool
        Whether this is ``partial_fit``.
    classes : array-like or None
        ``partial_fit``'s classes.
    validation : tuple or None
        ``(X_val, y_val, sample_weight_val)``.

    Returns
    -------
    BaseOrtGradient
        What ``est._fit`` returns: the fitted estimator.
    """
    client = _get_client()
    reason = _why_local(est, client, X, y, incremental)
    if reason is not None:
        logger.info(
            "%s.fit received dask collections and %s: they are computed into memory and "
            "the fit runs in this process.",
            type(est).__name__,
            reason,
        )
        validation = (None, None, None) if validation is None else tuple(validation)
        with _client_context(client) as scheduler:
            X, y, sample_weight, *validation = _compute(scheduler, X, y, sample_weight, *validation)
        return est._fit(X, y, sample_weight, incremental, classes, tuple(validation))
    if validation is not None and any(v is not None for v in validation):
        if _optimizer(est).full_batch:  # it takes no validation set: refused before any work
            from .._setup import validate_validation_data

            validate_validation_data(est, validation, None, None, _optimizer(est))
        X_val = validation[0]
        # a dask X_val is kept on the workers and scored there (DaskRows.validation_set);
        # one in memory is scored here, its targets and weights computed into memory
        if X_val is not None and not _lazy(X_val) and any(_lazy(v) for v in validation):
            logger.info(
                "%s.fit: X_val is in memory: y_val and sample_weight_val are computed into "
                "memory, and the validation set is scored here at each epoch.",
                type(est).__name__,
            )
            validation = _compute(client, *validation)
    with _client_context(client) as client:
        _check_workers(client)
        rows = DaskRows(client, X)
        try:
            return est._fit(rows, y, sample_weight, incremental, classes, validation)
        finally:
            rows.close()


def _optimizer(est, incremental=False):
    from ..templates import check_template, final_estimator

    template = est._template()
    check_template(template, est._task, type(est).__name__)
    return est._solver(final_estimator(template), incremental)


def _why_local(est, client, X, y, incremental):
    """Why these collections are trained in this process (None: on the workers)."""
    from dask.base import is_dask_collection

    if client is None:
        return (
            "no distributed client is running (create one, for example with "
            "distributed.Client(), to train on its workers)"
        )
    if not is_dask_collection(X):
        return "X is in memory"
    optimizer = _optimizer(est, incremental)  # partial_fit refuses L-BFGS here
    if not optimizer.full_batch and not getattr(est.loss, "rowwise", True):
        return f"the loss {type(est.loss).__name__} mixes the rows of a batch"
    from .._frames import needs_raw_columns
    from .._inputs import template_input

    template = est._template()
    refusal = template_input(template).cluster_refusal()
    if refusal is not None:
        return refusal
    kind = _kind(X)
    if kind == "frame" and not _numeric_frame(X) and not needs_raw_columns(template, X._meta):
        return "X has non-numeric columns"
    if kind == "series" or (kind == "array" and X.ndim != 2):
        return "X is not 2-D"
    if kind == "array" and not isinstance(X._meta, np.ndarray) and not _scipy_sparse(X._meta):
        return f"the blocks of X are {type(X._meta).__name__}, not NumPy or SciPy arrays"
    return None
