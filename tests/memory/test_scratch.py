"""Kernel scratch placed inside the arena (``memory.scratch``)."""
from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from opfuse.memory.arena import Buffer, assign_offsets
from opfuse.memory.scratch import place_scratch


def _memory(blocks: dict, arena: int, alignment: int = 64):
    return SimpleNamespace(blocks=blocks, arena_bytes=arena, alignment=alignment)


def test_scratch_takes_the_smallest_gap_between_live_tensors():
    # At kernel 1: [0, 128) and [384, 512) are live; the 256-byte gap between them fits 200 bytes.
    mem = _memory({"a": (0, 128, 0, 1), "b": (384, 128, 1, 2), "c": (128, 256, 0, 0)}, 512)
    placed = place_scratch(mem, [0, 200, 0])
    assert placed.offsets == [None, 128, None]
    assert placed.arena_bytes == 512 and placed.growth_bytes == 0


def test_scratch_goes_above_the_live_tensors_when_no_gap_fits():
    mem = _memory({"a": (0, 256, 0, 0), "b": (256, 256, 0, 1)}, 512)
    placed = place_scratch(mem, [100, 300])
    # Kernel 0: everything is live, so above it (128 aligned bytes). Kernel 1: the dead [0, 256)
    # is too small for 320 aligned bytes, and so is the 128 above b, so the arena grows.
    assert placed.offsets == [512, 512]
    assert placed.arena_bytes == 512 + 320 and placed.growth_bytes == 320


def test_a_dead_region_below_the_top_is_reused():
    mem = _memory({"a": (0, 256, 0, 0), "b": (256, 256, 0, 1)}, 512)
    placed = place_scratch(mem, [0, 256])
    assert placed.offsets == [None, 0]
    assert placed.growth_bytes == 0


def _scratch_reference(blocks: dict, arena: int, alignment: int, needs) -> tuple[list, int]:
    """The documented rule, written independently: per kernel t needing scratch, among the offsets
    where it fits between the blocks live at t and below the arena's end so far, the one whose
    free gap is smallest (the lowest on a tie); else just above the live blocks, growing the arena."""
    def aligned(n):
        return (n + alignment - 1) // alignment * alignment

    total, offsets = arena, []
    for t, need in enumerate(needs):
        if need <= 0:
            offsets.append(None)
            continue
        size = aligned(need)
        live = [(o, o + aligned(s)) for o, s, a, b in blocks.values() if a <= t <= b]
        options = []
        for c in sorted({0} | {hi for _, hi in live}):
            if any(lo < c + size and c < hi for lo, hi in live):
                continue
            above = [lo for lo, _ in live if lo >= c + size]
            upper = min(above) if above else total
            grows = not above and c + size > total
            options.append((grows, 0 if grows else upper - c, c))
        _, _, offset = min(options)
        offsets.append(offset)
        total = max(total, offset + size)
    return offsets, total


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 8), st.integers(0, 4)), max_size=15),
       st.lists(st.integers(0, 400), min_size=1, max_size=10), st.sampled_from([1, 16, 64]))
def test_scratch_placement_is_the_documented_best_fit(spec, needs, alignment):
    """Mutation testing found the alignment, a need of 1 byte, ties and the gap to the arena's end
    unchecked; this compares every placement with the rule (tensor blocks from ``assign_offsets``)."""
    bufs = [Buffer(f"b{i}", s, a, a + d) for i, (s, a, d) in enumerate(spec)]
    offs, arena = assign_offsets(bufs, alignment)
    blocks = {b.key: (offs[b.key], b.size, b.start, b.end) for b in bufs}
    placed = place_scratch(_memory(blocks, arena, alignment), needs)
    assert (placed.offsets, placed.arena_bytes) == _scratch_reference(blocks, arena, alignment, needs)
    assert placed.tensor_bytes == arena


def test_a_gap_up_to_the_arena_end_that_fits_exactly_is_the_best_fit():
    # At kernel 0: a 192-byte gap between a and b, and exactly 128 bytes from b to the arena's end.
    mem = _memory({"a": (0, 64, 0, 0), "b": (256, 64, 0, 0)}, 448)
    placed = place_scratch(mem, [128])
    assert placed.offsets == [320] and placed.growth_bytes == 0
