"""Integer Div and Pow in the reference: exact, truncating like ONNX and onnxruntime, never a traceback."""
from __future__ import annotations

import numpy as np
import pytest

from op_harness import run1
from opfuse.errors import InputError

I64 = np.int64
INT64_MIN = np.iinfo(I64).min


def test_int64_div_is_exact_above_2_pow_53():
    a = np.array([2 ** 62 + 1, 2 ** 62 + 3, -(2 ** 62) - 3, 2 ** 53 + 1], I64)
    b = np.array([1, 2, 2, 3], I64)
    want = np.array([_trunc_div(int(x), int(y)) for x, y in zip(a, b, strict=True)], I64)
    np.testing.assert_array_equal(run1("Div", a, b), want)


def _trunc_div(x: int, y: int) -> int:
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64, np.uint8])
def test_int_div_truncates_toward_zero(dtype):
    lo = 0 if np.issubdtype(dtype, np.unsignedinteger) else -9
    a = np.arange(lo, 10, dtype=dtype)
    for d in ([2, 3, 7] if lo == 0 else [2, -2, 3, -3, 7, -7]):
        b = np.full_like(a, d)
        want = np.array([_trunc_div(int(x), d) for x in a]).astype(dtype)
        np.testing.assert_array_equal(run1("Div", a, b), want)


def test_int_min_div_minus_one_wraps():
    a = np.array([INT64_MIN, -128], I64)
    np.testing.assert_array_equal(run1("Div", a, np.array([-1, -1], I64)), [INT64_MIN, 128])
    np.testing.assert_array_equal(run1("Div", np.array([-128], np.int8), np.array([-1], np.int8)), [-128])


def test_int_div_by_zero_is_an_input_error_naming_the_node():
    with pytest.raises(InputError, match="node0.*Div.*division by zero"):
        run1("Div", np.array([1, 2], I64), np.array([1, 0], I64))


def test_float_div_by_zero_stays_ieee():
    with np.errstate(divide="ignore"):
        y = run1("Div", np.array([1.0, -1.0], np.float32), np.array([0.0, 0.0], np.float32))
    np.testing.assert_array_equal(y, [np.inf, -np.inf])


def test_int_pow_negative_exponent_matches_onnxruntime():
    # onnxruntime truncates the real power: 2**-1 = 0, 1**-2 = 1, (-1)**-3 = -1, (-1)**-2 = 1
    a = np.array([2, 1, -1, -1, 3, 2], I64)
    b = np.array([-1, -2, -3, -2, -1, 10], I64)
    np.testing.assert_array_equal(run1("Pow", a, b), [0, 1, -1, 1, 0, 1024])


def test_int_pow_zero_to_negative_power_is_an_input_error():
    with pytest.raises(InputError, match="node0.*Pow.*negative power"):
        run1("Pow", np.array([0], I64), np.array([-1], I64))


