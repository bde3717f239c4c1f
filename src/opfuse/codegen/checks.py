"""Run-time checks: the values the C code cannot compute fail as the reference does.

Four ops meet input values without a result: integer ``Div`` and ``Mod`` (a zero divisor; the reference
raises ``InputError``, x86 would trap), integer ``Pow`` (0 to a negative power, a division by
zero too) and ``Gather`` (an index outside ``[-dim, dim)``; the reference raises, an unchecked
load would read outside the tensor). For each, the C code computes on with a safe value
(divisor 1, a clamped index) and sets the node's fault flag (``KernelContext.fault``);
``opfuse_run`` returns the fault code and the runtime raises the same ``InputError``, naming
the node.

Where it can, a kernel checks the operands whole before its loops (``prechecks.emit_prechecks``):
a fused consumer may read only part of the result (a Slice, a strided pool), and the reference, which
computes every element, must not fault where the C code would not look. An operand computed
from the anchor (an epilogue) is checked element by element where it is computed; an epilogue
computes every element.

The other integer trap, ``INT_MIN / -1``, has a result: it wraps to ``INT_MIN`` (``div``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from opfuse.codegen.ctype import c_type, is_float
from opfuse.ir.graph import Node, Value
from opfuse.ops.elementwise import division_by_zero
from opfuse.ops.registry import get_spec


def zero_to_negative_power(node: Node) -> str:
    """The reference's error for an integer 0 to a negative power (``ops.elementwise._pow``)."""
    return str(division_by_zero(node, "integer 0 to a negative power (a division by zero)"))


def gather_range_message(node: Node, dim: int) -> str:
    """The reference's Gather error (``ops.shape_ops``), less the indices' min and max."""
    return f"node '{node.name}' (Gather): indices out of range [{-dim}, {dim - 1}]"


def _gather_dim(node: Node) -> int:
    data = node.input(0)
    axis = int(get_spec(node.op_type, node).attrs_of(node)["axis"])
    return data.shape[axis + len(data.shape) if axis < 0 else axis]


@dataclass(frozen=True)
class Check:
    """A node's run-time check: its ``operands`` (broadcast together), the C condition of a bad
    element (``cond(*c_exprs)``), the same over NumPy arrays (``bad(*arrays)``), the message."""
    operands: tuple[Value, ...]
    cond: Callable[..., str]
    bad: Callable[..., bool]
    message: str


def check_of(node: Node) -> Check | None:
    """The run-time check a node needs, else ``None``."""
    if math.prod(node.outputs[0].shape) == 0:
        return None  # nothing is computed: the reference does not look either
    if node.op_type == "Div" and not is_float(node.input(0).dtype):
        return Check((node.input(1),), lambda x: f"({x} == 0)", lambda a: bool(np.any(a == 0)),
                     str(division_by_zero(node)))
    if node.op_type == "Mod" and not is_float(node.input(0).dtype):
        return Check((node.input(1),), lambda x: f"({x} == 0)", lambda a: bool(np.any(a == 0)),
                     str(division_by_zero(node, "integer modulo by zero")))
    if node.op_type == "Pow" and not is_float(node.input(0).dtype) and not is_float(node.input(1).dtype):
        return Check((node.input(0), node.input(1)), lambda b, e: f"({b} == 0 && {e} < 0)",
                     lambda b, e: bool(np.any((b == 0) & (e < 0))), zero_to_negative_power(node))
    if node.op_type == "Gather":
        dim = _gather_dim(node)
        return Check((node.input(1),), lambda x: f"({x} < {-dim} || {x} >= {dim})",
                     lambda a: bool(np.any((a < -dim) | (a >= dim))), gather_range_message(node, dim))
    return None


def index_range_message(node: Node, lo: int, hi: int) -> str:
    """The error for a run-time index outside ``[lo, hi]`` (GatherElements, GatherND, ScatterND,
    ScatterElements, MaxUnpool, RoiAlign's batch index): the reference raises it too."""
    return f"node '{node.name}' ({node.op_type}): indices out of range [{lo}, {hi}]"


def index_fault(kc, node: Node, raw: str, lo: int, hi: int) -> None:
    """Set ``node``'s fault flag when the run-time index ``raw`` lies outside ``[lo, hi]``: the
    kernel computes on with a clamped index (nothing outside a tensor is touched) and
    ``opfuse_run`` returns the fault, which the runtime raises as ``InputError``."""
    kc.w.line(f"{kc.fault(node, index_range_message(node, lo, hi))} |= ({raw} < {lo} || {raw} > {hi});")


def check_here(ev, node: Node, *xs: str) -> None:
    """Check ``node``'s operand elements ``xs`` where they are computed, unless checked whole before."""
    if id(node) in ev.kc.checked:
        return
    check = check_of(node)
    if check is not None:
        ev.w.line(f"{ev.kc.fault(node, check.message)} |= {check.cond(*xs)};")


_UNSIGNED = {4: "uint32_t", 8: "uint64_t"}


def checked_divisor(ev, node: Node, b: str) -> str:
    """The integer divisor ``b`` of ``node`` (Div, Mod) as a name or literal, its zeros checked where it is
    computed (``check_here``): the C code then divides by it safely and the fault says what the reference does."""
    if not (b.replace("_", "").isalnum() or b.lstrip("-").isdigit()):
        b = ev.assign(node.input(1), b)
    check_here(ev, node, b)
    return b


def div(ev, node: Node, a: str, b: str) -> str:
    """``a / b`` for integers, as the reference: truncated toward zero, ``INT_MIN / -1`` wraps to
    ``INT_MIN`` (negated in unsigned arithmetic: C's ``/`` traps there), a zero divisor faults."""
    dt = np.dtype(node.input(0).dtype)
    b = checked_divisor(ev, node, b)
    q = f"{a} / ({b} == 0 ? 1 : {b})"
    if dt.kind == "i" and dt.itemsize in _UNSIGNED:  # narrower types divide as int: no overflow
        q = f"({b} == -1 ? ({c_type(dt)})(0u - ({_UNSIGNED[dt.itemsize]}){a}) : {q})"
    return q
