"""Plain reference versions of the indexed legality queries, for the equivalence tests.

Each answers from scratch, by brute force over the whole graph (what the indexed versions in
``opfuse.rules.legality`` must agree with): reachability by an unbounded walk, cycles by contracting
the groups and looking for a cycle in the whole group graph, the plan order by Kahn's
algorithm on a group graph rebuilt from the nodes.
"""
from __future__ import annotations

import heapq

from opfuse.errors import ModelError
from opfuse.rules.decisions import RefusalKind, Refusal
from opfuse.rules.kernel_shape import GroupShape, classify
from opfuse.rules.options import FusionOptions
from opfuse.rules.partition import Partition
from opfuse.rules.legality import rule_of_shape
from opfuse.rules.siblings import components, member_domain


def descendants(nodes) -> set[int]:
    """Ids of every node reachable (one edge or more) from ``nodes``."""
    seen: set[int] = set()
    todo = list(nodes)
    while todo:
        n = todo.pop()
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) not in seen:
                    seen.add(id(u))
                    todo.append(u)
    return seen


def reaches(src, dst) -> bool:
    return bool(descendants(src) & {id(n) for n in dst})


def node_set_shape(graph, nodes, options: FusionOptions | None = None):
    """``opfuse.rules.siblings.node_set_shape`` with every graph fact recomputed."""
    options = options or FusionOptions()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    nodes = sorted(nodes, key=lambda n: order[id(n)])
    if len(nodes) > options.max_ops_per_group:
        return Refusal(RefusalKind.RESOURCE, f"{len(nodes)} ops exceed the limit of "
                                                  f"{options.max_ops_per_group} per kernel")
    comps = components(nodes)
    if len(comps) == 1:
        return classify(nodes, graph)
    if len(comps) > options.max_horizontal_members:
        return Refusal(RefusalKind.RESOURCE, f"{len(comps)} siblings exceed the limit of "
                                                  f"{options.max_horizontal_members}")
    inside = {id(n) for n in nodes}
    shared = next((v for n in comps[0] for v in n.input_values()
                   if not v.is_const and (v.producer is None or id(v.producer) not in inside)
                   and all(any(w is v for n in c for w in n.input_values()) for c in comps[1:])), None)
    if shared is None:
        return Refusal(RefusalKind.CONDITION, "the sibling kernels share no input")
    domains, kinds = [], []
    for c in comps:
        shape = classify(c, graph)
        if isinstance(shape, Refusal):
            return shape
        d = member_domain(c, shape, shared)
        if isinstance(d, Refusal):
            return d
        domains.append(d)
        kinds.append(shape.kind)
    if any(d != domains[0] for d in domains[1:]):
        return Refusal(RefusalKind.CONDITION, "the siblings iterate over different domains "
                                                "(window or shape differ)")
    for i, c in enumerate(comps):
        if reaches(c, [n for j, o in enumerate(comps) if j != i for n in o]):
            return Refusal(RefusalKind.DEPENDENCY, "a path connects the siblings (they are not independent)")
    first = classify(comps[0], graph)
    anchor = first.anchor if first.anchor is not None else comps[0][0]
    return GroupShape("horizontal", anchor, {"members": [[n.name for n in c] for c in comps],
                                             "member_kinds": kinds, "shared_input": shared.name,
                                             "domain": domains[0]})


def check_group(graph, nodes, options: FusionOptions | None = None) -> str | None:
    options = options or FusionOptions()
    if len(nodes) <= 1:
        return None
    shape = node_set_shape(graph, nodes, options)
    if isinstance(shape, Refusal):
        return str(shape)
    rule = rule_of_shape(shape)
    if rule is not None and options.is_disabled(rule):
        return f"disabled by user: rule '{rule}' is disabled"
    return None


def group_graph(groups: list[list]) -> list[set[int]]:
    """Successor sets of the group graph of ``groups`` (lists of nodes)."""
    owner = {id(n): k for k, nodes in enumerate(groups) for n in nodes}
    return [{owner[id(u)] for n in nodes for v in n.outputs for u, _ in v.uses if id(u) in owner} - {k}
            for k, nodes in enumerate(groups)]


def has_cycle(succ: list[set[int]]) -> bool:
    indeg = [0] * len(succ)
    for s in succ:
        for j in s:
            indeg[j] += 1
    todo = [k for k, d in enumerate(indeg) if d == 0]
    done = 0
    while todo:
        k = todo.pop()
        done += 1
        for j in succ[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                todo.append(j)
    return done != len(succ)


def contraction_creates_cycle(groups: list[list], merge: set[int]) -> bool:
    """Does merging the groups with indices ``merge`` into one make the group graph cyclic?"""
    merged = [n for k in sorted(merge) for n in groups[k]]
    rest = [nodes for k, nodes in enumerate(groups) if k not in merge]
    return has_cycle(group_graph(rest + [merged]))


def groups_in_order(groups: list[list], order: dict[int, int]) -> list[int]:
    """Kahn's algorithm taking the ready group with the earliest first node."""
    succ = group_graph(groups)
    indeg = [0] * len(groups)
    for s in succ:
        for j in s:
            indeg[j] += 1
    first = [min(order[id(n)] for n in nodes) for nodes in groups]
    ready = [(first[k], k) for k in range(len(groups)) if indeg[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(k)
        for j in succ[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (first[j], j))
    if len(out) != len(groups):
        raise ModelError("fusion partition has a cycle between groups")
    return out


class ReferencePartition(Partition):
    """A ``Partition`` whose order and cycle answers are recomputed from scratch each time."""

    def _groups(self) -> tuple[list[int], list[list]]:
        gids = sorted(self.members)
        return gids, [self.members[g] for g in gids]

    def groups_in_order(self) -> list[int]:
        gids, groups = self._groups()
        return [gids[k] for k in groups_in_order(groups, self.order)]

    def position(self, gid: int) -> int:
        return self.groups_in_order().index(gid)

    def order_key(self, gid: int) -> int:
        return self.position(gid)

    def creates_cycle(self, gids) -> bool:
        all_gids, groups = self._groups()
        return contraction_creates_cycle(groups, {all_gids.index(g) for g in set(gids)})


def merge_refusal(plan, a, b, options: FusionOptions | None = None) -> Refusal | None:
    """``RuleLegality.merge_refusal`` answered from scratch."""
    options = options or FusionOptions()
    if a is b:
        return Refusal(RefusalKind.CONDITION, "a group cannot merge with itself")
    ids_a, ids_b = a.node_ids(), b.node_ids()
    adjacent = any(id(u) in ids_b for n in a.nodes for v in n.outputs for u, _ in v.uses) or \
        any(id(u) in ids_a for n in b.nodes for v in n.outputs for u, _ in v.uses)
    shared = {id(v) for v in a.inputs() if not v.is_const} & {id(v) for v in b.inputs() if not v.is_const}
    if not adjacent and not shared:
        return Refusal(RefusalKind.CONDITION, "the groups are neither adjacent nor siblings of one input")
    k_a = next(k for k, g in enumerate(plan.groups) if g is a)
    k_b = next(k for k, g in enumerate(plan.groups) if g is b)
    if contraction_creates_cycle([list(g.nodes) for g in plan.groups], {k_a, k_b}):
        return Refusal(RefusalKind.DEPENDENCY, f"merging '{a.name}' and '{b.name}' creates a cycle through "
                                         f"an outside path")
    order = {id(n): i for i, n in enumerate(plan.graph.nodes)}
    shape = node_set_shape(plan.graph, sorted([*a.nodes, *b.nodes], key=lambda n: order[id(n)]), options)
    if isinstance(shape, Refusal):
        return shape
    first, second = (a, b) if k_a < k_b else (b, a)
    rule = rule_of_shape(shape)
    if rule is not None and options.is_disabled(rule):
        return Refusal(RefusalKind.DISABLED, f"rule '{rule}' is disabled")
    return None
