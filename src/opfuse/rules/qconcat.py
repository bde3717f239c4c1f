"""``int8_concat``: dequantized 8-bit tensors concatenated and requantized at their own scale are a Concat of them.

A QDQ model concatenates in float between a dequantization of each input and a quantization of the
result; imported, that is

    q_i -> Cast(float32) -> [Sub(zp_i)] -> Mul(s_i) --+
                                                      +-> Concat -> Div(s) -> Round -> [Add(zp)]
    ...                                          ----+       -> Clip(lo, hi) -> Cast(T)

When every input has the output's scale and zero point (``s_i == s``, ``zp_i == zp``, ``q_i`` of
the output's 8-bit type ``T``) the quantization undoes the dequantization exactly: with
``k = q - zp`` (an integer, ``|k| <= 255``), float32 ``(k * s) / s`` is ``k`` within ``255 * 2^-23``
relative rounding of two operations (``s`` a normal float32 at least ``MIN_SCALE``, so ``k * s`` is
normal too), far below the half that ``Round`` needs to move, and ``k + zp = q`` lies in
``[lo, hi]``. So the rule rewrites the match into ``Concat(q_1, ..., q_n)`` of the 8-bit tensors:
exactly the same values, and a Concat the ``concat_alias`` rule can then elide (each producer
writes its 8-bit result straight into its slice) instead of a kernel that dequantizes, copies and
requantizes. The dequantizations stay for any other reader of them (dead otherwise).

Refusals, each with its reason: a scale or zero point that differs from the output's (the values
would change: requantization), an input not dequantized from a tensor of the output's type, a
non-constant or non-scalar scale or zero point, a clamp narrower than the type (a fused ReLU), a
scale below ``MIN_SCALE``, or the float Concat read elsewhere.
"""
from __future__ import annotations

import numpy as np

from opfuse.frontend.dequantized import dequantized
from opfuse.ir.graph import Node, Value
from opfuse.patterns import Op
from opfuse.rules.recognition import derived_name, escape_reason
from opfuse.rules.rule import Replacement, Rule

RULE = "int8_concat"
EIGHT_BIT = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}
# Smallest scale for which (k * s) / s == k holds for every |k| <= 255 in float32 (k * s stays normal).
MIN_SCALE = 2.0 ** -100
PRIORITY = 1.0


def _const_scalar(v: Value | None) -> np.ndarray | None:
    """The float32 value of a constant scalar (size 1) operand, or None."""
    if v is None or v.const is None or v.const.size != 1:
        return None
    return np.asarray(v.const).reshape(())


def _dequantized(v: Value) -> tuple[Value, np.ndarray, np.ndarray | None] | str:
    """``(q, scale, zero point or None)`` of ``v = (float(q) [- zp]) * s`` per tensor (``frontend.dequantized``),
    or why it is not one."""
    d = dequantized(v, f"Concat input {v.name}")
    if isinstance(d, str):
        return d
    if d.scale.size != 1:
        return f"Concat input {v.name} is not dequantized with a constant scalar scale"
    if d.zero is not None and d.zero.size != 1:
        return f"Concat input {v.name} is not dequantized with a constant scalar zero point"
    if d.q.dtype not in EIGHT_BIT:
        return f"Concat input {v.name} is not dequantized from an 8-bit tensor"
    return d.q, d.scale.reshape(()), None if d.zero is None else d.zero.reshape(())


def _one(m, key: str) -> Node | None:
    """The node captured as ``key`` (an optional step's capture is a list: empty when it is absent)."""
    got = m.get(key)
    if isinstance(got, list):
        return got[0] if got else None
    return got


def concat_refusal(m) -> str | None:
    """Why the match is not an exact int8 Concat (None when it is)."""
    concat, div, q = m["concat"], m["div"], m["q"]
    out_t = q.outputs[0].dtype
    if out_t not in EIGHT_BIT or concat.outputs[0].dtype != np.float32:
        return f"'{q.name}' does not quantize a float32 Concat to int8 or uint8"
    if div.input_values()[0] is not concat.outputs[0]:
        return f"'{div.name}' does not divide the Concat's output"
    s = _const_scalar(div.input_values()[1])
    if s is None:
        return f"'{div.name}' divides by no constant scalar scale"
    if not (np.isfinite(s) and float(s) >= MIN_SCALE and float(s) * 255 < np.finfo(np.float32).max):
        return f"the output scale {float(s):g} is below {MIN_SCALE:g} or too large for an exact round trip"
    zp = np.asarray(np.float32(0))
    add = _one(m, "add")
    if add is not None:
        consts = [c for c in (_const_scalar(v) for v in add.input_values()) if c is not None]
        if len(consts) != 1:
            return f"'{add.name}' adds no constant scalar zero point"
        zp = consts[0]
    clip = m["clip"]
    bounds = [b for b in (_const_scalar(v) for v in clip.input_values()[1:]) if b is not None]
    if len(bounds) != 2 or (float(bounds[0]), float(bounds[1])) != tuple(float(b) for b in EIGHT_BIT[out_t]):
        return f"'{clip.name}' clamps to other bounds than {out_t.name}'s range"
    for v in concat.input_values():
        got = _dequantized(v)
        if isinstance(got, str):
            return got
        x_q, s_i, zp_i = got
        if x_q.dtype != out_t:
            return f"'{x_q.name}' is {x_q.dtype.name}, the Concat's output {out_t.name}"
        if np.float32(s_i) != np.float32(s):
            return f"'{v.name}' has scale {float(s_i):g}, the output {float(s):g}: a requantization"
        if float(zp_i if zp_i is not None else 0) != float(zp):
            return f"'{v.name}' has zero point {float(zp_i if zp_i is not None else 0):g}, the output " \
                   f"{float(zp):g}: a requantization"
    return escape_reason(m)


def int8_concat_pattern():
    """``Concat -> Div -> Round -> [Add] -> Clip -> Cast``, each step after the Concat read only by the next (the
    Concat's other readers are the condition's refusal, with its reason)."""
    return (Op("Concat").named("concat").keep() >> Op("Div").named("div") >> Op("Round")
            >> Op("Add").named("add").opt() >> Op("Clip").named("clip") >> Op("Cast").named("q"))


def _action(m):
    concat = m["concat"]
    inputs = []
    for v in concat.input_values():
        got = _dequantized(v)
        assert not isinstance(got, str)  # the condition checked every input
        inputs.append(got[0])
    name = derived_name([n.name for n in m.nodes], f"{concat.name}_int8")
    return Replacement("Concat", inputs, {"axis": int(concat.attrs.get("axis", 0))}, name=name)


INT8_CONCAT = Rule(RULE, int8_concat_pattern(), condition=concat_refusal, action=_action, priority=PRIORITY,
                   kind="data_movement",
                   description="Concat of dequantized int8/uint8 tensors at the output's scale and zero point, "
                               "requantized -> Concat of the 8-bit tensors (then aliased)")

__all__ = ["INT8_CONCAT", "concat_refusal", "int8_concat_pattern", "MIN_SCALE", "RULE"]
