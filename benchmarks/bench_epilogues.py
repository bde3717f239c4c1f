"""Epilogue benchmark: is a fused elementwise epilogue ever slower than the same ops unfused?

    python benchmarks/bench_epilogues.py                  # every case, 1 thread
    python benchmarks/bench_epilogues.py --repeat 31 Sigmoid chain8

Cases:

* ``Conv 1x1 (32 -> 64 channels, 1x32x200x152) -> ACT`` for each activation in ``ACTIVATIONS``;
* ``chain8``: eight elementwise ops on 16M floats (``CHAIN_OPS``, one of them a Sigmoid);
* ``chain8_arith``: the same chain without a transcendental op (``ARITH_CHAIN_OPS``).

Each case is built twice from the same rewritten graph: ``fused`` is the rules' maximal grouping
(one kernel), ``unfused`` one kernel per op. The table gives their median times, the ratio
fused/unfused (the goal: <= 1), the planner's predictions for both and whether the planner
(``opfuse compile``'s choice) fuses, and the achieved bandwidth: boundary bytes of the kernel
(inputs, weights, outputs) over its time, next to a memcpy of 64 MiB measured in the same run,
interleaved with the kernels (bytes read + bytes written).

Timing: outputs are allocated once (``CompiledModel.prepared``), so page faults on fresh output
arrays are not timed; the contenders (memcpy, fused, unfused) are called in turn, each right after an
untimed 64 MiB copy (so each starts from cold caches; before, the unfused build ran right after the
fused one and found the Conv's input in the cache), ``--repeat`` rounds, and medians are reported,
of wall time and of the thread's CPU time (the builds run on one thread; on a shared machine the CPU
time leaves out the waits for the core). Writes
``benchmarks/results/epilogues.json``.

For the chain cases, a second table states the bound on fused/unfused, measured (``chain_bound``): the
fused kernel's compute floor (the same kernel over data in cache), the memcpy, a copy with streaming stores
(``stream_copy``) and an in-place stream of the chain's bytes, and the unfused time; the fused kernel cannot
beat the larger of its compute floor and its stream (the faster copy when it writes a fresh graph output, the
in-place stream when it stores over an input that dies, as inside a model). The fused chain kernels are
explicit AVX-512 intrinsics (``codegen/simdchain.py``) storing their fresh 64 MiB output with non-temporal
stores (``CodegenOptions.stream_store_min_bytes``); the table also gives the compute floor of the C loop gcc
vectorises (``simd_elementwise=False``), the path before them.

With Relu among the cases, a last table gives each activation's epilogue cost as a multiple of the stream fusing
saves, measured in the same run (CPU time): (its fused time - Relu's fused time) / (Relu's unfused - fused time),
next to ``opfuse.ops.elementwise.EPILOGUE_STREAM_RATIO``, the price the cost model gives it on a compute-bound anchor
(``epilogue_ratios``; the JSON's ``epilogue_stream_ratios``), and the same for its own kernel in the unfused build
(``alone``: (its unfused time - Relu's fused time) / the same stream; the JSON's ``standalone_stream_ratios``), which
the cost model prices at the same ratio, at least its stream.

``--op-counts`` counts, instead of timing, the vector instructions of each op's one-op kernel
loop (``objdump``, one vector per iteration: ``CodegenOptions.simd_unroll=1``; less what an Add's loop has
beyond its one add): what
``opfuse.ops.elementwise.OPS_PER_ELEMENT`` holds, unaffected by the machine's load.

``--op-costs`` also measures what each elementwise op costs per element as the C backend
emits it: a one-op kernel over ``OP_COST_ELEMENTS`` floats (in cache, so compute-bound) run
``OP_COST_CALLS`` times from C, best of ``OP_COST_TRIALS`` (thread CPU time); printed as ns per element and as
*operations per element*, ns x the host profile's float32 peak (what the cost model's
``flops_per_element`` means: the op then costs ``elements x ops / peak`` seconds).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from opfuse.compiler import CompileOptions, plan_model
from opfuse.cost.model import CostModel
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference
from opfuse.runtime.native import build
from opfuse.targets import get_profile

RESULTS = Path(__file__).resolve().parent / "results" / "epilogues.json"
CONV_INPUT = (1, 32, 200, 152)
CONV_OUT_CHANNELS = 64
ACTIVATIONS = ("Relu", "HardSwish", "Sigmoid", "Silu", "Tanh", "Gelu", "GeluTanh", "Softplus")
CHAIN_ELEMENTS = 16 * 1024 * 1024
CHAIN_OPS = ("Mul", "Add", "Relu", "Sub", "Sigmoid", "Mul", "Clip", "Add")
ARITH_CHAIN_OPS = ("Mul", "Add", "Relu", "Sub", "LeakyRelu", "Mul", "Clip", "HardSwish")
COPY_BYTES = 64 * 1024 * 1024
OP_COST_OPS = (("Add", {}), ("Relu", {}), ("LeakyRelu", {}), ("HardSigmoid", {}), ("HardSwish", {}), ("Exp", {}),
               ("Log", {}), ("Tanh", {}), ("Sigmoid", {}), ("Silu", {}), ("Softplus", {}), ("Erf", {}), ("Gelu", {}),
               ("Gelu", {"approximate": "tanh"}), ("Elu", {}), ("Selu", {}), ("Celu", {}), ("Mish", {}), ("Sqrt", {}),
               ("Reciprocal", {}))
OP_COST_ELEMENTS = 16384  # 64 KiB in, 64 KiB out: in L2, so the loop is compute-bound
OP_COST_CALLS = 2000
OP_COST_TRIALS = 15
DEFAULT_REPEAT = 21
DEFAULT_WARMUP = 2


def conv_graph(act: str) -> Graph:
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"conv_{act.lower()}")
    x = b.input("x", CONV_INPUT)
    w = b.const("w", (rng.standard_normal((CONV_OUT_CHANNELS, CONV_INPUT[1], 1, 1)) * 0.3).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(CONV_OUT_CHANNELS).astype(np.float32))
    y = b.op("Conv", x, w, bias, name="conv")
    if act == "GeluTanh":
        y = b.op("Gelu", y, name="act", approximate="tanh")
    else:
        y = b.op(act, y, name="act")
    return b.build(y)


def chain_graph(elements: int = CHAIN_ELEMENTS) -> Graph:
    """x*0.5 + 0.25 -> Relu -> - 1 -> Sigmoid -> *x -> Clip(-2, 2) -> + 0.125: each op reads the
    previous result (and once ``x`` again), so the unfused build streams 16M floats eight times."""
    b = GraphBuilder("chain8")
    x = b.input("x", (elements,))

    def c(name: str, v: float):
        return b.const(name, np.float32(v))
    y = b.op("Mul", x, c("half", 0.5))
    y = b.op("Add", y, c("quarter", 0.25))
    y = b.op("Relu", y)
    y = b.op("Sub", y, c("one", 1.0))
    y = b.op("Sigmoid", y)
    y = b.op("Mul", y, x)
    y = b.op("Clip", y, c("lo", -2.0), c("hi", 2.0))
    y = b.op("Add", y, c("eighth", 0.125))
    g = b.build(y)
    assert tuple(n.op_type for n in g.nodes) == CHAIN_OPS
    return g


def arith_chain_graph(elements: int = CHAIN_ELEMENTS) -> Graph:
    """``chain8`` with its Sigmoid swapped for LeakyRelu and its last Add for HardSwish: no
    transcendental op, so the fused kernel can stream at memory speed (exp alone costs about
    0.5 ns per element here, more than a 16M-float copy's 0.35 ns)."""
    b = GraphBuilder("chain8_arith")
    x = b.input("x", (elements,))

    def c(name: str, v: float):
        return b.const(name, np.float32(v))
    y = b.op("Mul", x, c("half", 0.5))
    y = b.op("Add", y, c("quarter", 0.25))
    y = b.op("Relu", y)
    y = b.op("Sub", y, c("one", 1.0))
    y = b.op("LeakyRelu", y, alpha=0.1)
    y = b.op("Mul", y, x)
    y = b.op("Clip", y, c("lo", -2.0), c("hi", 2.0))
    y = b.op("HardSwish", y)
    g = b.build(y)
    assert tuple(n.op_type for n in g.nodes) == ARITH_CHAIN_OPS
    return g


def boundary_bytes(graph: Graph) -> int:
    """Bytes a one-kernel build must move: graph inputs and constants read, outputs written."""
    return sum(v.nbytes for v in [*graph.inputs, *graph.constants, *graph.outputs])


def predicted_s(graph: Graph, plan: FusionPlan) -> float:
    cm = CostModel(get_profile("host"))
    return sum(cm.group_cost(graph, g).latency_s for g in plan.groups)


def time_interleaved(fns: dict[str, Callable[[], object]], repeat: int, warmup: int,
                     flush: Callable[[], object] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Median wall seconds and median CPU seconds (this thread: every contender runs on one) per
    callable, the calls interleaved round by round, each after ``flush`` (untimed) where given. On the
    shared host the wall clock counts the time other processes held the core; the CPU time does not."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            if flush is not None:
                flush()
            c0, t0 = time.thread_time(), time.perf_counter()
            fn()
            t1, c1 = time.perf_counter(), time.thread_time()
            wall[k].append(t1 - t0)
            cpu[k].append(c1 - c0)
    return ({k: statistics.median(v) for k, v in wall.items()}, {k: statistics.median(v) for k, v in cpu.items()})


def bench_case(name: str, graph: Graph, copy: Callable[[], None], *, repeat: int, warmup: int,
               cache_dir) -> dict:
    fused_comp = plan_model(graph, CompileOptions(planner="rules"))
    g = fused_comp.graph
    plans = {"fused": fused_comp.plan, "unfused": FusionPlan.unfused(g)}
    chosen = plan_model(graph, CompileOptions()).plan
    feeds = reference.random_inputs(g, 0)
    want = reference.run(g, feeds)
    calls: dict[str, Callable[[], object]] = {"memcpy": copy}
    row: dict = {"case": name, "ops": [n.op_type for n in g.nodes], "planner_fuses": len(chosen.groups) == 1}
    for label, plan in plans.items():
        model = build(g, plan, cache_dir=cache_dir, threads=1)  # the default would be every core
        call, outs = model.prepared(feeds)
        err = max(float(np.max(np.abs(outs[k].astype(np.float64) - want[k]) / (1.0 + np.abs(want[k]))))
                  for k in want)
        calls[label] = call
        row[label] = {"kernels": len(plan.groups), "predicted_ms": predicted_s(g, plan) * 1e3,
                      "max_rel_error": err}
    # Every contender after a 64 MiB copy: each starts with its model's data out of the caches. (Called in turn
    # after the memcpy alone, the unfused build found the Conv's input where the fused one had just read it.)
    t, c = time_interleaved(calls, repeat, warmup, flush=copy)
    nbytes = boundary_bytes(g)
    row["bytes"] = nbytes
    row["memcpy_gbs"] = 2 * COPY_BYTES / t["memcpy"] / 1e9
    row["memcpy_cpu_gbs"] = 2 * COPY_BYTES / c["memcpy"] / 1e9
    for label in plans:
        row[label]["median_ms"] = t[label] * 1e3
        row[label]["cpu_median_ms"] = c[label] * 1e3
        row[label]["gbs"] = nbytes / t[label] / 1e9
        row[label]["cpu_gbs"] = nbytes / c[label] / 1e9
    row["fused_over_unfused"] = t["fused"] / t["unfused"]
    row["fused_of_copy_bandwidth"] = row["fused"]["gbs"] / row["memcpy_gbs"]
    row["cpu_fused_over_unfused"] = c["fused"] / c["unfused"]
    row["cpu_fused_of_copy_bandwidth"] = row["fused"]["cpu_gbs"] / row["memcpy_cpu_gbs"]
    return row


_TIMER_C = """
#include <time.h>
double opfuse_bench_seconds_per_call(void* const* ins, void* const* outs, char* arena, char* scratch,
                                     long calls, int trials) {
  double best = 1e30;
  for (int t = 0; t < trials; ++t) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long c = 0; c < calls; ++c) opfuse_run(ins, outs, arena, 0, scratch, 1);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    const double s = ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec)) / (double)calls;
    best = s < best ? s : best;
  }
  return best;
}
"""


def op_cost(op: str, attrs: dict, tc, workdir: Path) -> float:
    """Seconds per element of ``op`` alone (``Add`` as ``x + x``), timed in C (see ``--op-costs``)."""
    b = GraphBuilder(f"cost_{op.lower()}")
    x = b.input("x", (OP_COST_ELEMENTS,))
    g = b.build(b.op(op, x, x) if op == "Add" else b.op(op, x, **attrs))
    name = f"{op}{'_' + attrs['approximate'] if attrs else ''}"
    return kernel_cost(g, FusionPlan.unfused(g), name, tc, workdir, positive=op in ("Log", "Sqrt"))


def kernel_cost(g: Graph, plan: FusionPlan, name: str, tc, workdir: Path, *, positive: bool = False,
                options=None) -> float:
    """Seconds per element of ``g`` (one float input and output of ``OP_COST_ELEMENTS``, in cache) built
    with ``plan`` (and codegen ``options``: the defaults where None), called ``OP_COST_CALLS`` times from C, best
    of ``OP_COST_TRIALS``."""
    import ctypes
    import subprocess

    from opfuse.codegen import generate
    prog = generate(g, plan, options=options)
    src = workdir / f"{name}.c"
    src.write_text("#define _POSIX_C_SOURCE 199309L\n" + prog.source + _TIMER_C)
    lib = workdir / f"{name}.so"
    subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
    dll = ctypes.CDLL(str(lib))
    fn = dll.opfuse_bench_seconds_per_call
    fn.restype = ctypes.c_double
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    xs = (np.random.default_rng(0).standard_normal(OP_COST_ELEMENTS) * 3).astype(np.float32)
    if positive:
        xs = np.abs(xs) + np.float32(0.1)
    ys = np.empty_like(xs)
    arena = np.zeros(max(prog.arena_bytes, 64), np.uint8)
    scratch = np.zeros(max(prog.scratch_stride, 64), np.uint8)
    ins = (ctypes.c_void_p * 1)(xs.ctypes.data)
    outs = (ctypes.c_void_p * 1)(ys.ctypes.data)
    return fn(ins, outs, arena.ctypes.data, scratch.ctypes.data, OP_COST_CALLS, OP_COST_TRIALS) / OP_COST_ELEMENTS


COUNT_OPS = (("Add", {}), ("HardSigmoid", {}), ("HardSwish", {}), ("Exp", {}), ("Log", {}), ("Sigmoid", {}),
             ("Silu", {}), ("Tanh", {}), ("Erf", {}), ("Gelu", {}), ("Gelu", {"approximate": "tanh"}),
             ("Softplus", {}), ("Elu", {}), ("Selu", {}), ("Celu", {}), ("Mish", {}))


def _first_vector_loop(objdump: str) -> int:
    """Instructions of the first backward-jumping loop that uses ymm/zmm registers in ``opfuse_run``
    or a kernel function (the one-op kernel's vectorised main loop)."""
    import re
    funcs: dict[str, list[tuple[int, str, str]]] = {}
    cur = None
    for line in objdump.splitlines():
        m = re.match(r"^[0-9a-f]+ <([\w.]+)>:", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and cur:
            funcs[cur].append((int(m.group(1), 16), m.group(2), m.group(3)))
    for name, ins in funcs.items():
        if not (name.startswith("opfuse_run") or name.startswith("k0_")):
            continue
        for at, op, arg in ins:
            t = re.match(r"([0-9a-f]+)", arg) if op.startswith("j") else None
            if t and int(t.group(1), 16) < at:
                body = [x for x in ins if int(t.group(1), 16) <= x[0] <= at]
                if any("ymm" in x[2] or "zmm" in x[2] for x in body):
                    return len(body)
    raise RuntimeError("no vectorised loop found")


def op_counts() -> list[dict]:
    """Vector instructions per element of each op in ``COUNT_OPS`` (see ``--op-counts``)."""
    import subprocess
    import tempfile

    from opfuse.codegen import CodegenOptions, generate
    from opfuse.runtime.toolchain import Toolchain
    tc = Toolchain.detect(threads=False)
    loops = {}
    with tempfile.TemporaryDirectory(prefix="opfuse-opcount-") as d:
        for op, attrs in COUNT_OPS:
            b = GraphBuilder(f"count_{op.lower()}")
            x = b.input("x", (OP_COST_ELEMENTS,))
            g = b.build(b.op(op, x, x) if op == "Add" else b.op(op, x, **attrs))
            name = op + (f"({attrs['approximate']})" if attrs else "")
            src, lib = Path(d) / "k.c", Path(d) / "k.so"
            src.write_text(generate(g, FusionPlan.unfused(g), options=CodegenOptions(simd_unroll=1)).source)
            subprocess.run([tc.cc, *tc.flags, "-o", str(lib), str(src), "-lm"], check=True, capture_output=True)
            dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], check=True, capture_output=True,
                                  text=True).stdout
            loops[name] = _first_vector_loop(dump)
    base = loops["Add"] - 1
    return [{"op": k, "loop_instructions": v, "ops_per_element": v - base} for k, v in loops.items()]


def op_costs() -> list[dict]:
    import tempfile

    from opfuse.runtime.toolchain import Toolchain
    tc = Toolchain.detect(threads=False)
    peak = get_profile("host").peak_for("float32")
    rows = []
    with tempfile.TemporaryDirectory(prefix="opfuse-opcost-") as d:
        for op, attrs in OP_COST_OPS:
            s = op_cost(op, attrs, tc, Path(d))
            rows.append({"op": op + (f"({attrs['approximate']})" if attrs else ""), "ns_per_element": s * 1e9,
                         "ops_per_element": s * peak, "peak_flops": peak})
    return rows


def stream_copy(cache_dir) -> Callable[[], object]:
    """A one-op kernel (Neg) over ``COPY_BYTES`` of floats into a fresh output, as opfuse builds it: the copy
    with the fused chain kernels' streaming stores (``CodegenOptions.stream_store_min_bytes``), whose stream
    moves each byte once where glibc's memcpy, on this host, is slower."""
    b = GraphBuilder("stream_copy")
    g = b.build(b.op("Neg", b.input("x", (COPY_BYTES // 4,))))
    model = build(g, FusionPlan.unfused(g), cache_dir=cache_dir, threads=1)
    return model.prepared({"x": np.ones(COPY_BYTES // 4, np.float32)})[0]


def chain_bound(case: str, row: dict, inplace_copy_s: float, stream_copy_s: float) -> dict:
    """What limits a chain case's fused kernel, measured: its compute floor (the same fused kernel over
    ``OP_COST_ELEMENTS`` floats, in cache, so no memory traffic counts; per element times the chain's
    elements), the memcpy of the run (a fresh destination: what a kernel writing a graph output moves)
    and an in-place stream (``x = x * 0.5`` over 64 MiB: what a kernel storing over an input that dies
    moves) and a copy with streaming stores (``stream_copy``: what the fused kernel, which streams its fresh
    output, moves). The fused kernel takes at least the larger of its compute floor and its stream, so
    fused/unfused is bounded below by that over the unfused time."""
    import tempfile

    from opfuse.codegen import CodegenOptions
    from opfuse.runtime.toolchain import Toolchain
    graphs = {"chain8": chain_graph, "chain8_arith": arith_chain_graph}
    g = plan_model(graphs[case](OP_COST_ELEMENTS), CompileOptions(planner="rules"))
    with tempfile.TemporaryDirectory(prefix="opfuse-bound-") as d:
        tc = Toolchain.detect(threads=False)
        per_element = kernel_cost(g.graph, g.plan, case, tc, Path(d))
        compiler_loop = kernel_cost(g.graph, g.plan, f"{case}_c", tc, Path(d),
                                    options=CodegenOptions(simd_elementwise=False))
    compute_s = per_element * CHAIN_ELEMENTS
    scale = CHAIN_ELEMENTS * 4 / COPY_BYTES  # the chain's bytes over the yardsticks' (1 as set)
    copy_s = 2 * COPY_BYTES / (row["memcpy_cpu_gbs"] * 1e9) * scale
    stream_s = inplace_copy_s * scale
    nt_s = stream_copy_s * scale
    unfused_s = row["unfused"]["cpu_median_ms"] / 1e3
    return {"compute_floor_ms": compute_s * 1e3, "compiler_loop_floor_ms": compiler_loop * CHAIN_ELEMENTS * 1e3,
            "copy_ms": copy_s * 1e3, "stream_copy_ms": nt_s * 1e3, "inplace_stream_ms": stream_s * 1e3,
            "unfused_ms": unfused_s * 1e3, "best_fused_over_unfused": max(compute_s, min(copy_s, nt_s)) / unfused_s,
            "best_inplace_fused_over_unfused": max(compute_s, stream_s) / unfused_s}


def bound_table(bounds: dict[str, dict]) -> str:
    lines = [f"{'case':13s} {'compute floor':>13s} {'C loop':>7s} {'memcpy':>7s} {'streamed':>8s} {'in place':>8s} "
             f"{'unfused':>8s} {'best f/u':>8s} {'in place':>8s}   (ms, CPU time; best f/u = max(floor, the faster "
             f"copy) / unfused; C loop: the floor of gcc's loop, simd_elementwise=False; streamed: stream_copy)"]
    lines += [f"{k:13s} {b['compute_floor_ms']:13.2f} {b['compiler_loop_floor_ms']:7.2f} {b['copy_ms']:7.2f} "
              f"{b['stream_copy_ms']:8.2f} {b['inplace_stream_ms']:8.2f} "
              f"{b['unfused_ms']:8.2f} {b['best_fused_over_unfused']:8.2f} {b['best_inplace_fused_over_unfused']:8.2f}"
              for k, b in bounds.items()]
    return "\n".join(lines)


def epilogue_ratios(rows: list[dict], build: str = "fused") -> dict[str, float]:
    """Each Conv + activation case's (``build`` - Conv + Relu fused) / (Conv + Relu unfused - fused), CPU time: the
    activation's cost over the stream that fusing saves, in its epilogue (``build="fused"``) or in its own kernel
    (``"unfused"``: the cost model prices that kernel at ``max(1, EPILOGUE_STREAM_RATIO)`` streams); empty without a
    Relu case."""
    relu = next((r for r in rows if r["case"] == "Relu"), None)
    if relu is None:
        return {}
    base, stream = relu["fused"]["cpu_median_ms"], relu["unfused"]["cpu_median_ms"] - relu["fused"]["cpu_median_ms"]
    return {r["case"]: (r[build]["cpu_median_ms"] - base) / stream for r in rows
            if r["case"] in ACTIVATIONS and r["case"] != "Relu"}


def epilogue_ratio_table(ratios: dict[str, float], alone: dict[str, float]) -> str:
    from opfuse.ops.elementwise import EPILOGUE_STREAM_RATIO
    lines = [f"{'case':10s} {'measured':>9s} {'alone':>6s} {'priced':>7s}   "
             "(epilogue / stream it saves; alone: the activation's own kernel, the same way; priced: "
             "EPILOGUE_STREAM_RATIO)"]
    lines += [f"{k:10s} {v:9.2f} {alone.get(k, float('nan')):6.2f} {EPILOGUE_STREAM_RATIO.get(k, float('nan')):7.2f}"
              for k, v in ratios.items()]
    return "\n".join(lines)


def op_cost_table(rows: list[dict]) -> str:
    lines = [f"{'op':16s} {'ns/elem':>8s} {'ops/elem':>9s}   (ops = ns x {rows[0]['peak_flops'] / 1e9:.1f} GFLOP/s)"]
    lines += [f"{r['op']:16s} {r['ns_per_element']:8.3f} {r['ops_per_element']:9.1f}" for r in rows]
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = (f"{'case':10s} {'fused ms':>9s} {'unfused ms':>10s} {'f/u':>6s} {'pred f':>8s} {'pred u':>8s} "
            f"{'plan':>5s} {'fused GB/s':>10s} {'memcpy GB/s':>11s} {'of copy':>8s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        f, u = r["fused"], r["unfused"]
        lines.append(f"{r['case']:10s} {f['median_ms']:9.2f} {u['median_ms']:10.2f} {r['fused_over_unfused']:6.2f} "
                     f"{f['predicted_ms']:8.2f} {u['predicted_ms']:8.2f} "
                     f"{'fuse' if r['planner_fuses'] else 'split':>5s} {f['gbs']:10.1f} {r['memcpy_gbs']:11.1f} "
                     f"{r['fused_of_copy_bandwidth']:7.0%}")
    lines += ["", "CPU time (this thread; what the runs cost, waits for the core left out):",
              f"{'case':10s} {'fused ms':>9s} {'unfused ms':>10s} {'f/u':>6s} {'fused GB/s':>10s} {'memcpy GB/s':>11s} "
              f"{'of copy':>8s}"]
    for r in rows:
        f, u = r["fused"], r["unfused"]
        lines.append(f"{r['case']:10s} {f['cpu_median_ms']:9.2f} {u['cpu_median_ms']:10.2f} "
                     f"{r['cpu_fused_over_unfused']:6.2f} {f['cpu_gbs']:10.1f} {r['memcpy_cpu_gbs']:11.1f} "
                     f"{r['cpu_fused_of_copy_bandwidth']:7.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=[*ACTIVATIONS, "chain8", "chain8_arith"])
    ap.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    ap.add_argument("--cache-dir", default=os.environ.get("OPFUSE_CACHE_DIR"))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--op-costs", action="store_true", help="also measure each op's cost per element")
    ap.add_argument("--op-counts", action="store_true",
                    help="only count each op's vector instructions per element (objdump) and print them")
    args = ap.parse_args(argv)
    if args.op_counts:
        for r in op_counts():
            print(f"{r['op']:16s} {r['ops_per_element']:5d}")
        return []
    src = np.ones(COPY_BYTES // 4, np.float32)
    dst = np.zeros_like(src)

    def copy() -> None:
        np.copyto(dst, src)

    def inplace() -> None:
        np.multiply(dst, np.float32(0.5), out=dst)
    rows = []
    for case in args.cases:
        chains = {"chain8": chain_graph, "chain8_arith": arith_chain_graph}
        graph = chains[case]() if case in chains else conv_graph(case)
        rows.append(bench_case(case, graph, copy, repeat=args.repeat, warmup=args.warmup, cache_dir=args.cache_dir))
        r = rows[-1]
        print(f"{case}: fused {r['fused']['median_ms']:.2f} ms, unfused {r['unfused']['median_ms']:.2f} ms",
              file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"host": os.uname().nodename, "cpus": os.cpu_count(), "threads": 1, "repeat": args.repeat,
            "conv_input": CONV_INPUT, "conv_out_channels": CONV_OUT_CHANNELS, "chain_ops": CHAIN_OPS,
            "arith_chain_ops": ARITH_CHAIN_OPS,
            "chain_elements": CHAIN_ELEMENTS, "copy_bytes": COPY_BYTES}
    result: dict = {"meta": meta, "cases": rows}
    chains = [r for r in rows if r["case"] in ("chain8", "chain8_arith")]
    if chains:  # the in-place stream and the streaming-store copy timed as the memcpy is, in CPU time
        _, c = time_interleaved({"inplace": inplace, "stream": stream_copy(args.cache_dir)}, args.repeat, args.warmup)
        result["bounds"] = {r["case"]: chain_bound(r["case"], r, c["inplace"], c["stream"]) for r in chains}
    if args.op_costs:
        result["op_costs"] = op_costs()
    result["epilogue_stream_ratios"] = epilogue_ratios(rows)
    result["standalone_stream_ratios"] = epilogue_ratios(rows, "unfused")
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    print(table(rows))
    if result.get("bounds"):
        print()
        print(bound_table(result["bounds"]))
    if args.op_costs:
        print()
        print(op_cost_table(result["op_costs"]))
    if result["epilogue_stream_ratios"]:
        print()
        print(epilogue_ratio_table(result["epilogue_stream_ratios"], result["standalone_stream_ratios"]))
    print(f"\nwritten {args.out}")
    return rows


if __name__ == "__main__":
    main()
