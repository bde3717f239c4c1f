"""Apply a rewrite rule's ``Replacement`` to the graph.

The new op is inserted right after the match's last node (every value it reads is defined
before that point), takes over the match's escaping output (keeping its name, so graph outputs
keep theirs), and the matched nodes are removed. Its output type is inferred and must equal the
type of the value it replaces; otherwise the rewrite declines with a reason and the graph is not
touched.
"""
from __future__ import annotations

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import infer_node
from opfuse.patterns.match import Match
from opfuse.rules.rule import Replacement


class AppliedRewrite:
    """The new node, the nodes removed, and the nodes whose inputs or uses changed."""

    __slots__ = ("node", "removed", "touched", "position")

    def __init__(self, node, removed, touched, position):
        self.node = node
        self.removed = removed
        self.touched = touched
        self.position = position  # the new node takes the place of the last node it replaces


def apply_replacement(graph, m: Match, rep: Replacement, pos: dict[int, int], name: str) -> AppliedRewrite | str:
    """Replace ``m`` by ``rep``; returns the change, or a reason string when it cannot.

    ``pos`` orders the graph's nodes (the matcher's positions); the graph's node list stays
    topologically ordered.
    """
    escaping = m.outputs(graph)
    target = rep.replaces if rep.replaces is not None else (escaping[0] if len(escaping) == 1 else None)
    if target is None or len(escaping) != 1 or escaping[0] is not target:
        outs = ", ".join(f"'{v.name}'" for v in escaping) or "none"
        return f"a rewrite replaces exactly one escaping output; the match has {outs}"
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


__all__ = ["apply_replacement", "AppliedRewrite"]
