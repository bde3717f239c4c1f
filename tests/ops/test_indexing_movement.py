"""Issue 12's data movement (Tile, DepthToSpace, SpaceToDepth) and index-driven ops
(GatherElements, GatherND, OneHot, Trilu, Range), against ONNX's reference and onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest

from op_harness import assert_close, build_op, onnx_ref, ort_ref, run1
from opfuse.errors import InputError, ShapeError, UnsupportedOpError
from opfuse.ops import Category, Mapping, get_spec

RNG = np.random.default_rng(13)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def test_tile():
    x, reps = randn(2, 3), np.array([2, 3], np.int64)
    assert_close(run1("Tile", x, reps, consts=[1]), onnx_ref("Tile", [x, reps])[0])


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    x = randn(2, 8, 3, 2)
    want = ort_ref("DepthToSpace", [x], blocksize=2, mode=mode)[0]
    assert_close(run1("DepthToSpace", x, blocksize=2, mode=mode), want)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_to_depth_inverts_depth_to_space(mode):
    x = randn(1, 3, 4, 6)
    y = run1("SpaceToDepth", x, blocksize=2, mode=mode)
    if mode == "DCR":
        assert_close(y, ort_ref("SpaceToDepth", [x], blocksize=2)[0])
    assert_close(run1("DepthToSpace", y, blocksize=2, mode=mode), x)


def test_space_to_depth_needs_divisible_sizes():
    with pytest.raises(ShapeError, match="multiples of blocksize 2"):
        build_op("SpaceToDepth", [randn(1, 1, 3, 4)], blocksize=2)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = randn(3, 4)
    idx = RNG.integers(-3, 3, (2, 4)).astype(np.int64)
    # ONNX's reference wants equal extents off the axis; onnxruntime (and the spec) allow smaller.
    assert_close(run1("GatherElements", x, idx, axis=axis), ort_ref("GatherElements", [x, idx], axis=axis)[0])


def test_gather_elements_out_of_range_names_the_node():
    with pytest.raises(InputError, match="GatherElements.*out of range"):
        run1("GatherElements", randn(3), np.array([3], np.int64))


@pytest.mark.parametrize("batch_dims,idx", [(0, [[0, 1], [1, -1]]), (0, [[1], [0]]), (1, [[[1], [0]], [[2], [2]]])])
def test_gather_nd(batch_dims, idx):
    x = randn(2, 3, 4)
    idx = np.array(idx, np.int64)
    want = onnx_ref("GatherND", [x, idx], batch_dims=batch_dims)[0]
    assert_close(run1("GatherND", x, idx, batch_dims=batch_dims), want)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis):
    idx = np.array([[0, 3, -1], [7, -4, 2]], np.int64)
    depth, values = np.array(4, np.int64), np.array([-2.0, 5.0], np.float32)
    got = run1("OneHot", idx, depth, values, consts=[1], axis=axis)
    assert_close(got, ort_ref("OneHot", [idx, depth, values], axis=axis)[0])


def test_onehot_depth_must_be_a_constant():
    with pytest.raises(UnsupportedOpError, match="depth.*must be a constant"):
        build_op("OneHot", [np.zeros(2, np.int64), np.array(3, np.int64), np.array([0, 1], np.float32)])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -1, 2])
def test_trilu(upper, k):
    x = randn(2, 4, 5)
    inputs = [x] if k is None else [x, np.array(k, np.int64)]
    assert_close(run1("Trilu", *inputs, upper=upper), onnx_ref("Trilu", inputs, upper=upper)[0])


@pytest.mark.parametrize("start,limit,delta,dtype", [(0, 5, 1, np.int64), (10, -3, -4, np.int32),
                                                     (-1.5, 2.0, 0.25, np.float32), (3, 3, 1, np.int64)])
def test_range(start, limit, delta, dtype):
    args = [np.array(v, dtype) for v in (start, limit, delta)]
    got = run1("Range", *args, consts=[0, 1, 2])
    assert got.dtype == dtype
    assert_close(got, onnx_ref("Range", args)[0])


def test_range_with_runtime_inputs_is_refused():
    with pytest.raises(UnsupportedOpError, match="must be a constant"):
        build_op("Range", [np.array(0, np.int64), np.array(3, np.int64), np.array(1, np.int64)], consts=[1, 2])


@pytest.mark.parametrize("op,category,mapping", [
    ("Tile", Category.INJECTIVE, Mapping.ONE_TO_MANY), ("DepthToSpace", Category.INJECTIVE, Mapping.ONE_TO_ONE),
    ("SpaceToDepth", Category.INJECTIVE, Mapping.ONE_TO_ONE),
    ("GatherElements", Category.INJECTIVE, Mapping.ONE_TO_MANY), ("GatherND", Category.INJECTIVE, Mapping.ONE_TO_MANY),
    ("OneHot", Category.INJECTIVE, Mapping.ONE_TO_MANY), ("Trilu", Category.ELEMWISE, Mapping.ONE_TO_ONE),
    ("Range", Category.INJECTIVE, Mapping.ONE_TO_MANY)])
def test_categories(op, category, mapping):
    spec = get_spec(op)
    assert (spec.category, spec.mapping) == (category, mapping)
