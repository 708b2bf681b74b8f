"""The model families the estimators train: one entry per family, in one registry.

A *family* says everything the package needs to know about a kind of
scikit-learn model:

* its task (regression or classification) and its parameters (:class:`ParamRef`);
* how an unfitted model gets initial weights;
* the model whose graph is trained (``trained_view``): the template itself, or
  a regressor giving its raw scores (the logits of a classifier, the linear
  predictor of a GLM), sharing its arrays;
* the template's own objective: its default loss (with the template's
  ``quantile``, ``epsilon``, ``power``, ``link``), its ``class_weight``, and
  whether it gives probabilities;
* the default solver of ``optimizer="auto"`` (Adam for MLPs and Perceptron,
  full-batch L-BFGS for the other linear models and GLMs);
* the template's own penalty in the estimators' terms (``alpha="auto"``);
* which of the template's settings carry over, and for the others the
  estimator parameter that reproduces them (:func:`dropped_settings`);
* export fix-ups (skl2onnx options).

Adding a family is adding an entry to the registry (:func:`families`); see
docs/extending.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from sklearn.base import is_classifier

__all__ = ["Family", "ParamRef", "dropped_settings", "families", "family_of", "supported_names"]

# Settings that never change what is trained (resources, logging).
_NEUTRAL = {"verbose", "n_jobs", "copy_X", "precompute", "selection", "dual"}


@dataclass(frozen=True)
class ParamRef:
    """Where one parameter lives in the final model.

    Attributes
    ----------
    attr : str
        Attribute name (``coefs_``, ``coef_``...).
    index : int or None
        Position in the attribute when it is a list (MLP layers), else None.
    penalized : bool
        Whether ``alpha``/``l1_ratio`` penalise it (weight matrices, not biases).
    trainable : bool
        Whether it is trained (an intercept with ``fit_intercept=False`` is not).
    """

    attr: str
    index: int | None
    penalized: bool
    trainable: bool = True

    @property
    def label(self) -> str:
        """Readable name, such as ``coefs_[1]``."""
        return self.attr if self.index is None else f"{self.attr}[{self.index}]"

    def get(self, est) -> np.ndarray:
        """Return the parameter's value in ``est``."""
        value = getattr(est, self.attr)
        return np.asarray(value if self.index is None else value[self.index])

    def set(self, est, value) -> None:
        """Store ``value`` as the parameter of ``est`` (keeping its type and shape)."""
        if self.index is None:
            old = getattr(est, self.attr)
            if np.ndim(old) == 0:
                value = np.float64(np.asarray(value).reshape(()))
            setattr(est, self.attr, value)
        else:
            getattr(est, self.attr)[self.index] = value


class Family:
    """What the package knows of one family of scikit-learn models.

    Subclasses set the class attributes and override the methods that differ.

    Attributes
    ----------
    kind : {"linear", "mlp"}
        How the parameters are laid out.
    task : {"regression", "classification"}
        What the model predicts.
    solver : {"adam", "lbfgs"}
        What ``optimizer="auto"`` trains it with in ``fit``.
    carried : set of str
        Template parameters that carry over (structure and objective).
    penalty_settings : set of str
        Template parameters that make its penalty: they carry over with
        ``alpha="auto"`` (:meth:`penalty`).
    """

    kind = "base"
    task = "regression"
    solver = "lbfgs"
    carried: frozenset = frozenset({"fit_intercept"})
    penalty_settings: frozenset = frozenset({"alpha", "l1_ratio", "C", "penalty"})

    # parameters ---------------------------------------------------------
    def params(self, est) -> list[ParamRef]:
        """Return the parameters of ``est``, in the order they are trained."""
        raise NotImplementedError

    def initialize(self, est, n_features: int, n_outputs: int, rng, dtype=np.float32) -> None:
        """Give an unfitted ``est`` initial parameters for ``n_outputs`` outputs.

        ``dtype`` is the training dtype (float32 or float64): an MLP's initial
        weights are drawn in float64 and cast to it, as MLPRegressor does.
        """
        raise NotImplementedError

    def marker_shapes(self, values):
        """Shapes of the markers the template is converted with (default: the real ones)."""
        return [np.shape(v) for v in values]

    def trained_view(self, est):
        """Return the model whose graph is trained, sharing ``est``'s arrays.

        ``None`` when it is ``est`` itself.
        """
        return None

    # objective ----------------------------------------------------------
    def loss(self, est):
        """Return the loss (name or object) that is the template's own objective."""
        return "squared_error"

    def loss_for(self, est, task: str):
        """The template's own loss for ``task`` (a family of ``task="any"`` depends on it)."""
        return self.loss(est)

    def class_weight(self, est):
        """Return the template's class weights (None when it has none)."""
        return getattr(est, "class_weight", None)

    def gives_proba(self, est) -> bool:
        """Whether the fitted template has ``predict_proba``."""
        return False

    def signed_targets(self, est) -> bool:
        """Whether a classifier's targets are -1/+1 columns of a squared error (ridge)."""
        return False

    def check(self, est) -> None:
        """Raise a ValueError when a setting of ``est`` cannot be trained."""

    def link(self, est) -> str:
        """What ``est`` applies to its trained graph's output to predict.

        ``"identity"`` (the default: it predicts the output itself) or ``"log"``
        (it predicts ``exp`` of the output, the inverse of a log link).
        """
        return "identity"

    def can_use_log_link(self, est) -> bool:
        """Whether :meth:`use_log_link` can make ``est`` predict ``exp`` of its output."""
        return self.link(est) == "log"

    def use_log_link(self, est) -> None:
        """Make ``est`` (a copy the estimators own) predict ``exp`` of its trained output.

        For a log-link loss given to the estimator (``loss="poisson"``) on a template
        whose own link is the identity. Only called where :meth:`can_use_log_link`.
        """

    def penalty(self, est, n_samples: int, rows: int) -> tuple[float, float]:
        """Return the template's own penalty as the estimators' ``(alpha, l1_ratio)``.

        The estimators add ``alpha * ((1 - l1_ratio) / 2 * ||W||^2 + l1_ratio *
        ||W||_1)`` divided by the batch's weight sum to the batch's mean loss, as
        MLPRegressor. A template whose objective is ``mean loss + lam * P(w)`` over its
        ``n_samples`` training rows is reproduced by ``alpha = lam * rows``, ``rows``
        being the rows of one batch (``n_samples`` at full batch): exactly at full
        batch, on average over an epoch's batches otherwise.

        Parameters
        ----------
        est : estimator
            The final model of the template.
        n_samples : int
            Training rows.
        rows : int
            Rows per batch (``n_samples`` for a full-batch solver).

        Returns
        -------
        alpha, l1_ratio : float
            ``(0.0, 0.0)`` for a template without penalty (the default).
        """
        return 0.0, 0.0

    def solver_of(self, est) -> str:
        """What ``optimizer="auto"`` trains ``est`` with in ``fit`` (default: :attr:`solver`)."""
        return self.solver

    def penalty_unknown(self, est) -> str | None:
        """Why the template's penalty is not known before it is fitted, or None."""
        return None

    def prepare(self, est, task: str) -> None:
        """Make the estimators' fitted copy ``est`` ready to convert, for ``task``
        (default: nothing)."""

    def one_vs_rest(self, est) -> bool:
        """Whether the template's classes are independent sigmoids (one-vs-rest)."""
        return False

    def output_width(self, est) -> int | None:
        """The values per sample the trained output gives, where the template fixes it
        (None: as many as the targets)."""
        return None

    def prediction_output(self, est) -> str | None:
        """The exported graph's output that is the prediction (None: its first)."""
        return None

    def serves(self, task: str) -> bool:
        """Whether the family's models do ``task``."""
        return self.task in (task, "any")

    # conversion and export ----------------------------------------------
    def convert(self, est, n_features: int, dtype):
        """The template's :class:`~onnxgrad_sklearn._converted.ConvertedTemplate`, or
        None for a scikit-learn model (converted by skl2onnx, its parameters located)."""
        return None

    def export(self, est, n_features: int, dtype):
        """The exported ONNX model of the fitted ``est``, or None for a scikit-learn
        model (converted by skl2onnx)."""
        return None

    black_op = frozenset({"LinearRegressor", "LinearClassifier", "Scaler"})

    def output_link(self, est) -> str | None:
        """An operator skl2onnx cannot export, appended to the trained view's graph.

        ``None``: skl2onnx converts the model itself. ``"Exp"``: the exported graph
        is the trained view's (raw scores) followed by ``Exp`` (MLPRegressor with
        ``loss="poisson"``, whose output activation skl2onnx does not know).
        """
        return None

    def fix_export(self, est, model) -> None:
        """Correct, in place, what skl2onnx's graph of ``est`` gets wrong (default: nothing)."""

    def export_options(self, est, dtype=np.float32) -> dict:
        """skl2onnx options of the exported model (``dtype``: the graph's float type)."""
        return {"zipmap": False} if is_classifier(est) else {}

    # settings that do not carry over ------------------------------------
    def conversion(self, name: str, value, est, n_samples: int) -> str | None:
        """Return how to reproduce the template setting ``name=value``, or None."""
        return _SAME_NAME.get(name)


# Estimator parameters of the same name and meaning as the template's.
_SAME_NAME = {
    name: f"{name}={{value!r}}"
    for name in (
        "learning_rate_init",
        "power_t",
        "batch_size",
        "max_iter",
        "shuffle",
        "random_state",
        "tol",
        "n_iter_no_change",
        "early_stopping",
        "validation_fraction",
        "warm_start",
    )
}


def _mean_form(lam, ratio, rows):
    """(alpha, l1_ratio) of a template objective ``mean loss + lam * P(w)``."""
    lam = float(np.mean(lam))  # Ridge takes one alpha per target: one penalty here
    return (lam * rows, float(ratio)) if np.isfinite(lam) and lam > 0 else (0.0, 0.0)


def _cv_unknown(est, attr="alpha_"):
    if type(est).__name__.endswith(("CV", "IC")) and not hasattr(est, attr):
        return (
            f"the penalty {type(est).__name__} chooses by cross-validation is not known "
            "before it is fitted: trained without penalty (set alpha= on the estimator, or "
            "pass the fitted template)"
        )
    return None


def _penalty_advice(alpha, l1_ratio=0.0, why=""):
    alpha = float(f"{alpha:.6g}")
    ratio = f", l1_ratio={l1_ratio!r}" if l1_ratio else ""
    return f"alpha={alpha!r}{ratio} ({why}; exact at full batch, as with optimizer='lbfgs')"


class _LinearFamily(Family):
    """Linear models: ``X @ coef_.T + intercept_``, zeros at the start."""

    kind = "linear"

    def params(self, est):
        return [
            ParamRef("coef_", None, True),
            ParamRef("intercept_", None, False, bool(getattr(est, "fit_intercept", True))),
        ]

    def initialize(self, est, n_features, n_outputs, rng, dtype=np.float32):
        single = n_outputs == 1
        est.n_features_in_ = n_features
        if is_classifier(est):
            est.coef_ = np.zeros((n_outputs, n_features))
            est.intercept_ = np.zeros(n_outputs)
        else:
            est.coef_ = np.zeros(n_features) if single else np.zeros((n_outputs, n_features))
            est.intercept_ = np.float64(0.0) if single else np.zeros(n_outputs)

    def conversion(self, name, value, est, n_samples):
        """A penalty setting: the template's own penalty (:meth:`penalty`) at full batch."""
        if name not in self.penalty_settings:
            return None
        alpha, l1_ratio = self.penalty(est, n_samples, n_samples)
        return _penalty_advice(alpha, l1_ratio, self.penalty_why(est, n_samples))

    def penalty_why(self, est, n_samples: int) -> str:
        """How the template's penalty becomes ``alpha``, for the advice of :meth:`conversion`."""
        return f"{type(est).__name__}'s alpha times n_samples={n_samples}"

    def _linear_view(self, est):
        from sklearn.linear_model import LinearRegression

        reg = LinearRegression(fit_intercept=bool(getattr(est, "fit_intercept", True)))
        reg.coef_ = est.coef_
        reg.intercept_ = est.intercept_
        reg.n_features_in_ = est.n_features_in_
        return reg


class _LeastSquares(_LinearFamily):
    """LinearRegression, Ridge, Lasso, ElasticNet and the other least-squares fits."""

    def penalty(self, est, n_samples, rows):
        cls = type(est).__name__
        cv = cls.endswith(("CV", "IC"))
        if cls.startswith("Ridge"):  # ||y - Xw||^2 + alpha ||w||^2, twice half the squares
            alpha = getattr(est, "alpha_" if cv else "alpha", 0.0)
            return _mean_form(np.asarray(alpha) / n_samples, 0.0, rows)
        if cls.startswith(("Lasso", "ElasticNet")):  # mean of half squares + alpha * P(w)
            alpha = getattr(est, "alpha_" if cv else "alpha", 0.0)
            if cls.startswith("Lasso"):
                ratio = 1.0
            else:
                ratio = getattr(est, "l1_ratio_" if cv else "l1_ratio", 0.5)
            return _mean_form(alpha, ratio, rows)
        return 0.0, 0.0  # LinearRegression, Lars, Bayesian fits: no fixed penalty

    def penalty_unknown(self, est):
        cls = type(est).__name__
        return _cv_unknown(est) if cls.startswith(("Ridge", "Lasso", "ElasticNet")) else None

    def penalty_why(self, est, n_samples):
        cls = type(est).__name__
        if cls.startswith("Ridge"):
            return f"{cls}'s alpha is this alpha"
        return super().penalty_why(est, n_samples)


class _SGDRegressor(_LinearFamily):
    carried = frozenset({"fit_intercept", "loss", "epsilon"})

    def loss(self, est):
        from . import losses

        if est.loss == "squared_error":
            return losses.SquaredError()
        if est.loss == "huber":
            return losses.Huber(epsilon=est.epsilon)
        return losses.get_loss(est.loss).set_params(epsilon=est.epsilon)

    def initialize(self, est, n_features, n_outputs, rng, dtype=np.float32):
        if n_outputs != 1:
            raise ValueError(
                "SGDRegressor has a single output; use LinearRegression or MLPRegressor as "
                "template for a 2-D y."
            )
        est.n_features_in_ = n_features
        est.coef_ = np.zeros(n_features)
        est.intercept_ = np.zeros(1)

    def conversion(self, name, value, est, n_samples):
        return _sgd_conversion(self, name, value, est, n_samples)

    def penalty(self, est, n_samples, rows):
        return _sgd_penalty(est, rows)


def _sgd_penalty(est, rows):
    """SGD's objective: mean loss + alpha * R(w), R of ``penalty`` and ``l1_ratio``."""
    if est.penalty is None:
        return 0.0, 0.0
    ratio = {"l2": 0.0, "l1": 1.0}.get(est.penalty, getattr(est, "l1_ratio", 0.15))
    return _mean_form(est.alpha, ratio, rows)


def _sgd_conversion(family, name, value, est, n_samples):
    if name == "eta0":
        return "learning_rate_init= (the step size of the estimator's optimizer)"
    return _LinearFamily.conversion(family, name, value, est, n_samples) or _SAME_NAME.get(name)


class _HuberRegressor(_LinearFamily):
    carried = frozenset({"fit_intercept", "epsilon"})

    def loss(self, est):
        from . import losses

        return losses.Huber(epsilon=est.epsilon)

    def penalty(self, est, n_samples, rows):  # sum of losses + alpha ||w||^2
        return _mean_form(2 * est.alpha / n_samples, 0.0, rows)

    def penalty_why(self, est, n_samples):
        return "twice HuberRegressor's alpha"


class _QuantileRegressor(_LinearFamily):
    carried = frozenset({"fit_intercept", "quantile"})

    def loss(self, est):
        from . import losses

        return losses.Quantile(quantile=est.quantile)

    def penalty(self, est, n_samples, rows):  # mean pinball loss + alpha ||w||_1
        return _mean_form(est.alpha, 1.0, rows)


def _c_penalty(C, n_samples, rows, ratio=0.0):
    """C * sum of losses + P(w): mean loss + P(w) / (C n)."""
    return _mean_form(1.0 / (np.asarray(C, dtype=float) * n_samples), ratio, rows)


def _c_why(est, liblinear=False):
    why = f"alpha = 1 / C for {type(est).__name__}"
    return why + ("; liblinear also penalises the intercept, this does not" if liblinear else "")


class _LinearSVR(_LinearFamily):
    carried = frozenset({"fit_intercept", "loss", "epsilon"})

    def loss(self, est):
        from . import losses

        return losses.get_loss(est.loss).set_params(epsilon=est.epsilon)

    def penalty(self, est, n_samples, rows):
        return _c_penalty(est.C, n_samples, rows)

    def penalty_why(self, est, n_samples):
        return _c_why(est, liblinear=True)


class _GLM(_LinearFamily):
    """PoissonRegressor, GammaRegressor, TweedieRegressor: deviance of a linear predictor."""

    carried = frozenset({"fit_intercept", "power", "link"})

    def trained_view(self, est):
        return self._linear_view(est)

    def initialize(self, est, n_features, n_outputs, rng, dtype=np.float32):
        super().initialize(est, n_features, n_outputs, rng, dtype)
        est._base_loss = est._get_loss()  # what predict reads (loss and link)

    def can_use_log_link(self, est):
        return True  # Poisson and Gamma have it; TweedieRegressor takes link="log"

    def use_log_link(self, est):
        est.link = "log"
        est._base_loss = est._get_loss()  # what predict reads

    def link(self, est) -> str:
        name = type(est).__name__
        if name == "TweedieRegressor":
            if est.link == "auto":
                return "identity" if est.power <= 0 else "log"
            return est.link
        return "log"

    def loss(self, est):
        from . import losses

        name = {
            "PoissonRegressor": "poisson",
            "GammaRegressor": "gamma",
            "TweedieRegressor": "tweedie",
        }[type(est).__name__]
        loss = losses.get_loss(name).set_params(link=self.link(est))
        if name == "tweedie":
            loss.set_params(power=est.power)
        return loss

    def penalty(self, est, n_samples, rows):  # mean half deviance + alpha / 2 ||w||^2
        return _mean_form(est.alpha, 0.0, rows)


class _LinearClassifier(_LinearFamily):
    """Linear classifiers: the logits ``X @ coef_.T + intercept_`` are trained."""

    task = "classification"
    carried = frozenset({"fit_intercept", "class_weight"})

    def trained_view(self, est):
        return self._linear_view(est)


class _LogisticRegression(_LinearClassifier):
    def loss(self, est):
        return "log_loss"

    def gives_proba(self, est):
        return True

    def penalty(self, est, n_samples, rows):
        cv = type(est).__name__.endswith("CV")
        if cv and not hasattr(est, "C_"):
            return 0.0, 0.0
        penalty = getattr(est, "penalty", "deprecated")
        if penalty is None or penalty == "none":
            return 0.0, 0.0
        if cv:
            ratio = np.ravel(getattr(est, "l1_ratio_", [0.0]))[0]
            ratio = 0.0 if ratio is None else ratio
        else:
            ratio = {"l2": 0.0, "l1": 1.0}.get(penalty, est.l1_ratio)
        C = np.ravel(est.C_)[0] if cv else est.C
        return _c_penalty(C, n_samples, rows, 0.0 if ratio is None else ratio)

    def penalty_unknown(self, est):
        return _cv_unknown(est, "C_")

    def penalty_why(self, est, n_samples):
        return _c_why(est)


class _SGDClassifier(_LinearClassifier):
    carried = frozenset({"fit_intercept", "class_weight", "loss", "epsilon"})
    _LOSSES = ("log_loss", "hinge", "modified_huber", "squared_hinge", "perceptron")

    def check(self, est):
        if est.loss not in self._LOSSES:
            raise ValueError(
                f"SGDClassifier(loss={est.loss!r}) is not supported as a template: use one of "
                f"{', '.join(self._LOSSES)}."
            )

    def loss(self, est):
        return "log_loss" if est.loss == "log_loss" else est.loss

    def gives_proba(self, est):
        return est.loss in ("log_loss", "modified_huber")

    def conversion(self, name, value, est, n_samples):
        return _sgd_conversion(self, name, value, est, n_samples)

    def penalty(self, est, n_samples, rows):
        return _sgd_penalty(est, rows)

    def solver_of(self, est):
        # The perceptron criterion is 0 at w = 0, its minimum: only the perceptron's
        # stochastic updates (here Adam) make it move.
        return "adam" if est.loss == "perceptron" else "lbfgs"


class _Perceptron(_SGDClassifier):
    carried = frozenset({"fit_intercept", "class_weight"})

    def solver_of(self, est):
        return "adam"

    def check(self, est):
        pass

    def loss(self, est):
        return "perceptron"

    def gives_proba(self, est):
        return False


class _LinearSVC(_LinearClassifier):
    carried = frozenset({"fit_intercept", "class_weight", "loss", "multi_class"})
    black_op = frozenset({"LinearRegressor", "Scaler"})

    def check(self, est):
        if est.multi_class != "ovr":
            raise ValueError(
                f"LinearSVC(multi_class={est.multi_class!r}) is not supported: use "
                "multi_class='ovr' (one-vs-rest)."
            )
        if est.penalty != "l2":
            raise ValueError(
                f"LinearSVC(penalty={est.penalty!r}) is not supported: use penalty='l2' and "
                "the estimator's alpha and l1_ratio for the penalty."
            )

    def loss(self, est):
        return est.loss

    def export_options(self, est, dtype=np.float32):
        return _scores_export_options(dtype)

    def fix_export(self, est, model):
        _keep_positive_scores(est, model)

    def penalty(self, est, n_samples, rows):
        return _c_penalty(est.C, n_samples, rows)

    def penalty_why(self, est, n_samples):
        return _c_why(est, liblinear=True)


class _RidgeClassifier(_LinearClassifier):
    black_op = frozenset({"LinearRegressor", "Scaler"})

    def loss(self, est):
        return "squared_error"

    def signed_targets(self, est):
        return True

    def export_options(self, est, dtype=np.float32):
        return _scores_export_options(dtype)

    def fix_export(self, est, model):
        _keep_positive_scores(est, model)

    def penalty(self, est, n_samples, rows):
        cv = type(est).__name__.endswith("CV")
        alpha = getattr(est, "alpha_" if cv else "alpha", 0.0)
        return _mean_form(np.asarray(alpha) / n_samples, 0.0, rows)

    def penalty_unknown(self, est):
        return _cv_unknown(est)

    def penalty_why(self, est, n_samples):
        return f"{type(est).__name__}'s alpha is this alpha"


def _scores_export_options(dtype):
    # skl2onnx converts LinearSVC and RidgeClassifier to double only with raw_scores
    # (without: NotImplementedError "post_transform 'NONE' is not supported with double")
    return {"raw_scores": True} if np.dtype(dtype) == np.float64 else {}


def _keep_positive_scores(est, model) -> None:
    """Give a binary double export the float32 export's scores: ``f``, shape (n, 1).

    With ``raw_scores`` skl2onnx outputs ``[-f, f]`` for two classes.
    """
    from onnx import TensorProto, helper, numpy_helper

    if len(est.classes_) != 2 or model.graph.input[0].type.tensor_type.elem_type != (
        TensorProto.DOUBLE
    ):
        return
    output = model.graph.output[1]
    pair = output.name + "_pair"
    for node in model.graph.node:
        for names in (node.input, node.output):
            for k, name in enumerate(names):
                if name == output.name:
                    names[k] = pair
    index = output.name + "_positive"
    model.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), index))
    model.graph.node.append(
        helper.make_node("Gather", [pair, index], [output.name], axis=1, name=index)
    )
    dims = output.type.tensor_type.shape.dim
    if len(dims) == 2:
        dims[1].dim_value = 1


class _MLPFamily(Family):
    """MLPRegressor and MLPClassifier: ``coefs_`` and ``intercepts_`` of every layer."""

    kind = "mlp"
    solver = "adam"
    carried = frozenset({"hidden_layer_sizes", "activation", "loss"})

    def marker_shapes(self, values):
        # Hidden layers of 2, 3, 4... units: distinct, so every dimension of a
        # marker tells which dimension of the real array it stands for.
        n = len(values) // 2
        sizes = [values[0].shape[0]] + [k + 2 for k in range(n - 1)] + [values[n - 1].shape[1]]
        coefs = [(sizes[k], sizes[k + 1]) for k in range(n)]
        return coefs + [(sizes[k + 1],) for k in range(n)]

    def params(self, est):
        n = len(est.coefs_)
        return [ParamRef("coefs_", i, True) for i in range(n)] + [
            ParamRef("intercepts_", i, False) for i in range(n)
        ]

    def initialize(self, est, n_features, n_outputs, rng, dtype=np.float32):
        hidden = est.hidden_layer_sizes
        if not hasattr(hidden, "__iter__"):
            hidden = [hidden]
        hidden = list(hidden)
        if any(int(h) <= 0 for h in hidden):
            raise ValueError(f"hidden_layer_sizes must be > 0, got {hidden}.")
        units = [n_features, *hidden, n_outputs]
        # Same draws, in the same order, as MLPRegressor._init_coef, cast to the
        # training dtype as MLPRegressor casts them to the dtype of X.
        factor = 2.0 if est.activation == "logistic" else 6.0
        est.coefs_, est.intercepts_ = [], []
        for fan_in, fan_out in zip(units[:-1], units[1:]):
            bound = np.sqrt(factor / (fan_in + fan_out))
            est.coefs_.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype))
            est.intercepts_.append(rng.uniform(-bound, bound, fan_out).astype(dtype))
        est.n_features_in_ = n_features
        est.n_outputs_ = n_outputs
        est.n_layers_ = len(units)
        # What MLPRegressor._initialize sets, so that estimator_ can go on with
        # scikit-learn's own partial_fit.
        est.n_iter_ = 0
        est.t_ = 0
        est.loss_curve_ = []
        est._no_improvement_count = 0
        est.best_loss_ = np.inf
        est.validation_scores_ = None
        est.best_validation_score_ = None
        est._random_state = rng
        # The initial weights, as MLPRegressor._initialize keeps them: views, not copies
        # (a weight-sized copy for the whole fit otherwise); the fit gives coefs_ and
        # intercepts_ new arrays (TemplateConversion.write_back), these stay as drawn.
        est._best_coefs = [c.view() for c in est.coefs_]
        est._best_intercepts = [i.view() for i in est.intercepts_]
        if not is_classifier(est):
            est.out_activation_ = "identity"

    def penalty(self, est, n_samples, rows):
        return float(est.alpha), 0.0  # the same term, per batch, as here

    def conversion(self, name, value, est, n_samples):
        if name == "alpha":
            return "alpha={value!r} (the same penalty)"
        if name == "solver":
            return "optimizer={value!r}" if value in ("sgd", "adam", "lbfgs") else None
        if name == "learning_rate":
            return "learning_rate={value!r}"
        if name in ("momentum", "nesterovs_momentum"):
            return "optimizer=Nesterov(momentum=...) or Momentum(momentum=...)"
        if name in ("beta_1", "beta_2", "epsilon"):
            return f"optimizer=Adam({name}={{value!r}})"
        if name == "max_fun":
            return "optimizer=LBFGS(max_fun={value!r})"
        return _SAME_NAME.get(name)


class _MLPRegressor(_MLPFamily):
    """MLPRegressor; with ``loss="poisson"`` its raw output is trained (exp link).

    A log-link loss given to the estimator on a squared-error template gives the
    copy it trains the same exp output (``out_activation_="exp"``).
    """

    def _poisson(self, est) -> bool:
        return (
            getattr(est, "loss", "squared_error") == "poisson"
            or getattr(est, "out_activation_", None) == "exp"
        )

    def link(self, est):
        return "log" if self._poisson(est) else "identity"

    def can_use_log_link(self, est):
        return True

    def use_log_link(self, est):
        est.out_activation_ = "exp"

    def check(self, est):
        if getattr(est, "loss", "squared_error") not in ("squared_error", "poisson"):
            raise ValueError(
                f"MLPRegressor(loss={est.loss!r}) is not supported as a template: use "
                "loss='squared_error' or 'poisson'."
            )

    def loss(self, est):
        if self._poisson(est):
            from . import losses

            return losses.PoissonDeviance(link="log")
        return "squared_error"

    def initialize(self, est, n_features, n_outputs, rng, dtype=np.float32):
        super().initialize(est, n_features, n_outputs, rng, dtype)
        if self._poisson(est):
            est.out_activation_ = "exp"

    def trained_view(self, est):
        return _identity_mlp(est) if self._poisson(est) else None

    def output_link(self, est):
        return "Exp" if self._poisson(est) else None


class _MLPClassifier(_MLPFamily):
    task = "classification"

    def loss(self, est):
        return "log_loss"

    def gives_proba(self, est):
        return True

    def trained_view(self, est):
        return _identity_mlp(est)

    def fix_export(self, est, model):
        _binarizer_to_greater(model)
        # skl2onnx exports the probabilities of a two-label multilabel MLPClassifier as
        # those of a binary problem, Concat([1 - p, p]) of shape (n, 4): keep p.
        binarizer = getattr(est, "_label_binarizer", None)
        if getattr(binarizer, "y_type_", "") != "multilabel-indicator" or len(est.classes_) != 2:
            return
        proba = model.graph.output[1].name
        for node in model.graph.node:
            if node.op_type == "Concat" and list(node.output) == [proba]:
                p = node.input[-1]
                node.op_type = "Identity"
                del node.input[:]
                del node.attribute[:]
                node.input.append(p)
                return


def _binarizer_to_greater(model) -> None:
    """Write a double graph's ai.onnx.ml Binarizer (multilabel labels) as ``Greater``.

    onnxruntime has no double Binarizer kernel; its only consumer, a Cast to int64,
    takes Greater's booleans (``x > threshold``, as Binarizer and scikit-learn).
    """
    from onnx import TensorProto, numpy_helper

    if model.graph.input[0].type.tensor_type.elem_type != TensorProto.DOUBLE:
        return
    consumers = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, set()).add(node.op_type)
    for node in model.graph.node:
        # the labels' Binarizer only (not a preprocessing Binarizer feeding the model)
        if node.op_type != "Binarizer" or consumers.get(node.output[0]) != {"Cast"}:
            continue
        (threshold,) = [a.f for a in node.attribute if a.name == "threshold"] or [0.0]
        name = node.output[0] + "_threshold"
        model.graph.initializer.append(numpy_helper.from_array(np.array(threshold), name))
        node.op_type, node.domain = "Greater", ""
        del node.attribute[:]
        node.input.append(name)


def _identity_mlp(est):
    """An MLPRegressor with ``est``'s layers (its arrays) and an identity output: raw scores."""
    from sklearn.neural_network import MLPRegressor

    reg = MLPRegressor(hidden_layer_sizes=est.hidden_layer_sizes, activation=est.activation)
    for attr in ("coefs_", "intercepts_", "n_features_in_", "n_layers_", "n_outputs_"):
        setattr(reg, attr, getattr(est, attr))
    reg.out_activation_ = "identity"
    return reg


@functools.cache
def _mlp_families() -> dict[type, Family]:
    """The MLPs' families: looked up without importing the linear models' modules."""
    from sklearn import neural_network as nn

    return {nn.MLPRegressor: _MLPRegressor(), nn.MLPClassifier: _MLPClassifier()}


def _registry() -> dict[type, Family]:
    from sklearn import linear_model as lm
    from sklearn import svm

    least_squares = _LeastSquares()
    entries = {
        **_mlp_families(),
        lm.SGDRegressor: _SGDRegressor(),
        lm.HuberRegressor: _HuberRegressor(),
        lm.QuantileRegressor: _QuantileRegressor(),
        svm.LinearSVR: _LinearSVR(),
        lm.PoissonRegressor: _GLM(),
        lm.GammaRegressor: _GLM(),
        lm.TweedieRegressor: _GLM(),
        lm.LogisticRegression: _LogisticRegression(),
        lm.LogisticRegressionCV: _LogisticRegression(),
        lm.SGDClassifier: _SGDClassifier(),
        lm.Perceptron: _Perceptron(),
        svm.LinearSVC: _LinearSVC(),
        lm.RidgeClassifier: _RidgeClassifier(),
        lm.RidgeClassifierCV: _RidgeClassifier(),
    }
    for name in (
        "LinearRegression",
        "Ridge",
        "RidgeCV",
        "Lasso",
        "LassoCV",
        "ElasticNet",
        "ElasticNetCV",
        "Lars",
        "LarsCV",
        "LassoLars",
        "LassoLarsCV",
        "LassoLarsIC",
        "OrthogonalMatchingPursuit",
        "BayesianRidge",
        "ARDRegression",
        "TheilSenRegressor",
    ):
        entries[getattr(lm, name)] = least_squares
    return entries


_FAMILIES: dict[type, Family] | None = None


def families() -> dict[type, Family]:
    """Return the registry: scikit-learn class -> :class:`Family`."""
    global _FAMILIES
    if _FAMILIES is None:
        _FAMILIES = _registry()
    return _FAMILIES


def family_of(est) -> Family | None:
    """Return the family of ``est`` (an exact registered class, or a class that
    declares its family, :class:`~onnxgrad_sklearn.OnnxTemplate`), or None."""
    declared = getattr(type(est), "_onnxgrad_family", None)
    if declared is not None:
        return declared
    found = _mlp_families().get(type(est))  # without sklearn.linear_model's import
    return found if found is not None else families().get(type(est))


def supported_names(task: str | None = None) -> list[str]:
    """Names of the supported classes, for one task or all."""
    return sorted(
        cls.__name__ for cls, fam in families().items() if task is None or fam.task == task
    )


@functools.lru_cache(maxsize=64)
def _defaults(cls) -> dict | None:
    """The parameters of ``cls()`` (read only), once per class; None where it cannot be
    built."""
    try:
        return cls().get_params(deep=False)
    except Exception:
        return None


def dropped_settings(est, n_samples: int, penalty_carried: bool = False) -> list[str]:
    """Describe each setting of ``est`` that differs from its default and does not carry over.

    Parameters
    ----------
    est : estimator
        The final model of the template.
    n_samples : int
        Rows of the training data (some conversions depend on it).
    penalty_carried : bool, default=False
        Whether the template's penalty carries over (``alpha="auto"``): its
        settings are then not named, unless it is unknown (an unfitted CV model).

    Returns
    -------
    list of str
        One line per setting: ``"C=0.1: set alpha=10.0 (...)"`` or
        ``"solver='sgd': not used"``.
    """
    family = family_of(est)
    if family is None:
        return []
    defaults = _defaults(type(est))
    if defaults is None:  # a class whose defaults cannot be built: nothing to compare
        return []
    lines = []
    unknown = family.penalty_unknown(est) if penalty_carried else None
    if unknown:
        lines.append(unknown)
    for name, value in est.get_params(deep=False).items():
        if name in family.carried or name in _NEUTRAL or name not in defaults:
            continue
        if penalty_carried and name in family.penalty_settings:
            continue
        default = defaults[name]
        try:
            same = bool(value == default) if not isinstance(value, np.ndarray) else False
        except Exception:
            same = False
        if same:
            continue
        advice = family.conversion(name, value, est, n_samples) or _SAME_NAME.get(name)
        setting = f"{name}={value!r}"
        if advice is None:
            lines.append(f"{setting}: not used")
        else:
            lines.append(f"{setting}: set {advice.format(value=value)} on the estimator")
    return lines
