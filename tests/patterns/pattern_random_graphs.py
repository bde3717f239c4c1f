"""Random small DAGs (hypothesis strategies) and the patterns the property tests exercise."""
# Not opfuse.testing.graphs: a replayable recipe (rebuilt with swapped commutative operands) small enough
# to brute-force.
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from opfuse.ir.graph import Graph, TensorType
from opfuse.patterns import Const, Op, Var, many, par

UNARY = ("Relu", "Sigmoid", "Exp")
BINARY = ("Add", "Mul", "Sub", "Div")      # Add and Mul are commutative
SHAPE = (2, 3)
N_SOURCES = 3                              # x0, x1 and a constant c


@st.composite
def dag_specs(draw, max_nodes: int = 6):
    """A recipe: per node (op, input indices into sources + earlier outputs); output flags."""
    n = draw(st.integers(2, max_nodes))
    ops = draw(st.lists(st.sampled_from(UNARY + BINARY), min_size=n, max_size=n))
    nodes = []
    for i, op in enumerate(ops):
        k = 1 if op in UNARY else 2
        avail = N_SOURCES + i
        # Prefer recent values so chains and shared inputs are common.
        pick = st.integers(max(0, avail - 4), avail - 1) | st.integers(0, avail - 1)
        nodes.append((op, tuple(draw(pick) for _ in range(k))))
    extra_outputs = draw(st.lists(st.booleans(), min_size=n - 1, max_size=n - 1))
    return nodes, extra_outputs


def build(spec, *, swap_commutative: bool = False) -> Graph:
    nodes, extra_outputs = spec
    g = Graph("random")
    t = TensorType(SHAPE, np.float32)
    vals = [g.add_input("x0", SHAPE), g.add_input("x1", SHAPE),
            g.add_const("c", np.full(SHAPE, 0.5, np.float32))]
    for i, (op, idx) in enumerate(nodes):
        ins = [vals[j] for j in idx]
        if swap_commutative and op in ("Add", "Mul"):
            ins = ins[::-1]
        vals.append(g.add_node(op, ins, name=f"n{i}", output_types=[t]).outputs[0])
    outs = [vals[-1]] + [vals[N_SOURCES + i] for i, flag in enumerate(extra_outputs) if flag]
    g.outputs = outs
    return g


def property_patterns() -> dict:
    """One pattern per language feature (fresh objects on every call)."""
    x = Var("x")
    y = Var("y")
    return {
        "sequence": Op("Relu") >> Op("Add"),
        "elementwise_chain": (Op("Add", "Mul") | Op(tag="activation")).plus(),
        "silu_shared_var": Op("Mul")(x, Op("Sigmoid")(x)),
        "slot_noncommutative": Op("Sub")(Op("Relu"), Var()),
        "slots_commutative": Op("Mul")(Op("Exp"), Op("Relu")),
        "par_symmetric": y >> par(Op("Exp"), Op("Exp")),
        "par_distinct": Var() >> par(Op("Relu"), Op("Sigmoid")),
        "fan_in": many(Op(tag="activation")) >> Op("Add"),
        "fan_out_sink": Op("Mul") >> many(Op("Relu", "Exp", "Sigmoid"), 2),
        "optional": Op("Relu") >> Op("Add", "Mul").opt() >> Op("Sigmoid"),
        "alternation": (Op("Relu") >> Op("Add")) | (Op("Exp") >> Op("Mul")),
        "keep": Op("Exp").keep() >> Op("Add"),
        "constant_input": Op("Add")(Var(), Const()),
        "chain_of_pairs": (Op("Relu") >> Op("Add")).plus(),
        "same_var_twice": (lambda v: Op("Add")(v, v))(Var()),
        "star": Op("Exp") >> Op(tag="activation").star(),
        "chain_body_with_var": Op("Mul")(Var(), Op("Exp")).plus(),
        "entry_slot": Op("Relu") >> Op("Sub").at(1) >> Op("Div").at(0),
        "chain_entry_slot": Op("Exp") >> Op("Sub", "Div").at(1).plus(),
        "fan_entry_slot": many(Op(tag="activation")) >> Op("Sub").at(0),
        "fan_shared_input": (lambda v: v >> many(Op("Sub").at(1), 2))(Var()),
        "bounded_repeat": Op(tag="activation").repeat(2, 3),
    }
