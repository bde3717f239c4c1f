"""Ops whose output shape depends on input values (``frontend/onnx_data_shapes.py``): Compress with
a known condition is a Gather; NonZero, Unique and NonMaxSuppression with known inputs are folded;
a deciding value computed at run time is one ``ShapeInputError`` line naming the node."""
import numpy as np
import pytest
from onnx import helper

import opfuse
from misc_ops_support import check_against_onnx_reference, one_node_model
from opfuse.api import load_for_arrays
from opfuse.errors import ModelError, ShapeInputError
from opfuse.frontend.onnx import import_model

RNG = np.random.default_rng(8)


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_with_a_constant_condition_is_a_gather(axis):
    feeds = {"x": RNG.standard_normal((4, 3)).astype(np.float32)}
    n = 12 if axis is None else (4 if axis == 0 else 3)
    cond = np.arange(n) % 2 == 0
    attrs = {} if axis is None else {"axis": axis}
    m = one_node_model("Compress", feeds, attrs, opset=11, initializers={"cond": cond})
    g, _ = check_against_onnx_reference(m, feeds, rtol=0, atol=0)
    assert [n.op_type for n in g.nodes] == (["Reshape", "Gather"] if axis is None else ["Gather"])


def test_compress_condition_from_a_graph_input_is_bound_by_the_run():
    """A run's condition binds the compiled model (SpecializingModel): one build per condition."""
    x = RNG.standard_normal((5, 2)).astype(np.float32)
    m = one_node_model("Compress", {"x": x, "cond": np.zeros(5, bool)}, {"axis": 0}, opset=11)
    with pytest.raises(ShapeInputError, match=r"node 'compress_0'.*condition.*graph input\(s\) \['cond'\]"):
        import_model(m)
    model = opfuse.compile(m)
    for cond in (np.array([1, 0, 1, 1, 0], bool), np.array([0, 1, 0, 0, 0], bool)):
        np.testing.assert_array_equal(model.run({"x": x, "cond": cond})["y0"], x[cond])


def test_nonzero_unique_and_nms_on_known_inputs_are_constants():
    x = np.array([[0, 2, 0], [3, 0, 3]], np.int64)
    m = one_node_model("NonZero", {}, {}, opset=13, initializers={"x": x})
    g, _ = check_against_onnx_reference(m, {}, c=False)
    assert [n.op_type for n in g.nodes if n.op_type != "Identity"] == []
    for attrs, x in (({"sorted": 1}, [[2, 1], [1, 3], [2, 1]]), ({"sorted": 0}, [2, 1, 1, 3, 4, 3]),
                     ({"sorted": 1, "axis": 0}, [[2, 1], [1, 3], [2, 1]])):
        m = one_node_model("Unique", {}, attrs, opset=11, n_outputs=4, initializers={"x": np.array(x, np.float32)})
        check_against_onnx_reference(m, {}, c=False)
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 10, 1, 11]]], np.float32)
    scores = np.array([[[0.9, 0.75, 0.6]]], np.float32)
    inits = {"b": boxes, "s": scores, "k": np.array([2], np.int64), "iou": np.array([0.5], np.float32)}
    m = one_node_model("NonMaxSuppression", {}, {}, opset=11, initializers=inits)
    check_against_onnx_reference(m, {}, c=False)


def test_a_value_that_decides_a_shape_computed_in_the_graph_names_the_node_and_its_inputs():
    """NonZero of a value computed from the graph input: bound from a run's input, else refused."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["y0"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [2, 3])],
                          [helper.make_tensor_value_info("y0", 7, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    message = r"'NonZero' \(node 'nonzero_0'.*input 0 \(X\) must be a constant.*\['x'\]"
    with pytest.raises(ShapeInputError, match=message):
        import_model(m)
    x = np.array([[1, -1, 0], [2, 0, 3]], np.float32)
    graph, values = load_for_arrays(m, None, {"x": x})
    assert list(values) == ["x"]
    np.testing.assert_array_equal(graph.outputs[0].const, np.array(np.nonzero(np.maximum(x, 0))))


def test_compress_condition_selecting_past_the_axis_is_refused():
    feeds = {"x": np.zeros((2, 3), np.float32)}
    m = one_node_model("Compress", feeds, {"axis": 0}, opset=11, initializers={"cond": np.array([0, 1, 1], bool)})
    with pytest.raises(ModelError, match="selects index 2 of an axis of 2"):
        import_model(m)
