"""Run-time checks hoisted before a kernel's loops (see ``codegen/checks.py``)."""
from __future__ import annotations

import numpy as np

from opfuse.codegen.checks import check_of
from opfuse.codegen.evaluator import Evaluator
from opfuse.codegen.loops import emit_loop_nest
from opfuse.ir.graph import Node, Value


def emit_prechecks(kc, inline: set[int], live: list[Node], loadable: set[int]) -> None:
    """Before a kernel's loops: check every operand of ``check_of`` that can be computed from
    the group's inputs (a constant one at build time), and mark its node ``kc.checked``
    (the checks themselves: ``checks.check_of``)."""
    ev = Evaluator(kc, inline, loadable)
    known: dict[int, bool] = {}

    def computable(v: Value) -> bool:
        if id(v) not in known:
            p = v.producer
            known[id(v)] = id(v) in ev.static or id(v) in loadable or (
                p is not None and id(p) in inline and all(computable(u) for u in p.input_values()))
        return known[id(v)]

    for node in live:
        check = check_of(node) if id(node) in inline else None
        if check is None or not all(computable(v) for v in check.operands):
            continue
        kc.checked.add(id(node))
        if all(id(v) in ev.static for v in check.operands):
            if check.bad(*(ev.static[id(v)] for v in check.operands)):
                kc.w.line(f"{kc.fault(node, check.message)} = 1;")
            continue
        flag = kc.fault(node, check.message)
        shape = np.broadcast_shapes(*(v.shape for v in check.operands))

        def body(idx, check=check, flag=flag):
            xs = [ev.at(v, idx.broadcast_to(v.shape)) for v in check.operands]
            kc.w.line(f"{flag} |= {check.cond(*xs)};")
        emit_loop_nest(kc, ev, shape, body, parallel=False, prefix="c")
