"""``GraphDraft``: a graph under construction by a Hypothesis strategy.

It wraps a ``GraphBuilder`` with three things the random generator needs:

* every decision is a Hypothesis draw (``integer``, ``choice``, ``flag``, ``rarely``), made one
  at a time, so Hypothesis can replay and shrink a graph decision by decision; the bulk data
  (weights, statistics) comes from a NumPy generator seeded by one drawn integer, so a graph is
  a pure function of the draws;
* a *pool* of the float tensors built so far (graph inputs and node outputs) from which the op
  families pick operands; picking an old value again creates fan-out;
* a worst-case *magnitude bound* per value: with every graph input in ``[-INPUT_BOUND,
  INPUT_BOUND]``, ``|v| <= bound(v)`` holds elementwise. Each node states how its op maps the
  bounds of its operands (``|relu(x)| <= b``, ``|x * y| <= bx * by``, ``|W x| <= ||W||_1 b``,
  ...). An operand whose bound exceeds what the consuming op tolerates is first *squashed*
  (``Tanh``, ``Sigmoid`` or ``Clip``), so no graph can overflow and float32 rounding stays
  well below the differential tests' tolerances.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Sequence

import numpy as np
from hypothesis import strategies as st

from opfuse.ir.graph import Value
from opfuse.ops.builder import GraphBuilder

# Graph inputs are drawn uniformly from [-INPUT_BOUND, INPUT_BOUND] (``random_feeds``).
INPUT_BOUND = 2.0
# No tensor (activation or weight) holds more elements than this, so a graph runs in the
# reference executor in milliseconds.
MAX_ELEMENTS = 4096
# Channels / features of a generated weight; keeps weights small and sums short.
MAX_CHANNELS = 16
# Largest rank a reshaping op may create (ONNX Runtime kernels are fastest and best tested
# up to rank 5; the IR itself has no limit).
MAX_RANK = 5
# Operands of most ops are squashed when their magnitude bound exceeds this. Values of this
# size keep float32 rounding differences (a few ulp, ~1e-6 absolute) under the atol of the
# differential tests.
OPERAND_LIMIT = 8.0
# Operands of products (Mul of two tensors, Pow, Div) are limited to this, so a product
# stays below OPERAND_LIMIT ** 2 / 4.
PRODUCT_LIMIT = 4.0
# Exp's operand is limited to this: exp(3) ~ 20, far from float32 overflow at exp(88).
EXP_LIMIT = 3.0
# Log, Sqrt, Reciprocal and computed denominators read ``|x| + SAFE_EPS``: at least this far
# from the singularity, so a rounding error in ``x`` cannot be amplified by more than 1/SAFE_EPS.
SAFE_EPS = 0.5
# ``rarely()`` is true once in this many draws (and shrinks to false).
RARE_ODDS = 4
# Ops that squash a value into a bounded range, tried in this order when shrinking.
SQUASH_OPS = ("Tanh", "Sigmoid", "Clip")

Accept = Callable[[Value], bool]


def any_value(v: Value) -> bool:
    return True


class GraphDraft:
    """A graph being drawn: builder, operand pool, magnitude bounds and the draw helpers."""

    def __init__(self, draw, ops: frozenset[str], *, seed: int, target_nodes: int, max_inputs: int,
                 name: str = "random"):
        self.draw = draw
        self.ops = ops
        self.rng = np.random.default_rng(seed)
        self.builder = GraphBuilder(name)
        self.graph = self.builder.graph
        self.pool: list[Value] = []
        self.bounds: dict[str, float] = {}
        self.target_nodes = target_nodes
        self.max_inputs = max_inputs
        self.squash_ops = tuple(op for op in SQUASH_OPS if op in ops)
        self.reserved = 0

    # Decisions (each one a Hypothesis draw) ------------------------------------------------------
    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, options: Sequence):
        """One of ``options``; shrinks towards the first."""
        options = list(options)
        return options[self.integer(0, len(options) - 1)] if len(options) > 1 else options[0]

    def flag(self) -> bool:
        return self.draw(st.booleans())

    def rarely(self) -> bool:
        return self.integer(0, RARE_ODDS - 1) == RARE_ODDS - 1

    def subset(self, items: Sequence, *, min_size: int = 0) -> list:
        """A sub-list of ``items`` (order kept) with at least ``min_size`` elements."""
        chosen = [x for x in items if self.flag()]
        rest = [x for x in items if x not in chosen]
        while len(chosen) < min_size and rest:
            chosen.append(rest.pop(self.integer(0, len(rest) - 1)))
        return [x for x in items if x in chosen]

    # Bulk data (from the seeded generator) --------------------------------------------------------
    def uniform(self, shape, lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    def signed(self, shape, lo: float, hi: float) -> np.ndarray:
        """Magnitudes in ``[lo, hi]`` with random signs (values kept away from zero)."""
        mag = self.rng.uniform(lo, hi, size=shape)
        sign = np.where(self.rng.random(size=shape) < 0.5, -1.0, 1.0)
        return (mag * sign).astype(np.float32)

    def linear_weight(self, shape, reduce_axes: tuple[int, ...], gain: tuple[float, float] = (0.5, 1.5)):
        """A weight whose L1 norm over ``reduce_axes`` (the inputs one output reads) is a gain in
        ``gain``: then ``|W x| <= gain * max|x|``. Returns the weight and the largest gain."""
        w = self.uniform(shape, -1.0, 1.0).astype(np.float64)
        l1 = np.abs(w).sum(axis=reduce_axes, keepdims=True)
        g = self.rng.uniform(*gain, size=l1.shape)
        w = (w / np.maximum(l1, 1e-12) * g).astype(np.float32)
        return w, float(np.abs(w.astype(np.float64)).sum(axis=reduce_axes).max())

    # The graph ------------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.graph.nodes)

    @property
    def nodes_left(self) -> int:
        return self.target_nodes - self.num_nodes

    def reserve(self, nodes: int) -> None:
        """The current step will still add ``nodes`` nodes: squashing may only use the rest."""
        self.reserved = nodes

    @property
    def can_squash(self) -> bool:
        return bool(self.squash_ops) and self.nodes_left > self.reserved

    def has(self, *ops: str) -> bool:
        return all(op in self.ops for op in ops)

    def available(self, ops: Iterable[str]) -> list[str]:
        return [op for op in ops if op in self.ops]

    def bound(self, v: Value) -> float:
        return self.bounds[v.name]

    def new_input(self, shape: Sequence[int]) -> Value:
        v = self.builder.input(f"x{len(self.graph.inputs)}", tuple(shape))
        self.bounds[v.name] = INPUT_BOUND
        self.pool.append(v)
        return v

    def can_add_input(self) -> bool:
        return len(self.graph.inputs) < self.max_inputs

    def const(self, base: str, data) -> Value:
        data = np.asarray(data)
        assert data.size <= MAX_ELEMENTS, f"generator bug: constant {base} of shape {data.shape}"
        return self.builder.const(base, data)

    def scalar(self, base: str, value: float) -> Value:
        return self.const(base, np.array(value, dtype=np.float32))

    def ints(self, base: str, values) -> Value:
        return self.const(base, np.array(list(values), dtype=np.int64))

    def op(self, op_type: str, *inputs: Value | None, bound: float | Sequence[float], num_outputs: int = 1,
           **attrs):
        """Add a node; its float32 outputs join the pool with magnitude bound ``bound`` (one per
        output, or one for all). Outputs of another type (a comparison's bool, ArgMax's int64)
        stay out of the pool: only the families that take them (Where, Not, OneHot) use them."""
        assert op_type in self.ops, f"generator bug: {op_type} is not among the allowed ops"
        out = self.builder.op(op_type, *inputs, num_outputs=num_outputs, **attrs)
        outs = out if isinstance(out, tuple) else (out,)
        bounds = [bound] * len(outs) if isinstance(bound, (int, float)) else list(bound)
        for v, b in zip(outs, bounds, strict=True):
            assert v.type.size <= MAX_ELEMENTS, f"generator bug: {op_type} makes {v.type}"
            assert math.isfinite(b), f"generator bug: {op_type} has an unbounded output"
            self.bounds[v.name] = float(b)
            if v.dtype == np.float32:
                self.pool.append(v)
        return out

    # Operands -------------------------------------------------------------------------------------
    def candidates(self, accept: Accept = any_value, limit: float = math.inf) -> list[Value]:
        """Pool values ``accept`` takes that are within ``limit`` or can be squashed into it
        (when the node budget allows), newest first (so shrinking prefers chains over fan-out)."""
        squash = self.can_squash
        return [v for v in reversed(self.pool) if accept(v) and (self.bound(v) <= limit or squash)]

    def pick(self, accept: Accept = any_value, limit: float = math.inf) -> Value:
        """A pool operand ``accept`` takes, squashed into ``limit`` (adds at most one node)."""
        cands = self.candidates(accept, limit)
        return self.tame(self.choice(cands), limit)

    def pick_from(self, values: Sequence[Value], limit: float = math.inf) -> Value:
        return self.tame(self.choice(values), limit)

    def tame(self, v: Value, limit: float) -> Value:
        """``v`` itself when ``|v| <= limit`` is guaranteed, else ``v`` squashed into the limit."""
        if self.bound(v) <= limit:
            return v
        op = self.choice(self.squash_ops)
        if op == "Clip":
            return self.op("Clip", v, self.scalar("lo", -limit), self.scalar("hi", limit), bound=limit)
        return self.op(op, v, bound=1.0)
