"""Softmax over an axis other than the last (``norm._softmax_columns``, ``CodegenOptions.softmax_columns``): 16
neighbouring positions of the axes after it at a time, one per lane, instead of a strided row at a time (YOLOv8's
DFL: 16 bins at stride 8400). Against the reference and the row-at-a-time kernel, with a prologue and an epilogue
in the group, a last block of fewer columns, float64, and 2 threads."""
from __future__ import annotations


import numpy as np
import pytest

from cg_support import assert_close
from opfuse.codegen.options import CodegenOptions
from opfuse.codegen.outline import parallel_loops
from opfuse.compiler import build_native, plan_model
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference

CASES = [  # shape, axis, dtype
    ((1, 16, 4, 130), 1, np.float32),     # DFL-like, 520 columns: 32 blocks and one of 8
    ((2, 7, 5, 33), 1, np.float32),       # 165 columns a row of blocks, 10 + one of 5
    ((40, 17), 0, np.float32),            # the first axis, 17 columns: 16 + 1
    ((3, 40, 17), -2, np.float32),        # a negative axis
    ((2, 50, 3, 6), 1, np.float64),       # float64: libm's exp, 18 columns
    ((16, 3, 20), 1, np.float32),         # 16 rows before the axis: parallel_min_outer, no collapse
]


def _graph(shape, axis, dtype):
    b = GraphBuilder("softmax_cols")
    x = b.input("x", shape, dtype)
    y = b.op("Softmax", b.op("Mul", x, b.const("c", np.array(1.5, dtype)), name="pro"), axis=axis, name="sm")
    return b.build(b.op("Relu", b.op("Sub", y, b.const("d", np.array(0.01, dtype))), name="epi"))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_column_softmax_matches_the_reference_and_the_rows(case, threads):
    shape, axis, dtype = CASES[case]
    g = _graph(shape, axis, dtype)
    plan = plan_model(g)
    feeds = reference.random_inputs(g, case)
    feeds = {k: v * 40 for k, v in feeds.items()}  # exp(x) overflows float32: the max subtraction matters
    want = reference.run(g, feeds)
    cols = build_native(plan, threads=threads, codegen_options=CodegenOptions(softmax_columns=True,
                                                                              parallel_min_work=1))
    rows = build_native(plan, threads=threads, codegen_options=CodegenOptions(softmax_columns=False,
                                                                              parallel_min_work=1))
    got_c, got_r = cols.run(feeds), rows.run(feeds)
    assert_close(got_c, want)
    for k in want:
        # the sums run in another order where the axis is longer than 16 (lane_reduce): a few ulps apart
        np.testing.assert_allclose(got_c[k], got_r[k], rtol=1e-5 if dtype == np.float32 else 1e-13, atol=1e-8)
    src_c, src_r = cols.program.source, rows.program.source
    assert "* 16 + l" in src_c and "* 16 + l" not in src_r  # the lanes' buffer, columns in blocks of 16
    assert cols.report["kernels"] == 1  # prologue, Softmax and epilogue in one kernel
    # the rows before the axis and the blocks of columns shared out, both loops where the first has few
    loop = next(lp for lp in parallel_loops(src_c) if lp.heads[0].startswith("for (long o"))
    assert (loop.collapse == 2) == (int(loop.bound) < CodegenOptions().parallel_min_outer)


def test_few_columns_keep_the_rows():
    """15 positions after the axis: fewer than a block, the row at a time."""
    g = _graph((2, 9, 3, 5), 1, np.float32)
    src = build_native(plan_model(g), codegen_options=CodegenOptions()).program.source
    assert "* 16 + l" not in src
    g = _graph((2, 9, 15), -1, np.float32)  # the last axis: rows as before
    assert "* 16 + l" not in build_native(plan_model(g)).program.source
