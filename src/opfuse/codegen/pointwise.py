"""Pointwise stages: elementwise chains and data movement as one loop nest per output shape.

Every output element is computed from the group inputs in registers (``Evaluator``) and
stored once. When every op in the chain is elementwise/broadcast, adjacent axes along which
every operand is either fully present or fully broadcast are merged into one loop, so a
``[1, 64, 56, 56] + [64, 1, 1]`` chain runs as ``for c: for hw:`` with unit-stride, vectorised
inner loops.
"""
from __future__ import annotations

import math

from opfuse.codegen import half, rowmaps, simdchain
from opfuse.codegen.concat import concat_split
from opfuse.codegen.index import Index
from opfuse.codegen.loops import emit_loop_nest, is_view_store, loop_groups, store
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

    if all(tuple(v.shape) == tuple(shape) for v in outs) and rowmaps.emit_row_maps(
            kc, ev, outs, shape, [n for n in kc.group.nodes if id(n) in analysis.inline], body, cost):
        return  # through a nearest upsampling or a DepthToSpace: sw output columns per input column

    cast = half.f16c_cast(kc, ev, outs, analysis.inline)
    if cast is not None:  # a float16 <-> float32 Cast alone: F16C's vector conversions where the target has them
        kc.w.line(f"#if {half.F16C_GUARD}")
        half.emit_f16c_cast(kc, *cast)
        kc.w.line("#else")
        emit_loop_nest(kc, ev, shape, body, mergeable=mergeable, cost_per_element=cost)
        kc.w.line("#endif")
        return
    blocks = half.f16c_blocks(kc, ev, outs, analysis.inline, shape) if shape and masks is not None else None
    groups = loop_groups(shape, mergeable) if blocks is not None else []
    block = f16c_block(kc.program.options, math.prod(shape[groups[-1][0]:groups[-1][1]])) if groups else 0
    if blocks is not None and block:
        # float16 in and out of a fused loop: F16C's 8-lane conversions where the target has them
        kc.w.line(f"#if {half.F16C_GUARD}")
        with ev.scope():
            emit_f16c_blocks(kc, ev, tuple(shape), groups, *blocks, outs, body, cost, block)
        kc.w.line("#else")
        with ev.scope():
            emit_loop_nest(kc, ev, shape, body, mergeable=mergeable, cost_per_element=cost)
        kc.w.line("#endif")
        return
    first = outs[0].producer or kc.group.nodes[0]
    if simdchain.emit(kc, ev, first, outs, analysis.inline, ev.loadable, shape, cost, body, mergeable):
        return  # dense float32 chain: AVX-512 / AVX2 intrinsics, this loop nest under #else
    split = concat_split(kc.group.nodes, analysis.inline, shape)
    emit_loop_nest(kc, ev, shape, body, mergeable=mergeable, cost_per_element=cost, split=split)


def f16c_block(options, extent: int) -> int:
    """Elements per block (``emit_f16c_blocks``) for an innermost loop of ``extent``: ``options.f16c_block``,
    or the largest power of two in ``extent`` when that is less, but at least ``options.f16c_min_block``
    (0: no blocks)."""
    block = options.f16c_block
    while block > extent:
        block //= 2
    return block if block >= options.f16c_min_block else 0


def emit_f16c_blocks(kc, ev, shape, groups, loads, trips, stores, outs, body, cost: int, block: int) -> None:
    """The loop nest of ``emit_loop_nest`` with its innermost loop in blocks of ``block``
    elements, F16C converting 8 lanes at a time between float arrays that the block's element loops
    (which gcc vectorises) read and write: the dense float16 operands of ``loads`` widened before the
    first loop; each round trip of ``trips`` (float32 -> float16 -> float32) a loop of its own that
    computes the float32 operand, then rounded in place; the float16 outputs of ``stores`` rounded
    after the last loop. The remainder of the innermost loop (and every other conversion) uses the
    portable helpers. Same bits (``codegen.half``)."""
    from opfuse.codegen.microkernel import AVX2_GUARD
    w = kc.w
    kc.program.require_helper("opfuse_immintrin", f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n")
    outer = [(a, b, kc.tmp("i")) for a, b in groups[:-1]]
    a_in, b_in = groups[-1]
    extent = math.prod(shape[a_in:b_in])
    full = extent // block * block
    for depth, (a, b, var) in enumerate(outer):
        if depth == 0:
            kc.parallel_for(math.prod(shape) * cost, 2 if (len(outer) > 1 and full == extent and math.prod(
                shape[a:b]) < kc.program.options.parallel_min_outer) else 1)
        w.line(f"for (long {var} = 0; {var} < {math.prod(shape[a:b])}; ++{var}) {{")
        w.level += 1
    blk, lane = kc.tmp("ib"), kc.tmp("l")
    if not outer:
        kc.parallel_for(math.prod(shape) * cost)
    base = Index.loops(shape, [*outer, (a_in, b_in, blk)])
    idx = Index.loops(shape, [*outer, (a_in, b_in, f"({blk} + {lane})")])
    lanes = range(0, block, 8)
    with w.block(f"for (long {blk} = 0; {blk} < {full}; {blk} += {block})"), ev.scope():
        wide: dict[int, str] = {}  # widening Cast node -> its block of float32 values
        for node in loads:
            x, buf = node.input(0), kc.tmp("xb")
            wide[id(node)] = buf
            w.line(f"float {buf}[{block}];")
            src = f"{kc.ptr(x)} + {base.offset()}"
            for k in lanes:
                w.line(f"_mm256_storeu_ps({buf} + {k}, "
                       f"_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)({src} + {k}))));")

        def element_loop(emit) -> None:
            with w.block(f"for (int {lane} = 0; {lane} < {block}; ++{lane})"), ev.scope():
                for n, buf in wide.items():
                    ev.remember(by_id[n].outputs[0], idx, f"{buf}[{lane}]")
                emit()

        by_id = {id(n): n for n in [*loads, *trips]}
        for node in trips:
            f, buf = node.input(0).producer.input(0), kc.tmp("rb")
            w.line(f"float {buf}[{block}];")
            element_loop(lambda f=f, buf=buf: w.line(f"{buf}[{lane}] = {ev.at(f, idx.broadcast_to(f.shape))};"))
            for k in lanes:
                w.line(f"_mm256_storeu_ps({buf} + {k}, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps({buf} + {k}), "
                       f"_MM_FROUND_TO_NEAREST_INT)));")
            wide[id(node)] = buf
        narrow = {id(v): kc.tmp("yb") for v in stores}
        for v in stores:
            w.line(f"float {narrow[id(v)]}[{block}];")

        def finish() -> None:
            for v in outs:
                if id(v) in narrow:
                    f = v.producer.input(0)
                    w.line(f"{narrow[id(v)]}[{lane}] = {ev.at(f, idx.broadcast_to(f.shape))};")
                else:
                    store(kc, ev, v, idx)
        element_loop(finish)
        for v in stores:
            dst = f"{kc.ptr(v, write=True)} + {base.offset()}"
            for k in lanes:
                w.line(f"_mm_storeu_si128((__m128i*)({dst} + {k}), "
                       f"_mm256_cvtps_ph(_mm256_loadu_ps({narrow[id(v)]} + {k}), _MM_FROUND_TO_NEAREST_INT));")
    if full < extent:
        j = kc.tmp("i")
        with w.block(f"for (long {j} = {full}; {j} < {extent}; ++{j})"), ev.scope():
            body(Index.loops(shape, [*outer, (a_in, b_in, j)]))
    for _ in outer:
        w.level -= 1
        w.line("}")
