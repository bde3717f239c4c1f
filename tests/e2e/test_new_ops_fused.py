"""Issue 12's ops fuse by their category: elementwise ones join Conv/MatMul epilogues and
reduction prologues/epilogues, the new reductions anchor a kernel of their own, data movement
joins injective groups. Each graph is compiled through the whole pipeline (``opfuse.compile``),
its kernels counted, and its outputs compared with the reference executor."""
from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.ops import GraphBuilder
from opfuse.runtime import reference

RNG = np.random.default_rng(21)
I64 = np.int64


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _compile_and_check(g):
    """The rules' maximal plan (not the cost model's choice), so the kernel counts are the
    fusion rules' verdict on the new ops."""
    model = opfuse.compile(g, target="host", threads=1, planner="rules")
    feeds = reference.random_inputs(g, 0)
    got, want = model.run(feeds), reference.run(g, feeds)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, name
        np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5, err_msg=name)
    return model.report


def test_conv_epilogue_takes_prelu_elu_and_comparisons():
    b = GraphBuilder("conv_prelu")
    x = b.input("x", (1, 4, 8, 8))
    y = b.op("Conv", x, b.const("w", _w(8, 4, 3, 3)), pads=[1, 1, 1, 1], name="conv")
    y = b.op("PRelu", y, b.const("slope", _w(8, 1, 1)), name="prelu")
    y = b.op("Elu", y, name="elu")
    y = b.op("Where", b.op("Greater", y, b.const("t", np.float32(0.1)), name="gt"), y,
             b.op("Round", y, name="round"), name="where")
    report = _compile_and_check(b.build(y))
    assert report["kernels_before"] == 6 and report["kernels_after"] == 1


def test_matmul_epilogue_takes_mish_and_selu():
    b = GraphBuilder("mm_mish")
    x = b.input("x", (16, 32))
    y = b.op("Mish", b.op("MatMul", x, b.const("w", _w(32, 24)), name="mm"), name="mish")
    report = _compile_and_check(b.build(b.op("Selu", y, name="selu")))
    assert report["kernels_after"] == 1


@pytest.mark.parametrize("op,attrs", [("ReduceL2", {"axes": [-1]}), ("ReduceLogSumExp", {"axes": [1]}),
                                      ("ReduceMin", {"axes": [0, 2], "keepdims": 0}), ("ArgMax", {"axis": 1}),
                                      ("LogSoftmax", {"axis": -1}), ("GlobalMaxPool", {})])
def test_reduction_takes_prologue_and_epilogue(op, attrs):
    b = GraphBuilder(f"red_{op}")
    x = b.input("x", (2, 6, 5, 7))
    p = b.op("Sin", b.op("Mul", x, b.const("s", np.float32(1.5)), name="scale"), name="sin")
    r = b.op(op, p, name="red", **attrs)
    out = b.op("Cast", r, to=1, name="cast") if op == "ArgMax" else b.op("Abs", r, name="abs")
    report = _compile_and_check(b.build(out))
    assert report["kernels_before"] == 4 and report["kernels_after"] == 1


def test_cumsum_takes_an_epilogue():
    b = GraphBuilder("cumsum")
    x = b.input("x", (3, 50))
    y = b.op("CumSum", b.op("Relu", x, name="relu"), b.const("axis", np.array(1, I64)), name="cs")
    report = _compile_and_check(b.build(b.op("Sqrt", y, name="sqrt")))
    assert report["kernels_after"] == 1


def test_data_movement_fuses_with_elementwise():
    b = GraphBuilder("movement")
    x = b.input("x", (1, 8, 4, 6))
    y = b.op("DepthToSpace", b.op("Floor", x, name="floor"), blocksize=2, name="d2s")
    y = b.op("Tile", y, b.const("reps", np.array([1, 1, 2, 1], I64)), name="tile")
    report = _compile_and_check(b.build(b.op("Neg", y, name="neg")))
    assert report["kernels_before"] == 4 and report["kernels_after"] == 1
