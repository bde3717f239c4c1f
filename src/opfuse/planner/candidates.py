"""Enumerating every legal candidate group, for the exact planner.

A candidate is a convex node set that legality accepts. Enumeration grows sets one
neighbour at a time (producer, consumer or sibling sharing a non-constant input) from
every single node, keeping only convex, legal sets, breadth first, each set once (sets
are bit masks). Every convex connected set can be grown this way, removing a source or
sink of the set keeps it convex, so with rules whose legal groups have legal
subsets the enumeration is complete; groups legal only as a whole come from
``legality.proposed_groups``.

Convexity with bit masks: ``S`` is convex iff no node outside ``S`` is both a descendant
and an ancestor of nodes of ``S``: ``(desc(S) & anc(S)) & ~S == 0``.

The number of candidates can grow exponentially on wide graphs (every subset of a wide
fan-out of siblings is a horizontal group), so enumeration stops with
``CandidateLimitError`` beyond a limit; the caller falls back to the greedy planner.
"""
from __future__ import annotations

import itertools

from collections import deque

from opfuse.planner.problem import Problem

MAX_CANDIDATES = 20_000  # beyond this, exact planning is declared too large
MAX_SIBLING_FANOUT = 8  # a value read by more consumers links only consecutive ones


class CandidateLimitError(Exception):
    """Too many candidate groups for the exact planner (not a user error)."""


def reachability(problem: Problem) -> tuple[list[int], list[int], list[list[int]]]:
    """(descendant masks, ancestor masks, neighbour lists) of every node."""
    n = len(problem.nodes)
    succ: list[set[int]] = [set() for _ in range(n)]
    pred: list[set[int]] = [set() for _ in range(n)]
    nbrs: list[set[int]] = [set() for _ in range(n)]
    for i, node in enumerate(problem.nodes):
        for v in node.input_values():
            if v.producer is not None:
                p = problem.pos[id(v.producer)]
                if p != i:
                    succ[p].add(i)
                    pred[i].add(p)
    for v in problem.graph.values.values():
        if v.is_const:
            continue
        readers = sorted({problem.pos[id(u)] for u, _ in v.uses})
        if len(readers) <= MAX_SIBLING_FANOUT:
            pairs = [(a, b) for k, a in enumerate(readers) for b in readers[k + 1:]]
        else:
            pairs = list(itertools.pairwise(readers))
        for a, b in pairs:
            nbrs[a].add(b)
            nbrs[b].add(a)
    desc = [0] * n
    for i in reversed(range(n)):  # graph order is topological
        m = 0
        for s in succ[i]:
            m |= (1 << s) | desc[s]
        desc[i] = m
    anc = [0] * n
    for i in range(n):
        m = 0
        for p in pred[i]:
            m |= (1 << p) | anc[p]
        anc[i] = m
    for i in range(n):
        nbrs[i] |= succ[i] | pred[i]
    return desc, anc, [sorted(s) for s in nbrs]


def _members(mask: int) -> tuple[int, ...]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return tuple(out)


def enumerate_candidates(problem: Problem, max_candidates: int = MAX_CANDIDATES) -> list[tuple[int, ...]]:
    """Every legal convex candidate group (singletons included), as sorted index tuples."""
    n = len(problem.nodes)
    desc, anc, nbrs = reachability(problem)
    seen: set[int] = set()
    queue: deque[tuple[int, int, int]] = deque()
    legal: list[tuple[int, ...]] = []
    for i in range(n):
        seen.add(1 << i)
        queue.append((1 << i, desc[i], anc[i]))
        legal.append((i,))
    while queue:
        mask, d, a = queue.popleft()
        border = 0
        for i in _members(mask):
            for j in nbrs[i]:
                border |= 1 << j
        border &= ~mask
        while border:
            low = border & -border
            border ^= low
            j = low.bit_length() - 1
            m2 = mask | low
            if m2 in seen:
                continue
            seen.add(m2)
            if len(seen) > max_candidates * 4:
                raise CandidateLimitError(f"more than {max_candidates * 4} sets examined")
            d2, a2 = d | desc[j], a | anc[j]
            if d2 & a2 & ~m2:
                continue  # not convex
            key = _members(m2)
            if problem.legality.check_group(problem.graph, problem.group_nodes(key)) is not None:
                continue
            queue.append((m2, d2, a2))
            legal.append(key)
            if len(legal) > max_candidates:
                raise CandidateLimitError(f"more than {max_candidates} legal candidate groups")
    known = set(legal)
    for nodes in problem.legality.proposed_groups(problem.graph):
        key = tuple(sorted(problem.pos[id(x)] for x in nodes))
        mask = sum(1 << i for i in key)
        d = a = 0
        for i in key:
            d |= desc[i]
            a |= anc[i]
        if key not in known and not (d & a & ~mask):
            legal.append(key)
            known.add(key)
    # The on-chip budget (and any other per-group limit) filters the final list only, so
    # that growth can pass through a set that is itself over budget.
    return [k for k in legal if problem.legal(k) is None]
