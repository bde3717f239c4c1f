"""Helpers for the differential tests: onnxruntime runs, comparisons, and the known
discrepancies that the differential tests leave out (each one explained where it is defined)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from opfuse.ir.graph import Graph, Node

ort = pytest.importorskip("onnxruntime")

# onnxruntime computes in float32, the reference in float64 per op (rounded to float32 between
# ops): the difference is a few ulp per op, well inside these.
RTOL = 1e-4
ATOL = 1e-5

# Resize coordinate modes whose source coordinate divides by the output length.
_OUTPUT_LENGTH_MODES = ("align_corners", "pytorch_half_pixel")


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds), strict=True))


def assert_close(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray], *,
                 rtol: float = RTOL, atol: float = ATOL) -> None:
    assert list(ours) == list(theirs), (list(ours), list(theirs))
    for name in ours:
        a, b = np.asarray(ours[name]), np.asarray(theirs[name])
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert a.dtype == b.dtype, (name, a.dtype, b.dtype)
        np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=rtol, atol=atol,
                                   err_msg=name)


def resize_output_length_is_fractional(node: Node) -> bool:
    """A Resize by ``scales`` in align_corners / pytorch_half_pixel mode where ``scale * length``
    is not a whole number on some axis.

    Those modes divide by the *output length*. The ONNX reference implementation (and opfuse,
    which follows it) uses the unrounded ``scale * length``; onnxruntime uses the integer output
    size. Example: length 3, scale 0.5, linear, pytorch_half_pixel: opfuse and onnx.reference
    read position 0.5 (the mean of x[0] and x[1]), onnxruntime reads x[0]. The ONNX spec text
    ("length_resized") does not say which; the discrepancy is reported, not "fixed" here.
    """
    mode = node.attrs.get("coordinate_transformation_mode")
    if node.op_type != "Resize" or mode not in _OUTPUT_LENGTH_MODES:
        return False
    scales = node.inputs[2] if len(node.inputs) > 2 else None
    if scales is None or scales.const is None or scales.const.size == 0:
        return False
    lengths = np.asarray(scales.const, dtype=np.float64) * np.asarray(node.inputs[0].shape)
    return bool(np.any(lengths != np.floor(lengths)))


def pool_ceil_mode_drops_last_window(node: Node) -> bool:
    """A ceil_mode pool whose last window would start past the input (in the right padding).

    onnxruntime, onnx.reference and opfuse drop that window (as PyTorch does), but onnx's C++
    shape inference (onnx 1.23) still counts it, so ``onnx.checker.check_model(full_check=True)``
    rejects the exported shape that every runtime computes. Example: MaxPool over length 16,
    kernel 1, stride 2, ceil_mode=1 gives 8 values; shape inference says 9.
    """
    if node.op_type not in ("MaxPool", "AveragePool") or not node.attrs.get("ceil_mode"):
        return False
    x, y = node.inputs[0].shape, node.outputs[0].shape
    kernel = node.attrs["kernel_shape"]
    n = len(kernel)
    strides = node.attrs.get("strides") or [1] * n
    dilations = node.attrs.get("dilations") or [1] * n
    pads = node.attrs.get("pads") or [0] * (2 * n)
    for i in range(n):
        span = x[2 + i] + pads[i] + pads[n + i] - ((kernel[i] - 1) * dilations[i] + 1)
        if -(-span // strides[i]) + 1 != y[2 + i]:
            return True
    return False


def known_ort_discrepancy(graph: Graph) -> bool:
    """Whether onnxruntime is known to compute ``graph`` differently from the ONNX reference."""
    return any(resize_output_length_is_fractional(n) for n in graph.nodes)


def full_check_rejects(graph: Graph) -> bool:
    """Whether onnx's strict shape inference is known to reject the correct export of ``graph``."""
    return any(pool_ceil_mode_drops_last_window(n) for n in graph.nodes)


def check_onnx(model: onnx.ModelProto, graph: Graph) -> None:
    onnx.checker.check_model(model, full_check=not full_check_rejects(graph))
