"""Small odd-width builds of each code path whose C chooses what to load by a condition (issue 13: gcc 12.2
-O3 turned such loads into masked vector loads that returned other memory). ``tools/masked_loads.py sites``
audits them; ``tests/e2e/test_guarded_loads.py`` runs them against the reference. Each maker returns a
graph whose input values are all distinct (``feeds``), so a misplaced read cannot pass."""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from opfuse.ir.graph import Graph
from opfuse.ops import GraphBuilder


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def _weights(shape: tuple[int, ...], dt, seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dt)


def concat_last_axis(dt=np.float32, width: int = 5) -> Graph:
    """Concat of 5 and 6 columns along the last axis, then Relu (fused: one loop, a branch per input)."""
    b = GraphBuilder("concat_last")
    c = b.op("Concat", b.input("a", (2, 3, width), dt), b.input("b", (2, 3, width + 1), dt), axis=-1)
    return b.build(b.op("Relu", c))


def concat_three(dt=np.float32, width: int = 7) -> Graph:
    """Concat of 3, 1 and 7 columns along the last axis, then Neg."""
    b = GraphBuilder("concat_three")
    c = b.op("Concat", b.input("a", (3, 3), dt), b.input("b", (3, 1), dt), b.input("c", (3, width), dt), axis=1)
    return b.build(b.op("Neg", c))


def concat_first_axis(dt=np.float32, width: int = 3) -> Graph:
    """Concat of a tensor with itself along the outermost axis, then Clip (fuzz seed 41214: the outermost loop was
    not split, and gcc 12.2 -O3 vectorised the branch between the two loads with masked loads that returned
    zeros for the second half, AVX2 and AVX-512 alike); and the same Concat through a Transpose, whose loop
    runs across the inputs (every input read inside it, then selected)."""
    b = GraphBuilder("concat_first")
    x = b.input("x", (2, width), dt)
    c = b.op("Concat", x, x, axis=0)
    lo, hi = b.const("lo", np.array(-0.5, dt)), b.const("hi", np.array(1.5, dt))
    d = b.op("Concat", x, b.input("y", (1, width), dt), x, axis=0)
    return b.build(b.op("Clip", c, lo, hi), b.op("Abs", b.op("Transpose", d, perm=[1, 0])))


def conv1d_padded(dt=np.float32, width: int = 13) -> Graph:
    """A 1-D Conv (k=3, pads 1/2): the per-element im2col packer (``conv._Im2colPacker``; float64: the generic
    im2col load)."""
    b = GraphBuilder("conv1d")
    x = b.input("x", (1, 3, width), dt)
    y = b.op("Conv", x, b.const("w", _weights((5, 3, 3), dt)), b.const("bias", _weights((5,), dt, 8)),
             kernel_shape=[3], pads=[1, 2])
    return b.build(b.op("Relu", y))


def conv3d_padded(dt=np.float32, width: int = 7) -> Graph:
    """A 3-D Conv (3x3x3, pads 1): the per-element im2col packer."""
    b = GraphBuilder("conv3d")
    x = b.input("x", (1, 2, 3, 5, width), dt)
    y = b.op("Conv", x, b.const("w", _weights((3, 2, 3, 3, 3), dt)), kernel_shape=[3, 3, 3], pads=[1, 1, 1, 1, 1, 1])
    return b.build(b.op("Relu", y))


def conv2d_padded(dt=np.float64, width: int = 9) -> Graph:
    """A 2-D Conv (3x3, pads 1, stride 2) with run-time weights: the row-segment packer in float32, the generic
    im2col load in float64."""
    b = GraphBuilder("conv2d")
    x = b.input("x", (1, 3, 7, width), dt)
    y = b.op("Conv", x, b.input("w", (4, 3, 3, 3), dt), kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])
    return b.build(b.op("Relu", y))


def conv_transpose(dt=np.float32, width: int = 7) -> Graph:
    """ConvTranspose 2-D, stride 2, pads 1: the direct gather skips taps with ``continue``."""
    b = GraphBuilder("convT")
    x = b.input("x", (1, 3, 5, width), dt)
    y = b.op("ConvTranspose", x, b.const("w", _weights((3, 2, 3, 3), dt)), kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1])
    return b.build(b.op("Relu", y))


def conv_transpose_1d(dt=np.float32, width: int = 11) -> Graph:
    """ConvTranspose 1-D, stride 3, dilation 2."""
    b = GraphBuilder("convT1")
    x = b.input("x", (1, 2, width), dt)
    y = b.op("ConvTranspose", x, b.const("w", _weights((2, 3, 3), dt)), kernel_shape=[3], strides=[3],
             dilations=[2], pads=[2, 1])
    return b.build(b.op("Relu", y))


def max_pool_indices(dt=np.float32, width: int = 9) -> Graph:
    """MaxPool 3x3, pads 1, with its indices output: the window skips taps outside with ``continue``."""
    b = GraphBuilder("maxpool_idx")
    x = b.input("x", (1, 2, 5, width), dt)
    y, i = b.op("MaxPool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], num_outputs=2)
    return b.build(b.op("Relu", y), i)


def col2im(dt=np.float32, width: int = 7) -> Graph:
    """Col2Im 3x3 blocks, pads 1, stride 2 onto a 5x7 image: the taps skip with ``continue``."""
    b = GraphBuilder("col2im")
    x = b.input("x", (1, 2 * 9, 3 * ((width - 1) // 2 + 1)), dt)
    y = b.op("Col2Im", x, b.const("image", _i64(5, width)), b.const("block", _i64(3, 3)), pads=[1, 1, 1, 1],
             strides=[2, 2])
    return b.build(b.op("Relu", y))


def pad_constant(dt=np.float32, width: int = 2) -> Graph:
    """The constant Pad fixed for issue 13 (``rules._pad``): 1x6x2x1 to 3x9x3x1 and its Relu."""
    b = GraphBuilder("pad")
    x = b.input("x", (1, 6, width, 1), dt)
    p = b.op("Pad", x, b.const("pads", _i64(1, 1, 0, 0, 1, 2, 1, 0)), b.const("value", np.array(0.73, dt)),
             mode="constant")
    return b.build(b.op("Relu", p))


def average_pool(dt=np.float32, width: int = 2) -> Graph:
    """The generic pool path fixed for issue 13 (``pool.py``): AveragePool 3x3, pads 1, over 1x3x9x2."""
    b = GraphBuilder("avgpool")
    x = b.input("x", (1, 3, 9, width), dt)
    return b.build(b.op("Relu", b.op("AveragePool", x, kernel_shape=[3, 3], pads=[1, 1, 1, 1])))


def lstm(dt=np.float32, width: int = 3) -> Graph:
    """An LSTM of hidden size ``width`` over 5 steps: its input projection starts at the bias, zero to the padded
    width (``recurrent._project``)."""
    b = GraphBuilder("lstm")
    n_in = 4
    x = b.input("x", (5, 1, n_in), dt)
    w = b.const("W", _weights((1, 4 * width, n_in), dt) * 0.5)
    r = b.const("R", _weights((1, 4 * width, width), dt, 8) * 0.5)
    bias = b.const("B", _weights((1, 8 * width), dt, 9))
    y = b.op("LSTM", x, w, r, bias, hidden_size=width, num_outputs=3)
    return b.build(y[0], y[1])


def qconv(dt=np.int8, width: int = 11) -> Graph:
    """An int8 3x3 Conv (pads 1, 8 -> 6 channels) with its Requantize, dequantized: the host int8 conv
    (``codegen/qgemm.py``), whose word builders' scalar loops read the input rows (``opfuse_q8_quads``)."""
    from onnx import TensorProto

    from opfuse.ops.quantized import fixed_point_multiplier
    rng = np.random.default_rng(0)
    cin, cout = 8, 6
    b = GraphBuilder("qconv")
    x = b.input("x", (1, cin, 9, width), dt)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(-7, np.int32)))
    w = rng.integers(-128, 128, (cout, cin, 3, 3)).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), pads=[1, 1, 1, 1])
    acc = b.op("Add", acc, b.const("bias", rng.integers(-3000, 3000, (1, cout, 1, 1)).astype(np.int32)))
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-4, 3e-3, cout)]
    mult = np.array([p[0] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    q = b.op("Requantize", acc, b.const("m", mult), b.const("s", shift), zero_point=3, lo=-128, hi=127,
             to=int(TensorProto.INT8))
    y = b.op("Mul", b.op("Sub", b.op("Cast", q, to=int(TensorProto.FLOAT)), b.const("y_zp", np.array(3, np.float32))),
             b.const("y_scale", np.array(0.05, np.float32)))
    return b.build(y)


MAKERS: dict[str, Callable[..., Graph]] = {m.__name__: m for m in (
    concat_last_axis, concat_three, concat_first_axis, conv1d_padded, conv3d_padded, conv2d_padded, conv_transpose,
    conv_transpose_1d, max_pool_indices, col2im, pad_constant, average_pool, lstm, qconv)}
SITE_CASES: dict[str, Callable[[], Graph]] = {
    f"{name}_{np.dtype(dt).name}": functools.partial(make, dt)
    for name, make in MAKERS.items() for dt in ((np.int8,) if name == "qconv" else (np.float32, np.float64))
}


def feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Distinct values for every float graph input (a permutation of 1..n scaled into (-2, 2), never 0); integers
    drawn over their whole range."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        n = int(np.prod(v.shape))
        if v.dtype.kind in "iu":  # integers: the whole range, drawn
            info = np.iinfo(v.dtype)
            out[v.name] = rng.integers(info.min, info.max + 1, v.shape).astype(v.dtype)
            continue
        vals = (rng.permutation(n) + 1) / (n + 1) * 4 - 2
        out[v.name] = (vals + 1e-3).reshape(v.shape).astype(v.dtype)
    return out


__all__ = ["SITE_CASES", "feeds"]
