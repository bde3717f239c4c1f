"""Recognise SiLU and hard-swish written as several ops, and replace each by one op.

* SiLU (swish): ``Silu(x) = x * sigmoid(x)``, exported as ``Mul(x, Sigmoid(x))``.
* hard-swish: ``HardSwish(x) = x * clip(x / 6 + 1/2, 0, 1) = x * clip(x + 3, 0, 6) / 6``,
  exported either as ``Mul(x, HardSigmoid(x, alpha=1/6, beta=1/2))`` or as
  ``Add(x, 3) -> Clip(., 0, 6) -> Mul(x, .) -> Div(., 6)`` (the division by 6 may also come
  before the product, or be a ``Mul`` by ``1/6``).

Refusals: the Sigmoid/HardSigmoid/Clip output is also read elsewhere (it must still be
computed), or the constants differ (a HardSigmoid with ``alpha=0.2`` times x is not
hard-swish).
"""
from __future__ import annotations

import numpy as np

from opfuse.ops.registry import get_spec
from opfuse.patterns import Const, Op, Var
from opfuse.rewrites.edit import CONST_RTOL, derived_name, is_scalar_close, outside_readers, scalar_of
from opfuse.rules.rule import Replacement, Rule

HARDSWISH_ALPHA = 1.0 / 6.0
HARDSWISH_BETA = 0.5
RELU6_MAX = 6.0
HARDSWISH_SHIFT = 3.0


def _escapes(m) -> str | None:
    last = m.nodes[-1]
    inside = {id(n) for n in m.nodes}
    escape = outside_readers([n.outputs[0] for n in m.nodes if n is not last], inside, m.graph)
    return f"intermediate {escape}" if escape else None


def _replace(op_type):
    def action(m):
        name = derived_name([n.name for n in m.nodes], f"{m.nodes[0].name}_{op_type.lower()}")
        return Replacement(op_type, [m["x"]], {}, name=name)
    return action


def silu_pattern():
    x = Var("x")
    return Op("Mul")(x, Op("Sigmoid")(x).named("sigmoid").keep())


def silu_rule() -> Rule:
    return Rule("recognize_silu", silu_pattern(), condition=_escapes, action=_replace("Silu"),
                priority=3.0, kind="rewrite", description="x * Sigmoid(x) -> Silu")


def hardswish_pattern():
    x = Var("x")
    hs = Op("Mul")(x, Op("HardSigmoid")(x).named("hardsigmoid").keep())
    clip = Op("Clip")(Op("Add")(x, Const(name="three")).keep()).named("clip").keep()
    six = Const(name="six")
    return (hs
            | Op("Div", "Mul")(Op("Mul")(x, clip).keep(), six).named("divide")
            | Op("Mul")(x, Op("Div", "Mul")(clip, six).named("divide").keep()))


def _hardswish_condition(m) -> str | None:
    if m.get("hardsigmoid") is not None:
        a = get_spec("HardSigmoid").attrs_of(m["hardsigmoid"])
        if not (np.isclose(a["alpha"], HARDSWISH_ALPHA, rtol=CONST_RTOL)
                and np.isclose(a["beta"], HARDSWISH_BETA, rtol=CONST_RTOL)):
            return f"HardSigmoid alpha={a['alpha']:g}, beta={a['beta']:g} is not alpha=1/6, beta=1/2"
    else:
        clip = m["clip"]
        lo = clip.inputs[1] if len(clip.inputs) > 1 else None
        hi = clip.inputs[2] if len(clip.inputs) > 2 else None
        if not (is_scalar_close(lo, 0.0) and is_scalar_close(hi, RELU6_MAX)):
            return "Clip bounds are not the constants 0 and 6"
        if not is_scalar_close(m["three"], HARDSWISH_SHIFT):
            return f"shift {scalar_of(m['three'])} is not 3"
        if m["divide"].op_type == "Div" and m["divide"].inputs[1] is not m["six"]:
            return "the division is not by the constant"
        want = RELU6_MAX if m["divide"].op_type == "Div" else 1.0 / RELU6_MAX
        if not is_scalar_close(m["six"], want):
            return f"divisor constant {scalar_of(m['six'])} is not {want:.7g}"
    if m.nodes[-1].outputs[0].shape != m["x"].shape:
        return "the constants broadcast the output beyond the input shape"
    return _escapes(m)


def hardswish_rule() -> Rule:
    return Rule("recognize_hardswish", hardswish_pattern(), condition=_hardswish_condition,
                action=_replace("HardSwish"), priority=3.0, kind="rewrite",
                description="x * HardSigmoid(x) or x * Clip(x + 3, 0, 6) / 6 -> HardSwish")
