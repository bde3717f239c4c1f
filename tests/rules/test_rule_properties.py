"""Property tests of the rule library on random compositions of the motifs it recognises.

Each graph chains SiLU, erf-GELU, LayerNorm and hard-swish motifs (in the forms exporters emit,
with commutative operands in either order) and plain ops. Then:

* every motif is recognised (commuted operands match), and only those;
* the rewritten graph computes the same outputs (reference executor);
* a second application changes nothing (idempotent), and the fusion plan is the same twice.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opfuse.ops import GraphBuilder
from opfuse.rules import apply_rules, form_groups, fusion_rules, recognition_rules

from rule_helpers import same_outputs

F32 = np.float32
SHAPE = (2, 3, 8)
MOTIFS = ("silu", "gelu", "layernorm", "hswish", "relu", "scale")
RECOGNISED = {"silu": "Silu", "gelu": "Gelu", "layernorm": "LayerNormalization", "hswish": "HardSwish"}


class _Motifs:
    def __init__(self, b: GraphBuilder, swap):
        self.b = b
        self.swap = swap      # callable -> bool: put commutative operands the other way round
        self.k = 0

    def c(self, value, shape=()):
        self.k += 1
        return self.b.const(f"c{self.k}", np.full(shape, value, F32))

    def comm(self, op, a, b):
        return self.b.op(op, *((b, a) if self.swap() else (a, b)))

    def silu(self, x):
        return self.comm("Mul", x, self.b.op("Sigmoid", x))

    def gelu(self, x):
        inner = self.b.op("Div", x, self.c(math.sqrt(2)))
        one_plus = self.comm("Add", self.b.op("Erf", inner), self.c(1.0))
        return self.comm("Mul", self.comm("Mul", x, one_plus), self.c(0.5))

    def layernorm(self, x):
        b = self.b
        mean = b.op("ReduceMean", x, axes=[-1])
        d = b.op("Sub", x, mean)
        var = b.op("ReduceMean", b.op("Pow", d, self.c(2.0)), axes=[-1])
        std = b.op("Sqrt", self.comm("Add", var, self.c(1e-5)))
        y = self.comm("Mul", b.op("Div", d, std), self.c(1.5, (8,)))
        return self.comm("Add", y, self.c(0.1, (8,)))

    def hswish(self, x):
        clip = self.b.op("Clip", self.comm("Add", x, self.c(3.0)), self.c(0.0), self.c(6.0))
        return self.b.op("Div", self.comm("Mul", x, clip), self.c(6.0))

    def relu(self, x):
        return self.b.op("Relu", x)

    def scale(self, x):
        return self.comm("Mul", x, self.c(0.7))


@st.composite
def motif_graphs(draw):
    seq = draw(st.lists(st.sampled_from(MOTIFS), min_size=1, max_size=5))
    b = GraphBuilder("motifs")
    m = _Motifs(b, lambda: draw(st.booleans()))
    x = b.input("x", SHAPE)
    for name in seq:
        x = getattr(m, name)(x)
    return b.build(x), seq


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=motif_graphs())
def test_recognition_is_complete_correct_and_idempotent(case):
    graph, seq = case
    original = graph.copy()
    first = apply_rules(graph, recognition_rules())
    graph.verify()
    made = sorted(n.op_type for n in graph.nodes if n.op_type in RECOGNISED.values())
    assert made == sorted(RECOGNISED[s] for s in seq if s in RECOGNISED)
    assert first.rewrites == len(made)
    same_outputs(original, graph, rtol=1e-4, atol=1e-4)
    text = str(graph)
    again = apply_rules(graph, recognition_rules())
    assert not again.modified and str(graph) == text
    plans = [form_groups(graph, fusion_rules())[0] for _ in range(2)]
    for p in plans:
        p.verify()
    assert [[n.name for n in g.nodes] for g in plans[0].groups] == [[n.name for n in g.nodes] for g in plans[1].groups]
