"""INT8 Concat at the output's scale: the zoo models with a Concat quantized with each Concat input's own
parameters and with the Concat's (``quantize(..., share_concat_scales=...)``), side by side.

    python benchmarks/bench_int8_concat.py                    # yolo_block
    python benchmarks/bench_int8_concat.py yolo_block --calibration 32 --report-samples 200

Per model and setting: whether the import's ``int8_concat`` rule rewrites the Concat (a Concat of the
8-bit tensors, aliased in place) or refuses it (a requantizing Concat kernel), the kernel count and arena
of the host plan and of the Cortex-M7 plan (fused, no patching; generated, not run), and the accuracy
report against the float model (``quantization/accuracy.py``: cosine, max and mean abs error, SQNR of the
output over seeded random inputs). Writes ``benchmarks/results/int8_concat.md``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opfuse.compiler import CompileOptions, plan_model
from opfuse.quantization import quantize
from opfuse.runtime import mcu

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("yolo_block",)  # the zoo models with a Concat


def row(name: str, share: bool, calibration: int, samples: int) -> dict:
    r = quantize(f"zoo:{name}", calibration_random=calibration, report=True, report_samples=samples,
                 share_concat_scales=share)
    host = plan_model(r.model)
    verdicts = [d.verdict for d in host.decisions if d.rule == "int8_concat"]
    m7 = plan_model(r.model, CompileOptions(target="cortex-m7", patch_recompute_limit=0.0))
    program = mcu.generate_mcu(m7.graph, m7.plan, m7.memory)
    (out,) = r.report["outputs"].values()
    return {"model": name, "share": share, "shared": len(r.shared), "int8_concat": ", ".join(verdicts) or "-",
            "host_kernels": host.plan.num_kernels, "host_arena": host.memory.arena_bytes,
            "m7_kernels": m7.plan.num_kernels, "m7_arena": program.arena_bytes, **out}


def markdown(rows: list[dict], calibration: int, samples: int) -> str:
    lines = ["# INT8 Concat at the output's scale", "",
             f"`python benchmarks/bench_int8_concat.py --calibration {calibration} --report-samples {samples}`: "
             f"minmax calibration on {calibration} seeded random inputs, the accuracy report over {samples} "
             "others. `own`: each Concat input keeps its calibrated parameters; `shared`: the inputs (and the "
             "tensors whose scale they carry) take the Concat output's, so the Concat is exact in 8 bits. "
             "Arenas in KiB; the M7 plan fused without patching (generated, not run).", "",
             "| model | Concat inputs' parameters | tensors moved | int8_concat | host kernels | host arena | "
             "M7 kernels | M7 arena | cosine min | max abs err | mean abs err | SQNR dB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {'shared' if r['share'] else 'own'} | {r['shared']} | {r['int8_concat']} | "
                     f"{r['host_kernels']} | {r['host_arena'] / 1024:.1f} | {r['m7_kernels']} | "
                     f"{r['m7_arena'] / 1024:.1f} | {r['cosine_min']:.5f} | {r['max_abs_error']:.4g} | "
                     f"{r['mean_abs_error']:.4g} | {r['sqnr_db']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--calibration", type=int, default=32, help="seeded random calibration inputs")
    ap.add_argument("--report-samples", type=int, default=200, help="seeded random inputs of the accuracy report")
    args = ap.parse_args(argv)
    rows = []
    for name in args.models:
        for share in (False, True):
            rows.append(row(name, share, args.calibration, args.report_samples))
            print(rows[-1]["model"], "shared" if share else "own", {k: rows[-1][k] for k in (
                "int8_concat", "host_kernels", "m7_arena", "cosine_min", "max_abs_error")}, file=sys.stderr, flush=True)
    text = markdown(rows, args.calibration, args.report_samples)
    (RESULTS / "int8_concat.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
