"""The greedy resolver: score order, tie-breaks, determinism, bookkeeping, plans, rewrites."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.errors import ModelError
from opfuse.ir.graph import TensorType
from opfuse.ops import GraphBuilder
from opfuse.patterns import Op
from opfuse.rules import Replacement, Rule, apply_rules

SHAPE = (2, 4)
T = TensorType(SHAPE, np.float32)


def relu_sig_tanh():
    b = GraphBuilder("rst")
    x = b.input("x", SHAPE)
    return b.build(b.op("Tanh", b.op("Sigmoid", b.op("Relu", x, name="r"), name="s"), name="t"))


def test_a_declining_rewrite_is_refused_with_its_reason():
    g = relu_sig_tanh()
    bad = Rule("to_cast", Op("Relu"), action=lambda m: Replacement("Cast", [m.nodes[0].inputs[0]], {"to": 7}))
    before = str(g)
    out = apply_rules(g, [bad])
    (d,) = out.decisions
    assert d.kind == "rewrite" and d.reason == "Cast infers int64[2,4], the match produced float32[2,4]"
    assert str(g) == before
    declines = Rule("declines", Op("Relu"), action=lambda m: "not today")
    (d,) = apply_rules(g, [declines]).decisions
    assert (d.kind, d.reason) == ("rewrite", "not today")


def test_rewrites_that_never_settle_raise():
    g = relu_sig_tanh()
    loop = Rule("relu_again", Op("Relu"), action=lambda m: Replacement("Relu", [m.nodes[0].inputs[0]]))
    with pytest.raises(ModelError, match="did not reach a fixed point"):
        apply_rules(g, [loop])


