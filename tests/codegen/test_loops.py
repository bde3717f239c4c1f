"""Loop nests and lane reductions shared by the kernel families (``codegen/loops.py``, issue 13).

Expected values are worked out by hand: sums of small integers (exact in float32), loop groups
from the rule in ``loop_groups``'s docstring, OpenMP pragmas from ``CodegenOptions``'
``parallel_min_work`` (2**15) and ``parallel_min_outer`` (16)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import group_by_names
from opfuse.codegen.outline import parallel_loops
from opfuse.codegen.loops import loop_groups
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build


@pytest.mark.parametrize("shape,mergeable,groups", [
    ((), None, [(0, 0)]),
    ((1, 1), None, [(0, 2)]),                      # no axis longer than 1: one loop of one
    ((2, 3, 4), None, [(0, 1), (1, 2), (2, 3)]),
    ((1, 4), None, [(0, 2)]),                      # a leading 1 joins the first group
    ((4, 1), None, [(0, 2)]),                      # a trailing 1 joins the last
    ((2, 1, 3), None, [(0, 1), (1, 3)]),           # a 1 between joins the next group
    ((2, 3, 4), lambda a, b: True, [(0, 3)]),
    ((2, 1, 3, 4), lambda a, b: (a, b) == (0, 2), [(0, 3), (3, 4)]),  # asked about 0 and 2, skipping the 1
    ((2, 3, 4), lambda a, b: (a, b) == (1, 2), [(0, 1), (1, 3)]),
])
def test_loop_groups(shape, mergeable, groups):
    assert loop_groups(shape, mergeable) == groups


def _reduce_sum(shape, axes, keepdims=0):
    b = GraphBuilder("rsum")
    x = b.input("x", shape)
    s = b.op("ReduceSum", x, axes=list(axes), keepdims=keepdims, name="sum")
    return b.build(b.op("Mul", s, b.const("two", np.array(2.0, np.float32)), name="twice"))


def _run_fused(g, feeds, cache_dir):
    model = build(g, group_by_names(g, [("reduction", [n.name for n in g.nodes])]), cache_dir=cache_dir)
    assert model.report["kernels"] == 1
    return model.run(feeds)


def test_a_scalar_result_is_one_element_without_loops(cache_dir):
    """Sum of all of 0..11 is 66, times 2: the output has shape () and the kernel no loop over it."""
    g = _reduce_sum((3, 4), [0, 1])
    got = _run_fused(g, {"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, cache_dir)["twice"]
    assert got.shape == () and float(got) == 132.0


@pytest.mark.parametrize("length", [1, 5, 31, 32, 33, 48, 50])
def test_row_sums_of_every_length(length, cache_dir):
    """Row r of x is r * 100 + (0, 1, ..., length - 1): its sum is r * 100 * length + length * (length - 1) / 2
    (exact in float32); below 32 elements the sum is one scalar loop, from 32 on 16 lanes and a tail."""
    x = (np.arange(3, dtype=np.float32)[:, None] * 100 + np.arange(length, dtype=np.float32)).astype(np.float32)
    got = _run_fused(_reduce_sum((3, length), [1]), {"x": x}, cache_dir)["twice"]
    want = [2 * (r * 100 * length + length * (length - 1) // 2) for r in range(3)]
    np.testing.assert_array_equal(got, np.array(want, np.float32))


@pytest.mark.parametrize("length", [7, 40])
def test_row_max_of_every_length(length, cache_dir):
    """Row maxima (the lane loop kept whole for max): row r is -(0..length-1) shifted by r, with the
    maximum placed in the middle of the row."""
    b = GraphBuilder("rmax")
    x = b.input("x", (3, length))
    g = b.build(b.op("ReduceMax", x, axes=[1], keepdims=0, name="mx"))
    v = -np.arange(length, dtype=np.float32)[None, :] + np.arange(3, dtype=np.float32)[:, None]
    v[:, length // 2] = 50 + np.arange(3)
    got = _run_fused(g, {"x": v.astype(np.float32)}, cache_dir)["mx"]
    np.testing.assert_array_equal(got, np.array([50, 51, 52], np.float32))


def _pragma(g) -> list[str]:
    """The parallel loops of ``g`` fused as one reduction group, their schedule clauses (C source, not compiled)."""
    src = generate(g, group_by_names(g, [("reduction", [n.name for n in g.nodes])])).source
    return [f"{lp.schedule} collapse({lp.collapse})" if lp.collapse > 1 else lp.schedule
            for lp in parallel_loops(src)]


@pytest.mark.parametrize("outer,inner,red,want", [
    (4, 64, 128, "collapse(2)"),  # 256 rows of 128: 2**15 operations; 4 outer iterations < 16: both loops
    (16, 16, 128, "plain"),       # 16 outer iterations are enough threads' work: no collapse
    (4, 64, 127, None),           # 256 rows of 127: under 2**15, no threads
    (8, 1, 4096, "plain"),        # one loop of 8 rows (2**15 operations): nothing to collapse with
])
def test_the_outer_loops_of_a_reduction_are_split_across_threads(outer, inner, red, want):
    pragmas = _pragma(_reduce_sum((outer, inner, red), [2]))
    if want is None:
        assert pragmas == []
        return
    assert len(pragmas) == 1
    assert ("collapse(2)" in pragmas[0]) == (want == "collapse(2)")
    assert "collapse(3)" not in pragmas[0]


def test_a_run_of_32_is_summed_in_16_lanes_in_a_fixed_order(cache_dir):
    """From 32 elements on, lane l sums x[l], x[l + 16], ... and the lanes are added 0..15 in order
    (float32 throughout). x = [2**24, 1, 1, ..., 1]: lane 0 is 2**24 + 1, rounded to 2**24; lanes
    1..15 are 1 + 1 = 2, and adding them to 2**24 is exact (float32 spacing 2 there): 2**24 + 30.
    One scalar loop in element order would give 2**24 (each + 1 rounds away)."""
    x = np.ones((1, 32), np.float32)
    x[0, 0] = 2.0 ** 24
    lanes = [np.float32(x[0, lane]) + np.float32(x[0, lane + 16]) for lane in range(16)]
    want = lanes[0]
    for lane in lanes[1:]:
        want = np.float32(want + lane)
    assert want == 2 ** 24 + 30
    got = _run_fused(_reduce_sum((1, 32), [1]), {"x": x}, cache_dir)["twice"]
    np.testing.assert_array_equal(got, np.array([2 * want], np.float32))


def test_contiguous_axes_of_an_elementwise_op_are_one_loop():
    """Relu over (8, 64, 64), contiguous: one loop of 32768 elements, not one per axis."""
    b = GraphBuilder("relu3")
    g = b.build(b.op("Relu", b.input("x", (8, 64, 64)), name="r"))
    src = generate(g, None).source
    assert re.search(r"for \(long (\w+) = 0; \1 < 32768; \+\+\1\)", src)
    assert not re.search(r"for \(long (\w+) = 0; \1 < 64; \+\+\1\)", src)


@pytest.mark.parametrize("cols,threads", [(200, False), (256, True)])
def test_a_plain_copy_counts_one_operation_per_element(cols, threads):
    """ScatterElements first copies its data (one operation per element): 128 x 200 = 25600 < 2**15
    stays on one thread, 128 x 256 = 2**15 is split across threads."""
    b = GraphBuilder("scatter")
    x = b.input("x", (128, cols))
    i = b.input("i", (1, 2), np.int64)
    g = b.build(b.op("ScatterElements", x, i, b.input("u", (1, 2)), axis=1, name="sc"))
    assert bool(parallel_loops(generate(g, None).source)) == threads
