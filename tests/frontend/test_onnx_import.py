"""Import basics: constants, removed no-ops, names, ordering, dead code."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import F, I64, import_and_compare, init, model, op_types, ort_run, vi
from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx import import_model
from opfuse.runtime.reference import run


def test_constant_nodes_and_initializers_become_constants():
    nodes = [
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("t", F, [3], [1.0, 2.0, 3.0])),
        helper.make_node("Constant", [], ["s"], value_float=0.5),
        helper.make_node("Constant", [], ["v"], value_floats=[1.0, -1.0, 2.0]),
        helper.make_node("Add", ["x", "c"], ["a"]),
        helper.make_node("Mul", ["a", "s"], ["b"]),
        helper.make_node("Sub", ["b", "v"], ["d"]),
        helper.make_node("Add", ["d", "w"], ["y"]),
    ]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], [init("w", np.arange(3, dtype=np.float32))])
    g = import_and_compare(m)
    assert op_types(g) == ["Add", "Mul", "Sub", "Add"]
    consts = {v.name: v.const for v in g.constants}
    np.testing.assert_array_equal(consts["c"], [1, 2, 3])
    assert consts["s"].shape == () and consts["s"].dtype == np.float32
    np.testing.assert_array_equal(consts["w"], [0, 1, 2])
    assert all(v.producer is None for v in g.constants)


def test_identity_and_dropout_are_removed():
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Identity", ["r"], ["i"]),
        helper.make_node("Dropout", ["i", "ratio", "mode"], ["d"]),
        helper.make_node("Sigmoid", ["d"], ["y"], name="sig"),
    ]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])],
              [init("ratio", np.array(0.3, np.float32)), init("mode", np.array(False))], opset=13)
    g = import_and_compare(m)
    assert op_types(g) == ["Relu", "Sigmoid"]
    assert g.node("sig").inputs[0] is g.node("relu").output


def test_dropout_opset11_ratio_attribute_and_unused_mask():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"], ratio=0.2),
             helper.make_node("Tanh", ["d"], ["y"])]
    g = import_and_compare(model(nodes, [vi("x", [4])], [vi("y", [4])], opset=11))
    assert op_types(g) == ["Tanh"]


def test_dropout_mask_that_is_read_is_all_true():
    nodes = [helper.make_node("Dropout", ["x"], ["d", "mask"]),
             helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["d", "m"], ["y"])]
    g = import_and_compare(model(nodes, [vi("x", [2, 2])], [vi("y", [2, 2])], opset=13))
    x = np.zeros((2, 2), np.float32)
    np.testing.assert_array_equal(run(g, {"x": x})["y"], np.ones((2, 2)))


def test_training_mode_dropout_is_refused():
    nodes = [helper.make_node("Dropout", ["x", "", "mode"], ["y"], name="drop")]
    m = model(nodes, [vi("x", [4])], [vi("y", [4])], [init("mode", np.array(True))], opset=13)
    with pytest.raises(UnsupportedOpError, match="training_mode") as e:
        import_model(m)
    assert "drop" in str(e.value)


def test_output_name_kept_when_identity_is_removed():
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["out"])]
    g = import_and_compare(model(nodes, [vi("x", [3])], [vi("out", [3])]))
    assert [v.name for v in g.outputs] == ["out"]
    assert op_types(g) == ["Relu"] and "r" not in g.values


def test_identity_kept_where_the_name_needs_it():
    """Output = Identity(input), and two outputs naming the same value: names survive."""
    nodes = [helper.make_node("Identity", ["x"], ["same"]),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Identity", ["r"], ["o1"]),
             helper.make_node("Identity", ["r"], ["o2"])]
    m = model(nodes, [vi("x", [3])], [vi("same", [3]), vi("r", [3]), vi("o1", [3]), vi("o2", [3])])
    g = import_and_compare(m)
    assert [v.name for v in g.outputs] == ["same", "r", "o1", "o2"]
    assert sorted(op_types(g)) == ["Identity", "Identity", "Identity", "Relu"]


def test_nodes_out_of_order_are_sorted():
    nodes = [helper.make_node("Sigmoid", ["b"], ["y"], name="last"),
             helper.make_node("Relu", ["a"], ["b"], name="middle"),
             helper.make_node("Neg", ["x"], ["a"], name="first")]
    g = import_and_compare(model(nodes, [vi("x", [5])], [vi("y", [5])]))
    assert [n.name for n in g.nodes] == ["first", "middle", "last"]


def test_unnamed_and_repeated_node_names_are_made_unique_deterministically():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Neg", ["b"], ["c"], name="n"),
             helper.make_node("Neg", ["c"], ["d"], name="n"),
             helper.make_node("Abs", ["d"], ["y"], name="relu_0")]
    m = model(nodes, [vi("x", [2])], [vi("y", [2])])
    names = [n.name for n in import_model(m).nodes]
    assert names == ["relu_1", "relu_2", "n", "n_0", "relu_0"]
    assert names == [n.name for n in import_model(m).nodes]


def test_opset_and_name_of_the_graph():
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [1])], [vi("y", [1])], opset=15, name="net")
    g = import_model(m)
    assert g.opset == 15 and g.name == "net"


def test_initializer_listed_as_input_stays_a_constant():
    """IR version 3 models list every initializer among the graph inputs."""
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    m = model(nodes, [vi("x", [2]), vi("w", [2])], [vi("y", [2])], [init("w", np.ones(2, np.float32))])
    g = import_model(m)
    assert [v.name for v in g.inputs] == ["x"]
    assert g.values["w"].is_const


def test_dead_nodes_are_dropped_and_unused_inputs_kept():
    nodes = [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["unused"])]
    g = import_model(model(nodes, [vi("x", [2]), vi("spare", [1])], [vi("y", [2])]))
    assert op_types(g) == ["Relu"]
    assert [v.name for v in g.inputs] == ["x", "spare"]


def test_clip_attribute_bounds_become_inputs():
    """The pre-opset-11 attribute form, still accepted when it shows up."""
    nodes = [helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25)]
    m = model(nodes, [vi("x", [6])], [vi("y", [6])], opset=11)
    g = import_model(m)
    clip = g.nodes[0]
    assert clip.attrs == {} and [v.const.item() for v in clip.inputs[1:]] == [-0.5, 0.25]
    x = np.linspace(-1, 1, 6, dtype=np.float32)
    np.testing.assert_allclose(run(g, {"x": x})["y"], np.clip(x, -0.5, 0.25))


def test_clip_with_input_bounds_and_a_missing_min():
    nodes = [helper.make_node("Clip", ["x", "", "hi"], ["y"])]
    m = model(nodes, [vi("x", [6])], [vi("y", [6])], [init("hi", np.array(0.1, np.float32))], opset=11)
    import_and_compare(m)


def test_sparse_initializer_is_densified():
    values = init("sp", np.array([5.0, 7.0], np.float32))
    indices = init("sp_idx", np.array([1, 4], np.int64))
    sparse = helper.make_sparse_tensor(values, indices, [2, 3])
    nodes = [helper.make_node("Add", ["x", "sp"], ["y"])]
    g = helper.make_graph(nodes, "g", [vi("x", [2, 3])], [vi("y", [2, 3])], sparse_initializer=[sparse])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    imported = import_model(m)
    np.testing.assert_array_equal(imported.values["sp"].const, [[0, 5, 0], [0, 7, 0]])


def test_shape_inference_reaches_every_value():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Relu", ["m"], ["y"])]
    m = model(nodes, [vi("x", ["N", 4])], [vi("y", None)], [init("w", np.ones((4, 5), np.float32))])
    g = import_model(m, {"x": (3, 4)})
    assert g.values["y"].shape == (3, 5) and g.values["m"].dtype == np.float32


def test_integer_and_bool_tensors_round_trip():
    nodes = [helper.make_node("Equal", ["a", "b"], ["e"]),
             helper.make_node("Where", ["e", "a", "b"], ["y"])]
    m = model(nodes, [vi("a", [4], I64), vi("b", [4], I64)], [vi("y", [4], I64)])
    g = import_and_compare(m)
    feeds = {"a": np.array([1, 2, 3, 4]), "b": np.array([1, 0, 3, 0])}
    np.testing.assert_array_equal(run(g, feeds)["y"], ort_run(m, feeds)["y"])


def test_opset_range_accepts_ai_onnx_domain_name():
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], domain="ai.onnx")], "g",
                          [vi("x", [2])], [vi("y", [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx", 12)])
    assert import_model(m).opset == 12


def test_constant_shares_no_storage_with_later_folding():
    """A constant used by a folded node and by the graph stays a separate, unchanged value."""
    nodes = [helper.make_node("Neg", ["c"], ["nc"]), helper.make_node("Add", ["x", "nc"], ["y"]),
             helper.make_node("Add", ["y", "c"], ["z"])]
    m = model(nodes, [vi("x", [2])], [vi("z", [2])], [init("c", np.array([1.0, 2.0], np.float32))])
    g = import_and_compare(m)
    assert op_types(g) == ["Add", "Add"]
    np.testing.assert_array_equal(g.values["c"].const, [1, 2])
