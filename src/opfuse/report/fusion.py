"""The fusion report: what fusion did to a model, per model and per fused group.

For each group of the plan (``FusionPlan`` over the rewritten graph) and for the model:

* kernels before / after: before, one kernel per op of the *original* graph (each group
  counts the original ops it stands for, ``attrs["origin"]``); after, one per group, except
  groups that move no data (an elided Concat, a view);
* bytes through main memory, before: every op reads all its inputs (weights included) and
  writes all its outputs; after: a group reads its boundary inputs and writes its boundary
  outputs once, intermediates stay on chip and are not counted (the seed's 7.3.2);
* the seed's bandwidth saving rate ``eta = 1 - M_boundary / M_total`` (bytes after over
  bytes before);
* FLOPs and arithmetic intensity ``I = FLOPs / bytes`` (roofline, 7.3.1).

``explain_text`` lists every pair of adjacent groups, and of sibling groups reading one value,
that were not merged and why (rule refused, category forbids, cycle, resource limit, disabled
by user, or not chosen by the planner), judged on the plan that runs by the rules' one legality.
Every group names the fusion rule that formed it (``rule``; ``None`` for a single op).

    rep = build_report(original_graph, graph, plan, decisions)
    print(rep.to_text()); print(rep.explain_text()); open("r.json", "w").write(rep.to_json())
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

from opfuse.rules.decisions import REWRITTEN, Decision, RefusalKind, Refusal
from opfuse.rules.legality import RuleLegality
from opfuse.rules.options import FusionOptions
from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops.registry import get_spec
from opfuse.report.summary import human_bytes, human_count

JSON_INDENT = 2
OPS_COLUMN = 34  # op list width in the text table; longer lists are cut with "..."


def node_bytes(node: Node) -> int:
    spec = get_spec(node.op_type, node)
    return spec.bytes_read(node) + spec.bytes_written(node)


def node_flops(node: Node) -> int:
    return get_spec(node.op_type, node).flops(node)


def group_bytes(group: FusionGroup, graph: Graph) -> int:
    """Bytes the group's kernel moves through main memory (boundary values only)."""
    zero = group.attrs.get("zero_copy")
    if zero:
        return 0
    aliased = set(group.attrs.get("alias_inputs", []))
    if aliased:  # a Concat copying only its non-aliased inputs into the output
        return 2 * sum(v.nbytes for v in group.inputs() if v.name not in aliased)
    return sum(v.nbytes for v in group.inputs()) + sum(v.nbytes for v in group.outputs(graph))


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


@dataclass
class GroupReport:
    index: int
    name: str
    kind: str
    rule: str | None
    ops: list[str]
    nodes: list[str]
    origin: list[str]
    kernels_before: int
    kernels_after: int
    bytes_before: int
    bytes_after: int
    flops: int
    zero_copy: str = ""

    @property
    def eta(self) -> float:
        return 1.0 - _ratio(self.bytes_after, self.bytes_before) if self.bytes_before else 0.0

    @property
    def intensity(self) -> float:
        return _ratio(self.flops, self.bytes_after)

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "rule": self.rule, "ops": self.ops, "nodes": self.nodes,
                "origin": self.origin, "kernels_before": self.kernels_before,
                "kernels_after": self.kernels_after, "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "eta": round(self.eta, 6), "flops": self.flops,
                "arithmetic_intensity": round(self.intensity, 6), "zero_copy": self.zero_copy or None}


@dataclass
class PairExplanation:
    producer: str
    consumer: str
    values: list[str]
    reason_kind: str
    reason: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def __str__(self) -> str:
        return f"{self.producer} -> {self.consumer} (via {', '.join(self.values)}): {self.reason_kind}: {self.reason}"


@dataclass
class FusionReport:
    model: str
    kernels_before: int
    kernels_after: int
    num_groups: int
    bytes_before: int
    bytes_after: int
    flops_before: int
    flops_after: int
    groups: list[GroupReport]
    removed_ops: list[str]
    rewrites: dict[str, int]
    refusals: dict[str, int]
    explanations: list[PairExplanation] = field(default_factory=list)

    @property
    def eta(self) -> float:
        return 1.0 - _ratio(self.bytes_after, self.bytes_before) if self.bytes_before else 0.0

    def to_dict(self) -> dict:
        return {
            "model": self.model, "kernels_before": self.kernels_before, "kernels_after": self.kernels_after,
            "groups_after": self.num_groups, "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after, "eta": round(self.eta, 6),
            "flops_before": self.flops_before, "flops_after": self.flops_after,
            "arithmetic_intensity_before": round(_ratio(self.flops_before, self.bytes_before), 6),
            "arithmetic_intensity_after": round(_ratio(self.flops_after, self.bytes_after), 6),
            "removed_ops": self.removed_ops, "rewrites": self.rewrites, "refusals": self.refusals,
            "groups": [g.to_dict() for g in self.groups],
            "explain": [e.to_dict() for e in self.explanations],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=JSON_INDENT, sort_keys=False)

    # Text -------------------------------------------------------------------------------
    def to_text(self) -> str:
        ib = _ratio(self.flops_before, self.bytes_before)
        ia = _ratio(self.flops_after, self.bytes_after)
        zero = self.num_groups - self.kernels_after
        lines = [
            f"fusion report: {self.model}",
            f"  kernels       {self.kernels_before} -> {self.kernels_after}"
            f"  ({self.num_groups} groups{f', {zero} move no data' if zero else ''})",
            f"  main memory   {human_bytes(self.bytes_before)} -> {human_bytes(self.bytes_after)}"
            f"  eta = 1 - M_boundary/M_total = {self.eta:.3f}",
            f"  FLOPs         {human_count(self.flops_before)} -> {human_count(self.flops_after)}",
            f"  intensity     {ib:.2f} -> {ia:.2f} FLOP/byte",
        ]
        if self.rewrites:
            lines.append("  rewrites      " + ", ".join(f"{k} x{v}" for k, v in self.rewrites.items()))
        if self.removed_ops:
            lines.append(f"  removed       {len(self.removed_ops)} op(s) at compile time "
                         f"(constant folding, dead code)")
        lines += ["", f"  {'#':>3}  {'group':<24}{'kind':<15}{'ops':<{OPS_COLUMN}}{'k before':>9}{'k after':>8}"
                      f"{'bytes before':>14}{'bytes after':>13}{'eta':>7}{'FLOPs':>9}{'FLOP/B':>8}"]
        for g in self.groups:
            ops = "+".join(g.ops)
            if len(ops) > OPS_COLUMN - 2:
                ops = ops[:OPS_COLUMN - 5] + "..."
            lines.append(f"  {g.index:>3}  {g.name[:23]:<24}{g.kind:<15}{ops:<{OPS_COLUMN}}{g.kernels_before:>9}"
                         f"{g.kernels_after:>8}{human_bytes(g.bytes_before):>14}{human_bytes(g.bytes_after):>13}"
                         f"{g.eta:>7.3f}{human_count(g.flops):>9}{g.intensity:>8.2f}")
        return "\n".join(lines)

    def explain_text(self) -> str:
        lines = [f"explain: {self.model}: {len(self.explanations)} adjacent or sibling group pair(s) not merged"]
        counts = Counter(e.reason_kind for e in self.explanations)
        if counts:
            lines.append("  " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
        for e in self.explanations:
            lines.append(f"  {e}")
        return "\n".join(lines)


def _explain(plan: FusionPlan, decisions: list[Decision], legality: RuleLegality,
             chooser: str) -> list[PairExplanation]:
    """Each pair of groups joined by a value (producer -> consumer) or reading one non-constant
    value (siblings) that the plan keeps apart, with the reason."""
    graph = plan.graph
    owner = {id(n): g for g in plan.groups for n in g.nodes}
    disabled_nodes = {name: d.rule for d in decisions if d.kind == RefusalKind.DISABLED.value
                      for name in d.nodes}
    not_chosen = [d for d in decisions if d.kind == RefusalKind.NOT_CHOSEN.value]
    pairs: dict[tuple[int, int], tuple[FusionGroup, FusionGroup, list[str]]] = {}
    index = {id(g): i for i, g in enumerate(plan.groups)}

    def add(a: FusionGroup, b: FusionGroup, value: str) -> None:
        if index[id(a)] > index[id(b)]:
            a, b = b, a
        entry = pairs.setdefault((index[id(a)], index[id(b)]), (a, b, []))
        if value not in entry[2]:
            entry[2].append(value)

    for a, b, v in plan.group_edges():
        add(a, b, v.name)
    for v in graph.values.values():
        if v.is_const:
            continue
        readers = []
        for u, _ in v.uses:
            g = owner[id(u)]
            if g not in readers and (v.producer is None or owner[id(v.producer)] is not g):
                readers.append(g)
        for i, a in enumerate(readers):
            for b in readers[i + 1:]:
                if (min(index[id(a)], index[id(b)]), max(index[id(a)], index[id(b)])) not in pairs:
                    add(a, b, v.name)
    out = []
    for key in sorted(pairs):
        a, b, values = pairs[key]
        r = _elided(a, b) or legality.merge_refusal(plan, a, b)
        if r is None:
            r = _not_chosen(graph, a, b, values, owner, disabled_nodes, chooser, not_chosen)
        out.append(PairExplanation(a.name, b.name, values, r.kind.label, r.reason))
    return out


def _elided(a: FusionGroup, b: FusionGroup) -> Refusal | None:
    for g in (b, a):
        if g.attrs.get("zero_copy") == "concat":
            return Refusal(RefusalKind.CONDITION, f"Concat '{g.name}' is elided: its producers write "
                                                    f"straight into their slices (no kernel to fuse with)")
    return None


def _not_chosen(graph, a, b, values, owner, disabled_nodes, chooser: str, not_chosen=()) -> Refusal:
    """Why a legal merge was left alone: disabled, or what the chooser (the fusion rules or the
    cost-model planner) saw: the reason of the "not chosen" decision (``not_chosen``) where the rules proposed
    the merge and the planner did not choose it (its predicted times)."""
    for n in [*a.nodes, *b.nodes]:
        if n.name in disabled_nodes:
            return Refusal(RefusalKind.DISABLED, f"rule '{disabled_nodes[n.name]}' is disabled")
    names_a, names_b = {n.name for n in a.nodes}, {n.name for n in b.nodes}
    for d in not_chosen:
        if names_a & set(d.nodes) and names_b & set(d.nodes):
            return Refusal(RefusalKind.NOT_CHOSEN, d.reason)
    if chooser != "fusion rules":
        return Refusal(RefusalKind.NOT_CHOSEN, f"legal, but the {chooser}'s cost model predicts the plan "
                                               f"faster with these groups apart")
    for name in values:
        v = graph.values[name]
        if v in graph.outputs:
            return Refusal(RefusalKind.NOT_CHOSEN, f"'{name}' is a graph output: it is written anyway")
        others = sorted({owner[id(u)].name for u, _ in v.uses if owner[id(u)] is not b})
        if others:
            return Refusal(RefusalKind.NOT_CHOSEN, f"'{name}' is also read by {', '.join(others)}: "
                                                  f"fusing along the post-dominator tree only, so it "
                                                  f"would still be written")
    return Refusal(RefusalKind.NOT_CHOSEN, f"legal, but no rule merges a {a.kind} group into a "
                                          f"{b.kind} group (left to the planner)")


def _rewrite_rule(origin: list[str], rewritten: list[tuple[str, set[str]]]) -> str | None:
    """The rewrite rule that made a one-op group out of several original ops (e.g. a LayerNorm
    recognised from its decomposed formula): the one whose match covers most of ``origin``."""
    if len(origin) < 2:
        return None
    best = max(rewritten, key=lambda r: len(r[1] & set(origin)), default=None)
    return best[0] if best is not None and best[1] & set(origin) else None


def build_report(original_graph: Graph, graph: Graph, plan: FusionPlan,
                 decisions: list[Decision] | None = None, *, explain: bool = True,
                 options: FusionOptions | None = None, chooser: str = "fusion rules") -> FusionReport:
    """The report of ``plan`` (over the rewritten ``graph``) against ``original_graph``;
    ``chooser`` names who chose the plan ("fusion rules", or e.g. "exact planner")."""
    decisions = decisions or []
    orig = {n.name: n for n in original_graph.nodes}
    orig_bytes = {name: node_bytes(n) for name, n in orig.items()}
    covered: set[str] = set()
    rewritten = [(d.rule, set(d.nodes)) for d in decisions if d.verdict == REWRITTEN]
    groups = []
    for i, g in enumerate(plan.groups, 1):
        origin = [o for o in g.attrs.get("origin", [n.name for n in g.nodes]) if o in orig]
        covered.update(origin)
        zero = g.attrs.get("zero_copy") or ""
        groups.append(GroupReport(
            index=i, name=g.name, kind=g.kind, rule=g.attrs.get("rule") or _rewrite_rule(origin, rewritten),
            ops=g.op_types, nodes=[n.name for n in g.nodes],
            origin=origin, kernels_before=len(origin), kernels_after=0 if zero else 1,
            bytes_before=sum(orig_bytes[o] for o in origin), bytes_after=group_bytes(g, graph),
            flops=sum(node_flops(n) for n in g.nodes), zero_copy=zero))
    removed = [n.name for n in original_graph.nodes if n.name not in covered]
    rewrites = Counter(d.rule for d in decisions if d.verdict == REWRITTEN)
    refusals = Counter(d.label for d in decisions if not d.taken)
    legality = RuleLegality(options)
    return FusionReport(
        model=graph.name,
        kernels_before=len(original_graph.nodes),
        kernels_after=sum(g.kernels_after for g in groups),
        num_groups=len(groups),
        bytes_before=sum(orig_bytes.values()),
        bytes_after=sum(g.bytes_after for g in groups),
        flops_before=sum(node_flops(n) for n in original_graph.nodes),
        flops_after=sum(g.flops for g in groups),
        groups=groups, removed_ops=removed,
        rewrites=dict(sorted(rewrites.items())), refusals=dict(sorted(refusals.items())),
        explanations=_explain(plan, decisions, legality, chooser) if explain else [],
    )
