"""Ops imported through their ONNX function bodies (``frontend/onnx_functions.py``), and the
small rewrites CastLike -> Cast and Size -> constant: each model matches onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import import_and_compare, init, model, op_types, vi
from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx import import_model


def test_static_function_body_with_attribute_references():
    """Shrink's body reads its lambd/bias attributes through ref_attr_name (defaults when absent)."""
    nodes = [helper.make_node("Shrink", ["x"], ["y"], lambd=0.7, bias=0.2),
             helper.make_node("Shrink", ["x"], ["z"])]
    g = import_and_compare(model(nodes, [vi("x", [3, 4])], [vi("y", None), vi("z", None)], opset=18))
    assert "Shrink" not in op_types(g) and "Where" in op_types(g)


def test_context_dependent_function_rms_normalization():
    nodes = [helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-3)]
    m = model(nodes, [vi("x", [2, 3, 8])], [vi("y", None)],
              [init("s", np.linspace(0.5, 1.5, 8, dtype=np.float32))], opset=23)
    g = import_and_compare(m, export_opsets=())
    assert "ReduceMean" in op_types(g) and "Range" not in op_types(g)  # the axes were folded


def test_attention_becomes_the_chain_the_attention_rule_fuses():
    nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=1)]
    m = model(nodes, [vi("q", [1, 2, 5, 8]), vi("k", [1, 2, 5, 8]), vi("v", [1, 2, 5, 8])], [vi("y", None)],
              opset=23)
    g = import_and_compare(m, export_opsets=())
    assert {"MatMul", "Softmax"} <= set(op_types(g))


def test_an_op_the_body_needs_is_named():
    """Bernoulli's body draws with RandomUniformLike: refused naming both."""
    nodes = [helper.make_node("Bernoulli", ["p"], ["y"])]
    m = model(nodes, [vi("p", [2, 3])], [vi("y", None)], opset=22)
    with pytest.raises(UnsupportedOpError, match="Bernoulli.*function body.*RandomUniformLike"):
        import_model(m)


def test_castlike_is_a_cast_and_size_a_constant():
    nodes = [helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("CastLike", ["n", "x"], ["nf"]),
             helper.make_node("Mul", ["x", "nf"], ["y"])]
    g = import_and_compare(model(nodes, [vi("x", [2, 3])], [vi("y", None)], opset=21))
    assert op_types(g) == ["Mul"]
    nodes = [helper.make_node("CastLike", ["x", "i"], ["y"])]
    m = model(nodes, [vi("x", [4]), vi("i", [1], TensorProto.INT32)], [vi("y", None, TensorProto.INT32)], opset=19)
    g = import_and_compare(m)
    assert op_types(g) == ["Cast"] and g.outputs[0].dtype == np.int32
