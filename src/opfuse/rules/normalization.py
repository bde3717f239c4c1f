"""Recognise a decomposed LayerNorm and rewrite it into ``LayerNormalization``.

Exporters emit LayerNorm over the trailing axes ``A = [k, rank)`` as

    u = ReduceMean(x, A);  d = x - u;  v = ReduceMean(d ** 2, A)   (or d * d)
    y = d / Sqrt(v + eps) * gamma + beta

which is ``LayerNormalization(x, gamma, beta, axis=k, epsilon=eps)`` when both means reduce the
same trailing axes with keepdims, eps is a scalar constant and gamma/beta only vary along the
normalised axes (their broadcast never adds leading dimensions to the output).
"""
from __future__ import annotations

import numpy as np

from opfuse.patterns import Const, Op, Var
from opfuse.rules.rule import Replacement, Rule, close, scalar

SQUARE_EXPONENT = 2.0
EXPONENT_TOLERANCE = 1e-6
PRIORITY_LAYERNORM = 2.0  # before the GELU/SiLU rules when a chain could be claimed by both


def layernorm_pattern():
    x = Var("x")
    mean = Op("ReduceMean")(x).named("mean")
    d = Op("Sub")(x, mean).named("centered")
    square = Op("Pow")(d, Const(name="exponent")).named("square") | Op("Mul")(d, d).named("square")
    var = Op("ReduceMean")(square).named("variance")
    std = Op("Sqrt")(Op("Add")(var, Const(name="eps")).named("add_eps")).named("std")
    y = Op("Div")(d, std).named("normalized")
    scaled = Op("Mul")(y, Const(name="gamma")).named("scale")
    return Op("Add")(scaled, Const(name="beta")).named("shift")


def _axes(node, rank: int) -> list[int] | None:
    axes = node.attrs.get("axes")
    if axes is None:
        return None if node.attrs.get("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank for a in axes)


def _param_ok(v, rank: int, axis: int, what: str) -> str | None:
    shape = v.shape
    if len(shape) > rank:
        return f"{what} '{v.name}' has rank {len(shape)} > {rank}"
    lead = (1,) * (rank - len(shape)) + tuple(shape)
    if any(d != 1 for d in lead[:axis]):
        return f"{what} '{v.name}' {tuple(shape)} varies outside the normalised axes"
    return None


def layernorm_axis(m) -> tuple[int | None, str | None]:
    x = m["x"]
    rank = len(x.shape)
    a1, a2 = _axes(m["mean"], rank), _axes(m["variance"], rank)
    if a1 is None or a1 != a2:
        return None, f"the two ReduceMeans reduce different axes ({a1} and {a2})"
    if not a1 or a1 != list(range(a1[0], rank)):
        return None, f"ReduceMean axes {a1} are not the trailing axes of a rank-{rank} tensor"
    for r in (m["mean"], m["variance"]):
        if not r.attrs.get("keepdims", 1):
            return None, f"ReduceMean '{r.name}' drops the reduced axes (keepdims=0)"
    return a1[0], None


def layernorm_ok(m) -> str | None:
    x = m["x"]
    if not np.issubdtype(x.dtype, np.floating):
        return f"'{x.name}' is {x.dtype.name}, not a float tensor"
    axis, reason = layernorm_axis(m)
    if reason:
        return reason
    exp = m.get("exponent")
    if exp is not None and not close(scalar(exp), SQUARE_EXPONENT, EXPONENT_TOLERANCE):
        return f"Pow exponent '{exp.name}' is not 2"
    eps = scalar(m["eps"])
    if eps is None or eps < 0:
        return f"epsilon '{m['eps'].name}' is not a non-negative constant scalar"
    rank = len(x.shape)
    return _param_ok(m["gamma"], rank, axis, "scale") or _param_ok(m["beta"], rank, axis, "bias")


def _as_normalized(v, rank: int, axis: int, dtype):
    """The parameter as a constant of exactly the normalised shape (what LayerNormalization reads)."""
    lead = (1,) * (rank - len(v.shape)) + tuple(v.shape)
    if tuple(v.shape) == lead[axis:] and v.dtype == dtype:
        return v
    data = v.const.reshape(lead)[(0,) * axis]
    return np.ascontiguousarray(data.astype(dtype))


def layernorm_rewrite(m):
    axis, _ = layernorm_axis(m)
    x = m["x"]
    rank = len(x.shape)
    gamma = _as_normalized(m["gamma"], rank, axis, x.dtype)
    beta = _as_normalized(m["beta"], rank, axis, x.dtype)
    return Replacement("LayerNormalization", [x, gamma, beta],
                       {"axis": axis, "epsilon": float(scalar(m["eps"]))})


LAYERNORM = Rule("layernorm", layernorm_pattern(), condition=layernorm_ok, action=layernorm_rewrite,
                 priority=PRIORITY_LAYERNORM, kind="normalization",
                 description="ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add -> LayerNormalization")

__all__ = ["LAYERNORM", "layernorm_pattern", "layernorm_ok", "layernorm_rewrite"]
