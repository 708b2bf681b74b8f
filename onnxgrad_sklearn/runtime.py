"""Runtime helpers the package uses: threads, devices, sessions, ``OrtValue`` helpers.

Everything here exists in every onnxruntime build, the plain inference package
(``onnxruntime``, ``onnxruntime-gpu``) as well as the training build
(``onnxruntime-training-cpu``): ``OrtValue``, ``OrtDevice`` and the session's IO
binding. The training bindings (``TrainingAgent``, ``OrtModuleGraphBuilder``)
are only touched by :mod:`onnxgrad_sklearn.backends.agent`. Devices: the
providers and provider options of every session (:func:`session_providers`),
``OrtValue`` views and runs on them (:func:`ortvalue_view`,
:func:`run_with_ortvalues`). The backends' training buffers, bound to their
sessions (by address in device memory on CUDA), are in
:mod:`onnxgrad_sklearn.backends.buffers`. Sessions made from a training
artifact's graphs are shared by the fits of a process (:data:`SESSIONS`, a
:class:`SessionPool`).

onnxruntime is imported on first use (:func:`bindings`), not with this module, so
that ``import onnxgrad_sklearn`` stays light. That first use also checks that
only one onnxruntime distribution is installed and that its bindings are
complete; on the training build it leaves out the build check that imports
``onnxruntime.training`` and torch. That import and its checks are
:mod:`onnxgrad_sklearn._ort_import`'s; their names are re-exported here
(:func:`bindings`, :func:`import_onnxruntime`, :func:`import_onnxruntime_light`,
:func:`check_single_runtime`, :data:`ONNXRUNTIME_DISTRIBUTIONS`).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ._ort_import import (
    ONNXRUNTIME_DISTRIBUTIONS,
    bindings,
    check_single_runtime,
    import_onnxruntime,
    import_onnxruntime_light,
)

__all__ = [
    "input_array",
    "ONNXRUNTIME_DISTRIBUTIONS",
    "SESSION_OPTIONS_HOOKS",
    "SESSIONS",
    "OrtValue",
    "SessionPool",
    "bindings",
    "check_single_runtime",
    "device_to_providers",
    "import_onnxruntime",
    "import_onnxruntime_light",
    "inner_thread_limit",
    "intra_op_threads",
    "make_session",
    "options_key",
    "ort_device",
    "ortvalue_view",
    "parse_device",
    "release_model_bytes",
    "run_with_ortvalues",
    "session_options",
    "session_providers",
    "to_ortvalue",
]

logger = logging.getLogger("onnxgrad_sklearn")

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


#: The session option that lets the intra-op threads wait for work by spinning.
SPINNING = "session.intra_op.allow_spinning"


def session_options(threads: int = 0, spinning: bool = True) -> onnxruntime.SessionOptions:
    """Session options of the package's sessions (``threads=0``: the runtime's default).

    ``spinning=False``: the session's threads sleep when they wait for work instead of
    spinning. The training step's sessions spin (their runs follow each other); the
    others (inference, a validation set's predictions, the loss alone) do not: their
    threads, spinning after a run (or after the session was made), took the cores from
    what came next, the training or another session (a fit of LogisticRegression on
    iris 17-20 -> 10 ms, a 10-row predict 190 -> 105 us on 2 cores; docs/performance.md,
    "Threads"). The callables of :data:`SESSION_OPTIONS_HOOKS` are applied last.
    """
    so = import_onnxruntime().SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if not spinning or (threads != 1 and _in_joblib_worker_process()):
        # beside its sibling workers on the same cores, the runtime's threads sleep
        # between kernels instead of spinning (docs/performance.md, "Threads")
        so.add_session_config_entry(SPINNING, "0")
    for hook in SESSION_OPTIONS_HOOKS:
        hook(so, threads)
    return so


def spins(options) -> bool:
    """Whether the threads of a session made with ``options`` spin while they wait."""
    try:
        return options.get_session_config_entry(SPINNING) != "0"
    except Exception:  # not set: the runtime's default, spinning
        return True


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


def _in_joblib_worker_process() -> bool:
    """Whether this process is one of joblib's process workers (loky's ``LokyProcess``:
    ``GridSearchCV(n_jobs=...)``, ``cross_validate``), which run beside each other."""
    import multiprocessing

    return type(multiprocessing.current_process()).__name__ == "LokyProcess"


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


def parse_device(device: str) -> tuple[str, int]:
    """Return the kind (``"cpu"`` or ``"cuda"``) and the index of a device name.

    Only the name is checked, not what the installed runtime has
    (:func:`device_to_providers` checks that).

    Parameters
    ----------
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (case and surrounding spaces ignored).

    Returns
    -------
    kind : str
        ``"cpu"`` or ``"cuda"``.
    index : int
        Index of the device (0 for the CPU and for ``"cuda"``).

    Raises
    ------
    ValueError
        If the name is not one of the forms above.
    """
    if not isinstance(device, str):
        raise ValueError(f"device must be a string such as 'cpu' or 'cuda:0', got {device!r}.")
    name = device.strip().lower()
    if name == "cpu":
        return "cpu", 0
    if name == "cuda" or name.startswith("cuda:"):
        index_text = name[5:] if name.startswith("cuda:") else "0"
        if not index_text.isdigit():
            raise ValueError(f"device={device!r} is not valid: use 'cuda' or 'cuda:N'.")
        return "cuda", int(index_text)
    raise ValueError(f"device={device!r} is not valid: use 'cpu', 'cuda' or 'cuda:N'.")


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
    kind, index = parse_device(device)
    if kind == "cpu":
        return ["CPUExecutionProvider"], 0
    available = import_onnxruntime().get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise ValueError(
            f"device={device!r} needs a CUDA build of onnxruntime, but the installed "
            f"runtime only has {available}. The standard backend runs on CUDA with "
            "onnxruntime-gpu in place of the CPU build: 'pip uninstall -y onnxruntime "
            "onnxruntime-training-cpu && pip install onnxruntime-gpu' (CUDA 13 from "
            "onnxruntime-gpu 1.27 on, 'onnxruntime-gpu<1.27' for CUDA 12; this removes the "
            "TrainingAgent). The TrainingAgent on CUDA needs 'onnxruntime-training==1.19.2' "
            "(CUDA 11.8, Python <= 3.11) in place of onnxruntime-training-cpu. Or use "
            "device='cpu'."
        )
    return ["CUDAExecutionProvider", "CPUExecutionProvider"], index


def session_providers(
    device: str, allow_tf32: bool | None = None
) -> tuple[list[str], list[dict[str, str]]]:
    """Return the ``providers`` and ``provider_options`` of a session on a device.

    What the package passes to ``onnxruntime.InferenceSession`` for every session
    it makes on ``device``. The CUDA provider gets the device index
    (``device_id``) and ``use_tf32``: ``"0"`` unless TF32 is allowed
    (onnxruntime's own default is ``"1"``; option of the CUDA provider since
    onnxruntime 1.18). Only the name is checked, not the installed runtime
    (see :func:`device_to_providers`).

    Parameters
    ----------
    device : str
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    allow_tf32 : bool, optional
        Whether float32 matrix products may run in TF32. By default the
        package's setting (``get_config()["allow_tf32"]``, see
        :func:`onnxgrad_sklearn.set_config`), read now.

    Returns
    -------
    providers : list of str
        Execution providers, in order of precedence.
    provider_options : list of dict
        One dict of options (strings) per provider.
    """
    kind, index = parse_device(device)
    if kind == "cpu":
        return ["CPUExecutionProvider"], [{}]
    if allow_tf32 is None:
        from ._config import get_config

        allow_tf32 = get_config()["allow_tf32"]
    cuda = {"device_id": str(index), "use_tf32": "1" if allow_tf32 else "0"}
    return ["CUDAExecutionProvider", "CPUExecutionProvider"], [cuda, {}]


def make_session(
    model, sess_options, providers: Sequence[str], provider_options=None, strict=True, **kwargs
) -> onnxruntime.InferenceSession:
    """Create an ``InferenceSession``; refuse one where the first provider did not start.

    onnxruntime falls back to the CPU, printing "EP Error", when its CUDA
    provider fails to start (no GPU visible, CUDA or cuDNN libraries missing):
    a session meant for CUDA buffers would then fail later, in C++. A predict
    session (``strict=False``) runs on the CPU then.

    Parameters
    ----------
    model : onnx.ModelProto or bytes
        The graph.
    sess_options : onnxruntime.SessionOptions
        Its options (:func:`session_options`).
    providers, provider_options : list
        As :func:`session_providers` returns them.
    strict : bool, default=True
        Whether to refuse a session without its first provider.
    **kwargs
        Passed on (``disabled_optimizers``).

    Raises
    ------
    RuntimeError
        When the session runs without the first provider asked for.
    """
    ort = import_onnxruntime()
    data = model if isinstance(model, bytes) else model.SerializeToString()
    session = ort.InferenceSession(
        data,
        sess_options=sess_options,
        providers=list(providers),
        provider_options=provider_options,
        **kwargs,
    )
    release_model_bytes(session)
    if strict and providers[0] not in session.get_providers():
        raise RuntimeError(
            f"onnxruntime {ort.__version__} did not start its {providers[0]} (it runs this "
            f"session on {session.get_providers()}; its 'EP Error' above says why): check "
            "that a GPU is visible (nvidia-smi) and that the CUDA and cuDNN libraries this "
            "onnxruntime build needs are installed, or use device='cpu'."
        )
    return session


def options_key(options, providers: Sequence[str], provider_options=None, **kwargs) -> tuple:
    """What makes two sessions of one graph alike: their options, providers and extras.

    The readable settings of ``options`` (threads, memory pattern and arena,
    optimization level, execution mode, spinning) and the :data:`SESSION_OPTIONS_HOOKS` that
    changed them (by identity), the providers, their options and ``kwargs``
    (``disabled_optimizers``), as a hashable tuple.
    """
    settings = tuple(
        str(getattr(options, name, None))
        for name in (
            "intra_op_num_threads",
            "inter_op_num_threads",
            "enable_mem_pattern",
            "enable_cpu_mem_arena",
            "graph_optimization_level",
            "execution_mode",
        )
    ) + (spins(options),)
    extras = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
    given = tuple(tuple(sorted(o.items())) for o in provider_options or ())
    return settings, tuple(map(id, SESSION_OPTIONS_HOOKS)), tuple(providers), given, extras


class SessionPool:
    """Sessions made from training artifacts' graphs, kept for the fits of a process.

    A fit of a structure met before (a GridSearchCV candidate, a refit) takes the
    sessions of its graphs from here instead of making them: a session holds no
    state of a fit (the weights, optimizer state and batches are bound by each fit,
    the learning rate and penalty are inputs), so one serves any number of fits.
    Sessions are found by the digest of their graph's bytes and :func:`options_key`:
    two graphs are never confused, whatever made them.

    * :meth:`shared`: a session several fits run at once (``InferenceSession.run``
      is thread-safe), at most ``size`` kept and sessions of at most ``weights``
      weights in all (a session's memory grows with its model's), the least recently
      used dropped first.
    * :meth:`checkout` / :meth:`give_back`: an object one fit uses at a time (a
      TrainingAgent, which is not thread-safe): a fit takes one out, a fit running
      at the same time gets another, and it comes back at the end of the fit; at
      most ``idle`` wait per key.

    Parameters
    ----------
    size : int, default=32
        Shared sessions kept.
    idle : int, default=2
        Checked-in objects kept per key (and ``size`` in all).
    weights : int, default=4_000_000
        The weights of the models of the sessions kept, in all (as given by each
        call, ``weights=``).
    """

    def __init__(self, size: int = 32, idle: int = 2, weights: int = 4_000_000):
        self.size, self.idle, self.weights = size, idle, weights
        self._shared: OrderedDict = OrderedDict()  # key -> (session, weights)
        self._waiting: OrderedDict = OrderedDict()  # key -> list of checked-in objects
        self._lock = threading.Lock()

    def shared(self, key, make, weights: int = 0):
        """The session of ``key``, made by ``make()`` if none is kept (``key=None``: made).

        ``weights``: the weights of its model (what bounds the pool's memory).
        """
        if key is None:
            return make()
        with self._lock:
            found = self._shared.get(key)
            if found is not None:
                self._shared.move_to_end(key)
                return found[0]
        made = make()  # outside the lock: another fit may make another one meanwhile
        with self._lock:
            found = self._shared.setdefault(key, (made, int(weights)))
            self._shared.move_to_end(key)
            self._evict(self._shared, lambda entry: entry[1])
        return found[0]

    def checkout(self, key, make):
        """An object of ``key`` no other fit uses: a waiting one, or ``make()``."""
        if key is not None:
            with self._lock:
                waiting = self._waiting.get(key)
                if waiting:
                    self._waiting.move_to_end(key)
                    return waiting.pop()[0]
        return make()

    def give_back(self, key, obj, weights: int = 0) -> None:
        """Put back an object :meth:`checkout` gave (dropped beyond ``idle`` per key);
        ``weights``: those of its model."""
        if key is None:
            return
        with self._lock:
            waiting = self._waiting.setdefault(key, [])
            self._waiting.move_to_end(key)
            if len(waiting) < self.idle:
                waiting.append((obj, int(weights)))
            self._evict(self._waiting, lambda entries: sum(w for _, w in entries), len)

    def _evict(self, entries: OrderedDict, weights, count=lambda entry: 1) -> None:
        """Drop the least recently used of ``entries`` beyond the bounds (lock held)."""
        while len(entries) > 1 and (
            sum(map(count, entries.values())) > self.size
            or sum(map(weights, entries.values())) > self.weights
        ):
            entries.popitem(last=False)

    def clear(self) -> None:
        """Drop every session and waiting object."""
        with self._lock:
            self._shared.clear()
            self._waiting.clear()


#: The process's sessions of training artifacts (:class:`SessionPool`).
SESSIONS = SessionPool()


#: Models of this many weights or more are "large": the standard backend guards
#: their update and frees their step sessions at the end of a fit, and their first
#: fit tunes the C allocator (:func:`map_large_blocks`).
LARGE_MODEL = 1_000_000

#: glibc's ``mallopt`` parameter number of ``M_MMAP_THRESHOLD`` (malloc.h).
_M_MMAP_THRESHOLD = -3
_MALLOC_LOCK = threading.Lock()
_malloc_threshold: int | None = None  # what map_large_blocks set, once per process


def map_large_blocks(threshold: int) -> bool:
    """Have glibc map blocks of ``threshold`` bytes or more on their own (once per process).

    glibc raises its mmap threshold each time a mapped block is freed, up to
    32 MiB: after the first weight-sized array goes, blocks of that size come
    from the heap. The runtime's session memory (arena regions, the weights'
    copies, the temporaries of a step) then stays resident after its sessions
    go, and the next sessions do not fit in it: a warm-started or refitted model
    of 4.4 million weights peaked 100 MB higher. A fixed threshold
    (``mallopt(M_MMAP_THRESHOLD)``) maps and unmaps those blocks on their own.
    It is process-wide and stays (glibc has no way back to the moving
    threshold); the first fit of a model of :data:`LARGE_MODEL` weights or more
    sets it, unless ``set_config(malloc_mmap_threshold=0)``, the environment sets
    ``MALLOC_MMAP_THRESHOLD_`` itself, or the C library is not glibc.

    Parameters
    ----------
    threshold : int
        Size in bytes from which a block is mapped on its own; 0 does nothing.

    Returns
    -------
    bool
        Whether this call set it.
    """
    global _malloc_threshold
    if threshold <= 0 or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    import platform

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    with _MALLOC_LOCK:
        if _malloc_threshold is not None:
            return False
        import ctypes

        try:
            done = ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, int(threshold)) == 1
        except (AttributeError, OSError):  # no mallopt in the process's C library
            done = False
        _malloc_threshold = int(threshold) if done else 0
    if done:
        logger.info(
            "glibc maps blocks of %d bytes or more on their own from now on "
            "(set_config(malloc_mmap_threshold=0) before the first fit keeps its default)",
            threshold,
        )
    return done


def release_model_bytes(session) -> None:
    """Let ``session`` drop the serialized model it was made from.

    onnxruntime's Python ``InferenceSession`` keeps the bytes it was given for
    life, only to make the session again in ``set_providers``: one more copy of
    the weights per session otherwise. Its fallback, which calls ``set_providers``
    when a provider fails during a run, is turned off with them: such a failure
    raises the provider's own error, as a session that did not start its first
    provider does (:func:`make_session`), instead of moving to the CPU.
    """
    if isinstance(getattr(session, "_model_bytes", None), bytes):
        session.disable_fallback()
        session._model_bytes = None


def ort_device(provider: str, device_index: int):
    """The runtime's ``OrtDevice`` for an execution provider and a device index.

    Made as onnxruntime's own ``OrtDevice.make`` makes it: the CUDA device
    carries NVIDIA's vendor id where the runtime's ``OrtDevice`` has one
    (onnxruntime >= 1.2x matches devices by vendor too).
    """
    name = "cuda" if provider == "CUDAExecutionProvider" else "cpu"
    if name == "cpu":
        device_index = 0
    ort = import_onnxruntime()
    make = getattr(getattr(ort, "OrtDevice", None), "make", None)
    if make is not None:
        return make(name, device_index)._get_c_device()
    _C = bindings()  # pragma: no cover - every supported onnxruntime has OrtDevice.make
    kind = _C.OrtDevice.cuda() if name == "cuda" else _C.OrtDevice.cpu()
    return _C.OrtDevice(kind, _C.OrtDevice.default_memory(), device_index)


def input_array(X, dtype) -> np.ndarray:
    """``X`` as a model's data input: C-contiguous, floats in the float type ``dtype``;
    integers (an ONNX template's token ids, an embedding's indices) keep their type.

    Parameters
    ----------
    X : array-like
        The data.
    dtype : numpy dtype
        The float type the graph computes in.

    Returns
    -------
    numpy.ndarray
    """
    X = np.asarray(X)
    if X.dtype.kind in "iu":
        return np.ascontiguousarray(X)
    return np.ascontiguousarray(X, dtype=dtype)


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


def ortvalue_list(vector) -> list[OrtValue]:
    """The values of an ``OrtValueVector`` as a list.

    Indexed one by one: ``list(vector)`` goes through the binding's iterator,
    about 20 us for a few values, paid at every batch.
    """
    return [vector[i] for i in range(len(vector))]


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
    return ortvalue_list(session._sess.run_with_ort_values(feeds, list(output_names), None))
