"""DQ -> [Flatten] -> Gemm/MatMul -> [Add bias] -> [Relu] -> Q recognized as one integer matmul by the pattern
rule ``integer_matmul`` (``rules/integer_ops.py``): int32 MatMul, int32 bias and a fixed-point ``Requantize`` per
output column, lowered by ``codegen/qmatmul.py`` (SMLAD on the M7; on the host ``codegen/qmatmul_host.py``).
Against the oracle (the reference on the float QDQ graph) and onnxruntime running the QDQ model (within one
quantization step), between the reference and C (bit for bit), and the refusals with their reasons."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import init, model, op_types, ort_run, vi
from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.frontend.onnx import import_model
from opfuse.passes import fuse
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(31)
F, I8, U8 = TensorProto.FLOAT, TensorProto.INT8, TensorProto.UINT8
K, N = 37, 11  # odd K (the int16 column's zero pad) and odd N (a lone last column)


def qdq_matmul(op="Gemm", act=np.int8, relu=False, per_channel=True, bias=True, flatten=True, bias_scale_factor=1.0,
               trans_b=1, alpha=1.0, w_axis=None, extra_reader=False):
    """x (float, 1 x K x 1 x 1 or 1 x K) -> Q -> DQ -> [Flatten] -> Gemm(DQ(W), DQ(B)) or MatMul(DQ(W)) [+ DQ(B)]
    -> [Relu] -> Q -> DQ -> y."""
    w_shape = (N, K) if op == "Gemm" and trans_b else (K, N)
    w_q = RNG.integers(-127, 128, w_shape).astype(np.int8)
    ws = (RNG.uniform(0.002, 0.01, N) if per_channel else np.array(0.005)).astype(np.float32)
    xs, ys = np.float32(0.04), np.float32(0.11)
    xz = np.array(-5 if act == np.int8 else 120, act)
    yz = np.array(-20 if act == np.int8 else 30, act)
    elem = I8 if act == np.int8 else U8
    axis = w_axis if w_axis is not None else (0 if op == "Gemm" and trans_b else 1)
    inits = [init("xs", xs), init("xz", xz), init("w_q", w_q), init("ws", ws), init("wz", np.zeros(ws.shape, np.int8)),
             init("ys", ys), init("yz", yz)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w_dq"], axis=axis)]
    a = "x_dq"
    if flatten:
        nodes.append(helper.make_node("Flatten", ["x_dq"], ["x_flat"], axis=1))
        a = "x_flat"
    if bias:
        b_scale = (xs * ws * np.float32(bias_scale_factor)).astype(np.float32)
        inits += [init("b_q", RNG.integers(-3000, 3000, N).astype(np.int32)), init("bs", b_scale),
                  init("bz", np.zeros(b_scale.shape, np.int32))]
        nodes.append(helper.make_node("DequantizeLinear", ["b_q", "bs", "bz"], ["b_dq"], axis=0))
    if op == "Gemm":
        nodes.append(helper.make_node("Gemm", [a, "w_dq"] + (["b_dq"] if bias else []), ["c"], name="mm",
                                      transB=trans_b, alpha=alpha))
        last = "c"
    else:
        nodes.append(helper.make_node("MatMul", [a, "w_dq"], ["c"], name="mm"))
        last = "c"
        if bias:
            nodes.append(helper.make_node("Add", ["c", "b_dq"], ["cb"]))
            last = "cb"
    if relu:
        nodes.append(helper.make_node("Relu", [last], ["r"]))
        last = "r"
    nodes += [helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["y_q"]),
              helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["y"])]
    outputs = [vi("y", None), vi("y_q", None, elem)]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["side"]))
        outputs.append(vi("side", None))
    shape = [1, K, 1, 1] if flatten else [1, K]
    return model(nodes, [vi("x", shape)], outputs, inits, opset=13)


def _x(m):
    shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
    return {"x": (RNG.standard_normal(shape) * 2).astype(np.float32)}


def recognized(m):
    """The pipeline's graph of ``m`` and the decisions of its ``recognize_integer`` stage."""
    g, _, decisions = fuse(import_model(m))
    return g, [d for d in decisions if d.pass_name == "recognize_integer"]


@pytest.mark.parametrize("op, act, relu, per_channel, bias, flatten, trans_b", [
    ("Gemm", np.int8, False, True, True, True, 1), ("Gemm", np.uint8, True, True, True, True, 1),
    ("Gemm", np.int8, True, False, False, False, 0), ("MatMul", np.int8, False, True, True, False, 0),
    ("MatMul", np.uint8, True, False, True, True, 0), ("MatMul", np.int8, False, True, False, False, 0),
])
def test_recognized_matmul_matches_onnxruntime_and_c_is_bit_exact(op, act, relu, per_channel, bias, flatten, trans_b):
    m = qdq_matmul(op, act, relu, per_channel, bias, flatten, trans_b=trans_b)
    g, decisions = recognized(m)
    assert [(d.rule, d.verdict) for d in decisions] == [("integer_matmul", "rewritten")]
    kept = op_types(g)
    assert "Requantize" in kept and "MatMul" in kept and "Gemm" not in kept and "Relu" not in kept
    assert g.values["y_q"].producer.op_type == "Requantize"
    x = _x(m)
    theirs = ort_run(m, x)["y_q"].astype(int)
    oracle = run(import_model(m), x)["y_q"].astype(int)
    ours = run(g, x)["y_q"].astype(int)
    for other in (theirs, oracle):
        assert np.abs(ours - other).max() <= 1
        assert np.mean(ours == other) >= 0.9  # a step apart only near a rounding tie
    plan = plan_model(m).plan
    (mm,) = [grp for grp in plan.groups if "MatMul" in grp.op_types]
    assert "Requantize" in mm.op_types  # the requantize is the matmul kernel's epilogue
    for simd in ("auto", "none"):
        program = generate(plan.graph, plan, options=CodegenOptions(simd=simd))
        # the host's word GEMM (codegen/qmatmul_host.py) with SIMD, the portable SMLAD kernel in the plain build
        kernel = "host word GEMM, columns in lanes" if simd == "auto" else "opfuse_dot2_s16"
        assert kernel in program.source and "int8 matmul" in program.source
        native = build(plan.graph, plan, options=CodegenOptions(simd=simd)).run(x)["y_q"]
        np.testing.assert_array_equal(native, ours.astype(native.dtype))


@pytest.mark.parametrize("kwargs, reason", [
    ({"bias_scale_factor": 1.5}, "the bias scale is not input scale x weight scale"),
    ({"alpha": 2.0}, "a Gemm with transA or alpha, beta other than 1"),
    ({"w_axis": 1}, "the weight's scale is not per tensor or per output column"),  # per input row, transB = 1
    ({"extra_reader": True}, "the product is not quantized by its only reader (through a bias Add and a Relu at "
                             "most)"),
])
def test_refusals_keep_the_float_path_and_say_why(kwargs, reason):
    if kwargs.get("w_axis") == 1:
        kwargs = {**kwargs, "per_channel": True}
        m = qdq_matmul(**kwargs)
        # per input row: K scales on the N x K weight's axis 1
        for t in m.graph.initializer:
            if t.name in ("ws", "wz"):
                arr = RNG.uniform(0.002, 0.01, K).astype(np.float32) if t.name == "ws" else np.zeros(K, np.int8)
                t.CopyFrom(init(t.name, arr))
        for t in m.graph.initializer:
            if t.name == "bs":
                t.CopyFrom(init("bs", np.float32(0.04 * 0.005)))
    else:
        m = qdq_matmul(**kwargs)
    g, decisions = recognized(m)
    assert [(d.rule, d.verdict, d.nodes[0], d.reason) for d in decisions] == [("integer_matmul", "refused", "mm",
                                                                                reason)]
    assert "Requantize" not in op_types(g)
    x = _x(m)  # the float path: the oracle's own values
    np.testing.assert_array_equal(run(g, x)["y_q"], run(import_model(m), x)["y_q"])


def test_zoo_classifiers_fc_is_an_integer_matmul():
    """The quantizer's own output (Flatten between the pool's DQ and the fc): the fc becomes the integer matmul."""
    import opfuse
    r = opfuse.quantize("zoo:ds_cnn", calibration_random=2)
    g, decisions = recognized(r.model)
    assert [d.reason for d in decisions if d.rule == "integer_matmul"] == [
        "DequantizeLinear -> Flatten -> Gemm -> Add(bias) -> QuantizeLinear as one integer matmul (int32 "
        "accumulator, fixed-point Requantize)"]
    mm = [n for n in g.nodes if n.op_type == "MatMul"]
    assert len(mm) == 1 and mm[0].outputs[0].dtype == np.int32
    assert "Gemm" not in op_types(g)


def test_the_decision_log_and_report_show_the_recognitions_and_refusals():
    """The rule's recognitions (and refusals, with the reason) are in the decision log under its pass
    (``recognize_integer``), and the fusion report counts them among the rewrites."""
    taken = plan_model(qdq_matmul(relu=True))
    (d,) = [d for d in taken.decisions if d.pass_name == "recognize_integer"]
    assert (d.rule, d.verdict, d.nodes[0]) == ("integer_matmul", "rewritten", "mm")
    assert "Gemm -> Add(bias) -> Relu -> QuantizeLinear as one integer matmul" in d.reason
    assert taken.fusion_report.rewrites.get("integer_matmul") == 1
    refused = plan_model(qdq_matmul(alpha=2.0))
    (d,) = [d for d in refused.decisions if d.pass_name == "recognize_integer"]
    assert str(d).startswith("[recognize_integer] integer_matmul refused (condition) at mm")
    assert str(d).endswith(": a Gemm with transA or alpha, beta other than 1")
