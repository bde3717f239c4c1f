"""The C kernels of the spatial sampling ops against the reference executor: GridSample (N-D, every
mode and padding), AffineGrid, Col2Im, DeformConv, RoiAlign, MaxUnpool, MaxPool's Indices and Resize
cubic/antialias (and nearest's rules on ties); unfused, fused with an epilogue through the whole compiler, and in
the portable C99 path (``simd="none"``)."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, run_both
from opfuse.codegen.options import CodegenOptions
from opfuse.ops import GraphBuilder

I64 = np.int64
F32 = np.float32


def _grid(rng, shape, nearest: bool):
    g = (rng.integers(-10, 11, shape) / 4).astype(F32)  # quarter steps: ties for nearest, out of range
    return g if nearest else g + rng.uniform(-0.05, 0.05, shape).astype(F32)


def sampling_graph():
    """One graph, one output per case (so one compiler run covers them all)."""
    rng = np.random.default_rng(0)
    b = GraphBuilder("sampling")
    outs = []
    x2 = b.input("x2", (2, 3, 5, 6))
    x3 = b.input("x3", (1, 2, 3, 4, 5))
    for mode in ("linear", "nearest", "cubic"):
        for pad in ("zeros", "border", "reflection"):
            for align in (0, 1):
                tag = f"{mode}_{pad}_{align}"
                g2 = b.const(f"g2_{tag}", _grid(rng, (2, 4, 3, 2), mode == "nearest"))
                outs.append(b.op("GridSample", x2, g2, mode=mode, padding_mode=pad, align_corners=align,
                                 name=f"gs2_{tag}"))
                if mode != "cubic":
                    g3 = b.const(f"g3_{tag}", _grid(rng, (1, 2, 3, 2, 3), mode == "nearest"))
                    outs.append(b.op("GridSample", x3, g3, mode=mode, padding_mode=pad, align_corners=align,
                                     name=f"gs3_{tag}"))
    x64 = b.input("x64", (1, 2, 4, 5), np.float64)  # double: coordinates and values in double
    outs.append(b.op("GridSample", x64, b.const("g64", _grid(rng, (1, 3, 2, 2), False).astype(np.float64)),
                     mode="cubic", padding_mode="reflection", name="gs_f64"))
    outs.append(b.op("RoiAlign", x64, b.const("rois64", np.array([[0.2, 0.5, 3.1, 2.7]], np.float64)),
                     b.const("bidx64", np.zeros(1, I64)), output_height=2, output_width=3, name="roi_f64"))
    gi = b.input("grid_in", (2, 3, 4, 2))  # a grid that is a runtime input
    outs.append(b.op("GridSample", x2, gi, mode="bilinear", name="gs_runtime_grid"))
    theta = b.input("theta", (2, 2, 3))
    for align in (0, 1):
        outs.append(b.op("AffineGrid", theta, b.const(f"size{align}", np.array([2, 3, 4, 5], I64)),
                         align_corners=align, name=f"affine2d_{align}"))
    theta3 = b.input("theta3", (1, 3, 4))
    outs.append(b.op("AffineGrid", theta3, b.const("size3", np.array([1, 1, 2, 3, 4], I64)), name="affine3d"))
    cols = b.input("cols", (2, 3 * 4, 9))
    outs.append(b.op("Col2Im", cols, b.const("img", np.array([5, 6], I64)), b.const("blk", np.array([2, 2], I64)),
                     strides=[2, 2], pads=[1, 0, 0, 1], name="col2im_s2"))
    cols2 = b.input("cols2", (1, 2 * 6, 20))
    outs.append(b.op("Col2Im", cols2, b.const("img2", np.array([6, 5], I64)), b.const("blk2", np.array([3, 2], I64)),
                     dilations=[2, 1], pads=[1, 1, 1, 0], name="col2im_dil"))
    dx = b.input("dx", (2, 4, 5, 6))
    dw = b.const("dw", rng.standard_normal((4, 2, 3, 3)).astype(F32))
    doff = b.input("doff", (2, 2 * 9 * 2, 3, 6))
    dmask = b.input("dmask", (2, 2 * 9, 3, 6))
    outs.append(b.op("DeformConv", dx, dw, doff, b.const("db", rng.standard_normal(4).astype(F32)), dmask,
                     pads=[1, 1, 1, 1], strides=[2, 1], group=2, offset_group=2, name="deform_mask_bias"))
    doff1 = b.input("doff1", (2, 8, 4, 5))
    outs.append(b.op("DeformConv", dx, b.const("dw1", rng.standard_normal((3, 4, 2, 2)).astype(F32)), doff1,
                     name="deform_plain"))
    cols3 = b.input("cols3", (1, 2 * 4, 3 * 2 * 4))
    outs.append(b.op("Col2Im", cols3, b.const("img3", np.array([3, 4, 5], I64)),
                     b.const("blk3", np.array([1, 2, 2], I64)), strides=[1, 2, 1], pads=[0, 1, 0, 0, 0, 0],
                     name="col2im_3d"))
    dx1 = b.input("dx1", (1, 3, 9))
    outs.append(b.op("DeformConv", dx1, b.const("dw1d", rng.standard_normal((2, 3, 3)).astype(F32)),
                     b.input("doff1d", (1, 3, 5)), pads=[1, 1], strides=[2], name="deform_1d"))
    rx = b.input("rx", (2, 3, 8, 9))
    lo = rng.uniform(-2, 6, (5, 2))
    rois = b.const("rois", np.concatenate([lo, lo + rng.uniform(0.3, 6, (5, 2))], axis=1).astype(F32))
    bidx = b.const("bidx", np.array([0, 1, 1, 0, 1], I64))
    for mode in ("avg", "max"):
        for ctm in ("half_pixel", "output_half_pixel"):
            for ratio in (0, 2):
                outs.append(b.op("RoiAlign", rx, rois, bidx, mode=mode, coordinate_transformation_mode=ctm,
                                 output_height=3, output_width=2, sampling_ratio=ratio, spatial_scale=0.9,
                                 name=f"roi_{mode}_{ctm}_{ratio}"))
    px = b.input("px", (2, 3, 6, 7))
    for order in (0, 1):
        y, i = b.op("MaxPool", px, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], storage_order=order,
                    num_outputs=2, name=f"maxpool_idx{order}")
        outs += [y, i]
    ux = b.input("ux", (2, 3, 6, 8))  # pools to 3 x 4, which unpools to 6 x 8: the indices fit
    y, i = b.op("MaxPool", ux, kernel_shape=[2, 2], strides=[2, 2], num_outputs=2, name="maxpool_2x2")
    outs.append(b.op("MaxUnpool", y, i, kernel_shape=[2, 2], strides=[2, 2], name="unpool"))
    outs.append(b.op("MaxUnpool", y, i, b.const("ushape", np.array([2, 3, 7, 9], I64)), kernel_shape=[2, 2],
                     strides=[2, 2], name="unpool_shape"))
    rsx = b.input("rsx", (1, 2, 6, 7))
    for mode, aa in (("cubic", 0), ("cubic", 1), ("linear", 1)):
        for ctm, scales in (("half_pixel", [1, 1, 0.6, 1.7]), ("align_corners", [1, 1, 1.5, 0.45]),
                            ("tf_crop_and_resize", [1, 1, 0.8, 1.3])):
            roi = b.const(f"roi_{mode}{aa}{ctm}", np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.95], F32)) \
                if ctm == "tf_crop_and_resize" else None
            outs.append(b.op("Resize", rsx, roi, b.const(f"sc_{mode}{aa}{ctm}", np.array(scales, F32)), mode=mode,
                             antialias=aa, coordinate_transformation_mode=ctm, exclude_outside=int(aa == 0),
                             cubic_coeff_a=-0.5, extrapolation_value=0.25, name=f"resize_{mode}{aa}_{ctm}"))
    for nearest in ("round_prefer_ceil", "round_prefer_floor"):  # asymmetric x2: every odd output a tie
        outs.append(b.op("Resize", rsx, None, b.const(f"sc_{nearest}", np.array([1, 1, 2, 2], F32)), mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode=nearest,
                         name=f"resize_{nearest}"))
    ru8 = b.input("ru8", (1, 1, 5, 6), np.uint8)
    outs.append(b.op("Resize", ru8, None, None, b.const("rsz", np.array([3, 9], I64)), mode="cubic", axes=[2, 3],
                     name="resize_cubic_u8"))
    return b.build(*outs)


@pytest.fixture(scope="module")
def graph():
    return sampling_graph()


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_sampling_kernels_match_the_reference(graph, cache_dir, simd):
    options = CodegenOptions(simd="none") if simd == "none" else None
    got, want, model = run_both(graph, None, cache_dir, options=options)
    for name in want:
        if want[name].dtype.kind == "u":  # uint8 cubic: rounding of the float64 sum may differ by one
            assert np.max(np.abs(got[name].astype(int) - want[name].astype(int))) <= 1, name
        else:
            assert_close({name: got[name]}, {name: want[name]})
    assert model.report["kernels"] == len(graph.nodes)


def test_fused_through_the_compiler(cache_dir):
    """AffineGrid -> GridSample -> Relu and Col2Im -> Add: epilogues fuse into the sampling kernels."""
    import opfuse
    rng = np.random.default_rng(5)
    b = GraphBuilder("fused_sampling")
    x = b.input("x", (2, 3, 6, 7))
    theta = b.input("theta", (2, 2, 3))
    grid = b.op("AffineGrid", theta, b.const("size", np.array([2, 3, 5, 4], I64)), name="affine")
    y = b.op("Relu", b.op("GridSample", x, grid, mode="cubic", padding_mode="border", name="gs"), name="relu")
    cols = b.input("cols", (2, 3 * 4, 20))
    z = b.op("Col2Im", cols, b.const("img", np.array([5, 6], I64)), b.const("blk", np.array([2, 2], I64)),
             name="col2im")
    z = b.op("Add", z, b.const("bias", rng.standard_normal((1, 3, 1, 1)).astype(F32)), name="add")
    g = b.build(y, z)
    feeds = {"x": rng.standard_normal((2, 3, 6, 7)).astype(F32), "theta": rng.standard_normal((2, 2, 3)).astype(F32),
             "cols": rng.standard_normal((2, 12, 20)).astype(F32)}
    from opfuse.runtime import reference
    want = reference.run(g, feeds)
    model = opfuse.compile(g, target="host", threads=1, planner="rules")
    got = model.run(feeds)
    assert_close({k: got[k] for k in want}, want)
    groups = {tuple(sorted(n.name for n in grp.nodes)) for grp in model.plan.groups}
    assert ("gs", "relu") in groups and ("add", "col2im") in groups


def test_max_unpool_bad_index_fails_the_run_without_writing_outside(cache_dir):
    b = GraphBuilder("unpool_bad")
    x = b.input("x", (1, 1, 2, 2))
    i = b.input("i", (1, 1, 2, 2), I64)
    g = b.build(b.op("MaxUnpool", x, i, kernel_shape=[2, 2], strides=[2, 2], name="unpool"))
    from opfuse.runtime.native import build
    model = build(g, None, cache_dir=cache_dir)
    from opfuse.errors import InputError
    with pytest.raises(InputError, match="node 'unpool' \\(MaxUnpool\\): indices out of range \\[0, 15\\]"):
        model.run({"x": np.ones((1, 1, 2, 2), F32), "i": np.array([0, 99, -5, 3], I64).reshape(1, 1, 2, 2)})
    # the kernel clamped the bad indices meanwhile (nothing outside the output was written), and the
    # model still runs on good ones
    out = model.run({"x": np.ones((1, 1, 2, 2), F32), "i": np.array([0, 15, 5, 3], I64).reshape(1, 1, 2, 2)})
    assert out[g.outputs[0].name].reshape(-1)[[0, 3, 5, 15]].tolist() == [1, 1, 1, 1]


def test_fusion_legality_of_the_sampling_ops():
    """An elementwise op after GridSample/RoiAlign is its epilogue; AffineGrid before GridSample is
    refused (a gather from a whole input takes no prologue), and so is a Resize after it (not
    elementwise); MaxUnpool (a scatter) fuses with nothing."""
    from opfuse.rules import PlanLegality, unfused_plan
    b = GraphBuilder("legality")
    x = b.input("x", (1, 2, 6, 6))
    grid = b.op("AffineGrid", b.input("theta", (1, 2, 3)), b.const("size", np.array([1, 2, 4, 4], I64)),
                name="affine")
    gs = b.op("GridSample", x, grid, name="gs")
    relu = b.op("Relu", gs, name="relu")
    up = b.op("Resize", gs, None, b.const("sc", np.array([1, 1, 2, 2], F32)), name="up")
    roi = b.op("RoiAlign", x, b.const("rois", np.array([[0, 0, 3, 3]], F32)), b.const("bi", np.zeros(1, I64)),
               name="roi")
    sig = b.op("Sigmoid", roi, name="sig")
    p, i = b.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], num_outputs=2, name="pool")
    un = b.op("MaxUnpool", p, i, kernel_shape=[2, 2], strides=[2, 2], name="unpool")
    neg = b.op("Neg", un, name="neg")
    legal = PlanLegality(unfused_plan(b.build(relu, up, sig, neg)))
    g = {grp.name: grp for grp in legal.plan().groups}
    assert legal.can_merge(g["gs"], g["relu"]) is None
    assert legal.can_merge(g["roi"], g["sig"]) is None
    r = legal.can_merge(g["affine"], g["gs"])
    assert r.kind.label == "category forbids" and "epilogue, never a prologue" in r.reason
    r = legal.can_merge(g["gs"], g["up"])
    assert r is not None and "Resize" in r.reason
    r = legal.can_merge(g["unpool"], g["neg"])
    assert r is not None and "opaque" in r.reason


def test_generated_code_is_deterministic(graph):
    from opfuse.codegen import generate
    from opfuse.ir.plan import FusionPlan
    again = sampling_graph()
    a = generate(graph, FusionPlan.unfused(graph))
    b = generate(again, FusionPlan.unfused(again))
    assert a.source == b.source and a.weights == b.weights


@pytest.mark.parametrize("threads", [1, 2])
def test_max_pool_indices_unpooled_back_and_into_a_larger_output_shape(threads, cache_dir):
    """MaxPool (2x2, stride 2) of a 6 x 8 image and its Indices, unpooled: every maximum back where it was; with
    ``output_shape`` 7 x 9 the unpooled 6 x 8 sits in its corner (the ONNX spec's reading, its node test
    ``maxunpool_export_with_output_shape``; onnxruntime reads the indices in 7 x 9 instead). A 7 x 9 image pools to
    the same 3 x 4, whose indices address 7 x 9, not the 6 x 8 the unpooling infers: an InputError in both
    backends, not values in the wrong places."""
    import opfuse
    from opfuse.errors import InputError
    from opfuse.runtime import reference
    for hw, out_hw in (((6, 8), None), ((6, 8), (7, 9)), ((7, 9), (7, 9))):
        b = GraphBuilder("round_trip")
        x = b.input("x", (2, 3) + hw)
        y, i = b.op("MaxPool", x, kernel_shape=[2, 2], strides=[2, 2], num_outputs=2)
        shape = [b.const("shape", np.array((2, 3) + out_hw, I64))] if out_hw else []
        g = b.build(b.op("MaxUnpool", b.op("Relu", y), i, *shape, kernel_shape=[2, 2], strides=[2, 2]))
        feeds = {"x": np.random.default_rng(2).standard_normal((2, 3) + hw).astype(F32)}
        models = (opfuse.compile(g, threads=threads), opfuse.compile(g, threads=threads, fuse=False))
        if hw == (7, 9):
            with pytest.raises(InputError, match="MaxUnpool.*out of range"):
                reference.run(g, feeds)
            for model in models:
                with pytest.raises(InputError, match="MaxUnpool.*out of range"):
                    model.run(feeds)
            continue
        want = reference.run(g, feeds)[g.outputs[0].name]
        corner = want[:, :, :6, :8]
        kept = corner > 0
        assert kept.sum() > 20 and np.array_equal(corner[kept], feeds["x"][kept])
        assert not want[:, :, 6:].any() and not want[:, :, :, 8:].any()
        for model in models:
            np.testing.assert_array_equal(model.run(feeds)[g.outputs[0].name], want)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_of_nan_infinite_and_huge_coordinates(mode, padding, align, cache_dir):
    """Grid coordinates NaN, +-inf, +-1e30 and 3e38 (a run-time grid): C as the reference, whose taps of a
    NaN coordinate read index 0 (C converted NaN to long there, undefined behaviour that happened to address
    the same element on x86-64); fused and unfused, vectorised and plain C. With ``nearest`` and ``border``
    the weight is 1, so a NaN x coordinate reads column 0 of the row its y coordinate picks."""
    from opfuse.ir.plan import FusionGroup, FusionPlan
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    b = GraphBuilder("grid_specials")
    x = b.input("x", (1, 2, 4, 5), "float32")
    grid = b.input("g", (1, 3, 4, 2), "float32")
    y = b.op("Relu", b.op("GridSample", x, grid, mode=mode, padding_mode=padding, align_corners=align))
    g = b.build(y)
    rng = np.random.default_rng(0)
    xs = rng.uniform(-1, 1, (1, 2, 4, 5)).astype(np.float32)
    gs = rng.uniform(-1.2, 1.2, (1, 3, 4, 2)).astype(np.float32)
    gs.reshape(-1)[[0, 3, 6, 9, 12, 15, 18]] = [np.nan, np.inf, -np.inf, 1e30, -1e30, 3e38, -0.0]
    gs[0, 2, 3] = [np.nan, 0.3]  # a NaN x coordinate, a finite y coordinate
    feeds = {"x": xs, "g": gs}
    with np.errstate(over="ignore", invalid="ignore"):  # the reference's float32 arithmetic on 3e38 and NaN
        want = reference.run(g, feeds)[y.name]
    if mode == "nearest" and padding == "border":
        row = int(np.rint(((0.3 + 1) * (3 if align else 4) - (0 if align else 1)) / 2))
        np.testing.assert_array_equal(want[0, :, 2, 3], np.maximum(xs[0, :, row, 0], 0))
    fused = FusionPlan(g, [FusionGroup("all", list(g.nodes), "injective")])
    for plan in (None, fused):
        for simd in ("auto", "none"):
            got = build(g, plan, threads=1, options=CodegenOptions(simd=simd), cache_dir=cache_dir).run(feeds)[y.name]
            np.testing.assert_array_equal(got, want, err_msg=f"fused={plan is not None}, simd={simd}")
