"""Every opset 7..28 form is normalised to one canonical IR form (and exported back at 11..21)."""
import numpy as np
import pytest
from onnx import helper

from onnx_builders import import_and_compare, init, ints, model, op_types, vi
from opfuse.frontend.onnx import import_model
from opfuse.runtime.reference import run

from opfuse.frontend.onnx_opsets import EXPORT_MAX_OPSET, EXPORT_MIN_OPSET, MAX_OPSET, MIN_OPSET

ALL_OPSETS = list(range(MIN_OPSET, MAX_OPSET + 1))


def _axes_node(op, x, y, axes, opset, since, **attrs):
    """``op`` with ``axes`` as an attribute (before ``since``) or as a constant input."""
    if opset >= since:
        return [helper.make_node(op, [x, f"{y}_axes"], [y], **attrs)], [ints(f"{y}_axes", axes)]
    return [helper.make_node(op, [x], [y], axes=axes, **attrs)], []


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_axes_become_attributes(opset):
    n1, i1 = _axes_node("Squeeze", "x", "s", [1], opset, 13)
    n2, i2 = _axes_node("Unsqueeze", "s", "y", [0, -1], opset, 13)
    m = model(n1 + n2, [vi("x", [3, 1, 4])], [vi("y", [1, 3, 4, 1])], i1 + i2, opset=opset)
    g = import_and_compare(m, export_opsets=(None, 11, 13))
    assert [n.attrs for n in g.nodes] == [{"axes": [1]}, {"axes": [0, -1]}]
    assert all(len(n.inputs) == 1 for n in g.nodes)


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_without_axes_squeezes_all_ones(opset):
    m = model([helper.make_node("Squeeze", ["x"], ["y"])], [vi("x", [1, 3, 1])], [vi("y", [3])], opset=opset)
    g = import_and_compare(m, export_opsets=(11, 17))
    assert g.nodes[0].attrs == {}


@pytest.mark.parametrize("op,opset", [("ReduceMean", 13), ("ReduceMean", 18), ("ReduceSum", 11),
                                      ("ReduceSum", 13), ("ReduceMax", 17), ("ReduceMax", 20)])
def test_reduce_axes_become_attributes(op, opset):
    from opfuse.frontend.onnx_opsets import AXES_INPUT_SINCE
    nodes, inits = _axes_node(op, "x", "y", [1, 2], opset, AXES_INPUT_SINCE[op], keepdims=0)
    m = model(nodes, [vi("x", [2, 3, 4])], [vi("y", [2])], inits, opset=opset)
    g = import_and_compare(m, export_opsets=(11, 17, 18))
    assert g.nodes[0].attrs == {"axes": [1, 2], "keepdims": 0}


@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_with_no_axes_reduces_everything(opset):
    m = model([helper.make_node("ReduceSum", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [1, 1])], opset=opset)
    g = import_and_compare(m, export_opsets=(11, 18))
    assert "axes" not in g.nodes[0].attrs


def test_reduce_noop_with_empty_axes_is_identity_everywhere():
    m = model([helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)],
              [vi("x", [2, 3])], [vi("y", [2, 3])], opset=13)
    import_and_compare(m, export_opsets=(11, 13, 18))


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_sizes_become_an_attribute(opset):
    if opset >= 13:
        nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1)]
        inits = [ints("sizes", [1, 3])]
    else:
        nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[1, 3])]
        inits = []
    m = model(nodes, [vi("x", [2, 4])], [vi("a", [2, 1]), vi("b", [2, 3])], inits, opset=opset)
    g = import_and_compare(m, export_opsets=(11, 13, 18))
    assert g.nodes[0].attrs == {"axis": 1, "split": [1, 3]}


def test_split_18_num_outputs_uneven_last_chunk_is_smaller():
    nodes = [helper.make_node("Split", ["x"], ["a", "b", "c"], axis=0, num_outputs=3)]
    m = model(nodes, [vi("x", [7, 2])], [vi(o, None) for o in "abc"], opset=18)
    g = import_and_compare(m, export_opsets=(11, 18))
    assert g.nodes[0].attrs == {"axis": 0, "split": [3, 3, 1]}
    assert [v.shape for v in g.outputs] == [(3, 2), (3, 2), (1, 2)]


@pytest.mark.parametrize("opset", [11, 13])
def test_split_equal_without_sizes(opset):
    nodes = [helper.make_node("Split", ["x"], ["a", "b"], axis=-1)]
    g = import_and_compare(model(nodes, [vi("x", [2, 6])], [vi("a", None), vi("b", None)], opset=opset))
    assert [v.shape for v in g.outputs] == [(2, 3), (2, 3)]


def test_softmax_opset11_axis1_on_3d_is_a_flattened_softmax():
    """Opset 11 Softmax(axis=1) on [2,3,4] normalises over each sample's 12 values."""
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])],
              opset=11)
    g = import_and_compare(m, export_opsets=(11, 13, 17))
    assert op_types(g) == ["Flatten", "Softmax", "Reshape"]
    assert g.node("softmax_0").attrs == {"axis": -1}
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    y = run(g, {"x": x})["y"]
    np.testing.assert_allclose(y.reshape(2, -1).sum(axis=1), [1, 1], rtol=1e-5)


def test_softmax_opset11_default_axis_is_1():
    m = model([helper.make_node("Softmax", ["x"], ["y"])], [vi("x", [2, 3, 4])], [vi("y", None)], opset=11)
    g = import_and_compare(m)
    assert op_types(g) == ["Flatten", "Softmax", "Reshape"]


@pytest.mark.parametrize("opset,axis", [(11, 2), (11, -1), (12, 1)])
def test_softmax_old_opset_on_last_axis_stays_one_node(opset, axis):
    shape = [2, 3, 4] if axis != 1 else [5, 6]
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], [vi("x", shape)], [vi("y", shape)],
              opset=opset)
    g = import_and_compare(m, export_opsets=(11, 17))
    assert op_types(g) == ["Softmax"] and g.nodes[0].attrs == {"axis": -1}


def test_softmax_opset13_axis1_is_single_axis():
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])], [vi("y", [2, 3, 4])],
              opset=13)
    g = import_and_compare(m, export_opsets=(11, 13))
    assert op_types(g) == ["Softmax"] and g.nodes[0].attrs == {"axis": 1}


@pytest.mark.parametrize("opset", [11, 13, 19])
def test_resize_empty_roi_and_scales_mean_absent(opset):
    if opset == 11:
        nodes = [helper.make_node("Resize", ["x", "roi", "scales", "sizes"], ["y"], mode="nearest")]
        inits = [init("roi", np.zeros(0, np.float32)), init("scales", np.zeros(0, np.float32)),
                 ints("sizes", [1, 2, 8, 8])]
    else:
        nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")]
        inits = [ints("sizes", [1, 2, 8, 8])]
    m = model(nodes, [vi("x", [1, 2, 4, 4])], [vi("y", [1, 2, 8, 8])], inits, opset=opset)
    g = import_and_compare(m)
    assert g.nodes[0].inputs[1] is None and g.nodes[0].inputs[2] is None


def _mixed_model(opset: int):
    """One model exercising every form that changed between 11 and 21, at ``opset``."""
    from opfuse.frontend.onnx_opsets import AXES_INPUT_SINCE
    nodes, inits = [], [init("w", np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32))]
    if opset >= 11:
        inits.append(init("lo", np.array(0.05, np.float32)))

    def add(made):
        nodes.extend(made[0])
        inits.extend(made[1])

    def axes(op, x, y, values, **attrs):
        add(_axes_node(op, x, y, values, opset, AXES_INPUT_SINCE[op], **attrs))

    nodes.append(helper.make_node("MatMul", ["x", "w"], ["m"]))
    axes("Unsqueeze", "m", "u", [1])
    if opset >= 13:
        add(([helper.make_node("Split", ["u", "sz"], ["s0", "s1"], axis=2)], [ints("sz", [2, 4])]))
    else:
        nodes.append(helper.make_node("Split", ["u"], ["s0", "s1"], axis=2, split=[2, 4]))
    axes("ReduceMean", "s1", "rm", [2], keepdims=1)
    nodes.append(helper.make_node("Sub", ["s1", "rm"], ["c"]))
    nodes.append(helper.make_node("Softmax", ["c"], ["sm"], axis=-1))
    axes("ReduceSum", "s0", "rs", [2], keepdims=0)
    axes("Squeeze", "sm", "sq", [1])
    if opset >= 11:
        nodes.append(helper.make_node("Clip", ["sq", "lo", ""], ["y"]))
    else:
        nodes.append(helper.make_node("Clip", ["sq"], ["y"], min=0.05))
    return model(nodes, [vi("x", ["batch", 4])], [vi("y", None), vi("rs", None)], inits, opset=opset)


@pytest.mark.parametrize("opset", ALL_OPSETS)
def test_every_opset_imports_to_the_same_graph(opset):
    """The same network written at opsets 7..28 imports to one canonical IR and matches
    onnxruntime at that opset, before and after export."""
    exports = (opset, None) if EXPORT_MIN_OPSET <= opset <= EXPORT_MAX_OPSET else (None,)
    g = import_and_compare(_mixed_model(opset), {"x": (3, 4)}, export_opsets=exports)
    ref = import_model(_mixed_model(17), {"x": (3, 4)})
    if opset >= 11:  # before, Clip's bound is an attribute: its constant gets another name
        assert str(g) == str(ref)
    assert op_types(g) == ["MatMul", "Unsqueeze", "Split", "ReduceMean", "Sub", "Softmax", "ReduceSum",
                           "Squeeze", "Clip"]


# Forms of opsets 7..10 ------------------------------------------------------------------------

def test_pad_2_attributes_become_inputs():
    nodes = [helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 2, 0, 0, 3], value=1.5),
             helper.make_node("Pad", ["x"], ["z"], pads=[0, 1, 1, 0, 1, 1], mode="reflect")]
    m = model(nodes, [vi("x", [2, 3, 4])], [vi("y", None), vi("z", None)], opset=10)
    g = import_and_compare(m, export_opsets=(11,))
    assert [len(n.inputs) for n in g.nodes] == [3, 3] and all("pads" not in n.attrs for n in g.nodes)


def test_slice_1_attributes_become_inputs():
    nodes = [helper.make_node("Slice", ["x"], ["y"], starts=[1, -3], ends=[3, 100], axes=[0, 2]),
             helper.make_node("Slice", ["x"], ["z"], starts=[0, 1, 1], ends=[1, 2, -1])]
    m = model(nodes, [vi("x", [4, 3, 5])], [vi("y", None), vi("z", None)], opset=9)
    g = import_and_compare(m, export_opsets=(11,))
    assert [v.shape for v in g.outputs] == [(2, 3, 3), (1, 1, 3)]


@pytest.mark.parametrize("mode,scales", [("nearest", [1, 1, 2, 3]), ("nearest", [1, 1, 0.5, 0.5]),
                                         ("linear", [1, 1, 2, 1.5]), ("linear", [1, 1, 0.6, 0.5])])
def test_resize_10_is_asymmetric(mode, scales):
    nodes = [helper.make_node("Resize", ["x", "s"], ["y"], mode=mode)]
    m = model(nodes, [vi("x", [1, 2, 5, 4])], [vi("y", None)], [init("s", np.array(scales, np.float32))],
              opset=10)
    g = import_and_compare(m, export_opsets=(11, 13))
    assert g.nodes[0].attrs["coordinate_transformation_mode"] == "asymmetric"


@pytest.mark.parametrize("opset", [7, 9])
def test_upsample_is_resize(opset):
    scales = np.array([1, 1, 2, 3], np.float32)
    if opset >= 9:
        nodes, inits = [helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")], [init("s", scales)]
    else:
        nodes, inits = [helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=scales.tolist())], []
    m = model(nodes, [vi("x", [1, 2, 3, 4])], [vi("y", None)], inits, opset=opset)
    g = import_and_compare(m, export_opsets=(11,))
    assert op_types(g) == ["Resize"] and g.outputs[0].shape == (1, 2, 6, 12)


def test_upsample_is_not_an_op_from_opset_10():
    from opfuse.errors import UnsupportedOpError
    nodes = [helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")]
    m = model(nodes, [vi("x", [1, 2, 3, 4])], [vi("y", None)], [init("s", np.ones(4, np.float32))], opset=10)
    with pytest.raises(UnsupportedOpError, match="not an ONNX op at this opset"):
        import_model(m)


def test_batchnorm_7_spatial_0_is_refused():
    from opfuse.errors import UnsupportedOpError
    c = [init(k, np.ones(3, np.float32)) for k in ("s", "b", "m", "v")]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=0)]
    m = model(nodes, [vi("x", [1, 3, 2, 2])], [vi("y", None)], c, opset=7)
    with pytest.raises(UnsupportedOpError, match="spatial=0"):
        import_model(m)
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], spatial=1)]
    import_and_compare(model(nodes, [vi("x", [1, 3, 2, 2])], [vi("y", None)], c, opset=7))


def test_scatter_10_is_scatter_elements():
    nodes = [helper.make_node("Scatter", ["x", "i", "u"], ["y"], axis=1)]
    inits = [init("i", np.array([[1, 0], [2, 1]], np.int64)), init("u", np.ones((2, 2), np.float32))]
    g = import_and_compare(model(nodes, [vi("x", [2, 3])], [vi("y", None)], inits, opset=10), export_opsets=(11,))
    assert op_types(g) == ["ScatterElements"]
