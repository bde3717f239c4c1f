"""Horizontal fusion in the generated code: sibling anchors that read one input in one pass.

``stages.analyse`` merges the sibling anchors that can share their loop structure into one
``horizontal`` stage (``stages.merge_siblings``); this module lowers such a stage:

* MatMuls (or Gemms) of one run-time input with constant weights become one GEMM over the
  weights stacked along N (the Q/K/V projections: one pass over the activations, three
  outputs); Convs of one input with equal geometry become one GEMM over weights stacked
  along whichever GEMM axis holds their output channels (one pass over the input windows).
  Each sibling keeps its own epilogue, applied to its row or column range of every tile.
* Pools with the same window over one input walk each window once and keep one
  accumulator per sibling (the seed's ``MaxPool || AvgPool``).

Siblings that cannot share a pass still run in one kernel, one after the other.
"""
from __future__ import annotations

import math

from opfuse.codegen.conv import conv_problem
from opfuse.codegen.ctype import c_type, literal, lowest
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.gemm import emit_gemm, gemm_problem, matmul_problem, merge_problems
from opfuse.codegen.index import Index, add, inside_position, mul
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.rules import nan_max
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec


def _attrs(node) -> dict:
    return get_spec(node.op_type, node).attrs_of(node)


def lower_horizontal(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    op = stage.anchors[0].op_type
    if op in ("MaxPool", "AveragePool"):
        return _lower_pools(kc, ev, stage)
    build = {"MatMul": matmul_problem, "Gemm": gemm_problem, "Conv": conv_problem}[op]
    problems = [build(kc, ev, m.anchor_node) for m in stage.members]
    emit_gemm(kc, ev, stage.members[0], merge_problems(problems, stage.members))


def _lower_pools(kc, ev, stage: Stage) -> None:
    from opfuse.ops.nn import window_geometry
    first = stage.anchors[0]
    x = first.input(0)
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
        inside, counted = [], []
        opened = 0
        # Every tap reads a position inside the input and selects, as the single pools do (pool.py: a load
        # under a condition is what gcc 12.2 miscompiled there); the max propagates NaN (``nan_max``).
        for s in range(len(kernel)):
            k, pos = kc.tmp("k"), kc.tmp("p")
            L = x.shape[2 + s]
            w.line(f"for (long {k} = 0; {k} < {kernel[s]}; ++{k}) {{")
            w.level += 1
            opened += 1
            start = add(mul(oidx.dims[2 + s], geo.strides[s]), str(-geo.pads_begin[s]))
            w.line(f"const long {pos} = {add(start, mul(k, geo.dilations[s]))};")
            counted.append(f"({pos} >= {-geo.pads_begin[s]} && {pos} < {L + geo.pads_end[s]})")
            inside.append(f"({pos} >= 0 && {pos} < {L})")
            dims.append(inside_position(pos, L))
        ok = kc.tmp("in")
        w.line(f"const int {ok} = {' && '.join(inside)};")
        if need_sum:
            w.line(f"{cpad} += {' && '.join(counted)};")
        with ev.scope():
            v = kc.tmp("v")
            w.line(f"const {ct} {v} = {ev.at(x, Index(tuple(x.shape), tuple(dims)))};")
            if need_max:
                w.line(f"{mx} = {ok} ? {nan_max(v, mx, dt)} : {mx};")
            if need_sum:
                w.line(f"{sm} += {ok} ? {v} : {literal(0, dt)};")
                w.line(f"{cin} += {ok};")
        for _ in range(opened):
            w.level -= 1
            w.line("}")
        for member in stage.members:
            n = member.anchor_node
            if n.op_type == "MaxPool":
                res = mx
            else:
                cnt = cpad if int(_attrs(n).get("count_include_pad", 0)) else cin
                res = kc.tmp("avg")
                w.line(f"const {ct} {res} = {sm} / ({ct}){cnt};")
            finish_element(kc, ev, member, n.outputs[0], oidx, res)

    emit_loop_nest(kc, ev, out_shape, body, cost_per_element=len(stage.anchors) * math.prod(kernel))
