"""The estimator shared by the regressor and the classifier: its parameters, ``fit`` (set
up by :mod:`._setup`, trained by a :class:`~._fit.Fit`), pickling, and the entry points
of prediction and export (:mod:`._model`)."""

from __future__ import annotations

import functools
import logging
import numbers
import warnings

import numpy as np
from sklearn.base import BaseEstimator, is_classifier
from sklearn.utils import get_tags
from sklearn.utils._param_validation import HasMethods, Interval, Options, StrOptions
from sklearn.utils.validation import check_is_fitted

from . import _model, _setup
from ._callbacks import (
    CallbackSupportMixin,
    fit_task,
    holds_out_validation,
    shallow_state,
    take_fitted_copy,
)
from ._data import (
    MemoryRows,
    dask_input,
    is_rows,
    smooth_penalty,
)
from ._fit import PROGRESS, SETTINGS, Fit
from ._frames import (
    join_head,
)
from ._hashing import fingerprint
from ._inputs import template_input
from ._lazy import lazy
from .exceptions import ConvergenceError
from .families import family_of
from .losses import BaseLoss, get_loss
from .onnx_template import OnnxModelConstraint, OnnxTemplate, is_onnx_model
from .optim import OPTIMIZER_NAMES, SGD, BaseOptimizer, LearningRateSchedule, get_optimizer
from .runtime import (
    intra_op_threads,
)
from .templates import (
    ConvertedTemplate,
    export_model,
    final_estimator,
    trained_view,
)

# imported on first use (``import onnxgrad_sklearn`` does not import onnx)
onnx = lazy("onnx")

#: A fitted estimator's exported model made when first needed (kept here: pickles
#: written before the fitted model had its own module name it here).
DEFERRED = _model.DEFERRED


logger = logging.getLogger("onnxgrad_sklearn")


class BaseOrtGradient(CallbackSupportMixin, BaseEstimator):
    """Common parameters, fit loop and ONNX export of the estimators.

    With scikit-learn >= 1.9, ``set_callbacks`` sets scikit-learn's callbacks
    (``sklearn.callback``): see ``_callbacks.py`` and docs/callbacks.md.
    """

    #: Whether predict runs the trained graph (a classifier's logits) rather than the
    #: exported model (a regressor's, a GLM's with its link): the session made at the end
    #: of a fit (``_model.make_sessions``); the other is made when first needed.
    _predicts_from_trained_graph = False

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit", "predict"]), OnnxTemplate, OnnxModelConstraint(), None],
        "loss": [StrOptions(set()), BaseLoss],
        "optimizer": [StrOptions({"auto", *OPTIMIZER_NAMES}), BaseOptimizer],
        "learning_rate": [StrOptions({"constant", "invscaling", "adaptive"})],
        "learning_rate_init": [Interval(numbers.Real, 0, None, closed="neither")],
        "power_t": [Interval(numbers.Real, 0, None, closed="left")],
        "alpha": [StrOptions({"auto"}), Interval(numbers.Real, 0, None, closed="left")],
        "l1_ratio": [StrOptions({"auto"}), Interval(numbers.Real, 0, 1, closed="both")],
        "batch_size": [StrOptions({"auto"}), Interval(numbers.Integral, 1, None, closed="left")],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "shuffle": ["boolean"],
        "random_state": ["random_state"],
        "tol": [Interval(numbers.Real, 0, None, closed="left")],
        "n_iter_no_change": [
            Interval(numbers.Integral, 1, None, closed="left"),
            Options(numbers.Real, {np.inf}),
        ],
        "early_stopping": ["boolean"],
        "validation_fraction": [Interval(numbers.Real, 0, 1, closed="neither")],
        "warm_start": ["boolean"],
        "verbose": ["verbose"],
        "device": [str],
        "on_divergence": [StrOptions({"raise", "warn"})],
        "backend": [StrOptions({"auto", "agent", "standard"})],
        "dtype": [StrOptions({"float32", "float64"}), None],
        "n_jobs": [
            Interval(numbers.Integral, 1, None, closed="left"),
            Interval(numbers.Integral, None, -1, closed="right"),
            None,
        ],
        "sync_every": [Interval(numbers.Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        estimator=None,
        *,
        loss="auto",
        optimizer="auto",
        learning_rate="constant",
        learning_rate_init=0.001,
        power_t=0.5,
        alpha="auto",
        l1_ratio="auto",
        batch_size="auto",
        max_iter=200,
        shuffle=True,
        random_state=None,
        tol=1e-4,
        n_iter_no_change=10,
        early_stopping=False,
        validation_fraction=0.1,
        warm_start=False,
        verbose=0,
        device="cpu",
        on_divergence="raise",
        backend="auto",
        dtype="float32",
        n_jobs=None,
        sync_every=1,
    ):
        self.estimator = estimator
        self.loss = loss
        self.optimizer = optimizer
        self.learning_rate = learning_rate
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.alpha = alpha
        self.l1_ratio = l1_ratio
        self.batch_size = batch_size
        self.max_iter = max_iter
        self.shuffle = shuffle
        self.random_state = random_state
        self.tol = tol
        self.n_iter_no_change = n_iter_no_change
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.warm_start = warm_start
        self.verbose = verbose
        self.device = device
        self.on_divergence = on_divergence
        self.backend = backend
        self.dtype = dtype
        self.n_jobs = n_jobs
        self.sync_every = sync_every

    def _stochastic(self):
        """Whether ``partial_fit`` is available: not with a full-batch optimizer."""
        try:
            optimizer = get_optimizer("adam" if self.optimizer == "auto" else self.optimizer)
        except ValueError:  # an invalid optimizer: fit will say why
            return True
        return not optimizer.full_batch

    # hooks for subclasses ------------------------------------------------
    def _default_estimator(self):
        raise NotImplementedError

    def _validate_targets(self, y, first_call, incremental=False, classes=None):
        """Return float targets for the loss and the fitted attributes they imply.

        Returns ``(y2d, fitted)``: ``y2d`` of shape (n_samples, n_targets), cast
        to the training dtype by the caller, and a
        dict of attributes (the classifier's ``classes_``) set only once every
        check has passed.
        """
        raise NotImplementedError

    def _n_model_outputs(self, y2d):
        """Number of columns the trained graph predicts."""
        return y2d.shape[1]

    def _adjust_sample_weight(self, y2d, sample_weight, fitted):
        return sample_weight

    def _setup_template(self, est, fine_tuned, fitted, loss):
        """Complete a prepared template for ``loss`` (the classifier sets its classes here)."""

    def _trained_view(self, est):
        """The model whose graph is trained (a classifier's logits, a GLM's linear predictor)."""
        return trained_view(est)

    def _resolve_loss(self, loss):
        """The loss to train with, once the template is known."""
        return loss

    def _stratify(self, y2d):
        return None

    def _score_validation(self, X, y, sample_weight, prediction):
        raise NotImplementedError

    # pickling ------------------------------------------------------------
    def __getstate__(self):
        # Runtime sessions and OrtValues are not pickled: they are rebuilt on
        # first use. The optimizer state is kept as numpy arrays, models as bytes
        # (a ConvertedTemplate: its skeleton's bytes and the weights as arrays, so
        # that neither pickling nor unpickling needs onnx).
        state = dict(super().__getstate__())
        engine = state.pop("_engine", None)
        state.pop("_given_onnx", None)
        if type(state.get("estimator")).__name__ == "ModelProto":  # kept as its bytes
            state["estimator"] = state["estimator"].SerializeToString()
        state.pop("_session", None)
        state.pop("_logit_session", None)
        if engine is not None:
            state["_optimizer_state"] = engine.get_state()
        if state.get("_export_model") not in (None, DEFERRED) and not isinstance(
            state["_export_model"], ConvertedTemplate
        ):
            state["_export_model"] = state["_export_model"].SerializeToString()
        return state

    def __copy__(self):
        # A shallow copy, as copy.copy of the pickled state would be, without
        # serialising the ONNX models or making sessions again: scikit-learn's
        # callbacks copy the estimator at each epoch (their ``fitted_estimator``).
        # A task's fitted_estimator: the copy its reconstruction made just before.
        new = take_fitted_copy(self)
        if new is None:
            new = object.__new__(type(self))
            new.__dict__.update(shallow_state(self))
        return new

    def __setstate__(self, state):
        state = dict(state)
        if isinstance(state.get("_export_model"), bytes):  # an ONNX model of its own
            state["_export_model"] = onnx.load_from_string(state["_export_model"])
        super().__setstate__(state)
        if "_export_model" in state:
            _model.make_sessions(self)

    # parameters -------------------------------------------------------------
    def set_params(self, **params):
        """Set parameters, including nested ones such as ``optimizer__momentum``.

        A nested parameter of an optimizer or loss given by name (``"nesterov"``)
        turns the name into its object (``Nesterov()``) first.

        Parameters
        ----------
        **params : dict
            Estimator parameters.

        Returns
        -------
        self
        """
        for name, resolve in (("optimizer", get_optimizer), ("loss", get_loss)):
            if any(key.startswith(name + "__") for key in params):
                value = params.get(name, getattr(self, name))
                if isinstance(value, str):
                    params[name] = resolve(value)
        return super().set_params(**params)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        final = final_estimator(self._template())
        # The estimator's own type comes from the tags being built: is_classifier(self)
        # would build them again, recursively.
        multi = _multi_output(final) and tags.estimator_type != "classifier"
        tags.target_tags.multi_output = multi
        tags.input_tags.sparse = True  # batches and chunks are densified one at a time
        tags.input_tags.allow_nan = False
        return tags

    # fit ------------------------------------------------------------------
    def _template(self):
        given = self.estimator
        if given is None:
            return self._default_estimator()
        if is_onnx_model(given):  # an ONNX model itself: OnnxTemplate(model), made once
            found = self.__dict__.get("_given_onnx")
            if found is None or found[0] is not given:
                found = self.__dict__["_given_onnx"] = (given, OnnxTemplate(given))
            return found[1]
        return given

    def _fit(self, X, y, sample_weight=None, incremental=False, classes=None, validation=None):
        """Validate, initialise, train. ``validation``: ``(X_val, y_val,
        sample_weight_val)`` given to ``fit`` (None: none given)."""
        if not is_rows(X) and dask_input(X, y, sample_weight):
            from ._dask import fit_dask  # on a cluster's workers, or computed here

            return fit_dask(self, X, y, sample_weight, incremental, classes, validation)
        first_call = not ((self.warm_start or incremental) and hasattr(self, "_converted"))
        # what the callbacks receive, as given (a dask collection for rows on a cluster)
        given = (X.collection if is_rows(X) else X, y, sample_weight)
        given_validation = None if validation is None or validation[0] is None else validation
        # Until training starts, a failure (bad input, a loss that cannot be built)
        # puts every attribute back: the estimator stays as it was (validate_data
        # records the features at once, _initialize replaces the fitted state).
        before = dict(self.__dict__)
        try:
            X, y2d, sample_weight, fitted, loss, optimizer = _setup.validate_fit_input(
                self, X, y, sample_weight, first_call, incremental, classes
            )
            validation = _setup.validate_validation_data(
                self, validation, y2d, fitted, optimizer, X
            )
            if first_call:
                _setup.initialize(self, X, y2d, fitted, loss)
            _setup.check_batches_needed(self, optimizer)
            if first_call or not incremental or not hasattr(self, "_template_penalty"):
                # partial_fit keeps the rows of its first call: one engine for every call
                self._template_penalty = _setup.templates_penalty(
                    self,
                    X.shape[0],
                    optimizer.full_batch,
                    held_out=validation is None and not incremental,
                )
            self._penalty = _setup.resolve_penalty(self)
            self._loss_ = loss
            loss = self._resolve_loss(loss)
            full_batch = optimizer.full_batch  # the engine then only gives loss and gradients
            engine = self._get_engine(
                loss,
                SGD() if full_batch else optimizer,
                reset=not incremental,
                # L-BFGS-B adds the L1 part itself, over bound-constrained variables
                penalty=smooth_penalty(self._penalty) if full_batch else self._penalty,
            )
            # scikit-learn's callbacks: one task per epoch or L-BFGS iteration, none for
            # partial_fit's one epoch (NO_TASK without callbacks); their setup may refuse
            # the fit (a Checkpoint's lock held by another fit)
            subtasks = 0 if incremental else self.max_iter + (1 if full_batch else 0)
            task = fit_task(self, *given, max_subtasks=subtasks, validation=given_validation)
        except BaseException:
            # scikit-learn's callback bookkeeping stays: it tears the callbacks down
            kept = {k: self.__dict__[k] for k in _CALLBACK_STATE if k in self.__dict__}
            self.__dict__.clear()
            self.__dict__.update(before, **kept)
            raise
        # what the estimator goes back to should training fail (it holds the previous
        # fit's ONNX model and sessions: only what costs no second copy of the weights)
        fallback = _fallback(before, first_call, engine)
        del before
        # The previous fit's predict sessions (a copy of the weights each) go before
        # training: made again at its end, or by predict should the fit stop half-way.
        self._session = self._logit_session = None
        _model.release_trained_values(self, engine)
        rows = X if is_rows(X) else MemoryRows(X, y2d, sample_weight)
        fit = self._new_fit(rows, engine, loss, optimizer, task, incremental, validation)
        try:
            if full_batch:
                fit.run_lbfgs()
            else:
                fit.run_epochs()
        except (KeyboardInterrupt, ConvergenceError):
            # documented: Ctrl-C keeps the last completed batch (MLPRegressor's rule),
            # on_divergence="raise" the last finite weights
            self._end_fit(fit, engine, incremental)
            raise
        except BaseException as exc:  # a callback's error, a lost dask worker...
            engine.release_sessions()
            self._go_back(fallback, exc)
            raise
        self._end_fit(fit, engine, incremental)
        task.finish()
        return self

    def _end_fit(self, fit, engine, incremental):
        """Read the fit's results and store its weights (the fitted model)."""
        self.__dict__.update(fit.progress())
        if not incremental:  # partial_fit goes on in the same sessions at its next call
            engine.release_sessions()
        _model.store_weights(self, engine.get_weights(), statistics=engine.statistics())

    def _go_back(self, fallback, exc):
        """After a fit that failed while training: the previous model (``fallback``), or
        unfitted; the exception says which."""
        kept = {k: self.__dict__[k] for k in _CALLBACK_STATE if k in self.__dict__}
        previous = fallback is not None and "_converted" in fallback
        if fallback is None:  # keeping the previous model would have cost a copy
            fallback = self.get_params(deep=False)
            if "_skl_callbacks" in self.__dict__:  # set_callbacks: a setting, not a result
                fallback["_skl_callbacks"] = self.__dict__["_skl_callbacks"]
        self.__dict__.clear()
        self.__dict__.update(fallback, **kept)
        if previous:
            _model.make_sessions(self)
        what = (
            "it keeps the model of its previous fit"
            if previous
            else "it is unfitted (call fit again)"
        )
        note = f"{type(self).__name__}: the fit did not complete, so {what}."
        if hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(note)
        logger.warning(note)

    def _new_fit(self, rows, engine, loss, optimizer, task, incremental, validation) -> Fit:
        """The :class:`~onnxgrad_sklearn._fit.Fit` of this call: the estimator's settings,
        its fitted counters to go on from, the engine and the rows."""
        penalty = self._penalty
        return Fit(
            {name: getattr(self, name) for name in SETTINGS},  # as get_params reads them
            {name: self.__dict__[name] for name in PROGRESS if name in self.__dict__},
            engine=engine,
            rows=rows,
            loss=loss,
            optimizer=optimizer,
            penalty=penalty,
            penalized=self._penalized_mask(),
            recipe=self._engine_recipe(),
            threads=self._intra_op_threads,
            score_validation=self._score_validation,
            stratify=self._stratify,
            name=type(self).__name__,
            classifier=is_classifier(self),
            task=task,
            incremental=incremental,
            validation=validation,
            holds_out=holds_out_validation(self),
        )

    def _penalized_mask(self):
        """Whether each trained weight is penalised."""
        conv = self._converted
        return [conv.params[k].penalized for k in self._trained_indices()]

    def _objective(self, final):
        """The loss: the estimator's ``loss``, or with ``"auto"`` the template's own."""
        family = family_of(final)
        loss = get_loss(family.loss_for(final, self._task) if self.loss == "auto" else self.loss)
        # None: a custom loss, for any task; the template's own loss fits it by definition
        task = getattr(loss, "task", None)
        if self.loss != "auto" and task is not None and not family.serves(task):
            raise ValueError(
                f"loss={self.loss!r} is a {task} loss and {type(final).__name__} a "
                f"{family.task} model: use loss='auto' (the template's own loss) or a "
                f"{family.task} loss."
            )
        if (
            task == "classification"
            and loss.gives_proba
            and not family.gives_proba(final)
            and self.loss != "auto"
        ):
            raise ValueError(
                f"loss={self.loss!r} trains probabilities, and {type(final).__name__} as "
                "configured has no predict_proba to export them: use loss='auto' (the "
                "template's own loss) or a template with probabilities (LogisticRegression, "
                "SGDClassifier(loss='log_loss'), MLPClassifier)."
            )
        return loss

    def _solver(self, final, incremental):
        """The optimizer: the estimator's, or with ``"auto"`` the template family's solver."""
        if self.optimizer == "auto":
            # partial_fit always trains stochastically
            return get_optimizer("adam" if incremental else family_of(final).solver_of(final))
        optimizer = get_optimizer(self.optimizer)
        if incremental and optimizer.full_batch:
            raise AttributeError(
                f"partial_fit is not available with optimizer={self.optimizer!r}, a "
                "full-batch solver: use fit, or a stochastic optimizer such as 'adam'."
            )
        if hasattr(optimizer, "widths"):
            optimizer.widths()  # refuses an invalid smoothing before any work
        return optimizer

    def _trained_indices(self):
        return [k for k, p in enumerate(self._converted.params) if p.trainable]

    def _get_engine(self, loss, optimizer, reset, penalty):
        # Reused only when the loss and optimizer are equal in every parameter: a repr
        # cuts long values (an OnnxLoss's graph) in the middle.
        threads = intra_op_threads(self.n_jobs)
        self._intra_op_threads = threads  # of the training sessions (0: the runtime's default)
        from ._config import get_config

        # the sessions' CUDA options are read when the engine is made: TF32 is in the key
        tf32 = get_config()["allow_tf32"]
        key = fingerprint(
            (loss, optimizer, *penalty, self.device, self.backend, threads, tf32), params=True
        )
        engine = self.__dict__.get("_engine")
        if engine is None or key != self._engine_key:
            engine = self._new_engine(loss, optimizer, penalty)
            self.backend_ = engine.backend
            previous = self.__dict__.get("_engine")
            saved = self.__dict__.pop("_optimizer_state", None)
            if previous is not None and fingerprint(previous.optimizer, params=True) == fingerprint(
                optimizer, params=True
            ):
                saved = previous.get_state()
            self._engine = engine
            self._engine_key = key
            if saved is not None and not reset:
                engine.set_state(saved)
        elif reset:
            engine.reset_optimizer()
        if reset:
            self._schedule = LearningRateSchedule(
                self.learning_rate, self.learning_rate_init, self.power_t
            )
        return engine

    def _engine_recipe(self):
        """What this estimator's engines are built from (:class:`~.engine.EngineRecipe`)."""
        from .engine import EngineRecipe

        return EngineRecipe.of(self._converted, self.n_outputs_, self.device, self.backend)

    def _new_engine(self, loss, optimizer, penalty):
        """A training engine for the converted model, ``loss``, ``optimizer`` and penalty."""
        alpha, l1_ratio = penalty
        return self._engine_recipe().build(
            loss, optimizer, alpha, l1_ratio, threads=self._intra_op_threads
        )

    def __sklearn_is_fitted__(self):
        return hasattr(self, "_converted")

    def to_onnx(self, dtype=None) -> onnx.ModelProto:
        """Return the trained model as ONNX.

        Parameters
        ----------
        dtype : {"float32", "float64"} or None, default=None
            Type of the graph. None: the type the model was trained in (the
            graph ``predict`` runs; input ``tensor(float)`` after a float32
            fit, ``tensor(double)`` after a float64 one). The other type
            converts ``estimator_`` again with skl2onnx in that type: a float64
            model exported with ``dtype="float32"`` gives a float32 graph for
            deployment, its weights rounded to float32 and its outputs equal to
            ``predict`` within float32 rounding.

        Returns
        -------
        onnx.ModelProto
            The graph skl2onnx gives for the template (input ``X``) with the
            trained weights in its initializers. After a fit on a DataFrame whose
            columns the template's head takes by name (a ``ColumnTransformer``),
            the whole Pipeline with one input per raw column, named after it, of
            shape ``(n, 1)``: ``tensor(float)`` (``tensor(double)`` in float64)
            for float columns, ``tensor(int64)`` for integer and boolean ones,
            ``tensor(string)`` for the others.
        """
        check_is_fitted(self)
        _model.check_weights_stored(self, "to_onnx")
        note = template_input(self.estimator_).export_warning(self.estimator_)
        if note is not None:
            warnings.warn(note, UserWarning, stacklevel=2)
        if dtype is not None:
            if dtype not in ("float32", "float64", np.float32, np.float64):
                raise ValueError(
                    f"to_onnx(dtype={dtype!r}): use 'float32', 'float64' or None (the "
                    "training dtype)."
                )
            if np.dtype(dtype) != self._converted.dtype:
                model = export_model(
                    _model.exported_estimator(self), _model.export_inputs(self), np.dtype(dtype)
                )
                return join_head(self, model, np.dtype(dtype))
        export = _model.export_now(self)
        model = onnx.ModelProto()
        model.CopyFrom(export.model if isinstance(export, ConvertedTemplate) else export)
        return model


def _fallback(before, first_call, engine):
    """The state a fit that fails while training goes back to: ``before`` (the
    estimator's attributes before the fit) where its model's weights stay in memory
    during the fit anyway (an unfitted estimator; a continued fit, whose converted
    graph keeps the previous weights until the end), less the training engine, whose
    weights the failed fit moved, and the predict sessions; or None: unfitted (a new fit
    replaces the model, a large model's weights are only in the engine)."""
    unfitted = "_converted" not in before
    if not unfitted and (first_call or engine.large):
        return None
    dropped = {"_engine", "_engine_key", "_session", "_logit_session", *_CALLBACK_STATE}
    return {k: v for k, v in before.items() if k not in dropped}


#: What scikit-learn's callback support sets on the estimator during a fit (its
#: ``with_callbacks`` reads them to call the callbacks' ``teardown``).
_CALLBACK_STATE = ("_callback_fit_ctx", "_skl_callbacks_to_teardown")

#: ``multi_output`` of the final model's tags, by type (see :func:`_multi_output`).
_MULTI_OUTPUT: dict = {}


def _multi_output(final) -> bool:
    """Whether the template's final model takes a 2-D y, by type.

    Tags are built at every ``predict`` (scikit-learn's validation reads them), and
    the final model's tag depends on its class only. MLPRegressor takes a 2-D y
    without saying so in its tags.
    """
    kind = type(final)
    found = _MULTI_OUTPUT.get(kind)
    if found is None:
        try:
            found = bool(get_tags(final).target_tags.multi_output) or kind.__name__ == (
                "MLPRegressor"
            )
        except Exception:  # an unsupported template: fit will say why
            return False
        _MULTI_OUTPUT[kind] = found
    return found


def dask_aware(method):
    """``method(X, ...)``, or on a dask collection the method run block by block on the
    scheduler of the collection (``_dask.run_method``): a dask collection back, or a
    number for ``score``."""

    @functools.wraps(method)
    def run(self, X, *args, **kwargs):
        if dask_input(X, *args, *kwargs.values()):
            from ._dask import run_method

            return run_method(self, method.__name__, X, *args, **kwargs)
        return method(self, X, *args, **kwargs)

    return run
