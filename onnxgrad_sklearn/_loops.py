"""The training loops of the estimators, and the rows they reach.

:class:`TrainingLoops` holds the two loops that ``BaseOrtGradient._fit`` runs: epochs
of mini-batches (``_run_epochs``: shuffling, batches, early stopping, the adaptive
schedule, divergence, Ctrl-C, the callbacks' epochs) and the full-batch L-BFGS
(``_run_lbfgs``, scipy's L-BFGS-B over :class:`_FullBatchObjective`). Neither knows
where the rows are: a loop reaches them through one small interface,

- the batches of an epoch (:func:`_batches`): ``train(engine, batch, learning_rate)``
  makes a step on the rows ``batch`` of the epoch's order and returns their loss and
  number; ``undo`` and ``is_finite`` serve the divergence checks;
- the full-batch objective (:func:`_full_batch_objective`): loss and gradient sums
  over chunks of rows;

with an implementation for rows in memory (:class:`_MemoryBatches`,
:class:`_FullBatchObjective`: dense or sparse) and one for partitions on a dask
cluster (``_dask.DaskRows``). The estimator keeps scikit-learn's side: validation,
set-up, storing and prediction.
"""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from sklearn.base import is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import train_test_split

from ._callbacks import NO_TASK, holds_out_validation
from .exceptions import ConvergenceError
from .optim import SGD

if TYPE_CHECKING:
    from .engine import TrainingEngine

logger = logging.getLogger("onnxgrad_sklearn")


class TrainingLoops:
    """The training loops of :class:`~onnxgrad_sklearn._base.BaseOrtGradient` (a mixin:
    they read and record the estimator's parameters and fitted attributes)."""

    def _batch_size(self, n_samples):
        if self.batch_size != "auto" and self.batch_size > n_samples:
            warnings.warn(
                "Got `batch_size` less than 1 or larger than sample size. It is going "
                "to be clipped",
                stacklevel=4,
            )
        return batch_rows(self.batch_size, n_samples)

    def _run_epochs(
        self, engine: TrainingEngine, X, y2d, sample_weight, incremental, given=None, task=NO_TASK
    ):
        """Train epoch by epoch until ``max_iter``, a stop or a divergence.

        With early stopping, the weights of the best validation score are kept.
        ``given``: the validation set given to ``fit``; ``task``: the callbacks'
        tasks, one per epoch, each ended once the epoch is recorded, the stopping
        rule and the schedule applied (a callback may stop the fit there).
        """
        early_stopping = self.early_stopping and not incremental
        # a callback may ask for a held-out split of its own (EarlyStopping)
        held_out = early_stopping or (not incremental and holds_out_validation(self))
        train, validation, held_rows = self._split_validation(
            (X, y2d, sample_weight), held_out, given, rows=True
        )
        if validation is not None and not early_stopping and self.validation_scores_ is None:
            self.validation_scores_, self.best_validation_score_ = [], -np.inf  # scored only
        best_weights = engine.get_weights() if early_stopping else None
        n_samples = train[0].shape[0]
        batch_size = self._batch_size(n_samples)
        max_iter = 1 if incremental else self.max_iter
        bar = _progress(self.verbose >= 1, max_iter, type(self).__name__, "epoch")
        self.n_iter_ = 0  # per call, partial_fit included, as MLPRegressor counts
        reached_max_iter = diverged = False
        # int32 when it can: half the memory, the same permutations (_shuffled)
        sample_idx = np.arange(n_samples, dtype=np.int32 if n_samples < 2**31 else np.intp)
        # what the callbacks see beyond scikit-learn's context (callbacks.fit_state)
        state = task.expose(engine.get_weights, held_rows, incremental)
        if state is not None:
            state.optimizer_state = engine.get_state
            saved = task.resume()  # a Checkpoint's file: go on from its epoch
            if saved is not None:
                sample_idx, best_weights = self._resume(engine, saved, n_samples, best_weights)
        try:
            for _ in range(max_iter - (0 if incremental else self.n_iter_)):
                if self.shuffle:  # each epoch permutes the last one's order, as MLPRegressor
                    sample_idx = _shuffled(sample_idx, self._random_state)
                if state is not None:
                    state.order = sample_idx
                order = sample_idx if self.shuffle else None
                task.begin("epoch", engine.get_weights)
                epoch_loss = self._run_interruptible_epoch(
                    engine, train, order, batch_size, best_weights
                )
                if epoch_loss is None:  # diverged, weights set back, warned
                    task.close()
                    diverged = True
                    break
                if self._end_epoch(engine, epoch_loss, n_samples, validation, bar, early_stopping):
                    best_weights = engine.get_weights()
                if state is not None:
                    state.best_weights = best_weights
                stop = self._stops(early_stopping, bar)
                if task.end(engine.get_weights) and not stop:
                    stop = self._report_callback_stop(early_stopping, bar)
                if stop or incremental:
                    break
                reached_max_iter = self.n_iter_ == self.max_iter
            if not diverged:
                if not incremental:  # a large model's step sessions go before the check's
                    engine.release_sessions()
                self._check_last_update(engine, train, batch_size)
        finally:
            task.conceal()
            if bar is not None:
                bar.close()
        if reached_max_iter:  # after the bar is closed, not in the middle of it
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) "
                "reached and the optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=4,
            )
        if early_stopping:
            engine.set_weights(best_weights)
        if state is not None and state.final_weights is not None:  # a callback's choice
            engine.set_weights(state.final_weights)

    def _resume(self, engine, saved, n_samples, best_weights):
        """Set the fit's state to ``saved`` (what ``callbacks.Checkpoint`` wrote at the
        end of an epoch); return the rows' order and the best weights to go on with."""
        order = np.asarray(saved["order"], dtype=np.intp)
        if order.shape != (n_samples,):
            raise ValueError(
                f"The checkpoint's row order has {order.shape[0]} rows, the fit trains "
                f"on {n_samples}."
            )
        engine.set_weights(saved["weights"])
        engine.set_state(saved["optimizer_state"])
        for name in ("n_iter_", "t_", "loss_", "loss_curve_", "_no_improvement_count"):
            setattr(self, name, saved[name])
        for name in ("best_loss_", "validation_scores_", "best_validation_score_"):
            setattr(self, name, saved[name])
        self._schedule.learning_rate = saved["learning_rate"]
        self._random_state.set_state(saved["random_state"])
        if saved["best_weights"] is not None:
            best_weights = saved["best_weights"]
        logger.info("Going on from the checkpoint of epoch %d.", self.n_iter_)
        return order, best_weights

    def _split_validation(self, arrays, early_stopping, given=None, rows=False):
        """Return the training arrays and the validation ones: ``given`` (the set given
        to ``fit``: every row trains), or with early stopping the held-out split (else None).

        With ``rows``, also the indices of the held-out rows (None when nothing is held
        out): the callbacks score the rows as given to ``fit``.
        """
        if given is not None or not early_stopping:
            return (arrays, given, None) if rows else (arrays, given)
        if _is_rows(arrays[0]):  # partitions on a dask cluster: split where they are
            stratify = self._stratify(arrays[1])  # the labels, gathered (binary only)
            train, validation, held = arrays[0].split(self, self.validation_fraction, stratify)
            return (train, validation, held) if rows else (train, validation)
        indices = (np.arange(arrays[0].shape[0]),) if rows else ()
        # the indices do not change the split: ShuffleSplit draws the same permutation
        X, X_val, y2d, y_val, sample_weight, sw_val, *held = train_test_split(
            *arrays,
            *indices,
            random_state=self._random_state,
            test_size=self.validation_fraction,
            stratify=self._stratify(arrays[1]),
        )
        if X_val.shape[0] < 2:
            raise ValueError(
                "The validation set is too small. Increase 'validation_fraction' "
                "or the size of your dataset."
            )
        train, validation = (_as_rows(X, X.dtype), y2d, sample_weight), (X_val, y_val, sw_val)
        return (train, validation, held[1]) if rows else (train, validation)

    def _run_interruptible_epoch(self, engine, train, order, batch_size, best_weights):
        """Run one epoch; on Ctrl-C keep the last completed batch's weights, warn, re-raise.

        As MLPRegressor: the weights after the last update that ran (no copy of the
        weights is taken at each epoch), ``n_iter_`` and ``loss_curve_`` those of
        the completed epochs; with early stopping, the best epoch's weights.
        """
        first_step = engine.step
        try:
            return self._run_epoch(engine, train, order, batch_size)
        except KeyboardInterrupt:
            if best_weights is not None:
                engine.set_weights(best_weights)
                kept = "the weights of its best epoch (early stopping)"
            else:
                if not engine.weights_finite():
                    engine.undo_last_step()  # interrupted between a divergence and its undo
                kept = (
                    f"the weights after its last completed batch ({engine.step - first_step} "
                    f"updates into epoch {self.n_iter_ + 1}, as MLPRegressor)"
                )
            warnings.warn(
                f"Training interrupted by user during epoch {self.n_iter_ + 1}: the "
                f"estimator keeps {kept}; n_iter_={self.n_iter_} and loss_curve_ count "
                "the completed epochs.",
                UserWarning,
                stacklevel=5,
            )
            raise

    def _end_epoch(
        self, engine, epoch_loss, n_samples, validation, bar, early_stopping=True
    ) -> bool:
        """Record an epoch (loss, validation score, progress); return whether it is the best.

        Without ``early_stopping``, a validation set is only scored (for a callback
        that reads ``validation_scores_``): the training loss rules the stopping.
        """
        self.n_iter_ += 1
        self.loss_ = epoch_loss
        self.t_ += n_samples
        self.loss_curve_.append(self.loss_)
        best = False
        if validation is not None:
            X_val, y_val, sw_val = validation
            if _is_rows(X_val):  # held-out rows on a dask cluster: predicted there
                predicted = X_val.predict(engine)
            else:
                predicted = _by_chunks(engine.predict, X_val)
            score = self._score_validation(X_val, y_val, sw_val, predicted)
            if early_stopping:
                best = self._record_validation(score)
            else:
                self.validation_scores_.append(score)
                self.best_validation_score_ = max(self.best_validation_score_, score)
        if validation is None or not early_stopping:
            self._record_loss(self.loss_)
        logger.info("Iteration %d, loss = %.8f", self.n_iter_, self.loss_)
        if bar is not None:
            post = {"loss": f"{self.loss_:.6g}"}
            if validation is not None:
                post["val"] = f"{self.validation_scores_[-1]:.4g}"
            bar.set_postfix(post, refresh=False)  # shown with its epoch's count
            bar.update(1)
        self._schedule.iteration_ends(self.t_)
        return best

    def _stops(self, early_stopping, bar) -> bool:
        """Apply MLPRegressor's stopping rule (or the adaptive schedule's step down)."""
        if self._no_improvement_count <= self.n_iter_no_change:
            return False
        what = "Validation score" if early_stopping else "Training loss"
        msg = (
            f"{what} did not improve more than tol={self.tol:f} for "
            f"{self.n_iter_no_change} consecutive epochs."
        )
        if self._schedule.trigger_stopping(msg):
            if early_stopping:
                self._report_early_stop(msg, bar)
            return True
        self._no_improvement_count = 0
        return False

    def _report_callback_stop(self, early_stopping, bar) -> bool:
        """Say that a callback ended the training (as early stopping does); return True."""
        line = f"A callback stopped the fit at epoch {self.n_iter_}"
        if early_stopping:
            kept = int(np.argmax(self.validation_scores_)) + 1
            line += (
                f": keeping the weights of epoch {kept} (validation score "
                f"{self.best_validation_score_:.6g})"
            )
        logger.info(line + ".")
        if bar is not None:
            bar.write(line + ".")
        return True

    def _check_last_update(self, engine, train, batch_size):
        """The last update was not followed by a forward pass: check its weights."""
        n_samples = train[0].shape[0]
        last = slice(max(n_samples - batch_size, 0), n_samples)
        feed = _batches(train, None, batch_size)
        if not feed.is_finite(engine, last):
            feed.undo(engine)
            self._diverged(np.nan, self.n_iter_, None)

    def _report_early_stop(self, msg, bar):
        """Say that early stopping ended the training, and which epoch's weights are kept."""
        kept = int(np.argmax(self.validation_scores_)) + 1
        line = (
            f"Early stopping at epoch {self.n_iter_}: {msg} Keeping the weights of epoch "
            f"{kept} (validation score {self.best_validation_score_:.6g})."
        )
        logger.info(line)
        if bar is not None:
            bar.write(line)

    def _run_lbfgs(self, engine, X, y2d, sample_weight, optimizer, loss, task=NO_TASK):
        """Minimise the loss of the whole training set with scipy's L-BFGS-B.

        As MLPRegressor(solver="lbfgs"): ``max_iter`` iterations at most,
        ``optimizer.max_fun`` loss evaluations, ``tol`` as ``gtol``. The loss
        and its gradient come from the runtime, over chunks of rows when the
        data is large. A loss with kinks is first minimised with its kinks
        rounded, for decreasing widths (``optimizer.smoothing``), each stage
        starting where the last one stopped and sharing the budget. ``task``:
        the callbacks' tasks, one per iteration (as LogisticRegression's); a
        callback may stop the fit at the end of one.
        """
        import scipy.optimize
        from sklearn.utils.optimize import _check_optimize_result

        stages = [(w, loss.smoothed(w)) for w in self._smoothing_widths(optimizer, y2d)]
        stages = [(w, smooth) for w, smooth in stages if smooth is not None]
        penalty = _smooth_penalty(self._penalty)
        l1 = self._penalty[0] * self._penalty[1]
        objectives = [
            _full_batch_objective(  # rows in memory, or partitions on a dask cluster
                self,
                loss if smooth is None else smooth,
                engine if smooth is None else self._new_engine(smooth, SGD(), penalty),
                X,
                y2d,
                sample_weight,
                self._penalized_mask(),
                *penalty,
                l1=l1,
            )
            for _, smooth in [*stages, (0.0, None)]
        ]
        x = objectives[0].pack(engine.get_weights())
        best = {"x": x}
        # the rounded stages move away from a start that may already be good (warm_start,
        # a fitted template): the fit never ends above the exact loss it started from
        start = (x, objectives[-1](x)[0]) if stages else None
        bar = _progress(self.verbose >= 1, self.max_iter, type(self).__name__, "iter")

        def record(intermediate_result):
            best["x"] = np.array(intermediate_result.x)
            self.loss_curve_.append(float(intermediate_result.fun))
            logger.info("Iteration %d, loss = %.8f", len(self.loss_curve_), self.loss_curve_[-1])
            if bar is not None:
                bar.set_postfix(loss=f"{self.loss_curve_[-1]:.6g}")
                bar.update(1)
            now = _lbfgs_point(objectives[0], best["x"], self.loss_curve_)
            if task.end(*now):
                stopped.append(len(self.loss_curve_))
                raise StopIteration  # scipy returns this iteration's point
            task.begin("lbfgs-iter", *now)

        iterations = evaluations = 0
        stopped = []  # the iteration a callback stopped the fit at
        task.begin("lbfgs-iter", *_lbfgs_point(objectives[0], x, self.loss_curve_))
        try:
            for (width, _), objective in zip([*stages, (0.0, None)], objectives):
                if iterations >= self.max_iter and width:
                    continue  # the budget is spent: the exact loss is only evaluated
                with warnings.catch_warnings():
                    # scipy warns about a float32 gradient's rounding in the line search
                    warnings.simplefilter("ignore", RuntimeWarning)
                    result = scipy.optimize.minimize(
                        objective,
                        x,
                        method="L-BFGS-B",
                        jac=True,
                        bounds=objective.bounds,
                        callback=record,
                        options={
                            "maxfun": max(optimizer.max_fun - evaluations, 1),
                            "maxiter": max(self.max_iter - iterations, 0),
                            "gtol": self.tol,
                            **_ftol_option(optimizer),
                        },
                    )
                iterations += result.nit
                evaluations += result.nfev
                if not np.isfinite(result.fun):
                    break
                x = result.x
                if stopped:  # the loss of a rounded stage is not the objective's
                    result.fun = objectives[-1](x)[0] if width else result.fun
                    result.status = 0  # stopped on purpose: no ConvergenceWarning
                    logger.info("A callback stopped the fit at L-BFGS iteration %d.", stopped[0])
                    break
                if width:
                    logger.info(
                        "L-BFGS with the kinks rounded over %.3g: %d iterations, loss %.8f",
                        width,
                        result.nit,
                        result.fun,
                    )
        except KeyboardInterrupt:
            engine.set_weights(objectives[0].unpack(best["x"]))
            self.n_iter_ = len(self.loss_curve_)
            warnings.warn(
                f"Training interrupted by user during L-BFGS iteration {self.n_iter_ + 1}: the "
                f"estimator keeps the weights of the last completed iteration.",
                UserWarning,
                stacklevel=4,
            )
            raise
        finally:
            if bar is not None:
                bar.close()
        task.close()  # the iteration begun after the last one never ran
        x = result.x if np.isfinite(result.fun) else best["x"]
        if start is not None and np.isfinite(result.fun) and result.fun > start[1]:
            x, result.fun = start
        engine.set_weights(objectives[0].unpack(x))
        result.nit = iterations
        self.n_iter_ = _check_optimize_result("lbfgs", result, self.max_iter)
        self.loss_ = objectives[-1].exact(x, result.fun)
        self.best_loss_ = min(self.loss_curve_, default=self.loss_)
        if not np.isfinite(result.fun):
            self._diverged(result.fun, self.n_iter_, None)

    def _smoothing_widths(self, optimizer, y2d):
        """The widths a loss's kinks are rounded over before the exact loss (absolute)."""
        widths = optimizer.widths() if hasattr(optimizer, "widths") else ()
        if not widths:
            return []
        scale = 1.0
        if not is_classifier(self):  # the residuals' scale: the targets' spread
            spread = float(np.mean(np.std(y2d, axis=0, dtype=np.float64)))
            scale = spread if np.isfinite(spread) and spread > 0 else 1.0
        return [w * scale for w in widths]

    def _penalized_mask(self):
        conv = self._converted
        return [conv.params[k].penalized for k in self._trained_indices()]

    def _run_epoch(self, engine, arrays, order, batch_size):
        """Train one epoch; return its mean loss, or None after a divergence.

        ``arrays`` are X, the targets and the sample weights; ``order`` is the
        epoch's permutation of the rows (None: consecutive slices). Where the rows
        are is the batches' business (:func:`_batches`): in memory, or partitions
        on a dask cluster; the loop is the same.
        """
        n_samples = arrays[0].shape[0]
        accumulated = 0.0
        lr = self._schedule.learning_rate
        batches = _slices(n_samples, batch_size)
        feed = _batches(arrays, order, batch_size)
        bar = _progress(
            self.verbose >= 2, len(batches), f"epoch {self.n_iter_ + 1}", "batch", leave=False
        )
        try:
            for number, batch in enumerate(batches, 1):
                # the loss of the rows the feed trained on, and their number (None: no
                # step, the weights summing to zero; no rows: a step still to come)
                batch_loss, rows = feed.train(engine, batch, lr)
                if batch_loss is not None and not np.isfinite(batch_loss):
                    feed.undo(engine)
                    self._diverged(batch_loss, self.n_iter_ + 1, number)
                    return None
                if rows:
                    accumulated += batch_loss * rows
                if bar is not None:
                    if rows:
                        bar.set_postfix(loss=f"{batch_loss:.6g}", refresh=False)
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
        return accumulated / n_samples

    def _diverged(self, loss, epoch, batch):
        where = f"epoch {epoch}, batch {batch}" if batch else f"the last update of epoch {epoch}"
        msg = (
            f"Training diverged at {where}: the loss became {loss} (non-finite weights or "
            "gradients). The weights were set back to the last ones with a finite loss. "
            f"Use a smaller learning_rate_init (it is {self.learning_rate_init}), scale the "
            "inputs, or pass on_divergence='warn' to keep the model with a warning."
        )
        if self.on_divergence == "raise":
            raise ConvergenceError(msg)
        warnings.warn(msg, ConvergenceWarning, stacklevel=5)

    def _record_validation(self, score):
        """Track the validation score as MLPRegressor does; return whether it is the best."""
        self.validation_scores_.append(score)
        if score < self.best_validation_score_ + self.tol:
            self._no_improvement_count += 1
        else:
            self._no_improvement_count = 0
        if score > self.best_validation_score_:
            self.best_validation_score_ = score
            return True
        return False

    def _record_loss(self, loss):
        """Track the training loss as MLPRegressor does."""
        if self.best_loss_ is None:  # after an early-stopped fit (MLPRegressor fails here)
            self.best_loss_ = np.inf
        if loss > self.best_loss_ - self.tol:
            self._no_improvement_count += 1
        else:
            self._no_improvement_count = 0
        if loss < self.best_loss_:
            self.best_loss_ = loss


_CHUNK_VALUES = 1 << 22


def _as_rows(X, dtype):
    """X in ``dtype``, ready to take rows from: C-contiguous, or CSR if it is sparse."""
    if sp.issparse(X):
        return X.tocsr().astype(dtype, copy=False)
    return np.ascontiguousarray(X, dtype=dtype)


def _rows(X, index, out=None):
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


def _batches(arrays, order, batch_size):
    """The batches of an epoch: :class:`_MemoryBatches`, or for partitions on a dask
    cluster their own (``_dask.DaskRows.batches``)."""
    if _is_rows(arrays[0]):
        return arrays[0].batches(order)
    return _MemoryBatches(arrays, order, batch_size)


class _MemoryBatches:
    """Batches of rows in memory: X, the targets and the sample weights.

    ``order`` is the epoch's permutation of the rows (None: consecutive slices, zero
    copy). Shuffled batches are gathered into buffers of one batch, reused: the data
    is never copied whole. A sparse X always goes through them, each batch densified
    on its own.
    """

    def __init__(self, arrays, order, batch_size):
        self.arrays = arrays
        if order is None and sp.issparse(arrays[0]):
            order = np.arange(arrays[0].shape[0])
        self.order = order
        self.buffers = None
        if order is not None:
            self.buffers = [np.empty((batch_size,) + a.shape[1:], dtype=a.dtype) for a in arrays]

    def _feed(self, batch):
        if self.order is None:
            return [a[batch] for a in self.arrays]
        rows = self.order[batch]
        return [_rows(a, rows, out=b[: len(rows)]) for a, b in zip(self.arrays, self.buffers)]

    def train(self, engine, batch, learning_rate):
        """One step on the rows ``batch`` (a slice of the epoch's order): its loss and
        rows, or ``(None, 0)`` when their weights sum to zero (no step)."""
        feed = self._feed(batch)
        if not feed[2].sum():
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
        return engine.is_finite(_rows(X, rows), y2d[rows], ones)


def _by_chunks(function, X):
    """``function(X)``, or for a sparse X the rows of ``function`` on its dense chunks."""
    if not sp.issparse(X):
        return function(X)
    rows = max(1, _CHUNK_VALUES // max(X.shape[1], 1))
    parts = [function(_rows(X, chunk)) for chunk in _slices(X.shape[0], rows)]
    return np.concatenate(parts, axis=0)


def batch_rows(batch_size, n_samples) -> int:
    """The rows of a batch: ``batch_size`` clipped to ``[1, n_samples]``, ``"auto"``
    ``min(200, n_samples)`` (MLPRegressor's rule)."""
    if batch_size == "auto":
        return min(200, n_samples)
    return int(np.clip(batch_size, 1, n_samples))


def _slices(n, size):
    """``list(sklearn.utils.gen_batches(n, size))`` without its parameter validation
    (0.1 ms a call: once per epoch, a tenth of a small model's epoch)."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _shuffled(index, random_state):
    """``sklearn.utils.shuffle(index, random_state=random_state)``, the same draws and
    result, without its parameter validation (0.35 ms a call, once per epoch)."""
    order = np.arange(len(index), dtype=index.dtype)  # shuffle draws the same for any dtype
    random_state.shuffle(order)
    return index[order]


def _is_rows(X) -> bool:
    """Whether ``X`` is the training rows on a dask cluster (``_dask.DaskRows``)."""
    return getattr(type(X), "_onnxgrad_rows", False)


def _full_batch_objective(est, loss, engine, X, y2d, sample_weight, *args, **kwargs):
    """The full-batch objective: :class:`_FullBatchObjective` of rows in memory, or for
    partitions on a dask cluster the same objective, its sums made on the workers
    (``_dask.DaskFullBatchObjective``, a subclass). ``loss``: the engine's."""
    if _is_rows(X):
        return X.objective(est, loss, engine, *args, **kwargs)
    return _FullBatchObjective(engine, X, y2d, sample_weight, *args, **kwargs)


class _FullBatchObjective:
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
    chunk_values = _CHUNK_VALUES

    def __init__(self, engine, X, y2d, sample_weight, penalized, alpha, l1_ratio, l1=0.0):
        self.engine, self.X, self.y, self.sw = engine, X, y2d, sample_weight
        self.shapes = engine.shapes
        self.sizes = [int(np.prod(s)) for s in self.shapes]
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
        self.chunks = _slices(X.shape[0], rows)
        if len(self.chunks) == 1:
            self.X = _rows(X, slice(None))
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
        w[self.split] -= x[n:]
        return w

    def unpack(self, x):
        w = self._weights(np.asarray(x, dtype=np.float64)).astype(self.engine.dtype)
        parts = np.split(w, np.cumsum(self.sizes)[:-1])
        return [p.reshape(s) for p, s in zip(parts, self.shapes)]

    def exact(self, x, value) -> float:
        """The objective at the weights of ``x`` from its value at ``x`` (``u + v >= |w|``)."""
        if not len(self.split) or not np.isfinite(value):
            return float(value)
        n = sum(self.sizes)
        extra = np.sum(x[self.split] + x[n:]) - np.sum(np.abs(self._weights(x)[self.split]))
        return float(value - self.l1 * extra / self.total_weight)

    def _penalty(self, weights):
        return _penalty_terms(weights, self.penalized, self.alpha, self.l1_ratio)

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
            loss, grads = self.engine.loss_and_gradients(_rows(self.X, rows), self.y[rows], sw)
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
        if not np.isfinite(loss):
            return np.inf, np.zeros(n + len(self.split))
        g = np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in grads])
        if not len(self.split):
            return float(loss), g
        c = self.l1 / self.total_weight
        loss = float(loss) + c * float(np.sum(self._x[self.split]) + np.sum(self._x[n:]))
        negative = c - g[self.split]
        g[self.split] += c
        return loss, np.concatenate([g, negative])


def _penalty_terms(weights, penalized, alpha, l1_ratio):
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


def _smooth_penalty(penalty):
    """``(alpha, l1_ratio)`` without the L1 part: ``(alpha * (1 - l1_ratio), 0)``."""
    alpha, l1_ratio = penalty
    return (alpha * (1 - l1_ratio), 0.0) if l1_ratio else (alpha, l1_ratio)


def _scipy_bounds(lower):
    """scipy's ``Bounds`` with ``lower`` and no upper bound."""
    import scipy.optimize

    return scipy.optimize.Bounds(lower, np.full(len(lower), np.inf))


def _lbfgs_point(objective, x, loss_curve):
    """An L-BFGS iterate for the callbacks' tasks: ``(weights, attributes)``, the
    weights unpacked from ``x`` when a callback asks for them."""
    attributes = {"n_iter_": len(loss_curve)}
    if loss_curve:
        attributes.update(loss_=loss_curve[-1], best_loss_=min(loss_curve))
    return (lambda: objective.unpack(x)), attributes


def _ftol_option(optimizer) -> dict:
    """scipy's ``ftol`` where the L-BFGS optimizer sets one (None: scipy's default)."""
    ftol = getattr(optimizer, "ftol", None)
    return {} if ftol is None else {"ftol": float(ftol)}


def _progress(show, total, desc, unit, leave=True):
    """A tqdm progress bar on stderr, or None when ``show`` is false."""
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=leave)
