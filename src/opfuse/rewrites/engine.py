"""Run pattern rules (``opfuse.rules.Rule``) as graph rewrites, keeping provenance and decisions.

The rules engine (``opfuse.rules.resolve.apply_rules``) matches each rule's pattern, asks its
condition, resolves conflicts by score and applies the winning rewrites (each replaces one
escaping value by one new op that keeps the value's name). This adapter

* passes the user's disabled rules and the ops-per-group limit;
* re-records every engine decision under the running rewrite stage, with its kind;
* records provenance: the new node stands for every original node the match covered.
"""
from __future__ import annotations

from opfuse.ir.graph import Graph
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import rename_node
from opfuse.rules.decisions import REFUSED, Refusal, RefusalKind
from opfuse.rules.resolve import apply_rules
from opfuse.rules.rule import Replacement, Rule, Subgraph

def _tracked(rule: Rule, graph: Graph, targets: dict) -> Rule:
    """A copy of ``rule`` whose action remembers which value each match's replacement takes over."""
    inner = rule.action

    def action(m):
        rep = inner(m)
        if isinstance(rep, (Replacement, Subgraph)):
            target = rep.replaces if rep.replaces is not None else m.outputs(graph)[0]
            targets[tuple(n.name for n in m.nodes)] = (target.name, rep.name, tuple(getattr(rep, "absorbs", ())))
        return rep

    return Rule(rule.name, rule.pattern, rule.condition, action, rule.priority, rule.benefit, rule.cost,
                rule.kind, rule.anchor, rule.description)


def run_pattern_rules(graph: Graph, rules: list[Rule], rc: RewriteContext, pass_name: str) -> bool:
    """Apply rewrite ``rules`` to ``graph`` in place; returns whether it changed."""
    targets: dict[tuple, tuple[str, str | None, tuple]] = {}

    def record(d) -> None:
        if d.verdict == REFUSED:
            rc.log_refusal(d.rule, d.nodes, Refusal(RefusalKind(d.kind), d.reason))
            return
        value_name, wanted, absorbs = targets.get(d.nodes, ("", None, ()))
        new = graph.values[value_name].producer if value_name in graph.values else None
        if new is not None:
            # The engine suffixes new node names with the op type; the rule's chosen name is
            # free again once the matched nodes are gone.
            if wanted:
                rename_node(graph, new, wanted)
            rc.provenance.absorb(new, tuple(d.nodes) + absorbs)
        rc.log_applied(d.rule, d.nodes, d.reason)

    limits = rc.options.with_(max_group_inputs=None)
    outcome = apply_rules(graph, [_tracked(r, graph, targets) for r in rules], pass_name=pass_name,
                          limits=limits, disabled=rc.options.disabled, record=record)
    rc.rule_stats.update(outcome.stats)
    return outcome.modified
