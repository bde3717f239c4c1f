"""Conv in float64 (``conv.py``'s GEMM with its generic im2col loader: every column element read through
its bounds test, no packed panels, no micro-kernel) against the reference, in 1-D, 2-D and 3-D, grouped,
strided, dilated, padded unevenly, and 1x1 ones (one grouped) read in place; one graph, one compile. Tolerance: float64
sums of at most 24 products of O(1) values, the same terms as the reference's in another order."""
from __future__ import annotations

import numpy as np

from cg_support import assert_close, run_both
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(64)


def _w(b, *shape):
    return b.const(f"w{len(b.graph.values)}", rng.standard_normal(shape))


def test_float64_convolutions_match_reference(cache_dir):
    b = GraphBuilder("conv64")
    x = b.input("x", (2, 4, 7, 6), np.float64)
    outs = [
        # grouped, strides and dilations differing per axis, uneven pads: windows leave the input on every side
        b.op("Conv", x, _w(b, 6, 2, 3, 2), _w(b, 6), group=2, strides=[2, 1], pads=[1, 0, 2, 1],
             dilations=[1, 2], name="grouped"),
        b.op("Conv", x, _w(b, 5, 4, 1, 1), _w(b, 5), name="pointwise"),       # 1x1: X's rows are X_col
        b.op("Conv", x, _w(b, 6, 2, 1, 1), group=2, name="grouped_pointwise"),  # each group its own channels
        b.op("Conv", x, _w(b, 3, 4, 2, 2), strides=[2, 2], name="valid"),   # no padding, no bias
    ]
    x1 = b.input("x1", (1, 3, 11), np.float64)
    outs.append(b.op("Conv", x1, _w(b, 4, 3, 3), _w(b, 4), strides=[2], pads=[2, 1], name="conv1d"))
    x3 = b.input("x3", (1, 2, 4, 5, 3), np.float64)
    outs.append(b.op("Conv", x3, _w(b, 2, 2, 2, 3, 2), pads=[1, 0, 1, 0, 2, 1], name="conv3d"))
    g = b.build(*[b.op("Relu", y, name=f"{y.producer.name}_relu") for y in outs])
    got, want, model = run_both(g, None, cache_dir)
    assert all(v.dtype == np.float64 for v in got.values())
    assert "double" in model.program.source and "opfuse_ukr_" not in model.program.source
    assert_close(got, want, rtol=1e-12, atol=1e-12)
