"""The greedy resolver: score order, tie-breaks, determinism, bookkeeping, plans, rewrites."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import ModelError
from opfuse.ir.graph import Graph, TensorType
from opfuse.ir.plan import FusionGroup
from opfuse.ops import GraphBuilder
from opfuse.patterns import Op
from opfuse.rules import Replacement, Rule, apply_rules, build_plan, fusion_rules, recognition_rules
from opfuse.rules.elementwise import ELEMENTWISE_CHAIN

SHAPE = (2, 4)
T = TensorType(SHAPE, np.float32)


def relu_sig_tanh():
    b = GraphBuilder("rst")
    x = b.input("x", SHAPE)
    return b.build(b.op("Tanh", b.op("Sigmoid", b.op("Relu", x, name="r"), name="s"), name="t"))


def test_score_is_benefit_over_cost_times_priority():
    g = relu_sig_tanh()
    pair = Rule("pair", Op("Relu") >> Op("Sigmoid"), benefit=lambda m: 10.0, cost=lambda m: 4.0, priority=3.0)
    out = apply_rules(g, [pair])
    (d,) = out.decisions
    assert d.score == pytest.approx(10.0 / 4.0 * 3.0)


def test_higher_score_wins_and_ties_prefer_larger_then_rule_order():
    g = relu_sig_tanh()
    first = Rule("first", Op("Relu") >> Op("Sigmoid"), benefit=lambda m: 1.0, cost=lambda m: 1.0)
    second = Rule("second", Op("Sigmoid") >> Op("Tanh"), benefit=lambda m: 1.0, cost=lambda m: 1.0)
    out = apply_rules(g, [second, first])
    taken = [(d.rule, d.nodes) for d in out.decisions if d.taken]
    assert taken == [("second", ("s", "t"))]            # equal score and size: rule order decides
    boosted = Rule("first", Op("Relu") >> Op("Sigmoid"), benefit=lambda m: 1.0, cost=lambda m: 1.0, priority=2)
    out = apply_rules(relu_sig_tanh(), [second, boosted])
    assert [(d.rule, d.nodes) for d in out.decisions if d.taken] == [("first", ("r", "s"))]
    triple = Rule("triple", Op("Relu") >> Op("Sigmoid") >> Op("Tanh"), benefit=lambda m: 1.0, cost=lambda m: 1.0)
    out = apply_rules(relu_sig_tanh(), [second, triple])
    assert [(d.rule, d.nodes) for d in out.decisions if d.taken] == [("triple", ("r", "s", "t"))]


def test_every_offered_match_gets_exactly_one_decision():
    from opfuse import zoo
    g = zoo.load("resnet8")
    out = apply_rules(g, fusion_rules())
    for name, st in out.stats.items():
        ds = [d for d in out.decisions if d.rule == name]
        assert len(ds) == st.matches == st.applied + st.refused, name
        assert all(d.reason for d in ds if not d.taken), name
    seen = set()
    for d in out.decisions:
        key = (d.rule, frozenset(d.nodes))
        assert key not in seen
        seen.add(key)


def test_runs_are_deterministic():
    from opfuse import zoo
    runs = []
    for _ in range(2):
        g = zoo.load("bert_layer")
        a = apply_rules(g, recognition_rules())
        b = apply_rules(g, fusion_rules())
        runs.append(([d.to_dict() for d in a.decisions + b.decisions], str(g)))
    assert runs[0] == runs[1]


def test_disabled_rule_is_recorded_not_applied():
    g = relu_sig_tanh()
    out = apply_rules(g, [ELEMENTWISE_CHAIN], disabled={"elementwise_chain"})
    (d,) = out.decisions
    assert (d.verdict, d.kind, d.reason) == ("refused", "disabled", "rule 'elementwise_chain' is disabled")
    assert out.groups == []


def test_a_declining_rewrite_is_refused_with_its_reason():
    g = relu_sig_tanh()
    bad = Rule("to_cast", Op("Relu"), action=lambda m: Replacement("Cast", [m.nodes[0].inputs[0]], {"to": 7}))
    before = str(g)
    out = apply_rules(g, [bad])
    (d,) = out.decisions
    assert d.kind == "rewrite" and d.reason == "Cast infers int64[2,4], the match produced float32[2,4]"
    assert str(g) == before
    declines = Rule("declines", Op("Relu"), action=lambda m: "not today")
    (d,) = apply_rules(g, [declines]).decisions
    assert (d.kind, d.reason) == ("rewrite", "not today")


def test_rewrites_that_never_settle_raise():
    g = relu_sig_tanh()
    loop = Rule("relu_again", Op("Relu"), action=lambda m: Replacement("Relu", [m.nodes[0].inputs[0]]))
    with pytest.raises(ModelError, match="did not reach a fixed point"):
        apply_rules(g, [loop])


def test_duplicate_rule_names_are_rejected():
    with pytest.raises(ValueError, match="unique"):
        apply_rules(relu_sig_tanh(), [ELEMENTWISE_CHAIN, ELEMENTWISE_CHAIN])


def test_build_plan_orders_groups_topologically():
    # a -> b, and d (in a's group) comes after b in node order: the group {a, d} must still
    # come first, because b reads a.
    g = Graph("order")
    x = g.add_input("x", SHAPE)
    a = g.add_node("Relu", [x], name="a", output_types=[T])
    b = g.add_node("Exp", [a.outputs[0]], name="b", output_types=[T])
    d = g.add_node("Sigmoid", [a.outputs[0]], name="d", output_types=[T])
    g.outputs = [b.outputs[0], d.outputs[0]]
    plan = build_plan(g, [FusionGroup("ad", [a, d], "test", a)])
    assert [gr.name for gr in plan.groups] == ["ad", "b"]
    assert plan.num_kernels == 2


def test_group_names_are_unique_and_carry_the_rule():
    from opfuse import zoo
    g = zoo.load("mobilenet_v1_025_96")
    out = apply_rules(g, fusion_rules())
    names = [gr.name for gr in out.groups]
    assert len(names) == len(set(names)) == 27
    assert all(n.startswith("conv_bn_act_") and gr.kind == "conv_epilogue" and gr.anchor.op_type == "Conv"
               for n, gr in zip(names, out.groups))
    plan = build_plan(g, out.groups)
    plan.verify()
    assert plan.num_kernels == len(g.nodes) - 2 * 27
