"""The matcher: VF2-style backtracking with a feature index, pruning and incremental re-matching.

For each template of a pattern (see ``template.py``) the matcher picks the most selective op
vertex as the *anchor* (fewest candidates in the ``FeatureIndex``), then extends a partial
embedding one template vertex at a time in a precomputed BFS order: a producer is found through
a node's input slot (one candidate per slot), a consumer through a value's uses. Before it
recurses it prunes a candidate node by

* type, category, tag and attribute predicates (the vertex's ``OpPattern``);
* degree: enough inputs for the slots the pattern binds;
* use: a vertex whose output may not escape must not produce a graph output and every consumer
  of its outputs must be able to match some vertex of the pattern;
* every template edge to vertices already bound (VF2's feasibility test).

Repetitions are unrolled while searching, longest first; an embedding contained in one found
earlier from the same anchor is dropped at once, and a final pass keeps only the embeddings no
other embedding contains (maximal matches, see ``pattern.py``).

**Incremental matching.** Results are kept per pattern. After a rewrite, or when the resolver
takes nodes away (``block``) or refuses a match (``ban``), only the *region* around the changed
nodes is searched again: the nodes that could belong to a match of the pattern (an op type some
vertex accepts), linked by data edges or a shared input, within as many hops of a changed node
as the largest match has nodes. Every embedding is connected in that sense, so one that touches
a changed node lies inside the region, and one that does not is unaffected: matches away from
the change are kept as they were (the property tests compare with a fresh matcher).

Searches are deterministic: anchors are visited in graph order and results sorted by position.
"""
from __future__ import annotations

import time
from typing import AbstractSet, Iterable

from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import REGISTRY
from opfuse.patterns.index import FeatureIndex
from opfuse.patterns.match import Match
from opfuse.patterns.pattern import Pattern
from opfuse.patterns.template import CompiledPattern, Template, VMacro, VOp, VVar, compile_pattern

# Longest unrolling of one repetition (copies). Chains longer than this are matched as several
# windows; any fused group that long exceeds every resource limit the rules use anyway.
MAX_REPEAT = 64

_COMMUTATIVE = "commutative"


class Frame:
    """Bindings of one template instance: the top level, or one copy of a repetition body."""

    __slots__ = ("nodes", "values", "macros", "root")

    def __init__(self, root: "Frame | None" = None):
        self.nodes: dict[int, Node] = {}
        self.values: dict[int, Value] = {}
        self.macros: dict[int, list[Frame]] = {}
        self.root = root or self


class PatternStats:
    """What matching one pattern cost: anchors tried, embeddings found, seconds spent."""

    __slots__ = ("attempts", "embeddings", "seconds", "searches")

    def __init__(self):
        self.attempts = 0
        self.embeddings = 0
        self.seconds = 0.0
        self.searches = 0


class _PatternState:
    def __init__(self, cp: CompiledPattern):
        self.cp = cp
        self.embeddings: dict[frozenset, Match] = {}
        self.by_node: dict[int, set[frozenset]] = {}
        self.maximal: set[frozenset] = set()
        self.fresh: list[frozenset] = []
        self.ban_cores: dict[int, list[frozenset]] = {}  # node id -> banned cores holding it
        self.stats = PatternStats()


def compiled(pattern) -> CompiledPattern:
    """The compiled form of a pattern, cached on the pattern object."""
    if isinstance(pattern, CompiledPattern):
        return pattern
    cp = getattr(pattern, "_compiled", None)
    if cp is None:
        cp = compile_pattern(pattern)
        pattern._compiled = cp
    return cp


class Matcher:
    """Find and maintain the maximal matches of patterns in one graph."""

    def __init__(self, graph, *, max_repeat: int = MAX_REPEAT, max_nodes: int | None = None):
        """``max_nodes`` caps matches that use repetition: a chain or fan stops growing at that many
        nodes (a group limit makes longer ones useless). Fixed-size matches are not capped, so a
        rule whose fixed part is too large is still found and refused with its reason."""
        self.graph = graph
        self.max_repeat = max_repeat
        self.max_nodes = max_nodes
        self.index = FeatureIndex(graph.nodes)
        self.blocked: set[int] = set()
        self._states: dict[int, _PatternState] = {}
        self._removed_nodes: list = []  # see update(): pins ids of removed nodes
        self._refresh_positions()

    # Positions and graph facts -------------------------------------------------------------
    def _refresh_positions(self) -> None:
        self.pos = {id(n): i for i, n in enumerate(self.graph.nodes)}
        self.graph_outputs = {id(v) for v in self.graph.outputs}

    # Public API ----------------------------------------------------------------------------
    def state(self, pattern) -> _PatternState:
        cp = compiled(pattern)
        st = self._states.get(id(cp))
        if st is None:
            st = _PatternState(cp)
            self._states[id(cp)] = st
            self._search_region(st, None)
            st.fresh = sorted(st.maximal, key=self._key_order)
        return st

    def matches(self, pattern) -> list[Match]:
        """The maximal matches of ``pattern``, in graph order."""
        st = self.state(pattern)
        return [st.embeddings[k] for k in sorted(st.maximal, key=self._key_order)]

    def take_new(self, pattern) -> list[Match]:
        """Matches that appeared since the last call (all of them on the first call)."""
        st = self.state(pattern)
        keys = [k for k in st.fresh if k in st.maximal]
        st.fresh = []
        return [st.embeddings[k] for k in sorted(set(keys), key=self._key_order)]

    def current(self, pattern, key: frozenset) -> Match | None:
        """The match with this node set if it is still a maximal match (with fresh captures)."""
        st = self.state(pattern)
        return st.embeddings[key] if key in st.maximal else None

    def stats(self, pattern) -> PatternStats:
        return self.state(pattern).stats

    def update(self, added: Iterable = (), removed: Iterable = (), touched: Iterable = (),
               positions: dict[int, int] | None = None) -> None:
        """Tell the matcher the graph changed: nodes added, removed, or whose inputs/uses changed.

        ``positions`` gives each added node a position consistent with the graph order (a rewrite
        reuses the position of the last node it removed); without it every position is recomputed.
        """
        added, removed, touched = list(added), list(removed), list(touched)
        # Everything here is keyed by id(node): keep removed nodes alive so CPython never hands
        # their ids to new nodes while this matcher (and the engine's keys) still remember them.
        self._removed_nodes.extend(removed)
        for n in removed:
            self.index.remove(n)
        for n in added:
            self.index.add(n)
        if positions is not None and all(id(n) in positions for n in added):
            for n in removed:
                self.pos.pop(id(n), None)
            self.pos.update(positions)
            self.graph_outputs = {id(v) for v in self.graph.outputs}
        else:
            self._refresh_positions()
        seeds = {id(n): n for n in added + touched if id(n) in self.pos}
        for n in added + touched:
            for m in self._neighbours(n):
                seeds.setdefault(id(m), m)
        self._invalidate({id(n) for n in removed}, seeds)

    def block(self, nodes: Iterable) -> None:
        """Nodes taken by a fusion group: no match may use them any more."""
        nodes = [n for n in nodes if id(n) not in self.blocked]
        self.blocked.update(id(n) for n in nodes)
        seeds: dict[int, object] = {}
        for n in nodes:
            for m in self._neighbours(n):
                if id(m) not in self.blocked:
                    seeds.setdefault(id(m), m)
        self._invalidate({id(n) for n in nodes}, seeds)

    def ban(self, pattern, match: Match, culprits=None) -> None:
        """Refuse a match: no match may contain all of ``culprits`` (default: the match's nodes).

        The largest embeddings the refused match contained that avoid the culprits come forward
        as new matches: refusing a too-long chain offers its sub-chains; refusing a Concat for
        its axis (culprit: the Concat) offers nothing, not every subset of its inputs.
        """
        st = self.state(pattern)
        core = match.key if culprits is None else frozenset(id(n) for n in culprits)
        if not core <= match.key:
            raise ValueError("culprits must be nodes of the match")
        for nid in core:
            st.ban_cores.setdefault(nid, []).append(core)
        seeds = {id(n): n for n in match.nodes}
        self._update_state(st, set(), seeds)

    @staticmethod
    def _is_banned(st: _PatternState, key: frozenset) -> bool:
        if not st.ban_cores:
            return False
        for nid in key:
            for core in st.ban_cores.get(nid, ()):
                if core <= key:
                    return True
        return False

    # Invalidation --------------------------------------------------------------------------
    def _invalidate(self, gone: set[int], seeds: dict[int, object]) -> None:
        for st in self._states.values():
            self._update_state(st, gone, dict(seeds))

    def _update_state(self, st: _PatternState, gone: set[int], seeds: dict[int, object]) -> None:
        was_maximal: set[frozenset] = set()
        # Embeddings that used a vanished node: drop them, and search again around what is left.
        for nid in gone:
            for key in list(st.by_node.get(nid, ())):
                for n in st.embeddings[key].nodes:
                    if id(n) not in gone and id(n) in self.pos and id(n) not in self.blocked:
                        seeds.setdefault(id(n), n)
                self._drop(st, key, was_maximal)
        # Embeddings holding a changed node (or a neighbour of one) may have become invalid.
        for nid in seeds:
            for key in list(st.by_node.get(nid, ())):
                self._drop(st, key, was_maximal)
        region = self._region(st.cp, seeds.values())
        if region:
            self._search_region(st, region, was_maximal)

    def _drop(self, st: _PatternState, key: frozenset, was_maximal: set | None = None) -> None:
        m = st.embeddings.pop(key, None)
        if m is None:
            return
        if was_maximal is not None and key in st.maximal:
            was_maximal.add(key)
        for n in m.nodes:
            s = st.by_node.get(id(n))
            if s is not None:
                s.discard(key)
                if not s:
                    del st.by_node[id(n)]
        st.maximal.discard(key)

    def _neighbours(self, node):
        for v in node.inputs:
            if v is not None and v.producer is not None:
                yield v.producer
        for v in node.outputs:
            for u, _ in v.uses:
                yield u

    def _compatible(self, cp: CompiledPattern, node, cache: dict) -> bool:
        """Could ``node`` be in a match of ``cp``? By op type only: a superset, which keeps both
        uses sound (regions may grow, pruning may prune less) and makes the test a lookup."""
        got = cache.get(id(node))
        if got is None:
            got = id(node) not in self.blocked and id(node) in self.pos and cp.admits_type(node.op_type)
            cache[id(node)] = got
        return got

    def _region(self, cp: CompiledPattern, seeds) -> dict[int, object]:
        """Nodes that could share a match with a seed.

        A match is connected through data edges and shared inputs, all its nodes are compatible
        with the pattern, and it has at most ``cp.max_nodes`` nodes: so a breadth-first search
        from the seeds over compatible nodes, ``max_nodes - 1`` hops deep, reaches all of it.
        """
        cache: dict[int, bool] = {}
        region: dict[int, object] = {}
        frontier = [n for n in seeds if self._compatible(cp, n, cache)]
        for n in frontier:
            region[id(n)] = n
        depth = cp.max_nodes(self.max_repeat)
        if self.max_nodes is not None:
            depth = min(depth, max(self.max_nodes, cp.max_nodes(0)))
        for _ in range(depth - 1):
            nxt = []
            for n in frontier:
                nbrs = list(self._neighbours(n))
                for v in n.inputs:            # siblings: nodes reading the same value
                    if v is not None:
                        nbrs.extend(u for u, _ in v.uses)
                for m in nbrs:
                    if id(m) not in region and self._compatible(cp, m, cache):
                        region[id(m)] = m
                        nxt.append(m)
            if not nxt:
                break
            frontier = nxt
        return region

    # Searching -----------------------------------------------------------------------------
    def _search_region(self, st: _PatternState, region: dict[int, object] | None,
                       was_maximal: AbstractSet[frozenset] = frozenset()) -> None:
        """(Re)search every anchor in ``region`` (None: the whole graph), then re-rank maximality.

        Stored matches in the region that are still valid stay (they are found again); only
        matches that were not maximal before the change are reported as fresh.
        """
        t0 = time.perf_counter()
        before: set[frozenset] = set(was_maximal)
        if region is not None:
            before.update(k for nid in region for k in st.by_node.get(nid, ()) if k in st.maximal)
        search = _Search(self, st.cp)
        found: dict[frozenset, Match] = {}
        # Each template starts at its most selective op (fewest candidates in the index).
        plans = []
        nodes: dict[int, object] = {}
        for t in st.cp.templates:
            entry = min(t.ops, key=lambda v: (self.index.estimate(v.pat), v.id))
            plans.append((t, entry, t.order_from(entry)))
            if region is None:
                nodes.update(self.index.candidates(entry.pat))
        if region is not None:
            nodes = region                    # small: the entry predicate filters it below
        banned = lambda k: self._is_banned(st, k)  # noqa: E731
        for node in sorted(nodes.values(), key=lambda n: self.pos[id(n)]):
            search.emitted = []               # matches found from this anchor, any template
            spec = search.spec(node)
            for t, entry, steps in plans:
                if not entry.pat.matches_node(node, spec):
                    continue
                st.stats.attempts += 1
                for key, m in search.run(t, steps, node, banned):
                    if key not in found:
                        found[key] = m
        for key, m in found.items():
            st.embeddings[key] = m          # a match found again gets fresh captures
            for n in m.nodes:
                st.by_node.setdefault(id(n), set()).add(key)
        st.stats.embeddings += len(found)
        # Maximality only changes among embeddings inside the region (see the module docstring).
        keys = list(st.embeddings) if region is None else \
            {k for nid in region for k in st.by_node.get(nid, ())}
        for key in keys:
            dominated = self._dominated(st, key)
            if dominated:
                st.maximal.discard(key)
            elif key not in st.maximal:
                st.maximal.add(key)
                if key not in before:
                    st.fresh.append(key)
        st.stats.seconds += time.perf_counter() - t0
        st.stats.searches += 1

    def _dominated(self, st: _PatternState, key: frozenset) -> bool:
        first = next(iter(key))
        for other in st.by_node.get(first, ()):
            if len(other) > len(key) and key < other:
                return True
        return False

    def _key_order(self, key: frozenset):
        return sorted(self.pos[k] for k in key)


class _Search:
    """One search over a graph for one compiled pattern (state: the nodes in use)."""

    def __init__(self, matcher: Matcher, cp: CompiledPattern):
        self.m = matcher
        self.cp = cp
        self.pos = matcher.pos
        self.blocked = matcher.blocked
        self.graph_outputs = matcher.graph_outputs
        self.used: set[int] = set()
        self.emitted: list[frozenset] = []   # per anchor node, across templates (set by the caller)
        self.n_emitted = 0                     # embeddings emitted so far (any anchor)
        self.cap = matcher.max_nodes if matcher.max_nodes is not None else float("inf")
        self.macro_copies = 0                  # repetition copies bound right now
        self._compat: dict[int, bool] = {}
        self._specs: dict[str, object] = {}

    # Facts about nodes ---------------------------------------------------------------------
    def spec(self, node):
        s = self._specs.get(node.op_type, 0)
        if s == 0:
            s = REGISTRY.get(node.op_type)
            self._specs[node.op_type] = s
        return s

    def commutative(self, node) -> bool:
        s = self.spec(node)
        return s is not None and _COMMUTATIVE in s.tags

    def compatible(self, node) -> bool:
        return self.m._compatible(self.cp, node, self._compat)

    def op_ok(self, v: VOp, node, interior: bool) -> bool:
        """Prune before recursing: free, enough inputs, predicate, and (interior) use."""
        nid = id(node)
        if nid in self.used or nid in self.blocked or len(node.inputs) <= v.max_slot:
            return False
        if not v.pat.matches_node(node, self.spec(node)):
            return False
        if interior:
            for o in node.outputs:
                if id(o) in self.graph_outputs:
                    return False
                for u, _ in o.uses:
                    if not self.compatible(u):
                        return False
        return True

    # Entry ---------------------------------------------------------------------------------
    def run(self, t: Template, steps, node, is_banned):
        """Every embedding of ``t`` with ``steps[0]`` at ``node``, as (key, Match), maximal first."""
        entry = steps[0].vertex
        if not self.op_ok(entry, node, _interior_top(entry)):
            return
        root = Frame()
        root.nodes[entry.id] = node
        self.used.add(id(node))
        try:
            for _ in self._run(steps, 1, root):
                m = self._complete(t, root)
                if m is None:
                    continue
                key = m.key
                if is_banned(key) or any(key <= e for e in self.emitted):
                    continue
                self.emitted.append(key)
                self.n_emitted += 1
                yield key, m
        finally:
            self.used.discard(id(node))

    # The recursion -------------------------------------------------------------------------
    def _run(self, steps, i: int, frame: Frame, body: Template | None = None, macro: VMacro | None = None):
        if i == len(steps):
            yield
            return
        step = steps[i]
        v = step.vertex
        if isinstance(v, VOp):
            interior = _interior_top(v) if macro is None else _interior_body(v, macro.body, macro)
            for node in self._op_candidates(step, frame):
                if not self.op_ok(v, node, interior):
                    continue
                frame.nodes[v.id] = node
                if self._checks(step, frame):
                    self.used.add(id(node))
                    yield from self._run(steps, i + 1, frame, body, macro)
                    self.used.discard(id(node))
                del frame.nodes[v.id]
        elif isinstance(v, VVar):
            home = frame.root if v.is_global else frame
            bound = home.values.get(v.id)
            for value in self._var_candidates(step, frame):
                if bound is not None:
                    if value is bound and self._checks(step, frame):
                        yield from self._run(steps, i + 1, frame, body, macro)
                    continue
                if not v.pat.matches_value(value):
                    continue
                home.values[v.id] = value
                if self._checks(step, frame):
                    yield from self._run(steps, i + 1, frame, body, macro)
                del home.values[v.id]
        else:
            expand = self._chain if v.kind == "chain" else self._fan
            for _ in expand(step, frame):
                yield from self._run(steps, i + 1, frame, body, macro)

    def _checks(self, step, frame: Frame) -> bool:
        for e in step.checks:
            if not self._edge_ok(e, frame):
                return False
        if step.via is not None and (isinstance(step.via.src, VMacro) or isinstance(step.via.dst, VMacro)):
            if not self._edge_ok(step.via, frame):
                return False
        node = frame.nodes.get(step.vertex.id)
        if node is not None:
            p = self.pos[id(node)]
            for a in step.before:
                if self.pos[id(frame.nodes[a.id])] >= p:
                    return False
            for b in step.after:
                if self.pos[id(frame.nodes[b.id])] <= p:
                    return False
        return True

    # Edges ---------------------------------------------------------------------------------
    def _src_values(self, src, frame: Frame) -> list[list]:
        """What ``src`` offers downstream, one list of values per copy."""
        if isinstance(src, VOp):
            return [frame.nodes[src.id].outputs]
        if isinstance(src, VVar):
            home = frame.root if src.is_global else frame
            return [[home.values[src.id]]]
        copies = frame.macros[src.id]
        tail = src.body.tail_op.id
        if src.kind == "chain":
            return [copies[-1].nodes[tail].outputs]
        return [c.nodes[tail].outputs for c in copies]

    def _dst_nodes(self, dst, frame: Frame) -> list:
        if isinstance(dst, VOp):
            return [frame.nodes[dst.id]]
        copies = frame.macros[dst.id]
        head = dst.body.head_op.id
        if dst.kind == "chain":
            return [copies[0].nodes[head]]
        return [c.nodes[head] for c in copies]

    def _feeds(self, values, node, slot) -> bool:
        if slot is None or self.commutative(node):
            return any(x is v for x in node.inputs for v in values)
        return slot < len(node.inputs) and any(node.inputs[slot] is v for v in values)

    def _edge_ok(self, e, frame: Frame) -> bool:
        slot = e.slot
        dsts = self._dst_nodes(e.dst, frame)
        for values in self._src_values(e.src, frame):
            for node in dsts:
                if not self._feeds(values, node, slot):
                    return False
        return True

    def _slots(self, node, slot):
        if slot is None or self.commutative(node):
            return range(len(node.inputs))
        return (slot,) if slot < len(node.inputs) else ()

    def _producers(self, node, slots):
        seen: set[int] = set()
        for s in slots:
            v = node.inputs[s]
            if v is not None and v.producer is not None and id(v.producer) not in seen:
                seen.add(id(v.producer))
                yield v.producer

    def _consumers(self, values, slot):
        seen: set[int] = set()
        for v in values:
            for u, i in v.uses:
                if id(u) in seen:
                    continue
                if slot is not None and i != slot and not self.commutative(u):
                    continue
                seen.add(id(u))
                yield u

    def _op_candidates(self, step, frame: Frame):
        e = step.via
        if step.direction == "up":
            node = self._dst_nodes(e.dst, frame)[0]
            return list(self._producers(node, self._slots(node, e.slot)))
        values = self._src_values(e.src, frame)[0]
        return list(self._consumers(values, e.slot))

    def _var_candidates(self, step, frame: Frame):
        e = step.via
        node = self._dst_nodes(e.dst, frame)[0]
        seen: set[int] = set()
        out = []
        for s in self._slots(node, e.slot):
            v = node.inputs[s]
            if v is not None and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    # Repetition ----------------------------------------------------------------------------
    def _cap(self, macro: VMacro) -> int:
        return self.m.max_repeat if macro.hi is None else min(macro.hi, self.m.max_repeat)

    def _copies_at(self, macro: VMacro, entry: VOp, node, frame: Frame):
        """Every embedding of one body copy with ``entry`` (head or tail) at ``node``."""
        body = macro.body
        if len(self.used) >= self.cap:
            return  # one more node would exceed the size cap for repeated matches
        interior = _interior_body(entry, body, macro)
        if not self.op_ok(entry, node, interior):
            return
        copy = Frame(frame.root)
        copy.nodes[entry.id] = node
        self.used.add(id(node))
        try:
            steps = body.order_from(entry)
            for _ in self._run(steps, 1, copy, body, macro):
                yield copy
        finally:
            self.used.discard(id(node))

    def _chain(self, step, frame: Frame):
        yield from self._chain_grow(step, frame, [], upward=step.direction == "up")

    def _chain_grow(self, step, frame: Frame, copies: list, upward: bool):
        """Add one copy at the open end (longest chains first), yielding each legal length."""
        macro: VMacro = step.vertex
        body = macro.body
        e = step.via
        if upward:
            if copies:
                node, slot = copies[0].nodes[body.head_op.id], body.head_slot
            else:
                node, slot = self._dst_nodes(e.dst, frame)[0], e.slot
            cands = list(self._producers(node, self._slots(node, slot)))
            entry = body.tail_op
        else:
            values = copies[-1].nodes[body.tail_op.id].outputs if copies else self._src_values(e.src, frame)[0]
            cands = list(self._consumers(values, body.head_slot))
            entry = body.head_op
        for cand in cands:
            for copy in self._copies_at(macro, entry, cand, frame):
                if upward:
                    copies.insert(0, copy)
                else:
                    copies.append(copy)
                self.macro_copies += 1
                emitted = self.n_emitted
                if len(copies) < self._cap(macro):
                    yield from self._chain_grow(step, frame, copies, upward)
                # When nothing follows this step, a longer chain already emitted from here
                # contains every node bound now: stopping here could only give a subset.
                longer_found = step.last and self.n_emitted > emitted
                if len(copies) >= macro.lo and not longer_found:
                    frame.macros[macro.id] = copies
                    if self._checks(step, frame):
                        yield
                    del frame.macros[macro.id]
                self.macro_copies -= 1
                if upward:
                    copies.pop(0)
                else:
                    copies.pop()

    def _fan(self, step, frame: Frame):
        macro: VMacro = step.vertex
        body = macro.body
        e = step.via
        if step.direction == "up":
            node = self._dst_nodes(e.dst, frame)[0]
            cands = list(self._producers(node, self._slots(node, e.slot)))
            entry = body.tail_op
        else:
            cands = list(self._consumers(self._src_values(e.src, frame)[0], e.slot))
            entry = body.head_op
        cands.sort(key=lambda n: self.pos[id(n)])
        if macro.after is not None:
            anchor_node = frame.nodes.get(macro.after.id)
            if anchor_node is not None:
                lim = self.pos[id(anchor_node)]
                cands = [c for c in cands if self.pos[id(c)] > lim]
        single = len(body.vertices) == 1
        yield from self._fan_pick(step, frame, cands, 0, [], entry, single)

    def _fan_pick(self, step, frame: Frame, cands, i: int, chosen: list, entry: VOp, single: bool):
        """Choose a subset of the candidates, including before excluding (widest first)."""
        macro: VMacro = step.vertex
        if i == len(cands):
            if len(chosen) >= macro.lo:
                frame.macros[macro.id] = list(chosen)
                if self._checks(step, frame):
                    yield
                del frame.macros[macro.id]
            return
        if len(chosen) < self._cap(macro):
            for copy in self._copies_at(macro, entry, cands[i], frame):
                chosen.append(copy)
                self.macro_copies += 1
                yield from self._fan_pick(step, frame, cands, i + 1, chosen, entry, single)
                self.macro_copies -= 1
                chosen.pop()
        # Skipping candidate i can only give a subset of a match already found from this
        # anchor when nothing but the remaining candidates could still join.
        if step.last and single and self.emitted:
            potential = self.used | {id(c) for c in cands[i + 1:]}
            if any(potential <= e for e in self.emitted):
                return
        yield from self._fan_pick(step, frame, cands, i + 1, chosen, entry, single)

    # Completion ----------------------------------------------------------------------------
    def _complete(self, t: Template, root: Frame) -> Match | None:
        nodes: list = []
        exposable: set[int] = set()
        ok = self._collect(t, root, None, nodes, exposable)
        if not ok or (self.macro_copies and len(nodes) > self.cap):
            return None
        key = {id(n) for n in nodes}
        for n in nodes:
            if id(n) in exposable:
                continue
            for o in n.outputs:
                if id(o) in self.graph_outputs:
                    return None
                for u, _ in o.uses:
                    if id(u) not in key:
                        return None
        nodes.sort(key=lambda n: self.pos[id(n)])
        return Match(self.cp.pattern, tuple(nodes), self._captures(t, root), frozenset(exposable), self.m.graph)

    def _collect(self, t: Template, frame: Frame, macro: VMacro | None, nodes: list, exposable: set) -> bool:
        """Gather nodes; check commutative slot permutations and pending order constraints."""
        for v in t.vertices:
            if isinstance(v, VOp):
                if v.id not in frame.nodes:
                    continue  # a global variable's body edge, or an unbound (impossible) vertex
                node = frame.nodes[v.id]
                nodes.append(node)
                if macro is None:
                    if not _interior_top(v):
                        exposable.add(id(node))
                elif not _interior_body(v, t, macro):
                    exposable.add(id(node))
                if not self._slots_assignable(v, node, frame):
                    return False
            elif isinstance(v, VMacro):
                copies = frame.macros.get(v.id, ())
                if v.after is not None and v.kind == "fan":
                    lim = self.pos[id(frame.nodes[v.after.id])]
                    if any(self.pos[id(c.nodes[v.body.tail_op.id])] <= lim for c in copies):
                        return False
                for c in copies:
                    if not self._collect(v.body, c, v, nodes, exposable):
                        return False
        return True

    def _slots_assignable(self, v: VOp, node, frame: Frame) -> bool:
        """For a commutative node, the explicitly bound slots must map to distinct inputs."""
        if v.explicit < 2 or not self.commutative(node):
            return True
        explicit = [e for e in v.ins if e.slot is not None]
        options = []
        for e in explicit:
            src = self._src_values(e.src, frame)[0]
            options.append([s for s, x in enumerate(node.inputs) if x is not None and any(x is y for y in src)])

        def assign(k: int, taken: set) -> bool:
            if k == len(options):
                return True
            return any(assign(k + 1, taken | {s}) for s in options[k] if s not in taken)
        return assign(0, set())

    def _captures(self, t: Template, root: Frame) -> dict:
        where: dict[int, list] = {}

        def walk(tt: Template, frame: Frame):
            for v in tt.vertices:
                if isinstance(v, VOp) and v.id in frame.nodes:
                    where.setdefault(v.id, []).append(frame.nodes[v.id])
                elif isinstance(v, VVar):
                    home = frame.root if v.is_global else frame
                    if v.id in home.values:
                        lst = where.setdefault(v.id, [])
                        if not any(x is home.values[v.id] for x in lst):
                            lst.append(home.values[v.id])
                elif isinstance(v, VMacro):
                    for c in frame.macros.get(v.id, ()):
                        walk(v.body, c)
                        where.setdefault(v.id, []).extend(c.nodes[x.id] for x in v.body.ops)
        walk(t, root)
        out: dict = {name: (None if kind in ("node", "value") else []) for name, kind in self.cp.capture_kinds.items()}
        for name, (kind, ids) in t.captures.items():
            got = []
            seen: set[int] = set()
            for vid in ids:
                for x in where.get(vid, ()):
                    if id(x) not in seen:
                        seen.add(id(x))
                        got.append(x)
            if kind in ("node", "value"):
                out[name] = got[0] if got else None
            else:
                if kind == "nodes":  # a named compound pattern lists its ops, not its variables
                    got = sorted((x for x in got if hasattr(x, "op_type")), key=lambda n: self.pos[id(n)])
                out[name] = got
        return out


def _interior_top(v: VOp) -> bool:
    """A top-level op whose outputs may not escape: it feeds another vertex and is not kept."""
    return bool(v.outs) and not v.keep


def _interior_body(v: VOp, body: Template, macro: VMacro) -> bool:
    if v.keep:
        return False
    if v is body.tail:
        # a chain copy's tail feeds the next copy (or the op after the chain); a fan copy's tail
        # escapes only when the fan is a sink of the pattern
        return bool(macro.outs) or macro.kind == "chain"
    return bool(v.outs)


def find_matches(graph, pattern: Pattern) -> list[Match]:
    """The maximal matches of one pattern in a graph (a one-shot ``Matcher``)."""
    return Matcher(graph).matches(pattern)


__all__ = ["Matcher", "Frame", "PatternStats", "find_matches", "compiled", "MAX_REPEAT"]
