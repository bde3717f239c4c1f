"""One rule per op: the C for one output element of an elementwise or data-movement op.

A rule is ``rule(ev, node, k, idx) -> str``: the C expression of output ``k`` of ``node``
at index ``idx``, built from ``ev.operand``/``ev.at`` of its inputs. Elementwise rules
compute; data-movement (injective) rules only map the index (``index.py``) and read their
input there. Rules are data: ``RULES`` maps op type to rule, and adding an op to the C
backend's inline set is adding one entry.

Every rule matches the NumPy reference (``opfuse.ops``) to float32 rounding: the same
formula, evaluated in the tensor's own type (the reference uses float64 and rounds once;
the difference is a few ulps, far inside rtol 1e-4).

No float32 rule calls libm for a transcendental function: exp, log, tanh, sigmoid,
softplus (``vecmath.py``) and erf (``erf.py``) are inline branch-free helpers, so every
elementwise loop, and every GEMM/conv tile epilogue, vectorises. float64 keeps libm. NaN
propagates as in NumPy: the max/min of Relu, HardSigmoid, Clip, Max and Min (and of MaxPool
and ReduceMax, through ``nan_max``) are written so that a NaN operand is the one selected
(``np.maximum(nan, 0)`` is NaN).

Measured float32 error against float64 NumPy (every 61st bit pattern of both signs, every
13th for the vecmath helpers, and a grid over [-110, 110]; ``tests/codegen/test_vecmath.py``
holds the bounds), in ulps of the result where it is normal:

    Relu 0, LeakyRelu 0.5, Exp 0.98, Log 0.82, Erf 0.95, Tanh 1.54, Softplus 2.76,
    Sigmoid 2.40, SiLU 3.2 (x >= -87.3; below, exp(x) is subnormal: |err| < 1e-43),
    HardSwish 1.55 (x >= 0), HardSigmoid 2.4 (x >= -2), Elu 1.16, Mish 3.56 (x >= -87),
    GELU (erf) 1.98 (x >= -1; ``gelu.py``), GELU (tanh) 2.4 (x >= 0), 14.6 (x >= -3).

(Sigmoid was 2.77 before its exp had its own polynomial and one division; on every 997th bit pattern the
change moved Sigmoid 2.62 -> 2.11 (2.28 plain C99) and SiLU 2.91 -> 3.03, GELU (tanh), Softplus and Mish
not at all.)

Below those ranges the float32 formula itself loses relative accuracy, not the helpers:
HardSigmoid/HardSwish round ``alpha x + beta`` near its zero (|err| <= 4.4e-8 |x|); GELU-erf's
Phi(-|x|) is good to 9.4e-9 absolute, |err| <= 1.9e-8 |x| below -1 (``0.5 x (1 + erf)`` cancelled:
4.9e-8 |x|; the C loops gcc vectorises by itself keep that erf form, 2.7 ulp for x >= -1, unless
``CodegenOptions.scalar_gelu_table``); GELU-tanh's ``z`` carries its float32 rounding times |2z| (|err| <= 8.6e-8 |x|).
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from opfuse.codegen.ctype import c_type, float_to_int_helper, highest, is_float, literal, lowest, math_fn
from opfuse.codegen import checks, half, vecmath
from opfuse.codegen.erf import require_erf
from opfuse.codegen.gelu import require_gelu
from opfuse.codegen.index import Index, add, depth_to_space_channel, inside_position, mod, mul
from opfuse.ir.dtypes import is_narrow_float
from opfuse.ir.graph import Node
from opfuse.ops.elementwise import clip_bounds
from opfuse.ops.registry import get_spec

Rule = Callable[..., str]
RULES: dict[str, Rule] = {}


def _attrs(node: Node) -> dict:
    return get_spec(node.op_type, node).attrs_of(node)


def _is_name(expr: str) -> bool:
    return expr.replace("_", "").isalnum() or _is_literal(expr)


def _is_literal(expr: str) -> bool:
    try:
        float.fromhex(expr.rstrip("f"))
        return True
    except ValueError:
        return expr.lstrip("-").isdigit()


def apply_rule(ev, node: Node, k: int, idx: Index) -> str:
    rule = RULES.get(node.op_type)
    if rule is None:
        raise ev.kc.error(f"op {node.op_type} (node '{node.name}') cannot be computed inside this kernel")
    expr = rule(ev, node, k, idx)
    if _is_name(expr):
        return expr
    return ev.assign(node.outputs[k], expr)


def let(ev, dtype, expr: str) -> str:
    """A temporary holding ``expr`` (so it is evaluated once even if written twice)."""
    if _is_name(expr):
        return expr
    name = ev.kc.tmp()
    ev.w.line(f"const {c_type(dtype)} {name} = {expr};")
    return name


def _register(*names):
    def deco(fn):
        for n in names:
            RULES[n] = fn
        return fn
    return deco


def _max(a: str, b: str) -> str:
    # The ternary (not fmaxf) is what vectorises to a max instruction without -ffast-math.
    return f"({a} > {b} ? {a} : {b})"


def _min(a: str, b: str) -> str:
    return f"({a} < {b} ? {a} : {b})"


def nan_max(a: str, b: str, dtype) -> str:
    """``np.maximum(a, b)``: NaN when either is (``a > b`` alone drops a NaN ``a``). Compares and
    selects only, so the loop still vectorises (gcc needs ``-fno-trapping-math`` for the unordered
    compare). Integers need no NaN test."""
    return f"({a} > {b} || {a} != {a} ? {a} : {b})" if is_float(dtype) else _max(a, b)


def nan_min(a: str, b: str, dtype) -> str:
    """``np.minimum(a, b)``, NaN when either is."""
    return f"({a} < {b} || {a} != {a} ? {a} : {b})" if is_float(dtype) else _min(a, b)


def _at_least(x: str, lo: str) -> str:
    """max(x, lo) that keeps a NaN ``x`` (as ``np.maximum``); vectorises like ``_max``."""
    return f"({x} < {lo} ? {lo} : {x})"


def _at_most(x: str, hi: str) -> str:
    """min(x, hi) that keeps a NaN ``x`` (as ``np.minimum``)."""
    return f"({x} > {hi} ? {hi} : {x})"


# Unary elementwise ----------------------------------------------------------------------
def _unary(name: str, fn: Callable[[object, str, np.dtype, dict], str]):
    def rule(ev, node, k, idx):
        x = ev.operand(node, 0, idx)
        return fn(ev, x, node.outputs[0].dtype, _attrs(node))
    RULES[name] = rule


def _L(v, dt) -> str:
    return literal(v, dt)


def _f32(dt) -> bool:
    return np.dtype(dt) == np.float32


def _vec(ev, dt, helper: str, libm: str) -> str:
    """The C function for ``dt``: the inline vectorisable helper for float, libm's for double."""
    return vecmath.require(ev.kc.program, helper) if _f32(dt) else math_fn(libm, dt)


def _neg(x: str) -> str:
    """``-x`` in C: a negative literal operand (a constant folded in, a Concat's constant piece) in parentheses,
    since ``--0x1.5d0ad2p-2`` is a decrement (fuzz seed 41215: Sigmoid of a Concat's constant in float64)."""
    return f"-({x})" if x.lstrip().startswith("-") else f"-{x}"


def _sigmoid(ev, x, dt, a):
    if _f32(dt):
        return f"{vecmath.require(ev.kc.program, vecmath.SIGMOID)}({x})"
    return f"{_L(1, dt)} / ({_L(1, dt)} + {math_fn('exp', dt)}({_neg(x)}))"


def _silu(ev, x, dt, a):
    if _f32(dt) and ev.kc.program.options.silu_direct:  # x / (1 + exp(-x)): CodegenOptions.silu_direct
        return f"{vecmath.require(ev.kc.program, vecmath.SILU)}({x})"
    if _f32(dt):
        return f"{x} * {vecmath.require(ev.kc.program, vecmath.SIGMOID)}({x})"
    return f"{x} / ({_L(1, dt)} + {math_fn('exp', dt)}({_neg(x)}))"


def _erf(ev, dt) -> str:
    """The C erf for ``dt``: the inline vectorisable helper for float, libm's for double."""
    return require_erf(ev.kc.program) if _f32(dt) else math_fn("erf", dt)


def _gelu(ev, x, dt, a):
    if a["approximate"] == "tanh":
        x3 = let(ev, dt, f"{x} * {x} * {x}")
        if _f32(dt):
            # 0.5 (1 + tanh(z)) = sigmoid(2z): no cancellation where tanh(z) is near -1.
            z2 = f"{_L(2 * math.sqrt(2 / math.pi), dt)} * ({x} + {_L(0.044715, dt)} * {x3})"
            return f"{x} * {vecmath.require(ev.kc.program, vecmath.SIGMOID)}({z2})"
        inner = f"{_L(math.sqrt(2 / math.pi), dt)} * ({x} + {_L(0.044715, dt)} * {x3})"
        return f"{_L(0.5, dt)} * {x} * ({_L(1, dt)} + {math_fn('tanh', dt)}({inner}))"
    if _f32(dt) and (ev.vector_twin or ev.kc.program.options.scalar_gelu_table):
        # x Phi(x) by one piecewise polynomial looked up by interval (``gelu.py``; the vector forms' bits), not erf's
        # three. A C compiler's vectoriser would read its table lane by lane, so the loops it vectorises keep the erf
        # form (``CodegenOptions.scalar_gelu_table``; the two within 2.7 ulp of each other).
        return f"{require_gelu(ev.kc.program)}({x})"
    return f"{_L(0.5, dt)} * {x} * ({_L(1, dt)} + {_erf(ev, dt)}({x} * {_L(1 / math.sqrt(2), dt)}))"


def _hardsigmoid(ev, x, dt, alpha, beta):
    t = let(ev, dt, f"{_L(alpha, dt)} * {x} + {_L(beta, dt)}")
    return _at_most(let(ev, dt, _at_least(t, _L(0, dt))), _L(1, dt))


def _softplus(ev, x, dt, a):
    if _f32(dt):
        return f"{vecmath.require(ev.kc.program, vecmath.SOFTPLUS)}({x})"
    pos = _max(x, _L(0, dt))
    return f"{pos} + {math_fn('log1p', dt)}({math_fn('exp', dt)}(-{math_fn('fabs', dt)}({x})))"


def _abs(ev, x, dt, a):
    return f"{math_fn('fabs', dt)}({x})" if is_float(dt) else f"({x} < 0 ? {_neg(x)} : {x})"


def relu(x: str, dt) -> str:
    """max(x, 0), NaN kept (as ``np.maximum``)."""
    return _at_least(x, _L(0, dt))


_unary("Relu", lambda ev, x, dt, a: relu(x, dt))
_unary("LeakyRelu", lambda ev, x, dt, a: f"({x} >= {_L(0, dt)} ? {x} : {x} * {_L(a['alpha'], dt)})")
_unary("Sigmoid", _sigmoid)
_unary("HardSigmoid", lambda ev, x, dt, a: _hardsigmoid(ev, x, dt, a["alpha"], a["beta"]))
_unary("HardSwish", lambda ev, x, dt, a: f"{x} * {let(ev, dt, _hardsigmoid(ev, x, dt, 1 / 6, 0.5))}")
_unary("Tanh", lambda ev, x, dt, a: f"{_vec(ev, dt, vecmath.TANH, 'tanh')}({x})")
_unary("Gelu", _gelu)
_unary("Softplus", _softplus)
_unary("Silu", _silu)
_unary("Erf", lambda ev, x, dt, a: f"{_erf(ev, dt)}({x})")
_unary("Exp", lambda ev, x, dt, a: f"{_vec(ev, dt, vecmath.EXP, 'exp')}({x})")
_unary("Log", lambda ev, x, dt, a: f"{_vec(ev, dt, vecmath.LOG, 'log')}({x})")
_unary("Sqrt", lambda ev, x, dt, a: f"{math_fn('sqrt', dt)}({x})")
_unary("Neg", lambda ev, x, dt, a: _neg(x))
_unary("Abs", _abs)
_unary("Reciprocal", lambda ev, x, dt, a: f"{_L(1, dt)} / {x}")


@_register("Identity")
def _identity(ev, node, k, idx):
    return ev.operand(node, 0, idx)


@_register("Dropout")
def _dropout(ev, node, k, idx):
    return ev.operand(node, 0, idx) if k == 0 else "1"


@_register("Cast")
def _cast(ev, node, k, idx):
    src, dst = node.input(0).dtype, node.outputs[0].dtype
    trip = half.round_trip_expr(ev.kc.program, node, ev.inline) if is_narrow_float(src) else None
    if trip is not None:  # float32 -> 16 bits -> float32: one helper, no 16-bit lanes in the loop
        return f"{trip[1]}({ev.at(trip[0], idx.broadcast_to(trip[0].shape))})"
    x = ev.operand(node, 0, idx)
    if is_narrow_float(src) or is_narrow_float(dst):
        return half.cast_expr(ev.kc.program, x, src, dst, saturate=bool(int(_attrs(node)["saturate"])))
    if dst == np.bool_:
        return f"({x} != 0)"
    if is_float(src) and np.dtype(dst).kind in "iu":
        return f"{float_to_int_helper(ev.kc.program, src, dst, _clipped_into(node.input(0), dst))}({x})"
    return f"({c_type(dst)})({x})" if src != dst else x


def _clipped_into(v, dst) -> bool:
    """Whether ``v`` is a Clip's output whose constant bounds (inputs or attributes, ``clip_bounds``) lie
    inside integer type ``dst``'s range (a QuantizeLinear's): every value of it but NaN converts to ``dst``
    without saturating."""
    clip = v.producer
    if clip is None or clip.op_type != "Clip" or any(b is not None and b.const is None for b in clip.inputs[1:]):
        return False
    bounds = clip_bounds([None] + [None if b is None else b.const for b in clip.inputs[1:]], _attrs(clip))
    if any(b is None or np.size(b) != 1 for b in bounds):
        return False
    info = np.iinfo(dst)
    lo, hi = (float(np.asarray(b).reshape(-1)[0]) for b in bounds)
    return info.min <= lo and hi <= info.max


@_register("Clip")
def _clip(ev, node, k, idx):
    a = _attrs(node)
    dt = node.outputs[0].dtype
    y = ev.operand(node, 0, idx)
    bounds = []
    for i, attr in ((1, "min"), (2, "max")):
        v = node.inputs[i] if len(node.inputs) > i else None
        if v is not None:
            bounds.append(ev.at(v, Index((), ()) if v.shape == () else Index.linear(v.shape, "0")))
        elif a.get(attr) is not None:
            bounds.append(_L(a[attr], dt))
        else:
            bounds.append(None)
    lo, hi = bounds
    # A NaN x stays NaN; a bound read at run time may be NaN too (np.maximum(x, nan) is NaN).
    if lo is not None:
        y = let(ev, dt, _at_least(y, lo) if _is_literal(lo) else nan_max(lo, y, dt))
    if hi is not None:
        y = _at_most(y, hi) if _is_literal(hi) else nan_min(hi, y, dt)
    return y


REQUANTIZE_HELPER = "opfuse_requantize"
REQUANTIZE_C = """
/* clamp(round_half_even(acc * mult / 2^shift) + zp, lo, hi), exact in int64 (opfuse.ops.quantized);
   no shift of a negative value (implementation-defined or undefined in C99), no division, no branch. */
static inline int32_t opfuse_requantize(int32_t acc, int32_t mult, int32_t shift, int32_t zp, int32_t lo,
                                        int32_t hi) {
  const int64_t p = (int64_t)acc * (int64_t)mult;
  /* p + 2^63 as unsigned (no shift of a negative value): floor(p / 2^shift) and p mod 2^shift */
  const uint64_t u = (uint64_t)p + ((uint64_t)1 << 63);
  const uint64_t r = u & (((uint64_t)1 << shift) - 1u);
  const uint64_t qu = u >> shift;
  const int64_t q0 = (int64_t)(qu - ((uint64_t)1 << (63 - shift)));
  const uint64_t half = (uint64_t)1 << (shift - 1);
  const int64_t q = q0 + (int64_t)((r > half) | ((r == half) & (qu & 1u))) + zp;
  return (int32_t)(q < lo ? lo : (q > hi ? hi : q));
}
"""


REQUANTIZE_RESIDUAL_HELPER = "opfuse_requantize_residual"
REQUANTIZE_RESIDUAL_C = """
/* clamp(round_half_even((acc * mult + res * rmult) / 2^shift) + zp, lo, hi), exact in int64
   (opfuse.ops.quantized: both products and their sum stay below 2^62). */
static inline int32_t opfuse_requantize_residual(int32_t acc, int32_t mult, int32_t shift, int32_t res,
                                                 int64_t rmult, int32_t zp, int32_t lo, int32_t hi) {
  const int64_t p = (int64_t)acc * (int64_t)mult + (int64_t)res * rmult;
  /* p + 2^63 as unsigned (no shift of a negative value): floor(p / 2^shift) and p mod 2^shift */
  const uint64_t u = (uint64_t)p + ((uint64_t)1 << 63);
  const uint64_t r = u & (((uint64_t)1 << shift) - 1u);
  const uint64_t qu = u >> shift;
  const int64_t q0 = (int64_t)(qu - ((uint64_t)1 << (63 - shift)));
  const uint64_t half = (uint64_t)1 << (shift - 1);
  const int64_t q = q0 + (int64_t)((r > half) | ((r == half) & (qu & 1u))) + zp;
  return (int32_t)(q < lo ? lo : (q > hi ? hi : q));
}
"""


# Per-channel shifts known at build time: the shift's powers of two come in precomputed
# (``half = 2^(shift-1)``, ``bias = 2^(63-shift)``), so that an element pays one variable 64-bit
# shift instead of four. A loop over elements of one channel hoists those powers itself (the
# unfused Requantize kernel); a fused conv epilogue walks the channels innermost and cannot.
REQUANTIZE_PC_HELPER = "opfuse_requantize_pc"
REQUANTIZE_PC_C = """
/* opfuse_requantize with half = 2^(shift - 1) and bias = 2^(63 - shift) given (constant per channel):
   the same arithmetic, bit for bit. */
static inline int32_t opfuse_requantize_pc(int64_t p, int32_t shift, uint64_t half, uint64_t bias, int32_t zp,
                                           int32_t lo, int32_t hi) {
  const uint64_t u = (uint64_t)p + ((uint64_t)1 << 63);
  const uint64_t r = u & (half + (half - 1u));
  const uint64_t qu = u >> shift;
  const int64_t q = (int64_t)(qu - bias) + (int64_t)((r > half) | ((r == half) & (qu & 1u))) + zp;
  return (int32_t)(q < lo ? lo : (q > hi ? hi : q));
}
"""


# Every shift known at build time and in [33, 62] (multipliers below 1/4, the usual case): the
# rounding reads only the product's high word. With ``u = p + 2^63 = H * 2^32 + L`` (no shift of a
# negative value), ``s`` the shift, ``t = s - 32`` and ``b`` bit ``s`` of ``u`` (the parity of
# ``floor(p / 2^s)``), round half to even is ``floor((u + 2^(s-1) - 1 + b) / 2^s) - 2^(63-s)``
# (remainder below half: the floor; above: one more; a tie: one more exactly when ``b``), and the
# floor's high word is ``(H + 2^(t-1) - 1 + (b | L != 0)) >> t`` (the low word's carry: ``L + 2^32 - 1``
# carries unless ``L`` is 0; with ``b`` the low part of the addend is 0): 32-bit arithmetic, no 64-bit
# variable shift, about half the instructions of comparing the remainder with half (emulated M7). No
# overflow: ``|p| < 2^62`` (a 32-bit accumulator times a 31-bit multiplier, or the residual sum below
# 2^62), so ``H < 3 * 2^30``.
REQUANTIZE_HI_HELPER = "opfuse_requantize_hi"
REQUANTIZE_HI_MIN_SHIFT = 33
REQUANTIZE_HI_C = """
/* opfuse_requantize for p = acc * mult (+ res * rmult), |p| < 2^62, and shift in [33, 62]: the same
   result, bit for bit, from the high and low words of p + 2^63 (codegen/rules.py). */
static inline int32_t opfuse_requantize_hi(int64_t p, int32_t shift, int32_t zp, int32_t lo, int32_t hi) {
  const uint64_t u = (uint64_t)p + ((uint64_t)1 << 63);
  const uint32_t H = (uint32_t)(u >> 32), L = (uint32_t)u;
  const int32_t t = shift - 32;
  const uint32_t up = ((H >> t) & 1u) | (uint32_t)(L != 0u);
  const uint32_t qu = (H + (((uint32_t)1 << (t - 1)) - 1u) + up) >> t;
  const int32_t q = (int32_t)qu - ((int32_t)1 << (31 - t)) + zp;
  return q < lo ? lo : (q > hi ? hi : q);
}
"""


# The clamp of an 8-bit result to its type's whole range (what Requantize's lo/hi are without an
# activation, and the upper bound with a ReLU): one SSAT / USAT on an Arm core with the saturating
# instructions (ACLE's ``__ssat``/``__usat``: the Cortex-M7). gcc finds it from the two compares alone
# only where neither bound is a register already (in a conv's output loop it keeps the zero point,
# often -128, in one and compares against it: six instructions instead of one, emulated M7).
SAT8_HELPER = "opfuse_sat8"
SAT8_C = """
#if defined(__ARM_FEATURE_SAT)
#include <arm_acle.h>
#endif
/* q clamped to [-128, 127] (opfuse_sat_s8) or [0, 255] (opfuse_sat_u8): SSAT / USAT where the core has them. */
static inline int32_t opfuse_sat_s8(int32_t q) {
#if defined(__ARM_FEATURE_SAT)
  return __ssat(q, 8);
#else
  return q < -128 ? -128 : (q > 127 ? 127 : q);
#endif
}
static inline int32_t opfuse_sat_u8(int32_t q) {
#if defined(__ARM_FEATURE_SAT)
  return (int32_t)__usat(q, 8);
#else
  return q < 0 ? 0 : (q > 255 ? 255 : q);
#endif
}
"""
INT32_RANGE = "-2147483647 - 1, 2147483647)"  # a clamp that is none (the compiler drops it)


def _saturated(ev, dtype: np.dtype, lo: int, hi: int, call: str) -> str | None:
    """``call`` (an int32 requantized value, unclamped) clamped to ``[lo, hi]`` through ``opfuse_sat_s8``/``_u8``
    when ``hi`` is the 8-bit type's maximum and ``lo`` at least its minimum (a ReLU's bound: one compare more)."""
    kind = {np.dtype(np.int8): ("s8", -128, 127), np.dtype(np.uint8): ("u8", 0, 255)}.get(np.dtype(dtype))
    if kind is None or hi != kind[2] or lo < kind[1]:
        return None
    ev.kc.program.require_helper(SAT8_HELPER, SAT8_C)
    y = f"opfuse_sat_{kind[0]}({call})"
    if lo > kind[1]:
        y = f"opfuse_max_i32({y}, {lo})"
        ev.kc.program.require_helper("opfuse_max_i32", MAX_I32_C)
    return y


MAX_I32_C = """
static inline int32_t opfuse_max_i32(int32_t a, int32_t b) { return a < b ? b : a; }
"""


def _high_word_shift(ev, node) -> bool:
    """``node``'s shift is known at build time and every element lies in [33, 62]."""
    arr = ev.static.get(id(node.input(2)))
    return arr is not None and arr.size > 0 and int(arr.min()) >= REQUANTIZE_HI_MIN_SHIFT and int(arr.max()) <= 62


def _shift_powers(ev, node, idx) -> tuple[str, str] | None:
    """``(half, bias)`` C expressions for ``node``'s static per-channel shift at ``idx`` (None: a scalar
    shift, which the compiler folds anyway, or a shift not known at build time or out of range)."""
    shift = node.input(2)
    arr = ev.static.get(id(shift))
    if arr is None or arr.size == 1:
        return None
    s = arr.astype(np.int64)
    if s.min() < 1 or s.max() > 62:  # the reference refuses it; keep the plain helper's behaviour
        return None
    one = np.uint64(1)
    halves = np.left_shift(one, (s - 1).astype(np.uint64))
    biases = np.left_shift(one, (63 - s).astype(np.uint64))
    off = idx.broadcast_to(shift.shape).offset()
    hp = ev.kc.const_array(("requantize_half", node.name), halves, f"{shift.name}_half", np.uint64)
    bp = ev.kc.const_array(("requantize_bias", node.name), biases, f"{shift.name}_bias", np.uint64)
    return f"{hp}[{off}]", f"{bp}[{off}]"


@_register("Requantize")
def _requantize(ev, node, k, idx):
    a = _attrs(node)
    tail = f"{int(a['zero_point'])}, {int(a['lo'])}, {int(a['hi'])})"
    high = _high_word_shift(ev, node)
    powers = None if high else _shift_powers(ev, node, idx)
    if high or powers is not None:
        acc, mult, shift = (ev.operand(node, i, idx) for i in range(3))
        p = f"(int64_t){acc} * (int64_t){mult}"
        if len(node.input_values()) == 5:
            res, rmult = ev.operand(node, 3, idx), ev.operand(node, 4, idx)
            p += f" + (int64_t){res} * {rmult}"
        if powers is None:
            fn = ev.kc.program.require_helper(REQUANTIZE_HI_HELPER, REQUANTIZE_HI_C)
            sat = _saturated(ev, node.outputs[0].dtype, int(a["lo"]), int(a["hi"]),
                             f"{fn}({p}, {shift}, {int(a['zero_point'])}, {INT32_RANGE}")
            if sat is not None:
                return f"({c_type(node.outputs[0].dtype)}){sat}"
            return f"({c_type(node.outputs[0].dtype)}){fn}({p}, {shift}, {tail}"
        fn = ev.kc.program.require_helper(REQUANTIZE_PC_HELPER, REQUANTIZE_PC_C)
        return f"({c_type(node.outputs[0].dtype)}){fn}({p}, {shift}, {powers[0]}, {powers[1]}, {tail}"
    if len(node.input_values()) == 5:
        acc, mult, shift, res, rmult = (ev.operand(node, i, idx) for i in range(5))
        fn = ev.kc.program.require_helper(REQUANTIZE_RESIDUAL_HELPER, REQUANTIZE_RESIDUAL_C)
        return f"({c_type(node.outputs[0].dtype)}){fn}({acc}, {mult}, {shift}, {res}, {rmult}, {tail}"
    acc, mult, shift = (ev.operand(node, i, idx) for i in range(3))
    fn = ev.kc.program.require_helper(REQUANTIZE_HELPER, REQUANTIZE_C)
    return f"({c_type(node.outputs[0].dtype)}){fn}({acc}, {mult}, {shift}, {tail}"


# Binary / n-ary ----------------------------------------------------------------------------
def _binary(name: str, fmt: Callable[[str, str], str]):
    """``name``'s rule: ``fmt`` of its two operands' C expressions (the same text for every dtype)."""
    def rule(ev, node, k, idx):
        return fmt(ev.operand(node, 0, idx), ev.operand(node, 1, idx))
    RULES[name] = rule


_binary("Add", lambda a, b: f"{a} + {b}")
_binary("Sub", lambda a, b: f"{a} - {b}")
_binary("Mul", lambda a, b: f"{a} * {b}")


@_register("Div")
def _div(ev, node, k, idx):
    a, b = ev.operand(node, 0, idx), ev.operand(node, 1, idx)
    # Integers: never trap (INT_MIN / -1 wraps, a zero divisor faults as in the reference).
    return f"{a} / {b}" if is_float(node.input(0).dtype) else checks.div(ev, node, a, b)


_binary("Equal", lambda a, b: f"({a} == {b})")


@_register("Pow")
def _pow(ev, node, k, idx):
    dt = node.outputs[0].dtype
    base = ev.operand(node, 0, idx)
    e = node.input(1)
    arr = ev.static.get(id(e))
    if arr is not None and arr.size == 1 and is_float(dt):
        p = float(arr.reshape(-1)[0])
        if p == 1.0:
            return base
        if p == 2.0:
            return f"{base} * {base}"
        if p == 0.5:
            return f"{math_fn('sqrt', dt)}({base})"
    ex = ev.operand(node, 1, idx)
    if is_float(dt):
        return f"{math_fn('pow', dt)}({base}, ({c_type(dt)}){ex})"
    if is_float(e.dtype):
        return f"({c_type(dt)})pow((double){base}, (double){ex})"
    # Integers: exact, wrapping like the type (pow() in double is neither above 2^53); a negative
    # exponent truncates the real power, and 0 to a negative power faults, as in the reference.
    checks.check_here(ev, node, base, ex)  # unless checked whole before the loops (prechecks)
    ev.kc.program.require_helper(IPOW, IPOW_C)  # defines IPOW_U and IPOW
    if np.dtype(e.dtype).kind == "u":  # never negative; a uint64 exponent above 2^63 is no int64
        return f"({c_type(dt)}){IPOW_U}((uint64_t){base}, (uint64_t){ex})"
    return f"({c_type(dt)}){IPOW}((int64_t){base}, (int64_t){ex})"


IPOW, IPOW_U = "opfuse_ipow", "opfuse_ipow_u"
IPOW_C = f"""\
/* base ** e for integers, modulo 2^64 (exact before the caller's cast to a narrower type); for
   e < 0 the real power truncated: 1 for base 1, +-1 for base -1, 0 otherwise. */
static uint64_t {IPOW_U}(uint64_t b, uint64_t e) {{
  uint64_t r = 1;
  for (; e > 0; e >>= 1) {{
    if (e & 1) r *= b;
    b *= b;
  }}
  return r;
}}
static int64_t {IPOW}(int64_t base, int64_t e) {{
  if (e < 0) return base == 1 ? 1 : base == -1 ? ((e & 1) ? -1 : 1) : 0;
  return (int64_t){IPOW_U}((uint64_t)base, (uint64_t)e);
}}
"""


def _fold(fn):
    def rule(ev, node, k, idx):
        dt = node.outputs[0].dtype
        acc = ev.operand(node, 0, idx)
        for i in range(1, len(node.input_values())):
            acc = let(ev, dt, fn(acc, ev.operand(node, i, idx), dt))
        return acc
    return rule


RULES["Max"] = _fold(nan_max)
RULES["Min"] = _fold(nan_min)
RULES["Sum"] = _fold(lambda a, b, dt: f"{a} + {b}")


@_register("Where")
def _where(ev, node, k, idx):
    c = ev.operand(node, 0, idx)
    x = ev.operand(node, 1, idx)
    y = ev.operand(node, 2, idx)
    return f"({c} ? {x} : {y})"


@_register("BatchNormalization")
def _batchnorm(ev, node, k, idx):
    """y = x * s + t per channel (axis 1), s = scale / sqrt(var + eps), t = bias - mean * s.

    With constant statistics, s and t are folded at build time (in float64, rounded once)
    into arrays shaped (C, 1, ..., 1) that broadcast like any operand."""
    x = ev.operand(node, 0, idx)
    dt = node.outputs[0].dtype
    eps = _attrs(node)["epsilon"]
    rank = len(node.input(0).shape)
    params = node.inputs[1:5]
    cshape = (node.input(0).shape[1],) + (1,) * (rank - 2)
    if all(id(p) in ev.static for p in params):
        scale, bias, mean, var = (ev.static[id(p)].astype(np.float64) for p in params)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # IEEE, as the reference
            s = scale / np.sqrt(var + eps)
            t = bias - mean * s
        sub = idx.broadcast_to(cshape)
        sp = ev.kc.const_array(("bn_scale", node.name), s.reshape(cshape), node.name + "_s", dt)
        tp = ev.kc.const_array(("bn_shift", node.name), t.reshape(cshape), node.name + "_t", dt)
        s_v = let(ev, dt, f"{sp}[{sub.offset()}]")
        t_v = let(ev, dt, f"{tp}[{sub.offset()}]")
        return f"{x} * {s_v} + {t_v}"
    ch = Index((cshape[0],), (idx.dims[1],))
    sc, bi, mu, va = (ev.at(p, ch) for p in params)
    s = let(ev, dt, f"{sc} / {math_fn('sqrt', dt)}({va} + {_L(eps, dt)})")
    return f"({x} - {mu}) * {s} + {bi}"


# Data movement: index maps -----------------------------------------------------------------
@_register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(ev, node, k, idx):
    x = node.input(0)
    return ev.at(x, idx.reshape_to(x.shape))


@_register("Expand")
def _expand(ev, node, k, idx):
    return ev.operand(node, 0, idx)


@_register("Transpose")
def _transpose(ev, node, k, idx):
    x = node.input(0)
    perm = _attrs(node)["perm"]
    perm = tuple(range(len(x.shape)))[::-1] if perm is None else tuple(int(p) for p in perm)
    return ev.at(x, idx.transpose_from(perm, x.shape))


@_register("Slice")
def _slice(ev, node, k, idx):
    from opfuse.ops.shape_ops import slice_index
    x = node.input(0)
    cur = idx
    for axis, sl in enumerate(slice_index(node)):
        start, _, step = sl.indices(x.shape[axis])
        if (start, step) == (0, 1) and x.shape[axis] == idx.shape[axis]:
            continue
        shape = list(cur.shape)
        shape[axis] = x.shape[axis]
        expr = add(mul(cur.dims[axis], step), str(start))
        cur = cur.with_axis(axis, expr, shape, shift=start if step == 1 else None)
    return ev.at(x, cur)


@_register("Split")
def _split(ev, node, k, idx):
    from opfuse.ops.shape_ops import split_sizes
    x = node.input(0)
    axis, sizes = split_sizes(node, _attrs(node))
    off = sum(sizes[:k])
    return ev.at(x, idx.with_axis(axis, add(idx.dims[axis], str(off)), x.shape, shift=off))


@_register("Gather")
def _gather(ev, node, k, idx):
    data, ind = node.input(0), node.input(1)
    axis = _attrs(node)["axis"]
    axis = axis + len(data.shape) if axis < 0 else axis
    r = len(ind.shape)
    dim = data.shape[axis]
    ind_idx = Index(tuple(ind.shape), idx.dims[axis:axis + r])
    arr = ev.static.get(id(ind))
    if arr is not None:
        norm = np.where(arr < 0, arr + dim, arr).astype(np.int64)
        if norm.size == 1:
            g = str(int(norm.reshape(-1)[0]))
        else:
            p = ev.kc.const_array(("gather_idx", node.name), norm, node.name + "_idx", np.int64)
            g = let(ev, np.int64, f"{p}[{ind_idx.offset()}]")
    else:
        raw = ev.at(ind, ind_idx)
        checks.check_here(ev, node, raw)  # an index out of range faults, as in the reference ...
        # ... and is clamped meanwhile: a bad index must never read outside the tensor.
        g0 = let(ev, np.int64, f"(int64_t)({raw} < 0 ? {raw} + {dim} : {raw})")
        g = let(ev, np.int64, f"({g0} < 0 ? 0 : ({g0} >= {dim} ? {dim - 1} : {g0}))")
    dims = idx.dims[:axis] + (g,) + idx.dims[axis + r:]
    return ev.at(data, Index(tuple(data.shape), dims))


@_register("Concat")
def _concat(ev, node, k, idx):
    """The input whose slice holds the element: known from the index or the loop (``concat_split``: no
    select at all), else every input read at a position inside it (``index.inside_position``) and the
    right one selected. Not a branch between loads: gcc 12.2 -O3 -march=native computed zeros for the
    arm whose index is shifted by the loop variable, with AVX2 as with AVX-512 (fuzz seeds 5 and 41214, a
    Concat of an input with itself into an Abs or a Clip; tests/e2e/repro/gcc12_avx512_concat_select); a
    position inside any input is one its own slice also reads."""
    out = node.outputs[0]
    axis = _attrs(node)["axis"]
    axis = axis + len(out.shape) if axis < 0 else axis
    d = idx.dims[axis]
    pieces, start = [], 0
    for v in node.input_values():
        pieces.append((v, start, start + v.shape[axis]))
        start += v.shape[axis]

    def at_piece(v, lo):
        return ev.at(v, idx.with_axis(axis, add(d, str(-lo)), v.shape, shift=-lo))

    if d.lstrip("-").isdigit():  # the axis index is known: no branch
        for v, lo, hi in pieces:
            if lo <= int(d) < hi:
                return at_piece(v, lo)
    span = getattr(ev.kc, "loop_ranges", {}).get(d)
    if span is not None:  # a loop over one input's slice only (``concat_split``): no branch
        for v, lo, hi in pieces:
            if lo <= span[0] and span[1] <= hi:
                return at_piece(v, lo)
    values = []
    for v, lo, hi in pieces:
        pos = let(ev, np.int64, inside_position(add(d, str(-lo)), hi - lo))
        values.append(let(ev, out.dtype, ev.at(v, idx.with_axis(axis, pos, v.shape))))  # clamped: no run shifts
    res = values[-1]
    for (_, _, hi), value in zip(reversed(pieces[:-1]), reversed(values[:-1]), strict=True):
        res = f"({d} < {hi} ? {value} : {res})"
    return let(ev, out.dtype, res)


@_register("Pad")
def _pad(ev, node, k, idx):
    from opfuse.ops.shape_ops import pad_widths
    x = node.input(0)
    mode = _attrs(node)["mode"]
    dt = node.outputs[0].dtype
    widths = pad_widths(node)
    dims, conds = [], []
    for axis, (b, e) in enumerate(widths):
        L = x.shape[axis]
        crop_lo = max(0, -b)
        length = L - crop_lo - max(0, -e)  # extent of the cropped input
        c = add(idx.dims[axis], str(-max(0, b)))  # coordinate in the cropped input
        if b <= 0 and e <= 0:
            dims.append(add(c, str(crop_lo)))
            continue
        if mode == "constant":  # read at a position inside, select the fill outside (below)
            cc = let(ev, np.int64, f"(long)({c})")
            conds.append(f"{cc} >= 0 && {cc} < {length}")
            dims.append(add(inside_position(cc, length), str(crop_lo)))
        elif mode == "edge":
            cc = let(ev, np.int64, f"(long)({c})")
            dims.append(add(f"({cc} < 0 ? 0 : ({cc} >= {length} ? {length - 1} : {cc}))", str(crop_lo)))
        elif mode == "wrap":
            dims.append(add(f"((({c}) % {length} + {length}) % {length})", str(crop_lo)))
        else:  # reflect (mirror without repeating the edge), any number of periods
            if length == 1:
                dims.append(str(crop_lo))
                continue
            period = 2 * (length - 1)
            m = let(ev, np.int64, f"((long)({c}) % {period} + {period}) % {period}")
            dims.append(add(f"({m} < {length} ? {m} : {period} - {m})", str(crop_lo)))
    src = Index(tuple(x.shape), tuple(dims))
    if not conds:
        return ev.at(x, src)
    fill = "0"
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        v = node.input(2)
        fill = ev.at(v, Index.linear(v.shape, "0")) if v.shape else ev.at(v, Index((), ()))
    # No load under a condition: gcc 12.2 -O3 -fwrapv vectorised the guarded form (``if (inside) pad = x[..]``)
    # into masked gathers that returned other memory for some lanes (a 1x6x2x1 -> 3x9x3x1 Pad: 2 of 81 values,
    # e.g. 2.0e-320; found by ``opfuse fuzz``, tests/e2e/test_fuzz_findings.py). The input is read at a
    # position inside it (``index.inside_position``), and the fill selected where the output is outside.
    value = let(ev, dt, ev.at(x, src))  # a statement of its own: in the select's arm it would be conditional
    return let(ev, dt, f"(({' && '.join(conds)}) ? {value} : ({c_type(dt)}){fill})")


@_register("Resize")
def _resize(ev, node, k, idx):
    from opfuse.codegen.resize import resize_rule
    return resize_rule(ev, node, idx)


@_register("AffineGrid")
def _affine_grid(ev, node, k, idx):
    """``grid[n, ..., i] = theta[n, i, :] . (x, y, [z,] 1)`` with the base coordinates of the element's
    position from constant tables (``opfuse.ops.sampling.base_coordinates``), in double."""
    from opfuse.ops.sampling import affine_size, base_coordinates
    theta, out = node.input(0), node.outputs[0]
    align = bool(int(_attrs(node)["align_corners"]))
    spatial = affine_size(node)[2:]
    d = len(spatial)
    n, pos, i = idx.dims[0], idx.dims[1:1 + d], idx.dims[-1]
    terms = []
    for j in range(d + 1):
        t = ev.at(theta, Index(tuple(theta.shape), (n, i, str(j))))
        if j == d:
            terms.append(f"(double){t}")
            continue
        axis = d - 1 - j  # x runs along the last spatial axis
        table = ev.kc.const_array(("affine_base", spatial[axis], align), base_coordinates(spatial[axis], align),
                                  f"{node.name}_base{axis}", np.float64)
        terms.append(f"(double){t} * {table}[{pos[axis]}]")
    return f"({c_type(out.dtype)})({' + '.join(terms)})"


# Issue 12's elementwise ops ------------------------------------------------------------------
# Branch-free like the ones above: the exponential tails use the vectorised expm1/exp, rounding
# to an integer is the "add and subtract 1.5 * 2^(p-1)" trick (exact, round-half-even under the
# default rounding mode), comparisons and logic are 0/1 bytes combined with bitwise operators.
# Sin, Cos, Floor, Ceil and fmod call libm (gcc inlines floor/ceil as one instruction on x86).

def _expm1(ev, dt, x: str) -> str:
    if _f32(dt):
        return f"{vecmath.require(ev.kc.program, vecmath.EXPM1)}({x})"
    return f"{math_fn('expm1', dt)}({x})"


def _elu(ev, x, dt, alpha: float) -> str:
    return f"({x} > {_L(0, dt)} ? {x} : {_L(alpha, dt)} * {let(ev, dt, _expm1(ev, dt, x))})"


def _mish(ev, x, dt, a):
    """x tanh(log(1 + e)) = x n / (n + 2) with n = e (e + 2), e = exp(x); x itself above 20,
    where tanh(softplus(x)) rounds to 1 (and n overflows beyond 44)."""
    e = let(ev, dt, f"{_vec(ev, dt, vecmath.EXP, 'exp')}({x})")
    n = let(ev, dt, f"{e} * ({e} + {_L(2, dt)})")
    return f"({x} > {_L(20, dt)} ? {x} : {x} * {n} / ({n} + {_L(2, dt)}))"


def _round(ev, x, dt, a):
    """Round half to even: |x| + 2^(p-1) - 2^(p-1) rounds to an integer in the current (nearest-
    even) mode for |x| < 2^(p-1); larger floats are integers already (and NaN stays NaN)."""
    big = _L(2.0 ** 23 if _f32(dt) else 2.0 ** 52, dt)
    ax = let(ev, dt, f"{math_fn('fabs', dt)}({x})")
    return f"({ax} < {big} ? {math_fn('copysign', dt)}(({ax} + {big}) - {big}, {x}) : {x})"


def _sign(ev, x, dt, a):
    if is_float(dt):  # keeps 0, -0 and NaN, as np.sign
        return f"({x} > {_L(0, dt)} ? {_L(1, dt)} : ({x} < {_L(0, dt)} ? {_L(-1, dt)} : {x}))"
    if np.issubdtype(dt, np.unsignedinteger):
        return f"({c_type(dt)})({x} > 0)"
    return f"({c_type(dt)})(({x} > 0) - ({x} < 0))"


def _isinf(ev, node, k, idx):
    a = _attrs(node)
    x = ev.operand(node, 0, idx)
    dt = node.input(0).dtype
    tests = []
    if int(a["detect_positive"]):
        tests.append(f"{x} == {highest(dt)}")
    if int(a["detect_negative"]):
        tests.append(f"{x} == {lowest(dt)}")
    return f"({' || '.join(tests)})" if tests else "0"


_unary("Elu", lambda ev, x, dt, a: _elu(ev, x, dt, a["alpha"]))
_unary("Selu", lambda ev, x, dt, a: f"{_L(a['gamma'], dt)} * {let(ev, dt, _elu(ev, x, dt, a['alpha']))}")


def _celu(ev, x, dt, a):
    """max(0, x) + min(0, alpha expm1(x / alpha)): one of the two terms is 0."""
    alpha = _L(a["alpha"], dt)
    return f"({x} > {_L(0, dt)} ? {x} : {alpha} * {let(ev, dt, _expm1(ev, dt, f'{x} / {alpha}'))})"


_unary("Celu", _celu)
_unary("Mish", _mish)
_unary("ThresholdedRelu", lambda ev, x, dt, a: f"({x} > {_L(a['alpha'], dt)} ? {x} : {_L(0, dt)})")
_unary("Softsign", lambda ev, x, dt, a: f"{x} / ({_L(1, dt)} + {math_fn('fabs', dt)}({x}))")
_unary("Floor", lambda ev, x, dt, a: f"{math_fn('floor', dt)}({x})")
_unary("Ceil", lambda ev, x, dt, a: f"{math_fn('ceil', dt)}({x})")
_unary("Round", _round)
_unary("Sign", _sign)
_unary("Sin", lambda ev, x, dt, a: f"{math_fn('sin', dt)}({x})")
_unary("Cos", lambda ev, x, dt, a: f"{math_fn('cos', dt)}({x})")


def _libm_call(fn: str) -> Callable[[object, str, np.dtype, dict], str]:
    return lambda ev, x, dt, a: f"{math_fn(fn, dt)}({x})"


for _name, _libm in (("Tan", "tan"), ("Asin", "asin"), ("Acos", "acos"), ("Atan", "atan"), ("Sinh", "sinh"),
                     ("Cosh", "cosh"), ("Asinh", "asinh"), ("Acosh", "acosh"), ("Atanh", "atanh")):
    _unary(_name, _libm_call(_libm))
_unary("Not", lambda ev, x, dt, a: f"({x} ^ 1)")
RULES["IsNaN"] = lambda ev, node, k, idx: f"({ev.operand(node, 0, idx)} != {ev.operand(node, 0, idx)})"
RULES["IsInf"] = _isinf

_binary("Greater", lambda a, b: f"({a} > {b})")
_binary("Less", lambda a, b: f"({a} < {b})")
_binary("GreaterOrEqual", lambda a, b: f"({a} >= {b})")
_binary("LessOrEqual", lambda a, b: f"({a} <= {b})")
_binary("And", lambda a, b: f"({a} & {b})")
_binary("Or", lambda a, b: f"({a} | {b})")
_binary("Xor", lambda a, b: f"({a} ^ {b})")
_binary("PRelu", lambda a, b: f"({a} < 0 ? {a} * {b} : {a})")


@_register("Mod")
def _mod(ev, node, k, idx):
    """Python's % (fmod=0: the divisor's sign) or C's fmod (fmod=1). An integer divisor of 0
    computes 0 and faults, as the reference refuses it (``checks.check_of``; it gave 0 silently
    before); -1 gives 0 without the INT_MIN % -1 trap."""
    dt = node.outputs[0].dtype
    a = ev.operand(node, 0, idx)
    b = ev.operand(node, 1, idx)
    floored = not int(_attrs(node)["fmod"])
    if not is_float(dt):
        b = checks.checked_divisor(ev, node, b)
    if is_float(dt):
        r = let(ev, dt, f"{math_fn('fmod', dt)}({a}, {b})")
        if not floored:
            return r
        return f"({r} != {_L(0, dt)} && ({r} < {_L(0, dt)}) != ({b} < {_L(0, dt)}) ? {r} + {b} : {r})"
    if np.issubdtype(dt, np.unsignedinteger):
        return f"({b} == 0 ? 0 : {a} % ({b} == 0 ? 1 : {b}))"
    safe = let(ev, dt, f"({b} == 0 || {b} == -1 ? 1 : {b})")
    r = let(ev, dt, f"({c_type(dt)})({a} % {safe})")
    if floored:
        r = let(ev, dt, f"({r} != 0 && ({r} < 0) != ({b} < 0) ? {r} + {b} : {r})")
    return f"({b} == 0 ? 0 : {r})"


@_register("BitShift")
def _bitshift(ev, node, k, idx):
    """Shifts outside [0, width) give the sign fill (-1 for a negative right-shifted value, else 0);
    left shifts go through the unsigned type (two's complement wrap, no signed overflow)."""
    dt = node.outputs[0].dtype
    ct = c_type(dt)
    x = ev.operand(node, 0, idx)
    y = ev.operand(node, 1, idx)
    bits = dt.itemsize * 8
    signed = np.issubdtype(dt, np.signedinteger)
    inside = f"({y} >= 0 && {y} < {bits})" if signed else f"({y} < {bits})"
    amount = f"({y} & {bits - 1})"
    if _attrs(node)["direction"] == "LEFT":
        ut = c_type(np.dtype(f"u{dt.itemsize}"))
        return f"({inside} ? ({ct})(({ut}){x} << {amount}) : 0)"
    fill = f"({x} < 0 ? -1 : 0)" if signed else "0"
    return f"({inside} ? ({ct})({x} >> {amount}) : {fill})"


@_register("Trilu")
def _trilu(ev, node, k, idx):
    """Keeps x[..., i, j] where j - i >= k (upper) or j - i <= k (lower), else 0."""
    x = ev.operand(node, 0, idx)
    dt = node.outputs[0].dtype
    kv = node.inputs[1] if len(node.inputs) > 1 else None
    shift = "0" if kv is None else f"(long){ev.at(kv, Index(kv.shape, ('0',) * len(kv.shape)))}"
    i, j = idx.dims[-2], idx.dims[-1]
    cmp = ">=" if int(_attrs(node)["upper"]) else "<="
    return f"((long)({j}) - (long)({i}) {cmp} {shift} ? {x} : {_L(0, dt)})"


# Issue 12's data movement: index maps ----------------------------------------------------------
@_register("Tile")
def _tile(ev, node, k, idx):
    x = node.input(0)
    dims = tuple(mod(e, d) if d != n else e for e, d, n in zip(idx.dims, x.shape, idx.shape, strict=True))
    return ev.at(x, Index(tuple(x.shape), dims))


@_register("DepthToSpace")
def _depth_to_space(ev, node, k, idx):
    from opfuse.codegen.index import div
    x = node.input(0)
    a = _attrs(node)
    b = int(a["blocksize"])
    c_out = idx.shape[1]
    n, c, h, w = idx.dims
    bh, bw = mod(h, b), mod(w, b)
    ch = depth_to_space_channel(add(mul(bh, b), bw), c, c_out, b, a["mode"])
    return ev.at(x, Index(tuple(x.shape), (n, ch, div(h, b), div(w, b))))


@_register("SpaceToDepth")
def _space_to_depth(ev, node, k, idx):
    from opfuse.codegen.index import div
    x = node.input(0)
    a = _attrs(node)
    b = int(a["blocksize"])
    c_in = x.shape[1]
    n, oc, h, w = idx.dims
    if a["mode"] == "DCR":
        block, c = div(oc, c_in), mod(oc, c_in)
    else:
        block, c = mod(oc, b * b), div(oc, b * b)
    bh, bw = div(block, b), mod(block, b)
    return ev.at(x, Index(tuple(x.shape), (n, c, add(mul(h, b), bh), add(mul(w, b), bw))))


def _clamped_index(ev, raw: str, dim: int, node=None) -> str:
    """A run-time index, negative counting from the end, clamped into [0, dim): a bad index must
    never read outside the tensor. With ``node``, an index outside [-dim, dim) also sets the node's
    fault flag, so the run fails as the reference does (``checks.index_fault``)."""
    if node is not None:
        checks.index_fault(ev.kc, node, raw, -dim, dim - 1)
    g0 = let(ev, np.int64, f"(int64_t)({raw} < 0 ? {raw} + {dim} : {raw})")
    return let(ev, np.int64, f"({g0} < 0 ? 0 : ({g0} >= {dim} ? {dim - 1} : {g0}))")


@_register("GatherElements")
def _gather_elements(ev, node, k, idx):
    data, ind = node.input(0), node.input(1)
    axis = _attrs(node)["axis"]
    axis = axis + len(data.shape) if axis < 0 else axis
    g = _clamped_index(ev, ev.at(ind, idx), data.shape[axis], node)
    dims = idx.dims[:axis] + (g,) + idx.dims[axis + 1:]
    return ev.at(data, Index(tuple(data.shape), dims))


@_register("GatherND")
def _gather_nd(ev, node, k, idx):
    from opfuse.ops.indexing import gathernd_geometry
    data, ind = node.input(0), node.input(1)
    b, depth = gathernd_geometry(node, _attrs(node))
    r = len(ind.shape) - 1  # output axes that walk the index tuples
    tuple_at = idx.dims[:r]
    picks = [_clamped_index(ev, ev.at(ind, Index(tuple(ind.shape), tuple_at + (str(j),))), data.shape[b + j], node)
             for j in range(depth)]
    dims = tuple(idx.dims[:b]) + tuple(picks) + tuple(idx.dims[r:])
    return ev.at(data, Index(tuple(data.shape), dims))


@_register("OneHot")
def _onehot(ev, node, k, idx):
    from opfuse.ops.indexing import ONEHOT_FLOAT_LIMIT, onehot_depth
    ind, values = node.input(0), node.input(2)
    out = node.outputs[0]
    axis = _attrs(node)["axis"]
    axis = axis + len(out.shape) if axis < 0 else axis
    depth = onehot_depth(node)
    raw = ev.at(ind, Index(tuple(ind.shape), idx.dims[:axis] + idx.dims[axis + 1:]))
    # as ops.indexing.onehot_positions: no undefined conversion of NaN or a huge float, no uint64 wrapped
    if is_float(ind.dtype):
        x = let(ev, ind.dtype, raw)
        kk = let(ev, np.int64, f"({x} == {x} && {math_fn('fabs', ind.dtype)}({x}) < {_L(ONEHOT_FLOAT_LIMIT, ind.dtype)}"
                               f" ? (int64_t)({x}) : (int64_t){depth})")
    elif np.dtype(ind.dtype) == np.uint64:
        x = let(ev, ind.dtype, raw)
        kk = let(ev, np.int64, f"({x} <= {depth}u ? (int64_t)({x}) : (int64_t){depth})")
    else:
        kk = let(ev, np.int64, f"(int64_t)({raw})")
    kk = let(ev, np.int64, f"({kk} < 0 ? {kk} + {depth} : {kk})")
    off, on = (ev.at(values, Index.linear(values.shape, str(i))) for i in (0, 1))
    return f"({kk} == (int64_t)({idx.dims[axis]}) ? {on} : {off})"


@_register("Range")
def _range(ev, node, k, idx):
    from opfuse.ops.indexing import range_params
    dt = node.outputs[0].dtype
    start, delta, _ = range_params(node)
    return f"{_L(start, dt)} + ({c_type(dt)})({idx.dims[0]}) * {_L(delta, dt)}"


@_register("Mean")
def _mean(ev, node, k, idx):
    dt = node.outputs[0].dtype
    return f"{let(ev, dt, RULES['Sum'](ev, node, k, idx))} / {_L(len(node.input_values()), dt)}"


# Bit operations, BitCast, ReverseSequence -----------------------------------------------------
_binary("BitwiseAnd", lambda a, b: f"({a} & {b})")
_binary("BitwiseOr", lambda a, b: f"({a} | {b})")
_binary("BitwiseXor", lambda a, b: f"({a} ^ {b})")
_unary("BitwiseNot", lambda ev, x, dt, a: f"({c_type(dt)})(~{x})")


@_register("BitCast")
def _bitcast(ev, node, k, idx):
    """The same bytes read as the other type (memcpy: the one well-defined way in C99)."""
    src, dst = node.input(0).dtype, node.outputs[0].dtype
    x = ev.operand(node, 0, idx)
    held = ev.kc.tmp("bits")
    ev.w.line(f"{c_type(src)} {held}_in = {x};")
    ev.w.line(f"{c_type(dst)} {held};")
    ev.w.line(f"memcpy(&{held}, &{held}_in, sizeof {held});")
    return held


@_register("ReverseSequence")
def _reverse_sequence(ev, node, k, idx):
    """A length outside [0, steps] faults, as in the reference, and is clamped meanwhile (it read
    outside the tensor: lens 5 of 4 steps reversed from element 4)."""
    from opfuse.ops.indexing import _rs_axes, reverse_lens_message
    x, lens = node.input(0), node.input(1)
    b, t = _rs_axes(node, _attrs(node))
    steps = x.shape[t]
    raw = let(ev, np.int64, f"(long)({ev.at(lens, Index(tuple(lens.shape), (idx.dims[b],)))})")
    ev.w.line(f"{ev.kc.fault(node, reverse_lens_message(node, steps))} |= ({raw} < 0 || {raw} > {steps});")
    n = let(ev, np.int64, f"({raw} < 0 ? 0 : ({raw} > {steps} ? {steps} : {raw}))")
    step = idx.dims[t]
    dims = list(idx.dims)
    dims[t] = let(ev, np.int64, f"({step} < {n} ? {n} - 1 - ({step}) : ({step}))")
    return ev.at(x, Index(tuple(x.shape), tuple(dims)))
