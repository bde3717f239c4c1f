"""``integer_conv`` / ``integer_matmul`` (``rules/integer_ops.py``) on IR graphs built op by op: what the pattern
matches, each refusal's reason, and the dequantization read back (scale and zero point as the DequantizeLinear had
them). The end-to-end checks (against the oracle, onnxruntime and the C) are in tests/frontend/test_onnx_qdq*.py."""
import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.patterns import find_matches
from opfuse.rules.integer_ops import (conv_pattern, conv_refusal, dequantized, matmul_pattern, matmul_refusal,
                                      quantizes)

F32, I8 = np.float32, np.int8
FLOAT, INT8 = 1, 3  # ONNX element types


def _dq(b, q, scale, zero, name):
    """``(float(q) - zero) * scale`` as the importer writes a DequantizeLinear."""
    x = b.op("Cast", q, to=FLOAT)
    if zero is not None:
        x = b.op("Sub", x, b.const(f"{name}_z", np.asarray(zero, F32)))
    return b.op("Mul", x, b.const(f"{name}_s", np.asarray(scale, F32)))


def _q(b, y, lo=-128, hi=127, zero=-3.0):
    y = b.op("Round", b.op("Div", y, b.const("ys", F32(0.1))))
    y = b.op("Add", y, b.const("yz", F32(zero)))
    y = b.op("Clip", y, b.const("lo", F32(lo)), b.const("hi", F32(hi)))
    return b.op("Cast", y, to=INT8)


def qconv(weight_const=True, x_zero=True, lo=-128, weight_scale=None):
    b = GraphBuilder("g")
    x_q = b.input("x_q", (1, 2, 4, 4), "int8")
    w = np.arange(-4, 4, dtype=I8).reshape(2, 2, 1, 2)[:, :, :, :1]
    w_q = b.const("w_q", w) if weight_const else b.input("w_q", w.shape, "int8")
    ws = weight_scale if weight_scale is not None else np.array([0.01, 0.02], F32).reshape(2, 1, 1, 1)
    c = b.op("Conv", _dq(b, x_q, F32(0.05), F32(-1) if x_zero else None, "x"), _dq(b, w_q, ws, F32(0), "w"))
    return b.build(_q(b, c, lo=lo))


def _refusal(g, pattern, refusal):
    (m,) = find_matches(g, pattern)
    return refusal(m)


def test_a_quantized_conv_matches_and_is_accepted():
    g = qconv()
    assert quantizes(g)
    assert _refusal(g, conv_pattern(), conv_refusal) is None


@pytest.mark.parametrize("kwargs, reason", [
    ({"weight_const": False}, "the weight is not an int8 or uint8 constant"),
    ({"x_zero": False}, "the input is not quantized per tensor with a zero point"),
    ({"lo": -3}, "the output is not quantized per tensor to int8 or uint8 with constant parameters"),  # a clamp
    ({"weight_scale": np.array([0.01, 0.02], F32).reshape(1, 2, 1, 1)},
     "the weight is not quantized per tensor or per output channel"),  # per input channel
])
def test_conv_refusals_say_why(kwargs, reason):
    assert _refusal(qconv(**kwargs), conv_pattern(), conv_refusal) == reason


def test_a_float_conv_input_is_refused():
    b = GraphBuilder("g")
    x = b.input("x", (1, 2, 4, 4))
    g = b.build(_q(b, b.op("Conv", x, b.const("w", np.ones((2, 2, 1, 1), F32)))))
    assert _refusal(g, conv_pattern(), conv_refusal) == "the input is not the output of a DequantizeLinear"


@pytest.mark.parametrize("scale_shape, reason", [
    ((1, 3), None), ((3, 1), "the weight's scale is not per tensor or per output column"),  # per input row
])
def test_a_matmul_weight_per_column_is_accepted_per_row_refused(scale_shape, reason):
    b = GraphBuilder("g")
    x_q = b.input("x_q", (1, 3, 1, 1), "int8")
    a = b.op("Flatten", _dq(b, x_q, F32(0.05), F32(0), "x"), axis=1)
    w = b.const("w_q", np.ones((3, 3), I8))  # square: a scale per row has the length of one per column
    scale = np.full(scale_shape, 0.01, F32)
    g = b.build(_q(b, b.op("MatMul", a, _dq(b, w, scale, None, "w"))))
    assert _refusal(g, matmul_pattern(), matmul_refusal) == reason


def test_the_dequantization_is_read_back_as_the_dequantizelinear_had_it():
    g = qconv()
    conv = next(n for n in g.nodes if n.op_type == "Conv")
    w = dequantized(conv.inputs[1], "the weight")
    assert w.q.name == "w_q" and w.axis == 0 and w.scale.shape == (2,) and w.zero.dtype == I8
    np.testing.assert_array_equal(w.scale, np.array([0.01, 0.02], F32))
    x = dequantized(conv.inputs[0], "the input")
    assert x.axis is None and x.scale.shape == () and int(x.zero) == -1
    assert [n.op_type for n in x.nodes] == ["Cast", "Sub", "Mul"]
    assert dequantized(conv.outputs[0], "the output") == "the output is not the output of a DequantizeLinear"


def test_a_float_graph_does_not_quantize():
    b = GraphBuilder("g")
    x = b.input("x", (1, 2, 4, 4))
    assert not quantizes(b.build(b.op("Relu", x)))
