"""Peak activation memory of a plan: a liveness estimate on the graph's node order.

The clock is the position of each node in the graph's topological order. A group
occupies the span ``[lo, hi]`` of its nodes' positions (a kernel holds all its boundary
tensors for its whole run). A tensor that reaches main memory, i.e. every non-constant
value except those internal to a group, is live

* from the first position of its producer's group (graph inputs: from position 0)
* to the last position of its last consumer's group (graph outputs: to the end; a value
  nobody reads: to the end of its producer's group).

Peak activation memory is the largest sum of live tensor bytes at any position.
Constants (weights) are not activations and are not counted. For the unfused plan this
is ordinary liveness; fusing a producer and a consumer removes their intermediate but
stretches the lifetimes of the group's other boundary tensors over the group's span,
which is how fusion can *raise* the peak (both effects are real).

Because each group's span is a property of the group alone, the same estimate is linear
in group-selection variables; the exact planner (``opfuse.planner.exact``) encodes it
verbatim, so both planners optimise and report the same number.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from opfuse.cost.analysis import nbytes
from opfuse.ir.graph import Graph, Node, Value


def value_intervals(graph: Graph, groups: Sequence[Sequence[Node]]) -> list[tuple[Value, int, int]]:
    """(value, first position, last position) for every tensor that reaches main memory."""
    pos = {id(n): i for i, n in enumerate(graph.nodes)}
    span: dict[int, tuple[int, int]] = {}
    gid: dict[int, int] = {}
    for k, nodes in enumerate(groups):
        ps = [pos[id(n)] for n in nodes]
        lo, hi = min(ps), max(ps)
        for n in nodes:
            span[id(n)] = (lo, hi)
            gid[id(n)] = k
    end = max(len(graph.nodes) - 1, 0)
    graph_outs = {id(v) for v in graph.outputs}
    graph_ins = {id(v) for v in graph.inputs}
    out: list[tuple[Value, int, int]] = []
    for v in graph.values.values():
        if v.is_const or v.type is None:
            continue
        if v.producer is None:
            if id(v) not in graph_ins:
                continue
            start = 0
        else:
            p = v.producer
            internal = (id(v) not in graph_outs and v.uses
                        and all(gid[id(u)] == gid[id(p)] for u, _ in v.uses))
            if internal:
                continue
            start = span[id(p)][0]
        if id(v) in graph_outs:
            stop = end
        elif v.uses:
            stop = max(span[id(u)][1] for u, _ in v.uses)
        else:
            stop = span[id(v.producer)][1] if v.producer is not None else start
        out.append((v, start, max(start, stop)))
    return out


def live_bytes_by_position(graph: Graph, groups: Sequence[Sequence[Node]]) -> list[int]:
    n = max(len(graph.nodes), 1)
    delta = [0] * (n + 1)
    for v, a, b in value_intervals(graph, groups):
        delta[a] += nbytes(v)
        delta[b + 1] -= nbytes(v)
    live, out = 0, []
    for i in range(n):
        live += delta[i]
        out.append(live)
    return out


def peak_activation_bytes(graph: Graph, groups: Iterable[Sequence[Node]]) -> int:
    """The largest live activation footprint over the node-order clock (see module doc)."""
    return max(live_bytes_by_position(graph, list(groups)), default=0)
