"""The planning problem: objective, constraints, and group costs shared by the planners.

A plan is judged by three numbers: predicted latency ``T`` (sum of group latencies: the
kernels run one after another), peak activation memory ``M`` and the number of kernels
``K``. The weighted objective is the seed's multi-objective form, each term normalised by
the unfused plan's value so the weights are dimensionless:

    J = w_T * T / T_0  +  w_M * M / M_0  +  w_K * K / K_0

The default ``Objective()`` is latency only. Constraints:

* ``latency_bound_s``: the seed's ``max over critical paths sum L(P) <= L_max``;
* ``memory_budget_bytes``: peak activation memory (``opfuse.cost.liveness``);
* ``onchip_budget_bytes``: per group, the working set must fit (a hard limit on top
  of the cost model's spill penalty).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.cost.liveness import live_bytes_by_position
from opfuse.cost.model import CostModel, GroupCost, PlanCost
from opfuse.cost.analysis import analyze_group
from opfuse.errors import InputError
from opfuse.ir.graph import Graph, Node
from opfuse.planner.structure import topological_groups

LATENCY_BOUND = "latency bound"
MEMORY_BUDGET = "memory budget"
ONCHIP_BUDGET = "on-chip budget"


@dataclass(frozen=True)
class Objective:
    latency: float = 1.0
    memory: float = 0.0
    kernels: float = 0.0

    def __post_init__(self):
        ws = (self.latency, self.memory, self.kernels)
        if any(w < 0 for w in ws) or not any(w > 0 for w in ws):
            raise InputError(f"objective weights must be >= 0 and not all zero, got {ws}")

    @classmethod
    def parse(cls, text: str) -> "Objective":
        """``"latency=1,memory=0.5,kernels=0"`` (missing terms are 0)."""
        weights = {"latency": 0.0, "memory": 0.0, "kernels": 0.0}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, _, val = part.partition("=")
            if key.strip() not in weights:
                raise InputError(f"unknown objective term '{key.strip()}' (use latency, memory, kernels)")
            try:
                weights[key.strip()] = float(val)
            except ValueError:
                raise InputError(f"objective weight for '{key.strip()}' is not a number: '{val}'") from None
        return cls(**weights)

    def score(self, m: "Metrics", ref: "Metrics") -> float:
        t0, m0, k0 = normalisers(ref)
        return self.latency * m.latency_s / t0 + self.memory * m.peak_memory_bytes / m0 + self.kernels * m.kernels / k0


def normalisers(ref: "Metrics") -> tuple[float, float, float]:
    """(T_0, M_0, K_0) of the unfused plan, never zero (an empty graph has none of them)."""
    return (ref.latency_s if ref.latency_s > 0 else 1.0, float(max(ref.peak_memory_bytes, 1)),
            float(max(ref.kernels, 1)))


@dataclass(frozen=True)
class Constraints:
    latency_bound_s: float | None = None
    memory_budget_bytes: int | None = None
    onchip_budget_bytes: int | None = None

    def __post_init__(self):
        for name in ("latency_bound_s", "memory_budget_bytes", "onchip_budget_bytes"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise InputError(f"{name.replace('_', ' ')} must be positive, got {v}")


@dataclass(frozen=True)
class Metrics:
    latency_s: float
    critical_path_s: float
    peak_memory_bytes: int
    kernels: int
    live_bytes: tuple[int, ...] = field(default=(), repr=False, compare=False)  # per node position


class Problem:
    """A graph, a cost model, legality, objective and constraints, with cached group costs.

    Groups are tuples of node indices (positions in ``graph.nodes``), sorted.
    """

    def __init__(self, graph: Graph, cost_model: CostModel, legality, objective: Objective | None = None,
                 constraints: Constraints | None = None):
        self.graph = graph
        self.nodes: list[Node] = list(graph.nodes)
        self.pos = {id(n): i for i, n in enumerate(self.nodes)}
        self.cost_model = cost_model
        self.legality = legality
        self.objective = objective or Objective()
        self.constraints = constraints or Constraints()
        self._costs: dict[tuple[int, ...], GroupCost] = {}
        self._node_info: dict = {}
        self._legal: dict[tuple[int, ...], str | None] = {}
        self.ref = self.metrics([(i,) for i in range(len(self.nodes))])
        self.norm = normalisers(self.ref)

    def derive(self, objective: Objective | None = None) -> "Problem":
        """The same problem with another objective, sharing the cached group costs."""
        other = object.__new__(Problem)
        other.__dict__.update(self.__dict__)
        other.objective = objective or self.objective
        return other

    def group_nodes(self, key: tuple[int, ...]) -> list[Node]:
        return [self.nodes[i] for i in key]

    def cost(self, key: tuple[int, ...]) -> GroupCost:
        c = self._costs.get(key)
        if c is None:
            c = self.cost_model.cost_of(analyze_group(self.graph, self.group_nodes(key), self._node_info))
            self._costs[key] = c
        return c

    def legal(self, key: tuple[int, ...]) -> str | None:
        """Legality plus the per-group on-chip budget (``None`` when allowed)."""
        if key not in self._legal:
            reason = self.legality.check_group(self.graph, self.group_nodes(key)) if len(key) > 1 else None
            budget = self.constraints.onchip_budget_bytes
            if reason is None and budget is not None and len(key) > 1:
                ws = self.cost(key).working_set_bytes
                if ws > budget:
                    reason = f"working set {ws} B exceeds the {ONCHIP_BUDGET} of {budget} B"
            self._legal[key] = reason
        return self._legal[key]

    def group_score(self, key: tuple[int, ...]) -> float:
        """The separable part of the objective contributed by one group."""
        o = self.objective
        return o.latency * self.cost(key).latency_s / self.norm[0] + o.kernels / self.norm[2]

    def metrics(self, groups: list[tuple[int, ...]]) -> Metrics:
        costs = [self.cost(k) for k in groups]
        node_groups = [self.group_nodes(k) for k in groups]
        order = topological_groups(self.graph, node_groups)
        owner = {i: g for g, k in enumerate(groups) for i in k}
        finish = [0.0] * len(groups)
        for g in order:
            start = 0.0
            for i in groups[g]:
                for v in self.nodes[i].input_values():
                    if v.producer is not None:
                        p = owner[self.pos[id(v.producer)]]
                        if p != g:
                            start = max(start, finish[p])
            finish[g] = start + costs[g].latency_s
        live = tuple(live_bytes_by_position(self.graph, node_groups)) if groups else ()
        return Metrics(latency_s=sum(c.latency_s for c in costs), critical_path_s=max(finish, default=0.0),
                       peak_memory_bytes=max(live, default=0), kernels=len(groups), live_bytes=live)

    def plan_cost(self, plan) -> PlanCost:
        """``CostModel.plan_cost`` from the cached group costs."""
        costs = [self.cost(tuple(sorted(self.pos[id(n)] for n in g.nodes))) for g in plan.groups]
        unfused = sum(self.cost((i,)).bytes for i in range(len(self.nodes)))
        return self.cost_model.plan_cost(plan, costs, unfused)

    def score(self, m: Metrics) -> float:
        return self.objective.score(m, self.ref)

    def soft_peak(self, m: Metrics) -> float:
        """A smooth stand-in for the peak, ``(sum_t live_t^p)^(1/p)``: the peak is a max, so a
        merge that lowers one of two equally high regions does not move it, and a merge
        that raises a lower region up to it costs nothing; the p-norm sees both. Greedy
        ranks memory gains with it; plans are still judged by the true peak."""
        m0 = self.norm[1]
        return m0 * sum((x / m0) ** SOFT_PEAK_P for x in m.live_bytes) ** (1.0 / SOFT_PEAK_P)

    def excess(self, m: Metrics) -> dict[str, float]:
        """How far each constraint is from holding, 0 when it holds: the relative excess of
        the critical path; for memory, the bytes above budget summed over positions (the
        area above the budget line, which shrinks whenever any high region is lowered)."""
        c = self.constraints
        out = {}
        if c.latency_bound_s is not None:
            out[LATENCY_BOUND] = max(0.0, m.critical_path_s / c.latency_bound_s - 1 - TOLERANCE)
        if c.memory_budget_bytes is not None:
            b = c.memory_budget_bytes
            out[MEMORY_BUDGET] = sum(max(0, x - b) for x in m.live_bytes) / (b * max(len(m.live_bytes), 1))
        return out

    def violations(self, m: Metrics) -> dict[str, float]:
        """Relative excess per violated constraint (empty when all hold)."""
        out = {}
        c = self.constraints
        if c.latency_bound_s is not None and m.critical_path_s > c.latency_bound_s * (1 + TOLERANCE):
            out[LATENCY_BOUND] = m.critical_path_s / c.latency_bound_s - 1
        if c.memory_budget_bytes is not None and m.peak_memory_bytes > c.memory_budget_bytes:
            out[MEMORY_BUDGET] = m.peak_memory_bytes / c.memory_budget_bytes - 1
        return out


TOLERANCE = 1e-9  # relative slack on the latency bound (floating-point sums)
SOFT_PEAK_P = 8  # the p of the p-norm standing in for the peak in greedy gains
