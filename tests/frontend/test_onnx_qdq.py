"""DQ -> Conv -> [Add(residual)] -> [Relu] -> Q recognized as one integer conv by the pattern rule
``integer_conv`` (``rules/integer_ops.py``, the pipeline's ``recognize_integer`` stage): int32 Conv, int32
bias and a fixed-point ``Requantize`` in the conv's epilogue. Against the oracle (the NumPy reference on
the float QDQ graph as imported, which the unfused build runs) and onnxruntime (which fuses the same
pattern into QLinearConv) within one quantization step, and between the reference and C bit for bit."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import opfuse
from onnx_builders import init, model, op_types, ort_run, vi
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.frontend.onnx import import_model
from opfuse.passes import fuse
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(21)
F, I8, U8 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8


def qdq_conv(act=np.int8, relu=True, per_channel=True, bias=True, bias_scale_factor=1.0, extra_reader=False,
             group=1, residual=False):
    """x (float) -> Q -> DQ -> Conv(DQ(W), DQ(B)) -> [+ DQ(x_q), the residual] -> [Relu] -> Q -> DQ -> y."""
    cin, cout = 8, 8
    w_q = RNG.integers(-127, 128, (cout, cin // group, 3, 3)).astype(np.int8)
    ws = (RNG.uniform(0.002, 0.01, cout) if per_channel else np.array(0.005)).astype(np.float32)
    xs, ys = np.float32(0.04), np.float32(0.09)
    xz = np.array(-5 if act == np.int8 else 120, act)
    yz = np.array(-20 if act == np.int8 else 30, act)
    elem = I8 if act == np.int8 else U8
    inits = [init("xs", xs), init("xz", xz), init("w_q", w_q), init("ws", ws), init("wz", np.zeros(ws.shape, np.int8)),
             init("ys", ys), init("yz", yz)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w_dq"], axis=0)]
    conv_in = ["x_dq", "w_dq"]
    if bias:
        b_scale = (xs * ws * np.float32(bias_scale_factor)).astype(np.float32)
        inits += [init("b_q", RNG.integers(-3000, 3000, cout).astype(np.int32)), init("bs", b_scale),
                  init("bz", np.zeros(b_scale.shape, np.int32))]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "bs", "bz"], ["b_dq"], axis=0))
        conv_in.append("b_dq")
    nodes.append(helper.make_node("Conv", conv_in, ["c"], name="conv", pads=[1, 1, 1, 1], group=group))
    last = "c"
    if residual:
        nodes += [helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_res"]),
                  helper.make_node("Add", ["c", "x_res"], ["c_res"])]
        last = "c_res"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r"]))
        last = "r"
    nodes += [helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["y_q"]),
              helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["y"])]
    outputs = [vi("y", None), vi("y_q", None, elem)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["side"]))
        outputs.append(vi("side", None))
    return model(nodes, [vi("x", [1, cin, 10, 9])], outputs, inits, opset=13)


def _x():
    return {"x": (RNG.standard_normal((1, 8, 10, 9)) * 2).astype(np.float32)}


def recognized(m):
    """The pipeline's graph of ``m`` and the decisions of its ``recognize_integer`` stage."""
    g, _, decisions = fuse(import_model(m))
    return g, [d for d in decisions if d.pass_name == "recognize_integer"]


@pytest.mark.parametrize("act, relu, per_channel, bias, group, residual", [
    (np.int8, True, True, True, 1, False), (np.uint8, True, True, True, 1, False),
    (np.int8, False, False, True, 1, False), (np.int8, True, True, False, 1, False),
    (np.uint8, False, True, True, 8, False), (np.int8, True, True, True, 1, True),
    (np.uint8, False, True, False, 8, True),
])
def test_recognized_conv_matches_the_oracle_and_onnxruntime_within_one_step(act, relu, per_channel, bias, group,
                                                                             residual):
    m = qdq_conv(act, relu, per_channel, bias, group=group, residual=residual)
    g, decisions = recognized(m)
    assert [(d.rule, d.verdict) for d in decisions] == [("integer_conv", "rewritten")]
    assert "Requantize" in op_types(g) and "Relu" not in op_types(g)
    assert op_types(g).count("Round") == 1  # the input's quantization; the output's is the Requantize
    x = _x()
    theirs = ort_run(m, x)["y_q"].astype(int)
    oracle = run(import_model(m), x)["y_q"].astype(int)  # the float QDQ graph, as the unfused build runs it
    ours = run(g, x)["y_q"].astype(int)
    for other in (theirs, oracle):
        assert np.abs(ours - other).max() <= 1
        assert np.mean(ours == other) >= 0.99  # a step apart only near a rounding tie
    for simd in ("auto", "none"):
        plan = plan_model(m).plan
        native = build(plan.graph, plan, options=CodegenOptions(simd=simd)).run(x)["y_q"]
        np.testing.assert_array_equal(native, ours.astype(native.dtype))


def test_the_requantize_runs_in_the_convs_kernel():
    comp = plan_model(qdq_conv())
    (conv_group,) = [grp for grp in comp.plan.groups if "Conv" in grp.op_types]
    assert "Requantize" in conv_group.op_types and "Add" in conv_group.op_types  # bias and requantize epilogue
    requant = next(n for n in comp.plan.graph.nodes if n.op_type == "Requantize")
    assert requant.attrs["lo"] == -20  # the Relu became the clamp at the zero point


def test_the_import_keeps_the_int8_weight_and_the_unfused_build_folds_it():
    """The importer keeps DQ(W_q) as Cast -> Sub -> Mul over the int8 constant (the rule needs it); the unfused
    build folds it as the importer folds constants, so it computes no weight at run time."""
    g = import_model(qdq_conv())
    (cast,) = [n for n in g.nodes if n.op_type == "Cast" and n.inputs[0].is_const and n.inputs[0].dtype == np.int8]
    assert cast.inputs[0].name == "w_q"
    unfused, plan, decisions = fuse(g, enable=False)
    assert decisions == [] and "Requantize" not in op_types(unfused) and "Conv" in op_types(unfused)
    assert not any(all(v.is_const for v in n.input_values()) for n in unfused.nodes)
    assert unfused.values["w_dq"].const.dtype == np.float32  # the dequantized weight, under its ONNX name
    x = _x()
    np.testing.assert_array_equal(run(unfused, x)["y"], run(g, x)["y"])


@pytest.mark.parametrize("kwargs, reason", [
    ({"bias_scale_factor": 1.5}, "the bias scale is not input scale x weight scale"),
    ({"extra_reader": True}, "the Conv's output is not quantized by its only reader (through a residual Add and a "
                             "Relu at most)"),
])
def test_refusals_keep_the_float_path_and_say_why(kwargs, reason):
    """No Requantize; where the Conv's output has a reader besides the quantization (a graph output through a
    Neg), the Conv alone is then ``integer_conv_dequantized``'s (exact integer sums rounded once to float: the 8-bit
    output within one step of onnxruntime's float conv)."""
    m = qdq_conv(**kwargs)
    g, decisions = recognized(m)
    side = kwargs.get("extra_reader", False)
    assert [(d.rule, d.verdict, d.nodes[0], d.reason) for d in decisions][:1] == [("integer_conv", "refused", "conv",
                                                                                    reason)]
    assert [(d.rule, d.verdict) for d in decisions[1:]] == ([("integer_conv_dequantized", "rewritten")] if side else [])
    assert "Requantize" not in op_types(g)
    x = _x()
    theirs = ort_run(m, x)
    diff = np.abs(run(g, x)["y_q"].astype(int) - theirs["y_q"].astype(int))
    assert diff.max() <= (1 if side else 0)


def test_a_float_conv_is_refused_with_its_reason():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "s"], ["y"])]
    m = model(nodes, [vi("x", [1, 2, 4, 4])], [vi("y", None, U8)],
              [init("w", np.ones((2, 2, 1, 1), np.float32)), init("s", np.float32(0.1))], opset=13)
    g, decisions = recognized(m)
    assert [(d.verdict, d.reason) for d in decisions] == [("refused", "the input is not the output of a "
                                                                      "DequantizeLinear")]
    assert "Requantize" not in op_types(g)


def test_a_float_model_is_not_looked_at():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), helper.make_node("Relu", ["c"], ["y"])]
    m = model(nodes, [vi("x", [1, 2, 4, 4])], [vi("y", None)], [init("w", np.ones((2, 2, 1, 1), np.float32))],
              opset=13)
    _, decisions = recognized(m)
    assert decisions == []


def test_opfuse_quantized_resnet8_runs_integer_convs_close_to_onnxruntime():
    r = opfuse.quantize("zoo:resnet8", calibration_random=4)
    g, decisions = recognized(r.model)
    # all nine, the three that end in a residual Add too (a second term of the requantization)
    assert [d.rule for d in decisions if d.verdict == "rewritten"].count("integer_conv") == 9
    assert [d for d in decisions if d.verdict != "rewritten"] == []
    assert sum("Add(residual)" in d.reason for d in decisions) == 3
    x = {"input": RNG.standard_normal((1, 3, 32, 32)).astype(np.float32)}
    theirs = ort_run(r.model, x)["output"]
    ours = opfuse.compile(r.model).run(x)["output"]
    assert np.abs(ours - theirs).max() <= float(r.activations["fc"].scale)


def test_the_decision_log_shows_the_recognized_and_the_refused_conv():
    taken = plan_model(qdq_conv(residual=True))
    (d,) = [d for d in taken.decisions if d.pass_name == "recognize_integer"]
    assert (d.rule, d.verdict, d.nodes[0]) == ("integer_conv", "rewritten", "conv")
    assert "Conv -> Add(residual) -> Relu -> QuantizeLinear as one integer conv" in d.reason
    assert taken.fusion_report.rewrites.get("integer_conv") == 1
    refused = plan_model(qdq_conv(bias_scale_factor=1.5))
    (d,) = [d for d in refused.decisions if d.pass_name == "recognize_integer"]
    assert str(d).startswith("[recognize_integer] integer_conv refused (condition) at conv")
    assert str(d).endswith(": the bias scale is not input scale x weight scale")


def test_the_rule_can_be_disabled_and_the_float_path_runs():
    comp = plan_model(qdq_conv(), disable=["integer_conv"])
    assert "Requantize" not in op_types(comp.plan.graph)
    assert not [d for d in comp.decisions if d.rule == "integer_conv" and d.verdict == "rewritten"]
