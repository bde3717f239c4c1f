"""Remove no-op nodes: Identity and inference-mode Dropout (``y = x``).

The importer already drops them; graphs built in code may still hold some. Refused when the
node's output is a graph output whose name would be lost (its input is a graph input or
another output), and for a Dropout whose mask output is read.
"""
from __future__ import annotations

from opfuse.rules.decisions import refuse
from opfuse.ir.graph import Graph
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import can_substitute, substitute

RULE = "remove_identity"
NO_OPS = ("Identity", "Dropout")


def remove_identities(graph: Graph, rc: RewriteContext) -> bool:
    if rc.options.is_disabled(RULE):
        return False
    removed = []
    for node in [n for n in graph.nodes if n.op_type in NO_OPS]:
        if any(v.uses or v in graph.outputs for v in node.outputs[1:]):
            rc.log_refusal(RULE, [node.name], refuse("the Dropout mask is read"))
            continue
        why = can_substitute(graph, node.output, node.input(0))
        if why:
            rc.log_refusal(RULE, [node.name], refuse(why))
            continue
        readers = [u for u, _ in node.output.uses]
        substitute(graph, node.output, node.input(0))
        if node.outputs[0].producer is node:  # still attached: an unread mask output
            graph.remove_node(node)
        rc.provenance.credit(node, readers)
        removed.append(node.name)
    if removed:
        rc.log_applied(RULE, removed, f"removed {len(removed)} no-op node(s)")
    return bool(removed)
