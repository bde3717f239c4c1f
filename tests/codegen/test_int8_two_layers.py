"""Two int8 host kernels in one program whose 8-bit inputs differ in type (a uint8 input layer, an int8 one after it):
each kernel's own packing helper (``qgemm.py``'s u8/s8 quads of the word image, ``qmatmul_host.py``'s u8/s8 row
packing) is in the C once, and both layers are bit-exact against the reference, built for AVX-512 (this host's
``vpdpbusd``), with AVX2 alone, without AVX2 (the plain ``#else``) and as plain C99 (``simd="none"``: the portable
kernels, ``qconv.py`` and ``qmatmul.py``, two of a kind in one program); likewise a conv and a matmul side by side."""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run
from test_int8_host import _built_with, _feeds

AVX512 = CodegenOptions(vector_isa="avx512")


def _layer(b, x, zp, w, op, tag=None, scale=None, **attrs):
    """8-bit x -> Cast/Sub(zp) -> Conv or MatMul(w) -> Add(bias) -> Requantize to int8 (zero point 2), each layer's
    bias and multiplier its own (``scale``, or set by ``w``'s first dimension); ``tag`` names the layer's constants."""
    tag = tag or f"{op}{w.shape[0]}"
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const(f"zp_{tag}", np.array(zp, np.int32)))
    acc = b.op(op, xc, b.const(f"w_{tag}", w), **attrs)
    n = w.shape[0] if op == "Conv" else w.shape[1]
    bias = (np.arange(n) * 53 - 40 * n + 11 * zp).astype(np.int32)  # each layer's own (its zero point differs)
    acc = b.op("Add", acc, b.const(f"b_{tag}", bias.reshape((1, n, 1, 1) if op == "Conv" else (n,))))
    m, s = fixed_point_multiplier(scale or 1e-4 * w.shape[0])
    mult, shift = b.const(f"m_{tag}", np.array(m, np.int32)), b.const(f"s_{tag}", np.array(s, np.int32))
    return b.op("Requantize", acc, mult, shift, zero_point=2, lo=-128, hi=127, to=int(TensorProto.INT8))


def _convs():
    rng = np.random.default_rng(21)
    b = GraphBuilder("two_convs")
    x = b.input("x", (1, 5, 7, 9), "uint8")
    y = _layer(b, x, 128, rng.integers(-128, 128, (6, 5, 3, 3)).astype(np.int32), "Conv", pads=[1] * 4)
    y = _layer(b, y, 2, rng.integers(-128, 128, (7, 6, 3, 3)).astype(np.int32), "Conv", pads=[1] * 4)
    return b.build(y)


def _matmuls():
    rng = np.random.default_rng(22)
    b = GraphBuilder("two_matmuls")
    x = b.input("x", (6, 13), "uint8")
    y = _layer(b, x, 128, rng.integers(-128, 128, (13, 11)).astype(np.int32), "MatMul")
    y = _layer(b, y, 2, rng.integers(-128, 128, (11, 9)).astype(np.int32), "MatMul")
    return b.build(y)


def _depthwise_pair():
    """Two depthwise layers (rows of 6: 8 channels per vector), each its own taps, bias and multiplier."""
    rng = np.random.default_rng(24)
    b = GraphBuilder("two_depthwise")
    y = b.input("x", (1, 8, 6, 6), "int8")
    for i, zp in enumerate((-3, 2)):
        w = rng.integers(-128, 128, (8, 1, 3, 3)).astype(np.int32)
        y = _layer(b, y, zp, w, "Conv", tag=f"dw{i}", scale=(i + 2) * 1e-3, pads=[1] * 4, group=8)
    return b.build(y)


def _conv_and_matmul():
    """A conv of one input and a matmul of another in one program: the plain branches of both kernels read their
    packed weights through the same helpers (``opfuse_q8_w8`` ...), defined once."""
    rng = np.random.default_rng(23)
    b = GraphBuilder("conv_and_matmul")
    y = _layer(b, b.input("x", (1, 5, 7, 9), "int8"), -3, rng.integers(-128, 128, (6, 5, 3, 3)).astype(np.int32),
               "Conv", pads=[1] * 4)
    z = _layer(b, b.input("a", (6, 13), "int8"), 4, rng.integers(-128, 128, (13, 11)).astype(np.int32), "MatMul")
    return b.build(y, z)


@pytest.mark.parametrize(("make", "helpers"), [
    (_convs, ("opfuse_q8_quads_u8", "opfuse_q8_quads_s8")),
    (_matmuls, ("opfuse_q8mm_pack_quads_u8", "opfuse_q8mm_pack_quads_s8")),
    (_conv_and_matmul, ("opfuse_q8_w8",)),
    (_depthwise_pair, ("opfuse_q8_dw_row_s8",)),
], ids=["conv", "matmul", "conv-and-matmul", "depthwise"])
def test_uint8_then_int8_layers_in_one_program_are_bit_exact(make, helpers):
    g = make()
    comp = plan_model(g)
    source = generate(comp.plan.graph, comp.plan, memory=comp.memory, options=AVX512).source
    for h in helpers:
        assert len(re.findall(rf"static (?:inline )?\w+ {h}\(", source)) == 1, h  # defined, once
    feeds = _feeds(g)
    want = run(g, feeds)
    models = (build(comp.plan.graph, comp.plan, memory=comp.memory, options=AVX512),
              build(comp.plan.graph, comp.plan, memory=comp.memory, options=AVX512.with_(simd="none")),
              _built_with(comp.plan.graph, comp.plan, AVX512, "-mno-avx512f"),
              _built_with(comp.plan.graph, comp.plan, AVX512, "-mno-avx2"))
    for model in models:
        got = model.run(feeds)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
