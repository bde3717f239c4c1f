"""Code generation options: every tuning constant of the C backend, named in one place."""
from __future__ import annotations

from dataclasses import dataclass, replace

from opfuse.errors import OpfuseError

LAYOUTS = ("NCHW",)
WEIGHT_MODES = ("blob", "embed")


@dataclass(frozen=True)
class CodegenOptions:
    # Activation layout. Only NCHW (ONNX's) for now; the emitter takes it as a parameter so
    # an NHWC path can be added without touching callers.
    layout: str = "NCHW"
    # GEMM register block (MR x NR accumulators) and cache blocks (MC x KC panel of A,
    # KC x NC panel of B). 6 x 24 floats measured best on this host's AVX2/AVX-512 cores
    # (about 110 GFLOP/s per core with -ffp-contract=off); NR = 16 vectorised badly with gcc 12.
    gemm_mr: int = 6
    gemm_nr: int = 24
    gemm_mc: int = 96
    gemm_nc: int = 192
    gemm_kc: int = 256
    # Keys tiles of the attention kernel's online softmax.
    attention_block: int = 64
    # Below this many elementary operations a loop runs on one thread (spawning costs more).
    parallel_min_work: int = 1 << 15
    # When the outermost loop has fewer iterations than this, OpenMP collapses two loops.
    parallel_min_outer: int = 16
    # A parallel loop whose every iteration is at least this much work (GEMM, conv and attention
    # tiles) hands iterations out one at a time, schedule(dynamic, 1): tiles differ in size (the
    # remainder tiles) and a thread may be descheduled on a shared machine, and static halves then
    # leave one thread idle. Lighter iterations (elements, rows, planes) keep static chunks: no
    # atomic per iteration. Threads never change results: every iteration is independent.
    parallel_dynamic_min_work: int = 1 << 15
    # "blob": weights passed as one pointer at run time; "embed": a static const array.
    weights: str = "blob"
    # Time every kernel call (clock_gettime around it); read back with CompiledModel.profile.
    profile: bool = False

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise OpfuseError(f"layout {self.layout!r} is not supported by the C backend (supported: "
                              f"{', '.join(LAYOUTS)})")
        if self.weights not in WEIGHT_MODES:
            raise OpfuseError(f"weights mode {self.weights!r}: expected one of {', '.join(WEIGHT_MODES)}")
        if self.gemm_mc % self.gemm_mr or self.gemm_nc % self.gemm_nr:
            raise OpfuseError("gemm_mc must be a multiple of gemm_mr and gemm_nc of gemm_nr")

    def with_(self, **kw) -> "CodegenOptions":
        return replace(self, **kw)
