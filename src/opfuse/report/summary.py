"""Model statistics for ``opfuse info``: op histogram, parameters, FLOPs, bytes, activation memory.

* bytes per op = bytes read (every input, weights included) + bytes written, as if each op were
  its own kernel (the unfused traffic the seed's eta compares against);
* activation memory: the sum of all intermediate tensors, and the peak of simultaneously live
  activations when nodes run in graph order and each tensor is freed after its last use.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from opfuse.ir.graph import Graph
from opfuse.ops.registry import get_spec


@dataclass
class OpStats:
    op_type: str
    count: int = 0
    flops: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


@dataclass
class ModelSummary:
    name: str
    nodes: int
    params: int
    param_bytes: int
    flops: int
    bytes_moved: int
    activation_bytes_total: int
    activation_bytes_peak: int
    inputs: list[str]
    outputs: list[str]
    ops: list[OpStats] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "ops"}
        d["ops"] = [dict(op_type=o.op_type, count=o.count, flops=o.flops, bytes_read=o.bytes_read,
                         bytes_written=o.bytes_written) for o in self.ops]
        return d


def peak_live_bytes(graph: Graph) -> int:
    """Peak bytes of simultaneously live non-constant tensors, running nodes in graph order.

    Graph inputs and outputs are the caller's buffers: live for the whole run.
    """
    remaining = {id(v): len(v.uses) for v in graph.values.values()}
    pinned = {id(v) for v in graph.outputs} | {id(v) for v in graph.inputs}  # caller-owned
    live = sum(v.nbytes for v in graph.inputs)
    peak = live
    for node in graph.nodes:
        live += sum(v.nbytes for v in node.outputs)
        peak = max(peak, live)
        for v in {id(x): x for x in node.input_values()}.values():
            remaining[id(v)] -= sum(1 for u, _ in v.uses if u is node)
            if remaining[id(v)] == 0 and v.const is None and id(v) not in pinned:
                live -= v.nbytes
        for v in node.outputs:  # outputs nobody reads die at once
            if not v.uses and id(v) not in pinned:
                live -= v.nbytes
    return peak


def summarize(graph: Graph) -> ModelSummary:
    per_op: dict[str, OpStats] = {}
    for node in graph.nodes:
        spec = get_spec(node.op_type, node)
        s = per_op.setdefault(node.op_type, OpStats(node.op_type))
        s.count += 1
        s.flops += spec.flops(node)
        s.bytes_read += spec.bytes_read(node)
        s.bytes_written += spec.bytes_written(node)
    consts = [v for v in graph.constants if v.uses]
    activations = [v for n in graph.nodes for v in n.outputs]
    ops = sorted(per_op.values(), key=lambda s: (-s.count, s.op_type))
    return ModelSummary(
        name=graph.name,
        nodes=len(graph.nodes),
        params=sum(v.size for v in consts),
        param_bytes=sum(v.nbytes for v in consts),
        flops=sum(s.flops for s in ops),
        bytes_moved=sum(s.bytes for s in ops),
        activation_bytes_total=sum(v.nbytes for v in activations),
        activation_bytes_peak=peak_live_bytes(graph),
        inputs=[f"{v.name}: {v.type}" for v in graph.inputs],
        outputs=[f"{v.name}: {v.type}" for v in graph.outputs],
        ops=ops,
    )


def histogram(graph: Graph) -> Counter:
    return Counter(n.op_type for n in graph.nodes)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def human_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def format_summary(s: ModelSummary) -> str:
    lines = [
        f"model       {s.name}",
        f"inputs      {', '.join(s.inputs)}",
        f"outputs     {', '.join(s.outputs)}",
        f"nodes       {s.nodes}",
        f"params      {s.params:,} ({human_bytes(s.param_bytes)})",
        f"FLOPs       {s.flops:,} ({human_count(s.flops)})",
        f"bytes moved {s.bytes_moved:,} ({human_bytes(s.bytes_moved)}, one kernel per op)",
        f"activations total {human_bytes(s.activation_bytes_total)}, "
        f"peak live {human_bytes(s.activation_bytes_peak)} (graph order)",
        "",
        f"{'op':<22}{'count':>6}{'FLOPs':>12}{'bytes read':>14}{'bytes written':>15}",
    ]
    for o in s.ops:
        lines.append(f"{o.op_type:<22}{o.count:>6}{human_count(o.flops):>12}"
                     f"{human_bytes(o.bytes_read):>14}{human_bytes(o.bytes_written):>15}")
    return "\n".join(lines)
