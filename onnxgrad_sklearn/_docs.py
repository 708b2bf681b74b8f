"""One source for the parameter docs of the regressor and the classifier.

Both estimators share every parameter but a few; their docstrings take the
``Parameters`` section from :func:`parameters_section`, so the two cannot drift.
"""

from __future__ import annotations

import textwrap

__all__ = ["document", "parameters_section", "validation_section"]

_TASK = {
    "regression": {"mlp": "MLPRegressor", "score": "R2"},
    "classification": {"mlp": "MLPClassifier", "score": "accuracy"},
}

_ESTIMATOR = {
    "regression": """
    estimator : estimator or Pipeline, default=None
        The template: MLPRegressor, a linear model (LinearRegression, Ridge,
        Lasso, QuantileRegressor, HuberRegressor, SGDRegressor, LinearSVR, ...),
        a GLM (PoissonRegressor, GammaRegressor, TweedieRegressor), or a
        Pipeline ending in one (preprocessing steps are frozen). ``None`` means
        ``LinearRegression()``. A fitted template is fine-tuned from its
        weights; an unfitted one is initialised from ``random_state`` (Glorot
        uniform as MLPRegressor does, zeros for linear models). It is never
        modified. See docs/templates.md for what each template trains.
    """,
    "classification": """
    estimator : estimator or Pipeline, default=None
        The template: MLPClassifier (binary, multiclass or multilabel),
        LogisticRegression, SGDClassifier, Perceptron, LinearSVC,
        RidgeClassifier, or a Pipeline ending in one (preprocessing steps are
        frozen). ``None`` means ``LogisticRegression()``. A fitted template is
        fine-tuned from its weights and keeps its classes; an unfitted one is
        initialised from ``random_state`` (Glorot uniform for MLPs, zeros for
        linear models). It is never modified. See docs/templates.md for what
        each template trains.
    """,
}

_LOSS = {
    "regression": """
    loss : "auto", a name of :data:`~onnxgrad_sklearn.losses.REGRESSION_LOSSES` \
or BaseLoss, default="auto"
        The loss, averaged over samples with ``sample_weight``. ``"auto"`` is
        the template's own objective: its loss with its ``quantile``,
        ``epsilon``, ``power`` and link (half the squared error for MLPRegressor
        and least-squares models). A name or an object of
        :mod:`onnxgrad_sklearn.losses` overrides it.
    """,
    "classification": """
    loss : "auto", a name of :data:`~onnxgrad_sklearn.losses.CLASSIFICATION_LOSSES` \
or BaseLoss, default="auto"
        ``"auto"`` is the template's own loss: the log-loss computed from the
        logits (:class:`~onnxgrad_sklearn.losses.LogLoss`, one-vs-rest for
        liblinear and SGDClassifier templates), or the hinge, squared hinge,
        modified Huber or perceptron loss of a margin classifier. A custom
        loss receives the logits, one column per class (a binary problem's
        first class has a zero logit), and one-hot targets.
    """,
}

_COMMON = """
    optimizer : {{"auto", "sgd", "momentum", "nesterov", "adam", "lbfgs"}} or \
BaseOptimizer, default="auto"
        ``"auto"`` is the template family's solver: Adam for MLPs and the
        perceptron, full-batch L-BFGS for the other linear models (the SGD
        family included: the same objective, solved exactly) and GLMs (Adam
        in ``partial_fit``). The stochastic rules run as one ONNX graph per
        batch; ``"lbfgs"`` minimises the whole training set's loss with scipy,
        as {mlp}(solver="lbfgs"). See :mod:`onnxgrad_sklearn.optim`.
    learning_rate : {{"constant", "invscaling", "adaptive"}}, default="constant"
        Schedule of the stochastic optimizers, as in {mlp}.
    learning_rate_init : float, default=0.001
        Initial learning rate.
    power_t : float, default=0.5
        Exponent of the ``"invscaling"`` schedule.
    alpha : float or "auto", default="auto"
        Strength of the penalty on weight matrices (never on intercepts), added
        to each batch's mean loss as ``alpha * ((1 - l1_ratio) / 2 * ||W||^2 +
        l1_ratio * ||W||_1) / n_batch_samples`` ({mlp}'s L2 term at
        ``l1_ratio=0``). ``"auto"``: the template's own penalty converted to
        these terms (an MLP's ``alpha`` as it is; ``1 / C`` for
        LogisticRegression and LinearSVC, SGD's ``alpha`` times the batch rows,
        0 for LinearRegression; table in the user guide), so that the objective
        is the template's: exactly at full batch (``optimizer="lbfgs"``), on
        average over an epoch's batches otherwise.
    l1_ratio : float or "auto", default="auto"
        Share of L1 in the penalty; ``"auto"``: the template's own (0 for L2).
    batch_size : int or "auto", default="auto"
        Rows per batch; ``"auto"`` means ``min(200, n_samples)``.
    max_iter : int, default=200
        Maximum number of epochs (of L-BFGS iterations with ``"lbfgs"``).
    shuffle : bool, default=True
        Permute the rows at each epoch (from ``random_state``); otherwise
        batches are consecutive slices, the last one smaller.
    random_state : int, RandomState instance or None, default=None
        Seeds the initial weights, the shuffling and the validation split, in
        the order {mlp} draws them.
    tol : float, default=1e-4
        Improvement below which an epoch counts as no improvement (the
        gradient tolerance of L-BFGS).
    n_iter_no_change : int or numpy.inf, default=10
        Epochs without improvement before stopping (or lowering the rate with
        ``learning_rate="adaptive"``).
    early_stopping : bool, default=False
        Hold out ``validation_fraction`` of the data{stratified} (or score the
        ``X_val``, ``y_val`` given to ``fit``), stop when its {score} stops
        improving, and keep the weights of the best epoch.
    validation_fraction : float, default=0.1
        Share of the data held out for early stopping (unused when ``fit``
        receives ``X_val``).
    warm_start : bool, default=False
        Make ``fit`` continue from the weights of the previous fit.
    verbose : int, default=0
        1 shows a progress bar over epochs (L-BFGS iterations), 2 one over the
        batches of each epoch too.
    device : str, default="cpu"
        ``"cpu"``, or ``"cuda"``/``"cuda:N"`` with the CUDA build of
        onnxruntime-training (the TrainingAgent backend).
    on_divergence : {{"raise", "warn"}}, default="raise"
        What to do when a batch gives a non-finite loss: training stops, the
        weights go back to the last ones with a finite loss, then ``"raise"``
        raises :class:`~onnxgrad_sklearn.ConvergenceError`, ``"warn"`` gives a
        ``ConvergenceWarning`` and keeps the model usable.
    backend : {{"auto", "agent", "standard"}}, default="auto"
        What computes the gradients and runs the training step. ``"agent"``:
        onnxruntime-training's TrainingAgent (needs ``onnxruntime-training-cpu``,
        Python <= 3.12). ``"standard"``: gradient graphs in standard ONNX
        operators (onnx-ad) with the update in the same graph, on any
        onnxruntime >= 1.20 (CPU in this version). ``"auto"`` picks the agent
        where it is installed and can differentiate every operator of the
        training graph, the standard backend otherwise, and logs the choice at
        INFO; ``backend_`` records what ran. See docs/how_it_works.md for the
        operators each backend differentiates.
    dtype : {{"float32", "float64"}} or None, default="float32"
        The float type training computes in: the converted graph, the loss and
        its constants, the weights, gradients and optimizer state, the update
        and the validation score. ``"float32"`` is the fastest; ``"float64"``
        gives {mlp}'s numbers to machine precision (``estimator_`` then
        holds float64 arrays, ``to_onnx()`` a graph with a ``tensor(double)``
        input, ``to_onnx(dtype="float32")`` a float32 graph of the same model);
        ``None`` follows ``X`` as {mlp} does (float32 data trains in
        float32, anything else in float64). float64 trains on the standard
        backend (``backend="auto"`` picks it; ``backend="agent"`` is refused). A
        continued fit (``warm_start``, ``partial_fit``) keeps the dtype of the
        first.
    n_jobs : int or None, default=None
        onnxruntime's intra-op threads for the training and inference sessions
        (the update of the TrainingAgent backend runs on one thread). ``None``:
        the runtime's default (one thread per physical core), but never more
        than the inner thread limit of the process: the OpenMP threads set by
        ``threadpoolctl`` or ``OMP_NUM_THREADS``, which joblib's process workers
        receive (``cpu_count() // n_jobs`` in ``GridSearchCV(n_jobs=...)``), and
        one thread inside a joblib thread worker. So a parallel search does not
        oversubscribe the CPUs. A positive number: that many threads. ``-1``:
        every CPU (within the limit), ``-2`` all but one, as in joblib. In
        joblib's process workers, which share the CPUs, the runtime's threads
        sleep between kernels instead of spinning.
    sync_every : int, default=1
        Only for a mini-batch fit on a dask cluster (docs/dask.md): with 1, each
        step's batch is summed where its rows are and makes one update, the
        weights of the fit in one process; with ``k > 1`` (local SGD), each worker
        makes ``k`` steps on its own rows (a share of ``batch_size`` in proportion
        to its rows), then the weights and the optimizer state are averaged,
        weighted by rows: ``k`` times fewer rounds, approximate. Data in memory
        ignores it.
"""

_CLASS_WEIGHT = """
    class_weight : dict, "balanced" or None, default=None
        Weights of the classes in the loss, multiplied with ``sample_weight``
        as scikit-learn defines them. None uses the template's
        ``class_weight``.
"""


_VALIDATION_DATA = """
X_val : array-like of shape (n_val, n_features), default=None
    Validation data for early stopping, as HistGradientBoosting takes it: with
    ``early_stopping=True`` it replaces the ``validation_fraction`` split (every
    row of ``X`` then trains), and ``validation_scores_`` and
    ``best_validation_score_`` are the {score} on it; the weights kept are those
    of the best score. It goes through the template's head as ``X`` does. Without
    early stopping it is refused, unless a callback set with ``set_callbacks``
    reads the validation scores (``uses_validation_data=True``): they are then
    recorded at each epoch and nothing stops on them. Stochastic optimizers
    only. In a Pipeline with metadata routing,
    ``Pipeline(..., transform_input=["X_val"])`` transforms it by the steps in
    front; ``set_fit_request(X_val=True, y_val=True)`` routes it through
    GridSearchCV, which slices a fit parameter with as many rows as ``X`` into
    its folds as it slices ``X``.
y_val : array-like of shape (n_val,) or (n_val, {outputs}), default=None
    Targets of ``X_val``{labels}.
sample_weight_val : array-like of shape (n_val,), default=None
    Weights of the rows of ``X_val`` in the validation score.
"""


def validation_section(task: str) -> str:
    """Return the numpydoc entries of ``fit``'s ``X_val``, ``y_val`` and
    ``sample_weight_val`` for ``task``, unindented."""
    labels = ", among the classes of ``y``" if task == "classification" else ""
    outputs = "n_labels" if task == "classification" else "n_outputs"
    text = _VALIDATION_DATA.format(score=_TASK[task]["score"], labels=labels, outputs=outputs)
    return textwrap.dedent(text).strip("\n")


def parameters_section(task: str) -> str:
    """Return the numpydoc ``Parameters`` entries of the estimator for ``task``.

    Parameters
    ----------
    task : {"regression", "classification"}
        Which estimator.

    Returns
    -------
    str
        The entries, indented by four spaces, in the order of the signature.
    """
    words = dict(_TASK[task])
    words["stratified"] = (
        " (stratified for a binary problem, as MLPClassifier)" if task == "classification" else ""
    )
    parts = [_ESTIMATOR[task], _LOSS[task], _COMMON.format(**words)]
    if task == "classification":
        parts.append(_CLASS_WEIGHT)
    return "\n".join(textwrap.dedent(p).strip("\n") for p in parts)


def document(cls, task: str):
    """Put the shared ``Parameters`` entries into the docstring of ``cls``, in place.

    The class docstring holds the line ``{parameters}`` where the entries go, and
    that of its ``fit`` the line ``{validation}`` where ``X_val``'s go.
    """
    entries = textwrap.indent(parameters_section(task), "    ")
    cls.__doc__ = cls.__doc__.replace("    {parameters}", entries)
    fit = cls.__dict__.get("fit")
    if fit is not None and fit.__doc__ and "{validation}" in fit.__doc__:
        entries = textwrap.indent(validation_section(task), " " * 8)
        fit.__doc__ = fit.__doc__.replace(" " * 8 + "{validation}", entries)
    return cls
