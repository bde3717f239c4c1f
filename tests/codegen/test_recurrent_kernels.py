"""LSTM, GRU and RNN in C (``codegen/recurrent.py``) against the reference executor.

Random configurations (every direction, both layouts, sequence_lens, clip, activations,
peepholes, input_forget, linear_before_reset, any subset of the outputs) are put side by side
in one graph per op, compiled once with the AVX2 micro-kernel and once as plain C99
(``simd="none"``). W, R and B are constants (packed at build time) in half of the cases and
run-time inputs (packed by the kernel) in the other half. Tolerance: rtol 1e-4, atol 2e-5
(float32 sums in another order, and the vectorised sigmoid/tanh within 3 ulp).
"""
from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.codegen.options import CodegenOptions
from opfuse.errors import InputError
from opfuse.ops import GraphBuilder
from opfuse.runtime import mcu, reference
from opfuse.runtime.native import build
from opfuse.testing.recurrent_cases import INPUT_NAMES, random_case

CASES_PER_OP = 8
RTOL, ATOL = 1e-4, 2e-5


def _suite(op: str, seed: int, dtype=np.float32):
    rng = np.random.default_rng(seed)
    b = GraphBuilder(f"{op.lower()}_suite", opset=14)
    feeds, outputs = {}, []
    for k in range(CASES_PER_OP):
        case = random_case(rng, op, seq_lens=True if k == 0 else None, clip=True if k == 0 else None,
                           direction="bidirectional" if k == 0 else None)
        case.inputs = [x.astype(dtype) if x is not None and x.dtype == np.float32 else x for x in case.inputs]
        consts = k % 2 == 1
        args = []
        for name, x in zip(INPUT_NAMES, case.inputs, strict=False):
            if x is None:
                args.append(None)
            elif consts and name in ("W", "R", "B"):
                args.append(b.const(f"c{k}_{name}", x))
            else:
                args.append(b.input(f"x{k}_{name}", x.shape, x.dtype))
                feeds[f"x{k}_{name}"] = x
        out = b.op(op, *args, name=f"{op.lower()}{k}", num_outputs=case.num_outputs, **case.attrs)
        outputs += list(out) if isinstance(out, tuple) else [out]
    return b.build(*outputs), feeds


@pytest.mark.parametrize("simd,block", [("auto", 32), ("none", 32), ("auto", 2)])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_recurrent_kernels_match_reference(op, simd, block, cache_dir):
    """``block``: time steps per input-projection GEMM (2: several blocks per sequence, the
    reverse direction taking them from the end)."""
    g, feeds = _suite(op, seed={"LSTM": 1, "GRU": 2, "RNN": 3}[op])
    want = reference.run(g, feeds)
    m = build(g, cache_dir=cache_dir, options=CodegenOptions(simd=simd, recurrent_block_steps=block), threads=1)
    assert m.program.num_functions == CASES_PER_OP  # one real kernel per recurrent node
    assert "opfuse_rnn_matvec" in m.program.source
    got = m.run(feeds)
    for v in g.outputs:
        np.testing.assert_allclose(got[v.name], want[v.name], rtol=RTOL, atol=ATOL, err_msg=v.name)


def test_long_lstm_layer_with_constant_weights(cache_dir):
    """One LSTM layer of the size the benchmark uses (input 128, hidden 128), 40 steps: more than
    one micro-kernel panel in both GEMM dimensions, a full and a partial block of steps, on two
    threads."""
    rng = np.random.default_rng(7)
    case = random_case(rng, "LSTM", layout=0, sizes=(40, 1, 128, 128), direction="forward", seq_lens=False,
                       activations=False, clip=False)
    b = GraphBuilder("lstm_layer", opset=14)
    x = b.input("X", case.inputs[0].shape)
    args = [x] + [b.const(n, a) if a is not None else None for n, a in zip(INPUT_NAMES[1:], case.inputs[1:],
                                                                          strict=False)]
    g = b.build(*b.op("LSTM", *args, num_outputs=3, **case.attrs))
    feeds = {"X": case.inputs[0]}
    want = reference.run(g, feeds)
    got = build(g, cache_dir=cache_dir, threads=2).run(feeds)
    for v in g.outputs:
        np.testing.assert_allclose(got[v.name], want[v.name], rtol=RTOL, atol=ATOL, err_msg=v.name)


def test_sequence_lens_out_of_range_is_an_input_error(cache_dir):
    rng = np.random.default_rng(9)
    case = random_case(rng, "GRU", layout=0, seq_lens=True, sizes=(3, 2, 2, 2))
    b = GraphBuilder("gru_lens", opset=14)
    args = [b.input(n, a.shape, a.dtype) if a is not None else None for n, a in zip(INPUT_NAMES, case.inputs,
                                                                                    strict=False)]
    g = b.build(*b.op("GRU", *args, num_outputs=2, **case.attrs))
    m = build(g, cache_dir=cache_dir, threads=1)
    feeds = case.feeds()
    m.run(feeds)
    feeds["sequence_lens"] = np.array([1, 4], np.int32)
    with pytest.raises(InputError, match="sequence_lens") as c_error:
        m.run(feeds)
    with pytest.raises(InputError) as reference_error:  # the same error (it was a ShapeError)
        reference.run(g, feeds)
    assert str(reference_error.value) == str(c_error.value)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_float64_kernels_match_reference(op, cache_dir):
    """float64 takes the direct-loop projection, the plain mat-vec and libm's activations."""
    g, feeds = _suite(op, seed={"LSTM": 4, "GRU": 5, "RNN": 6}[op], dtype=np.float64)
    want = reference.run(g, feeds)
    got = build(g, cache_dir=cache_dir, threads=1, options=CodegenOptions(recurrent_block_steps=2)).run(feeds)
    for v in g.outputs:
        assert got[v.name].dtype == np.float64
        np.testing.assert_allclose(got[v.name], want[v.name], rtol=1e-10, atol=1e-12, err_msg=v.name)


def test_float16_runs_in_float32_and_rounds_its_outputs(cache_dir):
    """float16 layers are computed in float32 (the float32_compute rewrite widens the inputs and
    rounds each output once), as onnxruntime's float16 kernels do; the reference computes the
    same float32 values and rounds them once, so the two agree to a float16 ulp."""
    rng = np.random.default_rng(4)
    case = random_case(rng, "RNN", layout=0, sizes=(2, 1, 2, 2))
    b = GraphBuilder("rnn16", opset=14)
    args = [b.input(n, a.shape, np.float16 if a.dtype == np.float32 else a.dtype) if a is not None else None
            for n, a in zip(INPUT_NAMES, case.inputs, strict=False)]
    g = b.build(b.op("RNN", *args, **case.attrs))
    feeds = {k: (v.astype(np.float16) if v.dtype == np.float32 else v) for k, v in case.feeds().items()}
    want = reference.run(g, feeds)
    got = build(g, cache_dir=cache_dir, threads=1).run(feeds)
    for v in g.outputs:
        assert got[v.name].dtype == np.float16
        np.testing.assert_allclose(got[v.name].astype(np.float32), want[v.name].astype(np.float32),
                                   rtol=2e-3, atol=2e-3, err_msg=v.name)


@pytest.mark.skipif(not mcu.tools_available(), reason="needs arm-none-eabi-gcc, newlib and qemu-system-arm "
                                                      "(`make mcu-tools`)")
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_cortex_m7_build_under_qemu(op):
    """The microcontroller build (plain C99, scratch inside the arena, embedded weights) of a
    bidirectional layer with sequence_lens and clip."""
    rng = np.random.default_rng(3)
    case = random_case(rng, op, layout=0, seq_lens=True, clip=True, direction="bidirectional", sizes=(5, 2, 3, 4))
    b = GraphBuilder(f"mcu_{op.lower()}", opset=14)
    args = [b.input(n, a.shape, a.dtype) if n == "X" else (b.const(n, a) if a is not None else None)
            for n, a in zip(INPUT_NAMES, case.inputs, strict=False)]
    g = b.build(*b.op(op, *args, num_outputs=2, **case.attrs))
    feeds = {"X": case.inputs[0]}
    want = reference.run(g, feeds)
    got = opfuse.compile(g, target="cortex-m7").run(feeds)
    for v in g.outputs:
        np.testing.assert_allclose(got[v.name], want[v.name], rtol=RTOL, atol=ATOL, err_msg=v.name)


def test_a_fused_prologue_is_refused_with_its_reason():
    """The recurrent kernels read X from memory: a plan fusing the op computing X into the RNN's kernel is
    refused, naming why."""
    from cg_support import group_by_names
    from opfuse.codegen import UnsupportedGroupError, generate
    b = GraphBuilder("rnn_prologue", opset=14)
    x = b.op("Relu", b.input("x", (3, 2, 4)), name="relu")
    y = b.op("RNN", x, b.const("w", np.ones((1, 5, 4), np.float32)), b.const("r", np.ones((1, 5, 5), np.float32)),
             hidden_size=5, name="rnn")
    g = b.build(y)
    with pytest.raises(UnsupportedGroupError, match=r"RNN reads its inputs from memory \(no fused prologue\)"):
        generate(g, group_by_names(g, [("recurrent", ["relu", "rnn"])]))
