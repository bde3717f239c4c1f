"""The exact planner reports its best bound and the optimality gap; "optimal" only when the gap proves it."""
import pytest

from opfuse.cli import planner_label
from opfuse.planner import Objective, solve_exact, solve_greedy
from test_planner import make_problem, plan_fusion  # the planner tests' category legality (the planner has no default)
from opfuse.planner import api, exact
from opfuse.planner.exact import MIP_REL_GAP, ExactResult, relative_gap
from opfuse.planner.synthetic import synthetic_graph
from opfuse.targets import get_profile

HARD = Objective(latency=1.0, memory=1.0)  # peak memory weighted: the first solution found is not optimal


@pytest.fixture
def stop_at_first_solution(monkeypatch):
    """HiGHS stops at its first improving solution, before any proof: deterministic, unlike a time limit."""
    to_highs = exact._Model.to_highs

    def early(self, time_limit):
        h = to_highs(self, time_limit)
        h.setOptionValue("mip_max_improving_sols", 1)
        return h
    monkeypatch.setattr(exact._Model, "to_highs", early)


def test_relative_gap():
    assert relative_gap(2.0, 1.5) == pytest.approx(0.25)
    assert relative_gap(1.0, 1.0 + 1e-15) == 0.0  # a bound a hair above the objective is rounding
    assert relative_gap(1.0, float("-inf")) == float("inf")
    assert relative_gap(0.0, 0.0) == 0.0


def test_a_proven_plan_has_its_bound_and_a_gap_within_tolerance():
    problem = make_problem(synthetic_graph(40, seed=11), get_profile("cortex-m7"))
    r = solve_exact(problem)
    assert r.optimal and r.stop_reason == "optimal"
    assert r.best_bound == r.dual_bound and r.best_bound <= r.objective * (1 + 1e-9)
    assert r.gap == relative_gap(r.objective, r.best_bound) <= MIP_REL_GAP
    res = plan_fusion(synthetic_graph(40, seed=11), get_profile("cortex-m7"), method="exact")
    j = res.to_json()["planner"]
    assert j["optimal"] is True and j["gap"] <= MIP_REL_GAP and j["stop_reason"] == "optimal"
    assert j["bound"] == pytest.approx(res.objective_value, rel=1e-6)
    assert planner_label(j) == "exact (optimal, gap 0.00%)"


def test_greedy_alone_has_no_gap():
    res = plan_fusion(synthetic_graph(20, seed=1), get_profile("cortex-m7"), method="greedy")
    j = res.to_json()["planner"]
    assert j["gap"] is None and j["bound"] is None and not j["optimal"]
    assert planner_label(j) == "greedy"


def test_a_solve_stopped_before_the_proof_reports_its_gap_and_is_not_optimal(stop_at_first_solution):
    problem = make_problem(synthetic_graph(40, seed=11), get_profile("cortex-m7"), objective=HARD)
    r = solve_exact(problem)
    assert not r.optimal and r.stop_reason == "solution limit reached"
    assert r.best_bound < r.objective and r.gap == relative_gap(r.objective, r.best_bound) > MIP_REL_GAP
    res = plan_fusion(synthetic_graph(40, seed=11), get_profile("cortex-m7"), method="exact", objective=HARD)
    j = res.to_json()["planner"]
    assert j["optimal"] is False and j["gap"] == pytest.approx(r.gap) and j["bound"] == pytest.approx(r.best_bound)
    label = planner_label(j)
    assert label == f"exact (gap {100 * r.gap:.2f}%, solution limit reached)" and "optimal" not in label


def test_the_bound_is_below_every_plan_even_when_not_proven(stop_at_first_solution):
    from test_planner import brute_force
    for seed in (1, 2, 3):
        problem = make_problem(synthetic_graph(9, seed=seed), get_profile("cortex-m7"), objective=HARD)
        best, _ = brute_force(problem)
        r = solve_exact(problem)
        assert r.best_bound <= best * (1 + 1e-6) and best <= r.objective * (1 + 1e-6)


def test_solver_status_optimal_with_a_larger_gap_is_not_called_optimal(monkeypatch):
    solve = exact._Formulation.solve

    def loose(self, time_limit):  # as if the solver stopped on another criterion with 10% left
        status, chosen, obj, bound, rounds = solve(self, time_limit)
        return status, chosen, obj, obj * 0.9, rounds
    monkeypatch.setattr(exact._Formulation, "solve", loose)
    r = solve_exact(make_problem(synthetic_graph(20, seed=2), get_profile("cortex-m7")))
    assert r.stop_reason == "optimal" and not r.optimal and r.gap == pytest.approx(0.1)


def test_auto_keeps_greedy_over_an_unproven_exact_plan_and_reports_its_gap_to_the_bound(monkeypatch):
    g = synthetic_graph(30, seed=5)
    problem = make_problem(g, get_profile("cortex-m7"))
    unfused = [(i,) for i in range(len(problem.nodes))]  # worse than greedy's plan
    greedy_score = problem.score(problem.metrics(solve_greedy(problem).groups))
    bound = 0.9 * greedy_score

    def unproven(p, *, candidates=None, time_limit=None):
        return ExactResult(unfused, False, p.score(p.metrics(unfused)), bound, 0, 0, 0.0,
                           gap=relative_gap(p.score(p.metrics(unfused)), bound), stop_reason="time limit")
    monkeypatch.setattr(api, "solve_exact", unproven)
    res = plan_fusion(g, get_profile("cortex-m7"), method="auto")
    assert res.method == "greedy" and not res.optimal
    assert res.bound == bound and res.gap == pytest.approx(relative_gap(greedy_score, bound))
    label = planner_label(res.to_json()["planner"])
    assert label == f"greedy (gap {100 * res.gap:.2f}% to the exact planner's bound, time limit)"


def test_the_label_never_says_optimal_above_the_tolerance():
    assert planner_label({"method": "exact", "optimal": True, "gap": 0.0}) == "exact (optimal, gap 0.00%)"
    assert "optimal" not in planner_label({"method": "exact", "optimal": True, "gap": 0.031,
                                           "stop_reason": "time limit"})
    assert planner_label({"method": "exact", "optimal": False, "gap": 0.031,
                          "stop_reason": "time limit"}) == "exact (gap 3.10%, time limit)"
