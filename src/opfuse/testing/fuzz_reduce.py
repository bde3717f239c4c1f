"""Shrinking a failing fuzz case to a minimal graph (delta debugging on the graph itself).

Hypothesis finds the failing case; shrinking it through Hypothesis's choices works poorly here,
because the inputs are drawn from a seed and a smaller graph reads different values. So the
graph is cut down directly, each step kept only while the case still fails the same way (the
same ``signature``: status, stage, and for a crash the exception type):

1. *one output*: keep only the outputs one at a time, dropping the nodes no output needs;
2. *cut*: make an intermediate value a graph input, fed with the value the reference computed
   for it, and drop what only led to it (deepest cut first: the most nodes go at once);
3. *bypass*: replace a node's output by one of its inputs of the same type (a Relu in the way).

Rounds repeat until none of them removes anything. The inputs that remain keep their values.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from opfuse.ir.graph import Graph, Node
from opfuse.testing.fuzz_check import Verdict

Feeds = dict[str, np.ndarray]
Check = Callable[[Graph, Feeds], Verdict]


def signature(v: Verdict) -> tuple[str, str, str]:
    kind = v.detail.split(":")[0] if v.status == "crash" else ""
    return v.status, v.stage, kind



def _reference_values(g: Graph, feeds: Feeds) -> dict[str, np.ndarray]:
    """Every value the reference computes (up to the first node that raises)."""
    from opfuse.ops.registry import run_node
    env: dict[str, np.ndarray] = dict(feeds)
    env.update({v.name: v.const for v in g.constants if v.const is not None})
    with np.errstate(all="ignore"):
        for node in g.nodes:
            try:
                results = run_node(node, [env[v.name] if v is not None else None for v in node.inputs])
            except Exception:  # noqa: BLE001  # values past a failing node are unknown
                break
            for v, r in zip(node.outputs, results, strict=False):
                env[v.name] = np.asarray(r).astype(v.dtype, copy=False)
    return env


def _with_outputs(g: Graph, feeds: Feeds, names: list[str]) -> tuple[Graph, Feeds]:
    h = g.copy()
    h.outputs = [h.values[n] for n in names]
    h.prune()
    return h, {k: a for k, a in feeds.items() if k in {v.name for v in h.inputs}}


def _cut(g: Graph, feeds: Feeds, name: str, value: np.ndarray) -> tuple[Graph, Feeds]:
    """``name`` becomes a graph input fed with ``value``; what only led to it goes."""
    h = g.copy()
    old = h.values[name]
    node = old.producer
    assert node is not None
    fresh = h.add_input(h.unique_name(f"{name}_cut"), old.shape, old.dtype)
    h.replace_all_uses(old, fresh)
    if not any(v.uses or v in h.outputs for v in node.outputs):
        h.remove_node(node)
    h.prune()
    kept = {v.name for v in h.inputs}
    out = {k: a for k, a in feeds.items() if k in kept}
    out[fresh.name] = np.asarray(value, dtype=old.dtype).reshape(old.shape)
    return h, out


def _bypass(g: Graph, feeds: Feeds, node_name: str, index: int) -> tuple[Graph, Feeds] | None:
    h = g.copy()
    node: Node = h.node(node_name)
    if len(node.outputs) != 1:
        return None
    out, src = node.outputs[0], node.inputs[index]
    if src is None or src.type != out.type:
        return None
    h.replace_all_uses(out, src)
    h.prune()
    return h, {k: a for k, a in feeds.items() if k in {v.name for v in h.inputs}}


def minimize(graph: Graph, feeds: Feeds, verdict: Verdict, check: Check,
             max_checks: int = 200) -> tuple[Graph, Feeds, Verdict]:
    """The smallest graph (and its inputs) this reducer finds that fails like ``verdict``."""
    want = signature(verdict)
    budget = [max_checks]

    def fails(candidate: tuple[Graph, Feeds] | None) -> Verdict | None:
        if candidate is None or not candidate[0].nodes or budget[0] <= 0:
            return None
        budget[0] -= 1
        try:
            candidate[0].verify()
            v = check(*candidate)
        except Exception:  # noqa: BLE001  # not a valid (or exportable) graph: not a candidate
            return None
        return v if signature(v) == want else None

    best = (graph, feeds)
    changed = True
    while changed and budget[0] > 0:
        changed = False
        g, f = best
        if len(g.outputs) > 1:  # 1. one output
            for v in g.outputs:
                cand = _with_outputs(g, f, [v.name])
                got = fails(cand)
                if got is not None:
                    best, verdict, changed = cand, got, True
                    break
        g, f = best
        values = _reference_values(g, f)  # 2. cut, deepest first
        outputs = {v.name for v in g.outputs}
        for node in reversed(g.nodes):
            for v in node.outputs:
                if v.name in outputs or v.name not in values or not v.uses:
                    continue
                cand = _cut(g, f, v.name, values[v.name])
                if len(cand[0].nodes) >= len(g.nodes):
                    continue
                got = fails(cand)
                if got is not None:
                    best, verdict, changed = cand, got, True
                    break
            if changed:
                break
        if changed:
            continue
        g, f = best
        for node in list(g.nodes):  # 3. bypass
            for i in range(len(node.inputs)):
                bypassed = _bypass(g, f, node.name, i)
                got = fails(bypassed)
                if bypassed is not None and got is not None:
                    best, verdict, changed = bypassed, got, True
                    break
            if changed:
                break
    return best[0], best[1], verdict


__all__ = ["minimize", "signature"]
