"""``dequantize_pattern`` (``rules/quantized.py``) built inside each test (mutation testing, tests/MUTATION.md: the
library builds it when it is imported, which no mutant run reaches): ``Cast(q) [-> Sub(zero point)] [-> Mul(scale)]
-> reader`` with ``q`` int8/uint8, the zero point the Sub's second operand and a constant, the scale a constant on
either side of the Mul, each step read only by the next. Expectations from the docstring, compiler-free."""
import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.patterns import find_matches
from opfuse.rules.quantized import dequantize_pattern

F32 = np.float32
FLOAT, INT32 = 1, 6  # ONNX element types
SHAPE = (1, 2, 4, 4)


def chain(q_dtype="int8", sub="const", mul="const", to=FLOAT, side_reader=False):
    """``q -> Cast(to) -> [Sub] -> [Mul] -> Relu``; ``sub``/``mul``: "const" (the constant second), "const_first",
    "input" (a run-time operand) or None (no such op); ``side_reader``: the last dequantizing op read by a Neg too."""
    b = GraphBuilder("g")
    q = b.input("q", SHAPE, q_dtype)
    x = b.op("Cast", q, to=to, name="cast")
    ft, runtime = (F32, "float32") if to == FLOAT else (np.int32, "int32")
    operand = {"const": lambda n: b.const(n, np.asarray(3, ft)), "const_first": lambda n: b.const(n, np.asarray(3, ft)),
               "input": lambda n: b.input(n, SHAPE, runtime)}
    for op, how in (("Sub", sub), ("Mul", mul)):
        if how is not None:
            c = operand[how](f"{op.lower()}_c")
            x = b.op(op, *((c, x) if how == "const_first" else (x, c)), name=op.lower())
    outs = [b.op("Neg", x, name="side")] if side_reader else []
    return b.build(b.op("Relu", x, name="reader"), *outs)


def matched(g):
    """Each match as (its nodes' names, the reader's name), with the captures the rule's action reads checked."""
    out = []
    for m in find_matches(g, dequantize_pattern()):
        assert m["q"] is g.inputs[0] and m["cast"].op_type == "Cast" and m["cast"].input(0) is m["q"]
        out.append(([n.name for n in m.nodes], m["reader"].name))
    return out


@pytest.mark.parametrize("q_dtype", ["int8", "uint8"])
def test_the_whole_dequantization_goes_to_its_reader(q_dtype):
    assert matched(chain(q_dtype)) == [(["cast", "sub", "mul", "reader"], "reader")]


def test_an_integer_ops_centering_is_a_prologue_too():
    """``int32(x_q) - x_zp``: a Cast to int32 and a Sub, no scale."""
    assert matched(chain(to=INT32, mul=None)) == [(["cast", "sub", "reader"], "reader")]


@pytest.mark.parametrize("sub, mul, nodes", [
    (None, "const", ["cast", "mul", "reader"]),
    ("const", None, ["cast", "sub", "reader"]),
    (None, None, ["cast", "reader"]),
])
def test_the_zero_point_and_the_scale_are_optional(sub, mul, nodes):
    assert matched(chain(sub=sub, mul=mul)) == [(nodes, "reader")]


def test_a_scale_may_come_first_in_the_mul():
    assert matched(chain(mul="const_first")) == [(["cast", "sub", "mul", "reader"], "reader")]


@pytest.mark.parametrize("sub, mul, nodes, reader", [
    ("input", "const", ["cast", "sub"], "sub"),  # a run-time zero point: the Sub is the reader
    ("const_first", "const", ["cast", "sub"], "sub"),  # zp - x is not a dequantization
    ("const", "input", ["cast", "sub", "mul"], "mul"),  # a run-time scale: the Mul is the reader
])
def test_a_step_without_its_constant_is_the_reader(sub, mul, nodes, reader):
    assert matched(chain(sub=sub, mul=mul)) == [(nodes, reader)]


def test_a_step_read_elsewhere_ends_the_chain():
    """The Mul's output has two readers: the match stops at the Mul, which becomes the reader."""
    assert matched(chain(side_reader=True)) == [(["cast", "sub", "mul"], "mul")]


@pytest.mark.parametrize("q_dtype", ["int32", "float32"])
def test_a_cast_of_a_wider_tensor_is_no_dequantization(q_dtype):
    assert matched(chain(q_dtype)) == []
