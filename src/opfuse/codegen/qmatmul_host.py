"""Integer MatMul on the host: ``qgemm.py``'s word GEMM with the output columns in the vector lanes.

The ``integer_matmul`` rule's ``MatMul(int32(a_q) - a_zp, W) -> [Add bias] -> Requantize`` (``A``: ``M x K``
8-bit activations in memory, ``W``: a constant ``K x N`` of int8 range -- int16 for the pairs) is
``Y = A W`` with ``Y`` row-major. ``qgemm.py``'s convolution GEMM puts output positions in the lanes and
broadcasts a weight word per channel; here the roles swap so that each accumulator vector is 8 consecutive
columns of one row, stored as they lie and requantized with one column's constants per lane:

1. **Weights, packed at build time** as the convolution's words: ``per`` = 4 (u8 x s8 quads, the AVX-512
   build, ``vpdpbusd``) or 2 (int16 pairs, the AVX2 build, ``vpmaddwd``) consecutive ``k`` of one column per
   32-bit word, laid out ``[column tile][word][NB columns]`` (``NB = 8 NV``): each tile's panel is contiguous
   and its rows are the micro-kernel's "image", ``NB`` words apart.
2. **Activations, packed at run time** once per call into thread 0's scratch as ``[row block][word][MR rows]``
   (the micro-kernel's broadcast operand: ``wp[i]`` per word), rows past ``M`` and ``k`` past ``K`` zero:
   quads ``u = a ^ 0x80`` for int8 (``a + 128`` as unsigned) and ``u = a`` for uint8, so that
   ``sum_k W (u - zu) = sum_k W u - zu colsum(W)`` with ``zu`` the unsigned zero point, the correction joining
   the bias (int32, wrapping); pairs ``(a[2k] - zp, a[2k+1] - zp)`` as int16. ``A`` is read whole before the
   first output is stored, so the output may lie over it.
3. **Micro-kernel**: qgemm's own (MR rows x NV vectors, out of line), its loaded operand the weight panel and
   its broadcast the activation word: ``qgemm.zmm_micro_kernel`` for the quads built for AVX-512 (16 columns
   a zmm, ``CodegenOptions.int8_matmul_zmm``), ``qgemm._micro_kernel`` (8 a ymm) otherwise. ``vpdpbusd`` takes
   its unsigned operand first, so the quads' dot swaps the two (``OPFUSE_Q8_DPBUSD_BX``); the pairs'
   ``vpmaddwd`` is symmetric. Exact as the convolution's (no saturating instruction, sums wrapping as the
   reference's int32).
4. **Epilogue**: ``qgemm``'s requantization (``opfuse_q8_requantize``, or ``_d`` in double where
   ``exact_in_double`` proves it exact) with one column's multiplier, shift (and residual multiplier) per
   lane (``opfuse_q8_chan_lanes``): per-tensor and per-column scales alike, bias, Relu clamp, residual. Any
   other epilogue (``qgemm.match_epilogue`` refuses it: a dequantization to float from
   ``integer_matmul_dequantized``, a second reader of the accumulator) runs as the stage defines it,
   ``finish_element`` on each accumulator, row by row over a tile's columns.

NEON (``vector_isa="neon"``): the same layout with signed quads (``s = a ^ 0x80`` for uint8, int8 as is),
``qgemm._neon_micro_kernel`` (``sdot`` by lane: MR a multiple of 4) and a per-lane requantization
(``opfuse_q8n_requantize_lanes``). Under ``#else`` (a compiler without the ISA): plain C over the same packed
weights. The plain build (``simd="none"``, the Cortex-M7) keeps ``qmatmul.py``'s kernel, untouched.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index
from opfuse.codegen.qgemm import (BLOCKS, BLOCKS_AVX512, HELPER, HELPER_C, HOST_GUARD, LANES, NEON_BLOCKS,
                                  NEON_GUARD, NEON_INCLUDE, NEON_LANES, PORTABLE_C, REQUANTIZE_NEON_C, ZMM_BLOCKS,
                                  QEpilogue, QInput, _block, _centred_input, _micro_kernel, _must, _neon_micro_kernel,
                                  _need, _quads_zero_point, _Refused, _shares_storage, exact_in_double,
                                  match_epilogue, zmm_micro_kernel)
from opfuse.codegen.rules import REQUANTIZE_RESIDUAL_C, REQUANTIZE_RESIDUAL_HELPER
from opfuse.codegen.stages import Stage

# A row vector (M = 1, a classifier's fc) wastes MR - 1 of every block's rows: one row of 4 vectors too.
GEMV_BLOCKS = ((1, 4),)

DPBUSD_BX = "OPFUSE_Q8_DPBUSD_BX"
DPBUSD_BX_C = """
#if defined(__AVX2__)
/* vpdpbusd with the loaded vector (the weights: signed) second and the broadcast word (the activations: unsigned)
   first: the matmul's roles are the convolution's swapped. */
#define OPFUSE_Q8_DPBUSD_BX(acc, b, a) opfuse_q8_dpbusd((acc), (a), (b))
#endif
"""

PACK_C = """
#if {guard}
/* Rows r0 .. r0 + MR - 1 (those below M) of A (M x K, {T}) as words of {per} consecutive k, dst[cp * MR + i]:
   {what}; 0 past K and past M. */
static void opfuse_q8mm_pack_{kind}_{s}(int32_t* restrict dst, const {T}* a, long r0, long M, long K, long MR,
                                       long CP) {{
  for (long i = 0; i < MR; ++i) {{
    const long m = r0 + i;
    for (long cp = 0; cp < CP; ++cp) {{
      {E} e[{per}] = {{0}};
      for (long r = 0; r < {per}; ++r) {{
        const long k = cp * {per} + r;
        if (m < M && k < K) e[r] = {value};
      }}
      memcpy(dst + cp * MR + i, e, 4);
    }}
  }}
}}
#endif
"""

REQUANTIZE_NEON_LANES_C = """
#if defined(__aarch64__) && defined(__ARM_NEON)
/* opfuse_q8n_requantize with one column's mult, shift and rmult per lane (4 consecutive columns), bit for bit. */
static inline int32x4_t opfuse_q8n_requantize_lanes(int32x4_t acc, const int32_t* mult, const int32_t* shift,
                                                    const int32x4_t* res, const int64_t* rmult, int32_t zp, int32_t lo,
                                                    int32_t hi) {
  const int32x4_t m = vld1q_s32(mult), s = vld1q_s32(shift);
  int64x2_t p0 = vmull_s32(vget_low_s32(acc), vget_low_s32(m)), p1 = vmull_high_s32(acc, m);
  if (res) {
    const int64x2_t r0 = vld1q_s64(rmult), r1 = vld1q_s64(rmult + 2), lmask = vdupq_n_s64(0x7fffffff);
    const int32x4_t rl = vcombine_s32(vmovn_s64(vandq_s64(r0, lmask)), vmovn_s64(vandq_s64(r1, lmask)));
    const int32x4_t rh = vcombine_s32(vmovn_s64(vshrq_n_s64(r0, 31)), vmovn_s64(vshrq_n_s64(r1, 31)));
    p0 = vaddq_s64(vaddq_s64(p0, vmull_s32(vget_low_s32(*res), vget_low_s32(rl))),
                   vshlq_n_s64(vmull_s32(vget_low_s32(*res), vget_low_s32(rh)), 31));
    p1 = vaddq_s64(vaddq_s64(p1, vmull_high_s32(*res, rl)), vshlq_n_s64(vmull_high_s32(*res, rh), 31));
  }
  const int64x2_t s0 = vmovl_s32(vget_low_s32(s)), s1 = vmovl_high_s32(s), one = vdupq_n_s64(1);
  const int64x2_t rnd0 = vsubq_s64(vshlq_s64(one, vsubq_s64(s0, one)), one);
  const int64x2_t rnd1 = vsubq_s64(vshlq_s64(one, vsubq_s64(s1, one)), one);
  return vcombine_s32(vmovn_s64(opfuse_q8n_round(p0, vnegq_s64(s0), rnd0, zp, lo, hi)),
                      vmovn_s64(opfuse_q8n_round(p1, vnegq_s64(s1), rnd1, zp, lo, hi)));
}
#endif
"""


def host_int8_matmul_applies(kc, ev, stage: Stage) -> tuple[QInput, QEpilogue | None, int | None] | None:
    """The host kernel's operands ``(a, epilogue, zu)`` (``zu``: the quads' unsigned zero point, None for the int16
    pairs; ``epilogue`` None: any other epilogue, element by element), or None where ``qmatmul.py``'s portable
    kernel stays (on the host with SIMD, the reason in the kernel's notes). ``qmatmul.int8_matmul_applies`` has
    already held (2-D, constant weights of int16 range)."""
    opts = kc.program.options
    if opts.simd == "none" or opts.platform != "host":
        return None
    node = stage.anchor_node
    try:
        x = _must(_centred_input(node.input(0), ev), "the input is not an 8-bit matrix in memory less a constant "
                                                     "zero point, dequantized in this kernel")
        _need(x.q.shape == node.input(0).shape, "the input is reshaped in this kernel")
        ep: QEpilogue | None
        try:
            ep = match_epilogue(ev, stage, node)
        except _Refused as e:  # the stage's own epilogue on the accumulators, element by element (finish_element)
            why = str(e)
            kc.note(lambda name: f"int8 matmul '{name}': epilogue element by element ({why})", node)
            ep = None
        w = ev.static[id(node.input(1))].astype(np.int64)
        zu = _quads_zero_point(x, w) if opts.vector_isa in ("avx512", "neon") else None
        if opts.vector_isa == "neon":
            _need(zu is not None, "NEON sdot needs int8 weights and an 8-bit zero point")
        return x, ep, zu
    except _Refused as e:
        reason = str(e)
        kc.note(lambda name: f"int8 matmul '{name}': host int8 kernel not used: {reason}", node)
        return None


def _padded(arr: np.ndarray, n: int, pad, dtype) -> np.ndarray:
    """``arr`` (one value per column) padded with ``pad`` to ``n`` columns."""
    out = np.full(n, pad, dtype)
    out[:arr.shape[0]] = arr
    return out


def _wrap32(v: np.ndarray) -> np.ndarray:
    return ((v.astype(np.int64) + (1 << 31)) % (1 << 32) - (1 << 31)).astype(np.int32)


def lower_host_int8_matmul(kc, ev, stage: Stage, operands: tuple[QInput, QEpilogue | None, int | None]) -> None:
    """The vector kernel under ``#if`` (AVX2 / AVX-512 on x86, AdvSIMD on aarch64), plain C over the same packed
    weights under ``#else``."""
    node = stage.anchor_node
    x, ep, zu = operands
    M, K = node.input(0).shape
    N = node.outputs[0].shape[1]
    isa = kc.program.options.vector_isa
    neon = isa == "neon"
    per = 2 if zu is None else 4
    CP = -(-K // per)
    lanes = NEON_LANES if neon else LANES
    if _wide(kc, zu):  # 16 columns per zmm: NV counts the epilogue's vectors of 8 (two per zmm)
        MR, NV16 = _block(M, N, CP, ZMM_BLOCKS + GEMV_BLOCKS, 2 * LANES)
        NV = 2 * NV16
    else:
        blocks = NEON_BLOCKS if neon else (BLOCKS_AVX512 if isa == "avx512" else BLOCKS) + GEMV_BLOCKS
        MR, NV = _block(M, N, CP, blocks, lanes)
    NB = lanes * NV
    NT, MB = -(-N // NB), -(-M // MR)
    wt = ev.static[id(node.input(1))].astype(np.int64)
    # [tile][word][NB columns][per k]: element type int8 (quads) or int16 (pairs)
    packed = np.zeros((CP * per, NT * NB), np.int8 if zu is not None else np.int16)
    packed[:K, :N] = wt
    words = np.ascontiguousarray(packed.reshape(CP, per, NT, NB).transpose(2, 0, 3, 1)).view(np.int32).reshape(-1)
    kind = "pairs" if zu is None else "quads"
    wq = kc.const_array((f"q8mm_{kind}", node.name), words, f"{node.input(1).name}_{kind}", np.int32)
    w = kc.w
    guard = NEON_GUARD if neon else HOST_GUARD
    w.line(f"#if {guard}")
    _vector(kc, ev, stage, x, ep, zu, wq, wt, (M, K, N, CP, per, MR, NV, NB, NT, MB))
    w.line("#else")
    _portable(kc, ev, stage, x, ep, wq, 8 if zu is not None else 16, (M, K, N, CP, per, NB))
    w.line("#endif")


def _vector(kc, ev, stage: Stage, x: QInput, ep: QEpilogue | None, zu: int | None, wq: str, wt: np.ndarray,
            dims: tuple) -> None:
    M, K, N, CP, per, MR, NV, NB, NT, MB = dims
    node = stage.anchor_node
    neon = kc.program.options.vector_isa == "neon"
    w = kc.w
    Np = NT * NB
    s = "s8" if x.q.dtype == np.int8 else "u8"
    ct = c_type(x.q.dtype)
    correction = np.zeros(N, np.int64)
    if zu is None:
        pack_kind, elem, value, what = "pairs", "int16_t", f"(int16_t)((int32_t)a[m * K + k] - {x.zp})", \
            f"int16 pairs less the zero point {x.zp}"
    else:
        # x86: unsigned quads (int8 + 128); NEON: signed quads (uint8 - 128); the zero point moved alike
        flip = 0x80 if (x.q.dtype == np.int8) != neon else 0
        z = zu if not neon else zu - 128
        pack_kind, elem = ("quads", "uint8_t") if not neon else ("squads", "int8_t")
        value = f"({elem})((uint8_t)a[m * K + k] ^ {flip})"
        what = "4 bytes " + ("as unsigned (int8 + 128)" if not neon else "as signed (uint8 - 128)")
        correction = -z * wt.sum(axis=0)
    if zu is None:  # the pairs subtract the zero point in the helper: one helper per zero point
        pack_kind += f"_z{x.zp}" if x.zp >= 0 else f"_zm{-x.zp}"
    helper = f"opfuse_q8mm_pack_{pack_kind}_{s}"
    kc.program.require_helper(helper, PACK_C.format(guard=NEON_GUARD if neon else HOST_GUARD, kind=pack_kind, s=s,
                                                    T=ct, per=per, E=elem, value=value, what=what))
    if neon:
        kc.program.require_helper("opfuse_arm_neon", NEON_INCLUDE)
        kc.note(lambda nm: f"int8 matmul '{nm}': NEON s8 x s8 GEMM, columns in lanes (sdot by lane; vmull_s8 + "
                           f"vpadalq_s16 without the dot product), {MR} rows x {NB} columns", node)
    else:
        kc.program.require_helper(HELPER, HELPER_C)
        if zu is not None:
            kc.program.require_helper(DPBUSD_BX, DPBUSD_BX_C)
        how = "u8 x s8 quads (vpdpbusd with AVX512-VNNI, two vpmaddwd with AVX2 alone)" if zu is not None else \
            "int16 pairs (vpmaddwd, vpdpwssd with AVX512-VNNI)"
        if _wide(kc, zu):
            how += ", 16 columns per zmm"
        kc.note(lambda nm: f"int8 matmul '{nm}': host word GEMM, columns in lanes, {how}, {MR} rows x {NB} "
                           f"columns", node)
    if ep is not None:
        finish = _requantize_tiles(kc, x, ep, zu, wt, correction, (N, NB, NV, Np))
        kc.note(lambda nm: f"int8 matmul '{nm}': requantizing epilogue in vectors, one column's constants per lane",
                node)
    else:
        finish = _element_tiles(kc, ev, stage, correction, (N, NB, Np))
    ap = kc.tmp("ap")
    aoff = kc.scratch(MB * CP * MR * 4)
    w.line(f"int32_t* restrict {ap} = (int32_t*)(scratch + {aoff});  /* shared: thread 0's scratch */")
    rb = kc.tmp("rb")
    kc.parallel_for(M * K)
    with w.block(f"for (long {rb} = 0; {rb} < {MB}; ++{rb})"):
        w.line(f"{helper}({ap} + {rb} * {CP * MR}, {kc.ptr(x.q)}, {rb} * {MR}, {M}, {K}, {MR}, {CP});")
    tile = kc.tmp("tile")
    kc.parallel_for(M * N * K)
    with w.block(f"for (long {tile} = 0; {tile} < {NT * MB}; ++{tile})"):
        t, mb = kc.tmp("t"), kc.tmp("mb")
        w.line(f"const long {t} = {tile} / {MB}, {mb} = {tile} % {MB};")
        n0 = kc.tmp("n0")
        w.line(f"const long {n0} = {t} * {NB};")
        buf = kc.tmp("acc")
        xt, wp = f"{wq} + {t} * {CP * NB}", f"{ap} + {mb} * {CP * MR}"
        if neon:
            mk = _neon_micro_kernel(kc, MR, NV, [0])
            w.line(f"int32_t {buf}[{MR * NB}];")
        else:
            mk = zmm_micro_kernel(kc, MR, NV // 2, [0], loaded_unsigned=False) if _wide(kc, zu) else \
                _micro_kernel(kc, MR, NV, [0], "OPFUSE_Q8_DOT" if zu is None else DPBUSD_BX)
            w.line(f"__m256i {buf}[{MR * NV}];")
        w.line(f"{mk}({xt}, {wp}, {CP}, {NB}, {buf});")
        finish(buf, n0, mb, MR, M)


def _requantize_tiles(kc, x: QInput, ep: QEpilogue, zu: int | None, wt: np.ndarray, correction: np.ndarray,
                      dims: tuple) -> Callable[[str, str, str, int, int], None]:
    """The vectorised epilogue (bias, ``Requantize`` with one column's constants per lane, residual): its constants,
    and the function that emits it for a tile's accumulators."""
    N, NB, NV, Np = dims
    neon = kc.program.options.vector_isa == "neon"
    name = ep.out.name
    tag = "neon" if neon else "x86"
    bias = _wrap32(ep.bias.astype(np.int64) + correction)
    barr = kc.const_array((f"q8mm_bias_{tag}", name), _padded(bias, Np, 0, np.int32), f"{name}_mmbias", np.int32)
    mult = kc.const_array(("q8mm_mult", name), _padded(ep.mult, Np, 0, np.int32), f"{name}_mmmult", np.int32)
    shift = kc.const_array(("q8mm_shift", name), _padded(ep.shift, Np, 1, np.int32), f"{name}_mmshift", np.int32)
    rmult = "NULL"
    if ep.rmult is not None:
        rmult = kc.const_array(("q8mm_rmult", name), _padded(ep.rmult, Np, 0, np.int64), f"{name}_mmrmult", np.int64)
    exact = None if neon else exact_in_double(kc, ep, x, np.abs(wt).sum(axis=0))
    dscale = None
    if exact is not None:
        sc = kc.const_array(("q8mm_scale", name), _padded(exact[0], Np, 0.0, np.float64), f"{name}_mmscale",
                            np.float64)
        rs = "NULL"
        if exact[1] is not None:
            rs = kc.const_array(("q8mm_rscale", name), _padded(exact[1], Np, 0.0, np.float64), f"{name}_mmrscale",
                                np.float64)
        dscale = (sc, rs)
    if neon:
        kc.program.require_helper("opfuse_q8n_requantize", REQUANTIZE_NEON_C)
        kc.program.require_helper("opfuse_q8n_requantize_lanes", REQUANTIZE_NEON_LANES_C)
    out = kc.ptr(ep.out, write=True)
    res = kc.ptr(ep.res.q) if ep.res is not None else None
    w = kc.w
    lanes = NEON_LANES if neon else LANES

    def finish(buf: str, n0: str, mb: str, MR: int, M: int) -> None:
        chans = _lane_constants(kc, ep, n0, NV, (mult, shift, rmult), dscale) if not neon else []
        for i in range(MR):
            m = kc.tmp("m")
            w.line(f"const long {m} = {mb} * {MR} + {i};")
            with w.block(f"if ({m} < {M})" if M % MR else ""):
                for v in range(NV):
                    n, nv = kc.tmp("n"), kc.tmp("nv")
                    w.line(f"const long {n} = {n0} + {v * lanes}, {nv} = {N} - {n};")
                    with w.block(f"if ({nv} > 0)"):
                        at = f"{m} * {N} + {n}"
                        if neon:
                            _neon_store(kc, ep, f"{buf} + {(i * NV + v) * NEON_LANES}", barr, (mult, shift, rmult),
                                        n, out, res, at, nv)
                        else:
                            _x86_store(kc, ep, f"{buf}[{i * NV + v}]", barr, chans[v], n, out, res, at, nv)
    return finish


def _element_tiles(kc, ev, stage: Stage, correction: np.ndarray, dims: tuple) -> Callable[[str, str, str, int, int],
                                                                                           None]:
    """The stage's own epilogue (``finish_element``: any elementwise ops, such as a dequantization to float and
    the activation after it) on each accumulator of a tile, row by row over its columns (a loop gcc vectorises
    where the ops allow); the quads' zero-point correction added first (int32, wrapping)."""
    N, NB, Np = dims
    node = stage.anchor_node
    out = node.outputs[0]
    corr = None
    if correction.any():
        corr = kc.const_array(("q8mm_correction", node.name), _padded(_wrap32(correction), Np, 0, np.int32),
                              f"{node.name}_mmcorr", np.int32)
    w = kc.w

    def finish(buf: str, n0: str, mb: str, MR: int, M: int) -> None:
        cols, row = kc.tmp("cols"), kc.tmp("row")
        w.line(f"const long {cols} = {N} - {n0} < {NB} ? {N} - {n0} : {NB};")
        w.line(f"const int32_t* {row} = (const int32_t*){buf};")
        for i in range(MR):
            m, j = kc.tmp("m"), kc.tmp("j")
            w.line(f"const long {m} = {mb} * {MR} + {i};")
            with w.block(f"if ({m} < {M})" if M % MR else ""), \
                    w.block(f"for (long {j} = 0; {j} < {cols}; ++{j})"), ev.scope():
                y = kc.tmp("y")
                acc = f"{row}[{i * NB} + {j}]"
                if corr is not None:
                    acc = f"(int32_t)((uint32_t){acc} + (uint32_t){corr}[{n0} + {j}])"
                w.line(f"const int32_t {y} = {acc};")
                finish_element(kc, ev, stage, out, Index(out.shape, (m, f"{n0} + {j}")), y)
    return finish


def _wide(kc, zu: int | None) -> bool:
    """The zmm micro-kernel: built for AVX-512 with the quads, where ``CodegenOptions.int8_matmul_zmm``."""
    opts = kc.program.options
    return opts.vector_isa == "avx512" and zu is not None and opts.int8_matmul_zmm


def _lane_constants(kc, ep: QEpilogue, n0: str, NV: int, arrays: tuple[str, str, str],
                    dscale: tuple[str, str] | None) -> list[tuple[str, str]]:
    """Per vector of the tile, the requantization's constants of its 8 columns (one per lane): (chan, function);
    ``dscale``: the arrays of ``mult 2^-shift`` and ``rmult 2^-shift`` (or "NULL") where the double path is exact."""
    w = kc.w
    out = []
    for v in range(NV):
        ch = kc.tmp("ch")
        at = f"{n0} + {v * LANES}"
        if dscale is not None:
            rs = f"{dscale[1]} + {at}" if dscale[1] != "NULL" else "NULL"
            w.line(f"const opfuse_q8_dchan {ch} = opfuse_q8_dchan_lanes({dscale[0]} + {at}, {rs}, {ep.zp}, {ep.lo}, "
                   f"{ep.hi});")
            out.append((ch, "opfuse_q8_requantize_d"))
        else:
            mult, shift, rmult = arrays
            rm = f"{rmult} + {at}" if ep.rmult is not None else "NULL"
            w.line(f"const opfuse_q8_chan {ch} = opfuse_q8_chan_lanes({mult} + {at}, {shift} + {at}, {rm}, {ep.zp}, "
                   f"{ep.lo}, {ep.hi});")
            out.append((ch, "opfuse_q8_requantize"))
    return out


def _x86_store(kc, ep: QEpilogue, acc: str, bias: str, chan: tuple[str, str], n: str, out: str, res: str | None,
               at: str, nv: str) -> None:
    w = kc.w
    ch, fn = chan
    r = "NULL"
    if ep.res is not None and res is not None:
        rv = kc.tmp("res")
        sfx = "s8" if ep.res.q.dtype == np.int8 else "u8"
        w.line(f"const __m256i {rv} = opfuse_q8_load_{sfx}({res} + {at}, {nv}, {ep.res.zp});")
        r = f"&{rv}"
    unsigned = int(ep.out.dtype == np.uint8)
    w.line(f"opfuse_q8_store({out} + {at}, {fn}(_mm256_add_epi32({acc}, _mm256_loadu_si256((const __m256i*)({bias} "
           f"+ {n}))), &{ch}, {r}, {unsigned}), {nv});")


def _neon_store(kc, ep: QEpilogue, acc: str, bias: str, arrays: tuple[str, str, str], n: str, out: str,
                res: str | None, at: str, nv: str) -> None:
    w = kc.w
    mult, shift, rmult = arrays
    q, p = kc.tmp("q"), kc.tmp("p")
    r, rm = "NULL", "NULL"
    if ep.res is not None and res is not None:
        rb = kc.tmp("rb")
        w.line(f"int32_t {rb}[{NEON_LANES}];")
        w.line(f"for (long {p} = 0; {p} < {NEON_LANES}; ++{p}) {rb}[{p}] = {p} < {nv} ? (int32_t){res}[{at} + {p}] - "
               f"{ep.res.zp} : 0;")
        w.line(f"const int32x4_t {rb}_v = vld1q_s32({rb});")
        r, rm = f"&{rb}_v", f"{rmult} + {n}"
    w.line(f"int32_t {q}[{NEON_LANES}];")
    w.line(f"vst1q_s32({q}, opfuse_q8n_requantize_lanes(vaddq_s32(vld1q_s32({acc}), vld1q_s32({bias} + {n})), "
           f"{mult} + {n}, {shift} + {n}, {r}, {rm}, {ep.zp}, {ep.lo}, {ep.hi}));")
    w.line(f"for (long {p} = 0; {p} < {NEON_LANES} && {p} < {nv}; ++{p}) {out}[{at} + {p}] = "
           f"({c_type(ep.out.dtype)}){q}[{p}];")


def _portable(kc, ev, stage: Stage, x: QInput, ep: QEpilogue | None, wq: str, bits: int, dims: tuple) -> None:
    """Plain C99 over the vector kernel's packed weights (a compiler without the ISA): per row and column the
    centred products summed in uint32 (wrapping as the reference's int32), then the bias and
    ``opfuse_requantize_residual`` (or the stage's own epilogue, ``finish_element``). ``A`` is copied to scratch
    first where the output lies over it."""
    M, K, N, CP, per, NB = dims
    node = stage.anchor_node
    kc.program.require_helper("opfuse_q8_weights", PORTABLE_C)
    w = kc.w
    outs = [ep.out] if ep is not None else list(stage.outputs)
    qp = kc.ptr(x.q)
    ct, xs = c_type(x.q.dtype), kc.tmp("xs")
    if any(_shares_storage(kc, x.q, o) for o in outs):
        xoff = kc.scratch(M * K * x.q.dtype.itemsize)
        w.line(f"{ct}* restrict {xs} = ({ct}*)(scratch + {xoff});")
        w.line(f"memcpy({xs}, {qp}, sizeof({ct}) * {M * K});")
    else:
        w.line(f"const {ct}* {xs} = {qp};")
    m, n, k, acc = kc.tmp("m"), kc.tmp("n"), kc.tmp("k"), kc.tmp("acc")
    with w.block(f"for (long {m} = 0; {m} < {M}; ++{m})"), w.block(f"for (long {n} = 0; {n} < {N}; ++{n})"):
        w.line(f"uint32_t {acc} = 0;")
        with w.block(f"for (long {k} = 0; {k} < {K}; ++{k})"):
            index = f"((({n} / {NB}) * {CP} + {k} / {per}) * {NB} + {n} % {NB}) * {per} + {k} % {per}"
            w.line(f"{acc} += (uint32_t)(opfuse_q8_w{bits}({wq}, {index}) * ((int32_t){xs}[{m} * {K} + {k}] - "
                   f"{x.zp}));")
        if ep is None:
            with ev.scope():
                y = kc.tmp("y")
                w.line(f"const int32_t {y} = (int32_t){acc};")
                finish_element(kc, ev, stage, node.outputs[0], Index(node.outputs[0].shape, (m, n)), y)
        else:
            _requantize_element(kc, ep, acc, m, n, N)


def _requantize_element(kc, ep: QEpilogue, acc: str, m: str, n: str, N: int) -> None:
    """``out[m, n] = opfuse_requantize_residual(acc + bias[n], ...)`` (the plain branch's requantizing epilogue)."""
    rq = kc.program.require_helper(REQUANTIZE_RESIDUAL_HELPER, REQUANTIZE_RESIDUAL_C)
    name = ep.out.name
    arrays = {key: kc.const_array((f"q8_{key}", name), values, f"{name}_{key}", dt)
              for key, values, dt in (("bias", ep.bias, np.int32), ("mult", ep.mult, np.int32),
                                      ("shift", ep.shift, np.int32), ("rmult", ep.rmult, np.int64))
              if values is not None}
    out = kc.ptr(ep.out, write=True)
    at = f"{m} * {N} + {n}"
    res, rmult = "0", "0"
    if ep.res is not None:
        res = f"(int32_t){kc.ptr(ep.res.q)}[{at}] - {ep.res.zp}"
        rmult = f"{arrays['rmult']}[{n}]"
    kc.w.line(f"{out}[{at}] = ({c_type(ep.out.dtype)}){rq}((int32_t)({acc} + (uint32_t){arrays['bias']}[{n}]), "
              f"{arrays['mult']}[{n}], {arrays['shift']}[{n}], {res}, {rmult}, {ep.zp}, {ep.lo}, {ep.hi});")
