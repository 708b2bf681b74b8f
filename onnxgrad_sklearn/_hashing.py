"""Deterministic descriptions and digests of values: the keys of training artifacts,
and the identity of a fit's settings (engines reused, checkpoints matched)."""

from __future__ import annotations

import hashlib

import numpy as np
from sklearn.base import BaseEstimator


def canonical(value, depth: int = 0, params: bool = False):
    """A hashable, deterministic description of ``value`` for a key.

    Estimator-like objects by their type and attributes (``vars``), or with
    ``params`` by their type and ``get_params(deep=False)``; protobuf
    messages by their bytes, arrays by dtype, shape and a digest of their bytes.
    An object that cannot be described (too deep, or of an unknown type) gets its
    identity, so that two of them never share a key: a cache miss, never a wrong hit.
    """
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return (type(value).__name__, repr(value))
    if isinstance(value, np.generic):
        return ("np", value.dtype.str, repr(value.item()))
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return ("ndarray-object", value.shape, tuple(repr(x) for x in value.ravel()))
        data = np.ascontiguousarray(value).tobytes()
        return ("ndarray", value.dtype.str, value.shape, hashlib.sha256(data).hexdigest())
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(canonical(v, depth + 1, params) for v in value))
    if isinstance(value, dict):
        items = sorted((repr(k), canonical(v, depth + 1, params)) for k, v in value.items())
        return ("dict", tuple(items))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted(repr(v) for v in value)))
    if hasattr(value, "SerializeToString"):
        return (type(value).__qualname__, value.SerializeToString(deterministic=True))
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, type):
        return ("type", f"{value.__module__}.{value.__qualname__}")
    if params and isinstance(value, BaseEstimator):
        return (kind, canonical(value.get_params(deep=False), depth + 1, params))
    if depth < 6 and hasattr(value, "__dict__") and _plain_type(value):
        return (kind, canonical(vars(value), depth + 1, params))
    return ("opaque", kind, id(value))


def _plain_type(value) -> bool:
    # scikit-learn's objects and this package's: their attributes say what they are
    module = type(value).__module__.split(".")[0]
    return module in ("sklearn", "onnxgrad_sklearn", "skl2onnx")


def describable(value) -> bool:
    """Whether :func:`canonical` describes ``value`` without an object's identity."""
    return not opaque(canonical(value))


def opaque(described) -> bool:
    """Whether a description :func:`canonical` gave holds an object's identity."""
    if not isinstance(described, tuple):
        return False
    if described and described[0] == "opaque":
        return True
    return any(opaque(part) for part in described)


def fingerprint(value, params: bool = False) -> str:
    """A digest equal for two values exactly when :func:`canonical` describes them alike
    (``params``: estimator-like objects by their parameters)."""
    return hashlib.sha256(repr(canonical(value, params=params)).encode()).hexdigest()


def digest(data: bytes) -> str:
    """A short digest of ``data`` (serialized graphs in a key)."""
    return hashlib.blake2b(data, digest_size=16).hexdigest()
