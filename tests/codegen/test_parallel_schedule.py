"""How parallel loops hand out work: GEMM/conv tiles one at a time (tiles differ in size, so static
halves leave a thread idle), light iterations in static chunks; and threads never change results."""
from __future__ import annotations


import numpy as np
import pytest

from cg_support import epilogue_plan
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.outline import parallel_loops
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def _graph():
    """A MatMul whose 128 rows make a 96-row and a 32-row tile, then a big elementwise Add."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("sched")
    x = b.input("x", (128, 768))
    y = b.op("MatMul", x, b.const("w", rng.standard_normal((768, 768)).astype(np.float32) / 30))
    z = b.op("Add", y, b.input("r", (128, 768)))
    return b.build(b.op("Relu", b.op("Softmax", z, axis=-1)))


def _pragmas(source: str) -> list[tuple[str, int]]:
    """(schedule, iterations) of every parallel loop."""
    return [(lp.schedule, int(lp.bound)) for lp in parallel_loops(source) if lp.bound.isdigit()]


def test_tiles_go_one_at_a_time_and_light_iterations_in_static_chunks():
    g = _graph()
    pragmas = _pragmas(generate(g, epilogue_plan(g)).source)
    tiles = [n for kind, n in pragmas if kind == "schedule(dynamic, 1)"]
    assert tiles and all(n >= 2 for n in tiles)  # the GEMM's tiles (as many as its blocking makes)
    assert ("schedule(static)", 128) in pragmas  # Softmax rows: 768 elements each


def test_the_threshold_is_an_option():
    g = _graph()
    src = generate(g, epilogue_plan(g), options=CodegenOptions(parallel_dynamic_min_work=1 << 40)).source
    schedules = {lp.schedule for lp in parallel_loops(src)}
    assert schedules == {"schedule(static)"}


@pytest.mark.parametrize("threads", [2, 3])
def test_threads_do_not_change_results(cache_dir, threads):
    g = _graph()
    feeds = reference.random_inputs(g, 1)
    one = build(g, epilogue_plan(g), cache_dir=cache_dir, threads=1).run(feeds)
    many = build(g, epilogue_plan(g), cache_dir=cache_dir, threads=threads).run(feeds)
    assert all(np.array_equal(one[k], many[k]) for k in one)
    want = reference.run(g, feeds)
    assert all(np.allclose(one[k], want[k], rtol=1e-4, atol=1e-5) for k in want)
