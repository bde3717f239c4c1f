"""2-D MaxPool and AveragePool vectorised along the output rows (``codegen/pool.py``
``_lower_rows``): equal to the reference for every geometry, NaN propagating, the AVX2 and the
plain C99 path (``simd="none"``) giving the same bits, with a fused prologue and epilogue."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, group_by_names
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.pool import _separable
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

# (kernel, strides, pads [top, left, bottom, right], ceil_mode, input (H, W))
GEOMETRIES = [
    ((2, 2), (2, 2), (0, 0, 0, 0), 0, (8, 8)),
    ((2, 2), (2, 2), (0, 0, 0, 0), 1, (9, 7)),
    ((3, 3), (2, 2), (1, 1, 1, 1), 0, (11, 13)),
    ((3, 3), (2, 2), (0, 0, 0, 0), 1, (10, 10)),
    ((3, 3), (1, 1), (1, 1, 1, 1), 0, (7, 19)),
    ((3, 3), (1, 2), (0, 1, 2, 0), 0, (9, 21)),
    ((5, 5), (1, 1), (2, 2, 2, 2), 0, (10, 10)),
    ((5, 5), (2, 2), (2, 1, 1, 2), 1, (13, 11)),
    ((2, 3), (1, 1), (0, 0, 1, 2), 0, (5, 37)),
]


def _graph(op: str, geometry, *, prologue: bool, epilogue: bool, **attrs):
    kernel, strides, pads, ceil, (H, W) = geometry
    b = GraphBuilder("pool_rows")
    x = b.input("x", (2, 3, H, W))
    src = b.op("Relu", x, name="pre") if prologue else x
    y = b.op(op, src, name="pool", kernel_shape=list(kernel), strides=list(strides), pads=list(pads),
             ceil_mode=ceil, **attrs)
    if epilogue:
        y = b.op("Mul", y, b.const("scale", np.full((3, 1, 1), 1.5, np.float32)), name="post")
    g = b.build(y)
    names = (["pre"] if prologue else []) + ["pool"] + (["post"] if epilogue else [])
    return g, group_by_names(g, [("reduction", names)])


def _input(g, nan: bool) -> dict:
    shape = g.inputs[0].shape
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    if nan:
        x[0, 1, 2, 3] = np.nan
        x[1, 2, -1, -1] = np.nan
        x[1, 0, 0, :] = np.inf
    return {"x": x}


CASES = [("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}), ("AveragePool", {"count_include_pad": 1})]


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: f"k{g[0]}s{g[1]}p{g[2]}c{g[3]}")
@pytest.mark.parametrize("op,attrs", CASES, ids=["max", "avg", "avg_incl"])
@pytest.mark.parametrize("fused", [False, True], ids=["alone", "relu_mul"])
def test_rows_match_reference_and_plain_path(cache_dir, geometry, op, attrs, fused):
    g, plan = _graph(op, geometry, prologue=fused, epilogue=fused, **attrs)
    feeds = _input(g, nan=True)
    want = reference.run(g, feeds)
    vec = build(g, plan, cache_dir=cache_dir).run(feeds)
    plain = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(simd="none")).run(feeds)
    assert_close(vec, want)
    name = g.outputs[0].name
    np.testing.assert_array_equal(vec[name], plain[name])  # same bits (NaN where NaN)
    if op == "MaxPool":  # max is exact: equal to the reference, NaN where its window holds one
        np.testing.assert_array_equal(vec[name], want[name])
        assert np.isnan(vec[name]).any()


def test_vectorised_and_plain_code_both_generated():
    g, plan = _graph("MaxPool", GEOMETRIES[6], prologue=True, epilogue=False)
    src = generate(g, plan).source
    assert "_mm256_max_ps" in src and "#if defined(__AVX2__) && defined(__FMA__)" in src
    plain = generate(g, plan, options=CodegenOptions(simd="none")).source
    assert "_mm256" not in plain


@pytest.mark.parametrize("geometry", [GEOMETRIES[2], GEOMETRIES[6]], ids=["k3s2", "k5s1_separable"])
def test_prefetching_the_rows_ahead_changes_no_bits(cache_dir, geometry):
    """``pool_prefetch_bytes``: the in-place rows prefetch that far ahead, into the next plane and
    never past the tensor (a distance of 64 bytes reaches both here); 0 emits no prefetch."""
    g, plan = _graph("MaxPool", geometry, prologue=True, epilogue=True)
    near = CodegenOptions(pool_prefetch_bytes=64)
    assert "_mm_prefetch(" in generate(g, plan, options=near).source
    assert "_mm_prefetch(" not in generate(g, plan, options=CodegenOptions(pool_prefetch_bytes=0)).source
    assert "_mm_prefetch(" not in generate(g, plan, options=CodegenOptions(simd="none")).source
    feeds = _input(g, nan=True)
    name = g.outputs[0].name
    got = build(g, plan, cache_dir=cache_dir, options=near).run(feeds)[name]
    off = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(pool_prefetch_bytes=0)).run(feeds)[name]
    np.testing.assert_array_equal(got, off)
    np.testing.assert_array_equal(got, reference.run(g, feeds)[name])
    with pytest.raises(OpfuseError, match="pool_prefetch_bytes"):
        CodegenOptions(pool_prefetch_bytes=-1)


def test_separable_only_where_it_takes_fewer_maxima():
    assert _separable((5, 5), (1, 1), (1, 1), (10, 10))
    assert _separable((3, 3), (1, 1), (1, 1), (10, 10))
    assert not _separable((3, 3), (2, 2), (1, 1), (56, 56))
    assert not _separable((2, 2), (2, 2), (1, 1), (28, 28))


def test_all_padding_windows_and_negative_inputs(cache_dir):
    """Padding never wins a max: an all-negative plane keeps its negative maxima at the edges."""
    g, plan = _graph("MaxPool", ((3, 3), (1, 1), (1, 1, 1, 1), 0, (6, 6)), prologue=False, epilogue=False)
    x = -np.abs(np.random.default_rng(3).standard_normal((2, 3, 6, 6))).astype(np.float32) - 1
    got = build(g, plan, cache_dir=cache_dir).run({"x": x})
    want = reference.run(g, {"x": x})
    np.testing.assert_array_equal(got[g.outputs[0].name], want[g.outputs[0].name])
    assert (got[g.outputs[0].name] < 0).all()


STRIDE_3 = ((2, 2), (3, 3), (0, 0, 0, 0), 0, (9, 10))


@pytest.mark.parametrize("geometry", [GEOMETRIES[4], GEOMETRIES[6], GEOMETRIES[7], STRIDE_3],
                         ids=["k3s1", "k5s1", "k5s2", "k2s3"])
def test_max_through_a_padded_copy(cache_dir, geometry):
    """A prologue the max cannot hoist (Abs), and stride 3: the plane goes through the padded copy
    (AVX2 rows, separable where ``_separable`` says), still exact and equal to the plain path."""
    kernel, strides, pads, ceil, (H, W) = geometry
    b = GraphBuilder("pool_copy")
    x = b.input("x", (2, 3, H, W))
    y = b.op("MaxPool", b.op("Abs", x, name="pre"), name="pool", kernel_shape=list(kernel), strides=list(strides),
             pads=list(pads), ceil_mode=ceil)
    g = b.build(y)
    plan = group_by_names(g, [("reduction", ["pre", "pool"])])
    src = generate(g, plan).source
    assert "xpad" in src and "_mm256_max_ps" in src and "maskload" not in src
    feeds = _input(g, nan=True)
    want = reference.run(g, feeds)[g.outputs[0].name]
    vec = build(g, plan, cache_dir=cache_dir).run(feeds)[g.outputs[0].name]
    plain = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(simd="none")).run(feeds)[g.outputs[0].name]
    np.testing.assert_array_equal(vec, want)
    np.testing.assert_array_equal(vec, plain)


@pytest.mark.parametrize("fused", [False, True], ids=["alone", "relu_mul"])
@pytest.mark.parametrize("kernel,ceil", [((25, 5), 0), ((25, 5), 1), ((24, 5), 0)],
                         ids=["whole", "whole_ceil", "ds_cnn"])
def test_one_window_average_pool_is_a_mean_over_a_run(cache_dir, fused, ceil, kernel):
    """ds_cnn's AveragePool 24x5 stride 24x5 over a 25x5 map: one window, the first 24 full rows, no
    padding, so it is computed as GlobalAveragePool is (``pool.single_window_run``: one contiguous run
    per plane, no padded copy of it), equal to the reference, NaN where the window holds one (and not
    where only the row it leaves out does), the plain C99 path giving the same bits."""
    from opfuse.codegen.pool import single_window_run
    g, plan = _graph("AveragePool", (kernel, kernel, (0, 0, 0, 0), ceil, (25, 5)), prologue=fused, epilogue=fused)
    assert single_window_run(g.node("pool")) == kernel[0] * kernel[1]
    src = generate(g, plan).source
    assert "xpad" not in src  # the window kernel's padded plane buffer
    feeds = _input(g, nan=True)
    feeds["x"][0, 0, -1, 0] = np.nan  # in the last row: outside the 24-row window
    want = reference.run(g, feeds)
    vec = build(g, plan, cache_dir=cache_dir).run(feeds)
    plain = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(simd="none")).run(feeds)
    assert_close(vec, want)
    name = g.outputs[0].name
    np.testing.assert_array_equal(vec[name], plain[name])
    assert np.isnan(vec[name]).any() and np.isnan(vec[name][0, 0]) == (kernel[0] == 25)


@pytest.mark.parametrize("geometry", [((25, 5), (1, 1), (1, 0, 0, 0), 0, (25, 5)),  # padded
                                      ((5, 5), (5, 5), (0, 0, 0, 0), 0, (10, 10)),  # four windows
                                      ((24, 5), (1, 1), (0, 0, 0, 0), 0, (25, 5)),  # two windows
                                      ((25, 4), (1, 4), (0, 0, 0, 0), 0, (25, 5)),  # not full rows
                                      ((24, 5), (24, 5), (0, 0, 0, 0), 1, (25, 5))],  # ceil: a second window
                         ids=["padded", "tiled", "two", "part_rows", "ceil_two"])
def test_average_pool_over_part_of_the_plane_keeps_the_window_kernel(cache_dir, geometry):
    from opfuse.codegen.pool import single_window_run
    g, plan = _graph("AveragePool", geometry, prologue=False, epilogue=False, count_include_pad=0)
    assert single_window_run(g.node("pool")) == 0
    assert "xpad" in generate(g, plan).source
    feeds = _input(g, nan=False)
    assert_close(build(g, plan, cache_dir=cache_dir).run(feeds), reference.run(g, feeds))
