"""Runtime helpers both backends use: devices, ``OrtValue`` views, IO-bound runs.

Everything here exists in every onnxruntime build, the plain inference package
(``onnxruntime``, ``onnxruntime-gpu``) as well as the training build
(``onnxruntime-training-cpu``): ``OrtValue``, ``OrtDevice`` and the session's IO
binding. The training bindings (``TrainingAgent``, ``OrtModuleGraphBuilder``)
are only touched by :mod:`onnxgrad_sklearn.backends.agent`.

onnxruntime is imported on first use (:func:`bindings`), not with this module, so
that ``import onnxgrad_sklearn`` stays light. That first use also checks that
only one onnxruntime distribution is installed (they all install the module
``onnxruntime`` and overwrite each other's files) and that its bindings are
complete.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

__all__ = [
    "ONNXRUNTIME_DISTRIBUTIONS",
    "SESSION_OPTIONS_HOOKS",
    "BoundRun",
    "DoubleBuffers",
    "OrtValue",
    "bindings",
    "check_single_runtime",
    "device_to_providers",
    "import_onnxruntime",
    "inner_thread_limit",
    "intra_op_threads",
    "ortvalue_view",
    "run_with_ortvalues",
    "session_options",
    "to_ortvalue",
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
    again at the next call.

    Raises
    ------
    ImportError
        Saying which distributions to uninstall and which to install.
    """
    check_single_runtime()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import onnxruntime  # after the check: a broken install fails clearly
    from onnxruntime.capi import _pybind_state as _C

    # The training build's import logs through the root logger, which then gets a
    # default handler: logging.basicConfig(...) called later would do nothing.
    # Whatever the import added to the root logger is taken back.
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)

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


def import_onnxruntime():
    """Return the ``onnxruntime`` module, imported on first use (checked by :func:`bindings`)."""
    bindings()
    return sys.modules["onnxruntime"]


if TYPE_CHECKING:
    import onnxruntime
    from onnxruntime.capi._pybind_state import OrtValue


def __getattr__(name):
    # ``OrtValue`` (the runtime's value type) is looked up on first use.
    if name == "OrtValue":
        return bindings().OrtValue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Callables ``hook(options, threads)`` applied, in order, to every
#: ``SessionOptions`` the package makes (training, update and inference sessions),
#: after its own settings: the documented way to change them (profiling, a
#: graph-optimization level, config entries), as ``benchmarks/`` does. Empty by
#: default; append to it and remove what you added when done.
SESSION_OPTIONS_HOOKS: list = []


def session_options(threads: int = 0) -> onnxruntime.SessionOptions:
    """Session options of the package's sessions (``threads=0``: the runtime's default).

    The callables of :data:`SESSION_OPTIONS_HOOKS` are applied last.
    """
    so = import_onnxruntime().SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    for hook in SESSION_OPTIONS_HOOKS:
        hook(so, threads)
    return so


#: Intra-op threads of a session when ``n_jobs=None`` and nothing limits the
#: threads (0: the runtime's default, one per physical core); chosen from the
#: benchmark's MLP workloads (``docs/performance.md``, "Threads").
DEFAULT_THREADS = 0


@functools.cache
def _thread_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _env_threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def inner_thread_limit() -> int | None:
    """Return the most threads a parallel region of this process should use, or None.

    What limits OpenMP limits onnxruntime's intra-op threads too (onnxruntime
    itself ignores both):

    * the number of threads of the loaded OpenMP runtimes, read live through
      threadpoolctl: it follows ``threadpool_limits(...)`` and
      ``OMP_NUM_THREADS``, which joblib's process workers (loky) receive as the
      inner thread limit (``cpu_count() // n_jobs``, or ``inner_max_num_threads``
      of ``joblib.parallel_config``);
    * ``OMP_NUM_THREADS`` itself where no OpenMP runtime is loaded;
    * one thread inside a thread of a joblib worker pool (the threading backend,
      dask): the other tasks of the pool run at the same time in this process.

    Returns
    -------
    int or None
        The limit, or None when it is not below the number of CPUs of the process.
    """
    from joblib import cpu_count

    openmp = [c.num_threads for c in _thread_controller().lib_controllers if c.user_api == "openmp"]
    limits = [min(openmp)] if openmp else []
    if not openmp and _env_threads() is not None:
        limits.append(_env_threads())
    if _in_joblib_worker_thread():
        limits.append(1)
    limit = min(limits, default=None)
    return limit if limit is not None and limit < cpu_count() else None


def _in_joblib_worker_thread() -> bool:
    # joblib runs each task under its nested backend (nesting_level >= 1); a process
    # worker runs it in its main thread, a thread pool in one of its threads.
    if threading.current_thread() is threading.main_thread():
        return False
    from joblib.parallel import get_active_backend

    return getattr(get_active_backend()[0], "nesting_level", 0) > 0


def intra_op_threads(n_jobs: int | None = None) -> int:
    """Return the intra-op threads of the sessions of an estimator with this ``n_jobs``.

    Parameters
    ----------
    n_jobs : int or None, default=None
        ``None``: :data:`DEFAULT_THREADS`, but never more than
        :func:`inner_thread_limit`. A positive number: that many threads. A
        negative one counts from the CPUs available (``-1`` all of them, ``-2``
        all but one), as joblib does; within a limit, from the limit.

    Returns
    -------
    int
        Threads for ``SessionOptions.intra_op_num_threads`` (0: the runtime's default).
    """
    if n_jobs is not None and n_jobs > 0:
        return int(n_jobs)
    limit = inner_thread_limit()
    if n_jobs is None:
        if limit is None:
            return DEFAULT_THREADS
        return limit if DEFAULT_THREADS == 0 else min(DEFAULT_THREADS, limit)
    from joblib import cpu_count

    return max((cpu_count() if limit is None else limit) + 1 + int(n_jobs), 1)


def device_to_providers(device: str) -> tuple[list[str], int]:
    """Return the execution providers and the device index for a device name.

    Parameters
    ----------
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.

    Returns
    -------
    providers : list of str
        Execution providers, in order of precedence.
    device_index : int
        Index of the device (0 for the CPU).

    Raises
    ------
    ValueError
        If the name is not one of the forms above, or if CUDA is asked for and
        the installed runtime has no CUDA provider.
    """
    if not isinstance(device, str):
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}.")
    name = device.strip().lower()
    if name == "cpu":
        return ["CPUExecutionProvider"], 0
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name[5:] if name.startswith("cuda:") else "0"
        if not index_text.isdigit():
            raise ValueError(f"device={device!r} is not valid: use 'cuda' or 'cuda:N'.")
        available = import_onnxruntime().get_available_providers()
        if "CUDAExecutionProvider" not in available:
            raise ValueError(
                f"device={device!r} needs a CUDA build of onnxruntime, but the installed "
                f"runtime only has {available}. For the standard backend install "
                "onnxruntime-gpu in place of the CPU build ('pip uninstall -y onnxruntime "
                "onnxruntime-training-cpu && pip install onnxruntime-gpu'); for the "
                "TrainingAgent, 'pip install onnxruntime-training==1.19.2' (CUDA 11.8, "
                "Python <= 3.11) in place of onnxruntime-training-cpu; or use device='cpu'."
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"], int(index_text)
    raise ValueError(f"device={device!r} is not valid: use 'cpu', 'cuda' or 'cuda:N'.")


def ort_device(provider: str, device_index: int):
    """The runtime's ``OrtDevice`` for an execution provider and a device index."""
    _C = bindings()
    if provider == "CUDAExecutionProvider":
        kind = _C.OrtDevice.cuda()
    else:
        kind = _C.OrtDevice.cpu()
        device_index = 0
    return _C.OrtDevice(kind, _C.OrtDevice.default_memory(), device_index)


def to_ortvalue(array: np.ndarray, device: str = "cpu") -> OrtValue:
    """Copy a numpy array into a new ``OrtValue`` owned by the runtime.

    ``OrtValue.ortvalue_from_numpy`` shares the array's memory on CPU without
    keeping the array alive; this function allocates runtime memory instead, so
    the result stays valid whatever happens to ``array``.

    Parameters
    ----------
    array : numpy.ndarray
        Values to copy. Non-contiguous arrays are made contiguous first.
    device : str, default="cpu"
        Device of the new value, ``"cpu"`` or ``"cuda[:N]"``.

    Returns
    -------
    OrtValue
    """
    array = np.ascontiguousarray(array)
    providers, index = device_to_providers(device)
    value = bindings().OrtValue.ortvalue_from_shape_and_type(
        list(array.shape), array.dtype.type, ort_device(providers[0], index)
    )
    value.update_inplace(array)
    return value


def ortvalue_view(array: np.ndarray, device: str = "cpu") -> OrtValue:
    """Wrap a C-contiguous numpy array as an ``OrtValue`` without copying it on CPU.

    On CPU the result points to ``array``'s memory and does not keep it alive:
    the caller must hold a reference to ``array`` for as long as the value is
    used. On CUDA the values are copied to the device.

    Parameters
    ----------
    array : numpy.ndarray
        C-contiguous array.
    device : str, default="cpu"
        ``"cpu"`` or ``"cuda[:N]"``.

    Returns
    -------
    OrtValue
    """
    if not array.flags.c_contiguous:
        raise ValueError("ortvalue_view needs a C-contiguous array.")
    return bindings().OrtValue.ortvalue_from_numpy(array, _ort_device_of(device))


@functools.lru_cache(maxsize=8)
def _ort_device_of(device: str):
    # once per device name: views are made at every batch
    providers, index = device_to_providers(device)
    return ort_device(providers[0], index)


def run_with_ortvalues(
    session: onnxruntime.InferenceSession,
    input_names: Sequence[str],
    inputs: Sequence[OrtValue],
    output_names: Sequence[str] | None = None,
) -> list[OrtValue]:
    """Run ``session`` on ``OrtValue`` inputs and return ``OrtValue`` outputs.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The session to run.
    input_names : list of str
        Names of the inputs, matched with ``inputs`` by position.
    inputs : list of OrtValue
        The values; nothing is copied.
    output_names : list of str, optional
        Outputs to fetch, all of them by default.

    Returns
    -------
    list of OrtValue
    """
    if output_names is None:
        output_names = [o.name for o in session.get_outputs()]
    feeds = dict(zip(input_names, inputs))
    return list(session._sess.run_with_ort_values(feeds, list(output_names), None))


class BoundRun:
    """Calls of one session that write their outputs into given ``OrtValue`` objects.

    The runtime's IO binding: inputs and outputs bound once are kept from call
    to call; :meth:`run` binds the inputs that change, then runs. Nothing is
    allocated for the outputs.

    Parameters
    ----------
    session : onnxruntime.InferenceSession
        The session to run.
    inputs : dict of str to OrtValue
        Inputs bound for every call (an input changed with
        ``OrtValue.update_inplace`` is read anew at each call).
    outputs : dict of str to OrtValue
        Every output of the session and the value it is written into.
    """

    def __init__(
        self,
        session: onnxruntime.InferenceSession,
        inputs: dict[str, OrtValue],
        outputs: dict[str, OrtValue],
    ):
        missing = {o.name for o in session.get_outputs()} - set(outputs)
        if missing:
            raise ValueError(f"outputs {sorted(missing)} are not bound.")
        self._session = session
        self._binding = bindings().SessionIOBinding(session._sess)
        self._run_options = import_onnxruntime().RunOptions()
        self._kept = (dict(inputs), dict(outputs))  # the binding does not own them
        for name, value in inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        for name, value in outputs.items():
            self._binding.bind_ortvalue_output(name, value)

    def run(self, inputs: dict[str, OrtValue]) -> None:
        """Bind ``inputs`` (name to value) and run the session."""
        for name, value in inputs.items():
            self._binding.bind_ortvalue_input(name, value)
        self._session._sess.run_with_iobinding(self._binding, self._run_options)


class DoubleBuffers:
    """Weights and optimizer state in two sets of vectors an update alternates between.

    Each set holds the weights end to end in one vector (float32, or the
    ``dtype`` given), and each state
    (velocity, moments) in another. An update reads the current set and writes
    the other through IO binding: nothing is allocated per batch, and the values
    before the last update stay intact until the next one (a free undo). Every
    vector also has zero-copy per-tensor views, as numpy arrays and as
    ``OrtValue`` objects. CPU only: the views are views of numpy memory.

    Parameters
    ----------
    shapes : list of tuple of int
        Shapes of the weights.
    n_state : int
        Number of state tensors per weight.
    n_sets : int, default=2
        Number of sets. The standard backend keeps three: its fused step writes
        the update even when the loss turns out non-finite, into a set that is
        neither the current one nor the one before the last update.
    dtype : numpy dtype, default=numpy.float32
        Type of the vectors (the training dtype).

    Attributes
    ----------
    arrays : list of list of numpy.ndarray
        ``arrays[parity][k]``: vector ``k`` (0 the weights, then each state) of a set.
    views : list of list of list of numpy.ndarray
        ``views[parity][k][i]``: weight ``i``'s part of that vector, in its shape.
    vectors, tensors : list
        ``OrtValue`` objects of the same, ``vectors[parity][k]`` and ``tensors[parity][k][i]``.
    current : int
        The parity of the set that holds the current values.
    """

    def __init__(
        self, shapes: Sequence[Sequence[int]], n_state: int, n_sets: int = 2, dtype=np.float32
    ):
        self.dtype = np.dtype(dtype)
        sizes = [math.prod(shape) for shape in shapes]
        offsets = np.cumsum([0, *sizes])
        self.size = int(offsets[-1])
        self.arrays = [
            [np.zeros(self.size, dtype=self.dtype) for _ in range(1 + n_state)]
            for _ in range(n_sets)
        ]
        self.views = [
            [
                [v[o : o + n].reshape(shape) for o, n, shape in zip(offsets, sizes, shapes)]
                for v in vectors
            ]
            for vectors in self.arrays
        ]
        self.tensors = [[[ortvalue_view(a) for a in views] for views in p] for p in self.views]
        self.vectors = [[ortvalue_view(v) for v in p] for p in self.arrays]
        self.n_state = n_state
        self.current = 0

    def weights(self, parity: int | None = None) -> list[OrtValue]:
        """Per-tensor weight values of a set (the current one by default)."""
        return self.tensors[self.current if parity is None else parity][0]

    def state(self, parity: int | None = None) -> list[list[OrtValue]]:
        """``state[i][k]``: state ``k`` of weight ``i`` in a set (the current one by default)."""
        p = self.tensors[self.current if parity is None else parity]
        return [[p[1 + k][i] for k in range(self.n_state)] for i in range(len(p[0]))]

    def write(self, k: int, arrays, start: int = 0) -> None:
        """Copy ``arrays`` (weights ``start``, ``start + 1``...) into vector ``k`` of this set."""
        for view, array in zip(self.views[self.current][k][start:], arrays):
            np.copyto(view, np.asarray(array, dtype=self.dtype).reshape(view.shape))

    def copy(self) -> list[np.ndarray]:
        """Copies of the current set's vectors."""
        return [v.copy() for v in self.arrays[self.current]]

    def load(self, saved: Sequence[np.ndarray]) -> None:
        """Copy vectors returned by :meth:`copy` into the current set."""
        for target, value in zip(self.arrays[self.current], saved):
            np.copyto(target, value)
