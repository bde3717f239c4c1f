"""Loop nests, stores and lane reductions shared by every kernel family."""
from __future__ import annotations

import math
from contextlib import nullcontext
from typing import Callable, ContextManager, Sequence

from opfuse.codegen.index import Index
from opfuse.cost.analysis import VECTORISED_REDUCTION_MIN_RUN
from opfuse.ir.graph import Value

# Independent partial results per reduction: gcc vectorises a loop over lanes without
# -ffast-math (a plain float sum may not be reordered), and the fixed order keeps results
# bitwise reproducible. 16 floats fill one AVX-512 register or two AVX2 ones.
REDUCTION_LANES = 16


def loop_groups(shape: Sequence[int], mergeable: Callable[[int, int], bool] | None) -> list[tuple[int, int]]:
    """Split the axes of ``shape`` into consecutive groups, each one loop.

    Extent-1 axes join their neighbours; axes ``d1 < d2`` (the previous extent>1 axis and
    the next) share a loop when ``mergeable(d1, d2)``."""
    groups: list[list[int]] = []
    prev = None
    for d, n in enumerate(shape):
        if n == 1:
            continue  # extent-1 axes are attached to a neighbouring group below
        if groups and prev is not None and mergeable is not None and mergeable(prev, d):
            groups[-1][1] = d + 1
        else:
            groups.append([groups[-1][1] if groups else 0, d + 1])
        prev = d
    if not groups:
        return [(0, len(shape))]
    groups[-1][1] = len(shape)
    return [(a, b) for a, b in groups]


def emit_loop_nest(kc, ev, shape: Sequence[int], body: Callable[[Index], None], *,
                   mergeable: Callable[[int, int], bool] | None = None, cost_per_element: int = 1,
                   parallel: bool = True, prefix: str = "i", split: tuple[int, Sequence[int]] | None = None) -> None:
    """``for`` loops over every element of ``shape``; ``body(idx)`` emits one element's work.

    The outermost loop is split across threads when the nest is big enough. ``split = (axis, bounds)``: where
    ``axis`` has a loop of its own, that loop is written as one loop per range between the ``bounds`` (each with
    the loops inside it and the body; the outermost one each its own parallel loop), and ``kc.loop_ranges`` holds
    its variable's range while each body is written (a fused Concat then reads its input with no branch:
    ``rules._concat``; gcc 12.2 -O3 -march=native computes zeros for a load whose index is shifted by the loop
    variable under a condition on it, AVX2 and AVX-512 alike: fuzz seeds 5 and 41214)."""
    w = kc.w
    shape = tuple(shape)
    if not shape:
        with w.block(""), ev.scope():
            body(Index((), ()))
        return
    groups = loop_groups(shape, mergeable)
    loops = []
    for a, b in groups:
        var = kc.tmp(prefix)
        loops.append((a, b, var, math.prod(shape[a:b])))
    at = None
    if split is not None:
        at = next((k for k, (a, b, _, n) in enumerate(loops) if a <= split[0] < b and n == shape[split[0]]), None)
    total = math.prod(shape)
    index = Index.loops(shape, [(a, b, var) for a, b, var, _ in loops])

    def nest(depth: int) -> None:
        if depth == len(loops):
            with ev.scope():
                body(index)
            return
        _, _, var, extent = loops[depth]
        ranges = [(0, extent)]
        if depth == at and split is not None:
            cuts = sorted({0, extent, *(int(c) for c in split[1] if 0 < c < extent)})
            ranges = list(zip(cuts[:-1], cuts[1:], strict=True))
        for lo, hi in ranges:
            if depth == 0 and parallel:
                collapse = 2 if len(loops) > 1 and hi - lo < kc.program.options.parallel_min_outer and at != 1 else 1
                kc.parallel_for(total // extent * (hi - lo) * cost_per_element, collapse)
            w.line(f"for (long {var} = {lo}; {var} < {hi}; ++{var}) {{")
            w.level += 1
            if depth == at:
                kc.loop_ranges[var] = (lo, hi)
            nest(depth + 1)
            if depth == at:
                del kc.loop_ranges[var]
            w.level -= 1
            w.line("}")

    nest(0)


def store(kc, ev, v: Value, idx: Index, expr: str | None = None) -> None:
    """``v[idx] = expr`` (default: ``v`` evaluated at ``idx``)."""
    val = ev.at(v, idx) if expr is None else expr
    kc.w.line(f"{kc.ptr(v, write=True)}[{idx.offset()}] = {val};")


def is_view_store(kc, v: Value) -> bool:
    """True when ``v``'s bytes already are where it lives (a view or an aliased Concat input)."""
    mem = kc.program.memory
    for a in mem.aliases:
        if a.value == v.name and a.kind == "view":
            return True
    return False


def lane_reduce(kc, ctype: str, init: str, combine: Callable[[str, str], str], length: int,
                element: Callable[[str], str], result: str, *, keep_lane_loop: bool = False,
                scope: Callable[[], ContextManager] = nullcontext, chains: int = 1) -> None:
    """Emit ``ctype result = combine(... element(j) ...)`` over ``j < length`` with
    ``REDUCTION_LANES`` partial results; ``element(j)`` returns an expression and may emit
    statements (each lane iteration is its own C scope). ``scope``: the evaluator's scope when
    ``element`` evaluates values (``Evaluator.scope``), so that a temporary declared inside a loop
    is not reused after it (a loop of one element reads the same index as the code after it).

    ``keep_lane_loop``: ask gcc not to unroll the loop over lanes. It vectorises that loop as is;
    unrolled, it must recognise 16 reduction chains, which it does for a sum but not for a
    NaN-propagating max (``a > b || a != a ? a : b`` is no MAX_EXPR).

    ``chains`` > 1: that many arrays of lanes; a step covers ``chains * REDUCTION_LANES`` elements,
    array ``c`` taking the ``c``-th run of ``REDUCTION_LANES``, so that consecutive vector additions
    do not wait on each other. Then the arrays are combined in order into the first, and its lanes
    pairwise (lane ``l`` with ``l + h``, h = 8, 4, 2, 1: a vector operation each) instead of one
    lane after another. Another fixed order: still deterministic, and the same in every build."""
    w = kc.w
    lanes = REDUCTION_LANES
    if chains > 1 and length >= chains * lanes:
        _chained_reduce(kc, ctype, init, combine, length, element, result, scope, chains)
        return
    if length < VECTORISED_REDUCTION_MIN_RUN:  # what the cost model prices as scalar
        w.line(f"{ctype} {result} = {init};")
        _fold_rest(kc, 0, length, combine, element, result, scope)
        return
    acc = kc.tmp("lane")
    base = kc.tmp("j")
    lane = kc.tmp("l")
    w.line(f"{ctype} {acc}[{lanes}];")
    w.line(f"for (int {lane} = 0; {lane} < {lanes}; ++{lane}) {acc}[{lane}] = {init};")
    full = length // lanes * lanes
    with w.block(f"for (long {base} = 0; {base} < {full}; {base} += {lanes})"):
        if keep_lane_loop:
            w.line("OPFUSE_PRAGMA(GCC unroll 1)")
        with w.block(f"for (int {lane} = 0; {lane} < {lanes}; ++{lane})"), scope():
            e = element(f"{base} + {lane}")
            w.line(f"{acc}[{lane}] = {combine(f'{acc}[{lane}]', e)};")
    w.line(f"{ctype} {result} = {acc}[0];")
    w.line(f"for (int {lane} = 1; {lane} < {lanes}; ++{lane}) {result} = {combine(result, f'{acc}[{lane}]')};")
    if full < length:
        _fold_rest(kc, full, length, combine, element, result, scope)


def _chained_reduce(kc, ctype: str, init: str, combine: Callable[[str, str], str], length: int,
                    element: Callable[[str], str], result: str, scope: Callable[[], ContextManager],
                    chains: int) -> None:
    """``lane_reduce`` with ``chains`` arrays of lanes and a pairwise fold (see there)."""
    w = kc.w
    lanes = REDUCTION_LANES
    acc, base, lane, c = kc.tmp("lane"), kc.tmp("j"), kc.tmp("l"), kc.tmp("c")
    w.line(f"{ctype} {acc}[{chains}][{lanes}];")
    w.line(f"for (int {c} = 0; {c} < {chains}; ++{c}) for (int {lane} = 0; {lane} < {lanes}; ++{lane}) "
           f"{acc}[{c}][{lane}] = {init};")
    step = chains * lanes
    full = length // step * step
    with w.block(f"for (long {base} = 0; {base} < {full}; {base} += {step})"):
        for k in range(chains):
            with w.block(f"for (int {lane} = 0; {lane} < {lanes}; ++{lane})"), scope():
                e = element(f"{base} + {k * lanes} + {lane}" if k else f"{base} + {lane}")
                w.line(f"{acc}[{k}][{lane}] = {combine(f'{acc}[{k}][{lane}]', e)};")
    for k in range(1, chains):
        w.line(f"for (int {lane} = 0; {lane} < {lanes}; ++{lane}) "
               f"{acc}[0][{lane}] = {combine(f'{acc}[0][{lane}]', f'{acc}[{k}][{lane}]')};")
    h = lanes // 2
    while h:
        w.line(f"for (int {lane} = 0; {lane} < {h}; ++{lane}) "
               f"{acc}[0][{lane}] = {combine(f'{acc}[0][{lane}]', f'{acc}[0][{lane} + {h}]')};")
        h //= 2
    w.line(f"{ctype} {result} = {acc}[0][0];")
    if full < length:
        _fold_rest(kc, full, length, combine, element, result, scope)


def _fold_rest(kc, start: int, length: int, combine: Callable[[str, str], str], element: Callable[[str], str],
               result: str, scope: Callable[[], ContextManager]) -> None:
    """``result = combine(result, element(j))`` for ``start <= j < length``, one element after another."""
    j = kc.tmp("j")
    with kc.w.block(f"for (long {j} = {start}; {j} < {length}; ++{j})"), scope():
        e = element(j)
        kc.w.line(f"{result} = {combine(result, e)};")
