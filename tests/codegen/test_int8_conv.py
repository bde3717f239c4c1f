"""The int8 convolution kernel (``codegen/qconv.py``): int16 columns of a dequantized 8-bit input,
int16 weights, int32 dot products, the requantizing epilogue. Bit-exact against the reference
executor, fused and unfused, plain C99 (the Cortex-M7's path) and the host's; what it refuses."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.qconv import int8_conv_applies
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

RNG = np.random.default_rng(8)


def qconv_graph(cin=6, cout=5, hw=(9, 7), k=3, stride=1, pad=1, dilation=1, group=1, zp=-7, wide_weights=False,
                x_dtype="int8"):
    """x (8-bit) -> Cast/Sub(zp) -> Conv(int32 weights) -> Add(bias) -> Requantize -> y (int8)."""
    b = GraphBuilder("qconv")
    x = b.input("x", (1, cin) + hw, x_dtype)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(zp, np.int32)))
    hi = 40000 if wide_weights else 128
    w = RNG.integers(-hi, hi, (cout, cin // group, k, k)).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), name="conv", pads=[pad] * 4, strides=[stride] * 2,
               dilations=[dilation] * 2, group=group)
    acc = b.op("Add", acc, b.const("bias", RNG.integers(-3000, 3000, (1, cout, 1, 1)).astype(np.int32)))
    pairs = [fixed_point_multiplier(float(m)) for m in RNG.uniform(1e-4, 3e-3, cout)]
    mult = np.array([p[0] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    y = b.op("Requantize", acc, b.const("m", mult), b.const("s", shift), zero_point=3, lo=-128, hi=127,
             to=int(TensorProto.INT8))
    return b.build(y)


def _feeds(g):
    x = g.inputs[0]
    info = np.iinfo(x.dtype)
    return {"x": RNG.integers(info.min, info.max + 1, x.shape).astype(x.dtype)}


GEOMETRIES = [
    {}, {"k": 1, "pad": 0}, {"stride": 2}, {"dilation": 2, "pad": 2}, {"group": 2, "cin": 6, "cout": 4},
    {"group": 6, "cin": 6, "cout": 6}, {"cin": 3, "cout": 7, "k": 3, "pad": 0}, {"x_dtype": "uint8", "zp": 128},
]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=[str(g) or "3x3" for g in GEOMETRIES])
@pytest.mark.parametrize("simd", ["none", "auto"])
def test_int8_conv_kernel_is_bit_exact(geo, simd):
    g = qconv_graph(**geo)
    comp = plan_model(g)
    assert len(comp.plan.groups) == 1  # Cast/Sub prologue, conv, bias, requantize: one kernel
    program = generate(comp.plan.graph, comp.plan, options=CodegenOptions(simd=simd))
    depthwise = geo.get("group", 1) == geo.get("cin", 6) == geo.get("cout", 5)  # qdepthwise.py's window of rows
    if simd == "none":  # the host build ("auto") runs qgemm.py's kernel over its single weight copy instead
        assert ("opfuse_mac2_s16" if depthwise else "opfuse_dot2_s16") in program.source and "__smlad" in program.source
    else:
        assert "opfuse_dot2_s16" not in program.source and "opfuse_q8_requantize" in program.source
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=CodegenOptions(simd=simd)).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


def test_unfused_int8_conv_is_bit_exact():
    g = qconv_graph(stride=2)
    comp = plan_model(g, CompileOptions(fuse=False))
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


def test_weights_beyond_int16_keep_the_generic_int32_path():
    g = qconv_graph(wide_weights=True)
    comp = plan_model(g)
    conv = g.node("conv")
    assert not int8_conv_applies(conv, comp.memory.static)  # refused: a weight does not fit int16
    program = generate(comp.plan.graph, comp.plan)
    assert "opfuse_dot2_s16" not in program.source
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


def test_an_int32_input_is_not_an_int8_conv():
    b = GraphBuilder("c")
    x = b.input("x", (1, 2, 5, 5), "int32")
    g = b.build(b.op("Conv", x, b.const("w", np.ones((2, 2, 3, 3), np.int32)), name="conv"))
    comp = plan_model(g)
    assert not int8_conv_applies(g.node("conv"), comp.memory.static)  # refused: its values may not fit int16


def test_same_c_twice():
    g = qconv_graph(group=2, cin=6, cout=4)
    pa, pb = plan_model(g).plan, plan_model(g).plan
    a, b = generate(pa.graph, pa), generate(pb.graph, pb)
    assert a.source == b.source and a.weights == b.weights


def _int8_layer(b, x, cin, cout, *, k=3, stride=1, group=1, seed=0):
    rng = np.random.default_rng(seed)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(-128, np.int32)))
    w = rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), pads=[k // 2] * 4, strides=[stride] * 2, group=group)
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-4, 1e-3, cout)]
    mult = np.array([p[0] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    return b.op("Requantize", acc, b.const("m", mult), b.const("s", shift), zero_point=-128, lo=-128, hi=127,
                to=int(TensorProto.INT8))


def test_int8_layers_run_patched_within_a_small_arena_bit_exact():
    """The seed's first layers (conv s2, depthwise, pointwise) in int8 under a memory budget: banded
    (patch-based) execution of 8-bit tensors, exact on the plain C path of the Cortex-M7."""
    from opfuse.codegen.options import PORTABLE
    b = GraphBuilder("head")
    x = b.input("x", (1, 3, 32, 32), "int8")
    y = _int8_layer(b, x, 3, 8, stride=2, seed=1)
    y = _int8_layer(b, y, 8, 8, group=8, seed=2)
    y = _int8_layer(b, y, 8, 16, k=1, seed=3)
    g = b.build(y)
    budget = 4096  # the whole-tensor plan needs 4 KiB (two 16x16x8 int8 tensors)
    comp = plan_model(g, CompileOptions(target="cortex-m7", memory_budget_bytes=budget))
    runs = comp.report["patching"]["runs"]
    assert runs and len(runs[0]["groups"]) == 3
    assert comp.report["memory_budget"]["arena_bytes"] <= budget
    feeds = _feeds(g)
    got = build(comp.graph, comp.plan, memory=comp.memory, options=PORTABLE).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("simd", ["none", "auto"])
def test_long_dot_products_beside_a_fused_epilogue_are_called_out_of_line(simd):
    """K = 8 * 3 * 3 = 72 > 2 * int8_dot_call_min_pairs (lowered here to 16): the fused kernel calls
    opfuse_dot2_s16_call, bit-exactly; the same conv unfused (no epilogue beside it) and a fused 1x1 conv
    of 8 channels (4 pairs) keep the dot product inline."""
    opts = CodegenOptions(simd=simd, int8_dot_call_min_pairs=16)
    g = qconv_graph(cin=8, cout=6)
    comp = plan_model(g)
    program = generate(comp.plan.graph, comp.plan, options=opts)
    assert ("opfuse_dot2_s16_call(" in program.source) == (simd == "none")  # the host build: qgemm.py's kernel
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])
    unfused = plan_model(g, CompileOptions(fuse=False))
    assert "opfuse_dot2_s16_call" not in generate(unfused.plan.graph, unfused.plan, options=opts).source
    short = plan_model(qconv_graph(cin=8, cout=6, k=1, pad=0))
    assert "opfuse_dot2_s16_call" not in generate(short.plan.graph, short.plan, options=opts).source


@pytest.mark.parametrize("geo", GEOMETRIES + [{"hw": (5, 3)}, {"hw": (1, 1), "pad": 0, "k": 1}],
                         ids=[str(g) or "3x3" for g in GEOMETRIES] + ["odd positions", "one position"])
@pytest.mark.parametrize("simd, channels", [("none", 2), ("auto", 2), ("none", 4), ("auto", 4)])
def test_two_positions_per_pass_are_bit_exact(geo, simd, channels):
    """The Cortex-M7's form (``int8_conv_positions_per_pass=2``, ``opfuse_dot22_s16`` / ``opfuse_dot42_s16``):
    two columns, two or four channels per pass (the packed rows padded to a multiple, the padding's results
    never stored); with an odd number of positions the last is computed twice, the same bits."""
    g = qconv_graph(**geo)
    comp = plan_model(g)
    opts = CodegenOptions(simd=simd, int8_conv_positions_per_pass=2, int8_conv_channels_per_pass=channels)
    program = generate(comp.plan.graph, comp.plan, options=opts)
    depthwise = geo.get("group", 1) == geo.get("cin", 6) == geo.get("cout", 5)
    positions = comp.plan.graph.node("conv").outputs[0].shape[2:]
    # the host build ("auto") runs qgemm.py's kernel instead
    assert (f"opfuse_dot{channels}2_s16(" in program.source) == (not depthwise and positions != (1, 1) and
                                                                 simd == "none")
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("channels", [2, 4])
def test_two_positions_per_pass_call_the_long_dot_product_out_of_line(channels):
    opts = CodegenOptions(simd="none", int8_dot_call_min_pairs=16, int8_conv_positions_per_pass=2,
                          int8_conv_channels_per_pass=channels)
    g = qconv_graph(cin=8, cout=6)
    comp = plan_model(g)
    assert f"opfuse_dot{channels}2_s16_call(" in generate(comp.plan.graph, comp.plan, options=opts).source
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
    (name,) = want = run(g, feeds)
    np.testing.assert_array_equal(got[name], want[name])
