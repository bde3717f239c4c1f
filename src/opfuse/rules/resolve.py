"""Conflict resolution: the seed's greedy by ``score = benefit / cost * priority`` (7.2.3).

``apply_rules`` runs a rule set over a graph:

1. every rule's maximal matches are offered; a rule's condition may refuse one (recorded);
2. the legal matches wait in a priority queue ordered by score, then by size (larger first),
   then by rule order and graph position, so ties break the same way on every run;
3. the best match is checked for the three conflicts (overlap, resource, dependency). A
   conflict (or a refusing condition) is recorded and *bans* the match in the matcher, so the
   largest matches it contained come forward as new candidates: a chain too long for the limit
   yields its sub-chains. A refusal that names culprit nodes bans every match holding them, so
   a Concat on the wrong axis is refused once, not once per subset of its inputs;
4. otherwise it is applied: a group rule takes its nodes (every waiting match that shares one
   is refused as an overlap, and the matcher re-matches around the taken nodes so the parts
   of those matches that are still free are offered again); a rewrite rule edits the graph and
   the matcher re-matches incrementally around the edit.

It ends when the queue is empty. Group rules give ``FusionGroup``s; ``build_plan`` completes
them into a ``FusionPlan`` (every other node its own group, groups in a topological order).
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable

from opfuse.errors import ModelError
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.patterns.matcher import MAX_REPEAT, Matcher
from opfuse.rules.conflicts import DependencyRules, ResourceLimits, check_dependencies, check_overlap, \
    check_resources, OVERLAP
from opfuse.rules.decisions import CONDITION, DISABLED, FUSED, REFUSED, REWRITE, REWRITTEN, Decision, RuleStats
from opfuse.rules.rewrite import apply_replacement
from opfuse.rules.rule import Replacement, Rule

# Rewrites applied by one run before it stops with an error: a rule set whose rewrites keep
# matching their own output never reaches a fixed point; this bounds it per graph node.
MAX_REWRITES_PER_NODE = 4


@dataclass
class RuleOutcome:
    groups: list[FusionGroup] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    stats: dict[str, RuleStats] = field(default_factory=dict)
    rewrites: int = 0

    @property
    def modified(self) -> bool:
        return self.rewrites > 0


class _Engine:
    def __init__(self, graph, rules: list[Rule], pass_name: str, limits: ResourceLimits,
                 deps: DependencyRules, disabled: frozenset, record: Callable[[Decision], None] | None,
                 max_repeat: int):
        names = [r.name for r in rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names must be unique, repeated: {dup}")
        self.graph = graph
        self.rules = rules
        self.pass_name = pass_name
        self.limits = limits
        self.deps = deps
        self.disabled = disabled
        self.record_cb = record
        self.matcher = Matcher(graph, max_repeat=max_repeat, max_nodes=limits.max_ops)
        self.out = RuleOutcome(stats={r.name: RuleStats(r.name) for r in rules})
        self.heap: list = []
        self.live: dict[tuple, float] = {}            # (rule index, key) -> score
        self.live_by_node: dict[int, set[tuple]] = {}
        self.decided: set[tuple] = set()
        self.owner: dict[int, str] = {}               # node id -> group name
        self.group_names: set[str] = {n.name for n in graph.nodes}
        self.counter = 0

    # Recording -------------------------------------------------------------------------------
    def record(self, rule: Rule, m, verdict: str, kind: str = "", reason: str = "",
               score: float | None = None, group: str | None = None) -> None:
        d = Decision(self.pass_name, rule.name, verdict, tuple(n.name for n in m.nodes), kind, reason, score, group)
        self.out.decisions.append(d)
        st = self.out.stats[rule.name]
        if verdict == REFUSED:
            st.refused += 1
        else:
            st.applied += 1
        if self.record_cb is not None:
            self.record_cb(d)

    # Offering ----------------------------------------------------------------------------------
    def offer(self, ri: int) -> None:
        rule = self.rules[ri]
        st = self.out.stats[rule.name]
        while True:
            t0 = time.perf_counter()
            new = self.matcher.take_new(rule.pattern)
            # The matcher counts every anchor it tried for this pattern in this run, the first
            # search included (which runs inside take_new): read its total, don't diff it.
            st.attempts = self.matcher.stats(rule.pattern).attempts
            st.seconds += time.perf_counter() - t0
            banned_any = False
            for m in new:
                k = (ri, m.key)
                if k in self.decided or k in self.live:
                    continue
                st.matches += 1
                if rule.name in self.disabled:
                    self.decided.add(k)
                    self.record(rule, m, REFUSED, DISABLED, f"rule '{rule.name}' is disabled")
                    continue
                t0 = time.perf_counter()
                refusal = rule.check(m)
                score = None if refusal is not None else rule.score(m)
                st.seconds += time.perf_counter() - t0
                if refusal is not None:
                    self.decided.add(k)
                    self.record(rule, m, REFUSED, CONDITION, refusal.reason)
                    self.matcher.ban(rule.pattern, m, refusal.culprits or None)
                    banned_any = True
                    continue
                self.push(ri, m, score)
            if not banned_any:
                return

    def offer_all(self) -> None:
        for ri in range(len(self.rules)):
            self.offer(ri)

    def push(self, ri: int, m, score: float) -> None:
        k = (ri, m.key)
        self.live[k] = score
        for n in m.nodes:
            self.live_by_node.setdefault(id(n), set()).add(k)
        pos = self.matcher.pos
        order = tuple(sorted(pos[id(n)] for n in m.nodes))
        self.counter += 1
        heapq.heappush(self.heap, (-score, -len(m.nodes), ri, order, self.counter, m.key))

    def unlive(self, k: tuple) -> None:
        self.live.pop(k, None)
        for nid in k[1]:
            s = self.live_by_node.get(nid)
            if s is not None:
                s.discard(k)

    def displace(self, nodes, winner_rule: Rule, group: str | None, how: str) -> None:
        """Refuse every waiting match that uses one of ``nodes`` (an overlap)."""
        for n in nodes:
            for k in sorted(self.live_by_node.get(id(n), ()), key=lambda x: (x[0], sorted(x[1]))):
                if k not in self.live:
                    continue
                score = self.live[k]
                self.unlive(k)
                self.decided.add(k)
                rule = self.rules[k[0]]
                m = self.matcher.current(rule.pattern, k[1]) or _Stale(k[1], self.graph)
                self.record(rule, m, REFUSED, OVERLAP,
                            f"node '{n.name}' {how} by rule '{winner_rule.name}'"
                            + (f" (group '{group}')" if group else ""), score)

    # The loop ----------------------------------------------------------------------------------
    def run(self) -> RuleOutcome:
        self.offer_all()
        budget = MAX_REWRITES_PER_NODE * max(1, len(self.graph.nodes))
        while self.heap:
            neg, _, ri, _, _, key = heapq.heappop(self.heap)
            k = (ri, key)
            if k not in self.live:
                continue
            score = self.live[k]
            self.unlive(k)
            rule = self.rules[ri]
            m = self.matcher.current(rule.pattern, key)
            if m is None:
                continue  # the graph changed under it; its successor (if any) was offered
            self.decided.add(k)
            conflict = check_overlap(m.nodes, self.owner) or \
                check_resources(m.nodes, self.graph, self.limits) or \
                check_dependencies(m.nodes, self.graph, self.matcher.pos, self.deps)
            if conflict is not None:
                self.record(rule, m, REFUSED, conflict.kind, conflict.reason, score)
                self.matcher.ban(rule.pattern, m, conflict.culprits or None)
                self.offer(ri)
                continue
            if rule.is_rewrite:
                self.apply_rewrite(rule, m, score)
                if self.out.rewrites > budget:
                    raise ModelError(f"rewrite rules did not reach a fixed point after {self.out.rewrites} "
                                     f"rewrites (last rule '{rule.name}')")
            else:
                self.apply_group(rule, m, score)
            self.offer_all()
        return self.out

    def apply_group(self, rule: Rule, m, score: float) -> None:
        anchor = rule.anchor_node(m)
        name = f"{rule.name}_{anchor.name}"
        k = 1
        while name in self.group_names:
            k += 1
            name = f"{rule.name}_{anchor.name}_{k}"
        self.group_names.add(name)
        group = FusionGroup(name, list(m.nodes), rule.kind, anchor, {"rule": rule.name, "score": score})
        self.out.groups.append(group)
        for n in m.nodes:
            self.owner[id(n)] = name
        self.record(rule, m, FUSED, "", f"{len(m.nodes)} ops into one kernel", score, name)
        self.displace(m.nodes, rule, name, "was fused")
        self.matcher.block(m.nodes)

    def apply_rewrite(self, rule: Rule, m, score: float) -> None:
        t0 = time.perf_counter()
        rep = rule.action(m)
        if not isinstance(rep, Replacement):
            reason = rep if isinstance(rep, str) else f"rule '{rule.name}' produced no replacement"
            self.record(rule, m, REFUSED, REWRITE, reason, score)
            self.matcher.ban(rule.pattern, m)
            return
        root = m.outputs(self.graph)
        base = rep.name or (root[0].producer.name if len(root) == 1 else m.nodes[-1].name)
        done = apply_replacement(self.graph, m, rep, self.matcher.pos, f"{base}_{rep.op_type.lower()}")
        self.out.stats[rule.name].seconds += time.perf_counter() - t0
        if isinstance(done, str):
            self.record(rule, m, REFUSED, REWRITE, done, score)
            self.matcher.ban(rule.pattern, m)
            return
        self.out.rewrites += 1
        self.record(rule, m, REWRITTEN, "", f"replaced by {rep.op_type} '{done.node.name}'", score)
        self.displace(m.nodes, rule, None, "was rewritten")
        self.matcher.update(added=[done.node], removed=done.removed, touched=done.touched,
                            positions={id(done.node): done.position})


class _Stale:
    """Stand-in for a match the graph no longer holds (only its node names are recorded)."""

    def __init__(self, key, graph):
        ids = set(key)
        self.nodes = [n for n in graph.nodes if id(n) in ids]


def apply_rules(graph, rules: list[Rule], *, pass_name: str = "rules", limits: ResourceLimits | None = None,
                deps: DependencyRules | None = None, disabled=frozenset(),
                record: Callable[[Decision], None] | None = None, max_repeat: int | None = None) -> RuleOutcome:
    """Match, check, resolve and apply ``rules`` on ``graph`` (rewrites edit it in place).

    Repetitions grow only up to ``limits.max_ops`` nodes: a chain longer than the group limit
    is offered as windows that fit, instead of being refused and cut down one op at a time.
    """
    limits = limits or ResourceLimits()
    if max_repeat is None:
        max_repeat = MAX_REPEAT
    engine = _Engine(graph, list(rules), pass_name, limits, deps or DependencyRules(), frozenset(disabled),
                     record, max_repeat)
    return engine.run()


def build_plan(graph, groups: list[FusionGroup]) -> FusionPlan:
    """Groups plus one singleton group per remaining node, in a topological order of groups."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    owner: dict[int, FusionGroup] = {}
    all_groups: list[FusionGroup] = []
    for g in groups:
        g.nodes.sort(key=lambda n: pos[id(n)])
        all_groups.append(g)
        for n in g.nodes:
            owner[id(n)] = g
    for n in graph.nodes:
        if id(n) not in owner:
            g = FusionGroup(n.name, [n], "single", n)
            all_groups.append(g)
            owner[id(n)] = g
    # Kahn's algorithm over the group graph; ready groups leave in order of their first node.
    succ: dict[int, set[int]] = {id(g): set() for g in all_groups}
    indeg: dict[int, int] = {id(g): 0 for g in all_groups}
    for g in all_groups:
        for n in g.nodes:
            for v in n.input_values():
                if v.producer is not None:
                    p = owner[id(v.producer)]
                    if p is not g and id(g) not in succ[id(p)]:
                        succ[id(p)].add(id(g))
                        indeg[id(g)] += 1
    by_id = {id(g): g for g in all_groups}
    ready = [(pos[id(g.nodes[0])], id(g)) for g in all_groups if indeg[id(g)] == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, gid = heapq.heappop(ready)
        ordered.append(by_id[gid])
        for s in succ[gid]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (pos[id(by_id[s].nodes[0])], s))
    if len(ordered) != len(all_groups):
        raise ModelError("fusion groups form a cycle (a rule admitted a non-convex group)")
    plan = FusionPlan(graph, ordered)
    plan.verify()
    return plan


__all__ = ["apply_rules", "build_plan", "RuleOutcome", "MAX_REWRITES_PER_NODE"]
