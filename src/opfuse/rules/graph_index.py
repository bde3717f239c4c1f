"""Per-graph facts every legality query shares: positions, graph outputs, reachability.

A legality query looks at a handful of nodes; what it needs to know about the rest of the
graph is computed once per graph here, so that a query costs O(nodes involved), not O(graph):

* ``order``: each node's position in ``graph.nodes``, a topological order, so a path
  ``a -> ... -> b`` implies ``order[a] < order[b]``;
* ``outputs``: ids of the graph's output values (they leave every group);
* ``reaches(src, dst)``: is there a path (one edge or more) from a node of ``src`` to a node
  of ``dst``? With the descendant sets ``D(v) = U_{s in succ(v)} ({s} u D(s))``, built in one
  reverse sweep as bit masks over positions, the answer is
  ``(OR_{v in src} D(v)) & mask(dst) != 0``: O(|src| + |dst|) big-integer operations.
  The masks take up to ``n^2 / 8`` bytes, so above ``BITSET_MAX_NODES`` nodes a query walks
  instead, from ``src`` through nodes placed before the last node of ``dst`` (a node placed
  after it cannot lead back to it).

The index describes the graph as it was when built. ``covers(graph, nodes)`` is the cheap
check a cache makes before reuse (same graph, node list and output list, the queried nodes
where they were); a graph whose edges are edited in place needs a new index.
"""
from __future__ import annotations

from typing import Iterable

from opfuse.ir.graph import Graph, Node

# Reachability masks cost up to n^2 / 8 bytes (32 MiB at this size); larger graphs walk.
BITSET_MAX_NODES = 16_384


class GraphIndex:
    def __init__(self, graph: Graph, bitset_max_nodes: int = BITSET_MAX_NODES):
        self.graph = graph
        self.nodes = graph.nodes
        self.size = len(graph.nodes)
        self.order: dict[int, int] = {id(n): i for i, n in enumerate(graph.nodes)}
        self.output_list = graph.outputs
        self.outputs: frozenset[int] = frozenset(id(v) for v in graph.outputs)
        self.bitset_max_nodes = bitset_max_nodes
        self._desc: list[int] | None = None

    def covers(self, graph: Graph, nodes: Iterable[Node]) -> bool:
        """Is this index (still) the one of ``graph``, as far as ``nodes`` can tell?"""
        if graph is not self.graph or graph.nodes is not self.nodes or len(graph.nodes) != self.size \
                or graph.outputs is not self.output_list:
            return False
        for n in nodes:
            i = self.order.get(id(n))
            if i is None or self.nodes[i] is not n:
                return False
        return True

    def in_order(self, nodes: Iterable[Node]) -> list[Node]:
        """``nodes`` in graph (topological) order."""
        order = self.order
        return sorted(nodes, key=lambda n: order[id(n)])

    # Reachability --------------------------------------------------------------------------
    def _descendants(self) -> list[int]:
        if self._desc is None:
            order = self.order
            desc = [0] * self.size
            for i in range(self.size - 1, -1, -1):
                m = 0
                for v in self.nodes[i].outputs:
                    for u, _ in v.uses:
                        j = order.get(id(u))
                        if j is not None:  # a reader outside the graph leads nowhere in it
                            m |= desc[j] | (1 << j)
                desc[i] = m
            self._desc = desc
        return self._desc

    def reaches(self, src: Iterable[Node], dst: Iterable[Node]) -> bool:
        """Does a path lead from a node of ``src`` to a node of ``dst``?"""
        order = self.order
        dst = list(dst)
        if not dst:
            return False
        if self.size <= self.bitset_max_nodes:
            desc = self._descendants()
            down = 0
            for n in src:
                down |= desc[order[id(n)]]
            target = 0
            for n in dst:
                target |= 1 << order[id(n)]
            return bool(down & target)
        return self._walk(src, {id(n) for n in dst}, max(order[id(n)] for n in dst))

    def _walk(self, src: Iterable[Node], dst: set[int], limit: int) -> bool:
        order = self.order
        todo = list(src)
        seen: set[int] = set()
        while todo:
            n = todo.pop()
            for v in n.outputs:
                for u, _ in v.uses:
                    if id(u) in dst:
                        return True
                    if id(u) not in seen and order.get(id(u), limit) < limit:
                        seen.add(id(u))
                        todo.append(u)
        return False
