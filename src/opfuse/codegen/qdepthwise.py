"""Integer depthwise convolution of 8-bit activations over a window of int16 rows (portable C, SMLAD on the M7).

A depthwise Conv (one input and one output channel per group) of a quantized model reads the centred
activations ``x = int32(x_q) - x_zp`` (``rules/quantized.py``'s prologue) and constant centred weights
of int16 range. In NCHW a channel is one plane, so the kernel works plane by plane (image x channel):

1. the channel's taps are loaded once into locals: with stride-1 columns (``DW == 1``) the taps
   ``(kh, kw), (kh, kw + 1)`` as one word of two int16 (packed at build time), the last tap of an odd
   row on its own;
2. the input rows the current output row needs are converted (the prologue, once per input element)
   into a ring of int16 rows of the padded width (a power of two at least ``(KH - 1) * DH + 1`` of
   them, so a row's slot is ``ih & (slots - 1)``), zero in the padding columns (the centred padding
   value, as in the unfused graph); a row wholly in the vertical padding reads a constant zero row.
   Each input row is converted once however many output rows read it;
3. ``CodegenOptions.int8_depthwise_outputs_per_pass`` outputs of the row at a time are ``KH`` short
   dot products each, read straight from the rows at ``ow * SW``: a pair of taps is one unaligned
   32-bit load and one ``SMLAD`` on the Arm DSP extension (two int16 multiply-accumulates; plain C
   elsewhere, exact either way), a single tap one load and a multiply-accumulate; each tap word is
   read once per pass;
4. each accumulator goes to the fused epilogue (bias, ``Requantize``, activation clamp) with the
   channel fixed for the whole plane, so the per-channel constants are loop invariants of the
   output loop (the compiler hoists them).

This replaces the generic path (``qconv.py``: an int16 column gathered per output, then a dot product
of ``KH * KW`` taps: about 20 instructions per MAC on the emulated M7). CMSIS-NN's
``arm_depthwise_conv_s8_opt`` works in NHWC, four channels at a time with ``SXTB16``; TinyEngine's
depthwise kernels transpose to a channel-major padded buffer first. In opfuse's NCHW layout a channel
plane is contiguous already, so the window of rows is this kernel's buffer.
"""
from __future__ import annotations

import numpy as np

from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index, add, mul
from opfuse.codegen.stages import Stage
from opfuse.ir.graph import Node
from opfuse.ops.nn import conv_geometry

MAC2_HELPER = "opfuse_mac2_s16"
MAC2_C = """
#if defined(__ARM_FEATURE_DSP) && defined(__ARMEL__)
#include <arm_acle.h>
#endif
/* acc + p[0] * lo16(w) + p[1] * hi16(w), int16 values, exact in int32: one unaligned 32-bit load and one
   SMLAD with the Arm DSP extension (little-endian), plain C elsewhere. */
static inline int32_t opfuse_mac2_s16(const int16_t* p, uint32_t w, int32_t acc) {
#if defined(__ARM_FEATURE_DSP) && defined(__ARMEL__)
  uint32_t v;
  memcpy(&v, p, 4);
  return __smlad(v, w, acc);
#else
  const int32_t w0 = (int32_t)(int16_t)(uint16_t)(w & 0xffffu), w1 = (int32_t)(int16_t)(uint16_t)(w >> 16);
  return acc + (int32_t)p[0] * w0 + (int32_t)p[1] * w1;
#endif
}
"""


def int8_depthwise_applies(node: Node) -> bool:
    """A 2-D Conv with one input and one output channel per group (``int8_conv_applies`` holds)."""
    x, out = node.input(0), node.outputs[0]
    if len(x.shape) != 4:
        return False
    _, G = conv_geometry(node)
    return G > 1 and x.shape[1] == G and out.shape[1] == G


def _taps(KH: int, KW: int, DW: int) -> list[list[tuple[int, int]]]:
    """Per kernel row, ``(kw, n)``: ``n`` adjacent taps from column ``kw`` (2: one packed pair)."""
    rows = []
    for _ in range(KH):
        row, kw = [], 0
        while kw < KW:
            n = 2 if DW == 1 and kw + 1 < KW else 1
            row.append((kw, n))
            kw += n
        rows.append(row)
    return rows


def _packed_taps(w: np.ndarray, taps: list[list[tuple[int, int]]]) -> np.ndarray:
    """One int32 word per tap group of each channel: a pair as ``lo16 = w[kw]``, ``hi16 = w[kw + 1]``
    (the int16 pair's memory order on a little-endian machine), a single tap as its value."""
    C = w.shape[0]
    words = []
    for kh, row in enumerate(taps):
        for kw, n in row:
            if n == 2:
                lo = w[:, 0, kh, kw].astype(np.int64) & 0xFFFF
                hi = w[:, 0, kh, kw + 1].astype(np.int64) & 0xFFFF
                words.append(((hi << 16) | lo).astype(np.uint32).view(np.int32))
            else:
                words.append(w[:, 0, kh, kw].astype(np.int32))
    return np.stack(words, axis=1).reshape(C, len(words))


def lower_int8_depthwise(kc, ev, stage: Stage, bias_term) -> None:
    node = stage.anchor_node
    geo, _ = conv_geometry(node)
    x, wt = node.input(0), node.input(1)
    out = node.outputs[0]
    N, C, H, W = x.shape
    OH, OW = out.shape[2], out.shape[3]
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
    taps = _taps(KH, KW, DW)
    words = _packed_taps(ev.static[id(wt)], taps)
    T = words.shape[1]
    wq = kc.const_array(("int8_dw", node.name), words, f"{wt.name}_taps", np.int32)
    span = (KH - 1) * DH + 1  # input rows under one output row: the ring's rows
    Wp = (OW - 1) * SW + (KW - 1) * DW + 1  # padded row width the outputs read
    Wd = max(0, min(W, Wp - PL))  # input columns that land in it
    kc.note(lambda name: f"int8 depthwise '{name}': a window of {span} int16 rows of {Wp}, "
                         f"{sum(n == 2 for r in taps for _, n in r)} tap pairs (SMLAD with the DSP extension) "
                         f"and {sum(n == 1 for r in taps for _, n in r)} single taps per output", node)
    kc.program.require_helper(MAC2_HELPER, MAC2_C)
    slots = 1 << (span - 1).bit_length()  # ring rows: a power of two, so a row's slot is ih & (slots - 1)
    ring_off = kc.scratch(slots * Wp * 2)
    w = kc.w
    zero = kc.tmp("zero")  # a row wholly in the vertical padding: constant (flash on a microcontroller)
    w.line(f"static const int16_t {zero}[{Wp}] = {{0}};")
    kc.parallel_for(N * C * OH * OW * KH * KW)
    b = kc.tmp("b")
    with w.block(f"for (long {b} = 0; {b} < {N * C}; ++{b})"):
        img, c = (f"({b} / {C})", f"({b} % {C})") if N > 1 else ("0", b)
        ring, nxt = kc.tmp("ring"), kc.tmp("next")
        w.line(f"int16_t* restrict {ring} = {kc.scratch_ptr('int16_t', ring_off)};")
        wv = [kc.tmp("wv") for _ in range(T)]
        for j, name in enumerate(wv):
            w.line(f"const uint32_t {name} = (uint32_t){wq}[{add(mul(c, T), str(j))}];")
        w.line(f"long {nxt} = 0;")
        oh = kc.tmp("oh")
        with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"):
            ih0, end, ih = kc.tmp("ih0"), kc.tmp("end"), kc.tmp("ih")
            w.line(f"const long {ih0} = {add(mul(oh, SH), str(-PT))};")
            w.line(f"const long {end} = {ih0} + {span} < {H} ? {ih0} + {span} : {H};")
            start = f"({nxt} > {ih0} ? {nxt} : ({ih0} > 0 ? {ih0} : 0))"
            with w.block(f"for (long {ih} = {start}; {ih} < {end}; ++{ih})"):
                dst, iw = kc.tmp("dst"), kc.tmp("iw")
                w.line(f"int16_t* restrict {dst} = {ring} + ({ih} & {slots - 1}) * {Wp};")
                for i in [*range(PL), *range(PL + Wd, Wp)]:  # the padding columns
                    w.line(f"{dst}[{i}] = 0;")
                with w.block(f"for (long {iw} = 0; {iw} < {Wd}; ++{iw})"), ev.scope():
                    w.line(f"{dst}[{add(iw, str(PL))}] = (int16_t)({ev.at(x, Index(x.shape, (img, c, ih, iw)))});")
            w.line(f"if ({end} > {nxt}) {nxt} = {end};")
            rows = [kc.tmp("r") for _ in range(KH)]
            for kh, r in enumerate(rows):
                i = add(ih0, str(kh * DH))
                slot = f"{ring} + (({i}) & {slots - 1}) * {Wp}"
                w.line(f"const int16_t* {r} = (unsigned long)({i}) < {H}ul ? {slot} : {zero};")
            U = max(1, min(kc.program.options.int8_depthwise_outputs_per_pass, OW))
            ow = kc.tmp("ow")
            w.line(f"long {ow} = 0;")
            if U > 1:
                with w.block(f"for (; {ow} + {U} <= {OW}; {ow} += {U})"):
                    _outputs(kc, ev, stage, bias_term, (img, c, oh, ow), U, (rows, taps, wv, SW, DW))
            if U == 1 or OW % U:
                with w.block(f"for (; {ow} < {OW}; ++{ow})"):
                    _outputs(kc, ev, stage, bias_term, (img, c, oh, ow), 1, (rows, taps, wv, SW, DW))


def _outputs(kc, ev, stage: Stage, bias_term, where: tuple, U: int, dims: tuple) -> None:
    """Outputs ``ow .. ow + U - 1`` of one output row: their dot products interleaved (each channel tap,
    loaded once per pass, feeds all ``U``; a load two outputs share is one load), then their epilogues."""
    img, c, oh, ow = where
    rows, taps, wv, SW, DW = dims
    node = stage.anchor_node
    out = node.outputs[0]
    w = kc.w
    o = kc.tmp("o")
    w.line(f"const long {o} = {mul(ow, SW)};")
    accs = [kc.tmp("acc") for _ in range(U)]
    w.line("int32_t " + ", ".join(f"{a} = 0" for a in accs) + ";")
    j = 0
    for kh, row in enumerate(taps):
        for kw, n in row:
            for u, acc in enumerate(accs):
                at = f"{rows[kh]} + {add(o, str(u * SW + kw * DW))}"
                if n == 2:
                    w.line(f"{acc} = opfuse_mac2_s16({at}, {wv[j]}, {acc});")
                else:
                    w.line(f"{acc} += (int32_t)*({at}) * (int32_t){wv[j]};")
            j += 1
    for u, acc in enumerate(accs):
        with ev.scope():
            y = kc.tmp("y")
            w.line(f"const int32_t {y} = {bias_term(ev, node, acc, c)};")
            finish_element(kc, ev, stage, out, Index(out.shape, (img, c, oh, add(ow, str(u)))), y)
