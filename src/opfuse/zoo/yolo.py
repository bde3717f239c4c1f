"""A YOLOv8 C2f block (Ultralytics), with every Conv as Conv + BatchNorm + SiLU, unfolded.

``C2f(32, 32, n=2, shortcut=True)`` on ``[1, 32, 80, 80]`` (hidden width ``c = 16``):

    a, b   = Split(cv1(x), [c, c], axis=1)               cv1: 1x1, 32 -> 2c
    m_i    = m_{i-1} + cv2_i(cv1_i(m_{i-1})), m_0 = b     two 3x3 bottlenecks with residual Add
    output = cv2(Concat(a, b, m_1, m_2))                  cv2: 1x1, 4c -> 32

SiLU is exported as PyTorch does at opset 17, ``Mul(x, Sigmoid(x))``; Split carries its sizes as
a constant input (opset 13+ form), as ``Tensor.chunk`` exports.
"""
from __future__ import annotations

import numpy as np
import onnx

from opfuse.zoo._build import ModelBuilder

YOLO_SEED = 501
CHANNELS = 32
RESOLUTION = 80
BOTTLENECKS = 2
EXPANSION = 0.5  # C2f's e: hidden width c = int(c2 * e)


def build_yolo_block() -> onnx.ModelProto:
    """YOLOv8 C2f block on ``[1, 32, 80, 80]``; output ``[1, 32, 80, 80]``."""
    b = ModelBuilder("yolo_block", YOLO_SEED)
    c = int(CHANNELS * EXPANSION)
    x = b.input("input", (1, CHANNELS, RESOLUTION, RESOLUTION))
    y = b.conv_bn_act(x, "cv1", CHANNELS, 2 * c, 1, act="silu")
    parts = b.multi_output_node("Split", [y, b.const("split.sizes", [c, c], dtype=np.int64)], "split",
                                num_outputs=2, axis=1)
    m = parts[-1]
    for i in range(BOTTLENECKS):
        t = b.conv_bn_act(m, f"m{i}_cv1", c, c, 3, act="silu")
        t = b.conv_bn_act(t, f"m{i}_cv2", c, c, 3, act="silu")
        m = b.add(m, t, f"m{i}_add")
        parts.append(m)
    cat = b.node("Concat", parts, "concat", axis=1)
    out = b.conv_bn_act(cat, "cv2", len(parts) * c, CHANNELS, 1, act="silu",
                        output="output")
    return b.build([(out, (1, CHANNELS, RESOLUTION, RESOLUTION))],
                   doc=f"YOLOv8 C2f({CHANNELS}, {CHANNELS}, n={BOTTLENECKS}, shortcut=True) block on "
                       f"1x{CHANNELS}x{RESOLUTION}x{RESOLUTION}; SiLU as Sigmoid*Mul")
