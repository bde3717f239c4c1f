"""The attention kernel's refusal (no compiler): a MatMul -> Softmax -> MatMul group over float64, or with a
query of rank 1, is no float32 attention of rank >= 2, and the generator says so instead of emitting it."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.codegen.kernel import UnsupportedGroupError
from opfuse.codegen.program import generate
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops import GraphBuilder


def _attention(q_shape, dtype):
    b = GraphBuilder("att")
    q, kt, v = b.input("q", q_shape, dtype), b.input("kt", (8, 6), dtype), b.input("v", (6, 8), dtype)
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
