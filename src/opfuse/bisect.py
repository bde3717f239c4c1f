"""Which fusions break an output (``opfuse debug --bisect``).

``check(comp, feeds)`` builds the planned model, runs it and compares every output with the
reference executor on the original model, within ``rtol * max(1, max |reference|)``.

``bisect(comp, feeds)`` then searches the fused groups (groups of two or more ops) for the
smallest set that still breaks an output, with every other group turned back into single ops
(one kernel per op, in the group's order, so the plan stays topologically ordered). The search
halves the candidates (Zeller's minimising split for sets, "git bisect" over a set): if one half
fused alone still fails, recurse into it; else both halves are needed, and each is minimised with
the other fused. It builds O(k log n) plans for k culprits among n fused groups and finds a
minimal set when failures are monotone in the set of fusions (one wrong kernel fails wherever
it is fused).

With the culprits fused and everything else single, ``first_divergence`` makes every tensor that
crosses a kernel boundary a graph output, runs the build, and names the first tensor in kernel
order that differs from the reference executor's value of the same (rewritten) graph, with its
error. When the outputs disagree even with every group unfused, no fusion is to blame (a rewrite
or a single op's code is), and that is the answer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from opfuse.compiler import Compilation
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.runtime.compare import integer_difference, integral

DEFAULT_RTOL = 1e-4


@dataclass
class Mismatch:
    tensor: str
    max_abs_error: float
    tolerance: float
    group: str = ""  # the kernel that wrote it
    ops: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def __str__(self) -> str:
        where = f" (written by group '{self.group}': {'+'.join(self.ops)})" if self.group else ""
        return f"'{self.tensor}'{where}: max abs error {self.max_abs_error:.3g} (tolerance {self.tolerance:.3g})"


@dataclass
class BisectResult:
    culprits: list[FusionGroup]  # the smallest set of fusions found responsible
    builds: int  # plans built and run during the search
    not_fusion: bool = False  # the outputs disagree with every group unfused
    first: Mismatch | None = None  # the first diverging tensor with the culprits fused

    def to_dict(self) -> dict:
        return {"culprits": [{"group": g.name, "rule": g.attrs.get("rule"), "ops": g.op_types,
                              "nodes": [n.name for n in g.nodes]} for g in self.culprits],
                "builds": self.builds, "not_fusion": self.not_fusion,
                "first_divergence": self.first.to_dict() if self.first else None}


def compare(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray], rtol: float = DEFAULT_RTOL
            ) -> list[Mismatch]:
    """Every tensor of ``want`` that ``got`` misses by more than ``rtol * max(1, max |want|)``
    (NaN where the reference has none counts as a miss); an integer tensor by any difference, taken exactly
    (``runtime.compare``)."""
    out = []
    for name, w0 in want.items():
        if name not in got:
            continue
        g0, w0 = np.asarray(got[name]), np.asarray(w0)
        if not w0.size:
            continue
        if integral(g0) and integral(w0) and g0.shape == w0.shape:
            exact = integer_difference(g0, w0)[0]
            if exact > 0:
                out.append(Mismatch(name, exact, 0.0))
            continue
        g, w = g0.astype(np.float64), w0.astype(np.float64)
        tol = rtol * max(1.0, float(np.nanmax(np.abs(w))) if np.isfinite(w).any() else 1.0)
        diff = np.abs(g - w)
        bad_nan = np.isnan(g) & ~np.isnan(w)
        err = float(np.nanmax(diff)) if (~np.isnan(diff)).any() else 0.0
        if bad_nan.any():
            err = float("inf")
        if err > tol:
            out.append(Mismatch(name, err, tol))
    return out


def split_plan(plan: FusionPlan, keep: set[str]) -> FusionPlan:
    """``plan`` with every multi-op group not named in ``keep`` turned into single-op groups."""
    groups: list[FusionGroup] = []
    for g in plan.groups:
        if len(g.nodes) < 2 or g.name in keep:
            groups.append(g)
        else:
            groups += [FusionGroup(n.name, [n], "single", n, {"origin": [n.name]}) for n in g.nodes]
    out = FusionPlan(plan.graph, groups)
    out.verify()
    return out


def _run_plan(plan: FusionPlan, feeds: Mapping[str, np.ndarray], threads: int) -> dict[str, np.ndarray]:
    from opfuse.memory import plan_memory
    from opfuse.runtime.native import build
    return build(plan.graph, plan, threads=threads, memory=plan_memory(plan)).run(feeds)


def check(comp: Compilation, feeds: Mapping[str, np.ndarray], *, threads: int = 1, rtol: float = DEFAULT_RTOL,
          plan: FusionPlan | None = None) -> list[Mismatch]:
    """The outputs of ``plan`` (default: the compiled plan) that miss the reference's."""
    from opfuse.runtime.reference import run
    return compare(_run_plan(plan or comp.plan, feeds, threads), run(comp.original, feeds), rtol)


def _minimise(items: list[str], fixed: list[str], fails: Callable[[list[str]], bool]) -> list[str]:
    """A minimal subset ``s`` of ``items`` with ``fails(fixed + s)``, given ``fails(fixed + items)``."""
    if len(items) <= 1:
        return items
    half = len(items) // 2
    left, right = items[:half], items[half:]
    if fails(fixed + left):
        return _minimise(left, fixed, fails)
    if fails(fixed + right):
        return _minimise(right, fixed, fails)
    need_left = _minimise(left, fixed + right, fails)
    return need_left + _minimise(right, fixed + need_left, fails)


def _with_outputs(plan: FusionPlan) -> FusionPlan:
    """A copy of ``plan`` over a copy of its graph in which every value crossing a kernel
    boundary is also a graph output (the grouping is unchanged: those values are stored anyway)."""
    g: Graph = plan.graph.copy()
    outs = {id(v) for v in plan.graph.outputs}
    crossing = [v.name for grp in plan.groups for v in grp.outputs(plan.graph)
                if id(v) not in outs and not v.is_const]
    g.outputs = [*g.outputs, *(g.values[name] for name in crossing)]
    groups = [FusionGroup(grp.name, [g.node(n.name) for n in grp.nodes], grp.kind,
                          g.node(grp.anchor.name) if grp.anchor is not None else None, dict(grp.attrs))
              for grp in plan.groups]
    out = FusionPlan(g, groups)
    out.verify()
    return out


def first_divergence(comp: Compilation, plan: FusionPlan, feeds: Mapping[str, np.ndarray], *, threads: int = 1,
                     rtol: float = DEFAULT_RTOL) -> Mismatch | None:
    """The first tensor, in kernel order, that ``plan``'s build computes differently from the
    reference executor on the same graph."""
    from opfuse.runtime.reference import run
    wide = _with_outputs(plan)
    got = _run_plan(wide, feeds, threads)
    want = run(comp.graph, feeds, keep=True)
    for grp in wide.groups:
        for v in grp.outputs(wide.graph):
            bad = compare({v.name: got[v.name]}, {v.name: want[v.name]}, rtol) if v.name in got else []
            if bad:
                bad[0].group, bad[0].ops = grp.name, grp.op_types
                return bad[0]
    return None


def check_groups(comp: Compilation, feeds: Mapping[str, np.ndarray], *, threads: int = 1,
                 rtol: float = DEFAULT_RTOL) -> list[tuple[FusionGroup, list[Mismatch]]]:
    """Every kernel of the compiled plan with the tensors it writes that differ from the
    reference executor's (empty when the kernel is right): the seed's practice of validating
    operators one by one, here group by group, as ``--debug`` runs a model."""
    from opfuse.runtime.reference import run
    wide = _with_outputs(comp.plan)
    got = _run_plan(wide, feeds, threads)
    want = run(comp.graph, feeds, keep=True)
    rows = []
    for grp in wide.groups:
        written = {v.name: got[v.name] for v in grp.outputs(wide.graph) if v.name in got}
        rows.append((grp, compare(written, {k: want[k] for k in written}, rtol)))
    return rows


def bisect(comp: Compilation, feeds: Mapping[str, np.ndarray], *, threads: int = 1, rtol: float = DEFAULT_RTOL,
           progress: Callable[[int], None] | None = None) -> BisectResult:
    """The smallest set of fusions that breaks an output (module docstring)."""
    fused = [g.name for g in comp.plan.groups if len(g.nodes) > 1]
    builds = 0
    seen: dict[frozenset, bool] = {}

    def fails(keep: Sequence[str]) -> bool:
        nonlocal builds
        key = frozenset(keep)
        if key not in seen:
            builds += 1
            seen[key] = bool(check(comp, feeds, threads=threads, rtol=rtol, plan=split_plan(comp.plan, set(key))))
            if progress is not None:
                progress(1)
        return seen[key]

    by_name = {g.name: g for g in comp.plan.groups}
    if fails([]):
        first = first_divergence(comp, split_plan(comp.plan, set()), feeds, threads=threads, rtol=rtol)
        return BisectResult([], builds, not_fusion=True, first=first)
    culprits = _minimise(fused, [], fails) if fused and fails(fused) else []
    first = first_divergence(comp, split_plan(comp.plan, set(culprits)), feeds, threads=threads, rtol=rtol) \
        if culprits else None
    return BisectResult([by_name[n] for n in culprits], builds, first=first)
