"""``Family``: one kind of step of the random graph generator, and the shape helpers they share.

A family adds one small, valid subgraph to a ``GraphDraft``: it picks its operands from the pool
(filtered by ``accepts``, squashed into ``limit``), draws its parameters so that every shape is
valid and every tensor stays under ``MAX_ELEMENTS``, and states the magnitude bound of each output
(see ``graph_draft``). A family is enabled for an op set when the set holds at least one of its
``any_of`` ops and all of its ``all_of`` ops; it never emits an op outside the set.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from opfuse.testing.graph_draft import MAX_ELEMENTS, OPERAND_LIMIT, Accept, GraphDraft, any_value


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[GraphDraft], None]
    any_of: tuple[str, ...]                 # at least one of these must be allowed
    all_of: tuple[str, ...] = ()            # all of these must be allowed
    optional: tuple[str, ...] = ()          # emitted only when allowed
    accepts: Accept = any_value             # the primary operand
    limit: float = OPERAND_LIMIT            # the primary operand's magnitude limit
    min_cost: int = 1                       # nodes it always adds (squashing not counted)
    ranks: tuple[int, ...] = (1, 2, 3, 4)   # graph-input ranks it can start from
    pattern: bool = False
    choices: Callable[[GraphDraft], list] | None = None  # the ops it could emit right now

    @property
    def ops(self) -> frozenset[str]:
        return frozenset(self.any_of + self.all_of + self.optional)

    def enabled(self, ops: frozenset[str]) -> bool:
        return any(op in ops for op in self.any_of) and all(op in ops for op in self.all_of)

    def ready(self, d: GraphDraft) -> bool:
        """Whether the family can take a step now (it reserves its nodes to ask the pool)."""
        d.reserve(self.min_cost)
        return (self.min_cost <= d.nodes_left and bool(d.candidates(self.accepts, self.limit))
                and (self.choices is None or bool(self.choices(d))))

    def apply(self, d: GraphDraft) -> None:
        d.reserve(self.min_cost)
        self.build(d)


def size(shape) -> int:
    return math.prod(shape)


def fits(shape) -> bool:
    return size(shape) <= MAX_ELEMENTS


def broadcast(a, b) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


def rank_in(*ranks: int) -> Accept:
    return lambda v: len(v.shape) in ranks


def signed_axis(d: GraphDraft, axis: int, rank: int) -> int:
    """``axis`` written as is or counted from the end (both forms are valid ONNX)."""
    return axis - rank if d.flag() else axis


def const_shapes(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Shapes of a constant that broadcasts into ``shape`` without growing it: scalar,
    one element, last axis, per channel (axis 1, NCHW style), all but the batch axis, full."""
    r = len(shape)
    opts = [(), (1,), tuple(shape[-1:])]
    if r >= 3:
        opts.append((shape[1],) + (1,) * (r - 2))
    if r >= 2:
        opts.append((1,) + tuple(shape[1:]))
    opts.append(tuple(shape))
    return list(dict.fromkeys(opts))


def max_abs(a: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64)).max()) if a.size else 0.0


def divisors(n: int) -> list[int]:
    return [g for g in range(1, n + 1) if n % g == 0]
