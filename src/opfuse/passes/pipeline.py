"""The fusion pipeline, top to bottom, and the runner that instruments it.

    verify     -> the imported graph is well formed
    recognize  -> decomposed LayerNorm / erf-GELU / SiLU / hard-swish become single ops
    verify     -> the rewrites kept the IR well formed
    fuse       -> group rules resolved greedily into a FusionPlan (ctx.plan)

``compile_pipeline(graph, ctx)`` runs it on a copy of the graph and returns
``(rewritten graph, plan)``; ``make_context(...)`` builds the context the command line needs.
"""
from __future__ import annotations

import time

from opfuse.ir.plan import FusionPlan
from opfuse.passes.base import Pass, VerifyPass
from opfuse.passes.context import OptionError, PassContext
from opfuse.passes.instruments import DecisionLog, DumpIR, PassTiming, RuleStatistics
from opfuse.passes.rule_passes import FusePass, RewritePass
from opfuse.rules.conflicts import ResourceLimits
from opfuse.rules.library import fusion_rules, recognition_rules


def default_passes() -> list[Pass]:
    return [
        VerifyPass("verify"),
        RewritePass("recognize", recognition_rules()),
        VerifyPass("verify_rewrites"),
        FusePass("fuse", fusion_rules()),
    ]


def run_passes(graph, passes: list[Pass], ctx: PassContext):
    """Run ``passes`` in order under ``ctx``'s instruments; returns the final graph."""
    for inst in ctx.instruments:
        inst.enter(ctx)
    try:
        for index, p in enumerate(passes):
            if p.name in ctx.disabled_passes:
                for inst in ctx.instruments:
                    inst.skipped_pass(ctx, p, index)
                continue
            for inst in ctx.instruments:
                inst.before_pass(ctx, p, graph, index)
            t0 = time.perf_counter()
            graph, modified = p.run(graph, ctx)
            seconds = time.perf_counter() - t0
            for inst in ctx.instruments:
                inst.after_pass(ctx, p, graph, index, modified, seconds)
    finally:
        for inst in ctx.instruments:
            inst.exit(ctx)
    return graph


def compile_pipeline(graph, ctx: PassContext | None = None, passes: list[Pass] | None = None):
    """Rewrite and plan a copy of ``graph``: returns ``(graph, FusionPlan)``.

    Without a fusion pass (or with it disabled) the plan is the unfused one (one op per kernel).
    """
    ctx = ctx if ctx is not None else PassContext()
    graph = run_passes(graph.copy(), passes if passes is not None else default_passes(), ctx)
    plan = ctx.plan if ctx.plan is not None and ctx.plan.graph is graph else FusionPlan.unfused(graph)
    ctx.plan = plan
    return graph, plan


def known_names(passes: list[Pass] | None = None) -> tuple[list[str], list[str]]:
    """(pass names, rule names) of a pipeline, for validating ``--disable``."""
    passes = passes if passes is not None else default_passes()
    rules = []
    for p in passes:
        rules.extend(r.name for r in getattr(p, "rules", ()))
    return [p.name for p in passes], rules


def make_context(*, disable=(), dump_ir: str | None = None, log_decisions: str | None = None,
                 max_group_ops: int | None = None, limits: ResourceLimits | None = None,
                 timing: bool = True, statistics: bool = True, passes: list[Pass] | None = None,
                 config: dict | None = None) -> PassContext:
    """The context behind ``opfuse compile --disable NAME --dump-ir DIR --log-decisions FILE``.

    ``disable`` takes rule and pass names (an unknown name is an ``OptionError`` listing the
    known ones). Timing, rule statistics and the decision log are always collected when asked;
    ``ctx.instrument(PassTiming).report()`` and ``ctx.instrument(RuleStatistics).report()``
    format them.
    """
    pass_names, rule_names = known_names(passes)
    disabled_passes, disabled_rules = set(), set()
    for name in disable:
        if name in rule_names:
            disabled_rules.add(name)
        elif name in pass_names:
            disabled_passes.add(name)
        else:
            raise OptionError(f"unknown rule or pass '{name}' to disable; rules: {', '.join(rule_names)}; "
                              f"passes: {', '.join(pass_names)}")
    limits = limits or ResourceLimits()
    if max_group_ops is not None:
        if int(max_group_ops) < 1:
            raise OptionError(f"max group size must be at least 1, got {max_group_ops}")
        limits = ResourceLimits(int(max_group_ops), limits.max_inputs, limits.max_working_set_bytes)
    instruments = []
    if timing:
        instruments.append(PassTiming())
    if statistics:
        instruments.append(RuleStatistics())
    if dump_ir is not None:
        instruments.append(DumpIR(dump_ir))
    instruments.append(DecisionLog(log_decisions))
    return PassContext(disabled_passes=frozenset(disabled_passes), disabled_rules=frozenset(disabled_rules),
                       limits=limits, instruments=instruments, config=dict(config or {}))


__all__ = ["default_passes", "run_passes", "compile_pipeline", "make_context", "known_names"]
