"""A convolution over one output position (a squeeze-excitation block's 1x1 convolutions on the pooled vector):
the windows GEMM takes a 1 x NR block (``conv_windows.register_block``), NR the multiple of 8 up to
``CodegenOptions.gemm_gemv_nr`` with the fewest panels, then the least padding, then the widest, instead of MR x NR
whose MR - 1 rows repeat the one position's work. The same sums in the same order: the bits of the MR x NR build
(``gemm_gemv_nr=0``), within tolerance of the reference. More than one position, the plain C99 build and
``gemm_gemv_nr=0`` keep MR x NR."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close, same_bits
from opfuse.codegen import CodegenOptions, generate
from opfuse.codegen.conv_windows import register_block
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


@pytest.mark.parametrize("channels,nr", [(120, 40), (64, 32), (1000, 48), (480, 48), (100, 40), (24, 24), (5, 8)])
def test_one_position_takes_the_least_padding_row(channels, nr):
    o = CodegenOptions().resolved("avx512", True)
    assert register_block(o, channels, 1) == (1, nr)
    assert register_block(o, channels, 2) != (1, nr)  # two positions: the windows block
    assert register_block(o.with_(gemm_gemv_nr=0), channels, 1)[0] > 1
    assert register_block(o.with_(simd="none"), channels, 1)[0] > 1


def _squeeze(channels: int, act: str | None):
    rng = np.random.default_rng(channels)
    b = GraphBuilder("se")
    x = b.input("x", (1, 96, 1, 1))
    w = b.const("w", (rng.standard_normal((channels, 96, 1, 1)) * 0.2).astype(np.float32))
    y = b.op("Conv", x, w, b.const("bias", rng.standard_normal(channels).astype(np.float32)), name="conv")
    if act is not None:
        y = b.op(act, y, name="act")
    g = b.build(y)
    return g, FusionPlan(g, [FusionGroup("g", list(g.nodes), "conv_epilogue", g.nodes[0])])


@pytest.mark.parametrize("channels,act,nr", [(120, "Relu", 40), (64, None, 32), (100, "HardSigmoid", 40)])
def test_one_position_conv_is_the_windows_blocks_bits(channels, act, nr, cache_dir):
    g, plan = _squeeze(channels, act)
    assert f"1x{nr} micro-kernel" in generate(g, plan, options=CodegenOptions(vector_isa="avx512")).source
    feeds = reference.random_inputs(g, 0)
    want = build(g, plan, cache_dir=cache_dir, options=CodegenOptions(gemm_gemv_nr=0)).run(feeds)
    assert_close(want, reference.run(g, feeds))
    for options in (CodegenOptions(vector_isa="avx512"), CodegenOptions(vector_isa="avx2")):
        got = build(g, plan, cache_dir=cache_dir, options=options).run(feeds)
        assert all(same_bits(got[k], want[k]) for k in want)
