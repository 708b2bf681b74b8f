"""OrtGradientRegressor: train a scikit-learn regressor on onnxruntime-training."""

from __future__ import annotations

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score
from sklearn.utils._available_if import available_if
from sklearn.utils._param_validation import StrOptions

from ._base import BaseOrtGradient
from .losses import REGRESSION_LOSSES, BaseLoss

__all__ = ["OrtGradientRegressor"]


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
    estimator : estimator or Pipeline, default=None
        The template: MLPRegressor, a linear regressor (LinearRegression,
        Ridge, Lasso, ElasticNet, SGDRegressor, ...), or a Pipeline ending in
        one (preprocessing steps are frozen). ``None`` means
        ``LinearRegression()``. A fitted template is fine-tuned from its
        weights; an unfitted one is initialised from ``random_state`` (Glorot
        uniform as MLPRegressor does, zeros for linear models). It is never
        modified.
    loss : {"squared_error", "absolute_error", "huber", "quantile"} or BaseLoss, \
            default="squared_error"
        The loss, averaged over samples with ``sample_weight``.
        ``"squared_error"`` is half the squared error, as MLPRegressor defines it.
        See :mod:`onnxgrad_sklearn.losses` for parameters and custom losses.
    optimizer : {"sgd", "momentum", "nesterov", "adam"} or BaseOptimizer, default="sgd"
        The update rule, run as one ONNX graph per batch. See
        :mod:`onnxgrad_sklearn.optim`.
    learning_rate : {"constant", "invscaling", "adaptive"}, default="constant"
        Schedule, as in MLPRegressor.
    learning_rate_init : float, default=0.001
        Initial learning rate.
    power_t : float, default=0.5
        Exponent of the ``"invscaling"`` schedule.
    alpha : float, default=0.0001
        Strength of the penalty on weight matrices (never on intercepts).
    l1_ratio : float, default=0.0
        Share of L1 in the penalty; 0 is MLPRegressor's L2 term
        ``0.5 * alpha * ||W||^2 / n_samples``.
    batch_size : int or "auto", default="auto"
        Rows per batch; ``"auto"`` means ``min(200, n_samples)``.
    max_iter : int, default=200
        Maximum number of epochs.
    shuffle : bool, default=True
        Permute the rows at each epoch (from ``random_state``); otherwise
        batches are consecutive slices, the last one smaller.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial weights, the shuffling and the validation split, in
        the order MLPRegressor draws them.
    tol : float, default=1e-4
        Improvement below which an epoch counts as no improvement.
    n_iter_no_change : int, default=10
        Epochs without improvement before stopping (or lowering the rate with
        ``learning_rate="adaptive"``).
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the data, stop when its R2 stops
        improving, and keep the weights of the best epoch.
    validation_fraction : float, default=0.1
        Share of the data held out for early stopping.
    warm_start : bool, default=False
        Make ``fit`` continue from the weights of the previous fit.
    verbose : int, default=0
        1 shows a progress bar over epochs.
    device : str, default="cpu"
        ``"cpu"``, or ``"cuda"``/``"cuda:N"`` with the CUDA build of
        onnxruntime-training.
    on_divergence : {"raise", "warn"}, default="raise"
        What to do when a batch gives a non-finite loss: training stops, the
        weights go back to the last ones with a finite loss, then ``"raise"``
        raises :class:`~onnxgrad_sklearn.ConvergenceError`, ``"warn"`` gives a
        ``ConvergenceWarning`` and keeps the model usable.
    backend : {"auto", "agent", "standard"}, default="auto"
        What computes the gradients and runs the training step. ``"agent"``:
        onnxruntime-training's TrainingAgent (needs ``onnxruntime-training-cpu``,
        Python <= 3.12). ``"standard"``: gradient graphs in standard ONNX
        operators (onnx-ad) with the update in the same graph, on any
        onnxruntime >= 1.20 (CPU in this version). ``"auto"`` picks the agent
        where it is installed and can differentiate every operator of the
        training graph, the standard backend otherwise, and logs the choice at
        INFO; ``backend_`` records what ran. See ``docs/how_it_works.md`` for
        the operators each backend differentiates.
    dtype : {"float32", "float64"} or None, default="float32"
        The float type training computes in: the converted graph, the loss and
        its constants, the weights, gradients and optimizer state, the update
        and the validation score. ``"float32"`` is the fastest; ``"float64"``
        gives MLPRegressor's numbers to machine precision (``estimator_`` then holds
        float64 arrays, ``to_onnx()`` a graph with a ``tensor(double)`` input,
        ``to_onnx(dtype="float32")`` a float32 graph of the same model);
        ``None`` follows ``X`` as MLPRegressor does (float32 data trains in float32,
        anything else in float64). float64 trains on the standard backend
        (``backend="auto"`` picks it; ``backend="agent"`` is refused). A
        continued fit (``warm_start``, ``partial_fit``) keeps the dtype of the
        first.
    n_jobs : int or None, default=None
        onnxruntime's intra-op threads for the training and inference sessions
        (the update of the TrainingAgent backend runs on one thread). ``None``:
        the runtime's default (one thread per physical core, the fastest on
        the benchmark), but never more than the inner thread limit of the
        process: the OpenMP threads set by ``threadpoolctl`` or
        ``OMP_NUM_THREADS``, which joblib's process workers receive
        (``cpu_count() // n_jobs`` in ``GridSearchCV(n_jobs=...)``), and one
        thread inside a joblib thread worker. So a parallel search does not
        oversubscribe the CPUs. A positive number: that many threads. ``-1``:
        every CPU (within the limit), ``-2`` all but one, as in joblib.

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
        return LinearRegression()

    def _validate_targets(self, y, first_call, incremental=False, classes=None):
        y = np.asarray(y)
        # float64 here (exact for any float y), the training dtype in the shared fit
        return np.ascontiguousarray(y.reshape(y.shape[0], -1), dtype=np.float64), {}

    def _score_validation(self, X, y, sample_weight, prediction):
        return r2_score(y, prediction.reshape(y.shape), sample_weight=sample_weight)

    def fit(self, X, y, sample_weight=None):
        """Train the template's weights on ``X``, ``y``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
            Training data (trained in the ``dtype`` parameter's type).
        y : array-like of shape (n_samples,) or (n_samples, n_outputs)
            Targets.
        sample_weight : array-like of shape (n_samples,), default=None
            Weights of the samples in the loss.

        Returns
        -------
        self : OrtGradientRegressor
        """
        self._validate_params()
        return self._fit(X, y, sample_weight)

    @available_if(BaseOrtGradient._stochastic)
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
        outputs = self._run_onnx(X)
        pred = outputs[self._export_model.graph.output[0].name].astype(np.float64)
        return pred.ravel() if self.n_outputs_ == 1 else pred.reshape(-1, self.n_outputs_)
