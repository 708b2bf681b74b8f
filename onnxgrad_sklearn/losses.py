"""Losses written as ONNX graphs.

A loss turns predictions and targets, both of shape ``(n_samples, n_outputs)``,
into one value per sample (summed over outputs). For the classifier the
predictions are logits, one column per class, and the targets are one-hot. The training graph then
averages these values with the sample weights and adds the penalty::

    loss = sum_i w_i * loss_i / sum_i w_i + alpha * penalty / sum_i w_i

With ``SquaredError`` and no penalty this is scikit-learn's MLPRegressor loss,
``0.5 * mean((y - p) ** 2)`` (for one output).

Write your own loss by subclassing :class:`BaseLoss` and implementing
:meth:`BaseLoss.build` with a :class:`~onnxgrad_sklearn.GraphBuilder`, or wrap
an existing ONNX graph with :class:`OnnxLoss`. Every operator used must have a
gradient in onnxruntime-training (Add, Sub, Mul, Div, Relu, Neg, Exp, Log,
ReduceSum, Sigmoid, Softmax, ... ). The gradient itself is derived by the runtime.
"""

from __future__ import annotations

import onnx
from sklearn.base import BaseEstimator

from ._graph import GraphBuilder

__all__ = [
    "AbsoluteError",
    "BaseLoss",
    "Huber",
    "LogLoss",
    "OneVsRestLogLoss",
    "OnnxLoss",
    "Quantile",
    "SquaredError",
    "get_loss",
]


class BaseLoss(BaseEstimator):
    """Base class of the losses.

    Subclasses implement :meth:`build`. Hyper-parameters are ``__init__``
    arguments stored untouched, so ``get_params``/``set_params`` and nested
    parameters such as ``loss__epsilon`` work as for any scikit-learn object.
    """

    def build(self, g: GraphBuilder, y_pred: str, y_true: str) -> str:
        """Add the nodes computing the per-sample loss and return its name.

        Parameters
        ----------
        g : GraphBuilder
            Where to add nodes.
        y_pred : str
            Predictions, float32 of shape ``(n_samples, n_outputs)``.
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


class SquaredError(BaseLoss):
    """Half the squared error: ``0.5 * sum_k (y_k - p_k) ** 2`` per sample.

    The loss of MLPRegressor and SGDRegressor(loss="squared_error").
    """

    def build(self, g, y_pred, y_true):
        r = self._residual(g, y_pred, y_true)
        return g.sum(g.mul(g.mul(r, r), g.const(0.5)), axes=[1])


class AbsoluteError(BaseLoss):
    """Absolute error: ``sum_k |y_k - p_k|`` per sample (its gradient is 0 at 0)."""

    def build(self, g, y_pred, y_true):
        return g.sum(g.abs(self._residual(g, y_pred, y_true)), axes=[1])


class Huber(BaseLoss):
    """Huber loss, quadratic for small residuals and linear beyond ``epsilon``.

    ``0.5 * r ** 2`` if ``|r| <= epsilon`` else ``epsilon * |r| - 0.5 * epsilon ** 2``,
    as SGDRegressor(loss="huber") defines it.

    Parameters
    ----------
    epsilon : float, default=1.35
        Where the loss turns linear (must be > 0).
    """

    def __init__(self, epsilon: float = 1.35):
        self.epsilon = epsilon

    def build(self, g, y_pred, y_true):
        if not self.epsilon > 0:
            raise ValueError(f"Huber epsilon must be > 0, got {self.epsilon!r}.")
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

    def __init__(self, quantile: float = 0.5):
        self.quantile = quantile

    def build(self, g, y_pred, y_true):
        if not 0 < self.quantile < 1:
            raise ValueError(f"Quantile quantile must be in (0, 1), got {self.quantile!r}.")
        r = self._residual(g, y_pred, y_true)
        pos = g.mul(g.relu(r), g.const(self.quantile))
        neg = g.mul(g.relu(g.neg(r)), g.const(1.0 - self.quantile))
        return g.sum(g.add(pos, neg), axes=[1])


class OnnxLoss(BaseLoss):
    """A loss given as an ONNX graph.

    Parameters
    ----------
    model : onnx.ModelProto or onnx.GraphProto
        A graph with two float inputs, predictions then targets, both of shape
        ``(n_samples, n_outputs)``, and one output of shape ``(n_samples,)``:
        the loss of each sample. Its nodes are copied into the training graph
        (names are prefixed to avoid clashes).
    """

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


class LogLoss(BaseLoss):
    """Cross-entropy computed from logits: ``-sum_k t_k * log_softmax(z)_k`` per sample.

    The classifier gives it one logit per class (a zero logit is added for the
    first class of a binary problem, so that ``softmax([0, z])`` is
    ``sigmoid(z)``) and one-hot targets. ``LogSoftmax`` keeps it finite for
    any logits: no probability is ever clipped. This is MLPClassifier's and
    LogisticRegression's log-loss.
    """

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

    def build(self, g, y_pred, y_true):
        pos = g.relu(y_pred)
        exponent = g.sub(y_pred, g.mul(pos, g.const(2.0)))
        softplus = g.add(pos, g.op("Log", g.add(g.const(1.0), g.op("Exp", exponent))))
        return g.sum(g.sub(softplus, g.mul(y_true, y_pred)), axes=[1])


_LOSSES = {
    "squared_error": SquaredError,
    "absolute_error": AbsoluteError,
    "huber": Huber,
    "quantile": Quantile,
    "log_loss": LogLoss,
}


def get_loss(loss) -> BaseLoss:
    """Return the loss object for a name or a loss object.

    Parameters
    ----------
    loss : str or BaseLoss
        ``"squared_error"``, ``"absolute_error"``, ``"huber"``, ``"quantile"``,
        ``"log_loss"``, or an instance of a :class:`BaseLoss` subclass.
    """
    if isinstance(loss, BaseLoss):
        return loss
    if isinstance(loss, str) and loss in _LOSSES:
        return _LOSSES[loss]()
    raise ValueError(
        f"loss={loss!r} is not supported: use one of {sorted(_LOSSES)} or an "
        "instance of onnxgrad_sklearn.losses.BaseLoss."
    )
