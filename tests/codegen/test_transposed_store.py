"""The transposed storing micro-kernel (``microkernel._store_transposed``, ``CodegenOptions.gemm_transposed_store``):
a convolution computed over its windows (positions x channels) finished in registers (the channels' bias, Relu)
and stored along the positions. Whole models against the reference and bitwise against the tile epilogue it
replaces, with the AVX-512 block, the AVX2 block and the plain C99 build; remainders in positions, channels
and K, strides, padding, groups, several images; epilogues it does not take (Clip, residual Add); 2 threads
bitwise equal to 1; and the micro-kernels alone compiled three ways (AVX-512F, AVX2 with -mno-avx512f,
plain C) against NumPy."""
from __future__ import annotations

import ctypes
import platform
import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both, assert_relu_keeps_nan_and_negative_zero
from opfuse.codegen import CodegenOptions
from opfuse.codegen.microkernel import microkernel
from opfuse.ops import GraphBuilder
from test_avx512 import HOST_HAS_AVX512, NO_AVX512_REASON, _compile

rng = np.random.default_rng(1414)
# The windows kernel for every convolution here: no direct kernel, no Winograd; its row block at most 8 (the cases
# below are chosen for those blocks; 14-row blocks where the FMA pipes are zmm-wide: test_windows_block.py).
WINDOWS = dict(conv_direct_max_k=0, winograd="off", windows_mr_max=8)
AVX512 = CodegenOptions(vector_isa="avx512", **WINDOWS)
AVX2 = CodegenOptions(vector_isa="avx2", **WINDOWS)
PORTABLE = CodegenOptions(simd="none", **WINDOWS)
STORED = re.compile(r"opfuse_ukr_\w+_stt(b|r|br)?\(")


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def _graph(c, oc, h, w, k, stride, pad, group, epilogue, bias, n=1):
    b = GraphBuilder("tconv")
    x = b.input("x", (n, c, h, w))
    ins = [x, _w(b, oc, c // group, k, k)] + ([_w(b, oc)] if bias else [])
    y = b.op("Conv", *ins, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, group=group, name="conv")
    names = ["conv"]
    if epilogue == "Relu":
        y = b.op("Relu", y, name="act")
        names.append("act")
    elif epilogue == "Clip":
        y = b.op("Clip", y, b.const("lo", np.float32(0.0)), b.const("hi", np.float32(6.0)), name="act")
        names.append("act")
    elif epilogue == "Add":  # residual
        oh = (h + 2 * pad - k) // stride + 1
        ow = (w + 2 * pad - k) // stride + 1
        y = b.op("Relu", b.op("Add", y, b.input("r", (n, oc, oh, ow)), name="add"), name="act")
        names += ["add", "act"]
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", names)])


def _notes(m) -> str:
    return " ".join(n for k in m.report["c_kernels"] for n in k["notes"])


# (c, oc, h, w, k, stride, pad, group, epilogue, bias, images, whether the transposed store is taken)
CASES = [
    (64, 64, 10, 10, 1, 1, 0, 1, "Relu", True, 1, True),    # a 1x1 layer at 10x10 (100 positions)
    (48, 40, 10, 10, 3, 1, 1, 1, "Relu", True, 1, True),    # 40 channels, 100 positions: part blocks both ways
    (1100, 24, 7, 7, 1, 1, 0, 1, "none", False, 1, True),   # K = 1100 > KC: stored after the last K block
    (32, 64, 20, 20, 1, 2, 0, 1, "Relu", True, 2, True),    # strided 1x1, two images
    (32, 32, 12, 12, 3, 1, 1, 4, "Relu", True, 1, True),    # 8 channels per group: the 12 x 8 block, group bias
    (24, 48, 9, 9, 3, 2, 1, 3, "none", True, 1, True),      # grouped, strided, padded, bias only
    (64, 64, 10, 10, 1, 1, 0, 1, "Clip", True, 1, False),   # Clip: the tile epilogue
    (64, 64, 14, 14, 3, 1, 1, 1, "Add", True, 1, False),    # residual Add: the tile epilogue
]
IDS = [f"{c[0]}x{c[1]}_{c[2]}x{c[3]}_k{c[4]}s{c[5]}p{c[6]}g{c[7]}_{c[8]}_b{int(c[9])}_n{c[10]}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("options", [AVX512, AVX2, PORTABLE], ids=["avx512", "avx2", "portable"])
def test_transposed_store_same_bits_as_the_tile_epilogue(case, options, cache_dir):
    c, oc, h, w, k, stride, pad, group, epi, bias, n, taken = case
    g, plan = _graph(c, oc, h, w, k, stride, pad, group, epi, bias, n)
    got, want, m = run_both(g, plan, cache_dir, options=options)
    old, _, m0 = run_both(g, plan, cache_dir, options=options.with_(gemm_transposed_store=False))
    assert bool(STORED.search(m.program.source)) == taken
    assert not STORED.search(m0.program.source)
    assert ("by the micro-kernel" in _notes(m)) == taken and "by the micro-kernel" not in _notes(m0)
    assert "opfuse_transpose" in m0.program.source
    assert ("opfuse_transpose(" in m.program.source) != taken  # the tile's transposition is gone
    assert_close(got, want)
    for name in got:
        assert np.array_equal(got[name], old[name])


def test_transposed_store_off_with_the_register_epilogue(cache_dir):
    """``gemm_register_epilogue=False`` turns the transposed store off too."""
    g, plan = _graph(64, 64, 10, 10, 1, 1, 0, 1, "Relu", True)
    _, _, m = run_both(g, plan, cache_dir, options=AVX512.with_(gemm_register_epilogue=False))
    assert not STORED.search(m.program.source)


@pytest.mark.parametrize("case", [(48, 40, 10, 10, 3, 1, 1, 1), (64, 64, 14, 14, 3, 2, 1, 1),
                                  (64, 64, 14, 14, 3, 1, 1, 8)], ids=["part_blocks", "stepped_7x7", "stepped_groups"])
def test_transposed_store_two_threads_bitwise_equal_to_one(case, cache_dir):
    g, plan = _graph(*case, "Relu", True, n=2)
    one, _, m1 = run_both(g, plan, cache_dir, threads=1, options=AVX512)
    two, _, _ = run_both(g, plan, cache_dir, threads=2, options=AVX512)
    assert STORED.search(m1.program.source)
    for name in one:
        assert np.array_equal(one[name], two[name])


def test_transposed_store_keeps_nan_and_negative_zero(cache_dir):
    """max(0, y) in the vector bodies returns y where y is NaN or -0, as the C epilogue does."""
    g, plan = _graph(16, 32, 7, 7, 1, 1, 0, 1, "Relu", False)
    x = np.zeros((1, 16, 7, 7), np.float32)
    x[0, :, 0, 0] = np.nan
    x[0, :, 0, 1] = -0.0
    assert_relu_keeps_nan_and_negative_zero(g, plan, x, cache_dir, (AVX512, AVX2, PORTABLE), "gemm_transposed_store")


# The micro-kernels alone -------------------------------------------------------------------------
# (MR, NR, epilogue): 7 rows (a masked store), 8 rows, 12 rows (8 + 4), 6 x 16 (the AVX2 block), 12 x 8
UKERNELS = [(7, 32, "br"), (8, 32, "b"), (12, 32, "r"), (6, 16, ""), (12, 8, "br"), (14, 32, "br")]


@pytest.mark.parametrize("isa", ["avx512", "avx2", "plain"])
def test_transposed_micro_kernels_compiled_each_way_match_numpy(isa, tmp_path):
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if isa != "plain" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"], "plain": []}[isa]
    texts, names = [], []
    for mr, nr, epi in UKERNELS:
        fn, text = microkernel(mr, nr, "packed", "packed", "auto", 16, False, avx512=True, epilogue=epi,
                               transposed=True)
        assert f"_stt{epi}" in fn
        names.append(fn)
        texts.append(text)
    lib = _compile(tmp_path, "\n".join(texts).replace("static void", "void"), flags, "t" + isa)
    fp = ctypes.POINTER(ctypes.c_float)
    for (mr, nr, epi), fn in zip(UKERNELS, names, strict=True):
        for kc, load_c in ((37, False), (5, True)):
            A = rng.standard_normal((mr, kc)).astype(np.float32)
            B = rng.standard_normal((kc, nr)).astype(np.float32)
            ldc, ldo = nr + 3, mr + 5
            C = rng.standard_normal((mr, ldc)).astype(np.float32)
            bias = rng.standard_normal(nr).astype(np.float32)
            out0 = np.full((nr + 1) * ldo, 7.0, np.float32)
            out = out0.copy()
            packed = np.ascontiguousarray(A.T)
            koff = np.zeros(kc + 64, np.int32)
            f = getattr(lib, fn)
            f.restype = None
            f(ctypes.c_long(kc), packed.ctypes.data_as(fp), None, koff.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
              B.ctypes.data_as(fp), ctypes.c_long(nr), C.ctypes.data_as(fp), ctypes.c_long(ldc),
              ctypes.c_int(int(load_c)), bias.ctypes.data_as(fp), out.ctypes.data_as(fp), ctypes.c_long(ldo))
            y = A.astype(np.float64) @ B.astype(np.float64) + (C[:, :nr] if load_c else 0)
            if "b" in epi:
                y = y + bias
            if "r" in epi:
                y = np.maximum(y, 0)
            got = out[:nr * ldo].reshape(nr, ldo)
            np.testing.assert_allclose(got[:, :mr], y.T, rtol=1e-4, atol=1e-4 * np.sqrt(kc), err_msg=f"{fn} kc={kc}")
            # nothing written past each column's MR rows, nor past the block
            assert np.array_equal(got[:, mr:], np.full((nr, ldo - mr), 7.0, np.float32)), fn
            assert np.array_equal(out[nr * ldo:], out0[nr * ldo:]), fn


# Window rows one step apart (``CodegenOptions.gemm_window_step``, ``ConvWindows.row_step``) -----------
# (c, oc, h, w, k, stride, pad, group, step taken): 7x7 outputs (MR 7), 14x14 (MR 7 or 14 for 8 channels
# per group), stride 2 in place, padded bands, the input's own rows (1x1, stride 1: any block), and 10x10
# outputs whose rows MR does not divide (no step).
STEP_CASES = [
    (64, 48, 7, 7, 3, 1, 1, 1, True),
    (64, 32, 14, 14, 3, 2, 1, 1, True),
    (32, 64, 28, 28, 1, 2, 0, 1, True),
    (64, 64, 14, 14, 3, 1, 1, 8, True),
    (48, 64, 10, 10, 1, 1, 0, 1, True),
    (48, 40, 10, 10, 3, 1, 1, 1, False),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=[f"{c[0]}x{c[1]}_{c[2]}x{c[3]}_k{c[4]}s{c[5]}p{c[6]}g{c[7]}"
                                                  for c in STEP_CASES])
@pytest.mark.parametrize("options", [AVX512, PORTABLE], ids=["avx512", "portable"])
def test_window_step_same_bits_as_a_pointer_per_row(case, options, cache_dir):
    c, oc, h, w, k, stride, pad, group, taken = case
    g, plan = _graph(c, oc, h, w, k, stride, pad, group, "Relu", True, n=2)
    got, want, m = run_both(g, plan, cache_dir, options=options)
    old, _, m0 = run_both(g, plan, cache_dir, options=options.with_(gemm_window_step=False))
    if options.simd == "auto":  # the plain C build has the AVX2 block: other MRs, other steps
        assert bool(re.search(r"opfuse_ukr_\w+_koff_packed_s\d+", m.program.source)) == taken
    assert "_koff_packed_s" not in m0.program.source
    assert_close(got, want)
    for name in got:
        assert np.array_equal(got[name], old[name])


@pytest.mark.parametrize("isa", ["avx512", "avx2", "plain"])
def test_stepped_window_micro_kernels_match_numpy(isa, tmp_path):
    """Row ``i`` of A at ``ar[0] + i * step + koff[k]``: only ``ar[0]`` is passed."""
    if isa == "avx512" and not HOST_HAS_AVX512:
        pytest.skip(NO_AVX512_REASON)
    if isa != "plain" and platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("not an x86-64 host: no AVX2 or AVX-512 to compile for")
    flags = {"avx512": ["-march=native"], "avx2": ["-march=native", "-mno-avx512f"], "plain": []}[isa]
    kernels = [(7, 32, 2), (14, 8, 1), (8, 32, 3)]
    texts, names = [], []
    for mr, nr, step in kernels:
        fn, text = microkernel(mr, nr, "koff", "packed", "auto", 16, False, avx512=True, a_step=step)
        assert f"_s{step}_" in fn
        names.append(fn)
        texts.append(text)
    lib = _compile(tmp_path, "\n".join(texts).replace("static void", "void"), flags, "s" + isa)
    fp = ctypes.POINTER(ctypes.c_float)
    for (mr, nr, step), fn in zip(kernels, names, strict=True):
        kc = 29
        plane = mr * step + 5
        x = rng.standard_normal(kc * plane + 64).astype(np.float32)
        koff = np.concatenate([np.arange(kc) * plane, np.full(64, (kc - 1) * plane)]).astype(np.int32)
        A = np.array([[x[i * step + koff[k]] for k in range(kc)] for i in range(mr)], np.float32)
        B = rng.standard_normal((kc, nr)).astype(np.float32)
        C = np.zeros((mr, nr), np.float32)
        ar = (ctypes.c_void_p * mr)()
        ar[0] = x.ctypes.data  # the others stay null: never read
        f = getattr(lib, fn)
        f.restype = None
        f(ctypes.c_long(kc), None, ar, koff.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), B.ctypes.data_as(fp),
          ctypes.c_long(nr), C.ctypes.data_as(fp), ctypes.c_long(nr), ctypes.c_int(0))
        np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4 * np.sqrt(kc), err_msg=fn)


def test_narrow_register_block_pads_the_positions_least():
    from opfuse.codegen.conv_windows import register_block
    o = CodegenOptions().resolved("avx512")
    assert register_block(o, 8, 196) == (14, 8)         # 14 rows of 14
    assert register_block(o, 8, 49) == (13, 8)          # 52 rows padded, against 56 (14) or 60 (12)
    assert register_block(o, 8, 144) == (12, 8)         # 144 = 12 x 12: the larger of the exact ones
    assert register_block(o.with_(narrow_mr_max=12), 8, 196) == (12, 8)
    assert register_block(o, 16, 196)[1] == 32          # more channels: the options' block


def test_windows_register_block_prefers_a_divisor_of_the_output_row():
    """Of MRs that pad the positions alike, one that divides the output width (then the blocks step)."""
    from opfuse.codegen.conv_windows import register_block
    o = CodegenOptions().resolved("avx512")
    assert register_block(o, 128, 784) == (8, 32)       # 28x28 without the row: the larger
    assert register_block(o, 128, 784, 28) == (7, 32)   # 28 = 4 x 7
    assert register_block(o, 128, 49, 7) == (7, 32)
    assert register_block(o, 128, 100, 10) == (6, 32)   # 102 padded beats 105 (7) and 104 (8)


def test_strided_pointwise_reads_its_windows(cache_dir):
    """A 1x1 stride-2 convolution whose positions would fill whole panels (28x28 out) reads its stride-2
    windows in place, stepping 2 floats per position (``conv.PACKED_STRIDED``), the stride-1 one packs."""
    g, plan = _graph(16, 64, 56, 56, 1, 2, 0, 1, "Relu", True)
    got, want, m = run_both(g, plan, cache_dir, options=AVX512)
    assert re.search(r"opfuse_ukr_7x32_koff_packed_s2_", m.program.source)
    assert_close(got, want)
    g1, plan1 = _graph(16, 64, 28, 28, 1, 1, 0, 1, "Relu", True)
    _, _, m1 = run_both(g1, plan1, cache_dir, options=AVX512.with_(conv_direct_max_k=0))
    assert "_koff_" not in m1.program.source
