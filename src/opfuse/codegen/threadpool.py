"""The host program's own thread pool: the C the parallel loops of ``outline.py`` run on.

Why not OpenMP: every OpenMP parallel region ends at a barrier that waits for all of the team's
threads, also for a worker that has not been given a core yet. On a machine whose other core is busy
that wait is a time slice of the scheduler per region (measured with libgomp: resnet8 at 2 threads
0.114 -> 0.828 ms, the PP-OCR classifier 0.50 -> 25-44 ms with one busy process on the other core),
and waits that spin for it steal the core the worker needs (``benchmarks/pool_fork_join.c``).

This pool never waits for a worker that has not started: the caller claims the loop's pieces like
the workers do, and at the end waits only for the pieces a worker has claimed and not yet finished.
A loop whose workers are asleep or descheduled runs on the caller alone, at the cost of one thread.

A job (one parallel loop, ``opfuse_parallel``) is split in ranges, one per thread: for
``schedule(static)`` the ranges of OpenMP's static schedule (thread t owns the t-th block of
``ceil(n / nt)`` iterations, so consecutive loops with the same split keep their data in the same
core's cache), each cut in ``OPFUSE_STATIC_PIECES`` pieces; a thread takes its own range's pieces
from the front and, when its own range is empty, another's from the back. For
``schedule(dynamic, 1)`` one range of one-iteration pieces, taken from the front by everyone. Each
range's state is one 64-bit word, ``job << 40 | head << 20 | tail``, changed only by
compare-and-swap: a thread that read an earlier job's word can never take a piece of the next one.
The job's descriptor (function, argument, ranges) is published under a sequence lock
(``opfuse_pool.seq`` odd while it is being written); a thread reads the limits of a range, then
checks the sequence is unchanged before it claims. When the claim succeeds the job had a piece
left, so it cannot have ended and its descriptor cannot have been rewritten since.

Workers spin for ``OPFUSE_SPIN_NS`` (100 us) after their last piece, polling the sequence with a
``pause`` and yielding the core every 64 polls, then sleep on a condition variable; the caller
signals it only when some worker sleeps (and, having woken them, counts none asleep). An inference
starts with ``opfuse_pool_begin``: where every worker sleeps (or none has started) and the model's
split kernels are too little work to pay for waking a core (``CodegenOptions.pool_wake_min_flops``),
it runs on one thread; where they are worth it, it wakes the sleepers first (``opfuse_pool_wake``; a
worker woken with no job yet spins again), so that they are up by the first split loop. Concurrent callers
(two model objects of one library in two threads) do not wait for each other: the pool has one caller
at a time, and the other runs its loop alone. A ``fork``ed child starts with no workers
(``pthread_atfork``); the library's destructor stops and joins the workers before it is unloaded.

The per-thread index that picks a thread's scratch (``OPFUSE_TID()``) is the ``tid`` argument of
the loop's outlined body: 0 for the caller, 1.. for the workers, always below the loop's thread count.
Without ``OPFUSE_THREADS`` (the portable and cross builds) ``opfuse_parallel`` runs the loop inline.
"""
from __future__ import annotations

SPIN_NS = 100_000      # a worker's spin after its last piece before it sleeps (see the docstring)
STATIC_PIECES = 4      # pieces per thread's range in a static loop (what another thread may take)
MAX_THREADS = 256      # workers beyond this are not started; their share runs on the others

POOL_C = f"""\
/* opfuse's thread pool (codegen/threadpool.py): the caller never waits for a worker that has not started. */
typedef void (*opfuse_body)(void* arg, long lo, long hi, int tid);
#define OPFUSE_STATIC 0
#define OPFUSE_DYNAMIC 1
#if defined(OPFUSE_THREADS)
#include <pthread.h>
#include <sched.h>
#include <time.h>
#ifndef OPFUSE_SPIN_NS
#define OPFUSE_SPIN_NS {SPIN_NS}
#endif
#ifndef OPFUSE_STATIC_PIECES
#define OPFUSE_STATIC_PIECES {STATIC_PIECES}
#endif
#define OPFUSE_MAX_THREADS {MAX_THREADS}
#define OPFUSE_PIECES_MAX ((1L << 20) - 1)
#if defined(__x86_64__) || defined(__i386__)
#define OPFUSE_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define OPFUSE_RELAX() __asm__ __volatile__("yield")
#else
#define OPFUSE_RELAX() ((void)0)
#endif
struct opfuse_range {{
  uint64_t word;  /* job << 40 | head << 20 | tail: the pieces [head, tail) are left */
  long first;     /* the range's first iteration */
  long count;     /* its iterations */
  long piece;     /* iterations per piece */
  char pad[32];
}};
static struct {{
  uint64_t seq;                 /* 2 * job; odd while the next job's descriptor is written */
  char pad0[56];
  long done;                    /* iterations of the job finished */
  char pad1[56];
  opfuse_body fn;
  void* arg;
  int nt, nranges, steal;       /* the job's threads, its ranges, whether other ranges may be taken */
  int busy;                     /* a caller holds the pool */
  int started, sleepers, quit;  /* sleepers: workers waiting on cv that no one has woken since */
  unsigned wakes;               /* opfuse_pool_wake's calls: a worker woken by one, job or not, spins again */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t th[OPFUSE_MAX_THREADS];
  struct opfuse_range r[OPFUSE_MAX_THREADS];
}} opfuse_pool __attribute__((aligned(64))) = {{.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER}};

static uint64_t opfuse_pool_ns(void) {{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}}

#define OPFUSE_LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
/* Take pieces of job `seq` (its sequence value) and run them; `tid`'s own range first. */
static void opfuse_pool_work(uint64_t seq, int tid) {{
  const uint64_t job = (seq >> 1) & 0xFFFFFFu;
  const int nr = OPFUSE_LOAD(opfuse_pool.nranges), steal = OPFUSE_LOAD(opfuse_pool.steal);
  const opfuse_body fn = OPFUSE_LOAD(opfuse_pool.fn);
  void* const arg = OPFUSE_LOAD(opfuse_pool.arg);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (__atomic_load_n(&opfuse_pool.seq, __ATOMIC_RELAXED) != seq || nr < 1) return;
  for (int k = 0; k < nr; ++k) {{
    struct opfuse_range* const r = &opfuse_pool.r[(tid + k) % nr];
    const int own = k == 0 || !steal;
    if (k > 0 && !steal) break;
    uint64_t w = __atomic_load_n(&r->word, __ATOMIC_ACQUIRE);
    for (;;) {{
      if (w >> 40 != job) return;  /* the job is over */
      const long head = (long)((w >> 20) & 0xFFFFFu), tail = (long)(w & 0xFFFFFu);
      if (head >= tail) break;
      const long first = OPFUSE_LOAD(r->first), count = OPFUSE_LOAD(r->count), piece = OPFUSE_LOAD(r->piece);
      __atomic_thread_fence(__ATOMIC_ACQUIRE);
      if (__atomic_load_n(&opfuse_pool.seq, __ATOMIC_RELAXED) != seq) return;
      const long p = own ? head : tail - 1;
      const uint64_t next = own ? w + (UINT64_C(1) << 20) : w - 1;
      if (__atomic_compare_exchange_n(&r->word, &w, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {{
        const long lo = first + p * piece;
        const long hi = (p + 1) * piece < count ? first + (p + 1) * piece : first + count;
        fn(arg, lo, hi, tid);
        __atomic_fetch_add(&opfuse_pool.done, hi - lo, __ATOMIC_RELEASE);
        w = __atomic_load_n(&r->word, __ATOMIC_ACQUIRE);
      }}
    }}
  }}
}}

static void* opfuse_pool_worker(void* p) {{
  const int tid = (int)(intptr_t)p;
  uint64_t seen = __atomic_load_n(&opfuse_pool.seq, __ATOMIC_ACQUIRE) & ~(uint64_t)1;
  for (;;) {{
    uint64_t s = 0, t0 = opfuse_pool_ns();
    for (long polls = 1;; ++polls) {{
      s = __atomic_load_n(&opfuse_pool.seq, __ATOMIC_ACQUIRE);
      if ((s != seen && !(s & 1)) || __atomic_load_n(&opfuse_pool.quit, __ATOMIC_RELAXED)) break;
      if (polls % 64) {{
        OPFUSE_RELAX();
        continue;
      }}
      if (opfuse_pool_ns() - t0 < OPFUSE_SPIN_NS) {{
        sched_yield();  /* the caller may be waiting for this core */
        continue;
      }}
      pthread_mutex_lock(&opfuse_pool.mu);
      const unsigned wakes = opfuse_pool.wakes;
      __atomic_fetch_add(&opfuse_pool.sleepers, 1, __ATOMIC_SEQ_CST);
      /* opfuse_pool_wake (a job, or an inference worth the workers) sets sleepers to 0 under the mutex */
      while (__atomic_load_n(&opfuse_pool.seq, __ATOMIC_SEQ_CST) == seen && opfuse_pool.wakes == wakes &&
             !opfuse_pool.quit)
        pthread_cond_wait(&opfuse_pool.cv, &opfuse_pool.mu);
      pthread_mutex_unlock(&opfuse_pool.mu);
      t0 = opfuse_pool_ns();
    }}
    if (__atomic_load_n(&opfuse_pool.quit, __ATOMIC_RELAXED)) return NULL;
    seen = s;
    if (tid < OPFUSE_LOAD(opfuse_pool.nt)) opfuse_pool_work(s, tid);
  }}
}}

static void opfuse_pool_forked(void) {{  /* the child of a fork has no workers */
  opfuse_pool.started = 0;
  opfuse_pool.sleepers = 0;
  opfuse_pool.busy = 0;
  pthread_mutex_init(&opfuse_pool.mu, NULL);
  pthread_cond_init(&opfuse_pool.cv, NULL);
}}

/* Wake every sleeping worker (the caller of a job or of an inference that is worth them). */
static void opfuse_pool_wake(void) {{
  pthread_mutex_lock(&opfuse_pool.mu);
  opfuse_pool.wakes++;
  __atomic_store_n(&opfuse_pool.sleepers, 0, __ATOMIC_SEQ_CST);
  pthread_cond_broadcast(&opfuse_pool.cv);
  pthread_mutex_unlock(&opfuse_pool.mu);
}}

__attribute__((destructor)) static void opfuse_pool_stop(void) {{
  if (!opfuse_pool.started) return;
  pthread_mutex_lock(&opfuse_pool.mu);
  __atomic_store_n(&opfuse_pool.quit, 1, __ATOMIC_SEQ_CST);
  pthread_cond_broadcast(&opfuse_pool.cv);
  pthread_mutex_unlock(&opfuse_pool.mu);
  for (int i = 0; i < opfuse_pool.started; ++i) pthread_join(opfuse_pool.th[i], NULL);
  opfuse_pool.started = 0;
}}

/* Run fn(arg, lo, hi, tid) over [0, n) on up to nt threads, the caller one of them (tid 0). */
static void opfuse_parallel(opfuse_body fn, void* arg, long n, int nt, int schedule) {{
  if (n <= 0) return;
  if (nt > OPFUSE_MAX_THREADS) nt = OPFUSE_MAX_THREADS;
  if (nt <= 1 || n == 1 || __atomic_exchange_n(&opfuse_pool.busy, 1, __ATOMIC_ACQUIRE)) {{
    fn(arg, 0, n, 0);  /* one thread, or another caller holds the pool: this loop runs here alone */
    return;
  }}
  if (opfuse_pool.started < nt - 1) {{
    static int atfork;
    if (!atfork) atfork = pthread_atfork(NULL, NULL, opfuse_pool_forked) == 0;
    while (opfuse_pool.started < nt - 1) {{
      if (pthread_create(&opfuse_pool.th[opfuse_pool.started], NULL, opfuse_pool_worker,
                         (void*)(intptr_t)(opfuse_pool.started + 1)) != 0) break;  /* fewer workers */
      opfuse_pool.started++;
    }}
  }}
  const uint64_t seq = (__atomic_load_n(&opfuse_pool.seq, __ATOMIC_RELAXED) | 1) + 1;
  const uint64_t job = (seq >> 1) & 0xFFFFFFu;
  __atomic_store_n(&opfuse_pool.seq, seq - 1, __ATOMIC_RELAXED);  /* odd: the descriptor is being written */
  __atomic_thread_fence(__ATOMIC_RELEASE);
  const int dynamic = schedule == OPFUSE_DYNAMIC;
  const int nr = dynamic ? 1 : (int)(n < nt ? n : nt);
  const long block = (n + nr - 1) / nr;
  for (int k = 0; k < nr; ++k) {{
    struct opfuse_range* const r = &opfuse_pool.r[k];
    const long first = dynamic ? 0 : k * block;
    const long count = dynamic ? n : n - first < block ? (n > first ? n - first : 0) : block;
    long piece = dynamic || count == 0 ? 1 : (count + OPFUSE_STATIC_PIECES - 1) / OPFUSE_STATIC_PIECES;
    if ((count + piece - 1) / piece > OPFUSE_PIECES_MAX) piece = (count + OPFUSE_PIECES_MAX - 1) / OPFUSE_PIECES_MAX;
    __atomic_store_n(&r->first, first, __ATOMIC_RELAXED);
    __atomic_store_n(&r->count, count, __ATOMIC_RELAXED);
    __atomic_store_n(&r->piece, piece, __ATOMIC_RELAXED);
    __atomic_store_n(&r->word, job << 40 | (uint64_t)((count + piece - 1) / piece), __ATOMIC_RELAXED);
  }}
  __atomic_store_n(&opfuse_pool.fn, fn, __ATOMIC_RELAXED);
  __atomic_store_n(&opfuse_pool.arg, arg, __ATOMIC_RELAXED);
  __atomic_store_n(&opfuse_pool.nt, nt, __ATOMIC_RELAXED);
  __atomic_store_n(&opfuse_pool.nranges, nr, __ATOMIC_RELAXED);
  __atomic_store_n(&opfuse_pool.steal, !dynamic, __ATOMIC_RELAXED);
  __atomic_store_n(&opfuse_pool.done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&opfuse_pool.seq, seq, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&opfuse_pool.sleepers, __ATOMIC_SEQ_CST) > 0) opfuse_pool_wake();
  opfuse_pool_work(seq, 0);
  /* every piece is taken: wait for the ones a worker is still running */
  for (long polls = 1; __atomic_load_n(&opfuse_pool.done, __ATOMIC_ACQUIRE) < n; ++polls) {{
    if (polls % 64) OPFUSE_RELAX();
    else sched_yield();
  }}
  __atomic_store_n(&opfuse_pool.busy, 0, __ATOMIC_RELEASE);
}}

/* The threads an inference runs on (opfuse_run's first step): `nt`, except that where every worker sleeps
   (or none has started) and the model is not worth waking them (`worth` 0: its split loops are small, see
   CodegenOptions.pool_wake_min_flops), one: waking a sleeping core costs more than they would save. Where
   it is worth it, the sleepers are woken now, so that they are up by the first split loop. */
static int opfuse_pool_begin(int nt, int worth) {{
  if (nt <= 1) return 1;
  const int sleepers = __atomic_load_n(&opfuse_pool.sleepers, __ATOMIC_SEQ_CST);
  if (!worth) return opfuse_pool.started == 0 || sleepers >= opfuse_pool.started ? 1 : nt;
  if (sleepers > 0) opfuse_pool_wake();
  return nt;
}}
#else
static int opfuse_pool_begin(int nt, int worth) {{
  (void)worth;
  return nt > 1 ? nt : 1;
}}
static void opfuse_parallel(opfuse_body fn, void* arg, long n, int nt, int schedule) {{
  (void)nt; (void)schedule;
  if (n > 0) fn(arg, 0, n, 0);
}}
#endif
"""
