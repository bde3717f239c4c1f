"""The seed's three conflict kinds (7.2.3): overlap, resource, dependency.

* **overlap**: two matches share a node; a node belongs to one kernel only.
* **resource**: the fused group would exceed a configured limit: ops per group (the register
  pressure proxy), distinct inputs (pointer registers / DMA channels), or the on-chip working
  set (``internal`` bytes that must stay in registers/SRAM), e.g. from a hardware profile.
* **dependency**: fusing would break an ordering the graph relies on:

  - a *cycle through an outside path*: if a -> b -> c with a and c in the group and b outside,
    the group's kernel would have to run before b (b reads a) and after b (c reads b):
    impossible. A group must be *convex*: no path leaves it and comes back;
  - *in-place/alias*: an op that writes into its input's buffer (``inplace_ops``) may only be
    fused when no node outside the group still reads that buffer;
  - *RNG order*: random-number ops draw from one generator stream in program order; a group
    holding one must not be moved across another random op outside it.

Each check returns ``None`` or a ``Refusal(kind, reason)`` with a one-line reason naming nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.rules.decisions import Refusal, RefusalKind
from opfuse.rules.options import FusionOptions

# ONNX random ops: their draws come from one stream in program order.
RNG_OPS = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Bernoulli", "Multinomial"})
OVERLAP, RESOURCE, DEPENDENCY = RefusalKind.OVERLAP, RefusalKind.RESOURCE, RefusalKind.DEPENDENCY


@dataclass(frozen=True)
class DependencyRules:
    rng_ops: frozenset = RNG_OPS
    inplace_ops: frozenset = field(default_factory=frozenset)  # op types writing into input 0


# Overlap -----------------------------------------------------------------------------------------

def check_overlap(nodes, owner: dict[int, str]) -> Refusal | None:
    """``owner`` maps node ids already in a group to that group's name."""
    for n in nodes:
        g = owner.get(id(n))
        if g is not None:
            return Refusal(OVERLAP, f"node '{n.name}' is already in group '{g}'")
    return None


# Resources -----------------------------------------------------------------------------------------

def working_set_bytes(nodes, graph) -> int:
    """Bytes of the values produced and consumed only inside the group (they stay on chip)."""
    ids = {id(n) for n in nodes}
    outs = {id(v) for v in graph.outputs}
    total = 0
    for n in nodes:
        for v in n.outputs:
            if id(v) not in outs and all(id(u) in ids for u, _ in v.uses):
                total += v.nbytes
    return total


def group_inputs(nodes) -> list:
    inside = {id(v) for n in nodes for v in n.outputs}
    seen: dict[int, object] = {}
    for n in nodes:
        for v in n.input_values():
            if id(v) not in inside:
                seen.setdefault(id(v), v)
    return list(seen.values())


def check_resources(nodes, graph, limits: FusionOptions) -> Refusal | None:
    too_big = limits.size_refusal(len(nodes))
    if too_big is not None:
        return too_big
    if limits.max_group_inputs is not None:
        k = len(group_inputs(nodes))
        if k > limits.max_group_inputs:
            return Refusal(RESOURCE, f"{k} distinct inputs exceed the limit of {limits.max_group_inputs}")
    if limits.max_working_set_bytes is not None:
        b = working_set_bytes(nodes, graph)
        if b > limits.max_working_set_bytes:
            return Refusal(RESOURCE, f"working set of {b} bytes exceeds the on-chip budget of "
                                      f"{limits.max_working_set_bytes} bytes")
    return None


# Dependencies ---------------------------------------------------------------------------------------

def outside_path(nodes, pos: dict[int, int]) -> list | None:
    """A path out of the group and back into it (group node, outside..., group node), or None.

    Searches forward from the group's outside consumers; a node after the group's last node
    (in topological order) cannot lead back into it, so the search stays between them.
    """
    ids = {id(n) for n in nodes}
    last = max(pos[i] for i in ids)
    parent: dict[int, tuple] = {}
    stack = []
    for n in sorted(nodes, key=lambda x: pos[id(x)]):
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) not in ids and id(u) not in parent and pos.get(id(u), last + 1) < last:
                    parent[id(u)] = (n, None)
                    stack.append(u)
    while stack:
        u = stack.pop()
        for v in u.outputs:
            for w, _ in v.uses:
                if id(w) in ids:
                    path = [w, u]
                    cur = u
                    while True:
                        prev, _ = parent[id(cur)]
                        path.append(prev)
                        if id(prev) in ids:
                            return list(reversed(path))
                        cur = prev
                if id(w) not in parent and pos.get(id(w), last + 1) < last:
                    parent[id(w)] = (u, None)
                    stack.append(w)
    return None


def check_dependencies(nodes, graph, pos: dict[int, int], rules: DependencyRules) -> Refusal | None:
    path = outside_path(nodes, pos)
    if path is not None:
        names = " -> ".join(f"'{n.name}'" for n in path)
        return Refusal(DEPENDENCY, f"fusing would create a cycle: {names} leaves the group and comes back",
                        (path[0], path[-1]))
    ids = {id(n) for n in nodes}
    for n in nodes:
        if n.op_type in rules.inplace_ops and n.inputs and n.inputs[0] is not None:
            buf = n.inputs[0]
            for u, _ in buf.uses:
                if u is not n and id(u) not in ids:
                    return Refusal(DEPENDENCY, f"'{n.name}' overwrites '{buf.name}' in place, which "
                                                f"'{u.name}' outside the group still reads", (n,))
    rng_inside = [n for n in nodes if n.op_type in rules.rng_ops]
    if rng_inside:
        lo = min(pos[i] for i in ids)
        hi = max(pos[i] for i in ids)
        for other in graph.nodes:
            if other.op_type in rules.rng_ops and id(other) not in ids and lo < pos[id(other)] < hi:
                return Refusal(DEPENDENCY, f"random op '{rng_inside[0].name}' would move across random op "
                                            f"'{other.name}' and change the order of draws")
    return None


__all__ = ["DependencyRules", "check_overlap", "check_resources",
           "check_dependencies", "outside_path", "working_set_bytes", "group_inputs", "OVERLAP",
           "RESOURCE", "DEPENDENCY", "RNG_OPS"]
