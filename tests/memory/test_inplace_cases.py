"""``inplace_candidates`` on one case per rule of its docstring, each pair worked out by hand from
the rule (mutation testing found these conditions unchecked; see tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.ir.plan import FusionGroup
from opfuse.memory.inplace import inplace_candidates
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder

SHAPE = (1, 4, 5, 5)


def _w(b, name="w"):
    return b.const(name, np.ones((4, 4, 1, 1), np.float32))


def _case(name):
    """(graph, group node names, expected (input, output) pairs)."""
    b = GraphBuilder(name)
    x = b.input("x", SHAPE)
    r = b.op("Relu", b.input("r0", SHAPE), name="r")   # produced by another kernel
    q = b.op("Sigmoid", b.input("q0", SHAPE), name="q")
    if name == "epilogue operand":  # Conv + Add(conv, r): r may hold the sum; x is the caller's
        conv = b.op("Conv", x, _w(b), name="conv")
        return b.build(b.op("Add", conv, r, name="add")), ["conv", "add"], [("r", "add")]
    if name == "anchor output leaves too":  # the Conv result is a group output as well
        conv = b.op("Conv", x, _w(b), name="conv")
        add = b.op("Add", conv, r, name="add")
        return b.build(add, b.op("Neg", conv, name="neg")), ["conv", "add"], [("r", "add")]
    if name == "prologue operand":  # p flows into the Conv: never overwritten; r still may be
        p = b.op("Tanh", b.input("p0", SHAPE), name="p")
        conv = b.op("Conv", b.op("Relu", p, name="rp"), _w(b), name="conv")
        return b.build(b.op("Add", conv, r, name="add")), ["rp", "conv", "add"], [("r", "add")]
    if name == "operand read by an earlier kernel too":  # r also feeds the Conv, through a kernel before
        conv = b.op("Conv", b.op("Neg", r, name="u"), _w(b), name="conv")
        return b.build(b.op("Add", conv, r, name="add")), ["conv", "add"], [("r", "add")]
    if name == "constant node inside":  # folded at build time: not an anchor of the kernel
        k = b.op("Transpose", b.const("k0", np.ones((1, 4, 5, 5), np.float32)), perm=[0, 1, 3, 2], name="k")
        return b.build(b.op("Add", k, r, name="add")), ["k", "add"], [("r", "add")]
    if name == "constant operand":  # folded constants (weights) are never overwritten, and r still may be
        k = b.op("Neg", b.const("k0", np.ones(SHAPE, np.float32)), name="k")
        return b.build(b.op("Add", k, r, name="add")), ["add"], [("r", "add")]
    if name == "constant output of another shape":  # sh is folded: no output of the kernel's pass;
        sh = b.op("Shape", r, name="sh")             # r is read by a Shape (not elementwise): q takes add
        return b.build(b.op("Add", r, q, name="add"), sh), ["sh", "add"], [("q", "add")]
    if name == "graph input":  # a pointwise kernel over the caller's x and r
        return b.build(b.op("Add", x, r, name="add")), ["add"], [("r", "add")]
    if name == "two anchors":
        conv = b.op("Conv", x, _w(b), name="conv")
        sm = b.op("Softmax", conv, axis=-1, name="sm")
        return b.build(b.op("Add", sm, r, name="add")), ["conv", "sm", "add"], []
    if name == "data movement":  # a Transpose reads r at permuted indices
        t = b.op("Transpose", r, perm=[0, 1, 3, 2], name="t")
        return b.build(b.op("Add", t, q, name="add")), ["t", "add"], []
    if name == "other element size":  # float32 -> int64 output: 4 vs 8 bytes per element
        return b.build(b.op("Cast", r, to=7, name="cast")), ["cast"], []
    if name == "one output per input":  # two operands, one output: only the first takes it
        return b.build(b.op("Add", r, q, name="add")), ["add"], [("r", "add")]
    if name == "outputs of two shapes":  # n (1, 8) and z (2, 8) leave the kernel
        r8 = b.op("Relu", b.input("r8", (1, 8)), name="r8r")
        n = b.op("Neg", r8, name="n")
        z = b.op("Add", n, b.input("y", (2, 8)), name="z")
        return b.build(z, b.op("Sigmoid", n, name="s")), ["n", "z"], []
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["epilogue operand", "anchor output leaves too", "prologue operand",
                                  "operand read by an earlier kernel too",
                                  "constant node inside", "constant operand",
                                  "constant output of another shape", "graph input",
                                  "two anchors", "data movement", "other element size", "one output per input",
                                  "outputs of two shapes"])
def test_inplace_pairs_follow_the_documented_rule(name):
    g, names, want = _case(name)
    by = {n.name: n for n in g.nodes}
    group = FusionGroup(name, [by[n] for n in names])
    got = [(i.name, o.name) for i, o in inplace_candidates(group, g, static_values(g))]
    assert got == want
