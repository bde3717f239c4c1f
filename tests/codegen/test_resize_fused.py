"""Resize read through a fused consumer whose index is an expression (SpaceToDepth, Slice, Pad, Reshape), not a
loop variable. The cubic and antialiased modes read their tap tables at ``o * taps + t``; with ``o`` written in
unparenthesised (``w * 2 + b``) that was ``w * 2 + b * taps``: wrong values, no error (fuzz seed 41210 found it
as Resize(cubic) -> SpaceToDepth -> DepthToSpace, with the default options too)."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

I64 = np.int64
CONSUMERS = {
    "space_to_depth": lambda b, y: b.op("SpaceToDepth", y, blocksize=2),
    "slice": lambda b, y: b.op("Slice", y, b.const("st", np.array([1, 3], I64)), b.const("en", np.array([4, 11], I64)),
                               b.const("ax", np.array([2, 3], I64))),
    "pad": lambda b, y: b.op("Pad", y, b.const("p", np.array([0, 0, 1, 2, 0, 0, 1, 0], I64))),
    "reshape": lambda b, y: b.op("Reshape", y, b.const("s", np.array([1, 4, 2, 12], I64))),
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("mode,extra", [("cubic", {}), ("linear", {"antialias": 1}), ("linear", {}),
                                        ("nearest", {})])
def test_resize_through_an_index_expression(cache_dir, consumer, mode, extra):
    b = GraphBuilder("rs")
    halve = bool(extra.get("antialias"))  # antialiasing acts when downsampling: a wider input, halved
    x = b.input("x", (1, 2, 4, 24 if halve else 6))
    scales = [1.0, 1.0, 1.0, 0.5 if halve else 2.0]
    y = b.op("Resize", x, None, b.const("sc", np.array(scales, np.float32)), mode=mode, name="resize", **extra)
    g = b.build(CONSUMERS[consumer](b, y))
    plan = FusionPlan(g, [FusionGroup("all", list(g.nodes), "injective", None)])
    feeds = reference.random_inputs(g, 1)
    for threads in (1, 2):
        assert_close(build(g, plan, cache_dir=cache_dir, threads=threads).run(feeds), reference.run(g, feeds))
