"""Apply a rewrite rule's ``Replacement`` (one op) or ``Subgraph`` (several) to the graph.

The new op is inserted right after the match's last node (every value it reads is defined
before that point), takes over the match's escaping output (keeping its name, so graph outputs
keep theirs), and the matched nodes are removed. Its output type is inferred and must equal the
type of the value it replaces; otherwise the rewrite declines with a reason and the graph is not
touched.

A ``Subgraph``'s nodes (built off-graph, in topological order) go in the same place, in their
order: the matched nodes are removed first, so the new nodes and values keep the names the rule
gave them wherever the rest of the graph leaves them free; stand-ins are bound to the real values
they name, constants the new nodes read join the graph, and the output takes the replaced value's
name.
"""
from __future__ import annotations

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import infer_node
from opfuse.patterns.match import Match
from opfuse.rules.rule import Replacement, Subgraph


class AppliedRewrite:
    """The new node (a ``Subgraph``'s: the one producing the output), all new nodes, the nodes
    removed, and the nodes whose inputs or uses changed."""

    __slots__ = ("node", "removed", "touched", "position", "nodes")

    def __init__(self, node, removed, touched, position, nodes=None):
        self.node = node
        self.removed = removed
        self.touched = touched
        self.position = position  # the new node takes the place of the last node it replaces
        self.nodes = nodes if nodes is not None else [node]


def _target(graph, m: Match, replaces):
    escaping = m.outputs(graph)
    target = replaces if replaces is not None else (escaping[0] if len(escaping) == 1 else None)
    if target is None or len(escaping) != 1 or escaping[0] is not target:
        outs = ", ".join(f"'{v.name}'" for v in escaping) or "none"
        return f"a rewrite replaces exactly one escaping output; the match has {outs}"
    return target


def apply_replacement(graph, m: Match, rep: Replacement | Subgraph, pos: dict[int, int],
                      name: str) -> AppliedRewrite | str:
    """Replace ``m`` by ``rep``; returns the change, or a reason string when it cannot.

    ``pos`` orders the graph's nodes (the matcher's positions); the graph's node list stays
    topologically ordered.
    """
    if isinstance(rep, Subgraph):
        return apply_subgraph(graph, m, rep, pos)
    target = _target(graph, m, rep.replaces)
    if isinstance(target, str):
        return target
    # Build the node off-graph first, so a failed inference leaves the graph untouched.
    pending_consts = []
    inputs: list = []
    for i, x in enumerate(rep.inputs):
        if isinstance(x, np.ndarray):
            v = Value(f"{name}_c{i}", const=x)
            pending_consts.append(v)
            inputs.append(v)
        else:
            inputs.append(x)
    out = Value(f"{target.name}__new")
    node = Node(graph.unique_name(name, for_node=True), rep.op_type, inputs, [out], dict(rep.attrs))
    try:
        types = infer_node(node)
    except OpfuseError as e:
        return f"{rep.op_type} cannot replace the match: {e}"
    if types[0] != target.type:
        return f"{rep.op_type} infers {types[0]}, the match produced {target.type}"
    out.type = types[0]
    # Commit.
    for v in pending_consts:
        v.name = graph.unique_name(v.name)
        graph.add_value(v)
    out.name = graph.unique_name(out.name)
    last = max(m.nodes, key=lambda n: pos[id(n)])
    graph.insert_node(node, graph.nodes.index(last) + 1)
    graph.replace_all_uses(target, out)
    removed = sorted(m.nodes, key=lambda n: pos[id(n)], reverse=True)
    for n in removed:
        graph.remove_node(n)
    # The new output takes the replaced value's name (graph outputs and dumps stay readable).
    old_name = target.name
    del graph.values[out.name]
    out.name = old_name
    graph.values[old_name] = out
    touched = [v.producer for v in node.input_values() if v.producer is not None]
    touched += [u for u, _ in out.uses]
    return AppliedRewrite(node, removed, touched, pos[id(last)])


def apply_subgraph(graph, m: Match, rep: Subgraph, pos: dict[int, int]) -> AppliedRewrite | str:
    """Replace ``m`` by the nodes of ``rep.graph`` (see the module docstring)."""
    target = _target(graph, m, rep.replaces)
    if isinstance(target, str):
        return target
    scratch = rep.graph
    out = rep.output
    if out.producer is None or out.type != target.type:
        got = out.type if out.producer is not None else "no op"
        return f"the replacement computes {got}, the match produced {target.type}"
    bound = {}
    for stand_in, real in rep.bindings.items():
        v = scratch.values.get(stand_in)
        if v is None or real is None or v.type != real.type or real.graph is not graph:
            return f"stand-in '{stand_in}' is not bound to a value of the graph of its type"
        bound[id(v)] = real
    new_nodes = list(scratch.nodes)
    made = {id(v) for n in new_nodes for v in n.outputs}
    for n in new_nodes:
        for v in n.input_values():
            if id(v) not in made and id(v) not in bound and v.const is None:
                return f"stand-in '{v.name}' is not bound to a value of the graph"
    # Commit: unhook the replaced value, remove the match, then insert the new nodes where it was.
    readers = list(target.uses)
    for u, i in readers:
        u.inputs[i] = None
    target.uses.clear()
    output_slots = [i for i, o in enumerate(graph.outputs) if o is target]
    graph.outputs = [o for o in graph.outputs if o is not target]
    ordered = sorted(m.nodes, key=lambda n: pos[id(n)])
    last = ordered[-1]
    at = graph.nodes.index(last) + 1 - len(ordered)  # every matched node lies at or before the last
    removed = list(reversed(ordered))
    for n in removed:  # each is read only by the ones removed before it
        graph.remove_node(n)
    mapped: dict[int, Value] = dict(bound)
    for k, n in enumerate(new_nodes):
        inputs: list[Value | None] = []
        for v in n.inputs:
            if v is None:
                inputs.append(None)
                continue
            if id(v) not in mapped:  # a constant the new nodes read
                c = Value(graph.unique_name(v.name), const=v.const)
                graph.add_value(c)
                mapped[id(v)] = c
            inputs.append(mapped[id(v)])
        outs = []
        for v in n.outputs:
            o = Value(target.name if v is out else graph.unique_name(v.name), v.type)
            mapped[id(v)] = o
            outs.append(o)
        node = Node(graph.unique_name(n.name, for_node=True), n.op_type, inputs, outs, dict(n.attrs))
        graph.insert_node(node, at + k)
        new_nodes[k] = node
    result = mapped[id(out)]
    for u, i in readers:
        u.inputs[i] = result
        result.uses.append((u, i))
    for i in output_slots:
        graph.outputs.insert(i, result)
    touched = [v.producer for n in new_nodes for v in n.input_values()
               if v.producer is not None and v.producer not in new_nodes]
    touched += [u for u, _ in readers]
    return AppliedRewrite(result.producer, removed, touched, pos[id(last)], new_nodes)


__all__ = ["apply_replacement", "apply_subgraph", "AppliedRewrite"]
