"""``codegen/pointwise.py`` where mutation testing (tests/mutation/mutM.md, issue 13) found no test: a Concat computed
inline in a pointwise chain is written as one loop per input along its axis (``concat.concat_split``: no branch
between the inputs, the form gcc 12.2 -O3 turned into masked loads that returned other memory), in the plain C99
build and the vectorised one, against the reference."""
from __future__ import annotations

import re

import pytest

from cg_support import assert_close, group_by_names, run_both
from opfuse.codegen import CodegenOptions
from opfuse.ops import GraphBuilder


@pytest.mark.parametrize("simd", ["none", "auto"])
def test_an_inline_concat_is_one_loop_per_input(simd, cache_dir):
    b = GraphBuilder("cat")
    x, y = b.input("x", (2, 3, 40)), b.input("y", (2, 5, 40))
    c = b.op("Concat", b.op("Relu", x, name="rx"), y, axis=1, name="concat")
    g = b.build(b.op("Sigmoid", c, name="sig"))
    plan = group_by_names(g, [("pw", ["rx", "concat", "sig"])])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(simd=simd))
    assert_close(got, want)
    # channels 0-2 from x, then 3-7 from y, each loop reading its own input
    assert re.search(r"for \(long (i\d+) = 0; \1 < 3; \+\+\1\)", m.program.source)
    assert re.search(r"for \(long (i\d+) = 3; \1 < 8; \+\+\1\)", m.program.source)


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_a_concat_along_the_outermost_axis_is_one_loop_per_input_too(dtype, threads, cache_dir):
    """Concat(x, x) on axis 0 into a Clip (fuzz seed 41214): the outermost loop was never split (it is the one
    threads share), so the inputs were a branch between two loads, and gcc 12.2 -O3 (-march=native, AVX2 and
    AVX-512, -mprefer-vector-width=256 too) computed the second input's rows as zeros. Now each input has its
    own outermost loop, each its own parallel loop."""
    import numpy as np
    b = GraphBuilder("cat0")
    x = b.input("x", (2, 3), dtype)
    c = b.op("Concat", x, x, axis=0, name="concat")
    lo, hi = b.const("lo", np.array(-0.6, dtype)), b.const("hi", np.array(5.8, dtype))
    g = b.build(b.op("Clip", c, lo, hi, name="clip"))
    plan = group_by_names(g, [("cat", ["concat", "clip"])])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(parallel_min_work=0), threads=threads)
    assert_close(got, want)
    assert re.search(r"for \(long (i\d+) = 0; \1 < 2; \+\+\1\)", m.program.source)
    assert re.search(r"for \(long (i\d+) = 2; \1 < 4; \+\+\1\)", m.program.source)
    assert "if (" not in m.program.source.split("k0_")[-1].split("opfuse_run")[0]


def test_a_concat_read_across_its_inputs_reads_each_inside_and_selects(cache_dir):
    """Concat on axis 0 read through a Transpose: the loop along the Concat's axis is the innermost of the
    transposed output, so it cannot be split; every input is read at a position inside it and the element's
    input selected, with no branch between loads (``rules._concat``)."""
    b = GraphBuilder("cat_t")
    x, y = b.input("x", (2, 3), "float64"), b.input("y", (1, 3), "float64")
    c = b.op("Concat", x, y, x, axis=0, name="concat")
    g = b.build(b.op("Abs", b.op("Transpose", c, perm=[1, 0], name="t"), name="abs"))
    plan = group_by_names(g, [("cat", ["concat", "t", "abs"])])
    got, want, m = run_both(g, plan, cache_dir)
    assert_close(got, want)
    kernel = m.program.source.split("OPFUSE_KERNEL")[-1]
    assert "if (" not in kernel and kernel.count("(unsigned long)") >= 2 and "? " in kernel


@pytest.mark.parametrize("op, dtype", [("Sigmoid", "float64"), ("Neg", "float64"), ("Neg", "int32"), ("Abs", "int32"),
                                       ("Silu", "float64")])
def test_an_op_of_a_concats_negative_constant_piece_compiles(op, dtype, cache_dir):
    """The loop over a Concat's constant piece reads it as a literal; a negative one under a negation was
    ``--0x1.5d0ad2p-2``, a decrement, and the C did not compile (fuzz seed 41215: Sigmoid of Concat(x, [-0.34])
    into a ReduceProd, float64; the loop of its own per input since this session's Concat change)."""
    import numpy as np
    b = GraphBuilder("neg_lit")
    x = b.input("x", (16,), dtype)
    c = b.op("Concat", x, b.const("part", np.array([-3], dtype)), axis=0, name="concat")
    g = b.build(b.op(op, c, name="op"))
    plan = group_by_names(g, [("all", ["concat", "op"])])
    got, want, m = run_both(g, plan, cache_dir, options=CodegenOptions(simd="none"), threads=3)
    assert_close(got, want)
