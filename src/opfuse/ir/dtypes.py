"""Element types beyond NumPy's own: bfloat16 and float8, and the narrow floats as a family.

bfloat16 and the four float8 types of ONNX (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) are ml_dtypes'
NumPy extension types (what onnx itself reads and writes such tensors with). NumPy does not count
them as floating (``np.issubdtype(bf16, np.floating)`` is False, their ``kind`` is ``'V'``), so
code that asks "is this a float?" asks ``is_floating``.

The narrow floats (float16, bfloat16, float8) are *storage* types in opfuse: the reference
executor computes ml_dtypes' types in float32 and rounds each op's result
(``ops.registry.run_node``), and the C backend keeps them 16 or 8 bits wide in memory and
computes in float32 (``rewrites.float32_compute``). float8 values are only made by Cast (ONNX
allows them in few other ops).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)
FLOAT8E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
FLOAT8E4M3FNUZ = np.dtype(ml_dtypes.float8_e4m3fnuz)
FLOAT8E5M2 = np.dtype(ml_dtypes.float8_e5m2)
FLOAT8E5M2FNUZ = np.dtype(ml_dtypes.float8_e5m2fnuz)
FLOAT8S = frozenset({FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ})
NARROW_FLOATS = frozenset({FLOAT16, BFLOAT16}) | FLOAT8S
EXTENSION_FLOATS = NARROW_FLOATS - {FLOAT16}  # ml_dtypes' types


def is_narrow_float(dtype) -> bool:
    """float16, bfloat16 or float8: 16- or 8-bit storage, float32 arithmetic."""
    return np.dtype(dtype) in NARROW_FLOATS


def is_floating(dtype) -> bool:
    """A floating-point type, ml_dtypes' included."""
    dt = np.dtype(dtype)
    return dt in EXTENSION_FLOATS or np.issubdtype(dt, np.floating)
