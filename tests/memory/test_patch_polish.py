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

import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.memory.patch import (PATCHED_KIND, Need, _polish, bandable, choose_patches, estimate_arena, merge_run,
                                 schedule)
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder
from test_patch_choose import _chain, _members, _w

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


def test_polish_of_a_run_after_an_unpatched_group_prefers_line_buffers_at_a_tie():
    """dw -> pw after conv1 (index 1): r1 is the run's input, read whole, so no band recomputes anything, in either
    mode; 8 rows make 2 bands in both, and at a tie the line buffers win. conv1 and gap stay."""
    comp, info = _chain()
    members = _members(info)[1:]
    old = schedule(members, 2)
    assert old.extra_work == 0 and len(old.bands) == 8
    plan = merge_run(comp.plan, 1, old)
    new_plan, new_runs = _polish(plan, [_run(old, 0)], HUGE, {})
    assert [g.name for g in new_plan.groups] == ["conv1", "patch_dw_pw", "gap"]
    assert new_plan.groups[0] is plan.groups[0] and new_plan.groups[2] is plan.groups[2]
    s = new_plan.groups[1].attrs["patch"]
    assert (s.stream, s.band_rows, len(s.bands), s.extra_work) == (True, 8, 2, 0)
    assert new_runs == [_run(s, HUGE)]


def test_polish_goes_down_to_bands_of_eight_pixels():
    """Under the arena of 2-row line buffers (8 pixels: the smallest band allowed) only they and recomputed bands
    of 2 or 3 rows fit; line buffers recompute nothing: 2 rows, 9 bands."""
    comp, info = _chain()
    members = _members(info)
    old = schedule(members, 2)
    plan = merge_run(comp.plan, 0, old)
    arena = estimate_arena(merge_run(comp.plan, 0, schedule(members, 2, stream=True)))
    assert estimate_arena(merge_run(comp.plan, 0, schedule(members, 3, stream=True))) > arena
    new_plan, _ = _polish(plan, [_run(old, 0)], arena, {})
    s = new_plan.groups[0].attrs["patch"]
    assert (s.stream, s.band_rows, len(s.bands), s.extra_work) == (True, 2, 9, 0)


def test_choose_patches_recomputes_when_the_budget_allows_it():
    """Recomputed bands need less arena than line buffers on this chain (a band of recomputed rows is freed before
    the next, line buffers keep each layer's window): with a budget of twice the model's work the chosen arena is
    below the line-buffered one a 1% budget gets, and its run recomputes."""
    comp, _ = _chain()
    _, cheap = choose_patches(comp.plan, 0.01)
    plan, rich = choose_patches(comp.plan, 2.0)
    assert rich.arena_after < cheap.arena_after
    assert any(not g.attrs["patch"].stream and g.attrs["patch"].extra_work > 0
               for g in plan.groups if g.kind == PATCHED_KIND)


def _chain_5x5():
    """The chain with a 5 x 5 depthwise window (pad 2): dw's row j reads r1 rows [j - 2, j + 3)."""
    b = GraphBuilder("chain5")
    x = b.input("x", (1, 1, 16, 4))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 5, 5), group=8, pads=[2, 2, 2, 2], name="dw"), name="r2")
    pw = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 2, 8, 1, 1), name="pw"), name="pw")
    comp = plan_model(b.build(b.op("GlobalAveragePool", pw, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    return [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups][:3]


def test_line_buffers_wait_for_a_wide_window_and_keep_the_rows_it_will_read():
    """2-row line buffers: conv1 computes [2k - 2, 2k); dw's row j needs r1 up to row j + 2, so in band 1 (r1 rows
    0, 1) it computes nothing, then [2k - 4, 2k - 2); a ninth band finishes it. r1's window holds from the lowest
    row dw reads now or next (row j - 2 of its next row j) to the last computed: in band 1, though dw is idle,
    rows 0 and 1, which it reads in band 2."""
    members = _chain_5x5()
    sched = schedule(members, 2, stream=True)
    assert [b.steps[0].rows for b in sched.bands] == [(a, a + 2) for a in range(0, 16, 2)] + [(16, 16)]
    assert [b.steps[1].rows for b in sched.bands] == [(0, 0)] + [(a, a + 2) for a in range(0, 16, 2)]
    assert not sched.bands[0].steps[1].needs
    r1 = [(lo, hi) for b in sched.bands for n, lo, hi in b.ranges if n == "r1"]
    assert r1 == [(0, 2), (0, 4), (0, 6), (2, 8), (4, 10), (6, 12), (8, 14), (10, 16), (12, 16)]


def test_line_buffered_needs_carry_their_padding_and_a_zero_band_height_is_refused():
    comp, info = _chain()
    members = _members(info)
    sched = schedule(members, 2, stream=True)
    # conv1's rows [0, 2) read x [-1, 3): one row of top pad; [2, 4) read [1, 5)
    assert sched.bands[0].steps[0].needs == (Need("x", 0, 3, 1, 0),)
    assert sched.bands[1].steps[0].needs == (Need("x", 1, 5, 0, 0),)
    # conv1's last rows [14, 16) read [13, 17): one row of bottom pad
    assert sched.bands[7].steps[0].needs == (Need("x", 13, 16, 0, 1),)
    with pytest.raises(ValueError, match="^a streamed run made no progress$"):
        schedule(members, 0, stream=True)


def test_polish_of_a_run_after_an_unpatched_group_under_its_exact_arena():
    """The same run under exactly the arena its best schedule (line buffers, 8 rows) needs: still chosen; the trial
    plan the arena is estimated on is conv1, the new run, gap."""
    comp, info = _chain()
    members = _members(info)[1:]
    plan = merge_run(comp.plan, 1, schedule(members, 2))
    best = schedule(members, 8, stream=True)
    arena = estimate_arena(merge_run(comp.plan, 1, best))
    new_plan, _ = _polish(plan, [_run(plan.groups[1].attrs["patch"], 0)], arena, {})
    s = new_plan.groups[1].attrs["patch"]
    assert (s.stream, s.band_rows, len(s.bands)) == (True, 8, 2)
