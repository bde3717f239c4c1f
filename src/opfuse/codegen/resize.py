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

import numpy as np

from opfuse.codegen.ctype import c_type, is_float, literal
from opfuse.codegen.index import Index
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
            d[axis] = f"{pi}[({o}) * {n} + {t}]"
            inner = window_value(d, pending[:-1])
            ev.w.line(f"{acc} += {pw}[({o}) * {n} + {t}] * {inner};")
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
