"""Exporters: canonical IR nodes written in a target opset's ONNX form.

An exporter is ``fn(ctx, node)``, registered with ``@exports(op_type, ...)``; ops without one
are written as they are. Expansions state their math:

* ``Silu(x) = x * Sigmoid(x)``;
* ``Gelu(x) = 0.5 x (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"``
  ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (an ONNX op from opset 20);
* ``LayerNormalization(x) = (x - mean) / sqrt(var + eps) * scale + bias`` over axes
  ``axis..rank-1``, computed in float32 (``stash_type=1``) (an ONNX op from opset 17);
* ``HardSwish(x) = x * HardSigmoid(x; alpha=1/6, beta=1/2)`` (an ONNX op from opset 14);
* ``Mish(x) = x * tanh(Softplus(x))`` (an ONNX op from opset 18);
* ``Requantize(acc, mult, shift)`` (opfuse's fixed-point requantization, ``opfuse.ops.quantized``)
  in int64: ``p = acc * mult``, ``r = p mod 2^shift`` (floored), ``q = (p - r) / 2^shift``, plus 1
  when ``r > 2^(shift-1)`` or ``r = 2^(shift-1)`` and ``q`` is odd, ``+ zero_point``, clipped, cast;
* LSTM, GRU and RNN with ``layout=1`` (batch first, an attribute from opset 14) are written below
  14 in layout 0 between Transposes: X and the initial states swap their first two axes, Y is
  ``Transpose(perm=[2, 0, 1, 3])`` of the layout-0 Y and Y_h/Y_c swap their first two axes back;
* Softmax (LogSoftmax, Hardmax) before opset 13 normalises a flattened trailing block, so one
  along a non-last axis is written ``Transpose -> Softmax(last) -> Transpose``;
* ``AffineGrid(theta)`` (an ONNX op from opset 20) is ``Reshape(MatMul(B, Transpose(theta)))`` with
  ``B`` the constant base grid, one row ``(x, y, [z,] 1)`` per position.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
from onnx import TensorProto

from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx_export_context import ExportContext
from opfuse.frontend.onnx_opsets import (AXES_INPUT_SINCE, GRID_SAMPLE_ND_SINCE, GRID_SAMPLE_OLD_MODES, INTRODUCED_AT,
                                         NOOP_WITH_EMPTY_AXES_SINCE, PAD_AXES_INPUT_SINCE, RECURRENT_LAYOUT_SINCE,
                                         RESIZE_OPTIONAL_INPUTS_SINCE, ROI_ALIGN_CTM_SINCE,
                                         SOFTMAX_SINGLE_AXIS_SINCE, SPLIT_INPUT_SINCE)
from opfuse.frontend.onnx_protos import onnx_elem_type
from opfuse.ir.graph import Node

GELU_TANH_COEFF = 0.044715  # the cubic coefficient of the tanh approximation of GELU

Exporter = Callable[[ExportContext, Node], None]
EXPORTERS: dict[str, Exporter] = {}


def exports(*op_types: str):
    def register(fn: Exporter) -> Exporter:
        for op in op_types:
            EXPORTERS[op] = fn
        return fn
    return register


def _native(ctx: ExportContext, node: Node) -> bool:
    """Whether the op exists (and is not superseded by an expansion) at the target opset."""
    return node.op_type in INTRODUCED_AT and ctx.opset >= INTRODUCED_AT[node.op_type]


def _scalar(ctx: ExportContext, node: Node, base: str, value: float, dtype) -> str:
    return ctx.const(f"{node.name}_{base}", np.array(value, dtype=dtype))


def axes_operand(ctx: ExportContext, node: Node, op_type: str, x: str, axes: list[int] | None,
                 attrs: dict, out: str | None = None) -> str:
    """Write ``op_type`` with ``axes`` as an attribute or an input, as the target opset wants."""
    if ctx.opset >= AXES_INPUT_SINCE[op_type]:
        inputs = [x] + ([ctx.const(f"{node.name}_axes", np.array(axes, dtype=np.int64))] if axes else [])
    else:
        inputs = [x]
        attrs = dict(attrs, axes=list(axes)) if axes else attrs
    if out is None:
        return ctx.op(node, op_type, inputs, **attrs)
    ctx.add(op_type, inputs, [out], name=node.name, attrs=attrs, origin=node)
    return out


# Attribute/input forms ------------------------------------------------------------------------

@exports(*AXES_INPUT_SINCE)  # Squeeze, Unsqueeze and every Reduce*
def axes_form(ctx, node):
    attrs = dict(node.attrs)
    axes = attrs.pop("axes", None) or None
    x, y = node.input(0).name, node.output.name
    since = NOOP_WITH_EMPTY_AXES_SINCE.get(node.op_type)
    if since is not None and ctx.opset < since:
        noop = attrs.pop("noop_with_empty_axes", 0)
        if noop and not axes:  # "reduce over no axes" is the identity
            ctx.add("Identity", [x], [y], name=node.name, origin=node)
            return
    axes_operand(ctx, node, node.op_type, x, axes, attrs, out=y)


@exports("Split")
def split(ctx, node):
    """Always explicit sizes (read from the output shapes), as an input from opset 13."""
    attrs = dict(node.attrs)
    rank = len(node.input(0).shape)
    axis = attrs.get("axis", 0) % max(rank, 1)
    sizes = [v.shape[axis] for v in node.outputs]
    attrs.pop("split", None)
    if ctx.opset >= SPLIT_INPUT_SINCE:
        ctx.emit(node, [node.input(0).name, ctx.const(f"{node.name}_split", np.array(sizes, np.int64))], attrs)
    else:
        ctx.emit(node, [node.input(0).name], dict(attrs, split=sizes))


@exports("Softmax", "LogSoftmax", "Hardmax")
def softmax(ctx, node):
    if ctx.opset >= SOFTMAX_SINGLE_AXIS_SINCE:
        ctx.emit(node)
        return
    rank = len(node.input(0).shape)
    axis = node.attrs.get("axis", -1) % max(rank, 1)
    if axis == rank - 1 or rank == 0:
        ctx.emit(node, attrs={"axis": -1})
        return
    perm = [d for d in range(rank) if d != axis] + [axis]
    inverse = [perm.index(d) for d in range(rank)]
    t = ctx.op(node, "Transpose", [node.input(0).name], perm=perm)
    s = ctx.op(node, node.op_type, [t], axis=-1)
    ctx.op(node, "Transpose", [s], out=node.output.name, perm=inverse)


@exports("Clip")
def clip(ctx, node):
    """Bounds as inputs (an IR node might still carry the old attribute form)."""
    attrs = dict(node.attrs)
    inputs = [v.name if v is not None else None for v in node.inputs] + [None] * (3 - len(node.inputs))
    dtype = node.input(0).dtype
    for i, key in ((1, "min"), (2, "max")):
        value = attrs.pop(key, None)
        if value is not None and inputs[i] is None:
            inputs[i] = _scalar(ctx, node, key, value, dtype)
    ctx.emit(node, inputs, attrs)


@exports("Pad")
def pad(ctx, node):
    """Before opset 18 Pad has no ``axes`` input: spell the pads out for every axis."""
    has_axes = len(node.inputs) > 3 and node.inputs[3] is not None
    if ctx.opset >= PAD_AXES_INPUT_SINCE or not has_axes:
        ctx.emit(node)
        return
    rank = len(node.input(0).shape)
    pads, axes = node.input(1).const, node.input(3).const
    if pads is None or axes is None:
        raise UnsupportedOpError("Pad", node.name, ctx.opset, detail="pads and axes must be constants")
    full = np.zeros(2 * rank, dtype=np.int64)
    k = len(axes)
    for i, a in enumerate(int(a) % rank for a in axes.reshape(-1)):
        full[a], full[a + rank] = pads.reshape(-1)[i], pads.reshape(-1)[i + k]
    ins = [node.input(0).name, ctx.const(f"{node.name}_pads", full),
           node.inputs[2].name if node.inputs[2] is not None else None]
    ctx.emit(node, ins)


@exports("Resize")
def resize(ctx, node):
    """Before opset 13 an unused ``roi``/``scales`` is an empty tensor, not a missing input."""
    inputs = [v.name if v is not None else None for v in node.inputs]
    if ctx.opset < RESIZE_OPTIONAL_INPUTS_SINCE:
        for i, what in ((1, "roi"), (2, "scales")):
            if len(inputs) > i and inputs[i] is None:
                inputs[i] = ctx.const(f"{node.name}_{what}", np.zeros(0, np.float32))
    ctx.emit(node, inputs)


@exports("Dropout")
def dropout(ctx, node):
    """Inference Dropout is the identity (``ratio`` is irrelevant and changed form at 12)."""
    if len(node.outputs) == 1:
        ctx.emit(node, [node.input(0).name], {}, op_type="Identity")
    else:
        ctx.emit(node, [node.input(0).name], {})


@exports("BatchNormalization")
def batch_norm(ctx, node):
    attrs = {k: v for k, v in node.attrs.items() if not (k == "spatial" and v == 1)}
    ctx.emit(node, attrs=attrs)


@exports("LSTM", "GRU", "RNN")
def recurrent(ctx, node):
    if int(node.attrs.get("layout", 0)) == 0 or ctx.opset >= RECURRENT_LAYOUT_SINCE:
        ctx.emit(node)
        return
    attrs = {k: v for k, v in node.attrs.items() if k != "layout"}
    swap = [1, 0, 2]
    inputs: list[str | None] = [v.name if v is not None else None for v in node.inputs]
    for i in (0, 5, 6):  # X, initial_h, initial_c
        if i < len(inputs) and inputs[i] is not None:
            inputs[i] = ctx.op(node, "Transpose", [inputs[i]], perm=swap)
    outs = [ctx.fresh(f"{v.name}_layout0") for v in node.outputs]
    ctx.add(node.op_type, inputs, outs, name=node.name, attrs=attrs, origin=node)
    for k, (v, o) in enumerate(zip(node.outputs, outs, strict=True)):
        ctx.op(node, "Transpose", [o], out=v.name, perm=[2, 0, 1, 3] if k == 0 else swap)


# Expansions -------------------------------------------------------------------------------------

@exports("Silu")
def silu(ctx, node):
    x = node.input(0).name
    ctx.op(node, "Mul", [x, ctx.op(node, "Sigmoid", [x])], out=node.output.name)


@exports("Requantize")
def requantize(ctx, node):
    shift = node.input(2).const
    if shift is None:
        raise UnsupportedOpError("Requantize", node.name, ctx.opset, detail="a run-time shift cannot be exported")
    a = node.attrs
    i64 = np.int64
    unit = np.left_shift(np.ones_like(shift, dtype=i64), shift.astype(i64))
    cast64 = int(TensorProto.INT64)
    p = ctx.op(node, "Mul", [ctx.op(node, "Cast", [node.input(0).name], to=cast64),
                             ctx.op(node, "Cast", [node.input(1).name], to=cast64)])
    if len(node.input_values()) == 5:  # the residual term, already int64 in its multiplier
        p = ctx.op(node, "Add", [p, ctx.op(node, "Mul", [ctx.op(node, "Cast", [node.input(3).name], to=cast64),
                                                         node.input(4).name])])
    unit_name = ctx.const(f"{node.name}_unit", unit)
    r = ctx.op(node, "Mod", [p, unit_name], fmod=0)
    q = ctx.op(node, "Div", [ctx.op(node, "Sub", [p, r]), unit_name])
    half = ctx.const(f"{node.name}_half", unit >> 1)
    odd = ctx.op(node, "Equal", [ctx.op(node, "Mod", [q, _scalar(ctx, node, "two", 2, i64)], fmod=0),
                                 _scalar(ctx, node, "one", 1, i64)])
    up = ctx.op(node, "Or", [ctx.op(node, "Greater", [r, half]),
                             ctx.op(node, "And", [ctx.op(node, "Equal", [r, half]), odd])])
    q = ctx.op(node, "Add", [ctx.op(node, "Add", [q, ctx.op(node, "Cast", [up], to=cast64)]),
                             _scalar(ctx, node, "zero_point", int(a.get("zero_point", 0)), i64)])
    q = ctx.op(node, "Clip", [q, _scalar(ctx, node, "lo", int(a.get("lo", -128)), i64),
                              _scalar(ctx, node, "hi", int(a.get("hi", 127)), i64)])
    ctx.op(node, "Cast", [q], out=node.output.name, to=int(a.get("to", TensorProto.INT8)))


@exports("HardSwish")
def hard_swish(ctx, node):
    if _native(ctx, node):
        ctx.emit(node)
        return
    x = node.input(0).name
    ctx.op(node, "Mul", [x, ctx.op(node, "HardSigmoid", [x], alpha=1.0 / 6.0, beta=0.5)],
           out=node.output.name)


@exports("Mish")
def mish(ctx, node):
    if _native(ctx, node):
        ctx.emit(node)
        return
    x = node.input(0).name
    ctx.op(node, "Mul", [x, ctx.op(node, "Tanh", [ctx.op(node, "Softplus", [x])])], out=node.output.name)


@exports("Gelu")
def gelu(ctx, node):
    if _native(ctx, node):
        ctx.emit(node)
        return
    x, dt = node.input(0).name, node.input(0).dtype
    approximate = node.attrs.get("approximate", "none")
    if approximate == "tanh":
        cube = ctx.op(node, "Mul", [x, ctx.op(node, "Mul", [x, x])])
        inner = ctx.op(node, "Add", [x, ctx.op(node, "Mul", [cube, _scalar(ctx, node, "c", GELU_TANH_COEFF, dt)])])
        scaled = ctx.op(node, "Mul", [inner, _scalar(ctx, node, "k", math.sqrt(2.0 / math.pi), dt)])
        core = ctx.op(node, "Tanh", [scaled])
    elif approximate == "none":
        core = ctx.op(node, "Erf", [ctx.op(node, "Mul", [x, _scalar(ctx, node, "rsqrt2", 1.0 / math.sqrt(2.0), dt)])])
    else:
        raise UnsupportedOpError("Gelu", node.name, ctx.opset, detail=f"approximate={approximate!r}")
    one_plus = ctx.op(node, "Add", [core, _scalar(ctx, node, "one", 1.0, dt)])
    half_x = ctx.op(node, "Mul", [x, _scalar(ctx, node, "half", 0.5, dt)])
    ctx.op(node, "Mul", [half_x, one_plus], out=node.output.name)


@exports("LayerNormalization")
def layer_norm(ctx, node):
    if _native(ctx, node):
        ctx.emit(node)
        return
    if len(node.outputs) != 1:
        raise UnsupportedOpError("LayerNormalization", node.name, ctx.opset,
                                 detail="the Mean/InvStdDev outputs cannot be exported before opset 17")
    x_val = node.input(0)
    rank = len(x_val.shape)
    axis = node.attrs.get("axis", -1) % max(rank, 1)
    axes = list(range(axis, rank))
    eps = node.attrs.get("epsilon", 1e-5)
    x = x_val.name
    stash = x_val.dtype != np.float32 and node.attrs.get("stash_type", 1) == 1
    if stash:
        x = ctx.op(node, "Cast", [x], to=TensorProto.FLOAT)
    dt = np.float32 if stash else x_val.dtype
    mean = axes_operand(ctx, node, "ReduceMean", x, axes, {"keepdims": 1})
    d = ctx.op(node, "Sub", [x, mean])
    var = axes_operand(ctx, node, "ReduceMean", ctx.op(node, "Mul", [d, d]), axes, {"keepdims": 1})
    std = ctx.op(node, "Sqrt", [ctx.op(node, "Add", [var, _scalar(ctx, node, "eps", eps, dt)])])
    y = ctx.op(node, "Div", [d, std])
    if stash:
        y = ctx.op(node, "Cast", [y], to=onnx_elem_type(x_val.dtype, f"input of '{node.name}'"))
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    scaled_out = None if bias is not None else node.output.name
    y = ctx.op(node, "Mul", [y, node.input(1).name], out=scaled_out)
    if bias is not None:
        ctx.op(node, "Add", [y, bias.name], out=node.output.name)



# Spatial sampling --------------------------------------------------------------------------------

def _refuse_before_introduced(ctx, node) -> None:
    """An op with no expansion into older ops cannot be written before the opset that defines it."""
    if not _native(ctx, node):
        raise UnsupportedOpError(node.op_type, node.name, ctx.opset,
                                 detail=f"{node.op_type} cannot be written at opset {ctx.opset} (an ONNX op from "
                                        f"opset {INTRODUCED_AT[node.op_type]}, with no expansion into older ops)")


@exports("Col2Im", "DeformConv")
def native_only(ctx, node):
    _refuse_before_introduced(ctx, node)
    ctx.emit(node)


@exports("GridSample")
def grid_sample(ctx, node):
    """Mode names as the target opset spells them; opset 16 to 19 take 4-D input only."""
    from opfuse.ops.sampling import GRID_MODES
    _refuse_before_introduced(ctx, node)
    attrs = dict(node.attrs)
    if ctx.opset < GRID_SAMPLE_ND_SINCE and len(node.input(0).shape) != 4:
        raise UnsupportedOpError("GridSample", node.name, ctx.opset,
                                 detail=f"a {len(node.input(0).shape)}-D GridSample cannot be written at opset "
                                        f"{ctx.opset} (N-D from opset {GRID_SAMPLE_ND_SINCE})")
    if "mode" in attrs:  # (absent: the default, linear, at every opset)
        mode = GRID_MODES.get(str(attrs["mode"]), str(attrs["mode"]))
        attrs["mode"] = mode if ctx.opset >= GRID_SAMPLE_ND_SINCE else GRID_SAMPLE_OLD_MODES.get(mode, mode)
    ctx.emit(node, attrs=attrs)


@exports("AffineGrid")
def affine_grid(ctx, node):
    if _native(ctx, node):
        ctx.emit(node)
        return
    from opfuse.ops.sampling import affine_size, base_coordinates
    theta, out = node.input(0), node.output
    size = affine_size(node)
    spatial = size[2:]
    align = bool(int(node.attrs.get("align_corners", 0)))
    mesh = np.meshgrid(*[base_coordinates(n, align) for n in spatial], indexing="ij")
    base = np.stack(list(reversed(mesh)) + [np.ones(spatial)], axis=-1).reshape(-1, len(spatial) + 1)
    t = ctx.op(node, "Transpose", [theta.name], perm=[0, 2, 1])
    mm = ctx.op(node, "MatMul", [ctx.const(f"{node.name}_base", base.astype(theta.dtype)), t])
    ctx.op(node, "Reshape", [mm, ctx.const(f"{node.name}_shape", np.array(out.shape, np.int64))], out=out.name)


@exports("RoiAlign")
def roi_align(ctx, node):
    """Before opset 16 RoiAlign has no ``coordinate_transformation_mode`` and means output_half_pixel."""
    attrs = dict(node.attrs)
    if ctx.opset < ROI_ALIGN_CTM_SINCE:
        ctm = attrs.pop("coordinate_transformation_mode", "half_pixel")
        if ctm != "output_half_pixel":
            raise UnsupportedOpError("RoiAlign", node.name, ctx.opset,
                                     detail=f"coordinate_transformation_mode={ctm!r} cannot be written at opset "
                                            f"{ctx.opset} (RoiAlign-10 means output_half_pixel)")
    else:
        attrs.setdefault("coordinate_transformation_mode", "half_pixel")
    ctx.emit(node, attrs=attrs)
