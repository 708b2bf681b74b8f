"""Where a fit's rows are, behind one interface.

A fit (:class:`~onnxgrad_sklearn._fit.Fit`) reaches its training rows through one
object, whatever holds them, with these members:

- ``shape``, ``dtype``, and ``y``: the targets (an array in memory, or a view that
  gives their spread and labels, ``std`` and ``argmax``, without gathering them);
- ``start_epochs(fit, loss, engine)``: set up the mini-batch steps of ``fit``;
- ``batches(order)``: the batches of an epoch, in ``order`` (the epoch's
  permutation, or None for consecutive slices), an object whose ``train(engine,
  batch, learning_rate)`` makes a step on the rows ``batch`` of that order and
  returns their loss and number, and whose ``undo`` and ``is_finite`` serve the
  divergence checks;
- ``split(fit, fraction, labels)``: early stopping's held-out split, as
  ``train_test_split`` draws it in one process: ``(training rows, validation,
  held-out row numbers)``;
- ``objective(fit, loss, engine, penalized, alpha, l1_ratio, l1)``: the full-batch
  objective for L-BFGS (:class:`FullBatchObjective`: loss and gradient sums over
  chunks of rows);

and a validation set is ``(rows, y_val, sample_weight_val)`` whose rows have
``predict(engine)``. This module has the implementation for rows in memory
(:class:`MemoryRows`: dense, or sparse and densified a batch or a chunk at a time);
partitions on a dask cluster have theirs (``_dask.DaskRows``). A new place for the
rows is one more implementation; the fit does not know which it has.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import scipy.sparse as sp


class MemoryRows:
    """Training rows in memory: X (dense and C-contiguous, or CSR), the targets as the
    loss takes them (``y``, 2-D) and the sample weights, in the training dtype."""

    def __init__(self, X, y, sample_weight):
        self.X, self.y, self.sample_weight = X, y, sample_weight
        self.shape = X.shape
        self.dtype = X.dtype
        self.batch_size = "auto"  # the fit's parameter (start_epochs)
        self._unit_weights = None  # whether every weight is 1 (worked out once)

    @property
    def unit_weights(self) -> bool:
        """Whether every sample weight is 1 (none was given): the batches then need not
        gather them, nor check that theirs sum to more than 0."""
        if self._unit_weights is None:
            self._unit_weights = bool(np.all(self.sample_weight == 1))
        return self._unit_weights

    @property
    def arrays(self):
        """``(X, y, sample_weight)``."""
        return self.X, self.y, self.sample_weight

    def start_epochs(self, fit, loss, engine):
        """Record the ``batch_size`` parameter of ``fit`` (nothing else to set up here)."""
        self.batch_size = fit.batch_size

    def batches(self, order):
        """The batches of an epoch in ``order`` (:class:`MemoryBatches`)."""
        size = batch_rows(self.batch_size, self.shape[0])
        return MemoryBatches(self.arrays, order, size, unit_weights=self.unit_weights)

    def split(self, fit, fraction, labels):
        """Early stopping's split (scikit-learn's ``train_test_split`` with the fit's
        random state, ``fit._random_state``): the training rows, the validation set and
        the held-out rows."""
        from sklearn.model_selection import train_test_split

        indices = np.arange(self.shape[0])
        # the indices do not change the split: ShuffleSplit draws the same permutation
        X, X_val, y, y_val, sw, sw_val, _, held = train_test_split(
            *self.arrays,
            indices,
            random_state=fit._random_state,
            test_size=fraction,
            stratify=labels,
        )
        if X_val.shape[0] < 2:
            raise ValueError(
                "The validation set is too small. Increase 'validation_fraction' "
                "or the size of your dataset."
            )
        training = MemoryRows(as_rows(X, X.dtype), y, sw)
        training.batch_size = self.batch_size
        return training, (MemoryValidation(X_val), y_val, sw_val), held

    def objective(self, fit, loss, engine, penalized, alpha, l1_ratio, l1=0.0):
        """The full-batch objective of these rows (:class:`FullBatchObjective`)."""
        return FullBatchObjective(engine, *self.arrays, penalized, alpha, l1_ratio, l1=l1)


class MemoryValidation:
    """Validation rows in memory: the model's output on them, by chunks if sparse."""

    def __init__(self, X):
        self.X = X
        self.shape = X.shape

    def predict(self, engine):
        return by_chunks(engine.predict, self.X)


CHUNK_VALUES = 1 << 22


def as_rows(X, dtype):
    """X in ``dtype``, ready to take rows from: C-contiguous, or CSR if it is sparse
    (integers, an ONNX template's indices, keep their type)."""
    if sp.issparse(X):
        return X.tocsr().astype(dtype, copy=False)
    X = np.asarray(X)
    return np.ascontiguousarray(X, dtype=None if X.dtype.kind in "iu" else dtype)


def take_rows(X, index, out=None):
    """Rows ``index`` (a slice or row numbers) of X, dense and C-contiguous.

    A sparse X has only these rows densified, into ``out`` when given (of the
    right shape and dtype); a dense X gives a view for a slice.
    """
    if sp.issparse(X):
        part = X[index]
        return part.toarray() if out is None else part.toarray(out=out)
    if out is None:
        return X[index]
    return np.take(X, index, axis=0, out=out)


class MemoryBatches:
    """Batches of rows in memory: X, the targets and the sample weights.

    ``order`` is the epoch's permutation of the rows (None: consecutive slices, zero
    copy). Shuffled batches are gathered into buffers of one batch, reused: the data
    is never copied whole. A sparse X always goes through them, each batch densified
    on its own. With ``unit_weights`` (every sample weight 1), the weights' buffer holds
    ones once, instead of a gather and a sum per batch.
    """

    def __init__(self, arrays, order, batch_size, unit_weights=False):
        self.arrays = arrays
        if order is None and sp.issparse(arrays[0]):
            order = np.arange(arrays[0].shape[0])
        self.order = order
        self.unit_weights = unit_weights
        self.buffers = None
        self._views: dict = {}  # rows -> the buffers' views of that many rows
        if order is not None:
            self.buffers = [np.empty((batch_size,) + a.shape[1:], dtype=a.dtype) for a in arrays]
            if unit_weights:
                self.buffers[2].fill(1)

    def _feed(self, batch):
        if self.order is None:
            return [a[batch] for a in self.arrays]
        rows = self.order[batch]
        # the same view objects from batch to batch: the engine binds them once
        views = self._views.get(len(rows))
        if views is None:
            views = self._views[len(rows)] = [b[: len(rows)] for b in self.buffers]
        if self.unit_weights:  # ones already
            return [*(take_rows(a, rows, out=v) for a, v in zip(self.arrays[:2], views)), views[2]]
        return [take_rows(a, rows, out=v) for a, v in zip(self.arrays, views)]

    def train(self, engine, batch, learning_rate):
        """One step on the rows ``batch`` (a slice of the epoch's order): its loss and
        rows, or ``(None, 0)`` when their weights sum to zero (no step)."""
        feed = self._feed(batch)
        if not self.unit_weights and not feed[2].sum():
            return None, 0
        return engine.train_batch(*feed, learning_rate), batch.stop - batch.start

    def undo(self, engine):
        """Go back to the weights before the last update."""
        engine.undo_last_step()

    def is_finite(self, engine, rows):
        """Whether the weights, and the loss on the rows ``rows`` (a slice of the rows
        as given) with weights of one, are finite."""
        X, y2d, sample_weight = self.arrays
        ones = np.ones(rows.stop - rows.start, dtype=sample_weight.dtype)  # never 0 / 0
        return engine.is_finite(take_rows(X, rows), y2d[rows], ones)


def by_chunks(function, X):
    """``function(X)``, or for a sparse X the rows of ``function`` on its dense chunks of
    about :data:`CHUNK_VALUES` values (an array, or a list of arrays: a session's outputs)."""
    if not sp.issparse(X):
        return function(X)
    rows = max(1, CHUNK_VALUES // max(X.shape[1], 1))
    parts = [function(take_rows(X, chunk)) for chunk in slices(X.shape[0], rows)]
    if isinstance(parts[0], (list, tuple)):
        return [np.concatenate([p[k] for p in parts], axis=0) for k in range(len(parts[0]))]
    return np.concatenate(parts, axis=0)


def run_by_chunks(session, X) -> dict:
    """The outputs by name of an inference session fed ``X`` as its first input (a
    sparse X densified chunk by chunk)."""
    feed, names = _io_names(session)
    return dict(zip(names, by_chunks(lambda part: session.run(None, {feed: part}), X)))


def _io_names(session):
    """``(first input, output names)`` of an inference session, read once per session."""
    names = getattr(session, "_onnxgrad_io", None)
    if names is None:
        names = (session.get_inputs()[0].name, [o.name for o in session.get_outputs()])
        session._onnxgrad_io = names
    return names


def dask_input(*values) -> bool:
    """Whether one of ``values`` is a dask collection (dask is not imported to tell)."""
    if "dask" not in sys.modules:
        return False
    from dask.base import is_dask_collection

    return any(is_dask_collection(v) for v in values)


def is_rows(X) -> bool:
    """Whether ``X`` is training rows a data source has placed (partitions on a dask
    cluster, ``_dask.DaskRows``), rather than an array to check."""
    return getattr(type(X), "_onnxgrad_rows", False)


def batch_rows(batch_size, n_samples) -> int:
    """The rows of a batch: ``batch_size`` clipped to ``[1, n_samples]``, ``"auto"``
    ``min(200, n_samples)`` (MLPRegressor's rule)."""
    if batch_size == "auto":
        return min(200, n_samples)
    return int(np.clip(batch_size, 1, n_samples))


def slices(n, size):
    """``list(sklearn.utils.gen_batches(n, size))`` without its parameter validation
    (0.1 ms a call: once per epoch, a tenth of a small model's epoch)."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def shuffled(index, random_state):
    """``sklearn.utils.shuffle(index, random_state=random_state)``, the same draws and
    result, without its parameter validation (0.35 ms a call, once per epoch)."""
    order = np.arange(len(index), dtype=index.dtype)  # shuffle draws the same for any dtype
    random_state.shuffle(order)
    return index[order]


class FullBatchObjective:
    """Loss and gradient of the whole training set, for scipy, from the engine.

    The engine's loss on rows ``c`` is ``(sum_c w_i l_i + P) / sum_c w_i``, the
    penalty ``P`` included once per call. Over several chunks the penalty is
    taken out of all but one: the result is the loss of the whole set. A
    sparse X is densified one chunk at a time (at once if it is one chunk).

    An L1 penalty ``l1 * ||w||_1`` (not the engine's: its ``alpha`` and
    ``l1_ratio`` are the smooth part) is added here, over bound-constrained
    variables: each penalised weight is ``u - v`` with ``u, v >= 0`` and the
    penalty ``l1 * (u + v)`` is linear, so that L-BFGS-B meets no kink at 0
    (the variables then are ``x = [w with u in place of the penalised
    entries, v]``, with :attr:`bounds`).
    """

    # Rows per call: about 4 million input values (16 MB of float32).
    chunk_values = CHUNK_VALUES

    def __init__(self, engine, X, y2d, sample_weight, penalized, alpha, l1_ratio, l1=0.0):
        self.engine, self.X, self.y, self.sw = engine, X, y2d, sample_weight
        self.shapes = engine.shapes
        self.sizes = [int(np.prod(s)) for s in self.shapes]
        ends = np.cumsum(self.sizes).tolist()
        self._spans = list(zip([0, *ends[:-1]], ends))  # of each weight in the flat vector
        self.penalized, self.alpha, self.l1_ratio = penalized, alpha, l1_ratio
        self.l1 = float(l1)
        n = sum(self.sizes)
        mask = np.concatenate(
            [np.full(size, bool(p)) for size, p in zip(self.sizes, penalized)] or [[]]
        ).astype(bool)
        self.split = np.flatnonzero(mask) if self.l1 > 0 else np.zeros(0, dtype=int)
        self.bounds = None
        if len(self.split):
            lower = np.full(n + len(self.split), -np.inf)
            lower[self.split] = 0.0
            lower[n:] = 0.0
            self.bounds = _scipy_bounds(lower)
        self._set_rows(X, y2d, sample_weight)

    def _set_rows(self, X, y2d, sample_weight):
        """The rows the sums run over, in chunks of about :attr:`chunk_values` values."""
        rows = max(1, self.chunk_values // max(X.shape[1], 1))
        self.chunks = slices(X.shape[0], rows)
        if len(self.chunks) == 1:
            self.X = take_rows(X, slice(None))
        self.total_weight = float(np.sum(sample_weight, dtype=np.float64))

    def pack(self, arrays):
        w = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])
        if not len(self.split):
            return w
        negative = np.maximum(-w[self.split], 0.0)
        w[self.split] = np.maximum(w[self.split], 0.0)
        return np.concatenate([w, negative])

    def _weights(self, x):
        """The weights, end to end, of the variables ``x``."""
        n = sum(self.sizes)
        w = np.array(x[:n], dtype=np.float64)
        if len(self.split):
            w[self.split] -= x[n:]
        return w

    def unpack(self, x):
        w = self._weights(np.asarray(x, dtype=np.float64)).astype(self.engine.dtype)
        return [w[a:b].reshape(s) for (a, b), s in zip(self._spans, self.shapes)]

    def exact(self, x, value) -> float:
        """The objective at the weights of ``x`` from its value at ``x`` (``u + v >= |w|``)."""
        if not len(self.split) or not np.isfinite(value):
            return float(value)
        n = sum(self.sizes)
        extra = np.sum(x[self.split] + x[n:]) - np.sum(np.abs(self._weights(x)[self.split]))
        return float(value - self.l1 * extra / self.total_weight)

    def _penalty(self, weights):
        return penalty_terms(weights, self.penalized, self.alpha, self.l1_ratio)

    def __call__(self, x):
        self._x = np.asarray(x, dtype=np.float64)
        return self._evaluate(self.unpack(x))

    def _evaluate(self, weights):
        """Loss and gradient at ``weights`` (the rows in memory, chunk by chunk)."""
        self.engine.set_weights(weights)
        if len(self.chunks) == 1:
            loss, grads = self.engine.loss_and_gradients(self.X, self.y, self.sw)
            return self._result(loss, grads)
        return self._combine(weights, self._chunk_sums())

    def _chunk_sums(self):
        """``(loss * weight, [gradient * weight])`` of each chunk of rows with a non-zero
        weight, one at a time: the engine's loss on rows ``c`` is their weighted mean."""
        for rows in self.chunks:
            sw = self.sw[rows]
            weight = float(np.sum(sw, dtype=np.float64))
            if weight == 0:
                continue
            loss, grads = self.engine.loss_and_gradients(take_rows(self.X, rows), self.y[rows], sw)
            yield loss * weight, [g * weight for g in grads]

    def _combine(self, weights, parts):
        """The objective from the sums of the chunks (:meth:`_chunk_sums`), added in
        their order in float64: each holds the penalty once, the result holds it once."""
        total, summed, extra = 0.0, [np.zeros(s) for s in self.shapes], -1
        for loss, grads in parts:
            total += loss
            for acc, g in zip(summed, grads):
                acc += g
            extra += 1
        penalty, penalty_grads = self._penalty(weights)
        total -= extra * penalty
        for acc, g in zip(summed, penalty_grads):
            acc -= extra * g
        return self._result(total / self.total_weight, [g / self.total_weight for g in summed])

    def _result(self, loss, grads):
        n = sum(self.sizes)
        if not math.isfinite(loss):
            return np.inf, np.zeros(n + len(self.split))
        g = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in grads])
        if not len(self.split):
            return float(loss), g
        c = self.l1 / self.total_weight
        loss = float(loss) + c * float(np.sum(self._x[self.split]) + np.sum(self._x[n:]))
        negative = c - g[self.split]
        g[self.split] += c
        return loss, np.concatenate([g, negative])


def penalty_terms(weights, penalized, alpha, l1_ratio):
    """The training graph's penalty ``P`` (:func:`~onnxgrad_sklearn.engine.build_training_graph`)
    and its gradient for each weight, in float64."""
    value, grads = 0.0, []
    for w, p in zip(weights, penalized):
        w = w.astype(np.float64)
        if not p or alpha == 0:
            grads.append(np.zeros_like(w))
            continue
        value += alpha * ((1 - l1_ratio) / 2 * np.sum(w * w) + l1_ratio * np.sum(np.abs(w)))
        grads.append(alpha * ((1 - l1_ratio) * w + l1_ratio * np.sign(w)))
    return value, grads


def smooth_penalty(penalty):
    """``(alpha, l1_ratio)`` without the L1 part: ``(alpha * (1 - l1_ratio), 0)``."""
    alpha, l1_ratio = penalty
    return (alpha * (1 - l1_ratio), 0.0) if l1_ratio else (alpha, l1_ratio)


def _scipy_bounds(lower):
    """scipy's ``Bounds`` with ``lower`` and no upper bound."""
    import scipy.optimize

    return scipy.optimize.Bounds(lower, np.full(len(lower), np.inf))
