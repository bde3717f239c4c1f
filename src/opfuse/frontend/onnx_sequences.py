"""Sequences and optionals, folded away at import.

opfuse compiles tensors only, but a graph may build sequences and optionals *inside* it
(``SplitToSequence -> SequenceAt``, ``SequenceConstruct -> ConcatFromSequence``, an If branch
returning ``Optional(x)``). Everything about them that decides the plan -- how many elements,
which element, whether an optional holds a value -- is known at import when the positions are
constants, so the importer keeps them as plain records of the tensor values they hold
(``SequenceValue``, ``OptionalValue``) and rewrites each op into what it means:

* ``SequenceConstruct``, ``SequenceEmpty``, ``SequenceInsert``, ``SequenceErase`` build a new
  record (no IR node); ``SequenceAt`` is the element it names; ``SequenceLength`` a constant;
* ``ConcatFromSequence(axis, new_axis)`` is a ``Concat`` of the elements (each ``Unsqueeze``d at
  ``axis`` first when ``new_axis=1``);
* ``SplitToSequence(x, split, axis, keepdims)`` is a ``Split`` (and a ``Squeeze`` of each piece
  when ``keepdims=0`` and no ``split`` is given);
* ``Optional(x)`` / ``Optional<type>()`` is a record holding ``x`` or nothing;
  ``OptionalHasElement`` a constant; ``OptionalGetElement`` the value held (a plain tensor or
  sequence is its own value, as ONNX allows since opset 18).

Positions must be constants (else ``ShapeInputError``, like any operand that decides a shape).
A record that reaches an op which needs a tensor, or a graph output, is refused naming it;
graph inputs that are sequences or optionals are refused where the inputs are read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import numpy as np
import onnx

from opfuse.errors import ModelError, UnsupportedOpError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.frontend.onnx_protos import numpy_dtype
from opfuse.ir.graph import Value


@dataclass(frozen=True)
class SequenceValue:
    """A sequence known at import: its elements (tensor values of one dtype)."""

    items: tuple[Value, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class OptionalValue:
    """An optional known at import: the value it holds, or ``None``."""

    value: Union[Value, SequenceValue, None]


NON_TENSORS = (SequenceValue, OptionalValue)

# The ops that read or make sequences and optionals (each folded here).
SEQUENCE_OPS = frozenset({"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceAt",
                          "SequenceLength", "ConcatFromSequence", "SplitToSequence", "Optional",
                          "OptionalHasElement", "OptionalGetElement"})


def kind_of(v) -> str:
    """``"a sequence"``, ``"an optional"`` or ``"a tensor"``: what an imported value is, for messages."""
    return "a sequence" if isinstance(v, SequenceValue) else "an optional" if isinstance(v, OptionalValue) \
        else "a tensor"


def _sequence(node: OnnxNode, inputs: list, index: int = 0) -> SequenceValue:
    v = inputs[index] if index < len(inputs) else None
    if not isinstance(v, SequenceValue):
        raise ModelError(f"node '{node.name}' ({node.op_type}): input {index} is {kind_of(v)}, a sequence "
                         f"is expected")
    return v


def _tensor(node: OnnxNode, inputs: list, index: int) -> Value:
    v = inputs[index] if index < len(inputs) else None
    if not isinstance(v, Value):
        raise ModelError(f"node '{node.name}' ({node.op_type}): input {index} is "
                         f"{'absent' if v is None else kind_of(v)}, a tensor is expected")
    return v


def _position(ctx: ImportContext, node: OnnxNode, inputs: list, index: int, default: int, size: int,
              inclusive: bool) -> int:
    """A constant position operand, made non-negative and checked against ``size`` elements
    (``inclusive``: ``size`` itself is allowed, as for an insertion at the end)."""
    data = ctx.const_operand(node, inputs, index, "position")
    pos = default if data is None else int(np.asarray(data).reshape(-1)[0])
    top = size if inclusive else size - 1
    if not -size <= pos <= top:
        raise ModelError(f"node '{node.name}' ({node.op_type}): position {pos} is out of range for a sequence of "
                         f"{size} element(s)")
    return pos + size if pos < 0 else pos


def _same_dtype(node: OnnxNode, items, dtype: np.dtype) -> None:
    for v in items:
        if v.dtype != dtype:
            raise ModelError(f"node '{node.name}' ({node.op_type}): a sequence of {dtype} cannot hold "
                             f"'{v.name}' ({v.dtype})")


@canonicalizes("SequenceConstruct")
def sequence_construct(ctx, node, inputs):
    items = tuple(_tensor(node, inputs, i) for i in range(len(inputs)))
    if not items:
        raise ModelError(f"node '{node.name}' (SequenceConstruct) has no inputs")
    _same_dtype(node, items, items[0].dtype)
    return [SequenceValue(items, items[0].dtype)]


@canonicalizes("SequenceEmpty")
def sequence_empty(ctx, node, inputs):
    dtype = numpy_dtype(int(node.attrs.get("dtype", onnx.TensorProto.FLOAT)), f"node '{node.name}' (SequenceEmpty)")
    return [SequenceValue((), dtype)]


@canonicalizes("SequenceInsert")
def sequence_insert(ctx, node, inputs):
    seq = _sequence(node, inputs)
    x = _tensor(node, inputs, 1)
    _same_dtype(node, [x], seq.dtype)
    pos = _position(ctx, node, inputs, 2, len(seq.items), len(seq.items), inclusive=True)
    return [SequenceValue(seq.items[:pos] + (x,) + seq.items[pos:], seq.dtype)]


@canonicalizes("SequenceErase")
def sequence_erase(ctx, node, inputs):
    seq = _sequence(node, inputs)
    pos = _position(ctx, node, inputs, 1, -1, len(seq.items), inclusive=False)
    return [SequenceValue(seq.items[:pos] + seq.items[pos + 1:], seq.dtype)]


@canonicalizes("SequenceAt")
def sequence_at(ctx, node, inputs):
    seq = _sequence(node, inputs)
    pos = _position(ctx, node, inputs, 1, 0, len(seq.items), inclusive=False)
    return [seq.items[pos]]


@canonicalizes("SequenceLength")
def sequence_length(ctx, node, inputs):
    seq = _sequence(node, inputs)
    return [ctx.const(node.outputs[0], np.array(len(seq.items), np.int64))]


@canonicalizes("ConcatFromSequence")
def concat_from_sequence(ctx, node, inputs):
    seq = _sequence(node, inputs)
    if not seq.items:
        raise ModelError(f"node '{node.name}' (ConcatFromSequence): the sequence is empty")
    if "axis" not in node.attrs:
        raise ModelError(f"node '{node.name}' (ConcatFromSequence) has no 'axis' attribute")
    axis, new_axis = int(node.attrs["axis"]), int(node.attrs.get("new_axis", 0))
    items = list(seq.items)
    if new_axis:
        rank = len(items[0].shape) + 1
        if not -rank <= axis < rank:
            raise ModelError(f"node '{node.name}' (ConcatFromSequence): axis {axis} is out of range for rank {rank}")
        axis %= rank
        items = [ctx.emit("Unsqueeze", [v], {"axes": [axis]}, name=ctx.fresh_node(f"{node.name}/Unsqueeze"),
                          outputs=[ctx.fresh_value(f"{node.outputs[0]}_{k}")])[0] for k, v in enumerate(items)]
    return ctx.emit("Concat", items, {"axis": axis}, name=node.name, outputs=[node.outputs[0]])


@canonicalizes("SplitToSequence")
def split_to_sequence(ctx, node, inputs):
    x = _tensor(node, inputs, 0)
    axis = int(node.attrs.get("axis", 0))
    rank = len(x.shape)
    if not -rank <= axis < rank:
        raise ModelError(f"node '{node.name}' (SplitToSequence): axis {axis} is out of range for rank {rank}")
    axis %= rank
    dim = x.shape[axis]
    split = ctx.const_operand(node, inputs, 1, "split")
    squeeze = split is None and not int(node.attrs.get("keepdims", 1))
    if split is None:
        sizes = [1] * dim
    elif np.ndim(split) == 0:
        chunk = int(split)
        if chunk <= 0:
            raise ModelError(f"node '{node.name}' (SplitToSequence): split {chunk} must be positive")
        sizes = [chunk] * (dim // chunk) + ([dim % chunk] if dim % chunk else [])
    else:
        sizes = [int(s) for s in np.asarray(split).reshape(-1)]
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            raise ModelError(f"node '{node.name}' (SplitToSequence): split {sizes} does not cut axis {axis} of "
                             f"size {dim}")
    if not sizes:
        return [SequenceValue((), x.dtype)]
    names = [ctx.fresh_value(f"{node.outputs[0]}_{k}") for k in range(len(sizes))]
    pieces = ctx.emit("Split", [x], {"axis": axis, "split": sizes}, name=node.name, outputs=names)
    if squeeze:
        pieces = [ctx.emit("Squeeze", [p], {"axes": [axis]}, name=ctx.fresh_node(f"{node.name}/Squeeze"),
                           outputs=[ctx.fresh_value(f"{p.name}_squeezed")])[0] for p in pieces]
    return [SequenceValue(tuple(pieces), x.dtype)]


@canonicalizes("Optional")
def optional(ctx, node, inputs):
    v = inputs[0] if inputs else None
    if v is None and not isinstance(node.attrs.get("type"), onnx.TypeProto):
        raise ModelError(f"node '{node.name}' (Optional) has neither an input nor a 'type' attribute")
    return [OptionalValue(v)]


@canonicalizes("OptionalHasElement")
def optional_has_element(ctx, node, inputs):
    v = inputs[0] if inputs else None
    has = v.value is not None if isinstance(v, OptionalValue) else v is not None
    return [ctx.const(node.outputs[0], np.array(has, np.bool_))]


@canonicalizes("OptionalGetElement")
def optional_get_element(ctx, node, inputs):
    v = inputs[0] if inputs else None
    if isinstance(v, OptionalValue):
        if v.value is None:
            raise ModelError(f"node '{node.name}' (OptionalGetElement): the optional is empty")
        return [v.value]
    if v is None:
        raise ModelError(f"node '{node.name}' (OptionalGetElement) has no input")
    return [v]


def tensors_only(ctx: ImportContext, node: OnnxNode, inputs: list) -> None:
    """Refuse a sequence or optional where ``node`` needs tensors."""
    for i, v in enumerate(inputs):
        if isinstance(v, NON_TENSORS):
            raise UnsupportedOpError(node.op_type, node.name, ctx.opset,
                                     detail=f"input {i} is {kind_of(v)}; opfuse folds sequences "
                                            f"and optionals only through the ops that read them (SequenceAt, "
                                            f"ConcatFromSequence, OptionalGetElement, ...)")
