"""Helpers for frontend tests: small ONNX models by hand, onnxruntime runs, and comparisons."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.frontend.onnx import export_model, import_model
from opfuse.runtime.reference import random_inputs, run
from opfuse.testing import ort_oracle

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
I64 = TensorProto.INT64

# Float32 models computed in a different order (or float64 internally by our reference).
RTOL = 1e-4
ATOL = 1e-5


def vi(name: str, shape, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def init(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def ints(name: str, values) -> onnx.TensorProto:
    return init(name, np.array(values, dtype=np.int64))


def model(nodes, inputs, outputs, initializers=(), opset: int = 17, name: str = "g") -> onnx.ModelProto:
    g = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=list(initializers))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    return m


def ort_run(m: onnx.ModelProto, feeds: dict, *, fused: bool = True) -> dict[str, np.ndarray]:
    """onnxruntime's outputs, its 8-bit products with uint8 operands exact on every CPU (``ort_oracle``);
    ``fused=False``: its graph optimizations off (a QDQ model in float, not as a saturating 8-bit product)."""
    return ort_oracle.run(m, feeds, fused=fused)


def assert_close(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs), (list(ours), list(theirs))
    for k in ours:
        a, b = np.asarray(ours[k]), np.asarray(theirs[k])
        assert a.shape == b.shape, (k, a.shape, b.shape)
        assert a.dtype == b.dtype, (k, a.dtype, b.dtype)
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=RTOL, atol=ATOL, err_msg=k)


def check_onnx(m: onnx.ModelProto) -> None:
    onnx.checker.check_model(m, full_check=True)


def import_and_compare(m: onnx.ModelProto, input_shapes=None, seed: int = 0, export_opsets=(None,)):
    """Import ``m``; the reference run of the graph equals onnxruntime on ``m``; every export
    at ``export_opsets`` passes the checker and runs in onnxruntime with the same outputs.
    Returns the imported graph."""
    g = import_model(m, input_shapes)
    feeds = random_inputs(g, seed)
    ours = run(g, feeds)
    assert_close(ours, ort_run(m, feeds))
    for opset in export_opsets:
        e = export_model(g, opset)
        check_onnx(e)
        assert_close(ort_run(e, feeds), ours)
    return g


def op_types(g) -> list[str]:
    return [n.op_type for n in g.nodes]
