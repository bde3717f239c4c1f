"""The three conflict kinds: overlap, resource, dependency (cycle, in-place, RNG order)."""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, TensorType
from opfuse.ops import GraphBuilder
from opfuse.patterns import Op, Var, par
from opfuse.rules import DependencyRules, FusionOptions, Rule, check_dependencies, check_resources, outside_path
from opfuse.rules.elementwise import ELEMENTWISE_CHAIN

SHAPE = (2, 4)
T = TensorType(SHAPE, np.float32)


def cycle_graph():
    """A -> B -> C and A -> C: B stays outside a group {A, C}."""
    b = GraphBuilder("cycle")
    x = b.input("x", SHAPE)
    a = b.op("Relu", x, name="A")
    bb = b.op("Exp", a, name="B")
    c = b.op("Add", a, bb, name="C")
    return b.build(c)


def test_cycle_through_an_outside_path_is_refused(decide):
    g = cycle_graph()
    a, bb, c = g.nodes
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    assert [n.name for n in outside_path([a, c], pos)] == ["A", "B", "C"]
    assert outside_path([a, bb, c], pos) is None
    rule = Rule("relu_add", Op("Relu").keep() >> Op("Add"))     # A's output also feeds B
    out = decide(g, [rule])
    assert out.taken("relu_add") == []
    assert out.refused("relu_add", "dependency") == \
        ["fusing would create a cycle: 'A' -> 'B' -> 'C' leaves the group and comes back"]


def test_cycle_between_parallel_siblings_is_refused(decide):
    b = GraphBuilder("siblings")
    x = b.input("x", SHAPE)
    m1 = b.op("Mul", x, b.const("c", np.ones(SHAPE, np.float32)), name="m1")
    r = b.op("Relu", m1, name="between")
    m2 = b.op("Mul", x, r, name="m2")
    g = b.build(m2, m1)
    v = Var()
    out = decide(g, [Rule("siblings", v >> par(Op("Mul"), Op("Mul")))])
    assert out.refused("siblings", "dependency") == \
        ["fusing would create a cycle: 'm1' -> 'between' -> 'm2' leaves the group and comes back"]


def test_overlap_goes_to_the_higher_score_and_the_rest_is_rematched(decide):
    b = GraphBuilder("overlap")
    x = b.input("x", SHAPE)
    y = b.op("Tanh", b.op("Sigmoid", b.op("Relu", x, name="r"), name="s"), name="t")
    g = b.build(y)
    big = Rule("pair", Op("Relu") >> Op("Sigmoid"), priority=10.0)
    out = decide(g, [ELEMENTWISE_CHAIN, big])
    assert out.taken("pair") == [["r", "s"]]
    assert out.refused("elementwise_chain", "overlap") == \
        ["node 'r' was fused by rule 'pair' (group 'pair_r')"]
    # what the chain had left (one op) is no chain: nothing more to fuse
    assert out.taken("elementwise_chain") == []


def chain(n: int) -> Graph:
    g = Graph("chain")
    v = g.add_input("x", SHAPE)
    for i in range(n):
        v = g.add_node("Relu", [v], name=f"r{i}", output_types=[T]).outputs[0]
    g.outputs = [v]
    return g


def test_resource_limit_on_ops_per_group(decide):
    g = chain(4)
    four = Rule("four", Op("Relu") >> Op("Relu") >> Op("Relu") >> Op("Relu"))
    out = decide(g, [four], limits=FusionOptions(max_ops=3))
    assert out.refused("four", "resource") == ["4 ops exceed the limit of 3 ops per group"]
    assert check_resources(g.nodes, g, FusionOptions(max_ops=4)) is None


def test_long_chain_is_split_within_the_group_cap(decide):
    g = chain(10)
    out = decide(g, [ELEMENTWISE_CHAIN], limits=FusionOptions(max_ops=4))
    groups = out.result.groups
    assert [len(gr.nodes) for gr in groups] == [4, 4, 2]
    assert sorted(n.name for gr in groups for n in gr.nodes) == sorted(f"r{i}" for i in range(10))


def test_a_very_long_chain_is_cut_into_windows_without_refusals(decide):
    # Repetition stops growing at the group cap, so no over-long match has to be refused and
    # cut down op by op (that was quadratic: a 200-op chain took a minute).
    g = chain(200)
    out = decide(g, [ELEMENTWISE_CHAIN])
    assert [len(gr.nodes) for gr in out.result.groups] == [32] * 6 + [8]
    assert not out.refused("elementwise_chain", "resource")


def test_working_set_and_input_budgets(decide):
    g = chain(3)
    nbytes = T.nbytes
    limits = FusionOptions(max_working_set_bytes=nbytes)     # two internal values do not fit
    c = check_resources(g.nodes, g, limits)
    assert c.kind == "resource" and c.reason == \
        f"working set of {2 * nbytes} bytes exceeds the on-chip budget of {nbytes} bytes"
    assert check_resources(g.nodes[:2], g, limits) is None
    assert "distinct inputs exceed" in check_resources(g.nodes, g, FusionOptions(max_inputs=0)).reason


def test_limits_from_a_hardware_profile():
    class Profile:
        sram_bytes = 512 * 1024
        max_ops_per_group = 12
    lim = FusionOptions.from_profile(Profile())
    assert lim.max_working_set_bytes == 512 * 1024 and lim.max_ops == 12


def rng_graph(between: bool):
    g = Graph("rng")
    x = g.add_input("x", SHAPE)
    r1 = g.add_node("RandomUniformLike", [x], name="draw1", output_types=[T]).outputs[0]
    nodes = [r1]
    if between:
        r2 = g.add_node("RandomNormalLike", [x], name="draw2", output_types=[T]).outputs[0]
        nodes.append(r2)
    y = g.add_node("Add", [r1, x], name="add", output_types=[T]).outputs[0]
    g.outputs = [y] + ([nodes[1]] if between else [])
    return g


def test_rng_order_dependency(decide):
    rule = Rule("rng_add", Op("RandomUniformLike") >> Op("Add"))
    out = decide(rng_graph(between=True), [rule])
    assert out.refused("rng_add", "dependency") == \
        ["random op 'draw1' would move across random op 'draw2' and change the order of draws"]
    out = decide(rng_graph(between=False), [rule])
    assert out.taken("rng_add") == [["draw1", "add"]]


def test_in_place_dependency():
    g = Graph("inplace")
    x = g.add_input("x", SHAPE)
    r = g.add_node("Relu", [x], name="relu", output_types=[T]).outputs[0]
    s = g.add_node("Sigmoid", [r], name="sig_inplace", output_types=[T]).outputs[0]
    other = g.add_node("Exp", [r], name="reader", output_types=[T]).outputs[0]
    t = g.add_node("Tanh", [s], name="tanh", output_types=[T]).outputs[0]
    g.outputs = [t, other]
    pos = {id(n): i for i, n in enumerate(g.nodes)}
    deps = DependencyRules(inplace_ops=frozenset({"Sigmoid"}))
    sig, tanh = g.nodes[1], g.nodes[3]
    c = check_dependencies([sig, tanh], g, pos, deps)
    assert c.kind == "dependency" and c.reason == \
        "'sig_inplace' overwrites 'relu' in place, which 'reader' outside the group still reads"
    assert check_dependencies([sig, tanh], g, pos, DependencyRules()) is None
