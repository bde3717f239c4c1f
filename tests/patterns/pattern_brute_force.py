"""A brute-force enumerator of pattern matches: the test oracle for the matcher.

It reads the pattern *expression* (``opfuse.patterns.pattern``) directly and shares no code with
``template.py`` or ``matcher.py``: every alternation and every repetition count (up to the
number of graph nodes) is unrolled into a flat template, every tuple of distinct nodes is tried
for the op vertices (filtered per vertex by its predicate only), every value for the variables,
and the definition in ``pattern.py`` is checked literally: predicates, edges (commutative ops
may permute their explicit slots), one value per variable, outputs of non-sink vertices not
escaping. The matches are the node sets that no other embedding strictly contains.

Exponential, so only for graphs of a handful of nodes.
"""
from __future__ import annotations

import itertools

from opfuse.ops.registry import REGISTRY
from opfuse.patterns.pattern import Alt, Many, OpPattern, Par, Repeat, Seq, Var


class Flat:
    def __init__(self):
        self.repeated = False               # some repetition has more copies than its minimum
        self.ops: list[OpPattern] = []      # vertex -> predicate
        self.keep: list[bool] = []
        self.vars: list[Var] = []
        self.edges: list[tuple] = []        # (("op"|"var", i), dst op index, slot or None)


def _choice_points(expr, out, seen):
    if id(expr) in seen:
        return
    seen.add(id(expr))
    if isinstance(expr, OpPattern):
        for i in expr.inputs:
            if i is not None:
                _choice_points(i, out, seen)
    elif isinstance(expr, Seq):
        _choice_points(expr.first, out, seen)
        _choice_points(expr.second, out, seen)
    elif isinstance(expr, Par):
        for b in expr.branches:
            _choice_points(b, out, seen)
    elif isinstance(expr, Alt):
        out.append(expr)
        for o in expr.options():
            _choice_points(o, out, seen)
    elif isinstance(expr, (Repeat, Many)):
        out.append(expr)
        _choice_points(expr.body, out, seen)


def _var_homes(expr, owner, homes, seen):
    """var uid -> set of repetition objects (or None) that reference it."""
    key = (id(expr), id(owner))
    if key in seen:
        return
    seen.add(key)
    if isinstance(expr, Var):
        homes.setdefault(expr.uid, set()).add(id(owner) if owner is not None else None)
    elif isinstance(expr, OpPattern):
        for i in expr.inputs:
            if i is not None:
                _var_homes(i, owner, homes, seen)
    elif isinstance(expr, Seq):
        _var_homes(expr.first, owner, homes, seen)
        _var_homes(expr.second, owner, homes, seen)
    elif isinstance(expr, Par):
        for b in expr.branches:
            _var_homes(b, owner, homes, seen)
    elif isinstance(expr, Alt):
        for o in expr.options():
            _var_homes(o, owner, homes, seen)
    elif isinstance(expr, (Repeat, Many)):
        _var_homes(expr.body, expr, homes, seen)


class _Flattener:
    def __init__(self, choice, homes):
        self.choice = choice
        self.homes = homes
        self.flat = Flat()
        self.shared_vars: dict[int, int] = {}

    def build(self, expr, memo):
        """-> (heads: list of (op index, slot), tails: list of ("op"|"var", i)) or None when empty."""
        if id(expr) in memo:
            return memo[id(expr)]
        r = self._build(expr, memo)
        memo[id(expr)] = r
        return r

    def _build(self, expr, memo):
        f = self.flat
        if isinstance(expr, Var):
            owners = self.homes.get(expr.uid, {None})
            if None in owners or len(owners) > 1:
                if expr.uid not in self.shared_vars:
                    f.vars.append(expr)
                    self.shared_vars[expr.uid] = len(f.vars) - 1
                return [], [("var", self.shared_vars[expr.uid])]
            f.vars.append(expr)
            return [], [("var", len(f.vars) - 1)]
        if isinstance(expr, OpPattern):
            f.ops.append(expr)
            f.keep.append(expr.kept)
            i = len(f.ops) - 1
            for slot, inp in enumerate(expr.inputs):
                if inp is not None:
                    _, tails = self.build(inp, memo)
                    f.edges.append((tails[0], i, slot))
            return [(i, expr.entry_slot)], [("op", i)]
        if isinstance(expr, Seq):
            a = self.build(expr.first, memo)
            b = self.build(expr.second, memo)
            if a is None:
                return b
            if b is None:
                return a
            for t in a[1]:
                for h, slot in b[0]:
                    f.edges.append((t, h, slot))
            return a[0], b[1]
        if isinstance(expr, Par):
            parts = [p for p in (self.build(b, memo) for b in expr.branches) if p is not None]
            if not parts:
                return None
            return [h for p in parts for h in p[0]], [t for p in parts for t in p[1]]
        if isinstance(expr, Alt):
            return self.build(expr.options()[self.choice[id(expr)]], memo)
        if isinstance(expr, Repeat):
            n = self.choice[id(expr)]
            if n == 0:
                return None
            prev = first = None
            for _ in range(n):
                cur = self.build(expr.body, {})
                if prev is not None:
                    for t in prev[1]:
                        for h, slot in cur[0]:
                            f.edges.append((t, h, slot))
                first = first or cur
                prev = cur
            return first[0], prev[1]
        if isinstance(expr, Many):
            copies = [self.build(expr.body, {}) for _ in range(self.choice[id(expr)])]
            return [h for c in copies for h in c[0]], [t for c in copies for t in c[1]]
        raise TypeError(expr)


def flat_templates(pattern, max_count: int) -> list[Flat]:
    points: list = []
    _choice_points(pattern, points, set())
    homes: dict = {}
    _var_homes(pattern, None, homes, set())
    ranges = []
    for p in points:
        if isinstance(p, Alt):
            ranges.append(range(len(p.options())))
        else:
            hi = max_count if p.hi is None else min(p.hi, max_count)
            ranges.append(range(p.lo, hi + 1))
    out = []
    for combo in itertools.product(*ranges):
        fl = _Flattener({id(p): c for p, c in zip(points, combo, strict=True)}, homes)
        if fl.build(pattern, {}) is not None and fl.flat.ops:
            # the fixed part of a repetition: max(lo, 1) copies of a chain, one of a fan
            fl.flat.repeated = any(not isinstance(p, Alt) and c > (max(p.lo, 1) if isinstance(p, Repeat) else 1)
                                   for p, c in zip(points, combo, strict=True))
            out.append(fl.flat)
    return out


def _commutative(node) -> bool:
    spec = REGISTRY.get(node.op_type)
    return spec is not None and "commutative" in spec.tags


def _embeds(graph, flat: Flat, nodes_of, values_of) -> bool:
    def src_values(src):
        kind, i = src
        return list(nodes_of[i].outputs) if kind == "op" else [values_of[i]]

    # Edges, grouped by consumer so commutative slot permutations are checked together.
    by_dst: dict[int, list] = {}
    for src, dst, slot in flat.edges:
        by_dst.setdefault(dst, []).append((src, slot))
    for dst, reqs in by_dst.items():
        node = nodes_of[dst]
        explicit = [(src, slot) for src, slot in reqs if slot is not None]
        anyslot = [src for src, slot in reqs if slot is None]
        for src in anyslot:
            vals = src_values(src)
            if not any(x is v for x in node.inputs for v in vals):
                return False
        if _commutative(node):
            n = len(node.inputs)
            if any(slot >= n for _, slot in explicit):
                return False
            ok = False
            for perm in itertools.permutations(range(n), len(explicit)):
                if all(any(node.inputs[t] is v for v in src_values(src))
                       for (src, _), t in zip(explicit, perm, strict=True)):
                    ok = True
                    break
            if not ok:
                return False
        else:
            for src, slot in explicit:
                if slot >= len(node.inputs) or not any(node.inputs[slot] is v for v in src_values(src)):
                    return False
    # Only used by: outputs of vertices that feed another vertex and are not kept stay inside.
    inside = {id(n) for n in nodes_of}
    outs = {id(v) for v in graph.outputs}
    feeds = {i for (kind, i), _, _ in flat.edges if kind == "op"}
    for i, node in enumerate(nodes_of):
        if i in feeds and not flat.keep[i]:
            for o in node.outputs:
                if id(o) in outs or any(id(u) not in inside for u, _ in o.uses):
                    return False
    return True


def brute_force_matches(graph, pattern, banned=(), max_nodes: int | None = None) -> set[frozenset]:
    """Node-name sets of the maximal matches of ``pattern`` in ``graph``.

    ``banned`` node-name sets are refused cores (what ``Matcher.ban`` does): an embedding
    containing all nodes of one is no match; the maximal ones among the rest are returned.
    ``max_nodes`` caps embeddings that use more repetition copies than the minimum.
    """
    all_values = list(graph.values.values())
    found: set[frozenset] = set()
    for flat in flat_templates(pattern, len(graph.nodes)):
        if len(flat.ops) > len(graph.nodes):
            continue
        if max_nodes is not None and flat.repeated and len(flat.ops) > max_nodes:
            continue
        cands = []
        for p in flat.ops:
            cands.append([n for n in graph.nodes if p.matches_node(n, REGISTRY.get(n.op_type))])
        var_cands = [[v for v in all_values if var.matches_value(v)] for var in flat.vars]
        for nodes_of in itertools.product(*cands):
            if len({id(n) for n in nodes_of}) != len(nodes_of):
                continue
            for values_of in itertools.product(*var_cands):
                if _embeds(graph, flat, nodes_of, values_of):
                    found.add(frozenset(n.name for n in nodes_of))
                    break
    found = {s for s in found if not any(core <= s for core in banned)}
    return {s for s in found if not any(s < t for t in found)}
