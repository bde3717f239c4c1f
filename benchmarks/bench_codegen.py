"""C backend benchmark: per zoo model, the unfused C build vs the fused one (and the NumPy
reference and onnxruntime on the same inputs), plus the arena size of each plan.

    python benchmarks/bench_codegen.py                      # every zoo model
    python benchmarks/bench_codegen.py resnet8 ds_cnn --threads 2 --repeat 50

Writes ``benchmarks/results/codegen.json`` and prints a table. The fused plan comes from
``plan_fn(graph) -> FusionPlan`` (default: the fusion pipeline ``opfuse.passes.fuse``); the
plan may belong to a rewritten copy of the graph (``plan.graph``), which is what gets built.
Latencies are wall-clock (``--clock cpu``: the calling thread's CPU time) per ``run`` call;
medians and minimums over ``--repeat`` runs after ``--warmup`` runs, the contenders' calls
interleaved (the minimum is the better estimate on a busy machine).
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

from opfuse import zoo
from opfuse.ir.graph import Graph
from opfuse.ir.plan import FusionPlan
from opfuse.runtime import reference
from opfuse.runtime.native import build

RESULTS = Path(__file__).resolve().parent / "results" / "codegen.json"
DEFAULT_REPEAT = 30
DEFAULT_WARMUP = 3
REFERENCE_REPEAT = 3  # the NumPy reference is slow; a few runs give its order of magnitude


def fusion_pipeline_plan(graph: Graph) -> FusionPlan:
    """``--plan rules``: the fusion passes' maximal legal grouping (rewrites + grouping)."""
    from opfuse.passes import fuse
    _, plan, _ = fuse(graph)
    return plan


def compiler_plan(graph: Graph) -> FusionPlan:
    """The default ``plan_fn``: what ``opfuse compile`` builds (the cost-model planner's choice)."""
    from opfuse.compiler import plan_model
    return plan_model(graph).plan


PLAN_FNS = {"planner": compiler_plan, "rules": fusion_pipeline_plan}


# "cpu": the calling thread's CPU time. Every contender runs on that thread at threads=1
# (opfuse runs its parallel loops inline, onnxruntime with one intra-op thread runs in the
# caller), and it does not count the time slices other processes take on a shared machine.
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


def time_calls(fns: dict[str, Callable[[], object]], repeat: int, warmup: int,
               clock: Callable[[], float] = time.perf_counter) -> dict[str, dict]:
    """Median and minimum time (``clock``, wall by default) of each callable; the calls are
    interleaved (a, b, a, b...) so a load change on a shared machine hits every contender alike."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = clock()
            fn()
            samples[k].append(clock() - t0)
    return {k: {"median_ms": statistics.median(v) * 1e3, "min_ms": min(v) * 1e3, "runs": repeat}
            for k, v in samples.items()}


def max_error(got: dict, want: dict) -> float:
    return float(max(np.max(np.abs(got[k].astype(np.float64) - want[k])) for k in want))


def onnxruntime_session(name: str, threads: int):
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    model = zoo.build_onnx(name)
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def bench_model(name: str, plan_fn: Callable[[Graph], FusionPlan], *, threads: int, repeat: int, warmup: int,
                cache_dir, with_reference: bool, with_ort: bool, clock: str = "wall") -> dict:
    graph = zoo.load(name)
    feeds = reference.random_inputs(graph, 0)
    want = reference.run(graph, feeds)
    row: dict = {"model": name, "nodes": len(graph.nodes), "threads": threads}
    plans = {"unfused": FusionPlan.unfused(graph), "fused": plan_fn(graph)}
    calls: dict[str, Callable[[], object]] = {}
    for label, plan in plans.items():
        model = build(plan.graph, plan, threads=threads, cache_dir=cache_dir)
        got = model.run(feeds)
        rep = model.report
        row[label] = {
            "kernels": rep["kernels"], "functions": rep["functions"],
            "arena_bytes": rep["arena_bytes"], "arena_lower_bound_bytes": rep["arena_lower_bound_bytes"],
            "arena_ratio": rep["arena_ratio"], "max_abs_error": max_error(got, want),
            "build_seconds": rep["build_seconds"], "cache_hit": rep["cache_hit"],
        }
        calls[label] = (lambda m: (lambda: m.run(feeds)))(model)
    if with_ort:
        sess = onnxruntime_session(name, threads)
        if sess is not None:
            got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
            row["onnxruntime"] = {"max_abs_error": max_error(got, want)}
            calls["onnxruntime"] = lambda: sess.run(None, feeds)
    if clock == "cpu" and threads != 1:
        raise SystemExit("--clock cpu measures the calling thread: use it with --threads 1")
    row["clock"] = clock
    for label, timing in time_calls(calls, repeat, warmup, CLOCKS[clock]).items():
        row[label].update(timing)
    row["speedup_median"] = row["unfused"]["median_ms"] / row["fused"]["median_ms"]
    row["speedup_min"] = row["unfused"]["min_ms"] / row["fused"]["min_ms"]
    row["arena_fused_over_unfused"] = row["fused"]["arena_bytes"] / max(row["unfused"]["arena_bytes"], 1)
    if with_reference:
        row["reference"] = time_calls({"ref": lambda: reference.run(graph, feeds)}, REFERENCE_REPEAT, 0)["ref"]
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'model':22s} {'kern u/f':>9s} {'unfused ms':>11s} {'fused ms':>9s} {'speedup':>8s} {'(min)':>6s} "
            f"{'ref ms':>9s} {'ort ms':>8s} {'arena u KiB':>11s} {'arena f KiB':>11s} {'f/LB':>5s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        u, f = r["unfused"], r["fused"]
        ref = f"{r['reference']['median_ms']:9.1f}" if "reference" in r else f"{'-':>9s}"
        ort = f"{r['onnxruntime']['median_ms']:8.2f}" if "onnxruntime" in r else f"{'-':>8s}"
        lines.append(f"{r['model']:22s} {u['kernels']:>4d}/{f['kernels']:<4d} {u['median_ms']:11.2f} "
                     f"{f['median_ms']:9.2f} {r['speedup_median']:7.2f}x {r['speedup_min']:5.2f}x {ref} {ort} "
                     f"{u['arena_bytes'] / 1024:11.1f} {f['arena_bytes'] / 1024:11.1f} {f['arena_ratio']:5.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None, plan_fn: Callable[[Graph], FusionPlan] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=zoo.list_models())
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plan", choices=sorted(PLAN_FNS), default="planner",
                    help="fused plan: the cost-model planner's (as opfuse compile) or the rules' maximal one")
    ap.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP)
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--no-onnxruntime", action="store_true")
    ap.add_argument("--cache-dir", default=os.environ.get("OPFUSE_CACHE_DIR"))
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall: elapsed time; cpu: the calling thread's CPU time (threads=1 only)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    rows = []
    plan_fn = plan_fn or PLAN_FNS[args.plan]
    for name in args.models:
        rows.append(bench_model(name, plan_fn, threads=args.threads, repeat=args.repeat, warmup=args.warmup,
                                cache_dir=args.cache_dir, with_reference=not args.no_reference,
                                with_ort=not args.no_onnxruntime, clock=args.clock))
        print(f"{name}: unfused {rows[-1]['unfused']['median_ms']:.2f} ms, "
              f"fused {rows[-1]['fused']['median_ms']:.2f} ms", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"host": os.uname().nodename, "cpus": os.cpu_count(), "threads": args.threads, "clock": args.clock,
            "repeat": args.repeat, "plan_fn": getattr(plan_fn, "__name__", str(plan_fn))}
    args.out.write_text(json.dumps({"meta": meta, "models": rows}, indent=1, sort_keys=True))
    print(table(rows))
    print(f"\nwritten {args.out}")
    return rows


if __name__ == "__main__":
    main()
