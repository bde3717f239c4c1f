"""``codegen/simdchain.py`` where mutation testing (tests/mutation/mutT.md, issue 13) found no test: a chain with one
staged Sigmoid (Silu) that also reads a run-time scalar (a value constant along the loop, hoisted once per pass),
with and without streaming stores: bitwise the C loop's results."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen import generate
from opfuse.ops import GraphBuilder
from test_simdchain import AVX2, AVX512, GCC, STREAM, STREAM_AVX2, _one_kernel, _outputs, _same_bits, _values


@pytest.mark.parametrize("base", [STREAM, STREAM_AVX2, AVX512, AVX2], ids=["stream", "stream_avx2", "avx512", "avx2"])
def test_a_staged_chain_reads_its_run_time_scalar_in_every_block(base, cache_dir):
    n = 3 * 512 + 4 * 16 + 5  # three blocks, leftover vectors, a scalar remainder
    b = GraphBuilder("scaled_silu")
    x = b.input("x", (n,))
    y = b.op("Add", b.op("Silu", b.op("Mul", x, b.input("s", (1,)))), x)
    g = b.build(y)
    plan = _one_kernel(g)
    feeds = {"x": _values(n), "s": np.array([0.75], np.float32)}
    want = _outputs(g, plan, feeds, GCC, cache_dir)
    options = base.with_(simd_stage_block=512)
    assert "sigmoidf_tail(" in generate(g, plan, options=options).source
    assert _same_bits(_outputs(g, plan, feeds, options, cache_dir), want)
