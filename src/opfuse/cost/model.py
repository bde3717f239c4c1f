"""``CostModel``: predicted latency of a fused group and of a whole plan on a target.

Per group (see ``opfuse.cost.analysis`` for the execution model):

    T_compute = sum_dtype FLOPs_executed(dtype) / P_peak(dtype)   (+ register spill work,
                + FLOPs_scalar * (lanes - 1) / P_peak: scalar loops run one lane of the vectors)
    T_memory  = M_boundary / B
    T_spill   = M_spill / (B * SPILL_BANDWIDTH_FRACTION)
    T_pred    = max(T_compute, T_memory) + T_spill + T_overhead + T_numa
    T         = T_pred * (1 + alpha_bucket)

* ``M_boundary`` counts only the group's boundary tensors (inputs, weights included, and
  outputs); internal values are free.
* Duplicated computation: an inlined producer recomputed at each read adds its FLOPs
  ``exec - 1`` more times (``GroupAnalysis.executed_flops``).
* On-chip spill (over-fusion): when the working set ``W`` (buffered intermediates)
  exceeds the on-chip capacity ``C``, reuse distances exceed the cache and *all* of it
  misses (the LRU cliff, not just the excess): ``M_spill = SPILL_TRAFFIC_FACTOR * W``
  (written back once, read back once), at a fraction of streaming bandwidth because the
  lines come back out of order. Spill time is *added* to the roofline time rather than
  overlapped with it: a spilled value is reloaded exactly when the computation needs
  it, so the core waits for it (the roofline's overlap of compute and streaming does not
  apply), and a compute-bound kernel does not hide its spills.
* Register spill: beyond ``register_bytes // vector_bytes`` live streamed values, each
  extra value costs a store and a reload per element, counted as
  ``REGISTER_SPILL_OPS_PER_ELEMENT`` operations per element of compute time.
* Epilogue of a compute-bound anchor: an op ``EPILOGUE_STREAM_RATIO`` lists, after a Conv/MatMul of
  the group that is compute-bound alone (its FLOPs / P_peak >= its bytes / B), costs
  ``max(FLOPs / P_peak, ratio * 2 * bytes / B)`` of compute time (``GroupAnalysis.epilogue_stream_bytes``):
  its measured arithmetic as a multiple of the stream it saves, so fused against unfused (``max(its
  stream, its FLOPs)`` alone) follows what was measured whatever the profile's absolute bandwidth.
  After a memory-bound anchor (a depthwise convolution) it hides in the anchor's stream: priced at its
  FLOPs (depthwise 3x3, 64 channels at 200x152, + Tanh / Gelu measured 0.88 / 0.91 fused/unfused).
* The same op in a group without an anchor (the unfused side of that decision: a standalone elementwise
  kernel) is priced by the same ratio, ``max(FLOPs / P_peak, ratio * 2 * bytes / B)`` of compute time
  (``GroupAnalysis.arithmetic_stream_bytes``), which its own stream overlaps: the kernel takes
  ``max(stream, ratio * stream)``. Measured (``bench_epilogues.py``'s ``alone``: the unfused build's activation
  kernel over the stream a Relu's moves, 31 rounds, CPU time, two runs at load 4-5 and 8): Tanh 1.69, 1.25 (fused
  1.58, 1.19), Gelu 2.29, 1.94 (2.51, 1.99), GeluTanh 1.43, 1.45 (1.46, 1.36), Softplus 4.03, 4.61 (4.17, 4.55): an
  exp-heavy op costs about the same fused and alone, so an epilogue with a ratio >= 1 is predicted at parity,
  less the kernel launch fusing saves (before, the kernel alone was priced as its stream, and such epilogues
  were refused).
* ``T_numa``: remote boundary accesses (``opfuse.cost.numa``), when a placement is given.

Per plan: ``total_latency_s`` is the sum over groups (kernels run one after another);
``critical_path_s`` is the longest path through the group graph (the seed's
``max over paths sum L(P)``, the quantity a latency bound constrains); peak activation
memory as in ``opfuse.cost.liveness``; ``eta = 1 - M_boundary / M_total`` with
``M_total`` the traffic of the unfused graph.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Mapping

from opfuse.cost.analysis import GroupAnalysis, analyze_group, node_flops
from opfuse.cost.correction import Corrections, Sample
from opfuse.cost.liveness import peak_activation_bytes
from opfuse.cost.numa import NumaPlacement, remote_time
from opfuse.cost.roofline import COMPUTE_BOUND, MEMORY_BOUND, bandwidth_saving_rate
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.targets.profile import HardwareProfile

SPILL_TRAFFIC_FACTOR = 2.0  # a spilled byte is written back once and read back once
SPILL_BANDWIDTH_FRACTION = 0.5  # spilled lines return out of order: no streaming prefetch
REGISTER_SPILL_OPS_PER_ELEMENT = 2.0  # a spilled vector value: one store + one reload


@dataclass(frozen=True)
class GroupCost:
    flops: float  # executed, recomputation included
    duplicated_flops: float
    bytes: int  # boundary bytes through main memory
    spill_bytes: float
    working_set_bytes: int
    register_pressure: int
    remote_bytes: int
    t_compute: float
    t_memory: float
    t_spill: float
    t_overhead: float
    t_numa: float
    t_predicted: float  # before the correction factor
    alpha: float
    latency_s: float  # t_predicted * (1 + alpha)
    intensity: float
    ridge_point: float
    bound: str
    bucket: str  # the correction bucket: the group's hardest op category

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["intensity"] = None if self.intensity == float("inf") else self.intensity
        d["predicted_latency_s"] = self.latency_s
        return d


@dataclass(frozen=True)
class PlanCost:
    target: str
    group_names: tuple[str, ...]
    group_ops: tuple[tuple[str, ...], ...]
    groups: tuple[GroupCost, ...]
    total_latency_s: float
    critical_path_s: float
    peak_memory_bytes: int
    kernels: int
    boundary_bytes: int  # M_boundary
    unfused_bytes: int  # M_total
    eta: float

    def to_dict(self) -> dict:
        return {"target": self.target, "predicted_latency_s": self.total_latency_s,
                "critical_path_s": self.critical_path_s, "peak_memory_bytes": self.peak_memory_bytes,
                "kernels": self.kernels, "bytes_boundary": self.boundary_bytes,
                "bytes_unfused": self.unfused_bytes, "eta": self.eta,
                "groups": [{"name": n, "ops": list(ops), **g.to_dict()}
                           for n, ops, g in zip(self.group_names, self.group_ops, self.groups, strict=True)]}


def predicted_instructions(profile: HardwareProfile, a: GroupAnalysis) -> tuple[float, float, float]:
    """(compute, data movement, call) instructions of a group under a fitted instruction-count
    profile (``HardwareProfile.instruction_costs``)."""
    c = profile.instruction_costs
    compute = sum(c.get(k, 0.0) * f for k, f in a.executed_by_class.items())
    return compute, c.get("byte", 0.0) * a.boundary_bytes, 0.0 if a.zero_copy else c.get("call", 0.0)


def instruction_times(profile: HardwareProfile, a: GroupAnalysis) -> tuple[float, float, float]:
    return tuple(n / profile.clock_hz for n in predicted_instructions(profile, a))  # type: ignore[return-value]


class CostModel:
    """Roofline cost of groups and plans on one ``HardwareProfile``."""

    def __init__(self, profile: HardwareProfile, corrections: Corrections | None = None,
                 placement: NumaPlacement | None = None):
        self.profile = profile
        self.corrections = corrections if corrections is not None else Corrections(profile.name)
        self.placement = placement

    # Groups -------------------------------------------------------------------------------
    def group_cost(self, graph: Graph, group) -> GroupCost:
        nodes = group.nodes if isinstance(group, FusionGroup) else list(group)
        return self.cost_of(analyze_group(graph, nodes))

    def prices_epilogue(self, a: GroupAnalysis) -> bool:
        """Whether ``a`` has an epilogue priced at its ``EPILOGUE_STREAM_RATIO``: one whose anchor alone is
        compute-bound here (module docstring)."""
        p = self.profile
        return (a.epilogue_stream_bytes > 0 and not p.instruction_costs
                and a.epilogue_anchor_flops / p.peak_for("float32") >= a.epilogue_anchor_bytes / p.mem_bandwidth)

    def cost_of(self, a: GroupAnalysis) -> GroupCost:
        p = self.profile
        t_compute = sum(f / p.peak_for(d) for d, f in a.executed_flops.items())
        main_dtype = max(a.executed_flops.items(), key=lambda kv: (kv[1], kv[0]))[0] \
            if a.executed_flops else "float32"
        # Scalar loops run one lane of the vector peak (``GroupAnalysis.scalar_flops``).
        t_compute += a.scalar_flops * (p.vector_bytes // 4 - 1) / p.peak_for(main_dtype)
        # An epilogue on a compute-bound anchor priced by its measured ratio to its stream (module docstring).
        if self.prices_epilogue(a):
            t_compute += max(0.0, a.epilogue_stream_bytes / p.mem_bandwidth - a.epilogue_flops / p.peak_for(main_dtype))
        # The same ops without an anchor, by the same measured ratio (module docstring).
        if a.arithmetic_stream_bytes > 0 and not p.instruction_costs:
            t_compute += max(0.0, a.arithmetic_stream_bytes / p.mem_bandwidth
                             - a.arithmetic_flops / p.peak_for(main_dtype))
        excess_regs = max(0, a.register_pressure - p.vector_registers)
        t_compute += REGISTER_SPILL_OPS_PER_ELEMENT * excess_regs * a.stream_elements / p.peak_for(main_dtype)

        ws = a.working_set_bytes
        spill = SPILL_TRAFFIC_FACTOR * ws if ws > p.onchip_bytes else 0.0
        t_memory = a.boundary_bytes / p.mem_bandwidth
        t_spill = spill / (p.mem_bandwidth * SPILL_BANDWIDTH_FRACTION)

        t_numa, remote = 0.0, 0
        if self.placement is not None and p.numa_nodes > 1:
            run_node = self.placement.group_node(a.nodes, [node_flops(n) for n in a.nodes])
            t_numa, remote = remote_time(p, [*a.inputs, *a.outputs], run_node, self.placement)

        overhead = 0.0 if a.zero_copy else p.launch_overhead_s  # an elided Concat or a view runs no kernel
        if p.instruction_costs:  # an in-order core: every load, store and FLOP is an instruction, nothing overlaps
            t_compute, t_memory, overhead = instruction_times(p, a)
            t_pred = t_compute + t_memory + t_spill + overhead + t_numa
        else:
            t_pred = max(t_compute, t_memory) + t_spill + overhead + t_numa
        bucket = a.max_category.name
        alpha = self.corrections.alpha(bucket)
        flops = a.flops
        intensity = flops / a.boundary_bytes if a.boundary_bytes > 0 else float("inf")
        ridge = p.ridge_point(main_dtype)
        return GroupCost(flops=flops, duplicated_flops=a.duplicated_flops, bytes=a.boundary_bytes,
                         spill_bytes=spill, working_set_bytes=ws, register_pressure=a.register_pressure,
                         remote_bytes=remote, t_compute=t_compute, t_memory=t_memory, t_spill=t_spill,
                         t_overhead=overhead, t_numa=t_numa, t_predicted=t_pred, alpha=alpha,
                         latency_s=t_pred * (1.0 + alpha), intensity=intensity, ridge_point=ridge,
                         bound=COMPUTE_BOUND if t_compute >= t_memory else MEMORY_BOUND, bucket=bucket)

    # Plans --------------------------------------------------------------------------------
    def unfused_bytes(self, graph: Graph) -> int:
        """``M_total``: main-memory traffic when every op is its own kernel."""
        cache: dict = {}  # one graph-output set for all nodes (linear, not quadratic)
        return sum(analyze_group(graph, [n], cache).boundary_bytes for n in graph.nodes)

    def plan_cost(self, plan: FusionPlan, costs: list[GroupCost] | None = None,
                  unfused_bytes: int | None = None) -> PlanCost:
        """The plan's totals; ``costs`` (per group, in plan order) and ``unfused_bytes``
        may be passed when the caller has them already."""
        graph = plan.graph
        if costs is None:
            costs = [self.group_cost(graph, g) for g in plan.groups]
        lat = {id(g): c.latency_s for g, c in zip(plan.groups, costs, strict=True)}
        finish: dict[int, float] = {}
        preds: dict[int, set[int]] = {id(g): set() for g in plan.groups}
        for src, dst, _ in plan.group_edges():
            if src is not dst:
                preds[id(dst)].add(id(src))
        for g in plan.groups:  # plan order is topological (FusionPlan.verify)
            finish[id(g)] = lat[id(g)] + max((finish[p] for p in preds[id(g)]), default=0.0)
        boundary = sum(c.bytes for c in costs)
        total = self.unfused_bytes(graph) if unfused_bytes is None else unfused_bytes
        return PlanCost(target=self.profile.name, group_names=tuple(g.name for g in plan.groups),
                        group_ops=tuple(tuple(g.op_types) for g in plan.groups), groups=tuple(costs),
                        total_latency_s=sum(c.latency_s for c in costs),
                        critical_path_s=max(finish.values(), default=0.0),
                        peak_memory_bytes=peak_activation_bytes(graph, [g.nodes for g in plan.groups]),
                        kernels=len(plan.groups), boundary_bytes=boundary, unfused_bytes=total,
                        eta=bandwidth_saving_rate(boundary, total))


def correction_samples(cm: CostModel, plan: FusionPlan, measured_s: Mapping[str, float]) -> list[Sample]:
    """Samples for ``fit_corrections`` from one measured run: for every group whose name has
    a measured time, (its bucket, its uncorrected prediction, the measurement)."""
    out = []
    for g in plan.groups:
        if g.name in measured_s:
            c = cm.group_cost(plan.graph, g)
            out.append(Sample(c.bucket, c.t_predicted, float(measured_s[g.name])))
    return out


def format_plan_cost(pc: PlanCost, max_groups: int = 40) -> str:
    """A table: one line per group, then the plan totals."""
    lines = [f"{'group':<28} {'ops':<32} {'latency':>10} {'bytes':>11} {'I (F/B)':>9} {'bound':>7}"]
    for name, ops, g in list(zip(pc.group_names, pc.group_ops, pc.groups, strict=True))[:max_groups]:
        ops_text = "+".join(ops)
        ops_text = ops_text if len(ops_text) <= 32 else ops_text[:29] + "..."
        inten = "inf" if g.intensity == float("inf") else f"{g.intensity:.3g}"
        flag = " spill" if g.spills else ""
        lines.append(f"{name[:28]:<28} {ops_text:<32} {g.latency_s * 1e6:>8.2f}us {g.bytes:>11} "
                     f"{inten:>9} {g.bound:>7}{flag}")
    if len(pc.groups) > max_groups:
        lines.append(f"... {len(pc.groups) - max_groups} more groups")
    lines.append(f"target {pc.target}: {pc.kernels} kernels, predicted latency "
                 f"{pc.total_latency_s * 1e6:.2f} us (critical path {pc.critical_path_s * 1e6:.2f} us), "
                 f"peak activations {pc.peak_memory_bytes} B, bytes {pc.boundary_bytes} of "
                 f"{pc.unfused_bytes} unfused (eta = {pc.eta:.3f})")
    return "\n".join(lines)
