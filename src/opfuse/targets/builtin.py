"""Built-in data-sheet profiles: a Cortex-M7 microcontroller and two datacenter GPUs.

These are for *planning*: the numbers come from data sheets and the seed's case study,
not from measurement; each profile's ``notes`` list the assumptions. The host profile is
measured on request, or nominal (``opfuse.targets.calibrate``).
"""
from __future__ import annotations

from opfuse.targets.profile import HardwareProfile

KIB = 1 << 10
MIB = 1 << 20

# Cortex-M7 (the seed's MobileNet case study: 400 MHz, 512 KB SRAM, ~400 MB/s DRAM).
M7_CLOCK_HZ = 400e6
M7_FP32_FLOP_PER_CYCLE = 2  # one pipelined VFMA.F32 per cycle = a multiply and an add
M7_FP64_FLOP_PER_CYCLE = 1  # assumption: a double-precision FMA issues every other cycle
M7_INT8_OP_PER_CYCLE = 4  # SMLAD: two 16x16-bit multiply-accumulates per cycle on int8 widened to int16
M7_CALL_OVERHEAD_CYCLES = 40  # call/return, prologue and loop set-up of one kernel function

# Kernel launch on a GPU, back-to-back in one stream without CUDA graphs (assumption).
GPU_LAUNCH_OVERHEAD_S = 3e-6
GPU_REGISTERS_PER_THREAD = 255
GPU_HBM_LATENCY_S = 5e-7


def cortex_m7() -> HardwareProfile:
    return HardwareProfile(
        name="cortex-m7",
        peak_flops={"float32": M7_CLOCK_HZ * M7_FP32_FLOP_PER_CYCLE,
                    "float16": M7_CLOCK_HZ * M7_FP32_FLOP_PER_CYCLE,
                    "float64": M7_CLOCK_HZ * M7_FP64_FLOP_PER_CYCLE,
                    "int8": M7_CLOCK_HZ * M7_INT8_OP_PER_CYCLE},
        mem_bandwidth=400e6,
        onchip_bytes=512 * KIB,
        register_bytes=32 * 4,  # S0-S31 single-precision registers
        vector_bytes=4,  # 32-bit DSP SIMD (the M7 has no NEON: that is Cortex-A / Helium on M55)
        launch_overhead_s=M7_CALL_OVERHEAD_CYCLES / M7_CLOCK_HZ,
        numa_nodes=1, numa_local_latency_s=1e-7, numa_remote_latency_s=1e-7,
        cache_line_bytes=32, memory_parallelism=1,
        source="datasheet",
        notes=("peak float32 = 400 MHz x 2 FLOP/cycle (one fused multiply-add per cycle)",
               "float16 arithmetic runs in the single-precision FPU (FPv5 only converts half)",
               "float64 assumed at 1 FLOP/cycle; int8 at 4 op/cycle via SMLAD",
               "on-chip = 512 KB SRAM; main memory = external DRAM at ~400 MB/s"),
    )


def a100() -> HardwareProfile:
    """NVIDIA A100 SXM4 80 GB, dense (no sparsity) tensor-core peaks."""
    return HardwareProfile(
        name="a100",
        peak_flops={"float16": 312e12, "bfloat16": 312e12, "float32": 19.5e12,
                    "float64": 9.7e12, "int8": 624e12},
        mem_bandwidth=2.039e12,
        onchip_bytes=40 * MIB,  # L2
        register_bytes=GPU_REGISTERS_PER_THREAD * 4,
        vector_bytes=16,  # 128-bit loads per thread
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        numa_nodes=1, numa_local_latency_s=GPU_HBM_LATENCY_S, numa_remote_latency_s=GPU_HBM_LATENCY_S,
        cache_line_bytes=128, memory_parallelism=256,
        source="datasheet",
        notes=("float16/bfloat16/int8 are tensor-core peaks; float32 without TF32",
               "on-chip = 40 MB L2; registers are the per-thread view (255 x 32-bit)",
               "planning only: nothing runs on this target"),
    )


def h200() -> HardwareProfile:
    """NVIDIA H200 SXM 141 GB, dense (no sparsity) tensor-core peaks."""
    return HardwareProfile(
        name="h200",
        peak_flops={"float16": 989e12, "bfloat16": 989e12, "float8": 1979e12, "int8": 1979e12,
                    "float32": 67e12, "float64": 34e12},
        mem_bandwidth=4.8e12,
        onchip_bytes=50 * MIB,  # L2
        register_bytes=GPU_REGISTERS_PER_THREAD * 4,
        vector_bytes=16,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        numa_nodes=1, numa_local_latency_s=GPU_HBM_LATENCY_S, numa_remote_latency_s=GPU_HBM_LATENCY_S,
        cache_line_bytes=128, memory_parallelism=256,
        source="datasheet",
        notes=("float16/bfloat16/float8/int8 are dense tensor-core peaks (half the sparse figures)",
               "on-chip = 50 MB L2; registers are the per-thread view (255 x 32-bit)",
               "planning only: nothing runs on this target"),
    )


BUILTIN_PROFILES = {"cortex-m7": cortex_m7, "a100": a100, "h200": h200}
