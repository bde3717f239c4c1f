"""Horizontal fusion of sibling MatMuls: ``x W1, x W2, ..., x Wk`` -> one MatMul, then Split.

Siblings ``y_i = x W_i (+ b_i)`` that read the same ``x`` with constant weights ``W_i: (K, N_i)``
are one product with the concatenated weight (BERT's Q/K/V projections, the seed's 7.4.4):

    [y_1 | ... | y_k] = x [W_1 | ... | W_k] + [b_1 | ... | b_k]       (concatenated on the last axis)

followed by a Split of the last axis into ``N_1, ..., N_k``. ``x`` is read once instead of ``k``
times and ``k`` kernels become one (the Split is absorbed by whatever consumes it: the
attention group for Q/K/V). A sibling without a bias gets zeros in its slice of the bias.

The seed's three conditions for horizontal fusion (7.1.2):

1. shared input: every member reads ``x`` as operand A;
2. no dependency: no member reaches another (with constant weights this always holds, but it is
   checked, so the rule stays correct if the weight condition is relaxed);
3. resources: at most ``max_horizontal_members`` members and a merged weight of at most
   ``max_merged_weight_bytes``.

Other refusals: a weight is shared with another node (concatenating would copy it), the
weights differ in dtype, or the Split would be a real copy kernel. The Split is free when its
slices are contiguous (one row: a view) or when each slice reaches a MatMul through data
movement only (the head split of Q/K/V feeding attention: the attention kernel reads the slices
through index maps). Otherwise it writes more bytes than the merge saves.
"""
from __future__ import annotations

import numpy as np

from opfuse.rules.decisions import RefusalKind, Refusal, refuse
from opfuse.rules.categories import is_injective
from opfuse.rules.options import FusionOptions
from opfuse.ir.graph import Graph, Node, Value
from opfuse.rewrites.context import RewriteContext
from opfuse.rewrites.edit import (add_const, add_node, merged_name, remove_dead, shared_const, sole_consumer,
                                  substitute)


def _weight(node: Node) -> Value | None:
    w = node.input(1)
    return w if w.is_const and len(w.shape) == 2 else None


def _bias_add(graph: Graph, mm: Node) -> tuple[Node, np.ndarray] | None:
    """The Add of a constant per-column bias that solely consumes ``mm``'s output, if any."""
    add = sole_consumer(mm.output, graph)
    if add is None or add.op_type != "Add" or add.output.shape != mm.output.shape:
        return None
    b = add.inputs[1] if add.inputs[0] is mm.output else add.inputs[0]
    if b is None or not b.is_const or b is mm.output:
        return None
    c = np.asarray(b.const)
    n = mm.output.shape[-1]
    if c.ndim > len(mm.output.shape) or any(d != 1 for d in c.shape[:-1]) or c.shape[-1:] not in ((n,), (1,)):
        return None
    return add, np.broadcast_to(c.reshape(-1), (n,))


def _ancestors(node: Node, stop: int) -> set[int]:
    """Ids of every node upstream of ``node`` (a bounded walk: at most ``stop`` nodes)."""
    seen: set[int] = set()
    todo = [v.producer for v in node.input_values() if v.producer is not None]
    while todo and len(seen) < stop:
        n = todo.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        todo.extend(v.producer for v in n.input_values() if v.producer is not None)
    return seen


def sibling_matmuls(graph: Graph, x: Value) -> list[Node]:
    """MatMuls reading ``x`` as A with a constant 2-D weight, in graph order."""
    out: list[Node] = []
    for user, idx in x.uses:
        live = user.output.uses or user.output in graph.outputs
        if user.op_type == "MatMul" and idx == 0 and user.inputs[1] is not x and _weight(user) is not None \
                and live and user not in out:
            out.append(user)
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    return sorted(out, key=lambda n: order[id(n)])


RULE = "horizontal_matmul"


def _split_refusal(graph: Graph, members: list[Node]) -> Refusal | None:
    """The Split must cost nothing: a view (its slices are contiguous), or index maps read by the
    data movement that feeds attention (the Q/K/V head split). Otherwise it would be a copy
    kernel writing every byte the merge saved, and more."""
    y = members[0].output
    if all(d == 1 for d in y.shape[:-1]):
        return None  # one row: the slices are contiguous, the Split is a view
    for mm in members:
        b = _bias_add(graph, mm)
        v = b[0].output if b is not None else mm.output
        while True:
            if v in graph.outputs or not v.uses:
                return refuse(f"'{v.name}' is a graph output: the Split would be a copy kernel")
            users = v.consumers
            if len(users) == 1 and users[0].op_type == "MatMul":
                break
            if len(users) != 1 or not is_injective(users[0]) or len(users[0].outputs) != 1:
                names = ", ".join(f"'{u.name}' ({u.op_type})" for u in users)
                return refuse(f"'{v.name}' is read by {names}: the Split would be a copy kernel (only "
                                    f"operands reaching a MatMul through data movement absorb it)")
            v = users[0].output
    return None


def check_siblings(graph: Graph, members: list[Node], options: FusionOptions) -> Refusal | None:
    """The seed's three horizontal conditions, unshared equal-K weights, and a free Split."""
    k = members[0].input(1).shape[0]
    dtype = members[0].input(1).dtype
    for mm in members:
        w = mm.input(1)
        if w.shape[0] != k or w.dtype != dtype:
            return refuse(f"weights differ in shape or dtype ('{w.name}' {w.type} vs K={k}, {dtype})")
        r = shared_const(w, mm)
        if r is not None:
            return r
    ids = {id(mm) for mm in members}
    for mm in members:  # condition 2: no member reaches another
        if _ancestors(mm, len(graph.nodes)) & (ids - {id(mm)}):
            return Refusal(RefusalKind.DEPENDENCY, f"'{mm.name}' depends on another sibling")
    if len(members) > options.max_horizontal_members:
        return Refusal(RefusalKind.RESOURCE, f"{len(members)} siblings exceed the limit of "
                                                  f"{options.max_horizontal_members}")
    total = sum(mm.input(1).nbytes for mm in members)
    if total > options.max_merged_weight_bytes:
        return Refusal(RefusalKind.RESOURCE, f"merged weight of {total} bytes exceeds the "
                                                  f"limit of {options.max_merged_weight_bytes} bytes")
    return _split_refusal(graph, members)


def merge(graph: Graph, x: Value, members: list[Node], rc: RewriteContext) -> str:
    """Replace ``members`` (and their bias Adds) by one MatMul (+ Add) and a Split."""
    biases = [_bias_add(graph, mm) for mm in members]
    names = [mm.name for mm in members]
    base = merged_name(names)
    w = np.concatenate([np.asarray(mm.input(1).const) for mm in members], axis=1)
    merged = add_node(graph, "MatMul", [x, add_const(graph, f"{base}_weight", w)], name=base)
    rc.provenance.absorb(merged, members)
    y = merged.output
    if any(b is not None for b in biases):
        bias = np.concatenate([b[1] if b is not None else np.zeros(mm.output.shape[-1])
                               for mm, b in zip(members, biases, strict=True)]).astype(w.dtype)
        add = add_node(graph, "Add", [y, add_const(graph, f"{base}_bias", bias)], name=f"{base}_bias")
        rc.provenance.absorb(add, [b[0] for b in biases if b is not None])
        y = add.output
    sizes = [mm.output.shape[-1] for mm in members]
    split = add_node(graph, "Split", [y], name=f"{base}_split", num_outputs=len(members),
                     attrs={"axis": len(y.shape) - 1, "split": sizes})
    for mm, b, out in zip(members, biases, split.outputs, strict=True):
        substitute(graph, b[0].output if b is not None else mm.output, out)
    remove_dead(graph, members)
    return (f"{len(members)} MatMuls on '{x.name}' became one MatMul '{base}' with a {w.shape[0]}x{w.shape[1]} "
            f"weight and a Split {sizes}")


def merge_parallel_matmuls(graph: Graph, rc: RewriteContext) -> bool:
    """Apply the rule to every value read by two or more constant-weight MatMuls."""
    changed = False
    for x in list(graph.values.values()):
        if x.is_const or x.name not in graph.values:
            continue
        members = sibling_matmuls(graph, x)
        if len(members) < 2:
            continue
        names = [mm.name for mm in members]
        if rc.options.is_disabled(RULE):
            rc.log_refusal(RULE, names, Refusal(RefusalKind.DISABLED, f"rule '{RULE}' is disabled"))
            continue
        refusal = check_siblings(graph, members, rc.options)
        if refusal is not None:
            rc.log_refusal(RULE, names, refusal)
            continue
        rc.log_applied(RULE, names, merge(graph, x, members, rc))
        changed = True
    if changed:
        graph.toposort()
    return changed
