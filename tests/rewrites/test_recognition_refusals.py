"""The recognition rules' refusals name the constant that is off, in the words of each rule's condition
(opfuse.rules.activations, gelu, normalization), and LayerNorm's gamma/beta reach LayerNormalization in the
normalised shape (mutation testing, tests/MUTATION.md: survivors of the conditions and actions). Patterns are
built inside the tests, as in test_recognition_patterns.py; outputs checked against the reference executor."""
from __future__ import annotations

import math

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.rules.activations import HARD_SWISH, hard_swish_pattern
from opfuse.rules.gelu import ERF_GELU, TANH_GELU, erf_gelu_pattern, tanh_gelu_pattern
from opfuse.rules.normalization import LAYERNORM, layernorm_pattern
from rewrite_cases import apply_rule as run
from rewrite_cases import assert_same_outputs, ops, randn, recognised

SHAPE = (2, 8)


def f32(v):
    return np.float32(v)


def reasons(graph, rule, pattern_fn):
    g, decisions = run(graph, rule, pattern_fn)
    assert ops(g) == ops(graph)  # refused: nothing rewritten
    return [(d.verdict, d.reason) for d in decisions]


# hard-swish: x * Clip(x + shift, lo, hi) / six, or * sixth -------------------------------------------------------

def _hard_swish(shift=3.0, clip_inputs=("lo", "hi"), lo=0.0, hi=6.0, scale_op="Div", scale=6.0,
                scale_first=False, clip_out=False):
    b = GraphBuilder("hs")
    x = b.input("x", SHAPE)
    bounds = {"lo": b.const("lo", f32(lo)), "hi": b.const("hi", f32(hi)), None: None}
    c = b.op("Clip", b.op("Add", x, b.const("shift", f32(shift))), *(bounds[k] for k in clip_inputs), name="clip")
    k = b.const("six" if scale_op == "Div" else "sixth", f32(scale))
    prod = b.op("Mul", x, c)
    y = b.op(scale_op, *((k, prod) if scale_first else (prod, k)), name="divide")
    return b.build(y, c) if clip_out else b.build(y)


@pytest.mark.parametrize("kwargs, reason", [
    ({"shift": 4.0}, "shift 'shift' is 4, not 3"),
    ({"lo": 1.0}, "Clip min 'lo' is 1, not 0"),
    ({"hi": 7.0}, "Clip max 'hi' is 7, not 6"),
    ({"scale": 5.0}, "Div constant 'six' is 5, not 6"),
    ({"scale_op": "Mul", "scale": 0.25}, "Mul constant 'sixth' is 0.25, not 0.166667"),
    ({"clip_inputs": ()}, "Clip min is absent"),
    ({"clip_inputs": ("lo",)}, "Clip max is absent"),
    ({"clip_inputs": (None, "hi")}, "Clip min is absent"),
    ({"clip_out": True}, "intermediate 'clip' is a graph output"),
])
def test_hard_swish_refusals_name_the_constant_off(kwargs, reason):
    assert reasons(_hard_swish(**kwargs), HARD_SWISH, hard_swish_pattern) == [("refused", reason)]


def test_hard_swish_times_a_sixth_written_first_is_recognised():
    """Mul is commutative: ``(1/6) * (x * clip)`` is the same hard-swish (the Div check is the Div's alone)."""
    recognised(_hard_swish(scale_op="Mul", scale=1 / 6, scale_first=True), HARD_SWISH, hard_swish_pattern,
               "HardSwish")


# GELU: each constant's name in its refusal -------------------------------------------------------------------

def _erf_gelu(one=1.0, half=0.5):
    b = GraphBuilder("gelu")
    x = b.input("x", SHAPE)
    e = b.op("Erf", b.op("Div", x, b.const("k", f32(math.sqrt(2)))), name="erf")
    a = b.op("Add", e, b.const("one", f32(one)))
    return b.build(b.op("Mul", b.op("Mul", x, a), b.const("half", f32(half))))


def test_erf_gelu_refusals_name_the_constant_off():
    assert reasons(_erf_gelu(one=1.5), ERF_GELU, erf_gelu_pattern) == [
        ("refused", "constant added to erf 'one' is 1.5, not 1")]
    assert reasons(_erf_gelu(half=0.25), ERF_GELU, erf_gelu_pattern) == [
        ("refused", "final factor 'half' is 0.25, not 0.5")]


@pytest.mark.parametrize("off, reason", [
    ({"three": 2.0}, "Pow exponent 'three' is 2, not 3"),
    ({"coef": 0.05}, "cubic coefficient 'coef' is 0.05, not 0.044715"),
    ({"k": 1.5}, "tanh argument scale 'k' is 1.5, not 0.797885"),
    ({"one": 1.5}, "constant added to tanh 'one' is 1.5, not 1"),
    ({"half": 0.25}, "final factor 'half' is 0.25, not 0.5"),
])
def test_tanh_gelu_refusals_name_the_constant_off(off, reason):
    b = GraphBuilder("gelu_tanh")
    x = b.input("x", SHAPE)
    g = b.build(_tanh_gelu(b, x, off))
    assert reasons(g, TANH_GELU, tanh_gelu_pattern) == [("refused", reason)]


def _tanh_gelu(b, x, off):
    """0.5 x (1 + tanh(k (x + coef x^three))), a constant replaced by ``off[name]`` (a number or an array)."""
    def c(name, value):
        return b.const(name, np.asarray(off.get(name, value), np.float32))
    cube = b.op("Pow", x, c("three", 3.0))
    inner = b.op("Add", x, b.op("Mul", cube, c("coef", 0.044715)))
    t = b.op("Tanh", b.op("Mul", inner, c("k", math.sqrt(2 / math.pi))))
    return b.op("Mul", b.op("Mul", x, b.op("Add", t, c("one", 1.0))), c("half", 0.5))


def test_a_constant_broadcasting_a_tanh_gelu_or_a_hard_swish_is_refused():
    """Uniform constants pass the constant checks, but a (3, 1, 1) one broadcasts the (2, 8) output: one op of x
    cannot be that (the broadcast refusal holds on its own, whatever the escape check says)."""
    b = GraphBuilder("gelu_tanh_wide")
    x = b.input("x", SHAPE)
    g = b.build(_tanh_gelu(b, x, {"half": np.full((3, 1, 1), 0.5)}))
    assert reasons(g, TANH_GELU, tanh_gelu_pattern) == [
        ("refused", "the constants broadcast the output beyond the input shape")]
    b = GraphBuilder("hs_wide")
    x = b.input("x", SHAPE)
    c = b.op("Clip", b.op("Add", x, b.const("shift", f32(3))), b.const("lo", f32(0)), b.const("hi", f32(6)))
    g = b.build(b.op("Div", b.op("Mul", x, c), b.const("six", np.full((3, 1, 1), 6.0, np.float32))))
    assert reasons(g, HARD_SWISH, hard_swish_pattern) == [
        ("refused", "the constants broadcast the output beyond the input shape")]


# LayerNorm: gamma / beta broadcast to the normalised shape ------------------------------------------------------

def _layernorm(shape, axes, gamma, beta):
    b = GraphBuilder("ln")
    x = b.input("x", shape)
    mean = b.op("ReduceMean", x, axes=axes, keepdims=1, name="mean")
    d = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=axes, keepdims=1, name="variance")
    y = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const("eps", f32(1e-5)))))
    y = b.op("Mul", y, b.const("gamma", randn(gamma, 3) + 1))
    return b.build(b.op("Add", y, b.const("beta", randn(beta, 4))))


@pytest.mark.parametrize("shape, axes, gamma, beta, normalized", [
    ((2, 8), [-1], (1, 8), (8,), (8,)),  # a leading 1 dropped
    ((2, 4, 8), [-2, -1], (8,), (1, 4, 8), (4, 8)),  # gamma broadcast over the first normalised axis
    ((2, 4, 8), [1, 2], (4, 1), (1, 1, 8), (4, 8)),  # both broadcast
])
def test_layernorm_params_reach_layernormalization_in_the_normalised_shape(shape, axes, gamma, beta, normalized):
    g0 = _layernorm(shape, axes, gamma, beta)
    g = recognised(g0, LAYERNORM, layernorm_pattern, "LayerNormalization")
    n = g.nodes[0]
    assert n.attrs["axis"] == len(shape) - len(normalized)
    for v, shape_of in ((n.inputs[1], gamma), (n.inputs[2], beta)):
        assert v.shape == normalized and v.dtype == np.float32 and v.const is not None
        want = np.broadcast_to(g0.values["gamma" if shape_of is gamma else "beta"].const.reshape(
            (1,) * (len(shape) - len(shape_of)) + shape_of)[(0,) * (len(shape) - len(normalized))], normalized)
        np.testing.assert_array_equal(v.const, want)
    assert_same_outputs(g0, g)


# LayerNorm: each refusal one decision for the whole chain (its culprits ban the shorter chains too) ---------------

def _ln_chain(shape=(2, 8), axes=(-1,), var_axes=None, keepdims=(1, 1), exponent=2.0, eps=1e-5):
    b = GraphBuilder("ln")
    x = b.input("x", shape)
    mean = b.op("ReduceMean", x, axes=list(axes), keepdims=keepdims[0], name="mean")
    d = b.op("Sub", x, mean, name="centered")
    sq = b.op("Pow", d, b.const("exponent", f32(exponent)), name="square")
    var = b.op("ReduceMean", sq, axes=list(var_axes or axes), keepdims=keepdims[1], name="variance")
    std = b.op("Sqrt", b.op("Add", var, b.const("eps", f32(eps)), name="add_eps"), name="std")
    y = b.op("Mul", b.op("Div", d, std, name="normalized"), b.const("gamma", randn(shape[-1], 3)), name="scale")
    return b.build(b.op("Add", y, b.const("beta", randn(shape[-1], 4)), name="shift"))


@pytest.mark.parametrize("kwargs, reason", [
    ({"exponent": 3.0}, "Pow exponent 'exponent' is not 2"),
    ({"eps": -1.0}, "epsilon 'eps' is not a non-negative constant scalar"),
    ({"shape": (8, 8), "keepdims": (0, 0)}, "ReduceMean 'mean' drops the reduced axes (keepdims=0)"),
    ({"shape": (8, 8), "keepdims": (1, 0)}, "ReduceMean 'variance' drops the reduced axes (keepdims=0)"),
    ({"shape": (2, 8, 8), "axes": (1,)}, "ReduceMean axes [1] are not the trailing axes of a rank-3 tensor"),
    ({"var_axes": (0,)}, "the two ReduceMeans reduce different axes ([1] and [0])"),
])
def test_a_refused_layernorm_is_one_decision(kwargs, reason):
    """The refusal names the nodes at fault; every shorter chain (without beta, without gamma) holds them, so none
    is offered again: one decision for the nine ops, none rewritten."""
    g = _ln_chain(**kwargs)
    g1, decisions = run(g, LAYERNORM, layernorm_pattern)
    assert ops(g1) == ops(g)
    assert [(d.verdict, d.reason, len(d.nodes)) for d in decisions] == [("refused", reason, 9)]


def test_a_zero_epsilon_is_a_layernorm():
    g = recognised(_ln_chain(eps=0.0), LAYERNORM, layernorm_pattern, "LayerNormalization")
    assert g.nodes[0].attrs["epsilon"] == 0.0


def test_a_layernorm_without_gamma_gets_ones_of_its_type_and_a_name_from_its_ops():
    """No affine part: LayerNormalization's scale is ones of x's type in the normalised shape; the new op is named
    after the ops' common prefix, or after the first ReduceMean when they share none."""
    b = GraphBuilder("ln")
    x = b.input("x", SHAPE)
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name="block_mean")
    d = b.op("Sub", x, mean, name="block_sub")
    var = b.op("ReduceMean", b.op("Mul", d, d, name="block_sq"), axes=[-1], keepdims=1, name="block_var")
    std = b.op("Sqrt", b.op("Add", var, b.const("eps", f32(1e-5)), name="block_add"), name="block_sqrt")
    g = recognised(b.build(b.op("Div", d, std, name="block_div")), LAYERNORM, layernorm_pattern, "LayerNormalization")
    n = g.nodes[0]
    assert n.name == "block_layernormalization"  # the common prefix "block", the op type appended by the engine
    gamma = n.inputs[1]
    assert gamma.shape == (8,) and gamma.dtype == np.float32 and np.all(gamma.const == 1)
    g = recognised(_ln_chain(), LAYERNORM, layernorm_pattern, "LayerNormalization")
    assert g.nodes[0].name == "mean_layernorm_layernormalization"  # no common prefix: the fallback


def test_gamma_varying_outside_the_normalised_axes_leaves_the_normalisation_to_be_recognised():
    """Refused at its scale (the culprit): the chain without gamma and beta is then the LayerNorm, and nothing else
    is offered (the chain with gamma holds the culprit)."""
    b = GraphBuilder("ln_wide_gamma")
    x = b.input("x", SHAPE)
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name="mean")
    d = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=[-1], keepdims=1, name="variance")
    y = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const("eps", f32(1e-5)))))
    y = b.op("Mul", y, b.const("gamma", randn(SHAPE, 3)), name="scale")
    g = b.build(b.op("Add", y, b.const("beta", randn(SHAPE[-1], 4)), name="shift"))
    g1, decisions = run(g, LAYERNORM, layernorm_pattern)
    assert [d.verdict for d in decisions] == ["refused", "rewritten"]
    assert decisions[0].reason == "scale 'gamma' (2, 8) varies outside the normalised axes"
    assert ops(g1) == ["LayerNormalization", "Mul", "Add"]
    assert_same_outputs(g, g1)
