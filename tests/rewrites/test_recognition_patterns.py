"""The recognition rules' patterns, built inside each test (mutation testing, tests/MUTATION.md: the library builds
them when it is imported, which no mutant run reaches). Every form the modules' docstrings list is rewritten into
its one op, and a near miss is not; expectations from the docstrings' formulas (opfuse.rules.activations, gelu,
normalization), outputs checked against the reference executor."""
from __future__ import annotations

import math

import numpy as np
import pytest

from opfuse.ops import GraphBuilder
from opfuse.rules.activations import HARD_SWISH, SILU, hard_swish_pattern, silu_pattern
from opfuse.rules.gelu import ERF_GELU, TANH_GELU, erf_gelu_pattern, tanh_gelu_pattern
from opfuse.rules.normalization import LAYERNORM, layernorm_pattern
from rewrite_cases import apply_rule as run
from rewrite_cases import ops, randn, recognised

SHAPE = (2, 8)


def f32(v):
    return np.float32(v)


# SiLU: x * Sigmoid(x) ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("sigmoid_first", [False, True])
def test_silu_in_either_operand_order(sigmoid_first):
    b = GraphBuilder("silu")
    x = b.input("x", SHAPE)
    s = b.op("Sigmoid", x)
    g = b.build(b.op("Mul", s, x) if sigmoid_first else b.op("Mul", x, s))
    recognised(g, SILU, silu_pattern, "Silu")


def test_silu_needs_the_same_x_twice():
    b = GraphBuilder("not_silu")
    x, y = b.input("x", SHAPE), b.input("y", SHAPE)
    g = b.build(b.op("Mul", x, b.op("Sigmoid", y)))
    assert ops(run(g, SILU, silu_pattern)[0]) == ["Sigmoid", "Mul"]


# hard-swish: x * HardSigmoid(x, 1/6, 1/2), or x * Clip(x + 3, 0, 6) / 6 ---------------------------------------

def _clip(b, x, shift=3.0, hi=6.0):
    return b.op("Clip", b.op("Add", x, b.const("shift", f32(shift))), b.const("lo", f32(0.0)), b.const("hi", f32(hi)))


def hard_swish(b, x, form: str):
    if form == "hardsigmoid":
        return b.op("Mul", x, b.op("HardSigmoid", x, alpha=1 / 6, beta=0.5, name="hsig"))
    c = _clip(b, x)
    six, sixth = b.const("six", f32(6.0)), b.const("sixth", f32(1 / 6))
    return {"product_div": lambda: b.op("Div", b.op("Mul", x, c), six),
            "product_mul": lambda: b.op("Mul", b.op("Mul", x, c), sixth),
            "clip_div": lambda: b.op("Mul", x, b.op("Div", c, six)),
            "clip_mul": lambda: b.op("Mul", x, b.op("Mul", c, sixth))}[form]()


@pytest.mark.parametrize("form", ["hardsigmoid", "product_div", "product_mul", "clip_div", "clip_mul"])
def test_hard_swish_in_every_exported_form(form):
    b = GraphBuilder("hs")
    x = b.input("x", SHAPE)
    recognised(b.build(hard_swish(b, x, form)), HARD_SWISH, hard_swish_pattern, "HardSwish")


def test_hard_swish_refusals_name_the_constant():
    b = GraphBuilder("hs_default")
    x = b.input("x", SHAPE)
    g = b.build(b.op("Mul", x, b.op("HardSigmoid", x, name="hsig")))  # ONNX defaults: alpha 0.2, beta 0.5
    g1, decisions = run(g, HARD_SWISH, hard_swish_pattern)
    assert ops(g1) == ["HardSigmoid", "Mul"]
    assert [d.reason for d in decisions] == ["HardSigmoid 'hsig' has alpha=0.2, beta=0.5; hard-swish needs 1/6 and 1/2"]
    b = GraphBuilder("hs_relu7")
    x = b.input("x", SHAPE)
    g = b.build(b.op("Div", b.op("Mul", x, _clip(b, x, hi=7.0)), b.const("six", f32(6.0))))
    g1, decisions = run(g, HARD_SWISH, hard_swish_pattern)
    assert "HardSwish" not in ops(g1) and decisions and all(d.verdict == "refused" for d in decisions)
    assert any("Clip max" in d.reason and "7" in d.reason for d in decisions)


# GELU: 0.5 x (1 + erf(x / sqrt(2))) and 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -------------------------

def half_product(b, x, a, grouping: str):
    half = b.const("half", f32(0.5))
    return {"xa_half": lambda: b.op("Mul", b.op("Mul", x, a), half),
            "x_ahalf": lambda: b.op("Mul", x, b.op("Mul", a, half)),
            "xhalf_a": lambda: b.op("Mul", b.op("Mul", x, half), a)}[grouping]()


GROUPINGS = ["xa_half", "x_ahalf", "xhalf_a"]


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("scale", ["Div", "Mul"])
def test_erf_gelu_in_every_grouping(grouping, scale):
    b = GraphBuilder("gelu")
    x = b.input("x", SHAPE)
    k = b.const("k", f32(math.sqrt(2) if scale == "Div" else 1 / math.sqrt(2)))
    a = b.op("Add", b.op("Erf", b.op(scale, x, k)), b.const("one", f32(1.0)))
    g = recognised(b.build(half_product(b, x, a, grouping)), ERF_GELU, erf_gelu_pattern, "Gelu")
    assert g.nodes[0].attrs["approximate"] == "none"


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("cube", ["pow", "xx_x", "x_xx"])
def test_tanh_gelu_in_every_grouping_and_cube(grouping, cube):
    b = GraphBuilder("gelu_tanh")
    x = b.input("x", SHAPE)
    c = {"pow": lambda: b.op("Pow", x, b.const("three", f32(3.0))),
         "xx_x": lambda: b.op("Mul", b.op("Mul", x, x), x),
         "x_xx": lambda: b.op("Mul", x, b.op("Mul", x, x))}[cube]()
    inner = b.op("Add", x, b.op("Mul", c, b.const("coef", f32(0.044715))))
    t = b.op("Tanh", b.op("Mul", inner, b.const("k", f32(math.sqrt(2 / math.pi)))))
    a = b.op("Add", t, b.const("one", f32(1.0)))
    g = recognised(b.build(half_product(b, x, a, grouping)), TANH_GELU, tanh_gelu_pattern, "Gelu")
    assert g.nodes[0].attrs["approximate"] == "tanh"


def test_erf_gelu_near_misses_are_not_rewritten():
    # Tanh where Erf belongs; Sub where the 1 is added
    for op, add in (("Tanh", "Add"), ("Erf", "Sub")):
        b = GraphBuilder("near")
        x = b.input("x", SHAPE)
        a = b.op(add, b.op(op, b.op("Div", x, b.const("k", f32(math.sqrt(2))))), b.const("one", f32(1.0)))
        g = b.build(half_product(b, x, a, "xa_half"))
        assert "Gelu" not in ops(run(g, ERF_GELU, erf_gelu_pattern)[0])


# LayerNorm: (x - mean) / sqrt(var + eps) [* gamma [+ beta]] ------------------------------------------------------

def layernorm(b, x, square: str, affine: str):
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name="mean")
    d = b.op("Sub", x, mean, name="centered")
    sq = b.op("Pow", d, b.const("two", f32(2.0))) if square == "pow" else b.op("Mul", d, d)
    var = b.op("ReduceMean", sq, axes=[-1], keepdims=1, name="variance")
    y = b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const("eps", f32(1e-5)))), name="normalized")
    if affine in ("scale", "shift"):
        y = b.op("Mul", y, b.const("gamma", randn(SHAPE[-1], 3) + 1))
    if affine == "shift":
        y = b.op("Add", y, b.const("beta", randn(SHAPE[-1], 4)))
    return y


@pytest.mark.parametrize("affine", ["none", "scale", "shift"])
@pytest.mark.parametrize("square", ["pow", "mul"])
def test_layernorm_with_and_without_its_affine_part(square, affine):
    b = GraphBuilder("ln")
    x = b.input("x", SHAPE)
    g = recognised(b.build(layernorm(b, x, square, affine)), LAYERNORM, layernorm_pattern, "LayerNormalization")
    n = g.nodes[0]
    assert n.attrs["axis"] == 1 and n.attrs["epsilon"] == pytest.approx(1e-5)


def test_layernorm_near_miss_is_not_rewritten():
    # Sqrt of the variance without eps: not the pattern
    b = GraphBuilder("ln_no_eps")
    x = b.input("x", SHAPE)
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1)
    d = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=[-1], keepdims=1)
    g = b.build(b.op("Div", d, b.op("Sqrt", var)))
    assert "LayerNormalization" not in ops(run(g, LAYERNORM, layernorm_pattern)[0])


def test_a_constant_broadcasting_the_output_is_refused():
    # 0.5 as a (3, 1, 1) constant: the last Mul's output is (3, 2, 8), not x's (2, 8); one Gelu of x cannot be that
    b = GraphBuilder("gelu_wide")
    x = b.input("x", SHAPE)
    a = b.op("Add", b.op("Erf", b.op("Div", x, b.const("k", f32(math.sqrt(2))))), b.const("one", f32(1.0)))
    g = b.build(b.op("Mul", b.op("Mul", x, a), b.const("half", np.full((3, 1, 1), 0.5, np.float32))))
    g1, decisions = run(g, ERF_GELU, erf_gelu_pattern)
    assert ops(g1) == ops(g)
    assert [(d.verdict, d.reason) for d in decisions] == [
        ("refused", "the constants broadcast the output beyond the input shape")]


# Near misses: one of the formula's x is another input y (the same x must be read everywhere) --------------------

def _xy():
    b = GraphBuilder("xy")
    return b, b.input("x", SHAPE), b.input("y", SHAPE)


def test_silu_and_hard_swish_with_another_input_in_one_place_are_not_rewritten():
    cases = []
    b, x, y = _xy()
    cases.append((b, b.op("Mul", y, b.op("HardSigmoid", x, alpha=1 / 6, beta=0.5))))
    b, x, y = _xy()
    cases.append((b, b.op("Mul", x, b.op("HardSigmoid", y, alpha=1 / 6, beta=0.5))))
    for form in ("product_div", "clip_div"):
        b, x, y = _xy()  # y + 3 clipped, times x
        c = _clip(b, y)
        six = b.const("six", f32(6.0))
        cases.append((b, b.op("Div", b.op("Mul", x, c), six) if form == "product_div" else
                      b.op("Mul", x, b.op("Div", c, six))))
        b, x, y = _xy()  # x + 3 clipped, times y
        c = _clip(b, x)
        six = b.const("six", f32(6.0))
        cases.append((b, b.op("Div", b.op("Mul", y, c), six) if form == "product_div" else
                      b.op("Mul", y, b.op("Div", c, six))))
    for b, out in cases:
        g = b.build(out)
        assert "HardSwish" not in ops(run(g, HARD_SWISH, hard_swish_pattern)[0]), ops(g)


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_gelu_with_another_input_in_one_place_is_not_rewritten(grouping):
    for where in ("product", "erf"):
        b, x, y = _xy()
        a = b.op("Add", b.op("Erf", b.op("Div", y if where == "erf" else x, b.const("k", f32(math.sqrt(2))))),
                 b.const("one", f32(1.0)))
        g = b.build(half_product(b, y if where == "product" else x, a, grouping))
        assert "Gelu" not in ops(run(g, ERF_GELU, erf_gelu_pattern)[0]), (grouping, where)
    for where in ("cube", "inner", "product"):
        b, x, y = _xy()
        c = b.op("Pow", y if where == "cube" else x, b.const("three", f32(3.0)))
        inner = b.op("Add", y if where == "inner" else x, b.op("Mul", c, b.const("coef", f32(0.044715))))
        t = b.op("Tanh", b.op("Mul", inner, b.const("k", f32(math.sqrt(2 / math.pi)))))
        a = b.op("Add", t, b.const("one", f32(1.0)))
        g = b.build(half_product(b, y if where == "product" else x, a, grouping))
        assert "Gelu" not in ops(run(g, TANH_GELU, tanh_gelu_pattern)[0]), (grouping, where)


def test_layernorm_centred_on_another_input_is_not_rewritten():
    b, x, y = _xy()
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1)
    d = b.op("Sub", y, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=[-1], keepdims=1)
    g = b.build(b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const("eps", f32(1e-5))))))
    assert "LayerNormalization" not in ops(run(g, LAYERNORM, layernorm_pattern)[0])


def test_layernorm_with_means_over_different_axes_is_refused_naming_both():
    b = GraphBuilder("ln_axes")
    x = b.input("x", SHAPE)
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name="mean")
    d = b.op("Sub", x, mean)
    var = b.op("ReduceMean", b.op("Mul", d, d), axes=[0], keepdims=1, name="variance")
    g = b.build(b.op("Div", d, b.op("Sqrt", b.op("Add", var, b.const("eps", f32(1e-5))))))
    g1, decisions = run(g, LAYERNORM, layernorm_pattern)
    assert "LayerNormalization" not in ops(g1)
    assert decisions[0].reason == "the two ReduceMeans reduce different axes ([1] and [0])"


def test_derived_names_take_the_common_prefix_of_the_replaced_ops():
    from opfuse.rules.recognition import derived_name
    assert derived_name(["gelu_div", "gelu_erf", "gelu_mul"], "fallback") == "gelu"  # the docstring's example
    assert derived_name(["ln_a_x", "ln_a_y"], "fallback") == "ln_a"
    assert derived_name(["a", "b"], "fallback") == "fallback"


# Each constant of a formula off, or a run-time input in its place: no rewrite, in every grouping ---------------

def _const(b, name, value, off):
    """The constant ``name`` (``value``); ``off[name]``: another value, or "input" for a run-time input."""
    got = off.get(name, value)
    if got == "input":
        return b.input(name, SHAPE)
    return b.const(name, f32(got))


def _erf_gelu(b, x, grouping, scale, off):
    k = _const(b, "k", math.sqrt(2) if scale == "Div" else 1 / math.sqrt(2), off)
    a = b.op("Add", b.op("Erf", b.op(scale, x, k)), _const(b, "one", 1.0, off))
    half = _const(b, "half", 0.5, off)
    return {"xa_half": lambda: b.op("Mul", b.op("Mul", x, a), half),
            "x_ahalf": lambda: b.op("Mul", x, b.op("Mul", a, half)),
            "xhalf_a": lambda: b.op("Mul", b.op("Mul", x, half), a)}[grouping]()


def _tanh_gelu(b, x, grouping, off):
    c = b.op("Pow", x, _const(b, "three", 3.0, off))
    inner = b.op("Add", x, b.op("Mul", c, _const(b, "coef", 0.044715, off)))
    t = b.op("Tanh", b.op("Mul", inner, _const(b, "k", math.sqrt(2 / math.pi), off)))
    a = b.op("Add", t, _const(b, "one", 1.0, off))
    half = _const(b, "half", 0.5, off)
    return {"xa_half": lambda: b.op("Mul", b.op("Mul", x, a), half),
            "x_ahalf": lambda: b.op("Mul", x, b.op("Mul", a, half)),
            "xhalf_a": lambda: b.op("Mul", b.op("Mul", x, half), a)}[grouping]()


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("off", [{"half": 0.6}, {"half": "input"}, {"one": 1.5}, {"one": "input"}, {"k": 1.5},
                                 {"k": "input"}])
def test_erf_gelu_with_a_constant_off_is_not_rewritten(grouping, off):
    for scale in ("Div", "Mul"):
        b = GraphBuilder("gelu_off")
        x = b.input("x", SHAPE)
        g = b.build(_erf_gelu(b, x, grouping, scale, off))
        assert "Gelu" not in ops(run(g, ERF_GELU, erf_gelu_pattern)[0]), (grouping, scale, off)


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("off", [{"half": 0.6}, {"half": "input"}, {"one": 1.5}, {"one": "input"}, {"k": 1.5},
                                 {"k": "input"}, {"coef": 0.05}, {"coef": "input"}, {"three": 2.0},
                                 {"three": "input"}])
def test_tanh_gelu_with_a_constant_off_is_not_rewritten(grouping, off):
    b = GraphBuilder("gelu_tanh_off")
    x = b.input("x", SHAPE)
    g = b.build(_tanh_gelu(b, x, grouping, off))
    assert "Gelu" not in ops(run(g, TANH_GELU, tanh_gelu_pattern)[0]), (grouping, off)


@pytest.mark.parametrize("off", [{"shift": 4.0}, {"shift": "input"}, {"six": 5.0}, {"six": "input"}, {"hi": 7.0},
                                 {"hi": "input"}, {"lo": 1.0}])
@pytest.mark.parametrize("form", ["product_div", "clip_div"])
def test_hard_swish_with_a_constant_off_is_not_rewritten(form, off):
    b = GraphBuilder("hs_off")
    x = b.input("x", SHAPE)
    c = b.op("Clip", b.op("Add", x, _const(b, "shift", 3.0, off)), _const(b, "lo", 0.0, off),
             _const(b, "hi", 6.0, off))
    six = _const(b, "six", 6.0, off)
    g = b.build(b.op("Div", b.op("Mul", x, c), six) if form == "product_div" else b.op("Mul", x, b.op("Div", c, six)))
    assert "HardSwish" not in ops(run(g, HARD_SWISH, hard_swish_pattern)[0]), (form, off)


def test_an_intermediate_that_is_a_graph_output_is_refused():
    # the Sigmoid may be read outside the match (the pattern keeps it) but is a graph output: Silu would lose it
    b = GraphBuilder("silu_out")
    x = b.input("x", SHAPE)
    s = b.op("Sigmoid", x)
    g = b.build(b.op("Mul", x, s), s)
    g1, decisions = run(g, SILU, silu_pattern)
    assert ops(g1) == ["Sigmoid", "Mul"]
    assert [(d.verdict, d.reason) for d in decisions] == [("refused", f"intermediate '{s.name}' is a graph output")]


def test_constants_are_compared_relative_to_their_size_with_a_floor_of_one():
    """CONST_TOLERANCE (1e-5) times max(|want|, 1): 0.5 off by 1.5e-5 is refused; 6 off by 3e-5 (5e-6 of it) is not."""
    b = GraphBuilder("gelu_near")
    x = b.input("x", SHAPE)
    g = b.build(_erf_gelu(b, x, "xa_half", "Div", {"half": 0.5 + 1.5e-5}))
    g1, decisions = run(g, ERF_GELU, erf_gelu_pattern)
    assert "Gelu" not in ops(g1) and "final factor" in decisions[0].reason
    b = GraphBuilder("hs_near")
    x = b.input("x", SHAPE)
    c = _clip(b, x)
    g = b.build(b.op("Div", b.op("Mul", x, c), b.const("six", f32(6.00003))))
    recognised(g, HARD_SWISH, hard_swish_pattern, "HardSwish")


def _ln_parts(b, x, *, square=None, num=None, exponent=2.0, eps=1e-5):
    """mean, d = x - mean, var = mean(square(d)), d / sqrt(var + eps); ``square``/``num`` replace d where given."""
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name="mean")
    d = b.op("Sub", x, mean, name="centered")
    sq = square(d) if square else b.op("Pow", d, b.const("exponent", f32(exponent)), name="square")
    var = b.op("ReduceMean", sq, axes=[-1], keepdims=1, name="variance")
    std = b.op("Sqrt", b.op("Add", var, b.const("eps", f32(eps)), name="add_eps"), name="std")
    return b.op("Div", num if num is not None else d, std, name="normalized")


def test_layernorm_near_misses_with_another_input_are_not_rewritten():
    b, x, y = _xy()
    g1 = b.build(_ln_parts(b, x, square=lambda d: b.op("Mul", d, y)))
    b, x, y = _xy()
    g2 = b.build(_ln_parts(b, x, square=lambda d: b.op("Pow", y, b.const("two", f32(2.0)))))
    b, x, y = _xy()
    g3 = b.build(_ln_parts(b, x, num=y))
    for g in (g1, g2, g3):
        assert "LayerNormalization" not in ops(run(g, LAYERNORM, layernorm_pattern)[0])


def test_layernorm_refusals_name_what_is_off():
    b = GraphBuilder("ln_cube")
    x = b.input("x", SHAPE)
    g1, decisions = run(b.build(_ln_parts(b, x, exponent=3.0)), LAYERNORM, layernorm_pattern)
    assert "LayerNormalization" not in ops(g1) and decisions[0].reason == "Pow exponent 'exponent' is not 2"
    b = GraphBuilder("ln_neg_eps")
    x = b.input("x", SHAPE)
    g1, decisions = run(b.build(_ln_parts(b, x, eps=-1.0)), LAYERNORM, layernorm_pattern)
    assert "LayerNormalization" not in ops(g1)
    assert decisions[0].reason == "epsilon 'eps' is not a non-negative constant scalar"
    # gamma / beta varying along the leading axis: refused, the normalisation without them still recognised
    for what, key in (("scale", "gamma"), ("bias", "beta")):
        b = GraphBuilder("ln_wide")
        x = b.input("x", SHAPE)
        y = b.op("Mul", _ln_parts(b, x), b.const("gamma", randn(SHAPE, 3) if key == "gamma" else randn(SHAPE[-1], 3)))
        y = b.op("Add", y, b.const("beta", randn(SHAPE, 4) if key == "beta" else randn(SHAPE[-1], 4)))
        g1, decisions = run(b.build(y), LAYERNORM, layernorm_pattern)
        assert decisions[0].verdict == "refused"
        assert decisions[0].reason == f"{what} '{key}' (2, 8) varies outside the normalised axes"
        assert "LayerNormalization" in ops(g1)


def test_tanh_gelu_with_another_input_in_a_product_cube_is_not_rewritten():
    for cube in (lambda b, x, y: b.op("Mul", b.op("Mul", x, x), y), lambda b, x, y: b.op("Mul", b.op("Mul", x, y), x),
                 lambda b, x, y: b.op("Mul", x, b.op("Mul", y, x)), lambda b, x, y: b.op("Mul", y, b.op("Mul", x, x))):
        b, x, y = _xy()
        inner = b.op("Add", x, b.op("Mul", cube(b, x, y), b.const("coef", f32(0.044715))))
        t = b.op("Tanh", b.op("Mul", inner, b.const("k", f32(math.sqrt(2 / math.pi)))))
        g = b.build(half_product(b, x, b.op("Add", t, b.const("one", f32(1.0))), "xa_half"))
        assert "Gelu" not in ops(run(g, TANH_GELU, tanh_gelu_pattern)[0])
    b, x, y = _xy()  # erf GELU scaled by Mul(y, 1/sqrt(2))
    a = b.op("Add", b.op("Erf", b.op("Mul", y, b.const("k", f32(1 / math.sqrt(2))))), b.const("one", f32(1.0)))
    g = b.build(half_product(b, x, a, "xa_half"))
    assert "Gelu" not in ops(run(g, ERF_GELU, erf_gelu_pattern)[0])


def test_derived_names_of_unequal_lengths_and_at_the_shortest_length():
    from opfuse.rules.recognition import derived_name
    assert derived_name(["gelu_div", "gelu_erf_1"], "fallback") == "gelu"
    assert derived_name(["gelu", "gelu_erf"], "fallback") == "gelu"  # one name is the whole prefix
    assert derived_name(["abc_x", "abc_y"], "fallback") == "abc"  # 3 characters: long enough


def test_tanh_gelu_with_another_op_in_a_product_cube_is_not_rewritten():
    for cube in (lambda b, x: b.op("Add", b.op("Mul", x, x), x), lambda b, x: b.op("Mul", b.op("Add", x, x), x),
                 lambda b, x: b.op("Add", x, b.op("Mul", x, x)), lambda b, x: b.op("Mul", x, b.op("Add", x, x))):
        b = GraphBuilder("not_cube")
        x = b.input("x", SHAPE)
        inner = b.op("Add", x, b.op("Mul", cube(b, x), b.const("coef", f32(0.044715))))
        t = b.op("Tanh", b.op("Mul", inner, b.const("k", f32(math.sqrt(2 / math.pi)))))
        g = b.build(half_product(b, x, b.op("Add", t, b.const("one", f32(1.0))), "xa_half"))
        assert "Gelu" not in ops(run(g, TANH_GELU, tanh_gelu_pattern)[0])
