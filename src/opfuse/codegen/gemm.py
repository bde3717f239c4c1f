"""The blocked GEMM core and the MatMul / Gemm kernels built on it.

``C[b] = A[b] @ B[b]`` (``A``: M x K, ``B``: K x N) is computed one output tile (up to
MC x NC, ``choose_blocking``) at a time, GotoBLAS style:

* the tile's accumulators live in per-thread scratch (``ctile``), never in the arena;
* K is walked in blocks of KC. A constant operand is packed once, at build time, into the
  micro-kernel's panel layout in the weights blob (MR rows or NR columns interleaved per k);
  a run-time operand is read in place when its layout allows (``RowAccess``: rows of A, a
  convolution's windows; ``ColAccess``: unit-stride rows of B), and otherwise packed per tile
  and K block (convolution's im2col packers for B);
* a register-blocked micro-kernel (``microkernel.py``: AVX2/FMA intrinsics, plain C99 where
  there is no AVX2) adds an MR x KC by KC x NR product into an MR x NR block of ``ctile``,
  the NR panels of a K block in the outer loop (B's micro-panel stays in L1) and the MR
  panels inside;
* once K is done, the epilogue maps every tile element to the anchor's output index,
  applies the anchor's own finishing (bias, ``alpha``/``beta``) and the group's fused
  elementwise ops while the tile is in cache, and stores the group outputs. A tile whose
  output runs along M in memory (a convolution computed as positions x channels) is
  transposed first, so the epilogue's stores stay unit stride; with a bias and Relu at most,
  the micro-kernel finishes its block and stores it transposed from its registers instead
  (``register_epilogue``; ``microkernel._store_transposed``).

Tiles are independent and split across threads (the program's pool, threadpool.py); each output element's sum runs over
k in increasing order, in the same K blocks whatever the thread count, so results do not
depend on it.

Other dtypes than float32 use a direct triple loop with the same prologue/epilogue.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from opfuse.codegen.ctype import c_type, float_to_int_helper, literal
from opfuse.codegen.index import Index, add, delinearize
from opfuse.codegen import simdchain, vecmath
from opfuse.codegen.epilogue import VectorEpilogue, finish_element
from opfuse.codegen.gelu import GELU_HELPER, require_gelu, require_vector_gelu
from opfuse.codegen.microkernel import ACTIVATIONS, YMM_FLOATS, ZMM_FLOATS, fits_avx2, fits_avx512, fits_neon, \
    microkernel, transpose_helper
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.codegen.vecmath import VecIsa
from opfuse.ir.graph import Value
from opfuse.ops.common import wrap_int
from opfuse.ops.registry import get_spec

Loader = Callable[[object, str, str, str], str]  # (ev, batch, row, col) -> C expression
TRANSPOSE_COLUMNS = 32  # columns of a transposed C tile turned back per epilogue pass
WINDOWS_ROWS_OUTER_BYTES = 256 << 10  # A's windows outermost only while a K block of B fits this
# Windows gathered one panel at a time (A's panels outermost) while B's K block is at most this, else the whole
# tile's K block before the channel panels (``CodegenOptions.gemm_pack_windows``).
WINDOWS_PACK_PANEL_BYTES = 384 << 10
# ... and only where a tile has at least this many panels of channels to share each gathered panel: each window
# value gathered once replaces one broadcast per channel panel. Measured (1 thread, CPU time, against the table
# read in place): 2 panels (a grouped 3x3, 32 channels a group) 1.04-1.11x slower gathered, 4 panels (a 3x3
# 256 -> 256 at 5x5, tiles of 64 channels) 1.07x slower (600 interleaved rounds); resnet18's strided layers, 8 panels
# (tiles of 128 channels), 0.81-0.94x.
WINDOWS_PACK_MIN_PANELS = 8
# A's panels outermost where the micro-kernel stores the output, B's packed K block is at most
# ``ROWS_OUTER_STORE_BYTES`` and the output at least ``ROWS_OUTER_STORE_MIN_OUTPUT`` (more than a core's L2:
# its lines are written back to memory, and each A panel's rows are then written as long runs the prefetchers
# follow; ``CodegenOptions.gemm_rows_outer_store``). Measured (1 thread, standalone C, min of 15-40 runs, four
# rounds interleaved, after a 32 MB write): 1x1 64 -> 128 at 112x112 (64 KB, 6.4 MB out) 0.90-0.96x cold,
# 0.91-1.05x warm; 128 -> 128 at 56x56 and 256 -> 256 at 28x28 (128 KB each) 0.98-1.04x. In mobilenet_v1
# (kernel CPU time, 40 runs in alternating order, controls pw3/pw5/conv1 0.97-1.01x): pw1 (3.2 MB out) 0.87x,
# pw2 (1.6 MB) 1.02x, pw4 (0.8 MB) 1.04x: those two left as they were.
ROWS_OUTER_STORE_BYTES = 64 << 10
ROWS_OUTER_STORE_MIN_OUTPUT = 2 << 20


class RowAccess:
    """A read in place, without packing: row ``m`` of batch ``b`` starts at the C pointer
    ``row(b, m)``; element ``k`` of the row is ``k`` floats further (``koff`` None: a row-major
    activation) or ``koff[k]`` floats further (a convolution window: ``koff`` holds the offset
    of each (channel, tap) pair). ``per_tile`` may first stage what the tile reads (a
    zero-padded copy of the input rows); ``prepare`` reserves its scratch."""

    koff: np.ndarray | None = None
    # Set by the GEMM before ``per_tile`` where tiles of the same rows follow one another: (a C lvalue, the
    # tile's rows' key); the copy is skipped where the lvalue holds the key, and sets it (``gemm_reuse_band``).
    reuse: tuple[str, str] | None = None
    # With ``koff``: whether a row's values are scattered over its window's taps and strides, so that gathering
    # them into panels pays (``CodegenOptions.gemm_pack_windows``); a 1x1 stride-1 window is a run of consecutive
    # positions per channel, read in order already.
    scattered: bool = False

    def prepare(self, kc, MC: int) -> None:
        return None

    def per_tile(self, kc, ev, b: str, m0: str, mc: str) -> None:
        return None

    def stages_per_tile(self) -> bool:
        """Whether ``per_tile`` copies anything (which ``reuse`` may skip)."""
        return False

    def row(self, b: str, m: str) -> str:
        raise NotImplementedError

    def row_step(self, MR: int) -> int:
        """With ``koff``: ``s`` > 0 where every MR-row block the GEMM reads (tiles start on MR
        boundaries) has row ``i`` at ``row(b, m) + i * s`` floats, no row past M (``microkernel``'s
        ``a_step``); 0 where the rows are not so."""
        return 0


class PointerRows(RowAccess):
    """Rows of a tensor in memory: ``row(b, m)`` given by a function."""

    def __init__(self, row: Callable[[str, str], str]):
        self._row = row

    def row(self, b: str, m: str) -> str:
        return self._row(b, m)


@dataclass
class ColAccess:
    """B read in place: ``ptr(b, k, n)`` is a C pointer to ``B[k, n]``, row ``k + 1`` is ``ldb``
    floats further and a row's columns are contiguous (an NCHW input of a 1x1 convolution).
    Used only when N is a multiple of NR, so no panel reads past the end of a row. With ``koff``
    (``conv_direct.py``), row ``k`` of an NR-column panel is ``koff[k]`` floats past
    ``ptr(b, 0, n)`` instead; ``per_tile`` may first stage what the tile reads (a zero-padded,
    phase-split copy of the input rows), and ``prepare`` reserves its scratch and fixes ``koff``.
    ``split`` (with ``koff``; 0: none): a panel is two pieces of ``split`` columns (NR = 2 ``split``), each in
    one output row, the second ``split_ldb(b, n)`` floats past the first for the panel at ``n`` (the
    micro-kernel's ``b_split``; the step goes in its ``ldb``)."""

    ptr: Callable[[str, str, str], str]
    ldb: int
    koff: np.ndarray | None = None
    split: int = 0

    def split_ldb(self, b: str, n: str) -> str:
        raise NotImplementedError("a B read in one piece per panel has no piece step")

    def prepare(self, kc, NC: int) -> None:
        return None

    def per_tile(self, kc, ev, b: str, n0: str, nc: str) -> None:
        return None

    def stages_per_tile(self) -> bool:
        """Whether ``per_tile`` copies anything (then cutting M repeats the copy)."""
        return type(self).per_tile is not ColAccess.per_tile


@dataclass
class Operand:
    """One GEMM operand: a constant (``static``: nbatch x rows x cols, packed at build time,
    ``batch_expr(b)`` picking the batch) or a run-time tensor read by ``load`` and packed per
    tile, unless it can be read in place (``rows`` for A, ``cols`` for B)."""

    load: Loader
    static: np.ndarray | None = None
    batch_expr: Callable[[str], str] = lambda b: "0"
    rows: RowAccess | None = None
    cols: ColAccess | None = None
    # B packed per tile whose rows lie in memory with unit stride: ``row_ptr(b, k, n)`` is a C pointer
    # to ``B[k, n]``; the packing copies each panel row as one block (``_pack_b``).
    row_ptr: Callable[[str, str, str], str] | None = None
    # ... and ``row_step`` floats from row k to row k + 1, the same for every k (``pack_in_kernel``); None: unknown.
    row_step: int | None = None


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


class APacker(Protocol):
    """A specialised A packer: fills the tile's MR-row panels (``ap[ip * kb + k * MR + r]`` holds
    ``A[m0 + ip + r, pc + k]``, rows past ``mc`` zero) for one K block; with ``tails`` (``tail_panels``) the
    rows before them only, and in the last row tile each tail panel of ``w`` rows from row ``f``
    (``tail_rows``) at ``ap[(f - m0) * kb + k * w + r]``."""

    def pack(self, kc, ap: str, b: str, m0: str, mc: str, pc: str, kb: str, MR: int,
             tails: Sequence[int] = ()) -> None: ...


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
    # (ev, acc, b, m, n) -> the output element from its sum ``acc``; None: ``acc``, plus ``finish_bias``'s term
    # where given (a convolution's bias, constant along the output's unit-stride axis): the vector tile epilogue
    # (``_vector_epilogue``) computes only that form.
    finish: Callable[[object, str, str, str, str], str] | None = None
    finish_bias: Callable[[object, str, str, str], str] | None = None
    pack_b: BPacker | None = None                # specialised B packer (convolution's im2col)
    pack_a: "APacker | None" = None              # specialised A packer (a 1x1 convolution's positions)
    dtype: np.dtype = np.dtype(np.float32)
    segments: list[Segment] | None = None        # horizontal merge: who owns which rows/columns
    out_contiguous: str = "n"                    # the output axis that is unit stride in memory
    weights_axis: str = "m"                      # "m": A holds the weights, "n": B does
    mc: int | None = None                        # the tile's rows, when the problem knows better
    nc: int | None = None                        # the tile's columns at most, when it knows better
    # The output's rows (m) are ``store_ld`` floats apart, its columns (n) contiguous, and ``finish`` is
    # ``acc`` plus ``row_bias[m]`` (a constant) where given: the micro-kernel may then finish the block
    # in registers and store it (``register_epilogue``). With ``out_contiguous == "m"`` the other way
    # round: columns ``store_ld`` floats apart, rows contiguous, the bias a column's (``row_bias[n]``).
    # ``bias_index(b, i)``: the bias element of row (or column) ``i`` of batch ``b`` (a group's channels).
    store_ld: int | None = None
    # ``store_ld`` for the storing variant with a column bias only (``register_epilogue``'s "c"): a MatMul's
    # output rows, N floats apart; without a bias its blocks still go through the C tile.
    bias_store_ld: int | None = None
    row_bias: Value | None = None
    bias_index: Callable[[str, str], str] = lambda b, i: i
    register_block: tuple[int, int] | None = None  # (MR, NR) instead of the options' (no constant A)


def merge_problems(problems: list[GemmProblem], stages: list[Stage], axis: str | None = None) -> GemmProblem:
    """One GEMM for siblings sharing their run-time operand: the constant operands are stacked
    along M (``axis="m"``, A holds the weights) or N (``"n"``, B does); by default along the
    problems' ``weights_axis``."""
    first = problems[0]
    axis = axis or first.weights_axis
    segs, start = [], 0
    for p, st in zip(problems, stages, strict=True):
        size = p.M if axis == "m" else p.N
        segs.append(Segment(axis, start, start + size, p, st))
        start += size
    name = "+".join(p.name for p in problems)
    if axis == "m":
        a = replace(first.a, static=np.concatenate([p.a.static for p in problems], axis=1))
        return replace(first, name=name, M=start, a=a, segments=segs)
    b = replace(first.b, static=np.concatenate([p.b.static for p in problems], axis=2))
    return replace(first, name=name, N=start, b=b, segments=segs)


def pack_a_panels(a: np.ndarray, mr: int, tails: Sequence[int] = ()) -> np.ndarray:
    """(nb, M, K) -> (nb, ceil(M/mr), K, mr): MR rows interleaved per k, zero-padded. With ``tails``
    (``tail_panels``): the rows before them in MR-row panels, then each tail's rows in a panel of its own
    width, no padding; the panel starting at row ``m`` with ``w`` rows is at ``m * K`` in its batch's
    ``M * K`` floats, its column ``k`` at ``k * w`` in the panel."""
    nb, m, k = a.shape
    if tails:
        body = m - sum(tails)
        parts = [pack_a_panels(a[:, :body], mr).reshape(nb, body * k)]
        for start, width in tail_rows(m, tails):
            parts.append(a[:, start:start + width].transpose(0, 2, 1).reshape(nb, k * width))
        return np.ascontiguousarray(np.concatenate(parts, axis=1))
    mp = -(-m // mr)
    pad = np.zeros((nb, mp * mr, k), dtype=np.float32)
    pad[:, :m] = a
    return np.ascontiguousarray(pad.reshape(nb, mp, mr, k).transpose(0, 1, 3, 2))


# Independent multiply-add chains the FMA pipes need to stay busy: latency 4 cycles x 2 pipes (Zen 3, Zen 4,
# Skylake). A micro-kernel with fewer accumulators waits on its own results (``tail_panels``' cost).
FMA_CHAINS = 8


def tail_panels(M: int, MR: int, NR: int, MC: int, o) -> tuple[int, ...]:
    """The widths of the panels that end M where MR does not divide it (``CodegenOptions.gemm_tail_panels``),
    or ``()``: the last M mod MR rows in an MR-row panel padded with zero rows, computed and dropped.
    A micro-kernel call of ``r`` rows costs ``max(r * vectors per row, FMA_CHAINS)`` FMA slots per k step, so
    4 rows cost two thirds of 6 (8 ymm accumulators keep the pipes busy), 2 rows as much as 4: the last
    T = M mod MR rows, or T + MR (one whole panel fewer), are split into the widths of least cost whose
    micro-kernel has the vector body of the register block (``fits_avx2``, ``fits_avx512``), fewer panels on a
    tie; kept only where that costs less than the padded panel. 6 x 16 on AVX2: 128 rows end in 4 + 4
    (22 panels of 6 computed 132), 49 in 4 + 3, 196 in 4. Every tail lies in the last row tile (MC rows
    from a multiple of MC). x86 vector builds only (AVX2, AVX-512)."""
    R = M % MR
    if not o.gemm_tail_panels or not R or o.simd != "auto" or o.vector_isa not in ("avx2", "avx512"):
        return ()
    fits, width = (fits_avx512, ZMM_FLOATS) if o.vector_isa == "avx512" and fits_avx512(MR, NR) else \
        (fits_avx2, YMM_FLOATS)
    if NR % width or not fits(MR, NR):
        return ()
    nv = NR // width

    def cost(r: int) -> int:
        return max(r * nv, FMA_CHAINS)
    sizes = [r for r in range(MR, 0, -1) if fits(r, NR)]
    last = M - (-(-M // MC) - 1) * MC  # rows of the last row tile
    best: tuple[int, int, tuple[int, ...]] = (cost(MR), 1, ())  # (cost past the whole panels, panels, widths)
    for T in (R, R + MR):
        if T > last:
            continue
        split: dict[int, tuple[int, int, tuple[int, ...]]] = {0: (0, 0, ())}  # rows -> cheapest split
        for t in range(1, T + 1):
            ways = [(split[t - r][0] + cost(r), split[t - r][1] + 1, (*split[t - r][2], r))
                    for r in sizes if r <= t and t - r in split]
            if ways:
                split[t] = min(ways)
        if T in split:
            c, n, widths = split[T]
            cand = (c - (T - R) // MR * cost(MR), n, tuple(sorted(widths, reverse=True)))
            if cand[:2] < best[:2]:
                best = cand
    return best[2]


def tail_rows(M: int, tails: Sequence[int]) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each tail panel (``tail_panels``), in order, ending at M."""
    start, out = M - sum(tails), []
    for width in tails:
        out.append((start, width))
        start += width
    return out


def pack_b_panels(b: np.ndarray, nr: int) -> np.ndarray:
    """(nb, K, N) -> (nb, ceil(N/nr), K, nr): NR columns interleaved per k, zero-padded."""
    nb, k, n = b.shape
    np_ = -(-n // nr)
    pad = np.zeros((nb, k, np_ * nr), dtype=np.float32)
    pad[:, :, :n] = b
    return np.ascontiguousarray(pad.reshape(nb, k, np_, nr).transpose(0, 2, 1, 3))


def _microkernel(kc, mr: int, nr: int, a: str = "packed", b: str = "packed", epilogue: str | None = None,
                 transposed: bool = False, a_step: int = 0, b_split: int = 0, b_next: int = 0,
                 b_copy: bool = False) -> str:
    """Register the MR x NR micro-kernel (``microkernel.py``) with the program; its name."""
    o = kc.program.options
    name, text = microkernel(mr, nr, a, b, o.simd, o.gemm_prefetch, o.gemm_scalar_accumulators,
                             o.vector_isa == "avx512", epilogue, transposed, a_step, o.vector_isa == "neon", b_split,
                             k_unroll=o.gemm_k_unroll, b_next=b_next, b_copy=b_copy)
    return kc.program.require_helper(name, text)


def microkernel_bodies(mr: int, nr: int, simd: str, avx512: bool, neon: bool = False) -> str:
    """Which bodies the MR x NR micro-kernel has (the first whose ``#if`` holds is compiled)."""
    if simd == "none":
        return "plain C"
    bodies = (["NEON"] if neon and nr % 4 == 0 else []) + (["AVX-512F"] if avx512 and fits_avx512(mr, nr) else []) + \
        (["AVX2"] if nr % YMM_FLOATS == 0 else [])
    return " / ".join(bodies + ["plain C"]) + " by the compiler's target"


def require_outlined_microkernel(kc, load_c: bool = True) -> tuple[str, int, int]:
    """Register the options' MR x NR micro-kernel and a wrapper with the program; ``(wrapper
    name, MR, NR)``. The wrapper adds to C (``load_c``) or sets it: ``f(kc, a panel, b panel, c,
    ldc)``. For kernels (attention) that drive the micro-kernel on panels they pack themselves."""
    o = kc.program.options
    name = _microkernel(kc, o.gemm_mr, o.gemm_nr)
    outlined = name + ("_outlined" if load_c else "_outlined_set")
    kc.program.require_helper(outlined, f"""\
static void {outlined}(long kc, const float* restrict a, const float* restrict b, float* restrict c, long ldc) {{
  {name}(kc, a, 0, 0, b, {o.gemm_nr}, c, ldc, {int(load_c)});
}}
""")
    return outlined, o.gemm_mr, o.gemm_nr


def transposed_ld(mc: int) -> int:
    """Leading dimension of the transposed tile copy (TRANSPOSE_COLUMNS rows of MC floats): MC,
    one cache line more where MC floats are a multiple of 1 KiB, so the rows do not fall in a few
    L1 sets. With MC = 1024 (8-row panels) the rows were 4 KiB apart: mobilenet_v1's conv1 (3 -> 32
    channels, 112x112) took 445 us with MR = 8, 386 with this padding (min of 40 runs; 6-row
    panels give 1020 positions, 4080 bytes apart, 387 us)."""
    return mc + 16 if mc * 4 % 1024 == 0 else mc


def _min_expr(a: str, b: int | str) -> str:
    return f"({a} < {b} ? {a} : {b})"


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def k_blocks(K: int, KC: int) -> int:
    """The K block: at most ``KC``, the blocks as even as possible (no short tail block that
    would run the micro-kernel for a few steps between two C tile round trips)."""
    return -(-K // -(-K // KC))


@dataclass(frozen=True)
class Blocking:
    """Cache blocks of one GEMM: tiles of MC x NC outputs, K in blocks of KC."""

    MC: int
    NC: int
    KC: int


def single_row_fits(o, nr: int) -> bool:
    """Whether a 1 x ``nr`` micro-kernel runs with the intrinsics under these options (``CodegenOptions.gemm_gemv_nr``
    on; ``nr`` within the ISA's registers): the single row's block, a GEMM's with M = 1 or a convolution's over
    one position (``conv_windows.register_block``)."""
    return o.simd == "auto" and bool(o.gemm_gemv_nr) and nr > 0 and (
        fits_avx2(1, nr) or (o.vector_isa == "avx512" and fits_avx512(1, nr))
        or (o.vector_isa == "neon" and fits_neon(1, nr)))


def register_block(p: GemmProblem, o) -> tuple[int, int]:
    """The micro-kernel's MR x NR: the problem's own if it asks for one; for a single row with the
    intrinsics 1 x ``gemm_gemv_nr`` (``CodegenOptions.gemm_gemv_nr``), or N rounded up to whole
    vectors where that is narrower (a panel no wider than the row); else the options'."""
    if p.register_block:
        return p.register_block
    if p.M == 1:
        nr = min(o.gemm_gemv_nr, _round_up(p.N, YMM_FLOATS))
        if single_row_fits(o, nr):
            return 1, nr
    return o.gemm_mr, o.gemm_nr


def choose_blocking(p: GemmProblem, o) -> Blocking:
    """An operand packed per tile is packed once per (tile, K block): the other dimension then
    spans up to ``gemm_wide`` so the packing is shared by as many outputs as possible. The C
    tile (MC x NC floats) stays within ``gemm_tile_floats`` (L2), and a problem too small for
    ``gemm_min_tiles`` tiles is cut along N, so threads have tiles to share."""
    MR, NR = register_block(p, o)
    Mp, Np = _round_up(p.M, MR), _round_up(p.N, NR)
    KC = k_blocks(p.K, o.gemm_kc)
    pack_a = p.a.static is None and p.a.rows is None
    pack_b = p.b.static is None and p.b.cols is None
    budget = o.gemm_tile_floats

    def rows(limit: int) -> int:  # tiles start on panel boundaries: MC and NC are whole panels
        return min(Mp, max(MR, limit // MR * MR))

    def cols(limit: int) -> int:  # a divisor of N when one is near: then every tile is whole
        nc = min(Np, max(NR, limit // NR * NR))
        for c in range(nc, max(NR, nc * 3 // 4) - 1, -NR):
            if p.N % c == 0:
                return c
        return nc

    if p.mc is not None:
        MC = rows(p.mc)
        NC = cols(budget // MC)
    elif p.nc is not None:
        MC = rows(o.gemm_wide)
        NC = cols(min(p.nc, budget // MC))
    elif pack_b and not pack_a:
        MC = rows(o.gemm_wide)
        NC = cols(min(budget // MC, o.gemm_nc))
    elif pack_a and not pack_b:
        NC = cols(o.gemm_wide)
        MC = rows(min(budget // NC, o.gemm_mc))
    elif p.b.static is not None or p.a.static is not None:  # weights: each panel serves all it can
        MC = rows(o.gemm_wide)
        NC = cols(budget // MC)
    else:
        MC = rows(o.gemm_mc)
        NC = cols(budget // MC)
    while p.nb * -(-p.M // MC) * -(-p.N // NC) < o.gemm_min_tiles and NC >= 4 * NR:
        NC = cols(NC // 2)
    MC, NC = balance_tiles(p, o, MR, NR, MC, NC)
    return Blocking(MC, NC, KC)


BALANCE_EXTRA_CUTS = 3  # tiles per side the balancing may add to what the cache blocking chose
BALANCE_MIN_GAIN = 0.02  # efficiency (speed-up / threads) a new cut must add to be taken
BALANCE_ENOUGH = 0.95  # efficiency past which more tiles buy nothing: then the fewest tiles win


def weights_split(p: GemmProblem, o, NR: int, MT: int, NT: int, stores: bool, packed_b: bool) -> int:
    """Parts of N a GEMM's tiles are cut into when it runs on more than one thread (0: none). Where B is a
    layer's weights, packed at build time, and every tile spans all N of them (one column of tiles: A, the
    positions, packed per tile), each tile streams all the weights; with ``schedule(dynamic, 1)`` every core
    then reads all of them, once per tile, through its own L2. Split in ``t`` parts of N (the largest of
    ``balance_threads``), N outermost and the schedule static, thread ``i`` takes the tiles of part ``i``: each
    core reads ``1 / t`` of the weights, and packs every tile's A itself (the rows are few: 14 positions
    against 512 channels). Decided at run time: on one thread the tiles are the cache blocking's, no A
    packed twice. Only where: B's bytes reach ``gemm_split_weights_bytes``; the micro-kernel stores the
    outputs (no C tile finished at N's width); one batch; at least two row tiles per part-thread; N in whole
    NR panels per part; loops that may be split at all (not the microcontroller's, nor a kernel kept on one
    thread by ``parallel_min_flops``). Results do not change: each output's sum is the same."""
    t = max((x for x in o.balance_threads if x > 1), default=0)
    if not o.gemm_split_weights_bytes or not t or not stores or not packed_b or p.a.static is not None \
            or p.nb != 1 or NT != 1 or MT < 2 * t or p.N % (t * NR) \
            or p.N * p.K * 4 < o.gemm_split_weights_bytes or 2 * p.M * p.N * p.K < o.parallel_min_work:
        return 0
    return t


def next_panel(p: GemmProblem, o, MR: int, NR: int, MC: int, KC: int, rows: int, packed_b: bool,
               a_outer: bool) -> tuple[int, int]:
    """``(step, share)`` of the next-panel prefetch (``CodegenOptions.gemm_next_panel_bytes``), ``(0, 0)`` where
    there is none: B constant and packed (``packed_b``) in whole 16-float lines per k step, at least
    ``gemm_next_panel_bytes``, more than one panel, B's panel outermost (not ``a_outer``), a tile's ``rows``
    (its whole MR-row blocks; the tail panels take no share) in at least one block, an x86 host build. Each
    of a tile's ``min(MC, rows) // MR`` whole blocks' calls on a panel prefetches a ``share`` of the next panel's
    K block's lines, one every ``step`` k steps (the most that spreads a share over a K block of KC), so those
    calls together take all of it (a part block's call after them, none)."""
    if not packed_b or a_outer or not o.gemm_next_panel_bytes or p.K * p.N * 4 < o.gemm_next_panel_bytes \
            or NR % 16 or p.N <= NR or rows < MR or o.platform != "host" or o.simd != "auto" \
            or o.vector_isa not in ("avx2", "avx512"):
        return 0, 0
    calls = min(MC, rows) // MR
    share = -(-KC * NR // 16 // calls)
    return max(1, KC // share), share


def balance_efficiency(costs: Sequence[float], threads: Sequence[int]) -> tuple[float, ...]:
    """Per thread count, the efficiency (speed-up / threads) the iterations allow on that many
    cores, the iterations handed out in order as ``schedule(dynamic, 1)`` does."""
    from opfuse.codegen.kernel import ParallelLoop
    loop = ParallelLoop(len(costs), 0, "dynamic", tuple(costs))
    return tuple(loop.speedup(t) / t for t in threads)


def balance_gain(new: Sequence[float], old: Sequence[float]) -> bool:
    """Whether efficiencies ``new`` (per ``balance_threads``, in order) are worth a change from ``old``:
    at the first thread count where they differ by ``BALANCE_MIN_GAIN`` or more, ``new`` is higher."""
    for n, o in zip(new, old, strict=True):
        if abs(n - o) >= BALANCE_MIN_GAIN:
            return n > o
    return False


def balance_tiles(p: GemmProblem, o, MR: int, NR: int, MC: int, NC: int) -> tuple[int, int]:
    """Cut the tiles again so that the threads finish together (``CodegenOptions.balance_threads``):
    a cache blocking of 7 tiles keeps 2 threads busy for 4 tiles' time (1.75x), one whose last row
    of tiles is 2 rows high spends a thread on almost nothing, and a problem of one tile (N too
    narrow to cut: a convolution with 16 output channels) runs on one thread. Candidates split each
    side into up to ``BALANCE_EXTRA_CUTS`` more near-equal tiles, never larger than the cache
    blocking's. One is taken where it reaches ``gemm_min_tiles`` tiles and the blocking did not, or
    where its efficiency (speed-up / threads) gains ``BALANCE_MIN_GAIN`` (``balance_gain``: the
    first of ``balance_threads`` decides) without more repeats of a per-tile packing (M is not cut
    further when B is packed per tile, N when A is packed or its windows staged per tile) and, for a
    gain at a later thread count only, without losing whole tiles (constant trip counts: yolo_block's
    1x1 convolutions were 4-9% slower on one thread with a remainder tile). Of those: the fewest
    repeats of a per-tile packing, the best efficiency up to ``BALANCE_ENOUGH``, the fewest tiles
    (a 64 x 80 MatMul in 10 tiles of 16 columns left its HardSwish epilogue unvectorised), whole
    tiles. Loops that stay on one thread (``parallel_min_work``) keep the cache blocking. Results do
    not change: each output's sum runs over the same K blocks in the same order whatever the tiles."""
    threads = tuple(t for t in o.balance_threads if t > 1)
    if not threads or 2 * p.nb * p.M * p.N * p.K < o.parallel_min_work:
        return MC, NC
    M, N = p.M, p.N
    mt0, nt0 = -(-M // MC), -(-N // NC)
    need = -(-o.gemm_min_tiles // p.nb)  # tiles per batch for gemm_min_tiles in all
    b_per_tile = p.b.static is None and (p.b.cols is None or p.b.cols.stages_per_tile())
    a_per_tile = p.a.static is None and (p.a.rows is None or type(p.a.rows).per_tile is not RowAccess.per_tile)

    def sides(size: int, block: int, unit: int, cuts0: int) -> list[int]:
        out = {block}
        for cuts in range(cuts0, cuts0 + max(BALANCE_EXTRA_CUTS, need - cuts0) + 1):
            c = _round_up(-(-size // cuts), unit)
            if unit <= c <= block:
                out.add(c)
        panels = -(-size // unit)
        for t, e in zip(threads, eff0, strict=True):
            if not o.balance_even_panels or e >= BALANCE_ENOUGH:
                continue
            # the largest tile within the blocking's that gives each of t threads the same number of panels
            c = max((panels // (t * j) * unit for j in range(1, panels // t + 1)
                     if panels % (t * j) == 0 and panels // (t * j) * unit <= block), default=0)
            if c:
                out.add(c)
        return sorted(out, reverse=True)

    def facts(mc: int, nc: int) -> tuple[bool, int, tuple[float, ...], int, int]:
        costs = tile_costs(M, N, mc, nc, MR, NR) * p.nb
        repeated = (-(-M // mc) if b_per_tile else 1) * (-(-N // nc) if a_per_tile else 1)
        whole = (M % mc == 0 or mc >= M) + (N % nc == 0 or nc >= N)
        return len(costs) >= o.gemm_min_tiles, repeated, balance_efficiency(costs, threads), whole, len(costs)

    reach0, repeated0, eff0, whole0, _ = facts(MC, NC)
    taken = []
    for mc in sides(M, MC, MR, mt0):
        for nc in sides(N, NC, NR, nt0):
            reach, repeated, eff, whole, tiles = facts(mc, nc)
            first_gains = eff[0] - eff0[0] >= BALANCE_MIN_GAIN
            if (reach and not reach0) or (reach == reach0 and repeated <= repeated0 and balance_gain(eff, eff0)
                                          and (first_gains or whole >= whole0)):
                enough = tuple(round(min(e, BALANCE_ENOUGH) / BALANCE_MIN_GAIN) for e in eff)
                taken.append(((reach, -repeated, enough, -tiles, whole), (mc, nc)))
    return max(taken)[1] if taken else (MC, NC)


def tile_costs(M: int, N: int, MC: int, NC: int, MR: int, NR: int) -> list[float]:
    """Relative cost of each tile in loop order (row tiles outer): the micro-kernel calls it makes,
    its rows and columns rounded up to whole MR x NR blocks."""
    rows = [_round_up(min(MC, M - m0), MR) for m0 in range(0, M, MC)]
    cols = [_round_up(min(NC, N - n0), NR) for n0 in range(0, N, NC)]
    return [float(r * c) for r in rows for c in cols]


def emit_epilogue(kc, ev, stage: Stage, p: GemmProblem, acc: str, b: str, m: str, n: str) -> None:
    """Finish one output element and store every group output the stage owns."""
    idx = p.out_index(b, m, n)
    val = p.finish(ev, acc, b, m, n) if p.finish is not None else \
        acc if p.finish_bias is None else f"{acc} + {p.finish_bias(ev, b, m, n)}"
    ct = c_type(p.dtype)
    name = kc.tmp("y")
    kc.w.line(f"const {ct} {name} = {val};")
    finish_element(kc, ev, stage, p.out, idx, name)


def register_epilogue(kc, ev, stage: Stage, p: GemmProblem, MR: int,
                      NR: int) -> tuple[str, Value, Value | None, int, Value | None] | None:
    """``(epilogue, stored value, column bias or None, output row stride, residual or None)`` where the micro-kernel
    finishes and stores the output itself (``microkernel.EPILOGUES``: row bias, Relu; a MatMul's column bias: an Add
    of a constant along N first, ``_column_bias``; then a residual's Add, ``_residual``, with
    ``CodegenOptions.gemm_residual_epilogue``) instead of the tile epilogue: one output, the
    anchor's or its last op's, stored with unit stride along n, or along m by the transposed store
    (``GemmProblem.store_ld``), no merged siblings, array accumulators; a part block (past M or N)
    goes through the C tile and the epilogue. The tile then never goes through the C tile after its
    last K block, nor through the epilogue's loads: mobilenet_v1's pw1 (K = 32) spent a fifth of its
    time there (0.86x with it, 1 thread, per-kernel CPU time). Transposed (a convolution over its
    windows, positions x channels: mobilenet_v1's pw6-pw13 at 14x14 and 7x7), the tile's copy, its
    transposition and the epilogue loop go (``CodegenOptions.gemm_register_epilogue``). The operations
    are the epilogue's, in its order: same bits."""
    o = kc.program.options
    if (not o.gemm_register_epilogue or (p.store_ld is None and p.bias_store_ld is None) or p.segments
            or o.gemm_scalar_accumulators
            or (p.out_contiguous == "m" and (not o.gemm_transposed_store or o.vector_isa == "neon"))):
        return None
    ops = list(stage.epilogue)
    col_bias = _column_bias(ev, p, ops[0]) if ops and p.row_bias is None and p.out_contiguous == "n" \
        and o.vector_isa != "neon" and o.gemm_column_bias_epilogue else None
    if col_bias is not None:  # acc + bias[n], in registers before the activation
        ops = ops[1:]
    ld = p.store_ld if p.store_ld is not None else p.bias_store_ld if col_bias is not None else None
    if ld is None:
        return None
    value = p.out if col_bias is None else stage.epilogue[0].outputs[0]  # the accumulator, with its bias
    residual = _residual(ev, ops[0], value) if ops and o.gemm_residual_epilogue and o.vector_isa != "neon" \
        and p.out_contiguous == "n" else None
    if residual is not None:  # acc (+ bias) + res, in registers before the activation
        value, ops = ops[0].outputs[0], ops[1:]
    if len(ops) > 1 or (ops and ops[0].input(0) is not value):
        return None
    code: str | None = ""
    if ops:
        in_registers = _activations_in_registers(o)
        code = "r" if ops[0].op_type == "Relu" else _activation_code(ops[0], o) if in_registers else None
        if code is not None and code in EXP_ACTIVATIONS and not _exp_activations_in_registers(o):
            code = None
    if code is None:
        return None
    final = ops[0].outputs[0] if ops else value
    if [id(v) for v in stage.outputs] != [id(final)] or final.dtype != np.float32 or id(final) in ev.static:
        return None
    if residual is not None:
        if any(a.value in (final.name, residual.name) and a.kind == "concat" for a in kc.program.memory.aliases):
            return None  # rows inside a wider Concat's: not laid out as the output
        code = "a" + code
    if p.row_bias is not None:
        arr = ev.static.get(id(p.row_bias))
        if arr is None or arr.ndim != 1:
            return None
        code = "b" + code
    if col_bias is not None:
        if any(a.value == final.name and a.kind == "concat" for a in kc.program.memory.aliases):
            return None  # rows inside a wider Concat's: not ``ld`` floats apart
        code = "c" + code
    return code, final, col_bias, ld, residual


def _residual(ev, add, value: Value) -> Value | None:
    """The residual of ``add`` = ``value + res`` (either order) where ``res`` is a float32 tensor of the output's
    shape (no broadcast) in memory (a group input or a value stored earlier, not a constant: ``in_memory``); else
    None. Its element ``(b, m, n)`` then lies at the output's offset. The output may be stored over it (the memory
    plan's in-place pair, ``memory/inplace.py``: only where the product does not read it): every element is read
    before the micro-kernel stores over it."""
    if add.op_type != "Add" or len(add.inputs) != 2 or value not in add.inputs:
        return None
    others = [v for v in add.inputs if v is not value]
    if len(others) != 1:
        return None
    res = others[0]
    if res.dtype != np.float32 or tuple(res.shape) != tuple(value.shape) or tuple(add.outputs[0].shape) != \
            tuple(value.shape) or not in_memory(ev, res):
        return None
    return res


def _column_bias(ev, p: GemmProblem, add) -> Value | None:
    """The bias of ``add`` = ``p.out + bias`` (either order) where ``bias`` is a float32 constant that varies
    along N only (shape ``(N,)``, or with leading 1s), so that ``bias[n]`` is its element ``n``; else None."""
    if add.op_type != "Add" or len(add.inputs) != 2 or add.outputs[0].shape != p.out.shape:
        return None
    others = [v for v in add.inputs if v is not p.out]
    if len(others) != 1 or p.out not in add.inputs:
        return None
    arr = ev.static.get(id(others[0]))
    if arr is None or arr.dtype != np.float32 or arr.size != p.N or arr.shape[-1:] != (p.N,) or p.segments:
        return None
    if len(p.out.shape) < 2 or p.out.shape[-1] != p.N:
        return None
    return others[0]


def _activations_in_registers(o) -> bool:
    """Whether the storing micro-kernel may apply an activation of ``microkernel.ACTIVATIONS``: on the builds
    with the vector epilogues (x86, ``vector_epilogue``), whose bits it keeps."""
    return o.vector_epilogue and bool(simdchain.isas_for(o))


# The activations of ``microkernel.ACTIVATIONS`` built on an exp (Sigmoid, SiLU in either form, Tanh, tanh Gelu):
# the ones ``CodegenOptions.gemm_register_activations`` "cheap" leaves to the C tile and the vector epilogue.
EXP_ACTIVATIONS = frozenset("suwtg")


def _exp_activations_in_registers(o) -> bool:
    """Whether the storing micro-kernel may apply an exp-based activation (``gemm_register_activations``): "auto"
    where the vector ISA has 32 registers (AVX-512), not with AVX2's 16."""
    mode = o.gemm_register_activations
    return mode == "all" or (mode == "auto" and o.vector_isa == "avx512")


def _activation_code(node, o) -> str | None:
    """The letter of ``microkernel.ACTIVATIONS`` that applies ``node`` (None: none does); a Silu's by
    ``o.silu_direct`` (the form every other path of the build computes, so the bits agree)."""
    if node.op_type == "Silu":
        return "u" if o.silu_direct else "w"
    approximate = get_spec(node.op_type, node).attrs_of(node).get("approximate") if node.op_type == "Gelu" else None
    return next((k for k, (op, a, _) in ACTIVATIONS.items() if (op, a) == (node.op_type, approximate)), None)


def _require_activation(kc, code: str) -> None:
    """Define the helpers the storing micro-kernel's activation calls (scalar, and vector for each ISA) before it."""
    if code[-1:] in ACTIVATIONS:
        helper = ACTIVATIONS[code[-1]][2]
        isas = simdchain.isas_for(kc.program.options)
        if helper == GELU_HELPER:
            require_gelu(kc.program)
            for isa in isas:
                require_vector_gelu(kc.program, isa)
            return
        vecmath.require(kc.program, helper)
        for isa in isas:
            vecmath.require_vector(kc.program, helper, isa)


def emit_gemm(kc, ev, stage: Stage, p: GemmProblem) -> None:
    if p.dtype != np.float32 or 0 in (p.M, p.N, p.K):  # empty problems have nothing to tile
        return emit_naive(kc, ev, stage, p)
    MR, NR = register_block(p, kc.program.options)
    direct = register_epilogue(kc, ev, stage, p, MR, NR)
    if direct is not None and direct[0][-1:] in ACTIVATIONS:
        # the micro-kernel applies the activation in registers (its vector form's bits): the part blocks' C loops
        # take the same scalar forms (``Evaluator.twin``: Gelu's table polynomial), so that every element has them
        with ev.twin():
            return _emit_gemm(kc, ev, stage, p)
    return _emit_gemm(kc, ev, stage, p)


def pack_in_kernel(p: GemmProblem, o, packed_b: bool, packer: bool, gather: str, body: int, a_outer: bool) -> bool:
    """Whether a tile's B panels are packed by the micro-kernel calls of its first row block instead of a copy
    before them (``CodegenOptions.gemm_pack_in_kernel``): that call reads its panel's rows in place (``strided``,
    ``Operand.row_step`` apart) and stores them to the packed panel as it goes (``microkernel``'s ``b_copy``);
    the tile's other calls on the panel read the packed copy, as before. The copy's loads and stores then go
    with the call's multiply-adds instead of a pass of their own. Only where: B is packed per tile
    (``packed_b``) from rows in memory a constant step apart (a 1x1 convolution's input), without a packer of its
    own (``packer``) or A's windows gathered (``gather``); every row tile has rows in whole MR-row blocks (``body``:
    the last tile's; where it holds tail panels only, no call of a whole block would pack its panels); B's panel
    outermost (not ``a_outer``: there the first row block's calls would read every panel of the tile in place, one
    after the other, with nothing between them to wait behind: mobilenet_v1's pw1 1.36x the time); whole
    NR-column panels only (a part last panel keeps the copy); an x86 host build with intrinsics. The same
    values in the same packed panel: the same sums."""
    return bool(o.gemm_pack_in_kernel and packed_b and not packer and not gather and body > 0 and not a_outer
                and p.b.row_ptr is not None and p.b.row_step is not None
                and o.platform == "host" and o.simd == "auto" and o.vector_isa in ("avx2", "avx512"))


def _emit_gemm(kc, ev, stage: Stage, p: GemmProblem) -> None:
    o = kc.program.options
    MR, NR = register_block(p, o)
    M, N, K = p.M, p.N, p.K
    blk = choose_blocking(p, o)
    MC, NC, KC = blk.MC, blk.NC, blk.KC
    MT, NT = -(-M // MC), -(-N // NC)
    fl = 4  # bytes per float
    a_static, b_static = p.a.static is not None, p.b.static is not None
    rows = p.a.rows if not a_static else None
    cols = p.b.cols if not b_static else None
    a_mode = "packed" if rows is None else ("rows" if rows.koff is None else "koff")
    # A's windows gathered into k-major panels before the micro-kernel reads them (``gemm_pack_windows``)
    gather = ""
    if rows is not None and rows.koff is not None and rows.scattered and o.platform == "host" \
            and o.gemm_pack_windows != "off" \
            and -(-min(NC, N) // NR) >= WINDOWS_PACK_MIN_PANELS:
        gather = o.gemm_pack_windows if o.gemm_pack_windows != "auto" else \
            "panel" if KC * NC * fl <= WINDOWS_PACK_PANEL_BYTES else "tile"
        a_mode = "packed"
    b_mode = "packed" if cols is None else "strided" if cols.koff is None else "koff"
    direct = register_epilogue(kc, ev, stage, p, MR, NR)
    if direct is not None and stage.anchor_node is not None:
        op, approximate, _ = ACTIVATIONS.get(direct[0][-1:], ("Relu" if "r" in direct[0] else "", None, None))
        act = f"{op} ({'erf' if approximate == 'none' else approximate})" if approximate else op
        terms = (["bias"] if "b" in direct[0] or "c" in direct[0] else []) + \
            (["residual"] if "a" in direct[0] else []) + ([act] if act else [])
        what = ", ".join(terms[:-1]) + " and " + terms[-1] if len(terms) > 1 else "".join(terms)
        what = f"{what} applied and stored" if act else f"{what} added and stored" if what else "stored"
        kc.note(lambda name: f"GEMM '{name}': output {what} by the micro-kernel", stage.anchor_node)
    if direct is not None:
        _require_activation(kc, direct[0])
    transposed = p.out_contiguous == "m"
    # M's last rows in narrower panels of their own (``tail_panels``; a row step holds for them: M is a multiple of
    # MR wherever a window's step needs MR-row blocks, ``RowAccess.row_step``).
    tails = tail_panels(M, MR, NR, MC, o)
    # The AdvSIMD bodies read a window per row (no ``a_step``) and store along n only (no transposed store).
    a_step = rows.row_step(MR) if rows is not None and rows.koff is not None and o.gemm_window_step \
        and o.vector_isa != "neon" and not gather else 0
    # A row step reads all MR rows of a block from its first: where the last block is part one (M mod MR rows, no
    # tail panels) its rows past M would be read past the windows, at the end of the input past the tensor itself
    # (AddressSanitizer: a 1x1 convolution of a graph input, 30 positions in blocks of 12). That block alone takes
    # its row pointers one by one, those past M repeating the last (``row_ptrs``), the whole ones keep the step.
    part_unstepped = bool(a_step) and M % MR != 0 and not tails
    step = [a_step]  # the row step of the blocks being emitted (0 in that part block)
    b_split = cols.split if cols is not None else 0
    body = M - sum(tails)

    made: dict[tuple[int, int, bool], tuple[str, str]] = {}
    # A's windows outermost (see the loops below), and the strips' condition short of their epilogue's form:
    # with B's panel outermost the calls may prefetch the next panel (``next_panel``).
    windows_outer = gather == "panel" or not gather and KC * NC * fl <= WINDOWS_ROWS_OUTER_BYTES
    may_strip = direct is None and not transposed and KC >= K and not p.segments and o.gemm_strip_epilogue \
        and K * NC * fl <= ROWS_OUTER_STORE_BYTES
    step_next, share = next_panel(p, o, MR, NR, MC, KC, body, b_static,
                                  (rows is not None and rows.koff is not None and windows_outer) or may_strip)

    if step_next and stage.anchor_node is not None:
        calls = min(MC, body) // MR
        kc.note(lambda name: f"GEMM '{name}': weights of {K * N * fl >> 10} KiB streamed: each of a tile's {calls} "
                f"calls on a panel prefetches {share} lines of the next panel into L2, one every {step_next} k steps",
                stage.anchor_node)

    def kernels(mr: int, copy: bool = False) -> tuple[str, str]:
        """(the micro-kernel, its storing variant) of an ``mr``-row panel ("" where none is called); ``copy``: the
        variants that read B in place and pack it as they go (``pack_in_kernel``)."""
        key = (mr, step[0], copy)
        if key in made:
            return made[key]
        bm = "strided" if copy else b_mode
        store = _microkernel(kc, mr, NR, a_mode, bm, direct[0], transposed, step[0], b_split, step_next, copy) \
            if direct is not None else ""
        # The storing micro-kernel alone where every block is whole and K one block.
        plain = _microkernel(kc, mr, NR, a_mode, bm, a_step=step[0], b_split=b_split, b_next=step_next,
                             b_copy=copy) \
            if direct is None or KC < K or (M % MR and not tails) or N % NR else ""
        made[key] = plain, store
        return plain, store
    if body:
        kernels(MR)  # the whole panels' (registered first, as before tail panels)
    if stage.anchor_node is not None:
        bodies = microkernel_bodies(MR, NR, o.simd, o.vector_isa == "avx512", o.vector_isa == "neon")
        kc.note(lambda name: f"GEMM '{name}': {MR}x{NR} micro-kernel, {bodies}", stage.anchor_node)
        if tails:
            last = " + ".join(f"{t}x{NR}" for t in tails) + (" panels" if len(tails) > 1 else " panel")
            kc.note(lambda name: f"GEMM '{name}': the last {sum(tails)} of {M} rows in {last}", stage.anchor_node)
        if gather:
            how = "one panel at a time" if gather == "panel" else "per tile"
            kc.note(lambda name: f"GEMM '{name}': windows gathered into k-major panels, {how}", stage.anchor_node)
    w = kc.w
    off_c = kc.scratch(MC * NC * fl)
    ldt = transposed_ld(MC)
    off_t = kc.scratch(ldt * TRANSPOSE_COLUMNS * fl) if transposed and direct is None else None
    off_a = kc.scratch(MC * KC * fl) if not a_static and rows is None else None
    off_b = kc.scratch(KC * NC * fl) if not b_static and cols is None else None
    off_g = kc.scratch((MR if gather == "panel" else MC) * KC * fl) if gather else None
    pa = pb = koff = None
    if p.a.static is not None:
        pa = kc.const_array(("gemm_a", p.name, MR, tails), pack_a_panels(p.a.static, MR, tails), p.name + "_A",
                            np.float32)
    if p.b.static is not None:
        pb = kc.const_array(("gemm_b", p.name, NR), pack_b_panels(p.b.static, NR), p.name + "_B", np.float32)
    if rows is not None:
        rows.prepare(kc, MC)
        if rows.koff is not None:  # padded: the micro-kernel reads it gemm_prefetch steps ahead
            table = np.concatenate([rows.koff, np.repeat(rows.koff[-1:], o.gemm_prefetch)]).astype(np.int32)
            koff = kc.const_array(("gemm_koff", p.name), table, p.name + "_koff", np.int32)
    bkoff = None
    if cols is not None:
        cols.prepare(kc, NC)
        if cols.koff is not None:  # read gemm_prefetch steps ahead, as A's table
            table = np.concatenate([cols.koff, np.repeat(cols.koff[-1:], o.gemm_prefetch)]).astype(np.int32)
            bkoff = kc.const_array(("gemm_bkoff", p.name), table, p.name + "_bkoff", np.int32)
    extra = p.pack_b.prepare(kc, NC) if p.pack_b is not None and off_b is not None else None

    split = weights_split(p, o, NR, MT, NT, direct is not None, pb is not None)
    if split and stage.anchor_node is not None:
        kc.note(lambda name: f"GEMM '{name}': on more than one thread its {N} columns in {split} parts of "
                f"{N // split}, one per thread (each streams its part of the weights)", stage.anchor_node)
    tiles = p.nb * MT * NT
    t = kc.tmp("tile")
    # The tiles of one row block (b, mt) are consecutive (nt fastest): a thread that staged A's rows for one
    # skips the copy for the next (``CodegenOptions.gemm_reuse_band``); each thread's key starts at -1.
    def thread_key() -> int:
        """A long in each thread's scratch, -1 before the loop: the row block whose copy it holds (none yet)."""
        off = kc.scratch(8)
        th = kc.tmp("th")
        w.line(f"for (int {th} = 0; {th} < nt; ++{th}) "
               f"*(long*)(scratch + (size_t){th} * OPFUSE_SCRATCH_STRIDE + {off}) = -1;")
        return off
    reuse = NT > 1 and o.platform == "host"
    off_key = thread_key() if reuse and rows is not None and rows.stages_per_tile() and o.gemm_reuse_band else None
    # The same for A packed per tile in one K block (``CodegenOptions.gemm_reuse_packed_a``): the next tile of the
    # row block this thread packed last finds its panels in place.
    off_akey = thread_key() if reuse and off_a is not None and KC >= K and o.gemm_reuse_packed_a else None
    if split:
        # On more than one thread, N in ``split`` parts, each thread's tiles in one part (static, N outermost):
        # each core streams its part of the weights only (``weights_split``); on one, the tiles above. The
        # schedule is static: a loop whose bound is an expression is never made dynamic (``_schedules``).
        part = tile_costs(M, N // split, MC, N // split, MR, NR)  # one part's tiles: the loop runs part by part
        kc.parallel_for(2 * M * N * K, costs=part * split)
        head = f"for (long {t} = 0; {t} < (nt > 1 ? {MT * split} : {MT}); ++{t})"
    else:
        kc.parallel_for(2 * p.nb * M * N * K, costs=tile_costs(M, N, MC, NC, MR, NR) * p.nb,
                        contiguous=MT == 1 or NT == 1)
        head = f"for (long {t} = 0; {t} < {tiles}; ++{t})"
    with w.block(head):
        b, mt, nt_ = kc.tmp("b"), kc.tmp("mt"), kc.tmp("nt")
        w.line(f"const long {b} = {t} / {MT * NT};" if not split else f"const long {b} = 0;")
        w.line(f"(void){b};")
        m0, n0, mc, nc = kc.tmp("m0"), kc.tmp("n0"), kc.tmp("mc"), kc.tmp("nc")
        # the split's parts outermost (``weights_split``), else the column tiles innermost
        w.line(f"const long {mt} = {t} % {MT};" if split else f"const long {mt} = ({t} / {NT}) % {MT};")
        w.line(f"const long {nt_} = {t} / {MT};" if split else f"const long {nt_} = {t} % {NT};")
        w.line(f"const long {m0} = {mt} * {MC};")
        row_block = f"{b} * {MT} + {mt}"  # the tile's row block: what the reuse keys hold
        w.line(f"const long {n0} = {nt_} * {N // split if split else NC};")
        # Constant trip counts where every tile is whole: gcc then vectorises the epilogue without
        # a run-time remainder (14% of a 1x1 convolution's time went to that dispatch).
        w.line(f"const long {mc} = {M if MT == 1 else MC if M % MC == 0 else _min_expr(f'{M} - {m0}', MC)};")
        if split:
            w.line(f"const long {nc} = nt > 1 ? {N // split} : {N};")
        else:
            w.line(f"const long {nc} = {N if NT == 1 else NC if N % NC == 0 else _min_expr(f'{N} - {n0}', NC)};")
        ctile = kc.tmp("ctile")
        w.line(f"float* restrict {ctile} = {kc.scratch_ptr('float', off_c)};")
        ap = bp = None
        if off_a is not None:
            ap = kc.tmp("apack")
            w.line(f"float* restrict {ap} = {kc.scratch_ptr('float', off_a)};")
        if off_b is not None:
            bp = kc.tmp("bpack")
            w.line(f"float* restrict {bp} = {kc.scratch_ptr('float', off_b)};")
        gp = None
        if off_g is not None:
            gp = kc.tmp("gather")
            w.line(f"float* restrict {gp} = {kc.scratch_ptr('float', off_g)};")
        if rows is not None:
            rows.reuse = (f"*{kc.scratch_ptr('long', off_key)}", row_block) if off_key is not None else None
            rows.per_tile(kc, ev, b, m0, mc)
        if cols is not None:
            cols.per_tile(kc, ev, b, n0, nc)
        if extra is not None:
            extra.per_tile(kc, n0, nc)
        pc, kb = kc.tmp("pc"), kc.tmp("kc")
        ahead = _next_pack(kc, o, p, bp, extra, t, tiles, MT, NT, MC, NC, KC, MR, NR)
        # One K block and a vector epilogue: each MR-row strip of the C tile is finished right after its
        # micro-kernel calls, while it is in L1, not the whole tile after them (``gemm_strip_epilogue``). A's
        # panels are then the outer loop, so B's K block is read once per panel: only where it stays in L2
        # (``ROWS_OUTER_STORE_BYTES``, as the storing micro-kernel's rows-outer order).
        strips = direct is None and not transposed and KC >= K and not p.segments and o.gemm_strip_epilogue \
            and K * NC * fl <= ROWS_OUTER_STORE_BYTES \
            and isinstance(_vector_epilogue(kc, ev, Segment("n", 0, N, p, stage), b, False), VectorEpilogue)
        # B's micro-panel outermost (it stays in L1 while the A panels stream past), unless
        # A is read through windows and B's K block stays in L2: then A's rows stay in L1
        # and B's panels stream from L2 (sequential, where the windows are not): resnet18
        # 3.5% faster. A wide B (1024 channels) would be streamed from memory per A panel.
        # So too where the micro-kernel stores the output along n itself and B's packed K block stays in
        # L2 (``CodegenOptions.gemm_rows_outer_store``): each A panel's MR output rows are then written
        # as MR runs of the tile's NC columns, one after the other, instead of MR x NR pieces hopping
        # over all the tile's rows between B panels (write-allocates the prefetchers can follow).
        a_outer = (koff is not None and windows_outer) or \
            (direct is not None and not transposed and o.gemm_rows_outer_store and bp is not None
             and KC * NC * fl <= ROWS_OUTER_STORE_BYTES and p.nb * M * N * fl >= ROWS_OUTER_STORE_MIN_OUTPUT) \
            or strips
        assert not (step_next and a_outer), "the next panel is prefetched where B's panel is outermost"
        # (the last row tile has the fewest rows in whole blocks: with tail panels, maybe none)
        in_kernel = pack_in_kernel(p, o, bp is not None, extra is not None, gather, body - (MT - 1) * MC, a_outer)
        if in_kernel and stage.anchor_node is not None:
            kc.note(lambda name: f"GEMM '{name}': B's panels packed by the first row block's micro-kernel calls "
                    f"(read in place, stored as they are read)", stage.anchor_node)
        with w.block(f"for (long {pc} = 0; {pc} < {K}; {pc} += {KC})"):
            w.line(f"const long {kb} = {_min_expr(f'{K} - {pc}', KC)};")
            if ap is not None:
                with contextlib.ExitStack() as packing:
                    if off_akey is not None:  # skipped where this thread's panels hold the row block already
                        key = f"*{kc.scratch_ptr('long', off_akey)}"
                        packing.enter_context(w.block(f"if ({key} != {row_block})"))
                        w.line(f"{key} = {row_block};")
                    if p.pack_a is not None:
                        p.pack_a.pack(kc, ap, b, m0, mc, pc, kb, MR, tails)
                    else:
                        _pack_a(kc, ev, p, ap, b, m0, mc, pc, kb, MR, tails)
            if bp is not None:
                if extra is not None:
                    extra.pack(kc, ev, p, bp, b, n0, nc, pc, kb, NR)
                elif not in_kernel or N % NR:  # (the calls pack the whole panels: a part one is copied here)
                    _pack_b(kc, ev, p, bp, b, n0, nc, pc, kb, NR, whole=not in_kernel)
            jr, ir = kc.tmp("jr"), kc.tmp("ir")
            if pb is not None:
                np_ = -(-N // NR)
                b_ptr = f"{pb} + (({p.b.batch_expr(b)} * {np_} + ({n0} + {jr}) / {NR}) * {K} + {pc}) * {NR}"
                ldb = str(NR)
            elif cols is not None:
                b_ptr = cols.ptr(b, pc, f"{n0} + {jr}")
                ldb = cols.split_ldb(b, f"{n0} + {jr}") if cols.split else str(cols.ldb)
            else:
                b_ptr, ldb = f"{bp} + {jr} * {kb}", str(NR)

            def a_args(ir: str, mr: int) -> tuple[str, str, str]:
                """(A panel, row pointers, offset table) of the ``mr``-row micro-kernel call at ``ir``."""
                if pa is not None:
                    if tails:  # panels of different widths: the panel at row m is m * K floats in
                        return f"{pa} + ({p.a.batch_expr(b)} * {M} + {m0} + {ir}) * {K} + {pc} * {mr}", "0", "0"
                    mp = -(-M // MR)
                    return f"{pa} + (({p.a.batch_expr(b)} * {mp} + ({m0} + {ir}) / {MR}) * {K} + {pc}) * {MR}", "0", "0"
                if ap is not None:
                    return f"{ap} + {ir} * {kb}", "0", "0"
                if gather == "panel":
                    assert gp is not None
                    gather_panel(ir, mr, gp)
                    return gp, "0", "0"
                if gather == "tile":
                    return f"{gp} + {ir} * {kb}", "0", "0"
                ar = kc.tmp("ar")
                ptrs = row_ptrs(ir, 1 if step[0] else mr)
                w.line(f"const float* {ar}[{mr}] = {{{', '.join(ptrs)}}};")
                return "0", ar, f"{koff} + {pc}" if koff is not None else "0"

            def row_ptrs(ir: str, count: int) -> list[str]:
                """A's first ``count`` row pointers of the block at ``ir`` (rows past the tile repeat its last row:
                read, then dropped)."""
                assert rows is not None
                shift = f" + {pc}" if koff is None else ""
                ptrs = []
                for i in range(count):
                    mi = f"{m0} + {ir} + {i}" if tails and i else \
                        f"{m0} + {_min_expr(f'{ir} + {i}', f'{mc} - 1')}" if i else f"{m0} + {ir}"
                    ptrs.append(f"{rows.row(b, mi)}{shift}")
                return ptrs

            def gather_panel(ir: str, mr: int, dst: str) -> None:
                """The ``mr`` windows at ``ir``, K block ``pc``, into the k-major panel at ``dst``
                (``gemm_pack_windows``)."""
                g = [kc.tmp("g") for _ in range(mr)]
                for name, ptr in zip(g, row_ptrs(ir, mr), strict=True):
                    w.line(f"const float* restrict {name} = {ptr};")
                k, off = kc.tmp("k"), kc.tmp("o")
                with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
                    w.line(f"const long {off} = {koff}[{pc} + {k}];")
                    for i, name in enumerate(g):
                        w.line(f"{dst}[{k} * {mr} + {i}] = {name}[{off}];")

            def block(ir: str, mr: int, args: tuple[str, str, str], whole: bool = True) -> None:
                """The micro-kernel call(s) of the ``mr``-row block at ``(ir, jr)`` (``whole``: one of the tile's
                MR-row blocks, not a tail panel); where the calls pack B (``pack_in_kernel``), the first block's
                call on a whole panel is the copying variant's."""
                if not (in_kernel and whole):
                    emit_calls(ir, mr, args, whole)
                    return
                first = f"{ir} == 0" + (f" && {n0} + {jr} + {NR} <= {N}" if N % NR else "")
                with w.block(f"if ({first})"):
                    emit_calls(ir, mr, args, whole, copy=True)
                with w.block("else"):
                    emit_calls(ir, mr, args, whole)

            def emit_calls(ir: str, mr: int, args: tuple[str, str, str], whole: bool, copy: bool = False) -> None:
                """``block``'s calls; ``copy``: B read in place and stored to its packed panel by the call."""
                plain, store = kernels(mr, copy)
                a_ptr, ar, kp = args
                if bkoff is not None:  # A is packed: the offset table is B's
                    kp = f"{bkoff} + {pc}"
                src, ld = b_ptr, ldb
                if copy:  # B's rows in place (``pack_in_kernel`` holds: a row pointer and a step)
                    assert p.b.row_ptr is not None
                    src, ld = p.b.row_ptr(b, pc, f"{n0} + {jr}"), str(p.b.row_step)
                cargs = f"{kb}, {a_ptr}, {ar}, {kp}, {src}, {ld}, {ctile} + {ir} * {NC} + {jr}, {NC}, {pc} > 0"
                if copy:
                    cargs += f", {b_ptr}"
                if step_next:
                    cargs += next_args(ir) if whole else f", {b_ptr}, 0"
                if direct is None:
                    w.line(f"{plain}({cargs});")
                    if strips and o.gemm_strip_prefetch:
                        _prefetch_strip(kc, stage, p, b, m0, n0, ir, jr, mc, nc, mr, NR)
                else:
                    first = f"{n0} + {jr}" if transposed else f"{m0} + {ir}"
                    bias = f"{kc.static_ptr(p.row_bias)} + {p.bias_index(b, first)}" \
                        if p.row_bias is not None else "0"
                    if direct[2] is not None:  # the block's first column's bias
                        bias = f"{kc.static_ptr(direct[2])} + {n0} + {jr}"
                    out = f"{kc.ptr(direct[1], write=True)} + " \
                          f"{p.out_index(b, f'{m0} + {ir}', f'{n0} + {jr}').offset()}"
                    res = "" if direct[4] is None else \
                        f", {kc.ptr(direct[4])} + {p.out_index(b, f'{m0} + {ir}', f'{n0} + {jr}').offset()}"
                    call = f"{store}({cargs}, {bias}, {out}, {direct[3]}{res});"
                    last = [f"{pc} + {kb} >= {K}"] if KC < K else []
                    inside = ([f"{m0} + {ir} + {MR} <= {M}"] if M % MR and not tails else []) + \
                        ([f"{n0} + {jr} + {NR} <= {N}"] if N % NR else [])
                    if not last + inside:
                        w.line(call)
                    else:
                        with w.block(f"if ({' && '.join(last + inside)})"):
                            w.line(call)
                        with w.block("else"):
                            w.line(f"{plain}({cargs});")
                            if inside:  # a part block: through the C tile and the epilogue
                                cond = " && ".join(last + [f"!({' && '.join(inside)})"])
                                with w.block(f"if ({cond})"):
                                    _emit_tile_epilogue(kc, ev, stage, p, f"({ctile} + {ir} * {NC} + {jr})", NC, b,
                                                        f"({m0} + {ir})", f"({n0} + {jr})",
                                                        str(mr) if tails else _min_expr(f"{M} - {m0} - {ir}", MR),
                                                        _min_expr(f"{N} - {n0} - {jr}", NR))
                if ahead is not None:
                    ahead(ir, jr)

            def next_args(ir: str) -> str:
                """The block's share of the next panel's K block (``next_panel``): none past B's last panel; the
                shares past the block's lines (a short last K block) start at its end and take none."""
                assert pb is not None
                has, lines, at, bn, bnl = (kc.tmp(x) for x in ("hasnext", "lines", "at", "bn", "bnl"))
                w.line(f"const int {has} = {n0} + {jr} + {NR} < {N};")
                w.line(f"const long {lines} = {kb} * {NR // 16};")
                w.line(f"const long {at} = {_min_expr(f'{ir} / {MR} * {share}', lines)};")
                w.line(f"const float* {bn} = {has} ? {b_ptr} + {K * NR} + {at} * 16 : {b_ptr};")
                w.line(f"const long {bnl} = {has} ? {_min_expr(f'{lines} - {at}', share)} : 0;")
                return f", {bn}, {bnl}"

            def strip(ir: str, mr: int) -> None:
                """The strip's rows just computed, while they are in L1."""
                if strips:
                    _emit_tile_epilogue(kc, ev, stage, p, f"({ctile} + {ir} * {NC})", NC, b, f"({m0} + {ir})", n0,
                                        str(mr) if tails else _min_expr(f"{mc} - {ir}", MR), nc)

            def tail_blocks(each: Callable[[str, int], None]) -> None:
                """``each(ir, rows)`` for the tail panels, in the last row tile (``tail_panels``)."""
                if not tails:
                    return
                with w.block(f"if ({m0} + {mc} == {M})" if MT > 1 else ""):
                    for first, width in tail_rows(M, tails):
                        each(f"({first} - {m0})" if MT > 1 else str(first), width)

            over_n = f"for (long {jr} = 0; {jr} < {nc}; {jr} += {NR})"
            whole = mc if not tails else str(body) if MT == 1 else _min_expr(f"{body} - {m0}", mc)
            over_m = f"for (long {ir} = 0; {ir} < {whole}; {ir} += {MR})"
            if gather == "tile":  # the tile's K block, every panel, before the channel panels
                ig = kc.tmp("ig")
                if body:
                    with w.block(f"for (long {ig} = 0; {ig} < {whole}; {ig} += {MR})"):
                        gather_panel(ig, MR, f"({gp} + {ig} * {kb})")
                tail_blocks(lambda i, mr: gather_panel(i, mr, f"({gp} + {i} * {kb})"))
            def whole_or_part(emit: Callable[[], None]) -> None:
                """``emit`` the MR-row block at ``ir``; where the last one is part one and read with a row step
                (``part_unstepped``), that one again without the step."""
                if not part_unstepped:
                    emit()
                    return
                with w.block(f"if ({m0} + {ir} + {MR} <= {M})"):
                    emit()
                with w.block("else"):
                    step[0] = 0
                    emit()
                    step[0] = a_step
            if a_outer:
                def row_panel(i: str, mr: int) -> None:
                    args = a_args(i, mr)
                    with w.block(over_n):
                        block(i, mr, args)
                    strip(i, mr)
                if body:
                    with w.block(over_m):
                        whole_or_part(lambda: row_panel(ir, MR))
                tail_blocks(row_panel)
            else:
                with w.block(over_n):
                    if body:
                        with w.block(over_m):
                            whole_or_part(lambda: block(ir, MR, a_args(ir, MR)))
                    tail_blocks(lambda i, mr: block(i, mr, a_args(i, mr), whole=False))
        if direct is not None or strips:  # stored by the micro-kernel, or finished strip by strip
            pass
        elif transposed:  # TRANSPOSE_COLUMNS columns at a time, so the transposed copy stays in L1
            tr, text = transpose_helper(o.simd)
            kc.program.require_helper(tr, text)
            ttile, jc, cw = kc.tmp("ttile"), kc.tmp("jc"), kc.tmp("cw")
            w.line(f"float* restrict {ttile} = {kc.scratch_ptr('float', off_t)};")
            with w.block(f"for (long {jc} = 0; {jc} < {nc}; {jc} += {TRANSPOSE_COLUMNS})"):
                w.line(f"const long {cw} = {_min_expr(f'{nc} - {jc}', TRANSPOSE_COLUMNS)};")
                w.line(f"{tr}({mc}, {cw}, {ctile} + {jc}, {NC}, {ttile}, {ldt});")
                _emit_tile_epilogue(kc, ev, stage, p, ttile, ldt, b, m0, f"({n0} + {jc})", mc, cw, transposed=True)
        else:
            _emit_tile_epilogue(kc, ev, stage, p, ctile, NC, b, m0, n0, mc, nc)


def _next_pack(kc, o, p: GemmProblem, bp, extra, t: str, tiles: int, MT: int, NT: int, MC: int, NC: int, KC: int,
               MR: int, NR: int) -> Callable[[str, str], None] | None:
    """Where B is packed per tile from rows in memory (``_pack_b``'s row copies: a 1x1 convolution's input),
    in one K block: declare the tile this thread is likely to take next (``t + nt``: the next one with one
    thread, about the next with ``schedule(dynamic, 1)``) and return the emitter that, after each micro-kernel
    call of the tile, prefetches its share of that tile's B rows (``CodegenOptions.gemm_pack_prefetch``): the
    copy then reads them from the caches. A tile's rows are K runs of up to NC floats, too many streams for the
    hardware prefetchers to follow (mobilenet's pw1: 32 runs of 256 floats, 12544 floats apart). x86 builds
    only (GCC's and Clang's builtin, as ``_prefetch_strip``); a prefetch never faults, but the addresses stay
    in B."""
    if not o.gemm_pack_prefetch or bp is None or extra is not None or p.b.row_ptr is None or p.K > KC \
            or tiles < 2 or o.platform != "host" or o.simd != "auto" or o.vector_isa not in ("avx2", "avx512"):
        return None
    w, row_ptr = kc.w, p.b.row_ptr
    t2, b2, n2 = kc.tmp("next"), kc.tmp("nb"), kc.tmp("nn")
    w.line(f"const long {t2} = {t} + nt;")
    w.line(f"const long {b2} = {t2} / {MT * NT};")
    w.line(f"(void){b2};")
    w.line(f"const long {n2} = {t2} % {NT} * {NC};")
    per_row = -(-NC // 16)  # lines of a row of the tile
    lines = p.K * per_row
    calls = -(-MC // MR) * -(-NC // NR)
    share = -(-lines // calls)

    def emit(ir: str, jr: str) -> None:
        q, ln, k, c = kc.tmp("q"), kc.tmp("ln"), kc.tmp("k"), kc.tmp("c")
        with w.block(f"if ({t2} < {tiles})"):
            w.line(f"const long {q} = ({ir} / {MR} * {-(-NC // NR)} + {jr} / {NR}) * {share};")
            with w.block(f"for (long {ln} = {q}; {ln} < {q} + {share} && {ln} < {lines}; ++{ln})"):
                w.line(f"const long {k} = {ln} / {per_row}, {c} = {ln} % {per_row} * 16;")
                with w.block(f"if ({n2} + {c} < {p.N})"):
                    w.line(f"__builtin_prefetch({row_ptr(b2, k, f'{n2} + {c}')}, 0, {o.gemm_pack_prefetch_locality});")
    return emit


def _prefetch_strip(kc, stage: Stage, p: GemmProblem, b, m0, n0, ir, jr, mc, nc, MR: int, NR: int) -> None:
    """Prefetch the lines of every output the strip's epilogue will store in the block the micro-kernel just
    computed (``CodegenOptions.gemm_strip_prefetch``), for writing (GCC's and Clang's builtin; the
    strips are only made on the x86 builds): rows past the tile read its last row, columns past it its last
    column (a prefetch never faults, but the address stays in the array)."""
    for v in stage.outputs:
        for r in range(MR):
            m = f"{m0} + {_min_expr(f'{ir} + {r}', f'{mc} - 1')}" if r else f"{m0} + {ir}"
            for c in range(0, NR, 16):
                n = f"{n0} + {_min_expr(f'{jr} + {c}', f'{nc} - 1')}" if c else f"{n0} + {jr}"
                off = p.out_index(b, m, n).offset()
                kc.w.line(f"__builtin_prefetch({kc.ptr(v, write=True)} + {off}, 1, 3);")


def _emit_tile_epilogue(kc, ev, stage, p: GemmProblem, ctile, ld, b, m0, n0, mc, nc, transposed=False) -> None:
    """Finish every element of the tile; merged GEMMs route row or column ranges to their
    own output and epilogue (one loop per range, so the inner loop stays branch-free). The
    inner loop runs along the output's unit-stride axis: n, or m for a ``transposed`` tile
    (then held column-major: element (i, j) at ``ctile[j * ld + i]``), in vectors where the
    epilogue has a vector form (``_vector_epilogue``), behind ``#if`` on each ISA of
    ``simdchain.isas_for``, the scalar loops under ``#else``."""
    segments = p.segments or [Segment("n", 0, p.N, p, stage)]
    for seg in segments:
        lo_i, hi_i, lo_j, hi_j = "0", mc, "0", nc
        if seg.axis == "m" and p.segments:
            lo_i = f"({seg.start} > {m0} ? {seg.start} - {m0} : 0)"
            hi_i = f"({seg.stop} - {m0} < {mc} ? {seg.stop} - {m0} : {mc})"
        elif p.segments:
            lo_j = f"({seg.start} > {n0} ? {seg.start} - {n0} : 0)"
            hi_j = f"({seg.stop} - {n0} < {nc} ? {seg.stop} - {n0} : {nc})"
        shift_m = f" - {seg.start}" if seg.axis == "m" and seg.start else ""
        shift_n = f" - {seg.start}" if seg.axis == "n" and seg.start else ""
        # (lo, hi, the problem's coordinate of a tile offset) of the rows and of the columns
        rows = (lo_i, hi_i, lambda i, s=shift_m: f"{m0} + {i}{s}")
        cols = (lo_j, hi_j, lambda j, s=shift_n: f"{n0} + {j}{s}")
        outer, inner = (cols, rows) if transposed else (rows, cols)
        vec = _vector_epilogue(kc, ev, seg, b, transposed)
        if not isinstance(vec, VectorEpilogue):
            if vec is not None and seg.stage.anchor_node is not None:
                kc.note(lambda name, r=vec: f"GEMM '{name}': scalar epilogue loop ({r})", seg.stage.anchor_node)
            _tile_loops(kc, ev, seg, ctile, ld, b, outer, inner, transposed)
            continue
        isas = simdchain.isas_for(kc.program.options)
        vecmath.require_immintrin(kc.program)
        names = " / ".join(i.name for i in isas)
        if seg.stage.anchor_node is not None:
            kc.note(lambda name, k=names: f"GEMM '{name}': epilogue in {k} intrinsics", seg.stage.anchor_node)
        for k, isa in enumerate(isas):
            kc.w.line(f"#{'if' if k == 0 else 'elif'} {isa.guard}")
            with kc.w.block(""), ev.scope():
                _tile_loops(kc, ev, seg, ctile, ld, b, outer, inner, transposed, (vec, isa))
        kc.w.line("#else")
        _tile_loops(kc, ev, seg, ctile, ld, b, outer, inner, transposed)
        kc.w.line("#endif")


def _tile_loops(kc, ev, seg: Segment, ctile, ld, b, outer, inner, transposed: bool,
                vector: tuple[VectorEpilogue, VecIsa] | None = None) -> None:
    """A segment's epilogue over the tile: the outer loop, and inside it the inner loop element by element, or
    ``_vector_row`` (``vector``: the epilogue's vector form and the ISA)."""
    w = kc.w
    i, j = kc.tmp("i"), kc.tmp("j")
    o, t = (j, i) if transposed else (i, j)
    with w.block(f"for (long {o} = {outer[0]}; {o} < {outer[1]}; ++{o})"), ev.scope():
        v_outer = kc.tmp("n" if transposed else "m")
        w.line(f"const long {v_outer} = {outer[2](o)};")

        def element(t: str) -> None:
            """The scalar epilogue of the element at inner tile offset ``t``."""
            v_inner = kc.tmp("m" if transposed else "n")
            w.line(f"const long {v_inner} = {inner[2](t)};")
            m, n = (v_inner, v_outer) if transposed else (v_outer, v_inner)
            emit_epilogue(kc, ev, seg.stage, seg.problem, f"{ctile}[{o} * {ld} + {t}]", b, m, n)
        if vector is None:
            with w.block(f"for (long {t} = {inner[0]}; {t} < {inner[1]}; ++{t})"), ev.scope():
                element(t)
        else:
            _vector_row(kc, ev, *vector, seg.problem, b, v_outer, f"{ctile} + {o} * {ld}", t, inner, transposed,
                        element)


def _vector_epilogue(kc, ev, seg: Segment, b: str, transposed: bool) -> "VectorEpilogue | str | None":
    """The vector form of a segment's tile epilogue (``epilogue.VectorEpilogue``), or why it has none (a
    string), or None where the build has no vector ISA for it (the plain C99 build, another target, or
    ``CodegenOptions.vector_epilogue`` off): its finish is ``acc`` plus at most a bias constant along the
    inner loop (``GemmProblem.finish_bias``), float32, and the epilogue has a vector form along the inner loop."""
    o = kc.program.options
    if not o.vector_epilogue or not simdchain.isas_for(o):
        return None
    p = seg.problem
    if p.finish is not None or p.dtype != np.float32:
        return "its finish has no vector form"
    if p.finish_bias is not None and ("m" if transposed else "n") != p.out_contiguous:
        # the bias is constant along the output's unit-stride axis only: a convolution over its windows with one
        # output position (a squeeze-and-excitation 1x1 on 1x1) runs its tile along the channels, the bias's axis
        return "its bias varies along the loop"
    if transposed:
        return VectorEpilogue.plan(kc, ev, seg.stage, p.out, lambda v: p.out_index(b, v, "0"))
    return VectorEpilogue.plan(kc, ev, seg.stage, p.out, lambda v: p.out_index(b, "0", v))


def _vector_row(kc, ev, vec: VectorEpilogue, isa: VecIsa, p: GemmProblem, b: str, outer: str, row: str, t: str,
                inner, transposed: bool, element: Callable[[str], None]) -> None:
    """One row of the tile (``row``: its first C tile element, the inner loop's tile offset 0) at the outer
    coordinate ``outer``, the C variable ``t`` its inner tile offset (``VectorEpilogue.row``), plus the bias
    (``finish_bias``) at the row's first element."""
    lo, hi, coord = inner

    def index(pos: str) -> Index:
        return p.out_index(b, pos, outer) if transposed else p.out_index(b, outer, pos)
    bias = None
    if p.finish_bias is not None:
        m, n = (coord(lo), outer) if transposed else (outer, coord(lo))
        bias = p.finish_bias(ev, b, m, n)
    vec.row(isa, t, lo, hi, row, coord, index, bias, element, "im" if transposed else "jn")


def _pack_a(kc, ev, p: GemmProblem, ap, b, m0, mc, pc, kb, MR, tails: Sequence[int] = ()) -> None:
    """A's K block of the tile's rows into its panels (``APacker``)."""
    w = kc.w
    ip, r, k = kc.tmp("ip"), kc.tmp("r"), kc.tmp("k")
    whole = mc if not tails else _min_expr(f"{p.M - sum(tails)} - {m0}", mc)
    with w.block(f"for (long {ip} = 0; {ip} < {whole}; {ip} += {MR})"):
        with w.block(f"for (long {r} = 0; {r} < {MR}; ++{r})"):
            m, dst = kc.tmp("m"), kc.tmp("dst")
            w.line(f"const long {m} = {m0} + {ip} + {r};")
            w.line(f"float* restrict {dst} = {ap} + {ip} * {kb} + {r};")
            with w.block(f"if ({m} < {p.M})"):
                with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"), ev.scope():
                    w.line(f"{dst}[{k} * {MR}] = {p.a.load(ev, b, m, add(pc, k))};")
            with w.block("else"):
                w.line(f"for (long {k} = 0; {k} < {kb}; ++{k}) {dst}[{k} * {MR}] = 0.0f;")
    if not tails:
        return
    with w.block(f"if ({m0} + {mc} == {p.M})"):  # the tail panels (``tail_panels``), each its own width
        for first, width in tail_rows(p.M, tails):
            with w.block(f"for (long {r} = 0; {r} < {width}; ++{r})"):
                m, dst = kc.tmp("m"), kc.tmp("dst")
                w.line(f"const long {m} = {first} + {r};")
                w.line(f"float* restrict {dst} = {ap} + ({first} - {m0}) * {kb} + {r};")
                with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"), ev.scope():
                    w.line(f"{dst}[{k} * {width}] = {p.a.load(ev, b, m, add(pc, k))};")


def _pack_b(kc, ev, p: GemmProblem, bp, b, n0, nc, pc, kb, NR, whole: bool = True) -> None:
    """B's KC x NC slice into NR-column panels. Where every panel is whole (N a multiple of NR) the
    copy has a constant trip count, a constant-size ``memcpy`` where B's rows are in memory
    (``Operand.row_ptr``), so gcc moves it in vector registers: with the run-time count it called
    ``memmove`` for each 32-float row, 20% of a 1x1 convolution's time (mobilenet's pw1, K = 32).
    ``whole`` False (B's rows in memory, N not a multiple of NR): the part last panel only (the micro-kernel
    calls pack the whole ones, ``pack_in_kernel``)."""
    w = kc.w
    jp, k, c = kc.tmp("jp"), kc.tmp("k"), kc.tmp("c")
    assert whole or (p.N % NR and p.b.row_ptr is not None), "only a part panel is left to copy"
    if p.N % NR == 0 and p.b.row_ptr is not None:
        # Rows of B outermost: each is read as one sequential run (the tile's columns), which the
        # hardware prefetchers follow; panel-first interleaved 128-byte pieces of K rows. mobilenet_v1
        # (30 interleaved runs, per-kernel CPU time, two runs each): pw2 0.90-0.94x, pw3 0.93-0.96x,
        # pw1 0.90-1.04x in medians; minimums unchanged.
        with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
            with w.block(f"for (long {jp} = 0; {jp} < {nc}; {jp} += {NR})"):
                w.line(f"memcpy({bp} + {jp} * {kb} + {k} * {NR}, {p.b.row_ptr(b, add(pc, k), f'{n0} + {jp}')}, "
                       f"sizeof(float) * {NR});")
        return
    if p.N % NR == 0:
        with w.block(f"for (long {jp} = 0; {jp} < {nc}; {jp} += {NR})"):
            with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
                dst = kc.tmp("dst")
                w.line(f"float* restrict {dst} = {bp} + {jp} * {kb} + {k} * {NR};")
                with w.block(f"for (long {c} = 0; {c} < {NR}; ++{c})"), ev.scope():
                    n = kc.tmp("n")
                    w.line(f"const long {n} = {n0} + {jp} + {c};")
                    w.line(f"{dst}[{c}] = {p.b.load(ev, b, add(pc, k), n)};")
        return
    with w.block(f"for (long {jp} = 0; {jp} < {nc}; {jp} += {NR})"):
        cols = kc.tmp("cols")
        w.line(f"const long {cols} = {_min_expr(f'{p.N} - {n0} - {jp}', NR)};")
        if not whole:
            w.line(f"if ({cols} == {NR}) continue;")
        with w.block(f"for (long {k} = 0; {k} < {kb}; ++{k})"):
            dst = kc.tmp("dst")
            w.line(f"float* restrict {dst} = {bp} + {jp} * {kb} + {k} * {NR};")
            if p.b.row_ptr is not None and whole:  # whole panels by a constant-size memcpy
                with w.block(f"if ({cols} == {NR})"):
                    w.line(f"memcpy({dst}, {p.b.row_ptr(b, add(pc, k), f'{n0} + {jp}')}, sizeof(float) * {NR});")
                    w.line("continue;")
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


def in_memory(ev, v: Value) -> bool:
    """``v`` is read from its own contiguous storage (a group input or a value stored earlier),
    not computed inline or folded to a constant: a kernel may address it through pointers."""
    inline = v.producer is not None and id(v.producer) in ev.inline
    return id(v) not in ev.static and id(v) in ev.loadable and not inline


def _rows_in_place(kc, ev, v: Value, index: Callable[[str, str, str], Index]) -> PointerRows | None:
    """Rows of ``v`` read in place when ``v`` is in memory (``index(b, m, k)``: its element;
    k must be its unit-stride last axis)."""
    if not in_memory(ev, v):
        return None
    return PointerRows(lambda b, m: f"{kc.ptr(v)} + {index(b, m, '0').offset()}")


def _cols_in_place(kc, ev, v: Value, index: Callable[[str, str, str], Index], N: int, ldb: int) -> ColAccess | None:
    """Columns of ``v`` read in place when ``v`` is in memory and N fills whole panels."""
    if not in_memory(ev, v) or N % kc.program.options.gemm_nr:
        return None
    return ColAccess(lambda b, k, n: f"{kc.ptr(v)} + {index(b, k, n).offset()}", ldb)


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

        def a_index(b, m, k):
            dims = delinearize(m, rows) + [k]
            return Index(A.shape, tuple(dims), ((0, len(rows), m),) if len(rows) > 1 else ())
    else:
        nb, Mf = math.prod(batch), M

        def bidx(b) -> Index:
            return Index.loops(batch, [(0, rb, b)]) if rb else Index((), ())

        def out_index(b, m, n):
            return Index(out.shape, tuple(out_dims(list(bidx(b).dims), m, n)))

        def a_index(b, m, k):
            bd = list(bidx(b).broadcast_to(a2[:-2]).dims)
            dims = bd + ([] if a_vec else [m]) + [k]
            return Index(A.shape, tuple(dims))

    def b_index(b, k, n):
        bd = list(Index.loops(batch, [(0, rb, b)]).broadcast_to(b2[:-2]).dims) if rb and not fold else \
            ["0"] * len(b2[:-2])
        dims = bd + [k] + ([] if b_vec else [n])
        return Index(B.shape, tuple(dims))

    def a_load(ev, b, m, k):
        return ev.at(A, a_index(b, m, k))

    def b_load(ev, b, k, n):
        return ev.at(B, b_index(b, k, n))

    a_op = Operand(a_load, rows=_rows_in_place(kc, ev, A, a_index))
    b_op = Operand(b_load)
    if not b_vec:
        b_op.cols = _cols_in_place(kc, ev, B, b_index, N, N)
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
    return GemmProblem(node.name, nb, Mf, N, K, a_op, b_op, out, out_index, dtype=out.dtype,
                       weights_axis="m" if sa is not None and sb is None else "n",
                       bias_store_ld=N if not (a_vec or b_vec) else None)


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

    def a_index(b, m, k):
        return Index(A.shape, (k, m) if ta else (m, k))

    def b_index(b, k, n):
        return Index(B.shape, (n, k) if tb else (k, n))

    def a_load(ev, b, m, k):
        return ev.at(A, a_index(b, m, k))

    def b_load(ev, b, k, n):
        return ev.at(B, b_index(b, k, n))

    a_op, b_op = Operand(a_load), Operand(b_load)
    if not ta:
        a_op.rows = _rows_in_place(kc, ev, A, a_index)
    if not tb:
        b_op.cols = _cols_in_place(kc, ev, B, b_index, N, N)
    sa, sb = _static(ev, A), _static(ev, B)
    if sa is not None:
        a_op.static = (sa.T if ta else sa).astype(np.float32).reshape(1, M, K)
    if sb is not None:
        b_op.static = (sb.T if tb else sb).astype(np.float32).reshape(1, K, N)
    alpha, beta = float(a["alpha"]), float(a["beta"])

    # Integers with a fractional alpha or beta scale as the reference does: each term in double
    # (the product A'B' wraps in the element type first), summed in double (no FMA: the build
    # uses -ffp-contract=off), then converted back to the element type, truncating toward zero, a sum
    # beyond the type's range its nearest end (``ops.elementwise.float_to_int``).
    in_double = dt.kind in "iu" and not (alpha.is_integer() and beta.is_integer())

    def _scale(v: float) -> str:  # an integral scale of an integer Gemm wraps into the element type
        return literal(wrap_int(v, dt) if dt.kind in "iu" else v, dt)

    def finish(ev, acc, b, m, n):
        if in_double:
            y = f"(double)({acc})" if alpha == 1.0 else f"{literal(alpha, np.float64)} * (double)({acc})"
            if C is not None and beta != 0.0:
                c = ev.at(C, Index((M, N), (m, n)).broadcast_to(C.shape))
                y = f"{y} + (double)({c})" if beta == 1.0 else f"{y} + {literal(beta, np.float64)} * (double)({c})"
            # NaN cannot be, but a sum beyond the type's range can: its end, as the reference (no undefined cast)
            return f"{float_to_int_helper(ev.kc.program, np.float64, dt)}({y})"
        y = acc if alpha == 1.0 else f"{_scale(alpha)} * {acc}"
        if C is not None and beta != 0.0:
            c = ev.at(C, Index((M, N), (m, n)).broadcast_to(C.shape))
            y = f"{y} + {c}" if beta == 1.0 else f"{y} + {_scale(beta)} * {c}"
        return y

    def out_index(b, m, n):
        return Index((M, N), (m, n))

    return GemmProblem(node.name, 1, M, N, K, a_op, b_op, out, out_index, finish, dtype=dt,
                       weights_axis="m" if sa is not None and sb is None else "n")


def lower_gemm(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    emit_gemm(kc, ev, stage, gemm_problem(kc, ev, stage.anchor_node))

