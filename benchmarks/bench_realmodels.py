"""The real third-party models (``opfuse.testing.realmodels``): what fuses, how close, how fast.

    python benchmarks/bench_realmodels.py                      # every model, 1 thread, 30 rounds
    python benchmarks/bench_realmodels.py ppocr_det --threads 2 --repeat 50
    python benchmarks/bench_realmodels.py --table-only         # redo realmodels.md from the JSON

For each model, on its fixed input (a synthetic text page preprocessed as its package does, at
the shape in ``realmodels.MODELS``): the ONNX file's node count and op types; the kernels before
(one per op after import) and after fusion, and the fused groups (kernels of more than one op);
the max abs error of the fused and the unfused C build against onnxruntime and whether each is
within rtol 1e-3 / atol 1e-4; and the median latency of opfuse fused, unfused and onnxruntime,
timed interleaved in one process by ``opfuse.bench.bench`` (its cross-check and the other
processes' load are kept in the JSON). Writes ``benchmarks/results/realmodels.json`` and
``benchmarks/results/realmodels.md``. Exits 1 when a model's outputs are out of tolerance, 2 when
the models cannot be fetched.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from opfuse.testing import realmodels

RESULTS = Path(__file__).resolve().parent / "results"
RTOL, ATOL = 1e-3, 1e-4
DEFAULT_REPEAT = 30


def within(ours: list[np.ndarray], theirs: list[np.ndarray]) -> tuple[float, bool]:
    """Max abs error over the outputs and whether every element is within RTOL/ATOL of onnxruntime's."""
    err = max(float(np.max(np.abs(a.astype(np.float64) - b))) for a, b in zip(ours, theirs, strict=True))
    ok = all(np.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(ours, theirs, strict=True))
    return err, ok


def measure(key: str, path: Path, threads: int, repeat: int) -> dict:
    import opfuse
    from opfuse.bench import bench
    m = realmodels.MODELS[key]
    proto = onnx.load(path, load_external_data=False)
    ops = Counter(n.op_type for n in proto.graph.node)
    feeds = realmodels.sample_inputs(m)
    theirs = realmodels.onnxruntime_outputs(path, feeds)
    shapes = {m.input_name: m.shape}
    row: dict = {"model": key, "file": Path(m.member).name, "package": f"{m.wheel.package}=={m.wheel.version}",
                 "description": m.description, "input_shape": list(m.shape), "nodes": len(proto.graph.node),
                 "op_types": dict(sorted(ops.items())), "opset": max(o.version for o in proto.opset_import
                                                                     if o.domain in ("", "ai.onnx"))}
    for fuse, label in ((True, "fused"), (False, "unfused")):
        compiled = opfuse.compile(path, fuse=fuse, input_shapes=shapes, threads=threads)
        err, ok = within(list(compiled.run(feeds).values()), theirs)
        rep = compiled.report
        row[label] = {"kernels": rep["kernels_after"], "max_abs_error": err, "within_tolerance": ok}
        if fuse:
            fused = [g for g in rep["groups"] if len(g["nodes"]) > 1]
            row.update(kernels_before=rep["kernels_before"], kernels_after=rep["kernels_after"],
                       fused_groups=len(fused), rules=dict(sorted(Counter(g["rule"] for g in fused).items())),
                       arena_bytes=rep["arena_bytes"])
    b = bench(str(path), vs=("onnxruntime",), threads=threads, repeat=repeat, input_shapes=shapes, inputs=feeds)
    row["latency_ms"] = {name: c["median_ms"] for name, c in b["contenders"].items()}
    row["cpu_ms"] = {name: c["cpu_median_ms"] for name, c in b["contenders"].items()}
    row["bench"] = {k: b[k] for k in ("threads", "repeat", "warmup", "ratios", "errors", "other_processes_cores",
                                      "cpus_available")}
    return row


def markdown(rows: list[dict]) -> str:
    head = ["model", "package", "input", "nodes", "op types", "kernels before", "kernels after", "fused groups",
            "max err fused", "max err unfused", "fused ms", "unfused ms", "onnxruntime ms", "fused / ort",
            "CPU ms fused / unfused / ort", "fused / ort (CPU)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lat, cpu = r["latency_ms"], r["cpu_ms"]
        lines.append("| " + " | ".join([
            r["model"], r["package"], "x".join(map(str, r["input_shape"])), str(r["nodes"]), str(len(r["op_types"])),
            str(r["kernels_before"]), str(r["kernels_after"]), str(r["fused_groups"]),
            f"{r['fused']['max_abs_error']:.2g}" + ("" if r["fused"]["within_tolerance"] else " (OUT)"),
            f"{r['unfused']['max_abs_error']:.2g}" + ("" if r["unfused"]["within_tolerance"] else " (OUT)"),
            f"{lat['opfuse_fused']:.2f}", f"{lat['opfuse_unfused']:.2f}", f"{lat['onnxruntime']:.2f}",
            f"{lat['opfuse_fused'] / lat['onnxruntime']:.2f}",
            f"{cpu['opfuse_fused']:.2f} / {cpu['opfuse_unfused']:.2f} / {cpu['onnxruntime']:.2f}",
            f"{cpu['opfuse_fused'] / cpu['onnxruntime']:.2f}"]) + " |")
    t = rows[0]["bench"] if rows else {}
    load = [r["bench"]["other_processes_cores"] for r in rows if r["bench"].get("other_processes_cores") is not None]
    lines += ["", f"Medians of {t.get('repeat')} interleaved rounds (fused, unfused, onnxruntime) after "
              f"{t.get('warmup')} warm-up rounds, {t.get('threads')} thread(s) each, in one process "
              f"(`opfuse.bench.bench`); onnxruntime with ORT_ENABLE_ALL; unfused is one kernel per imported "
              f"op, without the rewrites (BatchNorm folding, ConvTranspose as Conv). Wall-clock medians, then the "
              f"medians of each call's process CPU time, which other processes' load (here "
              f"{min(load, default=0):.1f} to {max(load, default=0):.1f} of {t.get('cpus_available')} cores "
              f"busy meanwhile) inflates less. Errors: max abs difference to "
              f"onnxruntime on the model's fixed input, tolerance rtol {RTOL:g} / atol {ATOL:g} "
              f"(OUT: outside it). Rules of the fused groups:", ""]
    for r in rows:
        lines.append(f"- {r['model']} ({r['description']}): " + ", ".join(f"{k} {v}" for k, v in r["rules"].items()))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help=f"keys (default: all of {', '.join(realmodels.MODELS)})")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--table-only", action="store_true", help="rewrite the markdown table from the JSON")
    args = ap.parse_args(argv)
    out_json, out_md = args.results / "realmodels.json", args.results / "realmodels.md"
    if args.table_only:
        rows = json.loads(out_json.read_text())["models"]
    else:
        unknown = [k for k in args.models if k not in realmodels.MODELS]
        if unknown:
            print(f"bench_realmodels: unknown model(s) {unknown}; choose from {list(realmodels.MODELS)}",
                  file=sys.stderr)
            return 2
        try:
            paths = realmodels.fetch(args.models or None)
        except realmodels.ModelsUnavailable as e:
            print(f"bench_realmodels: {e}", file=sys.stderr)
            return 2
        rows = []
        for key in args.models or list(realmodels.MODELS):
            print(f"{key}...", file=sys.stderr, flush=True)
            rows.append(measure(key, paths[key], args.threads, args.repeat))
        args.results.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps({"models": rows}, indent=1) + "\n")
    out_md.write_text(markdown(rows))
    print(markdown(rows))
    ok = all(r["fused"]["within_tolerance"] and r["unfused"]["within_tolerance"] for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
