"""Random DAGs of supported ops for the property tests (built with hypothesis draws).

Every value has shape (1, C, H, W) = (1, 4, 4, 4), so any op can read any earlier value. The
op menu covers every category and every rewrite: Conv (1x1, 3x3, depthwise) with BatchNorm
and per-channel scale/shift, pools, Softmax, MatMul, Transpose, Reshape round trips,
Split/Concat, decomposed LayerNorm/GELU/SiLU/hard-swish, Q/K/V siblings and attention.
Weights are scaled by 1/sqrt(fan-in) so values stay O(1).
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st

from opfuse.ops import GraphBuilder

C, H, W = 4, 4, 4
SHAPE = (1, C, H, W)
OPS = ("relu", "sigmoid", "tanh", "neg", "add", "mul", "sub", "conv1x1", "conv3x3", "dwconv", "bn", "scale",
       "shift", "maxpool", "avgpool", "softmax", "transpose", "matmul", "rowmean", "silu", "gelu", "ln",
       "hswish", "split_concat", "reshape", "attention", "qkv", "pool_pair")


class Maker:
    def __init__(self, seed: int):
        self.b = GraphBuilder("random")
        self.rng = np.random.default_rng(seed)
        self.k = 0

    def const(self, shape, scale=1.0, positive=False):
        self.k += 1
        a = self.rng.standard_normal(shape) * scale
        if positive:
            a = np.abs(a) + 0.5
        return self.b.const(f"c{self.k}", a.astype(np.float32))

    def scalar(self, v):
        self.k += 1
        return self.b.const(f"s{self.k}", np.float32(v))

    def op(self, kind, a, b):
        o, c = self.b.op, self.const
        if kind in ("relu", "sigmoid", "tanh", "neg"):
            return [o(kind.capitalize() if kind != "relu" else "Relu", a)]
        if kind in ("add", "mul", "sub"):
            return [o(kind.capitalize(), a, b)]
        if kind == "conv1x1":
            return [o("Conv", a, c((C, C, 1, 1), 0.5), c(C))]
        if kind == "conv3x3":
            return [o("Conv", a, c((C, C, 3, 3), 1 / 6), pads=[1, 1, 1, 1])]
        if kind == "dwconv":
            return [o("Conv", a, c((C, 1, 3, 3), 1 / 3), c(C), pads=[1, 1, 1, 1], group=C)]
        if kind == "bn":
            return [o("BatchNormalization", a, c(C, positive=True), c(C), c(C), c(C, positive=True))]
        if kind == "scale":
            return [o("Mul", a, c((1, C, 1, 1), positive=True))]
        if kind == "shift":
            return [o("Add", a, c((1, C, 1, 1)))]
        if kind in ("maxpool", "avgpool"):
            return [o("MaxPool" if kind == "maxpool" else "AveragePool", a, kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
        if kind == "pool_pair":
            mp = o("MaxPool", a, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            ap = o("AveragePool", a, kernel_shape=[3, 3], pads=[1, 1, 1, 1])
            return [mp, ap]
        if kind == "softmax":
            return [o("Softmax", a, axis=-1)]
        if kind == "transpose":
            return [o("Transpose", a, perm=[0, 1, 3, 2])]
        if kind == "matmul":
            return [o("MatMul", a, c((W, W), 0.5))]
        if kind == "rowmean":
            return [o("Sub", a, o("ReduceMean", a, axes=[-1], keepdims=1))]
        if kind == "silu":
            return [o("Mul", a, o("Sigmoid", a))]
        if kind == "hswish":
            return [o("Mul", a, o("HardSigmoid", a, alpha=1 / 6, beta=0.5))]
        if kind == "gelu":
            e = o("Erf", o("Div", a, self.scalar(math.sqrt(2))))
            return [o("Mul", o("Mul", a, o("Add", e, self.scalar(1.0))), self.scalar(0.5))]
        if kind == "ln":
            mean = o("ReduceMean", a, axes=[-1], keepdims=1)
            d = o("Sub", a, mean)
            var = o("ReduceMean", o("Pow", d, self.scalar(2.0)), axes=[-1], keepdims=1)
            n = o("Div", d, o("Sqrt", o("Add", var, self.scalar(1e-5))))
            return [o("Add", o("Mul", n, c(W, positive=True)), c(W))]
        if kind == "split_concat":
            p, q = o("Split", a, axis=1, split=[2, 2], num_outputs=2)
            return [o("Concat", o("Relu", q), p, axis=1)]
        if kind == "reshape":
            flat = o("Reshape", a, self.b.const(f"r{self.k}a", np.array([1, C, H * W])))
            return [o("Reshape", o("Relu", flat), self.b.const(f"r{self.k}b", np.array(SHAPE)))]
        if kind == "qkv":
            ys = [o("Add", o("MatMul", a, c((W, W), 0.5)), c(W)) for _ in range(3)]
            return [o("Add", o("Add", ys[0], ys[1]), ys[2])]
        if kind == "attention":
            s = o("Div", o("MatMul", a, o("Transpose", b, perm=[0, 1, 3, 2])), self.scalar(2.0))
            return [o("MatMul", o("Softmax", s, axis=-1), b)]
        raise ValueError(kind)


@st.composite
def random_graphs(draw, max_ops: int = 9):
    m = Maker(draw(st.integers(0, 2 ** 16)))
    values = [m.b.input("x", SHAPE), m.b.input("y", SHAPE)]
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(OPS))
        a = values[draw(st.integers(0, len(values) - 1))]
        b = values[draw(st.integers(0, len(values) - 1))]
        values.extend(m.op(kind, a, b))
    extra = values[draw(st.integers(2, len(values) - 1))] if len(values) > 3 else values[-1]
    outputs = [values[-1]] + ([extra] if extra is not values[-1] else [])
    return m.b.build(*outputs)
