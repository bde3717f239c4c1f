"""The GEMM micro-kernel alone (``codegen/microkernel.py``), for candidate register blocks on this CPU.

For each block MR x NR (packed A and B, the AVX-512 body where the block fits the zmm registers, else
AVX2) and each depth K, one C program times, with the thread's CPU time (``CLOCK_THREAD_CPUTIME_ID``),
``C[M x N] = A @ B`` computed as the GEMM's inner loops do with one K block: every MR-row panel of A
against every NR-column panel of B, N = ``--n`` columns (B's K x N block in L2, one panel in L1 for
K <= 384 at NR = 32), M = ``--m`` rows rounded to MR. The blocks run interleaved, round by round, in
one process; the medians of ``--rounds`` are printed in GFLOP/s with the square-sgemm peak of NumPy
(OpenBLAS, one thread) timed in the same run. Results are checked against a plain C loop (the same
sums, so within a few ulps)::

    env -u OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS=1 python benchmarks/bench_microkernel.py \\
        --blocks 8x32 12x32 14x32 6x64 4x64 --k 128 256 512 1024
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import shlex  # noqa: E402

from opfuse.codegen import microkernel as uk  # noqa: E402
from opfuse.runtime.toolchain import find_compiler  # noqa: E402

DRIVER = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <math.h>
#define OPFUSE_PRAGMA(x) _Pragma(#x)
%(kernels)s
typedef void (*ukr_fn)(long, const float*, const float* const*, const int32_t*, const float*, long, float*,
                       long, int);
static double now(void) {
  struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmp(const void* x, const void* y) {
  double a = *(const double*)x, b = *(const double*)y; return (a > b) - (a < b);
}
int main(int argc, char** argv) {
  const long ks[] = {%(ks)s}; const int nk = %(nk)d;
  const int mrs[] = {%(mrs)s}, nrs[] = {%(nrs)s}; ukr_fn fns[] = {%(fns)s}; const int nb = %(nb)d;
  const long m0 = %(m)d, n0 = %(n)d; const int rounds = %(rounds)d;
  const long cap = 1L << 20;
  float *a = aligned_alloc(64, 4 * cap), *b = aligned_alloc(64, 4 * cap), *c = aligned_alloc(64, 4 * cap);
  for (long i = 0; i < cap; ++i) {
    a[i] = (float)((i * 7919) %% 1000) / 1000.0f - 0.5f; b[i] = (float)((i * 104729) %% 997) / 997.0f - 0.5f;
  }
  double* t = malloc(sizeof(double) * rounds * nb * nk);
  for (int r = -2; r < rounds; ++r)
    for (int ki = 0; ki < nk; ++ki)
      for (int bi = 0; bi < nb; ++bi) {
        const long kc = ks[ki], mr = mrs[bi], nr = nrs[bi], m = (m0 + mr - 1) / mr * mr, n = (n0 / nr) * nr;
        const double t0 = now();
        for (int rep = 0; rep < 4; ++rep)
          for (long j = 0; j < n; j += nr)
            for (long i = 0; i < m; i += mr)
              fns[bi](kc, a + i * kc, 0, 0, b + j * kc, 0, c + i * n + j, n, 0);
        const double dt = (now() - t0) / 4;
        if (r >= 0) t[(ki * nb + bi) * rounds + r] = 2.0 * m * n * kc / dt / 1e9;
        if (r == -1) {  /* check: C[i][j] = sum_k A_panel[k][i] * B_panel[k][j] */
          double err = 0;
          for (long i = 0; i < m; ++i) for (long j = 0; j < n; ++j) {
            const float* ap = a + (i / mr) * mr * kc; const float* bp = b + (j / nr) * nr * kc; double s = 0;
            for (long k = 0; k < kc; ++k) s += (double)ap[k * mr + i %% mr] * bp[k * nr + j %% nr];
            double e = fabs(s - c[i * n + j]); if (e > err) err = e; }
          if (err > 1e-3) { printf("MISMATCH %%ldx%%ld k=%%ld err %%g\n", mr, nr, kc, err); return 1; }
        }
      }
  for (int ki = 0; ki < nk; ++ki)
    for (int bi = 0; bi < nb; ++bi) {
      double* x = t + (ki * nb + bi) * rounds; qsort(x, rounds, sizeof(double), cmp);
      printf("%%ld %%dx%%d %%.1f %%.1f\n", ks[ki], mrs[bi], nrs[bi], x[rounds / 2], x[rounds - 1]);
    }
  return 0;
}
"""


def sgemm_peak(n: int = 1024, repeat: int = 9) -> float:
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    np.matmul(a, b, out=out)
    ts = []
    for _ in range(repeat):
        t0 = time.thread_time()
        np.matmul(a, b, out=out)
        ts.append(time.thread_time() - t0)
    return 2.0 * n ** 3 / statistics.median(ts) / 1e9


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--blocks", nargs="+", default=["8x32", "12x32", "14x32", "6x64", "4x64", "8x48", "10x48"])
    p.add_argument("--k", nargs="+", type=int, default=[128, 256, 512, 1024])
    p.add_argument("--m", type=int, default=96)
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--rounds", type=int, default=31)
    p.add_argument("--isa", choices=("avx512", "avx2"), default="avx512")
    args = p.parse_args(argv)
    blocks = [tuple(int(x) for x in s.split("x")) for s in args.blocks]
    kernels, fns = [], []
    for mr, nr in blocks:
        fn, text = uk.microkernel(mr, nr, avx512=args.isa == "avx512")
        kernels.append(text)
        fns.append(fn)
    src = DRIVER % {"kernels": "\n".join(kernels), "ks": ", ".join(map(str, args.k)), "nk": len(args.k),
                    "mrs": ", ".join(str(b[0]) for b in blocks), "nrs": ", ".join(str(b[1]) for b in blocks),
                    "fns": ", ".join(fns), "nb": len(blocks), "m": args.m, "n": args.n, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="opfuse-ukr-") as d:
        Path(d, "ukr.c").write_text(src)
        flags = ["-O3", "-std=c11", "-ffp-contract=off", "-march=native"] + (["-mno-avx512f"] if args.isa == "avx2"
                                                                            else [])
        subprocess.run([*shlex.split(find_compiler()), *flags, "-o", f"{d}/ukr", f"{d}/ukr.c", "-lm"], check=True)
        peak_before = sgemm_peak()
        out = subprocess.run([f"{d}/ukr"], capture_output=True, text=True, check=False)
        peak_after = sgemm_peak()
    if out.returncode:
        print(out.stdout, out.stderr, file=sys.stderr)
        return 1
    peak = max(peak_before, peak_after)
    print(f"sgemm n=1024 peak {peak_before:.1f} / {peak_after:.1f} GFLOP/s; load {os.getloadavg()[0]:.2f}")
    print(f"{'K':>5} {'block':>6} {'median':>8} {'best':>8} {'% peak':>7}")
    for line in out.stdout.splitlines():
        k, blk, med, best = line.split()
        print(f"{k:>5} {blk:>6} {float(med):8.1f} {float(best):8.1f} {100 * float(med) / peak:6.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
