"""Helpers shared by op definitions: broadcasting, axis normalisation, constant inputs."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from opfuse.errors import ShapeError, ShapeInputError
from opfuse.ir.graph import Node, TensorType, Value


def broadcast_shapes(node: Node, *shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy/ONNX multidirectional broadcasting, with a clear error naming the node."""
    try:
        return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ShapeError(f"node '{node.name}' ({node.op_type}): shapes "
                         f"{' and '.join(str(tuple(s)) for s in shapes)} do not broadcast") from None


def shape_error(node: Node, msg: str) -> ShapeError:
    """A ``ShapeError`` whose message names the node and its op (raise the result)."""
    return ShapeError(f"node '{node.name}' ({node.op_type}): {msg}")


def norm_axis(axis: int, rank: int, node: Node | None = None) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        where = f"node '{node.name}' ({node.op_type}): " if node is not None else ""
        raise ShapeError(f"{where}axis {axis} out of range for rank {rank}")
    return a


def const_input(node: Node, index: int, what: str) -> np.ndarray | None:
    """The constant data of input ``index``; ``None`` when the input is absent.

    opfuse compiles static shapes, so inputs that decide shapes (Reshape's shape, Slice's
    starts, ...) must be constants; a runtime tensor there is an unsupported model.
    """
    v = node.inputs[index] if index < len(node.inputs) else None
    if v is None:
        return None
    if v.const is None:
        raise ShapeInputError(node.op_type, node.name,
                              detail=f"input {index} ({what}) must be a constant: opfuse compiles static shapes",
                              inputs=graph_inputs_behind(v))
    return v.const


def graph_inputs_behind(v: Value) -> tuple[str, ...]:
    """The graph inputs whose values ``v`` is computed from (sorted names; constants stop the walk)."""
    seen: set[int] = set()
    found: set[str] = set()
    stack = [v]
    while stack:
        u = stack.pop()
        if id(u) in seen or u.const is not None:
            continue
        seen.add(id(u))
        if u.producer is None:
            found.add(u.name)
        else:
            stack.extend(i for i in u.producer.inputs if i is not None)
    return tuple(sorted(found))


def same_type(node: Node, index: int = 0) -> list[TensorType]:
    x = node.input(index)
    return [TensorType(x.shape, x.dtype)]


def out_type(shape, dtype) -> list[TensorType]:
    return [TensorType(tuple(shape), np.dtype(dtype))]


def wrap_int(value: float, dtype) -> np.generic:
    """The integral ``value`` (an attribute such as Gemm's alpha) in the integer ``dtype``,
    wrapped modulo 2**bits as C's conversion to an unsigned type and ``-fwrapv`` arithmetic do."""
    dt = np.dtype(dtype)
    return np.uint64(int(value) % (1 << (8 * dt.itemsize))).astype(dt)


def int_attrs(node: Node, a: dict, name: str, n: int, default: int) -> tuple[int, ...]:
    """Integer-list attribute ``name`` of ``n`` entries (``default`` each when absent): strides,
    dilations, pads, kernel_shape... A list of another length is a shape error naming the node."""
    v = a.get(name)
    if v is None:
        return (default,) * n
    v = tuple(int(x) for x in v)
    if len(v) != n:
        raise shape_error(node, f"attribute {name}={list(v)} needs {n} entries")
    return v
