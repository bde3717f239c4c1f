"""The benchmark scripts run end to end on tiny settings and write their JSON (they must not rot)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from opfuse.planner.exact import MIP_REL_GAP

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(script: str, *args: str) -> str:
    r = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_bench_codegen_smoke(tmp_path):
    out = tmp_path / "codegen.json"
    text = _run("bench_codegen.py", "resnet8", "--repeat", "3", "--warmup", "1", "--no-reference",
                "--out", str(out))
    row = json.loads(out.read_text())["models"][0]
    assert row["model"] == "resnet8"
    assert row["fused"]["kernels"] < row["unfused"]["kernels"]
    assert row["fused"]["max_abs_error"] < 1e-4 and row["unfused"]["max_abs_error"] < 1e-4
    assert "resnet8" in text


def test_bench_matcher_smoke(tmp_path):
    out = tmp_path / "matcher.json"
    _run("bench_matcher.py", "--sizes", "200", "1000", "--repeat", "1", "--output", str(out))
    rows = json.loads(out.read_text())["rows"]
    assert [r["nodes"] for r in rows][0] >= 200 and all(r["matches"] > 0 for r in rows)


@pytest.mark.slow
def test_bench_planner_smoke(tmp_path):
    out = tmp_path / "planner.json"
    _run("bench_planner.py", "--targets", "cortex-m7", "--sizes", "200", "--models", "resnet8",
         "--rule-legality-sizes", "200", "--out", str(out))
    data = json.loads(out.read_text())
    (row,) = data["models"]
    assert row["model"] == "resnet8" and row["target"] == "cortex-m7"
    # exact is optimal up to the solver's relative gap (MIP_REL_GAP); latencies are sums of floats
    slack = 1 + MIP_REL_GAP
    assert row["exact_latency_s"] <= row["greedy_latency_s"] * slack <= row["unfused_latency_s"] * slack
    assert -MIP_REL_GAP <= row["gap"] < data["gap_goal"]
    assert all(r["kernels"] < r["nodes"] for r in data["rule_legality"])


def test_bench_kernels_smoke(tmp_path):
    out = tmp_path / "kernels.json"
    text = _run("bench_kernels.py", "--only", "r18.ds", "dw 3x3 512", "--repeat", "2", "--warmup", "1",
                "--out", str(out))
    rows = json.loads(out.read_text())["shapes"]
    assert [r["kind"] for r in rows] == ["conv", "depthwise"]
    assert all(r["kernels"] == 1 and r["max_abs_error"] < 1e-4 and r["fraction"] > 0 for r in rows)
    assert rows[1]["warm_gbs"] > 0 and "warm_gbs" not in rows[0]
    assert rows[1]["same_copy_gbs"] > 0 and rows[1]["same_copy_fraction"] > 0 and "same_copy_gbs" not in rows[0]
    assert rows[1]["loop_ms"] > 0 and rows[1]["loop_fraction"] > 0 and "loop_ms" not in rows[0]
    assert rows[0]["floor_ms"] >= rows[0]["same_copy_ms"] > 0 and 0 < rows[0]["floor_fraction"]
    assert all(0 < r["opfuse_ms"] <= r["call_ms"] for r in rows)  # the kernels, inside each timed call
    assert "r18.ds" in text


def test_bench_kernels_options_smoke(tmp_path):
    """``--set FIELD=VALUE``: a ``CodegenOptions`` variant for every shape, recorded in the JSON."""
    out = tmp_path / "kernels.json"
    _run("bench_kernels.py", "--only", "r18.conv1", "--repeat", "1", "--warmup", "0", "--set", "conv_direct_vectors=1",
         "--out", str(out))
    data = json.loads(out.read_text())
    assert data["meta"]["codegen_options"] == ["conv_direct_vectors=1"] and data["shapes"][0]["max_abs_error"] < 1e-4


def test_bench_kernels_vs_smoke(tmp_path):
    """``--vs FIELD=VALUE``: a second build of each shape timed in the same rounds, its time over the first's and
    whether its outputs are the first's bit for bit (the windows' MR changes no sum)."""
    out = tmp_path / "kernels.json"
    text = _run("bench_kernels.py", "--only", "r18.ds", "--repeat", "2", "--warmup", "0", "--vs", "windows_mr_max=8",
                "--out", str(out))
    data = json.loads(out.read_text())
    row = data["shapes"][0]
    assert data["meta"]["vs_codegen_options"] == ["windows_mr_max=8"]
    assert row["vs_ms"] > 0 and row["vs_ratio"] == pytest.approx(row["vs_ms"] / row["opfuse_ms"])
    assert row["vs_bitwise_equal"] and row["vs_max_abs_error"] < 1e-4
    assert "vs:" in text and "bitwise equal" in text


def test_bench_microkernel_smoke():
    """The micro-kernels alone, checked against a plain loop in the program, one line per (K, block)."""
    text = _run("bench_microkernel.py", "--blocks", "8x32", "6x16", "--k", "64", "--rounds", "3")
    lines = [x.split() for x in text.splitlines() if x.strip().startswith("64 ")]
    assert [x[1] for x in lines] == ["8x32", "6x16"] and all(float(x[2]) > 0 for x in lines)


def test_bench_depthwise_smoke(tmp_path):
    pytest.importorskip("onnxruntime")
    out = tmp_path / "depthwise.json"
    text = _run("bench_depthwise.py", "--models", "ds_cnn", "--repeat", "2", "--warmup", "1",
                "--baseline", "depthwise_register_epilogue=false", "--json", str(out))
    data = json.loads(out.read_text())
    # ds_cnn's four depthwise layers (conv1 has one input channel: an ordinary convolution)
    assert [r["layer"] for r in data["rows"]] == ["dw1", "dw2", "dw3", "dw4"]
    assert all(r["opfuse_us"] > 0 and r["ort_us"] > 0 and r["base_us"] > 0 for r in data["rows"])
    assert data["cold_copy_gbs"] > 0 and "dw4" in text


def test_bench_conformance_smoke(tmp_path):
    out = tmp_path / "conformance.json"
    text = _run("bench_conformance.py", "-k", "^test_(relu|abs)$", "--jobs", "1", "--out", str(out))
    data = json.loads(out.read_text())
    assert data["ran"] == 2 and data["suite_tests"] > 1000
    for backend in ("reference", "c"):
        assert data["backends"][backend]["passed"] == 2, data["tests"]
    assert "ONNX node conformance (2 of" in text


def test_bench_int8_smoke(tmp_path):
    out = tmp_path / "int8.json"
    _run("bench_int8.py", "resnet8", "--methods", "minmax", "--samples", "3", "--calibration", "2", "--out", str(out))
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "resnet8" and row["report_samples"] == 3 and row["top1_agreement"] is not None
    assert row["cosine_min"] > 0.99 and row["int32_biases"] == row["weights"] == 10
    merged = tmp_path / "merged.json"
    _run("bench_int8.py", "--merge", str(out), str(out), "--out", str(merged))
    assert len(json.loads(merged.read_text())["rows"]) == 2
    assert "| resnet8 | minmax |" in merged.with_suffix(".md").read_text()


def test_bench_scaling_smoke(tmp_path):
    """The split from the generated code (--static --markdown) and a short interleaved run."""
    md = tmp_path / "split.md"
    _run("bench_scaling.py", "resnet8", "--static", "--markdown", str(md))
    text = md.read_text()
    import re
    before, after = (float(v) for v in re.search(r"## resnet8: x([\d.]+) -> x([\d.]+)", text).groups())
    assert before < 1.9 <= after  # convolutions of one or two tiles before balancing
    assert "| conv1 | Conv+Relu | direct |" in text
    out = tmp_path / "scaling.json"
    printed = _run("bench_scaling.py", "ds_cnn", "--repeat", "2", "--out", str(out))
    row = json.loads(out.read_text())[0]
    assert row["model"] == "ds_cnn" and len(row["cpu_ms_2"]) == 2 and row["kernels"]
    assert all(k["tile_bound"] >= 1.0 for k in row["kernels"]) and "tile bound" in printed
    assert row["fifo"] is False and row["loadavg"] >= 0 and ", load " in printed  # --fifo not asked for


def test_bench_scaling_ab_smoke(tmp_path):
    out = tmp_path / "ab.json"
    printed = _run("bench_scaling.py", "resnet8", "--ab", "--repeat", "2", "--out", str(out))
    row = json.loads(out.read_text())[0]
    assert {"cache blocking", "balanced"} <= row.keys() and "balanced" in printed
    assert all(row[k]["ms_1"] > 0 and len(row[k]["cpu_ms"]) == 2 for k in ("cache blocking", "balanced"))


def test_bench_scaling_vs_smoke(tmp_path):
    """--vs: the default build against one with other CodegenOptions fields, per kernel at 1 and 2 threads."""
    out = tmp_path / "vs.json"
    printed = _run("bench_scaling.py", "ds_cnn", "--vs", "balance_even_panels=False", "gemm_min_tiles=2",
                   "--repeat", "2", "--out", str(out))
    row = json.loads(out.read_text())[0]
    assert row["fields"] == {"balance_even_panels": "False", "gemm_min_tiles": "2"}
    for key in ("default", "vs"):
        assert set(row[key]["wall_ms"]) == {"1", "2"} and row[key]["kernels"]
        assert all(set(k) == {"1", "2"} and min(k.values()) >= 0 for k in row[key]["kernels"].values())
    assert "ds_cnn vs balance_even_panels=False gemm_min_tiles=2" in printed and "kernels summed" in printed


def test_bench_memory_aa_smoke(tmp_path):
    out = tmp_path / "aa.json"
    text = _run("bench_memory_aa.py", "ds_cnn", "--repeat", "2", "--out", str(out))
    [row] = json.loads(out.read_text())
    assert row["model"] == "ds_cnn" and row["rows"] > 0 and row["memory_unfused_s"] > 0
    assert row["rows_held_at_0_s"] >= row["rows_summed_s"] and row["left_s"] == row["rows_summed_s"]
    assert "ds_cnn:" in text
