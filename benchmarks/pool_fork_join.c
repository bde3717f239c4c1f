/* A prototype of the thread pool the README's "threads on a busy machine" asks for, against libgomp's
 * parallel regions (benchmarks/omp_fork_join.c), on the same regions: the caller claims chunks of a loop
 * like the worker does and, at the loop's end, waits only for the chunks the worker has claimed and not yet
 * finished, never for a worker that has not woken. The worker spins for a while after a loop, then sleeps on a
 * futex; the caller wakes it only when it sleeps.
 *
 *   gcc -O2 -pthread -fopenmp benchmarks/pool_fork_join.c -o /tmp/pool_fork_join && /tmp/pool_fork_join
 *   (python3 -c "while True: pass" &) ; /tmp/pool_fork_join ; pkill -f "while True"   # the other core busy
 *
 * A job is published as one 64-bit word, its sequence number above its next unclaimed index, so a worker that
 * read an old job's number can never claim an index of the next one (its compare-and-swap fails). Each loop of
 * 2 chunks of a few ns, so the region's own cost is what is timed (medians of 1000 regions, after gaps of
 * caller work). The code generator's pool (src/opfuse/codegen/threadpool.py) grew from this prototype: a range per
 * thread (OpenMP's static blocks) with pieces another thread may take from the back, the job's limits under a
 * sequence lock (here a late worker could read the next job's size before its compare-and-swap), a time-bounded
 * spin and a condition variable instead of the futex. */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define INDEX_BITS 40
#define SPIN 20000 /* polls of the job word before the worker sleeps */

typedef void (*body_fn)(void* ctx, long it, int tid);

static struct {
  _Atomic uint64_t job;    /* sequence << INDEX_BITS | next unclaimed index */
  _Atomic uint32_t wake;   /* futex word: bumped when a job is published to a sleeping worker */
  _Atomic int sleeping;
  _Atomic long done;       /* chunks of the current job finished */
  body_fn fn;
  void* ctx;
  long n;
} pool;

static long futex(_Atomic uint32_t* addr, int op, uint32_t val) {
  return syscall(SYS_futex, (uint32_t*)addr, op, val, NULL, NULL, 0);
}

/* Claim and run chunks of job `seq` until none is left; returns the chunks run. */
static long run_chunks(uint64_t seq, int tid) {
  long ran = 0;
  uint64_t w = atomic_load_explicit(&pool.job, memory_order_acquire);
  for (;;) {
    if ((w >> INDEX_BITS) != seq) return ran;
    const long i = (long)(w & ((UINT64_C(1) << INDEX_BITS) - 1));
    if (i >= pool.n) return ran;
    body_fn fn = pool.fn;
    void* ctx = pool.ctx;
    if (atomic_compare_exchange_weak_explicit(&pool.job, &w, w + 1, memory_order_acq_rel, memory_order_acquire)) {
      fn(ctx, i, tid);
      atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
      ran++;
      w = atomic_load_explicit(&pool.job, memory_order_acquire);
    }
  }
}

static void* worker(void* arg) {
  (void)arg;
  uint64_t seen = 0;
  for (;;) {
    uint64_t seq = 0;
    for (int s = 0; s < SPIN; s++) {
      seq = atomic_load_explicit(&pool.job, memory_order_acquire) >> INDEX_BITS;
      if (seq != seen) break;
      if (s % 64 == 63) sched_yield();  /* the caller may be waiting for this CPU (a wake-up placed us on its own) */
      else __builtin_ia32_pause();
    }
    if (seq == seen) {  /* sleep until a job is published */
      const uint32_t ticket = atomic_load(&pool.wake);
      atomic_store(&pool.sleeping, 1);
      seq = atomic_load_explicit(&pool.job, memory_order_acquire) >> INDEX_BITS;
      if (seq == seen) futex(&pool.wake, FUTEX_WAIT_PRIVATE, ticket);
      atomic_store(&pool.sleeping, 0);
      continue;
    }
    seen = seq;
    run_chunks(seq, 1);
  }
  return NULL;
}

static uint64_t next_seq = 1;

/* The caller's side of a parallel loop of n chunks. */
static void parallel_for(body_fn fn, void* ctx, long n) {
  const uint64_t seq = next_seq++;
  pool.fn = fn;
  pool.ctx = ctx;
  pool.n = n;
  atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
  atomic_store_explicit(&pool.job, seq << INDEX_BITS, memory_order_release);
  if (atomic_load(&pool.sleeping)) {
    atomic_fetch_add(&pool.wake, 1);
    futex(&pool.wake, FUTEX_WAKE_PRIVATE, 1);
  }
  run_chunks(seq, 0);
  /* every chunk is claimed now; wait for the ones a worker is still running */
  while (atomic_load_explicit(&pool.done, memory_order_acquire) < n) __builtin_ia32_pause();
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static volatile float sink[64 * 16];

static void work(void* ctx, long it, int tid) {
  (void)ctx;
  float a = (float)it;
  for (long i = 0; i < 10; i++) a = a * 1.0000001f + 1e-7f;
  sink[tid * 16] = a;
}

static void omp_region(void) {
#pragma omp parallel for num_threads(2) schedule(dynamic, 1)
  for (long j = 0; j < 2; j++) work(NULL, j, omp_get_thread_num());
}

static void pool_region(void) { parallel_for(work, NULL, 2); }

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void measure(const char* name, void (*region)(void)) {
  enum { R = 1000 };
  static double t[R];
  const int gaps[] = {0, 100, 1000};
  for (int i = 0; i < 100; i++) region();
  for (unsigned g = 0; g < sizeof gaps / sizeof gaps[0]; g++) {
    const int n = gaps[g] >= 1000 ? 200 : R;
    for (int r = 0; r < n; r++) {
      const double t1 = now_us();
      while (now_us() - t1 < gaps[g]) {}
      const double t0 = now_us();
      region();
      t[r] = now_us() - t0;
    }
    qsort(t, n, sizeof(double), cmp);
    double sum = 0;
    for (int r = 0; r < n; r++) sum += t[r];
    printf("%-7s region after %4d us of caller work: median %7.2f us  p90 %8.2f  mean %8.2f\n", name, gaps[g],
           t[n / 2], t[9 * n / 10], sum / n);
  }
}

int main(void) {
  pthread_t th;
  pthread_create(&th, NULL, worker, NULL);
  measure("libgomp", omp_region);
  measure("pool", pool_region);
  return 0;
}
