"""Horizontal and mixed fusion: the seed's three conditions, and Conv+Concat aliasing."""
import numpy as np

from opfuse.rules import PlanLegality, unfused_plan
from opfuse.ops import GraphBuilder
from fusion_cases import fuse, kernels, kinds, plan_of, randn, refusals, assert_same_outputs


def bn(b, c, name):
    r = np.random.default_rng(7)
    return [b.const(f"{name}_{k}", v.astype(np.float32)) for k, v in
            (("g", r.uniform(0.5, 1.5, c)), ("b", r.standard_normal(c)), ("m", r.standard_normal(c)),
             ("v", r.uniform(0.5, 2, c)))]


def pools(b, x, avg_kernel=3):
    mp = b.op("MaxPool", x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1], name="maxpool")
    ap = b.op("AveragePool", x, kernel_shape=[avg_kernel] * 2, strides=[1, 1],
              pads=[avg_kernel // 2] * 4, name="avgpool")
    return mp, ap


def test_seed_mixed_example_is_one_vertical_and_one_horizontal_group():
    """x -> [Conv -> BN -> ReLU] -> (MaxPool || AvgPool)  (seed 7.1.3)."""
    b = GraphBuilder("mixed")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Relu", b.op("BatchNormalization", b.op("Conv", x, b.const("w", randn((4, 3, 3, 3))),
                                                     pads=[1, 1, 1, 1], name="conv"), *bn(b, 4, "bn")))
    g0 = b.build(*pools(b, y))
    g, plan, dec = fuse(g0)
    assert kinds(plan) == [("conv_epilogue", "Conv+Relu"), ("horizontal", "MaxPool+AveragePool")]
    h = plan.groups[1]
    assert h.attrs["members"] == [["maxpool"], ["avgpool"]] and h.attrs["shared_input"] == "relu"
    assert [v.name for v in h.inputs()] == ["relu"] and len(h.outputs(g)) == 2
    assert_same_outputs(g0, g)


def test_refused_when_windows_differ():
    b = GraphBuilder("windows")
    x = b.input("x", (1, 2, 8, 8))
    plan, dec = plan_of(b.build(*pools(b, x, avg_kernel=5)))
    assert len(plan.groups) == 2
    assert any("iterate over different domains" in r for r in refusals(dec, "horizontal"))


def test_refused_when_only_the_kernel_shape_differs():
    """Kernels 2 and 3 with stride 4 over 8 give the same output shape: only kernel_shape differs."""
    b = GraphBuilder("kernels")
    x = b.input("x", (1, 2, 8, 8))
    g = b.build(b.op("MaxPool", x, kernel_shape=[2, 2], strides=[4, 4], name="k2"),
                b.op("MaxPool", x, kernel_shape=[3, 3], strides=[4, 4], name="k3"))
    assert g.node("k2").outputs[0].shape == g.node("k3").outputs[0].shape
    plan, dec = plan_of(g)
    assert len(plan.groups) == 2
    assert any("iterate over different domains" in r for r in refusals(dec, "horizontal"))


def test_refused_when_a_path_joins_the_siblings():
    b = GraphBuilder("path")
    x = b.input("x", (4, 4))
    a = b.op("Relu", x, name="a")
    d = b.op("Add", x, b.op("Neg", a, name="c"), name="d")
    g = b.build(d)
    legal = PlanLegality(unfused_plan(g))
    ga, gd = (next(gr for gr in legal.plan().groups if gr.name == n) for n in ("a", "d"))
    r = legal.can_merge(ga, gd)
    assert r is not None and r.kind.label == "cycle" and "not independent" in r.reason


def test_refused_over_the_member_limit():
    b = GraphBuilder("members")
    x = b.input("x", (1, 2, 8, 8))
    plan, dec = plan_of(b.build(*pools(b, x)), max_horizontal_members=1)
    assert len(plan.groups) == 2
    assert any("resource limit: 2 siblings exceed the limit of 1" in r for r in refusals(dec, "horizontal"))


def test_elementwise_siblings_share_one_pass():
    b = GraphBuilder("ew_siblings")
    x = b.input("x", (4, 4))
    plan, _ = plan_of(b.build(b.op("Relu", x), b.op("Sigmoid", x), b.op("Tanh", x)))
    assert kinds(plan) == [("horizontal", "Relu+Sigmoid+Tanh")]


def conv_concat(batch=1, extra_reader=False):
    b = GraphBuilder("conv_concat")
    x = b.input("x", (batch, 3, 6, 6))
    c1 = b.op("Relu", b.op("Conv", x, b.const("w1", randn((4, 3, 1, 1))), name="c1"), name="r1")
    c2 = b.op("Conv", x, b.const("w2", randn((2, 3, 3, 3), 1)), pads=[1, 1, 1, 1], name="c2")
    cat = b.op("Concat", c1, c2, axis=1, name="cat")
    outs = [b.op("Conv", cat, b.const("w3", randn((2, 6, 1, 1), 2)), name="c3")]
    if extra_reader:
        outs.append(c2)
    return b.build(*outs)


def test_conv_concat_producers_write_their_slices():
    g0 = conv_concat()
    g, plan, _ = fuse(g0)
    cat = next(gr for gr in plan.groups if gr.op_types == ["Concat"])
    assert cat.kind == "concat" and cat.attrs["zero_copy"] == "concat"
    assert cat.attrs["alias_inputs"] == ["r1", "c2"]
    assert kernels(plan) == 3
    assert_same_outputs(g0, g)


def test_concat_alias_refused_for_non_contiguous_slices_and_graph_outputs():
    plan, dec = plan_of(conv_concat(batch=2))
    assert any("are not contiguous" in r for r in refusals(dec, "concat_alias"))
    assert not any(g.attrs.get("zero_copy") == "concat" for g in plan.groups)
    plan, dec = plan_of(conv_concat(extra_reader=True))
    cat = next(gr for gr in plan.groups if gr.op_types == ["Concat"])
    assert cat.attrs["alias_inputs"] == ["r1"] and "zero_copy" not in cat.attrs
    assert any("'c2' is a graph output" in r for r in refusals(dec, "concat_alias"))
