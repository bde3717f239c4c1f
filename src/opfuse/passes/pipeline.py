"""The one fusion pipeline, top to bottom, and the runner that instruments it.

    verify          the imported graph is well formed
    recognize_integer  a QDQ model's DQ -> Conv/Gemm/MatMul -> [Add] -> [Relu] -> Q -> one integer op
                    (pattern rules ``integer_conv``, ``integer_matmul`` and their ``_dequantized`` forms, a Split or
                    Slice after a dequantization moved before it first); dequantized constants folded
    simplify        Identity/Dropout removal, constant folding, CSE, dead code
    recognize       LayerNorm, erf/tanh GELU, SiLU, hard-swish -> one op each (pattern rules)
    fold_linear     BatchNorm and per-channel Mul/Add folded into Conv/Gemm/MatMul (pattern rules)
    merge_matmuls   sibling MatMuls on one input -> one MatMul + Split
    lower_conv_transpose  a ConvTranspose with one tap per output pixel -> 1x1 Conv + DepthToSpace
    float32_compute float16/bfloat16 ops computed in float32 between Casts (also without fusion)
    cleanup         simplify again
    verify_rewrites the rewrites kept the IR well formed
    fuse            the fusion rules (``opfuse.rules.library.fusion_rules``) form the candidate
                    groups: a verified FusionPlan, left on ``ctx.plan``

    graph2, plan, decisions = fuse(graph, make_context(disable=["elementwise_chain"]))

Running through ``run_passes`` gives every instrument for free: per-pass timing, IR dumps
before/after each pass, rule statistics and the decision log (every rewrite and fusion, taken
or refused, with its reason). Pass and rule names are what ``--disable`` takes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.passes.base import Pass, VerifyPass
from opfuse.passes.context import OptionError, PassContext
from opfuse.passes.instruments import DecisionLog, DumpIR, PassInstrument, PassTiming, RuleStatistics
from opfuse.rewrites import rewrite_passes
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.dequantized_constants import fold_dequantized_constants
from opfuse.rewrites.edit import Provenance
from opfuse.rewrites.float32_compute import compute_in_float32
from opfuse.rules.decisions import FUSE_PASS, Decision
from opfuse.rules.driver import form_groups, unfused_plan
from opfuse.rules.library import fusion_rule_names, fusion_rules
from opfuse.rules.options import FusionOptions


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


class FuseStage(Pass):
    """Run the fusion rules on the (rewritten) graph; the candidate plan goes to ``ctx.plan``."""

    def __init__(self, state: FusionState, name: str = FUSE_PASS):
        self.name = name
        self.state = state
        self.rules = [RuleName(r) for r in fusion_rule_names()]

    def run(self, graph, ctx):
        origin = self.state.context(graph).provenance.origin
        stats: dict = {}
        plan, decisions = form_groups(graph, fusion_rules(), self.state.options, origin, stats)
        ctx.plan = plan
        ctx.merge_stats(stats)
        self.state.record(ctx, decisions)
        return graph, False


def fusion_passes(state: FusionState | None = None) -> list[Pass]:
    """The pipeline's passes sharing ``state`` (a fresh one when None, e.g. to validate names)."""
    state = state if state is not None else FusionState(FusionOptions())
    stages = [RewriteStage(name, fn, state, rules) for name, fn, rules in rewrite_passes()]
    return [VerifyPass("verify"), *stages, VerifyPass("verify_rewrites"), FuseStage(state)]


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


def fuse(graph: Graph, ctx: PassContext | None = None, *, enable: bool = True,
         options: FusionOptions | None = None) -> tuple[Graph, FusionPlan, list[Decision]]:
    """Rewrite a copy of ``graph`` and form the fusion rules' candidate groups.

    ``ctx`` (``make_context``): instruments, disabled passes, the fusion options (limits and
    disabled rules; ``options`` stands for a context with just these); ``ctx.origin`` gets the
    provenance map. Returns ``(rewritten graph, verified FusionPlan, decisions)``; every group
    records the original ops it stands for in ``attrs["origin"]`` and the rule that formed it
    in ``attrs["rule"]``. With ``enable=False``: a copy of the graph and the unfused plan (one
    kernel per op), the baseline; its float16/bfloat16 ops too compute in float32 between Casts
    (``float32_compute``: the C backend's only way to run them), each Cast a kernel of its own.
    """
    ctx = ctx if ctx is not None else PassContext(options=options or FusionOptions())
    if not enable:
        g = graph.copy()
        fold_dequantized_constants(g)  # as the importer folds constants: no weight computed at run time
        ctx.origin = {n.name: [n.name] for n in g.nodes}
        if "float32_compute" not in ctx.disabled_passes:
            compute_in_float32(g, RewriteContext(ctx.options, Provenance(g)))
        ctx.plan = unfused_plan(g)
        return g, ctx.plan, []
    state = FusionState(ctx.options)
    ctx.plan = None
    g = run_passes(graph.copy(), fusion_passes(state), ctx)
    ctx.origin = state.context(g).provenance.origin
    plan = ctx.plan
    if plan is None or plan.graph is not g:  # the "fuse" pass was disabled
        plan = unfused_plan(g)
        ctx.plan = plan
    return g, plan, state.decisions


def known_names(passes: list[Pass] | None = None) -> tuple[list[str], list[str]]:
    """(pass names, rule names) of a pipeline, for validating ``--disable``."""
    passes = passes if passes is not None else fusion_passes()
    rules: list[str] = []
    for p in passes:
        rules.extend(r.name for r in getattr(p, "rules", ()))
    return [p.name for p in passes], rules


def make_context(*, disable=(), dump_ir: str | None = None, log_decisions: str | None = None,
                 max_group_ops: int | None = None, options: FusionOptions | None = None,
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
    options = options or FusionOptions()
    if max_group_ops is not None:
        if int(max_group_ops) < 1:
            raise OptionError(f"max group size must be at least 1, got {max_group_ops}")
        options = options.with_(max_ops_per_group=int(max_group_ops))
    options = options.with_(disabled=options.disabled | disabled_rules)
    instruments: list[PassInstrument] = []
    if timing:
        instruments.append(PassTiming())
    if statistics:
        instruments.append(RuleStatistics())
    if dump_ir is not None:
        instruments.append(DumpIR(dump_ir))
    instruments.append(DecisionLog(log_decisions))
    return PassContext(disabled_passes=frozenset(disabled_passes), options=options, instruments=instruments,
                       config=dict(config or {}))


__all__ = ["FusionState", "RewriteStage", "FuseStage", "fusion_passes", "run_passes", "fuse", "make_context",
           "known_names"]
