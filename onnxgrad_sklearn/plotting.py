"""Plots of a fitted estimator's training (matplotlib is an optional dependency)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sklearn.base import is_classifier
from sklearn.utils.validation import check_is_fitted

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes

__all__ = ["plot_loss_curve"]

logger = logging.getLogger("onnxgrad_sklearn")

_MATPLOTLIB_MISSING = (
    "plot_loss_curve needs matplotlib, which is not installed: "
    "pip install matplotlib (or the extra: pip install 'onnxgrad-sklearn[plot]')."
)


def _final_name(est: Any) -> str:
    """Name of the trained model inside ``est`` (the last step of a Pipeline)."""
    model = getattr(est, "estimator_", None)
    if model is None:
        return ""
    steps = getattr(model, "steps", None)
    if steps:
        model = steps[-1][1]
    return type(model).__name__


def plot_loss_curve(est: Any, ax: Axes | None = None) -> Axes:
    """Draw the training loss per epoch and, if recorded, the validation score.

    The loss (``est.loss_curve_``) is drawn on ``ax``, on a log scale when it
    is positive and spans two orders of magnitude or more; when the estimator was
    fitted with ``early_stopping=True`` its ``validation_scores_`` (R2 for a
    regressor, accuracy for a classifier) are drawn on a secondary y axis
    sharing the epochs. One legend lists both lines.

    Parameters
    ----------
    est : OrtGradientRegressor, OrtGradientClassifier or estimator with ``loss_curve_``
        A fitted estimator. scikit-learn's ``MLPRegressor`` and
        ``MLPClassifier`` (stochastic solvers) work too.
    ax : matplotlib.axes.Axes, default=None
        Axes to draw on. ``None`` creates a new figure with
        ``matplotlib.pyplot.subplots``, which uses the current backend; pass
        an Axes of a ``matplotlib.figure.Figure`` to draw without pyplot.

    Returns
    -------
    matplotlib.axes.Axes
        The Axes holding the loss line. The validation line, when drawn, is
        on its twin (``ax.figure.axes[1]``).

    Raises
    ------
    sklearn.exceptions.NotFittedError
        If ``est`` is not fitted.
    ValueError
        If ``est`` is fitted but has no ``loss_curve_`` (or an empty one).
    ImportError
        If matplotlib is not installed.

    Examples
    --------
    >>> from matplotlib.figure import Figure
    >>> fig = Figure()
    >>> ax = plot_loss_curve(reg, ax=fig.subplots())  # doctest: +SKIP
    >>> fig.savefig("loss.png")  # doctest: +SKIP
    """
    check_is_fitted(est)
    losses = getattr(est, "loss_curve_", None)
    if losses is None or len(losses) == 0:
        raise ValueError(
            f"{type(est).__name__} has no loss curve to plot: it records loss_curve_ only "
            "when trained by epochs (OrtGradientRegressor, OrtGradientClassifier, or an "
            "MLP with a stochastic solver)."
        )
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise ImportError(_MATPLOTLIB_MISSING) from exc

    if ax is None:
        import matplotlib.pyplot as plt

        _, ax = plt.subplots(figsize=(7, 4.5))

    epochs = list(range(1, len(losses) + 1))
    marker = "o" if len(losses) <= 30 else None
    handles = ax.plot(epochs, list(losses), color="C0", marker=marker, label=_loss_label(est))
    ax.set_xlabel("epoch")
    ax.set_ylabel("training loss")
    if min(losses) > 0 and max(losses) / min(losses) >= 100:
        ax.set_yscale("log")  # a loss spanning orders of magnitude
    ax.grid(True, alpha=0.3)

    handles += _plot_validation(ax, est, marker)
    ax.legend(handles, [h.get_label() for h in handles], loc="best")
    inner = _final_name(est)
    title = f"{type(est).__name__}({inner})" if inner else type(est).__name__
    ax.set_title(f"{title}: {len(losses)} epochs")
    logger.debug("plotted %d epochs of %s", len(losses), title)
    return ax


def _loss_label(est) -> str:
    """The loss curve's label: the loss's name (the template's own, as resolved at fit)."""
    loss_name = getattr(est, "loss", None)
    if loss_name == "auto":
        loss_name = repr(getattr(est, "_loss_", None) or "auto")
    return f"training loss ({loss_name})" if isinstance(loss_name, str) else "training loss"


def _plot_validation(ax, est, marker) -> list:
    """The validation scores on a second axis, where the fit recorded some: the lines."""
    scores = getattr(est, "validation_scores_", None)
    if scores is None or len(scores) == 0:
        return []
    metric = "accuracy" if is_classifier(est) else "R2"
    twin = ax.twinx()
    twin.set_ylabel(f"validation score ({metric})")
    return twin.plot(
        list(range(1, len(scores) + 1)),
        list(scores),
        color="C1",
        marker=marker,
        linestyle="--",
        label=f"validation score ({metric})",
    )
