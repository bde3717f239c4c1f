"""Every legal epilogue is one the C backend compiles: after an anchor (Conv/MatMul/Gemm,
reduction, attention) only pointwise ops and relabelling moves (Reshape family, Transpose)
may follow. Expand, Slice, Pad, Gather, Concat... spread or drop anchor elements: refused,
with the reason in the decision log, and the graph still compiles and matches the reference."""
import numpy as np
import pytest

import opfuse
from opfuse.rules.decisions import Refusal
from opfuse.rules.kernel_shape import classify
from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import random_inputs, run
from fusion_cases import ATOL, RTOL, group_with, plan_of, randn, refusals

SPREAD = "would spread one result of the anchor"


def gemm_then(op: str):
    b = GraphBuilder("gemm_then")
    x = b.input("x", (4, 6))
    y = b.op("Gemm", x, b.const("w", randn((6, 3))), b.const("c", randn(3, 1)), name="gemm")
    if op == "Expand":  # same shape: only the spreading category refuses it
        z = b.op("Expand", y, b.const("shape", np.array([4, 3])), name="after")
    else:
        z = b.op(op, y, name="after")
    return b.build(b.op("Neg", z, name="neg"))


def reduce_then_expand():
    b = GraphBuilder("reduce_then_expand")
    x = b.input("x", (3, 5))
    r = b.op("ReduceMean", b.op("Mul", x, x, name="sq"), axes=[1], keepdims=1, name="mean")
    e = b.op("Expand", r, b.const("shape", np.array([3, 1])), name="after")
    return b.build(b.op("Sqrt", e, name="sqrt"))


def compiles_and_matches(graph) -> None:
    feeds = random_inputs(graph, 0)
    for planner in ("rules", "auto"):
        got = opfuse.compile(graph, target="host", fuse=True, planner=planner).run(feeds)
        for name, ref in run(graph, feeds).items():
            np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL)


def test_pointwise_epilogue_joins_the_gemm():
    plan, _ = plan_of(gemm_then("Relu"))
    assert group_with(plan, "gemm").kind == "gemm_epilogue"
    assert [n.name for n in group_with(plan, "gemm").nodes] == ["gemm", "after", "neg"]
    compiles_and_matches(gemm_then("Relu"))


@pytest.mark.parametrize("make", [lambda: gemm_then("Expand"), reduce_then_expand],
                         ids=["gemm-expand", "reduction-expand"])
def test_expand_after_an_anchor_is_refused_with_a_reason(make):
    graph = make()
    plan, dec = plan_of(graph)
    after = graph.nodes[[n.name for n in graph.nodes].index("after")]
    anchor = after.inputs[0].producer
    assert group_with(plan, after.name) is not group_with(plan, anchor.name)
    assert any(SPREAD in r for r in refusals(dec, "epilogue"))
    shape = classify([anchor, after], graph)
    assert isinstance(shape, Refusal) and SPREAD in shape.reason
    compiles_and_matches(graph)


def attention_then_slice(heads=2, seq=4, dim=3):
    """Q/K/V head split, attention, then a Slice of the context rows (no head merge)."""
    b = GraphBuilder("attention_then_slice")
    x = b.input("x", (1, seq, heads * dim))
    shape = b.const("heads", np.array([1, seq, heads, dim]))
    proj = []
    for i, name in enumerate(("q", "k", "v")):
        y = b.op("MatMul", x, b.const(f"w{name}", randn((heads * dim, heads * dim), i)))
        perm = [0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]
        proj.append(b.op("Transpose", b.op("Reshape", y, shape), perm=perm))
    s = b.op("Mul", b.op("MatMul", proj[0], proj[1]), b.const("scale", np.float32(1 / np.sqrt(dim))))
    c = b.op("MatMul", b.op("Softmax", s, axis=-1), proj[2], name="context")
    rows = b.op("Slice", c, b.const("starts", np.array([1])), b.const("ends", np.array([seq])),
                b.const("axes", np.array([2])), name="rows")
    return b.build(rows)


def test_attention_keeps_relabelling_epilogue_but_not_a_slice():
    graph = attention_then_slice()
    plan, _ = plan_of(graph)
    att = group_with(plan, "context")
    assert att.kind == "attention" and att.attrs["epilogue"] == []
    assert group_with(plan, "rows") is not att
    nodes = [*att.nodes, next(n for n in graph.nodes if n.name == "rows")]
    shape = classify(nodes, graph)
    assert isinstance(shape, Refusal) and "does not relabel" in shape.reason
    compiles_and_matches(graph)
