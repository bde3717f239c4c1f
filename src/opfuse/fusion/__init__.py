"""Fusion: rewrite the graph, then partition it into kernels (a ``FusionPlan``).

    from opfuse.fusion import fuse
    graph2, plan, decisions = fuse(graph)            # graph is not modified
    for g in plan.groups:
        print(g.name, g.kind, g.op_types)

``fuse`` runs the algebraic rewrites (``opfuse.rewrites``: BN folding, constant folding,
CSE, DCE, LayerNorm/GELU/SiLU/hard-swish recognition, Q/K/V merging) and the grouping rules
(``opfuse.fusion.builder``). With ``enable=False`` it returns a copy of the graph and the
unfused plan (one kernel per op), the baseline every fusion is measured against.

Legality for the planner: ``RuleLegality`` (the planner's protocol: ``check_group``,
``describe``, ``proposed_groups``, ``can_merge``, ``candidate_merges``), ``PlanLegality``
(incremental ``can_merge``/``merge`` with reason kinds) and ``annotate_plan`` (kinds and
attributes for any plan), all in ``opfuse.fusion.planner_legality``.
"""
from __future__ import annotations

from opfuse.fusion.builder import FUSION_RULES, build_plan
from opfuse.fusion.decisions import Decision, ReasonKind, Refusal
from opfuse.fusion.options import FusionOptions, options_from
from opfuse.fusion.partition import Partition
from opfuse.fusion.plan_check import verify_plan
from opfuse.fusion.planner_legality import (PlanLegality, RuleLegality, annotate_plan, can_merge,
                                            candidate_merges, merge_groups)
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan


def unfused_plan(graph: Graph) -> FusionPlan:
    """One group per op, with the same attributes ``build_plan`` records."""
    plan = Partition(graph).to_plan({n.name: [n.name] for n in graph.nodes})
    verify_plan(plan)
    return plan


def fuse(graph: Graph, ctx=None, *, enable: bool = True,
         options: FusionOptions | None = None) -> tuple[Graph, FusionPlan, list[Decision]]:
    """Rewrite a copy of ``graph`` and group it into kernels.

    ``ctx``: an ``opfuse.passes.PassContext`` (instruments, disabled passes and rules, group
    size cap) or None. ``options`` overrides the limits read from it.
    Returns ``(rewritten graph, verified FusionPlan, decisions)``; every group records the
    original ops it stands for in ``attrs["origin"]``. With ``enable=False``: a copy of the
    graph and the unfused plan (one kernel per op), the baseline.
    """
    # The pass pipeline sits above fusion (it runs the rewrites and this package's builder).
    from opfuse.passes.context import PassContext
    from opfuse.passes.fuse_pipeline import FusionState, fusion_passes
    from opfuse.passes.pipeline import run_passes
    if not enable:
        g = graph.copy()
        return g, unfused_plan(g), []
    if ctx is None:
        ctx = PassContext(disabled_passes=frozenset(options.disabled) if options else frozenset())
    state = FusionState(options or options_from(ctx))
    ctx.plan = None
    g = run_passes(graph.copy(), fusion_passes(state), ctx)
    plan = ctx.plan
    if plan is None or plan.graph is not g:  # the "fuse" pass was disabled
        plan = unfused_plan(g)
        ctx.plan = plan
    return g, plan, state.decisions


__all__ = ["fuse", "build_plan", "unfused_plan", "verify_plan", "FusionOptions", "options_from",
           "Decision", "Refusal", "ReasonKind", "PlanLegality", "RuleLegality", "annotate_plan", "can_merge",
           "candidate_merges", "merge_groups", "FUSION_RULES"]
