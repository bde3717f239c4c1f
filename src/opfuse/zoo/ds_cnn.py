"""DS-CNN keyword spotting (Zhang et al., 2017, "Hello Edge"), as in the MLPerf Tiny KWS reference.

Input: 49 frames x 10 MFCC coefficients (NCHW ``1 x 1 x 49 x 10``). A 10x4 stride-2 Conv to 64
channels, then 4 depthwise-separable blocks (3x3 depthwise + 1x1 pointwise, each Conv+BN+ReLU),
AveragePool, Flatten, Gemm to 12 keywords, Softmax. The Keras reference uses convs with bias and
TensorFlow "same" padding, exported here as explicit (asymmetric) pads. Its final pool is
``(49 // 2, 10 // 2) = (24, 5)`` with stride equal to the pool size over the 25x5 feature map,
so one output position that skips the last row, exactly as the reference computes it.
"""
from __future__ import annotations

import onnx

from opfuse.zoo._build import ModelBuilder

DS_CNN_SEED = 301
FRAMES, COEFFS = 49, 10
FILTERS = 64
BLOCKS = 4
KEYWORDS = 12
STEM_KERNEL = (10, 4)
STEM_STRIDE = 2
# TensorFlow "same" padding of the 10x4 stride-2 stem on 49x10: output 25x5, total padding
# (25-1)*2+10-49 = 9 rows (4 before, 5 after) and (5-1)*2+4-10 = 2 columns (1 and 1).
STEM_PADS = [4, 1, 5, 1]
POOL = (FRAMES // 2, COEFFS // 2)


def build_ds_cnn() -> onnx.ModelProto:
    """MLPerf Tiny DS-CNN: ``[1, 1, 49, 10]`` MFCC in, ``[1, 12]`` keyword probabilities out."""
    b = ModelBuilder("ds_cnn", DS_CNN_SEED)
    x = b.input("input", (1, 1, FRAMES, COEFFS))
    x = b.conv_bn_act(x, "conv1", 1, FILTERS, STEM_KERNEL, STEM_STRIDE, STEM_PADS, bias=True)
    for i in range(1, BLOCKS + 1):
        x = b.conv_bn_act(x, f"dw{i}", FILTERS, FILTERS, 3, group=FILTERS, bias=True)
        x = b.conv_bn_act(x, f"pw{i}", FILTERS, FILTERS, 1, bias=True)
    x = b.node("AveragePool", [x], "pool", kernel_shape=list(POOL), strides=list(POOL))
    x = b.classifier(x, "fc", FILTERS, KEYWORDS)
    x = b.node("Softmax", [x], "softmax", output="output", axis=-1)
    return b.build([(x, (1, KEYWORDS))],
                   doc="MLPerf Tiny DS-CNN keyword spotting, 49x10 MFCC input, 12-class Softmax")
