"""The host's int8 convolution (``codegen/qgemm.py``): the int16-pair GEMM and the vectorised depthwise with
the requantizing epilogue in AVX2 vectors. Integer arithmetic: bit-exact against the reference executor (no
tolerance), with AVX512-VNNI (this host, ``-march=native``), with AVX2 alone (``-mno-avx512f``) and on the
plain C99 path (``simd="none"``); shapes with remainders, 8-bit types in and out, residuals, clamps,
per-channel shifts on both sides of 32; and where the host kernel is not used, the reason."""
from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.outline import parallel_loops
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier, residual_multiplier
from opfuse.runtime.native import CompiledModel, build
from opfuse.runtime.reference import run
from opfuse.runtime.toolchain import Toolchain, build_library, find_compiler, supports_sanitizer

HOST_KERNEL = "opfuse_q8_requantize("
DTYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}


def qconv(cin=6, cout=5, hw=(9, 7), k=3, stride=1, pad=1, dilation=1, group=1, x_dtype="int8", zp=-7,
          out_dtype="int8", out_zp=3, relu=False, residual=False, res_dtype="int8", shifts=(1e-4, 3e-3),
          wmax=128, bias=True, seed=0, kw=None, batch=1, bias_input=False, dequantized=None):
    """x (8-bit) -> Cast/Sub(zp) -> Conv -> [Add(bias)] -> Requantize [+ residual r (8-bit)] -> y (8-bit);
    ``bias_input``: the bias as the Conv's third input (1-D) instead of an Add; ``dequantized``: instead of the
    Requantize, ``Cast(acc) * scale`` (float, per channel: ``integer_conv_dequantized``'s form), then that
    activation ("" for none)."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("qconv")
    x = b.input("x", (batch, cin) + hw, x_dtype)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(zp, np.int32)))
    kw = k if kw is None else kw
    w = rng.integers(-wmax, wmax, (cout, cin // group, k, kw)).astype(np.int32)
    bias_values = rng.integers(-3000, 3000, (1, cout, 1, 1)).astype(np.int32) if bias else None
    conv_bias = [b.const("bias", bias_values.reshape(cout))] if bias and bias_input else []
    acc = b.op("Conv", xc, b.const("w", w), *conv_bias, name="conv", pads=[pad] * 4, strides=[stride] * 2,
               dilations=[dilation] * 2, group=group)
    if bias and not bias_input:
        acc = b.op("Add", acc, b.const("bias", bias_values))
    if dequantized is not None:
        scale = rng.uniform(1e-5, 3e-4, (cout, 1, 1)).astype(np.float32)
        y = b.op("Mul", b.op("Cast", acc, to=int(TensorProto.FLOAT)), b.const("dq_scale", scale), name="dequantize")
        return b.build(b.op(dequantized, y, name="act") if dequantized else y)
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(*shifts, cout)]
    mult = np.array([p[0] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    info = np.iinfo(np.dtype(out_dtype))
    lo = out_zp if relu else int(info.min)
    args = [acc, b.const("m", mult), b.const("s", shift)]
    if residual:
        oh = (hw[0] + 2 * pad - dilation * (k - 1) - 1) // stride + 1
        ow = (hw[1] + 2 * pad - dilation * (kw - 1) - 1) // stride + 1
        r = b.input("r", (batch, cout, oh, ow), res_dtype)
        rzp = 5 if res_dtype == "int8" else 120
        rc = b.op("Sub", b.op("Cast", r, to=int(TensorProto.INT32)), b.const("rzp", np.array(rzp, np.int32)))
        ms = zip(rng.uniform(0.3, 1.5, cout), shift.reshape(-1), strict=True)
        rm = np.array([residual_multiplier(float(m), int(s)) for m, s in ms], np.int64).reshape(1, cout, 1, 1)
        args += [rc, b.const("rm", rm)]
    y = b.op("Requantize", *args, zero_point=out_zp, lo=lo, hi=int(info.max), to=int(DTYPES[out_dtype]))
    return b.build(y)


def _feeds(g, seed=1):
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        info = np.iinfo(v.dtype)
        feeds[v.name] = rng.integers(info.min, info.max + 1, v.shape).astype(v.dtype)
    return feeds


def _built_with(graph, plan, options: CodegenOptions, flag: str) -> CompiledModel:
    """The same C built with ``flag`` added: ``-mno-avx512f`` (an AVX2-only CI machine: vpmaddwd, the quads by
    two vpmaddwd, 64-bit compare-and-blend clamps) or ``-mno-avx2`` (a compiler without AVX2: the plain C
    ``#else`` branch over the same packed weights)."""
    tc = Toolchain.detect()
    tc = dataclasses.replace(tc, flags=tc.flags + (flag,), identity=tc.identity + " " + flag)
    program = generate(graph, plan, options=options)
    library = build_library(program.source, tc, None, prelude=program.prelude)
    return CompiledModel(graph, plan, program, tc, library, threads=1)


def _avx2_only(graph, plan, options: CodegenOptions) -> CompiledModel:
    return _built_with(graph, plan, options, "-mno-avx512f")


# The ISA fixed (not this machine's): the packed weights follow it, so the C, the notes and the blob are the same
# on any machine; compiled here with the machine's own flags (and without AVX-512, and without AVX2, below).
HOST = CodegenOptions(vector_isa="avx512")


def one_kernel_bit_exact(g, options: CodegenOptions, *, avx2=True, plain_else=True):
    """``g`` planned as one kernel (the Cast/Sub prologue, the conv or matmul, bias, Requantize and what follows
    it) whose outputs equal the reference's exactly: built with ``options``, plain (``simd="none"``), and unless
    turned off without AVX-512 (``avx2``) and without AVX2 (``plain_else``, the ``#else`` branch); every run with
    guard bytes around the outputs, arena and scratch (``run_guarded``: a store out of bounds fails). Returns the
    plan and the C for ``options``."""
    comp = plan_model(g)
    assert len(comp.plan.groups) == 1
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    source = generate(comp.plan.graph, comp.plan, options=options).source
    for opts in (options, options.with_(simd="none")):
        got = build(comp.plan.graph, comp.plan, options=opts).run_guarded(feeds)
        np.testing.assert_array_equal(got[name], want[name])
    if avx2:
        got = _avx2_only(comp.plan.graph, comp.plan, options).run_guarded(feeds)
        np.testing.assert_array_equal(got[name], want[name])
    if plain_else:
        got = _built_with(comp.plan.graph, comp.plan, options, "-mno-avx2").run_guarded(feeds)
        np.testing.assert_array_equal(got[name], want[name])
    return comp, source


def check(g, *, expect_host=True, avx2=True, plain_else=True, options: CodegenOptions = HOST):
    comp, source = one_kernel_bit_exact(g, options, avx2=avx2, plain_else=plain_else)
    assert (HOST_KERNEL in source.split("static", 1)[1] if expect_host else HOST_KERNEL not in source)
    return comp


CASES = {
    "3x3": {},
    "1x1-flat": {"k": 1, "pad": 0, "cin": 16, "cout": 13, "hw": (5, 7)},
    "1x1-flat-zmm": {"k": 1, "pad": 0, "cin": 22, "cout": 13, "hw": (7, 9), "residual": True},  # rows >= 48: zmm
    "3x3-wide-rows-zmm": {"cin": 9, "cout": 10, "hw": (5, 53), "x_dtype": "uint8", "zp": 140},
    "1x1-stride2": {"k": 1, "pad": 0, "stride": 2, "cin": 8, "cout": 9, "hw": (9, 9)},
    "stride2": {"stride": 2, "cout": 11, "hw": (13, 17)},
    "dilation2": {"dilation": 2, "pad": 2, "cout": 7},
    "odd-channels": {"cin": 3, "cout": 7, "pad": 0, "hw": (11, 20)},
    "grouped-odd": {"group": 2, "cin": 6, "cout": 10},
    "wide-row": {"cin": 5, "cout": 12, "hw": (4, 29)},
    "rect-kernel": {"k": 5, "pad": 2, "cin": 1, "cout": 9, "hw": (12, 6)},
    "mono-10x4-stride2": {"k": 10, "kw": 4, "pad": 4, "stride": 2, "cin": 1, "cout": 12, "hw": (29, 10)},
    "mono-dilated-uint8": {"k": 3, "kw": 7, "dilation": 2, "pad": 3, "cin": 1, "cout": 5, "hw": (9, 23),
                           "x_dtype": "uint8", "zp": 200},
    "grouped-mono": {"group": 2, "cin": 2, "cout": 6, "kw": 6, "pad": 2, "hw": (7, 13)},
    "uint8-in-out": {"x_dtype": "uint8", "zp": 128, "out_dtype": "uint8", "out_zp": 100},
    "relu-clamp": {"relu": True, "cout": 8, "hw": (8, 16)},
    "residual-int8": {"residual": True, "cout": 6, "hw": (8, 11)},
    "residual-uint8-stride2": {"residual": True, "res_dtype": "uint8", "stride": 2, "cout": 13, "hw": (10, 19)},
    "shifts-below-32": {"shifts": (0.05, 0.9)},
    "shifts-mixed": {"shifts": (1e-9, 0.5), "cout": 16},
    "wide-weights": {"wmax": 30000, "cin": 4, "cout": 6},
    "weights-int8-edge": {"wmax": 129, "cin": 9, "cout": 6},
    "uint8-zero-point-outside": {"x_dtype": "uint8", "zp": -3, "cin": 5},
    "int8-zero-point-extremes": {"zp": 127, "cin": 7, "stride": 2, "hw": (9, 33)},
    "no-bias": {"bias": False, "cout": 7},
    "batch3-residual": {"batch": 3, "residual": True, "cout": 9, "stride": 2, "hw": (8, 12)},
    "batch2-grouped-uint8": {"batch": 2, "group": 3, "cin": 6, "cout": 9, "x_dtype": "uint8", "zp": 99},
    "batch2-dw-channels": {"batch": 2, "group": 10, "cin": 10, "cout": 10, "residual": True, "hw": (5, 6)},
    "batch2-dw-rows": {"batch": 2, "group": 4, "cin": 4, "cout": 4, "hw": (5, 17)},
    "deep-small-plane": {"cin": 20, "cout": 40, "hw": (3, 3), "residual": True},  # weights in the outer loop
    "dw": {"group": 6, "cin": 6, "cout": 6},
    "dw-stride2-odd": {"group": 5, "cin": 5, "cout": 5, "stride": 2, "hw": (13, 21)},
    "dw-residual-uint8": {"group": 4, "cin": 4, "cout": 4, "residual": True, "x_dtype": "uint8", "zp": 130,
                          "out_dtype": "uint8", "out_zp": 0, "relu": True, "hw": (6, 19)},
    "dw-dilation": {"group": 3, "cin": 3, "cout": 3, "dilation": 2, "pad": 2, "hw": (7, 5)},
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_host_int8_conv_is_bit_exact(case):
    check(qconv(**CASES[case], seed=len(case)))



DEQUANTIZED = {  # case -> (qconv parameters, the host GEMM takes it)
    "3x3-sigmoid": ({"dequantized": "Sigmoid"}, True),
    "1x1-flat-zmm-silu": ({"k": 1, "pad": 0, "cin": 22, "cout": 13, "hw": (7, 9), "dequantized": "HardSwish"}, True),
    "stride2-uint8-alone": ({"stride": 2, "cout": 11, "hw": (13, 17), "x_dtype": "uint8", "zp": 140,
                             "dequantized": ""}, True),
    "grouped-no-bias-tanh": ({"group": 2, "cin": 6, "cout": 10, "bias": False, "dequantized": "Tanh"}, True),
    "pairs-wide-weights": ({"wmax": 30000, "cin": 4, "cout": 6, "dequantized": "Relu"}, True),
    "dw-refused": ({"group": 6, "cin": 6, "cout": 6, "dequantized": "Sigmoid"}, False),
    # one output element: every index of the epilogue a constant, its temporaries scoped per call (a drawn 1 x 1
    # quantized Conv + Sigmoid reused them in a later block and in the #else branch: "'t34' undeclared")
    "one-element-sigmoid": ({"k": 1, "pad": 0, "cin": 8, "cout": 1, "hw": (1, 1), "dequantized": "Sigmoid"}, True),
}


@pytest.mark.parametrize("case", list(DEQUANTIZED), ids=list(DEQUANTIZED))
def test_a_dequantizing_epilogue_is_the_gemms_and_bit_exact(case):
    """``Cast(acc + bias) * scale`` per channel (``integer_conv_dequantized``) in the host GEMM's epilogue in place
    of the Requantize, then the activation element by element: the same bits with AVX512-VNNI, AVX2 alone and the
    plain ``#else``, and the reference's bits for the dequantized value itself in those and the plain build (Relu
    too; the exp-based activations within their few ulps of the reference's); a depthwise conv keeps qconv.py's
    kernel and says why."""
    params, host = DEQUANTIZED[case]
    g = qconv(**params, seed=len(case))
    comp = plan_model(g)
    assert len(comp.plan.groups) == 1
    graph, plan = comp.plan.graph, comp.plan
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    builds = [build(graph, plan, options=HOST), _avx2_only(graph, plan, HOST),
              _built_with(graph, plan, HOST, "-mno-avx2"), build(graph, plan, options=HOST.with_(simd="none"))]
    got = [m.run_guarded(feeds)[name] for m in builds]
    for other in got[1:3]:  # the host build's three branches: the same C after the dequantization
        np.testing.assert_array_equal(other, got[0])
    for one in got:
        if params["dequantized"] in ("", "Relu"):
            np.testing.assert_array_equal(one, want[name])
        else:  # the activations' own C (the plain build's is its scalar form)
            np.testing.assert_allclose(one, want[name], rtol=2e-6, atol=1e-7)
    source = builds[0].program.source
    assert ("opfuse_q8_store_f32(" in source.split("opfuse_q8_store(void", 1)[-1]) == host
    notes = [n for k in builds[0].program.kernels for n in k.notes]
    if host:
        assert not any("host int8 kernel not used" in n for n in notes)
    else:
        assert any("a dequantizing epilogue on a depthwise convolution" in n for n in notes)

INT64_CASES = ("3x3", "1x1-flat", "residual-int8", "residual-uint8-stride2", "shifts-below-32", "shifts-mixed",
               "uint8-in-out", "relu-clamp", "int8-zero-point-extremes", "batch2-dw-channels", "dw-residual-uint8",
               "dw-stride2-odd")


def _kernel_body(source: str) -> str:
    return source[source.index("static void k0_"):]


@pytest.mark.parametrize("case", INT64_CASES, ids=INT64_CASES)
def test_host_int8_conv_with_the_64_bit_requantization_is_bit_exact(case):
    """With the requantization in double off (``int8_requantize_double=False``) every channel takes the 64-bit
    integer sequence (vpmuldq, rounding by shifts), exact too."""
    options = HOST.with_(int8_requantize_double=False)
    comp = check(qconv(**CASES[case], seed=len(case)), options=options)
    body = _kernel_body(generate(comp.plan.graph, comp.plan, options=options).source)
    assert "opfuse_q8_requantize(" in body and "opfuse_q8_requantize_d(" not in body


@pytest.mark.parametrize(("params", "double"), [({}, True), ({"residual": True, "group": 4, "cin": 4, "cout": 4}, True),
                                                 ({"wmax": 30000, "cin": 4, "cout": 6}, False),
                                                 ({"cin": 64, "cout": 8, "k": 3}, False)],
                         ids=["short-sum", "depthwise-residual", "wide-weights", "long-sum"])
def test_requantization_in_double_only_where_exact_for_every_input(params, double):
    """The double path needs |acc * mult| + |res * rmult| < 2^53 for every accumulator the weights allow (the
    bound uses the weights' absolute sums and the 8-bit types' extremes): short sums take it, 64 input channels
    of 3x3 int8 weights (a bound near 2^24, times a 31-bit multiplier) or int16-wide weights do not."""
    g = qconv(**params)
    comp = check(g, avx2=False, plain_else=False)
    body = _kernel_body(generate(comp.plan.graph, comp.plan, options=HOST).source)
    assert ("opfuse_q8_requantize_d(" in body or "opfuse_q8_requantize_ds(" in body) == double
    assert ("opfuse_q8_requantize(" in body) == (not double)


SATURATING = {
    "int8-mostly-clamped": ({"shifts": (0.05, 0.3)}, True),
    "uint8-mostly-clamped": ({"out_dtype": "uint8", "out_zp": 120, "shifts": (0.05, 0.3)}, True),
    "1x1-zmm-residual": ({"k": 1, "pad": 0, "cin": 22, "cout": 13, "hw": (7, 9), "residual": True,
                          "shifts": (0.01, 0.2)}, True),
    "depthwise-positions": ({"group": 8, "cin": 8, "cout": 8, "hw": (6, 21), "shifts": (0.02, 0.3)}, True),
    "depthwise-channels-uint8": ({"group": 8, "cin": 8, "cout": 8, "hw": (6, 10), "stride": 2, "out_dtype": "uint8",
                                  "out_zp": 9, "shifts": (0.02, 0.3)}, True),
    "relu-clamp": ({"relu": True, "shifts": (0.05, 0.3)}, False),  # lo above the type's minimum: clamped in double
    "relu-depthwise": ({"group": 8, "cin": 8, "cout": 8, "hw": (6, 21), "relu": True, "shifts": (0.02, 0.3)}, False),
}


@pytest.mark.parametrize("case", list(SATURATING), ids=list(SATURATING))
def test_requantization_in_double_leaves_the_types_clamp_to_the_saturating_packs(case):
    """Where the clamp is the output type's whole range (no activation) and every value before rounding is below
    2^30, ``opfuse_q8_requantize_ds`` skips the clamp in double: the int32 -> 16 -> 8-bit saturating packs do it.
    Multipliers up to 0.3 put most outputs past the range, so both ends saturate; bit-exact with AVX-512, AVX2
    alone, the plain ``#else`` and the plain C99 build. A narrower clamp (a ReLU's bound) keeps the clamp."""
    params, saturating = SATURATING[case]
    g = qconv(**params, seed=len(case))
    comp = check(g)
    body = _kernel_body(generate(comp.plan.graph, comp.plan, options=HOST).source)
    assert ("opfuse_q8_requantize_ds(" in body) == saturating
    assert ("opfuse_q8_requantize_d(" in body) == (not saturating)
    want = run(g, _feeds(g))[g.outputs[0].name]
    info = np.iinfo(want.dtype)
    lo = info.min if saturating else int(params.get("out_zp", 3))
    assert (want == lo).mean() > 0.1 and (want == info.max).mean() > 0.1  # both ends clamped


def test_requantization_in_double_at_its_bound_is_bit_exact():
    """Inputs at the 8-bit extremes (the largest accumulators the bound allows) and multipliers whose products
    come within a factor 2 of 2^53, with shifts from 1 (ties at every odd accumulator) to 50."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("q")
    x = b.input("x", (1, 14, 6, 6), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(127, np.int32)))
    w = np.where(rng.random((24, 14, 3, 3)) < 0.5, -127, 127).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), name="conv", pads=[1] * 4)
    shift = np.concatenate([np.arange(1, 13), rng.integers(13, 51, 12)]).astype(np.int32)
    mult = rng.integers(1 << 30, 1 << 31, 24).astype(np.int32)
    y = b.op("Requantize", acc, b.const("m", mult.reshape(1, 24, 1, 1)), b.const("s", shift.reshape(1, 24, 1, 1)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    g = b.build(y)
    comp = plan_model(g)
    body = _kernel_body(generate(comp.plan.graph, comp.plan, options=HOST).source)
    assert "opfuse_q8_requantize_d(" in body  # 14 * 9 * 127 * 255 * 2^31 < 2^53
    assert "opfuse_q8_requantize_ds(" not in body  # but values up to 2^52 / 2^s: past 2^30, clamped in double
    feeds = {"x": np.where(rng.random((1, 14, 6, 6)) < 0.5, -128, 127).astype(np.int8)}
    want = run(g, feeds)
    (name,) = want
    assert np.abs(want[name]).max() < 127 or np.unique(want[name]).size > 3  # not everything clamped
    for flag in ("", "-mno-avx512f"):
        model = (build(comp.plan.graph, comp.plan, options=HOST) if not flag else
                 _built_with(comp.plan.graph, comp.plan, HOST, flag))
        np.testing.assert_array_equal(model.run(feeds)[name], want[name])


PAIRS_CASES = ("3x3", "1x1-flat", "stride2", "odd-channels", "grouped-odd", "rect-kernel", "mono-10x4-stride2",
               "uint8-in-out", "residual-uint8-stride2", "int8-zero-point-extremes", "batch2-grouped-uint8")


@pytest.mark.parametrize("case", PAIRS_CASES, ids=PAIRS_CASES)
def test_host_int8_conv_for_avx2_is_int16_pairs_and_bit_exact(case):
    """Built for AVX2 (``vector_isa="avx2"``) the weights are packed once as int16 pairs (vpmaddwd; vpdpwssd
    where the compiler has AVX512-VNNI), whatever their range."""
    options = CodegenOptions(vector_isa="avx2")
    comp = check(qconv(**CASES[case], seed=len(case)), options=options)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=options).kernels for n in k.notes]
    assert notes and all("host int16-pair GEMM" in n for n in notes)


@pytest.mark.parametrize(("isa", "bytes_per_weight"), [("avx512", 1), ("avx2", 2)])
def test_one_copy_of_the_packed_weights_per_isa(isa, bytes_per_weight):
    """The host build embeds the packed weights once, in the resolved ISA's layout (u8 x s8 quads: a byte per
    weight; int16 pairs: two), read by every #if branch; the plain C99 build keeps qconv.py's own int16 rows.
    Same model and ISA, same C and blob; another ISA, another blob."""
    g = qconv(cin=32, cout=48, hw=(6, 6))
    comp = plan_model(g)
    options = CodegenOptions(vector_isa=isa)
    a, b = (generate(comp.plan.graph, comp.plan, options=options) for _ in range(2))
    assert a.source == b.source and a.weights == b.weights
    weights = 48 * 32 * 9
    per_channel = 48 * 4 * 4  # bias (and the quads' corrected bias), multiplier, shift: int32 per channel
    assert weights * bytes_per_weight <= len(a.weights) <= weights * bytes_per_weight + per_channel + 512
    assert "opfuse_dot2_s16" not in a.source and "_s16" not in a.source  # no qconv.py weights under #else
    other = generate(comp.plan.graph, comp.plan, options=CodegenOptions(vector_isa="avx2" if isa == "avx512" else
                                                                       "avx512"))
    assert other.weights != a.weights


DEPTHWISE = {
    "3x3": {"group": 11, "cin": 11, "cout": 11, "hw": (7, 9)},
    "stride2-residual": {"group": 9, "cin": 9, "cout": 9, "stride": 2, "residual": True, "hw": (10, 21)},
    "uint8-relu-5x5": {"group": 8, "cin": 8, "cout": 8, "k": 5, "pad": 2, "x_dtype": "uint8", "zp": 131,
                       "out_dtype": "uint8", "out_zp": 7, "relu": True, "hw": (6, 18), "shifts": (1e-6, 0.4)},
    "no-pad-dilation": {"group": 3, "cin": 3, "cout": 3, "pad": 0, "dilation": 2, "hw": (9, 12)},
    "unread-last-column": {"group": 12, "cin": 12, "cout": 12, "pad": 0, "stride": 2, "hw": (10, 14)},
}


@pytest.mark.parametrize("mode", ["positions", "channels"])
@pytest.mark.parametrize("case", list(DEPTHWISE), ids=list(DEPTHWISE))
def test_host_int8_depthwise_both_layouts_are_bit_exact(case, mode):
    """Both depthwise kernels (8 positions of a row per vector, or 8 channels per vector: the channel count
    not a multiple of 8 here), whichever the width threshold would pick."""
    below = 1 if mode == "positions" else 1 << 20
    options = CodegenOptions(int8_depthwise_channels_below=below, int8_depthwise_strided_channels_below=below)
    comp = check(qconv(**DEPTHWISE[case], seed=len(case)), options=options)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=options).kernels for n in k.notes]
    assert any(("8 channels per vector" in n) == (mode == "channels") and "depthwise" in n for n in notes)
    if mode == "positions":  # planes of tap pairs at column stride 1, of int32 (one per column phase) strided
        kind = "tap pairs of int16 (vpmaddwd)" if DEPTHWISE[case].get("stride", 1) == 1 else "int32"
        assert any(f"host planes of {kind}," in n for n in notes), notes


@pytest.mark.parametrize(("stride", "channels"), [(1, False), (2, True)])
def test_strided_depthwise_takes_the_channels_kernel_below_its_own_width(stride, channels):
    """Output rows 20 wide: at stride 1 the positions kernel (``int8_depthwise_channels_below`` 16), at stride 2
    8 channels per vector (``int8_depthwise_strided_channels_below`` 64)."""
    g = qconv(group=8, cin=8, cout=8, hw=(6, 20 * stride), stride=stride, seed=3)
    comp = check(g, avx2=False, plain_else=False)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=HOST).kernels for n in k.notes]
    assert any(("8 channels per vector" in n) == channels and "depthwise" in n for n in notes)


def test_the_report_names_the_host_kernel_not_the_fallback():
    """The notes describe the kernel that runs on this host (the #else branch's choice is not reported)."""
    comp = plan_model(qconv())
    program = generate(comp.plan.graph, comp.plan, options=HOST)
    notes = [n for k in program.kernels for n in k.notes]
    assert len(notes) == 1 and "host u8 x s8 GEMM" in notes[0]  # the VNNI kernel's; not the #else branches'
    assert not any("int16 columns" in n for n in notes)
    plain = generate(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none"))
    assert not any("host" in n for k in plain.kernels for n in k.notes)


@pytest.mark.parametrize(("params", "kind"), [({}, "u8 x s8"), ({"wmax": 200}, "int16-pair"),
                                             ({"x_dtype": "uint8", "zp": -40}, "int16-pair")])
def test_quads_where_weights_fit_int8_and_the_zero_point_is_an_8_bit_value(params, kind):
    """vpdpbusd multiplies unsigned by signed bytes: weights beyond int8 or a zero point no uint8 value can
    hold (its padding value) keep the int16 pairs (vpdpwssd), exact either way."""
    g = qconv(**params)
    comp = check(g, avx2=False)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=HOST).kernels for n in k.notes]
    assert any(f"host {kind} GEMM" in n for n in notes)


@pytest.mark.parametrize("params", [{}, {"group": 6, "cin": 6, "cout": 6, "residual": True}], ids=["3x3", "dw"])
def test_the_convs_own_bias_input_takes_the_host_kernel(params):
    """The int32 bias as the Conv's third input (1-D, one value per output channel) rather than an Add after it: the
    host kernel takes it as it takes the Add, bit-exact in every build. (Before, the 1-D bias was read with its
    channels on the wrong axis and refused as "the Conv's bias is not a constant".)"""
    comp = check(qconv(**params, bias_input=True))
    (conv,) = [n for n in comp.plan.graph.nodes if n.op_type == "Conv"]
    assert len(conv.inputs) == 3


@pytest.mark.parametrize(("case", "words"), [("3x3", "4 channels"), ("rect-kernel", "4 taps of a kernel row")])
def test_the_quads_hold_channels_or_a_mono_inputs_taps(case, words):
    """A quad word holds 4 input channels, or with one input channel (a first layer on a mono input) 4 taps of a
    kernel row; the note says which (the cases' bits: ``test_host_int8_conv_is_bit_exact``)."""
    comp = plan_model(qconv(**CASES[case]))
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=HOST).kernels for n in k.notes]
    assert any("host u8 x s8 GEMM" in n and f"words of {words} (" in n for n in notes), notes


def test_int8_and_uint8_inputs_and_a_matmul_in_one_program():
    """Two convolutions and a MatMul in one program, the first conv reading int8 and writing uint8, the second
    reading that: each conv builds its words with its own helper (``opfuse_q8_quads_s8`` / ``_u8``), the conv and
    the MatMul share the portable weight readers (one definition); bit-exact."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("three_layers")
    y = b.input("x", (1, 6, 9, 7), "int8")
    for k, (zp, out, out_zp, cout) in enumerate(((-7, "uint8", 120, 5), (130, "int8", 3, 4), (3, "int8", -2, 6))):
        if k == 2:  # the MatMul's rows: every position of every channel
            y = b.op("Reshape", y, b.const("rows", np.array([36, 7], np.int64)))
        xc = b.op("Sub", b.op("Cast", y, to=int(TensorProto.INT32)), b.const(f"zp{k}", np.array(zp, np.int32)))
        if k < 2:
            cin = 6 if k == 0 else 5
            acc = b.op("Conv", xc, b.const(f"w{k}", rng.integers(-128, 128, (cout, cin, 3, 3)).astype(np.int32)),
                       name=f"conv{k}", pads=[1] * 4)
            shape = (1, cout, 1, 1)
        else:
            acc = b.op("MatMul", xc, b.const(f"w{k}", rng.integers(-128, 128, (7, cout)).astype(np.int32)), name="mm")
            shape = (cout,)
        pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-4, 3e-3, cout)]
        mult = b.const(f"m{k}", np.array([p[0] for p in pairs], np.int32).reshape(shape))
        shift = b.const(f"s{k}", np.array([p[1] for p in pairs], np.int32).reshape(shape))
        info = np.iinfo(np.dtype(out))
        y = b.op("Requantize", acc, mult, shift, zero_point=out_zp, lo=int(info.min), hi=int(info.max),
                 to=int(DTYPES[out]), name=f"rq{k}")
    g = b.build(y)
    comp = plan_model(g)
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=HOST).run(feeds)
    np.testing.assert_array_equal(got["rq2"], run(g, feeds)["rq2"])
    program = generate(comp.plan.graph, comp.plan, options=HOST)
    assert "opfuse_q8_quads_s8(" in program.source and "opfuse_q8_quads_u8(" in program.source
    notes = " ".join(n for k in program.kernels for n in k.notes)
    assert notes.count("host u8 x s8 GEMM") == 2 and "int8 matmul 'mm': host word GEMM" in notes, notes
    assert program.source.count("static inline int32_t opfuse_q8_w8(") == 1


def test_a_bias_given_to_the_conv_itself_is_added_as_an_add_would_be():
    """The bias as the Conv's third input (int32) rather than an Add after it: the host kernel takes it, one value
    per channel (it refused it as "not a constant" before: the 1-D bias was matched against one axis as if it
    were NCHW); bit-exact with AVX-512, AVX2 alone and the plain builds."""
    rng = np.random.default_rng(6)
    b = GraphBuilder("conv_bias")
    x = b.input("x", (1, 6, 9, 7), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(-7, np.int32)))
    acc = b.op("Conv", xc, b.const("w", rng.integers(-128, 128, (5, 6, 3, 3)).astype(np.int32)),
               b.const("bias", rng.integers(-3000, 3000, 5).astype(np.int32)), name="conv", pads=[1] * 4)
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-4, 3e-3, 5)]
    y = b.op("Requantize", acc, b.const("m", np.array([p[0] for p in pairs], np.int32).reshape(1, 5, 1, 1)),
             b.const("s", np.array([p[1] for p in pairs], np.int32).reshape(1, 5, 1, 1)), zero_point=3, lo=-128,
             hi=127, to=int(TensorProto.INT8))
    comp = check(b.build(y))
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=HOST).kernels for n in k.notes]
    assert any("host u8 x s8 GEMM" in n for n in notes) and not any("not used" in n for n in notes), notes


def test_a_run_time_bias_of_the_conv_keeps_the_portable_kernel_with_a_reason():
    b = GraphBuilder("conv_bias_input")
    xc = b.op("Sub", b.op("Cast", b.input("x", (1, 6, 9, 7), "int8"), to=int(TensorProto.INT32)),
              b.const("zp", np.array(-7, np.int32)))
    acc = b.op("Conv", xc, b.const("w", np.ones((5, 6, 3, 3), np.int32)), b.input("bias", (5,), np.int32),
               name="conv", pads=[1] * 4)
    m, sh = fixed_point_multiplier(1e-3)
    y = b.op("Requantize", acc, b.const("m", np.array(m, np.int32)), b.const("s", np.array(sh, np.int32)),
             zero_point=3, lo=-128, hi=127, to=int(TensorProto.INT8))
    g = b.build(y)
    comp = plan_model(g)
    notes = [n for k in generate(comp.plan.graph, comp.plan, options=HOST).kernels for n in k.notes]
    assert "int8 conv 'conv': host int8 kernel not used: the Conv's bias is not a constant" in notes, notes


def test_plain_c_build_has_no_host_kernel():
    comp = plan_model(qconv())
    source = generate(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).source
    assert HOST_KERNEL not in source and "opfuse_dot2_s16" in source


def test_unmatched_epilogue_keeps_the_scalar_kernel_with_a_reason():
    """A Requantize whose multiplier is not per channel (it varies along a spatial axis) is not the
    epilogue the host kernel vectorises: the group keeps qconv.py's kernel, exact, and the report says why."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("q")
    x = b.input("x", (1, 4, 6, 6), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(1, np.int32)))
    acc = b.op("Conv", xc, b.const("w", rng.integers(-100, 100, (4, 4, 3, 3)).astype(np.int32)), name="conv",
               pads=[1] * 4)
    m, s = fixed_point_multiplier(1e-3)
    mult = np.full((1, 1, 6, 1), m, np.int32)
    g = b.build(b.op("Requantize", acc, b.const("m", mult), b.const("s", np.array(s, np.int32)), zero_point=0,
                     lo=-128, hi=127, to=int(TensorProto.INT8)))
    comp = check(g, expect_host=False, avx2=False)
    program = generate(comp.plan.graph, comp.plan)
    assert "host int8 kernel not used: the Requantize's multiplier is not" in program.source


def test_int8_model_output_is_not_a_host_kernel_when_the_accumulator_is_stored():
    """The int32 accumulator is also a graph output: two stores per element, the scalar epilogue's job."""
    b = GraphBuilder("q")
    x = b.input("x", (1, 2, 5, 5), "uint8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(128, np.int32)))
    acc = b.op("Conv", xc, b.const("w", np.ones((3, 2, 3, 3), np.int32)), name="conv", pads=[1] * 4)
    m, s = fixed_point_multiplier(1e-2)
    y = b.op("Requantize", acc, b.const("m", np.array(m, np.int32)), b.const("s", np.array(s, np.int32)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    g = b.build(y, acc)
    comp = plan_model(g)
    source = generate(comp.plan.graph, comp.plan).source
    assert HOST_KERNEL not in source
    assert "host int8 kernel not used" in source
    feeds = _feeds(g)
    want = run(g, feeds)
    got = build(comp.plan.graph, comp.plan).run(feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_same_c_twice():
    g = qconv(residual=True, group=2, cin=6, cout=4)
    pa, pb = plan_model(g).plan, plan_model(g).plan
    a, b = generate(pa.graph, pa), generate(pb.graph, pb)
    assert a.source == b.source and a.weights == b.weights


def test_quantized_zoo_model_fused_is_bit_exact_on_the_host_kernel():
    """resnet8 quantized (residual blocks, strided 3x3 and 1x1 shortcuts) up to its last int8 tensor: the fused
    host kernels equal the reference on the unfused graph (the float tail after it rounds differently in C)."""
    from onnx import helper

    from opfuse.quantization import quantize
    from opfuse.runtime.reference import random_inputs
    qmodel = quantize("zoo:resnet8", calibration_random=2).model
    last = "stack3_relu_quantized"
    cut = next(i for i, n in enumerate(qmodel.graph.node) if last in n.output)
    del qmodel.graph.node[cut + 1:]
    del qmodel.graph.output[:]
    qmodel.graph.output.append(helper.make_tensor_value_info(last, TensorProto.INT8, None))
    comp = plan_model(qmodel)
    program = generate(comp.plan.graph, comp.plan, memory=comp.memory, options=HOST)
    assert sum("host u8 x s8 GEMM" in n for k in program.kernels for n in k.notes) == 9
    feeds = random_inputs(comp.graph, 0)
    want = run(plan_model(qmodel, CompileOptions(fuse=False)).graph, feeds)
    got = build(comp.plan.graph, comp.plan, memory=comp.memory, options=HOST).run(feeds)
    assert want[last].dtype == np.int8 and want[last].std() > 1  # not all clamped
    np.testing.assert_array_equal(got[last], want[last])


@pytest.mark.parametrize("params", [{"cin": 16, "cout": 24, "hw": (40, 36), "residual": True},
                                    {"cin": 24, "cout": 24, "group": 24, "hw": (40, 36)},
                                    {"cin": 24, "cout": 24, "group": 24, "hw": (60, 5), "stride": 2}],
                         ids=["gemm", "depthwise-rows", "depthwise-channels"])
def test_threads_share_the_image_and_split_the_tiles_bit_exactly(params):
    """With 2 threads the image (built by all threads into thread 0's scratch) is shared by every tile."""
    g = qconv(**params)
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    model = build(comp.plan.graph, comp.plan, threads=2)
    assert model.threads == 2 and parallel_loops(model.program.source)
    for _ in range(3):
        np.testing.assert_array_equal(model.run(feeds)[name], want[name])


@pytest.mark.parametrize("case, zmm", [("1x1-flat-zmm", True), ("3x3-wide-rows-zmm", True), ("1x1-flat", False),
                                       ("wide-row", False)])
def test_zmm_micro_kernel_where_rows_are_wide(case, zmm):
    """Built for AVX-512, rows of at least ``int8_conv_zmm_min_row`` positions take the zmm micro-kernel (16
    positions a vector); narrower ones keep ymm (lanes past the row would be wasted)."""
    g = qconv(**CASES[case])
    comp = plan_model(g)
    source = generate(comp.plan.graph, comp.plan, options=HOST).source
    assert ("16 positions per zmm" in source) == zmm
    off = generate(comp.plan.graph, comp.plan, options=HOST.with_(int8_conv_zmm_min_row=0)).source
    assert "16 positions per zmm" not in off


SANITIZED_CASES = ("3x3", "dw", "dw-stride2-odd", "batch2-dw-channels", "dw-residual-uint8", "batch2-dw-rows",
                   "1x1-flat-zmm", "residual-uint8-stride2")


@pytest.mark.parametrize("case", SANITIZED_CASES, ids=SANITIZED_CASES)
def test_host_int8_conv_has_no_undefined_behaviour(case):
    """Built with UBSan (``build(sanitize=True)``: undefined behaviour ends the process) and bit-exact. The
    depthwise kernel's 8 x 8 byte transpose stored the high 8 bytes of each row pair as a ``double``
    (``_mm_storeh_pd``) at any byte address: a misaligned double store, which UBSan reported in the int8
    ds_cnn and mobilenet_v1_025_96 (it is ``_mm_storel_epi64`` of the high half now)."""
    if not supports_sanitizer(find_compiler()):
        pytest.skip("the C compiler has no UBSan")
    g = qconv(**CASES[case], seed=len(case))
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    script = ("import numpy as np, pickle, sys\nfrom opfuse.runtime.native import build\n"
              "g, plan, feeds = pickle.load(sys.stdin.buffer)\n"
              "out = build(g, plan, sanitize=True).run(feeds)\nsys.stdout.buffer.write(pickle.dumps(out))\n")
    # in a child: a UBSan report ends the process that loaded the library
    proc = subprocess.run([sys.executable, "-c", script], input=pickle.dumps((comp.plan.graph, comp.plan, feeds)),
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    got = pickle.loads(proc.stdout)
    for name, w in want.items():
        np.testing.assert_array_equal(got[name], w)
