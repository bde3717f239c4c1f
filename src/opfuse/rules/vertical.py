"""Vertical fusion rules: grow groups along the post-dominator tree, TVM style.

Each rule's pattern names the ops its groups grow from (by op category); its action
(``grow_to_post_dominator``) proposes, for each such op ``n`` whose group may start a merge
(``starts``), its immediate post-dominator ``d`` with every node on the paths between them;
its condition (``accepts``) says whether that path belongs to the family; the one legality
(``Legality.vertical``) and the driver do the rest. Since ``d`` post-dominates ``n``, all of
``n``'s readers join the group, so ``n``'s output stays on chip.

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

from typing import Callable

from opfuse.ops.registry import Category
from opfuse.patterns import Op
from opfuse.rules.categories import (is_anchor, is_elementwise, is_injective, is_oef, is_reduction,
                                      is_row_normalization)
from opfuse.ir.graph import Node
from opfuse.rules.decisions import Refusal, RefusalKind
from opfuse.rules.partition import Partition
from opfuse.rules.postdom import path_nodes
from opfuse.rules.rule import Fuse, Rule
from opfuse.rules.site import Site

ANCHORED_KINDS = frozenset({"conv_epilogue", "gemm_epilogue", "sampling_epilogue", "reduction"})
LOOP_KINDS = frozenset({"single", "elementwise", "injective"})


def _forbid(msg: str) -> Refusal:
    return Refusal(RefusalKind.CATEGORY, msg)


def _elementwise_group(p: Partition, g: int) -> bool:
    return p.kind(g) in ("single", "elementwise") and all(is_elementwise(n) for n in p.members[g])


def _anchor(p: Partition, g: int) -> Node | None:
    return p.shape[g].anchor


# normalization_prologue ------------------------------------------------------------------
def _starts_prologue(p, g, n):
    return _elementwise_group(p, g)


def _row_normalization_target(p, d):
    dg = p.gid(d)
    a = _anchor(p, dg)
    return a is not None and is_row_normalization(a) and p.kind(dg) in ("single", "reduction")


def _accepts_prologue(p, g, d, path):
    dg = p.gid(d)
    a = _anchor(p, dg)
    if a is None or not is_row_normalization(a) or p.kind(dg) not in ("single", "reduction"):
        return Refusal(RefusalKind.CONDITION, f"'{d.name}' is not (in) a row normalization")
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
            return Refusal(RefusalKind.CONDITION, f"'{x.name}' already belongs to a "
                                                    f"{p.kind(p.gid(x))} group")
    return None


# The grouping action every vertical rule shares ------------------------------------------------
Starts = Callable[[Partition, int, Node], bool]
Accepts = Callable[[Partition, int, Node, list[Node]], Refusal | None]


def grow_to_post_dominator(starts: Starts, reverse: bool = False,
                           target: Callable[[Partition, Node], bool] | None = None) -> Fuse:
    """Propose, for each seed ``n`` (graph order, or reversed) whose group ``starts``, the merge
    of its group with its immediate post-dominator ``d`` and every node between them (only
    when ``target(d)`` holds, if given: a site of another family is no proposal)."""
    def propose(grouping, matches):
        p = grouping.p
        nodes = [m.nodes[0] for m in matches]
        if reverse:
            nodes.reverse()
        limit = grouping.options.max_ops_per_group
        for n in nodes:
            g = p.gid(n)
            if not starts(p, g, n):
                continue
            d = grouping.ipdom[id(n)]
            if d is None or p.gid(d) == g or (target is not None and not target(p, d)):
                continue
            names = [n.name, d.name]
            path = path_nodes(n, d, limit)
            if path is None:
                yield Site({g}, names, refusal=Refusal(RefusalKind.RESOURCE, f"more than {limit} ops between "
                                                                              f"'{n.name}' and '{d.name}'"))
                continue
            yield Site({g} | {p.gid(x) for x in path}, names, f"'{n.name}' fused into '{d.name}'",
                       facts={"start": g, "target": d, "path": path})
    return Fuse(propose)


def path_condition(accepts: Accepts):
    """A rule condition from ``accepts(partition, start group, target, path)``."""
    def condition(grouping, site: Site) -> Refusal | None:
        f = site.facts
        return accepts(grouping.p, f["start"], f["target"], f["path"])
    return condition


ELEMENTWISE = (Category.ELEMWISE, Category.BROADCAST)

NORMALIZATION_PROLOGUE = Rule(
    "normalization_prologue", Op(category=ELEMENTWISE).named("start"),
    condition=path_condition(_accepts_prologue),
    action=grow_to_post_dominator(_starts_prologue, reverse=True, target=_row_normalization_target),
    priority=6, description="bias/residual Adds -> into the LayerNorm/Softmax that follows")
EPILOGUE = Rule(
    "epilogue", Op(category=(Category.OUT_ELEMWISE_FUSABLE, Category.REDUCTION) + ELEMENTWISE).named("start"),
    condition=path_condition(_accepts_epilogue), action=grow_to_post_dominator(_starts_epilogue),
    priority=5, description="Conv/MatMul/Gemm/reduction + the elementwise ops after it")
ELEMENTWISE_CHAIN = Rule(
    "elementwise_chain", Op(category=ELEMENTWISE).named("start"),
    condition=path_condition(_accepts_chain), action=grow_to_post_dominator(_starts_chain),
    priority=3, description="elementwise chains (and prologues of reductions, data movement)")
INJECTIVE = Rule(
    "injective", Op(category=(Category.INJECTIVE,) + ELEMENTWISE).named("start"),
    condition=path_condition(_accepts_injective), action=grow_to_post_dominator(_starts_injective),
    priority=2, description="data movement into data-movement/elementwise consumers")

__all__ = ["NORMALIZATION_PROLOGUE", "EPILOGUE", "ELEMENTWISE_CHAIN", "INJECTIVE", "grow_to_post_dominator",
           "path_condition"]
