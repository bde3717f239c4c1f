"""Hypothesis: random graphs of every supported op family through the C backend.

Each example is compiled twice, unfused and with the hand-built fused plan, and both must
equal the reference. Derandomised, so every run checks the same graphs.
"""
from __future__ import annotations

from hypothesis import given

from cg_support import assert_close, epilogue_plan
from opfuse.runtime import reference
from opfuse.runtime.native import build
from opfuse.testing.random_graphs import graph_and_inputs, property_settings

EXAMPLES = 12


@property_settings(max_examples=EXAMPLES)
@given(graph_and_inputs(max_nodes=8))
def test_random_graph_unfused_and_fused_match_reference(tmp_path_factory, case):
    graph, feeds = case
    want = reference.run(graph, feeds)
    cache = tmp_path_factory.getbasetemp() / "random-graph-cache"
    for plan in (None, epilogue_plan(graph)):
        model = build(graph, plan, cache_dir=cache)
        assert_close(model.run(feeds), want)
        assert model.memory.conflicts() == []
