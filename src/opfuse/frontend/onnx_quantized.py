"""The standard ONNX quantized ops, imported as the integer and float ops that define them.

onnxruntime's quantizer writes these (``QuantFormat.QOperator``); each is written out exactly as
onnxruntime's CPU kernels compute it, an int32 accumulator then a float requantization:

* ``ConvInteger(x, w, x_zp, w_zp)``   = ``Conv(int32(x) - x_zp, int32(w) - w_zp)`` (int32), ``w_zp``
  scalar or per output channel;
* ``MatMulInteger(a, b, a_zp, b_zp)`` = ``MatMul(int32(a) - a_zp, int32(b) - b_zp)`` (int32), ``a_zp``
  scalar or per row, ``b_zp`` scalar or per column;
* ``QLinearConv(x, xs, xz, w, ws, wz, ys, yz, B)`` = ``requantize(ConvInteger(x, w, xz, wz) + B)``;
* ``QLinearMatMul(a, as, az, b, bs, bz, ys, yz)`` = ``requantize(MatMulInteger(a, b, az, bz))``;

with ``requantize(acc) = Cast<T>(Clip(Round(float32(acc) * m) + yz, qmin, qmax))``, ``T`` the type of
``yz``, ``m = xs * ws / ys`` in float32 (per output channel when ``ws`` is), in that order, as
onnxruntime computes the multiplier, and ``Round`` half to even. The int32 arithmetic is exact
(no product of two 8-bit values and no realistic sum of them leaves int32).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from opfuse.errors import ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import QUANT_RANGES, _Writer
from opfuse.ir.graph import Value
from opfuse.ops.quantized import fixed_point_multiplier, residual_multiplier

I32 = np.dtype(np.int32)
# Set by the ``integer_conv`` / ``integer_matmul`` rules (``rules/integer_ops``, which write a DQ -> Conv (or Gemm,
# MatMul) -> [Add] -> [Relu] -> Q as this QLinearConv (QLinearMatMul) through ``onnx_writer``): requantize in fixed
# point (``Requantize``) rather than in float, clamp at the zero point (the Relu), add the residual (inputs 9-11) as a
# second term.
PRIVATE_ATTRS = ("opfuse_requantize", "opfuse_relu", "opfuse_residual")
F32 = np.dtype(np.float32)
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _check_8bit(w: _Writer, v: Value, what: str) -> None:
    if v.dtype not in EIGHT_BIT:
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset,
                                 detail=f"{what} of type {v.dtype} (int8 and uint8 are supported)")


def _shaped(w: _Writer, param: Value, rank: int, axis: int, length: int, what: str) -> Value:
    """A scalar as it is, a vector of ``length`` along ``axis`` of a rank-``rank`` tensor."""
    if param.size == 1:
        return param if param.shape == () else w.op("Reshape", [param, w.const("scalar", np.array([], np.int64))])
    if param.shape != (length,):
        raise ShapeError(f"node '{w.node.name}' ({w.node.op_type}): {what} of shape {param.shape}; expected a "
                         f"scalar or ({length},)")
    shape = [1] * rank
    shape[axis] = length
    return w.op("Reshape", [param, w.const("shape", np.array(shape, np.int64))])


def _centered(w: _Writer, x: Value, zp: Value | None, axis: int, what: str) -> Value:
    """``int32(x) - int32(zp)``, ``zp`` scalar or per ``axis`` (absent: 0)."""
    _check_8bit(w, x, what)
    xi = w.cast(x, I32)
    if zp is None:
        return xi
    if zp.dtype != x.dtype:
        raise ShapeError(f"node '{w.node.name}' ({w.node.op_type}): zero point of {what} is {zp.dtype}, "
                         f"the {what} is {x.dtype}")
    return w.op("Sub", [xi, w.cast(_shaped(w, zp, len(x.shape), axis % len(x.shape), x.shape[axis],
                                           f"zero point of {what}"), I32)])


def _conv_integer(w: _Writer, x, wt, xz, wz, *, last: bool = False) -> Value:
    if len(x.shape) < 3 or len(wt.shape) != len(x.shape):
        raise ShapeError(f"node '{w.node.name}' ({w.node.op_type}): input {x.shape} and weight {wt.shape} "
                         f"are not a Conv's")
    if xz is not None and xz.size != 1:
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail="a per-channel input zero point")
    return w.op("Conv", [_centered(w, x, xz, 0, "input"), _centered(w, wt, wz, 0, "weight")],
                {k: v for k, v in w.node.attrs.items() if k not in PRIVATE_ATTRS}, last=last)


def _matmul_integer(w: _Writer, a, b, az, bz, *, last: bool = False) -> Value:
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail="1-D operands")
    return w.op("MatMul", [_centered(w, a, az, -2, "A"), _centered(w, b, bz, -1, "B")], last=last)


def _requantize(w: _Writer, acc: Value, xs: Value, ws: Value, ys: Value, yz: Value | None, axis: int) -> list:
    target = yz.dtype if yz is not None else np.dtype(np.uint8)
    if target not in QUANT_RANGES:
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail=f"output type {target}")
    rank = len(acc.shape)
    ws = _shaped(w, ws, rank, axis % rank, acc.shape[axis], "weight scale")
    m = w.op("Div", [w.op("Mul", [w.cast(xs, F32), w.cast(ws, F32)]), w.cast(ys, F32)])
    y = w.op("Round", [w.op("Mul", [w.cast(acc, F32), m])])
    if yz is not None:
        if yz.size != 1:
            raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail="a per-channel output zero point")
        y = w.op("Add", [y, w.cast(yz, F32)])
    lo, hi = QUANT_RANGES[target]
    y = w.op("Clip", [y, w.const("lo", np.array(lo, F32)), w.const("hi", np.array(hi, F32))])
    return [w.cast(y, target, last=True)]


def _opt(inputs: list, i: int) -> Value | None:
    return inputs[i] if len(inputs) > i else None


@canonicalizes("ConvInteger")
def conv_integer(ctx, node, inputs):
    w = _Writer(ctx, node)
    return [_conv_integer(w, inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3), last=True)]


@canonicalizes("MatMulInteger")
def matmul_integer(ctx, node, inputs):
    w = _Writer(ctx, node)
    return [_matmul_integer(w, inputs[0], inputs[1], _opt(inputs, 2), _opt(inputs, 3), last=True)]


@canonicalizes("QLinearConv")
def qlinear_conv(ctx, node, inputs):
    x, xs, xz, wt, ws, wz, ys = inputs[:7]
    yz, bias = _opt(inputs, 7), _opt(inputs, 8)
    w = _Writer(ctx, node)
    acc = _conv_integer(w, x, wt, xz, wz)
    if bias is not None:
        if bias.dtype != I32 or bias.shape != (wt.shape[0],):
            raise ShapeError(f"node '{node.name}' (QLinearConv): bias {bias.type} must be int32[{wt.shape[0]}]")
        acc = w.op("Add", [acc, _shaped(w, bias, len(acc.shape), 1, wt.shape[0], "bias")])
    if node.attrs.get("opfuse_requantize") == "fixed":
        residual = tuple(inputs[9:12]) if node.attrs.get("opfuse_residual", 0) else None
        return _requantize_fixed(w, acc, xs, ws, ys, yz, relu=bool(node.attrs.get("opfuse_relu", 0)),
                                 residual=residual)
    return _requantize(w, acc, xs, ws, ys, yz, 1)


def _requantize_fixed(w: _Writer, acc: Value, xs: Value, ws: Value, ys: Value, yz: Value | None, *,
                      relu: bool, residual: tuple | None = None, axis: int = 1) -> list:
    """``Requantize`` with the per-channel fixed-point form of ``m = xs * ws / ys`` (exact, in float64, of
    the float32 scales); ``relu`` raises the clamp's lower bound to the zero point; ``residual``
    ``(r_q, rs, rz)`` adds ``int32(r_q) - rz`` with the multiplier ``rs / ys`` at the same shift; the
    channels (of a per-channel ``ws``) lie along ``axis`` of ``acc`` (a Conv's 1, a MatMul's columns -1)."""
    if yz is None or any(v.const is None for v in (xs, ws, ys, yz)):
        raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail="fixed-point requantization of "
                                 "run-time scales")
    m = np.asarray(xs.const, np.float64).reshape(()) * np.asarray(ws.const, np.float64).ravel() \
        / np.asarray(ys.const, np.float64).reshape(())
    pairs = [fixed_point_multiplier(float(v)) for v in m]
    mult = np.array([p[0] for p in pairs], np.int32)
    shift = np.array([p[1] for p in pairs], np.int32)
    rank = len(acc.shape)
    per_channel = tuple(-1 if i == axis % rank else 1 for i in range(rank)) if mult.size > 1 else ()
    mult, shift = mult.reshape(per_channel), shift.reshape(per_channel)
    zp = int(np.asarray(yz.const).reshape(()))
    lo, hi = QUANT_RANGES[yz.dtype]
    operands = [acc, w.const("multiplier", mult), w.const("shift", shift)]
    if residual is not None:
        r_q, rs, rz = residual
        if rs.const is None or rz is None or rz.const is None or r_q.shape != acc.shape:
            raise UnsupportedOpError(w.node.op_type, w.node.name, w.ctx.opset, detail="a residual of run-time "
                                     "scale or of another shape than the output")
        rm = float(np.asarray(rs.const, np.float64).reshape(())) / float(np.asarray(ys.const, np.float64).reshape(()))
        rmult = np.array([residual_multiplier(rm, int(s)) for s in shift.ravel()], np.int64).reshape(shift.shape)
        operands += [_centered(w, r_q, rz, 0, "residual"), w.const("residual_multiplier", rmult)]
    return [w.op("Requantize", operands,
                 {"zero_point": zp, "lo": max(lo, zp) if relu else lo, "hi": hi,
                  "to": int(helper.np_dtype_to_tensor_dtype(yz.dtype))}, last=True)]


@canonicalizes("QLinearMatMul")
def qlinear_matmul(ctx, node, inputs):
    a, a_s, az, b, bs, bz, ys = inputs[:7]
    yz = _opt(inputs, 7)
    w = _Writer(ctx, node)
    acc = _matmul_integer(w, a, b, az, bz)
    if node.attrs.get("opfuse_requantize") == "fixed":  # integer_matmul's DQ -> Gemm/MatMul -> [bias] -> [residual]
        # -> [Relu] -> Q
        bias = _opt(inputs, 8)
        N = b.shape[-1]
        if bias is not None:
            if bias.dtype != I32 or bias.shape != (N,):
                raise ShapeError(f"node '{node.name}' (QLinearMatMul): bias {bias.type} must be int32[{N}]")
            acc = w.op("Add", [acc, _shaped(w, bias, len(acc.shape), -1, N, "bias")])
        residual = tuple(inputs[9:12]) if node.attrs.get("opfuse_residual", 0) else None
        return _requantize_fixed(w, acc, a_s, bs, ys, yz, relu=bool(node.attrs.get("opfuse_relu", 0)), axis=-1,
                                 residual=residual)
    return _requantize(w, acc, a_s, bs, ys, yz, -1)
