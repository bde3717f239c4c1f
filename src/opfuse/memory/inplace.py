"""When may a kernel write an output over one of its inputs?

A kernel may store output ``o`` into the bytes of input ``i`` (when ``i`` dies at that
kernel) if, for every element ``j``, the kernel reads ``i[j]`` only while computing
``o[j]`` and before storing it. That holds when:

* every group output has one shape, so the kernel is one pass over one index space;
* ``i`` has that shape and ``o``'s dtype size, and is read only by elementwise/broadcast
  nodes (category ELEMWISE or BROADCAST) whose outputs keep that shape: no op reads it at
  a shifted or permuted index;
* nothing computed from ``i`` flows into the group's anchor (a Conv, MatMul, pool or
  reduction reads many input elements per output element), i.e. ``i`` is an epilogue
  operand, not a prologue one;
* the group has at most one anchor and no data-movement (injective) op, and with an anchor
  every output comes from the anchor's pass (one loop structure writes everything);
* every node of the group that reads ``i`` is ``o``'s producer or one of its ancestors in
  the group: then all reads of ``i[j]`` happen while computing ``o[j]`` (the code generator
  memoises them), before ``o[j]`` is stored. With several outputs, a reader of ``i`` that
  only feeds another output may be evaluated after ``o[j]`` was stored over ``i[j]``.

The facts come from op categories only, so this module does not depend on the code
generator; the generator honours the decision by passing one pointer for both.
"""
from __future__ import annotations

from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionGroup
from opfuse.ir.walk import ancestors_within, descendants_within
from opfuse.ops.registry import Category, get_spec


def is_pointwise(node: Node) -> bool:
    """Elementwise or broadcast, reading every operand at the output's own index."""
    return get_spec(node.op_type, node).is_pointwise


def _downstream(group: FusionGroup, start: Value) -> set[int]:
    """Ids of the group nodes that read ``start`` and everything inside the group after them."""
    ids = group.node_ids()
    seen: set[int] = set()
    for u, _ in start.uses:
        if id(u) in ids and id(u) not in seen:
            seen.add(id(u))
            seen |= descendants_within(u, ids)
    return seen


def _upstream(group: FusionGroup, node: Node) -> set[int]:
    """Ids of ``node`` and the group nodes it depends on through values inside the group."""
    return {id(node)} | ancestors_within(node, group.node_ids())


def inplace_candidates(group: FusionGroup, graph: Graph, static: dict) -> list[tuple[Value, Value]]:
    """``(input, output)`` pairs the kernel of ``group`` can compute in place, in group order."""
    live_nodes = [n for n in group.nodes if not all(id(v) in static for v in n.outputs)]
    outputs = [v for v in group.outputs(graph) if id(v) not in static]
    if not outputs or len({v.shape for v in outputs}) != 1:
        return []
    anchors = [n for n in live_nodes if not is_pointwise(n)]
    if len(anchors) > 1 or any(get_spec(n.op_type, n).category == Category.INJECTIVE for n in anchors):
        return []
    anchor = anchors[0] if anchors else None
    ids = group.node_ids()
    if anchor is not None:
        # Every output must come from the anchor's pass: an output computed by a separate
        # pointwise pass first could overwrite an input the anchor's epilogue still reads.
        after = set().union(*(_downstream(group, v) for v in anchor.outputs)) | {id(anchor)}
        if any(id(o.producer) not in after for o in outputs):
            return []
    pairs = []
    taken: set[int] = set()
    for i in group.inputs():
        if id(i) in static or i.producer is None or i.shape != outputs[0].shape:
            continue
        users = [u for u, _ in i.uses if id(u) in ids]
        if not users or any(not is_pointwise(u) or u.outputs[0].shape != i.shape for u in users):
            continue
        if anchor is not None and id(anchor) in _downstream(group, i):
            continue
        for o in outputs:
            if id(o) not in taken and o.dtype.itemsize == i.dtype.itemsize and o.nbytes == i.nbytes \
                    and o.producer is not None and all(id(u) in _upstream(group, o.producer) for u in users):
                pairs.append((i, o))
                taken.add(id(o))
                break
    return pairs
