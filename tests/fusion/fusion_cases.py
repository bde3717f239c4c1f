"""Helpers for the fusion tests."""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, TensorType
from opfuse.passes import fuse
from opfuse.rules import FusionOptions
from opfuse.rules import form_groups, fusion_rules
from opfuse.runtime.reference import random_inputs, run

RTOL, ATOL = 1e-4, 1e-5


def edge_graph(edges: list[tuple[str, str, list[str]]], outputs: list[str], t: TensorType) -> Graph:
    """Nodes (name, op, input names) in this order, each of type ``t``; 'x' is the graph input, each node's
    output is its name."""
    g = Graph("t")
    vals = {"x": g.add_input("x", t.shape)}
    for name, op, ins in edges:
        vals[name] = g.add_node(op, [vals[i] for i in ins], name=name, output_types=[t]).outputs[0]
    g.outputs = [vals[o] for o in outputs]
    return g


def randn(shape, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def plan_of(graph, **options):
    """Group ``graph`` as it is (no rewrites): (plan, decisions)."""
    return form_groups(graph, fusion_rules(), FusionOptions(**options))


def kinds(plan) -> list[tuple[str, str]]:
    return [(g.kind, "+".join(g.op_types)) for g in plan.groups]


def group_with(plan, node_name: str):
    return next(g for g in plan.groups if any(n.name == node_name for n in g.nodes))


def refusals(decisions, rule: str) -> list[str]:
    return [f"{d.label}: {d.reason}" for d in decisions if d.rule == rule and not d.taken]


def kernels(plan) -> int:
    return sum(1 for g in plan.groups if not g.attrs.get("zero_copy"))


def assert_same_outputs(g0, g1, seed: int = 0) -> None:
    feeds = random_inputs(g0, seed)
    a, b = run(g0, feeds), run(g1, feeds)
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=RTOL, atol=ATOL, err_msg=k)


__all__ = ["fuse", "FusionOptions", "randn", "plan_of", "kinds", "group_with", "refusals", "kernels",
           "assert_same_outputs"]
