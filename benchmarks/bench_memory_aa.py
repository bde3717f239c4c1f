"""The memory-bound figure's A/A: ``opfuse.measure.memory_bound_removed`` with the same fused build on both sides.

    python benchmarks/bench_memory_aa.py resnet18 yolo_block bert_layer --repeat 100

Every fused group that stands for memory-bound unfused kernels and has anchors (``group_check``'s mapping: a
Conv, MatMul or compute-bound kernel its loop is built around) is set against *the same group of a second load
of the same fused build*, the two timed in turn round by round (``interleaved_kernel_medians``, kernel timers,
thread CPU time, 1 thread) as ``group_check`` times the fused and the unfused build. Its anchor is then itself,
so the time it truly has left beyond its anchor is 0, and the "left" the estimator reports is what noise makes
of 0. Each memory-bound share stands as one kernel of the size ``group_check`` measured for the row (it sets
``unfused_s``, the denominator, and nothing else). Printed per model, from the same rounds: the rows' paired
medians summed as they are, the sum of the rows each held at 0 (the estimator before 2026-12-02 evening), what
``memory_bound_removed`` reports (``left_s``, ``removed`` and its interval), and the load.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def aa(model: str, repeat: int) -> dict:
    from opfuse.codegen.options import CodegenOptions
    from opfuse.compiler import CompileOptions, build_native, plan_model
    from opfuse.measure import group_check, interleaved_kernel_medians, memory_bound_removed
    from opfuse.runtime.reference import random_inputs
    check = group_check(f"zoo:{model}", threads=1, repeat=5)  # the mapping and each row's memory-bound time
    bound = {k: v["bound"] for k, v in check["memory_bound"]["unfused_kernels"].items()}
    rows = [r for r in check["groups"] if r.get("memory_unfused_s") and r["unfused_kernels"]
            and (r["anchor_kernels"] or any(bound.get(k) != "memory" for k in r["unfused_kernels"]))]
    comp = plan_model(f"zoo:{model}", CompileOptions(fuse=True))
    timed = CodegenOptions(profile=True, profile_clock="thread_cpu")
    natives = [build_native(comp, threads=1, codegen_options=timed) for _ in range(2)]
    runs: list[dict[str, list[float]]] = []
    t_a, t_b = interleaved_kernel_medians(natives, random_inputs(comp.original, 0), repeat, samples=runs)
    aa_rows, t_unfused, aa_bound = [], {}, {}
    aa_runs: list[dict[str, list[float]]] = [{}, {}]
    for r in rows:
        g = r["group"]
        aa_rows.append({"group": g, "fused_s": t_a[g], "unfused_kernels": [f"{g}@B", f"{g}@mem"],
                        "anchor_kernels": [f"{g}@B"]})
        t_unfused.update({f"{g}@B": t_b[g], f"{g}@mem": r["memory_unfused_s"]})
        aa_bound.update({f"{g}@B": "compute", f"{g}@mem": "memory"})
        aa_runs[0][g], aa_runs[1][f"{g}@B"] = runs[0][g], runs[1][g]
    mem = memory_bound_removed(aa_rows, t_unfused, aa_bound, runs=aa_runs)
    signed = [r["memory_left_s"] for r in aa_rows]
    return {"model": model, "repeat": repeat, "rows": len(aa_rows), "memory_unfused_s": mem["unfused_s"],
            "rows_summed_s": sum(signed), "rows_held_at_0_s": sum(max(x, 0.0) for x in signed),
            "rows_below_0": sum(x < 0 for x in signed), "left_s": mem["left_s"], "removed": mem["removed"],
            "interval": mem["interval"], "load_average": list(os.getloadavg()),
            "per_row_us": {r["group"]: r["memory_left_s"] * 1e6 for r in aa_rows}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=["resnet18", "yolo_block", "bert_layer"])
    ap.add_argument("--repeat", type=int, default=100)
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    args = ap.parse_args(argv)
    results = []
    for m in args.models:
        res = aa(m, args.repeat)
        results.append(res)
        iv = res["interval"]
        print(f"{m}: {res['rows']} rows, memory-bound {res['memory_unfused_s'] * 1e6:.1f} us; left (true 0): rows "
              f"summed {res['rows_summed_s'] * 1e6:+.1f} us, rows held at 0 {res['rows_held_at_0_s'] * 1e6:.1f} us "
              f"({res['rows_below_0']} below 0); memory_bound_removed: left {res['left_s'] * 1e6:.1f} us, removed "
              f"{res['removed']:.1%}" + (f" ({iv['low']:.1%} to {iv['high']:.1%})" if iv else "")
              + f"; load {res['load_average'][0]:.2f}", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
