"""Constant folding: evaluate at compile time every node whose inputs are all constants.

``Shape`` folds too, whatever its input: opfuse compiles static shapes, so ``Shape(x)`` is
known. Results are computed with the op's reference implementation (the same oracle the tests
use), so folding never changes a value. Folding is refused when the result would be larger
than ``FusionOptions.max_folded_constant_bytes`` (an Expand of a scalar to a huge tensor is
cheaper to compute than to store) and skipped for values that are graph outputs (a constant
graph output would leave no kernel to produce it).
"""
from __future__ import annotations

import numpy as np

from opfuse.rules.decisions import RefusalKind, Refusal
from opfuse.ir.graph import Graph, Node
from opfuse.rewrites.edit import add_const, substitute
from opfuse.rewrites.context import RewriteContext
from opfuse.ops.registry import run_node

RULE = "constant_folding"
# Ops whose output depends only on the input *type* (known at compile time).
TYPE_ONLY_OPS = frozenset({"Shape"})


def _foldable(node: Node) -> bool:
    if node.op_type in TYPE_ONLY_OPS:
        return True
    return all(v.is_const for v in node.input_values())


def fold_constants(graph: Graph, rc: RewriteContext) -> bool:
    if rc.options.is_disabled(RULE):
        return False
    outputs = {id(v) for v in graph.outputs}
    folded = []
    for node in list(graph.nodes):
        if not _foldable(node) or any(id(v) in outputs for v in node.outputs):
            continue
        out_bytes = sum(v.nbytes for v in node.outputs)
        if out_bytes > rc.options.max_folded_constant_bytes:
            rc.log_refusal(RULE, [node.name], Refusal(
                RefusalKind.RESOURCE, f"result of {out_bytes} bytes exceeds the folding limit "
                                           f"of {rc.options.max_folded_constant_bytes} bytes"))
            continue
        if node.op_type in TYPE_ONLY_OPS:
            # Only the shape is read: a zero-stride view costs no memory.
            args = [np.broadcast_to(np.zeros((), v.dtype), v.shape) if v is not None else None
                    for v in node.inputs]
        else:
            args = [v.const if v is not None else None for v in node.inputs]
        results = run_node(node, args)
        readers = [u for v in node.outputs for u, _ in v.uses]
        for v, r in zip(node.outputs, results, strict=True):
            c = add_const(graph, f"{v.name}_folded", np.asarray(r).astype(v.dtype, copy=False))
            substitute(graph, v, c)
        if node.outputs and node.outputs[0].producer is node:  # an output without readers kept it
            graph.remove_node(node)
        rc.provenance.credit(node, readers)
        folded.append(node.name)
    if folded:
        rc.log_applied(RULE, folded, f"folded {len(folded)} node(s) into constants")
        graph.remove_unused_values()
    return bool(folded)
