"""The indexed legality answers exactly as the plain reference (``reference_legality``) does.

The planner asks ``RuleLegality`` tens of thousands of questions per graph, so every query
shares per-graph indexes (positions, reachability masks, an incrementally kept group graph
and rank). These tests check, on random graphs, the zoo and the planner's synthetic graphs,
that no answer changed: node-set legality, merge refusals, cycle checks, plan order, and the
rule-based builder's plans and decisions.
"""
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from opfuse import zoo
from opfuse.passes import fuse
from opfuse.rules import FusionOptions, PlanLegality, unfused_plan

from opfuse.rules import driver as builder_module
from opfuse.rules import form_groups, fusion_rules
from opfuse.rules.decisions import Refusal
from opfuse.rules.graph_index import GraphIndex
from opfuse.rules.partition import Partition
from opfuse.rules.legality import RuleLegality
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.planner.synthetic import synthetic_graph
import reference_legality as ref
from random_graphs import random_graphs

EQUIVALENCE = settings(max_examples=40, deadline=None, derandomize=True,
                       suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
MAX_SET_SIZE = 4  # node sets grown up to this size ...
MAX_SETS = 400  # ... at most this many per graph
OPTION_SETS = (FusionOptions(), FusionOptions(max_ops_per_group=3, max_horizontal_members=2,
                                              disabled=frozenset({"epilogue", "horizontal"})))


def neighbours(node):
    """Producers, consumers and siblings reading one non-constant value."""
    out = [v.producer for v in node.input_values() if v.producer is not None]
    out += [u for v in node.outputs for u, _ in v.uses]
    out += [u for v in node.input_values() if not v.is_const for u, _ in v.uses]
    return out


def node_sets(graph):
    """Connected-or-sibling node sets up to ``MAX_SET_SIZE`` nodes, breadth first, each once."""
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    seen, out = set(), []
    frontier = [(n,) for n in graph.nodes]
    while frontier and len(out) < MAX_SETS:
        nxt = []
        for s in frontier:
            key = tuple(sorted(order[id(n)] for n in s))
            if key in seen:
                continue
            seen.add(key)
            out.append(list(s))
            if len(s) < MAX_SET_SIZE:
                nxt += [s + (m,) for n in s for m in neighbours(n) if all(m is not x for x in s)]
        frontier = nxt
    return out[:MAX_SETS]


def same_shape(got, want) -> bool:
    if isinstance(want, Refusal):
        return got == want
    return (not isinstance(got, Refusal) and (got.kind, got.anchor) == (want.kind, want.anchor)
            and got.attrs == want.attrs)


def check_node_sets(graph):
    for options in OPTION_SETS:
        legal = RuleLegality(options)  # one instance: every query reuses its index
        for nodes in node_sets(graph):
            names = [n.name for n in nodes]
            assert legal.check_group(graph, nodes) == ref.check_group(graph, nodes, options), names
            if len(nodes) > 1:
                assert same_shape(legal.shape(graph, nodes), ref.node_set_shape(graph, nodes, options)), names


@EQUIVALENCE
@given(random_graphs(max_ops=10))
def test_node_set_legality_matches_the_reference(g):
    note(str(g))
    check_node_sets(g)


@pytest.mark.parametrize("name", ["bert_layer", "yolo_block", "resnet8"])
def test_node_set_legality_matches_the_reference_on_zoo_models(name):
    check_node_sets(zoo.load(name))


def sibling_pools():
    """Poolings of one input whose windows differ in one attribute only, with equal output shapes
    (kernel 2 and 3 with stride 4 over 8 both give 2 outputs), next to an identical pair."""
    b = GraphBuilder("sibling_pools")
    x = b.input("x", (1, 2, 8, 8))
    outs = [b.op("MaxPool", x, kernel_shape=[2, 2], strides=[4, 4], name="k2"),
            b.op("MaxPool", x, kernel_shape=[3, 3], strides=[4, 4], name="k3"),
            b.op("MaxPool", x, kernel_shape=[2, 2], strides=[4, 4], name="k2_again"),
            b.op("AveragePool", x, kernel_shape=[3, 3], strides=[4, 4], name="avg_k3"),
            b.op("MaxPool", x, kernel_shape=[2, 2], strides=[4, 4], pads=[1, 1, 0, 0], name="k2_padded"),
            b.op("MaxPool", x, kernel_shape=[2, 2], strides=[4, 4], dilations=[2, 2], name="k2_dilated"),
            b.op("ReduceMax", x, axes=[2], keepdims=1, name="rmax2"),
            b.op("ReduceMax", x, axes=[3], keepdims=1, name="rmax3")]
    return b.build(*outs)


def test_node_set_legality_matches_the_reference_on_sibling_windows():
    g = sibling_pools()
    check_node_sets(g)
    n = {node.name: node for node in g.nodes}
    assert ref.check_group(g, [n["k2"], n["k2_again"]]) is None
    assert ref.check_group(g, [n["k3"], n["avg_k3"]]) is None
    for other in ("k3", "k2_padded", "k2_dilated"):
        assert "different domains" in ref.check_group(g, [n["k2"], n[other]])


def test_node_set_legality_matches_the_reference_on_a_synthetic_graph():
    check_node_sets(synthetic_graph(120, seed=3))


@EQUIVALENCE
@given(random_graphs(max_ops=10))
def test_reachability_masks_and_walk_agree_with_a_plain_walk(g):
    masks, walk = GraphIndex(g), GraphIndex(g, bitset_max_nodes=0)
    sets = node_sets(g)[:60]
    for src in sets:
        for dst in sets[:20]:
            want = ref.reaches(src, dst)
            assert masks.reaches(src, dst) == want and walk.reaches(src, dst) == want


@EQUIVALENCE
@given(random_graphs(max_ops=8), st.lists(st.integers(0, 10 ** 6), min_size=1, max_size=10))
def test_partition_and_merge_answers_match_the_reference_along_random_merges(g, picks):
    """After every merge: cycle checks, plan order and merge refusals are the brute-force ones."""
    note(str(g))
    legal = PlanLegality(unfused_plan(g))
    rules = RuleLegality()
    p = legal.partition
    for pick in picks + [None]:
        gids, groups = sorted(p.members), [p.members[x] for x in sorted(p.members)]
        order = p.groups_in_order()
        assert order == [gids[k] for k in ref.groups_in_order(groups, p.order)]
        assert sorted(gids, key=p.order_key) == order
        for i, a in enumerate(gids):
            for b in gids[i + 1:]:
                assert p.creates_cycle([a, b]) == ref.contraction_creates_cycle(
                    groups, {gids.index(a), gids.index(b)}), (p.members[a], p.members[b])
        plan = legal.plan()
        for a in plan.groups:
            for b in plan.groups:
                if a is not b:
                    assert rules.merge_refusal(plan, a, b) == ref.merge_refusal(plan, a, b), (a, b)
        pairs = [(a, b) for a, b in legal.candidate_merges() if legal.can_merge(a, b) is None]
        if pick is None or not pairs:
            break
        a, b = pairs[pick % len(pairs)]
        note(f"merge {a.name} ({a.kind}) + {b.name} ({b.kind})")
        legal.merge(a, b)


def plan_summary(plan):
    return [(g.name, g.kind, [n.name for n in g.nodes], sorted(g.attrs.items())) for g in plan.groups]


def assert_builder_unchanged(graph):
    plan, decisions = form_groups(graph, fusion_rules())
    with mock.patch.object(builder_module, "Partition", ref.ReferencePartition):
        want_plan, want_decisions = form_groups(graph, fusion_rules())
    assert plan_summary(plan) == plan_summary(want_plan)
    assert decisions == want_decisions


@EQUIVALENCE
@given(random_graphs(max_ops=10))
def test_builder_plans_and_decisions_match_the_reference_partition(g):
    note(str(g))
    assert_builder_unchanged(fuse(g)[0])


@pytest.mark.parametrize("name", zoo.list_models())
def test_builder_matches_the_reference_partition_on_zoo_models(name):
    assert_builder_unchanged(fuse(zoo.load(name))[0])


def test_plan_order_follows_the_group_graph_when_first_nodes_disagree():
    """Group {a, c} starts before group {b} but reads it: the plan order puts {b} first."""
    b = GraphBuilder("inverted")
    x = b.input("x", (4,))
    a = b.op("Relu", x, name="a")
    e = b.op("Exp", x, name="b")
    c = b.op("Add", e, x, name="c")
    g = b.build(a, c)
    n = {node.name: node for node in g.nodes}
    plan = FusionPlan(g, [FusionGroup("b", [n["b"]]), FusionGroup("a", [n["a"], n["c"]])])
    p = Partition.from_plan(plan)
    order = p.groups_in_order()
    assert [p.members[x][0].name for x in order] == ["b", "a"]
    assert sorted(p.members, key=p.order_key) == order
    assert [g.name for g in p.to_plan().groups] == ["b", "a"]


def test_rule_legality_reindexes_another_graph_and_an_edited_one():
    legal = RuleLegality()
    g1, g2 = synthetic_graph(40, seed=1), synthetic_graph(40, seed=2)
    for g in (g1, g2, g1):
        for nodes in node_sets(g)[:80]:
            assert legal.check_group(g, nodes) == ref.check_group(g, nodes)
    # Edit the graph: s now reads r through a new node u placed between them. The queried
    # nodes moved, so the index is rebuilt and the answers follow the edit.
    b = GraphBuilder("edit")
    x = b.input("x", (1, 4, 4, 4))
    b.op("Relu", x, name="r")
    b.op("Sigmoid", x, name="s")
    g = b.build(*[node.outputs[0] for node in b.graph.nodes])
    r, s = g.node("r"), g.node("s")
    assert legal.check_group(g, [r, s]) is None  # horizontal siblings on x
    u = g.add_node("Neg", [r.outputs[0]], name="u", output_types=[r.outputs[0].type], index=1)
    g.set_input(s, 0, u.outputs[0])
    for nodes in ([r, s], [r, u, s], [u, s]):
        assert legal.check_group(g, nodes) == ref.check_group(g, nodes)
    assert legal.check_group(g, [r, s]) is not None
