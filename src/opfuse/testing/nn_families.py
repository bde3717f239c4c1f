"""Families of the compute-heavy ops: Conv (and its BatchNorm/activation epilogue),
ConvTranspose, BatchNormalization, pooling, MatMul/Gemm with constant weights, Softmax,
LayerNormalization and the Reduce ops. Weights are scaled to a known L1 gain so magnitude
bounds stay tight (``GraphDraft.linear_weight``)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from opfuse.ir.graph import Value
from opfuse.testing.elementwise_families import EPILOGUE_OPS, apply_unary
from opfuse.testing.family import divisors, fits, max_abs, rank_in, signed_axis, size
from opfuse.testing.graph_draft import MAX_CHANNELS, MAX_ELEMENTS, OPERAND_LIMIT, GraphDraft

# Largest contraction length K of a generated MatMul/Gemm weight (K x N <= MAX_ELEMENTS).
MAX_REDUCTION = 256
BN_EPSILONS = (1e-5, 1e-3)  # the first is the ONNX default (then the attribute may be left out)
# LayerNorm divides by sqrt(var + eps): on a near-constant row it amplifies the float32 rounding
# of its input by up to 1/sqrt(eps). eps >= 1e-3 caps that at ~32, so float32 implementations
# (onnxruntime, generated C) stay within the tests' tolerance of the float64 oracle; with the
# common 1e-5 the cap is ~316 and correct kernels legitimately differ by more.
LN_EPSILONS = (1e-3, 1e-2)


# Convolution -----------------------------------------------------------------------------------

# Input channels a Conv accepts (a Concat of two generated Convs still qualifies).
MAX_CONV_INPUT_CHANNELS = 2 * MAX_CHANNELS
# A generated window has effective size E <= 5 (3 taps, dilation 2) and pads < E per side, so an
# output axis is at most L + E - 1 = L + 4 long.
MAX_WINDOW_GROWTH = 4


def conv_input(v: Value) -> bool:
    """(N, C, L) or (N, C, H, W) small enough that every generated window's output positions fit."""
    s = v.shape
    return len(s) in (3, 4) and s[1] <= MAX_CONV_INPUT_CHANNELS and \
        s[0] * size([d + MAX_WINDOW_GROWTH for d in s[2:]]) <= MAX_ELEMENTS


def _window(d: GraphDraft, spatial, kernel, stride, dilation, *, allow_auto: bool):
    """Pads (or auto_pad) for a window; returns (attrs, output spatial shape)."""
    eff = [(k - 1) * dilation + 1 for k in kernel]
    if allow_auto and d.rarely():
        valid_fits = all(L >= e for L, e in zip(spatial, eff, strict=True))
        modes = ["SAME_UPPER", "SAME_LOWER"] + (["VALID"] if valid_fits else [])
        mode = d.choice(modes)
        if mode == "VALID":
            out = [(L - e) // stride + 1 for L, e in zip(spatial, eff, strict=True)]
        else:
            out = [-(-L // stride) for L in spatial]
        return {"auto_pad": mode}, out
    begin, end = [], []
    for L, e in zip(spatial, eff, strict=True):
        b = d.integer(0, e - 1)
        end_min = max(0, e - L - b)
        begin.append(b)
        end.append(d.integer(end_min, max(end_min, e - 1)))
    out = [(L + b + e2 - e) // stride + 1 for L, b, e2, e in zip(spatial, begin, end, eff, strict=True)]
    attrs = {"pads": begin + end} if any(begin + end) or d.flag() else {}
    return attrs, out


def add_conv(d: GraphDraft, x: Value, *, same_shape: bool = False, pointwise: bool = False,
             channels: int | None = None) -> Value:
    """Conv with a drawn geometry: 1x1 / 2x2 / 3x3 (per-axis sizes sometimes differ), stride 1
    or 2, dilation 2 sometimes, explicit or automatic pads, grouped / depthwise, bias or not.
    ``same_shape`` keeps the output shape (residual blocks). Weights have per-output-channel
    L1 norm ``g`` in [0.5, 1.5], so ``|y| <= g * |x| + |bias|``."""
    n, c, *spatial = x.shape
    r = len(spatial)
    if same_shape or pointwise:
        k = 1 if pointwise else d.choice((1, 3))
        kernel, stride, dilation = [k] * r, 1, 1
        attrs: dict[str, Any] = {"pads": [k // 2] * (2 * r)} if k > 1 else {}
        out = list(spatial)
    else:
        k = d.choice((1, 3, 2))
        kernel = [k] * r if not d.rarely() else [d.choice((1, 2, 3)) for _ in range(r)]
        stride = d.choice((1, 2))
        dilation = 2 if max(kernel) > 1 and d.rarely() else 1
        # onnxruntime rejects dilations with SAME_* auto_pad ("Dilation not supported for
        # AutoPadType::SAME_UPPER"), so dilated convs always get explicit pads.
        attrs, out = _window(d, spatial, kernel, stride, dilation, allow_auto=dilation == 1)
        if stride != 1:
            attrs["strides"] = [stride] * r
        if dilation != 1:
            attrs["dilations"] = [dilation] * r
    positions = n * size(out)

    def max_m(group):
        return min(max(MAX_CHANNELS, group), MAX_ELEMENTS // positions,
                   MAX_ELEMENTS // ((c // group) * size(kernel)))

    if same_shape or channels is not None:
        m = channels if channels is not None else c
        groups = [g for g in ([1, c] if same_shape else [1]) if m % g == 0]
        group = d.choice(list(dict.fromkeys(groups)))
    else:
        groups = [1] + ([c] if c > 1 else []) + [g for g in divisors(c) if 1 < g < c]
        group = d.choice([g for g in groups if max_m(g) >= g])
        m = group * d.integer(1, max(1, max_m(group) // group))
    if group != 1:
        attrs["group"] = group
    if d.rarely() and not same_shape:
        attrs["kernel_shape"] = list(kernel)
    w, gain = d.linear_weight((m, c // group) + tuple(kernel), tuple(range(1, r + 2)))
    inputs = [x, d.const("w", w)]
    bias_max = 0.0
    if d.flag():
        bias = d.uniform((m,), -0.5, 0.5)
        inputs.append(d.const("b", bias))
        bias_max = max_abs(bias)
    return d.op("Conv", *inputs, bound=gain * d.bound(x) + bias_max, **attrs)


def add_bn(d: GraphDraft, x: Value) -> Value:
    """Inference BatchNorm with non-trivial statistics: ``y = (x - mean) s + beta`` with
    ``s = gamma / sqrt(var + eps)``, so ``|y| <= (|x| + |mean|) max|s| + |beta|``."""
    c = x.shape[1]
    gamma, beta = d.signed((c,), 0.5, 1.5), d.uniform((c,), -0.5, 0.5)
    mean, var = d.uniform((c,), -0.5, 0.5), d.uniform((c,), 0.25, 2.0)
    eps = d.choice(BN_EPSILONS)
    s = np.abs(gamma.astype(np.float64)) / np.sqrt(var.astype(np.float64) + eps)
    bound = (d.bound(x) + max_abs(mean)) * float(s.max()) + max_abs(beta)
    attrs = {"epsilon": eps} if eps != BN_EPSILONS[0] or d.flag() else {}
    return d.op("BatchNormalization", x, d.const("gamma", gamma), d.const("beta", beta),
                d.const("mean", mean), d.const("var", var), bound=bound, **attrs)


def epilogue(d: GraphDraft, y: Value, *, bn: bool | None = None, act: bool | None = None) -> Value:
    """Optionally BatchNorm, then optionally an activation (``None``: drawn)."""
    if d.has("BatchNormalization") and d.nodes_left >= 1 and (d.flag() if bn is None else bn):
        y = add_bn(d, y)
    acts = d.available(EPILOGUE_OPS)
    if acts and d.nodes_left >= 1 and (d.flag() if act is None else act):
        y = apply_unary(d, "Relu" if act and "Relu" in acts else d.choice(acts), y)
    return y


def conv(d: GraphDraft) -> None:
    epilogue(d, add_conv(d, d.pick(conv_input, OPERAND_LIMIT)))


def conv_transpose(d: GraphDraft) -> None:
    """ConvTranspose: ``full[i*s + k] += x[i] W[k]``, cropped by pads; out = s(L-1) + op + k - b - e.
    Weights have L1 norm <= g per output channel (over every tap), so ``|y| <= g |x| + |bias|``."""
    x = d.pick(lambda v: conv_input(v) and v.shape[1] <= MAX_CHANNELS, OPERAND_LIMIT)
    n, c, *spatial = x.shape
    r = len(spatial)
    k, stride = d.choice((2, 3, 1)), d.choice((2, 1))
    out_pad = d.integer(0, stride - 1) if stride > 1 and d.rarely() else 0
    begin = [d.integer(0, k - 1) for _ in range(r)]
    end = [d.integer(0, k - 1 - b) for b in begin]
    out = [stride * (L - 1) + out_pad + k - b - e for L, b, e in zip(spatial, begin, end, strict=True)]
    group = c if c > 1 and d.rarely() else 1
    mg_max = max(1, min(MAX_CHANNELS // group, MAX_ELEMENTS // (n * group * size(out))))
    mg = d.integer(1, min(4, mg_max))
    if n * group * mg * size(out) > MAX_ELEMENTS:  # even one channel per group is too big
        begin, end, out_pad, stride, mg = [k - 1] * r, [0] * r, 0, 1, 1
        out = [L for L in spatial]
    attrs: dict[str, Any] = {"pads": begin + end} if any(begin + end) else {}
    if stride > 1:
        attrs["strides"] = [stride] * r
    if out_pad:
        attrs["output_padding"] = [out_pad] * r
    if group > 1:
        attrs["group"] = group
    w, gain = d.linear_weight((c, mg) + (k,) * r, (0,) + tuple(range(2, r + 2)))
    inputs = [x, d.const("w", w)]
    bias_max = 0.0
    if d.flag():
        bias = d.uniform((group * mg,), -0.5, 0.5)
        inputs.append(d.const("b", bias))
        bias_max = max_abs(bias)
    d.op("ConvTranspose", *inputs, bound=gain * d.bound(x) + bias_max, **attrs)


def batch_norm(d: GraphDraft) -> None:
    add_bn(d, d.pick(rank_in(2, 3, 4), OPERAND_LIMIT))


# Pooling -----------------------------------------------------------------------------------------

def pool(d: GraphDraft) -> None:
    """MaxPool (ceil_mode and dilation sometimes), AveragePool (count_include_pad either way),
    GlobalAveragePool. Pads stay below the kernel size, as ONNX requires."""
    op = d.choice(d.available(("MaxPool", "AveragePool", "GlobalAveragePool")))
    x = d.pick(rank_in(3, 4))
    b = d.bound(x)
    if op == "GlobalAveragePool":
        d.op(op, x, bound=b)
        return
    spatial = x.shape[2:]
    kernel = [d.integer(1, min(3, L)) for L in spatial]
    stride = d.choice((1, 2))
    dilation = 2 if op == "MaxPool" and d.rarely() else 1
    eff = [(k - 1) * dilation + 1 for k in kernel]
    begin = [d.integer(0, k - 1) for k in kernel]
    end = [d.integer(0, k - 1) for k in kernel]
    if any(L + p + q < e for L, p, q, e in zip(spatial, begin, end, eff, strict=True)):
        dilation, eff = 1, kernel
    attrs: dict[str, Any] = {"kernel_shape": kernel}
    if stride != 1 or d.flag():
        attrs["strides"] = [stride] * len(spatial)
    if any(begin + end):
        attrs["pads"] = begin + end
    if dilation != 1:
        attrs["dilations"] = [dilation] * len(spatial)
    if d.rarely():
        attrs["ceil_mode"] = 1
    if op == "AveragePool" and any(begin + end) and d.flag():
        attrs["count_include_pad"] = 1
    d.op(op, x, bound=b, **attrs)


# Matrix products ---------------------------------------------------------------------------------

def matmul_const(d: GraphDraft) -> None:
    """``x @ W`` (or ``W @ x``) with a constant weight, then maybe ``+ bias`` (a MatMul epilogue).
    For a batched ``x`` the weight is sometimes batched too, ``(B, K, N)``, broadcasting with x's
    batch axes. ``|x @ W| <= max_n ||W[:, n]||_1 |x|``."""
    x = d.pick(lambda v: v.shape[-1] <= MAX_REDUCTION, OPERAND_LIMIT)
    b = d.bound(x)
    left = len(x.shape) >= 2 and x.shape[-2] <= MAX_REDUCTION and d.rarely()
    k = x.shape[-2] if left else x.shape[-1]
    rows = size(x.shape) // k
    n = d.integer(1, max(1, min(MAX_CHANNELS, MAX_ELEMENTS // max(rows, k))))
    batch = (x.shape[-3],) if len(x.shape) >= 3 and d.rarely() else ()
    if not fits(batch + (k, n)):
        batch = ()
    if left:
        w, gain = d.linear_weight(batch + (n, k), (len(batch) + 1,))
        y = d.op("MatMul", d.const("w", w), x, bound=gain * b)
    else:
        w, gain = d.linear_weight(batch + (k, n), (len(batch),))
        y = d.op("MatMul", x, d.const("w", w), bound=gain * b)
    if d.has("Add") and d.nodes_left >= 1 and not left and d.flag():
        bias = d.uniform((n,), -0.5, 0.5)
        y = d.op("Add", y, d.const("bias", bias), bound=d.bound(y) + max_abs(bias))
    epilogue(d, y, bn=False)


def gemm(d: GraphDraft) -> None:
    """``Y = alpha A' B' + beta C`` with A' = x or x^T, a constant B (maybe transposed) and an
    optional C of shape (), (N,), (1, N), (M, 1) or (M, N)."""
    x = d.pick(lambda v: len(v.shape) == 2 and max(v.shape) <= MAX_REDUCTION, OPERAND_LIMIT)
    trans_a = int(d.rarely())
    m, k = x.shape[::-1] if trans_a else x.shape
    n = d.integer(1, max(1, min(MAX_CHANNELS, MAX_ELEMENTS // max(m, k))))
    trans_b = int(d.flag())
    w, gain = d.linear_weight((k, n), (0,))
    attrs = {}
    if trans_a:
        attrs["transA"] = 1
    if trans_b:
        w, attrs["transB"] = np.ascontiguousarray(w.T), 1
    alpha = d.choice((1.0, 0.5, 2.0))
    if alpha != 1.0:
        attrs["alpha"] = alpha
    inputs = [x, d.const("w", w)]
    bound = alpha * gain * d.bound(x)
    if d.flag():
        c = d.uniform(d.choice([(n,), (1, n), (m, n), (m, 1), ()]), -0.5, 0.5)
        beta = d.choice((1.0, 0.5))
        if beta != 1.0:
            attrs["beta"] = beta
        inputs.append(d.const("c", c))
        bound += beta * max_abs(c)
    y = d.op("Gemm", *inputs, bound=bound, **attrs)
    epilogue(d, y, bn=False)


# Normalisations and reductions --------------------------------------------------------------------

def softmax(d: GraphDraft) -> None:
    x = d.pick(limit=OPERAND_LIMIT)
    r = len(x.shape)
    attrs = {"axis": d.integer(-r, r - 1)} if d.integer(0, 4) else {}
    d.op("Softmax", x, bound=1.0, **attrs)


def layer_norm(d: GraphDraft) -> None:
    """LayerNormalization over axes [axis, rank): ``|x_i - mean| / std <= sqrt(n - 1)``, so
    ``|y| <= sqrt(n) max|scale| + max|B|``."""
    x = d.pick(limit=OPERAND_LIMIT)
    r = len(x.shape)
    axis = d.integer(-r, r - 1)
    normalized = x.shape[axis:]
    scale = d.signed(normalized, 0.5, 1.5)
    inputs = [x, d.const("scale", scale)]
    bias_max = 0.0
    if d.flag():
        bias = d.uniform(normalized, -0.5, 0.5)
        inputs.append(d.const("bias", bias))
        bias_max = max_abs(bias)
    attrs = {}
    if axis != -1 or d.flag():
        attrs["axis"] = axis
    attrs["epsilon"] = d.choice(LN_EPSILONS)
    bound = math.sqrt(size(normalized)) * max_abs(scale) + bias_max
    d.op("LayerNormalization", *inputs, bound=bound, **attrs)


def reduce_axes(d: GraphDraft, x: Value) -> tuple[dict, int]:
    """A Reduce* node's attributes (a drawn axis set, all axes when absent; keepdims either
    way; a rank >= 1 result) and how many elements each output reduces."""
    r = len(x.shape)
    keepdims = d.choice((None, 0, 1))
    attrs: dict = {} if keepdims is None else {"keepdims": keepdims}
    if keepdims == 0 or d.integer(0, 4):
        axes = d.subset(range(r), min_size=1)
        if keepdims == 0 and len(axes) == r:  # keep a rank >= 1 result
            if r == 1:
                attrs["keepdims"] = 1
            else:
                axes = axes[:-1]
        attrs["axes"] = [signed_axis(d, a, r) for a in axes]
        return attrs, size(x.shape[a] for a in axes)
    return attrs, size(x.shape)


def reduce(d: GraphDraft) -> None:
    """ReduceMean / ReduceSum / ReduceMax over a drawn axis set (``reduce_axes``); ``|sum| <= n |x|``."""
    op = d.choice(d.available(("ReduceMean", "ReduceSum", "ReduceMax")))
    x = d.pick(limit=OPERAND_LIMIT)
    attrs, reduced = reduce_axes(d, x)
    bound = d.bound(x) * (reduced if op == "ReduceSum" else 1)
    d.op(op, x, bound=bound, **attrs)
