"""Compile a pattern expression into *templates*: the concrete DAGs the matcher embeds.

A pattern with alternation (``a | b``) and optional parts denotes several templates; this module
enumerates them ("variants"). A repetition ``p.repeat(lo, hi)`` becomes ``c = max(lo, 1)``
concrete copies of ``p`` chained producer to consumer, optionally preceded by a *chain macro*
vertex that stands for 1..(hi - c) more copies, which the matcher unrolls while it searches; a
``lo = 0`` repetition also yields the variant without any copy. ``many(p)`` becomes one
concrete copy plus an optional *fan macro* for the others, ordered after it (symmetry breaking,
so one fan is found once, not once per permutation).

Template vocabulary:

* ``VOp``: an op vertex (one node), with the ``OpPattern`` that is its predicate;
* ``VVar``: a value variable (``Var``/``Const``), global when it is shared by repetition copies;
* ``VMacro``: a chain or fan of copies of a *body* template (one head, one tail);
* ``Edge(src, dst, slot)``: an output of src is input ``slot`` of dst (``slot`` None: any input).

A body of a repetition is a fixed sub-DAG: op-level alternation is allowed inside it
(``(Op("Add") | Op(tag="activation")).plus()``), compound alternation and nested repetition are
not (``PatternError``). Templates must be connected and hold an op outside any macro (the anchor
of the search).
"""
from __future__ import annotations

import itertools
from typing import TypeVar

from opfuse.patterns.pattern import (Alt, Many, OpPattern, Par, Pattern, PatternError, Repeat, Seq, Var)

# The most templates one pattern may expand to (every ``|`` and every optional part doubles
# the count); beyond this a pattern should be split into several rules.
MAX_VARIANTS = 64

V = TypeVar("V", bound="Vertex")


class Vertex:
    __slots__ = ("id", "capture", "ins", "outs", "list_capture")

    def __init__(self, vid: int, capture: str | None, list_capture: bool):
        self.id = vid
        self.capture = capture
        self.list_capture = list_capture  # inside a repetition: the capture collects a list
        self.ins: list[Edge] = []
        self.outs: list[Edge] = []


class VOp(Vertex):
    __slots__ = ("pat", "keep", "max_slot", "explicit")

    def __init__(self, vid: int, pat: OpPattern, list_capture: bool):
        super().__init__(vid, pat.capture, list_capture)
        self.pat = pat
        self.keep = pat.kept
        self.max_slot = -1
        self.explicit = 0   # in-edges with an explicit slot

    def __repr__(self) -> str:
        return f"VOp#{self.id}<{self.pat!r}>"


class VVar(Vertex):
    __slots__ = ("pat", "is_global")

    def __init__(self, vid: int, pat: Var, list_capture: bool, is_global: bool = False):
        super().__init__(vid, pat.capture, list_capture)
        self.pat = pat
        self.is_global = is_global

    def __repr__(self) -> str:
        return f"VVar#{self.id}<{self.pat!r}>"


class VMacro(Vertex):
    """``kind`` "chain": copies in a producer->consumer line; "fan": copies side by side."""

    __slots__ = ("kind", "body", "lo", "hi", "after")

    def __init__(self, vid: int, kind: str, body: "Template", lo: int, hi: int | None,
                 capture: str | None):
        super().__init__(vid, capture, True)
        self.kind = kind
        self.body = body
        self.lo = lo
        self.hi = hi
        self.after: Vertex | None = None  # fan: every copy's tail lies after this vertex's node

    def __repr__(self) -> str:
        return f"VMacro#{self.id}<{self.kind} {self.lo}..{self.hi}>"


class Edge:
    __slots__ = ("src", "dst", "slot", "index")

    def __init__(self, src: Vertex, dst: Vertex, slot: int | None, index: int):
        self.src = src
        self.dst = dst
        self.slot = slot
        self.index = index

    def __repr__(self) -> str:
        return f"{self.src!r} -> {self.dst!r}@{self.slot}"


class Step:
    """One step of a search order: bind ``vertex`` reached through ``via`` (None for the entry).

    ``direction`` is "entry", "up" (vertex produces an input of a bound vertex) or "down"
    (vertex consumes an output of a bound vertex). ``checks`` are the other edges between this
    vertex and vertices bound earlier; ``before``/``after`` are symmetry-breaking order checks.
    """

    __slots__ = ("vertex", "via", "direction", "checks", "before", "after", "last")

    def __init__(self, vertex, via, direction):
        self.vertex = vertex
        self.via = via
        self.direction = direction
        self.checks: list[Edge] = []
        self.before: list[Vertex] = []   # bound vertices whose node must come before ours
        self.after: list[Vertex] = []    # bound vertices whose node must come after ours
        self.last = False


class Template:
    def __init__(self):
        self.vertices: list[Vertex] = []
        self.edges: list[Edge] = []
        self.head: VOp | None = None  # bodies: the op the incoming link feeds
        self.tail: VOp | None = None  # bodies: the op whose output leaves
        self.head_slot: int | None = None  # bodies: the head's input the incoming link enters
        self.order_pairs: list[tuple[Vertex, Vertex]] = []  # (a, b): node(a) before node(b)
        self.captures: dict[str, tuple[str, list[int]]] = {}
        self._orders: dict[int, list[Step]] = {}

    # Queries ----------------------------------------------------------------------------
    @property
    def head_op(self) -> VOp:
        """A repetition body's head (only bodies have one)."""
        if self.head is None:
            raise PatternError("not a repetition body: no head")
        return self.head

    @property
    def tail_op(self) -> VOp:
        """A repetition body's tail (only bodies have one)."""
        if self.tail is None:
            raise PatternError("not a repetition body: no tail")
        return self.tail

    @property
    def ops(self) -> list[VOp]:
        return [v for v in self.vertices if isinstance(v, VOp)]

    def sinks(self) -> list[Vertex]:
        return [v for v in self.vertices if not isinstance(v, VVar) and not v.outs]

    def all_ops(self) -> list[VOp]:
        """Op vertices here and in macro bodies."""
        out = []
        for v in self.vertices:
            if isinstance(v, VOp):
                out.append(v)
            elif isinstance(v, VMacro):
                out.extend(v.body.all_ops())
        return out

    def order_from(self, entry: Vertex) -> list[Step]:
        """A VF2 search order: a BFS over the template from ``entry``.

        Producer steps come before consumer steps (a node has one producer per input but may
        have many consumers) and macros come last (their unrolling is the widest branching).
        """
        cached = self._orders.get(entry.id)
        if cached is not None:
            return cached
        placed: dict[int, int] = {entry.id: 0}
        steps = [Step(entry, None, "entry")]
        while len(steps) < len(self.vertices):
            best = None
            for e in self.edges:
                src_placed, dst_placed = e.src.id in placed, e.dst.id in placed
                if src_placed == dst_placed:
                    continue
                vertex, direction = (e.src, "up") if dst_placed else (e.dst, "down")
                rank = (isinstance(vertex, VMacro), direction == "down", e.index)
                if best is None or rank < best[0]:
                    best = (rank, vertex, e, direction)
            if best is None:
                raise PatternError("pattern is not connected")
            _, vertex, via, direction = best
            step = Step(vertex, via, direction)
            for e in vertex.ins + vertex.outs:
                other = e.src if e.dst is vertex else e.dst
                if e is not via and other.id in placed and e not in step.checks:
                    step.checks.append(e)
            for a, b in self.order_pairs:
                if b is vertex and a.id in placed:
                    step.before.append(a)
                if a is vertex and b.id in placed:
                    step.after.append(b)
            placed[vertex.id] = len(steps)
            steps.append(step)
        steps[-1].last = True
        self._orders[entry.id] = steps
        return steps


class CompiledPattern:
    """All templates of one pattern, plus what the matcher needs to know about them."""

    def __init__(self, pattern: Pattern, templates: list[Template]):
        self.pattern = pattern
        self.templates = templates
        ops = [v for t in templates for v in t.all_ops()]
        # Distinct predicates (by pattern object) for the "could this node be in a match" test.
        seen: dict[int, OpPattern] = {}
        for v in ops:
            seen.setdefault(id(v.pat), v.pat)
        self.op_patterns: list[OpPattern] = list(seen.values())
        self._type_ok: dict[str, bool] = {}
        # Every capture name any template defines (a template without it reports None or []).
        self.capture_kinds: dict[str, str] = {}
        for t in templates:
            for name, (kind, _) in t.captures.items():
                self.capture_kinds.setdefault(name, kind)
        self.has_repetition = any(isinstance(v, VMacro) for t in templates for v in t.vertices)

    def max_nodes(self, max_repeat: int) -> int:
        """The most nodes one match can have (repetition macros unrolled at most ``max_repeat``
        times; 0 counts only the fixed part)."""
        best = 0
        for t in self.templates:
            n = 0
            for v in t.vertices:
                if isinstance(v, VOp):
                    n += 1
                elif isinstance(v, VMacro):
                    cap = max_repeat if v.hi is None else min(v.hi, max_repeat)
                    n += cap * len(v.body.ops)
            best = max(best, n)
        return best

    def admits_type(self, op_type: str) -> bool:
        """Could a node of this op type be part of a match (constraints aside)? Cached."""
        got = self._type_ok.get(op_type)
        if got is None:
            from opfuse.ops.registry import REGISTRY
            spec = REGISTRY.get(op_type)
            got = any(p.admits_type(op_type, spec) for p in self.op_patterns)
            self._type_ok[op_type] = got
        return got

    def __repr__(self) -> str:
        return f"CompiledPattern({self.pattern!r}, {len(self.templates)} templates)"


# The compiler -------------------------------------------------------------------------------

class _Iface:
    """What a sub-pattern offers to ``>>``: heads (vertex, slot) to feed and tail vertices."""

    __slots__ = ("heads", "tails")

    def __init__(self, heads, tails):
        self.heads = heads
        self.tails = tails


EMPTY = _Iface([], [])


class _Scan:
    """Walk the expression once: choice points, variable scopes, reference counts."""

    def __init__(self, root: Pattern):
        self.choices: list[Pattern] = []   # Alt and Repeat objects outside repetition bodies
        self.refs: dict[int, int] = {}
        self.owners: dict[int, set] = {}   # var uid -> ids of the repetitions containing it (0: top)
        self.op_owners: dict[int, set] = {}
        self._seen: set[tuple[int, int]] = set()
        self._walk(root, 0, top=True)

    def _walk(self, p: Pattern, owner: int, top: bool):
        self.refs[id(p)] = self.refs.get(id(p), 0) + 1
        if isinstance(p, Var):
            self.owners.setdefault(p.uid, set()).add(owner)
            return
        if isinstance(p, OpPattern):
            self.op_owners.setdefault(p.uid, set()).add(owner)
        key = (id(p), owner)
        if key in self._seen:
            return
        self._seen.add(key)
        if isinstance(p, OpPattern):
            for i in p.inputs:
                if i is not None:
                    self._walk(i, owner, top)
        elif isinstance(p, Seq):
            self._walk(p.first, owner, top)
            self._walk(p.second, owner, top)
        elif isinstance(p, Par):
            for b in p.branches:
                self._walk(b, owner, top)
        elif isinstance(p, Alt):
            if not top:
                raise PatternError(f"alternation of compound patterns inside a repetition: {p!r}")
            self.choices.append(p)
            for o in p.options():
                self._walk(o, owner, top)
        elif isinstance(p, (Repeat, Many)):
            if not top:
                raise PatternError(f"nested repetition is not supported: {p!r}")
            if len(modes(p)) > 1:
                self.choices.append(p)
            self._walk(p.body, id(p), top=False)
        else:
            raise PatternError(f"not a pattern: {p!r}")

    def options(self, p) -> int:
        return len(p.options()) if isinstance(p, Alt) else len(modes(p))


def modes(p) -> list[str]:
    """How a repetition may be realised in one template.

    Repeat: "none" (no copy, when lo = 0), "plain" (c = max(lo, 1) concrete copies), "chain"
    (c concrete copies after a chain macro of 1..hi-c more). Many: "one" (a single copy, when
    lo <= 1) and "fan" (one copy plus a fan macro of the others).
    """
    if isinstance(p, Repeat):
        out = ["none"] if p.lo == 0 else []
        out.append("plain")
        if p.hi is None or p.hi > max(p.lo, 1):
            out.append("chain")
        return out
    out = ["one"] if p.lo <= 1 else []
    if p.hi is None or p.hi > 1:
        out.append("fan")
    return out


class _Builder:
    def __init__(self, scan: _Scan, choice: dict[int, int], counter, root: "_Builder | None" = None):
        self.root = root or self
        self.scan = scan
        self.choice = choice
        self.counter = counter
        self.template = Template()
        self.memo: dict[int, _Iface] = {}
        self.global_vars: dict[int, VVar] = {}
        self.captures: dict[str, tuple[str, list[int]]] = {}
        self._collect: list[list[int]] = []
        self.in_body = False

    # Vertices -----------------------------------------------------------------------------
    def _add(self, v: V) -> V:
        self.template.vertices.append(v)
        for c in self._collect:
            c.append(v.id)
        return v

    def _edge(self, src: Vertex, dst: Vertex, slot: int | None):
        if isinstance(src, VMacro) and isinstance(dst, VMacro):
            raise PatternError("a repetition cannot feed another repetition directly; put an op between")
        if isinstance(dst, VVar):
            raise PatternError("a variable cannot consume a value")
        for e in dst.ins:
            if e.src is src and e.slot == slot:
                return
        e = Edge(src, dst, slot, len(self.template.edges))
        self.template.edges.append(e)
        src.outs.append(e)
        dst.ins.append(e)
        if isinstance(dst, VOp) and slot is not None:
            dst.max_slot = max(dst.max_slot, slot)
            dst.explicit += 1

    def _capture(self, name: str | None, kind: str, ids: list[int]):
        if name is None:
            return
        if name in self.captures:
            old_kind, old_ids = self.captures[name]
            if old_kind != kind or kind not in ("nodes", "values"):
                raise PatternError(f"capture name '{name}' is used twice")
            old_ids.extend(ids)
            return
        self.captures[name] = (kind, list(ids))

    # Expressions --------------------------------------------------------------------------
    def build(self, p: Pattern) -> _Iface:
        got = self.memo.get(id(p))
        if got is not None:
            return got
        collect: list[int] = []
        self._collect.append(collect)
        try:
            iface = self._build(p)
        finally:
            self._collect.pop()
        if p.capture is not None and not isinstance(p, (OpPattern, Var)):
            self._capture(p.capture, "nodes", collect)
        self.memo[id(p)] = iface
        return iface

    def _build(self, p: Pattern) -> _Iface:
        if isinstance(p, Var):
            return _Iface([], [self._var(p)])
        if isinstance(p, OpPattern):
            v = self._add(VOp(next(self.counter), p, self.in_body))
            if p.capture is not None:
                self._capture(p.capture, "nodes" if self.in_body else "node", [v.id])
            for slot, inp in enumerate(p.inputs):
                if inp is None:
                    continue
                sub = self.build(inp)
                if len(sub.tails) != 1:
                    raise PatternError(f"input {slot} of {p!r} must be one op or variable")
                self._edge(sub.tails[0], v, slot)
            return _Iface([(v, p.entry_slot)], [v])
        if isinstance(p, Seq):
            a = self.build(p.first)
            b = self.build(p.second)
            if a is EMPTY:
                return b
            if b is EMPTY:
                return a
            if not b.heads:
                raise PatternError(f"nothing in {p.second!r} can consume {p.first!r}")
            for t in a.tails:
                for h, slot in b.heads:
                    self._edge(t, h, slot)
            return _Iface(a.heads, b.tails)
        if isinstance(p, Par):
            parts = [self.build(b) for b in p.branches]
            self._symmetry(p)
            heads = [h for part in parts for h in part.heads]
            tails = [t for part in parts for t in part.tails]
            return _Iface(heads, tails) if tails else EMPTY
        if isinstance(p, Alt):
            return self.build(p.options()[self.choice[id(p)]])
        if isinstance(p, Repeat):
            return self._repeat(p)
        if isinstance(p, Many):
            return self._many(p)
        raise PatternError(f"not a pattern: {p!r}")

    def _var(self, p: Var) -> VVar:
        owners = self.scan.owners.get(p.uid, {0})
        if 0 in owners or len(owners) > 1:
            v = self.root._global_var(p)      # bound once, shared by every repetition copy
            if v not in self.template.vertices:
                self.template.vertices.append(v)
            return v
        if not self.in_body:
            return self._global_var(p)
        got = self.memo.get(id(p))
        if got is not None:
            return got.tails[0]
        v = self._add(VVar(next(self.counter), p, True))
        self._capture(p.capture, "values", [v.id])
        return v

    def _global_var(self, p: Var) -> VVar:
        v = self.global_vars.get(p.uid)
        if v is None:
            v = VVar(next(self.counter), p, False, is_global=True)
            self.template.vertices.append(v)
            self.global_vars[p.uid] = v
            self._capture(p.capture, "value", [v.id])
        for c in self._collect:
            c.append(v.id)
        return v

    def _symmetry(self, p: Par):
        """Identical, singly-referenced branches may be ordered by node position (same node set)."""
        groups: dict[str, list] = {}
        for b in p.branches:
            if self.scan.refs.get(id(b), 0) == 1:
                groups.setdefault(repr(b), []).append(b)
        for same in groups.values():
            tails = [self.memo[id(b)].tails for b in same]
            if len(same) > 1 and all(len(t) == 1 for t in tails) and not any(_has_capture(b) for b in same):
                for x, y in itertools.pairwise(tails):
                    self.template.order_pairs.append((x[0], y[0]))

    def _copy(self, body: Pattern) -> _Iface:
        """A fresh instantiation of a repetition body (its own op vertices, shared global vars)."""
        saved_memo, saved_body = self.memo, self.in_body
        self.memo = {}
        self.in_body = True
        try:
            iface = self.build(body)
        finally:
            self.memo, self.in_body = saved_memo, saved_body
        if len(iface.heads) != 1 or len(iface.tails) != 1 or isinstance(iface.tails[0], VVar):
            raise PatternError(f"a repeated pattern needs one input op and one output op: {body!r}")
        return iface

    def _macro_body(self, body: Pattern) -> Template:
        sub = _Builder(self.scan, self.choice, self.counter, root=self.root)
        sub.in_body = True
        iface = sub.build(body)
        if len(iface.heads) != 1 or len(iface.tails) != 1:
            raise PatternError(f"a repeated pattern needs one input op and one output op: {body!r}")
        head, tail = iface.heads[0][0], iface.tails[0]
        if not isinstance(head, VOp) or not isinstance(tail, VOp):  # a variable (repetitions do not nest)
            raise PatternError(f"a repeated pattern needs one input op and one output op: {body!r}")
        t = sub.template
        t.head, t.tail = head, tail
        t.head_slot = iface.heads[0][1]
        for name, (kind, ids) in sub.captures.items():
            self._capture(name, kind, ids)
        for c in self._collect:
            c.extend(v.id for v in t.all_ops())
        # Global variables a body reads are vertices of the outer template; the body lists the
        # edges from them, the outer template only needs them present.
        return t

    def _repeat(self, p: Repeat) -> _Iface:
        mode = modes(p)[self.choice.get(id(p), 0)]
        if mode == "none":
            return EMPTY
        concrete = max(p.lo, 1)
        first = prev = self._copy(p.body)
        for _ in range(concrete - 1):
            cur = self._copy(p.body)
            self._edge(prev.tails[0], cur.heads[0][0], cur.heads[0][1])
            prev = cur
        if mode == "chain":
            hi = None if p.hi is None else p.hi - concrete
            m = self._add(VMacro(next(self.counter), "chain", self._macro_body(p.body), 1, hi, None))
            self._edge(m, first.heads[0][0], first.heads[0][1])
            return _Iface([(m, m.body.head_slot)], prev.tails)
        return _Iface(first.heads, prev.tails)

    def _many(self, p: Many) -> _Iface:
        one = self._copy(p.body)
        if modes(p)[self.choice.get(id(p), 0)] == "one":
            return one
        hi = None if p.hi is None else p.hi - 1
        m = self._add(VMacro(next(self.counter), "fan", self._macro_body(p.body), max(p.lo - 1, 1), hi, None))
        m.after = one.tails[0]
        return _Iface(one.heads + [(m, m.body.head_slot)], one.tails + [m])


def _has_capture(p: Pattern) -> bool:
    """Captures that would tell symmetric branches apart (a shared variable's does not)."""
    if isinstance(p, Var):
        return False
    if p.capture is not None:
        return True
    if isinstance(p, OpPattern):
        return any(i is not None and _has_capture(i) for i in p.inputs)
    if isinstance(p, (Seq, Alt)):
        return _has_capture(p.first) or _has_capture(p.second)
    if isinstance(p, Par):
        return any(_has_capture(b) for b in p.branches)
    if isinstance(p, (Repeat, Many)):
        return _has_capture(p.body)
    return False


def _connected(t: Template) -> bool:
    if not t.vertices:
        return False
    adj: dict[int, list[int]] = {v.id: [] for v in t.vertices}
    for e in t.edges:
        adj[e.src.id].append(e.dst.id)
        adj[e.dst.id].append(e.src.id)
    seen = {t.vertices[0].id}
    stack = [t.vertices[0].id]
    while stack:
        for w in adj[stack.pop()]:
            if w not in seen:
                seen.add(w)
                stack.append(w)
    return len(seen) == len(t.vertices)


def compile_pattern(pattern: Pattern) -> CompiledPattern:
    """Every template of ``pattern`` (see the module docstring); raises ``PatternError``."""
    if isinstance(pattern, Var):
        raise PatternError("a pattern must contain at least one op")
    scan = _Scan(pattern)
    for owners in scan.op_owners.values():
        if len(owners) > 1:
            raise PatternError("an op pattern object is used both inside and outside a repetition")
    ranges = [range(scan.options(c)) for c in scan.choices]
    total = 1
    for r in ranges:
        total *= len(r)
    if total > MAX_VARIANTS:
        raise PatternError(f"pattern expands to {total} templates (more than {MAX_VARIANTS}); split it")
    counter = itertools.count()
    templates: list[Template] = []
    for combo in itertools.product(*ranges):
        choice = {id(c): k for c, k in zip(scan.choices, combo, strict=True)}
        b = _Builder(scan, choice, counter)
        iface = b.build(pattern)
        if iface is EMPTY or not b.template.ops:
            continue
        t = b.template
        if not _connected(t):
            raise PatternError(f"pattern is not connected: {pattern!r}")
        t.captures = b.captures
        templates.append(t)
    if not templates:
        raise PatternError(f"pattern matches nothing: {pattern!r}")
    return CompiledPattern(pattern, templates)


__all__ = ["compile_pattern", "CompiledPattern", "Template", "VOp", "VVar", "VMacro", "Edge", "Step",
           "MAX_VARIANTS"]
