"""The storing micro-kernel's column bias (``microkernel.EPILOGUES`` "c", ``gemm.register_epilogue``,
``CodegenOptions.gemm_column_bias_epilogue``): a MatMul + Add of a bias along N (+ Relu or an activation) finished
in registers, the whole blocks stored by the micro-kernel and the part blocks (past M or N) through the C tile,
bitwise the C tile's epilogue (the option off), with AVX-512, AVX2, 2 threads and the plain C99 build; against the
reference. Refused: a bias along M, an activation in the plain C99 build. (A second Add, a residual's:
test_residual_epilogue.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, assert_plain_storing_kernel
from opfuse.codegen import CodegenOptions, generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

OFF = {"gemm_column_bias_epilogue": False}


def _graph(act: str | None, attrs: dict | None = None, bias_shape=(70,), k: int = 48):
    rng = np.random.default_rng(7)
    b = GraphBuilder("mm_bias")
    x = b.input("x", (2, 37, k))
    w = b.const("w", (rng.standard_normal((k, 70)) * 0.3).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(bias_shape).astype(np.float32))
    y = b.op("Add", b.op("MatMul", x, w, name="mm"), bias, name="add")
    if act is not None:
        y = b.op(act, y, name="act", **(attrs or {}))
    g = b.build(y)
    return g, FusionPlan(g, [FusionGroup("g", list(g.nodes), "gemm_epilogue", g.nodes[0])])


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    nan = np.isnan(a)
    return bool(np.array_equal(nan, np.isnan(b)) and np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32)))


@pytest.mark.parametrize("act,attrs,code", [(None, {}, "stc("), ("Relu", {}, "stcr("), ("Gelu", {}, "stce("),
                                            ("Gelu", {"approximate": "tanh"}, "stcg("), ("Sigmoid", {}, "stcs(")],
                         ids=["bias", "relu", "gelu", "gelu_tanh", "sigmoid"])
@pytest.mark.parametrize("k", [48, 40], ids=["one_k_block", "k_blocks"])
def test_column_bias_in_registers_is_the_tile_epilogues_bits(act, attrs, code, k, cache_dir):
    g, plan = _graph(act, attrs, k=k)
    feeds = reference.random_inputs(g, 0)
    feeds["x"] = feeds["x"] * 3
    extra = {"gemm_register_activations": "all"} if k == 48 else {"gemm_kc": 16, "gemm_register_activations": "all"}
    want = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(**OFF, **extra), threads=1).run(feeds)
    assert_close(want, reference.run(g, feeds))
    for isa in ("avx512", "avx2"):
        options = CodegenOptions(vector_isa=isa, **extra)
        src = generate(g, plan, options=options).source
        assert code in src and ("applied and stored by the micro-kernel" in src or "added and stored" in src), isa
        assert code not in generate(g, plan, options=CodegenOptions(vector_isa=isa, **OFF, **extra)).source
        for threads in (1, 2):
            got = build(g, plan, cache_dir=cache_dir, options=options, threads=threads).run(feeds)
            for name in want:
                assert _same_bits(got[name], want[name]), (isa, threads, name)


@pytest.mark.parametrize("act", [None, "Relu"])
def test_column_bias_in_the_plain_c99_build(act, cache_dir):
    """The plain C99 build's storing micro-kernel adds the column bias too (and a Relu; no other activation there):
    the C tile's bits of the same build."""
    g, plan = _graph(act)
    assert_plain_storing_kernel(g, plan, reference.random_inputs(g, 0), "stcr(" if act else "stc(", OFF, cache_dir)


@pytest.mark.parametrize("case", ["bias_along_m", "portable"])
def test_column_bias_refused(case, cache_dir):
    """A bias that varies along M (shape (37, 1)) is no column bias; the plain C99 build has no vector epilogue to
    keep the bits of: the C tile's epilogue in each, as the reference."""
    g, plan = _graph("Gelu" if case == "portable" else None, bias_shape=(37, 1) if case == "bias_along_m" else (70,))
    options = CodegenOptions(simd="none") if case == "portable" else CodegenOptions()
    src = generate(g, plan, options=options).source
    assert "_stc" not in src
    feeds = reference.random_inputs(g, 0)
    assert_close(build(g, plan, cache_dir=cache_dir, options=options).run(feeds), reference.run(g, feeds))
