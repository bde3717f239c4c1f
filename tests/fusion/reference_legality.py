"""Plain reference versions of the legality queries, for the equivalence tests.

Each answers from scratch, by brute force over the whole graph (what the indexed versions in
``opfuse.rules.legality`` must agree with): reachability by an unbounded walk, cycles by contracting
the groups and looking for a cycle in the whole group graph, the plan order by Kahn's
algorithm on a group graph rebuilt from the nodes.

The kernel shapes (``classify``, the attention kernel, sibling components and their iteration
domains) are written here again from their definitions in the docstrings of
``opfuse.rules.kernel_shape``, ``opfuse.rules.attention`` and ``opfuse.rules.siblings``, with the
same refusal texts, and read nothing from those modules: a bug there shows up as a
disagreement. Only the op registry (categories, attributes) and the refusal types are shared.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from opfuse.errors import ModelError
from opfuse.ops.common import norm_axis
from opfuse.ops.registry import Category, Mapping, get_spec
from opfuse.rules.decisions import RefusalKind, Refusal
from opfuse.rules.options import FusionOptions
from opfuse.rules.partition import Partition

# Attributes of a pooling/reduction that fix its iteration window: siblings share one pass over
# their input only when all of these agree (and the input and output shapes do).
WINDOW_ATTRS = ("kernel_shape", "strides", "pads", "dilations", "auto_pad", "ceil_mode",
                "axes", "keepdims", "noop_with_empty_axes")
EPILOGUE_KINDS = {"Conv": "conv_epilogue", "ConvTranspose": "conv_epilogue",
                  "MatMul": "gemm_epilogue", "Gemm": "gemm_epilogue"}
RULE_OF_KIND = {"conv_epilogue": "epilogue", "gemm_epilogue": "epilogue", "elementwise": "elementwise_chain",
                "injective": "injective", "attention": "attention", "horizontal": "horizontal",
                "concat": "concat_alias"}


@dataclass(frozen=True)
class Shape:
    kind: str
    anchor: object
    attrs: dict = field(default_factory=dict, hash=False, compare=False)


# Categories, straight from the op registry ------------------------------------------------------
def cat(n) -> Category:
    return get_spec(n.op_type).category


def elementwise(n) -> bool:
    return cat(n) <= Category.BROADCAST


def pointwise(n) -> bool:
    return elementwise(n) and get_spec(n.op_type).mapping != Mapping.ONE_TO_MANY


def injective(n) -> bool:
    return cat(n) == Category.INJECTIVE


def relabel(n) -> bool:
    return injective(n) and get_spec(n.op_type).mapping in (Mapping.REORGANIZE, Mapping.SHUFFLE)


def row_normalization(n) -> bool:
    return (cat(n) == Category.REDUCTION and "normalization" in get_spec(n.op_type).tags
            and n.outputs[0].shape == n.input(0).shape)


CATEGORY_NAMES = {Category.ELEMWISE: "elementwise", Category.BROADCAST: "broadcast",
                  Category.INJECTIVE: "injective", Category.REDUCTION: "reduction",
                  Category.OUT_ELEMWISE_FUSABLE: "out-elementwise-fusable", Category.OPAQUE: "opaque"}


def desc(n, with_category: bool = False) -> str:
    return f"'{n.name}' ({n.op_type}, {CATEGORY_NAMES[cat(n)]})" if with_category else f"'{n.name}' ({n.op_type})"


# Walks inside a node set ------------------------------------------------------------------------
def inside_edges(nodes):
    """(producer, consumer) pairs of nodes of the set joined by a value."""
    ids = {id(n) for n in nodes}
    return [(v.producer, n) for n in nodes for v in n.input_values()
            if v.producer is not None and id(v.producer) in ids]


def walk_within(start, nodes, forward: bool) -> set[int]:
    edges = inside_edges(nodes)
    seen: set[int] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for p, c in edges:
            a, b = (p, c) if forward else (c, p)
            if a is n and id(b) not in seen:
                seen.add(id(b))
                todo.append(b)
    return seen


def components(nodes) -> list[list]:
    """Weakly connected components through edges inside ``nodes``, each in the given order,
    ordered by their first node."""
    edges = inside_edges(nodes)
    comps: list[list] = []
    placed: set[int] = set()
    for n in nodes:
        if id(n) in placed:
            continue
        comp, todo = {id(n)}, [n]
        while todo:
            m = todo.pop()
            for p, c in edges:
                for a, b in ((p, c), (c, p)):
                    if a is m and id(b) not in comp:
                        comp.add(id(b))
                        todo.append(b)
        placed |= comp
        comps.append([x for x in nodes if id(x) in comp])
    return comps


def leaving(nodes, graph) -> list:
    """Values of ``nodes`` read outside them, or graph outputs."""
    ids = {id(n) for n in nodes}
    outs = {id(v) for v in graph.outputs}
    return [v for n in nodes for v in n.outputs if id(v) in outs or any(id(u) not in ids for u, _ in v.uses)]


def internal(v, ids, graph) -> bool:
    return all(v is not o for o in graph.outputs) and all(id(u) in ids for u, _ in v.uses)


# One kernel: classify ---------------------------------------------------------------------------
def classify(nodes, graph):
    """The kernel shape of ``nodes`` (topological order), or the refusal, as the docstring of
    ``opfuse.rules.kernel_shape`` defines them."""
    if len(nodes) == 1:
        return Shape("single", nodes[0])
    for n in nodes:
        if cat(n) == Category.OPAQUE:
            return Refusal(RefusalKind.CATEGORY, f"{desc(n)} is opaque: never fused")
    oefs = [n for n in nodes if cat(n) == Category.OUT_ELEMWISE_FUSABLE]
    reds = [n for n in nodes if cat(n) == Category.REDUCTION]
    if len(oefs) == 2 and len(reds) == 1 and all(n.op_type == "MatMul" for n in oefs):
        info = attention(nodes, graph)
        return info if isinstance(info, Refusal) else Shape("attention", info["qk"], info)
    if len(oefs) >= 2:
        return Refusal(RefusalKind.CATEGORY, f"two out-elementwise-fusable ops {desc(oefs[0])} and "
                                             f"{desc(oefs[-1])} are never fused into one kernel (no Conv -> Conv)")
    if oefs and reds:
        return Refusal(RefusalKind.CATEGORY, f"reduction {desc(reds[0])} cannot share a kernel with "
                                             f"out-elementwise-fusable {desc(oefs[0])}")
    if len(reds) >= 2:
        return Refusal(RefusalKind.CATEGORY, f"two reductions {desc(reds[0])} and {desc(reds[1])} in one kernel")
    if len(components(nodes)) != 1:
        return Refusal(RefusalKind.CONDITION, "the ops are not connected by producer-consumer edges "
                                              "(siblings fuse horizontally)")
    if oefs:
        return anchored(nodes, graph, oefs[0], epilogue_only=True)
    if reds:
        return anchored(nodes, graph, reds[0], epilogue_only=False)
    kind = "elementwise" if all(elementwise(n) for n in nodes) else "injective"
    if kind == "injective":
        for n in nodes:
            if not (elementwise(n) or injective(n)):
                return Refusal(RefusalKind.CATEGORY, f"{desc(n, True)} cannot join data-movement ops")
    shapes = {v.shape for v in leaving(nodes, graph)}
    if len(shapes) > 1:
        return Refusal(RefusalKind.CONDITION, f"{kind} outputs of different shapes {sorted(shapes)} cannot "
                                              f"share one loop")
    return Shape(kind, None)


def anchored(nodes, graph, anchor, epilogue_only: bool):
    """A Conv/MatMul with an elementwise epilogue, or a reduction with an elementwise prologue and
    a pointwise epilogue; every value leaving has the anchor's output shape."""
    down = walk_within(anchor, nodes, forward=True)
    up = walk_within(anchor, nodes, forward=False)
    domain = anchor.outputs[0].shape
    whose = "anchor's" if epilogue_only else "reduction's"
    for n in nodes:
        if n is anchor:
            continue
        if epilogue_only and id(n) in up:
            return Refusal(RefusalKind.CATEGORY, f"{desc(n)} would feed {desc(anchor)}: out-elementwise-fusable "
                                                 f"ops take an epilogue, never a prologue")
        if not elementwise(n):
            if epilogue_only:
                return Refusal(RefusalKind.CATEGORY, f"{desc(n, True)} cannot follow {desc(anchor)} in its "
                                                     f"kernel: only elementwise ops form an epilogue")
            where = "before" if id(n) in up else "after"
            return Refusal(RefusalKind.CATEGORY, f"{desc(n, True)} cannot be fused {where} reduction "
                                                 f"{desc(anchor)}: only elementwise ops form a prologue or epilogue")
        if id(n) in down:
            second = [v for v in n.inputs if v is not None and any(v is o for o in anchor.outputs[1:])]
            if second:
                return Refusal(RefusalKind.CATEGORY, f"{desc(n)} reads {desc(anchor)}'s output '{second[0].name}' "
                                                     f"(not its first): an epilogue computes from the anchor's first "
                                                     f"output only")
            if not pointwise(n):
                return Refusal(RefusalKind.CATEGORY, f"{desc(n)} after {desc(anchor)} would spread one result of "
                                                     f"the anchor over several output elements: an epilogue maps "
                                                     f"each anchor element to one element")
            if n.outputs[0].shape != domain:
                why = ": the epilogue runs once per output element" if epilogue_only else ""
                return Refusal(RefusalKind.CONDITION, f"epilogue op {desc(n)} has output shape "
                                                      f"{n.outputs[0].shape}, not the {whose} {domain}{why}")
    for v in leaving(nodes, graph):
        if not epilogue_only and v.producer is not None and id(v.producer) in up:
            return Refusal(RefusalKind.CONDITION, f"prologue value '{v.name}' is also read outside the group: "
                                                  f"the reduction reads its prologue through registers only")
        if v.shape != domain:
            return Refusal(RefusalKind.CONDITION, f"'{v.name}' leaves the group with shape {v.shape}, not the "
                                                  f"{whose} {domain}")
    if epilogue_only:
        return Shape(EPILOGUE_KINDS[anchor.op_type], anchor, {"epilogue": [n.name for n in nodes if id(n) in down]})
    return Shape("reduction", anchor, {"prologue": [n.name for n in nodes if id(n) in up],
                                       "epilogue": [n.name for n in nodes if id(n) in down]})


def attention(nodes, graph):
    """``MatMul(Q, K^T) -> elementwise scale/mask -> Softmax(last axis) -> MatMul(., V)`` with
    data-movement prologue (read only inside) and relabelling epilogue, as in
    ``opfuse.rules.attention``'s docstring."""
    ids = {id(n) for n in nodes}
    softmaxes = [n for n in nodes if n.op_type == "Softmax"]
    if len(softmaxes) != 1:
        return Refusal(RefusalKind.CATEGORY, "two MatMuls share a kernel only around one Softmax (attention)")
    sm = softmaxes[0]
    rank = len(sm.input(0).shape)
    if norm_axis(int(get_spec("Softmax").attrs_of(sm)["axis"]), rank, sm) != rank - 1:
        return Refusal(RefusalKind.CONDITION, f"Softmax '{sm.name}' is not over the last (key) axis")
    pvs = [u for u, i in sm.outputs[0].uses if u.op_type == "MatMul" and i == 0 and id(u) in ids]
    if len(pvs) != 1 or not internal(sm.outputs[0], {id(pvs[0])}, graph):
        return Refusal(RefusalKind.CONDITION, f"the probabilities of Softmax '{sm.name}' must feed exactly one "
                                              f"MatMul as A")
    pv = pvs[0]
    chain, v = [], sm.input(0)
    while True:  # back from the Softmax through elementwise ops, along the widest operand
        p = v.producer
        if p is None or id(p) not in ids:
            return Refusal(RefusalKind.CONDITION, f"Softmax '{sm.name}' input is not a MatMul's scores")
        if p.op_type == "MatMul":
            qk = p
            break
        if not elementwise(p):
            return Refusal(RefusalKind.CONDITION, f"'{p.name}' ({p.op_type}) between the scores and Softmax "
                                                  f"'{sm.name}' is not elementwise")
        nxt = sorted((u for u in p.input_values() if u.producer is not None and not u.is_const
                      and id(u.producer) in ids), key=lambda u: -u.size)
        if not nxt:
            return Refusal(RefusalKind.CONDITION, f"Softmax '{sm.name}' input is not a MatMul's scores")
        chain.append(p)
        v = nxt[0]
    scale_ops = chain[::-1]
    for n in [qk] + scale_ops:
        if not internal(n.outputs[0], ids, graph):
            return Refusal(RefusalKind.CONDITION, f"the scores '{n.outputs[0].name}' are also read outside the "
                                                  f"attention kernel")
    core = {id(qk), id(sm), id(pv)} | {id(n) for n in scale_ops}
    after_pv = walk_within(pv, nodes, forward=True)
    prologue, epilogue = [], []
    for n in nodes:
        if id(n) in core:
            continue
        if not injective(n):
            return Refusal(RefusalKind.CATEGORY, f"'{n.name}' ({n.op_type}) is not data movement: only index "
                                                 f"maps surround attention")
        if id(n) in after_pv:
            if not relabel(n):
                return Refusal(RefusalKind.CATEGORY, f"'{n.name}' ({n.op_type}) after the attention output does "
                                                     f"not relabel elements: only Reshape/Transpose-like moves "
                                                     f"finish an attention kernel")
            epilogue.append(n)
        else:
            if not all(internal(o, ids, graph) for o in n.outputs):
                return Refusal(RefusalKind.CONDITION, f"prologue value of '{n.name}' is also read outside the "
                                                      f"attention kernel")
            prologue.append(n)
    for n in ([pv] + epilogue)[:-1]:
        if not internal(n.outputs[0], ids, graph):
            return Refusal(RefusalKind.CONDITION, f"'{n.outputs[0].name}' is read outside before the head merge "
                                                  f"is complete")
    return {"qk": qk, "scale_ops": [n.name for n in scale_ops], "softmax": sm.name, "pv": pv.name,
            "prologue": [n.name for n in prologue], "epilogue": [n.name for n in epilogue],
            "q": qk.input(0).name, "k": qk.input(1).name, "v": pv.input(1).name}


def frozen(v):
    return tuple(frozen(x) for x in v) if isinstance(v, (list, tuple)) else v


def member_domain(nodes, shape, value):
    """One sibling's iteration domain over the shared ``value``: a pooling/reduction of it without
    prologue iterates over its window, an elementwise kernel over its (largest) output shape."""
    anchor = shape.anchor
    if shape.kind in ("single", "reduction") and anchor is not None and cat(anchor) == Category.REDUCTION \
            and anchor.inputs[0] is value and not row_normalization(anchor) and not shape.attrs.get("prologue"):
        a = get_spec(anchor.op_type).attrs_of(anchor)
        return ("window", value.shape, anchor.outputs[0].shape,
                tuple((k, frozen(a[k])) for k in WINDOW_ATTRS if k in a))
    if shape.kind in ("single", "elementwise") and all(elementwise(n) for n in nodes):
        return ("elementwise", max({v.shape for n in nodes for v in n.outputs}, key=lambda s: (len(s), s)))
    return Refusal(RefusalKind.CONDITION,
                   f"'{nodes[0].name}' ({shape.kind}) has no shared iteration domain: only poolings/"
                   f"reductions over one window and elementwise loops fuse horizontally")


def rule_of_shape(shape) -> str | None:
    if shape.kind == "reduction":
        if shape.attrs.get("prologue"):
            return "normalization_prologue" if row_normalization(shape.anchor) else "elementwise_chain"
        return "epilogue"
    return RULE_OF_KIND.get(shape.kind)


def descendants(nodes) -> set[int]:
    """Ids of every node reachable (one edge or more) from ``nodes``."""
    seen: set[int] = set()
    todo = list(nodes)
    while todo:
        n = todo.pop()
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) not in seen:
                    seen.add(id(u))
                    todo.append(u)
    return seen


def reaches(src, dst) -> bool:
    return bool(descendants(src) & {id(n) for n in dst})


def node_set_shape(graph, nodes, options: FusionOptions | None = None):
    """``opfuse.rules.siblings.node_set_shape`` with every graph fact recomputed."""
    options = options or FusionOptions()
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    nodes = sorted(nodes, key=lambda n: order[id(n)])
    if len(nodes) > options.max_ops_per_group:
        return Refusal(RefusalKind.RESOURCE, f"{len(nodes)} ops exceed the limit of "
                                                  f"{options.max_ops_per_group} per kernel")
    comps = components(nodes)
    if len(comps) == 1:
        return classify(nodes, graph)
    if len(comps) > options.max_horizontal_members:
        return Refusal(RefusalKind.RESOURCE, f"{len(comps)} siblings exceed the limit of "
                                                  f"{options.max_horizontal_members}")
    inside = {id(n) for n in nodes}
    shared = next((v for n in comps[0] for v in n.input_values()
                   if not v.is_const and (v.producer is None or id(v.producer) not in inside)
                   and all(any(w is v for n in c for w in n.input_values()) for c in comps[1:])), None)
    if shared is None:
        return Refusal(RefusalKind.CONDITION, "the sibling kernels share no input")
    domains, kinds = [], []
    for c in comps:
        shape = classify(c, graph)
        if isinstance(shape, Refusal):
            return shape
        d = member_domain(c, shape, shared)
        if isinstance(d, Refusal):
            return d
        domains.append(d)
        kinds.append(shape.kind)
    if any(d != domains[0] for d in domains[1:]):
        return Refusal(RefusalKind.CONDITION, "the siblings iterate over different domains "
                                                "(window or shape differ)")
    for i, c in enumerate(comps):
        if reaches(c, [n for j, o in enumerate(comps) if j != i for n in o]):
            return Refusal(RefusalKind.DEPENDENCY, "a path connects the siblings (they are not independent)")
    first = classify(comps[0], graph)
    anchor = first.anchor if first.anchor is not None else comps[0][0]
    return Shape("horizontal", anchor, {"members": [[n.name for n in c] for c in comps],
                                             "member_kinds": kinds, "shared_input": shared.name,
                                             "domain": domains[0]})


def check_group(graph, nodes, options: FusionOptions | None = None) -> str | None:
    options = options or FusionOptions()
    if len(nodes) <= 1:
        return None
    shape = node_set_shape(graph, nodes, options)
    if isinstance(shape, Refusal):
        return str(shape)
    rule = rule_of_shape(shape)
    if rule is not None and options.is_disabled(rule):
        return f"disabled by user: rule '{rule}' is disabled"
    return None


def group_graph(groups: list[list]) -> list[set[int]]:
    """Successor sets of the group graph of ``groups`` (lists of nodes)."""
    owner = {id(n): k for k, nodes in enumerate(groups) for n in nodes}
    return [{owner[id(u)] for n in nodes for v in n.outputs for u, _ in v.uses if id(u) in owner} - {k}
            for k, nodes in enumerate(groups)]


def has_cycle(succ: list[set[int]]) -> bool:
    indeg = [0] * len(succ)
    for s in succ:
        for j in s:
            indeg[j] += 1
    todo = [k for k, d in enumerate(indeg) if d == 0]
    done = 0
    while todo:
        k = todo.pop()
        done += 1
        for j in succ[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                todo.append(j)
    return done != len(succ)


def contraction_creates_cycle(groups: list[list], merge: set[int]) -> bool:
    """Does merging the groups with indices ``merge`` into one make the group graph cyclic?"""
    merged = [n for k in sorted(merge) for n in groups[k]]
    rest = [nodes for k, nodes in enumerate(groups) if k not in merge]
    return has_cycle(group_graph(rest + [merged]))


def groups_in_order(groups: list[list], order: dict[int, int]) -> list[int]:
    """Kahn's algorithm taking the ready group with the earliest first node."""
    succ = group_graph(groups)
    indeg = [0] * len(groups)
    for s in succ:
        for j in s:
            indeg[j] += 1
    first = [min(order[id(n)] for n in nodes) for nodes in groups]
    ready = [(first[k], k) for k in range(len(groups)) if indeg[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(k)
        for j in succ[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (first[j], j))
    if len(out) != len(groups):
        raise ModelError("fusion partition has a cycle between groups")
    return out


class ReferencePartition(Partition):
    """A ``Partition`` whose order and cycle answers are recomputed from scratch each time."""

    def _groups(self) -> tuple[list[int], list[list]]:
        gids = sorted(self.members)
        return gids, [self.members[g] for g in gids]

    def groups_in_order(self) -> list[int]:
        gids, groups = self._groups()
        return [gids[k] for k in groups_in_order(groups, self.order)]

    def position(self, gid: int) -> int:
        return self.groups_in_order().index(gid)

    def order_key(self, gid: int) -> int:
        return self.position(gid)

    def creates_cycle(self, gids) -> bool:
        all_gids, groups = self._groups()
        return contraction_creates_cycle(groups, {all_gids.index(g) for g in set(gids)})


def merge_refusal(plan, a, b, options: FusionOptions | None = None) -> Refusal | None:
    """``RuleLegality.merge_refusal`` answered from scratch."""
    options = options or FusionOptions()
    if a is b:
        return Refusal(RefusalKind.CONDITION, "a group cannot merge with itself")
    ids_a, ids_b = a.node_ids(), b.node_ids()
    adjacent = any(id(u) in ids_b for n in a.nodes for v in n.outputs for u, _ in v.uses) or \
        any(id(u) in ids_a for n in b.nodes for v in n.outputs for u, _ in v.uses)
    shared = {id(v) for v in a.inputs() if not v.is_const} & {id(v) for v in b.inputs() if not v.is_const}
    if not adjacent and not shared:
        return Refusal(RefusalKind.CONDITION, "the groups are neither adjacent nor siblings of one input")
    k_a = next(k for k, g in enumerate(plan.groups) if g is a)
    k_b = next(k for k, g in enumerate(plan.groups) if g is b)
    if contraction_creates_cycle([list(g.nodes) for g in plan.groups], {k_a, k_b}):
        return Refusal(RefusalKind.DEPENDENCY, f"merging '{a.name}' and '{b.name}' creates a cycle through "
                                         f"an outside path")
    order = {id(n): i for i, n in enumerate(plan.graph.nodes)}
    shape = node_set_shape(plan.graph, sorted([*a.nodes, *b.nodes], key=lambda n: order[id(n)]), options)
    if isinstance(shape, Refusal):
        return shape
    first, second = (a, b) if k_a < k_b else (b, a)
    rule = rule_of_shape(shape)
    if rule is not None and options.is_disabled(rule):
        return Refusal(RefusalKind.DISABLED, f"rule '{rule}' is disabled")
    return None
