"""NumPy dtypes as C types, and exact C literals for constants.

Floats are written as C99 hexadecimal literals (``0x1.8p+1f``): they round-trip exactly,
so an inlined constant is bit-identical to the model's value and the source text is
the same on every machine.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.errors import UnsupportedOpError
from opfuse.ir.dtypes import BFLOAT16, FLOAT16, FLOAT8S, is_floating, is_narrow_float

# bool is stored as one byte holding 0 or 1, as NumPy stores it. float16 and bfloat16 are their
# bits in a uint16_t, float8 in a uint8_t: only Cast and data movement touch them
# (``codegen.half``), every other op computes them in float32 (``rewrites.float32_compute``).
_C_TYPES = {
    np.dtype(np.float32): "float",
    np.dtype(np.float64): "double",
    np.dtype(np.int64): "int64_t",
    np.dtype(np.int32): "int32_t",
    np.dtype(np.int16): "int16_t",
    np.dtype(np.int8): "int8_t",
    np.dtype(np.uint8): "uint8_t",
    np.dtype(np.uint16): "uint16_t",
    np.dtype(np.uint32): "uint32_t",
    np.dtype(np.uint64): "uint64_t",
    np.dtype(np.bool_): "uint8_t",
    FLOAT16: "uint16_t",
    BFLOAT16: "uint16_t",
    **{t: "uint8_t" for t in FLOAT8S},
}


def c_type(dtype, what: str = "") -> str:
    """The C type holding one element of ``dtype``; ``UnsupportedOpError`` for others."""
    dt = np.dtype(dtype)
    try:
        return _C_TYPES[dt]
    except KeyError:
        raise UnsupportedOpError("dtype", what, detail=f"the C backend has no {dt.name} support") from None


def is_float(dtype) -> bool:
    return is_floating(dtype)


def math_fn(name: str, dtype) -> str:
    """libm function for ``dtype``: ``expf`` for float, ``exp`` for double."""
    return f"{name}f" if np.dtype(dtype) == np.float32 else name


def literal(value, dtype) -> str:
    """An exact C literal of ``value`` converted to ``dtype``."""
    dt = np.dtype(dtype)
    if is_narrow_float(dt):  # its bits: only Cast, BitCast and data movement read narrow floats (codegen.half)
        bits = np.asarray(value, dtype=dt).view(np.uint16 if dt.itemsize == 2 else np.uint8)
        return f"0x{int(bits):0{2 * dt.itemsize}x}u"
    if dt == np.bool_:
        return "1" if bool(value) else "0"
    if is_float(dt):
        v = float(np.asarray(value, dtype=dt))
        if math.isnan(v):
            return "(0.0f/0.0f)" if dt == np.float32 else "(0.0/0.0)"
        if math.isinf(v):
            inf = "HUGE_VALF" if dt == np.float32 else "HUGE_VAL"
            return inf if v > 0 else f"(-{inf})"
        text = _short_hex(v)
        return f"{text}f" if dt == np.float32 else text
    v = int(np.asarray(value).astype(dt))
    if dt == np.int64:
        # INT64_MIN has no literal of its own: write it as an expression.
        return "INT64_MIN" if v == np.iinfo(np.int64).min else f"INT64_C({v})"
    if dt == np.uint64:
        return f"UINT64_C({v})"
    if dt == np.uint32:
        return f"{v}u"
    if dt == np.int32 and v == np.iinfo(np.int32).min:
        return "INT32_MIN"
    return str(v)


def _short_hex(v: float) -> str:
    """``float.hex`` without the mantissa's trailing zeros: ``0x1.8p+1`` for 3.0."""
    text = float.hex(v)
    mant, exp = text.split("p")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}"


def lowest(dtype) -> str:
    """The identity of max for ``dtype`` (``-inf`` for floats)."""
    dt = np.dtype(dtype)
    if is_float(dt):
        return literal(-np.inf, dt)
    if dt == np.bool_:
        return "0"
    return literal(np.iinfo(dt).min, dt)


def highest(dtype) -> str:
    dt = np.dtype(dtype)
    if is_float(dt):
        return literal(np.inf, dt)
    if dt == np.bool_:
        return "1"
    return literal(np.iinfo(dt).max, dt)


def float_to_int_helper(program, src, dst, in_range: bool = False) -> str:
    """The C function converting a ``src`` float (float32 or float64) to the integer type ``dst`` as
    the reference does (``ops.elementwise.float_to_int``): NaN 0, beyond the range its nearest end, else
    C's cast (truncation; defined there). A bare ``(int8_t)x`` of NaN or of 300.0f is undefined
    behaviour: GCC folded ``(float)(uint8_t)x`` after a Clip to ``x`` in a fused QuantizeLinear ->
    DequantizeLinear, so a NaN input gave 0 fused where the unfused build gave the zero point's value.
    ``in_range``: the caller knows every value but NaN lies inside the type's range (a Clip to it just
    before, as QuantizeLinear has): only NaN is tested. The range's selects cost a fused QuantizeLinear of
    an image 2.5x the bare cast on Zen 4 (GCC 12 vectorises them through mask registers), the NaN test
    alone 1.15x."""
    src, dst = np.dtype(src), np.dtype(dst)
    info = np.iinfo(dst)
    name = f"opfuse_cvt_{src.name}_{dst.name}" + ("_in_range" if in_range else "")
    t, f = c_type(dst), c_type(src)
    head = (f"/* {src.name} -> {dst.name}, total (the reference's float_to_int): NaN 0, beyond the range its end"
            + (" (the caller's values are inside it)" if in_range else "") + " */\n"
            f"static inline {t} {name}({f} x) {{\n")
    if in_range:
        return program.require_helper(name, head + f"  return ({t})(x != x ? {literal(0, src)} : x);\n}}\n")
    # the bounds as the source type holds them: min - 1 rounds to min where it has no float of its own
    # (int32 from float32, int64), which is then the end too; max + 1 is a power of two, exact
    low, high = literal(float(info.min) - 1.0, src), literal(float(info.max) + 1.0, src)
    return program.require_helper(name, head + f"  return x != x ? ({t})0 : x <= {low} ? ({t}){literal(info.min, dst)}"
                                               f" : x >= {high} ? ({t}){literal(info.max, dst)} : ({t})x;\n}}\n")
