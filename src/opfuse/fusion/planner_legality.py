"""The fusion rules as the planner's legality: ``RuleLegality``.

The planner (``opfuse.planner``) decides which fusions pay off; it asks this object which
ones are allowed. It implements the planner's legality protocol without importing the
planner (legality never depends on profitability):

* ``check_group(graph, nodes) -> str | None``: may this (convex) node set be one kernel?
  Vertical sets must be a kernel shape (``classify``); sets of disconnected siblings must
  pass the horizontal conditions (``node_set_shape``); both within the resource limits.
* ``describe(graph, nodes) -> (kind, anchor)``: the group's kind and anchor.
* ``proposed_groups(graph)``: the groups the rule-based builder forms (attention is legal
  only as a whole, so the planner needs it offered).
* ``can_merge(plan, a, b) -> str | None`` and ``candidate_merges(plan)``: the plan-level
  questions (adjacent or sibling groups, no cycle through an outside path, rules enabled).

Every query costs O(nodes of the groups involved) (the cycle check of ``can_merge`` also walks
the groups placed between the two): what it needs about the rest of the graph is indexed
once per graph (``opfuse.fusion.graph_index.GraphIndex``) and per plan (``PlanIndex``), and
``proposed_groups`` runs the builder once per graph.

``PlanLegality`` answers the same plan-level questions incrementally (it keeps a partition,
so ``merge`` is cheap) and returns ``Refusal``s with their reason kind.

``annotate_plan(plan)`` gives any plan (e.g. the planner's) the kinds and attributes the
builder records (horizontal members, attention roles, Concat aliasing, views, boundaries)
and verifies it.
"""
from __future__ import annotations

from opfuse.errors import ModelError
from opfuse.fusion.aliasing import concat_input_refusal, mark_views
from opfuse.fusion.builder import build_plan
from opfuse.fusion.decisions import ReasonKind, Refusal
from opfuse.fusion.graph_index import GraphIndex
from opfuse.fusion.kernel_shape import GroupShape, boundary_outputs
from opfuse.fusion.horizontal import horizontal_shape
from opfuse.fusion.legality import Legality
from opfuse.fusion.options import FusionOptions
from opfuse.fusion.partition import Partition
from opfuse.fusion.plan_check import verify_plan
from opfuse.fusion.siblings import node_set_shape
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ops.registry import get_spec

# The rule that forms a group of each kind (for "disabled by user").
RULE_OF_KIND = {"conv_epilogue": "epilogue", "gemm_epilogue": "epilogue", "elementwise": "elementwise_chain",
                "injective": "injective", "attention": "attention", "horizontal": "horizontal"}


def rule_for(shape: GroupShape, a: list[Node], b: list[Node]) -> str | None:
    """The fusion rule a merge of producer ``a`` and consumer ``b`` into ``shape`` belongs to."""
    if shape.kind == "reduction":
        anchor = shape.anchor
        if any(n is anchor for n in a):
            return "epilogue"
        spec = get_spec(anchor.op_type)
        return "normalization_prologue" if "normalization" in spec.tags and \
            anchor.outputs[0].shape == anchor.inputs[0].shape else "elementwise_chain"
    return RULE_OF_KIND.get(shape.kind)


class PlanIndex:
    """Per-plan facts the plan-level questions share: each group's place in the plan (a
    topological order of the group graph) and each node's group. Plans are treated as
    immutable: ``covers`` re-checks the groups a query names before the index is reused."""

    def __init__(self, plan: FusionPlan):
        self.plan = plan
        self.size = len(plan.groups)
        self.position = {id(g): i for i, g in enumerate(plan.groups)}
        self.owner = {id(n): g for g in plan.groups for n in g.nodes}

    def covers(self, plan: FusionPlan, groups) -> bool:
        if plan is not self.plan or len(plan.groups) != self.size:
            return False
        for g in groups:
            i = self.position.get(id(g))
            if i is None or plan.groups[i] is not g:
                return False
        return True


def plan_creates_cycle(plan: FusionPlan, a: FusionGroup, b: FusionGroup, index: PlanIndex | None = None) -> bool:
    """Does a path join ``a`` and ``b`` through another group? (plan order is topological,
    so only groups placed between them are searched)."""
    index = index if index is not None and index.covers(plan, (a, b)) else PlanIndex(plan)
    position, owner = index.position, index.owner
    lo, hi = sorted((position[id(a)], position[id(b)]))
    src, dst = plan.groups[lo], plan.groups[hi]
    todo, seen = [src], {id(src)}
    while todo:
        g = todo.pop()
        for n in g.nodes:
            for v in n.outputs:
                for u, _ in v.uses:
                    h = owner[id(u)]
                    if h is dst and g is not src:
                        return True
                    if id(h) not in seen and h is not dst and position[id(h)] < hi:
                        seen.add(id(h))
                        todo.append(h)
    return False


class RuleLegality:
    """The rules as the planner's legality (see the module docstring).

    Every query about a graph (or plan) shares one index of it, built on first use
    (``GraphIndex``: node positions, graph outputs, reachability; ``PlanIndex``), so a query
    costs O(nodes of the groups involved), plus, for the cycle check of ``can_merge``, the
    groups placed between the two. The graph and plan must not be edited in place while
    they are being planned (an index is rebuilt when the queried nodes show it is stale).
    """

    def __init__(self, options: FusionOptions | None = None):
        self.options = options or FusionOptions()
        self._graph_index: GraphIndex | None = None
        self._plan_index: PlanIndex | None = None
        self._proposed: tuple[GraphIndex, list[list[Node]]] | None = None

    def graph_index(self, graph: Graph, nodes=()) -> GraphIndex:
        """The index of ``graph``, reused while it covers ``nodes``."""
        index = self._graph_index
        if index is None or not index.covers(graph, nodes):
            index = self._graph_index = GraphIndex(graph)
        return index

    def plan_index(self, plan: FusionPlan, groups=()) -> PlanIndex:
        index = self._plan_index
        if index is None or not index.covers(plan, groups):
            index = self._plan_index = PlanIndex(plan)
        return index

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
        rule = RULE_OF_KIND.get(shape.kind)
        if rule is not None and self.options.is_disabled(rule):
            return f"disabled by user: rule '{rule}' is disabled"
        return None

    def describe(self, graph: Graph, nodes) -> tuple[str, Node]:
        shape = self.shape(graph, nodes)
        if isinstance(shape, Refusal):
            raise ModelError(f"not a legal kernel: {shape}")
        return shape.kind, shape.anchor if shape.anchor is not None else list(nodes)[0]

    def proposed_groups(self, graph: Graph) -> list[list[Node]]:
        """The builder's multi-node groups (built once per graph index: every Pareto point
        and planner run on the graph asks again)."""
        index = self.graph_index(graph)
        if self._proposed is None or self._proposed[0] is not index:
            plan, _ = build_plan(graph, self.options)
            self._proposed = (index, [list(g.nodes) for g in plan.groups if len(g.nodes) > 1])
        return [list(nodes) for nodes in self._proposed[1]]

    def merge_refusal(self, plan: FusionPlan, a: FusionGroup, b: FusionGroup) -> Refusal | None:
        """Why ``a`` and ``b`` may not become one kernel (``None``: they may)."""
        if a is b:
            return Refusal(ReasonKind.RULE_REFUSED, "a group cannot merge with itself")
        ids_a, ids_b = a.node_ids(), b.node_ids()
        adjacent = any(id(u) in ids_b for n in a.nodes for v in n.outputs for u, _ in v.uses) or \
            any(id(u) in ids_a for n in b.nodes for v in n.outputs for u, _ in v.uses)
        shared = {id(v) for v in a.inputs() if not v.is_const} & {id(v) for v in b.inputs() if not v.is_const}
        if not adjacent and not shared:
            return Refusal(ReasonKind.RULE_REFUSED, "the groups are neither adjacent nor siblings of one input")
        index = self.plan_index(plan, (a, b))
        if plan_creates_cycle(plan, a, b, index):
            return Refusal(ReasonKind.CYCLE, f"merging '{a.name}' and '{b.name}' creates a cycle through "
                                             f"an outside path")
        nodes = self.graph_index(plan.graph, [*a.nodes, *b.nodes]).in_order([*a.nodes, *b.nodes])
        shape = self.shape(plan.graph, nodes)
        if isinstance(shape, Refusal):
            return shape
        first, second = (a, b) if index.position[id(a)] < index.position[id(b)] else (b, a)
        rule = rule_for(shape, first.nodes, second.nodes)
        if rule is not None and self.options.is_disabled(rule):
            return Refusal(ReasonKind.DISABLED, f"rule '{rule}' is disabled")
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


def annotate_plan(plan: FusionPlan, options: FusionOptions | None = None) -> FusionPlan:
    """Recompute every group's kind, anchor and attributes; mark Concat aliasing and views.

    Keeps ``attrs["origin"]``; raises ``ModelError`` when a group is not a legal kernel.
    """
    legal = RuleLegality(options)
    graph = plan.graph
    outputs = legal.graph_index(graph).outputs
    claimed: set[int] = set()
    groups = []
    for g in plan.groups:
        shape = legal.shape(graph, g.nodes)
        if isinstance(shape, Refusal):
            raise ModelError(f"fusion group '{g.name}' is not a legal kernel: {shape}")
        attrs = {k: v for k, v in shape.attrs.items() if k != "qk"}
        if "origin" in g.attrs:
            attrs["origin"] = list(g.attrs["origin"])
        anchor = shape.anchor if shape.anchor is not None else g.nodes[0]
        kind = shape.kind
        if shape.kind == "concat":
            node = g.nodes[0]
            ok = [v for v in node.input_values() if concat_input_refusal(graph, node, v, claimed) is None]
            claimed.update(id(v) for v in ok)
            if ok:
                attrs["alias_inputs"] = [v.name for v in ok]
                if len(ok) == len(node.input_values()):
                    attrs["zero_copy"] = "concat"
            else:
                kind = "single"
        fg = FusionGroup(g.name, list(g.nodes), kind, anchor, attrs)
        fg.attrs["inputs"] = [v.name for v in fg.inputs()]
        fg.attrs["outputs"] = [v.name for v in boundary_outputs(fg.nodes, graph, outputs)]
        groups.append(fg)
    out = FusionPlan(graph, groups)
    mark_views(out)
    verify_plan(out)
    return out


class PlanLegality:
    """The legality interface on ``FusionPlan``s, for the planner.

        legal = PlanLegality(plan)
        for a, b in legal.candidate_merges():
            if legal.can_merge(a, b) is None:
                merged = legal.merge(a, b)      # a new FusionGroup; legal.plan() is the new plan
    """

    def __init__(self, plan: FusionPlan, options: FusionOptions | None = None):
        self.partition = Partition.from_plan(plan)
        self.legality = Legality(self.partition, options)
        self.graph = plan.graph

    def _gid(self, group: FusionGroup) -> int:
        return self.partition.gid(group.nodes[0])

    def _shared_input(self, a: int, b: int) -> Value | None:
        ins_a = {id(v): v for n in self.partition.members[a] for v in n.input_values() if not v.is_const}
        for n in self.partition.members[b]:
            for v in n.input_values():
                if id(v) in ins_a and (v.producer is None or self.partition.gid(v.producer) not in (a, b)):
                    return v
        return None

    def can_merge(self, a: FusionGroup, b: FusionGroup) -> Refusal | None:
        """``None`` when ``a`` and ``b`` may become one kernel, else the reason they may not."""
        ga, gb = self._gid(a), self._gid(b)
        if ga == gb:
            return Refusal(ReasonKind.RULE_REFUSED, "the groups are the same")
        p = self.partition
        if gb in p.successors(ga) or ga in p.successors(gb):
            r = self.legality.vertical([ga, gb])
            return r if isinstance(r, Refusal) else None
        v = self._shared_input(ga, gb)
        if v is None:
            return Refusal(ReasonKind.RULE_REFUSED, "the groups are neither adjacent nor siblings of one input")
        r = self.legality.horizontal([ga, gb], v)
        return r if isinstance(r, Refusal) else None

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
            readers = sorted({self.partition.gid(u) for u, _ in v.uses}, key=pos.get)
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
        p = self.partition
        if gb in p.successors(ga) or ga in p.successors(gb):
            shape = self.legality.vertical([ga, gb])
            if isinstance(shape, Refusal):
                raise ValueError(f"illegal merge of '{a.name}' and '{b.name}': {shape}")
            gid = p.union([ga, gb], shape)
        else:
            v = self._shared_input(ga, gb)
            dom = self.legality.horizontal([ga, gb], v) if v is not None else None
            if v is None or isinstance(dom, Refusal):
                raise ValueError(f"illegal merge of '{a.name}' and '{b.name}': {dom}")
            shape, attrs = horizontal_shape(self.legality, [ga, gb], v, dom)
            gid = p.union([ga, gb], shape, attrs)
        return p.group(gid)

    def plan(self) -> FusionPlan:
        return self.partition.to_plan()


def can_merge(plan: FusionPlan, a: FusionGroup, b: FusionGroup,
              options: FusionOptions | None = None) -> Refusal | None:
    """One-shot form of ``PlanLegality(plan).can_merge(a, b)``."""
    return PlanLegality(plan, options).can_merge(a, b)


def candidate_merges(plan: FusionPlan, options: FusionOptions | None = None):
    return PlanLegality(plan, options).candidate_merges()


def merge_groups(plan: FusionPlan, a: FusionGroup, b: FusionGroup,
                 options: FusionOptions | None = None) -> FusionPlan:
    legal = PlanLegality(plan, options)
    legal.merge(a, b)
    return legal.plan()
