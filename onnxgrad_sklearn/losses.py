"""Losses written as ONNX graphs.

A loss turns predictions and targets, both of shape ``(n_samples, n_outputs)``,
into one value per sample (summed over outputs). For the classifier the
predictions are logits or decision values, one column per class (one column
for a binary problem with the margin losses), and the targets are one-hot. The
training graph then averages these values with the sample weights and adds the
penalty::

    loss = sum_i w_i * loss_i / sum_i w_i + alpha * penalty / sum_i w_i

With ``SquaredError`` and no penalty this is scikit-learn's MLPRegressor loss,
``0.5 * mean((y - p) ** 2)`` (for one output).

The losses available by name are listed in :data:`REGRESSION_LOSSES` and
:data:`CLASSIFICATION_LOSSES`; :func:`get_loss` turns a name into an object.
Each class says what it is for with two class attributes: ``task``
(``"regression"``, ``"classification"``, or None for a loss that does not
say) and ``gives_proba`` (whether scikit-learn gives ``predict_proba`` for a
classifier trained with it).

Write your own loss by subclassing :class:`BaseLoss` and implementing
:meth:`BaseLoss.build` with a :class:`~onnxgrad_sklearn.GraphBuilder`, or wrap
an existing ONNX graph with :class:`OnnxLoss`. The gradient is derived by the
runtime from the graph, by onnxruntime-training's gradient builder (the
TrainingAgent backend) or by onnx-ad's reverse mode: every operator on the path
from the predictions to the loss must have a gradient in both (Add, Sub, Mul,
Div, Neg, Relu, Exp, Log, Pow, ReduceSum, Sigmoid, Softmax, LogSoftmax, Where,
Cast, ...). Comparisons (Less, LessOrEqual, Greater, Equal) are accepted by
both and carry no gradient, so a mask such as ``Cast(LessOrEqual(z, t))``
multiplied into a term chooses the subgradient at a kink. Relu's gradient is 0
at 0 in both (onnxruntime's ReluGrad tests ``Y > 0``, onnx-ad ``x > 0``).
Operators applied to the targets alone need no gradient.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import BaseEstimator, clone

from ._lazy import lazy

if TYPE_CHECKING:
    from ._graph import GraphBuilder

# imported on first use (``import onnxgrad_sklearn`` does not import onnx)
onnx = lazy("onnx")
TensorProto = lazy("onnx", "TensorProto")

__all__ = [
    "CLASSIFICATION_LOSSES",
    "REGRESSION_LOSSES",
    "AbsoluteError",
    "BaseLoss",
    "EpsilonInsensitive",
    "GammaDeviance",
    "Hinge",
    "Huber",
    "LogLoss",
    "ModifiedHuber",
    "OneVsRestLogLoss",
    "OnnxLoss",
    "Perceptron",
    "PoissonDeviance",
    "Quantile",
    "SquaredEpsilonInsensitive",
    "SquaredError",
    "SquaredHinge",
    "TweedieDeviance",
    "get_loss",
]


class BaseLoss(BaseEstimator):
    """Base class of the losses.

    Subclasses implement :meth:`build`. Hyper-parameters are ``__init__``
    arguments stored untouched, so ``get_params``/``set_params`` and nested
    parameters such as ``loss__epsilon`` work as for any scikit-learn object;
    :meth:`check_params` validates them (``build`` calls it).

    Attributes
    ----------
    task : {"regression", "classification"} or None
        What the loss is for (class attribute). None, the default of a custom
        loss, says nothing.
    gives_proba : bool
        For a classification loss, whether scikit-learn gives ``predict_proba``
        for a model trained with it (class attribute; True by default, as a
        custom loss in the classifier gets probabilities).
    """

    task: str | None = None
    gives_proba: bool = True
    #: Whether each sample's loss depends on its own row only (class attribute): the
    #: standard backend then trains a short last batch in the graph of a full one,
    #: padded with rows of sample weight 0. False for :class:`OnnxLoss`, whose graph
    #: may combine rows.
    rowwise: bool = True
    #: Width of the targets ``y_true`` where it is not that of the predictions the loss
    #: receives (class attribute; None: the same). The classifier's loss of a binary
    #: problem takes one logit and two one-hot columns.
    target_width: int | None = None
    #: Width of the quadratic that replaces the loss's kinks (0: the exact loss). Set
    #: on the copies :meth:`smoothed` returns; not a hyper-parameter.
    _width: float = 0.0

    def smoothed(self, width: float):
        """A copy whose kinks are rounded over ``width``, or None for a smooth loss.

        Full-batch L-BFGS stalls at the kinks of a piecewise-linear loss; it
        minimises these copies first, for decreasing widths (see
        :class:`~onnxgrad_sklearn.optim.LBFGS`). Each kink ``max(0, u)`` becomes
        ``u ** 2 / (2 * width)`` for ``0 < u < width`` and ``u - width / 2``
        beyond: the value moves by at most ``width / 2`` per kink and sample,
        and the gradient is continuous. The base class has no kinks (None).

        Parameters
        ----------
        width : float
            Width of the rounded part, in the units of the loss's argument
            (margin or residual); > 0.

        Returns
        -------
        BaseLoss or None
        """
        return None

    def _smoothed_copy(self, width: float):
        if not width > 0:
            raise ValueError(f"smoothing width must be > 0, got {width!r}.")
        copy = clone(self)
        copy._width = float(width)
        return copy

    def _kink(self, g: GraphBuilder, u: str) -> str:
        """``max(0, u)``, rounded over ``self._width`` on a smoothed copy."""
        if not self._width:
            return g.relu(u)
        return _rounded_relu(g, u, self._width)

    def check_params(self) -> None:
        """Raise a ``ValueError`` naming the hyper-parameter that is invalid.

        The base class checks nothing.
        """

    def build(self, g: GraphBuilder, y_pred: str, y_true: str) -> str:
        """Add the nodes computing the per-sample loss and return its name.

        Parameters
        ----------
        g : GraphBuilder
            Where to add nodes.
        y_pred : str
            Predictions of shape ``(n_samples, n_outputs)``, in the training
            dtype ``g.dtype`` (float32 or float64): constants made with
            ``g.const`` follow it, a ``Cast`` to the float type uses
            ``to=g.elem_type``.
        y_true : str
            Targets, same shape.

        Returns
        -------
        str
            Name of a tensor of shape ``(n_samples,)``.
        """
        raise NotImplementedError

    def _residual(self, g: GraphBuilder, y_pred: str, y_true: str) -> str:
        return g.sub(y_true, y_pred)


def _rounded_relu(g: GraphBuilder, u: str, width: float) -> str:
    # c = clip(u, 0, width): c * (u - c / 2) / width is 0, u^2 / (2 width), u - width / 2
    c = g.op("Clip", u, g.const(0.0), g.const(width))
    return g.mul(g.mul(c, g.sub(u, g.mul(c, g.const(0.5)))), g.const(1.0 / width))


class SquaredError(BaseLoss):
    """Half the squared error: ``0.5 * sum_k (y_k - p_k) ** 2`` per sample.

    The loss of MLPRegressor and SGDRegressor(loss="squared_error").
    """

    task = "regression"
    gives_proba = False

    def build(self, g, y_pred, y_true):
        r = self._residual(g, y_pred, y_true)
        return g.sum(g.mul(g.mul(r, r), g.const(0.5)), axes=[1])


class AbsoluteError(BaseLoss):
    """Absolute error: ``sum_k |y_k - p_k|`` per sample (its gradient is 0 at 0)."""

    task = "regression"
    gives_proba = False

    def smoothed(self, width):
        return self._smoothed_copy(width)

    def build(self, g, y_pred, y_true):
        r = self._residual(g, y_pred, y_true)
        if self._width:
            return g.sum(g.add(self._kink(g, r), self._kink(g, g.neg(r))), axes=[1])
        return g.sum(g.abs(r), axes=[1])


class Huber(BaseLoss):
    """Huber loss, quadratic for small residuals and linear beyond ``epsilon``.

    ``0.5 * r ** 2`` if ``|r| <= epsilon`` else ``epsilon * |r| - 0.5 * epsilon ** 2``,
    as SGDRegressor(loss="huber") defines it.

    Parameters
    ----------
    epsilon : float, default=1.35
        Where the loss turns linear (must be > 0).
    """

    task = "regression"
    gives_proba = False

    def __init__(self, epsilon: float = 1.35):
        self.epsilon = epsilon

    def check_params(self):
        if not self.epsilon > 0:
            raise ValueError(f"Huber epsilon must be > 0, got {self.epsilon!r}.")

    def build(self, g, y_pred, y_true):
        self.check_params()
        a = g.abs(self._residual(g, y_pred, y_true))
        # q = min(|r|, eps) = |r| - relu(|r| - eps); loss = q * (|r| - q / 2)
        q = g.sub(a, g.relu(g.sub(a, g.const(self.epsilon))))
        loss = g.mul(q, g.sub(a, g.mul(q, g.const(0.5))))
        return g.sum(loss, axes=[1])


class Quantile(BaseLoss):
    """Pinball loss for quantile regression.

    ``quantile * r`` if ``r >= 0`` else ``(quantile - 1) * r``, with
    ``r = y - p``: the fitted prediction leaves a fraction ``quantile`` of the
    targets below it.

    Parameters
    ----------
    quantile : float, default=0.5
        Quantile to estimate, in (0, 1).
    """

    task = "regression"
    gives_proba = False

    def __init__(self, quantile: float = 0.5):
        self.quantile = quantile

    def check_params(self):
        if not 0 < self.quantile < 1:
            raise ValueError(f"Quantile quantile must be in (0, 1), got {self.quantile!r}.")

    def smoothed(self, width):
        return self._smoothed_copy(width)

    def build(self, g, y_pred, y_true):
        self.check_params()
        r = self._residual(g, y_pred, y_true)
        pos = g.mul(self._kink(g, r), g.const(self.quantile))
        neg = g.mul(self._kink(g, g.neg(r)), g.const(1.0 - self.quantile))
        return g.sum(g.add(pos, neg), axes=[1])


class OnnxLoss(BaseLoss):
    """A loss given as an ONNX graph.

    The graph is written in the training dtype (float32 by default, float64
    with the estimator's ``dtype="float64"``). A float32 graph used to train in
    float64 is converted where that is exact: its float32 initializers and
    constants become float64 (every float32 value is a float64 value), its
    ``Cast(to=FLOAT)`` become ``Cast(to=DOUBLE)``, and the result must pass
    onnx's type check. A graph computing in float16 or bfloat16, or one whose
    types do not check after the conversion, is refused with a ``ValueError``;
    so is a double graph used to train in float32 (narrowing is not exact).

    Parameters
    ----------
    model : onnx.ModelProto or onnx.GraphProto
        A graph with two float inputs, predictions then targets, both of shape
        ``(n_samples, n_outputs)``, and one output of shape ``(n_samples,)``:
        the loss of each sample. Its nodes are copied into the training graph
        (names are prefixed to avoid clashes).
    """

    rowwise = False

    def __init__(self, model=None):
        self.model = model

    def build(self, g, y_pred, y_true):
        graph = self.model.graph if isinstance(self.model, onnx.ModelProto) else self.model
        if not isinstance(graph, onnx.GraphProto):
            raise TypeError(
                f"OnnxLoss expects an onnx.ModelProto or GraphProto, got {type(self.model)}."
            )
        inits = {i.name for i in graph.initializer}
        inputs = [i.name for i in graph.input if i.name not in inits]
        if len(inputs) != 2 or len(graph.output) != 1:
            raise ValueError(
                "OnnxLoss expects a graph with 2 inputs (predictions, targets) and 1 "
                f"output (per-sample loss), got inputs {inputs} and "
                f"{len(graph.output)} outputs."
            )
        graph = _retype_loss_graph(graph, inputs, g.elem_type)
        prefix = g.unique("onnxloss")
        rename = {inputs[0]: y_pred, inputs[1]: y_true, "": ""}

        def name(n: str) -> str:
            return rename.setdefault(n, f"{prefix}_{n}")

        for init in graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = name(init.name)
            g.initializers.append(copy)
        for node in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            del copy.input[:]
            del copy.output[:]
            copy.input.extend(name(n) for n in node.input)
            copy.output.extend(name(n) for n in node.output)
            copy.name = g.unique("n_onnxloss")
            g.nodes.append(copy)
        return name(graph.output[0].name)


_NARROW_FLOATS = (10, 16)  # TensorProto.FLOAT16, BFLOAT16 (onnx is imported on first use)


def _retype_loss_graph(graph: onnx.GraphProto, inputs, elem_type: int) -> onnx.GraphProto:
    """Return ``graph`` (an :class:`OnnxLoss` graph) computing in ``elem_type``.

    A float32 graph is converted to double exactly (float32 values are float64
    values) and type-checked; anything that cannot be converted exactly is
    refused with a ``ValueError`` saying what to change.
    """
    declared = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    if elem_type == TensorProto.FLOAT:
        double = [n for n in inputs if declared.get(n) == TensorProto.DOUBLE]
        if double:
            raise ValueError(
                f"OnnxLoss: the graph's inputs {double} are double, the estimator trains in "
                "float32 (converting a double graph to float32 is not exact): pass "
                "dtype='float64' to the estimator, or write the loss graph in float32."
            )
        return graph
    if elem_type != TensorProto.DOUBLE:
        raise ValueError(f"OnnxLoss: unsupported training element type {elem_type}.")
    out = onnx.GraphProto()
    out.CopyFrom(graph)
    changed = _retype_to_double(out, "the loss graph")
    if changed:
        _check_loss_types(out)
    return out


def _retype_to_double(graph: onnx.GraphProto, where: str) -> bool:
    """Turn every float32 tensor type, constant and cast of ``graph`` into double, in place.

    Returns whether anything changed; raises ``ValueError`` on float16/bfloat16.
    """
    from onnx import numpy_helper

    def refuse(what):
        raise ValueError(
            f"OnnxLoss cannot train in float64: {what} in {where} computes in a narrow float "
            "type (float16/bfloat16), which a float64 graph cannot mix with. Write the loss "
            "graph in float32 or float64 only, or train with dtype='float32'."
        )

    changed = False
    if len(graph.sparse_initializer):
        raise ValueError(
            f"OnnxLoss cannot convert the sparse initializers of {where} to float64: make them "
            "dense initializers, or write the loss graph in float64."
        )
    for k, init in enumerate(graph.initializer):
        if init.data_type in _NARROW_FLOATS:
            refuse(f"initializer {init.name!r}")
        if init.data_type == TensorProto.FLOAT:
            value = numpy_helper.to_array(init).astype("float64")
            graph.initializer[k].CopyFrom(numpy_helper.from_array(value, init.name))
            changed = True
    for info in [*graph.input, *graph.output, *graph.value_info]:
        tensor_type = info.type.tensor_type
        if tensor_type.elem_type in _NARROW_FLOATS:
            refuse(f"tensor {info.name!r}")
        if tensor_type.elem_type == TensorProto.FLOAT:
            tensor_type.elem_type = TensorProto.DOUBLE
            changed = True
    for node in graph.node:
        label = f"node {node.name or node.op_type!r} ({node.op_type})"
        for attr in list(node.attribute):
            if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT:
                if attr.i in _NARROW_FLOATS:
                    refuse(label)
                if attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.DOUBLE
                    changed = True
            elif attr.type == onnx.AttributeProto.TENSOR:
                if attr.t.data_type in _NARROW_FLOATS:
                    refuse(label)
                if attr.t.data_type == TensorProto.FLOAT:
                    value = numpy_helper.to_array(attr.t).astype("float64")
                    attr.t.CopyFrom(numpy_helper.from_array(value, attr.t.name))
                    changed = True
            elif node.op_type == "Constant" and attr.name in ("value_float", "value_floats"):
                value = attr.f if attr.name == "value_float" else list(attr.floats)
                tensor = numpy_helper.from_array(
                    np.asarray(value, dtype=np.float32).astype("float64")
                )
                node.attribute.remove(attr)
                node.attribute.append(onnx.helper.make_attribute("value", tensor))
                changed = True
            elif attr.type == onnx.AttributeProto.GRAPH:
                changed |= _retype_to_double(attr.g, f"a subgraph of {label}")
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    changed |= _retype_to_double(sub, f"a subgraph of {label}")
    return changed


def _check_loss_types(graph: onnx.GraphProto) -> None:
    """Refuse a converted loss graph whose types do not check (onnx's strict inference)."""
    from ._passes import MAX_OPSET

    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", MAX_OPSET)])
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises several kinds
        raise ValueError(
            "OnnxLoss: the float32 loss graph, converted to float64 (constants and "
            f"Cast(to=FLOAT) retyped), does not type-check: {exc}. Write the loss graph in "
            "float64 (inputs, constants and casts of type double), or train with "
            "dtype='float32'."
        ) from exc


class LogLoss(BaseLoss):
    """Cross-entropy computed from logits: ``-sum_k t_k * log_softmax(z)_k`` per sample.

    The classifier gives it one logit per class (a zero logit is added for the
    first class of a binary problem, so that ``softmax([0, z])`` is
    ``sigmoid(z)``) and one-hot targets. ``LogSoftmax`` keeps it finite for
    any logits: no probability is ever clipped. This is MLPClassifier's and
    LogisticRegression's log-loss. For a binary problem the classifier computes
    the same loss from the one logit ``z``, as ``softplus(z) - t * z`` (``t`` the
    second class's target): a ``LogSoftmax`` over two columns costs more than the
    rest of a linear model's graph. A subclass receives the two columns.
    """

    task = "classification"
    gives_proba = True

    def build(self, g, y_pred, y_true):
        log_proba = g.op("LogSoftmax", y_pred, axis=1)
        return g.neg(g.sum(g.mul(y_true, log_proba), axes=[1]))


class OneVsRestLogLoss(BaseLoss):
    """Sum over classes of binary log-losses: one-vs-rest logistic regression.

    ``sum_k softplus(z_k) - t_k * z_k`` per sample, with
    ``softplus(z) = relu(z) + log(1 + exp(z - 2 * relu(z)))`` (never overflows).
    The loss of multiclass SGDClassifier(loss="log_loss") and of one-vs-rest
    LogisticRegression, whose probabilities are normalised sigmoids; the
    classifier picks it for them when ``loss="log_loss"``.
    """

    task = "classification"
    gives_proba = True

    def build(self, g, y_pred, y_true):
        pos = g.relu(y_pred)
        exponent = g.sub(y_pred, g.mul(pos, g.const(2.0)))
        softplus = g.add(pos, g.op("Log", g.add(g.const(1.0), g.op("Exp", exponent))))
        return g.sum(g.sub(softplus, g.mul(y_true, y_pred)), axes=[1])


# Helpers -------------------------------------------------------------------------------


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _check_threshold(owner: BaseLoss) -> None:
    if not _is_real(owner.threshold):
        raise ValueError(
            f"{type(owner).__name__} threshold must be a finite real number, "
            f"got {owner.threshold!r}."
        )


def _check_epsilon(owner: BaseLoss) -> None:
    if not (_is_real(owner.epsilon) and owner.epsilon >= 0):
        raise ValueError(
            f"{type(owner).__name__} epsilon must be a finite real number >= 0, "
            f"got {owner.epsilon!r}."
        )


def _check_link(owner: BaseLoss) -> None:
    if not (isinstance(owner.link, str) and owner.link in _LINKS):
        raise ValueError(
            f"{type(owner).__name__} link must be one of {list(_LINKS)}, got {owner.link!r}."
        )


_LINKS = ("log", "identity")


def _mask(g: GraphBuilder, op_type: str, a: str, b: str) -> str:
    """Return ``float(a <op> b)``: a 0/1 tensor that carries no gradient."""
    return g.op("Cast", g.op(op_type, a, b), to=g.elem_type)


def _log_target(g: GraphBuilder, y_true: str) -> str:
    """Return ``log(y)`` where ``y != 0`` and 0 where ``y == 0`` (so ``y * log(y)`` is 0)."""
    zero = g.op("Equal", y_true, g.const(0.0))
    return g.op("Log", g.op("Where", zero, g.const(1.0), y_true))


# Classification: margin losses -----------------------------------------------------------


class _MarginLoss(BaseLoss):
    """One-vs-rest sum of a margin loss ``L(z)`` with ``z = y * f`` and ``y = 2 * t - 1``."""

    task = "classification"
    gives_proba = False

    def build(self, g, y_pred, y_true):
        self.check_params()
        sign = g.sub(g.mul(y_true, g.const(2.0)), g.const(1.0))
        z = g.mul(sign, y_pred)
        return g.sum(self._margin_loss(g, z), axes=[1])

    def _margin_loss(self, g: GraphBuilder, z: str) -> str:
        raise NotImplementedError


def _hinge(g: GraphBuilder, z: str, threshold: float) -> str:
    # max(0, threshold - z), written with a mask so that the gradient at
    # z == threshold is -y (scikit-learn's subgradient), not 0 as with Relu.
    t = g.const(threshold)
    return g.mul(_mask(g, "LessOrEqual", z, t), g.sub(t, z))


class _ThresholdMarginLoss(_MarginLoss):
    """A margin loss with a ``threshold`` below which a sample is penalised."""

    def __init__(self, threshold: float = 1.0):
        self.threshold = threshold

    def check_params(self):
        _check_threshold(self)


class Hinge(_ThresholdMarginLoss):
    """Hinge loss of linear SVMs: ``sum_k max(0, threshold - y_k * f_k)`` per sample.

    ``f_k`` is the decision value of column ``k`` and ``y_k = 2 * t_k - 1`` its
    target in {-1, 1} (one-vs-rest; one column for a binary problem). The
    gradient with respect to ``f_k`` is ``-y_k`` where ``y_k * f_k <= threshold``
    and 0 elsewhere: at the kink the weights move, as in scikit-learn's SGD.
    SGDClassifier(loss="hinge") and LinearSVC use it (threshold 1);
    ``threshold=0`` is the :class:`Perceptron` loss. No probabilities.

    The kink is written ``Cast(LessOrEqual(z, threshold)) * (threshold - z)``.

    Parameters
    ----------
    threshold : float, default=1.0
        Margin below which a sample is penalised.
    """

    def smoothed(self, width):
        return self._smoothed_copy(width)

    def _margin_loss(self, g, z):
        if self._width:
            return self._kink(g, g.sub(g.const(float(self.threshold)), z))
        return _hinge(g, z, float(self.threshold))


class Perceptron(_MarginLoss):
    """Perceptron loss: ``sum_k max(0, -y_k * f_k)`` per sample, the hinge at threshold 0.

    ``y_k = 2 * t_k - 1``. The gradient with respect to ``f_k`` is ``-y_k``
    where ``y_k * f_k <= 0``, so a model starting from zero weights (``f = 0``)
    moves, as scikit-learn's Perceptron and SGDClassifier(loss="perceptron")
    do. No probabilities.
    """

    def _margin_loss(self, g, z):
        return _hinge(g, z, 0.0)


class SquaredHinge(_ThresholdMarginLoss):
    """Squared hinge: ``sum_k max(0, threshold - y_k * f_k) ** 2`` per sample.

    ``y_k = 2 * t_k - 1``; the gradient, ``-2 * y_k * (threshold - y_k * f_k)``
    below the threshold, is continuous (0 at the threshold).
    SGDClassifier(loss="squared_hinge") and LinearSVC(loss="squared_hinge")
    use it (threshold 1). No probabilities.

    Parameters
    ----------
    threshold : float, default=1.0
        Margin below which a sample is penalised.
    """

    def _margin_loss(self, g, z):
        q = g.relu(g.sub(g.const(float(self.threshold)), z))
        return g.mul(q, q)


class ModifiedHuber(_MarginLoss):
    """Modified Huber loss of SGDClassifier(loss="modified_huber").

    Per sample ``sum_k L(y_k * f_k)`` with ``y_k = 2 * t_k - 1`` and::

        L(z) = max(0, 1 - z) ** 2   if z >= -1
             = -4 * z               otherwise

    A smoothed hinge, with a continuous gradient. SGDClassifier gives
    probabilities for it, ``(clip(f, -1, 1) + 1) / 2`` (normalised over the
    classes of a multiclass problem), hence ``gives_proba``. Written
    ``q * (2 * u - q)`` with ``u = relu(1 - z)`` and ``q = min(u, 2)``.
    """

    gives_proba = True

    def _margin_loss(self, g, z):
        u = g.relu(g.sub(g.const(1.0), z))
        q = g.sub(u, g.relu(g.sub(u, g.const(2.0))))
        return g.mul(q, g.sub(g.mul(u, g.const(2.0)), q))


# Regression: epsilon-insensitive losses --------------------------------------------------


class _EpsilonBand(BaseLoss):
    """Losses of the residual's distance to the band ``|y - p| <= epsilon``."""

    task = "regression"
    gives_proba = False

    def __init__(self, epsilon: float = 0.1):
        self.epsilon = epsilon

    def check_params(self):
        _check_epsilon(self)

    def _parts(self, g, y_pred, y_true):
        # relu(r - epsilon) and relu(-r - epsilon), r = y - p: their gradient is 0
        # on the band's edges, as scikit-learn's dloss (strict inequalities)
        self.check_params()
        r = self._residual(g, y_pred, y_true)
        eps = g.const(float(self.epsilon))
        return self._kink(g, g.sub(r, eps)), self._kink(g, g.sub(g.neg(r), eps))


class EpsilonInsensitive(_EpsilonBand):
    """Epsilon-insensitive loss: ``sum_k max(0, |y_k - p_k| - epsilon)`` per sample.

    The loss of SGDRegressor(loss="epsilon_insensitive") (default
    ``epsilon=0.1``) and of LinearSVR (its default loss, with its default
    ``epsilon=0.0``). The gradient with respect to ``p`` is -1 where
    ``y - p > epsilon``, 1 where ``p - y > epsilon`` and 0 elsewhere (so 0 at
    the kinks), as scikit-learn's SGD defines it. Written
    ``relu(r - epsilon) + relu(-r - epsilon)`` with ``r = y - p``.

    Parameters
    ----------
    epsilon : float, default=0.1
        Half-width of the band where errors cost nothing (>= 0).
    """

    def smoothed(self, width):
        return self._smoothed_copy(width)

    def build(self, g, y_pred, y_true):
        above, below = self._parts(g, y_pred, y_true)
        return g.sum(g.add(above, below), axes=[1])


class SquaredEpsilonInsensitive(_EpsilonBand):
    """Squared epsilon-insensitive loss: ``sum_k max(0, |y_k - p_k| - epsilon) ** 2``.

    The loss of SGDRegressor(loss="squared_epsilon_insensitive") (default
    ``epsilon=0.1``) and of LinearSVR(loss="squared_epsilon_insensitive")
    (default ``epsilon=0.0``: then it is twice the squared error). No ``0.5``
    factor, as in scikit-learn. Its gradient is continuous.

    Parameters
    ----------
    epsilon : float, default=0.1
        Half-width of the band where errors cost nothing (>= 0).
    """

    def build(self, g, y_pred, y_true):
        above, below = self._parts(g, y_pred, y_true)
        return g.sum(g.add(g.mul(above, above), g.mul(below, below)), axes=[1])


# Regression: half deviances of generalised linear models -------------------------------


class _Deviance(BaseLoss):
    """Half the unit deviance, from the raw prediction (log link) or the mean (identity)."""

    task = "regression"
    gives_proba = False

    def check_params(self):
        _check_link(self)

    def build(self, g, y_pred, y_true):
        self.check_params()
        return g.sum(self._half_deviance(g, y_pred, y_true), axes=[1])

    def _mean_and_log(self, g, y_pred):
        if self.link == "log":
            return g.op("Exp", y_pred), y_pred
        return y_pred, g.op("Log", y_pred)

    def _half_deviance(self, g, y_pred, y_true):
        raise NotImplementedError


def _half_poisson(g, mu, log_mu, y_true):
    # y * log(y / mu) - y + mu, with y * log(y) = 0 at y = 0
    log_ratio = g.sub(_log_target(g, y_true), log_mu)
    return g.add(g.mul(y_true, log_ratio), g.sub(mu, y_true))


def _half_gamma(g, mu, log_mu, y_true):
    # log(mu / y) + y / mu - 1
    log_ratio = g.sub(log_mu, g.op("Log", y_true))
    return g.add(log_ratio, g.sub(g.div(y_true, mu), g.const(1.0)))


class PoissonDeviance(_Deviance):
    """Half the Poisson deviance: ``sum_k y_k * log(y_k / mu_k) - y_k + mu_k`` per sample.

    With ``link="log"`` (default) the loss receives the raw linear predictor
    ``eta`` and ``mu = exp(eta)``: it is scikit-learn's HalfPoissonLoss
    (``exp(eta) - y * eta``) plus its constant ``xlogy(y, y) - y``, so that the
    value is half the unit deviance (``0.5 * mean_poisson_deviance`` on average) and 0
    at ``mu == y``. PoissonRegressor and HistGradientBoostingRegressor(loss="poisson")
    minimise it, and so does MLPRegressor(loss="poisson"), whose output is
    ``exp(eta)`` (its ``eta`` with ``link="log"``, or its output with
    ``link="identity"``). With ``link="identity"`` the loss receives ``mu``
    itself (> 0), as TweedieRegressor(power=1, link="identity"). Targets must
    be >= 0.

    Parameters
    ----------
    link : {"log", "identity"}, default="log"
        How the prediction relates to the mean.
    """

    def __init__(self, link: str = "log"):
        self.link = link

    def _half_deviance(self, g, y_pred, y_true):
        mu, log_mu = self._mean_and_log(g, y_pred)
        return _half_poisson(g, mu, log_mu, y_true)


class GammaDeviance(_Deviance):
    """Half the Gamma deviance: ``sum_k log(mu_k / y_k) + y_k / mu_k - 1`` per sample.

    With ``link="log"`` (default) the loss receives the raw linear predictor
    ``eta`` and ``mu = exp(eta)``: it is scikit-learn's HalfGammaLoss
    (``eta + y * exp(-eta)``) plus its constant ``-log(y) - 1``, half the unit
    deviance (``0.5 * mean_gamma_deviance`` on average). GammaRegressor
    minimises it. With ``link="identity"`` the loss receives ``mu`` itself
    (> 0), as TweedieRegressor(power=2, link="identity"). Targets must be > 0.

    Parameters
    ----------
    link : {"log", "identity"}, default="log"
        How the prediction relates to the mean.
    """

    def __init__(self, link: str = "log"):
        self.link = link

    def _half_deviance(self, g, y_pred, y_true):
        if self.link == "log":  # log(mu) - log(y) + y * exp(-eta) - 1
            mu_inverse = g.op("Exp", g.neg(y_pred))
            log_ratio = g.sub(y_pred, g.op("Log", y_true))
            return g.add(log_ratio, g.sub(g.mul(y_true, mu_inverse), g.const(1.0)))
        return _half_gamma(g, y_pred, g.op("Log", y_pred), y_true)


class TweedieDeviance(_Deviance):
    """Half the Tweedie deviance of power ``power``, per sample summed over outputs.

    For ``power`` not in {0, 1, 2}, with ``mu`` the mean::

        max(y, 0) ** (2 - p) / ((1 - p) * (2 - p)) - y * mu ** (1 - p) / (1 - p)
        + mu ** (2 - p) / (2 - p)

    ``power=0`` gives ``0.5 * (y - mu) ** 2``, ``power=1`` the
    :class:`PoissonDeviance`, ``power=2`` the :class:`GammaDeviance`. This is
    scikit-learn's HalfTweedieLoss (``link="log"``, the loss receives the raw
    linear predictor ``eta`` and ``mu = exp(eta)``, constant term included) and
    HalfTweedieLossIdentity (``link="identity"``, the loss receives ``mu``),
    half the unit deviance (``0.5 * mean_tweedie_deviance`` on average).
    TweedieRegressor minimises it (its ``link="auto"`` is identity for
    ``power <= 0`` and log otherwise: pass the link it resolves to).

    Parameters
    ----------
    power : float, default=0.0
        Tweedie power: ``<= 0`` (targets any real, ``mu > 0`` unless
        ``power=0``), 1 (Poisson, targets >= 0), in (1, 2) (compound Poisson
        Gamma, targets >= 0), ``>= 2`` (targets > 0). No Tweedie
        distribution has a power in (0, 1): such a power is refused.
    link : {"log", "identity"}, default="log"
        How the prediction relates to the mean.
    """

    def __init__(self, power: float = 0.0, link: str = "log"):
        self.power = power
        self.link = link

    def check_params(self):
        if not _is_real(self.power):
            raise ValueError(
                f"TweedieDeviance power must be a finite real number, got {self.power!r}."
            )
        if 0 < self.power < 1:
            raise ValueError(
                "TweedieDeviance power must be <= 0 or >= 1 (no Tweedie distribution has "
                f"a power in (0, 1)), got {self.power!r}."
            )
        super().check_params()

    def _half_deviance(self, g, y_pred, y_true):
        p = float(self.power)
        if p == 0:
            mu = self._mean_and_log(g, y_pred)[0]
            r = g.sub(y_true, mu)
            return g.mul(g.mul(r, r), g.const(0.5))
        if p == 1:
            return _half_poisson(g, *self._mean_and_log(g, y_pred), y_true)
        if p == 2:
            return GammaDeviance(link=self.link)._half_deviance(g, y_pred, y_true)
        if self.link == "log":  # mu ** a = exp(a * eta)
            mu_1 = g.op("Exp", g.mul(y_pred, g.const(1.0 - p)))
            mu_2 = g.op("Exp", g.mul(y_pred, g.const(2.0 - p)))
        else:
            mu_1 = g.op("Pow", y_pred, g.const(1.0 - p))
            mu_2 = g.mul(y_pred, mu_1)
        constant = g.mul(
            g.op("Pow", g.relu(y_true), g.const(2.0 - p)), g.const(1.0 / ((1.0 - p) * (2.0 - p)))
        )
        varying = g.sub(
            g.mul(mu_2, g.const(1.0 / (2.0 - p))),
            g.mul(g.mul(y_true, mu_1), g.const(1.0 / (1.0 - p))),
        )
        return g.add(varying, constant)


# Registry ------------------------------------------------------------------------------

_LOSSES = {
    "squared_error": SquaredError,
    "absolute_error": AbsoluteError,
    "huber": Huber,
    "quantile": Quantile,
    "epsilon_insensitive": EpsilonInsensitive,
    "squared_epsilon_insensitive": SquaredEpsilonInsensitive,
    "poisson": PoissonDeviance,
    "gamma": GammaDeviance,
    "tweedie": TweedieDeviance,
    "log_loss": LogLoss,
    "hinge": Hinge,
    "squared_hinge": SquaredHinge,
    "modified_huber": ModifiedHuber,
    "perceptron": Perceptron,
}

#: Names of the regression losses :func:`get_loss` knows, in registry order.
REGRESSION_LOSSES = tuple(name for name, cls in _LOSSES.items() if cls.task == "regression")
#: Names of the classification losses :func:`get_loss` knows, in registry order.
CLASSIFICATION_LOSSES = tuple(name for name, cls in _LOSSES.items() if cls.task == "classification")


def get_loss(loss, task: str | None = None) -> BaseLoss:
    """Return the loss object for a name or a loss object.

    Parameters
    ----------
    loss : str or BaseLoss
        A name of :data:`REGRESSION_LOSSES` (``"squared_error"``,
        ``"absolute_error"``, ``"huber"``, ``"quantile"``,
        ``"epsilon_insensitive"``, ``"squared_epsilon_insensitive"``,
        ``"poisson"``, ``"gamma"``, ``"tweedie"``) or of
        :data:`CLASSIFICATION_LOSSES` (``"log_loss"``, ``"hinge"``,
        ``"squared_hinge"``, ``"modified_huber"``, ``"perceptron"``), which
        gives the class with its default parameters, or an instance of a
        :class:`BaseLoss` subclass, returned as it is.
    task : {"regression", "classification"}, default=None
        When given, a name must be one of that task's losses (a loss object
        is not checked).

    Returns
    -------
    BaseLoss
    """
    if isinstance(loss, BaseLoss):
        return loss
    names = {"regression": REGRESSION_LOSSES, "classification": CLASSIFICATION_LOSSES}
    if task is not None and task not in names:
        raise ValueError(f"task must be 'regression' or 'classification', got {task!r}.")
    allowed = names[task] if task is not None else tuple(_LOSSES)
    if isinstance(loss, str) and loss in allowed:
        return _LOSSES[loss]()
    if isinstance(loss, str) and loss in _LOSSES:
        raise ValueError(
            f"loss={loss!r} is a {_LOSSES[loss].task} loss, not a {task} loss: use one of "
            f"{sorted(allowed)} or an instance of onnxgrad_sklearn.losses.BaseLoss."
        )
    raise ValueError(
        f"loss={loss!r} is not supported: use one of {sorted(allowed)} or an "
        "instance of onnxgrad_sklearn.losses.BaseLoss."
    )
