"""Winograd convolution for 3x3, stride-1, dilation-1, ungrouped 2-D convolutions.

F(m x m, 3 x 3) computes an m x m block of outputs from an alpha x alpha block of inputs
(alpha = m + 2) with alpha^2 multiplications per (input, output) channel pair instead of
9 m^2: ``Y = A^T [(G g G^T) * (B^T d B)] A`` (Lavin & Gray, 2015). Per image the output is
cut into ``ceil(OH/m) x ceil(OW/m)`` tiles and the tiles, in row-major order, into blocks of
``T`` (a multiple of the micro-kernel's NR) that keep the block's transformed input and
output in L2. Per block:

1. **input transform** (per input channel and tile-row segment of the block): the alpha
   input rows a segment reads are copied, zero-padded and with the group's prologue
   applied, into a band; ``B^T d`` is taken down the columns (a vectorised loop along the
   row), then ``(.) B`` across each tile; the alpha^2 results go to ``V[xi][c][t]``;
2. **alpha^2 GEMMs** ``M[xi] (Cout x T) = U[xi] (Cout x Cin) @ V[xi] (Cin x T)`` on the
   GEMM core's micro-kernel: ``U = G g G^T`` is computed at build time (in float64) and
   packed into the micro-kernel's MR-row panels in the weights blob; V is read in place
   (B "strided", one row per input channel). U (alpha^2 / 9 times the weights' bytes) rarely
   stays in the caches from one run to the next: the micro-kernel prefetches it
   ``winograd_prefetch_u`` bytes ahead (``CodegenOptions``);
3. **output transform** (per output channel and segment): ``A^T M A`` per tile into an
   m-row strip, then the anchor's bias and the group's epilogue (BN scale, residual Add,
   Relu, Clip, ...) run along each output row while the strip is in L1, and the group
   outputs are stored: no extra pass over memory. Partial tiles at the right and bottom
   edges are computed whole and clipped when stored.

Blocks are independent and split across threads (each has its own V and M in
scratch); every output's sums run in a fixed order whatever the thread count. Where there are
fewer blocks than threads (resnet18's 14x14 layers are one block of 16 tiles, which ran on one
thread), each block's output channels are split into as many parts as the threads need, up to
``gemm_min_tiles`` iterations in all, decided at run time: every part transforms the block's
input itself, so one thread, which needs no split, does not pay for it.

Which convolutions use it is decided here, once, at compile time (``winograd_choice``):
legality (the shape above, float32, constant weights) and, with ``winograd="auto"``,
profitability: thresholds in ``CodegenOptions`` (see there). The choice and its reason are
written into the kernel's comment and the report.

Numerics: the transforms are built exactly (``toom_cook``) from their interpolation points.
F(2x2) (0, 1, -1) has coefficients 0, +-1 and 1/2 and errs less than the direct kernel;
F(4x4) uses 0, 1, -1, 2, -1/2, whose float32 error is 2.3x smaller than the usual 0, +-1,
+-2 (numbers in ``CodegenOptions`` and ``tests/codegen/test_winograd.py``).

Cost model: ``opfuse.cost`` (below this package) prices a convolution by its direct FLOPs and
does not know which convolutions run as Winograd, so it over-predicts their time (by the
speed-ups quoted in ``CodegenOptions``). Fusion decisions are not biased by it: a
convolution's own cost is the same in the fused and the unfused plan it compares. The
per-group rates of ``opfuse compile --measure`` count the direct FLOPs too ("effective"
GFLOP/s) and mark the Winograd groups.
"""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable

import numpy as np

from opfuse.codegen.ctype import literal
from opfuse.codegen import simdchain, vecmath
from opfuse.codegen.epilogue import VectorEpilogue, finish_element
from opfuse.codegen.gemm import in_memory, microkernel_bodies, pack_a_panels, tail_panels
from opfuse.codegen.index import Index
from opfuse.codegen.kernel import ParallelLoop
from opfuse.codegen.microkernel import AVX2_GUARD, ZMM_FLOATS, fits_avx512, microkernel
from opfuse.codegen.options import REGISTER_BLOCKS
from opfuse.codegen.stages import Stage
from opfuse.ir.graph import Value


@dataclass(frozen=True)
class Transform:
    """F(m x m, 3 x 3): ``BT`` (alpha x alpha), ``G`` (alpha x 3), ``AT`` (m x alpha)."""

    m: int
    BT: tuple[tuple[Fraction, ...], ...]
    G: tuple[tuple[Fraction, ...], ...]
    AT: tuple[tuple[Fraction, ...], ...]

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def name(self) -> str:
        return f"F({self.m}x{self.m},3x3)"


def _solve(rows: list[list[Fraction]], rhs: list[Fraction]) -> list[Fraction]:
    """The exact solution of a consistent linear system of full column rank (Gauss-Jordan)."""
    n = len(rows[0])
    aug = [list(r) + [b] for r, b in zip(rows, rhs, strict=True)]
    for col in range(n):
        piv = next(i for i in range(col, len(aug)) if aug[i][col] != 0)
        aug[col], aug[piv] = aug[piv], aug[col]
        p = aug[col][col]
        aug[col] = [v / p for v in aug[col]]
        for i in range(len(aug)):
            if i != col and aug[i][col] != 0:
                f = aug[i][col]
                aug[i] = [v - f * u for v, u in zip(aug[i], aug[col], strict=True)]
    if any(r[-1] != 0 for r in aug[n:]):
        raise AssertionError("inconsistent Winograd system")
    return [aug[i][-1] for i in range(n)]


def toom_cook(m: int, points, r: int = 3) -> Transform:
    """F(m, r) from its ``m + r - 2`` finite interpolation points (and infinity), exactly:
    ``AT[i][j] = a_j^i``, ``G[j][k] = a_j^k / prod_{l != j} (a_j - a_l)`` (the last row and
    column for infinity), and ``BT`` the solution of the 1-D identity
    ``sum_j AT[i][j] G[j][k] BT[j][l] = [l == i + k]``."""
    a = [Fraction(p) for p in points]
    n = m + r - 1
    assert len(a) == n - 1 and len(set(a)) == n - 1
    AT = [[a[j] ** i for j in range(n - 1)] + [Fraction(int(i == m - 1))] for i in range(m)]
    G = []
    for j in range(n - 1):
        f = math.prod((a[j] - a[k] for k in range(n - 1) if k != j), start=Fraction(1))
        G.append([a[j] ** k / f for k in range(r)])
    G.append([Fraction(0)] * (r - 1) + [Fraction(1)])
    cols = []
    for col in range(n):
        rows = [[AT[i][j] * G[j][k] for j in range(n)] for i in range(m) for k in range(r)]
        rhs = [Fraction(int(col == i + k)) for i in range(m) for k in range(r)]
        cols.append(_solve(rows, rhs))
    BT = [[cols[col][j] for col in range(n)] for j in range(n)]
    return Transform(m, tuple(map(tuple, BT)), tuple(map(tuple, G)), tuple(map(tuple, AT)))


# F(2x2, 3x3) on the points 0, 1, -1: the transforms' coefficients are 0, +-1 and +-1/2.
F2 = toom_cook(2, (0, 1, -1))
# F(4x4, 3x3) on 0, 1, -1, 2, -1/2 rather than the usual 0, +-1, +-2 (Lavin & Gray): a float32
# simulation of a 64-channel layer (400 tiles, O(1) outputs) errs 8.2e-6 at most (rms 1.2e-6)
# instead of 1.9e-5 (rms 1.8e-6); F(2x2): 1.2e-6 (rms 2.7e-7).
F4 = toom_cook(4, (0, 1, -1, 2, Fraction(-1, 2)))
TRANSFORMS = {2: F2, 4: F4}


def as_array(rows) -> np.ndarray:
    return np.array([[float(v) for v in r] for r in rows], dtype=np.float64)


@dataclass(frozen=True)
class Choice:
    """The algorithm of one convolution: ``transform`` None means the direct kernel."""

    transform: Transform | None
    reason: str

    def describe(self, node_name: str) -> str:
        if self.transform is None:
            return f"Conv '{node_name}': direct ({self.reason})"
        return f"Conv '{node_name}': Winograd {self.transform.name} ({self.reason})"


def legality(node, static: dict) -> str | None:
    """Why ``node`` (a Conv) cannot run as Winograd F(m, 3x3), or None when it can."""
    from opfuse.ops.nn import conv_geometry as _geometry
    x, wt, out = node.input(0), node.input(1), node.outputs[0]
    if len(x.shape) != 4:
        return f"{len(x.shape) - 2}-D convolution (Winograd: 2-D only)"
    geo, group = _geometry(node)
    if tuple(geo.kernel) != (3, 3):
        return f"kernel {'x'.join(map(str, geo.kernel))} (Winograd: 3x3 only)"
    if tuple(geo.strides) != (1, 1):
        return f"strides {list(geo.strides)} (Winograd: stride 1 only)"
    if tuple(geo.dilations) != (1, 1):
        return f"dilations {list(geo.dilations)} (Winograd: dilation 1 only)"
    if group != 1:
        return f"group={group} (Winograd: ungrouped only)"
    if out.dtype != np.float32:
        return f"dtype {out.dtype} (Winograd: float32 only)"
    if id(wt) not in static:
        return "weights computed at run time (Winograd transforms them at build time)"
    return None


def choose_transform(options, out_h: int, out_w: int) -> Transform:
    """F(4x4) when ``winograd_f4`` is set and both output sides are at least
    ``winograd_f4_min_spatial``, else F(2x2)."""
    return F4 if options.winograd_f4 and min(out_h, out_w) >= options.winograd_f4_min_spatial else F2


def winograd_choice(node, options, static: dict) -> Choice:
    """Direct or Winograd for one Conv, decided at compile time: legality first, then (with
    ``winograd="auto"``) the profitability thresholds of ``CodegenOptions``."""
    if options.winograd == "off":
        return Choice(None, "winograd='off'")
    why = legality(node, static)
    if why is not None:
        return Choice(None, why)
    C, OC = node.input(0).shape[1], node.outputs[0].shape[1]
    OH, OW = node.outputs[0].shape[2:]
    t = choose_transform(options, OH, OW)
    if options.winograd == "on":
        return Choice(t, "winograd='on'")
    if options.simd == "none":
        return Choice(None, "plain C99 build (simd='none'): Winograd only with winograd='on'")
    if min(C, OC) < options.winograd_min_channels:
        return Choice(None, f"{C} -> {OC} channels, fewer than winograd_min_channels="
                            f"{options.winograd_min_channels}: the transforms would dominate")
    small = (min(OH, OW) >= options.winograd_small_spatial
             and min(C, OC) >= options.winograd_small_min_channels)
    if min(OH, OW) < options.winograd_min_spatial and not small:
        return Choice(None, f"output {OH}x{OW}, smaller than winograd_min_spatial="
                            f"{options.winograd_min_spatial} (and {C} -> {OC} channels at output sides below "
                            f"winograd_small_spatial={options.winograd_small_spatial} or channels below "
                            f"winograd_small_min_channels={options.winograd_small_min_channels}): partial "
                            f"tiles and the transforms would dominate")
    if t is F2 and min(C, OC) < options.winograd_f2_min_channels:
        return Choice(None, f"{C} -> {OC} channels at output {OH}x{OW} (F(2x2,3x3)), fewer than "
                            f"winograd_f2_min_channels={options.winograd_f2_min_channels}: the transforms "
                            f"would dominate")
    return Choice(t, f"{C} -> {OC} channels, output {OH}x{OW}")


def filter_transform(weights: np.ndarray, t: Transform) -> np.ndarray:
    """``U[xi, oc, c] = (G g[oc, c] G^T)[i, k]`` with ``xi = i * alpha + k``, in float64."""
    G = as_array(t.G)
    u = np.einsum("ia,ocab,kb->ikoc", G, weights.astype(np.float64), G)
    return u.reshape(t.alpha * t.alpha, weights.shape[0], weights.shape[1])


def _combo(coeffs, terms: list[str]) -> str:
    """C text of ``sum_i coeffs[i] * terms[i]`` (zeros skipped, +-1 without a multiply),
    summed left to right in index order."""
    out = ""
    for c, x in zip(coeffs, terms, strict=True):
        if c == 0:
            continue
        mag = abs(c)
        term = x if mag == 1 else f"{literal(float(mag), np.float32)} * {x}"
        if not out:
            out = term if c > 0 else f"-{term}"
        else:
            out += f" + {term}" if c > 0 else f" - {term}"
    return out or "0.0f"


def _combo_avx2(coeffs, ptrs: list[str]) -> str:
    """``_combo`` on 8 lanes at once: AVX2 intrinsics, a fused multiply-add per weighted term."""
    acc = ""
    for c, p in zip(coeffs, ptrs, strict=True):
        if c == 0:
            continue
        x = f"_mm256_loadu_ps({p})"
        k = f"_mm256_set1_ps({literal(float(abs(c)), np.float32)})"
        if not acc:
            acc = x if c == 1 else f"_mm256_mul_ps(_mm256_set1_ps({literal(float(c), np.float32)}), {x})"
        elif abs(c) == 1:
            acc = f"_mm256_{'add' if c > 0 else 'sub'}_ps({acc}, {x})"
        else:
            acc = f"_mm256_{'fmadd' if c > 0 else 'fnmadd'}_ps({k}, {x}, {acc})"
    return acc or "_mm256_setzero_ps()"


def _lane_stage(w, simd: str, lane: str, items: list[tuple[str, tuple, list[str]]]) -> None:
    """``dst[l] = sum_i coeffs[i] * src_i[l]`` for the LANES lanes, per ``(dst, coeffs, srcs)``
    (C pointers): AVX2/FMA intrinsics where the target has them (``simd="auto"``), a
    constant-trip loop gcc vectorises otherwise (two roundings per weighted term)."""
    if simd == "auto" and LANES == 8:
        w.line(f"#if {AVX2_GUARD}")
        for dst, coeffs, srcs in items:
            w.line(f"_mm256_storeu_ps({dst}, {_combo_avx2(coeffs, srcs)});")
        w.line("#else")
    for dst, coeffs, srcs in items:
        w.line(f"for (long {lane} = 0; {lane} < {LANES}; ++{lane}) ({dst})[{lane}] = "
               f"{_combo(coeffs, [f'({p})[{lane}]' for p in srcs])};")
    if simd == "auto" and LANES == 8:
        w.line("#endif")


def _gather_avx2(m: int, src: str, dsts: list[str]) -> list[str]:
    """AVX2: ``dsts[q][l] = src[q + m * l]`` for 8 lanes l and q < m + 2 (one patch row of 8
    consecutive tiles): in-register transposes of the contiguous run instead of 8 (m + 2)
    scalar copies. m is 2 or 4."""
    ld = "_mm256_loadu_ps"
    if m == 4:
        out = ["{ const __m256i ix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);"]
        for base, cols in ((src, range(4)), (f"{src} + 4", range(2))):
            out.append(f"  {{ const __m256 a0 = {ld}({base}), a1 = {ld}({base} + 8), a2 = {ld}({base} + 16), "
                       f"a3 = {ld}({base} + 24);")
            out.append("    const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1), "
                       "t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3); (void)t1; (void)t3;")
            for q in cols:
                pair, imm = ("t0, t2", "0x44") if q == 0 else ("t0, t2", "0xEE") if q == 1 else \
                    ("t1, t3", "0x44") if q == 2 else ("t1, t3", "0xEE")
                dst = dsts[q if base == src else 4 + q]
                out.append(f"    _mm256_storeu_ps({dst}, "
                           f"_mm256_permutevar8x32_ps(_mm256_shuffle_ps({pair}, {imm}), ix));")
            out.append("  }")
        return out + ["}"]
    assert m == 2
    out = []
    for base, first in ((src, 0), (f"{src} + 2", 2)):
        out.append(f"{{ const __m256 a0 = {ld}({base}), a1 = {ld}({base} + 8);")
        for q, imm in ((0, "0x88"), (1, "0xDD")):
            out.append(f"  _mm256_storeu_ps({dsts[first + q]}, _mm256_castpd_ps(_mm256_permute4x64_pd("
                       f"_mm256_castps_pd(_mm256_shuffle_ps(a0, a1, {imm})), 0xD8)));")
        out.append("}")
    return out


def _scatter_avx2(m: int, srcs: list[str], dst: str) -> list[str]:
    """AVX2: ``dst[m * l + j] = srcs[j][l]`` for 8 lanes l and j < m (one output row of 8
    consecutive tiles): an in-register transpose and m contiguous stores. m is 2 or 4."""
    ld, st = "_mm256_loadu_ps", "_mm256_storeu_ps"
    if m == 4:
        return [f"{{ const __m256 c0 = {ld}({srcs[0]}), c1 = {ld}({srcs[1]}), c2 = {ld}({srcs[2]}), "
                f"c3 = {ld}({srcs[3]});",
                "  const __m256 t0 = _mm256_unpacklo_ps(c0, c1), t1 = _mm256_unpackhi_ps(c0, c1), "
                "t2 = _mm256_unpacklo_ps(c2, c3), t3 = _mm256_unpackhi_ps(c2, c3);",
                "  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE), "
                "u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);",
                f"  {st}({dst}, _mm256_permute2f128_ps(u0, u1, 0x20)); "
                f"{st}({dst} + 8, _mm256_permute2f128_ps(u2, u3, 0x20));",
                f"  {st}({dst} + 16, _mm256_permute2f128_ps(u0, u1, 0x31)); "
                f"{st}({dst} + 24, _mm256_permute2f128_ps(u2, u3, 0x31)); }}"]
    assert m == 2
    return [f"{{ const __m256 c0 = {ld}({srcs[0]}), c1 = {ld}({srcs[1]});",
            "  const __m256 lo = _mm256_unpacklo_ps(c0, c1), hi = _mm256_unpackhi_ps(c0, c1);",
            f"  {st}({dst}, _mm256_permute2f128_ps(lo, hi, 0x20)); "
            f"{st}({dst} + 8, _mm256_permute2f128_ps(lo, hi, 0x31)); }}"]


def integer_rows(G) -> tuple[tuple[Fraction, ...], tuple[tuple[int, ...], ...]]:
    """``G = diag(s) P``: each row of ``G`` as a scale ``s_i`` times a row ``P_i`` of coprime integers whose
    first nonzero entry is positive (F(4x4)'s ``(-16/15, 8/15, -4/15)`` is ``-4/15 (4, -2, 1)``)."""
    scales, rows = [], []
    for row in G:
        nz = [v for v in row if v != 0]
        if not nz:
            scales.append(Fraction(1))
            rows.append(tuple(0 for _ in row))
            continue
        den = math.lcm(*(v.denominator for v in nz))
        num = math.gcd(*(int(v * den) for v in nz))
        s = Fraction(num, den) * (1 if nz[0] > 0 else -1)
        scales.append(s)
        rows.append(tuple(int(v / s) for v in row))
    return tuple(scales), tuple(rows)


def u_from_weights_exact(t: Transform) -> bool:
    """Whether ``U = G g G^T`` computed in float32 from ``integer_rows`` is the same in every build: every
    integer coefficient a power of two (its product exact, so a multiply then an add is a fused multiply-add)."""
    _, rows = integer_rows(t.G)
    return all(v == 0 or (abs(v) & (abs(v) - 1)) == 0 for r in rows for v in r)


def _int_combo(coeffs, terms: list[str], vec: str | None) -> str:
    """``sum_i coeffs[i] * terms[i]`` (integer powers of two, the first nonzero positive), left to right, in
    scalar C (``vec`` None) or the intrinsics of prefix ``vec`` ("_mm512"): the same operations, the same bits."""
    acc = ""
    assert next((c for c in coeffs if c != 0), 1) > 0, coeffs
    for c, x in zip(coeffs, terms, strict=True):
        if c == 0:
            continue
        mag = abs(c)
        if vec:  # a power of two times x is exact: a fused multiply-add rounds as the multiply then the add
            k = f"{vec}_set1_ps({literal(float(mag), np.float32)})"
            if not acc:
                acc = x if mag == 1 else f"{vec}_mul_ps({k}, {x})"
            elif mag == 1:
                acc = f"{vec}_{'add' if c > 0 else 'sub'}_ps({acc}, {x})"
            else:
                acc = f"{vec}_{'fmadd' if c > 0 else 'fnmadd'}_ps({k}, {x}, {acc})"
        else:
            term = x if mag == 1 else f"{literal(float(mag), np.float32)} * {x}"
            acc = term if not acc else f"({acc} {'+' if c > 0 else '-'} {term})"
    if not acc:
        return f"{vec}_setzero_ps()" if vec else "0.0f"
    return acc


def emit_u_panel(w, t: Transform, gp: str, up: str, kb: str, mr: int, stride: int, simd: str,
                 row: int | None = None) -> None:
    """``U[xi][c][r] = (G g[r, c] G^T)[xi]`` for one panel of ``mr`` output channels and ``kb`` input channels,
    from the 3x3 weights packed ``gp[(c * 9 + a * 3 + b) * mr + r]``, into ``up[xi * stride + c * mr + r]``
    (the micro-kernel's A panels, one per xi); ``row``: only the alpha xi ``row * alpha + k`` of that row of U, at
    ``up[k * stride + c * mr + r]`` (the others need none of its arithmetic). As ``diag(s) P g P^T diag(s)``
    (``integer_rows``): the integer combinations first, then one multiply by ``s_i s_k`` rounded once to float32.
    16 lanes at a time in AVX-512 where ``mr`` is a multiple of 16, else a constant-trip loop over the lanes; the
    same bits either way, and for every ``row`` (``u_from_weights_exact``)."""
    scales, P = integer_rows(t.G)
    alpha = t.alpha
    cc, lane, g9, uo = "wc_", "wl_", "wg_", "wu_"
    rows = range(alpha) if row is None else [row]

    def body(vec: str | None, load, store) -> None:
        for k in range(9):
            w.line(f"const {'__m512' if vec else 'float'} g{k}_ = {load(f'{g9} + {k * mr}')};")
        for i in rows:  # t[i][b] = sum_a P[i][a] g[a][b]
            for b in range(3):
                w.line(f"const {'__m512' if vec else 'float'} t{i}_{b}_ = "
                       f"{_int_combo(P[i], [f'g{a * 3 + b}_' for a in range(3)], vec)};")
        for i in rows:  # u[i][k] = s_i s_k sum_b t[i][b] P[k][b]
            for k in range(alpha):
                e = _int_combo(P[k], [f"t{i}_{b}_" for b in range(3)], vec)
                sc = scales[i] * scales[k]
                if sc != 1:
                    lit = literal(float(sc), np.float32)
                    e = f"{vec}_mul_ps({vec}_set1_ps({lit}), {e})" if vec else f"{lit} * {e}"
                store(f"{uo} + {((i * alpha if row is None else 0) + k) * stride}", e)

    with w.block(f"for (long {cc} = 0; {cc} < {kb}; ++{cc})"):
        w.line(f"const float* restrict {g9} = {gp} + {cc} * {9 * mr};")
        w.line(f"float* restrict {uo} = {up} + {cc} * {mr};")
        wide = simd == "auto" and mr % ZMM_FLOATS == 0
        if wide:
            w.line("#if defined(__AVX512F__)")
            with w.block(f"for (long {lane} = 0; {lane} < {mr}; {lane} += {ZMM_FLOATS})"):
                body("_mm512", lambda p: f"_mm512_loadu_ps({p} + {lane})",
                     lambda p, e: w.line(f"_mm512_storeu_ps({p} + {lane}, {e});"))
            w.line("#else")
        with w.block(f"for (long {lane} = 0; {lane} < {mr}; ++{lane})"):
            body(None, lambda p: f"({p})[{lane}]", lambda p, e: w.line(f"({p})[{lane}] = {e};"))
        if wide:
            w.line("#endif")


def filter_transform_float32(weights: np.ndarray, t: Transform) -> np.ndarray:
    """``filter_transform`` as ``emit_u_panel`` computes it, in float32, operation for operation (the integer
    combinations left to right, then the scale ``s_i s_k`` rounded to float32): the U stored for a convolution whose
    threaded build computes U from the weights, so that every thread count gives the same bits."""
    assert u_from_weights_exact(t), t.name
    scales, P = integer_rows(t.G)
    g = np.asarray(weights, np.float32)

    def combo(coeffs, terms):
        acc = None
        for c, x in zip(coeffs, terms, strict=True):
            if c == 0:
                continue
            term = x if abs(c) == 1 else np.float32(abs(c)) * x
            acc = term if acc is None else (acc + term if c > 0 else acc - term)
        return np.zeros_like(g[:, :, 0, 0]) if acc is None else acc

    tt = [[combo(P[i], [g[:, :, a, b] for a in range(3)]) for b in range(3)] for i in range(t.alpha)]
    u = np.empty((t.alpha * t.alpha,) + g.shape[:2], np.float32)
    for i in range(t.alpha):
        for k in range(t.alpha):
            v = combo(P[k], tt[i])
            sc = scales[i] * scales[k]
            u[i * t.alpha + k] = v if sc == 1 else np.float32(float(sc)) * v
    return u


def pack_weights_panels(weights: np.ndarray, mr: int) -> np.ndarray:
    """(OC, C, 3, 3) -> (ceil(OC / mr), C, 9, mr) float32, output channels zero-padded: ``emit_u_panel``'s ``gp``."""
    oc, c = weights.shape[:2]
    mp = -(-oc // mr)
    pad = np.zeros((mp * mr, c, 9), dtype=np.float32)
    pad[:oc] = np.asarray(weights, np.float32).reshape(oc, c, 9)
    return np.ascontiguousarray(pad.reshape(mp, mr, c, 9).transpose(0, 2, 3, 1))


def _tiles_per_block(options, C: int, OCp: int, tiles: int, nimg: int, alpha: int, nr: int) -> int:
    """Tiles per block: V and M of a block (alpha^2 (Cin + Cout) floats per tile) within
    ``winograd_block_floats``, a multiple of NR, and at least ``gemm_min_tiles`` blocks over
    the batch where there are tiles enough (threads need blocks to share); of up to
    ``gemm.BALANCE_EXTRA_CUTS`` more blocks, the count the threads of ``balance_threads`` share best
    (resnet18's 56x56 layers: 196 tiles in 5 blocks of 48 are 4 full blocks and one of 4 tiles)."""
    from opfuse.codegen.gemm import (BALANCE_ENOUGH, BALANCE_EXTRA_CUTS, BALANCE_MIN_GAIN, balance_efficiency,
                                     balance_gain)
    per_tile = alpha * alpha * (C + OCp)
    most = max(nr, options.winograd_block_floats // per_tile // nr * nr)
    nblk = -(-tiles // most)
    nblk = max(nblk, min(-(-options.gemm_min_tiles // nimg), -(-tiles // nr)))
    T = -(-tiles // nblk)
    T = -(-T // nr) * nr
    threads = tuple(t for t in options.balance_threads if t > 1)
    m = alpha - 2
    if not threads or 2 * nimg * OCp * C * 9 * tiles * m * m < options.parallel_min_work:
        return T  # the loop runs on one thread (lower_winograd prices it at its direct FLOPs, about these)
    if nimg * -(-tiles // T) < max(threads):
        return T  # fewer blocks than threads: the blocks' output channels are split (lower_winograd)

    def facts(size: int) -> tuple[tuple[float, ...], int]:
        costs = [float(-(-min(size, tiles - t0) // nr) * nr) for t0 in range(0, tiles, size)] * nimg
        return balance_efficiency(costs, threads), len(costs)

    eff0 = facts(T)[0]
    better = [size for size in {_round_up(-(-tiles // n), nr) for n in range(nblk, nblk + BALANCE_EXTRA_CUTS + 1)}
              if size <= T and balance_gain(facts(size)[0], eff0)]
    # the most efficient of those (in steps of BALANCE_MIN_GAIN, up to BALANCE_ENOUGH), then the fewest blocks
    return max(better, key=lambda size: (tuple(round(min(e, BALANCE_ENOUGH) / BALANCE_MIN_GAIN)
                                               for e in facts(size)[0]), size), default=T)


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _register_block(o, C: int, OC: int, tiles: int, nimg: int, alpha: int) -> tuple[int, int, bool]:
    """(MR, NR, AVX-512 body) of the batched GEMMs. Their B (the transformed input) is built per
    block and U is packed for this convolution alone, so the block is free per convolution: the
    AVX2 6 x 16 unless ``winograd_avx512`` (``CodegenOptions``) allows the AVX-512 block, and
    then only where its wider panels pad the block's tiles no further (a 14x14 output has 16
    F(4x4) tiles: 32 with NR = 32, twice the multiplications)."""
    mr2, nr2 = REGISTER_BLOCKS["avx2"]
    if o.vector_isa != "avx512":
        return o.gemm_mr, o.gemm_nr, False
    if not o.winograd_avx512:
        return mr2, nr2, False

    def padded(mr: int, nr: int) -> int:
        ocp = -(-OC // mr) * mr
        T = _tiles_per_block(o, C, ocp, tiles, nimg, alpha, math.lcm(nr, LANES))
        return -(-tiles // T) * T * ocp

    if padded(o.gemm_mr, o.gemm_nr) <= padded(mr2, nr2):
        return o.gemm_mr, o.gemm_nr, True
    # AVX2's panel width in one zmm (``WINOGRAD_ZMM_ROWS``): a broadcast per multiply-add, but twice AVX2's lanes.
    rows = [r for r in WINOGRAD_ZMM_ROWS if fits_avx512(r, ZMM_FLOATS)]
    if o.winograd_zmm_panels and rows:
        mr = min(rows, key=lambda r: (-(-OC // r) * r, -r))
        if padded(mr, ZMM_FLOATS) <= padded(mr2, nr2):
            return mr, ZMM_FLOATS, True
    return mr2, nr2, False


# Rows of the one-zmm-wide block (``_register_block``): at least 8 multiply-add chains, the ones that pad the
# output channels least, the more on a tie (256 channels: 16 x 16).
WINOGRAD_ZMM_ROWS = range(8, 17)


LANES = 8  # tiles transformed together: one ymm per transform value (constant-trip loops gcc vectorises)


def _block_rows(tiles: int, T: int, TW: int) -> int:
    """Most tile rows one block of ``T`` tiles touches."""
    return max((min(tiles, t0 + T) - 1) // TW - t0 // TW + 1 for t0 in range(0, tiles, T))


def last_round_split(o, units: int, panels: int, work: int) -> int:
    """Parts the blocks of a parallel loop's last round may be split in (0: no such split;
    ``CodegenOptions.winograd_split_last_round``): where ``units`` blocks (two or more) leave some
    thread count of ``balance_threads`` a last round with fewer blocks than threads (resnet18's
    56x56 layers: 7 blocks on 2 threads, the last one alone), those blocks' output channels are
    split as a single block's are, up to the largest of those thread counts (and the ``panels``
    of MR output channels). The split is decided at run time (``last_round_parts``): one thread,
    and thread counts that divide ``units``, transform every block once."""
    if not o.winograd_split_last_round or units < 2 or work < o.parallel_min_work:
        return 0
    short = [t for t in o.balance_threads if 1 < t < units and units % t]
    return min(max(short), panels) if short and panels > 1 else 0


def last_round_parts(threads: int, units: int, most: int, block: int) -> int:
    """Parts block ``block`` of ``units`` runs in on ``threads`` threads (the C the split emits):
    the ``rem = units % threads`` blocks of the last round (every block where there are fewer
    blocks than threads) in ``ceil(threads / rem)`` parts, at most ``most``; the others whole."""
    rem = 0 if threads <= 1 else units if threads > units else units % threads
    if rem == 0 or block < units - rem:
        return 1
    return min(-(-threads // rem), most)


def _panel_steps(mr: int, nr: int, wide: bool) -> int:
    """Issue slots of one k step of the ``mr`` x ``nr`` micro-kernel: its multiply-adds (one per vector of B) or
    its loads (``mr`` broadcasts and B's vectors), whichever is more: the narrow ones are load-bound (8 x 8 as slow
    a step as 8 x 16)."""
    vec = ZMM_FLOATS if wide and fits_avx512(mr, nr) else 8
    nv = -(-nr // vec)
    return max(mr * nv, mr + nv)


def _column_tails(mr: int, nr: int, wide: bool, last: int) -> list[int]:
    """The panel widths (16, then 8) for the last block's ``last`` tiles past its whole NR-tile panels, where they
    take fewer k-step slots (``_panel_steps``) than one padded NR-tile panel; [] otherwise (also for NR other than
    16 and 32, and where the rest is a whole panel)."""
    rem = -(-last // LANES) * LANES % nr
    if nr not in (16, 32) or LANES != 8 or not rem:
        return []
    widths, left = [], rem
    for wd in (16, 8):
        if wd < nr and left >= wd:
            widths.append(wd)
            left -= wd
    assert left == 0, (nr, rem)
    cheaper = sum(_panel_steps(mr, wd, wide) for wd in widths) < _panel_steps(mr, nr, wide)
    return widths if cheaper else []


def lower_winograd(kc, ev, stage: Stage, node, t: Transform, bias_term) -> None:
    """Emit the Winograd convolution of ``node`` with the group's epilogue (module docstring)."""
    from opfuse.ops.nn import conv_geometry as _geometry
    o = kc.program.options
    w = kc.w
    geo, _ = _geometry(node)
    x, wt, out = node.input(0), node.input(1), node.outputs[0]
    nimg, C, H, W = x.shape
    OC, OH, OW = out.shape[1:]
    PT, PL = geo.pads_begin
    m, alpha = t.m, t.alpha
    A2 = alpha * alpha
    TH, TW = -(-OH // m), -(-OW // m)
    tiles = TH * TW
    MR, NR, wide = _register_block(o, C, OC, tiles, nimg, alpha)
    Q = math.lcm(NR, LANES)
    OCp = -(-OC // MR) * MR
    T = _tiles_per_block(o, C, OCp, tiles, nimg, alpha, Q)
    # One GEMM operand (xi) to the next: a cache line more than its size, so the transforms'
    # alpha^2 streams do not all fall in one L1 set (C * T floats is often a multiple of 4 KiB).
    XV, XM = C * T + 16, OCp * T + 16
    # A block's last panel of tiles short of NR: LANES-wide panels (16, then 8 tiles) on narrower micro-kernels
    # (``winograd_column_tails``) where that takes fewer k steps than one padded NR-tile panel (resnet18's 56x56
    # layers: the last 4 of 196 tiles on 8 x 8; its 28x28 ones leave 24 and stay padded).
    col_tails = _column_tails(MR, NR, wide, tiles - (-(-tiles // T) - 1) * T) if o.winograd_column_tails else []
    QT = LANES if col_tails else Q  # a block's tiles rounded up to this
    nblk = -(-tiles // T)
    R = _block_rows(tiles, T, TW)
    BW = TW * m + 2            # band row: a whole tile row's input, padded
    BR = (R - 1) * m + alpha   # band rows
    YB = TW * m                # output strip row
    # The bias and epilogue over each output channel's plane as one row (``winograd_flat_epilogue``) where one
    # block holds every tile (the strip is then the whole plane), the strip's rows are the output's (OW a multiple
    # of m, so no padding between them) and each operand of the epilogue is the output's shape or constant over
    # the plane: nudenet's 10x10 F(2x2) layers ran SiLU on rows of 10 floats, a vector each.
    flat_epilogue = (o.winograd_flat_epilogue and nblk == 1 and YB == OW and bool(stage.epilogue)
                     and _plane_operands(ev, stage, out))
    KC = -(-C // -(-C // o.gemm_kc))  # K blocks as even as possible (gemm.k_blocks)
    BT, AT = t.BT, t.AT
    L = LANES

    neon = o.vector_isa == "neon"
    # The last OC mod MR output channels in a panel of their own width (``gemm.tail_panels``, one panel: the
    # threads' parts of the channels are whole MR panels), not a zero-padded MR-row panel.
    tails = tail_panels(OC, MR, NR, MR, o)
    body = OC - sum(tails)
    u_bytes = A2 * (OC if tails else OCp) * C * 4
    # Fewer blocks than threads: each block's output channels are split in up to `most` parts,
    # as many as the threads need (decided at run time: one thread transforms each block once).
    units = nimg * nblk
    work = 2 * nimg * OC * C * 9 * OH * OW
    # Each iteration's cost: its block's tiles (rounded up to whole lane groups), a part's share.
    block_tiles = [-(-min(T, tiles - t0) // QT) * QT for t0 in range(0, tiles, T)] * nimg
    split = last_round_split(o, units, OCp // MR, work)
    most = split or min(max(1, -(-o.gemm_min_tiles // units)), OCp // MR)
    # A single block on several threads: one region, the input transform's channels shared out into one V (thread
    # 0's), then the parts (``winograd_shared_transform``); one thread runs the loop below on its own.
    shared = o.winograd_shared_transform and not split and units == 1 and most > 1 and work >= o.parallel_min_work
    # In that region, U computed per panel of output channels from the 3x3 weights (``winograd_u_from_weights``)
    # where it is large and at least ``winograd_u_from_weights_min_ratio`` times the weights; one thread streams U.
    from_weights = (shared and o.winograd_u_from_weights and u_bytes >= o.winograd_u_from_weights_min_bytes
                    and A2 >= 9 * o.winograd_u_from_weights_min_ratio and not tails and u_from_weights_exact(t))
    # the prefetch is an intrinsic: the plain C99 build (simd="none") has none, and its C stays as it was
    ahead = o.winograd_prefetch_u if o.simd == "auto" and u_bytes >= o.winograd_prefetch_min_bytes else 0

    # With U from the weights: each GEMM call of a panel fetches ``g_lines`` lines of the next panel's weights,
    # one every ``g_step`` k steps (the micro-kernel's ``b_next``); ``jrs`` calls per xi.
    # ``CB`` input channels a chunk: with ``winograd_fw_row_groups`` (a row of U, alpha xi, at a time: each chunk's
    # U and the row's M tiles in L1) within ``winograd_fw_group_chunk_bytes``, else ``winograd_u_chunk_bytes``.
    jrs = -(-tiles // Q) * Q // NR
    groups = o.winograd_fw_row_groups
    CB = max(8, (o.winograd_fw_group_chunk_bytes // (alpha * MR * 4) if groups else
                 o.winograd_u_chunk_bytes // (A2 * MR * 4)) // 8 * 8)
    g_lines = -(-(C * 9 * MR // 16) // (-(-C // CB) * A2 * jrs))
    g_step = max(1, CB // g_lines)

    def kernel(mr: int, b_next: int = 0, nr: int = NR) -> str:
        """Register the ``mr`` x ``nr`` micro-kernel of the GEMMs (U prefetched ``ahead`` bytes on, or with
        ``b_next`` U in scratch and the next panel's weights fetched); its name."""
        v_ahead = o.gemm_prefetch if b_next or o.winograd_prefetch_v else 0  # B (V): see winograd_prefetch_v
        if b_next and o.winograd_fw_prefetch_next_xi and XV % T == 0:
            v_ahead = XV // T  # rows of T floats: V[xi + 1]'s rows of this chunk
        name, text = microkernel(mr, nr, "packed", "strided", o.simd, v_ahead, o.gemm_scalar_accumulators,
                                 wide, neon=neon, a_prefetch=0 if b_next else -(-ahead // (4 * mr)),
                                 k_unroll=o.gemm_k_unroll, b_next=b_next)
        return kc.program.require_helper(name, text)

    def columns(ntp: str, jr: str, emit: Callable[[str, int], None]) -> None:
        """The GEMMs' NR-tile panels of a block's ``ntp`` tiles, ``emit(jr, width)`` each: whole panels, then (with
        ``col_tails``) the rest, a multiple of LANES, in narrower panels (16, then 8 tiles)."""
        with w.block(f"for (long {jr} = 0; {jr} + {NR} <= {ntp}; {jr} += {NR})"):
            emit(jr, NR)
        if col_tails:
            jt = kc.tmp("jt")
            w.line(f"long {jt} = {ntp} - {ntp} % {NR};")
            for wd in col_tails:
                with w.block(f"if ({ntp} - {jt} >= {wd})"):
                    emit(jt, wd)
                    w.line(f"{jt} += {wd};")
    ukr = kernel(MR)
    ukr_fw = kernel(MR, g_step) if from_weights else ""
    ukr_tail = kernel(tails[0]) if tails else ""
    bodies = microkernel_bodies(MR, NR, o.simd, wide, neon)
    fetch = "" if o.simd != "auto" else f"; U ({u_bytes >> 10} KiB) prefetched {ahead} bytes ahead" if ahead else \
        f"; U ({u_bytes >> 10} KiB) not prefetched (winograd_prefetch_min_bytes={o.winograd_prefetch_min_bytes})" \
        if o.winograd_prefetch_u else "; U not prefetched (winograd_prefetch_u=0)"
    if from_weights:
        fetch += (f"; on more than one thread U computed from the 3x3 weights, {CB} input channels of a {MR}-channel "
                  f"panel at a time (winograd_u_from_weights)")
    kc.note(lambda nm: f"Winograd GEMMs '{nm}': {MR}x{NR} micro-kernel, {bodies}{fetch}", node)
    if tails:
        kc.note(lambda nm: f"Winograd GEMMs '{nm}': the last {tails[0]} of {OC} channels in a {tails[0]}x{NR} panel",
                node)
    weights = kc.program.memory.static[id(wt)]
    # The 3x3 weights as they are, for the outputs recomputed directly (``_nonfinite_outputs_direct``).
    g_array = np.asarray(weights, np.float32).reshape(-1)
    g = kc.const_array(("winograd_g", node.name), g_array, node.name + "_g", np.float32)
    kc.note(lambda nm: f"Winograd '{nm}': infinite or NaN outputs of the transforms recomputed directly "
                       f"(the 3x3 weights kept beside U: {g_array.nbytes >> 10} KiB)", node)
    # where the threaded build computes U from the weights, the stored U is its float32 bits (the same outputs on
    # any thread count), else G g G^T in float64 rounded once
    u = filter_transform_float32(weights, t) if from_weights else filter_transform(weights, t).astype(np.float32)
    upack = kc.const_array(("winograd_u", node.name, m, MR, tails), pack_a_panels(u, MR, tails), node.name + "_U",
                           np.float32)
    gpack = kc.const_array(("winograd_gp", node.name, MR), pack_weights_panels(weights, MR), node.name + "_gp",
                           np.float32) if from_weights else ""
    mp = OCp // MR
    off_v = kc.scratch(A2 * XV * 4)
    off_m = kc.scratch(A2 * XM * 4)
    off_band = kc.scratch((BR * BW + 8) * 4)  # + 8: the vector gather's last loads run past a row
    off_y = kc.scratch(((R + 1) * m * YB + m) * 4)
    off_d = kc.scratch(2 * A2 * L * 4)
    XU = CB * MR + 16  # U from the weights: one xi's panel to the next (a line more, as XV and XM)
    off_u = kc.scratch((alpha if groups else A2) * XU * 4) if from_weights else 0
    off_xo = kc.scratch(T * 8)
    off_yo = kc.scratch(T * 8)

    shared_v = f"((float*)(scratch + {off_v}))"  # thread 0's V, where the threads of one block's region meet
    # The band copy reads each input row once per block, in short runs a channel apart that the hardware's
    # prefetcher does not follow: the rows of the channel ``winograd_band_prefetch`` ahead are fetched meanwhile
    # (an input read from memory, float32, the intrinsics build; the portable C is unchanged).
    ahead_c = (o.winograd_band_prefetch if o.simd == "auto" and in_memory(ev, x) and x.dtype == np.float32
               and C > 1 else 0)

    def emit_block(shared: bool) -> None:
        """The block ``blk``: its input transform, GEMMs and output transform (``shared``: in the one region
        of a single block, V shared by the threads, the GEMMs and the output transform per part)."""
        b, t0, nt, ntp, ty0, ty1 = (kc.tmp(n) for n in ("b", "t0", "nt", "ntp", "ty0", "ty1"))
        w.line(f"const long {b} = {blk} / {nblk};")
        w.line(f"const long {t0} = ({blk} % {nblk}) * {T};")
        w.line(f"const long {nt} = {tiles} - {t0} < {T} ? {tiles} - {t0} : {T};")
        w.line(f"const long {ntp} = ({nt} + {QT - 1}) / {QT} * {QT};")
        w.line(f"const long {ty0} = {t0} / {TW};")
        w.line(f"const long {ty1} = ({t0} + {nt} - 1) / {TW};")
        V, M, band, ys, D, E, xo, yo = (kc.tmp(n) for n in ("V", "M", "band", "ystrip", "D", "E", "xoff", "yoff"))
        w.line(f"float* restrict {V} = {shared_v if shared else kc.scratch_ptr('float', off_v)};")
        w.line(f"float* restrict {M} = {kc.scratch_ptr('float', off_m)};")
        w.line(f"float* restrict {band} = {kc.scratch_ptr('float', off_band)};")
        w.line(f"float* restrict {ys} = {kc.scratch_ptr('float', off_y)};")
        w.line(f"float* restrict {D} = {kc.scratch_ptr('float', off_d)};")
        w.line(f"float* restrict {E} = {D} + {A2 * L};")
        w.line(f"long* restrict {xo} = {kc.scratch_ptr('long', off_xo)};")
        w.line(f"long* restrict {yo} = {kc.scratch_ptr('long', off_yo)};")
        # Where each tile's input patch starts in the band and its outputs in the strip; lanes
        # past the block's last tile read the first tile's patch and write past the strip.
        tt, tg = kc.tmp("tt"), kc.tmp("tg")
        with w.block(f"for (long {tt} = 0; {tt} < {ntp}; ++{tt})"):
            w.line(f"const long {tg} = {t0} + ({tt} < {nt} ? {tt} : 0);")
            w.line(f"{xo}[{tt}] = ({tg} / {TW} - {ty0}) * {m * BW} + {tg} % {TW} * {m};")
            w.line(f"{yo}[{tt}] = {tt} < {nt} ? ({tg} / {TW} - {ty0}) * {m * YB} + {tg} % {TW} * {m} : {R * m * YB};")

        # 1. Input transform, per input channel: the band (the block's input rows, zero-padded,
        # the prologue applied), then B^T d B for LANES tiles at a time into V[xi][c][tile].
        # The band's rows outside the image [rlo, rhi) are the same zeros for every channel:
        # written once per block, and the per-channel row loop copies in-image rows only, with
        # no branch in it. (The branch "row outside the image: zero it, continue" was
        # miscompiled by gcc 12.2 at -O3 with AVX2: the loop vectorised across rows zeroed
        # in-image rows too; see tests/codegen/test_winograd.py.)
        c, rr, ih, row, j = (kc.tmp(n) for n in ("c", "rr", "ih", "row", "j"))
        nrow, rlo, rhi = kc.tmp("nrow"), kc.tmp("rlo"), kc.tmp("rhi")
        w.line(f"const long {nrow} = ({ty1} - {ty0}) * {m} + {alpha};")
        w.line(f"const long {rlo} = {PT} - {ty0} * {m} < 0 ? 0 : {PT} - {ty0} * {m} < {nrow} ? "
               f"{PT} - {ty0} * {m} : {nrow};")
        w.line(f"const long {rhi} = {H + PT} - {ty0} * {m} < {rlo} ? {rlo} : {H + PT} - {ty0} * {m} < {nrow} ? "
               f"{H + PT} - {ty0} * {m} : {nrow};")
        w.line(f"for (long {j} = 0; {j} < {rlo} * {BW}; ++{j}) {band}[{j}] = 0.0f;")
        w.line(f"for (long {j} = {rhi} * {BW}; {j} < {nrow} * {BW}; ++{j}) {band}[{j}] = 0.0f;")
        if shared:
            w.line("OPFUSE_PRAGMA(omp for schedule(static))")
        with w.block(f"for (long {c} = 0; {c} < {C}; ++{c})"):
            with w.block(f"for (long {rr} = {rlo}; {rr} < {rhi}; ++{rr})"):
                w.line(f"const long {ih} = {ty0} * {m} - {PT} + {rr};")
                w.line(f"float* restrict {row} = {band} + {rr} * {BW};")
                if ahead_c:  # the same row of a channel ahead, a line at a time (``winograd_band_prefetch``)
                    pj = kc.tmp("pj")
                    at = Index(x.shape, (b, f"{c} + {ahead_c}", ih, pj)).offset()
                    w.line(f"if ({c} + {ahead_c} < {C}) for (long {pj} = 0; {pj} < {W}; {pj} += 16) "
                           f"__builtin_prefetch({kc.ptr(x)} + {at}, 0, 3);")
                jhi = min(BW, W + PL)
                if PL:
                    w.line(f"for (long {j} = 0; {j} < {min(PL, BW)}; ++{j}) {row}[{j}] = 0.0f;")
                with w.block(f"for (long {j} = {min(PL, BW)}; {j} < {jhi}; ++{j})"), ev.scope():
                    v = ev.at(x, Index(x.shape, (b, c, ih, f"{j} - {PL}" if PL else j)))
                    w.line(f"{row}[{j}] = {v};")
                if jhi < BW:
                    w.line(f"for (long {j} = {jhi}; {j} < {BW}; ++{j}) {row}[{j}] = 0.0f;")
            g0, lane, src = kc.tmp("g"), kc.tmp("l"), kc.tmp("src")
            vec = o.simd == "auto" and L == 8 and m in (2, 4)
            with w.block(f"for (long {g0} = 0; {g0} < {ntp}; {g0} += {L})"):
                if vec:  # 8 consecutive tiles of one tile row: transposes in registers
                    w.line(f"#if {AVX2_GUARD}")
                    w.line(f"if ({xo}[{g0} + {L - 1}] - {xo}[{g0}] == {(L - 1) * m}) {{")
                    w.line(f"  const float* restrict {src} = {band} + {xo}[{g0}];")
                    for r in range(alpha):
                        for ln in _gather_avx2(m, f"{src} + {r * BW}", [f"{D} + {(r * alpha + q) * L}"
                                                                       for q in range(alpha)]):
                            w.line("  " + ln)
                    w.line("} else")
                    w.line("#endif")
                with w.block(f"for (long {lane} = 0; {lane} < {L}; ++{lane})"):
                    w.line(f"const float* restrict {src} = {band} + {xo}[{g0} + {lane}];")
                    for r in range(alpha):
                        w.line(" ".join(f"{D}[{(r * alpha + q) * L} + {lane}] = {src}[{r * BW + q}];"
                                        for q in range(alpha)))
                # B^T d (down the columns), then (.) B (across), LANES tiles per vector.
                _lane_stage(w, o.simd, lane, [(f"{E} + {(i * alpha + q) * L}", BT[i],
                                               [f"{D} + {(r * alpha + q) * L}" for r in range(alpha)])
                                              for i in range(alpha) for q in range(alpha)])
                vc = kc.tmp("vc")
                w.line(f"float* restrict {vc} = {V} + {c} * {T} + {g0};")
                _lane_stage(w, o.simd, lane, [(f"{vc} + {(i * alpha + k) * XV}", BT[k],
                                               [f"{E} + {(i * alpha + q) * L}" for q in range(alpha)])
                                              for i in range(alpha) for k in range(alpha)])

        if shared:
            w.line("OPFUSE_PRAGMA(omp for schedule(dynamic, 1))")
        with (w.block(f"for (long {part} = 0; {part} < {parts}; ++{part})") if shared else nullcontext()):
            if shared:
                w.line(f"const long {lo} = {part} * {span};")
                w.line(f"const long {hi} = {lo} + {span} < {OCp} ? {lo} + {span} : {OCp};")
            # 3. Output transform per output channel: A^T M A for LANES tiles at a time into the
            # strip, then the bias and the group's epilogue along each output row of the block.
            def output_transform(oc_lo: str, oc_hi: str) -> None:
                oc = kc.tmp("oc")
                with w.block(f"for (long {oc} = {oc_lo}; {oc} < {oc_hi}; ++{oc})"):
                    g0, lane, mo, dst = kc.tmp("g"), kc.tmp("l"), kc.tmp("mo"), kc.tmp("dst")
                    with w.block(f"for (long {g0} = 0; {g0} < {ntp}; {g0} += {L})"):
                        w.line(f"const float* restrict {mo} = {M} + {oc} * {T} + {g0};")
                        # M A along each row, then A^T (.) down the columns, LANES tiles per vector.
                        _lane_stage(w, o.simd, lane, [(f"{D} + {(i * m + jj) * L}", AT[jj],
                                                       [f"{mo} + {(i * alpha + k) * XM}" for k in range(alpha)])
                                                      for i in range(alpha) for jj in range(m)])
                        _lane_stage(w, o.simd, lane, [(f"{E} + {(a * m + jj) * L}", AT[a],
                                                       [f"{D} + {(i * m + jj) * L}" for i in range(alpha)])
                                                      for a in range(m) for jj in range(m)])
                        if vec:
                            w.line(f"#if {AVX2_GUARD}")
                            w.line(f"if ({yo}[{g0} + {L - 1}] - {yo}[{g0}] == {(L - 1) * m}) {{")
                            for a in range(m):
                                for ln in _scatter_avx2(m, [f"{E} + {(a * m + jj) * L}" for jj in range(m)],
                                                        f"{ys} + {yo}[{g0}] + {a * YB}"):
                                    w.line("  " + ln)
                            w.line("} else")
                            w.line("#endif")
                        with w.block(f"for (long {lane} = 0; {lane} < {L}; ++{lane})"):
                            w.line(f"float* restrict {dst} = {ys} + {yo}[{g0} + {lane}];")
                            for a in range(m):
                                w.line(" ".join(f"{dst}[{a * YB + jj}] = {E}[{(a * m + jj) * L} + {lane}];"
                                                for jj in range(m)))
                    _nonfinite_outputs_direct(kc, ev, node, (b, oc), (ty0, ty1, t0, nt), ys, (m, YB, TW), (g, PT, PL))
                    if flat_epilogue:  # one block of whole rows, stored without padding: the plane is one row
                        _flat_plane_epilogue(kc, ev, stage, node, bias_term, out, (b, oc), ys, OH * OW)
                    else:
                        with _strip_rows(kc, (ty0, ty1, t0, nt), (m, YB, TW), (OH, OW), ys) as (row, oy, first, oxe):
                            def element(x: str, row: str = row, oy: str = oy) -> None:
                                y = kc.tmp("y")
                                w.line(f"const float {y} = {bias_term(ev, node, f'{row}[{x}]', oc)};")
                                finish_element(kc, ev, stage, out, Index(out.shape, (b, oc, oy, x)), y)
                            _epilogue_row(kc, ev, stage, node, (b, oc, oy), (kc.tmp("ox"), first, oxe), row, element)

            # 2. alpha^2 GEMMs on the micro-kernel: M[xi] = U[xi] @ V[xi].
            xi, pc, kb, jr, ir = (kc.tmp(n) for n in ("xi", "pc", "kb", "jr", "ir"))
            fw = from_weights and shared  # ``shared``: this emission is the threads' region (one thread streams U)
            if fw:  # per MR-channel panel and chunk of input channels: their U from the weights, then the GEMMs
                up = kc.tmp("Up")
                w.line(f"float* restrict {up} = {kc.scratch_ptr('float', off_u)};")
                with w.block(f"for (long {ir} = {lo}; {ir} < {hi}; {ir} += {MR})"):
                    # the next panel's weights (the whole convolution's: another part's too) fetched into L2 a
                    # slice a call, while the GEMMs compute: read in the transform alone, they bounded it
                    gn, gl = kc.tmp("gn"), kc.tmp("gl")
                    w.line(f"const int {gl} = {ir} + {MR} < {OCp} ? {g_lines} : 0;")
                    w.line(f"const float* {gn} = {gpack} + ({ir} / {MR} + ({gl} > 0)) * {C * 9 * MR};")
                    # CB input channels at a time: their U (alpha x CB x MR floats a row, alpha^2 x CB x MR without
                    # the row groups) stays in L1 from the transform to the GEMMs; a whole panel's (0.5 MB) went to
                    # L2 and back, a line per store
                    nch = -(-C // CB)
                    for row in range(alpha) if groups else [None]:
                        # the xi this pass computes (a row, or all), U of xi ``first + k`` at ``up + k * XU``
                        first, count = (row * alpha, alpha) if row is not None else (0, A2)
                        rel = f"({xi} - {first})" if first else xi
                        with w.block(f"for (long {pc} = 0; {pc} < {C}; {pc} += {CB})"):
                            w.line(f"const long {kb} = {C} - {pc} < {CB} ? {C} - {pc} : {CB};")
                            emit_u_panel(w, t, f"{gpack} + (({ir} / {MR}) * {C} + {pc}) * {9 * MR}", up, kb, MR,
                                         XU, o.simd, row)
                            with w.block(f"for (long {xi} = {first}; {xi} < {first + count}; ++{xi})"):
                                def fw_call(jr: str, width: int, pass_: int = (row or 0) * nch, rel: str = rel,
                                            count: int = count) -> None:
                                    # the panel's calls numbered in the order they run (each fetches its share of
                                    # the next panel's weights)
                                    call = f"(({f'{pass_} + ' if pass_ else ''}{pc} / {CB}) * {count * jrs} + " \
                                           f"{rel} * {jrs} + {jr} / {NR})"
                                    w.line(f"{ukr_fw if width == NR else kernel(MR, g_step, width)}({kb}, "
                                           f"{up} + {rel} * {XU}, 0, 0, {V} + {xi} * {XV} + {pc} * {T} + {jr}, {T}, "
                                           f"{M} + {xi} * {XM} + {ir} * {T} + {jr}, {T}, {pc} > 0, "
                                           f"{gn} + {call} * {16 * g_lines}, {gl});")
                                columns(ntp, jr, fw_call)
                    # this panel's outputs while its M is in the caches
                    output_transform(ir, f"({ir} + {MR} < {OC} ? {ir} + {MR} : {OC})")
            else:
                with w.block(f"for (long {xi} = 0; {xi} < {A2}; ++{xi})"):
                    with w.block(f"for (long {pc} = 0; {pc} < {C}; {pc} += {KC})"):
                        w.line(f"const long {kb} = {C} - {pc} < {KC} ? {C} - {pc} : {KC};")
                        def panel(jr: str, width: int) -> None:
                            b_ptr = f"{V} + {xi} * {XV} + {pc} * {T} + {jr}"
                            end = hi if not tails else f"({hi} < {body} ? {hi} : {body})"
                            with w.block(f"for (long {ir} = {lo}; {ir} < {end}; {ir} += {MR})"):
                                a_ptr = f"{upack} + (({xi} * {mp} + {ir} / {MR}) * {C} + {pc}) * {MR}" if not tails \
                                    else f"{upack} + ({xi} * {OC} + {ir}) * {C} + {pc} * {MR}"
                                c_ptr = f"{M} + {xi} * {XM} + {ir} * {T} + {jr}"
                                k = ukr if width == NR else kernel(MR, nr=width)
                                w.line(f"{k}({kb}, {a_ptr}, 0, 0, {b_ptr}, {T}, {c_ptr}, {T}, {pc} > 0);")
                            if tails:  # the last part's tail panel
                                with w.block(f"if ({hi} > {body})"):
                                    a_ptr = f"{upack} + ({xi} * {OC} + {body}) * {C} + {pc} * {tails[0]}"
                                    c_ptr = f"{M} + {xi} * {XM} + {body} * {T} + {jr}"
                                    k = ukr_tail if width == NR else kernel(tails[0], nr=width)
                                    w.line(f"{k}({kb}, {a_ptr}, 0, 0, {b_ptr}, {T}, {c_ptr}, {T}, {pc} > 0);")
                        columns(ntp, jr, panel)

            if not fw:
                output_transform(lo, f"({hi} < {OC} ? {hi} : {OC})")

    w.line(f"/* Winograd {t.name}: {TH}x{TW} tiles per image in blocks of {T}, {A2} GEMMs "
           f"[{OC} x {C}] x [{C} x tiles] per block (codegen/winograd.py). */")
    it, blk, part, parts, span, lo, hi = (kc.tmp(n) for n in ("it", "blk", "part", "parts", "span", "lo", "hi"))
    if split:
        # The blocks of the last round, `rem` (fewer than the threads), split in `parts` each, the rest whole.
        rem = kc.tmp("rem")
        w.line(f"const long {rem} = nt <= 1 ? 0 : nt > {units} ? {units} : {units} % nt;")
        w.line(f"const long {parts} = {rem} == 0 ? 1 : (nt + {rem} - 1) / {rem} < {most} ? "
               f"(nt + {rem} - 1) / {rem} : {most};")
        costs = [float(n) / p if k < p else 0.0 for i, n in enumerate(block_tiles)
                 for p in [last_round_parts(o.balance_threads[0], units, most, i)] for k in range(most)]
    elif most > 1:
        w.line(f"const long {parts} = nt <= {units} ? 1 : (nt + {units - 1}) / {units} < {most} ? "
               f"(nt + {units - 1}) / {units} : {most};")
        w.line(f"const long {span} = ({OCp // MR} + {parts} - 1) / {parts} * {MR};")
        costs = [float(n) / most for n in block_tiles for _ in range(most)]
    else:
        costs = [float(n) for n in block_tiles]
    # A single block on several threads: one region, the input transform's channels shared out into one V (thread
    # 0's), then the parts (``winograd_shared_transform``); one thread runs the loop below on its own.
    if shared:
        kc.uses_threads = True
        w.line("if (nt > 1)")
        with w.block(""):
            w.line("OPFUSE_PRAGMA(omp parallel num_threads(nt))")
            with w.block(""):
                w.line(f"const long {blk} = 0;")
                emit_block(True)
        w.line("else")
        noted = len(kc.notes), len(kc._comment_notes)  # the plain loop below notes the same choices again
        # The parts' loop runs min(threads, most) parts: recorded at the first of balance_threads (as the split's).
        parts0 = min(max((o.balance_threads or (2,))[0], 1), most)
        kc.loops += [ParallelLoop(C, work, "static"),
                     ParallelLoop(parts0, work, "dynamic", (float(block_tiles[0]) / parts0,) * parts0)]
    else:
        kc.parallel_for(work, costs=costs)
    with w.block(f"for (long {it} = 0; {it} < {units * most}; ++{it})"):
        if split:
            bparts = kc.tmp("bparts")
            w.line(f"const long {blk} = {it} / {most};")
            w.line(f"const long {part} = {it} % {most};")
            w.line(f"const long {bparts} = {blk} >= {units} - {rem} ? {parts} : 1;")
            w.line(f"if ({part} >= {bparts}) continue;")
            w.line(f"const long {span} = ({OCp // MR} + {bparts} - 1) / {bparts} * {MR};")
            w.line(f"const long {lo} = {part} * {span};")
            w.line(f"const long {hi} = {lo} + {span} < {OCp} ? {lo} + {span} : {OCp};")
        elif most > 1:
            w.line(f"const long {blk} = {it} / {most};")
            w.line(f"const long {part} = {it} % {most};")
            w.line(f"if ({part} >= {parts}) continue;")
            w.line(f"const long {lo} = {part} * {span};")
            w.line(f"const long {hi} = {lo} + {span} < {OCp} ? {lo} + {span} : {OCp};")
        else:
            w.line(f"const long {blk} = {it};")
            w.line(f"const long {lo} = 0, {hi} = {OCp};")
        emit_block(False)
    if shared:
        del kc.notes[noted[0]:], kc._comment_notes[noted[1]:]


@contextmanager
def _strip_rows(kc, block: tuple[str, str, str, str], strip: tuple[int, int, int], out_hw: tuple[int, int], ys: str):
    """The loops over the output rows a block holds in the strip ``ys`` (tile rows ``ty0..ty1`` of the block's tiles
    ``t0, t0 + nt``, ``m`` rows each, the output's last rows only): yields (the row's strip pointer, the output row,
    the row's first and end columns) inside them."""
    w = kc.w
    ty0, ty1, t0, nt = block
    m, YB, TW = strip
    OH, OW = out_hw
    ty, txlo, txhi, a, oy, oxe, row = (kc.tmp(n) for n in ("ty", "txlo", "txhi", "a", "oy", "oxe", "row"))
    with w.block(f"for (long {ty} = {ty0}; {ty} <= {ty1}; ++{ty})"):
        w.line(f"const long {txlo} = {t0} > {ty} * {TW} ? {t0} - {ty} * {TW} : 0;")
        w.line(f"const long {txhi} = {t0} + {nt} - {ty} * {TW} < {TW} ? {t0} + {nt} - {ty} * {TW} : {TW};")
        w.line(f"const long {oxe} = {txhi} * {m} < {OW} ? {txhi} * {m} : {OW};")
        with w.block(f"for (long {a} = 0; {a} < {m}; ++{a})"):
            w.line(f"const long {oy} = {ty} * {m} + {a};")
            w.line(f"if ({oy} >= {OH}) break;")
            w.line(f"float* restrict {row} = {ys} + (({ty} - {ty0}) * {m} + {a}) * {YB};")
            yield row, oy, f"{txlo} * {m}", oxe


def _nonfinite_outputs_direct(kc, ev, node, at: tuple[str, str], block: tuple[str, str, str, str], ys: str,
                              strip: tuple[int, int, int], direct: tuple[str, int, int]) -> None:
    """Recompute directly each output of channel ``at[1]`` in the block's strip ``ys`` that the transforms left
    infinite or NaN. An infinite or NaN input (or a transformed value past the float range) reaches every output of
    its tile through the transforms' differences (inf - inf), where the direct sum gives +-inf, NaN or a finite value
    as the reference does (IEEE, as onnxruntime); every finite output is the Winograd algebra's, exact but for
    rounding: an input that an output does not read enters it only through terms that cancel, and a cancelled
    infinity is NaN, not finite. One vectorisable pass over the strip finds them (none, unless such inputs); the
    direct sums run for those only, in the order (ci, kh, kw), before the bias and the epilogue. ``direct``: the 3x3
    weights' parameter and the top and left padding."""
    w = kc.w
    b, oc = at
    ty0, ty1 = block[:2]
    m, YB = strip[:2]
    g, PT, PL = direct
    x = node.input(0)
    _, C, H, W = x.shape
    OH, OW = node.outputs[0].shape[2:]
    KH, KW = node.input(1).shape[2:]
    bad, ox = kc.tmp("bad"), kc.tmp("ox")
    # The block's tile rows whole (a flat, vectorisable pass): the strip past the block's tiles holds values of
    # earlier blocks, whose non-finite ones cost a second pass (the exact one below), not a wrong result.
    i = kc.tmp("i")
    w.line(f"int {bad} = 0;")
    w.line(f"for (long {i} = 0; {i} < ({ty1} - {ty0} + 1) * {m * YB}; ++{i}) "
           f"{bad} |= !({ys}[{i}] - {ys}[{i}] == 0.0f);")
    with w.block(f"if ({bad})"), _strip_rows(kc, block, strip, (OH, OW), ys) as (v, oy, first, oxe), \
            w.block(f"for (long {ox} = {first}; {ox} < {oxe}; ++{ox})"):
        s, ci, kh, kw, ih, iw = (kc.tmp(n) for n in ("s", "ci", "kh", "kw", "ih", "iw"))
        with w.block(f"if (!({v}[{ox}] - {v}[{ox}] == 0.0f))"):
            w.line(f"float {s} = 0.0f;")
            with w.block(f"for (long {ci} = 0; {ci} < {C}; ++{ci})"), \
                    w.block(f"for (long {kh} = 0; {kh} < {KH}; ++{kh})"):
                w.line(f"const long {ih} = {oy} - {PT} + {kh};")
                w.line(f"if ((unsigned long){ih} >= {H}ul) continue;")
                with w.block(f"for (long {kw} = 0; {kw} < {KW}; ++{kw})"), ev.scope():
                    w.line(f"const long {iw} = {ox} - {PL} + {kw};")
                    w.line(f"if ((unsigned long){iw} >= {W}ul) continue;")
                    xv = ev.at(x, Index(x.shape, (b, ci, ih, iw)))
                    w.line(f"{s} += {xv} * {g}[(({oc} * {C} + {ci}) * {KH} + {kh}) * {KW} + {kw}];")
            w.line(f"{v}[{ox}] = {s};")


def _plane_operands(ev, stage: Stage, out: Value) -> bool:
    """Whether every value the epilogue reads besides the anchor's output and its own results is stored or
    constant (not computed inline, whose inputs would be indexed through it) and, aligned to ``out``'s axes, has
    ``out``'s shape or size 1 along the last two (so an index ``(b, c, 0, p)`` over the flat plane is right)."""
    made = {id(out)} | {id(v) for n in stage.epilogue for v in n.outputs}
    rank = len(out.shape)
    for n in stage.epilogue:
        for v in n.inputs:
            if v is None or id(v) in made:
                continue
            if v.producer is not None and id(v.producer) in ev.inline and id(v) not in ev.static:
                return False
            shape = (1,) * (rank - len(v.shape)) + tuple(v.shape)
            if len(shape) != rank or (shape != tuple(out.shape) and shape[-2:] != (1, 1)):
                return False
    return True


def _flat_plane_epilogue(kc, ev, stage: Stage, node, bias_term, out: Value, where: tuple[str, str], ys: str,
                         n: int) -> None:
    """The bias and the epilogue of output channel ``where = (b, oc)``, its ``n`` results contiguous at ``ys``:
    one row over the plane (``VectorEpilogue.row``, then the scalar elements), the output indexed ``(b, oc, 0,
    p)``."""
    w = kc.w
    b, oc = where
    px = kc.tmp("px")

    def element(x: str) -> None:
        y = kc.tmp("y")
        w.line(f"const float {y} = {bias_term(ev, node, f'{ys}[{x}]', oc)};")
        finish_element(kc, ev, stage, out, Index(out.shape, (b, oc, "0", x)), y)
    _epilogue_row(kc, ev, stage, node, (b, oc, "0"), (px, "0", str(n)), ys, element)
    kc.note(lambda name: f"Winograd '{name}': epilogue over each output plane as one row", stage.anchor_node)


def _epilogue_row(kc, ev, stage: Stage, node, at: tuple[str, str, str], span: tuple[str, str, str], src: str,
                  element: Callable[[str], None]) -> None:
    """The bias and epilogue of the results ``src[x]`` for ``x`` (the C variable ``span[0]``) from ``span[1]`` to
    ``span[2]``, output element ``(b, oc, oy, x)`` for ``at = (b, oc, oy)``: the vector forms where the epilogue
    has them (``VectorEpilogue.row``, each ISA ``#if``-ed), else (and in the plain C build) ``element(x)`` in a
    loop."""
    w = kc.w
    out = node.outputs[0]
    b, oc, oy = at
    x, lo, hi = span
    vepi = _vector_epilogue(kc, ev, stage, out, b, oc, oy)
    for k, isa in enumerate(vepi[1] if vepi is not None else ()):
        w.line(f"#{'if' if k == 0 else 'elif'} {isa.guard}")
        with w.block(""), ev.scope():
            bias = node.inputs[2] if len(node.inputs) > 2 else None  # conv._bias_term's term
            vepi[0].row(isa, x, lo, hi, src, lambda v: v, lambda v: Index(out.shape, (b, oc, oy, v)),
                        ev.at(bias, Index(bias.shape, (oc,))) if bias is not None else None, element, "xx")
    if vepi is not None:
        w.line("#else")
    with w.block(f"for (long {x} = {lo}; {x} < {hi}; ++{x})"), ev.scope():
        element(x)
    if vepi is not None:
        w.line("#endif")


def _vector_epilogue(kc, ev, stage: Stage, out, b: str, oc: str, oy: str):
    """``(VectorEpilogue, ISAs)`` of the output transform's epilogue along an output row, or None (noted)."""
    o = kc.program.options
    isas = simdchain.isas_for(o)
    if not o.vector_epilogue or not isas:
        return None
    vec = VectorEpilogue.plan(kc, ev, stage, out, lambda x: Index(out.shape, (b, oc, oy, x)))
    if isinstance(vec, str):
        kc.note(lambda name, r=vec: f"Winograd '{name}': scalar epilogue loop ({r})", stage.anchor_node)
        return None
    vecmath.require_immintrin(kc.program)
    names = " / ".join(i.name for i in isas)
    kc.note(lambda name: f"Winograd '{name}': epilogue in {names} intrinsics", stage.anchor_node)
    return vec, isas


def direct_flops(node) -> int:
    """Multiply-adds x 2 of the direct convolution (what "effective GFLOP/s" divides by)."""
    wt, out = node.input(1), node.outputs[0]
    return 2 * math.prod(out.shape) * math.prod(wt.shape[1:])
