"""Kernel scratch inside the arena, for targets with no memory outside it (microcontrollers).

A kernel's scratch (GEMM packing panels and tiles, padded convolution planes) lives only while
that kernel runs: it is a buffer with lifetime ``[t, t]``. The tensors are already placed
(``MemoryPlan.blocks``), so each kernel's scratch goes into the smallest gap between the
blocks live at ``t`` that fits (best fit, as ``arena.assign_offsets``), else just above them;
the arena grows only when that is past its end. The host keeps its per-thread scratch apart
instead (one region per thread, reused by every kernel).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from opfuse.memory.arena import align_up
from opfuse.memory.plan import MemoryPlan


@dataclass(frozen=True)
class ScratchPlacement:
    offsets: list[int | None]  # per kernel (plan.groups order): arena offset, None when it needs none
    arena_bytes: int           # the arena with every kernel's scratch: tensors and scratch together
    tensor_bytes: int          # the arena of the tensors alone (MemoryPlan.arena_bytes)

    @property
    def growth_bytes(self) -> int:
        """What scratch adds to the arena (0 when it all fits in gaps)."""
        return self.arena_bytes - self.tensor_bytes


def place_scratch(memory: MemoryPlan, needs: Sequence[int]) -> ScratchPlacement:
    """An arena offset for the scratch of every kernel ``t`` (``needs[t]`` bytes)."""
    total = memory.arena_bytes
    offsets: list[int | None] = []
    for t, need in enumerate(needs):
        if need <= 0:
            offsets.append(None)
            continue
        size = align_up(need, memory.alignment)
        busy = sorted((off, off + align_up(sz, memory.alignment))
                      for off, sz, start, end in memory.blocks.values() if start <= t <= end)
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, hi)
        if total - cursor >= size and (best is None or total - cursor < best[0]):
            best = (total - cursor, cursor)
        offset = best[1] if best is not None else cursor
        offsets.append(offset)
        total = max(total, offset + size)
    return ScratchPlacement(offsets, total, memory.arena_bytes)
