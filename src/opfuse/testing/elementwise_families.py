"""Elementwise families: unary activations, guarded Log/Sqrt/Reciprocal, Pow, broadcast
arithmetic with constants (scalar, per channel, ...) or with other tensors, and Where."""
from __future__ import annotations

import math

import numpy as np

from opfuse.ir.graph import Value
from opfuse.testing.family import broadcast, const_shapes, fits, max_abs
from opfuse.testing.graph_draft import (EXP_LIMIT, MAX_RANK, OPERAND_LIMIT, PRODUCT_LIMIT, SAFE_EPS,
                                        GraphDraft)

LEAKY_ALPHAS = (0.01, 0.1, 0.2)


# Unary activations -----------------------------------------------------------------------------

UNARY_OPS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Gelu",
             "Softplus", "Neg", "Abs", "Erf", "Exp", "Silu")
# Activations that follow a Conv/MatMul in the generated epilogues.
EPILOGUE_OPS = ("Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", "Tanh", "Gelu", "Silu")


def apply_unary(d: GraphDraft, op: str, x: Value) -> Value:
    """``op(x)``; bounds: |relu|, |leaky|, |gelu|, |silu|, |hardswish| <= |x|; sigmoid, tanh,
    erf, hardsigmoid in [-1, 1]; softplus(x) <= |x| + ln 2; exp(x) <= e^b."""
    b = d.bound(x)
    if op == "LeakyRelu":
        return d.op(op, x, bound=b, alpha=d.choice(LEAKY_ALPHAS))
    if op == "HardSigmoid":
        return d.op(op, x, bound=1.0, alpha=d.choice((0.2, 1.0 / 6.0)), beta=d.choice((0.5, 0.6)))
    if op == "Gelu":
        return d.op(op, x, bound=b, approximate=d.choice(("none", "tanh")))
    if op == "Clip":
        return apply_clip(d, x)
    bounds = {"Relu": b, "Sigmoid": 1.0, "Tanh": 1.0, "HardSwish": b, "Softplus": b + math.log(2.0),
              "Neg": b, "Abs": b, "Erf": 1.0, "Exp": math.exp(b), "Silu": b}
    return d.op(op, x, bound=bounds[op])


def apply_clip(d: GraphDraft, x: Value) -> Value:
    """Clip with both bounds (ReLU6 among them), only a lower or only an upper bound."""
    b = d.bound(x)
    kind = d.choice(("both", "relu6", "min", "max"))
    lo = float(d.uniform((), -2.0, 0.0)) if kind in ("both", "min") else 0.0
    hi = float(d.uniform((), 0.5, 6.0)) if kind in ("both", "max") else 6.0
    if kind == "min":
        return d.op("Clip", x, d.scalar("clip_lo", lo), bound=max(b, abs(lo)))
    if kind == "max":
        return d.op("Clip", x, None, d.scalar("clip_hi", hi), bound=max(b, abs(hi)))
    return d.op("Clip", x, d.scalar("clip_lo", lo), d.scalar("clip_hi", hi),
                bound=min(b, max(abs(lo), abs(hi))))


def unary_choices(d: GraphDraft) -> list[str]:
    return [op for op in d.available(UNARY_OPS) if op != "Exp" or d.candidates(limit=EXP_LIMIT)]


def unary(d: GraphDraft) -> None:
    op = d.choice(unary_choices(d))
    apply_unary(d, op, d.pick(limit=EXP_LIMIT if op == "Exp" else OPERAND_LIMIT))


def guarded(d: GraphDraft) -> None:
    """Log / Sqrt / Reciprocal of ``|x| + SAFE_EPS`` (never at their singularity)."""
    op = d.choice(d.available(("Log", "Sqrt", "Reciprocal")))
    x = d.pick()
    b = d.bound(x)
    shifted = d.op("Add", d.op("Abs", x, bound=b), d.scalar("eps", SAFE_EPS), bound=b + SAFE_EPS)
    bounds = {"Log": max(abs(math.log(SAFE_EPS)), math.log(b + SAFE_EPS)),
              "Sqrt": math.sqrt(b + SAFE_EPS), "Reciprocal": 1.0 / SAFE_EPS}
    d.op(op, shifted, bound=bounds[op])


def power(d: GraphDraft) -> None:
    """``x ** 2`` or ``x ** 3`` (integral exponents: defined for negative bases)."""
    x = d.pick(limit=PRODUCT_LIMIT)
    e = d.choice((2.0, 3.0))
    d.op("Pow", x, d.scalar("exponent", e), bound=d.bound(x) ** e)


# Broadcast arithmetic ----------------------------------------------------------------------------

BINARY_OPS = ("Add", "Mul", "Sub", "Div", "Max", "Min")


def binary_const(d: GraphDraft) -> None:
    """``x (op) c`` (or ``c (op) x``) with a constant of a broadcastable shape (per channel ...);
    Div only divides by constants with ``|c| >= 0.5``."""
    op = d.choice(d.available(BINARY_OPS))
    x = d.pick(limit=OPERAND_LIMIT)
    b = d.bound(x)
    shape = d.choice(const_shapes(x.shape))
    if op == "Div":
        c = d.signed(shape, 0.5, 2.0)
        bound = b / float(np.abs(c).min())
    elif op == "Mul":
        c = d.uniform(shape, -2.0, 2.0)
        bound = b * max_abs(c)
    else:
        c = d.uniform(shape, -1.0, 1.0)
        bound = b + max_abs(c) if op in ("Add", "Sub") else max(b, max_abs(c))
    cv = d.const("c", c)
    args = (x, cv) if op == "Div" or d.flag() else (cv, x)
    d.op(op, *args, bound=bound)


def _partners(d: GraphDraft, x: Value, limit: float) -> list[Value]:
    """Pool values that broadcast with ``x`` into a tensor of allowed size (``x`` itself too)."""
    out = []
    for v in d.candidates(limit=limit):
        s = broadcast(x.shape, v.shape)
        if s is not None and fits(s) and len(s) <= MAX_RANK:
            out.append(v)
    return out


def _second_operand(d: GraphDraft, x: Value, limit: float) -> Value:
    """An existing pool value, or a new graph input (a sibling input of x's or a per-channel shape)."""
    sources = ["pool"] + (["input"] if d.can_add_input() else [])
    if d.choice(sources) == "pool":
        return d.pick_from(_partners(d, x, limit), limit)
    return d.new_input(d.choice([tuple(x.shape)] + [s for s in const_shapes(x.shape) if s]))


# Div(x, y) is written Div(x, Add(Abs(y), SAFE_EPS)): three nodes.
GUARDED_DIV_NODES = 3


def binary_values_choices(d: GraphDraft) -> list[str]:
    return [op for op in d.available(BINARY_OPS)
            if op != "Div" or (d.has("Abs", "Add") and d.nodes_left >= GUARDED_DIV_NODES)]


def binary_values(d: GraphDraft) -> None:
    """``x (op) y`` for two computed tensors (possibly the same one, or a new input).
    Div divides by ``|y| + SAFE_EPS``; Max/Min sometimes take a third operand."""
    op = d.choice(binary_values_choices(d))
    if op == "Div":
        d.reserve(GUARDED_DIV_NODES)
    limit = PRODUCT_LIMIT if op == "Mul" else OPERAND_LIMIT
    x = d.pick(limit=limit)
    y = _second_operand(d, x, math.inf if op == "Div" else limit)
    bx, by = d.bound(x), d.bound(y)
    if op == "Div":
        den = d.op("Add", d.op("Abs", y, bound=by), d.scalar("eps", SAFE_EPS), bound=by + SAFE_EPS)
        d.op("Div", x, den, bound=bx / SAFE_EPS)
        return
    args = [x, y] if d.flag() else [y, x]
    if op in ("Max", "Min") and d.rarely():
        z = d.pick_from([v for v in _partners(d, x, limit)
                         if broadcast(broadcast(x.shape, y.shape), v.shape) is not None
                         and fits(broadcast(broadcast(x.shape, y.shape), v.shape))], limit)
        args.append(z)
        by = max(by, d.bound(z))
    bounds = {"Add": bx + by, "Sub": bx + by, "Mul": bx * by, "Max": max(bx, by), "Min": max(bx, by)}
    d.op(op, *args, bound=bounds[op])


def where(d: GraphDraft) -> None:
    """``Where(mask, x, y)`` with a constant boolean mask (data-independent selection)."""
    x = d.pick()
    mask = d.const("mask", d.rng.random(d.choice(const_shapes(x.shape))) < 0.5)
    if d.flag():
        y = d.const("other", d.uniform(d.choice(const_shapes(x.shape)), -1.0, 1.0))
    else:
        y = d.pick_from(_partners(d, x, math.inf))
    bound = max(d.bound(x), max_abs(y.const) if y.const is not None else d.bound(y))
    args = (x, y) if d.flag() else (y, x)
    d.op("Where", mask, *args, bound=bound)
