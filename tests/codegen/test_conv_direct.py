"""The direct convolution kernel (``codegen/conv_direct.py``: channels x positions over a phase-split
input band, for convolutions with few input channels) against the reference, the plain C99 build and
the AVX2 block; strides, dilations, paddings, several images, fused epilogues (Relu, Clip, residual
Add), 2 threads bitwise equal to 1; and the refusals, each with its reason."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both, assert_relu_keeps_nan_and_negative_zero
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.conv_direct import direct_block, direct_conv_refusal
from opfuse.ops import GraphBuilder
from opfuse.ops.nn import conv_geometry

rng = np.random.default_rng(27)
AVX512 = CodegenOptions(vector_isa="avx512")
AVX2 = CodegenOptions(vector_isa="avx2")
PORTABLE = CodegenOptions(simd="none")
NOTE = "direct kernel"


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def _activation(b, y, epilogue, names):
    """``y`` through Relu or Clip(0, 6) when ``epilogue`` names one (its node named 'act', added to ``names``)."""
    if epilogue == "Relu":
        y = b.op("Relu", y, name="act")
        names.append("act")
    elif epilogue == "Clip":
        y = b.op("Clip", y, b.const("lo", np.float32(0.0)), b.const("hi", np.float32(6.0)), name="act")
        names.append("act")
    return y


def _conv_graph(c, oc, h, w, k, stride, pads, dil=1, epilogue="Relu", n=1, group=1):
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, h, w))
    y = b.op("Conv", x, _w(b, oc, c // group, k, k), _w(b, oc), kernel_shape=[k, k], strides=[stride, stride],
             pads=pads, dilations=[dil, dil], group=group, name="conv")
    names = ["conv"]
    if epilogue in ("Relu", "Clip"):
        y = _activation(b, y, epilogue, names)
    elif epilogue == "Add":  # residual: a second input of the output's shape
        r = b.input("r", (n, oc, (h + pads[0] + pads[2] - dil * (k - 1) - 1) // stride + 1,
                          (w + pads[1] + pads[3] - dil * (k - 1) - 1) // stride + 1))
        y = b.op("Relu", b.op("Add", y, r, name="add"), name="act")
        names += ["add", "act"]
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", names)])


def _notes(m) -> str:
    return " ".join(n for k in m.program.kernels for n in k.notes)


# (c, oc, h, w, k, stride, pads, dilation, epilogue, images)
CASES = [
    (3, 32, 64, 64, 3, 2, [1, 1, 1, 1], 1, "Relu", 1),     # mobilenet's stem, smaller
    (3, 24, 32, 32, 3, 1, [1, 1, 1, 1], 1, "Clip", 1),     # stride 1, 24 channels (a part MR panel)
    (3, 8, 36, 33, 5, 2, [2, 1, 2, 2], 1, "Relu", 2),      # 5x5, asymmetric pads, odd width, 2 images
    (3, 40, 70, 64, 7, 2, [3, 3, 3, 3], 1, "Add", 1),      # resnet's 7x7 stem (K = 147)
    (2, 17, 40, 32, 3, 1, [2, 2, 2, 2], 2, "Relu", 1),     # dilation 2, 17 channels
    (4, 16, 47, 48, 3, 3, [0, 1, 0, 0], 1, "none", 1),     # stride 3, no epilogue, padding on one side
    (3, 20, 16, 224, 7, 2, [3, 3, 3, 3], 1, "Relu", 1),    # 112 wide: 32-position panels in two pieces
    (3, 16, 48, 96, 3, 2, [1, 1, 1, 1], 1, "Clip", 2),     # 48 wide: every other panel's pieces in two rows
]


def _case_options(case):
    # Let every case in (the profitable bounds are not the legal ones).
    return {"conv_direct_max_k": 200, "conv_direct_one_panel_max_k": 200}


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}x{c[1]}_{c[2]}x{c[3]}_k{c[4]}s{c[5]}_{c[8]}" for c in CASES])
def test_direct_conv_matches_reference_portable_and_avx2(case, cache_dir):
    c, oc, h, w, k, s, pads, dil, epi, n = case
    g, plan = _conv_graph(c, oc, h, w, k, s, pads, dil, epi, n)
    extra = _case_options(case)
    wide, want, m = run_both(g, plan, cache_dir, options=AVX512.with_(**extra))
    narrow, _, m2 = run_both(g, plan, cache_dir, options=AVX2.with_(**extra))
    portable, _, m3 = run_both(g, plan, cache_dir, options=PORTABLE.with_(**extra))
    for model in (m, m2, m3):
        assert NOTE in _notes(model), _notes(model)
    assert "_packed_koff_" in m.program.source and "_mm512_fmadd_ps" in m.program.source
    assert "_mm512" not in m2.program.source and "_mm512" not in m3.program.source
    assert_close(wide, want)
    assert_close(narrow, want)
    assert_close(portable, want)
    assert_close(wide, portable)


def test_two_threads_bitwise_equal_to_one(cache_dir):
    g, plan = _conv_graph(3, 32, 96, 96, 3, 2, [1, 1, 1, 1])
    one, _, m1 = run_both(g, plan, cache_dir, threads=1)
    two, _, m2 = run_both(g, plan, cache_dir, threads=2)
    assert NOTE in _notes(m1)
    for name in one:
        assert np.array_equal(one[name], two[name])


def test_same_c_twice():
    g, plan = _conv_graph(3, 32, 64, 64, 3, 2, [1, 1, 1, 1])
    p1, p2 = generate(g, plan, options=AVX512), generate(g, plan, options=AVX512)
    assert p1.source == p2.source and p1.weights == p2.weights


def _refusal(c, oc, h, w, k, s, pads, group=1, **opts):
    g, _ = _conv_graph(c, oc, h, w, k, s, pads, group=group)
    node = next(n for n in g.nodes if n.op_type == "Conv")
    weights = np.zeros(node.input(1).shape, np.float32)
    geo, G = conv_geometry(node)
    return direct_conv_refusal(CodegenOptions(**opts), node, geo, G, weights, np.dtype(np.float32))


def test_refusals_have_reasons():
    assert _refusal(3, 32, 64, 64, 3, 2, [1, 1, 1, 1]) is None
    assert "not a multiple of 16" in _refusal(3, 32, 30, 30, 3, 1, [1, 1, 1, 1])
    assert _refusal(3, 32, 64, 64, 7, 2, [3, 3, 3, 3]) is None  # resnet's stem, K = 147
    assert "K = 288 > conv_direct_max_k = 160" in _refusal(32, 32, 64, 64, 3, 2, [1, 1, 1, 1])
    assert "one panel a row and K = 144 > conv_direct_one_panel_max_k = 96" in _refusal(16, 32, 32, 32, 3, 2,
                                                                                        [1, 1, 1, 1])
    assert _refusal(8, 16, 32, 32, 3, 2, [1, 1, 1, 1]) is None  # one panel a row, K = 72
    assert _refusal(4, 16, 32, 32, 3, 1, [1, 1, 1, 1], group=2) is None  # grouped, phase-split band
    assert _refusal(256, 256, 14, 14, 3, 1, [1, 1, 1, 1], group=32) is None  # 8 per group, panels across rows
    assert "not a multiple of 16 positions and the rows are strided" in _refusal(64, 64, 28, 28, 3, 2, [1, 1, 1, 1],
                                                                                 group=8)
    assert "K = 288 > conv_direct_max_k" in _refusal(128, 128, 28, 28, 3, 1, [1, 1, 1, 1], group=4)
    assert "conv_direct_grouped off" in _refusal(4, 8, 32, 32, 3, 1, [1, 1, 1, 1], group=2, conv_direct_grouped=False)
    assert "4 output channels per group < 8" in _refusal(16, 16, 14, 14, 3, 1, [1, 1, 1, 1], group=4)
    assert "off" in _refusal(3, 32, 64, 64, 3, 2, [1, 1, 1, 1], conv_direct_max_k=0)


# Grouped: (c, oc, h, w, k, stride, pads, dilation, epilogue, images, group). Widths 16 does not divide take
# the band split by kernel column (panels across output rows), the others the phase-split band per group.
GROUPED = [
    (64, 64, 14, 14, 3, 1, [1, 1, 1, 1], 1, "Relu", 1, 8),    # 8 channels per group at 14x14 (a g32 layer's)
    (48, 24, 13, 11, 3, 1, [1, 0, 1, 2], 1, "Add", 2, 3),     # odd sizes, asymmetric pads, 2 images, 8 out/group
    (32, 32, 12, 21, 3, 1, [1, 1, 1, 1], 1, "Clip", 1, 4),    # a column stride below (case 3)
    (16, 16, 15, 23, 3, 1, [2, 2, 2, 2], 2, "Relu", 1, 2),    # dilation 2
    (24, 48, 10, 37, 5, 1, [2, 2, 2, 2], 1, "none", 1, 6),    # 5x5, 4 in 8 out per group, no epilogue
    (16, 32, 20, 32, 3, 1, [1, 1, 1, 1], 1, "Relu", 1, 4),    # width 32: the phase-split band, per group
    (16, 32, 20, 64, 3, 2, [1, 1, 1, 1], 1, "Relu", 1, 4),    # stride 2, width 32: phase-split
]


def _grouped_graph(case, column_stride=1):
    c, oc, h, w, k, s, pads, dil, epi, n, group = case
    if column_stride == 1:
        return _conv_graph(c, oc, h, w, k, s, pads, dil, epi, n, group)
    b = GraphBuilder("conv")
    x = b.input("x", (n, c, h, w))
    y = b.op("Conv", x, _w(b, oc, c // group, k, k), _w(b, oc), kernel_shape=[k, k], strides=[1, column_stride],
             pads=pads, dilations=[dil, dil], group=group, name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "act"])])


@pytest.mark.parametrize("column_stride", [1, 2])
@pytest.mark.parametrize("case", GROUPED, ids=[f"{c[0]}x{c[1]}g{c[10]}_{c[2]}x{c[3]}_k{c[4]}s{c[5]}_{c[8]}"
                                               for c in GROUPED])
def test_grouped_direct_conv_matches_reference_portable_and_avx2(case, column_stride, cache_dir):
    if column_stride != 1 and case[5] != 1:
        pytest.skip("one stride at a time")
    g, plan = _grouped_graph(case, column_stride)
    wide, want, m = run_both(g, plan, cache_dir, options=AVX512)
    narrow, _, m2 = run_both(g, plan, cache_dir, options=AVX2)
    portable, _, m3 = run_both(g, plan, cache_dir, options=PORTABLE)
    old, _, m4 = run_both(g, plan, cache_dir, options=AVX512.with_(conv_direct_grouped=False))
    crossing = case[3] % 16 != 0
    for model in (m, m2, m3):
        assert NOTE in _notes(model), _notes(model)
        assert model.report["kernels"] == 1
        assert ("panels across output rows" in _notes(model)) == crossing
        assert f"per group of {case[0] // case[10]} channels" in _notes(model)
    assert NOTE not in _notes(m4)
    assert "_packed_koff_" in m.program.source and "_mm512_fmadd_ps" in m.program.source
    for got in (wide, narrow, portable, old):
        assert_close(got, want)
    assert_close(wide, portable)


def test_grouped_tiles_across_rows(cache_dir):
    """Small C tiles (``conv_direct_tile_floats``): tiles of 32 positions start inside output rows of 37, so
    each band starts at its first row and the panels' origins are off its start; same results."""
    g, plan = _conv_graph(16, 16, 12, 37, 3, 1, [1, 1, 1, 1], group=2)
    for options in (AVX512, AVX2, PORTABLE):
        got, want, m = run_both(g, plan, cache_dir, options=options.with_(conv_direct_tile_floats=256))
        assert NOTE in _notes(m)
        assert_close(got, want)


def test_grouped_two_threads_bitwise_equal_to_one(cache_dir):
    g, plan = _conv_graph(64, 64, 14, 14, 3, 1, [1, 1, 1, 1], group=8)
    one, _, m1 = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    assert NOTE in _notes(m1)
    for name in one:
        assert np.array_equal(one[name], two[name])


def test_grouped_band_through_a_prologue(cache_dir):
    """The input computed in the group (Relu of x): the band split by kernel column is filled element by element
    through it (no memcpy from memory), same results."""
    b = GraphBuilder("pre")
    x = b.input("x", (1, 32, 14, 14))
    y = b.op("Conv", b.op("Relu", x, name="pre"), _w(b, 32, 8, 3, 3), _w(b, 32), kernel_shape=[3, 3],
             pads=[1, 1, 1, 1], group=4, name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    plan = group_by_names(g, [("conv_epilogue", ["pre", "conv", "act"])])
    for options in (AVX512, PORTABLE):
        got, want, m = run_both(g, plan, cache_dir, options=options)
        assert NOTE in _notes(m) and m.report["kernels"] == 1
        assert_close(got, want)


def test_refused_convolutions_take_the_windows_kernel(cache_dir):
    """An output width that no panel divides, or the kernel turned off: the windows GEMM, same results."""
    g, plan = _conv_graph(3, 16, 30, 30, 3, 1, [1, 1, 1, 1])
    got, want, m = run_both(g, plan, cache_dir)
    assert NOTE not in _notes(m) and "_packed_koff_" not in m.program.source
    assert_close(got, want)
    g, plan = _conv_graph(3, 32, 64, 64, 3, 2, [1, 1, 1, 1])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(conv_direct_max_k=0))
    assert NOTE not in _notes(m)
    assert_close(got, want)


def test_register_block():
    assert direct_block(AVX512.resolved("avx512"), 64, wide=True) == (8, 32)   # the least padding, not 14 rows
    assert direct_block(AVX512.resolved("avx512"), 20, wide=True) == (10, 32)
    assert direct_block(AVX512.resolved("avx512"), 4, wide=True) == (8, 32)    # at least 8 rows
    assert direct_block(AVX512.resolved("avx512").with_(conv_direct_vectors=1), 32, wide=True) == (16, 16)
    assert direct_block(AVX2.resolved("avx2"), 32, wide=True) == (6, 16)
    assert direct_block(AVX512.resolved("avx512"), 32) == (16, 16)
    assert direct_block(AVX512.resolved("avx512"), 8) == (8, 16)   # at least 8 zmm chains
    assert direct_block(AVX2.resolved("avx2"), 32) == (6, 16)
    assert direct_block(PORTABLE.resolved("avx512"), 32) == (6, 16)
    assert direct_block(AVX2.resolved("avx2"), 8, least_padding=True) == (4, 16)  # a group's 8 channels
    assert direct_block(AVX2.resolved("avx2"), 24, least_padding=True) == (6, 16)
    assert direct_block(AVX512.resolved("avx512"), 8, least_padding=True) == (8, 16)


@pytest.mark.parametrize("h, w, block", [(16, 224, "10x32_packed_koff_h16"), (48, 96, "10x32_packed_koff_h16"),
                                         (32, 64, "10x32_packed_koff_pf"), (30, 32, "12x16_packed_koff_pf")])
def test_wide_block_where_its_panels_are_whole(h, w, block):
    """The 32-position block with the AVX-512 body: in two pieces where 32 does not divide the output width
    (112, 48) but the positions are whole panels, in one where it divides it; 16 wide where 15 rows of 16
    would leave a part panel (its second piece past the band): 16 x 16, whose 20 channels run as tail panels
    of 12 and 8 rows (``gemm.tail_panels``)."""
    g, plan = _conv_graph(3, 20, h, w, 3, 2, [1, 1, 1, 1])
    source = generate(g, plan, options=AVX512).source
    assert f"opfuse_ukr_{block}" in source
    assert "koff_h16" not in generate(g, plan, options=AVX512.with_(conv_direct_vectors=1)).source


def test_wide_block_same_bits_as_the_narrow_one(cache_dir):
    """Each output sums its products in increasing k with one FMA each whatever the block: 10 x 32 in pieces
    (112 wide) gives the bits of 16 x 16."""
    g, plan = _conv_graph(3, 20, 16, 224, 7, 2, [3, 3, 3, 3])
    wide, want, m = run_both(g, plan, cache_dir, options=AVX512)
    narrow, _, m1 = run_both(g, plan, cache_dir, options=AVX512.with_(conv_direct_vectors=1))
    assert "koff_h16" in m.program.source and "koff_h16" not in m1.program.source
    assert_close(wide, want)
    for k in wide:
        assert np.array_equal(wide[k], narrow[k])


# The micro-kernel's own epilogue (``gemm.register_epilogue``) ------------------------------------
def _pointwise_graph(c, oc, h, w, epilogue="Relu", bias=True, stride=1):
    b = GraphBuilder("pw")
    x = b.input("x", (1, c, h, w))
    ins = [x, _w(b, oc, c, 1, 1)] + ([_w(b, oc)] if bias else [])
    y = b.op("Conv", *ins, kernel_shape=[1, 1], strides=[stride, stride], name="conv")
    names = ["conv"]
    y = _activation(b, y, epilogue, names)
    g = b.build(y)
    return g, group_by_names(g, [("conv_epilogue", names)])


# (c, oc, h, w, epilogue, bias, stride, whether the storing micro-kernel is taken)
STORE_CASES = [
    (32, 64, 32, 32, "Relu", True, 1, True),     # whole panels (1024 positions)
    (40, 24, 28, 28, "Relu", True, 1, True),     # 784 positions: a part last panel via the epilogue
    (1100, 16, 16, 16, "none", False, 1, True),  # K = 1100 > KC: the store after the last K block
    (16, 32, 32, 32, "none", True, 2, True),     # strided 1x1 (256 positions)
    (32, 64, 32, 32, "Clip", True, 1, False),    # Clip: the tile epilogue
    (20, 12, 32, 32, "Relu", True, 1, True),     # 12 channels: a part 8-row block via the epilogue
]


@pytest.mark.parametrize("case", STORE_CASES, ids=[f"{c[0]}x{c[1]}_{c[2]}x{c[3]}_{c[4]}_b{int(c[5])}_s{c[6]}"
                                                   for c in STORE_CASES])
@pytest.mark.parametrize("options", [AVX512, AVX2, PORTABLE], ids=["avx512", "avx2", "portable"])
def test_register_epilogue_same_bits_as_the_tile_epilogue(case, options, cache_dir):
    c, oc, h, w, epi, bias, stride, taken = case
    g, plan = _pointwise_graph(c, oc, h, w, epi, bias, stride)
    got, want, m = run_both(g, plan, cache_dir, options=options)
    old, _, m0 = run_both(g, plan, cache_dir, options=options.with_(gemm_register_epilogue=False))
    assert bool(re.search(r"opfuse_ukr_\w+_st(b|r|br)?\(", m.program.source)) == taken
    assert ("by the micro-kernel" in _notes(m)) == taken and "by the micro-kernel" not in _notes(m0)
    assert "_st(" not in m0.program.source and "_stb" not in m0.program.source and "_str(" not in m0.program.source
    assert_close(got, want)
    for name in got:
        assert np.array_equal(got[name], old[name])


def test_register_epilogue_two_threads_bitwise_equal_to_one(cache_dir):
    g, plan = _pointwise_graph(40, 24, 28, 28)
    one, _, m1 = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    assert "_stbr(" in m1.program.source
    for name in one:
        assert np.array_equal(one[name], two[name])


def test_register_epilogue_keeps_nan_and_negative_zero(cache_dir):
    """max(0, y) in the vector bodies returns y where y is NaN or -0, as the C epilogue does."""
    g, plan = _pointwise_graph(8, 16, 4, 8, "Relu", bias=False)
    x = np.zeros((1, 8, 4, 8), np.float32)
    x[0, :, 0, 0] = np.nan
    x[0, :, 0, 1] = -0.0
    assert_relu_keeps_nan_and_negative_zero(g, plan, x, cache_dir, (AVX512, AVX2, PORTABLE), "gemm_register_epilogue")


def test_direct_conv_with_a_prologue(cache_dir):
    """The input computed in the group (x * scale + shift, a normalisation): the band is filled through it."""
    b = GraphBuilder("pre")
    x = b.input("x", (1, 3, 64, 64))
    pre = b.op("Add", b.op("Mul", x, b.const("scale", np.float32(0.5)), name="mul"), b.const("shift", np.float32(-1.0)),
               name="add")
    y = b.op("Conv", pre, _w(b, 32, 3, 3, 3), _w(b, 32), kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
             name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    plan = group_by_names(g, [("conv_epilogue", ["mul", "add", "conv", "act"])])
    for options in (AVX512, PORTABLE):
        got, want, m = run_both(g, plan, cache_dir, options=options)
        assert NOTE in _notes(m) and m.report["kernels"] == 1
        assert_close(got, want)


@pytest.mark.parametrize("nr", [8, 24])
def test_direct_block_of_part_zmm_pieces_on_avx512(nr, cache_dir):
    """``conv_direct_nr`` positions that are not whole zmm vectors (8, 24) on the AVX-512 target: no wide block of
    two pieces (each piece would be loaded a zmm at a time; the AVX-512 body asserted on it, found by mutation
    testing, tests/mutation/mutM.md); an output width of 24 with 2 output rows, the direct kernel within
    float32 rounding of the reference."""
    g, plan = _conv_graph(3, 16, 4, 26, 3, 1, [0, 0, 0, 0])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(vector_isa="avx512", conv_direct_nr=nr))
    assert NOTE in _notes(m)
    assert_close(got, want)
