"""Where 2 threads lose against 1: per kernel of the fused build, the time at 1 and at N threads
(runs interleaved), the parallel loop's iterations and schedule, and how the CPU time splits
between the threads of the whole run.

    python benchmarks/bench_scaling.py mobilenet_v1 resnet18 bert_layer --threads 2 --repeat 20

Three views, because the machine is shared:

* ``tile bound``: the speed-up the tiles allow on N free cores, from the code alone. A GEMM/conv
  tile's work is taken as its padded rows times padded columns (``mc`` x ``nc`` rounded up to the
  6 x 24 micro-kernel), tiles are handed out in order to whichever thread is free (what
  ``schedule(dynamic, 1)`` does) or in static halves; the model's bound weighs each kernel by its
  time at 1 thread. It does not see memory bandwidth or the cost of waking threads.
* ``cpu``: each thread's on-CPU time per run (``/proc/self/task/*/schedstat``); with dynamic
  schedules the split follows which thread got a core, so it is only a clean measure when the
  machine is quiet.
* wall clock, next to ``others``: the cores' worth of CPU other processes took meanwhile
  (``opfuse.bench.OtherLoad``).

Writes ``benchmarks/results/scaling.json``.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from opfuse.bench import OtherLoad
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import build_native, plan_model
from opfuse.runtime.reference import random_inputs

RESULTS = Path(__file__).resolve().parent / "results" / "scaling.json"
_TILE_M = re.compile(r"const long \w+ = \((\d+) - \w+ < (\d+) \? \d+ - \w+ : \d+\);")  # mc = min(M - m0, MC)
MR, NR = 6, 24  # the micro-kernel's register block (CodegenOptions.gemm_mr, gemm_nr)
_LOOP = re.compile(r"omp parallel for num_threads\(nt\) schedule\(([^)]*)\)(?: collapse\((\d+)\))?.*\n"
                   r"\s*for \(long \w+ = 0; \w+ < (\d+);")


def thread_cpu_ms() -> dict[str, float]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            out[tid] = int(f.read().split()[0]) / 1e6
    return out


def parallel_loops(source: str, threads: int) -> dict[str, dict]:
    """Function name -> its parallel loops (schedule, collapse, iterations of the outer loop) and
    the tile bound on ``threads`` cores."""
    out: dict[str, dict] = {}
    for chunk in re.split(r"\n(?=/\* group )", source):
        m = re.search(r"static void (\w+)\(", chunk)
        if m:
            loops = [{"schedule": s, "collapse": int(c or 1), "iterations": int(n)} for s, c, n in _LOOP.findall(chunk)]
            out[m.group(1)] = {"loops": loops, "tile_bound": tile_bound(chunk, loops, threads)}
    return out


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to


def tile_works(chunk: str, iterations: int) -> list[float] | None:
    """Work of each tile of a GEMM/conv tile loop (padded ``mc * nc``), in loop order; ``None``
    when the loop is not one (its iterations are then taken as equal)."""
    dims = _TILE_M.findall(chunk)
    if len(dims) < 2:
        return None
    (m, mc), (n, nc) = (int(v) for v in dims[0]), (int(v) for v in dims[1])
    mt, nt = -(-m // mc), -(-n // nc)
    if iterations % (mt * nt):
        return None
    rows = [_pad(min(mc, m - i * mc), MR) for i in range(mt)]
    cols = [_pad(min(nc, n - j * nc), NR) for j in range(nt)]
    return [float(rows[(t // nt) % mt] * cols[t % nt]) for t in range(iterations)]


def makespan(works: list[float], threads: int, schedule: str) -> float:
    """Time to finish ``works`` on ``threads`` threads: in order to the first free thread
    (dynamic), or in contiguous near-equal chunks (static)."""
    if schedule.startswith("static"):
        size = -(-len(works) // threads)
        return max(sum(works[i:i + size]) for i in range(0, len(works), size))
    free = [0.0] * threads
    for w in works:
        i = free.index(min(free))
        free[i] += w
    return max(free)


def tile_bound(chunk: str, loops: list[dict], threads: int) -> float:
    """Speed-up the kernel's first parallel loop allows on ``threads`` free cores (1 when serial)."""
    if not loops:
        return 1.0
    lp = loops[0]
    works = tile_works(chunk, lp["iterations"]) or [1.0] * lp["iterations"]
    return sum(works) / makespan(works, threads, lp["schedule"])


def scale(name: str, threads: int, repeat: int) -> dict:
    comp = plan_model(f"zoo:{name}")
    model = build_native(comp, threads=1, codegen_options=CodegenOptions(profile=True))
    feeds = random_inputs(comp.original, 0)
    n = model.program.num_functions
    ns, grp = (ctypes.c_uint64 * n)(), (ctypes.c_int * n)()
    per_kernel: dict[int, list[np.ndarray]] = {1: [], threads: []}
    wall: dict[int, list[float]] = {1: [], threads: []}
    cpu: dict[int, list[list[float]]] = {1: [], threads: []}
    for t in (1, threads):  # warm both
        model.threads = t
        model.run(feeds)
    with OtherLoad() as others:
        for _ in range(repeat):
            for t in (1, threads):
                model.threads = t
                model._lib.opfuse_profile(ns, grp, n)  # reset the kernel timers
                before = thread_cpu_ms()
                t0 = time.perf_counter()
                model.run(feeds)
                wall[t].append((time.perf_counter() - t0) * 1e3)
                after = thread_cpu_ms()
                model._lib.opfuse_profile(ns, grp, n)
                per_kernel[t].append(np.array(ns[:n], dtype=np.float64) / 1e6)
                cpu[t].append(sorted((after[k] - before.get(k, 0.0) for k in after), reverse=True)[:threads])
    loops = parallel_loops(model.program.source, threads)
    k1, kn = np.median(per_kernel[1], axis=0), np.median(per_kernel[threads], axis=0)
    kernels = []
    for k in range(n):
        info = model.program.kernels[grp[k]]
        par = loops.get(info.function or "", {"loops": [], "tile_bound": 1.0})
        kernels.append({"group": info.group, "ops": info.ops, "ms_1": float(k1[k]), f"ms_{threads}": float(kn[k]),
                        "speedup": float(k1[k] / kn[k]) if kn[k] else None, **par})
    c1 = np.median(np.array([c[0] for c in cpu[1]]))
    cn = np.median(np.array([c + [0.0] * (threads - len(c)) for c in cpu[threads]]), axis=0)
    return {"model": name, "threads": threads, "repeat": repeat, "others_cores": others.cores,
            "wall_ms_1": float(np.median(wall[1])), f"wall_ms_{threads}": float(np.median(wall[threads])),
            "cpu_ms_1": float(c1), f"cpu_ms_{threads}": [float(v) for v in cn],
            "cpu_bound_speedup": float(c1 / cn.max()),
            "tile_bound_speedup": float(sum(k["ms_1"] for k in kernels)
                                        / sum(k["ms_1"] / k["tile_bound"] for k in kernels)),
            "kernels": kernels}


def table(r: dict, top: int) -> str:
    t = r["threads"]
    lines = [f"{r['model']}: wall {r['wall_ms_1']:.2f} -> {r[f'wall_ms_{t}']:.2f} ms "
             f"(x{r['wall_ms_1'] / r[f'wall_ms_{t}']:.2f}; others took {r['others_cores'] or 0:.2f} cores), "
             f"CPU {r['cpu_ms_1']:.2f} ms -> " + " + ".join(f"{v:.2f}" for v in r[f"cpu_ms_{t}"])
             + f" ms per thread (x{r['cpu_bound_speedup']:.2f}); tile bound x{r['tile_bound_speedup']:.2f}",
             f"  {'group':<26}{'ops':<28}{'1t ms':>8}{f'{t}t ms':>8}{'x':>6}{'share':>7}{'bound':>7}  parallel loop"]
    total = sum(k["ms_1"] for k in r["kernels"])
    for k in sorted(r["kernels"], key=lambda k: -k["ms_1"])[:top]:
        loop = ", ".join(f"{lp['iterations']} iterations {lp['schedule']}" for lp in k["loops"]) or "serial"
        lines.append(f"  {k['group'][:25]:<26}{'+'.join(k['ops'])[:27]:<28}{k['ms_1']:8.3f}{k[f'ms_{t}']:8.3f}"
                     f"{k['speedup'] or 0:6.2f}{100 * k['ms_1'] / total:6.1f}%{k['tile_bound']:7.2f}  {loop}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["mobilenet_v1", "resnet18", "bert_layer"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--top", type=int, default=12, help="kernels listed per model")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        rows.append(scale(name, args.threads, args.repeat))
        print(table(rows[-1], args.top), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
