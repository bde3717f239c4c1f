"""``Match``: one occurrence of a pattern in a graph.

A match is identified by its node set (``key``); ``nodes`` lists them in graph order and
``captures`` maps each ``.named(...)`` name to what it bound: a ``Node`` for an op outside any
repetition, a ``Value`` for a variable, a list of nodes (or values) for names inside a
repetition and for named compound patterns.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, eq=False)
class Match:
    pattern: object                      # the Pattern it matches
    nodes: tuple                         # matched nodes, in graph (topological) order
    captures: dict = field(default_factory=dict)
    exposable: frozenset = frozenset()   # ids of nodes whose outputs may be read outside
    graph: object = field(default=None, repr=False)  # the graph it was found in
    _key: frozenset = field(init=False, repr=False)  # set by __post_init__ (see ``key``)

    def __post_init__(self):
        object.__setattr__(self, "_key", frozenset(id(n) for n in self.nodes))

    @property
    def key(self) -> frozenset:
        """The match's identity: the set of its nodes (ids)."""
        return self._key

    def __getitem__(self, name: str):
        try:
            return self.captures[name]
        except KeyError:
            raise KeyError(f"pattern {self.pattern!r} has no capture named '{name}'") from None

    def get(self, name: str, default=None):
        return self.captures.get(name, default)

    def __contains__(self, node) -> bool:
        return id(node) in self.key

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def inputs(self) -> list:
        """Values read by the match and produced outside it (constants included), first-use order."""
        inside = {id(v) for n in self.nodes for v in n.outputs}
        seen: dict[int, object] = {}
        for n in self.nodes:
            for v in n.input_values():
                if id(v) not in inside:
                    seen.setdefault(id(v), v)
        return list(seen.values())

    def outputs(self, graph=None) -> list:
        """Values produced by the match and read outside it (or graph outputs)."""
        graph = graph if graph is not None else self.graph
        key = self.key
        graph_outs = {id(v) for v in graph.outputs}
        return [v for n in self.nodes for v in n.outputs
                if id(v) in graph_outs or any(id(u) not in key for u, _ in v.uses)]

    def __repr__(self) -> str:
        return f"Match({'+'.join(n.op_type for n in self.nodes)} at {', '.join(self.node_names)})"
