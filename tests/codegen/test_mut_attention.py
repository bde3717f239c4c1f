"""The attention kernel (``codegen.attention``) where mutation testing found it unguarded (issue 13, mutN): the
online softmax's running statistics and numerator cleared at the start of every tile (a NaN query row of one head
must not reach the next head's rows computed in the same scratch), and key ranges and key blocks that end one key
past a whole micro-kernel panel (every panel of scores computed, the last one of a single key included)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen.options import CodegenOptions
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build

ONLINE = {"attention_one_pass_max_keys": 0}  # the online softmax over key blocks, whatever the key range


def _attention(heads: int, seq: int, keys: int, d: int, dv: int):
    b = GraphBuilder("att")
    q = b.input("q", (heads, seq, d))
    kt = b.input("kt", (heads, d, keys))
    v = b.input("v", (heads, keys, dv))
    g = b.build(b.op("MatMul", b.op("Softmax", b.op("MatMul", q, kt, name="mm1"), name="sm"), v, name="mm2"))
    return g, FusionPlan(g, [FusionGroup("att", list(g.nodes), "attention", None)])


def _run(g, plan, feeds, cache_dir, options):
    model = build(g, plan, cache_dir=cache_dir, threads=1, options=CodegenOptions(**options))
    assert [k["kind"] for k in model.report["c_kernels"] if k["function"]] == ["attention"]
    return next(iter(model.run(feeds).values())), next(iter(reference.run(g, feeds).values()))


@pytest.mark.parametrize("options", [ONLINE, {}], ids=["online", "one_pass"])
def test_a_nan_query_row_of_one_head_leaves_the_next_heads_finite(cache_dir, options):
    """Two heads, one tile each, on one thread: head 0's first query is NaN; head 1, computed next in the same
    scratch, must give the reference's finite values (the online form clears its numerator Ot and its running
    denominator per tile: left over, NaN * 0 stays NaN)."""
    g, plan = _attention(2, 40, 40, 8, 8)
    feeds = reference.random_inputs(g, 0)
    feeds["q"][0, 0, :] = np.nan
    got, want = _run(g, plan, feeds, cache_dir, options)
    assert np.isnan(want[0, 0]).all() and np.isfinite(want[1]).all()
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [ONLINE, {**ONLINE, "attention_block": 16}, {}],
                         ids=["online", "online_blocks_of_16", "one_pass"])
def test_key_ranges_one_key_past_whole_panels(cache_dir, options):
    """49 keys (one past a multiple of 4, 6, 8 and 16: a last key panel of one key, in one block or in blocks of
    16 rounded up to the micro-kernel's rows), 12 values (a partial value panel) and 20 queries, two heads."""
    g, plan = _attention(2, 20, 49, 8, 12)
    feeds = reference.random_inputs(g, 0)
    got, want = _run(g, plan, feeds, cache_dir, options)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("options", [ONLINE, {}], ids=["online", "one_pass"])
def test_scores_far_above_the_float_exponents_range(cache_dir, options):
    """Scores up to a few hundred (exp overflows float from 89): the softmax must shift each query's scores by
    their running or whole-range max before the exponential, as the reference does."""
    g, plan = _attention(2, 20, 40, 8, 8)
    feeds = reference.random_inputs(g, 0)
    feeds["q"] *= 60.0
    got, want = _run(g, plan, feeds, cache_dir, options)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_refusal_says_what_is_missing():
    """The whole refusal, after the group's name: what the kernel needs, not a prefix of it."""
    from opfuse.codegen.kernel import UnsupportedGroupError
    from opfuse.codegen.program import generate
    b = GraphBuilder("att")
    q, kt, v = b.input("q", (8,)), b.input("kt", (8, 6)), b.input("v", (6, 8))  # a query of rank 1
    g = b.build(b.op("MatMul", b.op("Softmax", b.op("MatMul", q, kt, name="mm1"), name="sm"), v, name="mm2"))
    plan = FusionPlan(g, [FusionGroup("att", list(g.nodes), "attention", None)])
    with pytest.raises(UnsupportedGroupError) as e:
        generate(g, plan)
    assert str(e.value).endswith("(node 'att'): attention needs float32 operands of rank >= 2")
