"""``memory.patch._polish`` (mutation testing, tests/MUTATION.md: no test made it change a run): it redoes each run
over the same layers with the least recomputation, then the fewest bands, keeping the estimated arena (its
docstring); among equal ones the line buffers, then the lowest band (the key it sorts by). Worked out by hand on
test_patch_choose.py's chain (conv1 -> dw -> pw, 16 rows of width 4; then a pool on the whole map).

Band heights tried: ceil(16 / n) for n = 2..16 = 8, 6, 4, 3, 2, 1, from the highest, down to the first below 8
pixels (1 row of 4): 8, 6, 4, 3, 2. Recomputed halos always cost conv1 rows again (extra work > 0); line buffers
none. Line-buffered bands (each layer's share is the band height h, dw's 3-row window one row behind conv1): h = 8:
conv1 [0, 8), [8, 16); dw [0, 7), [7, 15), [15, 16): 3 bands; h = 6: conv1 [0, 6), [6, 12), [12, 16); dw [0, 5),
[5, 11), [11, 16): 3 bands; h = 4: 5 bands; h = 3, 2: more."""
from __future__ import annotations

from opfuse.memory.patch import PATCHED_KIND, _polish, estimate_arena, merge_run, schedule
from test_patch_choose import _chain, _members

HUGE = 1 << 40


def _run(sched, arena: int) -> dict:
    return {**sched.describe(), "arena_estimate": arena}


def test_polish_replaces_recomputed_bands_by_the_line_buffers_of_fewest_bands_then_lowest():
    comp, info = _chain()
    members = _members(info)
    old = schedule(members, 2)  # recomputed halos: 8 bands, conv1 14 rows again
    plan = merge_run(comp.plan, 0, old)
    runs = [_run(old, 123), {"groups": ["elsewhere"], "bands": 1}]
    new_plan, new_runs = _polish(plan, runs, HUGE, {})
    assert [g.name for g in new_plan.groups] == ["patch_conv1_pw", "gap"]
    assert new_plan.graph is plan.graph and new_plan.groups[1] is plan.groups[1]
    g = new_plan.groups[0]
    assert g.kind == PATCHED_KIND and [n.name for n in g.nodes] == [n.name for n in plan.groups[0].nodes]
    s = g.attrs["patch"]
    assert s.stream and s.band_rows == 6 and s.extra_work == 0 and [m.group.name for m in s.members] == [
        "conv1", "dw", "pw"]
    assert [b.steps[0].rows for b in s.bands] == [(0, 6), (6, 12), (12, 16)]
    assert [b.steps[1].rows for b in s.bands] == [(0, 5), (5, 11), (11, 16)]
    # the run's report entry is the new schedule's, with the arena polished for; the others stay
    assert new_runs == [_run(s, HUGE), {"groups": ["elsewhere"], "bands": 1}]
    # polishing again changes nothing
    again, runs2 = _polish(new_plan, new_runs, HUGE, {})
    assert again is new_plan and runs2 is new_runs


def test_polish_keeps_a_run_when_no_other_fits_the_arena():
    comp, info = _chain()
    old = schedule(_members(info), 2)
    plan = merge_run(comp.plan, 0, old)
    runs = [_run(old, 0)]
    same, same_runs = _polish(plan, runs, 0, {})
    assert same is plan and same_runs is runs and same.groups[0].attrs["patch"] is old


def test_polish_takes_the_best_band_height_that_keeps_the_arena():
    """An arena that the 4-row line buffers keep: the higher bands (larger windows) do not; 4 rows beat 3 and 2 (5
    bands against more), and every recomputed schedule recomputes more than line buffers."""
    comp, info = _chain()
    members = _members(info)
    plan = merge_run(comp.plan, 0, schedule(members, 2))
    arena = estimate_arena(merge_run(comp.plan, 0, schedule(members, 4, stream=True)))
    assert estimate_arena(merge_run(comp.plan, 0, schedule(members, 6, stream=True))) > arena
    new_plan, _ = _polish(plan, [_run(plan.groups[0].attrs["patch"], 0)], arena, {})
    s = new_plan.groups[0].attrs["patch"]
    assert (s.stream, s.band_rows, len(s.bands)) == (True, 4, 5)


def test_polish_takes_recomputed_bands_when_only_they_keep_the_arena():
    """Recomputed bands of 3 rows need less arena than any line buffers here, and than recomputed bands of 4;
    under exactly their arena they replace the 2-row bands (6 bands recomputing less than 8): never the line
    buffers (too large) nor bands recomputing more."""
    comp, info = _chain()
    members = _members(info)
    old = schedule(members, 2)
    plan = merge_run(comp.plan, 0, old)

    def est(h, stream=False):
        return estimate_arena(merge_run(comp.plan, 0, schedule(members, h, stream=stream)))
    arena = est(3)
    assert min(est(h, True) for h in (8, 6, 4, 3, 2)) > arena and est(4) > arena and est(2) <= arena
    new_plan, _ = _polish(plan, [_run(old, 0)], arena, {})
    s = new_plan.groups[0].attrs["patch"]
    assert (s.stream, s.band_rows, len(s.bands)) == (False, 3, 6) and 0 < s.extra_work < old.extra_work
