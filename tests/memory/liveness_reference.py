"""An arena check that does not trust the plan's own lifetimes.

``MemoryPlan.conflicts()`` reads ``MemoryPlan.lifetimes``: a planner that ends lives too early
agrees with itself. Here the live range of every arena tensor is recomputed from the kernel
order alone: a value is born at the kernel (group) that produces it and dies at the last
kernel that reads it; views and aliased Concat inputs are the same bytes as the tensor they
lie in, so such a *data class* lives from its first birth to its last death. Two classes
whose bytes overlap may be live together at most at one kernel, where one dies and the other
is born in place (an ``inplace`` alias between them).
"""
from __future__ import annotations


def kernel_lifetimes(plan) -> dict[str, tuple[int, int]]:
    """value name -> (producing kernel, last reading kernel), from ``plan.groups`` order only."""
    group_of = {id(n): t for t, grp in enumerate(plan.groups) for n in grp.nodes}
    born: dict[str, int] = {}
    last: dict[str, int] = {}
    for t, grp in enumerate(plan.groups):
        for n in grp.nodes:
            for v in n.outputs:
                born[v.name] = t
            for v in n.input_values():
                if v.producer is not None and group_of.get(id(v.producer)) != t:
                    last[v.name] = max(last.get(v.name, t), t)
    return {name: (t, max(t, last.get(name, t))) for name, t in born.items()}


def arena_conflicts(mem) -> list[str]:
    """Pairs of arena tensors that share bytes while both are live (by recomputed lifetimes)."""
    life = kernel_lifetimes(mem.plan)
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a in mem.aliases:
        if a.kind in ("view", "concat"):
            parent[find(a.value)] = find(a.base)
    inplace = {frozenset((find(a.value), find(a.base))) for a in mem.aliases if a.kind == "inplace"}
    arena = [name for name, loc in mem.locations.items() if loc.region == "arena"]
    classes: dict[str, list[str]] = {}
    for name in arena:
        classes.setdefault(find(name), []).append(name)
    spans = {}
    for root, members in classes.items():
        times = [life[m] for m in members if m in life]
        if not times:
            continue
        lo = min(mem.locations[m].offset for m in members)
        hi = max(mem.locations[m].offset + mem.graph.values[m].nbytes for m in members)
        spans[root] = (lo, hi, min(s for s, _ in times), max(e for _, e in times))
    problems = []
    roots = sorted(spans)
    for i, r1 in enumerate(roots):
        lo1, hi1, s1, e1 = spans[r1]
        if hi1 > mem.arena_bytes:
            problems.append(f"'{r1}' ends at byte {hi1}, past the arena of {mem.arena_bytes}")
        for r2 in roots[i + 1:]:
            lo2, hi2, s2, e2 = spans[r2]
            if hi1 <= lo2 or hi2 <= lo1 or e1 < s2 or e2 < s1:
                continue  # disjoint in bytes or in time
            t = max(s1, s2)
            handoff = t == min(e1, e2) and ((e1 == t == s2) or (e2 == t == s1))  # one dies as the other is born
            if handoff and frozenset((r1, r2)) in inplace:
                continue
            problems.append(f"'{r1}' (kernels {s1}..{e1}, bytes {lo1}..{hi1}) and '{r2}' (kernels {s2}..{e2}, "
                            f"bytes {lo2}..{hi2}) share bytes while both are live")
    return problems
