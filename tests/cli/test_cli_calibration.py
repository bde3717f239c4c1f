"""Calibration is explicit: compile never times anything, generated C is byte-identical from run to
run, and saved calibrations and corrections act only as documented, named in compile's output."""
import json
import os
import subprocess
import sys

import pytest

from opfuse.cli import main
from opfuse.compiler import CompileOptions, plan_model
from opfuse.cost.correction import MIN_CORRECTION_SAMPLES, Sample, fit_corrections, save_corrections
from opfuse.targets import calibrate as calibrate_mod
from opfuse.targets import calibrate_host, get_profile, nominal_host_profile, save_profile
from opfuse.targets.calibrate import CACHE_FILE
from opfuse.targets.microbench import Measurement


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private, empty cache; any timing calibration fails the test."""
    root = tmp_path / "cache"
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(root))
    monkeypatch.setattr(calibrate_mod, "default_measure", lambda *a: pytest.fail("a timing calibration ran"))
    return root


def groups_of(comp) -> list[tuple[str, ...]]:
    return [tuple(n.name for n in g.nodes) for g in comp.plan.groups]


def compile_out(capsys, *argv) -> str:
    code = main(["compile", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def emit_c_in_fresh_process(model: str, tmp_path, tag: str) -> tuple[bytes, bytes, str]:
    cache, out = tmp_path / f"cache_{tag}", tmp_path / f"c_{tag}"
    env = dict(os.environ, OPFUSE_CACHE_DIR=str(cache), PYTHONHASHSEED=tag)
    r = subprocess.run([sys.executable, "-m", "opfuse", "compile", model, "--emit-c", str(out)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert not (cache / CACHE_FILE).exists()  # no calibration ran, none was saved
    return (out / "model.c").read_bytes(), (out / "weights.bin").read_bytes(), r.stdout


@pytest.mark.parametrize("model", ["zoo:resnet8", "zoo:ds_cnn"])
def test_generated_c_is_byte_identical_across_fresh_processes_with_empty_caches(model, tmp_path):
    c1, w1, out1 = emit_c_in_fresh_process(model, tmp_path, "1")
    c2, w2, out2 = emit_c_in_fresh_process(model, tmp_path, "2")
    assert c1 == c2 and w1 == w2
    assert "host profile: nominal constants" in out1 and "host profile: nominal constants" in out2


def test_resnet8_plan_depends_on_the_host_numbers(tmp_path, cache):
    """Why implicit timing made the C differ: two host numbers 1 GB/s apart (this machine's
    bandwidth varies by more from run to run) give ResNet-8 two different plans (at 15 GB/s the
    last Relu runs in the pooling kernel, memory-bound enough to hide its scalar cost; at 16 in
    the convolution's epilogue)."""
    def plan_with(profile):
        path = save_profile(profile, tmp_path / "h.json")
        return groups_of(plan_model("zoo:resnet8", CompileOptions(target=str(path))))

    # the development machine's structure (AVX-512, 16 MiB of L3 per core), whatever runs the test
    dev = nominal_host_profile().with_overrides(onchip_bytes=16 << 20, register_bytes=2048, vector_bytes=64,
                                                cache_line_bytes=64)
    assert plan_with(dev.with_overrides(mem_bandwidth=15e9)) != plan_with(dev.with_overrides(mem_bandwidth=16e9))
    assert plan_with(nominal_host_profile()) == groups_of(plan_model("zoo:resnet8"))  # what compile plans with


def test_compile_names_the_profile_and_the_gap_and_nothing_else_without_saved_files(cache, capsys):
    out = compile_out(capsys, "zoo:resnet8")
    assert "planner exact (optimal, gap 0.00%): predicted latency" in out
    assert "host profile: nominal constants (no saved calibration;" in out
    assert "cost model corrections" not in out
    assert not cache.exists() or not any(cache.iterdir())


def test_a_saved_calibration_is_used_by_later_compiles_and_named(cache, capsys, monkeypatch):
    def planned():
        r = plan_model("zoo:resnet8").report
        return r["predicted_latency_s"], [g["ops"] for g in r["groups"]], r["planner"]["cost_model"]["profile"]

    nominal = planned()
    assert nominal[2]["source"] == "nominal" and not nominal[2]["calibrated"]
    fake = Measurement(bandwidth_Bps=29e9, peak_flops={"float32": 60e9, "float64": 30e9}, call_overhead_s=2e-9,
                       dram_latency_s=1.7e-7, method="fake benchmark")
    calibrate_host(force=True, measure=lambda: fake)  # what `opfuse profile --target host --calibrate` does
    calibrated = planned()
    assert calibrated[0] != nominal[0] and calibrated[2]["calibrated"] and calibrated[2]["source"] == "fake benchmark"
    assert planned() == calibrated  # and stays so: nothing is re-measured
    out = compile_out(capsys, "zoo:resnet8")
    assert "host profile: saved calibration of 20" in out and "fake benchmark" in out
    (cache / CACHE_FILE).unlink()
    assert planned() == nominal


def host_corrections():
    """Usable corrections that change resnet8's predictions (fitted against the nominal profile)."""
    n = MIN_CORRECTION_SAMPLES
    samples = [Sample("OUT_ELEMWISE_FUSABLE", 1e-5, 2e-5)] * n + [Sample("REDUCTION", 1e-6, 1.4e-6)] * n
    samples += [Sample("ELEMWISE", 1e-7, 2.3e-6)] * 4  # the case: too few samples, alpha +22
    return fit_corrections("host", samples, profile=get_profile("host"))


def test_saved_corrections_apply_only_when_asked_and_are_shown(cache, capsys, tmp_path):
    from opfuse.api import load
    from opfuse.planner import plan_fusion as _plan_fusion
    from opfuse.rules import RuleLegality

    def plan_fusion(*args, **kwargs):
        return _plan_fusion(*args, legality=RuleLegality(), **kwargs)
    g = load("zoo:resnet8")
    before = plan_fusion(g, get_profile("host")).cost.total_latency_s
    plain = plan_model("zoo:resnet8", CompileOptions(corrections=False)).report
    save_corrections(host_corrections())
    assert plan_fusion(g, get_profile("host")).cost.total_latency_s == before  # the API default: none
    assert plan_fusion(g, get_profile("host"), corrections=True).cost.total_latency_s > before

    rj = tmp_path / "r.json"
    out = compile_out(capsys, "zoo:resnet8", "--report-json", str(rj))
    line = [t for t in out.splitlines() if t.startswith("cost model corrections")]
    assert len(line) == 1
    assert line[0].startswith("cost model corrections (host, fitted 20") and "from 20 samples" in line[0]
    assert "out_elemwise_fusable x2.00" in line[0] and "reduction x1.40" in line[0]
    assert "elemwise (4 samples < 8)" in line[0] and line[0].endswith("--no-corrections to ignore")
    corr = json.loads(rj.read_text())["planner"]["cost_model"]["corrections"]
    assert corr["requested"] and corr["applied"]["OUT_ELEMWISE_FUSABLE"] == pytest.approx(1.0)
    assert corr["dropped"] == {"ELEMWISE": "4 samples < 8"}
    assert corr["corrected_groups"]["OUT_ELEMWISE_FUSABLE"]["groups"] > 0

    out = compile_out(capsys, "zoo:resnet8", "--no-corrections", "--report-json", str(rj))
    assert "cost model corrections: off (--no-corrections)" in out
    rep = json.loads(rj.read_text())
    assert rep["planner"]["cost_model"]["corrections"]["requested"] is False
    assert rep["predicted_latency_s"] == plain["predicted_latency_s"]
    assert [g["ops"] for g in rep["groups"]] == [g["ops"] for g in plain["groups"]]


def test_corrections_fitted_for_another_profile_are_not_applied_after_calibrating(cache, capsys):
    save_corrections(host_corrections())  # fitted against the nominal profile
    calibrate_host(force=True, measure=lambda: Measurement(25e9, {"float32": 55e9, "float64": 28e9}, 2e-9, 1.7e-7,
                                                           "fake"))
    out = compile_out(capsys, "zoo:resnet8")
    line = [t for t in out.splitlines() if t.startswith("cost model corrections")][0]
    assert "none applied" in line and "another profile" in line


def test_run_on_the_c_backend_names_the_profile_and_honours_no_corrections(cache, capsys):
    save_corrections(host_corrections())
    assert main(["run", "zoo:resnet8", "--backend", "c"]) == 0
    out = capsys.readouterr().out
    assert "host profile: nominal constants" in out and "out_elemwise_fusable x2.00" in out
    assert main(["run", "zoo:resnet8", "--backend", "c", "--no-corrections"]) == 0
    assert "cost model corrections: off (--no-corrections)" in capsys.readouterr().out
