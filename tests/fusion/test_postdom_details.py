"""``rules.postdom`` on graphs whose post-dominator trees are worked out by hand from the module's docstring
(``d`` post-dominates ``n`` when every path from ``n`` to the exit passes through ``d``; a virtual exit follows
every node with a graph output or an unread output). Found by mutation testing (tests/MUTATION.md)."""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, TensorType
from opfuse.rules.postdom import EXIT, immediate_post_dominators, path_nodes, successors
from fusion_cases import edge_graph

T = TensorType((4,), np.float32)


def _graph(edges: list[tuple[str, str, list[str]]], outputs: list[str]) -> Graph:
    return edge_graph(edges, outputs, T)


def _ipdom_names(g: Graph) -> dict[str, str | None]:
    ip = immediate_post_dominators(g)
    return {n.name: (None if ip[id(n)] is None else ip[id(n)].name) for n in g.nodes}


def _nested():
    """a feeds two branches: p (itself a diamond p1/p2 -> pj) and q; both meet in j; j -> k (the output)."""
    return _graph([("a", "Relu", ["x"]), ("p", "Exp", ["a"]), ("p1", "Neg", ["p"]), ("p2", "Abs", ["p"]),
                   ("pj", "Add", ["p1", "p2"]), ("q", "Tanh", ["a"]), ("j", "Mul", ["pj", "q"]),
                   ("k", "Sigmoid", ["j"])], ["k"])


def test_nested_diamonds():
    assert _ipdom_names(_nested()) == {"a": "j", "p": "pj", "p1": "pj", "p2": "pj", "pj": "j", "q": "j",
                                       "j": "k", "k": None}


def test_branches_of_unequal_length_meet_at_their_join():
    # a -> b -> c -> d -> f and a -> e -> f: the walk climbs the longer branch further
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"]), ("d", "Abs", ["c"]),
                ("e", "Tanh", ["a"]), ("f", "Add", ["d", "e"])], ["f"])
    assert _ipdom_names(g) == {"a": "f", "b": "c", "c": "d", "d": "f", "e": "f", "f": None}
    g = _graph([("a", "Relu", ["x"]), ("e", "Tanh", ["a"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"]),
                ("d", "Abs", ["c"]), ("f", "Add", ["e", "d"])], ["f"])
    assert _ipdom_names(g)["a"] == "f"


def test_an_output_or_an_unread_value_leads_to_the_exit():
    # b is read by c and is a graph output: only the exit post-dominates b, and so a
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"])], ["c", "b"])
    assert _ipdom_names(g) == {"a": "b", "b": None, "c": None}
    # s has two outputs; the second is read by nobody: a path from s ends there
    g = Graph("t")
    x = g.add_input("x", T.shape)
    s = g.add_node("Split", [x], num_outputs=2, name="s", output_types=[T, T])
    r = g.add_node("Relu", [s.outputs[0]], name="r", output_types=[T]).outputs[0]
    t = g.add_node("Tanh", [r], name="t", output_types=[T]).outputs[0]
    g.outputs = [t]
    assert _ipdom_names(g) == {"s": None, "r": "t", "t": None}
    assert successors(s, {id(t)}) == [r.producer, EXIT] or successors(s, {id(t)}) == [EXIT, r.producer]


def test_successors_are_distinct():
    g = _graph([("a", "Relu", ["x"]), ("b", "Add", ["a", "a"]), ("c", "Mul", ["a", "b"])], ["c"])
    a, b, c = g.nodes
    got = successors(a, {id(c.outputs[0])})
    assert len(got) == 2 and {id(n) for n in got} == {id(b), id(c)}
    assert successors(c, {id(c.outputs[0])}) == [EXIT]
    assert _ipdom_names(g) == {"a": "c", "b": "c", "c": None}


def test_path_nodes_stop_at_the_post_dominator_and_respect_the_limit():
    g = _nested()
    a, j, p, pj = g.node("a"), g.node("j"), g.node("p"), g.node("pj")
    assert sorted(n.name for n in path_nodes(a, j, 6)) == ["j", "p", "p1", "p2", "pj", "q"]
    assert path_nodes(a, j, 5) is None
    assert sorted(n.name for n in path_nodes(p, pj, 3)) == ["p1", "p2", "pj"]
    assert path_nodes(p, pj, 2) is None
    assert [n.name for n in path_nodes(j, g.node("k"), 1)] == ["k"]
    assert path_nodes(j, g.node("k"), 0) is None
