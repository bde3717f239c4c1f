"""Recognise the two exported GELU forms and replace each by one Gelu op.

* erf form (``approximate="none"``): ``GELU(x) = 0.5 x (1 + erf(x / sqrt(2)))``, exported as
  ``Div(x, sqrt(2))`` (or ``Mul(x, 1/sqrt(2))``) -> Erf -> ``Add(., 1)`` -> the product with x
  and 0.5 in any association.
* tanh form (``approximate="tanh"``):
  ``GELU(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, exported as ``Pow(x, 3)``
  (or ``x*x*x``) -> ``Mul(., 0.044715)`` -> ``Add(x, .)`` -> ``Mul(., sqrt(2/pi))`` -> Tanh ->
  ``Add(., 1)`` -> the product with x and 0.5.

The product ``0.5 * x * a`` is accepted as ``(x * a) * 0.5``, ``x * (a * 0.5)`` and
``(x * 0.5) * a``. Constants are compared with a relative tolerance of ``CONST_RTOL``.
Refusals: a constant is off (say 0.5 is 0.6), or the constants broadcast the output.
"""
from __future__ import annotations

import math

from opfuse.patterns import Const, Op, Var
from opfuse.rewrites.edit import derived_name, is_scalar_close, scalar_of
from opfuse.rules.rule import Replacement, Rule

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715
HALF = 0.5
CUBE = 3.0


def half_product(x, a):
    """``0.5 * x * a`` in its three associations."""
    return (Op("Mul")(Op("Mul")(x, a), Const(name="half"))
            | Op("Mul")(x, Op("Mul")(a, Const(name="half")))
            | Op("Mul")(Op("Mul")(x, Const(name="half")), a))


def gelu_erf_pattern():
    x = Var("x")
    scaled = Op("Div")(x, Const(name="c")).named("scale") | Op("Mul")(x, Const(name="c")).named("scale")
    a = Op("Add")(Op("Erf")(scaled), Const(name="one"))
    return half_product(x, a)


def gelu_tanh_pattern():
    x = Var("x")
    cube = (Op("Pow")(x, Const(name="three"))
            | Op("Mul")(Op("Mul")(x, x), x)
            | Op("Mul")(x, Op("Mul")(x, x)))
    inner = Op("Add")(x, Op("Mul")(cube, Const(name="coef")))
    t = Op("Tanh")(Op("Mul")(inner, Const(name="k")))
    return half_product(x, Op("Add")(t, Const(name="one")))


def _check_consts(m, wanted) -> str | None:
    for key, want, what in wanted:
        if m.get(key) is not None and not is_scalar_close(m[key], want):
            return f"{what} {scalar_of(m[key])} is not {want:.7g}"
    if m.nodes[-1].outputs[0].shape != m["x"].shape:
        return "the constants broadcast the output beyond the input shape"
    return None


def _erf_condition(m) -> str | None:
    want = SQRT2 if m["scale"].op_type == "Div" else 1.0 / SQRT2
    return _check_consts(m, (("c", want, "erf argument scale"), ("one", 1.0, "constant added to erf"),
                             ("half", HALF, "final factor")))


def _tanh_condition(m) -> str | None:
    return _check_consts(m, (("three", CUBE, "Pow exponent"), ("coef", TANH_CUBIC, "cubic coefficient"),
                             ("k", SQRT_2_OVER_PI, "tanh argument scale"),
                             ("one", 1.0, "constant added to tanh"), ("half", HALF, "final factor")))


def _action(approximate: str):
    def action(m):
        name = derived_name([n.name for n in m.nodes], f"{m.nodes[0].name}_gelu")
        return Replacement("Gelu", [m["x"]], {"approximate": approximate}, name=name)
    return action


def gelu_erf_rule() -> Rule:
    return Rule("recognize_gelu_erf", gelu_erf_pattern(), condition=_erf_condition, action=_action("none"),
                priority=3.0, kind="rewrite", description="0.5 x (1 + erf(x / sqrt 2)) -> Gelu")


def gelu_tanh_rule() -> Rule:
    return Rule("recognize_gelu_tanh", gelu_tanh_pattern(), condition=_tanh_condition,
                action=_action("tanh"), priority=3.0, kind="rewrite",
                description="0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> Gelu(tanh)")
