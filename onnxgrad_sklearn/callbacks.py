"""Callbacks for the estimators' fits, on scikit-learn's callback protocol.

Set them with ``set_callbacks`` (scikit-learn 1.9 or newer, ``sklearn.callback``):

- :class:`EarlyStopping` stops a stochastic fit when a score on a validation set
  stops improving, and keeps the weights of the best epoch;
- :class:`LRScheduler` sets the learning rate of each epoch (cosine with warm-up,
  steps, reduction on a plateau, or any function of the epoch);
- :class:`Checkpoint` saves what a fit needs to go on, and a fit started again with
  it goes on from there.

Both act on the ``"epoch"`` tasks of a fit with a stochastic optimizer (``"sgd"``,
``"adam"``, ...); an L-BFGS fit and ``partial_fit`` have none, and are left as they are.
With a scikit-learn older than 1.9 this module imports, and making one of its
callbacks raises an ImportError (the estimators have no ``set_callbacks`` there).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import numbers
import os
import sys
import time
import warnings
import zipfile

import numpy as np

from ._callbacks import fit_state
from ._hashing import fingerprint
from ._version import __version__
from .exceptions import CheckpointError

__all__ = ["Checkpoint", "EarlyStopping", "LRScheduler"]

logger = logging.getLogger("onnxgrad_sklearn")


def _require_callback_api(name):
    try:
        import sklearn.callback  # noqa: F401
    except ImportError as exc:
        import sklearn

        raise ImportError(
            f"{name} is a scikit-learn callback: it needs scikit-learn >= 1.9 "
            f"(sklearn.callback), and scikit-learn {sklearn.__version__} is installed. "
            "Upgrade scikit-learn: pip install 'scikit-learn>=1.9'."
        ) from exc


def _is_epoch(context) -> bool:
    return getattr(context, "task_name", None) == "epoch"


class EarlyStopping:
    """Stop a fit when a validation score has not improved for ``patience`` epochs.

    At the end of each epoch, the epoch's ``fitted_estimator`` (the estimator as a
    fit stopped there would leave it) is scored on the validation set:

    - ``X_val``, ``y_val`` (and ``sample_weight_val``) given to ``fit``;
    - else the rows the estimator holds out, ``validation_fraction`` of those given
      to ``fit`` (the split ``early_stopping=True`` makes; the callback asks for it
      even without ``early_stopping``), indexed as given to ``fit``, and the fit
      trains on the others.

    An epoch improves when its score exceeds the best so far by more than ``tol``
    (the first epoch always does); the fit stops at the end of the ``patience``-th
    epoch in a row without improvement. It works in addition to the estimator's own
    ``early_stopping`` and ``n_iter_no_change``: the first rule met stops the fit.

    Parameters
    ----------
    scoring : str, callable or None, default=None
        What :func:`sklearn.metrics.check_scoring` takes: a scorer's name
        (``"neg_mean_squared_error"``, ``"accuracy"``...), a callable
        ``scorer(estimator, X, y)``, or None for the estimator's ``score``. Greater
        is better.
    patience : int, default=10
        Epochs without improvement before the fit stops.
    tol : float, default=1e-4
        The least improvement of the score that counts.
    restore_best : bool, default=True
        Whether the fit ends with the weights of the best epoch (the last one that
        improved) rather than those of its last epoch. ``n_iter_`` and
        ``loss_curve_`` still count every epoch run, as with ``early_stopping=True``;
        these weights replace the ones the built-in early stopping keeps.

    Attributes
    ----------
    scores_ : list of float
        The score of each epoch of the last fit.
    best_score_ : float
        The best score of the last fit.
    best_epoch_ : int
        The epoch (1-based) of ``best_score_``.
    stopped_epoch_ : int or None
        The epoch at whose end the callback stopped the last fit, None if it did not.

    Examples
    --------
    >>> from onnxgrad_sklearn.callbacks import EarlyStopping
    >>> stop = EarlyStopping(scoring="neg_mean_squared_error", patience=5)
    >>> # reg.set_callbacks(stop).fit(X, y, X_val=X_val, y_val=y_val)
    """

    #: ``fit`` accepts ``X_val``/``y_val`` without ``early_stopping=True``.
    uses_validation_data = True
    #: Without ``X_val``, the fit holds out ``validation_fraction`` of the rows.
    holds_out_validation = True

    def __init__(self, scoring=None, patience=10, tol=1e-4, restore_best=True):
        _require_callback_api(type(self).__name__)
        if not isinstance(patience, numbers.Integral) or patience < 1:
            raise ValueError(f"patience must be an integer >= 1, got {patience!r}.")
        if not tol >= 0:
            raise ValueError(f"tol must be >= 0, got {tol!r}.")
        self.scoring = scoring
        self.patience = patience
        self.tol = tol
        self.restore_best = restore_best
        self._reset()

    def _reset(self):
        self.scores_ = []
        self.best_score_ = -np.inf
        self.best_epoch_ = None
        self.stopped_epoch_ = None
        self._waited = 0

    def setup(self, estimator, context):
        """Called by scikit-learn at the start of a fit: nothing to do."""

    def on_fit_task_begin(self, estimator, context):
        """Forget the previous fit at the start of a new one (its root task)."""
        if getattr(context, "task_name", None) == "fit":
            self._reset()

    def on_fit_task_end(self, estimator, context, *, fitted_estimator=None):
        """Score an epoch on the validation set; return whether to stop the fit."""
        if not _is_epoch(context):
            return False
        state = fit_state(estimator)
        if state is None or state.validation is None:
            raise ValueError(
                "EarlyStopping has no validation set: pass X_val and y_val to fit, or "
                "leave them out so that the fit holds out validation_fraction of the rows "
                "(the data given as a dask collection cannot be held out)."
            )
        from sklearn.metrics import check_scoring

        X_val, y_val, sw_val = state.validation
        scorer = check_scoring(estimator, scoring=self.scoring)
        weight = {} if sw_val is None else {"sample_weight": sw_val}
        score = float(scorer(fitted_estimator, X_val, y_val, **weight))
        self.scores_.append(score)
        epoch = len(self.scores_)
        if score > self.best_score_ + self.tol or self.best_epoch_ is None:
            self.best_score_, self.best_epoch_, self._waited = score, epoch, 0
            if self.restore_best:
                state.final_weights = state.weights()
            return False
        self._waited += 1
        if self._waited >= self.patience:
            self.stopped_epoch_ = epoch
            return True
        return False

    def teardown(self, estimator, context):
        """Called by scikit-learn at the end of a fit: nothing to do."""


class LRScheduler:
    """Set the learning rate of each epoch of a stochastic fit.

    The rate of epoch ``e`` (0-based, counted from the start of the fit) is set at
    the beginning of its task, in place of what the estimator's ``learning_rate``
    schedule would give; it is an input of the update graph, so nothing is rebuilt.
    ``learning_rate_init`` is the base rate.

    Parameters
    ----------
    schedule : {"cosine", "step", "plateau"} or callable
        - ``"cosine"``: a linear warm-up from ``learning_rate_init / warmup`` to
          ``learning_rate_init`` over the first ``warmup`` epochs, then a cosine
          decay to ``min_lr`` at epoch ``max_iter``:
          ``min_lr + (lr0 - min_lr) * (1 + cos(pi * (e - warmup) / (max_iter - warmup))) / 2``;
        - ``"step"``: ``learning_rate_init * gamma ** (e // step_size)``;
        - ``"plateau"``: starts at ``learning_rate_init``, multiplied by ``factor``
          (not below ``min_lr``) each time the monitored value has not improved by
          more than ``threshold`` for ``patience`` epochs;
        - a callable ``epoch -> learning rate``.
    warmup : int, default=0
        Warm-up epochs of ``"cosine"``.
    min_lr : float, default=0.0
        The rate ``"cosine"`` ends with, and the lowest ``"plateau"`` goes to.
    step_size : int, default=10
        Epochs between two steps of ``"step"``.
    gamma : float, default=0.1
        Factor of each step of ``"step"``.
    factor : float, default=0.1
        Factor of each reduction of ``"plateau"``.
    patience : int, default=10
        Epochs without improvement before ``"plateau"`` reduces the rate.
    threshold : float, default=1e-4
        The least improvement that counts for ``"plateau"``.
    monitor : {"loss", "validation_score"}, default="loss"
        What ``"plateau"`` watches: the training loss (``loss_curve_``, lower is
        better) or the validation score (``validation_scores_``, greater is better:
        it needs ``X_val``/``y_val`` given to fit, accepted then without
        ``early_stopping``, or ``early_stopping=True``).

    Attributes
    ----------
    learning_rates_ : list of float
        The rate set for each epoch of the last fit.

    Examples
    --------
    >>> from onnxgrad_sklearn.callbacks import LRScheduler
    >>> cosine = LRScheduler("cosine", warmup=5, min_lr=1e-5)
    >>> halve = LRScheduler(lambda epoch: 0.01 * 0.5**epoch)
    """

    def __init__(
        self,
        schedule,
        *,
        warmup=0,
        min_lr=0.0,
        step_size=10,
        gamma=0.1,
        factor=0.1,
        patience=10,
        threshold=1e-4,
        monitor="loss",
    ):
        _require_callback_api(type(self).__name__)
        if not callable(schedule) and schedule not in ("cosine", "step", "plateau"):
            raise ValueError(
                "schedule must be 'cosine', 'step', 'plateau' or a callable epoch -> "
                f"learning rate, got {schedule!r}."
            )
        if monitor not in ("loss", "validation_score"):
            raise ValueError(f"monitor must be 'loss' or 'validation_score', got {monitor!r}.")
        self.schedule = schedule
        self.warmup = warmup
        self.min_lr = min_lr
        self.step_size = step_size
        self.gamma = gamma
        self.factor = factor
        self.patience = patience
        self.threshold = threshold
        self.monitor = monitor
        self.learning_rates_ = []
        self._plateau = None

    @property
    def uses_validation_data(self):
        """Whether ``fit`` takes ``X_val`` without ``early_stopping`` (the plateau
        watches the validation score)."""
        return self.schedule == "plateau" and self.monitor == "validation_score"

    def setup(self, estimator, context):
        """Called by scikit-learn at the start of a fit: nothing to do."""

    def rate(self, epoch, learning_rate_init, max_iter):
        """The rate of ``epoch`` (0-based) for ``"cosine"``, ``"step"`` or a callable.

        Parameters
        ----------
        epoch : int
            The epoch, from 0 at the start of the fit.
        learning_rate_init : float
            The base rate.
        max_iter : int
            The most epochs of the fit (the end of the cosine).

        Returns
        -------
        float
        """
        if callable(self.schedule):
            return float(self.schedule(epoch))
        if self.schedule == "step":
            return float(learning_rate_init * self.gamma ** (epoch // self.step_size))
        if self.schedule == "cosine":
            if epoch < self.warmup:
                return float(learning_rate_init * (epoch + 1) / self.warmup)
            progress = (epoch - self.warmup) / max(1, max_iter - self.warmup)
            cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
            return float(self.min_lr + (learning_rate_init - self.min_lr) * cosine)
        raise ValueError("'plateau' has no rate as a function of the epoch alone.")

    def on_fit_task_begin(self, estimator, context):
        """Set the learning rate of the epoch that begins."""
        if getattr(context, "task_name", None) == "fit":
            self.learning_rates_ = []
            self._plateau = None
            return
        if not _is_epoch(context):
            return
        lr0 = float(estimator.learning_rate_init)
        if self.schedule == "plateau":
            if self._plateau is None:
                self._plateau = {"rate": lr0, "best": np.inf, "waited": 0}
            rate = self._plateau["rate"]
        else:
            # the epochs done: the epoch's number, also in a fit gone on from a Checkpoint
            rate = self.rate(estimator.n_iter_, lr0, estimator.max_iter)
        estimator._schedule.learning_rate = rate
        self.learning_rates_.append(rate)

    def on_fit_task_end(self, estimator, context):
        """Follow the monitored value for ``"plateau"``; never stops the fit."""
        if self.schedule != "plateau" or not _is_epoch(context) or self._plateau is None:
            return False
        if self.monitor == "loss":
            value = estimator.loss_curve_[-1]
        else:
            scores = getattr(estimator, "validation_scores_", None)
            if not scores:
                raise ValueError(
                    "LRScheduler('plateau', monitor='validation_score') needs a validation "
                    "set: pass X_val and y_val to fit, or set early_stopping=True."
                )
            value = -scores[-1]
        plateau = self._plateau
        if value < plateau["best"] - self.threshold:
            plateau["best"], plateau["waited"] = value, 0
        else:
            plateau["waited"] += 1
            if plateau["waited"] >= self.patience:
                plateau["rate"] = max(plateau["rate"] * self.factor, self.min_lr)
                plateau["waited"] = 0
        return False

    def teardown(self, estimator, context):
        """Called by scikit-learn at the end of a fit: nothing to do."""


#: The version of the checkpoint files :class:`Checkpoint` writes.
_CHECKPOINT_VERSION = 1


def _digest(value) -> str:
    """A digest of an array-like (dense or sparse, numbers or labels) or of a value."""
    import scipy.sparse as sp

    sha = hashlib.sha256()
    if value is None:
        sha.update(b"None")
    elif sp.issparse(value):
        csr = value.tocsr()
        for part in (csr.data, csr.indices, csr.indptr, np.asarray(csr.shape)):
            sha.update(np.ascontiguousarray(part).tobytes())
    else:
        array = np.asarray(value)
        sha.update(f"{array.dtype.str}{array.shape}".encode())
        if array.dtype.kind == "O":
            sha.update(repr(array.tolist()).encode())
        else:
            sha.update(np.ascontiguousarray(array).tobytes())
    return sha.hexdigest()


def _params_digests(estimator) -> dict:
    """One digest per parameter of ``estimator`` (its ``get_params(deep=False)``)."""
    from ._hashing import fingerprint

    return {
        k: fingerprint(v, params=True) for k, v in sorted(estimator.get_params(deep=False).items())
    }


def _data_digests(data) -> dict:
    metadata = data.get("metadata") or {}
    return {
        "X": _digest(data.get("X")),
        "y": _digest(data.get("y")),
        "sample_weight": _digest(metadata.get("sample_weight")),
    }


class Checkpoint:
    """Save what a fit needs to go on, every ``every`` epochs; go on from it.

    At the end of every ``every``-th epoch of a fit with a stochastic optimizer, the
    callback writes to ``path`` one ``.npz`` file (no pickle: arrays, and a JSON
    document in its ``"meta"`` entry): the weights, the optimizer's state, the
    learning rate, the epoch count and ``t_``, the random state and the current order
    of the rows, ``loss_curve_``, and the built-in early stopping's state (its scores,
    counter and best weights), with digests of the estimator's parameters and of the
    data given to ``fit`` (``X``, ``y``, ``sample_weight``). It writes a temporary file
    and renames it (``os.replace``): the file is always a whole checkpoint.

    A ``fit`` with the callback whose ``path`` holds a checkpoint of the same
    parameters and data goes on from its epoch: a fit killed after epoch ``k`` and
    started again ends with the weights and ``loss_curve_`` of a fit never
    interrupted, bit for bit. A checkpoint of other parameters or other data is
    refused with a ValueError that names what differs (every parameter counts,
    ``verbose`` included). The fit's own state only is saved: an :class:`LRScheduler`
    by a formula of the epoch goes on as it would have, but the state of other
    callbacks (an :class:`LRScheduler` on a plateau, an :class:`EarlyStopping`) starts
    afresh at the checkpoint's epoch.

    A fit that completes (``max_iter``, convergence, an early stop, a callback's stop)
    marks its checkpoint finished (``"finished": true`` and ``"final_epoch"`` in the
    JSON document): a fit started again with it does not go on from it, it starts
    afresh (logged at INFO) and overwrites it. While a fit runs, it holds a lock next
    to the file, ``path + ".lock"`` (created exclusively, with its process id): a
    second fit with the same ``path`` is refused with a ValueError while the first
    runs; a lock left by a process that no longer runs is taken over, with a logged
    warning. The lock is released at the end of the fit, also on an error.

    With ``path`` a folder (it exists, or ends with a separator), the callback keeps one
    file per fit in it, named by a digest of the estimator's parameters, of the data
    given to ``fit`` and of where the fit starts (the weights of a fitted model a
    ``warm_start`` fit goes on from): each fold and candidate of a search has its own.
    In this folder mode a fit also writes its final state when it ends, and a later fit
    of the same parameters and data loads it instead of training (a search run again
    after it was killed loads the fits that had finished and resumes the unfinished
    one); a fit whose file another fit is writing trains without the file, with a
    warning.
    :meth:`clear` removes the files. A single file given to a fit of a search or
    cross-validation is refused before it trains: one file holds one fit.

    A folder of ``path`` that does not exist is created (with its parents) when the fit
    starts. A file the fit cannot read (empty, truncated, overwritten, not a
    checkpoint, or written by a version of the package with another format) is
    refused before training with a :class:`~onnxgrad_sklearn.CheckpointError` naming
    the file and what is wrong with it; with ``on_unreadable="restart"`` the fit
    starts afresh instead, with a ``UserWarning`` naming the file, which it removes
    (and replaces with its own checkpoints). A folder that cannot be made or written
    is refused before training too.

    Parameters
    ----------
    path : str or os.PathLike
        The checkpoint file (written as given, ``.npz`` format), or a folder holding
        one file per fit.
    every : int, default=1
        Save at the end of every ``every``-th epoch (by ``n_iter_``).
    on_unreadable : {"raise", "restart"}, default="raise"
        What a fit does with a file at ``path`` that it cannot read: refuse it
        (``CheckpointError``), or start afresh and replace it, with a warning.

    Attributes
    ----------
    resumed_from_ : int or None
        The epoch the last fit went on from, None if it started afresh.
    saved_epochs_ : list of int
        The epochs saved by the last fit.

    Examples
    --------
    >>> from onnxgrad_sklearn.callbacks import Checkpoint
    >>> checkpoint = Checkpoint("fit.ckpt.npz", every=5)
    >>> # reg.set_callbacks(checkpoint).fit(X, y)  # killed? the same line goes on
    """

    def __init__(self, path, every=1, on_unreadable="raise"):
        _require_callback_api(type(self).__name__)
        if not isinstance(every, numbers.Integral) or every < 1:
            raise ValueError(f"every must be an integer >= 1, got {every!r}.")
        if on_unreadable not in ("raise", "restart"):
            raise ValueError(f"on_unreadable must be 'raise' or 'restart', got {on_unreadable!r}.")
        self.path = os.fspath(path)
        self.every = every
        self.on_unreadable = on_unreadable
        #: The file of the fit under way: ``path``, or in folder mode its own in it.
        self.file = self.path
        self._off = False  # folder mode: another fit writes this fit's file
        self._data = None  # what the fit under way was given (X, y, metadata)
        self._epochs = 0
        self._loaded = False  # folder mode: the fit was loaded from its finished file
        self.resumed_from_ = None
        self.saved_epochs_ = []
        self._locked = False

    @property
    def lock_path(self):
        """The lock a fit holds while it runs: its file's path + ``".lock"``."""
        return self.file + ".lock"

    @property
    def folder_mode(self) -> bool:
        """Whether ``path`` is a folder (it is one, or ends with a separator): one file
        per fit in it."""
        return os.path.isdir(self.path) or self.path.endswith(("/", os.sep))

    def setup(self, estimator, context):
        """Called by scikit-learn at the start of a fit: check ``path`` (its folder made
        if missing), then take the lock of a single file (in folder mode, of the fit's
        own file when the fit starts, :meth:`on_fit_task_begin`)."""
        self._check_path()
        if not self.folder_mode:
            if _in_cross_validation():
                raise CheckpointError(
                    f"Checkpoint({self.path!r}) keeps one file, which holds one fit, and "
                    "this fit is one of several (a search or cross-validation of "
                    "scikit-learn): give Checkpoint a folder, which keeps a file per fit "
                    "(Checkpoint('folder/'))."
                )
            self.file = self.path
            self._lock()

    def _check_path(self):
        """Make the folder of ``path`` (``path`` itself in folder mode) if missing;
        refuse one that cannot be written, before the fit trains."""
        if self.folder_mode:
            folder = os.path.abspath(self.path)
        else:
            folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(
                f"The folder {folder} of the checkpoint {self.path} cannot be made "
                f"({exc.strerror or exc}): give a path in a folder this process can write."
            ) from exc
        if not os.access(folder, os.W_OK):
            raise CheckpointError(
                f"The folder {folder} of the checkpoint {self.path} cannot be written: "
                "give a path in a folder this process can write."
            )

    def _lock(self):
        for _ in range(2):  # a stale lock is removed once, then taken
            try:
                fd = os.open(self.lock_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                pid = _lock_owner(self.lock_path)
                if pid is None or _pid_alive(pid):
                    who = "an unknown process" if pid is None else f"process {pid}"
                    if pid == os.getpid():
                        who += " (this one)"
                    raise ValueError(
                        f"The checkpoint {self.file} is being written by another fit "
                        f"({who} holds {self.lock_path}): two fits cannot write one "
                        "checkpoint at once. Wait for it to end, or give this fit another "
                        "path (remove the lock file if no fit runs)."
                    ) from None
                logger.warning(
                    "The lock %s was left by process %d, which no longer runs: taking it over.",
                    self.lock_path,
                    pid,
                )
                try:
                    os.remove(self.lock_path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as out:
                out.write(str(os.getpid()))
            self._locked = True
            return
        raise ValueError(f"Could not take the lock {self.lock_path} of the checkpoint.")

    def _unlock(self):
        if not self._locked:
            return
        self._locked = False
        if _lock_owner(self.lock_path) == os.getpid():
            try:
                os.remove(self.lock_path)
            except FileNotFoundError:
                pass

    def on_fit_task_begin(self, estimator, context, *, X=None, y=None, metadata=None):
        """Forget the previous fit at the start of a new one (its root task), and refuse
        a checkpoint of other parameters or other data before the fit trains."""
        if getattr(context, "task_name", None) == "fit":
            self.resumed_from_ = None
            self.saved_epochs_ = []
            self._loaded = False
            self._epochs = 0  # those this fit trained (none for partial_fit or L-BFGS)
            data = self._data = {"X": X, "y": y, "metadata": metadata}
            if self.folder_mode and not self._begin_in_folder(estimator, data):
                return
            if os.path.exists(self.file):
                self._compatible(estimator, data)

    def _begin_in_folder(self, estimator, data) -> bool:
        """Folder mode: the fit's own file, named by a digest of the estimator's
        parameters, the data and where the fit starts (a fit continuing a fitted model,
        ``warm_start``: that model's weights), and its lock; False when another fit holds
        that lock (the same fit twice at once): this fit trains without the file, warned."""
        start = None
        if getattr(estimator, "warm_start", False) and "_converted" in estimator.__dict__:
            start = fingerprint(list(estimator._converted.values))
        digests = {
            "params": _params_digests(estimator),
            "data": _data_digests(data),
            "start": start,
        }
        name = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()
        self.file = os.path.join(self.path, f"fit-{name[:24]}.npz")
        self._off = False
        try:
            self._lock()
        except ValueError:
            self._off = True
            warnings.warn(
                f"Another fit of the same parameters and data is writing {self.file}: this "
                "fit trains without the checkpoint.",
                UserWarning,
                stacklevel=2,
            )
            return False
        return True

    def _read(self):
        """The checkpoint's arrays and metadata; None when the file cannot be read and
        ``on_unreadable="restart"`` (warned, the file removed); a CheckpointError
        otherwise, naming what is wrong with the file."""
        try:
            return _read_checkpoint(self.file)
        except CheckpointError as exc:
            if self.on_unreadable != "restart":
                raise
            warnings.warn(
                f"{exc} The fit starts afresh (on_unreadable='restart'): the file is removed "
                "and replaced by this fit's checkpoints.",
                UserWarning,
                stacklevel=2,
            )
            try:
                os.remove(self.file)
            except FileNotFoundError:
                pass
            return None

    def _compatible(self, estimator, data):
        """The checkpoint's arrays and metadata (None: an unreadable file set aside,
        ``on_unreadable="restart"``); a ValueError when it is of a fit with other
        parameters or on other ``data`` (what was given to ``fit``)."""
        found = self._read()
        if found is None:
            return None
        arrays, meta = found
        params = _params_digests(estimator)
        differ = sorted(
            k for k in set(params) | set(meta["params"]) if params.get(k) != meta["params"].get(k)
        )
        if differ:
            raise ValueError(
                f"The checkpoint {self.file} is of a fit with other parameters (differing: "
                f"{', '.join(differ)}). Remove it, or fit with its parameters."
            )
        data = _data_digests(data)
        differ = [k for k in data if data[k] != meta["data"][k]]
        if differ:
            raise ValueError(
                f"The checkpoint {self.file} is of a fit on other data (differing: "
                f"{', '.join(differ)}). Remove it, or fit on its data. One file holds one "
                "fit: to checkpoint an estimator fitted several times (a search, "
                "cross-validation), give Checkpoint a folder, which keeps a file per fit."
            )
        return arrays, meta

    def resume_point(self, estimator):
        """The saved state the fit of ``estimator`` goes on from, or None.

        Called by the fit before its first epoch. Raises a ValueError when the file
        is a checkpoint of other parameters or other data.

        Parameters
        ----------
        estimator : BaseOrtGradient
            The estimator being fitted.

        Returns
        -------
        dict or None
        """
        if self._off or not os.path.exists(self.file):
            return None
        state = fit_state(estimator)
        found = self._compatible(estimator, state.data)
        if found is None:
            return None
        arrays, meta = found
        if meta.get("finished") and self.folder_mode:  # the fit's result: loaded
            logger.info("The fit is loaded from %s, which it finished.", self.file)
            self._loaded = True
        elif meta.get("finished"):
            logger.info(
                "The checkpoint %s is of a finished fit (epoch %s): starting afresh, "
                "it will be overwritten.",
                self.file,
                meta.get("final_epoch"),
            )
            return None
        if state.held_out and not isinstance(estimator.random_state, numbers.Integral):
            raise ValueError(
                f"The checkpoint {self.file} cannot be gone on from: the fit holds out "
                "validation rows at random, and random_state is not an integer, so the "
                "rows held out again would differ. Set random_state to an integer."
            )
        weights = [arrays[f"weight_{i}"] for i in range(meta["n_weights"])]
        optimizer = dict(meta["optimizer"])
        counts = optimizer.pop("counts")
        optimizer["state"] = [
            [arrays[f"state_{i}_{j}"] for j in range(n)] for i, n in enumerate(counts)
        ]
        mode = optimizer.pop("training_mode", None)
        if mode is not None:  # BatchNormalization's statistics, Dropout's random state
            optimizer["training_mode"] = _training_mode_read(mode, arrays)
        best = None
        if meta["n_best"] is not None:
            best = [arrays[f"best_{i}"] for i in range(meta["n_best"])]
        best_statistics = {  # BatchNormalization's running statistics of the best epoch
            name: arrays[f"best_statistic_{k}"]
            for k, name in enumerate(meta.get("best_statistics") or ())
        }
        rs = meta["random_state"]
        self.resumed_from_ = meta["fit"]["n_iter_"]
        return {
            **meta["fit"],
            "finished": bool(meta.get("finished")),
            "weights": weights,
            "optimizer_state": optimizer,
            "best_weights": best,
            "best_statistics": best_statistics or None,
            "order": arrays["order"],
            "random_state": (
                rs["name"],
                arrays["random_state_key"],
                rs["pos"],
                rs["has_gauss"],
                rs["cached_gaussian"],
            ),
        }

    def on_fit_task_end(self, estimator, context):
        """Save the fit's state at the end of every ``every``-th epoch; mark the
        checkpoint finished at the end of the fit (its root task)."""
        if getattr(context, "task_name", None) == "fit":
            if self.folder_mode:
                self._write_final(estimator)
            else:
                self._finish(estimator)
            return False
        if _is_epoch(context):
            self._epochs += 1
        if self._off or not _is_epoch(context) or estimator.n_iter_ % self.every:
            return False
        state = fit_state(estimator)
        if state is None or state.optimizer_state is None:
            return False
        self._write(estimator, state)
        self.saved_epochs_.append(estimator.n_iter_)
        return False

    def _write(self, estimator, state, finished=False):
        """Write the fit's state (``state``: its weights, optimizer state, best weights,
        order of the rows and data), with the estimator's counters, to the fit's file."""
        arrays = {}
        weights = state.weights()
        for i, w in enumerate(weights):
            arrays[f"weight_{i}"] = w
        optimizer = state.optimizer_state()
        for i, row in enumerate(optimizer["state"]):
            for j, value in enumerate(row):
                arrays[f"state_{i}_{j}"] = np.asarray(value)
        mode = optimizer.get("training_mode")
        if mode is not None:
            mode = _training_mode_written(mode, arrays)
        best = state.best_weights
        for i, w in enumerate(best or ()):
            arrays[f"best_{i}"] = w
        best_statistics = dict(state.best_statistics or {})
        for k, value in enumerate(best_statistics.values()):
            arrays[f"best_statistic_{k}"] = np.asarray(value)
        name, key, pos, has_gauss, cached = estimator._random_state.get_state()
        arrays["random_state_key"] = key
        arrays["order"] = np.asarray(state.order)

        def floats(values):
            return None if values is None else [float(v) for v in values]

        def number(value):
            return None if value is None else float(value)

        meta = {
            "version": _CHECKPOINT_VERSION,
            "written_by": f"onnxgrad-sklearn {__version__}",
            "params": _params_digests(estimator),
            "data": _data_digests(state.data),
            "n_weights": len(weights),
            "n_best": None if best is None else len(best),
            **({"best_statistics": list(best_statistics)} if best_statistics else {}),
            "optimizer": {
                "step": int(optimizer["step"]),
                "state_names": list(optimizer["state_names"]),
                "weight_names": list(optimizer["weight_names"]),
                "counts": [len(row) for row in optimizer["state"]],
                **({} if mode is None else {"training_mode": mode}),
            },
            "random_state": {
                "name": name,
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
            "finished": finished,
            **({"final_epoch": int(estimator.n_iter_)} if finished else {}),
            "fit": {
                "n_iter_": int(estimator.n_iter_),
                "t_": int(estimator.t_),
                "loss_": float(estimator.loss_),
                "loss_curve_": floats(estimator.loss_curve_),
                "_no_improvement_count": int(estimator._no_improvement_count),
                "best_loss_": number(estimator.best_loss_),
                "validation_scores_": floats(estimator.validation_scores_),
                "best_validation_score_": number(estimator.best_validation_score_),
                "learning_rate": float(estimator._schedule.learning_rate),
            },
        }
        arrays["meta"] = np.array(json.dumps(meta))
        self._save(arrays)

    def _write_final(self, estimator):
        """Folder mode: write the fit's final state, finished, for a later fit of the same
        parameters and data to load. A fit loaded from it, one without the file, and one
        that trained no epoch (``partial_fit``, whose calls a later ``fit`` must not
        take for a whole fit; L-BFGS) write nothing."""
        engine = estimator.__dict__.get("_engine")
        if self._off or self._loaded or not self._epochs or engine is None:
            return
        self._write(estimator, _FinalState(engine, self._data), finished=True)

    def clear(self):
        """Remove the checkpoint files: ``path``, or in folder mode every fit's file in it
        (not a file of a fit under way, whose lock is held).

        Returns
        -------
        list of str
            The files removed.
        """
        if self.folder_mode:
            folder = self.path
            names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
            files = [
                os.path.join(folder, f)
                for f in names
                if f.startswith("fit-") and f.endswith(".npz")
            ]
        else:
            files = [self.path] if os.path.exists(self.path) else []
        removed = []
        for path in files:
            owner = _lock_owner(path + ".lock")
            if owner is not None and _pid_alive(owner):
                continue
            os.remove(path)
            removed.append(path)
        return removed

    def _finish(self, estimator):
        """Mark the checkpoint this fit wrote or went on from as finished."""
        if (not self.saved_epochs_ and self.resumed_from_ is None) or not os.path.exists(self.file):
            return
        arrays, meta = _read_checkpoint(self.file)  # this fit's own
        meta["finished"] = True
        meta["final_epoch"] = int(estimator.n_iter_)
        arrays["meta"] = np.array(json.dumps(meta))
        self._save(arrays)

    def _save(self, arrays):
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        folder = os.path.dirname(os.path.abspath(self.file))
        temporary = os.path.join(folder, f".{os.path.basename(self.file)}.{os.getpid()}.tmp")
        with open(temporary, "wb") as out:
            out.write(buffer.getbuffer())
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.file)

    def teardown(self, estimator, context):
        """Called by scikit-learn at the end of a fit (also on an error): release the
        lock."""
        self._unlock()


def _in_cross_validation() -> bool:
    """Whether this fit is one of scikit-learn's cross-validation (``GridSearchCV``,
    ``cross_validate``...): their fits run in ``model_selection``'s ``_fit_and_score``,
    in this thread's stack (also in a loky worker)."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_fit_and_score" and "model_selection" in code.co_filename:
            return True
        frame = frame.f_back
    return False


class _FinalState:
    """What :meth:`Checkpoint._write` reads of a fit, at its end (folder mode): the
    engine's weights and optimizer state, no best weights or statistics (the final
    ones are the kept ones) and no order of the rows (a finished fit does not go on)."""

    best_weights = best_statistics = None
    order = np.zeros(0, dtype=np.intp)

    def __init__(self, engine, data):
        self.weights, self.optimizer_state, self.data = engine.get_weights, engine.get_state, data


#: What every checkpoint's metadata holds.
_META_KEYS = ("version", "params", "data", "n_weights", "n_best", "optimizer", "fit")


def _read_checkpoint(path):
    """``(arrays, meta)`` of the checkpoint file ``path`` (its metadata out of the
    arrays, then ``meta["arrays"]`` restored for a rewrite); a CheckpointError naming
    what is wrong with a file that is not a whole checkpoint this version reads."""

    def refuse(what):
        return CheckpointError(
            f"The checkpoint {path} {what}. Remove the file to start afresh, or pass "
            "Checkpoint(..., on_unreadable='restart'), which starts afresh and replaces it."
        )

    try:
        with open(path, "rb") as head:
            magic = head.read(4)
        if not magic:
            raise refuse("is empty")
        if magic != b"PK\x03\x04":  # every .npz archive starts so
            raise refuse("is not a checkpoint (not an .npz archive: overwritten, or another file)")
        with np.load(path, allow_pickle=False) as saved:
            arrays = {k: saved[k] for k in saved.files}
    except CheckpointError:
        raise
    except (zipfile.BadZipFile, EOFError) as exc:
        raise refuse(f"is truncated or not a checkpoint ({exc})") from None
    except ValueError:  # numpy: an array of Python objects (pickled), another format
        raise refuse("is not a checkpoint (it holds objects, not arrays)") from None
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc})") from None
    try:
        meta = json.loads(str(arrays.pop("meta")))
    except (KeyError, ValueError):
        raise refuse("is not a checkpoint of onnxgrad_sklearn (no metadata)") from None
    if not isinstance(meta, dict) or "version" not in meta:
        raise refuse("is not a checkpoint of onnxgrad_sklearn (no format version)")
    if meta["version"] != _CHECKPOINT_VERSION:
        writer = meta.get("written_by", "another version of onnxgrad-sklearn")
        raise refuse(
            f"was written by {writer} with format {meta['version']}; this version "
            f"(onnxgrad-sklearn {__version__}) reads format {_CHECKPOINT_VERSION}"
        )
    missing = [k for k in _META_KEYS if k not in meta]
    if missing:
        raise refuse(f"is not a whole checkpoint (its metadata has no {', '.join(missing)})")
    arrays["meta"] = np.array(json.dumps(meta))
    return arrays, meta


def _lock_owner(path):
    """The process id a lock file holds, or None (unreadable, or being written)."""
    for attempt in range(3):
        try:
            with open(path) as lock:
                return int(lock.read().strip())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            time.sleep(0.05 * (attempt + 1))  # created, its pid not written yet
    return None


def _pid_alive(pid) -> bool:
    """Whether the process ``pid`` runs (on Windows, always assumed)."""
    if os.name == "nt":  # os.kill would end it there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it runs, as another user
        return True
    return True


def _training_mode_written(mode, arrays) -> dict:
    """A training-mode model's running statistics and masks' random state
    (``RunState.get``): the arrays put into ``arrays``, the rest returned for the
    checkpoint's metadata."""
    for k, value in enumerate(mode["statistics"].values()):
        arrays[f"statistic_{k}"] = np.asarray(value)
    name, key, pos, has_gauss, cached = mode["mask_random_state"]
    arrays["mask_random_state_key"] = key
    return {
        "statistics": list(mode["statistics"]),
        "mask_random_state": {
            "name": name,
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }


def _training_mode_read(mode, arrays) -> dict:
    """What :func:`_training_mode_written` wrote, as ``RunState.set`` takes it."""
    rng = mode["mask_random_state"]
    return {
        "statistics": {name: arrays[f"statistic_{k}"] for k, name in enumerate(mode["statistics"])},
        "mask_random_state": (
            rng["name"],
            arrays["mask_random_state_key"],
            rng["pos"],
            rng["has_gauss"],
            rng["cached_gaussian"],
        ),
    }
