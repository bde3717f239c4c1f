"""The compile pipeline hands the user's fusion limits to every stage that checks legality
(regression: the cost-model plan was re-checked with the default limits and refused)."""
import numpy as np

import opfuse
from opfuse.rules.options import MAX_OPS_PER_GROUP
from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import random_inputs, run

CHAIN = MAX_OPS_PER_GROUP + 8  # longer than the default limit


def chain():
    b = GraphBuilder("chain")
    v = b.input("x", (4, 16))
    for i in range(CHAIN):
        v = b.op("Relu" if i % 2 else "Neg", v)
    return b.build(v)


def test_raised_group_limit_reaches_the_cost_model_plan():
    g = chain()
    feeds = random_inputs(g, 0)
    for planner in ("rules", "auto"):
        model = opfuse.compile(g, target="host", planner=planner, max_group_ops=CHAIN)
        sizes = [len(grp.nodes) for grp in model.compilation.plan.groups]
        assert max(sizes) > MAX_OPS_PER_GROUP, (planner, sizes)
        got = model.run(feeds)
        for name, ref in run(g, feeds).items():
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)


def test_default_limit_is_kept():
    model = opfuse.compile(chain(), target="host")
    assert max(len(grp.nodes) for grp in model.compilation.plan.groups) <= MAX_OPS_PER_GROUP
