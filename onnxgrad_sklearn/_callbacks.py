"""scikit-learn's callbacks (``sklearn.callback``, SLEP023) in the fit loops.

scikit-learn 1.9 gives estimators ``set_callbacks`` (``CallbackSupportMixin``) and
reports to the callbacks through a tree of tasks (``CallbackContext``). Here the
root task is ``"fit"`` and its only subtasks are the epochs (``"epoch"``) or the
L-BFGS iterations (``"lbfgs-iter"``, as LogisticRegression names them); a
``partial_fit`` call is one ``"fit"`` task without subtasks (as StandardScaler's).
Each task receives the ``X``, ``y`` (and ``sample_weight`` as metadata) given to
the fit and, for the callbacks that ask for it, a ``fitted_estimator``: a copy of
the estimator that predicts with the weights of that point, built only when a
callback's hook takes it. A callback whose ``on_fit_task_end`` returns True stops
the fit after that epoch or iteration.

With scikit-learn older than 1.9 there is no ``sklearn.callback``: the mixin is
empty, ``with_callbacks`` returns the method itself, and no task is made. A fit
with no callback set makes no task either: the loops see :data:`NO_TASK`, whose
calls do nothing.
"""

from __future__ import annotations

import copy

import numpy as np

from ._fit import NO_TASK, nested_validation_skipped
from ._model import fed_sessions, store_weights

try:  # scikit-learn >= 1.9
    from sklearn.callback import CallbackSupportMixin, with_callbacks
except ImportError:  # scikit-learn < 1.9: no callback API, the estimators work as before

    class CallbackSupportMixin:  # type: ignore[no-redef]
        """Stands in for scikit-learn's mixin where scikit-learn has no callbacks."""

    def with_callbacks(method):  # type: ignore[no-redef]
        """Stands in for scikit-learn's decorator: the method itself."""
        return method


__all__ = [
    "CallbackSupportMixin",
    "NO_TASK",
    "callbacks_of",
    "FitState",
    "fit_state",
    "fit_task",
    "fitted_copy",
    "holds_out_validation",
    "shallow_state",
    "take_fitted_copy",
    "uses_validation_data",
    "with_callbacks",
]

#: What scikit-learn's callback machinery keeps on an estimator during its fit; a
#: copy of the estimator (a ``fitted_estimator``) does not take it along.
_CONTEXT_ATTRIBUTES = (
    "_callback_fit_ctx",
    "_skl_callbacks_to_teardown",
    "_parent_callback_ctx",
    "_callback_fit_state",
)

#: Attributes the fit loops change in place: a copy gets its own.
_LISTS = ("loss_curve_", "validation_scores_")
_MISSING = object()


def callbacks_of(estimator) -> list:
    """The callbacks set on ``estimator`` (``set_callbacks``), propagated ones included."""
    return list(estimator.__dict__.get("_skl_callbacks", ()))


def uses_validation_data(estimator) -> bool:
    """Whether a callback of ``estimator`` says it reads the validation scores.

    Such a callback has a true ``uses_validation_data`` attribute: it lets ``fit``
    take ``X_val`` and ``y_val`` without ``early_stopping``, and then
    ``validation_scores_`` records the score on them at each epoch.
    """
    return any(getattr(cb, "uses_validation_data", False) for cb in callbacks_of(estimator))


def holds_out_validation(estimator) -> bool:
    """Whether a callback of ``estimator`` asks for a held-out validation split.

    Such a callback has a true ``holds_out_validation`` attribute: a stochastic
    ``fit`` given no ``X_val`` then holds out ``validation_fraction`` of the rows
    (the split ``early_stopping=True`` makes, the same rows) and trains on the rest.
    """
    return any(getattr(cb, "holds_out_validation", False) for cb in callbacks_of(estimator))


class FitState:
    """What an epoch-by-epoch fit shows its callbacks beyond scikit-learn's context.

    :func:`fit_state` gives it, during the fit only (None otherwise).

    Parameters
    ----------
    weights : callable
        Returns copies of the trained weights as they are now.
    validation : tuple or None
        ``(X_val, y_val, sample_weight_val)`` as given to ``fit``, or the rows held
        out from the data given to ``fit`` (``validation_fraction``), indexed as given;
        None when there is no validation set.

    Attributes
    ----------
    final_weights : list of ndarray or None
        Set by a callback: the weights the fit ends with (they replace the built-in
        early stopping's best epoch); None keeps the fit's own.
    held_out : bool
        Whether ``validation`` are rows held out of those given to ``fit``.
    data : dict
        ``X``, ``y`` and ``metadata`` given to ``fit``, as the tasks receive them.
    optimizer_state : callable or None
        Returns the optimizer's state (``TrainingEngine.get_state``).
    order : ndarray or None
        The order of the training rows in the current epoch (its shuffle).
    best_weights : list of ndarray or None
        With ``early_stopping=True``, the weights of the best epoch so far.
    """

    def __init__(self, weights, validation, held_out=False, data=None):
        self.weights = weights
        self.validation = validation
        self.final_weights = None
        self.held_out = held_out
        self.data = data or {}
        self.optimizer_state = None
        self.order = None
        self.best_weights = None
        self.best_statistics = None


def fit_state(estimator):
    """The :class:`FitState` of the fit of ``estimator`` under way, or None."""
    return estimator.__dict__.get("_callback_fit_state")


#: Set on an estimator by a task's reconstruction (:meth:`FitTask._fitted`): the
#: ``fitted_estimator`` already made (:func:`fitted_copy`), which the copy scikit-learn
#: makes next (``copy.copy``, then the reconstruction's attributes set) returns as it
#: is (:func:`take_fitted_copy`). Taken by that copy, or by the task after the
#: callbacks' call.
_FITTED_COPY = "_onnxgrad_fitted_copy"

#: Set on an estimator by :func:`shallow_state` when its copy shares the random state
#: the fit shows: the fit then draws from a copy of its own
#: (:meth:`FitTask.random_state_shared`), which leaves the copy's as it was.
_RNG_SHARED = "_onnxgrad_rng_shared"


def shallow_state(estimator, optimizer_state=True, own=()) -> dict:
    """The ``__dict__`` of a shallow copy of ``estimator`` that can train on its own.

    What pickling keeps, without serialising the ONNX models or making sessions
    again: the training engine is left out (its optimizer state kept as arrays
    when ``optimizer_state``), and so is scikit-learn's callback context. What a
    fit changes in place is copied: the lists of the loops, the converted template
    (whose model a fit replaces) and ``estimator_`` (whose weights it replaces; its
    arrays are shared, never written into). The ONNX models and the predict
    sessions are shared: a fit replaces them. So is the random state: a fit draws
    from a copy of its own (``Fit._rng``), never from one an estimator holds.
    ``own``: the names of the attributes the caller replaces (not copied here).
    """
    from .templates import _copy_sharing_arrays

    state = dict(estimator.__dict__)
    for name in _CONTEXT_ATTRIBUTES:
        state.pop(name, None)
    state.pop(_RNG_SHARED, None)
    state.pop(_FITTED_COPY, None)
    if isinstance(state.get("_random_state"), np.random.RandomState):
        estimator.__dict__[_RNG_SHARED] = True  # shared: a fit under way draws from a copy
    engine = state.pop("_engine", None)
    if engine is not None and optimizer_state:
        state["_optimizer_state"] = engine.get_state()
    for name in _LISTS:
        if isinstance(state.get(name), list):
            state[name] = list(state[name])
    if "_converted" in state and "_converted" not in own:
        state["_converted"] = state["_converted"].copy()
    if "estimator_" in state and "estimator_" not in own:
        state["estimator_"] = _copy_sharing_arrays(state["estimator_"])
    if "_schedule" in state:  # a few floats
        state["_schedule"] = copy.copy(state["_schedule"])
    return state


def fitted_copy(estimator, weights, attributes=None, statistics=None):
    """A copy of ``estimator`` that predicts with ``weights``, and its attributes that
    differ from the estimator's: ``(copy, attributes)``.

    The copy is what :func:`shallow_state` gives (it can train on its own), in the
    fitted state ``fit`` would have left had it stopped here: the ONNX model,
    ``estimator_`` with ``weights`` written in, the counters and curves so far,
    overridden by ``attributes``; no callbacks. It makes its predict sessions when it
    first predicts. ``statistics``: the running statistics of BatchNormalization
    trained in training mode, by name.

    scikit-learn's ``fitted_estimator`` is ``copy.copy(estimator)`` given the
    attributes: the copy, when the estimator holds it (:data:`_FITTED_COPY`).
    """
    from .templates import copy_for_weights

    new = object.__new__(type(estimator))
    state = new.__dict__
    state.update(shallow_state(estimator, own=("_converted", "estimator_")))
    state.update(attributes or {})
    state["_converted"] = estimator._converted.copy()
    state["estimator_"] = copy_for_weights(estimator.estimator_)
    # no session is made here: the copy predicts through the process's session of its
    # graph, fed its weights (FedSession, made once); else its own, made when it first
    # predicts. A callback that does not predict (one that saves the copy) pays for none.
    store_weights(new, weights, sessions=False, statistics=statistics)
    state.update(fed_sessions(new))  # the process's sessions, fed these weights
    located = state.get("_export_converted")
    if located is not None:  # converted for the export once per fit, not once per epoch
        estimator.__dict__.setdefault("_export_converted", located)
    # A copy has no callbacks: pickled, it would take them along, and with them every
    # copy a callback keeps.
    state["_skl_callbacks"] = []
    given = estimator.__dict__
    return new, {k: v for k, v in state.items() if given.get(k, _MISSING) is not v}


def take_fitted_copy(estimator):
    """The copy :meth:`FitTask._fitted` made for the ``copy.copy`` that follows it
    (None: none), taken off the estimator."""
    return estimator.__dict__.pop(_FITTED_COPY, None)


class FitTask:
    """The root task of one fit and its subtasks, reported to the callbacks.

    The hooks run with scikit-learn's nested parameter validation skipped, as in
    scikit-learn's own estimators: the subtasks' inside the loops
    (``_fit._as_scikit_learn_fits``), the root task's here.

    Parameters
    ----------
    estimator : BaseOrtGradient
        The estimator being fitted.
    X, y, metadata :
        What each task gives the callbacks: the data given to ``fit`` and
        ``{"sample_weight": ...}`` (None without sample weights).
    max_subtasks : int
        The most epochs or iterations the fit can run (0 for ``partial_fit``).
    validation : tuple or None
        ``(X_val, y_val, sample_weight_val)`` given to ``fit``, or None.
    """

    def __init__(self, estimator, X, y, metadata, max_subtasks, validation=None):
        self.estimator = estimator
        self.data = {"X": X, "y": y, "metadata": metadata}
        self.validation = validation
        self.root = estimator._init_callback_context(task_name="fit", max_subtasks=max_subtasks)
        with nested_validation_skipped():
            self.root.call_on_fit_task_begin(estimator=estimator, **self.data)
        self.leaf = max_subtasks == 0  # partial_fit: its one epoch is the task itself
        self.current = None

    def show(self, attributes) -> None:
        """Show the callbacks the fit's progress: ``attributes`` (the fitted attributes
        as the fit would leave them now) set on the estimator they are given."""
        self.estimator.__dict__.update(attributes)

    def _fitted(self, weights, attributes):
        """``reconstruction_attributes``: evaluated by scikit-learn only when a hook
        takes ``fitted_estimator``."""

        def reconstruct():
            found = weights()  # the weights, or (the weights, the running statistics)
            if isinstance(found, tuple):
                new, changed = fitted_copy(self.estimator, found[0], attributes, found[1])
            else:
                new, changed = fitted_copy(self.estimator, found, attributes)
            # the copy scikit-learn makes next (copy.copy) is this one
            self.estimator.__dict__[_FITTED_COPY] = new
            return changed

        return reconstruct

    def begin(self, name, weights, attributes=None) -> None:
        """Begin a subtask ``name``; ``weights()`` gives the weights at its start,
        ``attributes`` the fitted attributes that differ from the estimator's now."""
        if self.leaf:
            return
        self.current = self.root.subcontext(task_name=name)
        try:
            self.current.call_on_fit_task_begin(
                estimator=self.estimator,
                **self.data,
                reconstruction_attributes=self._fitted(weights, attributes),
            )
        finally:
            self.estimator.__dict__.pop(_FITTED_COPY, None)

    def end(self, weights, attributes=None) -> bool:
        """End the current subtask; return whether a callback asks the fit to stop."""
        if self.leaf:
            return False
        context, self.current = self.current, None
        try:
            return context.call_on_fit_task_end(
                estimator=self.estimator,
                **self.data,
                reconstruction_attributes=self._fitted(weights, attributes),
            )
        finally:
            self.estimator.__dict__.pop(_FITTED_COPY, None)

    def close(self) -> None:
        """End a subtask begun but never run (after the last L-BFGS iteration, a
        divergence) as an empty task, so that every begin has its end."""
        if self.current is not None:
            context, self.current = self.current, None
            context.call_on_fit_task_end(estimator=self.estimator)

    def expose(self, weights, held_rows, incremental=False):
        """Show the callbacks a :class:`FitState` (``fit_state(estimator)``) until
        :meth:`conceal`; ``held_rows``: the indices of the rows held out of the data
        given to ``fit`` (None: none). Return it."""
        validation = self.validation
        if validation is None and held_rows is not None:
            validation = _held_out(self.data, held_rows)
        held_out = self.validation is None and held_rows is not None
        state = FitState(weights, None if incremental else validation, held_out, self.data)
        self.estimator.__dict__["_callback_fit_state"] = state
        return state

    def resume(self):
        """The saved state a callback's ``resume_point(estimator)`` gives the fit to go
        on from (the first that is not None), or None."""
        if self.leaf:
            return None
        for callback in callbacks_of(self.estimator):
            point = getattr(callback, "resume_point", None)
            saved = None if point is None else point(self.estimator)
            if saved is not None:
                return saved
        return None

    def random_state_shared(self) -> bool:
        """Whether a copy of the estimator (a ``fitted_estimator``) has shared the random
        state the fit shows since the last call: the fit then draws from a copy of its
        own (100-200 us), so that the copy keeps the state it was given. Callbacks that
        take no copy cost no copy."""
        return bool(self.estimator.__dict__.pop(_RNG_SHARED, False))

    def conceal(self) -> None:
        """Take the :class:`FitState` away: the fit is over."""
        self.estimator.__dict__.pop("_callback_fit_state", None)
        self.estimator.__dict__.pop(_RNG_SHARED, None)

    def finish(self) -> None:
        """End the root task: its ``fitted_estimator`` is the fitted estimator."""
        with nested_validation_skipped():  # after the loops, as inside them
            self.close()
            self.root.call_on_fit_task_end(
                estimator=self.estimator, **self.data, reconstruction_attributes={}
            )
        self.estimator.__dict__.pop(_RNG_SHARED, None)  # the fit is over: nothing draws


def _held_out(data, rows):
    """``(X_val, y_val, sample_weight_val)``: the rows ``rows`` of the data given to fit."""
    from sklearn.utils import _safe_indexing

    X, y, metadata = data["X"], data["y"], data["metadata"]
    if not hasattr(X, "shape") and not isinstance(X, list):  # a dask collection
        return None
    sample_weight = None if metadata is None else metadata["sample_weight"]
    if sample_weight is not None:
        sample_weight = np.asarray(sample_weight)[rows]
    return _safe_indexing(X, rows), _safe_indexing(y, rows), sample_weight


def fit_task(estimator, X, y, sample_weight, max_subtasks, validation=None):
    """The tasks of a fit of ``estimator``: :class:`FitTask`, or :data:`NO_TASK`
    when no callback is set (or scikit-learn has no callback API). ``validation``:
    ``(X_val, y_val, sample_weight_val)`` given to ``fit``, or None."""
    if not callbacks_of(estimator) or not hasattr(estimator, "_init_callback_context"):
        return NO_TASK
    metadata = None if sample_weight is None else {"sample_weight": sample_weight}
    return FitTask(estimator, X, y, metadata, max_subtasks, validation)
