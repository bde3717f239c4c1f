"""Dead-code elimination: remove nodes none of whose outputs reach a graph output.

A node is live when one of its outputs is a graph output or is read by a live node; walking
the nodes in reverse topological order decides this in one sweep. Constants nobody reads are
dropped too. Removed nodes lose their provenance: the report counts them as removed at
compile time.
"""
from __future__ import annotations

from opfuse.ir.graph import Graph
from opfuse.rewrites.context import RewriteContext

RULE = "dead_code_elimination"


def eliminate_dead_code(graph: Graph, rc: RewriteContext) -> bool:
    if rc.options.is_disabled(RULE):
        return False
    outputs = {id(v) for v in graph.outputs}
    live: set[int] = set()
    for node in reversed(graph.nodes):
        if any(id(v) in outputs or any(id(u) in live for u, _ in v.uses) for v in node.outputs):
            live.add(id(node))
    dead = [n for n in graph.nodes if id(n) not in live]
    for node in reversed(dead):
        # Uses from other dead nodes are gone already (reverse order), so this always succeeds.
        graph.remove_node(node)
        rc.provenance.drop(node)
    if dead:
        rc.log_applied(RULE, [n.name for n in dead], f"removed {len(dead)} dead node(s)")
    n_values = len(graph.values)
    graph.remove_unused_values()
    return bool(dead) or len(graph.values) != n_values
