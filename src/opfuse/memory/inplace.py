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

One anchor reads its input in place too (``int8_conv_pair``): a quantized model's integer
convolution ``Cast(x_q) -> [Sub(zp)] -> Conv -> ... -> Requantize`` whose 8-bit output has
``x_q``'s shape, stride 1, and is either depthwise (one channel per group) or 1x1 with one group.
Its kernels read every input element an output element needs before storing over it, in every
form the code generator emits for it (the conditions below are the ones under which it emits
them: an int32 Conv of constant weights of int16 range, ``codegen/qconv.py``'s test):

* depthwise (``codegen/qdepthwise.py``, plane by plane): an input row goes into the ring of int16
  rows before the output row of the same index is stored, and is never read from the tensor
  again; a plane's outputs land only on the same plane (the host's AVX2 kernels, ``qgemm.py``,
  copy a whole plane or image into their padded buffer before computing it);
* 1x1 (``qconv.py``: the column of every input channel at a position, then every output
  channel at that position; ``qgemm.py``: the whole image rewritten into words first): output
  ``(c, p)`` lands on input ``(c, p)``, whose column was gathered before.

On a microcontroller this is what takes a depthwise-separable network's arena below the
layer-by-layer bound: a layer's input and output no longer both live in full.

The facts come from op categories only, so this module does not depend on the code
generator; the generator honours the decision by passing one pointer for both.
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionGroup
from opfuse.ir.walk import ancestors_within, descendants_within
from opfuse.ops.nn import conv_geometry
from opfuse.ops.registry import Category, get_spec

EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
INT16_MAX = 32767  # the integer conv kernels' weights are int16 (codegen/qconv.py's INT16_MAX)


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
    if anchor is not None and len(outputs) == 1:
        pair = int8_conv_pair(group, anchor, outputs[0], static)
        if pair is not None:
            return [pair]
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


def int8_conv_pair(group: FusionGroup, anchor: Node, out: Value, static: dict) -> tuple[Value, Value] | None:
    """``(x_q, out)`` when the integer conv ``anchor`` may store ``out`` over its 8-bit input ``x_q``
    (see the module docstring), else None."""
    if anchor.op_type != "Conv" or anchor.outputs[0].dtype != np.int32 or len(anchor.outputs[0].shape) != 4:
        return None
    w = static.get(id(anchor.input(1)))
    if w is None or np.abs(w.astype(np.int64)).max(initial=0) > INT16_MAX:
        return None
    # the prologue: x_q -> Cast(int32) -> [Sub(constant zero point)] -> the Conv's input 0, each read once
    ids = group.node_ids()
    v = anchor.input(0)
    sub = v.producer
    if sub is not None and sub.op_type == "Sub" and id(sub) in ids and id(sub.input(1)) in static:
        v = sub.input(0)
    else:
        sub = None
    cast = v.producer
    if cast is None or cast.op_type != "Cast" or id(cast) not in ids:
        return None
    x_q = cast.input(0)
    if x_q.dtype not in EIGHT_BIT or id(x_q) in static or x_q.producer is None or id(x_q.producer) in ids:
        return None
    if [u for u, _ in x_q.uses if id(u) in ids] != [cast] or any(len(n.outputs[0].uses) != 1
                                                                 for n in (cast, sub) if n is not None):
        return None
    if out.dtype.itemsize != 1 or out.shape != x_q.shape or out.producer is None:
        return None
    geo, G = conv_geometry(anchor)
    C = x_q.shape[1]
    if any(s != 1 for s in geo.strides) or anchor.outputs[0].shape != x_q.shape:
        return None
    depthwise = G == C and len(geo.kernel) == 2
    pointwise = G == 1 and tuple(geo.kernel) == (1, 1)
    return (x_q, out) if depthwise or pointwise else None
