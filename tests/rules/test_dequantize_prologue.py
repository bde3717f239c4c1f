"""int8 tensors between fused integer kernels (``rules/quantized.py``): the reader of an 8-bit tensor
dequantizes it in its own kernel (a Conv's prologue, a residual Add's side input), so each group
boundary of a quantized model is the 8-bit tensor, sized at one byte; C equals the reference bit for
bit on the int8 outputs; what is refused and why; the same C twice."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import opfuse
from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import CompileOptions, is_quantized, plan_model
from opfuse.frontend.onnx import import_model
from opfuse.ops.builder import GraphBuilder
from opfuse.rules.kernel_shape import classify
from opfuse.rules.decisions import Refusal
from opfuse.rules.quantized import prologue_refusal
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

RNG = np.random.default_rng(15)
I8 = TensorProto.INT8


def init(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def model(nodes, inputs, outputs, inits, opset=13):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializer=inits),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 7
    return m


def _qconv(nodes, inits, x, y, name, cin, cout, group=1, relu=True, k=3):
    """DQ(x) -> Conv(DQ(W), DQ(B)) -> [Relu] -> Q -> y (int8), per-channel weights."""
    w_q = RNG.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8)
    ws = RNG.uniform(0.002, 0.01, cout).astype(np.float32)
    inits += [init(f"{name}_w", w_q), init(f"{name}_ws", ws), init(f"{name}_wz", np.zeros(cout, np.int8)),
              init(f"{name}_b", RNG.integers(-2000, 2000, cout).astype(np.int32)),
              init(f"{name}_bs", (np.float32(0.05) * ws).astype(np.float32)),
              init(f"{name}_bz", np.zeros(cout, np.int32))]
    nodes += [helper.make_node("DequantizeLinear", [x, "s", "z"], [f"{name}_xdq"]),
              helper.make_node("DequantizeLinear", [f"{name}_w", f"{name}_ws", f"{name}_wz"], [f"{name}_wdq"], axis=0),
              helper.make_node("DequantizeLinear", [f"{name}_b", f"{name}_bs", f"{name}_bz"], [f"{name}_bdq"], axis=0),
              helper.make_node("Conv", [f"{name}_xdq", f"{name}_wdq", f"{name}_bdq"], [f"{name}_c"], name=name,
                               pads=[k // 2] * 4, group=group)]
    last = f"{name}_c"
    if relu:
        nodes.append(helper.make_node("Relu", [last], [f"{name}_r"]))
        last = f"{name}_r"
    nodes.append(helper.make_node("QuantizeLinear", [last, "s", "z"], [y]))


def two_convs(residual=False, depthwise=False):
    """x -> Q -> conv a -> conv b (depthwise) [-> + DQ(a), float residual] -> Q -> y_q (int8)."""
    c = 8
    inits = [init("s", np.float32(0.05)), init("z", np.array(-3, np.int8))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["x_q"])]
    _qconv(nodes, inits, "x_q", "a_q", "a", 4, c)
    if residual:
        _qconv(nodes, inits, "a_q", "bq_pre", "b", c, c, group=c if depthwise else 1, relu=False)
        nodes += [helper.make_node("DequantizeLinear", ["bq_pre", "s", "z"], ["b_dq"]),
                  helper.make_node("DequantizeLinear", ["a_q", "s", "z"], ["a_dq"]),
                  helper.make_node("Add", ["b_dq", "a_dq"], ["sum"]),
                  helper.make_node("QuantizeLinear", ["sum", "s", "z"], ["y_q"])]
    else:
        _qconv(nodes, inits, "a_q", "y_q", "b", c, c, group=c if depthwise else 1)
    return model(nodes, [vi("x", [1, 4, 11, 9])], [vi("y_q", None, I8)], inits, opset=13)


def _x():
    return {"x": (RNG.standard_normal((1, 4, 11, 9)) * 3).astype(np.float32)}


def _boundaries(comp):
    return {v.name: v for g in comp.plan.groups for v in g.outputs(comp.graph)}


@pytest.mark.parametrize("residual, depthwise", [(False, False), (False, True), (True, False)])
def test_int8_between_kernels_bit_exact_in_c(residual, depthwise):
    g = import_model(two_convs(residual, depthwise))
    assert is_quantized(g)
    comp = plan_model(g)
    convs = [grp for grp in comp.plan.groups if "Conv" in grp.op_types]
    assert len(convs) == 2  # one kernel per fused group, as for float
    outs = _boundaries(comp)
    a = outs["a_q"]
    assert a.dtype == np.int8  # the tensor between the two conv kernels is the int8 one
    assert comp.memory.locations["a_q"].region == "arena"
    assert comp.memory.graph.values["a_q"].nbytes == int(np.prod(a.shape))  # one byte an element
    assert all(v.dtype == np.int8 for v in outs.values())
    second = next(grp for grp in convs if "a_q" not in {v.name for v in grp.outputs(comp.graph)})
    assert second.attrs.get("rule") == "dequantize_prologue" or "Cast" in second.op_types
    x = _x()
    want = run(g, x)["y_q"]
    for simd in ("auto", "none"):
        got = build(comp.plan.graph, comp.plan, options=CodegenOptions(simd=simd)).run(x)["y_q"]
        np.testing.assert_array_equal(got, want)  # integer math: bit-exact


def test_unfused_int8_kernels_bit_exact_in_c():
    g = import_model(two_convs(residual=True))
    comp = plan_model(g, CompileOptions(fuse=False))
    x = _x()
    got = build(comp.plan.graph, comp.plan, options=CodegenOptions(simd="none")).run(x)["y_q"]
    np.testing.assert_array_equal(got, run(g, x)["y_q"])


def test_quantized_resnet8_keeps_every_conv_boundary_int8():
    r = opfuse.quantize("zoo:resnet8", calibration_random=2)
    g = import_model(r.model)
    comp = plan_model(g)
    for grp in comp.plan.groups:
        if "Conv" in grp.op_types:
            assert [v.dtype for v in grp.outputs(comp.graph)] == [np.dtype(np.int8)], grp.name


def test_each_decision_names_the_8bit_tensor_and_its_reader():
    """One ``dequantize_prologue`` decision per 8-bit tensor read, naming the chain's Cast, the reader and the tensor;
    the float residual Add after two requantizations is no anchor's epilogue, so no anchor joins it."""
    def prologues(m):
        return [(d.nodes, d.reason) for d in plan_model(m).decisions if d.rule == "dequantize_prologue"]
    assert prologues(two_convs()) == [
        (("a/Cast", "a/Conv"), "'x_q' read as 8 bits by 'a/Conv'"),
        (("b/Cast", "b/Conv"), "'a_q' read as 8 bits by 'b/Conv'")]
    residual = prologues(two_convs(residual=True))
    assert [r for _, r in residual] == ["'x_q' read as 8 bits by 'a/Conv'", "'a_q' read as 8 bits by 'b/Conv'",
                                        "'bq_pre' read as 8 bits by 'add_0'", "'a_q' read as 8 bits by 'add_0'"]
    assert [len(nodes) for nodes, _ in residual] == [2, 2, 2, 2] and residual[2][0][1] == "add_0"


def test_a_float_model_is_planned_as_before():
    assert not is_quantized(opfuse.load("zoo:resnet8"))


# Refusals --------------------------------------------------------------------------------------

I32 = int(TensorProto.INT32)


def _graph_conv_prologue(src_dtype="int8", extra_reader=False, runtime_zp=False):
    """x (8-bit) -> Cast(int32) -> Sub(zero point) -> Conv [-> and Neg(the centred x)]."""
    b = GraphBuilder("t")
    x = b.input("x", (1, 2, 5, 5), src_dtype)
    zp = b.input("zpv", (), "int32") if runtime_zp else b.const("zp", np.array(3, np.int32))
    s = b.op("Sub", b.op("Cast", x, name="cast", to=I32), zp, name="sub")
    y = b.op("Conv", s, b.const("w", np.ones((2, 2, 3, 3), np.int32)), name="conv", pads=[1, 1, 1, 1])
    return b.build(y, b.op("Neg", s, name="neg")) if extra_reader else b.build(y)


def _nodes(g, *names):
    return [g.node(n) for n in names]


def test_prologue_of_an_int8_tensor_is_legal():
    g = _graph_conv_prologue()
    shape = classify(_nodes(g, "cast", "sub", "conv"), g)
    assert not isinstance(shape, Refusal) and shape.kind == "conv_epilogue"
    assert shape.attrs["prologue"] == ["cast", "sub"]


@pytest.mark.parametrize("kwargs, reason", [
    ({"runtime_zp": True}, "'sub' (Sub) reads 'zpv' (int32): a prologue reads an 8-bit tensor and constants only"),
    ({"extra_reader": True}, "prologue value 'sub' is also read outside the group: the anchor reads its prologue "
                             "through registers only"),
])
def test_prologue_refusals_say_why(kwargs, reason):
    g = _graph_conv_prologue(**kwargs)
    nodes = _nodes(g, "cast", "sub", "conv")
    r = classify(nodes, g)
    assert isinstance(r, Refusal)
    assert "a prologue only to dequantize an 8-bit operand" in r.reason
    got = prologue_refusal(nodes[:2], nodes[2], {id(n) for n in nodes})
    assert got is not None and got.reason == reason


def test_prologue_refusals_for_the_group_the_shape_and_the_source():
    """A reader after the anchor inside the group, a broadcast before the anchor, only constants: each refused."""
    g = _graph_conv_prologue(extra_reader=True)
    cast, sub, conv, neg = _nodes(g, "cast", "sub", "conv", "neg")
    r = prologue_refusal([cast, sub], conv, {id(n) for n in (cast, sub, conv, neg)})
    assert r.reason == ("prologue value 'sub' is also read by 'neg' after the anchor: the anchor reads its prologue "
                        "through registers only")
    b = GraphBuilder("t")
    x = b.input("x", (1, 2, 5, 1), "int8")
    s = b.op("Sub", b.op("Cast", x, name="cast", to=I32), b.const("zp", np.full((1, 1, 1, 5), 3, np.int32)),
             name="sub")
    g = b.build(b.op("Conv", s, b.const("w", np.ones((2, 2, 3, 3), np.int32)), name="conv", pads=[1, 1, 1, 1]))
    cast, sub, conv = _nodes(g, "cast", "sub", "conv")
    r = prologue_refusal([cast, sub], conv, {id(n) for n in g.nodes})
    assert r.reason == "'cast' (Cast) changes the shape before 'conv'"
    b = GraphBuilder("t")
    s = b.op("Cast", b.const("xq", np.ones((1, 2, 5, 5), np.int8)), name="cast", to=I32)
    g = b.build(b.op("Conv", s, b.input("w", (2, 2, 3, 3), "int32"), name="conv", pads=[1, 1, 1, 1]))
    r = prologue_refusal([g.node("cast")], g.node("conv"), {id(n) for n in g.nodes})
    assert r.reason == "the prologue of 'conv' reads no 8-bit tensor"


def test_a_prologue_on_the_weight_operand_is_refused():
    b = GraphBuilder("t")
    x = b.input("x", (1, 2, 5, 5), "int32")
    wq = b.input("wq", (2, 2, 3, 3), "int8")
    g = b.build(b.op("Conv", x, b.op("Cast", wq, name="cast", to=I32), name="conv"))
    r = prologue_refusal([g.node("cast")], g.node("conv"), {id(n) for n in g.nodes})
    assert r is not None and "not its data" in r.reason


def test_a_dequantized_runtime_weight_is_refused_in_the_plan():
    """The fusion pass records the condition's refusal for the Conv reading a dequantized weight (operand 1)."""
    b = GraphBuilder("t")
    x = b.input("x", (1, 2, 5, 5), "int32")
    wq = b.input("wq", (2, 2, 3, 3), "int8")
    w = b.op("Sub", b.op("Cast", wq, name="cast", to=I32), b.const("zp", np.array(1, np.int32)), name="sub")
    g = b.build(b.op("Conv", x, w, name="conv", pads=[1, 1, 1, 1]))
    got = [(d.verdict, d.nodes, d.reason) for d in plan_model(g).decisions if d.rule == "dequantize_prologue"]
    assert got == [("refused", ("cast", "conv"), "the prologue feeds operand [1] of 'conv' (Conv), not its data")]


def test_a_float_prologue_into_a_conv_is_still_refused():
    b = GraphBuilder("t")
    x = b.input("x", (1, 2, 5, 5))
    g = b.build(b.op("Conv", b.op("Relu", x, name="relu"), b.const("w", np.ones((2, 2, 1, 1), np.float32)),
                     name="conv"))
    got = classify(list(g.nodes), g)
    assert isinstance(got, Refusal)
    assert got.reason.endswith("out-elementwise-fusable ops take an epilogue, never a prologue")
    assert "reads 'x' (float32)" in prologue_refusal([g.node("relu")], g.node("conv"), {id(n) for n in g.nodes}).reason


def test_same_c_twice():
    g = import_model(two_convs(residual=True))
    pa, pb = plan_model(g).plan, plan_model(g).plan
    a, b = generate(pa.graph, pa), generate(pb.graph, pb)
    assert a.source == b.source and a.weights == b.weights


# dequantize_late: data movement before the dequantization; one dequantization per reader ---------

def _dq(b, q, zp=-3, scale=0.05):
    c = b.op("Cast", q, to=int(TensorProto.FLOAT))
    centred = b.op("Sub", c, b.const("zp", np.array(zp, np.float32)))
    return b.op("Mul", centred, b.const("s", np.array(scale, np.float32)))


def test_dequantize_late_moves_a_split_and_a_flatten_and_clones_per_reader():
    from opfuse.rewrites import rewrite
    b = GraphBuilder("t")
    q = b.input("q", (1, 4, 3, 3), "int8")
    s0, s1 = b.op("Split", _dq(b, q), num_outputs=2, axis=1, split=[2, 2])
    f = b.op("Neg", b.op("Flatten", _dq(b, q), axis=1))
    y0 = b.op("Relu", s0)
    y1 = b.op("Add", s0, s1)
    g = b.build(y0, y1, f)
    feeds = {"q": RNG.integers(-128, 128, (1, 4, 3, 3)).astype(np.int8)}
    want = run(g, feeds)
    result = rewrite(g)
    done = [d.reason for d in result.decisions if d.rule == "dequantize_late" and d.verdict == "rewritten"]
    assert any("moved" in r for r in done) and any("cloned" in r for r in done)
    moves = [n for n in g.nodes if n.op_type in ("Split", "Flatten")]
    assert all(n.input(0).dtype == np.int8 for n in moves)  # the int8 tensor is what moves
    for n in g.nodes:  # every dequantization has one reader
        if n.op_type == "Mul":
            assert len(n.outputs[0].uses) <= 1
    got = run(g, feeds)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


def test_dequantize_late_refuses_a_graph_output_and_a_vector_scale():
    from opfuse.rewrites import rewrite
    b = GraphBuilder("t")
    q = b.input("q", (1, 4, 3, 3), "int8")
    c = b.op("Cast", q, to=int(TensorProto.FLOAT))
    per_channel = b.op("Mul", c, b.const("s", np.full((1, 4, 1, 1), 0.1, np.float32)))
    g = b.build(b.op("Flatten", per_channel, axis=1), b.op("Flatten", _dq(b, q), axis=1))
    result = rewrite(g)
    flats = [n for n in g.nodes if n.op_type == "Flatten"]
    assert all(n.input(0).dtype == np.float32 for n in flats)  # neither moved
    refused = [d for d in result.decisions if d.rule == "dequantize_late" and d.verdict != "rewritten"]
    assert any("graph output" in d.reason for d in refused)


def test_the_anchor_is_found_past_an_operand_read_twice():
    """An elementwise reader of an 8-bit tensor takes the anchor its other operand comes from along
    (``_anchor_path``): ``add(DQ(q), mul(s, mm))`` with ``s`` also read by a Neg: the search passes over ``s``
    (read twice, no path) and finds the MatMul through the Mul's other operand."""
    b = GraphBuilder("g")
    deq = b.op("Cast", b.input("q", (4, 6), "int8"), to=int(TensorProto.FLOAT), name="cast")
    s = b.op("Sigmoid", b.input("z", (4, 6)), name="sig")
    acc = b.op("MatMul", b.input("x", (4, 5)), b.const("w", np.ones((5, 6), np.float32)), name="mm")
    y = b.op("Add", b.op("Mul", s, acc, name="mul"), deq, name="add")
    decisions = plan_model(b.build(y, b.op("Neg", s, name="neg"))).decisions
    assert [(d.nodes, d.reason) for d in decisions if d.rule == "dequantize_prologue"] == [
        (("cast", "add", "mm"), "'q' read as 8 bits by 'add'")]
