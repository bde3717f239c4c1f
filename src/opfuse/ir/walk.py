"""Reachability and connectivity inside a set of nodes (a fusion group, a candidate match).

The walks follow values whose producer and consumer are both in the set, so a path that
leaves the set and comes back is not followed; ``start`` itself is not included.
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


def components_within(nodes: list[Node], *, shared_inputs: bool = False) -> list[list[Node]]:
    """Weakly connected components of ``nodes`` (each in the given order, components ordered by
    their first node), joined by producer -> consumer edges inside the set and, with
    ``shared_inputs``, also by reading the same non-constant value (horizontal siblings)."""
    members = {id(n) for n in nodes}
    parent = {k: k for k in members}

    def find(k):
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    first_reader: dict[int, int] = {}
    for n in nodes:
        for v in n.input_values():
            if v.producer is not None and id(v.producer) in members:
                parent[find(id(n))] = find(id(v.producer))
            if shared_inputs and not v.is_const:
                parent[find(id(n))] = find(first_reader.setdefault(id(v), id(n)))
    comps: dict[int, list[Node]] = {}
    for n in nodes:
        comps.setdefault(find(id(n)), []).append(n)
    return list(comps.values())
