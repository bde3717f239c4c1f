"""``FusionLog``: the fusion passes' decisions, in the order they were made (deduplicated)."""
from __future__ import annotations

from opfuse.fusion.decisions import Decision, ReasonKind, Refusal, refused, taken

FUSE_PASS = "fuse"  # the pass that runs the grouping rules (``opfuse.passes.fuse_pipeline``)


class FusionLog:
    def __init__(self, pass_name: str = FUSE_PASS):
        self.pass_name = pass_name
        self.decisions: list[Decision] = []
        self._seen: set = set()

    def _add(self, d: Decision) -> None:
        key = (d.rule, d.nodes, d.verdict, d.reason)
        if key not in self._seen:
            self._seen.add(key)
            self.decisions.append(d)

    def taken(self, rule: str, nodes, detail: str = "") -> None:
        self._add(taken(self.pass_name, rule, nodes, detail))

    def refused(self, rule: str, nodes, refusal: Refusal) -> None:
        self._add(refused(self.pass_name, rule, nodes, refusal))

    def disabled(self, rule: str, nodes) -> None:
        self.refused(rule, nodes, Refusal(ReasonKind.DISABLED, f"rule '{rule}' is disabled"))
