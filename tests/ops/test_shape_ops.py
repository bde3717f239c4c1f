"""Data-movement and shape ops against ONNX's reference and hand-computed values."""
from __future__ import annotations

import numpy as np
import pytest

from op_harness import assert_close, build_op, onnx_ref, ort_ref, run1, run_op
from opfuse.errors import InputError, ShapeError, UnsupportedOpError
from opfuse.runtime.reference import run

RNG = np.random.default_rng(5)
I64 = np.int64
INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def i64(*values):
    return np.array(values, dtype=I64)


# Concat / Split ---------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = {0: [(1, 3, 2), (2, 3, 2)], 1: [(2, 1, 2), (2, 4, 2)], -1: [(2, 3, 1), (2, 3, 3)]}[axis]
    xs = [randn(*s) for s in shapes] + [randn(*shapes[0])]
    got = run_op("Concat", xs, axis=axis)[0] if axis != 0 else run_op("Concat", xs[:2], axis=0)[0]
    want = np.concatenate(xs if axis != 0 else xs[:2], axis=axis)
    np.testing.assert_array_equal(got, want)


def test_concat_mismatch_names_the_node():
    with pytest.raises(ShapeError, match="cat.*differ outside axis 1"):
        build_op("Concat", [randn(2, 3), randn(3, 3)], name="cat", axis=1)
    with pytest.raises(ShapeError, match="cat.*axis"):
        build_op("Concat", [randn(2, 3), randn(2, 3)], name="cat")


def test_split_explicit_equal_and_uneven():
    x = randn(2, 7)
    a, b, c = run_op("Split", [x], num_outputs=3, axis=1, split=[1, 4, 2])
    np.testing.assert_array_equal(np.concatenate([a, b, c], axis=1), x)
    assert (a.shape, b.shape, c.shape) == ((2, 1), (2, 4), (2, 2))
    halves = run_op("Split", [randn(4, 2)], num_outputs=2)
    assert [h.shape for h in halves] == [(2, 2), (2, 2)]
    # Without `split`, an uneven axis gives ceil-sized chunks and a smaller last one (opset 18).
    parts = run_op("Split", [x], num_outputs=3, axis=-1)
    assert [p.shape[1] for p in parts] == [3, 3, 1]
    with pytest.raises(ShapeError, match="sp.*split"):
        build_op("Split", [x], num_outputs=2, name="sp", axis=1, split=[3, 3])


# Slice ------------------------------------------------------------------------------------------
SLICE_CASES = [
    (i64(0, 1), i64(2, 3), None, None),
    (i64(1), i64(-1), i64(1), None),
    (i64(-1, 0), i64(INT64_MIN, 3), i64(0, 2), i64(-1, 1)),   # negative step through index 0
    (i64(20), i64(-20), i64(2), i64(-2)),                      # clamping with a negative step
    (i64(0), i64(INT64_MAX), i64(-1), i64(3)),                 # clamp to the end, step 3
    (i64(-100, 2), i64(100, 100), i64(0, 1), None),
    (i64(3), i64(1), i64(2), None),                            # empty result
    (i64(2, 0), i64(0, 2), i64(1, 2), i64(-1, 2)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICE_CASES)
def test_slice_matches_onnx_reference(starts, ends, axes, steps):
    x = randn(4, 5, 6)
    ins = [x, starts, ends, axes, steps]
    while ins[-1] is None:
        ins.pop()
    got = run_op("Slice", ins, consts=(1, 2, 3, 4))[0]
    want = onnx_ref("Slice", ins)[0]
    np.testing.assert_array_equal(got, want)


def test_slice_needs_constant_operands():
    with pytest.raises(UnsupportedOpError, match="starts.*constant"):
        build_op("Slice", [randn(4), i64(0), i64(2)], consts=(2,))


def test_slice_errors_name_the_node():
    with pytest.raises(ShapeError, match="sl.*step 0"):
        build_op("Slice", [randn(4), i64(0), i64(2), i64(0), i64(0)], consts=(1, 2, 3, 4), name="sl")
    with pytest.raises(ShapeError, match="sl.*differ in length"):
        build_op("Slice", [randn(4, 4), i64(0, 1), i64(2)], consts=(1, 2), name="sl")


# Gather -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_with_negative_indices(axis):
    x = randn(3, 4, 5)
    idx = np.array([[0, -1], [2, -2]], dtype=I64)
    for consts in ((), (1,)):
        got = run_op("Gather", [x, idx], consts=consts, axis=axis)[0]
        np.testing.assert_array_equal(got, onnx_ref("Gather", [x, idx], axis=axis)[0])


def test_gather_scalar_index_and_out_of_range():
    x = randn(3, 4)
    assert run1("Gather", x, np.array(1, dtype=I64), axis=1).shape == (3,)
    with pytest.raises(ShapeError, match="g.*out of range"):
        build_op("Gather", [x, i64(3)], consts=(1,), name="g")
    g = build_op("Gather", [x, i64(0)], name="g")
    with pytest.raises(InputError, match="g.*out of range"):
        run(g, {"x0": x, "x1": i64(-4)})


# Reshape / Flatten / Transpose / Squeeze / Unsqueeze ---------------------------------------------
@pytest.mark.parametrize("shape,want", [
    ((6, 4), (6, 4)), ((0, -1), (2, 12)), ((-1,), (24,)), ((2, 0, 2, -1), (2, 3, 2, 2)), ((4, 6), (4, 6)),
])
def test_reshape(shape, want):
    x = randn(2, 3, 4)
    got = run1("Reshape", x, np.array(shape, dtype=I64), consts=(1,))
    assert got.shape == want
    np.testing.assert_array_equal(got.ravel(), x.ravel())


def test_reshape_allowzero_and_errors():
    x = np.zeros((0, 3), dtype=np.float32)
    assert run1("Reshape", x, i64(3, 0), consts=(1,), allowzero=1).shape == (3, 0)
    with pytest.raises(ShapeError, match="rs.*cannot reshape"):
        build_op("Reshape", [randn(2, 3), i64(4, -1)], consts=(1,), name="rs")
    with pytest.raises(ShapeError, match="rs.*more than one -1"):
        build_op("Reshape", [randn(2, 3), i64(-1, -1)], consts=(1,), name="rs")


@pytest.mark.parametrize("axis", [0, 1, 2, 3, -1, -3])
def test_flatten(axis):
    x = randn(2, 3, 4)
    if axis == 3:
        with pytest.raises(ShapeError, match="fl"):
            build_op("Flatten", [x], name="fl", axis=4)
        axis = 3
    got = run1("Flatten", x, axis=axis)
    np.testing.assert_array_equal(got, onnx_ref("Flatten", [x], axis=axis)[0])


def test_transpose():
    x = randn(2, 3, 4)
    np.testing.assert_array_equal(run1("Transpose", x), x.transpose(2, 1, 0))
    np.testing.assert_array_equal(run1("Transpose", x, perm=[1, 0, 2]), x.transpose(1, 0, 2))
    with pytest.raises(ShapeError, match="tr.*not a permutation"):
        build_op("Transpose", [x], name="tr", perm=[0, 0, 1])


def test_squeeze_unsqueeze():
    x = randn(1, 3, 1, 4)
    assert run1("Squeeze", x).shape == (3, 4)
    assert run1("Squeeze", x, axes=[-2]).shape == (1, 3, 4)
    with pytest.raises(ShapeError, match="sq.*not of size 1"):
        build_op("Squeeze", [x], name="sq", axes=[1])
    y = randn(3, 4)
    assert run1("Unsqueeze", y, axes=[0, -1]).shape == (1, 3, 4, 1)
    assert run1("Unsqueeze", y, axes=[1, 3]).shape == (3, 1, 4, 1)
    np.testing.assert_array_equal(run1("Unsqueeze", y, axes=[0]).ravel(), y.ravel())
    with pytest.raises(ShapeError, match="un.*repeat"):
        build_op("Unsqueeze", [y], name="un", axes=[0, -4])


# Expand -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("in_shape,target,want", [
    ((3, 1), (2, 1, 4), (2, 3, 4)),   # bidirectional: a 1 in the target keeps the input dim
    ((1,), (3,), (3,)),
    ((2, 3), (3,), (2, 3)),
])
def test_expand(in_shape, target, want):
    x = randn(*in_shape)
    got = run1("Expand", x, np.array(target, dtype=I64), consts=(1,))
    assert got.shape == want
    np.testing.assert_array_equal(got, onnx_ref("Expand", [x, np.array(target, dtype=I64)])[0])
    with pytest.raises(ShapeError, match="ex"):
        build_op("Expand", [randn(2, 3), i64(4)], consts=(1,), name="ex")


# Pad --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads,axes", [
    (i64(1, 2, 2, 0), None),
    (i64(0, -1, 1, 2), None),     # negative pads crop
    (i64(2, 1), i64(-1)),         # only the last axis
])
def test_pad_matches_onnx_reference(mode, pads, axes):
    x = randn(3, 4)
    value = np.array(1.5, dtype=np.float32)
    ins = [x, pads, value if mode == "constant" else None, axes]
    while ins[-1] is None:
        ins.pop()
    got = run_op("Pad", ins, consts=(1, 3), mode=mode)[0]
    # ONNX's reference rejects negative pads (it calls np.pad); onnxruntime crops as the spec says.
    oracle = ort_ref if pads.min() < 0 else onnx_ref
    np.testing.assert_array_equal(got, oracle("Pad", ins, opset=19, mode=mode)[0])


def test_pad_errors():
    with pytest.raises(ShapeError, match="pd.*needs 2 x 2"):
        build_op("Pad", [randn(3, 4), i64(1, 1)], consts=(1,), name="pd")
    with pytest.raises(ShapeError, match="pd.*crop more"):
        build_op("Pad", [randn(3, 4), i64(-2, 0, -2, 0)], consts=(1,), name="pd")
    with pytest.raises(UnsupportedOpError, match="mode"):
        build_op("Pad", [randn(3, 4), i64(0, 0, 0, 0)], consts=(1,), mode="mirror")


# Resize -----------------------------------------------------------------------------------------
COORD_MODES = ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel", "half_pixel_symmetric"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
F32 = np.float32


def _resize_pair(x, scales=None, sizes=None, **attrs):
    empty = np.zeros(0, dtype=F32)
    ours = run_op("Resize", [x, None, scales, sizes], consts=(2, 3), **attrs)[0]
    ref = onnx_ref("Resize", [x, empty, scales if scales is not None else empty, sizes], opset=19, **attrs)[0]
    return ours, ref


@pytest.mark.parametrize("ctm", COORD_MODES)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("scales", [(1, 1, 2.0, 3.0), (1, 1, 0.6, 0.5), (1, 1, 1.7, 0.8)])
def test_resize_nearest(ctm, nearest_mode, scales):
    x = randn(1, 2, 5, 4)
    ours, ref = _resize_pair(x, scales=np.array(scales, dtype=F32), mode="nearest",
                             coordinate_transformation_mode=ctm, nearest_mode=nearest_mode)
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("ctm", COORD_MODES)
@pytest.mark.parametrize("scales,sizes", [
    ((1, 1, 2.0, 3.0), None), ((1, 1, 0.6, 0.5), None), (None, (1, 2, 7, 3)), (None, (1, 2, 1, 1)),
    ((1.0, 2.0, 1.5, 0.75), None),  # N-d linear: every axis is interpolated
])
def test_resize_linear(ctm, scales, sizes):
    x = randn(1, 2, 5, 4)
    ours, ref = _resize_pair(x, scales=None if scales is None else np.array(scales, dtype=F32),
                             sizes=None if sizes is None else np.array(sizes, dtype=I64),
                             mode="linear", coordinate_transformation_mode=ctm)
    assert_close(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_with_axes(policy):
    x = randn(1, 1, 4, 6)
    sizes = i64(7, 7)
    ours = run_op("Resize", [x, None, None, sizes], consts=(3,), mode="linear", axes=[2, 3],
                  keep_aspect_ratio_policy=policy)[0]
    empty = np.zeros(0, dtype=F32)
    ref = onnx_ref("Resize", [x, empty, empty, sizes], opset=19, mode="linear", axes=[2, 3],
                   keep_aspect_ratio_policy=policy)[0]
    assert ours.shape == {"not_larger": (1, 1, 5, 7), "not_smaller": (1, 1, 7, 11)}[policy]
    assert_close(ours, ref, rtol=1e-5, atol=1e-6)


def test_resize_tf_crop_and_resize_extrapolates():
    x = randn(1, 1, 4, 4)
    roi = np.array([0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7], dtype=F32)
    sizes = i64(1, 1, 3, 3)
    attrs = dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0)
    ours = run_op("Resize", [x, roi, None, sizes], consts=(1, 3), **attrs)[0]
    ref = onnx_ref("Resize", [x, roi, np.zeros(0, dtype=F32), sizes], opset=19, **attrs)[0]
    assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    assert (ours == 10.0).any()


def test_resize_nearest_by_hand():
    # asymmetric + floor: output o reads input floor(o / 2) -- plain nearest-neighbour upsampling.
    x = np.array([[[[1, 2], [3, 4]]]], dtype=F32)
    got = run1("Resize", x, None, np.array([1, 1, 2, 2], dtype=F32), consts=(2,), mode="nearest",
               coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    np.testing.assert_array_equal(got[0, 0], [[1, 1, 2, 2], [1, 1, 2, 2], [3, 3, 4, 4], [3, 3, 4, 4]])


@pytest.mark.parametrize("nearest_mode,want", [
    # tf_half_pixel_for_nearest (opset <= 17; neither ONNX's reference nor onnxruntime has it):
    # x = (o + 0.5) / 2 = 0.25, 0.75, 1.25, ..., 3.75, rounded, then clamped to the last index 3.
    ("round_prefer_floor", [0, 1, 1, 2, 2, 3, 3, 3]),
    ("floor", [0, 0, 1, 1, 2, 2, 3, 3]),
    ("ceil", [1, 1, 2, 2, 3, 3, 3, 3]),
])
def test_resize_tf_half_pixel_for_nearest_by_hand(nearest_mode, want):
    x = np.array([10, 11, 12, 13], dtype=F32)
    got = run1("Resize", x, None, np.array([2.0], dtype=F32), consts=(2,), mode="nearest",
               coordinate_transformation_mode="tf_half_pixel_for_nearest", nearest_mode=nearest_mode)
    np.testing.assert_array_equal(got, x[want])


def test_resize_refuses_unknown_modes_and_bad_operands():
    x = randn(1, 1, 4, 4)
    scales = np.array([1, 1, 2, 2], dtype=F32)
    with pytest.raises(UnsupportedOpError, match="mode='lanczos'"):
        build_op("Resize", [x, None, scales], consts=(2,), mode="lanczos")
    with pytest.raises(UnsupportedOpError, match="exclude_outside=3"):
        build_op("Resize", [x, None, scales], consts=(2,), mode="cubic", exclude_outside=3)
    with pytest.raises(ShapeError, match="rz.*exactly one"):
        build_op("Resize", [x, None, scales, i64(1, 1, 8, 8)], consts=(2, 3), name="rz")
    with pytest.raises(ShapeError, match="rz.*scales"):
        build_op("Resize", [x, None, np.array([2, 2], dtype=F32)], consts=(2,), name="rz")


# Shape / ConstantOfShape / Constant ----------------------------------------------------------------
@pytest.mark.parametrize("start,end", [(0, None), (1, None), (-1, None), (1, -1), (-10, 10), (3, 1)])
def test_shape(start, end):
    x = randn(2, 3, 4)
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    got = run1("Shape", x, **attrs)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, onnx_ref("Shape", [x], **attrs)[0])


def test_constant_of_shape():
    got = run1("ConstantOfShape", i64(2, 3), consts=(0,))
    assert got.dtype == np.float32 and got.shape == (2, 3) and not got.any()
    got = run1("ConstantOfShape", i64(4), consts=(0,), value=np.array([7], dtype=np.int32))
    assert got.dtype == np.int32 and got.tolist() == [7] * 4
    assert run1("ConstantOfShape", np.zeros(0, dtype=I64), consts=(0,)).shape == ()


@pytest.mark.parametrize("attrs,want", [
    ({"value": np.arange(6, dtype=np.float32).reshape(2, 3)}, np.arange(6, dtype=np.float32).reshape(2, 3)),
    ({"value_float": 2.5}, np.array(2.5, dtype=np.float32)),
    ({"value_floats": [1.0, 2.0]}, np.array([1, 2], dtype=np.float32)),
    ({"value_int": 3}, np.array(3, dtype=np.int64)),
    ({"value_ints": [1, 2, 3]}, np.array([1, 2, 3], dtype=np.int64)),
])
def test_constant(attrs, want):
    got = run1("Constant", **attrs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_constant_errors():
    with pytest.raises(ShapeError, match="k.*exactly one"):
        build_op("Constant", [], name="k", value_int=1, value_float=2.0)
    with pytest.raises(UnsupportedOpError, match="value_string"):
        build_op("Constant", [], value_string="abc")


# Costs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op,inputs,consts,attrs", [
    ("Concat", [randn(2, 3), randn(2, 3)], (), {"axis": 0}),
    ("Slice", [randn(4, 5), i64(1), i64(3)], (1, 2), {}),
    ("Gather", [randn(4, 5), i64(0, 2)], (), {}),
    ("Reshape", [randn(4, 5), i64(20)], (1,), {}),
    ("Flatten", [randn(2, 3, 4)], (), {}),
    ("Transpose", [randn(2, 3)], (), {}),
    ("Squeeze", [randn(1, 3)], (), {}),
    ("Unsqueeze", [randn(3)], (), {"axes": [0]}),
    ("Expand", [randn(3, 1), i64(3, 4)], (1,), {}),
    ("Pad", [randn(3, 4), i64(1, 1, 1, 1)], (1,), {}),
    ("Resize", [randn(1, 1, 2, 2), None, np.array([1, 1, 2, 2], dtype=F32)], (2,), {}),
    ("Shape", [randn(2, 3)], (), {}),
    ("ConstantOfShape", [i64(2, 3)], (0,), {}),
])
def test_data_movement_costs_no_flops_but_moves_bytes(op, inputs, consts, attrs):
    from opfuse.ops import get_spec
    node = build_op(op, inputs, consts=consts, **attrs).nodes[0]
    spec = get_spec(op)
    assert spec.flops(node) == 0
    assert spec.bytes_written(node) == sum(v.nbytes for v in node.outputs) > 0


def test_linear_resize_counts_interpolation_flops():
    from opfuse.ops import get_spec
    node = build_op("Resize", [randn(1, 1, 2, 2), None, np.array([1, 1, 2, 2], dtype=F32)], consts=(2,),
                    mode="linear").nodes[0]
    # two resized axes, 3 FLOPs (two multiplies, one add) per output element per axis
    assert get_spec("Resize").flops(node) == 3 * 16 * 2
