"""Data-movement families: Reshape, Flatten, Transpose, Squeeze/Unsqueeze, Concat, Split,
Slice, Gather, Expand, Pad and Resize, each with its constant operands (shapes, starts, pads,
scales) drawn valid, including negative axes and indices and out-of-range Slice ends."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st

from opfuse.ir.graph import Value
from opfuse.testing.family import broadcast, divisors, fits, max_abs, rank_in, signed_axis, size
from opfuse.testing.graph_draft import MAX_ELEMENTS, MAX_RANK, GraphDraft


def reshape(d: GraphDraft) -> None:
    """Reshape to a related shape (merge/split/insert axes, flatten), with 0 and -1 in the spec."""
    x = d.pick()
    s = list(x.shape)
    r = len(s)
    kinds = ["all"]
    if r >= 2:
        kinds += ["rows", "merge"]
    if any(len(divisors(v)) > 2 for v in s) and r < MAX_RANK:
        kinds.append("split")
    if r < MAX_RANK:
        kinds.append("insert")
    kind = d.choice(kinds)
    if kind == "all":
        target = [size(s)]
    elif kind == "rows":
        target = [s[0], size(s[1:])]
    elif kind == "merge":
        i = d.integer(0, r - 2)
        target = s[:i] + [s[i] * s[i + 1]] + s[i + 2:]
    elif kind == "split":
        i = d.choice([j for j, v in enumerate(s) if len(divisors(v)) > 2])
        f = d.choice([f for f in divisors(s[i]) if 1 < f < s[i]])
        target = s[:i] + [f, s[i] // f] + s[i + 1:]
    else:
        i = d.integer(0, r)
        target = s[:i] + [1] + s[i:]
    spec = [0 if i < r and t == s[i] and d.rarely() else t for i, t in enumerate(target)]
    free = [i for i, t in enumerate(spec) if t != 0]
    if free and d.flag():
        spec[d.choice(free)] = -1
    d.op("Reshape", x, d.ints("shape", spec), bound=d.bound(x))


def flatten(d: GraphDraft) -> None:
    x = d.pick()
    r = len(x.shape)
    attrs = {"axis": d.integer(-r, r)} if d.integer(0, 4) else {}
    d.op("Flatten", x, bound=d.bound(x), **attrs)


def transpose(d: GraphDraft) -> None:
    x = d.pick(lambda v: len(v.shape) >= 2)
    r = len(x.shape)
    attrs: dict[str, Any] = {} if d.rarely() else {"perm": list(d.draw(st.permutations(range(r))))}
    d.op("Transpose", x, bound=d.bound(x), **attrs)


def _has_unit_dim(v: Value) -> bool:
    return 1 in v.shape and len(v.shape) >= 2


def squeeze_choices(d: GraphDraft) -> list[str]:
    accepts = (("Unsqueeze", lambda v: len(v.shape) < MAX_RANK), ("Squeeze", _has_unit_dim))
    return [op for op, accept in accepts if op in d.ops and d.candidates(accept)]


def squeeze_unsqueeze(d: GraphDraft) -> None:
    op = d.choice(squeeze_choices(d))
    if op == "Unsqueeze":
        x = d.pick(lambda v: len(v.shape) < MAX_RANK)
        r = len(x.shape)
        k = d.integer(1, min(2, MAX_RANK - r))
        axes = d.subset(range(r + k), min_size=k)[:k]
        d.op(op, x, bound=d.bound(x), axes=[signed_axis(d, a, r + k) for a in axes])
        return
    x = d.pick(_has_unit_dim)
    r = len(x.shape)
    ones = [i for i, v in enumerate(x.shape) if v == 1]
    if len(ones) < r and d.rarely():
        d.op(op, x, bound=d.bound(x))  # no axes: squeeze every 1
        return
    axes = d.subset(ones, min_size=1)
    if len(axes) == r:
        axes = axes[:-1]
    d.op(op, x, bound=d.bound(x), axes=[signed_axis(d, a, r) for a in axes])


def concat_input(v: Value) -> bool:
    return 2 * size(v.shape) <= MAX_ELEMENTS


def concat(d: GraphDraft) -> None:
    """Concat of 2-3 tensors equal outside the axis (``x`` with itself, siblings, a constant)."""
    x = d.pick(concat_input)
    r = len(x.shape)
    axis = d.integer(0, r - 1)

    def compatible(v):
        return len(v.shape) == r and all(a == b for i, (a, b) in enumerate(zip(v.shape, x.shape, strict=True))
                                         if i != axis)

    parts = [x]
    count = 3 if d.rarely() else 2
    for _ in range(count - 1):
        grown = size(x.shape) // x.shape[axis] * (sum(p.shape[axis] for p in parts))
        room = [v for v in d.candidates(compatible)
                if grown + size(v.shape) <= MAX_ELEMENTS]
        if d.rarely():
            shape = list(x.shape)
            shape[axis] = d.integer(1, 3)
            if grown + size(shape) <= MAX_ELEMENTS:
                parts.append(d.const("part", d.uniform(shape, -1.0, 1.0)))
                continue
        if room:
            parts.append(d.pick_from(room))
    if len(parts) == 1:  # nothing fits beside x: concatenate along a unit-sized piece of x
        parts.append(x)
    bound = max(max_abs(p.const) if p.const is not None else d.bound(p) for p in parts)
    d.op("Concat", *parts, bound=bound, axis=signed_axis(d, axis, r))


def split(d: GraphDraft) -> None:
    x = d.pick(lambda v: max(v.shape) >= 2)
    r = len(x.shape)
    axis = d.choice([i for i, v in enumerate(x.shape) if v >= 2])
    dim = x.shape[axis]
    n = d.integer(2, min(3, dim))
    cuts = sorted(d.subset(range(1, dim), min_size=n - 1)[:n - 1])
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [dim], strict=True)]
    d.op("Split", x, bound=d.bound(x), num_outputs=n, axis=signed_axis(d, axis, r), split=sizes)


# The largest int64: ONNX Slice clamps an out-of-range end to the axis.
INT64_MAX = np.iinfo(np.int64).max


def slice_(d: GraphDraft) -> None:
    """Slice with positive / negative / out-of-range starts and ends and steps 1, 2, -1, -2.
    Every slice is non-empty: for step > 0, 0 <= start < end <= dim; for step < 0,
    dim > start > end >= -1 (end -1 written as an index below -dim)."""
    x = d.pick()
    r = len(x.shape)
    axes = d.subset(range(r), min_size=1)
    starts, ends, steps = [], [], []
    for a in axes:
        dim = x.shape[a]
        step = d.choice((1, 2, -1, -2))
        if step > 0:
            s = d.integer(0, dim - 1)
            e = d.integer(s + 1, dim)
            s_enc = s - dim if d.rarely() else s
            e_enc = d.choice((e, INT64_MAX, dim + 3)) if e == dim else (e - dim if d.rarely() else e)
        else:
            s = d.integer(0, dim - 1)
            e = d.integer(-1, s - 1) if s > 0 else -1
            s_enc = d.choice((s, s - dim)) if s < dim - 1 else d.choice((s, -1, INT64_MAX))
            e_enc = d.choice((-dim - 1, -INT64_MAX)) if e == -1 else (e - dim if d.rarely() else e)
        starts.append(s_enc)
        ends.append(e_enc)
        steps.append(step)
    inputs = [x, d.ints("starts", starts), d.ints("ends", ends)]
    strided = any(step != 1 for step in steps)
    # ``axes`` may be left out when it is 0..k-1, ``steps`` when every step is 1.
    if axes != list(range(len(axes))) or strided or d.flag():
        inputs.append(d.ints("axes", [signed_axis(d, a, r) for a in axes]))
        if strided or d.flag():
            inputs.append(d.ints("steps", steps))
    d.op("Slice", *inputs, bound=d.bound(x))


def gather(d: GraphDraft) -> None:
    """Gather with constant (possibly negative) indices: 1-D, or a scalar that drops the axis."""
    x = d.pick()
    r = len(x.shape)
    axis = d.integer(0, r - 1)
    dim = x.shape[axis]
    if r >= 2 and d.rarely():
        idx = np.array(d.integer(-dim, dim - 1), dtype=np.int64)
    else:
        count = d.integer(1, 4)
        if size(x.shape) // dim * count > MAX_ELEMENTS:
            count = 1
        idx = np.array([d.integer(-dim, dim - 1) for _ in range(count)], dtype=np.int64)
    attrs = {"axis": signed_axis(d, axis, r)} if axis != 0 or d.flag() else {}
    d.op("Gather", x, d.const("indices", idx), bound=d.bound(x), **attrs)


def expand(d: GraphDraft) -> None:
    """Expand unit axes to 2-4 (and maybe add a leading axis); 1 in the target keeps an axis."""
    x = d.pick()
    # A unit axis may grow to 2..4; any other axis is written as itself or as 1 (kept).
    target = [(d.integer(2, 4) if d.flag() else 1) if v == 1 else (v if d.flag() else 1)
              for v in x.shape]
    if len(target) < MAX_RANK and d.rarely():
        target = [d.integer(1, 2)] + target
    if not fits(broadcast(x.shape, target)):
        target = list(x.shape)
    d.op("Expand", x, d.ints("shape", target), bound=d.bound(x))


def pad(d: GraphDraft) -> None:
    """Pad in constant (value given or 0, sometimes cropping), edge or reflect mode."""
    x = d.pick()
    r = len(x.shape)
    mode = d.choice(("constant", "edge", "reflect"))
    begin, end = [], []
    for dim in x.shape:
        hi = min(2, dim - 1) if mode == "reflect" else 2
        lo = -1 if mode == "constant" and dim > 2 and d.rarely() else 0
        begin.append(d.integer(lo, hi))
        end.append(d.integer(0, hi))
    shape = [v + b + e for v, b, e in zip(x.shape, begin, end, strict=True)]
    if not fits(shape):  # one column more at the end, or nothing where x is already at the cap (zero pads are valid)
        begin, end = [0] * r, [1 if i == r - 1 else 0 for i in range(r)]
        if not fits([v + e for v, e in zip(x.shape, end, strict=True)]):
            end = [0] * r
        if mode == "reflect" and x.shape[-1] < 2:
            mode = "constant"
    attrs = {} if mode == "constant" and d.flag() else {"mode": mode}
    inputs = [x, d.ints("pads", begin + end)]
    bound = d.bound(x)
    if mode == "constant" and d.flag():
        value = float(d.uniform((), -1.0, 1.0))
        inputs.append(d.scalar("pad_value", value))
        bound = max(bound, abs(value))
    d.op("Pad", *inputs, bound=bound, **attrs)


RESIZE_VARIANTS = (
    {"mode": "nearest"},
    {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
    {"mode": "linear"},
    {"mode": "linear", "coordinate_transformation_mode": "align_corners"},
    {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"mode": "linear", "coordinate_transformation_mode": "asymmetric"},
    {"mode": "cubic"},
    {"mode": "cubic", "antialias": 1},
    {"mode": "linear", "antialias": 1},
)
# Cubic weights (Keys, A = -0.75) overshoot: |sum| <= 1.27 per resized axis, so 1.62 over two.
CUBIC_RESIZE_GAIN = 1.7


def resize(d: GraphDraft) -> None:
    """Resize of the spatial axes by scales 2 (upsampling, as in YOLO/FPN necks) or 0.5, or to
    given sizes; linear interpolation is a convex combination, so the bound is kept (cubic's
    weights overshoot by ``CUBIC_RESIZE_GAIN`` at most)."""
    x = d.pick(rank_in(3, 4))
    r = len(x.shape)
    # (cubic of a 3-D tensor is valid ONNX, but onnxruntime, the differential oracle, takes 4-D only)
    attrs = dict(d.choice([v for v in RESIZE_VARIANTS if r == 4 or v["mode"] != "cubic"]))
    factors = [1.0, 1.0] + [d.choice((2.0, 1.0, 0.5)) if L >= 2 else d.choice((2.0, 1.0))
                            for L in x.shape[2:]]
    out = [int(math.floor(f * L)) for f, L in zip(factors, x.shape, strict=True)]
    if not fits(out):
        factors, out = [1.0] * r, list(x.shape)
    bound = d.bound(x) * (CUBIC_RESIZE_GAIN if attrs["mode"] == "cubic" else 1.0)
    if d.rarely():
        d.op("Resize", x, None, None, d.ints("sizes", out), bound=bound, **attrs)
    else:
        d.op("Resize", x, None, d.const("scales", np.array(factors, dtype=np.float32)), bound=bound, **attrs)
