"""Spatial sampling ops: GridSample, AffineGrid, Col2Im, DeformConv, RoiAlign, MaxUnpool.

Each reads its input at positions computed from data (a grid, offsets, boxes, indices) or
sums overlapping windows, so none is a fixed index map. Fusion categories:

* ``AffineGrid(theta, size; align_corners)`` is elementwise-like: every grid element is
  ``theta[n, i, :] . (x_w, y_h, [z_d,] 1)`` over a constant base grid, so it is
  ``INJECTIVE`` (an inline rule, ``codegen/rules.py``) and fuses into its consumers' loops.
* ``GridSample``, ``Col2Im``, ``DeformConv`` and ``RoiAlign`` gather from a whole input:
  each is its own kernel, built around the op (``OUT_ELEMWISE_FUSABLE``: an elementwise
  epilogue may follow, never a prologue; ``codegen/sampling.py``).
* ``MaxUnpool`` writes where its indices say (a scatter): ``OPAQUE``, never fused.

Semantics follow ``onnx.reference`` (and onnxruntime where they agree):

* GridSample (16: 4-D only, modes ``bilinear``/``nearest``/``bicubic``; 20+: N-D, modes
  ``linear``/``nearest``/``cubic``): normalised grid coordinates in [-1, 1] (last grid axis
  ordered x, y, z: reversed spatial axes) are mapped to pixels, with ``align_corners`` choosing
  the corners or the edges of the corner pixels. Coordinates are computed in the grid's element
  type (as the reference and PyTorch do). Nearest rounds half to even. Out-of-range taps read 0
  (``zeros``), the clamped edge (``border``) or the mirror image (``reflection``). Cubic uses
  Keys' kernel with ``A = -0.75``. Cubic with ``border`` clamps each of the 4 taps, not the point
  first, as PyTorch and onnxruntime do (``onnx.reference`` moves an outside point onto the border
  before taking its 4 x 4 neighbourhood, which drops the interior taps: onnxruntime issue 10607).
* AffineGrid: base coordinates ``-1 + (2 i + 1) / L`` (or ``-1 + 2 i / (L - 1)`` with
  ``align_corners``); ``size`` decides the output shape and must be a constant.
* Col2Im: ``image_shape`` and ``block_shape`` are constants; the output element sums the
  column entries whose window position lands on it, in kernel-offset order.
* DeformConv: a convolution whose every tap is read at its own offset position, by bilinear
  interpolation with zeros outside, times the optional mask; then ``+ B``.
* RoiAlign (10, 16, 22): average (or max of the weighted corners, ``mode="max"``) of
  ``sampling_ratio^2`` bilinear samples per bin (``ceil(roi_size / output_size)`` per axis when
  ``sampling_ratio`` is 0); opset 10 has no ``coordinate_transformation_mode`` and means
  ``output_half_pixel``. Box coordinates are computed in the boxes' element type.
* MaxUnpool: ``y.flat[indices] = x`` over the shape ``(in - 1) * stride - pads + kernel``, placed
  in the corner of ``output_shape`` when that (constant) input is given.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.errors import InputError, UnsupportedOpError
from opfuse.ir.graph import Node
from opfuse.ops.common import const_input, int_attrs, out_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register

FLOATS = frozenset({np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)})
INDEX_TYPES = (np.dtype(np.int32), np.dtype(np.int64))

# GridSample ------------------------------------------------------------------------------------
GRID_MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic",
              "bicubic": "cubic"}
PADDING_MODES = ("zeros", "border", "reflection")
CUBIC_A = -0.75  # Keys' kernel parameter GridSample uses (PyTorch's)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def grid_mode(node: Node, a: dict) -> str:
    """GridSample's interpolation, canonical name (``linear``, ``nearest`` or ``cubic``)."""
    mode = _text(a["mode"])
    if mode not in GRID_MODES:
        raise UnsupportedOpError(node.op_type, node.name, detail=f"mode={mode!r}")
    return GRID_MODES[mode]


def grid_padding(node: Node, a: dict) -> str:
    pad = _text(a["padding_mode"])
    if pad not in PADDING_MODES:
        raise UnsupportedOpError(node.op_type, node.name, detail=f"padding_mode={pad!r}")
    return pad


def _grid_infer(node: Node, a: dict):
    x, grid = node.input(0), node.input(1)
    grid_mode(node, a)
    grid_padding(node, a)
    if x.dtype not in FLOATS or grid.dtype not in FLOATS:
        raise shape_error(node, f"X ({x.dtype}) and grid ({grid.dtype}) must be floating point")
    d = len(x.shape) - 2
    if d < 1:
        raise shape_error(node, f"X must be (N, C, D1, ...), got shape {x.shape}")
    if len(grid.shape) != d + 2 or grid.shape[-1] != d or grid.shape[0] != x.shape[0]:
        raise shape_error(node, f"grid {grid.shape} must be (N, out1, ..., out{d}, {d}) for X {x.shape}")
    return out_type(x.shape[:2] + grid.shape[1:-1], x.dtype)


def denormalize(g: np.ndarray, length: int, align_corners: bool) -> np.ndarray:
    """Pixel coordinates of normalised ``g`` along an axis of ``length``, in ``g``'s type."""
    one, half = g.dtype.type(1), g.dtype.type(0.5)
    if align_corners:
        return (g + one) * half * g.dtype.type(length - 1)
    return ((g + one) * g.dtype.type(length) - one) * half


def reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Mirror ``x`` at ``lo`` and ``hi`` until it lies between them (PyTorch's reflect), computed in
    double (as the reference) and returned in ``x``'s type."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    dtype = x.dtype
    x = x.astype(np.float64)
    below = x < lo
    dx = np.where(below, lo - x, x - hi)
    n = np.trunc(dx / span)
    r = dx - n * span
    even = np.mod(n, 2) == 0
    inside_lo = lo + r
    inside_hi = hi - r
    flipped = np.where(below, np.where(even, inside_lo, inside_hi), np.where(even, inside_hi, inside_lo))
    return np.where((x < lo) | (x > hi), flipped, x).astype(dtype, copy=False)


def cubic_weights(t: np.ndarray, A: float) -> list[np.ndarray]:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 for fraction ``t`` in [0, 1)."""
    u, v = t + 1, 1 - t
    w = v + 1
    return [((A * u - 5 * A) * u + 8 * A) * u - 4 * A,
            ((A + 2) * t - (A + 3)) * t * t + 1,
            ((A + 2) * v - (A + 3)) * v * v + 1,
            ((A * w - 5 * A) * w + 8 * A) * w - 4 * A]


def _grid_taps(x: np.ndarray, length: int, mode: str, padding: str, align: bool):
    """Per tap: (index into the axis, validity, weight) arrays of ``x``'s shape + (taps,)."""
    lo, hi = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
    if mode == "nearest":
        x = np.rint(x)
    out = (x < lo) | (x > hi)
    if padding == "border" and mode != "cubic":
        x = np.where(out, np.clip(x, 0, length - 1), x)
    elif padding == "reflection":
        x = np.where(out, reflect(x, lo, hi), x)
    x = x.astype(np.float64)
    if mode == "nearest":
        taps, weights = [np.trunc(x)], [np.ones_like(x)]
    else:
        x0 = np.floor(x)
        t = x - x0
        if mode == "linear":
            taps, weights = [x0, x0 + 1], [1 - t, t]
        else:
            taps, weights = [x0 - 1, x0, x0 + 1, x0 + 2], cubic_weights(t, CUBIC_A)
    idx, valid = [], []
    for p in taps:
        if padding == "zeros":
            valid.append((p >= 0) & (p < length))
            idx.append(np.clip(p, 0, length - 1))
        elif padding == "border":
            valid.append(np.ones(p.shape, bool))
            idx.append(np.clip(p, 0, length - 1))
        else:
            valid.append(np.ones(p.shape, bool))
            idx.append(np.clip(np.trunc(reflect(p, lo, hi)), 0, length - 1))
    # a NaN coordinate's taps are read at index 0 (not an int64 cast of NaN); its NaN weights make the result NaN
    idx = [np.where(np.isnan(i), 0.0, i) for i in idx]
    return (np.stack(idx, -1).astype(np.int64), np.stack(valid, -1), np.stack(weights, -1))


def sample(x: np.ndarray, coords: list[np.ndarray], mode: str, padding: str, align: bool) -> np.ndarray:
    """``x`` (N, C, *S) read at pixel coordinates ``coords[d]`` (N, *O) per spatial axis ``d``:
    (N, C, *O) in float64. Taps combine innermost axis first, as the reference nests them."""
    n, d = x.shape[0], len(coords)
    lead = coords[0].shape  # (N, *O)
    per_axis = [_grid_taps(c, x.shape[2 + i], mode, padding, align) for i, c in enumerate(coords)]
    taps = [p[0].shape[-1] for p in per_axis]
    full = lead + tuple(taps)
    k = len(lead)

    def spread(arr: np.ndarray, i: int) -> np.ndarray:
        shape = lead + tuple(taps[i] if j == i else 1 for j in range(d))
        return np.broadcast_to(arr.reshape(shape), full)

    index = [np.broadcast_to(np.arange(n).reshape((n,) + (1,) * (len(full) - 1)), full)]
    index += [spread(p[0], i) for i, p in enumerate(per_axis)]
    valid = np.ones(full, bool)
    for i, p in enumerate(per_axis):
        valid = valid & spread(p[1], i)
    xt = np.moveaxis(x.astype(np.float64), 1, -1)  # (N, *S, C)
    # A tap outside the input reads 0 (its index is clipped to a real pixel, which must not be multiplied by
    # 0: an infinite pixel would make it NaN where onnxruntime and the C backend add 0).
    vals = np.where(valid[..., None], xt[tuple(index)], 0.0)  # (N, *O, T0, ..., C)
    for i in reversed(range(d)):
        w = per_axis[i][2].reshape(lead + (1,) * i + (taps[i],) + (1,))
        vals = (vals * w).sum(axis=k + i)
    return np.moveaxis(vals, -1, 1)


def _grid_sample(ins, a, node):
    x, grid = ins[0], ins[1]
    mode, padding = grid_mode(node, a), grid_padding(node, a)
    align = bool(int(a["align_corners"]))
    d = x.ndim - 2
    coords = [denormalize(grid[..., d - 1 - i], x.shape[2 + i], align) for i in range(d)]
    return [sample(x, coords, mode, padding, align).astype(x.dtype)]


def _grid_flops(node: Node, a: dict) -> int:
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[grid_mode(node, a)]
    return 2 * node.outputs[0].size * taps ** (len(node.input(0).shape) - 2)


register(OpSpec("GridSample", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _grid_infer, _grid_sample,
                num_inputs=(2, 2), attrs={"mode": "linear", "padding_mode": "zeros", "align_corners": 0},
                flops_fn=_grid_flops, dtypes=FLOATS))


# AffineGrid ------------------------------------------------------------------------------------
def affine_size(node: Node) -> tuple[int, ...]:
    size = const_input(node, 1, "size")
    assert size is not None
    dims = tuple(int(s) for s in np.asarray(size).reshape(-1))
    if len(dims) not in (4, 5) or min(dims) < 1:
        raise shape_error(node, f"size {list(dims)} must be (N, C, H, W) or (N, C, D, H, W), all positive")
    return dims


def base_coordinates(length: int, align_corners: bool) -> np.ndarray:
    """AffineGrid's normalised coordinates of the ``length`` positions along one axis."""
    i = np.arange(length, dtype=np.float64)
    if align_corners:
        return -1 + 2 * i / (length - 1) if length > 1 else np.zeros(1)
    return -1 + (2 * i + 1) / length


def _affine_infer(node: Node, a: dict):
    theta = node.input(0)
    size = affine_size(node)
    d = len(size) - 2
    if theta.dtype not in FLOATS:
        raise shape_error(node, f"theta must be floating point, got {theta.dtype}")
    if tuple(theta.shape) != (size[0], d, d + 1):
        raise shape_error(node, f"theta {theta.shape} must be ({size[0]}, {d}, {d + 1}) for size {list(size)}")
    return out_type((size[0],) + size[2:] + (d,), theta.dtype)


def _affine_grid(ins, a, node):
    theta = ins[0]
    size = affine_size(node)
    spatial = size[2:]
    align = bool(int(a["align_corners"]))
    axes = [base_coordinates(n, align) for n in spatial]  # D?, H, W
    mesh = np.meshgrid(*axes, indexing="ij")
    base = np.stack([m for m in reversed(mesh)] + [np.ones(spatial)], axis=-1)  # (..., x, y, [z,] 1)
    grid = np.einsum("nij,...j->n...i", theta.astype(np.float64), base)
    return [grid.astype(theta.dtype)]


register(OpSpec("AffineGrid", Category.INJECTIVE, Mapping.ONE_TO_MANY, _affine_infer, _affine_grid,
                num_inputs=(2, 2), attrs={"align_corners": 0}, flops_per_element=6.0, dtypes=FLOATS))


# Col2Im ----------------------------------------------------------------------------------------
def col2im_geometry(node: Node, a: dict):
    """(image, block, strides, dilations, pads_begin, blocks per axis) of a Col2Im node."""
    x = node.input(0)
    img = const_input(node, 1, "image_shape")
    blk = const_input(node, 2, "block_shape")
    assert img is not None and blk is not None
    image = tuple(int(v) for v in np.asarray(img).reshape(-1))
    block = tuple(int(v) for v in np.asarray(blk).reshape(-1))
    n = len(image)
    if len(block) != n or n < 1 or min(image + block) < 1:
        raise shape_error(node, f"image_shape {list(image)} and block_shape {list(block)} must be positive "
                                f"and of one length")
    strides = int_attrs(node, a, "strides", n, 1)
    dilations = int_attrs(node, a, "dilations", n, 1)
    pads = int_attrs(node, a, "pads", 2 * n, 0)
    if min(strides + dilations) < 1 or min(pads) < 0:
        raise shape_error(node, f"strides {list(strides)} and dilations {list(dilations)} must be positive, "
                                f"pads {list(pads)} not negative")
    blocks = tuple((image[i] + pads[i] + pads[n + i] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
                   for i in range(n))
    k = math.prod(block)
    if len(x.shape) != 3 or x.shape[1] % k or min(blocks) < 1 or x.shape[2] != math.prod(blocks):
        raise shape_error(node, f"input {x.shape} must be (N, C * {k}, {math.prod(blocks)}) for image_shape "
                                f"{list(image)}, block_shape {list(block)}")
    return image, block, strides, dilations, pads[:n], blocks


def _col2im_infer(node: Node, a: dict):
    x = node.input(0)
    image, block, *_ = col2im_geometry(node, a)
    return out_type((x.shape[0], x.shape[1] // math.prod(block)) + image, x.dtype)


def _col2im(ins, a, node):
    x = ins[0]
    image, block, strides, dilations, pads, blocks = col2im_geometry(node, a)
    n, k = x.shape[0], math.prod(block)
    c = x.shape[1] // k
    cols = x.reshape((n, c, k) + blocks)
    acc = np.float64 if x.dtype.kind == "f" else x.dtype
    y = np.zeros((n, c) + image, dtype=acc)
    for j, off in enumerate(np.ndindex(*block)):
        src, dst = [], []
        for i in range(len(image)):
            pos = np.arange(blocks[i]) * strides[i] - pads[i] + off[i] * dilations[i]
            ok = (pos >= 0) & (pos < image[i])
            src.append(np.nonzero(ok)[0])
            dst.append(pos[ok])
        if min(len(s) for s in src) == 0:
            continue
        y[np.ix_(range(n), range(c), *dst)] += cols[np.ix_(range(n), range(c), [j], *src)][:, :, 0]
    return [y.astype(x.dtype)]


register(OpSpec("Col2Im", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _col2im_infer, _col2im,
                num_inputs=(3, 3), attrs={"dilations": None, "pads": None, "strides": None},
                flops_fn=lambda node, a: node.input(0).size))


# DeformConv ------------------------------------------------------------------------------------
def deform_geometry(node: Node, a: dict):
    """(kernel, strides, dilations, pads_begin, out spatial, group, offset_group) of a DeformConv."""
    x, w, off = node.input(0), node.input(1), node.input(2)
    d = len(x.shape) - 2
    if d < 1 or len(w.shape) != d + 2 or len(off.shape) != d + 2:
        raise shape_error(node, f"X {x.shape}, W {w.shape} and offset {off.shape} must be (N, C, D1, ...) "
                                f"of one rank")
    kernel = tuple(w.shape[2:])
    if a.get("kernel_shape") is not None and tuple(int(k) for k in a["kernel_shape"]) != kernel:
        raise shape_error(node, f"kernel_shape {list(a['kernel_shape'])} does not match W {w.shape}")
    strides = int_attrs(node, a, "strides", d, 1)
    dilations = int_attrs(node, a, "dilations", d, 1)
    pads = int_attrs(node, a, "pads", 2 * d, 0)
    group, og = int(a["group"]), int(a["offset_group"])
    if min(strides + dilations) < 1 or group < 1 or og < 1:
        raise shape_error(node, "strides, dilations, group and offset_group must be positive")
    out = tuple((x.shape[2 + i] + pads[i] + pads[d + i] - (dilations[i] * (kernel[i] - 1) + 1)) // strides[i] + 1
                for i in range(d))
    c, oc = x.shape[1], w.shape[0]
    if c != w.shape[1] * group or oc % group or c % og:
        raise shape_error(node, f"X has {c} channels, W {w.shape} with group={group}, offset_group={og}")
    k = math.prod(kernel)
    if min(out) < 1 or tuple(off.shape) != (x.shape[0], og * k * d) + out:
        raise shape_error(node, f"offset {off.shape} must be {(x.shape[0], og * k * d) + out}")
    if len(node.inputs) > 3 and node.inputs[3] is not None and tuple(node.input(3).shape) != (oc,):
        raise shape_error(node, f"B {node.input(3).shape} must be ({oc},)")
    if len(node.inputs) > 4 and node.inputs[4] is not None \
            and tuple(node.input(4).shape) != (x.shape[0], og * k) + out:
        raise shape_error(node, f"mask {node.input(4).shape} must be {(x.shape[0], og * k) + out}")
    return kernel, strides, dilations, pads[:d], out, group, og


def _deform_infer(node: Node, a: dict):
    x, w = node.input(0), node.input(1)
    *_, out, _, _ = deform_geometry(node, a)
    return out_type((x.shape[0], w.shape[0]) + out, x.dtype)


def _deform_conv(ins, a, node):
    x, w, off = ins[0], ins[1], ins[2]
    b = ins[3] if len(ins) > 3 else None
    mask = ins[4] if len(ins) > 4 else None
    kernel, strides, dilations, pads, out, group, og = deform_geometry(node, a)
    n, c, d = x.shape[0], x.shape[1], len(kernel)
    k = math.prod(kernel)
    off = off.astype(np.float64).reshape((n, og, k, d) + out)
    mask = np.ones((n, og, k) + out) if mask is None else mask.astype(np.float64).reshape((n, og, k) + out)
    cpg = c // og
    cols = np.empty((n, c, k) + out)
    grids = np.meshgrid(*[np.arange(o) for o in out], indexing="ij")
    for j, kpos in enumerate(np.ndindex(*kernel)):
        for g in range(og):
            coords = [(grids[i] * strides[i] - pads[i] + kpos[i] * dilations[i])[None] + off[:, g, j, i]
                      for i in range(d)]
            xs = x[:, g * cpg:(g + 1) * cpg]
            cols[:, g * cpg:(g + 1) * cpg, j] = sample(xs, coords, "linear", "zeros", True) * mask[:, g, j][:, None]
    oc = w.shape[0]
    icg, ocg = c // group, oc // group
    y = np.empty((n, oc) + out)
    wf = w.astype(np.float64).reshape(oc, icg, k)
    for g in range(group):
        y[:, g * ocg:(g + 1) * ocg] = np.einsum("ock,nck...->no...", wf[g * ocg:(g + 1) * ocg],
                                                cols[:, g * icg:(g + 1) * icg])
    if b is not None:
        y += b.astype(np.float64).reshape((1, oc) + (1,) * d)
    return [y.astype(x.dtype)]


def _deform_flops(node: Node, a: dict) -> int:
    w = node.input(1)
    return node.outputs[0].size * 2 * math.prod(w.shape[1:]) * 3


register(OpSpec("DeformConv", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _deform_infer, _deform_conv,
                num_inputs=(3, 5),
                attrs={"dilations": None, "group": 1, "kernel_shape": None, "offset_group": 1, "pads": None,
                       "strides": None},
                flops_fn=_deform_flops, dtypes=FLOATS))


# RoiAlign --------------------------------------------------------------------------------------
ROI_MODES = ("avg", "max")
ROI_COORD_MODES = ("half_pixel", "output_half_pixel")


def roi_modes(node: Node, a: dict) -> tuple[str, bool]:
    """(pooling mode, half_pixel) of a RoiAlign node."""
    mode, ctm = _text(a["mode"]).lower(), _text(a["coordinate_transformation_mode"]).lower()
    if mode not in ROI_MODES:
        raise UnsupportedOpError(node.op_type, node.name, detail=f"mode={mode!r}")
    if ctm not in ROI_COORD_MODES:
        raise UnsupportedOpError(node.op_type, node.name, detail=f"coordinate_transformation_mode={ctm!r}")
    return mode, ctm == "half_pixel"


def _roi_infer(node: Node, a: dict):
    x, rois, idx = node.input(0), node.input(1), node.input(2)
    roi_modes(node, a)
    if len(x.shape) != 4:
        raise shape_error(node, f"X must be (N, C, H, W), got {x.shape}")
    if len(rois.shape) != 2 or rois.shape[1] != 4 or tuple(idx.shape) != (rois.shape[0],):
        raise shape_error(node, f"rois {rois.shape} must be (num_rois, 4) and batch_indices {idx.shape} "
                                f"(num_rois,)")
    if rois.dtype != x.dtype or idx.dtype not in INDEX_TYPES:
        raise shape_error(node, f"rois ({rois.dtype}) must have X's type ({x.dtype}), batch_indices "
                                f"({idx.dtype}) an integer type")
    oh, ow, sr = int(a["output_height"]), int(a["output_width"]), int(a["sampling_ratio"])
    if oh < 1 or ow < 1 or sr < 0:
        raise shape_error(node, f"output_height {oh} and output_width {ow} must be positive, sampling_ratio "
                                f"{sr} not negative")
    return out_type((rois.shape[0], x.shape[1], oh, ow), x.dtype)


# The most sampling points one output bin of RoiAlign's adaptive grid (``sampling_ratio`` 0) may
# take: a 7 x 7 output over a 7000 x 7000 box is 1000 x 1000. A larger grid comes from a box far
# outside any image (coordinates like 1e12), whose loops would run for hours: a fault instead.
ROI_MAX_BIN_SAMPLES = 1 << 20


def roi_box_message(node: Node) -> str:
    return f"node '{node.name}' (RoiAlign): a box coordinate (scaled) or its width or height is not finite"


def roi_grid_message(node: Node) -> str:
    return (f"node '{node.name}' (RoiAlign): a box's adaptive sampling grid exceeds {ROI_MAX_BIN_SAMPLES} points "
            f"per output bin (a box far larger than any image)")


def roi_box(roi: np.ndarray, a: dict, half_pixel: bool, node: Node):
    """(start_h, start_w, bin_h, bin_w, grid_h, grid_w) of one box, in the boxes' element type;
    ``InputError`` for a box that is not finite or whose adaptive grid is too large (the C code's faults)."""
    t = roi.dtype.type
    scale, off = t(a["spatial_scale"]), t(0.5 if half_pixel else 0.0)
    with np.errstate(over="ignore", invalid="ignore"):  # infinite boxes are refused below
        x0, y0, x1, y1 = (roi[i] * scale - off for i in range(4))
        rw, rh = x1 - x0, y1 - y0
    if not half_pixel:
        rw, rh = max(rw, t(1)), max(rh, t(1))
    oh, ow, sr = int(a["output_height"]), int(a["output_width"]), int(a["sampling_ratio"])
    bh, bw = rh / t(oh), rw / t(ow)
    if not all(np.isfinite(v) for v in (x0, y0, x1, y1, rw, rh)):
        raise InputError(roi_box_message(node))
    if sr > 0:
        return y0, x0, bh, bw, sr, sr
    ghd, gwd = float(np.ceil(rh / t(oh))), float(np.ceil(rw / t(ow)))
    if ghd >= 1 and gwd >= 1 and ghd * gwd > ROI_MAX_BIN_SAMPLES:
        raise InputError(roi_grid_message(node))
    if ghd < 1 or gwd < 1:
        return y0, x0, bh, bw, 0, 0
    return y0, x0, bh, bw, int(ghd), int(gwd)


def _roi_corners(pos: np.ndarray, size: int):
    """Low/high neighbour and the low weight of bilinear sampling along one axis (RoiAlign's rules)."""
    p = np.minimum(np.maximum(pos, 0), size)  # past ``size`` is skipped (weights 0): no huge value is cast
    low = np.trunc(p).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    p = np.where(edge, low.astype(p.dtype), p)
    frac = p - low
    return low, high, frac


def _roi_align(ins, a, node):
    x, rois, batch = ins[0], ins[1], ins[2]
    mode, half = roi_modes(node, a)
    n, c, h, w = x.shape
    oh, ow = int(a["output_height"]), int(a["output_width"])
    y = np.zeros((rois.shape[0], c, oh, ow))
    t = rois.dtype.type
    for r in range(rois.shape[0]):
        b = int(batch[r])
        if not 0 <= b < n:
            raise InputError(f"node '{node.name}' (RoiAlign): batch index {b} out of range for {n} images")
        y0, x0, bh, bw, gh, gw = roi_box(rois[r], a, half, node)
        if gh < 1 or gw < 1:
            continue
        iy = (np.arange(gh) + t(0.5)).astype(rois.dtype)
        ix = (np.arange(gw) + t(0.5)).astype(rois.dtype)
        ys = y0 + np.arange(oh, dtype=rois.dtype)[:, None] * bh + iy[None, :] * bh / t(gh)  # (oh, gh)
        xs = x0 + np.arange(ow, dtype=rois.dtype)[:, None] * bw + ix[None, :] * bw / t(gw)  # (ow, gw)
        yv = ys.astype(np.float64)
        xv = xs.astype(np.float64)
        skip = (yv[:, :, None, None] < -1.0) | (yv[:, :, None, None] > h) \
            | (xv[None, None] < -1.0) | (xv[None, None] > w)                                  # (oh, gh, ow, gw)
        yl, yh_, ly = _roi_corners(yv, h)
        xl, xh, lx = _roi_corners(xv, w)
        hy, hx = 1.0 - ly, 1.0 - lx
        img = x[b].astype(np.float64)                                                     # (C, H, W)

        def corner(yi, xi, img=img):
            return img[:, yi[:, :, None, None], xi[None, None]]                          # (C, oh, gh, ow, gw)

        ws = [hy[:, :, None, None] * hx[None, None], hy[:, :, None, None] * lx[None, None],
              ly[:, :, None, None] * hx[None, None], ly[:, :, None, None] * lx[None, None]]
        ws = [np.where(skip, 0.0, wt) for wt in ws]
        # a skipped point contributes exactly 0 (not 0 times a pixel that may be NaN or infinite)
        terms = [np.where(skip, 0.0, wt * corner(yi, xi))
                 for wt, (yi, xi) in zip(ws, ((yl, xl), (yl, xh), (yh_, xl), (yh_, xh)), strict=True)]
        if mode == "avg":
            s = ((terms[0] + terms[1]) + terms[2]) + terms[3]
            y[r] = s.sum(axis=(2, 4)) / max(gh * gw, 1)
        else:
            m = np.maximum(np.maximum(np.maximum(terms[0], terms[1]), terms[2]), terms[3])
            y[r] = m.max(axis=(2, 4))
    return [y.astype(x.dtype)]


register(OpSpec("RoiAlign", Category.OUT_ELEMWISE_FUSABLE, Mapping.MANY_TO_MANY, _roi_infer, _roi_align,
                num_inputs=(3, 3),
                attrs={"coordinate_transformation_mode": "half_pixel", "mode": "avg", "output_height": 1,
                       "output_width": 1, "sampling_ratio": 0, "spatial_scale": 1.0},
                flops_fn=lambda node, a: 8 * node.outputs[0].size, dtypes=FLOATS))


# MaxUnpool -------------------------------------------------------------------------------------
def unpool_shapes(node: Node, a: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the shape the indices address, the output shape) of a MaxUnpool node."""
    x, ind = node.input(0), node.input(1)
    d = len(x.shape) - 2
    if d < 1 or tuple(ind.shape) != tuple(x.shape) or ind.dtype != np.int64:
        raise shape_error(node, f"X {x.shape} must be (N, C, D1, ...) and I int64 of its shape, got {ind.shape} "
                                f"{ind.dtype}")
    if a.get("kernel_shape") is None:
        raise shape_error(node, "kernel_shape is required")
    kernel = int_attrs(node, a, "kernel_shape", d, 1)
    strides = int_attrs(node, a, "strides", d, 1)
    pads = int_attrs(node, a, "pads", 2 * d, 0)
    inferred = tuple(x.shape[:2]) + tuple((x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[d + i] + kernel[i]
                                          for i in range(d))
    if min(inferred) < 1:
        raise shape_error(node, f"the unpooled shape {inferred} is empty")
    given = const_input(node, 2, "output_shape") if len(node.inputs) > 2 else None
    if given is None:
        return inferred, inferred
    out = tuple(int(v) for v in np.asarray(given).reshape(-1))
    if len(out) != len(inferred) or any(o < i for o, i in zip(out, inferred, strict=True)):
        raise shape_error(node, f"output_shape {list(out)} must hold the unpooled shape {list(inferred)}")
    return inferred, out


def _unpool_infer(node: Node, a: dict):
    _, out = unpool_shapes(node, a)
    return out_type(out, node.input(0).dtype)


def _max_unpool(ins, a, node):
    x, ind = ins[0], ins[1]
    inferred, out = unpool_shapes(node, a)
    flat = np.zeros(math.prod(inferred), dtype=x.dtype)
    i = ind.reshape(-1)
    if i.size and (i.min() < 0 or i.max() >= flat.size):
        raise InputError(f"node '{node.name}' (MaxUnpool): indices out of range for {flat.size} elements")
    flat[i] = x.reshape(-1)
    y = np.zeros(out, dtype=x.dtype)
    y[tuple(slice(0, s) for s in inferred)] = flat.reshape(inferred)
    return [y]


register(OpSpec("MaxUnpool", Category.OPAQUE, Mapping.MANY_TO_MANY, _unpool_infer, _max_unpool,
                num_inputs=(2, 3), attrs={"kernel_shape": None, "pads": None, "strides": None},
                flops_per_element=0.0))
