"""The AVX-512 register block (``CodegenOptions(vector_isa="avx512")``: 8 x 32, zmm accumulators)
against the plain C99 build and the reference, on shapes that leave remainders in M, N and K;
the micro-kernels themselves compiled three ways (AVX-512F, AVX2 by sub-blocks with
``-mno-avx512f``, plain C) against NumPy; the AVX2 block still chosen on request on an AVX-512
host; the host's ISA chosen from the target, deterministically."""
from __future__ import annotations

import ctypes
import platform
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.gemm import transposed_ld
from opfuse.codegen.microkernel import avx2_split, fits_avx2, fits_avx512, microkernel
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.runtime.toolchain import ToolchainError, find_compiler
from opfuse.targets import host_simd_isa

rng = np.random.default_rng(512)
AVX512 = CodegenOptions(vector_isa="avx512")
AVX2 = CodegenOptions(vector_isa="avx2")
PORTABLE = CodegenOptions(simd="none")
HOST_HAS_AVX512 = host_simd_isa() == "avx512"
NO_AVX512_REASON = "the CPU has no AVX-512F: the zmm bodies cannot run here"


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def _conv_graph(c, oc, h, w, k, stride, pads, group=1, act="Relu"):
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, _w(b, oc, c // group, k, k), _w(b, oc), kernel_shape=[k, k], strides=[stride, stride],
             pads=pads, group=group, name="conv")
    g = b.build(b.op(act, y, name="act"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "act"])])


def _three_ways(g, plan, cache_dir, **options):
    """AVX-512 block, plain C99 and the reference: all agree; the AVX-512 source has zmm bodies.
    ``options``: more ``CodegenOptions`` fields for both builds."""
    wide, want, m = run_both(g, plan, cache_dir, options=AVX512.with_(**options))
    portable, _, m_p = run_both(g, plan, cache_dir, options=PORTABLE.with_(**options))
    assert "_mm512_fmadd_ps" in m.program.source and "_mm512_fmadd_ps" not in m_p.program.source
    assert m.program.options.gemm_nr == 32 and m_p.program.options.gemm_nr == 16
    assert_close(wide, want)
    assert_close(portable, want)
    assert_close(wide, portable)
    return m


CONVS = {  # (c, oc, h, w, k, stride, pads, group): channel and position counts off the 8 x 32 block
    "1x1-14x14": (40, 72, 14, 14, 1, 1, [0, 0, 0, 0], 1),
    "1x1-7x7-windows": (36, 50, 7, 7, 1, 1, [0, 0, 0, 0], 1),
    "1x1-packed-rows": (24, 20, 16, 16, 1, 1, [0, 0, 0, 0], 1),
    "3x3-remainders": (13, 37, 11, 9, 3, 1, [1, 1, 1, 1], 1),
    "3x3-stride2": (16, 33, 15, 17, 3, 2, [1, 1, 1, 1], 1),
    "3x3-k-blocks": (300, 40, 6, 7, 3, 1, [1, 1, 1, 1], 1),
    "3x3-grouped": (32, 64, 9, 9, 3, 1, [1, 1, 1, 1], 2),
    "1x1-grouped-narrow": (32, 32, 8, 8, 1, 1, [0, 0, 0, 0], 4),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_avx512_convs_match_portable_and_reference(name, cache_dir):
    c, oc, h, w, k, s, pads, group = CONVS[name]
    g, plan = _conv_graph(c, oc, h, w, k, s, pads, group)
    _three_ways(g, plan, cache_dir)
    if group > 1:  # the grouped ones take the direct kernel; the windows GEMM's blocks too
        _three_ways(g, plan, cache_dir, conv_direct_grouped=False)


@pytest.mark.parametrize("shape", [(3, 37, 70, 45), (1, 50, 129, 33), (2, 9, 17, 64)])
def test_avx512_matmul_with_batch(shape, cache_dir):
    """Batched MatMul with constant B (folded into M) and with both operands at run time."""
    nb, m, k, n = shape
    b = GraphBuilder("mm")
    x = b.input("x", (nb, m, k))
    y = b.op("MatMul", x, _w(b, k, n), name="mm")
    z = b.op("MatMul", y, b.input("r", (nb, n, 19)), name="mm2")
    g = b.build(b.op("Add", z, _w(b, 19), name="add"))
    plan = group_by_names(g, [("gemm_epilogue", ["mm2", "add"])])
    _three_ways(g, plan, cache_dir)


@pytest.mark.parametrize("c,oc,hw,stride", [(8, 24, 16, 1), (3, 32, 64, 2)])
def test_transposed_tile_of_a_power_of_two_positions_is_padded(c, oc, hw, stride, cache_dir):
    """256 and 1024 positions per tile (8-row panels): the transposed copy's rows are one cache
    line longer than the tile (``gemm.transposed_ld``), and the results still match. The cache
    blocking's one tile (balanced for 2 threads these convolutions are 4 tiles of other sizes). The
    3-channel one would take the direct kernel (``conv_direct.py``): kept on the windows here, and the
    tile transposed (not stored from the micro-kernel's registers, ``gemm_transposed_store``)."""
    g, plan = _conv_graph(c, oc, hw, hw, 3, stride, [1, 1, 1, 1])
    m = _three_ways(g, plan, cache_dir, balance_threads=(), conv_direct_max_k=0, gemm_transposed_store=False)
    positions = (hw // stride) ** 2
    assert transposed_ld(positions) == positions + 16
    assert re.search(rf"opfuse_transpose\(\w+, \w+, \w+ \+ \w+, 32, \w+, {positions + 16}\);", m.program.source)


def test_avx512_epilogues_in_registers(cache_dir):
    """Conv -> BatchNorm (folded) -> HardSwish, -> Sigmoid, -> Clip, and a residual Add + Relu,
    all fused behind the 8 x 32 micro-kernel."""
    b = GraphBuilder("epi")
    x = b.input("x", (1, 24, 10, 10))
    c1 = b.op("Conv", x, _w(b, 40, 24, 1, 1), name="c1")
    bn = b.op("BatchNormalization", c1, _w(b, 40), _w(b, 40), _w(b, 40),
              b.const("var", (rng.random(40) + 0.5).astype(np.float32)), name="bn")
    hs = b.op("HardSwish", bn, name="hs")
    c2 = b.op("Conv", hs, _w(b, 40, 40, 3, 3), pads=[1, 1, 1, 1], name="c2")
    sg = b.op("Sigmoid", c2, name="sg")
    c3 = b.op("Conv", sg, _w(b, 40, 40, 1, 1), _w(b, 40), name="c3")
    cl = b.op("Clip", c3, b.const("lo", np.float32(0.0)), b.const("hi", np.float32(6.0)), name="clip")
    c4 = b.op("Conv", cl, _w(b, 40, 40, 3, 3), pads=[1, 1, 1, 1], name="c4")
    r = b.op("Relu", b.op("Add", c4, hs, name="res"), name="relu")
    g = b.build(r)
    plan = group_by_names(g, [("conv_epilogue", ["c1", "bn", "hs"]), ("conv_epilogue", ["c2", "sg"]),
                              ("conv_epilogue", ["c3", "clip"]), ("conv_epilogue", ["c4", "res", "relu"])])
    _three_ways(g, plan, cache_dir)


def test_avx2_block_on_request(cache_dir):
    """vector_isa="avx2" keeps the 6 x 16 block and no zmm code, whatever the CPU; its packed
    weights differ from the AVX-512 block's (the panels follow NR), its results do not."""
    g, plan = _conv_graph(24, 40, 9, 9, 3, 1, [1, 1, 1, 1])
    narrow, want, m2 = run_both(g, plan, cache_dir, options=AVX2)
    wide, _, m5 = run_both(g, plan, cache_dir, options=AVX512)
    assert "_mm512" not in m2.program.source and "_mm256_fmadd_ps" in m2.program.source
    assert (m2.program.options.gemm_mr, m2.program.options.gemm_nr) == (6, 16)
    assert (m5.program.options.gemm_mr, m5.program.options.gemm_nr) == (8, 32)
    assert m2.program.weights != m5.program.weights
    notes2 = " ".join(n for k in m2.program.kernels for n in k.notes)
    notes5 = " ".join(n for k in m5.program.kernels for n in k.notes)
    assert "6x16 micro-kernel, AVX2 / plain C" in notes2 and "AVX-512F" not in notes2
    # the windows' MR: 6-8, or 6-14 where the host's FMA pipes are zmm-wide (``windows_mr_max``; 9 here: 9x9)
    assert re.search(r"GEMM 'conv': ([6-9]|1[0-4])x32 micro-kernel, AVX-512F / AVX2 / plain C", notes5), notes5
    ukr = re.search(r"static void opfuse_ukr_\w+\(.*?\n}\n", m5.program.source, re.S)
    assert ukr and "_mm512_fmadd_ps" in ukr.group(0)  # the micro-kernel itself has its zmm body
    assert_close(narrow, want)
    assert_close(wide, want)


def test_host_isa_comes_from_the_target_and_is_deterministic():
    """vector_isa="host" resolves to the host profile's ISA; the same model, options and ISA give
    the same C and weights byte for byte; the microcontroller build never takes the host's."""
    g, plan = _conv_graph(16, 24, 8, 8, 3, 1, [1, 1, 1, 1])
    p1, p2 = generate(g, plan, options=CodegenOptions()), generate(g, plan, options=CodegenOptions())
    assert p1.options.vector_isa == host_simd_isa()
    assert p1.source == p2.source and p1.weights == p2.weights
    forced = generate(g, plan, options=CodegenOptions(vector_isa=host_simd_isa()))
    assert forced.source == p1.source and forced.weights == p1.weights
    mcu = generate(g, plan, options=CodegenOptions(platform="mcu", simd="none", weights="embed"))
    assert mcu.options.vector_isa == "avx2" and "_mm512" not in mcu.source


def test_bad_isa_and_blocks_are_refused():
    with pytest.raises(OpfuseError, match="vector ISA 'avx1024'"):
        CodegenOptions(vector_isa="avx1024")
    with pytest.raises(OpfuseError, match="gemm_mr and gemm_nr must be positive"):
        CodegenOptions(gemm_nr=-16)
    with pytest.raises(OpfuseError, match=r"gemm_mc \(96\) must be a multiple of gemm_mr \(7\)"):
        CodegenOptions(gemm_mr=7)
    with pytest.raises(OpfuseError, match=r"gemm_nc \(256\) of gemm_nr \(48\)"):
        CodegenOptions(vector_isa="avx512", gemm_nr=48).resolved("avx512")


def test_register_fit_rules():
    assert fits_avx512(8, 32) and fits_avx512(12, 32) and fits_avx512(14, 32)
    assert not fits_avx512(15, 32)       # 30 accumulators + 2 B vectors + a broadcast > 32
    assert not fits_avx512(1, 48)        # 3 accumulators: too few chains to hide the FMA latency
    assert not fits_avx512(6, 24)        # NR not whole zmm vectors
    assert fits_avx2(6, 16) and not fits_avx2(8, 32)
    assert avx2_split(8, 32) == (4, 16)  # 2 x 2 passes of 4 x 16 (8 accumulators each)
    assert avx2_split(12, 32) == (6, 16)


# The micro-kernels alone, compiled three ways ----------------------------------------------------
HARNESS = "#include <stdint.h>\n#define OPFUSE_PRAGMA(x) _Pragma(#x)\n"
# (MR, NR, A access, B access, B's pieces: ``b_split``)
KERNELS = [(8, 32, "packed", "packed", 0), (8, 32, "koff", "packed", 0), (8, 32, "rows", "strided", 0),
           (12, 32, "packed", "strided", 0), (6, 48, "packed", "packed", 0), (16, 16, "packed", "koff", 0),
           (6, 16, "packed", "koff", 0), (8, 32, "packed", "koff", 16), (10, 32, "packed", "koff", 16),
           (14, 32, "koff", "packed", 0)]  # the windows' 14-row block (``windows_mr_max`` on zmm-wide FMA hosts)


def _compile(tmp_path: Path, text: str, flags: list[str], tag: str) -> ctypes.CDLL:
    try:
        cc = find_compiler()
    except ToolchainError:
        pytest.skip("no C compiler")
    src, lib = tmp_path / f"{tag}.c", tmp_path / f"{tag}.so"
    src.write_text(HARNESS + text)
    proc = subprocess.run([*shlex.split(cc), "-O2", "-std=c99", "-fPIC", "-shared", "-ffp-contract=off", *flags,
                           str(src), "-o", str(lib)], capture_output=True, text=True)
    if proc.returncode != 0 and "-mno-avx512f" in flags and "unrecognized" in proc.stderr:
        pytest.skip("the compiler does not know -mno-avx512f")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ctypes.CDLL(str(lib))


def _call(lib, fn: str, mr: int, nr: int, a_mode: str, b_mode: str, kc: int, load_c: bool, split: int = 0):
    """Run one micro-kernel on random operands; (result, NumPy's). ``split``: B's rows in two pieces, the
    second ``ldb`` floats past the first (past all the first pieces)."""
    A = rng.standard_normal((mr, kc)).astype(np.float32)
    ldb = nr + 5 if b_mode == "strided" else nr
    B = rng.standard_normal((kc, ldb)).astype(np.float32)
    ldc = nr + 3
    C0 = rng.standard_normal((mr, ldc)).astype(np.float32)
    C = C0.copy()
    fp = ctypes.POINTER(ctypes.c_float)
    keep = []
    a_ptr = ctypes.cast(0, fp)
    ar = (ctypes.c_void_p * mr)()
    koff = np.zeros(kc + 64, dtype=np.int32)
    if a_mode == "packed":
        packed = np.ascontiguousarray(A.T)  # k-major, MR per k
        keep.append(packed)
        a_ptr = packed.ctypes.data_as(fp)
    elif a_mode == "rows":
        for i in range(mr):
            ar[i] = A[i].ctypes.data
    else:  # koff: row i's element k at ar[i][koff[k]]: a scattered layout
        stride = 3
        spread = np.zeros((mr, kc * stride + 1), dtype=np.float32)
        spread[:, ::stride][:, :kc] = A
        keep.append(spread)
        koff[:kc] = np.arange(kc) * stride
        koff[kc:] = koff[kc - 1]
        for i in range(mr):
            ar[i] = spread[i].ctypes.data
    b_arg = B
    if b_mode == "koff":  # row k of B at b + koff[k]: rows in a shuffled order, a gap between them
        step = nr + 7
        order = rng.permutation(kc)
        b_arg = np.zeros(kc * step * (2 if split else 1) + 11, dtype=np.float32)
        ldb = kc * step + 11 if split else ldb
        for k in range(kc):
            if split:  # the second piece of row k is ldb floats past its first
                b_arg[order[k] * step:order[k] * step + split] = B[k, :split]
                b_arg[order[k] * step + ldb:order[k] * step + ldb + nr - split] = B[k, split:nr]
            else:
                b_arg[order[k] * step:order[k] * step + nr] = B[k, :nr]
        koff[:kc] = order * step
        koff[kc:] = koff[kc - 1]
    f = getattr(lib, fn)
    f.restype = None
    f(ctypes.c_long(kc), a_ptr, ar, koff.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), b_arg.ctypes.data_as(fp),
      ctypes.c_long(ldb), C.ctypes.data_as(fp), ctypes.c_long(ldc), ctypes.c_int(int(load_c)))
    want = A.astype(np.float64) @ B[:, :nr].astype(np.float64) + (C0[:, :nr] if load_c else 0)
    assert np.array_equal(C[:, nr:], C0[:, nr:])  # nothing written past the block's columns
    return C[:, :nr], want


@pytest.mark.parametrize("isa", ["avx512", "avx2", "plain"])
def test_micro_kernels_compiled_each_way_match_numpy(isa, tmp_path):
    """Each AVX-512-shaped micro-kernel: the zmm body (-march=native on an AVX-512 CPU), the AVX2
    body by sub-blocks (-mno-avx512f: what an AVX2-only machine compiles) and the plain C (no
    -march) compute the same block within float32 rounding, with load_c both ways."""
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if isa != "plain" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"], "plain": []}[isa]
    texts, names = [], []
    for mr, nr, a, b, split in KERNELS:
        fn, text = microkernel(mr, nr, a, b, "auto", 16, False, avx512=True, b_split=split)
        names.append(fn)
        texts.append(text)
    lib = _compile(tmp_path, "\n".join(texts).replace("static void", "void"), flags, isa)
    for (mr, nr, a, b, split), fn in zip(KERNELS, names, strict=True):
        for kc, load_c in ((37, False), (5, True), (1, True)):
            got, want = _call(lib, fn, mr, nr, a, b, kc, load_c, split)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(kc), err_msg=f"{fn} kc={kc}")
