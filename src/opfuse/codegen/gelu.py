"""GELU's erf form, ``x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``, as one vectorisable float helper: a
piecewise polynomial looked up by interval, where ``0.5 x (1 + erf(...))`` through ``erf.py``'s helper
evaluates all three of erf's pieces (26 multiply-adds) for every element.

With ``a = |x|`` and ``h(a) = Phi(-a) = 0.5 erfc(a / sqrt 2)`` (in (0, 0.5]):

    GELU(x) = x <= 0 ? x h(a) : x - x h(a)

(``x Phi(x)`` with ``Phi(x) = h(a)`` below 0 and ``1 - h(a)`` above; ``x - x h`` one fused multiply-add, where
``x (1 - h)`` rounded ``1 - h`` first: 2.0 -> 1.1 ulp; ``<= 0`` keeps -0). ``h`` on ``[0, 7.5)`` is cut in
``INTERVALS - 1`` intervals of width ``1 / SCALE`` = 0.5: ``u = min(2a, 15.5)`` (exact), ``k = floor(u)``,
``t = u - k`` in [0, 1) (exact), ``h ~= sum_j C[j][k] t^j`` (degree ``DEGREE``, Horner's rule, each step one
``OPFUSE_FMAF``). The last interval's coefficients are 0: ``h(7.5) < 3.2e-14``, so above it GELU is ``x``
(and ``-0`` below -7.5, where the reference's float64 result is below 2.4e-13 |x|). NaN picks that interval
too and stays NaN; x >= 7.5 is returned as it is (``x - x h`` would be NaN at +inf), so +inf gives +inf and -inf
NaN (``-inf * 0``), as the reference's formula does.

Coefficients: least squares on 64 Chebyshev nodes of each interval in float64 (near-minimax), rounded to
float32 and stored here as exact hex: ``|h - poly| <= 9.4e-9`` over [0, 7.5) in float64. The result, against
float64 GELU (``tests/codegen/test_gelu.py``; every 61st bit pattern below 20 of both signs and a grid over
[-9, 9]): 1.98 ulp for x >= -1 (1.11 for x >= 0), 1.84e-8 |x| below -1; the plain C99 build (a multiply and an
add for each multiply-add) 2.13 ulp (1.37) and 1.92e-8 |x|. ``0.5 x (1 + erf)`` measured 2.7 ulp and 4.9e-8 |x|
(``1 + erf`` cancels below -1).

The vector forms (``require_vector_gelu``, the explicit-SIMD loops and GEMM epilogues) are the same operations
in the same order on whole registers, each lookup a permute of one 16-float table row (AVX-512
``vpermps``; AVX2: two 8-float halves and a blend on bit 3 of ``k``), so the same bits lane by lane as the helper
in an FMA build. Per element, 32K floats in L2, 1 thread, CPU time (Zen 5 host, load ~2): AVX-512 0.357 ns with
``0.5 x (1 + erf)`` -> 0.168 ns.
"""
from __future__ import annotations

from opfuse.codegen.vecmath import ABS_BITS, VecIsa, fma, require_fma, require_immintrin, vector_name

GELU_HELPER = "opfuse_gelu_erff"
TABLE = "opfuse_gelu_erff_c"
SCALE = 2.0          # intervals per unit of |x|
INTERVALS = 16       # one register of floats: the last one all 0
U_MAX = 15.5         # min(SCALE |x|, U_MAX): the last interval from 7.5 on, +inf and NaN too
DEGREE = 6

# C[j][k]: coefficient of t^j on interval k (k < INTERVALS - 1; the last interval's are 0).
COEFFICIENTS = (
    ('0x1p-1', '0x1.3bf144p-2', '0x1.44ed0cp-3', '0x1.11a46ep-4', '0x1.74bcf8p-6', '0x1.96f4e6p-8', '0x1.61de2p-10',
     '0x1.e7dbc6p-13', '0x1.09ad7p-15', '0x1.c806fep-19', '0x1.33c9eep-22', '0x1.463c76p-26', '0x1.0f302ap-30',
     '0x1.613ea4p-35', '0x1.68398ep-40'),
    ('-0x1.98846p-3', '-0x1.6883ccp-3', '-0x1.ef8e44p-4', '-0x1.09408p-4', '-0x1.ba4b5cp-6', '-0x1.1f2f2cp-7',
     '-0x1.227224p-9', '-0x1.c988bep-12', '-0x1.18a7c6p-14', '-0x1.0c2574p-17', '-0x1.8f0a06p-21', '-0x1.ce74c4p-25',
     '-0x1.a16188p-29', '-0x1.255b9p-33', '-0x1.41230ep-38'),
    ('0x1.86dcfcp-20', '0x1.68821ep-6', '0x1.ef893ap-6', '0x1.8ddf5cp-6', '0x1.ba4e68p-7', '0x1.66ff8ep-8',
     '0x1.b3ad3cp-10', '0x1.904c66p-12', '0x1.188cb8p-14', '0x1.2d6a82p-17', '0x1.f20e22p-21', '0x1.3d2bdep-24',
     '0x1.37e704p-28', '0x1.da41c2p-33', '0x1.170834p-37'),
    ('0x1.100de4p-7', '0x1.68a938p-8', '0x1.ece1dep-18', '-0x1.b9cde2p-9', '-0x1.ba95a8p-9', '-0x1.f706ecp-10',
     '-0x1.835ebep-11', '-0x1.ac6294p-13', '-0x1.5d7412p-15', '-0x1.aae2ecp-18', '-0x1.8a15f6p-21', '-0x1.14a218p-24',
     '-0x1.28999ap-28', '-0x1.e747ecp-33', '-0x1.336a1ap-37'),
    ('0x1.b12456p-16', '-0x1.4be9f8p-10', '-0x1.4fe34ap-10', '-0x1.94de5ap-12', '0x1.2d5aeap-12', '0x1.8a3bdap-12',
     '0x1.b51818p-13', '0x1.31723ap-14', '0x1.280008p-16', '0x1.9e1646p-19', '0x1.ab292ap-22', '0x1.492f42p-25',
     '0x1.7e4e18p-29', '0x1.5098a4p-33', '0x1.c35836p-38'),
    ('-0x1.6faecep-12', '-0x1.200e5p-13', '0x1.4928dcp-13', '0x1.97bd1cp-13', '0x1.0268f4p-14', '-0x1.dfbbf6p-16',
     '-0x1.2c9d86p-15', '-0x1.1d2a2ap-16', '-0x1.4c138ap-18', '-0x1.08614cp-20', '-0x1.2d04fap-23', '-0x1.f6044ep-27',
     '-0x1.37150ap-30', '-0x1.214b6cp-34', '-0x1.968768p-39'),
    ('0x1.f265cap-16', '0x1.89afd6p-15', '0x1.323432p-17', '-0x1.5177d8p-16', '-0x1.02d87ap-16', '-0x1.06e676p-19',
     '0x1.8b5996p-19', '0x1.15c2b4p-19', '0x1.7fe9cp-21', '0x1.53e6f6p-23', '0x1.a17214p-26', '0x1.70e91p-29',
     '0x1.df0618p-33', '0x1.ceff52p-37', '0x1.501a8ep-41'),
)


def _row(j: int) -> str:
    return "{" + ", ".join(f"{c}f" for c in (*COEFFICIENTS[j], "0x0p+0")) + "}"


GELU_HELPER_TEXT = "\n".join([
    "/* GELU(x) = x Phi(x) in float (erf form; codegen/gelu.py): an interval's polynomial for Phi(-|x|). */",
    f"static const float {TABLE}[{DEGREE + 1}][{INTERVALS}] = {{",
    *[f"  {_row(j)}," for j in range(DEGREE + 1)],
    "};",
    f"static inline float {GELU_HELPER}(float x) {{",
    "  const float a = fabsf(x);",
    "  const float u0 = a + a;",
    f"  const float u = u0 < {U_MAX}f ? u0 : {U_MAX}f;",
    "  const float kf = floorf(u);",
    "  const float t = u - kf;",
    "  const int k = (int)kf;",
    f"  float p = {TABLE}[{DEGREE}][k];",
    *[f"  p = {fma('p', 't', f'{TABLE}[{j}][k]')};" for j in range(DEGREE - 1, -1, -1)],
    f"  return x <= 0.0f ? x * p : (u0 < {U_MAX}f ? {fma('-x', 'p', 'x')} : x);",
    "}",
    "",
])


def _lookup(isa: VecIsa, j: int) -> str:
    """Row ``j`` of the table at each lane's interval ``k``."""
    if isa.lanes == 16:
        return f"_mm512_permutexvar_ps(k, _mm512_loadu_ps({TABLE}[{j}]))"
    lo = f"_mm256_permutevar8x32_ps(_mm256_loadu_ps({TABLE}[{j}]), k)"
    hi = f"_mm256_permutevar8x32_ps(_mm256_loadu_ps({TABLE}[{j}] + 8), k)"
    return f"_mm256_blendv_ps({lo}, {hi}, hi8)"


def _vector_gelu_text(isa: VecIsa) -> str:
    """``GELU_HELPER_TEXT`` on ``isa``'s registers: ``fabsf`` a bit operation, ``floorf`` a round toward -inf, the
    ternaries an ordered compare's blend (``u0 < U_MAX`` false on NaN, as in C)."""
    v, p, c = isa.vt, isa.op, isa.set1
    umax = c(f"{U_MAX}f")
    floor = ("_mm512_roundscale_ps(u, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)" if isa.lanes == 16
             else "_mm256_floor_ps(u)")
    lines = [
        f"static inline {v} {vector_name(GELU_HELPER, isa)}({v} x) {{",
        f"  const {v} a = {isa.bits('x', 'and', ABS_BITS)};",
        f"  const {v} u0 = {p('add_ps', 'a', 'a')};",
        f"  const {v} u = {isa.select('u0', umax, '_CMP_LT_OQ', 'u0', umax)};",
        f"  const {v} kf = {floor};",
        f"  const {v} t = {p('sub_ps', 'u', 'kf')};",
        f"  const {isa.it} k = {p('cvttps_epi32', 'kf')};",
    ]
    if isa.lanes == 8:  # lanes whose interval is in the table's upper half: bit 3 of k moved to the sign
        lines.append("  const __m256 hi8 = _mm256_castsi256_ps(_mm256_slli_epi32(k, 28));")
    lines += [f"  {v} q = {_lookup(isa, DEGREE)};",
              *[f"  q = {p('fmadd_ps', 'q', 't', _lookup(isa, j))};" for j in range(DEGREE - 1, -1, -1)],
              f"  const {v} pos = {isa.select('u0', umax, '_CMP_LT_OQ', p('fnmadd_ps', 'x', 'q', 'x'), 'x')};",
              f"  return {isa.select('x', p('setzero_ps'), '_CMP_LE_OQ', p('mul_ps', 'x', 'q'), 'pos')};",
              "}", ""]
    return "\n".join(lines)


def require_gelu(program) -> str:
    """Add the helper and its table to ``program`` (once, after the ``OPFUSE_FMAF`` macro); its C name."""
    require_fma(program)
    return program.require_helper(GELU_HELPER, GELU_HELPER_TEXT)


def require_vector_gelu(program, isa: VecIsa) -> str:
    """Add the vector form of the helper on ``isa`` (behind ``isa.guard``, after the scalar helper whose table it
    reads) to ``program``, once; its C name."""
    require_gelu(program)
    require_immintrin(program)
    key = vector_name(GELU_HELPER, isa)
    return program.require_helper(key, f"#if {isa.guard}\n{_vector_gelu_text(isa)}#endif\n")


def gelu_text(simd: str = "auto") -> str:
    """The helper after the ``OPFUSE_FMAF`` macro of ``simd`` (for tests that compile it alone)."""
    from opfuse.codegen.vecmath import FMA_TEXT
    return FMA_TEXT[simd] + GELU_HELPER_TEXT


def vector_gelu_text(isa: VecIsa) -> str:
    """The vector form on ``isa`` behind its guard (for tests that compile it alone, after ``gelu_text``)."""
    return f"#if {isa.guard}\n#include <immintrin.h>\n{_vector_gelu_text(isa)}#endif\n"
