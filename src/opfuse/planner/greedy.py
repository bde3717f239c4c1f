"""The greedy planner: merge the legal pair of groups with the largest predicted gain.

Start from the unfused plan. A candidate merge joins two groups that are adjacent
(producer and consumer) or siblings (they read a common non-constant input). Its gain is
the decrease of the objective, the seed's benefit/cost score with costs from the cost
model:

    gain(A, B) = J(A) + J(B) - J(A u B)     (J = w_T L / T_0 + w_K / K_0 per group,
                                             plus w_M * (peak before - peak after) / M_0)

Groups the legality offers only as a whole (``proposed_groups``: a pattern such as
attention whose parts are not legal kernels) are *macro moves*: merge all the current
groups that tile the proposal in one step.

Merges are taken best first from a priority queue (ties: earliest group first, so the
result is deterministic); a merge is skipped when it is illegal, would create a cycle
through an outside group, or would break (or worsen) a constraint. Entries go stale when
a group changes and are dropped when popped; new pairs of the merged group are pushed.
With a memory term or constraints the gain of a popped entry is re-evaluated on the
current plan and pushed back if it dropped (lazy greedy).

Cycles are checked against a topological order of the groups kept up to date on each
merge: a path from ``P`` to ``Q`` (``P`` first) can only pass through groups ranked
between them, and the merged group is placed after the groups in that window that do
not descend from ``P`` and before those that do.

The peak is a max, flat under most single merges; memory gains are therefore ranked with
a p-norm of the live-bytes profile (``Problem.soft_peak``), and progress towards a
memory budget is measured as the area above the budget line (``Problem.excess``).

When a constraint is still violated once no profitable merge is left, a repair phase
takes, one at a time, the merge that reduces the excess most (or keeps it and lowers
the latency) without worsening another constraint; when none exists the bound is
reported infeasible, naming the constraint and the best value reached.
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from opfuse.errors import InfeasibleError
from opfuse.planner.candidates import MAX_SIBLING_FANOUT
from opfuse.planner.problem import LATENCY_BOUND, MEMORY_BUDGET, Metrics, Problem

GAIN_EPSILON = 1e-9  # gains below this (J is ~1 for the unfused plan) are rounding noise
VIOLATION_EPSILON = 1e-12


@dataclass
class GreedyResult:
    groups: list[tuple[int, ...]]
    merges: int
    repair_merges: int
    solve_time_s: float
    trajectory: list[list[tuple[int, ...]]] = field(default_factory=list)


class _State:
    """A partition under construction: groups, group graph, topological ranks."""

    def __init__(self, problem: Problem):
        self.p = problem
        n = len(problem.nodes)
        self.owner = list(range(n))
        self.members: dict[int, list[int]] = {i: [i] for i in range(n)}
        self.succ: dict[int, set[int]] = {i: set() for i in range(n)}
        self.pred: dict[int, set[int]] = {i: set() for i in range(n)}
        for i, node in enumerate(problem.nodes):
            for v in node.input_values():
                if v.producer is not None:
                    q = problem.pos[id(v.producer)]
                    if q != i:
                        self.succ[q].add(i)
                        self.pred[i].add(q)
        self.order: list[int | None] = list(range(n))
        self.rank = list(range(n))
        self.version = [0] * n
        self._keys: dict[int, tuple[int, ...]] = {}
        self.readers: dict[int, list[int]] = {}
        for v in problem.graph.values.values():
            if not v.is_const and v.uses:
                self.readers[id(v)] = sorted({problem.pos[id(u)] for u, _ in v.uses})

    def key(self, g: int) -> tuple[int, ...]:
        k = self._keys.get(g)
        if k is None:
            k = self._keys[g] = tuple(sorted(self.members[g]))
        return k

    def groups(self) -> list[tuple[int, ...]]:
        return [self.key(g) for g in self.order if g is not None]

    def merged_key(self, g: int, h: int) -> tuple[int, ...]:
        return tuple(sorted(self.members[g] + self.members[h]))

    def neighbors(self, g: int) -> list[int]:
        out = self.pred[g] | self.succ[g]
        for i in self.members[g]:
            for v in self.p.nodes[i].input_values():
                rs = self.readers.get(id(v))
                if rs is None or len(rs) < 2:
                    continue
                if len(rs) > MAX_SIBLING_FANOUT:
                    k = rs.index(i)
                    rs = rs[max(0, k - 1):k + 2]
                for u in rs:
                    if self.owner[u] != g:
                        out.add(self.owner[u])
        return sorted(out)

    def path_between(self, gs) -> tuple[bool, set[int]]:
        """(a path joins two of ``gs`` through another group?, the groups ranked inside
        ``gs``'s window that descend from one of them)."""
        members = set(gs)
        limit = max(self.rank[g] for g in gs)
        stack = [s for g in gs for s in self.succ[g] if s not in members and self.rank[s] < limit]
        down = set(stack)
        while stack:
            x = stack.pop()
            if self.succ[x] & members:
                return True, down
            for s in self.succ[x]:
                if s not in down and s not in members and self.rank[s] < limit:
                    down.add(s)
                    stack.append(s)
        return False, down

    def hypothetical(self, gs) -> list[tuple[int, ...]]:
        merged = tuple(sorted(i for g in gs for i in self.members[g]))
        return [self.key(x) for x in self.order if x is not None and x not in gs] + [merged]

    def merge(self, gs, down: set[int]) -> int:
        """Merge the groups ``gs`` (no path between them through another group) into one."""
        gs = list(gs)
        big = max(gs, key=lambda g: (len(self.members[g]), -g))
        others = [g for g in gs if g != big]
        merged_ids = set(gs)
        lo = min(self.rank[g] for g in gs)
        hi = max(self.rank[g] for g in gs)
        window = [x for x in self.order[lo:hi + 1] if x is not None and x not in merged_ids]
        seq = [x for x in window if x not in down] + [big] + [x for x in window if x in down]
        seq += [None] * (hi - lo + 1 - len(seq))
        self.order[lo:hi + 1] = seq
        for k, x in enumerate(seq):
            if x is not None:
                self.rank[x] = lo + k
        for g in others:
            for i in self.members[g]:
                self.owner[i] = big
            self.members[big].extend(self.members.pop(g))
        for rel, inv in ((self.succ, self.pred), (self.pred, self.succ)):
            union = set(rel[big])
            for g in others:
                union |= rel.pop(g)
            union -= merged_ids
            rel[big] = union
            for x in union:
                inv[x] -= merged_ids
                inv[x].add(big)
        for g in gs:
            self.version[g] += 1
            self._keys.pop(g, None)
        return big


def solve_greedy(problem: Problem, *, trajectory_points: int = 0) -> GreedyResult:
    """Greedy merging under ``problem``'s objective and constraints (see module doc)."""
    t0 = time.perf_counter()
    st = _State(problem)
    obj, cons = problem.objective, problem.constraints
    needs_metrics = obj.memory > 0 or cons.latency_bound_s is not None or cons.memory_budget_bytes is not None
    current: Metrics = problem.ref  # the plan's metrics, kept up to date only when needs_metrics
    heap: list = []
    tie = itertools.count()
    scores: dict[tuple[int, ...], float] = {}
    merges = repairs = 0
    stride = max(1, len(problem.nodes) // trajectory_points) if trajectory_points else 0
    trajectory: list[list[tuple[int, ...]]] = [st.groups()] if stride else []
    proposals = _proposals(problem)

    def score(key):
        s = scores.get(key)
        if s is None:
            s = scores[key] = problem.group_score(key)
        return s

    def memory_gain(m_new: Metrics) -> float:
        if obj.memory <= 0:
            return 0.0
        saved = problem.soft_peak(current) - problem.soft_peak(m_new)
        return obj.memory * saved / problem.norm[1]

    def separable_gain(gs, key) -> float:
        return sum(score(st.key(g)) for g in gs) - score(key)

    def push(gain: float, move: tuple):
        if gain > GAIN_EPSILON:
            heapq.heappush(heap, (-gain, next(tie), move))

    def push_pairs(g: int, only_higher: bool = False):
        for h in st.neighbors(g):
            if only_higher and h < g:
                continue
            key = st.merged_key(g, h)
            if problem.legal(key) is not None:
                continue
            gain = separable_gain((g, h), key)
            if obj.memory > 0:
                if st.path_between((g, h))[0]:
                    continue  # a cycle now is a cycle for good: paths survive merges
                gain += memory_gain(problem.metrics(st.hypothetical((g, h))))
            a, b = (g, h) if g < h else (h, g)
            push(gain, ("pair", a, b, st.version[a], st.version[b]))

    def macro_groups(k: int) -> list[int] | None:
        """The current groups that exactly tile proposal ``k`` (None if they do not)."""
        key = proposals[k]
        gs = sorted({st.owner[i] for i in key})
        if len(gs) < 2 or sum(len(st.members[g]) for g in gs) != len(key):
            return None
        return gs

    def resolve(move) -> tuple[list[int], tuple[int, ...]] | None:
        """(groups to merge, merged key) of a heap entry still valid on the current plan."""
        if move[0] == "pair":
            _, g, h, vg, vh = move
            if g not in st.members or h not in st.members or st.version[g] != vg or st.version[h] != vh:
                return None
            return [g, h], st.merged_key(g, h)
        gs = macro_groups(move[1])
        return None if gs is None else (gs, proposals[move[1]])

    def acceptable(m_new: Metrics) -> bool:
        """No constraint gets further from holding (one that holds keeps holding)."""
        before, after = problem.excess(current), problem.excess(m_new)
        return all(v <= before[k] + VIOLATION_EPSILON for k, v in after.items())

    def commit(gs, down, m_new):
        nonlocal current, merges
        big = st.merge(gs, down)
        merges += 1
        if needs_metrics:
            current = m_new
        push_pairs(big)
        if stride and merges % stride == 0:
            trajectory.append(st.groups())

    def profitable_phase():
        while heap:
            neg, _, move = heapq.heappop(heap)
            found = resolve(move)
            if found is None:
                continue
            gs, key = found
            cycle, down = st.path_between(gs)
            if cycle:
                continue
            gain = separable_gain(gs, key)
            m_new = None
            if needs_metrics:
                m_new = problem.metrics(st.hypothetical(gs))
                gain += memory_gain(m_new)
                if not acceptable(m_new):
                    continue
            if gain <= GAIN_EPSILON:
                continue
            if heap and gain < -heap[0][0] - GAIN_EPSILON:  # the gain dropped: requeue
                push(gain, move)
                continue
            commit(gs, down, m_new)

    def repair_step() -> bool:
        before = problem.excess(current)
        total = sum(before.values())
        best = None
        moves = [[g, h] for g in st.order if g is not None for h in st.neighbors(g) if h > g]
        moves += [gs for gs in map(macro_groups, range(len(proposals))) if gs is not None]
        for gs in moves:
            key = tuple(sorted(i for g in gs for i in st.members[g]))
            if problem.legal(key) is not None:
                continue
            cycle, down = st.path_between(gs)
            if cycle:
                continue
            m_new = problem.metrics(st.hypothetical(gs))
            after = problem.excess(m_new)
            if any(v > before[k] + VIOLATION_EPSILON for k, v in after.items()):
                continue
            t = sum(after.values())
            if t < total - VIOLATION_EPSILON or m_new.latency_s < current.latency_s:
                rank = (t, problem.score(m_new), min(st.rank[g] for g in gs))
                if best is None or rank < best[0]:
                    best = (rank, gs, down, m_new)
        if best is None:
            return False
        _, gs, down, m_new = best
        commit(gs, down, m_new)
        return True

    for g in range(len(problem.nodes)):
        push_pairs(g, only_higher=True)
    for k, key in enumerate(proposals):
        push(sum(score((i,)) for i in key) - score(key), ("macro", k))
    profitable_phase()
    while needs_metrics and problem.violations(current):
        if not repair_step():
            raise InfeasibleError(_infeasible_message(problem, current))
        repairs += 1
        profitable_phase()
    if stride and (not trajectory or trajectory[-1] != st.groups()):
        trajectory.append(st.groups())
    return GreedyResult(groups=st.groups(), merges=merges, repair_merges=repairs,
                        solve_time_s=time.perf_counter() - t0, trajectory=trajectory)


def _proposals(problem: Problem) -> list[tuple[int, ...]]:
    """Legal multi-node groups the legality offers as a whole (macro moves), sorted."""
    out = set()
    for nodes in problem.legality.proposed_groups(problem.graph):
        key = tuple(sorted(problem.pos[id(n)] for n in nodes))
        if len(key) > 1 and problem.legal(key) is None:
            out.add(key)
    return sorted(out)


def _infeasible_message(problem: Problem, m: Metrics) -> str:
    c = problem.constraints
    parts, names = [], []
    for name in problem.violations(m):
        names.append(name)
        if name == LATENCY_BOUND:
            parts.append(f"{LATENCY_BOUND} {c.latency_bound_s:.4g} s not met: the best critical path "
                         f"greedy merging reached is {m.critical_path_s:.4g} s")
        elif name == MEMORY_BUDGET:
            parts.append(f"{MEMORY_BUDGET} {c.memory_budget_bytes} B not met: the lowest peak activation "
                         f"memory greedy merging reached is {m.peak_memory_bytes} B")
    return f"infeasible: {'; '.join(parts)} (binding constraint: {' and '.join(names)})"
