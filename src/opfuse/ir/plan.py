"""FusionGroup and FusionPlan: a partition of a graph's nodes into kernels.

A ``FusionGroup`` is what becomes one C kernel: an ordered list of nodes (topological
order inside the group), its boundary inputs (values produced outside the group, graph
inputs and constants included) and boundary outputs (values read outside the group or
graph outputs). Values produced and consumed only inside the group are *internal*: they
never touch main memory, which is the whole point of fusion.

A ``FusionPlan`` is an ordered list of groups covering every node exactly once, in an
order that is a topological order of the group graph. ``plan.verify()`` checks this.

``FusionPlan.unfused(graph)`` is the baseline: one group per node.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.errors import ModelError
from opfuse.ir.graph import Graph, Node, Value


@dataclass
class FusionGroup:
    name: str
    nodes: list[Node]
    kind: str = "single"  # e.g. single, elementwise, conv_epilogue, reduction, horizontal, attention
    anchor: Node | None = None  # the op the kernel is built around (Conv, MatMul, Softmax, ...)
    attrs: dict = field(default_factory=dict)  # kind-specific facts (e.g. concat aliasing)

    def node_ids(self) -> set[int]:
        return {id(n) for n in self.nodes}

    @property
    def op_types(self) -> list[str]:
        return [n.op_type for n in self.nodes]

    def inputs(self) -> list[Value]:
        """Boundary inputs in first-use order (constants included)."""
        inside = {id(v) for n in self.nodes for v in n.outputs}
        seen: dict[int, Value] = {}
        for n in self.nodes:
            for v in n.input_values():
                if id(v) not in inside:
                    seen.setdefault(id(v), v)
        return list(seen.values())

    def outputs(self, graph: Graph) -> list[Value]:
        """Values produced here that are read outside the group or are graph outputs."""
        ids = self.node_ids()
        graph_outs = {id(v) for v in graph.outputs}
        outs = []
        for n in self.nodes:
            for v in n.outputs:
                if id(v) in graph_outs or any(id(u) not in ids for u, _ in v.uses):
                    outs.append(v)
        return outs

    def internal_values(self, graph: Graph) -> list[Value]:
        outs = {id(v) for v in self.outputs(graph)}
        return [v for n in self.nodes for v in n.outputs if id(v) not in outs]

    def __repr__(self) -> str:
        return f"FusionGroup({self.name!r}, {self.kind}, {'+'.join(self.op_types)})"


class FusionPlan:
    def __init__(self, graph: Graph, groups: list[FusionGroup]):
        self.graph = graph
        self.groups = groups
        self._index: dict[int, FusionGroup] = {}
        self.reindex()

    @classmethod
    def unfused(cls, graph: Graph) -> "FusionPlan":
        return cls(graph, [FusionGroup(n.name, [n], "single", n) for n in graph.nodes])

    def reindex(self) -> None:
        self._index = {id(n): g for g in self.groups for n in g.nodes}

    def group_of(self, node: Node) -> FusionGroup:
        return self._index[id(node)]

    @property
    def num_kernels(self) -> int:
        """Groups that run code: zero-copy groups (views, elided concats) move no data."""
        return sum(1 for g in self.groups if not g.attrs.get("zero_copy"))

    def group_edges(self) -> list[tuple[FusionGroup, FusionGroup, Value]]:
        """(producer group, consumer group, value) for every value crossing a group boundary."""
        edges = []
        for g in self.groups:
            for v in g.inputs():
                if v.producer is not None:
                    edges.append((self.group_of(v.producer), g, v))
        return edges

    def verify(self) -> None:
        """Every node in exactly one group; group order is topological (so the group graph is acyclic)."""
        seen: dict[int, str] = {}
        for g in self.groups:
            if not g.nodes:
                raise ModelError(f"fusion group '{g.name}' is empty")
            for n in g.nodes:
                if id(n) in seen:
                    raise ModelError(f"node '{n.name}' is in groups '{seen[id(n)]}' and '{g.name}'")
                seen[id(n)] = g.name
        missing = [n.name for n in self.graph.nodes if id(n) not in seen]
        if missing:
            raise ModelError(f"nodes not in any fusion group: {missing[:5]}")
        if len(seen) != len(self.graph.nodes):
            raise ModelError("fusion plan holds nodes that are not in the graph")
        self.reindex()
        done: set[int] = set()
        for g in self.groups:
            ids = g.node_ids()
            local: set[int] = set()
            for n in g.nodes:
                for v in n.input_values():
                    p = v.producer
                    if p is None:
                        continue
                    if id(p) in ids:
                        if id(p) not in local:
                            raise ModelError(f"group '{g.name}': '{n.name}' precedes its producer '{p.name}'")
                    elif id(self.group_of(p)) not in done:
                        raise ModelError(f"group '{g.name}' reads '{v.name}' from group "
                                         f"'{self.group_of(p).name}', which is not before it (cycle)")
                local.add(id(n))
            done.add(id(g))

    def __repr__(self) -> str:
        return f"FusionPlan({len(self.groups)} groups over {len(self.graph.nodes)} nodes)"
