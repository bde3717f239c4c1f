"""MaxPool and AveragePool (any number of spatial axes) with fused prologue and epilogue.

For output position ``o`` along an axis the window reads input positions
``o * stride - pad_begin + k * dilation`` (``opfuse.ops.nn.window_geometry`` gives the same
geometry the reference uses). Positions outside the input are skipped: padding never wins
a max, and AveragePool divides by the number of positions inside the input
(``count_include_pad=0``) or inside the explicitly padded input (``count_include_pad=1``).
"""
from __future__ import annotations

from opfuse.codegen.ctype import c_type, literal, lowest
from opfuse.codegen.index import Index, add, mul
from opfuse.codegen.epilogue import finish_element
from opfuse.codegen.loops import emit_loop_nest
from opfuse.codegen.rules import nan_max, relu
from opfuse.codegen.stages import GroupAnalysis, Stage
from opfuse.ops.registry import get_spec

# Ops f with max_i f(x_i) == f(max_i x_i) bit for bit, as ``rules.py`` computes them
# (non-decreasing; NaN handling agrees: a NaN in the window makes the max NaN, and Relu keeps NaN).
MAX_COMMUTING_OPS = frozenset({"Relu"})


def _hoist_after_max(ev, analysis: GroupAnalysis, x):
    """``(raw, chain)``: follow ``x`` back through inline, single-use ``MAX_COMMUTING_OPS``
    of the group to the value ``raw`` the window max can read instead; ``chain`` lists those
    ops, the one nearest the pool first. The max of a Relu'd window is then one Relu per
    output instead of one per window element, and gcc if-converts the bare max loop: with
    Relu inside it, it emitted value-dependent branches (resnet18's Relu+MaxPool ran 7x
    slower than Relu and MaxPool as two kernels)."""
    kept = {id(v) for v in analysis.outputs}
    chain = []
    while (x.producer is not None and x.producer.op_type in MAX_COMMUTING_OPS
           and id(x.producer) in ev.inline and id(x) not in ev.loadable
           and id(x) not in kept and len(x.consumers) == 1):
        chain.append(x.producer)
        x = x.producer.input(0)
    return x, chain


def lower_pool(kc, ev, stage: Stage, analysis: GroupAnalysis) -> None:
    from opfuse.ops.nn import window_geometry
    node = stage.anchor_node
    x = node.input(0)
    out = node.outputs[0]
    a = get_spec(node.op_type, node).attrs_of(node)
    kernel = tuple(int(k) for k in a["kernel_shape"])
    w = window_geometry(node, a, tuple(x.shape[2:]), kernel, ceil_mode=bool(a["ceil_mode"]))
    is_max = node.op_type == "MaxPool"
    chain = []
    if is_max:
        x, chain = _hoist_after_max(ev, analysis, x)
    include_pad = not is_max and bool(int(a.get("count_include_pad", 0)))
    dt = out.dtype
    ct = c_type(dt)
    nsp = len(kernel)
    window = 1
    for k in kernel:
        window *= k

    def body(oidx: Index):
        acc = kc.tmp("acc")
        cnt = kc.tmp("cnt")
        kc.w.line(f"{ct} {acc} = {lowest(dt) if is_max else literal(0, dt)};")
        if not is_max:
            kc.w.line(f"long {cnt} = 0;")
        dims = [oidx.dims[0], oidx.dims[1]]
        inside, counted = [], []
        opened = 0
        for s in range(nsp):
            k = kc.tmp("k")
            pos = kc.tmp("p")
            L = x.shape[2 + s]
            kc.w.line(f"for (long {k} = 0; {k} < {kernel[s]}; ++{k}) {{")
            kc.w.level += 1
            opened += 1
            start = add(mul(oidx.dims[2 + s], w.strides[s]), str(-w.pads_begin[s]))
            kc.w.line(f"const long {pos} = {add(start, mul(k, w.dilations[s]))};")
            inside.append(f"{pos} >= 0 && {pos} < {L}")
            counted.append(f"{pos} >= {-w.pads_begin[s]} && {pos} < {L + w.pads_end[s]}")
            kc.w.line(f"if (!({(counted if include_pad else inside)[-1]})) continue;")
            dims.append(pos)
        cond = " && ".join(inside[i] for i in range(nsp)) if include_pad else ""
        with kc.w.block(f"if ({cond})" if cond else ""), ev.scope():
            v = ev.at(x, Index(tuple(x.shape), tuple(dims)))
            kc.w.line(f"{acc} = {nan_max(v, acc, dt)};" if is_max else f"{acc} += {v};")
        if not is_max:
            kc.w.line(f"++{cnt};")
        for _ in range(opened):
            kc.w.level -= 1
            kc.w.line("}")
        res = kc.tmp("pool")
        kc.w.line(f"const {ct} {res} = {acc if is_max else f'{acc} / ({ct}){cnt}'};")
        for _ in chain:  # Relu, written as rules.py writes it
            prev, res = res, kc.tmp("relu")
            kc.w.line(f"const {ct} {res} = {relu(prev, dt)};")
        finish_element(kc, ev, stage, out, oidx, res)

    emit_loop_nest(kc, ev, out.shape, body, cost_per_element=window)
