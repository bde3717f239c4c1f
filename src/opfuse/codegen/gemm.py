"""The blocked GEMM core and the MatMul / Gemm kernels built on it.

``C[b] = A[b] @ B[b]`` (``A``: M x K, ``B``: K x N) is computed one output tile (up to
MC x NC) at a time, GotoBLAS style:

* the tile's accumulators live in per-thread scratch (``ctile``), never in the arena;
* K is walked in blocks of KC; for each block, the A rows and B columns the tile needs are
  packed into MR- / NR-wide panels (constant operands are packed once, at build time, into
  the weights blob, so the kernel only reads them);
* a register-blocked micro-kernel multiplies an MR x KC panel by a KC x NR panel into an
  MR x NR block of ``ctile`` (plain C that gcc vectorises: the NR loop is unit stride);
* once K is done, the epilogue maps every tile element to the anchor's output index,
  applies the anchor's own finishing (bias, ``alpha``/``beta``) and the group's fused
  elementwise ops while the tile is in cache, and stores the group outputs.

Tiles are independent and split across OpenMP threads; each output element's sum runs in
the same order whatever the thread count, so results do not depend on it.

Other dtypes than float32 use a direct triple loop with the same prologue/epilogue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from opfuse.codegen.ctype import c_type, literal
from opfuse.codegen.index import Index, add, delinearize
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ir.graph import Value
from opfuse.ops.registry import get_spec

Loader = Callable[[object, str, str, str], str]  # (ev, batch, row, col) -> C expression


@dataclass
class Operand:
    """One GEMM operand: a constant (``static``: nbatch x rows x cols, packed at build time,
    ``batch_expr(b)`` picking the batch) or a run-time tensor read by ``load``."""

    load: Loader
    static: np.ndarray | None = None
    batch_expr: Callable[[str], str] = lambda b: "0"


@dataclass
class Segment:
    """Part of a horizontally merged GEMM: rows (``axis="m"``) or columns (``"n"``)
    ``[start, stop)`` belong to ``problem``'s output, finished by ``stage``'s epilogue."""

    axis: str
    start: int
    stop: int
    problem: "GemmProblem"
    stage: Stage


class BPacker(Protocol):
    """A specialised B packer (convolution's im2col): scratch set-up once per kernel, set-up per
    tile, then packing of each KC x NC panel."""

    def prepare(self, kc, NC: int) -> BPacker: ...

    def per_tile(self, kc, n0: str, nc: str) -> None: ...

    def pack(self, kc, ev, p: GemmProblem, bp, b, n0, nc, pc, kb, NR) -> None: ...


@dataclass
class GemmProblem:
    name: str
    nb: int
    M: int
    N: int
    K: int
    a: Operand
    b: Operand
    out: Value                                   # the anchor's output value
    out_index: Callable[[str, str, str], Index]  # (b, m, n) -> index of out
    finish: Callable[[object, str, str, str, str], str] = lambda ev, acc, b, m, n: acc
    pack_b: BPacker | None = None                # specialised B packer (convolution's im2col)
    dtype: np.dtype = np.dtype(np.float32)
    segments: list[Segment] | None = None        # horizontal merge: who owns which rows/columns


def merge_problems(problems: list[GemmProblem], stages: list[Stage], axis: str) -> GemmProblem:
    """One GEMM for siblings sharing their run-time operand: constant operands are stacked
    along M (``axis="m"``, e.g. convolutions of one input) or N (``"n"``, matmuls of one input)."""
    first = problems[0]
    segs, start = [], 0
    for p, st in zip(problems, stages, strict=True):
        size = p.M if axis == "m" else p.N
        segs.append(Segment(axis, start, start + size, p, st))
        start += size
    if axis == "m":
        a = Operand(first.a.load, np.concatenate([p.a.static for p in problems], axis=1), first.a.batch_expr)
        merged = GemmProblem("+".join(p.name for p in problems), first.nb, start, first.N, first.K, a, first.b,
                             first.out, first.out_index, first.finish, first.pack_b, first.dtype, segs)
    else:
        b = Operand(first.b.load, np.concatenate([p.b.static for p in problems], axis=2), first.b.batch_expr)
        merged = GemmProblem("+".join(p.name for p in problems), first.nb, first.M, start, first.K, first.a, b,
                             first.out, first.out_index, first.finish, first.pack_b, first.dtype, segs)
    return merged


def pack_a_panels(a: np.ndarray, mr: int) -> np.ndarray:
    """(nb, M, K) -> (nb, ceil(M/mr), K, mr): MR rows interleaved per k, zero-padded."""
    nb, m, k = a.shape
    mp = -(-m // mr)
    pad = np.zeros((nb, mp * mr, k), dtype=np.float32)
    pad[:, :m] = a
    return np.ascontiguousarray(pad.reshape(nb, mp, mr, k).transpose(0, 1, 3, 2))


def pack_b_panels(b: np.ndarray, nr: int) -> np.ndarray:
    """(nb, K, N) -> (nb, ceil(N/nr), K, nr): NR columns interleaved per k, zero-padded."""
    nb, k, n = b.shape
    np_ = -(-n // nr)
    pad = np.zeros((nb, k, np_ * nr), dtype=np.float32)
    pad[:, :, :n] = b
    return np.ascontiguousarray(pad.reshape(nb, k, np_, nr).transpose(0, 2, 1, 3))


def _microkernel(mr: int, nr: int) -> tuple[str, str]:
    name = f"opfuse_ukr_{mr}x{nr}"
    text = f"""\
/* C[0:{mr}, 0:{nr}] += A panel ({mr} x kc, k-major) * B panel (kc x {nr}, k-major). */
static inline void {name}(long kc, const float* restrict a, const float* restrict b, float* restrict c, long ldc) {{
  float acc[{mr}][{nr}];
  for (int i = 0; i < {mr}; ++i)
    for (int j = 0; j < {nr}; ++j) acc[i][j] = c[i * ldc + j];
  for (long k = 0; k < kc; ++k) {{
    for (int i = 0; i < {mr}; ++i) {{
      const float ai = a[k * {mr} + i];
      for (int j = 0; j < {nr}; ++j) acc[i][j] += ai * b[k * {nr} + j];
    }}
  }}
  for (int i = 0; i < {mr}; ++i)
    for (int j = 0; j < {nr}; ++j) c[i * ldc + j] = acc[i][j];
}}
"""
    return name, text


def require_outlined_microkernel(kc) -> tuple[str, int, int]:
    """Register the options' MR x NR micro-kernel, behind a wrapper that is never inlined,
    with the program; ``(wrapper name, MR, NR)``. For kernels (attention) that drive the
    micro-kernel on panels they pack themselves: inlined into such a large loop nest, gcc
    keeps the accumulators on the stack (measured 20% slower on bert's attention)."""
    o = kc.program.options
    name, text = _microkernel(o.gemm_mr, o.gemm_nr)
    kc.program.require_helper(name, text)
    outlined = name + "_outlined"
    kc.program.require_helper(outlined, f"""\
__attribute__((noinline)) static void {outlined}(long kc, const float* restrict a, const float* restrict b,
                                                 float* restrict c, long ldc) {{
  {name}(kc, a, b, c, ldc);
}}
""")
    return outlined, o.gemm_mr, o.gemm_nr


def _min_expr(a: str, b: int) -> str:
    return f"({a} < {b} ? {a} : {b})"


def emit_epilogue(kc, ev, stage: Stage, p: GemmProblem, acc: str, b: str, m: str, n: str) -> None:
    """Finish one output element and store every group output the stage owns."""
    idx = p.out_index(b, m, n)
    val = p.finish(ev, acc, b, m, n)
    ct = c_type(p.dtype)
    name = kc.tmp("y")
    kc.w.line(f"const {ct} {name} = {val};")
    finish_element(kc, ev, stage, p.out, idx, name)


def emit_gemm(kc, ev, stage: Stage, p: GemmProblem) -> None:
    if p.dtype != np.float32 or 0 in (p.M, p.N, p.K):  # empty problems have nothing to tile
        return emit_naive(kc, ev, stage, p)
    o = kc.program.options
    MR, NR = o.gemm_mr, o.gemm_nr
    M, N, K = p.M, p.N, p.K
    MC = min(o.gemm_mc, -(-M // MR) * MR)
    NC = min(o.gemm_nc, -(-N // NR) * NR)
    KC = min(o.gemm_kc, K)
    MT, NT = -(-M // MC), -(-N // NC)
    ukr, text = _microkernel(MR, NR)
    kc.program.require_helper(ukr, text)
    w = kc.w
    fl = 4
    off_c = kc.scratch(MC * NC * fl)
    off_a = kc.scratch(MC * KC * fl) if p.a.static is None else None
    off_b = kc.scratch(KC * NC * fl) if p.b.static is None else None
    pa = pb = None
    if p.a.static is not None:
        pa = kc.const_array(("gemm_a", p.name, MR), pack_a_panels(p.a.static, MR), p.name + "_A", np.float32)
    if p.b.static is not None:
        pb = kc.const_array(("gemm_b", p.name, NR), pack_b_panels(p.b.static, NR), p.name + "_B", np.float32)
    extra = p.pack_b.prepare(kc, NC) if p.pack_b is not None and p.b.static is None else None

    tiles = p.nb * MT * NT
    t = kc.tmp("tile")
    kc.parallel_for(2 * p.nb * M * N * K)
    with w.block(f"for (long {t} = 0; {t} < {tiles}; ++{t})"):
        b, mt, nt_ = kc.tmp("b"), kc.tmp("mt"), kc.tmp("nt")
        w.line(f"const long {b} = {t} / {MT * NT};")
        w.line(f"const long {mt} = ({t} / {NT}) % {MT};")
        w.line(f"const long {nt_} = {t} % {NT};")
        m0, n0, mc, nc = kc.tmp("m0"), kc.tmp("n0"), kc.tmp("mc"), kc.tmp("nc")
        w.line(f"const long {m0} = {mt} * {MC};")
        w.line(f"const long {n0} = {nt_} * {NC};")
        w.line(f"const long {mc} = {_min_expr(f'{M} - {m0}', MC)};")
        w.line(f"const long {nc} = {_min_expr(f'{N} - {n0}', NC)};")
        ctile = kc.tmp("ctile")
        w.line(f"float* restrict {ctile} = {kc.scratch_ptr('float', off_c)};")
        w.line(f"memset({ctile}, 0, sizeof(float) * {MC * NC});")
        ap = bp = None
        if off_a is not None:
            ap = kc.tmp("apack")
            w.line(f"float* restrict {ap} = {kc.scratch_ptr('float', off_a)};")
        if off_b is not None:
            bp = kc.tmp("bpack")
            w.line(f"float* restrict {bp} = {kc.scratch_ptr('float', off_b)};")
        if extra is not None:
            extra.per_tile(kc, n0, nc)
        pc, kb = kc.tmp("pc"), kc.tmp("kc")
        with w.block(f"for (long {pc} = 0; {pc} < {K}; {pc} += {KC})"):
            w.line(f"const long {kb} = {_min_expr(f'{K} - {pc}', KC)};")
            if ap is not None:
                _pack_a(kc, ev, p, ap, b, m0, mc, pc, kb, MR)
            if bp is not None:
                if extra is not None:
                    extra.pack(kc, ev, p, bp, b, n0, nc, pc, kb, NR)
                else:
                    _pack_b(kc, ev, p, bp, b, n0, nc, pc, kb, NR)
            jr, ir = kc.tmp("jr"), kc.tmp("ir")
            if pa is not None:
                mp = -(-M // MR)
                a_ptr = f"{pa} + (({p.a.batch_expr(b)} * {mp} + ({m0} + {ir}) / {MR}) * {K} + {pc}) * {MR}"
            else:
                a_ptr = f"{ap} + {ir} * {kb}"
            if pb is not None:
                np_ = -(-N // NR)
                b_ptr = f"{pb} + (({p.b.batch_expr(b)} * {np_} + ({n0} + {jr}) / {NR}) * {K} + {pc}) * {NR}"
            else:
                b_ptr = f"{bp} + {jr} * {kb}"
            with w.block(f"for (long {jr} = 0; {jr} < {nc}; {jr} += {NR})"):
                with w.block(f"for (long {ir} = 0; {ir} < {mc}; {ir} += {MR})"):
                    w.line(f"{ukr}({kb}, {a_ptr}, {b_ptr}, {ctile} + {ir} * {NC} + {jr}, {NC});")
        _emit_tile_epilogue(kc, ev, stage, p, ctile, NC, b, m0, n0, mc, nc)


def _emit_tile_epilogue(kc, ev, stage, p: GemmProblem, ctile, NC, b, m0, n0, mc, nc) -> None:
    """Finish every element of the tile; merged GEMMs route row or column ranges to their
    own output and epilogue (one loop per range, so the inner loop stays branch-free)."""
    w = kc.w
    segments = p.segments or [Segment("n", 0, p.N, p, stage)]
    for seg in segments:
        lo_i, hi_i, lo_j, hi_j = "0", mc, "0", nc
        if seg.axis == "m" and p.segments:
            lo_i = f"({seg.start} > {m0} ? {seg.start} - {m0} : 0)"
            hi_i = f"({seg.stop} - {m0} < {mc} ? {seg.stop} - {m0} : {mc})"
        elif p.segments:
            lo_j = f"({seg.start} > {n0} ? {seg.start} - {n0} : 0)"
            hi_j = f"({seg.stop} - {n0} < {nc} ? {seg.stop} - {n0} : {nc})"
        i, j = kc.tmp("i"), kc.tmp("j")
        with w.block(f"for (long {i} = {lo_i}; {i} < {hi_i}; ++{i})"):
            m = kc.tmp("m")
            w.line(f"const long {m} = {m0} + {i}{f' - {seg.start}' if seg.axis == 'm' and seg.start else ''};")
            with w.block(f"for (long {j} = {lo_j}; {j} < {hi_j}; ++{j})"), ev.scope():
                n = kc.tmp("n")
                w.line(f"const long {n} = {n0} + {j}{f' - {seg.start}' if seg.axis == 'n' and seg.start else ''};")
                emit_epilogue(kc, ev, seg.stage, seg.problem, f"{ctile}[{i} * {NC} + {j}]", b, m, n)


def _pack_a(kc, ev, p: GemmProblem, ap, b, m0, mc, pc, kb, MR) -> None:
    w = kc.w
    ip, r, k = kc.tmp("ip"), kc.tmp("r"), kc.tmp("k")
    with w.block(f"for (long {ip} = 0; {ip} < {mc}; {ip} += {MR})"):
        with w.block(f"for (long {r} = 0; {r} < {MR}; ++{r})"):
            m, dst = kc.tmp("m"), kc.tmp("dst")
            w.line(f"const long {m} = {m0} + {ip} + {r};")
            w.line(f"float* restrict {dst} = {ap} + {ip} * {kb} + {r};")
            with w.block(f"if ({m} < {p.M})"):
                with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"), ev.scope():
                    w.line(f"{dst}[{k} * {MR}] = {p.a.load(ev, b, m, add(pc, k))};")
            with w.block("else"):
                w.line(f"for (long {k} = 0; {k} < {kb}; ++{k}) {dst}[{k} * {MR}] = 0.0f;")


def _pack_b(kc, ev, p: GemmProblem, bp, b, n0, nc, pc, kb, NR) -> None:
    w = kc.w
    jp, k, c = kc.tmp("jp"), kc.tmp("k"), kc.tmp("c")
    with w.block(f"for (long {jp} = 0; {jp} < {nc}; {jp} += {NR})"):
        cols = kc.tmp("cols")
        w.line(f"const long {cols} = {_min_expr(f'{p.N} - {n0} - {jp}', NR)};")
        with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
            dst = kc.tmp("dst")
            w.line(f"float* restrict {dst} = {bp} + {jp} * {kb} + {k} * {NR};")
            with w.block(f"for (long {c} = 0; {c} < {cols}; ++{c})"), ev.scope():
                n = kc.tmp("n")
                w.line(f"const long {n} = {n0} + {jp} + {c};")
                w.line(f"{dst}[{c}] = {p.b.load(ev, b, add(pc, k), n)};")
            w.line(f"for (long {c} = {cols}; {c} < {NR}; ++{c}) {dst}[{c}] = 0.0f;")


def emit_naive(kc, ev, stage: Stage, p: GemmProblem) -> None:
    """Direct triple loop (non-float32 dtypes): same operands, same epilogue."""
    w = kc.w
    ct = c_type(p.dtype)
    b, m, n, k = kc.tmp("b"), kc.tmp("m"), kc.tmp("n"), kc.tmp("k")
    kc.parallel_for(2 * p.nb * p.M * p.N * p.K, collapse=3)
    w.line(f"for (long {b} = 0; {b} < {p.nb}; ++{b})")
    with w.block(f"for (long {m} = 0; {m} < {p.M}; ++{m})"):
        with w.block(f"for (long {n} = 0; {n} < {p.N}; ++{n})"), ev.scope():
            acc = kc.tmp("acc")
            w.line(f"{ct} {acc} = {literal(0, p.dtype)};")
            with w.block(f"for (long {k} = 0; {k} < {p.K}; ++{k})"), ev.scope():
                w.line(f"{acc} += {p.a.load(ev, b, m, k)} * {p.b.load(ev, b, k, n)};")
            emit_epilogue(kc, ev, stage, p, acc, b, m, n)


# MatMul -----------------------------------------------------------------------------------
def _static(ev, v: Value) -> np.ndarray | None:
    return ev.static.get(id(v))


def matmul_problem(kc, ev, node) -> GemmProblem:
    """NumPy ``matmul`` semantics: 1-D operands are promoted (and the axis dropped from the
    result); batch axes broadcast. A constant 2-D ``B`` folds A's batch into M (one big GEMM)."""
    A, B = node.input(0), node.input(1)
    out = node.outputs[0]
    a2 = (1,) + A.shape if len(A.shape) == 1 else A.shape
    b2 = B.shape + (1,) if len(B.shape) == 1 else B.shape
    M, K, N = a2[-2], a2[-1], b2[-1]
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    a_vec, b_vec = len(A.shape) == 1, len(B.shape) == 1
    rb = len(batch)
    fold = len(b2) == 2 and not b_vec and rb > 0 and tuple(a2[:-2]) == batch

    def out_dims(bdims: list[str], m: str, n: str) -> list[str]:
        return bdims + ([] if a_vec else [m]) + ([] if b_vec else [n])

    if fold:
        nb, Mf = 1, math.prod(batch) * M
        rows = batch + (M,)

        def out_index(b, m, n):
            dims = delinearize(m, rows) + [n]
            return Index(out.shape, tuple(dims), ((0, len(rows), m),) if len(rows) > 1 else ())

        def a_load(ev, b, m, k):
            dims = delinearize(m, rows) + [k]
            return ev.at(A, Index(A.shape, tuple(dims), ((0, len(rows), m),) if len(rows) > 1 else ()))
    else:
        nb, Mf = math.prod(batch), M

        def bidx(b) -> Index:
            return Index.loops(batch, [(0, rb, b)]) if rb else Index((), ())

        def out_index(b, m, n):
            return Index(out.shape, tuple(out_dims(list(bidx(b).dims), m, n)))

        def a_load(ev, b, m, k):
            bd = list(bidx(b).broadcast_to(a2[:-2]).dims)
            dims = bd + ([] if a_vec else [m]) + [k]
            return ev.at(A, Index(A.shape, tuple(dims)))

    def b_load(ev, b, k, n):
        bd = list(Index.loops(batch, [(0, rb, b)]).broadcast_to(b2[:-2]).dims) if rb and not fold else \
            ["0"] * len(b2[:-2])
        dims = bd + [k] + ([] if b_vec else [n])
        return ev.at(B, Index(B.shape, tuple(dims)))

    a_op = Operand(a_load)
    b_op = Operand(b_load)
    sa, sb = _static(ev, A), _static(ev, B)
    if sa is not None:
        arr = sa.reshape(a2).astype(np.float32)
        nba = math.prod(a2[:-2])
        a_op.static = arr.reshape(nba, M, K)
        a_op.batch_expr = (lambda b: Index.loops(batch, [(0, rb, b)]).broadcast_to(a2[:-2]).offset()) \
            if nba > 1 else (lambda b: "0")
        if fold:
            a_op.static = arr.reshape(1, Mf, K)
            a_op.batch_expr = lambda b: "0"
    if sb is not None:
        arr = sb.reshape(b2).astype(np.float32)
        nbb = math.prod(b2[:-2])
        b_op.static = arr.reshape(nbb, K, N)
        b_op.batch_expr = (lambda b: Index.loops(batch, [(0, rb, b)]).broadcast_to(b2[:-2]).offset()) \
            if nbb > 1 else (lambda b: "0")
    return GemmProblem(node.name, nb, Mf, N, K, a_op, b_op, out, out_index, dtype=out.dtype)


def lower_matmul(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    p = matmul_problem(kc, ev, stage.anchor_node)
    emit_gemm(kc, ev, stage, p)


# Gemm -------------------------------------------------------------------------------------
def gemm_problem(kc, ev, node) -> GemmProblem:
    """``Y = alpha * A' @ B' + beta * C`` with A' = A^T if transA, B' = B^T if transB."""
    a = get_spec(node.op_type, node).attrs_of(node)
    A, B = node.input(0), node.input(1)
    C = node.inputs[2] if len(node.inputs) > 2 else None
    out = node.outputs[0]
    ta, tb = int(a["transA"]), int(a["transB"])
    M, N = out.shape
    K = A.shape[0] if ta else A.shape[1]
    dt = out.dtype

    def a_load(ev, b, m, k):
        return ev.at(A, Index(A.shape, (k, m) if ta else (m, k)))

    def b_load(ev, b, k, n):
        return ev.at(B, Index(B.shape, (n, k) if tb else (k, n)))

    a_op, b_op = Operand(a_load), Operand(b_load)
    sa, sb = _static(ev, A), _static(ev, B)
    if sa is not None:
        a_op.static = (sa.T if ta else sa).astype(np.float32).reshape(1, M, K)
    if sb is not None:
        b_op.static = (sb.T if tb else sb).astype(np.float32).reshape(1, K, N)
    alpha, beta = float(a["alpha"]), float(a["beta"])

    def finish(ev, acc, b, m, n):
        y = acc if alpha == 1.0 else f"{literal(alpha, dt)} * {acc}"
        if C is not None and beta != 0.0:
            c = ev.at(C, Index((M, N), (m, n)).broadcast_to(C.shape))
            y = f"{y} + {c}" if beta == 1.0 else f"{y} + {literal(beta, dt)} * {c}"
        return y

    def out_index(b, m, n):
        return Index((M, N), (m, n))

    return GemmProblem(node.name, 1, M, N, K, a_op, b_op, out, out_index, finish, dtype=dt)


def lower_gemm(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    emit_gemm(kc, ev, stage, gemm_problem(kc, ev, stage.anchor_node))

