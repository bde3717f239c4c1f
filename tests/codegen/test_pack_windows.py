"""Windows gathered into k-major panels (``CodegenOptions.gemm_pack_windows``): a convolution whose GEMM reads A
(positions x K) through its windows' offset table (strided, padded, 7x7 and 1x1 stride-2 convolutions that run
neither as Winograd nor as the direct kernel) gathers each block of MR positions' K block once, then the
micro-kernel reads it in order for every panel of channels. Positive: one panel at a time ("panel", A's panels
outermost) and the whole tile ("tile"), with tail panels and without (rows past the tile repeated), K in blocks,
several row tiles, two images, two threads, a band staged through a prologue, a grouped convolution, a 1x1
stride-2 read in place, the plain C99 build: outputs bit-identical to the table read in place ("off") and close to
the reference, the kernel's note saying how. Negative: no gather with fewer than ``WINDOWS_PACK_MIN_PANELS``
channel panels per tile, on the microcontroller, with the option off, for a 1x1 stride-1 window (consecutive
positions) or where A is not read through windows; an unknown mode is refused."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.gemm import WINDOWS_PACK_MIN_PANELS
from opfuse.codegen.program import generate
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(91)
# One tile of all the channels (a small problem is otherwise cut along the channels for the threads to share:
# ``gemm.choose_blocking``), so that a tile has the panels of channels that make the gather pay.
AVX2 = CodegenOptions(vector_isa="avx2", gemm_min_tiles=1, balance_threads=())
PANEL = "windows gathered into k-major panels, one panel at a time"
TILE = "windows gathered into k-major panels, per tile"


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def _conv(cin, cout, side, k=3, stride=2, pad=1, group=1, images=1, prologue=False):
    b = GraphBuilder("conv")
    x = b.input("x", (images, cin, side, side))
    if prologue:
        x = b.op("Relu", x, name="pre")
    y = b.op("Conv", x, _w(b, cout, cin // group, k, k), _w(b, cout), pads=[pad] * 4, strides=[stride] * 2,
             group=group, name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    return g, group_by_names(g, [("conv_epilogue", (["pre"] if prologue else []) + ["conv", "relu"])])


def _check(g, plan, cache_dir, options, note, threads=1):
    """Bit-identical to the table read in place, close to the reference; ``note`` in the kernel's notes and the
    gathered panels read by a micro-kernel with A packed (no offset-table micro-kernel left)."""
    got, want, m = run_both(g, plan, cache_dir, options=options, threads=threads)
    before, _, m0 = run_both(g, plan, cache_dir, options=options.with_(gemm_pack_windows="off"), threads=threads)
    src, src0 = m.program.source, m0.program.source
    assert re.search(rf"GEMM 'node_conv': {re.escape(note)}( \*/)?$", src, re.M), note
    assert "windows gathered" not in src0
    assert re.search(r"opfuse_ukr_\d+x\d+_koff_", src0) and not re.search(r"opfuse_ukr_\d+x\d+_koff_", src)
    assert re.search(r"opfuse_ukr_\d+x\d+_packed_packed_", src)
    for k in want:
        np.testing.assert_array_equal(got[k], before[k])
    assert_close(got, want)
    return m


@pytest.mark.parametrize("mode,note", [("auto", PANEL), ("panel", PANEL), ("tile", TILE)])
def test_strided_conv(mode, note, cache_dir):
    """16 -> 128 channels (8 panels of 16), 3x3 stride 2 on 14x14: 49 positions, the last 7 in tail panels (4 + 3);
    B's K block (144 x 128 floats) is small, so "auto" gathers one panel at a time."""
    g, plan = _conv(16, 128, 14)
    m = _check(g, plan, cache_dir, AVX2.with_(gemm_pack_windows=mode), note)
    assert "the last 7 of 49 rows in 4x16 + 3x16 panels" in m.program.source


@pytest.mark.parametrize("mode,note", [("panel", PANEL), ("tile", TILE)])
@pytest.mark.parametrize("threads", [1, 2])
def test_k_blocks_row_tiles_images_no_tails(mode, note, threads, cache_dir):
    """K = 144 in blocks of 36 (40, balanced), row tiles of 30 positions (49 = 30 + 19), two images, no tail panels
    (the last panel's rows past the tile repeat its last row, read and dropped), at 1 and 2 threads."""
    g, plan = _conv(16, 128, 14, images=2)
    options = AVX2.with_(gemm_pack_windows=mode, gemm_kc=40, gemm_tile_floats=4096, gemm_tail_panels=False)
    m = _check(g, plan, cache_dir, options, note, threads=threads)
    assert "rows in" not in m.program.source
    assert re.search(r"const long \w+ = \(144 - \w+ < 36 \? 144 - \w+ : 36\);", m.program.source)  # K blocks
    assert re.search(r"const long \w+ = \(\w+ / 1\) % 2;", m.program.source)  # two row tiles per image


@pytest.mark.parametrize("mode,note", [("panel", PANEL), ("tile", TILE)])
def test_band_through_a_prologue(mode, note, cache_dir):
    """Relu -> Conv: the input rows are computed into the band per tile, and gathered from there."""
    g, plan = _conv(16, 128, 12, prologue=True)
    _check(g, plan, cache_dir, AVX2.with_(gemm_pack_windows=mode), note)


def test_grouped_conv(cache_dir):
    """Two groups of 128 output channels: each group's GEMM has 8 panels of channels."""
    g, plan = _conv(32, 256, 12, group=2)
    _check(g, plan, cache_dir, AVX2, PANEL)


def test_1x1_stride2_read_in_place(cache_dir):
    """The downsample of a residual block: a 1x1 stride-2 convolution, its windows read where they lie (no band);
    with the default options (196 positions, 256 channels in tiles of 128)."""
    g, plan = _conv(64, 256, 28, k=1, pad=0)
    m = _check(g, plan, cache_dir, CodegenOptions(vector_isa="avx2"), PANEL)
    assert "band" not in m.program.source


def test_auto_takes_the_tile_for_a_large_b_block(cache_dir):
    """512 output channels of a 3x3 (Winograd off) over 64 channels: B's K block is 576 x 512 floats (1.2 MB),
    past ``WINDOWS_PACK_PANEL_BYTES``, so the tile is gathered before the channel panels."""
    g, plan = _conv(64, 512, 7, stride=1)
    _check(g, plan, cache_dir, AVX2.with_(winograd="off"), TILE)


def test_plain_c_build(cache_dir):
    """The plain C99 build (no intrinsics) gathers too, with the same bits as its own table read in place."""
    g, plan = _conv(16, 128, 14)
    _check(g, plan, cache_dir, AVX2.with_(simd="none"), PANEL)


def _notes(g, plan, options):
    return generate(g, plan, options=options).source


def test_not_gathered_with_few_channel_panels():
    """32 output channels are 2 panels of 16 (fewer than ``WINDOWS_PACK_MIN_PANELS``): one gathered value would
    replace only two broadcasts; the table is read in place."""
    assert WINDOWS_PACK_MIN_PANELS == 8
    g, plan = _conv(16, 32, 14)
    assert "windows gathered" not in _notes(g, plan, AVX2)
    g, plan = _conv(16, 112, 14)  # 7 panels
    assert "windows gathered" not in _notes(g, plan, AVX2)
    g, plan = _conv(16, 128, 14)
    assert PANEL in _notes(g, plan, AVX2)
    g, plan = _conv(64, 256, 14, group=4)  # 64 channels a group
    assert "windows gathered" not in _notes(g, plan, AVX2)


def test_not_gathered_on_the_microcontroller_off_or_without_windows():
    g, plan = _conv(16, 128, 14)
    assert "windows gathered" not in _notes(g, plan, CodegenOptions(platform="mcu", simd="none", weights="embed"))
    assert "windows gathered" not in _notes(g, plan, AVX2.with_(gemm_pack_windows="off"))
    g, plan = _conv(16, 128, 14, k=1, stride=1, pad=0)  # a 1x1 stride-1 window: consecutive positions, in order
    src = _notes(g, plan, AVX2)
    assert "windows gathered" not in src and re.search(r"opfuse_ukr_\d+x\d+_koff_", src)
    g, plan = _conv(16, 64, 56, k=1, stride=1, pad=0)  # 3136 positions: packed as B per tile
    src = _notes(g, plan, AVX2)
    assert "windows gathered" not in src and not re.search(r"opfuse_ukr_\d+x\d+_koff_", src)


def test_unknown_mode_is_refused():
    with pytest.raises(OpfuseError, match="gemm_pack_windows 'rows': expected one of auto, panel, tile, off"):
        CodegenOptions(gemm_pack_windows="rows")


def _loop_order(src):
    """Where the kernel's first gather read, channel-panel loop and row-panel loop start in the C."""
    gather = re.search(r"const long o\d+ = \w+_koff\[", src)
    jr, ir = re.search(r"for \(long jr\d+ = 0;", src), re.search(r"for \(long ir\d+ = 0;", src)
    assert jr and ir
    return (gather.start() if gather else None), jr.start(), ir.start()


def test_loop_orders():
    """One panel at a time: each row panel gathered, then every channel panel reads it (row panels outermost);
    per tile: the tile's panels gathered, then the channel panels outermost; read in place: row panels outermost
    while B's K block fits ``WINDOWS_ROWS_OUTER_BYTES``, else channel panels outermost."""
    g, plan = _conv(16, 128, 14)  # B's K block 144 x 128 floats
    gather, jr, ir = _loop_order(_notes(g, plan, AVX2.with_(gemm_pack_windows="panel")))
    assert ir < gather < jr
    gather, jr, ir = _loop_order(_notes(g, plan, AVX2.with_(gemm_pack_windows="tile")))
    assert gather < jr < ir
    gather, jr, ir = _loop_order(_notes(g, plan, AVX2.with_(gemm_pack_windows="off")))
    assert gather is None and ir < jr
    g, plan = _conv(64, 512, 7, stride=1)  # 576 x 512 floats
    options = AVX2.with_(winograd="off")
    gather, jr, ir = _loop_order(_notes(g, plan, options))
    assert gather < jr < ir
    gather, jr, ir = _loop_order(_notes(g, plan, options.with_(gemm_pack_windows="off")))
    assert gather is None and jr < ir
    g, plan = _conv(256, 256, 14, k=1, pad=0)  # read in place, B's K block exactly WINDOWS_ROWS_OUTER_BYTES
    gather, jr, ir = _loop_order(_notes(g, plan, AVX2.with_(gemm_pack_windows="off")))
    assert gather is None and ir < jr


def test_a_part_panel_of_channels_counts(cache_dir):
    """120 output channels are 8 panels of 16, the last half filled: gathered."""
    g, plan = _conv(16, 120, 14)
    _check(g, plan, cache_dir, AVX2, PANEL)


def test_auto_at_the_panel_bound():
    """A 1x1 stride-2 convolution over 384 channels to 256: B's K block is 384 x 256 floats, exactly
    ``WINDOWS_PACK_PANEL_BYTES``: still one panel at a time; 400 channels (K 400): the tile."""
    from opfuse.codegen.gemm import WINDOWS_PACK_PANEL_BYTES
    assert 384 * 256 * 4 == WINDOWS_PACK_PANEL_BYTES
    g, plan = _conv(384, 256, 14, k=1, pad=0)
    assert PANEL in _notes(g, plan, AVX2)
    g, plan = _conv(400, 256, 14, k=1, pad=0)
    assert TILE in _notes(g, plan, AVX2)
