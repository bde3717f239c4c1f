"""The rewrite engine: the seed's greedy by ``score = benefit / cost * priority`` (7.2.3).

``apply_rules`` runs a set of rewrite rules (recognition, BatchNorm and affine folding) over a
graph, editing it in place:

1. every rule's maximal matches are offered; a rule's condition may refuse one (recorded);
2. the legal matches wait in a priority queue ordered by score, then by size (larger first),
   then by rule order and graph position, so ties break the same way on every run;
3. the best match is checked for the three conflicts (overlap, resource, dependency). A
   conflict (or a refusing condition) is recorded and *bans* the match in the matcher, so the
   largest matches it contained come forward as new candidates: a chain too long for the limit
   yields its sub-chains. A refusal that names culprit nodes bans every match holding them, so
   a Concat on the wrong axis is refused once, not once per subset of its inputs;
4. otherwise the rewrite is applied: it edits the graph, every waiting match that shares a
   replaced node is refused as an overlap, and the matcher re-matches incrementally around
   the edit.

It ends when the queue is empty. Fusion rules (which form groups rather than edit the graph)
are run by ``opfuse.rules.driver``.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Callable

from opfuse.errors import ModelError
from opfuse.patterns.matcher import MAX_REPEAT, Matcher
from opfuse.rules.conflicts import DependencyRules, check_dependencies, check_resources
from opfuse.rules.decisions import REFUSED, REWRITTEN, Decision, RefusalKind, RuleStats
from opfuse.rules.options import FusionOptions
from opfuse.rules.rewrite import apply_replacement
from opfuse.rules.rule import Fuse, Replacement, Rule, Subgraph

# Rewrites applied by one run before it stops with an error: a rule set whose rewrites keep
# matching their own output never reaches a fixed point; this bounds it per graph node.
MAX_REWRITES_PER_NODE = 4


@dataclass
class RuleOutcome:
    decisions: list[Decision] = field(default_factory=list)
    stats: dict[str, RuleStats] = field(default_factory=dict)
    rewrites: int = 0

    @property
    def modified(self) -> bool:
        return self.rewrites > 0


class _Engine:
    def __init__(self, graph, rules: list[Rule], pass_name: str, limits: FusionOptions,
                 deps: DependencyRules, disabled: frozenset, record: Callable[[Decision], None] | None,
                 max_repeat: int):
        names = [r.name for r in rules]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"rule names must be unique, repeated: {dup}")
        groups = [r.name for r in rules if not r.is_rewrite]
        if groups:
            raise ValueError(f"the rewrite engine takes rewrite rules only; fusion rules {groups} run in "
                             f"opfuse.rules.driver")
        self.graph = graph
        self.rules = rules
        self.pass_name = pass_name
        self.limits = limits
        self.deps = deps
        self.disabled = disabled
        self.record_cb = record
        self.matcher = Matcher(graph, max_repeat=max_repeat, max_nodes=limits.max_ops_per_group)
        self.out = RuleOutcome(stats={r.name: RuleStats(r.name) for r in rules})
        self.heap: list = []
        self.live: dict[tuple, float] = {}            # (rule index, key) -> score
        self.live_by_node: dict[int, set[tuple]] = {}
        self.decided: set[tuple] = set()
        self.counter = 0

    # Recording -------------------------------------------------------------------------------
    def record(self, rule: Rule, m, verdict: str, kind: RefusalKind | None = None, reason: str = "",
               score: float | None = None, group: str | None = None) -> None:
        d = Decision(self.pass_name, rule.name, verdict, tuple(n.name for n in m.nodes),
                     kind.value if kind is not None else "", reason, score, group)
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
                    self.record(rule, m, REFUSED, RefusalKind.DISABLED, f"rule '{rule.name}' is disabled")
                    continue
                t0 = time.perf_counter()
                refusal = rule.check(m)
                st.seconds += time.perf_counter() - t0
                if refusal is not None:
                    self.decided.add(k)
                    self.record(rule, m, REFUSED, refusal.kind, refusal.reason)
                    self.matcher.ban(rule.pattern, m, refusal.culprits or None)
                    banned_any = True
                    continue
                t0 = time.perf_counter()
                score = rule.score(m)
                st.seconds += time.perf_counter() - t0
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
        pos = self.matcher.pos  # graph order (node ids are memory addresses: no order to record by)
        for n in nodes:
            for k in sorted(self.live_by_node.get(id(n), ()), key=lambda x: (x[0], sorted(pos[i] for i in x[1]))):
                if k not in self.live:
                    continue
                score = self.live[k]
                self.unlive(k)
                self.decided.add(k)
                rule = self.rules[k[0]]
                m = self.matcher.current(rule.pattern, k[1]) or _Stale(k[1], [*self.graph.nodes, *nodes], pos)
                self.record(rule, m, REFUSED, RefusalKind.OVERLAP,
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
            conflict = check_resources(m.nodes, self.graph, self.limits) or \
                check_dependencies(m.nodes, self.graph, self.matcher.pos, self.deps)
            if conflict is not None:
                self.record(rule, m, REFUSED, conflict.kind, conflict.reason, score)
                self.matcher.ban(rule.pattern, m, conflict.culprits or None)
                self.offer(ri)
                continue
            self.apply_rewrite(rule, m, score)
            if self.out.rewrites > budget:
                raise ModelError(f"rewrite rules did not reach a fixed point after {self.out.rewrites} "
                                 f"rewrites (last rule '{rule.name}')")
            self.offer_all()
        return self.out

    def apply_rewrite(self, rule: Rule, m, score: float) -> None:
        t0 = time.perf_counter()
        assert not isinstance(rule.action, Fuse)  # the engine takes rewrite rules only (checked at start)
        rep = rule.action(m)
        if not isinstance(rep, (Replacement, Subgraph)):
            reason = rep if isinstance(rep, str) else f"rule '{rule.name}' produced no replacement"
            self.record(rule, m, REFUSED, RefusalKind.REWRITE, reason, score)
            self.matcher.ban(rule.pattern, m)
            return
        root = m.outputs(self.graph)
        base = rep.name or (root[0].producer.name if len(root) == 1 else m.nodes[-1].name)
        done = apply_replacement(self.graph, m, rep, self.matcher.pos, f"{base}_{rep.op_type.lower()}")
        self.out.stats[rule.name].seconds += time.perf_counter() - t0
        if isinstance(done, str):
            self.record(rule, m, REFUSED, RefusalKind.REWRITE, done, score)
            self.matcher.ban(rule.pattern, m)
            return
        self.out.rewrites += 1
        said = rep.reason if isinstance(rep, Subgraph) and rep.reason else \
            f"replaced by {rep.op_type} '{done.node.name}'"
        self.record(rule, m, REWRITTEN, None, said, score)
        self.displace(m.nodes, rule, None, "was rewritten")
        # Several new nodes have no one position to reuse: the matcher renumbers the graph.
        self.matcher.update(added=done.nodes, removed=done.removed, touched=done.touched,
                            positions={id(done.node): done.position} if len(done.nodes) == 1 else None)


class _Stale:
    """Stand-in for a waiting match the matcher no longer holds (only its node names are recorded): its
    nodes, in graph order, among ``nodes`` (the graph's and those the rewrite displacing it just removed)."""

    def __init__(self, key, nodes, pos):
        ids = set(key)
        self.nodes = sorted({id(n): n for n in nodes if id(n) in ids}.values(), key=lambda n: pos[id(n)])


def apply_rules(graph, rules: list[Rule], *, pass_name: str = "rules", limits: FusionOptions | None = None,
                deps: DependencyRules | None = None, disabled=frozenset(),
                record: Callable[[Decision], None] | None = None, max_repeat: int | None = None) -> RuleOutcome:
    """Match, check, resolve and apply ``rules`` on ``graph`` (rewrites edit it in place).

    Repetitions grow only up to ``limits.max_ops_per_group`` nodes: a chain longer than the
    limit is offered as windows that fit, instead of being refused and cut down one op at a time.
    """
    limits = limits or FusionOptions()
    if max_repeat is None:
        max_repeat = MAX_REPEAT
    engine = _Engine(graph, list(rules), pass_name, limits, deps or DependencyRules(), frozenset(disabled),
                     record, max_repeat)
    return engine.run()


__all__ = ["apply_rules", "RuleOutcome", "MAX_REWRITES_PER_NODE"]
