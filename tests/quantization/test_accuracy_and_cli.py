"""The accuracy report and ``opfuse quantize`` on the command line (exit 2, one line, on bad input)."""
import json

import numpy as np
import pytest

import opfuse
from opfuse.cli import main
from opfuse.quantization import build_qdq_model, quantize
from opfuse.quantization.accuracy import accuracy_report, format_report
from opfuse.quantization.params import ActivationParams


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def r8():
    return quantize("zoo:resnet8", calibration_random=8, report=True, report_samples=6)


def test_report_has_every_output_and_layer(r8):
    rep = r8.report
    assert rep["samples"] == 6
    out = rep["outputs"]["output"]
    assert out["top1_agreement"] == 1.0 and out["top1_rows"] == 6
    assert out["cosine_min"] > 0.999 and 0 < out["max_abs_error"] < out["max_abs_float"]
    tensors = {la["tensor"] for la in rep["layers"]}
    assert set(r8.activations) <= tensors and {w["weight"] for w in r8.weights} <= tensors
    assert len(rep["dominant"]) >= 3
    text = format_report(rep, r8)
    assert "top-1 agreement 100.00%" in text and "<- dominates" in text


def test_a_badly_clipped_layer_is_named_dominant(r8):
    """Shrink one scale 30x (the layer clips most of its values): the report must find that layer."""
    bad = dict(r8.activations)
    p = bad["stack2_relu"]
    bad["stack2_relu"] = ActivationParams(np.float32(p.scale / 30), p.zero_point, p.dtype)
    from opfuse.frontend.onnx import export_model
    model, _, _ = build_qdq_model(export_model(r8.fused_graph), bad, r8.inherited)
    broken = type(r8)(model, r8.method, r8.activation_type, r8.samples, bad, r8.ranges, r8.inherited, r8.weights,
                      r8.kept_float, r8.fused_graph)
    rep = accuracy_report(opfuse.load("zoo:resnet8"), opfuse.load(model), broken, count=4)
    assert rep["dominant"][0] == "stack2_relu"
    assert rep["outputs"]["output"]["cosine_min"] < r8.report["outputs"]["output"]["cosine_min"]


def test_user_inputs_join_the_report(tmp_path):
    xs = np.random.default_rng(2).standard_normal((2, 1, 1, 49, 10)).astype(np.float32)
    np.savez(tmp_path / "x.npz", input=xs)
    r = quantize("zoo:ds_cnn", calibration_random=2, report=True, report_samples=1,
                 report_inputs=str(tmp_path / "x.npz"))
    assert r.report["samples"] == 3 and r.report["user_samples"] == 2


def test_cli_writes_the_model_and_the_json_report(capsys, tmp_path):
    out, js = tmp_path / "q.onnx", tmp_path / "q.json"
    code, stdout, err = run_cli(capsys, "quantize", "zoo:ds_cnn", "--calibration-random", "2", "--method",
                                "percentile", "-o", str(out), "--report", "--report-samples", "2",
                                "--report-json", str(js))
    assert code == 0, err
    assert out.exists() and "top-1 agreement" in stdout and "wrote" in stdout
    data = json.loads(js.read_text())
    assert data["method"] == "percentile" and data["activation_type"] == "int8"
    assert data["accuracy"]["outputs"]["output"]["top1_agreement"] is not None
    assert set(data["activations"]) >= {"input", "conv1_relu"}


def test_cli_json(capsys, tmp_path):
    code, stdout, _ = run_cli(capsys, "quantize", "zoo:ds_cnn", "--calibration-random", "1", "-o",
                              str(tmp_path / "q.onnx"), "--json")
    assert code == 0 and json.loads(stdout)["calibration_samples"] == 1


@pytest.mark.parametrize("arrays, message", [
    ({"x": np.zeros((2, 1, 1, 49, 10), np.float32)}, "no samples for input(s) ['input']"),
    ({"input": np.zeros((2, 1, 49, 11), np.float32)}, "has shape (2, 1, 49, 11)"),
    ({"input": np.zeros((2, 1, 1, 49, 10), np.float32), "other": np.zeros((3, 1, 1, 49, 10), np.float32)},
     "unknown input(s) ['other']"),
])
def test_cli_bad_calibration_file_is_one_line_exit_2(capsys, tmp_path, arrays, message):
    np.savez(tmp_path / "cal.npz", **arrays)
    code, stdout, err = run_cli(capsys, "quantize", "zoo:ds_cnn", "--calibration", str(tmp_path / "cal.npz"),
                                "-o", str(tmp_path / "q.onnx"))
    assert code == 2 and message in err and err.count("\n") == 1
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("argv, message", [
    (["--calibration", "missing.npz"], "not found"),
    (["--calibration-random", "0"], "positive number"),
])
def test_cli_bad_options_exit_2(capsys, tmp_path, argv, message):
    code, _, err = run_cli(capsys, "quantize", "zoo:ds_cnn", "-o", str(tmp_path / "q.onnx"), *argv)
    assert code == 2 and message in err and err.count("\n") == 1


@pytest.mark.parametrize("argv, message", [
    (["--calibration-random", "1", "--calibration", "x.npz"], "not allowed with"),
    ([], "one of the arguments"),
    (["--calibration-random", "1", "--method", "mse"], "invalid choice"),
])
def test_cli_usage_errors_exit_2(capsys, tmp_path, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["quantize", "zoo:ds_cnn", "-o", str(tmp_path / "q.onnx"), *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1


def test_cli_not_an_npz(capsys, tmp_path):
    (tmp_path / "cal.npz").write_text("hello")
    code, _, err = run_cli(capsys, "quantize", "zoo:ds_cnn", "--calibration", str(tmp_path / "cal.npz"),
                           "-o", str(tmp_path / "q.onnx"))
    assert code == 2 and "not an .npz archive" in err


def test_tensors_made_by_rewrites_are_reported_from_the_fused_float_graph():
    """bert_layer: the QKV MatMuls merge into one (a tensor the original graph does not hold)."""
    r = quantize("zoo:bert_layer", calibration_random=1, report=True, report_samples=1)
    assert "query_key_value_matmul_bias_1" in r.activations
    assert "query_key_value_matmul_bias_1" not in opfuse.load("zoo:bert_layer").values
    layer = next(la for la in r.report["layers"] if la["tensor"] == "query_key_value_matmul_bias_1")
    assert 20 < layer["sqnr_db"] < 60
    assert r.report["outputs"]["output"]["cosine_min"] > 0.99
