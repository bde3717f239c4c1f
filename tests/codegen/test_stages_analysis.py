"""``stages.analyse`` on its own (no compiler): which nodes of a group are anchors, the stages they make and what
each stores, the attention chain, a Concat copied slice by slice only where what follows can be its epilogue,
sibling anchors merged into one horizontal pass (and not where one reads what the group stores), and the
groups it refuses, with their reasons."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen.kernel import UnsupportedGroupError
from opfuse.codegen.stages import analyse
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.memory import plan_memory
from opfuse.ops import GraphBuilder

rng = np.random.default_rng(3)


def _w(b, *shape):
    return b.const(f"w{len(b.graph.values)}", rng.standard_normal(shape).astype(np.float32))


def _analyse(g, names=None, kind="fused"):
    """The analysis of one group holding the nodes ``names`` (all nodes when None); the others alone."""
    names = names or [n.name for n in g.nodes]
    nodes = [n for n in g.nodes if n.name in names]
    rest = [FusionGroup(n.name, [n], "single", n) for n in g.nodes if n.name not in names]
    group = FusionGroup("g", nodes, kind, None)
    plan = FusionPlan(g, [group, *rest] if nodes[0] is g.nodes[0] else [*rest, group])
    return analyse(group, g, plan_memory(plan).static)


def _summary(a):
    return [(st.kind, [n.name for n in ([st.anchor] if st.anchor else st.anchors)], [v.name for v in st.outputs],
             [n.name for n in st.epilogue]) for st in a.stages]


def _attention(axis=None, scores_out=False):
    b = GraphBuilder("att")
    q, kt, v = b.input("q", (2, 4, 8)), b.input("kt", (2, 8, 6)), b.input("v", (2, 6, 8))
    s = b.op("MatMul", q, kt, name="mm1")
    scaled = b.op("Mul", s, b.const("scale", np.float32(0.5)), name="scale")
    p = b.op("Softmax", scaled, name="sm", **({} if axis is None else {"axis": axis}))
    o = b.op("MatMul", p, v, name="mm2")
    return b.build(o, *([s] if scores_out else []))


@pytest.mark.parametrize("axis", [None, -1, 2])
def test_matmul_softmax_matmul_is_one_attention_stage(axis):
    a = _analyse(_attention(axis))
    assert [(k, anchors, outs) for k, anchors, outs, _ in _summary(a)] == [
        ("attention", ["mm1", "sm", "mm2"], [a.group.nodes[-1].outputs[0].name])]
    assert a.inline == {id(a.group.nodes[1])}


def test_no_attention_stage_where_the_scores_leave_the_group():
    with pytest.raises(UnsupportedGroupError, match="anchor 'sm' .* feeds only other anchors .*mm2"):
        _analyse(_attention(scores_out=True))


def test_no_attention_stage_over_another_softmax_axis_or_alone():
    with pytest.raises(UnsupportedGroupError, match="anchor 'mm1' .* feeds only other anchors"):
        _analyse(_attention(axis=1))
    g = _attention()
    assert [st.kind for st in _analyse(g, ["mm1"], kind="single").stages] == ["anchor"]


def test_conv_epilogue_stores_the_last_inline_node():
    b = GraphBuilder("ce")
    x = b.input("x", (1, 3, 6, 6))
    y = b.op("Conv", x, _w(b, 4, 3, 3, 3), pads=[1, 1, 1, 1], name="conv")
    r = b.op("Relu", b.op("Add", y, _w(b, 4, 1, 1), name="add"), name="relu")
    g = b.build(r)
    a = _analyse(g)
    assert _summary(a) == [("anchor", ["conv"], [r.name], ["add", "relu"])]
    assert {id(n) for n in g.nodes if n.name != "conv"} == a.inline


def test_an_anchor_feeding_only_another_anchor_is_refused():
    b = GraphBuilder("chain")
    x = b.input("x", (4, 8))
    y = b.op("MatMul", b.op("MatMul", x, _w(b, 8, 8), name="mm_a"), _w(b, 8, 3), name="mm_b")
    with pytest.raises(UnsupportedGroupError, match=r"anchor 'mm_a' \(MatMul\) feeds only other anchors \(mm_b\)"):
        _analyse(b.build(y))


def test_an_output_combining_two_anchors_is_refused():
    b = GraphBuilder("two")
    x = b.input("x", (4, 8))
    y = b.op("Add", b.op("MatMul", x, _w(b, 8, 3), name="m1"), b.op("MatMul", x, _w(b, 8, 3), name="m2"), name="s")
    with pytest.raises(UnsupportedGroupError, match=r"output '.*' combines the results of several anchors \(m1, m2\)"):
        _analyse(b.build(y))


def _concat(broadcast: bool):
    """Concat (leaving the group) then an Add: of the Concat's own shape, or broadcasting it along a new axis."""
    b = GraphBuilder("cat")
    x, y = b.input("x", (1, 2, 1)), b.input("y", (1, 3, 1))
    c = b.op("Concat", x, y, axis=1, name="concat")
    z = b.op("Add", c, b.input("r", (1, 5, 4) if broadcast else (1, 5, 1)), name="add")
    return b.build(c, z)


def test_a_concat_is_copied_slice_by_slice_where_what_follows_is_its_epilogue():
    a = _analyse(_concat(broadcast=False))
    assert [(k, anchors, e) for k, anchors, _, e in _summary(a)] == [("anchor", ["concat"], ["add"])]


def test_a_concat_whose_result_is_broadcast_after_it_is_computed_inline():
    a = _analyse(_concat(broadcast=True))
    assert [st.kind for st in a.stages] == ["pointwise", "pointwise"]
    assert len(a.inline) == 2


def _siblings(op: str, first_stored: bool = False):
    b = GraphBuilder("sib")
    x = b.input("x", (1, 4, 6, 6) if op == "Conv" else (6, 8))
    if first_stored:  # the siblings read a value the group itself stores
        x = b.op("Relu", x, name="relu")
    outs = [x] if first_stored else []
    for k in range(2):
        if op == "Conv":
            outs.append(b.op("Conv", x, _w(b, 3, 4, 3, 3), pads=[1, 1, 1, 1], name=f"s{k}"))
        elif op == "Gemm":
            outs.append(b.op("Gemm", x, _w(b, 8, 5), name=f"s{k}"))
        else:
            outs.append(b.op("MatMul", x, _w(b, 8, 5), name=f"s{k}"))
    return b.build(*outs)


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "Conv"])
def test_siblings_reading_one_input_share_one_horizontal_pass(op):
    a = _analyse(_siblings(op))
    (st,) = a.stages
    assert st.kind == "horizontal" and [n.name for n in st.anchors] == ["s0", "s1"]
    assert [m.kind for m in st.members] == ["anchor", "anchor"] and len(st.outputs) == 2


def test_siblings_reading_what_the_group_stores_are_not_merged():
    a = _analyse(_siblings("MatMul", first_stored=True))
    assert [st.kind for st in a.stages] == ["pointwise", "anchor", "anchor"]
