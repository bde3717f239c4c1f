"""The category rules used until the rules engine lands, and the plan-level questions."""
import numpy as np

from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from legality_doubles import CategoryLegality, SubplanLegality
from opfuse.planner import Legality

RULES = CategoryLegality()


def conv(b, x, c_in=4, c_out=4, name=None):
    return b.op("Conv", x, b.const("w", np.zeros((c_out, c_in, 3, 3), np.float32)), pads=[1, 1, 1, 1], name=name)


def test_conv_with_elementwise_epilogue_is_legal():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    g = b.build(b.op("Relu", b.op("Add", conv(b, x), x)))
    assert RULES.check_group(g, g.nodes) is None
    kind, anchor = RULES.describe(g, g.nodes)
    assert kind == "conv_epilogue" and anchor.op_type == "Conv"


def test_two_out_elementwise_fusable_ops_never_fuse():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    g = b.build(conv(b, b.op("Relu", conv(b, x))))
    reason = RULES.check_group(g, g.nodes)
    assert "two out-elementwise-fusable ops" in reason


def test_reduction_feeds_only_an_elementwise_epilogue():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    sm = b.op("Softmax", x)
    g = b.build(b.op("MatMul", sm, b.const("w", np.zeros((8, 3), np.float32))))
    assert "can only feed an elementwise epilogue" in RULES.check_group(g, g.nodes)
    b2 = GraphBuilder()
    x2 = b2.input("x", (4, 8))
    g2 = b2.build(b2.op("Mul", b2.op("Softmax", x2), x2))
    assert RULES.check_group(g2, g2.nodes) is None


def test_injective_prologue_fuses_into_a_reduction():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    g = b.build(b.op("MaxPool", b.op("Relu", x), kernel_shape=[2, 2], strides=[2, 2]))
    assert RULES.check_group(g, g.nodes) is None
    assert RULES.describe(g, g.nodes)[0] == "reduction"


def test_unrelated_ops_are_refused_siblings_are_horizontal():
    b = GraphBuilder()
    x = b.input("x", (16,))
    y = b.input("y", (16,))
    r, s = b.op("Relu", x), b.op("Sigmoid", x)
    t = b.op("Tanh", y)
    g = b.build(r, s, t)
    assert RULES.check_group(g, [r.producer, s.producer]) is None
    assert RULES.describe(g, [r.producer, s.producer])[0] == "horizontal"
    assert "neither connected nor siblings" in RULES.check_group(g, [r.producer, t.producer])


def test_max_group_nodes_limit():
    b = GraphBuilder()
    x = b.input("x", (16,))
    g = b.build(b.op("Tanh", b.op("Sigmoid", b.op("Relu", x))))
    assert "exceeds the limit of 2" in CategoryLegality(max_group_nodes=2).check_group(g, g.nodes)


def test_can_merge_refuses_a_cycle_through_an_outside_group():
    """A -> B -> C with B outside: fusing A and C would need B inside and outside."""
    b = GraphBuilder()
    x = b.input("x", (16,))
    a = b.op("Relu", x, name="A")
    bb = b.op("Sigmoid", a, name="B")
    c = b.op("Add", a, bb, name="C")
    g = b.build(c)
    plan = FusionPlan.unfused(g)
    ga, gb, gc = plan.groups
    reason = RULES.can_merge(plan, ga, gc)
    assert "cycle through an outside path" in reason
    assert RULES.can_merge(plan, ga, gb) is None
    pairs = {(p.name, q.name) for p, q in RULES.candidate_merges(plan)}
    assert pairs == {("A", "B"), ("B", "C")}  # (A, C) adjacent and siblings, but a cycle


def test_candidate_merges_include_sibling_pairs():
    b = GraphBuilder()
    x = b.input("x", (16,))
    g = b.build(b.op("Relu", x, name="r"), b.op("Sigmoid", x, name="s"))
    plan = FusionPlan.unfused(g)
    assert [(p.name, q.name) for p, q in RULES.candidate_merges(plan)] == [("r", "s")]


def test_subplan_legality_allows_subsets_of_proposed_groups_only():
    b = GraphBuilder()
    x = b.input("x", (1, 4, 8, 8))
    y = b.op("Relu", conv(b, x))
    z = b.op("Sigmoid", y)
    g = b.build(z)
    cv, relu, sig = g.nodes
    proposed = FusionPlan(g, [FusionGroup("cr", [cv, relu], "conv_epilogue", cv),
                              FusionGroup("s", [sig], "single", sig)])
    legal = SubplanLegality(proposed)
    assert isinstance(legal, Legality)
    assert legal.check_group(g, [cv, relu]) is None
    assert "different groups" in legal.check_group(g, [relu, sig])
    assert legal.describe(g, [cv, relu]) == ("conv_epilogue", cv)
    assert legal.proposed_groups(g) == [[cv, relu]]
