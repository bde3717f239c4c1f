"""Planner benchmark: greedy vs exact on the zoo models, and greedy on 1k/10k-node graphs.

For every zoo model (as imported, ``opfuse.zoo.load``) and every target it plans with the
greedy planner and, where the candidate groups fit, the exact one (HiGHS), and prints the
predicted latency of each plan, the optimality gap ``(greedy - exact) / exact`` (goal: under
5%), the kernel counts and the planning times; on the first target it also compares the
two on the weighted objective latency + peak memory. Then it times the greedy planner on
synthetic CNN-like graphs of 1k and 10k nodes (goal: 10k under 10 s). Legality for the zoo
models is the rules engine's (``opfuse.rules.legality.RuleLegality``) when it is
installed, else the planner's category rules; the synthetic graphs use the category rules
by default so that the planner itself is timed (``--synthetic-legality rules`` times the
pair). Results go to ``benchmarks/results/planner.json``.

Rule legality section (``--rule-legality-sizes``, on by default; ``--no-rule-legality`` skips
it): the greedy planner through ``plan_fusion`` with the rules engine's ``RuleLegality`` on the
same synthetic graphs, the configuration issue 5 requires under 10 s at 10k nodes; it also
counts the legality queries and times them (``rule_legality`` in the JSON).

    python benchmarks/bench_planner.py
    python benchmarks/bench_planner.py --targets cortex-m7 --sizes 1000 --models resnet8
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from opfuse.planner import Objective, make_problem, solve_exact, solve_greedy
from opfuse.planner.candidates import CandidateLimitError, enumerate_candidates
from opfuse.planner.exact import ExactTimeoutError
from opfuse.planner.synthetic import synthetic_graph
from opfuse.targets import get_profile

DEFAULT_TARGETS = ("cortex-m7", "host", "h200")
DEFAULT_SIZES = (1_000, 10_000)
GAP_GOAL = 0.05
TEN_K_BUDGET_S = 10.0
EXACT_TIME_LIMIT_S = 60.0
WEIGHTED = (1.0, 1.0, 0.0)  # (latency, memory, kernels): the weighted-objective comparison
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "planner.json")


def legality(which: str = "rules", graph=None):
    """The fusion rules' legality (the product has no other), offered the rules' candidate
    groups of ``graph`` when given (``which`` is kept for the command line's old choices)."""
    from opfuse.rules import RuleLegality, form_groups, fusion_rules
    candidates = form_groups(graph, fusion_rules())[0] if graph is not None else None
    return RuleLegality(candidates=candidates), "rules (opfuse.rules RuleLegality)"


def zoo_models(names):
    try:
        from opfuse import zoo
    except ImportError:
        return []
    return [(n, zoo.load(n)) for n in (names or zoo.list_models())]


def bench_model(name, graph, target, legal):
    t0 = time.perf_counter()
    problem = make_problem(graph, get_profile(target), legality=legal)
    setup = time.perf_counter() - t0
    greedy = solve_greedy(problem)
    g_metrics = problem.metrics(greedy.groups)
    row = {"model": name, "target": target, "nodes": len(graph.nodes),
           "unfused_latency_s": problem.ref.latency_s, "unfused_kernels": problem.ref.kernels,
           "greedy_latency_s": g_metrics.latency_s, "greedy_kernels": g_metrics.kernels,
           "greedy_time_s": greedy.solve_time_s + setup,
           "exact_latency_s": None, "exact_kernels": None, "exact_time_s": None, "exact_optimal": None,
           "candidates": None, "gap": None, "exact_note": ""}
    try:
        t0 = time.perf_counter()
        cands = enumerate_candidates(problem)
        exact = solve_exact(problem, candidates=cands, time_limit=EXACT_TIME_LIMIT_S)
        e_metrics = problem.metrics(exact.groups)
        row.update(exact_latency_s=e_metrics.latency_s, exact_kernels=e_metrics.kernels,
                   exact_time_s=time.perf_counter() - t0 + setup, exact_optimal=exact.optimal,
                   candidates=len(cands),
                   gap=(g_metrics.latency_s - e_metrics.latency_s) / e_metrics.latency_s)
    except (CandidateLimitError, ExactTimeoutError) as e:
        row["exact_note"] = f"n/a: {e}"
    return row


def bench_weighted(name, graph, target, legal, weights=WEIGHTED):
    """Greedy vs exact on the weighted objective J (latency + peak memory): the gap in J."""
    problem = make_problem(graph, get_profile(target), legality=legal, objective=Objective(*weights))
    greedy = solve_greedy(problem)
    row = {"model": name, "target": target, "weights": list(weights),
           "greedy_J": problem.score(problem.metrics(greedy.groups)), "exact_J": None, "gap_J": None,
           "greedy_peak": problem.metrics(greedy.groups).peak_memory_bytes, "exact_peak": None}
    try:
        exact = solve_exact(problem, time_limit=EXACT_TIME_LIMIT_S)
        m = problem.metrics(exact.groups)
        row.update(exact_J=problem.score(m), exact_peak=m.peak_memory_bytes,
                   gap_J=row["greedy_J"] / problem.score(m) - 1)
    except (CandidateLimitError, ExactTimeoutError):
        pass
    return row


def bench_synthetic(size, target, legal):
    t0 = time.perf_counter()
    graph = synthetic_graph(size, seed=1)
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    problem = make_problem(graph, get_profile(target), legality=legal)
    greedy = solve_greedy(problem)
    elapsed = time.perf_counter() - t0
    m = problem.metrics(greedy.groups)
    return {"nodes": len(graph.nodes), "target": target, "build_s": build, "plan_time_s": elapsed,
            "kernels": m.kernels, "unfused_kernels": problem.ref.kernels,
            "greedy_latency_s": m.latency_s, "unfused_latency_s": problem.ref.latency_s,
            "within_budget": size < 10_000 or elapsed < TEN_K_BUDGET_S}


# Rule legality timings ---------------------------------------------------------------------
class _TimedLegality:
    """Wraps a legality and accumulates the time and number of its planner-facing queries."""

    QUERIES = ("check_group", "describe", "proposed_groups")

    def __init__(self, inner):
        self.inner = inner
        self.calls = {q: 0 for q in self.QUERIES}
        self.seconds = {q: 0.0 for q in self.QUERIES}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.QUERIES:
            return attr

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.calls[name] += 1
                self.seconds[name] += time.perf_counter() - t0
        return timed


def bench_rule_legality(size, target):
    """Greedy ``plan_fusion`` on a synthetic graph with ``RuleLegality`` (issue 5's setting)."""
    from opfuse.rules.legality import RuleLegality
    from opfuse.planner import plan_fusion
    graph = synthetic_graph(size, seed=1)
    legal = _TimedLegality(RuleLegality())
    t0 = time.perf_counter()
    result = plan_fusion(graph, get_profile(target), method="greedy", legality=legal)
    elapsed = time.perf_counter() - t0
    return {"nodes": len(graph.nodes), "target": target, "plan_time_s": elapsed,
            "legality_time_s": sum(legal.seconds.values()), "queries": dict(legal.calls),
            "query_time_s": dict(legal.seconds), "kernels": result.plan.num_kernels,
            "within_budget": size < 10_000 or elapsed < TEN_K_BUDGET_S}


def print_rule_legality(rows):
    print(f"\nrule legality (greedy plan_fusion with opfuse.rules RuleLegality; goal: 10k nodes "
          f"under {TEN_K_BUDGET_S:.0f} s):")
    print(f"{'nodes':<9}{'target':<11}{'plan s':>9}{'legality s':>12}{'check_group':>13}{'us/query':>10}"
          f"{'proposed s':>12}{'kernels':>9}")
    for r in rows:
        n = r["queries"]["check_group"]
        per = 1e6 * r["query_time_s"]["check_group"] / n if n else 0.0
        print(f"{r['nodes']:<9}{r['target']:<11}{r['plan_time_s']:>9.2f}{r['legality_time_s']:>12.2f}"
              f"{n:>13}{per:>10.1f}{r['query_time_s']['proposed_groups']:>12.2f}{r['kernels']:>9}")


def fmt_us(s):
    return "-" if s is None else f"{s * 1e6:,.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=list(DEFAULT_TARGETS))
    ap.add_argument("--sizes", nargs="+", type=int, default=list(DEFAULT_SIZES))
    ap.add_argument("--models", nargs="*", default=None, help="zoo models (default: all)")
    ap.add_argument("--synthetic-legality", choices=("category", "rules"), default="category")
    ap.add_argument("--rule-legality-sizes", nargs="+", type=int, default=list(DEFAULT_SIZES),
                    help="synthetic sizes planned with RuleLegality (the rule legality section)")
    ap.add_argument("--no-rule-legality", action="store_true", help="skip the rule legality section")
    ap.add_argument("--out", default=RESULTS)
    args = ap.parse_args(argv)
    legal, legal_name = legality("rules")
    synth_legal, synth_legal_name = legality(args.synthetic_legality)
    print(f"legality: zoo models: {legal_name}; synthetic graphs: {synth_legal_name}")
    rows = []
    models = zoo_models(args.models)
    for target in args.targets:
        for name, graph in models:
            rows.append(bench_model(name, graph, target, legal))
    print(f"\n{'model':<22}{'target':<11}{'nodes':>6}{'unfused us':>14}{'greedy us':>14}{'exact us':>14}"
          f"{'gap':>8}{'kernels g/e':>13}{'greedy s':>10}{'exact s':>9}")
    for r in rows:
        gap = "-" if r["gap"] is None else f"{max(0.0, 100 * r['gap']):.2f}%"
        kern = f"{r['greedy_kernels']}/{r['exact_kernels'] if r['exact_kernels'] is not None else '-'}"
        ex_t = "-" if r["exact_time_s"] is None else f"{r['exact_time_s']:.2f}"
        print(f"{r['model']:<22}{r['target']:<11}{r['nodes']:>6}{fmt_us(r['unfused_latency_s']):>14}"
              f"{fmt_us(r['greedy_latency_s']):>14}{fmt_us(r['exact_latency_s']):>14}{gap:>8}{kern:>13}"
              f"{r['greedy_time_s']:>10.3f}{ex_t:>9}  {r['exact_note']}")
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    if gaps:
        print(f"\ngap: mean {100 * sum(gaps) / len(gaps):.2f}%, max {100 * max(gaps):.2f}% "
              f"(goal < {100 * GAP_GOAL:.0f}%) over {len(gaps)} model/target pairs")
    weighted = [bench_weighted(name, graph, args.targets[0], legal) for name, graph in models]
    if weighted:
        print(f"\nweighted objective J = T/T0 + M/M0 (latency + peak memory) on {args.targets[0]}:")
        print(f"{'model':<22}{'greedy J':>10}{'exact J':>10}{'gap':>8}{'greedy peak':>13}{'exact peak':>12}")
        for r in weighted:
            gap = "-" if r["gap_J"] is None else f"{max(0.0, 100 * r['gap_J']):.2f}%"
            ej = "-" if r["exact_J"] is None else f"{r['exact_J']:.4f}"
            print(f"{r['model']:<22}{r['greedy_J']:>10.4f}{ej:>10}{gap:>8}{r['greedy_peak']:>13}"
                  f"{r['exact_peak'] if r['exact_peak'] is not None else '-':>12}")
    synth = [bench_synthetic(size, args.targets[0], synth_legal) for size in args.sizes]
    print(f"\n{'synthetic nodes':<17}{'target':<11}{'plan s':>9}{'kernels':>10}{'unfused':>9}"
          f"{'greedy us':>14}{'unfused us':>14}")
    for r in synth:
        print(f"{r['nodes']:<17}{r['target']:<11}{r['plan_time_s']:>9.2f}{r['kernels']:>10}"
              f"{r['unfused_kernels']:>9}{fmt_us(r['greedy_latency_s']):>14}{fmt_us(r['unfused_latency_s']):>14}")
    rule_rows = [] if args.no_rule_legality else \
        [bench_rule_legality(size, args.targets[0]) for size in args.rule_legality_sizes]
    if rule_rows:
        print_rule_legality(rule_rows)
    ok = all(r["within_budget"] for r in synth + rule_rows) and all(g < GAP_GOAL for g in gaps)
    machine = {"platform": platform.platform(), "python": sys.version.split()[0], "cpus": os.cpu_count()}
    result = {"legality": legal_name, "synthetic_legality": synth_legal_name, "machine": machine,
              "models": rows, "weighted": weighted, "synthetic": synth, "rule_legality": rule_rows,
              "gap_goal": GAP_GOAL,
              "ten_k_budget_s": TEN_K_BUDGET_S, "goals_met": ok}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.out}; goals {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
