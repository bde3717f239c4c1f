"""Kernel scratch placed inside the arena (``memory.scratch``)."""
from __future__ import annotations

from types import SimpleNamespace

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
