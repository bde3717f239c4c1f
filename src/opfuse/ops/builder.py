"""``GraphBuilder``: build a Graph in code, inferring each node's output types as it goes.

    b = GraphBuilder("tiny")
    x = b.input("x", (1, 3, 8, 8))
    y = b.op("Relu", b.op("Conv", x, b.const("w", w), pads=[1, 1, 1, 1]))
    g = b.build(y)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from opfuse.ir.graph import Graph, Value
from opfuse.ops.registry import infer_node


class GraphBuilder:
    def __init__(self, name: str = "graph", opset: int = 17):
        self.graph = Graph(name)
        self.graph.opset = opset

    def input(self, name: str, shape: Sequence[int], dtype="float32") -> Value:
        return self.graph.add_input(name, shape, dtype)

    def const(self, name: str, data, dtype=None) -> Value:
        arr = np.asarray(data, dtype=dtype) if dtype is not None else np.asarray(data)
        return self.graph.add_const(name, arr)

    def op(self, op_type: str, *inputs: Value | None, name: str | None = None,
           num_outputs: int = 1, **attrs):
        """Add a node; returns its output Value (a tuple when ``num_outputs > 1``)."""
        node = self.graph.add_node(op_type, list(inputs), num_outputs=num_outputs, attrs=attrs, name=name)
        for v, t in zip(node.outputs, infer_node(node), strict=True):
            v.type = t
        return node.outputs[0] if num_outputs == 1 else tuple(node.outputs)

    def build(self, *outputs: Value, verify: bool = True) -> Graph:
        self.graph.outputs = list(outputs)
        self.graph.remove_unused_values()
        if verify:
            self.graph.verify()
        return self.graph
