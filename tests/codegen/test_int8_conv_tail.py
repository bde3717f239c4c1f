"""The host int8 conv (``codegen/qgemm.py``) with element-wise ops after its Requantize: onnxruntime's QDQ form of a
residual block (the Requantize's output dequantized to float, plus a dequantized residual, quantized again:
``Div, Round, Add, Clip, Cast``) and a float tail without a residual. The vectorised Requantize, then the tail on
each requantized value (``finish_element``): bit-exact (no tolerance) against the reference executor and the
portable kernel (``simd="none"``, ``qconv.py``), built for AVX-512, without it (AVX2), without AVX2 (the plain
``#else``) and, where QEMU is installed, for aarch64 (NEON, with and without the dot product)."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

from opfuse.codegen import generate
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run
from test_int8_host import _feeds, one_kernel_bit_exact
from test_int8_matmul_host import _needs_aarch64

HOST = CodegenOptions(vector_isa="avx512")
TAIL_NOTE = "element-wise epilogue after the vectorised Requantize"
FLOAT = int(TensorProto.FLOAT)


def _dq(b, q, zp: int, scale: float, name: str):
    """onnxruntime's DequantizeLinear as opfuse lowers it: Cast to float, Sub the zero point, Mul the scale."""
    f = b.op("Cast", q, to=FLOAT)
    return b.op("Mul", b.op("Sub", f, b.const(f"{name}_zp", np.array(zp, np.float32))),
                b.const(f"{name}_scale", np.array(scale, np.float32)))


def _quantize(b, y, scale: float, zp: int, dtype: str):
    """QuantizeLinear: Div, Round (half to even), Add the zero point, Clip, Cast."""
    info = np.iinfo(np.dtype(dtype))
    r = b.op("Round", b.op("Div", y, b.const("q_scale", np.array(scale, np.float32))))
    c = b.op("Clip", b.op("Add", r, b.const("q_zp", np.array(zp, np.float32))),
             b.const("q_lo", np.array(info.min, np.float32)), b.const("q_hi", np.array(info.max, np.float32)))
    return b.op("Cast", c, to=int(TensorProto.INT8 if dtype == "int8" else TensorProto.UINT8))


def qconv_tail(cin=8, cout=6, hw=(9, 11), k=3, stride=1, pad=1, group=1, x_dtype="int8", zp=-7, out_dtype="int8",
               out_zp=3, residual=True, quantize=True, relu=False, seed=0, batch=1):
    """x -> Cast/Sub(zp) -> Conv -> Add(bias) -> Requantize -> DQ [+ DQ(r)] [-> Relu] [-> QuantizeLinear] -> y."""
    rng = np.random.default_rng(seed)
    b = GraphBuilder("qconv_tail")
    x = b.input("x", (batch, cin) + hw, x_dtype)
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(zp, np.int32)))
    w = rng.integers(-128, 128, (cout, cin // group, k, k)).astype(np.int32)
    acc = b.op("Conv", xc, b.const("w", w), name="conv", pads=[pad] * 4, strides=[stride] * 2, group=group)
    acc = b.op("Add", acc, b.const("bias", rng.integers(-3000, 3000, (1, cout, 1, 1)).astype(np.int32)))
    pairs = [fixed_point_multiplier(float(m)) for m in rng.uniform(1e-4, 3e-3, cout)]
    mult = np.array([p[0] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    shift = np.array([p[1] for p in pairs], np.int32).reshape(1, cout, 1, 1)
    info = np.iinfo(np.dtype(out_dtype))
    q = b.op("Requantize", acc, b.const("m", mult), b.const("s", shift), zero_point=out_zp, lo=int(info.min),
             hi=int(info.max), to=int(TensorProto.INT8 if out_dtype == "int8" else TensorProto.UINT8))
    y = _dq(b, q, out_zp, 0.05, "y")
    if residual:
        oh = (hw[0] + 2 * pad - k) // stride + 1
        ow = (hw[1] + 2 * pad - k) // stride + 1
        r = b.input("r", (batch, cout, oh, ow), "int8")
        y = b.op("Add", y, _dq(b, r, -2, 0.03, "r"))
    if relu:
        y = b.op("Relu", y)
    if quantize:
        y = _quantize(b, y, 0.07, 5 if out_dtype == "int8" else 128, out_dtype)
    return b.build(y)


def check(g, options=HOST, expect_host=True):
    comp, source = one_kernel_bit_exact(g, options)
    assert (TAIL_NOTE in source) == expect_host
    return comp, source


CASES = {
    "qdq-residual-3x3": {},  # onnxruntime's QDQ residual block
    "qdq-residual-1x1-stride2": {"k": 1, "pad": 0, "stride": 2, "cin": 16, "cout": 12, "hw": (10, 12)},
    "qdq-residual-1x1-flat": {"k": 1, "pad": 0, "cin": 16, "cout": 13, "hw": (5, 7)},
    "qdq-residual-uint8-batch2": {"x_dtype": "uint8", "zp": 128, "out_dtype": "uint8", "out_zp": 120, "batch": 2},
    "qdq-residual-relu": {"relu": True, "cout": 9, "hw": (6, 21)},
    "float-tail": {"residual": False, "quantize": False, "cout": 7},  # no residual: a float output
    "quantize-no-residual": {"residual": False, "cout": 10, "hw": (4, 30)},
    "grouped-stride2": {"group": 2, "cin": 6, "cout": 10, "stride": 2, "hw": (11, 13)},
    "deep-small-plane": {"cin": 20, "cout": 40, "hw": (3, 3)},  # weights in the outer loop
    "wide-rows-zmm": {"cin": 9, "cout": 10, "hw": (5, 53), "x_dtype": "uint8", "zp": 140},
    "dw-rows": {"group": 4, "cin": 4, "cout": 4, "hw": (6, 19)},
    "dw-channels": {"group": 10, "cin": 10, "cout": 10, "hw": (5, 6)},
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_conv_with_a_tail_after_the_requantize_is_bit_exact_on_the_host_kernel(case):
    check(qconv_tail(**CASES[case], seed=len(case)))


def test_a_tail_for_avx2_is_bit_exact():
    check(qconv_tail(), options=CodegenOptions(vector_isa="avx2"))


@pytest.mark.parametrize("after_bias", [False, True], ids=["conv-output", "after-the-bias"])
def test_a_tail_reading_the_accumulator_keeps_the_portable_kernel_with_a_reason(after_bias):
    """The float tail adds the int32 accumulator itself (the Conv's output, or the sum after the bias Add, which the
    Requantize reads too): not a function of the requantized value alone, so the group keeps qconv.py's kernel,
    exact, and the kernel's notes say why."""
    rng = np.random.default_rng(5)
    b = GraphBuilder("q")
    x = b.input("x", (1, 4, 6, 7), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32)), b.const("zp", np.array(1, np.int32)))
    acc = b.op("Conv", xc, b.const("w", rng.integers(-100, 100, (5, 4, 3, 3)).astype(np.int32)), name="conv",
               pads=[1] * 4)
    biased = b.op("Add", acc, b.const("bias", rng.integers(-300, 300, (1, 5, 1, 1)).astype(np.int32)))
    m, s = fixed_point_multiplier(1e-3)
    q = b.op("Requantize", biased, b.const("m", np.array(m, np.int32)), b.const("s", np.array(s, np.int32)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8))
    y = b.op("Add", _dq(b, q, 0, 0.5, "y"), b.op("Mul", b.op("Cast", biased if after_bias else acc, to=FLOAT),
                                                  b.const("k", np.array(1e-3, np.float32))))
    g = b.build(y)
    _, source = check(g, expect_host=False)
    reason = "a Cast reads the accumulator besides the Requantize" if after_bias else \
        "a Add after the Requantize reads the accumulator"
    assert f"host int8 kernel not used: {reason}" in source



NEON = CodegenOptions(vector_isa="neon")


@pytest.mark.parametrize("case", ["qdq-residual-3x3", "qdq-residual-1x1-flat", "dw-rows"])
@pytest.mark.parametrize("arch", ["dotprod", "neon"])
def test_neon_conv_with_a_tail_is_bit_exact(case, arch):
    _needs_aarch64()
    from opfuse.runtime import aarch64
    g = qconv_tail(**CASES[case], seed=len(case))
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    program = aarch64.generate_aarch64(comp.plan.graph, comp.plan, None, options=NEON)
    assert TAIL_NOTE in program.source
    np.testing.assert_array_equal(aarch64.run_on_qemu(program, feeds, arch=arch).outputs[name], want[name])


def test_neon_build_with_a_tail_compiled_for_x86_takes_the_plain_branch():
    g = qconv_tail(x_dtype="uint8", zp=100, cout=11)
    comp = plan_model(g)
    feeds = _feeds(g)
    want = run(g, feeds)
    (name,) = want
    source = generate(comp.plan.graph, comp.plan, options=NEON).source
    assert TAIL_NOTE in source
    np.testing.assert_array_equal(build(comp.plan.graph, comp.plan, options=NEON).run(feeds)[name], want[name])



def test_a_second_reader_of_the_accumulator_keeps_the_portable_kernel_with_a_reason():
    """The int32 accumulator read by the Requantize and, after it, by a Relu whose result is stored too (one fused
    group, planned by hand): the host kernel finishes the accumulator only through the Requantize, so the group
    keeps qconv.py's kernel, exact, and the notes say why."""
    from cg_support import group_by_names
    rng = np.random.default_rng(6)
    b = GraphBuilder("q")
    x = b.input("x", (1, 4, 6, 7), "int8")
    xc = b.op("Sub", b.op("Cast", x, to=int(TensorProto.INT32), name="cast"), b.const("zp", np.array(1, np.int32)),
              name="sub")
    acc = b.op("Conv", xc, b.const("w", rng.integers(-100, 100, (5, 4, 3, 3)).astype(np.int32)), name="conv",
               pads=[1] * 4)
    m, s = fixed_point_multiplier(1e-3)
    q = b.op("Requantize", acc, b.const("m", np.array(m, np.int32)), b.const("s", np.array(s, np.int32)),
             zero_point=0, lo=-128, hi=127, to=int(TensorProto.INT8), name="rq")
    g = b.build(q, b.op("Relu", acc, name="relu"))
    plan = group_by_names(g, [("conv_epilogue", ["cast", "sub", "conv", "rq", "relu"])])
    feeds = _feeds(g)
    want = run(g, feeds)
    got = build(g, plan).run(feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    source = generate(g, plan).source
    assert "host int8 kernel not used: a Relu reads the accumulator besides the Requantize" in source
