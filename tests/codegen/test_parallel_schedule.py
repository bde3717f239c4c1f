"""How parallel loops hand out work: GEMM/conv tiles one at a time where static blocks of them would be uneven
(tiles differ in size, or do not divide among the threads), static blocks where the tiles run along one side of the
output and divide evenly (``CodegenOptions.parallel_static_contiguous``: each thread then writes one contiguous part
of every output plane), light iterations in static chunks; and threads never change results."""
from __future__ import annotations


import numpy as np
import pytest

from cg_support import epilogue_plan, pointwise_relu
from opfuse.codegen.kernel import STATIC_MIN_EFFICIENCY, ParallelLoop
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.outline import parallel_loops
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

STATIC, DYNAMIC = "schedule(static)", "schedule(dynamic, 1)"


def _graph():
    """A MatMul (128 x 768 x 768: six tiles of the same size, along one side), then a big elementwise Add."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("sched")
    x = b.input("x", (128, 768))
    y = b.op("MatMul", x, b.const("w", rng.standard_normal((768, 768)).astype(np.float32) / 30))
    z = b.op("Add", y, b.input("r", (128, 768)))
    return b.build(b.op("Relu", b.op("Softmax", z, axis=-1)))


def _matmul(m: int, k: int, n: int):
    rng = np.random.default_rng(1)
    b = GraphBuilder("mm")
    x = b.input("x", (m, k))
    y = b.op("MatMul", x, b.const("w", rng.standard_normal((k, n)).astype(np.float32) / 30))
    g = b.build(b.op("Relu", y))
    return g, epilogue_plan(g)


def _pragmas(source: str) -> list[tuple[str, int]]:
    """(schedule, iterations) of every parallel loop."""
    return [(lp.schedule, int(lp.bound)) for lp in parallel_loops(source) if lp.bound.isdigit()]


def _schedules(g, plan, **options) -> list[tuple[str, str]]:
    source = generate(g, plan, options=CodegenOptions(**options)).source
    return [(lp.schedule, lp.bound) for lp in parallel_loops(source)]


def test_even_tiles_along_one_side_keep_static_blocks_and_light_iterations_too():
    g = _graph()
    pragmas = _pragmas(generate(g, epilogue_plan(g)).source)
    assert (STATIC, 6) in pragmas  # the GEMM's six tiles: three a thread
    assert (STATIC, 128) in pragmas  # Softmax rows: 768 elements each
    assert {kind for kind, _ in pragmas} == {STATIC}


@pytest.mark.parametrize("c, oc, hw, tiles", [(64, 128, 56, 14), (32, 64, 112, 49)])
def test_a_pointwise_convolution_s_position_tiles_are_split_in_two_halves(c, oc, hw, tiles):
    # mobilenet_v1's pw1 and pw2: each thread writes one half of every output plane
    g, plan = pointwise_relu(c, oc, hw, np.random.default_rng(0))
    assert _schedules(g, plan) == [(STATIC, str(tiles))]
    assert _schedules(g, plan, parallel_static_contiguous=False) == [(DYNAMIC, str(tiles))]


def test_tiles_that_do_not_divide_among_the_threads_go_one_at_a_time():
    # 784 positions in tiles of 128: seven tiles, static halves of four and three
    g, plan = pointwise_relu(128, 256, 28, np.random.default_rng(0))
    assert _schedules(g, plan) == [(DYNAMIC, "7")]
    # fourteen tiles divide among two threads, not among three (blocks of 5, 5, 4: 14 / 15 busy)
    g, plan = pointwise_relu(64, 128, 56, np.random.default_rng(0))
    assert _schedules(g, plan, balance_threads=(3,)) == [(DYNAMIC, "14")]
    assert _schedules(g, plan, balance_threads=(2, 3)) == [(DYNAMIC, "14")]
    assert _schedules(g, plan, balance_threads=(2, 7)) == [(STATIC, "14")]


def test_the_balance_is_that_of_static_blocks():
    even = ParallelLoop(14, 0, "static", (1.0,) * 14)
    assert even.speedup(2) / 2 == 1.0
    assert even.speedup(3) / 3 == pytest.approx(14 / 15) and 14 / 15 < STATIC_MIN_EFFICIENCY
    part = ParallelLoop(7, 0, "static", (4.0,) * 6 + (0.5,))  # the seven tiles above, in panels
    assert part.speedup(2) / 2 < STATIC_MIN_EFFICIENCY


def test_tiles_across_both_sides_go_one_at_a_time():
    # 1024 x 1024 outputs in 32 tiles of rows and columns: a static block is not one run of the output
    g, plan = _matmul(1024, 256, 1024)
    assert _schedules(g, plan) == [(DYNAMIC, "32")]


def test_the_threshold_is_an_option():
    g = _graph()
    src = generate(g, epilogue_plan(g), options=CodegenOptions(parallel_dynamic_min_work=1 << 40)).source
    schedules = {lp.schedule for lp in parallel_loops(src)}
    assert schedules == {STATIC}
    src = generate(g, epilogue_plan(g), options=CodegenOptions(parallel_static_contiguous=False)).source
    assert (DYNAMIC, 6) in _pragmas(src)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("case", ["matmul", "pointwise-static", "pointwise-dynamic"])
def test_threads_do_not_change_results(cache_dir, threads, case):
    if case == "matmul":
        g = _graph()
        plan = epilogue_plan(g)
    else:
        g, plan = pointwise_relu(*((64, 128, 56) if case == "pointwise-static" else (128, 256, 28)),
                                 np.random.default_rng(2))
    feeds = reference.random_inputs(g, 1)
    one = build(g, plan, cache_dir=cache_dir, threads=1).run(feeds)
    many = build(g, plan, cache_dir=cache_dir, threads=threads).run(feeds)
    assert all(np.array_equal(one[k], many[k]) for k in one)
    want = reference.run(g, feeds)
    assert all(np.allclose(one[k], want[k], rtol=1e-4, atol=1e-5) for k in want)
