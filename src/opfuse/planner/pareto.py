"""The Pareto front of plans over (predicted latency, peak activation memory, kernels).

``Pareto(F) = {f in F | no g in F dominates f}``, the seed's 7.4.2. The set ``F`` of plans
examined: the unfused plan, the plan optimising each weight vector of ``WEIGHT_GRID``
(exactly when the exact planner is used, else greedily), and sampled steps of the
greedy merge trajectory, which walks from the unfused plan to the fastest one. Plans
breaking a constraint are left out. This is the exact front's supported points plus
whatever the trajectory adds, not a proof that no other trade-off exists.
"""
from __future__ import annotations

from dataclasses import dataclass

from opfuse.errors import InfeasibleError
from opfuse.planner.problem import Objective, Problem

# (latency, memory, kernels) weights; a zero latency weight gets LATENCY_TIE_BREAK so that
# ties in memory or kernels are broken towards the faster plan (no dominated points).
WEIGHT_GRID = ((1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0), (1, 0, 1), (0, 1, 1), (1, 1, 1),
               (4, 1, 1), (1, 4, 1), (1, 1, 4))
LATENCY_TIE_BREAK = 1e-3
TRAJECTORY_POINTS = 24


@dataclass(frozen=True)
class ParetoPoint:
    latency_s: float
    critical_path_s: float
    peak_memory_bytes: int
    kernels: int
    groups: tuple[tuple[int, ...], ...]
    source: str  # which search found it first

    def objectives(self) -> tuple[float, int, int]:
        return (self.latency_s, self.peak_memory_bytes, self.kernels)

    def dominates(self, other: "ParetoPoint") -> bool:
        a, b = self.objectives(), other.objectives()
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b


def non_dominated(points: list[ParetoPoint]) -> list[ParetoPoint]:
    unique: dict[tuple, ParetoPoint] = {}
    for p in points:
        unique.setdefault(p.objectives(), p)
    pts = list(unique.values())
    front = [p for p in pts if not any(q.dominates(p) for q in pts)]
    return sorted(front, key=lambda p: p.objectives())


def pareto_front(problem: Problem, solve) -> list[ParetoPoint]:
    """``solve(problem) -> (groups, source)`` is the planner to run per weight vector."""
    from opfuse.planner.greedy import solve_greedy

    found: list[ParetoPoint] = []

    def add(groups, source):
        m = problem.metrics(list(groups))
        if problem.violations(m):
            return
        found.append(ParetoPoint(m.latency_s, m.critical_path_s, m.peak_memory_bytes, m.kernels,
                                 tuple(groups), source))

    add([(i,) for i in range(len(problem.nodes))], "unfused")
    for w in WEIGHT_GRID:
        lat = w[0] if w[0] > 0 else LATENCY_TIE_BREAK
        sub = problem.derive(Objective(latency=lat, memory=w[1], kernels=w[2]))
        try:
            groups, source = solve(sub)
        except InfeasibleError:
            continue
        add(groups, f"{source} w={w}")
    try:
        greedy = solve_greedy(problem.derive(Objective()), trajectory_points=TRAJECTORY_POINTS)
        for k, groups in enumerate(greedy.trajectory):
            add(groups, f"greedy trajectory step {k}")
    except InfeasibleError:
        pass
    return non_dominated(found)


def format_pareto(points: list[ParetoPoint]) -> str:
    lines = [f"{'#':>3} {'latency':>12} {'crit. path':>12} {'peak memory':>14} {'kernels':>8}  found by"]
    for k, p in enumerate(points):
        lines.append(f"{k:>3} {p.latency_s * 1e6:>10.2f}us {p.critical_path_s * 1e6:>10.2f}us "
                     f"{p.peak_memory_bytes:>14} {p.kernels:>8}  {p.source}")
    return "\n".join(lines)
