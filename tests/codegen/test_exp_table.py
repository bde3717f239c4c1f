"""``CodegenOptions.exp_table``: exp(x) for x <= 0 (``vecmath.opfuse_expf_nonpos``) by a 16-entry table of 2^(j/16)
and a degree-3 polynomial. Off by default, and then no C changes; on, the scalar helper (with and without fused
multiply-adds) and every helper built on it stay within the bounds ``test_vecmath`` holds the default form to, over
every 4099th float32 pattern of both signs and a grid over [-110, 110], and the AVX-512 and AVX2 forms give the scalar
loop's bits for each op that uses it and for the staged chain (all 2^32 inputs of exp_nonpos and Sigmoid were
checked once by hand, 2026-12-02: no difference)."""
from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest

from opfuse.codegen import CodegenOptions, generate, vecmath
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import Toolchain, ToolchainError

TABLE = dict(exp_table=True, gemm_register_activations="all")  # the table's forms in the micro-kernel too
VECTOR = {"avx512": CodegenOptions(vector_isa="avx512", **TABLE), "avx2": CodegenOptions(vector_isa="avx2", **TABLE)}
GCC_LOOP = CodegenOptions(simd_elementwise=False, **TABLE)
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.2e-38, -1.2e-38, 3.4e38, -3.4e38,
                    88.72, -87.3, -103.9, -103.99, -104.0, -104.5, 1e6, -1e6], np.float32)
EXP_NONPOS_ULP = 1.5  # as test_vecmath's for the default form (measured 1.00 with fused multiply-adds, all inputs)


def _sigmoid(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _softplus(x):
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


BOUNDS = {vecmath.SIGMOID: (_sigmoid, 3.0), vecmath.TANH: (np.tanh, 2.0), vecmath.SOFTPLUS: (_softplus, 3.0)}


def _sweep() -> np.ndarray:
    pos = np.arange(0, 0x7F800000, 4099, dtype=np.uint32).view(np.float32)
    grid = np.linspace(-110.0, 110.0, 400_001, dtype=np.float32)
    return np.concatenate([pos, -pos, grid, SPECIAL])


def _ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """|got - exact| in ulps of the float32-rounded exact result (2^-149 below the normals); 0 where both are NaN
    or the same infinity, inf where only one is NaN."""
    with np.errstate(all="ignore"):
        e32 = exact.astype(np.float32)
        err = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(e32)).astype(np.float64)
        same = (np.isnan(got) & np.isnan(exact)) | (np.isinf(got) & (got == e32))
        err = np.where(same, 0.0, err)
    return np.where(np.isnan(err), np.inf, err)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except that a NaN may be any NaN."""
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def _one_op(op: str, attrs: dict, n: int):
    b = GraphBuilder(f"op_{op.lower()}")
    return b.build(b.op(op, b.input("x", (n,)), **attrs))


def test_off_by_default_on_in_scalar_and_vector_forms():
    g = _one_op("Sigmoid", {}, 1000)
    plan = FusionPlan.unfused(g)
    default = generate(g, plan).source
    assert "table[16]" not in default and "permutexvar" not in default
    assert default == generate(g, plan, options=CodegenOptions(exp_table=False)).source
    on = generate(g, plan, options=CodegenOptions(vector_isa="avx512", **TABLE)).source  # with its AVX2 form
    assert "table[t.u & 15u]" in on and "_mm512_permutexvar_ps" in on and "_mm256_permutevar8x32_ps" in on
    on = generate(g, plan, options=CodegenOptions(vector_isa="avx2", **TABLE)).source
    assert "table[t.u & 15u]" in on and "_mm512" not in on and "_mm256_permutevar8x32_ps" in on
    assert "table[t.u & 15u]" in generate(g, plan, options=CodegenOptions(simd="none", **TABLE)).source


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_helpers_within_their_bounds(simd, tmp_path):
    """exp_nonpos on x <= 0 and NaN (1 at -0, 0 from -104 down and at -inf), and Sigmoid, Tanh and Softplus built
    on it, against float64 NumPy, with fused multiply-adds ("auto") and as the plain C99 build ("none")."""
    try:
        tc = Toolchain.detect(threads=False)
    except ToolchainError:
        pytest.skip("no C compiler")
    names = (vecmath.EXP_NONPOS, *BOUNDS)
    src = tmp_path / "t.c"
    src.write_text("#include <math.h>\n#include <stdint.h>\n" + vecmath.all_helpers_text(simd, exp_table=True) +
                   "".join(f"void many_{h}(const float* restrict x, float* restrict y, long n) {{\n"
                           f"  for (long i = 0; i < n; ++i) y[i] = {h}(x[i]);\n}}\n" for h in names))
    assert "table[t.u & 15u]" in src.read_text()
    lib = tmp_path / "t.so"
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))

    def run(h: str, x: np.ndarray) -> np.ndarray:
        fn = getattr(dll, f"many_{h}")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        fn(x.ctypes.data, y.ctypes.data, x.size)
        return y
    x = _sweep()
    neg = -np.abs(x)
    y = run(vecmath.EXP_NONPOS, neg)
    with np.errstate(all="ignore"):
        err = _ulp_error(y, np.exp(neg.astype(np.float64)))
    worst = int(np.argmax(err))
    assert err[worst] <= EXP_NONPOS_ULP, f"expf_nonpos({neg[worst]!r}) off by {err[worst]:.2f} ulp"
    edge = run(vecmath.EXP_NONPOS, np.array([-0.0, -np.inf, np.nan, -104.0, -104.5, -1e6], np.float32))
    assert edge[0] == 1.0 and edge[1] == 0.0 and np.isnan(edge[2]) and np.all(edge[3:] == 0.0)
    for h, (ref, bound) in BOUNDS.items():
        with np.errstate(all="ignore"):
            err = _ulp_error(run(h, x), ref(x.astype(np.float64)))
        worst = int(np.argmax(err))
        assert err[worst] <= bound, f"{h}({x[worst]!r}) off by {err[worst]:.2f} ulp"


@pytest.mark.parametrize("op,attrs", [("Sigmoid", {}), ("Silu", {}), ("Tanh", {}), ("Softplus", {}),
                                      ("Gelu", {"approximate": "tanh"})], ids=lambda v: str(v) if v else "")
def test_vector_forms_are_the_scalar_loops_bits(op, attrs, cache_dir):
    x = _sweep()
    g = _one_op(op, attrs, x.size)
    plan = FusionPlan(g, [FusionGroup("k", list(g.nodes), "elementwise")])
    want = next(iter(build(g, plan, cache_dir=cache_dir, options=GCC_LOOP).run({"x": x}).values()))
    default = next(iter(build(g, plan, cache_dir=cache_dir).run({"x": x}).values()))
    finite = np.isfinite(want)
    assert np.allclose(want[finite], default[finite], rtol=1e-6, atol=1e-37)  # the same function, in other bits
    for name, options in VECTOR.items():
        got = next(iter(build(g, plan, cache_dir=cache_dir, options=options).run({"x": x}).values()))
        assert _same_bits(got, want), name


def test_staged_chain_is_the_scalar_loops_bits(cache_dir):
    """The bench's chain8 (a Sigmoid staged in two passes) on 4099 floats: a remainder after the vectors."""
    n = 4099
    b = GraphBuilder("chain")
    x = b.input("x", (n,))

    def c(name: str, v: float):
        return b.const(name, np.float32(v))
    y = b.op("Sub", b.op("Relu", b.op("Add", b.op("Mul", x, c("half", 0.5)), c("quarter", 0.25))), c("one", 1.0))
    y = b.op("Add", b.op("Clip", b.op("Mul", b.op("Sigmoid", y), x), c("lo", -2.0), c("hi", 2.0)), c("e", 0.125))
    g = b.build(y)
    plan = FusionPlan(g, [FusionGroup("chain", list(g.nodes), "elementwise")])
    xv = (np.random.default_rng(0).standard_normal(n) * 40).astype(np.float32)
    xv[:len(SPECIAL)] = SPECIAL
    want = next(iter(build(g, plan, cache_dir=cache_dir, options=GCC_LOOP).run({"x": xv}).values()))
    for name, options in VECTOR.items():
        assert "sigmoidf_tail" in generate(g, plan, options=options).source
        got = next(iter(build(g, plan, cache_dir=cache_dir, options=options).run({"x": xv}).values()))
        assert _same_bits(got, want), name


@pytest.mark.parametrize("act", ["Silu", "Sigmoid"])
def test_conv_epilogues_are_the_scalar_epilogues_bits(act, cache_dir):
    """Conv 1x1 (20 channels: full blocks by the storing micro-kernel, in registers, and a part block through the C
    tile's vector epilogue) -> SiLU or Sigmoid: bitwise the scalar epilogue of the same options
    (``vector_epilogue=False``), within float32 rounding of the default build."""
    rng = np.random.default_rng(4)
    b = GraphBuilder(f"conv_{act.lower()}")
    w = b.const("w", (rng.standard_normal((20, 16, 1, 1)) / 4).astype(np.float32))
    bias = b.const("bias", (rng.standard_normal(20) * 2).astype(np.float32))
    g = b.build(b.op(act, b.op("Conv", b.input("x", (1, 16, 23, 41)), w, bias, name="conv")))
    plan = FusionPlan(g, [FusionGroup("g", list(g.nodes), "conv_epilogue", g.nodes[0])])
    x = (rng.standard_normal((1, 16, 23, 41)) * 12).astype(np.float32)
    for isa, permute in (("avx512", "_mm512_permutexvar_ps"), ("avx2", "_mm256_permutevar8x32_ps")):
        src = generate(g, plan, options=CodegenOptions(vector_isa=isa, **TABLE)).source
        assert "applied and stored by the micro-kernel" in src and permute in src, isa
    want = next(iter(build(g, plan, cache_dir=cache_dir, threads=1,
                           options=CodegenOptions(vector_epilogue=False, **TABLE)).run({"x": x}).values()))
    default = next(iter(build(g, plan, cache_dir=cache_dir, threads=1).run({"x": x}).values()))
    assert np.allclose(want, default, rtol=1e-6, atol=1e-37)
    for name, options in VECTOR.items():
        got = next(iter(build(g, plan, cache_dir=cache_dir, threads=1, options=options).run({"x": x}).values()))
        assert _same_bits(got, want), name
