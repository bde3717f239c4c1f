"""Softmax, LayerNormalization and the Reduce ops."""
from __future__ import annotations

import numpy as np
import pytest

from op_harness import assert_close, build_op, onnx_ref, run1, run_op
from opfuse.errors import ShapeError, UnsupportedOpError
from opfuse.ops import get_spec

RNG = np.random.default_rng(11)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
def test_softmax_matches_onnx_reference(axis):
    x = randn(2, 3, 4)
    got = run1("Softmax", x, axis=axis)
    assert_close(got, onnx_ref("Softmax", [x], axis=axis)[0])
    assert_close(got.sum(axis=axis), np.ones(np.delete(x.shape, axis)), atol=1e-6)


@pytest.mark.parametrize("shape,axis", [((2, 0), -1), ((0, 3), -1), ((2, 0, 3), 1)])
def test_softmax_of_a_zero_size_tensor_is_empty(shape, axis):
    got = run1("Softmax", np.zeros(shape, np.float32), axis=axis)
    assert got.shape == shape and got.dtype == np.float32


def test_softmax_is_numerically_stable():
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]], dtype=np.float32)
    got = run1("Softmax", x)
    e = np.exp([0.0, 1.0, 2.0])
    assert_close(got[0], e / e.sum())
    assert_close(got[1], e[::-1] / e.sum())


def test_softmax_axis_error_names_the_node():
    with pytest.raises(ShapeError, match="sm.*axis 3"):
        build_op("Softmax", [randn(2, 3)], name="sm", axis=3)


@pytest.mark.parametrize("axis", [-1, -2, 1, 0])
@pytest.mark.parametrize("with_bias", [True, False])
def test_layer_norm_matches_onnx_reference(axis, with_bias):
    x = randn(2, 3, 5)
    norm_shape = x.shape[axis:]
    scale, bias = randn(*norm_shape), randn(*norm_shape)
    ins = [x, scale] + ([bias] if with_bias else [])
    got = run_op("LayerNormalization", ins, consts=(1, 2), num_outputs=3, axis=axis, epsilon=1e-3)
    want = onnx_ref("LayerNormalization", ins, num_outputs=3, axis=axis, epsilon=1e-3)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_layer_norm_single_output_by_hand():
    x = np.array([[1.0, 2.0, 3.0, 4.0]], dtype=np.float32)
    mean, var = 2.5, 1.25
    want = (x - mean) / np.sqrt(var + 1e-5) * 2.0 + 1.0
    got = run1("LayerNormalization", x, np.full(4, 2.0, np.float32), np.ones(4, np.float32), consts=(1, 2))
    assert_close(got, want)


def test_layer_norm_errors():
    with pytest.raises(ShapeError, match="ln.*Scale"):
        build_op("LayerNormalization", [randn(2, 4), randn(3)], consts=(1,), name="ln")
    with pytest.raises(UnsupportedOpError, match="stash_type"):
        build_op("LayerNormalization", [randn(2, 4), randn(4)], consts=(1,), stash_type=7)


REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceMax")


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("axes", [None, [0], [1, -1], [-2], [0, 1, 2]])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_matches_onnx_reference(op, axes, keepdims):
    x = randn(2, 3, 4)
    got = run1(op, x, axes=axes, keepdims=keepdims)
    ins = [x] if axes is None else [x, np.array(axes, dtype=np.int64)]
    assert_close(got, onnx_ref(op, ins, keepdims=keepdims)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_noop_with_empty_axes(op):
    x = randn(2, 3)
    np.testing.assert_array_equal(run1(op, x, axes=[], noop_with_empty_axes=1), x)
    assert run1(op, x, axes=[], keepdims=0).shape == ()


def test_reduce_empty_set_identities():
    x = np.zeros((2, 0, 4), dtype=np.float32)
    assert_close(run1("ReduceSum", x, axes=[1]), np.zeros((2, 1, 4)))
    assert np.all(run1("ReduceMax", x, axes=[1], keepdims=0) == -np.inf)
    assert np.all(run1("ReduceMax", x.astype(np.int32), axes=[1]) == np.iinfo(np.int32).min)


def test_reduce_integer_and_flops():
    x = RNG.integers(-9, 9, (3, 4)).astype(np.int64)
    np.testing.assert_array_equal(run1("ReduceSum", x, axes=[1]), x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(run1("ReduceMax", x, axes=[0], keepdims=0), x.max(axis=0))
    node = build_op("ReduceMean", [randn(3, 4)], axes=[1]).nodes[0]
    assert get_spec("ReduceMean").flops(node) == 12


def test_reduce_errors_name_the_node():
    with pytest.raises(ShapeError, match="rs.*repeat"):
        build_op("ReduceSum", [randn(3, 4)], name="rs", axes=[1, -1])
    with pytest.raises(ShapeError, match="rs.*axis 2 out of range"):
        build_op("ReduceSum", [randn(3, 4)], name="rs", axes=[2])


# Issue 12's reductions ----------------------------------------------------------------------
NEW_REDUCE = ["ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
              "ReduceLogSumExp"]


@pytest.mark.parametrize("op", NEW_REDUCE)
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, 2], 0), (None, 1)])
def test_new_reductions_match_onnx_reference(op, axes, keepdims):
    x = np.abs(randn(2, 3, 4)) + 0.5 if op == "ReduceLogSum" else randn(2, 3, 4)
    attrs = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    inputs = [x] + ([np.array(axes, np.int64)] if axes is not None else [])
    assert_close(run1(op, x, **attrs), onnx_ref(op, inputs, keepdims=keepdims)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,identity", [("ReduceMin", np.inf), ("ReduceProd", 1.0), ("ReduceL1", 0.0),
                                         ("ReduceL2", 0.0), ("ReduceSumSquare", 0.0),
                                         ("ReduceLogSumExp", -np.inf), ("ReduceLogSum", -np.inf)])
def test_reduction_over_an_empty_axis_is_the_identity(op, identity):
    got = run1(op, np.zeros((2, 0, 3), np.float32), axes=[1], keepdims=0)
    assert got.shape == (2, 3) and np.all(got == identity)


def test_log_sum_exp_does_not_overflow():
    x = np.array([[1000.0, 1000.0], [-1000.0, -np.inf]], np.float32)
    assert_close(run1("ReduceLogSumExp", x, axes=[1], keepdims=0), [1000.0 + np.log(2.0), -1000.0])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_log_softmax_and_hardmax_match_onnx_reference(axis):
    x = randn(2, 3, 4)
    x[0, 0, :2] = 5.0  # a tie: Hardmax picks the first
    assert_close(run1("LogSoftmax", x, axis=axis), onnx_ref("LogSoftmax", [x], axis=axis)[0])
    assert_close(run1("Hardmax", x, axis=axis), onnx_ref("Hardmax", [x], axis=axis)[0])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (-1, 0, 0), (1, 1, 1)])
def test_arg_reductions_match_onnx_reference(op, axis, keepdims, last):
    x = np.round(randn(3, 4, 5))  # ties
    got = run1(op, x, axis=axis, keepdims=keepdims, select_last_index=last)
    want = onnx_ref(op, [x], axis=axis, keepdims=keepdims, select_last_index=last)[0]
    assert got.dtype == np.int64 and got.tolist() == want.tolist()


def test_arg_reduction_over_an_empty_axis_is_refused():
    with pytest.raises(ShapeError, match="empty"):
        build_op("ArgMax", [np.zeros((2, 0), np.float32)], axis=1)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("axis", [0, -1])
def test_cumsum_matches_onnx_reference(exclusive, reverse, axis):
    x = randn(3, 4)
    a = np.array(axis, np.int64)
    got = run1("CumSum", x, a, consts=[1], exclusive=exclusive, reverse=reverse)
    assert_close(got, onnx_ref("CumSum", [x, a], exclusive=exclusive, reverse=reverse)[0])


def test_cumsum_axis_must_be_a_constant():
    with pytest.raises(UnsupportedOpError, match="axis.*must be a constant"):
        build_op("CumSum", [randn(3), np.array(0, np.int64)])


def test_global_max_pool_matches_onnx_reference():
    x = randn(2, 3, 4, 5)
    assert_close(run1("GlobalMaxPool", x), onnx_ref("GlobalMaxPool", [x])[0])


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 1)])
def test_cumprod_matches_onnx_reference(exclusive, reverse):
    x = randn(3, 4)
    a = np.array(1, np.int64)
    got = run1("CumProd", x, a, consts=[1], exclusive=exclusive, reverse=reverse)
    assert_close(got, onnx_ref("CumProd", [x, a], opset=26, exclusive=exclusive, reverse=reverse)[0])
