"""Families for the ops added after the first generator: more activations and trigonometry,
rounding, comparisons and logic (bool values), more reductions, arg-reductions and TopK (int64
indices), CumSum, data movement (Tile, Trilu, DepthToSpace, SpaceToDepth, GatherElements,
GatherND, ScatterElements, ScatterND, ReverseSequence, OneHot), the recurrent LSTM, GRU, RNN, and
spatial sampling (GridSample over a constant grid or one AffineGrid makes).

Ops whose result jumps where the operand crosses a point (Floor, Ceil, Round, Sign, Mod,
ThresholdedRelu, comparisons, ArgMax/ArgMin, TopK, Hardmax) read graph inputs only (``exact``):
a computed operand may differ from the reference's by a rounding, which a jump turns into a
difference far outside any tolerance without either side being wrong. Bool and int64 results
stay out of the pool (``GraphDraft.op``); they are outputs, or feed Not/And/Or/Xor, Where and
OneHot here.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from opfuse.ir.graph import Value
from opfuse.testing.elementwise_families import _partners
from opfuse.testing.family import broadcast, const_shapes, fits, max_abs, rank_in, signed_axis, size
from opfuse.testing.graph_draft import EXP_LIMIT, MAX_ELEMENTS, MAX_RANK, OPERAND_LIMIT, SAFE_EPS, GraphDraft
from opfuse.testing.nn_families import reduce_axes


def exact(v: Value) -> bool:
    """A graph input: the C code reads the very value the reference does."""
    return v.producer is None and not v.is_const


# Activations and trigonometry ------------------------------------------------------------------

SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875
SMOOTH_OPS = ("Elu", "Celu", "Selu", "Softsign", "Mish", "Sin", "Cos", "Atan", "Asinh", "Sinh", "Cosh", "Tan",
              "LogSoftmax")
# Tan's operand stays within 1 (tan(1) ~ 1.56, far from the pole at pi/2).
TAN_LIMIT = 1.0


def _smooth_limit(op: str) -> float:
    return {"Sinh": EXP_LIMIT, "Cosh": EXP_LIMIT, "Tan": TAN_LIMIT}.get(op, OPERAND_LIMIT)


def smooth_choices(d: GraphDraft) -> list[str]:
    return [op for op in d.available(SMOOTH_OPS) if d.candidates(limit=_smooth_limit(op))]


def smooth_unary(d: GraphDraft) -> None:
    """Continuous activations and trigonometric functions, each within its domain."""
    op = d.choice(smooth_choices(d))
    limit = _smooth_limit(op)
    x = d.pick(limit=limit)
    b = d.bound(x)
    if op in ("Elu", "Celu"):
        alpha = d.choice((1.0, 0.5, 2.0))
        d.op(op, x, bound=max(b, alpha), alpha=alpha)
    elif op == "Selu":
        d.op(op, x, bound=SELU_GAMMA * max(b, SELU_ALPHA))
    elif op == "LogSoftmax":
        r = len(x.shape)
        axis = d.integer(-r, r - 1)
        d.op(op, x, bound=2 * b + math.log(x.shape[axis]), axis=axis)
    else:
        bounds = {"Softsign": 1.0, "Mish": b, "Sin": 1.0, "Cos": 1.0, "Atan": math.pi / 2, "Asinh": b,
                  "Sinh": math.sinh(b), "Cosh": math.cosh(b), "Tan": math.tan(b)}
        d.op(op, x, bound=bounds[op])


def inverse_trig(d: GraphDraft) -> None:
    """Asin / Acos / Atanh of ``x / 2`` (``|x| <= 1``), Acosh of ``|x| + 1``: inside their domains."""
    op = d.choice(inverse_trig_choices(d))
    if op == "Acosh":
        x = d.pick()
        b = d.bound(x)
        y = d.op("Add", d.op("Abs", x, bound=b), d.scalar("one", 1.0), bound=b + 1.0)
        d.op(op, y, bound=math.acosh(b + 1.0))
        return
    x = d.pick(limit=1.0)
    y = d.op("Mul", x, d.scalar("half", 0.5), bound=0.5 * d.bound(x))
    d.op(op, y, bound={"Asin": math.asin(0.5), "Acos": math.pi, "Atanh": math.atanh(0.5)}[op])


def inverse_trig_choices(d: GraphDraft) -> list[str]:
    return [op for op in d.available(("Asin", "Acos", "Atanh", "Acosh"))
            if (op == "Acosh" and d.has("Abs", "Add")) or (op != "Acosh" and d.has("Mul") and d.candidates(limit=1.0))]


JUMP_OPS = ("Floor", "Ceil", "Round", "Sign", "ThresholdedRelu", "Mod", "Hardmax")


def jumps(d: GraphDraft) -> None:
    """Ops with jumps, on a graph input (``exact``): rounding, Sign, ThresholdedRelu, fmod by a
    constant of magnitude >= 0.5, Hardmax."""
    op = d.choice(d.available(JUMP_OPS))
    x = d.pick(exact)
    b = d.bound(x)
    if op == "ThresholdedRelu":
        d.op(op, x, bound=b, alpha=d.choice((1.0, 0.5, 0.0)))
    elif op == "Mod":
        c = d.signed(d.choice(const_shapes(x.shape)), 0.5, 2.0)
        d.op(op, x, d.const("modulus", c), bound=min(b, max_abs(c)), fmod=1)
    elif op == "Hardmax":
        r = len(x.shape)
        d.op(op, x, bound=1.0, **({"axis": d.integer(-r, r - 1)} if d.flag() else {}))
    else:
        d.op(op, x, bound=1.0 if op == "Sign" else b + 1.0)


# Arithmetic ------------------------------------------------------------------------------------

def prelu(d: GraphDraft) -> None:
    """PRelu with a slope that broadcasts into x (scalar, per channel, ...)."""
    x = d.pick(limit=OPERAND_LIMIT)
    slope = d.uniform(d.choice(const_shapes(x.shape)), -0.5, 1.5)
    d.op("PRelu", x, d.const("slope", slope), bound=d.bound(x) * max(1.0, max_abs(slope)))


def sum_mean(d: GraphDraft) -> None:
    """Sum / Mean of two or three values that broadcast together."""
    op = d.choice(d.available(("Sum", "Mean")))
    x = d.pick(limit=OPERAND_LIMIT)
    args = [x]
    for _ in range(d.integer(1, 2)):
        shape = broadcast(x.shape, x.shape)
        for a in args:
            shape = broadcast(shape, a.shape)
        ok = [v for v in _partners(d, x, OPERAND_LIMIT)
              if (s := broadcast(shape, v.shape)) is not None and fits(s) and len(s) <= MAX_RANK]
        args.append(d.pick_from(ok, OPERAND_LIMIT))
    bounds = [d.bound(a) for a in args]
    d.op(op, *args, bound=sum(bounds) if op == "Sum" else max(bounds))


# Comparisons and logic ---------------------------------------------------------------------------

COMPARE_OPS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal")
LOGIC_OPS = ("And", "Or", "Xor")


def _compare(d: GraphDraft, x: Value) -> Value:
    """``x (cmp) y`` with y a constant that broadcasts into x, x itself, or another graph input."""
    op = d.choice(d.available(COMPARE_OPS))
    kind = d.choice(("const", "self", "input"))
    others = [v for v in d.graph.inputs if v is not x and broadcast(v.shape, x.shape) == tuple(x.shape)]
    if kind == "self":
        y = x
    elif kind == "input" and others:
        y = d.choice(others)
    else:
        c = d.uniform(d.choice(const_shapes(x.shape)), -1.0, 1.0)
        if op == "Equal":  # some elements equal to what the input can hold
            c = np.round(c)
        y = d.const("threshold", c)
    args = (x, y) if d.flag() else (y, x)
    return d.op(op, *args, bound=1.0)


def compare_logic(d: GraphDraft) -> None:
    """A comparison of a graph input (maybe negated, maybe combined with a second comparison by
    And/Or/Xor), then, when Where is allowed, a selection between two values by it. IsNaN and
    IsInf of any value (a NaN or infinity must be one in C exactly where in the reference)."""
    if d.choice(compare_logic_choices(d)) == "isnan":
        x = d.pick()
        mask = d.op(d.choice(d.available(("IsNaN", "IsInf"))), x, bound=1.0)
    else:
        x = d.pick(exact)
        mask = _compare(d, x)
        if d.available(LOGIC_OPS) and d.nodes_left >= 3 and d.flag():
            mask = d.op(d.choice(d.available(LOGIC_OPS)), mask, _compare(d, x), bound=1.0)
    if d.has("Not") and d.nodes_left >= 1 and d.flag():
        mask = d.op("Not", mask, bound=1.0)
    if d.has("Where") and d.nodes_left >= 1 and d.flag():
        a = x if x.dtype == np.float32 else d.pick()
        other = d.uniform(d.choice(const_shapes(x.shape)), -1.0, 1.0)
        args = (a, d.const("other", other)) if d.flag() else (d.const("other", other), a)
        d.op("Where", mask, *args, bound=max(d.bound(a), max_abs(other)))


def compare_logic_choices(d: GraphDraft) -> list[str]:
    return ((["compare"] if d.available(COMPARE_OPS) and d.candidates(exact) else [])
            + (["isnan"] if d.available(("IsNaN", "IsInf")) else []))


# Reductions ------------------------------------------------------------------------------------------

REDUCE_OPS = ("ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSumExp",
              "ReduceLogSum", "GlobalMaxPool")


def _reduce_limit(op: str) -> float:
    return {"ReduceProd": 1.0, "ReduceLogSumExp": EXP_LIMIT}.get(op, OPERAND_LIMIT)


def reduce_choices(d: GraphDraft) -> list[str]:
    return [op for op in d.available(REDUCE_OPS)
            if (op != "ReduceLogSum" or (d.has("Abs", "Add") and d.nodes_left >= 3))
            and (op == "GlobalMaxPool" or d.candidates(limit=_reduce_limit(op)))
            and (op != "GlobalMaxPool" or d.candidates(rank_in(3, 4)))]


def reduce_more(d: GraphDraft) -> None:
    """The other reductions; ReduceProd of values within 1, ReduceLogSumExp within ``EXP_LIMIT``,
    ReduceLogSum of ``|x| + SAFE_EPS``."""
    op = d.choice(reduce_choices(d))
    if op == "GlobalMaxPool":
        x = d.pick(rank_in(3, 4))
        d.op(op, x, bound=d.bound(x))
        return
    x = d.pick(limit=_reduce_limit(op))
    b = d.bound(x)
    if op == "ReduceLogSum":
        x = d.op("Add", d.op("Abs", x, bound=b), d.scalar("eps", SAFE_EPS), bound=b + SAFE_EPS)
    attrs, n = reduce_axes(d, x)
    bounds = {"ReduceMin": b, "ReduceProd": 1.0, "ReduceL1": n * b, "ReduceL2": math.sqrt(n) * b,
              "ReduceSumSquare": n * b * b, "ReduceLogSumExp": b + math.log(n),
              "ReduceLogSum": max(-math.log(SAFE_EPS), math.log(n * (b + SAFE_EPS)))}
    d.op(op, x, bound=bounds[op], **attrs)


def arg_topk(d: GraphDraft) -> None:
    """ArgMax / ArgMin (keepdims, select_last_index either way), maybe one-hot encoded, or TopK
    (k, largest, sorted), of a graph input."""
    op = d.choice(d.available(("ArgMax", "ArgMin", "TopK")))
    x = d.pick(exact)
    r = len(x.shape)
    axis = d.integer(0, r - 1)
    dim = x.shape[axis]
    if op == "TopK":
        k = d.integer(1, dim)
        attrs = {"axis": signed_axis(d, axis, r), "largest": d.choice((1, 0)), "sorted": 1}
        d.op("TopK", x, d.ints("k", [k]), bound=(d.bound(x), dim), num_outputs=2, **attrs)
        return
    keepdims = d.choice((1, 0))
    idx = d.op(op, x, bound=dim, axis=signed_axis(d, axis, r), keepdims=keepdims,
               select_last_index=d.choice((0, 1)))
    depth = dim + d.integer(0, 2)
    if d.has("OneHot") and d.nodes_left >= 1 and 1 <= len(idx.shape) < MAX_RANK \
            and size(idx.shape) * depth <= MAX_ELEMENTS and d.flag():  # ONNX wants indices of rank >= 1
        values = d.uniform((2,), -1.0, 1.0)
        d.op("OneHot", idx, d.const("depth", np.array(depth, np.int64)), d.const("values", values),
             bound=max_abs(values), axis=-1)


# Cumulative sums ---------------------------------------------------------------------------------------

def cumulative(d: GraphDraft) -> None:
    """CumSum (``|y| <= n |x|``), exclusive and reverse either way. (CumProd is an ONNX op from
    opset 26, past what opfuse exports: the fuzzer, which goes through ONNX, cannot use it.)"""
    x = d.pick(limit=OPERAND_LIMIT)
    r = len(x.shape)
    axis = d.integer(0, r - 1)
    d.op("CumSum", x, d.const("axis", np.array(signed_axis(d, axis, r), np.int64)),
         bound=d.bound(x) * x.shape[axis], exclusive=d.choice((0, 1)), reverse=d.choice((0, 1)))


# Data movement ---------------------------------------------------------------------------------------

def tile(d: GraphDraft) -> None:
    x = d.pick()
    reps = [1] * len(x.shape)
    for i in d.subset(range(len(x.shape))):
        reps[i] = d.integer(2, 3)
    while not fits([s * k for s, k in zip(x.shape, reps, strict=True)]):
        reps[reps.index(max(reps))] = 1
    d.op("Tile", x, d.ints("repeats", reps), bound=d.bound(x))


def _d2s_blocks(v: Value) -> list[int]:
    return [bs for bs in (2, 3) if len(v.shape) == 4 and v.shape[1] % (bs * bs) == 0]


def _s2d_blocks(v: Value) -> list[int]:
    return [bs for bs in (2, 3) if len(v.shape) == 4 and v.shape[2] % bs == 0 and v.shape[3] % bs == 0]


def _has_blocks(blocks: Callable[[Value], list[int]]) -> Callable[[Value], bool]:
    return lambda v: bool(blocks(v))


_DEPTH_SPACE_BLOCKS = {"DepthToSpace": _d2s_blocks, "SpaceToDepth": _s2d_blocks}


def depth_space_choices(d: GraphDraft) -> list[str]:
    """The allowed ones of DepthToSpace and SpaceToDepth that some value of the draft has a block for (with
    only DepthToSpace allowed, a value whose sides SpaceToDepth could divide is no candidate)."""
    return [op for op in d.available(_DEPTH_SPACE_BLOCKS) if d.candidates(_has_blocks(_DEPTH_SPACE_BLOCKS[op]))]


def depth_space(d: GraphDraft) -> None:
    """DepthToSpace (DCR or CRD) or SpaceToDepth, where the shape allows a block of 2 or 3."""
    op = d.choice(depth_space_choices(d))
    blocks = _DEPTH_SPACE_BLOCKS[op]
    x = d.pick(lambda v: bool(blocks(v)))
    attrs = {"blocksize": d.choice(blocks(x))}
    if op == "DepthToSpace":
        attrs["mode"] = d.choice(("DCR", "CRD"))
    d.op(op, x, bound=d.bound(x), **attrs)


def depth_space_ready(v: Value) -> bool:
    return bool(_d2s_blocks(v) or _s2d_blocks(v))


def trilu(d: GraphDraft) -> None:
    x = d.pick(lambda v: len(v.shape) >= 2)
    args = [x] + ([d.const("k", np.array(d.integer(-3, 3), np.int64))] if d.flag() else [])
    d.op("Trilu", *args, bound=d.bound(x), upper=d.choice((1, 0)))


def _indices(d: GraphDraft, shape, dim: int) -> np.ndarray:
    """Indices in ``[-dim, dim)``, some negative."""
    i = d.rng.integers(0, dim, size=shape)
    return np.where(d.rng.random(size=shape) < 0.3, i - dim, i).astype(np.int64)


def gather_more(d: GraphDraft) -> None:
    """GatherElements along an axis (indices of the input's rank) or GatherND (index tuples)."""
    op = d.choice(d.available(("GatherElements", "GatherND")))
    x = d.pick()
    r = len(x.shape)
    if op == "GatherElements":
        axis = d.integer(0, r - 1)
        shape = [d.integer(1, s) if i != axis else d.integer(1, 4) for i, s in enumerate(x.shape)]
        while not fits(shape):
            shape[shape.index(max(shape))] //= 2
        idx = _indices(d, shape, x.shape[axis])
        d.op(op, x, d.const("indices", idx), bound=d.bound(x), axis=signed_axis(d, axis, r))
        return
    q = d.integer(1, r)
    m = d.integer(1, 4)
    while m > 1 and m * size(x.shape[q:]) > MAX_ELEMENTS:
        m -= 1
    idx = np.stack([_indices(d, (m,), s) for s in x.shape[:q]], axis=-1)
    d.op(op, x, d.const("indices", idx), bound=d.bound(x))


def scatter(d: GraphDraft) -> None:
    """ScatterElements (indices distinct along the axis, so no two updates meet) or ScatterND
    (distinct index tuples), with constant updates."""
    op = d.choice(d.available(("ScatterElements", "ScatterND")))
    x = d.pick()
    r = len(x.shape)
    if op == "ScatterElements":
        axis = d.integer(0, r - 1)
        dim = x.shape[axis]
        m = d.integer(1, dim)
        shape = list(x.shape)
        shape[axis] = m
        fibers = np.moveaxis(np.zeros(shape, np.int64), axis, -1)
        flat = fibers.reshape(-1, m)
        for row in flat:
            row[:] = d.rng.permutation(dim)[:m]
        flat = np.where(d.rng.random(flat.shape) < 0.3, flat - dim, flat)
        idx = np.moveaxis(flat.reshape(fibers.shape), -1, axis)
        upd = d.uniform(shape, -1.0, 1.0)
        d.op(op, x, d.const("indices", idx), d.const("updates", upd), bound=max(d.bound(x), 1.0),
             axis=signed_axis(d, axis, r))
        return
    q = d.integer(1, r)
    cells = size(x.shape[:q])
    m = d.integer(1, min(4, cells))
    flat = d.rng.permutation(cells)[:m]
    idx = np.stack(np.unravel_index(flat, x.shape[:q]), axis=-1).astype(np.int64)
    upd = d.uniform((m, *x.shape[q:]), -1.0, 1.0)
    d.op(op, x, d.const("indices", idx), d.const("updates", upd), bound=max(d.bound(x), 1.0))


def reverse_sequence(d: GraphDraft) -> None:
    x = d.pick(lambda v: len(v.shape) >= 2)
    batch_axis = d.choice((0, 1))
    time_axis = 1 - batch_axis
    lens = d.rng.integers(1, x.shape[time_axis] + 1, size=x.shape[batch_axis]).astype(np.int64)
    d.op("ReverseSequence", x, d.const("lens", lens), bound=d.bound(x), batch_axis=batch_axis, time_axis=time_axis)


# Recurrent layers ------------------------------------------------------------------------------------

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
RECURRENT_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
RECURRENT_MAX_HIDDEN = 6


def recurrent(d: GraphDraft) -> None:
    """LSTM, GRU or RNN over a rank-3 operand (time-major: onnxruntime, the fuzzer's yardstick,
    refuses ``layout=1``), constant weights of magnitude <= 0.5 / max(I, H), either direction or
    both, sometimes constant sequence_lens. The default
    activations bound Y and Y_h by 1 (sigmoid and tanh gates, no initial state); an LSTM's
    cell state grows by at most 1 a step: ``|Y_c| <= T``."""
    op = d.choice(d.available(RECURRENT_OPS))
    x = d.pick(rank_in(3), limit=OPERAND_LIMIT)
    T, B, I_ = x.shape
    direction = d.choice(("forward", "reverse", "bidirectional"))
    D = 2 if direction == "bidirectional" else 1
    H = d.integer(1, RECURRENT_MAX_HIDDEN)
    while H > 1 and T * B * D * H > MAX_ELEMENTS:
        H -= 1
    G = RECURRENT_GATES[op]
    scale = 0.5 / max(I_, H)
    args = [x, d.const("W", d.uniform((D, G * H, I_), -scale, scale)),
            d.const("R", d.uniform((D, G * H, H), -scale, scale)),
            d.const("B", d.uniform((D, 2 * G * H), -0.5, 0.5)) if d.flag() else None]
    if d.flag():
        args.append(d.const("lens", d.rng.integers(0, T + 1, size=B).astype(np.int32)))
    while args[-1] is None:  # no trailing empty input (ONNX drops it: an import of the export would differ)
        args.pop()
    attrs: dict = {"direction": direction, "hidden_size": H}
    if op == "GRU":
        attrs["linear_before_reset"] = d.choice((0, 1))
    outputs = 3 if op == "LSTM" else 2
    d.op(op, *args, bound=[1.0, 1.0, float(T)][:outputs], num_outputs=outputs, **attrs)


# Spatial sampling --------------------------------------------------------------------------------

GRID_MODES = ("linear", "nearest", "cubic")
GRID_PADDINGS = ("zeros", "border", "reflection")
# |sum of a 2-D cubic tap window's weights| <= (sum of |Keys weights|)^2 < 1.62 (A = -0.75)
CUBIC_2D_GAIN = 1.7


def grid_sample(d: GraphDraft) -> None:
    """GridSample of a 4-D value at a constant grid reaching past [-1, 1] (the padding modes), or
    at a grid AffineGrid makes from a new graph input theta (then not ``nearest``: one
    rounding of the grid may move a point across a rounding boundary, a jump, not an error)."""
    x = d.pick(rank_in(4))
    n = x.shape[0]
    ho, wo = d.integer(1, 5), d.integer(1, 5)
    while not fits((n, x.shape[1], ho, wo)):
        ho, wo = max(1, ho // 2), max(1, wo // 2)
    align = d.choice((0, 1))
    modes = list(GRID_MODES)
    if "AffineGrid" in d.ops and d.nodes_left >= 2 and d.can_add_input() and d.flag():
        theta = d.new_input((n, 2, 3))  # (a constant theta would be folded at import)
        grid = d.op("AffineGrid", theta, d.ints("size", (n, x.shape[1], ho, wo)), bound=3 * d.bound(theta),
                    align_corners=align)
        modes.remove("nearest")
    else:
        grid = d.const("grid", d.uniform((n, ho, wo, 2), -1.25, 1.25))
    mode = d.choice(modes)
    gain = CUBIC_2D_GAIN if mode == "cubic" else 1.0
    d.op("GridSample", x, grid, bound=gain * d.bound(x), mode=mode, padding_mode=d.choice(GRID_PADDINGS),
         align_corners=align)
