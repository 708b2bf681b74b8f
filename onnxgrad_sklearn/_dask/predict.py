"""``predict``, ``predict_proba``, ``predict_log_proba``, ``decision_function`` and
``score`` on dask collections (``_base.dask_aware``).

They run on each block with the collection's scheduler, whichever it is. The
estimator is one key of the graph: a distributed worker unpickles it, and so makes
its inference sessions, once. ``score`` adds up per-block sums (accuracy, or R2 by
Chan et al.'s pairwise update).
"""

from __future__ import annotations

import numpy as np

from .blocks import _kind, _known_lengths, _row_blocks, _split_like
from .client import _compute, _get_client


def run_method(est, name, X, *args, **kwargs):
    """``est.<name>(X, ...)`` on dask collections (``_base.dask_aware``).

    Parameters
    ----------
    est : BaseOrtGradient
        A fitted estimator.
    name : str
        ``"predict"``, ``"predict_proba"``, ``"predict_log_proba"``,
        ``"decision_function"`` or ``"score"``.
    X : dask collection or array-like
        The rows (or ``y`` and the weights of ``score`` are the dask collections:
        computed, then the method runs as usual).
    *args, **kwargs
        ``score``'s ``y`` and ``sample_weight``.

    Returns
    -------
    dask.array.Array or float
        The method's output block by block (a dask array, computed by the
        collection's scheduler), or ``score``'s number.
    """
    from dask.base import is_dask_collection
    from sklearn.utils.validation import check_is_fitted

    if not is_dask_collection(X):  # only y or the weights are: computed, then as usual
        args, kwargs = _compute(_get_client(), args, kwargs)
        return getattr(est, name)(X, *args, **kwargs)
    check_is_fitted(est)
    from .._model import check_weights_stored

    check_weights_stored(est, name)
    if name == "score":
        return _score(est, X, *args, **kwargs)
    if args or kwargs:
        raise TypeError(f"{name} takes X only, got {len(args) + len(kwargs)} more arguments.")
    import dask

    dtype, width = _output(est, name)
    # one key for the estimator: a worker unpickles it (its sessions made) once
    shared = dask.delayed(est, pure=False)
    if _kind(X) == "array":
        if X.ndim != 2:
            raise ValueError(f"Expected a 2D dask array, got a {X.ndim}D one.")
        if X.numblocks[1] > 1:
            X = X.rechunk({1: -1})
        if width is None:
            return X.map_blocks(
                _apply, shared, name, drop_axis=1, dtype=dtype, meta=np.empty((0,), dtype)
            )
        return X.map_blocks(
            _apply,
            shared,
            name,
            chunks=(X.chunks[0], (width,)),
            dtype=dtype,
            meta=np.empty((0, width), dtype),
        )
    meta = np.empty((0,) if width is None else (0, width), dtype)
    return X.map_partitions(_apply, shared, name, meta=meta)  # a dask array


def _output(est, name):
    """The dtype of ``est.<name>``'s output and its columns (None: one dimension)."""
    from sklearn.base import is_classifier

    if name in ("predict_proba", "predict_log_proba"):
        return np.dtype(np.float64), len(est.classes_)
    if name == "predict" and is_classifier(est):
        if est._multilabel:
            return np.dtype(np.int64), len(est.classes_)
        return est.classes_.dtype, None
    return np.dtype(np.float64), (None if est.n_outputs_ == 1 else est.n_outputs_)


def _apply(block, est, name):
    return getattr(est, name)(block)


def _score(est, X, y, sample_weight=None):
    """``score`` from per-partition sums: accuracy, or R2 (scikit-learn's definitions)."""
    import dask
    from sklearn.base import is_classifier

    shared = dask.delayed(est, pure=False)
    xs = _row_blocks(X)
    lengths = _known_lengths(X)
    if any(_split_like(v, len(xs), lengths) is None for v in (y, sample_weight)):
        lengths = tuple(dask.compute(*[dask.delayed(len)(x) for x in xs]))
    ys, ws = (_split_like(v, len(xs), lengths, force=True) for v in (y, sample_weight))
    classifier = is_classifier(est)
    parts = [
        dask.delayed(_score_part)(shared, x, yb, wb, classifier) for x, yb, wb in zip(xs, ys, ws)
    ]
    found = [p for p in dask.compute(*parts) if p is not None]
    if classifier:
        return float(sum(p[0] for p in found) / sum(p[1] for p in found))
    weight, mean, m2 = found[0][:3]
    residual = found[0][3]
    for w_b, mean_b, m2_b, res_b in found[1:]:  # Chan et al.'s pairwise update, weighted
        total = weight + w_b
        delta = mean_b - mean
        mean = mean + delta * (w_b / total)
        m2 = m2 + m2_b + delta**2 * (weight * w_b / total)
        weight = total
        residual = residual + res_b
    scores = np.ones_like(m2)
    valid = m2 != 0
    scores[valid] = 1 - residual[valid] / m2[valid]
    scores[~valid & (residual != 0)] = 0.0  # as r2_score(force_finite=True)
    return float(np.mean(scores))


def _score_part(est, X, y, w, classifier):
    from sklearn.utils.validation import _num_samples

    n = _num_samples(X)
    if n == 0:
        return None
    pred = est.predict(X)
    y = np.asarray(y)
    w = np.ones(n) if w is None else np.broadcast_to(np.asarray(w, dtype=np.float64), (n,))
    if classifier:
        if y.ndim == 2 and y.shape[1] == 1:
            y = y.ravel()
        correct = pred == y if pred.ndim == 1 else np.all(pred == y, axis=1)
        return float(np.sum(w * correct)), float(np.sum(w))
    weight = float(np.sum(w))
    if weight == 0:
        return None
    y = y.reshape(n, -1).astype(np.float64)
    pred = np.asarray(pred, dtype=np.float64).reshape(n, -1)
    mean = (w[:, None] * y).sum(axis=0) / weight
    m2 = (w[:, None] * (y - mean) ** 2).sum(axis=0)
    return weight, mean, m2, (w[:, None] * (y - pred) ** 2).sum(axis=0)
