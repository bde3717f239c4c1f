"""Dequantized constants folded, as the importer folds every small constant subexpression.

The importer keeps ``DequantizeLinear`` of a constant integer tensor (a QDQ model's int8 weight,
its int32 bias) as ``Cast -> Sub -> Mul`` over the integer constant (``onnx_decompose``), so that
the ``recognize_integer`` stage (``rules/integer_ops``) still sees the 8-bit weights. After it,
the chains it did not take are folded here exactly as the importer would have folded them: each
node whose inputs are all constants and whose outputs hold at most ``FOLD_MAX_ELEMENTS`` elements
becomes a constant of its output's name, evaluated by the op's reference implementation. The
unfused build (``fuse(enable=False)``) runs this too, so it computes no weight at run time.
Chains left dead by the integer rules are removed first.
"""
from __future__ import annotations

import numpy as np

from opfuse.frontend.onnx_decompose import KEPT_DEQUANTIZED
from opfuse.frontend.onnx_import_context import FOLD_MAX_ELEMENTS
from opfuse.ir.graph import Graph, Node
from opfuse.ops.registry import run_node


def _starts(node: Node) -> bool:
    """A kept dequantization's Cast: an integer constant to a float."""
    return node.op_type == "Cast" and len(node.input_values()) == 1 and node.input(0).is_const \
        and node.input(0).dtype in KEPT_DEQUANTIZED and node.outputs[0].dtype.kind == "f"


def remove_dead_nodes(graph: Graph) -> bool:
    """Drop nodes none of whose outputs is read or a graph output (walking backwards)."""
    outputs = {id(v) for v in graph.outputs}
    dead = False
    for node in reversed(list(graph.nodes)):
        if all(not v.uses and id(v) not in outputs for v in node.outputs):
            graph.remove_node(node)
            dead = True
    return dead


def fold_dequantized_constants(graph: Graph) -> bool:
    """Fold the kept dequantizations of constants (see the module docstring); returns whether the
    graph changed."""
    if not any(_starts(n) for n in graph.nodes):
        return False
    remove_dead_nodes(graph)
    outputs = {id(v) for v in graph.outputs}
    todo = [n for n in graph.nodes if _starts(n)]
    changed = False
    while todo:
        node = todo.pop(0)
        if node not in graph.nodes or not all(v.is_const for v in node.input_values()) \
                or any(id(v) in outputs for v in node.outputs) \
                or sum(v.size for v in node.outputs) > FOLD_MAX_ELEMENTS:
            continue
        results = run_node(node, [v.const if v is not None else None for v in node.inputs])
        readers = [u for v in node.outputs for u, _ in v.uses]
        uses = [list(v.uses) for v in node.outputs]
        for v in node.outputs:
            for u, i in list(v.uses):
                graph.set_input(u, i, None)
        graph.remove_node(node)
        for v, r, vu in zip(node.outputs, results, uses, strict=True):
            c = graph.add_const(v.name, np.array(np.asarray(r), dtype=v.dtype, order="C"), unique=False)
            for u, i in vu:
                graph.set_input(u, i, c)
        todo.extend(r for r in readers if r not in todo)
        changed = True
    graph.remove_unused_values()
    return changed


__all__ = ["fold_dequantized_constants", "remove_dead_nodes"]
