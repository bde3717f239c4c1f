"""The rewrite engine (``rules.resolve``) step by step, each expectation worked out by hand from its docstring and
the seed's greedy (7.2.3: ``score = benefit / cost * priority``; ties by size, then rule order, then graph
position; overlap, resource and dependency conflicts; every attempt one decision). Found by mutation testing
(tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import ModelError
from opfuse.ops import GraphBuilder
from opfuse.patterns import Op
from opfuse.rules import FusionOptions, Replacement, Rule, apply_rules
from opfuse.rules.rule import Fuse, refuse
from rule_helpers import RESOLVE_SHAPE, chain, summary, to_op

SHAPE = RESOLVE_SHAPE  # float32: 32 bytes a value


def two_chains():
    """Two independent chains Relu -> Sigmoid: a0 -> a1 and b0 -> b1 (a first in the graph)."""
    b = GraphBuilder("two")
    x = b.input("x", SHAPE)
    a = b.op("Sigmoid", b.op("Relu", x, name="a0"), name="a1")
    c = b.op("Sigmoid", b.op("Relu", x, name="b0"), name="b1")
    return b.build(a, c)


def one(m) -> float:
    return 1.0


def test_the_higher_score_wins_and_the_overlapping_match_is_refused():
    g = chain("Relu", "Sigmoid", "Tanh")
    rs = Rule("rs", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))
    st = Rule("st", Op("Sigmoid") >> Op("Tanh"), action=to_op("Abs"), priority=2)
    seen = []
    out = apply_rules(g, [rs, st], pass_name="p", record=seen.append)
    # each match keeps one 32-byte value inside: benefit 2 * 32, cost 2 ops -> 32, times the priority
    assert summary(out) == [
        ("st", "rewritten", ("c1", "c2"), "", "replaced by Abs 'c2_abs'", 64.0),
        ("rs", "refused", ("c0", "c1"), "overlap", "node 'c1' was rewritten by rule 'st'", 32.0)]
    assert seen == out.decisions and all(d.pass_name == "p" for d in seen)
    assert [n.op_type for n in g.nodes] == ["Relu", "Abs"]
    assert out.rewrites == 1 and out.modified
    assert (out.stats["st"].applied, out.stats["st"].refused, out.stats["st"].matches) == (1, 0, 1)
    assert (out.stats["rs"].applied, out.stats["rs"].refused, out.stats["rs"].matches) == (0, 1, 1)


def test_nothing_matched_is_not_modified():
    g = chain("Relu", "Exp")
    out = apply_rules(g, [Rule("st", Op("Sigmoid") >> Op("Tanh"), action=to_op("Abs"))])
    assert out.decisions == [] and out.rewrites == 0 and not out.modified
    assert out.stats["st"].matches == 0 and out.stats["st"].attempts == 0


def test_equal_scores_go_to_the_larger_match_then_the_earlier_rule():
    g = chain("Relu", "Sigmoid", "Tanh")
    two = Rule("two", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"), benefit=one, cost=one)
    three = Rule("three", Op("Relu") >> Op("Sigmoid") >> Op("Tanh"), action=to_op("Abs"), benefit=one, cost=one)
    out = apply_rules(g, [two, three])
    assert [(d.rule, d.verdict) for d in out.decisions] == [("three", "rewritten"), ("two", "refused")]
    assert out.decisions[0].reason == "replaced by Abs 'c2_abs'"
    g = chain("Relu", "Sigmoid")
    first = Rule("first", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"), benefit=one, cost=one)
    second = Rule("second", Op("Relu") >> Op("Sigmoid"), action=to_op("Abs"), benefit=one, cost=one)
    out = apply_rules(g, [second, first])
    assert [(d.rule, d.verdict, d.kind) for d in out.decisions] == [("second", "rewritten", ""),
                                                                    ("first", "refused", "overlap")]
    assert out.decisions[1].reason == "node 'c0' was rewritten by rule 'second'"


def test_the_cost_has_a_floor_and_the_score_is_benefit_over_cost_times_priority():
    g = chain("Relu", "Sigmoid")
    r = Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"), benefit=lambda m: 6.0,
             cost=lambda m: 0.25, priority=3)
    (d,) = apply_rules(g, [r]).decisions
    assert d.score == 18.0   # 6 / max(1, 0.25) * 3


def test_ties_in_score_and_size_go_by_graph_position():
    g = two_chains()
    r = Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))
    out = apply_rules(g, [r])
    assert [(d.nodes, d.reason) for d in out.decisions] == [(("a0", "a1"), "replaced by Neg 'a1_neg'"),
                                                           (("b0", "b1"), "replaced by Neg 'b1_neg'")]
    assert out.rewrites == 2 and out.stats["r"].applied == 2


def test_the_new_op_is_named_after_the_replacement_or_the_replaced_output():
    g = chain("Relu", "Sigmoid")
    (d,) = apply_rules(g, [Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg", name="fused"))]).decisions
    assert d.reason == "replaced by Neg 'fused_neg'"
    assert [n.name for n in g.nodes] == ["fused_neg"]


def test_a_disabled_rule_refuses_every_match_and_applies_none():
    g = two_chains()
    r = Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))
    out = apply_rules(g, [r], disabled={"r"})
    assert summary(out) == [("r", "refused", ("a0", "a1"), "disabled", "rule 'r' is disabled", None),
                            ("r", "refused", ("b0", "b1"), "disabled", "rule 'r' is disabled", None)]
    assert (out.stats["r"].matches, out.stats["r"].refused, out.stats["r"].applied) == (2, 2, 0)
    assert [n.op_type for n in g.nodes] == ["Relu", "Sigmoid", "Relu", "Sigmoid"]
    # another rule is not disabled by it
    out = apply_rules(g, [r], disabled={"other"})
    assert out.rewrites == 2


def test_a_condition_refusal_is_recorded_and_other_matches_go_on():
    g = two_chains()
    r = Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"),
             condition=lambda m: "not a" if m.nodes[0].name == "a0" else None)
    out = apply_rules(g, [r])
    assert summary(out) == [("r", "refused", ("a0", "a1"), "condition", "not a", None),
                            ("r", "rewritten", ("b0", "b1"), "", "replaced by Neg 'b1_neg'", 32.0)]
    assert (out.stats["r"].matches, out.stats["r"].refused, out.stats["r"].applied) == (2, 1, 1)


def test_a_refusal_naming_a_culprit_bans_every_match_holding_it_and_smaller_ones_come_forward():
    g = chain("Relu", "Relu", "Relu", "Relu")
    r = Rule("relus", Op("Relu").plus(), action=to_op("Neg"),
             condition=lambda m: refuse("c3 may not", m.nodes[-1]) if m.nodes[-1].name == "c3" else None)
    out = apply_rules(g, [r])
    assert [(d.verdict, d.nodes) for d in out.decisions] == [("refused", ("c0", "c1", "c2", "c3")),
                                                            ("rewritten", ("c0", "c1", "c2"))]
    assert [n.op_type for n in g.nodes] == ["Neg", "Relu"]


def test_a_resource_conflict_is_refused_and_sub_matches_are_offered():
    g = chain("Relu", "Relu", "Relu")
    r = Rule("relus", Op("Relu").plus(), action=to_op("Neg"))
    out = apply_rules(g, [r], limits=FusionOptions(max_group_inputs=0))
    assert [(d.verdict, d.kind, d.reason) for d in out.decisions][0] == \
        ("refused", "resource", "1 distinct inputs exceed the limit of 0")
    assert out.rewrites == 0 and all(d.kind == "resource" for d in out.decisions)
    assert len(out.decisions) > 1  # the sub-chains were offered too, and refused for the same reason
    # a group-size limit: the chain is offered as windows that fit
    g = chain("Relu", "Relu", "Relu")
    out = apply_rules(g, [r], limits=FusionOptions(max_ops_per_group=2))
    assert out.decisions[0].verdict == "rewritten" and len(out.decisions[0].nodes) == 2


def test_a_dependency_conflict_is_refused_with_the_cycle():
    # a = Relu(x); b = Exp(a); c = Mul(a, b): the match {a, c} (a kept) leaves through b and comes back
    b = GraphBuilder("cycle")
    x = b.input("x", SHAPE)
    a = b.op("Relu", x, name="a")
    g = b.build(b.op("Mul", a, b.op("Exp", a, name="b"), name="c"))
    r = Rule("ra", Op("Relu").keep() >> Op("Mul"), action=to_op("Neg"))
    (d,) = apply_rules(g, [r]).decisions
    assert (d.verdict, d.kind, d.reason) == ("refused", "dependency", "fusing would create a cycle: 'a' -> 'b' -> "
                                                                      "'c' leaves the group and comes back")
    assert d.score == 0.0   # a's output is read by b, outside: nothing stays inside
    assert [n.op_type for n in g.nodes] == ["Relu", "Exp", "Mul"]


def test_a_rewrite_that_returns_nothing_is_declined():
    g = chain("Relu", "Sigmoid")
    (d,) = apply_rules(g, [Rule("none", Op("Relu"), action=lambda m: None)]).decisions
    assert (d.verdict, d.kind, d.reason) == ("refused", "rewrite", "rule 'none' produced no replacement")


def test_rule_sets_must_have_unique_names_and_rewrite_rules_only():
    r = Rule("r", Op("Relu"), action=to_op("Neg"))
    with pytest.raises(ValueError, match=r"rule names must be unique, repeated: \['r'\]"):
        apply_rules(chain("Relu"), [r, Rule("s", Op("Exp"), action=to_op("Neg")), Rule("r", Op("Exp"))])
    f = Rule("grouping", Op("Relu"), action=Fuse(lambda grouping, matches: iter(())))
    with pytest.raises(ValueError, match=r"fusion rules \['grouping'\] run in opfuse.rules.driver"):
        apply_rules(chain("Relu"), [r, f])


def test_a_rewrite_loop_stops_after_four_rewrites_per_node():
    g = chain("Relu", "Relu")   # two nodes: 8 rewrites allowed, the ninth stops it
    n = []

    def again(m):
        n.append(1)
        return Replacement("Relu", [m.nodes[0].inputs[0]])
    with pytest.raises(ModelError, match="did not reach a fixed point after 9 rewrites"):
        apply_rules(g, [Rule("again", Op("Relu"), action=again)])
    assert len(n) == 9


def test_stats_count_attempts_matches_and_time():
    g = two_chains()
    out = apply_rules(g, [Rule("r", Op("Relu") >> Op("Sigmoid"), action=to_op("Neg"))])
    st = out.stats["r"]
    assert st.attempts >= 2 and st.matches == 2 and st.seconds > 0.0
    assert np.isfinite(st.seconds)
