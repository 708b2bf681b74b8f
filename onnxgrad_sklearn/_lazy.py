"""Names imported on first use, so that ``import onnxgrad_sklearn`` stays light.

onnx (and with it ml_dtypes), skl2onnx and onnxruntime take most of a second to
import, and the training build of onnxruntime imports torch when torch is
installed. The modules that ``import onnxgrad_sklearn`` loads (the estimators,
the losses, the optimizers, the templates) refer to onnx through
:func:`lazy` stand-ins; onnxruntime is reached through
:func:`onnxgrad_sklearn.runtime.bindings`. Either is imported when a fit, a
prediction, an export or an unpickling first needs it.
"""

from __future__ import annotations

import importlib

__all__ = ["lazy"]


class _Lazy:
    """Stands for a module, or one of its attributes, until it is first used."""

    __slots__ = ("_module", "_attribute", "_target")

    def __init__(self, module: str, attribute: str | None = None):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_attribute", attribute)
        object.__setattr__(self, "_target", None)

    def _resolve(self):
        target = self._target
        if target is None:
            target = importlib.import_module(self._module)
            if self._attribute is not None:
                target = getattr(target, self._attribute)
            object.__setattr__(self, "_target", target)
        return target

    def __getattr__(self, name):
        return getattr(self._resolve(), name)

    def __setattr__(self, name, value):
        setattr(self._resolve(), name, value)

    def __call__(self, *args, **kwargs):
        return self._resolve()(*args, **kwargs)

    def __instancecheck__(self, instance):
        return isinstance(instance, self._resolve())

    def __repr__(self):
        name = self._module + ("" if self._attribute is None else f".{self._attribute}")
        state = "imported" if self._target is not None else "not imported yet"
        return f"<lazy {name} ({state})>"


def lazy(module: str, attribute: str | None = None):
    """Return a stand-in for ``module`` (or ``module.attribute``) imported on first use.

    Reading an attribute of the stand-in (``onnx.ModelProto``), calling it or
    using it in ``isinstance`` imports the module, once.

    Parameters
    ----------
    module : str
        Module to import, such as ``"onnx"`` or ``"onnx.numpy_helper"``.
    attribute : str, optional
        An attribute of the module to stand for instead (``"TensorProto"``).

    Returns
    -------
    object
        The stand-in.
    """
    return _Lazy(module, attribute)
