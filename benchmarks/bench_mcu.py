"""Cortex-M7 benchmark under QEMU: per MLPerf Tiny-shaped zoo model, the unfused plan vs the
fused one, as executed instructions, arena bytes and flash bytes.

    python benchmarks/bench_mcu.py                              # mobilenet_v1_025_96 resnet8 ds_cnn
    python benchmarks/bench_mcu.py resnet8 --out /tmp/mcu.json

Both plans are made for the ``cortex-m7`` target (``opfuse compile --target cortex-m7``, with
``--no-fuse`` for the baseline), built as the standalone library and run once on QEMU's
mps2-an500 on the same seeded inputs. Instructions are exact (``-icount``, see
``opfuse.runtime.mcu``) and deterministic, so one run each suffices. The arena includes the
kernels' scratch; beside it is the layer-by-layer lower bound of the plan's tensors
(``arena_lower_bound_bytes``: the most bytes live at one kernel). Flash is the library's code
and weights as arm-none-eabi-gcc builds them. Every run is checked: bit for bit against the host
build of the same plan, and against the NumPy reference (relative error).

Writes ``benchmarks/results/mcu.json`` and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from opfuse.api import load
from opfuse.compiler import CompileOptions, plan_model
from opfuse.runtime import mcu, reference
from opfuse.runtime.native import build
from opfuse.runtime.toolchain import ToolchainError
from opfuse.codegen.options import PORTABLE

RESULTS = Path(__file__).resolve().parent / "results" / "mcu.json"
MODELS = ("mobilenet_v1_025_96", "resnet8", "ds_cnn")
RTOL = 1e-4


def max_rel_error(got: dict, want: dict) -> float:
    worst = 0.0
    for k, w in want.items():
        w64 = np.asarray(w, dtype=np.float64)
        err = np.abs(got[k].astype(np.float64) - w64) / np.maximum(np.abs(w64), 1e-6)
        worst = max(worst, float(err.max()))
    return worst


def measure(model: str, fuse: bool, feeds: dict, ref: dict, workdir: Path, host_check: bool) -> dict:
    comp = plan_model(f"zoo:{model}", CompileOptions(target="cortex-m7", fuse=fuse))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    res = mcu.run_on_qemu(program, feeds, workdir)
    row = {"kernels": comp.report["kernels_after"], **res.summary(),
           "arena_tensor_bytes": comp.memory.arena_bytes,
           "arena_lower_bound_bytes": comp.memory.lower_bound_bytes,
           "weights_bytes": len(program.weights),
           "predicted_latency_s": comp.report.get("predicted_latency_s"),
           "main_memory_bytes": comp.report["bytes_after"],
           "max_rel_error": max_rel_error(res.outputs, ref)}
    if host_check:
        host = build(comp.graph, comp.plan, memory=comp.memory, options=PORTABLE).run(feeds)
        row["bit_identical_to_host"] = all(res.outputs[k].tobytes() == v.tobytes() for k, v in host.items())
    return row


def kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def markdown(rows: list[dict]) -> str:
    head = ("| model | kernels | instructions unfused | instructions fused | change | arena unfused KiB (bound) "
            "| arena fused KiB (bound) | flash KiB | stack B | checks |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        u, f = r["unfused"], r["fused"]
        change = (f["instructions"] - u["instructions"]) / u["instructions"] * 100
        ok = all(x.get("bit_identical_to_host", True) and x["max_rel_error"] <= RTOL for x in (u, f))
        checks = ("bit-identical to host, " if "bit_identical_to_host" in f else "") + \
            f"rel err {max(u['max_rel_error'], f['max_rel_error']):.1e}" + ("" if ok else " FAIL")
        lines.append(f"| {r['model']} | {u['kernels']} -> {f['kernels']} | {u['instructions']:,} | "
                     f"{f['instructions']:,} | {change:+.1f}% | {kib(u['arena_bytes'])} "
                     f"({kib(u['arena_lower_bound_bytes'])}) | {kib(f['arena_bytes'])} "
                     f"({kib(f['arena_lower_bound_bytes'])}) | {kib(f['flash_bytes'])} | {f['stack_bytes']} | "
                     f"{checks} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-host-check", action="store_true", help="skip the bit-for-bit check against the host build")
    args = ap.parse_args(argv)
    try:
        mcu.find_tools()
    except ToolchainError as e:
        print(f"bench_mcu: {e}", file=sys.stderr)
        return 2
    rows = []
    for model in args.models:
        graph = load(f"zoo:{model}")
        feeds = reference.random_inputs(graph, 0)
        ref = reference.run(graph, feeds)
        row: dict = {"model": model}
        for label, fuse in (("unfused", False), ("fused", True)):
            with tempfile.TemporaryDirectory(prefix=f"bench-mcu-{model}-") as tmp:
                row[label] = measure(model, fuse, feeds, ref, Path(tmp), not args.no_host_check)
            print(f"{model} {label}: {row[label]['instructions']:,} instructions, arena "
                  f"{row[label]['arena_bytes']:,} bytes", file=sys.stderr, flush=True)
        rows.append(row)
    table = markdown(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target": "cortex-m7", "emulator": f"qemu-system-arm -M {mcu.QEMU_MACHINE} "
                                    f"-icount shift={mcu.ICOUNT_SHIFT}", "cflags": list(mcu.CFLAGS),
                                    "models": rows, "table": table}, indent=1) + "\n")
    print(table)
    bad = [r["model"] for r in rows for x in (r["unfused"], r["fused"])
           if not x.get("bit_identical_to_host", True) or x["max_rel_error"] > RTOL]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
