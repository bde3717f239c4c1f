"""``opfuse debug --bisect`` names the fusion that breaks an output: a bug is planted in the C of
one op, only inside one fused group, and bisection must find exactly that group."""
import json

import pytest

from opfuse.bisect import bisect, check, split_plan
from opfuse.cli import main
from opfuse.codegen import rules as c_rules
from opfuse.codegen import simdchain
from opfuse.compiler import plan_model
from opfuse.runtime.reference import random_inputs

MODEL = "zoo:resnet8"


def _fused_groups(comp):
    return [g for g in comp.plan.groups if len(g.nodes) > 1]


@pytest.fixture
def planted(monkeypatch):
    """Relu's C is wrong (``max(x, 0) + 0.5``, scalar and vector) inside one fused Conv+Add+Relu group only."""
    comp = plan_model(MODEL)
    target = next(g for g in _fused_groups(comp) if g.op_types == ["Conv", "Add", "Relu"])
    relu = c_rules.RULES["Relu"]

    def broken(ev, node, k, idx):
        expr = relu(ev, node, k, idx)
        group = ev.kc.group
        return f"(({expr}) + 0.5f)" if group.name == target.name and len(group.nodes) > 1 else expr

    vrelu = simdchain.VECTOR_OPS["Relu"]

    def vbroken(ve, node):  # the same bug in the Relu of vector epilogues (``epilogue.VectorEpilogue``)
        expr = vrelu(ve, node)
        group = ve.kc.group
        return (ve.isa.op("add_ps", expr, ve.scalar(0.5)) if group.name == target.name and len(group.nodes) > 1
                else expr)

    monkeypatch.setitem(c_rules.RULES, "Relu", broken)
    monkeypatch.setitem(simdchain.VECTOR_OPS, "Relu", vbroken)
    return target


def test_split_plan_unfuses_all_but_the_kept_groups():
    comp = plan_model(MODEL)
    keep = _fused_groups(comp)[0].name
    plan = split_plan(comp.plan, {keep})
    assert [g.name for g in plan.groups if len(g.nodes) > 1] == [keep]
    assert len(plan.groups) == len(comp.plan.groups) + sum(len(g.nodes) - 1 for g in _fused_groups(comp)[1:])


def test_bisect_names_the_broken_fusion_and_the_first_diverging_tensor(planted):
    comp = plan_model(MODEL)
    feeds = random_inputs(comp.original, 0)
    assert check(comp, feeds), "the planted bug breaks the fused build"
    res = bisect(comp, feeds)
    assert [g.name for g in res.culprits] == [planted.name]
    assert not res.not_fusion and res.builds <= 2 * len(_fused_groups(comp))
    assert res.first is not None and res.first.group == planted.name
    assert res.first.tensor in {v.name for v in planted.outputs(comp.graph)}
    assert res.first.max_abs_error > res.first.tolerance


def test_debug_cli_bisect_prints_the_culprit(planted, capsys):
    code = main(["debug", MODEL, "--bisect"])
    out, err = capsys.readouterr()
    assert code == 1
    assert f"group '{planted.name}' (rule epilogue): Conv+Add+Relu" in out
    assert "first diverging tensor:" in out and planted.name in out.split("first diverging tensor:")[1]
    code = main(["debug", MODEL, "--bisect", "--json"])
    result = json.loads(capsys.readouterr()[0])
    assert code == 1 and not result["outputs_agree"]
    assert [c["group"] for c in result["bisect"]["culprits"]] == [planted.name]
    assert result["bisect"]["first_divergence"]["group"] == planted.name


def test_debug_cli_without_a_bug_says_the_outputs_match(capsys):
    code = main(["debug", MODEL, "--bisect"])
    out, _ = capsys.readouterr()
    assert code == 0 and "fused outputs match the reference executor" in out


def test_debug_run_checks_every_group_and_names_the_broken_one(planted, tmp_path, capsys, monkeypatch):
    """``run --debug`` (or OPFUSE_DEBUG=1): IR after every pass, each group checked as the model runs."""
    monkeypatch.setenv("OPFUSE_DEBUG", "1")
    code = main(["run", MODEL, "--backend", "c", "--json", "--dump-ir", str(tmp_path / "ir")])
    res = json.loads(capsys.readouterr()[0])
    bad = [row["group"] for row in res["debug"] if row["mismatches"]]
    assert code == 1 and bad[0] == planted.name  # the first kernel to differ is the planted one
    assert any(p.name.endswith("_fuse_after.ir") for p in (tmp_path / "ir").iterdir())


def test_debug_run_is_clean_on_a_correct_build(tmp_path, capsys):
    code = main(["run", MODEL, "--backend", "c", "--debug", "--json", "--dump-ir", str(tmp_path / "ir")])
    res = json.loads(capsys.readouterr()[0])
    assert code == 0 and res["debug"] and not any(row["mismatches"] for row in res["debug"])
