"""Measurement: the measured side of the cost model.

``measure(comp)`` builds a planned model with per-kernel timers and puts measured times next to
the predictions (``opfuse compile --measure``); ``fit_host_corrections(models)`` fits the host
cost model's correction factors from them (``opfuse profile --target host --fit``);
``group_check(model)`` sets each fused group against its ops unfused (``opfuse bench --groups``).
The machine's yardsticks that measured rates read against are ``opfuse.yardsticks``.
"""
from __future__ import annotations

import time
from typing import Collection, Mapping, Sequence

from opfuse.compiler import CompileOptions, Compilation, build_native, plan_model
from opfuse.cost.roofline import MEMORY_BOUND
from opfuse.ops.registry import Category, get_spec
from opfuse.errors import OpfuseError

MEASURE_REPEAT = 20  # timed runs per measurement (medians are reported: the machine is shared)
MEASURE_WARMUP = 2


def median_seconds(fn, repeat: int = MEASURE_REPEAT, warmup: int = MEASURE_WARMUP) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls after ``warmup`` untimed ones."""
    from statistics import median
    if repeat < 1:
        raise OpfuseError(f"repeat (--repeat) must be at least 1, got {repeat}")
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
    from opfuse.runtime.reference import random_inputs
    if comp.options.target != "host":
        raise OpfuseError(f"measuring needs the host target, not '{comp.options.target}'")
    if repeat < 1:
        raise OpfuseError(f"repeat (--repeat) must be at least 1, got {repeat}")
    from opfuse.progress import step
    native = build_native(comp, threads=threads, codegen_options=CodegenOptions(profile=True))
    feeds = random_inputs(comp.original, seed)
    with step(f"measuring {comp.report.get('model', 'the model')} ({'fused' if comp.options.fuse else 'unfused'})"):
        whole_s = median_seconds(lambda: native.run(feeds), repeat)
        rows = native.profile(feeds, repeat=repeat)
    per_group: dict[str, float] = {}
    for row in rows:
        per_group[row["group"]] = per_group.get(row["group"], 0.0) + row["ms"] / 1e3
    comp.report["measured_latency_s"] = whole_s
    comp.report["measured_repeat"] = repeat
    notes = {k.group: list(k.notes) for k in native.program.kernels if k.notes}
    for g in comp.report.get("groups", []):
        if g["name"] in per_group:
            g["measured_latency_s"] = per_group[g["name"]]
        if g["name"] in notes:  # the algorithms its kernel chose (Winograd or direct convolution, ...)
            g["kernel_notes"] = notes[g["name"]]
    return per_group


def measure_before(comp: Compilation, *, repeat: int = MEASURE_REPEAT, threads: int = 1, seed: int = 0) -> None:
    """Time the unfused build of ``comp``'s model (one kernel per original op, timers on) and put
    each group's "before" next to its measured time: ``measured_before_s`` in every group of
    ``comp.report`` (the sum over the original ops it stands for, ``origin``) and
    ``measured_before_latency_s`` for the whole model. Host target only."""
    from dataclasses import replace
    unfused = plan_model(comp.original, replace(comp.options, fuse=False, dump_ir=None, log_decisions=None))
    per_op = measure(unfused, repeat=repeat, threads=threads, seed=seed)
    comp.report["measured_before_latency_s"] = unfused.report["measured_latency_s"]
    for g in comp.report.get("groups", []):
        times = [per_op[o] for o in g.get("origin", []) if o in per_op]
        if times:
            g["measured_before_s"] = sum(times)


# A fused group is flagged slower when its median exceeds its ops' unfused sum by more than this
# fraction: the kernel timers of two builds timed in turn on a shared machine differ by a few
# percent with nothing changed.
GROUP_SLOWER_TOLERANCE = 0.05


def interleaved_kernel_medians(natives: Sequence, feeds, repeat: int, warmup: int = MEASURE_WARMUP,
                               samples: list[dict[str, list[float]]] | None = None) -> list[dict]:
    """Per build (each built with kernel timers), the median over ``repeat`` runs of each group's
    time in one run (seconds); the builds run in turn, A B A B ..., so a change of load hits all.
    ``samples``, when given (an empty list), receives per build each group's ``repeat`` times in
    round order (round ``r`` of one build ran next to round ``r`` of the others)."""
    from statistics import median
    if samples is None:
        samples = []
    samples[:] = [{} for _ in natives]
    for r in range(warmup + repeat):
        for native, per in zip(natives, samples, strict=True):
            rows = native.profile(feeds, repeat=1)
            if r < warmup:
                continue
            run: dict[str, float] = {}
            for row in rows:
                run[row["group"]] = run.get(row["group"], 0.0) + row["ms"] / 1e3
            for group, seconds in run.items():
                per.setdefault(group, []).append(seconds)
    return [{g: median(v) for g, v in per.items()} for per in samples]


def group_check(model, *, threads: int = 1, repeat: int = MEASURE_REPEAT, seed: int = 0,
                options: CompileOptions | None = None) -> dict:
    """Does fusion ever make a group slower? ``model`` is built fused (the planner's plan) and
    unfused, both with kernel timers, and run in turn; each fused group's median time is set
    against the sum of the medians of the unfused kernels of the original ops it stands for.
    Returns ``{"groups": [{"group", "ops", "origin", "fused_s", "unfused_s", "unfused_kernels", "ratio",
    "slower", "moved"}...], "fused_s", "unfused_s", "slower": [names], "moved": [names], "tolerance",
    "clock"}``; ``slower`` when the group fuses (stands for more than one original op) and ``fused_s >
    unfused_s * (1 + GROUP_SLOWER_TOLERANCE)``, unless the time only moved to it from the groups that
    produce its inputs (``moved``, ``_with_producers``); ``"memory_bound"``: the share of the unfused
    build's memory-bound kernel time that the fused build removes (``memory_bound_removed``). Host
    target only."""
    from dataclasses import replace
    from opfuse.codegen.options import CodegenOptions
    from opfuse.cost.model import CostModel
    from opfuse.runtime.reference import random_inputs
    from opfuse.targets import get_profile
    if repeat < 1:
        raise OpfuseError(f"repeat must be at least 1, got {repeat}")
    options = options or CompileOptions()
    if options.target != "host":
        raise OpfuseError(f"the per-group check needs the host target, not '{options.target}'")
    fused = plan_model(model, replace(options, fuse=True))
    unfused = plan_model(fused.original, replace(options, fuse=False, dump_ir=None, log_decisions=None))
    # One thread runs every kernel on the calling thread: its CPU time leaves out the time other
    # processes held the core (``CodegenOptions.profile_clock``); more threads need the wall clock.
    clock = "thread_cpu" if threads == 1 else "wall"
    timed = CodegenOptions(profile=True, profile_clock=clock)
    natives = [build_native(c, threads=threads, codegen_options=timed) for c in (fused, unfused)]
    feeds = random_inputs(fused.original, seed)
    runs: list[dict[str, list[float]]] = []
    t_fused, t_unfused = interleaved_kernel_medians(natives, feeds, repeat, samples=runs)
    # An unfused kernel counts for a fused group when it is one of the group's original ops, or when
    # all its nodes are in the group (the nodes rewrites add, a float16 op's Casts, have no origin).
    fused_nodes = {g.name: {n.name for n in g.nodes} for g in fused.plan.groups}
    unfused_nodes = {g.name: {n.name for n in g.nodes} for g in unfused.plan.groups}
    anchor_of = {g.name: g.anchor.name for g in fused.plan.groups if g.anchor is not None}
    rows = []
    for g in fused.report.get("groups", []):
        if g["name"] not in t_fused:
            continue
        mine = fused_nodes.get(g["name"], set())
        counted = sorted({o for o in g.get("origin", []) if o in t_unfused}
                         | {u for u, ns in unfused_nodes.items() if ns and ns <= mine and u in t_unfused})
        f, u = t_fused[g["name"]], sum(t_unfused[k] for k in counted)
        anchor = anchor_of.get(g["name"])
        rows.append({"group": g["name"], "ops": g.get("ops", []), "origin": g.get("origin", []), "fused_s": f,
                     "unfused_s": u, "unfused_kernels": counted, "ratio": f / u if u > 0 else None,
                     "slower": len(counted) > 1 and f > u * (1 + GROUP_SLOWER_TOLERANCE), "moved": None,
                     "anchor_kernels": [k for k in counted if anchor is not None and anchor in unfused_nodes[k]]})
    _with_producers(rows, fused.plan.groups)
    cm = CostModel(get_profile(options.target))  # the roofline's verdict, no measured corrections
    # Data movement (Concat, Split, Transpose...) moves bytes and computes nothing, whatever the roofline
    # says of a kernel it prices as zero-copy (the unfused build's Concat copies).
    bound = {g.name: MEMORY_BOUND if all(get_spec(n.op_type, n).category == Category.INJECTIVE for n in g.nodes)
             else cm.group_cost(unfused.graph, g).bound for g in unfused.plan.groups}
    contractions = {g.name for g in unfused.plan.groups
                    if any(get_spec(n.op_type, n).category == Category.OUT_ELEMWISE_FUSABLE for n in g.nodes)}
    return {"groups": rows, "fused_s": sum(r["fused_s"] for r in rows), "unfused_s": sum(r["unfused_s"] for r in rows),
            "slower": [r["group"] for r in rows if r["slower"]], "moved": [r["group"] for r in rows if r["moved"]],
            "tolerance": GROUP_SLOWER_TOLERANCE, "repeat": repeat, "threads": threads, "clock": clock,
            "memory_bound": memory_bound_removed(rows, t_unfused, bound, contractions, runs=runs)}


def memory_bound_removed(rows: list[dict], t_unfused: Mapping[str, float], bound: Mapping[str, str | None],
                         contractions: Collection[str] = (), runs: Sequence[Mapping[str, list[float]]] = ()) -> dict:
    """How much of the time the unfused build spends in memory-bound kernels the fused build removes.

    An unfused kernel is memory-bound when the cost model's roofline says so for its group
    (``bound``: ``"memory"`` or ``"compute"``; ``group_check`` calls data movement memory-bound
    always): elementwise ops, pools, normalisations, reorders, and convolutions whose bytes outweigh
    their FLOPs (small or depthwise ones). A fused group's *anchor
    kernels* are the unfused kernels of the op its loop is built around (a row's ``anchor_kernels``,
    when it stands for more than one kernel), its compute-bound kernels and its ``contractions``
    (Conv, MatMul, Gemm: a classifier's GEMV is memory-bound too): the work fusion keeps.

    * ``unfused_s``: the medians of the memory-bound unfused kernels summed, anchors and contractions
      left out (a depthwise convolution that the roofline calls memory-bound still runs when fused:
      no fusion removes it, so it is on neither side);
    * ``left_s``: what the fused build still spends on that work: for each fused group that stands
      for a memory-bound kernel, its measured time less its anchor kernels' unfused time (a Conv's
      epilogue costs what the fused kernel takes beyond the Conv alone). With ``runs`` (the
      per-round times of both builds, ``interleaved_kernel_medians``), that difference is the median
      over rounds of the fused group's time less its anchors' in the same round: a 2.4 ms Conv
      varies by a few percent from run to run on a shared machine, more than its epilogue costs, and
      the paired difference cancels what both builds' kernels met in that round. A memory-bound
      kernel left standalone counts in full; one with no fused kernel at all (a Reshape become a
      view, a BatchNorm folded into weights) counts 0; a fused kernel that stands for no unfused
      kernel (a copy where the unfused build had views) counts in full. The rows are summed as they
      are, below 0 too: an epilogue that costs nothing leaves a row's paired difference as often
      below 0 as above it, and each row held at 0 would add that noise up into time left over: in
      an A/A check (``benchmarks/bench_memory_aa.py``: the same fused build on both sides, where
      nothing is truly left) resnet18's 22 rows held at 0 summed to 24-127 us (mean 82) in eight
      processes, as they are to -59 to +103 us (mean +30; 300-430 us of memory-bound work, load 6-8).
      A row below 0 by more than its noise is its anchors running faster fused than alone (caches,
      another code path), a saving the fused build made, and it offsets what other rows have left:
      the per-row figures show it;
    * ``removed``: ``1 - left_s / unfused_s`` (``None`` with no memory-bound kernel). Negative when
      fusion made the memory-bound work slower; above 1 when the fused groups took less, summed,
      than their anchors unfused: all of it removed, within the noise the interval shows.

    Per row, ``memory_unfused_s`` and ``memory_left_s`` (``None`` when it stands for no memory-bound
    kernel; below 0 when the group measured faster than its anchors unfused) are added;
    ``uncounted_s``: the memory-bound unfused kernels in no row;
    ``unfused_kernels``: every unfused kernel's median seconds (``s``) and ``bound``.

    ``interval`` (with ``runs``; else ``None``): how far ``removed`` moves with the rounds that were
    measured, where the memory-bound share of a model is small next to its convolutions' spread: the
    same figure recomputed ``MEMORY_BOUND_RESAMPLES`` times from the rounds drawn with replacement
    (every median and paired difference over the drawn rounds; a fixed seed, so the same samples give
    the same interval), its ``MEMORY_BOUND_INTERVAL`` central range ``[low, high]``."""
    rounds = _rounds(runs)
    total, left, per_row = _memory_estimate(rows, t_unfused, bound, contractions, runs, None)
    for r, (mem, over) in zip(rows, per_row, strict=True):
        r["memory_unfused_s"], r["memory_left_s"] = mem, over
    memory = _memory_kernels(rows, t_unfused, bound, contractions)
    counted = {k for r in rows for k in r.get("unfused_kernels", [])}
    interval = None
    if total > 0 and rounds > 1:
        import numpy as np
        rng = np.random.default_rng(0)
        figures = []
        for _ in range(MEMORY_BOUND_RESAMPLES):
            pick = [int(i) for i in rng.integers(0, rounds, rounds)]
            t, lf, _ = _memory_estimate(rows, t_unfused, bound, contractions, runs, pick)
            if t > 0:
                figures.append(1.0 - lf / t)
        if figures:
            tail = (1.0 - MEMORY_BOUND_INTERVAL) / 2 * 100
            low, high = np.percentile(figures, [tail, 100 - tail])
            interval = {"low": float(low), "high": float(high), "share": MEMORY_BOUND_INTERVAL,
                        "resamples": len(figures), "rounds": rounds}
    return {"unfused_s": total, "left_s": left, "removed": 1.0 - left / total if total > 0 else None,
            "interval": interval,
            "uncounted_s": sum(t_unfused[k] for k in memory if k not in counted), "kernels": len(memory),
            "unfused_kernels": {k: {"s": t, "bound": bound.get(k)} for k, t in t_unfused.items()}}


# ``memory_bound_removed``'s interval: the figure recomputed from this many resamples of the measured
# rounds, and the central share of those figures it reports (5th to 95th percentile).
MEMORY_BOUND_RESAMPLES = 200
MEMORY_BOUND_INTERVAL = 0.9


def _rounds(runs: Sequence[Mapping[str, list[float]]]) -> int:
    """Rounds every per-round sample list of ``runs`` has (0 when there are none or they differ)."""
    lengths = {len(v) for per in runs for v in per.values()}
    return lengths.pop() if len(lengths) == 1 else 0


def _anchor_kernels(r: dict, bound: Mapping[str, str | None], contractions: Collection[str]) -> set[str]:
    kernels = r.get("unfused_kernels", [])
    mine = {k for k in kernels if bound.get(k) != MEMORY_BOUND or k in contractions}
    if len(kernels) > 1:
        mine |= set(r.get("anchor_kernels", []))
    return mine


def _memory_kernels(rows: list[dict], t_unfused: Mapping[str, float], bound: Mapping[str, str | None],
                    contractions: Collection[str]) -> list[str]:
    anchors = {k for r in rows if r.get("unfused_kernels") for k in _anchor_kernels(r, bound, contractions)}
    return [k for k in t_unfused if bound.get(k) == MEMORY_BOUND and k not in anchors and k not in contractions]


def _memory_estimate(rows: list[dict], t_unfused: Mapping[str, float], bound: Mapping[str, str | None],
                     contractions: Collection[str], runs: Sequence[Mapping[str, list[float]]],
                     pick: list[int] | None) -> tuple[float, float, list[tuple[float | None, float | None]]]:
    """``memory_bound_removed``'s (unfused_s, left_s, per row (memory_unfused_s, memory_left_s)): from the
    medians given (``pick`` None), or from the rounds ``pick`` of ``runs`` (a resample)."""
    from statistics import median
    fused_runs, unfused_runs = (runs[0], runs[1]) if len(runs) == 2 else ({}, {})

    def unfused(k: str) -> float:
        if pick is None or k not in unfused_runs:
            return t_unfused[k]
        return median(unfused_runs[k][i] for i in pick)

    left = 0.0
    per_row: list[tuple[float | None, float | None]] = []
    for r in rows:
        samples = fused_runs.get(r["group"], [])
        fused_s = r["fused_s"] if pick is None or not samples else median(samples[i] for i in pick)
        kernels = r.get("unfused_kernels", [])
        if not kernels:  # work the unfused build does not do (a copy where it had views): all left
            per_row.append((0.0, fused_s))
            left += fused_s
            continue
        mine = _anchor_kernels(r, bound, contractions)
        mem = sum(unfused(k) for k in kernels if k not in mine)
        if mem <= 0:
            per_row.append((None, None))
            continue
        over = fused_s - sum(unfused(k) for k in mine)
        if samples and all(len(unfused_runs.get(k, ())) == len(samples) for k in mine):
            diffs = [f - sum(unfused_runs[k][i] for k in mine) for i, f in enumerate(samples)]
            over = median(diffs if pick is None else [diffs[i] for i in pick])
        per_row.append((mem, over))
        left += over
    total = sum(unfused(k) for k in _memory_kernels(rows, t_unfused, bound, contractions))
    return total, left, per_row


def _with_producers(rows: list[dict], groups) -> None:
    """Set each slower row against itself plus the groups that produce its inputs, in both builds.

    A kernel that reads a large tensor first pays for fetching it from memory: resnet18's
    Relu+MaxPool reads conv1's 3.2 MB output 2x slower cold than warm, and unfused that first
    reader is the BatchNorm kernel counted under conv1 (folded into the fused conv), so the cost
    moves from one group's row to the next one's. Where the pair together is not slower fused
    (``fused_s <= unfused_s * (1 + GROUP_SLOWER_TOLERANCE)``), the row's ``moved`` says so
    (``{"producers", "fused_s", "unfused_s", "ratio"}``) and it is no longer counted ``slower``;
    its own numbers stay in the row."""
    producer = {id(v): g.name for g in groups for n in g.nodes for v in n.outputs}
    by_name = {r["group"]: r for r in rows}
    inputs = {g.name: g.inputs() for g in groups}
    for r in rows:
        if not r["slower"]:
            continue
        prods = sorted({producer[id(v)] for v in inputs.get(r["group"], []) if id(v) in producer}
                       & by_name.keys() - {r["group"]})
        if not prods:
            continue
        f = r["fused_s"] + sum(by_name[p]["fused_s"] for p in prods)
        u = r["unfused_s"] + sum(by_name[p]["unfused_s"] for p in prods)
        if f <= u * (1 + GROUP_SLOWER_TOLERANCE):
            r["moved"] = {"producers": prods, "fused_s": f, "unfused_s": u, "ratio": f / u}
            r["slower"] = False


def achieved_rate(group: dict, ridge_flop_per_byte: float) -> tuple[float, str] | None:
    """What a measured report group achieved: GFLOP/s (its FLOPs) when the planner's roofline
    calls it compute bound, else GB/s (its boundary bytes, ``bytes_after``). Without a planner's
    verdict, compute bound means an arithmetic intensity at or above ``ridge_flop_per_byte``
    (the yardsticks' ``sgemm_gflops / copy_gbps``)."""
    seconds = group.get("measured_latency_s")
    if not seconds:
        return None
    bound = group.get("bound")
    if bound is None:
        bound = "compute" if group.get("arithmetic_intensity", 0.0) >= ridge_flop_per_byte else "memory"
    if bound == "compute":
        return group.get("flops", 0) / seconds / 1e9, "GFLOP/s"
    return group.get("bytes_after", 0) / seconds / 1e9, "GB/s"


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
