"""The legality interface the planner uses, and the plan checks."""
import pytest

from opfuse import zoo
from opfuse.errors import ModelError
from opfuse.passes import fuse
from opfuse.rules import FusionOptions, PlanLegality, unfused_plan, verify_plan
from opfuse.rules.legality import RuleLegality, annotate_plan
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from fusion_cases import randn


def chain():
    """x -> conv1 -> relu1 -> conv2 -> add(., x) -> relu2, plus relu1 -> neg (escaping branch)."""
    b = GraphBuilder("chain")
    x = b.input("x", (1, 4, 5, 5))
    r1 = b.op("Relu", b.op("Conv", x, b.const("w1", randn((4, 4, 1, 1))), name="conv1"), name="relu1")
    c2 = b.op("Conv", r1, b.const("w2", randn((4, 4, 1, 1), 1)), name="conv2")
    y = b.op("Relu", b.op("Add", c2, x, name="add"), name="relu2")
    return b.build(y, b.op("Neg", r1, name="neg"))


def groups_by_name(plan):
    return {g.name: g for g in plan.groups}


def test_can_merge_reasons_on_the_unfused_plan():
    legal = PlanLegality(unfused_plan(chain()))
    g = groups_by_name(legal.plan())
    assert legal.can_merge(g["conv1"], g["relu1"]) is None
    r = legal.can_merge(g["relu1"], g["conv2"])
    assert r.kind.label == "category forbids" and "epilogue, never a prologue" in r.reason
    r = legal.can_merge(g["conv1"], g["neg"])  # conv1 -> relu1 -> neg: not adjacent, no shared input
    assert r.kind.label == "rule refused" and "neither adjacent nor siblings" in r.reason
    r = legal.can_merge(g["conv2"], g["relu2"])  # conv2 -> add -> relu2: not adjacent
    assert "neither adjacent" in r.reason


def test_cycle_through_an_outside_node_is_refused():
    """A -> B -> C with B outside: A and C must not fuse (issue 3's cycle test, at plan level)."""
    b = GraphBuilder("abc")
    x = b.input("x", (4,))
    a = b.op("Relu", x, name="A")
    bb = b.op("Exp", a, name="B")
    c = b.op("Add", a, bb, name="C")
    plan = unfused_plan(b.build(c))
    g = groups_by_name(plan)
    assert "cycle" in RuleLegality().can_merge(plan, g["A"], g["C"])
    assert RuleLegality().can_merge(plan, g["A"], g["B"]) is None
    legal = PlanLegality(plan)
    g = groups_by_name(legal.plan())
    assert legal.can_merge(g["A"], g["C"]).kind.label == "cycle"


def test_resource_limit_and_disabled_rule_in_can_merge():
    plan = unfused_plan(chain())
    g = groups_by_name(plan)
    assert "resource limit" in RuleLegality(FusionOptions(max_ops_per_group=1)).can_merge(plan, g["conv1"], g["relu1"])
    assert RuleLegality(FusionOptions(disabled=frozenset({"epilogue"}))).can_merge(
        plan, g["conv1"], g["relu1"]).startswith("disabled by user")


def test_candidate_merges_and_merge_keep_a_valid_plan():
    legal = PlanLegality(unfused_plan(chain()))
    merged = 0
    while True:
        pairs = [(a, b) for a, b in legal.candidate_merges() if legal.can_merge(a, b) is None]
        if not pairs:
            break
        legal.merge(*pairs[0])
        merged += 1
        verify_plan(annotate_plan(legal.plan()))
    assert merged >= 2
    kinds = sorted(g.kind for g in legal.plan().groups)
    assert "conv_epilogue" in kinds


def test_rule_legality_protocol_for_the_planner():
    g, plan, _ = fuse(zoo.load("bert_layer"))
    legal = RuleLegality(candidates=plan)
    att = next(gr for gr in plan.groups if gr.kind == "attention")
    assert legal.check_group(g, att.nodes) is None
    assert legal.describe(g, att.nodes) == ("attention", att.anchor)
    assert sorted(len(x) for x in legal.proposed_groups(g)) == sorted(len(gr.nodes) for gr in plan.groups
                                                                       if len(gr.nodes) > 1)
    ffn1 = next(gr for gr in plan.groups if "Gelu" in gr.op_types)
    ffn2 = next(n for n in g.nodes if n.op_type == "MatMul" and n.inputs[0] is ffn1.nodes[-1].output)
    assert "(no Conv -> Conv)" in legal.check_group(g, ffn1.nodes + [ffn2])
    assert legal.check_group(g, [n for n in g.nodes if n.op_type == "LayerNormalization"]) is not None
    assert all(legal.can_merge(plan, a, b) is None for a, b in legal.candidate_merges(plan))


def test_annotate_plan_reproduces_the_builder_plan():
    g, plan, _ = fuse(zoo.load("yolo_block"))
    again = annotate_plan(FusionPlan(g, [FusionGroup(gr.name, list(gr.nodes)) for gr in plan.groups]))
    assert [(x.kind, x.attrs.get("zero_copy")) for x in again.groups] == \
        [(x.kind, x.attrs.get("zero_copy")) for x in plan.groups]


def test_verify_plan_catches_broken_plans():
    g = chain()
    plan = unfused_plan(g)
    verify_plan(plan)
    missing = FusionPlan(g, plan.groups[1:])
    with pytest.raises(ModelError, match="not in any fusion group"):
        verify_plan(missing)
    stale = unfused_plan(g)
    stale.groups[0].attrs["outputs"] = []
    with pytest.raises(ModelError, match="boundary is stale"):
        verify_plan(stale)
    nodes = {n.name: n for n in g.nodes}
    bad = [FusionGroup("bad", [nodes["relu1"], nodes["conv2"]], "conv_epilogue", nodes["conv2"])]
    bad += [FusionGroup(n.name, [n], "single", n) for n in g.nodes if n.name not in ("relu1", "conv2")]
    with pytest.raises(ModelError):
        verify_plan(FusionPlan(g, bad))


def test_horizontal_group_grows_only_with_siblings_of_its_shared_input():
    b = GraphBuilder("siblings")
    x, y, z = b.input("x", (4,)), b.input("y", (4,)), b.input("z", (4,))
    g = b.build(b.op("Add", x, y, name="A"), b.op("Mul", y, z, name="M"), b.op("Sub", x, z, name="S"))
    legal = PlanLegality(unfused_plan(g))
    groups = groups_by_name(legal.plan())
    h = legal.merge(groups["A"], groups["M"])  # both read y
    assert h.kind == "horizontal" and h.attrs["shared_input"] == "y"
    r = legal.can_merge(h, groups_by_name(legal.plan())["S"])  # S shares x with A only
    assert "'M' does not read 'x'" in r.reason
