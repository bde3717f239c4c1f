"""Tail panels (``gemm.tail_panels``, ``CodegenOptions.gemm_tail_panels``): where MR does not divide a GEMM's
M, its last rows run in narrower panels with micro-kernels of their own width instead of one MR-row panel
padded with zero rows. Positive: every way A reaches the micro-kernel (weights packed at build time, rows read
in place, windows through an offset table, rows packed per tile by the generic and the 1x1 packer), stores by
the micro-kernel along n and transposed, K in blocks, a part panel along N, several row tiles: outputs
bit-identical to the build without tail panels and close to the reference, with the tail micro-kernels in the
C. Negative: no tail where MR divides M, on the plain C99 build, or with the option off."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import WIDE_HOST, assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.gemm import pack_a_panels, tail_panels, tail_rows
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(77)
AVX2 = CodegenOptions(vector_isa="avx2")
AVX2_R = AVX2.resolved("avx2")
AVX512_R = CodegenOptions(vector_isa="avx512").resolved("avx512")


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


@pytest.mark.parametrize("M,MC,want", [
    (128, 512, (4, 4)),   # 2 rows left: two 4-row panels instead of one 6-row panel and 2 rows
    (49, 512, (4, 3)),    # 1 row left: 4 + 3 (two panels of least cost) instead of 6 + 1
    (196, 512, (4,)),     # 4 rows left: one 4-row panel
    (64, 512, (4,)),
    (33, 512, (5, 4)),    # 3 left: 5 + 4 costs 18 slots against 6 + 3's 20
    (35, 512, (5,)),
    (1, 512, (1,)),       # one row: one panel of 1 row, not 6 (half the FMA slots)
    (128, 126, (2,)),     # the last row tile holds 2 rows only: the tail stays in it
    (126, 512, ()),       # MR divides M
])
def test_tail_choice_avx2(M, MC, want):
    assert tail_panels(M, 6, 16, MC, AVX2_R) == want


def test_tail_choice_other_builds():
    assert tail_panels(23, 12, 8, 512, AVX2_R) == (11,)  # the narrow 12 x 8 block: 11 rows cost 11 slots, 12 padded
    assert tail_panels(97, 8, 32, 512, AVX2_R.with_(gemm_mr=8, gemm_nr=32)) == ()  # a block without an AVX2 body
    assert tail_panels(100, 8, 32, 512, AVX512_R) == (4,)
    assert tail_panels(97, 8, 32, 512, AVX512_R) == (5, 4)  # no 1-row zmm block (too few chains): 9 = 5 + 4
    assert tail_panels(128, 6, 16, 512, AVX2_R.with_(gemm_tail_panels=False)) == ()
    assert tail_panels(128, 6, 16, 512, AVX2_R.with_(simd="none")) == ()
    assert tail_panels(128, 6, 16, 512, CodegenOptions(vector_isa="neon").resolved("neon")) == ()


def test_pack_with_tails_places_each_panel_at_its_rows():
    """Rows before the tails in MR-row panels as without tails; the panel from row f of width w at f * K,
    column k at k * w in it."""
    nb, M, K = 2, 49, 5
    a = rng.standard_normal((nb, M, K)).astype(np.float32)
    tails = tail_panels(M, 6, 16, 512, AVX2_R)
    packed = pack_a_panels(a, 6, tails)
    assert packed.shape == (nb, M * K)
    body = M - sum(tails)
    np.testing.assert_array_equal(packed[:, :body * K], pack_a_panels(a[:, :body], 6).reshape(nb, -1))
    for first, width in tail_rows(M, tails):
        panel = packed[:, first * K:(first + width) * K].reshape(nb, K, width)
        np.testing.assert_array_equal(panel, a[:, first:first + width].transpose(0, 2, 1))


def _check(g, plan, cache_dir, options, note, access):
    """Bit-identical to the build without tails and close to the reference; the kernel's note says ``note``
    (the last rows and their panels), each tail width's micro-kernel is in the C, and A reaches it as
    ``access`` (a C name: the weights packed at build time ``_A``, rows packed per tile ``apack``, row pointers
    ``const float* ar``)."""
    got, want, m = run_both(g, plan, cache_dir, options=options)
    before, _, m0 = run_both(g, plan, cache_dir, options=options.with_(gemm_tail_panels=False))
    src = m.program.source
    assert re.search(rf"{re.escape(note)}( \*/)?$", src, re.M) and "rows in" not in m0.program.source
    for width, nr in re.findall(r"(\d+)x(\d+)", note.split(" rows in ")[1]):
        assert f"opfuse_ukr_{width}x{nr}_" in src, width
    assert access in src
    for k in want:
        np.testing.assert_array_equal(got[k], before[k])
    assert_close(got, want)
    return m


def _conv(cin, cout, side, k=1):
    b = GraphBuilder("conv")
    y = b.op("Conv", b.input("x", (1, cin, side, side)), _w(b, cout, cin, k, k), _w(b, cout), pads=[k // 2] * 4,
             name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])])


@pytest.mark.parametrize("cout,side,note", [
    (128, 16, "the last 8 of 128 rows in 4x16 + 4x16 panels"),
    (50, 18, "the last 8 of 50 rows in 4x16 + 4x16 panels"),   # 324 positions: a part panel along N
], ids=["whole-panels", "part-panel"])
def test_1x1_conv_weights_rows(cout, side, note, cache_dir):
    """Output channels are M (weights packed at build time), positions N; bias and Relu stored by the
    micro-kernel, through the C tile for a part panel along N."""
    g, plan = _conv(24, cout, side)
    _check(g, plan, cache_dir, AVX2, note, "conv_A")


@pytest.mark.parametrize("cout,note", [(100, "the last 4 of 100 rows in 4x32 panel"),
                                       (97, "the last 9 of 97 rows in 5x32 + 4x32 panels")])
def test_avx512_blocks(cout, note, cache_dir):
    """The AVX-512 host's 8 x 32 block (its AVX2 bodies run where the CPU has no AVX-512): no 1-row zmm block
    (too few chains), so 97 = 88 + 5 + 4."""
    g, plan = _conv(24, cout, 16)
    _check(g, plan, cache_dir, CodegenOptions(**WIDE_HOST), note, "conv_A")


def test_1x1_conv_weights_rows_in_k_blocks(cache_dir):
    """K = 40 in blocks of 16: the tail panels' sums go through the C tile until the last block."""
    g, plan = _conv(40, 38, 8)
    _check(g, plan, cache_dir, AVX2.with_(gemm_kc=16), "the last 8 of 38 rows in 4x16 + 4x16 panels", "conv_A")


def test_several_row_tiles(cache_dir):
    """M = 140 output channels in row tiles of 48 (``gemm_wide``): the tails are in the last tile only."""
    g, plan = _conv(16, 140, 16)
    m = _check(g, plan, cache_dir, AVX2.with_(gemm_wide=48, gemm_mc=48, balance_threads=()),
               "the last 8 of 140 rows in 4x16 + 4x16 panels", "conv_A")
    assert "== 140)" in m.program.source  # the tails run where the tile ends at M


@pytest.mark.parametrize("k,options,access", [
    (1, {"windows_pack_min_channels": 32}, "apack"), (1, {}, "_s1_"), (3, {"winograd": "off"}, "const float* ar")],
    ids=["1x1-packed-per-tile", "1x1-windows-step", "3x3-windows"])
def test_small_spatial_conv_stored_transposed(k, options, access, cache_dir):
    """7x7 positions are M (positions x channels, stored transposed by the micro-kernel): a 1x1 convolution's
    positions packed per tile by the 1x1 packer, or read in place (one pointer and a row step), a padded 3x3's
    windows through the offset table; 49 = 42 + 4 + 3."""
    g, plan = _conv(64, 32, 7, k)
    _check(g, plan, cache_dir, AVX2.with_(**options), "the last 7 of 49 rows in 4x16 + 3x16 panels", access)


@pytest.mark.parametrize("prologue,access", [(False, "const float* ar"), (True, "apack")],
                         ids=["rows-in-place", "packed-per-tile"])
def test_matmul_activation_rows(prologue, access, cache_dir):
    """A of a MatMul is an activation: its 50 rows read in place, or through a fused Relu prologue, packed per
    tile by the generic packer; a Sigmoid epilogue."""
    b = GraphBuilder("mm")
    x = b.input("x", (50, 64))
    a = b.op("Relu", x, name="pre") if prologue else x
    y = b.op("MatMul", a, _w(b, 64, 40), name="mm")
    g = b.build(b.op("Sigmoid", y, name="sig"))
    plan = group_by_names(g, [("gemm_epilogue", (["pre"] if prologue else []) + ["mm", "sig"])])
    _check(g, plan, cache_dir, AVX2, "the last 8 of 50 rows in 4x16 + 4x16 panels", access)


def test_packed_rows_in_several_tiles_and_k_blocks(cache_dir):
    """A packed per tile in row tiles of 12 (``gemm_mc``), K = 64 in blocks of 16, two batches: a batched MatMul
    with a Relu prologue (the generic packer: 50 = 4 x 12 + 2 rows, the tail in the last tile only) and a 1x1
    convolution on 10x10 through the 1x1 packer (100 = 4 x 24 + 4 in tiles of 24)."""
    b = GraphBuilder("mmb")
    y = b.op("MatMul", b.op("Relu", b.input("x", (2, 50, 64)), name="pre"), _w(b, 2, 64, 40), name="mm")
    g = b.build(b.op("Sigmoid", y, name="sig"))
    plan = group_by_names(g, [("gemm_epilogue", ["pre", "mm", "sig"])])
    options = AVX2.with_(gemm_mc=12, gemm_kc=16, balance_threads=())
    m = _check(g, plan, cache_dir, options, "the last 2 of 50 rows in 2x16 panel", "apack")
    assert "== 50)" in m.program.source
    g, plan = _conv(64, 32, 10)
    options = AVX2.with_(windows_pack_min_channels=32, gemm_mc=24, balance_threads=())
    m = _check(g, plan, cache_dir, options, "the last 4 of 100 rows in 4x16 panel", "apack")
    assert "== 100)" in m.program.source


def test_no_tails_where_mr_divides_m_or_plain_c(cache_dir):
    """48 output channels fill 8 panels of 6; the plain C99 build keeps its padded panel for 50."""
    g, plan = _conv(24, 48, 16)
    _, _, m = run_both(g, plan, cache_dir, options=AVX2)
    assert "rows in" not in m.program.source and "opfuse_ukr_4x16" not in m.program.source
    g, plan = _conv(24, 50, 16)
    got, want, m = run_both(g, plan, cache_dir, options=AVX2.with_(simd="none"))
    assert "rows in" not in m.program.source and "opfuse_ukr_4x16" not in m.program.source
    assert_close(got, want)


@pytest.mark.parametrize("cout,note", [(64, "the last 4 of 64 channels in a 4x16 panel"),
                                       (50, "the last 2 of 50 channels in a 2x16 panel")])
def test_winograd_tail_panel(cout, note, cache_dir):
    """Winograd's GEMMs (output channels x tiles, U packed at build time): the last OC mod MR channels in one
    panel of their own (the threads' parts stay whole MR panels), at 1 and 2 threads (the tail in the last
    part only); bit-identical to the padded panel, close to the reference."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = _conv(32, cout, 12, 3)
    feeds = reference.random_inputs(g, 0)
    want = reference.run(g, feeds)
    options = AVX2.with_(winograd="on")
    before = build(g, plan, cache_dir=cache_dir, options=options.with_(gemm_tail_panels=False), threads=1).run(feeds)
    for threads in (1, 2):
        m = build(g, plan, cache_dir=cache_dir, options=options, threads=threads)
        assert re.search(rf"{re.escape(note)}( \*/)?$", m.program.source, re.M)
        got = m.run(feeds)
        for k in want:
            np.testing.assert_array_equal(got[k], before[k])
        assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_winograd_tail_panel_wide_host(cache_dir):
    """The AVX-512 host's one-zmm Winograd block: 34 channels in 12-row panels (the least padding) end in a
    10-row tail panel whose micro-kernel has the AVX-512 body (``_z``) and prefetches U as the others do
    (``_pa``: 2048 bytes ahead over 10-float steps, 52 steps); its AVX2 body runs here."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = _conv(32, 34, 12, 3)
    feeds = reference.random_inputs(g, 0)
    options = CodegenOptions(**WIDE_HOST, winograd="on", winograd_prefetch_min_bytes=0)
    m = build(g, plan, cache_dir=cache_dir, options=options, threads=1)
    src = m.program.source
    assert re.search(r"the last 10 of 34 channels in a 10x16 panel( \*/)?$", src, re.M)
    assert re.search(r"opfuse_ukr_10x16_packed_strided\w*_pa52_z", src)
    before = build(g, plan, cache_dir=cache_dir, options=options.with_(gemm_tail_panels=False), threads=1).run(feeds)
    got = m.run(feeds)
    for k in got:
        np.testing.assert_array_equal(got[k], before[k])
    assert_close(got, reference.run(g, feeds), rtol=1e-3, atol=1e-3)
