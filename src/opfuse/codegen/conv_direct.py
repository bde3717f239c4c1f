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

An NR-wide panel must not cross an output row, so the output width must be a multiple of NR
(``direct_block``); legality and profitability are ``direct_conv_refusal``.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.codegen.conv_windows import band_rows
from opfuse.codegen.gemm import ColAccess, GemmProblem, Operand
from opfuse.codegen.index import Index, add, delinearize, mul
from opfuse.codegen.microkernel import fits_avx2, fits_avx512


def direct_block(o, channels: int) -> tuple[int, int]:
    """MR x NR of the direct kernel: NR = ``conv_direct_nr`` positions (one zmm, or two ymm), and
    MR output channels: with the AVX-512 body, up to ``conv_direct_mr`` accumulators (fewer where the
    layer has fewer channels, but at least enough rows to hide the FMA latency); else the AVX2
    block's rows for that NR (6 x 16: 12 ymm)."""
    nr = o.conv_direct_nr
    if o.simd == "auto" and o.vector_isa == "avx512" and fits_avx512(o.conv_direct_mr, nr):
        rounded = -(-channels // 2) * 2
        mr = max(8, min(o.conv_direct_mr, rounded))
        while not fits_avx512(mr, nr):
            mr -= 1
        return mr, nr
    mr = max((r for r in range(1, 13) if fits_avx2(r, nr)), default=4)
    return mr, nr


def direct_conv_refusal(o, node, geo, group: int, weights, out_dtype) -> str | None:
    """Why the direct kernel does not take this convolution (None: it does). Legal: 2-D, one group,
    constant float32 weights, the output width a multiple of NR. Profitable: K (input channels x
    taps) at most ``conv_direct_max_k``, ``conv_direct_one_panel_max_k`` where an output row is one
    panel (``CodegenOptions``)."""
    x = node.input(0)
    if len(x.shape) != 4 or weights is None or out_dtype != np.float32:
        return "not a 2-D float32 convolution with constant weights"
    if group != 1:
        return "grouped"
    if not o.conv_direct_max_k:
        return "off (conv_direct_max_k = 0)"
    OW = node.outputs[0].shape[3]
    if OW % o.conv_direct_nr:
        return f"output width {OW} is not a multiple of {o.conv_direct_nr} positions"
    K = x.shape[1] * math.prod(geo.kernel)
    if K > o.conv_direct_max_k:
        return f"K = {K} > conv_direct_max_k = {o.conv_direct_max_k}"
    if OW == o.conv_direct_nr and K > o.conv_direct_one_panel_max_k:
        return f"one panel a row and K = {K} > conv_direct_one_panel_max_k = {o.conv_direct_one_panel_max_k}"
    return None


class PhaseBand(ColAccess):
    """B of the direct kernel (see the module docstring): the tile's input rows, zero-padded and
    split by column phase, in scratch; ``ptr(b, k, n)`` is output position ``n``'s window origin."""

    def __init__(self, kc, ev, node, geo):
        self.kc, self.ev, self.node, self.geo = kc, ev, node, geo
        self.x = node.input(0)
        _, C, H, W = self.x.shape
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
        super().__init__(self._ptr, 0, np.zeros(C * math.prod(geo.kernel), dtype=np.int64))

    def _offsets(self) -> np.ndarray:
        """``koff``: each (channel, tap) pair's offset from its window's origin in the band."""
        KH, KW = self.geo.kernel
        SW = self.geo.strides[1]
        DH, DW = self.geo.dilations
        C = self.x.shape[1]
        Wq, R = self.phase_len, self.rows
        c, kh, kw = np.meshgrid(np.arange(C), np.arange(KH), np.arange(KW), indexing="ij")
        off = ((c * R + kh * DH) * SW + (kw * DW) % SW) * Wq + (kw * DW) // SW
        return off.reshape(-1).astype(np.int64)

    def prepare(self, kc, NC: int) -> None:
        self.rows = band_rows(self.node, self.geo, NC)
        self.koff = self._offsets()
        SW = self.geo.strides[1]
        self.offset = kc.scratch(self.x.shape[1] * self.rows * SW * self.phase_len * 4)

    def per_tile(self, kc, ev, b: str, n0: str, nc: str) -> None:
        w = kc.w
        _, C, H, W = self.x.shape
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
                            idx = Index(self.x.shape, (b, c, ih, iw))
                            w.line(f"{row}[{jj}] = {ev.at(self.x, idx)};")
                    if Wq > hi:
                        w.line(f"memset({row} + {hi}, 0, sizeof(float) * {Wq - hi});")

    def _ptr(self, b: str, k: str, n: str) -> str:
        OW = self.node.outputs[0].shape[3]
        SH, SW = self.geo.strides
        return f"{self.base} + (({n}) / {OW} - {self.first_row}) * {SH * SW * self.phase_len} + ({n}) % {OW}"


def direct_problem(kc, ev, node, geo, weights: np.ndarray, finish) -> GemmProblem:
    """The convolution as (channels x K) @ (K x positions) per image, B read from the band."""
    x, out = node.input(0), node.outputs[0]
    nimg, C = x.shape[:2]
    OC = out.shape[1]
    out_sp = out.shape[2:]
    P = math.prod(out_sp)
    K = C * math.prod(geo.kernel)
    o = kc.program.options

    def out_index(b, m, n):
        dims = (b, m) + tuple(delinearize(n, out_sp))
        return Index(out.shape, dims, ((2, 4, n),))

    def no_load(ev, b, r, c):  # A is packed at build time, B read from the band
        raise AssertionError("the direct convolution GEMM has no loaded operand")

    a_op = Operand(no_load, static=weights.astype(np.float32).reshape(1, OC, K))
    b_op = Operand(no_load, cols=PhaseBand(kc, ev, node, geo))
    mr, nr = direct_block(o, OC)
    # The C tile (all the channels x NC positions) within ``conv_direct_tile_floats``: it stays in L1
    # between the micro-kernel's stores and the epilogue's loads. Whole output rows where one fits
    # (the band's rows then overlap the next tile's only by the window's extra rows).
    OW = out_sp[1]
    nc = max(nr, o.conv_direct_tile_floats // (-(-OC // mr) * mr) // nr * nr)
    if nc >= OW:
        nc = nc // OW * OW
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return GemmProblem(node.name, nimg, OC, P, K, a_op, b_op, out, out_index, finish, dtype=out.dtype,
                       register_block=(mr, nr), nc=nc, store_ld=P, row_bias=bias)

