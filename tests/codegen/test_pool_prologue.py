"""MaxPool with a Relu prologue: the Relu moves after the window max (one per output, and a
branch-free max loop), with results equal to the reference, padding included."""
from __future__ import annotations

import numpy as np

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import generate
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


def _relu_pool(extra_output: bool):
    b = GraphBuilder("relu_pool")
    x = b.input("x", (1, 3, 9, 9))
    r = b.op("Relu", x, name="relu")
    m = b.op("MaxPool", r, name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    return b.build(m, r) if extra_output else b.build(m)


def _window_body(src: str) -> str:
    """The C from the pool's kernel to its epilogue loop (the plane copy and the window maxima)."""
    start = src.index("static void k0_")
    return src[start:src.index("const float y", start)]


def test_relu_is_applied_once_after_the_max(cache_dir):
    g = _relu_pool(False)
    plan = group_by_names(g, [("reduction", ["relu", "pool"])])
    src = generate(g, plan).source
    assert "0x0p+0f ?" not in _window_body(src)      # no Relu per window element
    assert src.count("0x0p+0f ?") == 1                # one after the max
    got, want, _ = run_both(g, plan, cache_dir)
    assert_close(got, want)


def test_all_negative_windows_match_reference(cache_dir):
    g = _relu_pool(False)
    plan = group_by_names(g, [("reduction", ["relu", "pool"])])
    x = -np.abs(np.random.default_rng(5).standard_normal((1, 3, 9, 9))).astype(np.float32)
    x[0, 1, 4, 4] = 2.0
    model = build(g, plan, cache_dir=cache_dir)
    got = model.run({"x": x})
    want = reference.run(g, {"x": x})
    assert_close(got, want)


def test_relu_kept_inside_when_its_value_is_stored(cache_dir):
    g = _relu_pool(True)
    plan = group_by_names(g, [("reduction", ["relu", "pool"])])
    got, want, _ = run_both(g, plan, cache_dir)
    assert_close(got, want)
