"""The planner's view of legality: which node sets MAY be one kernel.

Legality (may it fuse?) is decided by the rules engine; profitability (is it worth it?)
by the planner. The interface between them is small:

* ``check_group(graph, nodes) -> str | None``: ``None`` when ``nodes`` may form one
  kernel, else the reason. The planners only ask about node sets that are convex (no
  path leaves the set and comes back: such a group could not run as one kernel and is
  refused structurally, before legality is asked). Planners grow groups one merge at a
  time, so a legal group should be reachable through legal subsets; groups that are not
  (a pattern legal only as a whole) can be offered through ``proposed_groups``.
* ``describe(graph, nodes) -> (kind, anchor)``: how the resulting ``FusionGroup`` is named.
* ``proposed_groups(graph) -> list[list[Node]]``: optional extra candidates for the exact
  planner (e.g. the groups a rule-based pass already formed).

``LegalityRules`` implements the two plan-level questions of the brief on top of
``check_group``: ``can_merge(plan, a, b)`` (adds the cycle check through outside paths)
and ``candidate_merges(plan)`` (adjacent producer/consumer pairs and sibling pairs).

``CategoryLegality`` is a self-contained TVM-style rule set used until the rules engine
lands (and by the tests):

* elementwise, broadcast and injective producers may fuse into any consumer;
* a reduction or out-elementwise-fusable op (Conv, MatMul) may feed only an
  elementwise/broadcast consumer inside a group (its epilogue);
* at most one out-elementwise-fusable op per group; opaque ops are never fused;
* the group must be connected through internal edges or shared inputs (siblings).

``SubplanLegality`` restricts any rule set to subsets of the groups of an existing plan
(the plan a rule-based pass produced), so the planner decides which of those fusions
to keep: each proposed group is legal as a whole, its subsets when the base rules agree.
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from opfuse.cost.analysis import category_of, node_flops
from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops.registry import Category
from opfuse.planner.structure import creates_cycle, merge_candidates
from opfuse.ir.walk import components_within


@runtime_checkable
class Legality(Protocol):
    def check_group(self, graph: Graph, nodes: Sequence[Node]) -> str | None: ...

    def describe(self, graph: Graph, nodes: Sequence[Node]) -> tuple[str, Node]: ...

    def proposed_groups(self, graph: Graph) -> list[list[Node]]: ...

    def can_merge(self, plan: FusionPlan, a: FusionGroup, b: FusionGroup) -> str | None: ...

    def candidate_merges(self, plan: FusionPlan) -> list[tuple[FusionGroup, FusionGroup]]: ...


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
        if creates_cycle(plan, a, b):
            return f"merging '{a.name}' and '{b.name}' creates a cycle through an outside path"
        pos = {id(n): i for i, n in enumerate(plan.graph.nodes)}
        nodes = sorted([*a.nodes, *b.nodes], key=lambda n: pos[id(n)])
        return self.check_group(plan.graph, nodes)

    def candidate_merges(self, plan: FusionPlan) -> list[tuple[FusionGroup, FusionGroup]]:
        """Adjacent producer/consumer group pairs and sibling pairs, legal ones only."""
        return [(a, b) for a, b in merge_candidates(plan) if self.can_merge(plan, a, b) is None]


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
