"""Integer requantization with a fixed-point multiplier (opfuse's own op, not an ONNX one).

``Requantize(acc, multiplier, shift; zero_point, lo, hi, to)``: an int32 accumulator to 8 bits,

    y = clamp(round_half_even(acc * multiplier / 2^shift) + zero_point, lo, hi)

``multiplier`` (int32 in ``[2^30, 2^31)``) and ``shift`` (int32 in ``[1, 62]``) broadcast against
``acc`` (per tensor or per output channel); ``acc * multiplier`` is exact in int64. The real
multiplier ``m = x_scale * w_scale / y_scale`` is ``multiplier * 2^-shift`` with 31 significant
bits (``fixed_point_multiplier``), so the result equals the float requantization
``round(acc * m) + zero_point`` except where ``acc * m`` lies within ``|acc| * m * 2^-31`` of a
rounding tie: at most one step, and none for the accumulators of 8-bit convolutions in practice.
This is the requantization of integer-only kernels (gemmlowp, TFLite, CMSIS-NN), with round half to
even as ONNX's ``QuantizeLinear`` rounds.

With a residual, ``Requantize(acc, multiplier, shift, res, res_multiplier)`` adds a second int8 tensor
of its own scale before the one rounding (the residual Add of a ResNet block, done in integers):

    y = clamp(round_half_even((acc * multiplier + res * res_multiplier) / 2^shift) + zero_point, lo, hi)

``res`` is the centred residual ``int32(r_q) - r_zero_point`` and ``res_multiplier`` (int64) its real
multiplier ``r_scale / y_scale`` at the same ``2^-shift``; both products and their sum stay below
2^62 in magnitude (``residual_multiplier`` checks it for 8-bit residuals).
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from opfuse.errors import InputError, UnsupportedOpError
from opfuse.ops.common import broadcast_shapes, out_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register

MULTIPLIER_BITS = 31  # multiplier in [2^30, 2^31): 31 significant bits, an int32
MAX_SHIFT = 62  # acc * multiplier < 2^62 in magnitude: int64 holds it
OUTPUT_TYPES = (np.dtype(np.int8), np.dtype(np.uint8))


def fixed_point_multiplier(m: float) -> tuple[int, int]:
    """``(multiplier, shift)`` with ``multiplier * 2^-shift`` the nearest 31-bit approximation of ``m``."""
    if not (np.isfinite(m) and m > 0):
        raise InputError(f"a requantization multiplier must be positive and finite, got {m}")
    mantissa, exponent = math.frexp(float(m))  # m = mantissa * 2^exponent, mantissa in [0.5, 1)
    multiplier = round(mantissa * (1 << MULTIPLIER_BITS))
    shift = MULTIPLIER_BITS - exponent
    if multiplier == 1 << MULTIPLIER_BITS:  # rounded up to 2^31
        multiplier, shift = multiplier >> 1, shift - 1
    if not 1 <= shift <= MAX_SHIFT:
        raise InputError(f"requantization multiplier {m} is out of the fixed-point range "
                         f"[2^-{MAX_SHIFT - MULTIPLIER_BITS + 1}, 2^{MULTIPLIER_BITS - 1})")
    return multiplier, shift


RESIDUAL_BITS = 9  # a centred 8-bit residual lies in (-2^9, 2^9)


def residual_multiplier(m: float, shift: int) -> int:
    """``round(m * 2^shift)``, the residual's multiplier at the accumulator's shift."""
    if not (np.isfinite(m) and m > 0):
        raise InputError(f"a residual multiplier must be positive and finite, got {m}")
    r = round(m * 2.0 ** shift)
    if r >= 1 << (MAX_SHIFT - RESIDUAL_BITS):
        raise InputError(f"residual multiplier {m} at shift {shift} leaves int64 once multiplied")
    return r


def requantize(acc: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, zero_point: int, lo: int,
               hi: int, res: np.ndarray | None = None, res_multiplier: np.ndarray | None = None) -> np.ndarray:
    """The definition, in int64 (see the module docstring); returns int64."""
    p = acc.astype(np.int64) * multiplier.astype(np.int64)
    if res is not None and res_multiplier is not None:
        p = p + res.astype(np.int64) * res_multiplier.astype(np.int64)
    s = shift.astype(np.int64)
    q = p >> s  # floor division by 2^shift
    r = p - (q << s)  # in [0, 2^shift)
    half = np.left_shift(np.int64(1), s - 1)
    q = q + ((r > half) | ((r == half) & ((q & 1) == 1)))
    return np.clip(q + zero_point, lo, hi)


def _infer(node, a):
    acc, mult, shift = node.input(0), node.input(1), node.input(2)
    if acc.dtype != np.int32 or mult.dtype != np.int32 or shift.dtype != np.int32:
        raise shape_error(node, f"operands must be int32, got {acc.dtype}, {mult.dtype}, {shift.dtype}")
    if broadcast_shapes(node, acc.shape, mult.shape, shift.shape) != acc.shape:
        raise shape_error(node, f"multiplier {mult.shape} and shift {shift.shape} must broadcast to {acc.shape}")
    if len(node.input_values()) == 5:
        res, rmult = node.input(3), node.input(4)
        if res.dtype != np.int32 or rmult.dtype != np.int64:
            raise shape_error(node, f"residual and its multiplier must be int32 and int64, got {res.dtype}, "
                                    f"{rmult.dtype}")
        if broadcast_shapes(node, acc.shape, res.shape, rmult.shape) != acc.shape:
            raise shape_error(node, f"residual {res.shape} and its multiplier {rmult.shape} must broadcast to "
                                    f"{acc.shape}")
    elif len(node.input_values()) != 3:
        raise shape_error(node, "takes 3 operands, or 5 with a residual and its multiplier")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(a["to"])))
    if dtype not in OUTPUT_TYPES:
        raise UnsupportedOpError("Requantize", node.name, detail=f"output type {dtype} (int8 or uint8)")
    info = np.iinfo(dtype)
    if not info.min <= int(a["lo"]) <= int(a["hi"]) <= info.max:
        raise shape_error(node, f"clamp [{a['lo']}, {a['hi']}] outside {dtype}")
    return out_type(acc.shape, dtype)


def _compute(ins, a, node):
    acc, mult, shift = ins[:3]
    res, rmult = (ins[3], ins[4]) if len(ins) == 5 else (None, None)
    if np.any((shift < 1) | (shift > MAX_SHIFT)) or np.any((mult < 0)):
        raise InputError(f"node '{node.name}' (Requantize): shift outside [1, {MAX_SHIFT}] or a negative multiplier")
    if rmult is not None and np.any((rmult < 0) | (rmult >= 1 << (MAX_SHIFT - RESIDUAL_BITS))):
        raise InputError(f"node '{node.name}' (Requantize): residual multiplier outside [0, 2^"
                         f"{MAX_SHIFT - RESIDUAL_BITS})")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(int(a["to"])))
    return [requantize(acc, mult, shift, int(a["zero_point"]), int(a["lo"]), int(a["hi"]), res,
                       rmult).astype(dtype)]


register(OpSpec("Requantize", Category.BROADCAST, Mapping.ONE_TO_ONE, _infer, _compute, num_inputs=(3, 5),
                attrs={"zero_point": 0, "lo": -128, "hi": 127, "to": int(helper.np_dtype_to_tensor_dtype(
                    np.dtype(np.int8)))},
                flops_per_element=4, tags=frozenset({"quantized"})))
