"""ReduceMean/Sum/Max (``reduce.lower_reduce``) where the op suites' random data do not look: the mean of
integers truncated toward zero (quotients and remainders summed apart), the integer sum, the max of windows
that are all negative, over leading and trailing axes, and a reduction of a rank-0 input (``lower_reduction``),
against the reference, bit for bit."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def test_integer_means_sums_and_negative_maxima(cache_dir):
    b = GraphBuilder("reduce_cases")
    i = b.input("i", (3, 4, 5), np.int64)
    f = b.input("f", (3, 4, 5))
    outs = [b.op("ReduceMean", i, axes=[1], name="mean_mid"), b.op("ReduceMean", i, axes=[2], name="mean_last"),
            b.op("ReduceSum", i, axes=[0, 2], keepdims=0, name="sum_outer"),
            b.op("ReduceMax", f, axes=[0], name="max_first"), b.op("ReduceMax", f, axes=[2], name="max_last"),
            b.op("ReduceSumSquare", b.input("s", ()), name="square_of_a_scalar")]  # rank 0: its one element
    g = b.build(*outs)
    rng = np.random.default_rng(4)
    feeds = {"i": rng.integers(-50, 50, (3, 4, 5)).astype(np.int64),
             "f": -np.abs(rng.standard_normal((3, 4, 5))).astype(np.float32) - 0.5, "s": np.array(-1.5, np.float32)}
    got, want = build(g, None, cache_dir=cache_dir).run(feeds), reference.run(g, feeds)
    for v in g.outputs:
        assert got[v.name].dtype == want[v.name].dtype and np.array_equal(got[v.name], want[v.name]), v.name
    assert want["square_of_a_scalar"] == np.float32(2.25)
    assert (want["max_first"] < 0).all()  # every window negative: 0 is no maximum
    assert np.array_equal(want["mean_last"][..., 0], np.trunc(feeds["i"].mean(axis=2)).astype(np.int64))
