"""The horizontal rule's proposals (``rules.horizontal.propose_siblings``), each expectation worked out by hand from
its docstring: for each value several groups read (graph inputs first, then in the order of their producers),
siblings join the current pass one by one in plan order; a sibling that cannot lead a pass hands the lead to the
next. Found by mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

from opfuse.ops import GraphBuilder
from fusion_cases import plan_of

ONLY_HORIZONTAL = frozenset({"attention", "normalization_prologue", "dequantize_prologue", "epilogue",
                             "concat_alias", "elementwise_chain", "injective"})


def _horizontal(graph):
    plan, dec = plan_of(graph, disabled=ONLY_HORIZONTAL)
    got = [(d.verdict, d.nodes, d.reason) for d in dec if d.rule == "horizontal"]
    return plan, got


def _groups(plan):
    return sorted(sorted(n.name for n in g.nodes) for g in plan.groups)


def test_three_siblings_join_one_pass_one_by_one():
    b = GraphBuilder("three")
    x = b.input("x", (2, 8))
    g = b.build(b.op("Relu", x, name="r1"), b.op("Exp", x, name="r2"), b.op("Neg", x, name="r3"))
    plan, got = _horizontal(g)
    assert got == [("fused", ("r1", "r2"), "one pass over 'x'"), ("fused", ("r1", "r3"), "one pass over 'x'")]
    assert _groups(plan) == [["r1", "r2", "r3"]]


def test_graph_inputs_first_then_values_in_the_order_of_their_producers():
    # x read by p and t; p's output read by s1 and s2; q (after p) read by u1, u2
    b = GraphBuilder("order")
    x = b.input("x", (2, 8))
    t = b.op("Abs", x, name="t")
    p = b.op("Neg", t, name="p")
    q = b.op("Tanh", t, name="q")
    outs = [b.op("Relu", q, name="u1"), b.op("Exp", q, name="u2"), b.op("Relu", p, name="s1"),
            b.op("Exp", p, name="s2"), b.op("Sigmoid", x, name="y")]
    plan, got = _horizontal(b.build(*outs, t))
    assert got == [("fused", ("t", "y"), "one pass over 'x'"), ("fused", ("p", "q"), "one pass over 't'"),
                   ("fused", ("s1", "s2"), "one pass over 'p'"), ("fused", ("u1", "u2"), "one pass over 'q'")]


def test_a_sibling_without_a_domain_hands_the_lead_to_the_next():
    b = GraphBuilder("lead")
    x = b.input("x", (2, 8))
    g = b.build(b.op("Transpose", x, perm=[1, 0], name="t"), b.op("Relu", x, name="r1"),
                b.op("Exp", x, name="r2"))
    plan, got = _horizontal(g)
    assert [(v, n) for v, n, _ in got] == [("refused", ("t", "r1")), ("fused", ("r1", "r2"))]
    assert _groups(plan) == [["r1", "r2"], ["t"]]


def test_a_refused_sibling_with_a_domain_keeps_the_lead():
    # r1 and r2 iterate over (2, 8); s (a ReduceSum) over another domain: refused, r1 keeps the lead for r2
    b = GraphBuilder("keep")
    x = b.input("x", (2, 8))
    g = b.build(b.op("Relu", x, name="r1"), b.op("ReduceSum", x, axes=[1], keepdims=1, name="s"),
                b.op("Exp", x, name="r2"))
    plan, got = _horizontal(g)
    assert [(v, n) for v, n, _ in got] == [("refused", ("r1", "s")), ("fused", ("r1", "r2"))]
    assert _groups(plan) == [["r1", "r2"], ["s"]]


def test_a_group_reading_the_value_twice_is_one_sibling_and_the_producer_is_none():
    b = GraphBuilder("twice")
    x = b.input("x", (2, 8))
    r = b.op("Relu", x, name="r")
    g = b.build(b.op("Add", r, r, name="a"), b.op("Exp", r, name="e"))
    plan, got = _horizontal(g)
    assert got == [("fused", ("a", "e"), "one pass over 'r'")]
    # a value read by one group only (twice) proposes nothing
    b = GraphBuilder("once")
    x = b.input("x", (2, 8))
    r = b.op("Relu", x, name="r")
    plan, got = _horizontal(b.build(b.op("Add", r, r, name="a")))
    assert got == []
