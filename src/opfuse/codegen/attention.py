"""Attention as one tiled kernel with online softmax (the score matrix never hits memory).

For ``O = softmax(f(Q @ Kt)) @ V`` (``f``: the fused elementwise scale/mask chain, softmax
over the keys axis), each tile is one batch entry (e.g. one head) and its query rows in blocks of
up to ``QUERY_ROWS_PER_TILE``: all of them where the batch alone makes enough tiles to spread
over threads (``CodegenOptions.attention_min_tiles``), else one block per tile. Both products
run on the blocked GEMM's register micro-kernel (MR x NR), in transposed form so that one
product's output is already packed as the next one's operand:

    St = K @ Qt        keys x queries; A = K in MR-key panels, B = Qt in NR-query panels
    Ot = Vt @ Pt       values x queries; A = Vt in MR-value panels, B = Pt = the St block

The tile packs K and Vt (whole key range) once and Qt (a block's queries) per query block into
per-thread scratch,
reading them through any fused data movement (head split, transposes), then walks the keys
in blocks of ``attention_block`` (rounded up to MR). Per block and per query column j,
with the block's scores ``s_t = f(St[t, j])``:

    m'   = max(m, max_t s_t);   a = exp(m - m')    running max and rescale factor
    p_t  = exp(s_t - m')                           written over St, in place
    l    = l * a + sum_t p_t                       running denominator
    Ot[:, j] = Ot[:, j] * a + Vt[:, block] @ p     running numerator (micro-kernel)

and finishes ``O[row] = Ot[:, row] / l`` through the epilogue (e.g. merge-heads
Transpose+Reshape straight into the output). Only one key block of scores exists at a time.
A key range of at most ``CodegenOptions.attention_one_pass_max_keys`` is one block: m and l in one pass
(``_emit_one_pass_softmax``), Ot set by the second product, nothing rescaled.
In the transposed layout the per-query statistics are unit-stride vectors over the NR
queries of a panel, so the softmax bookkeeping vectorises as well as the products do; the
exponential is an inline polynomial (``vecmath``'s ``opfuse_expf_nonpos``, within 1 ulp) instead
of a libm call per score; the one-pass softmax of a whole panel runs in explicit AVX-512 / AVX2 vectors
(``CodegenOptions.attention_vector_softmax``, the vector exp's bits being the scalar's), and where every
query block is whole the queries are packed panel by panel as K is (``attention_panelled_queries``).
Every output's sums run in a fixed order, whatever the thread
count. Scratch per thread: the packed K, Vt and Qt, one St block (BT x tile queries), Ot
and three per-query vectors (one in one pass); never the S x T score matrix.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.gemm import require_outlined_microkernel
from opfuse.codegen.microkernel import transpose_helper
from opfuse.codegen.index import Index
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.codegen import simdchain, vecmath
from opfuse.codegen.vecmath import VecIsa

# Query rows sharing one packing of K and V (fewer rows per tile: more tiles to spread
# over threads, more repacking).
QUERY_ROWS_PER_TILE = 64


def _batch_index(batch: tuple[int, ...], b: str) -> Index:
    return Index.loops(batch, [(0, len(batch), b)]) if batch else Index((), ())


# The exponential: ``vecmath``'s exp for x <= 0 (``opfuse_expf_nonpos``: degree-6 polynomial, <= 1 ulp, plain C
# that gcc vectorises; libm's expf was a call per element, 3 ns each: two thirds of this kernel's time on bert
# before). It replaced the kernel's own Cephes degree-7 form, the same reduction with one multiply-add more a
# score: bert_layer's attention kernel alone 282 -> 275 us (3 interleaved runs of 200, load ~8).


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _emit_panelled(kc, ev, n: int, width: int, store: Callable[[str, str], str],
                   across: tuple[str, int] | None = None) -> None:
    """Emit ``store(panel, lane)`` for every ``panel * width + lane < n``: whole panels with
    a constant lane count (gcc turns a variable one into a slow string copy), then the
    partial last panel. ``across`` (a C variable and its extent) loops between the panel and
    its lanes, so that a panel's lanes are written one contiguous run at a time."""
    w = kc.w
    p, r = kc.tmp("p"), kc.tmp("r")
    full, rest = divmod(n, width)
    for panel, lanes in ((p, width), (str(full), rest)):
        if not lanes or (panel == p and not full):
            continue
        with contextlib.ExitStack() as loops:
            if panel == p:
                loops.enter_context(w.block(f"for (long {p} = 0; {p} < {full}; ++{p})"))
            if across is not None:
                loops.enter_context(w.block(f"for (long {across[0]} = 0; {across[0]} < {across[1]}; ++{across[0]})"))
            loops.enter_context(w.block(f"for (long {r} = 0; {r} < {lanes}; ++{r})"))
            loops.enter_context(ev.scope())
            w.line(store(panel, r))


def _emit_online_softmax(kc, exp: str, ct: str, st: str, stats: tuple[str, str, str],
                         bq: str, bt: str, QP: int, BT: int, NR: int) -> None:
    """One key block of the online softmax, NR query columns (one St panel) at a time:
    ``m' = max(m, max_t s_t)``, ``a = exp(m - m')``, ``p_t = exp(s_t - m')`` over St in place
    (``m'`` read as 0 while it is -inf),
    ``l = l * a + sum_t p_t`` (t ascending), ``m = m'``. Only the ``bq`` real query columns
    are written (padded ones keep the zero scores of their zero-padded queries and are never
    stored; the max alone runs over the whole panel). Every loop is unit stride over the panel's
    queries, so gcc vectorises it."""
    w = kc.w
    m, den, a = stats  # den: the running denominator l
    jp, t, j, nq = kc.tmp("jp"), kc.tmp("t"), kc.tmp("j"), kc.tmp("nq")
    with w.block(f"for (long {jp} = 0; {jp} < {QP}; ++{jp})"):
        sp, mp, lp, ap, ls = (kc.tmp(n) for n in ("sp", "mp", "lp", "ap", "ls"))
        w.line(f"const long {nq} = {bq} - {jp} * {NR} < {NR} ? {bq} - {jp} * {NR} : {NR};")
        w.line(f"float* restrict {sp} = {st} + {jp} * {BT * NR};")
        for name, arr in ((mp, m), (lp, den), (ap, a)):
            w.line(f"{ct}* restrict {name} = {arr} + {jp} * {NR};")
        s_tj = f"{sp}[{t} * {NR} + {j}]"
        # The block's max m' and the shift over the whole panel in local arrays: with the constant
        # trip count gcc keeps them in registers (bert_layer: -17 and -12 us of 350). Padded
        # columns read initialised scratch, and their results are never stored.
        mx, sh = kc.tmp("mx"), kc.tmp("sh")
        w.line(f"{ct} {mx}[{NR}];")
        w.line(f"for (long {j} = 0; {j} < {NR}; ++{j}) {mx}[{j}] = {mp}[{j}];")
        w.line(f"for (long {t} = 0; {t} < {bt}; ++{t})")
        w.line(f"  for (long {j} = 0; {j} < {NR}; ++{j}) {mx}[{j}] = {s_tj} > {mx}[{j}] ? {s_tj} : {mx}[{j}];")
        # Shift by 0 while every score so far is -inf (e.g. a padding mask over the first
        # keys): exp(-inf - -inf) would be NaN, and l and o must just stay 0.
        w.line(f"{ct} {sh}[{NR}];")
        w.line(f"for (long {j} = 0; {j} < {NR}; ++{j}) {sh}[{j}] = {mx}[{j}] == -HUGE_VALF ? 0.0f : {mx}[{j}];")
        shift = f"{sh}[{j}]"
        w.line(f"for (long {j} = 0; {j} < {nq}; ++{j}) {ap}[{j}] = {exp}({mp}[{j}] - {shift});")
        w.line(f"for (long {t} = 0; {t} < {bt}; ++{t})")
        w.line(f"  for (long {j} = 0; {j} < {nq}; ++{j}) {s_tj} = {exp}({s_tj} - {shift});")
        w.line(f"{ct} {ls}[{NR}];")
        w.line(f"for (long {j} = 0; {j} < {nq}; ++{j}) {ls}[{j}] = 0.0f;")
        w.line(f"for (long {t} = 0; {t} < {bt}; ++{t})")
        w.line(f"  for (long {j} = 0; {j} < {nq}; ++{j}) {ls}[{j}] += {s_tj};")
        with w.block(f"for (long {j} = 0; {j} < {nq}; ++{j})"):
            w.line(f"{lp}[{j}] = {lp}[{j}] * {ap}[{j}] + {ls}[{j}];")
            w.line(f"{mp}[{j}] = {mx}[{j}];")


def _emit_one_pass_softmax(kc, exp: str, ct: str, st: str, den: str, bq: str, bt: str, QP: int, BT: int,
                           NR: int) -> None:
    """The softmax of the whole key range at once, NR query columns (one St panel) at a time: ``m = max_t s_t``
    (read as 0 while it is -inf), ``p_t = exp(s_t - m)`` over St in place and ``l = sum_t p_t`` (t ascending)
    in the same loop. Only the ``bq`` real query columns are written, as in ``_emit_online_softmax``."""
    w = kc.w
    jp, t, j, nq = kc.tmp("jp"), kc.tmp("t"), kc.tmp("j"), kc.tmp("nq")
    isas = [i for i in simdchain.isas_for(kc.program.options) if NR % i.lanes == 0] \
        if kc.program.options.attention_vector_softmax and ct == "float" else []
    with w.block(f"for (long {jp} = 0; {jp} < {QP}; ++{jp})"):
        sp, lp, mx, ls = (kc.tmp(n) for n in ("sp", "lp", "mx", "ls"))
        w.line(f"const long {nq} = {bq} - {jp} * {NR} < {NR} ? {bq} - {jp} * {NR} : {NR};")
        w.line(f"float* restrict {sp} = {st} + {jp} * {BT * NR};")
        w.line(f"{ct}* restrict {lp} = {den} + {jp} * {NR};")
        # Whole panels in explicit vectors (``CodegenOptions.attention_vector_softmax``); a part panel, and a
        # build without the ISAs, in the C loops below (gcc vectorises them, ymm at most with this toolchain).
        if isas:
            done = kc.tmp("vdone")
            w.line(f"int {done} = 0;")
            for i, isa in enumerate(isas):
                w.line(f"#{'el' if i else ''}if {isa.guard}")
                with w.block(f"if ({nq} == {NR})"):
                    _emit_vector_one_pass_softmax(kc, sp, lp, bt, NR, isa)
                    w.line(f"{done} = 1;")
            w.line("#endif")
            w.line(f"if (!{done}) {{")
            w.level += 1
        s_tj = f"{sp}[{t} * {NR} + {j}]"
        w.line(f"{ct} {mx}[{NR}];")
        w.line(f"for (long {j} = 0; {j} < {NR}; ++{j}) {mx}[{j}] = -HUGE_VALF;")
        w.line(f"for (long {t} = 0; {t} < {bt}; ++{t})")
        w.line(f"  for (long {j} = 0; {j} < {NR}; ++{j}) {mx}[{j}] = {s_tj} > {mx}[{j}] ? {s_tj} : {mx}[{j}];")
        w.line(f"for (long {j} = 0; {j} < {NR}; ++{j}) {mx}[{j}] = {mx}[{j}] == -HUGE_VALF ? 0.0f : {mx}[{j}];")
        w.line(f"{ct} {ls}[{NR}];")
        w.line(f"for (long {j} = 0; {j} < {NR}; ++{j}) {ls}[{j}] = 0.0f;")
        with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"):
            with w.block(f"for (long {j} = 0; {j} < {nq}; ++{j})"):
                w.line(f"{s_tj} = {exp}({s_tj} - {mx}[{j}]);")
                w.line(f"{ls}[{j}] += {s_tj};")
        w.line(f"for (long {j} = 0; {j} < {nq}; ++{j}) {lp}[{j}] = {ls}[{j}];")
        if isas:
            w.level -= 1
            w.line("}")


def _emit_vector_one_pass_softmax(kc, sp: str, lp: str, bt: str, NR: int, isa: VecIsa) -> None:
    """``_emit_one_pass_softmax`` of one whole St panel (all NR queries real) in ``isa``'s registers, NR / lanes
    vectors a key row: the max by ``max_ps(s, m)`` (``s > m ? s : m``, as the C loop: a NaN score is passed over),
    read as 0 where -inf, then ``p_t = exp(s_t - m)`` (``vecmath``'s vector exp, the scalar helper's bits) stored
    over St and summed per lane with t ascending: the same bits as the C loops."""
    w = kc.w
    n = NR // isa.lanes
    vexp = vecmath.require_vector(kc.program, vecmath.EXP_NONPOS, isa)
    t, vt = kc.tmp("t"), isa.vt
    mx = [kc.tmp("vm") for _ in range(n)]
    ls = [kc.tmp("vl") for _ in range(n)]
    at = [f"{sp} + {t} * {NR} + {v * isa.lanes}" for v in range(n)]
    w.line(f"{vt} " + ", ".join(f"{m} = {isa.set1('-HUGE_VALF')}" for m in mx) + ";")
    with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"):
        for m, a in zip(mx, at, strict=True):
            w.line(f"{m} = {isa.op('max_ps', isa.op('loadu_ps', a), m)};")
    for m in mx:
        w.line(f"{m} = {isa.select(m, isa.set1('-HUGE_VALF'), '_CMP_EQ_OQ', isa.op('setzero_ps'), m)};")
    w.line(f"{vt} " + ", ".join(f"{s} = {isa.op('setzero_ps')}" for s in ls) + ";")
    with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"):
        for m, s, a in zip(mx, ls, at, strict=True):
            p = kc.tmp("vp")
            w.line(f"const {vt} {p} = {vexp}({isa.op('sub_ps', isa.op('loadu_ps', a), m)});")
            w.line(f"{isa.op('storeu_ps', a, p)};")
            w.line(f"{s} = {isa.op('add_ps', s, p)};")
    for v, s in enumerate(ls):
        w.line(f"{isa.op('storeu_ps', f'{lp} + {v * isa.lanes}', s)};")


def lower_attention(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    mm1, sm, mm2 = stage.anchors
    Q, Kt = mm1.input(0), mm1.input(1)
    V = mm2.input(1)
    scores = mm1.outputs[0]
    out = mm2.outputs[0]
    if any(len(v.shape) < 2 for v in (Q, Kt, V)) or out.dtype != np.float32:
        raise kc.error("attention needs float32 operands of rank >= 2")
    S, D = Q.shape[-2:]
    T = Kt.shape[-1]
    Dv = V.shape[-1]
    batch = tuple(out.shape[:-2])
    nb = math.prod(batch)
    ukr, MR, NR = require_outlined_microkernel(kc)
    ukr_set, _, _ = require_outlined_microkernel(kc, load_c=False)  # St = K @ Qt: no memset first
    o = kc.program.options
    if o.vector_isa == "avx512" and o.attention_vector_width_512 and o.simd == "auto" and o.platform == "host":
        kc.wide_vectors()
        kc.note(lambda name: f"attention '{name}': gcc's own loops 512 bits wide (attention_vector_width_512)",
                mm1)
    exp = vecmath.require(kc.program, vecmath.EXP_NONPOS)
    # Key blocks start on MR-panel boundaries of the packed K; a short key range is one block, in one pass.
    one_pass = T <= kc.program.options.attention_one_pass_max_keys
    BT = _round_up(T if one_pass else min(kc.program.options.attention_block, T), MR)
    BQ = min(QUERY_ROWS_PER_TILE, S)
    QB = -(-S // BQ)
    QP = -(-BQ // NR)               # NR-query panels per tile
    BQP = QP * NR                   # padded queries per tile (leading dim of Ot)
    TP = -(-T // MR)                # MR-key panels of K
    DVP = -(-Dv // MR)              # MR-value panels of Vt
    ct = c_type(out.dtype)
    w = kc.w
    fl = 4
    off_k = kc.scratch(TP * D * MR * fl)
    off_v = kc.scratch(DVP * T * MR * fl)
    off_q = kc.scratch(QP * D * NR * fl)
    off_s = kc.scratch(QP * BT * NR * fl)
    off_o = kc.scratch(DVP * MR * BQP * fl)
    off_x = off_s if QP * BT * NR >= BQP * Dv else kc.scratch(BQP * Dv * fl)  # O, once St is done with
    off_stats = [kc.scratch(BQP * fl) for _ in range(1 if one_pass else 3)]  # l (and m, a: the online form's)

    # Query blocks per tile: all of a batch entry's (K and V packed once for them) where the batch
    # entries alone make ``attention_min_tiles`` tiles; else one, so that few heads still spread.
    per_tile = QB if nb >= kc.program.options.attention_min_tiles else 1
    groups = QB // per_tile          # tiles per batch entry

    tile = kc.tmp("tile")
    kc.parallel_for(2 * nb * S * T * (D + Dv), collapse=1)
    with w.block(f"for (long {tile} = 0; {tile} < {nb * groups}; ++{tile})"):
        b, q0, bq, qb = kc.tmp("b"), kc.tmp("q0"), kc.tmp("bq"), kc.tmp("qb")
        w.line(f"const long {b} = {tile} / {groups};")
        bidx = _batch_index(batch, b)

        def operand(v, row: str, col: str) -> str:
            bd = bidx.broadcast_to(v.shape[:-2]).dims if len(v.shape) > 2 else ()
            return ev.at(v, Index(v.shape, tuple(bd) + (row, col)))

        kp, vp, qp, st, ot = (kc.tmp(n) for n in ("kp", "vp", "qp", "st", "ot"))
        m, den, a = (kc.tmp(n) for n in ("m", "l", "a"))  # den: the running denominator l
        for name, off in ((kp, off_k), (vp, off_v), (qp, off_q), (st, off_s), (ot, off_o)):
            w.line(f"float* restrict {name} = {kc.scratch_ptr('float', off)};")
        for name, off in zip((den,) if one_pass else (m, den, a), off_stats, strict=True):
            w.line(f"{ct}* restrict {name} = {kc.scratch_ptr(ct, off)};")
        d, t, c, dv = kc.tmp("d"), kc.tmp("t"), kc.tmp("c"), kc.tmp("dv")

        # Pack into the micro-kernel's panel layouts (a partial panel's padding zeroed first):
        # K[t, d] at kp[(t / MR) * D * MR + d * MR + t % MR],
        # Vt[dv, t] at vp[(dv / MR) * T * MR + t * MR + dv % MR],
        # Qt[d, c] at qp[(c / NR) * D * NR + d * NR + c % NR] for the tile's queries c.
        if T % MR:
            w.line(f"memset({kp}, 0, sizeof(float) * {TP * D * MR});")
        if Dv % MR:
            w.line(f"memset({vp}, 0, sizeof(float) * {DVP * T * MR});")
        # K panel by panel, d, then the panel's MR keys: the writes run contiguous, and so do the
        # reads of a key-major Kt (a Transpose in the group) or of one in memory d-major
        # (bert_layer: -24 us of 450 against walking key by key).
        _emit_panelled(kc, ev, T, MR, lambda p, r: f"{kp}[{p} * {D * MR} + {d} * {MR} + {r}] = "
                                                   f"{operand(Kt, d, f'{p} * {MR} + {r}')};", across=(d, D))
        with w.block(f"for (long {t} = 0; {t} < {T}; ++{t})"):
            _emit_panelled(kc, ev, Dv, MR, lambda p, r: f"{vp}[{p} * {T * MR} + {t} * {MR} + {r}] = "
                                                        f"{operand(V, t, f'{p} * {MR} + {r}')};")
        # The tile's query blocks, each against the packed K and V.
        w.line(f"for (long {qb} = 0; {qb} < {per_tile}; ++{qb}) {{")
        w.level += 1
        w.line(f"const long {q0} = (({tile} % {groups}) * {per_tile} + {qb}) * {BQ};")
        w.line(f"const long {bq} = {S} - {q0} < {BQ} ? {S} - {q0} : {BQ};")
        if S % BQ or BQ % NR:  # a block short of whole NR-query panels: zero its padded queries
            w.line(f"memset({qp}, 0, sizeof(float) * {QP * D * NR});")
        if S % BQ == 0 and kc.program.options.attention_panelled_queries:
            # Every block whole: Q as K, panel by panel, d, then the panel's NR queries (the writes contiguous,
            # which gcc turns into transposes in registers; query by query, every write was a scalar store a
            # panel row apart: bert_layer's 24 blocks 58 -> 28 us, the kernel alone in a harness).
            _emit_panelled(kc, ev, BQ, NR, lambda p, r: f"{qp}[{p} * {D * NR} + {d} * {NR} + {r}] = "
                                                       f"{operand(Q, f'{q0} + {p} * {NR} + {r}', d)};",
                           across=(d, D))
        else:
            with w.block(f"for (long {c} = 0; {c} < {bq}; ++{c})"):
                i = kc.tmp("i")
                qd = kc.tmp("qd")
                w.line(f"const long {i} = {q0} + {c};")
                w.line(f"float* restrict {qd} = {qp} + ({c} / {NR}) * {D * NR} + {c} % {NR};")
                with w.block(f"for (long {d} = 0; {d} < {D}; ++{d})"), ev.scope():
                    w.line(f"{qd}[{d} * {NR}] = {operand(Q, i, d)};")

        if not one_pass:
            w.line(f"memset({ot}, 0, sizeof(float) * {DVP * MR * BQP});")
            with w.block(f"for (long {c} = 0; {c} < {BQP}; ++{c})"):
                w.line(f"{m}[{c}] = -HUGE_VALF;")
                w.line(f"{den}[{c}] = 0.0f;")
        t0, bt, nt, jp, tp, dp = (kc.tmp(n) for n in ("t0", "bt", "nt", "jp", "tp", "dp"))
        with w.block(f"for (long {t0} = 0; {t0} < {T}; {t0} += {BT})"):
            w.line(f"const long {bt} = {T} - {t0} < {BT} ? {T} - {t0} : {BT};")
            w.line(f"const long {nt} = ({bt} + {MR - 1}) / {MR};")
            # St block = K[block] @ Qt: NR-query panels of BT x NR, the layout of Pt as a B operand.
            with w.block(f"for (long {jp} = 0; {jp} < {QP}; ++{jp})"):
                w.line(f"for (long {tp} = 0; {tp} < {nt}; ++{tp}) {ukr_set}({D}, "
                       f"{kp} + ({t0} / {MR} + {tp}) * {D * MR}, {qp} + {jp} * {D * NR}, "
                       f"{st} + {jp} * {BT * NR} + {tp} * {MR * NR}, {NR});")
            # f (scale, mask...) on the block's real scores, unit stride over a panel's queries.
            with w.block(f"for (long {jp} = 0; {jp} < {QP}; ++{jp})"):
                nq, sp = kc.tmp("nq"), kc.tmp("sp")
                w.line(f"const long {nq} = {bq} - {jp} * {NR} < {NR} ? {bq} - {jp} * {NR} : {NR};")
                with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"):
                    w.line(f"float* restrict {sp} = {st} + {jp} * {BT * NR} + {t} * {NR};")
                    with w.block(f"for (long {c} = 0; {c} < {nq}; ++{c})"), ev.scope():
                        i = kc.tmp("i")
                        w.line(f"const long {i} = {q0} + {jp} * {NR} + {c};")
                        sidx = Index(scores.shape,
                                     tuple(bidx.broadcast_to(scores.shape[:-2]).dims) + (i, f"{t0} + {t}"))
                        ev.bind(scores, sidx, f"{sp}[{c}]")
                        logit = ev.at(sm.input(0), sidx)
                        w.line(f"{sp}[{c}] = {logit};")
                        ev.unbind(scores)
            if one_pass:  # Ot = Vt @ Pt
                _emit_one_pass_softmax(kc, exp, ct, st, den, bq, bt, QP, BT, NR)
            else:  # Ot = Ot * a + Vt[:, block] @ Pt
                _emit_online_softmax(kc, exp, ct, st, (m, den, a), bq, bt, QP, BT, NR)
                with w.block(f"for (long {dv} = 0; {dv} < {DVP * MR}; ++{dv})"):
                    w.line(f"for (long {c} = 0; {c} < {bq}; ++{c}) {ot}[{dv} * {BQP} + {c}] *= {a}[{c}];")
            pv = ukr_set if one_pass else ukr
            with w.block(f"for (long {jp} = 0; {jp} < {QP}; ++{jp})"):
                w.line(f"for (long {dp} = 0; {dp} < {DVP}; ++{dp}) {pv}({bt}, {vp} + {dp} * {T * MR} + {t0} * {MR}, "
                       f"{st} + {jp} * {BT * NR}, {ot} + {dp} * {MR * BQP} + {jp} * {NR}, {BQP});")
        # O = Ot transposed (8 x 8 blocks in ymm registers where AVX2 is there, ``microkernel.transpose_helper``)
        # into the free St block, or scratch of its own, then O[row] = O[row] / l along the rows, which gcc
        # vectorises; element by element across Ot's rows, in 8 x 8 blocks, it took 8 loads and 7 inserts a
        # vector (bert_layer: -48 us of ~390, paired against it with the one pass, 60 rounds, load 7).
        tr, text = transpose_helper(kc.program.options.simd)
        kc.program.require_helper(tr, text)
        ox = kc.tmp("ox")
        w.line(f"float* restrict {ox} = {kc.scratch_ptr('float', off_x)};")
        w.line(f"{tr}({Dv}, {bq}, {ot}, {BQP}, {ox}, {Dv});")
        with w.block(f"for (long {c} = 0; {c} < {bq}; ++{c})"):
            i = kc.tmp("i")
            w.line(f"const long {i} = {q0} + {c};")
            with w.block(f"for (long {dv} = 0; {dv} < {Dv}; ++{dv})"), ev.scope():
                y = kc.tmp("y")
                w.line(f"const {ct} {y} = {ox}[{c} * {Dv} + {dv}] / {den}[{c}];")
                oidx = Index(out.shape, tuple(bidx.dims) + (i, dv))
                finish_element(kc, ev, stage, out, oidx, y)
        w.level -= 1
        w.line("}")
