"""The matcher on small hand-built graphs: one behaviour per test, expected nodes written out."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.ir.graph import Graph, TensorType
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import Category
from opfuse.patterns import (Const, Matcher, Op, Var, const_inputs, find_matches, has_attr, has_dtype, has_rank,
                             has_shape, many, par)

SHAPE = (2, 4)


def ones(b, name="c"):
    return b.const(name, np.ones(SHAPE, np.float32))


def found(graph, pattern) -> list[list[str]]:
    return [m.node_names for m in find_matches(graph, pattern)]


def test_sequence_only_used_by_and_keep():
    b = GraphBuilder("seq")
    x = b.input("x", SHAPE)
    r = b.op("Relu", x, name="relu")
    a = b.op("Add", r, ones(b), name="add")
    other = b.op("Exp", r, name="exp")            # relu's output escapes the Relu->Add match
    g = b.build(a, other)
    assert found(g, Op("Relu") >> Op("Add")) == []
    assert found(g, Op("Relu").keep() >> Op("Add")) == [["relu", "add"]]
    assert found(g, Op("Relu").used_by(Op("Exp"))) == [["relu", "exp"]]


def test_graph_output_cannot_be_swallowed():
    b = GraphBuilder("out")
    x = b.input("x", SHAPE)
    r = b.op("Relu", x, name="relu")
    s = b.op("Sigmoid", r, name="sig")
    g = b.build(s, r)                             # relu is also a graph output
    assert found(g, Op("Relu") >> Op("Sigmoid")) == []
    assert found(g, Op("Relu").keep() >> Op("Sigmoid")) == [["relu", "sig"]]


def test_explicit_slot_of_non_commutative_op():
    b = GraphBuilder("sub")
    x = b.input("x", SHAPE)
    r1 = b.op("Relu", x, name="r1")
    r2 = b.op("Relu", x, name="r2")
    s1 = b.op("Sub", r1, ones(b, "c1"), name="relu_minus_c")
    s2 = b.op("Sub", ones(b, "c2"), r2, name="c_minus_relu")
    g = b.build(s1, s2)
    assert found(g, Op("Sub")(Op("Relu"), Var())) == [["r1", "relu_minus_c"]]
    assert found(g, Op("Relu") >> Op("Sub").at(1)) == [["r2", "c_minus_relu"]]
    assert found(g, Op("Relu") >> Op("Sub")) == [["r1", "relu_minus_c"], ["r2", "c_minus_relu"]]


def test_commutative_inputs_match_in_either_order():
    b = GraphBuilder("comm")
    x = b.input("x", SHAPE)
    a1 = b.op("Add", b.op("Relu", x, name="r1"), ones(b, "c1"), name="relu_plus_c")
    a2 = b.op("Add", ones(b, "c2"), b.op("Relu", x, name="r2"), name="c_plus_relu")
    g = b.build(a1, a2)
    p = Op("Add")(Op("Relu"), Const())
    assert found(g, p) == [["r1", "relu_plus_c"], ["r2", "c_plus_relu"]]


def test_commutative_slots_must_be_distinct_inputs():
    b = GraphBuilder("square")
    x = b.input("x", SHAPE)
    y = b.input("y", SHAPE)
    sq = b.op("Mul", x, x, name="square")
    xy = b.op("Mul", x, y, name="product")
    g = b.build(sq, xy)
    v = Var("v")
    assert found(g, Op("Mul")(v, v)) == [["square"]]
    assert found(g, Op("Mul")(Var(), Var())) == [["square"], ["product"]]


def test_shared_variable_silu():
    b = GraphBuilder("silu")
    x = b.input("x", SHAPE)
    y = b.input("y", SHAPE)
    good = b.op("Mul", b.op("Sigmoid", x, name="sx"), x, name="x_sig_x")
    bad = b.op("Mul", y, b.op("Sigmoid", x, name="sx2"), name="y_sig_x")
    g = b.build(good, bad)
    v = Var("x")
    ms = find_matches(g, Op("Mul")(v, Op("Sigmoid")(v).named("sig")).named("mul"))
    assert [m.node_names for m in ms] == [["sx", "x_sig_x"]]
    assert ms[0]["x"] is g.values["x"]
    assert ms[0]["sig"].name == "sx" and ms[0]["mul"].name == "x_sig_x"


def test_repetition_is_maximal_and_captures_a_list():
    b = GraphBuilder("chain")
    x = b.input("x", SHAPE)
    y = b.op("Tanh", b.op("Sigmoid", b.op("Relu", x, name="a"), name="b"), name="c")
    z = b.op("Exp", y, name="not_activation")
    g = b.build(z)
    ms = find_matches(g, Op(tag="activation").named("act").plus())
    assert [m.node_names for m in ms] == [["a", "b", "c"]]
    assert [n.name for n in ms[0]["act"]] == ["a", "b", "c"]


def test_chain_stops_where_a_value_escapes():
    b = GraphBuilder("split")
    x = b.input("x", SHAPE)
    mid = b.op("Sigmoid", b.op("Relu", x, name="a"), name="b")
    end = b.op("Relu", b.op("Tanh", mid, name="c"), name="d")
    g = b.build(end, mid)                         # b's output is a graph output
    assert found(g, Op(tag="activation").plus()) == [["a", "b"], ["c", "d"]]


def test_bounded_repetition():
    b = GraphBuilder("chain4")
    x = b.input("x", SHAPE)
    for name in "abcd":
        x = b.op("Relu", x, name=name)
    g = b.build(x)
    assert found(g, Op("Relu").repeat(2, 3)) == [["a", "b", "c"], ["b", "c", "d"]]
    assert found(g, Op("Relu").repeat(5)) == []


def test_optional_part():
    b = GraphBuilder("opt")
    x = b.input("x", SHAPE)
    with_scale = b.op("Sigmoid", b.op("Div", b.op("Exp", x, name="e1"), ones(b), name="div"), name="s1")
    without = b.op("Sigmoid", b.op("Exp", x, name="e2"), name="s2")
    g = b.build(with_scale, without)
    p = Op("Exp") >> Op("Div", "Mul").at(0).named("scale").opt() >> Op("Sigmoid")
    ms = find_matches(g, p)
    assert [m.node_names for m in ms] == [["e1", "div", "s1"], ["e2", "s2"]]
    assert [n.name for n in ms[0]["scale"]] == ["div"] and ms[1]["scale"] == []


def test_fan_in_takes_every_eligible_producer():
    b = GraphBuilder("fan")
    x = b.input("x", SHAPE)
    r1, r2 = b.op("Relu", x, name="r1"), b.op("Relu", x, name="r2")
    e = b.op("Exp", x, name="e")
    r3 = b.op("Relu", x, name="r3")
    cat = b.op("Concat", r1, e, r2, r3, name="cat", axis=0)
    g = b.build(cat, r3)                          # r3 escapes: it cannot be swallowed
    ms = find_matches(g, many(Op("Relu").named("relus")) >> Op("Concat").named("cat"))
    assert [m.node_names for m in ms] == [["r1", "r2", "cat"]]
    assert [n.name for n in ms[0]["relus"]] == ["r1", "r2"]


def test_parallel_siblings_on_a_shared_input():
    b = GraphBuilder("qkv")
    x = b.input("x", (2, 8))
    outs = [b.op("MatMul", x, b.const(f"w{i}", np.ones((8, 8), np.float32)), name=f"mm{i}") for i in range(4)]
    g = b.build(*outs)
    v = Var("x")
    p = par(*[Op("MatMul")(v, Const()) for _ in range(3)])
    # every 3 of the 4 siblings, each set once (not once per permutation)
    assert found(g, p) == [["mm0", "mm1", "mm2"], ["mm0", "mm1", "mm3"], ["mm0", "mm2", "mm3"],
                           ["mm1", "mm2", "mm3"]]
    assert found(g, v >> many(Op("MatMul"), 2)) == [["mm0", "mm1", "mm2", "mm3"]]


def test_constraints_on_attributes_dtype_shape_and_constants():
    b = GraphBuilder("constraints")
    x = b.input("x", SHAPE)
    lr = b.op("LeakyRelu", x, name="leaky", alpha=0.2)
    lr_default = b.op("LeakyRelu", x, name="leaky_default")
    addc = b.op("Add", x, ones(b), name="add_const")
    addx = b.op("Add", x, x, name="add_var")
    g = b.build(lr, lr_default, addc, addx)
    assert found(g, Op("LeakyRelu").where(has_attr(alpha=0.2))) == [["leaky"]]
    assert found(g, Op("LeakyRelu").where(has_attr(alpha=0.01))) == [["leaky_default"]]  # default filled in
    assert found(g, Op("Add").where(const_inputs(1))) == [["add_const"]]
    assert found(g, Op("Add")(Var(), Const(1.0))) == [["add_const"]]
    assert found(g, Op("Add")(Var(), Const(2.0))) == []
    assert len(found(g, Op("Add").where(has_shape((2, None)), has_dtype("float32"), has_rank(2)))) == 2
    assert found(g, Op("Add").where(has_shape((3, 4)))) == []


def test_category_and_tag_predicates():
    b = GraphBuilder("cats")
    x = b.input("x", SHAPE)
    y = b.op("Mul", b.op("Exp", x, name="exp"), b.op("Relu", x, name="relu"), name="mul")
    g = b.build(y)
    assert found(g, Op(category=Category.ELEMWISE) >> Op("Mul")) == [["exp", "mul"], ["relu", "mul"]]
    assert found(g, Op(tag="activation") >> Op("Mul")) == [["relu", "mul"]]   # Exp is no activation
    assert found(g, Op(category=Category.REDUCTION) >> Op("Mul")) == []
    assert [m.node_names for m in find_matches(g, many(Op(category=Category.ELEMWISE)) >> Op("Mul"))] == \
        [["exp", "relu", "mul"]]


def test_results_are_deterministic_and_in_graph_order():
    b = GraphBuilder("order")
    x = b.input("x", SHAPE)
    outs = [b.op("Sigmoid", b.op("Relu", x, name=f"r{i}"), name=f"s{i}") for i in range(5)]
    g = b.build(*outs)
    runs = [found(g, Op("Relu") >> Op("Sigmoid")) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2] == [[f"r{i}", f"s{i}"] for i in range(5)]


def test_feature_index_anchors_on_the_rarest_op():
    b = GraphBuilder("index")
    x = b.input("x", (1, 2, 4, 4))
    for i in range(20):
        x = b.op("Relu", x, name=f"relu{i}")
    c = b.op("Conv", x, b.const("w", np.ones((2, 2, 1, 1), np.float32)), name="conv")
    g = b.build(b.op("Relu", c, name="after"))
    m = Matcher(g)
    p = Op("Conv") >> Op("Relu")
    assert [mt.node_names for mt in m.matches(p)] == [["conv", "after"]]
    assert m.stats(p).attempts == 1               # one Conv tried, not 22 nodes scanned
    assert m.index.estimate(Op("Relu")) == 21 and m.index.estimate(Op(tag="activation")) == 21


def _long_chain(n: int) -> Graph:
    g = Graph("long")
    t = TensorType(SHAPE, np.float32)
    v = g.add_input("x", SHAPE)
    for i in range(n):
        v = g.add_node("Relu" if i % 3 else "Exp", [v], name=f"n{i}", output_types=[t]).outputs[0]
    g.outputs = [v]
    return g


def test_incremental_update_searches_only_the_neighbourhood():
    g = _long_chain(300)
    m = Matcher(g)
    p = Op("Exp") >> Op("Relu") >> Op("Relu")
    assert len(m.matches(p)) == 100
    full = m.stats(p).attempts
    m.block([g.nodes[150]])
    assert len(m.matches(p)) == 99
    assert m.stats(p).attempts - full <= 4        # a handful of anchors re-tried, not 300


def test_find_matches_on_an_empty_graph():
    g = Graph("empty")
    g.add_input("x", SHAPE)
    assert find_matches(g, Op("Relu")) == []


@pytest.mark.parametrize("pattern_text", ["Relu", "Conv"])
def test_string_is_shorthand_for_op(pattern_text):
    b = GraphBuilder("s")
    x = b.input("x", SHAPE)
    g = b.build(b.op("Sigmoid", b.op("Relu", x, name="r"), name="s"))
    got = found(g, Op("Relu") >> "Sigmoid") if pattern_text == "Relu" else found(g, Op("Conv") >> "Sigmoid")
    assert got == ([["r", "s"]] if pattern_text == "Relu" else [])
