"""Which MatMuls the integer kernels take (``qmatmul.int8_matmul_applies``, before ``qmatmul.py``'s portable kernel
and ``qmatmul_host.py``'s word GEMM): a 2-D MatMul accumulating in int32 of 8-bit activations less a constant zero
point and a constant weight of int16 range; anything else is refused (the generic lowering keeps it). No compiler."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen.qmatmul import int8_matmul_applies
from opfuse.memory.static import static_values
from opfuse.ops import GraphBuilder


def _applies(x_shape=(5, 7), n=3, x_dtype="int8", acc=TensorProto.INT32, wmax=100, w_const=True, zp=3):
    """x -> Cast(acc) -> Sub(zp) -> MatMul(w) (w: K x n, its largest magnitude ``wmax``): does the kernel take it?"""
    dt = np.int32 if acc == TensorProto.INT32 else np.float32
    b = GraphBuilder("q")
    x = b.input("x", x_shape, x_dtype)
    xc = b.op("Sub", b.op("Cast", x, to=int(acc)), b.const("zp", np.array(zp, dt)))
    k = x_shape[-1]
    w = np.resize(np.array([wmax, -1, 0, 7], dt), (k, n))
    wv = b.const("w", w) if w_const else b.input("w", (k, n), "int32" if dt == np.int32 else "float32")
    g = b.build(b.op("MatMul", xc, wv, name="mm"))
    (mm,) = [node for node in g.nodes if node.op_type == "MatMul"]
    return int8_matmul_applies(mm, static_values(g))


def test_an_int8_matmul_in_int32_with_constant_int16_weights_is_taken():
    assert _applies()
    assert _applies(x_dtype="uint8", zp=-255)
    assert _applies(wmax=32767) and _applies(wmax=-32767)


@pytest.mark.parametrize("params", [
    {"acc": TensorProto.FLOAT},  # a float MatMul of the same dequantized activations
    {"x_shape": (2, 5, 7)},  # batched: 3-D activations
    {"w_const": False},  # weights known only at run time
    {"wmax": 32768},  # beyond int16
    {"wmax": -32768},
    {"x_dtype": "int16"},  # not 8-bit activations
    {"zp": 256},  # a zero point no 8-bit type has
], ids=["float", "batched", "runtime-weights", "wide-weights", "wide-negative-weights", "int16-input", "zero-point"])
def test_anything_else_is_refused(params):
    assert not _applies(**params)


def test_the_portable_kernel_writes_no_column_past_an_odd_n(tmp_path):
    """``qmatmul.py`` takes two output columns per pass: with N odd the last pass's second column is past the row
    and must not be stored (it would land on the next row's first element, and past the end after the last row).
    The Cortex-M7 program, built for this host, run with poisoned bytes around its output: bit-exact, and nothing
    written outside the output."""
    import ctypes

    from opfuse.codegen import generate
    from opfuse.codegen.options import options_for_target
    from opfuse.compiler import CompileOptions, plan_model
    from opfuse.runtime.reference import run
    from test_int8_matmul_host import qmatmul
    from test_mcu_program import GUARD, POISON, HostRun

    g = qmatmul(M=4, K=9, N=7, relu=False, scales=(0.02, 0.05))
    comp = plan_model(g, CompileOptions(target="cortex-m7"))
    program = generate(comp.graph, comp.plan, memory=comp.memory, options=options_for_target("cortex-m7"))
    assert "int8 matmul" in program.source and "two output columns per pass" in program.source
    host = HostRun(program, tmp_path)
    x = np.random.default_rng(4).integers(-128, 128, (4, 9)).astype(np.int8)
    (out,) = program.outputs
    want = run(g, {"x": x})[out.name]
    for fill in (POISON, 0x00, 0xFF):  # a stray store of any value shows against one of these
        buf = np.full(want.nbytes + 2 * GUARD, fill, np.uint8)
        arena = np.zeros(program.arena_bytes + 64, np.uint8)
        ins = (ctypes.c_void_p * 1)(x.ctypes.data)
        outs = (ctypes.c_void_p * 1)(buf.ctypes.data + GUARD)
        assert host.lib.opfuse_run(ins, outs, ctypes.c_void_p(arena.ctypes.data + (-arena.ctypes.data % 64))) == 0
        got = buf[GUARD:GUARD + want.nbytes].view(want.dtype).reshape(want.shape)
        np.testing.assert_array_equal(got, want)
        assert (buf[:GUARD] == fill).all() and (buf[GUARD + want.nbytes:] == fill).all(), "a store past the output"
