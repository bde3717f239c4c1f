"""INT8 accuracy benchmark: every zoo CNN quantized (``opfuse.quantize``) with each calibration
method, against its float model.

    python benchmarks/bench_int8.py                                  # the five zoo CNNs
    python benchmarks/bench_int8.py resnet8 ds_cnn --samples 50 --calibration 16

Per model and method: ``--calibration`` seeded random calibration inputs, then the accuracy report
over ``--samples`` other seeded random inputs (both models in the NumPy reference executor): the
output's cosine similarity (worst and mean), max and mean absolute error, top-1 agreement, and the
layers whose own quantization error dominates. Also the quantized model in onnxruntime against
opfuse's reference on the first input (max absolute output difference), when onnxruntime is
installed. Writes ``benchmarks/results/int8.json`` and ``int8.md``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import opfuse
from opfuse.quantization import METHODS, quantize
from opfuse.runtime.reference import random_inputs, run

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("mobilenet_v1_025_96", "resnet8", "ds_cnn", "mobilenet_v1", "resnet18")
DEFAULT_SAMPLES = 200
LARGE_MODEL_SAMPLES = {"mobilenet_v1": 50, "resnet18": 50}  # 224x224: fewer inputs, so it runs in minutes
DEFAULT_CALIBRATION = 32
TOP1_BAR = 0.99


def ort_difference(model, feeds) -> float | None:
    """Max |onnxruntime - opfuse reference| over the outputs of the quantized model on ``feeds``."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    theirs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    ours = run(opfuse.load(model), feeds)
    return max(float(np.abs(theirs[k].astype(np.float64) - ours[k]).max()) for k in ours)


def bench_model(name: str, method: str, samples: int, calibration: int) -> dict:
    t0 = time.perf_counter()
    result = quantize(f"zoo:{name}", calibration_random=calibration, method=method, report=True,
                      report_samples=samples)
    seconds = time.perf_counter() - t0
    rep = result.report
    assert rep is not None
    (out_name, out), = rep["outputs"].items()
    feeds = random_inputs(result.fused_graph, 0)
    layers = {la["tensor"]: la for la in rep["layers"]}
    return {"model": name, "method": method, "calibration_samples": calibration, "report_samples": samples,
            "activations": len(result.activations), "weights": len(result.weights),
            "int32_biases": sum(1 for w in result.weights if w["bias"] == "int32"),
            "output": out_name, **{k: out[k] for k in ("cosine_min", "cosine_mean", "max_abs_error",
                                                       "mean_abs_error", "max_abs_float", "sqnr_db",
                                                       "top1_agreement")},
            "float_margin_median": out.get("float_margin_median"),
            "disagreement_margins": [d["float_margin"] for d in out.get("disagreements", [])],
            "dominant": [{"tensor": t, "own_sqnr_db": layers[t]["own_sqnr_db"]} for t in rep["dominant"][:3]],
            "ort_vs_opfuse_max_abs": ort_difference(result.model, feeds), "seconds": round(seconds, 1)}


def markdown(rows: list[dict]) -> str:
    lines = ["# INT8 post-training quantization: accuracy vs float (zoo CNNs)", "",
             "Per-channel symmetric int8 weights after BN folding, per-tensor asymmetric int8 activations on the "
             "tensors that exist after fusion, int32 bias; graph outputs kept float. Calibration and evaluation on "
             "disjoint seeded random N(0,1) inputs; both models in opfuse's NumPy reference executor. "
             "`ort diff`: max |onnxruntime - opfuse| on the quantized model's output (input seed 0). "
             "`margin`: the float model's median top-1 over top-2 lead: the zoo models have seeded random "
             "weights, and on random inputs their classes are nearly tied, so top-1 agreement measures "
             "whether an error of the size in `max abs err` flips such near-ties.", "",
             "| model | method | cal | eval | cos min | cos mean | max abs err (of max) | mean abs err | SQNR dB "
             "| top-1 | margin | worst layers (own SQNR dB) | ort diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        top1 = "-" if r["top1_agreement"] is None else f"{100 * r['top1_agreement']:.1f}%"
        worst = ", ".join(f"{d['tensor']} ({d['own_sqnr_db']:.1f})" if d["own_sqnr_db"] is not None
                          else d["tensor"] for d in r["dominant"])
        ort = "-" if r["ort_vs_opfuse_max_abs"] is None else f"{r['ort_vs_opfuse_max_abs']:.2g}"
        margin = "-" if r.get("float_margin_median") is None else f"{r['float_margin_median']:.2g}"
        lines.append(f"| {r['model']} | {r['method']} | {r['calibration_samples']} | {r['report_samples']} "
                     f"| {r['cosine_min']:.5f} | {r['cosine_mean']:.5f} | {r['max_abs_error']:.3g} "
                     f"({r['max_abs_float']:.3g}) | {r['mean_abs_error']:.3g} | {r['sqnr_db']:.1f} | {top1} "
                     f"| {margin} | {worst} | {ort} |")
    misses = [r for r in rows if r["top1_agreement"] is not None and r["top1_agreement"] < TOP1_BAR]
    lines += ["", f"Top-1 agreement bar: >= {100 * TOP1_BAR:.0f}%. Below it: "
              + (", ".join(f"{r['model']}/{r['method']} ({100 * r['top1_agreement']:.1f}%)" for r in misses)
                 or "none") + "."]
    for r in misses:
        margins = ", ".join(f"{m:.2g}" for m in r["disagreement_margins"])
        lines.append(f"- {r['model']}/{r['method']}: the disagreements overturned float top-1 over top-2 margins of "
                     f"{margins} (median margin over all rows {r['float_margin_median']:.2g}; max abs output error "
                     f"{r['max_abs_error']:.2g}).")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--samples", type=int, default=None,
                    help=f"random evaluation inputs (default {DEFAULT_SAMPLES}; large models: {LARGE_MODEL_SAMPLES})")
    ap.add_argument("--calibration", type=int, default=DEFAULT_CALIBRATION, help="random calibration inputs")
    ap.add_argument("--out", default=str(RESULTS / "int8.json"))
    ap.add_argument("--merge", nargs="+", metavar="JSON", help="only merge these results into --out (and its .md)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.merge:
        rows = [r for path in args.merge for r in json.loads(Path(path).read_text())["rows"]]
        order = {m: i for i, m in enumerate(MODELS)}
        rows.sort(key=lambda r: (order.get(r["model"], len(order)), METHODS.index(r["method"])))
        write(out, rows)
        return 0
    rows = []
    for name in args.models:
        for method in args.methods.split(","):
            samples = args.samples or LARGE_MODEL_SAMPLES.get(name, DEFAULT_SAMPLES)
            row = bench_model(name, method, samples, args.calibration)
            rows.append(row)
            top1 = "-" if row["top1_agreement"] is None else f"{100 * row['top1_agreement']:.1f}%"
            print(f"{name:<22} {method:<10} cos min {row['cosine_min']:.5f}  top-1 {top1}  ({row['seconds']} s)",
                  flush=True)
            write(out, rows)  # after every row: a long run that stops keeps what it measured
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


def write(out: Path, rows: list[dict]) -> None:
    out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(rows))


if __name__ == "__main__":
    sys.exit(main())
