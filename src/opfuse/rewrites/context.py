"""``RewriteContext``: what every rewrite pass shares: options, provenance and the decision log."""
from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.rules.decisions import REWRITTEN, Decision, Refusal, refused, taken
from opfuse.rules.options import FusionOptions
from opfuse.rewrites.edit import Provenance


@dataclass
class RewriteContext:
    options: FusionOptions
    provenance: Provenance
    decisions: list[Decision] = field(default_factory=list)
    pass_name: str = "rewrite"  # the stage now running: its decisions are recorded under it
    rule_stats: dict = field(default_factory=dict)  # rule name -> the pattern engine's RuleStats
    _seen: set = field(default_factory=set)

    def log_refusal(self, rule: str, nodes, refusal: Refusal) -> None:
        key = (rule, tuple(nodes), refusal.reason)
        if key not in self._seen:
            self._seen.add(key)
            self.decisions.append(refused(self.pass_name, rule, nodes, refusal))

    def log_applied(self, rule: str, nodes, detail: str) -> None:
        self.decisions.append(taken(self.pass_name, rule, nodes, detail, REWRITTEN))
