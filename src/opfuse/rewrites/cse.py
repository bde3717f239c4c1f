"""Common-subexpression elimination.

Two nodes compute the same values when they apply the same op with equal attributes to the
same input values (for ops tagged ``commutative``, in any order). Walking in topological order
and keeping the first node of each key makes chains collapse in one sweep: once ``a2`` is
replaced by ``a1``, ``f(a2)`` becomes ``f(a1)`` and meets its twin.

Small constants with equal dtype, shape and bytes are merged first, so ``x * 0.5`` written
twice with two separate ``0.5`` initializers is recognised as one expression. Only constants
up to ``CSE_CONST_MAX_ELEMENTS`` are merged: weights stay separate tensors, so BatchNorm
folding can still tell a shared weight from two equal ones. A Cast of an 8-bit tensor is left
alone: it starts a dequantization that each reader runs as it reads (the tensor stays 8-bit).
"""
from __future__ import annotations

import numpy as np

from opfuse.rules.decisions import refuse
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.registry import REGISTRY
from opfuse.rewrites.edit import can_substitute, substitute, substitute_all
from opfuse.rewrites.context import RewriteContext

RULE = "common_subexpression_elimination"
CSE_CONST_MAX_ELEMENTS = 16


def _attr_key(v):
    if isinstance(v, np.ndarray):
        return ("tensor", v.dtype.str, v.shape, v.tobytes())
    if isinstance(v, (list, tuple)):
        return tuple(_attr_key(x) for x in v)
    if isinstance(v, float):
        return ("f", v)
    return v


def _node_key(node: Node):
    ins = [id(v) if v is not None else None for v in node.inputs]
    spec = REGISTRY.get(node.op_type)
    if spec is not None and "commutative" in spec.tags:
        ins = sorted(ins, key=lambda x: -1 if x is None else x)
    attrs = tuple(sorted((k, _attr_key(v)) for k, v in node.attrs.items()))
    return (node.op_type, node.domain, tuple(ins), attrs, len(node.outputs))


def _merge_constants(graph: Graph) -> int:
    seen: dict[tuple, Value] = {}
    merged = 0
    for v in list(graph.constants):
        const = v.const
        if const is None or const.size > CSE_CONST_MAX_ELEMENTS or not v.uses:
            continue
        key = (const.dtype.str, const.shape, np.ascontiguousarray(const).tobytes())
        first = seen.setdefault(key, v)
        if first is not v and can_substitute(graph, v, first) is None:
            substitute(graph, v, first)
            merged += 1
    return merged


EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _reads_8bit(node: Node) -> bool:
    """A Cast of an 8-bit tensor: each reader dequantizes it in its own prologue
    (``rules/quantized.py``); one shared Cast would have to be stored in 32 bits."""
    return node.op_type == "Cast" and bool(node.inputs) and node.inputs[0] is not None \
        and node.inputs[0].dtype in EIGHT_BIT


def eliminate_common_subexpressions(graph: Graph, rc: RewriteContext) -> bool:
    if rc.options.is_disabled(RULE):
        return False
    merged_consts = _merge_constants(graph)
    seen: dict[tuple, Node] = {}
    removed: list[str] = []
    for node in list(graph.nodes):
        if _reads_8bit(node):
            continue
        key = _node_key(node)
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        pairs = zip(node.outputs, first.outputs, strict=True)
        why = next((w for w in (can_substitute(graph, old, new) for old, new in pairs)
                    if w), None)
        if why:  # e.g. both are graph outputs: each name must keep its value
            rc.log_refusal(RULE, [first.name, node.name], refuse(why))
            continue
        substitute_all(graph, list(zip(node.outputs, first.outputs, strict=True)))
        if node.outputs and node.outputs[0].producer is node:  # not removed with its outputs (none had a use)
            graph.remove_node(node)
        rc.provenance.absorb(first, [node])
        removed.append(node.name)
    if removed:
        rc.log_applied(RULE, removed, f"merged {len(removed)} duplicate node(s)")
    return bool(removed) or merged_consts > 0
