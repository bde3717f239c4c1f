"""Ops whose output index decides what is read: GatherElements, GatherND, OneHot, Trilu, Range
and ReverseSequence.

* ``GatherElements(axis)``: ``y[i] = data[i with axis replaced by indices[i]]``; output shape
  = indices' shape (TVM ``INJECTIVE``, one-to-many).
* ``GatherND(batch_dims)``: indices ``(..., k)`` address the leading ``k`` axes of ``data``
  after ``batch_dims`` shared batch axes; the rest is copied (``INJECTIVE``, one-to-many).
* ``OneHot(axis)``: ``y[..., j, ...] = values[1] if indices[...] == j (mod depth) else
  values[0]``; ``depth`` must be a constant (it is a dimension of the output).
* ``Trilu(upper, k)``: ``y[..., i, j] = x[..., i, j]`` where ``j - i >= k`` (upper) or
  ``j - i <= k`` (lower), else 0: elementwise with a mask from the index (``ELEMWISE``, so it
  fuses and runs in place like any activation).
* ``Range(start, limit, delta)``: ``y[i] = start + i * delta`` for
  ``i < max(ceil((limit - start) / delta), 0)``; the inputs decide the output's length, so they
  must be constants, and the importer folds it (an ``INJECTIVE`` rule computes larger ones).
* ``ReverseSequence(x, lens; batch_axis, time_axis)``: the first ``lens[b]`` steps of batch
  ``b`` reversed, the rest as they are (``INJECTIVE``, one-to-one; ``lens`` may be a run-time
  input).

Negative indices count from the end; an index outside ``[-d, d)`` is an ``InputError`` in the
reference (a ``ShapeError`` at compile time when the indices are constants).
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.errors import InputError
from opfuse.ir.graph import Node
from opfuse.ops.common import const_input, norm_axis, out_type, same_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register


def _check(node: Node, idx: np.ndarray, dim: int, error) -> None:
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise error(f"indices out of range [{-dim}, {dim - 1}] (min {idx.min()}, max {idx.max()})")


def _input_error(node: Node):
    return lambda msg: InputError(f"node '{node.name}' ({node.op_type}): {msg}")


def _integer_indices(node: Node, i: int = 1) -> None:
    if not np.issubdtype(node.input(i).dtype, np.integer):
        raise shape_error(node, f"indices must be integers, got {node.input(i).dtype}")


# GatherElements -----------------------------------------------------------------------------------
def _ge_infer(node: Node, a: dict):
    data, idx = node.input(0), node.input(1)
    _integer_indices(node)
    axis = norm_axis(int(a["axis"]), len(data.shape), node)
    if len(idx.shape) != len(data.shape):
        raise shape_error(node, f"indices of rank {len(idx.shape)} for data of rank {len(data.shape)}")
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if k != axis):
        raise shape_error(node, f"indices {idx.shape} larger than data {data.shape} off the axis")
    if idx.const is not None:
        _check(node, idx.const, data.shape[axis], lambda m: shape_error(node, m))
    return out_type(idx.shape, data.dtype)


def _gather_elements(ins, a, node):
    data, idx = ins
    axis = norm_axis(int(a["axis"]), data.ndim, node)
    dim = data.shape[axis]
    _check(node, idx, dim, _input_error(node))
    idx = np.where(idx < 0, idx + dim, idx).astype(np.int64)
    # take_along_axis needs equal extents off the axis: read from the matching corner of data.
    corner = tuple(slice(0, n) if k != axis else slice(None) for k, n in enumerate(idx.shape))
    return [np.take_along_axis(data[corner], idx, axis=axis)]


register(OpSpec("GatherElements", Category.INJECTIVE, Mapping.ONE_TO_MANY, _ge_infer, _gather_elements,
                num_inputs=(2, 2), attrs={"axis": 0}, flops_per_element=0))


# GatherND -----------------------------------------------------------------------------------------
def gathernd_geometry(node: Node, a: dict) -> tuple[int, int]:
    """``(batch_dims, k)``: shared leading axes, and how many data axes one index tuple addresses."""
    data, idx = node.input(0), node.input(1)
    b = int(a["batch_dims"])
    if len(idx.shape) < 1 or not 0 <= b < min(len(data.shape), len(idx.shape)):
        raise shape_error(node, f"batch_dims={b} does not fit data {data.shape} and indices {idx.shape}")
    if data.shape[:b] != idx.shape[:b]:
        raise shape_error(node, f"batch axes of data {data.shape} and indices {idx.shape} differ")
    k = idx.shape[-1]
    if not 1 <= k <= len(data.shape) - b:
        raise shape_error(node, f"index tuples of length {k} for data {data.shape} with batch_dims={b}")
    return b, k


def _gnd_infer(node: Node, a: dict):
    _integer_indices(node)
    b, k = gathernd_geometry(node, a)
    data, idx = node.input(0), node.input(1)
    if idx.const is not None:
        _gnd_check(node, idx.const, data.shape, b, k, lambda m: shape_error(node, m))
    return out_type(idx.shape[:-1] + data.shape[b + k:], data.dtype)


def _gnd_check(node, idx, shape, b, k, error) -> None:
    for j in range(k):
        _check(node, idx[..., j], shape[b + j], error)


def _gather_nd(ins, a, node):
    data, idx = ins
    b, k = gathernd_geometry(node, a)
    _gnd_check(node, idx, data.shape, b, k, _input_error(node))
    dims = np.array(data.shape[b:b + k], dtype=np.int64)
    idx = np.where(idx < 0, idx + dims, idx).astype(np.int64)
    batch = math.prod(data.shape[:b])
    flat_data = data.reshape((batch,) + data.shape[b:])
    flat_idx = idx.reshape((batch, -1, k))
    rows = [flat_data[i][tuple(flat_idx[i].T)] for i in range(batch)]
    out_shape = idx.shape[:-1] + data.shape[b + k:]
    return [np.stack(rows).reshape(out_shape) if rows else np.zeros(out_shape, data.dtype)]


register(OpSpec("GatherND", Category.INJECTIVE, Mapping.ONE_TO_MANY, _gnd_infer, _gather_nd,
                num_inputs=(2, 2), attrs={"batch_dims": 0}, flops_per_element=0))


# OneHot -------------------------------------------------------------------------------------------
def onehot_depth(node: Node) -> int:
    depth = np.asarray(const_input(node, 1, "depth")).reshape(-1)
    if depth.size != 1 or float(depth[0]) < 1:
        raise shape_error(node, f"depth must be one positive number, got {depth.tolist()}")
    return int(depth[0])


# Float indices at or beyond this magnitude (and NaN, infinities) match no position: far past any depth,
# and inside int64, so the conversion is defined in C (``codegen.rules._onehot``) as here.
ONEHOT_FLOAT_LIMIT = 2.0 ** 62


def onehot_positions(idx: np.ndarray, depth: int) -> np.ndarray:
    """OneHot's indices as int64: floats truncated toward zero, as onnxruntime; a float not finite or of
    magnitude ``ONEHOT_FLOAT_LIMIT`` or more, and a uint64 above ``depth``, become ``depth`` (no match;
    a uint64 2^64 - 1 wrapped to -1 matched the last position, and NaN's conversion is undefined)."""
    if idx.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            inside = np.isfinite(idx) & (np.abs(idx) < ONEHOT_FLOAT_LIMIT)
        return np.where(inside, idx, depth).astype(np.int64)
    if idx.dtype == np.uint64:
        return np.where(idx <= depth, idx, depth).astype(np.int64)
    return idx.astype(np.int64)


def _onehot_infer(node: Node, a: dict):
    idx, values = node.input(0), node.input(2)
    if values.size != 2:
        raise shape_error(node, f"values must hold [off_value, on_value], got shape {values.shape}")
    axis = norm_axis(int(a["axis"]), len(idx.shape) + 1, node)
    depth = onehot_depth(node)
    return out_type(idx.shape[:axis] + (depth,) + idx.shape[axis:], values.dtype)


def _onehot(ins, a, node):
    idx, _, values = ins
    depth = onehot_depth(node)
    axis = norm_axis(int(a["axis"]), idx.ndim + 1, node)
    k = onehot_positions(np.asarray(idx), depth)
    k = np.where(k < 0, k + depth, k)  # -depth..-1 count from the end; others match nothing
    j = np.arange(depth).reshape((depth,) + (1,) * (idx.ndim - axis))
    hot = np.expand_dims(k, axis) == j
    values = values.reshape(-1)
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


register(OpSpec("OneHot", Category.INJECTIVE, Mapping.ONE_TO_MANY, _onehot_infer, _onehot,
                num_inputs=(3, 3), attrs={"axis": -1}, flops_per_element=1))


# Trilu --------------------------------------------------------------------------------------------
def _trilu_infer(node: Node, a: dict):
    if len(node.input(0).shape) < 2:
        raise shape_error(node, f"input must have rank >= 2, got shape {node.input(0).shape}")
    k = node.inputs[1] if len(node.inputs) > 1 else None
    if k is not None and (k.size != 1 or not np.issubdtype(k.dtype, np.integer)):
        raise shape_error(node, f"k must be one integer, got {k.dtype}{list(k.shape)}")
    return same_type(node)


def _trilu(ins, a, node):
    """k may be a run-time input: it only decides which elements are kept."""
    x = ins[0]
    k = int(np.asarray(ins[1]).reshape(-1)[0]) if len(ins) > 1 and ins[1] is not None else 0
    rows, cols = x.shape[-2:]
    k = min(max(k, -rows), cols)  # the same elements kept; NumPy overflows on k near -2^63
    return [np.triu(x, k) if int(a["upper"]) else np.tril(x, k)]


register(OpSpec("Trilu", Category.ELEMWISE, Mapping.ONE_TO_ONE, _trilu_infer, _trilu, num_inputs=(1, 2),
                attrs={"upper": 1}, flops_per_element=1, tags=frozenset({"unary"})))


# Range --------------------------------------------------------------------------------------------
def range_params(node: Node) -> tuple[float | int, float | int, int]:
    """``(start, delta, length)`` from the constant inputs."""
    vals = []
    for i, what in enumerate(("start", "limit", "delta")):
        v = np.asarray(const_input(node, i, what))
        if v.size != 1:
            raise shape_error(node, f"{what} must be a scalar, got shape {v.shape}")
        vals.append(v.reshape(-1)[0].item())
    start, limit, delta = vals
    if delta == 0:
        raise shape_error(node, "delta must not be 0")
    return start, delta, max(int(math.ceil((limit - start) / delta)), 0)


def _range_infer(node: Node, a: dict):
    dtypes = {node.input(i).dtype for i in range(3)}
    if len(dtypes) != 1:
        raise shape_error(node, f"start, limit and delta have different types {sorted(map(str, dtypes))}")
    return out_type((range_params(node)[2],), node.input(0).dtype)


def _range(ins, a, node):
    start, delta, n = range_params(node)
    dt = node.input(0).dtype
    # start + i * delta in the output type, each element computed on its own (no running sum).
    return [(np.asarray(start, dt) + np.arange(n).astype(dt) * np.asarray(delta, dt)).astype(dt)]


register(OpSpec("Range", Category.INJECTIVE, Mapping.ONE_TO_MANY, _range_infer, _range, num_inputs=(3, 3),
                attrs={"stash_type": 1}, flops_per_element=2))


# ReverseSequence ----------------------------------------------------------------------------------
def _rs_axes(node: Node, a: dict) -> tuple[int, int]:
    rank = len(node.input(0).shape)
    b, t = norm_axis(int(a["batch_axis"]), rank, node), norm_axis(int(a["time_axis"]), rank, node)
    if b == t or rank < 2:
        raise shape_error(node, f"batch_axis {b} and time_axis {t} must be two different axes")
    return b, t


def _rs_infer(node: Node, a: dict):
    b, _ = _rs_axes(node, a)
    lens = node.input(1)
    if lens.shape != (node.input(0).shape[b],) or not np.issubdtype(lens.dtype, np.integer):
        raise shape_error(node, f"sequence_lens must be {node.input(0).shape[b]} integers, got "
                                f"{lens.dtype}{list(lens.shape)}")
    return same_type(node)


def reverse_lens_message(node: Node, steps: int) -> str:
    """The ``InputError`` of a sequence length outside ``[0, steps]`` (the C code's fault too)."""
    return f"node '{node.name}' (ReverseSequence): sequence_lens must be in [0, {steps}]"


def _reverse_sequence(ins, a, node):
    """y[b, t] = x[b, lens[b] - 1 - t] for t < lens[b], x[b, t] after (batch and time axes)."""
    x, lens = ins
    b, t = _rs_axes(node, a)
    steps = x.shape[t]
    if np.any(lens < 0) or np.any(lens > steps):
        raise InputError(reverse_lens_message(node, steps))
    shape = [1] * x.ndim
    shape[b], shape[t] = x.shape[b], steps
    pos = np.arange(steps).reshape([steps if d == t else 1 for d in range(x.ndim)])
    n = lens.reshape([x.shape[b] if d == b else 1 for d in range(x.ndim)])
    src = np.broadcast_to(np.where(pos < n, n - 1 - pos, pos), shape)
    return [np.take_along_axis(x, np.broadcast_to(src, x.shape) if x.ndim else src, axis=t)]


register(OpSpec("ReverseSequence", Category.INJECTIVE, Mapping.ONE_TO_ONE, _rs_infer, _reverse_sequence,
                num_inputs=(2, 2), attrs={"batch_axis": 1, "time_axis": 0}, flops_per_element=0))
