"""The planner's entry points: ``plan_fusion`` and ``plan_pareto``.

    from opfuse.planner import plan_fusion, Constraints, Objective
    result = plan_fusion(graph, get_profile("cortex-m7"), method="auto",
                         constraints=Constraints(latency_bound_s=5e-3))
    result.plan            # a verified FusionPlan
    result.cost            # PlanCost: per-group and total predicted latency, peak memory, eta
    result.to_json()       # for the report: predicted_latency_s, per-group latencies, ...

``method``: ``"greedy"``, ``"exact"`` (HiGHS; raises when the graph has too many
candidate groups) or ``"auto"`` (exact up to ``EXACT_AUTO_MAX_NODES`` nodes when HiGHS is
installed and the candidates fit, within ``AUTO_EXACT_TIME_LIMIT_S``, else greedy). The
greedy planner is within a fraction of a percent of optimal for the latency objective on
the zoo, but can be 20-30% off when peak memory is weighted (the peak is a max: greedy
merges lock in early), so "auto" prefers exact whenever it fits.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from opfuse.cost.correction import load_corrections
from opfuse.cost.model import CostModel, PlanCost
from opfuse.cost.numa import NumaPlacement
from opfuse.errors import InfeasibleError, InputError
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.planner.candidates import CandidateLimitError, enumerate_candidates
from opfuse.planner.exact import EXACT_TIME_LIMIT_S, ExactTimeoutError, SolverUnavailableError, solve_exact
from opfuse.planner.greedy import solve_greedy
from opfuse.planner.legality import Legality
from opfuse.planner.pareto import ParetoPoint, pareto_front
from opfuse.planner.problem import Constraints, Objective, Problem
from opfuse.planner.structure import plan_from_groups
from opfuse.targets.profile import HardwareProfile

METHODS = ("auto", "greedy", "exact")
EXACT_AUTO_MAX_NODES = 150  # "auto" tries the exact planner up to this many nodes
AUTO_EXACT_TIME_LIMIT_S = 20.0  # ... for at most this long, then keeps the better of it and greedy


@dataclass
class PlanResult:
    plan: FusionPlan
    cost: PlanCost
    method: str
    objective: Objective
    constraints: Constraints
    objective_value: float  # J of the chosen plan (the unfused plan scores sum of weights)
    optimal: bool  # proven optimal by the exact planner
    solve_time_s: float
    stats: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        c = self.constraints
        return {"planner": {"method": self.method, "optimal": self.optimal,
                            "solve_time_s": self.solve_time_s, "objective_value": self.objective_value,
                            "objective": {"latency": self.objective.latency, "memory": self.objective.memory,
                                          "kernels": self.objective.kernels},
                            "constraints": {"latency_bound_s": c.latency_bound_s,
                                            "memory_budget_bytes": c.memory_budget_bytes,
                                            "onchip_budget_bytes": c.onchip_budget_bytes},
                            **self.stats},
                **self.cost.to_dict()}


def _cost_model(target, placement: NumaPlacement | None) -> CostModel:
    if isinstance(target, CostModel):
        return target
    if isinstance(target, HardwareProfile):
        return CostModel(target, load_corrections(target.name), placement)
    raise InputError(f"expected a HardwareProfile or CostModel, got {type(target).__name__}")


def make_problem(graph: Graph, target, *, legality: Legality, objective: Objective | None = None,
                 constraints: Constraints | None = None, placement: NumaPlacement | None = None) -> Problem:
    return Problem(graph, _cost_model(target, placement), legality, objective,
                   constraints)


def _solve(problem: Problem, method: str, time_limit: float, candidates=None):
    """(groups, method used, optimal, stats)."""
    if method not in METHODS:
        raise InputError(f"unknown planner method '{method}'; use one of {', '.join(METHODS)}")
    if method in ("auto", "exact"):
        limit = time_limit if method == "exact" else min(time_limit, AUTO_EXACT_TIME_LIMIT_S)
        try:
            if method == "auto" and len(problem.nodes) > EXACT_AUTO_MAX_NODES:
                raise CandidateLimitError("too many nodes for automatic exact planning")
            cands = candidates if candidates is not None else enumerate_candidates(problem)
            r = solve_exact(problem, candidates=cands, time_limit=limit)
            stats = {"candidates": r.candidates, "cut_rounds": r.cut_rounds}
            if r.optimal or method == "exact":
                return r.groups, "exact", r.optimal, stats
            try:  # the time limit stopped the proof: keep the better of exact's best and greedy
                g = solve_greedy(problem)
            except InfeasibleError:
                return r.groups, "exact", False, stats
            if problem.score(problem.metrics(g.groups)) < problem.score(problem.metrics(r.groups)):
                return g.groups, "greedy", False, {"merges": g.merges, "repair_merges": g.repair_merges}
            return r.groups, "exact", False, stats
        except (CandidateLimitError, ExactTimeoutError, SolverUnavailableError) as e:
            if method == "exact":
                if isinstance(e, SolverUnavailableError):
                    raise
                raise InputError(f"exact planning is too large for this graph ({e}); "
                                 f"use the greedy planner") from None
    r = solve_greedy(problem)
    return r.groups, "greedy", False, {"merges": r.merges, "repair_merges": r.repair_merges}


def plan_fusion(graph: Graph, target, *, legality: Legality, method: str = "auto",
                objective: Objective | None = None, constraints: Constraints | None = None,
                placement: NumaPlacement | None = None, time_limit: float = EXACT_TIME_LIMIT_S) -> PlanResult:
    """Choose the partition of ``graph`` minimising the objective under the constraints.

    ``target`` is a ``HardwareProfile`` (its saved correction factors are applied) or a
    ready ``CostModel``. Raises ``InfeasibleError`` (message contains "infeasible" and
    the binding constraint) when no legal plan meets the constraints.
    """
    t0 = time.perf_counter()
    problem = make_problem(graph, target, legality=legality, objective=objective, constraints=constraints,
                           placement=placement)
    groups, used, optimal, stats = _solve(problem, method, time_limit)
    plan = plan_from_groups(graph, [problem.group_nodes(k) for k in groups], problem.legality)
    cost = problem.plan_cost(plan)
    return PlanResult(plan=plan, cost=cost, method=used, objective=problem.objective,
                      constraints=problem.constraints, objective_value=problem.score(problem.metrics(groups)),
                      optimal=optimal, solve_time_s=time.perf_counter() - t0, stats=stats)


def plan_pareto(graph: Graph, target, *, legality: Legality, method: str = "auto",
                constraints: Constraints | None = None, placement: NumaPlacement | None = None,
                time_limit: float = EXACT_TIME_LIMIT_S) -> list[tuple[ParetoPoint, FusionPlan]]:
    """The Pareto front (see ``opfuse.planner.pareto``), each point with its plan."""
    problem = make_problem(graph, target, legality=legality, constraints=constraints, placement=placement)
    cands = None
    if method in ("auto", "exact"):
        try:
            if method == "auto" and len(problem.nodes) > EXACT_AUTO_MAX_NODES:
                raise CandidateLimitError("too many nodes")
            cands = enumerate_candidates(problem)
        except CandidateLimitError:
            if method == "exact":
                raise InputError("exact planning is too large for this graph; use the greedy planner") from None
            method = "greedy"

    def solve(sub: Problem):
        groups, used, _, _ = _solve(sub, method, time_limit, cands)
        return groups, used

    points = pareto_front(problem, solve)
    return [(p, plan_from_groups(graph, [problem.group_nodes(k) for k in p.groups], problem.legality)) for p in points]
