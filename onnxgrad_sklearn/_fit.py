"""One fit's training: the object that owns a fit's state and runs its loop.

The estimator (:class:`~onnxgrad_sklearn._base.BaseOrtGradient`) validates what
``fit`` receives, prepares the template and the engine, then makes a :class:`Fit`
and runs it: epochs of mini-batches (:meth:`Fit.run_epochs`: shuffling, batches,
early stopping, the adaptive schedule, divergence, Ctrl-C, the callbacks' epochs)
or the full-batch L-BFGS (:meth:`Fit.run_lbfgs`, scipy's L-BFGS-B). The fit owns
its state while it runs: the engine, the counters and curves (``n_iter_``,
``t_``, ``loss_curve_``...), the learning-rate schedule, the random state, the
best weights and the callbacks' task. It reaches the rows through the data
interface of :mod:`onnxgrad_sklearn._data` (in memory, or partitions on a dask
cluster) without knowing which. When it ends (or stops on an error), the
estimator reads the results from :meth:`Fit.progress`.

scikit-learn's callbacks are given the estimator: before each of their hooks the
callbacks' task shows them the fit's progress on it (``FitTask.show``), as the
attributes ``fit`` will leave.

The loops run as scikit-learn's own fits do (``_fit_context(
prefer_skip_nested_validation=True)``, MLPRegressor's and LogisticRegression's): the
scikit-learn functions they call (the validation split, the validation score) and
those the callbacks' hooks call (a scorer) skip the checks of their parameters
(:func:`nested_validation_skipped`). What the estimator fits of the template (its
unfitted steps) is fitted before, with its parameters checked.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from ._data import batch_rows, shuffled, slices, smooth_penalty
from .exceptions import ConvergenceError
from .optim import SGD, LearningRateSchedule

logger = logging.getLogger("onnxgrad_sklearn")

#: The fitted attributes a fit changes, which the estimator reads from it at its end.
PROGRESS = (
    "n_iter_",
    "t_",
    "loss_",
    "loss_curve_",
    "best_loss_",
    "validation_scores_",
    "best_validation_score_",
    "_no_improvement_count",
    "_schedule",
    "_random_state",
)

#: The estimator's parameters a fit reads.
SETTINGS = (
    "max_iter",
    "tol",
    "verbose",
    "batch_size",
    "shuffle",
    "n_iter_no_change",
    "early_stopping",
    "validation_fraction",
    "on_divergence",
    "learning_rate_init",
    "sync_every",
)

_UNSET = object()


def nested_validation_skipped():
    """A context where scikit-learn's functions skip the checks of their parameters, as
    in the fit of scikit-learn's own estimators (``_fit_context(
    prefer_skip_nested_validation=True)``); nothing to do where they already skip."""
    from sklearn import config_context, get_config

    if get_config()["skip_parameter_validation"]:
        return contextlib.nullcontext()
    return config_context(skip_parameter_validation=True)


def _as_scikit_learn_fits(loop):
    """Run the training loop ``loop`` in :func:`nested_validation_skipped`."""

    @functools.wraps(loop)
    def run(self):
        with nested_validation_skipped():
            return loop(self)

    return run


class _NoTask:
    """The tasks of a fit without callbacks: every call does nothing."""

    def show(self, attributes) -> None:
        pass

    def begin(self, name, weights, attributes=None) -> None:
        pass

    def end(self, weights, attributes=None) -> bool:
        return False

    def close(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def expose(self, weights, held_rows, incremental=False):
        return None

    def resume(self):
        return None

    def random_state_shared(self) -> bool:
        return False

    def conceal(self) -> None:
        pass


#: The tasks of a fit with no callback set.
NO_TASK = _NoTask()


class Fit:
    """The training of one ``fit`` or ``partial_fit`` call.

    Parameters
    ----------
    settings : dict
        The estimator's parameters named in :data:`SETTINGS`.
    progress : dict
        The fitted attributes named in :data:`PROGRESS` the fit starts from (those of
        a previous fit with ``warm_start`` or ``partial_fit``); absent ones are unset.
    engine : TrainingEngine
        Trains the weights (its optimizer state included).
    rows : object
        The training rows (:mod:`onnxgrad_sklearn._data`).
    loss, optimizer : BaseLoss, BaseOptimizer
        What is trained, and how (a full-batch optimizer runs :meth:`run_lbfgs`).
    penalty : tuple of float
        ``(alpha, l1_ratio)`` trained.
    penalized : list of bool
        Whether each trained weight is penalised.
    recipe : EngineRecipe
        What the engines of the model are built from (L-BFGS's rounded stages; the
        engines on a dask cluster's workers).
    threads : int
        The training sessions' threads (0: the runtime's default).
    score_validation : callable
        ``score_validation(X_val, y_val, sample_weight_val, predicted)``: the
        validation score (R2, accuracy).
    stratify : callable
        ``stratify(y)``: the labels a held-out split is stratified on, or None.
    name : str
        The estimator's class name (progress bars).
    classifier : bool
        Whether the targets are classes.
    task : FitTask, default=NO_TASK
        The callbacks' tasks (``_callbacks.FitTask``).
    incremental : bool, default=False
        A ``partial_fit`` call: one epoch, no early stopping.
    validation : tuple or None
        ``(rows, y_val, sample_weight_val)`` given to ``fit``, or None.
    holds_out : bool, default=False
        Whether a callback asks for a held-out split (``holds_out_validation``).
    """

    def __init__(
        self,
        settings,
        progress,
        *,
        engine,
        rows,
        loss,
        optimizer,
        penalty,
        penalized,
        recipe,
        threads,
        score_validation,
        stratify,
        name,
        classifier,
        task=NO_TASK,
        incremental=False,
        validation=None,
        holds_out=False,
    ):
        for key in SETTINGS:
            setattr(self, key, settings[key])
        for key in PROGRESS:
            if key != "_random_state":
                setattr(self, key, _own(progress.get(key, _UNSET)))
        # the random state is copied when the fit first draws (_rng): a fit that draws
        # nothing (L-BFGS) leaves the estimator's as it was without a copy (100-200 us)
        self._random_state = progress.get("_random_state", _UNSET)
        self._rng_own = False
        self.engine, self.rows, self.loss, self.optimizer = engine, rows, loss, optimizer
        self.penalty, self.penalized = tuple(penalty), list(penalized)
        self.recipe, self.threads = recipe, threads
        self.score_validation, self.stratify = score_validation, stratify
        self.name, self.classifier = name, classifier
        self.task, self.incremental, self.validation = task, incremental, validation
        self.holds_out = holds_out

    def progress(self) -> dict:
        """The fitted attributes of :data:`PROGRESS` as they are now (those set)."""
        return {k: v for k in PROGRESS if (v := getattr(self, k)) is not _UNSET}

    def new_engine(self, loss, optimizer, penalty):
        """Another engine of the fit's model, for ``loss``, ``optimizer`` and ``penalty``."""
        return self.recipe.build(loss, optimizer, *penalty, threads=self.threads)

    def _batch_size(self, n_samples, warn=True):
        """The rows of a batch, with MLPRegressor's warning when ``batch_size`` is clipped."""
        if warn and self.batch_size != "auto" and self.batch_size > n_samples:
            warnings.warn(
                "Got `batch_size` less than 1 or larger than sample size. It is going "
                "to be clipped",
                stacklevel=4,
            )
        return batch_rows(self.batch_size, n_samples)

    # epochs -----------------------------------------------------------------
    @_as_scikit_learn_fits
    def run_epochs(self):
        """Train epoch by epoch until ``max_iter``, a stop or a divergence.

        With early stopping, the weights of the best validation score are kept.
        The callbacks' tasks are one per epoch, each ended once the epoch is recorded,
        the stopping rule and the schedule applied (a callback may stop the fit there).
        """
        engine, task, incremental = self.engine, self.task, self.incremental
        if engine.has_masks:  # dropout masks drawn from the fit's random state alone
            engine.seed_masks(int(self._rng().randint(np.iinfo(np.int32).max)))
        self.rows.start_epochs(self, self.loss, engine)  # where the rows are: its set-up
        early_stopping = self.early_stopping and not incremental
        # a callback may ask for a held-out split of its own (EarlyStopping)
        held_out = early_stopping or (not incremental and self.holds_out)
        train, validation, held_rows = self._split_validation(held_out)
        if validation is not None and not early_stopping and self.validation_scores_ is None:
            self.validation_scores_, self.best_validation_score_ = [], -np.inf  # scored only
        best_weights = engine.get_weights() if early_stopping else None
        # BatchNormalization's running statistics of the best epoch, kept with its weights
        self._best_statistics = engine.statistics() if early_stopping else None
        n_samples = train.shape[0]
        batch_size = self._batch_size(n_samples)
        max_iter = 1 if incremental else self.max_iter
        bar = _progress(self.verbose >= 1, max_iter, self.name, "epoch")
        self.n_iter_ = 0  # per call, partial_fit included, as MLPRegressor counts
        reached_max_iter = diverged = False
        # int32 when it can: half the memory, the same permutations (_shuffled)
        sample_idx = np.arange(n_samples, dtype=np.int32 if n_samples < 2**31 else np.intp)
        task.show(self.progress())
        # what the callbacks see beyond scikit-learn's context (callbacks.fit_state)
        state = task.expose(engine.get_weights, held_rows, incremental)
        if state is not None:
            state.optimizer_state = engine.get_state
            saved = task.resume()  # a Checkpoint's file: go on from its epoch
            if saved is not None and saved.get("finished"):  # the fit's own result
                self._load(saved)
                task.conceal()
                if bar is not None:
                    bar.close()
                return
            if saved is not None:
                sample_idx, best_weights = self._resume(saved, n_samples, best_weights)
        try:
            for _ in range(max_iter - (0 if incremental else self.n_iter_)):
                if self.shuffle:  # each epoch permutes the last one's order, as MLPRegressor
                    sample_idx = shuffled(sample_idx, self._rng())
                if state is not None:
                    state.order = sample_idx
                order = sample_idx if self.shuffle else None
                task.show(self.progress())
                task.begin("epoch", engine.snapshot)
                epoch_loss = self._run_interruptible_epoch(train, order, best_weights)
                if epoch_loss is None:  # diverged, weights set back, warned
                    task.close()
                    diverged = True
                    break
                if self._end_epoch(epoch_loss, n_samples, validation, bar, early_stopping):
                    best_weights = engine.get_weights()
                    self._best_statistics = engine.statistics()
                if state is not None:
                    state.best_weights = best_weights
                    state.best_statistics = self._best_statistics
                stop = self._stops(early_stopping, bar)
                task.show(self.progress())
                if task.end(engine.snapshot) and not stop:
                    stop = self._report_callback_stop(early_stopping, bar)
                if stop or incremental:
                    break
                reached_max_iter = self.n_iter_ == self.max_iter
            if not diverged:
                if not incremental:  # a large model's step sessions go before the check's
                    engine.release_sessions()
                self._check_last_update(train, batch_size)
        finally:
            task.conceal()
            if bar is not None:
                bar.close()
        self._end_epochs(reached_max_iter, best_weights if early_stopping else None, state)

    def _end_epochs(self, reached_max_iter, best_weights, state):
        """After the epochs: MLPRegressor's warning at ``max_iter``, then the weights
        the fit ends with: early stopping's ``best_weights`` (None: the last epoch's),
        unless a callback chose others (``state.final_weights``)."""
        if reached_max_iter:  # after the bar is closed, not in the middle of it
            warnings.warn(
                f"Stochastic Optimizer: Maximum iterations ({self.max_iter}) "
                "reached and the optimization hasn't converged yet.",
                ConvergenceWarning,
                stacklevel=5,
            )
        if best_weights is not None:
            self.engine.set_weights(best_weights)
            self.engine.set_statistics(self._best_statistics)
        if state is not None and state.final_weights is not None:  # a callback's choice
            self.engine.set_weights(state.final_weights)

    def _load(self, saved):
        """Set the fit's state to ``saved``, a fit of the same parameters and data that
        ended (a ``Checkpoint`` folder's file): the fit trains no epoch."""
        self._restore(saved)
        logger.info("Loaded the fit that ended at epoch %d.", self.n_iter_)

    def _resume(self, saved, n_samples, best_weights):
        """Set the fit's state to ``saved`` (what ``callbacks.Checkpoint`` wrote at the
        end of an epoch); return the rows' order and the best weights to go on with."""
        order = np.asarray(saved["order"], dtype=np.intp)
        if order.shape != (n_samples,):
            raise ValueError(
                f"The checkpoint's row order has {order.shape[0]} rows, the fit trains "
                f"on {n_samples}."
            )
        self._restore(saved)
        if saved["best_weights"] is not None:
            best_weights = saved["best_weights"]
        if saved.get("best_statistics"):  # BatchNormalization's, of the best epoch
            self._best_statistics = saved["best_statistics"]
        logger.info("Going on from the checkpoint of epoch %d.", self.n_iter_)
        return order, best_weights

    def _restore(self, saved):
        """Set the weights, the optimizer state, the counters and curves, the learning
        rate and the random state to those ``saved`` holds."""
        self.engine.set_weights(saved["weights"])
        self.engine.set_state(saved["optimizer_state"])
        for name in PROGRESS[:-2]:  # all but the schedule and the random state
            setattr(self, name, saved[name])
        self._schedule.learning_rate = saved["learning_rate"]
        self._rng().set_state(saved["random_state"])

    def _rng(self) -> np.random.RandomState:
        """The fit's random state, to draw from or set: a copy of the estimator's, made
        when the fit first draws. The callbacks may hold the one they were shown (a
        ``fitted_estimator`` shares it: ``_callbacks.shallow_state``): the fit then
        draws from a copy of its own, which leaves theirs as it was shown (a
        ``RandomState`` copy, 100-200 us, once an epoch where a copy was taken; none
        for callbacks that take no copy)."""
        shared = self.task.random_state_shared()
        if shared or not self._rng_own:  # the estimator's, or shared with a copy
            self._random_state = _own(self._random_state)
            self._rng_own = True
        return self._random_state

    def _split_validation(self, held_out):
        """Return the training rows, the validation set and the indices of the held-out
        rows (None when nothing is held out: the callbacks score the rows as given to
        ``fit``): the set given to ``fit`` (every row trains), or with ``held_out`` the
        split (else no validation set)."""
        if self.validation is not None or not held_out:
            return self.rows, self.validation, None
        labels = self.stratify(self.rows.y)  # the classes of a binary classifier, or None
        self._rng()  # the split draws from fit._random_state
        return self.rows.split(self, self.validation_fraction, labels)

    def _run_interruptible_epoch(self, train, order, best_weights):
        """Run one epoch; on Ctrl-C keep the last completed batch's weights, warn, re-raise.

        As MLPRegressor: the weights after the last update that ran (no copy of the
        weights is taken at each epoch), ``n_iter_`` and ``loss_curve_`` those of
        the completed epochs; with early stopping, the best epoch's weights.
        """
        engine = self.engine
        first_step = engine.step
        try:
            return self._run_epoch(train, order)
        except KeyboardInterrupt:
            if best_weights is not None:
                engine.set_weights(best_weights)
                engine.set_statistics(getattr(self, "_best_statistics", None))
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

    def _end_epoch(self, epoch_loss, n_samples, validation, bar, early_stopping=True) -> bool:
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
            predicted = X_val.predict(self.engine)  # where the rows are
            score = self.score_validation(X_val, y_val, sw_val, predicted)
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

    def _check_last_update(self, train, batch_size):
        """The last update was not followed by a forward pass: check its weights."""
        n_samples = train.shape[0]
        last = slice(max(n_samples - batch_size, 0), n_samples)
        feed = train.batches(None)
        if not feed.is_finite(self.engine, last):
            feed.undo(self.engine)
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

    # L-BFGS -----------------------------------------------------------------
    @_as_scikit_learn_fits
    def run_lbfgs(self):
        """Minimise the loss of the whole training set with scipy's L-BFGS-B.

        As MLPRegressor(solver="lbfgs"): ``max_iter`` iterations at most,
        ``optimizer.max_fun`` loss evaluations, ``tol`` as ``gtol``. The loss
        and its gradient come from the runtime, over chunks of rows when the
        data is large. A loss with kinks is first minimised with its kinks
        rounded, for decreasing widths (``optimizer.smoothing``), each stage
        starting where the last one stopped and sharing the budget. The
        callbacks' tasks are one per iteration (as LogisticRegression's); a
        callback may stop the fit at the end of one.
        """
        engine, task = self.engine, self.task
        stages, objectives = _lbfgs_objectives(self)
        x = objectives[0].pack(engine.get_weights())
        # the rounded stages move away from a start that may already be good (warm_start,
        # a fitted template): the fit never ends above the exact loss it started from
        start = (x, objectives[-1](x)[0]) if stages else None
        bar = _progress(self.verbose >= 1, self.max_iter, self.name, "iter")
        run = _LbfgsRun(self, objectives, x, bar)
        task.begin("lbfgs-iter", *_lbfgs_point(objectives[0], x, self.loss_curve_))
        try:
            result = run.minimize(stages)
        except KeyboardInterrupt:
            engine.set_weights(objectives[0].unpack(run.best))
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
        self._end_lbfgs(result, run, objectives, start)

    def _end_lbfgs(self, result, run, objectives, start):
        """Set the weights L-BFGS ended with and record the fit's counters."""
        from sklearn.utils.optimize import _check_optimize_result

        x = result.x if np.isfinite(result.fun) else run.best
        if start is not None and np.isfinite(result.fun) and result.fun > start[1]:
            x, result.fun = start
        self.engine.set_weights(objectives[0].unpack(x))
        result.nit = run.iterations
        self.n_iter_ = _check_optimize_result("lbfgs", result, self.max_iter)
        self.loss_ = objectives[-1].exact(x, result.fun)
        self.best_loss_ = min(self.loss_curve_, default=self.loss_)
        if not np.isfinite(result.fun):
            self._diverged(result.fun, self.n_iter_, None)

    # shared -----------------------------------------------------------------
    def _run_epoch(self, train, order):
        """Train one epoch; return its mean loss, or None after a divergence.

        ``train`` are the training rows; ``order`` is the epoch's permutation of the
        rows (None: consecutive slices). Where the rows are is the batches' business
        (``train.batches``): in memory, or partitions on a dask cluster; the loop is
        the same.
        """
        engine = self.engine
        n_samples = train.shape[0]
        accumulated = 0.0
        lr = self._schedule.learning_rate
        batches = slices(n_samples, self._batch_size(n_samples, warn=False))
        feed = train.batches(order)
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


def _own(value):
    """A fit's own copy of a value of its progress that it changes in place (the curves,
    the schedule, the random state): the estimator's stay as they were until the fit
    ends and the estimator reads its results."""
    if isinstance(value, list):
        return list(value)
    if isinstance(value, np.random.RandomState):
        own = np.random.RandomState()
        own.set_state(value.get_state())
        return own
    if isinstance(value, LearningRateSchedule):  # a few floats
        return copy.copy(value)
    return value


def _lbfgs_objectives(fit):
    """The rounded stages ``(width, loss)`` of ``fit``'s L-BFGS and the objectives of
    each stage then of the exact loss (the data source's full-batch objective)."""
    widths = _smoothing_widths(fit)
    stages = [(w, fit.loss.smoothed(w)) for w in widths]
    stages = [(w, smooth) for w, smooth in stages if smooth is not None]
    penalty = smooth_penalty(fit.penalty)
    l1 = fit.penalty[0] * fit.penalty[1]
    objectives = [
        fit.rows.objective(  # rows in memory, or partitions on a dask cluster
            fit,
            fit.loss if smooth is None else smooth,
            fit.engine if smooth is None else fit.new_engine(smooth, SGD(), penalty),
            fit.penalized,
            *penalty,
            l1=l1,
        )
        for _, smooth in [*stages, (0.0, None)]
    ]
    return stages, objectives


def _smoothing_widths(fit):
    """The widths a loss's kinks are rounded over before the exact loss (absolute)."""
    optimizer = fit.optimizer
    widths = optimizer.widths() if hasattr(optimizer, "widths") else ()
    if not widths:
        return []
    scale = 1.0
    if not fit.classifier:  # the residuals' scale: the targets' spread
        spread = float(np.mean(np.std(fit.rows.y, axis=0, dtype=np.float64)))
        scale = spread if np.isfinite(spread) and spread > 0 else 1.0
    return [w * scale for w in widths]


class _LbfgsRun:
    """scipy's L-BFGS-B over the stages of a fit's objective, sharing the budget.

    ``best``: the variables of the last completed iteration; ``iterations``: those
    made in all stages.
    """

    def __init__(self, fit, objectives, x, bar):
        self.fit, self.objectives, self.x, self.bar = fit, objectives, x, bar
        self.best = x
        self.iterations = self.evaluations = 0
        self.stopped = []  # the iteration a callback stopped the fit at

    def record(self, intermediate_result):
        """scipy's callback: record the iteration, and end its task (a callback may stop)."""
        fit = self.fit
        self.best = np.array(intermediate_result.x)
        fit.loss_curve_.append(float(intermediate_result.fun))
        logger.info("Iteration %d, loss = %.8f", len(fit.loss_curve_), fit.loss_curve_[-1])
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{fit.loss_curve_[-1]:.6g}")
            self.bar.update(1)
        now = _lbfgs_point(self.objectives[0], self.best, fit.loss_curve_)
        if fit.task.end(*now):
            self.stopped.append(len(fit.loss_curve_))
            raise StopIteration  # scipy returns this iteration's point
        fit.task.begin("lbfgs-iter", *now)

    def minimize(self, stages):
        """Run each stage (the rounded losses, then the exact one) from where the last
        stopped; return scipy's result of the last stage run."""
        fit = self.fit
        for (width, _), objective in zip([*stages, (0.0, None)], self.objectives):
            if self.iterations >= fit.max_iter and width:
                continue  # the budget is spent: the exact loss is only evaluated
            result = self._stage(objective)
            self.iterations += result.nit
            self.evaluations += result.nfev
            if not np.isfinite(result.fun):
                break
            self.x = result.x
            if self.stopped:  # the loss of a rounded stage is not the objective's
                result.fun = self.objectives[-1](self.x)[0] if width else result.fun
                result.status = 0  # stopped on purpose: no ConvergenceWarning
                logger.info("A callback stopped the fit at L-BFGS iteration %d.", self.stopped[0])
                break
            if width:
                logger.info(
                    "L-BFGS with the kinks rounded over %.3g: %d iterations, loss %.8f",
                    width,
                    result.nit,
                    result.fun,
                )
        return result

    def _stage(self, objective):
        import scipy.optimize

        fit, optimizer = self.fit, self.fit.optimizer
        with warnings.catch_warnings():
            # scipy's own warnings about a float32 objective's rounding in the line
            # search; not those of the callbacks' hooks, which run from its callback
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"scipy\.")
            return scipy.optimize.minimize(
                objective,
                self.x,
                method="L-BFGS-B",
                jac=True,
                bounds=objective.bounds,
                callback=self.record,
                options={
                    "maxfun": max(optimizer.max_fun - self.evaluations, 1),
                    "maxiter": max(fit.max_iter - self.iterations, 0),
                    "gtol": fit.tol,
                    **_ftol_option(optimizer),
                },
            )


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
