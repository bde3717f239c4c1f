"""``PassContext``: everything a pipeline run is configured with, and what it reports.

Configuration: disabled passes (by name), the fusion options (``FusionOptions``: the limits
and the disabled rules), dependency rules, named config keys, and instruments. Results: the fusion plan
(left by the fusion pass), every ``Decision`` and per-rule statistics. Instruments observe the
run through hooks (see ``instruments.py``); nothing in a pass prints.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.errors import OpfuseError
from opfuse.ir.plan import FusionPlan
from opfuse.rules.conflicts import DependencyRules
from opfuse.rules.decisions import Decision, RuleStats
from opfuse.rules.options import FusionOptions


class OptionError(OpfuseError):
    """A bad compiler option: an unknown rule or pass name, an unusable output path."""


# Named config keys a pass reads from ``PassContext.config``.
CONFIG_MAX_REPEAT = "matcher.max_repeat"   # longest repetition the matcher unrolls


@dataclass
class PassContext:
    disabled_passes: frozenset = frozenset()
    options: FusionOptions = field(default_factory=FusionOptions)
    dependencies: DependencyRules = field(default_factory=DependencyRules)
    instruments: list = field(default_factory=list)
    config: dict = field(default_factory=dict)
    # Results of the run.
    plan: FusionPlan | None = None  # the fusion rules' candidate plan, left by the fuse pass
    origin: dict | None = None  # rewritten node name -> the original nodes it stands for
    decisions: list[Decision] = field(default_factory=list)
    rule_stats: dict[str, RuleStats] = field(default_factory=dict)

    def __post_init__(self):
        self.disabled_passes = frozenset(self.disabled_passes)

    def record(self, decision: Decision) -> None:
        self.decisions.append(decision)
        for inst in self.instruments:
            inst.on_decision(self, decision)

    def merge_stats(self, stats: dict[str, RuleStats]) -> None:
        for name, s in stats.items():
            self.rule_stats.setdefault(name, RuleStats(name)).add(s)

    def instrument(self, kind: type):
        """The first attached instrument of this type, or None."""
        for inst in self.instruments:
            if isinstance(inst, kind):
                return inst
        return None


__all__ = ["PassContext", "OptionError", "CONFIG_MAX_REPEAT"]
