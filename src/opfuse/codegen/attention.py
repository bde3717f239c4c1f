"""Attention as one tiled kernel with online softmax (the score matrix never hits memory).

For ``O = softmax(f(Q @ Kt)) @ V`` (``f``: the fused elementwise scale/mask chain, softmax
over the keys axis), each tile is one batch entry (e.g. one head) and a block of query
rows. The tile packs ``Kt`` (D x T) and ``V`` (T x Dv) of its batch entry into per-thread
scratch once (reading them through any fused data movement: head split, transposes), then
for every query row walks the keys in blocks of ``attention_block``:

    s_t  = f(q . k_t)                              scores of the block (registers/stack)
    m'   = max(m, max_t s_t);   a = exp(m - m')    running max and rescale factor
    l    = l * a + sum_t exp(s_t - m')             running denominator
    o    = o * a + sum_t exp(s_t - m') * v_t       running numerator (Dv wide)

and finishes ``O[row] = o / l`` through the epilogue (e.g. merge-heads Transpose+Reshape
straight into the output). Only one block of scores exists at a time.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.codegen.ctype import c_type
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index
from opfuse.codegen.stages import GroupAnalysis, Stage

# Query rows sharing one packing of K and V (fewer rows per tile: more tiles to spread
# over threads, more repacking).
QUERY_ROWS_PER_TILE = 64


def _batch_index(batch: tuple[int, ...], b: str) -> Index:
    return Index.loops(batch, [(0, len(batch), b)]) if batch else Index((), ())


def lower_attention(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    mm1, sm, mm2 = stage.anchors
    Q, Kt = mm1.inputs
    V = mm2.inputs[1]
    scores = mm1.outputs[0]
    out = mm2.outputs[0]
    if any(len(v.shape) < 2 for v in (Q, Kt, V)) or out.dtype != np.float32:
        raise kc.error("attention needs float32 operands of rank >= 2")
    S, D = Q.shape[-2:]
    T = Kt.shape[-1]
    Dv = V.shape[-1]
    batch = tuple(out.shape[:-2])
    nb = math.prod(batch)
    BT = min(kc.program.options.attention_block, T)
    BQ = min(QUERY_ROWS_PER_TILE, S)
    QB = -(-S // BQ)
    ct = c_type(out.dtype)
    w = kc.w
    off_k, off_v = kc.scratch(D * T * 4), kc.scratch(T * Dv * 4)
    off_q, off_s, off_o = kc.scratch(D * 4), kc.scratch(BT * 4), kc.scratch(Dv * 4)

    tile = kc.tmp("tile")
    kc.parallel_for(2 * nb * S * T * (D + Dv), collapse=1)
    with w.block(f"for (long {tile} = 0; {tile} < {nb * QB}; ++{tile})"):
        b, q0 = kc.tmp("b"), kc.tmp("q0")
        w.line(f"const long {b} = {tile} / {QB};")
        w.line(f"const long {q0} = ({tile} % {QB}) * {BQ};")
        bidx = _batch_index(batch, b)

        def operand(v, row: str, col: str) -> str:
            bd = bidx.broadcast_to(v.shape[:-2]).dims if len(v.shape) > 2 else ()
            return ev.at(v, Index(v.shape, tuple(bd) + (row, col)))

        kt, vp, qv, sv, ov = (kc.tmp(n) for n in ("kt", "vp", "q", "s", "o"))
        for name, off in ((kt, off_k), (vp, off_v), (qv, off_q), (sv, off_s), (ov, off_o)):
            w.line(f"float* restrict {name} = {kc.scratch_ptr('float', off)};")
        d, t, i, dv = kc.tmp("d"), kc.tmp("t"), kc.tmp("i"), kc.tmp("dv")
        # Pack this batch entry's keys (D x T) and values (T x Dv). Kt made by a Transpose
        # in the group is a key-major tensor underneath: walk it key by key.
        key_major = Kt.producer is not None and Kt.producer.op_type == "Transpose" \
            and id(Kt.producer) in analysis.inline
        outer, inner = ((t, T), (d, D)) if key_major else ((d, D), (t, T))
        with w.block(f"for (long {outer[0]} = 0; {outer[0]} < {outer[1]}; ++{outer[0]})"):
            with w.block(f"for (long {inner[0]} = 0; {inner[0]} < {inner[1]}; ++{inner[0]})"), ev.scope():
                w.line(f"{kt}[{d} * {T} + {t}] = {operand(Kt, d, t)};")
        with w.block(f"for (long {t} = 0; {t} < {T}; ++{t})"):
            with w.block(f"for (long {dv} = 0; {dv} < {Dv}; ++{dv})"), ev.scope():
                w.line(f"{vp}[{t} * {Dv} + {dv}] = {operand(V, t, dv)};")
        with w.block(f"for (long {i} = {q0}; {i} < ({q0} + {BQ} < {S} ? {q0} + {BQ} : {S}); ++{i})"):
            with w.block(f"for (long {d} = 0; {d} < {D}; ++{d})"), ev.scope():
                w.line(f"{qv}[{d}] = {operand(Q, i, d)};")
            m, l = kc.tmp("m"), kc.tmp("l")
            w.line(f"{ct} {m} = -HUGE_VALF, {l} = 0.0f;")
            w.line(f"for (long {dv} = 0; {dv} < {Dv}; ++{dv}) {ov}[{dv}] = 0.0f;")
            t0, bt = kc.tmp("t0"), kc.tmp("bt")
            with w.block(f"for (long {t0} = 0; {t0} < {T}; {t0} += {BT})"):
                w.line(f"const long {bt} = {T} - {t0} < {BT} ? {T} - {t0} : {BT};")
                w.line(f"for (long {t} = 0; {t} < {bt}; ++{t}) {sv}[{t}] = 0.0f;")
                with w.block(f"for (long {d} = 0; {d} < {D}; ++{d})"):
                    qd = kc.tmp("qd")
                    w.line(f"const float {qd} = {qv}[{d}];")
                    w.line(f"for (long {t} = 0; {t} < {bt}; ++{t}) {sv}[{t}] += {qd} * {kt}[{d} * {T} + {t0} + {t}];")
                with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"), ev.scope():
                    sidx = Index(scores.shape, tuple(bidx.broadcast_to(scores.shape[:-2]).dims) + (i, f"{t0} + {t}"))
                    ev.bind(scores, sidx, f"{sv}[{t}]")
                    logit = ev.at(sm.inputs[0], sidx)
                    w.line(f"{sv}[{t}] = {logit};")
                    ev.unbind(scores)
                mb, mn, a, ls = kc.tmp("mb"), kc.tmp("mn"), kc.tmp("a"), kc.tmp("ls")
                w.line(f"{ct} {mb} = {m};")
                w.line(f"for (long {t} = 0; {t} < {bt}; ++{t}) {mb} = {sv}[{t}] > {mb} ? {sv}[{t}] : {mb};")
                w.line(f"const {ct} {mn} = {mb};")
                w.line(f"const {ct} {a} = expf({m} - {mn});")
                w.line(f"{ct} {ls} = 0.0f;")
                with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"):
                    w.line(f"{sv}[{t}] = expf({sv}[{t}] - {mn});")
                    w.line(f"{ls} += {sv}[{t}];")
                w.line(f"{l} = {l} * {a} + {ls};")
                w.line(f"for (long {dv} = 0; {dv} < {Dv}; ++{dv}) {ov}[{dv}] *= {a};")
                with w.block(f"for (long {t} = 0; {t} < {bt}; ++{t})"):
                    pt = kc.tmp("pt")
                    w.line(f"const float {pt} = {sv}[{t}];")
                    w.line(f"for (long {dv} = 0; {dv} < {Dv}; ++{dv}) "
                           f"{ov}[{dv}] += {pt} * {vp}[({t0} + {t}) * {Dv} + {dv}];")
                w.line(f"{m} = {mn};")
            with w.block(f"for (long {dv} = 0; {dv} < {Dv}; ++{dv})"), ev.scope():
                y = kc.tmp("y")
                w.line(f"const {ct} {y} = {ov}[{dv}] / {l};")
                oidx = Index(out.shape, tuple(bidx.dims) + (i, dv))
                finish_element(kc, ev, stage, out, oidx, y)
