"""Output differences the comparing tools share (``run --compare``, ``opfuse bench``, ``opfuse ab``, ``opfuse
bisect``): integer outputs are compared exactly and allowed no difference, since integer arithmetic is exact in
every backend, and through float64 two 64-bit values a few apart near 2^63 or 2^64 are the same number (a wrong
reference TopK of uint64 passed as "max abs error 0")."""
from __future__ import annotations

import numpy as np


def integral(a) -> bool:
    """Whether ``a`` holds integers or booleans (compared exactly)."""
    return np.asarray(a).dtype.kind in "biu"


def integer_difference(x, y) -> tuple[float, float]:
    """Max abs and max relative difference of two integer (or boolean) arrays of one shape, each difference
    taken exactly (in Python integers) and then given as a float."""
    x, y = np.asarray(x), np.asarray(y)
    flat_x, flat_y = x.reshape(-1), y.reshape(-1)
    neq = np.flatnonzero(flat_x != flat_y) if x.dtype == y.dtype else np.arange(x.size)
    if not neq.size:
        return 0.0, 0.0
    pairs = [(int(a), int(b)) for a, b in zip(flat_x[neq], flat_y[neq], strict=True)]
    diffs = [abs(a - b) for a, b in pairs]
    return float(max(diffs)), max(d / max(abs(b), 1) for d, (_, b) in zip(diffs, pairs, strict=True))
