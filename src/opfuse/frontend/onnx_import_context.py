"""What canonicalizers work with: ``OnnxNode`` (one checked ONNX node as a plain record) and
``ImportContext`` (the graph under construction, fresh names, constants, and ``emit``, which adds
an IR node, infers its output types and folds it into constants when it is foldable).

``onnx_import`` builds both and walks the model; ``onnx_canonical`` holds the rules.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, MutableMapping

import numpy as np
import onnx

from opfuse.errors import ModelError, OpfuseError, ShapeError, ShapeInputError
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.common import graph_inputs_behind
from opfuse.ops.registry import get_spec, infer_node

# A node whose inputs are all constants is evaluated at import time when its outputs hold at
# most this many elements in total (shape arithmetic, small tables). Larger results stay nodes
# so the model does not balloon with precomputed weights.
FOLD_MAX_ELEMENTS = 65536


@dataclass
class OnnxNode:
    """One ONNX node: names, op version (``since_version`` of its schema) and plain attributes."""

    name: str
    op_type: str
    version: int
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    proto: onnx.NodeProto | None = None  # the ONNX node itself (function bodies are built from it)


class ImportContext:
    """What canonicalizers use: the graph under construction and name/constant helpers."""

    def __init__(self, graph: Graph, opset: int, reserved_values: set[str], reserved_nodes: set[str],
                 use_counts: dict[str, int]):
        self.graph = graph
        self.opset = opset
        self._reserved_values = reserved_values
        self._reserved_nodes = reserved_nodes
        self._use_counts = use_counts
        self._counters: dict[str, int] = {}
        # The values the nodes being imported can read by their ONNX names: the graph's, a
        # function body's while it is inlined, a subgraph's (with its outer scopes) while it is.
        # Values are ``Value``s, or the sequences and optionals of ``onnx_sequences``.
        self.scope: MutableMapping[str, Any] = {}
        # Subgraph nodes imported so far (every If branch taken, every unrolled Loop/Scan iteration).
        self.subgraph_nodes = 0
        # DequantizeLinear of a constant integer tensor stays ``Cast -> Sub -> Mul`` over the integer
        # constant (``onnx_decompose``), so the pipeline's integer rules see the 8-bit weights; the
        # pipeline (or the unfused build) folds what they leave (``rewrites/dequantized_constants``).
        self.keep_dequantized_constants = True

    # Names ----------------------------------------------------------------------------------
    def _fresh(self, base: str, taken) -> str:
        k = self._counters.get(base, 0)
        cand = base
        while cand in taken:
            k += 1
            cand = f"{base}_{k}"
        self._counters[base] = k
        return cand

    def fresh_value(self, base: str) -> str:
        """A value name used by no ONNX value and no value made so far (all of them are reserved)."""
        name = self._fresh(base, self._reserved_values)
        self._reserved_values.add(name)
        return name

    def fresh_node(self, base: str) -> str:
        """A node name used by no ONNX node and no node made so far (all of them are reserved)."""
        name = self._fresh(base, self._reserved_nodes)
        self._reserved_nodes.add(name)
        return name

    def add_uses(self, names) -> None:
        """Count reads of values that appear during the import (inside inlined function bodies)."""
        for name in names:
            if name:
                self._use_counts[name] = self._use_counts.get(name, 0) + 1

    def is_used(self, onnx_name: str) -> bool:
        """Whether an ONNX value is read by some node or is a graph output."""
        return bool(onnx_name) and self._use_counts.get(onnx_name, 0) > 0

    # Values ---------------------------------------------------------------------------------
    def const(self, name: str, data) -> Value:
        return self.graph.add_const(name, np.asarray(data), unique=False)

    def const_operand(self, node: OnnxNode, inputs: list, index: int, what: str) -> np.ndarray | None:
        """The data of a constant operand (``None`` when absent); it must be a compile-time constant."""
        v = inputs[index] if index < len(inputs) else None
        if v is None:
            return None
        if v.const is None:
            raise ShapeInputError(node.op_type, node.name, self.opset,
                                  detail=f"input {index} ({what}) must be a constant: opfuse compiles static shapes",
                                  inputs=graph_inputs_behind(v))
        return v.const

    # Nodes ----------------------------------------------------------------------------------
    def emit(self, op_type: str, inputs: list, attrs: dict, *, name: str, outputs: list[str],
             fold: bool = True) -> list[Value]:
        """Add a node, infer its output types, and fold it into constants when it is foldable
        (never with ``fold=False``: a dequantized constant kept for the integer rules).

        Empty output names (ONNX's "unused optional output") get fresh names.
        """
        out_names = [o if o else self.fresh_value(f"{name}_unused{i}") for i, o in enumerate(outputs)]
        # The node joins the graph only if it is not folded away.
        node = Node(name, op_type, list(inputs), [Value(o) for o in out_names], dict(attrs))
        for v, t in zip(node.outputs, infer_node(node), strict=True):
            v.type = t
        if fold and _foldable(node):
            return [self.const(v.name, a) for v, a in zip(node.outputs, _evaluate(node), strict=False)]
        self.graph.insert_node(node)
        return list(node.outputs)


def _foldable(node: Node) -> bool:
    if node.op_type == "Shape":
        return True  # static shapes: the result never depends on the data
    ins = node.input_values()
    if not ins or any(v.const is None for v in ins):
        return False
    return sum(v.size for v in node.outputs) <= FOLD_MAX_ELEMENTS


def _evaluate(node: Node) -> list[np.ndarray]:
    """Run the op's reference implementation on constant inputs (shape-only for ``Shape``)."""
    args: list[np.ndarray | None]
    if node.op_type == "Shape":
        # Shape reads only the shape: a zero-stride view stands in for data we may not have.
        x = node.input(0)
        args = [np.broadcast_to(np.zeros((), x.dtype), x.shape)]
    else:
        args = [v.const if v is not None else None for v in node.inputs]
    spec = get_spec(node.op_type, node)
    try:
        results = list(spec.compute(args, spec.attrs_of(node), node))
    except OpfuseError:
        raise
    except Exception as e:  # e.g. an out-of-range index in constant data
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelError(f"cannot evaluate constant node '{node.name}' ({node.op_type}): {first_line}") from None
    arrays = []
    for v, r in zip(node.outputs, results, strict=False):
        r = np.asarray(r)
        if tuple(r.shape) != v.shape:
            raise ShapeError(f"node '{node.name}' ({node.op_type}) computes shape {tuple(r.shape)} for "
                             f"'{v.name}', its shape inference says {v.shape}")
        arrays.append(np.array(r, dtype=v.dtype, order="C"))  # owned copy: never a view of an input
    return arrays
