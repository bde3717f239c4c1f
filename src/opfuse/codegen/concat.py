"""Concat whose result leaves the group: one copy loop per input, into its slice.

Inputs the memory plan aliased into their slice (their producer already wrote them there)
are skipped; the loop still runs for them when the group also stores an epilogue of the
Concat (e.g. ``Relu(Concat(...))`` kept as a second output).
"""
from __future__ import annotations

from opfuse.codegen.index import add
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.stages import GroupAnalysis, Stage


def is_concat_alias(kc, v, out) -> bool:
    """Is ``v`` already in its slice of ``out``? (Aliased into another Concat's output, it is
    not: ``Concat(Concat(x, x), x)`` aliases x into the outer one, the inner one must copy it.)"""
    return any(a.value == v.name and a.kind == "concat" and a.base == out.name for a in kc.program.memory.aliases)


def lower_concat(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    out = node.outputs[0]
    axis = node.attrs.get("axis", 0)
    axis = axis + len(out.shape) if axis < 0 else axis
    start = 0
    for v in node.input_values():
        lo = start
        start += v.shape[axis]
        aliased = is_concat_alias(kc, v, out)
        todo = [o for o in stage.outputs if not (o is out and aliased)]
        if not todo:
            continue

        def body(idx, v=v, lo=lo, todo=todo):
            oidx = idx.with_axis(axis, add(idx.dims[axis], str(lo)), out.shape, shift=lo)
            sub = Stage(stage.kind, stage.anchor, outputs=todo, epilogue=stage.epilogue)
            finish_element(kc, ev, sub, out, oidx, ev.at(v, idx))

        # Loops may merge axes on one side of the concat axis (the slice is strided there).
        emit_loop_nest(kc, ev, v.shape, body, mergeable=lambda d1, d2: d2 < axis or d1 >= axis)
