"""The training rows of a fit on a dask cluster: :class:`DaskRows`.

Each partition of X stays on the worker that holds it, with its blocks of y and of
the sample weights moved there, checked and in the training dtype
(:meth:`DaskRows.validate`; a validation set given as dask collections likewise,
:meth:`DaskRows.validation_set`); partitions all on a few workers are spread once
over the others. DaskRows takes the place of X in the shared fit (``_base._fit``) and
is what a fit (``_fit.Fit``) asks for their objective, their batches, early
stopping's split and the validation rows' predictions; its rounds reach the workers
through its :class:`~.rounds.Rounds`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
import warnings

import numpy as np

from .._data import batch_rows
from .batches import (
    DaskFullBatchObjective,
    _DaskBatches,
    _engine_payload,
    _HeldOut,
    _LocalBatches,
    _TrainingRows,
)
from .blocks import _kind, _spread, _width, place_blocks
from .head import _sample, fit_head
from .rounds import Rounds
from .worker import (
    _describe,
    _first_rows,
    _forget_soon,
    _label_codes,
    _labels,
    _moments,
    _predict_rows,
    _prepare,
    _same,
    _targets_of,
)

logger = logging.getLogger("onnxgrad_sklearn")


class DaskRows:
    """The training rows of a fit as partitions on a dask cluster.

    Takes the place of X in the shared fit: :meth:`validate` checks the data where it
    is and keeps each partition (X, y encoded as the loss takes it, the sample
    weights, all in the training dtype) on the worker that holds its block of X;
    :meth:`objective` gives the full-batch loop its objective, whose sums
    :meth:`sums` makes there. Only its ``shape`` and ``dtype`` are read as X's.

    Its rounds reach the workers through its :class:`~.rounds.Rounds`
    (:attr:`transport`), which also recovers from workers that leave.

    Parameters
    ----------
    client : distributed.Client
        The fit's client.
    X : dask array or DataFrame
        The rows, as given to ``fit``.
    fit : DaskRows, optional
        For a validation set's rows, the training rows (whose engines predict these).
    """

    _onnxgrad_rows = True  # what _data.is_rows looks for

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
        self.holders = {}  # key of a partition -> the workers found holding it
        # key -> [value, future]: what each worker receives once per fit (the bytes it
        # builds an engine from, a stage; local SGD's held-out rows)
        self.payloads = {}
        self.rounds = 0
        self.transport = Rounds(self)  # how the rounds reach the workers
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
        xs, ys, ws, addresses = place_blocks(client, X, y, sample_weight)
        head = _fit_head(est, client, X, xs, addresses, first_call)
        if head is not None:  # raw columns: the workers train on the head's output
            n_features = _sample(client, head, None, xs, addresses).shape[1]
        targets, fitted = _check_targets(est, client, ys, width, first_call, incremental, classes)
        spec = {"name": name, "dtype": np.dtype(dtype), "n_features": n_features, "head": head}
        self.spec = spec = {**spec, **targets}  # how _prepare checks the partitions
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
            self.workers_text(),
        )
        y2d = self.y = _RowsView(self, (n_samples, spec["width"]), dtype)
        return self, y2d, _RowsView(self, (n_samples,), dtype), fitted

    def _prepare_parts(self, xs, ys, ws, addresses, spec, validation=False):
        """Check and convert the blocks on the workers of X's (:func:`_prepare`), keep
        the partitions that have rows and place them (:meth:`place`); return each
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
        self.place(self.holders)
        return stats

    def validation_set(self, est, X_val, y_val, sample_weight_val, outputs):
        """A validation set given to ``fit`` as dask collections, checked as one in memory
        is (``_setup.validate_validation_data``) and kept on the workers that hold the
        blocks of ``X_val``, prepared as the training partitions are (y's classes, the
        training dtype, X through the head the training rows went through), without
        class weights; ``outputs``: the columns of the encoded y.

        Returns what the epochs score: its rows, which the engines of this fit predict
        at each epoch where they are (:class:`_HeldOut` of a :class:`DaskRows`), and
        their encoded targets and weights, gathered here once.
        """
        from sklearn.utils.validation import _check_feature_names, _check_n_features

        from .._frames import check_raw_frame

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
        xs, ys, ws, addresses = place_blocks(client, X_val, y_val, sample_weight_val)
        if single:
            unknown = np.setdiff1d(_found_labels(client, ys, spec["name"])[0], spec["classes"])
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
            rows.workers_text(),
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
            before = self.workers_text()
            self.place()
            logger.info(
                "%d partitions moved before the fit, to balance the rows over the dask "
                "workers: %s, now %s",
                moved,
                before,
                self.workers_text(),
            )

    def place(self, holders=None, alive=None):
        """Which worker serves each partition: one that holds it (of a partition held by
        several, the one with the fewest rows so far); ``holders``: the scheduler's
        ``who_has`` of the partitions (asked for when None), ``alive``: the workers to
        place them on (None: any)."""
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

    def workers_text(self):
        """Each worker's number of partitions (``address: n, ...``), for the logs."""
        return ", ".join(f"{a}: {len(k)}" for a, k in sorted(self.placement.items()))

    # the objective -----------------------------------------------------------
    def objective(self, fit, loss, engine, penalized, alpha, l1_ratio, l1=0.0):
        """The full-batch objective of these rows (the data interface of ``_data``)."""
        return DaskFullBatchObjective(self, fit, loss, engine, penalized, alpha, l1_ratio, l1=l1)

    def start_epochs(self, fit, loss, engine):
        """Set up the mini-batch rounds of ``fit`` (``_fit.Fit``): the workers' engines
        compute the sums of the loss and its gradients without the penalty, which the
        client adds (``engine``: the client's, which applies the updates)."""
        alpha, l1_ratio = fit.penalty
        self.epochs = {
            "stage": self.register(_engine_payload(fit, loss, engine, (0.0, 0.0))),
            "penalty": (fit.penalized, alpha, l1_ratio),
            "batch_size": batch_rows(fit.batch_size, self.shape[0]),
            "previous": None,  # what undoes the last update
            "sync_every": fit.sync_every,
        }
        if fit.sync_every > 1:  # local steps: the workers' engines train
            self.epochs["local"] = self.register(
                _engine_payload(fit, loss, engine, fit.penalty, engine.optimizer)
            )

    def split(self, fit, validation_fraction, labels):
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
            random_state=fit._random_state,
            test_size=validation_fraction,
            stratify=labels,
        )
        if len(held) < 2:
            raise ValueError(
                "The validation set is too small. Increase 'validation_fraction' "
                "or the size of your dataset."
            )
        y_val, sw_val = self._gather_rows(held)
        training = _TrainingRows(self, train, held)
        training.y = _RowsView(self, (len(train), y_val.shape[1]), self.dtype)
        return training, (_HeldOut(self, held), y_val, sw_val), held

    def labels(self):
        """The class of each row, one byte a row for up to 127 classes (a stratified
        split's labels)."""
        client = self.client
        found = client.gather([client.submit(_label_codes, p, pure=False) for p in self.parts])
        return np.concatenate(found)

    def _gather_rows(self, positions):
        """The targets and weights of the rows ``positions``, in that order."""
        return self.transport.by_rows(positions, _targets_of)

    def predict_rows(self, engine, positions):
        """The model's output at ``engine``'s weights on the rows ``positions``, by the
        workers' engines of the fit (``self.fit``)."""
        fit = self.fit
        stage = fit.epochs["stage"]
        weights = engine.get_weights()
        # the engine's bytes as sent last (sent again after a worker left)
        found = self.transport.by_rows(
            positions,
            _predict_rows,
            lambda: (fit.payloads[stage][1], fit.fit_id, stage, weights),
        )
        return found[0]

    def batches(self, order):
        """The batches of an epoch in ``order`` (the data interface of ``_data``)."""
        if self.epochs["sync_every"] > 1:
            return _LocalBatches(self, order)
        return _DaskBatches(self, order)

    def register(self, payload):
        """Send ``payload`` (what a worker builds an engine from, or other data each
        worker needs during the fit) once to every worker; return its key (an engine's
        stage)."""
        stage = len(self.payloads)
        self.payloads[stage] = [payload, self.scatter(payload)]
        return stage

    def scatter(self, payload):
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
            return {a: (weights, picks, size, ones) for a, picks in self.picks(rows).items()}

        return self.serve(stage, None, "batch_sums", calls)

    def serve(self, stage, dropped, method, calls):
        """A call of ``method`` of the servers of the workers ``calls()`` gives
        (``{worker: arguments}``): a training round (:meth:`.rounds.Rounds.serve`)."""
        return self.transport.serve(stage, dropped, method, calls)

    def picks(self, rows, slots=False):
        """``{worker: {partition position: its row numbers}}`` of the fit's rows ``rows``;
        with ``slots``, also ``{worker: the positions in rows of what it returns}`` (its
        rows partition by partition, as :func:`.worker._take` gathers them)."""
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
        self.parts, self.payloads = [], {}
        self.transport.close()
        if self.rounds:
            logger.info(
                "fit on the dask cluster: %d rounds; calls per worker: %s",
                self.rounds,
                ", ".join(f"{a}: {n}" for a, n in sorted(self.transport.calls.items())),
            )


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


def _fit_head(est, client, X, xs, addresses, first_call):
    """Fit the template Pipeline's head where it is not fitted (:func:`.head.fit_head`),
    on the blocks ``xs`` of ``X`` (on the workers ``addresses``).

    For a DataFrame whose columns the head takes by name (``_frames``), returns the
    fitted head, which the workers apply to their partitions (the final model's
    graph trains on its output, as for a pandas DataFrame); otherwise the head
    goes into the model's graph (``_initialize`` reads ``_cluster_head``) and the
    workers hold the columns as given. None: the partitions are the model's input.
    """
    from sklearn.pipeline import Pipeline

    from .._frames import _head, needs_raw_columns, raw_columns

    if not first_call:  # a continued fit: the head of the first, fitted
        if "_raw_columns" in est.__dict__:
            return _head(est.estimator_)
        return None
    est.__dict__.pop("_raw_columns", None)
    template = est._template()
    if not isinstance(template, Pipeline) or len(template.steps) < 2:
        return None
    head = fit_head(client, _head(template), xs, addresses)
    if _kind(X) == "frame" and needs_raw_columns(template, X._meta):
        est._raw_columns = raw_columns(X._meta)
        est._fitted_head = head
        return head
    est._cluster_head = head
    return None


def _check_targets(est, client, ys, width, first_call, incremental, classes):
    """The targets' part of the partitions' spec (classifier, classes, width, class
    weights, multilabel), from the labels of the blocks ``ys`` of y found on the
    workers, and what the estimator's own checks of the targets fitted."""
    from sklearn.base import is_classifier

    classifier = is_classifier(est)
    multilabel = classifier and width not in (None, 1)
    if classifier:
        labels, counts = _found_labels(client, ys, type(est).__name__)
    else:
        labels, counts = np.zeros((1, width or 1)), None
    # the estimator's own checks of the targets (classes, their number, a continued
    # fit's), on the labels found (a regressor: on one row; an indicator matrix: on
    # two rows of its lowest and highest values, a multilabel indicator for 0 and 1)
    shown = labels
    if multilabel:
        shown = np.array([np.full(width, labels.min()), np.full(width, labels.max())])
    _, fitted = est._validate_targets(shown, first_call, incremental, classes)
    targets = {
        "classifier": classifier,
        "classes": fitted.get("classes_"),
        "width": len(fitted["classes_"]) if classifier else (width or 1),
        "class_weight": None,
        "multilabel": multilabel,
    }
    if classifier and est._class_weight() is not None:
        targets["class_weight"] = (labels, _class_weights(est._class_weight(), labels, counts))
    return targets, fitted


def _found_labels(client, ys, name):
    """The labels of the blocks ``ys`` of y (checked on their workers, as fit checks
    them) and their counts."""
    return _merge_labels(client.gather([client.submit(_labels, f, name, pure=False) for f in ys]))


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
