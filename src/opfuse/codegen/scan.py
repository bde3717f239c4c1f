"""CumSum and CumProd: a running sum (product) along one axis, with fused prologue and epilogue.

    y[..., i, ...] = sum_{j <= i} x[..., j, ...]      (exclusive: j < i; reverse: j >= i, j > i)

Every row (all axes but the scanned one) is one sequential walk: the accumulator is in
registers, each element goes through the epilogue as it is finished. The outer loops run over
the rows, in parallel when there are enough; the sum (product) is in the tensor's own type,
in order.
"""
from __future__ import annotations

from opfuse.codegen.ctype import c_type, literal
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec


def lower_cumsum(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    from opfuse.ops.reduce import cumsum_axis
    node = stage.anchor_node
    x, out = node.input(0), node.outputs[0]
    a = get_spec(node.op_type, node).attrs_of(node)
    axis = cumsum_axis(node)
    shape = x.shape
    L = shape[axis]
    dt = out.dtype
    ct = c_type(dt)
    reverse, exclusive = bool(int(a["reverse"])), bool(int(a["exclusive"]))
    row_shape = tuple(1 if d == axis else n for d, n in enumerate(shape))
    op = "*" if node.op_type == "CumProd" else "+"

    def body(ridx: Index):
        acc = kc.tmp("acc")
        kc.w.line(f"{ct} {acc} = {literal(1 if op == '*' else 0, dt)};")
        r = kc.tmp("r")
        pos = f"{L - 1} - {r}" if reverse else r
        with kc.w.block(f"for (long {r} = 0; {r} < {L}; ++{r})"), ev.scope():
            dims = list(ridx.dims)
            dims[axis] = pos
            idx = Index(tuple(shape), tuple(dims))
            v = ev.at(x, idx)
            y = kc.tmp("y")
            if exclusive:
                kc.w.line(f"const {ct} {y} = {acc};")
                kc.w.line(f"{acc} = {acc} {op} {v};")
            else:
                kc.w.line(f"{acc} = {acc} {op} {v};")
                kc.w.line(f"const {ct} {y} = {acc};")
            finish_element(kc, ev, stage, out, idx, y)

    emit_loop_nest(kc, ev, row_shape, body, cost_per_element=max(L, 1))
