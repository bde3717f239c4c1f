"""ONNX nodes written as IR ops outside an import: what a pipeline rule uses to emit several ops exactly
as the importer writes them (``rules/integer_ops`` makes an integer conv the ``QLinearConv`` it is).

``write_onnx_nodes`` canonicalizes a few ``OnnxNode`` records (in order) into a scratch ``Graph``:
the values they read are stand-ins (``Value``s named as the caller likes, copies of the caller's
types and constants), the names of new values and nodes are fresh against ``reserved`` names (the
caller's graph), and constant subexpressions fold exactly as at import (``ImportContext.emit``).
The caller splices the scratch graph's nodes into its own graph (``rules.rewrite.apply_subgraph``).
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

import opfuse.frontend.onnx_quantized  # noqa: F401 - registers the QLinear* canonicalizers
from opfuse.frontend.onnx_functions import canonicalize
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.ir.graph import Graph, Value


def write_onnx_nodes(nodes: list[OnnxNode], inputs: Mapping[str, Value | np.ndarray], *, opset: int,
                     reserved_values: Iterable[str] = (), reserved_nodes: Iterable[str] = ()) -> tuple[Graph, dict]:
    """``(scratch graph, ONNX name -> value)`` of ``nodes`` imported in order; ``inputs`` maps each
    ONNX name they read (and no node writes) to a value of the caller's graph (a stand-in of the same
    name, type and constant data is made) or to an array (a new constant of that name)."""
    g = Graph("scratch")
    g.opset = opset
    env: dict = {}
    for name, x in inputs.items():
        if isinstance(x, np.ndarray):
            env[name] = g.add_const(name, x, unique=False)
        else:
            env[name] = g.add_value(Value(x.name, x.type, const=x.const))
    values = set(reserved_values) | set(g.values) | {o for n in nodes for o in n.outputs if o}
    ctx = ImportContext(g, opset, values, set(reserved_nodes) | {n.name for n in nodes}, {})
    ctx.scope = env
    for n in nodes:
        outs = canonicalize(ctx, n, [env[i] if i else None for i in n.inputs])
        for name, v in zip(n.outputs, outs, strict=False):
            if name and v is not None:
                env[name] = v
    return g, env


__all__ = ["write_onnx_nodes"]
