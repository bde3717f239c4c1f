"""Reachability inside a set of nodes (a fusion group, a candidate match).

Both walks follow values whose producer and consumer are both in ``ids`` (node ids), so a
path that leaves the set and comes back is not followed. ``start`` itself is not included.
"""
from __future__ import annotations

from opfuse.ir.graph import Node


def descendants_within(start: Node, ids: set[int]) -> set[int]:
    """Ids of nodes in ``ids`` reachable from ``start`` through values inside the set."""
    seen: set[int] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) in ids and id(u) not in seen:
                    seen.add(id(u))
                    todo.append(u)
    return seen


def ancestors_within(start: Node, ids: set[int]) -> set[int]:
    """Ids of nodes in ``ids`` that reach ``start`` through values inside the set."""
    seen: set[int] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for v in n.input_values():
            p = v.producer
            if p is not None and id(p) in ids and id(p) not in seen:
                seen.add(id(p))
                todo.append(p)
    return seen
