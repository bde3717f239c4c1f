"""Shapes at the GEMM core's tile edges, against the reference (mutation testing of ``codegen/gemm.py``'s
C-emitting functions, tests/MUTATION.md, mutG): a batched GEMM whose last column tile is one column wide
(the batch index of a tile, the tile's column count), B packed per tile in K blocks from rows in memory (whole
panels and a partial one), and sibling 1x1 convolutions stacked along M finished by the scalar tile epilogue (each
sibling's columns are the output's columns: no shift by the sibling's first row). AVX2's options (6 x 16)
with the balancing off, so the blocking asserted below is the one ``choose_blocking`` gives; a few seconds."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.gemm import GemmProblem, Operand, choose_blocking
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(2026)
AVX2 = CodegenOptions(vector_isa="avx2", balance_threads=())


def _w(b, *shape):
    fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32))


def _blocking(nb, M, N, K, options):
    """The cache blocking of a run-time x run-time problem of this shape (what the built kernel uses)."""
    def load(ev, b, i, j):
        return "0"
    p = GemmProblem("p", nb, M, N, K, Operand(load), Operand(load), None, None)  # type: ignore[arg-type]
    return choose_blocking(p, options.resolved("avx2"))


@pytest.mark.parametrize("kc", [1024, 16], ids=["one-k-block", "k-blocks"])
def test_batched_matmul_last_column_tile_of_one(kc, cache_dir):
    """Two batches of 5 x 40 @ 40 x 257, both operands at run time: 257 = 256 + 1 columns are two column tiles,
    the second one column wide; each tile's batch is t / (MT * NT); B (257 columns, not whole panels) packed per
    tile, in three K blocks of at most 16 with ``gemm_kc`` 16 (each block's rows start at pc)."""
    nb, M, K, N = 2, 5, 40, 257
    options = AVX2.with_(gemm_kc=kc)
    blk = _blocking(nb, M, N, K, options)
    assert N > blk.NC and N % blk.NC == 1 and (blk.KC < K) == (kc == 16)
    b = GraphBuilder("bmm")
    y = b.op("MatMul", b.input("a", (nb, M, K)), b.input("b", (nb, K, N)), name="mm")
    g = b.build(b.op("Relu", y, name="relu"))
    plan = group_by_names(g, [("gemm_epilogue", ["mm", "relu"])])
    for opts in (options, options.with_(simd="none")):
        got, want, _ = run_both(g, plan, cache_dir, options=opts)
        assert_close(got, want)


@pytest.mark.parametrize("side", [16, 18], ids=["whole-panels", "partial-panel"])
def test_1x1_conv_packs_rows_in_k_blocks(side, cache_dir):
    """A 1x1 convolution of 64 channels packing its input rows per tile (B = channels x positions) in four K
    blocks of 16: each block copies rows pc .. pc + 15. 16 x 16 = 256 positions are whole 16-column panels (one
    memcpy per row and panel); 18 x 18 = 324 leave a partial panel of 4 (whole panels copied, the rest read and
    padded). Both fill their panels closely enough (``conv.PACKED_WASTE``) to pack rows, not read windows. The copy
    before the calls (``gemm_pack_in_kernel`` off; with it on: ``test_pack_in_kernel.py``)."""
    b = GraphBuilder("pw")
    x = b.input("x", (1, 64, side, side))
    y = b.op("Conv", x, _w(b, 24, 64, 1, 1), _w(b, 24), name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    plan = group_by_names(g, [("conv_epilogue", ["conv", "relu"])])
    options = AVX2.with_(gemm_kc=16, gemm_pack_in_kernel=False)
    got, want, m = run_both(g, plan, cache_dir, options=options)
    assert "memcpy(" in m.program.source  # B's rows copied from memory
    assert_close(got, want)


@pytest.mark.parametrize("side", [14, 7])
def test_1x1_conv_with_a_wasteful_last_panel_reads_windows(side, cache_dir):
    """14 x 14 = 196 positions in 208 columns of AVX2's 16-column panels (6% padding), 7 x 7 = 49 in 64: above
    ``conv.PACKED_WASTE``, so the positions are the GEMM's rows (196 in 198 rows of 6) and X's rows are not
    copied into column panels; the same outputs."""
    b = GraphBuilder("pw_windows")
    x = b.input("x", (1, 64, side, side))
    y = b.op("Conv", x, _w(b, 24, 64, 1, 1), _w(b, 24), name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    plan = group_by_names(g, [("conv_epilogue", ["conv", "relu"])])
    got, want, m = run_both(g, plan, cache_dir, options=AVX2)
    assert "memcpy(" not in m.program.source
    assert_close(got, want)


@pytest.mark.parametrize("options", [AVX2.with_(vector_epilogue=False), CodegenOptions(simd="none")],
                         ids=["scalar-epilogue", "plain-c"])
def test_sibling_1x1_convs_stacked_along_m_scalar_epilogue(options, cache_dir):
    """Two 1x1 convolutions of one input (16 x 16 positions: rows packed, weights in A) in one horizontal stage:
    one GEMM over their weights stacked along M (24 + 40 output channels), whose tile epilogue is the scalar loop
    here; the second sibling's rows start at 24 (its channel is m - 24), its positions are the tile's columns."""
    b = GraphBuilder("siblings_m")
    x = b.input("x", (1, 16, 16, 16))
    c1 = b.op("Relu", b.op("Conv", x, _w(b, 24, 16, 1, 1), _w(b, 24), name="c1"), name="r1")
    c2 = b.op("Conv", x, _w(b, 40, 16, 1, 1), _w(b, 40), name="c2")
    g = b.build(c1, c2)
    plan = group_by_names(g, [("horizontal", ["c1", "r1", "c2"])])
    got, want, model = run_both(g, plan, cache_dir, options=options)
    assert model.report["functions"] == 1
    assert " - 24" in model.program.source  # the second sibling's rows, from 24
    assert_close(got, want)


@pytest.mark.parametrize("side", [16, 18], ids=["whole-panels", "partial-panel"])
def test_1x1_conv_of_computed_rows_packs_them_element_by_element(side, cache_dir):
    """Relu -> 1x1 convolution in one kernel: X's rows are computed, not in memory, so B is packed per tile
    by loading each element (16 x 16 positions: whole panels, the loop of constant trip count; 18 x 18: a
    partial panel, padded with zeros), in two K blocks of 16, for each of two images."""
    b = GraphBuilder("pw_pre")
    x = b.input("x", (2, 32, side, side))
    y = b.op("Conv", b.op("Relu", x, name="pre"), _w(b, 24, 32, 1, 1), _w(b, 24), name="conv")
    g = b.build(y)
    plan = group_by_names(g, [("conv_epilogue", ["pre", "conv"])])
    got, want, _ = run_both(g, plan, cache_dir, options=AVX2.with_(gemm_kc=16))
    assert_close(got, want)


def test_convs_packing_b_through_their_packer(cache_dir):
    """Convolutions whose B (the input's windows) is packed per tile by ``conv.py``'s packers: a 1-D
    convolution (im2col) and a 2-D one whose weights are a run-time input (row segments), in K blocks."""
    b = GraphBuilder("conv1d")
    x = b.input("x", (2, 8, 40))
    y = b.op("Conv", x, _w(b, 12, 8, 3), _w(b, 12), kernel_shape=[3], pads=[1, 1], name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    got, want, _ = run_both(g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])]), cache_dir,
                            options=AVX2.with_(gemm_kc=16))
    assert_close(got, want)
    b = GraphBuilder("conv_wx")
    x, w = b.input("x", (1, 6, 9, 9)), b.input("w", (10, 6, 3, 3))
    g = b.build(b.op("Relu", b.op("Conv", x, w, pads=[1, 1, 1, 1], name="conv"), name="relu"))
    got, want, _ = run_both(g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])]), cache_dir,
                            options=AVX2.with_(gemm_kc=16))
    assert_close(got, want)


@pytest.mark.parametrize("const", ["a", "b"])
def test_batched_matmul_with_a_constant_operand_per_batch(const, cache_dir):
    """Two batches, each with its own constant operand (not folded: the batches' weights differ): the packed
    panels of batch b start b x (panels x K x block) floats in."""
    b = GraphBuilder("bconst")
    if const == "a":
        y = b.op("MatMul", _w(b, 2, 14, 20), b.input("x", (2, 20, 33)), name="mm")
    else:
        y = b.op("MatMul", b.input("x", (2, 5, 20)), _w(b, 2, 20, 33), name="mm")
    g = b.build(b.op("Relu", y, name="relu"))
    got, want, _ = run_both(g, group_by_names(g, [("gemm_epilogue", ["mm", "relu"])]), cache_dir, options=AVX2)
    assert_close(got, want)


def test_batched_matmul_reads_b_in_place(cache_dir):
    """Three batches of 4 x 24 @ 24 x 48, both at run time, with AVX2's 16-column panels: N a multiple of 16, so
    B's rows are read in place (not packed), each tile's pointer into its own batch of B (an AVX-512 host's
    32-column panels would pack this B; ``test_gemm_paths.test_matmul_activations_in_place`` builds with them)."""
    b = GraphBuilder("bmm_in_place")
    y = b.op("MatMul", b.input("a", (3, 4, 24)), b.input("b", (3, 24, 48)), name="mm")
    g = b.build(b.op("Relu", y, name="relu"))
    got, want, m = run_both(g, group_by_names(g, [("gemm_epilogue", ["mm", "relu"])]), cache_dir, options=AVX2)
    assert "bpack" not in m.program.source  # B not packed
    assert_close(got, want)


def test_batched_matmul_packs_a_computed_operand(cache_dir):
    """Relu -> MatMul in one kernel over two batches: A's rows are computed, not in memory, so A is packed per
    tile by loading each element of its own batch."""
    b = GraphBuilder("bmm_pre")
    a = b.op("Relu", b.input("a", (2, 7, 24)), name="pre")
    g = b.build(b.op("MatMul", a, b.input("b", (2, 24, 20)), name="mm"))
    got, want, m = run_both(g, group_by_names(g, [("gemm_epilogue", ["pre", "mm"])]), cache_dir, options=AVX2)
    assert "apack" in m.program.source  # A packed per tile
    assert_close(got, want)


def test_conv_with_a_run_time_bias(cache_dir):
    """A 1x1 convolution whose bias is a run-time input: the storing micro-kernel adds only a constant bias
    (``register_epilogue``), so the bias goes through the tile epilogue; against the reference."""
    b = GraphBuilder("conv_bias_input")
    x, bias = b.input("x", (1, 16, 16, 16)), b.input("bias", (24,))
    g = b.build(b.op("Relu", b.op("Conv", x, _w(b, 24, 16, 1, 1), bias, name="conv"), name="relu"))
    got, want, _ = run_both(g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])]), cache_dir, options=AVX2)
    assert_close(got, want)


def test_gemm_stage_with_two_outputs_keeps_the_tile_epilogue(cache_dir):
    """Conv -> Relu in one kernel where the convolution's own output is a model output too: the stage has two
    outputs, so the storing micro-kernel (one output) is refused and the tile epilogue stores both."""
    b = GraphBuilder("two_outputs")
    x = b.input("x", (1, 16, 16, 16))
    y = b.op("Conv", x, _w(b, 24, 16, 1, 1), _w(b, 24), name="conv")
    g = b.build(b.op("Relu", y, name="relu"), y)
    got, want, _ = run_both(g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])]), cache_dir, options=AVX2)
    assert len(want) == 2
    assert_close(got, want)
