"""Offsets in one arena for buffers with known lifetimes (the static memory plan's core).

Each buffer is an interval ``[start, end]`` of kernel indices (inclusive) and a size. Two
buffers whose intervals intersect must not share bytes. We place buffers largest first;
each goes into the smallest gap between already-placed, time-overlapping buffers that fits
(best fit), or above all of them. This is the "greedy by size" heuristic of TFLite's arena
planner; it usually lands within a few percent of the lower bound

    LB = max over kernels t of  sum of sizes of buffers live at t,

which no placement can beat (those buffers must all be in memory at once).
"""
from __future__ import annotations

from dataclasses import dataclass

ARENA_ALIGNMENT = 64  # bytes: a cache line, and the widest vector load (AVX-512)


def align_up(n: int, alignment: int = ARENA_ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class Buffer:
    key: str
    size: int
    start: int
    end: int

    def overlaps_in_time(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


def assign_offsets(buffers: list[Buffer], alignment: int = ARENA_ALIGNMENT) -> tuple[dict[str, int], int]:
    """``({key: offset}, arena size)``; every offset is a multiple of ``alignment``."""
    order = sorted(buffers, key=lambda b: (-b.size, b.start, b.key))
    placed: list[tuple[int, int, Buffer]] = []  # (offset, aligned size, buffer)
    offsets: dict[str, int] = {}
    total = 0
    for buf in order:
        size = align_up(max(buf.size, 1), alignment)
        busy = sorted((o, o + s) for o, s, b in placed if b.overlaps_in_time(buf))
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for lo, hi in busy:
            if lo - cursor >= size and (best is None or lo - cursor < best[0]):
                best = (lo - cursor, cursor)
            cursor = max(cursor, hi)
        offset = best[1] if best is not None else cursor
        offsets[buf.key] = offset
        placed.append((offset, size, buf))
        total = max(total, offset + size)
    return offsets, total


def lower_bound(buffers: list[Buffer]) -> int:
    """Largest total size of buffers live at one kernel (unaligned bytes)."""
    if not buffers:
        return 0
    events = sorted({b.start for b in buffers})
    return max(sum(b.size for b in buffers if b.start <= t <= b.end) for t in events)
