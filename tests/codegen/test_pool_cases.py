"""Pools outside the 2-D float row kernels (``pool.lower_pool``'s general loop): 1-D and 3-D windows with
padding at both ends, max and average (padding excluded and included), and a 3-D average whose one window is a
run from the start of each plane (``_lower_single_window``), against the reference."""
from __future__ import annotations

from cg_support import assert_close
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def test_padded_1d_and_3d_windows(cache_dir):
    b = GraphBuilder("pools")
    x1, x3 = b.input("x1", (2, 3, 11)), b.input("x3", (1, 2, 5, 6, 4))
    outs = [b.op("MaxPool", x1, kernel_shape=[3], strides=[2], pads=[1, 2], name="max1d"),
            b.op("AveragePool", x1, kernel_shape=[4], strides=[3], pads=[2, 1], name="avg1d"),
            b.op("AveragePool", x1, kernel_shape=[3], pads=[1, 1], count_include_pad=1, name="avg1d_incl"),
            b.op("MaxPool", x3, kernel_shape=[3, 2, 3], strides=[2, 2, 1], pads=[1, 0, 1, 1, 1, 1], name="max3d"),
            b.op("AveragePool", x3, kernel_shape=[4, 6, 4], strides=[2, 1, 1], name="one_window_3d")]  # one run
    g = b.build(*outs)
    feeds = reference.random_inputs(g, 2)
    assert_close(build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds))


def test_padded_average_pool_with_both_divisor_tables_on_threads(cache_dir):
    """An AveragePool 3x3, stride 1, padding 1 (Inception's, padding excluded): its row and column divisors
    differ at the edges, so both go to static tables before the plane loop; the second was missing from the
    parallel loop's function and the C did not compile ('ccount5' undeclared)."""
    b = GraphBuilder("avg")
    x = b.input("x", (1, 64, 56, 56))
    g = b.build(b.op("AveragePool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="pool"))
    feeds = reference.random_inputs(g, 4)
    for threads in (1, 2):
        assert_close(build(g, None, threads=threads, cache_dir=cache_dir).run(feeds), reference.run(g, feeds))
