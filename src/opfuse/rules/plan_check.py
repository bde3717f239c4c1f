"""Check a ``FusionPlan`` after construction.

* structure (``FusionPlan.verify``): every node in exactly one group, groups in a topological
  order of the group graph, hence the group graph is acyclic;
* each group is a legal kernel shape of its recorded kind (``classify``); a horizontal group's
  members are legal kernels that share the recorded input and do not reach one another;
* each group's boundary is explicit: ``attrs["inputs"]`` and ``attrs["outputs"]`` list exactly
  the values it reads from and writes to memory.

Raises ``ModelError`` naming the group and the broken invariant.
"""
from __future__ import annotations

from opfuse.errors import ModelError
from opfuse.rules.decisions import Refusal
from opfuse.rules.graph_index import GraphIndex
from opfuse.rules.kernel_shape import boundary_outputs, classify
from opfuse.ir.plan import FusionPlan

RELAXED_KINDS = {"concat": "single"}  # a marked Concat is a single node underneath


def verify_plan(plan: FusionPlan) -> None:
    plan.verify()
    graph = plan.graph
    index = GraphIndex(graph)
    for g in plan.groups:
        if g.kind == "horizontal":
            _verify_horizontal(plan, g, index)
        else:
            shape = classify(g.nodes, graph, index.outputs)
            if isinstance(shape, Refusal):
                raise ModelError(f"fusion group '{g.name}' ({g.kind}) is not a legal kernel: {shape}")
            if RELAXED_KINDS.get(g.kind, g.kind) != shape.kind:
                raise ModelError(f"fusion group '{g.name}' is recorded as {g.kind} but is {shape.kind}")
        ins = [v.name for v in g.inputs()]
        outs = [v.name for v in boundary_outputs(g.nodes, graph, index.outputs)]
        if g.attrs.get("inputs") != ins or g.attrs.get("outputs") != outs:
            raise ModelError(f"fusion group '{g.name}' boundary is stale: recorded "
                             f"{g.attrs.get('inputs')} -> {g.attrs.get('outputs')}, actual {ins} -> {outs}")


def _verify_horizontal(plan: FusionPlan, g, index: GraphIndex) -> None:
    by_name = {n.name: n for n in g.nodes}
    members = g.attrs.get("members") or []
    flat = [x for m in members for x in m]
    if sorted(flat) != sorted(by_name) or len(flat) != len(set(flat)):
        raise ModelError(f"horizontal group '{g.name}': members {members} do not partition its nodes")
    shared = g.attrs.get("shared_input")
    member_nodes = []
    for m in members:
        nodes = [by_name[x] for x in m]
        shape = classify(nodes, plan.graph, index.outputs)
        if isinstance(shape, Refusal):
            raise ModelError(f"horizontal group '{g.name}': member {m} is not a legal kernel: {shape}")
        if not any(v.name == shared for n in nodes for v in n.input_values()):
            raise ModelError(f"horizontal group '{g.name}': member {m} does not read '{shared}'")
        member_nodes.append(nodes)
    for i, src in enumerate(member_nodes):
        for j, dst in enumerate(member_nodes):
            if i != j and index.reaches(src, dst):
                raise ModelError(f"horizontal group '{g.name}': member {members[i]} reaches member {members[j]}")

