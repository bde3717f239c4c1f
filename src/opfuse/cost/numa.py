"""NUMA-aware pricing of boundary tensors (the seed's exercise 7.5).

Model. Every op is pinned to a NUMA node by a placement (op name -> node; unplaced ops,
graph inputs and weights live on ``home_node``). A tensor is homed on the node of the op
that produces it: the static memory planner keeps one arena per node and puts each
tensor in its producer's arena. A fused group is one kernel and runs on one node, the
node of its *anchor*: the op with the most FLOPs (the first such op on ties).

Each boundary tensor whose home differs from the group's node is accessed remotely, read
(an input) or written (an output), one cache line at a time. Remote lines cost the
latency difference, overlapped ``memory_parallelism`` lines at a time:

    T_numa = sum_{remote tensors v} ceil(|v| / line) * (L_remote - L_local) / MLP

on top of the roofline time (the local part of the access is already in ``bytes / B``).
Internal values never leave the chip, so fusing a producer and a consumer placed on
different nodes removes their transfer: the planner sees the seed's inter-block cost
``T(P_i, P_j)`` disappear.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from opfuse.cost.analysis import nbytes
from opfuse.ir.graph import Node, Value
from opfuse.targets.profile import HardwareProfile


@dataclass(frozen=True)
class NumaPlacement:
    node_of: dict[str, int] = field(default_factory=dict)  # op (node) name -> NUMA node
    home_node: int = 0

    def op_node(self, node: Node) -> int:
        return self.node_of.get(node.name, self.home_node)

    def value_home(self, v: Value) -> int:
        return self.op_node(v.producer) if v.producer is not None else self.home_node

    def group_node(self, nodes, flops) -> int:
        """The node of the group's anchor (most FLOPs, first on ties)."""
        best = max(range(len(nodes)), key=lambda i: (flops[i], -i))
        return self.op_node(nodes[best])


def remote_time(profile: HardwareProfile, values, run_node: int, placement: NumaPlacement) -> tuple[float, int]:
    """(extra seconds, remote bytes) for the boundary ``values`` of a group on ``run_node``."""
    extra_latency = profile.numa_remote_latency_s - profile.numa_local_latency_s
    seconds, remote_bytes = 0.0, 0
    for v in values:
        if placement.value_home(v) != run_node:
            lines = math.ceil(nbytes(v) / profile.cache_line_bytes)
            seconds += lines * extra_latency / profile.memory_parallelism
            remote_bytes += nbytes(v)
    return seconds, remote_bytes
