"""Bugs ``opfuse fuzz`` found, each shrunk to its minimal graph: the C backend (unfused and fused
by the named planner) against the reference executor."""
from __future__ import annotations

import numpy as np

import opfuse
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.testing.fuzz_check import compare


def _agrees(graph, feeds, **compile_kw) -> None:
    want = reference.run(graph, feeds)
    for fuse in (False, True):
        got = opfuse.compile(graph, fuse=fuse, **compile_kw).run(feeds)
        diff = compare(got, want)
        assert diff is None, f"{'fused' if fuse else 'unfused'}: {diff}"


def test_concat_of_a_value_aliased_into_an_outer_concat_copies_it():
    """Concat(Concat(m, m), m): m is written in place into the outer Concat only; the inner
    Concat skipped copying it, as if it were aliased into its own output (garbage out)."""
    b = GraphBuilder("concat_alias")
    m = b.op("ReduceMean", b.input("x", (1, 11)), axes=[1], keepdims=0)
    g = b.build(b.op("Concat", b.op("Concat", m, m, axis=0), m, axis=0))
    x = np.random.default_rng(0).uniform(-2, 2, (1, 11)).astype(np.float32)
    _agrees(g, {"x": x}, planner="rules")


def test_signed_overflow_wraps_and_checks_after_it_stay():
    """Relu(1 + Relu(x)) at x = INT_MAX: the sum wraps to INT_MIN and Relu makes it 0. gcc took the
    overflow for impossible (undefined in C) and dropped the second Relu's test: INT_MIN came out.
    Fixed by compiling with -fwrapv."""
    b = GraphBuilder("wrap")
    x = b.input("x", (1, 3), np.int32)
    g = b.build(b.op("Relu", b.op("Add", b.const("one", np.array(1, np.int32)), b.op("Relu", x))))
    _agrees(g, {"x": np.array([[2 ** 31 - 1, 1, 47830817]], np.int32)})
