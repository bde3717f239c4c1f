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


def affine_grid_of_one_position_with_corners(node: Node) -> bool:
    """An AffineGrid with ``align_corners=1`` over a spatial axis of length 1.

    The corner positions of a single sample are undefined (a step of 2 / (L - 1) = 2 / 0). opfuse,
    like PyTorch's ``affine_grid`` (``linspace_from_neg_one`` returns 0 for one step), puts it at the
    centre, 0; the ONNX reference implementation divides by zero, onnxruntime takes another position
    (theta's grid for sizes [1, 6, 1, 1]: opfuse 1.2964 = the translation, onnxruntime 1.1430, the ONNX
    reference 1.4498); measured, not "fixed" here."""
    if node.op_type != "AffineGrid" or not int(node.attrs.get("align_corners", 0)):
        return False
    size = node.inputs[1].const if len(node.inputs) > 1 and node.inputs[1] is not None else None
    return size is not None and bool(np.any(np.asarray(size).reshape(-1)[2:] == 1))


def col2im_over_one_axis(node: Node) -> bool:
    """A Col2Im with one spatial axis (``image_shape`` of length 1).

    onnxruntime 1.2x puts every channel after the first in the wrong place or drops it, wherever the
    image is longer than one block: x = 1..8 as (1, 8, 1), image [7], block [4], dilation 2 gives
    [1 0 2 0 3 0 4 | 5 0 6 0 7 0 8] in opfuse and the ONNX reference implementation, [1 0 2 0 3 0 4 | 8 0 0 0
    0 0 0] in onnxruntime; the same columns as a 2-D image [1, 7] agree in all three."""
    if node.op_type != "Col2Im":
        return False
    image = node.inputs[1].const if node.inputs[1] is not None else None
    return image is not None and np.asarray(image).size == 1


def max_unpool_into_a_larger_output_shape(node: Node) -> bool:
    """A MaxUnpool whose ``output_shape`` is larger than the shape the unpooling infers.

    The ONNX spec's node test (``maxunpool_export_with_output_shape``) places the inferred shape in a corner
    of ``output_shape`` and reads the indices there; opfuse does so (and the ONNX reference implementation).
    onnxruntime reads the indices as flat positions in ``output_shape`` (it leaves that node test out)."""
    if node.op_type != "MaxUnpool" or len(node.inputs) < 3 or node.inputs[2] is None:
        return False
    from opfuse.ops.registry import get_spec
    from opfuse.ops.sampling import unpool_shapes
    inferred, out = unpool_shapes(node, get_spec(node.op_type, node).attrs_of(node))
    return tuple(inferred) != tuple(out)


def known_ort_discrepancy(graph: Graph) -> bool:
    """Whether onnxruntime is known to compute ``graph`` differently from the ONNX reference."""
    return any(resize_output_length_is_fractional(n) or affine_grid_of_one_position_with_corners(n)
               or col2im_over_one_axis(n) or max_unpool_into_a_larger_output_shape(n) for n in graph.nodes)


def full_check_rejects(graph: Graph) -> bool:
    """Whether onnx's strict shape inference is known to reject the correct export of ``graph``."""
    return any(pool_ceil_mode_drops_last_window(n) for n in graph.nodes)


def check_onnx(model: onnx.ModelProto, graph: Graph) -> None:
    onnx.checker.check_model(model, full_check=not full_check_rejects(graph))
