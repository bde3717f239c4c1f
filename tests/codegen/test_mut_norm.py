"""Row-wise normalisations (``codegen.norm``) where mutation testing found them unguarded (issue 13, mutN): a
Hardmax along an axis that is not the last (its row loop must walk every other axis), and a float32
LogSoftmax's logarithm taken by ``vecmath``'s helper, not libm's ``logf`` (the same bits whatever the C
library, as the exps beside it)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from opfuse.codegen import vecmath
from opfuse.codegen.program import generate
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_hardmax_along_any_axis_matches_the_reference(cache_dir, axis):
    b = GraphBuilder("hardmax")
    g = b.build(b.op("Hardmax", b.input("x", (3, 5, 7)), axis=axis))
    feeds = reference.random_inputs(g, 0)
    got = next(iter(build(g, None, cache_dir=cache_dir).run(feeds).values()))
    want = next(iter(reference.run(g, feeds).values()))
    assert want.sum() == 3 * 5 * 7 // g.inputs[0].shape[axis]  # one 1 per row: the rows are the axis's
    np.testing.assert_array_equal(got, want)


def test_float32_log_softmax_takes_the_log_of_vecmath_not_libm():
    b = GraphBuilder("log_softmax32")
    g = b.build(b.op("LogSoftmax", b.input("x", (3, 50)), axis=-1))
    src = generate(g, None).source
    kernel = src.split("[ops_LogSoftmax]")[1]
    assert f"{vecmath.LOG}(" in kernel and f"{vecmath.EXP}(" in kernel
    assert not re.search(r"(?<![\w])(logf|expf)\(", kernel)


@pytest.mark.parametrize("stat", [1, 2], ids=["mean", "inv_std"])
def test_a_layernorm_statistic_feeding_its_group_is_refused(stat):
    from opfuse.codegen.kernel import UnsupportedGroupError
    from opfuse.ir.plan import FusionGroup, FusionPlan
    b = GraphBuilder("ln_stats")
    x = b.input("x", (2, 5, 32))
    outs = b.op("LayerNormalization", x, b.const("s", np.ones(32, np.float32)), num_outputs=3, name="ln")
    neg = b.op("Neg", outs[stat], name="neg")
    g = b.build(outs[0], neg)
    plan = FusionPlan(g, [FusionGroup("g", list(g.nodes), "reduction")])
    with pytest.raises(UnsupportedGroupError, match="LayerNormalization 'ln': its mean / inv_std outputs feed the "
                                                    "group; only storing them is supported"):
        generate(g, plan)


def test_both_layernorm_row_sums_run_in_two_chains():
    """The mean's sum and the variance's (``norm.LAYERNORM_CHAINS``) each in two 16-lane arrays, for a 64 row."""
    b = GraphBuilder("ln64")
    x = b.input("x", (3, 64))
    g = b.build(b.op("LayerNormalization", x, b.const("s", np.ones(64, np.float32)), name="ln"))
    kernel = generate(g, None).source.split("[ops_LayerNormalization]")[1]
    assert kernel.count("[2][16];") == 2


@pytest.mark.parametrize("width", [6, 768])
def test_a_row_of_equal_values_normalises_to_exactly_zero(cache_dir, width):
    """A float32 row of equal values: its mean summed in float32 was off by a rounding, so x - mean was ~1e-7,
    divided by sqrt(eps) ~1e-5 after one LayerNormalization, and a second one on that row (variance far below
    eps) gave bias + 6e-5 where the reference gives the bias (fuzz seed 777, graph 466). The sum in double
    makes the mean exact: zeros, then exactly the bias, as the reference."""
    b = GraphBuilder("ln_flat")
    x = b.input("x", (3, width))
    rng = np.random.default_rng(1)
    one = b.op("LayerNormalization", x, b.const("s", rng.uniform(0.5, 1.5, width).astype(np.float32)),
               epsilon=1e-3, name="ln1")
    bias = rng.uniform(-1, 1, width).astype(np.float32)
    g = b.build(one, b.op("LayerNormalization", one, b.const("s2", rng.uniform(-1.5, 1.5, width).astype(np.float32)),
                          b.const("b2", bias), epsilon=1e-3, name="ln2"))
    feeds = {"x": np.stack([np.full(width, v, np.float32) for v in (-0.7016531, 3.3, 1e-3)])}
    got = build(g, None, cache_dir=cache_dir).run(feeds)
    assert not got["ln1"].any()
    np.testing.assert_array_equal(got["ln2"], np.broadcast_to(bias, (3, width)))
    want = reference.run(g, feeds)
    np.testing.assert_array_equal(got["ln2"], want["ln2"])
