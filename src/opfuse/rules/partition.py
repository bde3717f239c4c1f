"""``Partition``: the mutable grouping the fusion rules build, and its ``FusionPlan``.

Groups are sets of nodes with a kernel shape (``GroupShape``). ``union`` merges groups after
the caller has checked the merge; ``creates_cycle`` is the dependency check every merge needs:
contracting groups ``S`` into one creates a cycle exactly when a path leaves ``S`` and comes
back through another group.

The partition keeps, across merges, what these questions need, so that each costs
O(groups involved + groups placed between them) rather than O(graph):

* the group graph (successor and predecessor sets), updated by contraction on ``union``;
* a topological *rank* of the groups: every group edge goes from a lower to a higher rank,
  so a path leaving ``S`` can only come back through groups ranked below ``S``'s last group
  and the cycle search stops there. On ``union`` only the window of ranks spanned by ``S``
  is reordered: the groups there that do not descend from ``S``, then the merged group, then
  those that do (a group that does not descend from ``S`` has no predecessor that does);
* ``groups_in_order`` (the plan order: Kahn's algorithm taking the ready group with the
  earliest first node) is, when every group edge goes from an earlier first node to a later
  one, simply the groups sorted by first node (the smallest ready key is then the smallest
  remaining key); the partition counts the edges that break this ("inversions") and runs
  Kahn's algorithm only while there are some.
"""
from __future__ import annotations

import heapq

from opfuse.rules.decisions import Refusal
from opfuse.rules.kernel_shape import GroupShape, boundary_outputs, classify, output_ids
from opfuse.errors import ModelError
from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan


class Partition:
    def __init__(self, graph: Graph, groups: list[tuple[list[Node], GroupShape, dict]] | None = None):
        self.graph = graph
        self.order = {id(n): i for i, n in enumerate(graph.nodes)}
        self.outputs = output_ids(graph)
        self.group_of: dict[int, int] = {}
        self.members: dict[int, list[Node]] = {}
        self.shape: dict[int, GroupShape] = {}
        self.attrs: dict[int, dict] = {}
        self._succ: dict[int, set[int]] = {}
        self._pred: dict[int, set[int]] = {}
        self._inversions = 0  # group edges from a later first node to an earlier one
        self._next = 0
        self._position: dict[int, int] | None = None
        if groups is None:
            groups = [([n], GroupShape("single", n), {}) for n in graph.nodes]
        for nodes, shape, attrs in groups:
            self._add(nodes, shape, dict(attrs))
        for g in self.members:
            self._succ[g], self._pred[g] = set(), set()
        for g, nodes in self.members.items():
            for n in nodes:
                for v in n.outputs:
                    for u, _ in v.uses:
                        h = self.group_of.get(id(u))
                        if h is not None and h != g and h not in self._succ[g]:
                            self._link(g, h)
        # Ranks start from the plan order (a topological order; raises on a cyclic partition).
        self._slots: list[int | None] = list(self.groups_in_order())
        self._rank = {g: i for i, g in enumerate(self._slots)}

    @classmethod
    def from_plan(cls, plan: FusionPlan) -> "Partition":
        return cls(plan.graph, [(list(g.nodes), GroupShape(g.kind, g.anchor, {}), dict(g.attrs))
                                for g in plan.groups])

    def _add(self, nodes: list[Node], shape: GroupShape, attrs: dict) -> int:
        gid = self._next
        self._next += 1
        self.members[gid] = sorted(nodes, key=lambda n: self.order[id(n)])
        for n in nodes:
            self.group_of[id(n)] = gid
        self.shape[gid] = shape
        self.attrs[gid] = attrs
        self._position = None
        return gid

    def _first(self, gid: int) -> int:
        return self.order[id(self.members[gid][0])]

    def _link(self, g: int, h: int) -> None:
        self._succ[g].add(h)
        self._pred[h].add(g)
        if self._first(g) > self._first(h):
            self._inversions += 1

    # Queries -------------------------------------------------------------------------
    def gid(self, node: Node) -> int:
        return self.group_of[id(node)]

    def nodes_of(self, gids) -> list[Node]:
        return sorted((n for g in gids for n in self.members[g]), key=lambda n: self.order[id(n)])

    def kind(self, gid: int) -> str:
        return self.shape[gid].kind

    def successors(self, gid: int) -> set[int]:
        return set(self._succ[gid])

    def predecessors(self, gid: int) -> set[int]:
        return set(self._pred[gid])

    def groups_in_order(self) -> list[int]:
        """Group ids in a topological order of the group graph (ties: earliest node first)."""
        if self._inversions == 0:
            return sorted(self.members, key=self._first)
        indeg = {g: len(self._pred[g]) for g in self.members}
        ready = [(self._first(g), g) for g, k in indeg.items() if k == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            _, g = heapq.heappop(ready)
            out.append(g)
            for s in self._succ[g]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    heapq.heappush(ready, (self._first(s), s))
        if len(out) != len(self.members):
            raise ModelError("fusion partition has a cycle between groups")
        return out

    def position(self, gid: int) -> int:
        """The index of ``gid`` in ``groups_in_order()``."""
        if self._position is None:
            self._position = {g: i for i, g in enumerate(self.groups_in_order())}
        return self._position[gid]

    def order_key(self, gid: int) -> int:
        """A sort key giving the groups the order of ``groups_in_order()`` (without computing
        that order while no edge is inverted: the first node's position then gives it)."""
        return self._first(gid) if self._inversions == 0 else self.position(gid)

    def _descendants_in_window(self, S: set[int]) -> tuple[bool, set[int]]:
        """(a path leaves ``S`` and comes back?, the groups outside ``S`` ranked below its last
        group that descend from it)."""
        last = max(self._rank[g] for g in S)
        down: set[int] = set()
        todo = [s for g in S for s in self._succ[g] if s not in S and self._rank[s] < last]
        down.update(todo)
        while todo:
            g = todo.pop()
            for s in self._succ[g]:
                if s in S:
                    return True, down
                if s not in down and self._rank[s] < last:
                    down.add(s)
                    todo.append(s)
        return False, down

    def creates_cycle(self, gids) -> bool:
        """Would contracting ``gids`` into one group create a cycle?"""
        return self._descendants_in_window(set(gids))[0]

    # Mutation ---------------------------------------------------------------------------
    def union(self, gids, shape: GroupShape, attrs: dict | None = None) -> int:
        """Merge ``gids`` into one group (the caller has checked the merge); returns its id."""
        S = set(gids)
        cycle, down = self._descendants_in_window(S)
        if cycle:
            raise ModelError("fusion partition: merging these groups would create a cycle")
        nodes = self.nodes_of(S)
        succ = set().union(*(self._succ[g] for g in S)) - S
        pred = set().union(*(self._pred[g] for g in S)) - S
        for g in S:  # drop every edge touching S, each counted once (an edge inside S from its tail)
            for h in self._succ[g]:
                if self._first(g) > self._first(h):
                    self._inversions -= 1
                if h not in S:
                    self._pred[h].discard(g)
            for h in self._pred[g]:
                if h not in S:
                    if self._first(h) > self._first(g):
                        self._inversions -= 1
                    self._succ[h].discard(g)
        for g in S:
            del self._succ[g], self._pred[g]
        lo = min(self._rank[g] for g in S)
        hi = max(self._rank[g] for g in S)
        merged_attrs: dict = {}
        origin: list[str] = []
        for g in sorted(S, key=lambda g: self.order[id(self.members[g][0])]):
            del self.members[g]
            del self.shape[g]
            del self._rank[g]
            old = self.attrs.pop(g)
            origin += old.pop("origin", [])
            merged_attrs.update(old)
        for key in ("members", "inputs", "outputs", "member_kinds", "domain", "shared_input"):
            merged_attrs.pop(key, None)
        if origin:
            merged_attrs["origin"] = origin
        merged_attrs.update(attrs or {})
        gid = self._add(nodes, shape, merged_attrs)
        self._succ[gid], self._pred[gid] = set(), set()
        for h in sorted(succ):
            self._link(gid, h)
        for h in sorted(pred):
            self._link(h, gid)
        window = [x for x in self._slots[lo:hi + 1] if x is not None and x not in S]
        seq: list[int | None] = [x for x in window if x not in down]
        seq += [gid] + [x for x in window if x in down]
        seq += [None] * (hi - lo + 1 - len(seq))
        self._slots[lo:hi + 1] = seq
        for k, x in enumerate(seq, lo):
            if x is not None:
                self._rank[x] = k
        return gid

    def classify(self, gids) -> GroupShape | Refusal:
        return classify(self.nodes_of(gids), self.graph, self.outputs)

    # Result ----------------------------------------------------------------------------
    def group(self, gid: int, origin: dict[str, list[str]] | None = None) -> FusionGroup:
        """Group ``gid`` as a ``FusionGroup`` (named after its anchor, boundary recorded)."""
        nodes = self.members[gid]
        shape = self.shape[gid]
        anchor = shape.anchor if shape.anchor is not None else nodes[0]
        attrs = {k: v for k, v in shape.attrs.items() if k != "qk"}
        attrs.update(self.attrs[gid])
        fg = FusionGroup(anchor.name, list(nodes), shape.kind, anchor, attrs)
        fg.attrs["inputs"] = [v.name for v in fg.inputs()]
        fg.attrs["outputs"] = [v.name for v in boundary_outputs(nodes, self.graph, self.outputs)]
        if origin is not None:
            fg.attrs["origin"] = [o for n in nodes for o in origin.get(n.name, [])]
        return fg

    def to_plan(self, origin: dict[str, list[str]] | None = None) -> FusionPlan:
        return FusionPlan(self.graph, [self.group(gid, origin) for gid in self.groups_in_order()])
