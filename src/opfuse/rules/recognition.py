"""What every recognition rule (a formula written as several ops -> one op) checks and does.

A recognition may replace a match only when

* ``x`` is a float tensor (the single ops are defined on floats);
* each constant of the formula holds the number the formula needs, within ``CONST_TOLERANCE``
  relative (exporters store sqrt(2), 1/6 or 0.044715 in float32: ~1e-8 relative off);
* the constants do not broadcast the result beyond ``x``'s shape (the single op cannot);
* no intermediate value is read outside the match (it would still have to be computed).

Constants are checked by the condition, not the pattern, so a near miss is refused with its
reason ("final factor 'half' is 0.6, not 0.5") instead of silently not matching.
"""
from __future__ import annotations


from opfuse.ir.dtypes import is_floating
from opfuse.rules.rule import Replacement, close, outside_readers, scalar

CONST_TOLERANCE = 1e-5
# All recognitions share one priority: they never claim the same ops (LayerNorm goes first).
PRIORITY_RECOGNITION = 1.0
# A derived name shorter than this is not descriptive (e.g. "m_"); fall back to the anchor's.
MIN_DERIVED_NAME = 3


def float_reason(v) -> str | None:
    if not is_floating(v.dtype):
        return f"'{v.name}' is {v.dtype.name}, not a float tensor"
    return None


def const_reason(value, want: float, what: str) -> str | None:
    """Why constant ``value`` is not the scalar ``want`` (None when it is)."""
    if value is None:
        return f"{what} is absent"
    got = scalar(value)
    if got is None:
        return f"{what} '{value.name}' is not a constant scalar"
    if not close(got, want, CONST_TOLERANCE):
        return f"{what} '{value.name}' is {got:g}, not {want:g}"
    return None


def broadcast_reason(m) -> str | None:
    """The match's result must have ``x``'s shape: one op of ``x`` cannot broadcast it."""
    if m.nodes[-1].outputs[0].shape != m["x"].shape:
        return "the constants broadcast the output beyond the input shape"
    return None


def escape_reason(m) -> str | None:
    """An intermediate (the output of any matched node but the last) read outside the match."""
    last = m.nodes[-1]
    inside = {id(n) for n in m.nodes}
    escape = outside_readers([v for n in m.nodes if n is not last for v in n.outputs], inside, m.graph)
    return f"intermediate {escape}" if escape else None


def derived_name(names: list[str], fallback: str) -> str:
    """A name for the op replacing ``names``: their common ``_``-separated prefix, else
    ``fallback`` (``gelu_div, gelu_erf, gelu_mul`` -> ``gelu``)."""
    common = []
    for tokens in zip(*[n.split("_") for n in names], strict=False):  # the common prefix
        if len(set(tokens)) != 1:
            break
        common.append(tokens[0])
    name = "_".join(common)
    return name if len(name) >= MIN_DERIVED_NAME else fallback


def replace_x(op_type: str, attrs: dict | None = None):
    """The action ``match -> op_type(x)``, named after the matched nodes."""
    def action(m):
        name = derived_name([n.name for n in m.nodes], f"{m.nodes[0].name}_{op_type.lower()}")
        return Replacement(op_type, [m["x"]], dict(attrs or {}), name=name)
    return action


__all__ = ["CONST_TOLERANCE", "PRIORITY_RECOGNITION", "float_reason", "const_reason", "broadcast_reason",
           "escape_reason", "derived_name", "replace_x"]
