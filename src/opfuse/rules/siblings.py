"""Sibling kernels that share one pass over their input: the horizontal condition on node sets.

A node set that is not connected by producer-consumer edges is a horizontal candidate: its
weakly connected components are the sibling kernels. The seed's conditions (7.1.2):

1. shared input: one non-constant value read by every sibling;
2. no dependency: no path from one sibling to another;
3. resources: at most ``max_horizontal_members`` siblings and ``max_ops_per_group`` ops;

plus one iteration domain, so the kernel really is one pass: poolings/reductions of the shared
value with the same window, or elementwise loops over the same shape (``member_domain``).
"""
from __future__ import annotations

from opfuse.rules.categories import is_elementwise, is_reduction, is_row_normalization
from opfuse.rules.decisions import RefusalKind, Refusal
from opfuse.rules.graph_index import GraphIndex
from opfuse.rules.kernel_shape import GroupShape, classify
from opfuse.rules.options import FusionOptions
from opfuse.ir.graph import Node, Value
from opfuse.ops.registry import get_spec
from opfuse.ir.walk import components_within

# Window attributes that must agree for poolings to share one pass over their input.
WINDOW_ATTRS = ("kernel_shape", "strides", "pads", "dilations", "auto_pad", "ceil_mode", "axes",
                "keepdims", "noop_with_empty_axes")


def _norm(v):
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    return v


def member_domain(nodes: list[Node], shape: GroupShape, value: Value) -> tuple | Refusal:
    """The iteration domain of one sibling kernel reading ``value``, or why it has none.

    A pooling/reduction of ``value`` (no prologue) iterates over its window; an elementwise
    kernel over its output shape. Siblings share a pass only when these are equal.
    """
    anchor = shape.anchor
    if shape.kind in ("single", "reduction") and anchor is not None and is_reduction(anchor) \
            and anchor.inputs[0] is value and not is_row_normalization(anchor) \
            and not shape.attrs.get("prologue"):
        a = get_spec(anchor.op_type).attrs_of(anchor)
        return ("window", value.shape, anchor.outputs[0].shape,
                tuple((k, _norm(a.get(k))) for k in WINDOW_ATTRS if k in a))
    if shape.kind in ("single", "elementwise") and all(is_elementwise(n) for n in nodes):
        outs = {v.shape for n in nodes for v in n.outputs}
        return ("elementwise", max(outs, key=lambda s: (len(s), s)))
    return Refusal(RefusalKind.CONDITION,
                   f"'{nodes[0].name}' ({shape.kind}) has no shared iteration domain: only poolings/"
                   f"reductions over one window and elementwise loops fuse horizontally")


def components(nodes: list[Node]) -> list[list[Node]]:
    """Weakly connected components through edges inside ``nodes`` (in node order)."""
    return components_within(nodes)


def node_set_shape(graph, nodes: list[Node], options: FusionOptions | None = None,
                   index: GraphIndex | None = None) -> GroupShape | Refusal:
    """The kernel shape of any node set: vertical (``classify``) or horizontal siblings.

    The caller guarantees convexity (no path leaves the set and comes back). With a
    ``GraphIndex`` of ``graph`` (built when None, O(graph)) a query costs O(len(nodes))
    plus the independence check of the siblings (``GraphIndex.reaches``).
    """
    options = options or FusionOptions()
    index = index if index is not None else GraphIndex(graph)
    nodes = index.in_order(nodes)
    too_big = options.size_refusal(len(nodes))
    if too_big is not None:
        return too_big
    comps = components(nodes)
    if len(comps) == 1:
        return classify(nodes, graph, index.outputs)
    if len(comps) > options.max_horizontal_members:
        return Refusal(RefusalKind.RESOURCE, f"{len(comps)} siblings exceed the limit of "
                                                  f"{options.max_horizontal_members}")
    inside = {id(n) for n in nodes}
    shared = None
    for v in (v for n in comps[0] for v in n.input_values()):
        if not v.is_const and (v.producer is None or id(v.producer) not in inside) and \
                all(any(w is v for n in c for w in n.input_values()) for c in comps[1:]):
            shared = v
            break
    if shared is None:
        return Refusal(RefusalKind.CONDITION, "the sibling kernels share no input")
    domains, kinds, shapes = [], [], []
    for c in comps:
        shape = classify(c, graph, index.outputs)
        if isinstance(shape, Refusal):
            return shape
        d = member_domain(c, shape, shared)
        if isinstance(d, Refusal):
            return d
        domains.append(d)
        kinds.append(shape.kind)
        shapes.append(shape)
    if any(d != domains[0] for d in domains[1:]):
        return Refusal(RefusalKind.CONDITION, "the siblings iterate over different domains "
                                                "(window or shape differ)")
    for i, c in enumerate(comps):
        others = [n for j, o in enumerate(comps) if j != i for n in o]
        if index.reaches(c, others):
            return Refusal(RefusalKind.DEPENDENCY, "a path connects the siblings (they are not independent)")
    first = shapes[0]
    anchor = first.anchor if first.anchor is not None else comps[0][0]
    return GroupShape("horizontal", anchor, {"members": [[n.name for n in c] for c in comps],
                                             "member_kinds": kinds, "shared_input": shared.name,
                                             "domain": domains[0]})
