"""The memory plan of whole models: liveness, views, Concat aliasing, in place, the report."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given

from cg_support import epilogue_plan, fused_plan, group_by_names
from liveness_reference import arena_conflicts, kernel_lifetimes
from opfuse.ir.plan import FusionPlan
from opfuse.memory import plan_memory
from opfuse.memory.inplace import inplace_candidates
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder
from opfuse.testing.random_graphs import graphs, property_settings

from opfuse import zoo


def _check_plan(plan: FusionPlan):
    mem = plan_memory(plan)
    assert mem.conflicts() == []
    assert arena_conflicts(mem) == []  # lifetimes recomputed from the kernel order, not the plan's
    g = plan.graph
    outputs = {id(v) for v in g.outputs}
    for grp in plan.groups:
        for v in grp.internal_values(g):
            assert v.name not in mem.locations
        for v in grp.outputs(g):
            if mem.is_static(v):
                continue
            loc = mem.location(v)
            if id(v) in outputs:
                assert loc.region == "output"
            else:
                assert loc.region in ("arena", "input", "output")  # views may sit in the caller's buffers
    for v in g.inputs:
        assert mem.location(v).region == "input"
    assert mem.lower_bound_bytes <= mem.arena_bytes
    return mem


@property_settings(max_examples=60)
@given(graphs(max_nodes=12))
def test_random_graphs_have_sound_plans(graph):
    _check_plan(FusionPlan.unfused(graph))
    _check_plan(epilogue_plan(graph))


@pytest.mark.parametrize("name", zoo.list_models())
def test_zoo_plans_are_sound_and_tight(name):
    g = zoo.load(name)
    for plan in (FusionPlan.unfused(g), fused_plan(name, g)):
        mem = _check_plan(plan)
        r = mem.report()
        assert r["arena_bytes"] == mem.arena_bytes and r["arena_lower_bound_bytes"] == mem.lower_bound_bytes
        # Greedy best fit stays within 10% of the lower bound on every zoo model.
        assert mem.arena_bytes <= 1.1 * mem.lower_bound_bytes + 64 * len(plan.groups)


def _chain(n=4, shape=(1, 8, 16, 16)):
    b = GraphBuilder("chain")
    x = b.input("x", shape)
    v = b.op("Conv", x, b.const("w", np.ones((shape[1], shape[1], 1, 1), np.float32)))
    for k in range(n):
        v = b.op(["Relu", "Sigmoid", "Neg", "Tanh"][k % 4], v)
    return b.build(v)


def test_unfused_elementwise_chain_runs_in_place():
    g = _chain()
    mem = plan_memory(FusionPlan.unfused(g))
    nbytes = g.outputs[0].nbytes
    assert mem.arena_bytes == nbytes  # conv output, then every op over it in place
    assert mem.report()["inplace"] == 3  # the last op writes the graph output
    assert plan_memory(FusionPlan.unfused(g), inplace=False).arena_bytes == 2 * nbytes


def test_inplace_refused_when_the_input_lives_on():
    b = GraphBuilder("fork")
    x = b.input("x", (1, 4, 8, 8))
    c = b.op("Conv", x, b.const("w", np.ones((4, 4, 1, 1), np.float32)))
    r = b.op("Relu", c)
    y = b.op("Add", r, c)  # c is read again after Relu
    g = b.build(y)
    mem = plan_memory(FusionPlan.unfused(g))
    assert not any(a.kind == "inplace" and a.value == r.name for a in mem.aliases)
    assert mem.conflicts() == []


def test_inplace_candidates_follow_op_categories():
    b = GraphBuilder("cands")
    x = b.input("x", (1, 4, 6, 6))
    c = b.op("Conv", x, b.const("w", np.ones((4, 4, 1, 1), np.float32)), name="conv")
    small = b.op("ReduceMean", c, axes=[2, 3], name="mean")
    t = b.op("Transpose", c, perm=[0, 1, 3, 2], name="t")
    e = b.op("Mul", c, small, name="scale")  # c full shape, small broadcast
    g = b.build(t, e)
    static = static_values(g)
    groups = {grp.name: grp for grp in FusionPlan.unfused(g).groups}
    assert [(i.name, o.name) for i, o in inplace_candidates(groups["scale"], g, static)] == [("conv", "scale")]
    assert inplace_candidates(groups["t"], g, static) == []  # a transpose reads elsewhere
    # A reduction reads many elements per output: its input is never overwritten.
    assert inplace_candidates(groups["mean"], g, static) == []


def test_views_share_bytes_and_need_no_kernel():
    b = GraphBuilder("views")
    x = b.input("x", (1, 6, 4, 4))
    c = b.op("Relu", x, name="relu")
    r = b.op("Reshape", c, b.const("s", np.array([1, 6, 16], np.int64)), name="reshape")
    s0, s1 = b.op("Split", c, axis=1, split=[2, 4], num_outputs=2, name="split")
    y = b.op("Add", b.op("Neg", s1, name="neg"), b.const("one", np.float32(1)), name="add")
    g = b.build(b.op("Sigmoid", r, name="sig"), s0, y)
    mem = plan_memory(FusionPlan.unfused(g))
    assert mem.location(r) == mem.location(c)
    assert mem.location(s1).offset == mem.location(c).offset + 2 * 16 * 4
    assert {a.value for a in mem.aliases if a.kind == "view"} == {r.name, s1.name}  # s0 is a graph output
    assert mem.conflicts() == []


def test_concat_inputs_alias_only_contiguous_slices():
    def model(batch):
        b = GraphBuilder("cat")
        x = b.input("x", (batch, 3, 4, 4))
        a = b.op("Relu", x, name="a")
        c = b.op("Neg", x, name="c")
        return b.build(b.op("Sigmoid", b.op("Concat", a, c, axis=1, name="cat"), name="sig"))
    g = model(1)
    mem = plan_memory(group_by_names(g, [("concat", ["cat"])]))
    cat = g.values["cat"]
    assert mem.location(g.values["a"]).offset == mem.location(cat).offset
    assert mem.location(g.values["c"]).offset == mem.location(cat).offset + 3 * 16 * 4
    assert mem.report()["concat_aliases"] == 2
    g2 = model(2)  # channel slices of a batch-2 tensor are strided: no aliasing
    assert plan_memory(group_by_names(g2, [("concat", ["cat"])])).report()["concat_aliases"] == 0
    # An unfused ("single") Concat copies: that is the baseline.
    assert plan_memory(FusionPlan.unfused(g)).report()["concat_aliases"] == 0


def test_static_values_take_no_arena(tmp_path):
    b = GraphBuilder("static")
    x = b.input("x", (2, 3))
    shp = b.op("Shape", x, name="shape")
    fill = b.op("ConstantOfShape", b.const("dims", np.array([2, 3], np.int64)),
                value=np.array([2.0], np.float32), name="fill")
    y = b.op("Add", b.op("Relu", x, name="relu"), fill, name="add")
    g = b.build(y, shp)
    mem = plan_memory(FusionPlan.unfused(g))
    assert mem.is_static(g.values["shape"]) and mem.is_static(g.values["fill"])
    assert "shape" not in mem.locations and "fill" not in mem.locations
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    model = build(g, None, cache_dir=tmp_path)
    feeds = reference.random_inputs(g, 0)
    got, want = model.run(feeds), reference.run(g, feeds)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    assert [k["function"] for k in model.report["c_kernels"] if k["ops"] in (["Shape"], ["ConstantOfShape"])] == \
        [None, None]


def test_no_inplace_when_a_separate_pass_writes_first(tmp_path):
    """Group [Conv, Add(conv, r), Neg(r)]: Neg runs as its own pass before the Conv's, so it
    must not overwrite r, which the Conv's epilogue reads afterwards."""
    b = GraphBuilder("two_passes")
    x = b.input("x", (1, 4, 5, 5))
    r = b.op("Relu", b.input("r0", (1, 4, 5, 5)), name="r")
    c = b.op("Conv", x, b.const("w", np.ones((4, 4, 1, 1), np.float32)), name="conv")
    neg = b.op("Neg", r, name="neg")
    add = b.op("Add", c, r, name="add")
    g = b.build(b.op("Sigmoid", neg, name="s1"), b.op("Sigmoid", add, name="s2"))
    plan = group_by_names(g, [("conv_epilogue", ["conv", "add", "neg"])])
    grp = next(grp for grp in plan.groups if grp.kind == "conv_epilogue")
    assert inplace_candidates(grp, g, static_values(g)) == []
    from cg_support import assert_close, run_both
    got, want, _ = run_both(g, plan, tmp_path)
    assert_close(got, want)


def test_the_plan_lifetimes_are_the_kernel_order_ones():
    """Every arena value's recorded life is exactly producer kernel .. last reader kernel."""
    for name in ("resnet8", "bert_layer"):
        g = zoo.load(name)
        for plan in (FusionPlan.unfused(g), fused_plan(name, g)):
            mem = plan_memory(plan)
            want = kernel_lifetimes(plan)
            for v, span in mem.lifetimes.items():
                if mem.locations[v].region == "arena":
                    assert span == want[v], v


def _c2f_like(order=("a", "b", "m")):
    """A YOLO C2f block in small: Conv -> Split(a, b); m = Conv(b) + b; Concat(a, b, m) -> Conv."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("c2f")
    x = b.input("x", (1, 4, 6, 6))
    c = b.op("Conv", x, b.const("w1", rng.standard_normal((8, 4, 1, 1)).astype(np.float32)), name="cv1")
    s = b.op("Sigmoid", c, name="act")
    a, bb = b.op("Split", s, split=[4, 4], axis=1, num_outputs=2, name="split")
    m = b.op("Add", bb, b.op("Conv", bb, b.const("w2", rng.standard_normal((4, 4, 3, 3)).astype(np.float32)),
                               pads=[1, 1, 1, 1], name="m_cv"), name="m_add")
    vals = {"a": a, "b": bb, "m": m}
    cat = b.op("Concat", *[vals[k] for k in order], axis=1, name="cat")
    w3 = b.const("w3", rng.standard_normal((4, 12, 1, 1)).astype(np.float32))
    return b.build(b.op("Conv", cat, w3, name="cv2"))


def test_a_split_through_a_concat_has_its_input_written_into_the_concat(tmp_path):
    from cg_support import assert_close, run_both
    from opfuse.rules import FusionOptions, form_groups, fusion_rules
    g = _c2f_like()
    plan, _ = form_groups(g, fusion_rules(), FusionOptions())
    split = next(grp for grp in plan.groups if [n.name for n in grp.nodes] == ["split"])
    assert split.attrs["zero_copy"] == "view" and split.attrs["through_concat"] == "cat"
    mem = plan_memory(plan)
    assert mem.conflicts() == [] and arena_conflicts(mem) == []
    cat, act = g.values["cat"], g.values["act"]
    a, b = g.node("split").outputs
    assert mem.location(act) == mem.location(cat) == mem.location(a)
    assert mem.location(b).offset == mem.location(cat).offset + 4 * 36 * 4
    got, want, model = run_both(g, plan, tmp_path)
    assert_close(got, want)
    # neither the Split nor the Concat runs a kernel
    assert [k["function"] for k in model.report["c_kernels"] if k["ops"] in (["Split"], ["Concat"])] == [None, None]


def test_a_split_whose_outputs_are_out_of_order_in_the_concat_copies(tmp_path):
    from cg_support import assert_close, run_both
    from opfuse.rules import FusionOptions, form_groups, fusion_rules
    g = _c2f_like(("b", "a", "m"))
    plan, _ = form_groups(g, fusion_rules(), FusionOptions())
    split = next(grp for grp in plan.groups if [n.name for n in grp.nodes] == ["split"])
    assert "zero_copy" not in split.attrs
    mem = plan_memory(plan)
    assert mem.conflicts() == [] and arena_conflicts(mem) == []
    assert mem.location(g.values["act"]).offset != mem.location(g.values["cat"]).offset
    got, want, model = run_both(g, plan, tmp_path)
    assert_close(got, want)
    assert [k["function"] is None for k in model.report["c_kernels"] if k["ops"] == ["Split"]] == [False]
