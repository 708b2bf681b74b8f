"""OrtGradientClassifier: train a scikit-learn classifier on onnxruntime-training."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.metrics import accuracy_score
from sklearn.preprocessing import LabelBinarizer
from sklearn.utils._available_if import available_if
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.class_weight import compute_sample_weight
from sklearn.utils.multiclass import check_classification_targets, type_of_target, unique_labels
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d

from . import _model
from . import losses as _losses
from ._base import BaseOrtGradient, dask_aware
from ._callbacks import with_callbacks
from ._docs import document
from .families import family_of
from .losses import CLASSIFICATION_LOSSES, BaseLoss, LogLoss, OneVsRestLogLoss
from .templates import final_estimator

if TYPE_CHECKING:
    from ._graph import GraphBuilder

__all__ = ["OrtGradientClassifier"]


def single_logit(loss) -> bool:
    """Whether a binary problem's ``loss`` takes the one logit ``z`` (``LogLoss``
    itself: ``softplus(z) - t * z``), not a zero logit added before it."""
    return type(loss) is LogLoss


class _LogitLoss(BaseLoss):
    """The classifier's loss on its logits: what the loss receives, and how.

    The trained graph gives one logit per class, one for a binary problem, and the
    targets are one-hot, two columns for a binary problem. A loss receives one
    logit per class: a binary problem's first class gets a zero logit (so that
    ``softmax([0, z])`` is ``sigmoid(z)``). Margin losses (hinge, ...) of a binary
    problem receive ``z`` and the second column of the targets, as scikit-learn's
    binary linear models score one column. With ``signed`` (RidgeClassifier), the
    targets become -1/+1 for a squared error.

    The log-loss of a binary problem (:class:`LogLoss` itself, :func:`single_logit`)
    is computed from ``z`` alone as ``softplus(z) - t * z`` with ``t`` the second
    class's target, which equals ``-sum_k t_k * log_softmax([0, z])_k``: a
    ``LogSoftmax`` over two columns costs several times the rest of a linear model's
    graph.
    """

    def __init__(self, loss=None, binary=False, signed=False):
        self.loss = loss
        self.binary = binary
        self.signed = signed

    @property
    def rowwise(self):
        return self.loss.rowwise

    @property
    def target_width(self):
        return 2 if self.binary else None  # one logit, two one-hot columns

    def smoothed(self, width):
        inner = self.loss.smoothed(width)
        return None if inner is None else _LogitLoss(inner, self.binary, self.signed)

    def build(self, g: GraphBuilder, y_pred: str, y_true: str) -> str:
        if self.binary:  # y_pred: the one logit z; y_true: two one-hot columns
            second = [g.const([k], np.int64) for k in (1, 2, 1)]
            if single_logit(self.loss):
                return OneVsRestLogLoss().build(g, y_pred, g.op("Slice", y_true, *second))
            if self.signed or isinstance(self.loss, _losses._MarginLoss):
                y_true = g.op("Slice", y_true, *second)  # as the binary linear models
            else:
                y_pred = g.op("Concat", g.mul(y_pred, g.const(0.0)), y_pred, axis=1)
        if self.signed:
            y_true = g.sub(g.mul(y_true, g.const(2.0)), g.const(1.0))
        return self.loss.build(g, y_pred, y_true)


class OrtGradientClassifier(ClassifierMixin, BaseOrtGradient):
    """Train the weights of a scikit-learn classifier with onnxruntime-training.

    The template's decision function (its logits) is converted to ONNX and
    trained with the log-loss computed from the logits; the trained
    classifier is exported with skl2onnx with a label output and a
    probabilities output. Everything else (optimizers, schedules, batches,
    early stopping) is shared with :class:`OrtGradientRegressor`.

    Parameters
    ----------
    {parameters}

    Attributes
    ----------
    classes_ : ndarray of shape (n_classes,)
        Class labels (sorted unique labels of ``y``, or the fitted template's).
    estimator_ : estimator or Pipeline
        Copy of the template holding the trained weights.
    loss_curve_ : list of float
        Mean training loss of each epoch, penalty included.
    n_iter_ : int
        Epochs run by the last ``fit``.
    backend_ : {"agent", "standard"}
        The backend that trained the model last (see ``backend``).
    t_ : int
        Training samples seen.
    n_outputs_ : int
        Logits per sample: 1 for a binary problem, the number of classes otherwise.
    validation_scores_, best_validation_score_, best_loss_ :
        As in MLPClassifier.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of str
        Names of the features, when X had them.
    """

    _parameter_constraints: dict = {
        **BaseOrtGradient._parameter_constraints,
        "loss": [StrOptions({"auto", *CLASSIFICATION_LOSSES}), BaseLoss],
        "class_weight": [StrOptions({"balanced"}), dict, None],
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
        class_weight=None,
    ):
        super().__init__(
            estimator,
            loss=loss,
            optimizer=optimizer,
            learning_rate=learning_rate,
            learning_rate_init=learning_rate_init,
            power_t=power_t,
            alpha=alpha,
            l1_ratio=l1_ratio,
            batch_size=batch_size,
            max_iter=max_iter,
            shuffle=shuffle,
            random_state=random_state,
            tol=tol,
            n_iter_no_change=n_iter_no_change,
            early_stopping=early_stopping,
            validation_fraction=validation_fraction,
            warm_start=warm_start,
            verbose=verbose,
            device=device,
            on_divergence=on_divergence,
            backend=backend,
            dtype=dtype,
            n_jobs=n_jobs,
            sync_every=sync_every,
        )
        self.class_weight = class_weight

    _task = "classification"
    #: predict, decision_function and the probabilities come from the trained graph's
    #: logits: its session is made at the end of the fit (``_model.make_sessions``)
    _predicts_from_trained_graph = True
    _multilabel = False  # set at fit: an indicator matrix y (MLPClassifier templates)

    # hooks of the shared fit ----------------------------------------------
    def _default_estimator(self):
        from sklearn.linear_model import LogisticRegression  # imported when used

        return LogisticRegression()

    def _validate_targets(self, y, first_call, incremental=False, classes=None):
        if incremental and self._class_weight() == "balanced":  # as SGDClassifier refuses it
            origin = "" if self.class_weight is not None else " (the template's)"
            raise ValueError(
                f"class_weight 'balanced'{origin} is not supported for partial_fit. In "
                "order to use 'balanced' weights, use compute_class_weight('balanced', "
                "classes=classes, y=y). In place of y you can use a large enough sample "
                "of the full training set target to properly estimate the class "
                "frequency distributions. Pass the resulting weights as the class_weight "
                "parameter."
            )
        check_classification_targets(y)
        kind = type_of_target(y, input_name="y")
        if kind == "multilabel-indicator":
            return self._validate_multilabel(y, first_call)
        if kind not in ("binary", "multiclass"):
            raise ValueError(
                f"OrtGradientClassifier supports binary, multiclass and (with an "
                f"MLPClassifier template) multilabel targets, got {kind!r}."
            )
        if not first_call and self._multilabel:
            raise ValueError(
                "The estimator was fitted on multilabel targets: y must be a label "
                "indicator matrix of the same labels."
            )
        if first_call:
            self._multilabel = False
            known = getattr(final_estimator(self._template()), "classes_", None)
            if classes is not None:
                classes = np.unique(np.asarray(classes))
                if known is not None and not np.array_equal(classes, known):
                    raise ValueError(
                        f"classes={classes.tolist()} differs from the classes "
                        f"{np.asarray(known).tolist()} of the fitted template."
                    )
            elif known is not None:
                classes = np.asarray(known)
            elif incremental:
                raise ValueError("classes must be passed on the first call to partial_fit.")
            else:
                classes = np.unique(y)
            if len(classes) < 2:
                raise ValueError(
                    "This solver needs samples of at least 2 classes in the data, but the "
                    f"data contains only one class: {classes[0]}"
                )
        else:
            classes = self._continued_classes(y, incremental, classes)
        unknown = np.setdiff1d(np.unique(y), classes)
        if unknown.size:
            raise ValueError(
                f"y contains labels {unknown.tolist()} that are not among the classes "
                f"{classes.tolist()} the estimator was fitted with."
            )
        index = np.searchsorted(classes, y)
        y2d = np.ascontiguousarray(np.eye(len(classes), dtype=np.float32)[index])
        return y2d, {"classes_": classes}

    def _continued_classes(self, y, incremental, classes):
        """The fitted classes, refusing other ones as MLPClassifier does."""
        if incremental and classes is not None:
            if not np.array_equal(self.classes_, unique_labels(classes)):
                raise ValueError(
                    f"`classes={classes!r}` is not the same as on last call to "
                    f"partial_fit, was: {self.classes_!r}"
                )
        elif not incremental:  # warm_start
            labels = unique_labels(y)
            if set(labels) != set(self.classes_):
                raise ValueError(
                    "warm_start can only be used where `y` has the same classes as in the "
                    f"previous call to fit. Previously got {self.classes_}, `y` has {labels}"
                )
        return self.classes_

    def _validate_multilabel(self, y, first_call):
        """Targets of a multilabel problem: one sigmoid per label, as MLPClassifier."""
        final = final_estimator(self._template())
        if not hasattr(final, "hidden_layer_sizes") and not family_of(final).one_vs_rest(final):
            raise ValueError(
                f"Multilabel targets need an MLPClassifier template (one sigmoid per "
                f"label, as scikit-learn's MLPClassifier), or an ONNX template whose output "
                f"is a Sigmoid; got {type(final).__name__}."
            )
        if self._class_weight() is not None:
            raise ValueError("class_weight is not supported with multilabel targets.")
        y2d = np.ascontiguousarray(y, dtype=np.float32)
        labels = np.arange(y2d.shape[1])
        if first_call:
            known = getattr(final, "classes_", None)
            if known is not None and len(known) != len(labels):
                raise ValueError(f"y has {len(labels)} labels, the fitted template {len(known)}.")
            self._multilabel = True
        elif not self._multilabel or len(labels) != len(self.classes_):
            raise ValueError(
                f"y is a multilabel indicator of {len(labels)} labels; the estimator was "
                f"fitted on {'multilabel' if self._multilabel else 'single-label'} targets "
                f"with {len(self.classes_)} classes."
            )
        return y2d, {"classes_": labels}

    def _n_model_outputs(self, y2d):
        if self._multilabel:
            return y2d.shape[1]
        if y2d.shape[1] == 2:  # binary: one logit, or two for a template that has two
            final = final_estimator(self._template())
            return 2 if family_of(final).output_width(final) == 2 else 1
        return y2d.shape[1]

    def _class_weight(self):
        """The estimator's ``class_weight``, or the template's when it is None."""
        if self.class_weight is not None:
            return self.class_weight
        final = final_estimator(self._template())
        family = family_of(final)
        return None if family is None else family.class_weight(final)

    def _adjust_sample_weight(self, y2d, sample_weight, fitted):
        class_weight = self._class_weight()
        if class_weight is None or self._multilabel:
            return sample_weight
        labels = fitted["classes_"][y2d.argmax(axis=1)]
        weights = compute_sample_weight(class_weight, labels)
        return np.ascontiguousarray(sample_weight * weights, dtype=sample_weight.dtype)

    def _setup_template(self, est, fine_tuned, fitted, loss):
        final = final_estimator(est)
        if fine_tuned:
            return
        classes = fitted["classes_"]
        if family_of(final).signed_targets(final):  # RidgeClassifier predicts through it
            final._label_binarizer = LabelBinarizer(pos_label=1, neg_label=-1).fit(classes)
        final.classes_ = classes
        if hasattr(final, "coefs_") and self._multilabel:  # as MLPClassifier on an indicator
            final._label_binarizer = LabelBinarizer().fit(np.eye(len(classes), dtype=int))
            final.out_activation_ = "logistic"
        elif hasattr(final, "coefs_"):  # MLPClassifier
            final._label_binarizer = LabelBinarizer().fit(classes)
            final.out_activation_ = "logistic" if len(classes) == 2 else "softmax"

    def _one_vs_rest(self):
        """Whether the template's probabilities are normalised one-vs-rest sigmoids."""
        final = final_estimator(self.estimator_)
        if self._multilabel:
            return True  # independent labels, one sigmoid each
        if len(self.classes_) <= 2:
            return False
        if type(final).__name__ == "SGDClassifier" or family_of(final).one_vs_rest(final):
            return True
        return getattr(final, "multi_class", None) == "ovr" or (
            getattr(final, "solver", None) == "liblinear"
        )

    def _resolve_loss(self, loss):
        if isinstance(loss, LogLoss) and hasattr(self, "estimator_") and self._one_vs_rest():
            loss = OneVsRestLogLoss()
        final = final_estimator(self.estimator_)
        self._loss_ = loss  # the loss as trained, OvR included
        self.gives_proba_ = bool(family_of(final).gives_proba(final) and loss.gives_proba)
        return _LogitLoss(
            loss=loss,
            binary=len(self.classes_) == 2 and not self._multilabel and self.n_outputs_ == 1,
            signed=family_of(final).signed_targets(final),
        )

    def _stratify(self, y2d):
        # As MLPClassifier: a stratified split for one output unit (binary) only.
        return y2d.argmax(axis=1) if y2d.shape[1] == 2 and not self._multilabel else None

    def _score_validation(self, X, y, sample_weight, prediction):
        if self._multilabel:  # subset accuracy, as MLPClassifier
            return accuracy_score(y, np.asarray(prediction) > 0, sample_weight=sample_weight)
        return accuracy_score(
            y.argmax(axis=1), self._logits_to_index(prediction), sample_weight=sample_weight
        )

    def _validation_targets(self, y_val, fitted):
        """``y_val`` encoded as ``y`` is: one-hot over the classes (an indicator as is)."""
        classes = fitted["classes_"]
        if self._multilabel:
            return check_array(y_val, dtype=np.float32, input_name="y_val")
        y_val = column_or_1d(y_val, warn=True)
        check_classification_targets(y_val)
        unknown = np.setdiff1d(np.unique(y_val), classes)
        if unknown.size:
            raise ValueError(
                f"y_val contains labels {unknown.tolist()} that are not among the classes "
                f"{classes.tolist()} of y."
            )
        return np.eye(len(classes), dtype=np.float32)[np.searchsorted(classes, y_val)]

    @staticmethod
    def _logits_to_index(logits):
        logits = np.asarray(logits).reshape(logits.shape[0], -1)
        if logits.shape[1] == 1:
            return (logits[:, 0] > 0).astype(np.int64)
        return logits.argmax(axis=1)

    # public API -------------------------------------------------------------
    @with_callbacks
    def fit(self, X, y, sample_weight=None, *, X_val=None, y_val=None, sample_weight_val=None):
        """Train the template's weights on ``X``, ``y``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data (trained in the ``dtype`` parameter's type).
        y : array-like of shape (n_samples,)
            Class labels: integers, strings, any sortable labels.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the loss.
        {validation}

        Returns
        -------
        self : OrtGradientClassifier
        """
        self._validate_params()
        return self._fit(X, y, sample_weight, validation=(X_val, y_val, sample_weight_val))

    @available_if(BaseOrtGradient._stochastic)
    @with_callbacks
    def partial_fit(self, X, y, sample_weight=None, classes=None):
        """Run one epoch over ``X``, ``y``, continuing from the current weights.

        The optimizer state and the learning-rate schedule carry over from one
        call to the next, as with MLPClassifier.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,)
            Class labels, among ``classes``.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the loss.
        classes : array-like of shape (n_classes,), default=None
            All the labels the estimator will see. Required on the first call
            unless the template is fitted (its classes are then used); a later
            call may pass it again, with the same classes (other ones raise a
            ValueError, as MLPClassifier).

        Returns
        -------
        self : OrtGradientClassifier
        """
        if not hasattr(self, "_converted"):
            self._validate_params()
        return self._fit(X, y, sample_weight, incremental=True, classes=classes)

    @dask_aware
    def decision_function(self, X):
        """Return the logits computed by onnxruntime on the trained graph.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_classes)
            The logit of the second class for a binary problem, one logit per
            class otherwise (as LogisticRegression).
        """
        out = _model.run_onnx(self, X, trained_graph=True)[self._converted.output_name]
        out = out.astype(np.float64).reshape(len(out), -1)
        return out.ravel() if out.shape[1] == 1 else out

    def _gives_proba(self):
        """Whether the template and the loss give probabilities (as scikit-learn would)."""
        if hasattr(self, "estimator_"):
            return self.gives_proba_
        try:
            final = final_estimator(self._template())
            return family_of(final).gives_proba(final) and self._objective(final).gives_proba
        except Exception:  # invalid parameters: fit will say why
            return True

    @available_if(_gives_proba)
    @dask_aware
    def predict_proba(self, X):
        """Return class probabilities.

        Computed in float64 from the logits onnxruntime gives (so that no
        probability is rounded to 0 where ``predict_log_proba`` is finite); they
        equal the probabilities output of :meth:`to_onnx` within float32
        rounding. For the modified Huber loss, the exported model's (clipped)
        probabilities, as SGDClassifier gives them.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
            Probabilities, columns in the order of ``classes_``.
        """
        check_is_fitted(self)
        if not isinstance(self._loss_, _losses.ModifiedHuber):
            return np.exp(self.predict_log_proba(X))
        outputs = _model.run_onnx(self, X)
        proba = list(outputs.values())[1]  # the graph's outputs in order: label, probabilities
        return proba.astype(np.float64).reshape(proba.shape[0], len(self.classes_))

    @available_if(_gives_proba)
    @dask_aware
    def predict_log_proba(self, X):
        """Return the log of the class probabilities, computed from the logits.

        Stays finite where ``predict_proba`` rounds a probability to 0 (the
        modified Huber loss's probabilities, clipped, can be 0: their log is
        then ``-inf``, as in scikit-learn).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples, n_classes)
        """
        check_is_fitted(self)
        z = self.decision_function(X)
        if isinstance(self._loss_, _losses.ModifiedHuber):
            with np.errstate(divide="ignore"):
                return np.log(self.predict_proba(X))
        if self._multilabel:  # one independent sigmoid per label, as MLPClassifier
            return -np.logaddexp(0.0, -z.reshape(len(z), -1))
        if z.ndim == 1:
            z = np.c_[np.zeros_like(z), z]
        elif self._one_vs_rest():
            z = -np.logaddexp(0.0, -z)  # log sigmoid, then normalised below
        z = z - z.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    @dask_aware
    def predict(self, X):
        """Return the most probable class of each sample.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_labels)
            Labels, of the type of ``classes_``; for multilabel targets, the label
            indicator matrix (a label is on where its probability is above 0.5).
        """
        # From the decision function, as scikit-learn's linear models and MLPs:
        # normalised clipped scores (modified Huber) can tie where the logits do not.
        z = self.decision_function(X)
        if self._multilabel:
            return (z.reshape(len(z), -1) > 0).astype(np.int64)
        return self.classes_[self._logits_to_index(z)]

    # on dask collections: the accuracy from sums over the partitions, where they are
    score = dask_aware(ClassifierMixin.score)


document(OrtGradientClassifier, "classification")
