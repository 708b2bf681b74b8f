"""Package-wide settings, as scikit-learn's: ``set_config``, ``get_config``, ``config_context``.

The settings are read when a fit creates its training sessions. As
scikit-learn's, they belong to the thread that sets them: another thread
starts from the defaults.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

__all__ = ["config_context", "get_config", "set_config"]

_global_config = {
    "allow_tf32": False,
    "malloc_mmap_threshold": 4 << 20,
    "cache_dir": "default",
    "cache_max_bytes": 256 << 20,
}
_threadlocal = threading.local()


def _get_threadlocal_config() -> dict:
    if not hasattr(_threadlocal, "global_config"):
        _threadlocal.global_config = _global_config.copy()
    return _threadlocal.global_config


def get_config() -> dict:
    """Return the current values of the settings of :func:`set_config`.

    Returns
    -------
    config : dict
        Keys are the parameter names of :func:`set_config`; a copy.

    See Also
    --------
    config_context : Change the settings within a ``with`` block.
    set_config : Change the settings.

    Examples
    --------
    >>> from onnxgrad_sklearn import get_config
    >>> get_config()["allow_tf32"]
    False
    """
    return _get_threadlocal_config().copy()


def set_config(
    allow_tf32: bool | None = None,
    malloc_mmap_threshold: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_max_bytes: int | None = None,
) -> None:
    """Change the package's settings (those left to ``None`` are not changed).

    Parameters
    ----------
    allow_tf32 : bool, default=None
        Whether the CUDA sessions the package creates may run float32 matrix
        products in TF32 (the CUDA provider option ``use_tf32``). TF32 rounds
        the inputs of a product to a 10-bit mantissa (float32 has 23 bits): on
        GPUs that have it (NVIDIA Ampere and later) products run faster, and the
        weights and loss curve of a fit drift from a CPU fit's by about 1e-3
        relative instead of about 1e-6. False by default: onnxruntime's CUDA
        provider enables TF32 unless told otherwise, and the package turns it
        off for every CUDA session it makes (training, gradients, prediction).
        Read when a fit creates its sessions; no effect on the CPU.
    malloc_mmap_threshold : int, default=None
        Size in bytes (4 MiB by default) from which glibc's ``malloc`` maps each
        block on its own, set by the first fit of a model of a million weights or
        more (``mallopt(M_MMAP_THRESHOLD)``, Linux with glibc only). glibc's
        moving threshold keeps freed session memory resident in its heap: the
        fit of such a model then peaks at about 4.6 instead of 6 MB per MB of
        weights, gradients and optimizer state (``docs/performance.md``). It is
        a setting of the whole process and stays once made; 0 leaves the
        allocator as it is, and so does ``MALLOC_MMAP_THRESHOLD_`` in the
        environment.
    cache_dir : str or path-like, default=None
        Folder of the training artifacts' disk cache
        (:mod:`onnxgrad_sklearn.artifacts`): ``"default"`` (the initial value) is
        the platform's per-user cache folder (``~/.cache/onnxgrad_sklearn`` on
        Linux), ``""`` turns the disk cache off, another value names the folder.
        The environment variable ``ONNXGRAD_SKLEARN_CACHE_DIR``, where it is set,
        wins (worker processes inherit the environment, not this setting).
    cache_max_bytes : int, default=None
        Size bound of the disk cache (256 MiB by default): beyond it, the least
        recently used entries are removed after each write.

    See Also
    --------
    config_context : Change the settings within a ``with`` block.
    get_config : The current settings.

    Examples
    --------
    >>> from onnxgrad_sklearn import get_config, set_config
    >>> set_config(allow_tf32=True)
    >>> get_config()["allow_tf32"]
    True
    >>> set_config(allow_tf32=False)
    """
    local_config = _get_threadlocal_config()
    if allow_tf32 is not None:
        if not isinstance(allow_tf32, bool):
            raise ValueError(f"allow_tf32 must be True or False, got {allow_tf32!r}.")
        local_config["allow_tf32"] = allow_tf32
    if malloc_mmap_threshold is not None:
        if (
            isinstance(malloc_mmap_threshold, bool)
            or not isinstance(malloc_mmap_threshold, int)
            or malloc_mmap_threshold < 0
        ):
            raise ValueError(
                "malloc_mmap_threshold must be a number of bytes >= 0 (0 leaves the "
                f"allocator as it is), got {malloc_mmap_threshold!r}."
            )
        local_config["malloc_mmap_threshold"] = malloc_mmap_threshold
    if cache_dir is not None:
        if not isinstance(cache_dir, (str, os.PathLike)):
            raise ValueError(
                f"cache_dir must be a folder, 'default' or '' (off), got {cache_dir!r}."
            )
        local_config["cache_dir"] = os.fspath(cache_dir)
    if cache_max_bytes is not None:
        if isinstance(cache_max_bytes, bool) or not isinstance(cache_max_bytes, int):
            raise ValueError(f"cache_max_bytes must be a number of bytes, got {cache_max_bytes!r}.")
        if cache_max_bytes < 0:
            raise ValueError(f"cache_max_bytes must be >= 0, got {cache_max_bytes!r}.")
        local_config["cache_max_bytes"] = cache_max_bytes


@contextmanager
def config_context(
    *,
    allow_tf32: bool | None = None,
    malloc_mmap_threshold: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_max_bytes: int | None = None,
):
    """Change the package's settings within a ``with`` block, then restore them.

    Parameters
    ----------
    allow_tf32 : bool, default=None
        See :func:`set_config`; ``None`` keeps the current value.
    malloc_mmap_threshold : int, default=None
        See :func:`set_config`; ``None`` keeps the current value.
    cache_dir : str or path-like, default=None
        See :func:`set_config`; ``None`` keeps the current value.
    cache_max_bytes : int, default=None
        See :func:`set_config`; ``None`` keeps the current value.

    Yields
    ------
    None

    See Also
    --------
    get_config : The current settings.
    set_config : Change the settings.

    Examples
    --------
    >>> from onnxgrad_sklearn import config_context, get_config
    >>> with config_context(allow_tf32=True):
    ...     get_config()["allow_tf32"]
    True
    >>> get_config()["allow_tf32"]
    False
    """
    old_config = get_config()
    set_config(
        allow_tf32=allow_tf32,
        malloc_mmap_threshold=malloc_mmap_threshold,
        cache_dir=cache_dir,
        cache_max_bytes=cache_max_bytes,
    )
    try:
        yield
    finally:
        set_config(**old_config)
