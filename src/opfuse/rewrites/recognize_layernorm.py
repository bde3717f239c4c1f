"""Recognise a decomposed LayerNorm and replace it by one LayerNormalization op.

PyTorch exports ``LayerNorm`` over the last ``k`` axes as

    u   = ReduceMean(x, axes)            d  = Sub(x, u)
    v   = ReduceMean(Pow(d, 2), axes)    (or Mul(d, d))
    n   = Div(d, Sqrt(Add(v, eps)))
    y   = Add(Mul(n, gamma), beta)       (the affine part is optional)

which is ``LayerNormalization(x, Scale=gamma, B=beta, axis=rank-k, epsilon=eps)``:
``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` over the axes ``[axis, rank)``.
Seeing it as one op lets fusion treat it as one reduction with a prologue and epilogue
instead of nine kernels.

Refusals: the reduced axes are not the trailing axes (LayerNormalization normalises a
suffix), ``keepdims`` is 0, the exponent is not 2, eps is not a constant scalar, gamma/beta do
not fit the normalized shape, or an intermediate (``u``, ``d``, the variance, ...) is also read
outside the pattern.
"""
from __future__ import annotations

import numpy as np

from opfuse.ops.reduce import reduce_axes
from opfuse.ops.registry import get_spec
from opfuse.patterns import Const, Op, Var
from opfuse.rewrites.edit import derived_name, outside_readers, scalar_of
from opfuse.rules.rule import Replacement, Rule

PYTORCH_SQUARE_EXPONENT = 2.0


def affine_const(v, normalized: tuple[int, ...]) -> np.ndarray | None:
    """``v``'s constant laid out as the normalized shape, or None when it does not fit."""
    if v is None or not v.is_const:
        return None
    c = np.asarray(v.const)
    rank = len(normalized)
    if c.ndim > rank:
        if any(d != 1 for d in c.shape[:c.ndim - rank]):
            return None
        c = c.reshape(c.shape[c.ndim - rank:])
    try:
        return np.broadcast_to(c, normalized).copy()
    except ValueError:
        return None


def layernorm_pattern():
    x = Var("x")
    mean = Op("ReduceMean")(x).named("mean").keep()
    d = Op("Sub")(x, mean).named("sub").keep()
    square = Op("Pow")(d, Const(name="exponent")).named("square").keep() | \
        Op("Mul")(d, d).named("square").keep()
    var = Op("ReduceMean")(square).named("var").keep()
    std = Op("Sqrt")(Op("Add")(var, Const(name="eps")).named("add_eps").keep()).named("sqrt").keep()
    div = Op("Div")(d, std).named("div")
    scaled = Op("Mul")(div.keep(), Const(name="gamma")).named("scale")
    shifted = Op("Add")(scaled.keep(), Const(name="beta")).named("shift")
    return shifted | scaled | div


def _axes(m):
    a = get_spec("ReduceMean").attrs_of(m["mean"])
    return reduce_axes(m["mean"], a), a


def _condition(m) -> str | None:
    x = m["x"]
    rank = len(x.shape)
    axes, a_mean = _axes(m)
    a_var = get_spec("ReduceMean").attrs_of(m["var"])
    axes_v = reduce_axes(m["var"], a_var)
    if axes is None or axes != axes_v:
        return f"the two ReduceMeans reduce different axes ({axes} vs {axes_v})"
    if list(axes) != list(range(rank - len(axes), rank)):
        return f"ReduceMean axes {list(axes)} are not the trailing axes of rank {rank}"
    if not int(a_mean["keepdims"]) or not int(a_var["keepdims"]):
        return "ReduceMean keepdims=0: the statistics do not broadcast back"
    if m.get("exponent") is not None and scalar_of(m["exponent"]) != PYTORCH_SQUARE_EXPONENT:
        return f"Pow exponent {scalar_of(m['exponent'])} is not 2"
    if scalar_of(m["eps"]) is None:
        return "epsilon is not a constant scalar"
    if not np.issubdtype(x.dtype, np.floating):
        return f"input dtype {x.dtype} is not floating point"
    normalized = x.shape[rank - len(axes):]
    for key in ("gamma", "beta"):
        if m.get(key) is not None and affine_const(m[key], normalized) is None:
            return f"{key} of shape {m[key].shape} does not fit the normalized shape {normalized}"
    last = m.nodes[-1]
    if last.outputs[0].shape != x.shape:
        return "the affine constants broadcast the output beyond the input shape"
    inside = {id(n) for n in m.nodes}
    escape = outside_readers([n.outputs[0] for n in m.nodes if n is not last], inside, m.graph)
    return f"intermediate {escape}" if escape else None


def _action(m):
    x = m["x"]
    axes, _ = _axes(m)
    axis = len(x.shape) - len(axes)
    normalized = x.shape[axis:]
    gamma = affine_const(m["gamma"], normalized) if m.get("gamma") is not None else np.ones(normalized)
    inputs = [x, gamma.astype(x.dtype)]
    if m.get("beta") is not None:
        inputs.append(affine_const(m["beta"], normalized).astype(x.dtype))
    name = derived_name([n.name for n in m.nodes], f"{m['mean'].name}_layernorm")
    return Replacement("LayerNormalization", inputs, {"axis": axis, "epsilon": scalar_of(m["eps"])}, name=name)


def layernorm_rule() -> Rule:
    return Rule("recognize_layernorm", layernorm_pattern(), condition=_condition, action=_action,
                priority=3.0, kind="rewrite", description="decomposed LayerNorm -> LayerNormalization")
