"""Details of ``rules.legality`` that the plan-level tests cannot see, each expectation worked out by hand
from the docstrings (found by mutation testing, tests/MUTATION.md): which rule a kernel shape belongs to,
what ``annotate_plan`` writes on each group, and the horizontal conditions at their limits with their
exact refusal texts."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import ModelError
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.rules import FusionOptions, PlanLegality, unfused_plan
from opfuse.rules.decisions import RefusalKind
from opfuse.rules.kernel_shape import GroupShape
from opfuse.rules.legality import RuleLegality, annotate_plan, rule_of_shape
from fusion_cases import plan_of, randn, refusals


def _anchors():
    b = GraphBuilder("anchors")
    x = b.input("x", (2, 8))
    g = b.build(b.op("Softmax", x, axis=-1, name="sm"), b.op("ReduceSum", x, axes=[1], name="rs"))
    return g.node("sm"), g.node("rs")


def test_rule_of_each_kernel_shape():
    sm, rs = _anchors()
    conv = object()  # the anchor of an epilogue is not looked at
    cases = [
        (GroupShape("conv_epilogue", conv, {"prologue": ["dq"]}), "dequantize_prologue"),
        (GroupShape("gemm_epilogue", conv, {"prologue": ["dq"]}), "dequantize_prologue"),
        (GroupShape("conv_epilogue", conv, {"prologue": []}), "epilogue"),
        (GroupShape("gemm_epilogue", conv, {}), "epilogue"),
        (GroupShape("sampling_epilogue", conv, {}), "epilogue"),
        (GroupShape("reduction", sm, {"prologue": ["mul"]}), "normalization_prologue"),  # a row normalization
        (GroupShape("reduction", rs, {"prologue": ["mul"]}), "elementwise_chain"),  # any other reduction
        (GroupShape("reduction", rs, {"prologue": []}), "epilogue"),
        (GroupShape("reduction", sm, {"epilogue": ["relu"]}), "epilogue"),
        (GroupShape("elementwise", None), "elementwise_chain"),
        (GroupShape("injective", None), "injective"),
        (GroupShape("attention", None), "attention"),
        (GroupShape("horizontal", None), "horizontal"),
        (GroupShape("concat", None), "concat_alias"),
        (GroupShape("single", None), None),
    ]
    assert [rule_of_shape(s) for s, _ in cases] == [want for _, want in cases]


def _conv_concat():
    """x -> Conv c1 -> Relu r1 \\
       x -> Conv c2 ----------- Concat cat (axis 1) -> Conv c3 (the output)."""
    b = GraphBuilder("conv_concat")
    x = b.input("x", (1, 3, 6, 6))
    r1 = b.op("Relu", b.op("Conv", x, b.const("w1", randn((4, 3, 1, 1))), name="c1"), name="r1")
    c2 = b.op("Conv", x, b.const("w2", randn((2, 3, 3, 3), 1)), pads=[1, 1, 1, 1], name="c2")
    cat = b.op("Concat", r1, c2, axis=1, name="cat")
    return b.build(b.op("Conv", cat, b.const("w3", randn((2, 6, 1, 1), 2)), name="c3"))


def _hand_plan(g, **attrs):
    n = {x.name: x for x in g.nodes}
    return FusionPlan(g, [FusionGroup("k1", [n["c1"], n["r1"]], attrs=dict(attrs)),
                          FusionGroup("k2", [n["c2"]], attrs=dict(attrs)),
                          FusionGroup("k3", [n["cat"]], attrs=dict(attrs)),
                          FusionGroup("k4", [n["c3"]], attrs=dict(attrs))])


def _summary(plan):
    return [(gr.name, gr.kind, gr.anchor.name, {k: v for k, v in gr.attrs.items() if k != "inputs"})
            for gr in plan.groups]


def test_annotate_plan_writes_kind_anchor_rule_origin_aliasing_and_boundary():
    g = _conv_concat()
    n = {x.name: x for x in g.nodes}
    # the rule of a group that is one of the candidates' is the candidates' rule, not its shape's
    candidates = FusionPlan(g, [FusionGroup("other", [n["c1"], n["r1"]], attrs={"rule": "my_rule"})])
    out = annotate_plan(_hand_plan(g), candidates=candidates, origin={"r1": ["relu_a", "relu_b"]})
    assert _summary(out) == [
        ("k1", "conv_epilogue", "c1", {"epilogue": ["r1"], "origin": ["c1", "relu_a", "relu_b"], "rule": "my_rule",
                                       "outputs": ["r1"]}),
        ("k2", "single", "c2", {"origin": ["c2"], "outputs": ["c2"]}),
        ("k3", "concat", "cat", {"origin": ["cat"], "alias_inputs": ["r1", "c2"], "zero_copy": "concat",
                                 "rule": "concat_alias", "outputs": ["cat"]}),
        ("k4", "single", "c3", {"origin": ["c3"], "outputs": ["c3"]}),
    ]
    assert [gr.attrs["inputs"] for gr in out.groups] == [["x", "w1"], ["x", "w2"], ["r1", "c2"], ["cat", "w3"]]
    assert all(gr.anchor is n[a] for gr, a in zip(out.groups, ["c1", "c2", "cat", "c3"], strict=True))


def test_annotate_plan_keeps_the_groups_origin_and_ignores_candidates_of_another_graph():
    g = _conv_concat()
    other = _conv_concat()  # the same model, another graph object: its groups are not this graph's
    candidates = FusionPlan(other, [FusionGroup("other", [x for x in other.nodes if x.name in ("c1", "r1")],
                                                attrs={"rule": "my_rule"})])
    out = annotate_plan(_hand_plan(g, origin=["from_before"]), candidates=candidates)
    assert [(gr.attrs["rule"] if "rule" in gr.attrs else None, gr.attrs["origin"]) for gr in out.groups] == \
        [("epilogue", ["from_before"]), (None, ["from_before"]), ("concat_alias", ["from_before"]),
         (None, ["from_before"])]


def test_annotate_plan_with_concat_aliasing_disabled_makes_the_concat_a_single_op():
    g = _conv_concat()
    out = annotate_plan(_hand_plan(g), FusionOptions(disabled=frozenset({"concat_alias"})))
    k3 = out.groups[2]
    assert (k3.name, k3.kind, k3.anchor.name) == ("k3", "single", "cat")
    assert not {"alias_inputs", "zero_copy", "rule"} & set(k3.attrs)


def test_annotate_plan_drops_the_attention_anchor_attribute():
    """The attention shape carries its QK MatMul as ``qk``: the group's anchor, not an attribute."""
    b = GraphBuilder("attn")
    q, k, v = (b.input(s, (2, 4, 8)) for s in "qkv")
    s = b.op("MatMul", q, b.op("Transpose", k, perm=[0, 2, 1], name="kt"), name="qk")
    p = b.op("Softmax", b.op("Mul", s, b.const("scale", np.array(0.35, np.float32)), name="scale"), axis=-1,
             name="sm")
    g = b.build(b.op("MatMul", p, v, name="pv"))
    out = annotate_plan(FusionPlan(g, [FusionGroup("att", list(g.nodes))]))
    (att,) = out.groups
    assert (att.kind, att.anchor.name, att.attrs["rule"]) == ("attention", "qk", "attention")
    assert "qk" not in att.attrs and att.attrs["softmax"] == "sm"


def test_annotate_plan_refuses_an_illegal_group_naming_it():
    g = _conv_concat()
    n = {x.name: x for x in g.nodes}
    bad = FusionPlan(g, [FusionGroup("two_convs", [n["c2"], n["cat"], n["c3"]]),
                         FusionGroup("k1", [n["c1"], n["r1"]])])
    with pytest.raises(ModelError, match="^fusion group 'two_convs' is not a legal kernel: .*out-elementwise-fusable"):
        annotate_plan(bad)


# Horizontal conditions at their limits --------------------------------------------------------

def _pools(b, x, n):
    return [b.op("MaxPool", x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], name=f"p{i}")
            for i in range(n)]


def test_horizontal_member_limit_is_inclusive():
    """``max_horizontal_members`` siblings fit; one more is refused with the count."""
    b = GraphBuilder("members")
    x = b.input("x", (1, 2, 8, 8))
    g = b.build(*_pools(b, x, 3))
    plan, dec = plan_of(g, max_horizontal_members=3)
    assert [(gr.kind, gr.attrs.get("members")) for gr in plan.groups] == [("horizontal", [["p0"], ["p1"], ["p2"]])]
    plan, dec = plan_of(g, max_horizontal_members=2)
    assert len(plan.groups) == 2
    assert "resource limit: 3 siblings exceed the limit of 2" in refusals(dec, "horizontal")


def test_horizontal_group_size_limit_counts_every_op():
    """Two siblings of two ops each: 4 ops fit in a kernel of 4, not of 3 (``max_ops_per_group``)."""
    b = GraphBuilder("size")
    x = b.input("x", (4, 4))
    g = b.build(b.op("Neg", b.op("Relu", x, name="r0"), name="n0"), b.op("Neg", b.op("Exp", x, name="e1"), name="n1"))
    legal = PlanLegality(unfused_plan(g), FusionOptions(max_ops_per_group=3))
    by = {gr.name: gr for gr in legal.plan().groups}
    a = legal.merge(by["r0"], by["n0"])
    c = legal.merge(by["e1"], by["n1"])
    r = legal.can_merge(a, c)
    assert r is not None and str(r) == "resource limit: 4 ops exceed the limit of 3 per kernel"
    legal = PlanLegality(unfused_plan(g), FusionOptions(max_ops_per_group=4))
    by = {gr.name: gr for gr in legal.plan().groups}
    a, c = legal.merge(by["r0"], by["n0"]), legal.merge(by["e1"], by["n1"])
    assert legal.can_merge(a, c) is None
    h = legal.merge(a, c)
    assert h.kind == "horizontal" and h.anchor.name == "r0" and h.attrs["members"] == [["r0", "n0"], ["e1", "n1"]]
    assert h.attrs["member_kinds"] == ["elementwise", "elementwise"]
    assert h.attrs["domain"] == ("elementwise", (4, 4)) and h.attrs["shared_input"] == "x"


def test_horizontal_refusal_texts():
    b = GraphBuilder("windows")
    x = b.input("x", (1, 2, 8, 8))
    g = b.build(b.op("MaxPool", x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], name="m3"),
                b.op("MaxPool", x, kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2], name="m5"))
    _, dec = plan_of(g)
    assert "rule refused: the siblings iterate over different domains (window or shape differ)" in \
        refusals(dec, "horizontal")
    b = GraphBuilder("path")
    x = b.input("x", (4, 4))
    g = b.build(b.op("Add", x, b.op("Neg", b.op("Relu", x, name="a"), name="c"), name="d"))
    legal = PlanLegality(unfused_plan(g))
    by = {gr.name: gr for gr in legal.plan().groups}
    r = legal.can_merge(by["a"], by["d"])
    assert r is not None and r.reason == "a path connects the siblings (they are not independent)"


def _by_name(legal):
    return {gr.name: gr for gr in legal.plan().groups}


def test_merge_refusal_texts():
    b = GraphBuilder("pairs")
    x, y = b.input("x", (4, 4)), b.input("y", (4, 4))
    a = b.op("Relu", x, name="a")
    g = b.build(b.op("Add", a, b.op("Neg", a, name="c"), name="d"), b.op("Neg", y, name="e"))
    legal = PlanLegality(unfused_plan(g))
    by = _by_name(legal)
    refusals_ = {pair: legal.can_merge(by[pair[0]], by[pair[1]]) for pair in (("a", "a"), ("a", "e"), ("a", "d"))}
    assert {k: (r.kind, r.reason) for k, r in refusals_.items()} == {
        ("a", "a"): (RefusalKind.CONDITION, "the groups are the same"),
        ("a", "e"): (RefusalKind.CONDITION, "the groups are neither adjacent nor siblings of one input"),
        ("a", "d"): (RefusalKind.DEPENDENCY, "a path leaves the groups and comes back through another group"),
    }


def test_a_horizontal_group_or_an_elided_concat_takes_no_vertical_fusion():
    b = GraphBuilder("sealed")
    x = b.input("x", (1, 2, 8, 8))
    p0, p1 = _pools(b, x, 2)
    g = b.build(b.op("Add", p0, p1, name="s"))
    legal = PlanLegality(unfused_plan(g))
    by = _by_name(legal)
    h = legal.merge(by["p0"], by["p1"])
    r = legal.can_merge(h, _by_name(legal)["s"])
    assert (r.kind, r.reason) == (RefusalKind.CONDITION,
                                  "group 'p0' is a horizontal group: it takes no vertical fusion")
    plan, _ = plan_of(_conv_concat())
    legal = PlanLegality(plan)
    by = {gr.nodes[0].name: gr for gr in legal.plan().groups}
    assert by["cat"].attrs.get("zero_copy") == "concat"
    r = legal.can_merge(by["cat"], by["c3"])
    assert (r.kind, r.reason) == (RefusalKind.CONDITION, "Concat 'cat' is elided (its producers write into its slices)")


def test_annotate_plan_anchors_and_rules_of_chains_and_prologues():
    """An elementwise chain has no anchor op: its group's anchor is its first node. A reduction with a
    prologue is credited to ``elementwise_chain``, or to ``normalization_prologue`` for a row normalization."""
    b = GraphBuilder("chains")
    x = b.input("x", (2, 8))
    k = b.const("k", np.full((2, 8), 0.5, np.float32))
    neg = b.op("Neg", b.op("Relu", x, name="relu"), name="neg")
    rs = b.op("ReduceSum", b.op("Mul", x, k, name="mul"), axes=[1], name="rs")
    sm = b.op("Softmax", b.op("Add", x, k, name="add"), axis=-1, name="sm")
    g = b.build(neg, rs, sm)
    n = {v.name: v for v in g.nodes}
    plan = FusionPlan(g, [FusionGroup("ew", [n["relu"], n["neg"]]), FusionGroup("red", [n["mul"], n["rs"]]),
                          FusionGroup("norm", [n["add"], n["sm"]])])
    out = annotate_plan(plan)
    assert [(gr.name, gr.kind, gr.anchor.name, gr.attrs["rule"]) for gr in out.groups] == [
        ("ew", "elementwise", "relu", "elementwise_chain"),
        ("red", "reduction", "rs", "elementwise_chain"),
        ("norm", "reduction", "sm", "normalization_prologue"),
    ]
    assert [gr.attrs.get("prologue") for gr in out.groups] == [None, ["mul"], ["add"]]


def test_two_concats_of_the_same_values_alias_them_once():
    """A value can live in one Concat's slice only: the second Concat of the same inputs copies them."""
    b = GraphBuilder("two_concats")
    x = b.input("x", (1, 2, 4, 4))
    r, ng = b.op("Relu", x, name="r"), b.op("Neg", x, name="ng")
    c1 = b.op("Concat", r, ng, axis=1, name="cat1")
    c2 = b.op("Concat", r, ng, axis=1, name="cat2")
    g = b.build(b.op("Add", c1, c2, name="s"))
    out = annotate_plan(FusionPlan(g, [FusionGroup(v.name, [v]) for v in g.nodes]))
    by = {gr.name: gr for gr in out.groups}
    assert (by["cat1"].kind, by["cat1"].attrs.get("alias_inputs")) == ("concat", ["r", "ng"])
    assert (by["cat2"].kind, by["cat2"].attrs.get("alias_inputs")) == ("single", None)


def test_horizontal_refusal_when_a_member_does_not_read_the_shared_value():
    """A horizontal group {p0 = Relu(x), p1 = Add(x, y)} and q = Neg(y) share y only through p1."""
    b = GraphBuilder("members")
    x, y = b.input("x", (4, 4)), b.input("y", (4, 4))
    g = b.build(b.op("Relu", x, name="p0"), b.op("Add", x, y, name="p1"), b.op("Neg", y, name="q"))
    legal = PlanLegality(unfused_plan(g))
    by = _by_name(legal)
    h = legal.merge(by["p0"], by["p1"])
    r = legal.can_merge(h, _by_name(legal)["q"])
    assert (r.kind, r.reason) == (RefusalKind.CONDITION, "'p0' does not read 'y' (no shared input)")


def test_an_elided_concat_takes_no_horizontal_fusion():
    b = GraphBuilder("concat_sibling")
    x = b.input("x", (1, 3, 6, 6))
    r1 = b.op("Relu", b.op("Conv", x, b.const("w1", randn((4, 3, 1, 1))), name="c1"), name="r1")
    c2 = b.op("Conv", x, b.const("w2", randn((2, 3, 3, 3), 1)), pads=[1, 1, 1, 1], name="c2")
    cat = b.op("Concat", r1, c2, axis=1, name="cat")
    g = b.build(b.op("Conv", cat, b.const("w3", randn((2, 6, 1, 1), 2)), name="c3"), b.op("Neg", c2, name="ng"))
    plan, _ = plan_of(g)
    legal = PlanLegality(plan)
    by = {gr.nodes[0].name: gr for gr in legal.plan().groups}
    assert by["cat"].attrs.get("zero_copy") == "concat"
    r = legal.can_merge(by["cat"], by["ng"])
    assert (r.kind, r.reason) == (RefusalKind.CONDITION, "'cat' moves no data")


# PlanLegality: candidates, disabled rules, the partition it covers ------------------------------

def _fan():
    """x -> a = Relu, b = Neg, c = Exp; d = Add(a, b); e = Mul(a, d)."""
    b = GraphBuilder("fan")
    x = b.input("x", (4, 4))
    a = b.op("Relu", x, name="a")
    nb = b.op("Neg", x, name="b")
    c = b.op("Exp", x, name="c")
    d = b.op("Add", a, nb, name="d")
    return b.build(c, b.op("Mul", a, d, name="e"))


def test_candidate_merges_are_every_adjacent_and_sibling_pair_in_plan_order():
    g = _fan()
    legal = PlanLegality(unfused_plan(g))
    pairs = [(x.name, y.name) for x, y in legal.candidate_merges()]
    # adjacent: a-d, b-d, a-e, d-e; siblings of x: a-b, a-c, b-c; of a: d-e (already adjacent)
    assert pairs == [("a", "b"), ("a", "c"), ("a", "d"), ("a", "e"), ("b", "c"), ("b", "d"), ("d", "e")]
    by = _by_name(legal)
    legal.merge(by["a"], by["d"])  # group "a" = {a, d} reads b's output, so the plan order is b, a, c, e
    assert [gr.name for gr in legal.plan().groups] == ["b", "a", "c", "e"]
    # adjacent: b-a, a-e; siblings of x: b-a, b-c, a-c; a's and d's readers are inside the group or e
    assert [(x.name, y.name) for x, y in legal.candidate_merges()] == [("b", "a"), ("b", "c"), ("a", "c"),
                                                                        ("a", "e")]


def test_can_merge_refuses_a_disabled_rule_and_merge_an_illegal_pair():
    g = _fan()
    legal = PlanLegality(unfused_plan(g), FusionOptions(disabled=frozenset({"elementwise_chain"})))
    by = _by_name(legal)
    r = legal.can_merge(by["a"], by["d"])
    assert str(r) == "disabled by user: rule 'elementwise_chain' is disabled"
    assert legal.can_merge(by["a"], by["b"]) is None  # horizontal is not disabled
    with pytest.raises(ValueError, match="^illegal merge of 'b' and 'e': .*neither adjacent nor siblings"):
        legal.merge(by["b"], by["e"])


def test_plan_legality_covers_only_its_own_unchanged_plan():
    g = _fan()
    plan = unfused_plan(g)
    legal = PlanLegality(plan)
    assert legal.covers(plan) and legal.covers(plan, plan.groups)
    assert not legal.covers(unfused_plan(g))  # another plan object of the same size
    n = {v.name: v for v in g.nodes}
    assert not legal.covers(plan, [FusionGroup("ad", [n["a"], n["d"]])])  # not one of its groups
    shorter = FusionPlan(g, plan.groups[:-1])
    assert not legal.covers(shorter)
    by = _by_name(legal)
    legal.merge(by["a"], by["d"])
    assert not legal.covers(plan, [by["a"]])  # a is now part of a two-op group


def test_rule_legality_offers_the_legal_pairs_only():
    """The planner's candidates: PlanLegality's pairs less a-e (the path a -> d -> e would leave the group)."""
    plan = unfused_plan(_fan())
    pairs = [(x.name, y.name) for x, y in RuleLegality().candidate_merges(plan)]
    assert pairs == [("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d"), ("d", "e")]
    pairs = [(x.name, y.name) for x, y in RuleLegality(FusionOptions(disabled=frozenset({"horizontal"})))
             .candidate_merges(plan)]
    assert pairs == [("a", "d"), ("b", "d"), ("d", "e")]


def test_candidate_merges_look_past_constants():
    """a = Add(x, k) with a constant k; c and d read a: the siblings of a are found after the constant."""
    b = GraphBuilder("const")
    x = b.input("x", (4, 4))
    a = b.op("Add", x, b.const("k", np.ones((4, 4), np.float32)), name="a")
    g = b.build(b.op("Relu", a, name="c"), b.op("Neg", a, name="d"))
    pairs = [(p.name, q.name) for p, q in PlanLegality(unfused_plan(g)).candidate_merges()]
    assert pairs == [("a", "c"), ("a", "d"), ("c", "d")]


def test_rule_legality_check_group_and_describe():
    g = _conv_concat()
    n = {v.name: v for v in g.nodes}
    legal = RuleLegality(FusionOptions(disabled=frozenset({"concat_alias", "epilogue"})))
    assert legal.check_group(g, [n["cat"]]) is None  # one op is always a kernel, whatever is disabled
    assert legal.check_group(g, [n["c1"], n["r1"]]) == "disabled by user: rule 'epilogue' is disabled"
    assert legal.check_group(g, [n["c2"], n["cat"]]) == (
        "category forbids: 'cat' (Concat, injective) cannot follow 'c2' (Conv) in its kernel: only elementwise ops "
        "form an epilogue")
    assert legal.describe(g, [n["c1"], n["r1"]]) == ("conv_epilogue", n["c1"])
    x = GraphBuilder("chain")
    v = x.input("x", (4,))
    chain = x.build(x.op("Neg", x.op("Relu", v, name="relu"), name="neg"))
    kind, anchor = legal.describe(chain, list(chain.nodes))
    assert (kind, anchor.name) == ("elementwise", "relu")  # no anchor op: the first node
    with pytest.raises(ModelError, match="^not a legal kernel: category forbids: 'cat' \\(Concat"):
        legal.describe(g, [n["c2"], n["cat"]])


# siblings.node_set_shape: the horizontal shape of any node set (the planner's and annotate_plan's path) -------

def _siblings_graph():
    """x -> y = Relu; y -> p0, p1 = MaxPool 3x3; y -> a5 = AveragePool 5x5; y -> r = Sigmoid -> n = Neg; y -> e = Exp;
    d = Add(y, Neg(r)) (a path from r to d); z -> q = Abs (another input)."""
    b = GraphBuilder("siblings")
    x, z = b.input("x", (1, 2, 8, 8)), b.input("z", (1, 2, 8, 8))
    y = b.op("Relu", x, name="y")
    pools = [b.op("MaxPool", y, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], name=f"p{i}") for i in (0, 1)]
    a5 = b.op("AveragePool", y, kernel_shape=[5, 5], strides=[1, 1], pads=[2, 2, 2, 2], name="a5")
    r = b.op("Sigmoid", y, name="r")
    n = b.op("Neg", r, name="n")
    d = b.op("Add", y, b.op("Neg", r, name="m"), name="d")
    return b.build(*pools, a5, n, d, b.op("Exp", y, name="e"), b.op("Abs", z, name="q"))


def test_node_set_shape_of_siblings():
    from opfuse.rules.siblings import node_set_shape
    g = _siblings_graph()
    n = {v.name: v for v in g.nodes}
    s = node_set_shape(g, [n["p1"], n["p0"]])  # any order: the kernel follows the graph's
    assert (s.kind, s.anchor.name) == ("horizontal", "p0")
    assert {k: v for k, v in s.attrs.items() if k != "domain"} == {
        "members": [["p0"], ["p1"]], "member_kinds": ["single", "single"], "shared_input": "y"}
    assert s.attrs["domain"][:3] == ("window", (1, 2, 8, 8), (1, 2, 8, 8))
    assert ("kernel_shape", (3, 3)) in s.attrs["domain"][3]
    s = node_set_shape(g, [n["r"], n["n"], n["e"]])  # an elementwise chain and an op: no anchor op
    assert (s.kind, s.anchor.name) == ("horizontal", "r")
    assert s.attrs == {"members": [["r", "n"], ["e"]], "member_kinds": ["elementwise", "single"],
                       "shared_input": "y", "domain": ("elementwise", (1, 2, 8, 8))}
    assert node_set_shape(g, [n["r"], n["n"]]).kind == "elementwise"  # one component: a vertical kernel


def test_node_set_shape_refusals():
    from opfuse.rules.siblings import node_set_shape
    g = _siblings_graph()
    n = {v.name: v for v in g.nodes}

    def why(names, **options):
        r = node_set_shape(g, [n[k] for k in names], FusionOptions(**options))
        return r.kind, r.reason

    assert why(["p0", "a5"]) == (RefusalKind.CONDITION, "the siblings iterate over different domains "
                                                        "(window or shape differ)")
    assert why(["e", "q"]) == (RefusalKind.CONDITION, "the sibling kernels share no input")
    assert why(["r", "d"]) == (RefusalKind.DEPENDENCY, "a path connects the siblings (they are not independent)")
    assert why(["p0", "p1", "e"], max_horizontal_members=2) == (RefusalKind.RESOURCE,
                                                                 "3 siblings exceed the limit of 2")
    # within the limit the three are refused for their domains (two windows and an elementwise loop)
    assert why(["p0", "p1", "e"], max_horizontal_members=3)[1].startswith("the siblings iterate over different")
    assert node_set_shape(g, [n["p0"], n["p1"]], FusionOptions(max_horizontal_members=2)).kind == "horizontal"
    assert why(["p0", "p1"], max_ops_per_group=1) == (RefusalKind.RESOURCE, "2 ops exceed the limit of 1 per kernel")


def test_member_domains_of_pooling_epilogues_broadcasts_and_convs():
    from opfuse.rules.siblings import node_set_shape
    b = GraphBuilder("domains")
    v = b.input("v", (1, 2, 8, 8))
    u = b.input("u", (8, 8))
    w = b.const("w", np.ones((1, 2, 8, 8), np.float32))
    p0 = b.op("Relu", b.op("MaxPool", v, kernel_shape=[2, 2], strides=[2, 2], name="p0"), name="r0")
    p1 = b.op("Neg", b.op("MaxPool", v, kernel_shape=[2, 2], strides=[2, 2], name="p1"), name="n1")
    wide = b.op("Add", b.op("Relu", u, name="ru"), w, name="wide")  # (8, 8) grows to (1, 2, 8, 8)
    g = b.build(p0, p1, wide, b.op("Neg", u, name="nu"),
                b.op("Conv", v, b.const("k", randn((2, 2, 1, 1))), name="conv"), b.op("Exp", v, name="ev"))
    n = {x.name: x for x in g.nodes}
    s = node_set_shape(g, [n["p0"], n["r0"], n["p1"], n["n1"]])  # poolings with an epilogue share their window
    assert (s.kind, s.attrs["member_kinds"]) == ("horizontal", ["reduction", "reduction"])
    assert s.attrs["domain"][:3] == ("window", (1, 2, 8, 8), (1, 2, 4, 4))
    # an elementwise member iterates over its largest output, (1, 2, 8, 8), not the (8, 8) of Neg(u)
    r = node_set_shape(g, [n["ru"], n["wide"], n["nu"]])
    assert r.reason == "the siblings iterate over different domains (window or shape differ)"
    r = node_set_shape(g, [n["conv"], n["ev"]])
    assert (r.kind, r.reason) == (RefusalKind.CONDITION,
                                  "'conv' (single) has no shared iteration domain: only poolings/reductions over one "
                                  "window and elementwise loops fuse horizontally")


def test_rule_legality_merge_refusal_texts():
    plan = unfused_plan(_fan())
    by = {gr.name: gr for gr in plan.groups}
    legal = RuleLegality(FusionOptions(disabled=frozenset({"elementwise_chain"})))
    r = legal.merge_refusal(plan, by["a"], by["a"])
    assert (r.kind, r.reason) == (RefusalKind.CONDITION, "a group cannot merge with itself")
    assert str(legal.merge_refusal(plan, by["a"], by["d"])) == "disabled by user: rule 'elementwise_chain' is disabled"
    assert legal.merge_refusal(plan, by["a"], by["b"]) is None


def test_rule_legality_proposes_the_candidates_of_its_own_graph_only():
    g = _fan()
    plan, _ = plan_of(g)
    assert any(len(gr.nodes) > 1 for gr in plan.groups)
    assert RuleLegality().proposed_groups(g) == []
    assert RuleLegality(candidates=plan).proposed_groups(_fan()) == []  # another graph object
    assert [[v.name for v in grp] for grp in RuleLegality(candidates=plan).proposed_groups(g)] == \
        [[v.name for v in gr.nodes] for gr in plan.groups if len(gr.nodes) > 1]
