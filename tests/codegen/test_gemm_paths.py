"""The GEMM core's paths against the reference: convolution as an implicit GEMM over its windows
(in place and through the padded band), 1x1 convolutions packing their input rows, several
tiles and K blocks, groups and dilations; MatMuls with activations read in place; results
independent of the thread count; the portable C99 micro-kernels next to the AVX2 ones."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import WIDE_HOST, assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(11)


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def conv_relu(c, oc, h, w, k, stride, pads, dilation=1, group=1):
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, _w(b, oc, c // group, k, k), _w(b, oc), kernel_shape=[k, k], strides=[stride, stride],
             pads=pads, dilations=[dilation, dilation], group=group, name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])])


CONVS = {
    "3x3-several-tiles": (16, 40, 20, 20, 3, 1, [1, 1, 1, 1]),
    "3x3-stride2-odd": (32, 24, 17, 15, 3, 2, [1, 1, 1, 1]),
    "3x3-in-place": (16, 16, 10, 10, 3, 1, [0, 0, 0, 0]),
    "asymmetric-pads": (8, 20, 9, 11, 3, 1, [0, 1, 2, 0]),
    "1x1-packed-rows": (64, 32, 8, 8, 1, 1, [0, 0, 0, 0]),
    "1x1-7x7": (48, 36, 7, 7, 1, 1, [0, 0, 0, 0]),
    "1x1-stride2": (24, 40, 14, 14, 1, 2, [0, 0, 0, 0]),
    "k-blocks": (320, 20, 6, 6, 3, 1, [1, 1, 1, 1]),
    "many-channels": (12, 600, 5, 5, 3, 1, [1, 1, 1, 1]),
    "5x5-stride2": (8, 16, 9, 9, 5, 2, [2, 2, 2, 2]),
}


@pytest.mark.parametrize("isa", ["host", "avx2"])
@pytest.mark.parametrize("name", sorted(CONVS))
def test_conv_paths_match_reference(name, isa, cache_dir):
    """Every path with the host's register block and with AVX2's 6 x 16 (forced on an AVX-512 host)."""
    g, plan = conv_relu(*CONVS[name])
    got, want, _ = run_both(g, plan, cache_dir, options=CodegenOptions(vector_isa=isa))
    assert_close(got, want)


@pytest.mark.parametrize("dilation,group", [(2, 1), (2, 4), (1, 8)])
def test_grouped_and_dilated_convs(dilation, group, cache_dir):
    g, plan = conv_relu(32, 32, 12, 12, 3, 1, [2, 2, 2, 2], dilation, group)
    got, want, _ = run_both(g, plan, cache_dir)
    assert_close(got, want)


def test_conv_with_prologue_reads_through_the_band(cache_dir):
    """Relu -> Conv without padding: the input is computed, so the windows come from the band."""
    b = GraphBuilder("pre")
    x = b.input("x", (1, 12, 9, 9))
    y = b.op("Conv", b.op("Relu", x, name="pre"), _w(b, 20, 12, 3, 3), name="conv")
    g = b.build(y)
    got, want, _ = run_both(g, group_by_names(g, [("conv_epilogue", ["pre", "conv"])]), cache_dir)
    assert_close(got, want)


@pytest.mark.parametrize("shape", [(5, 300, 37), (2, 3, 40, 48), (130, 96, 64)])
def test_matmul_activations_in_place(shape, cache_dir):
    """Both operands run-time tensors: A's rows and (N a multiple of 16) B's rows read in place."""
    b = GraphBuilder("mm")
    *batch, m, k, n = shape
    a = b.input("a", tuple(batch) + (m, k))
    bb = b.input("b", tuple(batch) + (k, n))
    y = b.op("Add", b.op("MatMul", a, bb, name="mm"), _w(b, n), name="add")
    g = b.build(y)
    got, want, _ = run_both(g, group_by_names(g, [("gemm_epilogue", ["mm", "add"])]), cache_dir)
    assert_close(got, want)


def test_results_do_not_depend_on_threads(cache_dir):
    g, plan = conv_relu(16, 40, 20, 20, 3, 1, [1, 1, 1, 1])
    one, _, _ = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    for k in one:
        assert np.array_equal(one[k], two[k])


@pytest.mark.parametrize("threads", [1, 2])
def test_band_staged_once_per_row_block(threads, cache_dir):
    """Several channel tiles per block of positions (600 channels at 5x5, 2 images): each thread copies a
    block's band once (``gemm_reuse_band``), the key set before the loop; the same bits as a copy per tile,
    also with a prologue whose values fill the band."""
    b = GraphBuilder("bands")
    x = b.input("x", (2, 12, 5, 5))
    y = b.op("Conv", b.op("Relu", x, name="pre"), _w(b, 600, 12, 3, 3), _w(b, 600), pads=[1, 1, 1, 1], name="conv")
    g = b.build(y)
    plan = group_by_names(g, [("conv_epilogue", ["pre", "conv"])])
    got, want, m = run_both(g, plan, cache_dir, threads=threads)
    old, _, m0 = run_both(g, plan, cache_dir, threads=threads, options=CodegenOptions(gemm_reuse_band=False))
    assert "= -1;" in m.program.source and "= -1;" not in m0.program.source
    assert_close(got, want)
    for k in got:
        assert np.array_equal(got[k], old[k])


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_a_once_per_row_block(threads, cache_dir):
    """A 1x1 convolution at 7x7 (its 49 positions packed as A, its 600 channels in tiles; 2 images): each thread
    packs a row block's A once for its tiles (``gemm_reuse_packed_a``), the key set before the loop; the same bits
    as a packing per tile."""
    b = GraphBuilder("packed_a")
    x = b.input("x", (2, 256, 7, 7))
    y = b.op("Conv", x, _w(b, 600, 256, 1, 1), _w(b, 600), name="conv")
    g = b.build(y)
    plan = group_by_names(g, [("conv_epilogue", ["conv"])])
    got, want, m = run_both(g, plan, cache_dir, threads=threads)
    old, _, m0 = run_both(g, plan, cache_dir, threads=threads, options=CodegenOptions(gemm_reuse_packed_a=False))
    skip = re.compile(r"!= b\w+ \* \d+ \+ mt\w+\) \{")
    assert "apack" in m.program.source
    assert skip.search(m.program.source) and not skip.search(m0.program.source)
    assert_close(got, want)
    for k in got:
        assert np.array_equal(got[k], old[k])


def test_portable_micro_kernels_match_the_avx2_ones(cache_dir):
    """The plain C99 build (what the Cortex-M7 uses) and the intrinsics build of one model agree
    with each other and with the reference. They are not bitwise equal: the intrinsics round
    once per multiply-add (FMA), the plain C twice."""
    b = GraphBuilder("both")
    x = b.input("x", (1, 16, 12, 12))
    c1 = b.op("Relu", b.op("Conv", x, _w(b, 32, 16, 3, 3), _w(b, 32), pads=[1, 1, 1, 1], name="c1"), name="r1")
    c2 = b.op("Conv", c1, _w(b, 32, 32, 1, 1), name="c2")
    c3 = b.op("Conv", c2, _w(b, 32, 8, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], group=4, name="c3")
    y = b.op("MatMul", b.op("Flatten", c3, name="flat"), _w(b, 32 * 36, 10), name="fc")
    g = b.build(y)
    portable, want, m0 = run_both(g, None, cache_dir, options=CodegenOptions(simd="none"))
    simd, _, m1 = run_both(g, None, cache_dir)
    assert "_mm256_fmadd_ps" not in m0.program.source and "_mm256_fmadd_ps" in m1.program.source
    assert_close(portable, want)
    assert_close(simd, want)
    assert_close(simd, portable)


@pytest.mark.parametrize("c,h,w,k,stride,pads,dilation", [
    (8, 13, 21, 3, 1, [1, 1, 1, 1], 1),     # rows longer than the 32-wide vector step, with a tail
    (6, 17, 19, 3, 2, [1, 1, 1, 1], 1),     # stride 2: two column phases
    (5, 11, 12, 5, 3, [2, 1, 2, 2], 1),     # 5x5 stride 3, asymmetric pads
    (4, 9, 40, 3, 1, [2, 2, 2, 2], 2),      # dilated
    (3, 8, 8, 7, 1, [3, 3, 3, 3], 1),       # 49 taps: weights broadcast from memory
])
def test_depthwise_paths(c, h, w, k, stride, pads, dilation, cache_dir):
    b = GraphBuilder("dw")
    x = b.input("x", (2, c, h, w))
    y = b.op("Conv", x, _w(b, c, 1, k, k), _w(b, c), kernel_shape=[k, k], strides=[stride, stride], pads=pads,
             dilations=[dilation, dilation], group=c, name="dw")
    g = b.build(b.op("Clip", y, b.const("lo", np.float32(0)), b.const("hi", np.float32(6)), name="clip"))
    plan = group_by_names(g, [("conv_epilogue", ["dw", "clip"])])
    for options in (None, CodegenOptions(simd="none")):
        got, want, _ = run_both(g, plan, cache_dir, options=options)
        assert_close(got, want)


def test_sibling_convs_share_one_pass(cache_dir):
    """Two convs of one input, one horizontal stage: their weights stacked along the channel
    axis (40 + 24 channels), each sibling's epilogue on its own columns of every tile."""
    b = GraphBuilder("siblings")
    x = b.input("x", (1, 16, 15, 15))
    c1 = b.op("Relu", b.op("Conv", x, _w(b, 40, 16, 3, 3), _w(b, 40), pads=[1, 1, 1, 1], name="c1"), name="r1")
    c2 = b.op("Conv", x, _w(b, 24, 16, 3, 3), pads=[1, 1, 1, 1], name="c2")
    g = b.build(c1, c2)
    plan = group_by_names(g, [("horizontal", ["c1", "r1", "c2"])])
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert model.report["functions"] == 1


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_cortex_m7_compiles_the_portable_path(simd, tmp_path):
    """Where the AVX2 guard is false (an ARM target), both builds are plain C99."""
    import shutil
    import subprocess

    from opfuse.codegen import generate
    cc = shutil.which("arm-none-eabi-gcc")
    if cc is None:
        pytest.skip("no arm-none-eabi-gcc")
    g, plan = conv_relu(16, 24, 9, 9, 3, 2, [1, 1, 1, 1])
    src = tmp_path / "model.c"
    src.write_text(generate(g, plan, options=CodegenOptions(simd=simd, weights="embed")).source)
    proc = subprocess.run([cc, "-mcpu=cortex-m7", "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard", "-mthumb", "-O2",
                           "-std=c99", "-Werror=implicit-function-declaration", "-c", str(src), "-o",
                           str(tmp_path / "model.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("op,k,n", [("Gemm", 1024, 1000), ("Gemm", 37, 50), ("MatMul", 64, 48), ("MatMul", 5, 7)])
def test_single_row_gemm_runs_the_one_row_micro_kernel(op, k, n, cache_dir):
    """M = 1 (a classifier on one image): the 1 x gemm_gemv_nr micro-kernel with the intrinsics,
    N padded to whole panels or not; the plain C99 build and gemm_gemv_nr=0 keep MR x NR (without tail
    panels: with them, gemm_gemv_nr=0 runs a one-row panel NR wide on AVX2, where a ymm row has enough
    accumulators, and the MR-row panel on AVX-512), and all agree with the reference."""
    b = GraphBuilder("gemv")
    x = b.input("x", (1, k))
    if op == "Gemm":
        y = b.op("Gemm", x, _w(b, n, k), _w(b, n), transB=1, name="fc")
    else:
        y = b.op("MatMul", x, _w(b, k, n), name="fc")
    g = b.build(b.op("Relu", y, name="relu"))
    plan = group_by_names(g, [("gemm_epilogue", ["fc", "relu"])])
    gemv, want, m = run_both(g, plan, cache_dir)
    nr = min(CodegenOptions().gemm_gemv_nr, -(-n // 8) * 8)  # no wider than the row, in whole vectors
    assert f"opfuse_ukr_1x{nr}_" in m.program.source
    for options in (CodegenOptions(gemm_gemv_nr=0, gemm_tail_panels=False), CodegenOptions(simd="none")):
        other, _, m_other = run_both(g, plan, cache_dir, options=options)
        assert "opfuse_ukr_1x" not in m_other.program.source
        assert_close(other, want)
        assert_close(gemv, other)
    other, _, m_other = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_gemv_nr=0))
    if m_other.program.options.vector_isa == "avx512":
        # a zmm panel needs MIN_ZMM_ACCUMULATORS accumulators (``fits_avx512``): the one row runs in the MR-row panel
        src = m_other.program.source
        assert "opfuse_ukr_1x" not in src and re.search(r"opfuse_ukr_\d+x32_", src)
    else:  # AVX2: a tail panel of one row, the register block's NR wide
        assert re.search(r"opfuse_ukr_1x(16|32)_", m_other.program.source)
    assert_close(other, want)
    assert_close(gemv, want)


@pytest.mark.parametrize("c,oc,hw,group,simd", [
    (48, 36, 7, 1, "auto"),     # 49 positions: 8 whole 6-row panels and a tail of one
    (300, 20, 10, 1, "auto"),   # K in two blocks, 100 positions (tail of four)
    (24, 40, 7, 2, "auto"),     # two groups: each packs its own channels
    (48, 36, 7, 1, "none"),     # the plain C99 build packs the same way
])
def test_1x1_windows_packing_positions_matches_reference(c, oc, hw, group, simd, cache_dir):
    """1x1 convolutions at small spatial sizes run over their windows; with at least
    windows_pack_min_channels output channels per group they pack A (positions x channels) per
    tile instead of reading it through the offset table. Forced here on small shapes."""
    g, plan = conv_relu(c, oc, hw, hw, 1, 1, [0, 0, 0, 0], group=group)
    base = CodegenOptions(simd=simd, conv_direct_grouped=False)  # two groups would take the direct kernel
    packed, want, m = run_both(g, plan, cache_dir, options=base.with_(windows_pack_min_channels=1))
    windows, _, m_w = run_both(g, plan, cache_dir, options=base.with_(windows_pack_min_channels=10**6))
    assert "_koff" not in m.program.source and "_koff" in m_w.program.source
    assert_close(packed, want)
    assert_close(windows, want)


def test_1x1_windows_below_the_channel_threshold_keep_the_offset_table(cache_dir):
    """The default threshold: 36 output channels stay on the windows; a padded 1x1 or a 3x3 never packs."""
    g, plan = conv_relu(48, 36, 7, 7, 1, 1, [0, 0, 0, 0])
    _, _, m = run_both(g, plan, cache_dir)
    assert CodegenOptions().windows_pack_min_channels > 36 and "_koff" in m.program.source
    for k, pads in ((1, [1, 1, 1, 1]), (3, [1, 1, 1, 1])):
        g, plan = conv_relu(8, 16, 7, 7, k, 1, pads)
        got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(windows_pack_min_channels=1))
        assert "_koff" in m.program.source
        assert_close(got, want)


@pytest.mark.parametrize("simd", ["auto", "none"])
@pytest.mark.parametrize("c,oc,hw", [(16, 64, 96), (24, 20, 180)], ids=["whole-blocks", "part-blocks"])
def test_rows_outer_store_same_bits(c, oc, hw, simd, cache_dir):
    """A 1x1 convolution of few input channels whose micro-kernel stores its output (over 2 MB), B's packed K
    block small: A's panels outermost (``gemm_rows_outer_store``), the same bits as B's panels outermost; a
    deep K (B's block past ``ROWS_OUTER_STORE_BYTES``) or a small output keeps B's panels outermost."""
    import re
    g, plan = conv_relu(c, oc, hw, hw, 1, 1, [0, 0, 0, 0])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(simd=simd))
    old, _, m0 = run_both(g, plan, cache_dir, options=CodegenOptions(simd=simd, gemm_rows_outer_store=False))
    rows_first = re.compile(r"for \(long ir\d+ = 0;[^\n]*\n\s*for \(long jr\d+ = 0;")
    assert rows_first.search(m.program.source) and not rows_first.search(m0.program.source)
    assert_close(got, want)
    for name in got:
        assert np.array_equal(got[name], old[name])
    for shape in ((640, 32, 96, 96), (16, 64, 48, 48)):  # K = 640: 640 x 256 floats of B per tile; 0.6 MB out
        g, plan = conv_relu(shape[0], shape[1], shape[2], shape[3], 1, 1, [0, 0, 0, 0])
        _, _, m = run_both(g, plan, cache_dir, options=CodegenOptions(simd=simd))
        assert not rows_first.search(m.program.source)


def test_pointwise_tiles_even_per_thread_same_bits(cache_dir):
    """A 256 -> 512 1x1 convolution at 14x14 (mobilenet_v1's pw6 at AVX-512's 14 x 32 block): with
    ``balance_even_panels`` its 14 position panels run as 14 tiles of one (the blocking's 4 tiles were 4, 4, 4
    and 2 panels), recorded so in the kernel's parallel loop; the reference's values, and the bits of the
    4-tile build at 1 and 2 threads (each output still sums its K products in order). Its 512 KB of weights are
    not split per thread here (``test_weights_split.py``): the tiles are the balancing's alone."""
    g, plan = conv_relu(256, 512, 14, 14, 1, 1, [0, 0, 0, 0])
    even = CodegenOptions(**WIDE_HOST, balance_even_panels=True, gemm_split_weights_bytes=0)
    got = {}
    for threads in (1, 2):
        for option in (True, False):
            out, want, model = run_both(g, plan, cache_dir, options=even.with_(balance_even_panels=option),
                                        threads=threads)
            loop = next(k for k in model.program.kernels if k.parallel).parallel[0]
            costs = [7168.0] * 14 if option else [28672.0] * 3 + [14336.0]
            assert (loop.iterations, list(loop.costs)) == (len(costs), costs)
            assert_close(out, want)
            got[threads, option] = out
    for k in got[1, True]:
        assert all(np.array_equal(got[1, True][k], v[k]) for v in got.values())
