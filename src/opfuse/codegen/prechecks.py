"""Run-time checks hoisted before a kernel's loops (see ``codegen/checks.py``)."""
from __future__ import annotations

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
        if check is None or not computable(check[0]):
            continue
        operand, cond, bad, message = check
        kc.checked.add(id(node))
        if id(operand) in ev.static:
            if bad(ev.static[id(operand)]):
                kc.w.line(f"{kc.fault(node, message)} = 1;")
            continue
        flag = kc.fault(node, message)

        def body(idx, operand=operand, cond=cond, flag=flag):
            kc.w.line(f"{flag} |= {cond(ev.at(operand, idx))};")
        emit_loop_nest(kc, ev, operand.shape, body, parallel=False, prefix="c")
