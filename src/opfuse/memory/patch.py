"""Patch-based execution: a run of spatial layers computed one band of output rows at a time.

The layer-by-layer bound (the most bytes live at one kernel) is where a plan that materialises
every tensor stops. MCUNetV2 goes below it by running the first, largest layers per spatial
tile: band ``i`` of the run's last output needs a band of rows (plus halo) of each earlier
layer's output, and only those bands exist at once. Overlapping halo rows are recomputed per
band; that is the price, reported as extra multiply-accumulates.

Here the tiles are row bands (axis 2 of NCHW tensors; the full width is kept). A *run* is a
sequence of consecutive groups of the fusion plan, each *bandable*:

* every node is a Conv or a MaxPool/AveragePool (a *window* along the rows: effective kernel,
  stride, top pad) or a pointwise op, with at most one window per group;
* every non-constant input and the (single) output are 4-D and keep their width through
  pointwise ops; a pointwise input has the output's rows.

An op that needs the whole feature map (GlobalAveragePool, a global AveragePool, Softmax,
Flatten, Gemm, Resize, a reduction, ...) is not bandable: it ends the run, and the reason is
recorded (``PatchReport.stops``). A run has one output (its last group's): every other tensor
it produces is read only inside it.

Rows: output rows ``[a, e)`` of a window with kernel ``k``, stride ``s`` and top pad ``p`` need
input rows ``[a*s - p, (e-1)*s - p + k)``, clipped to the input; what was clipped becomes the
band's own top/bottom pad, so each band computes exactly what the whole layer computes for
those rows, element by element in the same order (the outputs are bit-identical). A tensor
read by several groups of the run (a residual) holds the hull of their needs.

Line buffers (``schedule(stream=True)``) trade memory for the recomputation: every layer computes,
band after band, only rows no earlier band computed (at most its share of the band, so the first
bands fill the pipeline a few rows at a time), into a temporary; each tensor keeps a window of rows,
from the lowest one a reader will still need to the last one computed, which slides down band
after band. Nothing is recomputed; the windows live across bands. Where the input and the output
of a run have one shape and no later band reads rows already written, the output is written over
the input (each band's rows go out once the next band has copied its input rows): depthwise ->
pointwise pairs then need no second full tensor.

The workspace of one band (band buffers or windows of the run's tensors, temporaries, staging
copies of rows of the run's inputs and of tensors whose reader needs fewer rows than the buffer
holds) is laid out like an arena over the run's steps (``assign_offsets``); the run is one kernel
of the outer plan whose scratch is that workspace (``memory.scratch`` places it inside the
microcontroller's arena).

``choose_patches`` picks runs, band heights and the mode: the smallest estimated arena (tensors of
the outer plan plus the workspace, placed as scratch), subject to the extra multiply-accumulates
of all runs staying within ``recompute_limit`` (a fraction of the whole model's; see
``CompileOptions.patch_recompute_limit``); ties go to less recomputation, then to the shorter
run, then to the earlier one. Deterministic: every walk is over the plan's order.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.ir.walk import ancestors_within
from opfuse.memory.arena import ARENA_ALIGNMENT, Buffer, assign_offsets
from opfuse.memory.plan import MemoryPlan, plan_memory
from opfuse.memory.scratch import place_scratch
from opfuse.memory.static import static_values
from opfuse.ops.nn import window_geometry
from opfuse.ops.registry import get_spec, is_supported

PATCHED_KIND = "patched"
WINDOW_OPS = frozenset({"Conv", "MaxPool", "AveragePool"})
# The longest run considered (groups): beyond it halos grow past any saving.
MAX_RUN_GROUPS = 10
# A band holds at least this many output pixels (rows x width) of the run's output: below it the
# kernels run mostly on the edges of their register blocks (4 x 4 on the Cortex-M7) and every band
# pays its calls and copies. Measured under QEMU on ds_cnn's depthwise->pointwise pairs (width 5):
# bands of 5 pixels cost +42.6% instructions over the unpatched model for a 37.7 KiB arena, of 10
# pixels +16% for 41.4 KiB, of 20 pixels +1.4% for 49.1 KiB.
MIN_BAND_PIXELS = 8


@dataclass(frozen=True)
class RowMap:
    """How rows of a group's output depend on rows of one of its inputs."""

    kernel: int = 1   # effective kernel along the rows ((k - 1) * dilation + 1)
    stride: int = 1
    pad: int = 0      # top pad
    rows: int = 0     # the input's rows

    def need(self, a: int, e: int) -> tuple[int, int, int, int]:
        """``(lo, hi, top pad, bottom pad)``: input rows ``[lo, hi)`` for output rows ``[a, e)``."""
        lo = a * self.stride - self.pad
        hi = (e - 1) * self.stride - self.pad + self.kernel
        return max(lo, 0), min(hi, self.rows), max(0, -lo), max(0, hi - self.rows)


@dataclass(frozen=True)
class Bandable:
    """A group that can run on a band of output rows."""

    group: FusionGroup
    output: Value
    inputs: tuple[tuple[Value, RowMap], ...]  # non-constant inputs, in group order
    window: Node | None
    work_per_row: float                        # flops per output row
    window_input: int = -1                     # which of ``inputs`` the window reads (-1: none)


def _row_bytes(v: Value) -> int:
    return v.nbytes // v.shape[2]


def bandable(group: FusionGroup, graph: Graph, static: dict) -> Bandable | str:
    """The group's row maps, or why it cannot run on a band of rows."""
    live = [n for n in group.nodes if not all(id(v) in static for v in n.outputs)]
    outs = [v for v in group.outputs(graph) if id(v) not in static]
    if not live or len(outs) != 1:
        return "a group with several outputs" if outs else "a group with no run-time output"
    out = outs[0]
    windows = []
    for n in live:
        if n.op_type in WINDOW_OPS:
            if n.op_type != "Conv" and int(n.attrs.get("ceil_mode", 0)):
                return f"{n.op_type} '{n.name}' has ceil_mode=1"
            x = n.input(0)
            if len(x.shape) != 4:
                return f"{n.op_type} '{n.name}' is not 2-D"
            if n.op_type != "Conv" and x.shape[2] > 1 and _kernel(n)[0] >= x.shape[2]:
                return f"{n.op_type} '{n.name}' pools the whole feature map"
            windows.append(n)
        elif not is_supported(n.op_type) or not get_spec(n.op_type, n).is_pointwise:
            return f"{n.op_type} '{n.name}' needs the whole feature map"
    if len(windows) > 1:
        return "two windowed ops in one group"
    if len(out.shape) != 4:
        return f"output '{out.name}' is not 4-D"
    window = windows[0] if windows else None
    ids = group.node_ids()
    upstream: set[int] = set()
    if window is not None:
        upstream = {id(window)} | ancestors_within(window, ids)
    inputs: list[tuple[Value, RowMap]] = []
    window_input = -1
    for v in group.inputs():
        if id(v) in static:
            continue
        if len(v.shape) != 4:
            return f"input '{v.name}' is not 4-D"
        readers = [u for u, _ in v.uses if id(u) in ids]
        through = [u for u in readers if id(u) in upstream]
        if through and len(through) != len(readers):
            return f"input '{v.name}' is read both before and after the window"
        if through:
            assert window is not None
            x = window.input(0)
            if v.shape[2:] != x.shape[2:] or window.outputs[0].shape[2:] != out.shape[2:]:
                return f"input '{v.name}' changes shape before the window"
            geo = geometry(window)
            eff = (geo.kernel[0] - 1) * geo.dilations[0] + 1
            window_input = len(inputs)
            inputs.append((v, RowMap(eff, geo.strides[0], geo.pads_begin[0], x.shape[2])))
        else:
            if v.shape[2:] != out.shape[2:]:
                return f"input '{v.name}' is broadcast along the rows"
            inputs.append((v, RowMap(1, 1, 0, v.shape[2])))
    if not inputs:
        return "no run-time input"
    if any(not _bandable_type(v.dtype) for v, _ in inputs) or not _bandable_type(out.dtype):
        return "neither floating point nor 8-bit"
    work = sum(get_spec(n.op_type, n).flops(n) for n in live)
    return Bandable(group, out, tuple(inputs), window, work / out.shape[2], window_input)


def _bandable_type(dtype) -> bool:
    """Float tensors, and the 8-bit ones of a quantized model (its readers dequantize them in the band)."""
    return np.issubdtype(dtype, np.floating) or np.dtype(dtype) in (np.dtype(np.int8), np.dtype(np.uint8))


def _kernel(node: Node) -> tuple[int, ...]:
    if node.op_type == "Conv":
        return tuple(node.input(1).shape[2:])
    return tuple(int(k) for k in node.attrs["kernel_shape"])


def geometry(node: Node):
    a = get_spec(node.op_type, node).attrs_of(node)
    """The window of a Conv or pool node (``ops.nn.window_geometry``)."""
    return window_geometry(node, a, tuple(node.input(0).shape[2:]), _kernel(node),
                           ceil_mode=bool(int(a.get("ceil_mode", 0) or 0)))


# Schedules -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Need:
    """What group ``step`` of a run reads of input ``value`` for one band."""

    value: str
    lo: int
    hi: int
    pad_top: int
    pad_bottom: int


@dataclass(frozen=True)
class BandStep:
    rows: tuple[int, int]        # the group's output rows
    needs: tuple[Need, ...]      # one per Bandable.inputs entry


@dataclass(frozen=True)
class Band:
    rows: tuple[int, int]                         # rows of the run's output
    steps: tuple[BandStep, ...]                   # one per group of the run
    ranges: tuple[tuple[str, int, int], ...]      # (value, lo, hi): rows its band buffer holds


@dataclass
class PatchSchedule:
    """One run, cut into bands of ``band_rows`` output rows."""

    members: list[Bandable]
    band_rows: int
    bands: list[Band]
    inputs: list[Value]          # the run's inputs (tensors read in full from outside the run)
    output: Value
    work_unpatched: float
    work_patched: float
    # The output may take the input's bytes: band i's rows are written out after band i + 1 has copied its
    # input rows, and no later band reads them (one run input, of the output's shape, read first by step 0).
    inplace: bool = False
    stream: bool = False     # line buffers: nothing recomputed (``schedule``)
    step_scratch: list[int] = field(default_factory=list)  # estimated kernel scratch per layer
    buffers: dict[str, int] = field(default_factory=dict)  # workspace buffer -> bytes (max over bands)
    lifetimes: dict[str, tuple[int, int]] = field(default_factory=dict)  # buffer -> steps
    _workspace: int | None = field(default=None, repr=False)

    @property
    def extra_work(self) -> float:
        return self.work_patched - self.work_unpatched

    @property
    def recompute(self) -> float:
        """Extra work of the run as a fraction of its unpatched work."""
        return self.extra_work / self.work_unpatched if self.work_unpatched else 0.0

    def staged(self, step: int, need: Need) -> bool:
        """Whether group ``step`` reads ``need`` from a staging copy rather than the band buffer."""
        return f"s{step}:{need.value}" in self.buffers

    def layout(self, step_scratch: list[int] | None = None,
               alignment: int = ARENA_ALIGNMENT) -> tuple[dict[str, int], int]:
        """Offsets of the workspace buffers (and ``k{step}`` for each step's kernel scratch)."""
        bufs = [Buffer(k, n, *self.lifetimes[k]) for k, n in self.buffers.items()]
        for step, n in enumerate(step_scratch or []):
            if n > 0:
                bufs.append(Buffer(f"k{step}", n, step, step))
        return assign_offsets(bufs, alignment)

    @property
    def workspace_bytes(self) -> int:
        """The workspace with the estimated kernel scratch (codegen lays it out with the real one)."""
        if self._workspace is None:
            self._workspace = self.layout(self.step_scratch)[1]
        return self._workspace

    def describe(self) -> dict:
        return {"groups": [m.group.name for m in self.members], "band_rows": self.band_rows,
                "bands": len(self.bands), "output": self.output.name,
                "inputs": [v.name for v in self.inputs], "workspace_bytes": self.workspace_bytes,
                "output_over_input": self.inplace, "line_buffers": self.stream,
                "work_unpatched": round(self.work_unpatched), "work_patched": round(self.work_patched),
                "recompute": round(self.recompute, 4)}


def schedule(members: list[Bandable], band_rows: int, step_scratch: list[int] | None = None,
             stream: bool = False) -> PatchSchedule:
    """Bands of ``band_rows`` rows of the run's output, their needs and the workspace buffers
    (``step_scratch``: an estimate of each layer's kernel scratch, for ``workspace_bytes``).

    ``stream``: no row is computed twice. Each layer computes only the rows no earlier band did, into
    a temporary; the tensor's buffer is a window of rows that slides down band after band (the rows
    its readers still need move to its top, the new ones are appended): a line buffer per tensor.
    Windows live across bands, so the workspace is larger than with recomputed halos."""
    out = members[-1].output
    height = out.shape[2]
    produced = {m.output.name: k for k, m in enumerate(members)}
    values: dict[str, Value] = {}
    for m in members:
        values[m.output.name] = m.output
        for v, _ in m.inputs:
            values.setdefault(v.name, v)
    run_inputs = [values[n] for n in values if n not in produced]
    bands = _stream_bands(members, values, band_rows) if stream else []
    for a in range(0, height if not stream else 0, band_rows):
        e = min(a + band_rows, height)
        ranges: dict[str, tuple[int, int]] = {out.name: (a, e)}
        steps: list[BandStep] = []
        for m in reversed(members):
            lo_o, hi_o = ranges[m.output.name]
            needs = []
            for v, rm in m.inputs:
                lo, hi, pt, pb = rm.need(lo_o, hi_o)
                needs.append(Need(v.name, lo, hi, pt, pb))
                old = ranges.get(v.name)
                ranges[v.name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
            steps.append(BandStep((lo_o, hi_o), tuple(needs)))
        steps.reverse()
        bands.append(Band((a, e), tuple(steps), tuple((n, *ranges[n]) for n in values)))
    work_un = sum(m.work_per_row * m.output.shape[2] for m in members)
    work_p = sum(m.work_per_row * (b.steps[k].rows[1] - b.steps[k].rows[0])
                 for b in bands for k, m in enumerate(members))
    # A layer's scratch on a band (packed panels bounded by the tile sizes, padded planes) is at most
    # the whole layer's: that is the estimate (codegen lays the workspace out with the real sizes).
    sched = PatchSchedule(members, band_rows, bands, run_inputs, out, work_un, work_p,
                          step_scratch=list(step_scratch or []), stream=stream)
    # Workspace: a band buffer per tensor (from its producing step, or the first reader for a run
    # input, to its last reader) and a staging copy where a reader needs fewer rows than the hull.
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, m in enumerate(members):
        for v, _ in m.inputs:
            first.setdefault(v.name, k)
            last[v.name] = k
    whole = (0, len(members) - 1)
    for name, v in values.items():
        rows = max(r[2] - r[1] for b in bands for r in b.ranges if r[0] == name)
        start = produced.get(name, first.get(name, 0))
        if stream and name in produced:
            k = produced[name]
            new = max(b.steps[k].rows[1] - b.steps[k].rows[0] for b in bands)
            sched.buffers[f"t:{name}"] = new * _row_bytes(v)
            sched.lifetimes[f"t:{name}"] = (k, k)
            if name == out.name:
                continue
            sched.lifetimes[f"v:{name}"] = whole  # the window keeps rows for the next band
        else:
            sched.lifetimes[f"v:{name}"] = (start, last.get(name, len(members) - 1))
        sched.buffers[f"v:{name}"] = rows * _row_bytes(v)
    sched.inplace = _inplace_ok(sched, first)
    if sched.inplace:  # the output band waits in the workspace for the next band's input copy
        sched.lifetimes[f"{'t' if stream else 'v'}:{out.name}"] = whole
    for k, m in enumerate(members):
        for j, (v, _) in enumerate(m.inputs):
            staged = [b for b in bands if b.steps[k].needs
                      and _range(b, v.name) != (b.steps[k].needs[j].lo, b.steps[k].needs[j].hi)]
            if staged:
                rows = max(b.steps[k].needs[j].hi - b.steps[k].needs[j].lo for b in bands if b.steps[k].needs)
                sched.buffers[f"s{k}:{v.name}"] = rows * _row_bytes(v)
                sched.lifetimes[f"s{k}:{v.name}"] = (k, k)
    return sched


def _stream_bands(members: list[Bandable], values: dict[str, Value], band_rows: int) -> list[Band]:
    """Bands of a streamed run: every layer computes, band after band, the rows its inputs allow, at
    most its share of ``band_rows`` output rows (so the first bands fill the pipeline a few rows at a
    time and the output starts later); a tensor's window holds the rows from the lowest one a reader
    will still need to the last one computed."""
    out = members[-1].output
    height = out.shape[2]
    cap = {m.output.name: -(-band_rows * m.output.shape[2] // height) for m in members}
    done = {m.output.name: 0 for m in members}
    readers: dict[str, list[tuple[Bandable, RowMap]]] = {}
    for m in members:
        for v, rm in m.inputs:
            readers.setdefault(v.name, []).append((m, rm))
    window: dict[str, tuple[int, int]] = {n: (0, 0) for n in values}
    bands: list[Band] = []
    while done[out.name] < height:
        before = dict(done)
        steps: list[BandStep] = []
        for m in members:
            name, rows = m.output.name, m.output.shape[2]
            reach = rows
            for v, rm in m.inputs:
                avail = done.get(v.name, v.shape[2])
                if avail < v.shape[2]:
                    reach = min(reach, max(0, (avail + rm.pad - rm.kernel) // rm.stride + 1))
            lo_new = done[name]
            hi_new = max(lo_new, min(rows, lo_new + cap[name], reach))
            needs = []
            if hi_new > lo_new:
                for v, rm in m.inputs:
                    lo, hi, pt, pb = rm.need(lo_new, hi_new)
                    needs.append(Need(v.name, lo, hi, pt, pb))
            steps.append(BandStep((lo_new, hi_new), tuple(needs)))
            done[name] = hi_new
        # Only a band height of 0 stops here: with one row or more, the first unfinished layer has every input
        # row it needs (its producers are finished; the first layer reads only the run's inputs) and advances.
        if done == before:
            raise ValueError("a streamed run made no progress")
        for name in values:
            needs_now = [n for st in steps for n in st.needs if n.value == name]
            if name == out.name:
                window[name] = (before[name], done[name])
            elif name not in done:  # a run input: copied whole from its tensor, band by band
                if needs_now:
                    window[name] = (min(n.lo for n in needs_now), max(n.hi for n in needs_now))
            else:  # from the lowest row a reader will still need (after this band) to the last computed
                future = [rm.need(before[m.output.name], before[m.output.name] + 1)[0]
                          for m, rm in readers.get(name, []) if before[m.output.name] < m.output.shape[2]]
                lo = min(future + [n.lo for n in needs_now], default=done[name])
                window[name] = (max(window[name][0], min(lo, done[name])), done[name])
        bands.append(Band(window[out.name], tuple(steps), tuple((n, *window[n]) for n in values)))
    return bands


def _inplace_ok(sched: PatchSchedule, first: dict[str, int]) -> bool:
    if len(sched.inputs) != 1:
        return False
    x, out = sched.inputs[0], sched.output
    if x.shape != out.shape or x.dtype != out.dtype or first[x.name] != 0:
        return False
    if any(not b.steps[0].needs for b in sched.bands):  # every band must copy its input at step 0
        return False
    bands = sched.bands
    for i, band in enumerate(bands):
        a, e = band.rows
        for later in bands[i + 2:]:
            lo, hi = _range(later, x.name)
            if lo < e and a < hi:
                return False
    return True


def _range(band: Band, name: str) -> tuple[int, int]:
    return next((lo, hi) for n, lo, hi in band.ranges if n == name)


# Choosing runs -------------------------------------------------------------------------------

@dataclass
class PatchReport:
    """What ``choose_patches`` decided: the runs it made, and why each run stops where it does."""

    recompute_limit: float
    model_work: float
    arena_before: int = 0        # estimated arena (tensors) without patching
    arena_after: int = 0         # estimated arena: tensors plus the runs' workspaces
    runs: list[dict] = field(default_factory=list)
    stops: list[dict] = field(default_factory=list)   # {"group", "reason"} of every non-bandable group

    @property
    def extra_work(self) -> float:
        return sum(r["work_patched"] - r["work_unpatched"] for r in self.runs)

    def to_json(self) -> dict:
        return {"recompute_limit": self.recompute_limit, "arena_before_estimate": self.arena_before,
                "arena_after_estimate": self.arena_after,
                "recompute_of_model": round(self.extra_work / self.model_work, 4) if self.model_work else 0.0,
                "runs": self.runs, "stops": self.stops}


def merge_run(plan: FusionPlan, start: int, sched: PatchSchedule) -> FusionPlan:
    """``plan`` with groups ``start .. start + len(run) - 1`` merged into one patched group."""
    members = sched.members
    nodes = [n for m in members for n in m.group.nodes]
    name = f"patch_{members[0].group.name}_{members[-1].group.name}"
    attrs: dict = {"rule": "patch", "patch": sched}
    if sched.inplace:
        attrs["inplace_pairs"] = [(sched.inputs[0], sched.output)]
    group = FusionGroup(name, nodes, PATCHED_KIND, members[0].group.anchor, attrs)
    groups = plan.groups[:start] + [group] + plan.groups[start + len(members):]
    return FusionPlan(plan.graph, groups)


def _run_ok(plan: FusionPlan, start: int, end: int, info: list) -> bool:
    """Groups ``start..end`` (inclusive) form a run: bandable, each output but the last read only
    inside, and the last one read by nobody inside."""
    g = plan.graph
    inside = {id(n) for grp in plan.groups[start:end + 1] for n in grp.nodes}
    graph_outs = {id(v) for v in g.outputs}
    for k in range(start, end):
        v = info[k].output
        if id(v) in graph_outs or any(id(u) not in inside for u, _ in v.uses):
            return False
    return True


def estimate_arena(plan: FusionPlan) -> int:
    """Arena of ``plan``'s tensors with each patched run's workspace placed as its scratch."""
    return place_scratch(plan_memory(plan), [_workspace(g) for g in plan.groups]).arena_bytes


def _workspace(group: FusionGroup) -> int:
    return group.attrs["patch"].workspace_bytes if group.kind == PATCHED_KIND else 0


def choose_patches(plan: FusionPlan, recompute_limit: float,
                   kernel_scratch: dict[str, int] | None = None) -> tuple[FusionPlan, PatchReport]:
    """Merge runs of ``plan`` into patched groups where that lowers the arena (module docstring).

    ``kernel_scratch`` (group name -> bytes) estimates each layer's own scratch inside a band's
    workspace (the whole layer's kernel scratch, an upper bound); without it only tensors count.
    Four greedy orders are tried: the lowest arena at every step, or runs that recompute nothing
    first (they can flatten a plateau of equal peaks that no single run lowers), each with and
    without line buffers (``schedule(stream=True)``). The plan kept is the state of any with the
    lowest arena, then the least recomputation, then the fewest runs."""
    g = plan.graph
    static = static_values(g)
    model_work = float(sum(get_spec(n.op_type, n).flops(n) for n in g.nodes if is_supported(n.op_type)
                           and not all(id(v) in static for v in n.outputs)))
    info: list[Bandable | str] = [bandable(grp, g, static) for grp in plan.groups]
    stops = [{"group": grp.name, "reason": r} for grp, r in zip(plan.groups, info, strict=True) if isinstance(r, str)]
    start_state = _estimate(plan_memory(plan), [_workspace(grp) for grp in plan.groups])
    best: tuple[int, float, int, FusionPlan, list[dict]] = (start_state[0], 0.0, 0, plan, [])
    if recompute_limit > 0:
        cache: dict = {}  # schedules and memory plans, shared by the orders
        for free_first, streams in itertools.product((False, True), ((False,), (False, True))):
            for state in _greedy(plan, info, start_state, recompute_limit * model_work, free_first,
                                 kernel_scratch or {}, streams, cache):
                if state[:3] < best[:3]:
                    best = state
    arena, _, _, chosen, runs = best
    chosen, runs = _prune(chosen, runs, arena)
    chosen, runs = _polish(chosen, runs, arena, kernel_scratch or {})
    report = PatchReport(recompute_limit, model_work, start_state[0], arena, list(runs), stops)
    return chosen, report


def _polish(plan: FusionPlan, runs: list[dict], arena: int,
            kernel_scratch: dict[str, int]) -> tuple[FusionPlan, list[dict]]:
    """Redo each run over the same layers with the least recomputation (then the fewest bands) that
    keeps the estimated arena: a greedy step picks a run for the peak it had then, and a later run may
    have moved the peak elsewhere."""
    for i, grp in enumerate(plan.groups):
        if grp.kind != PATCHED_KIND:
            continue
        old: PatchSchedule = grp.attrs["patch"]
        members = old.members
        height = members[-1].output.shape[2]
        best = (old.extra_work, len(old.bands), not old.stream, old.band_rows)
        chosen = old
        for rows in sorted({-(-height // n) for n in range(2, height + 1)}, reverse=True):
            if rows * members[-1].output.shape[3] < MIN_BAND_PIXELS:
                break
            for stream in (False, True):
                sched = schedule(members, rows, [kernel_scratch.get(m.group.name, 0) for m in members], stream)
                key = (sched.extra_work, len(sched.bands), not sched.stream, rows)
                if key >= best or sched.extra_work > old.extra_work:
                    continue
                trial = FusionPlan(plan.graph, plan.groups[:i] + merge_run(FusionPlan(plan.graph, [
                    m.group for m in members]), 0, sched).groups + plan.groups[i + 1:])
                if _estimate(plan_memory(trial), [_workspace(g) for g in trial.groups])[0] <= arena:
                    best, chosen = key, sched
        if chosen is not old:
            plan = FusionPlan(plan.graph, plan.groups[:i] + [merge_run(FusionPlan(plan.graph, [
                m.group for m in members]), 0, chosen).groups[0]] + plan.groups[i + 1:])
            names = [m.group.name for m in members]
            runs = [{**chosen.describe(), "arena_estimate": arena} if r["groups"] == names else r for r in runs]
    return plan, runs


def _prune(plan: FusionPlan, runs: list[dict], arena: int) -> tuple[FusionPlan, list[dict]]:
    """Undo every run (last made first) whose undoing keeps the estimated arena: it costs copies
    and calls, and may have been made only to flatten a plateau another run then lowered."""
    for run in reversed(runs):
        i = next(k for k, grp in enumerate(plan.groups) if grp.kind == PATCHED_KIND
                 and [m.group.name for m in grp.attrs["patch"].members] == run["groups"])
        sched = plan.groups[i].attrs["patch"]
        trial = FusionPlan(plan.graph, plan.groups[:i] + [m.group for m in sched.members] + plan.groups[i + 1:])
        if _estimate(plan_memory(trial), [_workspace(grp) for grp in trial.groups])[0] <= arena:
            plan = trial
            runs = [r for r in runs if r is not run]
    return plan, runs


def _greedy(plan: FusionPlan, info: list, current: tuple[int, int], budget: float, free_first: bool,
            kernel_scratch: dict[str, int], streams: tuple[bool, ...], cache: dict) -> list[tuple]:
    """Every state ``(arena, extra work, runs, plan, run reports)`` one greedy order passes through."""
    states: list[tuple] = []
    runs: list[dict] = []
    extra = 0.0
    free_only = free_first
    while True:
        best: tuple | None = None
        for start in range(len(plan.groups)):
            if not isinstance(info[start], Bandable):
                continue
            for end in range(start + 1, min(start + MAX_RUN_GROUPS, len(plan.groups))):
                if not isinstance(info[end], Bandable):
                    break
                if not _run_ok(plan, start, end, info):
                    continue
                members = [m for m in info[start:end + 1] if isinstance(m, Bandable)]
                height = members[-1].output.shape[2]
                memories: dict[bool, MemoryPlan] = {}
                needs = [_workspace(grp) for grp in plan.groups[:start + 1] + plan.groups[end + 1:]]
                # One band height per band count (the smallest that gives it): ceil(height / n).
                for rows in sorted({-(-height // n) for n in range(2, height + 1)}, reverse=True):
                    if rows * members[-1].output.shape[3] < MIN_BAND_PIXELS:
                        break
                    for stream in streams:
                        skey = (tuple(m.group.name for m in members), rows, stream)
                        if skey not in cache:
                            cache[skey] = schedule(members, rows,
                                                   [kernel_scratch.get(m.group.name, 0) for m in members], stream)
                        sched = cache[skey]
                        if sched.extra_work > budget - extra + 1e-9 or free_only and sched.extra_work > 0:
                            continue
                        needs[start] = sched.workspace_bytes
                        if sched.inplace not in memories:
                            merged = merge_run(plan, start, sched)
                            mkey = (tuple(grp.name for grp in merged.groups), sched.inplace)
                            if mkey not in cache:
                                cache[mkey] = plan_memory(merged)
                            memories[sched.inplace] = cache[mkey]
                        arena, area = _estimate(memories[sched.inplace], needs)
                        if free_only:
                            if arena > current[0] or (arena, area) >= current:
                                continue
                            key: tuple = (arena, area, end - start, start)
                        else:
                            if arena >= current[0]:
                                continue
                            key = (arena, sched.extra_work, area, end - start, start)
                        if best is None or key < best[0]:
                            best = (key, start, sched, (arena, area))
        if best is None:
            if free_only:
                free_only = False
                continue
            return states
        _, start, sched, current = best
        plan = merge_run(plan, start, sched)
        info = info[:start] + [plan.groups[start].name] + info[start + len(sched.members):]
        runs = runs + [{**sched.describe(), "arena_estimate": current[0]}]
        extra += sched.extra_work
        states.append((current[0], extra, len(runs), plan, runs))


def _estimate(memory: MemoryPlan, needs: list[int]) -> tuple[int, int]:
    """(arena, area): the arena with the workspaces placed, and the bytes live summed over kernels
    (what a run that leaves the peak alone can still lower, so the next one can lower the peak)."""
    arena = place_scratch(memory, needs).arena_bytes
    area = sum(size * (end - start + 1) for _, size, start, end in memory.blocks.values()) + sum(needs)
    return arena, area
