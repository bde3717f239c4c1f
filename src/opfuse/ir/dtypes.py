"""Element types beyond NumPy's own: bfloat16, and the 16-bit floats as a family.

bfloat16 is ``ml_dtypes.bfloat16`` (the NumPy extension type onnx itself reads and writes
bfloat16 tensors with). NumPy does not count it as floating (``np.issubdtype(bf16, np.floating)``
is False, its ``kind`` is ``'V'``), so code that asks "is this a float?" asks ``is_floating``.

float16 and bfloat16 are *storage* types in opfuse: the reference executor computes bfloat16
ops in float32 and rounds each op's result (``ops.registry.run_node``), and the C backend keeps
both 16 bits wide in memory and computes in float32 (``rewrites.float32_compute``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)
HALF_FLOATS = frozenset({FLOAT16, BFLOAT16})


def is_half(dtype) -> bool:
    """float16 or bfloat16: 16-bit storage, float32 arithmetic."""
    return np.dtype(dtype) in HALF_FLOATS


def is_floating(dtype) -> bool:
    """A floating-point type, bfloat16 included."""
    dt = np.dtype(dtype)
    return dt == BFLOAT16 or np.issubdtype(dt, np.floating)
