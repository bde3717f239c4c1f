"""Vertical fusion by op category along the post-dominator tree, with refusal reasons."""
import numpy as np

from opfuse.rules.postdom import immediate_post_dominators
from opfuse.ops import GraphBuilder
from fusion_cases import group_with, kinds, plan_of, randn, refusals


def test_post_dominators():
    b = GraphBuilder("pdom")
    x = b.input("x", (4,))
    a = b.op("Relu", x, name="a")
    left, r = b.op("Neg", a, name="l"), b.op("Abs", a, name="r")
    j = b.op("Add", left, r, name="j")
    g = b.build(j, r)
    ip = immediate_post_dominators(g)
    node = {n.name: n for n in g.nodes}
    assert ip[id(node["a"])] is None  # r is a graph output: only the exit post-dominates a
    assert ip[id(node["l"])] is node["j"] and ip[id(node["j"])] is None


def test_elementwise_chain_is_one_loop():
    b = GraphBuilder("chain")
    x, y = b.input("x", (2, 8)), b.input("y", (2, 8))
    z = b.op("Sigmoid", b.op("Mul", b.op("Relu", b.op("Add", x, y)), b.const("c", np.float32(2))))
    plan, _ = plan_of(b.build(z))
    assert kinds(plan) == [("elementwise", "Add+Relu+Mul+Sigmoid")]


def test_conv_epilogue_takes_bias_activation_and_residual():
    b = GraphBuilder("epilogue")
    x = b.input("x", (1, 4, 6, 6))
    c = b.op("Conv", x, b.const("w", randn((4, 4, 3, 3))), pads=[1, 1, 1, 1], name="conv")
    y = b.op("Relu", b.op("Add", b.op("Add", c, b.const("bias", randn((1, 4, 1, 1), 1))), x))
    plan, _ = plan_of(b.build(y))
    assert kinds(plan) == [("conv_epilogue", "Conv+Add+Add+Relu")]
    assert plan.groups[0].attrs["epilogue"] == ["add", "add_1", "relu"]


def test_conv_conv_never_fused_and_explained():
    b = GraphBuilder("convconv")
    x = b.input("x", (1, 4, 6, 6))
    c1 = b.op("Relu", b.op("Conv", x, b.const("w1", randn((4, 4, 1, 1))), name="c1"))
    c2 = b.op("Conv", c1, b.const("w2", randn((4, 4, 1, 1), 1)), name="c2")
    plan, dec = plan_of(b.build(c2))
    assert kinds(plan) == [("conv_epilogue", "Conv+Relu"), ("single", "Conv")]
    assert any("category forbids" in r and "(no Conv -> Conv)" in r for r in refusals(dec, "elementwise_chain")
               + refusals(dec, "epilogue"))


def test_elementwise_never_becomes_a_conv_prologue():
    b = GraphBuilder("prologue")
    x = b.input("x", (1, 4, 6, 6))
    c = b.op("Conv", b.op("Relu", x, name="pre"), b.const("w", randn((4, 4, 1, 1))), name="conv")
    plan, dec = plan_of(b.build(c))
    assert len(plan.groups) == 2
    assert any("out-elementwise-fusable ops take epilogues only" in r for r in refusals(dec, "elementwise_chain"))


def test_reduction_with_prologue_and_epilogue():
    b = GraphBuilder("reduce")
    x, y = b.input("x", (2, 16)), b.input("y", (2, 16))
    s = b.op("Softmax", b.op("Add", b.op("Mul", x, b.const("k", np.float32(0.5))), y), axis=-1, name="sm")
    z = b.op("Mul", s, b.const("t", np.float32(3)))
    plan, _ = plan_of(b.build(z))
    assert kinds(plan) == [("reduction", "Mul+Add+Softmax+Mul")]
    assert plan.groups[0].attrs["prologue"] == ["mul", "add"]


def test_layernorm_takes_bias_and_residual_before_it_not_the_matmul():
    b = GraphBuilder("ln_prologue")
    x = b.input("x", (4, 8))
    m = b.op("MatMul", x, b.const("w", randn((8, 8))), name="mm")
    h = b.op("Add", b.op("Add", m, b.const("bias", randn(8, 1))), x)
    y = b.op("LayerNormalization", h, b.const("g", np.ones(8, np.float32)), name="ln")
    plan, dec = plan_of(b.build(y))
    assert kinds(plan) == [("single", "MatMul"), ("reduction", "Add+Add+LayerNormalization")]
    assert any("cannot share a kernel with out-elementwise-fusable 'mm'" in r for r in refusals(dec, "epilogue"))


def test_normalization_prologue_stops_at_the_resource_limit():
    b = GraphBuilder("ln_limit")
    x = b.input("x", (4, 8))
    h = b.op("Add", b.op("Add", x, b.const("bias", randn(8, 1)), name="a1"), b.input("r", (4, 8)), name="a2")
    plan, dec = plan_of(b.build(b.op("LayerNormalization", h, b.const("g", np.ones(8, np.float32)))),
                        max_ops_per_group=2)
    assert kinds(plan) == [("single", "Add"), ("reduction", "Add+LayerNormalization")]
    assert any("resource limit" in r for r in refusals(dec, "normalization_prologue"))


def test_injective_refused_through_a_conv():
    b = GraphBuilder("injective_conv")
    x = b.input("x", (1, 2, 4, 4))
    t = b.op("Transpose", x, perm=[0, 1, 3, 2], name="t")
    c = b.op("Conv", t, b.const("w", randn((2, 2, 1, 1))), name="conv")
    plan, dec = plan_of(b.build(b.op("Add", c, t)))
    assert any("is not data movement or elementwise" in r for r in refusals(dec, "injective"))


def test_pooling_takes_no_conv_but_a_relu_epilogue():
    b = GraphBuilder("pool")
    x = b.input("x", (1, 2, 6, 6))
    p = b.op("MaxPool", b.op("Conv", x, b.const("w", randn((2, 2, 1, 1)))), kernel_shape=[2, 2], strides=[2, 2])
    plan, dec = plan_of(b.build(b.op("Relu", p)))
    assert kinds(plan) == [("single", "Conv"), ("reduction", "MaxPool+Relu")]


def test_injective_ops_are_absorbed_through_index_maps():
    b = GraphBuilder("injective")
    x = b.input("x", (2, 3, 4))
    t = b.op("Transpose", b.op("Relu", x), perm=[0, 2, 1])
    y = b.op("Add", b.op("Reshape", t, b.const("s", np.array([2, 12]))), b.const("c", np.float32(1)))
    plan, _ = plan_of(b.build(y))
    assert kinds(plan) == [("injective", "Relu+Transpose+Reshape+Add")]


def test_value_read_twice_is_not_swallowed():
    b = GraphBuilder("escape")
    x = b.input("x", (4,))
    r = b.op("Relu", x, name="r")
    plan, _ = plan_of(b.build(b.op("Neg", r), b.op("Exp", b.op("Abs", r))))
    assert group_with(plan, "r").op_types == ["Relu"]  # not post-dominated by either reader


def test_resource_limit_caps_group_size():
    b = GraphBuilder("limit")
    v = b.input("x", (4,))
    for i in range(6):
        v = b.op("Relu" if i % 2 else "Neg", v)
    plan, dec = plan_of(b.build(v), max_ops_per_group=4)
    assert max(len(g.nodes) for g in plan.groups) <= 4
    assert any("resource limit" in r and "exceed the limit of 4" in r for r in refusals(dec, "elementwise_chain"))


def test_disabled_rule_is_reported_and_not_applied():
    b = GraphBuilder("disabled")
    x = b.input("x", (1, 4, 6, 6))
    c = b.op("Conv", x, b.const("w", randn((4, 4, 1, 1))))
    plan, dec = plan_of(b.build(b.op("Relu", c)), disabled=frozenset({"epilogue"}))
    assert len(plan.groups) == 2
    assert any(r.startswith("disabled by user") for r in refusals(dec, "epilogue"))
