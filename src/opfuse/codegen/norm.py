"""Row-wise normalisations: Softmax and LayerNormalization, with prologue and epilogue.

Each row (the softmax axis, or LayerNorm's trailing normalised axes) is read once through
the prologue into a per-thread row buffer (a LayerNorm row in memory with no prologue is read
in place instead), reduced with lane accumulators, and written once through the epilogue:

    softmax:   y_j = exp(x_j - max x) / sum_k exp(x_k - max x)
    layernorm: y_j = (x_j - mean) / sqrt(var + eps) * scale_j + bias_j,
               mean = sum x / n,  var = sum (x - mean)^2 / n   (two passes, no cancellation; float32
               rows summed in double, so a row of equal values normalises to exactly 0)
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from opfuse.codegen import vecmath
from opfuse.codegen.ctype import c_type, literal, lowest, math_fn
from opfuse.codegen.index import Index, delinearize
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.gemm import in_memory
from opfuse.codegen.loops import emit_loop_nest, lane_reduce, store
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.common import norm_axis
from opfuse.ops.registry import get_spec


# Partial-sum arrays of LayerNorm's two row sums (``loops.lane_reduce``'s ``chains``): with one, each
# pass over a row waits on its own vector additions. bert_layer's 128 x 768 LayerNorm alone (C, thread
# CPU time, interleaved): 13.9 us with 1, 10.5 with 2, 12.0 with 4 (gcc spills the arrays).
LAYERNORM_CHAINS = 2


def _row_loop(kc, ev, shape, axis_lo: int, axis_hi: int, body) -> None:
    """Loops over every row: all axes except ``[axis_lo, axis_hi)``, which ``body`` walks."""
    row_shape = tuple(1 if axis_lo <= d < axis_hi else n for d, n in enumerate(shape))
    emit_loop_nest(kc, ev, row_shape, body, cost_per_element=math.prod(shape[axis_lo:axis_hi]) * 4)


def _element(shape, ridx: Index, axis_lo: int, axis_hi: int, j: str) -> Index:
    """Index of element ``j`` (row-major within axes [lo, hi)) of the row at ``ridx``."""
    dims = list(ridx.dims)
    dims[axis_lo:axis_hi] = delinearize(j, shape[axis_lo:axis_hi])
    runs = [r for r in ridx.runs if r[1] <= axis_lo or r[0] >= axis_hi]
    if axis_hi - axis_lo > 1:
        runs.append((axis_lo, axis_hi, j))
    return Index(tuple(shape), tuple(dims), tuple(runs))


def _row_buffer(kc, ct: str, length: int, itemsize: int) -> str:
    buf = kc.tmp("row")
    off = kc.scratch(length * itemsize)
    kc.w.line(f"{ct}* restrict {buf} = {kc.scratch_ptr(ct, off)};")
    return buf


# A Softmax over an axis that is not the last (YOLOv8's DFL: 16 bins at stride 8400) runs ``SOFTMAX_COLUMNS``
# neighbouring positions of the axes after it at once, one per lane (``lower_softmax``), where those axes hold at
# least that many (``CodegenOptions.softmax_columns``).
SOFTMAX_COLUMNS = 16


def lower_softmax(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    shape = x.shape
    axis = norm_axis(int(get_spec("Softmax", node).attrs_of(node)["axis"]), len(shape), node)
    L = shape[axis]
    dt = out.dtype
    ct = c_type(dt)
    # The inline exp vectorises the row loop (libm's expf is a call per element).
    exp = vecmath.require(kc.program, vecmath.EXP) if dt == np.float32 else math_fn("exp", dt)
    if kc.program.options.softmax_columns and math.prod(shape[axis + 1:]) >= SOFTMAX_COLUMNS:
        _softmax_columns(kc, ev, stage, shape, axis, exp)
        return

    def body(ridx: Index):
        buf = _row_buffer(kc, ct, L, dt.itemsize)
        j = kc.tmp("j")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            kc.w.line(f"{buf}[{j}] = {ev.at(x, _element(shape, ridx, axis, axis + 1, j))};")
        mx = kc.tmp("mx")
        lane_reduce(kc, ct, lowest(dt), lambda a, b: f"({b} > {a} ? {b} : {a})", L, lambda i: f"{buf}[{i}]", mx)
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"):
            kc.w.line(f"{buf}[{j}] = {exp}({buf}[{j}] - {mx});")
        s = kc.tmp("sum")
        lane_reduce(kc, ct, literal(0, dt), lambda a, b: f"{a} + {b}", L, lambda i: f"{buf}[{i}]", s)
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            eidx = _element(shape, ridx, axis, axis + 1, j)
            y = kc.tmp("y")
            kc.w.line(f"const {ct} {y} = {buf}[{j}] / {s};")
            finish_element(kc, ev, stage, out, eidx, y)

    _row_loop(kc, ev, shape, axis, axis + 1, body)


def _softmax_columns(kc, ev, stage: Stage, shape, axis: int, exp: str) -> None:
    """Softmax along ``axis`` of ``shape``, ``SOFTMAX_COLUMNS`` neighbouring positions of the axes after it at a
    time: a block of the softmax axis's L x COLUMNS values read once (through the prologue) into a buffer, each
    step over the axis a loop over the columns that gcc vectorises (the max, the exps, the sums in increasing
    position along the axis, the divisions), instead of one strided row at a time with a scalar exp per element.
    The last block of a row of columns holds the rest."""
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    dt = out.dtype
    ct = c_type(dt)
    w = kc.w
    L, B = shape[axis], SOFTMAX_COLUMNS
    outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
    nblk = -(-inner // B)
    o, blk, c0, n, j, lane = (kc.tmp(t) for t in ("o", "blk", "c0", "n", "j", "l"))
    mx, s = kc.tmp("mx"), kc.tmp("sum")
    kc.parallel_for(outer * inner * L * 4, 2 if outer < kc.program.options.parallel_min_outer else 1)
    w.line(f"for (long {o} = 0; {o} < {outer}; ++{o}) {{")
    w.line(f"  for (long {blk} = 0; {blk} < {nblk}; ++{blk}) {{")
    w.level += 2
    buf = _row_buffer(kc, ct, L * B, dt.itemsize)
    off = kc.scratch(2 * B * dt.itemsize)
    w.line(f"{ct}* restrict {mx} = {kc.scratch_ptr(ct, off)};")
    w.line(f"{ct}* restrict {s} = {mx} + {B};")
    w.line(f"const long {c0} = {blk} * {B};")
    w.line(f"const long {n} = {inner} - {c0} < {B} ? {inner} - {c0} : {B};")
    rank = len(shape)
    groups = ([(0, axis, o)] if axis > 0 else []) + [(axis, axis + 1, j), (axis + 1, rank, f"({c0} + {lane})")]
    idx = Index.loops(shape, groups)
    lanes = f"for (long {lane} = 0; {lane} < {n}; ++{lane})"
    w.line(f"{lanes} {mx}[{lane}] = {lowest(dt)};")
    with w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), w.block(lanes), ev.scope():
        v = kc.tmp("v")
        w.line(f"const {ct} {v} = {ev.at(x, idx)};")
        w.line(f"{buf}[{j} * {B} + {lane}] = {v};")
        w.line(f"{mx}[{lane}] = {v} > {mx}[{lane}] ? {v} : {mx}[{lane}];")
    w.line(f"{lanes} {s}[{lane}] = {literal(0, dt)};")
    with w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), w.block(lanes):
        e = kc.tmp("e")
        w.line(f"const {ct} {e} = {exp}({buf}[{j} * {B} + {lane}] - {mx}[{lane}]);")
        w.line(f"{buf}[{j} * {B} + {lane}] = {e};")
        w.line(f"{s}[{lane}] = {s}[{lane}] + {e};")
    with w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), w.block(lanes), ev.scope():
        y = kc.tmp("y")
        w.line(f"const {ct} {y} = {buf}[{j} * {B} + {lane}] / {s}[{lane}];")
        finish_element(kc, ev, stage, out, idx, y)
    w.level -= 2
    w.line("  }")
    w.line("}")


def lower_layernorm(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    group_ids = {id(n) for n in analysis.live}
    stats = [v for v in node.outputs[1:] if any(id(v) == id(o) for o in stage.outputs)]
    if any(id(u) in group_ids for v in node.outputs[1:] for u, _ in v.uses):
        raise kc.error(f"LayerNormalization '{node.name}': its mean / inv_std outputs feed the group; only "
                       f"storing them is supported")
    a = get_spec(node.op_type, node).attrs_of(node)
    per_element = replace(stage, outputs=[v for v in stage.outputs if all(v is not s for s in stats)])
    shape = x.shape
    rank = len(shape)
    axis = norm_axis(int(a["axis"]), rank, node)
    L = math.prod(shape[axis:])
    dt = out.dtype
    ct = c_type(dt)
    scale = node.input(1)
    bias = node.inputs[2] if len(node.inputs) > 2 else None

    # A row read from memory as it is (no prologue, not written over by the output) is read in place:
    # its three passes then skip the copy into the row buffer (bert_layer's 128 x 768: 0.81-0.84x).
    mem = kc.program.memory
    direct = in_memory(ev, x) and x.dtype == dt \
        and all(mem.location(v).key() != mem.location(x).key() for v in stage.outputs if not mem.is_static(v))

    def body(ridx: Index):
        j = kc.tmp("j")
        if direct:
            buf = kc.tmp("row")
            kc.w.line(f"const {ct}* restrict {buf} = {kc.ptr(x)} + {_element(shape, ridx, axis, rank, '0').offset()};")
        else:
            buf = _row_buffer(kc, ct, L, dt.itemsize)
            with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
                kc.w.line(f"{buf}[{j}] = {ev.at(x, _element(shape, ridx, axis, rank, j))};")
        s = kc.tmp("sum")
        mean = kc.tmp("mean")
        if dt == np.float32:  # the sum in double: a row of equal values has exactly their mean (x - mean = 0)
            lane_reduce(kc, "double", "0.0", lambda p, q: f"{p} + {q}", L, lambda i: f"(double){buf}[{i}]", s,
                        chains=LAYERNORM_CHAINS)
            kc.w.line(f"const {ct} {mean} = ({ct})({s} / {float(L)!r});")
        else:
            lane_reduce(kc, ct, literal(0, dt), lambda p, q: f"{p} + {q}", L, lambda i: f"{buf}[{i}]", s,
                        chains=LAYERNORM_CHAINS)
            kc.w.line(f"const {ct} {mean} = {s} / {literal(L, dt)};")
        sq = kc.tmp("sq")

        def centred(i):
            d = kc.tmp("d")
            kc.w.line(f"const {ct} {d} = {buf}[{i}] - {mean};")
            return f"{d} * {d}"
        lane_reduce(kc, ct, literal(0, dt), lambda p, q: f"{p} + {q}", L, centred, sq, chains=LAYERNORM_CHAINS)
        inv = kc.tmp("inv")
        kc.w.line(f"const {ct} {inv} = {literal(1, dt)} / {math_fn('sqrt', dt)}({sq} / {literal(L, dt)} + "
                  f"{literal(a['epsilon'], dt)});")
        for v in stats:  # Mean and InvStdDev: one per row, shaped like the row index
            stat = mean if v is node.outputs[1] else inv
            store(kc, ev, v, Index(ridx.shape, ridx.dims), f"({c_type(v.dtype)}){stat}")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            eidx = _element(shape, ridx, axis, rank, j)
            y = f"({buf}[{j}] - {mean}) * {inv} * {ev.at(scale, eidx.broadcast_to(scale.shape))}"
            if bias is not None:
                y += f" + {ev.at(bias, eidx.broadcast_to(bias.shape))}"
            t = kc.tmp("y")
            kc.w.line(f"const {ct} {t} = {y};")
            finish_element(kc, ev, per_element, out, eidx, t)

    _row_loop(kc, ev, shape, axis, rank, body)


def lower_log_softmax(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """y_j = x_j - max x - log(sum_k exp(x_k - max x)): the row is read once into the buffer,
    the exps are summed without being stored, and each output is one subtraction."""
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    shape = x.shape
    axis = norm_axis(int(get_spec(node.op_type, node).attrs_of(node)["axis"]), len(shape), node)
    L = shape[axis]
    dt = out.dtype
    ct = c_type(dt)
    f32 = dt == np.float32
    exp = vecmath.require(kc.program, vecmath.EXP) if f32 else math_fn("exp", dt)
    log = vecmath.require(kc.program, vecmath.LOG) if f32 else math_fn("log", dt)

    def body(ridx: Index):
        buf = _row_buffer(kc, ct, L, dt.itemsize)
        j = kc.tmp("j")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            kc.w.line(f"{buf}[{j}] = {ev.at(x, _element(shape, ridx, axis, axis + 1, j))};")
        mx = kc.tmp("mx")
        lane_reduce(kc, ct, lowest(dt), lambda a, b: f"({b} > {a} ? {b} : {a})", L, lambda i: f"{buf}[{i}]", mx)
        s = kc.tmp("sum")
        lane_reduce(kc, ct, literal(0, dt), lambda a, b: f"{a} + {b}", L, lambda i: f"{exp}({buf}[{i}] - {mx})", s)
        shift = kc.tmp("shift")
        kc.w.line(f"const {ct} {shift} = {mx} + {log}({s});")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            y = kc.tmp("y")
            kc.w.line(f"const {ct} {y} = {buf}[{j}] - {shift};")
            finish_element(kc, ev, stage, out, _element(shape, ridx, axis, axis + 1, j), y)

    _row_loop(kc, ev, shape, axis, axis + 1, body)


def lower_hardmax(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """1 at the first maximum of the row (NaN counting as the maximum, as np.argmax), 0 elsewhere."""
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    shape = x.shape
    axis = norm_axis(int(get_spec(node.op_type, node).attrs_of(node)["axis"]), len(shape), node)
    L = shape[axis]
    dt = out.dtype
    ct = c_type(dt)

    def body(ridx: Index):
        buf = _row_buffer(kc, ct, L, dt.itemsize)
        j = kc.tmp("j")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            kc.w.line(f"{buf}[{j}] = {ev.at(x, _element(shape, ridx, axis, axis + 1, j))};")
        at = kc.tmp("at")
        kc.w.line(f"long {at} = 0;")
        with kc.w.block(f"for (long {j} = 1; {j} < {L}; ++{j})"):
            v, best = f"{buf}[{j}]", f"{buf}[{at}]"
            kc.w.line(f"if ({v} > {best} || ({v} != {v} && {best} == {best})) {at} = {j};")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            y = kc.tmp("y")
            kc.w.line(f"const {ct} {y} = {j} == {at} ? {literal(1, dt)} : {literal(0, dt)};")
            finish_element(kc, ev, stage, out, _element(shape, ridx, axis, axis + 1, j), y)

    _row_loop(kc, ev, shape, axis, axis + 1, body)
