"""Recognise SiLU and hard-swish written as several ops, and rewrite each into its one op.

* SiLU (swish): ``Silu(x) = x * sigmoid(x)``, exported as ``Mul(x, Sigmoid(x))``.
* hard-swish: ``HardSwish(x) = x * clip(x/6 + 1/2, 0, 1) = x * clip(x + 3, 0, 6) / 6``, exported
  as ``Mul(x, HardSigmoid(x, alpha=1/6, beta=1/2))`` or as ``Add(x, 3) -> Clip(., 0, 6) ->
  Mul(x, .) -> Div(., 6)`` (the division may come before the product, or be a ``Mul`` by 1/6).

Refusals (``opfuse.rules.recognition``): ``x`` is not float, a constant is off (a HardSigmoid
with the ONNX default ``alpha=0.2`` times x is not hard-swish), or the Sigmoid/HardSigmoid/Clip
output is also read elsewhere.
"""
from __future__ import annotations

from opfuse.ops.registry import get_spec
from opfuse.patterns import Const, Op, Var
from opfuse.rules.recognition import (CONST_TOLERANCE, PRIORITY_RECOGNITION, broadcast_reason, const_reason,
                                      escape_reason, float_reason, replace_x)
from opfuse.rules.rule import Rule, close

HARDSWISH_ALPHA = 1.0 / 6.0
HARDSWISH_BETA = 0.5
HARDSWISH_SHIFT = 3.0
RELU6_MAX = 6.0


# SiLU -----------------------------------------------------------------------------------------------

def silu_pattern():
    x = Var("x")
    return Op("Mul")(x, Op("Sigmoid")(x).named("sigmoid").keep())


def silu_ok(m) -> str | None:
    return float_reason(m["x"]) or escape_reason(m)


SILU = Rule("recognize_silu", silu_pattern(), condition=silu_ok, action=replace_x("Silu"),
            priority=PRIORITY_RECOGNITION, kind="activation", description="x * Sigmoid(x) -> Silu(x)")


# Hard-swish --------------------------------------------------------------------------------------------

def hard_swish_pattern():
    x = Var("x")
    via_hardsigmoid = Op("Mul")(x, Op("HardSigmoid")(x).named("hsig").keep())
    clip = Op("Clip")(Op("Add")(x, Const(name="shift")).keep()).named("clip").keep()
    scale = Const(name="scale")
    return (via_hardsigmoid
            | Op("Div", "Mul")(Op("Mul")(x, clip).keep(), scale).named("divide")
            | Op("Mul")(x, Op("Div", "Mul")(clip, scale).named("divide").keep()))


def _hardsigmoid_reason(hsig) -> str | None:
    a = get_spec("HardSigmoid").attrs_of(hsig)
    if close(a["alpha"], HARDSWISH_ALPHA, CONST_TOLERANCE) and close(a["beta"], HARDSWISH_BETA, CONST_TOLERANCE):
        return None
    return f"HardSigmoid '{hsig.name}' has alpha={a['alpha']:g}, beta={a['beta']:g}; hard-swish needs 1/6 and 1/2"


def _clip_reason(m) -> str | None:
    clip, divide = m["clip"], m["divide"]
    lo = clip.inputs[1] if len(clip.inputs) > 1 else None
    hi = clip.inputs[2] if len(clip.inputs) > 2 else None
    if divide.op_type == "Div" and divide.inputs[1] is not m["scale"]:
        return f"Div '{divide.name}' divides the constant, not by it"
    want_scale = RELU6_MAX if divide.op_type == "Div" else 1.0 / RELU6_MAX
    return (const_reason(m["shift"], HARDSWISH_SHIFT, "shift") or const_reason(lo, 0.0, "Clip min")
            or const_reason(hi, RELU6_MAX, "Clip max")
            or const_reason(m["scale"], want_scale, f"{divide.op_type} constant"))


def hard_swish_ok(m) -> str | None:
    hsig = m.get("hsig")
    return (float_reason(m["x"]) or (_hardsigmoid_reason(hsig) if hsig is not None else _clip_reason(m))
            or broadcast_reason(m) or escape_reason(m))


HARD_SWISH = Rule("recognize_hardswish", hard_swish_pattern(), condition=hard_swish_ok,
                  action=replace_x("HardSwish"), priority=PRIORITY_RECOGNITION, kind="activation",
                  description="x * HardSigmoid(x) or x * Clip(x + 3, 0, 6) / 6 -> HardSwish(x)")

__all__ = ["SILU", "HARD_SWISH", "silu_pattern", "hard_swish_pattern"]
