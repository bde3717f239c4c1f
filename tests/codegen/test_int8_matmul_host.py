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
from test_int8_host import _avx2_only, _built_with, _feeds

DTYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
HOST_NOTE = "host word GEMM, columns in lanes"
AVX512, AVX2 = CodegenOptions(vector_isa="avx512"), CodegenOptions(vector_isa="avx2")


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
    comp = plan_model(g)
    assert len(comp.plan.groups) == 1  # Cast/Sub prologue, matmul, bias, requantize (and residual): one kernel
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    source = generate(comp.plan.graph, comp.plan, options=options).source
    assert (HOST_NOTE in source) == expect_host
    for opts in (options, options.with_(simd="none")):
        got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
        np.testing.assert_array_equal(got[name], want[name])
    np.testing.assert_array_equal(_avx2_only(comp.plan.graph, comp.plan, options).run(feeds)[name], want[name])
    got = _built_with(comp.plan.graph, comp.plan, options, "-mno-avx2").run(feeds)
    np.testing.assert_array_equal(got[name], want[name])
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
    source = generate(plan_model(qmatmul(**params)).plan.graph, plan_model(qmatmul(**params)).plan,
                      options=AVX512).source
    assert f"columns in lanes, {kind}" in source


def test_64_bit_requantization_is_bit_exact():
    """Without the double path (``int8_requantize_double`` off): the 64-bit integer requantization per lane."""
    check(qmatmul(residual=True, M=6, N=21, scales=(1e-9, 0.5)), AVX512.with_(int8_requantize_double=False))


def test_plain_c_build_keeps_the_portable_kernel():
    comp = plan_model(qmatmul())
    source = generate(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).source
    assert HOST_NOTE not in source and "opfuse_dot2_s16" in source


def test_unmatched_epilogue_keeps_the_portable_kernel_with_a_reason():
    """The accumulator also stored (a second reader): the portable kernel, the reason in the notes."""
    b = GraphBuilder("q")
    x = b.input("x", (4, 9), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(3, np.int32)))
    acc = b.op("MatMul", xc, b.const("w", np.arange(-45, 45).reshape(9, 10).astype(np.int32)), name="mm")
    y = b.op("Requantize", acc, b.const("m", np.array(1 << 30, np.int32)), b.const("s", np.array(40, np.int32)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    g = b.build(y, b.op("Neg", acc))
    comp = plan_model(g)
    source = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert "int8 matmul 'mm': host int8 kernel not used:" in " ".join(
        n for k in comp.report.get("kernels", []) for n in k.get("notes", [])) or "host int8 kernel not used" in source
    feeds = _feeds(g)
    want = run(g, feeds)
    got = build(comp.plan.graph, comp.plan, options=AVX512).run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_same_c_twice():
    comp = plan_model(qmatmul(residual=True))
    a = generate(comp.plan.graph, comp.plan, options=AVX512).source
    b = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert a == b
