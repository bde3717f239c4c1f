"""Issue 9's checks: the rules decide, reports describe the plan that runs, aliasing is priced."""
import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.passes import known_names


def test_bert_groups_name_their_rule_and_credit_every_original_op():
    comp = plan_model("zoo:bert_layer", CompileOptions())
    r = comp.report
    assert r["kernels_before"] == 49
    assert sum(g["kernels_before"] for g in r["groups"]) == 49
    _, rules = known_names()
    for g in r["groups"]:  # fused groups by a fusion rule, LayerNorms by the rewrite that recognised them
        assert g["rule"] in rules, g
    assert "eta" not in r["planner"]  # one eta per report


@pytest.mark.parametrize("planner", ["auto", "rules"])
def test_yolo_block_aliases_its_concat(planner):
    r = plan_model("zoo:yolo_block", CompileOptions(planner=planner)).report
    assert any(g["kind"] == "concat" and g["zero_copy"] == "concat" for g in r["groups"])


def test_yolo_block_planner_arena_no_larger_than_the_rules():
    auto = plan_model("zoo:yolo_block", CompileOptions()).report
    rules = plan_model("zoo:yolo_block", CompileOptions(planner="rules")).report
    assert auto["arena_bytes"] <= rules["arena_bytes"] and auto["kernels_after"] <= rules["kernels_after"]


def inception_block():
    """Three Conv+Relu branches -> Concat -> Conv."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("inception")
    x = b.input("x", (1, 8, 16, 16))
    branches = []
    for i in range(3):
        w = b.const(f"w{i}", rng.standard_normal((8, 8, 1, 1)).astype(np.float32))
        branches.append(b.op("Relu", b.op("Conv", x, w, name=f"conv{i}"), name=f"relu{i}"))
    cat = b.op("Concat", *branches, axis=1, name="concat")
    w = b.const("wout", rng.standard_normal((8, 24, 1, 1)).astype(np.float32))
    return b.build(b.op("Conv", cat, w, name="out"))


def test_inception_block_default_planner_matches_the_rules():
    auto = plan_model(inception_block(), CompileOptions()).report
    rules = plan_model(inception_block(), CompileOptions(planner="rules")).report
    assert auto["kernels_after"] == rules["kernels_after"] == 4
    assert auto["arena_bytes"] <= rules["arena_bytes"]
    assert any(g["zero_copy"] == "concat" for g in auto["groups"])


def test_decision_log_describes_the_chosen_plan():
    comp = plan_model("zoo:bert_layer", CompileOptions())
    group_of = {n.name: g.name for g in comp.plan.groups for n in g.nodes}
    for d in comp.decisions:
        if d.pass_name == "fuse" and d.verdict == "fused":
            assert len({group_of[x] for x in d.nodes if x in group_of}) == 1, d
