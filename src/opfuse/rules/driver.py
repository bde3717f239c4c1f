"""The one fusion driver: run the fusion rules and form the candidate groups.

    plan, decisions = form_groups(graph, fusion_rules(), FusionOptions())

From one group per op, each rule in priority order (highest first; the library's order
breaks ties) matches its pattern over the graph; its action (``Fuse``) proposes *sites*, one
at a time, each seeing the groups formed so far. Every site is judged in the same three
steps, and each refusal is logged with its reason:

1. the rule's condition (the family's own legality: "only elementwise ops follow a Conv",
   "the Concat joins the channel axis", ...);
2. the one legality (``opfuse.rules.legality.Legality``: kernel shape by op categories,
   resource limits, no cycle through an outside path; for siblings the horizontal conditions);
3. disabled by the user (``FusionOptions.disabled``): a disabled rule still logs what it would
   have fused, so ``opfuse explain`` can say so.

A site that passes is merged (``Partition.union``) and the group records the rule that formed
it (``attrs["rule"]``). The result is the rules' maximal grouping; the planner
(``opfuse.planner``) then chooses among these candidates and their legal parts with the cost
model. The plan is verified (``verify_plan``) before it is returned.
"""
from __future__ import annotations

import time
from typing import Sequence

from opfuse.ir.graph import Graph, Node
from opfuse.ir.plan import FusionPlan
from opfuse.patterns import find_matches
from opfuse.rules.aliasing import mark_views
from opfuse.rules.decisions import Decision, FusionLog, Refusal, RuleStats, disabled
from opfuse.rules.kernel_shape import GroupShape
from opfuse.rules.legality import Legality
from opfuse.rules.options import FusionOptions
from opfuse.rules.partition import Partition
from opfuse.rules.plan_check import verify_plan
from opfuse.rules.postdom import immediate_post_dominators
from opfuse.rules.rule import Fuse, Rule
from opfuse.rules.site import Site


class Grouping:
    """What the actions and conditions see: the partition, the legality, the post-dominators."""

    def __init__(self, graph: Graph, options: FusionOptions):
        self.graph = graph
        self.options = options
        self.p = Partition(graph)
        self.legality = Legality(self.p, options)
        self.ipdom = immediate_post_dominators(graph)
        self.log = FusionLog()
        self.stats: dict[str, RuleStats] = {}
        self.facts: dict = {}  # what a rule keeps across its sites (e.g. values already aliased)

    def judge(self, rule: Rule, site: Site) -> tuple[GroupShape, dict] | Refusal | None:
        """Steps 1 and 2 of the module docstring: the shape (and attributes) to merge into, the
        refusal, or ``None`` for a site that marks a group (``site.apply``) and passed."""
        if site.refusal is not None:
            return site.refusal
        if rule.condition is not None:
            r = rule.condition(self, site)
            if r is not None:
                return r
        if site.apply is not None:
            return None
        if site.shared is not None:
            dom = self.legality.horizontal(site.gids, site.shared)
            if isinstance(dom, Refusal):
                return dom
            return self.legality.horizontal_shape(site.gids, site.shared, dom)
        shape = self.legality.vertical(site.gids)
        return shape if isinstance(shape, Refusal) else (shape, {})

    def run(self, rule: Rule) -> None:
        t0 = time.perf_counter()
        stats = self.stats.setdefault(rule.name, RuleStats(rule.name))
        seeds = find_matches(self.graph, rule.pattern)
        order = self.p.order
        seeds.sort(key=lambda m: min(order[id(n)] for n in m.nodes))
        stats.attempts += len(seeds)
        if not isinstance(rule.action, Fuse):
            raise TypeError(f"'{rule.name}' is a rewrite rule: the fusion driver runs fusion rules (action Fuse)")
        for site in rule.action.propose(self, seeds):
            stats.matches += 1
            verdict = self.judge(rule, site)
            if isinstance(verdict, Refusal) or self.options.is_disabled(rule.name):
                stats.refused += 1
                self.log.refused(rule.name, site.names, verdict if isinstance(verdict, Refusal)
                                 else disabled(rule.name))
                continue
            stats.applied += 1
            if verdict is None:
                assert site.apply is not None
                site.apply(self, site)
            else:
                shape, attrs = verdict
                gid = self.p.union(site.gids, shape, {**attrs, "rule": rule.name})
                site.facts["gid"] = gid
            self.log.taken(rule.name, site.names, site.detail)
        stats.seconds += time.perf_counter() - t0


def form_groups(graph: Graph, rules: Sequence[Rule], options: FusionOptions | None = None,
                origin: dict[str, list[str]] | None = None,
                stats: dict[str, RuleStats] | None = None) -> tuple[FusionPlan, list[Decision]]:
    """Run the fusion ``rules`` over ``graph``; returns the verified plan and the decisions
    (per-rule statistics are added to ``stats`` when given)."""
    grouping = Grouping(graph, options or FusionOptions())
    if stats is not None:
        grouping.stats = stats
    ranked = sorted(range(len(rules)), key=lambda i: (-rules[i].priority, i))
    for i in ranked:
        grouping.run(rules[i])
    plan = grouping.p.to_plan(origin)
    mark_views(plan, grouping.log)
    verify_plan(plan)
    return plan, grouping.log.decisions


def unfused_plan(graph: Graph) -> FusionPlan:
    """One group per op, with the same attributes ``form_groups`` records: the baseline."""
    plan = Partition(graph).to_plan({n.name: [n.name] for n in graph.nodes})
    verify_plan(plan)
    return plan


def seed_nodes(matches) -> list[Node]:
    """The first node of each match (single-op seed patterns), in the order given."""
    return [m.nodes[0] for m in matches]


__all__ = ["Grouping", "form_groups", "unfused_plan", "seed_nodes"]
