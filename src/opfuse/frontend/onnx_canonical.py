"""Canonicalizers: each ONNX node (any opset 7-28) becomes nodes in the canonical IR form.

A canonicalizer is ``fn(ctx, node, inputs) -> [Value | None]``, registered with
``@canonicalizes(op_type, ...)``: it reads the ONNX node (``node``: op,
op version, attributes as plain Python, input/output names), the already-imported input values,
emits IR nodes through ``ctx.emit`` (which infers shapes and folds constants), and returns one
value per ONNX output (``None`` for an output nobody reads). Ops without one are emitted as
they are. The canonical forms are described in ``opfuse.ops`` and the common brief:

* operands that decide shapes are attributes: Squeeze/Unsqueeze/Reduce* ``axes``, Split ``split``;
* operands that older opsets gave as attributes are inputs, as in opset 11+: Pad's ``pads`` and
  ``value`` (before 11), Slice's ``starts``/``ends``/``axes`` (before 10), Clip's bounds (before 11);
* Softmax normalises along one ``axis``; Resize has the opset-11 inputs and attributes (Resize-10
  and Upsample become the Resize they mean);
* Constant, Identity and inference Dropout disappear (their outputs are rewired); CastLike is the
  Cast to its second input's type, and Size (static shapes) a constant.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from opfuse.errors import ModelError, ShapeError, UnsupportedOpError
from opfuse.frontend.onnx_opsets import (AXES_INPUT_SINCE, DROPOUT_INPUTS_SINCE, PAD_INPUTS_SINCE,
                                         RESIZE_ROI_SINCE, ROI_ALIGN_CTM_SINCE, SLICE_INPUTS_SINCE,
                                         SOFTMAX_LEGACY_DEFAULT_AXIS, SOFTMAX_SINGLE_AXIS_SINCE, SPLIT_INPUT_SINCE,
                                         SPLIT_NUM_OUTPUTS_SINCE, UPSAMPLE_SCALES_INPUT_SINCE)
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.ir.graph import Value

Canonicalizer = Callable[[ImportContext, OnnxNode, list], list]
CANONICALIZERS: dict[str, Canonicalizer] = {}

# Ops the importer removes entirely (their outputs are rewired), so opfuse needs no OpSpec.
REMOVED_OPS = frozenset({"Constant", "Identity", "Dropout"})
# Ops with no OpSpec of their own that the importer rewrites into ops that have one.
REWRITTEN_OPS = frozenset({"Upsample", "Scatter", "CastLike", "Size", "DequantizeLinear", "QuantizeLinear",
                           "QLinearConv", "QLinearMatMul", "ConvInteger", "MatMulInteger",
                           "LpNormalization", "LpPool", "GlobalLpPool", "LRN", "InstanceNormalization",
                           "EyeLike", "Einsum", "DFT", "STFT", "MelWeightMatrix", "Compress",
                           "NonZero", "Unique", "NonMaxSuppression", "TensorScatter", "TfIdfVectorizer",
                           "LinearAttention"})

# Outputs from this index on are optional extras (masks, indices, training statistics):
# dropped when nobody reads them, so the IR node has just the outputs opfuse computes.
OPTIONAL_OUTPUTS_FROM = {
    "Dropout": 1,
    "MaxPool": 1,
    "BatchNormalization": 1,
    "LayerNormalization": 1,
}


def canonicalizes(*op_types: str):
    def register(fn: Canonicalizer) -> Canonicalizer:
        for op in op_types:
            CANONICALIZERS[op] = fn
        return fn
    return register


def emit_as_is(ctx: ImportContext, node: OnnxNode, inputs: list, attrs: dict | None = None) -> list:
    """Emit ``node`` with (possibly rewritten) inputs and attributes, keeping its names."""
    outputs = list(node.outputs)
    keep = OPTIONAL_OUTPUTS_FROM.get(node.op_type)
    if keep is not None:
        while len(outputs) > keep and not ctx.is_used(outputs[-1]):
            outputs.pop()
    while inputs and inputs[-1] is None:
        inputs = inputs[:-1]
    values = ctx.emit(node.op_type, inputs, node.attrs if attrs is None else attrs,
                      name=node.name, outputs=outputs)
    return values + [None] * (len(node.outputs) - len(values))


def _axes_list(arr: np.ndarray | None) -> list[int] | None:
    """Constant axes as a list; an absent or empty tensor means "no axes given"."""
    if arr is None or arr.size == 0:
        return None
    return [int(a) for a in np.asarray(arr).reshape(-1)]


def _no_attribute(node: OnnxNode, key: str) -> None:
    """An operand that this op version takes as an input must not also appear as an attribute."""
    if key in node.attrs:
        raise ModelError(f"{node.op_type} node '{node.name}' has a '{key}' attribute, but {node.op_type}-"
                         f"{node.version} takes {key} as an input")


# Constants and no-ops ---------------------------------------------------------------------

_CONSTANT_SCALAR_ATTRS = {"value_float": np.float32, "value_int": np.int64}
_CONSTANT_LIST_ATTRS = {"value_floats": np.float32, "value_ints": np.int64}


@canonicalizes("Constant")
def constant(ctx, node, inputs):
    """``Constant`` becomes a constant value named after its output."""
    if len(node.attrs) != 1:
        raise ModelError(f"Constant node '{node.name}' must have exactly one value attribute, "
                         f"has {sorted(node.attrs)}")
    (key, val), = node.attrs.items()
    if key in ("value", "sparse_value"):
        arr = np.asarray(val)
    elif key in _CONSTANT_SCALAR_ATTRS:
        arr = np.array(val, dtype=_CONSTANT_SCALAR_ATTRS[key])
    elif key in _CONSTANT_LIST_ATTRS:
        arr = np.array(val, dtype=_CONSTANT_LIST_ATTRS[key]).reshape(-1)
    else:
        raise UnsupportedOpError("Constant", node.name, ctx.opset,
                                 detail=f"attribute '{key}' (string constants are not supported)")
    return [ctx.const(node.outputs[0], arr)]


@canonicalizes("Identity")
def identity(ctx, node, inputs):
    return [inputs[0]]


@canonicalizes("Dropout")
def dropout(ctx, node, inputs):
    """Inference Dropout is the identity; its mask (if read) is all true."""
    if node.version >= DROPOUT_INPUTS_SINCE:
        mode = ctx.const_operand(node, inputs, 2, "training_mode")
        if mode is not None and bool(np.asarray(mode).reshape(-1)[0]):
            raise UnsupportedOpError("Dropout", node.name, ctx.opset,
                                     detail="training_mode=true (only inference is supported)")
    x = inputs[0]
    results: list = [x]
    if len(node.outputs) > 1 and ctx.is_used(node.outputs[1]):
        shape = ctx.const(ctx.fresh_value(node.outputs[1] + "_shape"), np.array(x.shape, dtype=np.int64))
        results += ctx.emit("ConstantOfShape", [shape], {"value": np.array([True])},
                            name=node.name, outputs=[node.outputs[1]])
    return results + [None] * (len(node.outputs) - len(results))


# Attribute <-> input moves ----------------------------------------------------------------

@canonicalizes(*AXES_INPUT_SINCE)
def axes_as_attribute(ctx, node, inputs):
    """``axes`` as an attribute, whichever form the op version uses."""
    attrs = dict(node.attrs)
    if node.version >= AXES_INPUT_SINCE[node.op_type]:
        _no_attribute(node, "axes")
        axes = _axes_list(ctx.const_operand(node, inputs, 1, "axes"))
    else:
        axes = attrs.pop("axes", None) or None
    if axes is not None:
        attrs["axes"] = axes
    elif node.op_type == "Unsqueeze":
        raise ModelError(f"Unsqueeze node '{node.name}' has no axes")
    return emit_as_is(ctx, node, inputs[:1], attrs)


@canonicalizes("Split")
def split(ctx, node, inputs):
    """Explicit ``split`` sizes as an attribute (or none: an equal split)."""
    attrs = dict(node.attrs)
    if node.version >= SPLIT_INPUT_SINCE:
        _no_attribute(node, "split")
        sizes = ctx.const_operand(node, inputs, 1, "split")
        if sizes is not None and sizes.size:
            attrs["split"] = [int(s) for s in sizes.reshape(-1)]
    if node.version >= SPLIT_NUM_OUTPUTS_SINCE and "num_outputs" in attrs:
        attrs["split"] = _split_sizes_18(node, inputs[0], attrs.pop("num_outputs"), attrs.get("axis", 0))
    return emit_as_is(ctx, node, inputs[:1], attrs)


def _split_sizes_18(node, x: Value, n: int, axis: int) -> list[int]:
    """Split-18 ``num_outputs=n``: chunks of ceil(d/n), the last one smaller when d % n != 0."""
    if n != len(node.outputs) or n <= 0:
        raise ModelError(f"Split node '{node.name}' has num_outputs={n} but {len(node.outputs)} outputs")
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise ShapeError(f"Split node '{node.name}': axis {axis} out of range for rank {rank}")
    dim = x.shape[axis % rank]
    chunk = math.ceil(dim / n)
    sizes = [chunk] * (n - 1) + [dim - chunk * (n - 1)]
    if sizes[-1] < 0:
        raise ShapeError(f"Split node '{node.name}': dimension {dim} cannot be split into {n} outputs")
    return sizes


# Semantics that changed ---------------------------------------------------------------------

@canonicalizes("Softmax", "LogSoftmax", "Hardmax")
def softmax(ctx, node, inputs):
    """Before opset 13 Softmax(axis=a) is softmax over the flattened block ``x.shape[a:]`` (and
    so are LogSoftmax and Hardmax).

    When ``a`` is the last axis the two semantics agree; otherwise the importer writes the old
    meaning out: ``Reshape(Softmax(Flatten(x, axis=a), axis=-1), x.shape)``.
    """
    op = node.op_type
    if node.version >= SOFTMAX_SINGLE_AXIS_SINCE:
        return emit_as_is(ctx, node, inputs)
    x = inputs[0]
    rank = len(x.shape)
    axis = node.attrs.get("axis", SOFTMAX_LEGACY_DEFAULT_AXIS)
    if not -rank <= axis < max(rank, 1):
        raise ShapeError(f"Softmax node '{node.name}': axis {axis} out of range for rank {rank}")
    axis = axis % max(rank, 1)
    if axis >= rank - 1:
        return ctx.emit(op, [x], {"axis": -1}, name=node.name, outputs=node.outputs)
    flat = ctx.emit("Flatten", [x], {"axis": axis}, name=ctx.fresh_node(node.name + "_flatten"),
                    outputs=[ctx.fresh_value(node.outputs[0] + "_2d")])[0]
    sm = ctx.emit(op, [flat], {"axis": -1}, name=node.name,
                  outputs=[ctx.fresh_value(node.outputs[0] + "_softmax2d")])[0]
    shape = ctx.const(ctx.fresh_value(node.outputs[0] + "_shape"), np.array(x.shape, dtype=np.int64))
    return ctx.emit("Reshape", [sm, shape], {}, name=ctx.fresh_node(node.name + "_reshape"),
                    outputs=node.outputs)


@canonicalizes("Clip")
def clip(ctx, node, inputs):
    """Bounds as optional inputs; the old ``min``/``max`` attribute form is accepted too."""
    attrs = dict(node.attrs)
    if "min" not in attrs and "max" not in attrs:
        return emit_as_is(ctx, node, inputs)
    x = inputs[0]
    bounds = []
    for i, key in ((1, "min"), (2, "max")):
        given = inputs[i] if len(inputs) > i else None
        value = attrs.pop(key, None)
        if value is not None and given is None:
            given = ctx.const(ctx.fresh_value(f"{node.name}_{key}"), np.array(value, dtype=x.dtype))
        bounds.append(given)
    return emit_as_is(ctx, node, [x] + bounds, attrs)


@canonicalizes("Resize")
def resize(ctx, node, inputs):
    """Opset 11 marks an unused ``roi``/``scales`` with an empty tensor; the IR uses "absent".
    Resize-10 is the opset-11 Resize its semantics say (``_legacy_resize``)."""
    if node.version < RESIZE_ROI_SINCE:
        return _legacy_resize(ctx, node, inputs[0], ctx.const_operand(node, inputs, 1, "scales"))
    inputs = list(inputs)
    for i in (1, 2):
        v = inputs[i] if len(inputs) > i else None
        if v is not None and v.is_const and v.const.size == 0:
            inputs[i] = None
    return emit_as_is(ctx, node, inputs)


@canonicalizes("Upsample")
def upsample(ctx, node, inputs):
    """Upsample-7 (``scales`` attribute) and -9 (``scales`` input) are Resize-10."""
    if node.version >= UPSAMPLE_SCALES_INPUT_SINCE:
        _no_attribute(node, "scales")
        scales = ctx.const_operand(node, inputs, 1, "scales")
    else:
        scales = node.attrs.get("scales")
    if scales is None:
        raise ModelError(f"Upsample node '{node.name}' has no scales")
    return _legacy_resize(ctx, node, inputs[0], scales)


def _legacy_resize(ctx, node, x: Value, scales) -> list:
    """Resize-10 / Upsample: ``coord = out / scale`` (asymmetric); nearest takes the floor when an
    axis grows and the ceiling when it shrinks, as onnxruntime does (a mix of both is refused)."""
    mode = node.attrs.get("mode", "nearest")
    mode = "linear" if mode == "bilinear" else mode
    scales = np.asarray(scales, dtype=np.float32).reshape(-1)
    attrs = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "nearest":
        grows, shrinks = bool(np.any(scales > 1)), bool(np.any(scales < 1))
        if grows and shrinks:
            raise UnsupportedOpError(node.op_type, node.name, ctx.opset,
                                     detail=f"nearest mode with scales {scales.tolist()} that both enlarge and "
                                            f"shrink axes")
        attrs["nearest_mode"] = "ceil" if shrinks else "floor"
    s = ctx.const(ctx.fresh_value(node.name + "_scales"), scales)
    return ctx.emit("Resize", [x, None, s], attrs, name=node.name, outputs=node.outputs)


@canonicalizes("Pad")
def pad(ctx, node, inputs):
    """Before opset 11 ``pads`` and ``value`` are attributes; from 11 they are inputs."""
    if node.version >= PAD_INPUTS_SINCE:
        return emit_as_is(ctx, node, inputs)
    attrs = dict(node.attrs)
    x = inputs[0]
    pads = attrs.pop("pads", attrs.pop("paddings", None))
    if pads is None:
        raise ModelError(f"Pad node '{node.name}' has no pads")
    value = attrs.pop("value", 0.0)
    p = ctx.const(ctx.fresh_value(node.name + "_pads"), np.array(pads, dtype=np.int64))
    v = ctx.const(ctx.fresh_value(node.name + "_value"), np.array(value).astype(x.dtype))
    return emit_as_is(ctx, node, [x, p, v], attrs)


@canonicalizes("Slice")
def slice_(ctx, node, inputs):
    """Before opset 10 ``starts``/``ends``/``axes`` are attributes; from 10 they are inputs."""
    if node.version >= SLICE_INPUTS_SINCE:
        return emit_as_is(ctx, node, inputs)
    attrs = dict(node.attrs)
    operands = [inputs[0]]
    for key in ("starts", "ends", "axes"):
        given = attrs.pop(key, None)
        if given is None and key != "axes":
            raise ModelError(f"Slice node '{node.name}' has no {key}")
        if given is not None:
            operands.append(ctx.const(ctx.fresh_value(f"{node.name}_{key}"), np.array(given, dtype=np.int64)))
    return emit_as_is(ctx, node, operands, attrs)


@canonicalizes("BatchNormalization")
def batch_normalization(ctx, node, inputs):
    """BatchNormalization-7's ``spatial=0`` (statistics per activation, not per channel) is refused."""
    attrs = dict(node.attrs)
    if not int(attrs.pop("spatial", 1)):
        raise UnsupportedOpError("BatchNormalization", node.name, ctx.opset,
                                 detail="spatial=0 (per-activation statistics) is not supported")
    return emit_as_is(ctx, node, inputs, attrs)


@canonicalizes("CastLike")
def cast_like(ctx, node, inputs):
    """CastLike(x, like) = Cast(x, to=like's element type); ``like``'s data is never read."""
    from onnx import helper
    attrs = dict(node.attrs)
    attrs["to"] = int(helper.np_dtype_to_tensor_dtype(inputs[1].dtype))
    return ctx.emit("Cast", [inputs[0]], attrs, name=node.name, outputs=node.outputs)


@canonicalizes("Size")
def size(ctx, node, inputs):
    """The number of elements of a statically shaped tensor: an int64 constant."""
    return [ctx.const(node.outputs[0], np.array(inputs[0].size, dtype=np.int64))]


@canonicalizes("Scatter")
def scatter(ctx, node, inputs):
    """Scatter (opsets 9 and 10, deprecated at 11) is ScatterElements."""
    return ctx.emit("ScatterElements", inputs, dict(node.attrs), name=node.name, outputs=node.outputs)


@canonicalizes("RoiAlign")
def roi_align(ctx, node, inputs):
    """RoiAlign-10 has no ``coordinate_transformation_mode``: it means ``output_half_pixel``."""
    attrs = dict(node.attrs)
    if node.version < ROI_ALIGN_CTM_SINCE:
        attrs["coordinate_transformation_mode"] = "output_half_pixel"
    return emit_as_is(ctx, node, inputs, attrs)


@canonicalizes("GridSample")
def grid_sample(ctx, node, inputs):
    """GridSample-16's mode names ``bilinear``/``bicubic`` are opset 20's ``linear``/``cubic``."""
    attrs = dict(node.attrs)
    mode = attrs.get("mode")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode is not None:
        attrs["mode"] = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    return emit_as_is(ctx, node, inputs, attrs)
