"""Pointwise stages: elementwise chains and data movement as one loop nest per output shape.

Every output element is computed from the group inputs in registers (``Evaluator``) and
stored once. When every op in the chain is elementwise/broadcast, adjacent axes along which
every operand is either fully present or fully broadcast are merged into one loop, so a
``[1, 64, 56, 56] + [64, 1, 1]`` chain runs as ``for c: for hw:`` with unit-stride, vectorised
inner loops.
"""
from __future__ import annotations

from opfuse.codegen import half
from opfuse.codegen.loops import emit_loop_nest, is_view_store, store
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ir.graph import Value
from opfuse.ops.registry import Category, get_spec


def broadcast_masks(outputs: list[Value], inline: set[int], static: dict, rank: int) -> list[tuple[bool, ...]] | None:
    """For each operand read by the chain, which domain axes it varies along (right-aligned
    NumPy broadcasting); ``None`` when the chain moves data (no simple masks)."""
    masks = []
    seen: set[int] = set()
    todo = list(outputs)

    def mask_of(shape) -> tuple[bool, ...]:
        full = (1,) * (rank - len(shape)) + tuple(shape)
        return tuple(d != 1 for d in full)

    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        p = v.producer
        if p is None or id(p) not in inline:
            if not (id(v) in static and static[id(v)].size == 1):
                masks.append(mask_of(v.shape))
            continue
        cat = get_spec(p.op_type, p).category
        if cat == Category.INJECTIVE:
            return None
        if p.op_type == "BatchNormalization":
            x = p.input(0)
            if not all(id(u) in static for u in p.inputs[1:5]):
                return None
            masks.append(mask_of((x.shape[1],) + (1,) * (len(x.shape) - 2)))
            todo.append(x)
            continue
        todo.extend(p.input_values())
    return masks


def lower_pointwise(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    outs = [v for v in stage.outputs if not is_view_store(kc, v)]
    if not outs:
        return
    shape = stage.domain
    masks = broadcast_masks(outs, analysis.inline, kc.program.memory.static, len(shape))
    mergeable = None
    if masks is not None:
        def mergeable(d1: int, d2: int) -> bool:
            return all(m[d1] == m[d2] for m in masks)
    cost = max(1, len(analysis.inline))

    def body(idx):
        for v in outs:
            store(kc, ev, v, idx)

    cast = half.f16c_cast(kc, ev, outs, analysis.inline)
    if cast is not None:  # a float16 <-> float32 Cast alone: F16C's vector conversions where the target has them
        kc.w.line(f"#if {half.F16C_GUARD}")
        half.emit_f16c_cast(kc, *cast)
        kc.w.line("#else")
    emit_loop_nest(kc, ev, shape, body, mergeable=mergeable, cost_per_element=cost)
    if cast is not None:
        kc.w.line("#endif")
