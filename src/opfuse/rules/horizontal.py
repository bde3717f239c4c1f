"""Horizontal fusion: siblings that read one input become one pass over it.

The seed's mixed example ``x -> [Conv -> BN -> ReLU] -> (MaxPool || AvgPool)``: after the
vertical group, the two poolings read the same activation with the same window; one kernel
walks the window once and writes both outputs. The legality (shared input, no path between,
resources, one iteration domain) is ``Legality.horizontal``; this module is the rule: its
pattern is any op reading a value another op reads too; for each such value (in the order its
first readers appear), siblings are added one by one (in plan order) while the group stays
legal. Q/K/V MatMuls are merged earlier, as a graph rewrite
(``opfuse.rewrites.merge_parallel_matmul``).

A horizontal group records its members (node names per sibling kernel), their kinds, the
shared input and the common domain in ``attrs``.
"""
from __future__ import annotations

from opfuse.patterns import AnyOp, check
from opfuse.rules.decisions import Refusal
from opfuse.rules.rule import Fuse, Rule
from opfuse.rules.site import Site

RULE = "horizontal"


def _reads_shared_value(node) -> bool:
    return any(not v.is_const and len(v.uses) >= 2 for v in node.input_values())


def propose_siblings(grouping, matches):
    """For each value read by several groups: merge the next sibling into the current pass."""
    p = grouping.p
    legality = grouping.legality
    values, seen = [], set()
    for m in matches:
        for v in m.nodes[0].input_values():
            if not v.is_const and len(v.uses) >= 2 and id(v) not in seen:
                seen.add(id(v))
                values.append(v)
    values.sort(key=lambda v: (v.producer is not None, p.order[id(v.producer)] if v.producer is not None else 0))
    for value in values:
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
            site = Site({current, other}, [p.members[current][0].name, p.members[other][0].name],
                        f"one pass over '{value.name}'", shared=value)
            yield site
            if "gid" in site.facts:
                current = site.facts["gid"]
            elif isinstance(legality.domain(current, value), Refusal):
                current = other  # the first reader cannot lead a pass; let the next one try


HORIZONTAL = Rule(RULE, AnyOp().where(check(_reads_shared_value, "reads a shared value")).named("reader"),
                  action=Fuse(propose_siblings), priority=1,
                  description="siblings on one input with one iteration domain -> one pass")

__all__ = ["HORIZONTAL", "propose_siblings"]
