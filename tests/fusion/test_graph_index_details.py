"""``rules.graph_index.GraphIndex`` and ``rules.categories`` on small graphs, each expectation worked out by hand
from the docstrings (positions, graph outputs, ``covers`` as a cache check, reachability by masks and by the walk;
TVM's op categories as fusion sees them). Found by mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.ir.graph import Graph, TensorType
from opfuse.ops import GraphBuilder
from opfuse.rules.categories import (category_name, is_anchor, is_elementwise, is_injective, is_oef, is_opaque,
                                     is_pointwise, is_reduction, is_relabel, is_row_normalization)
from opfuse.rules.graph_index import BITSET_MAX_NODES, GraphIndex
from fusion_cases import randn

T = TensorType((4,), np.float32)


def _graph():
    """a, e read x; b reads a; c reads b and e; d reads a (after c); f reads x (last, nothing reads it but output)."""
    g = Graph("t")
    x = g.add_input("x", T.shape)
    vals = {"x": x}
    for name, op, ins in [("a", "Relu", ["x"]), ("e", "Exp", ["x"]), ("b", "Neg", ["a"]), ("c", "Add", ["b", "e"]),
                          ("d", "Abs", ["a"]), ("f", "Tanh", ["x"])]:
        vals[name] = g.add_node(op, [vals[i] for i in ins], name=name, output_types=[T]).outputs[0]
    g.outputs = [vals["c"], vals["d"], vals["f"]]
    return g


@pytest.mark.parametrize("limit", [BITSET_MAX_NODES, 0, 3])
def test_reaches_by_masks_and_by_the_walk(limit):
    g = _graph()
    idx = GraphIndex(g, bitset_max_nodes=limit)
    n = {x.name: x for x in g.nodes}

    def r(src, dst):
        return idx.reaches([n[s] for s in src], [n[d] for d in dst])
    assert r("a", "b") and r("a", "c") and r("a", "d") and r("e", "c") and r("b", "c")
    assert not r("b", "a") and not r("c", "a") and not r("e", "b") and not r("a", "e") and not r("d", "c")
    assert not r("a", "a") and not r("c", "c")         # one edge or more
    assert not r("f", "abcde") and not r("abcde", "f")
    assert r("ef", "c") and r("fe", "c") and not r("ef", "d") and r("e", "dc") and r("e", "cd")
    assert not r("", "c") and not r("a", "")
    assert not r("d", "abcdef")


def test_order_outputs_and_in_order():
    g = _graph()
    idx = GraphIndex(g)
    assert [idx.order[id(x)] for x in g.nodes] == list(range(6))
    assert idx.outputs == frozenset(id(v) for v in g.outputs) and idx.size == 6
    n = {x.name: x for x in g.nodes}
    assert [x.name for x in idx.in_order([n["f"], n["a"], n["c"], n["e"]])] == ["a", "e", "c", "f"]


def test_covers_is_a_cache_check():
    g = _graph()
    idx = GraphIndex(g)
    n = {x.name: x for x in g.nodes}
    assert idx.covers(g, [n["a"], n["f"]]) and idx.covers(g, [])
    assert not idx.covers(_graph(), [])                       # another graph
    other = _graph()
    assert not idx.covers(g, [other.node("a")])               # a node of another graph
    g.outputs = list(g.outputs)                               # the output list replaced
    assert not idx.covers(g, [])
    g = _graph()
    idx = GraphIndex(g)
    g.nodes[1], g.nodes[2] = g.nodes[2], g.nodes[1]          # the list edited in place: e and b swapped
    assert idx.covers(g, [g.node("a")]) and not idx.covers(g, [g.node("b")]) and not idx.covers(g, [g.node("e")])
    g = _graph()
    idx = GraphIndex(g)
    g.nodes.pop()                                             # one node fewer
    assert not idx.covers(g, [])
    g = _graph()
    idx = GraphIndex(g)
    g.nodes = list(g.nodes)                                   # the node list replaced
    assert not idx.covers(g, [])


def test_a_reader_outside_the_graph_leads_nowhere():
    g = _graph()
    n = {x.name: x for x in g.nodes}
    # a node that reads a's output but is not (or no longer) in the graph's node list
    stray = g.add_node("Sigmoid", [n["a"].outputs[0]], name="stray", output_types=[T])
    g.nodes.remove(stray)
    for limit in (BITSET_MAX_NODES, 0):
        idx = GraphIndex(g, bitset_max_nodes=limit)
        assert idx.reaches([n["a"]], [n["c"]]) and not idx.reaches([n["a"]], [n["f"]])


def _ops():
    b = GraphBuilder("ops")
    x = b.input("x", (1, 2, 4, 4))
    b.op("Relu", x, name="relu")
    b.op("Add", x, b.const("one", np.float32(1)), name="add")
    b.op("Expand", x, b.const("shape", np.array([2, 2, 4, 4])), name="expand")
    b.op("Transpose", x, perm=[0, 1, 3, 2], name="transpose")
    b.op("Reshape", x, b.const("s", np.array([1, 32])), name="reshape")
    b.op("Slice", x, b.const("st", np.array([0])), b.const("en", np.array([2])), b.const("ax", np.array([3])),
         name="slice")
    b.op("Conv", x, b.const("w", randn((2, 2, 1, 1))), name="conv")
    b.op("MatMul", x, b.const("m", randn((4, 4))), name="matmul")
    b.op("Softmax", x, axis=-1, name="softmax")
    b.op("ReduceSum", x, axes=[3], keepdims=1, name="reducesum")
    b.op("MaxPool", x, kernel_shape=[2, 2], name="maxpool")
    b.op("Shape", x, name="shape_of")
    b.op("LayerNormalization", x, b.const("g", np.ones(4, np.float32)), name="ln")
    return b.graph


def test_categories_as_fusion_sees_them():
    g = _ops()
    n = g.node
    names = ["relu", "add", "expand", "transpose", "reshape", "slice", "conv", "matmul", "softmax", "reducesum",
             "maxpool", "shape_of", "ln"]
    assert {k: category_name(n(k)) for k in names} == {
        "relu": "elementwise", "add": "broadcast", "expand": "broadcast", "transpose": "injective",
        "reshape": "injective", "slice": "injective", "conv": "out-elementwise-fusable",
        "matmul": "out-elementwise-fusable", "softmax": "reduction", "reducesum": "reduction",
        "maxpool": "reduction", "shape_of": "opaque", "ln": "reduction"}
    assert [k for k in names if is_elementwise(n(k))] == ["relu", "add", "expand"]
    assert [k for k in names if is_pointwise(n(k))] == ["relu", "add"]
    assert [k for k in names if is_injective(n(k))] == ["transpose", "reshape", "slice"]
    assert [k for k in names if is_relabel(n(k))] == ["transpose", "reshape"]
    assert [k for k in names if is_oef(n(k))] == ["conv", "matmul"]
    assert [k for k in names if is_reduction(n(k))] == ["softmax", "reducesum", "maxpool", "ln"]
    assert [k for k in names if is_anchor(n(k))] == ["conv", "matmul", "softmax", "reducesum", "maxpool", "ln"]
    assert [k for k in names if is_opaque(n(k))] == ["shape_of"]
    assert [k for k in names if is_row_normalization(n(k))] == ["softmax", "ln"]
