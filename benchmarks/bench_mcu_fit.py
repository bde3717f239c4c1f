"""The Cortex-M7 cost model fitted from QEMU instruction counts: its error on held-out micro-benchmarks and
on the kernels of the three MLPerf Tiny-shaped zoo models.

    python benchmarks/bench_mcu_fit.py                  # full suite, then mobilenet_v1_025_96 resnet8 ds_cnn
    python benchmarks/bench_mcu_fit.py --suite quick --out /tmp/fit.json

Fits exactly as ``opfuse profile --target cortex-m7 --fit`` does (``opfuse.mcufit.fit_m7``: every kernel
of the micro-benchmark suite, unfused and fused, counted under QEMU ``-icount``; every 4th graph held
out), in a private cache directory (the user's saved fit is untouched). Then each zoo model is compiled
for the Cortex-M7 as ``opfuse compile --target cortex-m7`` does (patching included), built with
per-kernel marks, run once, and every kernel's measured instructions are set beside the fitted model's
prediction. The zoo models are not in the fit: their errors are out of sample. Patched kernels (banded
runs) recompute halo rows the group's FLOPs do not count, so they are listed apart.

Writes ``benchmarks/results/mcu_fit.json`` and prints markdown tables.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "mcu_fit.json"
MODELS = ("mobilenet_v1_025_96", "resnet8", "ds_cnn")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--suite", default="full", choices=("full", "quick"))
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    os.environ["OPFUSE_CACHE_DIR"] = tempfile.mkdtemp(prefix="opfuse-mcu-fit-")
    from opfuse import mcufit
    from opfuse.runtime import mcu
    from opfuse.runtime.toolchain import ToolchainError
    try:
        mcu.find_tools()
    except ToolchainError as e:
        print(f"bench_mcu_fit: {e}", file=sys.stderr)
        return 2
    fit = mcufit.fit_m7(args.suite, save=False)
    print(mcufit.format_fit(fit))
    result: dict = {"suite": args.suite, "fit": fit.summary(), "models": {}}
    rows = []
    for name in args.models:
        samples, costs = mcufit.model_kernel_errors(f"zoo:{name}", fit.costs)
        plain = [s for s in samples if not s.patched]
        patched = [s for s in samples if s.patched]
        result["models"][name] = {"plain": mcufit.error_summary(plain, costs),
                                  "patched": mcufit.error_summary(patched, costs),
                                  "all": mcufit.error_summary(samples, costs),
                                  "kernels": [s.to_dict(costs) for s in samples]}
        rows.append((name, result["models"][name]))
    print("\n| model | kernels (patched) | measured | predicted | total error | per-kernel median abs error "
          "(plain / patched) | max (plain) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows:
        a, p, q = r["all"], r["plain"], r["patched"]
        print(f"| {name} | {a['kernels']} ({q['kernels']}) | {a['measured_instructions']:,} | "
              f"{a['predicted_instructions']:,} | {a['total_error']:+.1%} | {p['median_abs_error']:.1%} / "
              + (f"{q['median_abs_error']:.1%}" if q["kernels"] else "-") + f" | {p['max_abs_error']:.1%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
