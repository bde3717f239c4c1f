"""Cast: supported targets convert like NumPy; exotic targets are refused, never approximated."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from op_harness import build_op, run1
from opfuse.errors import UnsupportedOpError
from opfuse.ir.dtypes import BFLOAT16, FLOAT8E4M3FN


@pytest.mark.parametrize("to,dtype", [(TensorProto.FLOAT16, np.float16), (TensorProto.BFLOAT16, BFLOAT16),
                                      (TensorProto.DOUBLE, np.float64),
                                      (TensorProto.INT32, np.int32), (TensorProto.BOOL, np.bool_)])
def test_cast_supported_targets(to, dtype):
    x = np.array([0.0, 1.5, -2.0], dtype=np.float32)
    got = run1("Cast", x, to=to)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, x.astype(dtype))


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E8M0, TensorProto.FLOAT4E2M1, TensorProto.INT4,
                                TensorProto.STRING])
def test_cast_to_unsupported_types_is_refused(to):
    # NumPy extension types would ignore ONNX's rules (e8m0's round_mode, int4's packing).
    with pytest.raises(UnsupportedOpError, match=f"c.*{TensorProto.DataType.Name(to)}"):
        build_op("Cast", [np.zeros(3, dtype=np.float32)], name="c", to=to)


@pytest.mark.parametrize("saturate,big", [(1, 448.0), (0, np.nan)])
def test_cast_to_float8_saturates_as_onnx_says(saturate, big):
    """e4m3fn: 1e4 and inf clamp to 448 with saturate=1 (ONNX's default), become NaN without; NaN stays NaN."""
    x = np.array([1e4, -np.inf, np.nan, 0.3, -0.0], dtype=np.float32)
    got = run1("Cast", x, to=TensorProto.FLOAT8E4M3FN, saturate=saturate).astype(np.float32)
    np.testing.assert_array_equal(got[:3], [big, -big, np.nan])
    assert got[3] == np.float32(0.3).astype(FLOAT8E4M3FN).astype(np.float32) and np.signbit(got[4])
