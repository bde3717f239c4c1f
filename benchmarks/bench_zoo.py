"""``make bench``: every zoo model through ``opfuse bench`` at 1 and 2 threads, one process per run.

    python benchmarks/bench_zoo.py                                  # the whole zoo, 1 and 2 threads
    python benchmarks/bench_zoo.py resnet8 ds_cnn --threads 2 --repeat 20
    python benchmarks/bench_zoo.py --table-only                     # redo bench.md from the JSON files

Writes ``benchmarks/results/bench_<model>_t<threads>.json`` (the command's ``--json`` output) and
``benchmarks/results/bench.md``: one row per model and thread count (opfuse fused, unfused,
onnxruntime and OpenVINO medians in ms, fused over the best peer), a geometric-mean row per thread
count, the 2-thread speed-up of each contender, and at 1 thread the per-group check (``opfuse bench
--groups``: the fused groups that measured slower than their ops unfused; ``--no-groups`` skips
it). Each run is a fresh ``opfuse bench`` process, so no runtime's threads outlive their run.
Exits 1 when a run failed or its outputs disagreed (the table is written anyway).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ZOO = ("bert_layer", "ds_cnn", "mobilenet_v1", "mobilenet_v1_025_96", "resnet18", "resnet8", "yolo_block")
THREADS = (1, 2)
PEERS = ("onnxruntime", "openvino")
# 100 interleaved rounds keep the whole zoo at 1 and 2 threads near 6 minutes on the 2-core
# machine this was written on (a round of resnet18 at 1 thread is ~0.2 s for all four contenders).
DEFAULT_REPEAT = 100
RESULTS = Path(__file__).resolve().parent / "results"
COLUMNS = (("opfuse_fused", "opfuse fused ms"), ("opfuse_unfused", "unfused ms"), ("onnxruntime", "onnxruntime ms"),
           ("openvino", "openvino ms"))


def json_path(model: str, threads: int, results: Path = RESULTS) -> Path:
    return results / f"bench_{model}_t{threads}.json"


def run_one(model: str, threads: int, repeat: int, results: Path, groups: bool = False) -> tuple[int, str]:
    """One ``opfuse bench`` process (``--groups`` when ``groups``); its JSON goes to ``json_path``.
    Returns (exit code, stderr)."""
    cmd = [sys.executable, "-m", "opfuse.cli", "bench", f"zoo:{model}", "--threads", str(threads),
           "--repeat", str(repeat), "--json", *(["--groups"] if groups else [])]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode in (0, 1) and r.stdout.strip():  # 1: the outputs disagree, the result still stands
        json_path(model, threads, results).write_text(r.stdout)
    return r.returncode, r.stderr.strip()


def _ms(row: dict | None) -> str:
    return f"{row['median_ms']:.3f}" if row else "-"


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def markdown(results: list[dict]) -> str:
    """The ``bench.md`` table: rows by model then threads, a geometric-mean row per thread count,
    then the 2-thread speed-up table."""
    head = ["model", "threads", *(label for _, label in COLUMNS), "fused / best peer", "others' load"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for res in sorted(results, key=lambda r: (r["graph"], r["threads"])):
        rows = res["contenders"]
        ratio = res["ratios"].get("opfuse_fused")
        load = res.get("other_processes_cores")
        lines.append(f"| {res['graph']} | {res['threads']} | " + " | ".join(_ms(rows.get(k)) for k, _ in COLUMNS)
                     + f" | {f'{ratio:.2f}' if ratio else '-'} | {'-' if load is None else f'{load:.2f}'} |")
    for threads in sorted({r["threads"] for r in results}):
        same = [r for r in results if r["threads"] == threads]
        cells = []
        for key, _ in COLUMNS:
            g = _geomean([r["contenders"][key]["median_ms"] for r in same if key in r["contenders"]])
            cells.append(f"{g:.3f}" if g and all(key in r["contenders"] for r in same) else "-")
        g = _geomean([r["ratios"]["opfuse_fused"] for r in same if r["ratios"]])
        ratio = f"**{g:.2f}**" if g else "-"
        lines.append(f"| **geometric mean** | {threads} | " + " | ".join(cells) + f" | {ratio} | |")
    return "\n".join(lines) + "\n"


def scaling_markdown(results: list[dict]) -> str:
    """Median at 1 thread over median at 2 threads, per model and contender."""
    by = {(r["graph"], r["threads"]): r for r in results}
    models = sorted({m for m, t in by if (m, 1) in by and (m, 2) in by})
    if not models:
        return ""
    lines = ["| model | " + " | ".join(label.removesuffix(" ms") for _, label in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for m in models:
        one, two = by[(m, 1)]["contenders"], by[(m, 2)]["contenders"]
        cells = [f"{one[k]['median_ms'] / two[k]['median_ms']:.2f}x" if k in one and k in two else "-"
                 for k, _ in COLUMNS]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def groups_markdown(results: list[dict]) -> str:
    """Per run with a per-group check: the fused groups that measured slower than their ops unfused."""
    lines = []
    for res in sorted(results, key=lambda r: (r["graph"], r["threads"])):
        check = res.get("group_check")
        if not check:
            continue
        slow = [g for g in check["groups"] if g["slower"]]
        text = ", ".join(f"{g['group']} ({'+'.join(g['ops'])}) {g['fused_s'] * 1e6:.1f} vs "
                         f"{g['unfused_s'] * 1e6:.1f} us" for g in slow) or "none"
        mem = check.get("memory_bound") or {}
        iv = mem.get("interval")
        spread = f" ({iv['low']:.0%} to {iv['high']:.0%})" if iv else ""
        removed = (f"{mem['unfused_s'] * 1e3:.3f} | {mem['left_s'] * 1e3:.3f} | {mem['removed']:.0%}{spread}"
                   if mem.get("removed") is not None else "- | - | -")
        lines.append(f"| {res['graph']} | {res['threads']} | {check['fused_s'] * 1e3:.3f} | "
                     f"{check['unfused_s'] * 1e3:.3f} | {removed} | {text} |")
    if not lines:
        return ""
    return "\n".join(["| model | threads | fused groups ms | their ops unfused ms | memory-bound unfused ms "
                      "| left fused ms | memory-bound removed | fusion slower (> 5%) in |",
                      "|---|---:|---:|---:|---:|---:|---:|---|", *lines]) + "\n"


def _span(rows: list[dict], key: str, spec: str) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    return f"{min(values):{spec}} to {max(values):{spec}}" if values else "-"


def sgemm_note(ys: list[dict]) -> str:
    """Where the rows' sgemm yardstick comes from (``opfuse.yardsticks``): OpenBLAS's own kernels for
    this CPU, and the tuning variables removed for it with what they hold it to (``""`` for results
    from before this was recorded)."""
    known = [y for y in ys if "sgemm_env_removed" in y]
    if not known:
        return ""
    kernels = sorted({y["sgemm_blas"] for y in known if y.get("sgemm_blas")})
    note = f" ({' / '.join(kernels) + ' kernels' if kernels else 'kernels'}: the BLAS's own choice for this CPU"
    removed = sorted({f"{k}={v}" for y in known for k, v in y["sgemm_env_removed"].items()})
    if removed:
        held = sorted({y["sgemm_blas_as_set"] for y in known if y.get("sgemm_blas_as_set")})
        note += (f", timed in a child process without {', '.join(removed)}, which this environment sets: with them "
                 f"{_span(known, 'sgemm_gflops_as_set', '.0f')} GFLOP/s"
                 + (f", {' / '.join(held)} kernels" if held else ""))
    return note + ")"


def report(results: list[dict]) -> str:
    first = results[0]
    ys = [r["yardsticks"] for r in results if r.get("yardsticks")]
    versions = {k: first["contenders"][k].get("version") for k in PEERS if k in first["contenders"]}
    skipped = sorted({f"{p}: {why}" for r in results for p, why in r["skipped"].items()})
    disagree = sorted(f"{r['graph']} t{r['threads']}" for r in results if not r["errors"]["outputs_agree"])
    parts = ["# opfuse bench: the zoo at 1 and 2 threads", "",
             f"Written by `make bench` (`benchmarks/bench_zoo.py`): `opfuse bench zoo:MODEL --threads N "
             f"--repeat {first['repeat']} --json`, one process per row. Medians in ms of {first['repeat']} "
             f"interleaved runs per contender after {first['warmup']} warm-up rounds; fused / best peer is the "
             f"fused median over the lower of the onnxruntime and OpenVINO medians (below 1: opfuse is faster). "
             f"{first['cpus_available']} cores available; others' load: the cores' worth of CPU other "
             f"processes used during the row's timed runs (this machine is shared); "
             + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", ""]
    if ys:
        parts += [f"Yardsticks timed in the same runs (min to max over the rows): NumPy sgemm n=1024 one thread "
                  f"{_span(ys, 'sgemm_gflops', '.0f')} GFLOP/s{sgemm_note(ys)}, "
                  f"np.copyto {_span(ys, 'copy_gbps', '.1f')} GB/s (read + write).", ""]
    parts += [markdown(results)]
    scaling = scaling_markdown(results)
    if scaling:
        parts += ["Speed-up from 1 to 2 threads (median at 1 thread over median at 2 threads):", "", scaling]
    groups = groups_markdown(results)
    if groups:
        parts += ["Per-group check (kernel timers, medians; each fused group against the sum of its original ops' "
                  "unfused kernels). Memory-bound: the unfused kernels the cost model's roofline calls memory-bound "
                  "(elementwise, pools, normalisations, reorders); left fused: the memory-bound kernels left "
                  "standalone plus each fused group's time beyond its compute-bound kernels' unfused time, summed "
                  "as measured, below 0 too "
                  "(`opfuse.measure.memory_bound_removed`); removed: 1 - left / unfused, in brackets the 5th to 95th "
                  "percentile of the figure recomputed from 200 resamples of the measured rounds.", "", groups]
    if skipped:
        parts += ["Skipped: " + "; ".join(skipped) + ".", ""]
    parts += [("Outputs disagree (max abs error above 1e-3 x max(1, |output|)): " + ", ".join(disagree) + ".")
              if disagree else "Every contender's outputs agree with every other's within 1e-3 x max(1, |output|).",
              ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(ZOO))
    ap.add_argument("--threads", type=int, nargs="+", default=list(THREADS))
    ap.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--table-only", action="store_true", help="only rewrite bench.md from the JSON files")
    ap.add_argument("--no-groups", action="store_true", help="skip the per-group check at 1 thread")
    args = ap.parse_args(argv)
    args.results.mkdir(parents=True, exist_ok=True)
    failed = []
    runs = [(m, t) for m in args.models for t in args.threads]
    t_start = time.perf_counter()
    for i, (model, threads) in enumerate([] if args.table_only else runs, 1):
        t0 = time.perf_counter()
        code, err = run_one(model, threads, args.repeat, args.results, groups=threads == 1 and not args.no_groups)
        line = f"[{i}/{len(runs)}] {model} t{threads}: "
        if code in (0, 1):
            res = json.loads(json_path(model, threads, args.results).read_text())
            line += ", ".join(f"{k} {v['median_ms']:.3f} ms" for k, v in res["contenders"].items())
        if code != 0:
            failed.append(f"{model} t{threads} (exit {code}): {err.splitlines()[-1] if err else ''}")
            line += f" FAILED: {failed[-1]}"
        print(f"{line} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    results = [json.loads(json_path(m, t, args.results).read_text()) for m, t in runs
               if json_path(m, t, args.results).exists()]
    if not results:
        print("no results to tabulate", file=sys.stderr)
        return 1
    out = args.results / "bench.md"
    out.write_text(report(results))
    print(out.read_text())
    print(f"wrote {out} and {len(results)} JSON files in {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    for f in failed:
        print(f"failed: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
