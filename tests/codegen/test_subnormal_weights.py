"""``CodegenOptions.flush_subnormal_weights``: the float32 constants a product reads (Conv, ConvTranspose, Gemm,
MatMul weights and biases) are generated with their subnormal values as zeros of the same sign, counted in the
program and the build report, named in the C; every other constant (an elementwise op's, a constant graph output)
keeps its bits. The outputs stay within tolerance of the reference, which reads the weights as they are."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.weights import flush_subnormals
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

TINY = np.finfo(np.float32).tiny  # 2^-126, the smallest normal float32


def test_flush_subnormals_zeroes_them_keeping_the_sign():
    a = np.array([1e-40, -1e-40, TINY, -TINY, 0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 5e-45, -1.4e-45],
                 dtype=np.float32)
    out, count = flush_subnormals(a)
    assert count == 4
    want = np.array([0.0, -0.0, TINY, -TINY, 0.0, -0.0, 1.0, np.inf, -np.inf, np.nan, 0.0, -0.0], dtype=np.float32)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    assert a[0] == np.float32(1e-40)  # the input is not changed
    same, none = flush_subnormals(np.ones((2, 3), np.float32))
    assert none == 0 and same.shape == (2, 3)
    double = np.array([1e-310], dtype=np.float64)  # float32 only
    assert flush_subnormals(double) == (double, 0)


def _graph(tiny_in_scale: bool = False):
    """Conv 3x3 (8 -> 16, bias) whose weights hold 37 subnormal values and whose bias 2, then a Mul by a constant
    that holds 3 (``tiny_in_scale``: an elementwise op's constant, left as it is)."""
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    flat = w.reshape(-1)
    picks = rng.choice(flat.size, 37, replace=False)
    flat[picks] = (rng.choice([-1.0, 1.0], 37) * rng.uniform(1e-44, 1e-39, 37)).astype(np.float32)
    bias = rng.standard_normal(16).astype(np.float32)
    bias[[3, 9]] = np.float32(-3e-39), np.float32(7e-42)
    scale = np.full((1, 16, 1, 1), 0.5, np.float32)
    if tiny_in_scale:
        scale[0, :3, 0, 0] = np.float32(2e-39)
    b = GraphBuilder("subnormal")
    x = b.input("x", (1, 8, 12, 12))
    c = b.op("Conv", x, b.const("w", w), b.const("bias", bias), pads=[1, 1, 1, 1], name="conv")
    y = b.op("Mul", b.op("Relu", c, name="relu"), b.const("scale", scale), name="mul")
    g = b.build(y)
    return g, FusionPlan(g, [FusionGroup("g", list(g.nodes), "conv_epilogue", g.nodes[0])]), w


def _subnormals(blob: bytes) -> int:
    """Words of the blob whose bits are a subnormal float32's."""
    f = np.frombuffer(blob[:len(blob) // 4 * 4], dtype=np.uint32) & np.uint32(0x7FFFFFFF)
    return int(np.count_nonzero((f != 0) & (f < 0x00800000)))


@pytest.mark.parametrize("winograd", ["on", "off"])
def test_product_weights_flushed_outputs_within_tolerance(winograd, cache_dir):
    g, plan, _ = _graph()
    options = CodegenOptions(winograd=winograd)
    prog = generate(g, plan, options=options)
    assert prog.subnormals_flushed == 39
    assert "39 subnormal values" in prog.source and "flush_subnormal_weights" in prog.source
    feeds = reference.random_inputs(g, 0)
    model = build(g, plan, cache_dir=cache_dir, options=options)
    assert model.report["subnormal_weights_flushed"] == 39
    assert_close(model.run(feeds), reference.run(g, feeds))
    kept = generate(g, plan, options=CodegenOptions(winograd=winograd, flush_subnormal_weights=False))
    assert kept.subnormals_flushed == 0 and "subnormal values" not in kept.source
    # Every array derived from the weights (packed panels, Winograd's U) reads the flushed ones: the blob holds at
    # least the 39 fewer words of a subnormal's bits (the rest: small integers of offset tables, in both).
    assert _subnormals(kept.weights) - _subnormals(prog.weights) >= 39
    if winograd == "on":  # (no offset table: none left at all)
        assert _subnormals(prog.weights) == 0
    off = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(winograd=winograd, flush_subnormal_weights=False))
    assert off.report["subnormal_weights_flushed"] == 0
    assert_close(off.run(feeds), reference.run(g, feeds))


def test_an_elementwise_constant_keeps_its_subnormals(cache_dir):
    """The Mul's scale (not a product's operand) is generated as it is: only the Conv's 39 are counted."""
    g, plan, _ = _graph(tiny_in_scale=True)
    prog = generate(g, plan, options=CodegenOptions())
    assert prog.subnormals_flushed == 39
    feeds = reference.random_inputs(g, 0)
    assert_close(build(g, plan, cache_dir=cache_dir).run(feeds), reference.run(g, feeds))


def test_matmul_weights_flushed_and_a_constant_output_kept(cache_dir):
    """A MatMul's constant operand is a product's weight; a constant graph output is returned as it is."""
    w = np.full((6, 5), 0.25, np.float32)
    w[1, 2], w[4, 0] = np.float32(1e-41), np.float32(-2e-40)
    const_out = np.array([1e-40, 2.0], np.float32)
    b = GraphBuilder("mm_subnormal")
    x = b.input("x", (3, 6))
    y = b.op("MatMul", x, b.const("w", w), name="mm")
    g = b.build(y, b.const("c", const_out))
    plan = FusionPlan(g, [FusionGroup("g", [g.nodes[0]], "single", g.nodes[0])])
    prog = generate(g, plan, options=CodegenOptions())
    assert prog.subnormals_flushed == 2
    feeds = reference.random_inputs(g, 0)
    got = build(g, plan, cache_dir=cache_dir).run(feeds)
    want = reference.run(g, feeds)
    assert_close(got, want)
    name = g.outputs[1].name
    assert np.array_equal(got[name].view(np.uint32), const_out.view(np.uint32))
