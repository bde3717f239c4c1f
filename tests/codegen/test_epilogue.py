"""The epilogue sweep after an anchor (``codegen/epilogue.py``, issue 13): relabelling ops
(Transpose without ``perm``, Dropout) between an anchor and the group's output. Expected values
are computed here with NumPy from the definition of each op, not by the code generator."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import group_by_names
from opfuse.codegen import UnsupportedGroupError
from opfuse.ops import GraphBuilder
from opfuse.runtime.native import build

X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) * np.float32(0.25) - np.float32(2.0)


def _run(g, names, cache_dir):
    model = build(g, group_by_names(g, [("reduction", names)]), cache_dir=cache_dir)
    assert model.report["kernels"] == 1
    return model.run({"x": X})


def test_transpose_without_perm_reverses_the_axes(cache_dir):
    """ONNX Transpose with no ``perm`` reverses the axes: mean over the last axis (2, 3, 1), then
    (1, 3, 2), each mean stored straight to its transposed place."""
    b = GraphBuilder("mean_t")
    x = b.input("x", (2, 3, 4))
    m = b.op("ReduceMean", x, axes=[2], keepdims=1, name="mean")
    g = b.build(b.op("Relu", b.op("Transpose", m, name="t"), name="relu"))
    got = _run(g, ["mean", "t", "relu"], cache_dir)["relu"]
    # rows of X: -2 + 0.25 * (4r .. 4r + 3): mean -2 + 0.25 * (4r + 1.5), r = 3i + j
    means = np.array([[-2 + 0.25 * (4 * (3 * i + j) + 1.5) for j in range(3)] for i in range(2)], np.float32)
    want = np.maximum(means, 0).T.reshape(1, 3, 2)  # out[0, j, i] = relu(mean[i, j])
    assert got.shape == (1, 3, 2)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("with_ratio", [False, True])
def test_dropout_in_an_epilogue_is_the_identity(with_ratio, cache_dir):
    """Dropout at inference passes its input through (the ratio, a constant, does not matter);
    a Transpose after it still finds each element's place."""
    b = GraphBuilder("mean_dropout")
    x = b.input("x", (2, 3, 4))
    m = b.op("ReduceMean", x, axes=[2], keepdims=0, name="mean")
    args = (m, b.const("ratio", np.array(0.5, np.float32))) if with_ratio else (m,)
    d = b.op("Dropout", *args, name="drop")
    g = b.build(b.op("Transpose", d, perm=[1, 0], name="t"))
    got = _run(g, ["mean", "drop", "t"], cache_dir)["t"]
    means = np.array([[-2 + 0.25 * (4 * (3 * i + j) + 1.5) for j in range(3)] for i in range(2)], np.float32)
    assert got.shape == (3, 2)
    np.testing.assert_allclose(got, means.T, rtol=1e-6, atol=1e-6)


def test_a_same_shape_gather_after_the_anchor_is_refused(cache_dir):
    """Gather([2, 0, 1], axis=1) keeps the (2, 3) shape but moves every column: an element of the
    mean does not stay at its index, so the sweep refuses it (a data-movement op other than the
    relabelling ones), naming the node."""
    b = GraphBuilder("mean_gather")
    x = b.input("x", (2, 3, 4))
    m = b.op("ReduceMean", x, axes=[2], keepdims=0, name="mean")
    g = b.build(b.op("Gather", m, b.const("idx", np.array([2, 0, 1], np.int64)), axis=1, name="perm_cols"))
    with pytest.raises(UnsupportedGroupError, match=r"epilogue node 'perm_cols' \(Gather\) would spread"):
        _run(g, ["mean", "perm_cols"], cache_dir)


def test_a_dropout_mask_output_is_refused_with_its_name(cache_dir):
    """Dropout's second output (the mask) is not the anchor's result relabelled: as a group output
    it is refused by name, not stored from the mean."""
    b = GraphBuilder("mean_mask")
    x = b.input("x", (2, 3, 4))
    m = b.op("ReduceMean", x, axes=[2], keepdims=0, name="mean")
    y, mask = b.op("Dropout", m, name="drop", num_outputs=2)
    g = b.build(y, mask)
    with pytest.raises(UnsupportedGroupError, match=r"output 'drop_out1' is not computed element by element"):
        _run(g, ["mean", "drop"], cache_dir)
