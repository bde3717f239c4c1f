"""Integer convolution on the host: register-blocked integer GEMM and vectorised depthwise, with the
requantizing epilogue in vector registers.

The Cortex-M7 kernel (``qconv.py``) takes one dot product per output position and channel and finishes
each element in scalar code; on an x86 host that leaves the vector units idle. Where the target has
AVX2 (``#if defined(__AVX2__)``; ``CodegenOptions(simd="auto")``, platform "host") and the group is a
quantized model's ``Cast/Sub -> Conv -> [Add bias] -> Requantize [+ residual]``, this module emits instead:

1. **Word image.** Per image and group the 8-bit input is rewritten once into 32-bit words, laid out
   ``[channel word][padded row][column phase][column / stride]``, so that for every tap ``(kh, kw)`` the
   words of ``8 * NV`` consecutive output positions of one row are ``8 * NV`` consecutive words: the
   convolution is an implicit GEMM read in place, with no per-tile packing (a 1x1 stride-1 convolution
   without padding is one row of all positions). Two kinds of words:

   * **int16 pairs** (AVX2): ``(x[2c] - zp, x[2c+1] - zp)``, 0 in the padding (the padding's centred value, as
     in the unfused graph);
   * **u8 quads** (built for AVX-512, weights within int8, zero point an 8-bit value):
     4 channels' bytes as unsigned (int8 ``+ 128``), the unsigned zero point ``zu`` in the padding; as
     ``sum w (u - zu) = sum w u - zu sum w``, ``zu sum w`` comes off through the bias. A single input channel
     (a first layer on a mono input) puts 4 taps of a kernel row in a word instead.

   **One copy of the weights.** The packed weights follow the resolved ``CodegenOptions.vector_isa`` alone
   (as the float GEMM's do): "avx512" packs quads, "avx2" pairs, once, and every ``#if`` branch reads that
   copy: ``vpdpbusd`` where the compiler has AVX512-VNNI, two ``vpmaddwd`` on the widened even and odd bytes
   with AVX2 alone (exact: ``|u * w| <= 32640``), and under ``#else`` (a compiler without AVX2) plain C over
   the same words (``_portable``). The plain build (``simd="none"``, the Cortex-M7) keeps ``qconv.py``'s
   kernel and its own int16 rows. Same model, options and ISA: the same C and blob.

2. **Micro-kernel.** ``MR`` output channels x ``NV`` vectors of 8 positions of int32 accumulators in
   registers; per word and tap: ``NV`` loads, ``MR`` broadcasts of the packed weight word, and ``MR * NV``
   ``vpmaddwd`` + ``vpaddd`` (pairs; one ``vpdpwssd`` each with VNNI) or ``vpdpbusd`` (quads). All exact:
   ``|x| <= 255`` and ``|w| <= 32767`` keep a pair's sum below 2^31, a quad's four ``u8 * s8`` products sum
   below 2^17, and none of these instructions saturates (not ``vpmaddubsw``, nor the ``s`` forms of the
   VNNI ones); the int32 sums wrap as the reference's do. Channel blocks run outside the position tiles
   where the weights outweigh the image (each is then walked once). The loop over words and taps is a
   function of its own (``_micro_kernel``): inlined, gcc 12 moved every accumulator twice per multiply-add.
3. **Epilogue, 8 positions at a time** for one channel: bias (int32, wrapping), then ``Requantize``
   (``ops/quantized.py``) in 64-bit lanes, bit for bit the reference's: ``acc * multiplier`` exactly
   (``vpmuldq``); the residual's ``res * rmult`` (``rmult < 2^53``) as ``res * (rmult mod 2^31) + (res *
   (rmult >> 31)) * 2^31``, two more exact ``vpmuldq``; round half to even as ``floor((p + 2^(s-1) - 1 +
   bit_s(p)) / 2^s)``; zero point, clamp, narrowing to 8 bits. AVX-512: all 8 lanes in one register with
   arithmetic 64-bit shifts and min/max; AVX2: the even and the odd lanes apart, the shift done on
   ``p + 2^63`` as unsigned (AVX2 has no arithmetic 64-bit shift), clamps by 64-bit compares. Where the
   generator proves ``|acc * mult| + |res * rmult| < 2^53`` for every input (``exact_in_double``: short sums,
   such as depthwise, first layers and 1x1 convolutions of few channels) the requantization runs in double
   instead: ``acc * (mult 2^-s)`` is then exact, clamped and rounded half to even by the conversion (5
   operations per 8 outputs instead of 11). Where the clamp is the output type's whole range (no activation bound)
   and every value before rounding is below 2^30, the clamp in double goes too (``opfuse_q8_requantize_ds``): the
   saturating narrowing (``vpmovsdb``, or the packs) clamps the rounded integer.
4. **Depthwise** (one channel per group): rows of at least ``CodegenOptions.int8_depthwise_channels_below``
   positions per channel plane (a padded plane of centred values, 8 positions per vector: at stride 1 words
   of two taps of a kernel row as int16, one ``vpmaddwd`` per pair; strided, int32 and one ``vpmulld`` +
   ``vpaddd`` per tap); narrower ones 8 channels per vector (a padded image with the channels
   innermost, built and stored through 8x8 byte transposes, the epilogue with one channel's constants per
   lane); a strided one below ``int8_depthwise_strided_channels_below`` too.

A dequantizing epilogue (``integer_conv_dequantized``: ``Cast(acc + bias) * scale`` per output channel, a Conv
whose float output an activation reads before any quantization) takes the Requantize's place in the GEMM
(``QEpilogue.scale``): 8 accumulators converted (``vcvtdq2ps``) and multiplied by the channel's scale, each rounded
as the reference's Cast and Mul, so the same bits; the depthwise and AdvSIMD kernels keep ``qconv.py``'s for it.
Element-wise ops after the Requantize (onnxruntime's QDQ form: the requantized value dequantized to float, a
dequantized residual added, quantized again) are taken: the vectors are requantized into a row of scratch, then the
tail runs on those values in one loop per epilogue call (``finish_element``; gcc vectorises it), its other operands
read from memory at the same index, and stores the stage's outputs.

The plain C99 path (``simd="none"``, the Cortex-M7 build) keeps ``qconv.py``'s kernel, untouched. Anything else
in the epilogue (another op on the accumulator, a relabelling or broadcasting op after the Requantize, a second
output not computed from it) keeps it too, and the kernel's notes say why.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, NamedTuple, TypeVar

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index
from opfuse.codegen.rules import REQUANTIZE_RESIDUAL_C, REQUANTIZE_RESIDUAL_HELPER
from opfuse.codegen.stages import RELABEL_OPS, Stage
from opfuse.ir.graph import Node, Value
from opfuse.ops.nn import conv_geometry
from opfuse.ops.quantized import MAX_SHIFT, RESIDUAL_BITS
from opfuse.ops.registry import Category, get_spec

T = TypeVar("T")
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
HOST_GUARD = "defined(__AVX2__)"
VNNI_GUARD = "defined(__AVX512VNNI__) && defined(__AVX512VL__)"
LANES = 8  # int32 lanes of one AVX2 vector: output positions per vector
# Register blocks (output channels MR x vectors of positions NV) the GEMM chooses from: each keeps at
# most 12 accumulators so that with the NV loaded vectors, a broadcast weight and a product temporary
# they fit AVX2's 16 ymm registers. Chosen per convolution by ``_block`` (least estimated work).
BLOCKS = ((6, 2), (4, 3), (4, 2), (8, 1), (4, 1), (2, 2))
# Built for AVX-512 (``vector_isa``), the 32 registers take larger blocks too (at most 24 accumulators, 3 loaded
# vectors and a broadcast): measured (1 thread, CPU time, 40 interleaved runs, single convs of mobilenet_v1's
# shapes, against the blocks above): 8 x 3 0.95 (pw1), 0.94 (pw3), 0.93 (pw7), 0.96 (pw13); 8 x 2 0.94, 0.96,
# 0.94, 0.95. Compiled without AVX-512 they spill a few registers (exact, slower).
BLOCKS_AVX512 = ((8, 3), (6, 4), (8, 2)) + BLOCKS
# Built for AVX-512 with the quads, 16 positions (or a matmul's columns) per zmm (``CodegenOptions.int8_conv_zmm``,
# ``int8_matmul_zmm``): MR x NV zmm, at most 24 accumulators with the NV loads and a broadcast within the 32
# registers. Zen 4 runs a zmm vpdpbusd as two 256-bit halves, yet measured (this host, 12 independent chains, CPU
# time, loaded) 220-229 GMAC/s against 156-194 for ymm.
ZMM_BLOCKS = ((8, 3), (6, 4), (8, 2), (4, 4), (4, 2), (2, 2))
ZMM_GUARD = "defined(__AVX512F__) && defined(__AVX512VNNI__)"
# Built for aarch64 (``vector_isa="neon"``, ``neon_gemm``): ``sdot`` where the compiler targets the dot product
# (Armv8.2-A+dotprod), plain C over the same words otherwise.
NEON_GUARD = "defined(__aarch64__) && defined(__ARM_NEON)"
NEON_DOT_GUARD = NEON_GUARD + " && defined(__ARM_FEATURE_DOTPROD)"
NEON_LANES = 4  # int32 lanes of a q register: output positions per vector
# (MR output channels, NV vectors of 4 positions) of the NEON GEMM: MR a multiple of 4 (4 channels' weight words in
# one q register, multiplied in by lane: ``vdotq_laneq_s32``); at most 24 accumulators, with the NV loaded
# vectors and MR / 4 weight registers within the 32. Not measured (no Arm host here): chosen by ``_block``'s
# estimate as on x86.
NEON_BLOCKS = ((8, 3), (12, 2), (8, 2), (4, 4), (4, 2), (4, 1))


@dataclass
class QInput:
    q: Value     # the 8-bit tensor in memory
    zp: int      # x = int32(q) - zp


@dataclass
class QEpilogue:
    """``out = Requantize(conv + bias, mult, shift[, int32(res) - res_zp, rmult])``, per channel."""
    out: Value
    bias: np.ndarray   # int32 per output channel (0 where none)
    mult: np.ndarray   # int32 per output channel
    shift: np.ndarray  # int32 per output channel
    zp: int
    lo: int
    hi: int
    res: QInput | None = None
    rmult: np.ndarray | None = None  # int64 per output channel
    # Element-wise ops after the Requantize (a dequantization to float, a residual Add, a QuantizeLinear: onnxruntime's
    # QDQ form): ``out`` is then no tensor in memory. The kernel requantizes into a row of scratch (``_out_rows``) and
    # ``finish(index, expr)`` (``finish_element``) runs the tail on each requantized value and stores the stage's
    # outputs; ``rows`` maps each such row's C name to the output index of its column ``col``.
    finish: Callable[[Index, str], None] | None = None
    rows: dict[str, Callable[[str], Index]] = field(default_factory=dict)
    outputs: tuple[Value, ...] = ()  # the stage's outputs (with a tail: what it stores)
    # Dequantized to float instead of requantized (``integer_conv_dequantized``: ``Cast(acc + bias) * scale``, the
    # scale per output channel): ``out`` is that float product, ``mult``/``shift``/``zp``/``lo``/``hi`` unused.
    scale: np.ndarray | None = None


def _centred_input(v: Value, ev) -> QInput | None:
    """``v = int32(q) [- zp]`` computed inline (``Cast``/``Sub`` in this kernel) from an 8-bit ``q`` in
    memory, ``zp`` a constant scalar of 8-bit range."""
    zp = 0
    n = v.producer
    if n is None or id(n) not in ev.inline:
        return None
    if n.op_type == "Sub":
        z = ev.static.get(id(n.input(1)))
        if z is None or z.size != 1 or not -255 <= int(z.reshape(-1)[0]) <= 255:
            return None
        zp = int(z.reshape(-1)[0])
        n = n.input(0).producer
        if n is None or id(n) not in ev.inline:
            return None
    if n.op_type != "Cast" or n.outputs[0].dtype != np.int32:
        return None
    q = n.input(0)
    if q.dtype not in EIGHT_BIT or id(q) not in ev.loadable or id(q) in ev.static:
        return None
    if q.producer is not None and id(q.producer) in ev.inline:
        return None
    return QInput(q, zp)


def _per_channel(arr: np.ndarray | None, shape: tuple, dtype) -> np.ndarray | None:
    """``arr`` (broadcasting to the NCHW ``shape``) as one value per channel, or None when it varies
    along another axis or is not known at build time."""
    if arr is None or arr.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - arr.ndim) + arr.shape
    if any(d != 1 for i, d in enumerate(full) if i != 1):
        return None
    return np.broadcast_to(arr.reshape(full[1]), (shape[1],)).astype(dtype)


class _Refused(Exception):
    """Why the host kernel does not take this convolution (reported in the kernel's notes)."""


def _need(cond: bool, reason: str) -> None:
    if not cond:
        raise _Refused(reason)


def _must(value: T | None, reason: str) -> T:
    """``value``, or ``_Refused(reason)`` when it is None."""
    if value is None:
        raise _Refused(reason)
    return value


def match_epilogue(ev, stage: Stage, node: Node, tail: bool = False, dequantize: bool = False) -> QEpilogue:
    """The epilogue this module vectorises; ``_Refused`` with the reason otherwise. ``tail``: element-wise ops after
    the Requantize are taken too (the conv kernel's ``QEpilogue.finish``), their nodes returned in ``ops``.
    ``dequantize``: a ``Cast`` to float and a ``Mul`` by a constant per channel may stand for the Requantize
    (``QEpilogue.scale``: the conv GEMM's dequantizing epilogue)."""
    acc = node.outputs[0]
    shape = acc.shape
    bias = np.zeros(shape[1], np.int64)
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        # a Conv's bias is 1-D, one value per output channel: read as (batch, channels), channels on axis 1
        bias += _must(_per_channel(ev.static.get(id(node.inputs[2])), shape[:2], np.int64),
                      "the Conv's bias is not a constant")
    cur = acc
    rq: Node | None = None
    cast: Node | None = None
    scale: np.ndarray | None = None
    pre = {id(acc)}  # the accumulator and what is computed from it before the Requantize
    after: set[int] = set()  # the Requantize's output and the tail's values
    for n in stage.epilogue:
        ins = n.input_values()
        if tail and rq is not None and any(id(v) in after for v in ins):
            _need(not any(id(v) in pre for v in ins), f"a {n.op_type} after the Requantize reads the accumulator")
            _tail_op(n, shape, after)
            after.add(id(n.outputs[0]))
            continue
        if not any(v is cur for v in ins):
            if any(id(v) in pre for v in ins):
                pre.add(id(n.outputs[0]))
            continue
        _need(rq is None, f"a {n.op_type} reads the accumulator besides the Requantize")
        if n.op_type == "Add" and n.outputs[0].dtype == np.int32 and n.outputs[0].shape == shape:
            other = n.input(1) if n.input(0) is cur else n.input(0)
            bias += _must(_per_channel(ev.static.get(id(other)), shape, np.int64),
                          "the bias Add's operand is not a constant per channel")
            cur = n.outputs[0]
            pre.add(id(cur))
        elif n.op_type == "Requantize" and n.input(0) is cur:
            rq = n
            after.add(id(rq.outputs[0]))
        elif dequantize and n.op_type == "Cast" and cur.dtype == np.int32 and n.outputs[0].dtype == np.float32 \
                and cast is None:
            cast = n  # the dequantization's Cast (``integer_conv_dequantized``), its Mul next
            cur = n.outputs[0]
            pre.add(id(cur))
        elif n.op_type == "Mul" and cast is not None and n.outputs[0].shape == shape:
            other = n.input(1) if n.input(0) is cur else n.input(0)
            scale = _must(_per_channel(ev.static.get(id(other)), shape, np.float32),
                          "the dequantization's scale is not a constant per channel")
            rq = n
            after.add(id(rq.outputs[0]))
        else:
            raise _Refused(f"a {n.op_type} in the epilogue (only a bias Add and a Requantize, or a dequantizing Cast "
                           "and Mul, are vectorised)")
    rq = _must(rq, "the epilogue has no Requantize")
    if len(after) == 1 or not tail:
        _need(len(stage.outputs) == 1 and stage.outputs[0] is rq.outputs[0],
              "the kernel stores another tensor than the Requantize's output")
    else:
        _need(all(id(v) in after for v in stage.outputs),
              "the kernel stores another tensor than the Requantize's output and the element-wise ops after it")
    out = rq.outputs[0]
    _need(out.shape == shape, "the Requantize broadcasts the accumulator")
    if scale is not None:  # dequantized: Cast(acc + bias) * scale, float32 per channel
        none = np.zeros(shape[1], np.int32)
        return QEpilogue(out, bias.astype(np.int32), none, none, 0, 0, 0, scale=scale.astype(np.float32))
    mult = _must(_per_channel(ev.static.get(id(rq.input(1))), shape, np.int64),
                 "the Requantize's multiplier is not a constant per channel")
    shift = _must(_per_channel(ev.static.get(id(rq.input(2))), shape, np.int64),
                  "the Requantize's shift is not a constant per channel")
    _need(mult.min() >= 0 and shift.min() >= 1 and shift.max() <= MAX_SHIFT,
          f"the Requantize has a negative multiplier or a shift outside [1, {MAX_SHIFT}] (the reference refuses it)")
    a = get_spec(rq.op_type, rq).attrs_of(rq)
    # the bias wraps in int32 like the reference's Add
    ep = QEpilogue(out, bias.astype(np.int32), mult.astype(np.int32), shift.astype(np.int32),
                   int(a["zero_point"]), int(a["lo"]), int(a["hi"]))
    if len(rq.input_values()) == 5:
        res = _must(_centred_input(rq.input(3), ev),
                    "the Requantize's residual is not an 8-bit tensor in memory less a constant zero point")
        _need(res.q.shape == shape, "the Requantize broadcasts its residual")
        rmult = _must(_per_channel(ev.static.get(id(rq.input(4))), shape, np.int64),
                      "the Requantize's residual multiplier is not a constant per channel")
        _need(rmult.min() >= 0 and rmult.max() < 1 << (MAX_SHIFT - RESIDUAL_BITS),
              "the Requantize's residual multiplier is out of range (the reference refuses it)")
        ep.res, ep.rmult = res, rmult
    return ep


def _tail_op(n: Node, shape: tuple, after: set[int]) -> None:
    """``_Refused`` unless ``n`` (after the Requantize) maps each requantized value to one element of its output
    (``finish_element``'s sweep): element-wise, its requantized operands of the accumulator's shape, no broadcast
    of them to more elements."""
    _need(n.op_type not in RELABEL_OPS, f"a {n.op_type} after the Requantize (only element-wise ops are taken)")
    cat = get_spec(n.op_type, n).category
    _need(cat in (Category.ELEMWISE, Category.BROADCAST) and n.op_type != "Expand" and len(n.outputs) == 1
          and n.outputs[0].shape == shape and all(v.shape == shape for v in n.input_values() if id(v) in after),
          f"a {n.op_type} after the Requantize is not element-wise on the accumulator's shape")


def host_int8_conv_applies(kc, ev, stage: Stage) -> tuple[QInput, QEpilogue] | None:
    """The host kernel's operands, or None where ``qconv.py``'s kernel stays alone (on the host with
    SIMD, the reason is in the kernel's notes)."""
    opts = kc.program.options
    if opts.simd == "none" or opts.platform != "host":
        return None
    node = stage.anchor_node
    try:
        _need(len(node.input(0).shape) == 4, "not a 2-D convolution")
        x = _must(_centred_input(node.input(0), ev), "the input is not an 8-bit tensor in memory less a "
                                                     "constant zero point, dequantized in this kernel")
        if opts.vector_isa == "neon":
            _neon_applies(ev, node, x)
        ep = match_epilogue(ev, stage, node, tail=True, dequantize=True)
        if ep.scale is not None:
            _, G = conv_geometry(node)
            _need(opts.vector_isa != "neon", "a dequantizing epilogue on AdvSIMD (only the x86 GEMM takes it)")
            _need(not (node.input(0).shape[1] // G == 1 and node.outputs[0].shape[1] // G == 1),
                  "a dequantizing epilogue on a depthwise convolution (only the GEMM takes it)")
        if not (len(stage.outputs) == 1 and stage.outputs[0] is ep.out):
            def finish(idx: Index, expr: str) -> None:
                # Each call's temporaries in a scope of their own: its C block closes after it, and an output whose
                # every index is a constant (one element) would otherwise find them in a later block, or in the
                # ``#else`` branch (a drawn 1 x 1 quantized Conv + Sigmoid: "'t34' undeclared").
                with ev.scope():
                    finish_element(kc, ev, stage, ep.out, idx, expr)
            ep.finish = finish
            ep.outputs = tuple(stage.outputs)
            what, row = ("dequantization to float", "dequantized") if ep.scale is not None else \
                ("Requantize", "requantized")
            kc.note(lambda name: f"int8 conv '{name}': element-wise epilogue after the vectorised {what}, "
                                 f"element by element on each {row} row", node)
        return x, ep
    except _Refused as e:
        reason = str(e)
        kc.note(lambda name: f"int8 conv '{name}': host int8 kernel not used: {reason}", node)
        return None


# C ---------------------------------------------------------------------------------------------------
HELPER = "opfuse_q8_host"
HELPER_C = """
#if defined(__AVX2__)
#include <immintrin.h>
/* acc + the pairwise products of x and w (int16 pairs), exact: one vpdpwssd with AVX512-VNNI. */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define OPFUSE_Q8_DOT(acc, x, w) _mm256_dpwssd_epi32((acc), (x), (w))
#else
#define OPFUSE_Q8_DOT(acc, x, w) _mm256_add_epi32((acc), _mm256_madd_epi16((x), (w)))
#endif
/* acc + the 4 products of each u8 quad of x by the s8 quad of w, exact and wrapping (no saturation): one vpdpbusd
   with AVX512-VNNI; with AVX2 alone the even and the odd bytes widened to int16 (x zero-, w sign-extended) and two
   vpmaddwd (|u * w| <= 32640: a pair's sum fits int32, and vpmaddwd saturates nothing here). The compiler
   shares the widening of a loaded x among the block's channels and of a broadcast w among its vectors. */
static inline __m256i opfuse_q8_dpbusd(__m256i acc, __m256i x, __m256i w) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, x, w);
#else
  const __m256i xe = _mm256_and_si256(x, _mm256_set1_epi16(0x00ff)), xo = _mm256_srli_epi16(x, 8);
  const __m256i we = _mm256_srai_epi16(_mm256_slli_epi16(w, 8), 8), wo = _mm256_srai_epi16(w, 8);
  return _mm256_add_epi32(acc, _mm256_add_epi32(_mm256_madd_epi16(xe, we), _mm256_madd_epi16(xo, wo)));
#endif
}

/* The requantization's constants for 8 lanes: one output channel in every lane (opfuse_q8_chan_init) or one
   channel per lane (opfuse_q8_chan_lanes: 8 consecutive channels, the depthwise kernel over channels). */
#if defined(__AVX512F__)
typedef struct {
  __m512i mult, cnt, hm1, zp, lo, hi, rl, rh;
} opfuse_q8_chan;

static inline opfuse_q8_chan opfuse_q8_chan_vec(__m256i mult, __m256i shift, __m512i rmult, int32_t zp, int32_t lo,
                                                int32_t hi) {
  opfuse_q8_chan c;
  c.mult = _mm512_cvtepi32_epi64(mult);
  c.cnt = _mm512_cvtepi32_epi64(shift);
  c.hm1 = _mm512_sub_epi64(_mm512_sllv_epi64(_mm512_set1_epi64(1), _mm512_sub_epi64(c.cnt, _mm512_set1_epi64(1))),
                           _mm512_set1_epi64(1));
  c.zp = _mm512_set1_epi64(zp);
  c.lo = _mm512_set1_epi64(lo);
  c.hi = _mm512_set1_epi64(hi);
  c.rl = _mm512_and_si512(rmult, _mm512_set1_epi64(0x7fffffff));
  c.rh = _mm512_srli_epi64(rmult, 31);
  return c;
}
static inline opfuse_q8_chan opfuse_q8_chan_init(int32_t mult, int32_t shift, int64_t rmult, int32_t zp, int32_t lo,
                                                 int32_t hi) {
  return opfuse_q8_chan_vec(_mm256_set1_epi32(mult), _mm256_set1_epi32(shift), _mm512_set1_epi64(rmult), zp, lo, hi);
}
static inline opfuse_q8_chan opfuse_q8_chan_lanes(const int32_t* mult, const int32_t* shift, const int64_t* rmult,
                                                  int32_t zp, int32_t lo, int32_t hi) {
  return opfuse_q8_chan_vec(_mm256_loadu_si256((const __m256i*)mult), _mm256_loadu_si256((const __m256i*)shift),
                            rmult ? _mm512_loadu_si512(rmult) : _mm512_setzero_si512(), zp, lo, hi);
}

/* 8 int32 accumulators (bias added) -> 8 requantized 8-bit values (the low 8 bytes); res: the centred
   residual or NULL. Round half to even of p / 2^s is floor((p + 2^(s-1) - 1 + bit_s(p)) / 2^s). AVX-512: all
   8 products in one register, arithmetic 64-bit shifts, min/max and a truncating narrowing (the values are
   already clamped to the 8-bit type). */
static inline __m128i opfuse_q8_requantize(__m256i acc, const opfuse_q8_chan* c, const __m256i* res, int is_unsigned) {
  (void)is_unsigned;
  __m512i p = _mm512_mul_epi32(_mm512_cvtepi32_epi64(acc), c->mult);
  if (res) {
    const __m512i r = _mm512_cvtepi32_epi64(*res);
    p = _mm512_add_epi64(p, _mm512_add_epi64(_mm512_mul_epi32(r, c->rl),
                                             _mm512_slli_epi64(_mm512_mul_epi32(r, c->rh), 31)));
  }
  const __m512i odd = _mm512_and_si512(_mm512_srlv_epi64(p, c->cnt), _mm512_set1_epi64(1));
  __m512i q = _mm512_srav_epi64(_mm512_add_epi64(_mm512_add_epi64(p, c->hm1), odd), c->cnt);
  q = _mm512_min_epi64(_mm512_max_epi64(_mm512_add_epi64(q, c->zp), c->lo), c->hi);
  return _mm512_cvtepi64_epi8(q);
}
#else
/* AVX2: the even lanes' and the odd lanes' 64-bit products apart (vpmuldq reads the low dword of each 64-bit
   lane); mult, rl, rh: 32-bit per lane (_o: the odd lanes' in the low dwords); cnt, hm1 = 2^(s-1) - 1 and
   b63 = 2^(63-s): 64-bit, even and odd lanes. */
typedef struct {
  __m256i mult, mult_o, rl, rl_o, rh, rh_o, cnt_e, cnt_o, hm1_e, hm1_o, b63_e, b63_o, zp, lo, hi;
} opfuse_q8_chan;

static inline opfuse_q8_chan opfuse_q8_chan_vec(__m256i mult, __m256i shift, __m256i rl, __m256i rh, int32_t zp,
                                                int32_t lo, int32_t hi) {
  opfuse_q8_chan c;
  const __m256i one = _mm256_set1_epi64x(1), low = _mm256_set1_epi64x(0xffffffff);
  c.mult = mult;
  c.mult_o = _mm256_srli_epi64(mult, 32);
  c.rl = rl;
  c.rl_o = _mm256_srli_epi64(rl, 32);
  c.rh = rh;
  c.rh_o = _mm256_srli_epi64(rh, 32);
  c.cnt_e = _mm256_and_si256(shift, low);
  c.cnt_o = _mm256_srli_epi64(shift, 32);
  c.hm1_e = _mm256_sub_epi64(_mm256_sllv_epi64(one, _mm256_sub_epi64(c.cnt_e, one)), one);
  c.hm1_o = _mm256_sub_epi64(_mm256_sllv_epi64(one, _mm256_sub_epi64(c.cnt_o, one)), one);
  c.b63_e = _mm256_sllv_epi64(one, _mm256_sub_epi64(_mm256_set1_epi64x(63), c.cnt_e));
  c.b63_o = _mm256_sllv_epi64(one, _mm256_sub_epi64(_mm256_set1_epi64x(63), c.cnt_o));
  c.zp = _mm256_set1_epi64x(zp);
  c.lo = _mm256_set1_epi64x(lo);
  c.hi = _mm256_set1_epi64x(hi);
  return c;
}
static inline opfuse_q8_chan opfuse_q8_chan_init(int32_t mult, int32_t shift, int64_t rmult, int32_t zp, int32_t lo,
                                                 int32_t hi) {
  return opfuse_q8_chan_vec(_mm256_set1_epi32(mult), _mm256_set1_epi32(shift),
                            _mm256_set1_epi32((int32_t)(rmult & 0x7fffffff)), _mm256_set1_epi32((int32_t)(rmult >> 31)),
                            zp, lo, hi);
}
static inline opfuse_q8_chan opfuse_q8_chan_lanes(const int32_t* mult, const int32_t* shift, const int64_t* rmult,
                                                  int32_t zp, int32_t lo, int32_t hi) {
  int32_t rl[8] = {0}, rh[8] = {0};
  for (int j = 0; rmult && j < 8; ++j) {
    rl[j] = (int32_t)(rmult[j] & 0x7fffffff);
    rh[j] = (int32_t)(rmult[j] >> 31);
  }
  return opfuse_q8_chan_vec(_mm256_loadu_si256((const __m256i*)mult), _mm256_loadu_si256((const __m256i*)shift),
                            _mm256_loadu_si256((const __m256i*)rl), _mm256_loadu_si256((const __m256i*)rh), zp, lo, hi);
}

/* Round half to even of 4 int64 products p / 2^s as floor((p + 2^(s-1) - 1 + bit_s(p)) / 2^s), on p + 2^63
   taken as unsigned (no arithmetic 64-bit shift in AVX2), plus the zero point, clamped to [lo, hi]. */
static inline __m256i opfuse_q8_round(__m256i p, __m256i cnt, __m256i hm1, __m256i b63, const opfuse_q8_chan* c) {
  const __m256i u = _mm256_xor_si256(p, _mm256_set1_epi64x((long long)0x8000000000000000ull));
  const __m256i odd = _mm256_and_si256(_mm256_srlv_epi64(u, cnt), _mm256_set1_epi64x(1));
  const __m256i t = _mm256_add_epi64(_mm256_add_epi64(u, hm1), odd);
  __m256i q = _mm256_add_epi64(_mm256_sub_epi64(_mm256_srlv_epi64(t, cnt), b63), c->zp);
  q = _mm256_blendv_epi8(q, c->lo, _mm256_cmpgt_epi64(c->lo, q));
  q = _mm256_blendv_epi8(q, c->hi, _mm256_cmpgt_epi64(q, c->hi));
  return q;
}

/* 8 int32 accumulators (bias added) -> 8 requantized 8-bit values (the low 8 bytes); res: the centred
   residual or NULL. The packs saturate nothing (the values are already clamped). */
static inline __m128i opfuse_q8_requantize(__m256i acc, const opfuse_q8_chan* c, const __m256i* res, int is_unsigned) {
  const __m256i acc_o = _mm256_srli_epi64(acc, 32);
  __m256i pe = _mm256_mul_epi32(acc, c->mult);
  __m256i po = _mm256_mul_epi32(acc_o, c->mult_o);
  if (res) {
    const __m256i re = *res, ro = _mm256_srli_epi64(*res, 32);
    pe = _mm256_add_epi64(pe, _mm256_add_epi64(_mm256_mul_epi32(re, c->rl),
                                               _mm256_slli_epi64(_mm256_mul_epi32(re, c->rh), 31)));
    po = _mm256_add_epi64(po, _mm256_add_epi64(_mm256_mul_epi32(ro, c->rl_o),
                                               _mm256_slli_epi64(_mm256_mul_epi32(ro, c->rh_o), 31)));
  }
  const __m256i qe = opfuse_q8_round(pe, c->cnt_e, c->hm1_e, c->b63_e, c);
  const __m256i qo = opfuse_q8_round(po, c->cnt_o, c->hm1_o, c->b63_o, c);
  const __m256i v = _mm256_blend_epi32(qe, _mm256_slli_epi64(qo, 32), 0xAA);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return is_unsigned ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
}
#endif

/* The requantization in double where the generator has found it exact (opfuse_q8_dchan; ``exact_in_double``):
   for every accumulator the channel can produce, |acc * mult| + |res * rmult| < 2^53, so acc * (mult 2^-s)
   [+ res * (rmult 2^-s)] is the exact value of (acc * mult + res * rmult) / 2^s; clamped to [lo - zp, hi - zp]
   (integers: clamping before the rounding is clamping after it) and rounded half to even by the conversion
   (round to nearest even, explicit). 5 operations per 8 lanes instead of 11 in 64-bit integers. */
#if defined(__AVX512F__)
typedef struct {
  __m512d scale, rscale, lo, hi;
  __m256i zp;
} opfuse_q8_dchan;

static inline opfuse_q8_dchan opfuse_q8_dchan_vec(__m512d scale, __m512d rscale, int32_t zp, int32_t lo, int32_t hi) {
  opfuse_q8_dchan c;
  c.scale = scale;
  c.rscale = rscale;
  c.lo = _mm512_set1_pd((double)(lo - zp));
  c.hi = _mm512_set1_pd((double)(hi - zp));
  c.zp = _mm256_set1_epi32(zp);
  return c;
}
static inline opfuse_q8_dchan opfuse_q8_dchan_init(double scale, double rscale, int32_t zp, int32_t lo, int32_t hi) {
  return opfuse_q8_dchan_vec(_mm512_set1_pd(scale), _mm512_set1_pd(rscale), zp, lo, hi);
}
static inline opfuse_q8_dchan opfuse_q8_dchan_lanes(const double* scale, const double* rscale, int32_t zp, int32_t lo,
                                                    int32_t hi) {
  return opfuse_q8_dchan_vec(_mm512_loadu_pd(scale), rscale ? _mm512_loadu_pd(rscale) : _mm512_setzero_pd(), zp, lo,
                             hi);
}
static inline __m128i opfuse_q8_requantize_d(__m256i acc, const opfuse_q8_dchan* c, const __m256i* res,
                                             int is_unsigned) {
  __m512d d = _mm512_mul_pd(_mm512_cvtepi32_pd(acc), c->scale);
  if (res) d = _mm512_add_pd(d, _mm512_mul_pd(_mm512_cvtepi32_pd(*res), c->rscale));
  d = _mm512_min_pd(_mm512_max_pd(d, c->lo), c->hi);
  const __m256i q = _mm256_add_epi32(_mm512_cvt_roundpd_epi32(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), c->zp);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  return is_unsigned ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
}
/* The same where [lo, hi] is the output type's range and |acc * scale + res * rscale| < 2^30 (``exact_in_double``
   proves it): no clamp in double, the saturating packs clamp the rounded integer (+ zp, no int32 overflow). */
static inline __m128i opfuse_q8_requantize_ds(__m256i acc, const opfuse_q8_dchan* c, const __m256i* res,
                                              int is_unsigned) {
  __m512d d = _mm512_mul_pd(_mm512_cvtepi32_pd(acc), c->scale);
  if (res) d = _mm512_add_pd(d, _mm512_mul_pd(_mm512_cvtepi32_pd(*res), c->rscale));
  const __m256i q = _mm256_add_epi32(_mm512_cvt_roundpd_epi32(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), c->zp);
#if defined(__AVX512VL__)
  if (!is_unsigned) return _mm256_cvtsepi32_epi8(q);  /* one saturating narrowing (vpmovsdb) */
#endif
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  return is_unsigned ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
}
#else
typedef struct {
  __m256d scale0, scale1, rscale0, rscale1, lo, hi;
  __m128i zp;
} opfuse_q8_dchan;

static inline opfuse_q8_dchan opfuse_q8_dchan_vec(__m256d s0, __m256d s1, __m256d r0, __m256d r1, int32_t zp,
                                                  int32_t lo, int32_t hi) {
  opfuse_q8_dchan c;
  c.scale0 = s0;
  c.scale1 = s1;
  c.rscale0 = r0;
  c.rscale1 = r1;
  c.lo = _mm256_set1_pd((double)(lo - zp));
  c.hi = _mm256_set1_pd((double)(hi - zp));
  c.zp = _mm_set1_epi32(zp);
  return c;
}
static inline opfuse_q8_dchan opfuse_q8_dchan_init(double scale, double rscale, int32_t zp, int32_t lo, int32_t hi) {
  const __m256d s = _mm256_set1_pd(scale), r = _mm256_set1_pd(rscale);
  return opfuse_q8_dchan_vec(s, s, r, r, zp, lo, hi);
}
static inline opfuse_q8_dchan opfuse_q8_dchan_lanes(const double* scale, const double* rscale, int32_t zp, int32_t lo,
                                                    int32_t hi) {
  const __m256d z = _mm256_setzero_pd();
  return opfuse_q8_dchan_vec(_mm256_loadu_pd(scale), _mm256_loadu_pd(scale + 4), rscale ? _mm256_loadu_pd(rscale) : z,
                             rscale ? _mm256_loadu_pd(rscale + 4) : z, zp, lo, hi);
}
static inline __m128i opfuse_q8_dhalf(__m128i acc, __m256d scale, const __m128i* res, __m256d rscale,
                                      const opfuse_q8_dchan* c, int clamp) {
  __m256d d = _mm256_mul_pd(_mm256_cvtepi32_pd(acc), scale);
  if (res) d = _mm256_add_pd(d, _mm256_mul_pd(_mm256_cvtepi32_pd(*res), rscale));
  if (clamp) d = _mm256_min_pd(_mm256_max_pd(d, c->lo), c->hi);
  d = _mm256_round_pd(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm_add_epi32(_mm256_cvtpd_epi32(d), c->zp);  /* an integer value: converted exactly */
}
static inline __m128i opfuse_q8_requantize_dc(__m256i acc, const opfuse_q8_dchan* c, const __m256i* res,
                                              int is_unsigned, int clamp) {
  __m128i r0 = _mm_setzero_si128(), r1 = r0;
  if (res) {
    r0 = _mm256_castsi256_si128(*res);
    r1 = _mm256_extracti128_si256(*res, 1);
  }
  const __m128i q0 = opfuse_q8_dhalf(_mm256_castsi256_si128(acc), c->scale0, res ? &r0 : NULL, c->rscale0, c, clamp);
  const __m128i q1 = opfuse_q8_dhalf(_mm256_extracti128_si256(acc, 1), c->scale1, res ? &r1 : NULL, c->rscale1, c,
                                     clamp);
  const __m128i w = _mm_packs_epi32(q0, q1);
  return is_unsigned ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
}
static inline __m128i opfuse_q8_requantize_d(__m256i acc, const opfuse_q8_dchan* c, const __m256i* res,
                                             int is_unsigned) {
  return opfuse_q8_requantize_dc(acc, c, res, is_unsigned, 1);
}
/* Unclamped, where the saturating packs clamp (see the AVX-512 form). */
static inline __m128i opfuse_q8_requantize_ds(__m256i acc, const opfuse_q8_dchan* c, const __m256i* res,
                                              int is_unsigned) {
  return opfuse_q8_requantize_dc(acc, c, res, is_unsigned, 0);
}
#endif

/* The 8 x 8 byte transpose of the low halves of v[0..7]: w[i] holds rows 2i (low half) and 2i + 1 (high half)
   of the transpose, row j being byte j of every v. */
static inline void opfuse_q8_transpose_8x8(const __m128i v[8], __m128i w[4]) {
  const __m128i t0 = _mm_unpacklo_epi8(v[0], v[1]), t1 = _mm_unpacklo_epi8(v[2], v[3]);
  const __m128i t2 = _mm_unpacklo_epi8(v[4], v[5]), t3 = _mm_unpacklo_epi8(v[6], v[7]);
  const __m128i u0 = _mm_unpacklo_epi16(t0, t1), u1 = _mm_unpackhi_epi16(t0, t1);
  const __m128i u2 = _mm_unpacklo_epi16(t2, t3), u3 = _mm_unpackhi_epi16(t2, t3);
  w[0] = _mm_unpacklo_epi32(u0, u2);
  w[1] = _mm_unpackhi_epi32(u0, u2);
  w[2] = _mm_unpacklo_epi32(u1, u3);
  w[3] = _mm_unpackhi_epi32(u1, u3);
}
/* v0..v7: 8 positions' 8 bytes (8 channels each, the low half); stores channel j's 8 positions (the first n)
   at dst + j * stride, for the first nch channels: an 8 x 8 byte transpose. */
static inline void opfuse_q8_store_8x8(void* dst, long stride, long nch, long n, __m128i v0, __m128i v1, __m128i v2,
                                       __m128i v3, __m128i v4, __m128i v5, __m128i v6, __m128i v7) {
  const __m128i v[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
  __m128i w[4];
  opfuse_q8_transpose_8x8(v, w);
  unsigned char* d = (unsigned char*)dst;
  if (nch == 8 && n == 8) {
    for (int i = 0; i < 4; ++i) {
      _mm_storel_epi64((__m128i*)(d + (2 * i) * stride), w[i]);
      _mm_storel_epi64((__m128i*)(d + (2 * i + 1) * stride), _mm_unpackhi_epi64(w[i], w[i]));
    }
    return;
  }
  unsigned char tmp[64];
  for (int i = 0; i < 4; ++i) _mm_storeu_si128((__m128i*)(tmp + 16 * i), w[i]);
  for (long j = 0; j < nch; ++j) memcpy(d + j * stride, tmp + 8 * j, (size_t)n);
}

/* 8 (or the first n) floats: a dequantized row's vector. */
static inline void opfuse_q8_store_f32(float* dst, __m256 v, long n) {
  if (n >= 8) {
    _mm256_storeu_ps(dst, v);
  } else {
    float tmp[8];
    _mm256_storeu_ps(tmp, v);
    memcpy(dst, tmp, sizeof(float) * (size_t)n);
  }
}

static inline void opfuse_q8_store(void* dst, __m128i b, long n) {
  if (n >= 8) {
    _mm_storel_epi64((__m128i*)dst, b);
  } else {
    unsigned char tmp[16];
    _mm_storeu_si128((__m128i*)tmp, b);
    memcpy(dst, tmp, (size_t)n);
  }
}
/* 8 (or the first n) 8-bit values widened to int32, less zp. */
/* 8 (or the first n, the rest zero) bytes in the low half of an xmm. */
static inline __m128i opfuse_q8_load8(const void* src, long n) {
  if (n >= 8) return _mm_loadl_epi64((const __m128i*)src);
  unsigned char tmp[16] = {0};
  memcpy(tmp, src, (size_t)n);
  return _mm_loadu_si128((const __m128i*)tmp);
}
static inline __m256i opfuse_q8_load_s8(const int8_t* src, long n, int32_t zp) {
  return _mm256_sub_epi32(_mm256_cvtepi8_epi32(opfuse_q8_load8(src, n)), _mm256_set1_epi32(zp));
}
static inline __m256i opfuse_q8_load_u8(const uint8_t* src, long n, int32_t zp) {
  return _mm256_sub_epi32(_mm256_cvtepu8_epi32(opfuse_q8_load8(src, n)), _mm256_set1_epi32(zp));
}
#endif
"""

PAIRS_C = """
#if defined(__AVX2__)
/* dst[j] = the int16 pair (a[i] - zp, b[i] - zp), i = first + j * step, for j < n: 0 where i lies
   outside [0, len) or the row is NULL (a channel past the group's: the odd count's padding). */
static void opfuse_q8_pairs_{s}(int16_t* restrict dst, const {T}* a, const {T}* b, long first, long n, long step,
                                long len, int32_t zp) {{
  long j = 0;
  if (step == 1 && a && b) {{
    long lo = first < 0 ? -first : 0, hi = len - first;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    if (hi < lo) hi = lo;
    for (; j < lo; ++j) dst[2 * j] = dst[2 * j + 1] = 0;
    const __m128i z = _mm_set1_epi16((short)zp);
    for (; j + 8 <= hi; j += 8) {{
      const __m128i xa = _mm_sub_epi16(_mm_cvt{cvt}_epi16(_mm_loadl_epi64((const __m128i*)(a + first + j))), z);
      const __m128i xb = _mm_sub_epi16(_mm_cvt{cvt}_epi16(_mm_loadl_epi64((const __m128i*)(b + first + j))), z);
      _mm_storeu_si128((__m128i*)(dst + 2 * j), _mm_unpacklo_epi16(xa, xb));
      _mm_storeu_si128((__m128i*)(dst + 2 * j + 8), _mm_unpackhi_epi16(xa, xb));
    }}
    for (; j < hi; ++j) {{
      dst[2 * j] = (int16_t)(a[first + j] - zp);
      dst[2 * j + 1] = (int16_t)(b[first + j] - zp);
    }}
    for (; j < n; ++j) dst[2 * j] = dst[2 * j + 1] = 0;
    return;
  }}
  if (step == 2 && a && b) {{ /* every other value: the even bytes of 16 gathered by one shuffle */
    const __m128i z = _mm_set1_epi16((short)zp);
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    for (; j < n && first + 2 * j < 0; ++j) dst[2 * j] = dst[2 * j + 1] = 0;
    for (; j + 8 <= n && first + 2 * j + 16 <= len; j += 8) {{
      const long i = first + 2 * j;
      const __m128i ea = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(a + i)), even);
      const __m128i eb = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(b + i)), even);
      const __m128i xa = _mm_sub_epi16(_mm_cvt{cvt}_epi16(ea), z), xb = _mm_sub_epi16(_mm_cvt{cvt}_epi16(eb), z);
      _mm_storeu_si128((__m128i*)(dst + 2 * j), _mm_unpacklo_epi16(xa, xb));
      _mm_storeu_si128((__m128i*)(dst + 2 * j + 8), _mm_unpackhi_epi16(xa, xb));
    }}
  }}
  /* No load under a condition (issue 13: gcc 12.2 -O3 made masked loads of such tails): each row is read at a
     position inside it (a NULL row at its stand-in's only one) and the value selected. */
  const {T} none = 0;
  const {T}* ra = a ? a : &none;
  const {T}* rb = b ? b : &none;
  const long la = a ? len - 1 : 0, lb = b ? len - 1 : 0;
  for (; j < n; ++j) {{
    const long i = first + j * step;
    const int in = i >= 0 && i < len;
    const int32_t va = ra[(unsigned long)i < (unsigned long)la ? i : la] - zp;
    const int32_t vb = rb[(unsigned long)i < (unsigned long)lb ? i : lb] - zp;
    dst[2 * j] = (int16_t)(in && a ? va : 0);
    dst[2 * j + 1] = (int16_t)(in && b ? vb : 0);
  }}
}}

/* dst[j] = a[first + j * step] - zp as int32, 0 outside [0, len). */
static void opfuse_q8_plane_row_{s}(int32_t* restrict dst, const {T}* a, long first, long n, long step, long len,
                                    int32_t zp) {{
  long j = 0;
  if (step == 1) {{
    long lo = first < 0 ? -first : 0, hi = len - first;
    if (lo > n) lo = n;
    if (hi > n) hi = n;
    if (hi < lo) hi = lo;
    for (; j < lo; ++j) dst[j] = 0;
    const __m256i z = _mm256_set1_epi32(zp);
    for (; j + 8 <= hi; j += 8)
      _mm256_storeu_si256((__m256i*)(dst + j),
                          _mm256_sub_epi32(_mm256_cvt{cvt}_epi32(_mm_loadl_epi64((const __m128i*)(a + first + j))), z));
    for (; j < hi; ++j) dst[j] = a[first + j] - zp;
    for (; j < n; ++j) dst[j] = 0;
    return;
  }}
  if (step == 2) {{ /* every other value: the even bytes of 16 gathered by one shuffle */
    const __m256i z = _mm256_set1_epi32(zp);
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    for (; j < n && first + 2 * j < 0; ++j) dst[j] = 0;
    for (; j + 8 <= n && first + 2 * j + 16 <= len; j += 8)
      _mm256_storeu_si256((__m256i*)(dst + j), _mm256_sub_epi32(_mm256_cvt{cvt}_epi32(
          _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(a + first + 2 * j)), even)), z));
  }}
  for (; j < n; ++j) {{ /* read inside and select: no load under a condition (issue 13) */
    const long i = first + j * step;
    const int32_t v = a[(unsigned long)i < (unsigned long)(len - 1) ? i : len - 1] - zp;
    dst[j] = i >= 0 && i < len ? v : 0;
  }}
}}
#endif
"""


# The word builders' shared C (``QUADS_C``, ``QUADS_NEON_C``, formatted with them): the prologue with the
# one-input-channel case (4 taps of a row per word, scalar) and the scalar tail after the vector loops.
_QUADS_HEAD = """  const uint8_t flip = {flip};
  const {T}* rows[4] = {{r0, r1, r2, r3}};
  /* The scalar loops read each row at a position inside it (a NULL row: its stand-in's only one) and select the
     fill outside: no load under a condition (issue 13: gcc 12.2 -O3 made masked loads of the guarded form). */
  const {T} none = 0;
  const {T}* src[4];
  long last[4];
  for (int q = 0; q < 4; ++q) {{
    src[q] = rows[q] ? rows[q] : &none;
    last[q] = rows[q] ? len - 1 : 0;
  }}
  long j = 0;
  if (shift) {{ /* one row's 4 taps per word: row q read at i + q * shift, i = first + j * step */
    /* [lo, hi): the j where every row's tap lies inside, read with no select (a NULL row reads a stand-in that
       gives the fill); the j before and after read inside and select. */
    const {T} blank = ({T})(uint8_t)(fill ^ flip);
    const {T}* base[4];
    long off[4], mul[4], lo = 0, hi = n, flo = n, fhi = 0; /* [0, flo) and [fhi, n): every tap outside, the fill */
    for (int q = 0; q < 4; ++q) {{
      base[q] = rows[q] ? rows[q] : &blank;
      off[q] = rows[q] ? first + q * shift : 0;
      mul[q] = rows[q] ? step : 0;
      if (!rows[q]) continue;
      const long a = off[q];
      const long lq = a >= 0 ? 0 : (-a + step - 1) / step, hq = len - 1 - a >= 0 ? (len - 1 - a) / step + 1 : 0;
      if (lq > lo) lo = lq;
      if (hq < hi) hi = hq;
      if (lq < flo) flo = lq;
      if (hq > fhi) fhi = hq;
    }}
    if (lo > n) lo = n;
    if (hi < lo) hi = lo;
    if (flo > lo) flo = lo;
    if (fhi < hi) fhi = hi;
    if (fhi > n) fhi = n;
    memset(dst, fill, (size_t)(4 * flo));
    for (j = flo; j < n; ++j) {{
      if (j == fhi) {{
        memset(dst + 4 * j, fill, (size_t)(4 * (n - j)));
        break;
      }}
      if (j == lo) {{
        const {T}* p0 = base[0] + off[0];
        const {T}* p1 = base[1] + off[1];
        const {T}* p2 = base[2] + off[2];
        const {T}* p3 = base[3] + off[3];
        const long m0 = mul[0], m1 = mul[1], m2 = mul[2], m3 = mul[3];
        if (step == 1 && m0 == 1 && m1 == 1 && m2 == 1) {{ /* stride 1: contiguous rows, vectorised */
          if (m3 == 1)
            for (; j < hi; ++j) {{
              dst[4 * j] = (uint8_t)((uint8_t)p0[j] ^ flip);
              dst[4 * j + 1] = (uint8_t)((uint8_t)p1[j] ^ flip);
              dst[4 * j + 2] = (uint8_t)((uint8_t)p2[j] ^ flip);
              dst[4 * j + 3] = (uint8_t)((uint8_t)p3[j] ^ flip);
            }}
          else if (!rows[3]) /* a 3-tap kernel row: the fourth byte is the fill */
            for (; j < hi; ++j) {{
              dst[4 * j] = (uint8_t)((uint8_t)p0[j] ^ flip);
              dst[4 * j + 1] = (uint8_t)((uint8_t)p1[j] ^ flip);
              dst[4 * j + 2] = (uint8_t)((uint8_t)p2[j] ^ flip);
              dst[4 * j + 3] = fill;
            }}
        }}
        for (; j < hi; ++j) {{
          dst[4 * j] = (uint8_t)((uint8_t)p0[j * m0] ^ flip);
          dst[4 * j + 1] = (uint8_t)((uint8_t)p1[j * m1] ^ flip);
          dst[4 * j + 2] = (uint8_t)((uint8_t)p2[j * m2] ^ flip);
          dst[4 * j + 3] = (uint8_t)((uint8_t)p3[j * m3] ^ flip);
        }}
        if (j == n) break;
      }}
      const long i = first + j * step;
      for (int q = 0; q < 4; ++q) {{
        const long iq = i + q * shift;
        const uint8_t v = (uint8_t)((uint8_t)src[q][(unsigned long)iq < (unsigned long)last[q] ? iq : last[q]] ^ flip);
        dst[4 * j + q] = iq >= 0 && iq < len && rows[q] ? v : fill;
      }}
    }}
    return;
  }}
"""
_QUADS_TAIL = """  /* j >= end: past the row's end, the fill; before it, each row read inside and the value selected */
  long end = len - first > 0 ? (len - first + step - 1) / step : 0;
  if (end > n) end = n;
  for (; j < end; ++j) {{
    const long i = first + j * step;
    const int in = i >= 0 && i < len;
    for (int q = 0; q < 4; ++q) {{
      const uint8_t v = (uint8_t)((uint8_t)src[q][(unsigned long)i < (unsigned long)last[q] ? i : last[q]] ^ flip);
      dst[4 * j + q] = in && rows[q] ? v : fill;
    }}
  }}
  if (j < n) memset(dst + 4 * j, fill, (size_t)(4 * (n - j)));
}}
#endif
"""

QUADS_C = """
#if defined(__AVX2__)
/* dst[j] = the 4 bytes u(r0[i]), u(r1[i]), u(r2[i]), u(r3[i]), i = first + j * step, for j < n, where u(v) = v ^ flip
   (int8: v + 128 as unsigned; uint8: v); fill (the zero point as unsigned: the centred zero) where i lies outside
   [0, len) or the row is NULL (a channel past the group's). shift != 0: row q is read at i + q * shift (4 taps of
   one input row per word). */
static void opfuse_q8_quads_{s}(uint8_t* restrict dst, const {T}* r0, const {T}* r1, const {T}* r2, const {T}* r3,
                                long first, long n, long step, long len, uint8_t fill, long shift) {{
""" + _QUADS_HEAD + """\
  if (step <= 2) {{
    const __m128i f = _mm_set1_epi8((char)flip), fv = _mm_set1_epi8((char)fill);
    const __m128i even = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, -1, -1, -1, -1, -1, -1, -1, -1);
    for (; j < n && first + step * j < 0; ++j) dst[4 * j] = dst[4 * j + 1] = dst[4 * j + 2] = dst[4 * j + 3] = fill;
    if (step == 1) {{
      for (; j + 16 <= n && first + j + 16 <= len; j += 16) {{
        __m128i v[4];
        for (int q = 0; q < 4; ++q)
          v[q] = rows[q] ? _mm_xor_si128(_mm_loadu_si128((const __m128i*)(rows[q] + first + j)), f) : fv;
        const __m128i ab0 = _mm_unpacklo_epi8(v[0], v[1]), ab1 = _mm_unpackhi_epi8(v[0], v[1]);
        const __m128i cd0 = _mm_unpacklo_epi8(v[2], v[3]), cd1 = _mm_unpackhi_epi8(v[2], v[3]);
        _mm_storeu_si128((__m128i*)(dst + 4 * j), _mm_unpacklo_epi16(ab0, cd0));
        _mm_storeu_si128((__m128i*)(dst + 4 * j + 16), _mm_unpackhi_epi16(ab0, cd0));
        _mm_storeu_si128((__m128i*)(dst + 4 * j + 32), _mm_unpacklo_epi16(ab1, cd1));
        _mm_storeu_si128((__m128i*)(dst + 4 * j + 48), _mm_unpackhi_epi16(ab1, cd1));
      }}
    }} else {{
      for (; j + 8 <= n && first + 2 * j + 16 <= len; j += 8) {{
        __m128i v[4];
        for (int q = 0; q < 4; ++q)
          v[q] = rows[q] ? _mm_xor_si128(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(rows[q] + first + 2 * j)),
                                                          even), f) : fv;
        const __m128i ab = _mm_unpacklo_epi8(v[0], v[1]), cd = _mm_unpacklo_epi8(v[2], v[3]);
        _mm_storeu_si128((__m128i*)(dst + 4 * j), _mm_unpacklo_epi16(ab, cd));
        _mm_storeu_si128((__m128i*)(dst + 4 * j + 16), _mm_unpackhi_epi16(ab, cd));
      }}
    }}
  }}
""" + _QUADS_TAIL


DW_ROWS_C = """
#if defined(__AVX2__)
/* One row of the depthwise image with the channels innermost: dst[c * 8 + j] = src[j * plane + c] - zp for
   c < W and channels j < nch (the lanes of the others get -zp: their weights are 0). 8 columns of 8
   channels at a time through an 8 x 8 byte transpose, where the 8-byte loads stay before end. */
static void opfuse_q8_dw_row_{s}(int32_t* restrict dst, const {T}* src, long plane, long nch, long W, int32_t zp,
                                 const {T}* end) {{
  const __m256i z = _mm256_set1_epi32(zp);
  long c = 0;
  for (; c < W && src + (nch - 1) * plane + c + 8 <= end; c += 8) {{
    __m128i v[8];
    for (int j = 0; j < 8; ++j)
      v[j] = j < nch ? _mm_loadl_epi64((const __m128i*)(src + j * plane + c)) : _mm_setzero_si128();
    __m128i w[4];
    opfuse_q8_transpose_8x8(v, w);
    const long n = W - c < 8 ? W - c : 8;
    for (long k = 0; k < n; ++k) {{
      const __m128i b = (k & 1) ? _mm_srli_si128(w[k >> 1], 8) : w[k >> 1];
      _mm256_storeu_si256((__m256i*)(dst + (c + k) * 8), _mm256_sub_epi32(_mm256_cvt{cvt}_epi32(b), z));
    }}
  }}
  for (; c < W; ++c)
    for (long j = 0; j < 8; ++j) dst[c * 8 + j] = j < nch ? (int32_t)src[j * plane + c] - zp : -zp;
}}
#endif
"""


def _pairs_helper(kc, dtype: np.dtype) -> str:
    s, t, cvt = ("s8", "int8_t", "epi8") if dtype == np.int8 else ("u8", "uint8_t", "epu8")
    kc.program.require_helper(f"opfuse_q8_pairs_{s}", PAIRS_C.format(s=s, T=t, cvt=cvt))
    return s


@dataclass
class _Geometry:
    """The padded, phase-split image every tap reads in place (see the module docstring)."""
    H: int
    W: int
    OH: int
    OW: int
    KH: int
    KW: int
    SH: int
    SW: int
    DH: int
    DW: int
    PT: int
    PL: int
    NB: int   # positions per tile (a multiple of LANES)
    Hp: int = 0
    Wq: int = 0

    def __post_init__(self):
        ow_r = -(-self.OW // self.NB) * self.NB
        self.Hp = (self.OH - 1) * self.SH + (self.KH - 1) * self.DH + 1
        self.Wq = ow_r + (self.KW - 1) * self.DW // self.SW

    @property
    def plane(self) -> int:
        """int32 words of one channel (pair) plane: rows x phases x columns."""
        return self.Hp * self.SW * self.Wq

    def tap(self, kh: int, kw: int) -> int:
        """Word offset of tap ``(kh, kw)`` from the tile's first word."""
        return (kh * self.DH * self.SW + (kw * self.DW) % self.SW) * self.Wq + (kw * self.DW) // self.SW


def _geometry(node: Node, NB: int, flat_ok: bool) -> tuple[_Geometry, bool]:
    geo, _ = conv_geometry(node)
    _, _, H, W = node.input(0).shape
    OH, OW = node.outputs[0].shape[2:]
    (KH, KW), (SH, SW), (DH, DW) = geo.kernel, geo.strides, geo.dilations
    PT, PL = geo.pads_begin
    flat = (flat_ok and KH == KW == 1 and SH == SW == 1 and not any(geo.pads_begin) and not any(geo.pads_end)
            and OH == H and OW == W)
    if flat:  # one row of every position: X itself
        return _Geometry(1, H * W, 1, H * W, 1, 1, 1, 1, 1, 1, 0, 0, NB), True
    return _Geometry(H, W, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, NB), False


def _block(mg: int, row: int, K2: int, blocks: tuple = BLOCKS, lanes: int = LANES) -> tuple[int, int]:
    """(MR, NV) of least estimated instructions: per channel pair and tap, NV loads, MR broadcasts and
    2 MR NV multiply-adds per block, over the blocks covering ``mg`` channels and ``row`` positions
    (remainders computed in full); ``lanes`` positions per vector."""
    def cost(b):
        mr, nv = b
        return -(-mg // mr) * -(-row // (lanes * nv)) * (nv + mr + 2 * mr * nv)
    return min(blocks, key=cost)


def _emit_build_row(w, fn: str, dst: str, rows: tuple[str, str] | str, g: _Geometry, zp: int, ph: str) -> None:
    """One padded row (for every column phase) of the pair image (two source rows) or of a plane."""
    first = f"{ph} - {g.PL}"
    if isinstance(rows, tuple):
        w.line(f"{fn}((int16_t*)({dst}), {rows[0]}, {rows[1]}, {first}, {g.Wq}, {g.SW}, {g.W}, {zp});")
    else:
        w.line(f"{fn}({dst}, {rows}, {first}, {g.Wq}, {g.SW}, {g.W}, {zp});")


def _centred_bound(q: QInput) -> int:
    """The largest ``|int32(q) - zp|`` of the 8-bit tensor's type (0 in the padding)."""
    info = np.iinfo(q.q.dtype)
    return max(abs(int(info.min) - q.zp), abs(int(info.max) - q.zp))


class DoubleRequant(NamedTuple):
    """The requantization in double (``exact_in_double``): per channel ``mult 2^-shift`` and ``rmult 2^-shift``
    (None without a residual), and the C function: ``opfuse_q8_requantize_ds`` (no clamp: the saturating packs
    narrowing to the output type clamp) where ``[lo, hi]`` is the output type's range and every channel's
    ``|acc * scale| + |res * rscale| < SATURATING_BOUND``, ``opfuse_q8_requantize_d`` (clamped in double)
    elsewhere."""
    scale: np.ndarray
    rscale: np.ndarray | None
    fn: str


# ``_emit_channel``'s function for a dequantizing epilogue (``QEpilogue.scale``): a float multiply, no requantization.
DEQUANTIZE = "dequantize"

# |value before rounding| below which the rounded value plus a zero point (|zp| <= 255) is an int32 with no
# overflow, so that the saturating int32 -> 16 -> 8-bit packs may do the clamp to the type's range.
SATURATING_BOUND = 1 << 30


def exact_in_double(kc, ep: QEpilogue, x: QInput, wabs: np.ndarray) -> DoubleRequant | None:
    """The per-channel doubles ``(mult 2^-shift, rmult 2^-shift)`` of the requantization in double
    (``opfuse_q8_requantize_d``, or ``_ds`` unclamped: ``DoubleRequant``) where it is exact for every input:
    with ``wabs`` the sum of a channel's ``|weights|``, its accumulators (bias added) are bounded by
    ``B = wabs |x|max + |bias|``; ``B < 2^31`` (the int32 sum does not wrap) and ``B mult + |res|max rmult < 2^53``
    make the products and their sum exact doubles. None where a channel fails it (long sums of wide weights) or
    the option is off (``CodegenOptions.int8_requantize_double``): the 64-bit integer path."""
    if not kc.program.options.int8_requantize_double or ep.scale is not None:
        return None
    xb, rb = _centred_bound(x), _centred_bound(ep.res) if ep.res is not None else 0
    rmult = ep.rmult if ep.rmult is not None else np.zeros(len(ep.mult), np.int64)
    info = np.iinfo(ep.out.dtype)
    saturating = (ep.lo, ep.hi) == (int(info.min), int(info.max))
    rows = zip(wabs.tolist(), ep.bias.tolist(), ep.mult.tolist(), rmult.tolist(), ep.shift.tolist(), strict=True)
    for a, b, m, r, s in rows:
        bound = int(a) * xb + abs(int(b))
        total = bound * int(m) + rb * int(r)
        if bound >= 1 << 31 or total >= 1 << 53:
            return None
        saturating = saturating and total << max(0, -int(s)) < SATURATING_BOUND << max(0, int(s))  # total 2^-s
    unit = np.ldexp(1.0, -ep.shift.astype(np.int64))  # 2^-shift, exact
    scale = ep.mult.astype(np.float64) * unit
    rscale = ep.rmult.astype(np.float64) * unit if ep.rmult is not None else None
    return DoubleRequant(scale, rscale, "opfuse_q8_requantize_ds" if saturating else "opfuse_q8_requantize_d")


def _emit_channel(kc, ep: QEpilogue, oc: str, bias_values: np.ndarray | None = None,
                  dscale: DoubleRequant | None = None) -> tuple[str, str, str]:
    """The requantization constants and the bias (``ep.bias`` unless ``bias_values``) of channel ``oc`` in
    vector registers, in double where ``dscale`` (``exact_in_double``) is given: (chan, bias, the
    requantizing function)."""
    w = kc.w
    ch = kc.tmp("ch")
    if bias_values is None:
        bias = kc.const_array(("q8_bias", ep.out.name), ep.bias, f"{ep.out.name}_bias", np.int32)
    else:
        bias = kc.const_array(("q8_bias_quads", ep.out.name), bias_values, f"{ep.out.name}_qbias", np.int32)
    if ep.scale is not None:  # dequantized: the channel's float scale in every lane
        sc = kc.const_array(("q8_dqscale", ep.out.name), ep.scale, f"{ep.out.name}_dqscale", np.float32)
        w.line(f"const __m256 {ch} = _mm256_set1_ps({sc}[{oc}]);")
        fn = DEQUANTIZE
    elif dscale is not None:
        sc = kc.const_array(("q8_scale", ep.out.name), dscale[0], f"{ep.out.name}_scale", np.float64)
        rs = "0.0"
        if dscale[1] is not None:
            rs = kc.const_array(("q8_rscale", ep.out.name), dscale[1], f"{ep.out.name}_rscale", np.float64) + f"[{oc}]"
        w.line(f"const opfuse_q8_dchan {ch} = opfuse_q8_dchan_init({sc}[{oc}], {rs}, {ep.zp}, {ep.lo}, {ep.hi});")
        fn = dscale.fn
    else:
        mult = kc.const_array(("q8_mult", ep.out.name), ep.mult, f"{ep.out.name}_mult", np.int32)
        shift = kc.const_array(("q8_shift", ep.out.name), ep.shift, f"{ep.out.name}_shift", np.int32)
        rmult = "0"
        if ep.rmult is not None:
            rm = kc.const_array(("q8_rmult", ep.out.name), ep.rmult, f"{ep.out.name}_rmult", np.int64)
            rmult = f"{rm}[{oc}]"
        w.line(f"const opfuse_q8_chan {ch} = opfuse_q8_chan_init({mult}[{oc}], {shift}[{oc}], {rmult}, {ep.zp}, "
               f"{ep.lo}, {ep.hi});")
        fn = "opfuse_q8_requantize"
    b = kc.tmp("bias")
    w.line(f"const __m256i {b} = _mm256_set1_epi32({bias}[{oc}]);")
    return ch, b, fn


def _emit_epilogue(kc, ep: QEpilogue, accs: list[str], chan: tuple[str, str, str], out_row: str, ow0: str,
                   valid: str, res_row: str | None) -> None:
    """Requantize and store ``accs`` (vectors of 8 consecutive positions of one channel, ``chan``'s); with a tail
    after the Requantize, the tail on them in one loop (``_finish_tail``: gcc can vectorise it)."""
    w = kc.w
    unsigned = int(ep.out.dtype == np.uint8)
    ch, b, fn = chan
    for v, acc in enumerate(accs):
        n = kc.tmp("n")
        w.line(f"const long {n} = {valid} - {ow0} - {v * LANES};")
        with w.block(f"if ({n} > 0)"):
            res = "NULL"
            if ep.res is not None and res_row is not None:
                r = kc.tmp("res")
                rs = "s8" if ep.res.q.dtype == np.int8 else "u8"
                w.line(f"const __m256i {r} = opfuse_q8_load_{rs}({res_row} + {ow0} + {v * LANES}, {n}, {ep.res.zp});")
                res = f"&{r}"
            if fn == DEQUANTIZE:  # float(acc + bias) * scale, as the reference's Cast and Mul round them
                w.line(f"opfuse_q8_store_f32({out_row} + {ow0} + {v * LANES}, _mm256_mul_ps(_mm256_cvtepi32_ps("
                       f"_mm256_add_epi32({acc}, {b})), {ch}), {n});")
                continue
            w.line(f"opfuse_q8_store({out_row} + {ow0} + {v * LANES}, {fn}("
                   f"_mm256_add_epi32({acc}, {b}), &{ch}, {res}, {unsigned}), {n});")
    k = len(accs) * LANES
    _finish_tail(kc, ep, out_row, ow0, f"({valid} - {ow0} < {k} ? {valid} - {ow0} : {k})")


def _finish_tail(kc, ep: QEpilogue, out_row: str, at: str, n: str) -> None:
    """With a tail after the Requantize (``QEpilogue.finish``): the tail on the ``n`` requantized values of row
    ``out_row`` (``_out_rows``'s scratch) from column ``at``, one at a time, storing the stage's outputs."""
    if ep.finish is None:
        return
    j = kc.tmp("j")
    with kc.w.block(f"for (long {j} = {at}; {j} < {at} + {n}; ++{j})"):
        ep.finish(ep.rows[out_row](j), f"{out_row}[{j}]")


def _out_rows(kc, ep: QEpilogue, img: str, oc: str, row: str, shape: tuple) -> tuple[str, str | None]:
    """Pointers to the output's (and the residual's) row ``row`` of channel ``oc``."""
    _, OC, OH, OW = shape
    w = kc.w
    out = kc.tmp("orow")
    off = f"(({img} * {OC} + {oc}) * {OH} + {row}) * {OW}"
    if ep.finish is not None:  # requantized into this row, then the tail element by element (``_finish_tail``)
        w.line(f"{c_type(ep.out.dtype)} {out}[{OW}];")
        full = ep.out.shape
        if shape == full:
            ep.rows[out] = lambda col: Index(full, (img, oc, row, col))
        else:  # a flat row of all OH x OW positions
            ep.rows[out] = lambda col: Index.loops(full, ((0, 1, img), (1, 2, oc), (2, 4, col)))
    else:
        # no restrict: the residual may share the output's storage (an in-place plan), read before written
        w.line(f"{c_type(ep.out.dtype)}* {out} = {kc.ptr(ep.out, write=True)} + {off};")
    res = None
    if ep.res is not None:
        res = kc.tmp("rrow")
        w.line(f"const {c_type(ep.res.q.dtype)}* {res} = {kc.ptr(ep.res.q)} + {off};")
    return out, res


def lower_host_int8_conv(kc, ev, stage: Stage, operands: tuple[QInput, QEpilogue]) -> None:
    """The AVX2 kernel under ``#if HOST_GUARD``, plain C over the same packed weights under ``#else`` (a
    compiler without AVX2): one copy of the weights, laid out for the resolved ``CodegenOptions.vector_isa``.
    The report's notes describe the vector kernel."""
    node = stage.anchor_node
    x, ep = operands
    _, G = conv_geometry(node)
    C, OC = node.input(0).shape[1], node.outputs[0].shape[1]
    w = kc.w
    if kc.program.options.vector_isa == "neon":  # AdvSIMD on aarch64 (sdot with the dot product), plain C otherwise
        w.line(f"#if {NEON_GUARD}")
        depthwise = C // G == 1 and OC // G == 1
        portable = neon_depthwise(kc, ev, node, x, ep) if depthwise else neon_gemm(kc, ev, node, x, ep, G)
        w.line("#else")
        _portable(kc, node, x, ep, G, portable)
        w.line("#endif")
        return
    kc.program.require_helper(HELPER, HELPER_C)
    w.line(f"#if {HOST_GUARD}")
    if C // G == 1 and OC // G == 1:
        opts = kc.program.options
        geo, _ = conv_geometry(node)
        below = opts.int8_depthwise_channels_below
        if max(geo.strides) > 1:
            below = max(below, opts.int8_depthwise_strided_channels_below)
        if node.outputs[0].shape[3] < below:
            portable = _depthwise_channels(kc, ev, node, x, ep)
        else:
            portable = _depthwise(kc, ev, node, x, ep, _pairs_helper(kc, x.q.dtype))
    else:
        portable = _gemm(kc, ev, node, x, ep, G)
    w.line("#else")
    _portable(kc, node, x, ep, G, portable)
    w.line("#endif")


@dataclass
class _Packed:
    """How the ``#else`` branch reads the vector kernel's packed weights: ``index(grp, m, c, kh, kw)`` is the C
    index of the weight of output channel ``m`` and input channel ``c`` of group ``grp`` in ``array``, elements
    of ``bits`` bits; ``arrays``: the epilogue's per-channel constants where the vector kernel has them."""
    array: str
    bits: int
    index: Callable[[str, str, str, str, str], str]
    arrays: dict[str, str]


def _quads_zero_point(x: QInput, w: np.ndarray) -> int | None:
    """The unsigned zero point of the u8 x s8 quads (vpdpbusd), or None where they do not apply: weights
    beyond int8, or a zero point that is no 8-bit value of the input's type."""
    if w.min(initial=0) < -128 or w.max(initial=0) > 127:
        return None
    zu = x.zp + 128 if x.q.dtype == np.int8 else x.zp
    return zu if 0 <= zu <= 255 else None


def _gemm(kc, ev, node: Node, x: QInput, ep: QEpilogue, G: int) -> _Packed:
    """The u8 x s8 quads kernel (4 channels per 32-bit word: ``vpdpbusd`` with AVX512-VNNI, two ``vpmaddwd``
    with AVX2 alone) where the build targets AVX-512 (``vector_isa``) and the weights fit int8; the int16 pairs
    kernel otherwise (``vpmaddwd``, ``vpdpwssd`` with AVX512-VNNI). One packed copy of the weights, the one
    the resolved ISA's kernel reads."""
    wt = ev.static[id(node.input(1))].astype(np.int64)
    quads = kc.program.options.vector_isa == "avx512"
    zu = _quads_zero_point(x, wt) if quads else None
    return _gemm_words(kc, ev, node, x, ep, G, zu)


def _weights_outer(weight_words: int, image_words: int) -> bool:
    """Loop over blocks of output channels outside the tiles of positions: whichever of the weights and the
    image is the larger is walked once, in the outer loop; the other (a block of MR channels' weights, or a
    tile's words) is reread from cache for every iteration."""
    return weight_words > image_words


def _weight_words(wt: np.ndarray, g: _Geometry, MB: int, MR: int, CP: int, per: int, KWw: int, tap_words: bool,
                  dtype) -> np.ndarray:
    """A conv's weights ``wt`` (groups x channels x input channels x taps) as the int32 words the word GEMMs
    read: ``[group][channel block][word][kh][kw][r]``, each word ``per`` input channels' weights of type
    ``dtype`` (int16 pairs, int8 quads), or with ``tap_words`` (one input channel) ``[group][channel
    block][kh][word][r]``, each word 4 taps of a kernel row; MB blocks of MR channels, zero past the last."""
    G, mg, cg = wt.shape[:3]
    if tap_words:
        packed = np.zeros((G, MB * MR, g.KH, KWw * per), np.int8)
        packed[:, :mg, :, :g.KW] = wt.reshape(G, mg, g.KH, g.KW)
        packed = packed.reshape(G, MB, MR, g.KH, KWw, per).transpose(0, 1, 3, 4, 2, 5)
    else:
        packed = np.zeros((G, MB * MR, per * CP, g.KH * g.KW), dtype)
        packed[:, :mg, :cg, :] = wt
        packed = packed.reshape(G, MB, MR, CP, per, g.KH * KWw).transpose(0, 1, 3, 5, 2, 4)  # g mb word tap r ch.
    return np.ascontiguousarray(packed).view(np.int32).reshape(-1)


@dataclass(frozen=True)
class _Image:
    """The word image a word GEMM reads: geometry ``g``, the input's C x H x W, ``cg`` channels per group
    in ``CP`` words of ``per``, ``flat`` (one row per plane), ``tap_words`` (4 taps of a row per word), at
    ``xoff`` in the scratch."""
    g: _Geometry
    C: int
    H: int
    W: int
    cg: int
    CP: int
    per: int
    flat: bool
    tap_words: bool
    xoff: int


def _emit_word_image(kc, im: _Image, q: Value, img: str, grp: str, names: tuple[str, str, str, str],
                     build_row: Callable[[str, list[str], str], None]) -> None:
    """Inside the loop over images and groups: the image of words, built once per image and group into
    thread 0's scratch (shared), every padded row of ``per`` input channels (or of one channel, read 4 taps
    apart) and column phase written by ``build_row(dst, rows)``, the rows' pointers NULL in the padding."""
    w, g = kc.w, im.g
    xp, cp, r, ph = names
    C, H, W, per = im.C, im.H, im.W, im.per
    qp, ct = kc.ptr(q), c_type(q.dtype)
    w.line(f"int32_t* restrict {xp} = (int32_t*)(scratch + {im.xoff});  /* shared: thread 0's scratch */")
    kc.parallel_for(im.CP * g.plane * 4)
    with w.block(f"for (long {cp} = 0; {cp} < {im.CP}; ++{cp})"):
        c0 = kc.tmp("c")
        w.line(f"const long {c0} = {grp} * {im.cg} + {per} * {cp};")
        with w.block(f"for (long {r} = 0; {r} < {g.Hp}; ++{r})"):
            ih = kc.tmp("ih")
            w.line(f"const long {ih} = {r} - {g.PT};")
            rows = [kc.tmp("row") for _ in range(per)]
            base = f"{qp} + (({img} * {C} + {c0}) * {H} + {ih}) * {W}" if not im.flat else \
                f"{qp} + ({img} * {C} + {c0}) * {H * W}"
            inside = f"{ih} >= 0 && {ih} < {g.H}"
            for k, row in enumerate(rows):
                if im.tap_words:  # the same row, read 4 taps apart
                    w.line(f"const {ct}* {row} = {inside} ? {base} : NULL;")
                    continue
                cond = inside if k == 0 else f"{inside} && {per} * {cp} + {k} < {im.cg}"
                w.line(f"const {ct}* {row} = {cond} ? {base} + {k * H * W} : NULL;")
            with w.block(f"for (long {ph} = 0; {ph} < {g.SW}; ++{ph})"):
                build_row(f"{xp} + (({cp} * {g.Hp} + {r}) * {g.SW} + {ph}) * {g.Wq}", rows, ph)


@contextmanager
def _word_tiles(kc, im: _Image, q: Value, N: int, G: int, mg: int, MB: int, MR: int, KWw: int, wq: str,
                build_row: Callable[[str, list[str], str], None]) -> Iterator[tuple[str, ...]]:
    """The word GEMMs' loops: per image and group the word image (``_emit_word_image``), then the output tiles
    (NB positions of a row) x the blocks of MR of the group's ``mg`` channels, in the order that keeps the
    larger of the weights and the image in cache (``_weights_outer``). Yields, at the tile's depth,
    ``(img, grp, mb, oh, ow0, xt, wp)``: the tile's first word and the channel block's first weight word."""
    w, g, CP = kc.w, im.g, im.CP
    taps = g.KH * KWw
    b, cp, r, ph = kc.tmp("b"), kc.tmp("cp"), kc.tmp("r"), kc.tmp("ph")
    xp = kc.tmp("xp")
    with w.block(f"for (long {b} = 0; {b} < {N * G}; ++{b})"):
        img, grp = (f"({b} / {G})", f"({b} % {G})") if G > 1 else (b, "0")
        _emit_word_image(kc, im, q, img, grp, (xp, cp, r, ph), build_row)
        tiles_w = -(-g.OW // g.NB)
        t, mb = kc.tmp("t"), kc.tmp("mb")
        kc.parallel_for(g.OH * tiles_w * mg * CP * taps * 2 * g.NB)
        weights_outer = _weights_outer(MB * MR * CP * taps, CP * g.plane)
        loops = [f"for (long {t} = 0; {t} < {g.OH * tiles_w}; ++{t})", f"for (long {mb} = 0; {mb} < {MB}; ++{mb})"]
        with w.block(loops[weights_outer]), w.block(loops[not weights_outer]):
            oh, ow0 = kc.tmp("oh"), kc.tmp("ow")
            w.line(f"const long {oh} = {t} / {tiles_w}, {ow0} = ({t} % {tiles_w}) * {g.NB};")
            xt = kc.tmp("xt")
            w.line(f"const int32_t* {xt} = {xp} + {oh} * {g.SH * g.SW * g.Wq} + {ow0};")
            wp = kc.tmp("wp")
            w.line(f"const int32_t* {wp} = {wq} + ({grp} * {MB} + {mb}) * {CP * taps * MR};")
            yield img, grp, mb, oh, ow0, xt, wp


def _gemm_words(kc, ev, node: Node, x: QInput, ep: QEpilogue, G: int, zu: int | None) -> _Packed:
    """The GEMM over words of ``per`` input channels: int16 pairs (``zu`` None) or u8 quads with the unsigned
    zero point ``zu`` (the padding's value; ``zu * sum(w)`` comes off through the bias)."""
    N, C, H, W = node.input(0).shape
    out_shape = node.outputs[0].shape
    OC, OH, OW = out_shape[1:]
    cg, mg = C // G, OC // G
    per = 2 if zu is None else 4
    CP = -(-cg // per)
    probe, flat = _geometry(node, LANES, True)
    # one input channel (a first layer on a mono input): a quad holds 4 taps of a kernel row, not 4 channels
    tap_words = zu is not None and cg == 1 and probe.KW > 1
    KWw = -(-probe.KW // per) if tap_words else probe.KW  # words per kernel row
    opts = kc.program.options
    wide = zu is not None and opts.vector_isa == "avx512" and 0 < opts.int8_conv_zmm_min_row <= probe.OW
    if wide:  # 16 positions per zmm: NV counts the epilogue's vectors of 8 (two per zmm)
        MR, NV16 = _block(mg, probe.OW, CP * probe.KH * KWw, ZMM_BLOCKS, 2 * LANES)
        NV = 2 * NV16
    else:
        blocks = BLOCKS_AVX512 if opts.vector_isa == "avx512" else BLOCKS
        MR, NV = _block(mg, probe.OW, CP * probe.KH * KWw, blocks)
    g, _ = _geometry(node, LANES * NV, True)
    MB = -(-mg // MR)
    taps = g.KH * KWw
    wt = ev.static[id(node.input(1))].astype(np.int64).reshape(G, mg, cg, g.KH * g.KW)
    words = _weight_words(wt, g, MB, MR, CP, per, KWw, tap_words, np.int16 if zu is None else np.int8)
    kind = "pairs" if zu is None else "quads"
    wq = kc.const_array((f"q8_gemm_{kind}", node.name), words, f"{node.input(1).name}_{kind}", np.int32)
    bias = None
    if zu is not None:  # sum w (u - zu) = sum w u - zu sum w: the correction joins the bias (int32, wrapping)
        corrected = ep.bias.astype(np.int64) - zu * wt.reshape(OC, -1).sum(axis=1)
        bias = ((corrected + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)
    plane = g.plane
    xoff = kc.scratch(CP * plane * 4)
    dscale = exact_in_double(kc, ep, x, np.abs(wt).reshape(OC, -1).sum(axis=1))
    if zu is None:
        kc.note(lambda name: f"int8 conv '{name}': host int16-pair GEMM, {MR} channels x {8 * NV} positions (AVX2 "
                             f"vpmaddwd, vpdpwssd with AVX512-VNNI), epilogue in vectors", node)
    else:
        words_of = ("4 taps of a kernel row" if tap_words else "4 channels") + (", 16 positions per zmm" if wide
                                                                                 else "")
        kc.note(lambda name: f"int8 conv '{name}': host u8 x s8 GEMM, {MR} channels x {8 * NV} positions, words of "
                             f"{words_of} (vpdpbusd with AVX512-VNNI, two vpmaddwd with AVX2 alone), epilogue in "
                             f"vectors", node)
    w = kc.w
    ct = c_type(x.q.dtype)
    if zu is None:
        s = _pairs_helper(kc, x.q.dtype)
    else:
        s = "s8" if x.q.dtype == np.int8 else "u8"
        flip = "0x80" if x.q.dtype == np.int8 else "0"
        kc.program.require_helper(f"opfuse_q8_quads_{s}", QUADS_C.format(s=s, T=ct, flip=flip))
    im = _Image(g, C, H, W, cg, CP, per, flat, tap_words, xoff)

    def build_row(dst: str, rows: list[str], ph: str) -> None:
        if zu is None:
            _emit_build_row(w, f"opfuse_q8_pairs_{s}", dst, (rows[0], rows[1]), g, x.zp, ph)
        else:
            w.line(f"opfuse_q8_quads_{s}((uint8_t*)({dst}), {', '.join(rows)}, {ph} - {g.PL}, {g.Wq}, "
                   f"{g.SW}, {g.W}, {zu}, {g.DW if tap_words else 0});")
    offsets = [g.tap(kh, per * kw if tap_words else kw) for kh in range(g.KH) for kw in range(KWw)]
    with _word_tiles(kc, im, x.q, N, G, mg, MB, MR, KWw, wq, build_row) as (img, grp, mb, oh, ow0, xt, wp):
        mk = zmm_micro_kernel(kc, MR, NV // 2, offsets, loaded_unsigned=True) if wide else \
            _micro_kernel(kc, MR, NV, offsets, "OPFUSE_Q8_DOT" if zu is None else "opfuse_q8_dpbusd")
        buf = kc.tmp("acc")
        w.line(f"__m256i {buf}[{MR * NV}];")
        w.line(f"{mk}({xt}, {wp}, {CP}, {plane}, {buf});")
        accs = [[f"{buf}[{i * NV + v}]" for v in range(NV)] for i in range(MR)]
        for i in range(MR):
            m = kc.tmp("m")
            w.line(f"const long {m} = {mb} * {MR} + {i};")
            guard = f"if ({m} < {mg})" if mg % MR else ""
            with w.block(guard):
                oc = kc.tmp("oc")
                w.line(f"const long {oc} = {grp} * {mg} + {m};")
                if flat:
                    orow, rrow = _out_rows(kc, ep, img, oc, "0", (N, OC, 1, OH * OW))
                else:
                    orow, rrow = _out_rows(kc, ep, img, oc, oh, out_shape)
                chan = _emit_channel(kc, ep, oc, bias, dscale)
                _emit_epilogue(kc, ep, accs[i], chan, orow, ow0, str(g.OW), rrow)
    return _Packed(wq, 16 if zu is None else 8, _word_index(MB, MR, CP, taps, per, g.KW, KWw if tap_words else 0),
                   {})


# Keeps the micro-kernels out of line (``_micro_kernel``'s docstring says why): gcc's ``noipa`` (no inlining and
# no interprocedural assumptions), clang's ``noinline``; defined once per program, by the first kernel emitted.
_OUT_OF_LINE = ("#ifndef OPFUSE_Q8_OUT_OF_LINE", "#if defined(__GNUC__) && !defined(__clang__)",
                "#define OPFUSE_Q8_OUT_OF_LINE __attribute__((noipa))", "#elif defined(__GNUC__)",
                "#define OPFUSE_Q8_OUT_OF_LINE __attribute__((noinline))", "#else", "#define OPFUSE_Q8_OUT_OF_LINE",
                "#endif", "#endif")


def _micro_kernel(kc, MR: int, NV: int, offsets: list[int], dot: str) -> str:
    """The GEMM's inner loop as a function of its own (not inlined, no constant propagated into it), shared by
    the convolutions of the same block and taps: ``acc[i * NV + v]`` (MR channels x NV vectors of 8 positions)
    = the sum over the ``words`` (``plane`` apart) and the taps (``offsets``, words from the tile's first) of
    ``dot`` (``vpdpbusd`` or the pairs' multiply-add) of the tile's words by the channel's broadcast weight
    word. Inlined beside the epilogue, or with the depth a constant, gcc 12 rewrote the loop's exit test onto
    the weight pointer and moved every accumulator twice per multiply-add (24 register moves per 12
    ``vpdpbusd`` in mobilenet_v1's pw7 loop); out of line with the depth an argument the loop is its 12
    multiply-adds, 3 loads and 4 broadcasts (pw1-pw13 shapes 0.81-0.91x the time)."""
    key = f"{MR}x{NV}|{','.join(map(str, offsets))}|{dot}"
    name = f"opfuse_q8_mk_{MR}x{NV}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    taps = len(offsets)
    lines = ["#if defined(__AVX2__)", *_OUT_OF_LINE,
             f"/* {MR} channels x {8 * NV} positions over words x {taps} taps (words: planes apart) */",
             f"OPFUSE_Q8_OUT_OF_LINE static void {name}(const int32_t* restrict xt, const int32_t* restrict wp, "
             "long words, long plane, __m256i* restrict acc) {"]
    accs = [[f"a{i}_{v}" for v in range(NV)] for i in range(MR)]
    lines += ["  __m256i " + ", ".join(f"{a} = _mm256_setzero_si256()" for a in row) + ";" for row in accs]
    lines.append(f"  for (long k = 0; k < words; ++k, wp += {taps * MR}) {{")
    lines.append("    const int32_t* xc = xt + k * plane;")
    for t, off in enumerate(offsets):
        lines.append("    {")
        lines += [f"      const __m256i x{v} = _mm256_loadu_si256((const __m256i*)(xc + {off + v * LANES}));"
                  for v in range(NV)]
        for i in range(MR):
            lines.append(f"      const __m256i w{i} = _mm256_set1_epi32(wp[{t * MR + i}]);")
            lines += [f"      {accs[i][v]} = {dot}({accs[i][v]}, x{v}, w{i});" for v in range(NV)]
        lines.append("    }")
    lines.append("  }")
    lines += [f"  acc[{i * NV + v}] = {accs[i][v]};" for i in range(MR) for v in range(NV)]
    lines += ["}", "#endif", ""]
    return kc.program.require_helper(name, "\n".join(lines))


def zmm_micro_kernel(kc, MR: int, NV: int, offsets: list[int], loaded_unsigned: bool) -> str:
    """``_micro_kernel`` on zmm for the u8 x s8 quads: ``acc`` (MR x 16 NV lanes as 2 NV ymm a row: the layout of
    ``_micro_kernel``'s) = the sum over the ``words`` (``plane`` apart) and taps (``offsets``) of the loaded words
    (16 consecutive per vector) times each row's broadcast word, ``vpdpbusd`` on zmm where the compiler has
    AVX512-VNNI. ``loaded_unsigned``: the loaded words are the u8 operand (a convolution's image) or the s8 one (a
    matmul's weight panel, its rows' activations broadcast). Without AVX512-VNNI the same sums on ymm
    (``opfuse_q8_dpbusd``: two ``vpmaddwd`` with AVX2 alone), a loop the compiler may keep in memory where its
    accumulators outnumber the registers. Out of line, as ``_micro_kernel`` is and for the same reason."""
    key = f"zmm|{MR}x{NV}|{','.join(map(str, offsets))}|{int(loaded_unsigned)}"
    name = f"opfuse_q8_mk16_{MR}x{NV}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    taps = len(offsets)
    accs = [[f"a{i}_{v}" for v in range(NV)] for i in range(MR)]

    def args(x: str, w: str) -> str:
        return f"{x}, {w}" if loaded_unsigned else f"{w}, {x}"
    lines = ["#if defined(__AVX2__)", *_OUT_OF_LINE,
             f"/* {MR} rows x {16 * NV} lanes over words x {taps} taps (words: planes apart), zmm */",
             f"OPFUSE_Q8_OUT_OF_LINE static void {name}(const int32_t* restrict xt, const int32_t* restrict wp, "
             "long words, long plane, __m256i* restrict acc) {", f"#if {ZMM_GUARD}"]
    lines += ["  __m512i " + ", ".join(f"{a} = _mm512_setzero_si512()" for a in row) + ";" for row in accs]
    lines.append(f"  for (long k = 0; k < words; ++k, wp += {taps * MR}) {{")
    lines.append("    const int32_t* xc = xt + k * plane;")
    for t, off in enumerate(offsets):
        lines.append("    {")
        lines += [f"      const __m512i x{v} = _mm512_loadu_si512((const void*)(xc + {off + 16 * v}));"
                  for v in range(NV)]
        for i in range(MR):
            lines.append(f"      const __m512i w{i} = _mm512_set1_epi32(wp[{t * MR + i}]);")
            lines += [f"      {accs[i][v]} = _mm512_dpbusd_epi32({accs[i][v]}, {args(f'x{v}', f'w{i}')});"
                      for v in range(NV)]
        lines.append("    }")
    lines.append("  }")
    lines += [f"  _mm512_storeu_si512((void*)(acc + {(i * NV + v) * 2}), {accs[i][v]});" for i in range(MR)
              for v in range(NV)]
    offs = "{" + ", ".join(map(str, offsets)) + "}"
    lines += ["#else",
              f"  static const long offs[{taps}] = {offs};",
              f"  for (long j = 0; j < {MR * 2 * NV}; ++j) acc[j] = _mm256_setzero_si256();",
              f"  for (long k = 0; k < words; ++k, wp += {taps * MR}) {{",
              "    const int32_t* xc = xt + k * plane;",
              f"    for (long t = 0; t < {taps}; ++t)",
              f"      for (long i = 0; i < {MR}; ++i) {{",
              f"        const __m256i w = _mm256_set1_epi32(wp[t * {MR} + i]);",
              f"        for (long j = 0; j < {2 * NV}; ++j) {{",
              "          const __m256i x = _mm256_loadu_si256((const __m256i*)(xc + offs[t] + 8 * j));",
              f"          acc[i * {2 * NV} + j] = opfuse_q8_dpbusd(acc[i * {2 * NV} + j], {args('x', 'w')});",
              "        }", "      }", "  }", "#endif", "}", "#endif", ""]
    return kc.program.require_helper(name, "\n".join(lines))


def _word_index(MB: int, MR: int, CP: int, taps: int, per: int, KW: int, KWw: int):
    """C index of a weight in the words ``[group][channel block][word][tap][channel MR][r]`` (``r``: the
    word's input channel; ``KWw`` > 0: words of ``per`` taps of a kernel row, ``r`` the tap in the word)."""
    def index(grp: str, m: str, c: str, kh: str, kw: str) -> str:
        word, cp, r = ((f"{kh} * {KWw} + {kw} / {per}", "0", f"{kw} % {per}") if KWw else
                       (f"{kh} * {KW} + {kw}", f"{c} / {per}", f"{c} % {per}"))
        return (f"(((({grp} * {MB} + {m} / {MR}) * {CP} + {cp}) * {taps} + {word}) * {MR} + {m} % {MR}) * {per} "
                f"+ {r}")
    return index


TAP_PAIRS_C = """
#if defined(__AVX2__)
/* dst[j] = the int16 pair (X(i), X(i + d)), i = first + j, for j < n, where X(i) = a[i] - zp inside [0, len) and
   0 outside (the padding's centred value): two taps of a kernel row d columns apart in one word. */
static void opfuse_q8_tap_pairs_{s}(int16_t* restrict dst, const {T}* a, long first, long n, long len, long d,
                                    int32_t zp) {{
  long lo = first < 0 ? -first : 0, hi = len - d - first;  /* j in [lo, hi): both values inside */
  if (lo > n) lo = n;
  if (hi > n) hi = n;
  if (hi < lo) hi = lo;
  long j = 0;
  for (; j < lo; ++j) {{
    const long i = first + j, e = i + d; /* read inside and select: no load under a condition (issue 13) */
    const int32_t va = a[(unsigned long)i < (unsigned long)(len - 1) ? i : len - 1] - zp;
    const int32_t vb = a[(unsigned long)e < (unsigned long)(len - 1) ? e : len - 1] - zp;
    dst[2 * j] = (int16_t)(i >= 0 && i < len ? va : 0);
    dst[2 * j + 1] = (int16_t)(e >= 0 && e < len ? vb : 0);
  }}
  const __m128i z = _mm_set1_epi16((short)zp);
  for (; j + 8 <= hi; j += 8) {{
    const __m128i xa = _mm_sub_epi16(_mm_cvt{cvt}_epi16(_mm_loadl_epi64((const __m128i*)(a + first + j))), z);
    const __m128i xb = _mm_sub_epi16(_mm_cvt{cvt}_epi16(_mm_loadl_epi64((const __m128i*)(a + first + j + d))), z);
    _mm_storeu_si128((__m128i*)(dst + 2 * j), _mm_unpacklo_epi16(xa, xb));
    _mm_storeu_si128((__m128i*)(dst + 2 * j + 8), _mm_unpackhi_epi16(xa, xb));
  }}
  for (; j < n; ++j) {{
    const long i = first + j, e = i + d; /* read inside and select: no load under a condition (issue 13) */
    const int32_t va = a[(unsigned long)i < (unsigned long)(len - 1) ? i : len - 1] - zp;
    const int32_t vb = a[(unsigned long)e < (unsigned long)(len - 1) ? e : len - 1] - zp;
    dst[2 * j] = (int16_t)(i >= 0 && i < len ? va : 0);
    dst[2 * j + 1] = (int16_t)(e >= 0 && e < len ? vb : 0);
  }}
}}
#endif
"""


def _depthwise(kc, ev, node: Node, x: QInput, ep: QEpilogue, s: str) -> _Packed:
    """Depthwise over planes of one channel, 8 positions of an output row per vector. At column stride 1 a plane
    word holds two taps of a kernel row (``(X(j), X(j + DW))``, int16): one
    ``vpmaddwd`` (``vpdpwssd`` with VNNI) per pair of taps, ``ceil(KW / 2)`` per kernel row (a 3x3 kernel: 6
    multiply-adds per 8 outputs instead of 9 ``vpmulld`` + ``vpaddd``; the weights are within int16, and
    ``|x| <= 383``: no pair's sum saturates); strided, a plane of int32 per column phase and one ``vpmulld``
    per tap."""
    N, C, H, W = node.input(0).shape
    out_shape = node.outputs[0].shape
    OH, OW = out_shape[2:]
    NV = 2 if OW >= 2 * LANES else 1
    g, _ = _geometry(node, LANES * NV, False)
    taps = g.KH * g.KW
    wt = ev.static[id(node.input(1))].astype(np.int32).reshape(C, taps)
    pairs = g.SW == 1  # the weights are within int16 (qconv.int8_conv_applies)
    P = -(-g.KW // 2)  # tap pairs per kernel row
    if pairs:
        packed = np.zeros((C, g.KH, 2 * P), np.int16)
        packed[:, :, :g.KW] = wt.reshape(C, g.KH, g.KW)
        wq = kc.const_array(("q8_dw_pairs", node.name), packed.reshape(-1).view(np.int32), f"{node.input(1).name}_dwp",
                            np.int32)
        ct, cvt = ("int8_t", "epi8") if x.q.dtype == np.int8 else ("uint8_t", "epu8")
        kc.program.require_helper(f"opfuse_q8_tap_pairs_{s}", TAP_PAIRS_C.format(s=s, T=ct, cvt=cvt))
    else:
        wq = kc.const_array(("q8_dw", node.name), wt, f"{node.input(1).name}_dw", np.int32)
    poff = kc.scratch(g.plane * 4)
    kind = "tap pairs of int16 (vpmaddwd)" if pairs else "int32"
    kc.note(lambda name: f"int8 depthwise '{name}': host planes of {kind}, {8 * NV} positions per pass, "
                         "epilogue in vectors", node)
    w = kc.w
    qp = kc.ptr(x.q)
    pl, r, ph = kc.tmp("pl"), kc.tmp("r"), kc.tmp("ph")
    kc.parallel_for(N * C * OH * OW * taps * 2)
    with w.block(f"for (long {pl} = 0; {pl} < {N * C}; ++{pl})"):
        img, c = f"({pl} / {C})", f"({pl} % {C})"
        xp = kc.tmp("plane")
        w.line(f"int32_t* restrict {xp} = {kc.scratch_ptr('int32_t', poff)};")
        with w.block(f"for (long {r} = 0; {r} < {g.Hp}; ++{r})"):
            ih = kc.tmp("ih")
            w.line(f"const long {ih} = {r} - {g.PT};")
            with w.block(f"for (long {ph} = 0; {ph} < {g.SW}; ++{ph})"):
                dst = f"{xp} + ({r} * {g.SW} + {ph}) * {g.Wq}"
                row = f"{qp} + ({pl} * {H} + {ih}) * {W}"
                with w.block(f"if ({ih} >= 0 && {ih} < {H})"):
                    if pairs:
                        w.line(f"opfuse_q8_tap_pairs_{s}((int16_t*)({dst}), {row}, -{g.PL}, {g.Wq}, {W}, {g.DW}, "
                               f"{x.zp});")
                    else:
                        _emit_build_row(w, f"opfuse_q8_plane_row_{s}", dst, row, g, x.zp, ph)
                w.line(f"else memset({dst}, 0, sizeof(int32_t) * {g.Wq});")
        # (kh, kw) of each weight register: a pair's first tap, or every tap
        regs = [(kh, 2 * q) for kh in range(g.KH) for q in range(P)] if pairs else \
            [(kh, kw) for kh in range(g.KH) for kw in range(g.KW)]
        wv = [kc.tmp("w") for _ in regs]
        for t_, name in enumerate(wv):
            w.line(f"const __m256i {name} = _mm256_set1_epi32({wq}[{c} * {len(regs)} + {t_}]);")
        chan = _emit_channel(kc, ep, c, None, exact_in_double(kc, ep, x, np.abs(wt).sum(axis=1)))
        oh, ow0 = kc.tmp("oh"), kc.tmp("ow")
        with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"):
            orow, rrow = _out_rows(kc, ep, img, c, oh, out_shape)
            with w.block(f"for (long {ow0} = 0; {ow0} < {OW}; {ow0} += {g.NB})"):
                xt = kc.tmp("xt")
                w.line(f"const int32_t* {xt} = {xp} + {oh} * {g.SH * g.SW * g.Wq} + {ow0};")
                accs = [kc.tmp("a") for _ in range(NV)]
                w.line("__m256i " + ", ".join(f"{a} = _mm256_setzero_si256()" for a in accs) + ";")
                for (kh, kw), wr in zip(regs, wv, strict=True):
                    for v, a in enumerate(accs):
                        xv = f"_mm256_loadu_si256((const __m256i*)({xt} + {g.tap(kh, kw) + v * LANES}))"
                        if pairs:
                            w.line(f"{a} = OPFUSE_Q8_DOT({a}, {xv}, {wr});")
                        else:
                            w.line(f"{a} = _mm256_add_epi32({a}, _mm256_mullo_epi32({xv}, {wr}));")
                _emit_epilogue(kc, ep, accs, chan, orow, ow0, str(OW), rrow)
    if pairs:
        return _Packed(wq, 16, lambda grp, m, c, kh, kw: f"({grp} * {g.KH} + {kh}) * {2 * P} + {kw}", {})
    return _Packed(wq, 32, lambda grp, m, c, kh, kw: f"{grp} * {taps} + {kh} * {g.KW} + {kw}", {})


def _lanes(arr: np.ndarray, pad, dtype) -> np.ndarray:
    """``arr`` (one value per channel) padded with ``pad`` to whole vectors of LANES channels."""
    out = np.full(-(-arr.shape[0] // LANES) * LANES, pad, dtype)
    out[:arr.shape[0]] = arr
    return out


def _emit_zero_border(kc, xp: str, size: tuple[int, int], rows: tuple[int, int], cols: tuple[int, int]) -> None:
    """Zero the padding of a ``Hp x Wp`` image of ``LANES`` int32 per position at ``xp``: the rows outside
    ``rows`` whole, the columns outside ``cols`` of the others (the interior is written after)."""
    (Hp, Wp), (r0, r1), (c0, c1) = size, rows, cols
    w = kc.w
    for a, b in ((0, r0), (r1, Hp)):
        if b > a:
            w.line(f"memset({xp} + {a * Wp * LANES}, 0, sizeof(int32_t) * {(b - a) * Wp * LANES});")
    if r1 <= r0 or (c0 <= 0 and c1 >= Wp):
        return
    r = kc.tmp("r")
    with w.block(f"for (long {r} = {r0}; {r} < {r1}; ++{r})"):
        if c0 > 0:
            w.line(f"memset({xp} + {r} * {Wp * LANES}, 0, sizeof(int32_t) * {c0 * LANES});")
        if c1 < Wp:
            w.line(f"memset({xp} + ({r} * {Wp} + {c1}) * {LANES}, 0, sizeof(int32_t) * {(Wp - c1) * LANES});")


def _depthwise_channels(kc, ev, node: Node, x: QInput, ep: QEpilogue) -> _Packed:
    """Depthwise over 8 channels per vector (small planes, where 8 positions of a row would not fill one):
    per image and block of 8 channels a padded image of int32 with the channels innermost, one ``vpmulld`` +
    ``vpaddd`` per tap and output position, the epilogue with one channel's constants per lane."""
    N, C, H, W = node.input(0).shape
    OH, OW = node.outputs[0].shape[2:]
    geo, _ = conv_geometry(node)
    (KH, KW), (SH, SW), (DH, DW) = geo.kernel, geo.strides, geo.dilations
    PT, PL = geo.pads_begin
    taps = KH * KW
    CB = -(-C // LANES)
    Hp, Wp = (OH - 1) * SH + (KH - 1) * DH + 1, (OW - 1) * SW + (KW - 1) * DW + 1
    wt = np.zeros((CB * LANES, taps), np.int32)
    wt[:C] = ev.static[id(node.input(1))].astype(np.int32).reshape(C, taps)
    wq = kc.const_array(("q8_dwc", node.name), wt.reshape(CB, LANES, taps).transpose(0, 2, 1),
                        f"{node.input(1).name}_dwc", np.int32)
    name = ep.out.name
    bias = kc.const_array(("q8_bias8", name), _lanes(ep.bias, 0, np.int32), f"{name}_bias8", np.int32)
    arrays = {"bias": bias}
    dscale = exact_in_double(kc, ep, x, np.abs(wt[:C]).sum(axis=1))
    if dscale is not None:
        scale = kc.const_array(("q8_scale8", name), _lanes(dscale[0], 0.0, np.float64), f"{name}_scale8", np.float64)
        rscale = "NULL"
        if dscale[1] is not None:
            rscale = kc.const_array(("q8_rscale8", name), _lanes(dscale[1], 0.0, np.float64), f"{name}_rscale8",
                                    np.float64)
    else:
        mult = kc.const_array(("q8_mult8", name), _lanes(ep.mult, 0, np.int32), f"{name}_mult8", np.int32)
        shift = kc.const_array(("q8_shift8", name), _lanes(ep.shift, 1, np.int32), f"{name}_shift8", np.int32)
        arrays |= {"mult": mult, "shift": shift}
        rmult = "NULL"
        if ep.rmult is not None:
            rmult = kc.const_array(("q8_rmult8", name), _lanes(ep.rmult, 0, np.int64), f"{name}_rmult8", np.int64)
            arrays["rmult"] = rmult
    off = kc.scratch(Hp * Wp * LANES * 4)
    kc.note(lambda nm: f"int8 depthwise '{nm}': host, 8 channels per vector (rows of {OW} positions), epilogue in "
                       "vectors", node)
    w = kc.w
    qp, ct = kc.ptr(x.q), c_type(x.q.dtype)
    sfx, cvt = ("s8", "epi8") if x.q.dtype == np.int8 else ("u8", "epu8")
    kc.program.require_helper(f"opfuse_q8_dw_row_{sfx}", DW_ROWS_C.format(s=sfx, T=ct, cvt=cvt))
    out = ""
    if ep.finish is None:
        out = kc.ptr(ep.out, write=True)
    unsigned = int(ep.out.dtype == np.uint8)
    blk, j, r = kc.tmp("blk"), kc.tmp("j"), kc.tmp("r")
    kc.parallel_for(N * C * OH * OW * taps * 2)
    with w.block(f"for (long {blk} = 0; {blk} < {N * CB}; ++{blk})"):
        img, c0 = kc.tmp("img"), kc.tmp("c0")
        w.line(f"const long {img} = {blk} / {CB}, {c0} = ({blk} % {CB}) * {LANES};")
        nch = kc.tmp("nch")
        w.line(f"const long {nch} = {C} - {c0} < {LANES} ? {C} - {c0} : {LANES};")
        xp = kc.tmp("xp")
        w.line(f"int32_t* restrict {xp} = {kc.scratch_ptr('int32_t', off)};")
        # the padding zero (only the border: the rows below write every column the input reaches, the lanes
        # of the channels past C included), then each channel's rows into its lane
        r0, r1 = max(0, PT), min(Hp, H + PT)
        cols = min(W, Wp - PL)  # the input columns the windows reach
        _emit_zero_border(kc, xp, (Hp, Wp), (r0, r1), (min(PL, Wp), min(Wp, PL + max(cols, 0))))
        src = kc.tmp("src")
        w.line(f"const {ct}* {src} = {qp} + ({img} * {C} + {c0}) * {H * W};")
        with w.block(f"for (long {r} = {r0}; {r} < {r1}; ++{r})"):
            w.line(f"opfuse_q8_dw_row_{sfx}({xp} + ({r} * {Wp} + {PL}) * {LANES}, {src} + ({r} - {PT}) * {W}, "
                   f"{H * W}, {nch}, {cols}, {x.zp}, {qp} + {N * C * H * W});")
        ch, b = kc.tmp("ch"), kc.tmp("bias")
        if dscale is not None:
            rs = f"{rscale} + {c0}" if dscale[1] is not None else "NULL"
            w.line(f"const opfuse_q8_dchan {ch} = opfuse_q8_dchan_lanes({scale} + {c0}, {rs}, {ep.zp}, {ep.lo}, "
                   f"{ep.hi});")
        else:
            rm = f"{rmult} + {c0}" if ep.rmult is not None else "NULL"
            w.line(f"const opfuse_q8_chan {ch} = opfuse_q8_chan_lanes({mult} + {c0}, {shift} + {c0}, {rm}, {ep.zp}, "
                   f"{ep.lo}, {ep.hi});")
        fn = "opfuse_q8_requantize" if dscale is None else dscale.fn
        w.line(f"const __m256i {b} = _mm256_loadu_si256((const __m256i*)({bias} + {c0}));")
        wv = [kc.tmp("w") for _ in range(taps)]
        for t_, nm in enumerate(wv):
            w.line(f"const __m256i {nm} = _mm256_loadu_si256((const __m256i*)({wq} + ({c0} * {taps} + {t_ * LANES})));")
        # 8 output positions (consecutive in each channel's plane, across rows) per pass: their 8 vectors of
        # 8 channels are transposed into 8 bytes per channel
        P = OH * OW
        p0, n = kc.tmp("p0"), kc.tmp("n")
        with w.block(f"for (long {p0} = 0; {p0} < {P}; {p0} += {LANES})"):
            w.line(f"const long {n} = {P} - {p0} < {LANES} ? {P} - {p0} : {LANES};")
            vs = [kc.tmp("v") for _ in range(LANES)]
            w.line(f"__m128i {', '.join(vs)};")
            for u, vname in enumerate(vs):
                with w.block(""):
                    pp, oh, ow = kc.tmp("p"), kc.tmp("oh"), kc.tmp("ow")
                    # past the plane's end (the last pass): the last position again, not stored
                    w.line(f"const long {pp} = {p0} + {u} < {P} ? {p0} + {u} : {P - 1};")
                    w.line(f"const long {oh} = {pp} / {OW}, {ow} = {pp} % {OW};")
                    xt, acc = kc.tmp("xt"), kc.tmp("acc")
                    w.line(f"const int32_t* {xt} = {xp} + ({oh} * {SH * Wp} + {ow} * {SW}) * {LANES};")
                    w.line(f"__m256i {acc} = _mm256_setzero_si256();")
                    for kh in range(KH):
                        for kw in range(KW):
                            o = (kh * DH * Wp + kw * DW) * LANES
                            w.line(f"{acc} = _mm256_add_epi32({acc}, _mm256_mullo_epi32(_mm256_loadu_si256("
                                   f"(const __m256i*)({xt} + {o})), {wv[kh * KW + kw]}));")
                    res = "NULL"
                    if ep.res is not None:
                        at = f"({img} * {C} + {c0}) * {P} + {pp}"
                        rv, rt = kc.tmp("res"), kc.tmp("rt")
                        w.line(f"int32_t {rt}[{LANES}] = {{0}};")
                        w.line(f"for (long {j} = 0; {j} < {nch}; ++{j}) {rt}[{j}] = (int32_t){kc.ptr(ep.res.q)}[{at} + "
                               f"{j} * {P}] - {ep.res.zp};")
                        w.line(f"const __m256i {rv} = _mm256_loadu_si256((const __m256i*){rt});")
                        res = f"&{rv}"
                    w.line(f"{vname} = {fn}(_mm256_add_epi32({acc}, {b}), &{ch}, {res}, {unsigned});")
            if ep.finish is None:
                w.line(f"opfuse_q8_store_8x8({out} + ({img} * {C} + {c0}) * {P} + {p0}, {P}, {nch}, {n}, "
                       f"{', '.join(vs)});")
            else:  # 8 channels x 8 positions requantized into scratch, then the tail on each
                tb, ci, u = kc.tmp("tb"), kc.tmp("ci"), kc.tmp("u")
                w.line(f"{c_type(ep.out.dtype)} {tb}[{LANES * LANES}];")
                w.line(f"opfuse_q8_store_8x8({tb}, {LANES}, {nch}, {n}, {', '.join(vs)});")
                with w.block(f"for (long {ci} = 0; {ci} < {nch}; ++{ci})"), \
                        w.block(f"for (long {u} = 0; {u} < {n}; ++{u})"):
                    ep.finish(Index.loops(ep.out.shape, ((0, 1, img), (1, 2, f"{c0} + {ci}"), (2, 4, f"{p0} + {u}"))),
                              f"{tb}[{ci} * {LANES} + {u}]")
    return _Packed(wq, 32, lambda grp, m, c, kh, kw: f"(({grp} / {LANES}) * {taps} + {kh} * {KW} + {kw}) * {LANES} + "
                               f"{grp} % {LANES}", arrays)


PORTABLE_C = """
/* Weight i of a packed array of 8-, 16- or 32-bit elements (memcpy: no aliasing of the blob's type). */
static inline int32_t opfuse_q8_w8(const void* p, long i) { return ((const int8_t*)p)[i]; }
static inline int32_t opfuse_q8_w16(const void* p, long i) {
  int16_t v;
  memcpy(&v, (const char*)p + 2 * i, 2);
  return v;
}
static inline int32_t opfuse_q8_w32(const void* p, long i) {
  int32_t v;
  memcpy(&v, (const char*)p + 4 * i, 4);
  return v;
}
"""


def _shares_storage(kc, a: Value, b: Value) -> bool:
    """Whether the memory plan lays ``a`` and ``b`` over common bytes (an output computed in place)."""
    mem = kc.program.memory
    if mem.is_static(a) or mem.is_static(b):
        return False
    la, lb = mem.location(a), mem.location(b)
    if (la.region, la.index) != (lb.region, lb.index):
        return False
    na, nb = (int(np.prod(v.shape)) * v.dtype.itemsize for v in (a, b))
    return la.offset < lb.offset + nb and lb.offset < la.offset + na


def _portable(kc, node: Node, x: QInput, ep: QEpilogue, G: int, packed: _Packed) -> None:
    """Plain C99 over the vector kernel's packed weights (``packed``), the ``#else`` of a host build (a compiler
    without AVX2, or AdvSIMD on aarch64): per image and group its input channels copied to scratch where the
    output is stored over them (``_shares_storage``), then per output, the centred window's products summed in uint32
    (wrapping as the reference's int32), the bias, then ``opfuse_requantize_residual``. The plain build
    (``simd="none"``, the Cortex-M7) keeps qconv.py's kernel and its own weights; this branch only reads the host
    build's single copy."""
    kc.program.require_helper("opfuse_q8_weights", PORTABLE_C)
    rq = kc.program.require_helper(REQUANTIZE_RESIDUAL_HELPER, REQUANTIZE_RESIDUAL_C)
    N, C, H, W = node.input(0).shape
    out_shape = node.outputs[0].shape
    OC, OH, OW = out_shape[1:]
    geo, _ = conv_geometry(node)
    (KH, KW), (SH, SW), (DH, DW) = geo.kernel, geo.strides, geo.dilations
    PT, PL = geo.pads_begin
    cg, mg = C // G, OC // G
    name = ep.out.name
    arrays = dict(packed.arrays)
    for key, values, dt in (("bias", ep.bias, np.int32), ("mult", ep.mult, np.int32), ("shift", ep.shift, np.int32),
                            ("rmult", ep.rmult, np.int64), ("dqscale", ep.scale, np.float32)):
        if key not in arrays and values is not None:
            arrays[key] = kc.const_array((f"q8_{key}", name), values, f"{name}_{key}", dt)
    w = kc.w
    qp = kc.ptr(x.q)
    out = ""
    if ep.finish is None:
        out = kc.ptr(ep.out, write=True)
    b, m, oh, ow, c, kh, kw = (kc.tmp(t) for t in ("b", "m", "oh", "ow", "c", "kh", "kw"))
    # The output stored over the input (memory/inplace.py: a 1x1 or depthwise conv, which the vector kernels read
    # whole into their word image first): the group's input channels are copied to scratch first here too.
    ct, xs = c_type(x.q.dtype), kc.tmp("xs")
    copy = any(_shares_storage(kc, x.q, v) for v in ([ep.out] if ep.finish is None else ep.outputs))
    xoff = kc.scratch(cg * H * W * x.q.dtype.itemsize) if copy else 0
    with w.block(f"for (long {b} = 0; {b} < {N * G}; ++{b})"):
        img, grp = (f"({b} / {G})", f"({b} % {G})") if G > 1 else (b, "0")
        if copy:
            w.line(f"{ct}* restrict {xs} = ({ct}*)(scratch + {xoff});")
            w.line(f"memcpy({xs}, {qp} + ({img} * {C} + {grp} * {cg}) * {H * W}, sizeof({ct}) * {cg * H * W});")
        else:
            w.line(f"const {ct}* {xs} = {qp} + ({img} * {C} + {grp} * {cg}) * {H * W};")
        with w.block(f"for (long {m} = 0; {m} < {mg}; ++{m})"):
            oc = kc.tmp("oc")
            w.line(f"const long {oc} = {grp} * {mg} + {m};")
            with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"), \
                    w.block(f"for (long {ow} = 0; {ow} < {OW}; ++{ow})"):
                acc = kc.tmp("acc")
                w.line(f"uint32_t {acc} = (uint32_t){arrays['bias']}[{oc}];")
                with w.block(f"for (long {c} = 0; {c} < {cg}; ++{c})"), \
                        w.block(f"for (long {kh} = 0; {kh} < {KH}; ++{kh})"):
                    ih = kc.tmp("ih")
                    w.line(f"const long {ih} = {oh} * {SH} - {PT} + {kh} * {DH};")
                    w.line(f"if ({ih} < 0 || {ih} >= {H}) continue;")
                    with w.block(f"for (long {kw} = 0; {kw} < {KW}; ++{kw})"):
                        iw = kc.tmp("iw")
                        w.line(f"const long {iw} = {ow} * {SW} - {PL} + {kw} * {DW};")
                        w.line(f"if ({iw} < 0 || {iw} >= {W}) continue;")
                        wv = f"opfuse_q8_w{packed.bits}({packed.array}, {packed.index(grp, m, c, kh, kw)})"
                        xv = f"((int32_t){xs}[({c} * {H} + {ih}) * {W} + {iw}] - {x.zp})"
                        w.line(f"{acc} += (uint32_t)({wv} * {xv});")
                at = f"(({img} * {OC} + {oc}) * {OH} + {oh}) * {OW} + {ow}"
                res, rmult = "0", "0"
                if ep.res is not None:
                    res = f"(int32_t){kc.ptr(ep.res.q)}[{at}] - {ep.res.zp}"
                    rmult = f"{arrays['rmult']}[{oc}]"
                y = (f"({c_type(ep.out.dtype)}){rq}((int32_t){acc}, {arrays['mult']}[{oc}], {arrays['shift']}[{oc}], "
                     f"{res}, {rmult}, {ep.zp}, {ep.lo}, {ep.hi})")
                if ep.scale is not None:  # dequantized: Cast then Mul, each rounded as the reference's
                    y = f"(float)(int32_t){acc} * {arrays['dqscale']}[{oc}]"
                if ep.finish is None:
                    w.line(f"{out}[{at}] = {y};")
                else:
                    q = kc.tmp("q")
                    w.line(f"const {c_type(ep.out.dtype)} {q} = {y};")
                    ep.finish(Index(out_shape, (img, oc, oh, ow)), q)


# NEON (aarch64) ----------------------------------------------------------------------------------------------
def _neon_applies(ev, node: Node, x: QInput) -> None:
    """``_Refused`` where the NEON GEMM does not apply: weights beyond int8 or a zero point that is no 8-bit value
    (``sdot`` multiplies int8 by int8). Depthwise (int16 planes, ``neon_depthwise``) takes any int16 weights."""
    _, G = conv_geometry(node)
    C, OC = node.input(0).shape[1], node.outputs[0].shape[1]
    if C // G == 1 and OC // G == 1:
        return
    wt = ev.static.get(id(node.input(1)))
    _need(wt is not None and _quads_zero_point(x, np.asarray(wt).astype(np.int64)) is not None,
          "NEON sdot needs int8 weights and an 8-bit zero point")


NEON_INCLUDE = f"#if {NEON_GUARD}\n#include <arm_neon.h>\n#endif\n"

QUADS_NEON_C = """
#if defined(__aarch64__) && defined(__ARM_NEON)
/* dst[j] = the 4 bytes s(r0[i]), s(r1[i]), s(r2[i]), s(r3[i]), i = first + j * step, for j < n, where s(v) = v ^ flip
   (int8: v; uint8: v - 128, as int8): the signed bytes sdot multiplies; fill (the zero point less 128 for uint8: the
   centred zero) where i lies outside [0, len) or the row is NULL. shift != 0: row q is read at i + q * shift (4
   taps of one input row per word). 16 positions of 4 rows interleaved by one vst4q_u8 at column stride 1 (every
   other byte of vld2q_u8 at stride 2). */
static void opfuse_q8n_quads_{s}(uint8_t* restrict dst, const {T}* r0, const {T}* r1, const {T}* r2, const {T}* r3,
                                 long first, long n, long step, long len, uint8_t fill, long shift) {{
""" + _QUADS_HEAD + """\
  if (step <= 2) {{
    const uint8x16_t f = vdupq_n_u8(flip), fv = vdupq_n_u8(fill);
    for (; j < n && first + step * j < 0; ++j) dst[4 * j] = dst[4 * j + 1] = dst[4 * j + 2] = dst[4 * j + 3] = fill;
    if (step == 1) {{
      for (; j + 16 <= n && first + j + 16 <= len; j += 16) {{
        uint8x16x4_t v;
        for (int q = 0; q < 4; ++q)
          v.val[q] = rows[q] ? veorq_u8(vld1q_u8((const uint8_t*)(rows[q] + first + j)), f) : fv;
        vst4q_u8(dst + 4 * j, v);
      }}
    }} else {{
      for (; j + 16 <= n && first + 2 * j + 32 <= len; j += 16) {{
        uint8x16x4_t v;
        for (int q = 0; q < 4; ++q)
          v.val[q] = rows[q] ? veorq_u8(vld2q_u8((const uint8_t*)(rows[q] + first + 2 * j)).val[0], f) : fv;
        vst4q_u8(dst + 4 * j, v);
      }}
    }}
  }}
""" + _QUADS_TAIL


def _neon_pass_channels(NV: int) -> int:
    """Channels per pass of the kernel without the dot product: 2 int32x4 accumulators per channel and vector, the
    NV vectors' 2 halves and the weight word within the 32 registers."""
    return max(p for p in (4, 2, 1) if 2 * p * NV + 2 * NV + 1 <= 32)


def _neon_micro_kernel(kc, MR: int, NV: int, offsets: list[int]) -> str:
    """The NEON GEMM's inner loop, out of line as on x86 (``_micro_kernel``): ``acc[(i * NV + v) * 4 + l]`` (MR
    channels x NV vectors of 4 positions) = the sum over the words (``plane`` apart) and taps (``offsets``) of the
    signed quads of 4 positions times channel ``i``'s weight word. With the dot product (``__ARM_FEATURE_DOTPROD``):
    per tap NV loads, MR / 4 weight loads and MR NV ``sdot`` by lane (``vdotq_laneq_s32``: four int8 products per
    lane summed into int32). Without it (Armv8.0-A): ``vmull_s8`` of each half vector (2 positions x 4 channels) by
    the weight word twice, ``vpadalq_s16`` into int32 pairs, one ``vpaddq_s32`` per vector at the end; channels in
    passes of ``_neon_pass_channels`` (its accumulators are twice as many). Both exact (an int8 product fits int16)
    and wrapping as the reference's int32."""
    key = f"neon|{MR}x{NV}|{','.join(map(str, offsets))}"
    name = f"opfuse_q8n_mk_{MR}x{NV}_{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    taps = len(offsets)
    accs = [[f"a{i}_{v}" for v in range(NV)] for i in range(MR)]
    lines = [f"#if {NEON_GUARD}", f"/* {MR} channels x {NEON_LANES * NV} positions over words x {taps} taps */",
             f"__attribute__((noinline)) static void {name}(const int32_t* restrict xt, const int32_t* restrict wp, "
             "long words, long plane, int32_t* restrict acc) {", "#if defined(__ARM_FEATURE_DOTPROD)"]
    lines += ["  int32x4_t " + ", ".join(f"{a} = vdupq_n_s32(0)" for a in row) + ";" for row in accs]
    lines.append(f"  for (long k = 0; k < words; ++k, wp += {taps * MR}) {{")
    lines.append("    const int32_t* xc = xt + k * plane;")
    for t, off in enumerate(offsets):
        lines.append("    {")
        lines += [f"      const int8x16_t x{v} = vreinterpretq_s8_s32(vld1q_s32(xc + {off + v * NEON_LANES}));"
                  for v in range(NV)]
        for g4 in range(MR // 4):
            lines.append(f"      const int8x16_t w{g4} = vreinterpretq_s8_s32(vld1q_s32(wp + {t * MR + 4 * g4}));")
            for lane in range(4):
                i = 4 * g4 + lane
                lines.append("      " + " ".join(f"{accs[i][v]} = vdotq_laneq_s32({accs[i][v]}, x{v}, w{g4}, {lane});"
                                                 for v in range(NV)))
        lines.append("    }")
    lines.append("  }")
    lines += [f"  vst1q_s32(acc + {(i * NV + v) * NEON_LANES}, {accs[i][v]});" for i in range(MR) for v in range(NV)]
    lines.append("#else")
    P = _neon_pass_channels(NV)
    for i0 in range(0, MR, P):
        chans = range(i0, min(i0 + P, MR))
        lines.append("  {")
        lines += ["    int32x4_t " + ", ".join(f"{h}{i}_{v} = vdupq_n_s32(0)" for v in range(NV) for h in ("lo", "hi"))
                  + ";" for i in chans]
        lines.append("    const int32_t* w = wp;")
        lines.append(f"    for (long k = 0; k < words; ++k, w += {taps * MR}) {{")
        lines.append("      const int32_t* xc = xt + k * plane;")
        for t, off in enumerate(offsets):
            lines.append("      {")
            for v in range(NV):
                at = off + v * NEON_LANES
                lines.append(f"        const int8x16_t x{v} = vreinterpretq_s8_s32(vld1q_s32(xc + {at}));")
                lines.append(f"        const int8x8_t xl{v} = vget_low_s8(x{v}), xh{v} = vget_high_s8(x{v});")
            for i in chans:
                lines.append(f"        {{ const int8x8_t wv = vreinterpret_s8_s32(vdup_n_s32(w[{t * MR + i}]));")
                for v in range(NV):
                    lines.append(f"          lo{i}_{v} = vpadalq_s16(lo{i}_{v}, vmull_s8(xl{v}, wv)); "
                                 f"hi{i}_{v} = vpadalq_s16(hi{i}_{v}, vmull_s8(xh{v}, wv));")
                lines.append("        }")
            lines.append("      }")
        lines.append("    }")
        lines += [f"    vst1q_s32(acc + {(i * NV + v) * NEON_LANES}, vpaddq_s32(lo{i}_{v}, hi{i}_{v}));"
                  for i in chans for v in range(NV)]
        lines.append("  }")
    lines += ["#endif", "}", "#endif", ""]
    kc.program.require_helper("opfuse_arm_neon", NEON_INCLUDE)
    return kc.program.require_helper(name, "\n".join(lines))


def neon_gemm(kc, ev, node: Node, x: QInput, ep: QEpilogue, G: int) -> _Packed:
    """The aarch64 int8 GEMM (``vector_isa="neon"``): the word image of signed quads (4 input channels' int8
    bytes per word, ``x ^ flip``: int8 as is, uint8 less 128; 4 taps of a kernel row on a single input channel),
    the weights packed as the AVX-512 build packs its quads, ``sdot`` by lane (``_neon_micro_kernel``), and the
    requantizing epilogue 4 positions at a time (``_neon_epilogue``). ``sum w (s - zs) = sum w s - zs sum w``
    with ``zs`` the zero point in the signed bytes: the correction joins the bias (int32, wrapping). Returns how
    the ``#else`` branch reads the same weights."""
    N, C, H, W = node.input(0).shape
    out_shape = node.outputs[0].shape
    OC, OH, OW = out_shape[1:]
    cg, mg = C // G, OC // G
    per = 4
    CP = -(-cg // per)
    wt = ev.static[id(node.input(1))].astype(np.int64)
    zu = _quads_zero_point(x, wt)
    assert zu is not None, "_neon_applies checked it"
    zs = zu - 128  # the centred zero as a signed byte: int8 zp, or uint8 zp - 128
    probe, flat = _geometry(node, NEON_LANES, True)
    tap_words = cg == 1 and probe.KW > 1
    KWw = -(-probe.KW // per) if tap_words else probe.KW
    MR, NV = _block(mg, probe.OW, CP * probe.KH * KWw, NEON_BLOCKS, NEON_LANES)
    g, _ = _geometry(node, NEON_LANES * NV, True)
    MB = -(-mg // MR)
    taps = g.KH * KWw
    wt = wt.reshape(G, mg, cg, g.KH * g.KW)
    words = _weight_words(wt, g, MB, MR, CP, per, KWw, tap_words, np.int8)
    wq = kc.const_array(("q8_gemm_quads", node.name), words, f"{node.input(1).name}_quads", np.int32)
    corrected = ep.bias.astype(np.int64) - zs * wt.reshape(OC, -1).sum(axis=1)
    bias = kc.const_array(("q8_neon_bias", ep.out.name), ((corrected + (1 << 31)) % (1 << 32) - (1 << 31))
                          .astype(np.int32), f"{ep.out.name}_neon_bias", np.int32)
    arrays = {key: kc.const_array((f"q8_{key}", ep.out.name), values, f"{ep.out.name}_{key}", dt)
              for key, values, dt in (("mult", ep.mult, np.int32), ("shift", ep.shift, np.int32),
                                      ("rmult", ep.rmult, np.int64)) if values is not None}
    kc.program.require_helper("opfuse_arm_neon", NEON_INCLUDE)
    kc.program.require_helper("opfuse_q8n_requantize", REQUANTIZE_NEON_C)
    plane = g.plane
    xoff = kc.scratch(CP * plane * 4)
    words_of = "4 taps of a kernel row" if tap_words else "4 channels"
    kc.note(lambda name: f"int8 conv '{name}': NEON s8 x s8 GEMM (sdot by lane; vmull_s8 + vpadalq_s16 without "
                         f"the dot product), {MR} channels x {NEON_LANES * NV} positions, words of {words_of}, "
                         "requantizing epilogue in vectors (exact, 64-bit lanes)", node)
    w = kc.w
    ct = c_type(x.q.dtype)
    s = "s8" if x.q.dtype == np.int8 else "u8"
    flip = "0" if x.q.dtype == np.int8 else "0x80"
    kc.program.require_helper("opfuse_arm_neon", NEON_INCLUDE)
    kc.program.require_helper(f"opfuse_q8n_quads_{s}", QUADS_NEON_C.format(s=s, T=ct, flip=flip))
    im = _Image(g, C, H, W, cg, CP, per, flat, tap_words, xoff)

    def build_row(dst: str, rows: list[str], ph: str) -> None:
        w.line(f"opfuse_q8n_quads_{s}((uint8_t*)({dst}), {', '.join(rows)}, {ph} - {g.PL}, {g.Wq}, "
               f"{g.SW}, {g.W}, {zs & 0xFF}, {g.DW if tap_words else 0});")
    offsets = [g.tap(kh, per * kw if tap_words else kw) for kh in range(g.KH) for kw in range(KWw)]
    with _word_tiles(kc, im, x.q, N, G, mg, MB, MR, KWw, wq, build_row) as (img, grp, mb, oh, ow0, xt, wp):
        buf = kc.tmp("acc")
        mk = _neon_micro_kernel(kc, MR, NV, offsets)
        w.line(f"int32_t {buf}[{MR * g.NB}];")
        w.line(f"{mk}({xt}, {wp}, {CP}, {plane}, {buf});")
        n = kc.tmp("n")
        w.line(f"const long {n} = {g.OW} - {ow0} < {g.NB} ? {g.OW} - {ow0} : {g.NB};")
        for i in range(MR):
            m = kc.tmp("m")
            w.line(f"const long {m} = {mb} * {MR} + {i};")
            with w.block(f"if ({m} < {mg})" if mg % MR else ""):
                oc = kc.tmp("oc")
                w.line(f"const long {oc} = {grp} * {mg} + {m};")
                if flat:
                    orow, rrow = _out_rows(kc, ep, img, oc, "0", (N, OC, 1, OH * OW))
                else:
                    orow, rrow = _out_rows(kc, ep, img, oc, oh, out_shape)
                _neon_epilogue(kc, ep, buf, i * g.NB, NV, bias, arrays, oc, orow, rrow, ow0, n)
    return _Packed(wq, 8, _word_index(MB, MR, CP, taps, per, g.KW, KWw if tap_words else 0), {})


REQUANTIZE_NEON_C = """
#if defined(__aarch64__) && defined(__ARM_NEON)
/* opfuse_requantize_residual on 4 lanes of one channel, bit for bit: p = acc * mult + res * rmult in int64 lanes
   (vmull_s32, exact; rmult = rh 2^31 + rl with 0 <= rl < 2^31, so res * rmult = res * rl + (res * rh) 2^31, each
   exact below 2^62), rounded half to even as floor((p + 2^(s-1) - 1 + bit_s(p)) / 2^s) by arithmetic shifts
   (vshlq_s64 by -s), plus the zero point, clamped to [lo, hi]. */
static inline int64x2_t opfuse_q8n_round(int64x2_t p, int64x2_t ns, int64x2_t rnd, int32_t zp, int32_t lo,
                                         int32_t hi) {
  const int64x2_t bit = vandq_s64(vshlq_s64(p, ns), vdupq_n_s64(1));
  int64x2_t q = vaddq_s64(vshlq_s64(vaddq_s64(vaddq_s64(p, rnd), bit), ns), vdupq_n_s64(zp));
  const int64x2_t l = vdupq_n_s64(lo), h = vdupq_n_s64(hi);
  q = vbslq_s64(vcltq_s64(q, l), l, q);
  return vbslq_s64(vcgtq_s64(q, h), h, q);
}
static inline int32x4_t opfuse_q8n_requantize(int32x4_t acc, int32_t mult, int32_t shift, const int32x4_t* res,
                                              int64_t rmult, int32_t zp, int32_t lo, int32_t hi) {
  int64x2_t p0 = vmull_n_s32(vget_low_s32(acc), mult), p1 = vmull_high_n_s32(acc, mult);
  if (res) {
    const int32_t rl = (int32_t)(rmult & 0x7fffffff), rh = (int32_t)(rmult >> 31);
    p0 = vaddq_s64(vaddq_s64(p0, vmull_n_s32(vget_low_s32(*res), rl)),
                   vshlq_n_s64(vmull_n_s32(vget_low_s32(*res), rh), 31));
    p1 = vaddq_s64(vaddq_s64(p1, vmull_high_n_s32(*res, rl)), vshlq_n_s64(vmull_high_n_s32(*res, rh), 31));
  }
  const int64x2_t ns = vdupq_n_s64(-(int64_t)shift), rnd = vdupq_n_s64(((int64_t)1 << (shift - 1)) - 1);
  return vcombine_s32(vmovn_s64(opfuse_q8n_round(p0, ns, rnd, zp, lo, hi)),
                      vmovn_s64(opfuse_q8n_round(p1, ns, rnd, zp, lo, hi)));
}
#endif
"""


def _neon_epilogue(kc, ep: QEpilogue, buf: str, at: int, NV: int, bias: str, arrays: dict[str, str], oc: str,
                   orow: str, rrow: str | None, ow0: str, n: str) -> None:
    """Channel ``oc``'s ``4 NV`` accumulators (``buf`` from ``at``): bias (int32, wrapping), then
    ``opfuse_q8n_requantize`` 4 at a time; the first ``n`` stored to ``orow + ow0`` (narrowed to 8 bits: the
    clamp keeps them in range). The residual's row is centred into ``4 NV`` int32 first (0 past ``n``)."""
    w = kc.w
    nb = NEON_LANES * NV
    q, rb, p = kc.tmp("q"), kc.tmp("rb"), kc.tmp("p")
    w.line(f"int32_t {q}[{nb}];")
    res = "NULL"
    if ep.res is not None and rrow is not None:
        w.line(f"int32_t {rb}[{nb}];")
        w.line(f"for (long {p} = 0; {p} < {nb}; ++{p}) {rb}[{p}] = {p} < {n} ? (int32_t){rrow}[{ow0} + {p}] - "
               f"{ep.res.zp} : 0;")
    rmult = f"{arrays['rmult']}[{oc}]" if ep.res is not None else "0"
    w.line(f"const int32x4_t {q}_b = vdupq_n_s32({bias}[{oc}]);")
    for v in range(NV):
        if ep.res is not None and rrow is not None:
            w.line(f"const int32x4_t {q}_r{v} = vld1q_s32({rb} + {v * NEON_LANES});")
            res = f"&{q}_r{v}"
        w.line(f"vst1q_s32({q} + {v * NEON_LANES}, opfuse_q8n_requantize(vaddq_s32(vld1q_s32({buf} + "
               f"{at + v * NEON_LANES}), {q}_b), {arrays['mult']}[{oc}], {arrays['shift']}[{oc}], {res}, {rmult}, "
               f"{ep.zp}, {ep.lo}, {ep.hi}));")
    w.line(f"for (long {p} = 0; {p} < {n}; ++{p}) {orow}[{ow0} + {p}] = ({c_type(ep.out.dtype)}){q}[{p}];")
    _finish_tail(kc, ep, orow, ow0, n)


def neon_depthwise(kc, ev, node: Node, x: QInput, ep: QEpilogue) -> _Packed:
    """Depthwise on aarch64 (``vector_isa="neon"``), one channel plane at a time: the plane copied centred into
    int16, padded and split by column phase (``_Geometry``: every tap's 4 consecutive outputs of a row are then
    4 consecutive values, at any stride), ``vmlal_n_s16`` per tap and 4 positions (exact: an int16 product fits
    int32, the sums wrap as the reference's), 16 positions of a row per pass, and the requantizing epilogue in
    vectors (``_neon_epilogue``). The plane is read whole before any output of it is stored, so the output may
    lie over the input (memory/inplace.py)."""
    N, C, H, W = node.input(0).shape
    out_shape = node.outputs[0].shape
    OH, OW = out_shape[2:]
    NV = 4 if OW > 2 * NEON_LANES else -(-OW // NEON_LANES)
    g, _ = _geometry(node, NEON_LANES * NV, False)
    taps = g.KH * g.KW
    wt = ev.static[id(node.input(1))].astype(np.int64).reshape(C, taps)
    wq = kc.const_array(("q8_dw16", node.name), wt.astype(np.int16), f"{node.input(1).name}_dw16", np.int16)
    arrays = {key: kc.const_array((f"q8_{key}", ep.out.name), values, f"{ep.out.name}_{key}", dt)
              for key, values, dt in (("bias", ep.bias, np.int32), ("mult", ep.mult, np.int32),
                                      ("shift", ep.shift, np.int32), ("rmult", ep.rmult, np.int64))
              if values is not None}
    kc.program.require_helper("opfuse_arm_neon", NEON_INCLUDE)
    kc.program.require_helper("opfuse_q8n_requantize", REQUANTIZE_NEON_C)
    poff = kc.scratch(g.plane * 2)
    kc.note(lambda name: f"int8 depthwise '{name}': NEON int16 planes (vmlal_n_s16), {NEON_LANES * NV} positions "
                         "per pass, requantizing epilogue in vectors (exact, 64-bit lanes)", node)
    w = kc.w
    qp = kc.ptr(x.q)
    pl, r, ph, j = kc.tmp("pl"), kc.tmp("r"), kc.tmp("ph"), kc.tmp("j")
    kc.parallel_for(N * C * OH * OW * taps * 2)
    with w.block(f"for (long {pl} = 0; {pl} < {N * C}; ++{pl})"):
        img, c = f"({pl} / {C})", f"({pl} % {C})"
        xp = kc.tmp("plane")
        w.line(f"int16_t* restrict {xp} = {kc.scratch_ptr('int16_t', poff)};")
        with w.block(f"for (long {r} = 0; {r} < {g.Hp}; ++{r})"):
            ih = kc.tmp("ih")
            w.line(f"const long {ih} = {r} - {g.PT};")
            with w.block(f"for (long {ph} = 0; {ph} < {g.SW}; ++{ph})"):
                dst, row = kc.tmp("dst"), kc.tmp("row")
                w.line(f"int16_t* {dst} = {xp} + ({r} * {g.SW} + {ph}) * {g.Wq};")
                w.line(f"const {c_type(x.q.dtype)}* {row} = {ih} >= 0 && {ih} < {H} ? {qp} + ({pl} * {H} + {ih}) * "
                       f"{W} : NULL;")
                with w.block(f"for (long {j} = 0; {j} < {g.Wq}; ++{j})"):
                    iw = kc.tmp("iw")
                    w.line(f"const long {iw} = {ph} - {g.PL} + {j} * {g.SW};")
                    w.line(f"{dst}[{j}] = (int16_t)({row} && {iw} >= 0 && {iw} < {W} ? (int32_t){row}[{iw}] - "
                           f"{x.zp} : 0);")
        wv = [kc.tmp("w") for _ in range(taps)]
        w.line("const int16_t " + ", ".join(f"{name} = {wq}[{c} * {taps} + {t}]" for t, name in enumerate(wv)) + ";")
        oh, ow0, n, buf = kc.tmp("oh"), kc.tmp("ow"), kc.tmp("n"), kc.tmp("acc")
        with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"):
            orow, rrow = _out_rows(kc, ep, img, c, oh, out_shape)
            with w.block(f"for (long {ow0} = 0; {ow0} < {OW}; {ow0} += {g.NB})"):
                xt = kc.tmp("xt")
                w.line(f"const int16_t* {xt} = {xp} + {oh} * {g.SH * g.SW * g.Wq} + {ow0};")
                w.line(f"const long {n} = {OW} - {ow0} < {g.NB} ? {OW} - {ow0} : {g.NB};")
                accs = [kc.tmp("a") for _ in range(NV)]
                w.line("int32x4_t " + ", ".join(f"{a} = vdupq_n_s32(0)" for a in accs) + ";")
                for t, wr in enumerate(wv):
                    kh, kw = divmod(t, g.KW)
                    w.line(" ".join(f"{a} = vmlal_n_s16({a}, vld1_s16({xt} + {g.tap(kh, kw) + v * NEON_LANES}), {wr});"
                                    for v, a in enumerate(accs)))
                w.line(f"int32_t {buf}[{g.NB}];")
                w.line(" ".join(f"vst1q_s32({buf} + {v * NEON_LANES}, {a});" for v, a in enumerate(accs)))
                _neon_epilogue(kc, ep, buf, 0, NV, arrays["bias"], arrays, c, orow, rrow, ow0, n)
    return _Packed(wq, 16, lambda grp, m, c, kh, kw: f"{grp} * {taps} + {kh} * {g.KW} + {kw}", {})
