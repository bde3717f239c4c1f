"""GELU's erf form as one piecewise polynomial (``codegen/gelu.py``) against float64 GELU: the scalar helper with
and without fused multiply-adds, its AVX-512 and AVX2 forms bit for bit the FMA helper's, the interval edges, the
special values, and the kernels that call it instead of ``0.5 x (1 + erf(x / sqrt 2))``."""
from __future__ import annotations

import ctypes
import math
import subprocess

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.erf import ERF_HELPER
from opfuse.codegen.gelu import COEFFICIENTS, DEGREE, GELU_HELPER, INTERVALS, SCALE, U_MAX, gelu_text, \
    vector_gelu_text
from opfuse.codegen.vecmath import AVX2_FLOAT, AVX512_FLOAT, vector_name
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime.toolchain import Toolchain, ToolchainError

# Measured (every 61st bit pattern below 20 of both signs and the grid below): 1.98 ulp for x >= -1 (1.11 for
# x >= 0) and 1.84e-8 |x| below -1 with fused multiply-adds; the plain C99 build 2.13 ulp (1.37) and 1.92e-8 |x|.
# The bounds: those plus a margin (``test_vecmath`` holds every GELU to 3 ulp and 6e-8 |x|, what
# 0.5 x (1 + erf(x / sqrt 2)) needed).
MAX_ULP = 2.5
MAX_ULP_POSITIVE = 1.5
MAX_ERR_PER_X = 2.5e-8
SWEEP_STRIDE = 4099
GRID = np.linspace(-9.0, 9.0, 360_001, dtype=np.float32)
EDGES = np.arange(1, INTERVALS, dtype=np.float32) / np.float32(SCALE)  # where k steps: 0.5, 1, ... 7.5
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 3.4e38, -3.4e38, 7.5, -7.5,
                    8.0, -8.0, 1e6, -1e6], np.float32)


def _gelu64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore"):  # -inf: -inf * 0, NaN
        return 0.5 * x * (1.0 + np.vectorize(math.erf, otypes=[np.float64])(x / math.sqrt(2)))


def _inputs() -> np.ndarray:
    pos = np.arange(0, 0x7F800000, SWEEP_STRIDE, dtype=np.uint32).view(np.float32)
    near = np.concatenate([np.nextafter(EDGES, np.float32(0)), EDGES, np.nextafter(EDGES, np.float32(99))])
    return np.concatenate([pos, -pos, GRID, near, -near, SPECIAL])


def _compile(tmp_path, name: str, text: str, fn: str):
    try:
        tc = Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")
    src = tmp_path / f"{name}.c"
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + text)
    lib = tmp_path / f"{name}.so"
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
    f = getattr(ctypes.CDLL(str(lib)), fn)
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    f.restype = ctypes.c_int

    def run(x: np.ndarray) -> np.ndarray | None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        return y if f(x.ctypes.data, y.ctypes.data, x.size) else None
    return run


@pytest.fixture(scope="module", params=["auto", "none"])
def gelu_c(tmp_path_factory, request):
    """The scalar helper with the ``OPFUSE_FMAF`` of ``simd`` ("auto": fused where the CPU has FMA; "none": the
    plain C99 build)."""
    text = gelu_text(request.param) + (f"int many(const float* x, float* y, long n) {{\n"
                                       f"  for (long i = 0; i < n; ++i) y[i] = {GELU_HELPER}(x[i]);\n  return 1;\n}}\n")
    return _compile(tmp_path_factory.mktemp("gelu"), "gelu", text, "many")


def test_gelu_within_stated_error(gelu_c):
    x = _inputs()
    got = gelu_c(x).astype(np.float64)
    exact = _gelu64(x)
    with np.errstate(invalid="ignore"):  # inf - inf, NaN - NaN
        ulp = np.abs(got - exact) / np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
        per_x = np.abs(got - exact) / np.abs(x.astype(np.float64))
    normal = np.isfinite(x) & (x >= -1) & (np.abs(exact) >= 2.0 ** -126)
    for bound, where in ((MAX_ULP, normal), (MAX_ULP_POSITIVE, normal & (x >= 0))):
        worst = int(np.argmax(np.where(where, ulp, 0.0)))
        assert ulp[worst] <= bound, f"gelu({x[worst]!r}) off by {ulp[worst]:.2f} ulp"
    below = np.isfinite(x) & (x < -1)
    worst = int(np.argmax(np.where(below, per_x, 0.0)))
    assert per_x[worst] <= MAX_ERR_PER_X, f"gelu({x[worst]!r}): |err| / |x| = {per_x[worst]:.3g}"
    tiny = np.isfinite(x) & (np.abs(exact) < 2.0 ** -126)  # subnormal results: within one subnormal step
    assert np.all(np.abs(got[tiny] - exact[tiny]) <= 2.0 ** -149)


def test_gelu_special_values(gelu_c):
    y = gelu_c(SPECIAL)
    assert np.isnan(y[0]) and y[1] == np.inf and np.isnan(y[2])  # as 0.5 x (1 + erf(x / sqrt 2)) in float64
    assert y[3] == 0.0 and not np.signbit(y[3]) and y[4] == 0.0 and np.signbit(y[4])
    assert abs(y[5]) <= 1e-45 and y[6] == 0.0  # half the smallest subnormal: 0, or (x * h rounded first) x
    assert y[7] == np.float32(5e-39) and y[8] == -np.float32(5e-39)
    assert y[9] == np.float32(3.4e38) and y[10] == 0.0 and np.signbit(y[10])
    assert y[11] == 7.5 and y[12] == 0.0 and np.signbit(y[12])  # the last interval: h = 0
    assert y[13] == 8.0 and y[15] == 1e6 and y[14] == 0.0 and y[16] == 0.0


def test_gelu_is_continuous_at_the_interval_edges(gelu_c):
    """Each side of each edge within 2 ulp of float64 GELU (the fit is per interval, so a bad row shows here)."""
    below, at = np.nextafter(EDGES, np.float32(0)), EDGES
    for x in (below, at, -below, -at):
        got, exact = gelu_c(x).astype(np.float64), _gelu64(x)
        ulp = np.abs(got - exact) / np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
        small = np.abs(got - exact) <= MAX_ERR_PER_X * np.abs(x)  # x < -1: the bound relative to |x|
        assert np.all((ulp <= MAX_ULP) | ((x < -1) & small)), (x, got, exact)


def test_table_shape():
    assert len(COEFFICIENTS) == DEGREE + 1 and all(len(row) == INTERVALS - 1 for row in COEFFICIENTS)
    assert U_MAX == INTERVALS - 0.5  # min(2|x|, U_MAX) floors to the last (all-zero) interval
    assert float.fromhex(COEFFICIENTS[0][0]) == 0.5  # h(0) = Phi(0) = 1/2 exactly


@pytest.mark.parametrize("isa", [AVX512_FLOAT, AVX2_FLOAT], ids=["avx512", "avx2"])
def test_vector_forms_are_the_helpers_bits(isa, tmp_path):
    """The vector form, over the same inputs, bit for bit the scalar helper of an FMA build (NaN as NaN)."""
    p = isa.p
    text = gelu_text("auto") + vector_gelu_text(isa) + "\n".join([
        "int many(const float* x, float* y, long n) {",
        f"#if {isa.guard}",
        "  long i = 0;",
        f"  for (; i + {isa.lanes} <= n; i += {isa.lanes}) {p}_storeu_ps(y + i, "
        f"{vector_name(GELU_HELPER, isa)}({p}_loadu_ps(x + i)));",
        f"  for (; i < n; ++i) y[i] = {GELU_HELPER}(x[i]);",
        "  return 1;",
        "#else",
        "  (void)x; (void)y; (void)n; return 0;",
        "#endif",
        "}", ""])
    vec = _compile(tmp_path, f"gelu_{isa.name}", text, "many")
    scalar = _compile(tmp_path, "gelu_scalar", gelu_text("auto") + (
        f"int many(const float* x, float* y, long n) {{\n"
        f"  for (long i = 0; i < n; ++i) y[i] = {GELU_HELPER}(x[i]);\n  return 1;\n}}\n"), "many")
    x = _inputs()
    got = vec(x)
    if got is None:
        pytest.skip(f"this compiler does not target {isa.name}")
    want = scalar(x)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def _gelu_graph(n: int):
    b = GraphBuilder("gelu")
    x = b.input("x", (4, n))
    w = b.const("w", np.random.default_rng(3).standard_normal((n, n)).astype(np.float32) * 0.5)
    bias = b.const("bias", np.random.default_rng(4).standard_normal(n).astype(np.float32))
    y = b.op("Gelu", b.op("Add", b.op("MatMul", x, w, name="mm"), bias, name="add"), name="gelu")
    return b.build(y)


def test_gelu_kernels_call_the_helper_not_erf(cache_dir):
    """A MatMul + Add + Gelu epilogue and a Gelu kernel alone. The epilogue, in the storing micro-kernel's
    registers, calls the helper's vector forms, and its part blocks' C loops the helper (the same bits); the kernel
    alone, its explicit-SIMD loops and their remainders the helper, and its C loops under ``#else`` (no such ISA)
    the erf form, which a C compiler vectorises, unless ``scalar_gelu_table``; the plain C99 build only erf; all
    match the reference."""
    g = _gelu_graph(40)
    for plan in (group_by_names(g, [("gemm_epilogue", ["mm", "add", "gelu"])]), FusionPlan.unfused(g)):
        src = generate(g, plan).source
        assert f"{GELU_HELPER}(" in src and (f"{ERF_HELPER}(" in src) == (len(plan.groups) > 1)
        table = generate(g, plan, options=CodegenOptions(scalar_gelu_table=True)).source
        assert ERF_HELPER not in table
        plain = generate(g, plan, options=CodegenOptions(simd="none")).source
        assert GELU_HELPER not in plain and f"{ERF_HELPER}(" in plain
        for options in (None, CodegenOptions(scalar_gelu_table=True), CodegenOptions(simd="none")):
            got, want, _ = run_both(g, plan, cache_dir, options=options)
            assert_close(got, want)
