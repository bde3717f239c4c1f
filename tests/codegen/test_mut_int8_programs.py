"""Programs that mutation testing (tests/mutation/mutT.md, issue 13) showed no test built: int8 kernels run with
guard bytes around their outputs, arena and scratch (``CompiledModel.run_guarded``: a store past an end raises), two
element-by-element int8 matmuls in one program, an int8 conv beside an int8 matmul in one NEON program (under
qemu-aarch64), and the NEON micro-kernel's channels per pass. Results are compared with the reference executor bit
for bit."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.errors import OpfuseError
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run
from test_int8_conv_tail import FLOAT, _dq
from test_int8_conv_tail import check as tail_check
from test_int8_host import _built_with, _feeds
from test_int8_two_layers import _conv_and_matmul

AVX512 = CodegenOptions(vector_isa="avx512")
NEON = CodegenOptions(vector_isa="neon")
HOST_NOTE = "host word GEMM, columns in lanes"


def _matmul(b, x, zp, w, tag):
    """8-bit x -> Cast/Sub(zp) -> MatMul(w): the int32 accumulator."""
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const(f"zp_{tag}", np.array(zp, np.int32)))
    return b.op("MatMul", xc, b.const(f"w_{tag}", w), name=f"mm_{tag}")


def _accumulator_out(M=9, K=13, N=10):
    """uint8 x (M x K) -> Cast/Sub -> MatMul -> the int32 accumulator, a graph output also read by a Neg: the word
    GEMM's tiles handed to the (empty) epilogue element by element, stored straight into the output."""
    b = GraphBuilder("acc_out")
    acc = _matmul(b, b.input("x", (M, K), "uint8"), 3, np.arange(-65, 65)[: K * N].reshape(K, N).astype(np.int32),
                  "a")
    return b.build(acc, b.op("Neg", acc))


def _builds(comp, options=AVX512):
    """The host builds of one plan: ``options``, with AVX2 alone, without AVX2 (the plain ``#else``)."""
    gg, plan = comp.plan.graph, comp.plan
    return (build(gg, plan, memory=comp.memory, options=options),
            _built_with(gg, plan, options, "-mno-avx512f"), _built_with(gg, plan, options, "-mno-avx2"))


def _guarded_bit_exact(g, models):
    feeds = _feeds(g)
    want = run(g, feeds)
    for model in models:
        got = model.run_guarded(feeds)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("M", [9, 1])
def test_element_by_element_tiles_store_no_row_past_the_output(M):
    """M not a multiple of the register block's rows: the last tile's rows past M are neither stored nor handed to
    the epilogue (the output lies between guard bytes)."""
    g = _accumulator_out(M)
    comp = plan_model(g)
    source = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert "epilogue element by element" in source and HOST_NOTE in source
    _guarded_bit_exact(g, _builds(comp))


def test_two_element_by_element_matmuls_keep_their_own_corrections():
    """Two int8 matmuls of unsigned quads side by side, each accumulator an output: each its own zero-point
    correction (``-zp * sum_k w[k, n]``) in the weights blob, bit-exact in every host build."""
    rng = np.random.default_rng(31)
    b = GraphBuilder("two_corrections")
    outs = []
    for tag, zp, shape in (("a", 3, (7, 12, 10)), ("b", -100, (5, 12, 10))):
        M, K, N = shape
        acc = _matmul(b, b.input(f"x{tag}", (M, K), "uint8" if zp >= 0 else "int8"), zp,
                      rng.integers(-128, 128, (K, N)).astype(np.int32), tag)
        outs += [acc, b.op("Neg", acc)]
    g = b.build(*outs)
    comp = plan_model(g)
    source = generate(comp.plan.graph, comp.plan, options=AVX512).source
    assert source.count("epilogue element by element") == 2 and source.count("u8 x s8 quads") == 2
    _guarded_bit_exact(g, _builds(comp))


@pytest.mark.parametrize("K", [32, 31])
def test_the_portable_matmuls_column_stays_in_its_scratch(K):
    """qmatmul.py's kernel (plain C99) gathers a row into an int16 column of K rounded up to even: with K even (a
    column of exactly 64 bytes for K = 32) nothing is stored past it, with K odd the pad is zeroed; the scratch lies
    between guard bytes (one thread: another's scratch would follow it)."""
    rng = np.random.default_rng(32)
    b = GraphBuilder("portable")
    acc = _matmul(b, b.input("x", (5, K), "int8"), -7, rng.integers(-300, 300, (K, 6)).astype(np.int32), "p")
    g = b.build(acc, b.op("Neg", acc))
    comp = plan_model(g)
    plain = CodegenOptions(simd="none")
    assert "opfuse_dot2_s16" in generate(comp.plan.graph, comp.plan, options=plain).source
    _guarded_bit_exact(g, [build(comp.plan.graph, comp.plan, options=plain, threads=1)])


def test_a_guarded_run_sees_a_store_past_an_output():
    """``run_guarded`` itself: a model whose output binding is one row short has its last row stored into the
    guard, and the run says so."""
    g = _accumulator_out(4)
    comp = plan_model(g)
    model = build(comp.plan.graph, comp.plan, options=AVX512)
    feeds = _feeds(g)
    want = run(g, feeds)
    got = model.run_guarded(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    b = model._binding
    shape, dtype = b.output_specs[0]
    b.output_specs = ((shape[0] - 1, *shape[1:]), dtype), *b.output_specs[1:]
    with pytest.raises(OpfuseError, match=r"out of the bounds of output '.*' \(\d+ bytes\): 0 bytes past its end"):
        model.run_guarded(feeds)


def test_a_tail_reading_the_first_of_two_bias_sums_keeps_the_portable_kernel_with_a_reason():
    """Conv -> Add(bias) -> s1 -> Add(bias2) -> Requantize, and a float tail adding the dequantized result to a
    function of s1 (not of the requantized value alone): the host kernel refuses it, the group keeps qconv.py's
    kernel (bit-exact) and the notes say why."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("two_biases")
    x = b.input("x", (1, 4, 6, 7), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(1, np.int32)))
    acc = b.op("Conv", xc, b.const("w", rng.integers(-100, 100, (5, 4, 3, 3)).astype(np.int32)), name="conv",
               pads=[1] * 4)
    s1 = b.op("Add", acc, b.const("bias", rng.integers(-300, 300, (1, 5, 1, 1)).astype(np.int32)))
    s2 = b.op("Add", s1, b.const("bias2", rng.integers(-300, 300, (1, 5, 1, 1)).astype(np.int32)))
    m, s = fixed_point_multiplier(1e-3)
    q = b.op("Requantize", s2, b.const("m", np.array(m, np.int32)), b.const("s", np.array(s, np.int32)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    y = b.op("Add", _dq(b, q, 0, 0.5, "y"), b.op("Mul", b.op("Cast", s1, to=FLOAT),
                                                  b.const("k", np.array(1e-3, np.float32))))
    g = b.build(y)
    assert [grp.op_types for grp in plan_model(g).plan.groups] == [
        ["Cast", "Sub", "Conv", "Add", "Add", "Requantize", "Cast", "Sub", "Mul", "Cast", "Mul", "Add"]]
    _, source = tail_check(g, expect_host=False)
    assert "int8 conv 'node_conv': host int8 kernel not used: a Add after the Requantize reads the accumulator" \
        in source


# aarch64 (NEON) under qemu-aarch64 -------------------------------------------------------------------------------

def _needs_aarch64():
    from opfuse.runtime import aarch64
    if not aarch64.tools_available():
        pytest.skip("aarch64 tests need aarch64-linux-gnu-gcc and qemu-aarch64: run `make aarch64-tools`")


@pytest.mark.parametrize("arch", ["dotprod", "neon"])
def test_an_int8_conv_and_matmul_in_one_neon_program_are_bit_exact(arch):
    """qgemm.py's NEON conv and qmatmul_host.py's NEON matmul in one program share the vector requantization helper
    (defined once, or the program does not compile) and are bit-exact under QEMU, with and without sdot."""
    _needs_aarch64()
    from opfuse.runtime import aarch64
    g = _conv_and_matmul()
    comp = plan_model(g)
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, comp.memory, options=NEON)
    assert "NEON s8 x s8 GEMM, columns in lanes" in program.source and "int8 conv" in program.source
    feeds = _feeds(g)
    want = run(g, feeds)
    got = aarch64.run_on_qemu(program, feeds, arch=arch).outputs
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_the_neon_kernel_without_sdot_takes_as_many_channels_per_pass_as_its_registers_hold():
    """Armv8.0-A (``vmull_s8``): a pass over P channels of NV vectors holds 2 P NV accumulators, the NV vectors'
    2 halves and a weight word in the 32 vector registers; P is the most of 4, 2, 1 that fit, for every block."""
    from opfuse.codegen.qgemm import NEON_BLOCKS, _neon_pass_channels
    for MR, NV in NEON_BLOCKS:
        P = _neon_pass_channels(NV)
        assert MR % P == 0 and 2 * P * NV + 2 * NV + 1 <= 32, (MR, NV, P)
        bigger = [p for p in (4, 2) if p > P]
        assert all(2 * p * NV + 2 * NV + 1 > 32 for p in bigger), (MR, NV, P)
