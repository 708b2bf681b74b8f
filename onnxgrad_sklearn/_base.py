"""The estimator shared by the regressor and the classifier: validate, initialise, loop."""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import numbers
import sys
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, is_classifier
from sklearn.exceptions import DataConversionWarning
from sklearn.utils import check_random_state, get_tags
from sklearn.utils._param_validation import HasMethods, Interval, Options, StrOptions
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from ._callbacks import (
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
from ._hashing import fingerprint
from ._lazy import lazy
from ._loops import (
    _CHUNK_VALUES,
    TrainingLoops,
    _as_rows,
    _is_rows,
    _rows,
    _slices,
    _smooth_penalty,
)
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

# imported on first use (``import onnxgrad_sklearn`` does not import onnx)
onnx = lazy("onnx")


class _Deferred:
    """The exported model of a fit, made when first needed (``BaseOrtGradient._export``)."""

    def __repr__(self):
        return "DEFERRED"

    def __reduce__(self):  # pickled as the module's one instance
        return "DEFERRED"


#: The exported model made when first needed: a fit that needs onnx or skl2onnx to
#: make it (``BaseOrtGradient._export``) leaves it to ``to_onnx`` or to a prediction
#: from the exported graph.
DEFERRED = _Deferred()

logger = logging.getLogger("onnxgrad_sklearn")


class BaseOrtGradient(CallbackSupportMixin, TrainingLoops, BaseEstimator):
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

    def _export(self, now=False):
        """What ``to_onnx`` returns and ``predict`` runs, set after each fit.

        The trained graph itself, or for a template trained through another view
        (a classifier, a GLM) the template's own graph: converted once per
        template (an artifact, :func:`~onnxgrad_sklearn.templates.convert_template`),
        then given the trained weights. Either is a :class:`ConvertedTemplate`
        holding them, whose ONNX model is made when first asked for (its session
        needs none: :meth:`ConvertedTemplate.session`).

        A graph whose weights cannot be located (binary LogisticRegression and
        LinearSVC keep them in node attributes) is converted by skl2onnx with the
        trained weights, and after a fit on raw DataFrame columns the final model's
        graph gets the head's graph joined in front of it (one input per column):
        ONNX models, made with onnx. Unless ``now``, those are :data:`DEFERRED`,
        made by the first use that needs them (:meth:`_export_now`: ``to_onnx``, a
        prediction from the exported graph); a classifier's predictions come from
        the trained graph, so that a fit and its predictions import neither onnx
        nor skl2onnx.
        """
        est = self._exported_estimator()
        if trained_view(est) is est:
            return self._with_head(self._converted, now)
        located = self.__dict__.get("_export_converted")
        if located is None:
            try:
                located = convert_template(est, self._export_inputs(), self._converted.dtype)
            except ValueError:
                if not now:
                    return DEFERRED
                model = export_model(est, self._export_inputs(), self._converted.dtype)
                return join_head(self, model)
            self._export_converted = located
        values = located.values_from(final_estimator(est))
        return self._with_head(dataclasses.replace(located, values=values), now)

    def _with_head(self, converted, now=False):
        """``converted``, or after a fit on raw columns its model with the head joined
        (:data:`DEFERRED` unless ``now``)."""
        if "_raw_columns" in self.__dict__:
            return join_head(self, converted.model) if now else DEFERRED
        return converted

    def _export_now(self):
        """The exported model, made now if it was :data:`DEFERRED`."""
        export = self._export_model
        if export is DEFERRED:
            export = self._export_model = self._export(now=True)
        return export

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
        if state.get("_export_model") not in (None, DEFERRED) and not isinstance(
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
            validation = self._validate_validation_data(validation, y2d, fitted, optimizer, X)
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
                if _is_rows(X):  # partitions on a dask cluster: their workers' engines
                    X.start_epochs(self, loss, engine)
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
        if _is_rows(X):  # partitions on a dask cluster (_dask): checked where they are
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

    def _validate_validation_data(self, validation, y2d, fitted, optimizer, X=None):
        """Check ``(X_val, y_val, sample_weight_val)`` given to ``fit`` as the training
        data is checked (X_val through the template's head, y_val encoded as y);
        return them in the training dtype, or None when none is given. A dask X_val of
        a fit on a dask cluster (``X``: its training rows) stays on the workers, checked
        and scored there (``_dask.DaskRows.validation_set``)."""
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
        if _is_rows(X) and _dask_input(X_val):
            return X.validation_set(self, X_val, y_val, sw_val, y2d.shape[1])
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
        fitted_head = self.__dict__.pop("_cluster_head", None)  # fitted on a dask cluster
        if fitted_head is not None:
            template = copy.copy(template)
            template.steps = [*fitted_head.steps, template.steps[-1]]
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
        export = self._export_now()
        model = onnx.ModelProto()
        model.CopyFrom(export.model if isinstance(export, ConvertedTemplate) else export)
        return model

    def _make_sessions(self):
        """Create the inference sessions of the trained graph and of the exported model.

        Made once after each fit (and after unpickling), so that predicting
        never changes the estimator; a :data:`DEFERRED` export's when it is made
        (:meth:`_export_session`).
        """
        # The previous fit's sessions go first: each holds a copy of the weights.
        self._session = self._logit_session = None
        self._logit_session = self._new_session(self._converted)
        export = self._export_model
        if export is self._converted:
            self._session = self._logit_session
        elif export is not DEFERRED:
            self._session = self._new_session(export)

    def _new_session(self, model):
        """An inference session of ``model`` (a :class:`ConvertedTemplate`: its
        skeleton's bytes, the weights given as initializers; or an ONNX model) on the
        estimator's device, with the threads of where it is made (a worker after
        unpickling)."""
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
                stacklevel=4,
            )
            providers, provider_options = ["CPUExecutionProvider"], [{}]
        options = session_options(intra_op_threads(getattr(self, "n_jobs", None)))
        if isinstance(model, ConvertedTemplate):  # options of its own: it adds initializers
            return model.session(options, providers, provider_options)
        return make_session(
            model.SerializeToString(), options, providers, provider_options, strict=False
        )

    def _export_session(self):
        """The session of the exported model (the model made now if it was deferred)."""
        session = self.__dict__.get("_session")
        if session is None:
            export = self._export_now()
            if export is self._converted:  # the trained graph itself: one session
                session = self._trained_session()
            else:
                session = self._new_session(export)
            self._session = session
        return session

    def _trained_session(self):
        """The session of the trained graph, made now if there is none: a callback's
        ``fitted_estimator`` makes only the sessions its predictions use (a
        classifier's, the trained graph's), when they first need it."""
        session = self.__dict__.get("_logit_session")
        if session is None:
            session = self._logit_session = self._new_session(self._converted)
        return session

    def _run_onnx(self, X, trained_graph=False):
        """Run the exported model (or the trained graph) on X; return its outputs by name."""
        if "_converted" not in self.__dict__:
            check_is_fitted(self)  # not fitted: scikit-learn's error
        self._check_weights_stored("predict")
        if "_raw_columns" in self.__dict__:  # fitted on a DataFrame's raw columns
            return run_raw(self, X, trained_graph)
        X = validate_data(
            self, X, reset=False, accept_sparse=["csr", "csc"], dtype=[np.float32, np.float64]
        )
        X = _as_rows(X, self._converted.dtype)  # the graph's input type
        # made here after a fit that stopped while storing, and for a callback's
        # fitted_estimator (the sessions it predicts with, when it first predicts)
        session = self._trained_session() if trained_graph else self._export_session()
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


def _dask_input(*values) -> bool:
    """Whether one of ``values`` is a dask collection (dask is not imported to tell)."""
    if "dask" not in sys.modules:
        return False
    from dask.base import is_dask_collection

    return any(is_dask_collection(v) for v in values)


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
