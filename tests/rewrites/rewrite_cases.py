"""Helpers for the rewrite tests: run the rewrites on a copy and compare with the reference."""
from __future__ import annotations

import dataclasses

import numpy as np

from opfuse.rules.options import FusionOptions
from opfuse.rewrites import rewrite
from opfuse.rules import apply_rules
from opfuse.runtime.reference import random_inputs, run

RTOL, ATOL = 1e-4, 1e-5


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def randn(shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (rng(seed).standard_normal(shape) * scale).astype(np.float32)


def rewritten(graph, **options):
    """(original, rewritten copy, RewriteResult); the rewritten graph is verified."""
    g = graph.copy()
    result = rewrite(g, FusionOptions(**options))
    g.verify()
    return graph, g, result


def assert_same_outputs(g0, g1, seeds=(0, 1)) -> None:
    for seed in seeds:
        feeds = random_inputs(g0, seed)
        a, b = run(g0, feeds), run(g1, feeds)
        assert set(a) == set(b), "graph output names changed"
        for k in a:
            np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=ATOL, err_msg=k)


def ops(graph) -> list[str]:
    return [n.op_type for n in graph.nodes]


def applied(result, rule: str) -> int:
    return sum(1 for d in result.decisions if d.rule == rule and d.taken)


def refusals(result, rule: str) -> list[str]:
    return [d.reason for d in result.decisions if d.rule == rule and not d.taken]


def apply_rule(graph, rule, pattern_fn):
    """``rule`` with its pattern made now (``pattern_fn()``), applied to a copy of ``graph``: (copy, decisions)."""
    g = graph.copy()
    out = apply_rules(g, [dataclasses.replace(rule, pattern=pattern_fn())])
    g.verify()
    return g, out.decisions


def recognised(graph, rule, pattern_fn, op: str):
    """``graph`` rewritten by ``rule`` into the one op ``op``, with the same outputs; the rewritten copy."""
    g, decisions = apply_rule(graph, rule, pattern_fn)
    assert ops(g) == [op], (ops(g), [(d.verdict, d.reason) for d in decisions])
    assert [d.verdict for d in decisions] == ["rewritten"]
    assert_same_outputs(graph, g)
    return g
