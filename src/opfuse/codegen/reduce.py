"""Reductions (ReduceMean/Sum/Max, GlobalAveragePool) with fused prologue and epilogue.

One output element per iteration of the outer loops. When the reduced axes are the
trailing ones (LayerNorm's statistics, global pooling), the inner loop walks one
contiguous run with ``REDUCTION_LANES`` partial results (vectorised, deterministic order);
otherwise it nests one loop per reduced axis.
"""
from __future__ import annotations

import math


from opfuse.codegen.ctype import c_type, is_float, literal, lowest
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


def _int_mean(kc, q: str, r: str, count: int, ct: str) -> str:
    """trunc(mean) from q = sum(x / n) and r = sum(x % n): mean = t + u / n with t = q + r / n,
    u = r % n (|u| < n, the sign of r); truncating it moves t one step toward zero when t and u
    have opposite signs."""
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
            kc.w.line(f"int64_t {total} = 0, {rem} = 0;" if int_mean else f"{ct} {total} = {acc_init};")
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
                    kc.w.line(f"{total} += (int64_t){v} / {count}; {rem} += (int64_t){v} % {count};")
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
                result = _int_mean(kc, total, rem, count, ct)
            else:
                result = "0"  # an empty reduction (the reference has no value either)
        res = kc.tmp("red")
        kc.w.line(f"const {ct} {res} = {result};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=max(count, 1))


