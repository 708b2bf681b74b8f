"""The import of onnxruntime: one distribution installed, complete bindings, no torch.

:func:`bindings` imports onnxruntime on first use and returns its C bindings,
after checking that only one onnxruntime distribution is installed
(:func:`check_single_runtime`: they all install the module ``onnxruntime`` and
overwrite each other's files) and that the bindings have what the package uses
(``OrtValue``, ``OrtDevice``, the IO binding). On the training build the import
leaves out the build check that imports ``onnxruntime.training`` (and torch,
1-3 s): its results are computed when first read
(:func:`import_onnxruntime_light`, ``docs/how_it_works.md``).
:mod:`onnxgrad_sklearn.runtime` re-exports these names, through which the rest
of the package reaches onnxruntime.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.metadata
import importlib.util
import logging
import sys
import threading
from collections.abc import Sequence

__all__ = [
    "ONNXRUNTIME_DISTRIBUTIONS",
    "bindings",
    "check_single_runtime",
    "import_onnxruntime",
    "import_onnxruntime_light",
]

logger = logging.getLogger("onnxgrad_sklearn")

#: The distributions that install the module ``onnxruntime``.
ONNXRUNTIME_DISTRIBUTIONS = (
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-training",
    "onnxruntime-training-cpu",
)


def _installed_distributions() -> list[str]:
    found = []
    for name in ONNXRUNTIME_DISTRIBUTIONS:
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def check_single_runtime(installed: Sequence[str] | None = None) -> None:
    """Refuse an environment where several onnxruntime distributions are installed.

    Parameters
    ----------
    installed : list of str, optional
        The distributions found (by default, looked up with ``importlib.metadata``).

    Raises
    ------
    ImportError
        With the pip command that leaves one distribution.
    """
    installed = _installed_distributions() if installed is None else list(installed)
    if len(installed) <= 1:
        return
    if sys.version_info < (3, 13):
        keep, why = "onnxruntime-training-cpu==1.19.2", "both backends on the CPU"
    else:
        keep, why = "onnxruntime", "the standard backend on the CPU"
    raise ImportError(
        f"Several onnxruntime distributions are installed ({', '.join(installed)}): they "
        "all provide the module 'onnxruntime' and overwrite each other's files. Keep one: "
        f"'pip uninstall -y {' '.join(installed)} && pip install {keep}' ({why})."
    )


@functools.cache
def bindings():
    """Import onnxruntime on first use and return its C bindings (``_pybind_state``).

    The checks run first: one onnxruntime distribution installed
    (:func:`check_single_runtime`), then bindings that have ``OrtValue``,
    ``OrtDevice`` and the IO binding. A failed check is not cached: it raises
    again at the next call. onnxruntime is imported by
    :func:`import_onnxruntime_light`: on the training build, without
    ``onnxruntime.training`` and torch.

    Raises
    ------
    ImportError
        Saying which distributions to uninstall and which to install.
    """
    check_single_runtime()
    with _root_logger_kept():
        # after the check: a broken install fails clearly
        onnxruntime = import_onnxruntime_light()
        from onnxruntime.capi import _pybind_state as _C

    if not all(hasattr(_C, name) for name in ("OrtValue", "OrtDevice", "SessionIOBinding")):
        raise ImportError(
            f"The installed onnxruntime ({getattr(onnxruntime, '__version__', 'unknown')}) is "
            "incomplete: its bindings lack OrtValue, OrtDevice or SessionIOBinding (another "
            "package may have overwritten its files). Reinstall it: 'pip uninstall -y "
            f"{' '.join(ONNXRUNTIME_DISTRIBUTIONS)} && pip install "
            "onnxruntime-training-cpu==1.19.2' (Python <= 3.12, both backends) or "
            "'... && pip install onnxruntime' (the standard backend)."
        )
    logger.debug("onnxruntime %s imported", getattr(onnxruntime, "__version__", "unknown"))
    return _C


@contextlib.contextmanager
def _root_logger_kept():
    # The training build's ``onnxruntime.tools`` calls logging.basicConfig(), which
    # gives the root logger a default handler: logging.basicConfig(...) called later
    # by the user would do nothing. Whatever the import added to the root logger is
    # taken back.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


class _RefuseTrainingImport(importlib.abc.MetaPathFinder):
    """Meta-path finder: ``onnxruntime.training`` is not found, in one thread only."""

    def __init__(self):
        self.thread = threading.get_ident()
        self.refused = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "onnxruntime.training" and threading.get_ident() == self.thread:
            self.refused = True
            raise ModuleNotFoundError(
                "onnxruntime.training is not imported by onnxgrad_sklearn", name=fullname
            )
        return None


#: What the training build's ``onnxruntime_validation.validate_build_package_info()``
#: returns, in order; the last three are also copied into ``onnxruntime``.
_BUILD_INFO = ("has_ortmodule", "package_name", "version", "cuda_version")


def import_onnxruntime_light():
    """``import onnxruntime`` without importing ``onnxruntime.training`` (nor torch).

    The training build's ``onnxruntime/__init__.py`` runs
    ``capi/onnxruntime_validation.py``, whose ``validate_build_package_info()``
    imports ``onnxruntime.training.ortmodule`` only to learn whether ORTModule is
    there (``has_ortmodule``) and, if it is, to copy the build's ``package_name``,
    ``version`` and ``cuda_version`` (warning on a CUDA runtime mismatch). That
    import loads ``onnxruntime.training``, ``onnxruntime.tools`` and all of torch
    where torch is installed: 1 to 3 s, none of which the C bindings need.

    Here ``onnxruntime.training`` is refused (``ModuleNotFoundError``, which the
    validation takes for "no ORTModule") while ``import onnxruntime`` runs, in this
    thread only; the finder is removed right after, so that a later
    ``import onnxruntime.training`` works as usual. Where the training package
    exists, the four results are then taken out of ``onnxruntime_validation``
    (and ``package_name``, ``version``, ``cuda_version`` out of ``onnxruntime``)
    and computed by the same ``validate_build_package_info()`` when first read:
    they are what they would have been, only later. Not done, or done later: the
    CUDA runtime version warning, and what importing ORTModule does besides
    (seeding onnxruntime from ``torch.initial_seed()``, wrapping
    ``torch.utils.checkpoint``). ``onnxruntime.__version__`` is the package's own
    string, which the validation would replace by the same build-info version.
    Nothing is deferred on plain onnxruntime, which has no ``onnxruntime.training``
    (the refused import fails as the real one would; 1.32's import does not look
    for it at all), nor when onnxruntime is already imported.

    Returns
    -------
    module
        ``onnxruntime``.
    """
    if "onnxruntime" in sys.modules:
        return sys.modules["onnxruntime"]
    finder = _RefuseTrainingImport()
    sys.meta_path.insert(0, finder)
    try:
        import onnxruntime
    finally:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    if finder.refused and _findable("onnxruntime.training"):
        _defer_build_validation(onnxruntime)
    return onnxruntime


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # refused by another finder: the validation gets that too
        return False


def _defer_build_validation(ort) -> None:
    validation = sys.modules.get("onnxruntime.capi.onnxruntime_validation")
    validate = getattr(validation, "validate_build_package_info", None)
    if validate is None or not all(name in vars(validation) for name in _BUILD_INFO):
        return  # another layout: what the refused import computed stays
    if "__getattr__" in vars(validation) or "__getattr__" in vars(ort):
        return
    copied = tuple(name for name in _BUILD_INFO[1:] if name in vars(ort))
    lock, running = threading.RLock(), []

    def validated(name: str, module):
        with lock:
            if name in vars(module):  # computed meanwhile
                return vars(module)[name]
            if running:  # read while the validation runs (nothing in onnxruntime does)
                raise AttributeError(name)
            running.append(True)
            try:
                with _root_logger_kept():
                    results = validate()
            finally:
                running.clear()
            for key, value in zip(_BUILD_INFO, results):
                setattr(validation, key, value)
            for key in copied:
                setattr(ort, key, getattr(validation, key))
            if validation.version:  # as onnxruntime/__init__.py does
                ort.__version__ = validation.version
            for target in (validation, ort):
                vars(target).pop("__getattr__", None)
            return vars(module)[name]

    def module_getattr(module, names):
        def __getattr__(name):
            if name in names:
                return validated(name, module)
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}")

        return __getattr__

    for name in _BUILD_INFO:
        delattr(validation, name)
    for name in copied:
        delattr(ort, name)
    validation.__getattr__ = module_getattr(validation, _BUILD_INFO)
    ort.__getattr__ = module_getattr(ort, copied)


def import_onnxruntime():
    """Return the ``onnxruntime`` module, imported on first use (checked by :func:`bindings`)."""
    bindings()
    return sys.modules["onnxruntime"]
