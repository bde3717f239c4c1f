"""The IR verifier: structural invariants, and shapes when a shape checker is registered.

The op registry (a layer above the IR) registers itself with ``register_shape_checker`` so
that ``graph.verify()`` can re-infer every node's output types without the IR importing it.
"""
from __future__ import annotations

from typing import Callable

from opfuse.errors import ModelError

_shape_checkers: list[Callable] = []


def register_shape_checker(fn: Callable) -> None:
    """``fn(graph, node)`` raises ``ModelError``/``ShapeError`` when a node's output types are wrong."""
    if fn not in _shape_checkers:
        _shape_checkers.append(fn)


def verify(graph, check_shapes: bool = True) -> None:
    """Check that the graph is well formed; raise ``ModelError`` describing the first problem.

    * every node input is a graph input, a constant, or produced by an earlier node
      (which also proves the node order is topological, hence the graph acyclic);
    * producer and use links agree with node inputs/outputs;
    * every value has a type; names are unique; outputs are defined;
    * with ``check_shapes``, every node's output types equal what its op infers.
    """
    defined: set[int] = set()
    for v in graph.inputs:
        if v.producer is not None:
            raise ModelError(f"graph input '{v.name}' has a producer")
        defined.add(id(v))
    for v in graph.values.values():
        if graph.values.get(v.name) is not v:
            raise ModelError(f"value table is inconsistent at '{v.name}'")
        if v.type is None:
            raise ModelError(f"value '{v.name}' has no type")
        if v.producer is None and v.const is not None:
            defined.add(id(v))
        if v.const is not None and tuple(v.const.shape) != v.type.shape:
            raise ModelError(f"constant '{v.name}' data shape {v.const.shape} != type {v.type}")
    names: set[str] = set()
    for node in graph.nodes:
        if node.name in names:
            raise ModelError(f"node name '{node.name}' appears twice")
        names.add(node.name)
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if graph.values.get(v.name) is not v:
                raise ModelError(f"node '{node.name}' reads '{v.name}', which is not in the graph")
            if id(v) not in defined:
                raise ModelError(
                    f"node '{node.name}' reads '{v.name}' before it is defined (cycle or bad order)")
            if (node, i) not in v.uses:
                raise ModelError(f"use of '{v.name}' by '{node.name}' is not recorded")
        for v in node.outputs:
            if v.producer is not node:
                raise ModelError(f"output '{v.name}' of '{node.name}' has the wrong producer")
            if id(v) in defined:
                raise ModelError(f"value '{v.name}' is defined twice")
            defined.add(id(v))
    node_ids = {id(n) for n in graph.nodes}
    for v in graph.values.values():
        for user, i in v.uses:
            if id(user) not in node_ids or user.inputs[i] is not v:
                raise ModelError(f"stale use of '{v.name}' by '{user.name}'")
    for v in graph.outputs:
        if id(v) not in defined:
            raise ModelError(f"graph output '{v.name}' is never defined")
    if check_shapes:
        for node in graph.nodes:
            for checker in _shape_checkers:
                checker(graph, node)
