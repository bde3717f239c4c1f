"""The spatial sampling kernels against onnxruntime, one op per model, one thread each.

    python benchmarks/bench_sampling.py [--repeat 15]

Each case is a one-node ONNX model compiled by ``opfuse.compile`` (host, 1 thread) and run in an
onnxruntime session (1 intra-op thread); runs alternate between the two and each is timed in
process CPU time (``time.process_time``), so other processes' load counts less. Prints the median
milliseconds, their ratio (opfuse / onnxruntime: below 1 is faster) and the largest difference
between the two outputs.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import helper, numpy_helper

F = 1  # TensorProto.FLOAT


def _model(node, inputs, inits=(), opset=21):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                          [helper.make_tensor_value_info("y", F, None)], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def cases(rng) -> dict:
    def x(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    def const(name, arr):
        return numpy_helper.from_array(np.asarray(arr), name)

    lo = rng.uniform(0, 40, (64, 2))
    rois = np.concatenate([lo, lo + rng.uniform(2, 20, (64, 2))], 1).astype(np.float32)
    return {
        "GridSample bilinear 1x32x64x64": (
            _model(helper.make_node("GridSample", ["x", "g"], ["y"], mode="linear"),
                   [("x", [1, 32, 64, 64]), ("g", [1, 64, 64, 2])]),
            {"x": x(1, 32, 64, 64), "g": rng.uniform(-1, 1, (1, 64, 64, 2)).astype(np.float32)}),
        "GridSample bicubic border 1x16x48x48": (
            _model(helper.make_node("GridSample", ["x", "g"], ["y"], mode="cubic", padding_mode="border"),
                   [("x", [1, 16, 48, 48]), ("g", [1, 48, 48, 2])]),
            {"x": x(1, 16, 48, 48), "g": rng.uniform(-1, 1, (1, 48, 48, 2)).astype(np.float32)}),
        "Resize cubic x2 1x16x64x64": (
            _model(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="cubic"), [("x", [1, 16, 64, 64])],
                   [const("s", np.array([1, 1, 2, 2], np.float32))]),
            {"x": x(1, 16, 64, 64)}),
        "Resize linear antialias x0.5 1x16x128x128": (
            _model(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear", antialias=1),
                   [("x", [1, 16, 128, 128])], [const("s", np.array([1, 1, 0.5, 0.5], np.float32))]),
            {"x": x(1, 16, 128, 128)}),
        "RoiAlign 64 rois 7x7 C=64": (
            _model(helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], output_height=7, output_width=7,
                                    sampling_ratio=2), [("x", [1, 64, 64, 64])],
                   [const("r", rois), const("b", np.zeros(64, np.int64))], opset=16),
            {"x": x(1, 64, 64, 64)}),
        "Col2Im 3x3 1x144x1024 -> 1x16x32x32": (
            _model(helper.make_node("Col2Im", ["x", "i", "k"], ["y"], pads=[1, 1, 1, 1]), [("x", [1, 144, 1024])],
                   [const("i", np.array([32, 32], np.int64)), const("k", np.array([3, 3], np.int64))]),
            {"x": x(1, 144, 1024)}),
        "DeformConv 3x3 16->16 32x32": (
            _model(helper.make_node("DeformConv", ["x", "w", "o"], ["y"], pads=[1, 1, 1, 1]),
                   [("x", [1, 16, 32, 32]), ("o", [1, 18, 32, 32])], [const("w", x(16, 16, 3, 3))]),
            {"x": x(1, 16, 32, 32), "o": rng.uniform(-1, 1, (1, 18, 32, 32)).astype(np.float32)}),
    }


def main() -> None:
    import onnxruntime as ort

    import opfuse
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=15)
    args = p.parse_args()
    print(f"{'case':42s} {'opfuse ms':>10s} {'ort ms':>9s} {'ratio':>6s} {'max diff':>9s}")
    for name, (model, feeds) in cases(np.random.default_rng(0)).items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        compiled = opfuse.compile(model, target="host", threads=1)
        ours = compiled.run(feeds)["y"]
        diff = float(np.max(np.abs(ours - sess.run(None, feeds)[0])))
        t_ours, t_ort = [], []
        for _ in range(args.repeat):
            t = time.process_time()
            compiled.run(feeds)
            t_ours.append(time.process_time() - t)
            t = time.process_time()
            sess.run(None, feeds)
            t_ort.append(time.process_time() - t)
        a, b = 1e3 * float(np.median(t_ours)), 1e3 * float(np.median(t_ort))
        print(f"{name:42s} {a:10.3f} {b:9.3f} {a / b:6.2f} {diff:9.2e}")


if __name__ == "__main__":
    main()
