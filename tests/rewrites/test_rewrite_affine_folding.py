"""Per-channel Mul/Div/Add/Sub by a constant folded into Conv/Gemm/MatMul, and refusals."""
import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from rewrite_cases import applied, assert_same_outputs, ops, randn, refusals, rewritten

RULE = "fold_affine_constant"


@pytest.mark.parametrize("op,shape", [("Mul", (1, 4, 1, 1)), ("Div", (4, 1, 1)), ("Add", (1, 4, 1, 1)),
                                      ("Sub", ()), ("Mul", ())])
def test_conv_then_constant_folds(op, shape):
    b = GraphBuilder("conv_affine")
    x = b.input("x", (1, 3, 6, 6))
    c = b.op("Conv", x, b.const("w", randn((4, 3, 3, 3))), b.const("bias", randn(4, 1)), name="conv")
    k = np.abs(randn(shape, 2)) + 0.5
    g0, g1, res = rewritten(b.build(b.op(op, c, b.const("k", k))))
    assert ops(g1) == ["Conv"] and applied(res, RULE) == 1
    assert_same_outputs(g0, g1)


def test_pp_ocr_style_mul_then_add_folds_twice():
    b = GraphBuilder("ppocr_bn")
    x = b.input("x", (1, 3, 6, 6))
    c = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))))
    y = b.op("Add", b.op("Mul", b.const("a", randn((1, 4, 1, 1), 3)), c), b.const("bb", randn((1, 4, 1, 1), 4)))
    g0, g1, res = rewritten(b.build(b.op("Relu", y)))
    assert ops(g1) == ["Conv", "Relu"] and applied(res, RULE) == 2
    assert_same_outputs(g0, g1)


def test_gemm_and_matmul_per_column_scale():
    b = GraphBuilder("gemm_affine")
    x = b.input("x", (2, 5))
    y = b.op("Gemm", x, b.const("w", randn((5, 3))))
    z = b.op("MatMul", b.input("x2", (2, 3, 5)), b.const("w2", randn((5, 3), 1)))
    scaled = b.op("Mul", y, b.const("s", randn(3, 2)))
    halved = b.op("Div", z, b.const("t", np.full(3, 2.0, np.float32)))
    g0, g1, res = rewritten(b.build(scaled, halved))
    assert sorted(ops(g1)) == ["Gemm", "MatMul"]
    assert_same_outputs(g0, g1)


def test_refuses_constant_varying_over_space():
    b = GraphBuilder("affine_spatial")
    x = b.input("x", (1, 3, 4, 4))
    c = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))))
    g0, g1, res = rewritten(b.build(b.op("Mul", c, b.const("k", randn((1, 4, 4, 4), 2)))))
    assert "Mul" in ops(g1)
    assert any("varies along axes [1, 2, 3]" in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_refuses_division_by_zero_and_bias_add_after_matmul_is_left_alone():
    b = GraphBuilder("affine_zero")
    x = b.input("x", (1, 3, 4, 4))
    c = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))))
    k = np.array([1, 0, 2, 3], np.float32).reshape(1, 4, 1, 1)
    m = b.op("MatMul", b.input("x2", (2, 5)), b.const("w2", randn((5, 3))))
    g0, g1, res = rewritten(b.build(b.op("Div", c, b.const("k", k)), b.op("Add", m, b.const("bias", randn(3)))))
    assert any("divisor 'k' has zeros" in r for r in refusals(res, RULE))
    assert ops(g1).count("Add") == 1  # MatMul has no bias slot: no match, no refusal noise
    assert_same_outputs(g0, g1)


def test_constant_minus_conv_is_not_folded():
    b = GraphBuilder("affine_rsub")
    x = b.input("x", (1, 3, 4, 4))
    c = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))))
    g0, g1, res = rewritten(b.build(b.op("Sub", b.const("k", np.float32(1.0)), c)))
    assert ops(g1) == ["Conv", "Sub"]
    assert_same_outputs(g0, g1)
