"""Tiles cut so that threads finish together (``gemm.balance_tiles``, Winograd's blocks), and the
split each kernel records (``KernelInfo.parallel``): a convolution whose 16 output channels cannot
be cut along N gets its positions cut instead (it ran as one tile, on one thread), 7 tiles become a
count 2 and 4 threads share evenly, and none of it changes a bit of the results."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.gemm import GemmProblem, Operand, balance_tiles, choose_blocking, tile_costs
from opfuse.codegen.kernel import ParallelLoop
from opfuse.codegen.options import CORTEX_M7
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(5)


def _const(b, *shape):
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(
        np.float32))


def conv_relu(c, oc, h, w, k=3, stride=1, pads=(1, 1, 1, 1)):
    b = GraphBuilder("balance")
    x = b.input("x", (1, c, h, w))
    y = b.op("Conv", x, _const(b, oc, c, k, k), _const(b, oc), kernel_shape=[k, k], strides=[stride, stride],
             pads=list(pads), name="conv")
    g = b.build(b.op("Relu", y, name="relu"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "relu"])])


def _conv_loop(program) -> ParallelLoop:
    (info,) = [k for k in program.kernels if k.function]
    (loop,) = info.parallel
    return loop


def test_parallel_loop_speedup_is_the_makespan_bound():
    assert ParallelLoop(4, 0, "dynamic").speedup(2) == 2.0
    assert ParallelLoop(3, 0, "dynamic").speedup(2) == 1.5
    assert ParallelLoop(7, 0, "dynamic").speedup(2) == pytest.approx(7 / 4)
    # one big tile and three small ones: the big one decides
    assert ParallelLoop(4, 0, "dynamic", (6.0, 1.0, 1.0, 1.0)).speedup(2) == pytest.approx(9 / 6)
    assert ParallelLoop(5, 0, "static").speedup(2) == pytest.approx(5 / 3)
    assert ParallelLoop(1, 0, "dynamic").speedup(2) == 1.0
    assert ParallelLoop(8, 0, "static").speedup(1) == 1.0


def test_tile_costs_round_remainders_up_to_whole_register_blocks():
    # 14 rows in tiles of 12 (2 left, one 6-row panel), 40 columns in tiles of 32 (8 left, one 16-wide panel)
    assert tile_costs(14, 40, 12, 32, 6, 16) == [12 * 32, 12 * 16, 6 * 32, 6 * 16]


def test_a_one_tile_convolution_is_cut_along_its_positions(cache_dir):
    """3 -> 16 channels at 32x32 (resnet8's first convolution): N (16 channels) is one panel, so the
    cache blocking made one tile of 1024 positions; now gemm_min_tiles tiles of positions, the
    windows' band sized for them, and 1, 2 and 3 threads give the reference's values, bitwise the same.
    (Kept on the windows: by default K = 27 takes the direct kernel, ``test_conv_direct.py``.)"""
    g, plan = conv_relu(3, 16, 32, 32)
    windows = CodegenOptions(conv_direct_max_k=0)
    loop = _conv_loop(generate(g, plan, options=windows))
    assert loop.iterations >= CodegenOptions().gemm_min_tiles and loop.speedup(2) > 1.9
    kept = _conv_loop(generate(g, plan, options=windows.with_(balance_threads=())))
    assert kept.iterations == 1  # the cache blocking alone: one tile, one thread
    results = [run_both(g, plan, cache_dir, threads=n, options=windows) for n in (1, 2, 3)]
    one, want, _ = results[0]
    assert_close(one, want)
    for got, _, _ in results[1:]:
        assert all(np.array_equal(one[k], got[k]) for k in one)


def test_strided_convolution_band_follows_the_cut(cache_dir):
    """Stride 2 with padding: tiles of a few output rows read their own band rows."""
    g, plan = conv_relu(16, 32, 32, 32, stride=2, pads=(0, 0, 1, 1))
    assert _conv_loop(generate(g, plan)).iterations >= 4
    one, want, _ = run_both(g, plan, cache_dir, threads=1)
    two, _, _ = run_both(g, plan, cache_dir, threads=2)
    assert_close(one, want)
    assert all(np.array_equal(one[k], two[k]) for k in one)


def _pointwise_problem(M: int, N: int, K: int) -> GemmProblem:
    """A 1x1 convolution as the GEMM core sees it: weights (M x K, constant), activations packed per tile."""
    a = Operand(lambda ev, b, m, k: "0", static=np.zeros((1, M, K), np.float32))
    return GemmProblem("pw", 1, M, N, K, a, Operand(lambda ev, b, k, n: "0"), None, None)  # type: ignore[arg-type]


def test_seven_tiles_become_a_count_the_threads_share():
    """mobilenet_v1's pw4 (256 x 784, K 128): 7 column tiles of 112 kept 2 threads busy for 4 tiles' time
    (1.75x); rebalanced the split allows more than 1.9x, without cutting M (each row tile would pack
    the activations again)."""
    o = CodegenOptions(vector_isa="avx2").resolved("avx2")  # the 6 x 16 register block, whatever the host
    p = _pointwise_problem(256, 784, 128)
    blk = choose_blocking(p, o)
    before = ParallelLoop(0, 0, "dynamic", tuple(tile_costs(256, 784, 258, 112, 6, 16)))
    after = ParallelLoop(0, 0, "dynamic", tuple(tile_costs(256, 784, blk.MC, blk.NC, 6, 16)))
    assert before.speedup(2) == pytest.approx(1.75)
    assert after.speedup(2) > 1.9
    assert -(-256 // blk.MC) == 1  # M not cut: one packing of each column per K block
    assert blk.NC <= 112  # never larger than the cache blocking's


def test_no_threads_no_rebalancing():
    """Where nothing runs in parallel the cache blocking stays: the Cortex-M7 (no threads: every loop below
    its parallel_min_work), loops below parallel_min_work, and no balance_threads."""
    p = _pointwise_problem(256, 784, 128)
    assert balance_tiles(p, CORTEX_M7.with_(gemm_min_tiles=4), 6, 16, 258, 112) == (258, 112)
    assert balance_tiles(p, CodegenOptions(parallel_min_work=1 << 40), 6, 16, 258, 112) == (258, 112)
    assert balance_tiles(p, CodegenOptions(balance_threads=()), 6, 16, 258, 112) == (258, 112)
    assert balance_tiles(p, CodegenOptions(), 6, 16, 258, 112) != (258, 112)


def test_winograd_blocks_are_balanced_and_recorded(cache_dir):
    """F(4x4) on 72x72 outputs: 324 tiles, in 4 blocks of 96 (36 tiles in the last, rounded up to 40: two 16-tile
    panels and an 8-tile one, ``winograd_column_tails``: 328 / 192 = 1.71x on 2 threads; 1.75x with the last
    rounded up to whole 16-tile panels) by the cache budget alone; balanced, 5 blocks (> 1.9x). The recorded costs
    are the blocks' tiles rounded up to the panels they run in; 1 and 2 threads give the same bits."""
    g, plan = conv_relu(32, 32, 72, 72)
    loops = []
    # AVX2's 6 x 16 block whatever the host (a full-width AVX-512 host would take 8 x 32: ``winograd_avx512``)
    for o in (CodegenOptions(winograd="on", winograd_avx512=False),
              CodegenOptions(winograd="on", winograd_avx512=False, balance_threads=()),
              CodegenOptions(winograd="on", winograd_avx512=False, balance_threads=(), winograd_column_tails=False)):
        (info,) = [k for k in generate(g, plan, options=o).kernels if k.function]
        assert any("Winograd F(4x4" in n for n in info.notes)
        loops.append(info.parallel[0])
    balanced, cache_only, padded = loops
    assert cache_only.speedup(2) == pytest.approx(328 / 192) and balanced.speedup(2) > 1.9
    assert padded.speedup(2) == pytest.approx(1.75)
    assert balanced.iterations == len(balanced.costs) and 324 <= sum(balanced.costs) < 324 + 16 * balanced.iterations
    one, want, _ = run_both(g, plan, cache_dir, threads=1, options=CodegenOptions(winograd="on"))
    two, _, _ = run_both(g, plan, cache_dir, threads=2, options=CodegenOptions(winograd="on"))
    assert_close(one, want)
    assert all(np.array_equal(one[k], two[k]) for k in one)


def test_serial_kernels_record_no_parallel_loop():
    b = GraphBuilder("small")
    x = b.input("x", (4, 4))
    g = b.build(b.op("Relu", x, name="relu"))
    program = generate(g)
    (info,) = [k for k in program.kernels if k.function]
    assert info.parallel == ()
