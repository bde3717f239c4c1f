"""Hypothesis strategies for random, valid, static-shape opfuse graphs.

    from hypothesis import given
    from opfuse.testing.random_graphs import graph_and_inputs, property_settings

    @property_settings(max_examples=30)
    @given(graph_and_inputs(max_nodes=8))
    def test_my_pass_keeps_outputs(case):
        graph, feeds = case
        ...

A graph is grown step by step: it starts from one graph input and repeatedly applies a drawn
*op family* (``graph_families``) to operands drawn from the tensors built so far, until it has
the drawn number of nodes. Fan-out, several outputs (every tensor nobody reads is an output) and
shared sibling inputs arise naturally; pattern families add the decomposed forms the rewrites
recognise. Every decision is a Hypothesis draw, so graphs shrink towards few, simple nodes and
the same seed always gives the same graph.

Guarantees: ``graph.verify()`` passes; every tensor has at most ``MAX_ELEMENTS`` elements; all
values are float32 (plus int64/bool constants); no node has only constant inputs (the ONNX
importer would fold it); with inputs in ``[-INPUT_BOUND, INPUT_BOUND]`` (``random_feeds``) every
tensor is finite and below a tracked bound (see ``graph_draft``).
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import numpy as np
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from opfuse.errors import InputError
from opfuse.ir.graph import Graph
from opfuse.ops.registry import is_supported
from opfuse.testing.graph_draft import INPUT_BOUND, GraphDraft
from opfuse.testing.graph_families import FAMILIES, Family

MAX_STALLED_STEPS = 16
# opfuse-internal ops (not ONNX ops; the exporter expands them): generated only when asked for.
INTERNAL_OPS = frozenset({"Silu"})
# Every op some family can emit.
ALL_OPS = frozenset().union(*(f.ops for f in FAMILIES))
# Standard ONNX ops: what graphs contain unless told otherwise.
DEFAULT_OPS = ALL_OPS - INTERNAL_OPS

# The first graph input's shape, by rank: (low, high) per axis. Rank 4 is (N, C, H, W),
# rank 3 (N, C, L) or (B, T, D), rank 2 (N, D). Listed in the order shrinking prefers.
INPUT_DIMS = {
    2: ((1, 4), (1, 16)),
    4: ((1, 2), (1, 8), (1, 8), (1, 8)),
    3: ((1, 2), (1, 8), (1, 16)),
    1: ((1, 16),),
}
SEED_MAX = 2 ** 32 - 1
# When every sink is an output anyway, at most this many intermediate values are outputs too.
MAX_EXTRA_OUTPUTS = 2

# The magnitude bounds of the graphs ``graphs()`` made (dropped with the graph).
_BOUNDS: "weakref.WeakKeyDictionary[Graph, dict[str, float]]" = weakref.WeakKeyDictionary()


def _check_ops(ops: Iterable[str]) -> frozenset[str]:
    if isinstance(ops, str):
        raise InputError(f"ops must be a collection of op names, got the string {ops!r}")
    ops = frozenset(ops)
    unknown = sorted(op for op in ops if not is_supported(op))
    if unknown:
        raise InputError(f"ops {unknown} are not in the opfuse op registry")
    ungenerated = sorted(ops - ALL_OPS)
    if ungenerated:
        raise InputError(f"the random graph generator cannot emit {ungenerated}; "
                         f"it knows {sorted(ALL_OPS)}")
    return ops


def enabled_families(ops: Iterable[str] = DEFAULT_OPS, patterns: bool = True) -> tuple[Family, ...]:
    """The op families ``graphs(ops=ops, patterns=patterns)`` draws from."""
    ops = _check_ops(ops)
    return tuple(f for f in FAMILIES if f.enabled(ops) and (patterns or not f.pattern))


# Squeeze needs a unit axis; Unsqueeze makes one when the graph input has none. Asin, Acos
# and Atanh read x / 2 of |x| <= 1, Tan and ReduceProd |x| <= 1 (Tanh squashes the
# inputs into it); Acosh and ReduceLogSum read |x| + c; DepthToSpace and SpaceToDepth need
# channels or sides that Tile (and SpaceToDepth) make divisible.
_FOCUS_HELPERS = {"Squeeze": {"Unsqueeze"}, "Asin": {"Mul", "Tanh"}, "Acos": {"Mul", "Tanh"},
                  "Atanh": {"Mul", "Tanh"}, "Tan": {"Tanh"}, "ReduceProd": {"Tanh"},
                  "Acosh": {"Abs", "Add"}, "ReduceLogSum": {"Abs", "Add"},
                  "DepthToSpace": {"SpaceToDepth", "Tile"}, "SpaceToDepth": {"Tile"}}


def focused_ops(op: str) -> frozenset[str]:
    """The smallest op set whose graphs feature ``op``: the op and what its family cannot do
    without (Log needs Abs and Add for its guard; Squeeze needs Unsqueeze to make unit axes; an
    op a family only adds to another, as Not to a comparison, needs that one)."""
    _check_ops([op])
    family = next(f for f in FAMILIES if op in f.ops)
    lead = set() if op in f_main(family) else {family.any_of[0]}
    return frozenset({op} | set(family.all_of) | lead | _FOCUS_HELPERS.get(op, set()))


def f_main(family: Family) -> tuple[str, ...]:
    return family.any_of + family.all_of


def graphs(max_nodes: int = 12, ops: Iterable[str] = DEFAULT_OPS, allow_multi_output: bool = True, *,
           min_nodes: int = 1, max_inputs: int = 3, patterns: bool = True) -> st.SearchStrategy[Graph]:
    """A strategy of verified float32 graphs with ``min_nodes..max_nodes`` nodes using only ``ops``.

    ``allow_multi_output=False`` keeps one output (the last value built) and drops the nodes it
    does not need, so such graphs may have fewer than ``min_nodes`` nodes. ``max_inputs`` bounds
    the graph inputs (binary ops may create sibling inputs). ``patterns=False`` leaves out the
    decomposed patterns (SiLU, GELU, LayerNorm, Conv-BN-Relu, residual, attention, SE).
    Raises ``InputError`` for an op set it cannot generate from.
    """
    if not 1 <= min_nodes <= max_nodes:
        raise InputError(f"need 1 <= min_nodes <= max_nodes, got {min_nodes} and {max_nodes}")
    if max_inputs < 1:
        raise InputError(f"max_inputs must be >= 1, got {max_inputs}")
    ops = _check_ops(ops)
    families = enabled_families(ops, patterns)
    if not families:
        raise InputError(f"no op family can be built from ops {sorted(ops)}")
    ranks = [r for r in INPUT_DIMS if any(r in f.ranks for f in families)]
    return _graphs(families, ops, ranks, min_nodes, max_nodes, allow_multi_output, max_inputs)


@st.composite
def _graphs(draw, families, ops, ranks, min_nodes, max_nodes, allow_multi_output, max_inputs) -> Graph:
    seed = draw(st.integers(0, SEED_MAX))
    d = GraphDraft(draw, ops, seed=seed, target_nodes=draw(st.integers(min_nodes, max_nodes)),
                   max_inputs=max_inputs)
    d.new_input([d.integer(lo, hi) for lo, hi in INPUT_DIMS[d.choice(ranks)]])
    stalled = 0  # steps in a row that added nothing (a family may find no valid geometry for its operand)
    while d.nodes_left > 0 and stalled < MAX_STALLED_STEPS:
        ready = [f for f in families if f.ready(d)]
        if not ready:
            break
        before = d.num_nodes
        d.choice(ready).apply(d)
        stalled = stalled + 1 if d.num_nodes == before else 0
    assume(d.num_nodes > 0)
    assert d.num_nodes <= max_nodes, f"generator bug: {d.num_nodes} nodes > {max_nodes}"
    return _finish(d, allow_multi_output)


def _finish(d: GraphDraft, allow_multi_output: bool) -> Graph:
    """Choose the outputs (every unread tensor, maybe a few read ones too), drop dead code."""
    g = d.graph
    produced = [v for n in g.nodes for v in n.outputs]
    if allow_multi_output:
        outputs = [v for v in produced if not v.uses]
        read = [v for v in produced if v.uses]
        if read and d.rarely():
            extra = d.subset(read)[:MAX_EXTRA_OUTPUTS]
            outputs = [v for v in produced if v in outputs or any(v is e for e in extra)]
    else:
        outputs = [produced[-1]]
    g.outputs = outputs
    g.prune()
    g.verify()
    _BOUNDS[g] = {name: b for name, b in d.bounds.items() if name in g.values}
    return g


def magnitude_bounds(graph: Graph) -> dict[str, float]:
    """For a graph made by ``graphs()``: a bound ``B[name]`` per input and node output such that
    ``|value| <= B[name]`` elementwise whenever the inputs lie in ``[-INPUT_BOUND, INPUT_BOUND]``
    (as ``random_feeds`` draws them). Useful to scale a comparison tolerance to a value's size.
    Raises ``InputError`` for any other graph (or one changed since: a new value has no bound)."""
    bounds = _BOUNDS.get(graph)
    if bounds is None:
        raise InputError(f"graph '{graph.name}' was not made by opfuse.testing.graphs()")
    return dict(bounds)



def random_feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs uniform in ``[-INPUT_BOUND, INPUT_BOUND]``: the range the magnitude bounds assume."""
    rng = np.random.default_rng(seed)
    return {v.name: rng.uniform(-INPUT_BOUND, INPUT_BOUND, size=v.shape).astype(v.dtype)
            for v in graph.inputs}


def graph_and_inputs(max_nodes: int = 12, ops: Iterable[str] = DEFAULT_OPS, allow_multi_output: bool = True,
                     **kwargs) -> st.SearchStrategy[tuple[Graph, dict[str, np.ndarray]]]:
    """``(graph, feeds)``: a graph from ``graphs(...)`` and seeded inputs for it."""
    return st.tuples(graphs(max_nodes, ops, allow_multi_output, **kwargs),
                     st.integers(0, SEED_MAX)).map(lambda gs: (gs[0], random_feeds(gs[0], gs[1])))


def property_settings(max_examples: int, **overrides) -> settings:
    """Hypothesis settings for graph property tests: derandomized (the same examples on every run
    and machine), no deadline (the first onnxruntime session is slow), no example database, and
    no health checks about the generator's size or speed (graphs are big draws by design)."""
    base: dict[str, Any] = dict(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                print_blob=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])
    base.update(overrides)
    return settings(**base)
