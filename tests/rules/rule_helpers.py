"""Helpers for rule tests: compare a rewritten graph's numerics with the original's."""
from __future__ import annotations

import numpy as np

from opfuse.ops import GraphBuilder
from opfuse.rules import Replacement
from opfuse.runtime.reference import random_inputs, run


def same_outputs(before, after, seed: int = 0, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """The rewritten graph computes what the original computed (reference executor as oracle)."""
    feeds = random_inputs(before, seed)
    want = run(before, feeds)
    got = run(after, feeds)
    assert set(want) == set(got)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=rtol, atol=atol, err_msg=k)


def full_range_feeds(g, seed: int):
    """Seeded inputs for ``g``: integers over their type's whole range, floats standard normal."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for v in g.inputs:
        if v.dtype.kind in "iu":
            info = np.iinfo(v.dtype)
            feeds[v.name] = rng.integers(info.min, info.max + 1, v.shape).astype(v.dtype)
        else:
            feeds[v.name] = rng.standard_normal(v.shape).astype(v.dtype)
    return feeds


# A float32 [2, 4] value: 32 bytes (the resolve tests' graphs).
RESOLVE_SHAPE = (2, 4)


def chain(*ops: str, name: str = "c"):
    """x -> ops[0] -> ops[1] -> ... (the last is the output); node i is named f"{name}{i}"."""
    b = GraphBuilder("chain")
    v = b.input("x", RESOLVE_SHAPE)
    for i, op in enumerate(ops):
        v = b.op(op, v, name=f"{name}{i}")
    return b.build(v)


def to_op(op: str, name: str | None = None):
    """An action replacing the match by one ``op`` reading the match's first input."""
    return lambda m: Replacement(op, [m.nodes[0].inputs[0]], name=name)


def summary(out):
    """Each decision of ``apply_rules``'s result as (rule, verdict, nodes, kind, reason, score)."""
    return [(d.rule, d.verdict, d.nodes, d.kind, d.reason, d.score) for d in out.decisions]
