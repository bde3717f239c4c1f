"""The int8 depthwise kernel (``codegen/qdepthwise.py``): a window of int16 rows per channel plane, tap
pairs through ``opfuse_mac2_s16`` (SMLAD on the Arm DSP extension), several outputs per pass. Bit-exact
against the reference executor on the plain C99 path (the Cortex-M7's), the host's, and under QEMU;
which convs it takes and which it leaves to the generic column kernel."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.qdepthwise import _packed_taps, _taps, int8_depthwise_applies
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime import mcu
from opfuse.runtime.native import build
from opfuse.runtime.reference import run


def dw_graph(c=5, hw=(9, 11), k=(3, 3), stride=(1, 1), pads=(1, 1, 1, 1), dilation=(1, 1), n=1, mult=1, zp=-7,
             x_dtype="int8", lo=-128, hi=127, out_dtype=TensorProto.INT8, out_zp=3, seed=0):
    """x (8-bit) -> Cast/Sub(zp) -> depthwise Conv (int32 weights, ``mult`` outputs per channel) -> Add(bias)
    -> Requantize(lo, hi) -> y."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("qdw")
    x = b.input("x", (n, c) + hw, x_dtype)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(zp, np.int32)))
    oc = c * mult
    w = rng.integers(-128, 128, (oc, 1) + k).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), name="conv", pads=list(pads), strides=list(stride),
               dilations=list(dilation), group=c)
    acc = b.op("Add", acc, b.const("bias", rng.integers(-3000, 3000, (1, oc, 1, 1)).astype(np.int32)))
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-3, 2e-2, oc)]
    m = np.array([p[0] for p in pairs], np.int32).reshape(1, oc, 1, 1)
    s = np.array([p[1] for p in pairs], np.int32).reshape(1, oc, 1, 1)
    y = b.op("Requantize", acc, b.const("m", m), b.const("s", s), zero_point=out_zp, lo=lo, hi=hi, to=int(out_dtype))
    return b.build(y)


def _feeds(g, seed=1):
    x = g.inputs[0]
    info = np.iinfo(x.dtype)
    return {"x": np.random.default_rng(seed).integers(info.min, info.max + 1, x.shape).astype(x.dtype)}


GEOMETRIES = [
    {},
    {"stride": (2, 2)},
    {"pads": (0, 0, 0, 0)},
    {"pads": (0, 1, 2, 0), "hw": (8, 7)},  # asymmetric padding
    {"pads": (1, 0, 1, 1), "stride": (2, 1)},
    {"dilation": (2, 2), "pads": (2, 2, 2, 2)},
    {"k": (5, 5), "pads": (2, 2, 2, 2), "hw": (12, 9)},
    {"k": (3, 1), "pads": (1, 0, 1, 0)},
    {"k": (1, 4), "pads": (0, 1, 0, 2), "stride": (1, 3)},
    {"k": (3, 3), "hw": (3, 3), "pads": (0, 0, 0, 0)},  # one output
    {"n": 2, "hw": (6, 5)},
    {"x_dtype": "uint8", "zp": 128},
    {"lo": 3, "hi": 127, "out_zp": 3},  # a ReLU's bound above the type's minimum
    {"out_dtype": TensorProto.UINT8, "lo": 0, "hi": 255, "out_zp": 128},
    {"lo": -100, "hi": 90},  # a clamp narrower than the type: no saturating helper
    {"hw": (30, 1), "k": (3, 3), "pads": (1, 1, 1, 1)},
]


@pytest.mark.parametrize("geo", GEOMETRIES, ids=[str(g) or "3x3" for g in GEOMETRIES])
@pytest.mark.parametrize("simd", ["none", "auto"])
def test_int8_depthwise_is_bit_exact(geo, simd):
    g = dw_graph(**geo)
    comp = plan_model(g)
    assert len(comp.plan.groups) == 1
    assert int8_depthwise_applies(g.node("conv"))
    opts = CodegenOptions(simd=simd)
    program = generate(comp.plan.graph, comp.plan, options=opts)
    if simd == "none":  # the host build ("auto") runs qgemm.py's depthwise instead, over its own single copy
        assert "opfuse_mac2_s16" in program.source or geo.get("dilation") or geo.get("k") in ((3, 1),)
    else:
        assert "opfuse_mac2_s16" not in program.source and "opfuse_q8_requantize" in program.source
    assert "opfuse_dot2_s16" not in program.source  # not the column kernel
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("per_pass", [1, 3, 4])
def test_outputs_per_pass_do_not_change_the_bits(per_pass):
    g = dw_graph(hw=(7, 13), stride=(1, 2))
    comp = plan_model(g)
    opts = CodegenOptions(simd="none", int8_depthwise_outputs_per_pass=per_pass)
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
    want = run(g, feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


def test_a_channel_multiplier_keeps_the_column_kernel():
    """Two outputs per input channel (group = C, OC = 2C) is not one plane per channel: refused here, the
    generic kernel takes it, still exact."""
    g = dw_graph(mult=2)
    assert not int8_depthwise_applies(g.node("conv"))
    comp = plan_model(g)
    program = generate(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none"))
    assert "opfuse_mac2_s16" not in program.source and "opfuse_dot2_s16" in program.source
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).run(feeds)
    (name,) = want = run(g, feeds)
    np.testing.assert_array_equal(got[name], want[name])


def test_tap_pairs_pack_two_int16_little_endian():
    w = np.array([[[[-1, 2, -3], [4, -5, 6], [7, 8, -9]]]], np.int32)
    taps = _taps(3, 3, 1)
    assert taps == [[(0, 2), (2, 1)]] * 3
    words = _packed_taps(w, taps).view(np.uint32)[0]
    assert list(words) == [(2 << 16) | 0xFFFF, np.uint32(-3 & 0xFFFFFFFF), (0xFFFB << 16) | 4, 6,
                           (8 << 16) | 7, np.uint32(-9 & 0xFFFFFFFF)]
    assert _taps(2, 3, 2) == [[(0, 1), (1, 1), (2, 1)]] * 2  # dilated columns: no adjacent pair


def test_saturating_helper_only_for_the_types_range():
    plain = CodegenOptions(simd="none")  # the plain C99 build's kernel (the host build runs qgemm.py's)
    full = generate(*_plan(dw_graph()), options=plain)
    narrow = generate(*_plan(dw_graph(lo=-100, hi=90)), options=plain)
    assert "opfuse_sat_s8(" in full.source and "opfuse_sat_s8(" not in narrow.source


def _plan(g):
    comp = plan_model(g)
    return comp.plan.graph, comp.plan


needs_tools = pytest.mark.skipif(not mcu.tools_available(),
                                 reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and qemu-system-arm")


@needs_tools
def test_int8_depthwise_on_the_m7_is_bit_exact(tmp_path):
    """SMLAD, SSAT and unaligned word loads of the rows on the emulated M7: the reference's bits for a
    stride-1 and a stride-2 depthwise conv, a ReLU bound and an odd width."""
    for i, geo in enumerate([{"hw": (10, 13)}, {"stride": (2, 2), "hw": (9, 12), "lo": 3},
                             {"k": (5, 5), "pads": (2, 1, 2, 2), "hw": (7, 9), "n": 2}]):
        g = dw_graph(**geo)
        comp = plan_model(g, CompileOptions(target="cortex-m7"))
        program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
        assert "opfuse_mac2_s16" in program.source
        feeds = _feeds(g, seed=i)
        got = mcu.run_on_qemu(program, feeds, tmp_path / str(i)).outputs
        want = run(g, feeds)
        (name,) = want
        np.testing.assert_array_equal(got[name], want[name], err_msg=str(geo))


def test_same_c_twice():
    g = dw_graph(stride=(2, 1), k=(5, 3), pads=(2, 1, 2, 1))
    pa, pb = plan_model(g).plan, plan_model(g).plan
    opts = CodegenOptions(simd="none")
    a, b = generate(pa.graph, pa, options=opts), generate(pb.graph, pb, options=opts)
    assert a.source == b.source and a.weights == b.weights


def test_two_depthwise_layers_keep_their_own_taps():
    """Two int8 depthwise convolutions of one model (different taps, the same shapes): each kernel reads its
    own packed taps (they are added to the weights once per node), bit-exact on the plain C99 path."""
    rng = np.random.default_rng(4)
    b = GraphBuilder("qdw2")
    x = b.input("x", (1, 4, 7, 6), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(-5, np.int32)))
    outs = []
    for i in (1, 2):
        w = rng.integers(-128, 128, (4, 1, 3, 3)).astype(np.int32)
        acc = b.op("Conv", xc, b.const(f"w{i}", w), name=f"conv{i}", pads=[1, 1, 1, 1], group=4)
        m, s = fixed_point_multiplier(0.004 * i)
        outs.append(b.op("Requantize", acc, b.const(f"m{i}", np.full((1, 4, 1, 1), m, np.int32)),
                         b.const(f"s{i}", np.full((1, 4, 1, 1), s, np.int32)), zero_point=0, lo=-128, hi=127,
                         to=int(TensorProto.INT8), name=f"rq{i}"))
    g = b.build(*outs)
    assert all(int8_depthwise_applies(g.node(f"conv{i}")) for i in (1, 2))
    comp = plan_model(g)
    opts = CodegenOptions(simd="none")
    assert generate(comp.plan.graph, comp.plan, options=opts).source.count("opfuse_mac2_s16(") >= 2
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=opts).run(feeds)
    want = run(g, feeds)
    assert len(want) == 2
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
