"""Depthwise 2-D convolution (one input and one output channel per group), vectorised along
the output rows.

Per channel plane (the unit the threads share):

1. the plane is copied, through the prologue, into a zero-padded buffer in scratch, once per
   input element. With stride ``s`` every padded row is stored as its ``s`` column phases
   one after the other (columns ``j = q*s + phase`` at ``phase * Wh + q``), so the taps of
   consecutive outputs are consecutive floats whatever the stride;
2. each output row is ``sum_taps w[kh, kw] * row(oh*s + kh*d)[phase(kw) * Wh + ow + shift(kw)]``:
   every tap's weight in a register, one unaligned vector load and one FMA per tap and 8
   outputs (AVX2/FMA intrinsics, four vectors in flight; plain C that gcc vectorises where
   there is no AVX2), the taps summed in the same order for every element. With stride 1
   the whole plane is one such row ("wide": the padding columns are computed and dropped);
3. the outputs go through the bias and the fused epilogue while they are in L1.

In NCHW the plane's width is the unit-stride axis, so this is where the vectors go: across
channels a vector would gather from ``C`` planes.
"""
from __future__ import annotations

from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index
from opfuse.codegen.microkernel import AVX2_GUARD
from opfuse.codegen.stages import Stage

VECTOR = 8     # floats per ymm register
UNROLL = 4     # independent accumulators per row step (the FMA latency is 4 cycles)
MAX_TAPS_IN_REGISTERS = 10  # beyond this the weights are broadcast from memory at each use
# Padded planes up to this many floats are computed as one wide row: with the wide results
# the plane and they stay in L1 (a 112 x 112 plane that way ran 30% slower than row by row).
WIDE_MAX_FLOATS = 2048


def lower_depthwise(kc, ev, stage: Stage, node, geo, bias_term) -> None:
    """``bias_term(ev, node, acc, channel)``: the accumulator plus the node's bias (conv.py)."""
    x, wt = node.input(0), node.input(1)
    out = node.outputs[0]
    nimg, C, H, W = x.shape
    OH, OW = out.shape[2:]
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
    Hp = max(H + PT + geo.pads_end[0], (OH - 1) * SH + (KH - 1) * DH + 1)
    Wp = max(W + PL + geo.pads_end[1], (OW - 1) * SW + (KW - 1) * DW + 1)
    Wh = -(-Wp // SW)          # floats per column phase of a padded row
    row_len = SW * Wh          # floats per padded row
    # Stride 1, small planes: the plane is one "wide" row (i = oh * Wp + ow; the columns
    # ow >= OW are computed and dropped), so one long vector loop covers it. Otherwise one loop
    # per output row (its results stay in L1). Either way the vectors run past the last output
    # into whole vectors (no scalar tail): the plane buffer has slack for their reads and the
    # results are dropped.
    wide = SH == 1 and SW == 1 and Hp * Wp <= WIDE_MAX_FLOATS
    exact = (OH - 1) * Wp + OW if wide else OW
    span = _round_up(exact, VECTOR)
    reach = (KH - 1) * DH * row_len + ((KW - 1) * DW) % SW * Wh + (KW - 1) * DW // SW + span
    last_row = 0 if wide else (OH - 1) * SH * row_len
    slack = max(0, last_row + reach - Hp * row_len)
    off_plane = kc.scratch((Hp * row_len + slack) * 4)
    off_acc = kc.scratch(span * 4)
    simd = kc.program.options.simd == "auto"
    if simd:
        kc.program.require_helper("opfuse_immintrin", f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n")
    w = kc.w
    plane = kc.tmp("plane")
    kc.parallel_for(2 * nimg * C * OH * OW * KH * KW)
    with w.block(f"for (long {plane} = 0; {plane} < {nimg * C}; ++{plane})"), ev.scope():
        img, ch, xp, acc = kc.tmp("img"), kc.tmp("ch"), kc.tmp("xpad"), kc.tmp("acc")
        w.line(f"const long {img} = {plane} / {C};")
        w.line(f"const long {ch} = {plane} % {C};")
        w.line(f"float* restrict {xp} = {kc.scratch_ptr('float', off_plane)};")
        w.line(f"float* restrict {acc} = {kc.scratch_ptr('float', off_acc)};")
        _copy_padded_plane(kc, ev, x, img, ch, xp, (H, W), (Hp, Wp), (PT, PL), SW, Wh)
        if slack:
            w.line(f"memset({xp} + {Hp * row_len}, 0, sizeof(float) * {slack});")
        taps = []  # (weight scalar, row offset in padded rows, column offset in the phased row)
        for kh in range(KH):
            for kw in range(KW):
                wv = ev.at(wt, Index(wt.shape, (ch, "0", str(kh), str(kw))))
                col = kw * DW
                taps.append((wv, kh * DH, (col % SW) * Wh + col // SW))
        oh, ow = kc.tmp("oh"), kc.tmp("ow")
        if wide:
            _taps_pass(kc, [(wv, f"{xp} + {r * row_len + c}") for wv, r, c in taps], acc, span, exact, simd)
        rows_loop = w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})")
        rows_loop.__enter__()
        if not wide:
            rows: dict[int, str] = {}
            for _, r, _ in taps:
                if r not in rows:
                    rows[r] = kc.tmp("row")
                    w.line(f"const float* restrict {rows[r]} = {xp} + ({oh} * {SH} + {r}) * {row_len};")
            _taps_pass(kc, [(wv, f"{rows[r]} + {c}") for wv, r, c in taps], acc, span, exact, simd)
        with w.block(f"for (long {ow} = 0; {ow} < {OW}; ++{ow})"), ev.scope():
            idx = Index(out.shape, (img, ch, oh, ow))
            y = kc.tmp("y")
            a = f"{acc}[{oh} * {Wp} + {ow}]" if wide else f"{acc}[{ow}]"
            w.line(f"const float {y} = {bias_term(ev, node, a, ch)};")
            finish_element(kc, ev, stage, out, idx, y)
        rows_loop.__exit__(None, None, None)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _taps_pass(kc, srcs, acc: str, span: int, exact: int, simd: bool) -> None:
    """``acc[i] = sum_t w_t * src_t[i]``: ``span`` (whole vectors) with AVX2, else the first
    ``exact`` (the plain C99 loop, which gcc vectorises with its own tail)."""
    w = kc.w
    if simd:
        w.line(f"#if {AVX2_GUARD}")
        _row_avx2(kc, srcs, acc, span)
        w.line("#else")
    _row_plain(kc, srcs, acc, "0", span if span == exact else exact)
    if simd:
        w.line("#endif")


def _copy_padded_plane(kc, ev, x, img, ch, xp, hw, padded, pads, SW, Wh) -> None:
    """``xp``: the plane zero-padded, each row stored as its SW column phases."""
    w = kc.w
    H, W = hw
    Hp, Wp = padded
    PT, PL = pads
    row_len = SW * Wh
    r, ih, dst, j = kc.tmp("r"), kc.tmp("ih"), kc.tmp("dst"), kc.tmp("j")
    with w.block(f"for (long {r} = 0; {r} < {Hp}; ++{r})"):
        w.line(f"const long {ih} = {r} - {PT};")
        w.line(f"float* restrict {dst} = {xp} + {r} * {row_len};")
        with w.block(f"if ((unsigned long){ih} >= {H}ul)"):
            w.line(f"memset({dst}, 0, sizeof(float) * {row_len});")
            w.line("continue;")
        # Zero the padding columns (left of the input, right of it up to the phases' end).
        for lo, hi in ((0, PL), (PL + W, row_len)):
            if hi > lo:
                where = f"{j}" if SW == 1 else f"({j} % {SW}) * {Wh} + {j} / {SW}"
                w.line(f"for (long {j} = {lo}; {j} < {hi}; ++{j}) {dst}[{where}] = 0.0f;")
        for ph in range(SW):  # padded column j = q * SW + ph holds input column j - PL
            q_lo = max(0, -(-(PL - ph) // SW))
            q_hi = -(-(PL + W - ph) // SW)
            if q_hi <= q_lo:
                continue
            q = kc.tmp("q")
            with w.block(f"for (long {q} = {q_lo}; {q} < {q_hi}; ++{q})"), ev.scope():
                iw = f"{q} * {SW} + {ph - PL}" if SW > 1 else f"{q} - {PL}" if PL else q
                w.line(f"{dst}[{ph * Wh} + {q}] = {ev.at(x, Index(x.shape, (img, ch, ih, iw)))};")


def _row_plain(kc, srcs, acc: str, start: str, OW: int) -> None:
    w = kc.w
    ow, a = kc.tmp("ow"), kc.tmp("a")
    with w.block(f"for (long {ow} = {start}; {ow} < {OW}; ++{ow})"):
        w.line(f"float {a} = {srcs[0][0]} * ({srcs[0][1]})[{ow}];")
        for wv, src in srcs[1:]:
            w.line(f"{a} += {wv} * ({src})[{ow}];")
        w.line(f"{acc}[{ow}] = {a};")


def _row_avx2(kc, srcs, acc: str, span: int) -> None:
    w = kc.w
    in_regs = len(srcs) <= MAX_TAPS_IN_REGISTERS
    wvs = []
    for wv, _ in srcs:
        name = kc.tmp("wv")
        w.line(f"const __m256 {name} = _mm256_set1_ps({wv});" if in_regs else f"const float {name}s = {wv};")
        wvs.append(name if in_regs else f"_mm256_set1_ps({name}s)")
    i = kc.tmp("i")
    w.line(f"long {i} = 0;")
    step = VECTOR * UNROLL
    for width, count in ((step, UNROLL), (VECTOR, 1)):
        if width > span:
            continue
        with w.block(f"for (; {i} + {width} <= {span}; {i} += {width})"):
            accs = [kc.tmp("v") for _ in range(count)]
            for t, (wvec, (_, src)) in enumerate(zip(wvs, srcs, strict=True)):
                for u, v in enumerate(accs):
                    load = f"_mm256_loadu_ps(({src}) + {i} + {u * VECTOR})"
                    expr = f"_mm256_mul_ps({wvec}, {load})" if t == 0 else f"_mm256_fmadd_ps({wvec}, {load}, {v})"
                    w.line(f"{'__m256 ' if t == 0 else ''}{v} = {expr};")
            for u, v in enumerate(accs):
                w.line(f"_mm256_storeu_ps({acc} + {i} + {u * VECTOR}, {v});")
