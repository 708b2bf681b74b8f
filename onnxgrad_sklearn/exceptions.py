"""Exceptions raised by the estimators."""

__all__ = ["CheckpointError", "ConvergenceError"]


class ConvergenceError(ValueError):
    """Training diverged: a batch gave a non-finite loss.

    Raised by ``fit`` and ``partial_fit`` with ``on_divergence="raise"`` (the
    default). The estimator keeps the last weights that gave a finite loss and
    stays usable; ``on_divergence="warn"`` gives a ``ConvergenceWarning``
    instead of the exception.
    """


class CheckpointError(ValueError):
    """A checkpoint file or folder that a fit cannot use.

    Raised by a fit with :class:`~onnxgrad_sklearn.callbacks.Checkpoint` before it
    trains: a file that is empty, truncated, not a checkpoint, or of a format this
    version does not read (``on_unreadable="restart"`` starts afresh instead, with a
    warning), or a path that cannot be written. The message names the file, what is
    wrong with it and what to do.
    """
