"""Regression: a kernel with two outputs must not store the first over an input that the
second still reads (found by the random end-to-end test: a reduction group stored ``sqrt``
over ``reducemean``, then read ``reducemean`` back for ``add_2``)."""
import numpy as np

from opfuse.rules import annotate_plan
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.memory import plan_memory
from opfuse.memory.inplace import inplace_candidates
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build
from opfuse.runtime.reference import random_inputs, run


def two_output_group():
    """x -> relu (kernel A); kernel B = {first = sigmoid(y), second = first + relu}; first is
    also read by kernel C (so it lives in the arena), second is a graph output."""
    b = GraphBuilder("two_outputs")
    x, y = b.input("x", (2, 8)), b.input("y", (2, 8))
    r = b.op("Relu", x, name="relu")
    first = b.op("Sigmoid", y, name="first")
    second = b.op("Add", first, r, name="second")
    g = b.build(second, b.op("Neg", first, name="later"))
    by = {n.name: n for n in g.nodes}
    plan = FusionPlan(g, [FusionGroup("a", [by["relu"]]), FusionGroup("b", [by["first"], by["second"]]),
                          FusionGroup("c", [by["later"]])])
    return g, annotate_plan(plan)


def test_input_is_not_overwritten_by_an_output_computed_before_its_last_read():
    g, plan = two_output_group()
    group = plan.groups[1]
    pairs = [(i.name, o.name) for i, o in inplace_candidates(group, g, {})]
    assert ("relu", "first") not in pairs  # 'second' reads relu after 'first' is stored
    memory = plan_memory(plan)
    assert memory.conflicts() == []
    feeds = random_inputs(g, 0)
    got = build(g, plan, memory=memory).run(feeds)
    for name, ref in run(g, feeds).items():
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)


def test_single_output_kernel_still_computes_in_place():
    b = GraphBuilder("one_output")
    x, y = b.input("x", (2, 8)), b.input("y", (2, 8))
    r = b.op("Relu", x, name="relu")
    s = b.op("Add", b.op("Sigmoid", y, name="sig"), r, name="sum")
    g = b.build(b.op("Neg", s, name="neg"))
    by = {n.name: n for n in g.nodes}
    plan = annotate_plan(FusionPlan(g, [FusionGroup("a", [by["relu"]]), FusionGroup("b", [by["sig"], by["sum"]]),
                                        FusionGroup("c", [by["neg"]])]))
    assert [(i.name, o.name) for i, o in inplace_candidates(plan.groups[1], g, {})] == [("relu", "sum")]
