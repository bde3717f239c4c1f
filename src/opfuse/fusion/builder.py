"""``build_plan``: the fusion rules, top to bottom, from one group per op to a ``FusionPlan``.

    attention               MatMul -> scale -> Softmax -> MatMul (+ head split/merge) -> one group
    normalization_prologue  bias/residual Adds -> into the LayerNorm/Softmax that follows
    epilogue                Conv/MatMul/Gemm/reduction + elementwise ops after it
    concat_alias            Concat inputs written in place by their producers
    elementwise_chain       elementwise chains (and prologues of reductions, data movement)
    injective               data movement into data-movement/elementwise consumers
    horizontal              siblings on one input with one iteration domain -> one pass

Every rule can be disabled by name (``FusionOptions.disabled``); a disabled rule still logs
what it would have merged, as "disabled by user", so ``opfuse explain`` can say so.
The plan is verified (``verify_plan``) before it is returned.
"""
from __future__ import annotations

from opfuse.fusion.aliasing import alias_concats, mark_views
from opfuse.fusion.attention import find_attention
from opfuse.fusion.decisions import Decision, Refusal
from opfuse.fusion.horizontal import fuse_horizontal
from opfuse.fusion.legality import Legality
from opfuse.fusion.log import FusionLog
from opfuse.fusion.options import FusionOptions
from opfuse.fusion.partition import Partition
from opfuse.fusion.plan_check import verify_plan
from opfuse.fusion.postdom import immediate_post_dominators
from opfuse.fusion.vertical import VERTICAL_RULES, grow
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan

ATTENTION = "attention"
FUSION_RULES = (ATTENTION, "normalization_prologue", "epilogue", "concat_alias", "elementwise_chain",
                "injective", "horizontal")


def fuse_attention(legality: Legality, log: FusionLog, disabled: bool = False) -> None:
    p = legality.p
    for sm in [n for n in p.graph.nodes if n.op_type == "Softmax"]:
        nodes = find_attention(p.graph, sm, p.order, p.outputs)
        if isinstance(nodes, Refusal):
            log.refused(ATTENTION, [sm.name], nodes)
            continue
        gids = {p.gid(n) for n in nodes}
        shape = legality.vertical(gids)
        names = [n.name for n in nodes if n.op_type in ("MatMul", "Softmax")]
        if isinstance(shape, Refusal):
            log.refused(ATTENTION, names, shape)
            continue
        if disabled:
            log.disabled(ATTENTION, names)
            continue
        p.union(gids, shape)
        log.taken(ATTENTION, names, f"{len(nodes)} ops in one attention kernel")


def build_plan(graph: Graph, options: FusionOptions | None = None,
               origin: dict[str, list[str]] | None = None) -> tuple[FusionPlan, list[Decision]]:
    """Group ``graph``'s nodes into kernels; returns the verified plan and the decisions."""
    options = options or FusionOptions()
    p = Partition(graph)
    legality = Legality(p, options)
    log = FusionLog()
    ipdom = immediate_post_dominators(graph)
    rules = {r.name: r for r in VERTICAL_RULES}
    for name in FUSION_RULES:
        off = options.is_disabled(name)
        if name == ATTENTION:
            fuse_attention(legality, log, off)
        elif name == "concat_alias":
            alias_concats(p, log, off)
        elif name == "horizontal":
            fuse_horizontal(legality, log, off)
        else:
            grow(rules[name], legality, ipdom, log, off)
    plan = p.to_plan(origin)
    mark_views(plan)
    verify_plan(plan)
    return plan, log.decisions
