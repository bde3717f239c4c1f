"""Refusal texts of ``rules.kernel_shape.classify`` worked out by hand from the module's messages (found by
mutation testing, tests/MUTATION.md): which condition a group breaks first is what the decision log and
``explain`` tell the user."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.rules.decisions import RefusalKind
from opfuse.rules.kernel_shape import classify
from fusion_cases import randn


def test_an_epilogue_op_wider_than_the_anchor_is_refused_by_its_own_condition():
    """Conv (1, 4, 4, 4) -> Add with a (2, 4, 4, 4) operand: the Add's output is not the anchor's shape. The
    refusal names the Add (the first epilogue op that breaks the condition), not the value leaving the group."""
    b = GraphBuilder("wide")
    x = b.input("x", (1, 3, 4, 4))
    y = b.input("y", (2, 4, 4, 4))
    conv = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))), name="conv")
    g = b.build(b.op("Relu", b.op("Add", conv, y, name="add"), name="relu"))
    r = classify(list(g.nodes), g)
    assert (r.kind, r.reason) == (RefusalKind.CONDITION,
                                  "epilogue op 'add' (Add) has output shape (2, 4, 4, 4), not the anchor's "
                                  "(1, 4, 4, 4): the epilogue runs once per output element")


def test_a_sibling_branch_joining_the_epilogue_is_checked_too():
    """Conv -> Relu and Conv -> Neg joined by Add: every node after the anchor is an epilogue op."""
    b = GraphBuilder("diamond")
    x = b.input("x", (1, 3, 4, 4))
    conv = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))), name="conv")
    g = b.build(b.op("Add", b.op("Relu", conv, name="relu"), b.op("Neg", conv, name="neg"), name="add"))
    shape = classify(list(g.nodes), g)
    assert (shape.kind, shape.anchor.name, shape.attrs) == ("conv_epilogue", "conv",
                                                            {"epilogue": ["relu", "neg", "add"]})
    k = b.const("k", np.ones((2, 4, 4, 4), np.float32))
    g2 = b.build(b.op("Mul", b.op("Add", g.node("relu").outputs[0], k, name="wide"), k, name="mul"))
    nodes = [n for n in g2.nodes if n.name in ("conv", "relu", "wide", "mul")]
    r = classify(nodes, g2)
    assert r.reason == ("epilogue op 'wide' (Add) has output shape (2, 4, 4, 4), not the anchor's (1, 4, 4, 4): "
                        "the epilogue runs once per output element")


def test_an_expand_after_the_anchor_is_refused_naming_both():
    """Expand is broadcast but not pointwise: it would spread one anchor element over several outputs."""
    b = GraphBuilder("expand")
    x = b.input("x", (1, 3, 4, 4))
    conv = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))), name="conv")
    g = b.build(b.op("Expand", conv, b.const("shape", np.array([2, 4, 4, 4], np.int64)), name="ex"))
    r = classify([g.node("conv"), g.node("ex")], g)
    assert (r.kind, r.reason) == (RefusalKind.CATEGORY,
                                  "'ex' (Expand) after 'conv' (Conv) would spread one result of the anchor over "
                                  "several output elements: an epilogue maps each anchor element to one element")


def test_a_refused_8_bit_prologue_names_its_first_op():
    """x (int8) -> Cast -> Sub(a run-time zero point) -> Conv: the prologue reads a non-constant int32."""
    b = GraphBuilder("q")
    x = b.input("x", (1, 2, 5, 5), "int8")
    s = b.op("Sub", b.op("Cast", x, name="cast", to=6), b.input("zpv", (), "int32"), name="sub")
    g = b.build(b.op("Conv", s, b.const("w", np.ones((2, 2, 3, 3), np.int32)), name="conv", pads=[1, 1, 1, 1]))
    r = classify([g.node("cast"), g.node("sub"), g.node("conv")], g)
    assert (r.kind, r.reason) == (RefusalKind.CATEGORY,
                                  "'cast' (Cast) would feed 'conv' (Conv): out-elementwise-fusable ops take an "
                                  "epilogue, and a prologue only to dequantize an 8-bit operand ('sub' (Sub) reads "
                                  "'zpv' (int32): a prologue reads an 8-bit tensor and constants only)")


def test_a_side_branch_leaving_with_another_shape_is_refused_naming_the_value():
    """x1 (1, 1, 4, 4) -> Relu joins Conv (1, 4, 4, 4) by a broadcasting Add, and Relu's result is also a graph
    output: it leaves the kernel with its own shape, not the anchor's."""
    b = GraphBuilder("side")
    x = b.input("x", (1, 3, 4, 4))
    x1 = b.input("x1", (1, 1, 4, 4))
    conv = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))), name="conv")
    relu = b.op("Relu", x1, name="relu")
    g = b.build(b.op("Add", conv, relu, name="add"), relu)
    r = classify([g.node("conv"), g.node("relu"), g.node("add")], g)
    assert (r.kind, r.reason) == (RefusalKind.CONDITION,
                                  "'relu' leaves the group with shape (1, 1, 4, 4), not the anchor's (1, 4, 4, 4)")


def test_elementwise_outputs_of_two_shapes_and_an_expand_after_a_reduction():
    b = GraphBuilder("shapes")
    x = b.input("x", (4, 4))
    relu = b.op("Relu", x, name="relu")
    g = b.build(relu, b.op("Add", relu, b.const("w", np.ones((2, 4, 4), np.float32)), name="add"))
    r = classify(list(g.nodes), g)
    assert (r.kind, r.reason) == (RefusalKind.CONDITION, "elementwise outputs of different shapes "
                                                         "[(2, 4, 4), (4, 4)] cannot share one loop")
    b = GraphBuilder("rexp")
    rs = b.op("ReduceSum", b.input("x", (4, 4)), axes=[1], keepdims=1, name="rs")
    g = b.build(b.op("Expand", rs, b.const("shape", np.array([4, 4], np.int64)), name="ex"))
    r = classify(list(g.nodes), g)
    assert (r.kind, r.reason) == (RefusalKind.CATEGORY,
                                  "'ex' (Expand) after 'rs' (ReduceSum) would spread one result of the anchor over "
                                  "several output elements: an epilogue maps each anchor element to one element")


def test_an_opaque_op_is_never_fused():
    b = GraphBuilder("det")
    g = b.build(b.op("Relu", b.op("Det", b.input("x", (3, 2, 2)), name="det"), name="relu"))
    r = classify(list(g.nodes), g)
    assert (r.kind, r.reason) == (RefusalKind.CATEGORY, "'det' (Det) is opaque: never fused")


def test_unconnected_ops_are_not_one_vertical_kernel():
    b = GraphBuilder("apart")
    g = b.build(b.op("Relu", b.input("x", (4,)), name="r"), b.op("Neg", b.input("y", (4,)), name="n"))
    r = classify(list(g.nodes), g)
    assert (r.kind, r.reason) == (RefusalKind.CONDITION, "the ops are not connected by producer-consumer edges "
                                                         "(siblings fuse horizontally)")


def test_an_op_reading_max_pools_indices_is_no_epilogue():
    """MaxPool's second output (its Indices) into Where: the kernel stores the indices apart from the values its
    epilogue computes from, so the Where is refused with its reason (it was a group the code generator then
    failed on, "output 'where' is not computed element by element from the anchor": fuzz seed 41213, graph 356);
    an op on the pooled values still fuses."""
    b = GraphBuilder("indices")
    x = b.input("x", (1, 3, 4, 5))
    y, i = b.op("MaxPool", x, kernel_shape=[1, 1], num_outputs=2, name="maxpool")
    w = b.op("Where", b.input("c", (1, 3, 4, 5), np.bool_), i, i, name="where")
    g = b.build(w, b.op("Relu", y, name="relu"))
    r = classify([g.node("maxpool"), g.node("where")], g)
    assert (r.kind, r.reason) == (RefusalKind.CATEGORY, "'where' (Where) reads 'maxpool' (MaxPool)'s output "
                                                        "'maxpool_out1' (not its first): an epilogue computes from "
                                                        "the anchor's first output only")
    shape = classify([g.node("maxpool"), g.node("relu")], g)
    assert (shape.kind, shape.attrs["epilogue"]) == ("reduction", ["relu"])
