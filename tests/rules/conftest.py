"""The ``decide`` fixture: run a rule set on a graph and look at its decisions."""
from __future__ import annotations

import pytest

from opfuse.rules import apply_rules


class Outcome:
    def __init__(self, graph, rules, **kw):
        self.graph = graph
        self.result = apply_rules(graph, rules, **kw)
        self.decisions = self.result.decisions

    def taken(self, rule: str) -> list[list[str]]:
        return [list(d.nodes) for d in self.decisions if d.rule == rule and d.taken]

    def refused(self, rule: str, kind: str | None = None) -> list[str]:
        return [d.reason for d in self.decisions
                if d.rule == rule and not d.taken and (kind is None or d.kind == kind)]

    def ops(self) -> list[str]:
        return [n.op_type for n in self.graph.nodes]


@pytest.fixture
def decide():
    return Outcome
