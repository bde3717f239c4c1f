"""Passes: ``Pass`` (graph -> (graph, modified)), ``PassContext``, instruments, and the pipeline.

    from opfuse.passes import compile_pipeline, make_context
    ctx = make_context(disable=["elementwise_chain"], dump_ir="ir/", log_decisions="decisions.json")
    graph, plan = compile_pipeline(graph, ctx)
"""
from opfuse.passes.base import FunctionPass, Pass, VerifyPass
from opfuse.passes.context import CONFIG_MAX_REPEAT, OptionError, PassContext
from opfuse.passes.instruments import DecisionLog, DumpIR, PassInstrument, PassTiming, RuleStatistics, format_plan
from opfuse.passes.rule_passes import FusePass, RewritePass
from opfuse.passes.pipeline import compile_pipeline, default_passes, known_names, make_context, run_passes

__all__ = ["Pass", "FunctionPass", "VerifyPass", "PassContext", "OptionError", "CONFIG_MAX_REPEAT",
           "PassInstrument", "PassTiming", "DumpIR", "RuleStatistics", "DecisionLog", "format_plan",
           "RewritePass", "FusePass", "compile_pipeline", "default_passes", "known_names", "make_context",
           "run_passes"]
