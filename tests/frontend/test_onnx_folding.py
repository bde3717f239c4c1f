"""Static-shape folding during import: shape chains resolve, large tensors stay nodes."""
import numpy as np
import pytest
from onnx import helper

from onnx_builders import I64, import_and_compare, init, ints, model, op_types, vi
from opfuse.frontend.onnx import FOLD_MAX_ELEMENTS, import_model


def _pytorch_flatten(opset: int = 13):
    """``x.view(x.size(0), -1)`` as torch.onnx exports it."""
    if opset >= 13:
        unsq = helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"])
        extra = [ints("zero_axes", [0])]
    else:
        unsq = helper.make_node("Unsqueeze", ["n"], ["n1"], axes=[0])
        extra = []
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "idx"], ["n"], axis=0),
        unsq,
        helper.make_node("Concat", ["n1", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [init("idx", np.array(0, np.int64)), ints("minus_one", [-1])] + extra
    return model(nodes, [vi("x", ["N", 3, 4, 4])], [vi("y", None)], inits, opset=opset)


@pytest.mark.parametrize("opset", [11, 13])
def test_shape_gather_unsqueeze_concat_reshape_becomes_a_constant_shape(opset):
    g = import_and_compare(_pytorch_flatten(opset), {"x": (2, 3, 4, 4)})
    assert op_types(g) == ["Reshape"]
    shape = g.nodes[0].inputs[1]
    assert shape.is_const and shape.const.tolist() == [2, -1]
    assert g.outputs[0].shape == (2, 48)
    # The intermediate shape values are gone, not just unused.
    assert not {"shape", "n", "n1"} & set(g.values)


def test_batch_size_flows_into_the_folded_shape():
    g = import_model(_pytorch_flatten(), {"x": (5, 3, 4, 4)})
    assert g.nodes[0].inputs[1].const.tolist() == [5, -1]


def test_shape_of_a_computed_value_folds_too():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["z"], value=helper.make_tensor("v", 1, [1], [2.0])),
             helper.make_node("Mul", ["r", "z"], ["y"])]
    g = import_and_compare(model(nodes, [vi("x", [2, 3])], [vi("y", None)]))
    assert op_types(g) == ["Relu", "Mul"]
    np.testing.assert_array_equal(g.nodes[1].inputs[1].const, np.full((2, 3), 2.0))


def test_small_constant_subgraph_is_evaluated():
    nodes = [helper.make_node("Add", ["a", "b"], ["c"]), helper.make_node("Mul", ["x", "c"], ["y"])]
    inits = [init("a", np.ones(4, np.float32)), init("b", np.arange(4, dtype=np.float32))]
    g = import_and_compare(model(nodes, [vi("x", [4])], [vi("y", [4])], inits))
    assert op_types(g) == ["Mul"]
    np.testing.assert_array_equal(g.nodes[0].inputs[1].const, [1, 2, 3, 4])
    assert {"a", "b"}.isdisjoint(g.values)


def test_large_constant_results_are_not_folded():
    n = FOLD_MAX_ELEMENTS + 1
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], value=helper.make_tensor("v", 1, [1], [1.0])),
             helper.make_node("Add", ["x", "big"], ["y"])]
    g = import_model(model(nodes, [vi("x", [n])], [vi("y", [n])], [ints("shape", [n])]))
    assert op_types(g) == ["ConstantOfShape", "Add"]
    assert g.values["big"].const is None and g.values["big"].shape == (n,)


def test_fold_limit_is_inclusive():
    n = FOLD_MAX_ELEMENTS
    nodes = [helper.make_node("Neg", ["w"], ["nw"]), helper.make_node("Add", ["x", "nw"], ["y"])]
    g = import_model(model(nodes, [vi("x", [n])], [vi("y", [n])], [init("w", np.ones(n, np.float32))]))
    assert op_types(g) == ["Add"]


def test_graph_output_that_folds_keeps_its_name():
    nodes = [helper.make_node("Shape", ["x"], ["s"])]
    g = import_and_compare(model(nodes, [vi("x", [2, 7])], [vi("s", [2], I64)]))
    assert g.nodes == [] and g.outputs[0].name == "s" and g.outputs[0].const.tolist() == [2, 7]


def test_shape_with_start_and_end_folds():
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=1, end=-1),
             helper.make_node("Reshape", ["x", "s2"], ["y"]),
             helper.make_node("Concat", ["one", "s"], ["s2"], axis=0)]
    g = import_and_compare(model(nodes, [vi("x", [2, 3, 4])], [vi("y", None)], [ints("one", [-1])], opset=15))
    assert g.nodes[0].inputs[1].const.tolist() == [-1, 3]
