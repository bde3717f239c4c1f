"""Passes that run rule sets: ``RewritePass`` (edits the graph) and ``FusePass`` (plans groups).

Both hand the context's disabled rules, limits and dependency rules to the rule engine
(``opfuse.rules.resolve``), record every decision on the context and merge per-rule statistics.
"""
from __future__ import annotations

from opfuse.passes.base import Pass
from opfuse.passes.context import CONFIG_MAX_REPEAT
from opfuse.rules.resolve import apply_rules, build_plan


def _run_rules(name: str, graph, rules, ctx):
    outcome = apply_rules(graph, rules, pass_name=name, limits=ctx.limits, deps=ctx.dependencies,
                          disabled=ctx.disabled_rules, record=ctx.record,
                          max_repeat=ctx.config.get(CONFIG_MAX_REPEAT))
    ctx.merge_stats(outcome.stats)
    return outcome


class RewritePass(Pass):
    """Apply rewrite rules until none matches (in place); verifies the result."""

    def __init__(self, name: str, rules):
        self.name = name
        self.rules = list(rules)
        bad = [r.name for r in self.rules if not r.is_rewrite]
        if bad:
            raise ValueError(f"RewritePass '{name}' got group rules {bad}")

    def run(self, graph, ctx):
        outcome = _run_rules(self.name, graph, self.rules, ctx)
        if outcome.modified:
            graph.remove_unused_values()
            graph.verify()
        return graph, outcome.modified


class FusePass(Pass):
    """Resolve group rules into a ``FusionPlan`` (left on ``ctx.plan``); the graph is unchanged."""

    def __init__(self, name: str, rules):
        self.name = name
        self.rules = list(rules)
        bad = [r.name for r in self.rules if r.is_rewrite]
        if bad:
            raise ValueError(f"FusePass '{name}' got rewrite rules {bad}")

    def run(self, graph, ctx):
        outcome = _run_rules(self.name, graph, self.rules, ctx)
        ctx.plan = build_plan(graph, outcome.groups)
        return graph, False


__all__ = ["RewritePass", "FusePass"]
