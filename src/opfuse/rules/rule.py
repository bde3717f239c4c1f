"""``Rule``: the seed's fusion rule, pattern + condition + action + priority + benefit/cost.

    Rule("conv_bn_act",
         pattern=Op("BatchNormalization")(Op("Conv").named("conv")) >> Op(tag="activation"),
         condition=bn_statistics_are_constant,       # Match -> None (legal) or a reason string
         action=GROUP,                                # or a rewrite: Match -> Replacement | str
         priority=2.0)

* ``condition`` decides legality only (may these ops share one kernel / may this subgraph be
  replaced?) and explains a refusal in one line: ``None``, a reason string, or
  ``refuse(reason, *culprit_nodes)`` naming the nodes at fault (then no match containing them is
  offered again). Whether a fusion pays off is the planner's business.
* ``action`` is ``GROUP`` (the match becomes one ``FusionGroup``) or a *rewrite*: a pure
  function of the match returning a ``Replacement`` (one new op replacing the match's escaping
  output) or a reason string when it declines.
* ``score(m) = benefit(m) / cost(m) * priority`` orders conflicting matches (the seed's greedy,
  7.2.3). The default benefit is the main-memory traffic fusion removes: every byte of a value
  that stays inside the group is written once and read once less. The default cost is the
  op count, a proxy for the registers and compile complexity one kernel body takes.

Rule sets are plain lists: ``recognition_rules() + [my_rule]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from opfuse.patterns.match import Match
from opfuse.patterns.pattern import Pattern

GROUP = "group"

# Each byte kept on chip saves one write and one read of main memory.
TRAFFIC_PER_INTERNAL_BYTE = 2
# Floor of the cost so a score is finite for any match.
MIN_COST = 1.0


@dataclass
class Replacement:
    """What a rewrite puts in place of a match: one op computing the match's escaping output.

    ``inputs`` are existing values, ``None`` for an absent optional input, or NumPy arrays
    (added to the graph as constants). ``replaces`` is the value the new op's output stands
    for; by default the one output of the match read outside it.
    """

    op_type: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    replaces: object | None = None
    name: str | None = None


def internal_bytes(m: Match) -> int:
    """Bytes of values produced and consumed only inside the match."""
    graph = m.graph
    outs = {id(v) for v in m.outputs(graph)} if graph is not None else set()
    return sum(v.nbytes for n in m.nodes for v in n.outputs if id(v) not in outs)


def default_benefit(m: Match) -> float:
    return float(TRAFFIC_PER_INTERNAL_BYTE * internal_bytes(m))


def default_cost(m: Match) -> float:
    return max(MIN_COST, float(len(m.nodes)))


@dataclass(frozen=True)
class Refusal:
    """Why a match may not be fused or rewritten.

    ``culprits`` are the nodes that make it illegal: every match containing all of them is
    refused with it (the engine does not offer those again); empty means this match only, so its
    largest parts are offered next (a chain too long, a shape mismatch at one end).
    """

    reason: str
    culprits: tuple = ()

    def __str__(self) -> str:
        return self.reason


def refuse(reason: str, *culprits) -> Refusal:
    return Refusal(reason, tuple(culprits))


@dataclass(eq=False)
class Rule:
    name: str
    pattern: Pattern
    condition: Callable[[Match], "Refusal | str | None"] | None = None
    action: Callable[[Match], "Replacement | str | None"] | str = GROUP
    priority: float = 1.0
    benefit: Callable[[Match], float] = default_benefit
    cost: Callable[[Match], float] = default_cost
    kind: str = "fused"            # the FusionGroup kind (elementwise, conv_epilogue, attention, ...)
    anchor: str | None = None      # capture naming the node a kernel is built around
    description: str = ""

    @property
    def is_rewrite(self) -> bool:
        return self.action != GROUP

    def check(self, m: Match) -> Refusal | None:
        """None when the match may be fused/rewritten, else why not (a reason string from the
        condition becomes a ``Refusal`` of this match only)."""
        if self.condition is None:
            return None
        got = self.condition(m)
        if got is None or isinstance(got, Refusal):
            return got
        return Refusal(str(got))

    def score(self, m: Match) -> float:
        """benefit / cost * priority (the seed's greedy score)."""
        cost = max(MIN_COST, float(self.cost(m)))
        return float(self.benefit(m)) / cost * float(self.priority)

    def anchor_node(self, m: Match):
        """The node the group is built around: the named capture, else the first fusable op."""
        if self.anchor is not None:
            got = m.get(self.anchor)
            if isinstance(got, list):
                got = got[0] if got else None
            if got is not None:
                return got
        from opfuse.ops.registry import REGISTRY, Category
        for n in m.nodes:
            spec = REGISTRY.get(n.op_type)
            if spec is not None and spec.category in (Category.OUT_ELEMWISE_FUSABLE, Category.REDUCTION):
                return n
        return m.nodes[0]

    def __repr__(self) -> str:
        return f"Rule({self.name!r}, {self.pattern!r})"


# Helpers conditions use -----------------------------------------------------------------------

def scalar(value) -> float | None:
    """The number every element of a constant holds, or None (not a constant, or not uniform)."""
    if value is None or value.const is None or value.const.size == 0:
        return None
    flat = np.asarray(value.const, dtype=np.float64).ravel()
    if not np.all(flat == flat[0]):
        return None
    return float(flat[0])


def close(a: float | None, b: float, rtol: float) -> bool:
    return a is not None and abs(a - b) <= rtol * max(abs(b), 1.0)


def outside_readers(values, inside: set[int], graph) -> str | None:
    """Name the first reader outside ``inside`` (node ids) of any value, or 'graph output'."""
    for v in values:
        if graph is not None and v in graph.outputs:
            return f"'{v.name}' is a graph output"
        for user, _ in v.uses:
            if id(user) not in inside:
                return f"'{v.name}' is also read by '{user.name}'"
    return None


def rule_names(rules) -> list[str]:
    return [r.name for r in rules]


__all__ = ["Rule", "Refusal", "refuse", "GROUP", "Replacement", "default_benefit", "default_cost", "internal_bytes", "scalar",
           "close", "outside_readers", "rule_names", "TRAFFIC_PER_INTERNAL_BYTE", "MIN_COST"]
