"""Pattern families: the decomposed forms the rewrites and fusion rules recognise
(``x * Sigmoid(x)``, Erf-GELU, decomposed LayerNorm, Conv -> BN -> Relu, residual Conv -> Add,
Q/K/V sibling MatMuls with attention, squeeze-excite), built with drawn variations (operand
order, association, optional affine parts) so the rules see the forms real exporters write."""
from __future__ import annotations

import math

from opfuse.ir.graph import Value
from opfuse.testing.family import max_abs, signed_axis, size
from opfuse.testing.graph_draft import (MAX_CHANNELS, MAX_ELEMENTS, OPERAND_LIMIT, PRODUCT_LIMIT,
                                        GraphDraft)
from opfuse.testing.nn_families import LN_EPSILONS, MAX_REDUCTION, add_conv, conv_input, epilogue


def silu_pattern(d: GraphDraft) -> None:
    """``x * Sigmoid(x)`` (either operand order)."""
    x = d.pick(limit=OPERAND_LIMIT)
    s = d.op("Sigmoid", x, bound=1.0)
    d.op("Mul", *((x, s) if d.flag() else (s, x)), bound=d.bound(x))


def gelu_pattern(d: GraphDraft) -> None:
    """``0.5 x (1 + erf(x / sqrt 2))`` with ``x / sqrt 2`` as a Div or a Mul and the product in
    any of its three associations."""
    x = d.pick(limit=OPERAND_LIMIT)
    b = d.bound(x)
    if d.has("Div") and d.flag():
        scaled = d.op("Div", x, d.scalar("sqrt2", math.sqrt(2.0)), bound=b)
    else:
        scaled = d.op("Mul", x, d.scalar("rsqrt2", 1.0 / math.sqrt(2.0)), bound=b)
    e = d.op("Erf", scaled, bound=1.0)
    one = d.scalar("one", 1.0)
    a = d.op("Add", *((e, one) if d.flag() else (one, e)), bound=2.0)
    half = d.scalar("half", 0.5)
    assoc = d.choice(("(x*a)*h", "x*(a*h)", "(x*h)*a"))
    if assoc == "(x*a)*h":
        d.op("Mul", d.op("Mul", x, a, bound=2 * b), half, bound=b)
    elif assoc == "x*(a*h)":
        d.op("Mul", x, d.op("Mul", a, half, bound=1.0), bound=b)
    else:
        d.op("Mul", d.op("Mul", x, half, bound=b / 2), a, bound=b)


def layer_norm_pattern(d: GraphDraft) -> None:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over trailing axes, written as PyTorch
    exports it: ReduceMean, Sub, Pow(., 2) or Mul(d, d), ReduceMean, Add, Sqrt, Div, Mul, Add."""
    x = d.pick(limit=OPERAND_LIMIT)
    b = d.bound(x)
    r = len(x.shape)
    k = d.integer(1, r) if d.rarely() else 1
    axes = [signed_axis(d, a, r) for a in range(r - k, r)]
    n = size(x.shape[r - k:])
    mean = d.op("ReduceMean", x, bound=b, axes=axes, keepdims=1)
    diff = d.op("Sub", x, mean, bound=2 * b)
    if d.has("Pow") and d.flag():
        sq = d.op("Pow", diff, d.scalar("two", 2.0), bound=4 * b * b)
    else:
        sq = d.op("Mul", diff, diff, bound=4 * b * b)
    var = d.op("ReduceMean", sq, bound=4 * b * b, axes=axes, keepdims=1)
    eps = d.choice(LN_EPSILONS)
    std = d.op("Sqrt", d.op("Add", var, d.scalar("eps", eps), bound=4 * b * b + eps), bound=2 * b + 1)
    y = d.op("Div", diff, std, bound=math.sqrt(n))
    normalized = x.shape[r - k:]
    if d.nodes_left >= 1 and d.flag():
        gamma = d.signed(normalized, 0.5, 1.5)
        y = d.op("Mul", y, d.const("gamma", gamma), bound=math.sqrt(n) * max_abs(gamma))
        if d.nodes_left >= 1 and d.flag():
            beta = d.uniform(normalized, -0.5, 0.5)
            y = d.op("Add", y, d.const("beta", beta), bound=d.bound(y) + max_abs(beta))


def conv_bn_relu(d: GraphDraft) -> None:
    epilogue(d, add_conv(d, d.pick(conv_input, OPERAND_LIMIT)), bn=True, act=True)


def conv_residual(d: GraphDraft) -> None:
    """``x + Conv(x)`` with a shape-keeping Conv (maybe BN and Relu inside, Relu after)."""
    x = d.pick(lambda v: conv_input(v) and v.shape[1] <= MAX_CHANNELS, OPERAND_LIMIT)
    y = add_conv(d, x, same_shape=True)
    if d.nodes_left >= 3:
        y = epilogue(d, y, act=False)
    s = d.op("Add", *((y, x) if d.flag() else (x, y)), bound=d.bound(x) + d.bound(y))
    if d.has("Relu") and d.nodes_left >= 1 and d.flag():
        d.op("Relu", s, bound=d.bound(s))


def attention_input(v: Value) -> bool:
    """(B, T, D) whose T x T score matrix fits."""
    s = v.shape
    return len(s) == 3 and s[2] <= MAX_REDUCTION and s[0] * s[1] * s[1] <= MAX_ELEMENTS


def attention(d: GraphDraft) -> None:
    """Q/K/V: three sibling MatMuls of one input (horizontal fusion), then, when the budget and
    op set allow, ``Softmax(Q K^T / sqrt(h)) V``. Operands are limited to PRODUCT_LIMIT and the
    projections have gain <= 1, so ``|scores| <= h * 16 / sqrt(h)``."""
    x = d.pick(attention_input, PRODUCT_LIMIT)
    bsz, t, dim = x.shape
    h = d.integer(1, min(8, MAX_ELEMENTS // (bsz * t * max(t, 1))))
    b = d.bound(x)
    qkv = []
    for name in ("wq", "wk", "wv"):
        w, gain = d.linear_weight((dim, h), (0,), gain=(0.5, 1.0))
        qkv.append(d.op("MatMul", x, d.const(name, w), bound=gain * b))
    if not (d.nodes_left >= 4 and d.has("Transpose", "Softmax")):
        return
    q, k, v = qkv
    kt = d.op("Transpose", k, bound=d.bound(k), perm=[0, 2, 1])
    scores = d.op("MatMul", q, kt, bound=h * d.bound(q) * d.bound(k))
    if d.has("Mul") and d.nodes_left >= 3:
        scale = 1.0 / math.sqrt(h)
        scores = d.op("Mul", scores, d.scalar("scale", scale), bound=d.bound(scores) * scale)
    p = d.op("Softmax", scores, bound=1.0, axis=-1)
    d.op("MatMul", p, v, bound=d.bound(v))


def squeeze_excite(d: GraphDraft) -> None:
    """``x * Sigmoid(Conv(Relu(Conv(GlobalAveragePool(x)))))``: a computed per-channel scale."""
    x = d.pick(lambda v: len(v.shape) == 4 and v.shape[1] <= MAX_CHANNELS, OPERAND_LIMIT)
    c = x.shape[1]
    s = d.op("GlobalAveragePool", x, bound=d.bound(x))
    reduced = add_conv(d, s, pointwise=True, channels=max(1, c // 2))
    s = d.op("Relu", reduced, bound=d.bound(reduced))
    s = d.op("Sigmoid", add_conv(d, s, pointwise=True, channels=c), bound=1.0)
    d.op("Mul", x, s, bound=d.bound(x))
