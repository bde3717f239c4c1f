"""Families for the detection and vision ops the first generators left out: RoiAlign, MaxUnpool
(after a MaxPool's Indices), DeformConv, Col2Im, and Det.

Each draws a valid geometry on a pool value and states a magnitude bound for its output, as
every family does (``family``): RoiAlign and MaxUnpool never exceed their input (bilinear weights
sum to at most 1; unpooling only moves values), DeformConv's weights have an L1 norm per output
channel of at most ``gain`` and its mask lies in [0, 1], Col2Im adds at most ``ceil(block / stride)``
columns per axis into one pixel, and Det reads a diagonally dominant matrix (``m * bound + 1`` added
on the diagonal), well conditioned, so float32 elimination stays within the comparison's relative
tolerance of the float64 reference.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.ir.graph import Value
from opfuse.testing.family import divisors, fits, max_abs, rank_in, size
from opfuse.testing.graph_draft import MAX_CHANNELS, MAX_ELEMENTS, GraphDraft

ROI_MODES = ("avg", "max")
ROI_COORDINATES = ("half_pixel", "output_half_pixel")
DET_MAX_SIZE = 4


def roi_align(d: GraphDraft) -> None:
    """RoiAlign of a 4-D value over 1-3 constant boxes (partly outside the image sometimes, some
    degenerate), any batch index, adaptive or fixed sampling grids, both modes and coordinate modes."""
    x = d.pick(rank_in(4))
    n, c, h, w = x.shape
    rois = d.integer(1, 3)
    oh, ow = d.integer(1, 3), d.integer(1, 3)
    while not fits((rois, c, oh, ow)):
        oh, ow = max(1, oh // 2), max(1, ow // 2)
        rois = max(1, rois // 2)
    scale = d.choice((1.0, 0.5, 2.0))
    boxes = np.empty((rois, 4), np.float32)
    for r in range(rois):
        x0, y0 = d.rng.uniform(-1.0, w / scale), d.rng.uniform(-1.0, h / scale)
        boxes[r] = (x0, y0, x0 + d.rng.uniform(0.0, 1.2 * w / scale), y0 + d.rng.uniform(0.0, 1.2 * h / scale))
    batch = d.rng.integers(0, n, size=rois).astype(np.int64)
    d.op("RoiAlign", x, d.const("rois", boxes), d.const("batch_indices", batch), bound=d.bound(x),
         mode=d.choice(ROI_MODES), coordinate_transformation_mode=d.choice(ROI_COORDINATES),
         output_height=oh, output_width=ow, sampling_ratio=d.choice((0, 1, 2)), spatial_scale=scale)


def max_unpool(d: GraphDraft) -> None:
    """MaxPool with its Indices output, then MaxUnpool of the pooled values at those indices (windows
    may overlap: the same element twice carries the same value) where the unpooling infers MaxPool's input
    shape, sometimes into a larger ``output_shape``. Sometimes the Indices are column-major (``storage_order``
    1) and only an output."""
    x = d.pick(rank_in(4))
    spatial = x.shape[2:]
    kernel = [d.integer(1, min(3, L)) for L in spatial]
    stride = [d.choice((1, 2)) if k > 1 else 1 for k in kernel]
    order = 1 if d.rarely() else 0
    y, idx = d.op("MaxPool", x, bound=(d.bound(x), 0.0), num_outputs=2, storage_order=order, kernel_shape=kernel,
                  strides=stride)
    if order == 1 or "MaxUnpool" not in d.ops:
        return
    # The Indices address MaxPool's input, the unpooling the shape it infers: the two agree unless the windows
    # leave a remainder (then the indices would address another layout). ``output_shape`` may add a margin:
    # the inferred shape sits in its corner (the ONNX spec's node test; onnxruntime reads it otherwise).
    inferred = list(x.shape[:2]) + [(o - 1) * s + k for o, s, k in zip(y.shape[2:], stride, kernel, strict=True)]
    if inferred != list(x.shape):
        return
    grown = inferred[:2] + [v + d.integer(0, 1) for v in inferred[2:]]
    shape = [d.ints("output_shape", grown)] if d.flag() and fits(grown) else []
    d.op("MaxUnpool", y, idx, *shape, bound=d.bound(x), kernel_shape=kernel, strides=stride)


def deform_input(v: Value) -> bool:
    return len(v.shape) == 4 and v.shape[1] <= MAX_CHANNELS


def deform_conv(d: GraphDraft) -> None:
    """DeformConv of a 4-D value: 1-3 kernels, stride 1 or 2, pads, groups and offset groups, a
    constant offset field reaching past the image, optional bias and mask."""
    x = d.pick(deform_input)
    n, c, h, w = x.shape
    kh, kw = d.integer(1, min(3, h + 1)), d.integer(1, min(3, w + 1))
    sh, sw = d.choice((1, 2)), d.choice((1, 2))
    pads = [d.integer(0, 1) for _ in range(4)]
    oh = (h + pads[0] + pads[2] - kh) // sh + 1
    ow = (w + pads[1] + pads[3] - kw) // sw + 1
    if oh < 1 or ow < 1:
        pads, sh, sw = [1, 1, 1, 1], 1, 1
        oh, ow = h + 3 - kh, w + 3 - kw
    group = d.choice([g for g in divisors(c) if g <= 4])
    og = d.choice([g for g in divisors(c) if g <= 2])
    m = group * d.integer(1, max(1, 8 // group))
    k = kh * kw
    while m > group and not fits((n, m, oh, ow)):
        m -= group
    if not (fits((n, m, oh, ow)) and fits((n, og * k * 2, oh, ow)) and fits((n, c, k, oh, ow))):
        return
    wt, gain = d.linear_weight((m, c // group, kh, kw), (1, 2, 3))
    inputs: list[Value | None] = [x, d.const("w", wt), d.const("offset", d.uniform((n, og * k * 2, oh, ow), -1.5, 1.5))]
    bias_max = 0.0
    if d.flag():
        bias = d.uniform((m,), -0.5, 0.5)
        inputs.append(d.const("b", bias))
        bias_max = max_abs(bias)
    if d.flag():
        if len(inputs) == 3:
            inputs.append(None)
        inputs.append(d.const("mask", d.uniform((n, og * k, oh, ow), 0.0, 1.0)))
    d.op("DeformConv", *inputs, bound=gain * d.bound(x) + bias_max, group=group, offset_group=og,
         kernel_shape=[kh, kw], strides=[sh, sw], pads=pads)


def col2im_input(v: Value) -> bool:
    return len(v.shape) == 3


def col2im(d: GraphDraft) -> None:
    """Col2Im of an (N, C * prod(block), L) value: L split into blocks along one or two axes,
    strides 1 or 2, dilation 2 sometimes, pads that the image crops; every block fits the image."""
    x = d.pick(col2im_input)
    n, cols, length = x.shape
    block_size = d.choice(divisors(cols))
    if not d.rarely():  # two axes (one may be 1); onnxruntime misplaces channels over one axis
        b0 = d.choice(divisors(block_size))
        block = [b0, block_size // b0]
        l0 = d.choice(divisors(length))
        blocks = [l0, length // l0]
    else:
        block, blocks = [block_size], [length]
    r = len(block)
    strides = [d.choice((1, 2)) for _ in range(r)]
    dilations = [2 if b > 1 and d.rarely() else 1 for b in block]
    pads = [0] * (2 * r)
    image = []
    for i in range(r):
        span = (blocks[i] - 1) * strides[i] + dilations[i] * (block[i] - 1) + 1
        p = d.integer(0, 1) if span > 2 else 0
        pads[i], pads[r + i] = p, 0
        image.append(span - p)
    if not fits((n, cols // block_size) + tuple(image)):
        return
    gain = math.prod(math.ceil(dil * (b - 1) / s) + 1 if b > 1 else 1
                     for b, s, dil in zip(block, strides, dilations, strict=True))
    d.op("Col2Im", x, d.ints("image_shape", image), d.ints("block_shape", block), bound=gain * d.bound(x),
         strides=strides, dilations=dilations, pads=pads)


def det(d: GraphDraft) -> None:
    """Det of ``D * I + x`` for a value ``x`` of shape (..., m, m) (a new graph input when the pool
    has none), ``D = m * bound(x) + 1``: every row diagonally dominant, well conditioned, the
    determinant at most ``(D + bound(x))^m``."""
    squares = d.candidates(det_input)
    if squares:
        x = d.pick_from(squares)
    elif d.can_add_input():
        m = d.integer(1, DET_MAX_SIZE)
        x = d.new_input((d.integer(1, 3), m, m))
    else:
        return
    m = x.shape[-1]
    diagonal = m * d.bound(x) + 1.0
    eye = d.const("diagonal", (diagonal * np.eye(m)).astype(np.float32))
    a = d.op("Add", x, eye, bound=diagonal + d.bound(x))
    d.op("Det", a, bound=(diagonal + d.bound(x)) ** m)


def det_input(v: Value) -> bool:
    """A batch of square matrices: (..., m, m) of rank 3 or more (Det's output joins the pool, and
    families expect values of rank 1 or more)."""
    return len(v.shape) >= 3 and v.shape[-1] == v.shape[-2] and v.shape[-1] <= DET_MAX_SIZE \
        and size(v.shape) <= MAX_ELEMENTS
