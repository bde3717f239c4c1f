"""``analyze_group`` with a shared cache: the graph-output set is built once per graph, and the
results equal the uncached analysis."""
import numpy as np

from opfuse.cost.analysis import analyze_group, graph_output_ids
from opfuse.ops import GraphBuilder

WIDTH = 50  # sinks that are graph outputs: every single-op group asks "is this an output?"


def _wide_graph():
    b = GraphBuilder("wide")
    v = b.input("x", (1, 4), "float32")
    outs = []
    for _ in range(WIDTH):
        v = b.op("Relu", v)
        outs.append(b.op("Neg", v))
    outs.append(b.op("MatMul", v, b.const("w", np.ones((4, 3), np.float32))))
    return b.build(*outs)


def test_cached_analysis_equals_uncached():
    g = _wide_graph()
    cache: dict = {}
    groups = [[n] for n in g.nodes] + [g.nodes[i:i + 3] for i in range(0, len(g.nodes) - 2, 3)]
    for nodes in groups:
        assert analyze_group(g, nodes, cache) == analyze_group(g, nodes)


def test_output_set_built_once_per_graph_and_refreshed_when_outputs_change():
    g = _wide_graph()
    cache: dict = {}
    first = graph_output_ids(g, cache)
    assert first == frozenset(id(v) for v in g.outputs)
    analyze_group(g, [g.nodes[0]], cache)
    assert graph_output_ids(g, cache) is first  # reused, not rebuilt
    g.outputs = g.outputs[:-1]
    assert graph_output_ids(g, cache) == frozenset(id(v) for v in g.outputs)
    other = _wide_graph()  # a cache passed to another graph does not answer for the first
    assert graph_output_ids(other, cache) == frozenset(id(v) for v in other.outputs)
