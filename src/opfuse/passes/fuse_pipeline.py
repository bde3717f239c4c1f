"""The compile pipeline of ``opfuse.fusion.fuse``, as passes run under a ``PassContext``.

    verify          the imported graph is well formed
    simplify        Identity/Dropout removal, constant folding, CSE, dead code
    recognize       LayerNorm, erf/tanh GELU, SiLU, hard-swish -> one op each (pattern rules)
    fold_linear     BatchNorm and per-channel Mul/Add folded into Conv/Gemm/MatMul (pattern rules)
    horizontal      sibling MatMuls on one input -> one MatMul + Split
    cleanup         simplify again
    verify_rewrites the rewrites kept the IR well formed
    fuse            the grouping rules build the verified FusionPlan (left on ``ctx.plan``)

Running through ``run_passes`` gives every instrument for free: per-pass timing, IR dumps
before/after each pass, rule statistics and the decision log (every rewrite and fusion, taken
or refused, with its reason). Pass and rule names are what ``--disable`` takes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from opfuse.fusion.builder import FUSION_RULES, build_plan
from opfuse.fusion.decisions import Decision
from opfuse.fusion.log import FUSE_PASS
from opfuse.fusion.options import FusionOptions
from opfuse.passes.base import Pass, VerifyPass
from opfuse.rewrites import rewrite_passes
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import Provenance


@dataclass(frozen=True)
class RuleName:
    """What ``known_names`` reads from a pass's ``rules``."""
    name: str


@dataclass
class FusionState:
    """Shared by the passes of one pipeline: the rewrite context and everything logged."""

    options: FusionOptions
    rc: RewriteContext | None = None
    decisions: list[Decision] = field(default_factory=list)
    flushed: int = 0

    def context(self, graph) -> RewriteContext:
        if self.rc is None:
            self.rc = RewriteContext(self.options, Provenance(graph))
        return self.rc

    def flush(self, ctx) -> None:
        """Forward new decisions and rule statistics to the pass context (and its instruments)."""
        if self.rc is None:
            return
        new = self.rc.decisions[self.flushed:]
        self.flushed = len(self.rc.decisions)
        self.record(ctx, new)
        if self.rc.rule_stats:
            ctx.merge_stats(self.rc.rule_stats)
            self.rc.rule_stats = {}

    def record(self, ctx, decisions: list[Decision]) -> None:
        self.decisions.extend(decisions)
        for d in decisions:
            ctx.record(d)


class RewriteStage(Pass):
    """One rewrite stage: ``fn(graph, rewrite_context) -> modified``."""

    def __init__(self, name: str, fn: Callable, state: FusionState, rules=()):
        self.name = name
        self.fn = fn
        self.state = state
        self.rules = [RuleName(r) for r in rules]

    def run(self, graph, ctx):
        rc = self.state.context(graph)
        rc.pass_name = self.name
        modified = bool(self.fn(graph, rc))
        self.state.flush(ctx)
        return graph, modified


class PlanStage(Pass):
    """Group the (rewritten) graph into kernels; the plan goes to ``ctx.plan``."""

    def __init__(self, state: FusionState, name: str = FUSE_PASS):
        self.name = name
        self.state = state
        self.rules = [RuleName(r) for r in FUSION_RULES]

    def run(self, graph, ctx):
        origin = self.state.context(graph).provenance.origin
        plan, decisions = build_plan(graph, self.state.options, origin)
        ctx.plan = plan
        if self.name != FUSE_PASS:
            decisions = [replace(d, pass_name=self.name) for d in decisions]
        self.state.record(ctx, decisions)
        return graph, False


def fusion_passes(state: FusionState | None = None) -> list[Pass]:
    """The pipeline's passes sharing ``state`` (a fresh one when None, e.g. to validate names
    with ``make_context(disable=..., passes=fusion_passes())``)."""
    state = state if state is not None else FusionState(FusionOptions())
    stages = [RewriteStage(name, fn, state, rules) for name, fn, rules in rewrite_passes()]
    return [VerifyPass("verify"), *stages, VerifyPass("verify_rewrites"), PlanStage(state)]


__all__ = ["FusionState", "RewriteStage", "PlanStage", "fusion_passes"]
