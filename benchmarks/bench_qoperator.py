"""onnxruntime's own quantizer, QOperator format against QDQ format, on the zoo CNNs: what opfuse builds of each.

    python benchmarks/bench_qoperator.py                       # resnet8 ds_cnn mobilenet_v1_025_96
    python benchmarks/bench_qoperator.py resnet8 --no-m7 --repeat 10

Each float zoo model goes through onnxruntime's ``quant_pre_process`` (BatchNorm folded into the Convs, as
onnxruntime recommends; symbolic shape inference skipped) and ``quantize_static`` (per channel, int8 weights,
uint8 activations, 4 seeded random calibration inputs) twice: ``QuantFormat.QOperator`` (QLinearConv and the
com.microsoft QLinear* ops, ``frontend/onnx_qoperator.py``) and ``QuantFormat.QDQ``. For each q.onnx:

* kernels of the fused host plan (and unfused), how many integer convs/matmuls run a fixed-point
  ``Requantize``, the host arena;
* **steps**: the largest difference, in quantization steps, between the 8-bit model output (the tensor the
  last DequantizeLinear reads) and onnxruntime's on the same q.onnx and a seeded random input, unfused and fused;
* **host**: ``opfuse bench`` of the q.onnx against onnxruntime running the same file, 1 thread, interleaved
  runs, medians of wall time and of process CPU time;
* **M7** (unless ``--no-m7``): the default Cortex-M7 plan run once on QEMU (mps2-an500, ``-icount``: exact
  instruction counts), its arena (kernel scratch included) and its steps from onnxruntime.

Writes ``benchmarks/results/qoperator.json`` and the table section of ``benchmarks/results/qoperator.md``
(between its markers).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

import opfuse
from opfuse.api import onnx_proto
from opfuse.bench import bench
from opfuse.compiler import CompileOptions, plan_model
from opfuse.runtime import mcu

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("resnet8", "ds_cnn", "mobilenet_v1_025_96")
CALIBRATION = 4
BEGIN, END = "<!-- qoperator-table:begin -->", "<!-- qoperator-table:end -->"


def quantized(name: str, tmp: Path) -> dict[str, onnx.ModelProto]:
    """``{"QOperator": q.onnx, "QDQ": q.onnx}`` of zoo model ``name``, as onnxruntime's quantizer writes them."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    onnx.save_model(onnx_proto(f"zoo:{name}"), tmp / "f.onnx")
    quant_pre_process(str(tmp / "f.onnx"), str(tmp / "pre.onnx"), skip_symbolic_shape=True)
    inp = onnx.load(tmp / "pre.onnx").graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    samples = [{inp.name: rng.standard_normal(shape).astype(np.float32)} for _ in range(CALIBRATION)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples)

        def get_next(self):
            return next(self.it, None)

    out = {}
    for label, fmt in (("QOperator", QuantFormat.QOperator), ("QDQ", QuantFormat.QDQ)):
        quantize_static(str(tmp / "pre.onnx"), str(tmp / f"{label}.onnx"), Reader(), quant_format=fmt,
                        per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        out[label] = onnx.load(tmp / f"{label}.onnx")
    return out


def with_8bit_output(m: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """``m`` with the tensor its last DequantizeLinear reads as a second output, and that tensor's name."""
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    (dq,) = [n for n in m2.graph.node if n.output[0] == m2.graph.output[0].name]
    elem = {t.name: t.data_type for t in m2.graph.initializer}[dq.input[2]]
    m2.graph.output.append(onnx.helper.make_tensor_value_info(dq.input[0], elem, None))
    return m2, dq.input[0]


def _ort(m: onnx.ModelProto, feeds: dict) -> dict:
    import onnxruntime as ort
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))


def _steps(a: np.ndarray, b: np.ndarray) -> int:
    return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())


def row(name: str, label: str, model: onnx.ModelProto, repeat: int, m7: bool) -> dict:
    m, q = with_8bit_output(model)
    inp = m.graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    feeds = {inp.name: np.random.default_rng(9).standard_normal(shape).astype(np.float32)}
    theirs = _ort(m, feeds)[q]
    fused = plan_model(m, CompileOptions())
    r = {"model": name, "format": label, "kernels": fused.plan.num_kernels,
         "kernels_unfused": plan_model(m, CompileOptions(fuse=False)).plan.num_kernels,
         "requantize": sum(n.op_type == "Requantize" for n in fused.graph.nodes),
         "host_arena_bytes": fused.memory.arena_bytes,
         "steps_unfused": _steps(opfuse.compile(m, fuse=False).run(feeds)[q], theirs),
         "steps_fused": _steps(opfuse.compile(m).run(feeds)[q], theirs)}
    if repeat:
        c = bench(model, vs="onnxruntime", threads=1, repeat=repeat, yardsticks=False)["contenders"]
        f, u, o = c["opfuse_fused"], c["opfuse_unfused"], c["onnxruntime"]
        r.update(host_ms=f["median_ms"], unfused_ms=u["median_ms"], onnxruntime_ms=o["median_ms"],
                 host_cpu_ms=f["cpu_median_ms"], onnxruntime_cpu_ms=o["cpu_median_ms"])
    if m7:
        comp = plan_model(m, CompileOptions(target="cortex-m7"))
        program = mcu.generate_mcu(comp.graph, comp.plan, comp.memory)
        with tempfile.TemporaryDirectory(prefix=f"bench-qop-{name}-") as tmp:
            res = mcu.run_on_qemu(program, feeds, Path(tmp))
        r.update(m7_kernels=comp.plan.num_kernels, m7_instructions=res.instructions,
                 m7_arena_bytes=program.arena_bytes, m7_steps=_steps(res.outputs[q], theirs))
    print(json.dumps(r), file=sys.stderr, flush=True)
    return r


def markdown(rows: list[dict]) -> str:
    lines = [BEGIN, "", "| model | format | kernels fused (unfused) | Requantize | host arena KiB | host ms fused | "
             "onnxruntime ms | ratio (CPU) | M7 instructions | M7 arena KiB | steps from onnxruntime "
             "(unfused / fused / M7) |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        host = (f"{r['host_ms']:.3f} | {r['onnxruntime_ms']:.3f} | {r['host_ms'] / r['onnxruntime_ms']:.2f} "
                f"({r['host_cpu_ms'] / r['onnxruntime_cpu_ms']:.2f})") if "host_ms" in r else "- | - | -"
        m7 = f"{r['m7_instructions']:,} | {r['m7_arena_bytes'] / 1024:.1f}" if "m7_instructions" in r else "- | -"
        m7_steps = f" / {r['m7_steps']}" if "m7_steps" in r else ""
        lines.append(f"| {r['model']} | {r['format']} | {r['kernels']} ({r['kernels_unfused']}) | {r['requantize']} | "
                     f"{r['host_arena_bytes'] / 1024:.1f} | {host} | {m7} | {r['steps_unfused']} / "
                     f"{r['steps_fused']}{m7_steps} |")
    return "\n".join(lines + ["", END])


def write_md(section: str) -> None:
    path = RESULTS / "qoperator.md"
    text = path.read_text() if path.exists() else "# onnxruntime's QOperator format\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--repeat", type=int, default=20, help="timed runs per contender on the host (0: no host timing)")
    ap.add_argument("--no-m7", action="store_true", help="skip the Cortex-M7 (QEMU) runs")
    args = ap.parse_args(argv)
    m7 = not args.no_m7 and mcu.tools_available()
    rows = []
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix=f"bench-qop-{name}-") as tmp:
            for label, model in quantized(name, Path(tmp)).items():
                rows.append(row(name, label, model, args.repeat, m7))
    section = markdown(rows)
    (RESULTS / "qoperator.json").write_text(json.dumps({"rows": rows, "table": section}, indent=1) + "\n")
    write_md(section)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
