"""The three conflict kinds: overlap, resource, dependency (cycle, in-place, RNG order)."""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, TensorType
from opfuse.rules import DependencyRules, FusionOptions, check_dependencies, check_resources

SHAPE = (2, 4)
T = TensorType(SHAPE, np.float32)


def chain(n: int) -> Graph:
    g = Graph("chain")
    v = g.add_input("x", SHAPE)
    for i in range(n):
        v = g.add_node("Relu", [v], name=f"r{i}", output_types=[T]).outputs[0]
    g.outputs = [v]
    return g


def test_working_set_and_input_budgets(decide):
    g = chain(3)
    nbytes = T.nbytes
    limits = FusionOptions(max_working_set_bytes=nbytes)     # two internal values do not fit
    c = check_resources(g.nodes, g, limits)
    assert c.kind == "resource" and c.reason == \
        f"working set of {2 * nbytes} bytes exceeds the on-chip budget of {nbytes} bytes"
    assert check_resources(g.nodes[:2], g, limits) is None
    assert "distinct inputs exceed" in check_resources(g.nodes, g, FusionOptions(max_group_inputs=0)).reason


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
