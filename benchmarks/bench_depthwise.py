"""Depthwise layers of the zoo's depthwise-separable models, opfuse against onnxruntime, layer by layer.

For each depthwise convolution (``group == C``) of mobilenet_v1, mobilenet_v1_025_96 and ds_cnn, run
inside its whole model (its input just written by the layer before, as in deployment): opfuse's kernel
timer (``CodegenOptions(profile=True)``, wall clock) and onnxruntime's profiler (``enable_profiling``,
the node's ``_kernel_time`` event; 1 intra-op thread, ``session.intra_op.allow_spinning=0``,
ORT_ENABLE_ALL, which runs these layers as NCHWc ``Conv`` nodes with the Relu fused). The two run
interleaved, one model call each in turn, and medians are quoted. Bytes are counted the same way for
both: input, output, weights and bias once (float32).

Yardsticks, timed in the same run: ``memcpy`` bandwidth counting bytes read + written, cold (128 MiB,
from and to main memory, the ``bench_kernels.py`` yardstick; one copy a round, interleaved) and warm
(the layer's own input size copied again and again, so both buffers sit in the caches as a layer's
input does in the model).

    python benchmarks/bench_depthwise.py [--models mobilenet_v1 ds_cnn] [--repeat 40] [--json out.json]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import numpy as np

MODELS = ("mobilenet_v1", "mobilenet_v1_025_96", "ds_cnn")
COLD_COPY_BYTES = 128 << 20


def depthwise_layers(proto) -> dict[str, dict]:
    """name -> shape facts of every depthwise Conv (one input channel per group) in ``proto``."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(proto)
    shapes = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        shapes[vi.name] = tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
    inits = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    layers = {}
    for n in proto.graph.node:
        if n.op_type != "Conv":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        x, w = shapes.get(n.input[0]), inits.get(n.input[1])
        if x is None or w is None or x[1] < 2 or attrs.get("group", 1) != x[1] or w[1] != 1:
            continue
        y = shapes[n.output[0]]
        nbytes = 4 * (int(np.prod(x)) + int(np.prod(y)) + int(np.prod(w)) + (y[1] if len(n.input) > 2 else 0))
        layers[n.name] = {"in": list(x), "out": list(y), "kernel": list(w[2:]),
                          "stride": list(attrs.get("strides", [1, 1])), "bytes": nbytes,
                          "in_bytes": 4 * int(np.prod(x))}
    return layers


COPY_LOOP_C = r"""
#include <string.h>
#include <stddef.h>
void copy_loop(void* dst, const void* src, size_t n, long reps) {
    for (long r = 0; r < reps; ++r) {
        memcpy(dst, src, n);
        __asm__ volatile("" ::: "memory");  /* every copy happens */
    }
}
"""


def copy_loop():
    """``copy_loop(dst, src, n, reps)``: libc's ``memcpy`` ``reps`` times in one call (a ctypes call
    costs about as much as a 20 KB copy)."""
    tmp = Path(tempfile.mkdtemp(prefix="opfuse_copy_"))
    (tmp / "copy.c").write_text(COPY_LOOP_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp / "copy.so"), str(tmp / "copy.c")], check=True)
    fn = ctypes.CDLL(str(tmp / "copy.so")).copy_loop
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    return fn


def copy_timer(nbytes: int, inner: int = 1):
    """A callable that copies ``nbytes`` ``inner`` times and returns the read + write GB/s."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.ones_like(src)
    fn, d, s = copy_loop(), dst.ctypes.data, src.ctypes.data
    fn(d, s, nbytes, 1)

    def timed() -> float:
        # This thread's CPU time: a 13 ms copy on a loaded machine is often descheduled, which wall
        # time would count (the kernels' tens of microseconds, timed by wall clock, seldom are).
        t0 = time.thread_time()
        fn(d, s, nbytes, inner)
        keep = (src, dst)  # noqa: F841  (the buffers live as long as the timer)
        return 2 * nbytes * inner / (time.thread_time() - t0) / 1e9
    return timed


def copy_gbs(nbytes: int, repeat: int, inner: int = 1) -> float:
    """Median read + write GB/s of ``memcpy`` over ``nbytes`` (``inner`` copies per sample)."""
    timed = copy_timer(nbytes, inner)
    return statistics.median(timed() for _ in range(repeat))


def ort_session(proto_bytes: bytes, prefix: str):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = prefix
    so.log_severity_level = 3
    return ort.InferenceSession(proto_bytes, so, providers=["CPUExecutionProvider"])


def ort_node_times(profile_file: str) -> dict[str, list[float]]:
    """Node name -> its ``_kernel_time`` durations (seconds) from an onnxruntime profile."""
    times: dict[str, list[float]] = defaultdict(list)
    for e in json.loads(Path(profile_file).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[e["name"][: -len("_kernel_time")]].append(e["dur"] * 1e-6)
    return times


def ort_layer(name: str, times: dict[str, list[float]]) -> list[float] | None:
    """The onnxruntime node that runs layer ``name`` (its fusions append ``_relu``, ``_nchwc``, ...)."""
    hits = [k for k in times if k == name or k.startswith(name + "_")]
    return times[hits[0]] if len(hits) == 1 else None


def bench_model(model: str, repeat: int, warmup: int, codegen_options=None, baseline: dict | None = None,
                copies: list[float] | None = None) -> list[dict]:
    """The depthwise layers of ``zoo:model``: opfuse (``codegen_options``) and onnxruntime, and with
    ``baseline`` (``CodegenOptions`` fields) a second opfuse build with them, all interleaved, with
    one cold copy a round (its GB/s appended to ``copies``)."""
    copies = [] if copies is None else copies
    cold_copy = copy_timer(COLD_COPY_BYTES)
    from opfuse.api import load, onnx_proto
    from opfuse.codegen.options import CodegenOptions
    from opfuse.compiler import build_native, plan_model
    from opfuse.runtime.reference import random_inputs
    proto = onnx_proto(f"zoo:{model}")
    layers = depthwise_layers(proto)
    graph = load(f"zoo:{model}")
    feeds = random_inputs(graph, 0)
    opts = codegen_options or CodegenOptions()
    # Wall clock, as onnxruntime's profiler times its nodes.
    timed = replace(opts, profile=True, profile_clock="wall")
    plan = plan_model(graph)
    natives = {"opfuse": build_native(plan, threads=1, codegen_options=timed)}
    if baseline:
        natives["base"] = build_native(plan, threads=1, codegen_options=replace(timed, **baseline))
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort_session(proto.SerializeToString(), os.path.join(tmp, "ort"))
        ours: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in natives}
        for _ in range(warmup):
            for native in natives.values():
                native.run(feeds)
            sess.run(None, feeds)
        for _ in range(repeat):
            copies.append(cold_copy())
            for k, native in natives.items():
                for r in native.profile(feeds, repeat=1):
                    ours[k][r["group"]].append(r["ms"] * 1e-3)
            sess.run(None, feeds)
        theirs = ort_node_times(sess.end_profiling())
    rows = []
    for name, facts in layers.items():
        o = ours["opfuse"].get(name)
        t = ort_layer(name, theirs)
        if o is None:
            continue
        row = {"model": model, "layer": name, **facts, "opfuse_us": statistics.median(o) * 1e6}
        if "base" in ours and name in ours["base"]:
            row["base_us"] = statistics.median(ours["base"][name]) * 1e6
        # The kernel's timer covers its whole group: only groups of one depthwise layer and its epilogue.
        if t is not None:
            row["ort_us"] = statistics.median(t[warmup:] if len(t) > warmup else t) * 1e6
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--baseline", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="also time a build with these CodegenOptions fields (ints or true/false), interleaved")
    args = ap.parse_args(argv)
    baseline = {}
    for item in args.baseline:
        key, _, value = item.partition("=")
        baseline[key] = {"true": True, "false": False}.get(value.lower(), value)
        if isinstance(baseline[key], str):
            baseline[key] = int(value)
    rows: list[dict] = []
    copies: list[float] = []
    for m in args.models:
        rows += bench_model(m, args.repeat, args.warmup, baseline=baseline, copies=copies)
    cold = statistics.median(copies)
    warm_by_size: dict[int, float] = {}
    for r in rows:
        n = r["in_bytes"]
        if n not in warm_by_size:
            warm_by_size[n] = copy_gbs(n, 15, inner=max(1, (16 << 20) // n))
        r["warm_copy_gbs"] = warm_by_size[n]
        r["cold_copy_gbs"] = cold
        # What fusing the layer into the next pointwise convolution by tiles could save at most: its
        # output written and read back, timed as a warm memcpy of that size (read + write).
        out_bytes = 4 * int(np.prod(r["out"]))
        if out_bytes not in warm_by_size:
            warm_by_size[out_bytes] = copy_gbs(out_bytes, 15, inner=max(1, (16 << 20) // out_bytes))
        r["out_roundtrip_us"] = 2 * out_bytes / warm_by_size[out_bytes] / 1e3
        r["opfuse_gbs"] = r["bytes"] / r["opfuse_us"] / 1e3
        if "ort_us" in r:
            r["ort_gbs"] = r["bytes"] / r["ort_us"] / 1e3
    head = (f"{'model':20s} {'layer':6s} {'C@HxW/s':>14s} {'KB':>6s} {'ours us':>8s} {'ORT us':>7s} {'ours/ORT':>8s} "
            f"{'ours GB/s':>9s} {'ORT GB/s':>8s} {'%cold ours':>10s} {'%cold ORT':>9s} {'%warm ours':>10s} "
            f"{'%warm ORT':>9s}" + (f" {'base us':>8s} {'ours/base':>8s}" if baseline else ""))
    print(f"copy yardstick: cold {cold:.1f} GB/s (memcpy 128 MiB, read + write); warm: memcpy of the layer's "
          f"input size, in cache")
    print(head)
    print("-" * len(head))
    for r in rows:
        c, h, w = r["in"][1:]
        shape = f"{c}@{h}x{w}/{r['stride'][0]}"
        ort_us = r.get("ort_us", float("nan"))
        ort_gbs = r.get("ort_gbs", float("nan"))
        print(f"{r['model']:20s} {r['layer']:6s} {shape:>14s} {r['bytes'] / 1024:6.0f} {r['opfuse_us']:8.1f} "
              f"{ort_us:7.1f} {r['opfuse_us'] / ort_us:8.2f} {r['opfuse_gbs']:9.1f} {ort_gbs:8.1f} "
              f"{100 * r['opfuse_gbs'] / cold:9.0f}% {100 * ort_gbs / cold:8.0f}% "
              f"{100 * r['opfuse_gbs'] / r['warm_copy_gbs']:9.0f}% {100 * ort_gbs / r['warm_copy_gbs']:8.0f}%"
              + (f" {r['base_us']:8.1f} {r['opfuse_us'] / r['base_us']:8.2f}" if "base_us" in r else ""))
    for m in args.models:
        mine = [r for r in rows if r["model"] == m]
        print(f"{m}: depthwise outputs {sum(4 * np.prod(r['out']) for r in mine) / 2**20:.2f} MiB, written and "
              f"read back in {sum(r['out_roundtrip_us'] for r in mine):.0f} us at the warm memcpy rate (what "
              f"depthwise -> pointwise fusion by tiles could save at most); the layers take "
              f"{sum(r['opfuse_us'] for r in mine):.0f} us")
    if args.json:
        args.json.write_text(json.dumps({"cold_copy_gbs": cold, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
