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
        elif trailing:
            a0 = rank - len(axes)

            def element(j):
                dims = base[:a0] + delinearize(j, shape[a0:])
                return ev.at(x, Index(shape, tuple(dims), ((a0, rank, j),)))
            lane_reduce(kc, ct, acc_init, combine, count, element, total, keep_lane_loop=kind == "max")
        else:
            kc.w.line(f"{ct} {total} = {acc_init};")
            dims = list(base)
            opened = 0
            for d in axes:
                var = kc.tmp("r")
                kc.w.line(f"for (long {var} = 0; {var} < {shape[d]}; ++{var}) {{")
                kc.w.level += 1
                opened += 1
                dims[d] = var
            with ev.scope():
                kc.w.line(f"{total} = {combine(total, ev.at(x, Index(shape, tuple(dims))))};")
            for _ in range(opened):
                kc.w.level -= 1
                kc.w.line("}")
        result = total
        if kind == "mean":
            if is_float(dt):
                result = f"{total} / {literal(count, dt)}"
            else:
                result = f"({ct})({total} / {count})"
        res = kc.tmp("red")
        kc.w.line(f"const {ct} {res} = {result};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=max(count, 1))


