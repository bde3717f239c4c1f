"""``qlinear_fixed_point`` (``rules/qlinear_fixed.py``): a QOperator model's float requantization of an int32
accumulator as one fixed-point Requantize. On IR graphs built op by op: the match, each refusal's reason; and on a
QLinearConv imported from ONNX: the fused build runs the Requantize within one step of onnxruntime, the unfused
build and ``--disable qlinear_fixed_point`` keep the float form, bit-exact."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import opfuse
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.patterns import find_matches
from opfuse.frontend.onnx import import_model
from opfuse.testing import ort_oracle
from opfuse.rules.qlinear_fixed import (QLINEAR_ADD_FLOAT32, QLINEAR_FIXED_POINT, add_pattern, add_refusal, pattern,
                                        refusal)

F32, I32 = np.float32, np.int32
UINT8, FLOAT = 2, 1
RNG = np.random.default_rng(7)


def requantized(mult=None, lo=0.0, hi=255.0, zero=12.0, acc_type="int32", second_reader=False):
    b = GraphBuilder("g")
    acc = b.input("acc", (1, 2, 3, 3), acc_type)
    f = b.op("Cast", acc, to=FLOAT)
    m = b.const("m", np.array([0.01, 0.02], F32).reshape(1, 2, 1, 1) if mult is None else mult)
    y = b.op("Round", b.op("Mul", f, m))
    y = b.op("Add", y, b.const("zp", F32(zero)))
    y = b.op("Clip", y, b.const("lo", F32(lo)), b.const("hi", F32(hi)))
    q = b.op("Cast", y, to=UINT8)
    return b.build(q, f) if second_reader else b.build(q)


def _refusal(g):
    (m,) = find_matches(g, pattern())
    return refusal(m)


def test_a_float_requantization_matches_and_is_accepted():
    assert _refusal(requantized()) is None


@pytest.mark.parametrize("kwargs, reason", [
    ({"acc_type": "int64"}, "not the float requantization of an int32 accumulator"),
    ({"mult": np.array([0.01, -0.02], F32).reshape(1, 2, 1, 1)}, "the multiplier is not a positive float32 constant"),
    ({"mult": np.full((1, 2, 3, 1), 0.01, F32)}, "the multiplier is neither per tensor nor per channel"),
    ({"zero": 0.5}, "the zero point is not one integer constant"),
    ({"lo": 12.0}, "the clamp is not the output type's range"),  # a Relu's clamp at the zero point
])
def test_refusals_say_why(kwargs, reason):
    assert _refusal(requantized(**kwargs)) == reason


def test_an_intermediate_read_elsewhere_is_no_match():
    assert find_matches(requantized(second_reader=True), pattern()) == []


def _qlinear_conv_model():
    cin, cout = 8, 16
    inits = [helper.make_tensor("xs", TensorProto.FLOAT, [], [0.05]),
             helper.make_tensor("xz", TensorProto.UINT8, [], [128]),
             helper.make_tensor("w", TensorProto.INT8, [cout, cin, 3, 3],
                                RNG.integers(-128, 128, cout * cin * 9).tolist()),
             helper.make_tensor("ws", TensorProto.FLOAT, [cout], RNG.uniform(0.002, 0.02, cout).tolist()),
             helper.make_tensor("wz", TensorProto.INT8, [cout], [0] * cout),
             helper.make_tensor("ys", TensorProto.FLOAT, [], [0.4]),
             helper.make_tensor("yz", TensorProto.UINT8, [], [100]),
             helper.make_tensor("b", TensorProto.INT32, [cout], RNG.integers(-4000, 4000, cout).tolist())]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                            pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, cin, 10, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_fused_qlinear_conv_runs_requantize_within_one_step_and_disable_keeps_it_exact():
    pytest.importorskip("onnxruntime")
    m = _qlinear_conv_model()
    x = {"x": RNG.integers(0, 256, (1, 8, 10, 10)).astype(np.uint8)}
    theirs = ort_oracle.run(m, x)["y"].astype(int)  # its uint8 x int8 products exact on every CPU
    fused = plan_model(m, CompileOptions())
    assert "Requantize" in [n.op_type for n in fused.graph.nodes]
    assert any(d.rule == QLINEAR_FIXED_POINT and d.taken for d in fused.decisions)
    assert np.abs(opfuse.compile(m).run(x)["y"].astype(int) - theirs).max() <= 1
    exact = CompileOptions(disable=(QLINEAR_FIXED_POINT,))
    assert "Requantize" not in [n.op_type for n in plan_model(m, exact).graph.nodes]
    np.testing.assert_array_equal(opfuse.compile(m, disable=[QLINEAR_FIXED_POINT]).run(x)["y"], theirs)
    np.testing.assert_array_equal(opfuse.compile(m, fuse=False).run(x)["y"], theirs)


def _qlinear_add_model(b_shape=(1, 4, 3, 3)):
    def scalar(name, elem, v):
        return helper.make_tensor(name, elem, [], [v])
    inits = [scalar("sa", TensorProto.FLOAT, 0.05), scalar("za", TensorProto.UINT8, 100),
             scalar("sb", TensorProto.FLOAT, 0.03), scalar("zb", TensorProto.UINT8, 7),
             scalar("sc", TensorProto.FLOAT, 0.07), scalar("zc", TensorProto.UINT8, 30)]
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"],
                            domain="com.microsoft")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 4, 3, 3]),
                                        helper.make_tensor_value_info("b", TensorProto.UINT8, list(b_shape))],
                          [helper.make_tensor_value_info("c", TensorProto.UINT8, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def test_qlinear_add_matches_and_a_broadcast_one_is_refused():
    (m,) = find_matches(import_model(_qlinear_add_model()), add_pattern())
    assert add_refusal(m) is None
    (m,) = find_matches(import_model(_qlinear_add_model((1, 4, 1, 1))), add_pattern())
    assert add_refusal(m) == "the operands broadcast (onnxruntime folds the scalar one differently)"
    assert find_matches(requantized(), add_pattern()) == []


def test_fused_qlinear_add_is_float32_within_one_step_and_disable_keeps_float64():
    ort = pytest.importorskip("onnxruntime")
    m = _qlinear_add_model()
    a, b = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 256 * 256
    m.graph.input[1].type.tensor_type.shape.dim[2].dim_value = 256 * 256
    x = {"a": np.repeat(a.reshape(1, 1, -1, 1), 4, 1).repeat(3, 3).astype(np.uint8),
         "b": np.repeat(b.reshape(1, 1, -1, 1), 4, 1).repeat(3, 3).astype(np.uint8)}
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["c"], x)[0]
    fused = plan_model(m, CompileOptions())
    assert any(d.rule == QLINEAR_ADD_FLOAT32 and d.taken for d in fused.decisions)
    assert np.float64 not in {v.dtype for v in fused.graph.values.values()}
    assert np.abs(opfuse.compile(m).run(x)["c"].astype(int) - theirs.astype(int)).max() <= 1
    np.testing.assert_array_equal(opfuse.compile(m, disable=[QLINEAR_ADD_FLOAT32]).run(x)["c"], theirs)
