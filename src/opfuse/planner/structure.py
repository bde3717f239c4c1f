"""Plans from node groups: the group order, and a cycle of groups to cut (exact planner).

A set of nodes can run as one kernel only if it is *convex*: no path leaves it and comes
back. The planners choose convex groups (candidates are convex by construction; merges are
checked by the legality, ``Partition.creates_cycle``); the exact planner's solution may still
hold a cycle *between* groups, which ``find_group_cycle`` names for a lazy cut.
"""
from __future__ import annotations

import heapq
from typing import Sequence

from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan


def topological_groups(graph: Graph, groups: Sequence[Sequence[Node]]) -> list[int]:
    """Indices of ``groups`` in a topological order of the group graph (ties: earliest
    first node). Raises ``ValueError`` when the group graph has a cycle."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    owner = {id(n): k for k, nodes in enumerate(groups) for n in nodes}
    succ: list[set[int]] = [set() for _ in groups]
    indeg = [0] * len(groups)
    for k, nodes in enumerate(groups):
        for n in nodes:
            for v in n.outputs:
                for u, _ in v.uses:
                    j = owner[id(u)]
                    if j != k and j not in succ[k]:
                        succ[k].add(j)
                        indeg[j] += 1
    first = [min(pos[id(n)] for n in nodes) for nodes in groups]
    ready = [(first[k], k) for k in range(len(groups)) if indeg[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for j in sorted(succ[k]):
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (first[j], j))
    if len(order) != len(groups):
        raise ValueError("the group graph has a cycle")
    return order


def find_group_cycle(graph: Graph, groups: Sequence[Sequence[Node]]) -> list[int] | None:
    """Indices of groups on one cycle of the group graph, or ``None`` when acyclic."""
    owner = {id(n): k for k, nodes in enumerate(groups) for n in nodes}
    succ: list[list[int]] = []
    for k, nodes in enumerate(groups):
        s = sorted({owner[id(u)] for n in nodes for v in n.outputs for u, _ in v.uses} - {k})
        succ.append(s)
    state = [0] * len(groups)  # 0 new, 1 on stack, 2 done
    for root in range(len(groups)):
        if state[root]:
            continue
        stack = [(root, 0)]
        path = [root]
        state[root] = 1
        while stack:
            k, i = stack[-1]
            if i < len(succ[k]):
                stack[-1] = (k, i + 1)
                j = succ[k][i]
                if state[j] == 1:
                    return path[path.index(j):]
                if state[j] == 0:
                    state[j] = 1
                    stack.append((j, 0))
                    path.append(j)
            else:
                state[k] = 2
                stack.pop()
                path.pop()
    return None


def plan_from_groups(graph: Graph, groups: Sequence[Sequence[Node]], legality) -> FusionPlan:
    """A verified ``FusionPlan`` from node groups: groups in topological order, nodes in
    graph order, kind and anchor from ``legality.describe``, named after the anchor."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    ordered = [sorted(groups[k], key=lambda n: pos[id(n)]) for k in topological_groups(graph, groups)]
    out = []
    for nodes in ordered:
        kind, anchor = legality.describe(graph, nodes)
        out.append(FusionGroup(anchor.name, nodes, kind, anchor))
    plan = FusionPlan(graph, out)
    plan.verify()
    return plan
