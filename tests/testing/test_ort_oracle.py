"""``opfuse.testing.ort_oracle``: onnxruntime's 8-bit products made exact on every CPU by moving int8 weights to
uint8 (the same differences from their zero points)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from opfuse.testing import ort_oracle

pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(11)
U8, I8, I32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


def _matmul_integer(b: np.ndarray, az, bz, a_elem=U8):
    inits = [numpy_helper.from_array(b, "b")]
    names = ["a", "b", "", ""]
    if az is not None:
        inits.append(numpy_helper.from_array(az, "az"))
        names[2] = "az"
    if bz is not None:
        inits.append(numpy_helper.from_array(bz, "bz"))
        names[3] = "bz"
    while names[-1] == "":
        names.pop()
    node = helper.make_node("MatMulInteger", names, ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", a_elem, [4, b.shape[0]])],
                          [helper.make_tensor_value_info("y", I32, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("bz", [np.array(0, np.int8), np.arange(-2, 3, dtype=np.int8), None],
                         ids=["per_tensor", "per_column", "no_zero_point"])
def test_full_range_uint8_by_int8_product_is_exact(bz):
    """64 products a sum of full-range values: onnxruntime on ``u8_weights`` equals the int64 product; on the
    model as given it is off where this CPU's products saturate (x86 without VNNI), equal elsewhere."""
    b = RNG.integers(-128, 128, (64, 5)).astype(np.int8)
    a = RNG.integers(0, 256, (4, 64)).astype(np.uint8)
    m = _matmul_integer(b, np.array(12, np.uint8), bz)
    want = (a.astype(np.int64) - 12) @ (b.astype(np.int64) - (0 if bz is None else bz.astype(np.int64)))
    moved = ort_oracle.u8_weights(m)
    kinds = {t.name: numpy_helper.to_array(t).dtype for t in moved.graph.initializer}
    (node,) = moved.graph.node
    assert kinds[node.input[1]] == np.uint8 and kinds[node.input[3]] == np.uint8
    assert [t.name for t in m.graph.initializer][0] == "b" and m.graph.node[0].input[1] == "b"  # the given one kept
    np.testing.assert_array_equal(ort_oracle.run(m, {"a": a})["y"], want)
    as_given = ort_oracle.run(m, {"a": a}, exact=False)["y"]
    assert bool(np.abs(as_given - want).max() > 0) is ort_oracle.products_saturate()


def test_int8_by_int8_and_unknown_operand_types_are_left():
    """An int8 operand (S8S8 has no exact uint8 form) or an operand without a zero point (its type unknown here):
    the model unchanged."""
    b = RNG.integers(-128, 128, (8, 5)).astype(np.int8)
    for az, elem in ((np.array(3, np.int8), I8), (None, U8)):
        m = _matmul_integer(b, az, np.array(0, np.int8), a_elem=elem)
        assert ort_oracle.u8_weights(m) == m
