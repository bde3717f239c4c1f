"""Residual networks (He et al., 2016) built from basic blocks: two 3x3 Conv+BN, a shortcut, Add, ReLU.

``resnet18`` follows torchvision's ImageNet ResNet-18 (PyTorch export style: bias-free convs,
symmetric pads, 1x1 Conv+BN downsampling shortcuts). ``resnet8`` follows the MLPerf Tiny
image-classification reference (Keras ``resnet_v1_eembc``; TensorFlow export style: convs with
bias, asymmetric "same" pads for stride 2, a bias 1x1 Conv shortcut without BatchNorm,
AveragePool 8x8, Softmax).
"""
from __future__ import annotations

import onnx

from opfuse.zoo._build import ModelBuilder


def basic_block(b: ModelBuilder, x: str, name: str, cin: int, cout: int, stride: int, *,
                bias: bool, pads_s2: list[int], shortcut_bn: bool) -> str:
    """``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``.

    The shortcut is the identity when shape is preserved, else a strided 1x1 Conv (followed by
    BatchNorm when ``shortcut_bn``). ``pads_s2`` are the 3x3 pads used when ``stride == 2``.
    """
    pads = pads_s2 if stride == 2 else None
    y = b.conv_bn_act(x, f"{name}_conv1", cin, cout, 3, stride, pads, bias=bias)
    y = b.conv_bn_act(y, f"{name}_conv2", cout, cout, 3, bias=bias, act=None)
    if stride != 1 or cin != cout:
        if shortcut_bn:
            x = b.conv_bn_act(x, f"{name}_downsample", cin, cout, 1, stride, [0, 0, 0, 0], bias=bias,
                              act=None)
        else:
            x = b.conv(x, f"{name}_shortcut", cin, cout, 1, stride, [0, 0, 0, 0], bias=bias)
    return b.relu(b.add(x, y, f"{name}_add"), f"{name}_relu")


# torchvision ResNet-18: stage widths and basic blocks per stage.
RESNET18_WIDTHS = (64, 128, 256, 512)
RESNET18_DEPTHS = (2, 2, 2, 2)
RESNET18_SEED = 201
RESNET18_CLASSES = 1000
RESNET18_RESOLUTION = 224


def build_resnet18() -> onnx.ModelProto:
    """ImageNet ResNet-18: 7x7/2 stem, 3x3/2 MaxPool, 4 stages x 2 basic blocks, GAP, Gemm 1000."""
    b = ModelBuilder("resnet18", RESNET18_SEED)
    x = b.input("input", (1, 3, RESNET18_RESOLUTION, RESNET18_RESOLUTION))
    x = b.conv_bn_act(x, "conv1", 3, RESNET18_WIDTHS[0], 7, 2, [3, 3, 3, 3])
    x = b.maxpool(x, "maxpool", 3, 2, [1, 1, 1, 1])
    cin = RESNET18_WIDTHS[0]
    for stage, (width, depth) in enumerate(zip(RESNET18_WIDTHS, RESNET18_DEPTHS, strict=True), start=1):
        for i in range(depth):
            stride = 2 if stage > 1 and i == 0 else 1
            x = basic_block(b, x, f"layer{stage}_{i}", cin, width, stride, bias=False,
                            pads_s2=[1, 1, 1, 1], shortcut_bn=True)
            cin = width
    x = b.node("GlobalAveragePool", [x], "pool")
    x = b.classifier(x, "fc", cin, RESNET18_CLASSES, output="output")
    return b.build([(x, (1, RESNET18_CLASSES))],
                   doc="ResNet-18 (torchvision layout), 224x224 input, 1000 logits (no Softmax)")


# MLPerf Tiny ResNet-8 for CIFAR-10: a 16-channel stem, then one basic block per stack.
RESNET8_WIDTHS = (16, 32, 64)
RESNET8_SEED = 202
RESNET8_CLASSES = 10
RESNET8_RESOLUTION = 32
# TensorFlow "same" padding of a 3x3 stride-2 conv on an even input: the extra row and column
# go at the end, so pads are [top, left, bottom, right] = [0, 0, 1, 1].
TF_SAME_PADS_3X3_S2 = [0, 0, 1, 1]


def build_resnet8() -> onnx.ModelProto:
    """MLPerf Tiny CIFAR-10 ResNet-8: 32x32x3, stacks of 16/32/64 channels, AveragePool, Softmax."""
    b = ModelBuilder("resnet8", RESNET8_SEED)
    x = b.input("input", (1, 3, RESNET8_RESOLUTION, RESNET8_RESOLUTION))
    x = b.conv_bn_act(x, "conv1", 3, RESNET8_WIDTHS[0], 3, bias=True)
    cin = RESNET8_WIDTHS[0]
    for stack, width in enumerate(RESNET8_WIDTHS, start=1):
        stride = 1 if stack == 1 else 2
        x = basic_block(b, x, f"stack{stack}", cin, width, stride, bias=True,
                        pads_s2=TF_SAME_PADS_3X3_S2, shortcut_bn=False)
        cin = width
    pool = RESNET8_RESOLUTION // 2 ** (len(RESNET8_WIDTHS) - 1)
    x = b.node("AveragePool", [x], "pool", kernel_shape=[pool, pool], strides=[pool, pool])
    x = b.classifier(x, "fc", cin, RESNET8_CLASSES)
    x = b.node("Softmax", [x], "softmax", output="output", axis=-1)
    return b.build([(x, (1, RESNET8_CLASSES))],
                   doc="MLPerf Tiny ResNet-8 (CIFAR-10), 32x32 input, 10-class Softmax")
