"""Ops imported as a few canonical ops (``frontend/onnx_decompose.py``), against onnxruntime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_builders import assert_close, import_and_compare, init, model, op_types, ort_run, vi
from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx import import_model
from opfuse.runtime.reference import run

U8, I8 = TensorProto.UINT8, TensorProto.INT8
RNG = np.random.default_rng(3)


@pytest.mark.parametrize("zp_dtype", [np.uint8, np.int8, np.int16, None])
@pytest.mark.parametrize("per", ["tensor", "axis"])
def test_quantize_dequantize_round_trip(zp_dtype, per):
    scale = np.float32(0.05) if per == "tensor" else np.array([0.02, 0.05, 0.1], np.float32)
    inits = [init("s", scale)]
    names = ["x", "s"]
    if zp_dtype is not None:
        zp = np.array(3, zp_dtype) if per == "tensor" else np.array([0, 3, 9], zp_dtype)
        inits.append(init("zp", zp))
        names.append("zp")
    nodes = [helper.make_node("QuantizeLinear", names, ["q"], axis=1),
             helper.make_node("DequantizeLinear", ["q"] + names[1:], ["y"], axis=1)]
    qtype = helper.np_dtype_to_tensor_dtype(np.dtype(zp_dtype or np.uint8))
    m = model(nodes, [vi("x", [2, 3, 4])], [vi("q", None, qtype), vi("y", None)], inits, opset=21)
    g = import_model(m)
    x = (RNG.standard_normal((2, 3, 4)) * 5).astype(np.float32)
    x[0, 0, :2] = [0.025, -0.075]  # exact halves round to even
    assert_close(run(g, {"x": x}), ort_run(m, {"x": x}))
    assert "QuantizeLinear" not in op_types(g) and "Round" in op_types(g)


def test_blocked_dequantize_matches_onnxruntime():
    scale = np.array([[0.5, 2.0], [1.5, 0.25]], np.float32)
    zp = np.array([[1, -2], [0, 3]], np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["x", "s", "zp"], ["y"], axis=1, block_size=3)]
    m = model(nodes, [vi("x", [2, 5], I8)], [vi("y", None)], [init("s", scale), init("zp", zp)], opset=21)
    g = import_model(m)
    x = RNG.integers(-100, 100, (2, 5)).astype(np.int8)
    assert_close(run(g, {"x": x}), ort_run(m, {"x": x}))


def test_quantize_to_an_unsupported_type_is_refused():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"], output_dtype=TensorProto.INT4)]
    m = model(nodes, [vi("x", [4])], [vi("q", None, TensorProto.INT4)], [init("s", np.float32(0.1))], opset=21)
    with pytest.raises(UnsupportedOpError, match="output type"):
        import_model(m)


@pytest.mark.parametrize("p,axis", [(1, 0), (2, -1)])
def test_lp_normalization(p, axis):
    nodes = [helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)]
    import_and_compare(model(nodes, [vi("x", [3, 4])], [vi("y", None)], opset=17))


@pytest.mark.parametrize("p,attrs", [(2, {"pads": [1, 1, 1, 1]}), (1, {"strides": [2, 2]}),
                                     (3, {"auto_pad": "SAME_UPPER"}), (2, {"dilations": [2, 1]})])
def test_lp_pool(p, attrs):
    nodes = [helper.make_node("LpPool", ["x"], ["y"], p=p, kernel_shape=[3, 2], **attrs)]
    import_and_compare(model(nodes, [vi("x", [1, 2, 7, 6])], [vi("y", None)], opset=19), export_opsets=(19,))


def test_instance_normalization():
    nodes = [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)]
    inits = [init("s", RNG.standard_normal(3).astype(np.float32)), init("b", RNG.standard_normal(3).astype(np.float32))]
    g = import_and_compare(model(nodes, [vi("x", [2, 3, 4, 5])], [vi("y", None)], inits, opset=17))
    assert op_types(g) == ["LayerNormalization", "Mul", "Add"]


def test_eye_like_is_a_constant():
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], k=1, dtype=TensorProto.INT32),
             helper.make_node("Cast", ["e"], ["ef"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "ef"], ["y"])]
    g = import_and_compare(model(nodes, [vi("x", [3, 4])], [vi("y", None)], opset=17))
    assert op_types(g) == ["Add"]


@pytest.mark.parametrize("size", [3, 5])  # onnxruntime takes odd sizes only
def test_lrn(size):
    nodes = [helper.make_node("LRN", ["x"], ["y"], size=size, alpha=2e-3, beta=0.6, bias=1.5)]
    g = import_and_compare(model(nodes, [vi("x", [2, 6, 3, 4])], [vi("y", None)], opset=17))
    assert "AveragePool" in op_types(g)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p):
    nodes = [helper.make_node("GlobalLpPool", ["x"], ["y"], p=p)]
    import_and_compare(model(nodes, [vi("x", [2, 3, 4, 5])], [vi("y", None)], opset=17))
