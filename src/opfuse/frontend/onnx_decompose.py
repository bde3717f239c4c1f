"""Standard ops imported as a few ops opfuse has, so they fuse and run in C like any others.

Each canonicalizer below writes the op's definition out in canonical IR ops (constants that a
definition computes from attributes or static shapes are folded here):

* ``DequantizeLinear(x, s, zp)``     = ``(float(x) - float(zp)) * s``, in float32, then the
  scale's type (``output_dtype`` when given);
* ``QuantizeLinear(x, s, zp)``       = ``Cast(Clip(Round(x / s) + zp, lo, hi))`` for the integer
  targets (uint8, int8, uint16, int16): round half to even, saturate to the type's range; ``s``
  and ``zp`` per tensor, per ``axis`` (a vector) or per block of ``block_size`` along ``axis``
  (repeated to the input's extent: folded when constant);
* ``LpNormalization(x; p, axis)``    = ``x / ReduceLp(x, axis, keepdims)`` (p = 1 or 2), a zero
  norm taken as 1 (so a zero row stays zero, as onnxruntime);
* ``LpPool(x; p, kernel, ...)``      = ``(AveragePool(|x|^p; count_include_pad=1) * K)^(1/p)``,
  K the window size (every window counts K positions: no ceil_mode overhang);
* ``GlobalLpPool(x; p)``            = ``ReduceL1`` / ``ReduceL2`` over the spatial axes (p = 1, 2),
  ``ReduceSum(|x|^p)^(1/p)`` otherwise;
* ``LRN(x; size, alpha, beta, bias)`` = ``x / (bias + alpha / size * S)^beta``, S the sum of
  ``x^2`` over the ``size`` channels around each one, so ``alpha / size * S`` is ``alpha`` times
  an AveragePool (``count_include_pad=1``) of ``x^2`` viewed as ``(N, 1, C, rest)`` with a
  ``(size, 1)`` window;
* ``InstanceNormalization(x, s, b)`` = ``LayerNormalization(x; axis=2, scale=1) * s + b`` with
  ``s``, ``b`` per channel (shaped ``(C, 1, ..., 1)``);
* ``EyeLike(x; k, dtype)``           = the constant ``eye`` of ``x``'s (static) shape.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from opfuse.errors import ModelError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.ir.graph import Value

QUANT_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.uint8, np.int8, np.uint16, np.int16)}
F32 = np.dtype(np.float32)
KEPT_DEQUANTIZED = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32))  # constants DQ keeps unfolded


class _Writer:
    """Emits the nodes of one decomposition under fresh names derived from the ONNX node's."""

    def __init__(self, ctx: ImportContext, node: OnnxNode):
        self.ctx, self.node = ctx, node

    def const(self, tag: str, data) -> Value:
        return self.ctx.const(self.ctx.fresh_value(f"{self.node.name}_{tag}"), np.asarray(data))

    def op(self, op_type: str, inputs: list, attrs: dict | None = None, *, last: bool = False,
           fold: bool = True) -> Value:
        """One node; ``last`` gives it the ONNX node's name and output name; ``fold=False`` keeps it a
        node even when its inputs are constants."""
        ctx, node = self.ctx, self.node
        name = node.name if last else ctx.fresh_node(f"{node.name}/{op_type}")
        out = node.outputs[0] if last else ctx.fresh_value(f"{node.outputs[0]}_{op_type.lower()}")
        return ctx.emit(op_type, inputs, dict(attrs or {}), name=name, outputs=[out], fold=fold)[0]

    def cast(self, v: Value, dtype, *, last: bool = False, fold: bool = True) -> Value:
        if np.dtype(dtype) == v.dtype and not last:
            return v
        return self.op("Cast", [v], {"to": int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))}, last=last,
                       fold=fold)


def _per_axis(w: _Writer, param: Value, x: Value, axis: int, block: int) -> Value:
    """``param`` (a scale or zero point) shaped to broadcast against ``x``: a scalar as it is,
    a vector along ``axis``, or blocks along ``axis`` repeated ``block`` times."""
    rank = len(x.shape)
    if param.size == 1 and not block:
        return param
    axis = axis % rank
    if not block:
        if param.shape != (x.shape[axis],):
            raise ShapeError(f"node '{w.node.name}' ({w.node.op_type}): scale/zero point of shape {param.shape} "
                             f"for axis {axis} of an input of shape {x.shape}")
        shape = [1] * rank
        shape[axis] = x.shape[axis]
        return w.op("Reshape", [param, w.const("shape", np.array(shape, np.int64))])
    if len(param.shape) != rank or param.shape[axis] * block < x.shape[axis]:
        raise ShapeError(f"node '{w.node.name}' ({w.node.op_type}): blocked scale of shape {param.shape} does not "
                         f"cover an input of shape {x.shape} with block_size {block} on axis {axis}")
    if param.const is not None:
        full = np.repeat(param.const, block, axis=axis)
        full = np.take(full, np.arange(x.shape[axis]), axis=axis)
        return w.const("blocked", full)
    expanded = w.op("Unsqueeze", [param], {"axes": [axis + 1]})
    target = list(param.shape[:axis + 1]) + [block] + list(param.shape[axis + 1:])
    expanded = w.op("Expand", [expanded, w.const("blocks", np.array(target, np.int64))])
    merged = list(param.shape)
    merged[axis] *= block
    flat = w.op("Reshape", [expanded, w.const("merged", np.array(merged, np.int64))])
    if merged[axis] == x.shape[axis]:
        return flat
    starts, ends = np.array([0], np.int64), np.array([x.shape[axis]], np.int64)
    return w.op("Slice", [flat, w.const("s0", starts), w.const("s1", ends), w.const("ax", np.array([axis], np.int64))])


def _q_attrs(node: OnnxNode) -> tuple[int, int]:
    return int(node.attrs.get("axis", 1)), int(node.attrs.get("block_size", 0))


@canonicalizes("DequantizeLinear")
def dequantize_linear(ctx, node, inputs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    w = _Writer(ctx, node)
    axis, block = _q_attrs(node)
    out_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["output_dtype"])) \
        if node.attrs.get("output_dtype") else scale.dtype
    # A constant integer tensor (a weight, a bias) stays integer here: its Cast is not folded, so the
    # integer rules (``rules/integer_ops``) still see it; the pipeline folds the chains they leave.
    keep = ctx.keep_dequantized_constants and x.const is not None and x.dtype in KEPT_DEQUANTIZED
    y = w.cast(x, F32, fold=not keep)
    if zp is not None:
        y = w.op("Sub", [y, w.cast(_per_axis(w, zp, x, axis, block), F32)])
    y = w.op("Mul", [y, w.cast(_per_axis(w, scale, x, axis, block), F32)], last=out_dtype == F32)
    return [y if out_dtype == F32 else w.cast(y, out_dtype, last=True)]


@canonicalizes("QuantizeLinear")
def quantize_linear(ctx, node, inputs):
    x, scale = inputs[0], inputs[1]
    zp = inputs[2] if len(inputs) > 2 else None
    w = _Writer(ctx, node)
    axis, block = _q_attrs(node)
    if zp is not None:
        target = zp.dtype
    elif node.attrs.get("output_dtype"):
        target = np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["output_dtype"]))
    else:
        target = np.dtype(np.uint8)
    if target not in QUANT_RANGES:
        raise UnsupportedOpError("QuantizeLinear", node.name, ctx.opset,
                                 detail=f"output type {target} (opfuse quantizes to uint8, int8, uint16, int16)")
    work = np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["precision"])) if node.attrs.get("precision") \
        else x.dtype
    q = w.op("Div", [w.cast(x, work), w.cast(_per_axis(w, scale, x, axis, block), work)])
    q = w.op("Round", [q])
    if zp is not None:
        q = w.op("Add", [q, w.cast(_per_axis(w, zp, x, axis, block), work)])
    lo, hi = QUANT_RANGES[target]
    q = w.op("Clip", [q, w.const("lo", np.array(lo, work)), w.const("hi", np.array(hi, work))])
    return [w.cast(q, target, last=True)]


@canonicalizes("LpNormalization")
def lp_normalization(ctx, node, inputs):
    p = int(node.attrs.get("p", 2))
    if p not in (1, 2):
        raise UnsupportedOpError("LpNormalization", node.name, ctx.opset, detail=f"p={p} (1 or 2)")
    w = _Writer(ctx, node)
    x = inputs[0]
    norm = w.op("ReduceL1" if p == 1 else "ReduceL2", [x], {"axes": [int(node.attrs.get("axis", -1))], "keepdims": 1})
    zero, one = w.const("zero", np.array(0, x.dtype)), w.const("one", np.array(1, x.dtype))
    norm = w.op("Where", [w.op("Equal", [norm, zero]), one, norm])
    return [w.op("Div", [x, norm], last=True)]


@canonicalizes("LpPool")
def lp_pool(ctx, node, inputs):
    attrs = dict(node.attrs)
    p = int(attrs.pop("p", 2))
    if p < 1:
        raise UnsupportedOpError("LpPool", node.name, ctx.opset, detail=f"p={p}")
    if int(attrs.get("ceil_mode", 0)):
        raise UnsupportedOpError("LpPool", node.name, ctx.opset, detail="ceil_mode=1")
    kernel = attrs.get("kernel_shape")
    if not kernel:
        raise ModelError(f"LpPool node '{node.name}' has no kernel_shape")
    w = _Writer(ctx, node)
    x = inputs[0]
    dt = x.dtype
    powered = w.op("Abs", [x]) if p == 1 else (w.op("Mul", [x, x]) if p == 2 else
                                                w.op("Pow", [w.op("Abs", [x]), w.const("p", np.array(p, dt))]))
    avg = w.op("AveragePool", [powered], dict(attrs, count_include_pad=1))
    total = w.op("Mul", [avg, w.const("window", np.array(math.prod(kernel), dt))], last=p == 1)
    if p == 1:
        return [total]
    if p == 2:
        return [w.op("Sqrt", [total], last=True)]
    return [w.op("Pow", [total, w.const("inv_p", np.array(1.0 / p, dt))], last=True)]


@canonicalizes("InstanceNormalization")
def instance_normalization(ctx, node, inputs):
    x, scale, bias = inputs[:3]
    if len(x.shape) < 3:
        raise ShapeError(f"node '{node.name}' (InstanceNormalization): input must be (N, C, D1, ...), got {x.shape}")
    w = _Writer(ctx, node)
    channel = [x.shape[1]] + [1] * (len(x.shape) - 2)
    eps = float(node.attrs.get("epsilon", 1e-5))
    one = w.const("one", np.array(1, x.dtype))
    y = w.op("LayerNormalization", [x, one], {"axis": 2, "epsilon": eps})
    shape = w.const("channel", np.array(channel, np.int64))
    y = w.op("Mul", [y, w.op("Reshape", [scale, shape])])
    return [w.op("Add", [y, w.op("Reshape", [bias, shape])], last=True)]


@canonicalizes("EyeLike")
def eye_like(ctx, node, inputs):
    x = inputs[0]
    if len(x.shape) != 2:
        raise ShapeError(f"node '{node.name}' (EyeLike): input must be 2-D, got shape {x.shape}")
    dtype = np.dtype(helper.tensor_dtype_to_np_dtype(node.attrs["dtype"])) if node.attrs.get("dtype") is not None \
        else x.dtype
    return [ctx.const(node.outputs[0], np.eye(*x.shape, k=int(node.attrs.get("k", 0)), dtype=dtype))]


@canonicalizes("GlobalLpPool")
def global_lp_pool(ctx, node, inputs):
    x = inputs[0]
    p = int(node.attrs.get("p", 2))
    if len(x.shape) < 3 or p < 1:
        raise ShapeError(f"node '{node.name}' (GlobalLpPool): needs (N, C, D1, ...) and p >= 1, got {x.shape}, p={p}")
    w = _Writer(ctx, node)
    spatial = {"axes": list(range(2, len(x.shape))), "keepdims": 1}
    if p in (1, 2):
        return [w.op("ReduceL1" if p == 1 else "ReduceL2", [x], spatial, last=True)]
    total = w.op("ReduceSum", [w.op("Pow", [w.op("Abs", [x]), w.const("p", np.array(p, x.dtype))])], spatial)
    return [w.op("Pow", [total, w.const("inv_p", np.array(1.0 / p, x.dtype))], last=True)]


@canonicalizes("LRN")
def lrn(ctx, node, inputs):
    x = inputs[0]
    size = int(node.attrs["size"]) if "size" in node.attrs else 0
    if len(x.shape) < 3 or size < 1:
        raise ShapeError(f"node '{node.name}' (LRN): needs (N, C, D1, ...) and size >= 1, got {x.shape}, size={size}")
    alpha, beta = float(node.attrs.get("alpha", 1e-4)), float(node.attrs.get("beta", 0.75))
    bias = float(node.attrs.get("bias", 1.0))
    w = _Writer(ctx, node)
    n, c = x.shape[:2]
    rest = math.prod(x.shape[2:])
    sq = w.op("Reshape", [w.op("Mul", [x, x]), w.const("as_2d", np.array([n, 1, c, rest], np.int64))])
    lo = (size - 1) // 2
    window = w.op("AveragePool", [sq], {"kernel_shape": [size, 1], "pads": [lo, 0, size - 1 - lo, 0],
                                        "count_include_pad": 1})
    window = w.op("Reshape", [window, w.const("back", np.array(x.shape, np.int64))])
    dt = x.dtype
    scaled = w.op("Mul", [window, w.const("alpha", np.array(alpha, dt))])  # alpha / size * S = alpha * mean
    base = w.op("Add", [scaled, w.const("bias", np.array(bias, dt))])
    return [w.op("Div", [x, w.op("Pow", [base, w.const("beta", np.array(beta, dt))])], last=True)]
