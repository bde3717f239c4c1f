"""ScatterND and ScatterElements: copy the data, then write the updates where the indices say.

Two loop nests in one kernel: the copy (``out = data``, through the data's prologue, in
parallel) and the scatter, one update at a time in index order (so duplicates combine in the
reference's order and ``reduction="none"`` keeps the last). Indices are resolved (negative
from the end) and clamped into range: a bad index never writes outside the output, and it sets the
node's fault flag, so the run fails with the reference's error (``checks.index_fault``).
"""
from __future__ import annotations

import math

from opfuse.codegen import checks
from opfuse.codegen.index import Index, contiguous_strides, delinearize
from opfuse.codegen.loops import emit_loop_nest, store
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec

COMBINE = {"none": "{u}", "add": "{o} + {u}", "mul": "{o} * {u}",
           "max": "({u} > {o} ? {u} : {o})", "min": "({u} < {o} ? {u} : {o})"}


def _resolved(kc, node, raw: str, dim: int) -> str:
    g = kc.tmp("g")
    kc.w.line(f"long {g} = (long)({raw});")
    checks.index_fault(kc, node, g, -dim, dim - 1)
    kc.w.line(f"{g} = {g} < 0 ? {g} + {dim} : {g};")
    kc.w.line(f"{g} = {g} < 0 ? 0 : ({g} >= {dim} ? {dim - 1} : {g});")
    return g


def lower_scatter(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    node = stage.anchor_node
    data, ind, upd = node.input(0), node.input(1), node.input(2)
    out = node.outputs[0]
    a = get_spec(node.op_type, node).attrs_of(node)
    emit_loop_nest(kc, ev, out.shape, lambda idx: store(kc, ev, out, idx, ev.at(data, idx.broadcast_to(data.shape))))
    dst = kc.ptr(out, write=True)
    strides = contiguous_strides(out.shape)
    combine = COMBINE[a["reduction"]]
    i = kc.tmp("s")
    if node.op_type == "ScatterElements":
        axis = a["axis"] + len(out.shape) if a["axis"] < 0 else a["axis"]
        count = math.prod(ind.shape)
        with kc.w.block(f"for (long {i} = 0; {i} < {count}; ++{i})"), ev.scope():
            where = Index.linear(ind.shape, i) if ind.shape else Index((), ())
            g = _resolved(kc, node, ev.at(ind, where), out.shape[axis])
            dims = list(where.dims)
            dims[axis] = g
            _write(kc, dst, strides, dims, combine, ev.at(upd, where))
    else:  # ScatterND: index tuples over the leading k axes, each writing a slice of the rest
        k = ind.shape[-1]
        tuples = math.prod(ind.shape[:-1])
        rest = out.shape[k:]
        with kc.w.block(f"for (long {i} = 0; {i} < {tuples}; ++{i})"), ev.scope():
            lead = delinearize(i, ind.shape[:-1]) if ind.shape[:-1] else []
            picks = [_resolved(kc, node, ev.at(ind, Index(tuple(ind.shape), tuple(lead) + (str(j),))), out.shape[j])
                     for j in range(k)]
            r = kc.tmp("r")
            with kc.w.block(f"for (long {r} = 0; {r} < {math.prod(rest)}; ++{r})"), ev.scope():
                tail = delinearize(r, rest) if rest else []
                u = ev.at(upd, Index(tuple(upd.shape), tuple(lead) + tuple(tail)))
                _write(kc, dst, strides, picks + tail, combine, u)


def _write(kc, dst: str, strides, dims, combine: str, u: str) -> None:
    off = " + ".join(f"({d}) * {s}" for d, s in zip(dims, strides, strict=True)) or "0"
    o = f"{dst}[{off}]"
    kc.w.line(f"{o} = {combine.format(o=o, u=u)};")
