"""Concat whose result leaves the group: one copy loop per input, into its slice.

Inputs the memory plan aliased into their slice (their producer already wrote them there)
are skipped; the loop still runs for them when the group also stores an epilogue of the
Concat (e.g. ``Relu(Concat(...))`` kept as a second output).
"""
from __future__ import annotations

import math

from opfuse.codegen.index import add
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.stages import GroupAnalysis, Stage


def concat_split(nodes, inline: set, shape) -> tuple[int, list[int]] | None:
    """``(axis, bounds)`` for a loop nest over ``shape`` that holds an inline Concat of that shape: its loop
    along the Concat's axis is written as one loop per input (``emit_loop_nest(split=...)``), so each reads
    its own input with no branch between them; gcc 12.2 -O3 turned that branch into masked loads (issue 13,
    the form that returned other memory in the Pad and the pools). ``None`` when there is none."""
    for n in nodes:
        if n.op_type != "Concat" or id(n) not in inline or tuple(n.outputs[0].shape) != tuple(shape):
            continue
        from opfuse.codegen.rules import _attrs
        axis = int(_attrs(n)["axis"])
        axis = axis + len(shape) if axis < 0 else axis
        bounds, at = [], 0
        for v in n.input_values():
            at += v.shape[axis]
            bounds.append(at)
        return axis, bounds[:-1]
    return None


def is_concat_alias(kc, v, out, axis: int, start: int) -> bool:
    """Is ``v`` already in its slice of ``out`` (the one starting at ``start`` along ``axis``)? It is
    when the memory plan put it at that slice's bytes: aliased into the Concat, or a view of a value
    placed there (a Split through the Concat). Aliased into another Concat's output, it is not:
    ``Concat(Concat(x, x), x)`` aliases x into the outer one, the inner one must copy it."""
    mem = kc.program.memory
    if (mem.is_static(v) or mem.is_static(out) or any(d != 1 for d in out.shape[:axis])
            or v.name not in mem.locations or out.name not in mem.locations):  # computed inside the group
        return False
    at, base = mem.location(v), mem.location(out)
    offset = start * math.prod(out.shape[axis + 1:]) * out.dtype.itemsize
    return (at.region, at.index, at.offset) == (base.region, base.index, base.offset + offset)


def lower_concat(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    out = node.outputs[0]
    axis = node.attrs.get("axis", 0)
    axis = axis + len(out.shape) if axis < 0 else axis
    start = 0
    for v in node.input_values():
        lo = start
        start += v.shape[axis]
        aliased = is_concat_alias(kc, v, out, axis, lo)
        todo = [o for o in stage.outputs if not (o is out and aliased)]
        if not todo:
            continue

        def body(idx, v=v, lo=lo, todo=todo):
            oidx = idx.with_axis(axis, add(idx.dims[axis], str(lo)), out.shape, shift=lo)
            sub = Stage(stage.kind, stage.anchor, outputs=todo, epilogue=stage.epilogue)
            finish_element(kc, ev, sub, out, oidx, ev.at(v, idx))

        # Loops may merge axes on one side of the concat axis (the slice is strided there).
        emit_loop_nest(kc, ev, v.shape, body, mergeable=lambda d1, d2: d2 < axis or d1 >= axis)
