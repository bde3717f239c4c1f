"""Ops whose writes depend on data: ScatterND, ScatterElements and TopK.

They are TVM ``OPAQUE`` (never fused): an element of the output is written by whichever index
names it (ScatterND, ScatterElements), or is the k-th best of a row (TopK); the C backend gives
each its own kernel (``codegen/scatter.py``, ``codegen/topk.py``).

* ``ScatterND(data, indices, updates; reduction)``: ``out = data``, then for each index tuple
  ``t = indices[i, :]`` (addressing the leading ``k`` axes): ``out[t, ...] = updates[i, ...]``
  (``reduction`` add/mul/max/min combine instead), in index order: with ``none``, the last of
  duplicate indices wins.
* ``ScatterElements(data, indices, updates; axis, reduction)``: ``out = data``, then
  ``out[i with axis replaced by indices[i]] = updates[i]`` for every ``i`` of ``indices``.
* ``TopK(X, K; axis, largest, sorted)``: the ``K`` largest (smallest) values along ``axis`` and
  their indices, best first; equal values in index order; NaN counts as the largest value.
  ``K`` decides the output shape: it must be a constant.

Negative indices count from the end; out of range is an ``InputError`` (``ShapeError`` when
the indices are constants).
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.dtypes import is_floating
from opfuse.errors import InputError, UnsupportedOpError
from opfuse.ir.graph import Node, TensorType
from opfuse.ops.common import const_input, norm_axis, same_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register

REDUCTIONS = ("none", "add", "mul", "max", "min")
_UFUNCS = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _reduction(node: Node, a: dict) -> str:
    r = a["reduction"]
    if r not in REDUCTIONS:
        raise UnsupportedOpError(node.op_type, node.name, detail=f"reduction={r!r}")
    return r


def _check_range(node: Node, idx: np.ndarray, dims, error) -> np.ndarray:
    """``idx`` (index values along axes of extents ``dims``, broadcast) with negatives resolved."""
    dims = np.asarray(dims, dtype=np.int64)
    if idx.size and (np.any(idx < -dims) or np.any(idx >= dims)):
        raise error(f"indices out of range for extents {dims.tolist()}")
    return np.where(idx < 0, idx + dims, idx).astype(np.int64)


def _input_error(node: Node):
    return lambda msg: InputError(f"node '{node.name}' ({node.op_type}): {msg}")


def _scatter(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str) -> None:
    if reduction == "none":
        flat = np.ravel_multi_index(where, out.shape).reshape(-1)
        values = updates.reshape(-1)
        out.reshape(-1)[flat] = values  # NumPy writes in order: the last duplicate wins
    else:
        _UFUNCS[reduction].at(out, where, updates)


# ScatterND -------------------------------------------------------------------------------------
def _snd_infer(node: Node, a: dict):
    data, idx, upd = node.input(0), node.input(1), node.input(2)
    _reduction(node, a)
    if not np.issubdtype(idx.dtype, np.integer) or not idx.shape:
        raise shape_error(node, f"indices must be integers of rank >= 1, got {idx.dtype}{list(idx.shape)}")
    k = idx.shape[-1]
    if not 1 <= k <= len(data.shape):
        raise shape_error(node, f"index tuples of length {k} for data of rank {len(data.shape)}")
    want = idx.shape[:-1] + data.shape[k:]
    if upd.shape != want or upd.dtype != data.dtype:
        raise shape_error(node, f"updates are {upd.dtype}{list(upd.shape)}, expected {data.dtype}{list(want)}")
    if idx.const is not None:
        _check_range(node, idx.const, data.shape[:k], lambda m: shape_error(node, m))
    return same_type(node)


def _scatter_nd(ins, a, node):
    data, idx, upd = ins
    k = idx.shape[-1]
    idx = _check_range(node, idx, data.shape[:k], _input_error(node))
    out = data.copy()
    tuples = idx.reshape(-1, k)
    rest = data.shape[k:]
    upd = upd.reshape((tuples.shape[0],) + rest)
    reduction = _reduction(node, a)
    for i, t in enumerate(tuples):  # in order: duplicates combine (or the last wins)
        target = tuple(int(v) for v in t)
        if reduction == "none":
            out[target] = upd[i]
        else:
            out[target] = _UFUNCS[reduction](out[target], upd[i])
    return [out]


register(OpSpec("ScatterND", Category.OPAQUE, Mapping.MANY_TO_MANY, _snd_infer, _scatter_nd, num_inputs=(3, 3),
                attrs={"reduction": "none"}, flops_per_element=0))


# ScatterElements ----------------------------------------------------------------------------------
def _se_infer(node: Node, a: dict):
    data, idx, upd = node.input(0), node.input(1), node.input(2)
    _reduction(node, a)
    axis = norm_axis(int(a["axis"]), len(data.shape), node)
    if not np.issubdtype(idx.dtype, np.integer) or idx.shape != upd.shape or len(idx.shape) != len(data.shape):
        raise shape_error(node, f"indices {idx.dtype}{list(idx.shape)} and updates {list(upd.shape)} must be "
                                f"integers and updates of one shape, of data's rank {len(data.shape)}")
    if any(i > d for k, (i, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if k != axis):
        raise shape_error(node, f"indices {idx.shape} larger than data {data.shape} off the axis")
    if idx.const is not None:
        _check_range(node, idx.const, data.shape[axis], lambda m: shape_error(node, m))
    return same_type(node)


def _scatter_elements(ins, a, node):
    data, idx, upd = ins
    axis = norm_axis(int(a["axis"]), data.ndim, node)
    idx = _check_range(node, idx, data.shape[axis], _input_error(node))
    where = list(np.indices(idx.shape, sparse=False))
    where[axis] = idx
    out = data.copy()
    _scatter(out, tuple(where), upd, _reduction(node, a))
    return [out]


register(OpSpec("ScatterElements", Category.OPAQUE, Mapping.MANY_TO_MANY, _se_infer, _scatter_elements,
                num_inputs=(3, 3), attrs={"axis": 0, "reduction": "none"}, flops_per_element=0))


# TopK --------------------------------------------------------------------------------------------
def topk_k(node: Node) -> int:
    k = np.asarray(const_input(node, 1, "K")).reshape(-1)
    if k.size != 1 or int(k[0]) < 0:
        raise shape_error(node, f"K must be one non-negative integer, got {k.tolist()}")
    return int(k[0])


def _topk_infer(node: Node, a: dict):
    x = node.input(0)
    axis = norm_axis(int(a["axis"]), len(x.shape), node)
    k = topk_k(node)
    if k > x.shape[axis]:
        raise shape_error(node, f"K={k} exceeds the {x.shape[axis]} elements along axis {axis}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    return [TensorType(shape, x.dtype), TensorType(shape, np.dtype(np.int64))][:len(node.outputs)]


def _topk(ins, a, node):
    x = ins[0]
    axis = norm_axis(int(a["axis"]), x.ndim, node)
    k = topk_k(node)
    position = np.indices(x.shape)[axis]
    key: np.ndarray
    if is_floating(x.dtype):
        key = np.where(np.isnan(x), np.inf, x).astype(np.float64)
        nan_rank = np.isnan(x).astype(np.int8)
    else:  # each value's rank among the distinct values: exact where float64 would merge 64-bit integers
        key = np.unique(x, return_inverse=True)[1].reshape(x.shape).astype(np.int64)
        nan_rank = np.zeros(x.shape, np.int8)
    if int(a["largest"]):  # descending value (NaN first), then ascending position
        order = np.lexsort((position, -key, -nan_rank), axis=axis)
    else:  # ascending value (NaN last), then ascending position
        order = np.lexsort((position, key, nan_rank), axis=axis)
    order = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, order, axis=axis), order.astype(np.int64)][:len(node.outputs)]


register(OpSpec("TopK", Category.OPAQUE, Mapping.MANY_TO_MANY, _topk_infer, _topk, num_inputs=(2, 2),
                num_outputs=(1, 2), attrs={"axis": -1, "largest": 1, "sorted": 1},
                flops_fn=lambda node, a: node.input(0).size * max(topk_k(node), 1)))
