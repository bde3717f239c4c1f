"""Horizontal fusion in the generated code: sibling anchors that read one input in one pass.

After ``stages.analyse`` a horizontal group has one stage per sibling. Siblings that can
share their loop structure are merged here:

* MatMuls (or Gemms) of one run-time input with constant weights become one GEMM over the
  weights stacked along N (the Q/K/V projections: one pass over the activations, three
  outputs); Convs of one input with equal geometry become one GEMM over weights stacked
  along M (one im2col packing for all of them). Each sibling keeps its own epilogue, applied
  to its row or column range of every tile.
* Pools with the same window over one input walk each window once and keep one
  accumulator per sibling (the seed's ``MaxPool || AvgPool``).

Siblings that cannot share a pass still run in one kernel, one after the other.
"""
from __future__ import annotations

import math

import numpy as np

from opfuse.codegen.ctype import c_type, literal, lowest
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.index import Index, add, mul
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec


def _attrs(node) -> dict:
    return get_spec(node.op_type, node).attrs_of(node)


def _merge_key(stage: Stage, static: dict):
    """Stages with equal keys can share one pass (``None``: never merged)."""
    n = stage.anchor
    if stage.kind != "anchor" or n.outputs[0].dtype != np.float32:
        return None
    if n.op_type == "MatMul":
        A, B = n.inputs
        if id(B) in static and len(B.shape) == 2 and len(A.shape) >= 2 and id(A) not in static:
            return ("matmul", id(A), B.shape[0])
    if n.op_type == "Gemm":
        a = _attrs(n)
        A, B = n.inputs[0], n.inputs[1]
        if id(B) in static and id(A) not in static:
            return ("gemm", id(A), int(a["transA"]))
    if n.op_type == "Conv":
        from opfuse.ops.nn import window_geometry
        a = _attrs(n)
        x, w = n.inputs[0], n.inputs[1]
        if int(a["group"]) == 1 and id(w) in static and id(x) not in static:
            geo = window_geometry(n, a, tuple(x.shape[2:]), tuple(w.shape[2:]))
            return ("conv", id(x), geo)
    if n.op_type in ("MaxPool", "AveragePool"):
        from opfuse.ops.nn import window_geometry
        a = _attrs(n)
        x = n.inputs[0]
        geo = window_geometry(n, a, tuple(x.shape[2:]), tuple(int(k) for k in a["kernel_shape"]),
                              ceil_mode=bool(a["ceil_mode"]))
        return ("pool", id(x), geo)
    return None


def merge_siblings(stages: list[Stage], static: dict) -> list[Stage]:
    """Replace runs of mergeable sibling stages by one ``horizontal`` stage each."""
    stored = {id(v) for st in stages for v in st.outputs}
    groups: dict[tuple, list[Stage]] = {}
    order: list[object] = []
    for st in stages:
        key = _merge_key(st, static)
        # A sibling must read only what exists before the merged pass starts.
        if key is not None and any(id(v) in stored for v in st.anchor.input_values()):
            key = None
        if key is None:
            order.append(st)
            continue
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(st)
    result = []
    for item in order:
        if isinstance(item, Stage):
            result.append(item)
            continue
        members = groups[item]
        if len(members) == 1:
            result.append(members[0])
        else:
            result.append(Stage("horizontal", anchors=[m.anchor for m in members],
                                outputs=[v for m in members for v in m.outputs],
                                members=members))
    return result


def lower_horizontal(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    op = stage.anchors[0].op_type
    if op in ("MaxPool", "AveragePool"):
        return _lower_pools(kc, ev, stage)
    from opfuse.codegen.conv import conv_problem
    from opfuse.codegen.gemm import emit_gemm, gemm_problem, matmul_problem, merge_problems
    build = {"MatMul": matmul_problem, "Gemm": gemm_problem, "Conv": conv_problem}[op]
    problems = [build(kc, ev, m.anchor) for m in stage.members]
    axis = "m" if op == "Conv" else "n"
    emit_gemm(kc, ev, stage.members[0], merge_problems(problems, stage.members, axis))


def _lower_pools(kc, ev, stage: Stage) -> None:
    from opfuse.ops.nn import window_geometry
    first = stage.anchors[0]
    x = first.inputs[0]
    a0 = _attrs(first)
    kernel = tuple(int(k) for k in a0["kernel_shape"])
    geo = window_geometry(first, a0, tuple(x.shape[2:]), kernel, ceil_mode=bool(a0["ceil_mode"]))
    out_shape = first.outputs[0].shape
    dt = first.outputs[0].dtype
    ct = c_type(dt)
    w = kc.w
    need_max = any(n.op_type == "MaxPool" for n in stage.anchors)
    need_sum = any(n.op_type == "AveragePool" for n in stage.anchors)

    def body(oidx: Index):
        mx, sm, cin, cpad = kc.tmp("mx"), kc.tmp("sum"), kc.tmp("cin"), kc.tmp("cpad")
        if need_max:
            w.line(f"{ct} {mx} = {lowest(dt)};")
        if need_sum:
            w.line(f"{ct} {sm} = {literal(0, dt)};")
            w.line(f"long {cin} = 0, {cpad} = 0;")
        dims = [oidx.dims[0], oidx.dims[1]]
        inside, padded = [], []
        opened = 0
        for s in range(len(kernel)):
            k, pos = kc.tmp("k"), kc.tmp("p")
            L = x.shape[2 + s]
            w.line(f"for (long {k} = 0; {k} < {kernel[s]}; ++{k}) {{")
            w.level += 1
            opened += 1
            start = add(mul(oidx.dims[2 + s], geo.strides[s]), str(-geo.pads_begin[s]))
            w.line(f"const long {pos} = {add(start, mul(k, geo.dilations[s]))};")
            w.line(f"if (!({pos} >= {-geo.pads_begin[s]} && {pos} < {L + geo.pads_end[s]})) continue;")
            inside.append(f"{pos} >= 0 && {pos} < {L}")
            dims.append(pos)
        if need_sum:
            w.line(f"++{cpad};")
        with w.block(f"if ({' && '.join(inside)})"), ev.scope():
            v = ev.at(x, Index(tuple(x.shape), tuple(dims)))
            if need_max:
                w.line(f"{mx} = {v} > {mx} ? {v} : {mx};")
            if need_sum:
                w.line(f"{sm} += {v};")
                w.line(f"++{cin};")
        for _ in range(opened):
            w.level -= 1
            w.line("}")
        for member in stage.members:
            n = member.anchor
            if n.op_type == "MaxPool":
                res = mx
            else:
                cnt = cpad if int(_attrs(n).get("count_include_pad", 0)) else cin
                res = kc.tmp("avg")
                w.line(f"const {ct} {res} = {sm} / ({ct}){cnt};")
            finish_element(kc, ev, member, n.outputs[0], oidx, res)

    emit_loop_nest(kc, ev, out_shape, body, cost_per_element=len(stage.anchors) * math.prod(kernel))
