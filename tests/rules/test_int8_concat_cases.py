"""``int8_concat`` (``rules/qconcat.py``) case by case on IR graphs built op by op, its pattern made inside the tests
(mutation testing, tests/MUTATION.md: the library builds it at import): the accepted forms rewritten into a Concat
of the 8-bit tensors, exactly the QDQ graph's values (the module docstring's round trip), and every refusal with its
reason. Compiler-free; the C (the Concat elided in place) is checked in test_int8_concat.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.rules import apply_rules
from opfuse.rules.qconcat import INT8_CONCAT, int8_concat_pattern
from opfuse.runtime.reference import run
from rule_helpers import full_range_feeds

F32 = np.float32
FLOAT, INT8, UINT8 = 1, 3, 2  # ONNX element types
SHAPE = (1, 2, 3, 3)


def dq(b, q, scale, zero, name, scale_first=False, zp_input=False):
    x = b.op("Cast", q, to=FLOAT, name=f"{name}_cast")
    if zero is not None:
        z = b.input(f"{name}_zp", (), "float32") if zp_input else b.const(f"{name}_zp", np.asarray(zero, F32))
        x = b.op("Sub", x, z, name=f"{name}_sub")
    s = b.const(f"{name}_scale", np.asarray(scale, F32))
    return b.op("Mul", *((s, x) if scale_first else (x, s)), name=f"{name}_mul")


def concat_graph(*, dtype="int8", to=INT8, scales=(0.02, 0.02), zeros=(-3.0, -3.0), y_scale=0.02, y_zero=-3.0,
                 lo=None, hi=None, axis=1, zp_add=True, zp_first=False, scale_first=False, third=None, side=False,
                 input_dtypes=None, zp_input=False):
    b = GraphBuilder("qcat")
    ins = []
    for i, name in enumerate(("a", "b")):
        q = b.input(f"{name}_q", SHAPE, (input_dtypes or (dtype, dtype))[i])
        ins.append(dq(b, q, scales[i], zeros[i], name, scale_first=scale_first and i == 1,
                      zp_input=zp_input and i == 1))
    if third == "float":
        ins.append(b.input("c_float", SHAPE))
    elif third == "no_cast":
        ins.append(b.op("Mul", b.input("c_f", SHAPE), b.const("c_scale", F32(0.02)), name="c_mul"))
    elif third == "vector_scale":
        c = b.op("Cast", b.input("c_q", SHAPE, dtype), to=FLOAT, name="c_cast")
        ins.append(b.op("Mul", c, b.const("c_scale", np.full((1, 2, 1, 1), 0.02, F32)), name="c_mul"))
    elif third == "vector_zero":  # a zero point per channel (a DequantizeLinear along axis 1)
        c = b.op("Cast", b.input("c_q", SHAPE, dtype), to=FLOAT, name="c_cast")
        c = b.op("Sub", c, b.const("c_zp", np.array([-3.0, 2.0], F32).reshape(1, 2, 1, 1)), name="c_sub")
        ins.append(b.op("Mul", c, b.const("c_scale", F32(0.02)), name="c_mul"))
    elif third == "int32":  # an int32 tensor dequantized (a bias's form)
        c = b.op("Cast", b.input("c_q", SHAPE, "int32"), to=FLOAT, name="c_cast")
        ins.append(b.op("Mul", c, b.const("c_scale", F32(0.02)), name="c_mul"))
    cat = b.op("Concat", *ins, axis=axis, name="cat")
    y = b.op("Round", b.op("Div", cat, b.const("y_scale", np.asarray(y_scale, F32)), name="q_div"), name="q_round")
    if zp_add:
        z = b.const("y_zp", np.asarray(y_zero, F32))
        y = b.op("Add", *((z, y) if zp_first else (y, z)), name="q_zp")
    t = np.int8 if to == INT8 else np.uint8
    lo = np.iinfo(t).min if lo is None else lo
    hi = np.iinfo(t).max if hi is None else hi
    y = b.op("Clip", y, b.const("q_lo", F32(lo)), b.const("q_hi", F32(hi)), name="q_clip")
    out = b.op("Cast", y, to=to, name="q_cast")
    return b.build(out, b.op("Neg", cat, name="side")) if side else b.build(out)


def rewrite(g):
    g1 = g.copy()
    out = apply_rules(g1, [dataclasses.replace(INT8_CONCAT, pattern=int8_concat_pattern())])
    g1.verify()
    return g1, [(d.verdict, d.reason) for d in out.decisions]


def _feeds(g, seed=3):
    return full_range_feeds(g, seed)


@pytest.mark.parametrize("kwargs", [
    {},
    {"dtype": "uint8", "to": UINT8, "zeros": (128.0, 128.0), "y_zero": 128.0},
    {"zeros": (None, None), "zp_add": False},  # no zero point anywhere
    {"zeros": (None, 0.0), "y_zero": 0.0},  # an absent zero point is 0
    {"zp_first": True, "scale_first": True, "axis": -1},  # the constants on either side of Add and Mul
])
def test_equal_scales_are_a_concat_of_the_8bit_tensors_exactly(kwargs):
    g = concat_graph(**kwargs)
    g1, decisions = rewrite(g)
    assert [d[0] for d in decisions] == ["rewritten"]
    cat = g1.outputs[0].producer
    assert cat.op_type == "Concat" and cat.attrs["axis"] == kwargs.get("axis", 1)
    assert [v.name for v in cat.inputs] == ["a_q", "b_q"]  # the dequantizations are left dead (no other reader)
    assert not {"Div", "Round", "Clip"} & {n.op_type for n in g1.nodes}
    for seed in (3, 4):
        feeds = _feeds(g, seed)
        want, got = run(g, feeds), run(g1, feeds)
        for k in want:
            assert got[k].dtype == want[k].dtype
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("kwargs, reason", [
    ({"scales": (0.02, 0.03)}, "'b_mul' has scale 0.03, the output 0.02: a requantization"),
    ({"zeros": (-3.0, 5.0)}, "'b_mul' has zero point 5, the output -3: a requantization"),
    ({"zeros": (None, -3.0)}, "'a_mul' has zero point 0, the output -3: a requantization"),
    ({"zp_add": False}, "'a_mul' has zero point -3, the output 0: a requantization"),
    ({"input_dtypes": ("int8", "uint8"), "zeros": (0.0, 0.0), "y_zero": 0.0},
     "'b_q' is uint8, the Concat's output int8"),
    ({"third": "float"}, "Concat input c_float is not the output of a DequantizeLinear"),
    ({"third": "no_cast"}, "Concat input c_mul is not the output of a DequantizeLinear"),
    ({"third": "vector_scale"}, "Concat input c_mul is not dequantized with a constant scalar scale"),
    ({"third": "vector_zero"}, "Concat input c_mul is not dequantized with a constant scalar zero point"),
    ({"third": "int32"}, "Concat input c_mul is not dequantized from an 8-bit tensor"),
    ({"zp_input": True}, "Concat input b_mul's scale or zero point is not a constant"),
    ({"zeros": (-3.0, -2.5)}, "Concat input b_mul's zero point is not an integer of its int8 range"),
    ({"lo": 0}, "'q_clip' clamps to other bounds than int8's range"),
    ({"hi": 100}, "'q_clip' clamps to other bounds than int8's range"),
    ({"y_scale": 2.0 ** -110, "scales": (2.0 ** -110,) * 2},
     "the output scale 7.70372e-34 is below 7.88861e-31 or too large for an exact round trip"),
    ({"y_scale": 3e37, "scales": (3e37,) * 2},
     "the output scale 3e+37 is below 7.88861e-31 or too large for an exact round trip"),
    ({"side": True}, "intermediate 'cat' is also read by 'side'"),
])
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # the too-large scale's bound, 255 s in float32
def test_int8_concat_refusals_say_why(kwargs, reason):
    g = concat_graph(**kwargs)
    g1, decisions = rewrite(g)
    assert [n.op_type for n in g1.nodes] == [n.op_type for n in g.nodes]
    assert decisions == [("refused", reason)]


def test_a_cast_to_another_type_is_no_quantization():
    g = concat_graph(to=5, lo=-128, hi=127)  # int16
    assert rewrite(g)[1] == [("refused", "'q_cast' does not quantize a float32 Concat to int8 or uint8")]


def test_the_concat_of_8bit_tensors_is_named_after_the_float_one():
    g1, _ = rewrite(concat_graph())
    assert g1.outputs[0].producer.name.startswith("cat_int8")


def test_a_requantizing_concat_into_uint8_is_refused_for_its_type():
    g = concat_graph(to=UINT8, lo=-128, hi=127)  # a uint8 output with int8's clamp
    assert rewrite(g)[1] == [("refused", "'q_clip' clamps to other bounds than uint8's range")]
    g = concat_graph(to=UINT8)  # int8 inputs, a uint8 output
    assert rewrite(g)[1] == [("refused", "'a_q' is int8, the Concat's output uint8")]
