"""onnxruntime's QOperator-format contrib ops (domain ``com.microsoft``), imported as the ops that define them.

``quantize_static(..., quant_format=QuantFormat.QOperator)`` run on a whole CNN writes, besides the standard
QLinearConv / QLinearMatMul (``onnx_quantized``), these ops of onnxruntime's own domain. Each is written out the
way onnxruntime's CPU kernel computes it on an x86-64 host (MLAS, AVX2 where it has a kernel), so that the
integers are onnxruntime's:

* ``QLinearAdd(a, as, az, b, bs, bz, cs, cz)``: MLAS's AVX2 kernel in float32 with fused multiply-adds,
  ``c = sat(rint(fma(a, ra, fma(b, rb, k))))`` with ``ra = as / cs``, ``rb = bs / cs`` and
  ``k = cz - fma(ra, az, rb * bz)`` (float32). A float32 fma of an 8-bit integer and a float32 is the float64
  sum rounded once to float32 (the product and the sum are exact in float64), so it is written as float64
  ``Mul`` / ``Add`` and a ``Cast`` to float32: **bit-exact** for operands of one size; where one operand
  broadcasts, onnxruntime folds it into ``k`` first (within one step). In the fused build the rule
  ``qlinear_add_float32`` (``rules/qlinear_fixed``) writes it in float32 as a QDQ model's residual Add, so that
  it joins the producing conv's kernel (within one step).
* ``QLinearMul``: MLAS's SSE2 kernel, ``c = sat(rint(float32((a - az) * (b - bz)) * m + cz))``,
  ``m = as * bs / cs`` (float32, in that order; the integer product is exact): **bit-exact**.
* ``QLinearSigmoid``, ``QLinearLeakyRelu``: onnxruntime builds a 256-entry table
  ``t[q] = QuantizeLinear(f(xs * (q - xz)), ys, yz)`` and looks every element up; the table is built here
  (``f`` in float64, rounded to float32) and looked up with ``Gather``. LeakyRelu's ``f`` is exact: **bit-exact**;
  onnxruntime's sigmoid is MLAS's rational approximation, so an entry whose value lies within its error of a
  rounding boundary may differ: **within one step**.
* ``QLinearConcat(ys, yz, x0, xs0, xz0, ...)``: each input requantized by the identity table (a copy where its
  scale and zero point are the output's), then ``Concat``: **bit-exact**.
* ``QLinearAveragePool``: dequantized to float32, ``AveragePool``, then ``rint(y / ys + yz)`` saturated
  (onnxruntime adds the zero point before rounding): **bit-exact** where the pooled float sums agree (the sum
  order of a window is the same row-major order).
* ``QLinearGlobalAveragePool``: the same with a ``GlobalAveragePool``.
* ``QGemm(a, as, az, b, bs, bz, [c], [ys], [yz]; alpha, transA, transB)``: the int32 Gemm of the centred
  operands plus the int32 ``c``, requantized as ``QLinearMatMul`` (``m = alpha * as * bs / ys`` per column),
  or, without ``ys``, the float32 ``acc * (alpha * as * bs)``: **bit-exact**.
* ``QLinearSoftmax(x, xs, xz, ys, yz; axis, opset)``: onnxruntime's table of ``exp((q - 255 + s) * xs)``
  (float64, stored float32, ``s`` the headroom shift that keeps the sum finite) indexed by ``x - max(x) + 255``,
  a float32 sum along the axis and ``rint(t * floor(1 / ys) / sum) + yz``, saturated (onnxruntime 1.32 saturates
  an int8 output too): **within one step** (the sum's order may differ from onnxruntime's
  sequential one in the last bit).

The scales and zero points must be constants (onnxruntime's quantizer writes them so; the tables and MLAS's
fixed parts are folded here), per tensor; anything else is refused with its reason.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.errors import ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_decompose import QUANT_RANGES, _Writer
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.frontend.onnx_quantized import EIGHT_BIT, _centered, _check_8bit, _requantize
from opfuse.ir.graph import Value

MS_DOMAIN = "com.microsoft"
MS_VERSION = 1  # every op below is version 1 of the domain
F32, F64, I32 = np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32)
# onnxruntime's QLinearSoftmax: its table holds float32 values and keeps this much headroom (in e-folds, natural
# log) below FLT_MAX / D, so that a sum of D entries stays finite.
SOFTMAX_RESERVE = 5.0

MS_CANONICALIZERS: dict = {}


def ms_op(*op_types: str):
    def register(fn):
        for op in op_types:
            MS_CANONICALIZERS[op] = fn
        return fn
    return register


def is_ms_op(op_type: str) -> bool:
    return op_type in MS_CANONICALIZERS


# Parameters ----------------------------------------------------------------------------------

def _where(w: _Writer) -> str:
    return f"node '{w.node.name}' ({w.node.op_type})"


def _scale(w: _Writer, v: Value | None, what: str) -> np.float32:
    """A per-tensor float32 scale, folded (one clear line when it is not one)."""
    if v is None:
        raise ShapeError(f"{_where(w)}: the {what} scale is missing")
    if v.dtype != F32 or v.size != 1:
        raise ShapeError(f"{_where(w)}: the {what} scale is {v.dtype}{list(v.shape)}; expected a float32 scalar "
                         f"(one scale per tensor)")
    if v.const is None:
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail=f"the {what} scale is computed "
                                 f"at run time (only constant scales are supported)")
    return np.float32(np.asarray(v.const).reshape(()))


def _zero(w: _Writer, v: Value | None, dtype: np.dtype, what: str) -> int:
    """A per-tensor zero point of ``dtype`` (absent: 0), folded."""
    if v is None:
        return 0
    if v.dtype != dtype or v.size != 1:
        raise ShapeError(f"{_where(w)}: the {what} zero point is {v.dtype}{list(v.shape)}; expected a {dtype} "
                         f"scalar")
    if v.const is None:
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail=f"the {what} zero point is "
                                 f"computed at run time (only constant zero points are supported)")
    return int(np.asarray(v.const).reshape(()))


def _opt(inputs: list, i: int) -> Value | None:
    return inputs[i] if len(inputs) > i else None


def _quantized_input(w: _Writer, x: Value | None, what: str) -> Value:
    if x is None:
        raise ShapeError(f"{_where(w)}: the {what} is missing")
    _check_8bit(w, x, what)
    return x


def _saturate(w: _Writer, y: Value, dtype: np.dtype, *, last: bool = True) -> Value:
    """``Cast<dtype>(Clip(y, lo, hi))`` of an already rounded float32 ``y``."""
    lo, hi = QUANT_RANGES[dtype]
    y = w.op("Clip", [y, w.const("lo", np.array(lo, F32)), w.const("hi", np.array(hi, F32))])
    return w.cast(y, dtype, last=last)


def _requantize_float(w: _Writer, y: Value, ys: np.float32, yz: int, dtype: np.dtype) -> Value:
    """onnxruntime's ``quantize_value``: ``sat(rint(y / ys + yz))`` in float32."""
    q = w.op("Div", [y, w.const("y_scale", np.array(ys, F32))])
    q = w.op("Round", [w.op("Add", [q, w.const("y_zero_f", np.array(yz, F32))])])
    return _saturate(w, q, dtype)


def _dequantize(w: _Writer, x: Value, xs: np.float32, xz: int) -> Value:
    """``xs * float32(x - xz)``, as onnxruntime's pools dequantize."""
    centred = w.op("Sub", [w.cast(x, F32), w.const("x_zero_f", np.array(xz, F32))])
    return w.op("Mul", [centred, w.const("x_scale", np.array(xs, F32))])


# Tables ----------------------------------------------------------------------------------------

def _table(dtype: np.dtype, xs: np.float32, xz: int, ys: np.float32, yz: int, fn) -> np.ndarray:
    """``t[q - min] = QuantizeLinear(fn(xs * (q - xz)), ys, yz)`` for every ``q`` of ``dtype``, as onnxruntime's
    ``QlinearBuildLookupTable`` (the dequantization in float32; ``fn`` in float64, rounded to float32; the
    quantization ``rint(v / ys) + yz`` saturated)."""
    lo, hi = QUANT_RANGES[dtype]
    q = np.arange(lo, hi + 1, dtype=np.int64)
    x = (np.float32(xs) * (q - xz).astype(F32)).astype(F32)
    v = np.asarray(fn(x.astype(F64)), F64).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.rint((v / np.float32(ys)).astype(F32)).astype(F64) + yz
    return np.clip(np.nan_to_num(r, nan=0.0), lo, hi).astype(dtype)


def _lookup(w: _Writer, x: Value, table: np.ndarray, *, last: bool = True) -> Value:
    """``table[x - min]`` as a ``Gather`` (``table`` in the output type)."""
    lo = QUANT_RANGES[x.dtype][0]
    idx = w.cast(x, I32)
    if lo:
        idx = w.op("Sub", [idx, w.const("index_base", np.array(lo, np.int32))])
    return w.op("Gather", [w.const("table", table), idx], {"axis": 0}, last=last)


def _table_op(ctx: ImportContext, node: OnnxNode, inputs: list, fn) -> list:
    w = _Writer(ctx, node)
    x = _quantized_input(w, inputs[0], "input")
    xs, xz = _scale(w, _opt(inputs, 1), "input"), _zero(w, _opt(inputs, 2), x.dtype, "input")
    ys, yz = _scale(w, _opt(inputs, 3), "output"), _zero(w, _opt(inputs, 4), x.dtype, "output")
    return [_lookup(w, x, _table(x.dtype, xs, xz, ys, yz, fn))]


@ms_op("QLinearSigmoid")
def qlinear_sigmoid(ctx, node, inputs):
    return _table_op(ctx, node, inputs, lambda v: 1.0 / (1.0 + np.exp(-v)))


@ms_op("QLinearLeakyRelu")
def qlinear_leaky_relu(ctx, node, inputs):
    alpha = np.float32(node.attrs.get("alpha", 0.01))
    return _table_op(ctx, node, inputs, lambda v: np.where(v >= 0, v, (v.astype(F32) * alpha).astype(F64)))


@ms_op("QLinearConcat")
def qlinear_concat(ctx, node, inputs):
    w = _Writer(ctx, node)
    if len(inputs) < 5 or (len(inputs) - 2) % 3:
        raise ShapeError(f"{_where(w)}: {len(inputs)} inputs; expected Y_scale, Y_zero_point and (tensor, scale, "
                         f"zero point) per input")
    zp = inputs[1]
    if zp is None or zp.dtype not in EIGHT_BIT:
        raise ShapeError(f"{_where(w)}: the output zero point must be an int8 or uint8 scalar")
    dtype = zp.dtype
    ys, yz = _scale(w, inputs[0], "output"), _zero(w, zp, dtype, "output")
    parts = []
    for k in range(2, len(inputs), 3):
        x = _quantized_input(w, inputs[k], f"input {k // 3}")
        if x.dtype != dtype:
            raise ShapeError(f"{_where(w)}: input {k // 3} is {x.dtype}, the output {dtype}")
        xs, xz = _scale(w, inputs[k + 1], f"input {k // 3}"), _zero(w, inputs[k + 2], dtype, f"input {k // 3}")
        same = xs == ys and xz == yz
        parts.append(x if same else _lookup(w, x, _table(dtype, xs, xz, ys, yz, lambda v: v), last=False))
    return [w.op("Concat", parts, {"axis": int(node.attrs.get("axis", 0))}, last=True)]


# Element-wise arithmetic -----------------------------------------------------------------------

def _binary_params(w: _Writer, inputs: list):
    a = _quantized_input(w, inputs[0], "A")
    b = _quantized_input(w, _opt(inputs, 3), "B")
    if a.dtype != b.dtype:
        raise ShapeError(f"{_where(w)}: A is {a.dtype}, B {b.dtype}; both must be of one 8-bit type")
    params = (_scale(w, _opt(inputs, 1), "A"), _zero(w, _opt(inputs, 2), a.dtype, "A"),
              _scale(w, _opt(inputs, 4), "B"), _zero(w, _opt(inputs, 5), a.dtype, "B"),
              _scale(w, _opt(inputs, 6), "C"), _zero(w, _opt(inputs, 7), a.dtype, "C"))
    return a, b, params


@ms_op("QLinearAdd")
def qlinear_add(ctx, node, inputs):
    w = _Writer(ctx, node)
    a, b, (sa, za, sb, zb, sc, zc) = _binary_params(w, inputs)
    ra, rb = np.float32(sa / sc), np.float32(sb / sc)
    # MLAS's fixed part, its inner product-sum contracted into one fma: the float64 sum rounded once.
    k = np.float32(np.float32(zc) - np.float32(F64.type(ra) * za + F64.type(np.float32(rb * np.float32(zb)))))
    inner = w.op("Add", [w.op("Mul", [w.cast(b, F64), w.const("ratio_b", np.array(rb, F64))]),
                         w.const("fixed", np.array(k, F64))])
    inner = w.cast(w.cast(inner, F32), F64)  # the inner fma's rounding
    y = w.op("Add", [w.op("Mul", [w.cast(a, F64), w.const("ratio_a", np.array(ra, F64))]), inner])
    return [_saturate(w, w.op("Round", [w.cast(y, F32)]), a.dtype)]


@ms_op("QLinearMul")
def qlinear_mul(ctx, node, inputs):
    w = _Writer(ctx, node)
    a, b, (sa, za, sb, zb, sc, zc) = _binary_params(w, inputs)
    m = np.float32(np.float32(sa * sb) / sc)
    centred = [w.op("Sub", [w.cast(v, I32), w.const("zero", np.array(z, np.int32))]) if z else w.cast(v, I32)
               for v, z in ((a, za), (b, zb))]
    y = w.op("Mul", [w.cast(w.op("Mul", centred), F32), w.const("ratio", np.array(m, F32))])
    y = w.op("Round", [w.op("Add", [y, w.const("c_zero_f", np.array(zc, F32))])])
    return [_saturate(w, y, a.dtype)]


# Pools ---------------------------------------------------------------------------------------

POOL_ATTRS = ("auto_pad", "ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides")


def _pool(ctx, node, inputs, op: str, attrs: dict) -> list:
    w = _Writer(ctx, node)
    if node.attrs.get("channels_last", 0):
        raise UnsupportedOpError(node.op_type, node.name, ctx.opset, detail="channels_last=1 (NHWC)")
    x = _quantized_input(w, inputs[0], "input")
    xs, xz = _scale(w, _opt(inputs, 1), "input"), _zero(w, _opt(inputs, 2), x.dtype, "input")
    ys, yz = _scale(w, _opt(inputs, 3), "output"), _zero(w, _opt(inputs, 4), x.dtype, "output")
    pooled = w.op(op, [_dequantize(w, x, xs, xz)], attrs)
    return [_requantize_float(w, pooled, ys, yz, x.dtype)]


@ms_op("QLinearAveragePool")
def qlinear_average_pool(ctx, node, inputs):
    return _pool(ctx, node, inputs, "AveragePool", {k: v for k, v in node.attrs.items() if k in POOL_ATTRS})


@ms_op("QLinearGlobalAveragePool")
def qlinear_global_average_pool(ctx, node, inputs):
    return _pool(ctx, node, inputs, "GlobalAveragePool", {})


# QGemm ---------------------------------------------------------------------------------------

@ms_op("QGemm")
def qgemm(ctx, node, inputs):
    w = _Writer(ctx, node)
    a = _quantized_input(w, inputs[0], "A")
    b = _quantized_input(w, _opt(inputs, 3), "B")
    if len(a.shape) != 2 or len(b.shape) != 2:
        raise ShapeError(f"{_where(w)}: A {list(a.shape)} and B {list(b.shape)} must be matrices")
    alpha = np.float32(node.attrs.get("alpha", 1.0))
    if node.attrs.get("transA", 0):
        a = w.op("Transpose", [a], {"perm": [1, 0]})
    if node.attrs.get("transB", 0):
        b = w.op("Transpose", [b], {"perm": [1, 0]})
    n = b.shape[1]
    sa, bs_v = _scale(w, _opt(inputs, 1), "A"), _opt(inputs, 4)
    if bs_v is None or bs_v.dtype != F32 or bs_v.size not in (1, n) or len(bs_v.shape) > 1:
        raise ShapeError(f"{_where(w)}: the B scale must be a float32 scalar or one per column ({n})")
    bz_v = _opt(inputs, 5)
    if bz_v is not None and (bz_v.dtype != b.dtype or bz_v.size not in (1, n) or len(bz_v.shape) > 1):
        raise ShapeError(f"{_where(w)}: the B zero point must be a {b.dtype} scalar or one per column ({n})")
    acc = w.op("MatMul", [_centered(w, a, _opt(inputs, 2), -2, "A"), _centered(w, b, bz_v, -1, "B")])
    c = _opt(inputs, 6)
    if c is not None:
        if c.dtype != I32:
            raise ShapeError(f"{_where(w)}: C is {c.dtype}; expected int32")
        acc = w.op("Add", [acc, c])
    scale_a = w.const("alpha_a_scale", np.array(np.float32(alpha * sa), F32))
    ys = _opt(inputs, 7)
    if ys is None:  # float output: acc * (alpha * as * bs)
        return [w.op("Mul", [w.cast(acc, F32), w.op("Mul", [scale_a, bs_v])], last=True)]
    yz = _opt(inputs, 8)
    if yz is not None and (yz.dtype not in EIGHT_BIT or yz.size != 1):
        raise ShapeError(f"{_where(w)}: the output zero point must be an int8 or uint8 scalar")
    return _requantize(w, acc, scale_a, bs_v, ys, yz, -1)


# QLinearSoftmax --------------------------------------------------------------------------------

def softmax_table(xs: np.float32, length: int) -> np.ndarray:
    """onnxruntime's ``exp((q - 255 + s) * xs)`` for q = 0..255 (float64, stored float32), ``s`` the shift
    that leaves ``SOFTMAX_RESERVE`` e-folds of headroom below ``FLT_MAX / length``."""
    shift = max(0.0, math.log(float(np.finfo(F32).max) / length) - SOFTMAX_RESERVE) / float(xs)
    q = np.arange(256, dtype=F64)
    return np.exp((q - 255 + shift) * float(xs)).astype(F32)


@ms_op("QLinearSoftmax")
def qlinear_softmax(ctx, node, inputs):
    w = _Writer(ctx, node)
    x = _quantized_input(w, inputs[0], "input")
    rank = len(x.shape)
    opset = int(node.attrs.get("opset", ctx.opset))
    axis = int(node.attrs.get("axis", -1 if opset >= 13 else 1)) % rank
    if opset < 13 and axis != rank - 1:
        raise UnsupportedOpError(node.op_type, node.name, ctx.opset, detail="opset < 13 softmax over the "
                                 "flattened trailing axes")
    xs = _scale(w, _opt(inputs, 1), "input")
    _zero(w, _opt(inputs, 2), x.dtype, "input")  # cancels in x - max(x)
    ys, yz = _scale(w, _opt(inputs, 3), "output"), _zero(w, _opt(inputs, 4), x.dtype, "output")
    xi = w.cast(x, I32)
    peak = w.op("ReduceMax", [xi], {"axes": [axis], "keepdims": 1})
    idx = w.op("Add", [w.op("Sub", [xi, peak]), w.const("table_top", np.array(255, np.int32))])
    e = w.op("Gather", [w.const("exp_table", softmax_table(xs, x.shape[axis])), idx], {"axis": 0})
    total = w.op("ReduceSum", [e], {"axes": [axis], "keepdims": 1})
    y_mul = np.float32(math.floor(np.float32(1.0) / ys))
    y = w.op("Round", [w.op("Div", [w.op("Mul", [e, w.const("inv_y_scale", np.array(y_mul, F32))]), total])])
    y = w.op("Add", [w.cast(y, I32), w.const("y_zero", np.array(yz, np.int32))])
    lo, hi = QUANT_RANGES[x.dtype]
    y = w.op("Clip", [y, w.const("lo", np.array(lo, np.int32)), w.const("hi", np.array(hi, np.int32))])
    return [w.cast(y, x.dtype, last=True)]
