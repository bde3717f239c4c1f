"""Attention: ``MatMul -> (Div | Mul)? -> Softmax -> MatMul``.

``softmax(Q K^T / s) V`` computed row by row never needs the [L, L] score matrix in memory:
each row of scores is produced, scaled, normalised (max, exp, sum) and multiplied into V while
it is on chip. Legality: the Softmax runs along the last axis (a score row), the scale is a
constant scalar, and the probabilities are the *left* operand of the second product.
"""
from __future__ import annotations

from opfuse.patterns import Op, Var
from opfuse.rules.rule import Rule, refuse, scalar

PRIORITY_ATTENTION = 4.0


def attention_pattern():
    scores = Op("MatMul").named("qk")
    scaled = scores >> Op("Div", "Mul").at(0).named("scale").opt()
    probs = scaled >> Op("Softmax").at(0).named("softmax")
    return Op("MatMul")(probs, Var("v")).named("pv")


def attention_ok(m) -> str | None:
    sm = m["softmax"]
    rank = len(sm.outputs[0].shape)
    axis = sm.attrs.get("axis", -1)
    if axis % rank != rank - 1:
        return refuse(f"Softmax '{sm.name}' normalises axis {axis}, not the last (key) axis", sm)
    for s in m["scale"]:
        other = [v for v in s.inputs if v is not None and v is not m["qk"].outputs[0]]
        if not other or scalar(other[0]) is None:
            return refuse(f"'{s.name}' does not scale the scores by a constant scalar", s)
    return None


ATTENTION = Rule("attention", attention_pattern(), condition=attention_ok, priority=PRIORITY_ATTENTION,
                 kind="attention", anchor="softmax",
                 description="MatMul -> (Div|Mul)? -> Softmax -> MatMul without materialising scores")

__all__ = ["ATTENTION", "attention_pattern", "attention_ok"]
