"""2-D convolution with few input channels, computed channels x positions over a phase-split band.

A network's first layer (mobilenet's 3x3 stride-2 stem: 3 -> 32 channels, K = 27) is a poor GEMM
for the windows kernel (``conv_windows.py``): that one computes positions x channels, so its C
tile must be transposed before the epilogue can store NCHW rows, and with K this small the tile's
round trips through the cache (micro-kernel stores, transpose, epilogue) cost as much as the
multiply-adds. Here the GEMM is ``W (channels x K) @ X_col (K x positions)``, like the other
convolutions, with the weights packed at build time into MR-channel panels and X_col read in
place, NR positions of one output row per vector:

    Y[oc, (oh, ow)] = sum_k W[oc, k] * band[c][(oh - oh0) * SH + kh * DH][phase(kw)][ow + q(kw)]

Each tile first copies the input rows its output rows need into scratch (the *band*), zero-padded
and split by column phase: padded column ``j`` goes to phase ``j % SW`` at ``j / SW``, so that a
stride-SW window's NR consecutive output positions read NR consecutive floats of one phase
(``phase(kw) = kw * DW % SW``, ``q(kw) = kw * DW / SW``). Row ``k = (c, kh, kw)`` of an NR-position
panel is then ``koff[k]`` floats past the panel's first window (the micro-kernel's ``koff`` B
access, ``microkernel.py``), and the C tile is channels x positions, stored by the epilogue along
NCHW's rows without a transpose. MLAS's NCHW-input kernel for NCHWc convolutions and XNNPACK's
first-layer kernels broadcast one input value into a vector of output channels instead; with
NCHW output (positions contiguous) the vectors here run along the positions.

An NR-wide panel of the phase-split band must not cross an output row, so there the output width
must be a multiple of NR (``direct_block``). Where it is not and the row stride is 1, the band is
instead split by kernel column (``ShiftedBand``): plane ``(c, kw)`` holds the rows the tile reads,
each ``OW`` floats wide, column ``ow`` the input column ``ow * SW + kw * DW - PL`` (zero outside), so
position ``n = oh * OW + ow`` of every ``(c, kh, kw)`` row is ``koff[k] + n`` floats past one origin
and panels run across output rows (a grouped convolution's 14x14 planes: 196 positions in 13 panels
of 16; the last, part one, finished through the C tile). A grouped convolution is one GEMM per image
and group (``G`` batches), its weights packed per group, each group's band holding its channels only.
Legality and profitability are ``direct_conv_refusal``.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.codegen.conv_windows import band_rows
from opfuse.codegen.gemm import ColAccess, GemmProblem, Operand, in_memory
from opfuse.codegen.index import Index, add, delinearize, mul
from opfuse.codegen.microkernel import ZMM_FLOATS, fits_avx2, fits_avx512


def direct_block(o, channels: int, least_padding: bool = False, wide: bool = False) -> tuple[int, int]:
    """MR x NR of the direct kernel: NR = ``conv_direct_nr`` positions (one zmm, or two ymm), and
    MR output channels: with the AVX-512 body, up to ``conv_direct_mr`` accumulators (fewer where the
    layer has fewer channels, but at least enough rows to hide the FMA latency); else the AVX2
    block's rows for that NR (6 x 16: 12 ymm), or with ``least_padding`` (a group's few channels) the
    rows that pad the channels least, the more on a tie (8 channels: 4 x 16; the 32-group layer's
    6-row blocks, a third of their rows padding, took 1.38x the time of 4-row ones, alone in C).
    ``wide`` (the caller's ``wide_direct_block``): with the AVX-512 body, ``conv_direct_vectors`` x NR
    positions and the rows, from 8 up to ``conv_direct_mr`` and what fits the registers, that pad the
    channels least (the more on a tie): 64 channels 8 x 32, not 14 x 32 (70 rows)."""
    nr = o.conv_direct_nr
    if wide and wide_direct_block(o):
        nr *= o.conv_direct_vectors
        fits = [r for r in range(MIN_WIDE_ROWS, o.conv_direct_mr + 1) if fits_avx512(r, nr)]
        return min(fits, key=lambda r: (-(-channels // r) * r, -r)), nr
    if o.simd == "auto" and o.vector_isa == "avx512" and fits_avx512(o.conv_direct_mr, nr):
        rounded = -(-channels // 2) * 2
        mr = max(8, min(o.conv_direct_mr, rounded))
        while not fits_avx512(mr, nr):
            mr -= 1
        return mr, nr
    fits = [r for r in range(1, 13) if fits_avx2(r, nr)] or [4]
    if least_padding:
        return min(fits, key=lambda r: (-(-channels // r) * r, -r)), nr
    return max(fits), nr


# Fewest rows of the wide block (``direct_block``): 8 rows of 2 zmm are 16 multiply-add chains, past the
# FMA latency (4) times the pipes (2 on Zen 5).
MIN_WIDE_ROWS = 8


def wide_direct_block(o) -> bool:
    """Whether the direct kernel's block may be ``conv_direct_vectors`` (2) vectors of ``conv_direct_nr``
    positions wide: the AVX-512 body (two zmm of B a k step, so a broadcast of A feeds two multiply-adds).
    ``conv_direct_nr`` must then be whole zmm vectors: a panel read in two pieces (``b_split``) loads each
    piece a zmm at a time (a ``conv_direct_nr`` of 8 or 24 made the AVX-512 body assert)."""
    return o.simd == "auto" and o.vector_isa == "avx512" and o.conv_direct_vectors == 2 and \
        o.conv_direct_nr % ZMM_FLOATS == 0 and o.conv_direct_mr >= MIN_WIDE_ROWS and \
        fits_avx512(MIN_WIDE_ROWS, o.conv_direct_nr * 2)


# Fewest output channels per group for the direct kernel: the AVX-512 block has at least 8 rows (enough FMA
# chains), so fewer channels would leave most of them padding; measured with 8 (``conv_direct_grouped``).
GROUPED_MIN_CHANNELS = 8


def row_crossing(node, geo, o) -> bool:
    """Whether the direct kernel reads this convolution's input as ``ShiftedBand`` (panels across output
    rows: the output width not a multiple of NR, and the rows not strided) rather than ``PhaseBand``."""
    return node.outputs[0].shape[3] % o.conv_direct_nr != 0 and geo.strides[0] == 1


def direct_conv_refusal(o, node, geo, group: int, weights, out_dtype) -> str | None:
    """Why the direct kernel does not take this convolution (None: it does). Legal: 2-D, constant float32
    weights, the output width a multiple of NR or the rows not strided (``ShiftedBand``). Profitable: K
    (input channels per group x taps) at most ``conv_direct_max_k``, ``conv_direct_one_panel_max_k`` where
    an output row is one panel (``CodegenOptions``); a width NR does not divide only with groups
    (``conv_direct_grouped``: measured on grouped layers of few channels per group). With one group the
    windows GEMM stays: mobilenet_v1_025_96's 1x1 layers at 6x6 took 1.30-1.38x its time over a band split
    by kernel column, at 12x12 0.90-0.98x (1 thread, kernel CPU time, 40 interleaved runs)."""
    x = node.input(0)
    if len(x.shape) != 4 or weights is None or out_dtype != np.float32:
        return "not a 2-D float32 convolution with constant weights"
    if not o.conv_direct_max_k:
        return "off (conv_direct_max_k = 0)"
    if group != 1 and not o.conv_direct_grouped:
        return "grouped (conv_direct_grouped off)"
    if group != 1 and node.outputs[0].shape[1] // group < GROUPED_MIN_CHANNELS:
        return (f"{node.outputs[0].shape[1] // group} output channels per group < {GROUPED_MIN_CHANNELS} "
                f"(the block's rows would be mostly padding)")
    OW = node.outputs[0].shape[3]
    if OW % o.conv_direct_nr and (group == 1 or geo.strides[0] != 1):
        why = "" if group == 1 else " and the rows are strided"
        return f"output width {OW} is not a multiple of {o.conv_direct_nr} positions{why}"
    K = x.shape[1] // group * math.prod(geo.kernel)
    if K > o.conv_direct_max_k:
        return f"K = {K} > conv_direct_max_k = {o.conv_direct_max_k}"
    if OW == o.conv_direct_nr and K > o.conv_direct_one_panel_max_k:
        return f"one panel a row and K = {K} > conv_direct_one_panel_max_k = {o.conv_direct_one_panel_max_k}"
    return None


def _image_group(b: str, group: int, cg: int, c: str) -> tuple[str, str]:
    """(image, input channel) of channel ``c`` of batch ``b``'s group (``b`` = image * G + group)."""
    if group == 1:
        return b, c
    return f"({b} / {group})", add(mul(f"({b} % {group})", cg), c)


class PhaseBand(ColAccess):
    """B of the direct kernel (see the module docstring): the tile's input rows, zero-padded and
    split by column phase, in scratch; ``ptr(b, k, n)`` is output position ``n``'s window origin."""

    def __init__(self, kc, ev, node, geo, group: int = 1):
        self.kc, self.ev, self.node, self.geo, self.group = kc, ev, node, geo, group
        self.x = node.input(0)
        _, C, H, W = self.x.shape
        self.cg = C // group
        OW = node.outputs[0].shape[3]
        KW = geo.kernel[1]
        SW, DW, PL = geo.strides[1], geo.dilations[1], geo.pads_begin[1]
        padded_width = max(W + PL + geo.pads_end[1], (OW - 1) * SW + (KW - 1) * DW + 1)
        self.phase_len = -(-padded_width // SW)
        self.rows = 0
        self.offset = 0
        self.base = ""
        self.first_row = ""
        # The offsets depend on the band's rows, known once the blocking is (``prepare``).
        super().__init__(self._ptr, 0, np.zeros(self.cg * math.prod(geo.kernel), dtype=np.int64))

    def _offsets(self) -> np.ndarray:
        """``koff``: each (channel, tap) pair's offset from its window's origin in the band."""
        KH, KW = self.geo.kernel
        SW = self.geo.strides[1]
        DH, DW = self.geo.dilations
        C = self.cg
        Wq, R = self.phase_len, self.rows
        c, kh, kw = np.meshgrid(np.arange(C), np.arange(KH), np.arange(KW), indexing="ij")
        off = ((c * R + kh * DH) * SW + (kw * DW) % SW) * Wq + (kw * DW) // SW
        return off.reshape(-1).astype(np.int64)

    def prepare(self, kc, NC: int) -> None:
        self.rows = band_rows(self.node, self.geo, NC)
        self.koff = self._offsets()
        SW = self.geo.strides[1]
        self.offset = kc.scratch(self.cg * self.rows * SW * self.phase_len * 4)

    def per_tile(self, kc, ev, b: str, n0: str, nc: str) -> None:
        w = kc.w
        _, _, H, W = self.x.shape
        C = self.cg
        OW = self.node.outputs[0].shape[3]
        SH, SW = self.geo.strides
        PT, PL = self.geo.pads_begin
        Wq, R = self.phase_len, self.rows
        self.base = kc.tmp("band")
        self.first_row = kc.tmp("oh0")
        nrows, c, r, ih, dst, jj = (kc.tmp(n) for n in ("nrows", "c", "r", "ih", "dst", "jj"))
        w.line(f"float* restrict {self.base} = {kc.scratch_ptr('float', self.offset)};")
        w.line(f"const long {self.first_row} = {n0} / {OW};")
        w.line(f"const long {nrows} = (({n0} + {nc} - 1) / {OW} - {self.first_row}) * {SH} + "
               f"{(self.geo.kernel[0] - 1) * self.geo.dilations[0] + 1};")
        with w.block(f"for (long {c} = 0; {c} < {C}; ++{c})"):
            with w.block(f"for (long {r} = 0; {r} < {nrows}; ++{r})"):
                w.line(f"const long {ih} = {self.first_row} * {SH} + {r} - {PT};")
                w.line(f"float* restrict {dst} = {self.base} + ({c} * {R} + {r}) * {SW * Wq};")
                with w.block(f"if ((unsigned long){ih} >= {H}ul)"):
                    w.line(f"memset({dst}, 0, sizeof(float) * {SW * Wq});")
                    w.line("continue;")
                for ph in range(SW):
                    # Phase ph holds padded columns j = jj * SW + ph, input column iw = j - PL:
                    # in the input for jj in [lo, hi), zero elsewhere.
                    lo = max(0, -(-(PL - ph) // SW))
                    hi = max(lo, min(Wq, -(-(W + PL - ph) // SW)))
                    row = f"({dst} + {ph * Wq})" if ph else dst
                    if lo:
                        w.line(f"memset({row}, 0, sizeof(float) * {lo});")
                    if hi > lo:
                        with w.block(f"for (long {jj} = {lo}; {jj} < {hi}; ++{jj})"), ev.scope():
                            iw = add(mul(jj, SW), str(ph - PL))
                            idx = Index(self.x.shape, (*_image_group(b, self.group, C, c), ih, iw))
                            w.line(f"{row}[{jj}] = {ev.at(self.x, idx)};")
                    if Wq > hi:
                        w.line(f"memset({row} + {hi}, 0, sizeof(float) * {Wq - hi});")

    def _ptr(self, b: str, k: str, n: str) -> str:
        OW = self.node.outputs[0].shape[3]
        SH, SW = self.geo.strides
        return f"{self.base} + (({n}) / {OW} - {self.first_row}) * {SH * SW * self.phase_len} + ({n}) % {OW}"

    def split_ldb(self, b: str, n: str) -> str:
        """From the panel at ``n`` to its second piece (``split`` positions on): ``split`` floats in the
        same output row, else the next row's start in the band (a row's pieces are whole: ``split``
        divides the output width)."""
        OW = self.node.outputs[0].shape[3]
        SH, SW = self.geo.strides
        step = SH * SW * self.phase_len - OW + self.split
        return f"((({n}) + {self.split}) % {OW} == 0 ? {step} : {self.split})"


class ShiftedBand(ColAccess):
    """B of the direct kernel where panels cross output rows (see the module docstring): per tile, plane
    ``(c, kw)`` of scratch holds the input rows the tile reads, row ``r`` input row ``oh0 * SH + r - PT``,
    ``OW`` floats wide, column ``ow`` input column ``ow * SW + kw * DW - PL``, zero where that is padding.
    With the rows not strided (SH = 1), position ``n``'s (c, kh, kw) element is ``koff[k] + n - oh0 * OW``
    floats past the band's start, whatever row ``n`` is in. A part last panel reads up to NR - 1 floats
    past the last plane: the band has that many more, zeroed per tile."""

    def __init__(self, kc, ev, node, geo, group: int, nr: int):
        self.kc, self.ev, self.node, self.geo, self.group, self.nr = kc, ev, node, geo, group, nr
        self.x = node.input(0)
        self.cg = self.x.shape[1] // group
        assert geo.strides[0] == 1, "panels cross output rows only where the rows are not strided"
        self.rows = 0
        self.offset = 0
        self.base = ""
        self.first_row = ""
        super().__init__(self._ptr, 0, np.zeros(self.cg * math.prod(geo.kernel), dtype=np.int64))

    def _offsets(self) -> np.ndarray:
        KH, KW = self.geo.kernel
        DH = self.geo.dilations[0]
        OW = self.node.outputs[0].shape[3]
        c, kh, kw = np.meshgrid(np.arange(self.cg), np.arange(KH), np.arange(KW), indexing="ij")
        return (((c * KW + kw) * self.rows + kh * DH) * OW).reshape(-1).astype(np.int64)

    def _floats(self) -> int:
        return self.cg * self.geo.kernel[1] * self.rows * self.node.outputs[0].shape[3]

    def prepare(self, kc, NC: int) -> None:
        self.rows = band_rows(self.node, self.geo, NC)
        self.koff = self._offsets()
        self.offset = kc.scratch((self._floats() + self.nr) * 4)

    def per_tile(self, kc, ev, b: str, n0: str, nc: str) -> None:
        w = kc.w
        _, _, H, W = self.x.shape
        OW = self.node.outputs[0].shape[3]
        KH, KW = self.geo.kernel
        SW = self.geo.strides[1]
        DH, DW = self.geo.dilations
        PT, PL = self.geo.pads_begin
        R = self.rows
        self.base = kc.tmp("band")
        self.first_row = kc.tmp("oh0")
        nrows, c, r, ih, dst, ow = (kc.tmp(n) for n in ("nrows", "c", "r", "ih", "dst", "ow"))
        copy = SW == 1 and in_memory(ev, self.x)  # each plane's row a run of the input row
        w.line(f"float* restrict {self.base} = {kc.scratch_ptr('float', self.offset)};")
        w.line(f"const long {self.first_row} = {n0} / {OW};")
        w.line(f"const long {nrows} = ({n0} + {nc} - 1) / {OW} - {self.first_row} + {(KH - 1) * DH + 1};")
        w.line(f"memset({self.base} + {self._floats()}, 0, sizeof(float) * {self.nr});")
        with w.block(f"for (long {c} = 0; {c} < {self.cg}; ++{c})"):
            with w.block(f"for (long {r} = 0; {r} < {nrows}; ++{r})"):
                w.line(f"const long {ih} = {self.first_row} + {r} - {PT};")
                w.line(f"float* restrict {dst} = {self.base} + ({c} * {KW * R} + {r}) * {OW};")
                with w.block(f"if ((unsigned long){ih} >= {H}ul)"):
                    for kw in range(KW):
                        w.line(f"memset({dst} + {kw * R * OW}, 0, sizeof(float) * {OW});")
                    w.line("continue;")
                for kw in range(KW):
                    # Column ow reads input column ow * SW + kw * DW - PL: in the input for ow in [lo, hi).
                    shift = kw * DW - PL
                    lo = min(OW, max(0, -(shift // SW)))
                    hi = max(lo, min(OW, (W - 1 - shift) // SW + 1 if W - 1 - shift >= 0 else 0))
                    row = f"({dst} + {kw * R * OW})" if kw else dst
                    if lo:
                        w.line(f"memset({row}, 0, sizeof(float) * {lo});")
                    if hi > lo and copy:  # a constant-size memcpy: gcc moves it in vector registers
                        idx = Index(self.x.shape, (*_image_group(b, self.group, self.cg, c), ih, str(lo + shift)))
                        w.line(f"memcpy({row} + {lo}, {kc.ptr(self.x)} + {idx.offset()}, sizeof(float) * {hi - lo});")
                    elif hi > lo:
                        with w.block(f"for (long {ow} = {lo}; {ow} < {hi}; ++{ow})"), ev.scope():
                            iw = add(mul(ow, SW), str(shift))
                            idx = Index(self.x.shape, (*_image_group(b, self.group, self.cg, c), ih, iw))
                            w.line(f"{row}[{ow}] = {ev.at(self.x, idx)};")
                    if OW > hi:
                        w.line(f"memset({row} + {hi}, 0, sizeof(float) * {OW - hi});")

    def _ptr(self, b: str, k: str, n: str) -> str:
        OW = self.node.outputs[0].shape[3]
        return f"{self.base} + ({n}) - {self.first_row} * {OW}"


def direct_problem(kc, ev, node, geo, weights: np.ndarray, finish_bias, group: int = 1) -> GemmProblem:
    """The convolution as (channels x K) @ (K x positions) per image and group, B read from the band."""
    x, out = node.input(0), node.outputs[0]
    nimg = x.shape[0]
    OC = out.shape[1]
    G = group
    mg = OC // G
    out_sp = out.shape[2:]
    P = math.prod(out_sp)
    K = weights.size // OC
    o = kc.program.options

    def oc_of(b: str, m: str) -> str:
        return add(mul(f"({b} % {G})", mg), m) if G > 1 else m

    def out_index(b, m, n):
        dims = (f"({b} / {G})" if G > 1 else b, oc_of(b, m)) + tuple(delinearize(n, out_sp))
        return Index(out.shape, dims, ((2, 4, n),))

    def no_load(ev, b, r, c):  # A is packed at build time, B read from the band
        raise AssertionError("the direct convolution GEMM has no loaded operand")

    a_op = Operand(no_load, static=weights.astype(np.float32).reshape(G, mg, K),
                   batch_expr=(lambda b: f"({b} % {G})") if G > 1 else (lambda b: "0"))
    crossing = row_crossing(node, geo, o)
    # The wide block where its panels are whole: across rows (``ShiftedBand``: a part last panel is read
    # from the band's zeroed tail), else rows a multiple of its width, or an even count of pieces (two of
    # ``conv_direct_nr`` positions, in one row each).
    OW = out_sp[1]
    wide_nr = o.conv_direct_nr * o.conv_direct_vectors
    wide = wide_direct_block(o) and (crossing or OW % wide_nr == 0 or P % wide_nr == 0)
    mr, nr = direct_block(o, mg, least_padding=G > 1, wide=wide)
    band = ShiftedBand(kc, ev, node, geo, G, nr) if crossing else PhaseBand(kc, ev, node, geo, G)
    if not crossing and OW % nr:
        assert nr == 2 * o.conv_direct_nr, (nr, o.conv_direct_nr)
        band.split = o.conv_direct_nr
    b_op = Operand(no_load, cols=band)
    # The C tile (all the channels x NC positions) within ``conv_direct_tile_floats``: it stays in L1
    # between the micro-kernel's stores and the epilogue's loads. Whole output rows where one fits
    # (the band's rows then overlap the next tile's only by the window's extra rows).
    nc = max(nr, o.conv_direct_tile_floats // (-(-mg // mr) * mr) // nr * nr)
    if nc >= OW:
        nc = nc // OW * OW
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    # ``finish_bias`` (conv.py's bias term) takes a group's channel m and finds its output channel itself.
    return GemmProblem(node.name, nimg * G, mg, P, K, a_op, b_op, out, out_index, finish_bias=finish_bias,
                       dtype=out.dtype, register_block=(mr, nr), nc=nc, store_ld=P, row_bias=bias, bias_index=oc_of)
