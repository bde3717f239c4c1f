/* What a parallel region costs with libgomp, for CodegenOptions.parallel_min_work and the notes in
 * runtime/threads.py: back-to-back regions of 2 threads (the workers still spinning), regions after
 * a busy gap of the caller (the workers fall asleep once their GOMP_SPINCOUNT spin runs out, and
 * the next region waits for a wake-up), and a worksharing loop plus barrier inside one region.
 *
 *   gcc -O2 -fopenmp benchmarks/omp_fork_join.c -o /tmp/omp_fork_join
 *   GOMP_SPINCOUNT=10000 /tmp/omp_fork_join; OMP_WAIT_POLICY=PASSIVE /tmp/omp_fork_join
 *
 * Measured on the 2-core VM (quiet moment, GOMP_SPINCOUNT=10000): 0.6-0.7 us back to back, the same
 * after gaps of up to 100 us, 20-40 us after 300-3000 us (a wake-up), 0.3 us per barrier in one
 * region; PASSIVE: 8 us back to back. Under load (others taking 1.5 of the 2 cores) a region cost
 * about the whole spin (~55 us per 1000 spins) whenever the worker was not scheduled. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static volatile float sink[64 * 16];

static void work(long it) {  /* a few ns: the region's cost is what is measured */
  float a = (float)it;
  for (long i = 0; i < 10; i++) a = a * 1.0000001f + 1e-7f;
  sink[omp_get_thread_num() * 16] = a;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void region(int nt) {
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (long j = 0; j < 2; j++) work(j);
}

int main(void) {
  enum { R = 1000 };
  static double t[R];
  const int gaps[] = {0, 20, 100, 300, 1000, 3000};
  for (int i = 0; i < 100; i++) region(2);
  for (unsigned g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
    const int n = gaps[g] >= 1000 ? 200 : R;
    for (int r = 0; r < n; r++) {
      const double t1 = now_us();
      while (now_us() - t1 < gaps[g]) {}
      const double t0 = now_us();
      region(2);
      t[r] = now_us() - t0;
    }
    qsort(t, n, sizeof(double), cmp);
    printf("region after %4d us of caller work: median %7.2f us  p10 %7.2f  p90 %7.2f\n", gaps[g], t[n / 2],
           t[n / 10], t[9 * n / 10]);
  }
  const double t0 = now_us();
#pragma omp parallel num_threads(2)
  for (int r = 0; r < R; r++) {
#pragma omp for schedule(dynamic, 1)
    for (long j = 0; j < 2; j++) work(j);
  }
  printf("worksharing loop + barrier inside one region: %.2f us each\n", (now_us() - t0) / R);
  return 0;
}
