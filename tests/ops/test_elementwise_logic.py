"""Issue 12's elementwise ops (activations, rounding, trigonometry, PRelu, Mod) and the
comparisons and logic ops, against onnxruntime (and ONNX's reference where onnxruntime lacks
a type)."""
from __future__ import annotations

import numpy as np
import pytest

from op_harness import assert_close, build_op, onnx_ref, ort_ref, run1
from opfuse.errors import InputError, ShapeError
from opfuse.ops import Category, get_spec

RNG = np.random.default_rng(12)
X = (RNG.standard_normal((3, 4, 5)) * 3).astype(np.float32)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 30.0, -30.0, 1e-6], np.float32)


@pytest.mark.parametrize("op,attrs", [
    ("Elu", {}), ("Elu", {"alpha": 0.5}), ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 3.0}), ("Celu", {}),
    ("Celu", {"alpha": 2.0}), ("Mish", {}), ("ThresholdedRelu", {}), ("ThresholdedRelu", {"alpha": 0.5}),
    ("Softsign", {}), ("Floor", {}), ("Ceil", {}), ("Round", {}), ("Sign", {}), ("Sin", {}), ("Cos", {}),
])
def test_unary_matches_onnxruntime(op, attrs):
    for x in (X, SPECIAL):
        got = run1(op, x, **attrs)
        want = ort_ref(op, [x], **attrs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True, err_msg=f"{op} {x}")


def test_round_is_half_to_even():
    x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 2.4999998, 8388609.0], np.float32)
    assert run1("Round", x).tolist() == [-2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 2.0, 8388609.0]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_sign_of_integers_and_doubles(dtype):
    x = np.array([-3, 0, 5, -1], dtype)
    assert_close(run1("Sign", x), onnx_ref("Sign", [x])[0])


def test_isnan_isinf():
    assert run1("IsNaN", SPECIAL).tolist() == np.isnan(SPECIAL).tolist()
    for pos, neg in ((1, 1), (1, 0), (0, 1)):
        got = run1("IsInf", SPECIAL, detect_positive=pos, detect_negative=neg)
        assert got.dtype == np.bool_
        assert got.tolist() == onnx_ref("IsInf", [SPECIAL], detect_positive=pos, detect_negative=neg)[0].tolist()


@pytest.mark.parametrize("op", ["Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_comparisons_broadcast_like_onnxruntime(op, dtype):
    a = np.round(X).astype(dtype)
    b = np.round(X[0, :, :1] * 0.5).astype(dtype)
    got = run1(op, a, b)
    assert got.dtype == np.bool_ and got.tolist() == ort_ref(op, [a, b])[0].tolist()


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_ops(op):
    a = RNG.integers(0, 2, (3, 4)).astype(bool)
    b = RNG.integers(0, 2, (4,)).astype(bool)
    assert run1(op, a, b).tolist() == ort_ref(op, [a, b])[0].tolist()
    assert run1("Not", a).tolist() == (~a).tolist()


def test_prelu_slope_broadcasts_to_x():
    slope = RNG.standard_normal((4, 1)).astype(np.float32)
    assert_close(run1("PRelu", X, slope), ort_ref("PRelu", [X, slope])[0])
    with pytest.raises(ShapeError, match="does not broadcast to X"):
        build_op("PRelu", [X[0], RNG.standard_normal((2, 4, 5)).astype(np.float32)])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_mod_matches_onnxruntime(fmod, dtype):
    if dtype == np.float32 and fmod == 0:
        pytest.skip("onnxruntime refuses fmod=0 for floats; ONNX's reference is checked below")
    a = np.array([[-7, 7, -8, 8, 5, -5]], dtype) * (np.float32(1.3) if dtype == np.float32 else 1)
    b = np.array([3, -3, 3, -3, 2, 2], dtype)
    assert_close(run1("Mod", a.astype(dtype), b, fmod=fmod), ort_ref("Mod", [a.astype(dtype), b], fmod=fmod)[0])


def test_float_mod_floored_has_the_divisor_sign():
    a, b = np.array([-7.5, 7.5, 3.0, -0.5], np.float32), np.array([2.0, -2.0, 1.5, 4.0], np.float32)
    assert_close(run1("Mod", a, b), onnx_ref("Mod", [a, b])[0])


def test_integer_mod_by_zero_names_the_node():
    with pytest.raises(InputError, match="modulo by zero"):
        run1("Mod", np.array([3], np.int64), np.array([0], np.int64))


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.int8, np.int64])
def test_bitshift_matches_onnx_reference(direction, dtype):
    info = np.iinfo(dtype)
    x = np.array([1, 3, info.max, info.min, 5, info.max // 3], dtype)
    y = np.array([1, 0, 3, 1, info.bits, info.bits - 1], dtype)
    if info.min < 0:
        y = np.concatenate([y, [-1]]).astype(dtype)
        x = np.concatenate([x, [-9]]).astype(dtype)
    got = run1("BitShift", x, y, direction=direction)
    assert got.tolist() == onnx_ref("BitShift", [x, y], opset=28, direction=direction)[0].tolist()


@pytest.mark.parametrize("op", ["Elu", "Selu", "Celu", "Mish", "Floor", "Round", "Sign", "Sin", "IsNaN", "Not"])
def test_unary_ops_are_elementwise(op):
    assert get_spec(op).category == Category.ELEMWISE and get_spec(op).is_pointwise


@pytest.mark.parametrize("op", ["PRelu", "Greater", "LessOrEqual", "And", "Xor", "Mod", "BitShift"])
def test_binary_ops_are_broadcast(op):
    assert get_spec(op).category == Category.BROADCAST and get_spec(op).is_pointwise


@pytest.mark.parametrize("op", ["Sum", "Mean"])
def test_sum_and_mean_of_several_broadcast_operands(op):
    a, b, c = X, X[0], X[:, :1, :1]
    assert_close(run1(op, a, b, c), ort_ref(op, [a, b, c])[0])
    assert_close(run1(op, a), a)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise_ops(op):
    a = np.array([[5, -3, 255, 0]], np.int32)
    b = np.array([3, 6, -1, 9], np.int32)
    assert run1(op, a, b).tolist() == ort_ref(op, [a, b])[0].tolist()
    assert run1("BitwiseNot", a).tolist() == (~a).tolist()


def test_bitcast_reads_the_same_bits():
    x = np.array([1.0, -2.5, np.inf], np.float32)
    assert run1("BitCast", x, to=6).tolist() == x.view(np.int32).tolist()
    with pytest.raises(Exception, match="size"):
        build_op("BitCast", [x], to=7)



@pytest.mark.parametrize("op,x", [("Tan", X / 4), ("Asin", np.tanh(X)), ("Acos", np.tanh(X)), ("Atan", X),
                                  ("Sinh", X), ("Cosh", X), ("Asinh", X), ("Acosh", np.abs(X) + 1),
                                  ("Atanh", np.tanh(X))])
def test_trigonometric_family(op, x):
    x = x.astype(np.float32)
    assert_close(run1(op, x), ort_ref(op, [x])[0], rtol=1e-5, atol=1e-6)
