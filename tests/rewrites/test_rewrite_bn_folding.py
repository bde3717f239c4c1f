"""BatchNorm folding into Conv, ConvTranspose, Gemm and MatMul, and its refusals."""
import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from rewrite_cases import applied, assert_same_outputs, ops, randn, refusals, rewritten

RULE = "fold_batchnorm"


def bn_params(b, c, seed=1, name="bn"):
    r = np.random.default_rng(seed)
    return [b.const(f"{name}_gamma", r.uniform(0.5, 1.5, c).astype(np.float32)),
            b.const(f"{name}_beta", r.standard_normal(c).astype(np.float32)),
            b.const(f"{name}_mean", r.standard_normal(c).astype(np.float32)),
            b.const(f"{name}_var", r.uniform(0.5, 2.0, c).astype(np.float32))]


@pytest.mark.parametrize("bias", [False, True])
def test_conv_bn_folds_into_one_conv(bias):
    b = GraphBuilder("conv_bn")
    x = b.input("x", (1, 3, 8, 8))
    args = [x, b.const("w", randn((4, 3, 3, 3)))] + ([b.const("cb", randn(4, 2))] if bias else [])
    y = b.op("BatchNormalization", b.op("Conv", *args, pads=[1, 1, 1, 1], name="conv"), *bn_params(b, 4),
             epsilon=1e-3)
    g0, g1, res = rewritten(b.build(b.op("Relu", y)))
    assert ops(g1) == ["Conv", "Relu"] and applied(res, RULE) == 1
    assert g1.nodes[0].name == "conv"  # the folded op keeps its name
    assert res.provenance.of("conv") == ["conv", "batchnormalization"]
    assert_same_outputs(g0, g1)


def test_grouped_conv_transpose_bn_folds():
    b = GraphBuilder("convt_bn")
    x = b.input("x", (1, 4, 5, 5))
    ct = b.op("ConvTranspose", x, b.const("w", randn((4, 3, 3, 3))), strides=[2, 2], group=2)
    g0, g1, res = rewritten(b.build(b.op("BatchNormalization", ct, *bn_params(b, 6))))
    assert ops(g1) == ["ConvTranspose"]
    assert_same_outputs(g0, g1)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_bn_folds_with_alpha_beta(trans_b):
    b = GraphBuilder("gemm_bn")
    x = b.input("x", (2, 5))
    w = b.const("w", randn((6, 5) if trans_b else (5, 6)))
    y = b.op("Gemm", x, w, b.const("c", randn((1, 6), 3)), transB=trans_b, alpha=0.5, beta=2.0)
    g0, g1, res = rewritten(b.build(b.op("BatchNormalization", y, *bn_params(b, 6))))
    assert ops(g1) == ["Gemm"] and g1.nodes[0].attrs["beta"] == 1.0
    assert_same_outputs(g0, g1)


def test_matmul_with_constant_weight_becomes_gemm():
    b = GraphBuilder("mm_bn")
    x = b.input("x", (3, 5))
    y = b.op("MatMul", x, b.const("w", randn((5, 4))))
    g0, g1, res = rewritten(b.build(b.op("BatchNormalization", y, *bn_params(b, 4))))
    assert ops(g1) == ["Gemm"]
    assert_same_outputs(g0, g1)


def test_refuses_non_constant_parameter():
    b = GraphBuilder("bn_dyn")
    x = b.input("x", (1, 3, 4, 4))
    mean = b.input("running_mean", (4,))
    p = bn_params(b, 4)
    y = b.op("BatchNormalization", b.op("Conv", x, b.const("w", randn((4, 3, 1, 1)))), p[0], p[1], mean, p[3])
    g0, g1, res = rewritten(b.build(y))
    assert "BatchNormalization" in ops(g1)
    assert any("parameter mean 'running_mean' is not a constant" in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)


def test_refuses_shared_weight():
    b = GraphBuilder("bn_shared")
    x = b.input("x", (1, 3, 4, 4))
    w = b.const("w", randn((4, 3, 1, 1)))
    c1 = b.op("Conv", x, w, name="c1")
    c2 = b.op("Conv", b.op("Relu", x), w, name="c2")
    y = b.op("BatchNormalization", c1, *bn_params(b, 4))
    g0, g1, res = rewritten(b.build(y, c2))
    assert "BatchNormalization" in ops(g1)
    assert any("weight 'w' is shared with node 'c2'" in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)


def test_refuses_when_conv_output_is_read_elsewhere():
    b = GraphBuilder("bn_escape")
    x = b.input("x", (1, 3, 4, 4))
    c = b.op("Conv", x, b.const("w", randn((4, 3, 1, 1))), name="conv")
    y = b.op("BatchNormalization", c, *bn_params(b, 4))
    g0, g1, res = rewritten(b.build(y, b.op("Relu", c)))
    assert any("Conv output 'conv' is also read by" in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)


def test_refuses_matmul_whose_channel_axis_is_not_the_column():
    b = GraphBuilder("bn_rank3")
    x = b.input("x", (2, 4, 4))
    y = b.op("MatMul", x, b.const("w", randn((4, 4))))
    g0, g1, res = rewritten(b.build(b.op("BatchNormalization", y, *bn_params(b, 4))))
    assert any("per-channel axis 1 is not the output-channel axis" in r for r in refusals(res, RULE))
    assert_same_outputs(g0, g1)
