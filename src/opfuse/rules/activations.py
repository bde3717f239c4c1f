"""Recognise activations exporters decompose, and rewrite each into its one op.

* SiLU:       ``x * Sigmoid(x)``                                   -> ``Silu(x)``
* hard-swish: ``x * HardSigmoid(x)`` with alpha = 1/6, beta = 1/2,
              ``x * Clip(x + 3, 0, 6) / 6`` or ``... * (1/6)``      -> ``HardSwish(x)``
              (HardSwish(x) = x * max(0, min(1, x/6 + 1/2)) = x * clip(x + 3, 0, 6) / 6)
* erf-GELU:   ``0.5 * x * (1 + erf(x / sqrt(2)))`` as Div (or Mul by 1/sqrt(2)) -> Erf -> Add(1)
              -> Mul(x) -> Mul(0.5), or with the 0.5 applied to x first  -> ``Gelu(x)``

The constants are checked by the condition, not the pattern, so a near miss is reported with
its reason ("Div constant 2.0 is not sqrt(2)") instead of silently not matching.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.patterns import Const, Op, Var
from opfuse.rules.rule import Replacement, Rule, close, scalar

# Relative tolerance when comparing a model's constants with the ones a formula needs (float32
# storage of sqrt(2) or 1/6 is off by ~1e-8 relative).
CONST_TOLERANCE = 1e-5
PRIORITY_RECOGNITION = 1.0
SQRT2 = math.sqrt(2.0)
HARDSWISH_ALPHA = 1.0 / 6.0
HARDSWISH_BETA = 0.5
HARDSWISH_SHIFT = 3.0
HARDSWISH_CLIP_HI = 6.0


def _is_float(v) -> str | None:
    if not np.issubdtype(v.dtype, np.floating):
        return f"'{v.name}' is {v.dtype.name}, not a float tensor"
    return None


def _expect(value, want: float, what: str) -> str | None:
    got = scalar(value)
    if got is None:
        return f"{what} '{value.name}' is not a constant scalar"
    if not close(got, want, CONST_TOLERANCE):
        return f"{what} '{value.name}' is {got:g}, not {want:g}"
    return None


# SiLU -----------------------------------------------------------------------------------------------

def silu_pattern():
    x = Var("x")
    return Op("Mul")(x, Op("Sigmoid")(x).named("sigmoid")).named("mul")


def silu_ok(m) -> str | None:
    return _is_float(m["x"])


SILU = Rule("silu", silu_pattern(), condition=silu_ok,
            action=lambda m: Replacement("Silu", [m["x"]]), priority=PRIORITY_RECOGNITION,
            kind="activation", description="x * Sigmoid(x) -> Silu(x)")


# Hard-swish --------------------------------------------------------------------------------------------

def hard_swish_pattern():
    x = Var("x")
    via_hardsigmoid = Op("Mul")(x, Op("HardSigmoid")(x).named("hsig")).named("out")
    clip = Op("Clip")(Op("Add")(x, Const(name="shift")).named("add"), Const(name="lo"), Const(name="hi"))
    scaled = Op("Mul")(x, clip.named("clip")).named("mul")
    via_clip = Op("Div")(scaled, Const(name="scale")).named("out") | Op("Mul")(scaled, Const(name="scale")).named("out")
    return via_hardsigmoid | via_clip


def hard_swish_ok(m) -> str | None:
    reason = _is_float(m["x"])
    if reason:
        return reason
    hsig = m.get("hsig")
    if hsig is not None:
        a = hsig.attrs.get("alpha", 0.2)
        b = hsig.attrs.get("beta", 0.5)
        if not (close(a, HARDSWISH_ALPHA, CONST_TOLERANCE) and close(b, HARDSWISH_BETA, CONST_TOLERANCE)):
            return f"HardSigmoid '{hsig.name}' has alpha={a:g}, beta={b:g}; hard-swish needs 1/6 and 1/2"
        return None
    out = m["out"]
    want_scale = HARDSWISH_CLIP_HI if out.op_type == "Div" else 1.0 / HARDSWISH_CLIP_HI
    return (_expect(m["shift"], HARDSWISH_SHIFT, "shift") or _expect(m["lo"], 0.0, "Clip min")
            or _expect(m["hi"], HARDSWISH_CLIP_HI, "Clip max")
            or _expect(m["scale"], want_scale, f"{out.op_type} constant"))


HARD_SWISH = Rule("hard_swish", hard_swish_pattern(), condition=hard_swish_ok,
                  action=lambda m: Replacement("HardSwish", [m["x"]]), priority=PRIORITY_RECOGNITION,
                  kind="activation", description="x * HardSigmoid(x) or x * Clip(x+3, 0, 6) / 6 -> HardSwish(x)")


# erf-GELU ----------------------------------------------------------------------------------------------

def erf_gelu_pattern():
    x = Var("x")
    scaled = Op("Div")(x, Const(name="k")).named("scale_in") | Op("Mul")(x, Const(name="k")).named("scale_in")
    one_plus = Op("Add")(Op("Erf")(scaled).named("erf"), Const(name="one")).named("one_plus")
    half_last = Op("Mul")(Op("Mul")(x, one_plus).named("mul_x"), Const(name="half")).named("out")
    half_first = Op("Mul")(Op("Mul")(x, Const(name="half")).named("mul_x"), one_plus).named("out")
    return half_last | half_first


def erf_gelu_ok(m) -> str | None:
    reason = _is_float(m["x"])
    if reason:
        return reason
    s = m["scale_in"]
    want = SQRT2 if s.op_type == "Div" else 1.0 / SQRT2
    return (_expect(m["k"], want, f"{s.op_type} constant")
            or _expect(m["one"], 1.0, "Add constant") or _expect(m["half"], 0.5, "Mul constant"))


ERF_GELU = Rule("erf_gelu", erf_gelu_pattern(), condition=erf_gelu_ok,
                action=lambda m: Replacement("Gelu", [m["x"]], {"approximate": "none"}),
                priority=PRIORITY_RECOGNITION, kind="activation",
                description="0.5 * x * (1 + erf(x / sqrt(2))) -> Gelu(x)")

__all__ = ["SILU", "HARD_SWISH", "ERF_GELU", "silu_pattern", "hard_swish_pattern", "erf_gelu_pattern",
           "CONST_TOLERANCE"]
