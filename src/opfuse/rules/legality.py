"""May these ops be one kernel? The one legality every fusion rule and the planner share.

``Legality`` answers for a ``Partition`` (the driver's, or the planner's view of a plan):

* ``vertical(gids)``: groups joined along producer-consumer edges. Refused when a group is
  horizontal or an elided (aliased) Concat, when the merged group exceeds
  ``max_ops_per_group`` (resource limit), when the nodes are no kernel shape
  (``classify``: category rules such as no Conv -> Conv), or when contracting them would
  create a cycle through an outside path.
* ``horizontal(gids, value)``: siblings sharing an input, the seed's three conditions (7.1.2):
  (1) every sibling kernel reads ``value``; (2) no path between any two of them; (3) resources
  within the limits (members, ops); and one iteration domain (``opfuse.rules.siblings``).

``RuleLegality`` is the same legality as the planner's protocol (``opfuse.planner.legality``),
on node sets and ``FusionPlan``s, without importing the planner (legality never depends on
profitability):

* ``check_group(graph, nodes) -> str | None``: may this (convex) node set be one kernel?
  Vertical sets must be a kernel shape (``classify``); sets of disconnected siblings must
  pass the horizontal conditions (``node_set_shape``); both within the resource limits.
* ``describe(graph, nodes) -> (kind, anchor)``: the group's kind and anchor.
* ``proposed_groups(graph)``: the candidate groups the fusion rules formed (attention is legal
  only as a whole, so the planner needs it offered); given at construction.
* ``can_merge(plan, a, b) -> str | None`` and ``candidate_merges(plan)``: the plan-level
  questions (adjacent or sibling groups, no cycle through an outside path, rules enabled),
  answered by ``Legality`` on a ``Partition`` of the plan (the one cycle check:
  ``Partition.creates_cycle``).

``annotate_plan(plan)`` gives any plan (e.g. the planner's) the kinds and attributes the
driver records (the rule of each group, horizontal members, attention roles, Concat aliasing,
views, boundaries) and verifies it.

Every query costs O(nodes of the groups involved) (the cycle check also walks the groups placed
between the two): what it needs about the rest of the graph is indexed once per graph
(``GraphIndex``) and per plan (a ``Partition``).
"""
from __future__ import annotations

from opfuse.errors import ModelError
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.rules.categories import is_row_normalization
from opfuse.rules.aliasing import concat_input_refusal, mark_views
from opfuse.rules.decisions import Refusal, RefusalKind, disabled
from opfuse.rules.graph_index import GraphIndex
from opfuse.rules.kernel_shape import GroupShape, boundary_outputs
from opfuse.rules.options import FusionOptions
from opfuse.rules.partition import Partition
from opfuse.rules.plan_check import verify_plan
from opfuse.rules.siblings import member_domain, node_set_shape

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
                return Refusal(RefusalKind.CONDITION, f"group '{self.p.members[g][0].name}' is a horizontal "
                                                        f"group: it takes no vertical fusion")
            if self.p.attrs[g].get("zero_copy") == "concat":
                return Refusal(RefusalKind.CONDITION, f"Concat '{self.p.members[g][0].name}' is elided "
                                                        f"(its producers write into its slices)")
        too_big = self.options.size_refusal(sum(len(self.p.members[g]) for g in gids))
        if too_big is not None:
            return too_big
        shape = self.p.classify(gids)
        if isinstance(shape, Refusal):
            return shape
        if self.p.creates_cycle(gids):
            return Refusal(RefusalKind.DEPENDENCY, "a path leaves the groups and comes back through another group")
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
                    return Refusal(RefusalKind.CONDITION, f"'{member[0].name}' does not read "
                                                            f"'{value.name}' (no shared input)")
            if self.p.attrs[g].get("zero_copy"):
                return Refusal(RefusalKind.CONDITION, f"'{self.p.members[g][0].name}' moves no data")
        n_members = sum(len(self.members_of(g)) for g in gids)
        if n_members > self.options.max_horizontal_members:
            return Refusal(RefusalKind.RESOURCE, f"{n_members} siblings exceed the limit of "
                                                      f"{self.options.max_horizontal_members}")
        too_big = self.options.size_refusal(sum(len(self.p.members[g]) for g in gids))
        if too_big is not None:
            return too_big
        domains = []
        for g in gids:
            d = self.domain(g, value)
            if isinstance(d, Refusal):
                return d
            domains.append(d)
        if any(d != domains[0] for d in domains[1:]):
            return Refusal(RefusalKind.CONDITION, "the siblings iterate over different domains "
                                                    "(window or shape differ)")
        for g in gids:
            if self.p.successors(g) & set(gids) or self.p.creates_cycle(gids):
                return Refusal(RefusalKind.DEPENDENCY, "a path connects the siblings (they are not independent)")
        return domains[0]

    def horizontal_shape(self, gids, value: Value, domain) -> tuple[GroupShape, dict]:
        """The shape and attributes of the horizontal group ``gids`` sharing ``value``."""
        p = self.p
        ordered = sorted(set(gids), key=p.order_key)
        members, kinds = [], []
        for g in ordered:
            for m, kind in zip(self.members_of(g), p.attrs[g].get("member_kinds") or [p.kind(g)], strict=True):
                members.append([n.name for n in m])
                kinds.append(kind)
        first = ordered[0]
        anchor = p.shape[first].anchor if p.shape[first].anchor is not None else p.members[first][0]
        attrs = {"members": members, "member_kinds": kinds, "shared_input": value.name, "domain": domain}
        return GroupShape("horizontal", anchor), attrs

    # Plan level ---------------------------------------------------------------------------
    def shared_input(self, a: int, b: int) -> Value | None:
        """A non-constant value both groups read from outside them (siblings), or None."""
        p = self.p
        ins_a = {id(v): v for n in p.members[a] for v in n.input_values() if not v.is_const}
        for n in p.members[b]:
            for v in n.input_values():
                if id(v) in ins_a and (v.producer is None or p.gid(v.producer) not in (a, b)):
                    return v
        return None

    def merge(self, a: int, b: int) -> tuple[GroupShape, dict] | Refusal:
        """May groups ``a`` and ``b`` become one kernel? Vertical when one feeds the other,
        horizontal when they share an input; the shape and attributes to merge into."""
        if a == b:
            return Refusal(RefusalKind.CONDITION, "the groups are the same")
        p = self.p
        if b in p.successors(a) or a in p.successors(b):
            r = self.vertical([a, b])
            return r if isinstance(r, Refusal) else (r, {})
        v = self.shared_input(a, b)
        if v is None:
            return Refusal(RefusalKind.CONDITION, "the groups are neither adjacent nor siblings of one input")
        dom = self.horizontal([a, b], v)
        if isinstance(dom, Refusal):
            return dom
        return self.horizontal_shape([a, b], v, dom)


# The rule whose groups have each kind (a planner-chosen group is credited to the rule of its shape).
RULE_OF_KIND = {"conv_epilogue": "epilogue", "gemm_epilogue": "epilogue", "sampling_epilogue": "epilogue",
                "elementwise": "elementwise_chain",
                "injective": "injective", "attention": "attention", "horizontal": "horizontal",
                "concat": "concat_alias"}


def rule_of_shape(shape: GroupShape) -> str | None:
    """The fusion rule whose groups have ``shape`` (``None`` for a single op)."""
    if shape.kind in ("conv_epilogue", "gemm_epilogue") and shape.attrs.get("prologue"):
        return "dequantize_prologue"
    if shape.kind == "reduction":
        if shape.attrs.get("prologue"):
            anchor = shape.anchor
            assert anchor is not None  # a reduction group is built around its reduction
            return "normalization_prologue" if is_row_normalization(anchor) else "elementwise_chain"
        return "epilogue"
    return RULE_OF_KIND.get(shape.kind)


class PlanLegality:
    """``Legality`` on a ``FusionPlan``: a partition of the plan's groups, merged in place.

        legal = PlanLegality(plan)
        for a, b in legal.candidate_merges():
            if legal.can_merge(a, b) is None:
                merged = legal.merge(a, b)      # a new FusionGroup; legal.plan() is the new plan
    """

    def __init__(self, plan: FusionPlan, options: FusionOptions | None = None):
        self.source = plan
        self.size = len(plan.groups)
        self.partition = Partition.from_plan(plan)
        self.legality = Legality(self.partition, options)
        self.options = self.legality.options
        self.graph = plan.graph

    def covers(self, plan: FusionPlan, groups=()) -> bool:
        """Still the partition of ``plan`` (the plan unchanged, the groups its own)?"""
        if plan is not self.source or len(plan.groups) != self.size:
            return False
        p = self.partition
        return all(p.members.get(p.gid(g.nodes[0])) is not None and
                   len(p.members[p.gid(g.nodes[0])]) == len(g.nodes) for g in groups)

    def _gid(self, group: FusionGroup) -> int:
        return self.partition.gid(group.nodes[0])

    def can_merge(self, a: FusionGroup, b: FusionGroup) -> Refusal | None:
        """``None`` when ``a`` and ``b`` may become one kernel, else the reason they may not."""
        r = self.legality.merge(self._gid(a), self._gid(b))
        if isinstance(r, Refusal):
            return r
        rule = rule_of_shape(r[0])
        if rule is not None and self.options.is_disabled(rule):
            return disabled(rule)
        return None

    def candidate_merges(self) -> list[tuple[FusionGroup, FusionGroup]]:
        """Every adjacent pair (producer, consumer) and every pair of siblings reading one
        non-constant value, in plan order; check each with ``can_merge``."""
        plan = self.plan()
        by_gid = {self._gid(g): g for g in plan.groups}
        pos = {gid: i for i, gid in enumerate(by_gid)}
        pairs: set[tuple[int, int]] = set()
        for gid in by_gid:
            for s in self.partition.successors(gid):
                pairs.add((gid, s))
        for v in self.graph.values.values():
            if v.is_const:
                continue
            readers = sorted({self.partition.gid(u) for u, _ in v.uses}, key=pos.__getitem__)
            prod = self.partition.gid(v.producer) if v.producer is not None else None
            readers = [r for r in readers if r != prod]
            for i in range(len(readers)):
                for j in range(i + 1, len(readers)):
                    pairs.add((readers[i], readers[j]))
        ordered = sorted(pairs, key=lambda ab: (pos[ab[0]], pos[ab[1]]))
        return [(by_gid[a], by_gid[b]) for a, b in ordered]

    def merge(self, a: FusionGroup, b: FusionGroup) -> FusionGroup:
        """Merge two groups (``can_merge`` must have allowed it); returns the new group."""
        ga, gb = self._gid(a), self._gid(b)
        r = self.legality.merge(ga, gb)
        if isinstance(r, Refusal):
            raise ValueError(f"illegal merge of '{a.name}' and '{b.name}': {r}")
        shape, attrs = r
        return self.partition.group(self.partition.union([ga, gb], shape, attrs))

    def plan(self) -> FusionPlan:
        return self.partition.to_plan()


class RuleLegality:
    """The fusion rules' legality as the planner's protocol (see the module docstring).

    ``candidates``: the plan the fusion rules formed (``opfuse.rules.driver.form_groups``); its
    multi-op groups are offered to the planner as whole candidates. The graph and plan must not
    be edited in place while they are being planned (an index is rebuilt when the queried
    nodes show it is stale).
    """

    def __init__(self, options: FusionOptions | None = None, candidates: FusionPlan | None = None):
        self.options = options or FusionOptions()
        self.candidates = candidates
        self._graph_index: GraphIndex | None = None
        self._plan: PlanLegality | None = None

    def graph_index(self, graph: Graph, nodes=()) -> GraphIndex:
        """The index of ``graph``, reused while it covers ``nodes``."""
        index = self._graph_index
        if index is None or not index.covers(graph, nodes):
            index = self._graph_index = GraphIndex(graph)
        return index

    def plan_legality(self, plan: FusionPlan, groups=()) -> PlanLegality:
        """The partition of ``plan``, reused while it is still that plan's."""
        legal = self._plan
        if legal is None or not legal.covers(plan, groups):
            legal = self._plan = PlanLegality(plan, self.options)
        return legal

    def shape(self, graph: Graph, nodes) -> GroupShape | Refusal:
        nodes = list(nodes)
        if len(nodes) == 1:
            n = nodes[0]
            return GroupShape("concat" if n.op_type == "Concat" else "single", n)
        return node_set_shape(graph, nodes, self.options, self.graph_index(graph, nodes))

    def check_group(self, graph: Graph, nodes) -> str | None:
        if len(nodes) <= 1:
            return None
        shape = self.shape(graph, nodes)
        if isinstance(shape, Refusal):
            return str(shape)
        rule = rule_of_shape(shape)
        if rule is not None and self.options.is_disabled(rule):
            return str(disabled(rule))
        return None

    def describe(self, graph: Graph, nodes) -> tuple[str, Node]:
        shape = self.shape(graph, nodes)
        if isinstance(shape, Refusal):
            raise ModelError(f"not a legal kernel: {shape}")
        return shape.kind, shape.anchor if shape.anchor is not None else list(nodes)[0]

    def proposed_groups(self, graph: Graph) -> list[list[Node]]:
        """The fusion rules' multi-op groups (when the candidates are of this graph)."""
        if self.candidates is None or self.candidates.graph is not graph:
            return []
        return [list(g.nodes) for g in self.candidates.groups if len(g.nodes) > 1]

    def merge_refusal(self, plan: FusionPlan, a: FusionGroup, b: FusionGroup) -> Refusal | None:
        """Why ``a`` and ``b`` may not become one kernel (``None``: they may)."""
        if a is b:
            return Refusal(RefusalKind.CONDITION, "a group cannot merge with itself")
        legal = self.plan_legality(plan, (a, b))
        p = legal.partition
        ga, gb = legal._gid(a), legal._gid(b)
        adjacent = gb in p.successors(ga) or ga in p.successors(gb)
        if not adjacent and legal.legality.shared_input(ga, gb) is None:
            return Refusal(RefusalKind.CONDITION, "the groups are neither adjacent nor siblings of one input")
        if p.creates_cycle([ga, gb]):
            return Refusal(RefusalKind.DEPENDENCY, f"merging '{a.name}' and '{b.name}' creates a cycle through "
                                                   f"an outside path")
        nodes = self.graph_index(plan.graph, [*a.nodes, *b.nodes]).in_order([*a.nodes, *b.nodes])
        shape = self.shape(plan.graph, nodes)
        if isinstance(shape, Refusal):
            return shape
        rule = rule_of_shape(shape)
        if rule is not None and self.options.is_disabled(rule):
            return disabled(rule)
        return None

    def can_merge(self, plan: FusionPlan, a: FusionGroup, b: FusionGroup) -> str | None:
        r = self.merge_refusal(plan, a, b)
        return None if r is None else str(r)

    def candidate_merges(self, plan: FusionPlan) -> list[tuple[FusionGroup, FusionGroup]]:
        """Adjacent and sibling group pairs (plan order) that may merge."""
        pairs = PlanLegality(plan, self.options).candidate_merges()
        by_first = {g.nodes[0].name: g for g in plan.groups}
        out = []
        for x, y in pairs:
            a, b = by_first[x.nodes[0].name], by_first[y.nodes[0].name]
            if self.can_merge(plan, a, b) is None:
                out.append((a, b))
        return out


def annotate_plan(plan: FusionPlan, options: FusionOptions | None = None,
                  candidates: FusionPlan | None = None, origin: dict[str, list[str]] | None = None) -> FusionPlan:
    """Recompute every group's kind, anchor and attributes: the rule that formed it (the
    candidate group's rule when the group is one of ``candidates``, else the rule of its
    shape), the original ops it stands for (``origin``, by node name), Concat aliasing and views.

    Raises ``ModelError`` when a group is not a legal kernel.
    """
    legal = RuleLegality(options)
    graph = plan.graph
    outputs = legal.graph_index(graph).outputs
    formed = {}
    if candidates is not None and candidates.graph is graph:
        formed = {frozenset(id(n) for n in g.nodes): g.attrs.get("rule") for g in candidates.groups}
    claimed: set[int] = set()
    groups = []
    for g in plan.groups:
        shape = legal.shape(graph, g.nodes)
        if isinstance(shape, Refusal):
            raise ModelError(f"fusion group '{g.name}' is not a legal kernel: {shape}")
        attrs = {k: v for k, v in shape.attrs.items() if k != "qk"}
        if origin is not None:
            attrs["origin"] = [o for n in g.nodes for o in origin.get(n.name, [n.name])]
        elif "origin" in g.attrs:
            attrs["origin"] = list(g.attrs["origin"])
        anchor = shape.anchor if shape.anchor is not None else g.nodes[0]
        kind = shape.kind
        if shape.kind == "concat":
            node = g.nodes[0]
            ok = [v for v in node.input_values() if concat_input_refusal(graph, node, v, claimed) is None]
            claimed.update(id(v) for v in ok)
            if ok and not legal.options.is_disabled("concat_alias"):
                attrs["alias_inputs"] = [v.name for v in ok]
                if len(ok) == len(node.input_values()):
                    attrs["zero_copy"] = "concat"
            else:
                kind = "single"
        rule = formed.get(frozenset(id(n) for n in g.nodes)) or \
            rule_of_shape(GroupShape(kind, shape.anchor, shape.attrs))
        if rule is not None:
            attrs["rule"] = rule
        fg = FusionGroup(g.name, list(g.nodes), kind, anchor, attrs)
        fg.attrs["inputs"] = [v.name for v in fg.inputs()]
        fg.attrs["outputs"] = [v.name for v in boundary_outputs(fg.nodes, graph, outputs)]
        groups.append(fg)
    out = FusionPlan(graph, groups)
    mark_views(out)
    verify_plan(out)
    return out


__all__ = ["Legality", "PlanLegality", "RuleLegality", "annotate_plan", "rule_of_shape", "RULE_OF_KIND"]
