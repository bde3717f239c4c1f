"""The planner's view of legality: which node sets MAY be one kernel (a protocol).

Legality (may it fuse?) is decided by the fusion rules (``opfuse.rules.legality.RuleLegality``,
the one implementation); profitability (is it worth it?) by the planner. The planner never
imports the rules: every entry point takes a legality object, there is no default. The
interface:

* ``check_group(graph, nodes) -> str | None``: ``None`` when ``nodes`` may form one
  kernel, else the reason. The planners only ask about node sets that are convex (no
  path leaves the set and comes back: such a group could not run as one kernel and is
  refused structurally, before legality is asked). Planners grow groups one merge at a
  time, so a legal group should be reachable through legal subsets; groups that are not
  (a pattern legal only as a whole) are offered through ``proposed_groups``.
* ``describe(graph, nodes) -> (kind, anchor)``: how the resulting ``FusionGroup`` is named.
* ``proposed_groups(graph) -> list[list[Node]]``: the candidate groups the fusion rules formed.
* ``can_merge(plan, a, b) -> str | None`` (adds the cycle check through outside paths) and
  ``candidate_merges(plan)`` (adjacent producer/consumer pairs and sibling pairs).
"""
from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan


@runtime_checkable
class Legality(Protocol):
    def check_group(self, graph: Graph, nodes: Sequence[Node]) -> str | None: ...

    def describe(self, graph: Graph, nodes: Sequence[Node]) -> tuple[str, Node]: ...

    def proposed_groups(self, graph: Graph) -> list[list[Node]]: ...

    def can_merge(self, plan: FusionPlan, a: FusionGroup, b: FusionGroup) -> str | None: ...

    def candidate_merges(self, plan: FusionPlan) -> list[tuple[FusionGroup, FusionGroup]]: ...


__all__ = ["Legality"]
