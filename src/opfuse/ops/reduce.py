"""Reductions: Softmax, LogSoftmax, Hardmax, LayerNormalization, Reduce{Mean, Sum, Max, Min, Prod,
L1, L2, LogSum, LogSumExp, SumSquare}, ArgMax, ArgMin, and the scan CumSum.

All are TVM ``REDUCTION`` and DNNFusion many-to-many (CumSum too: each output reads a prefix of
its row, and the C backend builds it, like a reduction, around a loop along the axis). Float
inputs are reduced in float64 so the reference stays an accurate oracle; results are cast back
to the input dtype.
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.dtypes import is_floating
from opfuse.errors import UnsupportedOpError
from opfuse.ir.graph import Node, TensorType
from opfuse.ops.common import norm_axis, out_type, same_type, shape_error
from opfuse.ops.elementwise import OPS_PER_ELEMENT
from opfuse.ops.registry import Category, Mapping, OpSpec, register

# ONNX TensorProto enum values LayerNormalization's stash_type may take (computation precision).
_STASH_TYPES: dict[int, np.dtype] = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 11: np.dtype(np.float64),
                                     16: np.dtype(np.float32)}


def _acc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64, copy=False) if is_floating(x.dtype) else x


def _input_size(node: Node, a: dict) -> int:
    return node.input(0).size


# Softmax --------------------------------------------------------------------------------
def _softmax_infer(node: Node, a: dict):
    norm_axis(int(a["axis"]), len(node.input(0).shape), node)
    return same_type(node)


def _softmax(ins, a, node):
    """y = exp(x - max(x)) / sum(exp(x - max(x))) along ``axis`` (opset-13 semantics).

    Subtracting the max keeps every exponent <= 0, so nothing overflows.
    """
    x = ins[0]
    axis = norm_axis(int(a["axis"]), x.ndim, node)
    if x.size == 0:  # nothing to normalise (and max() of an empty axis has no identity)
        return [x.copy()]
    x64 = _acc(x)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    return [(e / e.sum(axis=axis, keepdims=True)).astype(x.dtype, copy=False)]


# Per element: max, subtract, exp (the vectorised one), sum, divide.
register(OpSpec("Softmax", Category.REDUCTION, Mapping.MANY_TO_MANY, _softmax_infer, _softmax,
                attrs={"axis": -1}, flops_per_element=4 + OPS_PER_ELEMENT["Exp"],
                tags=frozenset({"normalization"})))


# LayerNormalization ---------------------------------------------------------------------
def _ln_axis(node: Node, a: dict) -> int:
    return norm_axis(int(a["axis"]), len(node.input(0).shape), node)


def _broadcasts_to(shape, target) -> bool:
    try:
        return np.broadcast_shapes(tuple(shape), tuple(target)) == tuple(target)
    except ValueError:
        return False


def _ln_infer(node: Node, a: dict):
    x = node.input(0)
    axis = _ln_axis(node, a)
    if int(a["stash_type"]) not in _STASH_TYPES:
        raise UnsupportedOpError("LayerNormalization", node.name, detail=f"stash_type={a['stash_type']}")
    normalized = x.shape[axis:]
    for v, what in ((node.inputs[1], "Scale"), (node.inputs[2] if len(node.inputs) > 2 else None, "B")):
        if v is not None and not _broadcasts_to(v.shape, normalized):
            raise shape_error(node, f"{what} of shape {v.shape} does not broadcast to the normalized "
                                    f"shape {tuple(normalized)}")
    stats = TensorType(x.shape[:axis] + (1,) * (len(x.shape) - axis), _STASH_TYPES[int(a["stash_type"])])
    return [TensorType(x.shape, x.dtype)] + [stats] * (len(node.outputs) - 1)


def _layer_norm(ins, a, node):
    """y = (x - mean) / sqrt(var + epsilon) * Scale + B over the axes [axis, rank).

    Optional outputs 2 and 3 are ``mean`` and ``1 / sqrt(var + epsilon)`` (stash_type dtype).
    """
    x, scale = ins[0], ins[1]
    bias = ins[2] if len(ins) > 2 else None
    axis = _ln_axis(node, a)
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(((x64 - mean) ** 2).mean(axis=axes, keepdims=True) + a["epsilon"])
    y = (x64 - mean) * inv_std * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    stash = _STASH_TYPES[int(a["stash_type"])]
    return [y.astype(x.dtype), mean.astype(stash), inv_std.astype(stash)][:len(node.outputs)]


register(OpSpec("LayerNormalization", Category.REDUCTION, Mapping.MANY_TO_MANY, _ln_infer, _layer_norm,
                num_inputs=(2, 3), num_outputs=(1, 3),
                attrs={"axis": -1, "epsilon": 1e-5, "stash_type": 1}, flops_per_element=8,
                tags=frozenset({"normalization"})))


# ReduceMean / ReduceSum / ReduceMax ----------------------------------------------------------
def reduce_axes(node: Node, a: dict) -> tuple[int, ...] | None:
    """Normalised, sorted axes to reduce; ``None`` means "no reduction" (noop_with_empty_axes)."""
    rank = len(node.input(0).shape)
    axes = a.get("axes")
    if axes is None or len(axes) == 0:
        return None if int(a["noop_with_empty_axes"]) else tuple(range(rank))
    norm = [norm_axis(int(ax), rank, node) for ax in axes]
    if len(set(norm)) != len(norm):
        raise shape_error(node, f"axes {list(axes)} repeat an axis")
    return tuple(sorted(norm))


def _reduce_infer(node: Node, a: dict):
    x = node.input(0)
    axes = reduce_axes(node, a)
    if axes is None:
        return same_type(node)
    if int(a["keepdims"]):
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return out_type(shape, x.dtype)


def _reduce(kind: str):
    def compute(ins, a, node):
        x = ins[0]
        axes = reduce_axes(node, a)
        if axes is None:
            return [x.copy()]
        keep = bool(int(a["keepdims"]))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            if kind == "mean" and x.dtype.kind in "iu" and x.size:
                r = _int_mean(x, axes, keep)
            elif kind == "mean":
                r = _acc(x).mean(axis=axes, keepdims=keep) if x.size else np.full(
                    _reduced_shape(x.shape, axes, keep), np.nan)
            else:
                r = _REDUCE_FNS[kind](_acc(x), axes, keep)
        return [np.asarray(r).astype(x.dtype, copy=False)]
    return compute


def _logsumexp(x, axes, keep):
    """log(sum(exp(x))) = m + log(sum(exp(x - m))), m the max (0 where it is infinite)."""
    m = np.max(x, axis=axes, keepdims=True, initial=-np.inf)
    m = np.where(np.isfinite(m), m, 0)
    r = m + np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True))
    return r if keep else np.squeeze(r, axis=axes)


# Each is (input in its accumulation type, axes, keepdims) -> result; an empty reduction gives
# the identity: 0 for sums, 1 for Prod, the dtype's lowest/highest for Max/Min, -inf for logs.
_REDUCE_FNS = {
    "sum": lambda x, ax, k: x.sum(axis=ax, keepdims=k),
    "max": lambda x, ax, k: np.max(x, axis=ax, keepdims=k, initial=_lowest(x.dtype)),
    "min": lambda x, ax, k: np.min(x, axis=ax, keepdims=k, initial=_highest(x.dtype)),
    "prod": lambda x, ax, k: np.prod(x, axis=ax, keepdims=k),
    "l1": lambda x, ax, k: np.abs(x).sum(axis=ax, keepdims=k),
    "l2": lambda x, ax, k: np.sqrt((x * x).sum(axis=ax, keepdims=k)),
    "sumsquare": lambda x, ax, k: (x * x).sum(axis=ax, keepdims=k),
    "logsum": lambda x, ax, k: np.log(x.sum(axis=ax, keepdims=k)),
    "logsumexp": _logsumexp,
}
def _int_mean(x: np.ndarray, axes, keep: bool) -> np.ndarray:
    """The mean of integers, exact (Python integers: no overflow, no float64 rounding above 2^53)
    and truncated toward zero, as onnxruntime: mean([-7, 0, 0, 0]) = -1."""
    s = x.astype(object).sum(axis=axes, keepdims=keep)
    n = x.size // max(np.asarray(s).size, 1)
    q = np.abs(s) // n
    return np.where(np.asarray(s < 0, dtype=bool), -q, q).astype(x.dtype)


def _reduced_shape(shape, axes, keep):
    return tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)


def _lowest(dtype: np.dtype):
    if dtype == np.bool_:
        return False
    return -np.inf if is_floating(dtype) else np.iinfo(dtype).min


def _highest(dtype: np.dtype):
    if dtype == np.bool_:
        return True
    return np.inf if is_floating(dtype) else np.iinfo(dtype).max


_REDUCE_ATTRS = {"axes": None, "keepdims": 1, "noop_with_empty_axes": 0}
REDUCE_KINDS = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max", "ReduceMin": "min",
                "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2", "ReduceSumSquare": "sumsquare",
                "ReduceLogSum": "logsum", "ReduceLogSumExp": "logsumexp"}
# Operations per input element beyond one add (the exp of LogSumExp and its max pass).
_REDUCE_EXTRA_FLOPS = {"l1": 1, "l2": 1, "sumsquare": 1, "logsumexp": 2 + OPS_PER_ELEMENT["Exp"]}


def _reduce_flops(kind: str):
    extra = _REDUCE_EXTRA_FLOPS.get(kind, 0)
    return lambda node, a: node.input(0).size * (1 + extra)


for _name, _kind in REDUCE_KINDS.items():
    register(OpSpec(_name, Category.REDUCTION, Mapping.MANY_TO_MANY, _reduce_infer, _reduce(_kind),
                    attrs=dict(_REDUCE_ATTRS), flops_fn=_reduce_flops(_kind), tags=frozenset({"reduce"})))


# LogSoftmax and Hardmax (opset-13 semantics: along one axis) -------------------------------
def _log_softmax(ins, a, node):
    """y = x - max(x) - log(sum(exp(x - max(x)))) along ``axis``."""
    x = ins[0]
    axis = norm_axis(int(a["axis"]), x.ndim, node)
    if x.size == 0:
        return [x.copy()]
    x64 = _acc(x)
    shifted = x64 - x64.max(axis=axis, keepdims=True)
    return [(shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype, copy=False)]


def _hardmax(ins, a, node):
    """1 at the first maximum along ``axis``, 0 elsewhere."""
    x = ins[0]
    axis = norm_axis(int(a["axis"]), x.ndim, node)
    y = np.zeros_like(x)
    if x.size:
        np.put_along_axis(y, np.expand_dims(np.argmax(x, axis=axis), axis), 1, axis=axis)
    return [y]


register(OpSpec("LogSoftmax", Category.REDUCTION, Mapping.MANY_TO_MANY, _softmax_infer, _log_softmax,
                attrs={"axis": -1}, flops_per_element=5 + OPS_PER_ELEMENT["Exp"] + OPS_PER_ELEMENT["Log"],
                tags=frozenset({"normalization"})))
register(OpSpec("Hardmax", Category.REDUCTION, Mapping.MANY_TO_MANY, _softmax_infer, _hardmax,
                attrs={"axis": -1}, flops_per_element=2, tags=frozenset({"normalization"})))


# ArgMax / ArgMin ---------------------------------------------------------------------------
def _arg_infer(node: Node, a: dict):
    x = node.input(0)
    axis = norm_axis(int(a["axis"]), len(x.shape), node)
    if x.shape[axis] == 0:
        raise shape_error(node, f"axis {axis} is empty: there is no {node.op_type[3:].lower()}imum to index")
    shape = tuple(1 if i == axis else d for i, d in enumerate(x.shape)) if int(a["keepdims"]) else \
        tuple(d for i, d in enumerate(x.shape) if i != axis)
    return out_type(shape, np.int64)


def _arg(largest: bool):
    def compute(ins, a, node):
        """The index of the first (``select_last_index=1``: last) max/min along ``axis``; NaN
        counts as the largest and the smallest value (NumPy's argmax/argmin pick it)."""
        x = ins[0]
        axis = norm_axis(int(a["axis"]), x.ndim, node)
        fn = np.argmax if largest else np.argmin
        if int(a["select_last_index"]):
            n = x.shape[axis]
            r = n - 1 - fn(np.flip(x, axis=axis), axis=axis)
        else:
            r = fn(x, axis=axis)
        r = np.asarray(r, dtype=np.int64)
        return [np.expand_dims(r, axis) if int(a["keepdims"]) else r]
    return compute


for _name, _largest in (("ArgMax", True), ("ArgMin", False)):
    register(OpSpec(_name, Category.REDUCTION, Mapping.MANY_TO_MANY, _arg_infer, _arg(_largest),
                    attrs={"axis": 0, "keepdims": 1, "select_last_index": 0}, flops_fn=_input_size,
                    tags=frozenset({"reduce"})))


# CumSum, CumProd -------------------------------------------------------------------------------
def cumsum_axis(node: Node) -> int:
    """The (constant) axis of a CumSum node, normalised."""
    from opfuse.ops.common import const_input
    axis = const_input(node, 1, "axis")
    if axis is None or np.asarray(axis).size != 1:
        raise shape_error(node, "axis must be a scalar (or one-element) tensor")
    return norm_axis(int(np.asarray(axis).reshape(-1)[0]), len(node.input(0).shape), node)


def _cumsum_infer(node: Node, a: dict):
    cumsum_axis(node)
    return same_type(node)


def _scan(ufunc, identity):
    def compute(ins, a, node):
        """y[..., i, ...] = x[..., 0, ...] op ... op x[..., i, ...] (``exclusive``: up to i - 1, the
        first being the identity; ``reverse``: from the end), along ``axis``."""
        x = ins[0]
        axis = cumsum_axis(node)
        y = _acc(x)
        if int(a["reverse"]):
            y = np.flip(y, axis=axis)
        y = ufunc.accumulate(y, axis=axis)
        if int(a["exclusive"]) and y.shape[axis]:
            first = np.full_like(np.take(y, [0], axis=axis), identity)
            y = np.concatenate([first, np.delete(y, -1, axis=axis)], axis=axis)
        if int(a["reverse"]):
            y = np.flip(y, axis=axis)
        return [np.ascontiguousarray(y).astype(x.dtype, copy=False)]
    return compute


for _name, _ufunc, _identity in (("CumSum", np.add, 0), ("CumProd", np.multiply, 1)):
    register(OpSpec(_name, Category.REDUCTION, Mapping.MANY_TO_MANY, _cumsum_infer, _scan(_ufunc, _identity),
                    num_inputs=(2, 2), attrs={"exclusive": 0, "reverse": 0}, flops_per_element=1,
                    tags=frozenset({"scan"})))
