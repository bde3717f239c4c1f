"""The spatial sampling ops through ONNX: imported at each opset that defines them (equal to
onnxruntime), exported back (checker-clean, equal again), and refused by name where an opset
cannot express them."""
import numpy as np
import pytest
from onnx import helper

from onnx_builders import import_and_compare, init, ints, model, op_types, vi
from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx import export_model, import_model
from opfuse.ops.registry import get_spec


@pytest.mark.parametrize("opset,mode", [(16, "bilinear"), (16, "bicubic"), (16, "nearest"), (20, "linear"),
                                        (20, "cubic"), (21, "nearest")])
def test_grid_sample_2d(opset, mode):
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode="border", align_corners=1)
    m = model([node], [vi("x", [1, 2, 4, 5]), vi("grid", [1, 3, 3, 2])], [vi("y", [1, 2, 3, 3])], opset=opset)
    g = import_and_compare(m, export_opsets=(16, 20, 21))
    assert op_types(g) == ["GridSample"]


def test_grid_sample_3d_exports_from_opset_20_only():
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode="linear", padding_mode="reflection")
    m = model([node], [vi("x", [1, 2, 3, 4, 5]), vi("grid", [1, 2, 3, 2, 3])], [vi("y", [1, 2, 2, 3, 2])], opset=20)
    g = import_and_compare(m, export_opsets=(20, 21))
    with pytest.raises(UnsupportedOpError, match="5-D GridSample cannot be written at opset 18"):
        export_model(g, 18)
    two_d = import_model(model([helper.make_node("GridSample", ["x", "grid"], ["y"])],
                               [vi("x", [1, 1, 3, 3]), vi("grid", [1, 2, 2, 2])], [vi("y", [1, 1, 2, 2])], opset=16))
    with pytest.raises(UnsupportedOpError, match="GridSample cannot be written at opset 15"):
        export_model(two_d, 15)


@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid_is_expanded_below_opset_20(align):
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    m = model([node], [vi("theta", [2, 2, 3])], [vi("grid", [2, 4, 5, 2])], [ints("size", [2, 3, 4, 5])], opset=20)
    g = import_and_compare(m, export_opsets=(11, 17, 20))
    assert op_types(g) == ["AffineGrid"]
    assert "AffineGrid" not in [n.op_type for n in export_model(g, 17).graph.node]


def test_col2im():
    node = helper.make_node("Col2Im", ["x", "img", "blk"], ["y"], strides=[2, 1], pads=[1, 0, 0, 1])
    m = model([node], [vi("x", [2, 12, 15])], [vi("y", [2, 3, 5, 5])], [ints("img", [5, 5]), ints("blk", [2, 2])],
              opset=18)
    import_and_compare(m, export_opsets=(18, 21))


@pytest.mark.parametrize("opset", [19, 21])
def test_deform_conv_with_mask_and_bias(opset):
    rng = np.random.default_rng(0)
    node = helper.make_node("DeformConv", ["x", "w", "off", "b", "mask"], ["y"], pads=[1, 1, 1, 1], offset_group=2)
    m = model([node], [vi("x", [1, 4, 5, 5]), vi("off", [1, 2 * 9 * 2, 5, 5]), vi("mask", [1, 18, 5, 5])],
              [vi("y", [1, 3, 5, 5])],
              [init("w", rng.standard_normal((3, 4, 3, 3)).astype(np.float32)),
               init("b", rng.standard_normal(3).astype(np.float32))], opset=opset)
    import_and_compare(m, export_opsets=(19, 21))
    with pytest.raises(UnsupportedOpError, match="DeformConv cannot be written at opset 18"):
        export_model(import_model(m), 18)


@pytest.mark.parametrize("opset,attrs", [(10, {}), (16, {"coordinate_transformation_mode": "output_half_pixel"}),
                                         (16, {"mode": "max"}), (21, {})])
def test_roi_align(opset, attrs):
    rois = np.array([[0.5, 1.0, 4.0, 5.5], [2.0, 0.0, 7.5, 3.0], [-1.0, -0.5, 2.0, 2.5]], np.float32)
    node = helper.make_node("RoiAlign", ["x", "rois", "idx"], ["y"], output_height=3, output_width=2,
                            sampling_ratio=2, spatial_scale=0.8, **attrs)
    m = model([node], [vi("x", [2, 3, 8, 9])], [vi("y", [3, 3, 3, 2])],
              [init("rois", rois), ints("idx", [1, 0, 1])], opset=opset)
    g = import_and_compare(m, export_opsets=(16, 21))
    half = opset >= 16 and attrs.get("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    ctm = get_spec("RoiAlign").attrs_of(g.nodes[0])["coordinate_transformation_mode"]
    assert ctm == ("half_pixel" if half else "output_half_pixel")
    if half:
        with pytest.raises(UnsupportedOpError, match="cannot be written at opset 11"):
            export_model(g, 11)
    else:
        export_model(g, 11)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_max_pool_indices_feed_max_unpool(storage_order):
    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2],
                            storage_order=storage_order)
    # (no output_shape: onnxruntime then indexes the larger shape, ONNX's reference and opfuse the pooled one)
    nodes = [pool, helper.make_node("MaxUnpool", ["p", "i"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    outputs = [vi("y", [1, 2, 6, 8])] + ([vi("i", [1, 2, 3, 4], 7)] if storage_order else [])
    m = model(nodes, [vi("x", [1, 2, 6, 8])], outputs, opset=12)
    g = import_and_compare(m, export_opsets=(11, 21))
    assert op_types(g) == ["MaxPool", "MaxUnpool"]


@pytest.mark.parametrize("mode,antialias", [("cubic", 0), ("cubic", 1), ("linear", 1)])
def test_resize_cubic_and_antialias(mode, antialias):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, antialias=antialias,
                            cubic_coeff_a=-0.5, exclude_outside=1)
    m = model([node], [vi("x", [1, 2, 6, 7])], [vi("y", [1, 2, 3, 11])],
              [init("scales", np.array([1, 1, 0.5, 1.6], np.float32))], opset=18)
    g = import_and_compare(m, export_opsets=(18, 21))
    if antialias:
        with pytest.raises(UnsupportedOpError, match="antialias=1 cannot be written at opset 17"):
            export_model(g, 17)
