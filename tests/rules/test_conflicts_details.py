"""The conflict checks of ``rules.conflicts`` one by one, each expectation worked out by hand from the module's
docstring (the seed's overlap, resource and dependency conflicts, 7.2.3), found by mutation testing
(tests/MUTATION.md): the exact refusal texts, the limits at their boundary, the outside path a cycle takes, the
in-place and random-order conditions."""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, TensorType
from opfuse.rules import DependencyRules, FusionOptions, check_dependencies, check_resources
from opfuse.rules.conflicts import check_overlap, group_inputs, outside_path, working_set_bytes

T = TensorType((2, 4), np.float32)  # 32 bytes


def _pos(g: Graph) -> dict[int, int]:
    return {id(n): i for i, n in enumerate(g.nodes)}


def _graph(edges: list[tuple[str, str, list[str]]], outputs: list[str]) -> Graph:
    """Nodes (name, op, input names) in this order; 'x' is the graph input, each node's output is its name."""
    g = Graph("t")
    vals = {"x": g.add_input("x", T.shape)}
    for name, op, ins in edges:
        vals[name] = g.add_node(op, [vals[i] for i in ins], name=name, output_types=[T]).outputs[0]
    g.outputs = [vals[o] for o in outputs]
    return g


def _nodes(g: Graph, *names: str):
    return [g.node(n) for n in names]


# overlap -----------------------------------------------------------------------------------------

def test_overlap_names_the_first_taken_node_and_its_group():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Tanh", ["b"])], ["c"])
    a, b, c = _nodes(g, "a", "b", "c")
    assert check_overlap([a, b, c], {}) is None
    assert check_overlap([a], {id(b): "g1"}) is None
    r = check_overlap([a, b, c], {id(b): "g1", id(c): "g2"})
    assert (r.kind, r.reason) == ("overlap", "node 'b' is already in group 'g1'")


# resources ----------------------------------------------------------------------------------------

def test_working_set_counts_only_values_read_inside_and_not_graph_outputs():
    # a -> b -> c, and a is also read by d outside; b is a graph output as well as read by c
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Tanh", ["b"]), ("d", "Neg", ["a"])], ["c", "b", "d"])
    a, b, c = _nodes(g, "a", "b", "c")
    assert working_set_bytes([a, b, c], g) == 0      # a leaves (d reads it), b is an output, c is an output
    g2 = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Tanh", ["b"])], ["c"])
    assert working_set_bytes(_nodes(g2, "a", "b", "c"), g2) == 2 * T.nbytes  # a and b stay on chip
    assert working_set_bytes(_nodes(g2, "a", "b"), g2) == T.nbytes         # b is read by c, outside


def test_group_inputs_are_the_distinct_outside_values_in_reading_order():
    g = Graph("t")
    x, y = g.add_input("x", T.shape), g.add_input("y", T.shape)
    a = g.add_node("Add", [y, x], name="a", output_types=[T]).outputs[0]
    b = g.add_node("Mul", [a, x], name="b", output_types=[T]).outputs[0]
    c = g.add_node("Sub", [b, y], name="c", output_types=[T]).outputs[0]
    g.outputs = [c]
    assert [v.name for v in group_inputs(g.nodes)] == ["y", "x"]
    assert [v.name for v in group_inputs(g.nodes[1:])] == ["a", "x", "y"]


def test_resource_limits_hold_at_their_boundary_and_name_the_numbers():
    g = _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Tanh", ["b"])], ["c"])
    nodes = g.nodes
    assert check_resources(nodes, g, FusionOptions(max_ops_per_group=3)) is None
    r = check_resources(nodes, g, FusionOptions(max_ops_per_group=2))
    assert (r.kind, r.reason) == ("resource", "3 ops exceed the limit of 2 per kernel")
    assert check_resources(nodes, g, FusionOptions(max_group_inputs=1)) is None  # only x
    r = check_resources(nodes, g, FusionOptions(max_group_inputs=0))
    assert (r.kind, r.reason) == ("resource", "1 distinct inputs exceed the limit of 0")
    assert check_resources(nodes, g, FusionOptions(max_working_set_bytes=2 * T.nbytes)) is None
    r = check_resources(nodes, g, FusionOptions(max_working_set_bytes=2 * T.nbytes - 1))
    assert (r.kind, r.reason) == ("resource", f"working set of {2 * T.nbytes} bytes exceeds the on-chip budget of "
                                              f"{2 * T.nbytes - 1} bytes")
    # the size limit is judged first, then the inputs, then the working set
    r = check_resources(nodes, g, FusionOptions(max_ops_per_group=1, max_group_inputs=0, max_working_set_bytes=0))
    assert r.reason == "3 ops exceed the limit of 1 per kernel"
    r = check_resources(nodes, g, FusionOptions(max_group_inputs=0, max_working_set_bytes=0))
    assert r.reason == "1 distinct inputs exceed the limit of 0"


# dependencies: the cycle through an outside path --------------------------------------------------

def _detour():
    """a -> b -> c -> d and a -> d; e reads d; f reads a (after d, outside)."""
    return _graph([("a", "Relu", ["x"]), ("b", "Exp", ["a"]), ("c", "Neg", ["b"]), ("d", "Add", ["a", "c"]),
                   ("e", "Tanh", ["d"]), ("f", "Sigmoid", ["a"])], ["e", "f"])


def test_outside_path_is_the_whole_detour_from_group_node_to_group_node():
    g = _detour()
    pos = _pos(g)
    assert [n.name for n in outside_path(_nodes(g, "a", "d"), pos)] == ["a", "b", "c", "d"]
    assert [n.name for n in outside_path(_nodes(g, "d", "a"), pos)] == ["a", "b", "c", "d"]
    assert [n.name for n in outside_path(_nodes(g, "b", "d"), pos)] == ["b", "c", "d"]
    assert [n.name for n in outside_path(_nodes(g, "a", "c"), pos)] == ["a", "b", "c"]
    assert outside_path(_nodes(g, "a", "b", "c", "d"), pos) is None   # convex
    assert outside_path(_nodes(g, "a", "b"), pos) is None
    assert outside_path(_nodes(g, "d", "e"), pos) is None
    assert outside_path(_nodes(g, "a", "f"), pos) is None           # f reads a directly: no detour


def test_cycle_refusal_names_the_path_and_its_two_ends():
    g = _detour()
    r = check_dependencies(_nodes(g, "a", "d"), g, _pos(g), DependencyRules())
    assert (r.kind, r.reason) == ("dependency", "fusing would create a cycle: 'a' -> 'b' -> 'c' -> 'd' leaves the "
                                                "group and comes back")
    assert [n.name for n in r.culprits] == ["a", "d"]
    assert check_dependencies(_nodes(g, "a", "b", "c", "d"), g, _pos(g), DependencyRules()) is None


# dependencies: in place ------------------------------------------------------------------------------

def test_in_place_op_may_fuse_only_when_nobody_outside_reads_its_buffer():
    # a -> s (in place over a) -> t; r reads a too
    g = _graph([("a", "Relu", ["x"]), ("s", "Sigmoid", ["a"]), ("r", "Exp", ["a"]), ("t", "Tanh", ["s"])],
               ["t", "r"])
    deps = DependencyRules(inplace_ops=frozenset({"Sigmoid"}))
    pos = _pos(g)
    r = check_dependencies(_nodes(g, "s", "t"), g, pos, deps)
    assert (r.kind, r.reason) == ("dependency", "'s' overwrites 'a' in place, which 'r' outside the group still "
                                                "reads")
    assert [n.name for n in r.culprits] == ["s"]
    assert check_dependencies(_nodes(g, "s", "r", "t"), g, pos, deps) is None      # every reader inside
    assert check_dependencies(_nodes(g, "a", "s", "r", "t"), g, pos, deps) is None
    assert check_dependencies(_nodes(g, "r", "t"), g, pos, deps) is None           # no in-place op in the group
    # only readers other than the in-place op itself count
    g2 = _graph([("a", "Relu", ["x"]), ("s", "Sigmoid", ["a"]), ("t", "Tanh", ["s"])], ["t"])
    assert check_dependencies(_nodes(g2, "s", "t"), g2, _pos(g2), deps) is None


def test_in_place_check_skips_an_op_without_its_first_input():
    g = Graph("t")
    x = g.add_input("x", T.shape)
    s = g.add_node("Sigmoid", [None, x], name="s", output_types=[T]).outputs[0]
    r = g.add_node("Exp", [x], name="r", output_types=[T]).outputs[0]
    g.outputs = [s, r]
    deps = DependencyRules(inplace_ops=frozenset({"Sigmoid"}))
    assert check_dependencies([g.node("s")], g, _pos(g), deps) is None


# dependencies: the order of random draws ----------------------------------------------------------------

def _draws(middle: str):
    """draw1, <middle>, add(draw1, x), draw3 after everything."""
    return _graph([("draw1", "RandomUniformLike", ["x"]), ("mid", middle, ["x"]), ("add", "Add", ["draw1", "x"]),
                   ("draw3", "RandomNormalLike", ["x"])], ["add", "mid", "draw3"])


def test_a_random_op_may_not_move_across_another_random_op():
    g = _draws("RandomNormalLike")
    r = check_dependencies(_nodes(g, "draw1", "add"), g, _pos(g), DependencyRules())
    assert (r.kind, r.reason) == ("dependency", "random op 'draw1' would move across random op 'mid' and change "
                                                "the order of draws")
    # a random op before or after the group is not crossed; nor is a random op inside it
    assert check_dependencies(_nodes(g, "add", "draw3"), g, _pos(g), DependencyRules()) is None
    assert check_dependencies(_nodes(g, "draw1", "mid", "add"), g, _pos(g), DependencyRules()) is None
    # no random op in the group: nothing moves
    g2 = _graph([("a", "Relu", ["x"]), ("mid", "RandomNormalLike", ["x"]), ("b", "Add", ["a", "x"])], ["b", "mid"])
    assert check_dependencies(_nodes(g2, "a", "b"), g2, _pos(g2), DependencyRules()) is None
    # a plain op between is no draw; the random set is configurable
    g3 = _draws("Exp")
    assert check_dependencies(_nodes(g3, "draw1", "add"), g3, _pos(g3), DependencyRules()) is None
    assert check_dependencies(_nodes(g, "draw1", "add"), g, _pos(g), DependencyRules(rng_ops=frozenset())) is None
