"""Comparisons and logic: Equal, Greater, Less, GreaterOrEqual, LessOrEqual, And, Or, Xor, Not;
and the integer bit operations BitShift, BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot.

Every one is elementwise with a boolean result (stored as one byte, 0 or 1): comparisons and
the binary logic ops broadcast their operands (TVM ``BROADCAST``), Not is ``ELEMWISE``; all are
DNNFusion one-to-one, so they fuse into elementwise chains and epilogues like arithmetic.
A comparison with NaN is false (``!=`` true), as in IEEE and NumPy.
"""
from __future__ import annotations

import numpy as np

from opfuse.ops.common import out_type
from opfuse.ops.elementwise import _binary, _unary
from opfuse.ops.registry import Category, Mapping, OpSpec, register

BOOL = np.dtype(np.bool_)

_binary("Equal", np.equal, commutative=True, out_dtype=BOOL)
_binary("Greater", np.greater, out_dtype=BOOL)
_binary("Less", np.less, out_dtype=BOOL)
_binary("GreaterOrEqual", np.greater_equal, out_dtype=BOOL)
_binary("LessOrEqual", np.less_equal, out_dtype=BOOL)
_binary("And", np.logical_and, commutative=True, out_dtype=BOOL)
_binary("Or", np.logical_or, commutative=True, out_dtype=BOOL)
_binary("Xor", np.logical_xor, commutative=True, out_dtype=BOOL)
_unary("Not", lambda x, a: np.logical_not(x), tags=(), dtypes=frozenset({BOOL}))


# BitShift: integers only.
def _bitshift(ins, a, node):
    """``x << y`` or ``x >> y`` (arithmetic for signed x); a shift that is negative or at least
    the width gives what the sign extension alone gives: -1 for a right shift of a negative x,
    0 otherwise (BitShift-28, onnxruntime). A left shift of a signed x wraps (two's complement)."""
    x, y = np.broadcast_arrays(*ins)
    bits = x.dtype.itemsize * 8
    outside = (y < 0) | (y >= bits)
    s = np.where(outside, 0, y).astype(np.uint64)
    u = np.dtype(f"u{x.dtype.itemsize}")
    if a["direction"] == "LEFT":
        r = np.left_shift(x.view(u) if x.dtype.kind == "i" else x, s.astype(u)).view(x.dtype)
        fill = np.zeros_like(x)
    else:
        r = np.right_shift(x, s.astype(x.dtype))
        fill = np.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else np.zeros_like(x)
    return [np.where(outside, fill, r).astype(x.dtype, copy=False)]


def _bitshift_infer(node, a):
    from opfuse.errors import UnsupportedOpError
    from opfuse.ops.common import broadcast_shapes
    if a["direction"] not in ("LEFT", "RIGHT"):
        raise UnsupportedOpError("BitShift", node.name, detail=f"direction={a['direction']!r}")
    x, y = node.input(0), node.input(1)
    return out_type(broadcast_shapes(node, x.shape, y.shape), x.dtype)


INTEGERS = frozenset(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                           np.uint8, np.uint16, np.uint32, np.uint64))
register(OpSpec("BitShift", Category.BROADCAST, Mapping.ONE_TO_ONE, _bitshift_infer, _bitshift, num_inputs=(2, 2),
                attrs={"direction": None}, dtypes=INTEGERS, tags=frozenset({"binary"})))


# Bitwise ops on integers (two's complement, as C and NumPy).
_binary("BitwiseAnd", np.bitwise_and, commutative=True)
_binary("BitwiseOr", np.bitwise_or, commutative=True)
_binary("BitwiseXor", np.bitwise_xor, commutative=True)
_unary("BitwiseNot", lambda x, a: np.invert(x), tags=(), dtypes=INTEGERS)
