"""May these groups become one kernel? The legality every fusion rule and the planner share.

``Legality`` answers for a ``Partition``:

* ``vertical(gids)``: groups joined along producer-consumer edges. Refused when a group is
  horizontal or an elided (aliased) Concat, when the merged group exceeds
  ``max_ops_per_group`` (resource limit), when the nodes are no kernel shape
  (``classify``: category rules such as no Conv -> Conv), or when contracting them would
  create a cycle through an outside path.
* ``horizontal(gids, value)``: siblings sharing an input, the seed's three conditions (7.1.2):
  (1) every sibling kernel reads ``value``; (2) no path between any two of them; (3) resources
  within the limits (members, ops); and one iteration domain (``opfuse.fusion.siblings``).

Profitability is not decided here: the planner (``opfuse.planner``) ranks the legal merges.
``opfuse.fusion.planner_legality`` wraps this for ``FusionPlan``s.
"""
from __future__ import annotations

from opfuse.fusion.decisions import ReasonKind, Refusal
from opfuse.fusion.kernel_shape import GroupShape
from opfuse.fusion.options import FusionOptions
from opfuse.fusion.partition import Partition
from opfuse.fusion.siblings import member_domain
from opfuse.ir.graph import Node, Value

# Kinds that never take part in a vertical merge.
SEALED_KINDS = frozenset({"horizontal"})


class Legality:
    def __init__(self, partition: Partition, options: FusionOptions | None = None):
        self.p = partition
        self.options = options or FusionOptions()

    # Vertical -------------------------------------------------------------------------------
    def vertical(self, gids) -> GroupShape | Refusal:
        gids = sorted(set(gids))
        for g in gids:
            if self.p.kind(g) in SEALED_KINDS:
                return Refusal(ReasonKind.RULE_REFUSED, f"group '{self.p.members[g][0].name}' is a horizontal "
                                                        f"group: it takes no vertical fusion")
            if self.p.attrs[g].get("zero_copy") == "concat":
                return Refusal(ReasonKind.RULE_REFUSED, f"Concat '{self.p.members[g][0].name}' is elided "
                                                        f"(its producers write into its slices)")
        size = sum(len(self.p.members[g]) for g in gids)
        if size > self.options.max_ops_per_group:
            return Refusal(ReasonKind.RESOURCE_LIMIT, f"{size} ops exceed the limit of "
                                                      f"{self.options.max_ops_per_group} per kernel")
        shape = self.p.classify(gids)
        if isinstance(shape, Refusal):
            return shape
        if self.p.creates_cycle(gids):
            return Refusal(ReasonKind.CYCLE, "a path leaves the groups and comes back through another group")
        return shape

    # Horizontal -----------------------------------------------------------------------------
    def members_of(self, gid: int) -> list[list[Node]]:
        """The sibling kernels inside a group (one for a non-horizontal group)."""
        names = self.p.attrs[gid].get("members")
        if not names:
            return [self.p.members[gid]]
        by_name = {n.name: n for n in self.p.members[gid]}
        return [[by_name[x] for x in m] for m in names]

    def domain(self, gid: int, value: Value) -> tuple | Refusal:
        """The iteration domain a sibling reading ``value`` would share, or why it has none."""
        if self.p.kind(gid) == "horizontal":
            return self.p.attrs[gid]["domain"]
        return member_domain(self.p.members[gid], self.p.shape[gid], value)

    def horizontal(self, gids, value: Value) -> tuple | Refusal:
        """The common domain when ``gids`` may become one horizontal group."""
        gids = sorted(set(gids))
        for g in gids:
            for member in self.members_of(g):  # every sibling kernel reads the shared value
                if not any(value is v for n in member for v in n.input_values()):
                    return Refusal(ReasonKind.RULE_REFUSED, f"'{member[0].name}' does not read "
                                                            f"'{value.name}' (no shared input)")
            if self.p.attrs[g].get("zero_copy"):
                return Refusal(ReasonKind.RULE_REFUSED, f"'{self.p.members[g][0].name}' moves no data")
        n_members = sum(len(self.members_of(g)) for g in gids)
        if n_members > self.options.max_horizontal_members:
            return Refusal(ReasonKind.RESOURCE_LIMIT, f"{n_members} siblings exceed the limit of "
                                                      f"{self.options.max_horizontal_members}")
        size = sum(len(self.p.members[g]) for g in gids)
        if size > self.options.max_ops_per_group:
            return Refusal(ReasonKind.RESOURCE_LIMIT, f"{size} ops exceed the limit of "
                                                      f"{self.options.max_ops_per_group} per kernel")
        domains = []
        for g in gids:
            d = self.domain(g, value)
            if isinstance(d, Refusal):
                return d
            domains.append(d)
        if any(d != domains[0] for d in domains[1:]):
            return Refusal(ReasonKind.RULE_REFUSED, "the siblings iterate over different domains "
                                                    "(window or shape differ)")
        for g in gids:
            if self.p.successors(g) & set(gids) or self.p.creates_cycle(gids):
                return Refusal(ReasonKind.CYCLE, "a path connects the siblings (they are not independent)")
        return domains[0]
