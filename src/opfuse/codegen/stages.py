"""Split a fusion group into *stages*: the loop nests of its kernel.

Nodes are *inline* (elementwise, broadcast, data movement: computed per element in
registers by ``rules.py``) or *anchors* (Conv, MatMul, Gemm, pools, reductions, Softmax,
LayerNorm, and a Concat whose result leaves the group): an anchor has its own loop
structure and finishes output elements one tile or row at a time.

* Every group output that depends on no anchor is computed by a *pointwise* stage: one
  loop nest per output shape.
* Every group output that depends on exactly one anchor (through inline nodes) is stored
  by that anchor's stage, in its epilogue, while the anchor's result is in registers. It
  must have the anchor's output shape (the epilogue runs over the anchor's elements).
* Inline nodes feeding an anchor are its prologue: the anchor reads its operands through
  them (``Evaluator.at``), so they are never stored either.
* An attention group (``MatMul -> scale/mask -> Softmax -> MatMul``) is one stage.
* Sibling anchors that can share one pass over their common input (MatMuls/Gemms of one
  activation with constant weights, Convs of equal geometry, pools with one window) are
  merged into one ``horizontal`` stage (``merge_siblings``; lowered by ``horizontal.py``).

Anchors that feed other anchors inside one group must go through a value the group
stores (the later stage reads it back); anything else raises ``UnsupportedGroupError``.
Stages run in order: pointwise first (they read only group inputs), anchors in node order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from opfuse.codegen.kernel import UnsupportedGroupError
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionGroup
from opfuse.ops.registry import Category, get_spec

# Data movement an epilogue can run after its anchor: it only relabels the element's index.
RELABEL_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})

INLINE_CATEGORIES = (Category.ELEMWISE, Category.BROADCAST, Category.INJECTIVE)


@dataclass
class Stage:
    kind: str                     # pointwise | anchor | attention | horizontal
    anchor: Node | None = None    # for anchor stages
    anchors: list[Node] = field(default_factory=list)  # attention: mm1, softmax, mm2
    outputs: list[Value] = field(default_factory=list)  # group outputs this stage stores
    epilogue: list[Node] = field(default_factory=list)  # inline nodes after the anchor, in order
    members: list["Stage"] = field(default_factory=list)  # horizontal: the merged sibling stages

    @property
    def anchor_node(self) -> Node:
        """The anchor of an ``anchor`` stage (each member of a horizontal stage is one)."""
        if self.anchor is None:
            raise AssertionError(f"a {self.kind} stage has no single anchor")
        return self.anchor

    @property
    def domain(self) -> tuple[int, ...]:
        if self.kind == "pointwise":
            return self.outputs[0].shape
        last = self.anchors[-1] if self.anchors else self.anchor_node
        return last.outputs[0].shape


def is_inline(node: Node) -> bool:
    return get_spec(node.op_type, node).category in INLINE_CATEGORIES


@dataclass
class GroupAnalysis:
    group: FusionGroup
    live: list[Node]            # nodes not folded at compile time
    inline: set[int]            # ids of inline nodes
    outputs: list[Value]        # group outputs that need storing
    stages: list[Stage]


def _attention_chain(group: FusionGroup, live: list[Node], out_ids: set[int]) -> list[Node] | None:
    """(mm1, softmax, mm2) when the group holds MatMul -> inline* -> Softmax(last axis) -> MatMul."""
    ids = {id(n) for n in live}
    for sm in live:
        if sm.op_type != "Softmax":
            continue
        x = sm.outputs[0]
        consumers = [u for u, _ in x.uses]
        if len(consumers) != 1 or consumers[0].op_type != "MatMul" or id(consumers[0]) not in ids \
                or consumers[0].inputs[0] is not x or id(x) in out_ids:
            continue
        axis = sm.attrs.get("axis", -1)
        if axis not in (-1, len(x.shape) - 1):
            continue
        # Walk back from the Softmax through single-use inline nodes to a MatMul.
        v = sm.input(0)
        while v.producer is not None and id(v.producer) in ids and is_inline(v.producer) and id(v) not in out_ids:
            main = [u for u in v.producer.input_values() if u.shape == v.shape]
            if len(main) != 1:
                break
            v = main[0]
        if v.producer is not None and v.producer.op_type == "MatMul" and id(v.producer) in ids \
                and id(v) not in out_ids:
            return [v.producer, sm, consumers[0]]
    return None


def _epilogue_can_follow(anchor: Node, ids: set[int]) -> bool:
    """Whether every group node downstream of ``anchor`` can run in its epilogue: a relabelling
    (Reshape family, Transpose) or a pointwise op whose anchor-dependent operands have its shape
    (what ``epilogue.finish_element`` sweeps)."""
    reached = {id(v) for v in anchor.outputs}
    todo = [u for v in anchor.outputs for u, _ in v.uses if id(u) in ids]
    seen: set[int] = set()
    while todo:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        dep = [v for v in n.input_values() if id(v) in reached]
        spec = get_spec(n.op_type, n)
        if n.op_type not in RELABEL_OPS and not (spec.is_pointwise and all(v.shape == n.outputs[0].shape for v in dep)):
            return False
        reached.update(id(v) for v in n.outputs)
        todo.extend(u for v in n.outputs for u, _ in v.uses if id(u) in ids)
    return True


def analyse(group: FusionGroup, graph: Graph, static: dict) -> GroupAnalysis:
    live = [n for n in group.nodes if not all(id(v) in static for v in n.outputs)]
    outputs = [v for v in group.outputs(graph) if id(v) not in static]
    out_ids = {id(v) for v in outputs}
    attention = _attention_chain(group, live, out_ids) if group.kind != "single" else None
    att_ids = {id(n) for n in attention} if attention else set()

    def anchor_like(n: Node) -> bool:
        if id(n) in att_ids:
            return True
        if not is_inline(n):
            return True
        # A Concat whose result leaves the group copies its inputs slice by slice (when what
        # follows it in the group can be its epilogue; else it is computed inline).
        return n.op_type == "Concat" and any(id(v) in out_ids for v in n.outputs) \
            and _epilogue_can_follow(n, {id(m) for m in live})

    anchors = [n for n in live if anchor_like(n)]
    anchor_ids = {id(n) for n in anchors}
    inline = {id(n) for n in live if id(n) not in anchor_ids}
    node_ids = {id(n) for n in live}
    # Anchors each value depends on through inline nodes (group nodes are in topological order).
    dep_of: dict[int, frozenset] = {}
    for n in live:
        if id(n) in anchor_ids:
            d = frozenset({id(n)})
        else:
            d = frozenset().union(*(dep_of.get(id(v), frozenset()) for v in n.input_values()))
        for v in n.outputs:
            dep_of[id(v)] = d

    def deps(v: Value) -> frozenset:
        return dep_of.get(id(v), frozenset())

    stages: list[Stage] = []
    by_anchor: dict[int, Stage] = {}
    att_stage = Stage("attention", anchors=list(attention)) if attention else None
    for n in anchors:
        if att_stage is not None and id(n) in att_ids:
            by_anchor[id(n)] = att_stage
        else:
            by_anchor[id(n)] = Stage("anchor", anchor=n)
    pointwise: dict[tuple, Stage] = {}
    for v in outputs:
        d = deps(v)
        stages_hit = {id(by_anchor[a]) for a in d}
        if not d:
            pointwise.setdefault(v.shape, Stage("pointwise")).outputs.append(v)
            continue
        if len(stages_hit) > 1:
            names = sorted(n.name for n in anchors if id(n) in d)
            raise UnsupportedGroupError(group, f"output '{v.name}' combines the results of several "
                                               f"anchors ({', '.join(names)}) element by element")
        by_anchor[next(iter(d))].outputs.append(v)
    # Anchors whose results stay inside the group must reach a group output.
    for n in anchors:
        st = by_anchor[id(n)]
        users = [u.name for v in n.outputs for u, _ in v.uses if id(u) in node_ids]
        if st.kind == "anchor" and not st.outputs and users:
            raise UnsupportedGroupError(group, f"anchor '{n.name}' ({n.op_type}) feeds only other anchors "
                                               f"({', '.join(users)}) inside the group; its result would "
                                               f"need a buffer")
    for n in live:  # each inline node downstream of an anchor belongs to that anchor's epilogue
        if id(n) in inline:
            d = deps(n.outputs[0])
            hit = {id(by_anchor[a]) for a in d}
            if len(hit) == 1:
                by_anchor[next(iter(d))].epilogue.append(n)
    stages.extend(pointwise.values())
    seen: set[int] = set()
    for n in anchors:
        st = by_anchor[id(n)]
        if id(st) not in seen and st.outputs:
            seen.add(id(st))
            stages.append(st)
    if sum(1 for st in stages if st.kind == "anchor") > 1:
        stages = merge_siblings(stages, static)
    return GroupAnalysis(group, live, inline, outputs, stages)


def _merge_key(stage: Stage, static: dict) -> tuple | None:
    """Stages with equal keys can share one pass (``None``: never merged)."""
    if stage.kind != "anchor":
        return None
    n = stage.anchor_node
    if n.outputs[0].dtype != np.float32:
        return None
    if n.op_type == "MatMul":
        A, B = n.input(0), n.input(1)
        if id(B) in static and len(B.shape) == 2 and len(A.shape) >= 2 and id(A) not in static:
            return ("matmul", id(A), B.shape[0])
    if n.op_type == "Gemm":
        a = get_spec(n.op_type, n).attrs_of(n)
        A, B = n.input(0), n.input(1)
        if id(B) in static and id(A) not in static:
            return ("gemm", id(A), int(a["transA"]))
    if n.op_type == "Conv":
        from opfuse.ops.nn import window_geometry
        a = get_spec(n.op_type, n).attrs_of(n)
        x, w = n.input(0), n.input(1)
        if int(a["group"]) == 1 and id(w) in static and id(x) not in static:
            geo = window_geometry(n, a, tuple(x.shape[2:]), tuple(w.shape[2:]))
            return ("conv", id(x), geo)
    if n.op_type in ("MaxPool", "AveragePool") and len(n.outputs) == 1:  # (not with MaxPool's Indices)
        from opfuse.ops.nn import window_geometry
        a = get_spec(n.op_type, n).attrs_of(n)
        x = n.input(0)
        geo = window_geometry(n, a, tuple(x.shape[2:]), tuple(int(k) for k in a["kernel_shape"]),
                              ceil_mode=bool(a["ceil_mode"]))
        return ("pool", id(x), geo)
    return None


def merge_siblings(stages: list[Stage], static: dict) -> list[Stage]:
    """Replace runs of mergeable sibling stages by one ``horizontal`` stage each."""
    stored = {id(v) for st in stages for v in st.outputs}
    groups: dict[tuple, list[Stage]] = {}
    order: list[Stage | tuple] = []
    for st in stages:
        key = _merge_key(st, static)
        # A sibling must read only what exists before the merged pass starts.
        if key is not None and any(id(v) in stored for v in st.anchor_node.input_values()):
            key = None
        if key is None:
            order.append(st)
            continue
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(st)
    result = []
    for item in order:
        if isinstance(item, Stage):
            result.append(item)
            continue
        members = groups[item]
        if len(members) == 1:
            result.append(members[0])
        else:
            result.append(Stage("horizontal", anchors=[m.anchor_node for m in members],
                                outputs=[v for m in members for v in m.outputs],
                                members=members))
    return result
