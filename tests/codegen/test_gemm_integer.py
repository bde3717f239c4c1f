"""Integer Gemm in C against the reference executor (onnxruntime has no integer Gemm kernel).

With integral alpha and beta everything stays in the element type and wraps; with a fractional
one, A' @ B' wraps in the element type, each term is scaled in double and the sum is truncated
toward zero (``ops/linalg.py:_gemm``). Both, unfused and with a fused epilogue."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import epilogue_plan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

CASES = [(2.0, 0.5), (1.0, -0.75), (0.3, 1.0), (-1.5, 2.5), (3.0, -2.0)]


def _graph(dtype, alpha, beta, epilogue):
    b = GraphBuilder("int_gemm")
    a = b.input("a", (5, 7), dtype)
    w = b.input("w", (4, 7), dtype)
    c = b.input("c", (1, 4), dtype)
    y = b.op("Gemm", a, w, c, name="gemm", transB=1, alpha=alpha, beta=beta)
    if epilogue:
        y = b.op("Add", y, b.const("bias", np.arange(4, dtype=dtype)), name="bias_add")
    return b.build(y)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
@pytest.mark.parametrize("alpha,beta", CASES)
@pytest.mark.parametrize("fused", [False, True])
def test_integer_gemm_matches_reference(cache_dir, dtype, alpha, beta, fused):
    g = _graph(dtype, alpha, beta, fused)
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    lo, hi = max(info.min, -9), min(info.max, 9)
    feeds = {v.name: rng.integers(lo, hi + 1, size=v.shape).astype(dtype) for v in g.inputs}
    plan = epilogue_plan(g) if fused else None
    model = build(g, plan, cache_dir=cache_dir)
    if fused:
        assert model.report["kernels"] == 1
    got, want = model.run(feeds), reference.run(g, feeds)
    for name, w in want.items():
        assert got[name].dtype == w.dtype
        np.testing.assert_array_equal(got[name], w)


def test_fractional_scale_truncates_toward_zero():
    """The reference's documented rule on a hand-checked value: 1*1*2.5 + (-1)*0.5 = 2.0 -> 2,
    and 1*1*0.5 + 0 = 0.5 -> 0, -0.5 -> 0 (toward zero, not floor)."""
    b = GraphBuilder("trunc")
    a, w = b.input("a", (1, 1), np.int32), b.input("w", (1, 1), np.int32)
    g = b.build(b.op("Gemm", a, w, name="g", alpha=0.5), b.op("Gemm", a, w, name="h", alpha=-0.5))
    out = reference.run(g, {"a": np.array([[1]], np.int32), "w": np.array([[1]], np.int32)})
    assert out["g"].tolist() == [[0]] and out["h"].tolist() == [[0]]
