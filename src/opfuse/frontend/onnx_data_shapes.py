"""Ops whose output shape depends on input *values*: NonZero, Unique, NonMaxSuppression, Compress.

opfuse compiles static shapes (one arena planned at compile time), so the values that decide
such an output's shape must be known when the model is compiled. They are when they are
constants, or bound: ``input_values`` / ``--inputs`` give graph inputs values, and a model from
``opfuse.compile`` is specialised to each run's values (``SpecializingModel``, one build per
distinct binding). Then:

* ``Compress(x, condition; axis)`` with a known condition is ``Gather(x, nonzero(condition),
  axis)`` (``x`` flattened first when there is no axis): ``x`` may still be computed at run time,
  so the op stays in the graph and runs in C like any Gather;
* ``NonZero``, ``Unique`` and ``NonMaxSuppression`` with all inputs known are folded to their
  results, computed by ``onnx.reference`` (the ONNX definition's own implementation).

When a deciding value is computed at run time, the import stops with a ``ShapeInputError``:
one line naming the node, the operand and the graph inputs it comes from (whose values would
bind it). A kernel that writes into an upper-bound buffer and returns its count (the way
onnxruntime runs these ops) is not implemented: the arena and every kernel after such an op
would need run-time extents.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from opfuse.errors import ModelError
from opfuse.frontend.onnx_canonical import canonicalizes
from opfuse.frontend.onnx_decompose import _Writer
from opfuse.frontend.onnx_protos import NUMPY_TO_ONNX

# Inputs that decide each op's output shape, by position (all inputs of the folded ops).
DECIDING_INPUTS = {
    "NonZero": ("X",),
    "Unique": ("X",),
    "NonMaxSuppression": ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold"),
}


@canonicalizes("Compress")
def compress(ctx, node, inputs):
    x = inputs[0]
    cond = ctx.const_operand(node, inputs, 1, "condition")
    if cond is None or cond.ndim != 1:
        raise ModelError(f"node '{node.name}' (Compress): condition must be a 1-D tensor")
    axis = node.attrs.get("axis")
    extent = x.size if axis is None else None
    if axis is not None:
        axis = int(axis)
        if not -len(x.shape) <= axis < len(x.shape):
            raise ModelError(f"node '{node.name}' (Compress): axis {axis} for an input of rank {len(x.shape)}")
        extent = int(x.shape[axis])
    if cond.size > extent and np.any(cond[extent:]):
        raise ModelError(f"node '{node.name}' (Compress): condition selects index {int(np.flatnonzero(cond)[-1])} "
                         f"of an axis of {extent}")
    picked = np.flatnonzero(cond[:extent]).astype(np.int64)
    w = _Writer(ctx, node)
    if axis is None:
        x = w.op("Reshape", [x, w.const("flat", np.array([-1], np.int64))])
        axis = 0
    return [w.op("Gather", [x, w.const("picked", picked)], {"axis": axis}, last=True)]


def _fold_with_onnx_reference(ctx, node, inputs):
    """All outputs of ``node`` as constants, its inputs being known (else a ``ShapeInputError``)."""
    from onnx.reference import ReferenceEvaluator
    if node.proto is None:
        raise ModelError(f"node '{node.name}' ({node.op_type}) cannot be evaluated here (no ONNX node to run)")
    names = DECIDING_INPUTS[node.op_type]
    feeds, infos = {}, []
    for i, name in enumerate(node.inputs):
        if not name:
            continue
        data = ctx.const_operand(node, inputs, i, names[i] if i < len(names) else f"input {i}")
        feeds[name] = data
        infos.append(helper.make_tensor_value_info(name, NUMPY_TO_ONNX[data.dtype], list(data.shape)))
    outs = [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.outputs if o]
    graph = helper.make_graph([node.proto], "fold", infos, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ctx.opset)])
    try:
        results = ReferenceEvaluator(model).run(None, feeds)
    except Exception as e:  # the reference refuses malformed attributes or data
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(f"cannot evaluate node '{node.name}' ({node.op_type}) on its constant inputs: {first}") \
            from None
    values = iter(results)
    return [ctx.const(o, np.asarray(next(values))) if o else None for o in node.outputs]


for _op in DECIDING_INPUTS:
    canonicalizes(_op)(_fold_with_onnx_reference)
