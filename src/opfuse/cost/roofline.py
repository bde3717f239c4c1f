"""The roofline model, in numbers (the seed's 7.3.1 and 7.4.1).

* operational intensity ``I = FLOPs / bytes``;
* attainable performance ``P = min(P_peak, I * B)``; ridge point ``I_c = P_peak / B``:
  ``I < I_c`` is bandwidth-bound, ``I >= I_c`` compute-bound;
* predicted time ``T = max(T_compute, T_memory) + T_overhead`` with
  ``T_compute = FLOPs / P_peak`` and ``T_memory = bytes / B``;
* bandwidth saving rate of a fusion ``eta = 1 - M_boundary / M_total``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

COMPUTE_BOUND = "compute"
MEMORY_BOUND = "memory"


@dataclass(frozen=True)
class Roofline:
    flops: float
    bytes: float
    peak_flops: float
    bandwidth: float
    overhead_s: float = 0.0

    @property
    def intensity(self) -> float:
        """FLOP per byte; infinite for a kernel that moves no bytes."""
        return self.flops / self.bytes if self.bytes > 0 else math.inf

    @property
    def ridge_point(self) -> float:
        return self.peak_flops / self.bandwidth

    @property
    def attainable_flops(self) -> float:
        return min(self.peak_flops, self.intensity * self.bandwidth)

    @property
    def t_compute(self) -> float:
        return self.flops / self.peak_flops

    @property
    def t_memory(self) -> float:
        return self.bytes / self.bandwidth

    @property
    def time(self) -> float:
        return max(self.t_compute, self.t_memory) + self.overhead_s

    @property
    def bound(self) -> str:
        return COMPUTE_BOUND if self.intensity >= self.ridge_point else MEMORY_BOUND


def bandwidth_saving_rate(boundary_bytes: float, total_bytes: float) -> float:
    """``eta = 1 - M_boundary / M_total`` (0 when nothing moves)."""
    return 1.0 - boundary_bytes / total_bytes if total_bytes > 0 else 0.0
