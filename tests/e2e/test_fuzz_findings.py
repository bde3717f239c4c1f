"""Bugs ``opfuse fuzz`` found, each shrunk to its minimal graph: the C backend (unfused and fused
by the named planner) against the reference executor."""
from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.testing.fuzz_check import compare


def _agrees(graph, feeds, **compile_kw) -> None:
    want = reference.run(graph, feeds)
    for fuse in (False, True):
        got = opfuse.compile(graph, fuse=fuse, **compile_kw).run(feeds)
        diff = compare(got, want)
        assert diff is None, f"{'fused' if fuse else 'unfused'}: {diff}"


def test_concat_of_a_value_aliased_into_an_outer_concat_copies_it():
    """Concat(Concat(m, m), m): m is written in place into the outer Concat only; the inner
    Concat skipped copying it, as if it were aliased into its own output (garbage out)."""
    b = GraphBuilder("concat_alias")
    m = b.op("ReduceMean", b.input("x", (1, 11)), axes=[1], keepdims=0)
    g = b.build(b.op("Concat", b.op("Concat", m, m, axis=0), m, axis=0))
    x = np.random.default_rng(0).uniform(-2, 2, (1, 11)).astype(np.float32)
    _agrees(g, {"x": x}, planner="rules")


def test_signed_overflow_wraps_and_checks_after_it_stay():
    """Relu(1 + Relu(x)) at x = INT_MAX: the sum wraps to INT_MIN and Relu makes it 0. gcc took the
    overflow for impossible (undefined in C) and dropped the second Relu's test: INT_MIN came out.
    Fixed by compiling with -fwrapv."""
    b = GraphBuilder("wrap")
    x = b.input("x", (1, 3), np.int32)
    g = b.build(b.op("Relu", b.op("Add", b.const("one", np.array(1, np.int32)), b.op("Relu", x))))
    _agrees(g, {"x": np.array([[2 ** 31 - 1, 1, 47830817]], np.int32)})


@pytest.mark.parametrize("dt", [np.int8, np.int32, np.int64])
def test_integer_pow_is_exact_and_wraps(dt):
    """C computed integer Pow in double and converted back: INT_MIN ** 2 gave INT_MIN (an
    out-of-range conversion), 3 ** 39 lost bits above 2^53; NumPy wraps exactly."""
    b = GraphBuilder("ipow")
    x = b.input("x", (6,), dt)
    e = b.input("e", (6,), dt)
    g = b.build(b.op("Pow", x, e), b.op("Pow", x, b.const("three", np.array(3, dt))))
    info = np.iinfo(dt)
    feeds = {"x": np.array([info.min, 3, -3, 1, -1, 2], dt), "e": np.array([2, 39 % 127, 5, -3, -3, -1], dt)}
    _agrees(g, feeds)


def test_integer_zero_to_a_negative_power_is_an_input_error():
    b = GraphBuilder("ipow0")
    g = b.build(b.op("Pow", b.input("x", (2,), np.int64), b.input("e", (2,), np.int64), name="p"))
    feeds = {"x": np.array([2, 0], np.int64), "e": np.array([1, -1], np.int64)}
    for fuse in (False, True):
        with pytest.raises(InputError, match="node 'p' \\(Pow\\): integer 0 to a negative power"):
            opfuse.compile(g, fuse=fuse).run(feeds)


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_reduce_mean_is_exact_and_truncates_toward_zero(dt):
    """C summed int32 in int32 (wrapped), the reference averaged in float64 (inexact for int64,
    INT64_MIN for a row of INT64_MAX); both now give onnxruntime's exact, truncated mean."""
    info = np.iinfo(dt)
    b = GraphBuilder("imean")
    x = b.input("x", (4, 4), dt)
    g = b.build(b.op("ReduceMean", x, axes=[1], keepdims=0), b.op("ReduceMean", x, axes=[0], keepdims=1))
    x = np.array([[info.max] * 4, [-7, 0, 0, 0], [info.max, 1, 0, 0], [info.min, info.min, info.max, -5]], dt)
    want = [info.max, -1, (int(info.max) + 1) // 4, -((2 * -int(info.min) - int(info.max) + 5) // 4)]
    np.testing.assert_array_equal(reference.run(g, {"x": x})[g.outputs[0].name], np.array(want, dt))
    _agrees(g, {"x": x})


def test_reduction_over_one_element_then_its_input_in_the_epilogue():
    """x - ReduceMean(x) over an axis of length 1, fused: the reduction's loop declared x[0] in
    its C block and the epilogue, reading x at the same index, reused the name outside it (gcc:
    't4' undeclared)."""
    b = GraphBuilder("mean1")
    x = b.input("x", (1,))
    g = b.build(b.op("Sub", x, b.op("ReduceMean", x, axes=[0], keepdims=1)))
    _agrees(g, {"x": np.array([1.5], np.float32)})


@pytest.mark.parametrize("dt", [np.int32, np.int64])
def test_integer_gemm_with_integral_alpha_and_beta_wraps(dt):
    """The reference scaled integer Gemm in float64 (alpha=2): an overflow became INT_MIN through
    an undefined conversion, where C (and MatMul, Mul, Add) wrap."""
    info = np.iinfo(dt)
    b = GraphBuilder("igemm")
    g = b.build(b.op("Gemm", b.input("a", (3, 1), dt), b.const("w", np.array([[3, -4]], dt)),
                     b.const("c", np.array([[-1, 2]], dt)), alpha=2.0, beta=-3.0))
    _agrees(g, {"a": np.array([[info.max], [info.min], [7]], dt)})


def test_concat_that_leaves_its_group_and_is_padded_inside_it():
    """An injective group Concat -> Pad whose Concat result is also read outside: the Concat
    became an anchor (copy by slices) and the Pad its epilogue, which no epilogue can be
    (UnsupportedGroupError at compile). Now the Concat stays inline there."""
    from opfuse.ir.plan import FusionGroup, FusionPlan
    from opfuse.runtime.native import build
    b = GraphBuilder("concat_pad")
    c = b.op("Concat", b.input("a", (1,), np.int32), b.input("b", (1,), np.int32), axis=0)
    p = b.op("Pad", c, b.const("pads", np.array([1, 2], np.int64)), mode="reflect")
    g = b.build(p, b.op("Reshape", c, b.const("shape", np.array([2, 1], np.int64))))
    plan = FusionPlan(g, [FusionGroup("cp", g.nodes[:2], "injective"), FusionGroup("r", g.nodes[2:], "single")])
    feeds = {"a": np.array([3], np.int32), "b": np.array([-4], np.int32)}
    assert compare(build(g, plan).run(feeds), reference.run(g, feeds)) is None


def _pow_then_slice(dt):
    """Pow(x + 1, e) -> Slice (columns 0:2) -> Neg: fused, the kernel computes only the sliced
    columns; e broadcasts along the rows."""
    b = GraphBuilder("pow_slice")
    x, e = b.input("x", (2, 4), dt), b.input("e", (4,), dt)
    p = b.op("Pow", b.op("Add", x, b.const("one", np.array(1, dt))), e, name="p")
    s = b.op("Slice", p, b.const("st", np.array([0], np.int64)), b.const("en", np.array([2], np.int64)),
             b.const("ax", np.array([1], np.int64)), name="s")
    return b.build(b.op("Neg", s, name="n"))


@pytest.mark.parametrize("dt", [np.int32, np.int64])
@pytest.mark.parametrize("planner", ["rules", "auto"])
def test_integer_zero_to_a_negative_power_faults_when_a_fused_slice_skips_it(dt, planner):
    """Integer Pow's fault was checked only where an element is computed: with a Slice fused
    after it, the element 0 ** -1 outside the slice was never computed and the run returned
    numbers, where the reference (and the unfused build) raise. It is now checked whole before
    the kernel's loops (codegen/prechecks.py), as integer Div and Gather are."""
    g = _pow_then_slice(dt)
    bad = {"x": np.array([[0, 1, -1, 2], [3, 4, 5, 6]], dt), "e": np.array([1, 2, -1, 1], dt)}
    good = {"x": bad["x"], "e": np.array([1, 2, 3, -1], dt)}
    with pytest.raises(InputError):
        reference.run(g, bad)
    for fuse in (False, True):
        model = opfuse.compile(g, fuse=fuse, planner=planner)
        if fuse:
            assert model.report["kernels"] == 1
        with pytest.raises(InputError, match="node 'p' \\(Pow\\): integer 0 to a negative power"):
            model.run(bad)
    _agrees(g, good, planner=planner)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_reduce_log_sum_exp_over_an_axis_of_one(dt):
    """ReduceLogSumExp walks the reduced elements twice (the max, then the sum of exp); over an
    axis of length 1 both passes read x at the same index, and the second reused the name the
    first had declared inside its loop (gcc: 't5' undeclared)."""
    b = GraphBuilder("lse1")
    x = b.input("x", (2, 1), dt)
    g = b.build(b.op("ReduceLogSumExp", x, axes=[-1], keepdims=1))
    _agrees(g, {"x": np.array([[0.5], [-3.0]], dt)})


@pytest.mark.parametrize("dt", [np.float32, np.int64])
def test_constant_pad_reads_its_input_where_gcc_vectorises_the_loop(dt):
    """Pad 2x12x3 by (1, 2, 2) before and (0, 1, 2) after: 24 of the 72 copied values came out as
    whatever lay elsewhere in memory. The preamble's ``#pragma GCC optimize("no-thread-jumps")`` made
    gcc 12's loop vectoriser (-O3, AVX2 or AVX-512) miscompile the kernel's masked loads; the pragma
    is gone. Every value of the input is distinct, so a misplaced read cannot pass."""
    b = GraphBuilder("pad_vect")
    x = b.input("x", (2, 12, 3), dt)
    g = b.build(b.op("Pad", x, b.const("pads", np.array([1, 2, 2, 0, 1, 2], np.int64))))
    _agrees(g, {"x": (np.arange(72) + 1).reshape(2, 12, 3).astype(dt)})


def test_the_generated_c_sets_no_gcc_optimize_pragma():
    """``#pragma GCC optimize`` changes gcc's options for everything after it, in ways gcc's own manual
    calls unfit for production code; one of them broke the Pad above. The flags are the toolchain's."""
    from opfuse.codegen import generate
    from opfuse.ir.plan import FusionGroup, FusionPlan
    b = GraphBuilder("pragma")
    g = b.build(b.op("Relu", b.input("x", (8,))))
    src = generate(g, FusionPlan(g, [FusionGroup("r", list(g.nodes), "single")])).source
    assert "#pragma GCC optimize" not in src


def test_grid_sample_taps_outside_an_infinite_pixel_add_zero():
    """Bicubic GridSample, zeros padding, over a 4x1 plane holding +inf and -inf: the reference read
    each tap outside the plane at its clipped index and multiplied by 0, so inf * 0 made NaN where
    onnxruntime and the C backend give +inf (the -inf tap has a negative weight)."""
    b = GraphBuilder("grid_inf")
    x = b.input("x", (1, 1, 4, 1))
    grid = b.const("grid", np.array([[[[-0.7422012, -0.28940257]]]], np.float32))
    g = b.build(b.op("GridSample", x, grid, mode="bicubic", padding_mode="zeros", align_corners=0))
    feeds = {"x": np.array([0.38528848, np.inf, -np.inf, -0.29346916], np.float32).reshape(1, 1, 4, 1)}
    assert np.isposinf(reference.run(g, feeds)[g.outputs[0].name]).all()
    _agrees(g, feeds)


@pytest.mark.parametrize(("mode", "padding"), [("bicubic", "zeros"), ("bilinear", "border"), ("bicubic", "border")])
def test_grid_sample_at_a_nan_coordinate_is_nan(mode, padding):
    """A NaN in the grid: the reference cast the NaN tap positions to int64 and indexed with INT64_MIN
    (an IndexError traceback); the C backend added 0 for every tap outside the input (zeros padding) and
    returned 0 where onnxruntime returns NaN (the taps' weights are NaN). Now both give NaN there."""
    b = GraphBuilder("grid_nan")
    x = b.input("x", (1, 2, 3, 4))
    grid = np.array([[[[0.1, -0.3], [np.nan, 0.2], [0.5, np.nan], [np.inf, 0.0]]]], np.float32)
    g = b.build(b.op("GridSample", x, b.const("grid", grid), mode=mode, padding_mode=padding, align_corners=0))
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)}
    want = reference.run(g, feeds)[g.outputs[0].name]
    assert np.isnan(want[..., 1:3]).all() and np.isfinite(want[..., 0]).all()
    _agrees(g, feeds)


def test_a_kernel_reads_what_the_kernel_before_it_wrote_into_a_reused_buffer():
    """Resize -> LayerNorm -> Split (axis -2) -> Split (axis 0), float64, fused: the outer Split's second
    part reuses the Resize's arena buffer. With every kernel inlined into ``opfuse_run``, gcc 12.2's -O3
    basic-block vectoriser took the kernels' ``restrict`` parameters as licence to load the inner Split's
    input before the outer Split had stored it: 7 of 8 values were the Resize's. Kernels are out of line
    now (``OPFUSE_KERNEL``); found by ``opfuse fuzz`` (seed 3602, graph 427)."""
    dt = np.float64
    b = GraphBuilder("nested_split")
    x = b.input("x", (2, 4, 2), dt)
    r = b.op("Resize", x, None, b.const("scales", np.array([1, 1, 2], np.float32)), mode="linear",
             coordinate_transformation_mode="align_corners")
    ln = b.op("LayerNormalization", r, b.const("s", np.ones(4, dt)), b.const("bias", np.zeros(4, dt)), epsilon=1e-3)
    a0, a1 = b.op("Split", ln, axis=-2, split=[2, 2], num_outputs=2)
    _, c1 = b.op("Split", a1, axis=0, split=[1, 1], num_outputs=2)
    g = b.build(a0, b.op("Trilu", ln, b.const("k", np.array(-2, np.int64)), upper=0), c1)
    _agrees(g, {"x": np.random.default_rng(0).normal(size=(2, 4, 2)).astype(dt)})


def test_every_kernel_is_a_function_of_its_own():
    """The guard of the test above, on the C text: each kernel carries ``OPFUSE_KERNEL`` (noinline)."""
    from opfuse.codegen import generate
    from opfuse.ir.plan import FusionGroup, FusionPlan
    b = GraphBuilder("two_kernels")
    x = b.input("x", (4, 8))
    g = b.build(b.op("Softmax", b.op("ReduceSum", x, axes=[1], keepdims=1), axis=0), b.op("Relu", x))
    src = generate(g, FusionPlan(g, [FusionGroup(f"g{k}", [n], "single") for k, n in enumerate(g.nodes)])).source
    assert "#define OPFUSE_KERNEL __attribute__((noinline))" in src
    heads = [ln for ln in src.splitlines() if ln.startswith(("static void k", "static int k", "OPFUSE_KERNEL"))]
    assert len(heads) == len(g.nodes) and all(h.startswith("OPFUSE_KERNEL static ") for h in heads)


@pytest.mark.parametrize("dt", [np.float64, np.float32])
def test_constant_pad_reads_no_input_under_a_condition(dt):
    """Pad (constant 0.73) of a 1x6x2x1 input to 3x9x3x1 and its Relu, fused in one loop nest: gcc 12.2 at -O3
    with -fwrapv vectorised the guarded read (``if (inside) pad = x[...]``) into masked gathers that returned
    other memory in 2 of 81 values (2.0e-320; the same C is right at -O2 or without -fwrapv). The Pad now reads
    the nearest position inside its input and selects the fill outside. Found by ``opfuse fuzz`` (seed 4202)."""
    b = GraphBuilder("pad_select")
    x = b.input("x", (1, 6, 2, 1), dt)
    p = b.op("Pad", x, b.const("pads", np.array([1, 1, 0, 0, 1, 2, 1, 0], np.int64)),
             b.const("value", np.array(0.7295951843261719, dt)), mode="constant")
    g = b.build(p, b.op("Relu", p))
    _agrees(g, {"x": np.random.default_rng(1).uniform(-1, 1, (1, 6, 2, 1)).astype(dt)})


@pytest.mark.parametrize(("op", "include_pad"), [("AveragePool", 0), ("AveragePool", 1), ("MaxPool", 0)])
@pytest.mark.parametrize("shape", [(1, 2, 5, 2), (1, 3, 9, 2)])
def test_generic_pool_reads_no_input_under_a_condition(op, include_pad, shape):
    """A float64 3x3 pool (padded, the generic window path) and its Relu: the window skipped a tap outside
    the input with ``continue`` before its load, and gcc 12.2 at -O3 vectorised the unrolled window with
    masked loads that returned wrong values (AveragePool without the pads counted: 4-5 of 20 outputs; right
    with -fno-tree-loop-if-convert). Each tap now reads a position inside the input and counts only where it is
    inside."""
    b = GraphBuilder("pool_select")
    x = b.input("x", shape, np.float64)
    kw = {"count_include_pad": include_pad} if op == "AveragePool" else {}
    g = b.build(b.op("Relu", b.op(op, x, kernel_shape=[3, 3], pads=[1, 1, 1, 1], **kw)))
    _agrees(g, {"x": np.random.default_rng(3).uniform(-3, 3, shape)})


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_sibling_pools_fused_horizontally_propagate_nan(dt):
    """MaxPool and AveragePool over one input with one window, fused side by side (one loop over the windows):
    the shared window kept ``v > max ? v : max``, which drops a NaN tap (issue 13: NaN propagates through
    MaxPool as in onnxruntime); the single-pool path had it right. Now both use ``nan_max``, and the shared
    window reads no input under a condition either (the pool path's gcc 12.2 miscompilation)."""
    b = GraphBuilder("pool_siblings")
    x = b.input("x", (1, 2, 9, 2), dt)
    kw = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}
    g = b.build(b.op("Relu", b.op("MaxPool", x, **kw)), b.op("Relu", b.op("AveragePool", x, **kw)))
    xv = np.random.default_rng(2).uniform(-3, 3, (1, 2, 9, 2)).astype(dt)
    xv[0, 0, 4, 1] = np.nan
    plan = opfuse.compile(g, planner="rules").plan
    assert [grp.kind for grp in plan.groups] == ["horizontal"]
    _agrees(g, {"x": xv}, planner="rules")


@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_keeps_an_infinite_input_infinite(threads):
    """Seed 41204, graph 1887, shrunk: a 3x3 Conv (8 -> 8 channels, 5x2, padding 1) that the ``thresholds`` profile
    runs as Winograd, on inputs holding +-inf and NaN: the transforms' differences (inf - inf) made NaN of every
    output of an infinite input's tile, where the direct sum gives +-inf (53 of 160 outputs differed)."""
    from opfuse.runtime.native import build
    from opfuse.testing.fuzz_check import codegen_options
    b = GraphBuilder("wino_inf")
    w = np.random.default_rng(1).uniform(-1, 1, (8, 8, 3, 3)).astype(np.float32)
    g = b.build(b.op("Conv", b.input("x", (2, 8, 5, 2)), b.const("w", w), kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    x = np.random.default_rng(2).uniform(-2, 2, (2, 8, 5, 2)).astype(np.float32)
    x[0, 0, 0, 0], x[0, 3, 4, 1], x[1, 5, 2, 0], x[1, 6, 1, 1] = np.inf, -np.inf, np.inf, np.nan
    options = codegen_options("thresholds")
    model = build(g, None, options=options, threads=threads)
    assert any("Winograd F(" in n for k in model.program.kernels for n in k.notes)
    want = reference.run(g, {"x": x})
    assert np.isinf(next(iter(want.values()))).any()
    assert compare(model.run({"x": x}), want) is None
