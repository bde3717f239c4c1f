"""``integer_conv``, ``integer_matmul`` and ``integer_matmul_dequantized`` (``rules/integer_ops.py``) case by case on
IR graphs built op by op, with each rule's pattern made inside the test (mutation testing, tests/MUTATION.md: the
library builds the patterns at import): every refusal of the module docstring with its reason, and each accepted
form rewritten into the integer ops, whose outputs stay within one quantization step of the float QDQ graph (the
oracle: the unfused build runs it) with most of them equal, or within float rounding for the dequantized product.
Compiler-free (the reference executor runs both graphs); the C is checked end to end in tests/frontend/test_onnx_qdq*.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import Provenance
from opfuse.rewrites.engine import run_pattern_rules
from opfuse.rules.integer_ops import (ADDS_A_TENSOR, INTEGER_CONV_DEQUANTIZED_RULE, INTEGER_CONV_RULE,
                                      INTEGER_MATMUL_DEQUANTIZED_RULE, INTEGER_MATMUL_RULE, conv_dequantized_pattern,
                                      conv_pattern, dequantized, matmul_dequantized_pattern, matmul_pattern, quantizes)
from opfuse.rules.options import FusionOptions
from opfuse.runtime.reference import run
from rule_helpers import full_range_feeds

F32, I8, U8, I32 = np.float32, np.int8, np.uint8, np.int32
FLOAT, INT8, UINT8, INT32 = 1, 3, 2, 6  # ONNX element types
RNG_SEED = 7


def rules():
    return [dataclasses.replace(INTEGER_CONV_RULE, pattern=conv_pattern()),
            dataclasses.replace(INTEGER_CONV_DEQUANTIZED_RULE, pattern=conv_dequantized_pattern()),
            dataclasses.replace(INTEGER_MATMUL_RULE, pattern=matmul_pattern()),
            dataclasses.replace(INTEGER_MATMUL_DEQUANTIZED_RULE, pattern=matmul_dequantized_pattern())]


def rewrite(g):
    """The four rules (patterns made now) on a copy of ``g``: (copy, decisions, provenance)."""
    g1 = g.copy()
    rc = RewriteContext(FusionOptions(), Provenance(g1))
    run_pattern_rules(g1, rules(), rc, "recognize_integer")
    g1.verify()
    return g1, rc.decisions, rc.provenance


def refusals(g):
    g1, decisions, _ = rewrite(g)
    assert [n.op_type for n in g1.nodes] == [n.op_type for n in g.nodes]  # nothing rewritten
    return sorted({d.reason for d in decisions})


def ops(g):
    return [n.op_type for n in g.nodes]


# Building the QDQ graph as the importer writes it ------------------------------------------------------------------

def dq(b, q, scale, zero, name, scale_first=False):
    """``(float(q) - zero) * scale``: a DequantizeLinear as imported (no Sub without a zero point); ``scale_first``:
    ``scale * (float(q) - zero)``, the same product."""
    x = b.op("Cast", q, to=FLOAT, name=f"{name}_cast")
    if zero is not None:
        x = b.op("Sub", x, b.const(f"{name}_zp", np.asarray(zero, F32)), name=f"{name}_sub")
    s = b.const(f"{name}_scale", np.asarray(scale, F32))
    return b.op("Mul", *((s, x) if scale_first else (x, s)), name=f"{name}_mul")


def quant(b, y, scale=0.1, zero=-3.0, to=INT8, lo=None, hi=None, zp_add=True, clip=None):
    """``Clip(Round(y / scale) + zero, lo, hi) -> Cast(to)``: a QuantizeLinear as imported."""
    t = {INT8: I8, UINT8: U8}.get(to, I8)
    lo = np.iinfo(t).min if lo is None else lo
    hi = np.iinfo(t).max if hi is None else hi
    s = b.const("y_scale", np.asarray(scale, F32)) if not isinstance(scale, str) else b.input("y_scale", (), "float32")
    y = b.op("Round", b.op("Div", y, s, name="q_div"), name="q_round")
    if zp_add:
        y = b.op("Add", y, b.const("y_zp", np.asarray(zero, F32)), name="q_zp")
    bounds = clip if clip is not None else (b.const("q_lo", F32(lo)), b.const("q_hi", F32(hi)))
    y = b.op("Clip", y, *bounds, name="q_clip")
    return b.op("Cast", y, to=to, name="q_cast")


def conv_graph(*, x_dtype="int8", x_scale=0.05, x_zero=-1.0, w_scale=None, w_zero=0.0, w_dtype=I8, w_const=True,
               bias="ok", residual=None, relu=False, q=None, conv_out=False, w_dq=True, relu_out=False, x_side=False,
               act=None):
    """DQ(x_q) -> Conv(DQ(W_q) per output channel, [DQ(B_q)]) -> [Add(DQ(r_q))] -> [Relu] -> Q -> y_q; ``act``:
    ``Conv -> act -> Q`` instead (an activation the quantizer leaves in float before quantizing), or the Conv's
    float output alone where ``act`` is "float"."""
    b = GraphBuilder("qconv")
    x_q = b.input("x_q", (1, 3, 5, 5), x_dtype)
    w = (np.arange(4 * 3 * 3 * 3).reshape(4, 3, 3, 3) % 11 - 5).astype(w_dtype)
    w_q = b.const("w_q", w) if w_const else b.input("w_q", w.shape, np.dtype(w_dtype).name)
    ws = np.array([0.01, 0.02, 0.015, 0.03], F32).reshape(4, 1, 1, 1) if w_scale is None else w_scale
    x = dq(b, x_q, x_scale, x_zero, "x")
    wv = dq(b, w_q, ws, w_zero, "w") if w_dq else b.const("w_float", w.astype(F32) * ws)
    inputs = [x, wv]
    if bias is not None:
        bq, bs, bz, bdt = np.array([100, -50, 7, 0]), None, 0.0, I32
        if isinstance(bias, dict):
            bq, bs, bz, bdt = bias.get("q", bq), bias.get("scale"), bias.get("zero", bz), bias.get("dtype", bdt)
        bs = (F32(x_scale) * np.reshape(ws, -1).astype(F32)).astype(F32) if bs is None else bs
        if bias == "float":
            inputs.append(b.const("b_float", np.ones(4, F32)))
        else:
            inputs.append(dq(b, b.const("b_q", np.asarray(bq).astype(bdt)), bs, bz, "b"))
    y = b.op("Conv", *inputs, pads=[1, 1, 1, 1], name="conv")
    c = y
    if act == "float":
        return b.build(y)
    if act is not None:
        return b.build(quant(b, b.op(act, y, name="act"), **(q or {})))
    if residual is not None:
        r_scale, r_zero, r_shape, same = residual
        if same:
            y = b.op("Add", y, y, name="res_add")
        else:
            r_q = b.input("r_q", r_shape, "int8")
            r = dq(b, r_q, r_scale, r_zero, "r") if r_scale is not None else b.input("r_float", r_shape)
            y = b.op("Add", y, r, name="res_add")
    if relu:
        y = b.op("Relu", y, name="relu")
    r = y
    out = quant(b, y, **(q or {}))
    side = [b.op("Relu", x, name="x_side")] if x_side else []  # another reader of the dequantized input
    return b.build(out, *([c] if conv_out else []), *([r] if relu_out else []), *side)


def _feeds(g, seed=RNG_SEED):
    return full_range_feeds(g, seed)


def assert_within_one_step(g0, g1, seeds=(RNG_SEED, RNG_SEED + 1)):
    """The integer graph's 8-bit outputs within one step of the float QDQ graph's, at most 1 in 10 off (rounding
    ties of the float path: the module docstring)."""
    for seed in seeds:
        feeds = _feeds(g0, seed)
        want, got = run(g0, feeds), run(g1, feeds)
        assert set(want) == set(got)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            diff = np.abs(got[k].astype(np.int64) - want[k].astype(np.int64))
            assert diff.max() <= 1 and np.mean(diff != 0) <= 0.1, (k, diff.max(), np.mean(diff != 0))


# integer_conv --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, parts", [
    ({}, "DequantizeLinear -> Conv -> QuantizeLinear"),
    ({"bias": None, "relu": True}, "DequantizeLinear -> Conv -> Relu -> QuantizeLinear"),
    ({"x_dtype": "uint8", "x_zero": 128.0, "q": {"to": UINT8, "zero": 120.0}}, "DequantizeLinear -> Conv -> "
                                                                                "QuantizeLinear"),
    ({"w_scale": F32(0.02), "w_zero": None, "relu": True, "residual": (0.04, 2.0, (1, 4, 5, 5), False)},
     "DequantizeLinear -> Conv -> Add(residual) -> Relu -> QuantizeLinear"),
    ({"bias": None, "residual": (0.04, -5.0, (1, 4, 5, 5), False)}, "DequantizeLinear -> Conv -> Add(residual) -> "
                                                                     "QuantizeLinear"),
    ({"w_scale": np.array([0.01, 0.02, 0.015, 0.03], F32).reshape(4, 1, 1, 1), "w_zero": None},
     "DequantizeLinear -> Conv -> QuantizeLinear"),
])
def test_a_quantized_conv_is_one_integer_conv_within_one_step(kwargs, parts):
    g = conv_graph(**kwargs)
    g1, decisions, prov = rewrite(g)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [
        ("integer_conv", "rewritten",
         f"{parts} as one integer conv (int32 accumulator, fixed-point Requantize)")]
    assert "Conv" in ops(g1) and "Requantize" in ops(g1) and "Div" not in ops(g1)
    conv = next(n for n in g1.nodes if n.op_type == "Conv")
    assert conv.outputs[0].dtype == np.int32 and conv.inputs[1].const is not None
    last = g1.outputs[0].producer
    assert last.op_type == "Requantize" and last.name == "conv"  # the integer conv keeps the Conv's name
    assert_within_one_step(g, g1)
    # the new op stands for the match and the input's (and residual's) dequantization it leaves dead
    origin = prov.of("conv")
    assert {"x_cast", "x_mul", "conv", "q_cast"} <= set(origin)
    assert ("r_mul" in origin) == ("residual" in kwargs)
    new = [n.name for n in g1.nodes if n.name not in {m.name for m in g.nodes}]
    assert new and all(name.startswith("conv") for name in new), new  # the integer ops named after the Conv


def test_a_dequantization_read_elsewhere_stays_outside_the_provenance():
    g = conv_graph(x_side=True)
    g1, _, prov = rewrite(g)
    assert "Requantize" in ops(g1) and g1.values["x_mul"].producer is not None
    origin = prov.of("conv")
    assert "conv" in origin and not {"x_cast", "x_sub", "x_mul"} & set(origin)
    assert_within_one_step(g, g1)


@pytest.mark.parametrize("kwargs, reason", [
    ({"x_dtype": "int32"}, "the input is not quantized per tensor with a zero point"),
    ({"x_zero": None}, "the input is not quantized per tensor with a zero point"),
    ({"x_zero": 2.5}, "the input's zero point is not an integer of its int8 range"),  # a Sub, not a zero point
    ({"w_zero": 300.0}, "the weight's zero point is not an integer of its int8 range"),
    ({"x_scale": np.full((1, 3, 1, 1), 0.05, F32), "bias": None},
     "the input is not quantized per tensor with a zero point"),
    ({"w_const": False}, "the weight is not an int8 or uint8 constant"),
    ({"w_dtype": I32}, "the weight is not an int8 or uint8 constant"),
    ({"w_dq": False}, "the weight is not the output of a DequantizeLinear"),
    ({"w_scale": np.full((1, 3, 1, 1), 0.01, F32), "bias": None},
     "the weight is not quantized per tensor or per output channel"),
    ({"w_scale": F32(0.02), "w_zero": np.zeros((1, 3, 1, 1), F32)},
     "the weight is not quantized per tensor or per output channel"),
    ({"w_scale": np.full((4, 1, 1, 1), 0.02, F32), "w_zero": np.zeros((1, 3, 1, 1), F32)},
     "the weight is dequantized in blocks"),
    ({"bias": "float"}, "the bias is not the output of a DequantizeLinear"),
    ({"bias": {"dtype": I8}}, "the bias is not an int32 constant of one value per output channel"),
    ({"bias": {"q": np.array([1])}},  # one value broadcast by a scale per channel
     "the bias is not an int32 constant of one value per output channel"),
    ({"bias": {"zero": 3.0}}, "the bias has a non-zero zero point"),
    ({"bias": {"scale": np.full(4, 1e-3, F32)}}, "the bias scale is not input scale x weight scale"),
    ({"residual": (0.04, 2.0, (1, 4, 5, 5), True)}, "the residual is not the output of a DequantizeLinear"),
    ({"residual": (None, None, (1, 4, 5, 5), False)}, "the residual is not the output of a DequantizeLinear"),
    ({"residual": (0.04, None, (1, 4, 5, 5), False)},
     "the residual is not quantized per tensor to int8 or uint8 with a zero point"),
    ({"residual": (np.full((1, 4, 1, 1), 0.04, F32), 2.0, (1, 4, 5, 5), False)},
     "the residual is not quantized per tensor to int8 or uint8 with a zero point"),
    ({"residual": (0.04, 2.0, (1, 1, 5, 5), False)}, "the residual's shape is not known to be the Conv's output shape"),
    ({"conv_out": True},
     "the Conv's output is not quantized by its only reader (through a residual Add and a Relu at most)"),
    ({"relu": True, "relu_out": True},
     "the Conv's output is not quantized by its only reader (through a residual Add and a Relu at most)"),
    ({"residual": (0.04, 2.0, (1, 4, 5, 5), False), "relu_out": True},  # the residual Add's output read elsewhere
     "the Conv's output is not quantized by its only reader (through a residual Add and a Relu at most)"),
])
def test_conv_refusals_say_why(kwargs, reason):
    res = kwargs.get("residual")
    if res is not None and (res[3] or res[0] is None):
        # an Add of a float tensor after the Conv: integer_conv refuses it, and the Conv, read by no quantization
        # now, is integer_conv_dequantized's (the Add and the quantization stay in float)
        _, decisions, _ = rewrite(conv_graph(**kwargs))
        assert [(d.rule, d.verdict) for d in decisions] == [("integer_conv", "refused"),
                                                            ("integer_conv_dequantized", "rewritten")]
        assert decisions[0].reason == reason
        return
    assert refusals(conv_graph(**kwargs)) == [reason]


BAD_Q = "the output is not quantized per tensor to int8 or uint8 with constant parameters"


@pytest.mark.parametrize("q", [
    {"lo": -127}, {"hi": 100}, {"to": UINT8, "lo": -128, "hi": 127}, {"scale": np.full((1, 4, 1, 1), 0.1, F32)},
    {"scale": "input"}, {"zp_add": False},
])
def test_a_quantization_not_per_tensor_to_8_bits_is_refused(q):
    assert refusals(conv_graph(q=q)) == [BAD_Q]


def _requantized_conv(b: GraphBuilder):
    """A QDQ 1x1 Conv's float output divided by its scale, rounded and shifted by its zero point: what a Clip
    and a Cast to int8 then quantize."""
    x = b.input("x_q", (1, 3, 5, 5), "int8")
    w = b.const("w_q", np.ones((4, 3, 1, 1), I8))
    y = b.op("Conv", dq(b, x, 0.05, 1.0, "x"), dq(b, w, 0.01, 0.0, "w"), name="conv")
    y = b.op("Add", b.op("Round", b.op("Div", y, b.const("ys", F32(0.1)))), b.const("yz", F32(0)))
    return y


def test_a_clip_with_one_bound_or_a_runtime_zero_point_is_refused():
    b = GraphBuilder("one_bound")
    y = _requantized_conv(b)
    g = b.build(b.op("Cast", b.op("Clip", y, b.const("lo", F32(-128))), to=INT8))  # Clip(y, lo): no upper bound
    assert refusals(g) == [BAD_Q]
    b = GraphBuilder("runtime_zp")
    x = b.input("x_q", (1, 3, 5, 5), "int8")
    w = b.const("w_q", np.ones((4, 3, 1, 1), I8))
    y = b.op("Conv", dq(b, x, 0.05, 1.0, "x"), dq(b, w, 0.01, 0.0, "w"), name="conv")
    y = b.op("Add", b.op("Round", b.op("Div", y, b.const("ys", F32(0.1)))), b.input("yz", (), "float32"))
    g = b.build(b.op("Cast", b.op("Clip", y, b.const("lo", F32(-128)), b.const("hi", F32(127))), to=INT8))
    assert refusals(g) == [BAD_Q]


def test_a_bias_scale_within_float32_rounding_is_accepted_one_beyond_refused():
    xs, ws = F32(0.05), np.array([0.01, 0.02, 0.015, 0.03], F32)
    exact64 = (np.float64(xs) * ws.astype(np.float64)).astype(F32)  # the product rounded once, in float64
    g = conv_graph(bias={"scale": exact64})
    assert ops(rewrite(g)[0]).count("Requantize") == 1
    for rel in (3e-6, 2e-4):  # above BIAS_SCALE_RTOL (1e-6), below NumPy's default rtol / atol
        off = ((xs * ws).astype(np.float64) * (1 + rel)).astype(F32)
        assert refusals(conv_graph(bias={"scale": off})) == ["the bias scale is not input scale x weight scale"]



# integer_conv_dequantized --------------------------------------------------------------------------------------

DEQUANTIZED_CONV = "as an integer conv (int32 accumulator) dequantized to float"


@pytest.mark.parametrize("kwargs, parts", [
    ({"act": "Sigmoid"}, "DequantizeLinear -> Conv -> (int32 bias)"),
    ({"act": "HardSwish", "x_dtype": "uint8", "x_zero": 128.0}, "DequantizeLinear -> Conv -> (int32 bias)"),
    ({"act": "float", "bias": None, "w_scale": F32(0.02)}, "DequantizeLinear -> Conv"),
    ({"act": "Tanh", "w_zero": np.array([1, -2, 0, 3], F32).reshape(4, 1, 1, 1)},
     "DequantizeLinear -> Conv -> (int32 bias)"),
])
def test_a_conv_left_in_float_is_an_integer_conv_dequantized(kwargs, parts):
    """A Conv whose output an activation reads (or nothing: a graph output) before any quantization: ConvInteger, the
    int32 bias, a Cast and one multiply by x_scale * w_scale per channel, equal to the float conv within float
    rounding (the float path sums float32 products; the integer one is exact and rounds once), its 8-bit output
    within one step."""
    g = conv_graph(**kwargs)
    g1, decisions, prov = rewrite(g)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [
        ("integer_conv_dequantized", "rewritten", f"{parts} {DEQUANTIZED_CONV}")]
    assert [n.outputs[0].dtype for n in g1.nodes if n.op_type == "Conv"] == [np.int32]
    conv_out = g1.values["conv"]
    assert conv_out.producer.op_type == "Mul" and conv_out.dtype == F32
    for seed in (1, 2):
        feeds = _feeds(g, seed)
        np.testing.assert_allclose(run(g1, feeds)["conv"] if kwargs.get("act") == "float" else
                                   _values(g1, feeds, "conv"), _values(g, feeds, "conv"), rtol=1e-5, atol=1e-6)
    if kwargs.get("act") != "float":
        assert_within_one_step(g, g1)
    assert {"conv", "x_cast", "x_mul"} <= set(prov.of(conv_out.producer.name))


def _values(g, feeds, name):
    """The value ``name`` of ``g`` on ``feeds`` (made an output of a copy)."""
    g2 = g.copy()
    g2.outputs = [*g2.outputs, g2.values[name]]
    return run(g2, feeds)[name]


@pytest.mark.parametrize("kwargs, reason", [
    ({"act": "Sigmoid", "bias": "float"}, "the bias is not the output of a DequantizeLinear"),
    ({"act": "Sigmoid", "w_const": False}, "the weight is not an int8 or uint8 constant"),
    ({"act": "Sigmoid", "x_zero": None}, "the input is not quantized per tensor with a zero point"),
    ({"act": "Sigmoid", "bias": {"scale": np.full(4, 1e-3, F32)}}, "the bias scale is not input scale x weight scale"),
])
def test_a_conv_left_in_float_that_cannot_be_integer_says_why(kwargs, reason):
    assert [r for r in refusals(conv_graph(**kwargs))] == [reason]


def test_a_quantized_conv_is_integer_convs_and_a_float_conv_of_float_weights_no_ones():
    """A Conv quantized after it (through a Relu) is integer_conv's alone; one of float weights is no candidate (no
    refusal logged); a Conv both quantized and a graph output is integer_conv's refusal alone."""
    g1, decisions, _ = rewrite(conv_graph(relu=True))
    assert [d.rule for d in decisions] == ["integer_conv"]
    assert refusals(conv_graph(act="Sigmoid", w_dq=False)) == []
    assert refusals(conv_graph(conv_out=True)) == [
        "the Conv's output is not quantized by its only reader (through a residual Add and a Relu at most)"]

# integer_matmul ------------------------------------------------------------------------------------------------

def mm_graph(*, op="MatMul", a_shape=(2, 6), flatten=None, w_shape=(6, 5), trans_b=0, w_scale=0.02, w_zero=0.0,
             w_dtype=I8, bias="none", relu=False, q=True, attrs=None, x_zero=2.0, x_dtype="int8", out_mm=False,
             relu_out=False, float_input=False, residual=None, residual_first=False, residual_out=False,
             scale_first=False):
    """DQ(a_q) -> [Flatten/Reshape] -> MatMul/Gemm(DQ(W_q)) -> [Add(DQ(B_q))] -> [Add(DQ(r_q))] -> [Relu] -> [Q];
    ``residual``: ``(scale, zero, shape, dtype)`` of the 8-bit residual, added after the bias Add (before it with
    ``residual_first``)."""
    b = GraphBuilder("qmm")
    a_q = b.input("a_q", a_shape, "float32" if float_input else x_dtype)
    a = a_q if float_input else dq(b, a_q, 0.05, x_zero, "x", scale_first)
    if flatten == "Flatten":
        a = b.op("Flatten", a, axis=1, name="flat")
    elif flatten == "Reshape":
        a = b.op("Reshape", a, b.const("flat_shape", np.array([a_shape[0], -1], np.int64)), name="flat")
    elif flatten == "Reshape3d":
        a = b.op("Reshape", a, b.const("flat_shape", np.array([1, a_shape[0], -1], np.int64)), name="flat")
    w = (np.arange(np.prod(w_shape)).reshape(w_shape) % 13 - 6).astype(w_dtype)
    wv = dq(b, b.const("w_q", w), w_scale, w_zero, "w", scale_first)
    n = w_shape[0] if trans_b else w_shape[-1]
    bq = (np.arange(n) * 37 - 50).astype(I32)
    bs = (F32(0.05) * np.asarray(w_scale, F32).reshape(-1)).astype(F32)
    bias_v = dq(b, b.const("b_q", bq if bias != "wide" else bq.reshape(1, n)), bs, None, "b") \
        if bias != "none" else None
    if op == "Gemm":
        ins = [a, wv] + ([bias_v] if bias in ("gemm", "both") else [])
        y = b.op("Gemm", *ins, transB=trans_b, name="mm", **(attrs or {}))
    else:
        y = b.op("MatMul", a, wv, name="mm")
    mm = y
    res_v = None
    if residual is not None:
        r_scale, r_zero, r_shape, r_dtype = residual
        res_v = dq(b, b.input("res_q", r_shape, r_dtype), r_scale, r_zero, "res")
    if res_v is not None and residual_first:
        y = b.op("Add", y, res_v, name="residual_add")
    if bias in ("add", "wide", "both"):
        y = b.op("Add", y, bias_v, name="bias_add")
    elif bias == "float_add":  # a float bias, not behind a DequantizeLinear
        y = b.op("Add", y, b.const("b_float", np.ones(n, F32)), name="bias_add")
    elif bias == "residual":  # an 8-bit tensor of the product's shape, dequantized
        y = b.op("Add", y, dq(b, b.input("r_q", y.shape, "int8"), 0.1, 3.0, "r"), name="bias_add")
    if res_v is not None and not residual_first:
        y = b.op("Add", res_v, y, name="residual_add")
    added = y
    if relu:
        y = b.op("Relu", y, name="relu")
    r = y
    out = quant(b, y) if q else y
    return b.build(out, *([mm] if out_mm else []), *([r] if relu_out else []), *([added] if residual_out else []))


@pytest.mark.parametrize("kwargs, parts", [
    ({}, "DequantizeLinear -> MatMul -> QuantizeLinear"),
    ({"op": "Gemm", "bias": "gemm", "relu": True}, "DequantizeLinear -> Gemm -> Add(bias) -> Relu -> QuantizeLinear"),
    ({"op": "Gemm", "w_shape": (5, 6), "trans_b": 1, "bias": "gemm",
      "w_scale": np.linspace(0.01, 0.03, 5).astype(F32).reshape(5, 1)},
     "DequantizeLinear -> Gemm -> Add(bias) -> QuantizeLinear"),
    ({"bias": "add", "w_scale": np.linspace(0.01, 0.03, 5).astype(F32).reshape(1, 5)},
     "DequantizeLinear -> MatMul -> Add(bias) -> QuantizeLinear"),
    ({"bias": "wide", "w_zero": None}, "DequantizeLinear -> MatMul -> Add(bias) -> QuantizeLinear"),
    ({"a_shape": (2, 3, 1, 2), "flatten": "Flatten", "op": "Gemm"},
     "DequantizeLinear -> Flatten -> Gemm -> QuantizeLinear"),
    ({"a_shape": (2, 3, 2), "flatten": "Reshape", "x_dtype": "uint8", "x_zero": 128.0},
     "DequantizeLinear -> Reshape -> MatMul -> QuantizeLinear"),
])
def test_a_quantized_product_is_one_integer_matmul_within_one_step(kwargs, parts):
    g = mm_graph(**kwargs)
    g1, decisions, prov = rewrite(g)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [
        ("integer_matmul", "rewritten", f"{parts} as one integer matmul (int32 accumulator, fixed-point Requantize)")]
    assert all(n.outputs[0].dtype == np.int32 for n in g1.nodes if n.op_type in ("MatMul", "Gemm"))
    assert "Requantize" in ops(g1)
    assert g1.outputs[0].producer.name == "mm"
    assert_within_one_step(g, g1)
    origin = prov.of("mm")
    assert {"x_cast", "x_mul", "mm", "q_cast"} <= set(origin)
    assert ("flat" in origin) == ("flatten" in kwargs)


@pytest.mark.parametrize("rows", [(2, 3), (1, 4)])
def test_a_batch_of_matrices_is_one_integer_matmul_of_its_rows(rows):
    g = mm_graph(a_shape=(*rows, 6), relu=True, bias="add")
    g1, decisions, _ = rewrite(g)
    assert [d.reason for d in decisions] == [
        "DequantizeLinear -> MatMul -> Add(bias) -> Relu -> QuantizeLinear as one integer matmul (int32 accumulator, "
        "fixed-point Requantize), its 3-D input's rows flattened into one matrix"]
    reshapes = [n for n in g1.nodes if n.op_type == "Reshape"]
    assert [tuple(n.outputs[0].shape) for n in reshapes] == [(rows[0] * rows[1], 6), (*rows, 5)]
    assert g1.outputs[0].shape == (*rows, 5) and g1.outputs[0].dtype == I8
    assert_within_one_step(g, g1)


MM_READER = "the product is not quantized by its only reader (through a bias Add, a residual Add and a Relu at most)"


@pytest.mark.parametrize("kwargs, reason", [
    ({"op": "Gemm", "attrs": {"transA": 1}, "a_shape": (6, 2)}, "a Gemm with transA or alpha, beta other than 1"),
    ({"op": "Gemm", "attrs": {"alpha": 0.5}}, "a Gemm with transA or alpha, beta other than 1"),
    ({"op": "Gemm", "attrs": {"beta": 2.0}, "bias": "gemm"}, "a Gemm with transA or alpha, beta other than 1"),
    ({"x_zero": None}, "the input is not quantized per tensor with a zero point"),
    ({"x_zero": 2.5}, "the input's zero point is not an integer of its int8 range"),  # a Sub, not a zero point
    ({"w_zero": 300.0}, "the weight's zero point is not an integer of its int8 range"),
    ({"x_dtype": "int32"}, "the input is not quantized per tensor with a zero point"),
    ({"a_shape": (6,), "w_shape": (6, 5)}, "the input is not known to be a matrix"),
    ({"a_shape": (2, 3, 2), "flatten": "Reshape3d"}, "the input is not known to be a matrix"),

    ({"w_dtype": I32}, "the weight is not an int8 or uint8 constant matrix"),
    ({"w_scale": np.linspace(0.01, 0.03, 6).astype(F32).reshape(6, 1)},
     "the weight's scale is not per tensor or per output column"),
    ({"w_zero": np.zeros((6, 1), F32)}, "the weight's zero point is not per tensor or per output column"),
    ({"op": "Gemm", "w_shape": (5, 6), "trans_b": 1, "w_scale": np.full((1, 6), 0.02, F32)},
     "the weight's scale is not per tensor or per output column"),
    ({"out_mm": True}, MM_READER),
    ({"relu": True, "relu_out": True}, MM_READER),
    ({"a_shape": (2, 3, 1, 2), "flatten": "Flatten", "float_input": True},
     "the input is not the output of a DequantizeLinear"),
    ({"op": "Gemm", "bias": "gemm", "relu": True, "attrs": {}, "out_mm": False, "q": True, "w_zero": 1.0}, None),
])
def test_matmul_refusals_say_why(kwargs, reason):
    g = mm_graph(**kwargs)
    if reason is None:  # a weight zero point other than 0 is an integer matmul too
        assert "Requantize" in ops(rewrite(g)[0])
        return
    assert reason in refusals(g)


# integer_matmul_dequantized ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, parts", [
    ({"q": False}, "DequantizeLinear -> MatMul"),
    ({"q": False, "op": "Gemm", "bias": "gemm"}, "DequantizeLinear -> Gemm -> Add(bias)"),
    ({"q": False, "bias": "add", "w_scale": np.linspace(0.01, 0.03, 5).astype(F32).reshape(1, 5)},
     "DequantizeLinear -> MatMul -> Add(bias)"),
    ({"q": False, "a_shape": (2, 3, 1, 2), "flatten": "Flatten", "op": "Gemm"}, "DequantizeLinear -> Flatten -> Gemm"),
])
def test_a_product_left_in_float_is_an_integer_matmul_dequantized(kwargs, parts):
    g = mm_graph(**kwargs)
    g1, decisions, prov = rewrite(g)
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [
        ("integer_matmul_dequantized", "rewritten", f"{parts} as an integer matmul (int32 accumulator) dequantized to "
                                                    f"float")]
    assert [n.outputs[0].dtype for n in g1.nodes if n.op_type in ("MatMul", "Gemm")] == [np.int32]
    out = g1.outputs[0]
    assert out.producer.op_type == "Mul" and out.dtype == F32
    for seed in (1, 2):
        feeds = _feeds(g, seed)
        np.testing.assert_allclose(run(g1, feeds)[out.name], run(g, feeds)[out.name], rtol=1e-5, atol=1e-6)
    origin = prov.of(out.producer.name)  # the dequantizing Mul stands for the match and the dead input chain
    assert {"mm", "x_cast", "x_mul"} <= set(origin) and ("flat" in origin) == ("flatten" in kwargs)


def test_a_batch_of_matrices_left_in_float_is_dequantized_in_its_shape():
    g = mm_graph(q=False, a_shape=(2, 3, 6))
    g1, decisions, _ = rewrite(g)
    assert decisions[0].reason.endswith(", its 3-D input's rows flattened into one matrix")
    assert g1.outputs[0].shape == (2, 3, 5) and g1.outputs[0].producer.op_type == "Reshape"
    feeds = _feeds(g)
    np.testing.assert_allclose(run(g1, feeds)["mm"], run(g, feeds)["mm"], rtol=1e-5, atol=1e-6)


def test_a_dequantized_product_read_besides_its_bias_add_keeps_the_add():
    """Refused with its bias Add; the product alone (a graph output too) is then the dequantized integer matmul."""
    g = mm_graph(q=False, bias="add", out_mm=True)
    g1, decisions, _ = rewrite(g)
    assert [(d.verdict, d.reason) for d in decisions] == [
        ("refused", "the product is read besides its bias Add"),
        ("rewritten", "DequantizeLinear -> MatMul as an integer matmul (int32 accumulator) dequantized to float")]
    assert g1.values["bias_add"].producer.op_type == "Add"
    feeds = _feeds(g)
    want, got = run(g, feeds), run(g1, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_a_product_quantized_through_a_relu_is_integer_matmuls_not_refused_here():
    g = mm_graph(relu=True, out_mm=False)
    g1, decisions, _ = rewrite(g)
    assert [d.rule for d in decisions] == ["integer_matmul"]


# Reading a dequantization back, and what quantizes ------------------------------------------------------------

def _dq_value(scale, zero, q_shape=(4, 3), q_dtype="int8", scale_dtype=F32):
    b = GraphBuilder("g")
    q = b.input("q", q_shape, q_dtype)
    x = b.op("Cast", q, to=FLOAT)
    if zero is not None:
        x = b.op("Sub", x, b.const("z", np.asarray(zero, F32)))
    y = b.op("Mul", x, b.const("s", np.asarray(scale, scale_dtype)))
    g = b.build(y)
    return dequantized(g.outputs[0], "it")


@pytest.mark.parametrize("scale, zero, reason", [
    (np.full((4, 3), 0.1, F32), None, "it is dequantized in blocks"),
    (np.full((4, 1), 0.1, F32), np.zeros((1, 3), F32), "it is dequantized in blocks"),
    (np.full((1, 1, 3), 0.1, F32), None, "it is dequantized in blocks"),  # a vector of another rank
])
def test_a_dequantization_in_blocks_is_not_read_back(scale, zero, reason):
    assert _dq_value(scale, zero) == reason


def test_a_dequantization_read_back_along_the_axis_of_either_parameter():
    d = _dq_value(np.full((1, 3), 0.1, F32), np.zeros((1, 3), F32))
    assert d.axis == 1 and d.scale.shape == (3,) and d.zero.shape == (3,) and d.zero.dtype == I8
    d = _dq_value(F32(0.1), np.array([[1], [2], [3], [4]], F32))
    assert d.axis == 0 and d.scale.shape == () and list(d.zero) == [1, 2, 3, 4]
    d = _dq_value(np.full((1, 1), 0.25, F32), None, q_dtype="uint8")
    assert d.axis is None and d.zero is None and d.scale.shape == (1, 1) and [n.op_type for n in d.nodes] == [
        "Cast", "Mul"]


def test_a_runtime_scale_or_zero_point_is_not_a_dequantization():
    b = GraphBuilder("g")
    q = b.input("q", (4, 3), "int8")
    x = b.op("Sub", b.op("Cast", q, to=FLOAT), b.input("z", (), "float32"))
    g = b.build(b.op("Mul", x, b.const("s", F32(0.1))))
    assert dequantized(g.outputs[0], "it") == "it's scale or zero point is not a constant"
    b = GraphBuilder("g")
    q = b.input("q", (4, 3), "int8")
    g = b.build(b.op("Mul", b.op("Cast", q, to=FLOAT), b.input("s", (), "float32")))
    assert dequantized(g.outputs[0], "it") == "it's scale or zero point is not a constant"


@pytest.mark.parametrize("q_dtype, to, scale_dtype", [("int16", FLOAT, F32), ("int8", 11, np.float64),
                                                      ("float32", FLOAT, F32)])
def test_a_cast_of_another_type_is_not_a_dequantization(q_dtype, to, scale_dtype):
    b = GraphBuilder("g")
    q = b.input("q", (4, 3), q_dtype)
    g = b.build(b.op("Mul", b.op("Cast", q, to=to), b.const("s", np.asarray(0.1, scale_dtype))))
    assert dequantized(g.outputs[0], "it") == "it is not the output of a DequantizeLinear"


def test_an_int32_source_is_a_dequantization():
    d = _dq_value(F32(0.5), None, q_dtype="int32")
    assert d.q.dtype == np.int32 and d.zero is None


@pytest.mark.parametrize("src, to, want", [("float32", INT8, True), ("float32", UINT8, True), ("int32", INT8, False),
                                           ("float32", INT32, False)])
def test_only_a_cast_from_a_float_to_8_bits_quantizes(src, to, want):
    b = GraphBuilder("g")
    x = b.input("x", (2, 2), src)
    assert quantizes(b.build(b.op("Cast", x, to=to))) is want


GEMM_TWO_BIASES = "a Gemm with a bias and a bias Add after it"


def test_a_gemm_bias_and_a_bias_add_are_refused_for_the_add():
    """A Gemm with its own bias then a bias Add: the whole match refused for the two biases."""
    assert refusals(mm_graph(op="Gemm", bias="both")) == [GEMM_TWO_BIASES]
    g, decisions, _ = rewrite(mm_graph(op="Gemm", bias="both"))
    assert [(d.rule, d.reason, len(d.nodes)) for d in decisions][0] == ("integer_matmul", GEMM_TWO_BIASES, 7)


def test_a_dequantization_with_its_scale_first_is_one_too():
    """``scale * (float(q) - zero)`` is the same product as the importer's ``(float(q) - zero) * scale``: the input's
    and the weight's are read as dequantizations (``frontend.dequantized``) and the product rewritten."""
    g = mm_graph(bias="add", scale_first=True)
    g1, decisions, _ = rewrite(g)
    assert [(d.rule, d.verdict) for d in decisions] == [("integer_matmul", "rewritten")]
    assert_within_one_step(g, g1)


R8 = (0.1, 3.0, (2, 5), "int8")  # a residual of mm_graph's (2, 5) product


@pytest.mark.parametrize("kwargs, parts", [
    ({"bias": "residual"}, "DequantizeLinear -> MatMul -> Add(residual) -> QuantizeLinear"),
    ({"op": "Gemm", "bias": "residual", "relu": True},
     "DequantizeLinear -> Gemm -> Add(residual) -> Relu -> QuantizeLinear"),
    ({"op": "Gemm", "bias": "gemm", "residual": R8, "relu": True},
     "DequantizeLinear -> Gemm -> Add(bias) -> Add(residual) -> Relu -> QuantizeLinear"),
    ({"bias": "add", "residual": (0.03, 130.0, (2, 5), "uint8"),
      "w_scale": np.linspace(0.01, 0.03, 5).astype(F32).reshape(1, 5)},
     "DequantizeLinear -> MatMul -> Add(bias) -> Add(residual) -> QuantizeLinear"),
    ({"bias": "add", "residual": R8, "residual_first": True},  # the residual's Add first: the same integer op
     "DequantizeLinear -> MatMul -> Add(bias) -> Add(residual) -> QuantizeLinear"),
    ({"a_shape": (2, 3, 6), "bias": "wide", "residual": (0.1, 3.0, (2, 3, 5), "int8")},
     "DequantizeLinear -> MatMul -> Add(bias) -> Add(residual) -> QuantizeLinear"),
])
def test_a_residual_after_a_product_is_the_integer_matmuls_second_term(kwargs, parts):
    """An Add of a dequantized 8-bit tensor of the product's shape after it (a transformer's residual), before or
    after the bias Add, is the Requantize's second term, as the integer conv's: one integer matmul, the residual's
    dequantization absorbed, within one step of the float graph; a batch of matrices flattens the residual's rows
    too."""
    g = mm_graph(**kwargs)
    g1, decisions, prov = rewrite(g)
    rows = ", its 3-D input's rows flattened into one matrix" if len(kwargs.get("a_shape", (2, 6))) == 3 else ""
    assert [(d.rule, d.verdict, d.reason) for d in decisions] == [
        ("integer_matmul", "rewritten",
         f"{parts} as one integer matmul (int32 accumulator, fixed-point Requantize){rows}")]
    req = next(n for n in g1.nodes if n.op_type == "Requantize")
    assert len(req.inputs) == 5  # acc, multiplier, shift, the centred residual and its multiplier
    assert_within_one_step(g, g1)


@pytest.mark.parametrize("kwargs, reason", [
    ({"residual": (np.full((1, 5), 0.1, F32), 3.0, (2, 5), "int8")},
     "the residual is not quantized per tensor to int8 or uint8 with a zero point"),
    ({"residual": (0.1, None, (2, 5), "int8")},
     "the residual is not quantized per tensor to int8 or uint8 with a zero point"),
    ({"residual": (0.1, 3.0, (1, 5), "int8")}, "the residual's shape is not known to be the product's output shape"),
    ({"bias": "residual", "residual": R8}, "two residual Adds after the product"),
    ({"bias": "add", "residual": R8, "residual_out": True}, MM_READER),  # the residual Add's output read elsewhere
])
def test_a_residual_the_integer_matmul_cannot_take_is_refused_with_its_reason(kwargs, reason):
    assert refusals(mm_graph(**kwargs)) == [reason]


def test_a_product_left_in_float_takes_no_residual():
    """Without a quantization after it there is no Requantize to add a residual in: ``integer_matmul_dequantized``
    refuses the product with the Add of a dequantized 8-bit tensor, with that reason, and takes the product alone
    (the residual then added in float)."""
    g = mm_graph(bias="residual", q=False)
    g1, decisions, _ = rewrite(g)
    assert [(d.rule, d.verdict, d.reason, d.nodes) for d in decisions] == [
        ("integer_matmul_dequantized", "refused", ADDS_A_TENSOR, ("mm", "bias_add")),
        ("integer_matmul_dequantized", "rewritten", "DequantizeLinear -> MatMul as an integer matmul (int32 "
                                                    "accumulator) dequantized to float", ("mm",))]
    assert g1.outputs[0].producer.op_type == "Add"
    feeds = _feeds(g, RNG_SEED)
    want, got = run(g, feeds), run(g1, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_a_float_bias_add_is_not_the_integer_matmuls():
    """The Add's other operand is no dequantization: refused with the Add; the product alone is then read by it."""
    g, decisions, _ = rewrite(mm_graph(bias="float_add"))
    assert [(d.rule, d.verdict, d.reason, len(d.nodes)) for d in decisions] == [
        ("integer_matmul", "refused", MM_READER, 7)]


def test_a_batch_of_matrices_takes_a_bias_of_one_row():
    g = mm_graph(a_shape=(2, 3, 6), bias="wide")  # bias (1, 5) on a (2, 3, 5) product
    g1, decisions, _ = rewrite(g)
    assert [d.verdict for d in decisions] == ["rewritten"]
    assert_within_one_step(g, g1)


def test_a_clip_without_its_lower_bound_is_refused():
    b = GraphBuilder("no_lo")
    y = _requantized_conv(b)
    g = b.build(b.op("Cast", b.op("Clip", y, None, b.const("hi", F32(127))), to=INT8))
    assert refusals(g) == [BAD_Q]


def test_a_conv_reading_a_split_of_a_dequantized_tensor_is_an_integer_conv():
    """``DQ(x_q) -> Split -> Conv -> Q`` (a YOLO block's branch): ``recognize_integer`` moves the Split before the
    dequantization first (``dequantize_late``), so the Conv reads a dequantized 8-bit tensor when the integer rules
    look, and both halves' convolutions are integer; within one step of the float QDQ graph."""
    from opfuse.rewrites import recognize_integer

    b = GraphBuilder("qsplit")
    x_q = b.input("x_q", (1, 6, 5, 5), "int8")
    halves = b.op("Split", dq(b, x_q, 0.05, -1.0, "x"), num_outputs=2, axis=1, split=[3, 3], name="split")
    outs = []
    for i, half in enumerate(halves):
        w = (np.arange(4 * 3 * 3 * 3).reshape(4, 3, 3, 3) % (7 + i) - 3).astype(I8)
        wv = dq(b, b.const(f"w{i}_q", w), np.full((4, 1, 1, 1), 0.02, F32), 0.0, f"w{i}")
        y = b.op("Conv", half, wv, pads=[1, 1, 1, 1], name=f"conv{i}")
        r = b.op("Round", b.op("Div", y, b.const(f"ys{i}", F32(0.1)), name=f"q{i}_div"), name=f"q{i}_round")
        r = b.op("Add", r, b.const(f"yz{i}", F32(2.0)), name=f"q{i}_zp")
        outs.append(b.op("Cast", b.op("Clip", r, b.const(f"lo{i}", F32(-128)), b.const(f"hi{i}", F32(127)),
                                      name=f"q{i}_clip"), to=INT8, name=f"q{i}_cast"))
    g = b.build(*outs)
    g1 = g.copy()
    rc = RewriteContext(FusionOptions(), Provenance(g1))
    recognize_integer(g1, rc)
    g1.verify()
    assert [d.rule for d in rc.decisions if d.verdict == "rewritten"].count("integer_conv") == 2, \
        [(d.rule, d.verdict, d.reason) for d in rc.decisions]
    assert [n.outputs[0].dtype for n in g1.nodes if n.op_type == "Conv"] == [np.int32, np.int32]
    split = next(n for n in g1.nodes if n.op_type == "Split")
    assert split.inputs[0].dtype == np.int8  # the 8-bit tensor is what the Split moves
    assert_within_one_step(g, g1)
