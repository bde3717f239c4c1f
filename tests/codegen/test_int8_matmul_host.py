"""The host's int8 MatMul (``codegen/qmatmul_host.py``): ``qgemm.py``'s word GEMM with the output columns in the
lanes and the requantizing epilogue with one column's constants per lane. Integer arithmetic: bit-exact (no
tolerance) against the reference executor and the portable kernel (``simd="none"``, ``qmatmul.py``), built for
AVX-512 (the u8 x s8 quads: ``vpdpbusd`` on this host, two ``vpmaddwd`` with ``-mno-avx512f``), for AVX2 (the
int16 pairs) and without AVX2 (the plain ``#else`` over the same packed weights); odd M, N, K, per-tensor and
per-column scales, zero points, Relu clamps, bias, residuals, in-place plans; where it is not used, the reason."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier, residual_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run
from test_int8_host import _built_with, _feeds, one_kernel_bit_exact

DTYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
HOST_NOTE = "host word GEMM, columns in lanes"
AVX512, AVX2 = CodegenOptions(vector_isa="avx512"), CodegenOptions(vector_isa="avx2")
NEON = CodegenOptions(vector_isa="neon")


def qmatmul(M=5, K=37, N=11, x_dtype="int8", zp=-7, out_dtype="int8", out_zp=3, relu=False, bias=True,
            per_column=True, residual=False, res_dtype="int8", scales=(1e-4, 3e-3), wmax=128, seed=0):
    """x (M x K, 8-bit) -> Cast/Sub(zp) -> MatMul(W) -> [Add(bias)] -> Requantize [+ residual r] -> y (M x N)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("qmatmul")
    x = b.input("x", (M, K), x_dtype)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(zp, np.int32)))
    w = rng.integers(-wmax, wmax, (K, N)).astype(np.int32)
    acc = b.op("MatMul", xc, b.const("w", w), name="mm")
    if bias:
        acc = b.op("Add", acc, b.const("bias", rng.integers(-3000, 3000, (N,)).astype(np.int32)))
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(*scales, N if per_column else 1)]
    shape = (N,) if per_column else ()
    mult = np.array([p[0] for p in pairs], np.int32).reshape(shape)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(shape)
    info = np.iinfo(np.dtype(out_dtype))
    lo = out_zp if relu else int(info.min)
    args = [acc, b.const("m", mult), b.const("s", shift)]
    if residual:
        r = b.input("r", (M, N), res_dtype)
        rzp = 5 if res_dtype == "int8" else 120
        rc = b.op("Sub", b.op("Cast", r, to=int(TensorProto.INT32)), b.const("rzp", np.array(rzp, np.int32)))
        rm = np.array([residual_multiplier(float(m), int(s)) for m, s in
                       zip(rng.uniform(0.3, 1.5, N), np.broadcast_to(shift, (N,)), strict=True)], np.int64)
        args += [rc, b.const("rm", rm)]
    y = b.op("Requantize", *args, zero_point=out_zp, lo=lo, hi=int(info.max), to=int(DTYPES[out_dtype]))
    return b.build(y)


def check(g, options=AVX512, expect_host=True):
    comp, source = one_kernel_bit_exact(g, options)
    assert (HOST_NOTE in source) == expect_host
    return comp, source


CASES = {
    "odd": {},
    "gemv": {"M": 1, "K": 64, "N": 40},
    "k-not-multiple-of-4": {"M": 9, "K": 7, "N": 30},
    "k1": {"M": 3, "K": 1, "N": 9},
    "wide": {"M": 17, "K": 50, "N": 77},
    "n-below-a-vector": {"M": 12, "K": 33, "N": 3},
    "per-tensor": {"per_column": False, "M": 6, "N": 26},
    "uint8-in-out": {"x_dtype": "uint8", "zp": 128, "out_dtype": "uint8", "out_zp": 100},
    "uint8-zero-point-outside": {"x_dtype": "uint8", "zp": -3, "N": 13},
    "int8-zero-point-extremes": {"zp": 127, "M": 4, "N": 17},
    "relu": {"relu": True, "M": 8, "N": 24},
    "no-bias": {"bias": False},
    "residual-int8": {"residual": True, "M": 7, "N": 19},
    "residual-uint8": {"residual": True, "res_dtype": "uint8", "out_dtype": "uint8", "out_zp": 0, "N": 33},
    "shifts-mixed": {"scales": (1e-9, 0.5), "N": 16},
    "wide-weights": {"wmax": 30000, "K": 21, "N": 12},  # beyond int8: the pairs, also in the AVX-512 build
    "weights-int8-edge": {"wmax": 129, "K": 45},
    "deep": {"M": 10, "K": 700, "N": 20, "scales": (1e-6, 1e-5)},
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_host_int8_matmul_is_bit_exact(case):
    check(qmatmul(**CASES[case]))


@pytest.mark.parametrize("case", ["odd", "gemv", "k-not-multiple-of-4", "uint8-in-out", "residual-int8", "relu",
                                  "per-tensor"])
def test_host_int8_matmul_for_avx2_is_int16_pairs_and_bit_exact(case):
    _, source = check(qmatmul(**CASES[case]), AVX2)
    assert "int16 pairs" in source and "OPFUSE_Q8_DPBUSD_BX(" not in source


@pytest.mark.parametrize("params, kind", [({}, "u8 x s8 quads"), ({"wmax": 129}, "int16 pairs"),
                                          ({"x_dtype": "uint8", "zp": -3}, "int16 pairs")])
def test_quads_where_weights_fit_int8_and_the_zero_point_is_an_8_bit_value(params, kind):
    comp = plan_model(qmatmul(**params))
    source = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert f"columns in lanes, {kind}" in source


def test_64_bit_requantization_is_bit_exact():
    """Without the double path (``int8_requantize_double`` off): the 64-bit integer requantization per lane."""
    check(qmatmul(residual=True, M=6, N=21, scales=(1e-9, 0.5)), AVX512.with_(int8_requantize_double=False))


def test_plain_c_build_keeps_the_portable_kernel():
    comp = plan_model(qmatmul())
    source = generate(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).source
    assert HOST_NOTE not in source and "opfuse_dot2_s16" in source


def _two_readers(M=9):
    """uint8 x (M x 13) -> Cast/Sub -> MatMul -> Requantize, the accumulator also read by a Neg: two groups, the
    matmul's without its Requantize."""
    b = GraphBuilder("q")
    x = b.input("x", (M, 13), "uint8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(3, np.int32)))
    acc = b.op("MatMul", xc, b.const("w", np.arange(-65, 65).reshape(13, 10).astype(np.int32)), name="mm")
    y = b.op("Requantize", acc, b.const("m", np.array(1 << 30, np.int32)), b.const("s", np.array(40, np.int32)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    return b.build(y, b.op("Neg", acc))


@pytest.mark.parametrize("M", [9, 24])  # 24 rows: a whole number of every register block's rows (no row guard)
def test_other_epilogues_run_element_by_element_on_the_vector_gemm(M):
    """The accumulator also read by another op (no Requantize in the matmul's group): the word GEMM still, its
    accumulators handed to the stage's epilogue element by element; bit-exact in every build."""
    g = _two_readers(M)
    comp = plan_model(g)
    assert [grp.op_types for grp in comp.plan.groups][0] == ["Cast", "Sub", "MatMul"]
    source = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert "int8 matmul 'node_mm': epilogue element by element (the epilogue has no Requantize)" in source
    assert HOST_NOTE in source
    feeds = _feeds(g)
    want = run(g, feeds)
    for opts in (AVX512, AVX2, NEON):
        got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    for flag in ("-mno-avx512f", "-mno-avx2"):
        got = _built_with(comp.plan.graph, comp.plan, AVX512, flag).run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_same_c_twice():
    comp = plan_model(qmatmul(residual=True))
    a = generate(comp.plan.graph, comp.plan, options=AVX512).source
    b = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert a == b


# aarch64 (NEON sdot) under qemu-aarch64 ---------------------------------------------------------------------

NEON_CASES = ["odd", "gemv", "k-not-multiple-of-4", "wide", "per-tensor", "uint8-in-out", "residual-int8",
              "residual-uint8", "relu", "shifts-mixed"]


def _qemu(g, arch):
    from opfuse.runtime import aarch64
    comp = plan_model(g)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, None, options=NEON)
    assert "NEON s8 x s8 GEMM, columns in lanes" in program.source
    return aarch64.run_on_qemu(program, _feeds(g), arch=arch).outputs


def _needs_aarch64():
    from opfuse.runtime import aarch64
    if not aarch64.tools_available():
        pytest.skip("aarch64 tests need aarch64-linux-gnu-gcc and qemu-aarch64: run `make aarch64-tools`")


@pytest.mark.parametrize("case", NEON_CASES, ids=NEON_CASES)
def test_neon_int8_matmul_with_sdot_is_bit_exact(case):
    _needs_aarch64()
    g = qmatmul(**CASES[case])
    want = run(g, _feeds(g))
    (name,) = want
    np.testing.assert_array_equal(_qemu(g, "dotprod")[name], want[name])


@pytest.mark.parametrize("case", ["odd", "residual-uint8", "gemv"])
def test_neon_int8_matmul_without_the_dot_product_is_bit_exact(case):
    """Armv8.0-A: ``vmull_s8`` + ``vpadalq_s16`` over the same signed quads."""
    _needs_aarch64()
    g = qmatmul(**CASES[case])
    want = run(g, _feeds(g))
    (name,) = want
    np.testing.assert_array_equal(_qemu(g, "neon")[name], want[name])


def test_neon_build_compiled_for_x86_takes_the_plain_branch():
    g = qmatmul(residual=True, x_dtype="uint8", zp=100, N=19)
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(build(comp.plan.graph, comp.plan, options=NEON).run(feeds)[name], want[name])


def test_neon_wide_weights_keep_the_portable_kernel_with_a_reason():
    """sdot multiplies int8 by int8: weights beyond int8 keep qmatmul.py's kernel, and the notes say why."""
    comp = plan_model(qmatmul(**CASES["wide-weights"]))
    source = generate(comp.plan.graph, comp.plan, options=NEON).source
    assert "host int8 kernel not used: NEON sdot needs int8 weights and an 8-bit zero point" in source
    assert "opfuse_dot2_s16" in source


def test_output_stored_over_its_residual_is_bit_exact():
    """The memory plan lays the output over the residual (an 8-bit tensor of its shape that dies here): each
    vector of 8 columns reads its residual before it stores over it, in every build."""
    from opfuse.codegen.qgemm import _shares_storage
    rng = np.random.default_rng(3)
    M, K, N = 6, 20, 19
    b = GraphBuilder("q")
    x = b.input("x", (M, K), "int8")
    r = b.op("Transpose", b.input("r0", (N, M), "int8"), perm=[1, 0])  # in the arena, dead after the matmul
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(3, np.int32)))
    acc = b.op("MatMul", xc, b.const("w", rng.integers(-128, 128, (K, N)).astype(np.int32)), name="mm")
    rc = b.op("Sub", b.op("Cast", r, to=int(TensorProto.INT32)), b.const("rzp", np.array(5, np.int32)))
    y = b.op("Requantize", acc, b.const("m", np.array(1 << 30, np.int32)), b.const("s", np.array(38, np.int32)), rc,
             b.const("rm", np.array(1 << 36, np.int64)), zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    g = b.build(b.op("Transpose", y, perm=[1, 0]))
    comp = plan_model(g)
    gg = comp.plan.graph

    class _Kernel:  # what _shares_storage reads of a kernel context
        program = type("Program", (), {"memory": comp.memory})
    assert _shares_storage(_Kernel, gg.values[r.name], gg.values[y.name])
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    for opts in (AVX512, AVX2, AVX512.with_(simd="none")):
        np.testing.assert_array_equal(build(gg, comp.plan, memory=comp.memory, options=opts).run(feeds)[name],
                                      want[name])
    for flag in ("-mno-avx512f", "-mno-avx2"):
        np.testing.assert_array_equal(_built_with(gg, comp.plan, AVX512, flag).run(feeds)[name], want[name])


@pytest.mark.parametrize("arch", ["dotprod", "neon"])
def test_neon_element_by_element_epilogue_is_bit_exact(arch):
    _needs_aarch64()
    from opfuse.runtime import aarch64
    g = _two_readers()
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, None, options=NEON)
    assert "epilogue element by element" in program.source
    got = aarch64.run_on_qemu(program, feeds, arch=arch).outputs
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("case", ["odd", "gemv", "wide", "residual-uint8", "relu"])
def test_ymm_micro_kernel_without_the_zmm_option_is_bit_exact(case):
    """``int8_matmul_zmm=False``: qgemm's ymm micro-kernel (8 columns a vector) instead of the zmm one."""
    _, source = check(qmatmul(**CASES[case]), AVX512.with_(int8_matmul_zmm=False))
    assert "opfuse_q8mm_mk16_" not in source and "16 columns per zmm" not in source


def test_the_avx512_build_takes_the_zmm_micro_kernel():
    comp = plan_model(qmatmul(M=16, K=40, N=50))
    source = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert "16 columns per zmm" in source and "_mm512_dpbusd_epi32" in source


@pytest.mark.parametrize("options", [AVX2, AVX512.with_(simd="auto")], ids=["avx2-pairs", "avx512"])
def test_two_matmuls_with_other_input_zero_points_each_subtract_their_own(options):
    """Two integer matmuls of one model whose 8-bit inputs have different zero points: the AVX2 build packs each
    input as int16 pairs less its zero point in a helper, which carried the first matmul's zero point alone under
    one name (a chain of two QDQ products found by the fuzzer computed the second from its input less the first's
    zero point: 128 where the reference gave 0). Bit-exact against the reference, each matmul on its own zero
    point; the wide weights (int16 range) take the pairs in the AVX-512 build too."""
    b = GraphBuilder("two_zero_points")
    rng = np.random.default_rng(3)
    outs = []
    for i, (dtype, zp, wmax) in enumerate((("uint8", 0, 128), ("uint8", 128, 128), ("int8", -7, 30000))):
        x = b.input(f"x{i}", (3, 9), dtype)
        xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const(f"zp{i}", np.array(zp, np.int32)))
        acc = b.op("MatMul", xc, b.const(f"w{i}", rng.integers(-wmax, wmax, (9, 5)).astype(np.int32)))
        mult, shift = fixed_point_multiplier(1e-4 if wmax > 128 else 3e-3)
        outs.append(b.op("Requantize", acc, b.const(f"m{i}", np.array(mult, np.int32)),
                         b.const(f"s{i}", np.array(shift, np.int32)), zero_point=0, lo=-128, hi=127,
                         to=int(TensorProto.INT8)))
    g = b.build(*outs)
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    source = generate(comp.plan.graph, comp.plan, options=options).source
    if options is AVX2:
        assert "opfuse_q8mm_pack_pairs_z0_u8" in source and "opfuse_q8mm_pack_pairs_z128_u8" in source
    got = build(comp.plan.graph, comp.plan, options=options).run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
