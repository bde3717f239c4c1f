"""Kernel benchmark: one fused group per model (Conv+Relu, MatMul+Add, depthwise Conv+Relu), each
built by ``opfuse.compile`` and timed next to its yardstick, measured in the same run:

* GEMM-like groups: NumPy (OpenBLAS) sgemm at the same M/N/K (batched over groups), and the
  single-core sgemm peak: a square sgemm (n = 1024) timed interleaved with the shape;
* depthwise convolutions (memory bound): libc ``memcpy`` over a buffer four times the
  last-level cache, bytes counted as read + written, as for the kernel (input, output, weights
  and bias once). glibc copies 128 MiB with ordinary stores (it streams only from its
  non-temporal threshold up, 3/4 of the shared cache it reads from CPUID: 288 MiB on the Zen 5
  host), so the copy reads each destination line before writing it, as the kernel does its
  output lines (measured there: 36 GB/s, an AVX2 loop with ordinary stores 38, with streaming
  stores 48). The kernel is timed twice per round: right after the copy ("cold": its input and
  output come from main memory) and again at once ("warm": in the caches, as a layer's input
  is in a model, where the layer before has just written it). Next to the 128 MB copy, a
  copy of the layer's own size (as many bytes read and written as the layer) is timed right after
  the big one ("same-size copy, cold"): a transfer of a few hundred KB from main memory does not
  reach the streaming rate (dw 512@14's 0.4 MB copied at 6 GB/s, against 21 for 128 MB). And the
  layer's own traffic without its arithmetic is timed right after the big copy on its own
  buffers ("loop": reading the input and writing the output in step, 16 floats written per
  16 x in/out read, ordinary loads and stores; ``traffic_loop``). The cold kernels beat that
  loop (1.2-3x faster on the Zen 5 host, load 8): a plain loop over the same bytes is no floor
  for them. The goal stays the 128 MB copy's bandwidth.
* every shape: a copy of its bytes (input, weights, output) right after the yardstick. For a
  GEMM-like shape, the longer of that copy and its FLOPs at the peak is its cold *floor*: resnet18's
  downsample (0.73 MB) copies in ~0.12 ms after the sgemm (6 GB/s), the g32 layer (0.48 MB) in
  ~0.1 ms, longer than its FLOPs take at the peak (0.08 ms), so 85% of the peak is out of reach
  there with caches as cold as the sgemm leaves them.

    python benchmarks/bench_kernels.py                  # every shape
    python benchmarks/bench_kernels.py --only r18 --repeat 40
    python benchmarks/bench_kernels.py --only conv1 --set conv_direct_vectors=1   # a CodegenOptions variant
    python benchmarks/bench_kernels.py --only r18 --vs windows_mr_max=8   # A/B: a second build, same rounds

Prints achieved GFLOP/s (GB/s for depthwise) and the fraction of the yardstick per shape, and
writes ``benchmarks/results/kernels.json``. Calls are interleaved (opfuse, numpy, opfuse, ...)
so load changes on a shared machine hit both alike; medians are quoted, of this thread's CPU
time by default (``--clock wall`` for elapsed time; both are in the JSON). OpenBLAS runs on
one thread (``OPENBLAS_NUM_THREADS=1`` is set before NumPy loads unless the caller set it), with the
kernels it picks for this CPU: ``OPENBLAS_CORETYPE``, ``OPENBLAS_L2_SIZE`` and ``OPENBLAS_BLOCK_FACTOR``
are removed before NumPy loads (``--keep-blas-env`` keeps them; the JSON's ``meta`` says which).

opfuse's time is the group's kernel, read from its kernel timer (``CodegenOptions(profile=True)``,
the thread's CPU time, or the wall clock with ``--clock wall``) on calls whose outputs are allocated
once (``CompiledModel.prepared``); the whole call from Python (``call_ms`` in the JSON) is reported
next to it. The interleaved 12 MB sgemm leaves the caches cold, and the call's Python path then
cost more than a small kernel: resnet18's 1x1 stride-2 downsample (12.8 MFLOP) took 0.121 ms in its
kernel warm, 0.171 ms after the sgemm, and 0.338 ms for the whole ``run`` after the sgemm (NumPy's
sgemm at the same shape: 0.136 warm, 0.181 after it), which the table used to report as 35% of peak.
"""
from __future__ import annotations

import os
import sys

from opfuse.yardsticks import BLAS_TUNING_ENVS, blas_kernels  # neither loads NumPy

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# OpenBLAS reads its tuning variables once, when NumPy loads it (below): removed before that, it runs the kernels
# and block sizes it picks for this CPU, the machine's sgemm peak every shape is set against. --keep-blas-env keeps
# them (the table then reads against the sgemm they hold).
BLAS_ENV_REMOVED = ({} if "--keep-blas-env" in sys.argv or "numpy" in sys.modules
                    else {k: os.environ.pop(k) for k in BLAS_TUNING_ENVS if k in os.environ})

import argparse  # noqa: E402
import ctypes  # noqa: E402
import ctypes.util  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import numpy as np  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "kernels.json"
PEAK_SIZES = (512, 1024, 2048)
PEAK_N = 1024           # the square sgemm timed next to every GEMM-like shape
COPY_BYTES = 128 << 20  # 4x the 32 MiB L3: the copy streams from and to main memory
GOAL_GEMM = 0.85        # of the sgemm peak
GOAL_DEPTHWISE = 0.80   # of the copy bandwidth


@dataclass(frozen=True)
class Shape:
    name: str
    kind: str                     # conv | depthwise | matmul
    dims: tuple[int, ...]         # conv: C, OC, H, W, k, stride, pad, group; matmul: M, K, N

    def flops(self) -> float:
        if self.kind == "matmul":
            m, k, n = self.dims
            return 2.0 * m * n * k
        c, oc, _, _, k, _, _, g = self.dims
        oh, ow = self.out_hw()
        return 2.0 * oc * oh * ow * (c // g) * k * k

    def out_hw(self) -> tuple[int, int]:
        _, _, h, w, k, s, p, _ = self.dims
        return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1

    def bytes(self) -> float:
        """Main-memory traffic of the layer: input, output, weights and bias once."""
        if self.kind == "matmul":
            m, k, n = self.dims
            return 4.0 * (m * k + k * n + m * n + n)
        c, oc, h, w, k, _, _, g = self.dims
        oh, ow = self.out_hw()
        return 4.0 * (c * h * w + oc * oh * ow + oc * (c // g) * k * k + oc)

    def gemm(self) -> tuple[int, int, int, int]:
        """(batch, M, N, K) of the GEMM this layer is."""
        if self.kind == "matmul":
            m, k, n = self.dims
            return 1, m, n, k
        c, oc, _, _, k, _, _, g = self.dims
        oh, ow = self.out_hw()
        return g, oc // g, oh * ow, (c // g) * k * k


SHAPES = [
    # resnet18 (224x224): stem, the 3x3 layers (231 MFLOP each), the strided ones, 1x1 downsample
    Shape("r18.conv1 7x7/2", "conv", (3, 64, 224, 224, 7, 2, 3, 1)),
    Shape("r18.l1 3x3 64@56", "conv", (64, 64, 56, 56, 3, 1, 1, 1)),
    Shape("r18.l2 3x3/2 64>128", "conv", (64, 128, 56, 56, 3, 2, 1, 1)),
    Shape("r18.l2 3x3 128@28", "conv", (128, 128, 28, 28, 3, 1, 1, 1)),
    Shape("r18.l3 3x3 256@14", "conv", (256, 256, 14, 14, 3, 1, 1, 1)),
    Shape("r18.l4 3x3/2 256>512", "conv", (256, 512, 14, 14, 3, 2, 1, 1)),
    Shape("r18.l4 3x3 512@7", "conv", (512, 512, 7, 7, 3, 1, 1, 1)),
    Shape("r18.ds 1x1/2 128>256", "conv", (128, 256, 28, 28, 1, 2, 0, 1)),
    # 1x1 convolutions (mobilenet_v1's pointwise layers)
    Shape("pw 1x1 64>128@112", "conv", (64, 128, 112, 112, 1, 1, 0, 1)),
    Shape("pw 1x1 128@56", "conv", (128, 128, 56, 56, 1, 1, 0, 1)),
    Shape("pw 1x1 256@28", "conv", (256, 256, 28, 28, 1, 1, 0, 1)),
    Shape("pw 1x1 512@14", "conv", (512, 512, 14, 14, 1, 1, 0, 1)),
    Shape("pw 1x1 1024@7", "conv", (1024, 1024, 7, 7, 1, 1, 0, 1)),
    # grouped
    Shape("grp 3x3 128@28 g4", "conv", (128, 128, 28, 28, 3, 1, 1, 4)),
    Shape("grp 3x3 256@14 g32", "conv", (256, 256, 14, 14, 3, 1, 1, 32)),
    # BERT-base, 128 tokens
    Shape("bert 128x768x768", "matmul", (128, 768, 768)),
    Shape("bert 128x768x3072", "matmul", (128, 768, 3072)),
    Shape("bert 128x3072x768", "matmul", (128, 3072, 768)),
    # depthwise (mobilenet_v1)
    Shape("dw 3x3 32@112", "depthwise", (32, 32, 112, 112, 3, 1, 1, 32)),
    Shape("dw 3x3/2 64@112", "depthwise", (64, 64, 112, 112, 3, 2, 1, 64)),
    Shape("dw 3x3 128@56", "depthwise", (128, 128, 56, 56, 3, 1, 1, 128)),
    Shape("dw 3x3 256@28", "depthwise", (256, 256, 28, 28, 3, 1, 1, 256)),
    Shape("dw 3x3 512@14", "depthwise", (512, 512, 14, 14, 3, 1, 1, 512)),
]


def build_graph(s: Shape):
    from opfuse.ops import GraphBuilder
    rng = np.random.default_rng(0)
    b = GraphBuilder(s.name.split()[0].replace(".", "_"))
    if s.kind == "matmul":
        m, k, n = s.dims
        x = b.input("x", (m, k))
        w = b.const("w", (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32))
        y = b.op("Add", b.op("MatMul", x, w), b.const("bias", rng.standard_normal(n).astype(np.float32)))
        return b.build(y)
    c, oc, h, w_, k, st, p, g = s.dims
    x = b.input("x", (1, c, h, w_))
    wt = b.const("w", (rng.standard_normal((oc, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(oc).astype(np.float32))
    y = b.op("Conv", x, wt, bias, kernel_shape=[k, k], strides=[st, st], pads=[p] * 4, group=g)
    return b.build(b.op("Relu", y))


def numpy_gemm(s: Shape) -> Callable[[], object]:
    nb, m, n, k = s.gemm()
    rng = np.random.default_rng(1)
    a = rng.standard_normal((nb, m, k)).astype(np.float32)
    bm = rng.standard_normal((nb, k, n)).astype(np.float32)
    out = np.empty((nb, m, n), np.float32)
    return lambda: np.matmul(a, bm, out=out)


# The calling thread's CPU time: every contender here runs on this one thread (opfuse with
# threads=1 runs its parallel loops inline; OpenBLAS is limited to one thread), and on a shared
# machine the CPU time does not count the slices another process held the core.
CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def median_s(fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.thread_time) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t0 = clock()
        fn()
        ts.append(clock() - t0)
    return statistics.median(ts)


def sgemm_peak(repeat: int, clock: Callable[[], float]) -> dict:
    rows = {n: 2.0 * n ** 3 / median_s(square_sgemm(n), max(3, repeat // (n // 256)), clock) / 1e9
            for n in PEAK_SIZES}
    return {"gflops_by_n": rows, "peak_gflops": max(rows.values())}


def memcpy_call() -> Callable[[], object]:
    """One ``memcpy`` of ``COPY_BYTES`` (libc's, through ctypes)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    src = np.ones(COPY_BYTES // 4, np.float32)
    dst = np.ones_like(src)
    return lambda: libc.memcpy(dst.ctypes.data, src.ctypes.data, COPY_BYTES)


def same_size_copy(s: "Shape", big: Callable[[], object]) -> Callable[[], object]:
    """A ``memcpy`` of the layer's own traffic (``Shape.bytes``: half read, half written), timed after the
    128 MB copy ``big`` has run (untimed, in the same call): the copy's time is kept in ``.times``."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    n = int(s.bytes()) // 2
    src = np.ones(n // 4, np.float32)
    dst = np.ones_like(src)
    times: list[float] = []

    def call() -> None:
        big()
        c0 = time.perf_counter()
        libc.memcpy(dst.ctypes.data, src.ctypes.data, n)
        times.append(time.perf_counter() - c0)
    call.times = times  # type: ignore[attr-defined]
    call.bytes = 2 * n  # type: ignore[attr-defined]
    return call


TRAFFIC_C = r"""
#include <stddef.h>
#include <string.h>
typedef float v8 __attribute__((vector_size(32)));
/* A depthwise layer's traffic without its arithmetic: ny floats written, nx = r ny read, in step
   (16 floats written after their 16 r inputs are summed); ordinary loads and stores. */
void traffic(float* y, size_t ny, const float* x, size_t nx) {
    size_t r = nx / ny;
    for (size_t j = 0, i = 0; j < ny; j += 16, i += 16 * r) {
        v8 a, b, t;
        memcpy(&a, x + i, 32); memcpy(&b, x + i + 8, 32);
        for (size_t k = 16; k < 16 * r; k += 16) {
            memcpy(&t, x + i + k, 32); a += t;
            memcpy(&t, x + i + k + 8, 32); b += t;
        }
        memcpy(y + j, &a, 32); memcpy(y + j + 8, &b, 32);
    }
}
"""


@functools.cache
def traffic_loop() -> Callable[..., object]:
    """``traffic(y, ny, x, nx)`` (``TRAFFIC_C``) built with ``cc -O2 -march=native`` (once a process); ``ny`` a
    multiple of 16 and of ``nx``'s share: ``nx = r ny``."""
    import subprocess
    import tempfile
    tmp = Path(tempfile.mkdtemp(prefix="opfuse_traffic_"))
    (tmp / "traffic.c").write_text(TRAFFIC_C)
    subprocess.run(["cc", "-O2", "-march=native", "-shared", "-fPIC", "-o", str(tmp / "traffic.so"),
                    str(tmp / "traffic.c")], check=True)
    fn = ctypes.CDLL(str(tmp / "traffic.so")).traffic
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t]
    return fn


def layer_traffic(x: np.ndarray, y: np.ndarray, big: Callable[[], object], clock: Callable[[], float]):
    """A callable that runs ``big`` (the 128 MB copy, untimed) and then the layer's traffic on its own input
    ``x`` and output ``y`` (``traffic_loop``), keeping that time in ``.times``; None where ``y``'s size is no
    multiple of 16 or ``x``'s no multiple of ``y``'s."""
    if y.size % 16 or x.size % y.size:
        return None
    fn = traffic_loop()
    times: list[float] = []

    def call() -> None:
        big()
        c0 = clock()
        fn(y.ctypes.data, y.size, x.ctypes.data, x.size)
        times.append(clock() - c0)
    call.times = times  # type: ignore[attr-defined]
    return call


def copy_gbs(seconds: float) -> float:
    """Copy bandwidth, counting the bytes read and the bytes written."""
    return 2.0 * COPY_BYTES / seconds / 1e9


def square_sgemm(n: int) -> Callable[[], object]:
    rng = np.random.default_rng(n)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out = np.empty((n, n), np.float32)
    return lambda: np.matmul(a, b, out=out)


def interleaved(fns: dict[str, Callable[[], object]], repeat: int, warmup: int) -> dict[str, dict[str, float]]:
    """Median CPU and wall time of each callable, the calls interleaved (a, b, a, b, ...)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, dict[str, list[float]]] = {k: {c: [] for c in CLOCKS} for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            c0, w0 = time.thread_time(), time.perf_counter()
            fn()
            samples[k]["wall"].append(time.perf_counter() - w0)
            samples[k]["cpu"].append(time.thread_time() - c0)
    return {k: {c: statistics.median(v) for c, v in per.items()} for k, per in samples.items()}


def compile_shape(s: Shape, codegen_options, clock: str = "cpu"):
    """``(graph, model)``: the shape built with its kernel timer on (``clock``: "cpu" times the
    kernel in the thread's CPU time, "wall" in elapsed time)."""
    from opfuse.codegen.options import CodegenOptions
    from opfuse.compiler import build_native, plan_model
    graph = build_graph(s)
    options = (codegen_options or CodegenOptions()).with_(
        profile=True, profile_clock="thread_cpu" if clock == "cpu" else "wall")
    return graph, build_native(plan_model(graph), codegen_options=options)


class KernelTimed:
    """A prepared call of ``model`` that keeps its kernels' timer total, per call, in ``ms``."""

    def __init__(self, model, feeds, call=None):
        self.model = model
        self.call, self.outputs = (call, {}) if call is not None else model.prepared(feeds)
        self.ms: list[float] = []
        model.take_profile()  # reset

    def __call__(self) -> None:
        self.call()
        self.ms.append(sum(r["ms"] for r in self.model.take_profile()))


def bench_shape(s: Shape, *, repeat: int, warmup: int, codegen_options, check: bool, yardsticks: dict,
                clock: str, vs_options=None) -> dict:
    """Time ``s`` interleaved with NumPy at its M/N/K and with its yardstick (sgemm at the peak's
    size, or the memcpy), so each fraction compares numbers taken under the same load. With
    ``vs_options``, a second build of ``s`` is timed in the same rounds, each build after a run of the
    yardstick and a same-size copy (the caches as cold for both), for an A/B in one run."""
    from opfuse.runtime import reference
    graph, model = compile_shape(s, codegen_options, clock)
    feeds = reference.random_inputs(graph, 0)
    row: dict = {"name": s.name, "kind": s.kind, "dims": list(s.dims), "kernels": model.report["kernels"]}
    if check:
        want = reference.run(graph, feeds)
        got = model.run(feeds)
        row["max_abs_error"] = float(max(np.max(np.abs(got[k].astype(np.float64) - want[k])) for k in want))
    timed = KernelTimed(model, feeds)  # outputs allocated once: ``run`` would time their page faults too
    fns: dict[str, Callable[[], object]] = {"opfuse": timed}
    warm = KernelTimed(model, feeds, timed.call)
    if s.kind == "depthwise":
        fns["opfuse_warm"] = warm  # right after the cold call: input and output in the caches
        # The loop leaves the layer's buffers in the caches: timed before the copies, not before the cold call.
        loop = layer_traffic(feeds["x"], next(iter(timed.outputs.values())), yardsticks["copy"], CLOCKS[clock])
        if loop is not None:
            fns["loop"] = loop
        fns["copy"] = yardsticks["copy"]
        fns["copy_same"] = same = same_size_copy(s, yardsticks["copy"])
    else:
        fns["numpy"] = numpy_gemm(s)
        fns["peak"] = yardsticks["peak"]
        fns["copy_same"] = same = same_size_copy(s, yardsticks["peak"])
    if vs_options is not None:
        _, vs_model = compile_shape(s, vs_options, clock)
        if check:
            got = vs_model.run(feeds)
            row["vs_max_abs_error"] = float(max(np.max(np.abs(got[k].astype(np.float64) - want[k])) for k in want))
            row["vs_bitwise_equal"] = all(np.array_equal(got[k], model.run(feeds)[k]) for k in want)
        fns["opfuse_vs"] = vs = KernelTimed(vs_model, feeds)
        # The next round's first build then follows the yardstick and a same-size copy, as this one does: with the
        # copy alone after it the first build ran in warmer caches (resnet18-sized 1x1 layers whose two builds' C
        # was the same took 1.14-1.17x as long in the second).
        big = yardsticks["copy" if s.kind == "depthwise" else "peak"]
        fns["yardstick_vs"] = big
        fns["copy_same_vs"] = same_size_copy(s, big)
    medians = interleaved(fns, repeat, warmup)
    t = {k: m[clock] for k, m in medians.items()}
    row["call_ms"] = t["opfuse"] * 1e3  # the whole call from Python
    t["opfuse"] = statistics.median(timed.ms[-repeat:]) / 1e3  # its kernels
    if "opfuse_warm" in t:
        t["opfuse_warm"] = statistics.median(warm.ms[-repeat:]) / 1e3
    row["clock"] = clock
    row["wall_ms"] = {k: m["wall"] * 1e3 for k, m in medians.items()}
    row["opfuse_ms"] = t["opfuse"] * 1e3
    row["gflops"] = s.flops() / t["opfuse"] / 1e9
    if vs_options is not None:
        row["vs_ms"] = statistics.median(vs.ms[-repeat:])
        row["vs_ratio"] = row["vs_ms"] / row["opfuse_ms"]  # the --vs build's time over the --set build's
    if s.kind == "depthwise":
        row["gbs"] = s.bytes() / t["opfuse"] / 1e9
        row["copy_gbs"] = copy_gbs(t["copy"])
        row["fraction"] = row["gbs"] / row["copy_gbs"]
        row["warm_ms"] = t["opfuse_warm"] * 1e3
        row["warm_gbs"] = s.bytes() / t["opfuse_warm"] / 1e9
        row["warm_fraction"] = row["warm_gbs"] / row["copy_gbs"]
        row["same_copy_gbs"] = same.bytes / statistics.median(same.times[-repeat:]) / 1e9  # type: ignore[attr-defined]
        row["same_copy_fraction"] = row["gbs"] / row["same_copy_gbs"]
        if "loop" in fns:  # the layer's own traffic on its own buffers, right after the copy
            row["loop_ms"] = statistics.median(fns["loop"].times[-repeat:]) * 1e3  # type: ignore[attr-defined]
            row["loop_fraction"] = row["loop_ms"] / row["opfuse_ms"]
        row["goal"] = GOAL_DEPTHWISE
    else:
        row["numpy_ms"] = t["numpy"] * 1e3
        row["numpy_gflops"] = s.flops() / t["numpy"] / 1e9
        row["peak_gflops"] = 2.0 * PEAK_N ** 3 / t["peak"] / 1e9
        row["fraction"] = row["gflops"] / row["peak_gflops"]
        row["vs_numpy"] = t["numpy"] / t["opfuse"]
        # The cold floor: the FLOPs at the peak, or the layer's bytes copied after the sgemm, whichever is longer.
        row["same_copy_ms"] = statistics.median(same.times[-repeat:]) * 1e3  # type: ignore[attr-defined]
        row["floor_ms"] = max(s.flops() / row["peak_gflops"] / 1e6, row["same_copy_ms"])
        row["floor_fraction"] = row["floor_ms"] / row["opfuse_ms"]
        row["goal"] = GOAL_GEMM
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'shape':24s} {'MFLOP':>7s} {'ms':>7s} {'call':>7s} {'GFLOP/s':>8s} {'GB/s':>6s} {'np GF/s':>8s} "
            f"{'yardstick':>10s} {'%':>6s} {'goal':>5s}  {'warm ms':>7s} {'GB/s':>6s} {'%':>6s}  "
            f"{'same':>5s} {'%':>6s}  {'floor':>6s} {'%':>6s}  (depthwise: loop ms, %)")
    clock = rows[0]["clock"] if rows else "cpu"
    lines = [f"yardstick: sgemm n={PEAK_N} (GFLOP/s, 1 thread), or for depthwise the memcpy bandwidth (GB/s), "
             f"timed interleaved with each shape; medians of {clock} time; opfuse's ms: its kernels' timers "
             f"(call: the whole call from Python); depthwise cold (right after the copy) and warm (again at once, "
             f"in the caches); same: a copy of the layer's own bytes right after the 128 MB copy (GB/s) and the "
             f"cold kernel's share of it; floor (GEMM-like): the FLOPs at the sgemm peak or a copy of the layer's "
             f"bytes right after the sgemm (ms), whichever is longer, and its share of the kernel's time; "
             f"loop (depthwise): the layer's own traffic as a plain loop on its own buffers right after the 128 MB "
             f"copy (ms), and its time over the cold kernel's",
             head, "-" * len(head)]
    for r in rows:
        s = next(x for x in SHAPES if x.name == r["name"])
        gbs = f"{r['gbs']:6.1f}" if "gbs" in r else f"{'':6s}"
        npg = f"{r['numpy_gflops']:8.1f}" if "numpy_gflops" in r else f"{'':8s}"
        yard = r.get("peak_gflops", r.get("copy_gbs"))
        ok = "ok" if r["fraction"] >= r["goal"] else "BELOW"
        floor = f"  {r['loop_ms']:6.3f} {100 * r['loop_fraction']:5.1f}%" if "loop_ms" in r else ""
        warm = (f"  {r['warm_ms']:7.3f} {r['warm_gbs']:6.1f} {100 * r['warm_fraction']:5.1f}%"
                f"  {r['same_copy_gbs']:5.1f} {100 * r['same_copy_fraction']:5.1f}%"
                if "warm_ms" in r else f"{'':42s}") + floor
        vs = (f"  vs: {r['vs_ms']:7.3f} ms {r['vs_ratio']:5.3f}x"
              f"{' bitwise equal' if r.get('vs_bitwise_equal') else ''}" if "vs_ms" in r else "")
        lines.append(f"{r['name']:24s} {s.flops() / 1e6:7.1f} {r['opfuse_ms']:7.3f} {r['call_ms']:7.3f} "
                     f"{r['gflops']:8.1f} {gbs} {npg} "
                     f"{yard:10.1f} {100 * r['fraction']:5.1f}% {ok:>5s}{warm}{vs}")
    return "\n".join(lines)


def codegen_options(settings: list[str]):
    """``CodegenOptions`` with the ``FIELD=VALUE`` settings (None: the defaults)."""
    from opfuse.codegen.options import CodegenOptions
    if not settings:
        return None
    kw: dict[str, object] = {}
    for item in settings:
        key, _, text = item.partition("=")
        value: object = text
        if text.lower() in ("true", "false"):
            value = text.lower() == "true"
        elif text.lstrip("-").isdigit():
            value = int(text)
        kw[key] = value
    return CodegenOptions(**kw)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=[], help="substrings of shape names to run")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--no-check", action="store_true", help="skip the comparison against the reference")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                    help="cpu: this thread's CPU time (robust on a shared machine); wall: elapsed time")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--keep-blas-env", action="store_true",
                    help=f"keep {', '.join(BLAS_TUNING_ENVS)} (by default removed before NumPy loads)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="CodegenOptions fields for every shape (ints, true/false or text), e.g. gemm_mr=12")
    ap.add_argument("--vs", nargs="*", default=None, metavar="FIELD=VALUE",
                    help="a second build of every shape with these CodegenOptions fields (none: the defaults), "
                         "timed in the same rounds: its ms and its time over the --set build's (vs_ratio)")
    args = ap.parse_args(argv)
    if BLAS_ENV_REMOVED:
        print("OpenBLAS choosing its own kernels: removed " + ", ".join(f"{k}={v}" for k, v in BLAS_ENV_REMOVED.items())
              + " before NumPy loaded (--keep-blas-env keeps them)", file=sys.stderr)
    for var in BLAS_TUNING_ENVS:
        if var in os.environ:
            print(f"warning: {var}={os.environ[var]} is set (--keep-blas-env, or NumPy was loaded before this script) "
                  f"and may slow NumPy's sgemm, the yardstick", file=sys.stderr)
    options = codegen_options(args.set)
    vs_options = None
    if args.vs is not None:
        from opfuse.codegen.options import CodegenOptions
        vs_options = codegen_options(args.vs) or CodegenOptions()
    shapes = [s for s in SHAPES if not args.only or any(o in s.name for o in args.only)]
    peak = sgemm_peak(args.repeat, CLOCKS[args.clock])
    yardsticks = {"peak": square_sgemm(PEAK_N), "copy": memcpy_call()}
    rows = []
    for s in shapes:
        rows.append(bench_shape(s, repeat=args.repeat, warmup=args.warmup, codegen_options=options,
                                check=not args.no_check, yardsticks=yardsticks, clock=args.clock,
                                vs_options=vs_options))
        print(f"{s.name}: {rows[-1]['opfuse_ms']:.3f} ms", file=sys.stderr)
    meta = {"host": os.uname().nodename, "codegen_options": args.set, "vs_codegen_options": args.vs,
            "cpus": os.cpu_count(), "repeat": args.repeat,
            "clock": args.clock,
            "load_average": list(os.getloadavg()), "opfuse_time": "kernel timers",
            "sgemm": peak, "peak_n": PEAK_N, "copy_bytes": COPY_BYTES,
            "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"), "blas": blas_kernels(),
            "blas_env_removed": BLAS_ENV_REMOVED, "blas_env_kept": {k: os.environ[k] for k in BLAS_TUNING_ENVS
                                                                    if k in os.environ}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "shapes": rows}, indent=1, sort_keys=True))
    print("square sgemm, 1 thread: " + ", ".join(f"n={n} {g:.1f}" for n, g in peak["gflops_by_n"].items())
          + " GFLOP/s")
    print(table(rows))
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"\nwritten {args.out}")
    return rows


if __name__ == "__main__":
    main()
