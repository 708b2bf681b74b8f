"""Dask collections: fit on a cluster's workers, predict partition by partition.

``fit`` given dask arrays, DataFrames or Series (``_base._fit`` sends them here):

- Without a ``distributed`` client, or for what this version trains in one process
  (a loss whose rows mix, non-numeric columns without a ColumnTransformer head), the
  collections are computed into memory and the fit runs as it does on NumPy or pandas
  data, which an INFO log says.
- Otherwise :class:`DaskRows` keeps each partition of X on the worker that holds it,
  with its blocks of y and of the sample weights moved there, checked and in the
  training dtype, and takes the place of X in the shared fit (``_base._fit``). Each
  worker builds its engines once per fit from bytes sent once (an
  :class:`~onnxgrad_sklearn.engine.EngineRecipe`, the loss and the penalty), with its
  ``nthreads`` (:data:`_ENGINES`). A fit makes a server on each worker holding partitions (a dask
  actor, :class:`_Server`, made by a task pinned to that worker, which hands it the
  partitions), and every training round is one call of each server
  (:meth:`DaskRows.serve`): the calls go to the workers without the batching of the
  client's and the scheduler's task messages (every 10 and 5 ms), and what they carry
  is not kept after them.
- The full-batch L-BFGS solver (``_loops.TrainingLoops._run_lbfgs``) gets its objective from
  :meth:`DaskRows.objective`: a :class:`DaskFullBatchObjective`, the loop's
  ``_FullBatchObjective`` whose sums over chunks of rows are made on the workers, one
  round per evaluation; the client adds them in the order of the partitions and
  chunks, in float64, and applies the penalty as for rows in memory.
- A mini-batch optimizer (``_loops.TrainingLoops._run_epochs``) gets its batches from
  :meth:`DaskRows.batches` (:class:`_DaskBatches`): each step's batch is the one the
  fit in memory draws; the workers holding its rows sum the loss and its gradients
  over them, the client adds the sums and the penalty and makes the update
  (``TrainingEngine.apply_gradients``): one round per step. With ``sync_every > 1``
  (local SGD, :class:`_LocalBatches`) each worker trains on its own rows, ``sync_every``
  steps a round, and the weights are averaged.
- Validation rows stay where they are: early stopping's held-out split is drawn as in
  one process (:meth:`DaskRows.split`), and a validation set given as dask
  collections is kept on the workers holding its blocks
  (:meth:`DaskRows.validation_set`); at each epoch those workers predict its rows
  with the fit's engines, and only the predictions come to the client, which scores
  them as it scores a validation set in memory (:class:`_HeldOut`). An ``X_val`` in
  memory is scored on the client (its ``y_val`` and weights computed into memory).

``predict``, ``predict_proba``, ``predict_log_proba``, ``decision_function`` and
``score`` on dask collections (``_base.dask_aware``) run on each block with the
collection's scheduler, whichever it is. The estimator is one key of the graph: a
distributed worker unpickles it, and so makes its inference sessions, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import sys
import threading
import time
import uuid
import warnings
from collections import Counter, OrderedDict

import numpy as np

from ._dask_head import _sample
from ._loops import (
    _CHUNK_VALUES,
    _as_rows,
    _FullBatchObjective,
    _penalty_terms,
    _rows,
    _slices,
    batch_rows,
)

logger = logging.getLogger("onnxgrad_sklearn")

#: Seconds a round waits before it checks that the workers it runs on are alive.
POLL_S = 1.0
#: Seconds to wait, after workers holding partitions left, for dask to compute them again.
RECOVERY_S = 60.0
#: Times one evaluation is repeated after a loss of workers, at most.
MAX_RECOVERIES = 3
#: What a task carries (a validation set's row numbers) in more bytes than this is
#: scattered to its workers instead. What tasks carry passes through the scheduler,
#: which keeps the last messages to each worker (as the client keeps the last it sent:
#: ``distributed.admin.low-level-log-length``, 1000 by default): bytes in tasks stay in
#: both processes' memory long after the round. The training rounds are calls of the
#: workers' servers (:meth:`DaskRows.serve`), which nothing keeps.
INLINE_BYTES = 64 << 10


class DaskWorkerLostError(RuntimeError):
    """Partitions of the training rows were lost with their worker and not computed again."""


# fit ----------------------------------------------------------------------
def fit_dask(est, X, y, sample_weight, incremental, classes, validation):
    """``est._fit`` on dask collections: on the workers, or computed into memory here."""
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
            est._validate_validation_data(validation, None, None, _optimizer(est))
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


def _get_client():
    """The ``distributed`` client a fit trains with (``distributed.get_client()``), or None."""
    if "distributed" not in sys.modules:  # no client without it: not imported to tell
        return None
    from distributed import get_client

    try:
        return get_client()
    except ValueError:
        return None


def _in_task() -> bool:
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return False
    return True


@contextlib.contextmanager
def _client_context(client):
    """``client``, or inside a dask task a client of the worker that has left its thread
    pool for the while (``worker_client``): the fit's tasks can run on that worker."""
    if client is None or not _in_task():
        yield client
        return
    from distributed import worker_client

    with worker_client() as inner:
        yield inner


def _compute(scheduler, *values):
    import dask

    if scheduler is None:
        return dask.compute(*values)
    return dask.compute(*values, scheduler=scheduler)


def _optimizer(est, incremental=False):
    from .templates import check_template, final_estimator

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
    from ._frames import needs_raw_columns

    template = est._template()
    kind = _kind(X)
    if kind == "frame" and not _numeric_frame(X) and not needs_raw_columns(template, X._meta):
        return "X has non-numeric columns"
    if kind == "series" or (kind == "array" and X.ndim != 2):
        return "X is not 2-D"
    if kind == "array" and not isinstance(X._meta, np.ndarray) and not _scipy_sparse(X._meta):
        return f"the blocks of X are {type(X._meta).__name__}, not NumPy or SciPy arrays"
    return None


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


def _scipy_sparse(value) -> bool:
    import scipy.sparse as sp

    return sp.issparse(value)


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


# workers' versions ----------------------------------------------------------
def _versions() -> dict:
    """The versions of this package and of onnxruntime in this process."""
    from ._version import __version__
    from .runtime import import_onnxruntime

    return {
        "onnxgrad_sklearn": __version__,
        "onnxruntime": import_onnxruntime().__version__,
    }


#: What ``client.run`` sends to each worker (a test replaces it).
_worker_versions = _versions


#: The workers found with this process's versions, by scheduler (and by the function
#: that reads them, which a test replaces): asked again only of new workers.
_CHECKED: dict = {}


def _workers_info(client) -> dict:
    """The scheduler's record of each worker (``{address: info}``), asked for now.

    Not ``client.scheduler_info()``: it returns the client's cached identity, which the
    client's periodic update (every 2 s, without the workers) may replace between the
    fetch and the return.
    """
    return client.sync(client.scheduler.identity, n_workers=-1).get("workers", {})


def _check_workers(client) -> None:
    """Refuse workers without this package, or with other versions of it or onnxruntime.

    Each worker process is asked once per process (by address and the scheduler's id
    of the worker, which a restarted worker does not keep).
    """
    here = _versions()
    info = _workers_info(client)
    if not info:
        raise RuntimeError("The dask cluster has no worker: start workers before fitting.")
    workers = {(a, w.get("id")) for a, w in info.items()}
    checked = _CHECKED.setdefault((client.scheduler.address, _worker_versions), set())
    new = sorted(workers - checked)
    found = {}
    if new:
        found = client.run(_worker_versions, workers=[a for a, _ in new], on_error="return")
    wanted = f"onnxgrad_sklearn {here['onnxgrad_sklearn']} with onnxruntime {here['onnxruntime']}"
    bad = []
    for address, versions in sorted(found.items()):
        if isinstance(versions, BaseException):
            bad.append(f"{address} cannot run this package ({versions})")
        elif versions != here:
            bad.append(
                f"{address} has onnxgrad_sklearn {versions.get('onnxgrad_sklearn')} with "
                f"onnxruntime {versions.get('onnxruntime')}"
            )
    if bad:
        raise RuntimeError(
            f"The dask workers need the versions this process has ({wanted}), and "
            + "; ".join(bad)
            + f". Install onnxgrad-sklearn=={here['onnxgrad_sklearn']} and the same "
            "onnxruntime on the workers (or fit without a distributed client: the data is "
            "then computed into memory here)."
        )
    checked.update(w for w in new if w[0] in found)


# the rows on the workers -----------------------------------------------------
class DaskRows:
    """The training rows of a fit as partitions on a dask cluster.

    Takes the place of X in the shared fit: :meth:`validate` checks the data where it
    is and keeps each partition (X, y encoded as the loss takes it, the sample
    weights, all in the training dtype) on the worker that holds its block of X;
    :meth:`objective` gives the full-batch loop its objective, whose sums
    :meth:`sums` makes there. Only its ``shape`` and ``dtype`` are read as X's.
    """

    _onnxgrad_rows = True  # what _loops._is_rows looks for

    def __init__(self, client, X, fit=None):
        self.client = client
        self.collection = X  # as given: what the callbacks receive
        self.fit_id = uuid.uuid4().hex
        # the rows whose engines predict these (a validation set's: the training rows')
        self.fit = self if fit is None else fit
        self.kind = "training rows" if fit is None else "validation set"  # in messages
        self.validation = []  # the validation sets' rows (DaskRows), closed with these
        self.spec = None  # how _prepare checks and converts the partitions
        self.parts = []  # futures of the partitions (_Part), in order
        self.index = []  # each one's partition number in X
        self.placement = {}  # worker address -> positions in self.parts
        self.version = 0  # of the placement: what was sent for one is sent again
        self._pinned = None  # (positions, version, {worker: future}): _by_rows's picks
        self.holders = {}  # key of a partition -> the workers found holding it
        # key -> [value, future]: what each worker receives once per fit (the bytes it
        # builds an engine from, a stage; local SGD's held-out rows)
        self.payloads = {}
        self.rounds = 0
        self.calls = Counter()  # worker address -> training rounds it served
        # the last round's tasks and what was scattered for them, released as the next
        # round is submitted (:meth:`_run`)
        self._last_round = None
        # the training rounds' servers (:class:`_Server`, dask actors): {(placement
        # version, stage, held-out rows' key): {worker: (future, actor)}}
        self._servers = {}
        self.offsets = np.zeros(1, dtype=np.int64)
        self.epochs = None  # what the mini-batch rounds need (start_epochs)
        self.shape = (0, 0)
        self.dtype = None
        self.total_weight = 0.0

    ndim = 2

    def __getitem__(self, index):
        """The first rows (``X[:n]``), as the model takes them: what reads a width."""
        if not (isinstance(index, slice) and not index.start and index.step in (None, 1)):
            raise TypeError("the rows of a fit on a dask cluster are on its workers")
        return self.client.submit(_first_rows, self.parts[0], index.stop or 0).result()

    def training_dtype(self, asked):
        """The training dtype: ``asked``, or X's own float type (float64 for others)."""
        if asked is not None:
            return np.dtype(asked)
        X = self.collection
        try:
            dtype = np.result_type(*X.dtypes) if _kind(X) == "frame" else X.dtype
        except TypeError:  # string columns, which the template's head encodes
            return np.dtype(np.float64)
        return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float64)

    # validation ------------------------------------------------------------
    def validate(self, est, y, sample_weight, first_call, incremental, classes, dtype):
        """Check X, y and the sample weights on the workers, before any round.

        Returns what the shared fit takes: ``(X, y2d, sample_weight, fitted)``, X being
        this object and ``y2d``, ``sample_weight`` views of the partitions.
        """
        from sklearn.base import is_classifier
        from sklearn.exceptions import DataConversionWarning
        from sklearn.utils.validation import _check_feature_names, _check_n_features

        X, client, name = self.collection, self.client, type(est).__name__
        if y is None:
            raise ValueError(f"{name} requires y to be passed, but the target y is None.")
        # a DataFrame's names and width from its empty pandas frame (dask's _meta)
        described = X._meta if _kind(X) == "frame" else X
        _check_feature_names(est, described, reset=first_call)
        _check_n_features(est, described, reset=first_call)
        n_features = described.shape[1]
        width = _width(y)
        if width == 1:
            warnings.warn(
                "A column-vector y was passed when a 1d array was expected. Please "
                "change the shape of y to (n_samples,), for example using ravel().",
                DataConversionWarning,
                stacklevel=5,
            )
        classifier = is_classifier(est)
        xs, ys, ws, addresses = self._place_blocks(X, y, sample_weight)
        head = self._fit_head(est, xs, addresses, first_call)
        if head is not None:  # raw columns: the workers train on the head's output
            n_features = _sample(client, head, None, xs, addresses).shape[1]
        multilabel = classifier and width not in (None, 1)
        if classifier:
            found = client.gather([client.submit(_labels, f, name, pure=False) for f in ys])
            labels, counts = _merge_labels(found)
        else:
            labels, counts = np.zeros((1, width or 1)), None
        # the estimator's own checks of the targets (classes, their number, a continued
        # fit's), on the labels found (a regressor: on one row; an indicator matrix: on
        # two rows of its lowest and highest values, a multilabel indicator for 0 and 1)
        shown = labels
        if multilabel:
            shown = np.array([np.full(width, labels.min()), np.full(width, labels.max())])
        _, fitted = est._validate_targets(shown, first_call, incremental, classes)
        spec = {
            "name": name,
            "dtype": np.dtype(dtype),
            "n_features": n_features,
            "classifier": classifier,
            "classes": fitted.get("classes_"),
            "width": len(fitted["classes_"]) if classifier else (width or 1),
            "class_weight": None,
            "head": head,
            "multilabel": multilabel,
        }
        if classifier and est._class_weight() is not None:
            spec["class_weight"] = (labels, _class_weights(est._class_weight(), labels, counts))
        self.spec = spec
        stats = self._prepare_parts(xs, ys, ws, addresses, spec)
        del xs, ys, ws  # the partitions hold the data now
        n_samples = int(self.offsets[-1])
        self.total_weight = float(sum(s[1] for s in stats))
        self._rebalance()
        self.shape = (n_samples, n_features)
        self.dtype = np.dtype(dtype)
        logger.info(
            "%d rows in %d partitions on %d dask workers (%s)",
            n_samples,
            len(self.parts),
            len(self.placement),
            ", ".join(f"{a}: {len(k)}" for a, k in sorted(self.placement.items())),
        )
        y2d = _RowsView(self, (n_samples, spec["width"]), dtype)
        return self, y2d, _RowsView(self, (n_samples,), dtype), fitted

    def _prepare_parts(self, xs, ys, ws, addresses, spec, validation=False):
        """Check and convert the blocks on the workers of X's (:func:`_prepare`), keep
        the partitions that have rows and place them (:meth:`_place`); return each
        block's rows, weight sum and whether a weight is not zero (:func:`_describe`).

        No rows, or weights all zero, raise what ``fit`` raises for data in memory
        (``validation``: of a validation set)."""
        client = self.client
        parts = [
            client.submit(
                _prepare,
                i,
                x,
                yb,
                wb,
                spec,
                # where X's block is; elsewhere only when dask computes it again there
                workers=[address],
                allow_other_workers=True,
                pure=False,
                key=f"onnxgrad-rows-{i}-{self.fit_id}",
            )
            for i, (x, yb, wb, address) in enumerate(zip(xs, ys, ws, addresses))
        ]
        stats = client.gather(
            [
                client.submit(_describe, p, workers=[a], allow_other_workers=True, pure=False)
                for p, a in zip(parts, addresses)
            ]
        )
        kept = [i for i, s in enumerate(stats) if s[0]]  # empty partitions take no part
        self.parts = [parts[i] for i in kept]
        # where each one is: where it was described (no who_has round trip)
        self.holders = {parts[i].key: [stats[i][3]] for i in kept}
        self.index = kept
        # the rows are the partitions' end to end: row r is row r - offsets[k] of
        # partition k
        self.offsets = np.cumsum([0] + [stats[i][0] for i in kept])
        if self.offsets[-1] == 0:
            raise ValueError(
                f"Found array with 0 sample(s) (shape=(0, {spec['n_features']})) while a "
                f"minimum of 1 is required by {spec['name']}{' (X_val)' if validation else ''}."
            )
        if not any(s[2] for s in stats):
            weights = "sample_weight_val" if validation else "Sample weights"
            raise ValueError(f"{weights} must contain at least one non-zero number.")
        self._place(self.holders)
        return stats

    def validation_set(self, est, X_val, y_val, sample_weight_val, outputs):
        """A validation set given to ``fit`` as dask collections, checked as one in memory
        is (``_base._validate_validation_data``) and kept on the workers that hold the
        blocks of ``X_val``, prepared as the training partitions are (y's classes, the
        training dtype, X through the head the training rows went through), without
        class weights; ``outputs``: the columns of the encoded y.

        Returns what the epochs score: its rows, which the engines of this fit predict
        at each epoch where they are (:class:`_HeldOut` of a :class:`DaskRows`), and
        their encoded targets and weights, gathered here once.
        """
        from sklearn.utils.validation import _check_feature_names, _check_n_features

        from ._frames import check_raw_frame

        client, spec = self.client, dict(self.spec, class_weight=None)
        described = X_val._meta if _kind(X_val) == "frame" else X_val
        if "_raw_columns" in est.__dict__:  # the head the training rows went through
            check_raw_frame(est, described)
        else:
            _check_feature_names(est, described, reset=False)
            _check_n_features(est, described, reset=False)
        width = _width(y_val)
        single = spec["classifier"] and not spec["multilabel"]  # y_val: labels
        if (width or 1) != (1 if single else outputs):
            raise ValueError(
                f"y_val has {width or 1} columns, for y's "
                f"{1 if single else outputs} ({'labels' if single else 'outputs'})."
            )
        rows = DaskRows(client, X_val, fit=self)
        self.validation.append(rows)
        xs, ys, ws, addresses = rows._place_blocks(X_val, y_val, sample_weight_val)
        if single:
            found = client.gather([client.submit(_labels, f, spec["name"], pure=False) for f in ys])
            unknown = np.setdiff1d(_merge_labels(found)[0], spec["classes"])
            if unknown.size:
                raise ValueError(
                    f"y_val contains labels {unknown.tolist()} that are not among the "
                    f"classes {spec['classes'].tolist()} of y."
                )
        rows._prepare_parts(xs, ys, ws, addresses, spec, validation=True)
        del xs, ys, ws
        n = int(rows.offsets[-1])
        rows.shape, rows.dtype = (n, spec["n_features"]), self.dtype
        positions = np.arange(n, dtype=np.int32 if n < 2**31 else np.intp)
        y, sample_weight = rows._gather_rows(positions)
        logger.info(
            "the validation set: %d rows in %d partitions on %d dask workers (%s), "
            "predicted there at each epoch",
            n,
            len(rows.parts),
            len(rows.placement),
            ", ".join(f"{a}: {len(k)}" for a, k in sorted(rows.placement.items())),
        )
        return _HeldOut(rows, positions), y, sample_weight

    def _rebalance(self):
        """Spread the partitions once over the workers when some hold none and another
        more than 1.5 times its share of the rows; logged.

        Greedy: the largest partitions first, each to the worker with the fewest rows
        so far, its holder when that is one of them. A partition moves by a task pinned
        to its new worker, so that dask can still compute it again from its graph.
        """
        workers = sorted(self.client.nthreads())
        if len(self.parts) < 2 or len(workers) < 2:
            return
        sizes = np.diff(self.offsets)
        held = {a: int(sizes[ks].sum()) for a, ks in self.placement.items()}
        share = sizes.sum() / len(workers)
        if len(held) == len(workers) or max(held.values()) <= 1.5 * share:
            return
        holder = {k: a for a, ks in self.placement.items() for k in ks}
        load = dict.fromkeys(workers, 0)
        moved = 0
        for k in sorted(range(len(self.parts)), key=lambda k: -sizes[k]):
            least = min(load.values())
            target = holder[k] if load[holder[k]] == least else min(workers, key=load.get)
            load[target] += int(sizes[k])
            if target != holder[k]:
                self.parts[k] = self.client.submit(
                    _same, self.parts[k], workers=[target], pure=False
                )
                moved += 1
        if moved:
            from distributed import wait

            wait(self.parts)
            before = ", ".join(f"{a}: {len(k)}" for a, k in sorted(self.placement.items()))
            self._place()
            logger.info(
                "%d partitions moved before the fit, to balance the rows over the dask "
                "workers: %s, now %s",
                moved,
                before,
                ", ".join(f"{a}: {len(k)}" for a, k in sorted(self.placement.items())),
            )

    def _fit_head(self, est, xs, addresses, first_call):
        """Fit the template Pipeline's head where it is not fitted (``_dask_head``).

        For a DataFrame whose columns the head takes by name (``_frames``), returns the
        fitted head, which the workers apply to their partitions (the final model's
        graph trains on its output, as for a pandas DataFrame); otherwise the head
        goes into the model's graph (``_initialize`` reads ``_cluster_head``) and the
        workers hold the columns as given. None: the partitions are the model's input.
        """
        from sklearn.pipeline import Pipeline

        from ._dask_head import fit_head
        from ._frames import _head, needs_raw_columns, raw_columns

        X = self.collection
        if not first_call:  # a continued fit: the head of the first, fitted
            if "_raw_columns" in est.__dict__:
                return _head(est.estimator_)
            return None
        est.__dict__.pop("_raw_columns", None)
        template = est._template()
        if not isinstance(template, Pipeline) or len(template.steps) < 2:
            return None
        head = fit_head(self.client, _head(template), xs, addresses)
        if _kind(X) == "frame" and needs_raw_columns(template, X._meta):
            est._raw_columns = raw_columns(X._meta)
            est._fitted_head = head
            return head
        est._cluster_head = head
        return None

    def _place_blocks(self, X, y, sample_weight):
        """The blocks of X computed on the cluster (where dask puts them, or where they
        are when X is persisted), y's and the weights' paired with them; returns their
        futures (or values) and the worker of each block of X."""
        from distributed import wait

        client = self.client
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

    def _place(self, holders=None, alive=None):
        """Which worker serves each partition: one that holds it (of a partition held by
        several, the one with the fewest rows so far)."""
        holders = self.client.who_has(self.parts) if holders is None else holders
        where = [
            sorted(a for a in holders.get(f.key, ()) if alive is None or a in alive)
            for f in self.parts
        ]
        placement = {}
        for k, address in enumerate(_spread(where, np.diff(self.offsets))):
            placement.setdefault(address, []).append(k)
        self.placement = placement
        self.version += 1

    # the objective -----------------------------------------------------------
    def objective(self, est, loss, engine, penalized, alpha, l1_ratio, l1=0.0):
        """The full-batch objective of these rows (see ``_loops._full_batch_objective``)."""
        return DaskFullBatchObjective(self, est, loss, engine, penalized, alpha, l1_ratio, l1=l1)

    def start_epochs(self, est, loss, engine):
        """Set up the mini-batch rounds of ``est``'s fit: the workers' engines compute
        the sums of the loss and its gradients without the penalty, which the client
        adds (``engine``: the client's, which applies the updates)."""
        alpha, l1_ratio = est._penalty
        self.epochs = {
            "stage": self.register(_engine_payload(est, loss, engine, (0.0, 0.0))),
            "penalty": (est._penalized_mask(), alpha, l1_ratio),
            "batch_size": batch_rows(est.batch_size, self.shape[0]),
            "previous": None,  # what undoes the last update
            "sync_every": est.sync_every,
        }
        if est.sync_every > 1:  # local steps: the workers' engines train
            self.epochs["local"] = self.register(
                _engine_payload(est, loss, engine, est._penalty, engine.optimizer)
            )

    def split(self, est, validation_fraction, labels):
        """Early stopping's split, as ``train_test_split`` makes it in one process.

        The split draws from the number of rows (and for a binary classifier the labels,
        one byte a row here): the same rows as for data in memory. Returns the training
        rows (:class:`_TrainingRows`), the validation set (its rows stay on the workers:
        :class:`_HeldOut`; its targets and weights come here) and the held-out rows'
        numbers.
        """
        from sklearn.model_selection import train_test_split

        n = self.shape[0]
        train, held = train_test_split(
            np.arange(n, dtype=np.int32 if n < 2**31 else np.intp),
            random_state=est._random_state,
            test_size=validation_fraction,
            stratify=labels,
        )
        if len(held) < 2:
            raise ValueError(
                "The validation set is too small. Increase 'validation_fraction' "
                "or the size of your dataset."
            )
        y_val, sw_val = self._gather_rows(held)
        X = _TrainingRows(self, train, held)
        arrays = (X, _RowsView(self, (len(train), y_val.shape[1]), self.dtype), None)
        return arrays, (_HeldOut(self, held), y_val, sw_val), held

    def labels(self):
        """The class of each row, one byte a row for up to 127 classes (a stratified
        split's labels)."""
        client = self.client
        found = client.gather([client.submit(_label_codes, p, pure=False) for p in self.parts])
        return np.concatenate(found)

    def _gather_rows(self, positions):
        """The targets and weights of the rows ``positions``, in that order."""
        return self._by_rows(positions, _targets_of)

    def predict_rows(self, engine, positions):
        """The model's output at ``engine``'s weights on the rows ``positions``, by the
        workers' engines of the fit (``self.fit``)."""
        fit = self.fit
        stage = fit.epochs["stage"]
        weights = engine.get_weights()
        # the engine's bytes as sent last (sent again after a worker left)
        found = self._by_rows(
            positions,
            _predict_rows,
            lambda: (fit.payloads[stage][1], fit.fit_id, stage, weights),
        )
        return found[0]

    def _by_rows(self, positions, function, args=()):
        """``function(*args, picks, *partitions)`` on each worker holding some of the
        rows ``positions``: its arrays, put back in the order of ``positions``.

        ``args``: a tuple, or a callable giving it (read again when the tasks are sent
        again). A worker that leaves meanwhile: as in a round (:meth:`_round`), dask
        computes its partitions again and the tasks are sent again, or an error names
        the lost partitions.
        """
        slots = {}

        def tasks():
            picks, places = self._picks(positions, slots=True)
            slots.update(places)
            given = args() if callable(args) else args
            sent = self._pin(positions, picks)
            return {
                a: (function, *given, sent[a], *[self.parts[k] for k in picks[a]]) for a in picks
            }

        found = self._run(tasks)
        out = []
        for j, first in enumerate(next(iter(found.values()))):
            result = np.empty((len(positions), *first.shape[1:]), dtype=first.dtype)
            for a, values in found.items():
                result[slots[a]] = values[j]
            out.append(result)
        return out

    def _pin(self, positions, picks):
        """``picks`` (``{worker: {partition: row numbers}}``) of the rows ``positions``
        as the tasks carry them: a worker's picks of more than ``INLINE_BYTES`` are
        scattered to it, once for the same ``positions`` and placement (the validation
        rows, predicted at each epoch)."""
        pinned = self._pinned
        if pinned is not None and pinned[0] is positions and pinned[1] == self.version:
            return pinned[2]
        sent = {
            a: self._send(p, a) if sum(i.nbytes for i in p.values()) > INLINE_BYTES else p
            for a, p in picks.items()
        }
        self._pinned = (positions, self.version, sent)
        return sent

    def _send(self, value, address):
        """``value`` scattered to the worker ``address`` alone (its future)."""
        return self.client.scatter([value], workers=[address], hash=False)[0]

    def batches(self, order):
        """The batches of an epoch in ``order`` (``_loops._batches``)."""
        if self.epochs["sync_every"] > 1:
            return _LocalBatches(self, order)
        return _DaskBatches(self, order)

    def register(self, payload):
        """Send ``payload`` (what a worker builds an engine from, or other data each
        worker needs during the fit) once to every worker; return its key (an engine's
        stage)."""
        stage = len(self.payloads)
        self.payloads[stage] = [payload, self._scatter(payload)]
        return stage

    def _scatter(self, payload):
        """``payload`` on every worker holding partitions, of these rows or of a
        validation set's (whose workers' engines predict it), that is still there (the
        placement of rows whose worker left is updated when they are next used)."""
        workers = set(self.placement).union(*(v.placement for v in self.validation))
        workers &= set(self.client.nthreads())
        # in a list: a dict given alone would be scattered under its own keys, shared
        # by every fit on the cluster
        return self.client.scatter([payload], workers=sorted(workers), broadcast=True, hash=False)[
            0
        ]

    def sums(self, stage, weights, rows=None, ones=False):
        """``(loss * weight, [gradient * weight])`` of every chunk of rows with a non-zero
        weight, made on the workers at ``weights``, in the order of the partitions.

        With ``rows`` (positions of the rows of a batch), each worker's ``(weight,
        loss * weight, [gradient * weight])`` over its rows of the batch, or None for
        weights summing to zero, in the order of the workers.
        """
        started = time.perf_counter()
        if rows is not None:
            results = self._batch_round(stage, weights, rows, ones)
            self.rounds += 1
            return results
        results = self._round(stage, weights)
        items = sorted(itertools.chain.from_iterable(results), key=lambda item: item[0])
        self.rounds += 1
        logger.debug(
            "dask round %d: %d tasks, %d chunks, %.4f s",
            self.rounds,
            len(results),
            len(items),
            time.perf_counter() - started,
        )
        return [(loss, grads) for _, loss, grads in items]

    def _round(self, stage, weights):
        """Each worker's chunks' sums at ``weights`` (:func:`_evaluate`), a call of its
        server; in the order of the workers' addresses."""
        weights = [np.ascontiguousarray(w) for w in weights]

        def calls():  # for the placement of the moment (again after a worker left)
            return {address: (weights,) for address in self.placement}

        return self.serve(stage, None, "evaluate", calls)

    def _batch_round(self, stage, weights, rows, ones=False):
        """Each worker holding rows of the batch ``rows`` (their positions) sums over
        them (:func:`_batch_sums`, weights of one if ``ones``), a call of its server;
        the results in the order of the workers' addresses."""
        weights = [np.ascontiguousarray(w) for w in weights]
        size = self.epochs["batch_size"]

        def calls():  # for the placement of the moment (again after a worker left)
            return {a: (weights, picks, size, ones) for a, picks in self._picks(rows).items()}

        return self.serve(stage, None, "batch_sums", calls)

    def _run(self, tasks):
        """Run the tasks ``tasks()`` gives (``{worker: (function, *arguments)}``), each
        pinned to its worker; ``{worker: result}`` in the order of the workers'
        addresses.

        A worker that leaves meanwhile: dask computes its partitions again
        (:meth:`_recover`) and the tasks, made again for the new placement, are run
        again; or an error names the partitions lost (:meth:`_lost_error`).
        """
        client = self.client
        for attempt in itertools.count():
            futures = {}
            try:
                made = self._made(tasks)
                # the last round's futures are released here, just before the submits:
                # the client sends its messages to the scheduler at most once every
                # 10 ms, so a release sent alone at the end of a round would hold the
                # next round's submits back until then
                self._last_round = None
                for address, task in sorted(made.items()):
                    futures[address] = client.submit(
                        *task, workers=[address], allow_other_workers=False, pure=False
                    )
                results = self._gather(futures)
                self._last_round = (made, futures)
            except _WorkersLost as lost:
                client.cancel(list(futures.values()))
                if attempt >= MAX_RECOVERIES:
                    parts = self._lost_parts(lost.addresses)
                    raise self._lost_error(lost.addresses, parts) from None
                self._recover(lost.addresses)
                continue
            except BaseException:  # an error on a worker, Ctrl-C: no task left behind
                client.cancel(list(futures.values()))
                raise
            return dict(zip(futures, results))

    def _made(self, tasks):
        """``tasks()``; a worker of the placement that leaves as they are made (what is
        scattered to it fails): :class:`_WorkersLost`, once the scheduler knows it."""
        try:
            return tasks()
        except Exception:
            deadline = time.monotonic() + 2 * POLL_S
            while True:
                gone = set(self.placement) - set(self.client.nthreads())
                if gone:
                    raise _WorkersLost(gone) from None
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _gather(self, futures):
        from distributed import wait

        pending = list(futures.values())
        while True:
            try:
                wait(pending, timeout=POLL_S)
                return self.client.gather(pending)
            except (TimeoutError, asyncio.TimeoutError):  # slow, or a worker is gone: a task
                # pinned to a worker that left never runs
                gone = set(futures) - set(self.client.nthreads())
                if gone:
                    raise _WorkersLost(gone) from None
            except Exception:  # cancelled for lost dependencies, KilledWorker, an error
                gone = set(futures) - set(self.client.nthreads())
                if gone:
                    raise _WorkersLost(gone) from None
                raise

    def serve(self, stage, dropped, method, calls):
        """A call of ``method`` of the servers (:class:`_Server`, dask actors, one on each
        worker of the placement holding its partitions and what ``stage`` and
        ``dropped`` name in :attr:`payloads`) of the workers ``calls()`` gives (``{worker:
        arguments}`` for the placement of the moment); their results in the order of
        the workers' addresses.

        A call goes to its worker directly (through the scheduler's proxy when the
        client does not connect to workers): no task, no message batched by the
        client or the scheduler, and what it carries is not kept after it. A worker
        that leaves: as :meth:`_run`, the partitions computed again and the round run
        again on servers made for the new placement.
        """
        for attempt in itertools.count():
            made = {}
            try:
                servers = self._servers_for(stage, dropped)
                self._last_round = None
                for address, arguments in sorted(calls().items()):
                    try:
                        call = getattr(servers[address][1], method)
                    except RuntimeError:  # "Worker holding Actor was lost"
                        self._lost_or_raise(address)
                    made[address] = call(*arguments)
                results = [self._call_result(address, c) for address, c in made.items()]
            except _WorkersLost as lost:
                self._drop_servers()
                if attempt >= MAX_RECOVERIES:
                    parts = self._lost_parts(lost.addresses)
                    raise self._lost_error(lost.addresses, parts) from None
                self._recover(lost.addresses)
                continue
            self.calls.update(made.keys())
            return results

    def _servers_for(self, stage, dropped):
        """``{worker: (future, actor)}``: a :class:`_Server` on each worker of the
        placement, made once per placement, stage and held-out rows."""
        if self._servers and next(iter(self._servers))[0] != self.version:
            self._drop_servers()  # made for another placement
        key = (self.version, stage, dropped)
        if key in self._servers:
            return self._servers[key]
        payload = self.payloads[stage][1]
        held = None if dropped is None else self.payloads[dropped][1]
        futures = {
            address: self.client.submit(
                _Server,
                payload,
                self.fit_id,
                stage,
                held,
                sorted(ks),
                *[self.parts[k] for k in sorted(ks)],
                workers=[address],
                allow_other_workers=False,
                actor=True,
            )
            for address, ks in sorted(self.placement.items())
        }
        try:
            actors = self._gather(futures)
        except BaseException:
            self.client.cancel(list(futures.values()))
            raise
        self._servers[key] = {a: (futures[a], actor) for a, actor in zip(futures, actors)}
        return self._servers[key]

    def _call_result(self, address, call):
        """The result of an actor's call on ``address``, waiting as :meth:`_gather` does:
        :class:`_WorkersLost` when the worker left meanwhile."""
        while True:
            try:
                return call.result(timeout=POLL_S)
            except (TimeoutError, asyncio.TimeoutError):
                if address not in self.client.nthreads():
                    raise _WorkersLost({address}) from None
            except OSError:  # a closed connection: the worker left, as the scheduler says
                self._lost_or_raise(address)

    def _lost_or_raise(self, address):
        """:class:`_WorkersLost` once the scheduler says ``address`` left (2 polls at most),
        or the exception being handled."""
        deadline = time.monotonic() + 2 * POLL_S
        while address in self.client.nthreads():
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
        raise _WorkersLost({address}) from None

    def _drop_servers(self):
        """Release the servers: each worker drops its actor (a call in progress ends
        there, its result unused)."""
        servers, self._servers = self._servers, {}
        futures = [future for made in servers.values() for future, _ in made.values()]
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)

    def _picks(self, rows, slots=False):
        """``{worker: {partition position: its row numbers}}`` of the fit's rows ``rows``;
        with ``slots``, also ``{worker: the positions in rows of what it returns}`` (its
        rows partition by partition, as :func:`_take` gathers them)."""
        part = np.searchsorted(self.offsets, rows, side="right") - 1
        local = rows - self.offsets[part]
        where = {k: a for a, ks in self.placement.items() for k in ks}
        picks, places = {}, {}
        for k in np.unique(part):
            mine = np.flatnonzero(part == k)
            picks.setdefault(where[int(k)], {})[int(k)] = local[mine]
            places.setdefault(where[int(k)], []).append(mine)
        if not slots:
            return picks
        return picks, {a: np.concatenate(places[a]) for a in picks}

    def _lost_parts(self, addresses):
        return sorted(self.index[k] for a in addresses for k in self.placement.get(a, ()))

    def _recover(self, gone):
        """Wait for dask to compute the partitions of the workers that left again."""
        lost = self._lost_parts(gone)
        logger.warning(
            "dask worker(s) %s left the cluster during the fit, holding partitions %s of "
            "the %s: waiting up to %.0f s for dask to compute them again, then "
            "the evaluation is repeated.",
            ", ".join(sorted(gone)),
            lost,
            self.kind,
            RECOVERY_S,
        )
        deadline = time.monotonic() + RECOVERY_S
        while True:
            # cancelled: what they were made from is lost too (data sent from here)
            failed = [k for k, f in enumerate(self.parts) if f.status in ("error", "cancelled")]
            if failed:
                raise self._lost_error(gone, [self.index[k] for k in failed])
            alive = set(self.client.nthreads())
            try:
                holders = self.client.who_has(self.parts)
            except Exception:  # a partition cancelled meanwhile: seen at the next check
                holders = {}
            missing = [
                k for k, f in enumerate(self.parts) if not set(holders.get(f.key, ())) & alive
            ]
            if missing and time.monotonic() > deadline:
                raise self._lost_error(gone, [self.index[k] for k in missing])
            if not missing and alive:
                break
            time.sleep(0.2)
        self._place(holders, alive)
        # what the workers were sent, where it is needed (a validation set's workers
        # receive the fit's)
        for entry in self.fit.payloads.values():
            entry[1] = self.fit._scatter(entry[0])
        if self.fit is not self:
            for entry in self.payloads.values():
                entry[1] = self._scatter(entry[0])
        logger.info("partitions %s are back: the evaluation is repeated.", lost)

    def _lost_error(self, gone, parts):
        return DaskWorkerLostError(
            f"Partitions {parts} of the {self.kind} were on the dask worker(s) "
            f"{', '.join(sorted(gone))}, which left the cluster during the fit, and dask "
            f"could not compute them again within {RECOVERY_S:.0f} s (data scattered "
            "or loaded from this process cannot be computed again; rows made by a dask "
            "graph, such as dd.read_parquet or da.random, can): the fit stops, the "
            "estimator keeping the weights of the last evaluation. Fit again once the "
            "cluster is whole."
        )

    def target_std(self, ddof=0):
        """``np.std(y2d, axis=0)`` of the encoded targets, from each partition's moments."""
        client = self.client
        found = client.gather(
            [client.submit(_moments, f, pure=False) for f in self.parts], direct=False
        )
        n, mean, m2 = found[0]
        for n_b, mean_b, m2_b in found[1:]:  # Chan et al.'s pairwise update
            total = n + n_b
            delta = mean_b - mean
            mean = mean + delta * (n_b / total)
            m2 = m2 + m2_b + delta**2 * (n * n_b / total)
            n = total
        return np.sqrt(m2 / max(n - ddof, 0))

    def close(self):
        """Drop the engines on the workers and release the partitions (a validation
        set's too)."""
        client = self.client
        if self.fit is self:  # not waited for: nothing here depends on it
            with contextlib.suppress(Exception):
                client.run(_forget_soon, self.fit_id, on_error="ignore", wait=False)
        for rows in self.validation:
            rows.close()
        self.validation = []
        futures = self.parts + [entry[1] for entry in self.payloads.values()]
        with contextlib.suppress(Exception):
            client.cancel(futures)
        self.parts, self.payloads, self._pinned = [], {}, None
        self._last_round = None
        self._drop_servers()
        if self.rounds:
            logger.info(
                "fit on the dask cluster: %d rounds; calls per worker: %s",
                self.rounds,
                ", ".join(f"{a}: {n}" for a, n in sorted(self.calls.items())),
            )


class _WorkersLost(Exception):
    def __init__(self, addresses):
        super().__init__(sorted(addresses))
        self.addresses = set(addresses)


class _RowsView:
    """The shape and dtype of the encoded targets (or the weights) of :class:`DaskRows`,
    as the shared fit reads them; ``np.std(view, axis=0)`` is computed on the workers."""

    def __init__(self, rows, shape, dtype):
        self.rows, self.shape, self.dtype = rows, tuple(shape), np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    def argmax(self, axis=None):
        """``y2d.argmax(axis=1)``: the class of each row (a stratified split's labels)."""
        if axis != 1 or self.ndim != 2:
            raise NotImplementedError("only y2d.argmax(axis=1) of rows on a dask cluster")
        return self.rows.labels()

    def std(self, axis=None, dtype=None, out=None, ddof=0, **kwargs):
        if axis != 0 or out is not None or kwargs or self.ndim != 2:
            raise NotImplementedError("only np.std(y2d, axis=0) of rows on a dask cluster")
        return self.rows.target_std(ddof)


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
        """One synchronous step (``_loops._MemoryBatches.train``)."""
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
    ``rows.payloads``), which leaves them out of its shuffles (:func:`_local_order`).
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

    def __init__(self, rows, est, loss, engine, penalized, alpha, l1_ratio, l1=0.0):
        self.rows = rows
        self.stage = rows.register(_engine_payload(est, loss, engine, (alpha, l1_ratio)))
        super().__init__(engine, rows, None, None, penalized, alpha, l1_ratio, l1=l1)

    def _set_rows(self, X, y2d, sample_weight):
        self.chunks = None  # on the workers
        self.total_weight = self.rows.total_weight

    def _evaluate(self, weights):
        # the client's engine follows the evaluations, as for rows in memory: a fit
        # stopped by an error keeps the last evaluated weights
        self.engine.set_weights(weights)
        return self._combine(weights, self.rows.sums(self.stage, weights))


def _engine_payload(est, loss, engine, penalty, optimizer=None) -> bytes:
    """What a worker builds the engine from (:func:`_engine`): the estimator's engine
    recipe (``_engine_recipe``: the converted model, the trained weights, the device)
    with the backend the client resolved, the loss and the penalty, as bytes. A large
    model's weights are only in the engine (``_release_trained_values``): its recipe
    carries them."""
    import dataclasses

    import cloudpickle

    recipe = dataclasses.replace(est._engine_recipe(), backend=engine.backend)
    if engine.large:
        recipe = recipe.with_weights(engine.get_weights())
    return cloudpickle.dumps((recipe, loss, tuple(penalty), optimizer))


# on the workers ----------------------------------------------------------------
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


def _merge_labels(found):
    found = [f for f in found if f is not None]
    if not found:
        return np.empty(0), np.empty(0, dtype=np.int64)
    labels, inverse = np.unique(np.concatenate([u for u, _ in found]), return_inverse=True)
    counts = np.bincount(inverse, weights=np.concatenate([c for _, c in found]))
    return labels, counts.astype(np.int64)


def _class_weights(class_weight, labels, counts):
    """``compute_class_weight(class_weight, classes=labels, y=all the labels)`` from the
    counts of the labels, as ``compute_sample_weight`` computes them."""
    from sklearn.utils.class_weight import compute_class_weight

    if isinstance(class_weight, str) and class_weight == "balanced":
        counts = counts.astype(np.float64)
        return np.sum(counts) / (len(labels) * counts)
    return compute_class_weight(class_weight, classes=labels, y=labels)


def _worker_threads() -> int:
    from distributed import get_worker

    worker = get_worker()
    state = getattr(worker, "state", None)
    return int(getattr(state, "nthreads", None) or worker.nthreads)


def _engine(payload, fit_id, stage, scale=1.0):
    """The engine of this fit and stage in this worker process, built on first use
    with the worker's threads (``scale``: of the penalty's strength)."""
    import pickle

    from .optim import SGD

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
    """A fit's mini-batch rounds on one worker (a dask actor, made by
    :meth:`DaskRows._servers_for` on the worker holding the partitions ``parts``, at
    positions ``keys`` of the fit's): a step's sums (``sync_every=1``) or local SGD's
    steps come to it as calls, which carry the weights (and the optimizer state) there
    and back, rather than as tasks, whose messages the client and the scheduler send
    in batches (every 10 and 5 ms) and keep after they are sent.

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


# blocks: splitting y and the weights as X --------------------------------------
def _lazy(value) -> bool:
    from dask.base import is_dask_collection

    return is_dask_collection(value)


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


# predict, score ---------------------------------------------------------------
def run_method(est, name, X, *args, **kwargs):
    """``est.<name>(X, ...)`` on dask collections (``_base.dask_aware``)."""
    from dask.base import is_dask_collection
    from sklearn.utils.validation import check_is_fitted

    if not is_dask_collection(X):  # only y or the weights are: computed, then as usual
        args, kwargs = _compute(_get_client(), args, kwargs)
        return getattr(est, name)(X, *args, **kwargs)
    check_is_fitted(est)
    est._check_weights_stored(name)
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
