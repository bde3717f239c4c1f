"""Recognise the two exported GELU forms and rewrite each into one ``Gelu`` op.

* erf form (``approximate="none"``): ``GELU(x) = 0.5 x (1 + erf(x / sqrt(2)))``, exported as
  ``Div(x, sqrt(2))`` (or ``Mul(x, 1/sqrt(2))``) -> Erf -> ``Add(., 1)`` -> the product with x
  and 0.5.
* tanh form (``approximate="tanh"``):
  ``GELU(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, exported as ``Pow(x, 3)``
  (or ``x*x*x``) -> ``Mul(., 0.044715)`` -> ``Add(x, .)`` -> ``Mul(., sqrt(2/pi))`` -> Tanh ->
  ``Add(., 1)`` -> the product with x and 0.5.

The product ``0.5 * x * a`` is accepted in its three groupings: ``(x * a) * 0.5``,
``x * (a * 0.5)`` and ``(x * 0.5) * a``. Refusals (``opfuse.rules.recognition``): ``x`` is not
float, a constant is off (say 0.5 is 0.6), the constants broadcast the output, or an
intermediate is read elsewhere.
"""
from __future__ import annotations

import math

from opfuse.patterns import Const, Op, Var
from opfuse.rules.recognition import (PRIORITY_RECOGNITION, broadcast_reason, const_reason, escape_reason,
                                      float_reason, replace_x)
from opfuse.rules.rule import Rule

SQRT2 = math.sqrt(2.0)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
TANH_CUBIC = 0.044715
HALF = 0.5
CUBE = 3.0


def half_product(x, a):
    """``0.5 * x * a`` in its three groupings (every inner product may only feed the next)."""
    return (Op("Mul")(Op("Mul")(x, a), Const(name="half"))
            | Op("Mul")(x, Op("Mul")(a, Const(name="half")))
            | Op("Mul")(Op("Mul")(x, Const(name="half")), a))


def erf_gelu_pattern():
    x = Var("x")
    scaled = Op("Div")(x, Const(name="k")).named("scale_in") | Op("Mul")(x, Const(name="k")).named("scale_in")
    return half_product(x, Op("Add")(Op("Erf")(scaled), Const(name="one")))


def tanh_gelu_pattern():
    x = Var("x")
    cube = (Op("Pow")(x, Const(name="three"))
            | Op("Mul")(Op("Mul")(x, x), x)
            | Op("Mul")(x, Op("Mul")(x, x)))
    inner = Op("Add")(x, Op("Mul")(cube, Const(name="coef")))
    t = Op("Tanh")(Op("Mul")(inner, Const(name="k")))
    return half_product(x, Op("Add")(t, Const(name="one")))


def _consts_reason(m, wanted) -> str | None:
    for key, want, what in wanted:
        if m.get(key) is not None:
            reason = const_reason(m[key], want, what)
            if reason:
                return reason
    return None


def erf_gelu_ok(m) -> str | None:
    s = m["scale_in"]
    want = SQRT2 if s.op_type == "Div" else 1.0 / SQRT2
    return (float_reason(m["x"])
            or _consts_reason(m, (("k", want, f"{s.op_type} constant"), ("one", 1.0, "constant added to erf"),
                                  ("half", HALF, "final factor")))
            or broadcast_reason(m) or escape_reason(m))


def tanh_gelu_ok(m) -> str | None:
    return (float_reason(m["x"])
            or _consts_reason(m, (("three", CUBE, "Pow exponent"), ("coef", TANH_CUBIC, "cubic coefficient"),
                                  ("k", SQRT_2_OVER_PI, "tanh argument scale"),
                                  ("one", 1.0, "constant added to tanh"), ("half", HALF, "final factor")))
            or broadcast_reason(m) or escape_reason(m))


ERF_GELU = Rule("recognize_gelu_erf", erf_gelu_pattern(), condition=erf_gelu_ok,
                action=replace_x("Gelu", {"approximate": "none"}), priority=PRIORITY_RECOGNITION,
                kind="activation", description="0.5 * x * (1 + erf(x / sqrt(2))) -> Gelu(x)")

TANH_GELU = Rule("recognize_gelu_tanh", tanh_gelu_pattern(), condition=tanh_gelu_ok,
                 action=replace_x("Gelu", {"approximate": "tanh"}), priority=PRIORITY_RECOGNITION,
                 kind="activation",
                 description="0.5 * x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> Gelu(x, tanh)")

__all__ = ["ERF_GELU", "TANH_GELU", "erf_gelu_pattern", "tanh_gelu_pattern", "half_product"]
