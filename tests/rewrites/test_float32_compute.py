"""float32_compute: float16/bfloat16 ops rewritten to compute in float32 between Casts."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import UnsupportedDtypeError
from opfuse.ir.dtypes import BFLOAT16
from opfuse.ops import GraphBuilder
from opfuse.passes import fuse, make_context
from opfuse.rewrites import RewriteContext
from opfuse.rewrites.edit import Provenance
from opfuse.rewrites.float32_compute import RULE, compute_in_float32
from opfuse.rules.options import FusionOptions
from opfuse.runtime.native import build
from opfuse.runtime.reference import run


def _rewrite(graph):
    rc = RewriteContext(FusionOptions(), Provenance(graph))
    return compute_in_float32(graph, rc), rc


@pytest.mark.parametrize("half", [np.dtype(np.float16), BFLOAT16], ids=["float16", "bfloat16"])
def test_ops_compute_in_float32_between_casts(half):
    b = GraphBuilder("g")
    x = b.input("x", (2, 4), half)
    w = b.const("w", np.arange(16, dtype=np.float32).reshape(4, 4).astype(half) / 8)
    y = b.op("Relu", b.op("MatMul", x, w, name="mm"), name="relu")
    g = b.build(b.op("Reshape", y, b.const("s", np.array([8], np.int64)), name="flat"))
    feeds = {"x": np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4).astype(half)}
    want = run(g, feeds)
    changed, rc = _rewrite(g)
    assert changed
    g.verify()
    ops = {n.name: n for n in g.nodes}
    # MatMul and Relu compute in float32; the Reshape (a view) keeps 16 bits
    assert ops["mm"].outputs[0].dtype == np.float32 and ops["relu"].outputs[0].dtype == np.float32
    assert ops["flat"].outputs[0].dtype == half and ops["flat"].input(0).dtype == half
    assert [n.op_type for n in g.nodes].count("Cast") == 4  # x widened; mm and relu rounded; relu's input widened
    assert ops["mm"].input(1).is_const and ops["mm"].input(1).dtype == np.float32  # the weight widened here, exactly
    np.testing.assert_array_equal(ops["mm"].input(1).const, w.const.astype(np.float32))
    assert g.outputs[0].name == "flat" and g.outputs[0].dtype == half
    got = run(g, feeds)  # per-op rounding kept: the rewritten graph computes the same bits
    np.testing.assert_array_equal(got["flat"].view(np.uint16), want["flat"].view(np.uint16))
    assert [d.rule for d in rc.decisions] == [RULE]


def test_float32_graphs_are_untouched():
    b = GraphBuilder("g")
    g = b.build(b.op("Relu", b.input("x", (3,))))
    changed, rc = _rewrite(g)
    assert not changed and not rc.decisions and [n.op_type for n in g.nodes] == ["Relu"]


def test_op_whose_dtype_comes_from_an_attribute_is_refused_with_the_reason(tmp_path):
    """ConstantOfShape's float16 output comes from its ``value`` attribute, not its inputs: the
    rewrite leaves it (logging why) and the C backend refuses it naming the node."""
    b = GraphBuilder("g")
    shape = b.const("shape", np.array([2, 3], np.int64))
    y = b.op("ConstantOfShape", shape, value=np.array([1.5], np.float16), name="fill")
    g = b.build(y)
    changed, rc = _rewrite(g)
    assert not changed
    assert rc.decisions[0].verdict != "fused" and "output type does not follow" in rc.decisions[0].reason
    with pytest.raises(UnsupportedDtypeError, match=r"node 'fill' \(ConstantOfShape\) computes in it"):
        build(g, None, cache_dir=tmp_path)


def test_disabled_by_name_leaves_float16_ops_for_the_c_backend_to_refuse():
    b = GraphBuilder("g")
    g = b.build(b.op("Relu", b.input("x", (3,), np.float16), name="relu"))
    g2, _, _ = fuse(g, make_context(disable=[RULE]))
    assert [n.op_type for n in g2.nodes] == ["Relu"]
    g3, plan, _ = fuse(g, make_context())
    assert sorted(n.op_type for n in g3.nodes) == ["Cast", "Cast", "Relu"]
    assert len(plan.groups) == 1  # the Casts fused with the Relu


@pytest.mark.parametrize("half", [np.dtype(np.float16), BFLOAT16], ids=["float16", "bfloat16"])
def test_exact_ops_skip_their_cast_pair_and_keep_the_bits(half):
    """Relu and Transpose give float16 values from float16 values: Mul reads the Transpose's float32
    result directly (their two Cast pairs are left out); Mul's result is rounded and widened again."""
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4), half)
    t = b.op("Transpose", b.op("Relu", x, name="relu"), perm=[2, 0, 1], name="tr")
    g = b.build(b.op("Sigmoid", b.op("Mul", t, t, name="mul"), name="sig"))
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32).astype(half)}
    want = run(g, feeds)
    assert _rewrite(g)[0]
    g.verify()
    # x widened; Mul rounded and widened; Sigmoid rounded (8 without the shortcut)
    assert [n.op_type for n in g.nodes].count("Cast") == 4
    ops = {n.name: n for n in g.nodes}
    assert ops["mul"].input(0) is ops["tr"].output and ops["tr"].input(0) is ops["relu"].output
    got = run(g, feeds)
    np.testing.assert_array_equal(got["sig"].view(np.uint16), want["sig"].view(np.uint16))


def test_clip_with_attribute_bounds_is_not_exact():
    """Clip(max=0.1) in float32 gives 0.1, not a float16 value: its Cast pair stays."""
    b = GraphBuilder("g", opset=6)
    x = b.input("x", (4,), np.float16)
    g = b.build(b.op("Relu", b.op("Clip", x, min=-1.0, max=0.1, name="clip"), name="relu"))
    _rewrite(g)
    ops = {n.name: n for n in g.nodes}
    assert ops["relu"].input(0).producer.op_type == "Cast"
