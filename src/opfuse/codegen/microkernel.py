"""The GEMM micro-kernels: ``C[0:MR, 0:NR] (+)= A[0:MR, 0:kc] @ B[0:kc, 0:NR]`` in registers.

One C function per (MR, NR, operand access), all with one signature so call sites need not
care which they get::

    void NAME(long kc, const float* a, const float* const* ar, const int32_t* koff,
              const float* b, long ldb, float* c, long ldc, int load_c);

How A is read (the side whose elements are broadcast, one row per accumulator row):

* ``packed``: an MR-row panel, k-major (``a[k * MR + i]``), packed at build time or per tile;
* ``rows``: in place, row ``i`` at ``ar[i]`` with unit stride in k (a row-major activation);
* ``koff``: in place, element ``(i, k)`` at ``ar[i][koff[k]]`` (convolution: ``ar[i]`` is the
  output position's window origin in the input, ``koff[k]`` the (channel, tap) offset).

How B is read (the vector side, NR consecutive columns per k):

* ``packed``: an NR-column panel, k-major (``b[k * NR + j]``);
* ``strided``: in place, row ``k`` at ``b + k * ldb`` (a 1x1 convolution reads its input so);
* ``koff``: in place, row ``k`` at ``b + koff[k]`` (a convolution computed channels x positions
  over its phase-split input band, ``conv_direct.py``: ``b`` is the NR positions' first window,
  ``koff[k]`` the (channel, tap) offset; A is then packed, so ``koff`` is B's). With ``b_split``
  (S floats), the panel is NR / S pieces of S columns, piece ``p`` at ``p * ldb`` floats past the first
  (a panel of positions whose pieces lie in different output rows of the band: ``ldb`` is passed per call).

``load_c`` = 0 starts the accumulators at zero (the first K block), 1 adds to ``c``.

With ``simd="auto"`` the body is AVX2/FMA intrinsics under ``#if defined(__AVX2__) &&
defined(__FMA__)`` (MR x NR/8 ymm accumulators; A broadcast, B loaded), and plain C99 in the
``#else`` branch, which gcc vectorises where it can; ``simd="none"`` emits only the plain C
(the microcontroller build). Both sum each element's products in increasing k, so results
do not depend on the tiling; the intrinsics round once per multiply-add (FMA), the plain C
twice (``-ffp-contract=off``), so the two differ by a few ulps of the partial sums.
The text relies on the program preamble (``OPFUSE_PRAGMA``, ``<stdint.h>``).
"""
from __future__ import annotations

import functools
import math
import re

import numpy as np

from opfuse.codegen.ctype import literal
from opfuse.codegen.gelu import GELU_HELPER
from opfuse.codegen.vecmath import AVX2_FLOAT, AVX512_FLOAT, SIGMOID, SILU, TANH, vector_name

A_ACCESS = ("packed", "rows", "koff")
B_ACCESS = ("packed", "strided", "koff")
SIMD_MODES = ("auto", "none")
AVX2_GUARD = "defined(__AVX2__) && defined(__FMA__)"
AVX512_GUARD = "defined(__AVX512F__)"
# aarch64 AdvSIMD (``vector_isa="neon"``): 32 registers of 4 floats; ``vfmaq_laneq_f32`` multiplies B's
# vector by one lane of a loaded A vector, so 4 rows of a packed A panel cost one load, no broadcast.
NEON_GUARD = "defined(__aarch64__) && defined(__ARM_NEON)"
NEON_FLOATS = 4
NEON_REGISTERS = 32
YMM_FLOATS = 8
YMM_REGISTERS = 16
ZMM_FLOATS = 16
ZMM_REGISTERS = 32
# Fewest zmm accumulators for the AVX-512 body: with fewer independent multiply-add chains than
# the FMA latency times the FMA ports (4 x 2 on Zen 4), the loop waits on its own results. A
# single-row block (1 x 48: 3 zmm chains) keeps the AVX2 body (6 ymm chains): mobilenet_v1's fc
# (1x1024 @ 1024x1000) ran 1.13-1.28x slower with 3 zmm chains (1 thread, CPU time).
MIN_ZMM_ACCUMULATORS = 8

# Never inlined: a micro-kernel inlined into a kernel's loop nest had its accumulators spilled
# to the stack when the nest was itself inlined (no OpenMP outlining): 3.6 ms instead of 2.1
# for a resnet18 3x3 convolution. A call per micro-tile and K block costs nothing by comparison.
NOINLINE = """\
#ifndef OPFUSE_NOINLINE
#if defined(__GNUC__)
#define OPFUSE_NOINLINE __attribute__((noinline))
#else
#define OPFUSE_NOINLINE
#endif
#endif
"""

SIGNATURE = ("(long kc, const float* restrict a, const float* const* restrict ar, const int32_t* restrict koff, "
             "const float* restrict b, long ldb, float* restrict c, long ldc, int load_c)")
# The storing variant (``epilogue``): the block's last K steps, then ``y = acc (+ bias[i])``, Relu where
# asked, stored to ``out[i * ldo + j]`` instead of ``c`` (which ``load_c`` still reads from). Its
# ``transposed`` form adds ``bias[j]`` (a column's) and stores ``y`` to ``out[j * ldo + i]``: a GEMM of
# positions x channels (a convolution over its windows) whose output runs along the positions.
SIGNATURE_STORE = SIGNATURE[:-1] + ", const float* restrict bias, float* restrict out, long ldo)"
# The storing variant with a residual (an epilogue code with "a"): after the bias, ``y = res[i * ldo + j] + y``, the
# residual laid out as the output; ``res`` may be ``out`` itself (a residual Add done in place), so neither is
# restrict-qualified (every element is read before it is stored, by the same statement's operands). The x86 bodies
# prefetch the block's residual lines before their k loop: bert_layer's attention_output and output_dense (K = 768,
# 3072) read them unprefetched after it at +21 and +25 us on the Zen 5 host; with the prefetch, against the C tile's
# epilogue on this AVX-512 host (kernel timers, 40 rounds, twice): -24 to -26 and -6 to -32 us at 1 thread, -14 to
# -15 and -39 at 2.
SIGNATURE_RESIDUAL = SIGNATURE[:-1] + ", const float* restrict bias, float* out, long ldo, const float* res)"
# Either signature with ``b_next``: after ``load_c``, ``bnl`` lines of 16 floats from ``bn`` (a part of the next
# packed B panel the caller will read, or of the next panel's 3x3 weights of a Winograd convolution computing U from
# them) prefetched into L2 while the block is computed, one line every ``b_next`` k steps.
NEXT_PARAMS = ", const float* restrict bn, long bnl"
# Either signature with ``b_copy`` (B ``strided``: read in place): after ``load_c``, the panel ``bp`` the call writes
# B's rows into as it reads them, in the packed layout (row ``k`` at ``bp + k * NR``), for the calls after it on
# that panel to read packed (``gemm.pack_in_kernel``).
COPY_PARAMS = ", float* restrict bp"
EPILOGUES = ("", "b", "r", "br", "c", "cr")  # none / row bias / Relu / row bias then Relu / column bias (x86, not
# transposed: ``bias[j]`` of the block's columns, a MatMul's bias along N; the caller passes ``bias`` at the block's
# first column) / column bias then Relu
# Activations the storing variant applies after the bias instead of the Relu (an epilogue code's last letter;
# x86 bodies and plain C only): the scalar rules' expressions of y (``rules.py``), and on the vector bodies the same
# operations in the same order on the vector forms of their helpers (``simdchain``'s: the same bits), which the
# program must define before the kernel (``gemm.register_epilogue``). Letter -> (op, Gelu's approximate, helper).
# Silu has two: "u" its direct form ``x / (1 + exp(-x))`` (``CodegenOptions.silu_direct``), "w" ``x * sigmoid(x)``.
ACTIVATIONS = {"s": ("Sigmoid", None, SIGMOID), "u": ("Silu", None, SILU), "w": ("Silu", None, SIGMOID),
               "t": ("Tanh", None, TANH), "g": ("Gelu", "tanh", SIGMOID), "e": ("Gelu", "none", GELU_HELPER)}
GELU_TANH_SCALE, GELU_TANH_CUBE = 2 * math.sqrt(2 / math.pi), 0.044715


def valid_epilogue(epi: str) -> bool:
    """An epilogue code: an optional bias ("b" a row's, "c" a column's), an optional residual ("a": ``res``'s
    element added, ``SIGNATURE_RESIDUAL``), then an optional Relu ("r") or one letter of ``ACTIVATIONS``: the
    ``EPILOGUES`` and their forms with a residual or an activation."""
    return re.fullmatch(f"[bc]?a?[r{''.join(ACTIVATIONS)}]?", epi) is not None


def activation(epi: str, y: str, isa: str | None = None) -> str:
    """The variable ``y`` through the epilogue's activation (none: ``y``), scalar C, or on ``isa``'s registers."""
    if epi[-1:] not in ACTIVATIONS:
        return y
    op, approximate, helper = ACTIVATIONS[epi[-1]]
    c = functools.partial(literal, dtype=np.float32)
    if isa is None:
        f = helper
        if op == "Gelu" and approximate == "tanh":  # rules._gelu: x sigmoid(2z)
            return f"{y} * {f}({c(GELU_TANH_SCALE)} * ({y} + {c(GELU_TANH_CUBE)} * ({y} * {y} * {y})))"
        return f"{y} * {f}({y})" if op == "Silu" and helper == SIGMOID else f"{f}({y})"
    vi = AVX512_FLOAT if isa == "avx512" else AVX2_FLOAT
    p, s = vi.op, vi.set1
    f = vector_name(helper, vi)
    if op == "Gelu" and approximate == "tanh":  # simdchain._gelu, the same operations
        x3 = p("mul_ps", p("mul_ps", y, y), y)
        z2 = p("mul_ps", s(c(GELU_TANH_SCALE)), p("add_ps", y, p("mul_ps", s(c(GELU_TANH_CUBE)), x3)))
        return p("mul_ps", y, f"{f}({z2})")
    return p("mul_ps", y, f"{f}({y})") if op == "Silu" and helper == SIGMOID else f"{f}({y})"


def _finish_plain(epi: str, value: str, i: str, at: str = "") -> list[str]:
    """Plain C of the storing variant's epilogue on ``value`` (bias index ``i``; ``at``: the element's offset in
    ``res``): the same operations, in the same order, as the generated epilogue (``acc + bias``, the residual's
    ``res + y``, then ``y < 0 ? 0 : y``), so the bits agree."""
    lines = [f"float y = {value};"]
    if "b" in epi or "c" in epi:
        lines.append(f"y = y + bias[{i}];")
    if "a" in epi:
        lines.append(f"y = res[{at}] + y;")
    if "r" in epi:
        lines.append("y = (y < 0.0f ? 0.0f : y);")
    if epi[-1:] in ACTIVATIONS:
        lines.append(f"y = {activation(epi, 'y')};")
    return lines


def fits_avx2(mr: int, nr: int) -> bool:
    """MR x NR/8 accumulators, NR/8 B vectors and one broadcast fit the 16 ymm registers."""
    if nr % YMM_FLOATS:
        return False
    nv = nr // YMM_FLOATS
    return mr * nv + nv + 1 <= YMM_REGISTERS


def fits_avx512(mr: int, nr: int) -> bool:
    """MR x NR/16 accumulators, NR/16 B vectors and one broadcast fit the 32 zmm registers, and
    there are at least ``MIN_ZMM_ACCUMULATORS`` accumulators."""
    if nr % ZMM_FLOATS:
        return False
    nv = nr // ZMM_FLOATS
    return MIN_ZMM_ACCUMULATORS <= mr * nv and mr * nv + nv + 1 <= ZMM_REGISTERS


def fits_neon(mr: int, nr: int) -> bool:
    """MR x NR/4 accumulators, NR/4 B vectors and the A values (ceil(MR/4) vectors) fit the 32 q registers."""
    if nr % NEON_FLOATS:
        return False
    nv = nr // NEON_FLOATS
    return mr * nv + nv + -(-mr // NEON_FLOATS) <= NEON_REGISTERS


def name(mr: int, nr: int, a: str = "packed", b: str = "packed") -> str:
    return f"opfuse_ukr_{mr}x{nr}_{a}_{b}"


def _a_elem(a: str, mr: int, i: int, k: str) -> str:
    """C expression of A[i, k] (a float, not a pointer)."""
    if a == "packed":
        return f"a[{k} * {mr} + {i}]"
    if a == "rows":
        return f"ar[{i}][{k}]"
    return f"a{i}[koff[{k}]]"


def _window_rows(first: int, count: int, step: int) -> list[str]:
    """The ``koff`` access's row pointers ``a0``... for rows ``[first, first + count)``: ``ar[i]``, or with a
    ``step`` ``ar[0] + i * step`` (the rows are one output row's positions, ``step`` floats apart: one
    pointer register and constant displacements instead of a register per row)."""
    if step:
        return [f"  const float* restrict a{i} = ar[0] + {(first + i) * step};" for i in range(count)]
    return [f"  const float* restrict a{i} = ar[{first + i}];" for i in range(count)]


def _a_ptr(a: str, mr: int, i: int) -> str:
    """C expression of &A[i, k] inside the intrinsics' k loop (``k`` and ``o`` in scope)."""
    if a == "packed":
        return f"a + {i}"
    if a == "rows":
        return f"a{i} + k"
    return f"a{i} + o"


def _b_row(b: str, nr: int) -> str:
    if b == "koff":
        return "b + koff[k]"
    return "b + k * ldb" if b == "strided" else f"b + k * {nr}"


def _b_col(col: int, split: int) -> str:
    """Offset of column ``col`` of a B row from ``bk`` (``b_split``: piece ``col / split`` is ``ldb`` floats on)."""
    if not split or col < split:
        return str(col)
    piece, rest = divmod(col, split)
    return f"{'' if piece == 1 else f'{piece} * '}ldb{f' + {rest}' if rest else ''}"


def _plain(mr: int, nr: int, a: str, b: str, epi: str | None = None, transposed: bool = False,
           a_step: int = 0, b_split: int = 0, b_copy: bool = False) -> list[str]:
    lines = [f"  float acc[{mr}][{nr}];"]
    if a == "koff":
        lines += _window_rows(0, mr, a_step)
    lines += [
        f"  for (int i = 0; i < {mr}; ++i)",
        f"    for (int j = 0; j < {nr}; ++j) acc[i][j] = load_c ? c[i * ldc + j] : 0.0f;",
        "  for (long k = 0; k < kc; ++k) {",
        f"    const float* restrict bk = {_b_row(b, nr)};",
    ]
    if b_copy:
        lines.append(f"    for (int j = 0; j < {nr}; ++j) bp[k * {nr} + j] = bk[j];")
    # "unroll 1" keeps gcc from unrolling the j loop into scalar statements and re-vectorising
    # them badly (6 x 16 ran at 2 GFLOP/s so, at 98 with the j loop kept as one vector loop).
    for i in range(mr):
        bj = f"bk[(j / {b_split}) * ldb + j % {b_split}]" if b_split else "bk[j]"
        lines += [f"    {{ const float ai = {_a_elem(a, mr, i, 'k')};",
                  "      OPFUSE_PRAGMA(GCC unroll 1)",
                  f"      for (int j = 0; j < {nr}; ++j) acc[{i}][j] += ai * {bj}; }}"]
    lines.append("  }")
    if epi is None:
        lines += [f"  for (int i = 0; i < {mr}; ++i)",
                  f"    for (int j = 0; j < {nr}; ++j) c[i * ldc + j] = acc[i][j];"]
    elif transposed:
        lines += [f"  for (int j = 0; j < {nr}; ++j)",
                  f"    for (int i = 0; i < {mr}; ++i) {{ {' '.join(_finish_plain(epi, 'acc[i][j]', 'j'))} "
                  "out[j * ldo + i] = y; }"]
    else:
        finish = " ".join(_finish_plain(epi, "acc[i][j]", "j" if "c" in epi else "i", "i * ldo + j"))
        lines += [f"  for (int i = 0; i < {mr}; ++i)",
                  f"    for (int j = 0; j < {nr}; ++j) {{ {finish} out[i * ldo + j] = y; }}"]
    return lines


def _plain_scalars(mr: int, nr: int, a: str, b: str, a_step: int = 0) -> list[str]:
    """``_plain`` with the accumulators and the k step's A values as named scalars."""
    acc = [[f"c{i}_{j}" for j in range(nr)] for i in range(mr)]
    lines = _window_rows(0, mr, a_step) if a == "koff" else []
    for i in range(mr):
        lines.append("  float " + ", ".join(f"{acc[i][j]} = load_c ? c[{i} * ldc + {j}] : 0.0f" for j in range(nr))
                     + ";")
    lines += ["  for (long k = 0; k < kc; ++k) {",
              f"    const float* restrict bk = {_b_row(b, nr)};",
              "    " + " ".join(f"const float v{i} = {_a_elem(a, mr, i, 'k')};" for i in range(mr))]
    for j in range(nr):
        lines.append(f"    {{ const float bj = bk[{j}]; " + " ".join(f"{acc[i][j]} += v{i} * bj;" for i in range(mr))
                     + " }")
    lines.append("  }")
    for i in range(mr):
        lines.append("  " + " ".join(f"c[{i} * ldc + {j}] = {acc[i][j]};" for j in range(nr)))
    return lines


def _vector_body(isa: str, mr: int, nr: int, a: str, b: str, prefetch: int = 0, i0: int = 0, rows: int = 0,
                 j0: int = 0, cols: int = 0, epi: str | None = None, transposed: bool = False,
                 a_step: int = 0, b_split: int = 0, a_prefetch: int = 0, k_unroll: int = 0,
                 b_next: int = 0, b_copy: bool = False) -> list[str]:
    """Intrinsics for the sub-block rows ``[i0, i0 + rows)`` x columns ``[j0, j0 + cols)`` of the
    MR x NR block (all of it by default): accumulators in ``isa``'s registers, one k loop, unrolled
    ``k_unroll`` times where that is above 1 (``CodegenOptions.gemm_k_unroll``).
    ``a_prefetch`` (packed A): A's line ``a_prefetch`` k steps ahead, prefetched each step.
    ``b_next`` (the first sub-block only): line ``k / b_next`` of ``bn`` prefetched into L2 at each k step that
    ``b_next`` divides, while that is below ``bnl`` (``NEXT_PARAMS``). ``b_copy`` (the sub-blocks of the first
    rows: each column once): the B vectors loaded at each k step stored to ``bp`` as well (``COPY_PARAMS``)."""
    if b_split:
        return _split_body(isa, mr, nr, a, b, prefetch, i0, rows, j0, cols, epi, transposed, a_step, b_split,
                           k_unroll)
    vec, ps, width = ("__m512", "_mm512", ZMM_FLOATS) if isa == "avx512" else ("__m256", "_mm256", YMM_FLOATS)
    rows, cols = rows or mr, cols or nr
    nv = cols // width
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(rows)]
    ci = [f"c + {i0 + i} * ldc + {j0 + v * width}" for i in range(rows) for v in range(nv)]
    flat = [x for row in acc for x in row]
    lines = [f"  {vec} {', '.join(flat)};"]
    if a == "packed":
        lines.append(f"  const float* restrict ak = a + {i0};")
    elif a == "koff":
        lines += _window_rows(i0, rows, a_step)
    else:
        lines += [f"  const float* restrict a{i} = ar[{i0 + i}];" for i in range(rows)]
    lines.append("  if (load_c) {")
    lines += [f"    {x} = {ps}_loadu_ps({p});" for x, p in zip(flat, ci, strict=True)]
    lines.append("  } else {")
    lines += [f"    {x} = {ps}_setzero_ps();" for x in flat]
    lines.append("  }")
    if epi is not None and "a" in epi and not transposed:  # the residual's lines, read after the k loop
        lines += [f"  _mm_prefetch((const char*)(res + {i0 + i} * ldo + {j0 + c}), _MM_HINT_T0);"
                  for i in range(rows) for c in range(0, cols, 16)]
    if k_unroll > 1:
        lines.append(f"  OPFUSE_PRAGMA(GCC unroll {k_unroll})")
    lines.append("  for (long k = 0; k < kc; ++k) {")
    if a == "koff":
        lines.append("    const long o = koff[k];")
        if prefetch:  # the first and last rows' windows: the lines the next steps broadcast from
            lines += [f"    _mm_prefetch((const char*)(a0 + koff[k + {prefetch}]), _MM_HINT_T0);",
                      f"    _mm_prefetch((const char*)(a{rows - 1} + koff[k + {prefetch}]), _MM_HINT_T0);"]
    if a_prefetch and a == "packed":  # past this panel's end, the next one's (A's panels follow each other)
        lines.append(f"    _mm_prefetch((const char*)(ak + {a_prefetch * mr}), _MM_HINT_T0);")
    if b_next and i0 == 0 and j0 == 0:  # spread over the k loop: a burst of them stalls on the misses
        at = "k" if b_next == 1 else f"k / {b_next}"
        when = f"{at} < bnl" if b_next == 1 else f"k % {b_next} == 0 && {at} < bnl"
        lines.append(f"    if ({when}) _mm_prefetch((const char*)(bn + {at} * 16), _MM_HINT_T1);")
    lines.append(f"    const float* restrict bk = {_b_row(b, nr)}{f' + {j0}' if j0 else ''};")
    if prefetch and b == "koff":  # the row the table names ``prefetch`` steps ahead
        lines += [f"    _mm_prefetch((const char*)(b + koff[k + {prefetch}] + {j0 + 16 * v}), _MM_HINT_T0);"
                  for v in range(-(-cols // 16))]
    elif prefetch:
        ahead = f"{prefetch} * ldb" if b == "strided" else str(prefetch * nr)
        lines += [f"    _mm_prefetch((const char*)(bk + {ahead} + {16 * v}), _MM_HINT_T0);"
                  for v in range(-(-cols // 16))]
    lines += [f"    const {vec} b{v} = {ps}_loadu_ps(bk + {v * width});" for v in range(nv)]
    if b_copy and i0 == 0:
        lines += [f"    {ps}_storeu_ps(bp + k * {nr} + {j0 + v * width}, b{v});" for v in range(nv)]
    bcast = "_mm512_set1_ps(*({p}))" if isa == "avx512" else "_mm256_broadcast_ss({p})"
    for i in range(rows):
        ptr = "ak + " + str(i) if a == "packed" else _a_ptr(a, mr, i)
        fmas = " ".join(f"{acc[i][v]} = {ps}_fmadd_ps(ai, b{v}, {acc[i][v]});" for v in range(nv))
        lines.append(f"    {{ const {vec} ai = {bcast.format(p=ptr)}; {fmas} }}")
    if a == "packed":
        lines.append(f"    ak += {mr};")
    lines.append("  }")
    if epi is None:
        lines += [f"  {ps}_storeu_ps({p}, {x});" for x, p in zip(flat, ci, strict=True)]
        return lines
    # The storing variant: max(0, y) returns y where y is NaN or -0, as ``y < 0 ? 0 : y`` does.
    if "r" in epi:
        lines.append(f"  const {vec} zero = {ps}_setzero_ps();")
    if transposed:
        return lines + _store_transposed(isa, acc, i0, j0, epi)
    if "c" in epi:  # the block's columns' bias, loaded once for every row
        lines += [f"  const {vec} cbias{v} = {ps}_loadu_ps(bias + {j0 + v * width});" for v in range(nv)]
    for i in range(rows):
        if "b" in epi:
            lines.append(f"  const {vec} bias{i} = {ps}_set1_ps(bias[{i0 + i}]);")
        for v in range(nv):
            y = acc[i][v]
            if "b" in epi:
                y = f"{ps}_add_ps({y}, bias{i})"
            if "c" in epi:
                y = f"{ps}_add_ps({y}, cbias{v})"
            if "a" in epi:
                y = f"{ps}_add_ps({ps}_loadu_ps(res + {i0 + i} * ldo + {j0 + v * width}), {y})"
            if "r" in epi:
                y = f"{ps}_max_ps(zero, {y})"
            at = f"out + {i0 + i} * ldo + {j0 + v * width}"
            if epi[-1:] in ACTIVATIONS:  # y named: an activation reads it more than once
                lines.append(f"  {{ const {vec} y = {y}; {ps}_storeu_ps({at}, {activation(epi, 'y', isa)}); }}")
            else:
                lines.append(f"  {ps}_storeu_ps({at}, {y});")
    return lines


def _split_body(isa: str, mr: int, nr: int, a: str, b: str, prefetch: int, i0: int, rows: int, j0: int, cols: int,
                epi: str | None, transposed: bool, a_step: int, b_split: int, k_unroll: int = 0) -> list[str]:
    """``_vector_body`` with B's row in pieces of ``b_split`` columns, piece ``p`` at ``bk + p * ldb``: the
    same text but for B's loads and prefetches (a vector never straddles two pieces)."""
    width = ZMM_FLOATS if isa == "avx512" else YMM_FLOATS
    assert b == "koff" and b_split % width == 0 and nr % b_split == 0, (b, b_split, nr)
    lines = _vector_body(isa, mr, nr, a, b, 0, i0, rows, j0, cols, epi, transposed, a_step, k_unroll=k_unroll)
    ps = "_mm512" if isa == "avx512" else "_mm256"
    cols = cols or nr
    head = f"    const float* restrict bk = {_b_row(b, nr)}{f' + {j0}' if j0 else ''};"
    at = lines.index(head)
    new = ["    const float* restrict bk = b + koff[k];"]
    if prefetch:  # one line per piece's 16 floats, ``prefetch`` steps ahead
        new += [f"    _mm_prefetch((const char*)(b + koff[k + {prefetch}] + {_b_col(j0 + c, b_split)}), _MM_HINT_T0);"
                for c in range(0, cols, 16)]
    new += [f"    const {'__m512' if isa == 'avx512' else '__m256'} b{v} = {ps}_loadu_ps(bk + "
            f"{_b_col(j0 + v * width, b_split)});" for v in range(cols // width)]
    end = at + 1
    while lines[end].lstrip().startswith(("_mm_prefetch", "const __m")):
        end += 1
    return lines[:at] + new + lines[end:]


def _transpose8(src: list[str]) -> list[str]:
    """C statements that turn the 8 ymm rows ``src`` into the 8 columns ``o0``-``o7`` (unpack, shuffle,
    then 128-bit lane permutes, as ``transpose_helper``)."""
    lines = [f"    const __m256 r{r} = {src[r]};" for r in range(8)]
    for q in range(4):
        a, b = 2 * q, 2 * q + 1
        lines.append(f"    const __m256 t{a} = _mm256_unpacklo_ps(r{a}, r{b}), t{b} = _mm256_unpackhi_ps(r{a}, r{b});")
    for q in range(2):  # rows 0-3, then 4-7
        for e in range(2):
            t0, t1, u = 4 * q + e, 4 * q + e + 2, 4 * q + 2 * e
            lines.append(f"    const __m256 u{u} = _mm256_shuffle_ps(t{t0}, t{t1}, 0x44), "
                         f"u{u + 1} = _mm256_shuffle_ps(t{t0}, t{t1}, 0xEE);")
    # column c: u(c % 4) holds it for rows 0-3 and u(c % 4 + 4) for rows 4-7, in one 128-bit half each
    for c in range(8):
        lines.append(f"    const __m256 o{c} = _mm256_permute2f128_ps(u{c % 4}, u{c % 4 + 4}, "
                     f"{'0x20' if c < 4 else '0x31'});")
    return lines


def _partial_store(n: int) -> str:
    """A statement storing the first ``n`` (1-7) lanes of the ymm ``v`` to ``p``: by 4, 2 and 1 lanes
    (plain SSE stores; masked stores measured slower: pw13's 7x7 layer 1.04x its time)."""
    parts = ["const __m128 lo_ = _mm256_castps256_ps128(v), hi_ = _mm256_extractf128_ps(v, 1);"]
    src, off, rest = "lo_", 0, n
    if n >= 4:
        parts.append("_mm_storeu_ps(p, lo_);")
        src, off, rest = "hi_", 4, n - 4
    if rest >= 2:
        parts.append(f"_mm_storel_pi((__m64*)((p) + {off}), {src});")
        src, off, rest = f"_mm_movehl_ps({src}, {src})", off + 2, rest - 2
    if rest:
        parts.append(f"_mm_store_ss((p) + {off}, {src});")
    return "do { " + " ".join(parts) + " } while (0)"


def _store_transposed(isa: str, acc: list[list[str]], i0: int, j0: int, epi: str) -> list[str]:
    """The transposed storing variant's end: each accumulator (a vector of columns of one row) gets
    its columns' bias and the Relu, then runs of 8 rows x 8 columns are transposed in ymm registers
    (an AVX-512 accumulator gives two: its halves) and stored as 8 columns of up to 8 consecutive
    rows, ``out[j * ldo + i]``; a run of fewer rows repeats its last row in the unused lanes and
    stores only its own (``_partial_store``)."""
    vec, ps, width = ("__m512", "_mm512", ZMM_FLOATS) if isa == "avx512" else ("__m256", "_mm256", YMM_FLOATS)
    rows, nv = len(acc), len(acc[0])
    lines = []
    for v in range(nv):
        if "b" in epi:
            lines.append(f"  const {vec} bias{v} = {ps}_loadu_ps(bias + {j0 + v * width});")
        for i in range(rows):
            y = acc[i][v]
            if "b" in epi:
                y = f"{ps}_add_ps({y}, bias{v})"
            if "r" in epi:
                y = f"{ps}_max_ps(zero, {y})"
            if y != acc[i][v]:
                lines.append(f"  {acc[i][v]} = {y};")
            if epi[-1:] in ACTIVATIONS:
                lines.append(f"  {acc[i][v]} = {activation(epi, acc[i][v], isa)};")

    def half(x: str, h: int) -> str:  # 8 columns of an accumulator as a ymm register
        if isa != "avx512":
            return x
        return f"_mm512_castps512_ps256({x})" if h == 0 else \
            f"_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd({x}), 1))"

    for g0 in range(0, rows, 8):
        n = min(8, rows - g0)
        if n < 8:  # the first n lanes of each stored column
            lines.append(f"#define OPFUSE_TSTORE(p, v) {_partial_store(n)}")
        else:
            lines.append("#define OPFUSE_TSTORE(p, v) _mm256_storeu_ps(p, v)")
        for v in range(nv):
            for h in range(width // YMM_FLOATS):
                col = j0 + v * width + h * YMM_FLOATS
                src = [half(acc[g0 + min(r, n - 1)][v], h) for r in range(8)]
                lines += ["  {", *_transpose8(src), f"    float* restrict o = out + {col} * ldo + {i0 + g0};"]
                lines += [f"    OPFUSE_TSTORE(o + {c} * ldo, o{c});" for c in range(8)]
                lines.append("  }")
        lines.append("#undef OPFUSE_TSTORE")
    return lines


def _avx2(mr: int, nr: int, a: str, b: str, prefetch: int = 0, epi: str | None = None,
          transposed: bool = False, a_step: int = 0, b_split: int = 0, a_prefetch: int = 0,
          k_unroll: int = 0, b_next: int = 0, b_copy: bool = False) -> list[str]:
    """The AVX2/FMA body: one pass over k when the block fits the 16 ymm registers
    (``fits_avx2``), else one pass per sub-block of ``avx2_split`` (a block laid out for
    AVX-512, compiled where the C compiler does not target it: the same panels, read by
    parts; each element still sums its products in increasing k)."""
    if fits_avx2(mr, nr):
        return _vector_body("avx2", mr, nr, a, b, prefetch, epi=epi, transposed=transposed, a_step=a_step,
                            b_split=b_split, a_prefetch=a_prefetch, k_unroll=k_unroll, b_next=b_next, b_copy=b_copy)
    rs, cs = avx2_split(mr, nr)
    lines: list[str] = []
    for i0 in range(0, mr, rs):
        for j0 in range(0, nr, cs):
            lines += ["  {", *("  " + x if not x.startswith("#") else x
                               for x in _vector_body("avx2", mr, nr, a, b, prefetch, i0, min(rs, mr - i0),
                                                     j0, cs, epi, transposed, a_step, b_split,
                                                     k_unroll=k_unroll, b_next=b_next, b_copy=b_copy)), "  }"]
    return lines


def _neon_body(mr: int, nr: int, a: str, b: str, i0: int = 0, rows: int = 0, epi: str | None = None) -> list[str]:
    """AdvSIMD intrinsics for the rows ``[i0, i0 + rows)`` of the MR x NR block (all of it by default): NR/4
    q-register accumulators per row, one k loop. A packed panel's values are loaded 4 (``vld1q_f32``), 2
    (``vld1_f32``) or 1 at a time and multiplied in by lane (``vfmaq_laneq_f32`` / ``vfmaq_lane_f32``), never
    read past the row's MR values; A read in place (rows, offset table) is one scalar per row
    (``vfmaq_n_f32``). Each is one fused multiply-add per element, as AVX2's ``vfmadd``: the same bits."""
    rows = rows or mr
    nv = nr // NEON_FLOATS
    acc = [[f"c{i}_{v}" for v in range(nv)] for i in range(rows)]
    flat = [x for row in acc for x in row]
    ci = [f"c + {i0 + i} * ldc + {v * NEON_FLOATS}" for i in range(rows) for v in range(nv)]
    lines = [f"  float32x4_t {', '.join(flat)};"]
    if a == "packed":
        lines.append(f"  const float* restrict ak = a + {i0};")
    else:
        lines += [f"  const float* restrict a{i} = ar[{i0 + i}];" for i in range(rows)]
    lines.append("  if (load_c) {")
    lines += [f"    {x} = vld1q_f32({p});" for x, p in zip(flat, ci, strict=True)]
    lines.append("  } else {")
    lines += [f"    {x} = vdupq_n_f32(0.0f);" for x in flat]
    lines.append("  }")
    lines.append("  for (long k = 0; k < kc; ++k) {")
    if a == "koff":
        lines.append("    const long o = koff[k];")
    lines.append(f"    const float* restrict bk = {_b_row(b, nr)};")
    lines += [f"    const float32x4_t b{v} = vld1q_f32(bk + {v * NEON_FLOATS});" for v in range(nv)]
    if a == "packed":
        i = 0
        while i < rows:
            n = 4 if rows - i >= 4 else 2 if rows - i >= 2 else 1
            if n == 4:
                lines.append(f"    {{ const float32x4_t av = vld1q_f32(ak + {i});")
                fma = "vfmaq_laneq_f32({acc}, b{v}, av, {lane})"
            elif n == 2:
                lines.append(f"    {{ const float32x2_t av = vld1_f32(ak + {i});")
                fma = "vfmaq_lane_f32({acc}, b{v}, av, {lane})"
            else:
                lines.append(f"    {{ const float av = ak[{i}];")
                fma = "vfmaq_n_f32({acc}, b{v}, av)"
            for lane in range(n):
                row = acc[i + lane]
                lines.append("      " + " ".join([f"{row[v]} = {fma.format(acc=row[v], v=v, lane=lane)};"
                                                      for v in range(nv)]))
            lines.append("    }")
            i += n
        lines.append(f"    ak += {mr};")
    else:
        for i in range(rows):
            ptr = _a_ptr(a, mr, i)
            fmas = " ".join(f"{acc[i][v]} = vfmaq_n_f32({acc[i][v]}, b{v}, ai);" for v in range(nv))
            lines.append(f"    {{ const float ai = *({ptr}); {fmas} }}")
    lines.append("  }")
    if epi is None:
        lines += [f"  vst1q_f32({p}, {x});" for x, p in zip(flat, ci, strict=True)]
        return lines
    # The storing variant: Relu as ``y < 0 ? 0 : y`` by a compare and a select (FMAX would turn -0 into +0).
    if "r" in epi:
        lines.append("  const float32x4_t zero = vdupq_n_f32(0.0f);")
    for i in range(rows):
        if "b" in epi:
            lines.append(f"  const float32x4_t bias{i} = vdupq_n_f32(bias[{i0 + i}]);")
        for v in range(nv):
            y = acc[i][v]
            if "b" in epi:
                y = f"vaddq_f32({y}, bias{i})"
            if "r" in epi:
                at = f"out + {i0 + i} * ldo + {v * NEON_FLOATS}"
                relu = "vbslq_f32(vcltq_f32(y, zero), zero, y)"
                lines.append(f"  {{ const float32x4_t y = {y}; vst1q_f32({at}, {relu}); }}")
            else:
                lines.append(f"  vst1q_f32(out + {i0 + i} * ldo + {v * NEON_FLOATS}, {y});")
    return lines


def _neon(mr: int, nr: int, a: str, b: str, epi: str | None = None) -> list[str]:
    """The AdvSIMD body: one pass over k where the block fits the 32 q registers (``fits_neon``), else one pass
    per group of rows that does (a block laid out for AVX-512 compiled for aarch64: the same panels)."""
    if fits_neon(mr, nr):
        return _neon_body(mr, nr, a, b, epi=epi)
    rs = max(r for r in range(1, mr + 1) if fits_neon(r, nr))
    rs = -(-mr // -(-mr // rs))  # the rows split evenly
    lines: list[str] = []
    for i0 in range(0, mr, rs):
        lines += ["  {", *("  " + x for x in _neon_body(mr, nr, a, b, i0, min(rs, mr - i0), epi)), "  }"]
    return lines


def avx2_split(mr: int, nr: int) -> tuple[int, int]:
    """(rows, columns) of the sub-blocks an MR x NR block (NR a multiple of 8) is computed in with
    AVX2: the fewest passes over k, rows split evenly (no short last pass with too few
    accumulators to hide the FMA latency), then the most accumulators per pass, then the fewest
    loads and broadcasts per k. 8 x 32: four passes of 4 x 16; 12 x 32: four of 6 x 16."""
    best = None
    for cs in range(YMM_FLOATS, nr + 1, YMM_FLOATS):
        if nr % cs:
            continue
        nv = cs // YMM_FLOATS
        rs_max = max((r for r in range(1, mr + 1) if fits_avx2(r, cs)), default=0)
        if not rs_max:
            continue
        groups = -(-mr // rs_max)
        rs = -(-mr // groups)
        passes = groups * (nr // cs)
        key = (passes, -rs * nv, passes * (rs + nv), cs)
        if best is None or key < best[0]:
            best = (key, (rs, cs))
    assert best is not None, (mr, nr)
    return best[1]


def microkernel(mr: int, nr: int, a: str = "packed", b: str = "packed", simd: str = "auto",
                prefetch: int = 0, scalar_accumulators: bool = False, avx512: bool = False,
                epilogue: str | None = None, transposed: bool = False, a_step: int = 0,
                neon: bool = False, b_split: int = 0, a_prefetch: int = 0, k_unroll: int = 0,
                b_next: int = 0, b_copy: bool = False) -> tuple[str, str]:
    """``(function name, C text)`` of the MR x NR micro-kernel with the given operand access;
    ``prefetch`` > 0: the intrinsics prefetch B, and A's windows, that many k steps ahead (an
    offset table, A's or B's ``koff``, then needs ``prefetch`` readable entries past the last k).
    ``avx512``: where the block fits the 32 zmm registers (``fits_avx512``), an AVX-512F body
    comes first, under ``#if defined(__AVX512F__)``; the AVX2 body (``_avx2``: by sub-blocks
    where the block does not fit 16 ymm) and the plain C follow under ``#elif`` / ``#else``, so
    the same C runs wherever it is compiled. An NR that no vector width divides gets plain C.
    ``scalar_accumulators``: the plain C names each accumulator (``c0_0 ...``) instead of an
    ``acc[MR][NR]`` array, so a compiler without vector registers keeps them in its FPU
    registers (the Cortex-M7: gcc -O2 keeps the array in memory, a load and a store per
    multiply-add); each accumulator gets the same products in the same order.
    ``epilogue`` (one of ``EPILOGUES``; None: C is stored): the storing variant (``SIGNATURE_STORE``),
    which finishes the block in registers and stores it to ``out`` (row bias, Relu; with "a" in the code the
    residual ``res`` laid out as ``out``, possibly ``out`` itself: ``SIGNATURE_RESIDUAL``); not with
    ``scalar_accumulators``. ``transposed`` (with ``epilogue``): column bias, stored to
    ``out[j * ldo + i]`` (``_store_transposed``). ``a_step`` (with ``a="koff"``): row ``i``'s window is
    ``ar[0] + i * a_step`` (``_window_rows``); only ``ar[0]`` is read. ``neon`` (the build for aarch64,
    ``vector_isa="neon"``): an AdvSIMD body first, under ``#if NEON_GUARD`` (``_neon``), where NR is a
    multiple of 4 and neither ``transposed`` nor ``a_step`` is asked (the GEMM emitter asks neither for
    "neon"); x86 bodies and plain C after it. ``b_split`` (with ``b="koff"``, not with ``neon`` or
    ``scalar_accumulators``): B's row is NR / ``b_split`` pieces, piece ``p`` at ``p * ldb`` floats past the
    first (``_split_body``); every vector lies in one piece, so each sum is the same as without.
    ``k_unroll`` (above 1): the AVX2 body's k loop is unrolled that many times (``CodegenOptions.gemm_k_unroll``);
    the same sums in the same order. ``b_next`` (above 0, packed or strided B): ``NEXT_PARAMS`` follow ``load_c`` in
    the signature and the x86 bodies prefetch ``bnl`` lines from ``bn`` into L2, one every ``b_next`` k steps; the
    AdvSIMD and plain C bodies read neither. The same sums. ``b_copy`` (B ``strided``, not with ``neon``, ``b_split``,
    ``b_next`` or ``scalar_accumulators``): ``COPY_PARAMS`` follow ``load_c`` and every body stores the B rows it reads
    to ``bp`` in the packed layout, each value once (the AVX2 sub-blocks of the first rows store their columns);
    the sums are the packed B's.
    """
    assert a in A_ACCESS and b in B_ACCESS and simd in SIMD_MODES, (a, b, simd)
    assert epilogue is None or (valid_epilogue(epilogue) and not scalar_accumulators), (epilogue, scalar_accumulators)
    assert not (neon and epilogue and epilogue[-1] in ACTIVATIONS), "the AdvSIMD bodies apply no activation"
    assert not (epilogue and "c" in epilogue and (neon or transposed)), "a column bias: x86, along the rows only"
    assert not (epilogue and "a" in epilogue and (neon or transposed)), "a residual: x86, along the rows only"
    assert not (a == "koff" and b == "koff"), "one offset table per micro-kernel"
    wide = simd == "auto" and avx512 and fits_avx512(mr, nr)
    assert not a_step or a == "koff", "a row step is the window access's"
    assert not b_split or (b == "koff" and not neon and not scalar_accumulators and nr % b_split == 0
                           and b_split % YMM_FLOATS == 0), (b, b_split, nr)
    assert not b_next or b in ("packed", "strided"), "lines of a next panel: beside a packed or strided B"
    assert not b_copy or (b == "strided" and not neon and not b_split and not b_next and not scalar_accumulators), \
        "the copying variant reads B in place, on x86 and plain C"
    avx2 = simd == "auto" and nr % YMM_FLOATS == 0  # an AVX2 body (the only one ``k_unroll`` changes)
    fn = name(mr, nr, a, b) + (f"_s{a_step}" if a_step else "") + (f"_h{b_split}" if b_split else "") + \
        (f"_pf{prefetch}" if prefetch else "") + (f"_pa{a_prefetch}" if a_prefetch else "") + ("_z" if wide else "") + \
        (f"_u{k_unroll}" if k_unroll > 1 and avx2 else "") + (f"_bn{b_next}" if b_next else "") + \
        ("_cp" if b_copy else "")
    sig, unused = SIGNATURE, "(void)a; (void)ar; (void)koff; (void)ldb;"
    assert not transposed or epilogue is not None, "the transposed store is the storing variant's"
    if epilogue is not None:
        fn += f"_st{'t' if transposed else ''}{epilogue}"
        sig, unused = SIGNATURE_RESIDUAL if "a" in epilogue else SIGNATURE_STORE, unused + " (void)bias; (void)ldc;"
    if b_next:
        sig, unused = sig.replace("int load_c", "int load_c" + NEXT_PARAMS), unused + " (void)bn; (void)bnl;"
    if b_copy:
        sig = sig.replace("int load_c", "int load_c" + COPY_PARAMS)
    what = "C" if epilogue is None else f"out = epilogue '{epilogue}' of C"
    head = [f"/* {what}[0:{mr}, 0:{nr}] (+)= A ({a}) * B ({b}), kc steps; see codegen/microkernel.py. */",
            f"OPFUSE_NOINLINE static void {fn}{sig} {{", "  " + unused]
    plain = _plain_scalars(mr, nr, a, b, a_step) if scalar_accumulators else \
        _plain(mr, nr, a, b, epilogue, transposed, a_step, b_split, b_copy)
    body, guards = [], []
    assert not (neon and (transposed or a_step)), "the AdvSIMD bodies have no transposed store and no window step"
    if simd == "auto" and neon and nr % NEON_FLOATS == 0:
        fn += "_n"
        head[1] = f"OPFUSE_NOINLINE static void {fn}{sig} {{"
        body += [f"#if {NEON_GUARD}", *_neon(mr, nr, a, b, epilogue)]
    if wide:  # the vector helpers of an activation are defined where FMA is too
        g512 = AVX512_FLOAT.guard if epilogue and epilogue[-1] in ACTIVATIONS else AVX512_GUARD
        body += [f"#{'el' if body else ''}if {g512}",
                 *_vector_body("avx512", mr, nr, a, b, prefetch, epi=epilogue, transposed=transposed, a_step=a_step,
                               b_split=b_split, a_prefetch=a_prefetch, b_next=b_next, b_copy=b_copy)]
        guards.append(g512)
    if avx2:
        body += [f"#{'el' if body else ''}if {AVX2_GUARD}", *_avx2(mr, nr, a, b, prefetch, epilogue, transposed,
                                                                  a_step, b_split, a_prefetch, k_unroll, b_next,
                                                                  b_copy)]
        guards.append(AVX2_GUARD)
    body += ["#else", *plain, "#endif"] if body else plain
    pre = f"#if {' || '.join(f'({g})' for g in guards)}\n#include <immintrin.h>\n#endif\n" if guards else ""
    if body and body[0] == f"#if {NEON_GUARD}":
        pre += f"#if {NEON_GUARD}\n#include <arm_neon.h>\n#endif\n"
    return fn, NOINLINE + pre + "\n".join(head + body + ["}"]) + "\n"


def transpose_helper(simd: str = "auto") -> tuple[str, str]:
    """``opfuse_transpose(rows, cols, src, lds, dst, ldd)``: ``dst[j * ldd + i] = src[i * lds + j]``,
    8 x 8 blocks through ymm registers where AVX2 is there (a transposed GEMM tile is turned
    back before its epilogue so the epilogue stores run along the output's rows)."""
    fn = "opfuse_transpose"
    plain = [
        "  for (long i0 = 0; i0 < rows; i0 += 8)",
        "    for (long j = 0; j < cols; ++j)",
        "      for (long i = i0; i < rows && i < i0 + 8; ++i) dst[j * ldd + i] = src[i * lds + j];",
    ]
    avx = [
        "  long i0 = 0;",
        "  for (; i0 + 8 <= rows; i0 += 8) {",
        "    long j0 = 0;",
        "    for (; j0 + 8 <= cols; j0 += 8) {",
        "      const float* s = src + i0 * lds + j0;",
        "      __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + lds), r2 = _mm256_loadu_ps(s + 2 * lds),",
        "             r3 = _mm256_loadu_ps(s + 3 * lds), r4 = _mm256_loadu_ps(s + 4 * lds),",
        "             r5 = _mm256_loadu_ps(s + 5 * lds), r6 = _mm256_loadu_ps(s + 6 * lds),",
        "             r7 = _mm256_loadu_ps(s + 7 * lds);",
        "      __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);",
        "      __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);",
        "      __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);",
        "      __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);",
        "      __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);",
        "      __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);",
        "      __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);",
        "      __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);",
        "      float* d = dst + j0 * ldd + i0;",
        "      _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));",
        "      _mm256_storeu_ps(d + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));",
        "      _mm256_storeu_ps(d + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));",
        "      _mm256_storeu_ps(d + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));",
        "      _mm256_storeu_ps(d + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));",
        "      _mm256_storeu_ps(d + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));",
        "      _mm256_storeu_ps(d + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));",
        "      _mm256_storeu_ps(d + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));",
        "    }",
        "    for (long j = j0; j < cols; ++j)",
        "      for (long i = i0; i < i0 + 8; ++i) dst[j * ldd + i] = src[i * lds + j];",
        "  }",
        "  for (long j = 0; j < cols; ++j)",
        "    for (long i = i0; i < rows; ++i) dst[j * ldd + i] = src[i * lds + j];",
    ]
    head = [f"static void {fn}(long rows, long cols, const float* restrict src, long lds, float* restrict dst, "
            "long ldd) {"]
    if simd == "auto":
        body = [f"#if {AVX2_GUARD}", *avx, "#else", *plain, "#endif"]
        pre = f"#if {AVX2_GUARD}\n#include <immintrin.h>\n#endif\n"
    else:
        body, pre = plain, ""
    return fn, pre + "\n".join(head + body + ["}"]) + "\n"
