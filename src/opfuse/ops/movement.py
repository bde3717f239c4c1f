"""Data movement that rearranges blocks: Tile, DepthToSpace, SpaceToDepth.

All are TVM ``INJECTIVE``: each output element is one input element at an index computed from
the output index (``index_map`` below, shared with the C backend's rules). Tile repeats the
input (DNNFusion one-to-many); DepthToSpace and SpaceToDepth are bijections that move each
element once (one-to-one; they are not mere relabellings of a row-major order, so an anchor's
epilogue never holds them).

    Tile:          y[i] = x[i mod shape(x)],  shape(y) = shape(x) * repeats
    DepthToSpace:  y[n, c, h, w] = x[n, ch(c, h mod b, w mod b), h / b, w / b]
                   DCR: ch = (h mod b * b + w mod b) * C' + c;   CRD: ch = c * b^2 + h mod b * b + w mod b
    SpaceToDepth:  y[n, c, h, w] = x[n, c mod C, h * b + bh, w * b + bw]  with c = (bh * b + bw) * C + c'
                   (DCR; CRD, from opset 28: c = c' * b^2 + bh * b + bw)
"""
from __future__ import annotations

import numpy as np

from opfuse.errors import UnsupportedOpError
from opfuse.ir.graph import Node
from opfuse.ops.common import const_input, out_type, shape_error
from opfuse.ops.registry import Category, Mapping, OpSpec, register


# Tile -------------------------------------------------------------------------------------------
def tile_repeats(node: Node) -> list[int]:
    x = node.input(0)
    reps = const_input(node, 1, "repeats")
    reps_list = [int(r) for r in np.asarray(reps).reshape(-1)]
    if len(reps_list) != len(x.shape) or min(reps_list, default=0) < 0:
        raise shape_error(node, f"repeats {reps_list} must be {len(x.shape)} non-negative integers")
    return reps_list


def _tile_infer(node: Node, a: dict):
    x = node.input(0)
    return out_type(tuple(d * r for d, r in zip(x.shape, tile_repeats(node), strict=True)), x.dtype)


register(OpSpec("Tile", Category.INJECTIVE, Mapping.ONE_TO_MANY, _tile_infer,
                lambda ins, a, node: [np.tile(ins[0], tile_repeats(node))], num_inputs=(2, 2),
                flops_per_element=0))


# DepthToSpace / SpaceToDepth --------------------------------------------------------------------
def _block_check(node: Node, a: dict) -> tuple[int, str]:
    b = a["blocksize"]
    if b is None or int(b) < 1:
        raise shape_error(node, "attribute 'blocksize' must be a positive integer")
    mode = a.get("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOpError(node.op_type, node.name, detail=f"mode={mode!r} (DCR or CRD)")
    if len(node.input(0).shape) != 4:
        raise shape_error(node, f"input must be 4-D (N, C, H, W), got shape {node.input(0).shape}")
    return int(b), mode


def _d2s_infer(node: Node, a: dict):
    b, _ = _block_check(node, a)
    n, c, h, w = node.input(0).shape
    if c % (b * b):
        raise shape_error(node, f"channels {c} are not a multiple of blocksize^2 = {b * b}")
    return out_type((n, c // (b * b), h * b, w * b), node.input(0).dtype)


def _d2s(ins, a, node):
    x = ins[0]
    b, mode = _block_check(node, a)
    n, c, h, w = x.shape
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [np.ascontiguousarray(t.reshape(n, c // (b * b), h * b, w * b))]


def _s2d_infer(node: Node, a: dict):
    b, _ = _block_check(node, a)
    n, c, h, w = node.input(0).shape
    if h % b or w % b:
        raise shape_error(node, f"height {h} and width {w} must be multiples of blocksize {b}")
    return out_type((n, c * b * b, h // b, w // b), node.input(0).dtype)


def _s2d(ins, a, node):
    x = ins[0]
    b, mode = _block_check(node, a)
    n, c, h, w = x.shape
    t = x.reshape(n, c, h // b, b, w // b, b)
    t = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return [np.ascontiguousarray(t.reshape(n, c * b * b, h // b, w // b))]


register(OpSpec("DepthToSpace", Category.INJECTIVE, Mapping.ONE_TO_ONE, _d2s_infer, _d2s,
                attrs={"blocksize": None, "mode": "DCR"}, flops_per_element=0))
register(OpSpec("SpaceToDepth", Category.INJECTIVE, Mapping.ONE_TO_ONE, _s2d_infer, _s2d,
                attrs={"blocksize": None, "mode": "DCR"}, flops_per_element=0))
