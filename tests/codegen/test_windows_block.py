"""The windows GEMM's register block on hosts with zmm-wide FMA pipes (``CodegenOptions.windows_mr_max`` None:
14 there, 8 elsewhere): what ``resolved`` fills in, what ``conv_windows.register_block`` picks with each range,
and 14-row blocks against the reference and bitwise against the 8-row build, on convolutions whose positions,
channels and depth leave remainders (M, N, K not multiples of the blocks)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.codegen.conv_windows import register_block
from opfuse.codegen.options import WINDOWS_MR_MAX, WINDOWS_MR_MAX_FULL_WIDTH
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(14)


@pytest.mark.parametrize(("full_width", "want"), [(True, WINDOWS_MR_MAX_FULL_WIDTH), (False, WINDOWS_MR_MAX)])
def test_resolved_fills_the_windows_range_from_the_fma_width(full_width, want):
    assert (WINDOWS_MR_MAX_FULL_WIDTH, WINDOWS_MR_MAX) == (14, 8)
    assert CodegenOptions().windows_mr_max is None
    assert CodegenOptions().resolved("avx512", full_width).windows_mr_max == want
    assert CodegenOptions(windows_mr_max=10).resolved("avx512", full_width).windows_mr_max == 10  # given: kept


@pytest.mark.parametrize(("positions", "row", "mr14", "mr8"), [
    (784, 28, 14, 7),     # 28x28: 14 and 7 divide the row; the larger
    (196, 14, 14, 7),     # 14x14
    (3136, 56, 14, 8),    # 56x56: 8 divides it too, 14 is larger
    (49, 7, 7, 7),        # 7x7: 14 would pad 49 positions to 56
    (99, 11, 11, 6),      # 9x11 (a range up to 14: 11 pads none; up to 8: 6 pads 3 of 102, 7 and 8 pad 6 and 5)
])
def test_register_block_picks_the_least_padding_then_the_largest(positions, row, mr14, mr8):
    for mr_max, want in ((14, mr14), (8, mr8)):
        o = CodegenOptions(windows_mr_max=mr_max).resolved("avx512")
        assert register_block(o, 64, positions, row) == (want, 32)
    # not resolved for a host: the range up to WINDOWS_MR_MAX
    assert register_block(CodegenOptions(vector_isa="avx512", gemm_mr=8, gemm_nr=32), 64, positions, row) == (mr8, 32)


def _conv(c, oc, h, w, k, stride, pad):
    b = GraphBuilder("conv")
    x = b.input("x", (1, c, h, w))
    wt = b.const("w", (rng.standard_normal((oc, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32))
    bias = b.const("b", rng.standard_normal(oc).astype(np.float32))
    y = b.op("Conv", x, wt, bias, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, name="conv")
    g = b.build(b.op("Relu", y, name="act"))
    return g, group_by_names(g, [("conv_epilogue", ["conv", "act"])])


@pytest.mark.parametrize(("c", "oc", "h", "w", "k", "stride", "pad", "mr"), [
    (13, 37, 27, 28, 3, 2, 1, 14),   # 14x14 out in rows of 14, 37 channels (a part panel), K = 117
    (40, 50, 28, 28, 3, 2, 1, 14),   # K = 360 in K blocks of 64 (the last one short)
    (24, 33, 9, 11, 3, 1, 1, 11),    # 99 positions in rows of 11
    (20, 45, 9, 12, 1, 1, 0, 12),    # 1x1 over its windows (108 positions: 12 pads none, 14 would pad 4)
])
def test_fourteen_row_blocks_match_the_reference_and_the_eight_row_build(c, oc, h, w, k, stride, pad, mr, cache_dir):
    g, plan = _conv(c, oc, h, w, k, stride, pad)
    base = CodegenOptions(vector_isa="avx512", gemm_kc=64, conv_direct_max_k=0, windows_pack_min_channels=10 ** 6,
                          winograd="off")
    wide, want, m = run_both(g, plan, cache_dir, options=base.with_(windows_mr_max=14))
    narrow, _, m8 = run_both(g, plan, cache_dir, options=base.with_(windows_mr_max=8))
    assert re.search(rf"opfuse_ukr_{mr}x32_koff_packed", m.program.source)
    assert not re.search(r"opfuse_ukr_(9|1[0-4])x32_koff", m8.program.source)
    assert_close(wide, want)
    for name in want:  # each output sums its products in increasing k, one FMA each, whatever the block
        np.testing.assert_array_equal(wide[name], narrow[name])
