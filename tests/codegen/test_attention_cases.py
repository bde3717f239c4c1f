"""The attention kernel: its refusal (no compiler: a MatMul -> Softmax -> MatMul group over float64, or with a
query of rank 1, is no float32 attention of rank >= 2, and the generator says so instead of emitting it), and
a NaN in one query row staying in that row when the next tile reuses the thread's running statistics."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen.kernel import UnsupportedGroupError
from opfuse.codegen.program import generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder


def _attention(q_shape, dtype, kt_shape=(8, 6), v_shape=(6, 8)):
    b = GraphBuilder("att")
    q, kt, v = b.input("q", q_shape, dtype), b.input("kt", kt_shape, dtype), b.input("v", v_shape, dtype)
    g = b.build(b.op("MatMul", b.op("Softmax", b.op("MatMul", q, kt, name="mm1"), name="sm"), v, name="mm2"))
    return g, FusionPlan(g, [FusionGroup("att", list(g.nodes), "attention", None)])


@pytest.mark.parametrize("q_shape,dtype", [((4, 8), np.float64), ((8,), np.float32)], ids=["float64", "rank1"])
def test_attention_refuses_what_it_cannot_compute(q_shape, dtype):
    g, plan = _attention(q_shape, dtype)
    with pytest.raises(UnsupportedGroupError, match="attention needs float32 operands of rank >= 2"):
        generate(g, plan)


def test_the_float32_attention_of_rank_2_is_generated():
    g, plan = _attention((4, 8), np.float32)
    (kernel,) = [k for k in generate(g, plan).kernels if k.function]
    assert kernel.kind == "attention"


def test_a_nan_query_row_stays_in_its_row_across_tiles(cache_dir):
    """Two heads, one tile each, on one thread: head 0's first query is NaN (its output row is NaN); head 1's
    first row, computed next in the same scratch, must still be the reference's finite values."""
    from opfuse.runtime import reference
    from opfuse.runtime.native import build
    g, plan = _attention((2, 40, 8), np.float32, kt_shape=(2, 8, 40), v_shape=(2, 40, 8))
    feeds = reference.random_inputs(g, 0)
    feeds["q"][0, 0, :] = np.nan
    got = next(iter(build(g, plan, cache_dir=cache_dir, threads=1).run(feeds).values()))
    want = next(iter(reference.run(g, feeds).values()))
    assert np.isnan(want[0, 0]).all() and np.isfinite(want[1]).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.allclose(got[1], want[1], rtol=1e-4, atol=1e-5)
