"""Synthetic CNN-like graphs of any size, for planner benchmarks and scaling tests.

A seeded random stack of the blocks real models are made of, on a small feature map so
the weights stay small:

* ``conv``: Conv -> BatchNormalization -> Relu (sometimes followed by an overlapping
  3x3/stride-1 MaxPool, whose fusion needs the conv output buffered on chip);
* ``residual``: Conv -> BN -> Relu -> Conv -> BN -> Add(skip) -> Relu;
* ``branches``: two or three sibling branches (1x1 Conv + Relu / Sigmoid gate) on one
  input, joined by Add (horizontal-fusion candidates);
* ``elementwise``: a short chain of Mul/Add-by-constant and activations.

Every block keeps the shape ``(1, C, H, W)``, so blocks chain freely.
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, Value
from opfuse.ops.builder import GraphBuilder

CHANNELS = 8
SIDE = 16


class _Gen:
    def __init__(self, seed: int, channels: int, side: int):
        self.rng = np.random.default_rng(seed)
        self.b = GraphBuilder(f"synthetic_{seed}")
        self.c = channels
        self.side = side

    def const(self, name, shape):
        return self.b.const(name, (self.rng.standard_normal(shape) * 0.1).astype(np.float32))

    def conv(self, x: Value, k: int) -> Value:
        w = self.const("w", (self.c, self.c, k, k))
        return self.b.op("Conv", x, w, pads=[k // 2] * 4)

    def bn(self, x: Value) -> Value:
        c = self.c
        return self.b.op("BatchNormalization", x, self.b.const("g", np.ones(c, np.float32)),
                         self.b.const("be", np.zeros(c, np.float32)),
                         self.b.const("mu", np.zeros(c, np.float32)),
                         self.b.const("var", np.ones(c, np.float32)))

    def block(self, x: Value, kind: str) -> Value:
        b = self.b
        if kind == "conv":
            y = b.op("Relu", self.bn(self.conv(x, 3)))
            if self.rng.random() < 0.3:
                y = b.op("MaxPool", y, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            return y
        if kind == "residual":
            y = b.op("Relu", self.bn(self.conv(x, 3)))
            y = self.bn(self.conv(y, 3))
            return b.op("Relu", b.op("Add", y, x))
        if kind == "branches":
            outs = [b.op("Relu", self.conv(x, 1)), b.op("Sigmoid", self.conv(x, 1))]
            if self.rng.random() < 0.5:
                outs.append(b.op("Tanh", x))
            y = outs[0]
            for o in outs[1:]:
                y = b.op("Add", y, o)
            return y
        y = b.op("Mul", x, self.const("s", (1, self.c, 1, 1)))
        y = b.op("Add", y, self.const("t", (1, self.c, 1, 1)))
        return b.op("Sigmoid" if self.rng.random() < 0.5 else "Relu", y)


BLOCK_KINDS = ("conv", "residual", "branches", "elementwise")


def synthetic_graph(num_nodes: int, seed: int = 0, channels: int = CHANNELS, side: int = SIDE) -> Graph:
    """A graph of about ``num_nodes`` nodes (at least ``num_nodes``, within one block)."""
    gen = _Gen(seed, channels, side)
    x = gen.b.input("x", (1, channels, side, side))
    y = x
    while len(gen.b.graph.nodes) < num_nodes:
        y = gen.block(y, BLOCK_KINDS[int(gen.rng.integers(len(BLOCK_KINDS)))])
    return gen.b.build(y, verify=False)
