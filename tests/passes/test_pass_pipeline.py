"""Pass infrastructure: the pipeline, the context, instruments (timing, IR dumps, statistics,
decision log), disabling passes and rules, group caps, idempotence."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from opfuse import zoo
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.passes import (DumpIR, FunctionPass, OptionError, PassContext, PassInstrument, PassTiming,
                           RuleStatistics, VerifyPass, fuse, fusion_passes, known_names, make_context, run_passes)
from opfuse.rules import fusion_rules, recognition_rules
from opfuse.runtime.reference import random_inputs, run


def compile_pipeline(graph, ctx):
    g, plan, _ = fuse(graph, ctx)
    return g, plan


def default_passes():
    return fusion_passes()


PASSES = ["verify", "recognize_integer", "simplify", "recognize", "fold_linear", "merge_matmuls",
          "lower_conv_transpose", "float32_compute", "cleanup", "verify_rewrites", "fuse"]


@pytest.fixture(scope="module")
def bert():
    return zoo.load("bert_layer")


@pytest.fixture(scope="module")
def mobilenet():
    return zoo.load("mobilenet_v1_025_96")


def test_compile_pipeline_returns_graph_and_plan_and_leaves_input_alone(bert):
    before = str(bert)
    ctx = make_context()
    graph, plan = compile_pipeline(bert, ctx)
    assert str(bert) == before
    assert graph is not bert and plan.graph is graph and ctx.plan is plan
    plan.verify()
    ops = {n.op_type for n in graph.nodes}
    assert {"LayerNormalization", "Gelu"} <= ops and "Erf" not in ops
    assert plan.num_kernels < len(graph.nodes) < len(bert.nodes)
    kinds = {g.kind for g in plan.groups}
    assert {"attention", "gemm_epilogue"} <= kinds


def test_pipeline_preserves_numerics(mobilenet):
    graph, plan = compile_pipeline(mobilenet, make_context())
    feeds = random_inputs(mobilenet, 1)
    want, got = run(mobilenet, feeds), run(graph, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


def test_ir_dumps_are_numbered_per_pass(tmp_path, bert):
    d = tmp_path / "ir"
    ctx = make_context(dump_ir=str(d))
    compile_pipeline(bert, ctx)
    files = sorted(os.listdir(d))
    names = known_names()[0]
    want = [f"{i:02d}_{n}_{w}.ir" for i, n in enumerate(names) for w in ("after", "before")]
    assert files == sorted(want + [f"{len(names) - 1:02d}_fuse_plan.txt"])
    before = (d / "03_recognize_before.ir").read_text()
    after = (d / "03_recognize_after.ir").read_text()
    assert "= Erf(" in before and "= Erf(" not in after and "= Gelu[approximate='none']" in after
    plan = (d / "10_fuse_plan.txt").read_text()
    assert plan.startswith("plan: ") and "attention" in plan
    assert ctx.instrument(DumpIR).files == [str(d / f"{i:02d}_{n}_{w}.ir") for i, n in enumerate(names)
                                            for w in ("before", "after")] + [str(d / "10_fuse_plan.txt")]


def test_timing_instrument(bert):
    ctx = make_context()
    compile_pipeline(bert, ctx)
    t = ctx.instrument(PassTiming)
    assert [name for _, name, _, _ in t.rows] == PASSES
    assert {name: modified for _, name, _, modified in t.rows}["recognize"]
    assert not {name: modified for _, name, _, modified in t.rows}["fuse"]
    assert all(s >= 0 for _, _, s, _ in t.rows) and t.total > 0
    report = t.report()
    assert "recognize" in report and "total" in report


def test_rule_statistics(bert):
    ctx = make_context()
    compile_pipeline(bert, ctx)
    stats = ctx.instrument(RuleStatistics).stats
    assert stats["recognize_layernorm"]["matches"] == 2 and stats["recognize_layernorm"]["applied"] == 2
    assert stats["recognize_gelu_erf"]["applied"] == 1 and stats["attention"]["applied"] == 1
    for name, s in stats.items():
        assert s["attempts"] >= 0 and s["matches"] == s["applied"] + s["refused"], name
        assert s["seconds"] >= 0
    assert "attention" in ctx.instrument(RuleStatistics).report()


def test_decision_log_json(tmp_path, bert):
    path = tmp_path / "decisions.json"
    ctx = make_context(log_decisions=str(path))
    compile_pipeline(bert, ctx)
    log = json.loads(path.read_text())
    assert len(log["decisions"]) == len(ctx.decisions) > 0
    d0 = log["decisions"][0]
    assert set(d0) == {"pass", "rule", "verdict", "kind", "reason", "nodes", "score", "group"}
    assert log["summary"]["recognize_layernorm"] == {"rewritten": 2}
    assert log["summary"]["attention"] == {"fused": 1}
    refused = [d for d in log["decisions"] if d["verdict"] == "refused"]
    assert refused and all(d["kind"] and d["reason"] for d in refused)
    assert {"recognize", "fuse"} <= {d["pass"] for d in log["decisions"]}


def test_disabling_a_rule(mobilenet):
    ctx = make_context(disable=["epilogue"])
    graph, plan = compile_pipeline(mobilenet, ctx)
    assert not any(g.kind == "conv_epilogue" for g in plan.groups)
    refused = [d for d in ctx.decisions if d.rule == "epilogue"]
    off = [d for d in refused if d.kind == "disabled"]    # legal sites, refused for being disabled
    assert {d.nodes[0] for d in off} >= {n.name for n in graph.nodes if n.op_type == "Conv"}


def test_disabling_a_pass(bert):
    ctx = make_context(disable=["recognize"])
    graph, plan = compile_pipeline(bert, ctx)
    assert "Erf" in {n.op_type for n in graph.nodes}
    assert [r[1] for r in ctx.instrument(PassTiming).rows] == [n for n in PASSES if n != "recognize"]
    ctx = make_context(disable=["fuse"])
    graph, plan = compile_pipeline(bert, ctx)
    assert plan.num_kernels == len(graph.nodes)    # no fusion pass: the unfused plan


def test_unknown_names_are_user_errors():
    with pytest.raises(OptionError, match="unknown rule or pass 'conv_bn_relu'.*epilogue"):
        make_context(disable=["conv_bn_relu"])
    with pytest.raises(OptionError, match="at least 1"):
        make_context(max_group_ops=0)
    assert issubclass(OptionError, OpfuseError)


def test_unwritable_dump_directory(tmp_path, bert):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OptionError, match="cannot create IR dump directory"):
        compile_pipeline(bert, make_context(dump_ir=str(blocker / "ir")))


def test_group_size_cap(bert):
    ctx = make_context(max_group_ops=2)
    graph, plan = compile_pipeline(bert, ctx)
    assert max(len(g.nodes) for g in plan.groups) <= 2
    assert any(d.kind == "resource" for d in ctx.decisions)


def test_pipeline_is_idempotent(bert):
    g1, p1 = compile_pipeline(bert, make_context())
    ctx2 = make_context()
    g2, p2 = compile_pipeline(g1, ctx2)
    assert str(g2) == str(g1)
    assert [(g.name, [n.name for n in g.nodes]) for g in p2.groups] == \
        [(g.name, [n.name for n in g.nodes]) for g in p1.groups]
    assert dict((r[1], r[3]) for r in ctx2.instrument(PassTiming).rows)["recognize"] is False


def test_run_passes_calls_instruments_in_order():
    calls = []

    class Recorder(PassInstrument):
        def enter(self, ctx):
            calls.append("enter")

        def exit(self, ctx):
            calls.append("exit")

        def before_pass(self, ctx, p, graph, index):
            calls.append(f"before {index} {p.name}")

        def after_pass(self, ctx, p, graph, index, modified, seconds):
            calls.append(f"after {index} {p.name} {modified}")

        def skipped_pass(self, ctx, p, index):
            calls.append(f"skip {index} {p.name}")

    b = GraphBuilder("t")
    x = b.input("x", (2, 2))
    g = b.build(b.op("Relu", x))
    touch = FunctionPass("touch", lambda graph, ctx: (graph, True))
    ctx = PassContext(disabled_passes={"off"}, instruments=[Recorder()])
    run_passes(g, [VerifyPass(), FunctionPass("off", lambda graph, ctx: (graph, True)), touch], ctx)
    assert calls == ["enter", "before 0 verify", "after 0 verify False", "skip 1 off", "before 2 touch",
                     "after 2 touch True", "exit"]


def test_instruments_exit_even_when_a_pass_fails(tmp_path):
    path = tmp_path / "log.json"
    ctx = make_context(log_decisions=str(path))

    def boom(graph, ctx):
        raise OpfuseError("broken model")

    b = GraphBuilder("t")
    g = b.build(b.op("Relu", b.input("x", (2, 2))))
    with pytest.raises(OpfuseError, match="broken model"):
        run_passes(g, [FunctionPass("boom", boom)], ctx)
    assert json.loads(path.read_text()) == {"decisions": [], "summary": {}}




def test_known_names_cover_the_default_pipeline():
    passes, rules = known_names()
    assert passes == [p.name for p in default_passes()]
    assert passes == PASSES
    assert {r.name for r in recognition_rules()} | {r.name for r in fusion_rules()} <= set(rules)
    assert {"attention", "normalization_prologue", "epilogue", "concat_alias", "elementwise_chain", "injective",
            "horizontal", "dequantize_prologue"} == {r.name for r in fusion_rules()}
