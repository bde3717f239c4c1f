"""MobileNetV1 (Howard et al., 2017): a stride-2 3x3 stem, then 13 depthwise-separable blocks.

Each block is a 3x3 depthwise Conv (``group = channels``) and a 1x1 pointwise Conv, each
followed by an unfolded BatchNormalization and ReLU (ReLU, not ReLU6), named
``dw<i>, dw<i>_bn, dw<i>_relu, pw<i>, pw<i>_bn, pw<i>_relu`` for block ``i = 1..13``. The head is
GlobalAveragePool -> Flatten -> Gemm, so the 27 Conv nodes are exactly the 27 conv layers of the
paper's Table 1 (the paper's FC layer is the Gemm).
"""
from __future__ import annotations

import onnx

from opfuse.zoo._build import ModelBuilder

# (stride, output channels at width 1.0) of the 13 depthwise-separable blocks (paper, Table 1).
BLOCKS = ((1, 64), (2, 128), (1, 128), (2, 256), (1, 256), (2, 512),
          (1, 512), (1, 512), (1, 512), (1, 512), (1, 512), (2, 1024), (1, 1024))
STEM_CHANNELS = 32
STEM_STRIDE = 2


def mobilenet_v1(name: str, seed: int, alpha: float, resolution: int, classes: int,
                 softmax: bool) -> onnx.ModelProto:
    """MobileNetV1 with width multiplier ``alpha`` on a ``1 x 3 x resolution x resolution`` input.

    Output ``output``: ``[1, classes]`` logits, or probabilities when ``softmax``.
    """
    b = ModelBuilder(name, seed)
    x = b.input("input", (1, 3, resolution, resolution))
    cin = int(STEM_CHANNELS * alpha)
    # Stride-2 3x3 convs use pads 1 on every side, as PyTorch exports them; for even inputs this
    # gives the same output size as TensorFlow's asymmetric "same" padding.
    x = b.conv_bn_act(x, "conv1", 3, cin, 3, STEM_STRIDE)
    size = resolution // STEM_STRIDE
    for i, (stride, channels) in enumerate(BLOCKS, start=1):
        cout = int(channels * alpha)
        x = b.conv_bn_act(x, f"dw{i}", cin, cin, 3, stride, group=cin)
        x = b.conv_bn_act(x, f"pw{i}", cin, cout, 1)
        cin = cout
        size = (size + stride - 1) // stride
    x = b.node("GlobalAveragePool", [x], "pool")
    if softmax:
        x = b.classifier(x, "fc", cin, classes)
        x = b.node("Softmax", [x], "softmax", output="output", axis=-1)
    else:
        x = b.classifier(x, "fc", cin, classes, output="output")
    head = "probabilities (Softmax)" if softmax else "logits (no Softmax)"
    return b.build([(x, (1, classes))],
                   doc=f"MobileNetV1 alpha={alpha}, {resolution}x{resolution} input, {classes} {head}; "
                       f"final feature map {size}x{size}")


MOBILENET_V1_SEED = 101
MOBILENET_V1_025_96_SEED = 102


def build_mobilenet_v1() -> onnx.ModelProto:
    """ImageNet MobileNetV1, full width, 224x224, 1000 logits."""
    return mobilenet_v1("mobilenet_v1", MOBILENET_V1_SEED, alpha=1.0, resolution=224, classes=1000,
                        softmax=False)


def build_mobilenet_v1_025_96() -> onnx.ModelProto:
    """MLPerf Tiny visual wake words: MobileNetV1 alpha 0.25, 96x96, 2-class Softmax."""
    return mobilenet_v1("mobilenet_v1_025_96", MOBILENET_V1_025_96_SEED, alpha=0.25, resolution=96,
                        classes=2, softmax=True)
