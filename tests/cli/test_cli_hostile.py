"""Hostile but realistic use of the command line: each case ends in one line and exit 2, never a traceback."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from opfuse.cli import main


def run_cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(code, err, *needles):
    assert code == 2, err
    assert err.startswith("opfuse: error: ") and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err


def write_model(tmp_path, nodes, inputs, outputs, inits=(), opset=17, name="m.onnx"):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    p = tmp_path / name
    p.write_bytes(m.SerializeToString())
    return p


def relu_model(tmp_path, elem=TensorProto.INT8, shape=(3,), name="relu.onnx"):
    return write_model(tmp_path, [helper.make_node("Relu", ["x"], ["y"], name="r")],
                       [helper.make_tensor_value_info("x", elem, list(shape))],
                       [helper.make_tensor_value_info("y", elem, None)], name=name)


def test_inputs_of_another_dtype_need_cast_inputs(capsys, tmp_path):
    model = relu_model(tmp_path)
    ins = tmp_path / "in.npz"
    np.savez(ins, x=np.array([300, 1, 2], np.int64))
    code, _, err = run_cli(capsys, "run", model, "--inputs", ins)
    one_line_error(code, err, "'x'", "int64", "int8", "--cast-inputs")
    code, _, err = run_cli(capsys, "run", model, "--inputs", ins, "--cast-inputs")
    one_line_error(code, err, "300", "does not fit")
    np.savez(ins, x=np.array([100, -1, 2], np.int64))
    code, out, _ = run_cli(capsys, "run", model, "--inputs", ins, "--cast-inputs", "--outputs", tmp_path / "o.npz")
    assert code == 0
    with np.load(tmp_path / "o.npz") as d:
        assert d["y"].dtype == np.int8 and d["y"].tolist() == [100, 0, 2]
