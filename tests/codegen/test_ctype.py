"""``codegen/ctype.py``: the C type of each dtype, exact literals (hexadecimal floats that round-trip, the
integer minimums written as expressions, narrow floats as their bits), libm names and the identities of max
and min. No compiler: each expectation is worked out by hand from C99 and the docstrings."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen.ctype import c_type, highest, is_float, literal, lowest, math_fn
from opfuse.errors import UnsupportedOpError
from opfuse.ir.dtypes import BFLOAT16, FLOAT16, FLOAT8S


@pytest.mark.parametrize(("dtype", "want"), [
    (np.float32, "float"), (np.float64, "double"), (np.int64, "int64_t"), (np.int32, "int32_t"),
    (np.int16, "int16_t"), (np.int8, "int8_t"), (np.uint8, "uint8_t"), (np.uint16, "uint16_t"),
    (np.uint32, "uint32_t"), (np.uint64, "uint64_t"), (np.bool_, "uint8_t"), (FLOAT16, "uint16_t"),
    (BFLOAT16, "uint16_t"), *((t, "uint8_t") for t in sorted(FLOAT8S, key=str)),
])
def test_c_type_of_every_supported_dtype(dtype, want):
    assert c_type(dtype) == want


def test_c_type_refuses_what_has_no_c_type_and_names_it():
    with pytest.raises(UnsupportedOpError) as e:
        c_type(np.complex64, "fft")
    assert str(e.value) == "unsupported op 'dtype' (node 'fft'): the C backend has no complex64 support"
    assert (e.value.op_type, e.value.node) == ("dtype", "fft")
    with pytest.raises(UnsupportedOpError) as e:
        c_type(np.complex128)
    assert str(e.value) == "unsupported op 'dtype': the C backend has no complex128 support"


def test_is_float_and_math_fn():
    assert is_float(np.float32) and is_float(np.float64) and is_float(FLOAT16)
    assert not is_float(np.int32) and not is_float(np.bool_)
    assert math_fn("exp", np.float32) == "expf"
    assert math_fn("exp", np.float64) == "exp"
    assert math_fn("exp", "float32") == "expf"


@pytest.mark.parametrize(("value", "dtype", "want"), [
    (3.0, np.float32, "0x1.8p+1f"),  # the mantissa's trailing zeros dropped
    (1.0, np.float32, "0x1p+0f"),  # and its point when nothing is left
    (0.1, np.float32, "0x1.99999ap-4f"),  # rounded to float32 first
    (0.1, np.float64, "0x1.999999999999ap-4"),
    (-2.5, np.float64, "-0x1.4p+1"),
    (0.0, np.float32, "0x0p+0f"),
    (-0.0, np.float32, "-0x0p+0f"),
    (1e-45, np.float32, "0x1p-149f"),  # the smallest subnormal
    (np.nan, np.float32, "(0.0f/0.0f)"),
    (np.nan, np.float64, "(0.0/0.0)"),
    (np.inf, np.float32, "HUGE_VALF"),
    (-np.inf, np.float32, "(-HUGE_VALF)"),
    (np.inf, np.float64, "HUGE_VAL"),
    (-np.inf, np.float64, "(-HUGE_VAL)"),
    (np.float64(2.0**-30 + 2.0**-60), np.float32, "0x1p-30f"),  # converted to the dtype first
])
def test_float_literals_are_exact_hex(value, dtype, want):
    assert literal(value, dtype) == want


@pytest.mark.parametrize(("value", "dtype", "want"), [
    (7, np.int64, "INT64_C(7)"),
    (-(2**63), np.int64, "INT64_MIN"),
    (-(2**63) + 1, np.int64, "INT64_C(-9223372036854775807)"),
    (2**64 - 1, np.uint64, "UINT64_C(18446744073709551615)"),
    (4294967295, np.uint32, "4294967295u"),
    (-(2**31), np.int32, "INT32_MIN"),
    (-(2**31) + 1, np.int32, "-2147483647"),
    (-128, np.int8, "-128"),
    (255, np.uint8, "255"),
    (2.9, np.int32, "2"),  # converted as NumPy converts
    (300, np.int16, "300"),
])
def test_integer_literals(value, dtype, want):
    assert literal(value, dtype) == want


def test_bool_and_narrow_float_literals():
    assert literal(True, np.bool_) == "1" and literal(0, np.bool_) == "0" and literal(2, np.bool_) == "1"
    assert literal(1.0, FLOAT16) == "0x3c00u"  # float16's bits, four hex digits
    assert literal(-2.0, FLOAT16) == "0xc000u"
    assert literal(1.0, BFLOAT16) == "0x3f80u"
    f8 = sorted(FLOAT8S, key=str)[0]
    bits = int(np.asarray(1.0, dtype=f8).view(np.uint8))
    assert literal(1.0, f8) == f"0x{bits:02x}u"


@pytest.mark.parametrize(("dtype", "low", "high"), [
    (np.float32, "(-HUGE_VALF)", "HUGE_VALF"),
    (np.float64, "(-HUGE_VAL)", "HUGE_VAL"),
    (np.bool_, "0", "1"),
    (np.int8, "-128", "127"),
    (np.uint8, "0", "255"),
    (np.int32, "INT32_MIN", "2147483647"),
    (np.int64, "INT64_MIN", "INT64_C(9223372036854775807)"),
    (np.uint32, "0u", "4294967295u"),
    (np.uint64, "UINT64_C(0)", "UINT64_C(18446744073709551615)"),
])
def test_lowest_and_highest_are_the_identities_of_max_and_min(dtype, low, high):
    assert lowest(dtype) == low
    assert highest(dtype) == high
