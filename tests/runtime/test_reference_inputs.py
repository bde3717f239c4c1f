"""Run-time inputs: a dtype mismatch is an InputError; ``cast=True`` converts only values that fit."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import ReferenceExecutor, check_inputs, run


def relu(dtype, shape=(3,)):
    """Relu, or Identity for the element types Relu does not take."""
    b = GraphBuilder("relu")
    op = "Identity" if np.dtype(dtype).kind in "ub" else "Relu"
    return b.build(b.op(op, b.input("x", shape, dtype), name="relu"))


@pytest.mark.parametrize("dtype,feed", [
    ("int8", np.array([300, 1, 2], np.int64)),       # was silently 44
    ("float32", np.array([1e39, 1.0, 2.0])),          # was silently inf
    ("float32", np.array([1.0, 2.0, 3.0])),           # fits, but casting is opt-in
    ("int32", np.array([1, 2, 3], np.int64)),
])
def test_a_dtype_mismatch_is_an_input_error_naming_the_input(dtype, feed):
    g = relu(dtype)
    with pytest.raises(InputError, match=f"input 'x' has dtype {feed.dtype}, the model expects {dtype}.*cast"):
        run(g, {"x": feed})
    with pytest.raises(InputError):
        ReferenceExecutor(g).run({"x": feed})


@pytest.mark.parametrize("dtype,feed,value", [
    ("int8", np.array([300, 1, 2], np.int64), "300"),
    ("uint8", np.array([1, -1, 2], np.int64), "-1"),
    ("int64", np.array([2 ** 63, 1, 1], np.uint64), str(2 ** 63)),
    ("float32", np.array([1.0, 1e39, 2.0]), "1e\\+39"),
    ("int32", np.array([1.0, 2.5, 3.0]), "2.5"),
    ("int32", np.array([1.0, np.nan, 3.0]), "nan"),
    ("int64", np.array([2.0 ** 63, 1.0, 1.0]), "9.22"),
])
def test_cast_refuses_values_that_do_not_fit(dtype, feed, value):
    with pytest.raises(InputError, match=f"input 'x': value {value}.*does not fit.*{dtype}"):
        run(relu(dtype), {"x": feed}, cast=True)


def test_cast_converts_values_that_fit():
    assert run(relu("int8"), {"x": np.array([127, -128, 0], np.int64)}, cast=True)["relu"].tolist() == [127, 0, 0]
    got = run(relu("float32"), {"x": np.array([0.1, np.nan, -np.inf])}, cast=True)["relu"]
    assert got.dtype == np.float32 and got[0] == np.float32(0.1) and np.isnan(got[1]) and got[2] == 0
    assert run(relu("int32"), {"x": np.array([3.0, -2.0, 0.0])}, cast=True)["relu"].tolist() == [3, 0, 0]


def test_strings_never_cast():
    with pytest.raises(InputError, match=r"is text \(<U1\), not an array of numbers"):
        check_inputs(relu("float32"), {"x": np.array(["a", "b", "c"])}, cast=True)


def test_byte_order_alone_is_not_a_mismatch():
    x = np.array([1.0, -2.0, 3.0], dtype=">f4")
    assert run(relu("float32"), {"x": x})["relu"].tolist() == [1.0, 0.0, 3.0]
