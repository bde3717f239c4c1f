"""The accuracy report of a quantized model against its float original.

Both models run in the reference executor on the same fixed inputs: ``count`` seeded random
samples (``random_inputs(graph, seed + i)``; the calibration uses other seeds) and any samples the
user gives. Per graph output, over every sample:

* ``cosine``: cosine similarity of the flattened float and quantized outputs (the worst sample and
  the mean);
* ``max_abs_error``, ``mean_abs_error``; ``max_abs_float`` to judge them by;
* ``top1_agreement``: the fraction of rows (last axis) whose argmax is the same, for outputs whose
  last axis has more than one element; with the float model's median top-1 over top-2 margin and,
  for each disagreement, the margin the quantization error overturned (a disagreement on a
  near-tie says less than one on a clear winner).

Per quantized activation ``T`` (the layers): ``sqnr_db`` of the quantized model's ``T`` (its
QuantizeLinear's integers, dequantized) against the float model's ``T`` (the error accumulated up to there),
and ``own_sqnr_db``, the float ``T`` quantized alone with its scale (the error that layer adds by
itself: clipping and rounding). Per weight, the SQNR of the int8 weight. The layers whose own
error dominates, the ``DOMINANT_LAYERS`` with the lowest own SQNR and any below
``DOMINANT_SQNR_DB``, are listed in ``dominant``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from onnx import numpy_helper

from opfuse.ir.graph import Graph
from opfuse.quantization.params import sqnr_db

DEFAULT_REPORT_SAMPLES = 32
MAX_LISTED_DISAGREEMENTS = 10  # top-1 disagreements listed with the float margin they overturned
DOMINANT_LAYERS = 3  # the report names this many layers with the lowest own SQNR
DOMINANT_SQNR_DB = 20.0  # and every one whose own SQNR is below this (about 1% noise power: 10^(-20/10))


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def _finite(x: float) -> float | None:
    return x if np.isfinite(x) else None  # JSON has no infinities: an exact tensor reports null


def accuracy_report(float_graph: Graph, quantized_graph: Graph, result, *, count: int = DEFAULT_REPORT_SAMPLES,
                    seed: int = 0, samples: Sequence[dict[str, np.ndarray]] = ()) -> dict[str, Any]:
    """The report (see the module docstring) as a JSON-ready dict. ``result`` is the ``QuantizeResult``."""
    from opfuse.runtime.reference import random_inputs, run
    feeds = [random_inputs(float_graph, seed + i) for i in range(count)] + list(samples)
    q_name = _quantized_names(result.model)
    outs: dict[str, dict[str, list]] = {v.name: {"f": [], "q": []} for v in float_graph.outputs}
    acc: dict[str, list[float]] = {t: [0.0, 0.0, 0.0] for t in result.activations}  # signal, noise, own noise
    # The activations are the fused graph's; a rewrite may have made some (a merged QKV MatMul, a
    # recognized LayerNorm) that the original does not hold: then they come from the fused float graph.
    fused_only = any(t not in float_graph.values for t in result.activations)
    for x in feeds:
        fv = run(float_graph, x, keep=True)
        if fused_only:
            fv = {**run(result.fused_graph, x, keep=True), **{v.name: fv[v.name] for v in float_graph.outputs}}
        qv = run(quantized_graph, x, keep=True)
        for name in outs:
            outs[name]["f"].append(fv[name])
            outs[name]["q"].append(qv[name])
        for t, p in result.activations.items():
            f = fv[t].astype(np.float64)
            acc[t][0] += float(np.sum(f ** 2))
            dq = (qv[q_name[t]].astype(np.float64) - p.zero_point) * np.float64(p.scale)
            acc[t][1] += float(np.sum((f - dq) ** 2))
            acc[t][2] += float(np.sum((f - p.fake_quantize(fv[t]).astype(np.float64)) ** 2))
    outputs = {name: _output_metrics(np.stack(d["f"]), np.stack(d["q"])) for name, d in outs.items()}
    layers = []
    for t in result.activations:
        signal, noise, own = acc[t]
        layers.append({"tensor": t, "kind": "activation",
                       "sqnr_db": _finite(_ratio_db(signal, noise)), "own_sqnr_db": _finite(_ratio_db(signal, own))})
    consts = {i.name: numpy_helper.to_array(i) for i in result.model.graph.initializer}
    fused_consts = {v.name: v.const for v in result.fused_graph.constants}
    for w in result.weights:
        q = consts.get(f"{w['weight']}_quantized")
        s = consts.get(f"{w['weight']}_scale")
        wf = fused_consts.get(w["weight"])
        if q is None or s is None or wf is None:
            continue
        shape = [1] * q.ndim
        shape[w["axis"]] = -1
        own = sqnr_db(wf, q.astype(np.float32) * s.reshape(shape))
        layers.append({"tensor": w["weight"], "kind": f"weight of {w['node']}", "sqnr_db": None,
                       "own_sqnr_db": _finite(own)})
    ranked = sorted((la for la in layers if la["own_sqnr_db"] is not None), key=lambda la: la["own_sqnr_db"])
    dominant = [la["tensor"] for la in ranked[:DOMINANT_LAYERS]]
    dominant += [la["tensor"] for la in ranked[DOMINANT_LAYERS:] if la["own_sqnr_db"] < DOMINANT_SQNR_DB]
    return {"samples": len(feeds), "random_samples": count, "user_samples": len(samples), "seed": seed,
            "outputs": outputs, "layers": layers, "dominant": dominant}


def _ratio_db(signal: float, noise: float) -> float:
    if noise == 0:
        return float("inf")
    if signal == 0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))


def _output_metrics(f: np.ndarray, q: np.ndarray) -> dict[str, Any]:
    f64, q64 = f.astype(np.float64), q.astype(np.float64)
    err = np.abs(f64 - q64)
    cos = [_cos(a, b) for a, b in zip(f64, q64, strict=True)]
    out: dict[str, Any] = {"cosine_min": min(cos), "cosine_mean": float(np.mean(cos)),
                           "max_abs_error": float(err.max()) if err.size else 0.0,
                           "mean_abs_error": float(err.mean()) if err.size else 0.0,
                           "max_abs_float": float(np.abs(f64).max()) if f64.size else 0.0,
                           "sqnr_db": _finite(sqnr_db(f64, q64)), "top1_agreement": None}
    if f.ndim >= 2 and f.shape[-1] > 1:
        same = np.argmax(f64, axis=-1) == np.argmax(q64, axis=-1)
        top2 = np.sort(f64, axis=-1)[..., -2:]
        margin = top2[..., 1] - top2[..., 0]  # the float model's lead of its first class over its second
        row_err = err.max(axis=-1)
        out["top1_agreement"] = float(np.mean(same))
        out["top1_rows"] = int(same.size)
        out["float_margin_median"] = float(np.median(margin))
        out["disagreements"] = [{"row": [int(i) for i in idx], "float_margin": float(margin[idx]),
                                 "max_abs_error": float(row_err[idx])}
                                for idx in list(zip(*np.nonzero(~same), strict=True))[:MAX_LISTED_DISAGREEMENTS]]
    return out


def _quantized_names(model) -> dict[str, str]:
    """Quantized tensor -> the output of its QuantizeLinear (the integers: the name survives the
    pipeline's integer convs, ``rules/integer_ops``, which absorb the DequantizeLinear after it)."""
    return {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}


def format_report(report: dict[str, Any], result) -> str:
    """The report as text: one line per output, then the layers, worst own SQNR first."""
    lines = [f"accuracy vs float over {report['samples']} inputs ({report['random_samples']} random, "
             f"{report['user_samples']} given):"]
    for name, m in report["outputs"].items():
        top1 = "" if m["top1_agreement"] is None else f"  top-1 agreement {100 * m['top1_agreement']:.2f}%"
        lines.append(f"  {name}: cosine min {m['cosine_min']:.5f} mean {m['cosine_mean']:.5f}  max |err| "
                     f"{m['max_abs_error']:.4g} (of {m['max_abs_float']:.4g})  mean |err| {m['mean_abs_error']:.4g}"
                     + top1)
        if m.get("disagreements"):
            margins = ", ".join(f"{d['float_margin']:.3g}" for d in m["disagreements"])
            lines.append(f"    top-1 disagreements overturned float margins of {margins} "
                         f"(median margin {m['float_margin_median']:.3g})")
    lines.append("  layers (SQNR dB: accumulated / own; lowest own first):")
    ranked = sorted(report["layers"], key=lambda la: (la["own_sqnr_db"] is None, la["own_sqnr_db"] or 0.0))
    dominant = set(report["dominant"])
    for la in ranked:
        acc = "-" if la["sqnr_db"] is None else f"{la['sqnr_db']:.1f}"
        own = "exact" if la["own_sqnr_db"] is None else f"{la['own_sqnr_db']:.1f}"
        flag = "  <- dominates" if la["tensor"] in dominant else ""
        lines.append(f"    {la['tensor']:<28} {la['kind']:<28} {acc:>7} / {own:>6}{flag}")
    return "\n".join(lines)
