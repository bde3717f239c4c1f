"""The exact planner: an integer program over all legal candidate groups (HiGHS).

Variables: ``x_S in {0, 1}`` for every legal convex candidate group ``S``
(``opfuse.planner.candidates``). Constraints and objective, all linear:

* set partition: every node is in exactly one chosen group, ``sum_{S ni i} x_S = 1``;
* objective: ``sum_S (w_T L_S / T_0 + w_K / K_0) x_S + w_M P`` (the seed's partition
  problem ``min sum C(P) + sum T(P_i, P_j)``: boundary traffic, and NUMA transfers, are
  already inside each group's cost ``L_S``);
* acyclic group graph: convex candidates are not enough (two horizontal groups can
  depend on each other), so after each solve a cycle among the chosen groups is cut,
  ``sum_{S in cycle} x_S <= |cycle| - 1``, and the model is solved again (lazy cuts);
* peak activation memory ``P`` (when weighted or budgeted), the liveness estimate of
  ``opfuse.cost.liveness`` verbatim: with ``lo_S``/``hi_S`` a group's first/last node
  position, tensor ``v`` produced by ``p`` is live at position ``t`` iff it is not
  internal to a group (``mat_v = 1 - sum_{S ⊇ {p} ∪ consumers(v)} x_S``), its producer's
  group has started (``sum_{S ni p, lo_S <= t} x_S``) and some consumer's group has not
  ended (``sum_{S ni c, hi_S >= t} x_S``): ``live_{v,t} >= mat_v + start + end_c - 2``
  for each consumer ``c``, and ``P >= sum_v |v| live_{v,t}`` for every ``t``;
* latency bound on critical paths, with finish-time potentials ``f_i`` per node:
  ``f_i >= L(group of i)``; ``f_i >= f_p + L(group of i) - M same(p, i)`` for each edge
  ``p -> i`` (``same`` = chosen groups holding both); nodes of one chosen group share
  one ``f`` (big-M equalities along the group's members); ``f_i <= L_max``. These
  potentials also forbid cycles.

When the model is infeasible, each constraint is checked on its own: the minimum
achievable critical path (or peak memory) is computed and the error names the binding
constraint and that minimum.

Optimality is a number, not a flag: HiGHS's best bound ``b`` on the objective (valid for
every acyclic plan: the cycle cuts only remove cyclic ones) gives the relative gap
``(J - b) / max(|J|, GAP_EPS)`` of the plan found. A plan is *optimal* only when that gap is
at most the solver's tolerance ``MIP_REL_GAP`` (HiGHS's absolute-gap stop is turned off,
so its "optimal" status means exactly that); a time limit leaves a plan with a larger gap.
"""
from __future__ import annotations

import itertools

import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from opfuse.cost.analysis import nbytes
from opfuse.errors import InfeasibleError, OpfuseError
from opfuse.planner.candidates import enumerate_candidates
from opfuse.planner.problem import LATENCY_BOUND, MEMORY_BUDGET, Problem
from opfuse.planner.structure import find_group_cycle

EXACT_TIME_LIMIT_S = 60.0
MIP_REL_GAP = 1e-7  # the optimality tolerance: relative gap between the plan found and the bound
MIP_ABS_GAP = 0.0  # no absolute-gap stop: "optimal" means relative gap <= MIP_REL_GAP
GAP_EPS = 1e-12  # the relative gap's denominator is max(|J|, GAP_EPS)
MAX_CUT_ROUNDS = 200
BOUND_SLACK = 0.01  # head-room on the computed upper bound of any critical path


class ExactTimeoutError(Exception):
    """The solver hit its time limit before finding any plan (not a user error)."""


class SolverUnavailableError(OpfuseError):
    """The exact planner needs the HiGHS solver (``pip install highspy``)."""


def relative_gap(objective: float, bound: float) -> float:
    """``(J - bound) / max(|J|, GAP_EPS)``, at least 0 (rounding can put the bound a hair
    above J); infinite without a finite bound."""
    if not (math.isfinite(objective) and math.isfinite(bound)):
        return math.inf
    return max(0.0, (objective - bound) / max(abs(objective), GAP_EPS))


@dataclass
class ExactResult:
    groups: list[tuple[int, ...]]
    optimal: bool  # proven: gap <= MIP_REL_GAP
    objective: float  # value of the normalised objective J
    best_bound: float  # HiGHS's dual bound: no legal plan scores below it
    candidates: int
    cut_rounds: int
    solve_time_s: float
    gap: float = 0.0  # relative_gap(objective, best_bound)
    stop_reason: str = "optimal"  # "optimal", "time limit", or the solver's status when it stopped early

    @property
    def dual_bound(self) -> float:
        return self.best_bound


def _highspy():
    try:
        import highspy
    except ImportError:
        raise SolverUnavailableError("the exact planner needs HiGHS: pip install highspy "
                                     "(or use the greedy planner)") from None
    return highspy


_banner_shown = False


def _new_highs():
    """A silent ``Highs`` instance. The first one prints a banner from C++ straight to
    file descriptor 1, before any option can turn it off, so that one is built with
    stdout pointed at /dev/null (our own output must stay clean JSON/text)."""
    global _banner_shown
    hs = _highspy()
    if _banner_shown:
        h = hs.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                h = hs.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _banner_shown = True
    h.setOptionValue("output_flag", False)
    return h


class _Model:
    """A sparse MILP, built row by row, solved with HiGHS, with rows added lazily."""

    def __init__(self):
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.rows: list[tuple[float, float, dict[int, float]]] = []

    def var(self, lb: float, ub: float, cost: float = 0.0, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lb) - 1

    def row(self, lo: float, hi: float, coeffs: dict[int, float]) -> None:
        coeffs = {k: v for k, v in coeffs.items() if v != 0.0}
        if coeffs:
            self.rows.append((lo, hi, coeffs))

    def to_highs(self, time_limit: float):
        hs = _highspy()
        inf = hs.kHighsInf
        lp = hs.HighsLp()
        lp.num_col_ = len(self.lb)
        lp.num_row_ = len(self.rows)
        lp.col_cost_ = np.array(self.cost, dtype=float)
        lp.col_lower_ = np.array(self.lb, dtype=float)
        lp.col_upper_ = np.array([inf if u == float("inf") else u for u in self.ub], dtype=float)
        lp.row_lower_ = np.array([-inf if lo == -float("inf") else lo for lo, _, _ in self.rows], dtype=float)
        lp.row_upper_ = np.array([inf if hi == float("inf") else hi for _, hi, _ in self.rows], dtype=float)
        starts, index, value = [0], [], []
        for _, _, coeffs in self.rows:
            for k in sorted(coeffs):
                index.append(k)
                value.append(coeffs[k])
            starts.append(len(index))
        lp.a_matrix_.format_ = hs.MatrixFormat.kRowwise
        lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
        lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
        lp.a_matrix_.value_ = np.array(value, dtype=float)
        lp.integrality_ = [hs.HighsVarType.kInteger if i else hs.HighsVarType.kContinuous
                           for i in self.integer]
        h = _new_highs()
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", MIP_REL_GAP)
        h.setOptionValue("mip_abs_gap", MIP_ABS_GAP)
        h.setOptionValue("random_seed", 0)
        h.setOptionValue("threads", 1)
        h.passModel(lp)
        return h


def _add_row(h, lo: float, hi: float, coeffs: dict[int, float]) -> None:
    hs = _highspy()
    idx = np.array(sorted(coeffs), dtype=np.int32)
    val = np.array([coeffs[k] for k in sorted(coeffs)], dtype=float)
    h.addRow(-hs.kHighsInf if lo == -float("inf") else lo, hs.kHighsInf if hi == float("inf") else hi,
             len(idx), idx, val)


class _Formulation:
    """Builds the MILP for one set of candidates, weights and bounds."""

    def __init__(self, problem: Problem, cands: list[tuple[int, ...]], *, w_latency: float, w_memory: float,
                 w_kernels: float, latency_bound: float | None, memory_budget: int | None,
                 minimize: str | None = None):
        self.p = problem
        self.cands = cands
        n = len(problem.nodes)
        m = _Model()
        self.model = m
        T0, M0, K0 = problem.norm
        self.lat = [problem.cost(k).latency_s / T0 for k in cands]
        obj_x = [0.0 if minimize else w_latency * L + w_kernels / K0 for L in self.lat]
        self.x = [m.var(0.0, 1.0, c, integer=True) for c in obj_x]
        self.contains: list[list[int]] = [[] for _ in range(n)]
        for j, key in enumerate(cands):
            for i in key:
                self.contains[i].append(j)
        for i in range(n):
            m.row(1.0, 1.0, {self.x[j]: 1.0 for j in self.contains[i]})
        self.peak: int | None = None  # the peak-memory variable, when memory is modelled
        if w_memory > 0 or memory_budget is not None or minimize == "memory":
            ub = memory_budget / M0 if memory_budget is not None else float("inf")
            cost = 1.0 if minimize == "memory" else (0.0 if minimize else w_memory)
            self.peak = m.var(0.0, ub, cost)
            self._memory(M0)
        self.makespan: int | None = None  # the makespan variable, when latency is modelled
        if latency_bound is not None or minimize == "latency":
            if latency_bound is not None:
                lmax = latency_bound / T0
            else:  # any plan's critical path is at most the sum of its nodes' worst groups
                lmax = sum(max(self.lat[j] for j in self.contains[i]) for i in range(n)) * (1 + BOUND_SLACK)
            self._latency(lmax, minimize == "latency")

    # Memory -----------------------------------------------------------------------------
    def _memory(self, M0: float) -> None:
        p, m, cands = self.p, self.model, self.cands
        n = len(p.nodes)
        lo = [min(k) for k in cands]
        hi = [max(k) for k in cands]
        graph_outs = {id(v) for v in p.graph.outputs}
        graph_ins = {id(v) for v in p.graph.inputs}
        per_t: list[dict[int, float]] = [dict() for _ in range(n)]
        keysets = [set(k) for k in cands]
        for v in p.graph.values.values():
            if v.is_const or v.type is None or nbytes(v) == 0:
                continue
            if v.producer is None and id(v) not in graph_ins:
                continue
            readers = sorted({p.pos[id(u)] for u, _ in v.uses})
            is_out = id(v) in graph_outs
            prod: int | None
            ends: list[int | None]
            if v.producer is None:
                prod = None
                t_min = 0
                internal: dict[int, float] = {}
            else:
                prod = p.pos[id(v.producer)]
                t_min = min(lo[j] for j in self.contains[prod])
                internal = {}
                if readers and not is_out:
                    need = {prod, *readers}
                    internal = {self.x[j]: 1.0 for j in self.contains[prod] if need <= keysets[j]}
            if is_out:
                ends = [None]  # live to the end
                t_max = n - 1
            elif prod is None and not readers:
                ends = [None]  # an unread graph input: live at position 0 only
                t_max = 0
            elif readers:
                ends = list(readers)
                t_max = max(hi[j] for c in readers for j in self.contains[c])
            else:
                assert prod is not None  # an unread graph input was handled above
                ends = [prod]
                t_max = max(hi[j] for j in self.contains[prod])
            scale = nbytes(v) / M0
            for t in range(t_min, t_max + 1):
                live = m.var(0.0, 1.0)
                per_t[t][live] = scale
                # live >= (1 - internal) + start(t) + end(t) - 2
                start: dict[int, float] = {}
                start_const = 1.0
                if prod is not None and t < prod:
                    start_const = 0.0
                    start = {self.x[j]: 1.0 for j in self.contains[prod] if lo[j] <= t}
                for c in ends:
                    end: dict[int, float] = {}
                    end_const = 1.0
                    if c is not None and t > c:
                        end_const = 0.0
                        end = {self.x[j]: 1.0 for j in self.contains[c] if hi[j] >= t}
                    if start_const + end_const + (1 if start else 0) + (1 if end else 0) < 2:
                        continue  # start or end is identically 0 here
                    coeffs: dict[int, float] = {live: 1.0}
                    for k, val in internal.items():
                        coeffs[k] = coeffs.get(k, 0.0) + val
                    for k in start:
                        coeffs[k] = coeffs.get(k, 0.0) - 1.0
                    for k in end:
                        coeffs[k] = coeffs.get(k, 0.0) - 1.0
                    m.row(start_const + end_const - 1.0, float("inf"), coeffs)
        for t in range(n):
            if per_t[t]:
                assert self.peak is not None  # _memory runs only when the peak is modelled
                coeffs = dict(per_t[t])
                coeffs[self.peak] = -1.0
                m.row(-float("inf"), 0.0, coeffs)

    # Latency ----------------------------------------------------------------------------
    def _latency(self, lmax: float, minimize: bool) -> None:
        p, m, cands = self.p, self.model, self.cands
        n = len(p.nodes)
        f = [m.var(0.0, lmax) for _ in range(n)]
        # f_i - f_p - L_i >= -2 lmax always holds (0 <= f, L <= lmax), so 2 lmax switches
        # the edge constraint off when p and i share a group.
        big = 2.0 * lmax
        for i in range(n):
            own = {self.x[j]: -self.lat[j] for j in self.contains[i]}
            m.row(0.0, float("inf"), {f[i]: 1.0, **own})
            preds = sorted({p.pos[id(v.producer)] for v in p.nodes[i].input_values()
                            if v.producer is not None} - {i})
            for q in preds:
                coeffs = {f[i]: 1.0, f[q]: -1.0, **own}
                for j in self.contains[i]:
                    if q in cands[j]:
                        coeffs[self.x[j]] = coeffs.get(self.x[j], 0.0) + big
                m.row(0.0, float("inf"), coeffs)
        for j, key in enumerate(cands):
            for a, b in itertools.pairwise(key):
                m.row(-float("inf"), lmax, {f[a]: 1.0, f[b]: -1.0, self.x[j]: lmax})
                m.row(-lmax, float("inf"), {f[a]: 1.0, f[b]: -1.0, self.x[j]: -lmax})
        if minimize:
            makespan = self.makespan = m.var(0.0, lmax, 1.0)
            for i in range(n):
                m.row(0.0, float("inf"), {makespan: 1.0, f[i]: -1.0})

    # Solving ----------------------------------------------------------------------------
    def solve(self, time_limit: float) -> tuple[str, list[tuple[int, ...]], float, float, int]:
        """(status, chosen groups, objective, dual bound, cut rounds); status is
        'optimal', 'time limit' or another early stop of the solver (a plan, not proven),
        'timeout' (no plan) or 'infeasible'."""
        hs = _highspy()
        h = self.model.to_highs(time_limit)
        rounds = 0
        while True:
            h.run()
            status = h.getModelStatus()
            info = h.getInfo()
            if status == hs.HighsModelStatus.kInfeasible:
                return "infeasible", [], float("inf"), float("inf"), rounds
            if info.primal_solution_status != hs.SolutionStatus.kSolutionStatusFeasible:
                if status == hs.HighsModelStatus.kTimeLimit:
                    return "timeout", [], float("inf"), float("inf"), rounds
                return "infeasible", [], float("inf"), float("inf"), rounds
            values = h.getSolution().col_value
            chosen = [self.cands[j] for j, x in enumerate(self.x) if values[x] > 0.5]
            cycle = find_group_cycle(self.p.graph, [self.p.group_nodes(k) for k in chosen])
            if cycle is None:
                if status == hs.HighsModelStatus.kOptimal:
                    how = "optimal"
                elif status == hs.HighsModelStatus.kTimeLimit:
                    how = "time limit"
                else:
                    how = h.modelStatusToString(status).lower()
                return how, chosen, info.objective_function_value, info.mip_dual_bound, rounds
            rounds += 1
            if rounds > MAX_CUT_ROUNDS:
                return "timeout", [], float("inf"), float("inf"), rounds
            index = {k: j for j, k in enumerate(self.cands)}
            _add_row(h, -float("inf"), len(cycle) - 1.0, {self.x[index[chosen[c]]]: 1.0 for c in cycle})


def solve_exact(problem: Problem, *, candidates: list[tuple[int, ...]] | None = None,
                time_limit: float = EXACT_TIME_LIMIT_S) -> ExactResult:
    """The optimal legal partition under ``problem``'s objective and constraints.

    Raises ``InfeasibleError`` naming the binding constraint, ``CandidateLimitError``
    when the graph has too many candidate groups, ``SolverUnavailableError`` without HiGHS.
    """
    t0 = time.perf_counter()
    if not problem.nodes:
        return ExactResult([], True, 0.0, 0.0, 0, 0, 0.0, gap=0.0, stop_reason="optimal")
    cands = candidates if candidates is not None else enumerate_candidates(problem)
    o, c = problem.objective, problem.constraints
    form = _Formulation(problem, cands, w_latency=o.latency, w_memory=o.memory, w_kernels=o.kernels,
                        latency_bound=c.latency_bound_s, memory_budget=c.memory_budget_bytes)
    status, chosen, obj, bound, rounds = form.solve(time_limit)
    if status == "infeasible":
        raise InfeasibleError(_diagnose(problem, cands, time_limit))
    if status == "timeout":
        raise ExactTimeoutError(f"the exact planner found no plan within {time_limit:g} s")
    gap = relative_gap(obj, bound)
    return ExactResult(groups=chosen, optimal=status == "optimal" and gap <= MIP_REL_GAP, objective=obj,
                       best_bound=bound, gap=gap, stop_reason=status,
                       candidates=len(cands), cut_rounds=rounds, solve_time_s=time.perf_counter() - t0)


def minimum_of(problem: Problem, which: str, cands: list[tuple[int, ...]], time_limit: float) -> float | None:
    """The smallest critical path (``which='latency'``, seconds) or peak memory
    (``'memory'``, bytes) any legal plan reaches, ignoring the other constraints."""
    form = _Formulation(problem, cands, w_latency=0.0, w_memory=0.0, w_kernels=0.0, latency_bound=None,
                        memory_budget=None, minimize=which)
    status, chosen, obj, _, _ = form.solve(time_limit)
    if status in ("infeasible", "timeout"):
        return None
    m = problem.metrics(chosen)
    return m.critical_path_s if which == "latency" else m.peak_memory_bytes


def _diagnose(problem: Problem, cands, time_limit: float) -> str:
    c = problem.constraints
    parts = []
    if c.latency_bound_s is not None:
        best = minimum_of(problem, "latency", cands, time_limit)
        if best is not None and best > c.latency_bound_s * (1 + 1e-9):
            parts.append(f"{LATENCY_BOUND} {c.latency_bound_s:.4g} s is below the smallest achievable "
                         f"critical path {best:.4g} s")
    if c.memory_budget_bytes is not None:
        best = minimum_of(problem, "memory", cands, time_limit)
        if best is not None and best > c.memory_budget_bytes:
            parts.append(f"{MEMORY_BUDGET} {c.memory_budget_bytes} B is below the smallest achievable "
                         f"peak activation memory {int(best)} B")
    if parts:
        names = [LATENCY_BOUND if p.startswith(LATENCY_BOUND) else MEMORY_BUDGET for p in parts]
        return f"infeasible: {'; '.join(parts)} (binding constraint: {' and '.join(names)})"
    if c.latency_bound_s is not None and c.memory_budget_bytes is not None:
        return (f"infeasible: the {LATENCY_BOUND} {c.latency_bound_s:.4g} s and the {MEMORY_BUDGET} "
                f"{c.memory_budget_bytes} B can each be met but not together "
                f"(binding constraint: {LATENCY_BOUND} and {MEMORY_BUDGET})")
    name = LATENCY_BOUND if c.latency_bound_s is not None else MEMORY_BUDGET
    return f"infeasible: the solver found no plan within the {name} (binding constraint: {name})"
