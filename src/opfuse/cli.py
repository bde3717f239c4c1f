"""The ``opfuse`` command line: a thin layer over the Python API.

Every user error (an ``OpfuseError``) becomes one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from opfuse.errors import InputError, OpfuseError


# Helpers -----------------------------------------------------------------------------

def _input_shapes(args) -> dict:
    from opfuse.frontend.onnx import parse_input_shapes
    return parse_input_shapes(getattr(args, "input_shape", None) or [])


def _load(args):
    from opfuse.api import load
    return load(args.model, _input_shapes(args))


def _read_inputs(path: str | None, graph, seed: int) -> dict[str, np.ndarray]:
    from opfuse.runtime.reference import random_inputs
    if not path:
        return random_inputs(graph, seed)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read inputs from '{path}': {e}") from None


def _ort_outputs(model_spec: str, graph, feeds: dict) -> dict[str, np.ndarray]:
    try:
        import onnxruntime as ort
    except ImportError:
        raise OpfuseError("--compare onnxruntime needs the onnxruntime package "
                          "(pip install 'opfuse[ort]')") from None
    from opfuse.api import onnx_proto, ZOO_PREFIX
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # Never hand onnxruntime the path: its loader would follow external-data paths unchecked.
    sess = ort.InferenceSession(onnx_proto(model_spec).SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, {k: v for k, v in feeds.items()})
    return dict(zip(names, res))


def compare_outputs(ours: dict, theirs: dict) -> list[tuple[str, float, float]]:
    """(name, max abs error, max relative error) for every output both sides produced."""
    rows = []
    for name, a in ours.items():
        if name not in theirs:
            continue
        b = np.asarray(theirs[name])
        diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
        abs_err = float(diff.max()) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(b.astype(np.float64)), 1e-12)
        rows.append((name, abs_err, float(rel.max()) if rel.size else 0.0))
    return rows


# Commands --------------------------------------------------------------------------------

def cmd_info(args) -> int:
    from opfuse.report.summary import format_summary, summarize
    graph = _load(args)
    print(format_summary(summarize(graph)))
    return 0


def cmd_run(args) -> int:
    graph = _load(args)
    feeds = _read_inputs(args.inputs, graph, args.seed)
    t0 = time.perf_counter()
    if args.backend == "reference":
        from opfuse.runtime.reference import run
        outputs = run(graph, feeds)
    else:
        from opfuse.runtime.native import compile_graph
        model = compile_graph(graph, fuse=not args.no_fuse, threads=args.threads)
        outputs = model.run(feeds)
    elapsed = time.perf_counter() - t0
    for name, a in outputs.items():
        print(f"{name}: {a.dtype.name}{list(a.shape)} sum={float(np.sum(a, dtype=np.float64)):.6g} "
              f"mean={float(np.mean(a, dtype=np.float64)) if a.size else 0.0:.6g}")
    print(f"backend {args.backend}: {elapsed * 1e3:.1f} ms")
    if args.outputs:
        np.savez(args.outputs, **outputs)
        print(f"wrote {args.outputs}")
    if args.compare:
        theirs = _ort_outputs(args.model, graph, feeds)
        for name, abs_err, rel_err in compare_outputs(outputs, theirs):
            print(f"compare {args.compare} {name}: max abs error {abs_err:.3g}, max rel error {rel_err:.3g}")
    return 0


def cmd_zoo(args) -> int:
    from opfuse import zoo
    if args.zoo_cmd == "list":
        for name in zoo.list_models():
            print(f"{name:<22}{zoo.describe(name)}")
        return 0
    import onnx
    model = zoo.build_onnx(args.name)
    out = args.output or f"{args.name}.onnx"
    onnx.save_model(model, out)
    print(f"wrote {out}")
    return 0


def cmd_demo(args) -> int:
    """Import the zoo MobileNetV1, summarise it, run it with the reference executor."""
    from opfuse.api import load
    from opfuse.report.summary import format_summary, summarize
    from opfuse.runtime.reference import random_inputs, run
    graph = load("zoo:mobilenet_v1")
    print(format_summary(summarize(graph)))
    feeds = random_inputs(graph, seed=0)
    t0 = time.perf_counter()
    outs = run(graph, feeds)
    dt = time.perf_counter() - t0
    for name, a in outs.items():
        print(f"\nreference run: {name} {a.dtype.name}{list(a.shape)} "
              f"checksum={float(np.sum(a, dtype=np.float64)):.6f} ({dt * 1e3:.0f} ms)")
    return 0


# Parser ----------------------------------------------------------------------------------------

def _add_model(p) -> None:
    p.add_argument("model", help="path to an .onnx file, or zoo:NAME")
    p.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                   help="bind an input's shape, e.g. input=1x3x224x224 (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opfuse", description="An operator-fusion compiler for neural networks.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="op histogram, params, FLOPs, bytes and activation memory")
    _add_model(p)
    p.set_defaults(fn=cmd_info)

    p = sub.add_parser("run", help="run a model and print its outputs")
    _add_model(p)
    p.add_argument("--backend", choices=["reference", "c"], default="reference")
    p.add_argument("--inputs", help="npz file keyed by input names (default: seeded random inputs)")
    p.add_argument("--outputs", help="write outputs to this npz file")
    p.add_argument("--compare", choices=["onnxruntime"], help="also run in this runtime and print errors")
    p.add_argument("--seed", type=int, default=0, help="seed for random inputs")
    p.add_argument("--no-fuse", action="store_true", help="C backend: one kernel per op")
    p.add_argument("--threads", type=int, default=1, help="C backend: OpenMP threads")
    p.set_defaults(fn=cmd_run)

    p = sub.add_parser("zoo", help="built-in models")
    zsub = p.add_subparsers(dest="zoo_cmd", required=True)
    zsub.add_parser("list", help="list the built-in models")
    pe = zsub.add_parser("export", help="write a built-in model as ONNX")
    pe.add_argument("name")
    pe.add_argument("-o", "--output", help="output path (default NAME.onnx)")
    p.set_defaults(fn=cmd_zoo)

    p = sub.add_parser("demo", help="the main job on a built-in model")
    p.set_defaults(fn=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except OpfuseError as e:
        print(f"opfuse: error: {e}", file=sys.stderr)
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
