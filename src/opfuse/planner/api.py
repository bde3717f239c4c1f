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

Saved cost-model corrections (``opfuse.cost.correction``) are applied only when asked:
``corrections=True`` loads the ones saved for the profile's target (``opfuse compile`` does,
unless ``--no-corrections``), a ``Corrections`` object is used as given, and the default
``False`` plans with the plain roofline. ``PlanResult.to_json()["planner"]["cost_model"]``
records the profile and the corrections that were applied.

Whenever the exact planner ran, the result carries its best bound and the relative
optimality ``gap`` of the chosen plan; ``optimal`` is true only when the gap is within the
solver's tolerance (``opfuse.planner.exact.MIP_REL_GAP``).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from opfuse.cost.correction import Corrections, load_corrections
from opfuse.cost.model import CostModel, PlanCost
from opfuse.cost.numa import NumaPlacement
from opfuse.errors import InfeasibleError, InputError
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.planner.candidates import CandidateLimitError, enumerate_candidates
from opfuse.planner.exact import (EXACT_TIME_LIMIT_S, ExactTimeoutError, SolverUnavailableError, relative_gap,
                                   solve_exact)
from opfuse.planner.greedy import solve_greedy
from opfuse.planner.legality import Legality
from opfuse.planner.pareto import ParetoPoint, pareto_front
from opfuse.planner.problem import Constraints, Objective, Problem
from opfuse.planner.structure import plan_from_groups
from opfuse.targets.profile import HardwareProfile

METHODS = ("auto", "greedy", "exact")
EXACT_AUTO_MAX_NODES = 150  # "auto" tries the exact planner up to this many nodes
AUTO_EXACT_TIME_LIMIT_S = 20.0  # ... for at most this long, then keeps the better of it and greedy


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: a missing or infinite bound or gap is ``None``."""
    return x if x is not None and math.isfinite(x) else None


@dataclass
class PlanResult:
    plan: FusionPlan
    cost: PlanCost
    method: str
    objective: Objective
    constraints: Constraints
    objective_value: float  # J of the chosen plan (the unfused plan scores sum of weights)
    optimal: bool  # proven optimal by the exact planner: gap <= its tolerance
    solve_time_s: float
    stats: dict = field(default_factory=dict)
    bound: float | None = None  # the exact planner's best bound on J (None when it did not run)
    gap: float | None = None  # (J - bound) / |J| of the chosen plan
    stop_reason: str | None = None  # why the exact planner stopped ("optimal", "time limit", ...)
    cost_model: dict = field(default_factory=dict)  # the profile and the corrections applied

    def to_json(self) -> dict:
        c = self.constraints
        return {"planner": {"method": self.method, "optimal": self.optimal, "gap": _finite(self.gap),
                            "bound": _finite(self.bound), "stop_reason": self.stop_reason,
                            "solve_time_s": self.solve_time_s, "objective_value": self.objective_value,
                            "objective": {"latency": self.objective.latency, "memory": self.objective.memory,
                                          "kernels": self.objective.kernels},
                            "constraints": {"latency_bound_s": c.latency_bound_s,
                                            "memory_budget_bytes": c.memory_budget_bytes,
                                            "onchip_budget_bytes": c.onchip_budget_bytes},
                            "cost_model": self.cost_model, **self.stats},
                **self.cost.to_dict()}


def _cost_model(target, placement: NumaPlacement | None, corrections=False) -> CostModel:
    """``corrections``: ``False`` (none), ``True`` (the saved ones for the target, each bucket
    re-checked) or a ``Corrections`` object."""
    if isinstance(target, CostModel):
        if corrections is not False:
            raise InputError("a CostModel carries its own corrections; pass corrections with a HardwareProfile")
        return target
    if isinstance(target, HardwareProfile):
        if corrections is True:
            corr = load_corrections(target.name, profile=target)
        elif corrections is False or corrections is None:
            corr = Corrections(target.name)
        elif isinstance(corrections, Corrections):
            corr = corrections
        else:
            raise InputError(f"corrections must be True, False or a Corrections object, got {corrections!r}")
        return CostModel(target, corr, placement)
    raise InputError(f"expected a HardwareProfile or CostModel, got {type(target).__name__}")


def cost_model_record(cm: CostModel, requested: bool, cost: PlanCost | None = None) -> dict:
    """What the report says about the cost model: the profile, whether corrections were
    requested, which were loaded (``Corrections.summary``) and, with the plan's ``cost``,
    how many of its groups each non-zero factor changed (``corrected_groups``)."""
    from opfuse.targets import describe_profile
    p = cm.profile
    used: dict[str, dict] = {}
    for g in cost.groups if cost is not None else ():
        if g.alpha != 0.0:
            used.setdefault(g.bucket, {"alpha": g.alpha, "groups": 0})["groups"] += 1
    return {"profile": {"name": p.name, "calibrated": p.calibrated, "source": p.source,
                        "description": describe_profile(p)},
            "corrections": {"requested": requested, "active": cm.corrections.active, **cm.corrections.summary(),
                            "corrected_groups": dict(sorted(used.items()))}}


def make_problem(graph: Graph, target, *, legality: Legality, objective: Objective | None = None,
                 constraints: Constraints | None = None, placement: NumaPlacement | None = None,
                 corrections=False) -> Problem:
    return Problem(graph, _cost_model(target, placement, corrections), legality, objective,
                   constraints)


@dataclass
class _Solved:
    groups: list
    method: str
    optimal: bool
    stats: dict
    bound: float | None = None  # the exact planner's best bound on J, when it ran
    gap: float | None = None
    stop_reason: str | None = None


def _solve(problem: Problem, method: str, time_limit: float, candidates=None) -> _Solved:
    """The chosen groups, the method used, and the exact planner's bound and gap when it ran."""
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
            exact = _Solved(r.groups, "exact", r.optimal, stats, r.best_bound, r.gap, r.stop_reason)
            if r.optimal or method == "exact":
                return exact
            try:  # the time limit stopped the proof: keep the better of exact's best and greedy
                g = solve_greedy(problem)
            except InfeasibleError:
                return exact
            g_score = problem.score(problem.metrics(g.groups))
            if g_score < problem.score(problem.metrics(r.groups)):
                return _Solved(g.groups, "greedy", False, {"merges": g.merges, "repair_merges": g.repair_merges},
                               r.best_bound, relative_gap(g_score, r.best_bound), r.stop_reason)
            return exact
        except (CandidateLimitError, ExactTimeoutError, SolverUnavailableError) as e:
            if method == "exact":
                if isinstance(e, SolverUnavailableError):
                    raise
                raise InputError(f"exact planning is too large for this graph ({e}); "
                                 f"use the greedy planner") from None
    greedy = solve_greedy(problem)
    return _Solved(greedy.groups, "greedy", False, {"merges": greedy.merges, "repair_merges": greedy.repair_merges})


def plan_fusion(graph: Graph, target, *, legality: Legality, method: str = "auto",
                objective: Objective | None = None, constraints: Constraints | None = None,
                placement: NumaPlacement | None = None, time_limit: float = EXACT_TIME_LIMIT_S,
                corrections=False) -> PlanResult:
    """Choose the partition of ``graph`` minimising the objective under the constraints.

    ``target`` is a ``HardwareProfile`` or a ready ``CostModel``. ``corrections`` (with a
    profile only): ``True`` applies the correction factors saved for the target, a
    ``Corrections`` object applies those, ``False`` (the default) none. Raises
    ``InfeasibleError`` (message contains "infeasible" and the binding constraint) when no
    legal plan meets the constraints.
    """
    t0 = time.perf_counter()
    problem = make_problem(graph, target, legality=legality, objective=objective, constraints=constraints,
                           placement=placement, corrections=corrections)
    s = _solve(problem, method, time_limit)
    plan = plan_from_groups(graph, [problem.group_nodes(k) for k in s.groups], problem.legality)
    cost = problem.plan_cost(plan)
    requested = (corrections is not False and corrections is not None) or isinstance(target, CostModel)
    return PlanResult(plan=plan, cost=cost, method=s.method, objective=problem.objective,
                      constraints=problem.constraints, objective_value=problem.score(problem.metrics(s.groups)),
                      optimal=s.optimal, solve_time_s=time.perf_counter() - t0, stats=s.stats, bound=s.bound,
                      gap=s.gap, stop_reason=s.stop_reason,
                      cost_model=cost_model_record(problem.cost_model, requested, cost))


def plan_pareto(graph: Graph, target, *, legality: Legality, method: str = "auto",
                constraints: Constraints | None = None, placement: NumaPlacement | None = None,
                time_limit: float = EXACT_TIME_LIMIT_S, corrections=False) -> list[tuple[ParetoPoint, FusionPlan]]:
    """The Pareto front (see ``opfuse.planner.pareto``), each point with its plan
    (``corrections`` as for ``plan_fusion``)."""
    problem = make_problem(graph, target, legality=legality, constraints=constraints, placement=placement,
                           corrections=corrections)
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
        r = _solve(sub, method, time_limit, cands)
        return r.groups, r.method

    points = pareto_front(problem, solve)
    return [(p, plan_from_groups(graph, [problem.group_nodes(k) for k in p.groups], problem.legality)) for p in points]
