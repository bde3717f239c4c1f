"""Softmax and LogSoftmax in float64 (``norm.py``): libm's double exp and log, not the float32 inline helpers, so
the result keeps double precision (the reference's values to 1e-12)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


@pytest.mark.parametrize("op", ["LogSoftmax", "Softmax"])
def test_float64_softmax_keeps_double_precision(op, cache_dir):
    """libm's double exp and log, not the float32 inline helpers: the reference's values to 1e-12."""
    b = GraphBuilder(f"{op.lower()}64")
    g = b.build(b.op(op, b.input("x", (3, 50), np.float64), axis=-1))
    feeds = {"x": np.random.default_rng(6).standard_normal((3, 50)) * 5}
    got = next(iter(build(g, None, cache_dir=cache_dir).run(feeds).values()))
    want = next(iter(reference.run(g, feeds).values()))
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 if op == "LogSoftmax" else 1e-15)
