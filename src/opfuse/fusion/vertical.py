"""Vertical fusion: grow groups along the post-dominator tree, TVM style, rule by rule.

Each rule names which groups may start a merge (``starts``) and which targets it accepts
(``accepts``); the shared driver does the rest: from a node ``n`` of a starting group, take its
immediate post-dominator ``d`` and every node on the paths between them, and merge all their
groups when ``Legality.vertical`` allows it. Since ``d`` post-dominates ``n``, all of ``n``'s
readers join the group, so ``n``'s output stays on chip.

The rules, in the order they run (earlier rules win the ops they take):

``normalization_prologue``  elementwise ops before a row normalization (LayerNorm, Softmax)
    join it: the normalization re-reads its whole row anyway, so bias and residual Adds are
    applied as it reads (FasterTransformer's add-bias-residual-LayerNorm kernel). Walks in
    reverse order so a chain of Adds joins from the normalization backwards.
``epilogue``  a Conv/MatMul/Gemm or reduction takes the elementwise ops after it (bias,
    activation chain, residual Add), applied per output element in registers.
``elementwise_chain``  elementwise ops join their post-dominator when it is elementwise,
    data movement or a reduction (as its prologue); never a Conv/MatMul's input (TVM).
``injective``  data movement joins a post-dominator reached through data movement and
    elementwise ops only (TVM's second phase, so Conv epilogues are settled first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from opfuse.fusion.categories import (is_anchor, is_elementwise, is_injective, is_oef, is_reduction,
                                      is_row_normalization)
from opfuse.fusion.decisions import ReasonKind, Refusal
from opfuse.fusion.legality import Legality
from opfuse.fusion.log import FusionLog
from opfuse.fusion.partition import Partition
from opfuse.fusion.postdom import path_nodes
from opfuse.ir.graph import Node

ANCHORED_KINDS = frozenset({"conv_epilogue", "gemm_epilogue", "reduction"})
LOOP_KINDS = frozenset({"single", "elementwise", "injective"})


@dataclass(frozen=True)
class VerticalRule:
    name: str
    reverse: bool
    starts: Callable[[Partition, int, Node], bool]
    accepts: Callable[[Partition, int, Node, list[Node]], Refusal | None]


def _forbid(msg: str) -> Refusal:
    return Refusal(ReasonKind.CATEGORY_FORBIDS, msg)


def _elementwise_group(p: Partition, g: int) -> bool:
    return p.kind(g) in ("single", "elementwise") and all(is_elementwise(n) for n in p.members[g])


def _anchor(p: Partition, g: int) -> Node | None:
    return p.shape[g].anchor


# normalization_prologue ------------------------------------------------------------------
def _starts_prologue(p, g, n):
    return _elementwise_group(p, g)


def _accepts_prologue(p, g, d, path):
    dg = p.gid(d)
    a = _anchor(p, dg)
    if a is None or not is_row_normalization(a) or p.kind(dg) not in ("single", "reduction"):
        return Refusal(ReasonKind.RULE_REFUSED, f"'{d.name}' is not (in) a row normalization")
    for x in path:
        if p.gid(x) != dg and not is_elementwise(x):
            return _forbid(f"'{x.name}' ({x.op_type}) on the way to '{a.name}' is not elementwise")
    return None


# epilogue ------------------------------------------------------------------------------------
def _starts_epilogue(p, g, n):
    a = _anchor(p, g)
    if p.kind(g) == "single":
        return is_anchor(n)
    return p.kind(g) in ANCHORED_KINDS and a is not None


def _accepts_epilogue(p, g, d, path):
    """Only elementwise ops follow the anchor; whole groups are judged by ``classify``."""
    a = _anchor(p, g)
    for x in path:
        if is_oef(x) and is_oef(a):
            return _forbid(f"two out-elementwise-fusable ops '{a.name}' ({a.op_type}) and '{x.name}' "
                           f"({x.op_type}) are never fused into one kernel (no Conv -> Conv)")
        if not is_elementwise(x) and p.gid(x) == p.gid(d) and not _elementwise_group(p, p.gid(x)):
            continue  # d's group is judged as a whole by the legality check
        if not is_elementwise(x):
            return _forbid(f"'{x.name}' ({x.op_type}) is not elementwise: it cannot be an epilogue of "
                           f"'{a.name}' ({a.op_type})")
    return None


# elementwise_chain -------------------------------------------------------------------------
def _starts_chain(p, g, n):
    return _elementwise_group(p, g)


def _accepts_chain(p, g, d, path):
    for x in path:
        if is_oef(x):
            return _forbid(f"elementwise ops are not fused into the input of '{x.name}' ({x.op_type}): "
                           f"out-elementwise-fusable ops take epilogues only")
        if not (is_elementwise(x) or is_injective(x) or (x is d and is_reduction(x))
                or p.gid(x) == p.gid(d)):
            return _forbid(f"'{x.name}' ({x.op_type}) on the path is neither elementwise nor data movement")
    return None


# injective --------------------------------------------------------------------------------
def _starts_injective(p, g, n):
    return p.kind(g) in ("single", "injective") and any(is_injective(x) for x in p.members[g]) and \
        all(is_injective(x) or is_elementwise(x) for x in p.members[g])


def _accepts_injective(p, g, d, path):
    for x in path:
        if not (is_injective(x) or is_elementwise(x)):
            return _forbid(f"'{x.name}' ({x.op_type}) is not data movement or elementwise: an index map "
                           f"cannot pass through it")
        if p.kind(p.gid(x)) not in LOOP_KINDS:
            return Refusal(ReasonKind.RULE_REFUSED, f"'{x.name}' already belongs to a "
                                                    f"{p.kind(p.gid(x))} group")
    return None


VERTICAL_RULES = (
    VerticalRule("normalization_prologue", True, _starts_prologue, _accepts_prologue),
    VerticalRule("epilogue", False, _starts_epilogue, _accepts_epilogue),
    VerticalRule("elementwise_chain", False, _starts_chain, _accepts_chain),
    VerticalRule("injective", False, _starts_injective, _accepts_injective),
)


def grow(rule: VerticalRule, legality: Legality, ipdom: dict, log: FusionLog, disabled: bool = False) -> int:
    """Apply one vertical rule over the whole graph; returns the number of merges."""
    p = legality.p
    nodes = list(p.graph.nodes)
    if rule.reverse:
        nodes.reverse()
    merges = 0
    for n in nodes:
        g = p.gid(n)
        if not rule.starts(p, g, n):
            continue
        d = ipdom[id(n)]
        if d is None or p.gid(d) == g:
            continue
        names = [n.name, d.name]
        path = path_nodes(n, d, legality.options.max_ops_per_group)
        if path is None:
            log.refused(rule.name, names, Refusal(ReasonKind.RESOURCE_LIMIT, f"more than "
                        f"{legality.options.max_ops_per_group} ops between '{n.name}' and '{d.name}'"))
            continue
        refusal = rule.accepts(p, g, d, path)
        if refusal is not None:
            if refusal.kind != ReasonKind.RULE_REFUSED or rule.name != "normalization_prologue":
                log.refused(rule.name, names, refusal)
            continue
        gids = {g} | {p.gid(x) for x in path}
        shape = legality.vertical(gids)
        if isinstance(shape, Refusal):
            log.refused(rule.name, names, shape)
            continue
        if disabled:
            log.disabled(rule.name, names)
            continue
        p.union(gids, shape)
        merges += 1
        log.taken(rule.name, names, f"'{n.name}' fused into '{d.name}' ({shape.kind})")
    return merges
