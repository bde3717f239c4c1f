"""The command line: every command on a small zoo model, and exit code 2 with one line on bad input."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from opfuse.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_zoo_list_names_every_model(capsys):
    code, out, _ = run_cli(capsys, "zoo", "list")
    assert code == 0
    for name in ("mobilenet_v1", "mobilenet_v1_025_96", "resnet18", "resnet8", "ds_cnn", "bert_layer",
                 "yolo_block"):
        assert name in out


def test_zoo_export_then_info_on_the_file(capsys, tmp_path):
    path = tmp_path / "r8.onnx"
    code, out, _ = run_cli(capsys, "zoo", "export", "resnet8", "-o", str(path))
    assert code == 0 and path.exists()
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    code, out, _ = run_cli(capsys, "info", str(path))
    assert code == 0
    assert "params      78,666" in out
    assert "Conv" in out and "peak live" in out


def test_info_zoo(capsys):
    code, out, _ = run_cli(capsys, "info", "zoo:ds_cnn")
    assert code == 0 and "FLOPs" in out and "Softmax" in out


def test_run_reference_outputs_inputs_and_compare(capsys, tmp_path):
    outs = tmp_path / "out.npz"
    code, out, _ = run_cli(capsys, "run", "zoo:resnet8", "--outputs", str(outs), "--compare", "onnxruntime")
    assert code == 0
    line = [t for t in out.splitlines() if t.startswith("compare onnxruntime output")][0]
    abs_err = float(line.split("max abs error ")[1].split(",")[0])
    assert abs_err < 1e-4
    with np.load(outs) as d:
        first = d["output"]
    # same inputs (seed 0) written to a file and read back give the same outputs
    from opfuse.api import load
    from opfuse.runtime.reference import random_inputs
    ins = tmp_path / "in.npz"
    np.savez(ins, **random_inputs(load("zoo:resnet8"), 0))
    outs2 = tmp_path / "out2.npz"
    assert run_cli(capsys, "run", "zoo:resnet8", "--inputs", str(ins), "--outputs", str(outs2))[0] == 0
    with np.load(outs2) as d:
        np.testing.assert_array_equal(first, d["output"])


def test_run_with_wrong_input_shape_names_the_input(capsys, tmp_path):
    ins = tmp_path / "bad.npz"
    np.savez(ins, input=np.zeros((1, 3, 16, 16), np.float32))
    code, out, err = run_cli(capsys, "run", "zoo:resnet8", "--inputs", str(ins))
    assert code == 2
    assert "input" in err and "(1, 3, 16, 16)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def _write_model(tmp_path, nodes, inputs, outputs, inits=(), opset=17, name="m.onnx"):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    p = tmp_path / name
    p.write_bytes(m.SerializeToString())
    return p


@pytest.mark.parametrize("case", ["not_onnx", "truncated", "empty", "unsupported", "cycle", "missing", "mixed_types"])
def test_bad_models_exit_2_with_one_line(capsys, tmp_path, case):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    if case == "not_onnx":
        p = tmp_path / "m.onnx"
        p.write_text("this is not a model\n" * 10)
    elif case == "empty":
        p = tmp_path / "m.onnx"
        p.write_bytes(b"")
    elif case == "truncated":
        good = _write_model(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="r")], [x], [y])
        data = good.read_bytes()
        p = tmp_path / "t.onnx"
        p.write_bytes(data[: len(data) // 2])
    elif case == "unsupported":
        p = _write_model(tmp_path, [helper.make_node("Unique", ["x"], ["y"], name="hm0")], [x], [y])
    elif case == "cycle":
        p = _write_model(tmp_path, [helper.make_node("Relu", ["b"], ["a"], name="n1"),
                                    helper.make_node("Relu", ["a"], ["b"], name="n2"),
                                    helper.make_node("Add", ["x", "b"], ["y"], name="n3")], [x], [y])
    elif case == "mixed_types":  # onnxruntime refuses it too: Div's type T bound to int32 and float
        k = helper.make_tensor_value_info("k", TensorProto.INT32, [1, 4])
        p = _write_model(tmp_path, [helper.make_node("Div", ["k", "x"], ["y"], name="dv")], [k, x], [y])
    else:
        p = tmp_path / "nope.onnx"
    code, out, err = run_cli(capsys, "info", str(p))
    assert code == 2, err
    assert err.startswith("opfuse: error: ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if case == "unsupported":
        assert "Unique" in err and "hm0" in err and "17" in err
    if case == "cycle":
        assert "cycle" in err
    if case == "mixed_types":
        assert "'dv' (Div): operand dtypes differ: int32, float32" in err


def test_bad_input_shape_spec(capsys):
    code, _, err = run_cli(capsys, "info", "zoo:resnet8", "--input-shape", "input=1xbananax3")
    assert code == 2 and "input" in err


def test_unknown_zoo_model(capsys):
    code, _, err = run_cli(capsys, "info", "zoo:alexnet")
    assert code == 2 and "resnet8" in err


def test_console_script_entry_point():
    r = subprocess.run([sys.executable, "-m", "opfuse", "zoo", "list"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "bert_layer" in r.stdout


def test_compile_report_json_keys_and_dumps(capsys, tmp_path):
    import json
    rj, dump, log = tmp_path / "r.json", tmp_path / "ir", tmp_path / "d.json"
    code, out, err = run_cli(capsys, "compile", "zoo:resnet8", "--report", "--report-json", str(rj),
                             "--dump-ir", str(dump), "--log-decisions", str(log))
    assert code == 0, err
    assert "fusion report: resnet8" in out and "kernels 30 ->" in out
    rep = json.loads(rj.read_text())
    for key in ("kernels_before", "kernels_after", "bytes_before", "bytes_after", "eta", "groups",
                "predicted_latency_s", "arena_bytes", "arena_lower_bound_bytes"):
        assert key in rep, key
    assert rep["kernels_before"] == 30 and rep["kernels_after"] < 30
    assert 0 < rep["eta"] < 1 and rep["bytes_after"] < rep["bytes_before"]
    for g in rep["groups"]:
        assert {"name", "ops", "kernels_before", "bytes_before", "bytes_after"} <= set(g)
    assert rep["arena_bytes"] >= rep["arena_lower_bound_bytes"] > 0
    names = sorted(p.name for p in dump.iterdir())
    assert names[0].startswith("00_") and any(n.endswith("_after.ir") for n in names)
    decisions = json.loads(log.read_text())
    assert decisions


def test_compile_no_fuse_is_one_kernel_per_op(capsys, tmp_path):
    import json
    rj = tmp_path / "r.json"
    assert run_cli(capsys, "compile", "zoo:resnet8", "--no-fuse", "--report-json", str(rj))[0] == 0
    rep = json.loads(rj.read_text())
    assert rep["kernels_after"] == rep["kernels_before"] == 30


def test_compile_disable_rule_and_unknown_rule(capsys):
    code, out, err = run_cli(capsys, "compile", "zoo:resnet8", "--disable", "no_such_rule")
    assert code == 2 and "no_such_rule" in err
    code, out, err = run_cli(capsys, "compile", "zoo:resnet8", "--disable", "fuse", "--planner", "rules")
    assert code == 0 and "kernels 30 -> 2" in out  # only the zero-copy Flatten moves no data


def test_infeasible_latency_bound_exits_2(capsys):
    code, out, err = run_cli(capsys, "compile", "zoo:resnet8", "--latency-bound", "1e-9")
    assert code == 2 and "infeasible" in err and "latency" in err


def test_compile_for_cortex_m7_and_pareto(capsys):
    code, out, err = run_cli(capsys, "compile", "zoo:resnet8", "--target", "cortex-m7", "--pareto")
    assert code == 0, err
    assert "for cortex-m7" in out and "predicted latency" in out


def test_explain_gives_a_reason_per_pair(capsys):
    code, out, err = run_cli(capsys, "explain", "zoo:resnet8")
    assert code == 0
    lines = [t for t in out.splitlines() if " -> " in t]
    assert lines and all(": " in t for t in lines)
    assert "Conv -> Conv" in out


def test_profile_builtin_target(capsys, tmp_path):
    out_file = tmp_path / "m7.json"
    code, out, err = run_cli(capsys, "profile", "--target", "cortex-m7", "-o", str(out_file))
    assert code == 0 and "512 KiB" in out and out_file.exists()
    code, out, err = run_cli(capsys, "profile", "--target", "tpu9")
    assert code == 2 and "cortex-m7" in err


def test_run_c_backend_fused_and_unfused_match_reference(capsys, tmp_path):
    outs = {}
    for flag in ([], ["--no-fuse"]):
        path = tmp_path / f"o{len(flag)}.npz"
        code, out, err = run_cli(capsys, "run", "zoo:resnet8", "--backend", "c", "--outputs", str(path), *flag)
        assert code == 0, err
        with np.load(path) as d:
            outs[len(flag)] = d["output"]
    from opfuse.api import load
    from opfuse.runtime.reference import random_inputs, run
    g = load("zoo:resnet8")
    want = run(g, random_inputs(g, 0))["output"]
    for got in outs.values():
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_compile_measure_puts_measured_next_to_predicted(capsys, tmp_path):
    import json
    rj = tmp_path / "r.json"
    code, out, err = run_cli(capsys, "compile", "zoo:resnet8", "--measure", "--repeat", "3",
                             "--report-json", str(rj))
    assert code == 0, err
    assert "whole model: measured" in out
    rep = json.loads(rj.read_text())
    assert rep["measured_latency_s"] > 0 and rep["predicted_latency_s"] > 0
    timed = [g for g in rep["groups"] if "measured_latency_s" in g]
    assert len(timed) == rep["kernels_after"] and all(g["measured_latency_s"] > 0 for g in timed)


def test_profile_fit_saves_host_corrections(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPFUSE_CACHE_DIR", str(tmp_path))  # keep the session's planner uncorrected
    code, out, err = run_cli(capsys, "profile", "--target", "host", "--fit", "zoo:ds_cnn")
    assert code == 0, err
    assert "corrections for host" in out and "alpha" in out
    from opfuse.cost.correction import load_corrections
    corr = load_corrections("host")
    assert corr.samples and all(a > -1 for a in corr.alphas.values())
    code, out, err = run_cli(capsys, "profile", "--target", "a100", "--fit", "zoo:ds_cnn")
    assert code == 2 and "host" in err and "cortex-m7" in err


def test_compile_stats_prints_pass_timing_and_rule_statistics(capsys):
    code, out, err = run_cli(capsys, "compile", "zoo:bert_layer", "--stats", "--planner", "rules")
    assert code == 0, err
    rows = {t.split()[0]: t.split()[1:] for t in out.splitlines() if t.startswith("recognize_")}
    attempts, matches, applied = (int(x) for x in rows["recognize_layernorm"][:3])
    assert applied == matches == 2 and attempts >= matches  # anchors tried are counted
    assert "recognize" in out and "total" in out


def test_compile_int8_quantizes_then_says_what_runs_in_int8(capsys, tmp_path):
    path = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "compile", "zoo:ds_cnn", "--int8", "--calibration-random", "2", "-q",
                           "--report-json", str(path))
    assert code == 0
    # 9 convs and the fc (an integer MatMul, the integer_matmul rule) accumulate in int32
    assert "int8: 10 of 13 kernels read and write only 8-bit tensors, 10 accumulate in int32" in out
    assert "not int8 at the boundary: input_QuantizeLinear/Div, fc/MatMul, softmax" in out  # float in, float logits
    import json
    record = json.loads(path.read_text())["int8"]
    assert record["integer_accumulate"] == 10 and record["tensors_between_kernels"]["int8"] == 11


@pytest.mark.parametrize("argv, message", [
    (["--int8"], "--int8 needs calibration samples"),
    (["--calibration-random", "2"], "--calibration and --calibration-random are for --int8"),
])
def test_compile_int8_options_are_checked(capsys, argv, message):
    code, _, err = run_cli(capsys, "compile", "zoo:ds_cnn", "-q", *argv)
    assert code == 2 and message in err and "Traceback" not in err
