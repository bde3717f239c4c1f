"""LogSoftmax in float64 (``norm.lower_log_softmax``): libm's double exp and log, not the float32 inline helpers,
so the result keeps double precision (the reference's values to 1e-12)."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def test_float64_log_softmax_keeps_double_precision(cache_dir):
    b = GraphBuilder("log_softmax64")
    g = b.build(b.op("LogSoftmax", b.input("x", (3, 50), np.float64), axis=-1))
    feeds = {"x": np.random.default_rng(6).standard_normal((3, 50)) * 5}
    got = next(iter(build(g, None, cache_dir=cache_dir).run(feeds).values()))
    want = next(iter(reference.run(g, feeds).values()))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
