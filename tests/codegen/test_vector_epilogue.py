"""Vector epilogues (``epilogue.VectorEpilogue``, ``CodegenOptions.vector_epilogue``) of GEMM tiles
(``gemm._emit_tile_epilogue``), the storing micro-kernel and Winograd's output transform: a convolution's or
a MatMul's fused elementwise ops (exp-based ones too) a vector at a time in AVX-512 / AVX2 intrinsics, bitwise
the scalar epilogue of the same build (``vector_epilogue=False``), and against the reference; along the tile's
rows (a 1x1 convolution over packed rows, the direct kernel, a MatMul), along its transposed columns (the
windows kernel) and along the output rows of the Winograd transform; operands constant along the row (a
per-channel scale, hoisted) and varying along it (a residual, a MatMul's bias); Sigmoid, SiLU and Tanh in the
micro-kernel's registers, its plain C body too; epilogues it refuses (Mish, a Gemm's alpha), with their
reasons; the plain C99 build without intrinsics."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names
from opfuse.codegen import CodegenOptions, generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

ACTIVATIONS = (("Sigmoid", {}), ("Silu", {}), ("Tanh", {}), ("Gelu", {"approximate": "tanh"}), ("Gelu", {}),
               ("HardSwish", {}), ("LeakyRelu", {"alpha": 0.1}), ("Exp", {}), ("Softplus", {}))
# Which kernel computes the convolution: the output (1, OC, H, W) from an input (1, C, H', W'), kernel, stride, pad.
GEOMETRIES = {
    "packed_1x1": dict(x=(1, 16, 23, 41), oc=20, k=1, stride=1, pad=0, options={}),  # rows of the tile, strips
    "windows": dict(x=(1, 16, 30, 26), oc=40, k=3, stride=2, pad=1, options=dict(conv_direct_max_k=0)),  # transposed
    "direct": dict(x=(1, 8, 6, 32), oc=20, k=3, stride=1, pad=1, options=dict(winograd="off")),
    "direct_split": dict(x=(1, 8, 6, 48), oc=20, k=3, stride=1, pad=1, options=dict(winograd="off")),  # b_split
    "winograd": dict(x=(1, 16, 21, 43), oc=20, k=3, stride=1, pad=1, options={}),  # along the output transform's rows
}


def _conv(b: GraphBuilder, x, geo: dict, rng):
    fan_in = geo["x"][1] * geo["k"] ** 2  # weights of unit gain (test_winograd's): Winograd's error grows with them
    w = b.const("w", (rng.standard_normal((geo["oc"], geo["x"][1], geo["k"], geo["k"])) / np.sqrt(fan_in))
                .astype(np.float32))
    bias = b.const("bias", (rng.standard_normal(geo["oc"]) * 2).astype(np.float32))
    return b.op("Conv", x, w, bias, pads=[geo["pad"]] * 4, strides=[geo["stride"]] * 2, name="conv")


def _activations_graph(geo: dict):
    """Conv -> each activation, every one a graph output (one epilogue storing seven outputs)."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("conv_acts")
    y = _conv(b, b.input("x", geo["x"]), geo, rng)
    outs = [b.op(op, y, name=f"act_{op.lower()}{len(attrs)}", **attrs) for op, attrs in ACTIVATIONS]
    return b.build(*outs)


def _one_kernel(g, kind: str = "conv_epilogue") -> FusionPlan:
    anchor = next(n for n in g.nodes if n.op_type in ("Conv", "MatMul", "Gemm"))
    return FusionPlan(g, [FusionGroup("g", list(g.nodes), kind, anchor)])


def _feeds(g, scale: float = 3.0) -> dict:
    feeds = reference.random_inputs(g, 0)
    return {k: (v * scale).astype(v.dtype) for k, v in feeds.items()}  # wide: the exp-based ops saturate too


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


def _check(g, plan, cache_dir, base: dict, *, vectorised: bool = True, refused: str | None = None,
           marker: str = "epilogue in ", scale: float = 3.0) -> None:
    """The AVX-512 and AVX2 builds bitwise the scalar epilogue's (the same options, ``vector_epilogue``
    off), which matches the reference; the source holds the vector loop (its note ``marker``), or the refusal's
    note. ``scale``: of the random inputs (1 for Winograd: its rounding error grows with the values)."""
    feeds = _feeds(g, scale)
    scalar = CodegenOptions(vector_epilogue=False, scalar_gelu_table=True, **base)  # Gelu: the vector forms' bits
    want = build(g, plan, cache_dir=cache_dir, options=scalar, threads=1).run(feeds)
    assert_close(want, reference.run(g, feeds))
    for isa, prefix in (("avx512", "_mm512"), ("avx2", "_mm256")):
        options = CodegenOptions(vector_isa=isa, **base)
        src = generate(g, plan, options=options).source
        assert (marker in src and f"{prefix}_loadu_ps(" in src) == vectorised, isa
        if refused is not None:
            assert f"scalar epilogue loop ({refused}" in src, isa
        for threads in (1, 2):
            got = build(g, plan, cache_dir=cache_dir, options=options, threads=threads).run(feeds)
            for k in want:
                assert _same_bits(got[k], want[k]), (isa, threads, k)


@pytest.mark.parametrize("geo", list(GEOMETRIES), ids=list(GEOMETRIES))
def test_activations_are_the_scalar_epilogues_bits(geo, cache_dir):
    g = _activations_graph(GEOMETRIES[geo])
    plan = _one_kernel(g)
    base = GEOMETRIES[geo]["options"]
    src = generate(g, plan, options=CodegenOptions(**base)).source
    assert ("opfuse_transpose(" in src) == (geo == "windows")  # the transposed tile: the loop runs along its columns
    assert ("direct kernel" in src) == geo.startswith("direct")
    assert ("Winograd F" in src) == (geo == "winograd")
    if geo == "winograd":
        _check(g, plan, cache_dir, base, marker="Winograd", scale=1.0)
    else:
        _check(g, plan, cache_dir, base)


@pytest.mark.parametrize("geo", ["packed_1x1", "windows", "winograd"])
def test_scale_residual_and_silu(geo, cache_dir):
    """Conv -> Mul by a per-channel constant (constant along the row: computed once a row) -> Add of a residual
    input (loaded a vector at a time) -> Silu; the Conv's own result stored too."""
    spec = GEOMETRIES[geo]
    rng = np.random.default_rng(3)
    b = GraphBuilder("conv_res")
    y = _conv(b, b.input("x", spec["x"]), spec, rng)
    oh = (spec["x"][2] + 2 * spec["pad"] - spec["k"]) // spec["stride"] + 1
    ow = (spec["x"][3] + 2 * spec["pad"] - spec["k"]) // spec["stride"] + 1
    res = b.input("res", (1, spec["oc"], oh, ow))
    scale = b.const("scale", rng.standard_normal((spec["oc"], 1, 1)).astype(np.float32))
    z = b.op("Silu", b.op("Add", b.op("Mul", y, scale), res))
    g = b.build(z, y)
    _check(g, _one_kernel(g), cache_dir, spec["options"], marker="Winograd" if geo == "winograd" else "epilogue in ",
           scale=1.0 if geo == "winograd" else 3.0)


@pytest.mark.parametrize("k", [48, 40], ids=["one_k_block", "k_blocks"])
def test_matmul_bias_gelu(k, cache_dir):
    """MatMul (no finish) -> Add of a bias along the columns (a constant varying along the row) -> Gelu(tanh),
    the micro-kernel's column bias off (``test_column_bias_epilogue.py``): finished strip by strip after one K
    block (the output lines prefetched), or over the tile after the last of several (``gemm_kc=16``)."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("mm_gelu")
    x = b.input("x", (37, k))
    w = b.const("w", (rng.standard_normal((k, 70)) * 0.3).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(70).astype(np.float32))
    y = b.op("Gelu", b.op("Add", b.op("MatMul", x, w), bias), approximate="tanh")
    g = b.build(y)
    base = {"gemm_column_bias_epilogue": False} | ({} if k == 48 else {"gemm_kc": 16})
    src = generate(g, _one_kernel(g, "gemm_epilogue"), options=CodegenOptions(**base)).source
    assert ("__builtin_prefetch" in src) == (k == 48)
    _check(g, _one_kernel(g, "gemm_epilogue"), cache_dir, base)


def test_refused_epilogues_keep_the_scalar_loop(cache_dir):
    """Mish has no vector form; a Gemm with alpha has a finish other than a bias: the scalar loop, noted."""
    b = GraphBuilder("conv_mish")
    spec = GEOMETRIES["packed_1x1"]
    g = b.build(b.op("Mish", _conv(b, b.input("x", spec["x"]), spec, np.random.default_rng(1))))
    _check(g, _one_kernel(g), cache_dir, {}, vectorised=False, refused="op Mish has no vector form")
    b = GraphBuilder("gemm_alpha")
    w = b.const("w", np.random.default_rng(2).standard_normal((24, 40)).astype(np.float32))
    g = b.build(b.op("Sigmoid", b.op("Gemm", b.input("x", (33, 24)), w, alpha=0.5)))
    _check(g, _one_kernel(g, "gemm_epilogue"), cache_dir, {}, vectorised=False,
           refused="its finish has no vector form")


def test_plain_c_build_has_no_intrinsics(cache_dir):
    g = _activations_graph(GEOMETRIES["packed_1x1"])
    plan = _one_kernel(g)
    options = CodegenOptions(simd="none")
    src = generate(g, plan, options=options).source
    assert "_mm512" not in src and "_mm256" not in src and "epilogue in" not in src
    feeds = _feeds(g)
    assert_close(build(g, plan, cache_dir=cache_dir, options=options, threads=1).run(feeds), reference.run(g, feeds))


REGISTER_ACTIVATIONS = [("Sigmoid", {}, "Sigmoid"), ("Silu", {}, "Silu"), ("Tanh", {}, "Tanh"),
                        ("Gelu", {"approximate": "tanh"}, "Gelu (tanh)"), ("Gelu", {}, "Gelu (erf)")]


@pytest.mark.parametrize("act,attrs,what", REGISTER_ACTIVATIONS, ids=[a[2] for a in REGISTER_ACTIVATIONS])
@pytest.mark.parametrize("geo", ["packed_1x1", "windows", "direct_split"])
def test_register_epilogue_activations(act, attrs, what, geo, cache_dir):
    """Conv -> one activation of ``microkernel.ACTIVATIONS``: the storing micro-kernel adds the bias and applies it
    in registers (along the rows, or before its transposed store), bitwise the scalar tile epilogue
    (``gemm_register_activations="all"``: on AVX2 the default leaves the exp-based ones to the tile epilogue,
    ``test_register_activations_mode``)."""
    spec = dict(GEOMETRIES[geo])
    spec["options"] = dict(spec["options"], gemm_register_activations="all")
    b = GraphBuilder(f"conv_{act.lower()}{len(attrs)}")
    g = b.build(b.op(act, _conv(b, b.input("x", spec["x"]), spec, np.random.default_rng(4)), **attrs))
    plan = _one_kernel(g)
    src = generate(g, plan, options=CodegenOptions(vector_isa="avx512", **spec["options"])).source
    assert f"output bias and {what} applied and stored by the micro-kernel" in src
    assert ("_h16_" in src) == (geo == "direct_split")  # the direct kernel's two 16-position pieces
    # 20 channels: the packed kernel's 8-row AVX-512 blocks leave a part block, via the C tile (with AVX2's
    # 6-row blocks the direct kernel's leave one too)
    assert ("epilogue in avx512" in src) == (geo == "packed_1x1")
    src = generate(g, plan, options=CodegenOptions(vector_isa="avx2", **spec["options"])).source
    assert f"output bias and {what} applied and stored by the micro-kernel" in src
    _check(g, plan, cache_dir, spec["options"], marker="by the micro-kernel")


MODE_CASES = [("Silu", {}, "Silu"), ("Sigmoid", {}, "Sigmoid"), ("Tanh", {}, "Tanh"),
              ("Gelu", {"approximate": "tanh"}, "Gelu (tanh)"), ("Gelu", {}, "Gelu (erf)"), ("Relu", {}, "Relu")]


@pytest.mark.parametrize("act,attrs,what", MODE_CASES, ids=[c[2] for c in MODE_CASES])
def test_register_activations_mode(act, attrs, what, cache_dir):
    """``gemm_register_activations``: "auto" applies the exp-based activations (Sigmoid, SiLU, Tanh, tanh Gelu) in
    the micro-kernel's registers with AVX-512's 32 registers, not with AVX2's 16 (the C tile's vector epilogue
    then: 12 accumulators leave 4 registers for an exp), Relu and the erf Gelu's table in registers on both;
    "all" and "cheap" force either way; the same bits whichever finishes them."""
    spec = GEOMETRIES["packed_1x1"]
    b = GraphBuilder(f"mode_{act.lower()}{len(attrs)}")
    g = b.build(b.op(act, _conv(b, b.input("x", spec["x"]), spec, np.random.default_rng(6)), **attrs))
    plan = _one_kernel(g)
    exp_based = what not in ("Relu", "Gelu (erf)")
    note = f"output bias and {what} applied and stored by the micro-kernel"
    for isa, mode, in_registers in (("avx2", "auto", not exp_based), ("avx512", "auto", True),
                                    ("avx2", "all", True), ("avx512", "cheap", not exp_based),
                                    ("avx2", "cheap", not exp_based)):
        src = generate(g, plan, options=CodegenOptions(vector_isa=isa, gemm_register_activations=mode)).source
        assert (note in src) == in_registers, (isa, mode)
        if not in_registers:
            assert f"epilogue in {isa}" in src, (isa, mode)
    feeds = _feeds(g)
    runs = [build(g, plan, cache_dir=cache_dir, options=CodegenOptions(vector_isa="avx2",
                                                                        gemm_register_activations=mode),
                  threads=1).run(feeds) for mode in ("all", "cheap")]
    assert all(_same_bits(runs[0][k], runs[1][k]) for k in runs[0])
    assert_close(runs[1], reference.run(g, feeds))


def test_register_activations_mode_is_checked():
    from opfuse.errors import OpfuseError
    with pytest.raises(OpfuseError, match="gemm_register_activations 'some': expected one of auto, all, cheap$"):
        CodegenOptions(gemm_register_activations="some")


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "product"])
@pytest.mark.parametrize("geo", ["packed_1x1", "windows", "winograd"])
def test_silu_forms_in_registers_and_epilogues(direct, geo, cache_dir):
    """Conv -> Silu in each of its forms (``CodegenOptions.silu_direct``: ``x / (1 + exp(-x))``, else
    ``x * sigmoid(x)``): the storing micro-kernel (its code "u" or "w") or the output transform's vector loop calls
    that form's helper, bitwise the scalar epilogue of the same form, which matches the reference."""
    spec = GEOMETRIES[geo]
    b = GraphBuilder(f"conv_silu_{geo}_{direct}")
    g = b.build(b.op("Silu", _conv(b, b.input("x", spec["x"]), spec, np.random.default_rng(5))))
    plan = _one_kernel(g)
    base = dict(spec["options"], silu_direct=direct, gemm_register_activations="all")
    for isa, lanes in (("avx512", 16), ("avx2", 8)):
        src = generate(g, plan, options=CodegenOptions(vector_isa=isa, **base)).source
        assert (f"opfuse_v{lanes}_siluf(" in src) == direct and (f"opfuse_v{lanes}_sigmoidf(" in src) != direct
        if geo != "winograd":
            letter = "u" if direct else "w"  # the storing micro-kernel's name ends in its epilogue code
            assert re.search(rf"static void opfuse_ukr_\w*_\w*{letter}\(", src), letter
            assert "output bias and Silu applied and stored by the micro-kernel" in src
    _check(g, plan, cache_dir, base, marker="by the micro-kernel" if geo != "winograd" else "epilogue in ",
           scale=1.0 if geo == "winograd" else 3.0)


def test_register_activation_plain_c_body(cache_dir):
    """Compiled for x86-64 without AVX (``native=False``): the storing micro-kernel's plain C body and the scalar
    epilogue loops, bitwise the build without the vector epilogues, and against the reference."""
    spec = GEOMETRIES["packed_1x1"]
    for attrs in ({}, {"approximate": "tanh"}):  # Gelu (erf), Gelu (tanh) by the micro-kernel
        one = GraphBuilder(f"conv_gelu_plain{len(attrs)}")
        y = _conv(one, one.input("x", spec["x"]), spec, np.random.default_rng(4))
        _plain_body_check(one.build(one.op("Gelu", y, **attrs)), cache_dir)
    two = GraphBuilder("conv_silu_gelu_plain")  # two outputs: through the C tile, the scalar loop
    y = _conv(two, two.input("x", spec["x"]), spec, np.random.default_rng(4))
    _plain_body_check(two.build(two.op("Silu", y), two.op("Gelu", y)), cache_dir)


def _plain_body_check(g, cache_dir) -> None:
    plan = _one_kernel(g)
    feeds = _feeds(g)
    # Gelu by the table polynomial in the C loops too (``scalar_gelu_table``): the micro-kernel's plain C body's bits
    scalar = CodegenOptions(vector_epilogue=False, scalar_gelu_table=True)
    want = build(g, plan, cache_dir=cache_dir, options=scalar, threads=1, native=False).run(feeds)
    assert_close(want, reference.run(g, feeds))
    got = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(vector_isa="avx512", scalar_gelu_table=True),
                threads=1, native=False).run(feeds)
    src = generate(g, plan, options=CodegenOptions(vector_isa="avx512")).source
    assert ("by the micro-kernel" in src) == (len(g.outputs) == 1)
    for k in want:
        assert _same_bits(got[k], want[k]), k


def test_horizontal_segments(cache_dir):
    """Sibling MatMuls merged into one GEMM (``horizontal``: column ranges per sibling, each with its own epilogue)
    and sibling convolutions (row or column ranges): each segment's loop in vectors, bitwise the scalar ones."""
    rng = np.random.default_rng(9)
    b = GraphBuilder("siblings")
    a = b.input("a", (1, 37, 32))
    outs = []
    for k, (n, act) in enumerate(((16, "Sigmoid"), (40, "Silu"), (24, "Tanh"))):
        w = b.const(f"w{k}", (rng.standard_normal((32, n)) * 0.3).astype(np.float32))
        bias = b.const(f"b{k}", rng.standard_normal(n).astype(np.float32))
        outs.append(b.op(act, b.op("Add", b.op("MatMul", a, w, name=f"mm{k}"), bias, name=f"add{k}"), name=f"act{k}"))
    g = b.build(*outs)
    names = [f"{p}{k}" for k in range(3) for p in ("mm", "add", "act")]
    _check(g, group_by_names(g, [("horizontal", names)]), cache_dir, {})
    b = GraphBuilder("sibling_convs")
    x = b.input("x", (1, 6, 20, 21))
    spec = dict(x=(1, 6, 20, 21), k=3, stride=1, pad=1)
    c1 = b.op("Sigmoid", _conv(b, x, {**spec, "oc": 8}, rng), name="s1")
    c2 = b.op("Silu", b.op("Conv", x, b.const("w2", (rng.standard_normal((12, 6, 3, 3)) * 0.2).astype(np.float32)),
                           pads=[1, 1, 1, 1], name="c2"), name="s2")
    g = b.build(c1, c2)
    _check(g, group_by_names(g, [("horizontal", ["conv", "s1", "c2", "s2"])]), cache_dir, {})


@pytest.mark.parametrize("act", [None, "HardSigmoid"])
def test_a_bias_along_the_loop_keeps_the_scalar_loop(act, cache_dir):
    """A 1x1 convolution alone on one output position (PP-OCR's squeeze-and-excitation convs: 8 -> 32 channels on
    1x1) runs over its windows with the tile along the channels, the bias's axis: the vector epilogue, which adds one
    bias value a row, broadcast the first channel's bias to every channel (error 0.4-0.5 against the reference)."""
    rng = np.random.default_rng(9)
    b = GraphBuilder("se_conv")
    y = b.op("Conv", b.input("x", (1, 8, 1, 1)), b.const("w", rng.standard_normal((32, 8, 1, 1)).astype(np.float32)),
             b.const("bias", rng.standard_normal(32).astype(np.float32)), name="conv")
    g = b.build(y if act is None else b.op(act, y, alpha=0.2, beta=0.5))
    if act is None:  # alone: over its windows, the tile along the channels (its one row a padded panel: with a
        # tail panel of one row, ``gemm.tail_panels``, or the one position's 1 x NR block, ``gemm_gemv_nr``, the
        # micro-kernel adds the bias and stores it instead)
        plan = FusionPlan(g, [FusionGroup("g", list(g.nodes), "single")])
        _check(g, plan, cache_dir, {"gemm_tail_panels": False, "gemm_gemv_nr": 0}, vectorised=False,
               refused="its bias varies along the loop")
        feeds = _feeds(g)
        got = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(vector_isa="avx2"), threads=1).run(feeds)
        assert_close(got, reference.run(g, feeds))
    else:  # with an epilogue: over its packed rows, the tile along the one position (the bias constant along it)
        _check(g, _one_kernel(g), cache_dir, {})
