"""The one pipeline: import -> rewrite -> legal groups -> plan (cost model) -> memory -> codegen -> build.

    import opfuse
    model = opfuse.compile("zoo:mobilenet_v1", target="host", fuse=True)
    outputs = model.run({"input": x})
    model.report["kernels_after"], model.report["arena_bytes"], model.report["predicted_latency_s"]

``plan_model`` stops before code generation (what ``opfuse compile`` and ``opfuse explain``
print); ``compile`` builds the native library on top of it.

Stages, each owned by one package:

1. ``opfuse.api.load``: ONNX (or ``zoo:NAME``) to a verified, shape-inferred Graph;
2. ``opfuse.passes.fuse``: algebraic rewrites, then the fusion rules form the candidate
   groups, as instrumented passes (``PassContext``: disabled rules, IR dumps, decision log);
3. ``opfuse.planner.plan_fusion``: which candidates (and their legal parts) are worth it on the
   target (roofline cost model, constraints), asking the rules' one legality
   (``RuleLegality``), unless ``planner="rules"`` keeps the rules' maximal grouping; the
   decision log is then reconciled with the chosen plan (``reconcile_decisions``);
4. ``opfuse.memory.plan_memory``: the static arena;
5. ``opfuse.runtime.native.build``: C code per group, compiled and loaded.

Measuring compiled models (``--measure``, ``profile --fit``) lives in ``opfuse.measure``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from opfuse.errors import InputError, OpfuseError, ShapeInputError
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.rules.decisions import FUSE_PASS, FUSED, REFUSED, Decision, RefusalKind, taken

if TYPE_CHECKING:  # the stages' types, for annotations only (each is imported where it runs)
    from opfuse.runtime.native import CompiledModel
    from opfuse.memory import MemoryPlan
    from opfuse.passes import PassContext
    from opfuse.planner import PlanResult
    from opfuse.report.fusion import FusionReport

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
    input_values: Mapping | None = None  # graph inputs bound to values (constants): inputs that decide shapes
    corrections: bool = True  # apply the cost-model corrections saved by `opfuse profile --fit` (named in the report)
    # Patch-based execution (``memory.patch``): the most extra multiply-accumulates, as a fraction of the
    # model's, that banded runs may recompute to lower the arena. None: the target's default
    # (``PATCH_RECOMPUTE_LIMITS``); 0: no patching.
    patch_recompute_limit: float | None = None

    def __post_init__(self):
        if self.patch_recompute_limit is not None and not 0 <= self.patch_recompute_limit <= 100:
            raise OpfuseError(f"patch recompute limit {self.patch_recompute_limit}: expected a fraction from 0 to 100")
        if self.planner not in PLANNERS:
            raise OpfuseError(f"unknown planner '{self.planner}'; choose one of {', '.join(PLANNERS)}")


# Default recompute limit of patch-based execution per target. Patching pays instructions for SRAM, which
# only a target whose whole working memory is its SRAM wants: the Cortex-M7 (mobilenet_v1_025_96: arena
# -43% for +17% instructions under QEMU at 0.3). The host has memory to spare: off.
PATCH_RECOMPUTE_LIMITS = {"cortex-m7": 0.3}


def patch_recompute_limit(options: CompileOptions) -> float:
    """The recompute limit patching runs under for these options (0: off; never without fusion)."""
    if not options.fuse:
        return 0.0
    if options.patch_recompute_limit is not None:
        return options.patch_recompute_limit
    return PATCH_RECOMPUTE_LIMITS.get(options.target, 0.0)


@dataclass
class Compilation:
    """The result of planning: graphs, plan, decisions and the report (before any C is built)."""

    original: Graph
    graph: Graph
    plan: FusionPlan
    decisions: list[Decision]
    fusion_report: "FusionReport"
    options: CompileOptions
    context: "PassContext"  # timing, rule statistics, the fusion options and the candidates
    memory: "MemoryPlan"
    plan_result: "PlanResult | None" = None  # when the cost model chose the plan
    report: dict = field(default_factory=dict)

    def save_onnx(self, path) -> None:
        """The fused model as ONNX, each fusion group a local function carrying its figures
        (``opfuse.frontend.onnx_fused``): what Netron shows and onnxruntime runs."""
        from opfuse.frontend.onnx_fused import save_fused_model
        save_fused_model(self.graph, self.plan, path, group_meta=group_figures(self.report))

    def integer_rewrites(self) -> list[str]:
        """The integer rules that rewrote part of the graph (the ``recognize_integer`` stage: a QDQ model's products
        as integer ops, whose rounding may differ from the float graph's by one quantization step), sorted; the
        unfused build has none."""
        from opfuse.rewrites import RECOGNIZE_INTEGER
        return sorted({d.rule for d in self.decisions if d.pass_name == RECOGNIZE_INTEGER and d.taken})

    def cost_model(self):
        """The target's ``CostModel`` with the corrections this plan was made with."""
        from opfuse.cost.correction import Corrections, load_corrections
        from opfuse.cost.model import CostModel
        from opfuse.targets import get_profile
        profile = get_profile(self.options.target)
        corrections = load_corrections(profile.name, profile=profile) if self.options.corrections \
            else Corrections(profile.name)
        return CostModel(profile, corrections)

    def to_html(self, layout: str = "auto") -> str:
        """The HTML report (``opfuse.report.html``): graph, groups, roofline, arena, decisions."""
        from opfuse.report.html import HtmlInputs, render_html
        return render_html(HtmlInputs(self.report, self.original, self.plan, self.memory, self.decisions,
                                      self.cost_model(), layout))


GROUP_FIGURES = ("rule", "kernels_before", "kernels_after", "bytes_before", "bytes_after", "eta", "flops",
                 "predicted_latency_s", "measured_latency_s")


def group_figures(report: dict) -> dict[str, dict]:
    """Group name -> the report's figures for it (what the fused ONNX carries as metadata)."""
    return {g["name"]: {k: g[k] for k in GROUP_FIGURES if g.get(k) is not None} for g in report.get("groups", [])}


def _context(opts: CompileOptions):
    from opfuse.passes import make_context
    return make_context(disable=list(opts.disable), dump_ir=opts.dump_ir, log_decisions=opts.log_decisions,
                        max_group_ops=opts.max_group_ops)


def _constraints(opts: CompileOptions):
    from opfuse.planner import Constraints
    # On an SRAM target the memory budget bounds the arena the code runs in (``fit_sram``), which
    # patching brings below any plan's whole-tensor peak: it is not the planner's constraint there.
    budget = None if opts.target in SRAM_TARGETS else opts.memory_budget_bytes
    return Constraints(latency_bound_s=opts.latency_bound_s, memory_budget_bytes=budget,
                       onchip_budget_bytes=opts.onchip_budget_bytes)


def _choose_plan(graph: Graph, candidates: FusionPlan, ctx, opts: CompileOptions):
    """The cost model's choice among the rules' candidates and their legal parts (or the rules'
    plan itself with ``planner="rules"``)."""
    if not opts.fuse or opts.planner == "rules" or (opts.planner == "auto" and not opts.objective
                                                    and is_quantized(graph)):
        return candidates, None
    from opfuse.planner import Objective, plan_fusion
    from opfuse.rules.legality import RuleLegality, annotate_plan
    from opfuse.targets import get_profile
    objective = Objective.parse(opts.objective) if opts.objective else None
    result = plan_fusion(graph, get_profile(opts.target), method=opts.planner,
                         legality=RuleLegality(ctx.options, candidates), objective=objective,
                         constraints=_constraints(opts), corrections=opts.corrections)
    return annotate_plan(result.plan, ctx.options, candidates, ctx.origin), result


def _planner_cost_model(opts: CompileOptions):
    """The cost model the planner ran with (``plan_fusion``'s: the target's profile, corrections as asked)."""
    from opfuse.planner.api import _cost_model
    from opfuse.targets import get_profile
    return _cost_model(get_profile(opts.target), None, opts.corrections)


def reconcile_decisions(decisions: list[Decision], plan: FusionPlan, chooser: str, cost_model=None) -> list[Decision]:
    """The decision log of the plan that runs: a fusion the rules proposed but ``plan`` does not
    hold becomes "not chosen" (naming the planner, and with ``cost_model`` the predicted times of
    the ops fused and apart, and an epilogue priced on a compute-bound anchor), and every group of
    ``plan`` that no rule formed as such is recorded as fused by the planner under the rule of its shape."""
    group_of = {n.name: g for g in plan.groups for n in g.nodes}
    out: list[Decision] = []
    formed: set[frozenset] = set()
    for d in decisions:
        if d.pass_name == FUSE_PASS and d.verdict == FUSED:
            groups = {id(group_of[x]) for x in d.nodes if x in group_of}
            if len(groups) > 1:
                why = "" if cost_model is None else _apart_detail(cost_model, plan, d.nodes, group_of)
                out.append(Decision(d.pass_name, d.rule, REFUSED, d.nodes, RefusalKind.NOT_CHOSEN.value,
                                    f"legal, but the {chooser} kept these ops in separate kernels "
                                    f"(predicted faster{why})"))
                continue
        out.append(d)
    for d in out:
        if d.pass_name == FUSE_PASS and d.verdict == FUSED:
            formed.update(frozenset(n.name for n in group_of[x].nodes) for x in d.nodes if x in group_of)
    for g in plan.groups:
        names = frozenset(n.name for n in g.nodes)
        if len(g.nodes) > 1 and names not in formed:
            out.append(taken("plan", g.attrs.get("rule", g.kind), [n.name for n in g.nodes],
                             f"{len(g.nodes)} ops in one {g.kind} kernel, chosen by the {chooser}", group=g.name))
    return out


def _apart_detail(cost_model, plan: FusionPlan, names, group_of) -> str:
    """``": X us fused against Y us apart"``, the ops ``names`` as one group against them split as ``plan``
    splits them, and what made the fused group dearer when it is an epilogue on a compute-bound anchor
    (``EPILOGUE_STREAM_RATIO``)."""
    from opfuse.cost.analysis import analyze_group, category_of
    from opfuse.cost.roofline import COMPUTE_BOUND
    from opfuse.ops.elementwise import epilogue_stream_ratio
    from opfuse.ops.registry import Category
    nodes = [n for n in plan.graph.nodes if n.name in set(names)]
    parts: dict[int, list] = {}
    for n in nodes:
        parts.setdefault(id(group_of[n.name]), []).append(n)
    fused = cost_model.group_cost(plan.graph, nodes)
    apart = sum(cost_model.group_cost(plan.graph, ns).latency_s for ns in parts.values())
    text = f": {fused.latency_s * 1e6:.1f} us fused against {apart * 1e6:.1f} us apart"
    a = analyze_group(plan.graph, nodes)
    if cost_model.prices_epilogue(a) and fused.bound == COMPUTE_BOUND:
        anchor = next(n for n in nodes if category_of(n) == Category.OUT_ELEMWISE_FUSABLE)
        ops = [f"{n.op_type} {epilogue_stream_ratio(n):g}x" for n in nodes if epilogue_stream_ratio(n) is not None]
        text += (f"; the epilogue on the compute-bound {anchor.op_type} adds its arithmetic to the kernel's: "
                 f"{', '.join(ops)} the time of the stream fusing saves (EPILOGUE_STREAM_RATIO)")
    return text


def _merge_planner_report(report: dict, plan_json: dict) -> None:
    """Add the planner's predictions to the fusion report without overriding its measures.

    Top level: ``predicted_latency_s``, ``critical_path_s``, ``predicted_peak_memory_bytes`` and
    ``planner`` (method, objective, constraints, the planner's own totals); per group (joined by
    name): ``predicted_latency_s`` and the roofline ``bound``.
    """
    per_group = {g["name"]: g for g in plan_json.get("groups", [])}
    plan_json = {k: v for k, v in plan_json.items() if k != "eta"}  # one eta per report: the fusion report's
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
    from opfuse.memory import plan_memory
    from opfuse.passes import fuse
    from opfuse.report.fusion import build_report
    from opfuse.rewrites.dequantized_constants import fold_dequantized_constants
    opts = options or CompileOptions(**kwargs)
    original = load(model, opts.input_shapes, opts.input_values)
    ctx = _context(opts)
    graph, candidates, decisions = fuse(original, ctx, enable=opts.fuse)
    plan, plan_result = _choose_plan(graph, candidates, ctx, opts)
    chooser = "fusion rules" if plan_result is None else f"{plan_result.method} planner"
    if plan_result is not None:
        decisions = reconcile_decisions(decisions, plan, chooser, _planner_cost_model(opts))
    # "before" is the unfused build: the graph as imported, its dequantized constants folded (fuse(enable=False))
    baseline = original.copy()
    fold_dequantized_constants(baseline)
    fusion_report = build_report(baseline, graph, plan, decisions, options=ctx.options, chooser=chooser)
    limit = patch_recompute_limit(opts)
    if opts.target in SRAM_TARGETS:
        plan, patching, memory, budget_record = fit_sram(graph, plan, opts, limit)
    else:
        plan, patching = _patched(graph, plan, opts.target, limit)
        memory, budget_record = plan_memory(plan), None
    report = fusion_report.to_dict()
    report["target"] = opts.target
    report["fused"] = opts.fuse
    if budget_record is not None:
        report["memory_budget"] = budget_record
    if patching is not None:
        report["patching"] = patching.to_json()
    if plan_result is not None:
        _merge_planner_report(report, plan_result.to_json())
    report.update(memory.report())
    if is_quantized(graph):
        report["int8"] = int8_report(graph, plan)
    return Compilation(original, graph, plan, decisions, fusion_report, opts, ctx, memory, plan_result, report)


# Targets whose whole working memory is on-chip SRAM: the arena (tensors and kernel scratch) must fit
# the memory budget, by default the profile's on-chip bytes.
SRAM_TARGETS = ("cortex-m7",)


def int8_report(graph: Graph, plan: FusionPlan) -> dict:
    """What runs in int8: the kernels whose every tensor read or written (weights aside) is 8-bit, those
    whose Conv/MatMul/Gemm accumulates in int32, the others by name; the tensors between kernels."""
    from opfuse.rules.quantized import EIGHT_BIT
    kernels, int8_io, integer, other = 0, 0, 0, []
    between: dict[str, int] = {}
    tensors = {"int8": 0, "other": 0, "int8_bytes": 0, "other_bytes": 0}
    for g in plan.groups:
        if g.attrs.get("zero_copy"):
            continue
        kernels += 1
        ins = [v for n in g.nodes for v in n.input_values() if not v.is_const and v.producer not in g.nodes]
        outs = g.outputs(graph)
        if all(v.dtype in EIGHT_BIT for v in ins + outs):
            int8_io += 1
        else:
            other.append(g.name)
        if any(n.op_type in ("Conv", "MatMul", "Gemm") and n.outputs[0].dtype.name == "int32" for n in g.nodes):
            integer += 1
        for v in outs:
            if v.uses and v.name not in between:
                between[v.name] = 1
                key = "int8" if v.dtype in EIGHT_BIT else "other"
                tensors[key] += 1
                tensors[f"{key}_bytes"] += v.nbytes
    return {"kernels": kernels, "int8_in_out": int8_io, "integer_accumulate": integer, "not_int8": other,
            "tensors_between_kernels": tensors}


def int8_lines(report: dict) -> list[str]:
    """The ``int8`` record in two lines (``compile --int8`` prints them)."""
    q = report.get("int8")
    if not q:
        return []
    t = q["tensors_between_kernels"]
    lines = [f"int8: {q['int8_in_out']} of {q['kernels']} kernels read and write only 8-bit tensors, "
             f"{q['integer_accumulate']} accumulate in int32; tensors between kernels: {t['int8']} int8 "
             f"({t['int8_bytes']:,} bytes), {t['other']} wider ({t['other_bytes']:,} bytes)"]
    if q["not_int8"]:
        lines.append(f"  not int8 at the boundary: {', '.join(q['not_int8'])}")
    return lines


def is_quantized(graph: Graph) -> bool:
    """Does an op of ``graph`` read an 8-bit activation (a non-constant int8/uint8 tensor)?

    A model quantized to 8 bits is quantized for memory, so with ``planner="auto"`` and no objective
    its plan is the fusion rules' own: every 8-bit tensor stays 8-bit between kernels (its readers
    dequantize it in their prologues, ``rules/quantized.py``). The latency model would split some
    of those prologues off (re-running a Cast/Sub per im2col element is predicted ~3% slower than
    writing the centred int32 tensor once), and its memory term sees the peak only, not the 4x larger
    tensors elsewhere. ``--planner exact|greedy`` or an ``--objective`` asks for the cost model."""
    from opfuse.rules.quantized import EIGHT_BIT
    return any(v.dtype in EIGHT_BIT and not v.is_const and v.uses for v in graph.values.values())
# When the arena exceeds the budget at the target's recompute limit, patching is retried with these
# limits (extra multiply-accumulates as a fraction of the model's), the first that fits kept.
SRAM_RECOMPUTE_LADDER = (0.3, 1.0, 3.0, 10.0, 100.0)


def _patched(graph, plan, target: str, limit: float):
    if limit <= 0:
        return plan, None
    from opfuse.memory.patch import choose_patches
    return choose_patches(plan, limit, _kernel_scratch(graph, plan, target))


def _arena_with_scratch(graph, plan, memory, target: str) -> int:
    """The arena the target's code runs in: tensors and every kernel's scratch (``codegen.mcu``)."""
    from opfuse.codegen.options import options_for_target
    from opfuse.codegen.program import generate
    try:
        return generate(graph, plan, memory=memory, options=options_for_target(target)).arena_bytes
    except OpfuseError:  # the plan does not generate: the build will say why
        return memory.arena_bytes


def fit_sram(graph, plan, opts: CompileOptions, limit: float):
    """Patch ``plan`` so its arena fits the memory budget (``--memory-budget``: the SRAM the user
    leaves to the model). At the target's recompute limit first; when over budget (and the limit was
    not fixed by the user), at each larger limit of ``SRAM_RECOMPUTE_LADDER``. When none fits, a
    one-line error naming the smallest arena found and the option that gives it.

    Without ``--memory-budget`` the target's SRAM is the budget but only checked: the plan is the
    target's default, and the record says whether it fits (QEMU's board has more memory than a
    512 KB part, so a model over it still runs there; planning studies such as 224x224 inputs too).

    Returns (plan, patch report, memory plan, the report's ``memory_budget`` record)."""
    from opfuse.memory import plan_memory
    from opfuse.targets import get_profile
    sram = get_profile(opts.target).onchip_bytes
    enforced = opts.memory_budget_bytes is not None
    budget: int = opts.memory_budget_bytes if opts.memory_budget_bytes is not None else sram
    source = "--memory-budget" if enforced else f"{opts.target} SRAM"
    fixed = opts.patch_recompute_limit is not None or not opts.fuse
    tried: list[tuple[int, float]] = []
    limits = [limit] + ([x for x in SRAM_RECOMPUTE_LADDER if x > limit] if opts.fuse else [])
    for i, lim in enumerate(limits):
        patched, patching = _patched(graph, plan, opts.target, lim)
        memory = plan_memory(patched)
        arena = _arena_with_scratch(graph, patched, memory, opts.target)
        tried.append((arena, lim))
        if not enforced or (arena <= budget and (i == 0 or not fixed)):
            record = {"budget_bytes": budget, "source": source, "sram_bytes": sram, "arena_bytes": arena,
                      "fits": arena <= budget, "enforced": enforced, "recompute_limit": lim,
                      "raised_from": limit if lim != limit else None}
            return patched, patching, memory, record
        if i == 0 and fixed and not opts.fuse:
            break
    best, best_limit = min(tried, key=lambda t: (t[0], t[1]))
    how = ("without fusion (drop --no-fuse to patch)" if not opts.fuse else
           f"with --patch-recompute-limit {best_limit:g}")
    raise OpfuseError(f"the arena of {tried[0][0]:,} bytes does not fit the memory budget of {budget:,} bytes "
                      f"({source}); the smallest arena that would work is {best:,} bytes, {how}")


def _kernel_scratch(graph, plan, target: str) -> dict[str, int] | None:
    """Each group's kernel scratch in the target's code (what a band of it needs besides its tensors),
    or None when the plan does not generate (the build will say why)."""
    from opfuse.codegen.options import options_for_target
    from opfuse.codegen.program import generate
    try:
        program = generate(graph, plan, options=options_for_target(target))
    except OpfuseError:
        return None
    return {k.group: k.scratch_bytes for k in program.kernels}


def pareto(comp: Compilation):
    """The Pareto front (latency, peak memory, kernels) over the same candidates and legality."""
    from opfuse.planner import plan_pareto
    from opfuse.rules.legality import RuleLegality
    from opfuse.targets import get_profile
    return plan_pareto(comp.graph, get_profile(comp.options.target),
                       legality=RuleLegality(comp.context.options, comp.context.plan),
                       constraints=_constraints(comp.options), corrections=comp.options.corrections)


def build_native(comp: Compilation, *, threads: int | None = None, codegen_options=None, sanitize: bool = False):
    """Generate, compile and load C for a planned model (host target only); ``sanitize``: with UBSan."""
    from opfuse.runtime.native import build
    if comp.options.target != "host":
        raise OpfuseError(f"target '{comp.options.target}' can be planned (opfuse compile --target "
                          f"{comp.options.target}) but not built and run on this machine; use target 'host'")
    native = build(comp.graph, comp.plan, threads=threads, memory=comp.memory, options=codegen_options,
                   sanitize=sanitize)
    native.compile_report = comp.report
    native.compilation = comp
    return native


def compile(model, target: str = "host", fuse: bool = True, *, threads: int | None = None,
            options: CompileOptions | None = None, **kwargs):
    """Compile ``model`` (``zoo:NAME``, a path, an ONNX ModelProto or a Graph) to native code.

    Returns an ``opfuse.runtime.native.CompiledModel``: ``.run(inputs)``, ``.report`` (the fusion
    report, the planner's predictions and the arena), ``.export_c(dir)``. ``target="cortex-m7"``
    returns an ``opfuse.runtime.mcu.McuModel`` instead: ``.export_c(dir)`` writes the standalone
    firmware library, ``.run(inputs)`` runs it under QEMU and ``.instructions`` is what the run
    executed. Other targets are planned (``plan_model``) but not built. ``threads`` (host only)
    defaults to the cores available to the process (``OMP_NUM_THREADS`` when set).

    A model whose inputs have symbolic or unknown dims that ``input_shapes`` does not bind, or
    whose graph inputs decide shapes (a Reshape's shape, a Resize's scales, a ReduceSum's axes fed
    at run time) gives a ``SpecializingModel`` instead: each run's arrays bind them, and the model
    is compiled for those shapes and values (once for each; the built library comes from the
    build cache).
    """
    from opfuse.api import model_source
    model = model_source(model)  # bytes parsed once; None, a number: one ModelError
    opts = options or CompileOptions(target=target, fuse=fuse, **kwargs)
    if opts.target == MCU_TARGET:
        return build_mcu(plan_model(model, opts))
    if opts.target not in ("host",):
        raise OpfuseError(f"target '{opts.target}' can be planned (opfuse compile --target {opts.target}) "
                          f"but not built and run on this machine; use target 'host' or '{MCU_TARGET}'")
    from opfuse.api import unbound_inputs
    if unbound_inputs(model, opts.input_shapes):
        return SpecializingModel(model, opts, threads=threads)
    try:
        comp = plan_model(model, opts)
    except ShapeInputError as e:
        if not e.inputs:
            raise
        return SpecializingModel(model, opts, threads=threads, value_inputs=e.inputs)
    return build_native(comp, threads=threads)


MAX_SPECIALIZATIONS = 8  # compiled shapes a SpecializingModel keeps loaded (least recently used goes first)


class SpecializingModel:
    """A model compiled for the shapes (and shape-deciding values) of the arrays it is run on.

    ``run(feeds)`` binds every open dim from ``feeds`` (checked against the model's rank, fixed
    dims and shared symbols: one ``batch`` for all inputs) and takes the values of the inputs
    that decide shapes (``value_inputs``, found when the import says so: ``ShapeInputError``),
    compiles the model for them unless a model for them is loaded, and runs it on the other
    inputs. Up to ``MAX_SPECIALIZATIONS`` compiled models stay loaded; one dropped and needed
    again is rebuilt from the build cache. ``report``, ``compilation`` and ``graph`` are those of
    the last run's specialisation.
    """

    def __init__(self, model, options: CompileOptions, *, threads: int | None = None,
                 value_inputs: tuple[str, ...] = ()):
        from collections import OrderedDict
        self.model = model
        self.options = options
        self.value_inputs: tuple[str, ...] = tuple(sorted(set(value_inputs) | set(options.input_values or {})))
        self._threads = threads
        self._compiled: OrderedDict[tuple, CompiledModel] = OrderedDict()
        self._current: CompiledModel | None = None
        self.compiles = 0  # how many times a model was built for new shapes

    def specialize(self, feeds: Mapping) -> "CompiledModel":
        """The ``CompiledModel`` for the shapes of ``feeds`` (compiled now when new)."""
        from dataclasses import replace

        from opfuse.api import shapes_for_arrays, unbound_inputs
        import numpy as np
        shapes = shapes_for_arrays(self.model, self.options.input_shapes, feeds)
        missing = unbound_inputs(self.model, shapes)
        if missing:
            raise InputError(f"input(s) {missing} missing: the model's shapes are bound by the arrays of a "
                             f"run (or pass input_shapes)")
        given = dict(self.options.input_values or {})  # values bound at compile time, unless a run gives others
        while True:
            absent = [n for n in self.value_inputs if n not in feeds and n not in given]
            if absent:
                raise InputError(f"input(s) {absent} missing: their values decide shapes of the model")
            values = {n: np.asarray(feeds[n] if n in feeds else given[n]) for n in self.value_inputs}
            key = (tuple(sorted(shapes.items())),
                   tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(values.items())))
            model = self._compiled.get(key)
            if model is not None:
                break
            try:
                comp = plan_model(self.model, replace(self.options, input_shapes=shapes, input_values=values))
            except ShapeInputError as e:
                more = set(e.inputs) - set(self.value_inputs)
                if not more:
                    raise
                self.value_inputs = tuple(sorted(set(self.value_inputs) | more))
                continue
            model = build_native(comp, threads=self._threads)
            self.compiles += 1
            self._compiled[key] = model
            while len(self._compiled) > MAX_SPECIALIZATIONS:
                self._compiled.popitem(last=False)
        self._compiled.move_to_end(key)
        self._current = model
        return model

    def _rest(self, feeds: Mapping) -> dict:
        """``feeds`` less the inputs the specialisation took as constants."""
        return {k: v for k, v in feeds.items() if k not in self.value_inputs}

    def run(self, feeds: Mapping, *, cast: bool = False) -> dict:
        return self.specialize(feeds).run(self._rest(feeds), cast=cast)

    __call__ = run

    def prepared(self, feeds: Mapping):
        return self.specialize(feeds).prepared(self._rest(feeds))

    @property
    def shapes(self) -> list[dict]:
        """The input shapes of the compiled models loaded now (least recently used first)."""
        return [dict(key[0]) for key in self._compiled]

    @property
    def current(self) -> "CompiledModel":
        if self._current is None:
            raise OpfuseError("the model's input shapes are not bound yet: run it once (its arrays bind "
                              "them) or compile with input_shapes")
        return self._current

    @property
    def report(self) -> dict:
        return self.current.report

    @property
    def compilation(self):
        return self.current.compilation

    @property
    def graph(self):
        return self.current.graph

    @property
    def threads(self) -> int | None:
        return self._threads

    @threads.setter
    def threads(self, n: int) -> None:
        for model in self._compiled.values():
            model.threads = n
        self._threads = int(n)


MCU_TARGET = "cortex-m7"


def build_mcu(comp: Compilation):
    """The Cortex-M7 library of a planned model (``opfuse.runtime.mcu.McuModel``): export it, or run
    it under QEMU."""
    from opfuse.runtime.mcu import McuModel, generate_mcu
    if comp.options.target != MCU_TARGET:
        raise OpfuseError(f"the Cortex-M7 library needs a plan for target '{MCU_TARGET}', not "
                          f"'{comp.options.target}'")
    return McuModel(generate_mcu(comp.graph, comp.plan, comp.memory), comp.graph, comp.report, comp)
