"""Code generation options: every tuning constant of the C backend, named in one place."""
from __future__ import annotations

from dataclasses import dataclass, replace

from opfuse.errors import OpfuseError

LAYOUTS = ("NCHW",)
WEIGHT_MODES = ("blob", "embed")
SIMD_MODES = ("auto", "none")


@dataclass(frozen=True)
class CodegenOptions:
    # Activation layout. Only NCHW (ONNX's) for now; the emitter takes it as a parameter so
    # an NHWC path can be added without touching callers.
    layout: str = "NCHW"
    # "auto": the micro-kernels are AVX2/FMA intrinsics where the C compiler targets AVX2 and
    # FMA (``#if``), plain C99 elsewhere; "none": plain C99 only (the microcontroller build,
    # and the reference the intrinsics are tested against).
    simd: str = "auto"
    # GEMM register block (MR x NR accumulators): 6 x 16 is 12 ymm accumulators, 2 B vectors
    # and a broadcast (117 GFLOP/s per core on this host, as fast as 512-bit code). Cache
    # blocks: K in blocks of at most KC; tiles of MC x NC outputs, at most ``gemm_tile_floats``
    # of C tile (it stays in L2); a side whose other operand is packed per tile spans up to
    # ``gemm_wide`` (one packing serves that many outputs); problems are cut into at least
    # ``gemm_min_tiles`` tiles where they can be, so threads have work to share.
    gemm_mr: int = 6
    gemm_nr: int = 16
    gemm_mc: int = 96
    gemm_nc: int = 256
    gemm_kc: int = 256
    gemm_wide: int = 512
    gemm_tile_floats: int = 32768
    gemm_min_tiles: int = 4
    gemm_prefetch: int = 32
    # Keys tiles of the attention kernel's online softmax.
    attention_block: int = 64
    # Below this many elementary operations a loop runs on one thread (spawning costs more).
    parallel_min_work: int = 1 << 15
    # When the outermost loop has fewer iterations than this, OpenMP collapses two loops.
    parallel_min_outer: int = 16
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
        if self.simd not in SIMD_MODES:
            raise OpfuseError(f"simd mode {self.simd!r}: expected one of {', '.join(SIMD_MODES)}")
        if self.gemm_mc % self.gemm_mr or self.gemm_nc % self.gemm_nr:
            raise OpfuseError("gemm_mc must be a multiple of gemm_mr and gemm_nc of gemm_nr")

    def with_(self, **kw) -> "CodegenOptions":
        return replace(self, **kw)
