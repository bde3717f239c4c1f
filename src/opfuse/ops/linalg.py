"""Matrix products: MatMul (NumPy ``matmul`` semantics) and Gemm; Det (opaque, one LU per matrix).

Both are TVM ``OUT_ELEMWISE_FUSABLE`` (an elementwise epilogue can ride on the output
tile) and DNNFusion many-to-many. FLOPs count one multiply and one add per
multiply-accumulate: ``2 * M * N * K * batch``.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.ir.dtypes import is_floating
from opfuse.ir.graph import Node
from opfuse.ops.common import broadcast_shapes, out_type, shape_error, wrap_int
from opfuse.ops.elementwise import float_to_int
from opfuse.ops.registry import Category, Mapping, OpSpec, register


def _acc(x: np.ndarray) -> np.ndarray:
    """Floats are multiplied in float64 so the reference is a trustworthy oracle."""
    return x.astype(np.float64, copy=False) if is_floating(x.dtype) else x


# MatMul ---------------------------------------------------------------------------------
def matmul_shape(node: Node, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], int]:
    """Output shape and inner dimension K of ``numpy.matmul(a, b)``.

    A 1-D ``a`` is a row vector ``(1, K)`` and a 1-D ``b`` a column ``(K, 1)``; the added
    axis is dropped from the result. Leading (batch) axes broadcast.
    """
    if not a or not b:
        raise shape_error(node, f"MatMul operands must have rank >= 1, got {a} and {b}")
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    if a2[-1] != b2[-2]:
        raise shape_error(node, f"inner dimensions differ: {a} x {b} ({a2[-1]} != {b2[-2]})")
    batch = broadcast_shapes(node, a2[:-2], b2[:-2])
    out = batch + (a2[-2],) * (len(a) > 1) + (b2[-1],) * (len(b) > 1)
    return out, a2[-1]


def _matmul_infer(node: Node, a: dict):
    x, y = node.input(0), node.input(1)
    if x.dtype != y.dtype:
        raise shape_error(node, f"operand dtypes differ: {x.dtype} and {y.dtype}")
    shape, _ = matmul_shape(node, x.shape, y.shape)
    return out_type(shape, x.dtype)


def _matmul(ins, a, node):
    x, y = ins
    return [np.matmul(_acc(x), _acc(y)).astype(x.dtype, copy=False)]


def _matmul_flops(node: Node, a: dict) -> int:
    shape, k = matmul_shape(node, node.input(0).shape, node.input(1).shape)
    return 2 * math.prod(shape) * k


register(OpSpec("MatMul", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _matmul_infer, _matmul,
                num_inputs=(2, 2), flops_fn=_matmul_flops, tags=frozenset({"matmul"})))


# Gemm -----------------------------------------------------------------------------------
def _gemm_dims(node: Node, a: dict) -> tuple[int, int, int]:
    """(M, N, K) of ``Y = alpha * A' @ B' + beta * C``, A' = A or A^T, B' = B or B^T."""
    sa, sb = node.input(0).shape, node.input(1).shape
    if len(sa) != 2 or len(sb) != 2:
        raise shape_error(node, f"A and B must be 2-D, got {sa} and {sb}")
    m, k = sa[::-1] if a["transA"] else sa
    kb, n = sb[::-1] if a["transB"] else sb
    if k != kb:
        raise shape_error(node, f"inner dimensions differ: A' is ({m}, {k}), B' is ({kb}, {n})")
    return m, n, k


def _gemm_infer(node: Node, a: dict):
    m, n, _ = _gemm_dims(node, a)
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is not None and broadcast_shapes(node, c.shape, (m, n)) != (m, n):
        raise shape_error(node, f"C of shape {c.shape} does not broadcast to ({m}, {n})")
    return out_type((m, n), node.input(0).dtype)


def _gemm(ins, a, node):
    """Y = alpha * A' @ B' + beta * C (C broadcast to (M, N); absent C counts as 0). For integers
    with integral alpha and beta, every step is in the element type and wraps, as MatMul, Mul
    and Add do (scaling in float64 would turn an overflow into an undefined conversion). With a
    fractional alpha or beta, A' @ B' is computed in the element type (wrapping), each term is
    scaled in float64, the sum is in float64 and converted back truncating toward zero, a sum beyond
    the type's range its nearest end (``float_to_int``; NumPy's and C's conversions are undefined
    there); the C backend computes the same. (onnxruntime has no integer Gemm kernel to compare with.)"""
    x, y = _acc(ins[0]), _acc(ins[1])
    if a["transA"]:
        x = x.T
    if a["transB"]:
        y = y.T
    dt = ins[0].dtype
    if dt.kind in "iu" and float(a["alpha"]).is_integer() and float(a["beta"]).is_integer():
        with np.errstate(over="ignore"):
            out = np.matmul(x, y) * wrap_int(a["alpha"], dt)
            if len(ins) > 2 and ins[2] is not None:
                out = out + ins[2] * wrap_int(a["beta"], dt)
        return [np.asarray(out).astype(dt, copy=False)]
    out = a["alpha"] * np.matmul(x, y) if a["alpha"] != 1.0 else np.matmul(x, y)
    c = ins[2] if len(ins) > 2 else None
    if c is not None:
        out = out + (a["beta"] * _acc(c) if a["beta"] != 1.0 else _acc(c))
    out = np.asarray(out)
    if dt.kind in "iu" and out.dtype.kind == "f":
        return [float_to_int(out, dt)]
    return [out.astype(dt, copy=False)]


def _gemm_flops(node: Node, a: dict) -> int:
    m, n, k = _gemm_dims(node, a)
    has_c = len(node.inputs) > 2 and node.inputs[2] is not None
    return 2 * m * n * k + (m * n if has_c else 0)


register(OpSpec("Gemm", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _gemm_infer, _gemm,
                num_inputs=(2, 3), attrs={"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0},
                flops_fn=_gemm_flops, tags=frozenset({"matmul"})))


# Det --------------------------------------------------------------------------------------
def _det_infer(node: Node, a: dict):
    x = node.input(0)
    if len(x.shape) < 2 or x.shape[-1] != x.shape[-2] or x.dtype.kind != "f":
        raise shape_error(node, f"input must be floating point (..., M, M), got {x.dtype}{list(x.shape)}")
    return out_type(x.shape[:-2], x.dtype)


def _det(ins, a, node):
    """det of each trailing ``M x M`` matrix, in float64 (LAPACK's LU) then the input's type; NaN for a
    matrix with a NaN or infinite entry (with infinities an LU's result depends on its order of
    elimination: LAPACK gives inf where the C kernel's gives NaN for the same matrix)."""
    x = ins[0].astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.linalg.det(x)
    finite = np.isfinite(x).all(axis=(-2, -1))
    return [np.asarray(np.where(finite, d, np.nan)).astype(ins[0].dtype)]


def _det_flops(node: Node, a: dict) -> int:
    x = node.input(0)
    m = x.shape[-1]
    return math.prod(x.shape[:-2]) * (2 * m ** 3 // 3 + m)  # LU elimination, then the diagonal's product


# Opaque: one LU factorization per matrix (codegen/det.py); nothing fuses into it.
register(OpSpec("Det", Category.OPAQUE, Mapping.MANY_TO_MANY, _det_infer, _det, num_inputs=(1, 1),
                flops_fn=_det_flops))
