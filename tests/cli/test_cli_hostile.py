"""Hostile but realistic use of the command line: each case ends in one line and exit 2, never a traceback."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
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


def test_compare_counts_nan_and_infinities_on_both_sides_as_agreement(capsys, tmp_path):
    """A BatchNormalization with a negative epsilon over a zero variance is NaN in every backend: ``--compare
    reference`` said MISMATCH (NaN - NaN is NaN) and NumPy's two warning lines came first; an infinity on both
    sides agrees too, and one on one side only does not."""
    from onnx import numpy_helper
    f32 = lambda n, a: numpy_helper.from_array(np.asarray(a, np.float32), n)  # noqa: E731
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2, 2])
    model = write_model(tmp_path, [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                                    epsilon=-1.0)],
                        [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                        [f32("s", [1, 1]), f32("b", [0, 0]), f32("m", [0, 0]), f32("v", [0, 0])])
    code, out, err = run_cli(capsys, "run", model, "--backend", "c", "--compare", "reference")
    assert code == 0 and err == "" and "max abs error 0," in out and "MISMATCH" not in out, (out, err)
    from opfuse.cli import compare_outputs, compare_scale
    inf, nan = np.inf, np.nan
    rows = compare_outputs({"a": np.array([inf, -inf, nan, 1.0]), "b": np.array([inf, 1.0])},
                           {"a": np.array([inf, -inf, nan, 1.0]), "b": np.array([-inf, 1.0])})
    assert rows == [("a", 0.0, 0.0), ("b", inf, inf)]
    assert compare_outputs({"a": np.array([nan])}, {"a": np.array([1.0])})[0][1] == inf
    assert compare_outputs({"a": np.zeros(3)}, {"a": np.zeros(4)})[0][1] == inf
    assert compare_scale(np.array([inf, -5.0, nan])) == 5.0


def test_compare_takes_integer_outputs_exactly():
    """Two uint64 outputs 3 apart near 2^64 are one float64 number: ``--compare`` took them as equal, and a wrong
    reference TopK (``opfuse fuzz`` seed 93001) passed as "max abs error 0". Integers are compared exactly and
    allowed no error; floats keep their relative tolerance."""
    from opfuse.cli import COMPARE_RTOL, compare_outputs, compare_tolerance
    top = np.iinfo(np.uint64).max
    a, b = np.array([top, top - 3, 5], np.uint64), np.array([top - 3, top - 3, 5], np.uint64)
    assert compare_outputs({"t": a}, {"t": b}) == [("t", 3.0, 3.0 / float(top - 3))]
    assert compare_outputs({"t": a}, {"t": a.copy()}) == [("t", 0.0, 0.0)]
    i64 = np.iinfo(np.int64)
    assert compare_outputs({"s": np.array([i64.min], np.int64)}, {"s": np.array([i64.max], np.int64)}) == [
        ("s", float(2 ** 64 - 1), float(2 ** 64 - 1) / i64.max)]
    assert compare_outputs({"m": np.array([1, 2], np.int32)}, {"m": np.array([1, 2], np.int64)}) == [("m", 0.0, 0.0)]
    assert compare_outputs({"q": np.array([True, False])}, {"q": np.array([True, True])}) == [("q", 1.0, 1.0)]
    assert compare_tolerance(a, b) == 0.0 and compare_tolerance(np.array([True]), np.array([False])) == 0.0
    assert compare_tolerance(np.array([2.0, -300.0]), np.array([2.0, -300.0])) == COMPARE_RTOL * 300.0


def test_run_compare_reports_a_64_bit_integer_mismatch(capsys, tmp_path, monkeypatch):
    """The fuzz reproducer with the reference's old TopK (ordered through float64) put back: ``run --compare
    reference`` now says MISMATCH and exits 1 (it said "max abs error 0")."""
    from opfuse.ops import scatter
    from opfuse.ops.registry import get_spec
    repro = Path(__file__).parents[1] / "e2e" / "repro" / "topk_uint64_above_2_to_the_53"

    def float64_order(ins, a, node):
        x = ins[0]
        k = scatter.topk_k(node)
        order = np.lexsort((np.arange(x.size), -x.astype(np.float64)))[:k]
        return [x[order], order.astype(np.int64)]

    monkeypatch.setattr(get_spec("TopK"), "compute", float64_order)
    code, out, err = run_cli(capsys, "run", str(repro / "model.onnx"), "--backend", "c", "--inputs",
                             str(repro / "inputs.npz"), "--compare", "reference", "--no-fuse")
    assert code == 1 and "MISMATCH (tolerance 0)" in out and "max abs error 6," in out, (out, err)


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_a_value_for_an_initializer_listed_as_an_input(capsys, tmp_path, backend):
    """Old exporters list every weight among the graph inputs; opfuse compiles them as the constants the file
    stores, and a value given for one says so (it said only 'unknown input')."""
    from onnx import numpy_helper
    model = write_model(tmp_path, [helper.make_node("Add", ["x", "w"], ["y"], name="add")],
                        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "w")],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                        [numpy_helper.from_array(np.ones((1, 4), np.float32), "w")])
    ins = tmp_path / "in.npz"
    np.savez(ins, x=np.zeros((1, 4), np.float32), w=np.full((1, 4), 10, np.float32))
    code, _, err = run_cli(capsys, "run", model, "--backend", backend, "--inputs", ins)
    one_line_error(code, err, "unknown input(s) ['w']", "initializer", "also lists as an input", "constant")
    np.savez(ins, x=np.zeros((1, 4), np.float32))
    code, _, _ = run_cli(capsys, "run", model, "--backend", backend, "--inputs", ins, "--outputs", tmp_path / "o.npz")
    assert code == 0
    with np.load(tmp_path / "o.npz") as d:
        assert d["y"].tolist() == [[1.0] * 4]


@pytest.mark.parametrize("kind", ["text", "npy", "garbage_zip", "pickle", "object_array", "folder", "missing"])
def test_inputs_that_are_not_an_npz(capsys, tmp_path, kind):
    import pickle
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    p = tmp_path / "in.npz"
    if kind == "text":
        p.write_text("hello\n")
    elif kind == "npy":
        with open(p, "wb") as f:
            np.save(f, np.zeros(4, np.float32))
    elif kind == "garbage_zip":
        p.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    elif kind == "pickle":
        p.write_bytes(pickle.dumps({"x": 1}))
    elif kind == "object_array":
        np.savez(p, x=np.array([1, "a"], dtype=object))
    elif kind == "folder":
        p.mkdir()
    code, _, err = run_cli(capsys, "run", model, "--inputs", p)
    one_line_error(code, err, "cannot read inputs", str(p))


def test_outputs_into_a_missing_folder_and_onto_a_folder(capsys, tmp_path):
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    code, _, err = run_cli(capsys, "run", model, "--outputs", tmp_path / "nope" / "o.npz")
    one_line_error(code, err, "does not exist")
    (tmp_path / "d.npz").mkdir()
    code, _, err = run_cli(capsys, "run", model, "--outputs", tmp_path / "d.npz")
    one_line_error(code, err, "is a folder")


def test_a_full_disk_leaves_no_truncated_output(capsys, tmp_path, monkeypatch):
    import errno
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    out = tmp_path / "o.npz"

    def savez(f, **arrays):
        f.write(b"PK")
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(np, "savez", savez)
    code, _, err = run_cli(capsys, "run", model, "--outputs", out)
    one_line_error(code, err, "No space left on device", str(out))
    assert list(tmp_path.iterdir()) == [model]


def test_emit_c_onto_an_existing_file(capsys, tmp_path):
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    f = tmp_path / "out"
    f.write_text("mine")
    code, _, err = run_cli(capsys, "compile", model, "--emit-c", f)
    one_line_error(code, err, "not a folder")
    assert f.read_text() == "mine"


def test_report_json_onto_a_folder_or_into_a_missing_one(capsys, tmp_path):
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    code, _, err = run_cli(capsys, "compile", model, "--report-json", tmp_path)
    one_line_error(code, err, "is a folder")
    code, _, err = run_cli(capsys, "compile", model, "--report-json", tmp_path / "no" / "r.json")
    one_line_error(code, err, "does not exist")


def test_repeat_zero(capsys, tmp_path):
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    code, _, err = run_cli(capsys, "compile", model, "--measure", "--repeat", "0")
    one_line_error(code, err, "--repeat", "at least 1")
    from opfuse.errors import OpfuseError
    from opfuse.measure import median_seconds
    with pytest.raises(OpfuseError, match="at least 1"):
        median_seconds(lambda: None, 0)


def test_compare_when_onnxruntime_rejects_the_model(capsys, tmp_path):
    import onnx
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    m = onnx.load(str(model))
    m.ir_version = 99  # opfuse reads it; onnxruntime refuses the IR version
    onnx.save(m, str(model))
    code, _, err = run_cli(capsys, "run", model, "--compare", "onnxruntime")
    one_line_error(code, err, "onnxruntime cannot run this model")


def test_softmax_over_a_zero_size_axis_runs(capsys, tmp_path):
    model = write_model(tmp_path, [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
                        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0])],
                        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    code, out, _ = run_cli(capsys, "run", model)
    assert code == 0 and "y: float32[2, 0]" in out


EVIL = "x\x1b[2J\x1b]0;pwned\x07\nforged line\u202e"


def test_model_controlled_names_are_escaped(capsys, tmp_path):
    model = write_model(tmp_path, [helper.make_node("Relu", [EVIL], ["y" + EVIL], name="n" + EVIL)],
                        [helper.make_tensor_value_info(EVIL, TensorProto.FLOAT, [4])],
                        [helper.make_tensor_value_info("y" + EVIL, TensorProto.FLOAT, None)])
    for argv in (("info", model), ("run", model), ("compile", model, "--report"), ("explain", model)):
        code, out, err = run_cli(capsys, *argv)
        assert code == 0, err
        assert "\x1b" not in out + err and "\u202e" not in out + err and "\x07" not in out + err
        assert not any(line.startswith("forged line") for line in out.splitlines())
    assert "\\x1b[2J" in out or "\\x1b[2J" in run_cli(capsys, "info", model)[1]
    ins = tmp_path / "in.npz"
    np.savez(ins, **{EVIL: np.zeros(4)})  # float64 for a float32 input: the error names the input
    code, _, err = run_cli(capsys, "run", model, "--inputs", ins)
    one_line_error(code, err, "\\x1b[2J", "\\n")
    assert "\x1b" not in err


def test_zoo_export_into_a_missing_folder_and_a_negative_seed(capsys, tmp_path):
    code, _, err = run_cli(capsys, "zoo", "export", "resnet8", "-o", tmp_path / "no" / "r8.onnx")
    one_line_error(code, err, "does not exist")
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    code, _, err = run_cli(capsys, "run", model, "--seed", "-1")
    one_line_error(code, err, "seed", "-1")


def test_outputs_are_checked_before_the_run(capsys, tmp_path):
    model = relu_model(tmp_path, TensorProto.FLOAT, (4,))
    (tmp_path / "f").write_text("")
    code, out, err = run_cli(capsys, "run", model, "--outputs", tmp_path / "f" / "o.npz")
    one_line_error(code, err, "is not a folder")
    assert "backend reference" not in out
