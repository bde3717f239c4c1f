"""The storing micro-kernel's residual (epilogue code "a", ``gemm.register_epilogue``'s ``_residual``,
``CodegenOptions.gemm_residual_epilogue``): a 1x1 Conv (+ bias) or a MatMul (+ column bias) followed by the Add of a
tensor of the output's shape (+ Relu or an activation) finished in registers, the whole blocks stored by the
micro-kernel and the part blocks (past M or N) through the C tile; bitwise the C tile's epilogue (the option off) with
AVX-512, AVX2, 1 and 2 threads and the plain C99 build, and within tolerance of the reference. The residual in a
buffer of its own and the output stored over it (the memory plan's in-place pair). Refused, each with the C tile's
epilogue as the reference: a broadcast residual, a residual computed in the group, the option off, the AdvSIMD build."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, assert_plain_storing_kernel, same_bits
from opfuse.codegen import CodegenOptions, generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

OFF = {"gemm_residual_epilogue": False}


def _conv(act: str | None, inplace: bool, cout: int = 20, hw: int = 26, attrs: dict | None = None):
    """Conv 1x1 (24 -> ``cout``, bias) + Add(residual) (+ ``act``): 20 rows are two whole 8-row blocks and a part
    one, 676 positions 21 whole 32-column panels and a part one (few enough padded columns for X to be packed:
    channels x positions, not the windows form). ``inplace``: the residual is a kernel's output
    (``Neg(r)``, dying at the Add) and the output is read by one more kernel (``Abs``), so the memory plan stores the
    output over the residual; else the residual is a graph input."""
    rng = np.random.default_rng(3)
    b = GraphBuilder("conv_res")
    x = b.input("x", (1, 24, hw, hw))
    w = b.const("w", (rng.standard_normal((cout, 24, 1, 1)) * 0.3).astype(np.float32))
    bias = b.const("bias", rng.standard_normal((cout,)).astype(np.float32))
    r = b.input("r", (1, cout, hw, hw))
    groups = []
    if inplace:
        r = b.op("Neg", r, name="neg")
    c = b.op("Conv", x, w, bias, name="conv")
    y = b.op("Add", r, c, name="add")  # the residual first: the Add's order either way
    if act is not None:
        y = b.op(act, y, name="act", **(attrs or {}))
    if inplace:  # the group's output in the arena (a graph output has storage of its own)
        y = b.op("Abs", y, name="tail")
    g = b.build(y)
    nodes = list(g.nodes)
    if inplace:
        groups.append(FusionGroup("g_neg", [nodes[0]], "elementwise"))
        nodes = nodes[1:-1]
    groups.append(FusionGroup("g", nodes, "conv_epilogue", nodes[0]))
    if inplace:
        groups.append(FusionGroup("g_tail", [g.nodes[-1]], "elementwise"))
    return g, FusionPlan(g, groups)


def _matmul(act: str | None):
    """MatMul (2 x 37 x 48 @ 48 x 70) + column bias + Add(residual) (+ ``act``): bert_layer's projections' form."""
    rng = np.random.default_rng(7)
    b = GraphBuilder("mm_res")
    x = b.input("x", (2, 37, 48))
    w = b.const("w", (rng.standard_normal((48, 70)) * 0.3).astype(np.float32))
    bias = b.const("bias", rng.standard_normal((70,)).astype(np.float32))
    y = b.op("Add", b.op("Add", b.op("MatMul", x, w, name="mm"), bias, name="add"), b.input("r", (2, 37, 70)),
             name="res")
    if act is not None:
        y = b.op(act, y, name="act")
    g = b.build(y)
    return g, FusionPlan(g, [FusionGroup("g", list(g.nodes), "gemm_epilogue", g.nodes[0])])


def _feeds(g):
    feeds = reference.random_inputs(g, 0)
    feeds["x"] = feeds["x"] * 3  # both signs after the Add: the Relu clamps some
    return feeds


def _check_bits(g, plan, code: str, extra: dict, cache_dir) -> None:
    feeds = _feeds(g)
    want = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(**OFF, **extra), threads=1).run(feeds)
    assert_close(want, reference.run(g, feeds))
    for isa in ("avx512", "avx2"):
        options = CodegenOptions(vector_isa=isa, **extra)
        src = generate(g, plan, options=options).source
        assert code in src and "residual" in src, isa
        assert code not in generate(g, plan, options=CodegenOptions(vector_isa=isa, **OFF, **extra)).source
        for threads in (1, 2):
            got = build(g, plan, cache_dir=cache_dir, options=options, threads=threads).run(feeds)
            for name in want:
                assert same_bits(got[name], want[name]), (isa, threads, name)


@pytest.mark.parametrize("act,attrs,code", [(None, {}, "stba("), ("Relu", {}, "stbar("),
                                            ("Sigmoid", {}, "stbas(")], ids=["add", "relu", "sigmoid"])
@pytest.mark.parametrize("inplace", [False, True], ids=["own_buffer", "in_place"])
@pytest.mark.parametrize("k_blocks", [False, True], ids=["one_k_block", "k_blocks"])
def test_conv_residual_in_registers_is_the_tile_epilogues_bits(act, attrs, code, inplace, k_blocks, cache_dir):
    g, plan = _conv(act, inplace, attrs=attrs)
    extra = {"gemm_register_activations": "all", **({"gemm_kc": 16} if k_blocks else {})}
    if inplace:  # the output over the residual: one pointer passed as both
        prog = generate(g, plan, options=CodegenOptions(**extra))
        assert any(a.kind == "inplace" for a in prog.memory.aliases)
    _check_bits(g, plan, code, extra, cache_dir)


@pytest.mark.parametrize("act,code", [(None, "stca("), ("Relu", "stcar(")])
def test_matmul_column_bias_and_residual_in_registers(act, code, cache_dir):
    g, plan = _matmul(act)
    _check_bits(g, plan, code, {}, cache_dir)


@pytest.mark.parametrize("act", [None, "Relu"])
def test_residual_in_the_plain_c99_build(act, cache_dir):
    """The plain C99 build's storing micro-kernel adds the residual too: the C tile's bits of the same build."""
    g, plan = _conv(act, inplace=True)
    assert_plain_storing_kernel(g, plan, _feeds(g), "stbar(" if act else "stba(", OFF, cache_dir)


def _broadcast():
    """The residual a (1, 20, 1, 1) input: broadcast along the positions, not laid out as the output."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("conv_bcast")
    x = b.input("x", (1, 24, 10, 10))
    w = b.const("w", (rng.standard_normal((20, 24, 1, 1)) * 0.3).astype(np.float32))
    y = b.op("Add", b.op("Conv", x, w, b.const("bias", np.ones(20, np.float32)), name="conv"),
             b.input("r", (1, 20, 1, 1)), name="add")
    g = b.build(y)
    return g, FusionPlan(g, [FusionGroup("g", list(g.nodes), "conv_epilogue", g.nodes[0])])


def _computed():
    """The residual ``Mul(r, r)`` computed in the group: in no memory the micro-kernel could read."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("conv_computed")
    x = b.input("x", (1, 24, 10, 10))
    r = b.input("r", (1, 20, 10, 10))
    w = b.const("w", (rng.standard_normal((20, 24, 1, 1)) * 0.3).astype(np.float32))
    c = b.op("Conv", x, w, b.const("bias", np.ones(20, np.float32)), name="conv")
    sq = b.op("Mul", r, r, name="sq")
    y = b.op("Add", c, sq, name="add")
    g = b.build(y)
    conv, mul, add = g.nodes
    return g, FusionPlan(g, [FusionGroup("g", [conv, mul, add], "conv_epilogue", conv)])


@pytest.mark.parametrize("case", ["broadcast", "computed", "off", "neon"])
def test_residual_refused(case, cache_dir):
    """No "a" epilogue: a broadcast residual, one computed in the group, the option off, the AdvSIMD build (its
    bodies add no residual); the C tile's epilogue instead, as the reference (the AdvSIMD one generated only)."""
    g, plan = _broadcast() if case == "broadcast" else _computed() if case == "computed" else _conv(None, True)
    options = CodegenOptions(**OFF) if case == "off" else \
        CodegenOptions(vector_isa="neon") if case == "neon" else CodegenOptions()
    src = generate(g, plan, options=options).source
    assert "_stba" not in src and "residual" not in src
    if case != "neon":
        feeds = reference.random_inputs(g, 0)
        assert_close(build(g, plan, cache_dir=cache_dir, options=options).run(feeds), reference.run(g, feeds))
