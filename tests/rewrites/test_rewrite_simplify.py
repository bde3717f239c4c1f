"""Constant folding, CSE, DCE and Identity removal."""
import numpy as np

from opfuse.ops import GraphBuilder
from rewrite_cases import applied, assert_same_outputs, ops, randn, refusals, rewritten


def test_constant_subgraphs_and_shape_fold():
    b = GraphBuilder("fold")
    x = b.input("x", (2, 3, 4))
    w = b.op("Transpose", b.const("wt", randn((4, 5))), perm=[1, 0])   # constant input -> folded
    m = b.op("MatMul", x, b.op("Transpose", w, perm=[1, 0]))
    dims = b.op("Cast", b.op("Shape", m), to=1)                         # static shape -> folded
    g0, g1, res = rewritten(b.build(m, b.op("Add", b.input("y", (3,)), dims)))
    assert ops(g1) == ["MatMul", "Add"]
    assert applied(res, "constant_folding") >= 1
    assert_same_outputs(g0, g1)


def test_constant_folding_refuses_huge_results():
    b = GraphBuilder("fold_big")
    x = b.input("x", (64, 64))
    e = b.op("Expand", b.const("one", np.ones((1, 1), np.float32)), b.const("shape", np.array([64, 64])))
    g0, g1, res = rewritten(b.build(b.op("Add", x, e)), max_folded_constant_bytes=1024)
    assert "Expand" in ops(g1)
    assert any("exceeds the folding limit of 1024 bytes" in r for r in refusals(res, "constant_folding"))
    assert_same_outputs(g0, g1)


def test_cse_merges_duplicates_including_commuted_inputs():
    b = GraphBuilder("cse")
    x, y = b.input("x", (4,)), b.input("y", (4,))
    a1, a2 = b.op("Add", x, y), b.op("Add", y, x)
    h1 = b.op("Mul", a1, b.const("h1", np.float32(0.5)))
    h2 = b.op("Mul", a2, b.const("h2", np.float32(0.5)))  # an equal constant under another name
    g0, g1, res = rewritten(b.build(b.op("Sub", h1, h2), b.op("Relu", h2)))
    assert ops(g1) == ["Add", "Mul", "Sub", "Relu"]
    assert_same_outputs(g0, g1)


def test_cse_keeps_two_graph_outputs_apart():
    b = GraphBuilder("cse_outputs")
    x = b.input("x", (4,))
    g0, g1, res = rewritten(b.build(b.op("Relu", x, name="r1"), b.op("Relu", x, name="r2")))
    assert ops(g1) == ["Relu", "Relu"]
    assert any("are both graph outputs" in r for r in refusals(res, "common_subexpression_elimination"))
    assert_same_outputs(g0, g1)


def test_cse_of_a_two_output_node_keeps_every_output_name():
    """Two equal Splits, the second's outputs both graph outputs, the first's read inside: merged, each graph
    output keeps its name. Substituted one output at a time, the first kept the first Split's name
    ('split_out0') because the second Split still held its name through its other output (fuzz seed 41214)."""
    b = GraphBuilder("cse_split")
    x = b.input("x", (1, 3, 3))
    a0, _ = b.op("Split", x, axis=-2, split=[1, 2], num_outputs=2, name="split")
    s0, s1 = b.op("Split", x, axis=-2, split=[1, 2], num_outputs=2, name="split_1")
    g0, g1, res = rewritten(b.build(b.op("Neg", a0, name="neg"), s0, s1))
    assert ops(g1) == ["Split", "Neg"]
    assert [v.name for v in g1.outputs] == [v.name for v in g0.outputs] == ["neg", "split_1_out0", "split_1_out1"]
    assert_same_outputs(g0, g1)


def test_dead_code_is_removed():
    b = GraphBuilder("dce")
    x = b.input("x", (4,))
    b.op("Exp", b.op("Neg", x))  # feeds nothing
    g0, g1, res = rewritten(b.build(b.op("Relu", x)))
    assert ops(g1) == ["Relu"]
    assert applied(res, "dead_code_elimination") == 1
    assert res.provenance.of("exp") == [] and res.provenance.of("relu") == ["relu"]


def test_identity_removed_but_not_when_output_would_become_input():
    b = GraphBuilder("identity")
    x = b.input("x", (4,))
    y = b.op("Relu", b.op("Identity", x))
    g0, g1, res = rewritten(b.build(y, b.op("Identity", x, name="passthrough")))
    assert ops(g1) == ["Relu", "Identity"]
    assert any("would become graph input 'x'" in r for r in refusals(res, "remove_identity"))
    assert_same_outputs(g0, g1)
