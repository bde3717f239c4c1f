"""The one decision vocabulary: why a fusion or rewrite happened or did not.

Every rule, legality check and conflict answers "may I?" with ``None`` (yes) or a
``Refusal(kind, reason, culprits)``; every attempt ends in one ``Decision`` record. The decision
log, the rule statistics, the fusion report and ``opfuse explain`` are all built from these.

Refusal kinds (``RefusalKind``; the value is what the decision log stores, the label is what
``opfuse explain`` prints):

    condition   the rule's own condition said no (shape, constant, sharing, ...)
    category    the op categories cannot share one kernel (TVM's rules: no Conv -> Conv, ...)
    dependency  fusing would create a cycle through an outside path, or break an in-place or
                random-number ordering
    resource    the group would exceed a configured limit (``opfuse.rules.options``)
    overlap     a node was already taken by a group or rewrite chosen first
    rewrite     the rewrite itself declined (e.g. the new op would infer another type)
    disabled    the user disabled the rule or pass
    not_chosen  legal, but the planner's cost model chose a plan without it
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

FUSED = "fused"
REWRITTEN = "rewritten"
REFUSED = "refused"


class RefusalKind(str, Enum):
    CONDITION = "condition"
    CATEGORY = "category"
    DEPENDENCY = "dependency"
    RESOURCE = "resource"
    OVERLAP = "overlap"
    REWRITE = "rewrite"
    DISABLED = "disabled"
    NOT_CHOSEN = "not_chosen"

    @property
    def label(self) -> str:
        """The wording ``opfuse explain`` uses."""
        return _LABELS[self]


_LABELS = {RefusalKind.CONDITION: "rule refused", RefusalKind.CATEGORY: "category forbids",
           RefusalKind.DEPENDENCY: "cycle", RefusalKind.RESOURCE: "resource limit",
           RefusalKind.OVERLAP: "overlap", RefusalKind.REWRITE: "rewrite declined",
           RefusalKind.DISABLED: "disabled by user", RefusalKind.NOT_CHOSEN: "not chosen"}


@dataclass(frozen=True)
class Refusal:
    """Why something may not be fused or rewritten.

    ``culprits`` are the nodes that make it illegal: the rewrite engine does not offer again a
    match holding all of them; empty means this attempt only.
    """

    kind: RefusalKind
    reason: str
    culprits: tuple = ()

    def __str__(self) -> str:
        return f"{self.kind.label}: {self.reason}"


def refuse(reason: str, *culprits) -> Refusal:
    """A rule's condition saying no (kind ``condition``), naming the nodes at fault."""
    return Refusal(RefusalKind.CONDITION, reason, tuple(culprits))


def disabled(rule: str) -> Refusal:
    return Refusal(RefusalKind.DISABLED, f"rule '{rule}' is disabled")


@dataclass
class Decision:
    pass_name: str
    rule: str
    verdict: str                    # fused | rewritten | refused
    nodes: tuple[str, ...]
    kind: str = ""                  # RefusalKind value (empty when taken)
    reason: str = ""                # why refused, or what was done
    score: float | None = None
    group: str | None = None        # the group formed, or the group that won an overlap

    @property
    def taken(self) -> bool:
        return self.verdict != REFUSED

    @property
    def label(self) -> str:
        """The refusal's ``opfuse explain`` wording ("" when taken)."""
        return "" if self.taken else RefusalKind(self.kind).label

    def to_dict(self) -> dict:
        return {"pass": self.pass_name, "rule": self.rule, "verdict": self.verdict, "kind": self.kind,
                "reason": self.reason, "nodes": list(self.nodes),
                "score": None if self.score is None else round(self.score, 6), "group": self.group}

    def __str__(self) -> str:
        what = self.verdict if self.taken else f"refused ({self.kind})"
        tail = f": {self.reason}" if self.reason else ""
        return f"[{self.pass_name}] {self.rule} {what} at {', '.join(self.nodes)}{tail}"


def taken(pass_name: str, rule: str, nodes, detail: str = "", verdict: str = FUSED,
          group: str | None = None) -> Decision:
    """A rule applied: ``verdict`` is ``FUSED`` (a group) or ``REWRITTEN`` (a graph rewrite)."""
    return Decision(pass_name=pass_name, rule=rule, verdict=verdict, nodes=tuple(nodes), reason=detail,
                    group=group)


def refused(pass_name: str, rule: str, nodes, refusal: Refusal) -> Decision:
    return Decision(pass_name=pass_name, rule=rule, verdict=REFUSED, nodes=tuple(nodes),
                    kind=refusal.kind.value, reason=refusal.reason)


@dataclass
class RuleStats:
    """Attempts (anchor nodes the matcher tried), matches offered, applications, refusals, time."""

    rule: str
    attempts: int = 0
    matches: int = 0
    applied: int = 0
    refused: int = 0
    seconds: float = 0.0

    def add(self, other: "RuleStats") -> None:
        self.attempts += other.attempts
        self.matches += other.matches
        self.applied += other.applied
        self.refused += other.refused
        self.seconds += other.seconds

    def to_dict(self) -> dict:
        return {"rule": self.rule, "attempts": self.attempts, "matches": self.matches,
                "applied": self.applied, "refused": self.refused, "seconds": round(self.seconds, 6)}


FUSE_PASS = "fuse"  # the pass that runs the fusion rules


class FusionLog:
    """Decisions in the order they were made, each once (a rule revisiting a site logs nothing new)."""

    def __init__(self, pass_name: str = FUSE_PASS):
        self.pass_name = pass_name
        self.decisions: list[Decision] = []
        self._seen: set = set()

    def add(self, d: Decision) -> None:
        key = (d.rule, d.nodes, d.verdict, d.reason)
        if key not in self._seen:
            self._seen.add(key)
            self.decisions.append(d)

    def taken(self, rule: str, nodes, detail: str = "", group: str | None = None) -> None:
        self.add(taken(self.pass_name, rule, nodes, detail, group=group))

    def refused(self, rule: str, nodes, refusal: Refusal) -> None:
        self.add(refused(self.pass_name, rule, nodes, refusal))


__all__ = ["RefusalKind", "Refusal", "refuse", "disabled", "Decision", "FusionLog", "RuleStats", "FUSED",
           "REWRITTEN", "REFUSED", "FUSE_PASS", "taken", "refused"]
