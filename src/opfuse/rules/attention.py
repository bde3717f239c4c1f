"""Attention as one kernel: ``MatMul(Q, K^T) -> scale/mask -> Softmax -> MatMul(., V)``.

The seed's BERT case (7.4.4): Q/K/V projection and attention are two kernels instead of six.
The score matrix ``S = softmax(Q K^T * scale + mask)`` (``heads x seq x seq``) is the largest
tensor of the layer; inside one kernel it is produced and consumed row by row (online softmax)
and never written to memory.

The attention group holds:

* ``qk``: the score MatMul; ``scale_ops``: the elementwise chain between it and the Softmax
  (Div/Mul by the scale, Add of a mask); ``softmax`` over the last axis; ``pv``: the MatMul of
  the probabilities (its input A) with V;
* ``prologue``: data movement producing Q, K and V (Split of a fused QKV projection, head
  Reshape/Transpose), whose outputs are read only inside the group: the kernel reads Q, K, V
  through index maps straight from the projection's output;
* ``epilogue``: relabelling data movement after ``pv`` (merge heads: Transpose, Reshape),
  which stores each finished output element at its final index; Slice, Pad, Gather,
  Concat... after ``pv`` would drop or repeat elements of a row being finished, so they
  end the kernel.

``attention_structure`` checks a node set has this shape; ``find_attention`` grows the set
around each Softmax for the ``attention`` fusion rule.
"""
from __future__ import annotations

import numpy as np

from opfuse.patterns import Op
from opfuse.rules.categories import is_elementwise, is_injective, is_relabel
from opfuse.rules.decisions import RefusalKind, Refusal
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.common import norm_axis
from opfuse.ops.registry import get_spec
from opfuse.ir.walk import descendants_within
from opfuse.rules.rule import Fuse, Rule
from opfuse.rules.site import Site


def _refuse(msg: str) -> Refusal:
    return Refusal(RefusalKind.CONDITION, msg)


def _internal(v: Value, ids: set[int], outputs: frozenset[int]) -> bool:
    return id(v) not in outputs and all(id(u) in ids for u, _ in v.uses)


def score_chain(softmax: Node, graph: Graph, ids: set[int] | None = None) -> tuple[Node, list[Node]] | Refusal:
    """Walk from the Softmax input back through elementwise ops to the score MatMul.

    Returns ``(qk, scale_ops)``; with ``ids`` the walk stays inside that node set.
    """
    chain: list[Node] = []
    v = softmax.input(0)
    while True:
        p = v.producer
        if p is None or (ids is not None and id(p) not in ids):
            return _refuse(f"Softmax '{softmax.name}' input is not a MatMul's scores")
        if p.op_type == "MatMul":
            return p, chain[::-1]
        if not is_elementwise(p):
            return _refuse(f"'{p.name}' ({p.op_type}) between the scores and Softmax '{softmax.name}' "
                           f"is not elementwise")
        nxt = [u for u in p.input_values() if u.producer is not None and not u.is_const
               and (ids is None or id(u.producer) in ids)]
        # The chain continues through the operand that carries the scores (the widest one).
        nxt.sort(key=lambda u: -u.size)
        if not nxt:
            return _refuse(f"Softmax '{softmax.name}' input is not a MatMul's scores")
        chain.append(p)
        v = nxt[0]


def attention_structure(nodes: list[Node], graph: Graph, outputs: frozenset[int] | None = None) -> dict | Refusal:
    """Check ``nodes`` form one attention kernel; returns its parts by role (``outputs``: the
    ids of the graph's outputs, computed when None)."""
    ids = {id(n) for n in nodes}
    outputs = frozenset(id(v) for v in graph.outputs) if outputs is None else outputs
    softmaxes = [n for n in nodes if n.op_type == "Softmax"]
    if len(softmaxes) != 1:
        return Refusal(RefusalKind.CATEGORY, "two MatMuls share a kernel only around one Softmax "
                                                    "(attention)")
    sm = softmaxes[0]
    a = get_spec("Softmax").attrs_of(sm)
    rank = len(sm.input(0).shape)
    if norm_axis(int(a["axis"]), rank, sm) != rank - 1:
        return _refuse(f"Softmax '{sm.name}' is not over the last (key) axis")
    pvs = [u for u, i in sm.outputs[0].uses if u.op_type == "MatMul" and i == 0 and id(u) in ids]
    if len(pvs) != 1 or not _internal(sm.outputs[0], {id(pvs[0])}, outputs):
        return _refuse(f"the probabilities of Softmax '{sm.name}' must feed exactly one MatMul as A")
    pv = pvs[0]
    found = score_chain(sm, graph, ids)
    if isinstance(found, Refusal):
        return found
    qk, scale_ops = found
    if pv.outputs[0].dtype != np.float32 or any(len(v.shape) < 2 for v in (qk.input(0), qk.input(1), pv.input(1))):
        return _refuse("the attention kernel computes float32 operands of rank >= 2 only")
    for n in [qk] + scale_ops:
        if not _internal(n.outputs[0], ids, outputs):
            return _refuse(f"the scores '{n.outputs[0].name}' are also read outside the attention kernel")
    core = {id(qk), id(sm), id(pv)} | {id(n) for n in scale_ops}
    prologue, epilogue = [], []
    after_pv = descendants_within(pv, ids)
    for n in nodes:
        if id(n) in core:
            continue
        if not is_injective(n):
            return Refusal(RefusalKind.CATEGORY,
                           f"'{n.name}' ({n.op_type}) is not data movement: only index maps surround attention")
        if id(n) in after_pv:
            if not is_relabel(n):
                return Refusal(RefusalKind.CATEGORY,
                               f"'{n.name}' ({n.op_type}) after the attention output does not relabel "
                               f"elements: only Reshape/Transpose-like moves finish an attention kernel")
            epilogue.append(n)
        else:
            if not all(_internal(v, ids, outputs) for v in n.outputs):
                return _refuse(f"prologue value of '{n.name}' is also read outside the attention kernel")
            prologue.append(n)
    chain = [pv] + epilogue
    for n in chain[:-1]:  # the last value of the chain is the kernel's output
        if not _internal(n.outputs[0], ids, outputs):
            return _refuse(f"'{n.outputs[0].name}' is read outside before the head merge is complete")
    return {"qk": qk, "scale_ops": [n.name for n in scale_ops], "softmax": sm.name, "pv": pv.name,
            "prologue": [n.name for n in prologue], "epilogue": [n.name for n in epilogue],
            "q": qk.input(0).name, "k": qk.input(1).name, "v": pv.input(1).name}


def find_attention(graph: Graph, softmax: Node, order: dict[int, int] | None = None,
                   outputs: frozenset[int] | None = None) -> list[Node] | Refusal:
    """The attention node set around ``softmax`` (before checking it), or why there is none;
    ``order`` (node id -> graph position) and ``outputs`` (graph output ids), when the caller
    has them, save recomputing them per Softmax."""
    outputs = frozenset(id(v) for v in graph.outputs) if outputs is None else outputs
    found = score_chain(softmax, graph)
    if isinstance(found, Refusal):
        return found
    qk, scale_ops = found
    pvs = [u for u, i in softmax.outputs[0].uses if u.op_type == "MatMul" and i == 0]
    if len(pvs) != 1:
        return _refuse(f"Softmax '{softmax.name}' does not feed one MatMul")
    pv = pvs[0]
    members: dict[int, Node] = {id(n): n for n in [qk, *scale_ops, softmax, pv]}
    # Prologue: data movement whose every output is read only by the kernel (to a fixpoint,
    # since a Split joins only once all of its Q/K/V consumers are in).
    grew = True
    while grew:
        grew = False
        for n in list(members.values()):
            if id(n) in (id(x) for x in scale_ops) or n is softmax:
                continue
            operands = n.input_values() if n is not pv else [pv.input(1)]
            if n is not qk and n is not pv and not is_injective(n):
                continue
            for v in operands:
                p = v.producer
                if p is None or id(p) in members or not is_injective(p):
                    continue
                if all(id(w) not in outputs and all(id(u) in members for u, _ in w.uses) for w in p.outputs):
                    members[id(p)] = p
                    grew = True
    # Epilogue: the chain of single-reader relabelling moves after pv (merging the heads).
    v = pv.outputs[0]
    while len(v.uses) == 1 and id(v) not in outputs and is_relabel(v.uses[0][0]) \
            and len(v.uses[0][0].outputs) == 1:
        n = v.uses[0][0]
        members[id(n)] = n
        v = n.outputs[0]
    if order is None:
        order = {id(n): i for i, n in enumerate(graph.nodes)}
    return sorted(members.values(), key=lambda n: order[id(n)])


# The rule ---------------------------------------------------------------------------------------
def propose_attention(grouping, matches):
    """Around each Softmax: the whole attention (scores, scale/mask, Softmax, PV, head moves)."""
    p = grouping.p
    for m in matches:
        sm = m.nodes[0]
        nodes = find_attention(p.graph, sm, p.order, p.outputs)
        if isinstance(nodes, Refusal):
            yield Site({p.gid(sm)}, [sm.name], refusal=nodes)
            continue
        names = [n.name for n in nodes if n.op_type in ("MatMul", "Softmax")]
        yield Site({p.gid(n) for n in nodes}, names, f"{len(nodes)} ops in one attention kernel")


ATTENTION = Rule("attention", Op("Softmax").named("softmax"), action=Fuse(propose_attention), priority=7,
                 description="MatMul -> scale/mask -> Softmax -> MatMul (+ head split/merge) in one kernel")

__all__ = ["ATTENTION", "attention_structure", "find_attention", "score_chain"]
