"""``opfuse ops``: every standard ONNX operator in one kind, from the importer's own tables, and
every refusal with its reason."""
import json

import onnx
import pytest
from onnx import TensorProto, helper

from opfuse.cli import main
from opfuse.frontend import coverage
from opfuse.frontend.onnx import import_model
from opfuse.errors import OpfuseError


@pytest.fixture(scope="module")
def rows():
    return {r.op: r for r in coverage.coverage()}


def test_every_standard_operator_has_one_kind(rows):
    assert set(rows) == set(coverage.standard_schemas())
    assert all(r.kind in coverage.KINDS for r in rows.values())
    assert all(r.detail for r in rows.values() if r.kind == "refused")  # every refusal says why
    assert sum(coverage.summary(list(rows.values())).values()) == len(rows)


def test_kinds_follow_the_importer(rows):
    assert rows["Conv"].kind == "op"
    assert rows["Einsum"].kind == "rewritten"
    assert rows["Loop"].kind == "folded" and rows["SequenceAt"].kind == "folded"
    assert rows["Dropout"].kind == "removed"
    assert rows["Swish"].kind == "function"
    assert rows["SwiGLU"].kind == "function"  # its body uses Swish, itself a function opfuse takes
    assert rows["RandomNormal"].kind == "refused" and "random" in rows["RandomNormal"].detail
    assert rows["StringSplit"].kind == "refused" and "string" in rows["StringSplit"].detail


def _one_node(op: str, opset: int, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, [], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_refused_operator_is_refused_by_the_importer(rows):
    """The table and the importer agree: what the table refuses does not import."""
    assert rows["RandomNormal"].kind == "refused"
    with pytest.raises(OpfuseError):
        import_model(_one_node("RandomNormal", 17, shape=[2]))
    # ... and a function op it takes imports (Swish at opset 24: Sigmoid and Mul)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    g = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)]))
    assert {n.op_type for n in g.nodes} <= {"Sigmoid", "Mul", "Cast"}


def test_cli_lists_refused_ops_with_reasons(capsys):
    assert main(["ops", "--kind", "refused"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith(f"{len(coverage.standard_schemas()) - len(out[:-1])} of ")
    assert all(line.split()[1] == "refused" for line in out[:-1])
    assert main(["ops", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["ops"]) == len(coverage.standard_schemas())
    assert data["counts"]["refused"] == len(out) - 1
