"""The seed's case study on the emulated Cortex-M7: MobileNetV1's first layers (Conv 3x3 s2 32 + BN +
ReLU, depthwise 3x3 + BN + ReLU, pointwise 1x1 64 + BN + ReLU), unfused vs fused vs patched.

    python benchmarks/bench_mcu_case.py                 # the largest input that fits 512 KiB, and 224x224
    python benchmarks/bench_mcu_case.py --size 56 --out /tmp/case.json

The seed's device has 512 KB of SRAM; in float32 a 224x224 input does not fit (the first layer's output
alone is 1.5 MiB), so the run is at the largest square input (a multiple of 8) whose fused plan fits:
arena plus the caller's input and output buffers, which on the device are SRAM too ("peak SRAM"). Each
plan is built as the standalone library and run once under QEMU (``-icount``: exact instructions),
checked bit for bit (patched against fused) and against the NumPy reference (rtol 1e-4, atol 1e-5 of
the output's largest magnitude). "Tensor traffic" is the
bytes kernels read and write in tensors between kernels (the fusion report's ``bytes_after``, whole
tensors once per read); a patched run moves its input rows (halo rows once per band that reads them)
and its output once, and keeps everything else in its band workspace. The 224x224 lines are the same
three plans made and generated (not run): the arena each would need.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from opfuse.compiler import CompileOptions, plan_model
from opfuse.memory.patch import PATCHED_KIND
from opfuse.ops import GraphBuilder
from opfuse.runtime import mcu, reference
from opfuse.runtime.toolchain import ToolchainError

RESULTS = Path(__file__).resolve().parent / "results" / "mcu_case.json"
SRAM_BYTES = 512 * 1024
RTOL = 1e-4
ATOL = 1e-5  # of the output's largest magnitude
PLANS = {"unfused": {"fuse": False}, "fused": {"fuse": True, "patch_recompute_limit": 0.0},
         "patched": {"fuse": True}}


def first_layers(size: int):
    """MobileNetV1 (width 1.0) up to its first pointwise convolution, BatchNorm unfolded."""
    rng = np.random.default_rng(0)
    b = GraphBuilder(f"mobilenet_v1_head_{size}")

    def w(name, *shape):
        return b.const(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    def bn(x, c, name):
        var = b.const(f"{name}_var", (rng.random(c) + 0.5).astype(np.float32))
        return b.op("BatchNormalization", x, w(f"{name}_g", c), w(f"{name}_b", c), w(f"{name}_m", c), var, name=name)

    x = b.input("input", (1, 3, size, size))
    y = b.op("Relu", bn(b.op("Conv", x, w("conv1_w", 32, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1], name="conv1"),
                        32, "conv1_bn"), name="conv1_relu")
    y = b.op("Relu", bn(b.op("Conv", y, w("dw1_w", 32, 1, 3, 3), group=32, pads=[1, 1, 1, 1], name="dw1"),
                        32, "dw1_bn"), name="dw1_relu")
    y = b.op("Relu", bn(b.op("Conv", y, w("pw1_w", 64, 32, 1, 1), name="pw1"), 64, "pw1_bn"), name="pw1_relu")
    return b.build(y)


def traffic(comp) -> int:
    """Tensor bytes between kernels: the fusion report's, with each patched run's rows instead."""
    total = comp.report["bytes_after"]
    for g in comp.plan.groups:
        if g.kind != PATCHED_KIND:
            continue
        sched = g.attrs["patch"]
        inside = sum(v.nbytes for m in sched.members for v, _ in m.inputs) + \
            sum(m.output.nbytes for m in sched.members)
        rows = sum((hi - lo) * v.nbytes // v.shape[2] for b in sched.bands for v in sched.inputs
                   for n, lo, hi in b.ranges if n == v.name)
        total += rows + sched.output.nbytes - inside
    return total


def plan(size: int, label: str):
    graph = first_layers(size)
    comp = plan_model(graph, CompileOptions(target="cortex-m7", **PLANS[label]))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    io = sum(v.nbytes for v in list(comp.graph.inputs) + list(comp.graph.outputs))
    return graph, comp, program, {"kernels": comp.plan.num_kernels, "arena_bytes": program.arena_bytes,
                                  "peak_sram_bytes": program.arena_bytes + io, "tensor_traffic_bytes": traffic(comp),
                                  "patching": comp.report.get("patching", {}).get("runs", [])}


def fitting_size() -> int:
    for size in range(224, 7, -8):
        if plan(size, "fused")[3]["peak_sram_bytes"] <= SRAM_BYTES:
            return size
    raise SystemExit("bench_mcu_case: nothing fits")


def kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def markdown(size: int, rows: dict, big: dict) -> str:
    f = rows["fused"]
    lines = [f"Input {size}x{size}x3 (float32), emulated Cortex-M7 (QEMU mps2-an500):", "",
             "| plan | kernels | instructions | vs fused | arena KiB | peak SRAM KiB (arena + input + output) "
             "| tensor traffic KiB |", "|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['kernels']} | {r['instructions']:,} | "
                     f"{(r['instructions'] - f['instructions']) / f['instructions'] * 100:+.1f}% | "
                     f"{kib(r['arena_bytes'])} | {kib(r['peak_sram_bytes'])} | {kib(r['tensor_traffic_bytes'])} |")
    lines += ["", "At 224x224 (planned and generated, not run): " + ", ".join(
        f"{label} arena {kib(r['arena_bytes'])} KiB (peak SRAM {kib(r['peak_sram_bytes'])} KiB)"
        for label, r in big.items()) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, help="input height and width (default: the largest that fits 512 KiB)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    try:
        mcu.find_tools()
    except ToolchainError as e:
        print(f"bench_mcu_case: {e}", file=sys.stderr)
        return 2
    size = args.size or fitting_size()
    rows: dict = {}
    outputs: dict = {}
    for label in PLANS:
        graph, comp, program, row = plan(size, label)
        feeds = reference.random_inputs(graph, 0)
        want = reference.run(graph, feeds)
        with tempfile.TemporaryDirectory(prefix="bench-mcu-case-") as tmp:
            res = mcu.run_on_qemu(program, feeds, Path(tmp))
        row["instructions"] = res.instructions
        # Against the reference: |got - want| <= ATOL * max|want| + RTOL * |want| (outputs after ReLU have
        # values near 0, where the float32 sums' rounding is all there is to a relative error).
        row["within_tolerance"] = all(np.allclose(res.outputs[k], v, rtol=RTOL, atol=ATOL * float(np.abs(v).max()))
                                      for k, v in want.items())
        row["max_abs_error_vs_scale"] = max(float(np.abs(res.outputs[k] - v).max() / np.abs(v).max())
                                            for k, v in want.items())
        outputs[label] = res.outputs
        rows[label] = row
        print(f"{label}: {res.instructions:,} instructions, arena {row['arena_bytes']:,} bytes", file=sys.stderr)
    rows["patched"]["bit_identical_to_fused"] = all(outputs["patched"][k].tobytes() == v.tobytes()
                                                    for k, v in outputs["fused"].items())
    big = {label: plan(224, label)[3] for label in PLANS}
    table = markdown(size, rows, big)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"size": size, "sram_bytes": SRAM_BYTES, "plans": rows, "at_224": big,
                                    "table": table}, indent=1) + "\n")
    print(table)
    bad = [k for k, r in rows.items() if not r["within_tolerance"] or not r.get("bit_identical_to_fused", True)]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
