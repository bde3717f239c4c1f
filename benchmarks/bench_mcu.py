"""Cortex-M7 benchmark under QEMU: per MLPerf Tiny-shaped zoo model, the unfused plan, the fused one
and the fused one with patch-based execution, as executed instructions, arena bytes and flash bytes.

    python benchmarks/bench_mcu.py                              # mobilenet_v1_025_96 resnet8 ds_cnn
    python benchmarks/bench_mcu.py resnet8 --out /tmp/mcu.json

The plans are made for the ``cortex-m7`` target (``opfuse compile --target cortex-m7``, with
``--no-fuse`` for the baseline and ``--patch-recompute-limit 0`` for the fused plan without patching;
"patched" is the target's default), built as the standalone library and run once on QEMU's
mps2-an500 on the same seeded inputs. Instructions are exact (``-icount``, see
``opfuse.runtime.mcu``) and deterministic, so one run each suffices. The arena includes the
kernels' scratch; beside it is the layer-by-layer lower bound of the plan's tensors
(``arena_lower_bound_bytes``: the most bytes live at one kernel). Patched runs (``memory.patch``)
go below the fused plan's bound; what they cost is the extra instructions (recomputed halo rows and
row copies), shown against the fused plan. Flash is the library's code
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


PLANS = {"unfused": {"fuse": False}, "fused": {"fuse": True, "patch_recompute_limit": 0.0},
         "patched": {"fuse": True}}


def measure(model: str, plan: dict, feeds: dict, ref: dict, workdir: Path, host_check: bool) -> tuple[dict, dict]:
    comp = plan_model(f"zoo:{model}", CompileOptions(target="cortex-m7", **plan))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    res = mcu.run_on_qemu(program, feeds, workdir)
    row = {"kernels": comp.report["kernels_after"], **res.summary(),
           "arena_tensor_bytes": comp.memory.arena_bytes,
           "arena_lower_bound_bytes": comp.memory.lower_bound_bytes,
           "weights_bytes": len(program.weights),
           "predicted_latency_s": comp.report.get("predicted_latency_s"),
           "main_memory_bytes": comp.report["bytes_after"],
           "max_rel_error": max_rel_error(res.outputs, ref),
           "patching": comp.report.get("patching")}
    if host_check:
        host = build(comp.graph, comp.plan, memory=comp.memory, options=PORTABLE).run(feeds)
        row["bit_identical_to_host"] = all(res.outputs[k].tobytes() == v.tobytes() for k, v in host.items())
    return row, res.outputs


def kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def markdown(rows: list[dict]) -> str:
    head = ("| model | kernels | instructions unfused | instructions fused | change | instructions patched "
            "| recompute overhead | arena unfused KiB (bound) | arena fused KiB (bound) | arena patched KiB "
            "| vs fused bound | patched runs | flash KiB | stack B | checks |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        u, f, p = r["unfused"], r["fused"], r["patched"]
        change = (f["instructions"] - u["instructions"]) / u["instructions"] * 100
        overhead = (p["instructions"] - f["instructions"]) / f["instructions"] * 100
        below = (p["arena_bytes"] - f["arena_lower_bound_bytes"]) / f["arena_lower_bound_bytes"] * 100
        runs = (p.get("patching") or {}).get("runs", [])
        described = "; ".join(f"{len(x['groups'])} layers/{x['bands']} bands" for x in runs[:3]) + \
            (f"; +{len(runs) - 3} more" if len(runs) > 3 else "") or "none"
        ok = all(x.get("bit_identical_to_host", True) and x["max_rel_error"] <= RTOL for x in (u, f, p))
        same = "patched = fused bit for bit, " if p.get("same_as_fused") else ""
        checks = same + ("bit-identical to host, " if "bit_identical_to_host" in f else "") + \
            f"rel err {max(x['max_rel_error'] for x in (u, f, p)):.1e}" + ("" if ok else " FAIL")
        lines.append(f"| {r['model']} | {u['kernels']} -> {f['kernels']} | {u['instructions']:,} | "
                     f"{f['instructions']:,} | {change:+.1f}% | {p['instructions']:,} | {overhead:+.1f}% | "
                     f"{kib(u['arena_bytes'])} ({kib(u['arena_lower_bound_bytes'])}) | {kib(f['arena_bytes'])} "
                     f"({kib(f['arena_lower_bound_bytes'])}) | {kib(p['arena_bytes'])} | {below:+.1f}% | {described} | "
                     f"{kib(p['flash_bytes'])} | {p['stack_bytes']} | {checks} |")
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
        outputs = {}
        for label, plan in PLANS.items():
            with tempfile.TemporaryDirectory(prefix=f"bench-mcu-{model}-") as tmp:
                row[label], outputs[label] = measure(model, plan, feeds, ref, Path(tmp), not args.no_host_check)
            print(f"{model} {label}: {row[label]['instructions']:,} instructions, arena "
                  f"{row[label]['arena_bytes']:,} bytes", file=sys.stderr, flush=True)
        row["patched"]["same_as_fused"] = all(outputs["patched"][k].tobytes() == v.tobytes()
                                              for k, v in outputs["fused"].items())
        rows.append(row)
    table = markdown(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"target": "cortex-m7", "emulator": f"qemu-system-arm -M {mcu.QEMU_MACHINE} "
                                    f"-icount shift={mcu.ICOUNT_SHIFT}", "cflags": list(mcu.CFLAGS),
                                    "models": rows, "table": table}, indent=1) + "\n")
    print(table)
    bad = [r["model"] for r in rows for x in (r["unfused"], r["fused"], r["patched"])
           if not x.get("bit_identical_to_host", True) or x["max_rel_error"] > RTOL]
    bad += [r["model"] for r in rows if not r["patched"]["same_as_fused"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
