"""``memory.patch``'s choice of runs checked against a plain restatement of its rules (mutation testing,
tests/MUTATION.md: `_greedy` and `_polish` survivors that the one-run chains of test_patch_choose.py and
test_patch_polish.py could not see).

The chain has two regions that a run can lower, split by a pool that cannot run on bands (ceil_mode=1),
and a strided convolution that ends the first region: x (1, 1, 16, 6) -> conv1 3x3 (8) -> dw1 3x3 ->
pw1 1x1 (16) -> down 3x3/2 (8, 8x3) -> pool -> conv3 3x3 (32) -> dw2 3x3 -> pw2 1x1 (2) -> ReLU +
GlobalAveragePool. The first region's peak (r2 and r3 at pw1, 9216 bytes) is lowered only by a run that
ends at ``down`` (r3 leaves the arena), whose output has half the rows and half the width of the layers
before it; the second region's peak (6144 bytes) is the arena once the first is lowered, so a second run
follows, and with the recomputation budget of both runs' work exactly, both recompute.

``_reference_states`` states the greedy order's rule as its docstring and choose_patches's give it, with
the public pieces (``schedule``, ``merge_run``, ``plan_memory``, ``place_scratch``) and nothing of
``_greedy``'s own bookkeeping (its cache, its running ``needs`` list, its bookkeeping of ``info``)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.memory import patch
from opfuse.memory.patch import (
    MAX_RUN_GROUPS,
    MIN_BAND_PIXELS,
    PATCHED_KIND,
    Bandable,
    PatchSchedule,
    _greedy,
    _polish,
    _run_ok,
    bandable,
    choose_patches,
    estimate_arena,
    merge_run,
    schedule,
)
from opfuse.memory.plan import plan_memory
from opfuse.memory.scratch import place_scratch
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import get_spec
from test_patch_choose import _w

ORDERS = [(free_first, streams) for free_first in (False, True) for streams in ((False,), (False, True))]


def _two_regions():
    b = GraphBuilder("two_regions")
    x = b.input("x", (1, 1, 16, 6))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw1"), name="r2")
    r3 = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 16, 8, 1, 1), name="pw1"), name="r3")
    r4 = b.op("Relu", b.op("Conv", r3, _w(b, "w4", 8, 16, 3, 3), pads=[1, 1, 1, 1], strides=[2, 2], name="down"),
              name="r4")
    p = b.op("MaxPool", r4, kernel_shape=[3, 3], pads=[1, 1, 1, 1], ceil_mode=1, name="pool")
    r5 = b.op("Relu", b.op("Conv", p, _w(b, "w5", 32, 8, 3, 3), pads=[1, 1, 1, 1], name="conv3"), name="r5")
    r6 = b.op("Relu", b.op("Conv", r5, _w(b, "w6", 32, 1, 3, 3), group=32, pads=[1, 1, 1, 1], name="dw2"), name="r6")
    r7 = b.op("Conv", r6, _w(b, "w7", 2, 32, 1, 1), name="pw2")
    graph = b.build(b.op("GlobalAveragePool", b.op("Relu", r7, name="r7"), name="gap"))
    comp = plan_model(graph, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    names = ["conv1", "dw1", "pw1", "down", "pool", "conv3", "dw2", "pw2", "gap"]
    assert [g.name for g in comp.plan.groups] == names
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    assert [isinstance(i, Bandable) for i in info] == [True] * 4 + [False] + [True] * 3 + [False]
    assert info[3].output.shape == (1, 8, 8, 3) and info[2].output.shape == (1, 16, 16, 6)
    return comp, info


@pytest.fixture(scope="module")
def regions():
    return _two_regions()


def _arena_and_area(plan: FusionPlan) -> tuple[int, int]:
    """The arena with each patched run's workspace as its kernel's scratch, and the bytes live summed over
    kernels plus the workspaces (the tie-break that lets a run flatten a plateau of equal peaks)."""
    memory = plan_memory(plan)
    needs = [g.attrs["patch"].workspace_bytes if g.kind == PATCHED_KIND else 0 for g in plan.groups]
    area = sum(size * (end - start + 1) for _, size, start, end in memory.blocks.values()) + sum(needs)
    return place_scratch(memory, needs).arena_bytes, area


def _band_heights(height: int, width: int) -> list[int]:
    """The smallest band height that gives each band count from 2 to ``height``, highest first, with at least
    MIN_BAND_PIXELS pixels a band."""
    heights = sorted({-(-height // n) for n in range(2, height + 1)}, reverse=True)
    return [h for h in heights if h * width >= MIN_BAND_PIXELS]


def _candidates(plan: FusionPlan, info: list, budget_left: float, scratch: dict, streams):
    """Every run the greedy order may make next, in the order it tries them."""
    n = len(plan.groups)
    for start in range(n):
        for end in range(start + 1, min(start + MAX_RUN_GROUPS, n)):
            if not all(isinstance(m, Bandable) for m in info[start:end + 1]):
                break
            if not _run_ok(plan, start, end, info):
                continue
            members = list(info[start:end + 1])
            height, width = members[-1].output.shape[2:]
            for rows in _band_heights(height, width):
                for stream in streams:
                    sched = schedule(members, rows, [scratch.get(m.group.name, 0) for m in members], stream)
                    if sched.extra_work > budget_left + 1e-9:
                        continue
                    merged = merge_run(plan, start, sched)
                    yield start, end, sched, merged, _arena_and_area(merged)


def _reference_states(plan: FusionPlan, info: list, budget: float, free_first: bool, scratch: dict, streams):
    """The states one greedy order passes through: at each step the run with the lowest arena below the
    current one (then the least recomputation, the lowest area, the shortest run, the first start; the first
    tried among equal ones) within what is left of the budget; with ``free_first``, first only runs that
    recompute nothing and lower (arena, area) without raising the arena, until none does."""
    current = _arena_and_area(plan)
    extra, runs, states = 0.0, [], []
    free = free_first
    while True:
        best = None
        for start, end, sched, merged, (arena, area) in _candidates(plan, info, budget - extra, scratch, streams):
            if free:
                if sched.extra_work > 0 or arena > current[0] or (arena, area) >= current:
                    continue
                key: tuple = (arena, area, end - start, start)
            else:
                if arena >= current[0]:
                    continue
                key = (arena, sched.extra_work, area, end - start, start)
            if best is None or key < best[0]:
                best = (key, start, end, sched, merged, (arena, area))
        if best is None:
            if free:
                free = False
                continue
            return states
        _, start, end, sched, plan, current = best
        info = info[:start] + [plan.groups[start].name] + info[end + 1:]
        extra += sched.extra_work
        runs = runs + [{**sched.describe(), "arena_estimate": current[0]}]
        states.append((current[0], extra, len(runs), [g.name for g in plan.groups], runs))


def _summary(states):
    return [(s[0], s[1], s[2], [g.name for g in s[3].groups], s[4]) for s in states]


def _model_work(comp) -> float:
    return float(sum(get_spec(n.op_type, n).flops(n) for n in comp.graph.nodes))


# The two runs' recomputation in the lowest-arena order with recomputed bands only: the first region's run
# over conv1..down in bands of 4 rows, then the second region's over conv3..pw2 in bands of 4.
FIRST_EXTRA = 5280.0
BOTH_EXTRA = 33120.0


@pytest.mark.parametrize("budget", [0.0, 0.05, 0.3, FIRST_EXTRA, BOTH_EXTRA, BOTH_EXTRA - 0.5],
                         ids=["none", "5pct", "30pct", "first-exactly", "both-exactly", "both-less-half-a-flop"])
@pytest.mark.parametrize("order", ORDERS, ids=["lowest", "lowest-lines", "free", "free-lines"])
def test_each_greedy_order_passes_through_the_states_its_rule_gives(regions, budget, order):
    comp, info = regions
    work = _model_work(comp)
    budget = budget * work if budget < 1 else budget
    free_first, streams = order
    got = _greedy(comp.plan, info, _arena_and_area(comp.plan), budget, free_first, {}, streams, {})
    want = _reference_states(comp.plan, info, budget, free_first, {}, streams)
    assert _summary(got) == want
    for arena, extra, _, plan, _ in got:  # each state's figures are its plan's
        assert estimate_arena(plan) == arena and extra <= budget + 1e-9
        assert extra == pytest.approx(sum(g.attrs["patch"].extra_work for g in plan.groups if g.kind == PATCHED_KIND))


def test_the_states_that_the_budget_cases_are_built_on(regions):
    """The exact budgets above sit where the rule turns: the lowest-arena order with recomputed bands makes two
    runs, the first recomputing FIRST_EXTRA and both BOTH_EXTRA; half a flop less takes the second run away."""
    comp, info = regions
    states = _greedy(comp.plan, info, _arena_and_area(comp.plan), BOTH_EXTRA, False, {}, (False,), {})
    assert [(s[0], s[1], [(r["groups"], r["band_rows"], r["line_buffers"]) for r in s[4]]) for s in states] == [
        (6144, FIRST_EXTRA, [(["conv1", "dw1", "pw1", "down"], 4, False)]),
        (5952, BOTH_EXTRA, [(["conv1", "dw1", "pw1", "down"], 4, False), (["conv3", "dw2", "pw2"], 4, False)])]
    less = _greedy(comp.plan, info, _arena_and_area(comp.plan), BOTH_EXTRA - 0.5, False, {}, (False,), {})
    assert [s[1] for s in less][-1] != BOTH_EXTRA
    # the run over conv1..down ends at the strided layer: its bands count the strided layer's 8 rows of 3 pixels
    first = states[0][3].groups[0].attrs["patch"]
    assert first.band_rows == 4 and len(first.bands) == 2 and first.output.shape[2:] == (8, 3)


@pytest.mark.parametrize("order", ORDERS, ids=["lowest", "lowest-lines", "free", "free-lines"])
def test_each_layer_kernel_scratch_joins_the_workspace_of_the_runs_tried(regions, order):
    """Scratch named for some layers only: the others have none (not one byte)."""
    comp, info = regions
    scratch = {"dw1": 700, "down": 1500, "conv3": 300}
    free_first, streams = order
    budget = 0.3 * _model_work(comp)
    got = _greedy(comp.plan, info, _arena_and_area(comp.plan), budget, free_first, scratch, streams, {})
    assert got and _summary(got) == _reference_states(comp.plan, info, budget, free_first, scratch, streams)
    for _, _, _, plan, _ in got:
        for g in plan.groups:
            if g.kind == PATCHED_KIND:
                s = g.attrs["patch"]
                assert s.step_scratch == [scratch.get(m.group.name, 0) for m in s.members]


def test_the_chosen_plan_is_the_best_state_of_the_four_orders(regions):
    """choose_patches keeps the lowest arena, then the least recomputation, then the fewest runs, over the
    states of the four orders (the first reached among equal ones), then prunes and polishes it."""
    comp, info = regions
    work = _model_work(comp)
    for limit in (0.0, 0.05, 0.3):
        start = _arena_and_area(comp.plan)
        best = (start[0], 0.0, 0, None)
        if limit > 0:
            for free_first, streams in ORDERS:
                for s in _reference_states(comp.plan, info, limit * work, free_first, {}, streams):
                    if s[:3] < best[:3]:
                        best = s[:3] + (s[3],)
        chosen, report = choose_patches(comp.plan, limit)
        assert report.arena_after == best[0] == estimate_arena(chosen)
        assert report.model_work == pytest.approx(work)
        if best[3] is None:
            assert chosen is comp.plan and report.runs == []


# The selection rule alone: ``_estimate`` and ``_run_ok`` stubbed, so that arenas, areas and the runs allowed
# are the test's own and ties can be made on purpose.

def _stub(monkeypatch, estimates, allowed):
    """``_estimate`` returns ``estimates(run, sched)`` for the candidate being priced (``run``: its first and
    last group, ``sched``: its schedule); ``_run_ok`` allows only the runs in ``allowed``."""
    real_merge = patch.merge_run
    merged_runs: dict[int, tuple[int, int]] = {}
    tried: list = []

    def merge(plan, start, sched):
        merged = real_merge(plan, start, sched)
        merged_runs[id(merged)] = (start, start + len(sched.members) - 1)
        tried.append(sched)
        return merged

    real_schedule = patch.schedule

    def schedule_stub(members, rows, scratch=None, stream=False):
        sched = real_schedule(members, rows, scratch, stream)
        tried.append(sched)
        return sched

    def estimate(memory, needs):
        return estimates(memory, tried[-1])

    monkeypatch.setattr(patch, "merge_run", merge)
    monkeypatch.setattr(patch, "schedule", schedule_stub)
    monkeypatch.setattr(patch, "plan_memory", lambda plan: merged_runs[id(plan)])
    monkeypatch.setattr(patch, "_estimate", estimate)
    monkeypatch.setattr(patch, "_run_ok", lambda plan, start, end, info: (start, end) in allowed)


def _first_run(states):
    s = states[0][4][0]
    return s["groups"], s["band_rows"], s["line_buffers"]


def test_ties_go_to_the_shorter_run_then_the_earlier_start(regions, monkeypatch):
    """Equal arenas, recomputation and areas: conv1..pw1 (three groups, from 0) against dw1..pw1 (two, from 1):
    the shorter run wins, in the lowest-arena order and in the free-first order alike."""
    comp, info = regions
    _stub(monkeypatch, lambda run, sched: (100, 50), allowed={(0, 2), (1, 2)})
    for free_first in (False, True):
        # line buffers only: nothing recomputed; equal keys for every band height of a run
        states = _greedy(comp.plan, info, (200, 60), 1e12, free_first, {}, (True,), {})
        assert _first_run(states)[0] == ["dw1", "pw1"]


def test_equal_keys_keep_the_first_tried_the_highest_bands(regions, monkeypatch):
    """Every band height of one run with the same arena and area and no recomputation (line buffers): the first
    tried, the highest, is kept; the same in the free-first order."""
    comp, info = regions
    _stub(monkeypatch, lambda run, sched: (100, 50), allowed={(0, 1)})
    for free_first in (False, True):
        states = _greedy(comp.plan, info, (200, 60), 1e12, free_first, {}, (True,), {})
        assert _first_run(states) == (["conv1", "dw1"], 8, True) and len(states) == 1


CASES = {  # (arena, area) of every candidate against the current (100, 10)
    "same arena, higher area": ((100, 50), False),
    "same arena and area": ((100, 10), False),
    "same arena, lower area": ((100, 5), True),
    "lower arena, higher area": ((90, 50), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_free_first_order_takes_only_what_lowers_the_arena_or_the_area(regions, monkeypatch, case):
    """The free-first order takes a run that lowers (arena, area) without raising the arena; the lowest-arena
    order only one that lowers the arena."""
    comp, info = regions
    est, taken = CASES[case]
    _stub(monkeypatch, lambda run, sched: est, allowed={(0, 1)})
    states = _greedy(comp.plan, info, (100, 10), 1e12, True, {}, (True,), {})
    assert [s[0] for s in states] == ([est[0]] if taken else [])
    lowest = _greedy(comp.plan, info, (100, 10), 1e12, False, {}, (True,), {})
    assert [s[0] for s in lowest] == ([est[0]] if est[0] < 100 else [])


def test_a_schedule_refused_for_its_arena_does_not_end_the_run_s_other_schedules(regions, monkeypatch):
    """dw1..pw1 recomputes nothing with either schedule (dw1's window reads the run's input). The recomputed
    bands of each height are refused for their arena; the line buffers of the same height, tried after them,
    are taken, in both orders."""
    comp, info = regions
    _stub(monkeypatch, lambda run, sched: (90, 5) if sched.stream else (150, 5), allowed={(1, 2)})
    for free_first in (False, True):
        states = _greedy(comp.plan, info, (100, 10), 1e12, free_first, {}, (False, True), {})
        assert _first_run(states) == (["dw1", "pw1"], 8, True)
        assert states[0][1] == 0


# _polish on runs that end at the strided layer and on bands of one row.

def _reference_polish(plan: FusionPlan, i: int, arena: int) -> PatchSchedule:
    """The schedule polish keeps for the run at ``i``: over the band heights of its last layer and both kinds
    of bands, the least recomputation (never more than the run's), then the fewest bands, then line buffers,
    then the lowest bands, among those whose plan (every other group as it is) keeps ``arena``; the run's own
    schedule unless one is better."""
    old = plan.groups[i].attrs["patch"]
    members = old.members
    best, chosen = (old.extra_work, len(old.bands), not old.stream, old.band_rows), old
    height, width = members[-1].output.shape[2:]
    for rows in _band_heights(height, width):
        for stream in (False, True):
            sched = schedule(members, rows, None, stream)
            key = (sched.extra_work, len(sched.bands), not sched.stream, rows)
            if sched.extra_work > old.extra_work or key >= best:
                continue
            trial = FusionPlan(plan.graph, plan.groups[:i] + [merge_run(
                FusionPlan(plan.graph, [m.group for m in members]), 0, sched).groups[0]] + plan.groups[i + 1:])
            if estimate_arena(trial) <= arena:
                best, chosen = key, sched
    return chosen


def _polish_cases(comp, members, start):
    """Every schedule of the run over its last layer's band heights, and the arenas to polish under: the
    arena of each schedule of any height from 1 row up (bands below MIN_BAND_PIXELS too, which polish must not
    take even where only they keep the arena), and one above them all."""
    height, width = members[-1].output.shape[2:]
    scheds = [schedule(members, rows, None, stream)
              for rows in _band_heights(height, width) for stream in (False, True)]
    arenas = sorted({estimate_arena(merge_run(comp.plan, start, schedule(members, rows, None, stream)))
                     for rows in range(1, height + 1) for stream in (False, True)})
    return scheds, arenas + [arenas[-1] + 4096]


def _check_polish(comp, members, start):
    scheds, arenas = _polish_cases(comp, members, start)
    changed = 0
    for old in scheds:
        plan = merge_run(comp.plan, start, old)
        for arena in arenas:
            runs = [{**old.describe(), "arena_estimate": arena}]
            polished, new_runs = _polish(plan, runs, arena, {})
            want = _reference_polish(plan, start, arena)
            got = polished.groups[start].attrs["patch"]
            assert (got.band_rows, got.stream) == (want.band_rows, want.stream), (old.band_rows, old.stream, arena)
            assert [g.name for g in polished.groups] == [g.name for g in plan.groups]
            if want is old:
                assert polished is plan and new_runs is runs
            else:
                changed += 1
                assert new_runs == [{**got.describe(), "arena_estimate": arena}]
    return changed


def test_polish_tries_the_band_heights_of_the_run_s_last_layer(regions):
    """The first region's run ends at the strided layer (8 rows of 3 pixels; the layers before it 16 of 6): its
    band heights are 4 and 3 rows (at least 8 pixels), not those of the layers before it."""
    comp, info = regions
    members = list(info[0:4])
    assert _band_heights(8, 3) == [4, 3]
    assert _check_polish(comp, members, 0) > 0


def _wide_chain():
    """x (1, 1, 8, 8) -> conv 3x3 (8) -> depthwise 3x3 -> pointwise 1x1 (2) -> conv 1x1 (4) -> GAP: rows of 8
    pixels, so bands of one row are allowed."""
    b = GraphBuilder("wide")
    x = b.input("x", (1, 1, 8, 8))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw"), name="r2")
    r3 = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 2, 8, 1, 1), name="pw"), name="r3")
    r4 = b.op("Relu", b.op("Conv", r3, _w(b, "w4", 4, 2, 1, 1), name="expand"), name="r4")
    graph = b.build(b.op("GlobalAveragePool", r4, name="gap"))
    comp = plan_model(graph, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert [g.name for g in comp.plan.groups] == ["conv1", "dw", "pw", "expand", "gap"]
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    return comp, info


def test_polish_reaches_bands_of_one_row():
    """Rows of 8 pixels: bands of one row are allowed (8 rows: heights 4, 3, 2, 1)."""
    comp, info = _wide_chain()
    members = list(info[0:3])
    assert _band_heights(8, 8) == [4, 3, 2, 1]
    assert _check_polish(comp, members, 0) > 0
    # line buffers of one row need the least arena of all line buffers (2944 bytes; the layers unpatched 4096):
    # under it, from the recomputed bands of one row (the least arena of all, 1536), polish takes them
    lines = {rows: estimate_arena(merge_run(comp.plan, 0, schedule(members, rows, None, True)))
             for rows in (1, 2, 3, 4)}
    assert lines[1] < min(lines[2], lines[3], lines[4])
    old = schedule(members, 1)
    plan = merge_run(comp.plan, 0, old)
    polished, _ = _polish(plan, [{**old.describe(), "arena_estimate": lines[1]}], lines[1], {})
    s = polished.groups[0].attrs["patch"]
    assert (s.band_rows, s.stream, s.extra_work) == (1, True, 0)


def test_the_free_first_order_goes_on_to_the_line_buffers_after_refusing_recomputed_bands(regions, monkeypatch):
    """dw1..pw1's recomputed bands (nothing recomputed) would raise the arena; the line buffers of the same
    height, tried after them, keep it and lower the area: the free-first order takes them (the lowest-arena
    order would not: the arena stays)."""
    comp, info = regions
    _stub(monkeypatch, lambda run, sched: (100, 5) if sched.stream else (150, 5), allowed={(1, 2)})
    states = _greedy(comp.plan, info, (100, 10), 1e12, True, {}, (False, True), {})
    assert [s[0] for s in states] == [100] and _first_run(states) == (["dw1", "pw1"], 8, True)
    assert _greedy(comp.plan, info, (100, 10), 1e12, False, {}, (False, True), {}) == []


# Schedules whose tensors are read by two layers of the run, and a run input read first by a later layer.

def _two_readers():
    """x (1, 4, 16, 6) is read by the run's first layer (a 1x1 convolution, its own rows) and by its last
    layer's 3x3 window (a row more on each side), y (a graph input) only by the last layer:
    a = ReLU(conv 1x1 (x)); bb = ReLU(conv 1x1 (a)); c = conv 3x3 (x) + bb + y; GAP."""
    b = GraphBuilder("two_readers")
    x = b.input("x", (1, 4, 16, 6))
    y = b.input("y", (1, 4, 16, 6))
    a = b.op("Relu", b.op("Conv", x, _w(b, "wa", 4, 4, 1, 1), name="ca"), name="a")
    bb = b.op("Relu", b.op("Conv", a, _w(b, "wb", 4, 4, 1, 1), name="cb"), name="bb")
    c = b.op("Add", b.op("Add", b.op("Conv", x, _w(b, "wc", 4, 4, 3, 3), pads=[1, 1, 1, 1], name="cc"), bb,
                         name="add1"), y, name="add2")
    graph = b.build(b.op("GlobalAveragePool", c, name="gap"))
    comp = plan_model(graph, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert [[n.name for n in g.nodes] for g in comp.plan.groups] == [
        ["ca", "a"], ["cb", "bb"], ["cc", "add1", "add2"], ["gap"]]
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    return comp, info


def _check_ranges(sched):
    """Every band's buffer of a tensor holds the rows each layer reads of it in that band, and the rows each
    layer computes into it; its buffer holds every band's rows."""
    for band in sched.bands:
        ranges = {n: (lo, hi) for n, lo, hi in band.ranges}
        for k, step in enumerate(band.steps):
            for need in step.needs:
                lo, hi = ranges[need.value]
                assert lo <= need.lo and need.hi <= hi, (band.rows, k, need, (lo, hi))
            if not sched.stream:
                out = sched.members[k].output.name
                assert ranges[out][0] <= step.rows[0] and step.rows[1] <= ranges[out][1]
        for name, (lo, hi) in ranges.items():
            if sched.stream and name == sched.output.name:
                continue  # the output's rows of a band are its temporary's, written out after the band
            v = next(v for v in [*sched.inputs, *(m.output for m in sched.members)] if v.name == name)
            assert sched.buffers[f"v:{name}"] >= (hi - lo) * (v.nbytes // v.shape[2])


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8])
def test_a_tensor_read_by_two_layers_holds_the_rows_of_both(rows, stream):
    comp, info = _two_readers()
    sched = schedule(list(info[0:3]), rows, None, stream)
    _check_ranges(sched)
    # x: the window's rows around the band, the first layer's inside them; y: the band's rows, from step 2 only
    if not stream:
        for band in sched.bands:
            a, e = band.rows
            ranges = {n: (lo, hi) for n, lo, hi in band.ranges}
            assert ranges["x"] == (max(a - 1, 0), min(e + 1, 16)) and ranges["y"] == (a, e)
        assert sched.lifetimes["v:x"] == (0, 2) and sched.lifetimes["v:y"] == (2, 2)
    assert set(sched.buffers) >= {"v:x", "v:y"}
    assert [v.name for v in sched.inputs] == ["x", "y"]


def test_a_run_input_holds_no_rows_before_its_first_reader_starts():
    """Line buffers in bands of one row: the last layer's window waits for a second row of bb, so in the first
    band it computes nothing and reads nothing of y (its buffer is empty), and then one row of y a band."""
    b = GraphBuilder("late_input")
    x = b.input("x", (1, 4, 16, 6))
    y = b.input("y", (1, 4, 16, 6))
    a = b.op("Relu", b.op("Conv", x, _w(b, "wa", 4, 4, 1, 1), name="ca"), name="a")
    c = b.op("Add", b.op("Conv", a, _w(b, "wc", 4, 4, 3, 3), pads=[1, 1, 1, 1], name="cc"), y, name="add")
    comp = plan_model(b.build(b.op("GlobalAveragePool", c, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    assert [g.name for g in comp.plan.groups][:2] == ["ca", "cc"]
    sched = schedule(list(info[0:2]), 1, None, True)
    _check_ranges(sched)
    first = {n: (lo, hi) for n, lo, hi in sched.bands[0].ranges}
    assert sched.bands[0].steps[1].rows == (0, 0) and first["y"][0] == first["y"][1]
    assert all(hi - lo == 1 for band in sched.bands[1:] for n, lo, hi in band.ranges if n == "y")
    assert sched.buffers["v:y"] == 4 * 6 * 4


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6])
def test_line_buffers_hold_what_every_reader_still_needs(regions, rows):
    """The first region's run conv1..down (16 rows of 6 pixels, then 8 of 3) in line buffers: every band's
    windows hold the rows its layers read."""
    comp, info = regions
    _check_ranges(schedule(list(info[0:4]), rows, None, True))
    _check_ranges(schedule(list(info[0:4]), rows, None, False))


def test_a_finished_reader_keeps_no_rows_of_its_input():
    """Three 3x3 layers in line buffers of one row: each lags a row behind the one before, so the second
    finishes a band before the third; in the bands after that, the first layer's output (read only by the
    second) keeps no rows."""
    b = GraphBuilder("three_windows")
    x = b.input("x", (1, 1, 8, 8))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 4, 1, 3, 3), pads=[1, 1, 1, 1], name="c1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], name="d1"), name="r2")
    r3 = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], name="d2"), name="r3")
    comp = plan_model(b.build(b.op("GlobalAveragePool", r3, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    sched = schedule(list(info[0:3]), 1, None, True)
    _check_ranges(sched)
    second_done = next(i for i, band in enumerate(sched.bands) if band.steps[1].rows[1] == 8)
    after = sched.bands[second_done + 1:]
    assert after and all(band.steps[2].rows[1] > band.steps[2].rows[0] for band in after)
    for band in after:
        lo, hi = next((lo, hi) for n, lo, hi in band.ranges if n == "r1")
        assert lo == hi == 8


# bandable's refusals on groups the planner does not form (built by hand).

def _group_graph():
    b = GraphBuilder("groups")
    x = b.input("x", (1, 2, 8, 6))
    s = b.input("s", (1, 2, 1, 1))
    w = b.op("Mul", _w(b, "w0", 2, 2, 3, 3), b.const("k", np.full((1,), 0.5, np.float32)), name="wscale")
    conv = b.op("Conv", x, w, pads=[1, 1, 1, 1], name="conv")
    pool = b.op("MaxPool", conv, kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="pool")
    shifted = b.op("Add", x, s, name="shift")
    conv2 = b.op("Conv", shifted, _w(b, "w2", 2, 2, 3, 3), pads=[1, 1, 1, 1], name="conv2")
    g = b.build(pool, conv2, w)
    return g, {n.name: n for n in g.nodes}


def test_bandable_leaves_out_what_is_computed_from_constants():
    """conv's weights are a Mul of two constants (in its group, and also a graph output): not run-time work
    nor a run-time output of the group; a group of that Mul alone has no run-time output."""
    g, by = _group_graph()
    static = static_values(g)
    m = bandable(FusionGroup("c", [by["wscale"], by["conv"]]), g, static)
    assert isinstance(m, Bandable) and m.output.name == "conv"
    assert m.work_per_row == pytest.approx(get_spec("Conv", by["conv"]).flops(by["conv"]) / 8)
    assert bandable(FusionGroup("w", [by["wscale"]]), g, static) == "a group with no run-time output"


def test_bandable_refuses_two_windows_and_an_input_of_another_shape_before_the_window():
    g, by = _group_graph()
    static = static_values(g)
    assert bandable(FusionGroup("cp", [by["conv"], by["pool"]]), g, static) == "two windowed ops in one group"
    assert bandable(FusionGroup("sc", [by["shift"], by["conv2"]]), g, static) == (
        "input 's' changes shape before the window")


def test_model_work_leaves_out_what_is_computed_from_constants():
    g, by = _group_graph()
    comp = plan_model(g, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    static = static_values(comp.graph)
    live = [n for n in comp.graph.nodes if not all(id(v) in static for v in n.outputs)]
    work = sum(get_spec(n.op_type, n).flops(n) for n in live)
    _, report = choose_patches(comp.plan, 0.5)
    assert report.model_work == pytest.approx(work)
    assert any(all(id(v) in static for v in n.outputs) and get_spec(n.op_type, n).flops(n) > 0
               for n in comp.graph.nodes), "the model keeps a node computed from constants"


def _residual():
    """r1 is added back in the pointwise layer's group (its residual epilogue), so a run from conv1 must reach
    that group: conv1..dw is refused, conv1..pw allowed."""
    b = GraphBuilder("res")
    x = b.input("x", (1, 1, 16, 4))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw"), name="r2")
    y = b.op("Add", b.op("Conv", r2, _w(b, "w3", 8, 8, 1, 1), name="pw"), r1, name="add")
    graph = b.build(b.op("GlobalAveragePool", b.op("Relu", y, name="ry"), name="gap"))
    comp = plan_model(graph, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    return comp, info


@pytest.mark.parametrize("limit", [0.05, 0.5])
@pytest.mark.parametrize("order", ORDERS, ids=["lowest", "lowest-lines", "free", "free-lines"])
def test_a_refused_run_does_not_end_the_longer_runs_from_its_start(order, limit):
    comp, info = _residual()
    assert [isinstance(i, Bandable) for i in info][:3] == [True, True, True]
    assert [g.name for g in comp.plan.groups] == ["conv1", "dw", "pw", "gap"]
    assert not _run_ok(comp.plan, 0, 1, info) and _run_ok(comp.plan, 0, 2, info)
    free_first, streams = order
    budget = limit * _model_work(comp)
    got = _greedy(comp.plan, info, _arena_and_area(comp.plan), budget, free_first, {}, streams, {})
    assert _summary(got) == _reference_states(comp.plan, info, budget, free_first, {}, streams)
    # with line buffers the run from conv1 (past the refused conv1..dw) is the one taken
    assert [r["groups"] for r in got[0][4]] == ([["conv1", "dw", "pw"]] if True in streams else [["dw", "pw"]])


@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_line_buffers_of_a_run_whose_heights_do_not_divide(rows):
    """15 rows, then a 3x3 window of stride 2 (8 rows): each layer's share of a band is a whole number of rows
    (15 x rows / 8 rounded up), and every row a layer computes is one its window can reach."""
    b = GraphBuilder("odd")
    x = b.input("x", (1, 1, 15, 8))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 4, 1, 3, 3), pads=[1, 1, 1, 1], name="c1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 4, 1, 3, 3), group=4, pads=[1, 1, 1, 1], strides=[2, 2],
                           name="d1"), name="r2")
    r3 = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 2, 4, 1, 1), name="p1"), name="r3")
    comp = plan_model(b.build(b.op("GlobalAveragePool", r3, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    assert info[1].output.shape[2] == 8
    sched = schedule(list(info[0:3]), rows, None, True)
    _check_ranges(sched)
    share = -(-rows * 15 // 8)
    for band in sched.bands:
        for step in band.steps:
            assert all(type(r) is int for r in step.rows)
        lo, hi = band.steps[0].rows
        assert hi - lo <= share
    assert sum(b.steps[0].rows[1] - b.steps[0].rows[0] for b in sched.bands) == 15
    assert max(b.steps[0].rows[1] - b.steps[0].rows[0] for b in sched.bands) == min(share, 15)
    # the strided layer computes a row only when its window's last input row is there
    done = 0
    for band in sched.bands:
        done = band.steps[0].rows[1]
        lo, hi = band.steps[1].rows
        if hi > lo and hi < 8:
            assert 2 * (hi - 1) - 1 + 3 <= done


def test_the_free_first_order_refuses_even_one_flop_of_recomputation(regions, monkeypatch):
    """Every schedule recomputing exactly 1 FLOP and lowering only the area: the free-first order takes none (it
    takes only runs that recompute nothing), and the lowest-arena order none either (the arena stays)."""
    comp, info = regions
    _stub(monkeypatch, lambda run, sched: (100, 5), allowed={(0, 1)})
    real = patch.schedule

    def one_flop(members, rows, scratch=None, stream=False):
        sched = real(members, rows, scratch, stream)
        sched.work_patched = sched.work_unpatched + 1.0
        return sched

    monkeypatch.setattr(patch, "schedule", one_flop)
    assert _greedy(comp.plan, info, (100, 10), 1e12, True, {}, (False, True), {}) == []


def test_choose_patches_tries_the_four_orders_and_keeps_the_first_best_state(regions, monkeypatch):
    """The orders of its docstring, in order: lowest arena then free-first, each with recomputed bands only and
    with line buffers too; among states of equal (arena, recomputation, runs) the first reached is kept."""
    comp, info = regions
    plans = {}
    calls = []

    def greedy(plan, info_, current, budget, free_first, scratch, streams, cache):
        calls.append((free_first, streams))
        sched = schedule(list(info_[0:2]), 8, None, True)
        made = merge_run(plan, 0, sched)
        plans[len(calls)] = made
        return [(current[0] - 10, 0.0, 1, made, [{**sched.describe(), "arena_estimate": current[0] - 10}])]

    monkeypatch.setattr(patch, "_greedy", greedy)
    monkeypatch.setattr(patch, "_prune", lambda plan, runs, arena: (plan, runs))
    monkeypatch.setattr(patch, "_polish", lambda plan, runs, arena, scratch: (plan, runs))
    chosen, report = choose_patches(comp.plan, 0.1)
    assert calls == ORDERS
    assert chosen is plans[1] and report.arena_after == report.arena_before - 10


def test_a_started_reader_that_idles_for_a_band_keeps_the_rows_it_needs_next():
    """A 3x3 window of stride 3 and padding 3 over 10 rows (5 out) in line buffers of one row: its producer's share
    of a band (2 rows) is below its stride, so in the fourth band the strided layer and the one after it compute
    nothing; the windows still hold what they read next."""
    b = GraphBuilder("idle")
    x = b.input("x", (1, 1, 10, 8))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 4, 1, 3, 3), pads=[1, 1, 1, 1], name="c1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 4, 4, 3, 3), pads=[3, 3, 3, 3], strides=[3, 3], name="c2"),
              name="r2")
    r3 = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 4, 4, 3, 3), pads=[1, 1, 1, 1], name="c3"), name="r3")
    comp = plan_model(b.build(b.op("GlobalAveragePool", r3, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    assert info[1].output.shape[2:] == (5, 4)
    sched = schedule(list(info[0:3]), 1, None, True)
    _check_ranges(sched)
    steps = [[band.steps[k].rows for k in range(3)] for band in sched.bands]
    idle = [i for i, s in enumerate(steps) if s[1][0] == s[1][1] and 0 < s[1][0] < 5]
    assert idle == [3] and steps[3][2][0] == steps[3][2][1]
    # in the idle band r1's window starts at the first row the strided layer's next output reads (row 3 of its
    # output: input rows 6-8, padding 3) and holds every row computed since
    r1 = next((lo, hi) for n, lo, hi in sched.bands[3].ranges if n == "r1")
    assert steps[3][1][0] == 3 and r1 == (3 * 3 - 3, steps[3][0][1])
