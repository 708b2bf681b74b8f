"""Training artifacts: what a fit derives from a model's structure, built once.

A fit converts the template with skl2onnx, builds the training graph (the loss and
the penalty appended), the backend's graphs (the TrainingAgent's gradient graph from
onnxruntime-training's builder, or the standard backend's step graphs from onnx-ad
and the passes) and the update and predict graphs. None of that depends on the
values being trained (the weights are located in the converted graph and given
again at each fit; the training graphs take them as inputs, and so do the penalty's
coefficients and the learning rate), only on the structure: layer shapes,
activations, the preprocessing head, the loss, the update rule, the penalty's form,
the dtype, the device. Each such product is an *artifact*: ONNX bytes and the JSON
metadata a fit reads instead of parsing them (names, shapes, flags), addressed by a
key made of that structure, an artifact format version, a digest of this package's
own code (an editable install changes code without changing its version) and the
versions of the packages that produce it. A structure that :func:`canonical` can
only describe by an object's identity has no key (:func:`stable_key`): it is built
again, never confused with another.

A fit whose artifacts are all found imports none of onnx, skl2onnx and onnx-ad:
its sessions are made from the bytes, and the ONNX models (``to_onnx``, the
engine's graphs) are parsed only when asked for.

Artifacts are kept for the process (in memory, a few dozen) and on disk, in a
per-user cache folder (:func:`cache_dir`): a fit in a new process (a notebook
kernel, a GridSearchCV worker, the command line) finds what an earlier process
built. The folder is the platform's cache location, or the environment variable
``ONNXGRAD_SKLEARN_CACHE_DIR`` (an empty value turns the disk cache off), or
:func:`~onnxgrad_sklearn.set_config`'s ``cache_dir``; the environment wins, so that
worker processes follow it. An entry is one file of ONNX bytes and JSON (never
pickle), written to a temporary file and renamed into place (several processes may
fill the folder at once), checked against its digests when read: a corrupt or
truncated entry is removed and rebuilt with a logged warning. The folder is bounded
in size (``set_config(cache_max_bytes=...)``), the least recently used entries
evicted first. A folder that cannot be written turns the disk cache off for the
process, with one warning.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
import threading
import uuid
import warnings
from collections import OrderedDict
from pathlib import Path

from ._hashing import canonical, describable, digest, fingerprint, opaque

__all__ = [
    "CACHE_ENV",
    "FORMAT_VERSION",
    "Artifact",
    "cache_dir",
    "canonical",
    "code_digest",
    "default_cache_dir",
    "describable",
    "fingerprint",
    "get",
    "make_key",
    "put",
    "stable_key",
]

logger = logging.getLogger("onnxgrad_sklearn")

#: The environment variable naming the cache folder ("" turns the disk cache off).
CACHE_ENV = "ONNXGRAD_SKLEARN_CACHE_DIR"
#: Version of the entries' layout and of what they hold; a new one makes new keys.
FORMAT_VERSION = 2
#: File name suffix of an entry.
SUFFIX = ".artifact"
#: First bytes of an entry.
MAGIC = b"onnxgrad-sklearn-artifact\n"
#: Entries kept in memory for the process.
MEMORY_ENTRIES = 64
#: The distributions whose versions are part of every key.
PRODUCERS = (
    "onnx",
    "skl2onnx",
    "onnx-ad",
    "scikit-learn",
    "numpy",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxruntime-training",
    "onnxruntime-training-cpu",
)


class Artifact:
    """One entry: named blobs (ONNX bytes) and JSON metadata.

    Parameters
    ----------
    blobs : dict of str to bytes
        The serialized graphs, by name.
    meta : dict
        What goes with them (names, layouts, flags), JSON only.
    """

    __slots__ = ("_digests", "blobs", "meta")

    def __init__(self, blobs: dict, meta: dict | None = None):
        self.blobs = dict(blobs)
        self.meta = dict(meta or {})
        self._digests = {}

    def size(self) -> int:
        """Bytes of the blobs."""
        return sum(len(b) for b in self.blobs.values())

    def digest(self, name: str) -> str:
        """:func:`digest` of the blob ``name`` (computed once): what a session made
        from it is shared by (:class:`~onnxgrad_sklearn.runtime.SessionPool`)."""
        found = self._digests.get(name)
        if found is None:
            found = self._digests[name] = digest(self.blobs[name])
        return found


# keys ---------------------------------------------------------------------------
@functools.cache
def code_digest() -> str:
    """Digest of this package's own source files (an editable install changes them)."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def _versions() -> tuple:
    found = []
    for name in PRODUCERS:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    from ._version import __version__

    found.append(("onnxgrad-sklearn", __version__))
    found.append(("python", f"{sys.version_info[0]}.{sys.version_info[1]}"))
    return tuple(found)


def make_key(kind: str, parts) -> str:
    """The key of an artifact of ``kind`` made from ``parts``.

    Parameters
    ----------
    kind : str
        What the artifact is (``"converted"``, ``"step"``): the key's prefix.
    parts : object
        The structure it is made from, described by :func:`canonical`.

    Returns
    -------
    str
        ``kind`` and a digest of ``parts``, :data:`FORMAT_VERSION`,
        :func:`code_digest` and the versions of the packages that produce
        artifacts (:data:`PRODUCERS`).
    """
    return _key_of(kind, canonical(parts))


def _key_of(kind: str, described) -> str:
    """:func:`make_key` of the parts :func:`canonical` described as ``described``."""
    described = (FORMAT_VERSION, kind, code_digest(), _versions(), described)
    return f"{kind}-{hashlib.sha256(repr(described).encode()).hexdigest()[:40]}"


def stable_key(kind: str, parts) -> str | None:
    """:func:`make_key` of ``parts``, or None where :func:`canonical` describes part of
    them by an object's identity (an object of a type it does not know, or nested too
    deep): such a key would hold in one process only, and could name another structure
    in another process (identities are reused)."""
    described = canonical(parts)  # described once: for the test and for the key
    if opaque(described):
        return None
    return _key_of(kind, described)


# where --------------------------------------------------------------------------
def default_cache_dir() -> Path:
    """The platform's per-user cache folder for this package.

    Returns
    -------
    pathlib.Path
        ``$XDG_CACHE_HOME/onnxgrad_sklearn`` (``~/.cache/onnxgrad_sklearn``) on
        Linux, ``~/Library/Caches/onnxgrad_sklearn`` on macOS,
        ``%LOCALAPPDATA%\\onnxgrad_sklearn\\Cache`` on Windows.
    """
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "onnxgrad_sklearn" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "onnxgrad_sklearn"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnxgrad_sklearn"


def cache_dir() -> Path | None:
    """The folder of the disk cache, or None where it is off.

    Returns
    -------
    pathlib.Path or None
        ``ONNXGRAD_SKLEARN_CACHE_DIR`` when it is set (empty: off), else
        ``set_config(cache_dir=...)`` (``"default"``: :func:`default_cache_dir`,
        ``""``: off, another value: that folder).
    """
    from ._config import get_config

    env = os.environ.get(CACHE_ENV)
    value = get_config()["cache_dir"] if env is None else env
    if value == "":
        return None
    if value == "default":
        return default_cache_dir()
    return Path(value).expanduser()


# the store ----------------------------------------------------------------------
_memory: OrderedDict = OrderedDict()
_lock = threading.Lock()
#: Folders found not writable in this process (warned once each).
_unwritable: set = set()


def get(key: str | None, memory: bool = True) -> Artifact | None:
    """The artifact of ``key``: from memory, else from the disk cache; None if absent.

    ``memory=False``: the disk cache only (for a caller that keeps its own
    in-process cache of the parsed graphs). ``key=None`` (:func:`stable_key`): None.
    """
    if key is None:
        return None
    if memory:
        with _lock:
            found = _memory.get(key)
            if found is not None:
                _memory.move_to_end(key)
                return found
    folder = cache_dir()
    if folder is None or str(folder) in _unwritable:
        return None
    found = _read(folder / (key + SUFFIX), key)
    if found is not None and memory:
        _remember(key, found)
    return found


def put(key: str | None, artifact: Artifact, memory: bool = True) -> None:
    """Keep ``artifact`` for the process (unless ``memory=False``) and write it to the
    disk cache (if on); nothing for ``key=None``."""
    if key is None:
        return
    if memory:
        _remember(key, artifact)
    folder = cache_dir()
    if folder is None or str(folder) in _unwritable:
        return
    try:
        _write(folder, key, artifact)
    except OSError as exc:
        _unwritable.add(str(folder))
        warnings.warn(
            f"The training artifact cache folder {str(folder)!r} cannot be written ({exc}): "
            "the disk cache is off for this process (fits build their graphs again in "
            f"each new process). Set {CACHE_ENV} to a writable folder, or to an empty "
            "value to turn the disk cache off without this warning.",
            UserWarning,
            stacklevel=3,
        )
        return
    _evict(folder)


def _remember(key, artifact):
    with _lock:
        _memory[key] = artifact
        _memory.move_to_end(key)
        while len(_memory) > MEMORY_ENTRIES:
            _memory.popitem(last=False)


def _write(folder: Path, key: str, artifact: Artifact) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    parts = [
        {"name": name, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        for name, blob in artifact.blobs.items()
    ]
    header = json.dumps(
        {"format": FORMAT_VERSION, "key": key, "parts": parts, "meta": artifact.meta},
        sort_keys=True,
    ).encode()
    tmp = folder / f".{key}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(header + b"\n")
            for blob in artifact.blobs.values():
                f.write(blob)
        os.replace(tmp, folder / (key + SUFFIX))  # atomic: readers see all of it or none
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read(path: Path, key: str) -> Artifact | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.warning("training artifact %s cannot be read (%s): it is built again", path, exc)
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not an artifact file")
        end = data.index(b"\n", len(MAGIC))
        header = json.loads(data[len(MAGIC) : end])
        if header.get("format") != FORMAT_VERSION or header.get("key") != key:
            raise ValueError("another format or key")
        blobs, offset = {}, end + 1
        for part in header["parts"]:
            blob = data[offset : offset + part["size"]]
            if len(blob) != part["size"] or hashlib.sha256(blob).hexdigest() != part["sha256"]:
                raise ValueError(f"part {part['name']!r} is truncated or altered")
            blobs[part["name"]] = blob
            offset += part["size"]
        if offset != len(data):
            raise ValueError("trailing bytes")
        artifact = Artifact(blobs, header.get("meta", {}))
    except (ValueError, KeyError, TypeError) as exc:
        logger.warning("training artifact %s is corrupt (%s): removed, and built again", path, exc)
        path.unlink(missing_ok=True)
        return None
    try:
        os.utime(path)  # least recently used: the oldest modification time goes first
    except OSError:
        pass
    return artifact


def _evict(folder: Path) -> None:
    """Remove the least recently used entries beyond ``cache_max_bytes``, and stale temporaries."""
    from ._config import get_config

    limit = get_config()["cache_max_bytes"]
    entries = []
    for path in folder.iterdir():
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.name.endswith(".tmp"):
            if path.name.startswith(".") and _older_than(stat, 3600):
                path.unlink(missing_ok=True)  # left by a killed process
            continue
        if path.name.endswith(SUFFIX):
            entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
        logger.debug("training artifact %s evicted (cache above %d bytes)", path, limit)


def _older_than(stat, seconds: float) -> bool:
    import time

    return time.time() - stat.st_mtime > seconds


def clear_memory() -> None:
    """Forget the artifacts kept in memory (the disk cache stays)."""
    with _lock:
        _memory.clear()
