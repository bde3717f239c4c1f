"""The commands for looking at and debugging a fusion, run as a user runs them (subprocess):
compile --save-onnx/--html, report, ab, debug, --json everywhere, --help; and their error paths
(one line on stderr, exit 2)."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest

from opfuse.cli import main

MODEL = "zoo:resnet8"


def opfuse(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opfuse", *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=dict(os.environ))


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


# compile --save-onnx / --html, report ---------------------------------------------------------

def test_compile_save_onnx_runs_in_onnxruntime_like_the_original(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path = tmp_path / "fused.onnx"
    r = opfuse("compile", MODEL, "--save-onnx", str(path))
    assert r.returncode == 0, r.stderr
    assert f"wrote {path}" in r.stdout
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert any(f.name.startswith("epilogue_Conv_Relu_") for f in model.functions)
    from opfuse.api import load, onnx_proto
    from opfuse.runtime.reference import random_inputs
    feeds = random_inputs(load(MODEL), 0)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    got = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    want = ort.InferenceSession(onnx_proto(MODEL).SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_compile_html_and_report_write_one_self_contained_file(tmp_path):
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    r = opfuse("compile", MODEL, "--html", str(a), "--layout", "svg")
    assert r.returncode == 0 and f"wrote {a}" in r.stdout, r.stderr
    r = opfuse("report", MODEL, "-o", str(b), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"wrote": str(b), "model": "resnet8", "groups": 13}
    for page in (a, b):
        html = page.read_text()
        assert html.startswith("<!DOCTYPE html>") and '<svg class="graph"' in html and 'id="groups"' in html
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?https?:|@import""", html)


def test_report_measure_adds_measured_before_and_after(tmp_path):
    page = tmp_path / "m.html"
    r = opfuse("report", MODEL, "-o", str(page), "--measure", "--repeat", "2")
    assert r.returncode == 0, r.stderr
    html = page.read_text()
    assert "measured before µs" in html and "measured after µs" in html and "measured latency" in html


@pytest.mark.parametrize("argv, needle", [
    (["compile", MODEL, "--save-onnx", "/nonexistent-dir/f.onnx"], "/nonexistent-dir"),
    (["compile", MODEL, "--html", "/nonexistent-dir/r.html"], "/nonexistent-dir"),
    (["report", "missing.onnx", "-o", "r.html"], "missing.onnx"),
    (["report", MODEL, "-o", "r.html", "--layout", "neato"], "--layout"),
    (["report", MODEL], "-o/--output"),
])
def test_compile_and_report_bad_input_is_one_line(tmp_path, argv, needle):
    assert needle in one_line_error(opfuse(*argv, cwd=tmp_path))


# ab -------------------------------------------------------------------------------------------

def test_ab_fused_against_unfused(tmp_path):
    r = opfuse("ab", MODEL, "--a", "--no-fuse", "--b", "", "--repeat", "12", "--warmup", "1")
    assert r.returncode == 0, r.stderr
    assert "median ms" in r.stdout and "p99 ms" in r.stdout and "verdict: " in r.stdout
    assert "agree" in r.stdout
    r = opfuse("ab", MODEL, "--a", "--no-fuse", "--b", "--planner greedy --target a100", "--repeat", "6", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["a"]["kernels"] == 30 and res["a"]["fuse"] is False and res["b"]["target"] == "a100"
    assert len(res["a"]["times_ms"]) == len(res["b"]["times_ms"]) == 6
    assert res["a"]["median_ms"] <= res["a"]["p90_ms"] <= res["a"]["p99_ms"]
    assert res["outputs"]["agree"] and 0 <= res["verdict"]["p_value"] <= 1


@pytest.mark.parametrize("argv, needle", [
    (["ab", MODEL, "--a", "--bogus", "--b", ""], "--a '--bogus'"),
    (["ab", MODEL, "--a", "", "--b", "--planner nope"], "--b '--planner nope'"),
    (["ab", MODEL, "--a", "'unclosed", "--b", ""], "--a"),
    (["ab", MODEL, "--a", "", "--b", "", "--repeat", "1"], "--repeat"),
    (["ab", MODEL, "--a", ""], "--b"),
])
def test_ab_bad_input_is_one_line(argv, needle):
    assert needle in one_line_error(opfuse(*argv))


def test_ab_statistics():
    from opfuse.ab import mann_whitney, verdict
    rng = np.random.default_rng(0)
    slow, fast = 1.0 + 0.05 * rng.random(60), 0.8 + 0.05 * rng.random(60)
    _, p = mann_whitney(slow, fast)
    assert p < 1e-10
    v = verdict(slow, fast)
    assert v["winner"] == "b" and v["ratio_ci95"][1] < 1 and "B is faster" in v["text"]
    same = verdict(slow, rng.permutation(slow))
    assert same["winner"] is None and same["p_value"] > 0.5
    u, p = mann_whitney(np.ones(5), np.ones(5))  # all ties: no evidence either way
    assert p == 1.0


# debug ----------------------------------------------------------------------------------------

def test_debug_with_inputs_file_and_json(tmp_path):
    from opfuse.api import load
    from opfuse.runtime.reference import random_inputs
    x = tmp_path / "x.npz"
    np.savez(x, **random_inputs(load(MODEL), 3))
    r = opfuse("debug", MODEL, "--inputs", str(x), "--bisect", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    # the plan of this host's profile: 7 on an AVX-512 host (the last Relu fuses into the last convolution, not
    # into the AveragePool, scalar there at 16x), 8 with AVX2 (the scalar Relu hides under the pool's memory time)
    from opfuse.compiler import CompileOptions, plan_model
    plan = plan_model(MODEL, CompileOptions()).plan
    assert res["fused_groups"] == sum(1 for g in plan.groups if len(g.nodes) > 1) in (7, 8)
    assert res["outputs_agree"] and "bisect" not in res


@pytest.mark.parametrize("argv, needle", [
    (["debug", MODEL, "--inputs", "nothere.npz"], "nothere.npz"),
    (["debug", MODEL, "--target", "a100"], "--target host"),
    (["debug", "missing.onnx", "--bisect"], "missing.onnx"),
])
def test_debug_bad_input_is_one_line(tmp_path, argv, needle):
    assert needle in one_line_error(opfuse(*argv, cwd=tmp_path))


def test_run_compare_mismatch_exits_1(monkeypatch, capsys):
    """A C build whose outputs are off (here every Relu's scalar rule and every output shifted by 0.25: the
    vector forms and the micro-kernels' register epilogues compute resnet8's Relus without the scalar rule)."""
    from opfuse.codegen import rules as c_rules
    from opfuse.runtime.native import CompiledModel
    relu = c_rules.RULES["Relu"]
    monkeypatch.setitem(c_rules.RULES, "Relu", lambda ev, node, k, idx: f"({relu(ev, node, k, idx)} + 0.25f)")
    run = CompiledModel.run
    monkeypatch.setattr(CompiledModel, "run", lambda self, feeds, **kw: {
        k: v + np.float32(0.25) for k, v in run(self, feeds, **kw).items()})
    code = main(["run", MODEL, "--backend", "c", "--compare", "reference", "--json"])
    res = json.loads(capsys.readouterr()[0])
    assert code == 1 and not res["compare"]["outputs"]["output"]["ok"]


# --json, --quiet, --help ----------------------------------------------------------------------

@pytest.mark.parametrize("argv, key", [
    (["info", MODEL, "--json"], "flops"),
    (["compile", MODEL, "--json"], "groups"),
    (["explain", MODEL, "--json"], "pairs"),
    (["profile", "--target", "cortex-m7", "--json"], "profile"),
    (["run", MODEL, "--json", "--quiet"], "outputs"),
])
def test_json_is_the_only_stdout(argv, key):
    r = opfuse(*argv)
    assert r.returncode == 0, r.stderr
    assert key in json.loads(r.stdout)


def test_help_lists_every_command_with_an_example_and_the_exit_codes():
    r = opfuse("--help")
    assert r.returncode == 0
    from opfuse.cli import build_parser
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    examples = r.stdout.split("examples:")[1].split("exit codes:")[0]
    for name in commands:
        if name == "fuzz" and "opfuse fuzz" not in examples:
            continue  # added on another branch; its example comes with it
        assert f"opfuse {name}" in examples, name
    assert "0  success" in r.stdout and "1  a result is wrong" in r.stdout and "2  bad input" in r.stdout
