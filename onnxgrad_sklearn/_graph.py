"""A small helper to write ONNX graphs node by node.

Losses, penalties and optimizers are written with :class:`GraphBuilder`: each
call adds one node and returns the name of its output, so an update rule reads
like the formula it implements::

    g = GraphBuilder()
    v = g.sub(g.mul(momentum, velocity), g.mul(lr, grad))
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ._passes import MAX_IR_VERSION, MAX_OPSET

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Collect nodes and constants of an ONNX graph under a name prefix.

    Parameters
    ----------
    prefix : str, default="g"
        Prefix of every name the builder creates, so that several builders can
        write into one graph without clashes.
    dtype : numpy dtype, default=numpy.float32
        The float type of the graph (the training dtype, ``float32`` or
        ``float64``): :meth:`const` makes its float constants in it, and
        :attr:`elem_type` gives it as an ONNX element type (for ``Cast(to=...)``).

    Attributes
    ----------
    dtype : numpy.dtype
        The float type of the graph.
    elem_type : int
        The same as an ONNX ``TensorProto`` element type (``FLOAT`` or ``DOUBLE``).
    """

    def __init__(self, prefix: str = "g", dtype=np.float32):
        self.prefix = prefix
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"GraphBuilder dtype must be float32 or float64, got {self.dtype}.")
        self.elem_type = helper.np_dtype_to_tensor_dtype(self.dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0
        self._constants: dict[tuple, str] = {}

    def unique(self, hint: str = "t") -> str:
        """Return a new name that no other call of this builder returns."""
        self._count += 1
        return f"{self.prefix}_{hint}_{self._count}"

    def op(self, op_type: str, *inputs: str, n_outputs: int = 1, **attrs):
        """Add a node and return its output name (a tuple if ``n_outputs > 1``).

        Parameters
        ----------
        op_type : str
            ONNX operator (default domain).
        *inputs : str
            Names of the inputs.
        n_outputs : int, default=1
            Number of outputs.
        **attrs
            Node attributes.
        """
        outputs = [self.unique(op_type.lower()) for _ in range(n_outputs)]
        node = helper.make_node(
            op_type, list(inputs), outputs, name=self.unique("n_" + op_type), **attrs
        )
        self.nodes.append(node)
        return outputs[0] if n_outputs == 1 else tuple(outputs)

    def const(self, value, dtype=None) -> str:
        """Return the name of a constant initializer holding ``value``.

        Equal constants are created once.

        Parameters
        ----------
        value : scalar or array-like
            The constant.
        dtype : numpy dtype, default=None
            Its type; None gives the builder's :attr:`dtype` (the training
            dtype), so that a loss's ``g.const(0.5)`` follows it.
        """
        array = np.asarray(value, dtype=self.dtype if dtype is None else dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._constants:
            name = self.unique("c")
            self.initializers.append(numpy_helper.from_array(array, name))
            self._constants[key] = name
        return self._constants[key]

    # Shorthands for the element-wise operators the losses and optimizers use.
    def add(self, a: str, b: str) -> str:
        """Return ``a + b``."""
        return self.op("Add", a, b)

    def sub(self, a: str, b: str) -> str:
        """Return ``a - b``."""
        return self.op("Sub", a, b)

    def mul(self, a: str, b: str) -> str:
        """Return ``a * b``."""
        return self.op("Mul", a, b)

    def div(self, a: str, b: str) -> str:
        """Return ``a / b``."""
        return self.op("Div", a, b)

    def neg(self, a: str) -> str:
        """Return ``-a``."""
        return self.op("Neg", a)

    def relu(self, a: str) -> str:
        """Return ``max(a, 0)``."""
        return self.op("Relu", a)

    def abs(self, a: str) -> str:
        """Return ``|a|`` as ``relu(a) + relu(-a)`` (its gradient is 0 at 0)."""
        return self.add(self.relu(a), self.relu(self.neg(a)))

    def sqrt(self, a: str) -> str:
        """Return the square root of ``a``."""
        return self.op("Sqrt", a)

    def sum(self, a: str, axes: Sequence[int] | None = None, keepdims: int = 0) -> str:
        """Return the sum of ``a`` over ``axes`` (all axes when None)."""
        if axes is None:
            return self.op("ReduceSum", a, keepdims=keepdims)
        return self.op("ReduceSum", a, self.const(list(axes), np.int64), keepdims=keepdims)

    def identity(self, a: str, name: str) -> str:
        """Copy ``a`` into a tensor called ``name`` (to name a graph output)."""
        self.nodes.append(helper.make_node("Identity", [a], [name], name=self.unique("n_id")))
        return name

    def rename_output(self, a: str, name: str) -> str:
        """Give the tensor ``a`` the name ``name``, without a copy when possible.

        ``a`` is renamed in every node when one of this builder's nodes produces
        it; otherwise (a graph input, a constant, or a tensor already renamed)
        an Identity node copies it.
        """
        producers = [n for n in self.nodes if a in n.output]
        if not producers or a == name:
            return self.identity(a, name)
        for node in self.nodes:
            for field in (node.input, node.output):
                for k, value in enumerate(field):
                    if value == a:
                        field[k] = name
        return name

    def make_model(
        self,
        inputs: Sequence[onnx.ValueInfoProto],
        outputs: Sequence[onnx.ValueInfoProto],
        name: str = "graph",
    ) -> onnx.ModelProto:
        """Return a model made of the nodes and constants collected so far."""
        graph = helper.make_graph(
            self.nodes, name, list(inputs), list(outputs), initializer=self.initializers
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", MAX_OPSET)])
        model.ir_version = MAX_IR_VERSION
        return model


def tensor_info(name: str, shape=None, elem_type: int = TensorProto.FLOAT):
    """Return a ``ValueInfoProto`` for a float tensor (``shape=None``: any rank)."""
    return helper.make_tensor_value_info(name, elem_type, shape)


def model_dtype(model: onnx.ModelProto) -> np.dtype:
    """The float type a model computes in: float64 when its first float input (or
    output, for a model of integer inputs) is double.

    Parameters
    ----------
    model : onnx.ModelProto
        A converted template or a training graph (first input ``X``).

    Returns
    -------
    numpy.dtype
        ``float64`` for a ``tensor(double)`` input, ``float32`` otherwise.
    """
    floats = (TensorProto.FLOAT, TensorProto.DOUBLE)
    for value in [*model.graph.input, *model.graph.output]:  # an integer X: the next one
        if value.type.tensor_type.elem_type in floats:
            double = value.type.tensor_type.elem_type == TensorProto.DOUBLE
            return np.dtype(np.float64 if double else np.float32)
    return np.dtype(np.float32)
