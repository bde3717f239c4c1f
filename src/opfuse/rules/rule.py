"""``Rule``: the seed's rule, pattern + condition + action + priority (+ benefit/cost).

Two kinds of rule share this shape:

* **fusion rules** (``opfuse.rules.library.fusion_rules()``: attention, epilogues, elementwise
  chains, Concat aliasing, horizontal siblings, ...): the ``action`` is a ``Fuse``: from the
  pattern's matches it proposes *sites* (groups to merge); the ``condition`` judges a site
  (``Site -> Refusal | None``); the driver (``opfuse.rules.driver``) runs the rules in
  priority order, asks the one legality (``opfuse.rules.legality``) and forms the groups;

      Rule("epilogue", pattern=Op(category=ANCHOR_CATEGORIES), condition=accepts_epilogue,
           action=Fuse(grow_to_post_dominator), priority=5)

* **rewrite rules** (recognition of LayerNorm/GELU/SiLU, BatchNorm folding): the ``action`` is
  a pure function of the match returning a ``Replacement`` (one new op replacing the match's
  escaping output), a ``Subgraph`` (several new ops: the integer conv and matmul) or a reason
  string when it declines; the ``condition`` takes the ``Match``.
  The rewrite engine (``opfuse.rules.resolve``) resolves conflicting matches by
  ``score(m) = benefit(m) / cost(m) * priority`` (the seed's greedy, 7.2.3). The default
  benefit is the main-memory traffic removed: every byte of a value that stays inside is
  written once and read once less; the default cost is the op count.

A condition decides legality only and explains a refusal in one line: ``None``, a reason
string, or ``refuse(reason, *culprit_nodes)``. Whether a fusion pays off is the planner's
business. Rule sets are plain lists: ``recognition_rules() + [my_rule]``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from opfuse.ir.graph import Graph, Value
from opfuse.patterns.match import Match
from opfuse.patterns.pattern import Pattern
from opfuse.rules.decisions import Refusal, refuse

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


@dataclass
class Subgraph:
    """What a rewrite puts in place of a match when one op is not enough: several ops computing the
    match's escaping output (an integer conv is ``Cast -> Sub -> Conv -> Add -> Requantize``).

    ``graph`` is a scratch ``Graph`` holding the new nodes in topological order, the constants they
    read, and stand-ins for the values of the real graph they read; ``bindings`` maps each
    stand-in's name to the real value. ``output`` (a value of ``graph``) takes over the escaping
    output ``replaces`` (by default the one output of the match read outside it) and its name.
    The new nodes and values keep their names where the real graph (without the match) leaves them
    free, so a rule can name them as another path (the importer) would. ``reason`` is what the
    decision log says of the rewrite.
    """

    graph: Graph
    bindings: dict
    output: Value
    reason: str = ""
    replaces: object | None = None
    name: str | None = None
    absorbs: tuple = ()  # names of nodes outside the match the rewrite leaves dead (the new ops stand for them)

    @property
    def op_type(self) -> str:
        return self.output.producer.op_type if self.output.producer is not None else ""


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
class Fuse:
    """A fusion rule's action: ``propose(grouping, matches)`` yields the sites to fuse, in order
    (``opfuse.rules.driver.Site``); the driver judges and applies each before asking for the next,
    so a proposal sees the groups formed so far."""

    propose: Callable


@dataclass(eq=False)
class Rule:
    name: str
    pattern: Pattern
    condition: Callable | None = None   # Match -> Refusal|str|None (rewrite); Site -> Refusal|None (fusion)
    action: "Callable[[Match], Replacement | Subgraph | str | None] | Fuse" = None  # type: ignore[assignment]
    priority: float = 1.0
    benefit: Callable[[Match], float] = default_benefit
    cost: Callable[[Match], float] = default_cost
    kind: str = "fused"            # the FusionGroup kind (elementwise, conv_epilogue, attention, ...)
    anchor: str | None = None      # capture naming the node a kernel is built around
    description: str = ""

    @property
    def is_rewrite(self) -> bool:
        return not isinstance(self.action, Fuse)

    def check(self, m: Match) -> Refusal | None:
        """None when the match may be fused/rewritten, else why not (a reason string from the
        condition becomes a ``Refusal`` of this match only)."""
        if self.condition is None:
            return None
        got = self.condition(m)
        if got is None or isinstance(got, Refusal):
            return got
        return refuse(str(got))

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


def refusal_of(match: Callable[[Match], object]) -> Callable[[Match], str | None]:
    """A rule's condition from its ``match`` function (the matched operands, or a refusal's text): the
    text, or ``None`` when the match holds."""
    def condition(m: Match) -> str | None:
        got = match(m)
        return got if isinstance(got, str) else None
    return condition


__all__ = ["Rule", "Fuse", "Refusal", "refuse", "Replacement", "Subgraph", "default_benefit", "default_cost",
           "internal_bytes", "scalar",
           "close", "outside_readers", "refusal_of", "rule_names", "TRAFFIC_PER_INTERNAL_BYTE", "MIN_COST"]
