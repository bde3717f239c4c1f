"""The one pipeline: import -> rewrite -> legal groups -> plan (cost model) -> memory -> codegen -> build.

    import opfuse
    model = opfuse.compile("zoo:mobilenet_v1", target="host", fuse=True)
    outputs = model.run({"input": x})
    model.report["kernels_after"], model.report["arena_bytes"], model.report["predicted_latency_s"]

``plan_model`` stops before code generation (what ``opfuse compile`` and ``opfuse explain``
print); ``compile`` builds the native library on top of it.

Stages, each owned by one package:

1. ``opfuse.api.load``: ONNX (or ``zoo:NAME``) to a verified, shape-inferred Graph;
2. ``opfuse.fusion.fuse``: algebraic rewrites and the rules' legal grouping, as instrumented
   passes (``PassContext``: disabled rules, IR dumps, decision log);
3. ``opfuse.planner.plan_fusion``: which legal fusions are worth it on the target (roofline
   cost model, constraints), unless ``planner="rules"`` keeps the rules' maximal grouping;
4. ``opfuse.memory.plan_memory``: the static arena;
5. ``opfuse.runtime.native.build``: C code per group, compiled and loaded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from opfuse.errors import OpfuseError
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan

PLANNERS = ("auto", "greedy", "exact", "rules")


@dataclass
class CompileOptions:
    """Everything ``opfuse compile`` takes besides the model."""

    target: str = "host"
    fuse: bool = True
    planner: str = "auto"  # a planner method, or "rules": the rules' maximal legal grouping
    latency_bound_s: float | None = None
    memory_budget_bytes: int | None = None
    onchip_budget_bytes: int | None = None
    objective: str | None = None  # e.g. "latency=1,memory=0.5"
    disable: Sequence[str] = ()
    dump_ir: str | None = None
    log_decisions: str | None = None
    max_group_ops: int | None = None
    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    corrections: bool = True  # apply the cost-model corrections saved by `opfuse profile --fit` (named in the report)

    def __post_init__(self):
        if self.planner not in PLANNERS:
            raise OpfuseError(f"unknown planner '{self.planner}'; choose one of {', '.join(PLANNERS)}")


@dataclass
class Compilation:
    """The result of planning: graphs, plan, decisions and the report (before any C is built)."""

    original: Graph
    graph: Graph
    plan: FusionPlan
    decisions: list
    fusion_report: object  # opfuse.report.fusion.FusionReport
    options: CompileOptions
    plan_result: object | None = None  # opfuse.planner.PlanResult when the cost model chose the plan
    context: object | None = None  # the PassContext (timing, rule statistics)
    memory: object | None = None  # opfuse.memory.MemoryPlan
    report: dict = field(default_factory=dict)


def _context(opts: CompileOptions):
    from opfuse.passes import make_context
    from opfuse.passes.fuse_pipeline import fusion_passes
    return make_context(disable=list(opts.disable), dump_ir=opts.dump_ir, log_decisions=opts.log_decisions,
                        max_group_ops=opts.max_group_ops, passes=fusion_passes())


def _choose_plan(graph: Graph, rules_plan: FusionPlan, ctx, opts: CompileOptions):
    """The cost model's choice among legal plans (or the rules' plan with ``planner="rules"``)."""
    if not opts.fuse or opts.planner == "rules":
        return rules_plan, None
    from opfuse.fusion import RuleLegality, annotate_plan, options_from
    from opfuse.planner import Constraints, Objective, plan_fusion
    from opfuse.targets import get_profile
    constraints = Constraints(latency_bound_s=opts.latency_bound_s, memory_budget_bytes=opts.memory_budget_bytes,
                              onchip_budget_bytes=opts.onchip_budget_bytes)
    objective = Objective.parse(opts.objective) if opts.objective else None
    result = plan_fusion(graph, get_profile(opts.target), method=opts.planner,
                         legality=RuleLegality(options_from(ctx)), objective=objective, constraints=constraints,
                         corrections=opts.corrections)
    return annotate_plan(result.plan, options_from(ctx)), result


def _merge_planner_report(report: dict, plan_json: dict) -> None:
    """Add the planner's predictions to the fusion report without overriding its measures.

    Top level: ``predicted_latency_s``, ``critical_path_s``, ``predicted_peak_memory_bytes`` and
    ``planner`` (method, objective, constraints, the planner's own totals); per group (joined by
    name): ``predicted_latency_s`` and the roofline ``bound``.
    """
    per_group = {g["name"]: g for g in plan_json.get("groups", [])}
    report["predicted_latency_s"] = plan_json.get("predicted_latency_s")
    report["critical_path_s"] = plan_json.get("critical_path_s")
    report["predicted_peak_memory_bytes"] = plan_json.get("peak_memory_bytes")
    planner = dict(plan_json.get("planner", {}))
    planner.update({k: v for k, v in plan_json.items() if k not in ("groups", "planner")})
    report["planner"] = planner
    for g in report.get("groups", []):
        pg = per_group.get(g["name"])
        if pg is not None:
            g["predicted_latency_s"] = pg.get("predicted_latency_s")
            g["bound"] = pg.get("bound")


def plan_model(model, options: CompileOptions | None = None, **kwargs) -> Compilation:
    """Import, rewrite, group and plan ``model``; compute the memory plan and the report."""
    from opfuse.api import load
    from opfuse.fusion import fuse
    from opfuse.memory import plan_memory
    from opfuse.report.fusion import build_report
    opts = options or CompileOptions(**kwargs)
    original = load(model, opts.input_shapes)
    ctx = _context(opts)
    graph, rules_plan, decisions = fuse(original, ctx, enable=opts.fuse)
    plan, plan_result = _choose_plan(graph, rules_plan, ctx, opts)
    fusion_report = build_report(original, graph, plan, decisions)
    memory = plan_memory(plan)
    report = fusion_report.to_dict()
    report["target"] = opts.target
    report["fused"] = opts.fuse
    if plan_result is not None:
        _merge_planner_report(report, plan_result.to_json())
    report.update(memory.report())
    return Compilation(original, graph, plan, decisions, fusion_report, opts, plan_result, ctx, memory, report)


def compile(model, target: str = "host", fuse: bool = True, *, threads: int = 1,
            options: CompileOptions | None = None, **kwargs):
    """Compile ``model`` (``zoo:NAME``, a path, an ONNX ModelProto or a Graph) to native code.

    Returns an ``opfuse.runtime.native.CompiledModel``: ``.run(inputs)``, ``.report`` (the fusion
    report, the planner's predictions and the arena), ``.export_c(dir)``. Only the host target
    builds native code here; other targets are planned (``plan_model``) but not built.
    """
    from opfuse.runtime.native import build
    opts = options or CompileOptions(target=target, fuse=fuse, **kwargs)
    if opts.target not in ("host",):
        raise OpfuseError(f"target '{opts.target}' can be planned (opfuse compile --target {opts.target}) "
                          f"but not built and run on this machine; use target 'host'")
    comp = plan_model(model, opts)
    native = build(comp.graph, comp.plan, threads=threads, memory=comp.memory)
    native.compile_report = comp.report
    native.compilation = comp
    return native


# Measurement: the measured side of the cost model ------------------------------------------------
MEASURE_REPEAT = 20  # timed runs per measurement (medians are reported: the machine is shared)
MEASURE_WARMUP = 2


def median_seconds(fn, repeat: int = MEASURE_REPEAT, warmup: int = MEASURE_WARMUP) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls after ``warmup`` untimed ones."""
    import time
    from statistics import median
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return median(times)


def measure(comp: Compilation, *, repeat: int = MEASURE_REPEAT, threads: int = 1, seed: int = 0) -> dict:
    """Build ``comp`` with per-kernel timers, run it on seeded inputs, and put the measured times
    next to the predictions: ``measured_latency_s`` (median of whole runs, timers included) at the
    top of ``comp.report`` and in every group, plus ``per_group_measured``, the group -> seconds map
    that ``fit_host_corrections`` feeds to the correction fit. Host target only."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.runtime.native import build
    from opfuse.runtime.reference import random_inputs
    if comp.options.target != "host":
        raise OpfuseError(f"measuring needs the host target, not '{comp.options.target}'")
    native = build(comp.graph, comp.plan, threads=threads, memory=comp.memory,
                   options=CodegenOptions(profile=True))
    feeds = random_inputs(comp.original, seed)
    whole_s = median_seconds(lambda: native.run(feeds), repeat)
    per_group: dict[str, float] = {}
    for row in native.profile(feeds, repeat=repeat):
        per_group[row["group"]] = per_group.get(row["group"], 0.0) + row["ms"] / 1e3
    comp.report["measured_latency_s"] = whole_s
    comp.report["measured_repeat"] = repeat
    for g in comp.report.get("groups", []):
        if g["name"] in per_group:
            g["measured_latency_s"] = per_group[g["name"]]
    return per_group


def fit_host_corrections(models: Sequence, *, repeat: int = MEASURE_REPEAT, save: bool = True):
    """Fit the host cost model's correction factors ``T_actual = T_pred (1 + alpha)`` from measured
    per-group times of ``models`` (each compiled with its planner-chosen plan), and save them for
    the host target so later plans use them. Plans are chosen and predictions made without
    corrections, so a fit never depends on an earlier one. Returns the ``Corrections``."""
    from opfuse.cost.correction import fit_corrections, save_corrections
    from opfuse.cost.model import CostModel, correction_samples
    from opfuse.cost.correction import Corrections
    from opfuse.targets import get_profile
    profile = get_profile("host")
    cm = CostModel(profile, Corrections(profile.name))  # fit against uncorrected predictions
    samples = []
    for model in models:
        comp = plan_model(model, CompileOptions(target="host", corrections=False))
        per_group = measure(comp, repeat=repeat)
        samples.extend(correction_samples(cm, comp.plan, per_group))
    corr = fit_corrections(profile.name, samples, profile=profile)
    if save:
        save_corrections(corr)
    return corr
