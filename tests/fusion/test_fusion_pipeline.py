"""``fuse`` under a PassContext: instruments, IR dumps, the decision log, disabled names."""
import json
import os

import pytest

from opfuse import zoo
from opfuse.passes import fuse
from opfuse.passes import OptionError, PassTiming, make_context
from opfuse.passes.pipeline import fusion_passes

PASSES = ["verify", "recognize_integer", "simplify", "recognize", "fold_linear", "merge_matmuls",
          "lower_conv_transpose", "float32_compute",
          "cleanup", "verify_rewrites", "fuse"]


def test_instruments_see_every_pass_and_decision(tmp_path):
    log = tmp_path / "decisions.json"
    ctx = make_context(dump_ir=str(tmp_path / "ir"), log_decisions=str(log), passes=fusion_passes())
    g0 = zoo.load("yolo_block")
    g, plan, decisions = fuse(g0, ctx)
    assert ctx.plan is plan
    assert [row[1] for row in ctx.instrument(PassTiming).rows] == PASSES
    dumps = sorted(os.listdir(tmp_path / "ir"))
    assert "03_recognize_after.ir" in dumps and "10_fuse_plan.txt" in dumps
    logged = json.loads(log.read_text())
    entries = logged["decisions"] if isinstance(logged, dict) else logged
    assert len(entries) == len(decisions) > 0
    assert ctx.rule_stats["recognize_silu"].applied == 6


def test_disable_passes_and_rules_by_name():
    ctx = make_context(disable=["fold_linear", "epilogue"], passes=fusion_passes())
    g0 = zoo.load("resnet8")
    g, plan, decisions = fuse(g0, ctx)
    assert sum(n.op_type == "BatchNormalization" for n in g.nodes) == 7
    assert not any(gr.kind == "conv_epilogue" for gr in plan.groups)
    assert any(d.rule == "epilogue" and d.label == "disabled by user" for d in decisions)


def test_disabling_the_fuse_pass_gives_the_unfused_plan():
    ctx = make_context(disable=["fuse"], passes=fusion_passes())
    g, plan, _ = fuse(zoo.load("resnet8"), ctx)
    assert plan.num_kernels == len(g.nodes)


def test_unknown_names_are_rejected():
    with pytest.raises(OptionError, match="unknown rule or pass 'nope'"):
        make_context(disable=["nope"], passes=fusion_passes())
