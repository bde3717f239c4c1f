"""A vectorisable float32 ``erf`` for the generated C (libm's ``erff`` is one call per
element, about 7 ns each: most of bert's GEMM + GELU epilogue before).

The function is odd, so it is built for ``a = |x|`` and the sign copied back:

* ``a < SMALL_END``: ``erf(a) = a + a * P(a^2)``, ``P(s) ~= erf(sqrt s)/sqrt s - 1``
  (degree 5). Writing the leading term ``a`` apart keeps it exact, so the rounding of
  ``P`` (|P| <= 0.13) costs a fraction of an ulp of the result.
* ``SMALL_END <= a < MID_END`` and ``MID_END <= a < ONE_FROM``:
  ``erf(a) = 1 - Q(a - centre)``, ``Q ~= erfc`` on that interval (degree 10). The result
  lies in [0.71, 1), where an ulp is 2^-24 absolute, and ``Q <= 0.29`` is rounded to a
  fraction of that.
* ``a >= ONE_FROM`` (and +inf): ``erfc(a) < 2^-25``, so erff rounds to exactly 1.
* NaN gives NaN.

Coefficients: least squares on Chebyshev nodes of the target in float64 (near-minimax),
rounded to float32, stored here as exact hex. Measured against ``math.erf`` (float64) over
every 61st positive float32 bit pattern: at most 0.95 ulp (``tests/codegen/test_erf.py``
checks a sweep at 2 ulp). All three pieces are computed for every element and one is
selected with ternaries, so gcc vectorises the loop around it (no fast-math needed, and
each multiply-add is ``OPFUSE_FMAF``: one fused multiply-add where the target has FMA units,
a multiply and an add in the plain C99 build, ``vecmath.FMA_TEXT``; both within the bound).

``require_vector_erf``: its AVX-512 / AVX2 forms for the explicit-SIMD loops (``codegen/simdchain.py``), the same
operations in the same order on whole registers (each ternary a blend), so the same bits lane by lane as the helper
in an FMA build.
"""
from __future__ import annotations

import numpy as np

from opfuse.codegen.ctype import literal
from opfuse.codegen.vecmath import ABS_BITS, FMA_TEXT, SIGN_BIT, VecIsa, fma, horner, require_fma, require_immintrin, \
    vector_horner, vector_name

SMALL_END = 0.75
MID_END = 1.75
ONE_FROM = 3.92  # erfc(3.92) ~= 2.7e-8 < 2^-25: float erf is 1 from about 3.83 on

# Coefficients, lowest degree first.
SMALL_POLY = ("0x1.06eba8p-3", "-0x1.81273ap-2", "0x1.ce2aeap-4", "-0x1.b7ab4ep-6",
              "0x1.4f427cp-8", "-0x1.625aeap-11")
MID_CENTRE = (SMALL_END + MID_END) / 2
MID_POLY = ("0x1.3bcd14p-4", "-0x1.e4653p-3", "0x1.2ebf3ep-2", "-0x1.571d22p-3",
            "0x1.93a83p-8", "0x1.828d3p-5", "-0x1.5cf9c4p-6", "-0x1.e1da9p-9",
            "0x1.74a708p-8", "-0x1.5feb44p-11", "-0x1.8ad23cp-11")
TAIL_CENTRE = (MID_END + ONE_FROM) / 2
TAIL_POLY = ("0x1.feda76p-15", "-0x1.7e2bfap-12", "0x1.0f0fb2p-10", "-0x1.e1709cp-10",
             "0x1.272ea4p-9", "-0x1.0437b8p-9", "0x1.53ffecp-10", "-0x1.40ac6ep-11",
             "0x1.02fd06p-13", "0x1.23ce04p-14", "-0x1.475272p-15")

ERF_HELPER = "opfuse_erff"


def _float(v: float) -> str:
    return literal(v, np.float32)


ERF_HELPER_TEXT = "\n".join([
    "/* erf(x) in float (within 1 ulp of erff); branch-free, vectorisable. */",
    f"static inline float {ERF_HELPER}(float x) {{",
    "  const float a = fabsf(x);",
    "  const float s = a * a;",
    f"  const float tm = a - {_float(MID_CENTRE)};",
    f"  const float tt = a - {_float(TAIL_CENTRE)};",
    *horner("p", SMALL_POLY, "s"),
    *horner("q", MID_POLY, "tm"),
    *horner("r", TAIL_POLY, "tt"),
    f"  const float y = a < {_float(SMALL_END)} ? {fma('a', 'p', 'a')}"
    f" : (a < {_float(MID_END)} ? 1.0f - q : (a < {_float(ONE_FROM)} ? 1.0f - r : 1.0f));",
    "  return x != x ? x : copysignf(y, x);",
    "}",
    "",
])


def _vector_erf_text(isa: VecIsa) -> str:
    """``ERF_HELPER_TEXT`` on ``isa``'s registers: ``fabsf`` and ``copysignf`` as bit operations, each ternary a
    blend on an ordered compare (false on NaN, whose lanes the last select returns as they came)."""
    v, p, c = isa.vt, isa.op, isa.set1

    one = c("1.0f")
    tail = isa.select("a", c(_float(ONE_FROM)), "_CMP_LT_OQ", p("sub_ps", one, "r"), one)
    mid = isa.select("a", c(_float(MID_END)), "_CMP_LT_OQ", p("sub_ps", one, "q"), "tail")
    return "\n".join([
        f"static inline {v} {vector_name(ERF_HELPER, isa)}({v} x) {{",
        f"  const {v} a = {isa.bits('x', 'and', ABS_BITS)};",
        f"  const {v} s = {p('mul_ps', 'a', 'a')};",
        f"  const {v} tm = {p('sub_ps', 'a', c(_float(MID_CENTRE)))};",
        f"  const {v} tt = {p('sub_ps', 'a', c(_float(TAIL_CENTRE)))};",
        *vector_horner(isa, "pp", SMALL_POLY, "s"),
        *vector_horner(isa, "q", MID_POLY, "tm"),
        *vector_horner(isa, "r", TAIL_POLY, "tt"),
        f"  const {v} tail = {tail};",
        f"  const {v} mid = {mid};",
        f"  const {v} y = {isa.select('a', c(_float(SMALL_END)), '_CMP_LT_OQ', p('fmadd_ps', 'a', 'pp', 'a'), 'mid')};",
        f"  const {v} m = {isa.combine(isa.bits('y', 'and', ABS_BITS), 'or', isa.bits('x', 'and', SIGN_BIT))};"
        "  /* copysignf(y, x) */",
        f"  return {isa.select('x', 'x', '_CMP_UNORD_Q', 'x', 'm')};",
        "}",
        "",
    ])


def require_vector_erf(program, isa: VecIsa) -> str:
    """Add the vector form of the helper on ``isa`` (behind ``isa.guard``) to ``program``, once; its C name."""
    require_immintrin(program)
    return program.require_helper(vector_name(ERF_HELPER, isa), f"#if {isa.guard}\n{_vector_erf_text(isa)}#endif\n")


def require_erf(program) -> str:
    """Add the helper to ``program`` (once, after the ``OPFUSE_FMAF`` macro) and return the name to call."""
    require_fma(program)
    return program.require_helper(ERF_HELPER, ERF_HELPER_TEXT)


def erf_text(simd: str = "auto") -> str:
    """The helper after the ``OPFUSE_FMAF`` macro of ``simd`` (for tests that compile it alone)."""
    return FMA_TEXT[simd] + ERF_HELPER_TEXT
