"""Reductions (ReduceMean/Sum/Max, GlobalAveragePool; ReduceMin/Prod/L1/L2/SumSquare/LogSum/
LogSumExp, GlobalMaxPool in ``lower_reduction``; ArgMax/ArgMin) with fused prologue and epilogue.

One output element per iteration of the outer loops. When the reduced axes are the
trailing ones (LayerNorm's statistics, global pooling), the inner loop walks one
contiguous run with ``REDUCTION_LANES`` partial results (vectorised, deterministic order);
otherwise it nests one loop per reduced axis.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from opfuse.codegen import vecmath
from opfuse.codegen.ctype import c_type, highest, is_float, literal, lowest, math_fn
from opfuse.codegen.index import Index, delinearize
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.loops import emit_loop_nest, lane_reduce
from opfuse.codegen.rules import nan_max
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec


def _reduce_params(node):
    """(kind, axes, keepdims) of a reduction node."""
    x = node.input(0)
    rank = len(x.shape)
    if node.op_type == "GlobalAveragePool":
        return "mean", tuple(range(2, rank)), True
    from opfuse.ops.reduce import reduce_axes
    a = get_spec(node.op_type, node).attrs_of(node)
    axes = reduce_axes(node, a)
    kind = {"ReduceMean": "mean", "ReduceSum": "sum", "ReduceMax": "max"}[node.op_type]
    if axes is None:
        return "identity", (), True
    return kind, axes, bool(int(a["keepdims"]))


def _int_mean(kc, q: str, r: str, count: int, ct: str, unsigned: bool = False) -> str:
    """trunc(mean) from q = sum(x / n) and r = sum(x % n): mean = t + u / n with t = q + r / n,
    u = r % n (|u| < n, the sign of r); truncating it moves t one step toward zero when t and u
    have opposite signs. Unsigned (``uint64_t`` sums: a uint64 above 2^63 is no int64): q + r / n."""
    if unsigned:
        return f"({ct})({q} + {r} / {count})"
    t, u = kc.tmp("t"), kc.tmp("u")
    kc.w.line(f"const int64_t {t} = {q} + {r} / {count}, {u} = {r} % {count};")
    return f"({ct})({t} > 0 && {u} < 0 ? {t} - 1 : ({t} < 0 && {u} > 0 ? {t} + 1 : {t}))"


def lower_reduce(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    x = node.input(0)
    out = node.outputs[0]
    kind, axes, keep = _reduce_params(node)
    shape = x.shape
    rank = len(shape)
    dt = out.dtype
    ct = c_type(dt)
    count = math.prod(shape[a] for a in axes)
    kept = [d for d in range(rank) if d not in axes]
    trailing = bool(axes) and list(axes) == list(range(rank - len(axes), rank))
    acc_init = lowest(dt) if kind == "max" else literal(0, dt)
    # The mean of integers is exact, truncated toward zero (as onnxruntime): quotients and
    # remainders by the count are summed apart, so no sum overflows (``_int_mean``).
    int_mean = kind == "mean" and not is_float(dt) and count > 0
    unsigned = np.dtype(dt).kind == "u"
    acc_int = "uint64_t" if unsigned else "int64_t"

    def combine(a, b):
        return nan_max(b, a, dt) if kind == "max" else f"{a} + {b}"

    def body(oidx: Index):
        # Input axes that are kept come from the output index.
        base = ["0"] * rank
        for i, d in enumerate(kept):
            base[d] = oidx.dims[d] if keep else oidx.dims[i]
        total = kc.tmp("acc")
        if kind == "identity":
            kc.w.line(f"const {ct} {total} = {ev.at(x, Index(shape, tuple(base)))};")
        elif trailing and not int_mean:
            a0 = rank - len(axes)

            def element(j):
                dims = base[:a0] + delinearize(j, shape[a0:])
                return ev.at(x, Index(shape, tuple(dims), ((a0, rank, j),)))
            lane_reduce(kc, ct, acc_init, combine, count, element, total, keep_lane_loop=kind == "max",
                        scope=ev.scope)
        else:
            rem = kc.tmp("rem")
            kc.w.line(f"{acc_int} {total} = 0, {rem} = 0;" if int_mean else f"{ct} {total} = {acc_init};")
            dims = list(base)
            opened = 0
            for d in axes:
                var = kc.tmp("r")
                kc.w.line(f"for (long {var} = 0; {var} < {shape[d]}; ++{var}) {{")
                kc.w.level += 1
                opened += 1
                dims[d] = var
            with ev.scope():
                v = ev.at(x, Index(shape, tuple(dims)))
                if int_mean:
                    kc.w.line(f"{total} += ({acc_int}){v} / {count}; {rem} += ({acc_int}){v} % {count};")
                else:
                    kc.w.line(f"{total} = {combine(total, v)};")
            for _ in range(opened):
                kc.w.level -= 1
                kc.w.line("}")
        result = total
        if kind == "mean":
            if is_float(dt):
                result = f"{total} / {literal(count, dt)}"
            elif int_mean:
                result = _int_mean(kc, total, rem, count, ct, unsigned)
            else:
                result = "0"  # an empty reduction (the reference has no value either)
        res = kc.tmp("red")
        kc.w.line(f"const {ct} {res} = {result};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=max(count, 1))




# The reductions issue 12 added, as data ------------------------------------------------------
# Each is ``acc = init; acc = combine(acc, element(x))`` over the reduced elements, then
# ``finish(acc)``; ReduceLogSumExp first takes the max ``m`` (0 if infinite) and reduces
# ``exp(x - m)``, finishing with ``m + log(acc)``. Min and max propagate NaN, as NumPy's.

@dataclass(frozen=True)
class Reduction:
    init: Callable[[np.dtype], str]
    combine: Callable[[str, str], str]
    element: Callable[[object, str, np.dtype], str] = lambda kc, x, dt: x
    finish: Callable[[object, str, np.dtype], str] = lambda kc, acc, dt: acc


def _running_max(acc: str, v: str) -> str:
    """The accumulator after ``v``: the larger, NaN as soon as either is (``np.maximum``)."""
    return f"({v} > {acc} || {v} != {v} ? {v} : {acc})"


def _running_min(acc: str, v: str) -> str:
    return f"({v} < {acc} || {v} != {v} ? {v} : {acc})"


def _add(a: str, b: str) -> str:
    return f"{a} + {b}"


def _fn(kc, name: str, helper: str | None, dt) -> str:
    """A unary C function on ``dt``: the vectorised helper for float32, else libm (in double for
    integers, whose results the reference truncates)."""
    if np.dtype(dt) == np.float32 and helper is not None:
        return vecmath.require(kc.program, helper)
    return math_fn(name, dt) if is_float(dt) else name


def _as(dt, expr: str) -> str:
    return expr if is_float(dt) else f"({c_type(dt)})({expr})"


def _via_double(dt, x: str) -> str:
    return x if is_float(dt) else f"(double)({x})"


REDUCTIONS: dict[str, Reduction] = {
    "ReduceMin": Reduction(highest, _running_min),
    "ReduceProd": Reduction(lambda dt: literal(1, dt), lambda a, b: f"{a} * {b}"),
    "ReduceL1": Reduction(lambda dt: literal(0, dt), _add,
                          element=lambda kc, x, dt: f"{math_fn('fabs', dt)}({x})" if is_float(dt)
                          else f"({x} < 0 ? -{x} : {x})"),
    "ReduceL2": Reduction(lambda dt: literal(0, dt), _add, element=lambda kc, x, dt: f"{x} * {x}",
                          finish=lambda kc, acc, dt: _as(dt, f"{math_fn('sqrt', dt) if is_float(dt) else 'sqrt'}"
                                                             f"({_via_double(dt, acc)})")),
    "ReduceSumSquare": Reduction(lambda dt: literal(0, dt), _add, element=lambda kc, x, dt: f"{x} * {x}"),
    "ReduceLogSum": Reduction(lambda dt: literal(0, dt), _add,
                              finish=lambda kc, acc, dt: _as(dt, f"{_fn(kc, 'log', vecmath.LOG, dt)}"
                                                                 f"({_via_double(dt, acc)})")),
    "GlobalMaxPool": Reduction(lowest, _running_max),
}
LOG_SUM_EXP = "ReduceLogSumExp"


def _reduction_geometry(node):
    """(axes, keepdims) of a node of ``REDUCTIONS`` (``None`` axes: the identity)."""
    if node.op_type == "GlobalMaxPool":
        return tuple(range(2, len(node.input(0).shape))), True
    from opfuse.ops.reduce import reduce_axes
    a = get_spec(node.op_type, node).attrs_of(node)
    return reduce_axes(node, a), bool(int(a["keepdims"]))


def lower_reduction(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """One output element per iteration of the outer loops; the reduced elements are walked as
    ``lower_reduce`` walks them (lane partial results over a trailing run, else nested loops)."""
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    axes, keep = _reduction_geometry(node)
    shape, rank, dt = x.shape, len(x.shape), out.dtype
    ct = c_type(dt)
    count = math.prod(shape[a] for a in axes) if axes is not None else 1
    kept = [d for d in range(rank) if axes is None or d not in axes]

    def reduce_into(base, total, init, combine, element):
        if not axes:  # a rank-0 input: the one element
            with ev.scope():
                kc.w.line(f"const {ct} {total} = {combine(init, element(ev.at(x, Index(shape, tuple(base)))))};")
            return
        trailing = list(axes) == list(range(rank - len(axes), rank))
        if trailing:
            a0 = rank - len(axes)

            def at(j):
                dims = base[:a0] + delinearize(j, shape[a0:])
                return element(ev.at(x, Index(shape, tuple(dims), ((a0, rank, j),))))
            lane_reduce(kc, ct, init, combine, count, at, total, scope=ev.scope)
            return
        kc.w.line(f"{ct} {total} = {init};")
        dims = list(base)
        for d in axes:
            var = kc.tmp("r")
            kc.w.line(f"for (long {var} = 0; {var} < {shape[d]}; ++{var}) {{")
            kc.w.level += 1
            dims[d] = var
        with ev.scope():
            kc.w.line(f"{total} = {combine(total, element(ev.at(x, Index(shape, tuple(dims)))))};")
        for _ in axes:
            kc.w.level -= 1
            kc.w.line("}")

    def body(oidx: Index):
        base = ["0"] * rank
        for i, d in enumerate(kept):
            base[d] = oidx.dims[d] if keep else oidx.dims[i]
        res = kc.tmp("red")
        if axes is None:
            kc.w.line(f"const {ct} {res} = {ev.at(x, Index(shape, tuple(base)))};")
        elif node.op_type == LOG_SUM_EXP:
            mx = kc.tmp("mx")
            reduce_into(base, mx, lowest(dt), _running_max, lambda v: v)
            m = kc.tmp("m")
            kc.w.line(f"const {ct} {m} = ({mx} == {lowest(dt)} || {mx} == {highest(dt)}) ? {literal(0, dt)} : {mx};")
            s = kc.tmp("sum")
            exp = _fn(kc, "exp", vecmath.EXP, dt)
            reduce_into(base, s, literal(0, dt), _add, lambda v: f"{exp}({v} - {m})")
            kc.w.line(f"const {ct} {res} = {m} + {_fn(kc, 'log', vecmath.LOG, dt)}({s});")
        else:
            r = REDUCTIONS[node.op_type]
            total = kc.tmp("acc")
            reduce_into(base, total, r.init(dt), r.combine, lambda v: r.element(kc, v, dt))
            kc.w.line(f"const {ct} {res} = {r.finish(kc, total, dt)};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=max(count, 1))


# ArgMax / ArgMin ----------------------------------------------------------------------------
def lower_arg_reduce(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    """The index of the first (``select_last_index``: last) max/min along one axis, NaN counting
    as the extreme (NumPy's argmax/argmin). One sequential walk per output element."""
    from opfuse.ops.common import norm_axis
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    a = get_spec(node.op_type, node).attrs_of(node)
    shape, rank = x.shape, len(x.shape)
    axis = norm_axis(int(a["axis"]), rank, node)
    keep, last = bool(int(a["keepdims"])), bool(int(a["select_last_index"]))
    ct = c_type(x.dtype)
    beats = ">" if node.op_type == "ArgMax" else "<"

    def body(oidx: Index):
        dims = list(oidx.dims) if keep else list(oidx.dims[:axis]) + ["0"] + list(oidx.dims[axis:])
        best, at = kc.tmp("best"), kc.tmp("at")
        dims[axis] = "0"
        with ev.scope():
            kc.w.line(f"{ct} {best} = {ev.at(x, Index(shape, tuple(dims)))};")
        kc.w.line(f"int64_t {at} = 0;")
        r = kc.tmp("r")
        dims[axis] = r
        with kc.w.block(f"for (long {r} = 1; {r} < {shape[axis]}; ++{r})"), ev.scope():
            v = ev.at(x, Index(shape, tuple(dims)))
            if last:
                cond = f"{v} {beats}= {best} || {v} != {v}"
            else:
                cond = f"{v} {beats} {best} || ({v} != {v} && {best} == {best})"
            with kc.w.block(f"if ({cond})"):
                kc.w.line(f"{best} = {v};")
                kc.w.line(f"{at} = {r};")
        finish_element(kc, ev, stage, out, oidx, at)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=max(shape[axis], 1))
