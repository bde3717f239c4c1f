"""MaxPool and AveragePool (any number of spatial axes) with fused prologue and epilogue.

For output position ``o`` along an axis the window reads input positions
``o * stride - pad_begin + k * dilation`` (``opfuse.ops.nn.window_geometry`` gives the same
geometry the reference uses). Positions outside the input are skipped: padding never wins
a max, and AveragePool divides by the number of positions inside the input
(``count_include_pad=0``) or inside the explicitly padded input (``count_include_pad=1``).

2-D float pools go plane by plane, vectorised along the output rows (``_lower_rows``). With
AVX2, where the input is in memory (a hoisted Relu prologue included) and the column stride is
1 or 2, the plane is read in place: masked loads at the row ends, stride 2 deinterleaved from
two loads, the rows ahead prefetched into L2 (``_in_place``, ``CodegenOptions.pool_prefetch_bytes``).
Otherwise (and in the plain C99 path) each
(image, channel) plane is copied through the prologue into a padded buffer (padding ``-inf``
for MaxPool, so it never wins, and 0 for AveragePool, whose divisor counts only what
``count_include_pad`` counts), each padded row stored as its column phases (the depthwise
convolution's layout) so that stride 2 reads consecutive floats too. Then every output row is
the max or sum over the window taps, one vector load per tap and 8 outputs (AVX2 behind
``AVX2_GUARD``; plain C99 otherwise and for ``simd="none"``, the same operations in the same
order, so both give the same bits). A MaxPool whose windows overlap enough is separable
(``_separable``): the max along each padded row first, then down the columns, as onnxruntime
and XNNPACK do. The results of a plane go through the fused epilogue in one loop.
"""
from __future__ import annotations

import numpy as np

from opfuse.codegen.ctype import c_type, literal, lowest
from opfuse.codegen.depthwise import DIRECT_MAX_ROW_VECTORS, copy_plane, plane_chunk, planes_of_chunk, row_classes
from opfuse.codegen.gemm import in_memory
from opfuse.codegen.index import Index, add, delinearize, inside_position, mul
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.microkernel import AVX2_GUARD
from opfuse.codegen.loops import emit_loop_nest, lane_reduce
from opfuse.codegen.rules import nan_max, relu
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.codegen.writer import CWriter
from opfuse.ops.registry import get_spec

# Ops f with max_i f(x_i) == f(max_i x_i) bit for bit, as ``rules.py`` computes them
# (non-decreasing; NaN handling agrees: a NaN in the window makes the max NaN, and Relu keeps NaN).
MAX_COMMUTING_OPS = frozenset({"Relu"})

VECTOR = 8  # floats per ymm register
UNROLL = 4  # vectors per step of a row loop (independent chains: max and add have latency 3-4)


def _hoist_after_max(ev, analysis: GroupAnalysis, x):
    """``(raw, chain)``: follow ``x`` back through inline, single-use ``MAX_COMMUTING_OPS``
    of the group to the value ``raw`` the window max can read instead; ``chain`` lists those
    ops, the one nearest the pool first. The max of a Relu'd window is then one Relu per
    output instead of one per window element, and gcc if-converts the bare max loop: with
    Relu inside it, it emitted value-dependent branches (resnet18's Relu+MaxPool ran 7x
    slower than Relu and MaxPool as two kernels)."""
    kept = {id(v) for v in analysis.outputs}
    chain = []
    while (x.producer is not None and x.producer.op_type in MAX_COMMUTING_OPS
           and id(x.producer) in ev.inline and id(x) not in ev.loadable
           and id(x) not in kept and len(x.consumers) == 1):
        chain.append(x.producer)
        x = x.producer.input(0)
    return x, chain


def single_window_run(node) -> int:
    """Elements of the one window of an AveragePool whose output plane is one element, when that
    window is a contiguous run from the start of each input plane (no padding, no dilation, full
    rows: ds_cnn's 24x5 window over a 25x5 map), else 0. Such a pool is a mean over the run,
    computed as GlobalAveragePool is (``_lower_single_window``); the window kernel copied every plane
    to a padded buffer first and ran 8 times slower."""
    from opfuse.ops.nn import window_geometry
    if node.op_type != "AveragePool":
        return 0
    x = node.input(0)
    a = get_spec(node.op_type, node).attrs_of(node)
    kernel = tuple(int(k) for k in a["kernel_shape"])
    spatial = tuple(x.shape[2:])
    if len(spatial) != len(kernel) or not spatial or not np.issubdtype(np.dtype(x.dtype), np.floating):
        return 0
    w = window_geometry(node, a, spatial, kernel, ceil_mode=bool(a["ceil_mode"]))
    if set(w.out) != {1} or any(w.pads_begin + w.pads_end) or set(w.dilations) != {1} or kernel[1:] != spatial[1:]:
        return 0
    return int(np.prod(kernel))


def _lower_single_window(kc, ev, stage: Stage, x, out, run: int) -> None:
    """``out[n, c] = mean of the first run elements of plane (n, c)`` with ``lane_reduce``'s partial
    sums (vectorised; the same order in the plain C99 path), then the fused epilogue."""
    shape = tuple(x.shape)
    rank = len(shape)
    dt = out.dtype
    ct = c_type(dt)

    def body(oidx: Index):
        total = kc.tmp("acc")

        def element(j):
            dims = [oidx.dims[0], oidx.dims[1], *delinearize(j, shape[2:])]
            return ev.at(x, Index(shape, tuple(dims), ((2, rank, j),)))
        lane_reduce(kc, ct, literal(0, dt), lambda a, b: f"{a} + {b}", run, element, total, scope=ev.scope)
        res = kc.tmp("pool")
        kc.w.line(f"const {ct} {res} = {total} / {literal(run, dt)};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=run)


def lower_pool(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    from opfuse.ops.nn import window_geometry
    node = stage.anchor_node
    x = node.input(0)
    out = node.outputs[0]
    a = get_spec(node.op_type, node).attrs_of(node)
    kernel = tuple(int(k) for k in a["kernel_shape"])
    w = window_geometry(node, a, tuple(x.shape[2:]), kernel, ceil_mode=bool(a["ceil_mode"]))
    is_max = node.op_type == "MaxPool"
    chain = []
    if is_max:
        x, chain = _hoist_after_max(ev, analysis, x)
    run = single_window_run(node)
    if run:
        return _lower_single_window(kc, ev, stage, x, out, run)
    include_pad = not is_max and bool(int(a.get("count_include_pad", 0)))
    dt = out.dtype
    ct = c_type(dt)
    nsp = len(kernel)
    if nsp == 2 and np.dtype(dt) == np.float32 and np.dtype(x.dtype) == np.float32:
        return _lower_rows(kc, ev, stage, x, out, w, is_max, include_pad, len(chain))
    window = 1
    for k in kernel:
        window *= k

    def body(oidx: Index):
        acc = kc.tmp("acc")
        cnt = kc.tmp("cnt")
        kc.w.line(f"{ct} {acc} = {lowest(dt) if is_max else literal(0, dt)};")
        if not is_max:
            kc.w.line(f"long {cnt} = 0;")
        dims = [oidx.dims[0], oidx.dims[1]]
        inside, counted = [], []
        opened = 0
        # No load under a condition (no ``continue`` before it either): gcc 12.2 at -O3 vectorised such a
        # window, its loops unrolled, with masked loads that returned wrong values (a float64 3x3
        # AveragePool over 1x2x5x2 with its Relu: 4-5 of 20 outputs; tests/e2e/test_fuzz_findings.py). Each
        # tap reads the input at a position inside it and counts only where its own position is.
        for s in range(nsp):
            k = kc.tmp("k")
            pos = kc.tmp("p")
            L = x.shape[2 + s]
            kc.w.line(f"for (long {k} = 0; {k} < {kernel[s]}; ++{k}) {{")
            kc.w.level += 1
            opened += 1
            start = add(mul(oidx.dims[2 + s], w.strides[s]), str(-w.pads_begin[s]))
            kc.w.line(f"const long {pos} = {add(start, mul(k, w.dilations[s]))};")
            inside.append(f"{pos} >= 0 && {pos} < {L}")
            counted.append(f"{pos} >= {-w.pads_begin[s]} && {pos} < {L + w.pads_end[s]}")
            dims.append(inside_position(pos, L))
        ok = kc.tmp("in")
        kc.w.line(f"const int {ok} = {' && '.join(f'({c})' for c in inside)};")
        with ev.scope():
            v = kc.tmp("v")
            kc.w.line(f"const {ct} {v} = {ev.at(x, Index(tuple(x.shape), tuple(dims)))};")
            if is_max:
                kc.w.line(f"{acc} = {ok} ? {nan_max(v, acc, dt)} : {acc};")
            else:
                kc.w.line(f"{acc} += {ok} ? {v} : {literal(0, dt)};")
        if not is_max:
            count = " && ".join(f"({c})" for c in counted) if include_pad else ok
            kc.w.line(f"{cnt} += {count};")
        for _ in range(opened):
            kc.w.level -= 1
            kc.w.line("}")
        res = kc.tmp("pool")
        kc.w.line(f"const {ct} {res} = {acc if is_max else f'{acc} / ({ct}){cnt}'};")
        for _ in chain:  # Relu, written as rules.py writes it
            prev, res = res, kc.tmp("relu")
            kc.w.line(f"const {ct} {res} = {relu(prev, dt)};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=window)


def _separable(kernel, strides, dilations, out_hw) -> bool:
    """A MaxPool computed as a max along the rows then down the columns: when that takes fewer
    maxima per plane (``rows * KW + OH * KH`` against ``OH * KH * KW``, per output column): 5x5
    stride 1 takes 10 instead of 25, 3x3 stride 2 as many either way, 2x2 stride 2 more."""
    (KH, KW), (SH, _), (DH, _) = kernel, strides, dilations
    OH = out_hw[0]
    rows = (OH - 1) * SH + (KH - 1) * DH + 1
    return rows * KW + OH * KH < OH * KH * KW


def _lower_rows(kc, ev, stage: Stage, x, out, geo, is_max: bool, include_pad: bool, relus: int) -> None:
    """The 2-D float pool plane by plane, vectorised along the output rows (module docstring).
    ``relus``: Relus hoisted after the max (``_hoist_after_max``), applied in the epilogue loop."""
    w = kc.w
    nimg, C, H, W = x.shape
    OH, OW = out.shape[2:]
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL), (PB, PR) = geo.strides, geo.dilations, geo.pads_begin, geo.pads_end
    Hp = max(H + PT + PB, (OH - 1) * SH + (KH - 1) * DH + 1)
    Wp = max(W + PL + PR, (OW - 1) * SW + (KW - 1) * DW + 1)
    Wh = -(-Wp // SW)          # floats per column phase of a padded row
    row_len = SW * Wh
    span = -(-OW // VECTOR) * VECTOR  # the AVX2 rows run to whole vectors (the overrun is dropped)
    simd = kc.program.options.simd == "auto"
    separable = is_max and _separable((KH, KW), (SH, SW), (DH, DW), (OH, OW))
    rows = (OH - 1) * SH + (KH - 1) * DH + 1  # padded rows a plane's windows read
    # Column taps: padded column ow * SW + kw * DW sits in phase (kw * DW) % SW at (kw * DW) // SW + ow.
    cols = [(kw * DW) % SW * Wh + (kw * DW) // SW for kw in range(KW)]
    reach = max(cols) + span
    slack = max(0, (rows - 1) * row_len + reach - Hp * row_len)
    plane_floats = Hp * row_len + slack
    # With AVX2 the input is read in place, no padded copy (``_in_place``).
    in_place = (simd and SW in (1, 2) and in_memory(ev, x)
                and -(-OW // VECTOR) <= DIRECT_MAX_ROW_VECTORS)
    off_plane = kc.scratch(plane_floats * 4)
    off_rows = kc.scratch(max(rows, H) * span * 4) if separable else 0
    off_dense = kc.scratch(((OH - 1) * OW + span) * 4)
    if simd:
        kc.program.require_helper("opfuse_immintrin", f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n")
    fill = lowest(out.dtype) if is_max else literal(0, out.dtype)
    planes = nimg * C
    per_chunk = plane_chunk(planes, kc.program.options)
    chunks = -(-planes // per_chunk)
    chunk, plane, first = kc.tmp("chunk"), kc.tmp("plane"), kc.tmp("first")
    divisor = None if is_max else _divisor(kc, geo, (H, W), (OH, OW), span, include_pad)
    op = "max" if is_max else "sum"
    assert not (separable and divisor is not None)
    kc.parallel_for(nimg * C * OH * OW * KH * KW,
                    costs=[float(min(per_chunk, planes - c0)) for c0 in range(0, planes, per_chunk)])
    with w.block(f"for (long {chunk} = 0; {chunk} < {chunks}; ++{chunk})"):
        xp, rm, dense = kc.tmp("xpad"), kc.tmp("rmax"), kc.tmp("dense")
        w.line(f"float* restrict {xp} = {kc.scratch_ptr('float', off_plane)};")
        if separable:
            w.line(f"float* restrict {rm} = {kc.scratch_ptr('float', off_rows)};")
        w.line(f"float* restrict {dense} = {kc.scratch_ptr('float', off_dense)};")
        i = kc.tmp("i")
        # The padding sits at the same places for every plane: set once per chunk.
        if in_place:
            w.line(f"#if !({AVX2_GUARD})")
        w.line(f"for (long {i} = 0; {i} < {plane_floats}; ++{i}) {xp}[{i}] = {fill};")
        if in_place:
            w.line("#endif")
        with planes_of_chunk(kc, ev, (chunk, plane, first), per_chunk, planes, C) as (img, ch):
            if in_place:
                w.line(f"#if {AVX2_GUARD}")
                at = Index(x.shape, (img, ch, '0', '0')).offset()
                src = f"{kc.ptr(x)} + {at}"
                ahead = kc.program.options.pool_prefetch_bytes // 4
                prefetch = (kc.ptr(x), at, int(np.prod(x.shape)), ahead) if ahead else None
                _in_place(kc, src, geo, (H, W), (OH, OW), rm if separable else None, dense, divisor, prefetch)
                w.line("#else")
                simd_rows = False
            else:
                simd_rows = simd
            copy_plane(kc, ev, x, img, ch, xp, (H, W), (PT, PL), SW, Wh)
            oh = kc.tmp("oh")
            if separable:
                r = kc.tmp("r")
                with w.block(f"for (long {r} = 0; {r} < {rows}; ++{r})"):
                    src = kc.tmp("row")
                    w.line(f"const float* restrict {src} = {xp} + {mul(r, row_len)};")
                    _taps_row(kc, [f"{src} + {c}" for c in cols], f"({rm} + {mul(r, span)})", span, OW, op, simd_rows)
                with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"):
                    srcs = [f"{rm} + {mul(add(mul(oh, SH), str(kh * DH)), span)}" for kh in range(KH)]
                    _taps_row(kc, srcs, f"({dense} + {mul(oh, OW)})", span, OW, op, simd_rows)
            else:
                with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"):
                    srcs = []
                    for kh in range(KH):
                        src = kc.tmp("row")
                        w.line(f"const float* restrict {src} = {xp} + {mul(add(mul(oh, SH), str(kh * DH)), row_len)};")
                        srcs += [f"{src} + {c}" for c in cols]
                    _taps_row(kc, srcs, f"({dense} + {mul(oh, OW)})", span, OW, op, simd_rows,
                              None if divisor is None else (divisor[0](oh), divisor[1]))
            if in_place:
                w.line("#endif")
            p, y = kc.tmp("p"), kc.tmp("y")
            with w.block(f"for (long {p} = 0; {p} < {OH * OW}; ++{p})"), ev.scope():
                w.line(f"const float {y} = {dense}[{p}];")
                res = y
                for _ in range(relus):  # Relu, written as rules.py writes it
                    prev, res = res, kc.tmp("relu")
                    w.line(f"const float {res} = {relu(prev, out.dtype)};")
                finish_element(kc, ev, stage, out, Index.loops(out.shape, [(0, 1, img), (1, 2, ch), (2, 4, p)]), res)


def _counts(L: int, n_out: int, k: int, s: int, d: int, pb: int, pe: int, include_pad: bool) -> list[int]:
    """Per output position along one axis: how many window positions the divisor counts."""
    lo, hi = (-pb, L + pe) if include_pad else (0, L)
    return [sum(1 for t in range(k) if lo <= o * s - pb + t * d < hi) for o in range(n_out)]


def _divisor(kc, geo, hw, ohw, span: int, include_pad: bool):
    """AveragePool's divisor, the row count times the column count (small integers, so their float
    product is exact in both paths): ``(row(oh) -> C float expression, column term)``, the
    column term ``("const", literal)`` or ``("table", name)`` of ``span`` floats (1 past OW)."""
    (H, W), (OH, OW) = hw, ohw
    KH, KW = geo.kernel
    rc = _counts(H, OH, KH, geo.strides[0], geo.dilations[0], geo.pads_begin[0], geo.pads_end[0], include_pad)
    cc = _counts(W, OW, KW, geo.strides[1], geo.dilations[1], geo.pads_begin[1], geo.pads_end[1], include_pad)
    rt = None
    if len(set(rc)) > 1:
        rt = kc.tmp("rcount")
        kc.w.line(f"static const float {rt}[{OH}] = {{{', '.join(literal(n, np.float32) for n in rc)}}};")

    def row(oh: str) -> str:
        return literal(rc[0], np.float32) if rt is None else f"{rt}[{oh}]"
    if len(set(cc)) == 1:
        return row, ("const", literal(cc[0], np.float32))
    ct = kc.tmp("ccount")
    vals = cc + [1] * (span - OW)
    kc.w.line(f"static const float {ct}[{span}] = {{{', '.join(literal(n, np.float32) for n in vals)}}};")
    return row, ("table", ct)


def _taps_row(kc, srcs: list[str], dst: str, span: int, exact: int, op: str, simd: bool,
              divisor=None) -> None:
    """``dst[i] = op over the taps of src_t[i]``, in tap order: ``span`` floats (whole vectors)
    with AVX2, else the first ``exact`` (plain C99). ``op``: "max" (NaN-propagating, as
    ``rules.nan_max``: ``_mm256_max_ps(v, acc)`` keeps ``acc`` where either is NaN, the blend
    takes a NaN ``v``) or "sum", then divided by ``divisor`` (``(row term, column term)``)."""
    w = kc.w
    if simd:
        w.line(f"#if {AVX2_GUARD}")
        i = kc.tmp("i")
        w.line(f"long {i} = 0;")
        if divisor is not None:
            dr = kc.tmp("dr")
            w.line(f"const __m256 {dr} = _mm256_set1_ps({divisor[0]});")
        for width, count in ((VECTOR * UNROLL, UNROLL), (VECTOR, 1)):
            if width > span:
                continue
            with w.block(f"for (; {i} + {width} <= {span}; {i} += {width})"):
                accs = [kc.tmp("v") for _ in range(count)]
                for t, src in enumerate(srcs):
                    for u, v in enumerate(accs):
                        load = f"_mm256_loadu_ps(({src}) + {i} + {u * VECTOR})"
                        if t == 0:
                            w.line(f"__m256 {v} = {load};")
                        elif op == "sum":
                            w.line(f"{v} = _mm256_add_ps({v}, {load});")
                        else:
                            e = kc.tmp("e")
                            w.line(f"const __m256 {e} = {load};")
                            w.line(f"{v} = _mm256_blendv_ps(_mm256_max_ps({e}, {v}), {e}, "
                                   f"_mm256_cmp_ps({e}, {e}, _CMP_UNORD_Q));")
                for u, v in enumerate(accs):
                    if divisor is not None:
                        kind, term = divisor[1]
                        col = (f"_mm256_set1_ps({term})" if kind == "const"
                               else f"_mm256_loadu_ps({term} + {i} + {u * VECTOR})")
                        w.line(f"{v} = _mm256_div_ps({v}, _mm256_mul_ps({dr}, {col}));")
                    w.line(f"_mm256_storeu_ps({dst} + {i} + {u * VECTOR}, {v});")
        w.line("#else")
    j, a = kc.tmp("j"), kc.tmp("a")
    with w.block(f"for (long {j} = 0; {j} < {exact}; ++{j})"):
        w.line(f"float {a} = ({srcs[0]})[{j}];")
        for src in srcs[1:]:
            v = f"({src})[{j}]"
            w.line(f"{a} = {nan_max(v, a, np.float32)};" if op == "max" else f"{a} += {v};")
        if divisor is not None:
            kind, term = divisor[1]
            w.line(f"{a} = {a} / ({divisor[0]} * {term if kind == 'const' else f'{term}[{j}]'});")
        w.line(f"{dst}[{j}] = {a};")
    if simd:
        w.line("#endif")


def _nan_max_avx(kc, acc: str, v: str) -> None:
    """``acc = nan_max(v, acc)`` on 8 lanes (see ``_taps_row``)."""
    e = kc.tmp("e")
    kc.w.line(f"const __m256 {e} = {v};")
    kc.w.line(f"{acc} = _mm256_blendv_ps(_mm256_max_ps({e}, {acc}), {e}, _mm256_cmp_ps({e}, {e}, _CMP_UNORD_Q));")


def _in_place(kc, src: str, geo, hw, ohw, rm: str | None, dense: str, divisor,
              prefetch: tuple[str, str, int, int] | None = None) -> None:
    """AVX2 pool of one plane read in place (column stride 1 or 2), into ``dense`` (rows at
    ``oh * OW``). A tap's 8 inputs for outputs ``ow0..ow0+7`` start at column ``ow0 * SW + c``;
    stride 2 takes the even or odd floats of two loads (``shufps``, lanes in the order 0 1 4 5
    2 3 6 7, the same for every tap, put back in order before the store: the max is per lane).
    Lanes outside the input row are masked loads (nothing read) made ``-inf``, taps whose lanes
    for the outputs all fall outside, and kernel rows outside the plane, are left out: a ``-inf``
    padding tap never changes ``nan_max``, so the bits are those of the padded plain path.
    AveragePool (``divisor`` not None, see ``_divisor``) keeps every tap in the plain path's order,
    0 where the plain path's padding is (a masked lane, a tap or a kernel row outside the input):
    ``-0 + 0`` is ``+0``, so leaving them out could change the sign of a zero.
    ``rm``: separable (``_separable``), each input row's max along ``KW`` into ``rm`` (pitch: the
    rounded output row), then the max down ``KH`` of those rows; else all taps per output row.
    ``prefetch``: ``(tensor pointer, the plane's offset in it, the tensor's floats, floats ahead)``:
    each step over the rows first prefetches the rows it advances by, that far past the first row
    it reads (into the next plane at the plane's end, never past the tensor), see
    ``CodegenOptions.pool_prefetch_bytes``."""
    saved = kc.w
    body = CWriter(saved.level)
    kc.w = body
    w = body
    H, W = hw
    OH, OW = ohw
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
    blocks = -(-OW // VECTOR)
    span = blocks * VECTOR
    is_max = divisor is None
    pad = "_mm256_set1_ps(-INFINITY)" if is_max else "_mm256_setzero_ps()"
    masks: dict[tuple[bool, ...], tuple[str, str]] = {}

    def load(row: str | None, start: int) -> str:
        lanes = tuple(0 <= start + lane < W for lane in range(VECTOR))
        if row is None or not any(lanes):
            return pad
        at = add(row, str(start))
        if all(lanes):
            return f"_mm256_loadu_ps({at})"
        if lanes not in masks:
            masks[lanes] = (kc.tmp("mask"), kc.tmp("ninf"))
        m, ninf = masks[lanes]
        return f"_mm256_or_ps(_mm256_maskload_ps({at}, {m}), {ninf})" if is_max else f"_mm256_maskload_ps({at}, {m})"

    def row_taps(b: int, kws) -> list[int]:
        """Columns ``c`` of the taps (kernel columns ``kws``) with a lane inside the row for outputs < OW."""
        found = []
        for kw in kws:
            c = b * VECTOR * SW + kw * DW - PL
            if not is_max or any(b * VECTOR + lane < OW and 0 <= c + lane * SW < W for lane in range(VECTOR)):
                found.append(c)
        return found

    def vector(row: str | None, c: int, pairs: dict) -> str:
        """The 8 floats of the tap at column ``c`` (for 8 consecutive outputs; ``row`` None:
        a kernel row outside the input)."""
        if SW == 1 or row is None:
            return load(row, c)
        even = c - c % 2
        if (row, even) not in pairs:
            pairs[row, even] = (kc.tmp("lo"), kc.tmp("hi"))
            w.line(f"const __m256 {pairs[row, even][0]} = {load(row, even)}, {pairs[row, even][1]} = "
                   f"{load(row, even + VECTOR)};")
        lo, hi = pairs[row, even]
        return f"_mm256_shuffle_ps({lo}, {hi}, {0xDD if c % 2 else 0x88})"

    def reorder(v: str) -> None:
        if SW == 2:  # 0 1 4 5 2 3 6 7 -> 0 .. 7: 64-bit pairs 0 2 1 3
            w.line(f"{v} = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd({v}), 0xD8));")

    def taps_max(sources: list[tuple[str | None, int]], out_at: str, b: int = 0) -> None:
        """``out_at`` (8 floats) = nan_max (or the sum, then divided) over the taps ``(row pointer,
        column)`` in order."""
        v = kc.tmp("v")
        pairs: dict = {}
        if not sources:
            w.line(f"__m256 {v} = {pad};")
        for t, (row, c) in enumerate(sources):
            x = vector(row, c, pairs)
            if t == 0:
                w.line(f"__m256 {v} = {x};")
            elif is_max:
                _nan_max_avx(kc, v, x)
            else:
                w.line(f"{v} = _mm256_add_ps({v}, {x});")
        reorder(v)
        if not is_max:
            kind, term = divisor[1]
            col = f"_mm256_set1_ps({term})" if kind == "const" else f"_mm256_loadu_ps({term} + {b * VECTOR})"
            w.line(f"{v} = _mm256_div_ps({v}, _mm256_mul_ps(_mm256_set1_ps({divisor[0](oh)}), {col}));")
        w.line(f"_mm256_storeu_ps({out_at}, {v});")

    def ahead_rows(first: str, floats: int) -> None:
        """Prefetch ``floats`` floats from ``prefetch``'s distance past plane offset ``first``."""
        if prefetch is None:
            return
        tensor, plane, total, ahead = prefetch
        pf, q = kc.tmp("pf"), kc.tmp("q")
        w.line(f"const long {pf} = {plane} + {first} + {ahead};")
        w.line(f"for (long {q} = {pf} < 0 ? 0 : {pf}; {q} < {pf} + {floats} && {q} < {total}; {q} += 16) "
               f"_mm_prefetch((const char*)({tensor} + {q}), _MM_HINT_T1);")

    base = kc.tmp("src")
    w.line(f"const float* {base} = {src};")
    classes = row_classes(OH, KH, SH, DH, PT, H)
    oh = kc.tmp("oh")
    if rm is not None:
        ih = kc.tmp("ih")
        with w.block(f"for (long {ih} = 0; {ih} < {H}; ++{ih})"):
            ahead_rows(f"{ih} * {W}", W)
            row = kc.tmp("row")
            w.line(f"const float* {row} = {base} + {mul(ih, W)};")
            for b in range(blocks):
                with w.block(""):
                    taps_max([(row, c) for c in row_taps(b, range(KW))], f"{rm} + {mul(ih, span)} + {b * VECTOR}")
        for lo, hi, inside in classes:
            with w.block(f"for (long {oh} = {lo}; {oh} < {hi}; ++{oh})"):
                rrows = []
                for kh in inside:
                    r = kc.tmp("rrow")
                    w.line(f"const float* {r} = {rm} + {mul(add(mul(oh, SH), str(kh * DH - PT)), span)};")
                    rrows.append(r)
                j = kc.tmp("j")
                with w.block(f"for (long {j} = 0; {j} < {span}; {j} += {VECTOR})"):
                    v = kc.tmp("v")
                    if not rrows:
                        w.line(f"__m256 {v} = _mm256_set1_ps(-INFINITY);")
                    for t, r in enumerate(rrows):
                        if t == 0:
                            w.line(f"__m256 {v} = _mm256_loadu_ps({r} + {j});")
                        else:
                            _nan_max_avx(kc, v, f"_mm256_loadu_ps({r} + {j})")
                    w.line(f"_mm256_storeu_ps({dense} + {mul(oh, OW)} + {j}, {v});")
    else:
        for lo, hi, inside in classes:
            with w.block(f"for (long {oh} = {lo}; {oh} < {hi}; ++{oh})"):
                ahead_rows(f"({oh} * {SH} - {PT}) * {W}", SH * W)
                rows: dict[int, str] = {}
                for kh in inside:
                    rows[kh] = kc.tmp("row")
                    w.line(f"const float* {rows[kh]} = {base} + {mul(add(mul(oh, SH), str(kh * DH - PT)), W)};")
                # MaxPool leaves out the kernel rows outside the input, AveragePool reads them as 0.
                kernel_rows = inside if is_max else range(KH)
                for b in range(blocks):
                    with w.block(""):
                        cols = {kw: row_taps(b, [kw]) for kw in range(KW)}
                        srcs = [(rows.get(kh), cols[kw][0]) for kh in kernel_rows for kw in range(KW) if cols[kw]]
                        taps_max(srcs, f"{dense} + {mul(oh, OW)} + {b * VECTOR}", b)
    kc.w = saved
    for lanes, (m, ninf) in masks.items():
        bits = ", ".join("-1" if ok else "0" for ok in lanes)
        fills = ", ".join("0.0f" if ok else "-INFINITY" for ok in lanes)
        saved.line(f"const __m256i {m} = _mm256_setr_epi32({bits});")
        saved.line(f"const __m256 {ninf} = _mm256_setr_ps({fills});")
    saved.lines.extend(body.lines)
