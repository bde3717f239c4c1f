"""A GEMM whose constant B (a layer's weights) is large has each micro-kernel call prefetch its share of the next
packed panel into L2 (``gemm.next_panel``, ``CodegenOptions.gemm_next_panel_bytes``): mobilenet_v1's pw13 (1024 ->
1024 at 7x7, 4 MB of weights, 7 calls of 7 rows per 32-channel panel) has each call take 293 of the next panel's
2048 lines, one every 3 k steps. A prefetch changes no value: the same bits with and without it, whatever the
blocks, the tails and the threads; the kernel's notes say it; nothing changes below the size, on the
microcontroller, or in a build without the intrinsics."""
from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

from cg_support import assert_close, assert_threshold_inclusive, group_by_names, pointwise_relu, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.microkernel import microkernel
from opfuse.codegen.options import CORTEX_M7
from opfuse.codegen.program import generate
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder
from test_avx512 import HOST_HAS_AVX512, NO_AVX512_REASON, _compile

rng = np.random.default_rng(17)
NOTE = "of the next panel into L2"  # the kernel note's words


def pointwise(c: int, oc: int, hw: int):
    return pointwise_relu(c, oc, hw, rng, "next")


def dense(m: int, k: int, n: int):
    """x (m x k) @ W (k x n) + bias: B the weights along N, the output stored along n (not transposed)."""
    b = GraphBuilder("dense")
    x = b.input("x", (m, k))
    w = b.const("w", (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(n).astype(np.float32))
    y = b.op("MatMul", x, w, name="mm")
    g = b.build(b.op("Add", y, bias, name="add"))
    return g, group_by_names(g, [("gemm_epilogue", ["mm", "add"])])


def _notes(program) -> list[str]:
    return [n for k in program.kernels if k.function for n in k.notes if NOTE in n]


@pytest.mark.parametrize("isa,share,step", [("avx2", 147, 6), ("avx512", 293, 3)])
def test_a_layer_with_four_megabytes_of_weights_prefetches_the_next_panel(isa, share, step):
    """NR 16 (AVX2: 1024 lines a panel) and 32 (AVX-512: 2048)."""
    g, plan = pointwise(1024, 1024, 7)
    program = generate(g, plan, options=CodegenOptions(vector_isa=isa, gemm_mr=7, gemm_mc=49))
    (note,) = _notes(program)
    assert f"weights of 4096 KiB streamed: each of a tile's 7 calls on a panel prefetches {share} lines of the " \
        f"next panel into L2, one every {step} k steps" in note
    assert f"_bn{step}" in program.source and f"if (k % {step} == 0 && k / {step} < bnl) _mm_prefetch((const " \
        f"char*)(bn + k / {step} * 16), _MM_HINT_T1);" in program.source
    assert "const int hasnext" in program.source  # the calls pass their share
    off = generate(g, plan, options=CodegenOptions(vector_isa=isa, gemm_mr=7, gemm_mc=49, gemm_next_panel_bytes=0))
    assert not _notes(off) and "_bn" not in off.source and "_MM_HINT_T1" not in off.source


def strided(kc: int = 0):
    """A 3x3 stride-2 convolution 256 -> 512 at 14x14 (4.5 MB of weights), read over its windows."""
    b = GraphBuilder("windows")
    x = b.input("x", (1, 256, 14, 14))
    w = b.const("w", (rng.standard_normal((512, 256, 3, 3)) / 48).astype(np.float32))
    g = b.build(b.op("Conv", x, w, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], name="conv"))
    return generate(g, group_by_names(g, []), options=CodegenOptions(**({"gemm_kc": kc} if kc else {})))


def test_windows_prefetch_the_next_panel_unless_they_are_the_outer_loop():
    """B's K block of 768 x 512 floats: the channel panels outermost, each call prefetches; in K blocks of 64
    (128 KB, ``gemm.WINDOWS_ROWS_OUTER_BYTES``) A's windows are the outer loop, and B's next panel is the next
    call's: nothing is prefetched."""
    assert _notes(strided())
    assert not _notes(strided(64)) and "_bn" not in strided(64).source


def test_the_size_is_inclusive():
    g, plan = pointwise(512, 512, 14)  # 512 x 512 floats: 1 MB of weights
    assert_threshold_inclusive(_notes, g, plan, "gemm_next_panel_bytes", 512 * 512 * 4)


def test_nothing_is_prefetched_where_it_does_not_apply():
    g, plan = pointwise(64, 64, 28)  # 16 KB of weights
    assert not _notes(generate(g, plan))
    g, plan = pointwise(512, 512, 14)
    m7 = generate(g, plan, options=CORTEX_M7)  # no intrinsics, no caches to prefetch into
    assert not _notes(m7) and "_bn" not in m7.source
    plain = generate(g, plan, options=CodegenOptions(simd="none"))
    assert not _notes(plain) and "_bn" not in plain.source
    neon = generate(g, plan, options=CodegenOptions(vector_isa="neon"))
    assert not _notes(neon) and "_bn" not in neon.source


def test_the_option_is_checked():
    with pytest.raises(OpfuseError, match="gemm_next_panel_bytes"):
        CodegenOptions(gemm_next_panel_bytes=-1)


def _problem(M: int = 49, N: int = 1024, K: int = 1024):
    from opfuse.codegen.gemm import GemmProblem, Operand
    a = Operand(lambda ev, b, m, k: "0")
    b = Operand(lambda ev, b, k, n: "0", static=np.zeros((1, K, N), np.float32))
    return GemmProblem("pw", 1, M, N, K, a, b, None, None)  # type: ignore[arg-type]


def test_each_condition_at_its_limit_and_the_shares():
    """``next_panel`` directly: every condition alone refuses, each numeric one at its limit; the shares cover
    the next panel's K block."""
    from opfuse.codegen.gemm import next_panel
    o = CodegenOptions(vector_isa="avx512")

    def nxt(p=None, o=o, MR=7, NR=32, MC=49, KC=1024, rows=49, packed_b=True, a_outer=False):
        return next_panel(p or _problem(), o, MR, NR, MC, KC, rows, packed_b, a_outer)

    assert nxt() == (3, 293)  # 2048 lines of 16 floats in 7 shares of 293, one every 3 of 1024 steps
    step, share = nxt()
    assert 7 * share >= 1024 * 32 // 16 and 1024 // step >= share  # 7 calls take the panel, each within its steps
    assert nxt(rows=7) == (1, 2048) and nxt(rows=13) == (1, 2048)  # one call: one line a step, the rest not
    assert nxt(MC=14) == (1, 1024)  # two calls a tile
    assert nxt(rows=6) == (0, 0)  # no whole block: tail panels only
    assert nxt(packed_b=False) == (0, 0) and nxt(a_outer=True) == (0, 0)
    assert nxt(NR=24, MC=48, rows=48, MR=8) == (0, 0) and nxt(NR=16, MR=8, MC=48, rows=48) == (5, 171)
    assert nxt(_problem(N=32, K=8192)) == (0, 0) and nxt(_problem(N=64, K=4096)) == (3, 293)  # one panel: no next
    size = 1024 * 1024 * 4
    assert nxt(o=o.with_(gemm_next_panel_bytes=size)) == (3, 293)
    assert nxt(o=o.with_(gemm_next_panel_bytes=size + 1)) == (0, 0)
    assert nxt(o=o.with_(gemm_next_panel_bytes=0)) == (0, 0)
    assert nxt(o=o.with_(vector_isa="avx2")) == (3, 293)
    assert nxt(o=o.with_(vector_isa="neon")) == (0, 0) and nxt(o=o.with_(simd="none")) == (0, 0)
    assert nxt(o=o.with_(platform="mcu")) == (0, 0)


def test_strips_take_a_panels_outermost_and_prefetch_nothing():
    """x (64 x 32) @ W (32 x 8192, 1 MB) + a residual input: the epilogue finished strip by strip (``gemm_strip_
    epilogue``) makes A's panels the outer loop, B's K block (32 x 512 floats, 64 KB) read from L2 per panel."""
    b = GraphBuilder("strips")
    x, r = b.input("x", (64, 32)), b.input("r", (64, 8192))
    w = b.const("w", (rng.standard_normal((32, 8192)) / 6).astype(np.float32))
    g = b.build(b.op("Add", b.op("MatMul", x, w, name="mm"), r, name="add"))
    plan = group_by_names(g, [("gemm_epilogue", ["mm", "add"])])
    assert not _notes(generate(g, plan))
    no_strips = generate(g, plan, options=CodegenOptions(gemm_strip_epilogue=False))
    assert _notes(no_strips)


# (graph, options): K in blocks with a short last one, N past its last whole panel, M's last rows in a tail panel or
# a part block, the output transposed (a convolution) or along n (a MatMul), several row tiles
CASES = {
    "conv_k_blocks_n_part": (lambda: pointwise(1100, 1040, 7), {}),  # K in 2 blocks, row tiles of 28 and 21
    "conv_row_tiles": (lambda: pointwise(520, 528, 12), {}),  # row tiles of 60, 60 and 24
    "dense_tails": (lambda: dense(37, 70, 100), dict(gemm_kc=32)),
    "dense_one_block": (lambda: dense(64, 48, 128), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_same_bits_with_and_without_the_prefetch(case, cache_dir):
    make, kw = CASES[case]
    g, plan = make()
    on = CodegenOptions(gemm_next_panel_bytes=1, **kw)
    got, want, model = run_both(g, plan, cache_dir, options=on, threads=1)
    assert _notes(model.program) and "_bn" in model.program.source
    if case == "dense_tails":  # the tail panel's call takes no share
        assert model.program.source.count("const int hasnext") == 1
    assert_close(got, want)
    for threads, opts in ((2, on), (1, CodegenOptions(gemm_next_panel_bytes=0, **kw))):
        other = run_both(g, plan, cache_dir, options=opts, threads=threads)[0]
        assert all(np.array_equal(got[k], other[k]) for k in got), (case, threads)


# The micro-kernel alone ------------------------------------------------------------------------------------------
HOST_X86 = platform.machine().lower() in ("x86_64", "amd64")


def _call(lib, fn: str, mr: int, nr: int, kc: int, load_c: bool, epi: bool, nxt: bool):
    A = rng.standard_normal((mr, kc)).astype(np.float32)
    B = rng.standard_normal((kc, nr)).astype(np.float32)
    nextp = rng.standard_normal(kc * nr).astype(np.float32)  # a next panel: its values are never read
    C0 = rng.standard_normal((mr, nr)).astype(np.float32)
    C, out = C0.copy(), np.zeros((mr, nr), np.float32)
    bias = rng.standard_normal(mr).astype(np.float32)
    fp = ctypes.POINTER(ctypes.c_float)
    packed = np.ascontiguousarray(A.T)
    args = [ctypes.c_long(kc), packed.ctypes.data_as(fp), (ctypes.c_void_p * mr)(),
            ctypes.POINTER(ctypes.c_int32)(), B.ctypes.data_as(fp), ctypes.c_long(nr), C.ctypes.data_as(fp),
            ctypes.c_long(nr), ctypes.c_int(int(load_c))]
    if nxt:
        args += [nextp.ctypes.data_as(fp), ctypes.c_long(kc * nr // 16)]
    if epi:
        args += [bias.ctypes.data_as(fp), out.ctypes.data_as(fp), ctypes.c_long(nr)]
    f = getattr(lib, fn)
    f.restype = None
    f(*args)
    return out if epi else C


@pytest.mark.parametrize("isa", ["avx512", "avx2", "plain"])
def test_the_micro_kernel_computes_the_same_bits_with_the_next_panels_parameters(isa, tmp_path):
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if isa != "plain" and not HOST_X86:
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"], "plain": []}[isa]
    blocks = [(8, 32, 3, None), (7, 32, 1, "b"), (6, 16, 2, "b")]
    texts, pairs = [], []
    for mr, nr, step, epi in blocks:
        with_, without = (microkernel(mr, nr, "packed", "packed", "auto", 16, avx512=True, epilogue=epi, b_next=s)
                          for s in (step, 0))
        want = without[0].replace("_st", f"_bn{step}_st") if epi else without[0] + f"_bn{step}"
        assert with_[0] == want
        texts += [with_[1], without[1]]
        pairs.append((mr, nr, epi, with_[0], without[0]))
    lib = _compile(tmp_path, "\n".join(texts).replace("static void", "void"), flags, isa)
    for mr, nr, epi, fn, plain in pairs:
        for kc, load_c in ((29, False), (40, True)):
            state = rng.bit_generator.state
            got = _call(lib, fn, mr, nr, kc, load_c, epi is not None, True)
            rng.bit_generator.state = state
            want = _call(lib, plain, mr, nr, kc, load_c, epi is not None, False)
            assert np.array_equal(got, want), (fn, kc)


def test_the_prefetch_is_in_the_first_sub_block_of_a_split_avx2_body_only():
    _, text = microkernel(8, 32, "packed", "packed", "auto", 16, avx512=True, b_next=2)
    avx512, rest = text.split("#elif", 1)
    assert avx512.count("_MM_HINT_T1") == 1
    avx2, plain = rest.split("#else", 1)
    assert avx2.count("const float* restrict ak = a + ") == 4 and avx2.count("_MM_HINT_T1") == 1
    assert "bn +" not in plain and "(void)bn; (void)bnl;" in text
    # a block that fits AVX2's registers: one pass, its prefetch; one line a step without the modulo
    _, text = microkernel(6, 16, "packed", "packed", "auto", 16, avx512=False, b_next=1)
    assert text.rsplit("#else", 1)[0].count(
        "    if (k < bnl) _mm_prefetch((const char*)(bn + k * 16), _MM_HINT_T1);") == 1
    with pytest.raises(AssertionError, match="packed or strided B"):
        microkernel(8, 32, "packed", "koff", "auto", 16, b_next=2)
    # beside a strided B (Winograd's GEMMs fetching the next panel's 3x3 weights): the same prefetch
    _, text = microkernel(16, 16, "packed", "strided", "auto", 32, avx512=True, b_next=4)
    assert text.split("#elif", 1)[0].count(
        "    if (k % 4 == 0 && k / 4 < bnl) _mm_prefetch((const char*)(bn + k / 4 * 16), _MM_HINT_T1);") == 1
