"""The training buffers of the backends: weights and optimizer state bound to sessions.

* :class:`BoundRun`: calls of one session through the runtime's IO binding, its
  outputs written into given ``OrtValue`` objects (a name of
  :mod:`onnxgrad_sklearn.ortgrad`; the backends run their updates in their steps'
  graphs now);
* :class:`DoubleBuffers`: the weights and optimizer state in sets of flat vectors
  an update alternates between, with zero-copy per-tensor views (CPU);
* :class:`DeviceBuffers`: the same in runtime memory on any device, each weight
  bound by address (:func:`bind_address`; the standard backend on CUDA).

Only the backends (:mod:`onnxgrad_sklearn.backends.agent`,
:mod:`onnxgrad_sklearn.backends.standard`) use the buffers, and :func:`pieces` for the
update by pieces of a large model; the runtime helpers they
build on (``OrtValue`` views, devices) are :mod:`onnxgrad_sklearn.runtime`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ..runtime import bindings, import_onnxruntime, ort_device, ortvalue_view, parse_device

if TYPE_CHECKING:
    import onnxruntime
    from onnxruntime.capi._pybind_state import OrtValue

__all__ = [
    "ALIGNMENT",
    "BoundRun",
    "DeviceBuffers",
    "DoubleBuffers",
    "PIECES_DISABLED_OPTIMIZERS",
    "UPDATE_PIECE",
    "bind_address",
    "pieces",
]


#: Elements of a piece of an update by pieces (1 MB in float32): both backends update a
#: model of a million weights or more by pieces of this size, in their step's graph.
UPDATE_PIECE = 1 << 18
#: onnxruntime graph optimizers turned off for a graph updating by pieces:
#: GatherSliceToSplitFusion makes the slices of a gradient one ``Split`` (every piece
#: at once) and names every such ``Split`` alike, which makes the model invalid from the
#: second gradient cut into pieces on.
PIECES_DISABLED_OPTIMIZERS = ["GatherSliceToSplitFusion"]


def pieces(shapes: Sequence[Sequence[int]], chunk: int) -> list[tuple[int, int, int]]:
    """Cut the weights of ``shapes`` into pieces of at most ``chunk`` elements.

    Returns ``(weight, offset in the weight, length)`` of each piece, weight by
    weight: what an update by pieces runs over, its temporaries a piece's size
    instead of the model's.
    """
    out = []
    for i, shape in enumerate(shapes):
        size = math.prod(shape)
        out.extend((i, s, min(chunk, size - s)) for s in range(0, size, chunk))
    return out


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
        Inputs bound for every call (on the CPU an input changed with
        ``OrtValue.update_inplace`` is read anew at each call; a CPU input of a
        CUDA session is copied to the device when bound, so it is not).
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


class _BufferSets:
    """What :class:`DoubleBuffers` and :class:`DeviceBuffers` share: binding a vector."""

    def binder(self, binding, name: str, parity, k: int, i: int | None = None, output=False):
        raise NotImplementedError

    def bind(self, binding, name: str, parity, k: int, i: int | None = None, output=False):
        """Bind vector ``k`` of a set (``i=None``), or weight ``i``'s part of it, to ``name``.

        ``parity=None``: the current set. :class:`DoubleBuffers` binds its
        ``OrtValue`` views, :class:`DeviceBuffers` binds by address
        (:func:`bind_address`).
        """
        bind, args = self.binder(binding, name, parity, k, i, output)
        bind(*args)


class DoubleBuffers(_BufferSets):
    """Weights and optimizer state in two sets of vectors an update alternates between.

    Each set holds the weights end to end in one vector (float32, or the
    ``dtype`` given), and each state
    (velocity, moments) in another. An update reads the current set and writes
    the other through IO binding: nothing is allocated per batch, and the values
    before the last update stay intact until the next one (a free undo). Every
    vector also has zero-copy per-tensor views, as numpy arrays and as
    ``OrtValue`` objects. CPU only: the views are views of numpy memory
    (:class:`DeviceBuffers` is the same on any device).

    Parameters
    ----------
    shapes : list of tuple of int
        Shapes of the weights.
    n_state : int
        Number of state tensors per weight.
    n_sets : int, default=2
        Number of sets: an update reads one and writes another.
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
        #: Where each weight starts in a vector.
        self.offsets = [int(o) for o in offsets[:-1]]
        self._piece_views: dict = {}  # spans -> [parity][k][j] views (named)
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
        #: No padding between the weights (the layout :class:`DeviceBuffers` describes so).
        self.pads = [0] * len(sizes)

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

    def read(self, k: int, parity: int | None = None) -> list[np.ndarray]:
        """Copies of each weight's part of vector ``k`` of a set (the current one by default)."""
        return [v.copy() for v in self.views[self.current if parity is None else parity][k]]

    def named(self, parity: int, names, prefix: str, spans=None) -> dict[str, OrtValue]:
        """The vectors of set ``parity`` by the names an update graph gives them.

        Vector ``k`` is ``prefix + names[k]``; with ``spans`` (the pieces :func:`pieces`
        cuts the weights into), its piece ``j`` is ``prefix + names[k] + "_<j>"``, an
        ``OrtValue`` view of that part of the vector (made once per ``spans``).
        """
        if spans is None:
            return {prefix + n: v for n, v in zip(names, self.vectors[parity])}
        spans = tuple(tuple(span) for span in spans)
        views = self._piece_views.get(spans)
        if views is None:
            starts = [(self.offsets[i] + s, n) for i, s, n in spans]
            views = self._piece_views[spans] = [
                [[ortvalue_view(v[o : o + n]) for o, n in starts] for v in p] for p in self.arrays
            ]
        return {
            f"{prefix}{n}_{j}": v for n, vs in zip(names, views[parity]) for j, v in enumerate(vs)
        }

    def binder(self, binding, name: str, parity, k: int, i: int | None = None, output=False):
        """``(function, arguments)`` of what :meth:`bind` calls, to call again cheaply."""
        p = self.current if parity is None else parity
        value = self.vectors[p][k] if i is None else self.tensors[p][k][i]
        bind = binding.bind_ortvalue_output if output else binding.bind_ortvalue_input
        return bind, (name, value)


#: Byte alignment of each weight's part of a :class:`DeviceBuffers` vector: that of
#: ``cudaMalloc``, which the CUDA kernels may assume of the tensors they are given.
ALIGNMENT = 256


def bind_address(binding, name: str, device, dtype, shape, address: int, output=False) -> None:
    """Bind the tensor at ``address`` (runtime memory on ``device``) to input or output ``name``.

    ``SessionIOBinding.bind_input(name, OrtDevice, element_type, shape, pointer)``
    and ``bind_output`` with the same arguments (onnxruntime 1.19 to 1.32 at
    least): the runtime reads or writes that memory, nothing is copied when the
    session runs its consumers on ``device``. The caller keeps the memory alive.

    Parameters
    ----------
    binding : SessionIOBinding
        The runtime's binding (``onnxruntime.capi._pybind_state.SessionIOBinding``).
    name : str
        Input or output of the session.
    device : OrtDevice
        Where the memory is (:func:`ort_device`).
    dtype : numpy dtype
        Element type.
    shape : sequence of int
        Shape of the tensor.
    address : int
        Address of its first element (``OrtValue.data_ptr()`` plus an offset in bytes).
    output : bool, default=False
        Bind an output instead of an input.
    """
    bind = binding.bind_output if output else binding.bind_input
    bind(*_address_args(name, device, dtype, shape, address))


def _address_args(name, device, dtype, shape, address) -> tuple:
    return name, device, np.dtype(dtype).type, [int(d) for d in shape], int(address)


class DeviceBuffers(_BufferSets):
    """:class:`DoubleBuffers` in runtime memory on any device, bound by address.

    Each vector of each set is one ``OrtValue`` the runtime allocated on the
    device (``OrtValue.ortvalue_from_shape_and_type``); a weight's part of it is
    bound to a session by address (:func:`bind_address`: the vector's
    ``data_ptr()`` plus the weight's offset), so the weights, the gradients the
    fused step computes and the optimizer state stay on the device from batch
    to batch, and an element-wise rule still updates one flat vector. The host
    sees the values only through copies (:meth:`read`, :meth:`copy`); writes copy
    the whole vector to the host, change it and copy it back (rare: set_weights,
    a restore, a new optimizer state).

    The same code runs on the CPU (``device="cpu"``: runtime-allocated CPU
    memory), which is how the CUDA path is tested without a GPU.

    Each weight's part starts at a multiple of :data:`ALIGNMENT` bytes: the
    vectors hold ``pads[i]`` unused elements (zeros) after weight ``i``, which a
    flat update graph must cover (:func:`onnxgrad_sklearn.backends.standard.step_graph`).

    Parameters
    ----------
    shapes : list of tuple of int
        Shapes of the weights.
    n_state : int
        Number of state tensors per weight.
    n_sets : int, default=2
        Number of sets.
    dtype : numpy dtype, default=numpy.float32
        Type of the vectors.
    device : str, default="cpu"
        ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
    alignment : int, default=ALIGNMENT
        Alignment of each weight's part in bytes (0: none).

    Attributes
    ----------
    vectors : list of list of OrtValue
        ``vectors[parity][k]``: vector ``k`` (0 the weights, then each state) of a set.
    offsets, pads : list of int
        Where each weight starts in a vector, and the unused elements after it.
    size : int
        Elements of each vector, padding included.
    ort_device : OrtDevice
        The runtime's device of the vectors.
    current : int
        The parity of the set that holds the current values.
    """

    def __init__(
        self,
        shapes: Sequence[Sequence[int]],
        n_state: int,
        n_sets: int = 2,
        dtype=np.float32,
        device: str = "cpu",
        alignment: int = ALIGNMENT,
    ):
        self.dtype = np.dtype(dtype)
        self.shapes = [tuple(int(d) for d in shape) for shape in shapes]
        self.sizes = [math.prod(shape) for shape in self.shapes]
        step = max(int(alignment) // self.dtype.itemsize, 1)
        self.offsets, self.pads, offset = [], [], 0
        for n in self.sizes:
            self.offsets.append(offset)
            padded = -(-n // step) * step
            self.pads.append(padded - n)
            offset += padded
        self.size = offset
        self.device = device
        kind, index = parse_device(device)
        self.ort_device = ort_device(
            "CUDAExecutionProvider" if kind == "cuda" else "CPUExecutionProvider", index
        )
        new = bindings().OrtValue.ortvalue_from_shape_and_type
        zeros = np.zeros(self.size, dtype=self.dtype)
        try:
            self.vectors = [
                [new([self.size], self.dtype.type, self.ort_device) for _ in range(1 + n_state)]
                for _ in range(n_sets)
            ]
            for vectors in self.vectors:
                for vector in vectors:
                    vector.update_inplace(zeros)  # the padding too: no garbage, ever
        except RuntimeError as exc:
            raise RuntimeError(
                f"onnxruntime could not allocate the training buffers ({n_sets} x "
                f"{1 + n_state} vectors of {self.size} {self.dtype}) on device={device!r}: "
                f"{exc}. Check that the GPU is visible (nvidia-smi) and the device index, or "
                "use device='cpu'."
            ) from exc
        self.n_state = n_state
        self.current = 0

    def _parity(self, parity) -> int:
        return self.current if parity is None else parity

    def address(self, parity, k: int, i: int | None = None) -> int:
        """Address of vector ``k`` of a set, or of weight ``i``'s part of it."""
        base = self.vectors[self._parity(parity)][k].data_ptr()
        return base if i is None else base + self.offsets[i] * self.dtype.itemsize

    def binder(self, binding, name: str, parity, k: int, i: int | None = None, output=False):
        """``(function, arguments)`` of what :meth:`bind` calls, to call again cheaply.

        The addresses do not change: the vectors are allocated once.
        """
        shape = [self.size] if i is None else self.shapes[i]
        address = self.address(parity, k, i)
        bind = binding.bind_output if output else binding.bind_input
        return bind, _address_args(name, self.ort_device, self.dtype, shape, address)

    def host(self, k: int, parity: int | None = None) -> np.ndarray:
        """A host copy of vector ``k`` of a set (the current one by default), padding included."""
        # numpy() copies device memory to the host; on the CPU it is a view: copy it.
        return np.array(self.vectors[self._parity(parity)][k].numpy(), copy=True)

    def read(self, k: int, parity: int | None = None) -> list[np.ndarray]:
        """Copies of each weight's part of vector ``k`` of a set (the current one by default)."""
        vector = self.host(k, parity)
        return [
            vector[o : o + n].reshape(shape)
            for o, n, shape in zip(self.offsets, self.sizes, self.shapes)
        ]

    def write(self, k: int, arrays, start: int = 0) -> None:
        """Copy ``arrays`` (weights ``start``, ``start + 1``...) into vector ``k`` of this set."""
        vector = self.host(k)
        for o, n, array in zip(self.offsets[start:], self.sizes[start:], arrays):
            vector[o : o + n] = np.asarray(array, dtype=self.dtype).reshape(-1)
        self.vectors[self.current][k].update_inplace(vector)

    def copy(self) -> list[np.ndarray]:
        """Host copies of the current set's vectors (for :meth:`load`)."""
        return [self.host(k) for k in range(1 + self.n_state)]

    def load(self, saved: Sequence[np.ndarray]) -> None:
        """Copy vectors returned by :meth:`copy` into the current set."""
        for target, value in zip(self.vectors[self.current], saved):
            target.update_inplace(np.ascontiguousarray(value, dtype=self.dtype))
