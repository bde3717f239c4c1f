"""Bad models: every one is an OpfuseError with a one-line message, never a raw traceback."""
import os

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import init, model, vi
from opfuse.errors import ModelError, OpfuseError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx import MAX_OPSET, MIN_OPSET, import_model, load_model


def _good_model():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Relu", ["m"], ["y"], name="act")]
    return model(nodes, [vi("x", [2, 4])], [vi("y", [2, 3])], [init("w", np.ones((4, 3), np.float32))])


def _write(tmp_path, data: bytes, name="m.onnx"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def _one_line_error(exc_type, fn, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert isinstance(e.value, OpfuseError) and msg and "\n" not in msg, msg
    return msg


# Files ------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    assert "does not exist" in _one_line_error(ModelError, load_model, tmp_path / "nope.onnx")


def test_directory_instead_of_a_file(tmp_path):
    assert "directory" in _one_line_error(ModelError, load_model, tmp_path)


def test_empty_file(tmp_path):
    assert "empty" in _one_line_error(ModelError, load_model, _write(tmp_path, b""))


@pytest.mark.parametrize("data", [b"hello, this is not a model\n", b"\x08\x07" + b"\xff" * 40,
                                  b"PK\x03\x04" + bytes(range(256)), b"{\"graph\": 1}"])
def test_not_an_onnx_file(tmp_path, data):
    msg = _one_line_error(ModelError, load_model, _write(tmp_path, data))
    assert "not a valid ONNX model" in msg


def test_random_bytes_never_escape_as_raw_errors(tmp_path):
    rng = np.random.default_rng(7)
    for i in range(20):
        data = rng.integers(0, 256, int(rng.integers(1, 400)), dtype=np.uint8).tobytes()
        with pytest.raises(OpfuseError):
            load_model(_write(tmp_path, data, f"r{i}.onnx"))


def test_truncated_file(tmp_path):
    data = _good_model().SerializeToString()
    msg = _one_line_error(ModelError, load_model, _write(tmp_path, data[: len(data) // 2]))
    assert "truncated" in msg


def test_every_truncation_is_a_model_error(tmp_path):
    data = _good_model().SerializeToString()
    step = max(1, len(data) // 40)
    for cut in range(1, len(data), step):
        with pytest.raises(ModelError):
            load_model(_write(tmp_path, data[:cut], f"t{cut}.onnx"))


def test_the_intact_file_loads(tmp_path):
    assert len(load_model(_write(tmp_path, _good_model().SerializeToString())).nodes) == 2


# Ops and opsets --------------------------------------------------------------------------------

def test_unsupported_op_names_op_node_and_opset():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("StringNormalizer", ["r"], ["y"], name="norm_7"),  # strings: never imported
             helper.make_node("RegexFullMatch", ["r"], ["u"], name="regex")]
    m = model(nodes, [vi("x", [1, 4, 4])], [vi("y", None)], opset=13)
    msg = _one_line_error(UnsupportedOpError, import_model, m)
    assert "'StringNormalizer'" in msg and "norm_7" in msg and "opset 13" in msg and "RegexFullMatch" in msg


def test_op_not_yet_defined_at_the_model_opset():
    m = model([helper.make_node("Gelu", ["x"], ["y"], name="g")], [vi("x", [3])], [vi("y", [3])], opset=17)
    msg = _one_line_error(UnsupportedOpError, import_model, m)
    assert "'Gelu'" in msg and "opset 17" in msg


def test_opfuse_internal_op_is_not_an_onnx_op():
    m = model([helper.make_node("Silu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])], opset=21)
    assert "'Silu'" in _one_line_error(UnsupportedOpError, import_model, m)


def test_custom_domain_is_unsupported():
    g = helper.make_graph([helper.make_node("FusedConv", ["x"], ["y"], domain="com.microsoft", name="fc")],
                          "g", [vi("x", [3])], [vi("y", [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    msg = _one_line_error(UnsupportedOpError, import_model, m)
    assert "com.microsoft" in msg and "FusedConv" in msg


@pytest.mark.parametrize("opset", [5, 6, MAX_OPSET + 1])
def test_opset_outside_the_imported_range(opset):
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])], opset=min(opset, MAX_OPSET))
    m.opset_import[0].version = opset
    msg = _one_line_error(ModelError, import_model, m)
    assert f"opset {opset}" in msg and f"{MIN_OPSET} to {MAX_OPSET}" in msg


def test_op_version_newer_than_reviewed_is_refused(monkeypatch):
    from opfuse.frontend import onnx_import
    monkeypatch.setattr(onnx_import, "REVIEWED_OPSET", 13)
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3])], opset=14)
    msg = _one_line_error(UnsupportedOpError, import_model, m)
    assert "Relu-14 is newer" in msg


def test_no_default_domain_opset():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [vi("x", [3])], [vi("y", [3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    assert "default ONNX domain" in _one_line_error(ModelError, import_model, m)


def test_control_flow_on_a_run_time_condition_is_unsupported():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["o"])], "b", [], [vi("o", [3])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="cond", then_branch=branch, else_branch=branch)]
    m = model(nodes, [vi("x", [3]), vi("c", [], TensorProto.BOOL)], [vi("y", [3])], opset=13)
    msg = _one_line_error(UnsupportedOpError, import_model, m)
    assert "'If'" in msg and "'cond'" in msg and "condition" in msg and "run time" in msg


def test_unsupported_attribute_value_is_reported():
    nodes = [helper.make_node("Constant", [], ["c"], value_string="text"),
             helper.make_node("Identity", ["x"], ["y"])]
    m = model(nodes, [vi("x", [3])], [vi("y", [3])], opset=13)
    assert "string" in _one_line_error(UnsupportedOpError, import_model, m)


@pytest.mark.parametrize("alpha,given", [("abc", "STRING"), (1, "INT"), ([0.1, 0.2], "FLOATS")])
def test_attribute_of_the_wrong_type_is_refused(alpha, given):
    """As the ONNX checker and onnxruntime refuse it: a string alpha made code generation raise a ValueError
    traceback; an int one was taken as its float."""
    m = model([helper.make_node("LeakyRelu", ["x"], ["y"], name="lr", alpha=alpha)], [vi("x", [3])], [vi("y", [3])])
    msg = _one_line_error(ModelError, import_model, m)
    assert "'alpha'" in msg and "'lr'" in msg and given in msg and "LeakyRelu-16 takes FLOAT" in msg, msg


@pytest.mark.parametrize("op,attrs,missing", [("Cast", {}, "to"), ("Concat", {}, "axis")])
def test_missing_required_attribute_is_refused(op, attrs, missing):
    """A Cast without ``to`` ran as an identity (onnxruntime refuses the model)."""
    m = model([helper.make_node(op, ["x"], ["y"], name="n", **attrs)], [vi("x", [3])], [vi("y", [3])])
    msg = _one_line_error(ModelError, import_model, m)
    assert "'n'" in msg and f"requires: {missing}" in msg, msg


def test_attributes_of_the_declared_types_are_taken():
    nodes = [helper.make_node("Cast", ["x"], ["c"], to=TensorProto.DOUBLE),
             helper.make_node("LeakyRelu", ["c"], ["y"], alpha=0.5)]
    g = import_model(model(nodes, [vi("x", [3])], [vi("y", [3], TensorProto.DOUBLE)]))
    assert [n.attrs.get("alpha") for n in g.nodes if n.op_type == "LeakyRelu"] == [0.5]


def test_non_constant_shape_operand_is_unsupported():
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")]
    m = model(nodes, [vi("x", [2, 3]), vi("s", [2], TensorProto.INT64)], [vi("y", None)])
    assert "rs" in _one_line_error(UnsupportedOpError, import_model, m)


def test_unsupported_dtype():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3], TensorProto.FLOAT4E2M1)],
              [vi("y", [3], TensorProto.FLOAT4E2M1)])
    assert "FLOAT4E2M1" in _one_line_error(ModelError, import_model, m)


# Graph structure -----------------------------------------------------------------------------

def test_cycle():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second"),
             helper.make_node("Neg", ["b"], ["y"])]
    m = model(nodes, [vi("x", [3])], [vi("y", [3])])
    assert "cycle" in _one_line_error(ModelError, import_model, m)


def test_self_loop():
    m = model([helper.make_node("Add", ["x", "y"], ["y"], name="loop")], [vi("x", [3])], [vi("y", [3])])
    assert "cycle" in _one_line_error(ModelError, import_model, m)


def test_value_defined_by_two_nodes():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="n1"), helper.make_node("Neg", ["x"], ["a"], name="n2"),
             helper.make_node("Abs", ["a"], ["y"])]
    msg = _one_line_error(ModelError, import_model, model(nodes, [vi("x", [3])], [vi("y", [3])]))
    assert "defined twice" in msg and "n1" in msg and "n2" in msg


def test_node_redefining_an_input_or_initializer():
    nodes = [helper.make_node("Relu", ["x"], ["w"]), helper.make_node("Neg", ["w"], ["y"])]
    m = model(nodes, [vi("x", [3])], [vi("y", [3])], [init("w", np.ones(3, np.float32))])
    assert "defined twice" in _one_line_error(ModelError, import_model, m)


def test_initializer_defined_twice():
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [3])], [vi("y", [3])],
              [init("w", np.ones(3, np.float32)), init("w", np.zeros(3, np.float32))])
    assert "defined twice" in _one_line_error(ModelError, import_model, m)


def test_node_reads_an_undefined_value():
    nodes = [helper.make_node("Add", ["x", "ghost"], ["y"], name="adder")]
    msg = _one_line_error(ModelError, import_model, model(nodes, [vi("x", [3])], [vi("y", [3])]))
    assert "'ghost'" in msg and "adder" in msg


def test_graph_output_never_produced():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3])], [vi("y", [3]), vi("z", [3])])
    assert "'z'" in _one_line_error(ModelError, import_model, m)


def test_graph_input_that_is_not_a_tensor():
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [3])
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [3]), seq], [vi("y", [3])])
    assert "not a tensor" in _one_line_error(ModelError, import_model, m)


def test_shapes_that_do_not_fit():
    m = model([helper.make_node("Add", ["a", "b"], ["y"], name="bad_add")], [vi("a", [2, 3]), vi("b", [4])],
              [vi("y", None)])
    assert "bad_add" in _one_line_error(ShapeError, import_model, m)


def test_malformed_initializer_payload():
    t = init("w", np.ones(3, np.float32))
    t.raw_data = t.raw_data[:-2]
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [3])], [vi("y", [3])], [t])
    assert "'w'" in _one_line_error(ModelError, import_model, m)


def test_odd_node_names_are_kept():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="a/b c:0 ü"), helper.make_node("Neg", ["r"], ["y"], name="")]
    g = import_model(model(nodes, [vi("x", [3])], [vi("y", [3])]))
    assert [n.name for n in g.nodes] == ["a/b c:0 ü", "neg_0"]


def test_cli_style_loading_of_a_good_and_a_bad_file(tmp_path):
    """``load_model`` accepts os.PathLike, and the errors carry exit code 2."""
    good = tmp_path / "good.onnx"
    good.write_bytes(_good_model().SerializeToString())
    assert load_model(good).outputs[0].shape == (2, 3)
    with pytest.raises(OpfuseError) as e:
        load_model(_write(tmp_path, b"garbage"))
    assert e.value.exit_code == 2
    assert os.path.exists(good)


@pytest.mark.parametrize("op,opset,attrs", [("ReduceMean", 18, {"axes": [1]}), ("Squeeze", 13, {"axes": [0]}),
                                            ("Split", 13, {"split": [1, 1]})])
def test_operand_given_in_the_wrong_form_for_the_opset(op, opset, attrs):
    outs = ["a", "b"] if op == "Split" else ["y"]
    m = model([helper.make_node(op, ["x"], outs, **attrs)], [vi("x", [1, 2])], [vi(o, None) for o in outs],
              opset=opset)
    assert "as an input" in _one_line_error(ModelError, import_model, m)
