"""Integer convolution of 8-bit activations: int16 columns, int16 weights, int32 dot products.

The Conv of a quantized model reads ``x = int32(x_q) - x_zp`` (its dequantizing prologue,
``rules/quantized.py``) and constant centred weights ``w = int32(w_q) - w_zp``: both fit int16
(|x|, |w| <= 255). Per image, group and output position the kernel

1. gathers the window into an int16 column ``col[k]``, ``k = (c, kh, kw)`` of the group's
   ``K = C/G * KH * KW`` inputs (zero where the window lies in the padding: the centred value of
   the padding, as in the unfused graph), padded to an even length ``Kp``; a window wholly inside
   the input gathers the 8-bit values themselves and ``x_zp * sum_k w[m, k]`` comes off the dot
   product instead (``sum w (q - zp) = sum w q - zp sum w``), one subtraction per output rather
   than one per tap;
2. for each output channel ``m`` of the group takes ``acc = sum_k w16[m, k] * col[k]`` over the
   weights packed at build time as int16 rows of ``Kp``, two output channels per pass so that
   each column word is loaded once for both; on the Cortex-M7 (``int8_conv_positions_per_pass`` /
   ``int8_conv_channels_per_pass``: 2 and 4 there) two positions' columns at a time against four
   channels whose weights are interleaved by tap pair (``opfuse_dot42_s16``: each column word feeds
   four SMLADs, each weight word two; an odd last position is computed twice, the same values);
3. hands ``acc`` (plus the bias) to the fused epilogue (bias Add, ``Requantize``, residual). The
   epilogue runs per element with the channel innermost, so nothing per channel is hoisted out of
   it: ``Requantize`` takes its cheap forms for shifts known at build time (``codegen/rules.py``),
   and a long dot product is called out of line beside it (``CodegenOptions.int8_dot_call_min_pairs``).

A depthwise conv (one input and one output channel per group) takes ``qdepthwise.py``'s window of rows
instead; an int8 MatMul ``qmatmul.py``, which reuses this module's dot products.

The dot product (``opfuse_dot2_s16``) is plain C99 that gcc vectorises on the host
(``vpmaddwd``); with the Arm DSP extension (``__ARM_FEATURE_DSP``: the Cortex-M7) each pair of
int16 products is one ``SMLAD`` (ACLE's ``__smlad``), CMSIS-NN's inner loop. Both are exact
integer arithmetic: the C equals the reference executor bit for bit.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index, add, mul
from opfuse.codegen.qdepthwise import int8_depthwise_applies, lower_int8_depthwise
from opfuse.codegen.stages import Stage
from opfuse.ir.graph import Node, Value
from opfuse.ops.nn import conv_geometry

EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
INT16_MAX = 32767
# Output channels per pass over the column: each column word loaded once feeds two SMLADs.
CHANNELS_PER_PASS = 2

DOT_HELPER = "opfuse_dot_s16"
DOT_C = """
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
#endif
/* acc0 = a0 . b, acc1 = a1 . b over 2 * pairs int16 values (exact in int32 for |a|, |b| <= 255
   and fewer than 2^15 pairs); on the Arm DSP extension two multiply-accumulates per SMLAD, two
   pairs per iteration. */
static inline void opfuse_dot2_s16(const int16_t* restrict a0, const int16_t* restrict a1,
                                   const int16_t* restrict b, long pairs, int32_t* acc0, int32_t* acc1) {
  int32_t s0 = 0, s1 = 0;
#if defined(__ARM_FEATURE_DSP)
  long i = 0;
  for (; i + 2 <= pairs; i += 2) {
    uint32_t x0, x1, x2, x3, y0, y1;
    memcpy(&y0, b + 2 * i, 4);
    memcpy(&y1, b + 2 * i + 2, 4);
    memcpy(&x0, a0 + 2 * i, 4);
    memcpy(&x1, a0 + 2 * i + 2, 4);
    memcpy(&x2, a1 + 2 * i, 4);
    memcpy(&x3, a1 + 2 * i + 2, 4);
    s0 = __smlad(x0, y0, s0);
    s0 = __smlad(x1, y1, s0);
    s1 = __smlad(x2, y0, s1);
    s1 = __smlad(x3, y1, s1);
  }
  if (i < pairs) {
    uint32_t x0, x2, y0;
    memcpy(&y0, b + 2 * i, 4);
    memcpy(&x0, a0 + 2 * i, 4);
    memcpy(&x2, a1 + 2 * i, 4);
    s0 = __smlad(x0, y0, s0);
    s1 = __smlad(x2, y0, s1);
  }
#else
  for (long i = 0; i < 2 * pairs; ++i) {
    s0 += (int32_t)a0[i] * b[i];
    s1 += (int32_t)a1[i] * b[i];
  }
#endif
  *acc0 = s0;
  *acc1 = s1;
}

/* a . b over 2 * pairs int16 values (one output channel: depthwise). */
static inline int32_t opfuse_dot_s16(const int16_t* restrict a, const int16_t* restrict b, long pairs) {
  int32_t s = 0;
#if defined(__ARM_FEATURE_DSP)
  for (long i = 0; i < pairs; ++i) {
    uint32_t x, y;
    memcpy(&x, a + 2 * i, 4);
    memcpy(&y, b + 2 * i, 4);
    s = __smlad(x, y, s);
  }
#else
  for (long i = 0; i < 2 * pairs; ++i) s += (int32_t)a[i] * b[i];
#endif
  return s;
}
"""


DOT22_HELPER = "opfuse_dot22_s16"
DOT22_C = """
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
#endif
/* Two output channels (weight rows a0, a1) at two positions (columns b0, b1) over 2 * pairs int16 values:
   acc = {a0 . b0, a1 . b0, a0 . b1, a1 . b1}, exact in int32. Each loaded word feeds two SMLADs on the
   Arm DSP extension: four loads per four SMLADs (opfuse_dot2_s16: six per four). */
static inline void opfuse_dot22_s16(const int16_t* restrict a0, const int16_t* restrict a1,
                                    const int16_t* restrict b0, const int16_t* restrict b1, long pairs,
                                    int32_t* restrict acc) {
  int32_t s00 = 0, s10 = 0, s01 = 0, s11 = 0;
#if defined(__ARM_FEATURE_DSP)
  for (long i = 0; i < pairs; ++i) {
    uint32_t x0, x1, y0, y1;
    memcpy(&x0, a0 + 2 * i, 4);
    memcpy(&x1, a1 + 2 * i, 4);
    memcpy(&y0, b0 + 2 * i, 4);
    memcpy(&y1, b1 + 2 * i, 4);
    s00 = __smlad(x0, y0, s00);
    s10 = __smlad(x1, y0, s10);
    s01 = __smlad(x0, y1, s01);
    s11 = __smlad(x1, y1, s11);
  }
#else
  for (long i = 0; i < 2 * pairs; ++i) {
    s00 += (int32_t)a0[i] * b0[i];
    s10 += (int32_t)a1[i] * b0[i];
    s01 += (int32_t)a0[i] * b1[i];
    s11 += (int32_t)a1[i] * b1[i];
  }
#endif
  acc[0] = s00;
  acc[1] = s10;
  acc[2] = s01;
  acc[3] = s11;
}
"""
DOT22_CALL_HELPER = "opfuse_dot22_s16_call"
DOT22_CALL_C = """
#ifndef OPFUSE_NOINLINE
#if defined(__GNUC__)
#define OPFUSE_NOINLINE __attribute__((noinline))
#else
#define OPFUSE_NOINLINE
#endif
#endif
/* opfuse_dot22_s16 out of line: its loop gets registers of its own (see codegen/qconv.py). */
OPFUSE_NOINLINE static void opfuse_dot22_s16_call(const int16_t* restrict a0, const int16_t* restrict a1,
                                                  const int16_t* restrict b0, const int16_t* restrict b1,
                                                  long pairs, int32_t* restrict acc) {
  opfuse_dot22_s16(a0, a1, b0, b1, pairs, acc);
}
"""


DOT42_HELPER = "opfuse_dot42_s16"
DOT42_C = """
#if defined(__ARM_FEATURE_DSP)
#include <arm_acle.h>
#endif
/* Four output channels at two positions (columns b0, b1) over 2 * pairs int16 values, the four channels'
   weights interleaved by tap pair (a[8 i + 2 j + t]: channel j, tap 2 i + t): acc[2 j + k] = channel j .
   column k, exact in int32. Per pair of taps two column words and four consecutive weight words feed
   eight SMLADs on the Arm DSP extension. */
static inline void opfuse_dot42_s16(const int16_t* restrict a, const int16_t* restrict b0,
                                    const int16_t* restrict b1, long pairs, int32_t* restrict acc) {
  int32_t s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
#if defined(__ARM_FEATURE_DSP)
  for (long i = 0; i < pairs; ++i) {
    uint32_t x0, x1, x2, x3, y0, y1;
    memcpy(&y0, b0 + 2 * i, 4);
    memcpy(&y1, b1 + 2 * i, 4);
    memcpy(&x0, a + 8 * i, 4);
    memcpy(&x1, a + 8 * i + 2, 4);
    memcpy(&x2, a + 8 * i + 4, 4);
    memcpy(&x3, a + 8 * i + 6, 4);
    s00 = __smlad(x0, y0, s00);
    s01 = __smlad(x0, y1, s01);
    s10 = __smlad(x1, y0, s10);
    s11 = __smlad(x1, y1, s11);
    s20 = __smlad(x2, y0, s20);
    s21 = __smlad(x2, y1, s21);
    s30 = __smlad(x3, y0, s30);
    s31 = __smlad(x3, y1, s31);
  }
#else
  for (long i = 0; i < pairs; ++i) {
    for (int t = 0; t < 2; ++t) {
      const int32_t y0 = b0[2 * i + t], y1 = b1[2 * i + t];
      s00 += (int32_t)a[8 * i + t] * y0;
      s01 += (int32_t)a[8 * i + t] * y1;
      s10 += (int32_t)a[8 * i + 2 + t] * y0;
      s11 += (int32_t)a[8 * i + 2 + t] * y1;
      s20 += (int32_t)a[8 * i + 4 + t] * y0;
      s21 += (int32_t)a[8 * i + 4 + t] * y1;
      s30 += (int32_t)a[8 * i + 6 + t] * y0;
      s31 += (int32_t)a[8 * i + 6 + t] * y1;
    }
  }
#endif
  acc[0] = s00; acc[1] = s01; acc[2] = s10; acc[3] = s11;
  acc[4] = s20; acc[5] = s21; acc[6] = s30; acc[7] = s31;
}
"""
DOT42_CALL_HELPER = "opfuse_dot42_s16_call"
DOT42_CALL_C = """
#ifndef OPFUSE_NOINLINE
#if defined(__GNUC__)
#define OPFUSE_NOINLINE __attribute__((noinline))
#else
#define OPFUSE_NOINLINE
#endif
#endif
/* opfuse_dot42_s16 out of line: its loop gets registers of its own (see codegen/qconv.py). */
OPFUSE_NOINLINE static void opfuse_dot42_s16_call(const int16_t* restrict a, const int16_t* restrict b0,
                                                  const int16_t* restrict b1, long pairs, int32_t* restrict acc) {
  opfuse_dot42_s16(a, b0, b1, pairs, acc);
}
"""


# Kernels with a fused epilogue call the dot product out of line when it is long enough
# (``CodegenOptions.int8_dot_call_min_pairs``): inlined beside the epilogue's live values (multiplier,
# shift, residual, zero-point correction), gcc spills in the SMLAD loop (emulated M7, resnet8: 3
# loads/stores more per 4 SMLADs); a bare Conv kernel keeps it inline, where the call would cost more
# than it saves (mobilenet's 1x1 convs of 8-64 channels).
DOT_CALL_HELPER = "opfuse_dot2_s16_call"
DOT_CALL_C = """
#ifndef OPFUSE_NOINLINE
#if defined(__GNUC__)
#define OPFUSE_NOINLINE __attribute__((noinline))
#else
#define OPFUSE_NOINLINE
#endif
#endif
/* opfuse_dot2_s16 out of line: its loop gets registers of its own (see codegen/qconv.py). */
OPFUSE_NOINLINE static void opfuse_dot2_s16_call(const int16_t* restrict a0, const int16_t* restrict a1,
                                                 const int16_t* restrict b, long pairs, int32_t* acc0,
                                                 int32_t* acc1) {
  opfuse_dot2_s16(a0, a1, b, pairs, acc0, acc1);
}
"""


def _is_8bit_centred(v: Value, static: dict) -> bool:
    """``v`` is ``int32(q)`` or ``int32(q) - zp`` of an 8-bit ``q`` with a constant scalar ``zp``
    of 8-bit range: every value lies in [-255, 255]."""
    n = v.producer
    if n is not None and n.op_type == "Sub":
        zp = static.get(id(n.input(1)))
        if zp is None or zp.size != 1 or not -255 <= int(zp.reshape(-1)[0]) <= 255:
            return False
        n = n.input(0).producer
    return n is not None and n.op_type == "Cast" and n.input(0).dtype in EIGHT_BIT


def int8_conv_applies(node: Node, static: dict) -> bool:
    """A 2-D Conv accumulating in int32 of 8-bit centred activations and constant weights of int16 range."""
    if node.op_type != "Conv" or node.outputs[0].dtype != np.int32 or len(node.outputs[0].shape) != 4:
        return False
    w = static.get(id(node.input(1)))
    if w is None or np.abs(w.astype(np.int64)).max(initial=0) > INT16_MAX:
        return False
    return _is_8bit_centred(node.input(0), static)


def _packed_weights(w: np.ndarray, K: int, Kp: int, OCp: int) -> np.ndarray:
    """int16 rows of ``Kp`` per output channel (zero past ``K``), ``OCp`` rows (zero past OC)."""
    out = np.zeros((OCp, Kp), np.int16)
    out[:w.shape[0], :K] = w.reshape(w.shape[0], K).astype(np.int16)
    return out


def _interleaved(packed: np.ndarray, Kp: int) -> np.ndarray:
    """Rows of ``Kp`` int16 in blocks of 4 (channels ``4q .. 4q + 3``) reordered to ``[q][pair][channel][2]``:
    the block keeps its place and size (``4 * Kp`` values from row ``4q``), its pairs run channel-minor."""
    return np.ascontiguousarray(packed.reshape(-1, 4, Kp // 2, 2).transpose(0, 2, 1, 3)).reshape(packed.shape)


def _inside(out_len: int, in_len: int, stride: int, span: int, pad: int) -> tuple[int, int]:
    """Output positions ``[lo, hi)`` whose whole window (``span + 1`` inputs from ``o * stride - pad``)
    lies inside the input."""
    lo = -(-pad // stride)
    hi = (in_len - 1 - span + pad) // stride + 1 if in_len - 1 - span + pad >= 0 else 0
    return min(lo, out_len), max(min(lo, out_len), min(hi, out_len))


def _raw_source(x: Value, ev) -> tuple[Value, int] | None:
    """``(q, zp)`` when ``x = int32(q) - zp`` is computed in this kernel (its prologue) with a nonzero
    constant ``zp``: windows inside the input then gather ``q`` itself and take ``zp * sum(w)`` off the
    dot product (the input offset folded out, as CMSIS-NN and TFLite do)."""
    sub = x.producer
    if sub is None or sub.op_type != "Sub" or id(sub) not in ev.inline:
        return None
    cast = sub.input(0).producer
    zp = ev.static.get(id(sub.input(1)))
    if cast is None or cast.op_type != "Cast" or id(cast) not in ev.inline or zp is None or zp.size != 1:
        return None
    z = int(zp.reshape(-1)[0])
    return (cast.input(0), z) if z else None


def _gather(kc, ev, x: Value, col: str, where: tuple, geo, G: int, checked: bool, raw: Value | None = None) -> None:
    """``col[(c * KH + kh) * KW + kw]`` = the (dequantized) input under the window at ``(oh, ow)``,
    0 in the padding (``checked``: test each tap; else the window is known to be inside, and ``raw``,
    when given, is gathered instead: the 8-bit tensor before its zero point is taken off)."""
    w = kc.w
    img, g, cg, oh, ow = where
    _, _, H, W = x.shape
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
    c, kh, kw, ih, iw = (kc.tmp(n) for n in ("c", "kh", "kw", "ih", "iw"))
    with w.block(f"for (long {c} = 0; {c} < {cg}; ++{c})"):
        ch = add(mul(g, cg), c) if G > 1 else c
        with w.block(f"for (long {kh} = 0; {kh} < {KH}; ++{kh})"):
            w.line(f"const long {ih} = {add(mul(oh, SH), mul(kh, DH), str(-PT))};")
            with w.block(f"for (long {kw} = 0; {kw} < {KW}; ++{kw})"), ev.scope():
                w.line(f"const long {iw} = {add(mul(ow, SW), mul(kw, DW), str(-PL))};")
                slot = f"{col}[({c} * {KH} + {kh}) * {KW} + {kw}]"
                if checked:
                    with w.block(f"if ((unsigned long){ih} < {H}ul && (unsigned long){iw} < {W}ul)"), ev.scope():
                        w.line(f"{slot} = (int16_t)({ev.at(x, Index(x.shape, (img, ch, ih, iw)))});")
                    w.line(f"else {slot} = 0;")
                else:
                    src = raw if raw is not None else x
                    w.line(f"{slot} = (int16_t)({ev.at(src, Index(src.shape, (img, ch, ih, iw)))});")


def lower_int8_conv(kc, ev, stage: Stage, bias_term) -> None:
    node = stage.anchor_node
    if int8_depthwise_applies(node):  # one channel per group: a window of rows per plane (qdepthwise.py)
        return lower_int8_depthwise(kc, ev, stage, bias_term)
    geo, G = conv_geometry(node)
    x, wt = node.input(0), node.input(1)
    out = node.outputs[0]
    N, C, H, W = x.shape
    OC, OH, OW = out.shape[1], out.shape[2], out.shape[3]
    KH, KW = geo.kernel
    cg, mg = C // G, OC // G
    K = cg * KH * KW
    Kp = K + (K & 1)
    pairs = mg > 1 and OH * OW > 1 and kc.program.options.int8_conv_positions_per_pass >= 2
    per_pass = 1 if mg == 1 else (kc.program.options.int8_conv_channels_per_pass if pairs else CHANNELS_PER_PASS)
    mg_p = -(-mg // per_pass) * per_pass
    per_group = ev.static[id(wt)].reshape(G, mg, K)
    packed = np.concatenate([_packed_weights(per_group[g], K, Kp, mg_p) for g in range(G)])
    if per_pass == 4:  # opfuse_dot42_s16 reads each 4 channels' weights interleaved by tap pair
        packed = _interleaved(packed, Kp)
    wq = kc.const_array(("int8_conv", node.name), packed, f"{wt.name}_s16", np.int16)
    kc.note(lambda name: f"int8 conv '{name}': int16 columns of {Kp}, SMLAD with the DSP extension", node)
    kc.program.require_helper(DOT_HELPER, DOT_C)
    # Folding the zero point out costs a multiply-subtract per output and saves a subtraction per
    # gathered tap: worth it when each input is gathered more than once (a window of several taps).
    raw = _raw_source(x, ev) if KH * KW > 1 else None
    wsum = None
    if raw is not None:  # sum of each output channel's weights, for the zero point folded out
        wsum = kc.const_array(("int8_conv_wsum", node.name), per_group.reshape(OC, K).sum(axis=1).astype(np.int32),
                              f"{wt.name}_sum", np.int32)
    col_off = kc.scratch(Kp * 2 * (2 if pairs else 1))
    w = kc.w
    kc.parallel_for(N * G * OH * OW * mg * K, collapse=2)
    b, p = kc.tmp("b"), kc.tmp("p")
    P = OH * OW
    with w.block(f"for (long {b} = 0; {b} < {N * G}; ++{b})"):
        img, g = (f"({b} / {G})", f"({b} % {G})") if G > 1 else (b, "0")
        column = (x, geo, G, (H, W, OH, OW), raw, wsum, (img, g, cg))
        if pairs:
            # two positions per pass; with an odd count the last pass computes the last position twice (the
            # same values stored twice), so the loop stays one canonical loop for OpenMP's collapse
            with w.block(f"for (long {p} = 0; {p} < {(P + 1) // 2}; ++{p})"):
                p0, p1 = kc.tmp("p"), kc.tmp("p")
                w.line(f"const long {p0} = 2 * {p};")
                w.line(f"const long {p1} = {p0} + 1 < {P} ? {p0} + 1 : {p0};" if P % 2 else
                       f"const long {p1} = {p0} + 1;")
                c0, at0, corr0 = _column(kc, ev, column, col_off, p0)
                c1, at1, corr1 = _column(kc, ev, column, col_off + Kp * 2, p1)
                _channel_pairs2(kc, ev, stage, node, bias_term, (wq, (c0, c1), Kp, mg, mg_p, G, per_pass),
                                (img, g), (at0, at1), (corr0, corr1))
        else:
            with w.block(f"for (long {p} = 0; {p} < {P}; ++{p})"):
                col, (oh, ow), corrected = _column(kc, ev, column, col_off, p)
                if mg == 1:  # one output channel per group (not depthwise: several input channels each)
                    acc = kc.tmp("acc")
                    row = f"{wq} + {g} * {Kp}" if G > 1 else wq
                    oc = g if G > 1 else "0"
                    w.line(f"const int32_t {acc} = opfuse_dot_s16({row}, {col}, {Kp // 2});")
                    _finish(kc, ev, stage, node, bias_term, corrected(acc, oc), oc, (img, oh, ow))
                else:
                    _channel_pairs(kc, ev, stage, node, bias_term, (wq, col, Kp, mg, mg_p, G), (img, g, oh, ow),
                                   corrected)


def _column(kc, ev, column: tuple, off: int, p: str):
    """Gather the window of output position ``p`` into an int16 column at scratch offset ``off``:
    ``(column pointer, (oh, ow), corrected)``, ``corrected(acc, oc)`` the accumulator with the
    zero point's share taken off where the window gathered the raw 8-bit values."""
    x, geo, G, (H, W, OH, OW), raw, wsum, (img, g, cg) = column
    w = kc.w
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
    K = cg * KH * KW
    col = kc.tmp("col")
    w.line(f"int16_t* restrict {col} = {kc.scratch_ptr('int16_t', off)};")
    if K & 1:
        w.line(f"{col}[{K}] = 0;")
    oh, ow = kc.tmp("oh"), kc.tmp("ow")
    w.line(f"const long {oh} = {p} / {OW}, {ow} = {p} % {OW};")
    where = (img, g, cg, oh, ow)
    zc = None
    if raw is not None:
        zc = kc.tmp("zc")
        w.line(f"int32_t {zc} = {raw[1]};")
    if any(geo.pads_begin) or any(geo.pads_end):  # windows wholly inside the input gather without a test per tap
        (hlo, hhi), (wlo, whi) = (_inside(OH, H, SH, DH * (KH - 1), PT),
                                  _inside(OW, W, SW, DW * (KW - 1), PL))
        with w.block(f"if ({oh} >= {hlo} && {oh} < {hhi} && {ow} >= {wlo} && {ow} < {whi})"):
            _gather(kc, ev, x, col, where, geo, G, checked=False, raw=raw[0] if raw else None)
        with w.block("else"):
            _gather(kc, ev, x, col, where, geo, G, checked=True)
            if zc is not None:
                w.line(f"{zc} = 0;")
    else:
        _gather(kc, ev, x, col, where, geo, G, checked=False, raw=raw[0] if raw else None)

    def corrected(acc: str, oc: str) -> str:
        return acc if zc is None else f"({acc} - {zc} * {wsum}[{oc}])"
    return col, (oh, ow), corrected


def _channel_pairs2(kc, ev, stage: Stage, node: Node, bias_term, dims: tuple, where: tuple, at: tuple,
                    corrected: tuple) -> None:
    """``ch`` (2 or 4) output channels at two positions per pass over the columns (``opfuse_dot22_s16`` /
    ``opfuse_dot42_s16``)."""
    wq, (c0, c1), Kp, mg, mg_p, G, ch = dims
    img, g = where
    w = kc.w
    helper, text, call, call_text = ((DOT22_HELPER, DOT22_C, DOT22_CALL_HELPER, DOT22_CALL_C) if ch == 2 else
                                     (DOT42_HELPER, DOT42_C, DOT42_CALL_HELPER, DOT42_CALL_C))
    kc.program.require_helper(helper, text)
    dot = helper
    if stage.epilogue and Kp // 2 >= kc.program.options.int8_dot_call_min_pairs:
        dot = kc.program.require_helper(call, call_text)
    m = kc.tmp("m")
    with w.block(f"for (long {m} = 0; {m} < {mg_p}; {m} += {ch})"):
        acc = kc.tmp("acc")
        row = f"{wq} + ({mul(g, mg_p)} + {m}) * {Kp}" if G > 1 else f"{wq} + {m} * {Kp}"
        w.line(f"int32_t {acc}[{2 * ch}];")
        if ch == 2:
            w.line(f"{dot}({row}, {row} + {Kp}, {c0}, {c1}, {Kp // 2}, {acc});")
            order: tuple[tuple[int, int], ...] = ((0, 0), (1, 0), (0, 1), (1, 1))  # dot22's: channel, position
        else:
            w.line(f"{dot}({row}, {c0}, {c1}, {Kp // 2}, {acc});")
            order = tuple((j, pos) for j in range(ch) for pos in range(2))
        for k, (j, pos) in enumerate(order):
            mm = f"{m} + {j}" if j else m
            guard = f"if ({mm} < {mg})" if mg % ch and j else None
            with w.block(guard) if guard else nullcontext():
                oc = add(mul(g, mg), mm) if G > 1 else mm
                oh, ow = at[pos]
                _finish(kc, ev, stage, node, bias_term, corrected[pos](f"{acc}[{k}]", oc), oc, (img, oh, ow))


def _channel_pairs(kc, ev, stage: Stage, node: Node, bias_term, dims: tuple, where: tuple, corrected) -> None:
    """Two output channels per pass over the column (the last alone when their count is odd)."""
    wq, col, Kp, mg, mg_p, G = dims
    img, g, oh, ow = where
    w = kc.w
    m = kc.tmp("m")
    mg_2 = -(-mg // CHANNELS_PER_PASS) * CHANNELS_PER_PASS  # mg_p is the packed rows' stride (2 or 4 a pass)
    with w.block(f"for (long {m} = 0; {m} < {mg_2}; {m} += {CHANNELS_PER_PASS})"):
        a0, a1 = kc.tmp("acc"), kc.tmp("acc")
        row = f"{wq} + ({mul(g, mg_p)} + {m}) * {Kp}" if G > 1 else f"{wq} + {m} * {Kp}"
        w.line(f"int32_t {a0}, {a1};")
        dot = "opfuse_dot2_s16"
        if stage.epilogue and Kp // 2 >= kc.program.options.int8_dot_call_min_pairs:
            dot = kc.program.require_helper(DOT_CALL_HELPER, DOT_CALL_C)
        w.line(f"{dot}({row}, {row} + {Kp}, {col}, {Kp // 2}, &{a0}, &{a1});")
        for j, acc in enumerate((a0, a1)):
            mm = f"{m} + {j}" if j else m
            guard = f"if ({mm} < {mg})" if mg % CHANNELS_PER_PASS and j else None
            with w.block(guard) if guard else nullcontext():
                oc = add(mul(g, mg), mm) if G > 1 else mm
                _finish(kc, ev, stage, node, bias_term, corrected(acc, oc), oc, (img, oh, ow))


def _finish(kc, ev, stage: Stage, node: Node, bias_term, acc: str, oc: str, where: tuple) -> None:
    img, oh, ow = where
    out = node.outputs[0]
    with ev.scope():
        y = kc.tmp("y")
        kc.w.line(f"const int32_t {y} = {bias_term(ev, node, acc, oc)};")
        finish_element(kc, ev, stage, out, Index(out.shape, (img, oc, oh, ow)), y)
