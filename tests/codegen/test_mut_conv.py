"""Cases the convolution generators (``codegen/conv.py``, ``conv_direct.py``, ``conv_windows.py``) had no test
for, found by mutation testing (tests/mutation/mutK.md): windows that start exactly on the input's last column or
entirely inside a padding wider than the input (``conv.valid_range`` and the row-segment packer of a convolution
with run-time weights), 1-D convolutions padded at the end only or not at all (the im2col packer), the direct
kernel's register blocks (``conv_direct.direct_block``: channel counts rounded up to even rows, a block too wide
for 8 rows) and the least-padding block of a two-group convolution, and the notes naming the band the direct
kernel reads. Each compiled case against the reference; few compiles."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.conv import valid_range
from opfuse.codegen.conv_direct import direct_block
from opfuse.ops import GraphBuilder

AVX512 = CodegenOptions(vector_isa="avx512")
AVX2 = CodegenOptions(vector_isa="avx2")


def _w(b, name, *shape):
    """A constant drawn from a generator seeded by its name and shape: the same whichever tests ran before."""
    rng = np.random.default_rng(zlib.crc32(repr((name, shape)).encode()))
    return b.const(name, (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32))


def _notes(m) -> str:
    return " ".join(n for k in m.kernels for n in k.notes)


def test_valid_range_at_the_input_edges():
    # a window origin past every input column but the last few: o * 1 - 4 in [0, 3) for o = 4, 5
    assert valid_range(6, 3, 1, -4) == (4, 6)
    # the offset is the input's last column: only o = 0 reads it (o * 1 + 3 < 4)
    assert valid_range(3, 4, 1, 3) == (0, 1)
    # the same with a stride: o * 2 + 4 < 5 for o = 0 only
    assert valid_range(4, 5, 2, 4) == (0, 1)


def test_runtime_weight_convs_at_the_input_edges(cache_dir):
    """2-D convolutions whose weights are a run-time input (the row-segment packer): one whose only output
    column reads the input's last column at its last tap (3 columns, 3x3, unpadded), one padded 4 columns on
    each side of a 3-column input (its first 4 output columns read padding at every tap but the last ones)."""
    b = GraphBuilder("edges")
    x, w = b.input("x", (1, 4, 6, 3)), b.input("w", (5, 4, 3, 3))
    y1 = b.op("Conv", x, w, kernel_shape=[3, 3], name="tight")
    y2 = b.op("Conv", x, w, kernel_shape=[3, 3], pads=[1, 4, 1, 4], name="wide_pad")
    g = b.build(b.op("Relu", y1, name="r1"), b.op("Relu", y2, name="r2"))
    assert g.nodes[0].outputs[0].shape == (1, 5, 4, 1) and g.nodes[1].outputs[0].shape == (1, 5, 6, 9)
    plan = group_by_names(g, [("conv_epilogue", ["tight", "r1"]), ("conv_epilogue", ["wide_pad", "r2"])])
    got, want, _ = run_both(g, plan, cache_dir, options=AVX2)
    assert_close(got, want)


def test_one_d_convolutions_padded_at_the_end_only_or_not_at_all(cache_dir):
    """The im2col packer (1-D): padding at the end only (the padded test must look at the end pads too), none
    at all with a stride (no select), and two groups (each group's channels from ``b % 2``)."""
    b = GraphBuilder("conv1d")
    x = b.input("x", (2, 6, 19))
    y1 = b.op("Conv", x, _w(b, "w1", 10, 6, 3), kernel_shape=[3], pads=[0, 2], name="end_pad")
    y2 = b.op("Conv", x, _w(b, "w2", 10, 6, 3), _w(b, "b2", 10), kernel_shape=[3], strides=[2], name="unpadded")
    y3 = b.op("Conv", x, _w(b, "w3", 8, 3, 3), _w(b, "b3", 8), kernel_shape=[3], pads=[1, 1], group=2,
              name="grouped")
    g = b.build(b.op("Relu", y1, name="r1"), b.op("Relu", y2, name="r2"), b.op("Relu", y3, name="r3"))
    plan = group_by_names(g, [("conv_epilogue", ["end_pad", "r1"]), ("conv_epilogue", ["unpadded", "r2"]),
                              ("conv_epilogue", ["grouped", "r3"])])
    got, want, _ = run_both(g, plan, cache_dir, options=AVX2.with_(gemm_kc=8))
    assert_close(got, want)


def test_direct_block_rows():
    """The AVX-512 block (not wide): the channels rounded up to an even count of rows, at least 8, at most
    ``conv_direct_mr``, and fewer where the rows would not fit the registers (64 positions: 4 zmm a row, so 8
    rows do not fit, 6 do: the loop down from 8 stops there)."""
    o = AVX512.resolved("avx512")
    for channels, rows in ((9, 10), (11, 12), (20, 16), (3, 8)):
        mr, nr = direct_block(o, channels)
        assert (mr, nr) == (rows, 16) and type(mr) is int, (channels, mr, nr)
    assert direct_block(o.with_(conv_direct_nr=64, conv_direct_mr=6), 32) == (6, 64)
    # 80 positions (5 zmm a row): 8, 7 and 6 rows do not fit, 5 do (one row at a time down from 8)
    assert direct_block(o.with_(conv_direct_nr=80, conv_direct_mr=5), 32) == (5, 80)


def test_two_groups_take_the_least_padding_rows():
    """Two groups of 8 channels: the AVX2 block pads a group's channels least (4 rows, not 6), as for more
    groups (``direct_block``'s ``least_padding``)."""
    b = GraphBuilder("g2")
    x = b.input("x", (1, 16, 15, 32))
    y = b.op("Conv", x, _w(b, "w", 16, 8, 3, 3), kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=2, name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    plan = group_by_names(g, [("conv_epilogue", ["conv", "act"])])
    notes = _notes(generate(g, plan, options=AVX2))
    assert "direct kernel" in notes and "4x16 micro-kernel" in notes, notes


@pytest.mark.parametrize(("width", "band"), [
    (32, "over a phase-split band"),
    (30, "over a band split by kernel column, panels across output rows"),
])
def test_direct_kernel_notes_name_its_band(width, band):
    b = GraphBuilder("band")
    x = b.input("x", (1, 16, 14, width))
    y = b.op("Conv", x, _w(b, "w", 32, 4, 3, 3), kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4, name="conv")
    g = b.build(y)
    notes = _notes(generate(g, group_by_names(g, [("conv_epilogue", ["conv"])]), options=AVX512))
    assert f"direct kernel (channels x positions {band}, per group of 4 channels)" in notes, notes
    # the wide block (2 zmm of positions) both ways: across rows (420 positions, a part last panel read from the
    # band's zeroed tail) and in rows of 32
    assert "8x32 micro-kernel" in notes, notes


def _stem(c=3, oc=32, h=64, w=64, k=3, stride=2):
    b = GraphBuilder("stem")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, _w(b, "w", oc, c, k, k), kernel_shape=[k, k], strides=[stride, stride], pads=[1, 1, 1, 1],
             name="conv")
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", ["conv"])])


def test_direct_refusal_bounds_are_inclusive():
    """K = 27 (3 channels x 3x3): taken with ``conv_direct_max_k`` 27, refused with 26; one panel a row (an
    output width of 16) with ``conv_direct_one_panel_max_k`` 27, not 26."""
    from opfuse.codegen.conv_direct import direct_conv_refusal
    from opfuse.ops.nn import conv_geometry

    for w, option in ((64, "conv_direct_max_k"), (32, "conv_direct_one_panel_max_k")):
        g, _ = _stem(w=w)
        node = g.nodes[0]
        geo, G = conv_geometry(node)
        wt = np.zeros(node.input(1).shape, np.float32)
        assert direct_conv_refusal(CodegenOptions(**{option: 27}), node, geo, G, wt, np.dtype(np.float32)) is None
        why = direct_conv_refusal(CodegenOptions(**{option: 26}), node, geo, G, wt, np.dtype(np.float32))
        assert why is not None and "K = 27 > " in why, why


def test_direct_tile_floats_bound_the_c_tile():
    """``conv_direct_tile_floats`` sizes the C tile (all the channels x the tile's positions), so a smaller
    bound leaves less scratch per thread."""
    g, plan = _stem()
    big, small = (generate(g, plan, options=AVX512.with_(conv_direct_tile_floats=n)) for n in (16384, 1024))
    assert "direct kernel" in _notes(big) and "direct kernel" in _notes(small)
    assert small.kernels[0].scratch_bytes < big.kernels[0].scratch_bytes


def test_depthwise_kernel_for_two_d_only(cache_dir):
    """A depthwise Conv (groups = input = output channels) in 2-D takes the depthwise loop nest (no GEMM, no
    micro-kernel); in 3-D the grouped GEMM, against the reference."""
    b = GraphBuilder("dw2d")
    x = b.input("x", (1, 8, 10, 10))
    g = b.build(b.op("Conv", x, _w(b, "w", 8, 1, 3, 3), kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=8,
                     name="dw"))
    p = generate(g, group_by_names(g, [("conv_epilogue", ["dw"])]), options=AVX2)
    assert "opfuse_ukr_" not in p.source and not any("GEMM" in n for k in p.kernels for n in k.notes), _notes(p)
    b = GraphBuilder("dw3d")
    x = b.input("x", (1, 4, 5, 6, 7))
    y = b.op("Conv", x, _w(b, "w", 4, 1, 3, 3, 3), _w(b, "b", 4), kernel_shape=[3, 3, 3], pads=[1] * 6, group=4,
             name="dw")
    g = b.build(b.op("Relu", y, name="act"))
    got, want, _ = run_both(g, group_by_names(g, [("conv_epilogue", ["dw", "act"])]), cache_dir, options=AVX2)
    assert_close(got, want)


# (input channels, output channels, height, width, kernel, stride, pads, group, dilations, the kernel's note): each
# band the convolutions copy their input rows into, with padding on the right that windows read
BANDS = [
    (3, 24, 32, 32, 3, 1, [1, 1, 1, 1], 1, [1, 1], "over a phase-split band"),
    (3, 16, 20, 31, 5, 2, [2, 2, 2, 3], 1, [1, 1], "over a phase-split band"),
    (3, 16, 24, 32, 3, 1, [2, 1, 2, 1], 1, [2, 1], "over a phase-split band"),   # the window's rows: 2 apart
    (3, 16, 24, 32, 3, 1, [1, 2, 1, 2], 1, [1, 2], "over a phase-split band"),   # its columns: 2 apart
    (16, 32, 14, 30, 3, 1, [1, 1, 1, 1], 4, [1, 1], "panels across output rows"),
    (16, 32, 14, 2, 3, 1, [1, 1, 1, 1], 4, [1, 1], "panels across output rows"),  # the last tap: the last column
    (32, 48, 15, 15, 3, 2, [1, 1, 1, 1], 1, [1, 1], None),
    (32, 48, 15, 15, 3, 2, [1, 1, 0, 0], 1, [1, 1], None),   # the stride skips the input's last column
]


@pytest.mark.parametrize("case", BANDS, ids=["phase_s1", "phase_s2", "phase_dh2", "phase_dw2", "shifted",
                                             "shifted_w2", "windows", "windows_skip"])
def test_bands_do_not_rely_on_zeroed_scratch(case, cache_dir):
    """Every band element a window reads is written per tile (the padding zero-filled), and nothing past the
    band: run on one thread with the scratch, arena and outputs first filled with 0x7F7F7F7F (3.4e38) between
    guard bytes (``run_guarded``), against the reference."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build

    c, oc, h, w, k, s, pads, group, dil, note = case
    b = GraphBuilder("band")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, _w(b, "w", oc, c // group, k, k), _w(b, "b", oc), kernel_shape=[k, k], strides=[s, s],
             pads=pads, group=group, dilations=dil, name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    model = build(g, group_by_names(g, [("conv_epilogue", ["conv", "act"])]), cache_dir=cache_dir, threads=1,
                  options=AVX512.with_(winograd="off"))
    notes = _notes(model.program)
    assert (note in notes) if note else ("direct kernel" not in notes), notes
    feeds = reference.random_inputs(g, 0)
    assert_close(model.run_guarded(feeds, poison=0x7F), reference.run(g, feeds))


def test_windows_pack_threshold_is_inclusive():
    """A 1x1 convolution of 36 output channels packs its positions with ``windows_pack_min_channels`` 36 (no
    offset table), reads its windows with 37."""
    b = GraphBuilder("pw")
    x = b.input("x", (1, 48, 7, 7))
    g = b.build(b.op("Relu", b.op("Conv", x, _w(b, "w", 36, 48, 1, 1), _w(b, "b", 36), name="conv"), name="act"))
    plan = group_by_names(g, [("conv_epilogue", ["conv", "act"])])
    at, above = (generate(g, plan, options=CodegenOptions(windows_pack_min_channels=n)).source for n in (36, 37))
    assert "_koff" not in at and "_koff" in above


def test_windows_register_block_edges():
    """The narrow block with ``narrow_mr_max`` below its own 12 rows stays 12 x 8 (no empty range of MRs to
    choose from); the plain C build on an AVX-512 target keeps the options' block, not the windows' MR range
    (tests/mutation/mutY.md)."""
    from opfuse.codegen.conv_windows import NARROW_BLOCK, register_block
    o = CodegenOptions(vector_isa="avx2").resolved("avx2")
    assert register_block(o.with_(narrow_mr_max=10), 8, 49, 7) == NARROW_BLOCK
    wide = CodegenOptions(vector_isa="avx512", windows_mr_max=14).resolved("avx512")
    assert register_block(wide, 64, 196, 14) == (14, wide.gemm_nr)
    plain = wide.with_(simd="none")
    assert register_block(plain, 64, 196, 14) == (plain.gemm_mr, plain.gemm_nr)


def test_channel_rows_packer_reads_each_image(cache_dir):
    """A 1x1 convolution whose positions are packed per tile (``ChannelRowsPacker``) over two images: each
    image's rows come from its own planes."""
    b = GraphBuilder("pw2")
    x = b.input("x", (2, 24, 7, 7))
    g = b.build(b.op("Relu", b.op("Conv", x, _w(b, "w", 40, 24, 1, 1), _w(b, "b", 40), name="conv"), name="act"))
    got, want, m = run_both(g, group_by_names(g, [("conv_epilogue", ["conv", "act"])]), cache_dir,
                            options=AVX2.with_(windows_pack_min_channels=32))
    assert "apack" in m.program.source
    assert_close(got, want)


@pytest.mark.parametrize("kernel,pads", [((3, 1), [1, 0, 1, 0]), ((1, 3), [0, 1, 0, 1])], ids=["3x1", "1x3"])
def test_windows_band_of_a_non_square_kernel(kernel, pads, cache_dir):
    """A padded convolution whose window is taller than wide (or wider than tall), over enough channels for the
    windows GEMM (K > ``conv_direct_max_k``): each tile's band holds the rows its windows span by the kernel's
    height (tests/mutation/mutY.md)."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    b = GraphBuilder("tall")
    x = b.input("x", (1, 64, 12, 10))
    y = b.op("Conv", x, _w(b, "w", 32, 64, *kernel), _w(b, "b", 32), kernel_shape=list(kernel), pads=pads,
             name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    model = build(g, group_by_names(g, [("conv_epilogue", ["conv", "act"])]), cache_dir=cache_dir, threads=1,
                  options=AVX2.with_(gemm_tile_floats=2048))
    assert "direct kernel" not in _notes(model.program) and "_koff" in model.program.source
    feeds = reference.random_inputs(g, 0)
    assert_close(model.run_guarded(feeds, poison=0x7F), reference.run(g, feeds))


def test_direct_refusal_reasons():
    """The reasons the direct kernel gives, as the kernel's notes print them: weights known only at run time; an
    output width NR does not divide, with one group, and with groups over strided rows (tests/mutation/mutY.md)."""
    from opfuse.codegen.conv_direct import direct_conv_refusal
    from opfuse.ops.nn import conv_geometry

    def refusal(cin, cout, side, stride, group, weights=True):
        b = GraphBuilder("why")
        x = b.input("x", (1, cin, side, side))
        g = b.build(b.op("Conv", x, _w(b, "w", cout, cin // group, 3, 3), pads=[1, 1, 1, 1], strides=[stride] * 2,
                         group=group, name="conv"))
        node = g.nodes[0]
        geo, G = conv_geometry(node)
        wt = np.zeros(node.input(1).shape, np.float32) if weights else None
        return direct_conv_refusal(CodegenOptions(vector_isa="avx2"), node, geo, G, wt, np.dtype(np.float32))

    assert refusal(3, 16, 16, 1, 1, weights=False) == "not a 2-D float32 convolution with constant weights"
    assert refusal(3, 16, 14, 1, 1) == "output width 14 is not a multiple of 16 positions"
    assert refusal(32, 64, 28, 2, 2) == "output width 14 is not a multiple of 16 positions and the rows are strided"
    assert refusal(32, 64, 14, 1, 2) is None  # groups over unstrided rows: any width


def test_direct_block_rows_for_other_widths():
    """The AVX2 block's rows for ``conv_direct_nr`` 8 (one ymm: 12 rows, the range's last, though 13 would fit the
    registers) and for a width no row count fits (the 4-row fallback) (tests/mutation/mutY.md)."""
    assert direct_block(CodegenOptions(vector_isa="avx2", conv_direct_nr=8), 32) == (12, 8)
    assert direct_block(CodegenOptions(vector_isa="avx2", conv_direct_nr=256), 32) == (4, 256)
