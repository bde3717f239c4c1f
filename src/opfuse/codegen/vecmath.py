"""Branch-free float32 exp, expm1, log, tanh, sigmoid and softplus for the generated C.

libm's ``expf``, ``logf``, ``tanhf`` and ``log1pf`` are one call per element: a loop that
calls one is not vectorised, and gcc then compiles the loop's other ternaries (Relu, Clip)
into data-dependent branches, which mispredict on real activations (an 8-op chain with one
Sigmoid ran 1.9x slower fused than as 8 separate kernels). These helpers are plain C that
gcc inlines and vectorises (``-O3``, no fast-math, ``-ffp-contract=off``). Every multiply-add
of a reduction or a polynomial is written ``OPFUSE_FMAF(a, b, c)`` (``FMA_MACRO``): one fused
multiply-add (``fmaf``, an instruction that gcc vectorises) where the compiler targets FMA
units and the build is not the plain C99 one (``simd="none"``), else ``a * b + c`` in two
roundings, as before. That cut the instructions of exp from about 38 to 25 per vector; the
two paths differ by a rounding of each step (within the bounds below either way). Every
special case is computed for all lanes and chosen with ternaries; gcc turns those into
vector selects only under ``-fno-trapping-math`` (``runtime/toolchain.py``): otherwise an
arm holding float arithmetic "may trap" and the loop keeps a branch.

* ``exp``: Cody-Waite reduction ``x = n ln2 + r``, ``|r| <= ln2/2`` (``ln2`` split into an
  exact 9-bit head and a tail, so ``n * head`` is exact); ``n = round(x / ln2)`` read from
  the low mantissa bits of ``x / ln2 + 1.5 * 2^23`` (no float-to-int conversion of a huge
  or NaN value); Cephes' degree-7 polynomial for ``exp(r) = 1 + r + r^2 P(r)``; ``2^n`` built
  in the exponent bits as ``2^(n/2) * 2^(n - n/2)``, so results from 2^128 (inf) down through
  the subnormals round once, at the last multiply. Outside [-104, 89] the result is selected
  (0 below, inf above) at the end, not by clamping ``x`` first: a clamp to a constant lets gcc
  fold the whole function on that path and thread the loop into branches it then cannot
  vectorise. NaN runs through the arithmetic and comes out NaN.
* ``exp_nonpos`` (Sigmoid's and Softplus's ``exp(-|x|)``): the same reduction and scaling, no overflow
  select, and a minimax polynomial of degree 6 by Horner's rule, ``1 + r (1 + r (c2 + ... + r c6))``
  (``EXP_NONPOS_POLY``, 4.7e-9 relative): 6 multiply-adds where Cephes' form takes 5, a multiply, a
  multiply-add and an add.
* ``expm1``: ``x + x^2 P(x)`` (Taylor, degree 8) for ``|x| < 0.5``, where ``exp(x) - 1`` would
  cancel, else ``exp(x) - 1`` (at most a factor 2.6 of cancellation there).
* ``log``: ``x = m 2^e`` with ``m`` in [sqrt(1/2), sqrt(2)) read from the bits (subnormals
  scaled by 2^23 first), ``log(1 + f) = f - f^2/2 + f^3 P(f)`` (Cephes, degree 8),
  ``e ln2`` added in two parts. ``log(0) = -inf``, ``log(x < 0) = NaN``, ``log(inf) = inf``.
* ``tanh``: odd, built for ``a = |x|`` and the sign copied back (``tanh(-0) = -0``):
  ``a + a^3 P(a^2)`` (Cephes) for ``a < 0.625``, else ``(1 - e) / (1 + e)``, ``e = exp_nonpos(-2a)``, which
  reaches exactly 1 (and stays there through inf). (It was ``1 - 2 / (exp(2a) + 1)``: exp_nonpos takes two
  polynomial operations and the overflow select fewer, 0.264 -> 0.228 ns per element in cache, 16K floats, 1
  thread, CPU time, load 11; 1.31 -> 1.54 ulp.)
* ``sigmoid``: ``e = exp(-|x|)``, ``(x >= 0 ? 1 : e) / (1 + e)`` (no overflow, no cancellation, one
  division and no multiply after it: a few ulp over the whole range).
* ``silu`` (``x sigmoid(x)``, the fused form of PyTorch's ``Mul(x, Sigmoid(x))``): ``x / (1 + exp(-a))``,
  ``a = max(x, -89)``, ``exp(-a)`` by ``exp_nonpos`` (which holds for arguments up to 89: its reduction and
  scaling cover ``exp(89)``, which rounds to inf, as exp's does): one division and nothing after it, where
  ``x * sigmoid(x)`` takes sigmoid's ``|x|``, select and division and a multiply after (18 vector operations
  -> 16, 11 of them on the FMA pipes -> 10), and rounds once less. Below -88.73 the result is -0, where
  ``|x sigmoid(x)| < 2.7e-37``.
* ``softplus``: ``max(x, 0) + log1p(exp(-|x|))`` with ``log1p(t) = log(u) t / (u - 1)``,
  ``u = 1 + t`` (Goldberg; ``t`` itself where ``u`` rounds to 1).

Errors (either path), measured against NumPy in float64 over every 13th float32 bit pattern of both signs
plus a 2M-point grid over [-110, 110] (``tests/codegen/test_vecmath.py`` checks every 4099th
pattern, the grid and the special values against these bounds plus a margin), in ulps of the
float32 result (the subnormal spacing 2^-149 below 2^-126):

    exp       <= 0.98 ulp     log       <= 0.82 ulp     tanh      <= 1.54 ulp
    sigmoid   <= 2.40 ulp     softplus  <= 2.76 ulp     expm1     <= 1.68 ulp
    exp_nonpos (x <= 0) <= 1.16 ulp  (0 < x <= 89: <= 1.09 ulp, inf from 88.73)
    silu      <= 2.38 ulp from -88.7 up (-0 below -88.73, within 2.7e-37)

with fused multiply-adds (AVX2/FMA, the same sweep): exp 1.00, expm1 1.76, exp_nonpos 0.88 (0.83 on (0, 89]), tanh
1.50, silu 2.31 (silu's: every 4099th pattern and a 2M-point grid over [-90, 105]), the others as above. (Before
exp_nonpos had its own polynomial and sigmoid one division: exp_nonpos was exp, sigmoid 2.77.)
With ``CodegenOptions.exp_table`` (exp_nonpos by a 16-entry table, every 131st pattern and a 2M-point grid, either
path): exp_nonpos 0.77 (0.766 over all 2^31 inputs x <= 0), sigmoid 2.28, tanh 1.50, softplus 2.76.

NaN in gives NaN out; +-inf give NumPy's limits.

Vector forms (``require_vector``): ``opfuse_v16_*`` (AVX-512F) and ``opfuse_v8_*`` (AVX2) of exp, exp_nonpos, tanh,
sigmoid, silu, log and softplus for the explicit-SIMD elementwise loops (``codegen/simdchain.py``): the scalar helpers'
operations in the same order on whole registers, so the same bits lane by lane as the scalar helpers of an FMA build
(their bodies sit behind ``__FMA__``); ``tests/codegen/test_simdchain.py`` and ``test_vector_log.py`` compare them
over the same bit-pattern sweep. The
AVX-512 forms fold exp's underflow select into a zero-masked ``vscalefps``. Per element, 16K floats in cache, 1
thread, CPU time (Zen 5 host, load ~10-20, medians of 3 interleaved runs, each the best of 15): Sigmoid 0.187 ->
0.128 ns, Silu 0.205 -> 0.141, Gelu(tanh) 0.30 -> 0.24 (with ``simdchain``'s 4 vectors per iteration); log and
softplus (2026-12-02 night, gcc's loop over the scalar helper before, load 7): Log 0.62 -> 0.27, Softplus 1.24 -> 0.76
(latency-bound: exp, then log, then a division, ~130 cycles from load to store).

What bounds the AVX-512 Sigmoid (2026-12-02 late night, 16K floats in cache, 1 thread, CPU time, medians of 9
interleaved rounds, load 6-7, host at ~3.65 GHz): 0.121 ns per element, 7.1 cycles per vector for its ~17
operations (or, exp_nonpos's 9 multiply-adds, subtract, compare and ``vscalefps``, then compare, blend, add and
divide); exp_nonpos alone 4.9 cycles, its 10 operations on the two FMA pipes at 2 a cycle. Not the division: a
multiply in its place saved 4%, ``vrcp14ps`` with a Newton step and a correction cost 50% more (and differed
from the division in the last bit for 24480 of the 16.7M patterns of a sweep of every 257th); not latency: 8
vectors an iteration -2%, two staged passes -2%; a sign-bit or ``vpternlogd`` blend, a clamp for the underflow
compare (both the same bits over that sweep), the exponent added as an integer: +1-10%. Shorter forms
change the error or the scalar helper: a degree-5 polynomial errs by 1.1e-7 (~1 ulp of 1, against 4.7e-9); a
16-entry table of 2^(j/16) (``vpermps``) and a degree-3 polynomial, with the table's float32 tail added back, is
``CodegenOptions.exp_table`` (``EXP_NONPOS_TABLE_TEXT``; off by default: gcc's loop over the scalar helper reads the
tables lane by lane).
"""
from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from typing import Callable

EXP = "opfuse_expf"
EXP_NONPOS = "opfuse_expf_nonpos"
EXPM1 = "opfuse_expm1f"
LOG = "opfuse_logf"
TANH = "opfuse_tanhf"
SIGMOID = "opfuse_sigmoidf"
SOFTPLUS = "opfuse_softplusf"
SIGMOID_TAIL = "opfuse_sigmoidf_tail"  # vector form only: sigmoid given its exp(-|x|)
SILU = "opfuse_siluf"
SILU_TAIL = "opfuse_siluf_tail"  # vector form only: silu given its exp(-max(x, SILU_LOW))
SILU_EXP = "opfuse_expf_silu"  # vector form only: exp_nonpos over silu's arguments (up to 89), ``_vector_exp_text``

EXP_LOW = -104.0  # exp(-103.98) < 2^-150 rounds to 0
EXP_HIGH = 89.0  # exp(88.73) > FLT_MAX
SILU_LOW = -89.0  # silu's x clamped here: exp_nonpos(-x) takes x <= 89 (inf from 88.73 on: x / inf = -0)
# AVX2's exp_nonpos scales by 2^k in one exponent field: ``(q 2^(k + s)) 2^-s`` (``_vector_split_scale``). Its
# argument is first raised to ``low`` (NaN kept), where the result is the scalar's (0 below EXP_LOW; for silu,
# 1 + exp(x) == 1 below SILU_EXP_LOW), so that k + s stays a normal float's exponent (-126 .. 127):
#   exp_nonpos, x in [-104, 0]: k in [-150, 0], s = 24 (the second product rounds once, to a subnormal too);
#   silu's, x in [-86.5, 89]: k in [-125, 128], s = -1 (exp(x) up to 2^128 (1 - 2^-24) before it overflows).
EXP_NONPOS_SPLIT = 24
SILU_EXP_LOW, SILU_EXP_SPLIT = -86.5, -1
TANH_SMALL_END = 0.625


FMA = "OPFUSE_FMAF"
FMA_MACRO = "opfuse_fmaf_macro"  # the helper key of the macro's definition
FMA_TEXT = {
    "auto": "\n".join([
        f"/* {FMA}(a, b, c) = a * b + c: fused (rounded once) where the target has FMA units. */",
        f"#ifndef {FMA}",
        "#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)",
        f"#define {FMA}(a, b, c) fmaf((a), (b), (c))",
        "#else",
        f"#define {FMA}(a, b, c) ((a) * (b) + (c))",
        "#endif",
        "#endif",
        "",
    ]),
    "none": "\n".join([
        f"/* {FMA}(a, b, c) = a * b + c, a multiply and an add (the plain C99 build). */",
        f"#ifndef {FMA}",
        f"#define {FMA}(a, b, c) ((a) * (b) + (c))",
        "#endif",
        "",
    ]),
}


def fma(a: str, b: str, c: str) -> str:
    """C for ``a * b + c`` through the ``OPFUSE_FMAF`` macro."""
    return f"{FMA}({a}, {b}, {c})"


def horner(name: str, coefs: tuple[str, ...], var: str) -> list[str]:
    """C lines computing ``name = sum coefs[i] * var^i`` (lowest degree first) by Horner's rule,
    each step one ``OPFUSE_FMAF``."""
    lines = [f"  float {name} = {coefs[-1]}f;"]
    lines += [f"  {name} = {fma(name, var, c + 'f')};" for c in coefs[-2::-1]]
    return lines


def vector_horner(isa: "VecIsa", name: str, coefs: tuple[str, ...], var: str) -> list[str]:
    """``horner`` on ``isa``'s registers: ``name = sum coefs[i] * var^i``, each step one fused multiply-add
    intrinsic (the vector forms of exp, tanh, log and erf)."""
    return [f"  {isa.vt} {name} = {isa.set1(coefs[-1] + 'f')};",
            *[f"  {name} = {isa.op('fmadd_ps', name, var, isa.set1(k + 'f'))};" for k in coefs[-2::-1]]]


# exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2 (Cephes expf).
EXP_POLY = ("5.0000001201e-1", "1.6666665459e-1", "4.1665795894e-2", "8.3334519073e-3",
            "1.3981999507e-3", "1.9875691500e-4")
# log(1 + f) = f - f^2/2 + f^3 P(f) on sqrt(1/2) - 1 <= f < sqrt(2) - 1 (Cephes logf).
LOG_POLY = ("3.3333331174e-1", "-2.4999993993e-1", "2.0000714765e-1", "-1.6668057665e-1",
            "1.4249322787e-1", "-1.2420140846e-1", "1.1676998740e-1", "-1.1514610310e-1",
            "7.0376836292e-2")
# tanh(x) = x + x^3 P(x^2) on |x| < 0.625 (Cephes tanhf).
TANH_POLY = ("-3.33332819422e-1", "1.33314422036e-1", "-5.37397155531e-2", "2.06390887954e-2",
             "-5.70498872745e-3")
# exp(r) = 1 + r + c2 r^2 + ... + c6 r^6 on |r| <= 1.01 ln2/2 (minimax for the relative error, 4.7e-9 with these
# float32 coefficients, 0.04 ulp of 1; lowest degree first): exp_nonpos's polynomial, one fused multiply-add a
# degree by Horner's rule, where Cephes' ``1 + r + r^2 P(r)`` of degree 7 costs 8 vector operations for an
# error (3e-10) that the roundings around it hide.
EXP_NONPOS_POLY = ("1.0", "1.0", "4.9999994040e-01", "1.6666515172e-01", "4.1668456048e-02", "8.3694243804e-03",
                   "1.3813120313e-03")
# exp_nonpos with ``CodegenOptions.exp_table``: x = (k / 16) ln2 + r, |r| <= ln2 / 32,
# exp(x) = 2^floor(k / 16) * 2^((k mod 16) / 16) * exp(r), the middle factor read from a 16-entry table
# (``EXP16_TABLE``, 2^(j/16) rounded to float32, plus ``EXP16_TAIL``) and exp(r) = 1 + r + c2 r^2 + c3 r^3
# (``EXP16_POLY``: minimax for the relative error on |r| <= 1.01 ln2/32, 1.7e-9 with these float32 coefficients).
# The tables cost two permutes (``vpermps``, off the FMA pipes) and an add where the degree-6 polynomial on
# |r| <= ln2/2 takes 3 more multiply-adds.
def _f32(v: float) -> float:
    return struct.unpack("f", struct.pack("f", v))[0]


EXP16_TABLE = tuple(f"{_f32(2.0 ** (j / 16)):.9e}" for j in range(16))
# 2^(j/16) less its float32 (exact in the double): the table's rounding, added back (0.50 -> 1.00 ulp without it).
EXP16_TAIL = tuple(f"{_f32(2.0 ** (j / 16) - _f32(2.0 ** (j / 16))):.9e}" for j in range(16))
EXP16_POLY = ("5.000164509e-01", "1.666674763e-01")  # c2, c3
EXP16_MAGIC, EXP16_MAGIC_BITS = "786432.0f", "0x49400000"  # 1.5 * 2^19: ulp 1/16, so z - magic = k / 16
LN2_HEAD16, LN2_TAIL16 = "0.693115234375f", "3.194618330e-05f"  # head: 12 significant bits, so (k / 16) head is exact
LN2_HEAD, LN2_TAIL = "0.693359375f", "-2.12194440e-4f"  # head has 9 significant bits
LN2_TAIL_NEG = LN2_TAIL[1:]


def _exp_poly(nonpos: bool) -> list[str]:
    """C lines computing ``p = exp(r)``: Cephes' degree 7 (``opfuse_expf``; its bits, M7 builds included, as
    before), or ``EXP_NONPOS_POLY`` by Horner's rule (``opfuse_expf_nonpos``)."""
    if nonpos:
        return horner("p", EXP_NONPOS_POLY, "r")
    return [*horner("p", EXP_POLY, "r"), f"  p = {fma('p', 'r * r', 'r')} + 1.0f;"]


def _exp_text(name: str, head: str, tail: str, nonpos: bool = False) -> str:
    return "\n".join([
        head,
        f"static inline float {name}(float x) {{",
        f"  const float z = {fma('x', '1.44269504088896341f', '12582912.0f')};",
        "  union { float f; uint32_t u; } t = { z };",
        "  const int32_t k = (int32_t)(t.u - 0x4B400000u);",
        "  const float n = z - 12582912.0f;  /* k, exactly, wherever the result is used */",
        f"  float r = {fma('n', '-' + LN2_HEAD, 'x')};",
        f"  r = {fma('n', LN2_TAIL_NEG, 'r')};",
        *_exp_poly(nonpos),
        "  const int32_t k1 = k >> 1, k2 = k - k1;  /* arithmetic shift: k1 = floor(k / 2) */",
        "  union { uint32_t u; float f; } s1 = { (uint32_t)(k1 + 127) << 23 }, s2 = { (uint32_t)(k2 + 127) << 23 };",
        "  const float y = (p * s1.f) * s2.f;",
        tail,
        "}",
        "",
    ])


EXP_TEXT = _exp_text(EXP, "/* exp(x) in float (<= 1.0 ulp, NaN -> NaN); branch-free, vectorisable. */",
                     f"  return x < {EXP_LOW:.1f}f ? 0.0f : (x > {EXP_HIGH:.1f}f ? HUGE_VALF : y);")
# Sigmoid's and softplus's exp(-|x|): no overflow select (x <= 0 or NaN, where it never applies; gcc 12 cannot
# see that x > 89 never holds there, and the select cost a sixth of an 8-op chain's time with one Sigmoid, 0.82 ->
# 0.69 ns per element, AVX-512), and the degree-6 ``EXP_NONPOS_POLY``: 6 vector operations where opfuse_expf's
# polynomial takes 8 (Sigmoid 0.193 -> 0.171 ns per element alone, with the masked forms below).
EXP_NONPOS_TEXT = _exp_text(EXP_NONPOS, "/* exp(x) for x <= 0 or NaN (<= 1.0 ulp, NaN -> NaN). */",
                            f"  return x < {EXP_LOW:.1f}f ? 0.0f : y;", nonpos=True)
# The same with the 16-entry table (``CodegenOptions.exp_table``; ``EXP16_TABLE``): 8 operations on the FMA pipes
# where the degree-6 form takes 10.
EXP_NONPOS_TABLE_TEXT = "\n".join([
    "/* exp(x) for x <= 0 or NaN (<= 0.6 ulp, NaN -> NaN): 16-entry table. */",
    f"static inline float {EXP_NONPOS}(float x) {{",
    f"  static const float table[16] = {{ {', '.join(t + 'f' for t in EXP16_TABLE)} }};  /* 2^(j/16) */",
    f"  static const float tail[16] = {{ {', '.join(t + 'f' for t in EXP16_TAIL)} }};  /* 2^(j/16) - table */",
    f"  const float z = {fma('x', '1.44269504088896341f', EXP16_MAGIC)};",
    "  union { float f; uint32_t u; } t = { z };",
    f"  const int32_t k = (int32_t)(t.u - {EXP16_MAGIC_BITS}u);",
    f"  const float kf = z - {EXP16_MAGIC};  /* k / 16, exactly, wherever the result is used */",
    f"  float r = {fma('kf', '-' + LN2_HEAD16, 'x')};",
    f"  r = {fma('kf', '-' + LN2_TAIL16, 'r')};",
    "  const float th = table[t.u & 15u], tl = tail[t.u & 15u];",
    f"  float q = {fma(EXP16_POLY[1] + 'f', 'r', EXP16_POLY[0] + 'f')};",
    f"  q = {fma('q', 'r', '1.0f')};",
    f"  const float p = th + {fma('th * r', 'q', 'tl')};  /* 2^(j/16) exp(r) */",
    "  const int32_t n = k >> 4, n1 = n >> 1, n2 = n - n1;  /* arithmetic shifts: n = floor(k / 16) */",
    "  union { uint32_t u; float f; } s1 = { (uint32_t)(n1 + 127) << 23 }, s2 = { (uint32_t)(n2 + 127) << 23 };",
    "  const float y = (p * s1.f) * s2.f;",
    f"  return x < {EXP_LOW:.1f}f ? 0.0f : y;",
    "}",
    "",
])

LOG_TEXT = "\n".join([
    "/* log(x) in float (<= 0.82 ulp; 0 -> -inf, x < 0 -> NaN, NaN -> NaN); branch-free, vectorisable. */",
    f"static inline float {LOG}(float x) {{",
    "  const int sub = x < 0x1p-126f;",
    "  union { float f; uint32_t u; } b = { sub ? x * 0x1p23f : x };",
    "  const uint32_t bits = b.u;",
    "  union { uint32_t u; float f; } mb = { (bits & 0x007fffffu) | 0x3f800000u };",
    "  const int big = mb.f > 1.41421356f;",
    "  const float m = big ? 0.5f * mb.f : mb.f;",
    "  const float e = (float)((int32_t)((bits >> 23) & 0xffu) - (sub ? 150 : 127) + (big ? 1 : 0));",
    "  const float f = m - 1.0f;",
    "  const float z = f * f;",
    *horner("p", LOG_POLY, "f"),
    f"  float y = {fma('f * z', 'p', 'e * ' + LN2_TAIL)};",
    f"  y = {fma('-0.5f', 'z', 'y')};",
    f"  const float r = {fma('e', LN2_HEAD, 'f + y')};",
    "  return x > 0.0f ? (x < HUGE_VALF ? r : x) : (x == 0.0f ? -HUGE_VALF : NAN);",
    "}",
    "",
])

TANH_TEXT = "\n".join([
    "/* tanh(x) in float (<= 1.54 ulp, NaN -> NaN); branch-free, vectorisable. */",
    f"static inline float {TANH}(float x) {{",
    "  const float a = fabsf(x);",
    "  const float z = x * x;",
    *horner("p", TANH_POLY, "z"),
    f"  const float small = {fma('a * z', 'p', 'a')};",
    f"  const float e = {EXP_NONPOS}(-2.0f * a);",
    "  const float big = (1.0f - e) / (1.0f + e);",
    f"  const float y = copysignf(a < {TANH_SMALL_END}f ? small : big, x);",
    "  return x != x ? x : y;",
    "}",
    "",
])

SIGMOID_TEXT = "\n".join([
    "/* 1 / (1 + exp(-x)) in float (<= 2.40 ulp, NaN -> NaN); branch-free, vectorisable. */",
    f"static inline float {SIGMOID}(float x) {{",
    f"  const float e = {EXP_NONPOS}(-fabsf(x));",
    "  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);",
    "}",
    "",
])

SILU_TEXT = "\n".join([
    "/* x sigmoid(x) = x / (1 + exp(-x)) in float (-0 below -88.73, NaN -> NaN); branch-free, vectorisable. */",
    f"static inline float {SILU}(float x) {{",
    f"  const float a = x < {SILU_LOW:.1f}f ? {SILU_LOW:.1f}f : x;  /* exp(-a) <= exp(89): in exp_nonpos's range */",
    f"  return x / (1.0f + {EXP_NONPOS}(-a));",
    "}",
    "",
])

SOFTPLUS_TEXT = "\n".join([
    "/* log(1 + exp(x)) in float (<= 2.76 ulp, NaN -> NaN); branch-free, vectorisable. */",
    f"static inline float {SOFTPLUS}(float x) {{",
    f"  const float t = {EXP_NONPOS}(-fabsf(x));",
    "  const float u = 1.0f + t;",
    f"  const float l = u == 1.0f ? t : {LOG}(u) * (t / (u - 1.0f));",
    "  const float y = (x > 0.0f ? x : 0.0f) + l;",
    "  return x != x ? x : y;",
    "}",
    "",
])

# exp(x) - 1 = x + x^2 (1/2 + x/6 + ... + x^6/8!) on |x| < 0.5 (Taylor; the next term is < 1e-8 |x|).
EXPM1_POLY = tuple(f"{1 / math.factorial(k):.9e}" for k in range(2, 9))
EXPM1_SMALL_END = 0.5

EXPM1_TEXT = "\n".join([
    "/* exp(x) - 1 in float (<= 1.76 ulp, NaN -> NaN); branch-free, vectorisable. */",
    f"static inline float {EXPM1}(float x) {{",
    *horner("p", EXPM1_POLY, "x"),
    f"  const float small = x * {fma('x', 'p', '1.0f')};  /* keeps expm1(-0) = -0 */",
    f"  const float big = {EXP}(x) - 1.0f;",
    f"  return fabsf(x) < {EXPM1_SMALL_END}f ? small : big;",
    "}",
    "",
])

# name -> (helpers it calls, C text)
HELPERS: dict[str, tuple[tuple[str, ...], str]] = {
    EXP: ((), EXP_TEXT),
    EXP_NONPOS: ((), EXP_NONPOS_TEXT),
    EXPM1: ((EXP,), EXPM1_TEXT),
    LOG: ((), LOG_TEXT),
    TANH: ((EXP_NONPOS,), TANH_TEXT),
    SIGMOID: ((EXP_NONPOS,), SIGMOID_TEXT),
    SILU: ((EXP_NONPOS,), SILU_TEXT),
    SOFTPLUS: ((EXP_NONPOS, LOG), SOFTPLUS_TEXT),
}


def _text(name: str, exp_table: bool) -> str:
    """Scalar helper ``name``'s C: exp_nonpos by the 16-entry table with ``CodegenOptions.exp_table``."""
    return EXP_NONPOS_TABLE_TEXT if name == EXP_NONPOS and exp_table else HELPERS[name][1]


def require(program, name: str) -> str:
    """Add helper ``name`` (after the helpers it calls) to ``program``, once; return its name."""
    require_fma(program)
    for d in HELPERS[name][0]:
        require(program, d)
    return program.require_helper(name, _text(name, program.options.exp_table))


def require_fma(program) -> str:
    """Add the ``OPFUSE_FMAF`` macro for the program's ``simd`` mode, once; return its name."""
    program.require_helper(FMA_MACRO, FMA_TEXT[program.options.simd])
    return FMA


def all_helpers_text(simd: str = "auto", exp_table: bool = False) -> str:
    """Every helper, in dependency order, after the ``OPFUSE_FMAF`` macro of ``simd`` (for tests
    that compile them on their own); exp_nonpos by the table with ``exp_table``."""
    return FMA_TEXT[simd] + "".join(_text(name, exp_table)
                                    for name in (EXP, EXP_NONPOS, EXPM1, LOG, TANH, SIGMOID, SILU, SOFTPLUS))


# Vector forms ---------------------------------------------------------------------------------------------------
# The explicit-SIMD elementwise loops (``codegen/simdchain.py``) call these: opfuse_expf, opfuse_expf_nonpos and
# opfuse_sigmoidf on a whole AVX-512 or AVX2 register, written as the scalar helpers' own operations in the same
# order, each ``OPFUSE_FMAF`` one fused multiply-add (the vector bodies sit behind ``__FMA__``, where the scalar
# macro is ``fmaf`` too): the same bits as the scalar helpers of that build, lane by lane, NaN and +-inf included.
# Except the scale by 2^k: AVX2's exp_nonpos (and silu's own exp, ``SILU_EXP``) clamp the argument and scale in one
# exponent field (``_vector_split_scale``), 5 operations where the scalar's halves and underflow select take 11, with
# the same bits over all 2^32 inputs (checked once; tests/codegen/test_vector_exp_scale.py checks the ranges where they
# act). yolo_block, 1 thread, kernel timers, 60 interleaved rounds: its six Conv + SiLU groups 0.90-0.96x the time
# (2087 -> 1946 us), outputs bit-equal.


@dataclass(frozen=True)
class VecIsa:
    """One x86 vector ISA the explicit-SIMD loops are written for: its ``#if`` guard, float lanes, C vector
    types and intrinsic prefix (``_mm512``/``_mm256``)."""
    name: str
    guard: str
    lanes: int
    vt: str
    it: str
    p: str
    si: str

    def set1(self, literal: str) -> str:
        return f"{self.p}_set1_ps({literal})"

    def op(self, name: str, *args: str) -> str:
        """``<prefix>_<name>(args)``."""
        return f"{self.p}_{name}({', '.join(args)})"

    def select(self, a: str, b: str, predicate: str, t: str, f: str) -> str:
        """``a PRED b ? t : f`` per lane (``predicate``: a ``_CMP_*`` constant, ordered where the C's
        comparison is false on NaN)."""
        if self.lanes == 16:
            return f"_mm512_mask_blend_ps(_mm512_cmp_ps_mask({a}, {b}, {predicate}), {f}, {t})"
        return f"_mm256_blendv_ps({f}, {t}, _mm256_cmp_ps({a}, {b}, {predicate}))"

    def select_or_nan(self, a: str, b: str, predicate: str, t: str, f: str) -> str:
        """``a PRED b || a != a ? t : f`` per lane (``rules.nan_max`` and ``nan_min``)."""
        if self.lanes == 16:
            return (f"_mm512_mask_blend_ps((__mmask16)(_mm512_cmp_ps_mask({a}, {b}, {predicate}) | "
                    f"_mm512_cmp_ps_mask({a}, {a}, _CMP_UNORD_Q)), {f}, {t})")
        return (f"_mm256_blendv_ps({f}, {t}, _mm256_or_ps(_mm256_cmp_ps({a}, {b}, {predicate}), "
                f"_mm256_cmp_ps({a}, {a}, _CMP_UNORD_Q)))")

    def bits(self, x: str, op: str, mask: str) -> str:
        """``x`` with its bits ``op`` ("and", "or", "xor") a 32-bit integer ``mask`` in every lane (integer
        intrinsics: AVX-512F has no float and/or/xor)."""
        return (f"{self.p}_castsi{self.lanes * 32}_ps({self.p}_{op}_{self.si}({self.p}_castps_{self.si}({x}), "
                f"{self.p}_set1_epi32({mask})))")


    def combine(self, a: str, op: str, b: str) -> str:
        """The bits of ``a`` ``op`` ("and", "or", "xor") those of ``b``."""
        p, si = self.p, self.si
        return f"{p}_castsi{self.lanes * 32}_ps({p}_{op}_{si}({p}_castps_{si}({a}), {p}_castps_{si}({b})))"


AVX512_FLOAT = VecIsa("avx512", "defined(__AVX512F__) && defined(__FMA__)", 16, "__m512", "__m512i", "_mm512",
                      "si512")
AVX2_FLOAT = VecIsa("avx2", "defined(__AVX2__) && defined(__FMA__)", 8, "__m256", "__m256i", "_mm256", "si256")
SIGN_BIT = "(int)(-2147483647 - 1)"
ABS_BITS = "0x7fffffff"


def vector_name(name: str, isa: VecIsa) -> str:
    """The vector helper of scalar helper ``name`` on ``isa``: ``opfuse_expf`` -> ``opfuse_v16_expf``."""
    return name.replace("opfuse_", f"opfuse_v{isa.lanes}_", 1)


def _vector_scale(isa: VecIsa, q: str, n: str, k: str, shift: int) -> list[str]:
    """C lines for ``y = q 2^floor(n)``, zero where ``x < -104``: AVX-512 in one ``vscalefps`` (``q 2^n`` rounded
    once, subnormals included: the scalar's ``(q 2^(n/2)) 2^(n - n/2)``, whose first product is exact, bit for bit),
    zero-masked where ``x < -104`` (the scalar's underflow select in the same instruction: unordered lanes keep the
    NaN); AVX2 through the exponent bits as the scalar does, from the integer ``k`` (``n = k >> shift``)."""
    v, p = isa.vt, isa.op
    low = isa.set1(f"{EXP_LOW:.1f}f")
    if isa.lanes == 16:
        return [f"  const {v} y = _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, {low}, _CMP_NLT_UQ), {q}, {n});"]
    to_float = f"castsi{isa.lanes * 32}_ps"
    first = ""
    if shift:  # n itself, as an integer
        first, k = f"k0 = {p('srai_epi32', k, str(shift))}, ", "k0"
    return [
        f"  const {isa.it} {first}k1 = {p('srai_epi32', k, '1')}, k2 = {p('sub_epi32', k, 'k1')};",
        f"  const {v} s1 = {p(to_float, p('slli_epi32', p('add_epi32', 'k1', p('set1_epi32', '127')), '23'))};",
        f"  const {v} s2 = {p(to_float, p('slli_epi32', p('add_epi32', 'k2', p('set1_epi32', '127')), '23'))};",
        f"  const {v} s = {p('mul_ps', p('mul_ps', q, 's1'), 's2')};",
        f"  const {v} y = {isa.select('x', low, '_CMP_LT_OQ', p('setzero_ps'), 's')};",
    ]


def _vector_split_scale(isa: VecIsa, q: str, z: str, split: int) -> list[str]:
    """C lines for ``y = q 2^k`` (``k`` the integer in ``z``'s low bits, ``z = n + 1.5 * 2^23``) as
    ``(q 2^(k + split)) 2^-split``: one integer add and shift make the first power, where ``_vector_scale`` splits k
    in halves (two of each), and the caller's clamp of the argument replaces its underflow select. The first
    product is exact (q in [0.7, 1.42], a normal result), so the second rounds once, as the scalar's
    ``(q 2^(k/2)) 2^(k - k/2)`` does: the same bits wherever k + split is a normal exponent (``EXP_NONPOS_SPLIT``)."""
    p, c = isa.op, isa.set1
    bias = 127 + split - 0x4B400000  # z's bits less 1.5 * 2^23's are k
    power = p(f"castsi{isa.lanes * 32}_ps", p("slli_epi32", p("add_epi32", p("castps_" + isa.si, z),
                                                                    p("set1_epi32", str(bias))), "23"))
    return [f"  const {isa.vt} y = {p('mul_ps', p('mul_ps', q, power), c(f'0x1p{-split}f'))};"]


def _vector_exp_text(name: str, isa: VecIsa, overflow: bool, low: float | None = None, split: int = 0) -> str:
    """The scalar ``_exp_text`` on ``isa``'s registers (``overflow``: ``opfuse_expf``, else ``opfuse_expf_nonpos``
    and its polynomial), scaled by ``_vector_scale``; with ``low`` (AVX2), the argument first raised to ``low`` and
    scaled by ``_vector_split_scale`` with ``split``."""
    v, p = isa.vt, isa.op
    c = isa.set1
    fma = functools.partial(p, "fmadd_ps")
    split_scale = low is not None and isa.lanes != 16
    x = "xc" if split_scale else "x"
    lines = [
        f"static inline {v} {vector_name(name, isa)}({v} x) {{",
        *([f"  const {v} xc = {p('max_ps', c(f'{low:.1f}f'), 'x')};  /* NaN kept: the second operand */"]
          if split_scale else []),
        f"  const {v} z = {fma(x, c('1.44269504088896341f'), c('12582912.0f'))};",
        f"  const {v} n = {p('sub_ps', 'z', c('12582912.0f'))};",
        f"  {v} r = {fma('n', c('-' + LN2_HEAD), x)};",
        f"  r = {fma('n', c(LN2_TAIL_NEG), 'r')};",
        *vector_horner(isa, "q", EXP_POLY if overflow else EXP_NONPOS_POLY, "r"),
        *([f"  q = {p('add_ps', fma('q', p('mul_ps', 'r', 'r'), 'r'), c('1.0f'))};"] if overflow else []),
    ]
    if split_scale:
        lines += [*_vector_split_scale(isa, "q", "z", split), "  return y;"]
    else:
        lines += [
            f"  const {isa.it} k = {p('sub_epi32', p('castps_' + isa.si, 'z'), p('set1_epi32', '0x4B400000'))};",
            *_vector_scale(isa, "q", "n", "k", 0),
            f"  return {isa.select('x', c(f'{EXP_HIGH:.1f}f'), '_CMP_GT_OQ', c('HUGE_VALF'), 'y')};" if overflow
            else "  return y;",
        ]
        if isa.lanes == 16:  # vscalefps needs no integer k
            lines.remove(next(line for line in lines if line.startswith(f"  const {isa.it} k = ")))
    lines += ["}", ""]
    return "\n".join(lines)


def _vector_exp_nonpos_table_text(isa: VecIsa, helper: str = EXP_NONPOS) -> str:
    """``EXP_NONPOS_TABLE_TEXT`` on ``isa``'s registers, the same operations: each table read by one ``vpermps``
    with ``z``'s low 4 bits as the index (AVX-512), or two ``vpermps`` of 8 entries and a blend on bit 3 (AVX2)."""
    v, p = isa.vt, isa.op
    c = isa.set1
    fma = functools.partial(p, "fmadd_ps")
    zi = p("castps_" + isa.si, "z")
    if isa.lanes == 16:
        table = [f"  const {v} {name} = _mm512_permutexvar_ps({zi}, _mm512_setr_ps({', '.join(t + 'f' for t in tab)}));"
                 for name, tab in (("th", EXP16_TABLE), ("tl", EXP16_TAIL))]
    else:
        bit3 = f"_mm256_castsi256_ps(_mm256_slli_epi32({zi}, 28))"
        table = []
        for name, tab in (("th", EXP16_TABLE), ("tl", EXP16_TAIL)):
            lo, hi = (", ".join(t + "f" for t in half) for half in (tab[:8], tab[8:]))
            table.append(f"  const {v} {name} = _mm256_blendv_ps(_mm256_permutevar8x32_ps(_mm256_setr_ps({lo}), {zi}), "
                         f"_mm256_permutevar8x32_ps(_mm256_setr_ps({hi}), {zi}), {bit3});  /* bit 3: the upper 8 */")
    return "\n".join([
        f"static inline {v} {vector_name(helper, isa)}({v} x) {{",
        f"  const {v} z = {fma('x', c('1.44269504088896341f'), c(EXP16_MAGIC))};",
        f"  const {v} kf = {p('sub_ps', 'z', c(EXP16_MAGIC))};",
        f"  {v} r = {fma('kf', c('-' + LN2_HEAD16), 'x')};",
        f"  r = {fma('kf', c('-' + LN2_TAIL16), 'r')};",
        *table,
        f"  {v} q = {fma(c(EXP16_POLY[1] + 'f'), 'r', c(EXP16_POLY[0] + 'f'))};",
        f"  q = {fma('q', 'r', c('1.0f'))};",
        f"  const {v} q2 = {p('add_ps', 'th', fma(p('mul_ps', 'th', 'r'), 'q', 'tl'))};",
        *_vector_scale(isa, "q2", "kf", p("sub_epi32", zi, p("set1_epi32", EXP16_MAGIC_BITS)), 4),
        "  return y;",
        "}",
        "",
    ])


def _vector_sigmoid_text(isa: VecIsa) -> str:
    """``(x >= 0 ? 1 : e) / (1 + e)``, ``e = exp(-|x|)``: one division, no multiply after it."""
    v, p, c = isa.vt, isa.op, isa.set1
    return "\n".join([
        f"static inline {v} {vector_name(SIGMOID, isa)}({v} x) {{",
        f"  const {v} e = {vector_name(EXP_NONPOS, isa)}({isa.bits('x', 'or', SIGN_BIT)});  /* exp(-|x|) */",
        f"  const {v} num = {isa.select('x', p('setzero_ps'), '_CMP_GE_OQ', c('1.0f'), 'e')};",
        f"  return {p('div_ps', 'num', p('add_ps', c('1.0f'), 'e'))};",
        "}",
        "",
    ])


def _vector_sigmoid_tail_text(isa: VecIsa) -> str:
    """``opfuse_v16_sigmoidf`` after its ``exp(-|x|)``, given it: the blend and the division, the same operations
    (``simdchain``'s staged blocks compute ``e`` for a block of vectors first, then this)."""
    v, p, c = isa.vt, isa.op, isa.set1
    return "\n".join([
        f"static inline {v} {vector_name(SIGMOID_TAIL, isa)}({v} x, {v} e) {{  /* sigmoid(x), e = exp(-|x|) */",
        f"  const {v} num = {isa.select('x', p('setzero_ps'), '_CMP_GE_OQ', c('1.0f'), 'e')};",
        f"  return {p('div_ps', 'num', p('add_ps', c('1.0f'), 'e'))};",
        "}",
        "",
    ])


def silu_exp_argument(isa: VecIsa, x: str) -> str:
    """``-max(x, SILU_LOW)`` on ``isa``'s registers, the argument of silu's ``exp_nonpos``: the scalar's
    ``x < SILU_LOW ? SILU_LOW : x`` is ``maxps(SILU_LOW, x)`` (NaN kept: the second operand), then its sign
    flipped."""
    return isa.bits(isa.op("max_ps", isa.set1(f"{SILU_LOW:.1f}f"), x), "xor", SIGN_BIT)


def _vector_silu_text(isa: VecIsa) -> str:
    """``SILU_TEXT`` on ``isa``'s registers: ``x / (1 + exp_nonpos(-max(x, -89)))``, the same operations."""
    v, p, c = isa.vt, isa.op, isa.set1
    return "\n".join([
        f"static inline {v} {vector_name(SILU, isa)}({v} x) {{",
        f"  const {v} e = {vector_name(SILU_EXP, isa)}({silu_exp_argument(isa, 'x')});  /* exp(-max(x, -89)) */",
        f"  return {p('div_ps', 'x', p('add_ps', c('1.0f'), 'e'))};",
        "}",
        "",
    ])


def _vector_silu_tail_text(isa: VecIsa) -> str:
    """``opfuse_v16_siluf`` after its exp, given it (``simdchain``'s staged blocks compute ``e`` first)."""
    v, p, c = isa.vt, isa.op, isa.set1
    return "\n".join([
        f"static inline {v} {vector_name(SILU_TAIL, isa)}({v} x, {v} e) {{  /* silu(x), e = exp(-max(x, -89)) */",
        f"  return {p('div_ps', 'x', p('add_ps', c('1.0f'), 'e'))};",
        "}",
        "",
    ])


def _vector_tanh_text(isa: VecIsa) -> str:
    v, p, c = isa.vt, isa.op, isa.set1
    return "\n".join([
        f"static inline {v} {vector_name(TANH, isa)}({v} x) {{",
        f"  const {v} a = {isa.bits('x', 'and', ABS_BITS)};",
        f"  const {v} z = {p('mul_ps', 'x', 'x')};",
        *vector_horner(isa, "q", TANH_POLY, "z"),
        f"  const {v} small = {p('fmadd_ps', p('mul_ps', 'a', 'z'), 'q', 'a')};",
        f"  const {v} e = {vector_name(EXP_NONPOS, isa)}({p('mul_ps', c('-2.0f'), 'a')});",
        f"  const {v} big = {p('div_ps', p('sub_ps', c('1.0f'), 'e'), p('add_ps', c('1.0f'), 'e'))};",
        f"  const {v} m = {isa.select('a', c(f'{TANH_SMALL_END}f'), '_CMP_LT_OQ', 'small', 'big')};",
        f"  const {v} y = {isa.combine(isa.bits('m', 'and', ABS_BITS), 'or', isa.bits('x', 'and', SIGN_BIT))};"
        "  /* copysignf(m, x) */",
        f"  return {isa.select('x', 'x', '_CMP_UNORD_Q', 'x', 'y')};",
        "}",
        "",
    ])


def _vector_log_text(isa: VecIsa) -> str:
    """``LOG_TEXT`` on ``isa``'s registers, the same operations: the exponent ``e`` as the float of the bits' exponent
    field less 127, then less 23 for a subnormal and plus 1 for a mantissa past sqrt(2), where the scalar converts one
    integer (small integers: exact either way, so the same ``e``)."""
    v, p, c = isa.vt, isa.op, isa.set1
    fma = functools.partial(p, "fmadd_ps")
    tiny = c("0x1p-126f")
    bits = p("castps_" + isa.si, "xs")
    field = p("and_" + isa.si, p("srli_epi32", bits, "23"), p("set1_epi32", "0xff"))
    return "\n".join([
        f"static inline {v} {vector_name(LOG, isa)}({v} x) {{",
        f"  const {v} xs = {isa.select('x', tiny, '_CMP_LT_OQ', p('mul_ps', 'x', c('0x1p23f')), 'x')};",
        f"  const {v} mb = {isa.bits(isa.bits('xs', 'and', '0x007fffff'), 'or', '0x3f800000')};",
        f"  const {v} m = {isa.select('mb', c('1.41421356f'), '_CMP_GT_OQ', p('mul_ps', c('0.5f'), 'mb'), 'mb')};",
        f"  {v} e = {p('cvtepi32_ps', p('sub_epi32', field, p('set1_epi32', '127')))};",
        f"  e = {isa.select('x', tiny, '_CMP_LT_OQ', p('sub_ps', 'e', c('23.0f')), 'e')};",
        f"  e = {isa.select('mb', c('1.41421356f'), '_CMP_GT_OQ', p('add_ps', 'e', c('1.0f')), 'e')};",
        f"  const {v} f = {p('sub_ps', 'm', c('1.0f'))};",
        f"  const {v} z = {p('mul_ps', 'f', 'f')};",
        *vector_horner(isa, "q", LOG_POLY, "f"),
        f"  {v} y = {fma(p('mul_ps', 'f', 'z'), 'q', p('mul_ps', 'e', c(LN2_TAIL)))};",
        f"  y = {fma(c('-0.5f'), 'z', 'y')};",
        f"  const {v} r = {fma('e', c(LN2_HEAD), p('add_ps', 'f', 'y'))};",
        f"  const {v} pos = {isa.select('x', c('HUGE_VALF'), '_CMP_LT_OQ', 'r', 'x')};",
        f"  const {v} other = {isa.select('x', p('setzero_ps'), '_CMP_EQ_OQ', c('-HUGE_VALF'), c('NAN'))};",
        f"  return {isa.select('x', p('setzero_ps'), '_CMP_GT_OQ', 'pos', 'other')};",
        "}",
        "",
    ])


def _vector_softplus_text(isa: VecIsa) -> str:
    """``SOFTPLUS_TEXT`` on ``isa``'s registers: ``max(x, 0) + log1p(exp(-|x|))``, the same operations."""
    v, p, c = isa.vt, isa.op, isa.set1
    one = c("1.0f")
    log1p = p("mul_ps", f"{vector_name(LOG, isa)}(u)", p("div_ps", "t", p("sub_ps", "u", one)))
    return "\n".join([
        f"static inline {v} {vector_name(SOFTPLUS, isa)}({v} x) {{",
        f"  const {v} t = {vector_name(EXP_NONPOS, isa)}({isa.bits('x', 'or', SIGN_BIT)});  /* exp(-|x|) */",
        f"  const {v} u = {p('add_ps', one, 't')};",
        f"  const {v} l = {isa.select('u', one, '_CMP_EQ_OQ', 't', log1p)};",
        f"  const {v} y = {p('add_ps', isa.select('x', p('setzero_ps'), '_CMP_GT_OQ', 'x', p('setzero_ps')), 'l')};",
        f"  return {isa.select('x', 'x', '_CMP_UNORD_Q', 'x', 'y')};",
        "}",
        "",
    ])


# scalar helper name -> (the vector helpers it calls, its vector C text for an ISA)
VECTOR_HELPERS: dict[str, tuple[tuple[str, ...], Callable[[VecIsa], str]]] = {
    EXP: ((), lambda isa: _vector_exp_text(EXP, isa, True)),
    EXP_NONPOS: ((), lambda isa: _vector_exp_text(EXP_NONPOS, isa, False, EXP_LOW, EXP_NONPOS_SPLIT)),
    SILU_EXP: ((), lambda isa: _vector_exp_text(SILU_EXP, isa, False, SILU_EXP_LOW, SILU_EXP_SPLIT)),
    SIGMOID: ((EXP_NONPOS,), _vector_sigmoid_text),
    SIGMOID_TAIL: ((), _vector_sigmoid_tail_text),
    SILU: ((SILU_EXP,), _vector_silu_text),
    SILU_TAIL: ((), _vector_silu_tail_text),
    TANH: ((EXP_NONPOS,), _vector_tanh_text),
    LOG: ((), _vector_log_text),
    SOFTPLUS: ((EXP_NONPOS, LOG), _vector_softplus_text),
}


def require_vector(program, name: str, isa: VecIsa) -> str:
    """Add the vector form of helper ``name`` on ``isa`` (behind ``isa.guard``, after the helpers it calls) to
    ``program``, once; return its C name."""
    deps, text = VECTOR_HELPERS[name]
    if name in (EXP_NONPOS, SILU_EXP) and program.options.exp_table:  # the table's k1/k2 scale: any argument
        text = functools.partial(_vector_exp_nonpos_table_text, helper=name)
    for d in deps:
        require_vector(program, d, isa)
    key = vector_name(name, isa)
    require_immintrin(program)
    return program.require_helper(key, f"#if {isa.guard}\n{text(isa)}#endif\n")


def require_immintrin(program) -> None:
    """``#include <immintrin.h>`` where the target has AVX2 and FMA (every ISA of the vector forms), once."""
    program.require_helper("opfuse_immintrin", f"#if {AVX2_FLOAT.guard}\n#include <immintrin.h>\n#endif\n")
