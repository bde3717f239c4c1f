"""The post-dominator tree of a graph's nodes (TVM's FuseOps grows groups along it).

Node ``d`` post-dominates ``n`` when every path from ``n`` to the graph's exit passes through
``d``. A virtual exit node follows every node with a graph output or an unread output. When
``n`` fuses into its immediate post-dominator ``d`` together with every node on the paths
between them, all of ``n``'s readers are inside the group, so ``n``'s output never has to be
written to memory: that is why vertical fusion follows this tree.

Computed in one sweep in reverse topological order: ``ipdom(n)`` is the nearest common
ancestor, in the tree built so far, of ``n``'s successors (Cooper, Harvey and Kennedy's
intersection walk, on depths).
"""
from __future__ import annotations

from opfuse.ir.graph import Graph, Node

EXIT = None  # the virtual exit node


def successors(node: Node, graph_outputs: set[int]) -> list[Node | None]:
    succ: dict[int, Node | None] = {}
    for v in node.outputs:
        if id(v) in graph_outputs or not v.uses:
            succ[0] = EXIT
        for u, _ in v.uses:
            succ.setdefault(id(u), u)
    return list(succ.values())


def immediate_post_dominators(graph: Graph) -> dict[int, Node | None]:
    """``id(node) -> ipdom node`` (``None`` when only the exit post-dominates it)."""
    outs = {id(v) for v in graph.outputs}
    ipdom: dict[int, Node | None] = {}
    depth: dict[int, int] = {}

    def d(n: Node | None) -> int:
        return 0 if n is None else depth[id(n)]

    def up(n: Node | None) -> Node | None:
        return ipdom[id(n)]

    for node in reversed(graph.nodes):
        succ = successors(node, outs)
        cur = succ[0]
        for s in succ[1:]:
            a, b = cur, s
            while a is not b:
                if d(a) >= d(b):
                    a = up(a)
                else:
                    b = up(b)
            cur = a
        ipdom[id(node)] = cur
        depth[id(node)] = d(cur) + 1
    return ipdom


def path_nodes(start: Node, stop: Node, limit: int) -> list[Node] | None:
    """Every node on a path from ``start`` to its post-dominator ``stop`` (``stop`` included,
    ``start`` excluded); ``None`` when there are more than ``limit`` of them."""
    seen: dict[int, Node] = {}
    todo = [start]
    while todo:
        n = todo.pop()
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) in seen:
                    continue
                seen[id(u)] = u
                if len(seen) > limit:
                    return None
                if u is not stop:
                    todo.append(u)
    return list(seen.values())
