"""``dequantize_late``: data movement before a dequantization, so the 8-bit tensor is what moves.

    q (8-bit) -> Cast -> [Sub(zp)] -> [Mul(s)] -> Reshape | Flatten | Squeeze | Unsqueeze |
                                                   Transpose | Split | Slice -> y_1 .. y_k

becomes ``q -> (the same data movement) -> Cast -> [Sub(zp)] -> [Mul(s)] -> y_i`` for each output.
Exact: ``zp`` and ``s`` are scalars, so the elementwise chain commutes with an op that only moves
elements. The 8-bit tensor then crosses the data movement (a Reshape of it is a view, a Split of
it a copy of a quarter the bytes) and each reader dequantizes it in its own kernel
(``rules/quantized.py``): a QDQ model's ``DQ -> Flatten -> Gemm`` or ``DQ -> Split -> Conv``.

Conditions (refusals logged with their reason): the chain is a Cast of an int8/uint8 tensor and
at most a Sub and a Mul of scalar constants, each value read only by the next op; the data
movement's other inputs are constants; none of its outputs is a graph output (its name would move).

First, a dequantization read by several ops (a Split's slice read by a Conv and a Concat) is cloned
per reader, so that each reader can take its own (the chain is two or three cheap ops).
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.registry import infer_node
from opfuse.rewrites.context import RewriteContext
from opfuse.rules.decisions import refuse

RULE = "dequantize_late"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
MOVES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Split", "Slice")


def dequantize_chain(graph: Graph, v: Value) -> list[Node] | None:
    """The nodes ``Cast(q) [-> Sub(zp)] [-> Mul(s)]`` ending in ``v`` (in order), or None."""
    chain: list[Node] = []
    cur = v
    while True:
        n = cur.producer
        if n is None or len(cur.uses) != 1 or cur in graph.outputs:
            return None
        if n.op_type == "Cast":
            if n.input(0).dtype not in EIGHT_BIT:
                return None
            chain.append(n)
            return chain[::-1]
        if n.op_type not in ("Sub", "Mul") or any(x.op_type == n.op_type for x in chain):
            return None
        consts = [u for u in n.input_values() if u.is_const]
        if len(consts) != 1 or consts[0].size != 1 or len(n.input_values()) != 2:
            return None
        var = next(u for u in n.input_values() if not u.is_const)
        if n.op_type == "Sub" and n.inputs[0] is not var:
            return None
        chain.append(n)
        cur = var


def _add(graph: Graph, op_type: str, inputs: list, attrs: dict, name: str, at: int, num_outputs: int = 1) -> Node:
    node = graph.add_node(op_type, inputs, num_outputs=num_outputs, attrs=dict(attrs), name=name, index=at)
    for out, t in zip(node.outputs, infer_node(node), strict=True):
        out.type = t
    return node


def _chain_from(graph: Graph, cast: Node) -> list[Node]:
    """``cast`` and the Sub/Mul of scalar constants after it, each value but the last read once."""
    chain = [cast]
    while True:
        v = chain[-1].outputs[0]
        if len(v.uses) != 1 or v in graph.outputs:
            return chain
        n = v.uses[0][0]
        if n.op_type not in ("Sub", "Mul") or any(x.op_type == n.op_type for x in chain) \
                or not _continues(n, chain):
            return chain
        chain.append(n)


def _continues(n: Node, chain: list[Node]) -> bool:
    """``n`` continues the chain (scalar constant operand, the chain's value first for a Sub)."""
    consts = [u for u in n.input_values() if u.is_const]
    if len(consts) != 1 or consts[0].size != 1 or len(n.input_values()) != 2:
        return False
    return n.op_type != "Sub" or n.inputs[0] is chain[-1].outputs[0]


def _clone_shared(graph: Graph, rc: RewriteContext) -> list[str]:
    """A dequantization read by several ops is cloned per reader: each reads the 8-bit tensor and
    dequantizes it in its own kernel (one shared float tensor would be stored in four bytes)."""
    cloned = []
    for cast in [n for n in graph.nodes if n.op_type == "Cast" and n.inputs and n.inputs[0] is not None
                 and n.input(0).dtype in EIGHT_BIT]:
        chain = _chain_from(graph, cast)
        end = chain[-1].outputs[0]
        readers = list(end.uses)
        if len(readers) < 2:
            continue
        for reader, slot in readers[1:]:
            at = graph.nodes.index(reader)
            cur = cast.input(0)
            for c in chain:
                ins = [cur if (u is not None and not u.is_const) else u for u in c.inputs]
                node = _add(graph, c.op_type, ins, c.attrs, c.name, at)
                rc.provenance.origin.setdefault(node.name, [])
                at += 1
                cur = node.outputs[0]
            graph.set_input(reader, slot, cur)
        cloned.append(cast.name)
    return cloned


def dequantize_late(graph: Graph, rc: RewriteContext, moves: tuple[str, ...] = MOVES, clone: bool = True) -> bool:
    """The rewrite over the data movement ops ``moves``; ``clone``: shared dequantizations cloned per reader first.
    (``recognize_integer`` runs it over Split and Slice alone, without the clones, before the integer rules.)"""
    if rc.options.is_disabled(RULE):
        return False
    cloned = _clone_shared(graph, rc) if clone else []
    if cloned:
        rc.log_applied(RULE, cloned, f"cloned {len(cloned)} shared dequantization(s) per reader")
    moved: list[str] = []
    for move in [n for n in graph.nodes if n.op_type in moves]:
        if not move.inputs or move.inputs[0] is None:
            continue
        chain = dequantize_chain(graph, move.inputs[0])
        if chain is None:
            continue
        if any(u is not None and not u.is_const for u in move.inputs[1:]):
            rc.log_refusal(RULE, [chain[0].name, move.name], refuse("the data movement has run-time operands"))
            continue
        if any(o in graph.outputs for o in move.outputs):
            rc.log_refusal(RULE, [chain[0].name, move.name], refuse("an output is a graph output"))
            continue
        at = graph.nodes.index(move)
        q = chain[0].input(0)
        new_move = _add(graph, move.op_type, [q] + list(move.inputs[1:]), move.attrs, f"{move.name}_q", at,
                        len(move.outputs))
        at += 1
        made = [new_move]
        for old_out, q_out in zip(move.outputs, new_move.outputs, strict=True):
            cur = q_out
            for c in chain:
                ins = [cur if (u is not None and not u.is_const) else u for u in c.inputs]
                node = _add(graph, c.op_type, ins, c.attrs, c.name, at)
                at += 1
                made.append(node)
                cur = node.outputs[0]
            graph.replace_all_uses(old_out, cur)
        graph.remove_node(move)
        for c in reversed(chain):
            graph.remove_node(c)
        for n in made:
            rc.provenance.origin.setdefault(n.name, [])
        rc.provenance.absorb(new_move, [move])
        for n in made[1:]:
            rc.provenance.absorb(n, [c for c in chain if c.name in rc.provenance.origin])
        moved.append(move.name)
    if moved:
        rc.log_applied(RULE, moved, f"moved {len(moved)} data movement(s) before the dequantization")
    return bool(moved) or bool(cloned)


__all__ = ["RULE", "dequantize_late", "dequantize_chain"]
