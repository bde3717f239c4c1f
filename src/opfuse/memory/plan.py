"""``MemoryPlan``: where every tensor between kernels lives.

Regions:

* ``input`` / ``output``: the caller's buffers. Graph inputs are read in place through the
  pointer the caller passes; graph outputs are written straight into the caller's output
  buffers (no copy at the end). Neither takes arena space.
* ``static``: constants and values computed from constants (``static.py``); they go into
  the read-only weights blob the code generator lays out.
* ``arena``: one block of scratch memory, sized at compile time, for every other tensor
  that crosses a kernel boundary. Values internal to a fused group never get storage.

Liveness is over the kernel order (``plan.groups``): a value lives from the kernel that
produces it to the last kernel that reads it, inclusive. Several values can share one
*block* of bytes:

* views: a group that is only a Reshape/Flatten/Squeeze/Unsqueeze/Identity (or a Split
  along an axis with only unit axes before it) produces bytes that already exist, so its
  output is the input's block at an offset and the kernel does nothing;
* Concat aliasing: in a group of kind ``"concat"`` (or with ``attrs["alias_inputs"]``),
  each input whose slice of the output is contiguous is written by its producer straight
  into that slice, and the Concat copies only the rest; the input of a Split marked
  ``attrs["through_concat"]`` (``rules.aliasing.split_through_refusal``) is placed at its
  outputs' slices, which become views of it;
* in place: an output computed over an input that dies at that kernel (``inplace.py``).

A block lives from its first member's birth to its last member's death; blocks get offsets
with ``arena.assign_offsets``. ``report()`` gives the arena size, the lower bound and
their ratio.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionPlan
from opfuse.memory.arena import ARENA_ALIGNMENT, Buffer, assign_offsets, lower_bound
from opfuse.memory.inplace import inplace_candidates
from opfuse.memory.static import static_values

# Ops whose output 0 is the same bytes as input 0 in the same (row-major) order.
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})
CONCAT_ALIAS_KIND = "concat"


@dataclass(frozen=True)
class Location:
    """``region`` is arena/input/output/static; ``index`` the position among graph inputs or
    outputs; ``offset`` in bytes from the region's start (static offsets are the generator's)."""

    region: str
    index: int = 0
    offset: int = 0

    def key(self) -> tuple:
        return (self.region, self.index, self.offset)


@dataclass
class _Block:
    key: str
    region: str
    index: int
    size: int
    start: int
    end: int
    members: dict[str, int] = field(default_factory=dict)  # value name -> byte offset in block


@dataclass(frozen=True)
class Alias:
    value: str
    base: str
    offset: int
    kind: str  # view, concat, inplace


@dataclass
class MemoryPlan:
    graph: Graph
    plan: FusionPlan
    static: dict[int, np.ndarray]
    locations: dict[str, Location]
    lifetimes: dict[str, tuple[int, int]]
    blocks: dict[str, tuple[int, int, int, int]]  # arena block key -> (offset, size, start, end)
    block_of: dict[str, str]
    aliases: list[Alias]
    arena_bytes: int
    lower_bound_bytes: int
    alignment: int = ARENA_ALIGNMENT
    guard_bytes: int = 0  # after every arena block, its own while it lives (``plan_memory``'s ``guard_bytes``)

    def location(self, v: Value) -> Location:
        if id(v) in self.static:
            return Location("static")
        return self.locations[v.name]

    def is_static(self, v: Value) -> bool:
        return id(v) in self.static

    @property
    def unshared_bytes(self) -> int:
        """Bytes the arena values would take with no reuse at all."""
        return sum(self.graph.values[n].nbytes for n, loc in self.locations.items() if loc.region == "arena"
                   and not any(a.value == n and a.kind in ("view", "concat") for a in self.aliases))

    def report(self) -> dict:
        kinds = {k: sum(1 for a in self.aliases if a.kind == k) for k in ("view", "concat", "inplace")}
        return {
            "arena_bytes": self.arena_bytes,
            "arena_lower_bound_bytes": self.lower_bound_bytes,
            "arena_ratio": round(self.arena_bytes / self.lower_bound_bytes, 4) if self.lower_bound_bytes else 1.0,
            "arena_unshared_bytes": self.unshared_bytes,
            "arena_values": sum(1 for loc in self.locations.values() if loc.region == "arena"),
            "views": kinds["view"], "concat_aliases": kinds["concat"], "inplace": kinds["inplace"],
        }

    def conflicts(self) -> list[str]:
        """Violations of the plan's invariant (empty when sound): two arena tensors that are
        live at the same kernel never share a byte, except

        * a view or an aliased Concat input and the tensor it lies in (same data), and
        * an in-place pair, which share exactly the kernel where one dies and the other is born.

        Values related by views/Concat form one *data class*; classes that share bytes must
        meet in time at most at one in-place hand-off."""
        parent: dict[str, str] = {}

        def find(x: str) -> str:
            while parent.get(x, x) != x:
                x = parent[x]
            return x

        for a in self.aliases:
            if a.kind in ("view", "concat"):
                parent[find(a.value)] = find(a.base)
        arena = [n for n, loc in self.locations.items() if loc.region == "arena"]
        classes: dict[str, list[str]] = {}
        for n in arena:
            classes.setdefault(find(n), []).append(n)
        spans = {}
        for root, members in classes.items():
            lives = [self.lifetimes[m] for m in members if m in self.lifetimes]
            lo = min(self.locations[m].offset for m in members)
            hi = max(self.locations[m].offset + self.graph.values[m].nbytes for m in members)
            spans[root] = (lo, hi, min(s for s, _ in lives), max(e for _, e in lives))
        problems = [f"block '{k}' at offset {off} is not {self.alignment}-byte aligned"
                    for k, (off, _, _, _) in self.blocks.items() if off % self.alignment]
        roots = sorted(spans)
        for i, r1 in enumerate(roots):
            lo1, hi1, s1, e1 = spans[r1]
            if hi1 > self.arena_bytes:
                problems.append(f"'{r1}' ends at byte {hi1}, past the arena ({self.arena_bytes})")
            for r2 in roots[i + 1:]:
                lo2, hi2, s2, e2 = spans[r2]
                if hi1 <= lo2 or hi2 <= lo1:
                    continue
                if e1 < s2 or e2 < s1:
                    continue
                handoff = (e1 == s2 or e2 == s1) and max(s1, s2) == min(e1, e2)
                inplace = any(a.kind == "inplace" and {find(a.value), find(a.base)} == {r1, r2}
                              for a in self.aliases)
                if not (handoff and inplace):
                    problems.append(f"'{r1}' (kernels {s1}..{e1}, bytes {lo1}..{hi1}) and '{r2}' "
                                    f"(kernels {s2}..{e2}, bytes {lo2}..{hi2}) overlap")
        return problems

    def summary(self) -> str:
        mb = 1 / (1 << 20)
        r = self.report()
        return (f"memory reduced from {r['arena_unshared_bytes'] * mb:.2f} MB -> {self.arena_bytes * mb:.2f} MB "
                f"(lower bound {self.lower_bound_bytes * mb:.2f} MB, ratio {r['arena_ratio']:.3f})")


class _Builder:
    def __init__(self, plan: FusionPlan, *, inplace: bool, views: bool, concat_alias: bool):
        self.graph = plan.graph
        self.plan = plan
        self.static = static_values(self.graph)
        self.use_inplace, self.use_views, self.use_concat = inplace, views, concat_alias
        self.blocks: dict[str, _Block] = {}
        self.block_of: dict[str, str] = {}
        self.lifetimes: dict[str, tuple[int, int]] = {}
        self.aliases: list[Alias] = []
        self.produced_at: dict[str, int] = {}

    # Blocks ------------------------------------------------------------------------------
    def _new_block(self, v: Value, region: str, index: int, start: int, end: int) -> None:
        self.blocks[v.name] = _Block(v.name, region, index, v.nbytes, start, end, {v.name: 0})
        self.block_of[v.name] = v.name

    def _block(self, v: Value) -> _Block | None:
        key = self.block_of.get(v.name)
        return self.blocks[key] if key is not None else None

    def _is_singleton_arena(self, v: Value) -> bool:
        b = self._block(v)
        return b is not None and b.region == "arena" and len(b.members) == 1

    def _merge(self, v: Value, into: _Block, offset: int, kind: str, base: Value) -> None:
        """Move ``v`` (a singleton arena block) into ``into`` at byte ``offset``."""
        own = self.blocks.pop(self.block_of[v.name])
        into.members[v.name] = offset
        into.start, into.end = min(into.start, own.start), max(into.end, own.end)
        self.block_of[v.name] = into.key
        self.aliases.append(Alias(v.name, base.name, offset, kind))

    # Liveness ----------------------------------------------------------------------------
    def build_blocks(self) -> None:
        g = self.graph
        out_index: dict[int, int] = {}
        for j, v in enumerate(g.outputs):
            out_index.setdefault(id(v), j)
        last_use: dict[str, int] = {}
        for t, grp in enumerate(self.plan.groups):
            for v in grp.inputs():
                last_use[v.name] = t
        for i, v in enumerate(g.inputs):
            self._new_block(v, "input", i, 0, len(self.plan.groups))
        for t, grp in enumerate(self.plan.groups):
            for v in grp.outputs(g):
                if id(v) in self.static:
                    continue
                self.produced_at[v.name] = t
                end = max(t, last_use.get(v.name, t))
                self.lifetimes[v.name] = (t, end)
                if id(v) in out_index:
                    self._new_block(v, "output", out_index[id(v)], t, len(self.plan.groups))
                else:
                    self._new_block(v, "arena", 0, t, end)

    # Aliasing passes ---------------------------------------------------------------------
    def concat_aliases(self) -> None:
        # Splits that move nothing through a Concat (``rules.aliasing.split_through_refusal``, judged
        # when the plan was marked): their input goes where their outputs' run of the Concat starts.
        through = {g.nodes[0].name: g.attrs["through_concat"] for g in self.plan.groups
                   if self.use_views and g.attrs.get("through_concat") and len(g.nodes) == 1}
        for grp in self.plan.groups:
            live = [n for n in grp.nodes if not all(id(v) in self.static for v in n.outputs)]
            if not (len(live) == 1 and live[0].op_type == "Concat"
                    and (grp.kind == CONCAT_ALIAS_KIND or grp.attrs.get("alias_inputs"))):
                continue
            node = live[0]
            out = node.outputs[0]
            target = self._block(out)
            if target is None:
                continue
            slices = _concat_slices(node)
            placed = self._split_through(node, slices, target, through)
            for v, offset in slices:
                if (offset is None or id(v) in self.static or v.producer is None or id(v) in placed
                        or not self._is_singleton_arena(v)
                        or sum(1 for u in node.inputs if u is v) > 1):
                    continue
                self._merge(v, target, target.members[out.name] + offset, "concat", out)

    def _split_through(self, node: Node, slices: list[tuple[Value, int | None]], target: _Block,
                       through: dict[str, str]) -> set[int]:
        """Place the input of each Split marked through ``node`` at its outputs' slice of the Concat's
        output; returns the ids of those outputs (the views pass makes them views of the input)."""
        out = node.outputs[0]
        done: set[int] = set()
        offsets = {id(v): off for v, off in slices}
        for v, offset in slices:
            split = v.producer
            if split is None or through.get(split.name) != node.name or v is not split.outputs[0] or offset is None:
                continue
            x = split.inputs[0]
            views = {id(o): off for o, _, off in _view_outputs(split)}
            at = {id(o): offsets.get(id(o)) for o in split.outputs}
            if (x is None or id(x) in self.static or not self._is_singleton_arena(x)
                    or any(not self._is_singleton_arena(o) or id(o) not in views
                           or at[id(o)] != offset + views[id(o)] for o in split.outputs)):
                continue
            self._merge(x, target, target.members[out.name] + offset, "concat", out)
            done.update(id(o) for o in split.outputs)
        return done

    def views_and_inplace(self) -> None:
        g = self.graph
        for t, grp in enumerate(self.plan.groups):
            live = [n for n in grp.nodes if not all(id(v) in self.static for v in n.outputs)]
            if self.use_views and len(live) == 1:
                for out, base, offset in _view_outputs(live[0]):
                    b = self._block(base)
                    if id(base) in self.static or not self._is_singleton_arena(out) or b is None:
                        continue
                    self._merge(out, b, b.members[base.name] + offset, "view", base)
            if not self.use_inplace:
                continue
            used: set[str] = set()
            # A patched run (memory.patch) names its own pair: its output may be written over its input.
            pairs = grp.attrs.get("inplace_pairs") or inplace_candidates(grp, g, self.static)
            for i, o in pairs:
                bi = self._block(i)
                if (bi is None or bi.region != "arena" or bi.key in used or bi.end != t
                        or not self._is_singleton_arena(o) or self.produced_at.get(o.name) != t):
                    continue
                used.add(bi.key)
                self._merge(o, bi, bi.members[i.name], "inplace", i)

    # Offsets -----------------------------------------------------------------------------
    def finish(self, guard_bytes: int = 0) -> MemoryPlan:
        arena = [b for b in self.blocks.values() if b.region == "arena"]
        buffers = [Buffer(b.key, b.size + guard_bytes, b.start, b.end) for b in arena]
        offsets, total = assign_offsets(buffers)
        locations: dict[str, Location] = {}
        for b in self.blocks.values():
            base = offsets.get(b.key, 0) if b.region == "arena" else 0
            for name, off in b.members.items():
                locations[name] = Location(b.region, b.index, base + off)
        blocks = {b.key: (offsets[b.key], b.size, b.start, b.end) for b in arena}
        return MemoryPlan(self.graph, self.plan, self.static, locations, self.lifetimes, blocks,
                          dict(self.block_of), self.aliases, total, lower_bound(buffers), guard_bytes=guard_bytes)


def _contiguous_slice_offset(shape: tuple[int, ...], axis: int, start: int, itemsize: int) -> int | None:
    """Byte offset of the slice starting at ``start`` along ``axis`` when that slice is one
    contiguous run of the row-major tensor (every axis before ``axis`` has extent 1)."""
    if any(d != 1 for d in shape[:axis]):
        return None
    return start * math.prod(shape[axis + 1:]) * itemsize


def _concat_slices(node: Node) -> list[tuple[Value, int | None]]:
    out = node.outputs[0]
    axis = node.attrs.get("axis", 0)
    axis = axis + len(out.shape) if axis < 0 else axis
    res, start = [], 0
    for v in node.input_values():
        res.append((v, _contiguous_slice_offset(out.shape, axis, start, out.dtype.itemsize)))
        start += v.shape[axis]
    return res


def _view_outputs(node: Node) -> list[tuple[Value, Value, int]]:
    """(output, base, byte offset) for outputs of ``node`` that are views of its input 0."""
    if node.op_type in VIEW_OPS:
        x = node.input(0)
        out = node.outputs[0]
        if x is not None and out.dtype == x.dtype and out.nbytes == x.nbytes:
            return [(out, x, 0)]
        return []
    if node.op_type == "Split":
        x = node.input(0)
        axis = node.attrs.get("axis", 0)
        axis = axis + len(x.shape) if axis < 0 else axis
        res, start = [], 0
        for v in node.outputs:
            off = _contiguous_slice_offset(x.shape, axis, start, x.dtype.itemsize)
            if off is not None:
                res.append((v, x, off))
            start += v.shape[axis]
        return res
    return []


def plan_memory(plan: FusionPlan, *, inplace: bool = True, views: bool = True,
                concat_alias: bool = True, guard_bytes: int = 0) -> MemoryPlan:
    """The static memory plan of ``plan`` (see the module docstring). ``guard_bytes``: each arena block is
    placed as if that much longer, so the bytes after it are its own for its lifetime (a guard the generated
    code checks, ``CodegenOptions.arena_guard_bytes``); the blocks, lifetimes and aliases are the same."""
    b = _Builder(plan, inplace=inplace, views=views, concat_alias=concat_alias)
    b.build_blocks()
    if concat_alias:
        b.concat_aliases()
    b.views_and_inplace()
    return b.finish(guard_bytes)
