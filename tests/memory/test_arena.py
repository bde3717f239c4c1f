"""Offset assignment: the property that matters (no two live buffers share a byte) on
random lifetimes, alignment, and the lower bound."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opfuse.memory.arena import ARENA_ALIGNMENT, Buffer, align_up, assign_offsets, lower_bound

buffers = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)).map(
        lambda t: (t[0], t[1], t[1] + t[2])),
    min_size=0, max_size=40,
).map(lambda xs: [Buffer(f"b{i}", s, a, e) for i, (s, a, e) in enumerate(xs)])


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(buffers)
def test_live_buffers_never_overlap(bufs):
    offsets, total = assign_offsets(bufs)
    assert set(offsets) == {b.key for b in bufs}
    for b in bufs:
        assert offsets[b.key] % ARENA_ALIGNMENT == 0
        assert offsets[b.key] + b.size <= total
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if a.overlaps_in_time(b):
                assert offsets[a.key] + a.size <= offsets[b.key] or offsets[b.key] + b.size <= offsets[a.key]
    assert lower_bound(bufs) <= total <= sum(align_up(b.size) for b in bufs)


def test_a_chain_reuses_memory():
    # a -> b -> c -> d: each buffer dies when the next but one is born.
    bufs = [Buffer(k, 1000, i, i + 1) for i, k in enumerate("abcd")]
    offsets, total = assign_offsets(bufs)
    assert total == 2 * align_up(1000)
    assert lower_bound(bufs) == 2000
    assert offsets["a"] == offsets["c"] and offsets["b"] == offsets["d"]


def test_best_fit_fills_the_smallest_gap():
    # Placed largest first: A, B, C, D, E; while X lives, B and D are dead, leaving gaps of
    # 1280 bytes (where B was) and 640 bytes (where D was). X (640 bytes) takes the snug one.
    bufs = [Buffer("A", 3200, 0, 4), Buffer("B", 1280, 0, 0), Buffer("C", 1280, 0, 4),
            Buffer("D", 640, 0, 0), Buffer("E", 640, 0, 4), Buffer("X", 640, 1, 3)]
    offsets, total = assign_offsets(bufs)
    assert offsets["B"] == 3200 and offsets["D"] == 5760
    assert offsets["X"] == offsets["D"]
    assert total == 7040


def test_empty():
    assert assign_offsets([]) == ({}, 0)
    assert lower_bound([]) == 0
