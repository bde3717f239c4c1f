"""DQ -> [Flatten] -> Gemm/MatMul -> [Add bias] -> [Relu] -> Q recognized as one integer matmul by the pattern
rule ``integer_matmul`` (``rules/integer_ops.py``): int32 MatMul, int32 bias and a fixed-point ``Requantize`` per
output column, lowered by ``codegen/qmatmul.py`` (SMLAD on the M7; on the host ``codegen/qmatmul_host.py``).
Against the oracle (the reference on the float QDQ graph) and onnxruntime running the QDQ model (within one
quantization step), between the reference and C (bit for bit), and the refusals with their reasons."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import init, model, op_types, ort_run, vi
from opfuse.testing.ort_oracle import products_saturate
from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.frontend.onnx import import_model
from opfuse.passes import fuse
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(31)
# onnxruntime fuses a QDQ product into an 8-bit one, saturating on an x86 CPU without VNNI (``ort_oracle``): there
# it runs the QDQ graph as written (DequantizeLinear, the float product, QuantizeLinear) instead
FUSED = not products_saturate()
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
    theirs = ort_run(m, x, fused=FUSED)["y_q"].astype(int)
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
    ({"extra_reader": True}, "the product is not quantized by its only reader (through a bias Add, a residual Add "
                             "and a Relu at most)"),
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
    assert [(d.rule, d.verdict, d.nodes[0], d.reason) for d in decisions if d.rule == "integer_matmul"] == [
        ("integer_matmul", "refused", "mm", reason)]
    assert "Requantize" not in op_types(g)
    x = _x(m)
    if kwargs.get("extra_reader"):  # the float product read twice: integer_matmul_dequantized's (below)
        assert [(d.rule, d.verdict) for d in decisions if d.rule != "integer_matmul"] == [
            ("integer_matmul_dequantized", "rewritten")]
        assert np.abs(run(g, x)["y_q"].astype(int) - run(import_model(m), x)["y_q"].astype(int)).max() <= 1
        return
    np.testing.assert_array_equal(run(g, x)["y_q"], run(import_model(m), x)["y_q"])  # the float path: the oracle's


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


# A batch of matrices times one weight, and products left in float ---------------------------------------------

def qdq_linear(rows=(1, 6), K=21, N=13, act=np.int8, quantize_output=True, bias_scale_factor=1.0, seed=5,
               residual=False):
    """x (float, rows x K) -> Q -> DQ -> MatMul(DQ(W)) -> Add(DQ(int32 bias)) [-> Add(DQ(r_q))] [-> Q -> DQ] -> y:
    an exported Linear on a batch of rows (a transformer's ``[1, S, H]``), its output quantized or left in float;
    ``residual``: an 8-bit input of the output's shape (``r_q``) added, dequantized (a transformer's residual)."""
    rng = np.random.default_rng(seed)
    xs, ws = np.float32(0.05), rng.uniform(0.002, 0.01, N).astype(np.float32)
    xz = np.array(-3 if act == np.int8 else 125, act)
    b_scale = (xs * ws * np.float32(bias_scale_factor)).astype(np.float32)
    inits = [init("xs", xs), init("xz", xz), init("w_q", rng.integers(-127, 128, (K, N)).astype(np.int8)),
             init("ws", ws), init("wz", np.zeros(N, np.int8)), init("b_q", rng.integers(-900, 900, N).astype(np.int32)),
             init("bs", b_scale), init("bz", np.zeros(N, np.int32))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "xs", "xz"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "ws", "wz"], ["w_dq"], axis=1),
             helper.make_node("DequantizeLinear", ["b_q", "bs", "bz"], ["b_dq"], axis=0),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["c"], name="mm"),
             helper.make_node("Add", ["c", "b_dq"], ["cb"], name="bias_add")]
    last = "cb"
    inputs = [vi("x", list(rows) + [K])]
    if residual:
        inits += [init("rs", np.float32(0.07)), init("rz", np.array(-9 if act == np.int8 else 131, act))]
        nodes += [helper.make_node("DequantizeLinear", ["r_q", "rs", "rz"], ["r_dq"]),
                  helper.make_node("Add", ["r_dq", "cb"], ["cr"], name="residual_add")]
        inputs.append(vi("r_q", list(rows) + [N], I8 if act == np.int8 else U8))
        last = "cr"
    outputs = [vi(last, None)]
    if quantize_output:
        inits += [init("ys", np.float32(0.09)), init("yz", np.array(4 if act == np.int8 else 128, act))]
        nodes += [helper.make_node("QuantizeLinear", [last, "ys", "yz"], ["y_q"]),
                  helper.make_node("DequantizeLinear", ["y_q", "ys", "yz"], ["y"])]
        outputs = [vi("y", None), vi("y_q", None, I8 if act == np.int8 else U8)]
    return model(nodes, inputs, outputs, inits, opset=13)


@pytest.mark.parametrize("rows, act", [((1, 6), np.int8), ((2, 3, 5), np.uint8)])
def test_a_batch_of_rows_is_one_integer_matmul_of_the_flattened_rows(rows, act):
    """``[..., M, K] x [K, N]``: the 8-bit input reshaped to one matrix, the integer matmul, the 8-bit result
    reshaped back; within one step of onnxruntime and of the oracle, the C bit-exact against the reference."""
    m = qdq_linear(rows, act=act)
    g, decisions = recognized(m)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [(
        "integer_matmul", "rewritten", "DequantizeLinear -> MatMul -> Add(bias) -> QuantizeLinear as one integer "
        f"matmul (int32 accumulator, fixed-point Requantize), its {len(rows) + 1}-D input's rows flattened into "
        "one matrix")]
    (mm,) = [n for n in g.nodes if n.op_type == "MatMul"]
    assert mm.input(0).shape == (int(np.prod(rows)), 21) and mm.outputs[0].dtype == np.int32
    assert g.values["y_q"].shape == tuple(rows) + (13,)
    x = {"x": (RNG.standard_normal(list(rows) + [21]) * 2).astype(np.float32)}
    ours = run(g, x)["y_q"].astype(int)
    for other in (ort_run(m, x, fused=FUSED)["y_q"], run(import_model(m), x)["y_q"]):
        assert np.abs(ours - other.astype(int)).max() <= 1
    plan = plan_model(m).plan
    for simd in ("auto", "none"):
        got = build(plan.graph, plan, options=CodegenOptions(simd=simd)).run(x)["y_q"]
        np.testing.assert_array_equal(got, ours.astype(got.dtype))


@pytest.mark.parametrize("rows, act", [((7,), np.int8), ((2, 3, 5), np.uint8), ((1, 30), np.int8)])
def test_a_residual_after_the_product_is_one_integer_matmul(rows, act):
    """``DQ -> MatMul -> Add(DQ(bias)) -> Add(DQ(r_q)) -> Q`` (a transformer's Linear and residual): one integer
    matmul whose Requantize adds the centred residual as a second term, as the integer conv does; within one step of
    onnxruntime and of the oracle, the C (the host's word GEMM with the residual in its vector epilogue, and the
    portable kernel) bit-exact against the reference of the rewritten graph."""
    m = qdq_linear(rows, act=act, residual=True)
    g, decisions = recognized(m)
    flat = f", its {len(rows) + 1}-D input's rows flattened into one matrix" if len(rows) > 1 else ""
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [(
        "integer_matmul", "rewritten", "DequantizeLinear -> MatMul -> Add(bias) -> Add(residual) -> QuantizeLinear "
        f"as one integer matmul (int32 accumulator, fixed-point Requantize){flat}")]
    (req,) = [n for n in g.nodes if n.op_type == "Requantize"]
    assert len(req.inputs) == 5 and "residual_add" not in {n.name for n in g.nodes}  # its second term
    rng = np.random.default_rng(8)
    info = np.iinfo(act)
    x = {"x": (rng.standard_normal(list(rows) + [21]) * 2).astype(np.float32),
         "r_q": rng.integers(info.min, int(info.max) + 1, list(rows) + [13]).astype(act)}
    ours = run(g, x)["y_q"].astype(int)
    for other in (ort_run(m, x, fused=FUSED)["y_q"], run(import_model(m), x)["y_q"]):
        assert np.abs(ours - other.astype(int)).max() <= 1
        assert np.mean(ours == other.astype(int)) >= 0.9
    plan = plan_model(m).plan
    (mm,) = [grp for grp in plan.groups if "MatMul" in grp.op_types]
    assert "Requantize" in mm.op_types
    for simd in ("auto", "none"):
        program = generate(plan.graph, plan, options=CodegenOptions(simd=simd))
        kernel = "host word GEMM, columns in lanes" if simd == "auto" else "opfuse_dot2_s16"
        assert kernel in program.source
        got = build(plan.graph, plan, options=CodegenOptions(simd=simd)).run(x)["y_q"]
        np.testing.assert_array_equal(got, ours.astype(got.dtype))


@pytest.mark.parametrize("rows", [(1, 6), (4, 2, 3)])
def test_a_product_left_in_float_is_an_integer_matmul_dequantized(rows):
    """``DQ -> MatMul -> Add(DQ(int32 bias))`` read as float: the int32 matmul and bias, then one multiply by
    ``x_scale * w_scale`` per column (the bias's scale). The oracle sums float32 products, so it differs by float
    rounding; the C equals the reference on the rewritten graph bit for bit (the same Cast and multiply)."""
    m = qdq_linear(rows, quantize_output=False)
    g, decisions = recognized(m)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [(
        "integer_matmul_dequantized", "rewritten", "DequantizeLinear -> MatMul -> Add(bias) as an integer matmul "
        f"(int32 accumulator) dequantized to float, its {len(rows) + 1}-D input's rows flattened into one matrix")]
    kept = op_types(g)
    assert "MatMul" in kept and [n.outputs[0].dtype for n in g.nodes if n.op_type == "MatMul"] == [np.int32]
    x = {"x": (RNG.standard_normal(list(rows) + [21]) * 2).astype(np.float32)}
    ours = run(g, x)["cb"]
    np.testing.assert_allclose(ours, run(import_model(m), x)["cb"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours, ort_run(m, x, fused=FUSED)["cb"], rtol=1e-5, atol=1e-5)
    plan = plan_model(m).plan
    (mm,) = [grp for grp in plan.groups if "MatMul" in grp.op_types]
    assert {"Add", "Cast", "Mul"} <= set(mm.op_types)  # bias and dequantization in the matmul's epilogue
    for simd in ("auto", "none"):
        program = generate(plan.graph, plan, options=CodegenOptions(simd=simd))
        assert ("epilogue element by element" in program.source) == (simd == "auto")
        np.testing.assert_array_equal(build(plan.graph, plan, options=CodegenOptions(simd=simd)).run(x)["cb"], ours)


def test_a_product_left_in_float_with_a_wrong_bias_scale_keeps_its_bias_in_float():
    """The bias Add refused with the reason; the MatMul alone is still the integer matmul dequantized, and the
    float Add of the dequantized bias stays after it."""
    m = qdq_linear(quantize_output=False, bias_scale_factor=1.5)
    g, decisions = recognized(m)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [
        ("integer_matmul_dequantized", "refused", "the bias scale is not input scale x weight scale"),
        ("integer_matmul_dequantized", "rewritten", "DequantizeLinear -> MatMul as an integer matmul (int32 "
                                                    "accumulator) dequantized to float, its 3-D input's rows flattened "
                                                    "into one matrix")]
    assert g.values["cb"].producer.op_type == "Add" and g.values["cb"].dtype == np.float32
    x = {"x": (RNG.standard_normal((1, 6, 21)) * 2).astype(np.float32)}
    np.testing.assert_allclose(run(g, x)["cb"], run(import_model(m), x)["cb"], rtol=1e-5, atol=1e-5)


def test_a_quantized_product_is_left_to_integer_matmul():
    """A product quantized by its only reader is integer_matmul's, refused or not: no second rule claims it."""
    _, decisions = recognized(qdq_linear(bias_scale_factor=1.5))
    assert [(d.rule, d.verdict) for d in decisions] == [("integer_matmul", "refused")]
