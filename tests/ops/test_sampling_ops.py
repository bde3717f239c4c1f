"""Spatial sampling ops (GridSample, AffineGrid, Col2Im, DeformConv, RoiAlign, MaxUnpool, MaxPool's
Indices, Resize cubic/antialias): the reference executor against ``onnx.reference`` on random
configurations, and their refusals."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import OpfuseError, ShapeError, UnsupportedOpError
from tests.ops.op_harness import onnx_ref, ort_ref, run_op

RTOL, ATOL = 1e-4, 1e-5


def _close(got, want, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol)


# GridSample ----------------------------------------------------------------------------------------
GRID_CASES = [(mode, pad, align, d) for mode in ("linear", "nearest", "cubic")
              for pad in ("zeros", "border", "reflection")
              for align in (0, 1) for d in (2, 3) if not (mode == "cubic" and d == 3)]


@pytest.mark.parametrize("mode,pad,align,d", GRID_CASES)
def test_grid_sample_matches_onnx_reference(mode, pad, align, d):
    rng = np.random.default_rng(hash((mode, pad, align, d)) % 2**32)
    spatial = (3, 4, 5)[-d:]
    x = rng.standard_normal((2, 3) + spatial).astype(np.float32)
    out = (4, 3, 2)[-d:]
    # Coordinates beyond [-1, 1] exercise the padding; quarter steps land on ties for nearest.
    grid = (rng.integers(-10, 11, (2,) + out + (d,)) / 4).astype(np.float32)
    grid += rng.uniform(-0.05, 0.05, grid.shape).astype(np.float32) * (mode != "nearest")
    attrs = dict(mode=mode, padding_mode=pad, align_corners=align)
    got = run_op("GridSample", [x, grid], **attrs)[0]
    # Cubic with border padding: onnxruntime and PyTorch clamp every tap, ONNX's reference the point.
    want = (ort_ref if (mode, pad) == ("cubic", "border") else onnx_ref)("GridSample", [x, grid], opset=20,
                                                                          **attrs)[0]
    assert got.shape == want.shape
    _close(got, want)


def test_grid_sample_opset16_names():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    grid = rng.uniform(-1.2, 1.2, (1, 3, 3, 2)).astype(np.float32)
    for old, new in (("bilinear", "linear"), ("bicubic", "cubic")):
        _close(run_op("GridSample", [x, grid], mode=old)[0], run_op("GridSample", [x, grid], mode=new)[0], 0, 0)


def test_grid_sample_refusals():
    x = np.zeros((1, 1, 4, 4), np.float32)
    with pytest.raises(UnsupportedOpError, match="mode='area'"):
        run_op("GridSample", [x, np.zeros((1, 2, 2, 2), np.float32)], mode="area")
    with pytest.raises(UnsupportedOpError, match="padding_mode='wrap'"):
        run_op("GridSample", [x, np.zeros((1, 2, 2, 2), np.float32)], padding_mode="wrap")
    with pytest.raises(ShapeError, match="grid"):
        run_op("GridSample", [x, np.zeros((1, 2, 2, 3), np.float32)])


# AffineGrid ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 4, 2), (1, 1, 1, 3)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_matches_onnx_reference(size, align):
    rng = np.random.default_rng(len(size) * 10 + align)
    d = len(size) - 2
    theta = rng.standard_normal((size[0], d, d + 1)).astype(np.float32)
    size_arr = np.array(size, np.int64)
    got = run_op("AffineGrid", [theta, size_arr], consts=[1], align_corners=align)[0]
    if align and 1 in size[2:]:
        pytest.skip("the ONNX reference divides by zero for a length-1 axis with align_corners")
    want = onnx_ref("AffineGrid", [theta, size_arr], opset=20, align_corners=align)[0]
    _close(got, want)


def test_affine_grid_refusals():
    with pytest.raises(ShapeError, match="theta"):
        run_op("AffineGrid", [np.zeros((1, 3, 3), np.float32), np.array([1, 1, 2, 2])], consts=[1])
    with pytest.raises(OpfuseError, match="size"):
        run_op("AffineGrid", [np.zeros((1, 2, 3), np.float32), np.array([1, 2])], consts=[1])


# Col2Im --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("image,block,attrs", [
    ((5, 5), (1, 5), {}),
    ((5, 5), (2, 2), {"strides": [2, 2]}),
    ((6, 7), (3, 2), {"dilations": [2, 1], "pads": [1, 0, 2, 1]}),
    ((3, 4, 5), (1, 2, 2), {"pads": [0, 1, 0, 0, 1, 1], "strides": [1, 2, 1]}),
])
def test_col2im_matches_onnx_reference(image, block, attrs):
    rng = np.random.default_rng(sum(image))
    n = len(image)
    strides = attrs.get("strides", [1] * n)
    dil = attrs.get("dilations", [1] * n)
    pads = attrs.get("pads", [0] * 2 * n)
    blocks = [(image[i] + pads[i] + pads[n + i] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1 for i in range(n)]
    x = rng.standard_normal((2, 3 * int(np.prod(block)), int(np.prod(blocks)))).astype(np.float32)
    ins = [x, np.array(image, np.int64), np.array(block, np.int64)]
    got = run_op("Col2Im", ins, consts=[1, 2], **attrs)[0]
    want = onnx_ref("Col2Im", ins, opset=18, **attrs)[0]
    _close(got, want)


def test_col2im_refuses_a_block_count_that_does_not_fit():
    x = np.zeros((1, 4, 7), np.float32)
    with pytest.raises(ShapeError, match="must be"):
        run_op("Col2Im", [x, np.array([3, 3]), np.array([2, 2])], consts=[1, 2])


# DeformConv ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg", [
    dict(c=2, oc=3, k=(2, 2), attrs={}),
    dict(c=4, oc=4, k=(3, 3), attrs={"pads": [1, 1, 1, 1], "strides": [2, 1], "group": 2, "offset_group": 2}),
    dict(c=2, oc=2, k=(2, 3), attrs={"dilations": [2, 1], "pads": [0, 1, 1, 0]}),
])
@pytest.mark.parametrize("with_mask_bias", [False, True])
def test_deform_conv_matches_onnx_reference(cfg, with_mask_bias):
    rng = np.random.default_rng(cfg["c"] * 7 + with_mask_bias)
    a = cfg["attrs"]
    k = cfg["k"]
    x = rng.standard_normal((2, cfg["c"], 5, 6)).astype(np.float32)
    w = rng.standard_normal((cfg["oc"], cfg["c"] // a.get("group", 1)) + k).astype(np.float32)
    s, d, p = a.get("strides", [1, 1]), a.get("dilations", [1, 1]), a.get("pads", [0] * 4)
    out = tuple((x.shape[2 + i] + p[i] + p[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(2))
    og = a.get("offset_group", 1)
    off = rng.uniform(-2, 2, (2, og * k[0] * k[1] * 2) + out).astype(np.float32)
    ins = [x, w, off]
    if with_mask_bias:
        ins += [rng.standard_normal(cfg["oc"]).astype(np.float32),
                rng.uniform(0, 1, (2, og * k[0] * k[1]) + out).astype(np.float32)]
    got = run_op("DeformConv", ins, **a)[0]
    want = onnx_ref("DeformConv", ins, opset=19, **a)[0]
    _close(got, want, 1e-4, 1e-4)


def test_deform_conv_refuses_an_offset_of_the_wrong_shape():
    x = np.zeros((1, 2, 4, 4), np.float32)
    w = np.zeros((2, 2, 2, 2), np.float32)
    with pytest.raises(ShapeError, match="offset"):
        run_op("DeformConv", [x, w, np.zeros((1, 4, 3, 3), np.float32)])


# RoiAlign ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize("ratio", [0, 2])
def test_roi_align_matches_onnx_reference(mode, ctm, ratio):
    rng = np.random.default_rng(hash((mode, ctm, ratio)) % 2**32)
    x = rng.standard_normal((2, 3, 8, 9)).astype(np.float32)
    lo = rng.uniform(-2, 6, (5, 2))
    rois = np.concatenate([lo, lo + rng.uniform(0.3, 6, (5, 2))], axis=1).astype(np.float32)
    idx = rng.integers(0, 2, 5).astype(np.int64)
    attrs = dict(mode=mode, coordinate_transformation_mode=ctm, output_height=3, output_width=2,
                 sampling_ratio=ratio, spatial_scale=0.9)
    got = run_op("RoiAlign", [x, rois, idx], **attrs)[0]
    want = onnx_ref("RoiAlign", [x, rois, idx], opset=16, **attrs)[0]
    _close(got, want)


def test_roi_align_refusals():
    x = np.zeros((1, 1, 4, 4), np.float32)
    rois = np.zeros((1, 4), np.float32)
    with pytest.raises(UnsupportedOpError, match="mode='sum'"):
        run_op("RoiAlign", [x, rois, np.zeros(1, np.int64)], mode="sum")
    with pytest.raises(ShapeError, match="rois"):
        run_op("RoiAlign", [x, np.zeros((1, 5), np.float32), np.zeros(1, np.int64)])


# MaxPool's Indices and MaxUnpool -------------------------------------------------------------------
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 1]),
    dict(kernel_shape=[2, 3], dilations=[2, 1], storage_order=1),
    dict(kernel_shape=[3, 2], ceil_mode=1, strides=[2, 2], storage_order=1),
    dict(kernel_shape=[2], strides=[1]),
])
def test_max_pool_indices_match_onnx_reference(attrs):
    rng = np.random.default_rng(len(str(attrs)))
    shape = (2, 3, 7) if len(attrs["kernel_shape"]) == 1 else (2, 3, 6, 7)
    x = rng.integers(-4, 5, shape).astype(np.float32)  # ties: the first maximum wins
    y, i = run_op("MaxPool", [x], num_outputs=2, **attrs)
    # ONNX's reference forgets the channel's offset in 1-D; onnxruntime is the oracle there.
    wy, wi = (ort_ref if len(shape) == 3 else onnx_ref)("MaxPool", [x], num_outputs=2, **attrs)
    _close(y, wy, 0, 0)
    np.testing.assert_array_equal(i, wi)


@pytest.mark.parametrize("attrs,out_shape", [
    (dict(kernel_shape=[2, 2], strides=[2, 2]), None),
    (dict(kernel_shape=[2, 2], strides=[2, 2]), (2, 3, 7, 9)),
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), None),
])
def test_max_unpool_matches_onnx_reference(attrs, out_shape):
    rng = np.random.default_rng(3)
    # pads 1, kernel 3, stride 2: 5 x 7 pools to 3 x 4, which unpools to 5 x 7 again
    x = rng.standard_normal((2, 3, 5, 7) if "pads" in attrs else (2, 3, 6, 8)).astype(np.float32)
    y, i = run_op("MaxPool", [x], num_outputs=2, **attrs)
    ins = [y, i] + ([np.array(out_shape, np.int64)] if out_shape else [])
    got = run_op("MaxUnpool", ins, consts=[2] if out_shape else [], **attrs)[0]
    want = onnx_ref("MaxUnpool", ins, opset=11, **attrs)[0]
    _close(got, want, 0, 0)


def test_max_unpool_refusals():
    x = np.zeros((1, 1, 2, 2), np.float32)
    with pytest.raises(ShapeError, match="kernel_shape"):
        run_op("MaxUnpool", [x, np.zeros((1, 1, 2, 2), np.int64)])
    with pytest.raises(ShapeError, match="output_shape"):
        run_op("MaxUnpool", [x, np.zeros((1, 1, 2, 2), np.int64), np.array([1, 1, 3, 3])], consts=[2],
               kernel_shape=[2, 2], strides=[2, 2])


# Resize: cubic and antialias -----------------------------------------------------------------------
RESIZE_CTMS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_crop_and_resize"]


@pytest.mark.parametrize("ctm", RESIZE_CTMS)
@pytest.mark.parametrize("mode,antialias", [("cubic", 0), ("cubic", 1), ("linear", 1)])
@pytest.mark.parametrize("scales", [(1, 1, 0.6, 0.45), (1, 1, 1.7, 2.3), (1, 1, 0.5, 1.6)])
def test_resize_taps_match_onnx_reference(ctm, mode, antialias, scales):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 2, 6, 7)).astype(np.float32)
    roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.95], np.float32) if ctm == "tf_crop_and_resize" \
        else np.zeros(0, np.float32)
    scl = np.array(scales, np.float32)
    for a_coef, excl in ((-0.75, 0), (-0.5, 1)):
        attrs = dict(mode=mode, antialias=antialias, coordinate_transformation_mode=ctm, cubic_coeff_a=a_coef,
                     exclude_outside=excl, extrapolation_value=0.5)
        got = run_op("Resize", [x, roi, scl], consts=[1, 2], **attrs)[0]
        want = onnx_ref("Resize", [x, roi, scl], opset=18, **attrs)[0]
        _close(got, want)


def test_resize_cubic_with_sizes_and_axes_and_integers():
    rng = np.random.default_rng(8)
    x = rng.integers(0, 255, (1, 1, 5, 6)).astype(np.uint8)
    sizes = np.array([3, 9], np.int64)
    attrs = dict(mode="cubic", axes=[2, 3], antialias=1)
    got = run_op("Resize", [x, None, None, sizes], consts=[3], **attrs)[0]
    want = onnx_ref("Resize", [x, np.zeros(0, np.float32), np.zeros(0, np.float32), sizes], opset=18, **attrs)[0]
    assert np.max(np.abs(got.astype(int) - want.astype(int))) <= 1


def test_resize_refuses_unknown_modes():
    x = np.zeros((1, 1, 2, 2), np.float32)
    with pytest.raises(UnsupportedOpError, match="mode='area'"):
        run_op("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], consts=[2], mode="area")
    with pytest.raises(UnsupportedOpError, match="antialias=2"):
        run_op("Resize", [x, None, np.array([1, 1, 2, 2], np.float32)], consts=[2], mode="cubic", antialias=2)


@pytest.mark.parametrize("spatial,kernel,attrs", [
    ((9,), (3,), {"pads": [1, 1], "strides": [2]}),
    ((4, 5, 6), (2, 3, 2), {"pads": [1, 0, 1, 0, 1, 1], "dilations": [1, 2, 1]}),
    ((6, 7), (3, 3), {"pads": [1, 1, 1, 1], "group": 2}),
])
def test_deform_conv_with_zero_offsets_is_a_conv(spatial, kernel, attrs):
    """Any rank (ONNX's reference does 2-D only): zero offsets and no mask sample the grid points."""
    rng = np.random.default_rng(len(spatial))
    d = len(spatial)
    x = rng.standard_normal((2, 4) + spatial).astype(np.float32)
    w = rng.standard_normal((6, 4 // attrs.get("group", 1)) + kernel).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    want = run_op("Conv", [x, w, b], **attrs)[0]
    off = np.zeros((2, int(np.prod(kernel)) * d) + want.shape[2:], np.float32)
    got = run_op("DeformConv", [x, w, off, b], **attrs)[0]
    _close(got, want)
