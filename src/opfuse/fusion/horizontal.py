"""Horizontal fusion: siblings that read one input become one pass over it.

The seed's mixed example ``x -> [Conv -> BN -> ReLU] -> (MaxPool || AvgPool)``: after the
vertical group, the two poolings read the same activation with the same window; one kernel
walks the window once and writes both outputs. The legality (shared input, no path between,
resources, one iteration domain) is ``Legality.horizontal``; this module is the greedy rule:
for each value read by several groups, siblings are added one by one (in plan order) while
the group stays legal. Q/K/V MatMuls are merged earlier, as a graph rewrite
(``opfuse.rewrites.merge_parallel_matmul``).

A horizontal group records its members (node names per sibling kernel), their kinds, the
shared input and the common domain in ``attrs``.
"""
from __future__ import annotations

from opfuse.fusion.decisions import Refusal
from opfuse.fusion.kernel_shape import GroupShape
from opfuse.fusion.legality import Legality
from opfuse.fusion.log import FusionLog
from opfuse.ir.graph import Value

RULE = "horizontal"


def horizontal_shape(legality: Legality, gids, value: Value, domain) -> tuple[GroupShape, dict]:
    p = legality.p
    ordered = sorted(set(gids), key=p.order_key)
    members, kinds = [], []
    for g in ordered:
        for m, kind in zip(legality.members_of(g), p.attrs[g].get("member_kinds") or [p.kind(g)]):
            members.append([n.name for n in m])
            kinds.append(kind)
    first = ordered[0]
    anchor = p.shape[first].anchor if p.shape[first].anchor is not None else p.members[first][0]
    attrs = {"members": members, "member_kinds": kinds, "shared_input": value.name, "domain": domain}
    return GroupShape("horizontal", anchor), attrs


def fuse_horizontal(legality: Legality, log: FusionLog, disabled: bool = False) -> None:
    p = legality.p
    graph = p.graph
    for value in list(graph.values.values()):
        if value.is_const or len(value.uses) < 2:
            continue
        producer = p.gid(value.producer) if value.producer is not None else None
        readers = []
        for u, _ in value.uses:
            g = p.gid(u)
            if g != producer and g not in readers:
                readers.append(g)
        if len(readers) < 2:
            continue
        readers.sort(key=p.order_key)
        current = readers[0]
        for other in readers[1:]:
            if current not in p.members or other not in p.members:
                continue
            dom = legality.horizontal([current, other], value)
            names = [p.members[current][0].name, p.members[other][0].name]
            if isinstance(dom, Refusal):
                log.refused(RULE, names, dom)
                if isinstance(legality.domain(current, value), Refusal):
                    current = other  # the first reader cannot lead a pass; let the next one try
                continue
            if disabled:
                log.disabled(RULE, names)
                continue
            shape, attrs = horizontal_shape(legality, [current, other], value, dom)
            current = p.union([current, other], shape, attrs)
            log.taken(RULE, names, f"one pass over '{value.name}' for {len(attrs['members'])} siblings")
