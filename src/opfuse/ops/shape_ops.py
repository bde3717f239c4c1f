"""Data-movement ops: Concat, Split, Slice, Gather, Reshape, Flatten, Transpose, Squeeze,
Unsqueeze, Expand, Pad, Resize, and the shape-producing Shape, ConstantOfShape, Constant.

None of them does arithmetic worth counting (``flops_per_element = 0``) except Resize's
interpolation. Operands that decide an output shape (Reshape's shape, Slice's starts...)
must be constants: opfuse compiles static shapes (``const_input``).

Categories follow TVM: data movement is ``INJECTIVE`` (Expand is ``BROADCAST``); ops that
compute shapes or materialise constants are ``OPAQUE``, never fused. Mappings follow
DNNFusion: Reshape/Flatten/Squeeze/Unsqueeze only *reorganize* the same elements,
Transpose *shuffles* them, Concat/Split/Slice copy each element to one place (one-to-one),
Gather/Expand/Pad/Resize may copy one input element to many outputs (one-to-many).
The OPAQUE ops get the most conservative mapping, many-to-many.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.errors import InputError, UnsupportedOpError
from opfuse.ir.graph import Node, TensorType
from opfuse.ops.common import broadcast_shapes, const_input, norm_axis, out_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register


def _ints_of(arr) -> list[int]:
    return [int(v) for v in np.asarray(arr).reshape(-1).tolist()]


def _data_movement(name, category, mapping, infer, compute, **kw):
    kw.setdefault("flops_per_element", 0)
    register(OpSpec(name, category, mapping, infer, compute, **kw))


# Concat ---------------------------------------------------------------------------------
def _concat_infer(node: Node, a: dict):
    ins = node.input_values()
    if a["axis"] is None:
        raise shape_error(node, "attribute 'axis' is required")
    rank = len(ins[0].shape)
    axis = norm_axis(int(a["axis"]), rank, node)
    shape = list(ins[0].shape)
    for v in ins[1:]:
        if len(v.shape) != rank or any(d != e for i, (d, e) in enumerate(zip(v.shape, shape, strict=True))
                                       if i != axis):
            raise shape_error(node, f"inputs {[u.shape for u in ins]} differ outside axis {axis}")
        if v.dtype != ins[0].dtype:
            raise shape_error(node, f"inputs mix dtypes {ins[0].dtype} and {v.dtype}")
        shape[axis] += v.shape[axis]
    return out_type(shape, ins[0].dtype)


def _concat(ins, a, node):
    arrays = [x for x in ins if x is not None]
    return [np.concatenate(arrays, axis=norm_axis(int(a["axis"]), arrays[0].ndim, node))]


_data_movement("Concat", Category.INJECTIVE, Mapping.ONE_TO_ONE, _concat_infer, _concat,
               num_inputs=(1, 2 ** 31), attrs={"axis": None})


# Split ----------------------------------------------------------------------------------
def split_sizes(node: Node, a: dict) -> tuple[int, list[int]]:
    """Axis and output sizes. Without ``split`` the axis is cut into ``len(outputs)`` chunks of
    ``ceil(dim / n)`` (the last one smaller when the division is uneven, as in opset 18)."""
    shape = node.input(0).shape
    axis = norm_axis(int(a["axis"]), len(shape), node)
    n = len(node.outputs)
    if a.get("num_outputs") is not None and int(a["num_outputs"]) != n:
        raise shape_error(node, f"num_outputs={a['num_outputs']} but the node has {n} outputs")
    dim = shape[axis]
    if a.get("split") is not None:
        sizes = [int(s) for s in a["split"]]
        if len(sizes) != n or sum(sizes) != dim or min(sizes, default=0) < 0:
            raise shape_error(node, f"split {sizes} does not cut axis {axis} of size {dim} into {n} outputs")
        return axis, sizes
    chunk = -(-dim // n)
    sizes = [max(0, min(chunk, dim - i * chunk)) for i in range(n)]
    if n > 1 and sizes[-1] == 0 and dim:
        raise shape_error(node, f"cannot split axis {axis} of size {dim} into {n} non-empty outputs")
    return axis, sizes


def _split_infer(node: Node, a: dict):
    x = node.input(0)
    axis, sizes = split_sizes(node, a)
    return [TensorType(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes]


def _split(ins, a, node):
    axis, sizes = split_sizes(node, a)
    return np.split(ins[0], np.cumsum(sizes)[:-1], axis=axis)


_data_movement("Split", Category.INJECTIVE, Mapping.ONE_TO_ONE, _split_infer, _split,
               num_outputs=(1, 2 ** 31), attrs={"axis": 0, "split": None, "num_outputs": None})


# Slice ----------------------------------------------------------------------------------
def slice_index(node: Node) -> tuple[slice, ...]:
    """The NumPy index of a Slice node, with ONNX's clamping rules.

    Negative starts/ends count from the end (``+ dim``); then for ``step > 0`` both are
    clamped to ``[0, dim]``, and for ``step < 0`` start to ``[0, dim - 1]`` and end to
    ``[-1, dim - 1]`` (end ``-1`` meaning "through index 0").
    """
    shape = node.input(0).shape
    starts = _ints_of(const_input(node, 1, "starts"))
    ends = _ints_of(const_input(node, 2, "ends"))
    axes_in = const_input(node, 3, "axes")
    steps_in = const_input(node, 4, "steps")
    axes = _ints_of(axes_in) if axes_in is not None else list(range(len(starts)))
    steps = _ints_of(steps_in) if steps_in is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise shape_error(node, f"starts {starts}, ends {ends}, axes {axes}, steps {steps} differ in length")
    index = [slice(None)] * len(shape)
    seen = set()
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        ax = norm_axis(ax, len(shape), node)
        if ax in seen:
            raise shape_error(node, f"axis {ax} is sliced twice")
        seen.add(ax)
        if st == 0:
            raise shape_error(node, "slice step 0")
        dim = shape[ax]
        s = s + dim if s < 0 else s
        e = e + dim if e < 0 else e
        if st > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        index[ax] = slice(s, e if e >= 0 else None, st)
    return tuple(index)


def _slice_infer(node: Node, a: dict):
    x = node.input(0)
    shape = tuple(len(range(*sl.indices(d))) for sl, d in zip(slice_index(node), x.shape, strict=True))
    return out_type(shape, x.dtype)


_data_movement("Slice", Category.INJECTIVE, Mapping.ONE_TO_ONE, _slice_infer,
               lambda ins, a, node: [ins[0][slice_index(node)].copy()], num_inputs=(3, 5))


# Gather ---------------------------------------------------------------------------------
def _gather_infer(node: Node, a: dict):
    data, indices = node.input(0), node.input(1)
    if not np.issubdtype(indices.dtype, np.integer):
        raise shape_error(node, f"indices must be integers, got {indices.dtype}")
    axis = norm_axis(int(a["axis"]), len(data.shape), node)
    if indices.const is not None:
        _check_indices(node, indices.const, data.shape[axis], lambda msg: shape_error(node, msg))
    return out_type(data.shape[:axis] + indices.shape + data.shape[axis + 1:], data.dtype)


def _check_indices(node: Node, idx: np.ndarray, dim: int, error) -> None:
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise error(f"indices out of range [{-dim}, {dim - 1}] (min {idx.min()}, max {idx.max()})")


def _gather(ins, a, node):
    """y[i..., j..., k...] = data[i..., indices[j...] (negative counts from the end), k...]."""
    data, idx = ins
    axis = norm_axis(int(a["axis"]), data.ndim, node)
    dim = data.shape[axis]
    _check_indices(node, idx, dim,
                   lambda msg: InputError(f"node '{node.name}' (Gather): {msg}"))
    return [np.take(data, np.where(idx < 0, idx + dim, idx), axis=axis)]


_data_movement("Gather", Category.INJECTIVE, Mapping.ONE_TO_MANY, _gather_infer, _gather,
               num_inputs=(2, 2), attrs={"axis": 0})


# Reshape / Flatten / Squeeze / Unsqueeze / Transpose ---------------------------------------------
def reshape_target(node: Node, in_shape: tuple[int, ...], spec: list[int], allowzero: bool) -> tuple[int, ...]:
    """Resolve a Reshape shape: 0 copies the input dim (unless allowzero), one -1 is inferred."""
    out = []
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(in_shape):
                raise shape_error(node, f"shape {spec} copies dim {i} of a rank-{len(in_shape)} input")
            d = in_shape[i]
        elif d < -1:
            raise shape_error(node, f"invalid shape entry {d} in {spec}")
        out.append(d)
    size = math.prod(in_shape)
    if out.count(-1) > 1:
        raise shape_error(node, f"shape {spec} has more than one -1")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or size % known:
            raise shape_error(node, f"cannot reshape {in_shape} into {spec}")
        out[out.index(-1)] = size // known
    if math.prod(out) != size:
        raise shape_error(node, f"cannot reshape {in_shape} ({size} elements) into {tuple(out)}")
    return tuple(out)


def _reshape_shape(node: Node, a: dict) -> tuple[int, ...]:
    spec = _ints_of(const_input(node, 1, "shape"))
    return reshape_target(node, node.input(0).shape, spec, bool(int(a["allowzero"])))


_data_movement("Reshape", Category.INJECTIVE, Mapping.REORGANIZE,
               lambda node, a: out_type(_reshape_shape(node, a), node.input(0).dtype),
               lambda ins, a, node: [ins[0].reshape(_reshape_shape(node, a))],
               num_inputs=(2, 2), attrs={"allowzero": 0})


def _flatten_shape(node: Node, a: dict) -> tuple[int, int]:
    shape = node.input(0).shape
    axis = int(a["axis"])
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis <= len(shape):
        raise shape_error(node, f"axis {a['axis']} out of range for rank {len(shape)}")
    return math.prod(shape[:axis]), math.prod(shape[axis:])


_data_movement("Flatten", Category.INJECTIVE, Mapping.REORGANIZE,
               lambda node, a: out_type(_flatten_shape(node, a), node.input(0).dtype),
               lambda ins, a, node: [ins[0].reshape(_flatten_shape(node, a))],
               attrs={"axis": 1})


def _squeeze_shape(node: Node, a: dict) -> tuple[int, ...]:
    shape = node.input(0).shape
    if a["axes"] is None:
        return tuple(d for d in shape if d != 1)
    axes = {norm_axis(int(ax), len(shape), node) for ax in a["axes"]}
    bad = sorted(ax for ax in axes if shape[ax] != 1)
    if bad:
        raise shape_error(node, f"cannot squeeze axes {bad} of shape {shape}: not of size 1")
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _unsqueeze_shape(node: Node, a: dict) -> tuple[int, ...]:
    shape = node.input(0).shape
    if not a["axes"]:
        raise shape_error(node, "attribute 'axes' is required")
    rank = len(shape) + len(a["axes"])
    axes = [norm_axis(int(ax), rank, node) for ax in a["axes"]]
    if len(set(axes)) != len(axes):
        raise shape_error(node, f"axes {list(a['axes'])} repeat an axis")
    rest = iter(shape)
    return tuple(1 if i in axes else next(rest) for i in range(rank))


for _name, _shape_fn in (("Squeeze", _squeeze_shape), ("Unsqueeze", _unsqueeze_shape)):
    _data_movement(_name, Category.INJECTIVE, Mapping.REORGANIZE,
                   lambda node, a, f=_shape_fn: out_type(f(node, a), node.input(0).dtype),
                   lambda ins, a, node, f=_shape_fn: [ins[0].reshape(f(node, a))],
                   attrs={"axes": None})


def _perm(node: Node, a: dict) -> tuple[int, ...]:
    rank = len(node.input(0).shape)
    if a["perm"] is None:
        return tuple(reversed(range(rank)))
    perm = tuple(int(p) for p in a["perm"])
    if sorted(perm) != list(range(rank)):
        raise shape_error(node, f"perm {list(perm)} is not a permutation of {rank} axes")
    return perm


_data_movement("Transpose", Category.INJECTIVE, Mapping.SHUFFLE,
               lambda node, a: out_type(tuple(node.input(0).shape[p] for p in _perm(node, a)),
                                        node.input(0).dtype),
               lambda ins, a, node: [np.ascontiguousarray(np.transpose(ins[0], _perm(node, a)))],
               attrs={"perm": None})


# Expand ---------------------------------------------------------------------------------
def _expand_shape(node: Node) -> tuple[int, ...]:
    target = _ints_of(const_input(node, 1, "shape"))
    return broadcast_shapes(node, node.input(0).shape, target)


_data_movement("Expand", Category.BROADCAST, Mapping.ONE_TO_MANY,
               lambda node, a: out_type(_expand_shape(node), node.input(0).dtype),
               lambda ins, a, node: [np.array(np.broadcast_to(ins[0], _expand_shape(node)))],
               num_inputs=(2, 2))


# Pad ------------------------------------------------------------------------------------
PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad_widths(node: Node) -> list[tuple[int, int]]:
    """(begin, end) padding per axis; ONNX lists pads as [b_axis0.., e_axis0..] over ``axes``."""
    shape = node.input(0).shape
    pads = _ints_of(const_input(node, 1, "pads"))
    axes_in = const_input(node, 3, "axes")
    axes = [norm_axis(ax, len(shape), node) for ax in _ints_of(axes_in)] if axes_in is not None \
        else list(range(len(shape)))
    if len(pads) != 2 * len(axes):
        raise shape_error(node, f"pads {pads} needs 2 x {len(axes)} entries")
    widths = [(0, 0)] * len(shape)
    for i, ax in enumerate(axes):
        widths[ax] = (pads[i], pads[i + len(axes)])
    return widths


def _pad_infer(node: Node, a: dict):
    x = node.input(0)
    if a["mode"] not in PAD_MODES:
        raise UnsupportedOpError("Pad", node.name, detail=f"mode={a['mode']!r}")
    shape = tuple(d + b + e for d, (b, e) in zip(x.shape, pad_widths(node), strict=True))
    if min(shape, default=0) < 0:
        raise shape_error(node, f"pads {pad_widths(node)} crop more than the input {x.shape}")
    return out_type(shape, x.dtype)


def _pad(ins, a, node):
    """Negative pads crop; positive pads add constant / reflected / edge / wrapped elements."""
    x = ins[0]
    widths = pad_widths(node)
    crop = tuple(slice(max(0, -b), d - max(0, -e)) for d, (b, e) in zip(x.shape, widths, strict=True))
    x = x[crop]
    grow = [(max(0, b), max(0, e)) for b, e in widths]
    mode = PAD_MODES[a["mode"]]
    if mode == "constant":
        value = ins[2] if len(ins) > 2 and ins[2] is not None and ins[2].size else 0
        return [np.pad(x, grow, mode="constant", constant_values=np.asarray(value).reshape(()).item())]
    return [np.pad(x, grow, mode=mode)]


_data_movement("Pad", Category.INJECTIVE, Mapping.ONE_TO_MANY, _pad_infer, _pad,
               num_inputs=(2, 4), attrs={"mode": "constant"})


# Resize ---------------------------------------------------------------------------------
RESIZE_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                      "asymmetric", "tf_half_pixel_for_nearest", "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
RESIZE_MODES = ("nearest", "linear", "cubic")
_RESIZE_ATTRS = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
                 "nearest_mode": "round_prefer_floor", "cubic_coeff_a": -0.75, "exclude_outside": 0,
                 "extrapolation_value": 0.0, "antialias": 0, "axes": None,
                 "keep_aspect_ratio_policy": "stretch"}


def _present(arr) -> bool:
    return arr is not None and np.asarray(arr).size > 0


def resize_plan(node: Node, a: dict) -> tuple[tuple[int, ...], list[float], np.ndarray | None]:
    """Output shape, the scale used for coordinate mapping per axis, and the roi (or None).

    With ``scales``: ``out = floor(in * scale)``. With ``sizes``: ``scale = out / in``; the
    ``not_larger``/``not_smaller`` policies replace every resized axis's scale by the min/max
    and round ``in * scale`` half up.
    """
    x = node.input(0).shape
    rank = len(x)
    if a["mode"] not in RESIZE_MODES:
        raise UnsupportedOpError("Resize", node.name, detail=f"mode={a['mode']!r}: only nearest, linear and "
                                                             "cubic interpolation are defined")
    if int(a["antialias"]) not in (0, 1):
        raise UnsupportedOpError("Resize", node.name, detail=f"antialias={a['antialias']!r} (0 or 1)")
    if int(a["exclude_outside"]) not in (0, 1):
        raise UnsupportedOpError("Resize", node.name, detail=f"exclude_outside={a['exclude_outside']!r} (0 or 1)")
    if a["coordinate_transformation_mode"] not in RESIZE_COORD_MODES:
        raise UnsupportedOpError("Resize", node.name, detail=f"coordinate_transformation_mode="
                                                             f"{a['coordinate_transformation_mode']!r}")
    if a["mode"] == "nearest" and a["nearest_mode"] not in NEAREST_MODES:
        raise UnsupportedOpError("Resize", node.name, detail=f"nearest_mode={a['nearest_mode']!r}")
    axes = [norm_axis(int(ax), rank, node) for ax in a["axes"]] if a["axes"] is not None \
        else list(range(rank))
    roi = const_input(node, 1, "roi") if len(node.inputs) > 1 else None
    scales = const_input(node, 2, "scales") if len(node.inputs) > 2 else None
    sizes = const_input(node, 3, "sizes") if len(node.inputs) > 3 else None
    if _present(scales) == _present(sizes):
        raise shape_error(node, "exactly one of scales and sizes must be given")
    scale = [1.0] * rank
    out = list(x)
    if _present(scales):
        given = [float(s) for s in np.asarray(scales, dtype=np.float64).reshape(-1)]
        if len(given) != len(axes) or min(given) <= 0:
            raise shape_error(node, f"scales {given} must be {len(axes)} positive numbers")
        for ax, s in zip(axes, given, strict=True):
            scale[ax] = s
            out[ax] = int(math.floor(s * x[ax]))
    else:
        targets = _ints_of(sizes)
        if len(targets) != len(axes) or min(targets) < 0:
            raise shape_error(node, f"sizes {targets} must be {len(axes)} non-negative sizes")
        policy = a["keep_aspect_ratio_policy"]
        ratios = [t / x[ax] for ax, t in zip(axes, targets, strict=True)]
        if policy == "stretch":
            for ax, t, r in zip(axes, targets, ratios, strict=True):
                scale[ax], out[ax] = r, t
        elif policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            for ax in axes:
                scale[ax], out[ax] = common, int(common * x[ax] + 0.5)
        else:
            raise UnsupportedOpError("Resize", node.name, detail=f"keep_aspect_ratio_policy={policy!r}")
    if min(out, default=1) < 1:
        raise shape_error(node, f"output shape {tuple(out)} is empty")
    roi_full = None
    if a["coordinate_transformation_mode"] == "tf_crop_and_resize":
        if not _present(roi):
            raise shape_error(node, "tf_crop_and_resize needs a roi input")
        roi_given = np.asarray(roi, dtype=np.float64).reshape(-1)
        if roi_given.size != 2 * len(axes):
            raise shape_error(node, f"roi has {roi_given.size} entries, expected {2 * len(axes)}")
        roi_full = np.array([0.0] * rank + [1.0] * rank)
        for i, ax in enumerate(axes):
            roi_full[ax], roi_full[rank + ax] = roi_given[i], roi_given[len(axes) + i]
    return tuple(out), scale, roi_full


def source_coordinates(mode: str, out_len: int, in_len: int, scale: float,
                       roi: tuple[float, float] | None) -> np.ndarray:
    """Map output indices ``o`` to (fractional) input coordinates, per ONNX Resize.

    ``L = in_len * scale`` is the un-floored output length (it differs from ``out_len``
    when scales are given), as the ONNX reference uses it.
    """
    o = np.arange(out_len, dtype=np.float64)
    length = scale * in_len
    if mode == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / length)
        return offset + (o + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (o + 0.5) / scale - 0.5 if length > 1 else np.full(out_len, -0.5)
    if mode == "align_corners":
        return o * (in_len - 1) / (length - 1) if length != 1 else np.zeros(out_len)
    if mode == "asymmetric":
        return o / scale
    if mode == "tf_half_pixel_for_nearest":
        return (o + 0.5) / scale
    if roi is None:
        raise ValueError("tf_crop_and_resize maps coordinates through a roi; none was given")
    start, end = roi
    if length == 1:
        return np.full(out_len, (end - start) * (in_len - 1) / 2 + start * (in_len - 1))
    return o * (end - start) * (in_len - 1) / (length - 1) + start * (in_len - 1)


def _nearest_index(coord: np.ndarray, mode: str) -> np.ndarray:
    floor = np.floor(coord)
    frac = coord - floor
    if mode == "round_prefer_floor":
        idx = np.where(frac <= 0.5, floor, floor + 1)
    elif mode == "round_prefer_ceil":
        idx = np.where(frac < 0.5, floor, floor + 1)
    elif mode == "floor":
        idx = floor
    else:
        idx = np.ceil(coord)
    return idx.astype(np.int64)


def uses_taps(a: dict) -> bool:
    """Whether Resize weighs a window of taps per output position (cubic, or antialiased linear)
    rather than nearest's one neighbour or plain linear's two."""
    return a["mode"] == "cubic" or (a["mode"] == "linear" and bool(int(a["antialias"])))


def _cubic_coeffs(r: np.ndarray, A: float) -> np.ndarray:
    """Keys' weights of the taps at -1, 0, 1, 2 around a point at fraction ``r`` in (0, 1]."""
    s = 1 - r
    return np.stack([((A * (r + 1) - 5 * A) * (r + 1) + 8 * A) * (r + 1) - 4 * A,
                     ((A + 2) * r - (A + 3)) * r * r + 1,
                     ((A + 2) * s - (A + 3)) * s * s + 1,
                     ((A * (s + 1) - 5 * A) * (s + 1) + 8 * A) * (s + 1) - 4 * A], axis=-1)


def _cubic_kernel(x: np.ndarray, A: float) -> np.ndarray:
    x = np.abs(x)
    x2, x3 = x * x, x * x * x
    return np.where(x <= 1, (A + 2) * x3 - (A + 3) * x2 + 1,
                    np.where(x < 2, A * x3 - 5 * A * x2 + 8 * A * x - 4 * A, 0.0))


def resize_taps(coord: np.ndarray, scale: float, in_len: int, a: dict) -> tuple[np.ndarray, np.ndarray]:
    """(input index, weight) of every tap of every output position along one axis: two arrays of
    shape ``(out, taps)``, indices clamped to the edge (the ONNX reference's window and weights).

    The window of ``taps`` neighbours prefers those left of the point; ``ratio`` is the point's
    distance past the window's left centre, 1 (not 0) at an integer point. Cubic weighs with
    Keys' kernel (``cubic_coeff_a``); antialias (when shrinking) stretches the kernel by
    ``1 / scale`` and normalises the weights; ``exclude_outside`` zeroes taps outside the input
    and renormalises.
    """
    lo = np.floor(coord)
    ratio = np.where(coord == lo, 1.0, coord - lo)
    A = float(a["cubic_coeff_a"])
    antialias = bool(int(a["antialias"]))
    s = min(scale, 1.0)
    if a["mode"] == "cubic" and not antialias:
        coeffs = _cubic_coeffs(ratio, A)
    elif a["mode"] == "cubic":
        start = int(np.floor(-2 / s) + 1)
        offs = np.arange(start, 2 - start, dtype=np.float64)
        coeffs = _cubic_kernel(s * (offs[None, :] - ratio[:, None]), A)
        coeffs = coeffs / coeffs.sum(axis=-1, keepdims=True)
    elif antialias:
        start = int(np.floor(-1 / s) + 1)
        offs = np.arange(start, start + 2 - 2 * start, dtype=np.float64)
        coeffs = np.clip(1 - np.abs((offs[None, :] - ratio[:, None]) * s), 0, 1)
        coeffs = coeffs / coeffs.sum(axis=-1, keepdims=True)
    else:
        coeffs = np.stack([1 - ratio, ratio], axis=-1)
    n = coeffs.shape[-1]
    pad = int(math.ceil(n / 2))
    padded = coord + pad
    p = np.floor(padded)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        base = -((n - 1) // 2)
        offset = np.where(frac <= 0.5, base, base + 1)
    idx = (p + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if int(a["exclude_outside"]):
        coeffs = np.where((idx < 0) | (idx >= in_len), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), coeffs


def _resize_axis(x: np.ndarray, axis: int, coord: np.ndarray, a: dict, scale: float = 1.0) -> np.ndarray:
    """Resample ``x`` along ``axis`` at ``coord``, clamping neighbours to the edge."""
    last = x.shape[axis] - 1
    shape = [1] * x.ndim
    shape[axis] = len(coord)
    if a["mode"] == "nearest":
        return np.take(x, np.clip(_nearest_index(coord, a["nearest_mode"]), 0, last), axis=axis)
    if uses_taps(a):
        idx, w = resize_taps(coord, scale, x.shape[axis], a)
        gathered = np.take(x, idx, axis=axis)  # the taps axis follows ``axis``
        return (gathered * w.reshape(w.shape + (1,) * (x.ndim - axis - 1))).sum(axis=axis + 1)
    lo = np.floor(coord)
    w = (coord - lo).reshape(shape)
    lo = lo.astype(np.int64)
    left = np.take(x, np.clip(lo, 0, last), axis=axis)
    right = np.take(x, np.clip(lo + 1, 0, last), axis=axis)
    return left * (1 - w) + right * w


def _resize_infer(node: Node, a: dict):
    out, _, _ = resize_plan(node, a)
    return out_type(out, node.input(0).dtype)


def _resize(ins, a, node):
    """Separable resampling: one 1-D nearest/linear pass per resized axis.

    Linear is N-d (bi-, tri-linear ...) because the passes compose. For
    tf_crop_and_resize, output positions whose coordinate leaves ``[0, in - 1]`` take
    ``extrapolation_value``.
    """
    x = ins[0]
    out, scale, roi = resize_plan(node, a)
    ctm = a["coordinate_transformation_mode"]
    rank = x.ndim
    y = x.astype(np.float64) if a["mode"] != "nearest" else x
    for axis in range(rank):
        identity = out[axis] == x.shape[axis] and scale[axis] == 1.0 and roi is None
        if identity:
            continue
        axis_roi = (roi[axis], roi[rank + axis]) if roi is not None else None
        coord = source_coordinates(ctm, out[axis], x.shape[axis], scale[axis], axis_roi)
        y = _resize_axis(y, axis, coord, a, scale[axis])
        if roi is not None:
            outside = ((coord < 0) | (coord > x.shape[axis] - 1)).reshape(
                [len(coord) if i == axis else 1 for i in range(rank)])
            y = np.where(outside, np.asarray(a["extrapolation_value"], dtype=y.dtype), y)
    if np.issubdtype(x.dtype, np.integer) and y.dtype != x.dtype:
        info = np.iinfo(x.dtype)
        y = np.clip(np.rint(y), info.min, info.max)
    return [np.ascontiguousarray(y).astype(x.dtype, copy=False)]


def _resize_flops(node: Node, a: dict) -> int:
    # Linear: one multiply-add per neighbour per resized axis (cubic: four); nearest only copies.
    if a["mode"] == "nearest":
        return 0
    resized = sum(1 for i, o in zip(node.input(0).shape, node.outputs[0].shape, strict=True) if i != o)
    return (3 if a["mode"] == "linear" else 8) * node.outputs[0].size * resized


_data_movement("Resize", Category.INJECTIVE, Mapping.ONE_TO_MANY, _resize_infer, _resize,
               num_inputs=(1, 4), attrs=dict(_RESIZE_ATTRS), flops_fn=_resize_flops)


# Shape, ConstantOfShape, Constant ------------------------------------------------------------
def _shape_range(node: Node, a: dict) -> tuple[int, int]:
    rank = len(node.input(0).shape)

    def clamp(v, default):
        v = default if v is None else int(v)
        v = v + rank if v < 0 else v
        return min(max(v, 0), rank)

    return clamp(a["start"], 0), clamp(a["end"], rank)


def _shape_infer(node: Node, a: dict):
    start, end = _shape_range(node, a)
    return out_type((max(0, end - start),), np.int64)


def _shape(ins, a, node):
    start, end = _shape_range(node, a)
    return [np.array(ins[0].shape[start:end], dtype=np.int64)]


register(OpSpec("Shape", Category.OPAQUE, Mapping.MANY_TO_MANY, _shape_infer, _shape,
                attrs={"start": 0, "end": None}, flops_per_element=0))


def _fill_value(node: Node, a: dict) -> np.ndarray:
    v = a["value"]
    if v is None:
        return np.zeros((), dtype=np.float32)
    v = np.asarray(v)
    if v.size != 1:
        raise shape_error(node, f"value must hold one element, got shape {v.shape}")
    return v.reshape(())


def _cos_shape(node: Node) -> tuple[int, ...]:
    shape = _ints_of(const_input(node, 0, "shape"))
    if min(shape, default=0) < 0:
        raise shape_error(node, f"negative dimension in shape {shape}")
    return tuple(shape)


register(OpSpec("ConstantOfShape", Category.OPAQUE, Mapping.MANY_TO_MANY,
                lambda node, a: out_type(_cos_shape(node), _fill_value(node, a).dtype),
                lambda ins, a, node: [np.full(_cos_shape(node), _fill_value(node, a))],
                attrs={"value": None}, flops_per_element=0))

_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints",
                   "value_string", "value_strings", "sparse_value")


def constant_value(node: Node, a: dict) -> np.ndarray:
    """The tensor a Constant node holds (exactly one ``value*`` attribute is set)."""
    given = [k for k in _CONSTANT_ATTRS if a.get(k) is not None]
    if len(given) != 1:
        raise shape_error(node, f"needs exactly one value attribute, got {given}")
    key, v = given[0], a[given[0]]
    if key in ("value_string", "value_strings", "sparse_value"):
        raise UnsupportedOpError("Constant", node.name, detail=f"{key} is not supported")
    if key in ("value_float", "value_floats"):
        return np.asarray(v, dtype=np.float32)
    if key in ("value_int", "value_ints"):
        return np.asarray(v, dtype=np.int64)
    return np.asarray(v)


register(OpSpec("Constant", Category.OPAQUE, Mapping.MANY_TO_MANY,
                lambda node, a: out_type(constant_value(node, a).shape, constant_value(node, a).dtype),
                lambda ins, a, node: [constant_value(node, a).copy()],
                num_inputs=(0, 0), attrs={k: None for k in _CONSTANT_ATTRS}, flops_per_element=0))
