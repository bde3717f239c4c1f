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

Split through a Concat (YOLO's C2f: ``a, b = Split(x); Concat(a, b, m1, m2)``): when a Split
alone in its group has every output aliased into one Concat, consecutive and in order, its input
``x`` is the same bytes as that run of the Concat's output. The memory planner then places ``x``
itself in the Concat's output (its producer writes there) and the Split's outputs are views of
``x``: the Split moves nothing (``attrs["zero_copy"] = "view"``, ``attrs["through_concat"]``
names the Concat). ``split_through_refusal`` says why a Split is not taken so; the fusion driver
records each such Split, taken or refused with that reason, in the decision log (rule
``split_through_concat``).
"""
from __future__ import annotations

import math
from typing import Collection

from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionPlan
from opfuse.ops.common import norm_axis
from opfuse.ops.registry import get_spec
from opfuse.patterns import Op
from opfuse.rules.decisions import FusionLog, Refusal, RefusalKind
from opfuse.rules.kernel_shape import GroupShape
from opfuse.rules.rule import Fuse, Rule
from opfuse.rules.site import Site

RULE = "concat_alias"
SPLIT_RULE = "split_through_concat"  # the decision-log name of a Split placed through a Concat (``mark_views``)
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"})


def contiguous_slices(shape: tuple[int, ...], axis: int) -> bool:
    return math.prod(shape[:axis]) == 1


def concat_input_refusal(graph: Graph, concat: Node, v: Value, claimed: set[int]) -> Refusal | None:
    out = concat.outputs[0]
    axis = norm_axis(int(get_spec("Concat").attrs_of(concat)["axis"]), len(out.shape), concat)
    if not contiguous_slices(out.shape, axis):
        return Refusal(RefusalKind.CONDITION, f"slices along axis {axis} of {out.shape} are not contiguous")
    if v.producer is None:
        return Refusal(RefusalKind.CONDITION, f"'{v.name}' is a graph input or constant")
    if v in graph.outputs:
        return Refusal(RefusalKind.CONDITION, f"'{v.name}' is a graph output")
    if sum(1 for u in concat.inputs if u is v) > 1:
        return Refusal(RefusalKind.CONDITION, f"'{v.name}' appears twice in the Concat")
    if id(v) in claimed:
        return Refusal(RefusalKind.CONDITION, f"'{v.name}' is already aliased into another Concat")
    return None


def aliasable_inputs(graph: Graph, concat: Node) -> list[Value]:
    """The inputs of ``concat`` its producers could write in place, judged on the Concat alone
    (what the cost model prices a lone Concat group at; the plan's marking also refuses an
    input already aliased into another Concat)."""
    return [v for v in concat.input_values() if concat_input_refusal(graph, concat, v, set()) is None]


def is_view(graph: Graph, node: Node) -> bool:
    """Does ``node`` alone produce bytes that already exist (a view of its input)?"""
    x = node.inputs[0] if node.inputs else None
    if x is None or x.is_const or any(v in graph.outputs for v in node.outputs):
        return False
    if node.op_type in VIEW_OPS:
        return node.outputs[0].nbytes == x.nbytes
    if node.op_type == "Split":
        axis = norm_axis(int(get_spec("Split").attrs_of(node)["axis"]), len(x.shape), node)
        return contiguous_slices(x.shape, axis)
    return False


def split_through_refusal(graph: Graph, split: Node, concat: Node, aliased: Collection[str],
                          claimed: Collection[str] = ()) -> Refusal | None:
    """Why the Split ``split`` cannot move nothing by having its input placed in the output of
    ``concat`` (``aliased``: the Concat inputs its producers write in place; ``claimed``: values
    already placed in some Concat's output), or ``None`` when it can: every output of the Split is
    an aliased input of the Concat, all consecutive and in the Split's order; the Split's slices
    are contiguous (``is_view``); its input is produced by a kernel (not a graph input, output or
    constant, not a view itself) and placed in no other Concat."""
    x = split.inputs[0] if split.inputs else None
    if x is None or not is_view(graph, split):
        return Refusal(RefusalKind.CONDITION, f"Split '{split.name}' is not a view of its input")
    outs = list(split.outputs)
    if any(v.name not in aliased for v in outs):
        return Refusal(RefusalKind.CONDITION, f"not every output of Split '{split.name}' is written in place "
                                              f"into Concat '{concat.name}'")
    ins = list(concat.inputs)
    starts = [i for i in range(len(ins) - len(outs) + 1) if all(ins[i + k] is v for k, v in enumerate(outs))]
    if len(starts) != 1 or any(sum(1 for u in ins if u is v) != 1 for v in outs):
        return Refusal(RefusalKind.CONDITION, f"the outputs of Split '{split.name}' are not one run of "
                                              f"consecutive inputs of Concat '{concat.name}' in order")
    if x.producer is None or x.is_const:
        return Refusal(RefusalKind.CONDITION, f"'{x.name}' is a graph input or constant")
    if x in graph.outputs:
        return Refusal(RefusalKind.CONDITION, f"'{x.name}' is a graph output")
    if is_view(graph, x.producer):
        return Refusal(RefusalKind.CONDITION, f"'{x.name}' is produced by a view")
    if x.name in claimed:
        return Refusal(RefusalKind.CONDITION, f"'{x.name}' is already placed in another Concat")
    return None


def propose_aliasing(grouping, matches):
    """For each Concat still alone in its group: alias the inputs its producers can write in place."""
    p = grouping.p
    graph = p.graph
    claimed = grouping.facts.setdefault(RULE, set())
    for m in matches:
        n = m.nodes[0]
        g = p.gid(n)
        if len(p.members[g]) != 1:
            continue
        aliased = []
        for v in n.input_values():
            r = concat_input_refusal(graph, n, v, claimed)
            if r is None:
                aliased.append(v)
            else:
                yield Site({g}, [n.name, v.name], refusal=r)
        if not aliased:
            continue
        whole = len(aliased) == len(n.input_values())
        yield Site({g}, [n.name] + [v.name for v in aliased],
                   f"{len(aliased)} of {len(n.input_values())} inputs written in place"
                   + ("; Concat elided" if whole else ""),
                   apply=_alias, facts={"concat": n, "aliased": aliased, "whole": whole})


def _alias(grouping, site: Site) -> None:
    p = grouping.p
    (g,) = site.gids
    aliased = site.facts["aliased"]
    grouping.facts[RULE].update(id(v) for v in aliased)
    p.attrs[g]["alias_inputs"] = [v.name for v in aliased]
    p.attrs[g]["rule"] = RULE
    p.shape[g] = GroupShape("concat", site.facts["concat"])
    if site.facts["whole"]:
        p.attrs[g]["zero_copy"] = "concat"


CONCAT_ALIAS = Rule(RULE, Op("Concat").named("concat"), action=Fuse(propose_aliasing), priority=4,
                    description="Concat inputs written in place by their producers (the Concat is elided)")


def mark_views(plan: FusionPlan, log: FusionLog | None = None) -> None:
    """Set ``attrs["zero_copy"] = "view"`` on single-op groups whose output is a view, and on
    single-Split groups whose input can be placed in the output of the Concat their outputs are
    aliased into (``split_through_refusal``; ``attrs["through_concat"]`` names that Concat).
    ``log`` receives a decision (``SPLIT_RULE``) for each single-Split group whose first output is
    aliased into a Concat: taken, or refused with ``split_through_refusal``'s reason."""
    graph = plan.graph
    outs = {id(v) for v in graph.outputs}
    aliased = {name for g in plan.groups for name in g.attrs.get("alias_inputs", [])}
    concat_of = {name: n for g in plan.groups for n in g.nodes if n.op_type == "Concat"
                 for name in g.attrs.get("alias_inputs", [])}
    placed = set(aliased)
    for g in plan.groups:
        if len(g.nodes) != 1 or g.nodes[0].op_type != "Split" or g.attrs.get("zero_copy") or not g.nodes[0].outputs:
            continue
        n = g.nodes[0]
        x = n.inputs[0] if n.inputs else None
        concat = concat_of.get(n.outputs[0].name)
        if x is None or concat is None:
            continue
        refusal = split_through_refusal(graph, n, concat, aliased, placed)
        if refusal is not None:
            if log is not None:
                log.refused(SPLIT_RULE, [n.name, concat.name], refusal)
            continue
        placed.add(x.name)
        g.attrs["zero_copy"] = "view"
        g.attrs["through_concat"] = concat.name
        if log is not None:
            log.taken(SPLIT_RULE, [n.name, concat.name], f"'{x.name}' placed in the output of Concat "
                      f"'{concat.name}'; the Split moves nothing", group=g.name)
    aliased = placed
    for g in plan.groups:
        if len(g.nodes) != 1 or g.attrs.get("zero_copy"):
            continue
        n = g.nodes[0]
        if not any(id(v) in outs or v.name in aliased for v in n.outputs) and is_view(graph, n):
            g.attrs["zero_copy"] = "view"


__all__ = ["CONCAT_ALIAS", "SPLIT_RULE", "VIEW_OPS", "aliasable_inputs", "is_view", "concat_input_refusal",
           "contiguous_slices", "mark_views", "split_through_refusal"]
