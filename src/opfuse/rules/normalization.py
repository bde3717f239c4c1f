"""Recognise a decomposed LayerNorm and rewrite it into one ``LayerNormalization`` op.

Exporters emit LayerNorm over the trailing axes ``A = [k, rank)`` as

    u = ReduceMean(x, A);  d = x - u;  v = ReduceMean(d ** 2, A)   (or d * d)
    y = d / Sqrt(v + eps) * gamma + beta                           (the affine part is optional)

which is ``LayerNormalization(x, gamma, beta, axis=k, epsilon=eps)``:
``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` over ``A`` (gamma = 1 when absent). It
holds when both means reduce the same trailing axes with keepdims, the exponent is 2, eps is a
non-negative constant scalar and gamma/beta only vary along the normalised axes (their
broadcast never adds leading dimensions). Seeing it as one op lets fusion treat it as one
reduction with a prologue and an epilogue instead of nine kernels.

A refusal of the statistics (axes, keepdims, exponent, eps, dtype) names the nodes at fault, so
the smaller matches holding them are not offered again; a refused gamma or beta only refuses the
match that includes it, so the normalisation without the affine part is still recognised.
An intermediate (``u``, ``d``, the variance, ...) read outside the match is refused too.
"""
from __future__ import annotations

import numpy as np

from opfuse.ops.reduce import reduce_axes
from opfuse.ops.registry import get_spec
from opfuse.patterns import Const, Op, Var
from opfuse.rules.recognition import broadcast_reason, derived_name, escape_reason, float_reason
from opfuse.rules.rule import Replacement, Rule, close, refuse, scalar

SQUARE_EXPONENT = 2.0
EXPONENT_TOLERANCE = 1e-6
PRIORITY_LAYERNORM = 2.0  # before the GELU/SiLU rules when a chain could be claimed by both


def layernorm_pattern():
    x = Var("x")
    mean = Op("ReduceMean")(x).named("mean").keep()
    d = Op("Sub")(x, mean).named("centered").keep()
    square = Op("Pow")(d, Const(name="exponent")).named("square").keep() | \
        Op("Mul")(d, d).named("square").keep()
    var = Op("ReduceMean")(square).named("variance").keep()
    std = Op("Sqrt")(Op("Add")(var, Const(name="eps")).named("add_eps").keep()).named("std").keep()
    normalized = Op("Div")(d, std).named("normalized")
    scaled = Op("Mul")(normalized.keep(), Const(name="gamma")).named("scale")
    shifted = Op("Add")(scaled.keep(), Const(name="beta")).named("shift")
    return shifted | scaled | normalized


def _axes(node) -> tuple[tuple[int, ...] | None, dict]:
    a = get_spec("ReduceMean").attrs_of(node)
    return reduce_axes(node, a), a


def layernorm_axis(m):
    """The first normalised axis, or a ``Refusal`` naming the ReduceMeans at fault."""
    rank = len(m["x"].shape)
    (a1, attrs1), (a2, attrs2) = _axes(m["mean"]), _axes(m["variance"])
    if a1 is None or a1 != a2:
        return refuse(f"the two ReduceMeans reduce different axes ({_fmt(a1)} and {_fmt(a2)})",
                      m["mean"], m["variance"])
    if list(a1) != list(range(a1[0], rank)):
        return refuse(f"ReduceMean axes {list(a1)} are not the trailing axes of a rank-{rank} tensor", m["mean"])
    for r, attrs in ((m["mean"], attrs1), (m["variance"], attrs2)):
        if not int(attrs["keepdims"]):
            return refuse(f"ReduceMean '{r.name}' drops the reduced axes (keepdims=0)", r)
    return a1[0]


def _fmt(axes) -> str:
    return "none" if axes is None else str(list(axes))


def _param_reason(v, rank: int, axis: int, what: str) -> str | None:
    shape = v.shape
    if len(shape) > rank:
        return f"{what} '{v.name}' has rank {len(shape)} > {rank}"
    lead = (1,) * (rank - len(shape)) + tuple(shape)
    if any(d != 1 for d in lead[:axis]):
        return f"{what} '{v.name}' {tuple(shape)} varies outside the normalised axes"
    return None


def layernorm_ok(m):
    x = m["x"]
    reason = float_reason(x)
    if reason:
        return refuse(reason, m["mean"])
    axis = layernorm_axis(m)
    if not isinstance(axis, int):
        return axis
    exp = m.get("exponent")
    if exp is not None and not close(scalar(exp), SQUARE_EXPONENT, EXPONENT_TOLERANCE):
        return refuse(f"Pow exponent '{exp.name}' is not 2", m["square"])
    eps = scalar(m["eps"])
    if eps is None or eps < 0:
        return refuse(f"epsilon '{m['eps'].name}' is not a non-negative constant scalar", m["add_eps"])
    rank = len(x.shape)
    for key, what, node in (("gamma", "scale", "scale"), ("beta", "bias", "shift")):
        if m.get(key) is not None:
            reason = _param_reason(m[key], rank, axis, what)
            if reason:
                return refuse(reason, m[node])
    return broadcast_reason(m) or escape_reason(m)


def _as_normalized(v, normalized: tuple[int, ...], dtype):
    """The parameter with exactly the normalised shape (what LayerNormalization reads): ``v``
    itself when it already fits, else a constant array broadcast to that shape."""
    if tuple(v.shape) == normalized and v.dtype == dtype:
        return v
    rank = len(normalized)
    data = np.asarray(v.const)
    if data.ndim > rank:  # leading dims are all 1 (checked by the condition)
        data = data.reshape(data.shape[data.ndim - rank:])
    return np.ascontiguousarray(np.broadcast_to(data, normalized).astype(dtype))


def layernorm_rewrite(m):
    x = m["x"]
    axis = layernorm_axis(m)
    normalized = tuple(x.shape[axis:])
    if m.get("gamma") is not None:
        gamma = _as_normalized(m["gamma"], normalized, x.dtype)
    else:
        gamma = np.ones(normalized, dtype=x.dtype)
    inputs = [x, gamma]
    if m.get("beta") is not None:
        inputs.append(_as_normalized(m["beta"], normalized, x.dtype))
    name = derived_name([n.name for n in m.nodes], f"{m['mean'].name}_layernorm")
    return Replacement("LayerNormalization", inputs, {"axis": axis, "epsilon": float(scalar(m["eps"]))}, name=name)


LAYERNORM = Rule("recognize_layernorm", layernorm_pattern(), condition=layernorm_ok, action=layernorm_rewrite,
                 priority=PRIORITY_LAYERNORM, kind="normalization",
                 description="ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] -> LayerNormalization")

__all__ = ["LAYERNORM", "layernorm_pattern", "layernorm_ok", "layernorm_rewrite"]
