"""Attention as one group (MatMul -> scale -> Softmax -> MatMul with head split/merge)."""
import numpy as np

from opfuse.ops import GraphBuilder
from fusion_cases import fuse, kinds, plan_of, randn, refusals, assert_same_outputs


def attention(*, axis=-1, escape=False, heads=2, seq=4, dim=3):
    b = GraphBuilder("attention")
    x = b.input("x", (1, seq, heads * dim))
    shape = b.const("heads", np.array([1, seq, heads, dim]))
    proj = []
    for i, name in enumerate(("q", "k", "v")):
        y = b.op("Add", b.op("MatMul", x, b.const(f"w{name}", randn((heads * dim, heads * dim), i)), name=f"{name}_mm"),
                 b.const(f"b{name}", randn(heads * dim, 5 + i)))
        perm = [0, 2, 3, 1] if name == "k" else [0, 2, 1, 3]
        proj.append(b.op("Transpose", b.op("Reshape", y, shape), perm=perm))
    s = b.op("Div", b.op("MatMul", proj[0], proj[1], name="scores"), b.const("scale", np.float32(np.sqrt(dim))))
    if escape:
        return b.build(b.op("MatMul", b.op("Softmax", s, axis=axis), proj[2], name="context"), s)
    p = b.op("Softmax", s, axis=axis, name="probs")
    c = b.op("Reshape", b.op("Transpose", b.op("MatMul", p, proj[2], name="context"), perm=[0, 2, 1, 3]),
             b.const("merge", np.array([1, seq, heads * dim])))
    return b.build(c)


def test_qkv_projection_and_attention_are_two_kernels():
    g0 = attention()
    g, plan, _ = fuse(g0)
    assert [k for k, _ in kinds(plan)] == ["gemm_epilogue", "attention"]
    att = plan.groups[1]
    assert att.attrs["softmax"] == "probs" and att.attrs["pv"] == "context"
    assert att.attrs["epilogue"] == ["transpose_3", "reshape_3"]
    assert_same_outputs(g0, g)


def test_softmax_over_another_axis_is_not_attention():
    plan, dec = plan_of(attention(axis=2))
    assert not any(g.kind == "attention" for g in plan.groups)
    assert any("is not over the last (key) axis" in r for r in refusals(dec, "attention"))


def test_escaping_scores_refuse_attention():
    plan, dec = plan_of(attention(escape=True))
    assert not any(g.kind == "attention" for g in plan.groups)
    assert any("also read outside the attention kernel" in r for r in refusals(dec, "attention"))


def test_float64_attention_is_refused_as_the_kernel_computes_float32_only():
    """Found by opfuse fuzz: the rules grouped a float64 MatMul -> Softmax -> MatMul as attention,
    and the code generator (float32 only) failed on the plan."""
    b = GraphBuilder("att64")
    q = b.input("q", (1, 4, 3), np.float64)
    p = b.op("Softmax", b.op("MatMul", q, b.input("kt", (1, 3, 4), np.float64)), axis=-1)
    g = b.build(b.op("MatMul", p, b.input("v", (1, 4, 3), np.float64)))
    plan, dec = plan_of(g)
    assert not any(gr.kind == "attention" for gr in plan.groups)
    assert any("float32 operands of rank >= 2 only" in r for r in refusals(dec, "attention"))
