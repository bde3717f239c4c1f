"""Why a fusion or rewrite happened or did not: ``Refusal`` and ``Decision``.

Every rule answers "may I?" with ``None`` (yes) or a ``Refusal`` naming one of the reason
kinds below and a one-line message. The fusion passes and rewrites record each attempt as a
``Decision``, the project's one decision record (``opfuse.rules.decisions.Decision``: pass,
rule, verdict fused/rewritten/refused, nodes, kind, reason), made by ``taken`` and
``refused``; the decision log and ``opfuse explain`` are built from these records, the
latter naming each refusal by its ``ReasonKind`` (``reason_kind``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from opfuse.rules import decisions as engine
from opfuse.rules.decisions import FUSED, REFUSED, REWRITTEN, Decision


class ReasonKind(str, Enum):
    """The kinds of refusal ``opfuse explain`` distinguishes."""

    RULE_REFUSED = "rule refused"          # a rule's condition failed (shape, constant, sharing, ...)
    CATEGORY_FORBIDS = "category forbids"  # the op categories cannot share one kernel (TVM's rules)
    CYCLE = "cycle"                        # merging would create a cycle through an outside path
    RESOURCE_LIMIT = "resource limit"      # the merged group would exceed a configured limit
    DISABLED = "disabled by user"          # the rule or pass was disabled in the context
    NOT_CHOSEN = "not chosen"              # legal, but the greedy order gave the ops to another group


@dataclass(frozen=True)
class Refusal:
    kind: ReasonKind
    message: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.message}"


def refuse(kind: ReasonKind, message: str) -> Refusal:
    return Refusal(kind, message)


def rule_refused(message: str) -> Refusal:
    return Refusal(ReasonKind.RULE_REFUSED, message)


# The one decision record is the rules engine's: a refusal's kind is stored in its vocabulary
# (the decision log's), and mapped back to ``ReasonKind`` for ``opfuse explain``.
ENGINE_KIND = {ReasonKind.RULE_REFUSED: engine.CONDITION, ReasonKind.CATEGORY_FORBIDS: "category",
               ReasonKind.CYCLE: "dependency", ReasonKind.RESOURCE_LIMIT: "resource",
               ReasonKind.DISABLED: engine.DISABLED, ReasonKind.NOT_CHOSEN: "not_chosen"}
EXPLAIN_KIND = {engine: kind.value for kind, engine in ENGINE_KIND.items()}


def taken(pass_name: str, rule: str, nodes, detail: str = "", verdict: str = FUSED) -> Decision:
    """A rule applied: ``verdict`` is ``FUSED`` (a group) or ``REWRITTEN`` (a graph rewrite)."""
    return Decision(pass_name=pass_name, rule=rule, verdict=verdict, nodes=tuple(nodes), reason=detail)


def refused(pass_name: str, rule: str, nodes, refusal: Refusal) -> Decision:
    return Decision(pass_name=pass_name, rule=rule, verdict=REFUSED, nodes=tuple(nodes),
                    kind=ENGINE_KIND[refusal.kind], reason=refusal.message)


def reason_kind(decision: Decision) -> str:
    """The ``ReasonKind`` value of a refused decision ("" when it was taken)."""
    if decision.taken:
        return ""
    return EXPLAIN_KIND.get(decision.kind, decision.kind)


__all__ = ["ReasonKind", "Refusal", "refuse", "rule_refused", "Decision", "FUSED", "REWRITTEN", "REFUSED",
           "ENGINE_KIND", "EXPLAIN_KIND", "taken", "refused", "reason_kind"]
