"""``int8_concat`` (``rules/qconcat.py``): DQ -> Concat -> Q at one scale and zero point becomes a Concat of the
8-bit tensors, which ``concat_alias`` then elides (the producers write their int8 results in place). The
values are the reference's exactly; every refusal has its reason in the decision log."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.codegen.options import PORTABLE, CodegenOptions
from opfuse.compiler import CompileOptions, plan_model
from opfuse.runtime import mcu
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

RNG = np.random.default_rng(5)
I8, U8, F = TensorProto.INT8, TensorProto.UINT8, TensorProto.FLOAT
C, HW = 4, 6


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def qdq_concat(scales=(0.02, 0.02, 0.02), zps=(-3, -3, -3), elem=I8, relu_clip=False, float_reader=False):
    """Two int8 convs (QLinear-recognized: int8 outputs a_q, b_q) -> DQ(s_i, z_i) -> Concat -> Q(s, z) -> DQ -> y,
    and the int8 concat itself as an output too."""
    dt = np.int8 if elem == I8 else np.uint8
    nodes, inits = [], [init("xs", np.float32(0.05)), init("xz", np.array(0, dt))]
    nodes += [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"]),
              helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_dq"])]
    cat_in = []
    for i, name in enumerate(("a", "b")):
        w = RNG.integers(-100, 100, (C, C, 3, 3)).astype(np.int8)
        inits += [init(f"{name}_w", w), init(f"{name}_ws", np.float32(0.01)), init(f"{name}_wz", np.int8(0)),
                  init(f"{name}_s", np.float32(scales[i])), init(f"{name}_z", np.array(zps[i], dt))]
        nodes += [helper.make_node("DequantizeLinear", [f"{name}_w", f"{name}_ws", f"{name}_wz"], [f"{name}_wdq"]),
                  helper.make_node("Conv", ["x_dq", f"{name}_wdq"], [f"{name}_c"], name=name, pads=[1] * 4),
                  helper.make_node("QuantizeLinear", [f"{name}_c", f"{name}_s", f"{name}_z"], [f"{name}_q"]),
                  helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"])]
        cat_in.append(f"{name}_dq")
    inits += [init("ys", np.float32(scales[2])), init("yz", np.array(zps[2], dt))]
    nodes.append(helper.make_node("Concat", cat_in, ["cat"], axis=1, name="cat"))
    outputs = [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("cat_q", elem, None)]
    if float_reader:
        nodes.append(helper.make_node("Neg", ["cat"], ["side"]))
        outputs.append(helper.make_tensor_value_info("side", F, None))
    nodes += [helper.make_node("QuantizeLinear", ["cat", "ys", "yz"], ["cat_q"]),
              helper.make_node("DequantizeLinear", ["cat_q", "ys", "yz"], ["cat_dq"]),
              helper.make_node("Relu", ["cat_dq"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [1, C, HW, HW])],
                                            outputs, initializer=inits), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 7
    return m


def _decisions(comp, rule="int8_concat"):
    return [d for d in comp.decisions if f"] {rule} " in str(d)]


def _feeds():
    return {"x": (RNG.standard_normal((1, C, HW, HW)) * 2).astype(np.float32)}


def _without_the_concat_rule(m, x):
    """The reference on the pipeline's graph without ``int8_concat``: the convs integer (``integer_conv``), the
    Concat requantized in float. What ``int8_concat`` must equal exactly."""
    return run(plan_model(m, CompileOptions(disable=("int8_concat",))).graph, x)


def _within_a_step_of_the_oracle(m, x, got):
    """The oracle (the reference on the float QDQ graph, as the unfused build runs it) is within one step."""
    want = run(plan_model(m, CompileOptions(fuse=False)).graph, x)
    assert np.abs(got.astype(int) - want["cat_q"].astype(int)).max() <= 1


@pytest.mark.parametrize("elem, zp", [(I8, -3), (U8, 128)])
def test_equal_scales_concat_the_8bit_tensors_in_place_exactly(elem, zp):
    m = qdq_concat(zps=(zp, zp, zp), elem=elem)
    comp = plan_model(m, CompileOptions(target="cortex-m7"))
    (d,) = _decisions(comp)
    assert "rewritten" in str(d) and "replaced by Concat" in str(d)
    cat = [g for g in comp.plan.groups if "Concat" in g.op_types]
    assert len(cat) == 1 and cat[0].attrs.get("zero_copy") == "concat"  # elided: written in place
    x = _feeds()
    want = _without_the_concat_rule(m, x)
    for opts in (PORTABLE, CodegenOptions()):
        got = build(comp.graph, comp.plan, memory=comp.memory, options=opts).run(x)
        np.testing.assert_array_equal(got["cat_q"], want["cat_q"])
        np.testing.assert_array_equal(got["y"], want["y"])
        _within_a_step_of_the_oracle(m, x, got["cat_q"])


def test_the_arena_shrinks_by_the_concat_copy():
    same = plan_model(qdq_concat(), CompileOptions(target="cortex-m7"))
    other = plan_model(qdq_concat(scales=(0.02, 0.03, 0.03)), CompileOptions(target="cortex-m7"))
    assert same.memory.arena_bytes < other.memory.arena_bytes


@pytest.mark.parametrize("kwargs, reason", [
    ({"scales": (0.02, 0.03, 0.03)}, "'a_dq' has scale 0.02, the output 0.03: a requantization"),
    ({"zps": (-3, -3, 5)}, "'a_dq' has zero point -3, the output 5: a requantization"),
    ({"float_reader": True}, "intermediate 'cat' is also read by"),
])
def test_refusals_say_why_and_keep_the_requantizing_concat(kwargs, reason):
    m = qdq_concat(**kwargs)
    comp = plan_model(m, CompileOptions(target="cortex-m7"))
    (d,) = _decisions(comp)
    assert "refused" in str(d) and reason in str(d)
    assert not any(g.attrs.get("zero_copy") == "concat" for g in comp.plan.groups)
    x = _feeds()
    want = _without_the_concat_rule(m, x)
    got = build(comp.graph, comp.plan, memory=comp.memory, options=PORTABLE).run(x)
    np.testing.assert_array_equal(got["cat_q"], want["cat_q"])


@pytest.mark.parametrize("types, lo, reason", [
    (("uint8", "int8"), -128, "'a' is uint8, the Concat's output int8"),
    (("int8", "int8"), 0, "'Clip' clamps to other bounds than int8's range"),  # a ReLU folded into the clamp
])
def test_builder_graph_refusals(types, lo, reason):
    from opfuse.ops import GraphBuilder
    from opfuse.patterns import find_matches
    from opfuse.rules.qconcat import concat_refusal, int8_concat_pattern
    b = GraphBuilder("mixed")
    xs = [b.input(name, (1, 2, 3), t) for name, t in zip("ab", types, strict=True)]
    deq = [b.op("Mul", b.op("Cast", x, to=int(F)), b.const(f"s{i}", np.float32(0.5))) for i, x in enumerate(xs)]
    cat = b.op("Concat", *deq, axis=1)
    q = b.op("Div", cat, b.const("s", np.float32(0.5)))
    q = b.op("Clip", b.op("Round", q), b.const("lo", np.float32(lo)), b.const("hi", np.float32(127)), name="Clip")
    g = b.build(b.op("Cast", q, to=int(I8)))
    (m,) = find_matches(g, int8_concat_pattern())
    assert concat_refusal(m) == reason


@pytest.mark.skipif(not mcu.tools_available(), reason="needs arm-none-eabi-gcc, newlib and qemu-system-arm")
def test_on_the_m7_the_elided_concat_is_exact(tmp_path):
    m = qdq_concat()
    comp = plan_model(m, CompileOptions(target="cortex-m7"))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    x = _feeds()
    got = mcu.run_on_qemu(program, x, tmp_path).outputs
    np.testing.assert_array_equal(got["cat_q"], _without_the_concat_rule(m, x)["cat_q"])
    _within_a_step_of_the_oracle(m, x, got["cat_q"])
