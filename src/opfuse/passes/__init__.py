"""Passes: ``Pass`` (graph -> (graph, modified)), ``PassContext``, instruments, and the pipeline.

    from opfuse.passes import fuse, make_context
    ctx = make_context(disable=["elementwise_chain"], dump_ir="ir/", log_decisions="decisions.json")
    graph, plan, decisions = fuse(graph, ctx)
"""
from opfuse.passes.base import FunctionPass, Pass, VerifyPass
from opfuse.passes.context import CONFIG_MAX_REPEAT, OptionError, PassContext
from opfuse.passes.instruments import DecisionLog, DumpIR, PassInstrument, PassTiming, RuleStatistics, format_plan
from opfuse.passes.pipeline import FuseStage, RewriteStage, fuse, fusion_passes, known_names, make_context, run_passes

__all__ = ["Pass", "FunctionPass", "VerifyPass", "PassContext", "OptionError", "CONFIG_MAX_REPEAT",
           "PassInstrument", "PassTiming", "DumpIR", "RuleStatistics", "DecisionLog", "format_plan",
           "RewriteStage", "FuseStage", "fuse", "fusion_passes", "known_names", "make_context", "run_passes"]
