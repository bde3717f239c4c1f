"""Paths of the code generator that no other fast test builds (issue 13's survivors, tests/mutation/mutS.md):
each test builds one such path and checks its results against the reference."""
from __future__ import annotations

import numpy as np

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(13)


def W(b, *shape, scale=0.3):
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) * scale).astype(np.float32))


def test_horizontal_pointwise_convs_merge_along_m(cache_dir):
    """Two 1x1 Convs of one input whose positions fill whole panels are GEMMs with the weights in A
    (``weights_axis`` "m"): the horizontal stage stacks their weights along M, one GEMM, each sibling its
    own rows (3 and 5 channels, one with bias and Relu)."""
    b = GraphBuilder("merge_m")
    x = b.input("x", (1, 6, 16, 16))
    c1 = b.op("Relu", b.op("Conv", x, W(b, 3, 6, 1, 1), W(b, 3), name="c1"), name="r1")
    c2 = b.op("Conv", x, W(b, 5, 6, 1, 1), name="c2")
    g = b.build(c1, c2)
    plan = group_by_names(g, [("horizontal", ["c1", "r1", "c2"])])
    # without tail panels (``gemm.tail_panels``: 8 rows would be two 4-row panels, two call sites), B packed
    # before the calls (``gemm.pack_in_kernel``: its first row block's call another micro-kernel)
    got, want, model = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_tail_panels=False,
                                                                            gemm_pack_in_kernel=False))
    assert_close(got, want)
    assert model.report["functions"] == 1
    assert model.program.source.count("opfuse_ukr_") == 2  # one GEMM: the micro-kernel and one call site


def test_horizontal_gemms_merge_along_n(cache_dir):
    """Gemms of one run-time A with constant Bs (one transposed, with alpha, beta and a C) stack their Bs along
    N: one GEMM, each sibling its own columns and its own alpha/beta finish."""
    b = GraphBuilder("merge_n_gemm")
    a = b.input("a", (10, 12))
    g1 = b.op("Gemm", a, W(b, 12, 7), W(b, 7), name="g1")
    g2 = b.op("Gemm", a, W(b, 9, 12), W(b, 9), transB=1, alpha=0.5, beta=2.0, name="g2")
    g = b.build(b.op("Relu", g1, name="r1"), g2)
    plan = group_by_names(g, [("horizontal", ["g1", "r1", "g2"])])
    got, want, model = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_tail_panels=False))
    assert_close(got, want)
    assert model.report["functions"] == 1
    assert model.program.source.count("opfuse_ukr_") == 2


def test_batch_normalization_inside_a_pointwise_chain(cache_dir):
    """A BatchNormalization with constant statistics inlined in an elementwise chain (no anchor): it broadcasts
    its per-channel terms along the channel axis of the chain's domain, another operand a row (the last axis)."""
    b = GraphBuilder("bn_chain")
    x = b.input("x", (2, 5, 6, 7))
    var = b.const("var", (rng.random(5) + 0.5).astype(np.float32))
    bn = b.op("BatchNormalization", b.op("Sigmoid", x, name="sig"), W(b, 5), W(b, 5), W(b, 5), var, name="bn")
    y = b.op("Relu", b.op("Mul", bn, W(b, 7), name="mul"), name="relu")
    g = b.build(y)
    plan = group_by_names(g, [("elementwise", ["sig", "bn", "mul", "relu"])])
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    assert model.report["functions"] == 1


def test_pointwise_chain_whose_innermost_loop_is_axes_of_two(cache_dir):
    """An elementwise chain over (3, 2, 2, 2, 2): the innermost loop is the four axes of extent 2 (16 elements),
    along which one operand varies and the other (one value per row) does not: in vector intrinsics, the
    invariant operand hoisted, and the reference's values."""
    b = GraphBuilder("twos")
    x = b.input("x", (3, 2, 2, 2, 2))
    y = b.op("Relu", b.op("Add", b.op("Mul", x, W(b, 3, 1, 1, 1, 1), name="mul"), W(b, 1, 2, 2, 2, 2), name="add"),
             name="relu")
    g = b.build(y)
    plan = group_by_names(g, [("elementwise", ["mul", "add", "relu"])])
    got, want, model = run_both(g, plan, cache_dir)
    assert_close(got, want)
    notes = [n for k in model.program.kernels for n in k.notes]
    assert any("elementwise loop in" in n and "intrinsics" in n for n in notes), notes


def test_integer_min_and_clip_with_run_time_bounds(cache_dir):
    """Min of integer tensors and an integer Clip whose bounds are run-time values: the plain C comparisons (no
    NaN to keep), the reference's values."""
    b = GraphBuilder("int_min")
    x, y = b.input("x", (3, 4), np.int32), b.input("y", (3, 4), np.int32)
    lo, hi = b.input("lo", (), np.int32), b.input("hi", (), np.int32)
    g = b.build(b.op("Min", x, y, name="min"), b.op("Clip", x, lo, hi, name="clip"))
    got, want, _ = run_both(g, None, cache_dir)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
