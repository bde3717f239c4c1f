"""TopK: the k best values of every row along ``axis``, and their indices, best first.

One pass over the row keeps the best ``k`` so far in a per-thread scratch list, sorted: an
element better than the list's last is inserted at its place (insertion sort, O(n k) per row,
no branch on the data beyond the comparisons). "Better" is larger (smaller with
``largest=0``), NaN counting as the largest value; an element equal to one already kept goes
after it, so equal values come out in index order, as the reference orders them.
"""
from __future__ import annotations

from opfuse.codegen.ctype import c_type
from opfuse.codegen.index import Index
from opfuse.codegen.loops import emit_loop_nest, store
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.common import norm_axis
from opfuse.ops.registry import get_spec


def lower_topk(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    from opfuse.ops.scatter import topk_k
    node = stage.anchor_node
    x = node.input(0)
    a = get_spec(node.op_type, node).attrs_of(node)
    shape = x.shape
    axis = norm_axis(int(a["axis"]), len(shape), node)
    k, L = topk_k(node), shape[axis]
    dt = x.dtype
    ct = c_type(dt)
    stored = {id(v) for v in stage.outputs}
    values = node.outputs[0] if id(node.outputs[0]) in stored else None
    indices = node.outputs[1] if len(node.outputs) > 1 and id(node.outputs[1]) in stored else None
    largest = bool(int(a["largest"]))

    def better(v: str, w: str) -> str:
        if largest:
            return f"({v} > {w} || ({v} != {v} && {w} == {w}))"
        return f"({v} < {w} || ({w} != {w} && {v} == {v}))"

    row_shape = tuple(1 if d == axis else n for d, n in enumerate(shape))

    def body(ridx: Index):
        if k == 0:
            return
        vals, pos = kc.tmp("topv"), kc.tmp("topi")
        kc.w.line(f"{ct}* restrict {vals} = {kc.scratch_ptr(ct, kc.scratch(k * dt.itemsize))};")
        kc.w.line(f"long* restrict {pos} = {kc.scratch_ptr('long', kc.scratch(k * 8))};")
        n, j = kc.tmp("n"), kc.tmp("j")
        kc.w.line(f"long {n} = 0;")
        with kc.w.block(f"for (long {j} = 0; {j} < {L}; ++{j})"), ev.scope():
            dims = list(ridx.dims)
            dims[axis] = j
            v = ev.at(x, Index(tuple(shape), tuple(dims)))
            kc.w.line(f"if ({n} == {k} && !{better(v, f'{vals}[{k - 1}]')}) continue;")
            p = kc.tmp("p")
            kc.w.line(f"long {p} = {n} < {k} ? {n}++ : {k - 1};")
            with kc.w.block(f"for (; {p} > 0 && {better(v, f'{vals}[{p} - 1]')}; --{p})"):
                kc.w.line(f"{vals}[{p}] = {vals}[{p} - 1];")
                kc.w.line(f"{pos}[{p}] = {pos}[{p} - 1];")
            kc.w.line(f"{vals}[{p}] = {v};")
            kc.w.line(f"{pos}[{p}] = {j};")
        r = kc.tmp("r")
        with kc.w.block(f"for (long {r} = 0; {r} < {k}; ++{r})"):
            dims = list(ridx.dims)
            dims[axis] = r
            oidx = Index(tuple(values.shape if values is not None else node.outputs[1].shape), tuple(dims))
            if values is not None:
                store(kc, ev, values, oidx, f"{vals}[{r}]")
            if indices is not None:
                store(kc, ev, indices, oidx, f"(int64_t){pos}[{r}]")

    emit_loop_nest(kc, ev, row_shape, body, cost_per_element=max(L * max(k, 1), 1))
