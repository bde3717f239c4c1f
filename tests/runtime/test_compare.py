"""``runtime.compare``: integer outputs compared exactly by every comparing tool (``run --compare`` in
tests/cli/test_cli_hostile.py; here ``opfuse bench``'s cross-check, ``opfuse ab``'s agreement and ``opfuse
bisect``'s per-tensor check). Through float64, uint64 values 3 apart near 2^64 are one number."""
from __future__ import annotations

import numpy as np

from opfuse.ab import _max_error
from opfuse.bench import cross_check
from opfuse.bisect import compare as bisect_compare
from opfuse.runtime.compare import integer_difference, integral

TOP = np.iinfo(np.uint64).max
A = np.array([TOP, TOP - 3, 7], np.uint64)
B = np.array([TOP - 3, TOP - 3, 7], np.uint64)


def test_integer_difference_is_exact():
    assert np.float64(A[0]) == np.float64(B[0])  # the reason
    assert integer_difference(A, B) == (3.0, 3.0 / float(TOP - 3))
    assert integer_difference(A, A) == (0.0, 0.0)
    i64 = np.iinfo(np.int64)
    assert integer_difference(np.array([i64.min]), np.array([i64.max])) == (float(2 ** 64 - 1),
                                                                            float(2 ** 64 - 1) / i64.max)
    assert integer_difference(np.array([3], np.int32), np.array([3], np.int64)) == (0.0, 0.0)
    assert integer_difference(np.array([[True, False]]), np.array([[False, False]])) == (1.0, 1.0)
    assert integral(A) and integral(np.array([True])) and not integral(np.array([1.0]))


def test_bench_cross_check_sees_an_integer_difference():
    same = cross_check({"x": {"t": A, "f": np.ones(2)}, "y": {"t": A.copy(), "f": np.ones(2)}})
    assert same["outputs_agree"] and same["pairs"] == {"x vs y": 0.0}
    diff = cross_check({"x": {"t": A, "f": np.ones(2)}, "y": {"t": B, "f": np.ones(2)}})
    assert not diff["outputs_agree"] and diff["pairs"] == {"x vs y": 3.0}
    # floats keep their relative tolerance
    assert cross_check({"x": {"f": np.array([1000.0])}, "y": {"f": np.array([1000.5])}})["outputs_agree"]


def test_ab_agreement_sees_an_integer_difference():
    assert _max_error({"t": A}, {"t": A.copy()})[2]
    err, tol, ok = _max_error({"t": A, "f": np.array([1.0])}, {"t": B, "f": np.array([1.0])})
    assert (err, ok) == (3.0, False) and tol == 1e-4  # the float outputs' tolerance (|f| <= 1): not the uint64's
    assert _max_error({"f": np.array([1000.05])}, {"f": np.array([1000.0])})[2]


def test_bisect_takes_any_integer_difference_as_a_miss():
    misses = bisect_compare({"t": A, "f": np.array([1.0])}, {"t": B, "f": np.array([1.0])})
    assert [(m.tensor, m.max_abs_error, m.tolerance) for m in misses] == [("t", 3.0, 0.0)]
    assert bisect_compare({"t": A}, {"t": A.copy()}) == []
