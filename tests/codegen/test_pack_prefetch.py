"""A 1x1 convolution whose input rows are packed per tile prefetches, after each micro-kernel call, a share of
the rows of the tile the thread takes next (``CodegenOptions.gemm_pack_prefetch``, ``gemm._next_pack``): where
it is emitted, and that it leaves the results as they are (bitwise against the build without it, close to the
reference) on shapes whose positions, channels and batch leave part tiles and part panels."""
from __future__ import annotations

import re

import numpy as np
import pytest

from opfuse.errors import OpfuseError

from cg_support import assert_close, pointwise_relu, run_both
from opfuse.codegen import CodegenOptions

rng = np.random.default_rng(64)


def _pointwise(n, c, oc, h, w):
    return pointwise_relu(c, oc, h, rng, "pw", batch=n, width=w)


@pytest.mark.parametrize(("n", "c", "oc", "h", "w"), [
    (1, 64, 128, 40, 40),   # 1600 positions: 7 tiles of 256 columns, the last one part
    (2, 19, 45, 37, 29),    # two images (the next tile's batch), K = 19, 45 channels, 1073 positions
    (1, 24, 20, 16, 16),    # 256 positions: one tile per image, nothing to prefetch
])
def test_pack_prefetch_keeps_the_results(n, c, oc, h, w, cache_dir):
    g, plan = _pointwise(n, c, oc, h, w)
    on, want, m_on = run_both(g, plan, cache_dir, options=CodegenOptions())
    off, _, m_off = run_both(g, plan, cache_dir, options=CodegenOptions(gemm_pack_prefetch=False))
    # X's rows packed per tile: copied before the calls, or by the first row block's calls (``pack_in_kernel``)
    assert "memcpy(" in m_on.program.source or re.search(r"_cp(_st\w+)?\(", m_on.program.source)
    tiles = int(m_on.program.source.split("tile1 < ")[1].split(";")[0])
    assert ("__builtin_prefetch" in m_on.program.source) == (tiles > 1)
    assert "__builtin_prefetch" not in m_off.program.source
    assert_close(on, want)
    for name in want:
        np.testing.assert_array_equal(on[name], off[name])


def test_pack_prefetch_only_in_the_x86_intrinsics_builds(cache_dir):
    """The plain C99 build (and so the Cortex-M7's) has no prefetch; nor does a GEMM whose B is packed at build
    time (a MatMul by constant weights) or a 1x1 convolution read over its windows (7x7)."""
    g, plan = _pointwise(1, 64, 128, 40, 40)
    _, _, plain = run_both(g, plan, cache_dir, options=CodegenOptions(simd="none"))
    assert "__builtin_prefetch" not in plain.program.source
    g7, plan7 = _pointwise(1, 64, 128, 7, 7)
    _, _, m7 = run_both(g7, plan7, cache_dir, options=CodegenOptions())
    assert "_koff" in m7.program.source and "__builtin_prefetch" not in m7.program.source


def test_pack_prefetch_locality_is_checked():
    assert CodegenOptions().gemm_pack_prefetch_locality == 2
    with pytest.raises(OpfuseError, match="gemm_pack_prefetch_locality"):
        CodegenOptions(gemm_pack_prefetch_locality=4)
