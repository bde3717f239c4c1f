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
* ``cpu``: each thread's on-CPU time per run (per-thread CPU clocks); with dynamic
  schedules the split follows which thread got a core, so it is only a clean measure when the
  machine is quiet.
* wall clock, next to ``others``: the cores' worth of CPU other processes took meanwhile
  (``opfuse.bench.OtherLoad``).

On a machine whose other users run at normal priority, a woken worker thread waits for a time slice
on the second core (up to ~1.5 ms per region on this VM's kernel); the program's pool does not wait for it (the
caller takes the pieces no worker has started: the README's "threads on a busy machine"), but the worker's share
then runs on one core. ``--fifo`` runs the timed part under ``SCHED_FIFO`` (priority 1; needs CAP_SYS_NICE), set
after the builds and before the first parallel run, so that the pool's workers, created then, inherit it: the
benchmark gets both cores as on a quiet machine (not the memory bandwidth and caches the others use).
Each model's scratch is allocated once for the most threads (``NativeModel.threads`` only grows it):
before, every switch between 1 and 2 threads allocated a fresh one, and the first kernels of the next
run paid its page faults (resnet18's conv1 timed 1.4-5 ms at 2 threads against 0.6).

``--ab`` interleaves the builds without and with tile balancing (``CodegenOptions.balance_threads``)
instead; ``--vs FIELD=VALUE ...`` interleaves the default build with one built with those
``CodegenOptions`` fields, per kernel at 1 and N threads (each round: both builds, each at 1 thread then
N); ``--static`` runs nothing and prints the split alone (``--markdown FILE``: before and after).

Writes ``benchmarks/results/scaling.json`` (``--out``).
"""
from __future__ import annotations

import argparse
import ast
import ctypes
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from opfuse.bench import OtherLoad
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import build_native, plan_model
from opfuse.runtime.reference import random_inputs

RESULTS = Path(__file__).resolve().parent / "results" / "scaling.json"


def thread_cpu_ms() -> dict[str, float]:
    """CPU time of each thread of this process so far (ms): Linux's per-thread CPU clock
    (``clock_gettime`` on ``MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)``), exact to the call, where
    ``/proc/*/schedstat`` is brought up to date only when the thread is descheduled."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            out[tid] = time.clock_gettime((~int(tid) << 3) | 6) * 1e3
        except OSError:  # the thread has exited
            pass
    return out


def split(info, threads: int) -> dict:
    """A kernel's parallel loops (iterations, schedule, costs) from the code generator
    (``KernelInfo.parallel``) and the speed-up they allow on ``threads`` free cores."""
    loops = [{"schedule": lp.schedule, "iterations": lp.iterations, "work": lp.work,
              "uneven": bool(lp.costs) and min(lp.costs) != max(lp.costs), "bound": lp.speedup(threads)}
             for lp in info.parallel]
    return {"loops": loops, "tile_bound": min((lp["bound"] for lp in loops), default=1.0)}


def realtime(enabled: bool) -> None:
    """``SCHED_FIFO`` for this thread and the threads it starts from now on (``--fifo``); after the
    builds, so that the compiler it runs does not inherit it."""
    if enabled:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))


def scale(name: str, threads: int, repeat: int, fifo: bool = False) -> dict:
    comp = plan_model(f"zoo:{name}")
    model = build_native(comp, threads=1, codegen_options=CodegenOptions(profile=True))
    realtime(fifo)
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
    k1, kn = np.median(per_kernel[1], axis=0), np.median(per_kernel[threads], axis=0)
    kernels = []
    for k in range(n):
        info = model.program.kernels[grp[k]]
        par = split(info, threads)
        kernels.append({"group": info.group, "ops": info.ops, "ms_1": float(k1[k]), f"ms_{threads}": float(kn[k]),
                        "speedup": float(k1[k] / kn[k]) if kn[k] else None, **par})
    c1 = np.median(np.array([c[0] for c in cpu[1]]))
    cn = np.median(np.array([c + [0.0] * (threads - len(c)) for c in cpu[threads]]), axis=0)
    return {"model": name, "threads": threads, "repeat": repeat, "others_cores": others.cores,
            "loadavg": os.getloadavg()[0], "fifo": fifo,
            "wall_ms_1": float(np.median(wall[1])), f"wall_ms_{threads}": float(np.median(wall[threads])),
            "cpu_ms_1": float(c1), f"cpu_ms_{threads}": [float(v) for v in cn],
            "cpu_bound_speedup": float(c1 / cn.max()),
            "tile_bound_speedup": float(sum(k["ms_1"] for k in kernels)
                                        / sum(k["ms_1"] / k["tile_bound"] for k in kernels)),
            "kernels": kernels}


def options_ab(name: str, threads: int, repeat: int, fields: dict, fifo: bool = False) -> dict:
    """Interleaved, per round: the default build and the build with ``fields`` (``CodegenOptions``), each at
    1 thread then at ``threads``; per kernel and whole run, the medians of each."""
    comp = plan_model(f"zoo:{name}")
    feeds = random_inputs(comp.original, 0)
    builds = {"default": build_native(comp, threads=1, codegen_options=CodegenOptions(profile=True)),
              "vs": build_native(comp, threads=1, codegen_options=CodegenOptions(profile=True, **fields))}
    realtime(fifo)
    ts = (1, threads)
    per: dict[tuple[str, int], list[np.ndarray]] = {(k, t): [] for k in builds for t in ts}
    wall: dict[tuple[str, int], list[float]] = {(k, t): [] for k in builds for t in ts}
    groups: dict[str, list[str]] = {}
    for model in builds.values():
        for t in ts:
            model.threads = t
            model.run(feeds)
    with OtherLoad() as others:
        for _ in range(repeat):
            for key, model in builds.items():
                n = model.program.num_functions
                ns, grp = (ctypes.c_uint64 * n)(), (ctypes.c_int * n)()
                for t in ts:
                    model.threads = t
                    model._lib.opfuse_profile(ns, grp, n)
                    t0 = time.perf_counter()
                    model.run(feeds)
                    wall[key, t].append((time.perf_counter() - t0) * 1e3)
                    model._lib.opfuse_profile(ns, grp, n)
                    per[key, t].append(np.array(ns[:n], dtype=np.float64) / 1e6)
                groups[key] = [model.program.kernels[grp[k]].group for k in range(n)]
    out: dict = {"model": name, "threads": threads, "repeat": repeat, "fields": {k: repr(v) for k, v in fields.items()},
                 "others_cores": others.cores, "loadavg": os.getloadavg()[0], "fifo": fifo}
    for key in builds:
        med = {t: np.median(per[key, t], axis=0) for t in ts}
        out[key] = {"wall_ms": {str(t): float(np.median(wall[key, t])) for t in ts},
                    "kernels": {g: {str(t): float(med[t][k]) for t in ts} for k, g in enumerate(groups[key])}}
    return out


def options_ab_table(r: dict) -> str:
    t = str(r["threads"])
    d, v = r["default"], r["vs"]
    fields = " ".join(f"{k}={x}" for k, x in r["fields"].items())
    lines = [f"{r['model']} vs {fields} (others took {r['others_cores'] or 0:.2f} cores, load average "
             f"{r['loadavg']:.1f}{', SCHED_FIFO' if r['fifo'] else ''}; medians of {r['repeat']} rounds):",
             f"  wall 1t {d['wall_ms']['1']:.3f} -> {v['wall_ms']['1']:.3f} ms, {t}t {d['wall_ms'][t]:.3f} -> "
             f"{v['wall_ms'][t]:.3f} ms; speed-up x{d['wall_ms']['1'] / d['wall_ms'][t]:.2f} -> "
             f"x{v['wall_ms']['1'] / v['wall_ms'][t]:.2f}",
             f"  {'group':<26}{'1t ms':>8}{'vs':>8}{f'{t}t ms':>8}{'vs':>8}{'x':>6}{'vs':>6}"]
    for g, a in d["kernels"].items():
        b = v["kernels"].get(g)
        if b is None or (a == b):
            continue
        if abs(a["1"] - b["1"]) < 0.02 * a["1"] and abs(a[t] - b[t]) < 0.02 * a[t] and a["1"] < 0.05:
            continue
        lines.append(f"  {g[:25]:<26}{a['1']:8.3f}{b['1']:8.3f}{a[t]:8.3f}{b[t]:8.3f}"
                     f"{a['1'] / a[t]:6.2f}{b['1'] / b[t]:6.2f}")
    sa = {k: sum(x[k] for x in d["kernels"].values()) for k in ("1", t)}
    sb = {k: sum(x[k] for x in v["kernels"].values()) for k in ("1", t)}
    lines.append(f"  {'kernels summed':<26}{sa['1']:8.3f}{sb['1']:8.3f}{sa[t]:8.3f}{sb[t]:8.3f}"
                 f"{sa['1'] / sa[t]:6.2f}{sb['1'] / sb[t]:6.2f}")
    return "\n".join(lines)


def static(name: str, threads: int, options: CodegenOptions | None = None) -> dict:
    """The split alone, from the generated code (nothing runs): each kernel's parallel loops, the
    FLOPs of one iteration, and the model's bound weighing each kernel by its predicted time."""
    from opfuse.codegen.program import generate
    comp = plan_model(f"zoo:{name}")
    program = generate(comp.graph, comp.plan, memory=comp.memory, options=options)
    groups = {g["name"]: g for g in comp.report["groups"]}
    kernels = []
    for info in program.kernels:
        if info.function is None:
            continue
        g = groups.get(info.group, {})
        par = split(info, threads)
        its = par["loops"][0]["iterations"] if par["loops"] else 1
        kernels.append({"group": info.group, "ops": info.ops, "predicted_ms": 1e3 * g.get("predicted_latency_s", 0.0),
                        "mflop_per_iteration": g.get("flops", 0) / its / 1e6, "notes": list(info.notes), **par})
    total = sum(k["predicted_ms"] for k in kernels)
    return {"model": name, "threads": threads, "kernels": kernels,
            "tile_bound_speedup": total / sum(k["predicted_ms"] / k["tile_bound"] for k in kernels)}


def static_table(r: dict) -> str:
    t = r["threads"]
    lines = [f"{r['model']}: bound at {t} threads x{r['tile_bound_speedup']:.2f} (kernels weighed by predicted time)",
             f"  {'group':<26}{'ops':<24}{'pred ms':>8}{'share':>7}{'its':>5}{'MFLOP/it':>9}{'bound':>7}  schedule"]
    total = sum(k["predicted_ms"] for k in r["kernels"]) or 1.0
    for k in r["kernels"]:
        lp = k["loops"][0] if k["loops"] else None
        its = f"{lp['iterations']}" if lp else "-"
        sched = (f"{lp['schedule']}{', uneven' if lp['uneven'] else ''}" if lp else "one thread")
        lines.append(f"  {k['group'][:25]:<26}{'+'.join(k['ops'])[:23]:<24}{k['predicted_ms']:8.3f}"
                     f"{100 * k['predicted_ms'] / total:6.1f}%{its:>5}{k['mflop_per_iteration']:9.2f}"
                     f"{k['tile_bound']:7.2f}  {sched}")
    return "\n".join(lines)


def balance_ab(name: str, threads: int, repeat: int, fifo: bool = False) -> dict:
    """Interleaved, per round: the build without balancing (``balance_threads=()``) and with it, each at 1
    thread, then at ``threads`` right after (the workers asleep: "cold"), then again at once ("warm");
    medians of wall time and of each thread's CPU time in the cold run."""
    comp = plan_model(f"zoo:{name}")
    feeds = random_inputs(comp.original, 0)
    builds = {"cache blocking": build_native(comp, threads=1, codegen_options=CodegenOptions(balance_threads=())),
              "balanced": build_native(comp, threads=1)}
    realtime(fifo)
    got: dict[str, dict[str, list]] = {k: {"1": [], "cold": [], "warm": [], "cpu": []} for k in builds}
    for model in builds.values():
        for t in (1, threads):
            model.threads = t
            model.run(feeds)
    with OtherLoad() as others:
        for _ in range(repeat):
            for key, model in builds.items():
                r = got[key]
                model.threads = 1
                t0 = time.perf_counter()
                model.run(feeds)
                r["1"].append(time.perf_counter() - t0)
                model.threads = threads
                before = thread_cpu_ms()
                t0 = time.perf_counter()
                model.run(feeds)
                r["cold"].append(time.perf_counter() - t0)
                after = thread_cpu_ms()
                r["cpu"].append(sorted((after[k] - before.get(k, 0.0) for k in after), reverse=True)[:threads])
                t0 = time.perf_counter()
                model.run(feeds)
                r["warm"].append(time.perf_counter() - t0)
    out: dict = {"model": name, "threads": threads, "repeat": repeat, "others_cores": others.cores,
                 "loadavg": os.getloadavg()[0]}
    for key, r in got.items():
        ms = {k: 1e3 * float(np.median(r[k])) for k in ("1", "cold", "warm")}
        cpu = np.median(np.array([c + [0.0] * (threads - len(c)) for c in r["cpu"]]), axis=0)
        out[key] = {"ms_1": ms["1"], "ms_cold": ms["cold"], "ms_warm": ms["warm"], "cpu_ms": [float(c) for c in cpu]}
    return out


def ab_table(r: dict) -> str:
    t = r["threads"]
    lines = [f"{r['model']} (others took {r['others_cores'] or 0:.2f} cores, load average {r['loadavg']:.1f}):"]
    for key in ("cache blocking", "balanced"):
        v = r[key]
        lines.append(f"  {key:<15} 1t {v['ms_1']:9.3f} ms  {t}t cold {v['ms_cold']:9.3f} "
                     f"(x{v['ms_1'] / v['ms_cold']:.2f})  warm {v['ms_warm']:9.3f} (x{v['ms_1'] / v['ms_warm']:.2f})"
                     "  CPU per thread (cold) "
                     + " + ".join(f"{c:.2f}" for c in v["cpu_ms"]) + " ms")
    return "\n".join(lines)


def split_markdown(names: list[str], threads: int) -> str:
    """Per model and kernel, the parallel split before balancing (the cache blocking alone) and
    after: iterations, MFLOP per iteration and the speed-up bound on ``threads`` free cores."""
    out = [f"# Work split at {threads} threads, from the generated code (`bench_scaling.py --static --markdown`)", "",
           "Bound: what the loop's iterations allow on free cores (tiles handed out in order, costs from the "
           "tiles' padded sizes); the model's weighs each kernel by its predicted time. It does not see memory "
           "bandwidth, fork/join or wake-up costs, or data moving between cores. MFLOP are the direct "
           "convolution's (Winograd does fewer). A Winograd convolution with fewer blocks than threads lists "
           "gemm_min_tiles iterations (a block's output channels in parts): at 2 threads 2 of them run, and "
           "each transforms the block's input again, which the bound does not count.", ""]
    for name in names:
        before, after = static(name, threads, CodegenOptions(balance_threads=())), static(name, threads)
        out += [f"## {name}: x{before['tile_bound_speedup']:.2f} -> x{after['tile_bound_speedup']:.2f}", "",
                "| kernel | ops | algorithm | pred ms | iterations | MFLOP/it | bound "
                "| balanced: iterations | MFLOP/it | bound |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for b, a in zip(before["kernels"], after["kernels"], strict=True):
            def cols(k: dict) -> str:
                its = k["loops"][0]["iterations"] if k["loops"] else "one thread"
                return f"{its} | {k['mflop_per_iteration']:.2f} | {k['tile_bound']:.2f}"
            algo = next((n.split(": ", 1)[1].split(" (")[0] for n in a["notes"] if ": " in n), "")
            ops = "+".join(a["ops"])
            out.append(f"| {a['group']} | {ops} | {algo} | {a['predicted_ms']:.3f} | {cols(b)} | {cols(a)} |")
        out.append("")
    return "\n".join(out)


def table(r: dict, top: int) -> str:
    t = r["threads"]
    lines = [f"{r['model']}: wall {r['wall_ms_1']:.2f} -> {r[f'wall_ms_{t}']:.2f} ms "
             f"(x{r['wall_ms_1'] / r[f'wall_ms_{t}']:.2f}; others took {r['others_cores'] or 0:.2f} cores, load "
             f"{r['loadavg']:.1f}{', SCHED_FIFO' if r['fifo'] else ''}), "
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
    ap.add_argument("--static", action="store_true", help="only the split from the generated code (runs nothing)")
    ap.add_argument("--markdown", type=Path, help="with --static: write the before/after split of every model here")
    ap.add_argument("--ab", action="store_true",
                    help="interleave the builds without and with balancing (1 thread, then --threads cold and warm)")
    ap.add_argument("--vs", nargs="+", metavar="FIELD=VALUE",
                    help="interleave the default build with one built with these CodegenOptions fields")
    ap.add_argument("--fifo", action="store_true",
                    help="time under SCHED_FIFO (see above): both cores on a machine others keep busy")
    ap.add_argument("--no-balance", action="store_true",
                    help="with --static: the cache blocking's tiles alone (CodegenOptions(balance_threads=()))")
    args = ap.parse_args(argv)
    rows = []
    if args.static:
        if args.markdown:
            args.markdown.write_text(split_markdown(args.models, args.threads) + "\n")
            print(f"wrote {args.markdown}", file=sys.stderr)
            return
        options = CodegenOptions(balance_threads=()) if args.no_balance else None
        for name in args.models:
            print(static_table(static(name, args.threads, options)), flush=True)
        return
    if args.vs:
        fields = {}
        for item in args.vs:
            key, _, value = item.partition("=")
            fields[key] = ast.literal_eval(value) if value not in ("true", "false") else value == "true"
        for name in args.models:
            rows.append(options_ab(name, args.threads, args.repeat, fields, args.fifo))
            print(options_ab_table(rows[-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
        return
    if args.ab:
        for name in args.models:
            rows.append(balance_ab(name, args.threads, args.repeat, args.fifo))
            print(ab_table(rows[-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
        return
    for name in args.models:
        rows.append(scale(name, args.threads, args.repeat, args.fifo))
        print(table(rows[-1], args.top), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
