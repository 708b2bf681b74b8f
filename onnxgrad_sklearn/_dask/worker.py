"""What runs on the workers of a fit on a dask cluster.

A partition of the training rows (:class:`_Part`, checked and converted by
:func:`_prepare`), the tasks that read partitions (their rows, targets, labels,
moments), the engines each worker process builds once per fit and stage from the
bytes the fit sends (:func:`engine_payload`, :func:`_engine`, :data:`_ENGINES`),
the sums and steps of the training rounds (:func:`_evaluate`, :func:`_batch_sums`,
:func:`_local_steps`) and the server that runs them as a dask actor
(:class:`_Server`). Nothing here imports the client's side of the fit.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import numpy as np

from .._data import CHUNK_VALUES as _CHUNK_VALUES
from .._data import as_rows as _as_rows
from .._data import slices as _slices
from .._data import take_rows as _rows

#: Training engines of this worker process, by (fit, stage); dropped at the fit's end.
_ENGINES: OrderedDict = OrderedDict()
_ENGINES_LOCK = threading.Lock()
#: At most this many engines are kept (fits that ended without dropping theirs).
_MAX_ENGINES = 16


class _Part:
    """A partition of the training rows on its worker: X, the targets as the loss takes
    them and the sample weights, in the training dtype; ``index``: its number in X."""

    def __init__(self, index, X, y, sw):
        self.index, self.X, self.y, self.sw = index, X, y, sw

    def sums(self, engine):
        """As ``_FullBatchObjective._chunk_sums``: over chunks of the same size."""
        rows = max(1, _CHUNK_VALUES // max(self.X.shape[1], 1))
        for chunk in _slices(self.X.shape[0], rows):
            sw = self.sw[chunk]
            weight = float(np.sum(sw, dtype=np.float64))
            if weight == 0:
                continue
            loss, grads = engine.loss_and_gradients(_rows(self.X, chunk), self.y[chunk], sw)
            yield loss * weight, [g * weight for g in grads]


@functools.cache
def _all_zero_weights_allowed() -> dict:
    """What lets ``_check_sample_weight`` take weights that are all zero (a partition's
    may be: the client checks the whole): recent scikit-learn refuses them unless told."""
    import inspect

    from sklearn.utils.validation import _check_sample_weight

    found = "allow_all_zero_weights" in inspect.signature(_check_sample_weight).parameters
    return {"allow_all_zero_weights": True} if found else {}


def _prepare(index, x, y, w, spec):
    """A partition checked as ``fit`` checks data in memory, in the training dtype, y
    encoded (one-hot over the classes), the class weights applied. Its weights may all
    be zero: the client checks that some weight of the rows is not."""
    from sklearn.utils.validation import _check_sample_weight, _check_y, _num_samples, check_array

    dtype, name = spec["dtype"], spec["name"]
    n = _num_samples(x)
    if n == 0:
        empty = np.empty((0, spec["width"]), dtype=dtype)
        return _Part(index, np.empty((0, spec["n_features"]), dtype), empty, np.empty(0, dtype))
    if spec["head"] is not None:  # raw columns: the final model's input
        x = spec["head"].transform(x)
        x = x.toarray() if hasattr(x, "toarray") else x
    X = check_array(x, accept_sparse="csr", dtype=dtype, estimator=name, input_name="X")
    X = _as_rows(X, dtype)  # a sparse partition stays CSR: its rows densified as used
    if X.shape[1] != spec["n_features"]:
        raise ValueError(
            f"X has {X.shape[1]} features in partition {index}, but {name} is expecting "
            f"{spec['n_features']} features as input."
        )
    if _num_samples(y) != n:
        raise ValueError(
            f"Found input variables with inconsistent numbers of samples: [{n}, "
            f"{_num_samples(y)}] (partition {index} of X and its block of y: give y the "
            "partitions of X, for example both from one DataFrame)."
        )
    y = np.asarray(_check_y(y, multi_output=True, y_numeric=not spec["classifier"], estimator=name))
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.ravel()
    if spec["multilabel"]:  # a label indicator matrix, as it is
        if y.ndim != 2 or y.shape[1] != spec["width"]:
            raise ValueError(
                f"y has {y.shape[1] if y.ndim == 2 else 1} columns in partition {index}, "
                f"the label indicator matrix {spec['width']}."
            )
        y2d = y
    elif spec["classifier"]:
        y2d = np.eye(len(spec["classes"]), dtype=np.float32)[np.searchsorted(spec["classes"], y)]
    else:
        y2d = np.ascontiguousarray(y.reshape(n, -1), dtype=np.float64)
    y2d = np.ascontiguousarray(y2d, dtype=dtype)
    sw = _check_sample_weight(w, X, dtype=dtype, **_all_zero_weights_allowed())
    if spec["class_weight"] is not None:  # as compute_sample_weight on all the labels
        present, weights = spec["class_weight"]
        labels = spec["classes"][y2d.argmax(axis=1)]
        sw = np.ascontiguousarray(sw * weights[np.searchsorted(present, labels)], dtype=sw.dtype)
    return _Part(index, X, y2d, sw)


def _label_codes(part):
    """The class of each row of a partition (one byte a row for 2 classes)."""
    return part.y.argmax(axis=1).astype(np.int8 if part.y.shape[1] <= 127 else np.int64)


def _take(parts, picks):
    """X (dense), the targets and the weights of the rows ``picks`` (``{partition:
    row numbers}``, in the order of ``parts``), partition by partition."""
    taken = [(_rows(p.X, i), p.y[i], p.sw[i]) for p, i in zip(parts, picks.values())]
    return tuple(np.concatenate(a) if len(taken) > 1 else a[0] for a in zip(*taken))


def _in_order(parts, rows):
    """X (dense), the targets and the weights of ``rows`` (numbers in ``parts`` end to
    end), in that order."""
    sizes = np.cumsum([0] + [p.X.shape[0] for p in parts])
    which = np.searchsorted(sizes, rows, side="right") - 1
    first = parts[0]
    out = [np.empty((len(rows), *a.shape[1:]), dtype=a.dtype) for a in (first.X, first.y, first.sw)]
    for k in np.unique(which):
        mine = np.flatnonzero(which == k)
        local = rows[mine] - sizes[k]
        for o, taken in zip(out, (_rows(parts[k].X, local), parts[k].y[local], parts[k].sw[local])):
            o[mine] = taken
    return tuple(out)


def _targets_of(picks, *parts):
    """The targets and weights of the rows ``picks`` of ``parts``, partition by partition
    (X is not read)."""
    ys = [p.y[i] for p, i in zip(parts, picks.values())]
    return np.concatenate(ys), np.concatenate([p.sw[i] for p, i in zip(parts, picks.values())])


def _predict_rows(payload, fit_id, stage, weights, picks, *parts):
    """The model's output on the rows ``picks`` of ``parts``, partition by partition."""
    engine = _engine(payload, fit_id, stage)
    engine.set_weights(weights)
    X = _take(parts, picks)[0]
    return (engine.predict(X),)


def _same(part):
    return part


def _first_rows(part, n):
    return _rows(part.X, slice(0, n))


def _describe(part):
    """Rows, weight sum (float64) and whether any weight is not zero, of a partition, and
    the worker that holds it (this one)."""
    from distributed import get_worker

    weight = float(np.sum(part.sw, dtype=np.float64))
    return part.X.shape[0], weight, bool(np.any(part.sw)), get_worker().address


def _moments(part):
    """Rows, mean and sum of squared deviations of each column of a partition's targets."""
    y = part.y.astype(np.float64)
    mean = y.mean(axis=0)
    return y.shape[0], mean, ((y - mean) ** 2).sum(axis=0)


def _labels(y, name):
    """The labels of a block of y and their counts (y checked as fit checks it)."""
    from sklearn.utils.validation import _check_y, _num_samples

    if _num_samples(y) == 0:
        return None
    y = np.asarray(_check_y(y, multi_output=True, estimator=name))
    return np.unique(y.ravel() if y.ndim == 2 else y, return_counts=True)


def _worker_threads() -> int:
    from distributed import get_worker

    worker = get_worker()
    state = getattr(worker, "state", None)
    return int(getattr(state, "nthreads", None) or worker.nthreads)


def engine_payload(recipe, loss, penalty, optimizer=None) -> bytes:
    """What a worker builds an engine from (:func:`_engine`), as bytes sent once per fit.

    Parameters
    ----------
    recipe : EngineRecipe
        The model's (:class:`~onnxgrad_sklearn.engine.EngineRecipe`).
    loss : BaseLoss
        The loss.
    penalty : tuple of float
        ``(alpha, l1_ratio)``.
    optimizer : BaseOptimizer, optional
        The update rule of an engine that trains (local SGD); None: one that only
        evaluates (its updates are never run).

    Returns
    -------
    bytes
    """
    import cloudpickle

    return cloudpickle.dumps((recipe, loss, tuple(penalty), optimizer))


def _engine(payload, fit_id, stage, scale=1.0):
    """The engine of this fit and stage in this worker process, built on first use
    with the worker's threads (``scale``: of the penalty's strength)."""
    import pickle

    from ..optim import SGD

    key = (fit_id, stage, scale)
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
    if engine is None:
        recipe, loss, (alpha, l1_ratio), optimizer = pickle.loads(payload)
        engine = recipe.build(
            loss, optimizer or SGD(), alpha * scale, l1_ratio, threads=_worker_threads()
        )
        with _ENGINES_LOCK:
            _ENGINES[key] = engine
            while len(_ENGINES) > _MAX_ENGINES:
                _ENGINES.popitem(last=False)
    return engine


def _evaluate(payload, fit_id, stage, weights, *parts):
    """The sums of the chunks of ``parts`` at ``weights``: ``((partition, chunk), loss *
    weight, [gradient * weight in float64])`` each."""
    engine = _engine(payload, fit_id, stage)
    engine.set_weights(weights)
    out = []
    for part in parts:
        for c, (loss, grads) in enumerate(part.sums(engine)):
            out.append(((part.index, c), float(loss), [np.asarray(g, np.float64) for g in grads]))
    return out


def _batch_sums(payload, fit_id, stage, weights, picks, size, ones, *parts):
    """``(weight, loss * weight, [gradient * weight in float64])`` of this worker's rows
    of a batch (``picks``: row numbers in each of ``parts``), or None for weights
    summing to zero; ``ones``: weights of one. The rows are padded with rows of weight
    zero to a multiple of an eighth of the batch ``size``: a standard-backend engine
    then makes few graphs (one per number of rows)."""
    engine = _engine(payload, fit_id, stage)
    X, y, sw = _take(parts, picks)
    if ones:
        sw = np.ones_like(sw)
    weight = float(np.sum(sw, dtype=np.float64))
    if weight == 0:
        return None
    step = max(1, -(-size // 8))
    n = X.shape[0]
    padded = -(-n // step) * step
    if padded > n:
        X = np.concatenate([X, np.repeat(X[:1], padded - n, axis=0)])
        y = np.concatenate([y, np.repeat(y[:1], padded - n, axis=0)])
        sw = np.concatenate([sw, np.zeros(padded - n, sw.dtype)])
    engine.set_weights(weights)
    loss, grads = engine.loss_and_gradients(X, y, sw)
    return weight, float(loss) * weight, [np.asarray(g, np.float64) * weight for g in grads]


#: This worker's rows of a local-SGD epoch in their order, by (fit, parts, seed).
_ORDERS: OrderedDict = OrderedDict()


def _local_order(fit_id, parts, seed, dropped=None):
    """The order of this worker's rows (its partitions end to end) in an epoch, less the
    rows ``dropped`` (``{partition: row numbers}``, early stopping's held-out rows)."""
    key = (fit_id, tuple(p.index for p in parts), None if seed is None else tuple(seed))
    with _ENGINES_LOCK:
        order = _ORDERS.get(key)
    if order is None:
        sizes = [p.X.shape[0] for p in parts]
        rows = np.arange(sum(sizes))
        if dropped:
            kept = np.ones(len(rows), dtype=bool)
            for start, p in zip(np.cumsum([0, *sizes[:-1]]), parts):
                if p.index in dropped:
                    kept[start + dropped[p.index]] = False
            rows = rows[kept]
        if seed is None:
            order = rows
        else:  # the worker's own stream, from the epoch's and its first partition
            order = np.random.default_rng([*seed, parts[0].index]).permutation(len(rows))
            if dropped:
                order = rows[order]
        with _ENGINES_LOCK:
            _ORDERS[key] = order
            while len(_ORDERS) > 2:  # this epoch's and the last one's
                _ORDERS.popitem(last=False)
    return order


def _local_steps(payload, fit_id, stage, share, sent, step, learning_rate, plan, dropped, *parts):
    """Train from the weights and optimizer state ``sent`` on this worker's batches
    ``first`` to ``last`` of the epoch (``plan``: the epoch's seed, its number of
    batches, ``first``, ``last``; ``dropped``: the rows that do not train, or None);
    returns the rows trained on, the sum of the batch losses times their rows, the
    weights and the state, or the first non-finite loss (no more steps)."""
    seed, n_steps, first, last = plan
    engine = _engine(payload, fit_id, stage, share)
    n_weights = len(engine.shapes)
    n_state = len(engine.optimizer.state_names)
    engine.set_weights(sent[:n_weights])
    state = engine.get_state()
    flat = sent[n_weights:]
    state["state"] = [flat[i * n_state : (i + 1) * n_state] for i in range(n_weights)]
    state["step"] = step  # the fit's updates so far (Adam's bias correction reads it)
    engine.set_state(state)
    order = _local_order(fit_id, parts, seed, dropped)
    bounds = np.round(np.linspace(0, len(order), n_steps + 1)).astype(np.int64)
    # the round's rows, gathered at once in the epoch's order: each step a slice
    start = bounds[first]
    X_all, y_all, sw_all = _in_order(parts, order[start : bounds[last]])
    trained, total = 0, 0.0
    for s in range(first, last):
        batch = slice(bounds[s] - start, bounds[s + 1] - start)
        X, y, sw = X_all[batch], y_all[batch], sw_all[batch]
        if not len(sw) or not np.any(sw):
            continue
        loss = engine.train_batch(X, y, sw, learning_rate)
        if not np.isfinite(loss):
            return max(trained, 1), loss, [], []
        trained += X.shape[0]
        total += loss * X.shape[0]
    return trained, total, engine.get_weights(), engine.get_state()["state"]


class _Server:
    """A fit's rounds on one worker (a dask actor, made by the fit's ``Rounds`` on the
    worker holding the partitions ``parts``, at positions ``keys`` of the fit's): an
    evaluation's sums (L-BFGS), a step's sums (``sync_every=1``) or local SGD's steps
    come to it as calls, which carry the weights (and the optimizer state) there and
    back, rather than as tasks, whose messages the client and the scheduler send in
    batches (every 10 and 5 ms) and keep after they are sent.

    Its methods call this module's functions by name (:func:`_evaluate`...), which
    the tests wrap on the workers to count the rounds each one serves."""

    def __init__(self, payload, fit_id, stage, dropped, keys, *parts):
        self.payload, self.fit_id, self.stage = payload, fit_id, stage
        # the partitions by their position in the fit's, in that order
        self.dropped, self.parts = dropped, dict(zip(keys, parts))

    def evaluate(self, weights):
        """:func:`_evaluate` of all this worker's partitions."""
        return _evaluate(self.payload, self.fit_id, self.stage, weights, *self.parts.values())

    def batch_sums(self, weights, picks, size, ones):
        """:func:`_batch_sums` of the rows ``picks`` (``{partition position: row
        numbers}``)."""
        parts = [self.parts[k] for k in picks]
        return _batch_sums(
            self.payload, self.fit_id, self.stage, weights, picks, size, ones, *parts
        )

    def local_steps(self, share, sent, step, learning_rate, plan):
        """:func:`_local_steps` on this worker's partitions."""
        return _local_steps(
            self.payload,
            self.fit_id,
            self.stage,
            share,
            sent,
            step,
            learning_rate,
            plan,
            self.dropped,
            *self.parts.values(),
        )


def _forget(fit_id):
    """Drop this fit's engines (and local-SGD orders) from this worker process."""
    with _ENGINES_LOCK:
        for cache in (_ENGINES, _ORDERS):
            for key in [k for k in cache if k[0] == fit_id]:
                del cache[key]


async def _forget_soon(fit_id):
    """:func:`_forget`, in the worker's event loop (``client.run`` does not wait for a
    coroutine function with ``wait=False``)."""
    _forget(fit_id)
