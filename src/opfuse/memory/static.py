"""Values known at compile time: constants and whatever is computed from constants only.

opfuse compiles static shapes, so ``Shape`` of any tensor, ``ConstantOfShape``,
``Constant``, and every node whose inputs are all static are evaluated once, at build
time, with the op's reference implementation. Their results join the weights (read-only)
and never take arena space or a kernel's time.
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, Node
from opfuse.ops.registry import get_spec

# Ops whose output depends only on static facts (shapes, attributes), not on input data.
SHAPE_ONLY_OPS = frozenset({"Shape", "Constant", "ConstantOfShape"})


def _is_static_node(node: Node, static: dict[int, np.ndarray]) -> bool:
    if node.op_type in SHAPE_ONLY_OPS:
        return node.op_type != "ConstantOfShape" or all(id(v) in static for v in node.input_values())
    return bool(node.input_values()) and all(id(v) in static for v in node.input_values())


def static_values(graph: Graph) -> dict[int, np.ndarray]:
    """``id(value) -> array`` for every constant and every value computable from constants."""
    static: dict[int, np.ndarray] = {id(v): np.asarray(v.const) for v in graph.values.values()
                                     if v.const is not None}
    for node in graph.nodes:
        if not _is_static_node(node, static):
            continue
        spec = get_spec(node.op_type, node)
        args: list[np.ndarray | None]
        if node.op_type == "Shape":  # needs only the static shape, not data
            args = [np.broadcast_to(np.zeros((), dtype=node.input(0).dtype), node.input(0).shape)]
        else:
            args = [static[id(v)] if v is not None else None for v in node.inputs]
        for v, r in zip(node.outputs, spec.compute(args, spec.attrs_of(node), node), strict=False):
            static[id(v)] = np.ascontiguousarray(np.asarray(r).astype(v.dtype, copy=False))
    return static

