"""The client's side of the epochs of a fit on a dask cluster: how each step's batch,
each local-SGD round and each L-BFGS evaluation is asked of the workers and what the
client makes of their answers.

- :class:`_DaskBatches`: synchronous data parallel (``sync_every=1``), one round a
  step, the batch the fit in memory draws;
- :class:`_LocalBatches`: local SGD (``sync_every > 1``), each worker training on its
  own rows, ``sync_every`` steps a round, the weights then averaged;
- :class:`_TrainingRows` and :class:`_HeldOut`: early stopping's split (the rows that
  train, the validation rows predicted where they are);
- :class:`DaskFullBatchObjective`: the L-BFGS objective whose chunks' sums are made
  on the workers, one round per evaluation.

Each takes the rows (:class:`~onnxgrad_sklearn._dask.placement.DaskRows`), whose
rounds reach the workers (``rows.sums``, ``rows.serve``).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np

from .._data import FullBatchObjective as _FullBatchObjective
from .._data import batch_rows
from .._data import penalty_terms as _penalty_terms
from .worker import engine_payload

logger = logging.getLogger("onnxgrad_sklearn")


class _DaskBatches:
    """The batches of one epoch on a dask cluster: synchronous data parallel.

    Each step's batch is the one the fit in memory draws (rows ``order[batch]`` of the
    training rows, the partitions end to end); the workers holding its rows sum the
    loss and its gradients over them, the client adds the sums in float64 in the
    workers' order, adds the penalty, divides by the batch's weight and makes one
    update: one round per step.
    """

    def __init__(self, rows, order, training=None):
        self.rows, self.order, self.training = rows, order, training

    def _rows_at(self, batch):
        """The positions of the rows of the epoch's slice ``batch``."""
        if self.order is None:
            positions = np.arange(batch.start, batch.stop)
        else:
            positions = self.order[batch]
        if self.training is not None:  # the rows early stopping's split leaves to train on
            positions = self.training[positions]
        return positions

    def _sums(self, engine, batch, ones=False):
        """The batch's loss and gradients at the current weights (None: weights sum to 0)."""
        rows = self.rows
        positions = self._rows_at(batch)
        weights = engine.get_weights()
        found = [r for r in rows.sums(rows.epochs["stage"], weights, positions, ones) if r]
        total = sum(r[0] for r in found)
        if total == 0:
            return None
        loss = sum(r[1] for r in found)
        grads = [np.zeros(w.shape) for w in weights]
        for r in found:
            for acc, g in zip(grads, r[2]):
                acc += g
        penalty, penalty_grads = _penalty_terms(weights, *rows.epochs["penalty"])
        loss = (loss + penalty) / total
        return loss, [(g + p) / total for g, p in zip(grads, penalty_grads)]

    def train(self, engine, batch, learning_rate):
        """One synchronous step (``_data.MemoryBatches.train``)."""
        found = self._sums(engine, batch)
        if found is None:
            return None, 0
        loss, grads = found
        if np.isfinite(loss):
            self.rows.epochs["previous"] = engine.apply_gradients(grads, learning_rate)
        return float(loss), batch.stop - batch.start

    def undo(self, engine):
        previous, self.rows.epochs["previous"] = self.rows.epochs["previous"], None
        if previous is not None:
            engine.restore(previous)

    def is_finite(self, engine, rows):
        if not engine.weights_finite():
            return False
        found = self._sums(engine, rows, ones=True)  # once, after the fit
        return found is None or bool(np.isfinite(found[0]))


class _TrainingRows:
    """The rows early stopping's split leaves to train on (positions ``training``, the
    others, ``held``, being the validation rows).

    ``sizes``: the training rows of each partition. For local SGD the held-out row
    numbers of every partition are sent once to each worker (``dropped``: their key in
    ``rows.payloads``), which leaves them out of its shuffles (:func:`.worker._local_order`).
    """

    _onnxgrad_rows = True
    ndim = 2

    def __init__(self, rows, training, held):
        self.rows, self.training = rows, training
        self.shape = (len(training), rows.shape[1])
        self.dtype = rows.dtype
        held = np.sort(held)
        cuts = np.searchsorted(held, rows.offsets)  # each partition's held-out rows
        self.sizes = np.diff(rows.offsets) - np.diff(cuts)
        self.dropped = None
        if rows.epochs["sync_every"] > 1:
            self.dropped = rows.register(
                {
                    rows.index[k]: (held[a:b] - rows.offsets[k]).astype(held.dtype)
                    for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:]))
                    if b > a
                }
            )

    def batches(self, order):
        if self.rows.epochs["sync_every"] > 1:
            return _LocalBatches(self.rows, order, self)
        return _DaskBatches(self.rows, order, self.training)


class _HeldOut:
    """Validation rows on the workers: early stopping's held-out rows, or the rows of a
    validation set given as dask collections (:meth:`DaskRows.validation_set`); the
    estimator's epochs predict them there (``predict``)."""

    _onnxgrad_rows = True
    ndim = 2

    def __init__(self, rows, positions):
        self.rows, self.positions = rows, positions
        self.shape = (len(positions), rows.shape[1])
        self.dtype = rows.dtype

    def predict(self, engine):
        return self.rows.predict_rows(engine, self.positions)


class _LocalBatches(_DaskBatches):
    """The batches of one epoch on a dask cluster: local SGD (``sync_every=k > 1``).

    An epoch has as many steps as the fit in memory, ``S = ceil(n / batch_size)``.
    Each worker shuffles its own rows (seeded from the epoch's order, which the client
    draws as in one process) and cuts them into ``S`` batches of near-equal sizes (its
    share of ``batch_size``); the client sends no row numbers. A round runs ``k`` steps
    on every worker from the same weights and optimizer state (the penalty scaled by
    the worker's share of the rows, so that it weighs in each local batch as in a batch
    of the fit in memory); the weights and the state are then averaged, weighted by
    the rows each worker trained on. The loss of an epoch is the row-weighted mean of
    the workers' batch losses.

    With early stopping's held-out split (``training``: :class:`_TrainingRows`), each
    worker shuffles and trains on its training rows only: the held-out rows of its
    partitions, sent once per fit, are left out; ``S`` and the shares count the
    training rows.
    """

    def __init__(self, rows, order, training=None):
        super().__init__(rows, order, None if training is None else training.training)
        # the training rows of each partition, and the held-out ones' key (None: none)
        self.sizes = np.diff(rows.offsets) if training is None else training.sizes
        self.dropped = None if training is None else training.dropped
        self.n_rows = int(self.sizes.sum())
        self.n_steps = -(-self.n_rows // batch_rows(rows.epochs["batch_size"], self.n_rows))
        self.done = 0  # steps of the epoch made
        self.pending = 0  # steps asked for since the last round
        # the workers' shuffles: drawn from the epoch's order (None: no shuffle)
        self.seed = None if order is None else [int(v) for v in order[:8]]

    def train(self, engine, batch, learning_rate):
        """Steps are run ``sync_every`` at a time, the last round of an epoch shorter:
        ``(None, 0)`` until a round is due, then its mean loss and rows."""
        self.pending += 1
        if self.pending < self.rows.epochs["sync_every"] and batch.stop < self.n_rows:
            return None, 0
        first, last = self.done, self.done + self.pending
        self.done, self.pending = last, 0
        rows = self.rows
        state = engine.get_state()
        sent = engine.get_weights() + [s for st in state["state"] for s in st]
        sent = [np.ascontiguousarray(w) for w in sent]
        plan = (self.seed, self.n_steps, first, last)

        def calls():  # for the placement of the moment (again after a worker left)
            return {  # each worker's share of the rows first (it scales the penalty)
                a: (sum(int(self.sizes[k]) for k in ks) / self.n_rows, sent, state["step"])
                + (learning_rate, plan)
                for a, ks in rows.placement.items()
            }

        started = time.perf_counter()
        results = rows.serve(rows.epochs["local"], self.dropped, "local_steps", calls)
        results = [r for r in results if r[0]]
        rows.rounds += 1
        logger.debug(
            "dask round %d: steps %d to %d on %d workers, %.4f s",
            rows.rounds,
            first + 1,
            last,
            len(results),
            time.perf_counter() - started,
        )
        if not results:
            return None, 0
        trained = sum(r[0] for r in results)
        loss = sum(r[1] for r in results) / trained
        if not np.isfinite(loss):  # the round is not applied: nothing to undo
            rows.epochs["previous"] = None
            return loss, trained
        shares = [r[0] / trained for r in results]

        def mean(values):
            total = sum(share * np.asarray(v, np.float64) for share, v in zip(shares, values))
            return total.astype(engine.dtype)

        weights = [mean(ws) for ws in zip(*[r[2] for r in results])]
        states = [[mean(vs) for vs in zip(*per)] for per in zip(*[r[3] for r in results])]
        previous = engine.checkpoint()
        engine.set_weights(weights)
        engine.set_state(dict(state, step=state["step"] + last - first, state=states))
        rows.epochs["previous"] = previous
        return float(loss), trained


class DaskFullBatchObjective(_FullBatchObjective):
    """``_FullBatchObjective`` of rows on a dask cluster: the same penalty and L1
    bookkeeping (its methods), the sums of the chunks made on the workers."""

    def __init__(self, rows, fit, loss, engine, penalized, alpha, l1_ratio, l1=0.0):
        self.rows = rows
        self.stage = rows.register(_engine_payload(fit, loss, engine, (alpha, l1_ratio)))
        super().__init__(engine, rows, None, None, penalized, alpha, l1_ratio, l1=l1)

    def _set_rows(self, X, y2d, sample_weight):
        self.chunks = None  # on the workers
        self.total_weight = self.rows.total_weight

    def _evaluate(self, weights):
        # the client's engine follows the evaluations, as for rows in memory (Ctrl-C
        # keeps the last completed iteration's weights from it)
        self.engine.set_weights(weights)
        return self._combine(weights, self.rows.sums(self.stage, weights))


def _engine_payload(fit, loss, engine, penalty, optimizer=None) -> bytes:
    """What a worker builds the engine from (:func:`.worker.engine_payload`): the
    fit's engine recipe (``Fit.recipe``: the converted model, the trained weights,
    the device) with the backend the client resolved, the loss and the penalty, as
    bytes. A large model's weights are only in the engine
    (``_model.release_trained_values``): its recipe carries them."""
    recipe = dataclasses.replace(fit.recipe, backend=engine.backend)
    if engine.large:
        recipe = recipe.with_weights(engine.get_weights())
    return engine_payload(recipe, loss, penalty, optimizer)
