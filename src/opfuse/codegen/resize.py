"""Resize as an index map with tables computed at build time.

The source coordinate of every output position (``opfuse.ops.shape_ops.source_coordinates``,
the reference's own function) depends only on static facts, so it is evaluated once in
Python: nearest mode stores the chosen input index per output position, linear mode the
two neighbours and the weight, cubic and antialiased modes a window of taps (indices and
weights, ``opfuse.ops.shape_ops.resize_taps``) per output position, summed in C loops. The
kernel then reads ``x`` through those tables; linear interpolation combines the ``2^k``
neighbours in the reference's order (axis by axis, lowest axis first) in double precision.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.codegen.ctype import c_type, is_float, literal
from opfuse.codegen.index import Index
from opfuse.ir.graph import Node
from opfuse.ops.registry import get_spec


def _nearest_index(coord: np.ndarray, mode: str) -> np.ndarray:
    floor = np.floor(coord)
    frac = coord - floor
    if mode == "round_prefer_floor":
        return np.where(frac <= 0.5, floor, floor + 1)
    if mode == "round_prefer_ceil":
        return np.where(frac < 0.5, floor, floor + 1)
    if mode == "floor":
        return floor
    return np.ceil(coord)


def _nearest_table(a: dict, coord: np.ndarray, last: int) -> np.ndarray:
    """The input index nearest mode reads for each output position along one axis (clamped)."""
    return np.clip(_nearest_index(coord, a["nearest_mode"]), 0, last).astype(np.int32)


def nearest_factors(node) -> tuple[int, ...] | None:
    """Per axis, the integer factor ``s`` by which a nearest-mode Resize repeats each input position
    (output ``o`` reads input ``o // s``, ``out = in * s``; 1 where the axis is untouched), or None when
    the Resize is not nearest, has a region of interest, or maps some axis otherwise (a fraction, a
    shrink, a half-pixel rounding that shifts the runs)."""
    from opfuse.ops.shape_ops import resize_plan, source_coordinates, uses_taps
    a = get_spec(node.op_type, node).attrs_of(node)
    if a["mode"] != "nearest" or uses_taps(a):
        return None
    x = node.input(0)
    out, scale, roi = resize_plan(node, a)
    if roi is not None:
        return None
    factors = []
    for axis, n in enumerate(x.shape):
        if out[axis] == n and scale[axis] == 1.0:
            factors.append(1)
            continue
        if n == 0 or out[axis] % n:
            return None
        s = out[axis] // n
        coord = source_coordinates(a["coordinate_transformation_mode"], out[axis], n, scale[axis], None)
        if not np.array_equal(_nearest_table(a, coord, n - 1), np.arange(out[axis]) // s):
            return None
        factors.append(s)
    return tuple(factors)


def upsampling(inline_nodes, shape) -> "tuple[Node, int, int] | None":
    """``(node, sh, sw)`` when exactly one Resize is computed inline in a stage over ``shape`` and it is a
    nearest upsampling by integer factors along the last two axes only (``nearest_factors``) whose output
    has the stage's shape; None otherwise."""
    resizes = [n for n in inline_nodes if n.op_type == "Resize"]
    if len(resizes) != 1 or len(shape) < 2:
        return None
    node = resizes[0]
    if tuple(node.outputs[0].shape) != tuple(shape):
        return None
    f = nearest_factors(node)
    if f is None or any(s != 1 for s in f[:-2]) or f[-2:] == (1, 1):
        return None
    return node, f[-2], f[-1]


def _reads(outs, y, inline: set[int]) -> bool:
    """Whether computing ``outs`` inline reads ``y`` (``y`` is one of them, or an operand of an inline op on
    the way)."""
    todo, seen = list(outs), set()
    while todo:
        v = todo.pop()
        if v is y:
            return True
        if id(v) in seen or v.producer is None or id(v.producer) not in inline:
            continue
        seen.add(id(v))
        todo.extend(v.producer.input_values())
    return False


def emit_upsampling(kc, ev, outs, shape, inline_nodes, body, cost: int) -> bool:
    """A pointwise stage over ``shape`` that reads through one nearest Resize upsampling by integer factors
    ``sh``, ``sw`` along the last two axes (``upsampling``), written without its index tables
    (``CodegenOptions.resize_nearest_rows``):

    * the Resize is the stage's one output: each input position is computed once (the group's ops
      before the Resize at the input's size), stored ``sw`` times along its output row, and each finished
      output row is copied to the ``sh - 1`` rows that repeat it;
    * otherwise (ops after the Resize, other outputs): the output columns are visited as ``sw``
      neighbours per input column, the Resize's value computed once for them, and the input row of an
      output row is its index divided by ``sh``.

    Same values as the tables give (every Resize output element is a copy of the element they read).
    False (nothing written) where it does not apply."""
    if not kc.program.options.resize_nearest_rows:
        return False
    found = upsampling(inline_nodes, shape)
    if found is None:
        return False
    node, sh, sw = found
    x, y = node.input(0), node.outputs[0]
    if not _reads(outs, y, {id(n) for n in inline_nodes}):
        return False
    r = len(shape)
    H, W = x.shape[-2:]
    OH, OW = shape[-2:]
    lead = math.prod(shape[:-2])
    if lead * H * W == 0:
        return False
    w = kc.w
    lv, oh, ih, iw = kc.tmp("i"), kc.tmp("oh"), kc.tmp("ih"), kc.tmp("iw")
    groups = [(0, r - 2, lv)] if r > 2 else []
    rows_only = len(outs) == 1 and outs[0] is y
    row_var = ih if rows_only else oh
    work = lead * OH * OW * cost
    kc.parallel_for(work, 2 if lead < kc.program.options.parallel_min_outer else 1)
    w.line(f"for (long {lv} = 0; {lv} < {lead}; ++{lv}) {{")
    w.line(f"  for (long {row_var} = 0; {row_var} < {H if rows_only else OH}; ++{row_var}) {{")
    w.level += 2
    at_x = Index.loops(x.shape, [*groups, (r - 2, r - 1, ih), (r - 1, r, iw)])
    if rows_only:
        ct = c_type(y.dtype)
        row, val, k = kc.tmp("row"), kc.tmp("v"), kc.tmp("k")
        w.line(f"{ct}* restrict {row} = {kc.ptr(y, write=True)} + ({lv} * {OH} + {ih} * {sh}) * {OW};")
        with w.block(f"for (long {iw} = 0; {iw} < {W}; ++{iw})"), ev.scope():
            w.line(f"const {ct} {val} = {ev.at(x, at_x)};")
            for j in range(sw):
                w.line(f"{row}[{iw} * {sw} + {j}] = {val};" if sw > 1 else f"{row}[{iw}] = {val};")
        if sh > 1:
            w.line(f"for (int {k} = 1; {k} < {sh}; ++{k}) memcpy({row} + {k} * {OW}, {row}, {OW} * sizeof({ct}));")
    else:
        w.line(f"const long {ih} = {oh} / {sh};" if sh > 1 else f"const long {ih} = {oh};")
        at_out = Index.loops(shape, [*groups, (r - 2, r - 1, oh), (r - 1, r, iw)])
        with w.block(f"for (long {iw} = 0; {iw} < {W}; ++{iw})"), ev.scope():
            val = ev.at(x, at_x)
            for j in range(sw):
                col = f"({iw} * {sw} + {j})" if sw > 1 else iw
                idx = Index(at_out.shape, at_out.dims[:-1] + (col,), at_out.runs)
                with w.block(""), ev.scope():
                    ev.remember(y, idx, val)
                    body(idx)
    w.level -= 2
    w.line("  }")
    w.line("}")
    return True


def resize_rule(ev, node, idx: Index) -> str:
    from opfuse.ops.shape_ops import resize_plan, resize_taps, source_coordinates, uses_taps
    a = get_spec(node.op_type, node).attrs_of(node)
    x = node.input(0)
    dt = node.outputs[0].dtype
    out, scale, roi = resize_plan(node, a)
    rank = len(x.shape)
    kc = ev.kc
    dims = list(idx.dims)
    linear: list[tuple[int, str, str, str]] = []  # (axis, lo expr, hi expr, weight expr)
    windows: list[tuple[int, int, str, str, str]] = []  # (axis, taps, index table, weight table, o)
    outside: list[str] = []
    for axis in range(rank):
        if out[axis] == x.shape[axis] and scale[axis] == 1.0 and roi is None:
            continue
        axis_roi = (roi[axis], roi[rank + axis]) if roi is not None else None
        coord = source_coordinates(a["coordinate_transformation_mode"], out[axis], x.shape[axis],
                                   scale[axis], axis_roi)
        last = x.shape[axis] - 1
        o = idx.dims[axis]
        tag = (node.name, axis)
        if roi is not None:
            mask = ((coord < 0) | (coord > last)).astype(np.uint8)
            if mask.any():
                p = kc.const_array(("resize_out",) + tag, mask, f"{node.name}_out{axis}", np.uint8)
                outside.append(f"{p}[{o}]")
        if uses_taps(a):
            tidx, tw = resize_taps(coord, scale[axis], x.shape[axis], a)
            pi = kc.const_array(("resize_taps_idx",) + tag, tidx.astype(np.int32), f"{node.name}_ti{axis}", np.int32)
            pw = kc.const_array(("resize_taps_w",) + tag, tw, f"{node.name}_tw{axis}", np.float64)
            windows.append((axis, tidx.shape[1], pi, pw, o))
        elif a["mode"] == "nearest":
            table = _nearest_table(a, coord, last)
            p = kc.const_array(("resize_idx",) + tag, table, f"{node.name}_idx{axis}", np.int32)
            dims[axis] = f"{p}[{o}]"
        else:
            lo = np.floor(coord)
            w = coord - lo
            lo_t = np.clip(lo, 0, last).astype(np.int32)
            hi_t = np.clip(lo + 1, 0, last).astype(np.int32)
            plo = kc.const_array(("resize_lo",) + tag, lo_t, f"{node.name}_lo{axis}", np.int32)
            phi = kc.const_array(("resize_hi",) + tag, hi_t, f"{node.name}_hi{axis}", np.int32)
            pw = kc.const_array(("resize_w",) + tag, w, f"{node.name}_w{axis}", np.float64)
            linear.append((axis, f"{plo}[{o}]", f"{phi}[{o}]", f"{pw}[{o}]"))

    def value(dims_now: list[str], pending: list[tuple[int, str, str, str]]) -> str:
        if not pending:
            return f"(double){ev.at(x, Index(tuple(x.shape), tuple(dims_now)))}"
        axis, lo, hi, w = pending[-1]
        d_lo, d_hi = list(dims_now), list(dims_now)
        d_lo[axis], d_hi[axis] = lo, hi
        v_lo = value(d_lo, pending[:-1])
        v_hi = value(d_hi, pending[:-1])
        name = kc.tmp("lerp")
        ev.w.line(f"const double {name} = {v_lo} * (1.0 - {w}) + {v_hi} * {w};")
        return name

    def window_value(dims_now: list[str], pending: list[tuple[int, int, str, str, str]]) -> str:
        """Sum over the taps of the highest pending axis of its weight times the value of the
        lower axes' window there: the lowest axis is combined first, as the reference resizes."""
        if not pending:
            return f"(double){ev.at(x, Index(tuple(x.shape), tuple(dims_now)))}"
        axis, n, pi, pw, o = pending[-1]
        acc, t = kc.tmp("racc"), kc.tmp("t")
        ev.w.line(f"double {acc} = 0.0;")
        with ev.w.block(f"for (int {t} = 0; {t} < {n}; ++{t})"), ev.scope():
            d = list(dims_now)
            d[axis] = f"{pi}[{o} * {n} + {t}]"
            inner = window_value(d, pending[:-1])
            ev.w.line(f"{acc} += {pw}[{o} * {n} + {t}] * {inner};")
        return acc

    res = kc.tmp("rs")
    ct = c_type(dt)
    ev.w.line(f"{ct} {res} = ({ct}){literal(a['extrapolation_value'], np.float64)};" if outside
              else f"{ct} {res};")
    head = f"if (!({' || '.join(outside)}))" if outside else ""
    with ev.w.block(head), ev.scope():
        if not linear and not windows:
            ev.w.line(f"{res} = {ev.at(x, Index(tuple(x.shape), tuple(dims)))};")
        else:
            v = window_value(dims, windows) if windows else value(dims, linear)
            if is_float(dt):
                ev.w.line(f"{res} = ({ct}){v};")
            else:
                info = np.iinfo(dt)
                r = kc.tmp("r")
                ev.w.line(f"double {r} = rint({v});")
                ev.w.line(f"{r} = {r} < {float(info.min)!r} ? {float(info.min)!r} : "
                          f"({r} > {float(info.max)!r} ? {float(info.max)!r} : {r});")
                ev.w.line(f"{res} = ({ct}){r};")
    return res
