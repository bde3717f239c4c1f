"""Measurement: the measured side of the cost model.

``measure(comp)`` builds a planned model with per-kernel timers and puts measured times next to
the predictions (``opfuse compile --measure``); ``fit_host_corrections(models)`` fits the host
cost model's correction factors from them (``opfuse profile --target host --fit``).
"""
from __future__ import annotations

from typing import Sequence

from opfuse.compiler import CompileOptions, Compilation, build_native, plan_model
from opfuse.errors import OpfuseError

MEASURE_REPEAT = 20  # timed runs per measurement (medians are reported: the machine is shared)
MEASURE_WARMUP = 2


def median_seconds(fn, repeat: int = MEASURE_REPEAT, warmup: int = MEASURE_WARMUP) -> float:
    """Median wall time of ``fn()`` over ``repeat`` calls after ``warmup`` untimed ones."""
    import time
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
    native = build_native(comp, threads=threads, codegen_options=CodegenOptions(profile=True))
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
