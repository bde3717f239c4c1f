"""A readable, deterministic text form of a Graph, for golden tests and ``--dump-ir``.

    graph tiny (%x: float32[1,3,8,8]) -> (%y) {
      const %w: float32[4,3,3,3]  # mean=0.0123 std=0.98
      %c: float32[1,4,8,8] = Conv[pads=[1,1,1,1]](%x, %w)  # conv0
      %y: float32[1,4,8,8] = Relu(%c)  # relu0
    }

Attributes are printed sorted by name; constants are summarised (shape and a content
digest), never dumped, so the text stays small and stable across runs.
"""
from __future__ import annotations

import hashlib

import numpy as np


def _fmt_attr(v) -> str:
    if isinstance(v, float):
        return format(v, ".7g")
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_fmt_attr(x) for x in v) + "]"
    if isinstance(v, np.ndarray):
        return f"tensor<{v.dtype.name}{list(v.shape)}>"
    if isinstance(v, bytes):
        return repr(v.decode("utf-8", "replace"))
    return repr(v) if isinstance(v, str) else str(v)


def const_digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).tobytes()).hexdigest()[:10]


def format_node(node) -> str:
    outs = ", ".join(f"%{v.name}: {v.type}" for v in node.outputs)
    attrs = ""
    if node.attrs:
        attrs = "[" + ", ".join(f"{k}={_fmt_attr(node.attrs[k])}" for k in sorted(node.attrs)) + "]"
    ins = ", ".join("%" + v.name if v is not None else "_" for v in node.inputs)
    return f"{outs} = {node.op_type}{attrs}({ins})  # {node.name}"


def format_graph(graph) -> str:
    ins = ", ".join(f"%{v.name}: {v.type}" for v in graph.inputs)
    outs = ", ".join(f"%{v.name}" for v in graph.outputs)
    lines = [f"graph {graph.name} ({ins}) -> ({outs}) {{"]
    for v in graph.constants:
        if v.uses or v in graph.outputs:
            if v.const.size <= 8:
                body = np.array2string(v.const.ravel(), precision=6, separator=",")
            else:
                body = f"sha1={const_digest(v.const)}"
            lines.append(f"  const %{v.name}: {v.type} = {body}")
    for node in graph.nodes:
        lines.append("  " + format_node(node))
    lines.append("}")
    return "\n".join(lines)
