"""An integer conv stores its 8-bit output over its 8-bit input (``memory/inplace.py``'s
``int8_conv_pair``): depthwise stride-1 and 1x1 convs of one shape in and out. Positive: the memory
plan aliases the pair and every kernel form (host AVX2 and plain C, one and two threads, the
Cortex-M7 build under QEMU where the tools are) stays bit-exact against the reference executor;
ds_cnn's int8 arena on the M7 goes below its layer-by-layer bound. Negative: the convs that read an
input element after storing over it (strided, a wider window, other channel counts) keep apart."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ir.plan import FusionGroup
from opfuse.memory.inplace import int8_conv_pair
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime import mcu
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

I32 = int(TensorProto.INT32)


def _layer(b, x, rng, name, cout, k=(1, 1), stride=1, pads=(0, 0, 0, 0), dilation=1, group=1, zp=-7,
           out_dtype="int8", out_zp=3, residual=None):
    """``x -> Cast/Sub(zp) -> Conv -> Add(bias) -> Requantize [+ residual]`` (8-bit out)."""
    cin = x.shape[1]
    xc = b.op("Sub", b.op("Cast", x, to=I32), b.const(f"{name}_zp", np.array(zp, np.int32)))
    w = rng.integers(-128, 128, (cout, cin // group) + tuple(k)).astype(np.int32)
    acc = b.op("Conv", xc, b.const(f"{name}_w", w), name=name, pads=list(pads), strides=[stride] * 2,
               dilations=[dilation] * 2, group=group)
    acc = b.op("Add", acc, b.const(f"{name}_b", rng.integers(-3000, 3000, (1, cout, 1, 1)).astype(np.int32)))
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-3, 2e-2, cout)]
    m = np.array([p[0] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    s = np.array([p[1] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    args = [acc, b.const(f"{name}_m", m), b.const(f"{name}_s", s)]
    if residual is not None:
        rc = b.op("Sub", b.op("Cast", residual, to=I32), b.const(f"{name}_rzp", np.array(5, np.int32)))
        args += [rc, b.const(f"{name}_rm", np.full((1, cout, 1, 1), 1 << 20, np.int64))]
    info = np.iinfo(np.dtype(out_dtype))
    to = TensorProto.INT8 if out_dtype == "int8" else TensorProto.UINT8
    return b.op("Requantize", *args, zero_point=out_zp, lo=int(info.min), hi=int(info.max), to=int(to))


def two_layers(c=16, hw=(5, 7), n=1, out_dtype="int8", **second):
    """x (graph input) -> 1x1 conv -> h (8-bit, in the arena) -> the conv under test -> y -> 1x1 conv to 5
    channels -> the graph output: ``h`` and ``y`` live in the arena and ``h`` dies at the second kernel, so
    only that kernel's form decides whether ``y`` may take ``h``'s bytes."""
    rng = np.random.default_rng(c + hw[1])
    b = GraphBuilder("inplace")
    x = b.input("x", (n, 6) + hw, "int8")
    h = _layer(b, x, rng, "first", c, out_dtype=out_dtype, out_zp=-4 if out_dtype == "int8" else 120)
    second.setdefault("cout", c)
    y = _layer(b, h, rng, "second", zp=-4 if out_dtype == "int8" else 120, **second)
    return b.build(_layer(b, y, rng, "third", 5, zp=3 if out_dtype == "int8" else 120))


def _feeds(g):
    rng = np.random.default_rng(3)
    return {v.name: rng.integers(-128, 128, v.shape).astype(v.dtype) for v in g.inputs}


def _second(graph):
    """(h, y): the second conv's 8-bit input and output."""
    conv = next(n for n in graph.nodes if n.op_type == "Conv" and n.name.startswith("second"))
    h = conv.input(0).producer.input(0).producer.input(0)  # through the Sub and the Cast
    y = next(n for n in graph.nodes if n.op_type == "Requantize" and conv in _ancestors(n)).outputs[0]
    return h, y


def _ancestors(node):
    seen, todo = [], [node]
    while todo:
        n = todo.pop()
        for v in n.input_values():
            if v.producer is not None and v.producer not in seen:
                seen.append(v.producer)
                todo.append(v.producer)
    return seen


def _aliased(comp) -> bool:
    """Does the second conv's output share its input's bytes?"""
    h, y = _second(comp.graph)
    return comp.memory.locations[y.name] == comp.memory.locations[h.name]


IN_PLACE = {
    "pointwise": {},
    "pointwise-odd-positions": {"c": 10, "hw": (5, 5)},
    "pointwise-batch2": {"n": 2, "c": 8},
    "pointwise-residual": {"residual": True},
    "depthwise-3x3": {"k": (3, 3), "pads": (1, 1, 1, 1), "group": 16},
    "depthwise-10x4-ds_cnn": {"k": (3, 3), "pads": (1, 1, 1, 1), "group": 64, "c": 64, "hw": (25, 5)},
    "depthwise-5x5-uint8": {"k": (5, 5), "pads": (2, 2, 2, 2), "group": 12, "c": 12, "hw": (9, 11),
                            "out_dtype": "uint8"},
    "depthwise-asymmetric-pads": {"k": (3, 3), "pads": (2, 0, 0, 2), "group": 16},
    "depthwise-dilation2": {"k": (3, 3), "pads": (2, 2, 2, 2), "dilation": 2, "group": 16, "hw": (9, 6)},
    "depthwise-wide-rows": {"k": (3, 3), "pads": (1, 1, 1, 1), "group": 8, "c": 8, "hw": (6, 40)},
    "depthwise-batch2": {"k": (3, 3), "pads": (1, 1, 1, 1), "group": 16, "n": 2},
}


@pytest.mark.parametrize("case", list(IN_PLACE), ids=list(IN_PLACE))
def test_in_place_int8_conv_is_bit_exact_in_every_kernel_form(case):
    params = dict(IN_PLACE[case])
    top = {k: params.pop(k) for k in ("c", "hw", "n", "out_dtype") if k in params}
    b_res = params.pop("residual", False)
    g = two_layers(**top, **params)
    if b_res:  # the residual is another tensor (the graph input), read at the output's index
        g = _with_residual(top)
    comp = plan_model(g)
    assert len(comp.plan.groups) == 3 and _aliased(comp)
    assert comp.memory.arena_bytes < 2 * _second(comp.graph)[0].nbytes
    feeds = _feeds(g)
    want = run(g, feeds)[g.outputs[0].name]
    for opts, threads in ((CodegenOptions(), 1), (CodegenOptions(), 2), (CodegenOptions(simd="none"), 1),
                          (CodegenOptions(simd="none"), 2)):
        got = build(comp.plan.graph, comp.plan, options=opts, memory=comp.memory, threads=threads).run(feeds)
        np.testing.assert_array_equal(got[g.outputs[0].name], want, err_msg=f"{opts.simd}, {threads} threads")


def _with_residual(top):
    rng = np.random.default_rng(11)
    b = GraphBuilder("inplace_res")
    c, hw = top.get("c", 16), top.get("hw", (5, 7))
    x = b.input("x", (1, 6) + hw, "int8")
    r = b.input("r", (1, c) + hw, "int8")
    h = _layer(b, x, rng, "first", c, out_zp=-4)
    y = _layer(b, h, rng, "second", c, zp=-4, residual=r)
    return b.build(_layer(b, y, rng, "third", 5, zp=3))


APART = {
    "depthwise-stride2": {"k": (3, 3), "pads": (1, 1, 1, 1), "group": 16, "stride": 2},
    "regular-3x3": {"k": (3, 3), "pads": (1, 1, 1, 1)},
    "pointwise-other-channels": {"cout": 24},
    "grouped-not-depthwise": {"group": 4},
}


@pytest.mark.parametrize("case", list(APART), ids=list(APART))
def test_convs_that_read_after_storing_keep_input_and_output_apart(case):
    g = two_layers(**APART[case])
    comp = plan_model(g)
    grp = next(grp for grp in comp.plan.groups if "Conv" in grp.op_types and any(
        n.name.startswith("second") for n in grp.nodes))
    anchor = next(n for n in grp.nodes if n.op_type == "Conv")
    out = grp.outputs(comp.plan.graph)[0]
    assert int8_conv_pair(grp, anchor, out, static_values(comp.plan.graph)) is None
    feeds = _feeds(g)
    got = build(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).run(feeds)
    np.testing.assert_array_equal(got[g.outputs[0].name], run(g, feeds)[g.outputs[0].name])


def test_an_input_read_again_in_the_group_is_not_overwritten():
    """``h`` is also the conv's residual: an element of it would be read after the store."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("reread")
    x = b.input("x", (1, 6, 5, 7), "int8")
    h = _layer(b, x, rng, "first", 16, out_zp=-4)
    y = _layer(b, h, rng, "second", 16, zp=-4, residual=h)
    g = b.build(_layer(b, y, rng, "third", 5, zp=3))
    comp = plan_model(g)
    grp = comp.plan.groups[1]
    anchor = next(n for n in grp.nodes if n.op_type == "Conv")
    assert int8_conv_pair(grp, anchor, grp.outputs(comp.plan.graph)[0], static_values(comp.plan.graph)) is None


def test_a_float_conv_is_not_taken():
    b = GraphBuilder("float")
    x = b.input("x", (1, 4, 5, 5))
    h = b.op("Relu", b.op("Neg", x))
    y = b.op("Conv", h, b.const("w", np.ones((4, 4, 1, 1), np.float32)), name="conv")
    g = b.build(y)
    conv = next(n for n in g.nodes if n.op_type == "Conv")
    grp = FusionGroup("g", [conv])
    assert int8_conv_pair(grp, conv, y, static_values(g)) is None


def test_ds_cnn_int8_arena_on_the_m7_is_below_the_layer_by_layer_bound():
    """Issue 15's goal: ds_cnn's bound is its largest layer's input + output, 2 x 25 x 5 x 64 bytes."""
    import opfuse
    q = opfuse.quantize("zoo:ds_cnn", calibration_random=2).model
    comp = plan_model(q, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    bound = 2 * 25 * 5 * 64
    assert program.arena_bytes < bound
    assert comp.memory.report()["inplace"] >= 8  # the four depthwise and the four pointwise convs


@pytest.mark.skipif(not mcu.tools_available(), reason="Cortex-M7 tests need arm-none-eabi-gcc and qemu-system-arm")
def test_in_place_convs_on_the_m7_are_bit_exact(tmp_path):
    g = two_layers(c=12, hw=(7, 6), k=(3, 3), pads=(1, 1, 1, 1), group=12)
    comp = plan_model(g, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert _aliased(comp)
    feeds = _feeds(g)
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    got = mcu.run_on_qemu(program, feeds, tmp_path).outputs
    np.testing.assert_array_equal(got[g.outputs[0].name], run(g, feeds)[g.outputs[0].name])
