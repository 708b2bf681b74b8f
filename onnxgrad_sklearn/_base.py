"""The estimator shared by the regressor and the classifier: validate, initialise, loop."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import numbers
import sys
import warnings
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, is_classifier
from sklearn.exceptions import ConvergenceWarning, DataConversionWarning
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state, get_tags
from sklearn.utils._param_validation import HasMethods, Interval, Options, StrOptions
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from ._callbacks import (
    NO_TASK,
    CallbackSupportMixin,
    fit_task,
    holds_out_validation,
    shallow_state,
    uses_validation_data,
)
from ._frames import (
    join_head,
    run_raw,
    validate_fit_data,
    validate_validation_data,
    with_head,
)
from ._lazy import lazy
from .exceptions import ConvergenceError
from .families import dropped_settings, family_of
from .losses import BaseLoss, get_loss
from .optim import OPTIMIZER_NAMES, SGD, BaseOptimizer, LearningRateSchedule, get_optimizer
from .runtime import (
    device_to_providers,
    intra_op_threads,
    make_session,
    session_options,
    session_providers,
)
from .templates import (
    ConvertedTemplate,
    check_template,
    convert_template,
    export_model,
    final_estimator,
    prepare_template,
    trained_view,
    unfitted_head_steps,
)

if TYPE_CHECKING:
    from .engine import TrainingEngine

# imported on first use (``import onnxgrad_sklearn`` does not import onnx)
onnx = lazy("onnx")

logger = logging.getLogger("onnxgrad_sklearn")


class BaseOrtGradient(CallbackSupportMixin, BaseEstimator):
    """Common parameters, fit loop and ONNX export of the estimators.

    With scikit-learn >= 1.9, ``set_callbacks`` sets scikit-learn's callbacks
    (``sklearn.callback``): see ``_callbacks.py`` and docs/callbacks.md.
    """

    _parameter_constraints: dict = {
        "estimator": [HasMethods(["fit", "predict"]), None],
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

    def _loss_input(self, g, prediction):
        """Turn the trained graph's prediction into the loss's first input."""
        return prediction

    def _loss_input_key(self):
        """What :meth:`_loss_input` does, as a value for the training artifact's key."""
        return "prediction"

    def _resolve_loss(self, loss):
        """The loss to train with, once the template is known."""
        return loss

    def _stratify(self, y2d):
        return None

    def _score_validation(self, X, y, sample_weight, prediction):
        raise NotImplementedError

    def _export(self):
        """What ``to_onnx`` returns and ``predict`` runs, set after each fit.

        The trained graph itself, or for a template trained through another view
        (a classifier, a GLM) the template's own graph: converted once per
        template (an artifact, :func:`~onnxgrad_sklearn.templates.convert_template`),
        then given the trained weights. Either is a :class:`ConvertedTemplate`
        holding them, whose ONNX model is made when first asked for (its session
        needs none: :meth:`ConvertedTemplate.session`). A graph whose weights cannot
        be located (binary LogisticRegression stores [-w, w], LinearSVC keeps them
        in node attributes) is converted at each export, and after a fit on raw
        DataFrame columns the final model's graph gets the head's graph joined in
        front of it (one input per column): an ONNX model, made here.
        """
        est = self._exported_estimator()
        if trained_view(est) is est:
            return self._with_head(self._converted)
        located = self.__dict__.get("_export_converted")
        if located is None:
            try:
                located = convert_template(est, self._export_inputs(), self._converted.dtype)
            except ValueError:
                model = export_model(est, self._export_inputs(), self._converted.dtype)
                return join_head(self, model)
            self._export_converted = located
        values = located.values_from(final_estimator(est))
        return self._with_head(dataclasses.replace(located, values=values))

    def _with_head(self, converted):
        """``converted``, or after a fit on raw columns its model with the head joined."""
        if "_raw_columns" in self.__dict__:
            return join_head(self, converted.model)
        return converted

    def _exported_estimator(self):
        """What skl2onnx converts: ``estimator_``, or after a fit on raw DataFrame
        columns its final model (the head, converted on its own, is joined to it)."""
        if "_raw_columns" in self.__dict__:
            return final_estimator(self.estimator_)
        return self.estimator_

    def _export_inputs(self):
        """Width of the exported graph's input ``X``: the features, or the head's output."""
        if "_raw_columns" in self.__dict__:
            return self._converted.input_width
        return self.n_features_in_

    # pickling ------------------------------------------------------------
    def __getstate__(self):
        # Runtime sessions and OrtValues are not pickled: they are rebuilt on
        # first use. The optimizer state is kept as numpy arrays, models as bytes
        # (a ConvertedTemplate: its skeleton's bytes and the weights as arrays, so
        # that neither pickling nor unpickling needs onnx).
        state = dict(super().__getstate__())
        engine = state.pop("_engine", None)
        state.pop("_session", None)
        state.pop("_logit_session", None)
        if engine is not None:
            state["_optimizer_state"] = engine.get_state()
        if state.get("_export_model") is not None and not isinstance(
            state["_export_model"], ConvertedTemplate
        ):
            state["_export_model"] = state["_export_model"].SerializeToString()
        return state

    def __copy__(self):
        # A shallow copy, as copy.copy of the pickled state would be, without
        # serialising the ONNX models or making sessions again: scikit-learn's
        # callbacks copy the estimator at each epoch (their ``fitted_estimator``).
        new = object.__new__(type(self))
        new.__dict__.update(shallow_state(self))
        return new

    def __setstate__(self, state):
        state = dict(state)
        if isinstance(state.get("_export_model"), bytes):  # an ONNX model of its own
            state["_export_model"] = onnx.load_from_string(state["_export_model"])
        super().__setstate__(state)
        if "_export_model" in state:
            self._make_sessions()

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
        return self._default_estimator() if self.estimator is None else self.estimator

    def _fit(self, X, y, sample_weight=None, incremental=False, classes=None, validation=None):
        """Validate, initialise, train. ``validation``: ``(X_val, y_val,
        sample_weight_val)`` given to ``fit`` (None: none given)."""
        if not _is_rows(X) and _dask_input(X, y, sample_weight):
            from ._dask import fit_dask  # on a cluster's workers, or computed here

            return fit_dask(self, X, y, sample_weight, incremental, classes, validation)
        first_call = not ((self.warm_start or incremental) and hasattr(self, "_converted"))
        # what the callbacks receive, as given (a dask collection for rows on a cluster)
        given = (X.collection if _is_rows(X) else X, y, sample_weight)
        given_validation = None if validation is None or validation[0] is None else validation
        # Until training starts, a failure (bad input, a loss that cannot be built)
        # puts every attribute back: the estimator stays as it was (validate_data
        # records the features at once, _initialize replaces the fitted state).
        before = dict(self.__dict__)
        try:
            X, y2d, sample_weight, fitted, loss, optimizer = self._validate_fit_input(
                X, y, sample_weight, first_call, incremental, classes
            )
            validation = self._validate_validation_data(validation, y2d, fitted, optimizer)
            if first_call:
                self._initialize(X, y2d, fitted, loss)
            if first_call or not incremental or not hasattr(self, "_template_penalty"):
                # partial_fit keeps the rows of its first call: one engine for every call
                self._template_penalty = self._templates_penalty(
                    X.shape[0],
                    optimizer.full_batch,
                    held_out=validation is None and not incremental,
                )
            self._penalty = self._resolve_penalty()
            self._loss_ = loss
            loss = self._resolve_loss(loss)
            full_batch = optimizer.full_batch  # the engine then only gives loss and gradients
            engine = self._get_engine(
                loss,
                SGD() if full_batch else optimizer,
                reset=not incremental,
                # L-BFGS-B adds the L1 part itself, over bound-constrained variables
                penalty=_smooth_penalty(self._penalty) if full_batch else self._penalty,
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
        del before  # it holds the previous fit's ONNX model and sessions
        # The previous fit's predict sessions (a copy of the weights each) go before
        # training: made again at its end, or by predict should the fit stop half-way.
        self._session = self._logit_session = None
        self._release_trained_values(engine)
        try:
            if full_batch:
                self._run_lbfgs(engine, X, y2d, sample_weight, optimizer, loss, task)
            else:
                self._run_epochs(engine, X, y2d, sample_weight, incremental, validation, task)
        finally:
            if not incremental:  # partial_fit goes on in the same sessions at its next call
                engine.release_sessions()
            self._store_weights(engine.get_weights())
        task.finish()
        return self

    def _validate_fit_input(self, X, y, sample_weight, first_call, incremental, classes):
        """Check everything a fit receives, before anything reaches the runtime."""
        if self.early_stopping and incremental:
            raise ValueError("partial_fit does not support early_stopping=True")
        template = self._template()
        check_template(template, self._task, type(self).__name__)
        if incremental and first_call:
            _refuse_unfitted_head(template)
        final = final_estimator(template)
        loss = self._objective(final)
        optimizer = self._solver(final, incremental)
        dtype = self._fit_dtype(first_call)  # None: X's own, as MLPRegressor
        if _is_rows(X):  # partitions on a dask cluster (_dask.py): checked where they are
            dtype = X.training_dtype(dtype)
            self._check_runtime(dtype)
            X, y2d, sample_weight, fitted = X.validate(
                self, y, sample_weight, first_call, incremental, classes, dtype
            )
            self._check_outputs(y2d, first_call)
            return X, y2d, sample_weight, fitted, loss, optimizer
        # a DataFrame whose columns the template's head takes by name: the head's output
        X, y = validate_fit_data(
            self,
            X,
            y,
            reset=first_call,
            accept_sparse=["csr", "csc"],
            multi_output=True,
            dtype=[np.float64, np.float32] if dtype is None else [np.float32, np.float64],
            y_numeric=not is_classifier(self),
        )
        if y.ndim == 2 and y.shape[1] == 1:
            warnings.warn(
                "A column-vector y was passed when a 1d array was expected. Please "
                "change the shape of y to (n_samples,), for example using ravel().",
                DataConversionWarning,
                stacklevel=4,
            )
            y = y.ravel()
        dtype = X.dtype if dtype is None else dtype
        X = _as_rows(X, dtype)  # a sparse X stays sparse: batches are densified one by one
        y2d, fitted = self._validate_targets(y, first_call, incremental, classes)
        y2d = np.ascontiguousarray(y2d, dtype=dtype)
        sample_weight = _check_sample_weight(sample_weight, X, dtype=dtype)
        sample_weight = self._adjust_sample_weight(y2d, sample_weight, fitted)
        if not np.any(sample_weight):
            raise ValueError("Sample weights must contain at least one non-zero number.")
        self._check_runtime(dtype)
        self._check_outputs(y2d, first_call)
        return X, y2d, sample_weight, fitted, loss, optimizer

    def _check_runtime(self, dtype):
        """Refuse a bad device, or a backend that cannot run here, before any work."""
        from .backends import check_backend  # imports onnx and onnxruntime: on first use

        device_to_providers(self.device)  # refuses a bad device before any work
        check_backend(self.backend, self.device, dtype)  # and a backend that cannot run here

    def _check_outputs(self, y2d, first_call):
        """A continued fit keeps the number of outputs."""
        if not first_call and self._n_model_outputs(y2d) != self.n_outputs_:
            raise ValueError(
                f"y has {self._n_model_outputs(y2d)} outputs, the estimator was fitted "
                f"with {self.n_outputs_}."
            )

    def _validate_validation_data(self, validation, y2d, fitted, optimizer):
        """Check ``(X_val, y_val, sample_weight_val)`` given to ``fit`` as the training
        data is checked (X_val through the template's head, y_val encoded as y);
        return them in the training dtype, or None when none is given."""
        if validation is None or all(v is None for v in validation):
            return None
        X_val, y_val, sw_val = validation
        if X_val is None and y_val is None:
            raise ValueError("sample_weight_val is provided, but X_val and y_val are not.")
        if X_val is None or y_val is None:  # HistGradientBoosting's messages
            given, missing = ("X_val", "y_val") if y_val is None else ("y_val", "X_val")
            raise ValueError(f"{given} is provided, but {missing} was not provided.")
        if not self.early_stopping and not uses_validation_data(self):
            raise ValueError(
                "X_val and y_val are passed to fit while early_stopping is False: set "
                "early_stopping=True to stop on their score (they replace the "
                "validation_fraction split), or set a callback that reads the validation "
                "scores (one with uses_validation_data=True)."
            )
        if optimizer.full_batch:
            raise ValueError(
                "X_val and y_val are scored at each epoch of a stochastic optimizer; the "
                "full-batch L-BFGS solver has no epochs and no early stopping (as "
                f"{'MLPClassifier' if is_classifier(self) else 'MLPRegressor'}"
                "(solver='lbfgs')): use optimizer='adam' (or another stochastic one), or "
                "fit without them."
            )
        X_val = validate_validation_data(self, X_val, y2d.dtype)
        y_val = np.ascontiguousarray(self._validation_targets(y_val, fitted), dtype=y2d.dtype)
        if y_val.shape[0] != X_val.shape[0] or y_val.shape[1] != y2d.shape[1]:
            raise ValueError(
                f"y_val has shape {y_val.shape[:1]} x {y_val.shape[1]} outputs, for X_val's "
                f"{X_val.shape[0]} rows and y's {y2d.shape[1]} outputs."
            )
        sw_val = _check_sample_weight(sw_val, X_val, dtype=y2d.dtype)
        if not np.any(sw_val):
            raise ValueError("sample_weight_val must contain at least one non-zero number.")
        return X_val, y_val, sw_val

    def _fit_dtype(self, first_call):
        """The training dtype asked for (None: X's), or for a continued fit the model's."""
        asked = None if self.dtype is None else np.dtype(self.dtype)
        if first_call:
            return asked
        trained = self._converted.dtype
        if asked is not None and asked != trained:
            raise ValueError(
                f"dtype={self.dtype!r}, but the estimator was fitted in {trained} and a "
                f"continued fit (warm_start, partial_fit) keeps its weights in {trained}: "
                f"pass dtype={str(trained)!r} (or None), or fit anew with warm_start=False "
                f"to train in {asked}."
            )
        return trained

    def _objective(self, final):
        """The loss: the estimator's ``loss``, or with ``"auto"`` the template's own."""
        family = family_of(final)
        loss = get_loss(family.loss(final) if self.loss == "auto" else self.loss)
        # None: a custom loss, for any task; the template's own loss fits it by definition
        task = getattr(loss, "task", None)
        if self.loss != "auto" and task is not None and task != family.task:
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

    def _templates_penalty(self, n_samples, full_batch, held_out=True):
        """The template's penalty as ``(alpha, l1_ratio)``, for the rows of one batch.

        All rows at full batch, so that the objective is the template's own
        (families.Family.penalty). ``held_out``: early stopping trains on the rows
        its split leaves (False: on all of them, the validation set being given).
        """
        rows = n_samples
        if not full_batch:
            if held_out and (self.early_stopping or holds_out_validation(self)):
                n_samples -= int(np.ceil(self.validation_fraction * n_samples))
            size = 200 if self.batch_size == "auto" else self.batch_size
            rows = max(1, min(size, n_samples))
        final = final_estimator(self._template())
        return family_of(final).penalty(final, max(n_samples, 1), rows)

    def _resolve_penalty(self):
        """``(alpha, l1_ratio)`` trained: the estimator's, or with ``"auto"`` the template's."""
        alpha, l1_ratio = self._template_penalty
        alpha = alpha if self.alpha == "auto" else float(self.alpha)
        l1_ratio = l1_ratio if self.l1_ratio == "auto" else float(self.l1_ratio)
        logger.info(
            "penalty: alpha=%.6g, l1_ratio=%.6g (%s)",
            alpha,
            l1_ratio,
            "the template's" if self.alpha == "auto" else "the estimator's",
        )
        return alpha, l1_ratio

    def _warn_dropped_settings(self, final, n_samples):
        lines = dropped_settings(final, n_samples, penalty_carried=self.alpha == "auto")
        if lines:
            warnings.warn(
                f"These settings of the template {type(final).__name__} do not carry over "
                "(its structure, weights, loss, class weights and, with alpha='auto', its "
                "penalty do; the estimator's own training parameters apply): "
                + "; ".join(lines)
                + ".",
                UserWarning,
                stacklevel=5,
            )

    def _initialize(self, X, y2d, fitted, loss):
        template = self._template()
        self._warn_dropped_settings(final_estimator(template), X.shape[0])
        random_state = check_random_state(self.random_state)
        n_outputs = self._n_model_outputs(y2d)
        head = self.__dict__.pop("_fitted_head", None)  # raw columns: X is the head's output
        est, fine_tuned = prepare_template(
            template if head is None else final_estimator(template), X, n_outputs, random_state
        )
        self._setup_template(est, fine_tuned, fitted, loss)
        converted = convert_template(self._trained_view(est), X.shape[1], X.dtype)
        # Every step that can fail is done: the fitted state is replaced at once.
        for name, value in fitted.items():
            setattr(self, name, value)
        self._random_state = random_state
        self._converted: ConvertedTemplate = converted
        self.estimator_ = est if head is None else with_head(head, template, est)
        self.n_outputs_ = n_outputs
        final = final_estimator(est)
        self.t_ = int(getattr(final, "t_", 0)) if fine_tuned else 0
        self.n_iter_ = 0
        self.loss_curve_ = []
        self._no_improvement_count = 0
        if self.early_stopping:
            self.validation_scores_ = []
            self.best_validation_score_ = -np.inf
            self.best_loss_ = None
        else:
            self.validation_scores_ = None
            self.best_validation_score_ = None
            self.best_loss_ = np.inf
        self._schedule = LearningRateSchedule(
            self.learning_rate, self.learning_rate_init, self.power_t
        )
        self._engine_key = None
        for stale in ("_engine", "_optimizer_state", "_export_converted"):
            self.__dict__.pop(stale, None)
        logger.info(
            "%s %s: %d trained tensors (%s)",
            "fine-tuning" if fine_tuned else "training",
            type(final).__name__,
            sum(p.trainable for p in converted.params),
            ", ".join(p.label for p in converted.params if p.trainable),
        )

    def _release_trained_values(self, engine):
        """While a large model (``engine.large``) trains, ``estimator_`` and the ONNX
        model hold no trained values.

        The engine holds them; the values there before are two copies of the weights
        that the end of the fit (``_store_weights``, also after an error) replaces. A
        ``predict`` or ``to_onnx`` from another thread meanwhile gets a clear error.
        """
        if not engine.large:
            return
        conv = self._converted
        final = final_estimator(self.estimator_)
        trained = self._trained_indices()
        for k in trained:
            old = conv.params[k].get(final)
            placeholder = np.broadcast_to(np.array(np.nan, dtype=old.dtype), old.shape)
            conv.params[k].set(final, placeholder)  # no memory: one NaN, read-only
        conv.values = [None if k in trained else v for k, v in enumerate(conv.values)]
        self._export_model = None

    def _check_weights_stored(self, what):
        if self.__dict__.get("_export_model", True) is None:
            raise RuntimeError(
                f"{type(self).__name__}.{what} was called while a fit of this estimator "
                "is training (in another thread): its weights are in the training "
                f"engine until the fit returns. Call {what} after fit returns."
            )

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
        key = _fingerprint((loss, optimizer, *penalty, self.device, self.backend, threads, tf32))
        engine = self.__dict__.get("_engine")
        if engine is None or key != self._engine_key:
            engine = self._new_engine(loss, optimizer, penalty)
            self.backend_ = engine.backend
            previous = self.__dict__.get("_engine")
            saved = self.__dict__.pop("_optimizer_state", None)
            if previous is not None and _fingerprint(previous.optimizer) == _fingerprint(optimizer):
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

    def _new_engine(self, loss, optimizer, penalty):
        """A training engine for the converted model, ``loss``, ``optimizer`` and penalty."""
        from .engine import TrainingEngine

        conv = self._converted
        idx = self._trained_indices()
        names = [conv.initializer_names[k] for k in idx]
        penalized = [conv.initializer_names[k] for k in idx if conv.params[k].penalized]
        return TrainingEngine(
            conv,  # its artifact's key names the structure; its values are the start
            conv.output_name,
            names,
            penalized,
            self.n_outputs_,
            loss,
            optimizer,
            alpha=penalty[0],
            l1_ratio=penalty[1],
            device=self.device,
            loss_input=self._loss_input,
            loss_input_key=self._loss_input_key(),
            backend=self.backend,
            threads=self._intra_op_threads,
        )

    def _batch_size(self, n_samples):
        if self.batch_size == "auto":
            return min(200, n_samples)
        if self.batch_size > n_samples:
            warnings.warn(
                "Got `batch_size` less than 1 or larger than sample size. It is going "
                "to be clipped",
                stacklevel=4,
            )
        return int(np.clip(self.batch_size, 1, n_samples))

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
        sample_idx = np.arange(n_samples)
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
        X, y2d, sample_weight = train
        n_samples = X.shape[0]
        last = slice(max(n_samples - batch_size, 0), n_samples)
        ones = np.ones(last.stop - last.start, dtype=sample_weight.dtype)  # never 0 / 0
        if not engine.is_finite(_rows(X, last), y2d[last], ones):
            engine.undo_last_step()
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
        epoch's permutation of the rows (None: consecutive slices, zero copy).
        Shuffled batches are gathered into buffers of one batch, reused: the
        data is never copied whole. A sparse X always goes through them, each
        batch densified on its own.
        """
        n_samples = arrays[0].shape[0]
        accumulated = 0.0
        lr = self._schedule.learning_rate
        batches = _slices(n_samples, batch_size)
        if order is None and sp.issparse(arrays[0]):
            order = np.arange(n_samples)
        if order is not None:
            buffers = [np.empty((batch_size,) + a.shape[1:], dtype=a.dtype) for a in arrays]
        bar = _progress(
            self.verbose >= 2, len(batches), f"epoch {self.n_iter_ + 1}", "batch", leave=False
        )
        try:
            for number, batch in enumerate(batches, 1):
                if order is None:
                    feed = [a[batch] for a in arrays]
                else:
                    rows = order[batch]
                    feed = [_rows(a, rows, out=buf[: len(rows)]) for a, buf in zip(arrays, buffers)]
                if not feed[2].sum():  # weights summing to zero: no loss to follow, no step
                    if bar is not None:
                        bar.update(1)
                    continue
                batch_loss = engine.train_batch(*feed, lr)
                if not np.isfinite(batch_loss):
                    engine.undo_last_step()
                    self._diverged(batch_loss, self.n_iter_ + 1, number)
                    return None
                accumulated += batch_loss * (batch.stop - batch.start)
                if bar is not None:
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

    def _store_weights(self, trained):
        # No session of the previous model is left when the new one is made (a copy of
        # the weights each); predict makes them again should this not reach its end.
        self._session = self._logit_session = None
        conv = self._converted
        indices = self._trained_indices()
        values = conv.initializer_values(skip=set(indices))
        for k, w in zip(indices, trained):
            values[k] = w
        conv.values = values  # the ONNX model is made from them when asked for
        final = final_estimator(self.estimator_)
        conv.write_back(final, values)
        if hasattr(final, "loss_curve_"):  # an MLP: its own counters follow the training
            final.n_iter_, final.t_ = self.n_iter_, self.t_
            final.loss_curve_ = list(final.loss_curve_) + self.loss_curve_[-self.n_iter_ :]
            if hasattr(final, "_best_coefs"):
                # the best weights are the trained ones (early stopping went back to
                # them), as MLPRegressor leaves them after early stopping; views, so
                # that the initial weights are not kept for the estimator's life
                final._best_coefs = [c.view() for c in final.coefs_]
                final._best_intercepts = [i.view() for i in final.intercepts_]
        self._export_model = self._export()
        self._make_sessions()

    # inference ------------------------------------------------------------
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
        self._check_weights_stored("to_onnx")
        if dtype is not None:
            if dtype not in ("float32", "float64", np.float32, np.float64):
                raise ValueError(
                    f"to_onnx(dtype={dtype!r}): use 'float32', 'float64' or None (the "
                    "training dtype)."
                )
            if np.dtype(dtype) != self._converted.dtype:
                model = export_model(
                    self._exported_estimator(), self._export_inputs(), np.dtype(dtype)
                )
                return join_head(self, model, np.dtype(dtype))
        export = self._export_model
        model = onnx.ModelProto()
        model.CopyFrom(export.model if isinstance(export, ConvertedTemplate) else export)
        return model

    def _make_sessions(self):
        """Create the inference sessions of the exported model and of the trained graph.

        Made once after each fit (and after unpickling), so that predicting
        never changes the estimator.
        """
        try:
            device_to_providers(self.device)
            # the device index and TF32 (off unless set_config(allow_tf32=True)), as training
            providers, provider_options = session_providers(self.device)
        except ValueError as exc:  # fitted on a GPU, loaded where there is none
            if not str(self.device).lower().startswith("cuda"):
                raise
            warnings.warn(
                f"This model was fitted with device={self.device!r}, which is not available "
                f"here ({exc}): it predicts on the CPU. Set device='cpu' before "
                "continuing its training here.",
                UserWarning,
                stacklevel=3,
            )
            providers, provider_options = ["CPUExecutionProvider"], [{}]
        # the threads of where the sessions are made (a worker after unpickling)
        threads = intra_op_threads(getattr(self, "n_jobs", None))

        def session(model):
            # a ConvertedTemplate: its skeleton's bytes, the weights given as initializers
            options = session_options(threads)  # one each: add_initializer changes them
            if isinstance(model, ConvertedTemplate):
                return model.session(options, providers, provider_options)
            return make_session(
                model.SerializeToString(), options, providers, provider_options, strict=False
            )

        # The previous fit's sessions go first: each holds a copy of the weights.
        self._session = self._logit_session = None
        self._session = session(self._export_model)
        self._logit_session = (
            self._session if self._export_model is self._converted else session(self._converted)
        )

    def _run_onnx(self, X, trained_graph=False):
        """Run the exported model (or the trained graph) on X; return its outputs by name."""
        if "_converted" not in self.__dict__:
            check_is_fitted(self)  # not fitted: scikit-learn's error
        self._check_weights_stored("predict")
        if self.__dict__.get("_session") is None:  # a fit that stopped while storing
            self._make_sessions()
        if "_raw_columns" in self.__dict__:  # fitted on a DataFrame's raw columns
            return run_raw(self, X, trained_graph)
        X = validate_data(
            self, X, reset=False, accept_sparse=["csr", "csc"], dtype=[np.float32, np.float64]
        )
        X = _as_rows(X, self._converted.dtype)  # the graph's input type
        session = self._logit_session if trained_graph else self._session
        feed, names = _io_names(session)
        if not sp.issparse(X):
            return dict(zip(names, session.run(None, {feed: X})))
        rows = max(1, _CHUNK_VALUES // max(X.shape[1], 1))  # densified chunk by chunk
        parts = [session.run(None, {feed: _rows(X, c)}) for c in _slices(X.shape[0], rows)]
        return {name: np.concatenate([p[k] for p in parts]) for k, name in enumerate(names)}


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


def _io_names(session):
    """``(first input, output names)`` of an inference session, read once per session."""
    names = getattr(session, "_onnxgrad_io", None)
    if names is None:
        names = (session.get_inputs()[0].name, [o.name for o in session.get_outputs()])
        session._onnxgrad_io = names
    return names


def _refuse_unfitted_head(template):
    """partial_fit would fit the preprocessing of the template on its first chunk only."""
    unfitted = unfitted_head_steps(template)
    if unfitted:
        raise ValueError(
            f"partial_fit cannot fit the preprocessing step(s) {unfitted} of the template "
            "Pipeline: they would see the first chunk of data only (a scaler's statistics, "
            "an encoder's categories would miss the later chunks). Fit them first on "
            "enough of the data, for example 'template[:-1].fit(X_sample)' (the final "
            "model may stay unfitted), or pass a Pipeline whose preprocessing is fitted, "
            "or use fit on the whole data."
        )


#: Values per call when a sparse X is densified (or the full batch split): 16 MB of float32.
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


def _by_chunks(function, X):
    """``function(X)``, or for a sparse X the rows of ``function`` on its dense chunks."""
    if not sp.issparse(X):
        return function(X)
    rows = max(1, _CHUNK_VALUES // max(X.shape[1], 1))
    parts = [function(_rows(X, chunk)) for chunk in _slices(X.shape[0], rows)]
    return np.concatenate(parts, axis=0)


def _slices(n, size):
    """``list(sklearn.utils.gen_batches(n, size))`` without its parameter validation
    (0.1 ms a call: once per epoch, a tenth of a small model's epoch)."""
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def _shuffled(index, random_state):
    """``sklearn.utils.shuffle(index, random_state=random_state)``, the same draws and
    result, without its parameter validation (0.35 ms a call, once per epoch)."""
    order = np.arange(len(index))
    random_state.shuffle(order)
    return index[order]


def _fingerprint(value) -> str:
    """A digest equal for two values exactly when they are equal in every parameter.

    Estimator-like objects (losses, optimizers) by their type and ``get_params``,
    protobuf messages (ONNX graphs) by their bytes, arrays by dtype, shape and bytes.
    """

    def canonical(v):
        if isinstance(v, BaseEstimator):
            params = sorted(v.get_params(deep=False).items())
            kind = f"{type(v).__module__}.{type(v).__qualname__}"
            return (kind, tuple((k, canonical(p)) for k, p in params))
        if hasattr(v, "SerializeToString"):
            return (type(v).__qualname__, v.SerializeToString(deterministic=True))
        if isinstance(v, np.ndarray):
            return ("ndarray", v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, tuple(canonical(x) for x in v))
        if isinstance(v, dict):
            return ("dict", tuple(sorted((repr(k), canonical(x)) for k, x in v.items())))
        return (type(v).__qualname__, repr(v))

    return hashlib.sha256(repr(canonical(value)).encode()).hexdigest()


def _dask_input(*values) -> bool:
    """Whether one of ``values`` is a dask collection (dask is not imported to tell)."""
    if "dask" not in sys.modules:
        return False
    from dask.base import is_dask_collection

    return any(is_dask_collection(v) for v in values)


def _is_rows(X) -> bool:
    """Whether ``X`` is the training rows on a dask cluster (``_dask.DaskRows``)."""
    return getattr(type(X), "_onnxgrad_rows", False)


def dask_aware(method):
    """``method(X, ...)``, or on a dask collection the method run block by block on the
    scheduler of the collection (``_dask.run_method``): a dask collection back, or a
    number for ``score``."""

    @functools.wraps(method)
    def run(self, X, *args, **kwargs):
        if _dask_input(X, *args, *kwargs.values()):
            from ._dask import run_method

            return run_method(self, method.__name__, X, *args, **kwargs)
        return method(self, X, *args, **kwargs)

    return run


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
        value, grads = 0.0, []
        for w, penalized in zip(weights, self.penalized):
            w = w.astype(np.float64)
            if not penalized or self.alpha == 0:
                grads.append(np.zeros_like(w))
                continue
            r = self.l1_ratio
            value += self.alpha * ((1 - r) / 2 * np.sum(w * w) + r * np.sum(np.abs(w)))
            grads.append(self.alpha * ((1 - r) * w + r * np.sign(w)))
        return value, grads

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
