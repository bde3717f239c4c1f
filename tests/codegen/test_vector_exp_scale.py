"""The AVX2 exp's one-field scale (``vecmath._vector_split_scale``): ``exp_nonpos`` raises its argument to -104 and
scales by ``(q 2^(k + 24)) 2^-24``, silu's own exp (``opfuse_v8_expf_silu``) raises it to -86.5 and scales by
``(q 2^(k - 1)) 2``, where the scalar helpers split k in halves and select 0 below -104. Bitwise the scalar
helpers of the same (FMA) build, lane by lane: every float of the ranges where the clamps and the scale's ends act
(the subnormal results, the underflow to 0, silu's exp up to 2^128), and a sweep of all bit patterns. (Every one of
the 2^32 inputs was checked once by hand against the halves form: the same bits, NaN as NaN.)"""
from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from cg_support import bit_sweep, same_bits
from opfuse.codegen import vecmath
from opfuse.codegen.options import CodegenOptions
from opfuse.runtime.toolchain import Toolchain, ToolchainError

ISA = vecmath.AVX2_FLOAT
HELPERS = (vecmath.EXP_NONPOS, vecmath.SIGMOID, vecmath.SILU, vecmath.TANH, vecmath.SOFTPLUS)
SWEEP_STRIDE = 65537


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    """``{helper: (vector f, scalar f)}`` over float32 arrays, AVX2 with FMA (skips on a CPU without)."""
    try:
        tc = Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")
    texts: dict[str, str] = {}

    def need(name: str) -> None:
        deps, text = vecmath.VECTOR_HELPERS[name]
        for d in deps:
            need(d)
        texts.setdefault(name, text(ISA))
    for h in HELPERS:
        need(h)
    calls = "".join(f"void vec_{h}(const float* x, float* y, long n) {{\n"
                    f"  for (long i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, {vecmath.vector_name(h, ISA)}"
                    f"(_mm256_loadu_ps(x + i)));\n}}\n"
                    f"void one_{h}(const float* x, float* y, long n) {{\n"
                    f"  for (long i = 0; i < n; ++i) y[i] = {h}(x[i]);\n}}\n"
                    for h in HELPERS)
    src = "".join(["#include <math.h>\n#include <stdint.h>\n", vecmath.all_helpers_text(),  # its default: "auto"
                   f"#if {ISA.guard}\n#include <immintrin.h>\nint has_avx2(void) {{ return 1; }}\n",
                   *texts.values(), calls, "#else\nint has_avx2(void) { return 0; }\n#endif\n"])
    d = tmp_path_factory.mktemp("vecexp")
    c, lib = d / "vecexp.c", d / "vecexp.so"
    c.write_text(src)
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(c), "-lm"], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    if not dll.has_avx2():
        pytest.skip("this compiler does not target AVX2 with FMA")

    def wrap(fn):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]

        def run(x: np.ndarray) -> np.ndarray:
            xp = np.zeros(-(-x.size // 8) * 8, np.float32)
            xp[:x.size] = x
            y = np.empty_like(xp)
            fn(xp.ctypes.data, y.ctypes.data, xp.size)
            return y[:x.size]
        return run
    return {h: (wrap(getattr(dll, f"vec_{h}")), wrap(getattr(dll, f"one_{h}"))) for h in HELPERS}


def _floats(lo: float, hi: float) -> np.ndarray:
    """Every float32 in [lo, hi] (same sign)."""
    a, b = np.float32(lo).view(np.uint32), np.float32(hi).view(np.uint32)
    return np.arange(min(a, b), max(a, b) + 1, dtype=np.uint32).view(np.float32)


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, -103.97, -103.98, -104.0, -104.5, -87.33, -87.34,
                    -86.5, -86.49, -86.51, 88.37, 88.38, 88.72, 88.73, 89.0, 89.5, -89.0, -1e-45, 1e-45], np.float32)


@pytest.mark.parametrize("helper", HELPERS)
def test_vector_form_is_the_scalar_helpers_bits(helpers, helper):
    """Where the clamps and the one-field scale act: exp_nonpos over every float in [-110, -80] (its results
    subnormal, then 0 below -104), the functions of x over every float in [-110, -80] and [80, 110] (silu's
    exp(-x) up to 2^128 and its overflow to inf: x / inf = -0), plus the special values and a bit-pattern sweep."""
    vec, one = helpers[helper]
    parts = [_floats(-110.0, -80.0), SPECIAL, bit_sweep(SWEEP_STRIDE)]
    if helper != vecmath.EXP_NONPOS:  # exp_nonpos takes x <= 0 or NaN only
        parts.append(_floats(80.0, 110.0))
    x = np.concatenate(parts)
    if helper == vecmath.EXP_NONPOS:
        x = x[~(x > 0)]
    assert same_bits(vec(x), one(x))


def test_avx2_text_scales_in_one_field_and_avx512_keeps_vscalef():
    """The AVX2 forms clamp their argument first and scale by one exponent field (no k1/k2 halves, no underflow
    select); silu calls its own exp (its argument goes up to 89, past exp_nonpos's k + 24); AVX-512 keeps vscalefps."""
    nonpos = vecmath.VECTOR_HELPERS[vecmath.EXP_NONPOS][1](ISA)
    silu_exp = vecmath.VECTOR_HELPERS[vecmath.SILU_EXP][1](ISA)
    assert "_mm256_max_ps(_mm256_set1_ps(-104.0f), x)" in nonpos and "0x1p-24f" in nonpos
    assert "_mm256_max_ps(_mm256_set1_ps(-86.5f), x)" in silu_exp and "0x1p1f" in silu_exp
    for text in (nonpos, silu_exp):
        assert "srai_epi32" not in text and "blendv" not in text
    assert "opfuse_v8_expf_silu(" in vecmath.VECTOR_HELPERS[vecmath.SILU][1](ISA)
    wide = vecmath.VECTOR_HELPERS[vecmath.EXP_NONPOS][1](vecmath.AVX512_FLOAT)
    assert "_mm512_maskz_scalef_ps" in wide and "max_ps" not in wide
    # vscalefps takes n as a float: no integer k; and exp_nonpos (x <= 0) never overflows: no select to inf
    assert "epi32" not in wide and "HUGE_VALF" not in wide and "HUGE_VALF" not in nonpos
    assert "HUGE_VALF" in vecmath.VECTOR_HELPERS[vecmath.EXP][1](vecmath.AVX512_FLOAT)


def test_exp_table_keeps_its_halves_scale_for_silu():
    """With ``exp_table`` silu's exp is the table form under silu's name (its k1/k2 scale takes any argument), so
    the vector silu stays the scalar table helper's bits (tests/codegen/test_exp_table.py runs them)."""
    from opfuse.ops import GraphBuilder
    from opfuse.ir.plan import FusionGroup, FusionPlan
    from opfuse.codegen.program import generate
    b = GraphBuilder("silu_table")
    g = b.build(b.op("Silu", b.input("x", (1000,))))
    plan = FusionPlan(g, [FusionGroup("c", list(g.nodes), "elementwise")])
    src = generate(g, plan, options=CodegenOptions(exp_table=True, vector_isa="avx2")).source
    assert "static inline __m256 opfuse_v8_expf_silu(" in src and "_mm256_permutevar8x32_ps" in src
    plain = generate(g, plan, options=CodegenOptions(vector_isa="avx2")).source
    assert "static inline __m256 opfuse_v8_expf_silu(" in plain and "_mm256_permutevar8x32_ps" not in plain
