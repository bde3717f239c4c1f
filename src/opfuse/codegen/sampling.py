"""Kernels of the spatial sampling ops: GridSample, Col2Im, DeformConv, RoiAlign (each its own
kernel, an elementwise epilogue fused), MaxUnpool (a scatter) and MaxPool with its Indices.

Each kernel is a loop nest of ``loops.py`` (split across threads) that reads its inputs from
memory at positions computed from data and hands every result to ``epilogue.finish_element``.
What depends only on the position is computed once for all channels: GridSample's taps per output
position, DeformConv's per (offset group, kernel offset), RoiAlign's box and sample points per bin
(its channels accumulate in a per-thread array); Col2Im, MaxUnpool and MaxPool go element by
element. Arithmetic follows the reference
(``opfuse.ops.sampling``): coordinates in the element type the reference computes them in
(the grid's for GridSample, the boxes' for RoiAlign), interpolation weights and sums in double,
a window's taps summed in one loop (the reference nests the axes: the same sum up to double
rounding). Out-of-range reads are never made: an index is clamped, mirrored or its tap skipped. A
bad MaxUnpool index or RoiAlign batch index is clamped too, and sets the node's fault flag: the run
fails with an ``InputError``, as the reference refuses it (``checks.index_fault``).
"""
from __future__ import annotations

import dataclasses
import math

from opfuse.codegen import checks
from opfuse.codegen.ctype import c_type, literal, lowest, math_fn
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index, add, contiguous_strides, delinearize, mul
from opfuse.codegen.loops import emit_loop_nest, lane_reduce, store
from opfuse.codegen.rules import nan_max
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec

REFLECT = "opfuse_reflect"
REFLECT_C = f"""static inline double {REFLECT}(double x, double lo, double hi) {{
    /* mirror x at lo and hi until it lies between them (PyTorch's grid sampler) */
    const double span = hi - lo;
    if (span <= 0.0) return lo;
    if (x < lo) {{
        const double dx = lo - x, n = trunc(dx / span), r = dx - n * span;
        return fmod(n, 2.0) == 0.0 ? lo + r : hi - r;
    }}
    if (x > hi) {{
        const double dx = x - hi, n = trunc(dx / span), r = dx - n * span;
        return fmod(n, 2.0) == 0.0 ? hi - r : lo + r;
    }}
    return x;
}}
"""


def _attrs(node) -> dict:
    return get_spec(node.op_type, node).attrs_of(node)


def _reflect(kc) -> str:
    return kc.program.require_helper(REFLECT, REFLECT_C)


# GridSample ------------------------------------------------------------------------------------
def _cubic_weights(w, t: str, names: list[str]) -> None:
    """Keys' weights (A = -0.75) of the taps at -1, 0, 1, 2 for fraction ``t``, as the reference."""
    from opfuse.ops.sampling import CUBIC_A
    A = repr(float(CUBIC_A))
    u, v, s = f"({t} + 1.0)", f"(1.0 - {t})", f"(2.0 - {t})"
    w.line(f"{names[0]} = (({A} * {u} - 5.0 * {A}) * {u} + 8.0 * {A}) * {u} - 4.0 * {A};")
    w.line(f"{names[1]} = (({A} + 2.0) * {t} - ({A} + 3.0)) * {t} * {t} + 1.0;")
    w.line(f"{names[2]} = (({A} + 2.0) * {v} - ({A} + 3.0)) * {v} * {v} + 1.0;")
    w.line(f"{names[3]} = (({A} * {s} - 5.0 * {A}) * {s} + 8.0 * {A}) * {s} - 4.0 * {A};")


def _grid_taps(kc, coord: str, length: int, mode: str, padding: str, align: bool):
    """Emit one axis's taps for pixel coordinate ``coord`` (a double): arrays of index, validity and
    weight; returns (count, index array, valid array, weight array)."""
    w = kc.w
    lo, hi = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
    n = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    ix, ok, wt = kc.tmp("gx"), kc.tmp("gok"), kc.tmp("gw")
    w.line(f"long {ix}[{n}]; int {ok}[{n}]; double {wt}[{n}];")
    if mode == "nearest":
        w.line(f"const double {ix}_p0 = trunc({coord});")
        w.line(f"{wt}[0] = 1.0;")
        taps = [f"{ix}_p0"]
    else:
        f, t = kc.tmp("gf"), kc.tmp("gt")
        w.line(f"const double {f} = floor({coord}), {t} = {coord} - {f};")
        if mode == "linear":
            w.line(f"{wt}[0] = 1.0 - {t}; {wt}[1] = {t};")
            taps = [f, f"({f} + 1.0)"]
        else:
            _cubic_weights(w, t, [f"{wt}[{j}]" for j in range(4)])
            taps = [f"({f} - 1.0)", f, f"({f} + 1.0)", f"({f} + 2.0)"]
    for j, p in enumerate(taps):
        if padding == "zeros":
            w.line(f"{ok}[{j}] = {p} >= 0.0 && {p} < {float(length)!r};")
            w.line(f"{ix}[{j}] = {ok}[{j}] ? (long){p} : 0;")
        elif padding == "border":
            w.line(f"{ok}[{j}] = 1;")
            # a NaN coordinate reads index 0, as the reference (its conversion to long is undefined in C)
            w.line(f"{ix}[{j}] = !({p} >= 0.0) ? 0 : ({p} > {float(length - 1)!r} ? {length - 1} : (long){p});")
        else:
            r, m = kc.tmp("gr"), kc.tmp("gm")
            w.line(f"{ok}[{j}] = 1;")
            w.line(f"const double {m} = {_reflect(kc)}({p}, {lo!r}, {hi!r});")  # NaN for NaN and infinities
            w.line(f"long {r} = {m} == {m} ? (long)trunc({m}) : 0;")
            w.line(f"{ix}[{j}] = {r} < 0 ? 0 : ({r} > {length - 1} ? {length - 1} : {r});")
    return n, ix, ok, wt


def _flatten_taps(kc, axes, spatial) -> tuple[int, str, str, str]:
    """The taps of every axis combined: for each tap of the window (the first axis outermost) its
    offset in a (image, channel) plane, its weight (the product of the axes' weights) and whether
    every axis's tap is inside. Returns (count, offsets, weights, inside) arrays."""
    w = kc.w
    total = math.prod(a[0] for a in axes)
    off, wt, ok, k = kc.tmp("toff"), kc.tmp("tw"), kc.tmp("tok"), kc.tmp("tk")
    w.line(f"long {off}[{total}]; double {wt}[{total}]; int {ok}[{total}]; int {k} = 0;")
    strides = contiguous_strides(spatial)
    loops = []
    for cnt, *_ in axes:
        t = kc.tmp("t")
        w.line(f"for (int {t} = 0; {t} < {cnt}; ++{t}) {{")
        w.level += 1
        loops.append(t)
    terms = [(ax, t) for ax, t in zip(axes, loops, strict=True)]
    w.line(f"{off}[{k}] = {add(*(mul(f'{ax[1]}[{t}]', st) for (ax, t), st in zip(terms, strides, strict=True)))};")
    w.line(f"{wt}[{k}] = {' * '.join(f'{ax[3]}[{t}]' for ax, t in terms)};")
    w.line(f"{ok}[{k}] = {' && '.join(f'{ax[2]}[{t}]' for ax, t in terms)};")
    w.line(f"++{k};")
    for _ in loops:
        w.level -= 1
        w.line("}")
    return total, off, wt, ok


def _gather(kc, ev, x, plane: str, taps: tuple[int, str, str, str]) -> str:
    """``sum_k weight[k] * x[plane + offset[k]]`` over the taps, those outside reading 0, in double;
    ``plane`` is the element offset of the (image, channel) plane."""
    total, off, wt, ok = taps
    acc, k = kc.tmp("gacc"), kc.tmp("k")
    kc.w.line(f"double {acc} = 0.0;")
    with kc.w.block(f"for (int {k} = 0; {k} < {total}; ++{k})"), ev.scope():
        v = ev.at(x, Index.linear(tuple(x.shape), f"{plane} + {off}[{k}]"))
        # an outside tap reads 0, still times its weight: a NaN coordinate's NaN weights make NaN (onnxruntime's)
        kc.w.line(f"{acc} += {ok}[{k}] ? {wt}[{k}] * (double){v} : 0.0 * {wt}[{k}];")
    return acc


def lower_grid_sample(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    from opfuse.ops.sampling import grid_mode, grid_padding
    node = stage.anchor_node
    x, grid, out = node.input(0), node.input(1), node.outputs[0]
    a = _attrs(node)
    mode, padding, align = grid_mode(node, a), grid_padding(node, a), bool(int(a["align_corners"]))
    d = len(x.shape) - 2
    gt = grid.dtype
    gct = c_type(gt)
    one, half = literal(1, gt), literal(0.5, gt)
    ct = c_type(out.dtype)
    rint = math_fn("rint", gt)

    C = x.shape[1]

    def body(pidx: Index):
        """One output position of one image: its taps once, then every channel."""
        n, o = pidx.dims[0], pidx.dims[1:]
        axes = []
        for i in range(d):
            length = x.shape[2 + i]
            g = ev.at(grid, Index(tuple(grid.shape), (n,) + tuple(o) + (str(d - 1 - i),)))
            p = kc.tmp("gp")
            if align:
                kc.w.line(f"{gct} {p} = ({g} + {one}) * {half} * {literal(length - 1, gt)};")
            else:
                kc.w.line(f"{gct} {p} = (({g} + {one}) * {literal(length, gt)} - {one}) * {half};")
            if mode == "nearest":
                kc.w.line(f"{p} = {rint}({p});")
            lo, hi = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
            if padding == "border" and mode != "cubic":  # cubic clamps each tap (the reference's note)
                kc.w.line(f"if ({p} < {literal(lo, gt)} || {p} > {literal(hi, gt)}) "
                          f"{p} = {p} < {literal(0, gt)} ? {literal(0, gt)} : "
                          f"({p} > {literal(length - 1, gt)} ? {literal(length - 1, gt)} : {p});")
            elif padding == "reflection":
                kc.w.line(f"if ({p} < {literal(lo, gt)} || {p} > {literal(hi, gt)}) "
                          f"{p} = ({gct}){_reflect(kc)}((double){p}, {lo!r}, {hi!r});")
            axes.append(_grid_taps(kc, f"(double){p}", length, mode, padding, align))
        window = _flatten_taps(kc, axes, tuple(x.shape[2:]))
        plane = math.prod(x.shape[2:])
        c = kc.tmp("c")
        with kc.w.block(f"for (long {c} = 0; {c} < {C}; ++{c})"), ev.scope():
            acc = _gather(kc, ev, x, f"({n} * {C} + {c}) * {plane}", window)
            res = kc.tmp("gs")
            kc.w.line(f"const {ct} {res} = ({ct}){acc};")
            finish_element(kc, ev, stage, out, Index(tuple(out.shape), (n, c) + tuple(o)), res)

    taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode] ** d
    emit_loop_nest(kc, ev, (x.shape[0],) + tuple(out.shape[2:]), body, cost_per_element=C * 4 * taps + 16 * d)


# Col2Im ----------------------------------------------------------------------------------------
def lower_col2im(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """Each image element gathers the column entries whose window lands on it: for kernel
    offset ``k`` along an axis the block is ``(pos + pad - k * dilation) / stride`` when that
    divides exactly and lies in range; offsets in row-major order, as the reference adds them."""
    from opfuse.ops.sampling import col2im_geometry
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    image, block, strides, dilations, pads, blocks = col2im_geometry(node, _attrs(node))
    K = math.prod(block)
    ct = c_type(out.dtype)
    acc_t = "double" if out.dtype.kind == "f" else ct

    def body(oidx: Index):
        n, c, pos = oidx.dims[0], oidx.dims[1], oidx.dims[2:]
        acc = kc.tmp("acc")
        kc.w.line(f"{acc_t} {acc} = 0;")
        ks, bs = [], []
        opened = 0
        for i in range(len(image)):
            k, t, b = kc.tmp("k"), kc.tmp("q"), kc.tmp("b")
            kc.w.line(f"for (long {k} = 0; {k} < {block[i]}; ++{k}) {{")
            kc.w.level += 1
            opened += 1
            kc.w.line(f"const long {t} = {add(pos[i], str(pads[i]))} - {mul(k, dilations[i])};")
            cond = f"{t} < 0" + (f" || {t} % {strides[i]} != 0" if strides[i] > 1 else "")
            kc.w.line(f"if ({cond}) continue;")
            kc.w.line(f"const long {b} = {t} / {strides[i]};" if strides[i] > 1 else f"const long {b} = {t};")
            kc.w.line(f"if ({b} >= {blocks[i]}) continue;")
            ks.append(k)
            bs.append(b)
        with ev.scope():
            ch = add(mul(c, K), *(mul(k, s) for k, s in zip(ks, contiguous_strides(block), strict=True)))
            col = add(*(mul(b, s) for b, s in zip(bs, contiguous_strides(blocks), strict=True)))
            v = ev.at(x, Index(tuple(x.shape), (n, ch, col)))
            kc.w.line(f"{acc} += {v};")
        for _ in range(opened):
            kc.w.level -= 1
            kc.w.line("}")
        res = kc.tmp("c2i")
        kc.w.line(f"const {ct} {res} = ({ct}){acc};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=2 * K)


# DeformConv ------------------------------------------------------------------------------------
def lower_deform_conv(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """Per output position: the taps of every (offset group, kernel offset) located once, every
    input channel of the group sampled there (bilinear, zeros outside, times the mask) into a
    per-thread column in scratch; then one dot product per output channel with its group's
    weights (plus the bias), each finished through the epilogue."""
    from opfuse.ops.sampling import deform_geometry
    node = stage.anchor_node
    x, wgt, off = node.input(0), node.input(1), node.input(2)
    bias = node.input(3) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    mask = node.input(4) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    out = node.outputs[0]
    kernel, strides, dilations, pads, oshape, group, og = deform_geometry(node, _attrs(node))
    d = len(kernel)
    K = math.prod(kernel)
    C, OC = x.shape[1], wgt.shape[0]
    cpg, icg, ocg = C // og, C // group, OC // group
    ct = c_type(out.dtype)
    w = kc.w

    def body(pidx: Index):
        n, o = pidx.dims[0], pidx.dims[1:]
        cols = kc.tmp("cols")
        w.line(f"double* restrict {cols} = {kc.scratch_ptr('double', kc.scratch(C * K * 8))};")
        g, k = kc.tmp("og"), kc.tmp("k")
        with w.block(f"for (long {g} = 0; {g} < {og}; ++{g})"), ev.scope():
            with w.block(f"for (long {k} = 0; {k} < {K}; ++{k})"), ev.scope():
                kpos = delinearize(k, kernel)
                taps = []
                for i in range(d):
                    ch = add(mul(g, K * d), mul(k, d), str(i))
                    dv = ev.at(off, Index(tuple(off.shape), (n, ch) + tuple(o)))
                    p = kc.tmp("dp")
                    base = add(mul(o[i], strides[i]), str(-pads[i]), mul(kpos[i], dilations[i]))
                    w.line(f"const double {p} = (double)({base}) + (double){dv};")
                    taps.append(_grid_taps(kc, p, x.shape[2 + i], "linear", "zeros", True))
                mv = "1.0"
                if mask is not None:
                    mv = kc.tmp("mk")
                    mval = ev.at(mask, Index(tuple(mask.shape), (n, add(mul(g, K), k)) + tuple(o)))
                    w.line(f"const double {mv} = (double){mval};")
                window = _flatten_taps(kc, taps, tuple(x.shape[2:]))
                plane = math.prod(x.shape[2:])
                c = kc.tmp("c")
                with w.block(f"for (long {c} = {g} * {cpg}; {c} < ({g} + 1) * {cpg}; ++{c})"), ev.scope():
                    val = _gather(kc, ev, x, f"({n} * {C} + {c}) * {plane}", window)
                    w.line(f"{cols}[{c} * {K} + {k}] = {val}" + (f" * {mv};" if mask is not None else ";"))
        oc = kc.tmp("oc")
        with w.block(f"for (long {oc} = 0; {oc} < {OC}; ++{oc})"), ev.scope():
            acc, col0 = kc.tmp("acc"), kc.tmp("col0")
            first = f"(double){ev.at(bias, Index(tuple(bias.shape), (oc,)))}" if bias is not None else "0.0"
            w.line(f"const long {col0} = ({oc} / {ocg}) * {icg * K};")

            def term(j: str) -> str:
                wv = ev.at(wgt, Index.linear(tuple(wgt.shape), f"{oc} * {icg * K} + {j}"))
                return f"(double){wv} * {cols}[{col0} + {j}]"
            lane_reduce(kc, "double", "0.0", lambda a_, b_: f"{a_} + {b_}", icg * K, term, acc, scope=ev.scope)
            res = kc.tmp("dc")
            w.line(f"const {ct} {res} = ({ct})({acc} + {first});")
            finish_element(kc, ev, stage, out, Index(tuple(out.shape), (n, oc) + tuple(o)), res)

    emit_loop_nest(kc, ev, (x.shape[0],) + tuple(oshape), body,
                   cost_per_element=og * K * 16 + C * K * 4 * 2 ** d + OC * icg * K * 2)


# RoiAlign --------------------------------------------------------------------------------------
def lower_roi_align(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """Per box and bin: the box, the bin's sample points and their bilinear corners and weights
    are computed once, and every channel accumulates its samples (in sample order, as the
    reference) in a per-thread array; then each channel's value goes through the epilogue."""
    from opfuse.ops.sampling import ROI_MAX_BIN_SAMPLES, roi_box_message, roi_grid_message, roi_modes
    node = stage.anchor_node
    x, rois, bidx = node.input(0), node.input(1), node.input(2)
    out = node.outputs[0]
    a = _attrs(node)
    mode, half = roi_modes(node, a)
    N, C, H, W = x.shape
    oh, ow, sr = int(a["output_height"]), int(a["output_width"]), int(a["sampling_ratio"])
    rt = rois.dtype
    rct = c_type(rt)
    ct = c_type(out.dtype)
    w = kc.w

    def L(v) -> str:
        return literal(v, rt)

    def body(bin_idx: Index):
        r, ph, pw = bin_idx.dims
        b = kc.tmp("b")
        bv = ev.at(bidx, Index(tuple(bidx.shape), (r,)))
        w.line(f"long {b} = (long){bv};")
        checks.index_fault(kc, node, b, 0, N - 1)
        w.line(f"{b} = {b} < 0 ? 0 : ({b} >= {N} ? {N - 1} : {b});")
        box = [ev.at(rois, Index(tuple(rois.shape), (r, str(j)))) for j in range(4)]
        x0, y0, x1, y1, rw, rh = (kc.tmp(s) for s in ("rx0", "ry0", "rx1", "ry1", "rw", "rh"))
        scale, off = L(a["spatial_scale"]), L(0.5 if half else 0.0)
        for name, v in zip((x0, y0, x1, y1), box, strict=True):
            w.line(f"const {rct} {name} = {v} * {scale} - {off};")
        w.line(f"{rct} {rw} = {x1} - {x0}, {rh} = {y1} - {y0};")
        if not half:
            w.line(f"{rw} = {rw} > {L(1)} ? {rw} : {L(1)}; {rh} = {rh} > {L(1)} ? {rh} : {L(1)};")
        bh, bw, gh, gw = kc.tmp("bh"), kc.tmp("bw"), kc.tmp("gh"), kc.tmp("gw")
        w.line(f"const {rct} {bh} = {rh} / {L(oh)}, {bw} = {rw} / {L(ow)};")
        # A box that is not finite, or whose adaptive grid is too large, faults (as the reference) and
        # samples nothing meanwhile: no NaN or huge value ever becomes an index or a loop count.
        bad = kc.tmp("bad")
        w.line(f"const int {bad} = !(isfinite({x0}) && isfinite({y0}) && isfinite({x1}) && isfinite({y1}) && "
               f"isfinite({rw}) && isfinite({rh}));")
        w.line(f"{kc.fault(node, roi_box_message(node))} |= {bad};")
        if sr > 0:
            w.line(f"const long {gh} = {bad} ? 0 : {sr}, {gw} = {gh};")
        else:
            ceil = math_fn("ceil", rt)
            ghd, gwd, big = kc.tmp("ghd"), kc.tmp("gwd"), kc.tmp("big")
            w.line(f"const double {ghd} = {bad} ? 0.0 : (double){ceil}({rh} / {L(oh)}), "
                   f"{gwd} = {bad} ? 0.0 : (double){ceil}({rw} / {L(ow)});")
            w.line(f"const int {big} = {ghd} >= 1.0 && {gwd} >= 1.0 && {ghd} * {gwd} > {ROI_MAX_BIN_SAMPLES}.0;")
            w.line(f"{kc.fault(node, roi_grid_message(node))} |= {big};")
            w.line(f"const long {gh} = {big} || {ghd} < 1.0 || {gwd} < 1.0 ? 0 : (long){ghd};")
            w.line(f"const long {gw} = {gh} == 0 ? 0 : (long){gwd};")
        acc, c = kc.tmp("acc"), kc.tmp("c")
        w.line(f"double* restrict {acc} = {kc.scratch_ptr('double', kc.scratch(C * 8))};")
        w.line(f"for (long {c} = 0; {c} < {C}; ++{c}) {acc}[{c}] = 0.0;")
        seen = kc.tmp("seen")
        w.line(f"int {seen} = 0;")
        iy, ix = kc.tmp("iy"), kc.tmp("ix")
        with w.block(f"for (long {iy} = 0; {iy} < {gh}; ++{iy})"):
            yy = kc.tmp("yy")
            w.line(f"const {rct} {yy} = {y0} + ({rct}){ph} * {bh} + (({rct}){iy} + {L(0.5)}) * {bh} / ({rct}){gh};")
            with w.block(f"for (long {ix} = 0; {ix} < {gw}; ++{ix})"), ev.scope():
                xx = kc.tmp("xx")
                w.line(f"const {rct} {xx} = {x0} + ({rct}){pw} * {bw} + (({rct}){ix} + {L(0.5)}) * {bw} / "
                       f"({rct}){gw};")
                # A point outside [-1, size] contributes 0 (all four weights 0, the corners at 0, 0).
                skip = kc.tmp("skip")
                w.line(f"const int {skip} = {yy} < {L(-1)} || {yy} > {L(H)} || {xx} < {L(-1)} || {xx} > {L(W)};")
                lows = []
                for pos, size in ((yy, H), (xx, W)):
                    p, lo, hi, fr = kc.tmp("p"), kc.tmp("lo"), kc.tmp("hi"), kc.tmp("fr")
                    w.line(f"double {p} = {skip} || {pos} < 0 ? 0.0 : (double){pos};")
                    w.line(f"long {lo} = (long){p}, {hi};")
                    w.line(f"if ({lo} >= {size - 1}) {{ {lo} = {hi} = {size - 1}; {p} = (double){lo}; }} "
                           f"else {hi} = {lo} + 1;")
                    w.line(f"const double {fr} = {p} - (double){lo};")
                    lows.append((lo, hi, fr))
                (ylo, yhi, ly), (xlo, xhi, lx) = lows
                ws = [kc.tmp("w") for _ in range(4)]
                for nm, e in zip(ws, (f"(1.0 - {ly}) * (1.0 - {lx})", f"(1.0 - {ly}) * {lx}", f"{ly} * (1.0 - {lx})",
                                      f"{ly} * {lx}"), strict=True):
                    w.line(f"const double {nm} = {skip} ? 0.0 : {e};")
                with w.block(f"for (long {c} = 0; {c} < {C}; ++{c})"), ev.scope():
                    def at(yi: str, xi: str) -> str:
                        return f"(double){ev.at(x, Index(tuple(x.shape), (b, c, yi, xi)))}"
                    # a skipped point contributes exactly 0: no pixel's NaN or infinity times a zero weight
                    t = [f"({skip} ? 0.0 : {wt} * {at(yi, xi)})" for wt, (yi, xi) in
                         zip(ws, ((ylo, xlo), (ylo, xhi), (yhi, xlo), (yhi, xhi)), strict=True)]
                    if mode == "avg":
                        w.line(f"{acc}[{c}] += {t[0]} + {t[1]} + {t[2]} + {t[3]};")
                    else:
                        names = [kc.tmp("m") for _ in t]
                        for nm, e in zip(names, t, strict=True):
                            w.line(f"const double {nm} = {e};")
                        # NaN-propagating maxima, as the reference's np.maximum (a NaN term is the result)
                        m01, m23, val = kc.tmp("m"), kc.tmp("m"), kc.tmp("val")

                        def larger(a: str, b: str) -> str:
                            return f"({b} > {a} || {b} != {b} ? {b} : {a})"
                        w.line(f"const double {m01} = {larger(names[0], names[1])};")
                        w.line(f"const double {m23} = {larger(names[2], names[3])};")
                        w.line(f"const double {val} = {larger(m01, m23)};")
                        w.line(f"{acc}[{c}] = !{seen} || {val} > {acc}[{c}] || {val} != {val} ? {val} : {acc}[{c}];")
                w.line(f"{seen} = 1;")
        cnt = kc.tmp("cnt")
        w.line(f"const double {cnt} = {gh} * {gw} > 1 ? (double)({gh} * {gw}) : 1.0;")
        with w.block(f"for (long {c} = 0; {c} < {C}; ++{c})"), ev.scope():
            res = kc.tmp("roi")
            w.line(f"const {ct} {res} = ({ct})({acc}[{c}]" + (f" / {cnt});" if mode == "avg" else ");"))
            finish_element(kc, ev, stage, out, Index(tuple(out.shape), (r, c, ph, pw)), res)

    emit_loop_nest(kc, ev, (out.shape[0], oh, ow), body, cost_per_element=C * 16 + 64)


# MaxUnpool -------------------------------------------------------------------------------------
def lower_max_unpool(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """Zero the output (in parallel), then write every input element where its index says, in
    order (the last of equal indices wins, as in the reference). An index addresses the unpooled
    shape, placed in the corner of ``output_shape``; one out of range is clamped into it."""
    from opfuse.ops.sampling import unpool_shapes
    node = stage.anchor_node
    x, ind, out = node.input(0), node.input(1), node.outputs[0]
    inferred, oshape = unpool_shapes(node, _attrs(node))
    emit_loop_nest(kc, ev, out.shape, lambda idx: store(kc, ev, out, idx, literal(0, out.dtype)))
    dst = kc.ptr(out, write=True)
    total = math.prod(inferred)
    i = kc.tmp("s")
    with kc.w.block(f"for (long {i} = 0; {i} < {math.prod(x.shape)}; ++{i})"), ev.scope():
        where = Index.linear(x.shape, i)
        g = kc.tmp("g")
        kc.w.line(f"long {g} = (long){ev.at(ind, where)};")
        checks.index_fault(kc, node, g, 0, total - 1)
        kc.w.line(f"{g} = {g} < 0 ? 0 : ({g} >= {total} ? {total - 1} : {g});")
        dims = delinearize(g, inferred)
        off = add(*(mul(dd, s) for dd, s in zip(dims, contiguous_strides(oshape), strict=True)))
        kc.w.line(f"{dst}[{off}] = {ev.at(x, where)};")


# MaxPool with Indices --------------------------------------------------------------------------
def lower_max_pool_indices(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """MaxPool's values (NaN propagating, as ``pool.py``) and, in the same walk over the window,
    the flat index of the first maximum (``storage_order`` 0: row major, 1: column major)."""
    from opfuse.ops.nn import max_pool_index_strides, window_geometry
    node = stage.anchor_node
    x, out, indices = node.input(0), node.outputs[0], node.outputs[1]
    a = _attrs(node)
    kernel = tuple(int(k) for k in a["kernel_shape"])
    wg = window_geometry(node, a, tuple(x.shape[2:]), kernel, ceil_mode=bool(a["ceil_mode"]))
    spatial = tuple(x.shape[2:])
    istr = max_pool_index_strides(spatial, int(a["storage_order"]))
    plane = math.prod(spatial)
    dt = out.dtype
    ct = c_type(dt)
    stored = {id(v) for v in stage.outputs}
    rest = dataclasses.replace(stage, outputs=[v for v in stage.outputs if v is not indices])

    def body(oidx: Index):
        acc, best, at = kc.tmp("acc"), kc.tmp("best"), kc.tmp("at")
        kc.w.line(f"{ct} {acc} = {lowest(dt)}, {best} = {lowest(dt)};")
        kc.w.line(f"long {at} = -1;")
        dims = [oidx.dims[0], oidx.dims[1]]
        flat = []
        opened = 0
        for s in range(len(kernel)):
            k, pos = kc.tmp("k"), kc.tmp("p")
            kc.w.line(f"for (long {k} = 0; {k} < {kernel[s]}; ++{k}) {{")
            kc.w.level += 1
            opened += 1
            start = add(mul(oidx.dims[2 + s], wg.strides[s]), str(-wg.pads_begin[s]))
            kc.w.line(f"const long {pos} = {add(start, mul(k, wg.dilations[s]))};")
            kc.w.line(f"if ({pos} < 0 || {pos} >= {spatial[s]}) continue;")
            dims.append(pos)
            flat.append(mul(pos, istr[s]))
        with ev.scope():
            v = ev.at(x, Index(tuple(x.shape), tuple(dims)))
            kc.w.line(f"{acc} = {nan_max(v, acc, dt)};")
            with kc.w.block(f"if ({at} < 0 || {v} > {best})"):
                kc.w.line(f"{best} = {v};")
                kc.w.line(f"{at} = {add(*flat)};")
        for _ in range(opened):
            kc.w.level -= 1
            kc.w.line("}")
        if id(indices) in stored:
            base = add(mul(oidx.dims[0], x.shape[1] * plane), mul(oidx.dims[1], plane))
            store(kc, ev, indices, oidx, f"(int64_t)({add(base, at)})")
        finish_element(kc, ev, rest, out, oidx, acc)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=max(math.prod(kernel), 1))
