import numpy as np
import pytest

from opfuse.errors import ModelError, ShapeError
from opfuse.ir import Graph, TensorType, Value
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import run


def tiny():
    b = GraphBuilder("tiny")
    x = b.input("x", (2, 3))
    c = b.const("c", np.full(3, 2.0, np.float32))
    a = b.op("Add", x, c, name="add0")
    m = b.op("Mul", a, a, name="mul0")
    r = b.op("Relu", m, name="relu0")
    s = b.op("Sigmoid", a, name="sig0")
    return b.build(r, s)


def test_links_and_consumers():
    g = tiny()
    add = g.node("add0")
    assert [n.name for n in add.output.consumers] == ["mul0", "sig0"]
    # Mul reads its input twice: two uses, one consumer
    assert len(add.output.uses) == 3
    assert g.values["c"].is_const and g.values["c"].producer is None


def test_text_form_is_stable_and_readable():
    g = tiny()
    text = str(g)
    assert text == str(g.copy())
    assert "%add0: float32[2,3] = Add(%x, %c)  # add0" in text
    assert text.splitlines()[0] == "graph tiny (%x: float32[2,3]) -> (%relu0, %sig0) {"


def test_copy_is_independent():
    g = tiny()
    h = g.copy()
    h.verify()
    relu = h.node("relu0")
    h.replace_all_uses(relu.output, relu.inputs[0])
    h.remove_node(relu)
    assert len(h) == len(g) - 1
    g.verify()
    h.verify()


def test_replace_and_remove_keep_graph_valid():
    g = tiny()
    sig = g.node("sig0")
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    before = run(g, feeds)
    with pytest.raises(ModelError, match="still used"):
        g.remove_node(g.node("add0"))
    relu = g.node("relu0")
    new = g.add_node("Relu", [g.node("mul0").output], name="relu_new", output_types=[relu.output.type])
    g.replace_all_uses(relu.output, new.output)
    g.remove_node(relu)
    g.verify()
    after = run(g, feeds)
    np.testing.assert_array_equal(before["relu0"], after[g.outputs[0].name])
    np.testing.assert_array_equal(before["sig0"], after["sig0"])
    assert sig in g.nodes


def test_verify_catches_bad_order_and_shapes():
    g = tiny()
    g.nodes.reverse()
    with pytest.raises(ModelError, match="before it is defined"):
        g.verify()
    g.toposort()
    g.verify()
    g2 = tiny()
    g2.node("relu0").output.type = TensorType((3, 2), np.float32)
    with pytest.raises(ShapeError, match="relu0"):
        g2.verify()


def test_toposort_detects_cycle():
    g = Graph("cyc")
    x = g.add_input("x", (4,))
    t = TensorType((4,), np.float32)
    a = g.add_node("Relu", [x], name="a", output_types=[t])
    b = g.add_node("Relu", [a.output], name="b", output_types=[t])
    g.set_input(a, 0, b.output)  # a <- b <- a
    with pytest.raises(ModelError, match="cycle"):
        g.toposort()


def test_unique_names_deterministic():
    g = Graph()
    g.add_input("v", (1,))
    assert g.unique_name("v") == "v_1"
    g.add_value(Value("v_1", TensorType((1,), np.float32)))
    assert g.unique_name("v") == "v_2"


def test_fusion_plan_verify():
    g = tiny()
    plan = FusionPlan.unfused(g)
    plan.verify()
    assert plan.num_kernels == 4
    n = {x.name: x for x in g.nodes}
    fused = FusionPlan(g, [FusionGroup("f0", [n["add0"], n["mul0"], n["relu0"]], "elementwise"),
                           FusionGroup("f1", [n["sig0"]])])
    fused.verify()
    assert [v.name for v in fused.groups[0].outputs(g)] == ["add0", "relu0"]
    assert fused.groups[0].internal_values(g)[0].name == "mul0"
    bad = FusionPlan(g, [FusionGroup("f1", [n["sig0"]]),
                         FusionGroup("f0", [n["add0"], n["mul0"], n["relu0"]])])
    with pytest.raises(ModelError, match="not before it"):
        bad.verify()
    dup = FusionPlan(g, [FusionGroup("a", [n["add0"]]), FusionGroup("b", [n["add0"], n["mul0"],
                                                                          n["relu0"], n["sig0"]])])
    with pytest.raises(ModelError, match="in groups"):
        dup.verify()
