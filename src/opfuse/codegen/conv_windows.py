"""2-D convolution as an implicit GEMM over its windows (no im2col buffer).

Per image and group, with ``p = (oh, ow)`` an output position and ``k = (c, kh, kw)``::

    Y[p, oc] = sum_k X[c, oh*sh + kh*dh - pt, ow*sw + kw*dw - pl] * W[oc, k]

The GEMM's A (positions x K) is read in place by the micro-kernel's ``koff`` access: row
``p`` starts at its window's origin, and ``koff[k]`` is the offset of ``(c, kh, kw)`` from
it, so ``A[p, k] = origin(p)[koff[k]]``. B is the weights transposed (K x channels),
packed at build time into the micro-kernel's NR-channel panels; the micro-kernel broadcasts
one input value per position and multiplies it into NR channels at once. Positions are the
GEMM's M, so a tile's C is positions x channels: ``gemm.py`` transposes it back before the
epilogue, which stores along the positions (NCHW's unit stride).

Where a window can leave the input (padding) or the input is computed by a prologue, each
tile first copies the input rows its positions need, zero-padded, into scratch (the *band*:
``cg x rows x Wp`` floats), and the windows are read there; an unpadded input in memory is
read where it is.

A 1x1 convolution with many output channels per group (``CodegenOptions.windows_pack_min_channels``)
packs A instead: per tile and K block, each input channel's run of the tile's positions is
copied into the micro-kernel's k-major MR-row panels (``ChannelRowsPacker``), which the
micro-kernel then reads sequentially; the copy is repeated per tile of channels, so it pays
where a tile has many.
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import numpy as np

from opfuse.codegen.gemm import GemmProblem, Operand, RowAccess, in_memory, single_row_fits, tail_rows
from opfuse.codegen.index import Index, add, delinearize, mul
from opfuse.codegen.microkernel import YMM_FLOATS, fits_avx512
from opfuse.codegen.options import WINDOWS_MR_MAX



def band_rows(node, geo, tile_positions: int) -> int:
    """Most input rows one tile of ``tile_positions`` output positions reads (a conv ``node`` of window
    geometry ``geo``): its output rows' span times the row stride, plus the window's height."""
    OH, OW = node.outputs[0].shape[2:]
    P = OH * OW
    SH, DH, KH = geo.strides[0], geo.dilations[0], geo.kernel[0]
    most = 0
    for m0 in range(0, P, tile_positions):
        first, last = m0 // OW, (min(P, m0 + tile_positions) - 1) // OW
        most = max(most, (last - first) * SH)
    return most + (KH - 1) * DH + 1


class ConvWindows(RowAccess):
    """``RowAccess`` of a 2-D convolution's windows (see the module docstring)."""

    def __init__(self, kc, ev, node, geo, group: int, tile_positions: int):
        self.kc, self.ev, self.node, self.geo, self.group = kc, ev, node, geo, group
        self.x = node.input(0)
        _, C, H, W = self.x.shape
        OW = node.outputs[0].shape[3]
        KH, KW = geo.kernel
        SW, DW, PL = geo.strides[1], geo.dilations[1], geo.pads_begin[1]
        self.cg = C // group
        padded = any(geo.pads_begin) or any(geo.pads_end)
        self.in_place = in_memory(ev, self.x) and not padded
        self.scattered = any(k != 1 for k in geo.kernel) or any(s != 1 for s in geo.strides)
        if self.in_place:
            self.row_len, self.rows = W, H
        else:
            self.row_len = max(W + PL + geo.pads_end[1], (OW - 1) * SW + (KW - 1) * DW + 1)
            self.rows = band_rows(self.node, self.geo, tile_positions)
        self._offsets()
        self.base = ""
        self.first_row = ""
        self.offset = 0

    def _offsets(self) -> None:
        """``koff``: each (channel, tap) pair's offset from its window's origin in the band (or input)."""
        KH, KW = self.geo.kernel
        DH, DW = self.geo.dilations
        plane = self.rows * self.row_len
        c, kh, kw = np.meshgrid(np.arange(self.cg), np.arange(KH), np.arange(KW), indexing="ij")
        self.koff = (c * plane + kh * DH * self.row_len + kw * DW).reshape(-1).astype(np.int64)

    def prepare(self, kc, MC: int) -> None:
        if not self.in_place:  # the band holds what a tile of the blocking's MC positions reads
            self.rows = band_rows(self.node, self.geo, MC)
            self._offsets()
            self.offset = kc.scratch(self.cg * self.rows * self.row_len * 4)

    def per_tile(self, kc, ev, b: str, m0: str, mc: str) -> None:
        w = kc.w
        G, cg = self.group, self.cg
        _, C, H, W = self.x.shape
        img, g = (f"({b} / {G})", f"({b} % {G})") if G > 1 else (b, "0")
        self.base = kc.tmp("win")
        if self.in_place:
            w.line(f"const float* restrict {self.base} = {kc.ptr(self.x)} + "
                   f"{mul(add(mul(img, C), mul(g, cg)), H * W)};")
            return
        OW = self.node.outputs[0].shape[3]
        SH = self.geo.strides[0]
        self.first_row = kc.tmp("oh0")
        nrows = kc.tmp("nrows")
        w.line(f"float* restrict {self.base} = {kc.scratch_ptr('float', self.offset)};")
        w.line(f"const long {self.first_row} = {m0} / {OW};")
        # The tile's output rows span, times the stride, plus the window's rows.
        w.line(f"const long {nrows} = (({m0} + {mc} - 1) / {OW} - {self.first_row}) * {SH} + "
               f"{(self.geo.kernel[0] - 1) * self.geo.dilations[0] + 1};")
        with contextlib.ExitStack() as guard:
            if self.reuse is not None:  # this thread's band already holds these rows: no copy
                staged, key = self.reuse
                guard.enter_context(w.block(f"if ({staged} != {key})"))
                w.line(f"{staged} = {key};")
            self._copy_rows(kc, ev, b, nrows)

    def _copy_rows(self, kc, ev, b: str, nrows: str) -> None:
        """The band's rows: input rows ``first_row * SH - PT`` on, zero outside the input and in the padding."""
        w = kc.w
        G, cg = self.group, self.cg
        _, C, H, W = self.x.shape
        img, g = (f"({b} / {G})", f"({b} % {G})") if G > 1 else (b, "0")
        SH, PT, PL = self.geo.strides[0], self.geo.pads_begin[0], self.geo.pads_begin[1]
        Wp, R = self.row_len, self.rows
        c, r, ih, dst, iw = (kc.tmp(n) for n in ("c", "r", "ih", "dst", "iw"))
        with w.block(f"for (long {c} = 0; {c} < {cg}; ++{c})"):
            ch = add(mul(g, cg), c) if G > 1 else c
            with w.block(f"for (long {r} = 0; {r} < {nrows}; ++{r})"):
                w.line(f"const long {ih} = {self.first_row} * {SH} + {r} - {PT};")
                w.line(f"float* restrict {dst} = {self.base} + ({c} * {R} + {r}) * {Wp};")
                with w.block(f"if ((unsigned long){ih} >= {H}ul)"):
                    w.line(f"memset({dst}, 0, sizeof(float) * {Wp});")
                    w.line("continue;")
                if PL:
                    w.line(f"memset({dst}, 0, sizeof(float) * {PL});")
                with w.block(f"for (long {iw} = 0; {iw} < {W}; ++{iw})"), ev.scope():
                    idx = Index(self.x.shape, (img, ch, ih, iw))
                    w.line(f"{dst}[{PL} + {iw}] = {ev.at(self.x, idx)};")
                if Wp > PL + W:
                    w.line(f"memset({dst} + {PL + W}, 0, sizeof(float) * {Wp - PL - W});")

    def stages_per_tile(self) -> bool:
        return not self.in_place

    def row_step(self, MR: int) -> int:
        """Consecutive positions of one output row are ``SW`` floats apart, and every MR-position block
        lies in one output row where MR divides the row (a row of the input itself where the windows
        run over it contiguously: then any block)."""
        OW = self.node.outputs[0].shape[3]
        SH, SW = self.geo.strides
        if self.in_place and SH == SW == 1 and OW == self.x.shape[3]:
            return 1
        return SW if OW % MR == 0 else 0

    def row(self, b: str, m: str) -> str:
        OW = self.node.outputs[0].shape[3]
        SH, SW = self.geo.strides
        W = self.x.shape[3]
        if self.in_place and SH == SW == 1 and OW == W:
            return f"{self.base} + {m}"
        oh = f"({m}) / {OW}" if not self.first_row else f"(({m}) / {OW} - {self.first_row})"
        return f"{self.base} + {oh} * {SH * self.row_len} + ({m}) % {OW} * {SW}"


# Few channels per group (grouped convolutions): 12 positions x 8 channels per micro-kernel
# (12 ymm accumulators) instead of 6 x 16, whose 16-channel panels would be half zeros; up to
# ``CodegenOptions.narrow_mr_max`` positions where that pads the positions less.
NARROW_BLOCK = (12, 8)


def register_block(o, channels: int, positions: int, row: int = 0) -> tuple[int, int]:
    """MR x NR of the windows GEMM (positions x channels). One position (a squeeze-excitation block's 1x1
    convolutions on the pooled vector), with the intrinsics: 1 x NR, NR a multiple of 8 up to ``gemm_gemv_nr``
    that ``gemm.single_row_fits`` (as the GEMM's single row), the fewest panels, then the least padding, then the
    widest (120 channels: 3 panels of 40): the MR - 1 other rows of MR x NR repeated the one position's work, and
    their part block went through the C tile (ppocr_rec's squeeze-excitation convolutions 4.7-18.1 against
    5.9-22.9 us, 1 thread, kernel timers, 25 rounds).
    Its A (the positions) is never packed at build time, so MR is free: with the AVX-512 block, the MR from
    ``windows_mr_min`` up to ``windows_mr_max`` (within the zmm registers) that pads the positions least, the larger
    on a tie (7x7: 49 positions in 7 rows of 7 instead of 7 of 8; 14x14: 196 in 14 rows of 14 where the
    range reaches 14, as it does on hosts with zmm-wide FMA pipes). Few channels
    per group: ``NARROW_BLOCK``, its MR from 12 to ``narrow_mr_max`` by the same rule. Of MRs that pad
    alike, one that divides the output ``row`` (its width) first: then every block lies in one output row
    and reads its windows through one pointer (``ConvWindows.row_step``; 28x28: 7 rather than 8)."""

    def key(mr: int) -> tuple[int, bool, int]:
        return -(-positions // mr) * mr, bool(row) and row % mr != 0, -mr

    widths = [n for n in range(YMM_FLOATS, o.gemm_gemv_nr + 1, YMM_FLOATS) if single_row_fits(o, n)] \
        if positions == 1 else []  # one position (a pooled squeeze-excitation)
    if widths:  # the fewest panels, then the least padding, then the widest
        return 1, min(widths, key=lambda n: (-(-channels // n), -(-channels // n) * n, -n))
    if channels <= NARROW_BLOCK[1] < o.gemm_nr:
        if o.narrow_mr_max <= NARROW_BLOCK[0]:
            return NARROW_BLOCK
        mr = min(range(NARROW_BLOCK[0], o.narrow_mr_max + 1), key=key)
        return mr, NARROW_BLOCK[1]
    # None where the options are not resolved for a host (``CodegenOptions.resolved`` fills it in)
    mr_max = WINDOWS_MR_MAX if o.windows_mr_max is None else o.windows_mr_max
    if o.vector_isa != "avx512" or o.simd != "auto" or not mr_max:
        return o.gemm_mr, o.gemm_nr
    fits = [mr for mr in range(o.windows_mr_min, mr_max + 1) if fits_avx512(mr, o.gemm_nr)]
    if not fits:
        return o.gemm_mr, o.gemm_nr
    return min(fits, key=key), o.gemm_nr


def tile_positions(o, channels: int, positions: int, row: int = 0) -> int:
    """Output positions per tile: the C tile holds ``gemm_tile_floats`` for all the channels
    (up to ``gemm_wide``), at least a few micro-kernel rows."""
    mr, nr = register_block(o, channels, positions, row)
    ch = min(-(-channels // nr) * nr, o.gemm_wide)
    return max(4 * mr, o.gemm_tile_floats // ch // mr * mr)


def windows_problem(kc, ev, node, geo, group: int, weights: np.ndarray, finish_bias) -> GemmProblem:
    """The convolution as (positions x K) @ (K x channels) per image and group."""
    x, out = node.input(0), node.outputs[0]
    nimg = x.shape[0]
    OC = out.shape[1]
    mg = OC // group
    out_sp = out.shape[2:]
    P = math.prod(out_sp)
    K = weights.size // OC
    G = group

    def split(b: str) -> tuple[str, str]:
        return (f"{b} / {G}", f"({b} % {G})") if G > 1 else (b, "0")

    def oc_of(b: str, n: str) -> str:
        return add(mul(split(b)[1], mg), n) if G > 1 else n

    def out_index(b, m, n):
        dims = (split(b)[0], oc_of(b, n)) + tuple(delinearize(m, out_sp))
        return Index(out.shape, dims, ((2, 4, m),))

    def no_load(ev, b, r, c):  # both operands are read in place or packed at build time
        raise AssertionError("the windows GEMM has no loaded operand")

    positions = tile_positions(kc.program.options, mg, P, out_sp[-1])
    if _positions_packed(kc.program.options, ev, node, geo, mg):
        a_op = Operand(no_load)
        pack_a: ChannelRowsPacker | None = ChannelRowsPacker(kc, node, G)
    else:
        a_op = Operand(no_load, rows=ConvWindows(kc, ev, node, geo, G, positions))
        pack_a = None
    wt = weights.astype(np.float32).reshape(G, mg, K).transpose(0, 2, 1)
    b_op = Operand(no_load, static=np.ascontiguousarray(wt),
                   batch_expr=(lambda b: f"({b} % {G})") if G > 1 else (lambda b: "0"))

    def bias_swapped(ev, b, m, n):
        return finish_bias(ev, b, n, m)

    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return GemmProblem(node.name, nimg * G, P, mg, K, a_op, b_op, out, out_index,
                       finish_bias=bias_swapped if finish_bias is not None else None,
                       dtype=out.dtype, out_contiguous="m", weights_axis="n", mc=positions,
                       register_block=register_block(kc.program.options, mg, P, out_sp[-1]), pack_a=pack_a,
                       store_ld=P, row_bias=bias, bias_index=oc_of)


def _positions_packed(o, ev, node, geo, channels: int) -> bool:
    """A 1x1, stride-1, unpadded convolution of an input in memory with at least
    ``windows_pack_min_channels`` output channels per group packs its A (positions x input
    channels) per tile, k-major, instead of broadcasting each value from its window through the
    offset table (``CodegenOptions.windows_pack_min_channels``)."""
    return (all(k == 1 for k in geo.kernel) and all(s == 1 for s in geo.strides)
            and not any(geo.pads_begin) and not any(geo.pads_end)
            and channels >= o.windows_pack_min_channels and in_memory(ev, node.input(0)))


class ChannelRowsPacker:
    """A of a 1x1 convolution, ``A[p, c] = X[c, p]`` (NCHW: position ``p`` of channel ``c``), into
    the tile's MR-row panels: one channel's run of the tile's positions at a time (unit stride)."""

    def __init__(self, kc, node, group: int):
        self.kc, self.x, self.group = kc, node.input(0), group

    def pack(self, kc, ap: str, b: str, m0: str, mc: str, pc: str, kb: str, MR: int,
             tails: Sequence[int] = ()) -> None:
        w = kc.w
        _, C, H, W = self.x.shape
        G = self.group
        cg, P = C // G, H * W
        img, g = (f"({b} / {G})", f"({b} % {G})") if G > 1 else (b, "0")
        k, ip, r, src, dst, full = (kc.tmp(n) for n in ("k", "ip", "r", "src", "dst", "full"))
        # Whole panels with a constant trip count (gcc unrolls the MR copies), then the last one (or the tail
        # panels, ``gemm.tail_panels``: in the last row tile, each its own width).
        body = P - sum(tails)
        w.line(f"const long {full} = {mc} / {MR} * {MR};" if not tails else
               f"const long {full} = {body} - {m0} < {mc} ? {body} - {m0} : {mc};")
        with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
            first = mul(add(mul(img, C), mul(g, cg), f"{pc} + {k}"), P)
            w.line(f"const float* restrict {src} = {kc.ptr(self.x)} + {first} + {m0};")
            w.line(f"float* restrict {dst} = {ap} + {k} * {MR};")
            with w.block(f"for (long {ip} = 0; {ip} < {full}; {ip} += {MR})"):
                w.line(f"for (long {r} = 0; {r} < {MR}; ++{r}) {dst}[{ip} * {kb} + {r}] = {src}[{ip} + {r}];")
            if tails:
                with w.block(f"if ({m0} + {mc} == {P})"):
                    for start, width in tail_rows(P, tails):
                        w.line(f"for (long {r} = 0; {r} < {width}; ++{r}) "
                               f"{ap}[({start} - {m0}) * {kb} + {k} * {width} + {r}] = {src}[{start} - {m0} + {r}];")
            else:
                with w.block(f"if ({full} < {mc})"):
                    w.line(f"for (long {r} = 0; {r} < {MR}; ++{r}) "
                           f"{dst}[{full} * {kb} + {r}] = {full} + {r} < {mc} ? {src}[{full} + {r}] : 0.0f;")
