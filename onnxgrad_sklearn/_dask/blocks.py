"""Dask collections as rows: their kind, their blocks of rows, y and the sample weights
split as the blocks of X, and those blocks computed on the cluster beside X's.

Used on the client, by the fit (which collections train on the workers), the
placement of the training rows (:func:`place_blocks`) and ``score`` (blocks of y and
the weights paired with X's, whatever the scheduler).
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np


def _lazy(value) -> bool:
    from dask.base import is_dask_collection

    return is_dask_collection(value)


def _kind(v) -> str:
    """``"array"``, ``"frame"`` or ``"series"`` for a dask collection, else ``"other"``."""
    import dask.array as da

    if isinstance(v, da.Array):
        return "array"
    dataframe = sys.modules.get("dask.dataframe")  # imported where there is one
    if dataframe is not None and isinstance(v, dataframe.DataFrame):
        return "frame"
    if dataframe is not None and isinstance(v, dataframe.Series):
        return "series"
    return "other"


def _scipy_sparse(value) -> bool:
    import scipy.sparse as sp

    return sp.issparse(value)


def _numeric_frame(X) -> bool:
    import pandas as pd

    return all(
        pd.api.types.is_numeric_dtype(t) and not isinstance(t, pd.CategoricalDtype)
        for t in X.dtypes
    )


def _width(y):
    """Columns of a 2-D ``y`` (None for 1-D or no y)."""
    if y is None:
        return None
    kind = _kind(y) if _lazy(y) else "other"
    if kind == "frame":
        return len(y.columns)
    if kind == "series":
        return None
    shape = y.shape if kind == "array" else np.shape(y)
    return shape[1] if len(shape) == 2 else None


def _spread(holders, sizes):
    """For each item, one of its ``holders``: the one with the least ``sizes`` given so
    far (items held by one worker first), so that items held by several workers (a
    block computed, or replicated, on more than one) are spread over them."""
    load = Counter()
    chosen = [None] * len(holders)
    for i in sorted(range(len(holders)), key=lambda i: len(holders[i])):
        best = min(holders[i], key=lambda a: (load[a], a))
        chosen[i] = best
        load[best] += int(sizes[i])
    return chosen


# blocks: splitting y and the weights as X --------------------------------------
def _row_blocks(v):
    """The blocks of rows of a dask collection, as Delayed objects, in order (those of
    a 2-D array in one block of columns)."""
    if _kind(v) == "array":
        if v.ndim == 2 and v.numblocks[1] > 1:
            v = v.rechunk({1: -1})
        return list(v.to_delayed().reshape(-1))
    return list(v.to_delayed())


def _known_lengths(v):
    """The rows of each block of a dask array, when dask knows them (None otherwise)."""
    if _kind(v) == "array" and not any(np.isnan(c) for c in v.chunks[0]):
        return tuple(int(c) for c in v.chunks[0])
    return None


def _split_like(v, n_blocks, lengths, force=False):
    """``v`` in blocks of the rows of X's ``n_blocks`` blocks: Delayed objects for a dask
    collection, arrays for data in memory, ``v`` itself for None or a number. None when
    the lengths of X's blocks are needed and not given (unless ``force``)."""
    if v is None or (not _lazy(v) and np.ndim(v) == 0):
        return [v] * n_blocks
    if _lazy(v):
        known = _known_lengths(v)
        if _n_blocks(v) == n_blocks and known == lengths:
            # the same blocks, or both of unknown lengths (one DataFrame's columns):
            # paired block by block (their lengths checked there)
            return _row_blocks(v)
        if lengths is None and not force:
            return None
        array = v if _kind(v) == "array" else v.to_dask_array(lengths=True)
        if _known_lengths(array) is None:
            array = array.compute_chunk_sizes()
        _check_rows(array.shape[0], sum(lengths))
        return _row_blocks(array.rechunk({0: tuple(lengths)}))
    if lengths is None and not force:
        return None
    array = v.to_numpy() if hasattr(v, "to_numpy") else np.asarray(v)
    _check_rows(len(array), sum(lengths))
    bounds = np.cumsum([0, *lengths])
    return [array[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _n_blocks(v) -> int:
    return v.numblocks[0] if _kind(v) == "array" else v.npartitions


def _check_rows(found, expected):
    if found != expected:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{expected}, {found}]"
        )


# on the cluster ----------------------------------------------------------------
def place_blocks(client, X, y, sample_weight):
    """The blocks of X computed on the cluster, and those of y and the weights paired
    with them.

    Parameters
    ----------
    client : distributed.Client
        The fit's client.
    X : dask array or DataFrame
        The rows: its blocks are computed where dask puts them (where they are when
        X is persisted).
    y, sample_weight : dask collection, array-like, number or None
        Split as the blocks of X: a dask collection's blocks computed in the same
        graph as X's (what they share, a table read once, is computed once); blocks
        in memory scattered to the worker of their block of X.

    Returns
    -------
    xs, ys, ws : list
        Futures of the blocks of X; futures (or values) of the blocks of y and of
        the weights.
    addresses : list of str
        The worker of each block of X.
    """
    from distributed import wait

    xs = _row_blocks(X)
    lengths = _known_lengths(X)
    items = [_split_like(v, len(xs), lengths) for v in (y, sample_weight)]
    # one graph: what X and y share (a table read once) is computed once
    lazy = [b for b in xs] + [b for blocks in items if blocks for b in blocks if _lazy(b)]
    futures = dict(zip(map(id, lazy), client.compute(lazy)))
    xs = [futures[id(b)] for b in xs]
    wait(xs)
    for f in xs:
        if f.status == "error":
            f.result()  # raises what computing X raised
    holders = client.who_has(xs)
    addresses = _spread([sorted(holders[f.key]) for f in xs], [1] * len(xs))
    if any(blocks is None for blocks in items):  # in memory, or not aligned with X
        lengths = lengths or tuple(
            client.gather(
                [client.submit(len, f, workers=[a], pure=False) for f, a in zip(xs, addresses)]
            )
        )
    out = []
    for v, blocks in zip((y, sample_weight), items):
        if blocks is None:
            blocks = _split_like(v, len(xs), lengths, force=True)
        if any(_lazy(b) for b in blocks):
            new = [b for b in blocks if _lazy(b) and id(b) not in futures]
            futures.update(zip(map(id, new), client.compute(new)))
            blocks = [futures[id(b)] if _lazy(b) else b for b in blocks]
        elif any(isinstance(b, np.ndarray) for b in blocks):  # in memory: to X's worker
            blocks = [
                client.scatter(b, workers=[a], hash=False) if isinstance(b, np.ndarray) else b
                for b, a in zip(blocks, addresses)
            ]
        out.append(blocks)
    return xs, out[0], out[1], addresses
