"""Narrow floats in the generated C: float16, bfloat16 and float8 stored narrow, computed in float32.

A float16 or bfloat16 tensor is ``uint16_t`` in the arena and in the ABI (its IEEE bits, as
NumPy and ml_dtypes store them). Only ``Cast`` and pure data movement read or write those bits
(``rewrites.float32_compute`` puts every other op of these types in float32 between Casts);
a Cast converts with the helpers below:

* to float32: exact (float16: normal, subnormal, inf and NaN by their bit fields, a NaN made
  quiet as F16C's ``vcvtph2ps`` does; bfloat16: the high half of a float32);
* from float32: round to nearest even; overflow to infinity (float16 from 65520 on); NaN stays
  NaN, quiet, with the payload's high bits (what x86's F16C ``vcvtps2ph`` and NumPy give for a
  quiet NaN);
* from double (and from integers, through double): rounded to float32 *to odd* first (the
  truncation with its last bit set when inexact), then to nearest even as above: one correct
  rounding, no double rounding (float32's 24 bits exceed float16's 11 + 2).

The helpers use integer operations and mask selects only (``opfuse_sel``: no branch and no
ternary, which gcc fails to if-convert in a long fused loop, leaving it scalar; no float arithmetic whose
result depends on the rounding mode or flush-to-zero, save one exact product), so they give
the same bits at any optimisation level, under ``-ffast-math`` and on the Cortex-M7, and gcc
vectorises the loops around them (AVX2/AVX-512 integer lanes; checked bit for bit against
NumPy/ml_dtypes over every float16 and every 9973rd float32 pattern plus the rounding edges in
``tests/codegen/test_half.py``).

x86's F16C instructions (``_mm256_cvtph_ps``/``_mm256_cvtps_ph``, 8 lanes) give the same bits and
are faster (65536-element loops, gcc 12 -O3 -march=native on this host: to float32 0.07 vs 0.25 ns per
element, to float16 0.12 vs 0.5, a round trip through float16 0.9 with the two helpers), but gcc
vectorises neither their scalar forms nor (before AVX512-FP16) ``_Float16`` conversions, so they run
on whole vectors, under ``#if defined(__F16C__) && defined(__AVX2__)`` with ``simd="auto"`` (the plain
C99 build, ``simd="none"``, never uses them):

* a kernel that is one float16 <-> float32 Cast (``f16c_cast``);
* a fused pointwise loop (``f16c_blocks``, ``codegen/pointwise.py:emit_f16c_blocks``): its innermost
  loop runs in blocks of elements (``CodegenOptions.f16c_block``), its dense float16 operands widened
  into float arrays before the block's element loops, each round trip to float16 between two ops
  (float32 -> float16 -> float32) done in place on an array between two element loops, and its
  float16 outputs rounded from an array after them.

Elsewhere (an anchor's epilogue, the remainder of a blocked loop) a round trip is one helper,
``opfuse_f16_round``/``opfuse_bf16_round`` (``round_trip_expr``: the same bits as the two conversions,
with fewer operations), and the other conversions the helpers above.

float8 (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) is a ``uint8_t``; ONNX makes it only by Cast. Its
helpers are tables made from ml_dtypes, the reference's own conversions: decoding is the float32
bits of each of the 256 codes; encoding counts the midpoints between consecutive codes that lie
below ``|f|`` (a tie counting when the upper code is even: round to nearest even) by a 7-step
binary search, with NaN, overflow (``saturate=0``: ml_dtypes' infinity or NaN, from the first
float32 it does not round to the largest finite value) and ONNX's ``saturate=1`` clamp to the
largest finite value; the sign bit is set after (the FNUZ types have no negative zero).
"""
from __future__ import annotations

import numpy as np

from opfuse.codegen.ctype import float_to_int_helper
from opfuse.ir.dtypes import (BFLOAT16, FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, FLOAT16,
                              FLOAT32)

F16C_GUARD = "defined(__F16C__) && defined(__AVX2__)"

BITS_HELPER = "opfuse_f32_bits"
BITS_TEXT = """\
static inline uint32_t opfuse_f32_bits(float f) { union { float f; uint32_t u; } c; c.f = f; return c.u; }
static inline float opfuse_f32_of_bits(uint32_t u) { union { float f; uint32_t u; } c; c.u = u; return c.f; }
/* c (0 or 1) ? a : b as masks: no control flow for gcc to if-convert, so long fused loops still vectorise */
static inline uint32_t opfuse_sel(uint32_t c, uint32_t a, uint32_t b) {
  const uint32_t m = 0u - c;
  return (a & m) | (b & ~m);
}
"""

# name -> (C text, helpers it needs); float8's are made on first use (``_float8_helpers``)
_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    BITS_HELPER: (BITS_TEXT, ()),
    "opfuse_f16_to_f32": ("""\
/* float16 bits -> float, exact (subnormals as m * 2^-24, an exact product); NaN quiet. */
static inline float opfuse_f16_to_f32(uint16_t h) {
  const uint32_t s = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1fu, m = (uint32_t)h & 0x3ffu;
  const uint32_t sub = opfuse_f32_bits((float)m * 0x1p-24f);
  const uint32_t nan = (uint32_t)(m != 0u) << 22; /* NaN quiet, as F16C's vcvtph2ps gives it */
  const uint32_t big = opfuse_sel(e == 31u, 0x7f800000u | nan | (m << 13), ((e + 112u) << 23) | (m << 13));
  return opfuse_f32_of_bits(s | opfuse_sel(e == 0u, sub, big));
}
""", (BITS_HELPER,)),
    "opfuse_f32_to_f16": ("""\
/* float -> float16 bits, round to nearest even; >= 65520 to inf; NaN quiet. Subnormal results:
   the 24-bit significand shifted right with rounding (shift clamped to a valid range in every lane). */
static inline uint16_t opfuse_f32_to_f16(float f) {
  const uint32_t x = opfuse_f32_bits(f), s = (x >> 16) & 0x8000u, a = x & 0x7fffffffu, e = a >> 23;
  const uint32_t sh = opfuse_sel(e < 101u, 31u, opfuse_sel(e > 125u, 1u, 126u - e));
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t sub = (m + (1u << (sh - 1u)) - 1u + ((m >> sh) & 1u)) >> sh;
  const uint32_t nrm = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t fin = opfuse_sel(a >= 0x477ff000u, 0x7c00u, opfuse_sel(a >= 0x38800000u, nrm, sub));
  return (uint16_t)(s | opfuse_sel(a > 0x7f800000u, 0x7e00u | ((a >> 13) & 0x3ffu), fin));
}
""", (BITS_HELPER,)),
    "opfuse_bf16_to_f32": ("""\
/* bfloat16 bits -> float, exact: the high half of the float. */
static inline float opfuse_bf16_to_f32(uint16_t h) { return opfuse_f32_of_bits((uint32_t)h << 16); }
""", (BITS_HELPER,)),
    "opfuse_f32_to_bf16": ("""\
/* float -> bfloat16 bits, round to nearest even (overflow to inf); NaN quiet. */
static inline uint16_t opfuse_f32_to_bf16(float f) {
  const uint32_t x = opfuse_f32_bits(f);
  const uint32_t nearest = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  return (uint16_t)opfuse_sel((x & 0x7fffffffu) > 0x7f800000u, (x >> 16) | 0x40u, nearest);
}
""", (BITS_HELPER,)),
    "opfuse_f16_round": ("""\
/* float -> float16 -> float in one step (opfuse_f16_to_f32(opfuse_f32_to_f16(f)), same bits, fewer
   operations and no 16-bit lanes): the float rounded to float16's precision and range in place. */
static inline float opfuse_f16_round(float f) {
  const uint32_t x = opfuse_f32_bits(f), s = x & 0x80000000u, a = x & 0x7fffffffu, e = a >> 23;
  const uint32_t sh = opfuse_sel(e < 101u, 31u, opfuse_sel(e > 125u, 1u, 126u - e));
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t k = (m + (1u << (sh - 1u)) - 1u + ((m >> sh) & 1u)) >> sh; /* subnormal result: k * 2^-24 */
  const uint32_t sub = opfuse_f32_bits((float)k * 0x1p-24f);
  const uint32_t nrm = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
  const uint32_t fin = opfuse_sel(a >= 0x477ff000u, 0x7f800000u, opfuse_sel(a >= 0x38800000u, nrm, sub));
  return opfuse_f32_of_bits(s | opfuse_sel(a > 0x7f800000u, 0x7fc00000u | (a & 0x7fe000u), fin));
}
""", (BITS_HELPER,)),
    "opfuse_bf16_round": ("""\
/* float -> bfloat16 -> float in one step (same bits as the two conversions). */
static inline float opfuse_bf16_round(float f) {
  const uint32_t x = opfuse_f32_bits(f);
  const uint32_t nearest = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
  return opfuse_f32_of_bits(opfuse_sel((x & 0x7fffffffu) > 0x7f800000u, (x | 0x400000u) & 0xffff0000u, nearest));
}
""", (BITS_HELPER,)),
    "opfuse_f64_to_f32_odd": ("""\
/* double -> float rounded to odd (truncate, set the last bit when inexact): rounding that to a
   16-bit float is the correct rounding of the double. */
static inline float opfuse_f64_to_f32_odd(double d) {
  const float f = (float)d;
  const uint32_t inexact = (uint32_t)((double)f != d && d == d), above = (uint32_t)(fabs((double)f) > fabs(d));
  return opfuse_f32_of_bits((opfuse_f32_bits(f) - (above & inexact)) | inexact);
}
""", (BITS_HELPER,)),
}

TO_F32 = {FLOAT16: "opfuse_f16_to_f32", BFLOAT16: "opfuse_bf16_to_f32"}
FROM_F32 = {FLOAT16: "opfuse_f32_to_f16", BFLOAT16: "opfuse_f32_to_bf16"}
# float32 -> 16 bits -> float32 as one helper (``round_trip_expr``)
ROUND_F32 = {FLOAT16: "opfuse_f16_round", BFLOAT16: "opfuse_bf16_round"}
FLOAT8_NAMES = {FLOAT8E4M3FN: "e4m3fn", FLOAT8E4M3FNUZ: "e4m3fnuz", FLOAT8E5M2: "e5m2", FLOAT8E5M2FNUZ: "e5m2fnuz"}
for _t, _n in FLOAT8_NAMES.items():
    TO_F32[_t] = f"opfuse_{_n}_to_f32"
    FROM_F32[_t] = f"opfuse_f32_to_{_n}"


def require(program, name: str) -> str:
    """Add helper ``name`` (and those it calls) to ``program`` once; return the name to call."""
    if name not in _HELPERS:
        _HELPERS.update(_float8_helpers(name))
    text, deps = _HELPERS[name]
    for d in deps:
        require(program, d)
    return program.require_helper(name, text)


def cast_expr(program, x: str, src, dst, saturate: bool = True) -> str:
    """The C expression of ``x`` (of dtype ``src``) cast to ``dst`` when either is a narrow float
    (``ValueError`` when neither is). A narrow source goes to float32 exactly and on from there (C's
    cast, or ``!= 0`` for bool); a narrow destination is rounded once from float32, or from anything
    else through double rounded to odd; ``saturate`` (float8 only, ONNX's Cast attribute) clamps
    values beyond the type's range to its largest finite value."""
    src, dst = np.dtype(src), np.dtype(dst)
    if src not in TO_F32 and dst not in FROM_F32:
        raise ValueError(f"cast_expr: neither {src} nor {dst} is a narrow float")
    if src == dst:
        return x
    if src in TO_F32:
        x, src = f"{require(program, TO_F32[src])}({x})", FLOAT32
        if dst not in FROM_F32:
            if dst == np.bool_:
                return f"({x} != 0)"
            if dst.kind in "iu":  # NaN 0, beyond the range its end, as the reference (no C undefined behaviour)
                return f"{float_to_int_helper(program, FLOAT32, dst)}({x})"
            return x if dst == FLOAT32 else f"({_c(dst)})({x})"
    if src != FLOAT32:
        x = f"{require(program, 'opfuse_f64_to_f32_odd')}((double)({x}))"
    name = FROM_F32[dst] + ("_sat" if dst in FLOAT8_NAMES and saturate else "")
    return f"{require(program, name)}({x})"


def round_trip_expr(program, node, ev_inline: set[int]) -> tuple[object, str] | None:
    """For a widening ``Cast`` (float16/bfloat16 -> float32) whose input is an inline ``Cast`` from
    float32 (the round-back ``rewrites.float32_compute`` puts after every op): ``(x, helper)``, the
    float32 value ``x`` and the helper that rounds it in place (``opfuse_f16_round``), same bits as
    the two conversions; else None."""
    narrow = node.input(0)
    back = narrow.producer
    if (np.dtype(node.outputs[0].dtype) != FLOAT32 or np.dtype(narrow.dtype) not in ROUND_F32 or back is None
            or back.op_type != "Cast" or id(back) not in ev_inline or np.dtype(back.input(0).dtype) != FLOAT32):
        return None
    return back.input(0), require(program, ROUND_F32[np.dtype(narrow.dtype)])


def f16c_blocks(kc, ev, outs, inline: set[int], shape) -> tuple[list, list, list] | None:
    """The float16 conversions of a fused pointwise loop over ``shape`` that F16C can do 8 lanes at a
    time (``emit_f16c_blocks``): ``(loads, trips, stores)``, the inline widening Casts of dense float16
    operands read from memory (shape ``shape``), the widening Casts of inline round-backs from float32
    (``round_trip_expr``) in an order where each comes after those it depends on, and the outputs in
    ``outs`` that are the rounding Cast of a float32; None when there are none or the code may not use
    intrinsics (``simd="none"``)."""
    if kc.program.options.simd != "auto":
        return None
    shape = tuple(shape)
    loads: list = []
    trips: list = []
    stores: list = []
    seen: set[int] = set()

    def visit(v) -> None:
        node = v.producer
        if id(v) in seen or node is None or id(node) not in inline:
            return
        seen.add(id(v))
        pair = (np.dtype(node.input(0).dtype), np.dtype(v.dtype)) if node.op_type == "Cast" else None
        x = node.input(0)
        if pair == (FLOAT16, FLOAT32) and tuple(x.shape) == shape:
            if id(x) in ev.loadable and id(x) not in ev.static and (x.producer is None or id(x.producer) not in inline):
                loads.append(node)
                return
            trip = round_trip_expr(kc.program, node, inline)
            if trip is not None:
                visit(trip[0])
                trips.append(node)
                return
        if pair == (FLOAT32, FLOAT16) and tuple(v.shape) == shape and any(v is o for o in outs):
            stores.append(v)
        for u in node.input_values():
            visit(u)

    for v in outs:
        visit(v)
    return (loads, trips, stores) if loads or trips or stores else None


# float8 ----------------------------------------------------------------------------------------
# Tables made from ml_dtypes (the reference's own conversions), so the C code gives its bits by
# construction; ``tests/codegen/test_half.py`` checks every code and a float32 sweep.

def _f32_hex(v: float) -> str:
    from opfuse.codegen.ctype import literal
    return literal(v, FLOAT32)


def _float8_helpers(name: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The decode and both encode helpers of the float8 type ``name`` names."""
    dt = next((t for t, n in FLOAT8_NAMES.items()
               if name in (TO_F32[t], FROM_F32[t], FROM_F32[t] + "_sat", f"opfuse_{n}_mid")), None)
    if dt is None:
        raise KeyError(name)
    n = FLOAT8_NAMES[dt]
    codes = np.arange(256, dtype=np.uint8)
    values = codes.view(dt).astype(np.float32)
    bits = values.view(np.uint32)
    codes_text = ", ".join(f"0x{int(b):08x}u" for b in bits)
    decode = (f"static const uint32_t opfuse_{n}_bits[256] = {{{codes_text}}};\n"
              f"/* {n} -> float, exact: the float32 bits of each code. */\n"
              f"static inline float opfuse_{n}_to_f32(uint8_t x) {{\n"
              f"  return opfuse_f32_of_bits(opfuse_{n}_bits[x]);\n}}\n")
    # Non-negative finite values are codes 0..K-1 in increasing order.
    k = 0
    while k < 128 and np.isfinite(values[k]) and (k == 0 or values[k] > values[k - 1]):
        k += 1
    top = float(values[k - 1])
    mids = [-np.inf] + [float((np.float64(values[j - 1]) + np.float64(values[j])) / 2) for j in range(1, k)]
    mids += [np.inf] * (128 - len(mids))
    with np.errstate(over="ignore", invalid="ignore"):
        nan_pos, nan_neg = (int(v) for v in np.array([np.nan, -np.nan], np.float32).astype(dt).view(np.uint8))
        ovf_pos, ovf_neg = (int(v) for v in np.array([2 * top, -2 * top], np.float32).astype(dt).view(np.uint8))
        neg_zero = int(np.array([-0.0], np.float32).astype(dt).view(np.uint8)[0])
    ovf = _overflow_from(dt, top)
    mid_text = ", ".join("HUGE_VALF" if m == np.inf else "(-HUGE_VALF)" if m == -np.inf else _f32_hex(m) for m in mids)
    search = "\n".join(f"  c += {st}u & (0u - (uint32_t)(s > opfuse_{n}_mid[c + {st}u] || "
                        f"(s == opfuse_{n}_mid[c + {st}u] && ((c + {st}u) & 1u) == 0u)));"
                        for st in (64, 32, 16, 8, 4, 2, 1))
    signed = "(c | 0x80u)" if neg_zero == 0x80 else "opfuse_sel(c == 0u, 0u, c | 0x80u)"
    table = f"opfuse_{n}_mid"
    out = {TO_F32[dt]: (decode, (BITS_HELPER,)),
           table: (f"static const float {table}[128] = {{{mid_text}}};\n", ())}
    for sat in (False, True):
        fn = FROM_F32[dt] + ("_sat" if sat else "")
        clamp = f"a > {_f32_hex(top)} ? {_f32_hex(top)} : a" if sat else "a"
        fin = f"opfuse_sel(neg, {signed}, c)"
        if not sat:
            fin = f"opfuse_sel(a >= {_f32_hex(ovf)}, opfuse_sel(neg, 0x{ovf_neg:02x}u, 0x{ovf_pos:02x}u), {fin})"
        text = (f"/* float -> {n}, round to nearest even{' saturating to +-max' if sat else ''}: the number of\n"
                f"   midpoints between codes below |f| (a tie goes to the even code), by binary search. */\n"
                f"static inline uint8_t {fn}(float f) {{\n"
                f"  const uint32_t x = opfuse_f32_bits(f), neg = x >> 31;\n"
                f"  const float a = opfuse_f32_of_bits(x & 0x7fffffffu);\n"
                f"  const float s = {clamp};\n"
                f"  uint32_t c = 0u;\n{search}\n"
                f"  return (uint8_t)opfuse_sel(a != a, opfuse_sel(neg, 0x{nan_neg:02x}u, 0x{nan_pos:02x}u),\n"
                f"                             {fin});\n"
                f"}}\n")
        out[fn] = (text, (BITS_HELPER, table))
    return out


def _overflow_from(dt, top: float) -> float:
    """The smallest float32 above ``top`` that ``dt`` does not round to ``top`` (ml_dtypes' rule)."""
    lo, hi = int(np.float32(top).view(np.uint32)), 0x7F800000
    while hi - lo > 1:  # invariant: lo rounds to top, hi does not
        mid = (lo + hi) // 2
        v = np.array([mid], np.uint32).view(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            same = float(v.astype(dt).astype(np.float32)[0]) == top
        lo, hi = (mid, hi) if same else (lo, mid)
    return float(np.array([hi], np.uint32).view(np.float32)[0])


def f16c_cast(kc, ev, outs, inline: set[int]):
    """``(x, y)`` when the pointwise stage writing ``outs`` is one float16 <-> float32 Cast of a dense
    operand ``x`` into ``y`` and the code may use intrinsics (``simd="auto"``); else None."""
    if kc.program.options.simd != "auto" or len(outs) != 1 or len(inline) != 1:
        return None
    y = outs[0]
    node = y.producer
    if node is None or node.op_type != "Cast" or id(node) not in inline:
        return None
    x = node.input(0)
    pair = (np.dtype(x.dtype), np.dtype(y.dtype))
    if pair not in ((FLOAT16, FLOAT32), (FLOAT32, FLOAT16)) or id(x) not in ev.loadable or id(x) in ev.static:
        return None
    return x, y


def emit_f16c_cast(kc, x, y) -> None:
    """``y = Cast(x)`` 8 elements at a time with F16C (the remainder with the portable helper)."""
    from opfuse.codegen.microkernel import AVX2_GUARD
    kc.program.require_helper("opfuse_immintrin", f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n")
    n = int(np.prod(x.shape))
    src, dst = kc.ptr(x), kc.ptr(y, write=True)
    j = kc.tmp("j")
    kc.parallel_for(n)
    if np.dtype(x.dtype) == FLOAT16:
        kc.w.line(f"for (long {j} = 0; {j} < {n // 8 * 8}; {j} += 8) _mm256_storeu_ps({dst} + {j}, "
                  f"_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)({src} + {j}))));")
        tail = f"{require(kc.program, TO_F32[FLOAT16])}({src}[{j}])"
    else:
        kc.w.line(f"for (long {j} = 0; {j} < {n // 8 * 8}; {j} += 8) _mm_storeu_si128((__m128i*)({dst} + {j}), "
                  f"_mm256_cvtps_ph(_mm256_loadu_ps({src} + {j}), _MM_FROUND_TO_NEAREST_INT));")
        tail = f"{require(kc.program, FROM_F32[FLOAT16])}({src}[{j}])"
    if n % 8:
        kc.w.line(f"for (long {j} = {n // 8 * 8}; {j} < {n}; ++{j}) {dst}[{j}] = {tail};")


def _c(dtype) -> str:
    from opfuse.codegen.ctype import c_type
    return c_type(dtype)
