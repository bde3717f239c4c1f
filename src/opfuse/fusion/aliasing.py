"""Groups that move no data: aliased Concats and views.

Conv+Concat (the seed's 3.2 pattern): each producer of a Concat input writes straight into its
slice of the Concat output, so the Concat needs no copy kernel. A slice along ``axis`` is one
contiguous run of the output when every axis before ``axis`` has extent 1 (NCHW channel
concat at batch 1); only such slices are aliased (the memory planner gives the input the
output's storage at the slice's byte offset). An input is refused when it is a graph input,
output or constant (the caller or the weight blob owns that storage), appears twice, is
already aliased into another Concat, or its slice is not contiguous. When every input is
aliased the Concat group is elided (``attrs["zero_copy"] = "concat"``); otherwise the
aliased inputs are listed in ``attrs["alias_inputs"]`` and the Concat copies the rest.

Views: a group that is one Reshape/Flatten/Squeeze/Unsqueeze (or a Split whose slices are
contiguous) produces bytes that already exist; the memory planner makes its output a view of
its input (``attrs["zero_copy"] = "view"``) unless the output is a graph output.
"""
from __future__ import annotations

import math

from opfuse.fusion.decisions import ReasonKind, Refusal
from opfuse.fusion.log import FusionLog
from opfuse.fusion.partition import Partition
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionPlan
from opfuse.ops.common import norm_axis
from opfuse.ops.registry import get_spec

RULE = "concat_alias"
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def contiguous_slices(shape: tuple[int, ...], axis: int) -> bool:
    return math.prod(shape[:axis]) == 1


def concat_input_refusal(graph: Graph, concat: Node, v: Value, claimed: set[int]) -> Refusal | None:
    out = concat.outputs[0]
    axis = norm_axis(int(get_spec("Concat").attrs_of(concat)["axis"]), len(out.shape), concat)
    if not contiguous_slices(out.shape, axis):
        return Refusal(ReasonKind.RULE_REFUSED, f"slices along axis {axis} of {out.shape} are not contiguous")
    if v.producer is None:
        return Refusal(ReasonKind.RULE_REFUSED, f"'{v.name}' is a graph input or constant")
    if v in graph.outputs:
        return Refusal(ReasonKind.RULE_REFUSED, f"'{v.name}' is a graph output")
    if sum(1 for u in concat.inputs if u is v) > 1:
        return Refusal(ReasonKind.RULE_REFUSED, f"'{v.name}' appears twice in the Concat")
    if id(v) in claimed:
        return Refusal(ReasonKind.RULE_REFUSED, f"'{v.name}' is already aliased into another Concat")
    return None


def alias_concats(p: Partition, log: FusionLog, disabled: bool = False) -> None:
    """Mark single-Concat groups whose inputs their producers can write in place."""
    graph = p.graph
    claimed: set[int] = set()
    for n in graph.nodes:
        g = p.gid(n)
        if n.op_type != "Concat" or len(p.members[g]) != 1:
            continue
        aliased, refused = [], []
        for v in n.input_values():
            r = concat_input_refusal(graph, n, v, claimed)
            if r is None:
                aliased.append(v)
            else:
                refused.append(v)
                log.refused(RULE, [n.name, v.name], r)
        if not aliased:
            continue
        if disabled:
            log.disabled(RULE, [n.name])
            continue
        claimed.update(id(v) for v in aliased)
        p.attrs[g]["alias_inputs"] = [v.name for v in aliased]
        p.shape[g] = type(p.shape[g])("concat", n)
        if not refused:
            p.attrs[g]["zero_copy"] = "concat"
        log.taken(RULE, [n.name] + [v.name for v in aliased],
                  f"{len(aliased)} of {len(n.input_values())} inputs written in place"
                  + ("; Concat elided" if not refused else ""))


def mark_views(plan: FusionPlan) -> None:
    """Set ``attrs["zero_copy"] = "view"`` on single-op groups whose output is a view."""
    graph = plan.graph
    outs = {id(v) for v in graph.outputs}
    aliased = {name for g in plan.groups for name in g.attrs.get("alias_inputs", [])}
    for g in plan.groups:
        if len(g.nodes) != 1 or g.attrs.get("zero_copy"):
            continue
        n = g.nodes[0]
        x = n.inputs[0] if n.inputs else None
        if x is None or x.is_const or any(id(v) in outs or v.name in aliased for v in n.outputs):
            continue
        if n.op_type in VIEW_OPS and n.outputs[0].nbytes == x.nbytes:
            g.attrs["zero_copy"] = "view"
        elif n.op_type == "Split":
            axis = norm_axis(int(get_spec("Split").attrs_of(n)["axis"]), len(x.shape), n)
            if contiguous_slices(x.shape, axis):
                g.attrs["zero_copy"] = "view"
