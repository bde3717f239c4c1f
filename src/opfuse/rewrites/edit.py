"""Graph-editing helpers shared by the rewrites, and provenance bookkeeping.

Rewrites keep the graph's *output names*: callers look outputs up by name, so when a
rewrite replaces a graph output the new value takes over the old name.

``Provenance`` remembers, for every node of the rewritten graph, which nodes of the original
graph it stands for (a Conv that absorbed a BatchNorm stands for both); the fusion report
counts "kernels before" per fused group from it.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from opfuse.rules.decisions import Refusal, refuse
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.registry import infer_node


class Provenance:
    """Node name in the rewritten graph -> names of the original nodes it stands for."""

    def __init__(self, graph: Graph | None = None):
        self.origin: dict[str, list[str]] = {}
        if graph is not None:
            for n in graph.nodes:
                self.origin[n.name] = [n.name]

    def of(self, name: str) -> list[str]:
        return list(self.origin.get(name, []))

    def absorb(self, into: Node | str, sources: Iterable[Node | str]) -> None:
        """``into`` now also stands for every source (sources are forgotten)."""
        key = into if isinstance(into, str) else into.name
        merged = list(self.origin.get(key, []))
        for s in sources:
            sk = s if isinstance(s, str) else s.name
            if sk == key:
                continue
            for o in self.origin.pop(sk, []):
                if o not in merged:
                    merged.append(o)
        self.origin[key] = merged

    def drop(self, node: Node | str) -> None:
        self.origin.pop(node if isinstance(node, str) else node.name, None)

    def credit(self, node: Node, readers: list[Node]) -> None:
        """``node`` is gone (folded into a constant, or a no-op bypassed): the first of its former
        ``readers`` still in the graph stands for it, so the report credits its kernel to the
        group that absorbed it; with no reader left it is dropped (dead code)."""
        for r in readers:
            if r.name in self.origin and r is not node:
                self.absorb(r, [node])
                return
        self.drop(node)


# Reading the graph ---------------------------------------------------------------------------

def sole_consumer(v: Value, graph: Graph) -> Node | None:
    """The only node reading ``v`` (``v`` read once and not a graph output), else None."""
    if len(v.uses) != 1 or v in graph.outputs:
        return None
    return v.uses[0][0]


def shared_const(v: Value, owner: Node) -> Refusal | None:
    """Refuse when constant ``v`` is read by a node other than ``owner`` (folding would change it)."""
    for user, _ in v.uses:
        if user is not owner:
            return refuse(f"weight '{v.name}' is shared with node '{user.name}'")
    return None


# Building -------------------------------------------------------------------------------------

def add_node(graph: Graph, op_type: str, inputs, *, name: str, attrs: dict | None = None,
             num_outputs: int = 1) -> Node:
    """Append a node and infer its output types (callers re-toposort after the rewrite)."""
    node = graph.add_node(op_type, list(inputs), num_outputs=num_outputs, attrs=attrs or {}, name=name)
    for v, t in zip(node.outputs, infer_node(node), strict=True):
        v.type = t
    return node


def add_const(graph: Graph, name: str, data: np.ndarray) -> Value:
    return graph.add_const(name, np.ascontiguousarray(data))


def rename(graph: Graph, value: Value, name: str) -> None:
    """Give ``value`` a name that is free in the graph."""
    if value.name == name:
        return
    del graph.values[value.name]
    value.name = name
    graph.values[name] = value


def merged_name(names: list[str]) -> str:
    """A name for one op standing for several siblings: their distinct heads and common tail
    (``query_matmul, key_matmul`` -> ``query_key_matmul``)."""
    parts = [n.split("_") for n in names]
    tail: list[str] = []
    for tokens in zip(*[p[::-1] for p in parts], strict=False):  # the common suffix
        if len(set(tokens)) != 1:
            break
        tail.insert(0, tokens[0])
    heads = ["_".join(p[:len(p) - len(tail)]) for p in parts]
    if not all(heads):
        return f"{names[0]}_merged"
    return "_".join(heads + tail)


def rename_node(graph: Graph, node: Node, name: str) -> bool:
    """Give ``node`` the name ``name`` when no other node has it (keeps group names readable)."""
    if node.name == name:
        return True
    if graph.has_node_name(name):
        return False
    graph.rename_node(node, name)
    return True


def can_substitute(graph: Graph, old: Value, new: Value) -> str | None:
    """Why ``old`` cannot be replaced by ``new`` without changing the graph's output names."""
    if old is new:
        return None
    if old in graph.outputs:
        if new in graph.outputs:
            return f"'{old.name}' and '{new.name}' are both graph outputs"
        if new in graph.inputs:
            return f"graph output '{old.name}' would become graph input '{new.name}'"
        if new.is_const and new.producer is None and len(new.uses) > 0:
            return f"graph output '{old.name}' would become shared constant '{new.name}'"
    return None


def substitute(graph: Graph, old: Value, new: Value) -> None:
    """Redirect every use of ``old`` to ``new``; remove ``old``'s producer when it is dead.

    When ``old`` was a graph output, ``new`` takes over its name (check ``can_substitute``).
    """
    substitute_all(graph, [(old, new)])


def substitute_all(graph: Graph, pairs: Sequence[tuple[Value, Value]]) -> None:
    """``substitute`` for several values at once (every output of a node): each graph output among the
    ``old`` values gives its name to its ``new`` once the producers are gone. One at a time, the first
    output of a two-output node kept its name taken while the node still had the second (a Split merged
    with its twin by CSE returned its first output as 'split_out0' instead of 'split_1_out0')."""
    pairs = [(old, new) for old, new in pairs if old is not new]
    named = [(old.name, new) for old, new in pairs if old in graph.outputs]
    for old, new in pairs:
        graph.replace_all_uses(old, new)
    for old, _ in pairs:
        producer = old.producer  # None once an earlier pair removed it (remove_node clears it)
        if producer is not None and all(not v.uses and v not in graph.outputs for v in producer.outputs):
            graph.remove_node(producer)
        elif producer is None and not old.uses and old.name in graph.values and old not in graph.inputs:
            del graph.values[old.name]
    for name, new in named:
        if name not in graph.values:
            rename(graph, new, name)


def remove_dead(graph: Graph, nodes: Iterable[Node]) -> None:
    """Remove the given nodes (in reverse order) whose outputs nobody reads."""
    for n in sorted(nodes, key=lambda x: -graph.nodes.index(x) if x in graph.nodes else 0):
        if n in graph.nodes and all(not v.uses and v not in graph.outputs for v in n.outputs):
            graph.remove_node(n)
