"""The ``recognize`` stage of the rewrite pipeline: decomposed LayerNorm, erf/tanh GELU and SiLU
become one op each, with provenance, refusals logged under the rule's name, and outputs kept.

The rules themselves (``opfuse.rules``: every GELU grouping, every hard-swish form, exact refusal
reasons) are tested on the rules engine in ``tests/rules/test_rule_library.py``."""
import math

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from rewrite_cases import assert_same_outputs, ops, randn, refusals, rewritten


def f32(v):
    return np.float32(v)


# LayerNorm ----------------------------------------------------------------------------------
def decomposed_ln(b, x, *, axes=(-1,), affine=True, square="Pow", eps=1e-5, extra_reader=False):
    mean = b.op("ReduceMean", x, axes=list(axes), keepdims=1, name="ln_mean")
    d = b.op("Sub", x, mean, name="ln_sub")
    sq = b.op("Pow", d, b.const("two", f32(2.0))) if square == "Pow" else b.op("Mul", d, d)
    var = b.op("ReduceMean", sq, axes=list(axes), keepdims=1, name="ln_var")
    n = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const("eps", f32(eps)))), name="ln_div")
    outs = [n]
    if affine:
        c = x.shape[-1]
        n = b.op("Add", b.op("Mul", n, b.const("gamma", randn(c, 3) + 1)), b.const("beta", randn(c, 4)))
        outs = [n]
    if extra_reader:
        outs.append(b.op("Relu", mean))
    return outs


@pytest.mark.parametrize("affine,square", [(True, "Pow"), (False, "Mul")])
def test_layernorm_recognised(affine, square):
    b = GraphBuilder("ln")
    x = b.input("x", (2, 5, 8))
    g0, g1, res = rewritten(b.build(*decomposed_ln(b, x, affine=affine, square=square)))
    assert ops(g1) == ["LayerNormalization"]
    assert len(res.provenance.of(g1.nodes[0].name)) == (9 if affine else 7)
    assert_same_outputs(g0, g1)


def test_layernorm_over_two_trailing_axes():
    b = GraphBuilder("ln2")
    x = b.input("x", (2, 3, 4))
    g0, g1, res = rewritten(b.build(*decomposed_ln(b, x, axes=(1, 2), affine=False)))
    assert ops(g1) == ["LayerNormalization"] and g1.nodes[0].attrs["axis"] == 1
    assert_same_outputs(g0, g1)


def test_layernorm_refused_on_leading_axis():
    b = GraphBuilder("ln_axis")
    x = b.input("x", (4, 5))
    g0, g1, res = rewritten(b.build(*decomposed_ln(b, x, axes=(0,), affine=False)))
    assert "LayerNormalization" not in ops(g1)
    assert any("are not the trailing axes" in r for r in refusals(res, "recognize_layernorm"))
    assert_same_outputs(g0, g1)


def test_layernorm_refused_when_mean_escapes():
    b = GraphBuilder("ln_escape")
    x = b.input("x", (2, 8))
    g0, g1, res = rewritten(b.build(*decomposed_ln(b, x, extra_reader=True)))
    assert "LayerNormalization" not in ops(g1)
    assert any("intermediate 'ln_mean' is also read by" in r for r in refusals(res, "recognize_layernorm"))
    assert_same_outputs(g0, g1)


# GELU ------------------------------------------------------------------------------------------
def erf_gelu(b, x, half=0.5):
    a = b.op("Add", b.op("Erf", b.op("Div", x, b.const("sqrt2", f32(math.sqrt(2))))), b.const("one", f32(1.0)))
    return b.op("Mul", b.op("Mul", x, a), b.const("half", f32(half)))


def test_erf_gelu_refused_for_wrong_constant():
    b = GraphBuilder("gelu_bad")
    x = b.input("x", (3, 7))
    g0, g1, res = rewritten(b.build(erf_gelu(b, x, half=0.6)))
    assert "Gelu" not in ops(g1)
    assert any("final factor 'half' is 0.6, not 0.5" in r for r in refusals(res, "recognize_gelu_erf"))
    assert_same_outputs(g0, g1)


def tanh_gelu(b, x, cube="pow", coef=0.044715):
    c = b.op("Pow", x, b.const("three", f32(3.0))) if cube == "pow" else b.op("Mul", b.op("Mul", x, x), x)
    inner = b.op("Add", x, b.op("Mul", c, b.const("coef", f32(coef))))
    t = b.op("Tanh", b.op("Mul", inner, b.const("k", f32(math.sqrt(2 / math.pi)))))
    return b.op("Mul", b.op("Mul", x, b.op("Add", t, b.const("one", f32(1.0)))), b.const("half", f32(0.5)))


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_tanh_gelu_recognised(cube):
    b = GraphBuilder("gelu_tanh")
    x = b.input("x", (3, 7))
    g0, g1, res = rewritten(b.build(tanh_gelu(b, x, cube)))
    assert ops(g1) == ["Gelu"] and g1.nodes[0].attrs["approximate"] == "tanh"
    assert_same_outputs(g0, g1)


def test_tanh_gelu_refused_for_wrong_coefficient():
    b = GraphBuilder("gelu_tanh_bad")
    x = b.input("x", (3, 7))
    g0, g1, res = rewritten(b.build(tanh_gelu(b, x, coef=0.05)))
    assert "Gelu" not in ops(g1)
    assert any("cubic coefficient 'coef' is 0.05, not 0.044715" in r for r in refusals(res, "recognize_gelu_tanh"))
    assert_same_outputs(g0, g1)


# SiLU -------------------------------------------------------------------------------
def test_silu_recognised_and_refused_when_sigmoid_escapes():
    b = GraphBuilder("silu")
    x, y = b.input("x", (2, 6)), b.input("y", (2, 6))
    s = b.op("Sigmoid", y, name="sig_y")
    g0, g1, res = rewritten(b.build(b.op("Mul", b.op("Sigmoid", x), x), b.op("Mul", y, s), b.op("Neg", s)))
    assert ops(g1).count("Silu") == 1
    assert any("'sig_y' is also read by" in r for r in refusals(res, "recognize_silu"))
    assert_same_outputs(g0, g1)
