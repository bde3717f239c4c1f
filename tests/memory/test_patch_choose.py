"""``memory.patch`` schedules and run choice without a compiler (mutation testing: tests/MUTATION.md): band
rows, work, workspace buffers and their layout for recomputed halos and for line buffers, and what
``choose_patches`` promises (module docstring), each expectation worked out by hand on one small chain.

The chain: x (1, 1, 16, 4) -> conv 3 x 3 to 8 channels + ReLU (``r1``) -> depthwise 3 x 3 + ReLU (``r2``)
-> pointwise to 2 channels + ReLU (``pw``) -> GlobalAveragePool. Row bytes: x 1*4*4 = 16, r1 and r2
8*4*4 = 128, pw 2*4*4 = 32. Unpatched, r1 and r2 (2048 bytes each) are both live at the depthwise
kernel: a 4096-byte arena (x is a graph input, the pooled output a graph output: neither in the arena)."""
from __future__ import annotations

import numpy as np
import pytest

from opfuse.compiler import CompileOptions, plan_model
from opfuse.ir.plan import FusionPlan
from opfuse.memory.patch import (
    MIN_BAND_PIXELS,
    PATCHED_KIND,
    Bandable,
    Need,
    PatchReport,
    _estimate,
    _prune,
    _run_ok,
    _workspace,
    bandable,
    choose_patches,
    estimate_arena,
    merge_run,
    schedule,
)
from opfuse.memory.plan import plan_memory
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder
from opfuse.ops.registry import get_spec


def _w(b, name, *shape):
    return b.const(name, (np.arange(np.prod(shape)) % 7 * 0.1 - 0.3).astype(np.float32).reshape(shape))


def _chain(r1_out: bool = False, r2_out: bool = False):
    b = GraphBuilder("chain")
    x = b.input("x", (1, 1, 16, 4))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw"), name="r2")
    pw = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 2, 8, 1, 1), name="pw"), name="pw")
    gap = b.op("GlobalAveragePool", pw, name="gap")
    graph = b.build(gap, *([r1] if r1_out else []), *([r2] if r2_out else []))
    comp = plan_model(graph, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert [g.name for g in comp.plan.groups] == ["conv1", "dw", "pw", "gap"]
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    return comp, info


@pytest.fixture(scope="module")
def chain():
    return _chain()


def _members(info) -> list[Bandable]:
    members = [m for m in info[:3] if isinstance(m, Bandable)]
    assert len(members) == 3
    return members


def test_recomputed_bands_of_two_rows(chain):
    """Bands of 2 output rows: pw and dw compute their 2 rows, conv1 the 4 rows dw's window reads ([a-1, a+3),
    3 at the top and bottom bands), x the 6 rows conv1's window reads ([a-2, a+4) clipped)."""
    _, info = chain
    members = _members(info)
    sched = schedule(members, 2)
    assert len(sched.bands) == 8 and [b.rows for b in sched.bands] == [(a, a + 2) for a in range(0, 16, 2)]
    assert [v.name for v in sched.inputs] == ["x"] and sched.output.name == "pw"
    assert [b.steps[0].rows for b in sched.bands] == [(max(a - 1, 0), min(a + 3, 16)) for a in range(0, 16, 2)]
    assert [b.steps[1].rows for b in sched.bands] == [(a, a + 2) for a in range(0, 16, 2)]
    # conv1's rows [0, 3) read x rows [-1, 4): one row of top pad; [13, 16) read [12, 17): one of bottom pad
    assert sched.bands[0].steps[0].needs[0] == Need("x", 0, 4, 1, 0)
    assert sched.bands[-1].steps[0].needs[0] == Need("x", 12, 16, 0, 1)
    assert sched.bands[3].steps[0].needs[0] == Need("x", 4, 10, 0, 0)
    # conv1 computes 3 + 6 * 4 + 3 = 30 rows instead of 16: 14 rows of its work again
    rows_work = [m.work_per_row for m in members]
    assert sched.work_unpatched == pytest.approx(16 * sum(rows_work))
    assert sched.extra_work == pytest.approx(14 * rows_work[0])
    assert sched.recompute == pytest.approx(14 * rows_work[0] / (16 * sum(rows_work)))
    assert not sched.stream and not sched.inplace  # x has 1 channel, pw 2: not the output's shape
    # band buffers: x 6 rows, r1 4, r2 2, pw 2; each from its producer (or first reader) to its last reader
    assert sched.buffers == {"v:x": 6 * 16, "v:r1": 4 * 128, "v:r2": 2 * 128, "v:pw": 2 * 32}
    assert sched.lifetimes == {"v:x": (0, 0), "v:r1": (0, 1), "v:r2": (1, 2), "v:pw": (2, 2)}
    # 64-byte aligned: 128, 512, 256, 64. r1 at 0; r2 (steps 1-2) beside it at 512; x (step 0) at 512 too;
    # pw (step 2, with r2 only) in the gap below r2: 0. The largest step (1): 512 + 256.
    offsets, total = sched.layout()
    assert offsets == {"v:r1": 0, "v:r2": 512, "v:x": 512, "v:pw": 0} and total == 768
    assert sched.workspace_bytes == 768
    # a step's kernel scratch joins the layout at its step: 1000 bytes (1024 aligned), the largest, at 0;
    # r1 (live at step 1 too) above it at 1024, r2 at 1536; x (step 0) and pw (step 2) fit below at 0
    offsets, total = sched.layout([0, 1000, 0])
    assert offsets == {"k1": 0, "v:r1": 1024, "v:r2": 1536, "v:x": 0, "v:pw": 0} and total == 1792
    assert schedule(members, 2, [0, 1000, 0]).workspace_bytes == 1792
    # one byte of scratch is scratch too (64 aligned): above r1 and r2 at step 1
    assert sched.layout([0, 1, 0]) == ({"v:r1": 0, "v:r2": 512, "v:x": 512, "k1": 768, "v:pw": 0}, 832)
    # 1024-byte alignment: every buffer takes 1024; r1 at 0, x and r2 (each live with r1) at 1024, pw with r2: 0
    assert sched.layout(alignment=1024) == ({"v:r1": 0, "v:x": 1024, "v:r2": 1024, "v:pw": 0}, 2048)
    assert sched.describe() == {
        "groups": ["conv1", "dw", "pw"], "band_rows": 2, "bands": 8, "output": "pw", "inputs": ["x"],
        "workspace_bytes": 768, "output_over_input": False, "line_buffers": False,
        "work_unpatched": round(16 * sum(rows_work)),
        "work_patched": round(30 * rows_work[0] + 16 * sum(rows_work[1:])),
        "recompute": round(14 * rows_work[0] / (16 * sum(rows_work)), 4)}


def test_line_buffered_bands_of_two_rows(chain):
    """Line buffers, bands of 2 rows: each layer's share is 2 rows (all have 16). conv1 computes [2k-2, 2k);
    dw's 3-row window then reaches row 2k-1 (one row below), pw follows dw; a ninth band finishes dw and pw.
    r1's window keeps [2k-4, 2k) (what dw reads next), r2's the rows pw reads, x's the rows conv1 reads."""
    _, info = chain
    members = _members(info)
    sched = schedule(members, 2, stream=True)
    assert len(sched.bands) == 9 and sched.stream
    conv_rows = [(a, a + 2) for a in range(0, 16, 2)] + [(16, 16)]
    dw_rows = [(0, 1)] + [(a, a + 2) for a in range(1, 15, 2)] + [(15, 16)]
    assert [b.steps[0].rows for b in sched.bands] == conv_rows
    assert [b.steps[1].rows for b in sched.bands] == dw_rows
    assert [b.steps[2].rows for b in sched.bands] == dw_rows
    assert [b.rows for b in sched.bands] == dw_rows
    assert not sched.bands[-1].steps[0].needs  # conv1 has nothing left to do
    ranges = {n: [] for n in ("x", "r1", "r2", "pw")}
    for band in sched.bands:
        for n, lo, hi in band.ranges:
            ranges[n].append((lo, hi))
    assert ranges["r1"] == [(0, 2), (0, 4), (2, 6), (4, 8), (6, 10), (8, 12), (10, 14), (12, 16), (14, 16)]
    assert ranges["r2"] == dw_rows and ranges["pw"] == dw_rows
    # x: conv1's rows [2k-2, 2k) read [2k-3, 2k+1); the last band reads nothing and keeps the last range
    assert ranges["x"] == [(0, 3)] + [(a - 1, min(a + 3, 16)) for a in range(2, 16, 2)] + [(13, 16)]
    assert sched.extra_work == 0 and sched.work_patched == sched.work_unpatched
    assert sched.buffers == {"t:r1": 2 * 128, "v:r1": 4 * 128, "t:r2": 2 * 128, "v:r2": 2 * 128,
                             "t:pw": 2 * 32, "v:x": 4 * 16}
    assert sched.lifetimes == {"t:r1": (0, 0), "v:r1": (0, 2), "t:r2": (1, 1), "v:r2": (0, 2),
                               "t:pw": (2, 2), "v:x": (0, 0)}
    # 512 at 0; the 256s by start, then name: t:r1 512, v:r2 768, t:r2 (step 1) in t:r1's place 512;
    # the 64s: x (step 0, above all three) 1024, t:pw (step 2) in the gap 512..768
    offsets, total = sched.layout()
    assert offsets == {"v:r1": 0, "t:r1": 512, "v:r2": 768, "t:r2": 512, "v:x": 1024, "t:pw": 512}
    assert total == 1088 == sched.workspace_bytes
    assert sched.describe()["line_buffers"] is True and sched.describe()["recompute"] == 0


def test_estimate_is_the_arena_with_scratch_and_the_bytes_live_over_kernels(chain):
    comp, _ = chain
    memory = plan_memory(comp.plan)
    # r1 live at conv1 and dw, r2 at dw and pw, pw at pw and gap
    assert _estimate(memory, [0, 0, 0, 0]) == (4096, 2 * 2048 + 2 * 2048 + 2 * 512)
    # 100 bytes of scratch at dw go above r1 and r2 (128 aligned); the area counts the 100 bytes as asked
    assert _estimate(memory, [0, 100, 0, 0]) == (4096 + 128, 9216 + 100)
    assert estimate_arena(comp.plan) == 4096
    assert all(_workspace(g) == 0 for g in comp.plan.groups)


def test_a_merged_run_counts_its_workspace_as_scratch(chain):
    """The whole chain as one run, 2-row bands: pw's 512 bytes (live at the run and the pool) and the run's
    768-byte workspace beside them: 1280."""
    comp, info = chain
    sched = schedule(_members(info), 2)
    plan = merge_run(comp.plan, 0, sched)
    assert [_workspace(g) for g in plan.groups] == [768, 0]
    assert estimate_arena(plan) == 512 + 768


def test_a_run_ends_where_a_tensor_leaves_it():
    """r1 is also a graph output: conv1 can end a run but not sit inside one."""
    comp, info = _chain(r1_out=True)
    assert not _run_ok(comp.plan, 0, 1, info) and not _run_ok(comp.plan, 0, 2, info)
    assert _run_ok(comp.plan, 1, 2, info)
    comp, info = _chain()
    assert _run_ok(comp.plan, 0, 1, info) and _run_ok(comp.plan, 0, 2, info) and _run_ok(comp.plan, 1, 2, info)
    # pw's output is read by the pool: inside groups 1-3, outside 1-2 (where pw ends the run: allowed)
    assert _run_ok(comp.plan, 1, 3, info) and _run_ok(comp.plan, 2, 3, info)


@pytest.mark.parametrize("out", ["r1", "r2"])
def test_a_tensor_read_outside_keeps_its_layers_out_of_a_run(out):
    """A graph output may end a run, never sit inside one (its producer is conv1 for r1, dw for r2)."""
    comp, _ = _chain(r1_out=out == "r1", r2_out=out == "r2")
    chosen, report = choose_patches(comp.plan, 0.5)
    producer = {"r1": "conv1", "r2": "dw"}[out]
    assert report.runs
    for run in report.runs:
        assert producer not in run["groups"][:-1]
    for g in chosen.groups:
        if g.kind == PATCHED_KIND:
            assert producer not in [m.group.name for m in g.attrs["patch"].members][:-1]


def test_a_run_of_two_groups():
    """conv1 -> depthwise -> pool: r1 and r2 (2048 bytes each) live at once unpatched; a run over the two
    layers keeps only r2 whole (2048) beside its workspace."""
    b = GraphBuilder("two")
    x = b.input("x", (1, 1, 16, 4))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw"), name="r2")
    comp = plan_model(b.build(b.op("GlobalAveragePool", r2, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert [g.name for g in comp.plan.groups] == ["conv1", "dw", "gap"]
    plan, report = choose_patches(comp.plan, 0.5)
    assert [r["groups"] for r in report.runs] == [["conv1", "dw"]]
    assert report.arena_before == 4096 and report.arena_after == 2048 + plan.groups[0].attrs["patch"].workspace_bytes


def test_no_budget_no_runs(chain):
    comp, _ = chain
    plan, report = choose_patches(comp.plan, 0.0)
    assert plan is comp.plan and report.runs == []
    assert report.arena_before == report.arena_after == 4096
    assert report.stops == [{"group": "gap", "reason": "GlobalAveragePool 'gap' needs the whole feature map"}]
    assert report.to_json()["recompute_of_model"] == 0.0


def _model_work(comp) -> float:
    return float(sum(get_spec(n.op_type, n).flops(n) for n in comp.graph.nodes))


def _undo(plan: FusionPlan, i: int) -> FusionPlan:
    sched = plan.groups[i].attrs["patch"]
    return FusionPlan(plan.graph, plan.groups[:i] + [m.group for m in sched.members] + plan.groups[i + 1:])


@pytest.mark.parametrize("limit", [0.01, 0.5, 2.0])
def test_chosen_runs_keep_the_promises_of_the_docstring(chain, limit):
    comp, info = chain
    plan, report = choose_patches(comp.plan, limit)
    patched = [(i, g) for i, g in enumerate(plan.groups) if g.kind == PATCHED_KIND]
    assert patched and report.runs
    # the report describes the plan that runs
    assert report.arena_before == 4096 and report.arena_after == estimate_arena(plan) < 4096
    assert report.model_work == pytest.approx(_model_work(comp)) and report.recompute_limit == limit
    assert [r["groups"] for r in report.runs] == [[m.group.name for m in g.attrs["patch"].members]
                                                  for _, g in patched]
    for run, (_, g) in zip(report.runs, patched, strict=True):
        sched = g.attrs["patch"]
        assert run == {**sched.describe(), "arena_estimate": report.arena_after}
    extra = sum(g.attrs["patch"].extra_work for _, g in patched)
    assert report.extra_work == pytest.approx(extra) and extra <= limit * report.model_work + 1e-9
    js = report.to_json()
    assert js == {"recompute_limit": limit, "arena_before_estimate": 4096, "arena_after_estimate": report.arena_after,
                  "recompute_of_model": round(extra / _model_work(comp), 4), "runs": report.runs,
                  "stops": [{"group": "gap", "reason": "GlobalAveragePool 'gap' needs the whole feature map"}]}
    # a run over the whole chain: pw plus the workspace beside it
    (i, g), = patched
    assert i == 0 and [m.group.name for m in g.attrs["patch"].members] == ["conv1", "dw", "pw"]
    assert report.arena_after == 512 + g.attrs["patch"].workspace_bytes
    # pruned: undoing the run raises the arena again
    assert estimate_arena(_undo(plan, i)) > report.arena_after
    # polished: no other band height or mode over the same layers recomputes less (or as little in fewer
    # bands) and keeps the arena
    chosen = g.attrs["patch"]
    members = chosen.members
    width = members[-1].output.shape[3]
    for rows in range(1, 17):
        if rows * width < MIN_BAND_PIXELS:
            continue
        for stream in (False, True):
            try:
                other = schedule(members, rows, stream=stream)
            except ValueError:
                continue
            trial = merge_run(_undo(plan, i), 0, other)
            if estimate_arena(trial) <= report.arena_after:
                assert (other.extra_work, len(other.bands)) >= (chosen.extra_work, len(chosen.bands))
    # deterministic
    again, report2 = choose_patches(comp.plan, limit)
    assert report2.to_json() == js and [x.name for x in again.groups] == [x.name for x in plan.groups]


def test_a_small_budget_takes_line_buffers(chain):
    """Recomputed halos cost conv1 at least 2 rows of 16 (an eighth of its work, a few % of the model's): under
    a 1% budget only line buffers (nothing recomputed) fit."""
    comp, _ = chain
    plan, report = choose_patches(comp.plan, 0.01)
    (run,) = report.runs
    assert run["line_buffers"] is True and run["recompute"] == 0 and run["work_patched"] == run["work_unpatched"]
    assert report.to_json()["recompute_of_model"] == 0.0


def test_report_without_model_work():
    report = PatchReport(0.5, 0.0, 10, 10)
    assert report.extra_work == 0 and report.to_json()["recompute_of_model"] == 0.0
    report.runs.append({"work_patched": 30.0, "work_unpatched": 20.0})
    assert report.extra_work == 10.0
    report.model_work = 40.0
    assert report.to_json()["recompute_of_model"] == 0.25


def test_a_run_after_a_group_that_needs_the_whole_map():
    """A Softmax over the channels (not bandable) before the chain: the run starts after it, at conv1."""
    b = GraphBuilder("soft")
    x = b.op("Softmax", b.input("x", (1, 1, 16, 4)), axis=1, name="soft")
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw"), name="r2")
    pw = b.op("Relu", b.op("Conv", r2, _w(b, "w3", 2, 8, 1, 1), name="pw"), name="pw")
    comp = plan_model(b.build(b.op("GlobalAveragePool", pw, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert [g.name for g in comp.plan.groups] == ["soft", "conv1", "dw", "pw", "gap"]
    plan, report = choose_patches(comp.plan, 0.5)
    assert [r["groups"] for r in report.runs] == [["conv1", "dw", "pw"]]
    assert report.arena_before == 4096 and report.arena_after < 4096
    assert plan.groups[0].name == "soft" and plan.groups[1].kind == PATCHED_KIND


def test_a_residual_read_by_the_next_group_keeps_its_producer_out_of_a_shorter_run():
    """r1 is added back after the pointwise layer (in the pool's group): a run conv1..pw would leave r1 read
    outside it (by the group just after); groups 0..3 hold every reader."""
    b = GraphBuilder("res")
    x = b.input("x", (1, 1, 16, 4))
    r1 = b.op("Relu", b.op("Conv", x, _w(b, "w1", 8, 1, 3, 3), pads=[1, 1, 1, 1], name="conv1"), name="r1")
    r2 = b.op("Relu", b.op("Conv", r1, _w(b, "w2", 8, 1, 3, 3), group=8, pads=[1, 1, 1, 1], name="dw"), name="r2")
    y = b.op("Add", b.op("Conv", r2, _w(b, "w3", 8, 8, 1, 1), name="pw"), r1, name="add")
    comp = plan_model(b.build(b.op("GlobalAveragePool", y, name="gap")),
                      CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    assert [[n.name for n in g.nodes] for g in comp.plan.groups] == [["conv1", "r1"], ["dw", "r2"], ["pw"],
                                                                     ["add", "gap"]]
    info = [bandable(g, comp.graph, static_values(comp.graph)) for g in comp.plan.groups]
    assert not _run_ok(comp.plan, 0, 1, info) and not _run_ok(comp.plan, 0, 2, info)
    assert _run_ok(comp.plan, 0, 3, info) and _run_ok(comp.plan, 1, 2, info) and _run_ok(comp.plan, 1, 3, info)


def test_prune_undoes_a_run_that_the_arena_does_not_need(chain):
    """``_prune`` undoes a run whose undoing keeps the arena it is given, and keeps one that lowers it."""
    comp, info = chain
    sched = schedule(_members(info)[1:], 2)  # dw..pw, at index 1
    plan = merge_run(comp.plan, 1, sched)
    runs = [{**sched.describe(), "arena_estimate": 0}]
    assert [g.name for g in plan.groups] == ["conv1", "patch_dw_pw", "gap"]
    lowered = estimate_arena(plan)
    assert lowered < 4096
    # the arena asked for is the unpatched one (4096): the run is not needed
    pruned, left = _prune(plan, runs, 4096)
    assert [g.name for g in pruned.groups] == ["conv1", "dw", "pw", "gap"] and left == []
    assert all(a is b for a, b in zip(pruned.groups, comp.plan.groups, strict=True))
    # the arena the run gives: undoing it would go back to 4096
    kept, left = _prune(plan, runs, lowered)
    assert kept is plan and left == runs
