"""The fuzzer's data-movement families keep every tensor under ``MAX_ELEMENTS`` whatever they draw (a Pad of a
tensor already at the cap made one over it, and ``opfuse fuzz`` seed 93001 stopped with "generator bug: Pad makes
float32[4,9,9,13]" after 300 graphs)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfuse.testing.graph_draft import MAX_ELEMENTS, GraphDraft
from opfuse.testing.layout_families import pad


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([(4, 9, 9, 12), (4096,), (2, 2048), (64, 64), (3, 1365)]))
def test_pad_of_a_tensor_at_the_cap_stays_under_it(data, shape):
    d = GraphDraft(data.draw, frozenset({"Pad"}), seed=0, target_nodes=4, max_inputs=1)
    x = d.new_input(shape)
    pad(d)
    out = d.graph.nodes[-1].outputs[0]
    assert d.graph.nodes[-1].op_type == "Pad" and d.graph.nodes[-1].input(0) is x
    assert out.type.size <= MAX_ELEMENTS
    assert len(out.shape) == len(shape) and all(o >= s - 1 for o, s in zip(out.shape, shape, strict=True))
