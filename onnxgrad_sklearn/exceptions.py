"""Exceptions raised by the estimators."""

__all__ = ["ConvergenceError"]


class ConvergenceError(ValueError):
    """Training diverged: a batch gave a non-finite loss.

    Raised by ``fit`` and ``partial_fit`` with ``on_divergence="raise"`` (the
    default). The estimator keeps the last weights that gave a finite loss and
    stays usable; ``on_divergence="warn"`` gives a ``ConvergenceWarning``
    instead of the exception.
    """
