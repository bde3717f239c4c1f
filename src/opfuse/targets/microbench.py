"""Host micro-benchmarks: bandwidth, peak FLOP/s, per-kernel call overhead, DRAM latency.

Preferred: one small C program compiled with the system compiler exactly as generated
kernels are (``gcc -O3 -march=native``) and timed inside with ``clock_gettime``, so the
numbers are what generated C will see:

* bandwidth: a STREAM-style "scale" kernel ``a[i] = s * b[i]`` over two arrays larger than
  the last-level cache; bytes = read + write (STREAM's convention); best of several runs.
  (Scale rather than copy: a plain copy loop is turned into ``memcpy`` by the compiler.)
* peak FLOP/s: a register-blocked GEMM (4 rows x 64 columns of C accumulated across k)
  in float32 and float64, ``2 n^3`` FLOPs; best of several runs, one core.
* call overhead: an empty kernel called through a function pointer, per call.
* DRAM latency: a pointer chase through a random cyclic permutation (Sattolo) of the
  bandwidth buffer, per hop.

Fallback when no C compiler exists: the same quantities timed with NumPy (its BLAS for
the GEMM, a one-element ufunc call for the per-kernel overhead); the profile's
``source`` says which was used.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from opfuse.yardsticks import best_seconds

COMPILER_FLAGS = ("-O3", "-march=native", "-std=c11")
COMPILE_TIMEOUT_S = 60
RUN_TIMEOUT_S = 60
NUMPY_CALL_COST_RATIO = 100  # a NumPy ufunc call costs ~100 C calls: time fewer of them


@dataclass(frozen=True)
class BenchSizes:
    """Problem sizes; ``FULL`` keeps a whole calibration near 1-2 s on a desktop core."""

    stream_bytes: int  # size of each of the two STREAM arrays (well above the LLC)
    stream_reps: int
    gemm_n: int  # must be a multiple of 64 (the GEMM's column block)
    gemm_reps: int
    call_reps: int
    chase_hops: int


FULL = BenchSizes(stream_bytes=64 << 20, stream_reps=5, gemm_n=256, gemm_reps=8,
                  call_reps=5_000_000, chase_hops=1_000_000)
QUICK = BenchSizes(stream_bytes=4 << 20, stream_reps=2, gemm_n=64, gemm_reps=2,
                   call_reps=100_000, chase_hops=20_000)


@dataclass(frozen=True)
class Measurement:
    bandwidth_Bps: float
    peak_flops: dict[str, float]
    call_overhead_s: float
    dram_latency_s: float | None
    method: str  # "c: <compiler version>" or "numpy"


C_SOURCE = r"""
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

__attribute__((noinline)) static void scale(double *restrict a, const double *restrict b, double s, long n) {
    for (long i = 0; i < n; i++) a[i] = s * b[i];
}

#define JB 64
#define GEMM(NAME, T)                                                                   \
__attribute__((noinline)) static void NAME(int n, const T *restrict A, const T *restrict B,  \
                                           T *restrict C) {                             \
    for (int i = 0; i < n; i += 4)                                                      \
        for (int j0 = 0; j0 < n; j0 += JB) {                                            \
            T acc[4][JB];                                                               \
            memset(acc, 0, sizeof acc);                                                 \
            for (int k = 0; k < n; k++) {                                               \
                const T *b = B + (long)k * n + j0;                                      \
                for (int r = 0; r < 4; r++) {                                           \
                    T a = A[(long)(i + r) * n + k];                                     \
                    for (int j = 0; j < JB; j++) acc[r][j] += a * b[j];                 \
                }                                                                       \
            }                                                                           \
            for (int r = 0; r < 4; r++)                                                 \
                memcpy(C + (long)(i + r) * n + j0, acc[r], sizeof acc[r]);              \
        }                                                                               \
}
GEMM(gemm_f32, float)
GEMM(gemm_f64, double)

__attribute__((noinline)) void empty_kernel(float *restrict out, const float *restrict in, long n) {
    __asm__ volatile("" : : "r"(out), "r"(in), "r"(n) : "memory");
}
void (*volatile kernel_ptr)(float *restrict, const float *restrict, long) = empty_kernel;

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage\n"); return 2; }
    long nbytes = atol(argv[1]); int sreps = atoi(argv[2]); int n = atoi(argv[3]);
    int greps = atoi(argv[4]); long creps = atol(argv[5]); long hops = atol(argv[6]);

    long len = nbytes / (long)sizeof(double);
    double *a = malloc(len * sizeof(double)), *b = malloc(len * sizeof(double));
    if (!a || !b) return 3;
    for (long i = 0; i < len; i++) { a[i] = 0.0; b[i] = (double)(i & 1023); }
    double best = 1e30;
    for (int r = 0; r < sreps; r++) {
        double t0 = now(); scale(a, b, 1.0000001, len); double t = now() - t0;
        if (t < best) best = t;
    }
    printf("bandwidth %.6e\n", 2.0 * (double)len * sizeof(double) / best);
    printf("checksum %.3e\n", a[len / 3]);

    float *fa = malloc((long)n * n * sizeof(float)), *fb = malloc((long)n * n * sizeof(float)),
          *fc = malloc((long)n * n * sizeof(float));
    double *da = malloc((long)n * n * sizeof(double)), *db = malloc((long)n * n * sizeof(double)),
           *dc = malloc((long)n * n * sizeof(double));
    if (!fa || !fb || !fc || !da || !db || !dc) return 3;
    for (long i = 0; i < (long)n * n; i++) {
        fa[i] = (float)((i % 7) - 3) * 0.25f; fb[i] = (float)((i % 5) - 2) * 0.5f;
        da[i] = fa[i]; db[i] = fb[i];
    }
    double flops = 2.0 * (double)n * n * n, b32 = 1e30, b64 = 1e30;
    for (int r = 0; r < greps; r++) {
        double t0 = now(); gemm_f32(n, fa, fb, fc); double t = now() - t0; if (t < b32) b32 = t;
        t0 = now(); gemm_f64(n, da, db, dc); t = now() - t0; if (t < b64) b64 = t;
    }
    printf("gemm_float32 %.6e\n", flops / b32);
    printf("gemm_float64 %.6e\n", flops / b64);
    printf("checksum %.3e %.3e\n", (double)fc[n + 1], dc[n + 1]);

    double t0 = now();
    for (long i = 0; i < creps; i++) kernel_ptr(fc, fa, i);
    printf("call %.6e\n", (now() - t0) / (double)creps);

    /* Sattolo's algorithm: one cycle through every slot, so the chase never short-cuts. */
    long *next = (long *)a;
    for (long i = 0; i < len; i++) next[i] = i;
    unsigned long long s = 88172645463325252ULL;
    for (long i = len - 1; i > 0; i--) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        long j = (long)(s % (unsigned long long)i);
        long tmp = next[i]; next[i] = next[j]; next[j] = tmp;
    }
    long p = 0;
    t0 = now();
    for (long h = 0; h < hops; h++) p = next[p];
    double lat = (now() - t0) / (double)hops;
    printf("latency %.6e\n", lat);
    printf("checksum %ld\n", p);
    return 0;
}
"""


def find_compiler() -> str | None:
    for cc in (os.environ.get("CC"), "gcc", "cc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


def compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        return out.stdout.splitlines()[0].strip() if out.stdout else cc
    except (OSError, subprocess.SubprocessError):
        return cc


def measure_with_c(cc: str, sizes: BenchSizes = FULL) -> Measurement:
    """Compile and run the C micro-benchmarks; raises ``RuntimeError`` when either fails."""
    with tempfile.TemporaryDirectory(prefix="opfuse-calib-") as tmp:
        src = Path(tmp) / "microbench.c"
        exe = Path(tmp) / "microbench"
        src.write_text(C_SOURCE)
        build = subprocess.run([cc, *COMPILER_FLAGS, "-o", str(exe), str(src)],
                               capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if build.returncode != 0:
            raise RuntimeError(f"{cc} failed: {build.stderr.strip()[:500]}")
        args = [str(a) for a in (sizes.stream_bytes, sizes.stream_reps, sizes.gemm_n,
                                 sizes.gemm_reps, sizes.call_reps, sizes.chase_hops)]
        run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if run.returncode != 0:
            raise RuntimeError(f"micro-benchmark exited with {run.returncode}: {run.stderr.strip()[:500]}")
    values: dict[str, float] = {}
    for line in run.stdout.splitlines():
        key, _, rest = line.partition(" ")
        if key != "checksum":
            values[key] = float(rest.split()[0])
    needed = ("bandwidth", "gemm_float32", "gemm_float64", "call", "latency")
    if any(k not in values or not values[k] > 0 for k in needed):
        raise RuntimeError(f"micro-benchmark printed incomplete results: {run.stdout!r}")
    return Measurement(bandwidth_Bps=values["bandwidth"],
                       peak_flops={"float32": values["gemm_float32"], "float64": values["gemm_float64"]},
                       call_overhead_s=values["call"], dram_latency_s=values["latency"],
                       method=f"c: {compiler_version(cc)} {' '.join(COMPILER_FLAGS)}")


def measure_with_numpy(sizes: BenchSizes = FULL) -> Measurement:
    """The fallback: the same quantities as NumPy sees them (no DRAM latency)."""
    n = sizes.stream_bytes // 8
    a, b = np.zeros(n), np.arange(n, dtype=np.float64)
    t = best_seconds(lambda: np.multiply(b, 1.0000001, out=a), sizes.stream_reps, warm=False)
    bandwidth = 2 * n * 8 / t
    peaks = {}
    for dtype in ("float32", "float64"):
        m = np.ones((sizes.gemm_n, sizes.gemm_n), dtype=dtype)
        t = best_seconds(functools.partial(np.matmul, m, m), sizes.gemm_reps, warm=False)
        peaks[dtype] = 2 * sizes.gemm_n ** 3 / t
    one, out = np.ones(1, np.float32), np.empty(1, np.float32)
    reps = max(1, sizes.call_reps // NUMPY_CALL_COST_RATIO)
    t0 = time.perf_counter()
    for _ in range(reps):
        np.add(one, one, out=out)
    overhead = (time.perf_counter() - t0) / reps
    return Measurement(bandwidth_Bps=bandwidth, peak_flops=peaks, call_overhead_s=overhead,
                       dram_latency_s=None, method="numpy")
