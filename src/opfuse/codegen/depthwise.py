"""Depthwise 2-D convolution (one input and one output channel per group), vectorised along
the output rows.

The threads share chunks of channel planes (``plane_chunk``). Per plane, one of three ways:

1. **direct** (AVX2, stride 1, output as large as the input, at most ``DIRECT_MAX_VECTORS``
   vectors): the flat plane ``dense[i] = sum_taps w * x[i + shift(tap)]`` straight from the
   input, unrolled whole; which lanes of each vector a tap may read is known at generation time,
   so edge vectors use masked loads (no read outside the plane, 0 where padding would be) and
   taps with no lane inside are left out (``_direct_plane``). No padded copy: on a 6 x 6 plane
   the copy, and the vector loads that reread it at once (store forwarding fails), took two
   thirds of the time;
2. **direct rows** (AVX2, column stride 1 or 2, output rows up to ``DIRECT_MAX_ROW_VECTORS``
   vectors): the same a row at a time, ``depthwise_row_block`` output rows together (and
   ``depthwise_block_group`` vectors of each, their FMA chains interleaved) so that an input row
   they share is loaded once; stride 2 takes the even or odd floats of two loads (one
   ``shufps``; the sum is put back in order once, before the store) (``_direct_rows``);
3. **copied** (everything else, and the plain C99 path): the plane is copied, through the
   prologue, into a zero-padded buffer (its padding zeroed once per chunk: it sits at the same
   places for every plane), each padded row stored as its ``s`` column phases (columns
   ``j = q*s + phase`` at ``phase * Wh + q``) so that the taps of consecutive outputs are
   consecutive floats; then each output row is ``sum_taps w[kh, kw] * row(oh*s + kh*d)[...]``,
   one unaligned vector load and one FMA per tap and 8 outputs (AVX2/FMA, four vectors in
   flight; plain C that gcc vectorises elsewhere). With stride 1 and a small plane the whole
   plane is one such row ("wide": the padding columns are computed and dropped).

The taps are summed in the same order (kernel row, then column) for every element. The outputs
go through the bias and the fused epilogue while they are in L1: row by row, or as one loop over
the dense plane where rows are short (a loop of a few elements is not vectorised, and a scalar
epilogue made the fused Conv+Relu slower than Conv, BatchNorm and Relu as three kernels). Where
the epilogue is only Relu and Clips with constant bounds, the rows path (rows of at least
``PLANE_EPILOGUE_MAX_ROW`` floats) finishes the vectors itself (bias add, ``max``/``min``: the
scalar epilogue's operations in its order, so the same bits) and stores them to the output, the
last vector of a row lane by lane (``register_epilogue``): with the blocking above, mobilenet_v1's
dw1 (32@112) and dw5 (256@28) took 0.62x the time of the scalar pass (in the model, 1 thread,
wall clock, ``benchmarks/bench_depthwise.py --baseline``).

AVX-512 (``vector_isa`` "avx512" and ``CodegenOptions.depthwise_avx512``, on where the host's FMA pipes
are zmm wide): the in-place paths get a zmm body, ``#if`` before the AVX2 one, 16 floats a vector. Each
element sums its taps in the same order as in the AVX2 body, so the bits are the same. Its rows body
loads each input row's 16-float blocks once and shifts the taps' vectors out of two neighbours
(``valignd``; stride 2 first splits a block pair into its even and odd floats, ``vpermt2ps``)
(``_shifted_tap``), computes a whole row (up to 8 zmm) two rows at a time, finishes Relu, Clip and
HardSwish epilogues in registers, on short rows too. The small "same" planes have a zmm body of their own
(``_direct_plane_shifted``): each 16-float block of the flat plane loaded once, every tap's vector moved out of
two blocks by ``valignd`` with the padding's lanes zeroed by its mask, and a Relu, Clip or HardSwish epilogue
finished in registers; where that epilogue cannot be (a residual Add), the rows path runs those planes
(``depthwise_zmm_plane_rows``), but for planes of short rows (ds_cnn's 25 x 5), where the plane uses the lanes
the rows would leave empty (``depthwise_zmm_plane_rows_max_ratio``).
No zmm load or store is unaligned or masked: from or to a cold line those stalled the kernel (1.7x
the AVX2 body's time right after a 128 MiB copy); two ymm halves (``zmm_load``, ``_masked_zmm``, AVX2's
masked stores) do not. In mobilenet_v1, 1 thread: its depthwise layers 0.57-0.98x the AVX2 body's time.

The strided rows can prefetch their input into L2 a distance ahead (``CodegenOptions.depthwise_prefetch_bytes``,
off: it helped only right after a 128 MiB copy, and cost 1.03-1.21x in mobilenet_v1).

In NCHW the plane's width is the unit-stride axis, so this is where the vectors go: across
channels a vector would gather from ``C`` planes.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from opfuse.codegen.ctype import literal
from opfuse.codegen import simdchain
from opfuse.codegen.epilogue import VectorEpilogue, finish_element
from opfuse.codegen.gemm import in_memory
from opfuse.codegen.index import Index, add, mul
from opfuse.codegen.microkernel import AVX2_GUARD
from opfuse.codegen.stages import Stage
from opfuse.codegen.vecmath import AVX2_FLOAT, AVX512_FLOAT, VecIsa
from opfuse.ir.graph import Value
from opfuse.ops.registry import get_spec

VECTOR = 8     # floats per ymm register
ZMM = 16       # floats per zmm register (the AVX-512 bodies of the in-place paths)
UNROLL = 4     # independent accumulators per row step (the FMA latency is 4 cycles)
MAX_TAPS_IN_REGISTERS = 10  # beyond this the weights are broadcast from memory at each use
# Padded planes up to this many floats are computed as one wide row: with the wide results
# the plane and they stay in L1 (a 112 x 112 plane that way ran 30% slower than row by row).
WIDE_MAX_FLOATS = 2048
# Epilogue ops whose scalar form gcc leaves a call or a lane-by-lane chain in the dense plane's loop: where the
# epilogue has one (and all its ops have a vector form), the loop runs in intrinsics (``_dense_epilogue``).
DENSE_VECTOR_OPS = frozenset({"Exp", "Log", "Sigmoid", "Silu", "Softplus", "Tanh", "Gelu", "Erf"})
# Stride-1 "same" planes of up to this many vectors (16 x 16 floats) are computed straight from
# the input with AVX2, unrolled whole (no padded copy: on a 6 x 6 plane the copy, and the vector
# loads that reread it at once, took two thirds of the time).
DIRECT_MAX_VECTORS = 32
# Other planes with column stride 1 or 2, up to this many output vectors a row (128 floats),
# read in place too, one output row at a time.
DIRECT_MAX_ROW_VECTORS = 16
# Output rows shorter than this go through the epilogue as one plane, not row by row (a loop of a
# few elements is not vectorised).
PLANE_EPILOGUE_MAX_ROW = 16


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
    simd = kc.program.options.simd == "auto"
    # "direct" (AVX2, AVX-512): a small stride-1 plane that keeps its size reads the input in place,
    # no padded copy (see ``_direct_plane``). Otherwise the plane is copied into a padded buffer
    # and, for stride 1 and small planes, computed as one "wide" row (i = oh * Wp + ow; the
    # columns ow >= OW are computed and dropped), else one pass per output row, written at
    # oh * OW. The vectors run past the last output into whole vectors (no scalar tail): the
    # plane buffer has slack for their reads and the results for their writes (a row's overrun
    # is overwritten by the next row).
    # The in-place paths leave out taps whose lanes all fall in the padding, which is exact only
    # when every weight is finite (inf or NaN times a padding zero is NaN, as in the reference):
    # weights known at compile time and all finite, else the padded copy.
    known = ev.static.get(id(wt))
    finite_weights = known is not None and bool(np.isfinite(known).all())
    simd_in_place = simd and finite_weights
    direct = (simd_in_place and (SH, SW) == (1, 1) and (OH, OW) == (H, W) and in_memory(ev, x)
              and -(-H * W // VECTOR) <= DIRECT_MAX_VECTORS)
    # "direct rows" (AVX2, AVX-512): any other plane whose column stride is 1 or 2, in place too, one
    # output row at a time, each row through the epilogue at once (``_direct_rows``).
    direct_rows = (simd_in_place and not direct and SW in (1, 2) and in_memory(ev, x)
                   and -(-OW // VECTOR) <= DIRECT_MAX_ROW_VECTORS)
    # The rows path finishes the bias and a Relu or Clip epilogue on the vectors and stores them
    # (``register_epilogue``) where its rows are long enough to be stored row by row; elsewhere the
    # epilogue is one loop over the dense plane, which gcc vectorises whole (in the model, mobilenet_v1's
    # 14 x 14 layers ran 1.06-1.14x slower with the register epilogue on the direct plane, or on
    # rows of 7 or 14 floats stored a part vector each, than with the dense pass).
    long_rows = direct_rows and OW >= PLANE_EPILOGUE_MAX_ROW
    reg = register_epilogue(kc, ev, stage, node) if long_rows else None
    copy_simd = simd and not (direct or direct_rows)  # the copy path has AVX2 code (else it is only the #else)
    # The in-place paths get an AVX-512 body too (``#if`` before the AVX2 one) where the target's
    # vector ISA is AVX-512 and ``depthwise_avx512`` (resolved from the host's FMA width) is on.
    zmm = kc.program.options.vector_isa == "avx512" and bool(kc.program.options.depthwise_avx512)
    # The zmm bodies store a part vector through a mask (one instruction), so they finish the epilogue in
    # registers on rows shorter than 16 floats too (``depthwise_zmm_register_epilogue``). Not on the
    # whole plane: there it ran 1.06x slower than the dense pass (mobilenet_v1's 512@14 layers, 1 thread,
    # kernel CPU time, 30 interleaved runs), as it did with AVX2.
    zmm_reg = (register_epilogue(kc, ev, stage, node, hardswish=True)
               if zmm and direct_rows and kc.program.options.depthwise_zmm_register_epilogue else reg)
    # A whole-plane layer's zmm body is the shifted plane, finishing a Relu/Clip/HardSwish epilogue on its vectors
    # (``depthwise_zmm_plane_register_epilogue``) in a branch of its own. Where it cannot (a residual Add, or the
    # options off), the rows path runs instead (``depthwise_zmm_plane_rows``), its epilogue with it, but not where
    # the rows would waste most lanes on short rows (``depthwise_zmm_plane_rows_max_ratio``); the AVX2 body and the
    # copy keep theirs in the ``#else``.
    opts = kc.program.options
    plane_reg = (register_epilogue(kc, ev, stage, node, hardswish=True)
                 if zmm and direct and opts.depthwise_zmm_plane_shifted
                 and opts.depthwise_zmm_plane_register_epilogue else None)
    zmm_plane = -(-OH * OW // AVX512_FLOAT.lanes)
    zmm_rows = OH * -(-OW // AVX512_FLOAT.lanes)
    short_rows = (zmm_plane >= opts.depthwise_zmm_plane_min_vectors
                  and zmm_rows >= opts.depthwise_zmm_plane_rows_max_ratio * zmm_plane)
    plane_rows = (zmm and direct and plane_reg is None and opts.depthwise_zmm_plane_rows and not short_rows
                  and -(-OW // VECTOR) <= DIRECT_MAX_ROW_VECTORS)
    plane_rows_reg = (register_epilogue(kc, ev, stage, node, hardswish=True)
                      if plane_rows and opts.depthwise_zmm_register_epilogue else None)
    wide = SH == 1 and SW == 1 and Hp * Wp <= WIDE_MAX_FLOATS
    exact = (OH - 1) * Wp + OW if wide else OW
    span = _round_up(exact, VECTOR)
    reach = (KH - 1) * DH * row_len + ((KW - 1) * DW) % SW * Wh + (KW - 1) * DW // SW + span
    last_row = 0 if wide else (OH - 1) * SH * row_len
    slack = max(0, last_row + reach - Hp * row_len)
    plane_floats = Hp * row_len + slack
    off_plane = kc.scratch(plane_floats * 4)
    off_acc = kc.scratch(max(span if wide else (OH - 1) * OW + span, (OH - 1) * OW + _round_up(OW, VECTOR),
                             max(kc.program.options.depthwise_row_block,
                                 kc.program.options.depthwise_zmm_row_block if zmm else 0) * _round_up(OW, VECTOR)) * 4)
    # The dense OH x OW results the epilogue reads: the row passes write them; the wide pass's
    # are squeezed into them only where the AVX2 code is direct (the plain path then squeezes, in
    # scalar code). Otherwise the epilogue reads the wide results row by row: squeezing them with
    # vectors and reading them back at other offsets stalls on store forwarding, and a small
    # plane's epilogue is what follows at once.
    vec_epilogue = _plan_dense_epilogue(kc, ev, stage, out)
    vectors: list[bool] = []  # per epilogue loop written: in vectors?
    planes = nimg * C
    per_chunk = plane_chunk(planes, kc.program.options)
    # Small planes of the direct path: the epilogue once over the chunk's planes (``_batch_epilogue``)
    batch = _plan_batch(kc, ev, stage, out, vec_epilogue, per_chunk) \
        if direct and not (direct_rows or plane_rows or plane_reg is not None) else None
    off_dense = kc.scratch((per_chunk * OH * OW + VECTOR if batch is not None else _round_up(OH * OW, VECTOR)) * 4) \
        if direct and wide else off_acc
    if simd:
        kc.program.require_helper("opfuse_immintrin", f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n")
    w = kc.w
    chunks = -(-planes // per_chunk)
    chunk, plane, first = kc.tmp("chunk"), kc.tmp("plane"), kc.tmp("first")
    kc.parallel_for(2 * nimg * C * OH * OW * KH * KW,
                    costs=[float(min(per_chunk, planes - c0)) for c0 in range(0, planes, per_chunk)])
    with w.block(f"for (long {chunk} = 0; {chunk} < {chunks}; ++{chunk})"):
        xp, acc = kc.tmp("xpad"), kc.tmp("acc")
        dense = kc.tmp("dense") if off_dense != off_acc else acc
        w.line(f"float* restrict {xp} = {kc.scratch_ptr('float', off_plane)};")
        w.line(f"float* restrict {acc} = {kc.scratch_ptr('float', off_acc)};")
        if dense != acc:
            w.line(f"float* restrict {dense} = {kc.scratch_ptr('float', off_dense)};")
        # The padding (and the slack) sits at the same places for every plane: zeroed once per chunk.
        if direct or direct_rows:
            w.line(f"#if !({AVX2_GUARD})")
        w.line(f"memset({xp}, 0, sizeof(float) * {plane_floats});")
        if direct or direct_rows:
            w.line("#endif")
        base = dense
        with planes_of_chunk(kc, ev, (chunk, plane, first), per_chunk, planes, C) as (img, ch):
            if batch is not None:  # this plane's results at its place among the chunk's
                dense = kc.tmp("dplane")
                w.line(f"float* restrict {dense} = {base} + ({plane} - {first}) * {OH * OW};")
            weights = [[ev.at(wt, Index(wt.shape, (ch, "0", str(kh), str(kw)))) for kw in range(KW)]
                       for kh in range(KH)]
            if direct or direct_rows:
                src = f"{kc.ptr(x)} + {Index(x.shape, (img, ch, '0', '0')).offset()}"
                if plane_rows or plane_reg is not None:
                    w.line(f"#if {AVX512_FLOAT.guard}")
                    with ev.scope():
                        if plane_rows:
                            vectors.append(_direct_rows(kc, ev, stage, node, bias_term, src, weights, geo, acc,
                                                        (img, ch), OW < PLANE_EPILOGUE_MAX_ROW, plane_rows_reg,
                                                        AVX512_FLOAT, vec_epilogue))
                        else:
                            assert plane_reg is not None
                            out_plane = (f"{kc.ptr(plane_reg.out, write=True)} + "
                                         f"{Index(plane_reg.out.shape, (img, ch, '0', '0')).offset()}")
                            _direct_plane_shifted(kc, src, weights, geo, (H, W), out_plane,
                                                  _finish_vectors(kc, ev, plane_reg, node, ch, AVX512_FLOAT))
                    w.line("#else")
                own_zmm_branch = plane_rows or plane_reg is not None
                for i, isa in enumerate((AVX512_FLOAT, AVX2_FLOAT) if zmm and not own_zmm_branch else (AVX2_FLOAT,)):
                    w.line(f"#{'el' if i else ''}if {isa.guard}")
                    with ev.scope():  # each branch declares its own temporaries
                        if direct:
                            if isa is AVX512_FLOAT and kc.program.options.depthwise_zmm_plane_shifted:
                                _direct_plane_shifted(kc, src, weights, geo, (H, W), dense)
                            else:
                                _direct_plane(kc, src, weights, geo, (H, W), dense, isa)
                        else:
                            vectors.append(_direct_rows(kc, ev, stage, node, bias_term, src, weights, geo, acc,
                                                        (img, ch), OW < PLANE_EPILOGUE_MAX_ROW,
                                                        zmm_reg if isa is AVX512_FLOAT else reg, isa, vec_epilogue))
                w.line("#else")
            copy_plane(kc, ev, x, img, ch, xp, (H, W), (PT, PL), SW, Wh)
            taps = [(weights[kh][kw], kh * DH, (kw * DW % SW) * Wh + kw * DW // SW)
                    for kh in range(KH) for kw in range(KW)]
            oh = kc.tmp("oh")
            if wide:
                _taps_pass(kc, [(wv, f"{xp} + {r * row_len + c}") for wv, r, c in taps], acc, span, exact,
                           copy_simd)
                if direct:
                    ow = kc.tmp("ow")
                    w.line(f"for (long {oh} = 0; {oh} < {OH}; ++{oh}) for (long {ow} = 0; {ow} < {OW}; ++{ow}) "
                           f"{dense}[{oh} * {OW} + {ow}] = {acc}[{oh} * {Wp} + {ow}];")
            else:
                with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"):
                    rows: dict[int, str] = {}
                    for _, r, _ in taps:
                        if r not in rows:
                            rows[r] = kc.tmp("row")
                            w.line(f"const float* restrict {rows[r]} = {xp} + ({oh} * {SH} + {r}) * {row_len};")
                    _taps_pass(kc, [(wv, f"{rows[r]} + {c}") for wv, r, c in taps], f"({acc} + {oh} * {OW})",
                               span, exact, copy_simd)
            if direct:
                w.line("#endif")
            y = kc.tmp("y")
            if wide and not direct:
                oh, ow = kc.tmp("oh"), kc.tmp("ow")
                with w.block(f"for (long {oh} = 0; {oh} < {OH}; ++{oh})"), \
                        w.block(f"for (long {ow} = 0; {ow} < {OW}; ++{ow})"), ev.scope():
                    w.line(f"const float {y} = {bias_term(ev, node, f'{acc}[{oh} * {Wp} + {ow}]', ch)};")
                    finish_element(kc, ev, stage, out, Index(out.shape, (img, ch, oh, ow)), y)
            elif batch is not None:  # the bias now, the epilogue over the chunk below
                b = _bias_at(ev, node, ch)
                if b is not None:
                    p = kc.tmp("p")
                    w.line(f"for (long {p} = 0; {p} < {OH * OW}; ++{p}) {dense}[{p}] = {dense}[{p}] + {b};")
            else:
                # (under the plain branch's #else where the rows paths run: no vectors there)
                in_plain = direct_rows or plane_rows or plane_reg is not None
                vectors.append(_dense_epilogue(kc, ev, stage, node, bias_term, dense, OH * OW, (img, ch),
                                               None if in_plain else vec_epilogue, names=("p", y)))
            if direct_rows or plane_rows or plane_reg is not None:
                w.line("#endif")
        if batch is not None:
            end = f"({first} + {per_chunk} < {planes} ? {first} + {per_chunk} : {planes})"
            _batch_epilogue(kc, ev, stage, node, batch, base, first, f"({end} - {first}) * {OH * OW}", OH * OW)
            vectors.append(True)
    if reg is not None:
        kc.note(lambda name: f"depthwise '{name}': epilogue finished in registers", node)
    if any(vectors):
        isas = " / ".join(i.name for i in simdchain.isas_for(kc.program.options))
        kc.note(lambda name: f"depthwise '{name}': epilogue over the plane or its rows in {isas} intrinsics", node)
    elif vec_epilogue is not None:
        kc.note(lambda name, r=vec_epilogue: f"depthwise '{name}': scalar epilogue loop ({r})", node)
    if zmm and (direct or direct_rows):
        kc.note(lambda name: f"depthwise '{name}': AVX-512 body (zmm)"
                + (", its epilogue in registers" if zmm_reg is not None or plane_reg is not None else ""), node)


def _bias_at(ev, node, ch: str) -> str | None:
    """The C of channel ``ch``'s bias (the Conv's third input), or None without one: what ``bias_term`` adds."""
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    return ev.at(bias, Index(bias.shape, (ch,))) if bias is not None else None


def _dense_index(out: Value, img: str, ch: str, p: str) -> Index:
    """Element ``p`` of the flat output plane of image ``img``, channel ``ch``."""
    return Index.loops(out.shape, [(0, 1, img), (1, 2, ch), (2, 4, p)])


def _plan_dense_epilogue(kc, ev, stage: Stage, out: Value) -> "VectorEpilogue | str | None":
    """The vector form of the epilogue over the dense plane (``epilogue.VectorEpilogue``), or why it has none, or
    None where it is not tried: the build has no vector ISA, ``CodegenOptions.depthwise_vector_epilogue`` is off, or
    the epilogue has no op of ``DENSE_VECTOR_OPS`` (gcc vectorises the scalar loop of the others itself)."""
    opts = kc.program.options
    if not (opts.depthwise_vector_epilogue and opts.vector_epilogue and simdchain.isas_for(opts)) \
            or not any(n.op_type in DENSE_VECTOR_OPS for n in stage.epilogue):
        return None
    img, ch = "0", "0"
    return VectorEpilogue.plan(kc, ev, stage, out, lambda v: _dense_index(out, img, ch, v))


def _plan_batch(kc, ev, stage: Stage, out: Value, vec: "VectorEpilogue | str | None",
                per_chunk: int) -> "VectorEpilogue | None":
    """The epilogue's vector form over a chunk's planes as one flat range of the output, where a plane has fewer
    than ``CodegenOptions.depthwise_batch_epilogue_below`` floats (a few vectors: each one's exp chain waits on
    its own latency, where a longer loop keeps several in flight), the chunk has more than one plane, and the
    epilogue reads nothing that varies with the channel or along the planes but their results (the bias is added
    plane by plane first): None otherwise."""
    OH, OW = out.shape[2:]
    if not isinstance(vec, VectorEpilogue) or per_chunk < 2 \
            or OH * OW >= kc.program.options.depthwise_batch_epilogue_below:
        return None
    flat = VectorEpilogue.plan(kc, ev, stage, out, lambda v: Index.loops(out.shape, [(0, 4, v)]))
    if not isinstance(flat, VectorEpilogue) or flat.varying:
        return None
    return flat


def _batch_epilogue(kc, ev, stage: Stage, node, vec: VectorEpilogue, dense: str, first: str, n: str,
                    plane: int) -> None:
    """The epilogue over ``n`` results at ``dense`` (the chunk's planes from plane ``first`` on, biased), the flat
    output from ``first * plane`` on: in vectors of each ISA (``VectorEpilogue.row``, the last elements the
    vector that ends at the end), the scalar loop under ``#else``; the same bits as plane by plane."""
    w = kc.w
    out = node.outputs[0]

    def position(t: str) -> str:
        return f"{first} * {plane} + {t}"

    def index(pos: str) -> Index:
        return Index.loops(out.shape, [(0, 4, pos)])

    def element(t: str) -> None:
        finish_element(kc, ev, stage, out, index(position(t)), f"{dense}[{t}]")

    for k, isa in enumerate(simdchain.isas_for(kc.program.options)):
        w.line(f"#{'if' if k == 0 else 'elif'} {isa.guard}")
        with w.block(""), ev.scope():
            vec.row(isa, kc.tmp("q"), "0", n, dense, position, index, None, element, "qo", overlap_tail=True)
    w.line("#else")
    q = kc.tmp("q")
    with w.block(f"for (long {q} = 0; {q} < {n}; ++{q})"), ev.scope():
        element(q)
    w.line("#endif")


def _dense_epilogue(kc, ev, stage: Stage, node, bias_term, dense: str, n: int, where,
                    vec: "VectorEpilogue | str | None", within: VecIsa | None = None, row: str | None = None,
                    names: tuple[str, str | None] = ("p", None), offset: int | None = None) -> bool:
    """The bias and the epilogue over the ``n`` dense results of one plane (or of output row ``row``) at
    ``dense``: in vectors where ``vec`` is the epilogue's vector form (``VectorEpilogue.row``: the scalar operations
    in their order, the same bits), in each ISA behind ``#if`` and the scalar loop under ``#else``, or in
    ``within``'s alone (the caller's ISA branch); else the scalar loop. Whether it wrote vectors. ``names``: the
    scalar loop variable's prefix and the C name of its element (None: a new one); ``offset``: the results start
    that many floats into ``dense``."""
    w = kc.w
    img, ch = where
    out = node.outputs[0]

    def index(p: str) -> Index:
        return _dense_index(out, img, ch, p) if row is None else Index(out.shape, (img, ch, row, p))

    def element(p: str, y: str | None = None) -> None:
        y = y or kc.tmp("y")
        at = p if offset is None else f"{offset} + {p}"
        w.line(f"const float {y} = {bias_term(ev, node, f'{dense}[{at}]', ch)};")
        finish_element(kc, ev, stage, out, index(p), y)

    def scalar() -> None:
        p = kc.tmp(names[0])
        y = names[1] or kc.tmp("y")
        with w.block(f"for (long {p} = 0; {p} < {n}; ++{p})"), ev.scope():
            element(p, y)

    def vector(isa: VecIsa) -> None:
        assert isinstance(vec, VectorEpilogue)
        with w.block(""), ev.scope():
            b = _bias_at(ev, node, ch)
            src = dense if offset is None else f"({dense} + {offset})"
            vec.row(isa, kc.tmp("p"), "0", str(n), src, lambda t: t, index, b, element, "po", overlap_tail=True)
    isas = simdchain.isas_for(kc.program.options)
    if not isinstance(vec, VectorEpilogue) or (within is not None and within not in isas):
        scalar()
        return False
    if within is not None:
        vector(within)
        return True
    for k, isa in enumerate(isas):
        w.line(f"#{'if' if k == 0 else 'elif'} {isa.guard}")
        vector(isa)
    w.line("#else")
    scalar()
    w.line("#endif")
    return True


def _direct_rows(kc, ev, stage: Stage, node, bias_term, src: str, weights, geo, acc: str, where,
                 plane_epilogue: bool, reg: "RegisterEpilogue | None" = None, isa: VecIsa = AVX2_FLOAT,
                 row_vec: "VectorEpilogue | str | None" = None) -> bool:
    """AVX2 or AVX-512 (``isa``), any row stride, column stride 1 or 2: each output row's vectors
    from the input rows in place, into ``acc``, then the row through the bias and the epilogue
    while it is in L1.

    A tap's ``L`` inputs (``L = isa.lanes``) for outputs ``ow0..ow0+L-1`` start at column ``ow0 * SW
    + c`` (``c = kw * DW - PL``). Stride 1: one unaligned load. Stride 2: the even or odd floats of
    the ``2L`` from the even column below, two loads and one shuffle: AVX2's ``shufps`` leaves the 8
    in the order 0 1 4 5 2 3 6 7, the same for every tap, so the sum is put in order once, before
    the store; AVX-512's ``vpermt2ps`` picks the 16 in order. Loads that reach past either end of
    the input row are masked (masked lanes read nothing and give 0, as padding would); taps whose
    lanes all fall outside are left out. Rows are grouped by which kernel rows fall inside the
    input (the top and bottom rows leave some out); each group is one loop, over
    ``depthwise_row_block`` rows at a time (``rows_body``), each row's vectors ``depthwise_block_group``
    at a time. Every element sums its taps in kernel row, then column order, a multiply then
    multiply-adds, whatever the ISA or blocking: the AVX-512 and AVX2 bodies give the same bits.
    ``plane_epilogue``: the rows are written at ``oh * OW`` instead and the epilogue runs once,
    over the dense plane (for short rows, whose epilogue loop would not be vectorised).
    ``reg``: the vectors are finished (``RegisterEpilogue``) and stored to the output instead; ``row_vec``: the
    epilogue's vector form over a row or the plane (``_plan_dense_epilogue``), where it has one.
    The AVX-512 body stores a row's last vector through a mask (no write past the row); AVX2's
    whole vectors run into the next row (or ``acc``'s slack) and are overwritten there. Whether the epilogue ran in
    vectors (``_dense_epilogue``)."""
    w = kc.w
    L, vt, p = isa.lanes, isa.vt, isa.p
    img, ch = where
    vectors: list[bool] = []  # per epilogue loop written: in vectors?
    out = node.outputs[0]
    H, W = node.input(0).shape[2:]
    OH, OW = out.shape[2:]
    KH, KW = geo.kernel
    (SH, SW), (DH, DW), (PT, PL) = geo.strides, geo.dilations, geo.pads_begin
    base = kc.tmp("src")
    w.line(f"const float* {base} = {src};")
    wvs = [[kc.tmp("wv") for _ in row] for row in weights]
    for names, row in zip(wvs, weights, strict=True):
        for name, wv in zip(names, row, strict=True):
            w.line(f"const {vt} {name} = {p}_set1_ps({wv});")
    loader = _Loads(kc, isa, W)
    blocks = -(-OW // L)
    taps = {}  # (block, kw) -> the column of the tap's first input (stride 2: of the even floats' pair below)
    for b in range(blocks):
        for kw in range(KW):
            c = b * L * SW + kw * DW - PL
            cols = [(b * L + lane) * SW + kw * DW - PL for lane in range(L)]
            if not any(b * L + lane < OW and 0 <= col < W for lane, col in enumerate(cols)):
                continue
            taps[b, kw] = c
    # Declare every mask (and AVX-512's even/odd index vectors) first, in one C scope: the plane's;
    # then emit the row loops.
    # AVX-512: each input row's 16-float blocks loaded once (stride 2: split into their even and odd
    # floats once), the taps' vectors shifted out of two neighbours (``_shifted_tap``) where every tap
    # lies within a vector of the block.
    shifted = L == ZMM and kc.program.options.depthwise_zmm_shifted_taps and all(
        -L < (kw * DW - PL) // SW < L for kw in range(KW))
    for k in range(-(-W // L) if shifted else 0):  # the blocks ``_shifted_tap`` loads
        loader.load("row", k * L)
    for c in taps.values():
        if SW == 1:
            loader.load("row", c)
        else:
            even = c - c % 2
            loader.load("row", even), loader.load("row", even + L)
            loader.odd_even(c % 2)
    classes = row_classes(OH, KH, SH, DH, PT, H)
    oh = kc.tmp("oh")
    pitch = _round_up(OW, VECTOR)  # a row's results in ``acc`` (row by row epilogue)
    o = kc.program.options
    row_block, block_group = ((o.depthwise_zmm_row_block, o.depthwise_zmm_block_group) if L == ZMM
                              else (o.depthwise_row_block, o.depthwise_block_group))
    finish = _finish_vectors(kc, ev, reg, node, ch, isa) if reg is not None else None
    dst = (f"{kc.ptr(reg.out, write=True)} + {Index(reg.out.shape, (img, ch, '0', '0')).offset()}"
           if reg is not None else "")

    # Input prefetch (strided rows): the step's rows ``prefetch`` floats past the last row it reads.
    prefetch = o.depthwise_prefetch_bytes // 4 if SH >= o.depthwise_prefetch_min_stride else 0
    inp = node.input(0)
    x_ptr, x_floats = (kc.ptr(inp), int(np.prod(inp.shape))) if prefetch else ("", 0)
    plane_at = Index(inp.shape, (img, ch, "0", "0")).offset()

    def store(at: str, v: str, b: int) -> None:
        """Vector ``b`` of a row to ``at``: whole, or (AVX-512) its lanes inside the row."""
        _store_lanes(kc, at, v, L if L == VECTOR else min(L, OW - b * L), isa)

    def rows_body(inside: tuple[int, ...], nrows: int) -> None:
        """Output rows ``oh .. oh + nrows - 1``: every input row they read is loaded once per vector
        and feeds each of them that reads it (their taps summed in kernel order all the same)."""
        rows: dict[int, str] = {}  # input row offset from oh * SH -> pointer
        users: dict[int, list[tuple[int, int]]] = {}  # offset -> [(output row j, kernel row kh)]
        for j in range(nrows):
            for kh in inside:
                d = j * SH + kh * DH - PT
                users.setdefault(d, []).append((j, kh))
        for d in sorted(users):
            rows[d] = kc.tmp("row")
            w.line(f"const float* {rows[d]} = {base} + {add(mul(oh, SH * W), str(d * W))};")
        if prefetch:
            _prefetch_rows(kc, x_ptr, f"{plane_at} + {mul(oh, SH * W)} + {max(users) * W}", nrows * SH * W,
                           x_floats, prefetch)
        stores: list[tuple[int, int, str]] = []
        for group in [range(b0, min(b0 + block_group, blocks)) for b0 in range(0, blocks, block_group)]:
            # The blocks of a group are computed together, input row by input row: their
            # accumulators' chains of FMAs interleave (each element's taps in the same order).
            vs = {b: [kc.tmp("v") for _ in range(nrows)] for b in group}
            started = {b: [False] * nrows for b in group}
            for d in sorted(users):
                centers: dict[int, str] = {}
                for b in group:
                    pairs: dict[int, tuple[str, str]] = {}
                    for kw in range(KW):
                        if (b, kw) not in taps:
                            continue
                        c = taps[b, kw]
                        x: str | None
                        if shifted:
                            x = _shifted_tap(kc, loader, rows[d], centers, b, c - b * L * SW, SW)
                        elif SW == 1:
                            x = loader.load(rows[d], c)
                        else:
                            even = c - c % 2
                            if even not in pairs:
                                lo_v, hi_v = loader.load(rows[d], even), loader.load(rows[d], even + L)
                                zero = f"{p}_setzero_ps()"
                                pairs[even] = (kc.tmp("lo"), kc.tmp("hi"))
                                w.line(f"const {vt} {pairs[even][0]} = {lo_v or zero}, "
                                       f"{pairs[even][1]} = {hi_v or zero};")
                            x = loader.odd_even_of(*pairs[even], c % 2)
                        if x is None:
                            continue
                        if len(users[d]) > 1:
                            t = kc.tmp("x")
                            w.line(f"const {vt} {t} = {x};")
                            x = t
                        for j, kh in users[d]:
                            v, wv = vs[b][j], wvs[kh][kw]
                            first = not started[b][j]
                            expr = f"{p}_mul_ps({wv}, {x})" if first else f"{p}_fmadd_ps({wv}, {x}, {v})"
                            w.line(f"{vt + ' ' if first else ''}{v} = {expr};")
                            started[b][j] = True
            for b in group:
                for j, v in enumerate(vs[b]):
                    if not started[b][j]:
                        w.line(f"{vt} {v} = {p}_setzero_ps();")
                    elif SW == 2 and L == VECTOR:  # 0 1 4 5 2 3 6 7 -> 0 .. 7: 64-bit pairs 0 2 1 3
                        w.line(f"{v} = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd({v}), 0xD8));")
                    if finish is not None:
                        at = add(dst, add(mul(oh, OW), str(j * OW + b * L)))
                        _store_lanes(kc, at, finish(v), min(L, OW - b * L), isa)
                    elif plane_epilogue:  # AVX2: rows overlap by a vector's overrun: stored row after row, below
                        stores.append((j, b, v))
                    else:
                        store(f"{acc} + {j * pitch + b * L}", v, b)
        if finish is not None:
            return
        if plane_epilogue:
            for j, b, v in sorted(stores):
                store(f"{acc} + {add(mul(oh, OW), str(j * OW + b * L))}", v, b)
            return
        for j in range(nrows):
            vectors.append(_dense_epilogue(kc, ev, stage, node, bias_term, acc, OW, (img, ch), row_vec, isa,
                                           add(oh, str(j)), names=("ow", None), offset=j * pitch))

    for lo, hi, inside in classes:
        pair_end = lo + (hi - lo) // row_block * row_block
        if pair_end > lo:
            with w.block(f"for (long {oh} = {lo}; {oh} < {pair_end}; {oh} += {row_block})"):
                rows_body(inside, row_block)
        if pair_end < hi:
            with w.block(f"for (long {oh} = {pair_end}; {oh} < {hi}; ++{oh})"):
                rows_body(inside, 1)
    if plane_epilogue and finish is None:
        vectors.append(_dense_epilogue(kc, ev, stage, node, bias_term, acc, OH * OW, (img, ch), row_vec, isa))
    return any(vectors)


def _prefetch_rows(kc, tensor: str, first: str, floats: int, total: int, ahead: int) -> None:
    """Prefetch into L2 the ``floats`` floats ``ahead`` floats past element ``first`` of ``tensor`` (``total``
    floats), one ``prefetcht1`` a line, unrolled (in mobilenet_v1 the loop form cost its strided layers 1.18-1.29x,
    this 1.13-1.21x); where any of them would fall past the tensor's end, none."""
    pf = kc.tmp("pf")
    kc.w.line(f"const long {pf} = {first} + {ahead};")
    with kc.w.block(f"if ({pf} + {floats} <= {total})"):
        for i in range(0, floats, 16):
            kc.w.line(f"_mm_prefetch((const char*)({tensor} + {add(pf, str(i))}), _MM_HINT_T1);")


class _Loads:
    """Loads of ``isa.lanes`` floats from an input row of ``width`` floats, masked where they reach
    outside it. AVX2's masks are ``__m256i`` constants declared at first use (so each is declared
    once, in the scope of the first call: the caller makes one call per mask before its loops);
    AVX-512's are ``__mmask16`` immediates. Stride 2's even/odd index vectors (AVX-512) likewise."""

    def __init__(self, kc, isa: VecIsa, width: int) -> None:
        self.kc, self.isa, self.width = kc, isa, width
        self.masks: dict[tuple[bool, ...], str] = {}
        self.index: dict[int, str] = {}

    def load(self, row: str, start: int) -> str | None:
        """The floats of row ``row`` from column ``start``, masked where outside it; None where
        every lane is outside."""
        L, p = self.isa.lanes, self.isa.p
        lanes = tuple(0 <= start + lane < self.width for lane in range(L))
        if not any(lanes):
            return None
        at = add(row, str(start))
        if all(lanes):
            return zmm_load(at) if L == ZMM else f"{p}_loadu_ps({at})"
        if L == ZMM and self.width < ZMM:
            return _masked_zmm(self.kc, self.masks, at, lanes)
        if L == ZMM:
            return _zmm_edge_load(row, start, self.width, lanes)
        return _masked_ymm(self.kc, self.masks, at, lanes)

    def odd_even(self, odd: int) -> None:
        """Declare AVX-512's index vector of the even (``odd`` 0) or odd floats of a pair."""
        if self.isa.lanes == ZMM and odd not in self.index:
            self.index[odd] = self.kc.tmp("pick")
            picks = ", ".join(str(2 * i + odd) for i in range(ZMM))
            self.kc.w.line(f"const __m512i {self.index[odd]} = _mm512_setr_epi32({picks});")

    def odd_even_of(self, lo: str, hi: str, odd: int) -> str:
        """The even or odd floats of ``lo`` then ``hi``: AVX-512 in order, AVX2 as 0 1 4 5 2 3 6 7."""
        if self.isa.lanes == ZMM:
            return f"_mm512_permutex2var_ps({lo}, {self.index[odd]}, {hi})"
        return f"_mm256_shuffle_ps({lo}, {hi}, {0xDD if odd else 0x88})"


def _masked_ymm(kc, masks: dict, at: str, lanes: tuple[bool, ...]) -> str:
    """8 floats from ``at``, 0 in the lanes not in ``lanes``: a load, zero, or AVX2's masked load (which
    reads nothing at the lanes masked off), its ``__m256i`` mask declared at first use (``masks``)."""
    if all(lanes):
        return f"_mm256_loadu_ps({at})"
    if not any(lanes):
        return "_mm256_setzero_ps()"
    if lanes not in masks:
        masks[lanes] = kc.tmp("mask")
        key = ", ".join("-1" if ok else "0" for ok in lanes)
        kc.w.line(f"const __m256i {masks[lanes]} = _mm256_setr_epi32({key});")
    return f"_mm256_maskload_ps({at}, {masks[lanes]})"


def _masked_zmm(kc, masks: dict, at: str, lanes: tuple[bool, ...]) -> str:
    """16 floats from ``at``, 0 in the lanes not in ``lanes``, as two ``_masked_ymm`` halves: an AVX-512
    masked load from a cold line stalls as an unaligned zmm load does (``zmm_load``): mobilenet_v1's
    dw 512@14 (rows of 14) on the rows body took 100-105 us right after a 128 MiB copy with
    ``vmovups zmm{k}{z}`` and 49-50 us with the halves (the AVX2 body 43-45; 1 thread, kernel CPU time,
    interleaved, load 12)."""
    lo, hi = (_masked_ymm(kc, masks, add(at, str(h)), lanes[h:h + VECTOR]) for h in (0, VECTOR))
    return (f"_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd({lo})), "
            f"_mm256_castps_pd({hi}), 1))")


def _zmm_edge_load(row: str, start: int, width: int, lanes) -> str:
    """The 16 floats of row ``row`` (at least 16 floats) from column ``start``, 0 in the lanes outside
    it: the whole vector that ends (or starts) at the row's edge, loaded (``zmm_load``) and its lanes
    shifted into place with zeros (``valignd``). (Narrower rows: two ymm halves, ``_Loads.load``.)"""
    zero = "_mm512_setzero_si512()"
    if start < 0:  # lane i holds x[i + start], 0 below the row: x's lanes moved up by -start
        x = f"_mm512_castps_si512({zmm_load(row)})"
        return f"_mm512_castsi512_ps(_mm512_alignr_epi32({x}, {zero}, {ZMM + start}))"
    q = width - ZMM  # past the row's end: the last 16 floats moved down by start - q
    x = f"_mm512_castps_si512({zmm_load(add(row, str(q)))})"
    return f"_mm512_castsi512_ps(_mm512_alignr_epi32({zero}, {x}, {start - q}))"


def _shifted_tap(kc, loader: "_Loads", row: str, cache: dict, b: int, offset: int, stride: int) -> str:
    """AVX-512: the 16 floats of input row ``row`` at columns ``16 stride b + offset + stride i`` (zero
    outside the row). The row is read as 16-float blocks ``V_k`` (columns ``16 k ..``), each loaded once
    a row (``cache``: key -> C name, zero outside the row); stride 2 splits two blocks into their even
    and odd floats once (``vpermt2ps``), ``E_k`` and ``O_k`` (columns ``32 k + 2 i`` and ``32 k + 1 + 2 i``).
    The tap is its phase's vector of block ``b`` moved by ``m = offset // stride`` lanes, the lanes from
    block ``b + 1`` (or ``b - 1``) shifted in by ``valignd``: one load a block and row for every tap."""
    w = kc.w

    def block(k: int) -> str:
        if ("v", k) not in cache:
            x = loader.load(row, k * ZMM) if 0 <= k * ZMM < loader.width else None
            cache["v", k] = "_mm512_setzero_ps()" if x is None else kc.tmp("c")
            if x is not None:
                w.line(f"const __m512 {cache['v', k]} = {x};")
        return cache["v", k]

    def phase(par: int, k: int) -> str:
        if stride == 1:
            return block(k)
        if ("p", par, k) not in cache:
            if k < 0 or k * 2 * ZMM >= loader.width:
                cache["p", par, k] = "_mm512_setzero_ps()"
            else:
                lo, hi = block(2 * k), block(2 * k + 1)
                cache["p", par, k] = kc.tmp("ph")
                w.line(f"const __m512 {cache['p', par, k]} = {loader.odd_even_of(lo, hi, par)};")
        return cache["p", par, k]

    par, m = offset % stride, offset // stride
    if m == 0:
        return phase(par, b)
    hi, lo, by = (phase(par, b + 1), phase(par, b), m) if m > 0 else (phase(par, b), phase(par, b - 1), ZMM + m)
    return f"_mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512({hi}), _mm512_castps_si512({lo}), {by}))"


def zmm_load(at: str) -> str:
    """16 floats from ``at`` as two 8-float loads put together (``vinsertf64x4``), not one 64-byte
    load: an unaligned zmm load whose line comes from memory stalls far longer than two ymm loads do.
    Measured on the Zen 5 host (dw 3x3 32@112 + Relu, 1 thread, kernel CPU time, interleaved, load 9-10,
    medians of 30): the rows kernel right after a 128 MiB copy took 300 us with zmm loads, 149 us with
    this, 170 us with AVX2's body; warm 110, 102 and 149 us (a masked edge load, or ymm stores, changed
    none of it)."""
    lo, hi = (f"_mm256_castps_pd(_mm256_loadu_ps({a}))" for a in (at, add(at, "8")))
    return f"_mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512({lo}), {hi}, 1))"  # AVX-512F


# Epilogue ops with a constant scalar operand that ``register_epilogue`` finishes on the vectors: the op's kind
# there (``Sub`` with the constant first is "rsub"; ``Div`` only by the constant). PP-OCRv4's text detector
# scales and shifts its depthwise 5x5 + HardSwish outputs (Mul, Add by scalars): those three groups ran 1.3-1.5x
# their ops unfused through the scalar epilogue per row, 0.53-0.55x of that in registers (207 -> 112 us; 1 thread,
# kernel CPU time, 30 interleaved runs, load 5).
_ARITHMETIC = {"Mul": "mul", "Add": "add", "Sub": "sub", "Div": "div"}


@dataclass(frozen=True)
class RegisterEpilogue:
    """The group's epilogue finished on the accumulator vectors and stored by them (no pass over
    the results in L1): the bias, then each of ``bounds`` (``("max", lo)``: ``y < lo ? lo : y``, a
    Relu or a Clip's minimum; ``("min", hi)``: ``y > hi ? hi : y``; ``("hardswish", alpha, beta)``:
    ``y * min(max(alpha * y + beta, 0), 1)``, a multiply and an add as the scalar C's, not an FMA;
    ``("mul" | "add" | "sub" | "div", c)``: ``y * c``, ``y + c``, ``y - c``, ``y / c``; ``("rsub", c)``: ``c - y``), the
    operations of the scalar epilogue in its order, so the bits agree; ``out`` is the one value stored."""
    out: Value
    bias: Value | None
    bounds: tuple[tuple[str, ...], ...]


def register_epilogue(kc, ev, stage: Stage, node, hardswish: bool = False) -> RegisterEpilogue | None:
    """The ``RegisterEpilogue`` of ``stage`` where its epilogue is only Relu, Clips with constant bounds,
    Mul/Add/Sub/Div by a constant scalar (and, with ``hardswish``, HardSwish; in any order) and stores one
    float32 value; None elsewhere (the scalar epilogue runs)."""
    if not kc.program.options.depthwise_register_epilogue:
        return None
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    if bias is not None and id(bias) not in ev.static:
        return None
    prev = node.outputs[0]
    bounds: list[tuple[str, ...]] = []
    for n in stage.epilogue:
        if n.outputs[0].dtype != np.float32 or tuple(n.outputs[0].shape) != tuple(prev.shape):
            return None
        if n.op_type in _ARITHMETIC and len(n.inputs) == 2 and prev in (n.input(0), n.input(1)) \
                and n.input(0) is not n.input(1):
            first = n.input(0) is prev
            arr = ev.static.get(id(n.input(1 if first else 0)))
            if arr is None or arr.size != 1 or (n.op_type == "Div" and not first):
                return None
            c = literal(float(np.asarray(arr, dtype=np.float32).reshape(-1)[0]), np.float32)
            bounds.append(("rsub" if n.op_type == "Sub" and not first else _ARITHMETIC[n.op_type], c))
            prev = n.outputs[0]
            continue
        if n.input(0) is not prev:
            return None
        if n.op_type == "Relu":
            bounds.append(("max", literal(0.0, np.float32)))
        elif n.op_type == "HardSwish" and hardswish:  # rules.py: x * HardSigmoid(x; 1/6, 1/2)
            bounds.append(("hardswish", literal(1 / 6, np.float32), literal(0.5, np.float32)))
        elif n.op_type == "Clip":
            attrs = get_spec(n.op_type, n).attrs_of(n)
            for i, (attr, kind) in enumerate((("min", "max"), ("max", "min")), start=1):
                v = n.inputs[i] if len(n.inputs) > i else None
                if v is not None:
                    arr = ev.static.get(id(v))
                    if arr is None or arr.size != 1 or np.isnan(arr).any():
                        return None
                    bounds.append((kind, literal(float(np.asarray(arr).reshape(-1)[0]), np.float32)))
                elif attrs.get(attr) is not None:
                    bounds.append((kind, literal(float(attrs[attr]), np.float32)))
        else:
            return None
        prev = n.outputs[0]
    if [id(v) for v in stage.outputs] != [id(prev)] or prev.dtype != np.float32 or id(prev) in ev.static:
        return None
    return RegisterEpilogue(prev, bias, tuple(bounds))


def _finish_vectors(kc, ev, reg: RegisterEpilogue, node, ch: str, isa: VecIsa = AVX2_FLOAT) -> Callable[[str], str]:
    """Declare the epilogue's constant vectors (in the plane's scope); returns ``v -> finished v``."""
    w = kc.w
    consts: dict[str, str] = {}

    def const(value: str) -> str:
        if value not in consts:
            consts[value] = kc.tmp("cv")
            init = f"{isa.p}_setzero_ps()" if value == literal(0.0, np.float32) else f"{isa.p}_set1_ps({value})"
            w.line(f"const {isa.vt} {consts[value]} = {init};")
        return consts[value]

    with ev.scope():  # a temporary the bias read declares here is not seen by the #else branch
        bias_v = const(ev.at(reg.bias, Index(reg.bias.shape, (ch,)))) if reg.bias is not None else None
    ops = [(kind, *map(const, values)) for kind, *values in reg.bounds]
    if any(kind == "hardswish" for kind, *_ in ops):
        zero, one = const(literal(0.0, np.float32)), const(literal(1.0, np.float32))
    p = isa.p

    def finish(v: str) -> str:
        if bias_v is not None:
            v = f"{p}_add_ps({v}, {bias_v})"
        for kind, *c in ops:  # max(c, y) is y < c ? c : y and min(c, y) is y > c ? c : y, NaN and -0 kept
            if kind == "hardswish":
                t = f"{p}_min_ps({one}, {p}_max_ps({zero}, {p}_add_ps({p}_mul_ps({c[0]}, {v}), {c[1]})))"
                v = f"{p}_mul_ps({v}, {t})"
            elif kind in ("sub", "div"):
                v = f"{p}_{kind}_ps({v}, {c[0]})"
            elif kind == "rsub":
                v = f"{p}_sub_ps({c[0]}, {v})"
            else:
                v = f"{p}_{kind}_ps({c[0]}, {v})"
        return v
    return finish


def _store_lanes(kc, ptr: str, v: str, lanes: int, isa: VecIsa = AVX2_FLOAT) -> None:
    """The first ``lanes`` floats of ``v`` to ``ptr`` (no write past them): AVX-512 through a
    mask, AVX2 in 4-, 2- and 1-float pieces."""
    w = kc.w
    if lanes == isa.lanes:
        w.line(f"{isa.p}_storeu_ps({ptr}, {v});")
        return
    if isa.lanes == ZMM:  # ymm halves, the second through AVX2's masked store (as ``_masked_zmm``: a masked
        t = kc.tmp("t")   # zmm store to a cold line stalls; with these dw 512@14's rows body took 40 us, not 49)
        w.line(f"const __m512 {t} = {v};")
        halves = (f"_mm512_castps512_ps256({t})", f"_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd({t}), 1))")
        for h, x in zip((0, VECTOR), halves, strict=True):
            n = min(VECTOR, lanes - h)
            if n == VECTOR:
                w.line(f"_mm256_storeu_ps({add(ptr, str(h))}, {x});")
            elif n > 0:
                key = ", ".join("-1" if i < n else "0" for i in range(VECTOR))
                w.line(f"_mm256_maskstore_ps({add(ptr, str(h))}, _mm256_setr_epi32({key}), {x});")
        return
    t = kc.tmp("t")
    w.line(f"const __m256 {t} = {v};")
    at = 0
    if lanes >= 4:
        w.line(f"_mm_storeu_ps({ptr}, _mm256_castps256_ps128({t}));")
        at = 4
    rest = lanes - at
    if rest == 0:
        return
    q = kc.tmp("q")
    half = f"_mm256_extractf128_ps({t}, 1)" if at else f"_mm256_castps256_ps128({t})"
    w.line(f"const __m128 {q} = {half};")
    if rest >= 2:
        w.line(f"_mm_storel_pi((__m64*)({add(ptr, str(at))}), {q});")
    if rest == 3:
        w.line(f"_mm_store_ss({add(ptr, str(at + 2))}, _mm_movehl_ps({q}, {q}));")
    elif rest == 1:
        w.line(f"_mm_store_ss({add(ptr, str(at))}, {q});")


def _direct_plane(kc, src: str, weights, geo, hw, dense: str, isa: VecIsa = AVX2_FLOAT) -> None:
    """AVX2 or AVX-512 (``isa``): ``dense[i] = sum_taps w * x[i + shift(tap)]`` over the flat plane
    (stride 1, output as large as the input, so an output row's pitch is the input's), the input
    read in place. Which lanes of a vector a tap reads is known here for every vector: all (a
    plain load), none (the tap is left out) or some (a masked load, which reads nothing at the
    lanes masked off, so nothing before or after the plane, and gives 0 there, as the padding
    would). The whole plane is unrolled (at most ``DIRECT_MAX_VECTORS`` ymm). Each element's taps
    in kernel order, as the rows path: the same bits with either ISA. AVX-512 stores the plane's
    last vector through a mask; AVX2's runs into ``dense``'s slack."""
    w = kc.w
    L, p = isa.lanes, isa.p
    H, W = hw
    masks: dict[tuple[int, ...], str] = {}
    zmasks: dict[tuple[bool, ...], str] = {}

    def tap_vector(base: str, b: int, dh: int, dw: int, lanes: list[bool]) -> str:
        at = add(base, str(b * L + dh * W + dw))
        if all(lanes):
            return zmm_load(at) if L == ZMM else f"{p}_loadu_ps({at})"
        if L == ZMM:
            return _masked_zmm(kc, zmasks, at, tuple(lanes))
        key = tuple(-1 if ok else 0 for ok in lanes)
        if key not in masks:
            masks[key] = kc.tmp("mask")
            w.line(f"const __m256i {masks[key]} = _mm256_setr_epi32({', '.join(map(str, key))});")
        return f"_mm256_maskload_ps({at}, {masks[key]})"

    n = H * W
    for b, v in _plane_sums(kc, src, weights, geo, hw, isa, tap_vector):
        _store_lanes(kc, f"{dense} + {b * L}", v, L if L == VECTOR else min(L, n - b * L), isa)


def _plane_sums(kc, src: str, weights, geo, hw, isa: VecIsa,
                tap_vector: Callable[[str, int, int, int, list[bool]], str]) -> Iterator[tuple[int, str]]:
    """The flat plane's sums for the whole-plane bodies: declares the input's base pointer and the weights'
    vectors, then for each vector ``b`` of ``isa.lanes`` outputs sums its taps in kernel order (a multiply, then
    multiply-adds) of ``tap_vector(base, b, dh, dw, lanes)``: the input at offset ``(dh, dw)`` from each output, 0
    in the lanes not in ``lanes`` (the padding, or past the plane); a tap with no lane inside is left out (finite
    weights: 0 * w is 0). Yields ``(b, the sum's C name)`` for the caller to store."""
    w = kc.w
    L, vt, p = isa.lanes, isa.vt, isa.p
    H, W = hw
    KH, KW = geo.kernel
    (DH, DW), (PT, PL) = geo.dilations, geo.pads_begin
    base = kc.tmp("src")
    w.line(f"const float* {base} = {src};")
    wvs = []
    for row in weights:
        for wv in row:
            name = kc.tmp("wv")
            w.line(f"const {vt} {name} = {p}_set1_ps({wv});")
            wvs.append(name)
    n = H * W
    for b in range(-(-n // L)):
        v = kc.tmp("v")
        started = False
        for t, (kh, kw) in enumerate((kh, kw) for kh in range(KH) for kw in range(KW)):
            dh, dw = kh * DH - PT, kw * DW - PL
            lanes = []
            for i in range(b * L, b * L + L):
                oh, ow = divmod(i, W)
                lanes.append(i < n and 0 <= oh + dh < H and 0 <= ow + dw < W)
            if not any(lanes):
                continue
            x = tap_vector(base, b, dh, dw, lanes)
            expr = f"{p}_fmadd_ps({wvs[t]}, {x}, {v})" if started else f"{p}_mul_ps({wvs[t]}, {x})"
            w.line(f"{'' if started else vt + ' '}{v} = {expr};")
            started = True
        if not started:  # every tap of this vector falls in the padding (finite weights: 0 * w is 0)
            w.line(f"const {vt} {v} = {p}_setzero_ps();")
        yield b, v


def _direct_plane_shifted(kc, src: str, weights, geo, hw, dense: str,
                          finish: Callable[[str], str] | None = None) -> None:
    """AVX-512: ``_direct_plane``'s sums (the same taps in the same order, 0 at the same lanes, so the same
    bits), each block of 16 floats of the flat plane loaded once (``zmm_load``, the last through
    ``_masked_zmm``; 0 before and after the plane) and every tap's vector moved out of the two blocks it
    straddles (``valignd``), the lanes that would read the padding zeroed by the same instruction's mask
    (``_mm512_maskz_alignr_epi32``): one load per block instead of one masked load (two halves) per tap and
    vector. ``depthwise_zmm_plane_shifted``. With ``finish`` (``_finish_vectors``) each vector is finished before
    its store, and ``dense`` is then the output plane (``depthwise_zmm_plane_register_epilogue``)."""
    w = kc.w
    H, W = hw
    n = H * W
    nv = -(-n // ZMM)
    zmasks: dict[tuple[bool, ...], str] = {}
    blocks: dict[int, str] = {}

    def block(base: str, k: int) -> str:
        """Floats ``16 k ..`` of the plane as ``__m512i`` (0 past either end), loaded at first use."""
        if k < 0 or k >= nv:
            return "_mm512_setzero_si512()"
        if k not in blocks:
            valid = min(ZMM, n - k * ZMM)
            at = add(base, str(k * ZMM))
            load = zmm_load(at) if valid == ZMM else _masked_zmm(kc, zmasks, at, tuple(i < valid for i in range(ZMM)))
            blocks[k] = kc.tmp("p")
            w.line(f"const __m512i {blocks[k]} = _mm512_castps_si512({load});")
        return blocks[k]

    def tap_vector(base: str, b: int, dh: int, dw: int, lanes: list[bool]) -> str:
        q, r = divmod(b * ZMM + dh * W + dw, ZMM)  # lane i reads plane[16 q + r + i]
        mask = f"(__mmask16){sum(1 << i for i, ok in enumerate(lanes) if ok):#06x}"
        if r == 0:
            x = block(base, q) if all(lanes) else f"_mm512_maskz_mov_epi32({mask}, {block(base, q)})"
        elif all(lanes):
            x = f"_mm512_alignr_epi32({block(base, q + 1)}, {block(base, q)}, {r})"
        else:
            x = f"_mm512_maskz_alignr_epi32({mask}, {block(base, q + 1)}, {block(base, q)}, {r})"
        return f"_mm512_castsi512_ps({x})"

    for b, v in _plane_sums(kc, src, weights, geo, hw, AVX512_FLOAT, tap_vector):
        _store_lanes(kc, f"{dense} + {b * ZMM}", finish(v) if finish else v, min(ZMM, n - b * ZMM), AVX512_FLOAT)


def row_classes(out_rows: int, kernel_rows: int, stride: int, dilation: int, pad_top: int,
                in_rows: int) -> list[list]:
    """Runs of output rows whose window has the same kernel rows inside the input: ``[first
    output row, end, (kernel rows inside)]`` (the rows in place code writes with one loop)."""
    classes: list[list] = []
    for o in range(out_rows):
        inside = tuple(k for k in range(kernel_rows) if 0 <= o * stride + k * dilation - pad_top < in_rows)
        if classes and classes[-1][2] == inside:
            classes[-1][1] = o + 1
        else:
            classes.append([o, o + 1, inside])
    return classes


@contextmanager
def planes_of_chunk(kc, ev, names: tuple[str, str, str], per_chunk: int, planes: int, channels: int):
    """The loop over the planes of chunk ``names[0]`` (loop variable ``names[1]``, first plane
    ``names[2]``), in an evaluator scope; yields the C names of the plane's image and channel."""
    w = kc.w
    chunk, plane, first = names
    w.line(f"const long {first} = {chunk} * {per_chunk};")
    end = f"({first} + {per_chunk} < {planes} ? {first} + {per_chunk} : {planes})"
    with w.block(f"for (long {plane} = {first}; {plane} < {end}; ++{plane})"), ev.scope():
        img, ch = kc.tmp("img"), kc.tmp("ch")
        w.line(f"const long {img} = {plane} / {channels};")
        w.line(f"const long {ch} = {plane} % {channels};")
        yield img, ch


def plane_chunk(planes: int, options) -> int:
    """Planes per chunk: up to ``depthwise_chunk_planes``, fewer where that would leave fewer than
    ``depthwise_min_chunks`` chunks for the threads to share."""
    return max(1, min(options.depthwise_chunk_planes, planes // options.depthwise_min_chunks))


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


def copy_plane(kc, ev, x, img, ch, xp, hw, pads, SW, Wh) -> None:
    """The input plane's rows into ``xp`` (the padded plane, its padding already set), each row
    stored as its SW column phases: padded column ``j = q * SW + ph`` at ``ph * Wh + q``."""
    w = kc.w
    H, W = hw
    PT, PL = pads
    row_len = SW * Wh
    ih, dst = kc.tmp("ih"), kc.tmp("dst")
    with w.block(f"for (long {ih} = 0; {ih} < {H}; ++{ih})"):
        w.line(f"float* restrict {dst} = {xp} + {add(mul(ih, row_len), str(PT * row_len))};")
        for ph in range(SW):  # padded column j = q * SW + ph holds input column j - PL
            q_lo = max(0, -(-(PL - ph) // SW))
            q_hi = -(-(PL + W - ph) // SW)
            if q_hi <= q_lo:
                continue
            q = kc.tmp("q")
            with w.block(f"for (long {q} = {q_lo}; {q} < {q_hi}; ++{q})"), ev.scope():
                iw = add(mul(q, SW), str(ph - PL))
                w.line(f"{dst}[{add(str(ph * Wh), q)}] = {ev.at(x, Index(x.shape, (img, ch, ih, iw)))};")


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
