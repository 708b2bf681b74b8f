"""OrtGradientRegressor: train a scikit-learn regressor on onnxruntime-training."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.metrics import r2_score
from sklearn.utils._available_if import available_if
from sklearn.utils._param_validation import StrOptions
from sklearn.utils.validation import _check_y

from . import _model
from ._base import BaseOrtGradient, dask_aware
from ._callbacks import with_callbacks
from ._docs import document
from .families import family_of
from .losses import REGRESSION_LOSSES, BaseLoss
from .templates import final_estimator

if TYPE_CHECKING:
    from ._graph import GraphBuilder

__all__ = ["OrtGradientRegressor"]


def _link(loss) -> str:
    """The link a regression loss assumes: ``"log"`` where it receives ``log(mean)``."""
    return "log" if getattr(loss, "link", None) == "log" else "identity"


class _MeanLoss(BaseLoss):
    """An identity-link loss on a template that predicts ``exp`` of its trained output.

    The loss receives ``exp(output)``, the template's prediction (a
    ``loss="squared_error"`` given with a PoissonRegressor template).
    """

    def __init__(self, loss=None):
        self.loss = loss

    @property
    def rowwise(self):
        return self.loss.rowwise

    def smoothed(self, width):
        inner = self.loss.smoothed(width)
        return None if inner is None else _MeanLoss(inner)

    def build(self, g: GraphBuilder, y_pred: str, y_true: str) -> str:
        return self.loss.build(g, g.op("Exp", y_pred), y_true)


class OrtGradientRegressor(RegressorMixin, BaseOrtGradient):
    """Train the weights of a scikit-learn regressor with onnxruntime-training.

    The template (a regressor, or a Pipeline ending in one) is converted to
    ONNX with skl2onnx; the gradient graph of its loss is built by
    onnxruntime-training and run forward and backward by its ``TrainingAgent``;
    an optimizer written as an ONNX graph updates the weights. Batches,
    weights, gradients and optimizer state stay in the runtime during training.
    The result is both a trained ONNX model (:meth:`to_onnx`, used by
    :meth:`predict`) and a fitted scikit-learn estimator (``estimator_``).

    Parameters
    ----------
    {parameters}

    Attributes
    ----------
    estimator_ : estimator or Pipeline
        Copy of the template holding the trained weights.
    loss_ : float
        Loss of the last epoch.
    loss_curve_ : list of float
        Mean training loss of each epoch, penalty included (as MLPRegressor).
    best_loss_ : float or None
        Lowest training loss (None with early stopping).
    validation_scores_ : list of float or None
        R2 on the held-out data at each epoch, with early stopping.
    best_validation_score_ : float or None
        Best of ``validation_scores_``.
    n_iter_ : int
        Epochs run by the last ``fit``.
    backend_ : {"agent", "standard"}
        The backend that trained the model last (see ``backend``).
    t_ : int
        Training samples seen (continued from a fine-tuned MLP's ``t_``).
    n_outputs_ : int
        Number of targets.
    n_features_in_ : int
        Number of features seen during fit.
    feature_names_in_ : ndarray of str
        Names of the features, when X had them.

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.neural_network import MLPRegressor
    >>> from onnxgrad_sklearn import OrtGradientRegressor
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(200, 3).astype(np.float32)
    >>> y = X @ np.array([1.0, -2.0, 0.5]) + 0.1
    >>> reg = OrtGradientRegressor(MLPRegressor(hidden_layer_sizes=(8,)),
    ...                            optimizer="adam", learning_rate_init=0.01,
    ...                            max_iter=30, random_state=0).fit(X, y)
    >>> reg.predict(X[:2]).shape
    (2,)
    """

    _parameter_constraints: dict = {
        **BaseOrtGradient._parameter_constraints,
        "loss": [StrOptions({"auto", *REGRESSION_LOSSES}), BaseLoss],
    }
    _task = "regression"

    def _default_estimator(self):
        from sklearn.linear_model import LinearRegression  # imported when used

        return LinearRegression()

    def _validate_targets(self, y, first_call, incremental=False, classes=None):
        y = np.asarray(y)
        # float64 here (exact for any float y), the training dtype in the shared fit
        return np.ascontiguousarray(y.reshape(y.shape[0], -1), dtype=np.float64), {}

    def _objective(self, final):
        loss = super()._objective(final)
        family = family_of(final)
        if _link(loss) == "log" and not family.can_use_log_link(final):
            raise ValueError(
                f"loss={self.loss!r} has a log link: it trains the model's output as the "
                f"log of the mean, and the model must predict exp of its output. "
                f"{type(final).__name__} predicts its linear output itself, so its "
                "predictions would not be the means. Use a template that predicts "
                "through a log link (PoissonRegressor, GammaRegressor, "
                "TweedieRegressor(power=..., link='log'), whose alpha is the penalty, or "
                "an MLPRegressor, which then predicts exp of its output as "
                "MLPRegressor(loss='poisson')), or the loss's identity link "
                "(PoissonDeviance(link='identity'): the output itself is the mean)."
            )
        return loss

    def _setup_template(self, est, fine_tuned, fitted, loss):
        final = final_estimator(est)
        family = family_of(final)
        if _link(loss) == "log" and family.link(final) != "log":
            family.use_log_link(final)  # it then predicts exp of its output, as trained

    def _resolve_loss(self, loss):
        final = final_estimator(self.estimator_)
        predicts = family_of(final).link(final)
        if predicts == _link(loss):
            return loss
        if predicts == "log":  # the loss is on the mean the model predicts
            return _MeanLoss(loss)
        raise ValueError(
            f"loss={self.loss!r} has a log link and the fitted {type(final).__name__} "
            "predicts its output itself: a continued fit (warm_start, partial_fit) keeps "
            "how the model predicts. Fit anew (warm_start=False) to train it with a log "
            "link."
        )

    def _score_validation(self, X, y, sample_weight, prediction):
        return r2_score(y, prediction.reshape(y.shape), sample_weight=sample_weight)

    def _validation_targets(self, y_val, fitted):
        y_val = _check_y(y_val, multi_output=True, y_numeric=True, estimator=self)
        return np.asarray(y_val, dtype=np.float64).reshape(y_val.shape[0], -1)

    @with_callbacks
    def fit(self, X, y, sample_weight=None, *, X_val=None, y_val=None, sample_weight_val=None):
        """Train the template's weights on ``X``, ``y``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data (trained in the ``dtype`` parameter's type).
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the loss.
        {validation}

        Returns
        -------
        self : OrtGradientRegressor
        """
        self._validate_params()
        return self._fit(X, y, sample_weight, validation=(X_val, y_val, sample_weight_val))

    @available_if(BaseOrtGradient._stochastic)
    @with_callbacks
    def partial_fit(self, X, y, sample_weight=None):
        """Run one epoch over ``X``, ``y``, continuing from the current weights.

        The optimizer state (velocities, moments) and the learning-rate
        schedule carry over from one call to the next, as with MLPRegressor.
        The first call initialises the weights (or starts from a fitted
        template).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data.
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the loss.

        Returns
        -------
        self : OrtGradientRegressor
        """
        if not hasattr(self, "_converted"):
            self._validate_params()
        return self._fit(X, y, sample_weight, incremental=True)

    @dask_aware
    def predict(self, X):
        """Predict with onnxruntime on the trained ONNX model.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Samples.

        Returns
        -------
        ndarray of shape (n_samples,) or (n_samples, n_outputs)
            Predictions, float64 (from the float64 graph after a
            ``dtype="float64"`` fit, copies of its float32 output otherwise).
        """
        outputs = _model.run_onnx(self, X)
        final = final_estimator(self.estimator_)
        name = family_of(final).prediction_output(final)  # None: the graph's first output
        pred = (list(outputs.values())[0] if name is None else outputs[name]).astype(np.float64)
        return pred.ravel() if self.n_outputs_ == 1 else pred.reshape(-1, self.n_outputs_)

    # on dask collections: R2 from sums over the partitions, where they are
    score = dask_aware(RegressorMixin.score)


document(OrtGradientRegressor, "regression")
