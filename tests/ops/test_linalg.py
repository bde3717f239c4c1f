"""MatMul (NumPy semantics) and Gemm."""
from __future__ import annotations

import numpy as np
import pytest

from op_harness import assert_close, build_op, onnx_ref, run1
from opfuse.errors import ShapeError
from opfuse.ops import get_spec

RNG = np.random.default_rng(7)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("sa,sb", [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),          # batched x matrix
    ((2, 1, 3, 4), (5, 4, 6)),    # broadcast batch axes
    ((4,), (4, 5)),               # 1-D left operand: row vector, axis dropped
    ((2, 3, 4), (4,)),            # 1-D right operand: column vector, axis dropped
    ((4,), (4,)),                 # dot product -> scalar
    ((1, 1, 4), (3, 4, 2)),
])
def test_matmul_numpy_semantics(sa, sb):
    a, b = randn(*sa), randn(*sb)
    got = run1("MatMul", a, b)
    assert_close(got, np.matmul(a.astype(np.float64), b.astype(np.float64)), rtol=1e-5, atol=1e-5)
    assert_close(got, onnx_ref("MatMul", [a, b])[0], rtol=1e-5, atol=1e-5)


def test_matmul_integers_stay_integers():
    a = RNG.integers(-5, 5, (3, 4)).astype(np.int32)
    b = RNG.integers(-5, 5, (4, 2)).astype(np.int32)
    got = run1("MatMul", a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a @ b)


def test_matmul_flops_is_2mnk_batch():
    node = build_op("MatMul", [randn(3, 5, 4), randn(4, 7)]).nodes[0]
    assert get_spec("MatMul").flops(node) == 2 * 5 * 7 * 4 * 3


@pytest.mark.parametrize("sa,sb,fragment", [
    ((3, 4), (5, 6), "inner dimensions"),
    ((2, 3, 4), (3, 4, 5), "do not broadcast"),
    ((4,), (3,), "inner dimensions"),
])
def test_matmul_shape_errors_name_the_node(sa, sb, fragment):
    with pytest.raises(ShapeError, match=f"mm.*{fragment}"):
        build_op("MatMul", [randn(*sa), randn(*sb)], name="mm")


@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("c_shape", [None, (), (5,), (1, 5), (3, 1), (3, 5)])
def test_gemm_matches_onnx_reference(trans_a, trans_b, c_shape):
    a = randn(4, 3) if trans_a else randn(3, 4)
    b = randn(5, 4) if trans_b else randn(4, 5)
    c = randn(*c_shape) if c_shape is not None else None
    attrs = dict(alpha=0.5, beta=2.0, transA=trans_a, transB=trans_b)
    got = run1("Gemm", a, b, c, consts=(1, 2), **attrs)
    want = onnx_ref("Gemm", [a, b] + ([c] if c is not None else []), **attrs)[0]
    assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_gemm_defaults_and_flops():
    a, b, c = randn(2, 3), randn(3, 4), randn(4)
    assert_close(run1("Gemm", a, b, c), a.astype(np.float64) @ b + c, rtol=1e-5, atol=1e-6)
    node = build_op("Gemm", [a, b, c]).nodes[0]
    assert get_spec("Gemm").flops(node) == 2 * 2 * 4 * 3 + 2 * 4


def test_gemm_shape_errors_name_the_node():
    with pytest.raises(ShapeError, match="fc.*inner dimensions"):
        build_op("Gemm", [randn(2, 3), randn(4, 5)], name="fc")
    with pytest.raises(ShapeError, match="fc.*2-D"):
        build_op("Gemm", [randn(2, 3, 3), randn(3, 5)], name="fc")
    with pytest.raises(ShapeError, match="fc"):
        build_op("Gemm", [randn(2, 3), randn(3, 5), randn(3)], name="fc")


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 5, 5), (1, 1), (6, 2, 2)])
def test_det_matches_the_onnx_reference(shape):
    x = randn(*shape)
    want = onnx_ref("Det", [x], opset=22)[0]
    assert_close(run1("Det", x), want, rtol=1e-5, atol=1e-6)


def test_det_of_singular_and_permutation_matrices():
    x = np.array([[[0, 1], [1, 0]], [[1, 2], [2, 4]], [[0, 0], [0, 0]]], np.float32)
    np.testing.assert_array_equal(run1("Det", x), np.array([-1, 0, 0], np.float32))


@pytest.mark.parametrize("shape,dtype", [((3, 4), np.float32), ((3,), np.float32), ((2, 2), np.int32)])
def test_det_needs_square_float_matrices(shape, dtype):
    with pytest.raises(ShapeError, match=r"input must be floating point \(\.\.\., M, M\)"):
        build_op("Det", [np.zeros(shape, dtype)])
