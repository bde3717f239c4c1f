"""The size limit on one tensor: checked before anything is allocated, folded or planned."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.errors import SizeLimitError
from opfuse.ops import GraphBuilder
from opfuse.ops.limits import DEFAULT_MAX_TENSOR_BYTES, MAX_TENSOR_BYTES_ENV, max_tensor_bytes, parse_bytes
from opfuse.runtime.reference import random_inputs, run


def onnx_model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_default_and_override(monkeypatch):
    monkeypatch.delenv(MAX_TENSOR_BYTES_ENV, raising=False)
    assert max_tensor_bytes() == DEFAULT_MAX_TENSOR_BYTES == 8 << 30
    monkeypatch.setenv(MAX_TENSOR_BYTES_ENV, "16G")
    assert max_tensor_bytes() == 16 << 30
    assert parse_bytes("512KiB") == 512 << 10 and parse_bytes("1048576") == 1 << 20
    monkeypatch.setenv(MAX_TENSOR_BYTES_ENV, "lots")
    with pytest.raises(SizeLimitError, match=f"{MAX_TENSOR_BYTES_ENV}.*'lots'"):
        max_tensor_bytes()


def test_constant_of_shape_is_refused_before_planning_allocates_it():
    """131 bytes of ONNX that made `compile` allocate 32 GiB while planning memory."""
    from opfuse.compiler import plan_model
    shape = numpy_helper.from_array(np.array([65536, 65536], np.int64), "shp")
    m = onnx_model([helper.make_node("ConstantOfShape", ["shp"], ["c"], name="cos"),
                    helper.make_node("ReduceSum", ["c"], ["y"], keepdims=0)],
                   [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [shape])
    with pytest.raises(SizeLimitError, match=r"'cos'.*\(65536, 65536\) float32.*16.0 GiB.*8.0 GiB"):
        plan_model(m)


def test_conv_with_huge_pads_is_refused_at_inference():
    b = GraphBuilder()
    x = b.input("x", (1, 1, 4, 4))
    with pytest.raises(SizeLimitError, match=r"'c0' \(Conv\).*2147483652.*GiB"):
        b.op("Conv", x, b.const("w", np.ones((1, 1, 1, 1), np.float32)), pads=[2 ** 31, 0, 0, 0], name="c0")


def test_padded_input_is_checked_even_when_the_output_is_small():
    b = GraphBuilder()
    x = b.input("x", (1, 1, 4, 4))
    with pytest.raises(SizeLimitError, match="'p0' \\(MaxPool\\): the padded input"):
        b.op("MaxPool", x, kernel_shape=[1, 2 ** 31 + 1], pads=[0, 0, 0, 2 ** 31], name="p0")
    with pytest.raises(SizeLimitError, match="'c1' \\(Conv\\): the padded input"):
        b.op("Conv", x, b.const("w", np.ones((1, 1, 1, 1), np.float32)), pads=[0, 0, 0, 2 ** 31],
             strides=[1, 2 ** 31], name="c1")


def test_conv_transpose_buffer_is_checked():
    b = GraphBuilder()
    x = b.input("x", (1, 1, 2, 2))
    w = b.const("w", np.ones((1, 1, 1, 1), np.float32))
    with pytest.raises(SizeLimitError, match="'ct' \\(ConvTranspose\\): the full"):
        b.op("ConvTranspose", x, w, strides=[2 ** 31, 1], pads=[2 ** 31 - 1, 0, 0, 0], name="ct")


def test_huge_graph_input_is_refused_at_import_and_by_random_inputs():
    from opfuse.frontend.onnx import import_model
    m = onnx_model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1024] * 4)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(SizeLimitError, match=r"graph input 'x'.*4.0 TiB"):
        import_model(m)
    g = GraphBuilder()
    g.input("big", (1 << 20, 1 << 20), "int8")  # 1 TiB, never inferred: only random_inputs sees it
    with pytest.raises(SizeLimitError, match="random input 'big'.*1.0 TiB"):
        random_inputs(g.graph)


def test_a_smaller_limit_refuses_small_tensors_and_a_larger_one_admits_them(monkeypatch):
    monkeypatch.setenv(MAX_TENSOR_BYTES_ENV, "1K")
    b = GraphBuilder()
    x = b.input("x", (16, 32))
    with pytest.raises(SizeLimitError, match=r"'r'.*2.0 KiB \(2,048 bytes\).*1.0 KiB"):
        b.op("Relu", x, name="r")
    monkeypatch.setenv(MAX_TENSOR_BYTES_ENV, "4K")  # random floats are drawn in float64
    b = GraphBuilder()
    g = b.build(b.op("Relu", b.input("x", (16, 32)), name="r2"))
    assert run(g, random_inputs(g))["r2"].shape == (16, 32)
