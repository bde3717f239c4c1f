"""INT8 deployment: the MLPerf Tiny-shaped zoo models quantized (``opfuse quantize``) and compiled
(``compile --int8``) for the emulated Cortex-M7 and the host.

    python benchmarks/bench_int8_deploy.py                        # mobilenet_v1_025_96 resnet8 ds_cnn
    python benchmarks/bench_int8_deploy.py ds_cnn --no-host
    python benchmarks/bench_int8_deploy.py --host-only mobilenet_v1 bert_layer   # host-only models, M7 rows kept

Each model is quantized with minmax calibration on 8 seeded random inputs (int8 activations per
tensor, int8 weights per channel), then:

* **M7**: planned for ``cortex-m7`` unfused (``--no-fuse``: the float QDQ graph as imported, one
  kernel per op -- float Conv/Gemm on dequantized tensors, each Q and DQ as its Cast/Sub/Mul/Div/
  Round/Clip ops, weights dequantized at compile time; the integer recognition is a fusion and does
  not run), fused without patching (``--patch-recompute-limit 0``) and with the target's default
  plan ("patched": patch-based execution where it lowers the arena, recomputing halo rows), built
  as the standalone library and run once on QEMU's mps2-an500 (``-icount``: exact, deterministic
  instruction counts). Checked against the oracle, the NumPy reference on the unfused (float QDQ)
  graph with the same inputs: max abs error of the float output; in the first-layer case the
  largest difference of the int8 output in quantization steps (the integer kernels are within one
  step of the float QDQ arithmetic). MACs are the Conv/Gemm/MatMul multiply-accumulates of the
  graph. The arena includes the kernels' scratch; beside it the plan's own tensor lower bound, the
  issue's layer-by-layer int8 bound and TensorFlow Lite Micro's reference arena for the MLPerf
  Tiny model of that shape.
* **Host** (unless ``--no-host``; ``--host-json`` takes rows measured separately, ``--host-only`` measures
  them and keeps the M7 rows already recorded): ``opfuse bench`` of the same QDQ model, 1 thread, opfuse
  fused and unfused (the float QDQ graph, as above) against onnxruntime (interleaved runs, medians of wall
  and of process CPU time).

Writes ``benchmarks/results/int8_deploy.json`` and the "INT8 deployment" section of
``benchmarks/results/int8.md`` (between its markers; the accuracy tables above stay as they are).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np

from opfuse.compiler import CompileOptions, plan_model
from opfuse.quantization import quantize
from opfuse.runtime import mcu, reference
from opfuse.runtime.toolchain import ToolchainError

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mobilenet_v1_025_96", "resnet8", "ds_cnn")
# Measured on the host only (no M7 build: beyond the microcontroller's memory): the 224x224 CNN and a transformer
# layer whose int8 MatMuls run the host's word GEMM (codegen/qmatmul_host.py).
HOST_ONLY_MODELS = ("mobilenet_v1", "bert_layer")
CALIBRATION = 8
# Issue 15: the layer-by-layer int8 bound (largest input + output of one layer) and TFLM's arenas.
LAYER_BOUND_KIB = {"mobilenet_v1_025_96": 54.0, "resnet8": 48.0, "ds_cnn": 15.6}
TFLM_ARENA_KIB = {"mobilenet_v1_025_96": 200, "resnet8": 100, "ds_cnn": 200}
XCUBE_CYCLES_PER_MAC_VWW = 0.9
BEGIN, END = "<!-- int8-deployment:begin -->", "<!-- int8-deployment:end -->"


def macs(graph) -> int:
    total = 0
    for n in graph.nodes:
        if n.op_type == "Conv":
            w = n.input(1)
            total += math.prod(n.outputs[0].shape) * math.prod(w.shape[1:])
        elif n.op_type in ("Gemm", "MatMul"):
            a = n.input(0)
            k = a.shape[0] if n.op_type == "Gemm" and n.attrs.get("transA") else a.shape[-1]
            total += math.prod(n.outputs[0].shape) * k
    return total


def m7_row(model, opts: dict, feeds: dict, want: dict, workdir: Path) -> dict:
    comp = plan_model(model, CompileOptions(target="cortex-m7", **opts))
    program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
    res = mcu.run_on_qemu(program, feeds, workdir)
    err = max(float(np.abs(res.outputs[k].astype(np.float64) - v).max()) for k, v in want.items())
    return {"kernels": comp.report["kernels_after"], "instructions": res.instructions,
            "arena_bytes": program.arena_bytes, "arena_tensor_bytes": comp.memory.arena_bytes,
            "arena_lower_bound_bytes": comp.memory.lower_bound_bytes, "max_abs_error": err,
            "int8": comp.report.get("int8"), "smlad": "__smlad" in program.source,
            "patching": (comp.report.get("patching") or {}).get("runs", [])}


CASE_PLANS = {"unfused": {"fuse": False}, "fused": {"fuse": True, "patch_recompute_limit": 0.0},
              "patched": {"fuse": True}}


def int8_io(model):
    """The QDQ model with an int8 input and an int8 output, as on the device (the camera's int8
    image in, the int8 activation out): the input's QuantizeLinear goes, and the float output
    (kept float by the quantizer) gets a QuantizeLinear of its observed range (after a ReLU:
    ``[0, max]`` on int8's 256 steps)."""
    from onnx import TensorProto, helper, numpy_helper
    g = model.graph
    (q,) = [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == g.input[0].name]
    graph = plan_model(model, CompileOptions(fuse=False)).graph
    y = reference.run(graph, reference.random_inputs(graph, 1))
    name = g.output[0].name
    scale = np.float32(max(float(np.abs(y[name]).max()), 1e-6) / 255.0)
    g.initializer.extend([numpy_helper.from_array(np.array(scale, np.float32), "output_scale"),
                          numpy_helper.from_array(np.array(-128, np.int8), "output_zero_point")])
    g.node.append(helper.make_node("QuantizeLinear", [name, "output_scale", "output_zero_point"], [f"{name}_q"]))
    shape = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    new_in = helper.make_tensor_value_info(q.output[0], TensorProto.INT8, shape)
    new_out = helper.make_tensor_value_info(f"{name}_q", TensorProto.INT8, None)
    keep = [n for n in g.node if n is not q]
    del g.node[:]
    g.node.extend(keep)
    del g.input[:]
    g.input.append(new_in)
    del g.output[:]
    g.output.append(new_out)
    return model


def case_rows(size: int, run: bool) -> dict:
    """The seed's first-layer case (MobileNetV1 conv 3x3 s2 32, depthwise, pointwise 64) in int8."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_mcu_case import first_layers
    model = int8_io(quantize(first_layers(size), calibration_random=2).model)
    rows: dict = {}
    feeds = want = None
    for label, opts in CASE_PLANS.items():
        comp = plan_model(model, CompileOptions(target="cortex-m7", **opts))
        program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
        inp = sum(v.nbytes for v in comp.graph.inputs)
        out = sum(v.nbytes for v in comp.graph.outputs)
        row = {"kernels": comp.plan.num_kernels, "arena_bytes": program.arena_bytes, "input_bytes": inp,
               "output_bytes": out, "tensor_traffic_bytes": comp.report["bytes_after"],
               "patching": (comp.report.get("patching") or {}).get("runs", [])}
        if run:
            if feeds is None:
                feeds = reference.random_inputs(comp.graph, 0)
                want = reference.run(comp.graph, feeds)
            try:
                with tempfile.TemporaryDirectory(prefix="bench-int8-case-") as tmp:
                    res = mcu.run_on_qemu(program, feeds, Path(tmp))
            except (ToolchainError, mcu.McuRunError) as e:  # beyond the emulated board's RAM
                row["not_run"] = str(e).strip().splitlines()[-1][:200]
            else:
                row["instructions"] = res.instructions
                row["max_steps"] = max(int(np.abs(res.outputs[k].astype(np.int64) - v.astype(np.int64)).max())
                                       for k, v in want.items())
        rows[label] = row
        print(f"case {size} {label}: arena {row['arena_bytes']:,} instructions {row.get('instructions')}",
              file=sys.stderr, flush=True)
    return rows


def case_markdown(size: int, rows: dict) -> str:
    lines = [f"First layers of MobileNetV1 (conv 3x3 s2 32 + BN + ReLU, depthwise 3x3, pointwise 64) in int8 at "
             f"{size}x{size} (int8 input {kib(rows['fused']['input_bytes'])} KiB, int8 output "
             f"{kib(rows['fused']['output_bytes'])} KiB, both the caller's), emulated Cortex-M7; the seed: 401 KB "
             f"-> 180 KB peak.", "",
             "| plan | kernels | instructions | arena KiB | arena + input KiB | tensor traffic KiB "
             "| max steps vs unfused |",
             "|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        ins = f"{r['instructions']:,}" if "instructions" in r else "not run (RAM)"
        lines.append(f"| {label} | {r['kernels']} | {ins} | {kib(r['arena_bytes'])} | "
                     f"{kib(r['arena_bytes'] + r['input_bytes'])} | {kib(r['tensor_traffic_bytes'])} | "
                     f"{r.get('max_steps', r.get('bit_exact', '-'))} |")
    return "\n".join(lines)


def kib(n: float) -> str:
    return f"{n / 1024:.1f}"


def markdown(rows: list[dict], case: str = "", host_rows: dict | None = None) -> str:
    """The section: the M7 rows, then the host table (the M7 models' host rows and ``host_rows``, the models
    measured on the host only: ``HOST_ONLY_MODELS``)."""
    lines = [BEGIN, "## INT8 deployment (`compile --int8`): emulated Cortex-M7 and host", "",
             "Quantized with minmax calibration on 8 seeded random inputs; QEMU mps2-an500 `-icount` (exact "
             "instruction counts); the arena includes kernel scratch. Layer-by-layer bound and TFLM arena: "
             "issue 15's figures. X-CUBE-AI reports 0.9 cycles/MAC on VWW (cycles, not instructions: the M7 "
             "issues up to two instructions a cycle, so instructions/MAC is an upper bound on its cycles/MAC "
             "only if nothing stalls).", "",
             "| model | MACs | kernels | instr. unfused | instr. fused | instr./MAC fused | instr. patched "
             "| arena KiB unfused / fused / patched | layer-by-layer bound KiB | TFLM arena KiB "
             "| tensors between kernels | max abs err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        u, f, p = r["unfused"], r["fused"], r["patched"]
        q = f["int8"]["tensors_between_kernels"] if f.get("int8") else {}
        lines.append(f"| {r['model']} | {r['macs']:,} | {u['kernels']} -> {f['kernels']} | {u['instructions']:,} | "
                     f"{f['instructions']:,} | {f['instructions'] / r['macs']:.2f} | {p['instructions']:,} | "
                     f"{kib(u['arena_bytes'])} / {kib(f['arena_bytes'])} / {kib(p['arena_bytes'])} | "
                     f"{LAYER_BOUND_KIB[r['model']]} | {TFLM_ARENA_KIB[r['model']]} | "
                     f"{q.get('int8', 0)} int8, {q.get('other', 0)} wider | "
                     f"{max(x['max_abs_error'] for x in (u, f, p)):.1e} |")
    host = [(r["model"], r["host"]) for r in rows if r.get("host")] + sorted((host_rows or {}).items())
    if host:
        lines += ["", host_markdown(host)]
    if case:
        lines += ["", case]
    lines.append(END)
    return "\n".join(lines)


def host_markdown(rows: list[tuple[str, dict]]) -> str:
    """The host table: opfuse fused and unfused on the QDQ model and onnxruntime on the same model."""
    lines = ["Host (`opfuse bench q.onnx --vs onnxruntime --threads 1`: 1 thread, interleaved runs, medians; CPU ms "
             "is the median process CPU time of a run, what it cost where other processes shared the 2 cores): "
             "opfuse fused and unfused on the QDQ model, onnxruntime (ORT_ENABLE_ALL, no spinning) on the same QDQ "
             "model.", "",
             "| model | fused ms | unfused ms | onnxruntime ms | fused / unfused | fused / onnxruntime | fused CPU ms "
             "| onnxruntime CPU ms | CPU fused / onnxruntime | other load (cores) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, h in rows:
        if "unfused_ms" not in h:  # an older row: fused and onnxruntime only
            lines.append(f"| {model} | {h['opfuse_ms']:.3f} | - | {h['onnxruntime_ms']:.3f} | - | {h['ratio']:.2f} "
                         f"| - | - | - | - |")
            continue
        lines.append(f"| {model} | {h['opfuse_ms']:.3f} | {h['unfused_ms']:.3f} | {h['onnxruntime_ms']:.3f} | "
                     f"{h['opfuse_ms'] / h['unfused_ms']:.2f} | {h['ratio']:.2f} | {h['opfuse_cpu_ms']:.3f} | "
                     f"{h['onnxruntime_cpu_ms']:.3f} | {h['opfuse_cpu_ms'] / h['onnxruntime_cpu_ms']:.2f} | "
                     f"{h['other_cores']:.2f} |")
    return "\n".join(lines)


def host_row(name: str, repeat: int) -> dict:
    """``opfuse bench`` of the QDQ model (the M7 rows' quantization) against onnxruntime, 1 thread."""
    from opfuse.bench import bench
    qmodel = quantize(f"zoo:{name}", calibration_random=CALIBRATION).model
    r = bench(qmodel, vs="onnxruntime", threads=1, repeat=repeat, yardsticks=False)
    c = r["contenders"]
    f, u, o = c["opfuse_fused"], c["opfuse_unfused"], c["onnxruntime"]
    row = {"opfuse_ms": f["median_ms"], "unfused_ms": u["median_ms"], "onnxruntime_ms": o["median_ms"],
           "ratio": f["median_ms"] / o["median_ms"], "opfuse_cpu_ms": f["cpu_median_ms"],
           "unfused_cpu_ms": u["cpu_median_ms"], "onnxruntime_cpu_ms": o["cpu_median_ms"],
           "other_cores": r["other_processes_cores"] or 0.0, "repeat": repeat,
           "max_abs_error": {k: v["max_abs_error"] for k, v in c.items()}}
    print(f"{name} host: fused {row['opfuse_ms']:.3f} ms, unfused {row['unfused_ms']:.3f}, onnxruntime "
          f"{row['onnxruntime_ms']:.3f} (CPU {row['opfuse_cpu_ms']:.3f} / {row['onnxruntime_cpu_ms']:.3f})",
          file=sys.stderr, flush=True)
    return row


def host_only(models: list[str], repeat: int) -> int:
    """Measure the host rows and rewrite the section around the M7 rows and case already recorded in
    ``int8_deploy.json`` (no emulator run: those rows stay as they are)."""
    path = RESULTS / "int8_deploy.json"
    record = json.loads(path.read_text())
    rows = {r["model"]: r for r in record["models"]}
    host_rows = record.setdefault("host_only", {})
    for name in models:
        if name in HOST_ONLY_MODELS:
            host_rows[name] = host_row(name, repeat)
            continue
        if name not in rows:
            print(f"bench_int8_deploy: no M7 row for '{name}' in {path.name}; run without --host-only first "
                  f"(host-only models: {', '.join(HOST_ONLY_MODELS)})", file=sys.stderr)
            return 2
        rows[name]["host"] = host_row(name, repeat)
    case = record.get("case") or {}
    size = round((next(iter(case.values()))["input_bytes"] / 3) ** 0.5) if case else 0  # a 3-channel int8 image
    section = markdown(list(rows.values()), case_markdown(size, case) if case else "", host_rows)
    record["table"] = section
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    write_md(section)
    print(section)
    return 0


def write_md(section: str) -> None:
    path = RESULTS / "int8.md"
    text = path.read_text() if path.exists() else "# INT8\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--no-host", action="store_true", help="skip the host latency against onnxruntime")
    ap.add_argument("--host-json", type=Path, help="host rows measured separately ({model: {opfuse_ms, ...}})")
    ap.add_argument("--case-size", type=int, default=224, help="the first-layer case's input size (0: skip it)")
    ap.add_argument("--case-no-run", action="store_true", help="plan the first-layer case without running it")
    ap.add_argument("--host-only", action="store_true",
                    help="measure only the host rows (opfuse bench vs onnxruntime, 1 thread); keep the M7 rows "
                         "and case recorded in results/int8_deploy.json")
    ap.add_argument("--host-repeat", type=int, default=30, help="timed runs per contender on the host")
    args = ap.parse_args(argv)
    if args.host_only:
        return host_only(args.models, args.host_repeat)
    try:
        mcu.find_tools()
    except ToolchainError as e:
        print(f"bench_int8_deploy: {e}", file=sys.stderr)
        return 2
    host = json.loads(args.host_json.read_text()) if args.host_json else {}
    rows = []
    for name in args.models:
        qmodel = quantize(f"zoo:{name}", calibration_random=CALIBRATION).model
        graph = plan_model(qmodel, CompileOptions(fuse=False)).graph
        feeds = reference.random_inputs(graph, 0)
        want = reference.run(graph, feeds)
        row: dict = {"model": name, "macs": macs(graph)}
        for label, opts in CASE_PLANS.items():
            with tempfile.TemporaryDirectory(prefix=f"bench-int8-{name}-") as tmp:
                row[label] = m7_row(qmodel, opts, feeds, want, Path(tmp))
            print(f"{name} {label}: {row[label]['instructions']:,} instructions, arena {row[label]['arena_bytes']:,}",
                  file=sys.stderr, flush=True)
        if name in host:
            row["host"] = host[name]
        elif not args.no_host:
            row["host"] = host_row(name, args.host_repeat)
        rows.append(row)
    host_rows = {} if args.no_host else {name: host[name] if name in host else host_row(name, args.host_repeat)
                                         for name in HOST_ONLY_MODELS}
    case = {}
    if args.case_size:
        case = case_rows(args.case_size, not args.case_no_run)
    section = markdown(rows, case_markdown(args.case_size, case) if case else "", host_rows)
    record = {"target": "cortex-m7", "emulator": f"qemu-system-arm -M {mcu.QEMU_MACHINE} -icount "
              f"shift={mcu.ICOUNT_SHIFT}", "cflags": list(mcu.CFLAGS), "models": rows, "host_only": host_rows,
              "case": case, "table": section}
    (RESULTS / "int8_deploy.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    write_md(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
