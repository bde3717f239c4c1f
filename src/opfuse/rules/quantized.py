"""``dequantize_prologue``: an 8-bit tensor is dequantized by the op that reads it.

In a quantized model every tensor between kernels is 8-bit: a group ends in a ``QuantizeLinear``
or ``Requantize`` (its epilogue writes int8/uint8), and the next one reads it through

    x_q -> Cast(int32 | float32) -> Sub(zero point) [-> Mul(scale)] -> Conv/MatMul/Gemm   (input 0, or B)

(the integer conv's centering ``int32(x_q) - x_zp``, or the float op's ``DequantizeLinear``).
Left alone the ``epilogue`` rule hands that chain to the *producer's* kernel, which then writes
the centred int32 (or dequantized float32) tensor: four bytes an element instead of one. This
rule runs first and gives the chain to the *consumer* as its prologue: the anchor applies it to
each element as it reads it (``Evaluator.at``: padding stays zero, as in the unfused graph), so
the group boundary is the 8-bit tensor and the memory plan sizes it at one byte.

The same holds for any other reader (a pooling, a Concat's requantization, the residual operand of a
Conv's epilogue): the chain joins the reader's group, which reads the 8-bit tensor; a reader in an
anchor's epilogue (``Conv -> Add(bias) -> Requantize(acc, .., residual)``) brings that anchor along,
so the residual's producer cannot take the reader into its own epilogue instead.

Pattern ``Cast(q) >> [Sub(zero point)] >> [Mul(scale)] >> reader``, every inner value read only by
the next op (the pattern language's *only used by*). Condition (``prologue_refusal``, also what the
one legality asks of an anchored group's prologue): ``q`` is int8/uint8, every op of the chain is
pointwise with the anchor operand's shape, its other operands are constants, and the chain feeds
the anchor's data operand (Conv input 0, MatMul/Gemm A or B; never Gemm's C).
"""
from __future__ import annotations

import numpy as np

from opfuse.ir.graph import Node
from opfuse.patterns import Op, Var, check, const_inputs, has_dtype
from opfuse.rules.categories import is_pointwise
from opfuse.rules.decisions import Refusal, RefusalKind
from opfuse.rules.rule import Fuse, Rule
from opfuse.rules.site import Site

RULE = "dequantize_prologue"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
ANCHORS = ("Conv", "MatMul", "Gemm")
DATA_SLOTS = {"Conv": (0,), "MatMul": (0, 1), "Gemm": (0, 1)}
ANCHOR_SEARCH_DEPTH = 4  # elementwise ops between a residual reader and the anchor whose result it reads


def _refuse(msg: str) -> Refusal:
    return Refusal(RefusalKind.CONDITION, msg)


def prologue_refusal(prologue: list[Node], anchor: Node, inside: set[int]) -> Refusal | None:
    """Why ``prologue`` (group nodes feeding ``anchor``, in topological order; ``inside``: the ids
    of the group's nodes) cannot be the anchor's dequantizing prologue, or None."""
    if anchor.op_type not in ANCHORS:
        return _refuse(f"'{anchor.name}' ({anchor.op_type}) takes no prologue")
    ids = {id(n) for n in prologue}
    made = {id(v) for n in prologue for v in n.outputs}
    fed = [i for i, v in enumerate(anchor.inputs) if v is not None and id(v) in made]
    if any(i not in DATA_SLOTS[anchor.op_type] for i in fed):
        return _refuse(f"the prologue feeds operand {fed} of '{anchor.name}' ({anchor.op_type}), not its data")
    shapes = {v.shape for v in anchor.inputs if v is not None and id(v) in made}  # the operands it feeds
    sources = 0
    for n in prologue:
        if not is_pointwise(n):
            return _refuse(f"'{n.name}' ({n.op_type}) before '{anchor.name}' is not pointwise")
        for v in n.input_values():
            if id(v) in made or v.is_const:
                continue
            if v.dtype not in EIGHT_BIT:
                return _refuse(f"'{n.name}' ({n.op_type}) reads '{v.name}' ({v.dtype}): a prologue reads an "
                               f"8-bit tensor and constants only")
            sources += 1
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) not in ids and u is not anchor:
                    where = "outside the group" if id(u) not in inside else f"by '{u.name}' after the anchor"
                    return _refuse(f"prologue value '{v.name}' is also read {where}: the anchor reads its "
                                   f"prologue through registers only")
        if any(v.shape not in shapes for v in n.outputs):
            return _refuse(f"'{n.name}' ({n.op_type}) changes the shape before '{anchor.name}'")
    if not sources:
        return _refuse(f"the prologue of '{anchor.name}' reads no 8-bit tensor")
    return None


def reads_8bit(prologue: list[Node], inside: set[int]) -> bool:
    """Does ``prologue`` read an 8-bit tensor from outside the group (is it a dequantization at all)?"""
    return any(v.dtype in EIGHT_BIT and not v.is_const and (v.producer is None or id(v.producer) not in inside)
               for n in prologue for v in n.input_values())


def _anchor_path(reader: Node, chain: set[int]) -> list[Node]:
    """The Conv/MatMul/Gemm whose result ``reader`` (elementwise) combines with the dequantized tensor,
    and the ops between them, each read only on that path: ``acc -> Add(bias) -> Requantize(.., res)``.
    Empty when there is none within ``ANCHOR_SEARCH_DEPTH`` ops."""
    if not is_pointwise(reader):
        return []
    todo: list[tuple[Node, list[Node]]] = [(v.producer, []) for v in reader.input_values()
                                           if v.producer is not None and id(v.producer) not in chain]
    while todo:
        n, path = todo.pop(0)
        if any(len(v.uses) != 1 for v in n.outputs):
            continue
        if n.op_type in ANCHORS:
            return path + [n]
        if is_pointwise(n) and len(path) < ANCHOR_SEARCH_DEPTH:
            todo += [(v.producer, path + [n]) for v in n.input_values() if v.producer is not None]
    return []


def _propose(grouping, matches):
    p = grouping.p
    for m in matches:
        reader = m["reader"]
        chain = [n for n in m.nodes if n is not reader]
        names = [chain[0].name, reader.name]
        q = m["q"]
        refusal = prologue_refusal(chain, reader, {id(n) for n in m.nodes}) if reader.op_type in ANCHORS else None
        # An elementwise reader of an anchor's result (a residual Add or Requantize) takes the anchor
        # along, so the producer of the 8-bit tensor cannot claim the reader as its own epilogue.
        anchor = [] if reader.op_type in ANCHORS else _anchor_path(reader, {id(n) for n in chain})
        yield Site({p.gid(n) for n in list(m.nodes) + anchor}, names + [n.name for n in anchor[-1:]],
                   f"'{q.name}' read as 8 bits by '{reader.name}'", refusal=refusal)


def dequantize_pattern():
    """``Cast(q) [-> Sub(zero point)] [-> Mul(scale)] -> reader``, ``q`` 8-bit (DequantizeLinear as
    imported, or an integer op's centering), each step read only by the next."""
    q = Var("q").where(has_dtype(*EIGHT_BIT))
    return (Op("Cast")(q).named("cast") >> Op("Sub").where(const_inputs(1)).opt()
            >> Op("Mul").where(check(lambda n: any(v.is_const for v in n.input_values()), "a constant scale")).opt()
            >> Op().named("reader"))


DEQUANTIZE_PROLOGUE = Rule(
    RULE, dequantize_pattern(), action=Fuse(_propose), priority=5.5,
    description="int8/uint8 tensor -> Cast/Sub/Mul -> into the op reading it (a Conv/MatMul/Gemm's prologue)")


__all__ = ["DEQUANTIZE_PROLOGUE", "prologue_refusal", "reads_8bit", "dequantize_pattern", "RULE"]
