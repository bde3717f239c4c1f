"""The program's thread pool (``codegen/threadpool.py``) and the loops outlined onto it (``codegen/outline.py``).

The pool is tested on its own, in a C harness: every iteration of every loop runs exactly once, on a thread
index below the loop's thread count, for both schedules, loop sizes from 0 to past the piece limit, thread
counts up and down between loops, two callers at once, and a forked child. The outliner is tested on the
text it reads and writes; the kernels it outlines run in every compiled test (``test_zoo.py`` at 2 threads,
the fuzzer's ``thresholds`` profile, which makes every loop a parallel one)."""
from __future__ import annotations

import subprocess

import pytest

from opfuse.codegen.outline import OutlineError, Outliner, declarations, parallel_loops, strip
from opfuse.codegen.threadpool import POOL_C
from opfuse.runtime.toolchain import THREAD_FLAGS, Toolchain

_HARNESS = r"""
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
POOL_C_HERE
#define CAP 3000000
struct job { int nt; int* hits; };
static void body(void* arg, long lo, long hi, int tid) {
  const struct job* j = arg;
  if (tid < 0 || tid >= j->nt) { fprintf(stderr, "tid %d of %d threads\n", tid, j->nt); abort(); }
  for (long i = lo; i < hi; ++i) __atomic_fetch_add(&j->hits[i], 1, __ATOMIC_RELAXED);
}
static int loop(int* hits, long n, int nt, int schedule) {
  memset(hits, 0, sizeof(int) * (size_t)(n + 8));
  struct job j = {nt, hits};
  opfuse_parallel(body, &j, n, nt, schedule);
  for (long i = 0; i < n + 8; ++i) {
    if (hits[i] != (i < n)) { fprintf(stderr, "n=%ld nt=%d schedule=%d: iteration %ld ran %d times\n",
                                      n, nt, schedule, i, hits[i]); return 1; }
  }
  return 0;
}
static const long sizes[] = {0, 1, 2, 3, 5, 7, 8, 64, 1000, 4099};
static const int threads[] = {1, 2, 3, 8, 2, 5};
static int rounds(int* hits, int reps) {
  for (int r = 0; r < reps; ++r)
    for (unsigned a = 0; a < sizeof sizes / sizeof *sizes; ++a)
      for (unsigned b = 0; b < sizeof threads / sizeof *threads; ++b)
        for (int s = 0; s < 2; ++s)
          if (loop(hits, sizes[a], threads[b], s)) return 1;
  return 0;
}
static void* other_caller(void* p) { return (void*)(intptr_t)rounds(p, 40); }
int main(void) {
  int* a = calloc(CAP + 8, sizeof(int));
  int* b = calloc(CAP + 8, sizeof(int));
  if (rounds(a, 40)) return 1;
  /* more pieces than a range's word holds: the pieces grow */
  if (loop(a, CAP, 2, OPFUSE_STATIC) || loop(a, (1L << 20) + 5, 3, OPFUSE_DYNAMIC)) return 1;
  /* two callers at once: one holds the pool, the other runs its loops alone */
  pthread_t t;
  if (pthread_create(&t, NULL, other_caller, b)) return 1;
  const int mine = rounds(a, 40);
  void* theirs;
  pthread_join(t, &theirs);
  if (mine || theirs) return 1;
  /* a forked child has no workers: its loops run, and it exits */
  const pid_t pid = fork();
  if (pid == 0) _exit(rounds(a, 5));
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status)) { fprintf(stderr, "child: %d\n", status); return 1; }
  if (rounds(a, 5)) return 1;
  puts("ok");
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    tc = Toolchain.detect(native=False)
    if not tc.threads:
        pytest.skip("the C compiler builds no POSIX threads here")
    d = tmp_path_factory.mktemp("pool")
    (d / "h.c").write_text(_HARNESS.replace("POOL_C_HERE", POOL_C))
    flags = [f for f in tc.flags if f not in ("-shared", "-fPIC")]
    r = subprocess.run([tc.cc, *flags, "-o", str(d / "h"), str(d / "h.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return d / "h"


def test_every_iteration_runs_once_on_a_thread_of_the_loop(harness):
    r = subprocess.run([str(harness)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_pool_is_built_only_with_threads():
    assert set(THREAD_FLAGS) == {"-pthread", "-DOPFUSE_THREADS"}
    assert "#if defined(OPFUSE_THREADS)" in POOL_C and "fn(arg, 0, n, 0)" in POOL_C.split("#else")[-1]


# The outliner -----------------------------------------------------------------------------------

PARAMS = [("const float* restrict", "p0_x"), ("float* restrict", "p1_y"), ("char* restrict", "scratch"), ("int", "nt")]


def _outline(body: str, faults=()) -> tuple[str, str]:
    o = Outliner("k0", PARAMS, list(faults))
    lines = o.run(body.strip("\n").split("\n"))
    return "\n".join(lines), "".join(o.functions)


def test_a_loop_becomes_a_function_with_what_it_reads():
    kernel, fn = _outline("""
  const long n1 = 96;
  const long rows2 = n1 / 6;
  float* restrict buf3 = ((float*)(scratch + (size_t)OPFUSE_TID() * OPFUSE_SCRATCH_STRIDE + 0));
  const float s4 = p0_x[0] * 2.0f;
  long unused5 = 7;
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(dynamic, 1) if(nt > 1))
  for (long i6 = 0; i6 < rows2; ++i6) {
    p1_y[i6] = p0_x[i6] * s4 + buf3[0];
  }
""")
    assert "opfuse_parallel(k0_par0, &c0_, (rows2), nt, OPFUSE_DYNAMIC);" in kernel
    assert "struct k0_par0_ctx c0_ = {p0_x, p1_y, buf3, s4};" in kernel
    assert "for (long i6 = 0" not in kernel
    # integer constants are declared again (loop bounds stay constants); the rest comes by value
    assert "const long n1 = 96;" in fn and "const long rows2 = n1 / 6;" in fn
    assert "float* restrict buf3 = c_->buf3;" in fn and "const float s4 = c_->s4;" in fn
    assert "const float* restrict p0_x = c_->p0_x;" in fn and "unused5" not in fn
    assert "for (long i6 = lo_; i6 < hi_; ++i6) {" in fn and "const int opfuse_tid = tid_;" in fn


def test_collapsed_loops_are_one_index_over_their_product():
    kernel, fn = _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) collapse(2) if(nt > 1))
  for (long a1 = 0; a1 < 3; ++a1)
  for (long b2 = 2; b2 < 11; b2 += 3) {
    p1_y[a1 * 4 + b2] = 1.0f;
  }
""")
    assert "opfuse_parallel(k0_par0, &c0_, (3) * ((((11) - (2)) + 2) / 3), nt, OPFUSE_STATIC);" in kernel
    assert "const long e1_ = ((((11) - (2)) + 2) / 3);" in fn
    assert "const long b2 = (2) + (i_ % e1_) * 3;" in fn and "const long a1 = ((i_ / e1_));" in fn


def test_fault_flags_are_or_reduced():
    kernel, fn = _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))
  for (long i1 = 0; i1 < 8; ++i1) {
    fault0 |= p0_x[i1] < 0.0f;
  }
""", faults=["fault0", "fault1"])
    assert "fault0 |= c0_.fault0;" in kernel and "fault1" not in kernel
    assert "struct k0_par0_ctx c0_ = {p0_x, 0};" in kernel and parallel_loops(fn)[0].reduces == ("fault0",)
    assert "int fault0 = 0;" in fn and "__atomic_fetch_or(&c_->fault0, fault0, __ATOMIC_RELAXED)" in fn


def test_a_loop_under_preprocessor_branches_keeps_them():
    _, fn = _outline("""
#if defined(__AVX2__)
  {
  }
#else
  #ifdef FOO
  #elif BAR
  {
    OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))
    for (long i1 = 0; i1 < 8; ++i1) p1_y[i1] = 0.0f;
  }
  #endif
#endif
""")
    assert fn.startswith("#if !(defined(__AVX2__)) && !defined(FOO) && (BAR)\n") and fn.endswith("#endif\n")
    assert "for (long i1 = lo_; i1 < hi_; ++i1) {\n    p1_y[i1] = 0.0f;\n  }" in fn


def test_a_region_becomes_its_loops_each_with_the_threads_set_up():
    kernel, fns = _outline("""
  OPFUSE_PRAGMA(omp parallel num_threads(nt))
  {
    const long blk1 = 0;
    float* restrict band2 = ((float*)(scratch + (size_t)OPFUSE_TID() * OPFUSE_SCRATCH_STRIDE + 0));
    OPFUSE_PRAGMA(omp for schedule(static))
    for (long c3 = 0; c3 < 16; ++c3) {
      band2[0] = p0_x[c3 + blk1];
    }
    OPFUSE_PRAGMA(omp for schedule(dynamic, 1))
    for (long q4 = 0; q4 < 4; ++q4) {
      p1_y[q4] = band2[0];
    }
  }
""")
    assert kernel.count("opfuse_parallel(") == 2 and "OPFUSE_DYNAMIC" in kernel and "band2" not in kernel
    first, second = fns.split("struct k0_par1_ctx {")
    for fn in (first, second):  # each function sets up the thread's own band before its pieces
        assert "float* restrict band2 = ((float*)(scratch + (size_t)OPFUSE_TID()" in fn


def test_loops_the_outliner_cannot_read_are_refused():
    with pytest.raises(OutlineError, match="canonical"):
        _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))
  for (int i = 0; i < 8; i++) p1_y[i] = 0.0f;
""")
    with pytest.raises(OutlineError, match="one line"):
        _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) collapse(2) if(nt > 1))
  for (long a1 = 0; a1 < 3; ++a1) for (long b2 = 0; b2 < 5; ++b2) p1_y[a1 * 5 + b2] = 1.0f;
""")


def test_declarations_are_read_as_the_writer_writes_them():
    assert [d.name for d in declarations("const long lo6 = 0, hi7 = f(1, 2);")] == ["lo6", "hi7"]
    assert [d.replica for d in declarations("const long a1 = f(1, g[2]), b2 = 3;")] == [
        "const long a1 = f(1, g[2]);", "const long b2 = 3;"]
    assert [d.replica for d in declarations("const long lo6 = 0, hi7 = 18;")] == ["const long lo6 = 0;",
                                                                                 "const long hi7 = 18;"]
    arr, = declarations("long len7[4];")
    assert arr.member == "long* len7" and arr.copy == "long* const len7 = c_->len7;"
    vec, = declarations("const __m256 u27 = _mm256_set1_ps(t26);")
    assert vec.member == "__m256 u27" and vec.replica is None
    assert declarations("opfuse_ukr(kc, a, b);") == [] and declarations("x = 3;") == []


def test_the_microcontroller_keeps_its_loops_in_place():
    lines = ["  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))",
             "  for (long i = 0; i < 4; ++i) y[i] = 0;"]
    assert strip(lines) == lines[1:]


def test_a_loop_with_a_start_and_a_step_keeps_them():
    kernel, fn = _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))
  for (long b1 = 2; b1 < 11; b1 += 2) p1_y[b1] = 0.0f;
""")
    assert "opfuse_parallel(k0_par0, &c0_, ((((11) - (2)) + 1) / 2), nt, OPFUSE_STATIC);" in kernel
    assert "for (long b1 = (2) + lo_ * 2; b1 < (2) + hi_ * 2; b1 += 2) {" in fn
    assert parallel_loops(fn)[0].heads == ("for (long b1 = 2; b1 < 11; b1 += 2)",)


def test_braced_collapsed_loops_must_be_perfectly_nested():
    kernel, fn = _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) collapse(2) if(nt > 1))
  for (long a1 = 0; a1 < 3; ++a1) {
    for (long b2 = 0; b2 < 5; ++b2) {
      p1_y[a1 * 5 + b2] = 1.0f;
    }
  }
""")
    assert "opfuse_parallel(k0_par0, &c0_, (3) * (5), nt, OPFUSE_STATIC);" in kernel
    info, = parallel_loops(fn)
    assert info.collapse == 2 and info.heads == ("for (long a1 = 0; a1 < 3; ++a1)", "for (long b2 = 0; b2 < 5; ++b2)")
    with pytest.raises(OutlineError, match="perfectly nested"):
        _outline("""
  OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) collapse(2) if(nt > 1))
  for (long a1 = 0; a1 < 3; ++a1) {
    p1_y[a1] = 0.0f;
    for (long b2 = 0; b2 < 5; ++b2) p1_y[a1 * 5 + b2] = 1.0f;
  }
""")


def test_a_loop_inside_a_serial_loop_gets_its_variable_and_the_region_loops_their_bounds():
    kernel, fn = _outline("""
  long n0 = 16;
  for (long b1 = 0; b1 < 2; ++b1) {
    OPFUSE_PRAGMA(omp parallel for num_threads(nt) schedule(static) if(nt > 1))
    for (long i2 = 0; i2 < 8; ++i2) p1_y[b1 * 8 + i2] = 0.0f;
  }
  OPFUSE_PRAGMA(omp parallel num_threads(nt))
  {
    OPFUSE_PRAGMA(omp for schedule(static))
    for (long c3 = 0; c3 < n0; ++c3) {
      p1_y[c3] = 1.0f;
    }
  }
""")
    assert "struct k0_par0_ctx c0_ = {p1_y, b1};" in kernel and "const long b1 = c_->b1;" in fn
    assert "struct k0_par1_ctx c1_ = {p1_y, n0};" in kernel and "long n0 = c_->n0;" in fn


def test_pointers_and_arrays_are_shared_as_pointers():
    p, = declarations("const float* restrict w3 = p0_x + 4;")
    assert p.member == "const float* w3" and p.copy == "const float* restrict w3 = c_->w3;" and p.replica is None
    grid, = declarations("float g5[4][8];")
    assert grid.member == "float (*g5)[8]" and grid.copy == "float (*const g5)[8] = c_->g5;"
    table, = declarations("static const int16_t zero1[7] = {0};")
    assert table.member == "const int16_t* zero1" and table.copy == "const int16_t* const zero1 = c_->zero1;"
    var, = declarations("for (long b1 = 0; b1 < 2; ++b1) {")
    assert (var.name, var.member, var.copy) == ("b1", "long b1", "const long b1 = c_->b1;")
    assert declarations("long x = (3);")[0].replica is None  # not const: copied, not declared again
    assert declarations("const long y = x * 2;")[0].replica == "const long y = x * 2;"
