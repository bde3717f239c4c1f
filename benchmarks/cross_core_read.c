/* How fast one core reads what the other core has just written, against rereading what it wrote itself: the cost
 * behind the README's "static blocks for contiguous tiles" (a kernel at 2 threads reads the lines the kernel before
 * wrote on either core). Thread 0 writes a buffer, reads it back (local), then hands it to thread 1, which reads it
 * (remote: every line is modified in the other core's cache); 20 rounds per size, the two threads pinned to CPUs 0
 * and 1.
 *
 *   gcc -O2 -mavx2 -pthread benchmarks/cross_core_read.c -o /tmp/cross_core_read && /tmp/cross_core_read
 *
 * Measured on the 2-vCPU Intel guest (family 6 model 167), 2026-12-05, two runs: 256 KiB this core 112-114 GB/s,
 * the other 18-19; 1 MiB 124-133 and 21-22; 1.6 MB 82-83 and 22 (an AVX-512 version of the probe: 89-144 and
 * 20-27). */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ROUNDS 20

static float* buf;
static long floats;
static atomic_int phase;
static double remote_s;
static float sink;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static float read_all(void) {  /* four independent sums, so the loads are the limit */
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (long i = 0; i < floats; i += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(buf + i));
    b = _mm256_add_ps(b, _mm256_load_ps(buf + i + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(buf + i + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(buf + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

static void write_all(float v) {
  for (long i = 0; i < floats; i += 8) _mm256_store_ps(buf + i, _mm256_set1_ps(v));
}

static void* reader(void* arg) {
  (void)arg;
  pin(1);
  for (int r = 0; r < ROUNDS; ++r) {
    while (atomic_load(&phase) != 2 * r + 1) {}
    double t = now();
    sink += read_all();
    remote_s += now() - t;
    atomic_store(&phase, 2 * r + 2);
  }
  return NULL;
}

int main(void) {
  const long sizes[] = {256L << 10, 1L << 20, 1600000L};
  for (int s = 0; s < 3; ++s) {
    floats = sizes[s] / 4 / 32 * 32;
    buf = aligned_alloc(64, (size_t)floats * 4);
    atomic_store(&phase, 0);
    remote_s = 0;
    double local_s = 0;
    pthread_t th;
    pthread_create(&th, NULL, reader, NULL);
    pin(0);
    for (int r = 0; r < ROUNDS; ++r) {
      write_all((float)r);
      double t = now();
      sink += read_all();
      local_s += now() - t;
      write_all((float)r + 1);  /* modified in this core's cache again, then read by the other */
      atomic_store(&phase, 2 * r + 1);
      while (atomic_load(&phase) != 2 * r + 2) {}
    }
    pthread_join(th, NULL);
    double bytes = (double)floats * 4 * ROUNDS;
    printf("%8ld bytes: this core %6.1f GB/s, the other core %6.1f GB/s\n", floats * 4, bytes / local_s / 1e9,
           bytes / remote_s / 1e9);
    free(buf);
  }
  return sink == 12345.0f;
}
