"""What the rule engine did and why: ``Decision`` records and per-rule ``RuleStats``.

Every match a rule offers ends in exactly one decision: ``fused`` (it became a group),
``rewritten`` (it was replaced by a new op) or ``refused`` with a kind and a one-line reason:

    condition   the rule's legality check said no (the reason is the rule's)
    overlap     a node was already taken by a group or rewrite chosen first (higher score)
    resource    the group would exceed a configured limit
    dependency  fusing would create a cycle or break an in-place / RNG ordering
    rewrite     the rewrite itself declined (e.g. the new op would infer another type)
    disabled    the user disabled the rule
"""
from __future__ import annotations

from dataclasses import dataclass

FUSED = "fused"
REWRITTEN = "rewritten"
REFUSED = "refused"

CONDITION = "condition"
REWRITE = "rewrite"
DISABLED = "disabled"


@dataclass
class Decision:
    pass_name: str
    rule: str
    verdict: str                    # fused | rewritten | refused
    nodes: tuple[str, ...]
    kind: str = ""                  # refusal kind (empty when taken)
    reason: str = ""                # why refused, or what was done
    score: float | None = None
    group: str | None = None        # the group formed, or the group that won an overlap

    @property
    def taken(self) -> bool:
        return self.verdict != REFUSED

    def to_dict(self) -> dict:
        return {"pass": self.pass_name, "rule": self.rule, "verdict": self.verdict, "kind": self.kind,
                "reason": self.reason, "nodes": list(self.nodes),
                "score": None if self.score is None else round(self.score, 6), "group": self.group}

    def __str__(self) -> str:
        what = self.verdict if self.taken else f"refused ({self.kind})"
        tail = f": {self.reason}" if self.reason else ""
        return f"[{self.pass_name}] {self.rule} {what} at {', '.join(self.nodes)}{tail}"


@dataclass
class RuleStats:
    """Attempts (anchor nodes the matcher tried), matches offered, applications, refusals, time."""

    rule: str
    attempts: int = 0
    matches: int = 0
    applied: int = 0
    refused: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"rule": self.rule, "attempts": self.attempts, "matches": self.matches,
                "applied": self.applied, "refused": self.refused, "seconds": round(self.seconds, 6)}


__all__ = ["Decision", "RuleStats", "FUSED", "REWRITTEN", "REFUSED", "CONDITION", "REWRITE", "DISABLED"]
