"""The ``opfuse`` command line: a thin layer over the Python API.

Every user error (an ``OpfuseError``) becomes one line on stderr and exit code 2; a result
that is wrong (outputs that disagree) exits 1. ``--json`` prints a command's result as one JSON
document on stdout and nothing else; progress goes to stderr, only on a terminal, never with
``--quiet`` (``opfuse.progress``).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Callable

import numpy as np

from opfuse.errors import InputError, OpfuseError
from opfuse.runtime.compare import integer_difference, integral

COMPARE_RTOL = 1e-4  # run --compare: an output misses when off by more than this x max(1, |theirs|)


# Helpers -----------------------------------------------------------------------------

def _input_shapes(args) -> dict:
    """``--input-shape``, plus the shapes of the ``--inputs`` arrays (``args.arrays``, read by the
    command) for the inputs it leaves open: symbolic dims are bound by the arrays given."""
    from opfuse.frontend.onnx import parse_input_shapes
    shapes = parse_input_shapes(getattr(args, "input_shape", None) or [])
    arrays = getattr(args, "arrays", None)
    if arrays:
        from opfuse.api import shapes_for_arrays
        shapes = shapes_for_arrays(args.model, shapes, arrays)
    return shapes


def _load(args):
    """The model, its shapes bound by ``--input-shape`` and the ``--inputs`` arrays; inputs that
    decide shapes (``ShapeInputError``) are bound to their ``--inputs`` values, named in
    ``args.bound_values`` (the graph no longer takes them)."""
    from opfuse.api import load_for_arrays
    graph, args.bound_values = load_for_arrays(args.model, _input_shapes(args), getattr(args, "arrays", None) or {})
    return graph


def _read_inputs(path: str | None, graph, seed: int) -> dict[str, np.ndarray]:
    from opfuse.runtime.reference import random_inputs
    if not path:
        return random_inputs(graph, seed)
    return _read_npz(path)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    import zipfile
    import zlib
    if os.path.isfile(path) and not zipfile.is_zipfile(path):
        raise InputError(f"cannot read inputs from '{path}': not an .npz archive (write one with "
                         f"numpy.savez(path, input_name=array))")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise InputError(f"cannot read inputs from '{path}': {e.strerror or e if isinstance(e, OSError) else e}") \
            from None


def _ort_outputs(model_spec: str, graph, feeds: dict) -> dict[str, np.ndarray]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise OpfuseError("--compare onnxruntime needs the onnxruntime package "
                          "(pip install 'opfuse[ort]')") from None
    from opfuse.api import onnx_proto
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # Never hand onnxruntime the path: its loader would follow external-data paths unchecked.
    proto = onnx_proto(model_spec).SerializeToString()
    try:
        sess = ort.InferenceSession(proto, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        res = sess.run(names, {k: v for k, v in feeds.items()})
    except Exception as e:  # onnxruntime's own exception types (Fail, InvalidGraph, ...), not OpfuseErrors
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise OpfuseError(f"--compare onnxruntime: onnxruntime cannot run this model: {first[:300]}") from None
    return dict(zip(names, res, strict=True))


def compare_outputs(ours: dict, theirs: dict) -> list[tuple[str, float, float]]:
    """(name, max abs error, max relative error) for every output both sides produced. Elements equal on both
    sides (infinities of one sign too) or NaN on both are no error; a NaN or an infinity on one side only, or
    another shape, is an infinite one (a NaN on both sides was a MISMATCH: NaN - NaN is NaN). Integer outputs
    are compared exactly (``compare_tolerance``: none is allowed)."""
    rows = []
    for name, a in ours.items():
        if name not in theirs:
            continue
        x0, y0 = np.asarray(a), np.asarray(theirs[name])
        if x0.shape != y0.shape:
            rows.append((name, math.inf, math.inf))
            continue
        if integral(x0) and integral(y0):
            rows.append((name, *integer_difference(x0, y0)))
            continue
        x, y = x0.astype(np.float64), y0.astype(np.float64)
        with np.errstate(invalid="ignore"):
            diff = np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, np.abs(x - y))
        diff = np.where(np.isnan(diff), math.inf, diff)
        abs_err = float(diff.max()) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(np.where(np.isfinite(y), y, 1.0)), 1e-12)
        rows.append((name, abs_err, float(rel.max()) if rel.size else 0.0))
    return rows


def compare_tolerance(ours, theirs) -> float:
    """The largest max abs error ``run --compare`` lets pass: none between two integer outputs (integer arithmetic
    is exact in every backend), else ``COMPARE_RTOL`` x ``compare_scale``."""
    if integral(ours) and integral(theirs):
        return 0.0
    return COMPARE_RTOL * compare_scale(theirs)


def compare_scale(theirs) -> float:
    """The magnitude ``--compare``'s tolerance scales with: the largest finite value, at least 1."""
    y = np.abs(np.asarray(theirs, dtype=np.float64))
    finite = y[np.isfinite(y)]
    return max(1.0, float(finite.max())) if finite.size else 1.0


def _print_json(result) -> None:
    import json
    print(json.dumps(result, indent=1, default=str))


# Commands --------------------------------------------------------------------------------

def cmd_info(args) -> int:
    from opfuse.report.summary import format_summary, summarize
    graph = _load(args)
    if args.json:
        _print_json(summarize(graph).to_dict())
    else:
        print(format_summary(summarize(graph)))
    return 0


def cmd_run(args) -> int:
    args.arrays = _read_npz(args.inputs) if args.inputs else None  # they bind symbolic dims
    graph = _load(args)
    if args.outputs:
        from opfuse.files import check_writable
        check_writable(args.outputs if args.outputs.endswith(".npz") else args.outputs + ".npz")
    all_feeds = args.arrays if args.arrays is not None else _read_inputs(None, graph, args.seed)
    feeds = {k: v for k, v in all_feeds.items() if k not in args.bound_values}  # the bound ones are constants now
    if args.cast_inputs:  # convert once, so that every backend (and --compare) sees the same values
        from opfuse.runtime.reference import check_inputs
        feeds = check_inputs(graph, feeds, cast=True)
    say = (lambda *a, **k: None) if args.json else print  # --json: the result alone on stdout
    result: dict = {"model": graph.name, "backend": args.backend}
    t0 = time.perf_counter()
    if args.backend == "reference":
        from opfuse.runtime.reference import run
        outputs = run(graph, feeds)
    elif args.backend == "cortex-m7":
        outputs = _run_mcu(args, graph, feeds, say)
    elif args.backend == "aarch64":
        outputs = _run_aarch64(args, graph, feeds, say)
    else:
        from opfuse.compiler import compile as compile_model
        debug = _debug_dir(args)
        model = compile_model(graph, fuse=not args.no_fuse, threads=args.threads,
                              corrections=not args.no_corrections, dump_ir=debug)
        t0 = time.perf_counter()  # time the run, not the build
        outputs = model.run(feeds)
        rep = model.report
        result.update(kernels=rep["kernels_after"], fused=not args.no_fuse, threads=rep["threads"],
                      arena_bytes=rep["arena_bytes"], cache_hit=rep["cache_hit"])
        say(f"C backend: {rep['kernels_after']} kernels ({'fused' if not args.no_fuse else 'unfused'}), "
            f"{rep['threads']} thread{'s' if rep['threads'] > 1 else ''}, arena {rep['arena_bytes']:,} bytes, "
            f"build {'cached' if rep['cache_hit'] else 'fresh'}")
        if rep["threads"] > 1 and rep.get("wakes_workers") is False:
            say("  an inference that finds the thread pool's workers asleep runs on one thread: its split kernels "
                "are too little work to wake them for (pool_wake_min_flops, pool_wake_min_bytes)")
        for line in cost_model_lines(rep.get("planner", {}).get("cost_model") or {}):
            say(line)
    elapsed = time.perf_counter() - t0
    result["outputs"] = {}
    for name, a in outputs.items():
        total, mean = float(np.sum(a, dtype=np.float64)), float(np.mean(a, dtype=np.float64)) if a.size else 0.0
        result["outputs"][name] = {"dtype": a.dtype.name, "shape": list(a.shape), "sum": total, "mean": mean}
        say(f"{name}: {a.dtype.name}{list(a.shape)} sum={total:.6g} mean={mean:.6g}")
    result["seconds"] = elapsed
    say(f"backend {args.backend}: {elapsed * 1e3:.1f} ms")
    if args.backend == "c" and debug:
        say(f"debug: IR before and after every pass in {debug}")
        result["debug"] = _check_groups(model.compilation, feeds, args.threads, say)
        if any(row["mismatches"] for row in result["debug"]):
            result["code"] = 1
    if args.outputs:
        from opfuse.files import atomic_writer
        path = args.outputs if args.outputs.endswith(".npz") else args.outputs + ".npz"  # as np.savez names it
        with atomic_writer(path, "wb") as f:  # a full disk leaves no truncated file
            np.savez(f, **outputs)  # type: ignore[arg-type]  # numpy's stub types **kwds as bool
        result["wrote"] = path
        say(f"wrote {path}")
    code = result.pop("code", 0)
    if args.compare:
        from opfuse.runtime import reference
        theirs = _ort_outputs(args.model, graph, {**all_feeds, **feeds}) if args.compare == "onnxruntime" else \
            reference.run(graph, feeds)
        result["compare"] = {"with": args.compare, "outputs": {}}
        rewrites = model.compilation.integer_rewrites() if args.backend == "c" and args.compare == "reference" \
            else []
        if rewrites:  # the build's own arithmetic is the oracle; the float QDQ graph's is reported beside it
            model_outputs, theirs = theirs, reference.run(model.compilation.graph, feeds)
            result["compare"]["integer_rewrites"] = rewrites
            say(f"compare reference: the fused build's integer arithmetic ({', '.join(rewrites)}: rounding "
                f"within one quantization step of the float QDQ model's) against the reference of the same graph")
        for name, abs_err, rel_err in compare_outputs(outputs, theirs):
            tol = compare_tolerance(outputs[name], theirs[name])
            ok = abs_err <= tol
            code = code if ok else 1
            result["compare"]["outputs"][name] = {"max_abs_error": abs_err, "max_rel_error": rel_err,
                                                  "tolerance": tol, "ok": ok}
            say(f"compare {args.compare} {name}: max abs error {abs_err:.3g}, max rel error {rel_err:.3g}"
                + ("" if ok else f" MISMATCH (tolerance {tol:.3g})"))
        if rewrites:
            for name, abs_err, rel_err in compare_outputs(outputs, model_outputs):
                result["compare"]["outputs"][name]["float_qdq"] = {"max_abs_error": abs_err,
                                                                   "max_rel_error": rel_err}
                say(f"  against the float QDQ model {name}: max abs error {abs_err:.3g}, max rel error "
                    f"{rel_err:.3g} (what the unfused build, --no-fuse, computes)")
    if args.json:
        _print_json(result)
    return code


DEBUG_ENV = "OPFUSE_DEBUG"  # OPFUSE_DEBUG=1 turns --debug on
DEBUG_DIR = "opfuse-debug"  # where --debug writes the IR dumps unless --dump-ir names a folder


def _debug_dir(args) -> str | None:
    """The IR dump folder when debugging (``--debug`` or ``OPFUSE_DEBUG=1``), else ``--dump-ir``."""
    on = getattr(args, "debug", False) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    return (getattr(args, "dump_ir", None) or DEBUG_DIR) if on else getattr(args, "dump_ir", None)


def _check_groups(comp, feeds: dict, threads, say=print) -> list[dict]:
    """Run ``comp`` kernel by kernel against the reference executor; one line per fused group."""
    from opfuse.bisect import check_groups
    from opfuse.progress import step
    with step("checking every group against the reference executor"):
        rows = check_groups(comp, feeds, threads=threads or 1)
    out = []
    for grp, bad in rows:
        ops = "+".join(grp.op_types)
        out.append({"group": grp.name, "ops": grp.op_types, "mismatches": [m.to_dict() for m in bad]})
        if bad:
            say(f"debug: group '{grp.name}' ({ops}): MISMATCH {'; '.join(str(m) for m in bad)}")
        elif len(grp.nodes) > 1:
            say(f"debug: group '{grp.name}' ({ops}): matches the reference")
    say(f"debug: {sum(1 for r in out if r['mismatches'])} of {len(out)} kernels differ from the reference executor")
    return out


def _run_aarch64(args, graph, feeds: dict, say=print) -> dict[str, np.ndarray]:
    """Plan for the host, generate the NEON build, cross-compile and run it under qemu-aarch64."""
    from opfuse.compiler import CompileOptions, plan_model
    from opfuse.runtime.aarch64 import find_tools, generate_aarch64, run_on_qemu
    find_tools()  # a missing toolchain is one line, before any planning
    comp = plan_model(graph, CompileOptions(fuse=not args.no_fuse, corrections=not args.no_corrections))
    res = run_on_qemu(generate_aarch64(comp.graph, comp.plan, comp.memory), feeds)
    say(f"aarch64 (qemu-aarch64 -cpu max, NEON with dotprod, 1 thread): {comp.report['kernels_after']} kernels "
        f"({'fused' if not args.no_fuse else 'unfused'}), arena {comp.memory.arena_bytes:,} bytes; emulated: the "
        "time below is QEMU's, not an Arm core's")
    return res.outputs


def _run_mcu(args, graph, feeds: dict, say=print) -> dict[str, np.ndarray]:
    """Plan for the Cortex-M7, cross-compile, run under QEMU; print what it executed and its sizes."""
    from opfuse.compiler import CompileOptions, plan_model
    from opfuse.runtime.mcu import QEMU_MACHINE, find_tools, generate_mcu, run_on_qemu
    find_tools()  # a missing toolchain is one line, before any planning
    comp = plan_model(graph, CompileOptions(target="cortex-m7", fuse=not args.no_fuse,
                                            corrections=not args.no_corrections,
                                            patch_recompute_limit=args.patch_recompute_limit))
    res = run_on_qemu(generate_mcu(comp.graph, comp.plan, comp.memory), feeds)
    lib, img = res.firmware.library, res.firmware.image
    say(f"cortex-m7 (QEMU {QEMU_MACHINE}): {comp.report['kernels_after']} kernels "
        f"({'fused' if not args.no_fuse else 'unfused'}), {res.instructions:,} instructions executed")
    say(f"model: arena {res.arena_bytes:,} bytes (layer-by-layer bound {comp.memory.lower_bound_bytes:,}), "
        f"stack {res.stack_bytes:,} bytes, flash {lib.flash:,} bytes (code and weights)")
    for line in patch_lines(comp.report):
        say(line)
    say(f"firmware (arm-none-eabi-size): flash {img.flash:,} bytes (text {img.text:,} + data {img.data:,}), "
        f"SRAM {img.sram:,} bytes (data {img.data:,} + bss {img.bss:,}), plus the stack")
    return res.outputs


def cmd_quantize(args) -> int:
    """Post-training static INT8 quantization to QDQ ONNX (``opfuse.quantization``)."""
    import json

    from opfuse.files import check_writable
    from opfuse.quantization import quantize
    from opfuse.quantization.accuracy import format_report
    check_writable(args.output)
    if args.report_json:
        check_writable(args.report_json)
    want_report = args.report or bool(args.report_json) or args.report_inputs is not None
    result = quantize(args.model, args.calibration, calibration_random=args.calibration_random, method=args.method,
                      activation_type=args.activation_type, percentile=args.percentile,
                      input_shapes=_input_shapes(args), report=want_report, report_samples=args.report_samples,
                      report_inputs=args.report_inputs, share_concat_scales=not args.own_concat_scales)
    result.save(args.output)
    data = result.to_dict()
    data["output"] = args.output
    if args.report_json:
        with open(args.report_json, "w") as f:
            json.dump(data, f, indent=1)
    if args.json:
        _print_json(data)
        return 0
    biases = sum(1 for w in result.weights if w["bias"] == "int32")
    print(f"quantized {len(result.activations)} activations (per tensor, {result.activation_type}, {result.method} "
          f"over {result.samples} samples), {len(result.weights)} weights (per channel, int8), {biases} biases "
          f"(int32)")
    for tensor, why in result.kept_float.items():
        print(f"  float: {tensor}: {why}")
    for tensor, concat in result.shared.items():
        print(f"  concat: {tensor} takes the parameters of '{concat}' (an exact int8 Concat)")
    for concat, why in result.kept_apart.items():
        print(f"  concat: '{concat}' requantizes its inputs: {why}")
    if result.report is not None:
        print(format_report(result.report, result))
    print(f"wrote {args.output}")
    return 0


def cmd_zoo(args) -> int:
    from opfuse import zoo
    if args.zoo_cmd == "list":
        for name in zoo.list_models():
            print(f"{name:<22}{zoo.describe(name)}")
        return 0
    from opfuse.files import atomic_write, check_writable
    out = args.output or f"{args.name}.onnx"
    check_writable(out)
    atomic_write(out, zoo.build_onnx(args.name).SerializeToString())
    print(f"wrote {out}")
    return 0


def cmd_ops(args) -> int:
    from opfuse.frontend import coverage
    rows = coverage.coverage()
    shown = [r for r in rows if not args.kind or r.kind in args.kind]
    if args.json:
        _print_json({"headline": coverage.headline(rows), "counts": coverage.summary(rows),
                     "ops": [r.as_dict() for r in shown]})
        return 0
    for r in shown:
        print(f"{r.op:<28}{r.kind:<11}{r.detail}".rstrip())
    print(coverage.headline(rows))
    return 0


def _size(text: str) -> int:
    """Bytes from '524288', '512K', '512KiB', '1.5M' (K/M/G are powers of 1024)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if scale > 1 else t) * scale)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size in bytes: {text!r}") from None


def _add_calibration_args(p, required: bool) -> None:
    """The calibration options of ``opfuse quantize`` (and of ``compile --int8``)."""
    from opfuse.quantization import ACTIVATION_TYPES, DEFAULT_ACTIVATION_TYPE, DEFAULT_PERCENTILE, METHODS
    cal = p.add_mutually_exclusive_group(required=required)
    cal.add_argument("--calibration", metavar="DATA.npz",
                     help="calibration samples: arrays keyed by input name, shaped (S, *input shape)")
    cal.add_argument("--calibration-random", type=int, metavar="N", help="calibrate on N seeded random inputs")
    p.add_argument("--method", choices=METHODS, default="minmax", help="activation range calibration (default minmax)")
    p.add_argument("--activation-type", choices=list(ACTIVATION_TYPES), default=DEFAULT_ACTIVATION_TYPE,
                   help=f"activation type (default {DEFAULT_ACTIVATION_TYPE}, as onnxruntime's QDQ default)")
    p.add_argument("--percentile", type=float, default=DEFAULT_PERCENTILE,
                   help=f"percentile method: the values kept, in percent (default {DEFAULT_PERCENTILE})")
    p.add_argument("--own-concat-scales", action="store_true",
                   help="keep each Concat input's own scale (default: the inputs take the Concat's, so it is an "
                        "exact int8 Concat)")


def _add_int8_args(p) -> None:
    p.add_argument("--int8", action="store_true",
                   help="quantize first (as 'opfuse quantize', with its calibration options), then compile the "
                        "QDQ model: int8 tensors between kernels, integer convolutions")
    _add_calibration_args(p, required=False)


def _int8_model(args):
    """``compile --int8``: the QDQ model of ``args.model`` (calibrated as ``opfuse quantize``); the model
    itself without ``--int8``."""
    if not args.int8:
        if args.calibration is not None or args.calibration_random is not None:
            raise OpfuseError("--calibration and --calibration-random are for --int8")
        return args.model
    if args.calibration is None and args.calibration_random is None:
        raise OpfuseError("--int8 needs calibration samples: --calibration DATA.npz or --calibration-random N")
    from opfuse.quantization import quantize
    result = quantize(args.model, args.calibration, calibration_random=args.calibration_random, method=args.method,
                      activation_type=args.activation_type, percentile=args.percentile,
                      input_shapes=_input_shapes(args), share_concat_scales=not args.own_concat_scales)
    return result.model


def _compile_options(args):
    from opfuse.compiler import CompileOptions
    disable = [n for item in (args.disable or []) for n in item.split(",") if n]
    return CompileOptions(target=args.target, fuse=not args.no_fuse, planner=args.planner,
                          latency_bound_s=args.latency_bound, memory_budget_bytes=args.memory_budget,
                          onchip_budget_bytes=args.onchip_budget, objective=args.objective,
                          disable=disable, dump_ir=args.dump_ir, log_decisions=args.log_decisions,
                          max_group_ops=args.max_group_ops, input_shapes=_input_shapes(args),
                          corrections=not args.no_corrections, patch_recompute_limit=args.patch_recompute_limit)


def _summary_lines(comp) -> list[str]:
    from opfuse.report.summary import human_bytes
    r = comp.report
    lines = [f"compiled {r['model']} for {r['target']}: kernels {r['kernels_before']} -> {r['kernels_after']}, "
             f"main memory {human_bytes(r['bytes_before'])} -> {human_bytes(r['bytes_after'])} "
             f"(eta {r['eta']:.3f}), {_arena_text(r)}"]
    if r.get("predicted_latency_s") is not None:
        p = r["planner"]
        lines.append(f"planner {planner_label(p)}: predicted latency "
                     f"{r['predicted_latency_s'] * 1e3:.3f} ms, critical path {r['critical_path_s'] * 1e3:.3f} ms, "
                     f"peak activation memory {human_bytes(r['predicted_peak_memory_bytes'])}")
        lines += cost_model_lines(p.get("cost_model") or {})
    lines += patch_lines(r)
    return lines


def _arena_text(r: dict) -> str:
    """The arena as it runs: on an SRAM target the kernels' scratch (patched runs' workspace, GEMM
    packing) is in it too, so the whole is named first and the tensors' share beside its bound."""
    from opfuse.report.summary import human_bytes
    tensors = (f"{human_bytes(r['arena_bytes'])} (lower bound {human_bytes(r['arena_lower_bound_bytes'])})")
    whole = (r.get("memory_budget") or {}).get("arena_bytes")
    if whole is None or whole == r["arena_bytes"]:
        return f"arena {tensors}"
    return f"arena {human_bytes(whole)} with kernel scratch, tensors {tensors}"


def patch_lines(report: dict) -> list[str]:
    """One line per patched run of a compile report (``memory.patch``)."""
    return [f"patched: {'+'.join(run['groups'])} in {run['bands']} bands of {run['band_rows']} rows "
            f"(workspace {run['workspace_bytes']:,} bytes, {run['recompute']:.1%} of their work recomputed"
            f"{', line buffers' if run.get('line_buffers') else ''}"
            f"{', output over input' if run['output_over_input'] else ''})"
            for run in report.get("patching", {}).get("runs", [])] + budget_lines(report)


def budget_lines(report: dict) -> list[str]:
    """The SRAM budget of an SRAM target's compile report (``compiler.fit_sram``), one line."""
    b = report.get("memory_budget")
    if not b:
        return []
    raised = (f"; recompute limit raised from {b['raised_from']:g} to {b['recompute_limit']:g} to fit"
              if b.get("raised_from") is not None else "")
    if not b.get("fits", True):
        return [f"memory budget: arena {b['arena_bytes']:,} bytes (tensors and kernel scratch) is over the "
                f"{b['budget_bytes']:,} bytes of the {b['source']}: it runs under QEMU, not on such a part "
                f"(--memory-budget makes patching work to fit, or says the smallest arena)"]
    return [f"memory budget: arena {b['arena_bytes']:,} bytes (tensors and kernel scratch) within "
            f"{b['budget_bytes']:,} bytes ({b['source']}){raised}"]


def planner_label(p: dict) -> str:
    """``exact (optimal, gap 0.00%)``, ``exact (gap 3.10%, time limit)``, ``greedy``: "optimal"
    only when the exact planner's gap is within its tolerance."""
    from opfuse.planner.exact import MIP_REL_GAP
    gap = p.get("gap")
    if gap is None:
        return p["method"]
    if p.get("optimal") and gap <= MIP_REL_GAP:
        return f"{p['method']} (optimal, gap {gap * 100:.2f}%)"
    to_bound = "" if p["method"] == "exact" else " to the exact planner's bound"
    return f"{p['method']} (gap {gap * 100:.2f}%{to_bound}, {p.get('stop_reason') or 'not proven'})"


def cost_model_lines(cm: dict) -> list[str]:
    """Which profile planned, and which saved corrections it applied (nothing when none)."""
    from opfuse.cost.correction import Corrections, describe_corrections
    lines = []
    if cm.get("profile"):
        lines.append(cm["profile"]["description"])
    corr = cm.get("corrections") or {}
    if not corr.get("requested"):
        lines.append("cost model corrections: off (--no-corrections)")
    elif corr.get("problem") or corr.get("applied") or corr.get("dropped"):
        raws = {b: c["raw"] for b, c in corr.get("clamped", {}).items()}
        line = describe_corrections(Corrections(corr["target"], corr.get("applied", {}), corr.get("samples", {}),
                                                raws, corr.get("dropped", {}), corr.get("fitted_at"),
                                                path=corr.get("path"), problem=corr.get("problem")))
        if line:
            lines.append(line)
    return lines


def _predicted_vs_measured(report: dict) -> str:
    """Per group: predicted and measured time, and the rate achieved (GFLOP/s of its FLOPs or GB/s
    of its boundary bytes) as a share of the machine's yardstick for that rate."""
    from opfuse.measure import achieved_rate
    from opfuse.yardsticks import describe as describe_yardsticks
    ys = report["yardsticks"]
    peak = {"GFLOP/s": ys["sgemm_gflops"], "GB/s": ys["copy_gbps"]}
    lines = [f"{'group':<28}{'ops':<34}{'predicted':>12}{'measured':>12}{'ratio':>8}{'achieved':>18}"
             f"{'of yardstick':>14}"]
    winograd = False
    for g in report["groups"]:
        p, m = g.get("predicted_latency_s"), g.get("measured_latency_s")
        if m is None:
            continue
        ops = "+".join(g["ops"])
        tiles = sorted({n.split("Winograd F(")[1].split(",")[0] for n in g.get("kernel_notes", [])
                        if "Winograd F(" in n})
        if tiles:  # its rate counts the direct convolution's FLOPs ("effective" GFLOP/s)
            ops += f" (Winograd {', '.join(tiles)})"
            winograd = True
        pred, ratio = (f"{p * 1e6:>10.1f}us", f"{m / p:>8.2f}") if p else (f"{'-':>12}", f"{'-':>8}")
        rate = achieved_rate(g, ys["sgemm_gflops"] / ys["copy_gbps"])
        achieved = f"{rate[0]:>10.2f} {rate[1]:<7}{rate[0] / peak[rate[1]] * 100:>13.0f}%" if rate else ""
        lines.append(f"{g['name'][:27]:<28}{ops[:33]:<34}{pred}{m * 1e6:>10.1f}us{ratio}{achieved}")
    p, m = report.get("predicted_latency_s"), report["measured_latency_s"]
    total = f"whole model: measured {m * 1e3:.3f} ms (median of {report['measured_repeat']} runs, kernel timers on)"
    if p:
        total += f", predicted {p * 1e3:.3f} ms, ratio {m / p:.2f}"
    yard = describe_yardsticks(ys)
    notes = ["Winograd groups: rates count the direct convolution's FLOPs (effective GFLOP/s); the cost "
             "model prices them as direct convolutions"] if winograd else []
    return "\n".join(lines + [total, yard] + notes)


def cmd_compile(args) -> int:
    import json
    from opfuse.compiler import int8_lines, plan_model
    from opfuse.files import atomic_writer, check_writable
    if args.measure and args.repeat < 1:
        raise OpfuseError(f"--repeat must be at least 1, got {args.repeat}")
    for path, folder in ((args.report_json, False), (args.emit_c, True), (args.save_onnx, False),
                         (args.html, False)):
        if path:
            check_writable(path, folder=folder)  # before the work, not after it
    say = (lambda *a, **k: None) if args.json else print  # --json: the result alone on stdout
    comp = plan_model(_int8_model(args), _compile_options(args))
    written: list[str] = []
    extra: dict = {}  # --json: what the text output shows besides the report
    if args.pareto:
        from opfuse.compiler import pareto
        from opfuse.planner import format_pareto
        front = [p for p, _ in pareto(comp)]
        extra["pareto"] = [{"latency_s": p.latency_s, "critical_path_s": p.critical_path_s,
                            "peak_memory_bytes": p.peak_memory_bytes, "kernels": p.kernels, "found_by": p.source}
                           for p in front]
        say(format_pareto(front))
    if args.measure:
        _measure(comp, args.repeat, before=bool(args.html))
    if args.report:
        say(comp.fusion_report.to_text())
    if args.measure:
        say(_predicted_vs_measured(comp.report))
    if args.stats:
        from opfuse.passes import PassTiming, RuleStatistics
        for inst in (comp.context.instrument(PassTiming), comp.context.instrument(RuleStatistics)):
            if inst is not None:
                say(inst.report())
    for line in _summary_lines(comp) + int8_lines(comp.report):
        say(line)
    if args.report_json:
        with atomic_writer(args.report_json) as f:
            json.dump(comp.report, f, indent=1, sort_keys=False, default=str)
        written.append(args.report_json)
        say(f"wrote {args.report_json}")
    if args.save_onnx:
        comp.save_onnx(args.save_onnx)
        written.append(args.save_onnx)
        say(f"wrote {args.save_onnx} (each fusion group an ONNX function: open it in Netron)")
    if args.html:
        _write_html(comp, args.html, args.layout)
        written.append(args.html)
        say(f"wrote {args.html}")
    if args.emit_c or args.output:
        files = _write_library(comp, args.emit_c or args.output, args.target, "--emit-c" if args.emit_c else "-o")
        written += [str(f) for f in files]
        say(f"wrote {', '.join(str(f) for f in files)}")
    if args.log_decisions:
        written.append(args.log_decisions)
        say(f"wrote decision log {args.log_decisions}")
    if args.dump_ir:
        say(f"wrote IR dumps to {args.dump_ir}")
    if args.json:
        _print_json({**comp.report, **extra, "wrote": written})
    return 0


def _measure(comp, repeat: int, before: bool) -> None:
    """``--measure``: kernel timers on; ``before``: also the unfused build, per original op."""
    from opfuse.measure import measure, measure_before
    from opfuse.yardsticks import yardsticks
    measure(comp, repeat=repeat)
    if before:
        measure_before(comp, repeat=repeat)
    comp.report["yardsticks"] = yardsticks()


def _write_html(comp, path: str, layout: str) -> None:
    from opfuse.files import atomic_write
    atomic_write(path, comp.to_html(layout))


def _write_library(comp, directory: str, target: str, flag: str) -> list:
    """The C library for ``target``: the host's shared-library sources, or the Cortex-M7's
    standalone firmware library."""
    if target == "cortex-m7":
        from opfuse.compiler import build_mcu
        return build_mcu(comp).export_c(directory)
    if target != "host":
        raise OpfuseError(f"{flag} builds for host or cortex-m7; target '{target}' is planned only")
    from opfuse.compiler import build_native
    return build_native(comp).export_c(directory)


def _bench_table(result: dict):
    """The rich table of ``opfuse bench``: one row per contender, fastest first."""
    from rich import box
    from rich.table import Table
    rows = result["contenders"]
    best = result["best_peer"]
    title = (f"{result['model']}: {result['threads']} thread{'s' if result['threads'] > 1 else ''}, "
             f"{result['repeat']} interleaved runs each after {result['warmup']} warm-up rounds")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("contender", "median ms", "p90 ms", f"/ {best or 'best peer'}", "max abs error", "kernels"):
        table.add_column(col, justify="left" if col == "contender" else "right", no_wrap=True)
    for name in sorted(rows, key=lambda n: rows[n]["median_ms"]):
        r = rows[name]
        ratio = f"{result['ratios'][name]:.2f}x" if result["ratios"] else "-"
        table.add_row(name.replace("_", " "), f"{r['median_ms']:.3f}", f"{r['p90_ms']:.3f}", ratio,
                      f"{r['max_abs_error']:.1e}", str(r.get("kernels", "")))
    return table


def _group_table(check: dict):
    """``opfuse bench --groups``: each fused group next to its ops run unfused, slower ones flagged."""
    from rich import box
    from rich.table import Table
    n = len(check["slower"])
    clock = {"thread_cpu": "thread CPU time", "wall": "wall time"}.get(check.get("clock", "wall"), "wall time")
    title = (f"per group, kernel timers ({clock}), medians of {check['repeat']} runs: "
             f"fused {check['fused_s'] * 1e3:.3f} ms, its ops unfused {check['unfused_s'] * 1e3:.3f} ms; "
             f"fusion slower (by > "
             f"{check['tolerance']:.0%}) in {n} group{'' if n == 1 else 's'}")
    mem = check.get("memory_bound")
    if mem and mem["removed"] is not None:
        title += (f"; memory-bound kernels: {mem['unfused_s'] * 1e3:.3f} ms unfused, {mem['left_s'] * 1e3:.3f} ms "
                  f"left fused, {mem['removed']:.0%} removed{_interval_note(mem.get('interval'))}")
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for col in ("group", "ops", "fused us", "unfused us", "fused / unfused", "mem. us", "left us", ""):
        table.add_column(col, justify="left" if col in ("group", "ops", "") else "right", no_wrap=True)
    for r in check["groups"]:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        mu, ml = r.get("memory_unfused_s"), r.get("memory_left_s")
        table.add_row(r["group"], "+".join(r["ops"])[:32], f"{r['fused_s'] * 1e6:.2f}", f"{r['unfused_s'] * 1e6:.2f}",
                      ratio, "-" if mu is None else f"{mu * 1e6:.2f}", "-" if ml is None else f"{ml * 1e6:.2f}",
                      "SLOWER" if r["slower"] else _moved_note(r.get("moved")))
    return table


def _interval_note(interval: dict | None) -> str:
    """`` (90% of resampled rounds: 61% to 83%)``: how far the memory-bound figure moves with the rounds."""
    if not interval:
        return ""
    return (f" ({interval['share']:.0%} of {interval['resamples']} resamples of the rounds: "
            f"{interval['low']:.0%} to {interval['high']:.0%})")


def _moved_note(moved: dict | None) -> str:
    """Why a group over the tolerance is not flagged: with the groups producing its inputs it is not slower."""
    if not moved:
        return ""
    return f"moved: {moved['ratio']:.2f} with producer{'s' if len(moved['producers']) > 1 else ''}"


def cmd_bench(args) -> int:
    import json
    from opfuse.bench import bench
    from opfuse.progress import step
    from rich.console import Console
    with step("interleaved runs") as advance:  # one display: the C builds inside add their lines to it
        result = bench(args.model, vs=args.vs, threads=args.threads, repeat=args.repeat, warmup=args.warmup,
                       input_shapes=_input_shapes(args), groups=args.groups, group_repeat=args.group_repeat,
                       progress=lambda done, total: advance(completed=done, total=total))
    for peer, why in result["skipped"].items():
        print(f"opfuse bench: skipped {peer}: {why}", file=sys.stderr)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        out = Console()
        (out if out.is_terminal else Console(width=120)).print(_bench_table(result))  # a pipe gets whole rows
        if result["yardsticks"] is not None:
            from opfuse.yardsticks import describe as describe_yardsticks
            print(describe_yardsticks(result["yardsticks"], "timed in this run"))
        if result["other_processes_cores"] is not None:
            print(f"other processes used {result['other_processes_cores']:.2f} of {os.cpu_count()} cores meanwhile")
        if result["group_check"] is not None:
            (out if out.is_terminal else Console(width=120)).print(_group_table(result["group_check"]))
    if not result["errors"]["outputs_agree"]:
        worst = max(result["errors"]["pairs"].items(), key=lambda kv: kv[1])
        print(f"opfuse bench: outputs disagree: {worst[0]} max abs error {worst[1]:.3g} "
              f"(tolerance {result['errors']['rtol']:g} x max(1, |output|))", file=sys.stderr)
        return 1
    return 0


def cmd_explain(args) -> int:
    from opfuse.compiler import plan_model
    comp = plan_model(args.model, _compile_options(args))
    if args.json:
        from collections import Counter
        pairs = comp.report["explain"]
        _print_json({"model": comp.report["model"], "target": comp.report["target"],
                     "counts": dict(Counter(e["reason_kind"] for e in pairs)), "pairs": pairs,
                     "decisions": [d.to_dict() for d in comp.decisions]})
    else:
        print(comp.fusion_report.explain_text())
    return 0


def cmd_profile(args) -> int:
    from opfuse.targets import calibrate_host, format_profile, get_profile, save_profile
    if args.calibrate and args.target != "host":
        raise OpfuseError("--calibrate measures this machine: use --target host")
    if args.fit is not None and args.target == "cortex-m7":
        return _fit_m7(args)
    if args.fit is not None and args.target != "host":
        raise OpfuseError("--fit measures host runs (--target host) or QEMU counts (--target cortex-m7)")
    if args.fit is not None and not args.fit:
        raise OpfuseError("--fit on the host needs models to measure, e.g. --fit zoo:resnet8 zoo:mobilenet_v1")
    if args.suite is not None:
        raise OpfuseError("--suite is for --target cortex-m7 --fit")
    say = (lambda *a, **k: None) if args.json else print  # --json: the result alone on stdout
    result: dict = {}
    if args.calibrate:
        from opfuse.targets.cache import cache_dir
        from opfuse.targets.calibrate import CACHE_FILE
        profile = calibrate_host(force=True)
        result["calibrated"] = str(cache_dir() / CACHE_FILE)
        say(f"calibrated the host and saved it to {cache_dir() / CACHE_FILE}; later plans for 'host' use it")
    else:
        profile = get_profile(args.target)
    result["profile"] = profile.to_dict()
    result["ridge_point_flop_per_byte"] = profile.ridge_point()
    say(format_profile(profile))
    if args.fit:
        from opfuse.measure import fit_host_corrections
        from opfuse.cost.correction import format_corrections
        corr = fit_host_corrections(args.fit)
        result["corrections"] = corr.summary()
        say(format_corrections(corr))
    if args.output:
        save_profile(profile, args.output)
        result["wrote"] = args.output
        say(f"wrote {args.output}")
    if args.json:
        _print_json(result)
    return 0


def _fit_m7(args) -> int:
    """``opfuse profile --target cortex-m7 --fit [MODEL...]``: fit the instruction-count model under QEMU."""
    from opfuse.mcufit import fit_m7, format_fit
    from opfuse.targets import format_profile, save_profile
    from opfuse.targets.fitted import m7_fit_path
    if args.calibrate:
        raise OpfuseError("--calibrate measures this machine: use --target host")
    fit = fit_m7(args.suite or "full", args.fit)
    say = (lambda *a, **k: None) if args.json else print
    say(format_profile(fit.profile))
    say(format_fit(fit))
    say(f"saved the fit to {m7_fit_path()}; later plans for 'cortex-m7' use it")
    result = {"profile": fit.profile.to_dict(), "fit": fit.summary(), "saved": str(m7_fit_path())}
    if args.output:
        save_profile(fit.profile, args.output)
        result["wrote"] = args.output
        say(f"wrote {args.output}")
    if args.json:
        _print_json(result)
    return 0


def cmd_report(args) -> int:
    """The HTML report of a compilation (``compile --html`` without the rest)."""
    from opfuse.compiler import plan_model
    from opfuse.files import check_writable
    if args.measure and args.repeat < 1:
        raise OpfuseError(f"--repeat must be at least 1, got {args.repeat}")
    check_writable(args.output)
    comp = plan_model(args.model, _compile_options(args))
    if args.measure:
        _measure(comp, args.repeat, before=True)
    _write_html(comp, args.output, args.layout)
    if args.json:
        _print_json({"wrote": args.output, "model": comp.report["model"], "groups": len(comp.report["groups"])})
    else:
        print(f"wrote {args.output} ({len(comp.report['groups'])} groups; open it in a browser, it needs no network)")
    return 0


def _config_options(args, spec: str, flag: str):
    """Compile options from a configuration string of ``opfuse ab`` (e.g. "--no-fuse")."""
    import shlex

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # one line, exit 2, naming the flag
            raise InputError(f"{flag} {spec!r}: {message}")

    p = Parser(prog=f"opfuse ab {flag}", add_help=False)
    _add_compile_options(p)
    try:
        words = shlex.split(spec)
    except ValueError as e:
        raise InputError(f"{flag} {spec!r}: {e}") from None
    ns = p.parse_args(words)
    ns.input_shape = args.input_shape
    for name in ("dump_ir", "log_decisions"):
        if getattr(ns, name):
            raise InputError(f"{flag} {spec!r}: --{name.replace('_', '-')} is not an A/B option")
    return _compile_options(ns)


def _ab_text(r: dict) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"{r['model']}: {r['repeat']} interleaved runs each after {r['warmup']} warm-up pairs, "
                        f"{r['threads']} thread{'s' if r['threads'] > 1 else ''}", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for col in ("", "config", "kernels", "median ms", "p90 ms", "p99 ms", "max abs error"):
        table.add_column(col, justify="left" if col in ("", "config") else "right", no_wrap=col != "config")
    for k in ("a", "b"):
        s = r[k]
        table.add_row(k.upper(), repr(s["config"]) + ("" if s["target"] == "host" else f" (plan for {s['target']})"),
                      str(s["kernels"]), f"{s['median_ms']:.3f}", f"{s['p90_ms']:.3f}", f"{s['p99_ms']:.3f}",
                      f"{s['max_abs_error_vs_reference']:.1e}")
    console = Console(record=True, width=120, file=open(os.devnull, "w"))
    console.print(table)
    o = r["outputs"]
    lines = [console.export_text().rstrip(),
             f"outputs: A vs B max abs difference {o['max_abs_difference_a_b']:.3g} (tolerance {o['tolerance']:.3g}), "
             f"{'agree' if o['agree'] else 'DISAGREE'}; each is checked against the reference executor",
             f"verdict: {r['verdict']['text']}"]
    return "\n".join(lines)


def cmd_ab(args) -> int:
    from opfuse.ab import ab_test
    from opfuse.api import load
    from opfuse.progress import step
    a, b = _config_options(args, args.a, "--a"), _config_options(args, args.b, "--b")
    inputs = _read_inputs(args.inputs, load(args.model, a.input_shapes), args.seed) if args.inputs else None
    with step("A/B interleaved runs", total=args.repeat) as advance:
        result = ab_test(args.model, a, b, labels=(args.a, args.b), repeat=args.repeat, warmup=args.warmup,
                         threads=args.threads, seed=args.seed, inputs=inputs, progress=advance)
    if args.json:
        _print_json(result)
    else:
        print(_ab_text(result))
    return 0 if result["outputs"]["agree"] else 1


def cmd_debug(args) -> int:
    """Fused outputs against the reference; with --bisect, the fusions responsible."""
    from opfuse.bisect import bisect, check
    from opfuse.compiler import plan_model
    from opfuse.progress import step
    if args.target != "host":
        raise OpfuseError("debug builds and runs on this machine: use --target host")
    args.arrays = _read_npz(args.inputs) if args.inputs else None  # they bind symbolic dims
    comp = plan_model(args.model, _compile_options(args))
    feeds = args.arrays if args.arrays is not None else _read_inputs(None, comp.original, args.seed)
    from opfuse.runtime.reference import check_inputs
    feeds = check_inputs(comp.original, feeds)
    with step("building and checking the fused model"):
        bad = check(comp, feeds, threads=args.threads, rtol=args.rtol)
    result: dict = {"model": comp.report["model"], "groups": len(comp.plan.groups),
                    "fused_groups": sum(1 for g in comp.plan.groups if len(g.nodes) > 1),
                    "outputs_agree": not bad, "mismatches": [m.to_dict() for m in bad]}
    lines = []
    if not bad:
        lines.append(f"{result['model']}: fused outputs match the reference executor "
                     f"({result['fused_groups']} fused groups, tolerance {args.rtol:g} x max(1, |output|))")
    else:
        lines += [f"{result['model']}: output {m} differs from the reference executor" for m in bad]
        if not args.bisect:
            lines.append("run with --bisect to find the fusions responsible")
    if bad and args.bisect:
        with step("bisecting the fused groups") as advance:
            res = bisect(comp, feeds, threads=args.threads, rtol=args.rtol, progress=advance)
        result["bisect"] = res.to_dict()
        if res.not_fusion:
            lines.append(f"bisect ({res.builds} builds): the outputs differ with every group unfused too: no fusion "
                         f"is responsible (a rewrite or a single op's code is)")
        else:
            lines.append(f"bisect ({res.builds} builds): {len(res.culprits)} fusion(s) responsible, "
                         f"every other group unfused:")
            for g in res.culprits:
                lines.append(f"  group '{g.name}' (rule {g.attrs.get('rule') or g.kind}): {'+'.join(g.op_types)} "
                             f"[{', '.join(n.name for n in g.nodes)}]")
        if res.first is not None:
            lines.append(f"first diverging tensor: {res.first}")
    if args.json:
        _print_json(result)
    else:
        print("\n".join(lines))
    return 0 if not bad else 1


def cmd_demo(args) -> int:
    """The main job on MobileNetV1: summarise, fuse, compile to C, check, measure, report."""
    from opfuse.api import load
    from opfuse.compiler import compile as compile_model
    from opfuse.report.summary import format_summary, human_bytes, summarize
    from opfuse.runtime.reference import random_inputs, run
    model = f"zoo:{args.model}"
    graph = load(model)
    print(format_summary(summarize(graph)))
    feeds = random_inputs(graph, seed=0)
    t0 = time.perf_counter()
    ref = run(graph, feeds)
    ref_ms = (time.perf_counter() - t0) * 1e3
    print(f"\nreference executor: {ref_ms:.0f} ms")

    print("\ncompiling to C: unfused (one kernel per op) and fused ...")
    unfused = compile_model(graph, fuse=False, threads=args.threads)
    fused = compile_model(graph, fuse=True, threads=args.threads, corrections=not args.no_corrections)
    print(fused.compilation.fusion_report.to_text())
    for line in cost_model_lines(fused.report.get("planner", {}).get("cost_model") or {}):
        print(line)
    worst = 0.0
    for name, want in ref.items():
        for label, m in (("unfused", unfused), ("fused", fused)):
            got = m.run(feeds)[name]
            err = float(np.max(np.abs(got.astype(np.float64) - want)))
            tol = 1e-4 * max(1.0, float(np.max(np.abs(want))))
            worst = max(worst, err / tol)
            print(f"check {label:<8}{name}: max abs error vs reference {err:.2e} (tolerance {tol:.0e}) "
                  f"{'ok' if err <= tol else 'MISMATCH'}")
    from opfuse.measure import median_seconds
    t_unfused = median_seconds(lambda: unfused.run(feeds), args.repeat) * 1e3
    t_fused = median_seconds(lambda: fused.run(feeds), args.repeat) * 1e3
    ru, rf = unfused.report, fused.report
    print(f"\n{'':<22}{'unfused':>14}{'fused':>14}{'change':>10}")
    rows: list[tuple[str, float, float, Callable[[float], str]]] = [
            ("kernels", ru["kernels_after"], rf["kernels_after"], str),
            ("main memory traffic", ru["bytes_after"], rf["bytes_after"], human_bytes),
            ("arena (peak memory)", ru["arena_bytes"], rf["arena_bytes"], human_bytes),
            (f"latency (median {args.repeat})", t_unfused, t_fused, lambda v: f"{v:.2f} ms")]
    for label, a, b, fmt in rows:
        change = f"{(b - a) / a * 100:+.1f}%" if a else ""
        print(f"{label:<22}{fmt(a):>14}{fmt(b):>14}{change:>10}")
    print(f"speed-up fused vs unfused: {t_unfused / t_fused:.2f}x "
          f"(threads={args.threads}; reference executor {ref_ms:.0f} ms)")
    return 0 if worst <= 1.0 else 1


def cmd_fuzz(args) -> int:
    """Random models through the C backend against the reference (``opfuse.testing.fuzz``); exit 1 on
    a mismatch or crash, whose shrunk reproducer is under ``--out``."""
    from opfuse.testing.fuzz import fuzz, replay
    from opfuse.testing.random_graphs import DEFAULT_OPS
    if args.replay:
        verdict = replay(args.replay)
        print(f"replay {args.replay}: {verdict.line()}")
        return 1 if verdict.failed else 0
    ops = [op for item in args.ops for op in item.split(",") if op] if args.ops else None
    if args.jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {args.jobs}")
    jobs = f" in {args.jobs} jobs" if args.jobs > 1 else ""
    print(f"opfuse fuzz: {args.count} graphs from seed {args.seed}{jobs}, reproducers to {args.out}", flush=True)
    report = fuzz(args.count, args.seed, ops, args.out, max_nodes=args.max_nodes, shrink=not args.no_shrink,
                  time_budget=args.time_budget, progress=lambda line: print(f"  {line}", flush=True), jobs=args.jobs)
    for f in report.findings:
        print(f"{f.verdict.status}: {f.verdict.line()[:400]}\n  case: {f.description}"
              + (f"\n  reproduce: opfuse fuzz --replay {f.path}" if f.path else ""))
    for reason, n in sorted(report.unsupported_reasons.items()):
        print(f"unsupported ({n}): {reason}")
    if report.graphs:
        print("graphs per op: " + ", ".join(f"{op} {n}" for op, n in sorted(report.op_graphs.items())))
        if report.extra_graphs:
            print("graphs per extra: " + ", ".join(f"{e} {n}" for e, n in sorted(report.extra_graphs.items())))
        missed = sorted(set(ops or DEFAULT_OPS) - set(report.op_graphs))
        if missed:
            print(f"ops in no graph ({len(missed)}): {', '.join(missed)}")
    print(f"opfuse fuzz: {report.summary()}")
    return 0 if report.ok else 1


# Parser ----------------------------------------------------------------------------------------

def _add_json(p) -> None:
    p.add_argument("--json", action="store_true", help="print the result as JSON (nothing else on stdout)")


def _add_model(p) -> None:
    p.add_argument("model", help="path to an .onnx file, or zoo:NAME")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="bind an input's shape, e.g. input=1x3x224x224 (repeatable)")


def _add_compile_args(p) -> None:
    _add_model(p)
    _add_compile_options(p)


def _add_compile_options(p) -> None:
    p.add_argument("--target", default="host", help="host, cortex-m7, a100, h200, or a profile .json")
    p.add_argument("--planner", default="auto", choices=["auto", "greedy", "exact", "rules"],
                   help="cost-model planner method, or 'rules' for the maximal legal grouping")
    p.add_argument("--latency-bound", type=float, metavar="SECONDS", help="bound on every critical path")
    p.add_argument("--memory-budget", type=_size, metavar="BYTES",
                   help="peak activation memory budget; on cortex-m7 the SRAM the arena (tensors and kernel "
                        "scratch) may use, by default the whole 512 KiB: patching works harder to fit, and when "
                        "nothing fits the error gives the smallest arena that would")
    p.add_argument("--onchip-budget", type=_size, metavar="BYTES", help="per-group on-chip working set budget")
    p.add_argument("--objective", help="weights, e.g. latency=1,memory=0.5,kernels=0")
    p.add_argument("--no-fuse", action="store_true", help="one kernel per op (the baseline)")
    p.add_argument("--disable", action="append", metavar="RULE", help="disable a rule or pass (repeatable)")
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR before/after every pass to numbered files")
    p.add_argument("--log-decisions", metavar="FILE", help="write every fusion decision (JSON)")
    p.add_argument("--max-group-ops", type=int, metavar="N", help="cap on ops per fused group")
    p.add_argument("--no-corrections", action="store_true",
                   help="plan with the plain roofline: ignore the correction factors saved by 'opfuse profile --fit'")
    _add_patch_option(p)


def _add_patch_option(p) -> None:
    p.add_argument("--patch-recompute-limit", type=float, metavar="FRACTION",
                   help="patch-based execution: most extra multiply-accumulates (fraction of the model's) "
                        "banded runs may recompute to lower the arena; 0 turns it off (default: the target's, "
                        "0.3 on cortex-m7)")


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, as every other bad input is (and exit code 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from opfuse.bench import DEFAULT_REPEAT, DEFAULT_WARMUP, GROUP_CHECK_REPEAT, PEERS
    parser = _Parser(prog="opfuse", description="An operator-fusion compiler for neural networks.",
                     epilog=HELP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="op histogram, params, FLOPs, bytes and activation memory")
    _add_model(p)
    _add_json(p)
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("run", help="run a model and print its outputs")
    _add_model(p)
    p.add_argument("--backend", choices=["reference", "c", "cortex-m7", "aarch64"], default="reference",
                   help="cortex-m7: cross-compile and run on an emulated Cortex-M7 (QEMU); aarch64: the host C with "
                        "its NEON kernels, cross-compiled and run under qemu-aarch64")
    p.add_argument("--inputs", help="npz file keyed by input names (default: seeded random inputs); its arrays' "
                   "shapes bind the model's symbolic dims that --input-shape leaves open")
    p.add_argument("--cast-inputs", action="store_true",
                   help="convert --inputs arrays of another dtype to the model's when every value fits "
                        "(default: a dtype mismatch is an error)")
    p.add_argument("--outputs", help="write outputs to this npz file")
    p.add_argument("--compare", choices=["onnxruntime", "reference"], help="also run in this runtime and print errors")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    p.add_argument("--no-fuse", action="store_true", help="C backend: one kernel per op")
    p.add_argument("--debug", action="store_true",
                   help=f"C backend: dump the IR after every pass (to --dump-ir or ./{DEBUG_DIR}) and check every "
                        f"group's outputs against the reference as the model runs (also {DEBUG_ENV}=1)")
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR before/after every pass to numbered files")
    p.add_argument("--threads", type=int, default=None,
                   help="C backend: threads (default: the cores available, or $OMP_NUM_THREADS)")
    p.add_argument("--no-corrections", action="store_true",
                   help="plan with the plain roofline: ignore the correction factors saved by 'opfuse profile --fit'")
    _add_patch_option(p)
    _add_json(p)
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("compile", help="fuse and plan a model; print or write the fusion report")
    _add_compile_args(p)
    p.add_argument("--report", action="store_true", help="print the fusion report")
    p.add_argument("--report-json", metavar="FILE", help="write the report as JSON")
    p.add_argument("--pareto", action="store_true", help="print the Pareto front (latency, memory, kernels)")
    p.add_argument("--emit-c", metavar="DIR", help="write the generated C library (host target)")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="write the C library for the target (cortex-m7: a standalone library for firmware)")
    p.add_argument("--measure", action="store_true",
                   help="host: build with kernel timers, run, and report measured next to predicted latency")
    p.add_argument("--repeat", type=int, default=20, help="timed runs for --measure")
    p.add_argument("--stats", action="store_true", help="print per-pass timing and per-rule statistics")
    p.add_argument("--save-onnx", metavar="FILE",
                   help="write the fused model as ONNX, each fusion group a local function (view it in Netron)")
    p.add_argument("--html", metavar="FILE", help="write the HTML report (graph, groups, roofline, arena, decisions)")
    _add_layout(p)
    _add_int8_args(p)
    _add_json(p)
    p.set_defaults(fn=cmd_compile)

    p = sub.add_parser("bench", help="time fused and unfused opfuse against onnxruntime and OpenVINO, interleaved")
    _add_model(p)
    p.add_argument("--vs", default=",".join(PEERS), metavar="PEERS",
                   help=f"comma-separated peers, or none (default {','.join(PEERS)}; missing ones are skipped)")
    p.add_argument("--threads", type=int, default=None,
                   help="threads for every contender (default: the cores available, or $OMP_NUM_THREADS)")
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="timed runs per contender")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed rounds first")
    p.add_argument("--groups", action="store_true",
                   help="also time every fused group against its ops run unfused (kernel timers) and flag the "
                        "groups fusion made slower")
    p.add_argument("--group-repeat", type=int, default=None, metavar="N",
                   help=f"rounds of the --groups check (default: --repeat, at least {GROUP_CHECK_REPEAT})")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("explain", help="why every pair of adjacent groups was not merged")
    _add_compile_args(p)
    _add_json(p)
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("report", help="write the HTML report of a model's fusion (one self-contained file)")
    _add_compile_args(p)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the .html file to write")
    p.add_argument("--measure", action="store_true",
                   help="host: also time every kernel, fused and unfused (measured before/after)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs for --measure")
    _add_layout(p)
    _add_json(p)
    p.set_defaults(fn=cmd_report)

    from opfuse.ab import DEFAULT_REPEAT as AB_REPEAT, DEFAULT_WARMUP as AB_WARMUP
    p = sub.add_parser("ab", help="A/B test two compile configurations: latency, outputs, a verdict")
    _add_model(p)
    p.add_argument("--a", required=True, metavar="OPTIONS", help='compile options of A, e.g. "--no-fuse"')
    p.add_argument("--b", required=True, metavar="OPTIONS", help='compile options of B, e.g. "" or "--planner greedy"')
    p.add_argument("--repeat", type=int, default=AB_REPEAT, help="timed runs of each, interleaved")
    p.add_argument("--warmup", type=int, default=AB_WARMUP, help="untimed pairs first")
    p.add_argument("--threads", type=int, default=1, help="threads for both")
    p.add_argument("--inputs", help="npz file keyed by input names (default: seeded random inputs)")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    _add_json(p)
    p.set_defaults(fn=cmd_ab)

    from opfuse.bisect import DEFAULT_RTOL
    p = sub.add_parser("debug", help="check fused outputs against the reference; --bisect finds the fusions at fault")
    _add_compile_args(p)
    p.add_argument("--inputs", help="npz file keyed by input names (default: seeded random inputs); its arrays' "
                   "shapes bind the model's symbolic dims that --input-shape leaves open")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    p.add_argument("--bisect", action="store_true",
                   help="on a mismatch, unfuse groups in halves to find the smallest set of fusions responsible")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help="tolerance: rtol x max(1, |reference|)")
    p.add_argument("--threads", type=int, default=1, help="threads of the builds")
    _add_json(p)
    p.set_defaults(fn=cmd_debug)

    p = sub.add_parser("profile", help="print (and save) a target's hardware profile")
    p.add_argument("--target", default="host",
                   help="host (the saved calibration, else nominal constants), cortex-m7 (the saved QEMU fit, "
                        "else the data sheet), a100, h200")
    p.add_argument("--calibrate", "--recalibrate", dest="calibrate", action="store_true",
                   help="host: time micro-benchmarks on this machine and save the result; later plans for "
                        "'host' use it (and say so)")
    p.add_argument("-o", "--output", help="save the profile as JSON")
    p.add_argument("--fit", nargs="*", metavar="MODEL",
                   help="host: fit the cost model's correction factors from measured per-group times of "
                        "these models (e.g. zoo:resnet8 zoo:mobilenet_v1) and save them; cortex-m7: fit "
                        "instructions per FLOP (per op class), per byte and per call from QEMU counts of "
                        "micro-benchmark kernels (and of these models' kernels, if given) and save the profile")
    p.add_argument("--suite", choices=("full", "quick"), default=None,
                   help="cortex-m7 --fit: the micro-benchmark suite (default full; quick: a third of it)")
    _add_json(p)
    p.set_defaults(fn=cmd_profile)

    from opfuse.quantization.accuracy import DEFAULT_REPORT_SAMPLES
    p = sub.add_parser("quantize", help="post-training static INT8 quantization to QDQ ONNX, after fusion")
    _add_model(p)
    _add_calibration_args(p, required=True)
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the quantized .onnx file to write")
    p.add_argument("--report", action="store_true", help="print the accuracy report against the float model")
    p.add_argument("--report-json", metavar="FILE", help="write the scales and the accuracy report as JSON")
    p.add_argument("--report-samples", type=int, default=DEFAULT_REPORT_SAMPLES,
                   help=f"random inputs of the accuracy report (default {DEFAULT_REPORT_SAMPLES})")
    p.add_argument("--report-inputs", metavar="DATA.npz", help="also report on these inputs (shaped as --calibration)")
    _add_json(p)
    p.set_defaults(fn=cmd_quantize)

    p = sub.add_parser("zoo", help="built-in models")
    zsub = p.add_subparsers(dest="zoo_cmd", required=True)
    zsub.add_parser("list", help="list the built-in models")
    pe = zsub.add_parser("export", help="write a built-in model as ONNX")
    pe.add_argument("name")
    pe.add_argument("-o", "--output", help="output path (default NAME.onnx)")
    p.set_defaults(fn=cmd_zoo)

    p = sub.add_parser("ops", help="every standard ONNX operator: how opfuse takes it, or why it is refused")
    p.add_argument("--kind", nargs="+", choices=("op", "rewritten", "folded", "removed", "function", "refused"),
                   help="only these kinds (e.g. --kind refused)")
    _add_json(p)
    p.set_defaults(fn=cmd_ops)

    p = sub.add_parser("fuzz", help="random models with hostile inputs: C fused and unfused against the reference")
    p.add_argument("--count", type=int, default=100, help="graphs to check (default 100)")
    p.add_argument("--seed", type=int, default=0, help="the first seed (the same seed, the same graphs)")
    p.add_argument("--ops", nargs="+", metavar="OP", help="only these ops (names, or comma-separated lists)")
    p.add_argument("--out", default="opfuse-fuzz", metavar="DIR",
                   help="where shrunk reproducers of failures go (default ./opfuse-fuzz)")
    p.add_argument("--max-nodes", type=int, default=24, help="nodes per generated graph, at most (default 24)")
    p.add_argument("--no-shrink", action="store_true", help="write failing cases as found, unshrunk")
    p.add_argument("--time-budget", type=float, metavar="SECONDS", help="stop generating after this long")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="processes checking graphs at once, each its share from its own seed (default 1)")
    p.add_argument("--replay", metavar="DIR", help="check one reproducer folder again (exit 1 if it still fails)")
    p.set_defaults(fn=cmd_fuzz)

    p = sub.add_parser("demo", help="the main job on a built-in model")
    p.add_argument("--model", default="mobilenet_v1", help="zoo model (default mobilenet_v1)")
    p.add_argument("--repeat", type=int, default=20, help="timed runs per build")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-corrections", action="store_true",
                   help="plan with the plain roofline: ignore the correction factors saved by 'opfuse profile --fit'")
    p.set_defaults(fn=cmd_demo)
    _add_quiet(sub)
    return parser


def _add_quiet(sub) -> None:
    """``--quiet`` on every command (and sub-command): no progress display."""
    for p in sub.choices.values():
        p.add_argument("-q", "--quiet", action="store_true", help="no progress display on stderr")
        for action in p._actions:  # e.g. zoo list / zoo export
            if isinstance(action, argparse._SubParsersAction):
                _add_quiet(action)


def _add_layout(p) -> None:
    p.add_argument("--layout", choices=["auto", "dot", "svg"], default="auto",
                   help="HTML report's graph: Graphviz dot when installed (auto), or the built-in SVG layout")


HELP_EPILOG = """\
examples:
  opfuse info zoo:mobilenet_v1 --json                  ops, params, FLOPs, bytes, activation memory
  opfuse run model.onnx --backend c --compare onnxruntime
  opfuse compile zoo:resnet8 --report --save-onnx fused.onnx --html report.html
  opfuse report zoo:resnet8 -o report.html             the HTML report alone (--measure adds timings)
  opfuse explain zoo:resnet8 --json                    why adjacent groups were not merged
  opfuse ab zoo:resnet8 --a "--no-fuse" --b ""         A/B latency (median, p90, p99) and a verdict
  opfuse debug model.onnx --inputs x.npz --bisect      which fusions break an output
  opfuse run model.onnx --backend c --debug            IR after every pass; every group checked vs the reference
  opfuse run model.onnx --backend aarch64 --compare reference   the NEON build under qemu-aarch64
  opfuse bench zoo:resnet8 --threads 2                 fused and unfused vs onnxruntime and OpenVINO
  opfuse profile --target cortex-m7                    a target's hardware profile
  opfuse quantize zoo:resnet8 --calibration-random 64 -o r8_int8.onnx --report   INT8 QDQ + accuracy
  opfuse zoo list; opfuse zoo export resnet8 -o r8.onnx
  opfuse ops --kind refused                            standard ONNX operators refused, and why
  opfuse demo                                          the main job on MobileNetV1

exit codes:
  0  success
  1  a result is wrong: outputs disagree (run --compare, debug, ab, bench, demo)
  2  bad input: a model, option or file opfuse cannot use (one line on stderr)

--json prints the result as JSON on stdout and nothing else; progress bars go to stderr, only on a
terminal, and never with --quiet."""


def _join_config_values(argv: list[str]) -> list[str]:
    """``ab --a "--no-fuse"``: argparse would read "--no-fuse" as an option; pass it as ``--a=...``."""
    if "ab" not in argv:
        return argv
    out, i = [], 0
    while i < len(argv):
        if argv[i] in ("--a", "--b") and i + 1 < len(argv):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    from opfuse.report.terminal import escape, safe_output
    from opfuse.progress import set_quiet
    parser = build_parser()
    args = parser.parse_args(_join_config_values(list(sys.argv[1:] if argv is None else argv)))
    set_quiet(getattr(args, "quiet", False))
    try:
        # Names from the model reach the terminal escaped; NaN and infinities are IEEE results here, as in
        # onnxruntime, so NumPy's warnings about them would only add lines to a run that went as it should.
        with safe_output(), np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return args.fn(args)
    except OpfuseError as e:
        print(f"opfuse: error: {escape(str(e), newlines=True)}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # e.g. `opfuse info m.onnx | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's exit-time flush must not fail again
        return 0
    except KeyboardInterrupt:
        print("opfuse: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
