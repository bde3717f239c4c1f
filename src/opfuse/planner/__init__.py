"""The fusion planner: which legal fusions are worth it on a target.

Legality (the protocol in ``opfuse.planner.legality``, implemented by the fusion rules and
passed in by the caller) says which groups MAY exist; the cost model says
what each costs; the planners choose the partition:

* ``solve_greedy`` (``opfuse.planner.greedy``): merges in order of predicted gain;
* ``solve_exact`` (``opfuse.planner.exact``): an integer program over every legal
  candidate group (HiGHS), optimal, for graphs up to a few hundred candidate-rich nodes;
* ``pareto_front``: non-dominated plans over (latency, peak memory, kernels).

Entry points: ``plan_fusion(graph, profile, ...)`` and ``plan_pareto(graph, profile, ...)``.
"""
from opfuse.planner.api import METHODS, PlanResult, make_problem, plan_fusion, plan_pareto
from opfuse.planner.exact import SolverUnavailableError, solve_exact
from opfuse.planner.greedy import solve_greedy
from opfuse.planner.legality import Legality
from opfuse.planner.pareto import ParetoPoint, format_pareto
from opfuse.planner.problem import Constraints, Metrics, Objective, Problem

__all__ = ["METHODS", "PlanResult", "make_problem", "plan_fusion", "plan_pareto", "solve_exact",
           "solve_greedy", "SolverUnavailableError", "Legality", "ParetoPoint", "format_pareto",
           "Constraints", "Metrics", "Objective",
           "Problem"]
