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
    line = [l for l in out.splitlines() if l.startswith("compare onnxruntime output")][0]
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


@pytest.mark.parametrize("case", ["not_onnx", "truncated", "empty", "unsupported", "cycle", "missing"])
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
        p = _write_model(tmp_path, [helper.make_node("Hardmax", ["x"], ["y"], name="hm0")], [x], [y])
    elif case == "cycle":
        p = _write_model(tmp_path, [helper.make_node("Relu", ["b"], ["a"], name="n1"),
                                    helper.make_node("Relu", ["a"], ["b"], name="n2"),
                                    helper.make_node("Add", ["x", "b"], ["y"], name="n3")], [x], [y])
    else:
        p = tmp_path / "nope.onnx"
    code, out, err = run_cli(capsys, "info", str(p))
    assert code == 2, err
    assert err.startswith("opfuse: error: ")
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    if case == "unsupported":
        assert "Hardmax" in err and "hm0" in err and "17" in err
    if case == "cycle":
        assert "cycle" in err


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
