"""``codegen/simdchain.py`` where mutation testing (tests/mutation/mutT.md, issue 13) found no test: a chain with one
staged Sigmoid (Silu) that also reads a run-time scalar (a value constant along the loop, hoisted once per pass),
with and without streaming stores: bitwise the C loop's results. The streaming loop runs staged blocks only inside
each of its ``STREAM_CHUNKS`` chunks, so the output here is long enough for every chunk to hold one (test_simdchain.py's
staged test, 1605 floats, runs none there); and an op without a vector form that the refusal walk reaches only after a
scalar constant; a few long rows with a per-row operand split by the threads within the rows."""
from __future__ import annotations

import numpy as np
import pytest

from cg_support import assert_close
from opfuse.codegen import generate, simdchain
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build
from test_simdchain import AVX2, AVX512, GCC, STREAM, STREAM_AVX2, _one_kernel, _outputs, _same_bits, _values


@pytest.mark.parametrize("base", [STREAM, STREAM_AVX2, AVX512, AVX2], ids=["stream", "stream_avx2", "avx512", "avx2"])
def test_a_staged_chain_reads_its_run_time_scalar_in_every_block(base, cache_dir):
    n = simdchain.STREAM_CHUNKS * 530 + 5  # a block and leftover vectors in every chunk, a scalar remainder
    b = GraphBuilder("scaled_silu")
    x = b.input("x", (n,))
    y = b.op("Add", b.op("Silu", b.op("Mul", x, b.input("s", (1,)))), x)
    g = b.build(y)
    plan = _one_kernel(g)
    feeds = {"x": _values(n), "s": np.array([0.75], np.float32)}
    want = _outputs(g, plan, feeds, GCC, cache_dir)
    options = base.with_(simd_stage_block=512)
    assert "siluf_tail(" in generate(g, plan, options=options).source  # CodegenOptions.silu_direct
    assert _same_bits(_outputs(g, plan, feeds, options, cache_dir), want)


def test_an_op_without_a_vector_form_after_a_scalar_constant_keeps_the_c_loop(cache_dir):
    """``Add(Mish(Relu(x)), Mul(x, 0.5))``: the refusal walk meets the scalar constant before the Mish (it reads the
    Add's second operand first) and still looks at every other value: no intrinsics, the reason in the notes,
    results as the reference."""
    b = GraphBuilder("mish_after_a_constant")
    x = b.input("x", (4096,))
    y = b.op("Add", b.op("Mish", b.op("Relu", x)), b.op("Mul", x, b.const("half", np.float32(0.5))))
    g = b.build(y)
    plan = _one_kernel(g)
    src = generate(g, plan, options=AVX512).source
    assert "_mm512" not in src and "_mm256" not in src
    assert "elementwise loop left to the C compiler's vectoriser (op Mish has no vector form)" in src
    feeds = reference.random_inputs(g, 0)
    assert_close(build(g, plan, cache_dir=cache_dir, options=AVX512).run(feeds), reference.run(g, feeds))


@pytest.mark.parametrize("threads", [1, 2])
def test_few_long_rows_with_a_row_operand_split_within_the_rows(threads, cache_dir):
    """[3, 40000] times a per-row scale ([3, 1]: one outer loop of 3 rows, fewer than ``parallel_min_outer``, above
    ``parallel_min_work``): the threads split each row's vectors (the outer loop is not collapsed into them);
    bitwise the C loop with AVX-512 and AVX2."""
    b = GraphBuilder("few_rows")
    x = b.input("x", (3, 40000))
    g = b.build(b.op("Relu", b.op("Mul", x, b.input("s", (3, 1)))))
    plan = _one_kernel(g)
    feeds = {"x": _values(3 * 40000).reshape(3, 40000), "s": np.array([[0.5], [-2.0], [3.0]], np.float32)}
    want = _outputs(g, plan, feeds, GCC, cache_dir, threads)
    for options in (AVX512, AVX2):
        assert "_loadu_ps" in generate(g, plan, options=options).source
        assert _same_bits(_outputs(g, plan, feeds, options, cache_dir, threads), want)
