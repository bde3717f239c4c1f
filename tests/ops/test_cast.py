"""Cast: supported targets convert like NumPy; exotic targets are refused, never approximated."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from op_harness import build_op, run1
from opfuse.errors import UnsupportedOpError
from opfuse.ir.dtypes import BFLOAT16


@pytest.mark.parametrize("to,dtype", [(TensorProto.FLOAT16, np.float16), (TensorProto.BFLOAT16, BFLOAT16),
                                      (TensorProto.DOUBLE, np.float64),
                                      (TensorProto.INT32, np.int32), (TensorProto.BOOL, np.bool_)])
def test_cast_supported_targets(to, dtype):
    x = np.array([0.0, 1.5, -2.0], dtype=np.float32)
    got = run1("Cast", x, to=to)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, x.astype(dtype))


@pytest.mark.parametrize("to", [TensorProto.FLOAT8E4M3FN, TensorProto.INT4,
                                TensorProto.STRING])
def test_cast_to_unsupported_types_is_refused(to):
    # NumPy extension types would ignore ONNX's saturate rule (e.g. 1e4 -> 448 in e4m3fn).
    with pytest.raises(UnsupportedOpError, match=f"c.*{TensorProto.DataType.Name(to)}"):
        build_op("Cast", [np.zeros(3, dtype=np.float32)], name="c", to=to)
