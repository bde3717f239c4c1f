"""Test doubles of the planner's legality protocol (``opfuse.planner.legality.Legality``).

The product has one legality, the fusion rules' (``opfuse.rules.legality.RuleLegality``); these
small stand-ins let the planner's tests pose problems the rules would not (a TVM-style category
rule set, subsets of a given plan, legality only as a whole).
"""
from __future__ import annotations

from typing import Sequence

from opfuse.cost.analysis import category_of, node_flops
from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ir.walk import components_within
from opfuse.ops.registry import Category
from opfuse.rules.partition import Partition


def anchor_of(nodes: Sequence[Node]) -> Node:
    """The op a kernel is built around: hardest category, then most FLOPs, then first."""
    best = max(range(len(nodes)), key=lambda i: (category_of(nodes[i]), node_flops(nodes[i]), -i))
    return nodes[best]


class LegalityRules:
    """Base class: plan-level questions answered from ``check_group``."""

    def check_group(self, graph: Graph, nodes: Sequence[Node]) -> str | None:
        raise NotImplementedError

    def describe(self, graph: Graph, nodes: Sequence[Node]) -> tuple[str, Node]:
        anchor = anchor_of(nodes)
        if len(nodes) == 1:
            return "single", anchor
        members = {id(n) for n in nodes}
        if not any(v.producer is not None and id(v.producer) in members
                   for n in nodes for v in n.input_values()):
            return "horizontal", anchor
        cat = category_of(anchor)
        if cat == Category.OUT_ELEMWISE_FUSABLE:
            return ("conv_epilogue" if anchor.op_type.startswith("Conv") else "matmul_epilogue"), anchor
        if cat == Category.REDUCTION:
            return "reduction", anchor
        return "elementwise", anchor

    def proposed_groups(self, graph: Graph) -> list[list[Node]]:
        return []

    def can_merge(self, plan: FusionPlan, a: FusionGroup, b: FusionGroup) -> str | None:
        if a is b:
            return "a group cannot merge with itself"
        p = Partition.from_plan(plan)
        if p.creates_cycle([p.gid(a.nodes[0]), p.gid(b.nodes[0])]):
            return f"merging '{a.name}' and '{b.name}' creates a cycle through an outside path"
        pos = {id(n): i for i, n in enumerate(plan.graph.nodes)}
        nodes = sorted([*a.nodes, *b.nodes], key=lambda n: pos[id(n)])
        return self.check_group(plan.graph, nodes)

    def candidate_merges(self, plan: FusionPlan) -> list[tuple[FusionGroup, FusionGroup]]:
        """Adjacent producer/consumer group pairs and sibling pairs, legal ones only."""
        from opfuse.rules.legality import PlanLegality
        by_first = {g.nodes[0].name: g for g in plan.groups}
        pairs = [(by_first[x.nodes[0].name], by_first[y.nodes[0].name])
                 for x, y in PlanLegality(plan).candidate_merges()]
        return [(a, b) for a, b in pairs if self.can_merge(plan, a, b) is None]


class CategoryLegality(LegalityRules):
    """TVM-style category rules (see the module docstring)."""

    def __init__(self, max_group_nodes: int | None = None):
        self.max_group_nodes = max_group_nodes

    def check_group(self, graph: Graph, nodes: Sequence[Node]) -> str | None:
        if len(nodes) <= 1:
            return None
        if self.max_group_nodes is not None and len(nodes) > self.max_group_nodes:
            return f"group of {len(nodes)} ops exceeds the limit of {self.max_group_nodes}"
        cats = {id(n): category_of(n) for n in nodes}
        for n in nodes:
            if cats[id(n)] == Category.OPAQUE:
                return f"'{n.name}' ({n.op_type}) is opaque and never fuses"
        heavy = [n for n in nodes if cats[id(n)] == Category.OUT_ELEMWISE_FUSABLE]
        if len(heavy) > 1:
            return (f"two out-elementwise-fusable ops ('{heavy[0].name}' {heavy[0].op_type}, "
                    f"'{heavy[1].name}' {heavy[1].op_type}) are never fused")
        members = {id(n) for n in nodes}
        for c in nodes:
            for v in c.input_values():
                p = v.producer
                if p is None or id(p) not in members:
                    continue
                cp, cc = cats[id(p)], cats[id(c)]
                if cp <= Category.INJECTIVE:
                    continue
                if cc <= Category.BROADCAST:
                    continue  # an epilogue
                return (f"'{p.name}' ({p.op_type}, {cp.name.lower()}) can only feed an elementwise "
                        f"epilogue, not '{c.name}' ({c.op_type}, {cc.name.lower()})")
        if not _connected(nodes):
            return "the ops are neither connected nor siblings sharing an input"
        return None


class SubplanLegality(LegalityRules):
    """Only subsets of the groups of ``plan`` (see the module docstring)."""

    def __init__(self, plan: FusionPlan, base: LegalityRules | None = None):
        self.plan = plan
        self.base = base if base is not None else CategoryLegality()
        self._group_of = {id(n): k for k, g in enumerate(plan.groups) for n in g.nodes}

    def check_group(self, graph: Graph, nodes: Sequence[Node]) -> str | None:
        if len(nodes) <= 1:
            return None
        owners = {self._group_of.get(id(n)) for n in nodes}
        if len(owners) != 1 or None in owners:
            return "the ops belong to different groups of the proposed plan"
        whole = self.plan.groups[owners.pop()]
        if len(whole.nodes) == len(nodes):
            return None
        return self.base.check_group(graph, nodes)

    def describe(self, graph: Graph, nodes: Sequence[Node]) -> tuple[str, Node]:
        owners = {self._group_of.get(id(n)) for n in nodes}
        if len(owners) == 1 and None not in owners:
            whole = self.plan.groups[next(iter(owners))]
            if len(whole.nodes) == len(nodes):
                return whole.kind, whole.anchor if whole.anchor is not None else anchor_of(nodes)
        return self.base.describe(graph, nodes)

    def proposed_groups(self, graph: Graph) -> list[list[Node]]:
        return [list(g.nodes) for g in self.plan.groups if len(g.nodes) > 1]


def _connected(nodes: Sequence[Node]) -> bool:
    """Connected through internal producer->consumer edges or shared non-constant inputs."""
    return len(components_within(list(nodes), shared_inputs=True)) == 1
