"""Fit the Cortex-M7 cost model from emulated instruction counts (``opfuse profile --target cortex-m7 --fit``).

The data-sheet profile prices a group with a roofline (800 MFLOP/s, 400 MB/s). What the generated
C actually costs on the core is measurable exactly: QEMU's ``-icount`` counts every instruction,
and a profile build marks every kernel (``runtime.mcu``: ``McuResult.kernel_instructions``). The
fitted model is linear in what the cost analysis already knows of a group:

    instructions = sum_class c_class * FLOPs_class + c_byte * boundary bytes + c_call

with the classes of ``targets.profile.OP_CLASSES`` (dense conv, depthwise conv, GEMM, pooling and
reductions, elementwise), FLOPs as executed (recomputation included). An in-order core without a
cache to plan for overlaps nothing, so the terms add; time is instructions / clock (one
instruction a cycle, as QEMU's icount assumes).

Samples: every kernel of a suite of micro-benchmark graphs (``SUITE``: conv, depthwise, GEMM,
elementwise and pooling shapes, each run unfused and fused), optionally plus the kernels of whole
models. Least squares on *relative* residuals (a 500-instruction and a 5-million-instruction
kernel weigh the same), with non-negative coefficients (a negative cost is dropped to 0 and the
rest refitted). Every ``HOLDOUT_EVERY``-th micro-benchmark graph is held out of the fit and its
kernels' errors reported, so the fit's error is measured on shapes it did not see.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Sequence

import numpy as np

from opfuse.compiler import CompileOptions, Compilation, plan_model
from opfuse.cost.analysis import analyze_group
from opfuse.errors import InputError
from opfuse.ir.graph import Graph
from opfuse.ops import GraphBuilder
from opfuse.targets.profile import INSTRUCTION_COST_KEYS, OP_CLASSES, HardwareProfile

TARGET = "cortex-m7"
HOLDOUT_EVERY = 4  # every 4th micro-benchmark graph is held out of the fit (its errors are reported)
MIN_FIT_SAMPLES = len(INSTRUCTION_COST_KEYS)  # one per coefficient at the very least
SUITES = ("full", "quick")
FIT_SEED = 0


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[], Graph]


def _w(rng, *shape) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.2).astype(np.float32)


def _conv(cin: int, cout: int, hw: int, k: int, stride: int = 1, relu: bool = True) -> Case:
    def build() -> Graph:
        rng = np.random.default_rng(cin * 1000 + cout * 10 + k)
        b = GraphBuilder(f"conv{k}x{k}_{cin}_{cout}_{hw}_s{stride}")
        x = b.input("x", (1, cin, hw, hw))
        y = b.op("Conv", x, b.const("w", _w(rng, cout, cin, k, k)), b.const("b", _w(rng, cout)),
                 pads=[k // 2] * 4, strides=[stride, stride])
        return b.build(b.op("Relu", y) if relu else y)
    return Case(f"conv{k}x{k} {cin}->{cout} {hw}x{hw} s{stride}", build)


def _depthwise(c: int, hw: int, stride: int) -> Case:
    def build() -> Graph:
        rng = np.random.default_rng(c * 100 + hw)
        b = GraphBuilder(f"dw_{c}_{hw}_s{stride}")
        x = b.input("x", (1, c, hw, hw))
        y = b.op("Conv", x, b.const("w", _w(rng, c, 1, 3, 3)), b.const("b", _w(rng, c)),
                 pads=[1, 1, 1, 1], strides=[stride, stride], group=c)
        return b.build(b.op("Clip", y, b.const("lo", np.float32(0)), b.const("hi", np.float32(6))))
    return Case(f"depthwise3x3 {c} {hw}x{hw} s{stride}", build)


def _gemm(m: int, k: int, n: int) -> Case:
    def build() -> Graph:
        rng = np.random.default_rng(m * 7 + k * 3 + n)
        b = GraphBuilder(f"gemm_{m}_{k}_{n}")
        x = b.input("x", (m, k))
        return b.build(b.op("Gemm", x, b.const("w", _w(rng, k, n)), b.const("b", _w(rng, n))))
    return Case(f"gemm {m}x{k}x{n}", build)


def _elementwise(c: int, hw: int) -> Case:
    def build() -> Graph:
        rng = np.random.default_rng(c + hw)
        b = GraphBuilder(f"ew_{c}_{hw}")
        x, y = b.input("x", (1, c, hw, hw)), b.input("y", (1, c, hw, hw))
        s = b.op("Add", x, y)
        return b.build(b.op("Relu", b.op("Mul", s, b.const("scale", _w(rng, 1, c, 1, 1)))))
    return Case(f"elementwise {c}x{hw}x{hw}", build)


def _pool(c: int, hw: int, op: str) -> Case:
    def build() -> Graph:
        b = GraphBuilder(f"{op.lower()}_{c}_{hw}")
        x = b.input("x", (1, c, hw, hw))
        if op == "GlobalAveragePool":
            return b.build(b.op(op, x))
        return b.build(b.op(op, x, kernel_shape=[2, 2], strides=[2, 2]) if op == "MaxPool"
                       else b.op(op, x, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1]))
    return Case(f"{op} {c}x{hw}x{hw}", build)


def _block(c: int, hw: int) -> Case:
    """A MobileNet block: depthwise 3x3 + ReLU6, pointwise 1x1 + ReLU (mixed classes in one graph)."""
    def build() -> Graph:
        rng = np.random.default_rng(c * 31 + hw)
        b = GraphBuilder(f"block_{c}_{hw}")
        x = b.input("x", (1, c, hw, hw))
        y = b.op("Relu", b.op("Conv", x, b.const("dw", _w(rng, c, 1, 3, 3)), pads=[1, 1, 1, 1], group=c))
        z = b.op("Conv", y, b.const("pw", _w(rng, 2 * c, c, 1, 1)), b.const("pb", _w(rng, 2 * c)))
        return b.build(b.op("Relu", z))
    return Case(f"dw+pw block {c} {hw}x{hw}", build)


def _transpose(c: int, hw: int) -> Case:
    """Pure data movement (no FLOPs): what the byte cost is for."""
    def build() -> Graph:
        b = GraphBuilder(f"transpose_{c}_{hw}")
        x = b.input("x", (1, c, hw, hw))
        return b.build(b.op("Transpose", x, perm=[0, 2, 3, 1]))
    return Case(f"transpose {c}x{hw}x{hw}", build)


# Tiny kernels pin the per-call cost; the rest spread each class over shapes, strides and channel counts.
SUITE: tuple[Case, ...] = (
    _elementwise(1, 2), _gemm(1, 4, 2), _pool(1, 4, "MaxPool"), _transpose(8, 8),
    _conv(3, 8, 24, 3, 2), _conv(8, 16, 12, 3), _conv(16, 16, 8, 3), _conv(8, 24, 10, 1),
    _conv(16, 32, 6, 1), _conv(4, 12, 16, 3), _conv(24, 8, 8, 1, relu=False), _conv(12, 12, 12, 3, 2),
    _depthwise(16, 16, 1), _depthwise(32, 8, 2), _depthwise(8, 24, 1), _depthwise(24, 12, 2),
    _gemm(1, 64, 10), _gemm(4, 32, 48), _gemm(1, 256, 12), _gemm(8, 16, 16),
    _elementwise(8, 16), _elementwise(16, 8), _elementwise(4, 24), _elementwise(32, 4),
    _pool(8, 16, "MaxPool"), _pool(16, 8, "AveragePool"), _pool(32, 6, "GlobalAveragePool"),
    _pool(12, 12, "MaxPool"), _block(8, 12), _block(16, 6), _block(12, 8), _block(24, 4),
)
QUICK_SUITE: tuple[Case, ...] = SUITE[::3]  # eleven graphs, every class: what the tests fit on


def suite_cases(suite: str) -> tuple[Case, ...]:
    if suite not in SUITES:
        raise InputError(f"unknown fit suite '{suite}'; choose one of {', '.join(SUITES)}")
    return SUITE if suite == "full" else QUICK_SUITE


@dataclass(frozen=True)
class KernelSample:
    """One kernel: where it came from, its features and its measured instruction count."""

    case: str
    group: str
    ops: str
    features: dict[str, float]  # INSTRUCTION_COST_KEYS -> FLOPs of the class, bytes, 1 (the call)
    measured: int
    patched: bool = False  # a banded (patch) run: its recomputation is not in the features

    def predicted(self, costs: dict[str, float]) -> float:
        return sum(costs.get(k, 0.0) * v for k, v in self.features.items())

    def to_dict(self, costs: dict[str, float] | None = None) -> dict:
        d = {"case": self.case, "group": self.group, "ops": self.ops, "measured": self.measured,
             "features": self.features, "patched": self.patched}
        if costs is not None:
            p = self.predicted(costs)
            d["predicted"] = round(p)
            d["error"] = (p - self.measured) / self.measured
        return d


def kernel_samples(comp: Compilation, case: str, workdir=None) -> list[KernelSample]:
    """Run ``comp`` under QEMU with per-kernel marks; one sample per kernel that ran."""
    from opfuse.memory.patch import PATCHED_KIND
    from opfuse.runtime import mcu, reference
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory, marks=True)
    result = mcu.run_on_qemu(program, reference.random_inputs(comp.graph, FIT_SEED), workdir)
    cache: dict = {}
    out = []
    for index, measured in sorted(result.kernel_instructions.items()):
        group = comp.plan.groups[index]
        out.append(KernelSample(case, group.name, "+".join(n.op_type for n in group.nodes),
                                group_features(comp.graph, group, cache), measured, group.kind == PATCHED_KIND))
    return out


def group_features(graph: Graph, group, cache: dict | None = None) -> dict[str, float]:
    """The instruction model's features of one kernel: FLOPs per op class, boundary bytes, calls.

    A patched group (``memory.patch``: a run of groups executed band by band) is the sum of its
    member groups, each analysed as the kernel it was (its inlined producers are not recomputed per
    read across members: bands are materialised in the workspace), scaled by the run's work with
    recomputed halo rows over its work without; every member runs once per band."""
    from opfuse.memory.patch import PATCHED_KIND
    members = [m.group for m in group.attrs["patch"].members] if group.kind == PATCHED_KIND else [group]
    features = {k: 0.0 for k in INSTRUCTION_COST_KEYS}
    for member in members:
        a = analyze_group(graph, member.nodes, cache)
        for k in OP_CLASSES:
            features[k] += float(a.executed_by_class.get(k, 0.0))
        features["byte"] += float(a.boundary_bytes)
    if group.kind == PATCHED_KIND:
        sched = group.attrs["patch"]
        scale = sched.work_patched / sched.work_unpatched if sched.work_unpatched else 1.0
        for k in (*OP_CLASSES, "byte"):
            features[k] *= scale
        features["call"] = float(len(members) * len(sched.bands))
    else:
        features["call"] = 1.0
    return features


def case_samples(case: Case) -> list[KernelSample]:
    """The kernels of one micro-benchmark graph, unfused and fused (no patching: plain kernels)."""
    out = []
    for fuse in (False, True):
        comp = plan_model(case.build(), CompileOptions(target=TARGET, fuse=fuse, patch_recompute_limit=0.0,
                                                       corrections=False))
        out.extend(kernel_samples(comp, case.name + (" fused" if fuse else "")))
    return out


def fit_costs(samples: Sequence[KernelSample]) -> dict[str, float]:
    """Non-negative least squares on relative residuals: ``min sum ((x_i . c - m_i) / m_i)^2``."""
    usable = [s for s in samples if s.measured > 0 and not s.patched]
    if len(usable) < MIN_FIT_SAMPLES:
        raise InputError(f"{len(usable)} kernel samples cannot fit {len(INSTRUCTION_COST_KEYS)} costs")
    keys = list(INSTRUCTION_COST_KEYS)
    a = np.array([[s.features.get(k, 0.0) / s.measured for k in keys] for s in usable])
    b = np.ones(len(usable))
    active = [j for j, _ in enumerate(keys) if np.any(a[:, j] > 0)]  # a class no sample has stays 0
    coef = np.zeros(len(keys))
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if np.all(sol >= 0):
            coef[active] = sol
            break
        active = [j for j, v in zip(active, sol, strict=True) if v >= 0] if np.any(sol > 0) else []
    return {k: float(v) for k, v in zip(keys, coef, strict=True)}


def error_summary(samples: Sequence[KernelSample], costs: dict[str, float]) -> dict:
    """Relative errors (predicted - measured) / measured of per-kernel counts, and of their sum."""
    if not samples:
        return {"kernels": 0}
    errs = np.array([(s.predicted(costs) - s.measured) / s.measured for s in samples])
    measured = sum(s.measured for s in samples)
    predicted = sum(s.predicted(costs) for s in samples)
    return {"kernels": len(samples), "median_abs_error": float(np.median(np.abs(errs))),
            "mean_abs_error": float(np.mean(np.abs(errs))), "max_abs_error": float(np.max(np.abs(errs))),
            "measured_instructions": int(measured), "predicted_instructions": round(predicted),
            "total_error": (predicted - measured) / measured}


@dataclass
class M7Fit:
    profile: HardwareProfile
    costs: dict[str, float]
    train: list[KernelSample]
    held_out: list[KernelSample]
    extra_models: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {"costs": self.costs, "train": error_summary(self.train, self.costs),
                "held_out": error_summary(self.held_out, self.costs), "models": self.extra_models,
                "held_out_kernels": [s.to_dict(self.costs) for s in self.held_out]}


def fitted_profile(costs: dict[str, float], notes: Sequence[str] = ()) -> HardwareProfile:
    """The data-sheet profile with the fitted instruction costs (and roofline figures derived from them,
    for the printed ridge point: the GEMM rate and the byte rate at one instruction a cycle)."""
    from opfuse.targets.builtin import M7_CLOCK_HZ, cortex_m7
    from opfuse.targets.fitted import M7_FIT_SOURCE
    sheet = cortex_m7()
    peak = M7_CLOCK_HZ / costs["gemm"] if costs.get("gemm") else sheet.peak_for("float32")
    bandwidth = M7_CLOCK_HZ / costs["byte"] if costs.get("byte") else sheet.mem_bandwidth
    when = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    return sheet.with_overrides(
        instruction_costs=dict(costs), clock_hz=M7_CLOCK_HZ, calibrated=True, source=M7_FIT_SOURCE,
        peak_flops={**sheet.peak_flops, "float32": peak}, mem_bandwidth=bandwidth,
        launch_overhead_s=costs.get("call", 0.0) / M7_CLOCK_HZ,
        notes=(f"fitted {when} by `opfuse profile --target cortex-m7 --fit` (QEMU mps2-an500 -icount)",
               "time = instructions / 400 MHz, instructions = sum_class c * FLOPs + c_byte * bytes + c_call",
               *notes, *sheet.notes[1:]))


def fit_m7(suite: str = "full", models: Sequence = (), *, save: bool = True,
           holdout_every: int = HOLDOUT_EVERY) -> M7Fit:
    """Run the micro-benchmarks (and ``models``) under QEMU, fit, and save the profile (``save``)."""
    from opfuse.api import load
    from opfuse.progress import step
    from opfuse.runtime.mcu import find_tools
    from opfuse.targets.fitted import save_m7_fit
    cases = suite_cases(suite)
    graphs = [load(m) for m in models]  # bad model names fail here, before anything runs
    find_tools()  # a one-line ToolchainError when the cross compiler or QEMU is missing
    train: list[KernelSample] = []
    held: list[KernelSample] = []
    for i, case in enumerate(cases):
        with step(f"cortex-m7 fit: {case.name}"):
            samples = case_samples(case)
        (held if holdout_every and i % holdout_every == holdout_every - 1 else train).extend(samples)
    for model, graph in zip(models, graphs, strict=True):
        with step(f"cortex-m7 fit: {model}"):
            comp = plan_model(graph, CompileOptions(target=TARGET, patch_recompute_limit=0.0, corrections=False))
            train.extend(kernel_samples(comp, str(model)))
    costs = fit_costs(train)
    held_err = error_summary(held, costs)
    note = (f"fit on {len(train)} kernels ({suite} suite" + (f" + {len(models)} model(s)" if models else "")
            + f"); held-out {held_err.get('kernels', 0)} kernels: median |error| "
            + (f"{held_err['median_abs_error']:.1%}" if held_err.get("kernels") else "n/a"))
    fit = M7Fit(fitted_profile(costs, (note,)), costs, train, held, [str(m) for m in models])
    if save:
        save_m7_fit(fit.profile, {"summary": {k: v for k, v in fit.summary().items() if k != "held_out_kernels"},
                                  "train": [s.to_dict(costs) for s in train],
                                  "held_out": [s.to_dict(costs) for s in held]})
    return fit


def model_kernel_errors(model, costs: dict[str, float] | None = None) -> tuple[list[KernelSample], dict[str, float]]:
    """Per-kernel measured instructions of ``model`` as compiled for the Cortex-M7 (its default plan,
    patching included), with the costs (default: the saved fit's) to predict them."""
    from opfuse.targets import get_profile
    if costs is None:
        costs = get_profile(TARGET).instruction_costs
        if not costs:
            raise InputError("no saved cortex-m7 fit: run `opfuse profile --target cortex-m7 --fit` first")
    comp = plan_model(model, CompileOptions(target=TARGET))
    return kernel_samples(comp, str(model)), costs


def format_fit(fit: M7Fit) -> str:
    lines = ["cortex-m7 instruction costs (least squares on relative error, non-negative):"]
    for k, v in fit.costs.items():
        unit = "per kernel call" if k == "call" else "per boundary byte" if k == "byte" else f"per {k} FLOP"
        lines.append(f"  {k:<12} {v:10.4g} instructions {unit}")
    for label, samples in (("fit", fit.train), ("held out", fit.held_out)):
        e = error_summary(samples, fit.costs)
        if e["kernels"]:
            lines.append(f"{label}: {e['kernels']} kernels, per-kernel |error| median {e['median_abs_error']:.1%}, "
                         f"max {e['max_abs_error']:.1%}; total {e['predicted_instructions']:,} predicted vs "
                         f"{e['measured_instructions']:,} measured ({e['total_error']:+.1%})")
    return "\n".join(lines)
