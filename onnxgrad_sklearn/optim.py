"""Optimizers as ONNX update graphs, and learning-rate schedules.

An optimizer is its update rule and nothing else. :class:`BaseOptimizer`
subclasses describe, for one weight tensor, how the weight and its state
(velocity, moments) change given its gradient and the learning rate; the
training engine builds one ONNX graph that applies the rule to every trained
weight, and runs it once per batch on ``OrtValue`` objects, so weights,
gradients and state never leave the runtime.

The formulas are those of scikit-learn's ``_stochastic_optimizers.py``, so that
MLPRegressor's ``solver="sgd"``/``"adam"`` and these optimizers produce the same
numbers.

Write your own optimizer by subclassing :class:`BaseOptimizer`: list the names
of the per-weight state tensors in ``state_names`` and implement
:meth:`BaseOptimizer.update` with a :class:`~onnxgrad_sklearn.GraphBuilder`::

    class SignSGD(BaseOptimizer):
        def update(self, g, param, grad, state, learning_rate):
            return g.sub(param, g.mul(learning_rate, g.op("Sign", grad))), {}

The learning-rate schedule (``learning_rate="constant"``, ``"invscaling"``,
``"adaptive"`` on the estimator) is a separate step: :class:`LearningRateSchedule`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from sklearn.base import BaseEstimator

if TYPE_CHECKING:
    import onnx

    from ._graph import GraphBuilder

__all__ = [
    "LBFGS",
    "SGD",
    "Adam",
    "BaseOptimizer",
    "LearningRateSchedule",
    "Momentum",
    "Nesterov",
    "get_optimizer",
]

logger = logging.getLogger("onnxgrad_sklearn")


class BaseOptimizer(BaseEstimator):
    """Base class of the optimizers: an update rule written as an ONNX graph.

    Attributes
    ----------
    state_names : tuple of str
        Names of the state tensors each weight carries (same shape as the
        weight, zeros at the start of training).
    elementwise : bool
        True when :meth:`update` computes every element of the new weight and
        state from the same element of the weight, gradient and state (and
        scalars) only. The engine then updates all weights at once as one
        vector, in buffers it reuses (on CPU), which is faster than one update
        per tensor (benchmarks/README.md). Leave it False for rules that look
        at a whole tensor (a norm, a shape).
    full_batch : bool
        True for solvers that minimise the loss of the whole training set
        (:class:`LBFGS`) instead of updating the weights batch by batch.
    """

    state_names: tuple[str, ...] = ()
    elementwise: bool = False
    full_batch: bool = False

    def update(
        self,
        g: GraphBuilder,
        param: str,
        grad: str,
        state: dict[str, str],
        learning_rate: str,
    ) -> tuple[str, dict[str, str]]:
        """Add the nodes that update one weight; return its new value and state.

        Parameters
        ----------
        g : GraphBuilder
            Where to add nodes.
        param, grad : str
            Names of the weight and of its gradient (same shape).
        state : dict of str to str
            Name of each state tensor of this weight, keyed by ``state_names``.
        learning_rate : str
            Name of the scalar given by :meth:`step_learning_rate`, in the
            training dtype ``g.dtype`` (float32 or float64; ``g.const``
            follows it).

        Returns
        -------
        new_param : str
            Name of the updated weight.
        new_state : dict of str to str
            Name of each updated state tensor, keyed by ``state_names``.
        """
        raise NotImplementedError

    def step_learning_rate(self, learning_rate: float, step: int) -> float:
        """Return the value fed as ``learning_rate`` to the update graph.

        Parameters
        ----------
        learning_rate : float
            Current learning rate of the schedule.
        step : int
            Number of this update, counted from 1 since the state was created.
        """
        return learning_rate

    def init_state(self, param: np.ndarray) -> dict[str, np.ndarray]:
        """Return the initial state of a weight: zeros of its dtype for each ``state_names``."""
        # np.zeros, not zeros_like: its pages are the system's zero page until written,
        # so a large model's initial state takes no memory before it is copied
        return {
            name: np.zeros(np.shape(param), np.asarray(param).dtype) for name in self.state_names
        }

    def build_update_model(
        self, shapes: Sequence[Sequence[int]], flat: bool = False, dtype=np.float32
    ) -> onnx.ModelProto:
        """Return the update graph of weights with the given shapes.

        Inputs: ``learning_rate`` then, for each weight ``i``, ``param_i``,
        ``grad_i`` and its state tensors ``<state>_i``. Outputs: ``new_param_i``
        then ``new_<state>_i`` for every weight, in the same order.

        With ``flat=True`` (only for :attr:`elementwise` rules) the weights and
        each state are one vector, all weights end to end: inputs
        ``learning_rate``, ``param``, ``grad_0``, ``grad_1``, ... (their own
        shapes, concatenated inside the graph), then ``<state>``; outputs
        ``new_param`` then ``new_<state>``. The rule then runs once over every
        weight instead of once per weight.

        ``dtype`` (float32 or float64, the training dtype) is the type of every
        input and output, and of the constants :meth:`update` makes with
        ``g.const``.
        """
        from ._graph import GraphBuilder  # imports onnx: on first use
        from ._graph import tensor_info as _tensor_info

        g = GraphBuilder("opt", dtype=dtype)

        def tensor_info(name, shape):
            return _tensor_info(name, shape, g.elem_type)

        inputs = [tensor_info("learning_rate", [])]
        groups = []
        if flat:
            if not self.elementwise:
                raise ValueError(
                    f"{type(self).__name__} is not element-wise: it cannot update "
                    "all weights as one vector."
                )
            size = int(sum(math.prod(shape) for shape in shapes))
            grads = [f"grad_{i}" for i in range(len(shapes))]
            inputs.append(tensor_info("param", [size]))
            inputs.extend(tensor_info(n, list(shape)) for n, shape in zip(grads, shapes))
            inputs.extend(tensor_info(s, [size]) for s in self.state_names)
            minus_one = g.const([-1], np.int64)
            parts = [g.op("Reshape", n, minus_one) for n in grads]
            grad = parts[0] if len(parts) == 1 else g.op("Concat", *parts, axis=0)
            groups.append(("param", grad, {s: s for s in self.state_names}, "", [size]))
        else:
            for i, shape in enumerate(shapes):
                names = [f"param_{i}", f"grad_{i}"] + [f"{s}_{i}" for s in self.state_names]
                inputs.extend(tensor_info(n, list(shape)) for n in names)
                state = {s: f"{s}_{i}" for s in self.state_names}
                groups.append((names[0], names[1], state, f"_{i}", list(shape)))
        outputs = []
        for param, grad, state, suffix, shape in groups:
            new_param, new_state = self.update(g, param, grad, state, "learning_rate")
            if set(new_state) != set(self.state_names):
                raise ValueError(
                    f"{type(self).__name__}.update returned state {sorted(new_state)}, "
                    f"expected {sorted(self.state_names)}."
                )
            # Outputs are named after the nodes that make them: no Identity copies
            # (measured in benchmarks/README.md).
            produced = [new_param] + [new_state[s] for s in self.state_names]
            wanted = [f"new_param{suffix}"] + [f"new_{s}{suffix}" for s in self.state_names]
            for k, (tensor, name) in enumerate(zip(produced, wanted)):
                if tensor in produced[:k]:  # one tensor, two outputs: copy the second
                    outputs.append(
                        tensor_info(g.identity(wanted[produced.index(tensor)], name), shape)
                    )
                else:
                    outputs.append(tensor_info(g.rename_output(tensor, name), shape))
        return g.make_model(inputs, outputs, name=type(self).__name__)


class SGD(BaseOptimizer):
    """Stochastic gradient descent, with optional momentum, as MLPRegressor(solver="sgd").

    Without momentum: ``param -= learning_rate * grad``. With momentum:
    ``velocity = momentum * velocity - learning_rate * grad``, then
    ``param += velocity``, or with ``nesterov=True``
    ``param += momentum * velocity - learning_rate * grad`` (scikit-learn's
    ``SGDOptimizer`` formulas).

    Parameters
    ----------
    momentum : float, default=0.0
        Decay of the velocity, in [0, 1]; 0 keeps no velocity.
    nesterov : bool, default=False
        Nesterov's accelerated gradient (needs ``momentum > 0``).
    """

    elementwise = True

    def __init__(self, momentum: float = 0.0, nesterov: bool = False):
        self.momentum = momentum
        self.nesterov = nesterov

    @property
    def state_names(self) -> tuple[str, ...]:
        """``("velocity",)`` with momentum, else nothing."""
        return ("velocity",) if self.momentum else ()

    def update(self, g, param, grad, state, learning_rate):
        _check_unit(self.momentum, "momentum", type(self).__name__)
        step = g.mul(learning_rate, grad)
        if not self.momentum:
            return g.sub(param, step), {}
        momentum = g.const(self.momentum)
        velocity = g.sub(g.mul(momentum, state["velocity"]), step)
        if self.nesterov:
            return g.add(param, g.sub(g.mul(momentum, velocity), step)), {"velocity": velocity}
        return g.add(param, velocity), {"velocity": velocity}


class Momentum(SGD):
    """Gradient descent with momentum: ``SGD(momentum, nesterov=False)``.

    ``velocity = momentum * velocity - learning_rate * grad``, then
    ``param += velocity``: MLPRegressor(solver="sgd", nesterovs_momentum=False).

    Parameters
    ----------
    momentum : float, default=0.9
        Decay of the velocity, in [0, 1].
    """

    nesterov = False

    def __init__(self, momentum: float = 0.9):
        self.momentum = momentum


class Nesterov(SGD):
    """Nesterov's accelerated gradient: ``SGD(momentum, nesterov=True)``.

    ``velocity = momentum * velocity - learning_rate * grad``, then
    ``param += momentum * velocity - learning_rate * grad``:
    MLPRegressor(solver="sgd", nesterovs_momentum=True).

    Parameters
    ----------
    momentum : float, default=0.9
        Decay of the velocity, in [0, 1].
    """

    nesterov = True

    def __init__(self, momentum: float = 0.9):
        self.momentum = momentum


class Adam(BaseOptimizer):
    """Adam, with scikit-learn's bias correction folded into the learning rate.

    ``m = beta_1 * m + (1 - beta_1) * grad``,
    ``v = beta_2 * v + (1 - beta_2) * grad ** 2``,
    ``lr_t = learning_rate * sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)``,
    ``param -= lr_t * m / (sqrt(v) + epsilon)``: MLPRegressor(solver="adam").

    Parameters
    ----------
    beta_1 : float, default=0.9
        Decay of the first moment, in [0, 1).
    beta_2 : float, default=0.999
        Decay of the second moment, in [0, 1).
    epsilon : float, default=1e-8
        Added to the denominator for numerical stability.
    """

    state_names = ("m", "v")
    elementwise = True

    def __init__(self, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-8):
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def step_learning_rate(self, learning_rate, step):
        return learning_rate * math.sqrt(1 - self.beta_2**step) / (1 - self.beta_1**step)

    def update(self, g, param, grad, state, learning_rate):
        _check_unit(self.beta_1, "beta_1", "Adam", open_right=True)
        _check_unit(self.beta_2, "beta_2", "Adam", open_right=True)
        if not self.epsilon > 0:
            raise ValueError(f"Adam epsilon must be > 0, got {self.epsilon!r}.")
        m = g.add(g.mul(g.const(self.beta_1), state["m"]), g.mul(g.const(1 - self.beta_1), grad))
        v = g.add(
            g.mul(g.const(self.beta_2), state["v"]),
            g.mul(g.const(1 - self.beta_2), g.mul(grad, grad)),
        )
        denom = g.add(g.sqrt(v), g.const(self.epsilon))
        new_param = g.sub(param, g.mul(learning_rate, g.div(m, denom)))
        return new_param, {"m": m, "v": v}


def _check_unit(value, name, owner, open_right=False):
    ok = 0 <= value < 1 if open_right else 0 <= value <= 1
    if not ok:
        interval = "[0, 1)" if open_right else "[0, 1]"
        raise ValueError(f"{owner} {name} must be in {interval}, got {value!r}.")


class LBFGS(BaseOptimizer):
    """Full-batch L-BFGS (``scipy.optimize.minimize(method="L-BFGS-B")``), as MLPRegressor.

    ``fit`` minimises the loss over the whole training set, its value and
    gradient computed by the runtime (over chunks of rows when the data is
    large) and the search directions by scipy. The estimator's ``max_iter`` is
    the maximum number of iterations and ``tol`` the gradient tolerance
    (``gtol``), as in MLPRegressor(solver="lbfgs"); ``batch_size``,
    ``shuffle``, the learning rate and early stopping do not apply, and
    ``partial_fit`` is not available.

    The L1 part of a penalty (``l1_ratio > 0``) is not differentiated: each
    penalised weight is written ``u - v`` with ``u, v >= 0`` (L-BFGS-B's
    bounds), on which the penalty ``u + v`` is linear, so that weights reach
    exactly 0 as with scikit-learn's coordinate descent.

    Parameters
    ----------
    max_fun : int, default=15000
        Maximum number of loss evaluations (MLPRegressor's ``max_fun``).
    ftol : float or None, default=None
        scipy's ``ftol``: stop when the loss decreases by less than ``ftol``
        (relative) in an iteration. None keeps scipy's default (about 2.2e-9),
        as MLPRegressor(solver="lbfgs") does. scikit-learn's linear models and
        GLMs pass ``64 * numpy.finfo(float).eps``: with ``dtype="float64"``
        that drives a convex template to their solution (coefficients within
        1e-6 relative where the default stopped 3e-6 to 1e-5 away on a
        PoissonRegressor and 3e-7 on a LogisticRegression); in float32 a
        value below about 1e-7 only makes the line search fail at the end.
    smoothing : "auto", tuple of float or None, default="auto"
        For a loss with kinks (hinge, pinball, absolute and epsilon-insensitive
        errors), the widths over which the kinks are rounded in a first series
        of minimisations, each starting where the last stopped, before the
        exact loss (see :meth:`~onnxgrad_sklearn.losses.BaseLoss.smoothed`).
        L-BFGS stalls at the kinks of the exact loss: on LinearSVC's hinge at
        C=1 it stopped 4.1e-3 above the optimum in float32, 3.5e-5 after rounding.
        The widths are relative to the loss's scale: 1 for a classifier's
        margins, the standard deviation of the targets for a regressor.
        ``"auto"`` is ``(0.1, 0.01, 1e-3, 1e-4)``; None minimises the
        exact loss only. The iterations of every stage count towards
        ``max_iter`` and ``loss_curve_`` holds the value of the loss each
        stage minimises; ``loss_`` is the exact loss, never above the exact
        loss at the start (a warm start keeps its weights if the stages end
        higher). Smooth losses ignore it.
    """

    full_batch = True
    #: The relative widths of ``smoothing="auto"``.
    AUTO_SMOOTHING = (0.1, 0.01, 1e-3, 1e-4)

    def __init__(self, max_fun: int = 15000, ftol: float | None = None, smoothing="auto"):
        self.max_fun = max_fun
        self.ftol = ftol
        self.smoothing = smoothing

    def widths(self) -> tuple:
        """The relative smoothing widths, largest first (empty: exact loss only).

        Raises
        ------
        ValueError
            When ``smoothing`` is not "auto", None or a sequence of numbers > 0.
        """
        smoothing = self.smoothing
        if smoothing is None:
            return ()
        if isinstance(smoothing, str):
            if smoothing == "auto":
                return self.AUTO_SMOOTHING
        else:
            try:
                widths = tuple(float(w) for w in smoothing)
            except (TypeError, ValueError):
                widths = None
            if widths is not None and all(np.isfinite(w) and w > 0 for w in widths):
                return tuple(sorted(widths, reverse=True))
        raise ValueError(
            f"LBFGS smoothing must be 'auto', None or a sequence of widths > 0, got {smoothing!r}."
        )

    def update(self, g, param, grad, state, learning_rate):
        raise TypeError("LBFGS is a full-batch solver: it has no per-batch update graph.")


_OPTIMIZERS = {
    "sgd": SGD,
    "momentum": Momentum,
    "nesterov": Nesterov,
    "adam": Adam,
    "lbfgs": LBFGS,
}

#: Names accepted by ``optimizer=``, besides ``"auto"`` and optimizer objects.
OPTIMIZER_NAMES = tuple(_OPTIMIZERS)


def get_optimizer(optimizer) -> BaseOptimizer:
    """Return the optimizer object for a name or an optimizer object.

    Parameters
    ----------
    optimizer : str or BaseOptimizer
        ``"sgd"``, ``"momentum"``, ``"nesterov"``, ``"adam"``, ``"lbfgs"``, or an
        instance of a :class:`BaseOptimizer` subclass.
    """
    if isinstance(optimizer, BaseOptimizer):
        return optimizer
    if isinstance(optimizer, str) and optimizer in _OPTIMIZERS:
        return _OPTIMIZERS[optimizer]()
    raise ValueError(
        f"optimizer={optimizer!r} is not supported: use one of {sorted(_OPTIMIZERS)} or "
        "an instance of onnxgrad_sklearn.optim.BaseOptimizer."
    )


class LearningRateSchedule:
    """The learning rate over epochs, with MLPRegressor's three schedules.

    Parameters
    ----------
    kind : {"constant", "invscaling", "adaptive"}
        ``"constant"`` keeps ``learning_rate_init``; ``"invscaling"`` sets
        ``learning_rate_init / (t + 1) ** power_t`` at the end of every epoch,
        ``t`` being the number of samples seen; ``"adaptive"`` divides the rate
        by 5 each time the loss stops improving, and stops below 1e-6.
    learning_rate_init : float
        Initial rate.
    power_t : float
        Exponent of ``"invscaling"``.

    Attributes
    ----------
    learning_rate : float
        The current rate.
    """

    def __init__(self, kind: str, learning_rate_init: float, power_t: float = 0.5):
        self.kind = kind
        self.learning_rate_init = learning_rate_init
        self.power_t = power_t
        self.learning_rate = float(learning_rate_init)

    def iteration_ends(self, time_step: int) -> None:
        """Update the rate at the end of an epoch (``time_step``: samples seen)."""
        if self.kind == "invscaling":
            self.learning_rate = float(self.learning_rate_init) / (time_step + 1) ** self.power_t

    def trigger_stopping(self, msg: str) -> bool:
        """Return whether to stop when the loss no longer improves.

        The adaptive schedule lowers the rate instead, until it is <= 1e-6.
        """
        if self.kind != "adaptive":
            logger.info("%s Stopping.", msg)
            return True
        if self.learning_rate <= 1e-6:
            logger.info("%s Learning rate too small. Stopping.", msg)
            return True
        self.learning_rate /= 5.0
        logger.info("%s Setting learning rate to %f", msg, self.learning_rate)
        return False
