"""float16 and bfloat16 in the C backend: bit-exact conversions, and C against the reference.

The conversions (``codegen.half``) are checked bit for bit against NumPy (float16) and ml_dtypes
(bfloat16) over every 16-bit pattern and a sweep of float32 patterns with the rounding edges, in
the vectorised build (``simd="auto"``, gcc -O3 -march=native) and the plain C99 one
(``simd="none"``, the Cortex-M7's), which must also agree with each other bit for bit.

Models: elementwise chains, Conv, MatMul/Gemm, reductions, Softmax, LayerNorm and Casts, fused and
unfused, against the reference executor on the original graph. Every op rounds its result to the
16-bit type in both (``rewrites.float32_compute``); the reference accumulates in float64 where the
C code accumulates in float32, so now and then an op's result rounds to the neighbouring 16-bit
value: one 16-bit ulp of that op's result, which a later cancellation (Conv + bias) carries into
the output as an absolute error. ``assert_half_close`` allows two 16-bit ulps relative to the
output element plus two of the output's largest magnitude.
"""
from __future__ import annotations

import numpy as np
import pytest

import opfuse
from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import build_native, plan_model
from opfuse.errors import UnsupportedDtypeError
from opfuse.ir.dtypes import BFLOAT16, FLOAT8S
from opfuse.ir.plan import FusionPlan
from opfuse.ops import GraphBuilder
from opfuse.runtime import mcu
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

HALVES = [np.dtype(np.float16), BFLOAT16]
IDS = ["float16", "bfloat16"]
rng = np.random.default_rng(16)


def _sweep_f32() -> np.ndarray:
    """float32 patterns: every 9973rd, all of [2^-15, 2^-13] (float16's subnormal/normal edge),
    the top of float16's range (65504 .. 65536) and float16's smallest subnormals, both signs."""
    parts = [np.arange(0, 2 ** 32, 9973, dtype=np.uint64), np.arange(0x38000000, 0x39000000, 7, dtype=np.uint64),
             np.arange(0x477F0000, 0x47800000, dtype=np.uint64), np.arange(0x32FF0000, 0x33900000, 3, dtype=np.uint64)]
    bits = np.concatenate(parts).astype(np.uint32)
    return np.concatenate([bits, bits | 0x80000000]).view(np.float32)


def _same_bits_or_nan(got: np.ndarray, want: np.ndarray) -> None:
    g, w = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16 if got.itemsize == 2 else np.uint32),
                                  want[~nan].view(np.uint16 if want.itemsize == 2 else np.uint32))


def _cast_graph(x: np.ndarray, to: np.dtype):
    from onnx import helper
    b = GraphBuilder("cast")
    y = b.op("Cast", b.input("x", x.shape, x.dtype), to=int(helper.np_dtype_to_tensor_dtype(np.dtype(to))), name="c")
    return b.build(y)


def _run_c(graph, feeds, simd="auto", plan=None):
    return build(graph, plan, options=CodegenOptions(simd=simd)).run(feeds)


@pytest.mark.parametrize("half", HALVES, ids=IDS)
@pytest.mark.parametrize("simd", ["auto", "none"])
def test_conversions_are_bit_exact(half, simd):
    every16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(half)
    wide = _run_c(_cast_graph(every16, np.float32), {"x": every16}, simd)["c"]
    _same_bits_or_nan(wide, every16.astype(np.float32))
    x = _sweep_f32()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(half)
    _same_bits_or_nan(_run_c(_cast_graph(x, half), {"x": x}, simd)["c"], want)


@pytest.mark.parametrize("half", HALVES, ids=IDS)
def test_portable_equals_vectorised(half):
    """simd="auto" (float16: F16C's vcvtps2ph/vcvtph2ps where the host has them, else the helpers
    gcc vectorises) and the plain C99 build give the same bits, NaN payloads included."""
    x = _sweep_f32()
    every16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(half)
    for data in (x, every16):
        g = _cast_graph(data, half if data is x else np.float32)
        vec = build(g, None, options=CodegenOptions(simd="auto"))
        plain = build(g, None, options=CodegenOptions(simd="none"))
        a, b = vec.run({"x": data})["c"], plain.run({"x": data})["c"]
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        intrinsic = "_mm256_cvtps_ph" if data is x else "_mm256_cvtph_ps"
        assert (intrinsic in vec.program.source) == (half == np.float16)  # under #if F16C: compiled where present
        assert "_mm256" not in plain.program.source


@pytest.mark.parametrize("half", HALVES, ids=IDS)
def test_double_and_integers_round_once(half):
    """Double -> 16-bit float is one rounding (no double rounding through float32): values just
    off a 16-bit midpoint by less than float32 can see round away from the midpoint's even side."""
    step = 2.0 ** -10 if half == np.float16 else 2.0 ** -7  # ulp at [1, 2)
    mids = 1.0 + (np.arange(1, 200) + 0.5) * step
    x = np.concatenate([mids + 2.0 ** -40, mids - 2.0 ** -40, mids, -mids, [0.0, -0.0, 1e300, -1e300, np.inf, np.nan]])
    with np.errstate(over="ignore"):
        want = x.astype(half)
    _same_bits_or_nan(_run_c(_cast_graph(x, half), {"x": x})["c"], want)
    ints = np.array([0, 1, -7, 65504, 65519, 65520, 2 ** 30 + 2 ** 22 + 1, -(2 ** 31)], dtype=np.int64)
    with np.errstate(over="ignore"):
        want = ints.astype(half)
    _same_bits_or_nan(_run_c(_cast_graph(ints, half), {"x": ints})["c"], want)


@pytest.mark.parametrize("half", HALVES, ids=IDS)
def test_casts_from_16_bits(half):
    x = np.array([0.0, -0.0, 1.5, -2.75, 300.0, np.inf, -np.inf, np.nan], dtype=np.float32).astype(half)
    for to in (np.float64, np.int32, np.bool_, np.float16, BFLOAT16):
        xs = x[:5] if to == np.int32 else x  # finite values for the integer
        g = _cast_graph(xs, to)
        got, want = _run_c(g, {"x": xs})["c"], run(g, {"x": xs})["c"]
        assert got.dtype == np.dtype(to)
        if to == np.bool_:
            np.testing.assert_array_equal(got, want)  # -0.0 is False, NaN True
        else:
            _same_bits_or_nan(got, want)


# Models: C fused and unfused against the reference -----------------------------------------------

def W(b, half, *shape, scale=0.3):
    return b.const(f"w{len(b.graph.values)}", (rng.standard_normal(shape) * scale).astype(np.float32).astype(half))


def _elementwise(b, half):
    x = b.input("x", (2, 3, 8, 8), half)
    y = b.op("Sigmoid", b.op("Mul", b.op("Relu", x), W(b, half, 8)))
    return b.op("Add", b.op("Tanh", y), x)


def _conv(b, half):
    x = b.input("x", (1, 4, 9, 9), half)
    c = b.op("Conv", x, W(b, half, 8, 4, 3, 3), W(b, half, 8), pads=[1, 1, 1, 1])
    return b.op("Relu", b.op("Add", c, W(b, half, 8, 1, 1)))


def _matmul_gemm(b, half):
    x = b.input("x", (6, 16), half)
    m = b.op("MatMul", x, W(b, half, 16, 12))
    g = b.op("Gemm", m, W(b, half, 10, 12), W(b, half, 10), transB=1)
    return b.op("Relu", g)


def _reductions(b, half):
    x = b.input("x", (4, 10, 6), half)
    s = b.op("ReduceSum", x, axes=[1], keepdims=1)
    m = b.op("ReduceMax", b.op("Mul", x, s), axes=[2], keepdims=0)
    return b.op("ReduceMean", m, axes=[1], keepdims=1)


def _softmax_layernorm(b, half):
    x = b.input("x", (3, 5, 32), half)
    sm = b.op("Softmax", b.op("Mul", x, b.const("t", np.array(2.0, np.float32).astype(half))), axis=-1)
    return b.op("LayerNormalization", b.op("Add", sm, x), W(b, half, 32), W(b, half, 32), axis=-1, epsilon=1e-5)


def _casts(b, half):
    x = b.input("x", (4, 17), np.float32)
    h = b.op("Cast", x, to=10 if half == np.float16 else 16)
    y = b.op("Exp", b.op("Neg", b.op("Abs", h)))
    return b.op("Cast", b.op("Add", y, h), to=1)


MODELS = {"elementwise": _elementwise, "conv": _conv, "matmul_gemm": _matmul_gemm, "reductions": _reductions,
          "softmax_layernorm": _softmax_layernorm, "casts": _casts}


def assert_half_close(got: np.ndarray, want: np.ndarray, half) -> None:
    """Within two 16-bit ulps (2^-10 float16, 2^-7 bfloat16) of the element plus two of the largest."""
    assert got.dtype == want.dtype
    g, w = got.astype(np.float64), want.astype(np.float64)
    ulp = 2.0 ** -10 if np.dtype(half) == np.float16 else 2.0 ** -7
    np.testing.assert_allclose(g, w, rtol=2 * ulp, atol=2 * ulp * float(np.max(np.abs(w), initial=0.0)))


@pytest.mark.parametrize("half", HALVES, ids=IDS)
@pytest.mark.parametrize("name", list(MODELS))
def test_models_fused_and_unfused_match_the_reference(name, half):
    b = GraphBuilder(name)
    g = b.build(MODELS[name](b, half))
    feeds = {v.name: (rng.standard_normal(v.shape)).astype(np.float32).astype(v.dtype) for v in g.inputs}
    want = run(g, feeds)
    kernels = {}
    for fuse in (True, False):
        model = opfuse.compile(g, fuse=fuse)
        got = model.run(feeds)
        for k in want:
            assert_half_close(got[k], want[k], half)
        kernels[fuse] = model.report["kernels_after"]
        assert model.compilation.graph.outputs[0].dtype == g.outputs[0].dtype
    assert kernels[True] < kernels[False]  # the Casts fused into the kernels around them


@pytest.mark.parametrize("half", HALVES, ids=IDS)
def test_fused_elementwise_chain_is_one_kernel_reading_and_writing_16_bits(half):
    b = GraphBuilder("chain")
    g = b.build(_elementwise(b, half))
    model = opfuse.compile(g)
    assert model.report["kernels_after"] == 1
    assert "opfuse_f32_to_" in model.program.source
    # 16-bit in the ABI and the arena: input and output 2 bytes per element (the constant was
    # widened to float32 at compile time: 4 bytes per element)
    assert [s.dtype for s in model.program.outputs] == [np.dtype(half)]
    assert model.report["groups"][0]["bytes_after"] == 2 * (2 * 2 * 3 * 8 * 8) + 8 * 4


def test_op_computing_in_16_bits_without_the_rewrite_is_refused(cache_dir):
    """A plan made without ``float32_compute`` (its op reads float16 bits as numbers) is refused
    with the value, the node and the reason, never run on the bits."""
    b = GraphBuilder("f16")
    g = b.build(b.op("Relu", b.input("half_x", (2, 2), np.float16), name="relu"))
    with pytest.raises(UnsupportedDtypeError, match=r"^float16 is not supported by the C backend \(value 'half_x'\); "
                                                    r"node 'relu' \(Relu\) computes in it"):
        build(g, FusionPlan.unfused(g), cache_dir=cache_dir)


def test_16_bit_literals_are_their_bits():
    from opfuse.codegen.ctype import literal
    assert literal(1.0, np.float16) == "0x3c00u" and literal(-1.5, BFLOAT16) == "0xbfc0u"
    assert literal(np.nan, np.float16) == "0x7e00u" and literal(np.inf, BFLOAT16) == "0x7f80u"


@pytest.mark.parametrize("half", HALVES, ids=IDS)
def test_cast_of_a_16_bit_constant_unfused(half):
    """An unfused build folds nothing in the graph: the Cast of a 16-bit constant is computed at
    compile time (a static value, ``memory``) from the constant's 16-bit value."""
    b = GraphBuilder("k")
    x = b.input("x", (3,), half)
    k = b.const("k", np.array(-1.5, np.float32).astype(half))
    g = b.build(b.op("Mul", b.op("Cast", x, to=1), b.op("Cast", k, to=1)))
    feeds = {"x": np.array([1, 2, 3], np.float32).astype(half)}
    model = build(g, None)
    np.testing.assert_array_equal(list(model.run(feeds).values())[0], list(run(g, feeds).values())[0])


# float8 ------------------------------------------------------------------------------------------
FLOAT8 = sorted(FLOAT8S, key=str)


def _float8_probes(dt) -> np.ndarray:
    """Every code's value, the midpoints between neighbours and the float32s on either side of
    them (the ties and the rounding edges), beyond the largest value, infinities and NaN; a
    float32 sweep; both signs."""
    v = np.arange(256, dtype=np.uint8).view(dt).astype(np.float32)
    v = np.unique(v[np.isfinite(v) & (v >= 0)])
    mids = ((v[:-1].astype(np.float64) + v[1:]) / 2).astype(np.float32)
    top = v[-1]
    edges = np.concatenate([v, mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(np.inf)),
                            top * np.float32([1.01, 1.03, 1.0625, 1.07, 1.125, 1.2, 2, 1e30]), [np.inf, np.nan]])
    sweep = np.arange(0, 2 ** 31, 65521, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([edges.astype(np.float32), sweep])
    return np.concatenate([x, -x])


@pytest.mark.parametrize("dt", FLOAT8, ids=str)
@pytest.mark.parametrize("saturate", [1, 0])
def test_float8_casts_are_bit_exact(dt, saturate):
    from onnx import helper
    x = _float8_probes(dt)
    b = GraphBuilder("f8")
    y = b.op("Cast", b.input("x", x.shape, np.float32), to=int(helper.np_dtype_to_tensor_dtype(dt)),
             saturate=saturate, name="c")
    g = b.build(y)
    with np.errstate(over="ignore", invalid="ignore"):
        want = run(g, {"x": x})["c"].view(np.uint8)
    for simd in ("auto", "none"):
        got = _run_c(g, {"x": x}, simd)["c"]
        assert got.dtype == dt
        np.testing.assert_array_equal(got.view(np.uint8), want)  # NaN codes too
    if saturate:
        assert not np.any(np.isinf(want.view(dt).astype(np.float32)))
    every = np.arange(256, dtype=np.uint8).view(dt)
    _same_bits_or_nan(_run_c(_cast_graph(every, np.float32), {"x": every})["c"], every.astype(np.float32))


@pytest.mark.parametrize("dt", FLOAT8, ids=str)
def test_float8_round_trip_fused_matches_the_reference(dt):
    """float32 -> float8 -> float16 -> float32 with arithmetic between: one kernel, the reference's bits."""
    from onnx import helper
    b = GraphBuilder("f8chain")
    x = b.input("x", (5, 33), np.float32)
    scaled = b.op("Mul", x, b.const("s", np.array(30.0, np.float32)))
    q = b.op("Cast", scaled, to=int(helper.np_dtype_to_tensor_dtype(dt)))
    h = b.op("Cast", q, to=10)
    g = b.build(b.op("Add", b.op("Cast", h, to=1), x))
    feeds = {"x": rng.standard_normal((5, 33)).astype(np.float32)}
    model = opfuse.compile(g)
    assert model.report["kernels_after"] == 1
    np.testing.assert_array_equal(model.run(feeds)[g.outputs[0].name], run(g, feeds)[g.outputs[0].name])


@pytest.mark.skipif(not mcu.tools_available(), reason="Cortex-M7 tests need arm-none-eabi-gcc, newlib and "
                                                      "qemu-system-arm: run `make mcu-tools`")
def test_cortex_m7_float16_conv_and_float8_cast_match_the_reference():
    """The plain C99 helpers on the Cortex-M7 (QEMU): float16 Conv + Relu, then float8 and bfloat16 Casts."""
    b = GraphBuilder("m7")
    x = b.input("x", (1, 4, 8, 8), np.float16)
    c = b.op("Relu", b.op("Conv", x, W(b, np.float16, 4, 4, 3, 3), pads=[1, 1, 1, 1]))
    g = b.build(b.op("Cast", b.op("Cast", c, to=17), to=16))
    feeds = {"x": rng.standard_normal((1, 4, 8, 8)).astype(np.float16)}
    got, want = opfuse.compile(g, target="cortex-m7").run(feeds), run(g, feeds)
    for k in want:
        assert_half_close(got[k], want[k], BFLOAT16)


@pytest.mark.parametrize("half", HALVES, ids=IDS)
def test_fused_round_trip_is_one_helper_with_the_same_bits(half):
    """float32 -> 16 bits -> float32 inside a fused loop is ``opfuse_f16_round``/``opfuse_bf16_round``:
    the same bits as the two conversions (NumPy/ml_dtypes), and as the unfused build's stand-alone
    Cast kernels and the plain C99 build, NaN payloads included."""
    x = _sweep_f32()
    b = GraphBuilder("trip")
    h = b.op("Cast", b.input("x", x.shape, np.float32), to=10 if half == np.float16 else 16, name="down")
    g = b.build(b.op("Cast", h, to=1, name="c"))
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(half).astype(np.float32)
    got = {}
    for fuse, simd in ((True, "auto"), (True, "none"), (False, "auto")):
        model = build_native(plan_model(g, fuse=fuse), codegen_options=CodegenOptions(simd=simd))
        assert ("_round(" in model.program.source) == fuse
        got[fuse, simd] = model.run({"x": x})["c"]
        _same_bits_or_nan(got[fuse, simd], want)
    assert opfuse.compile(g).report["kernels_after"] == 1
    for k in got:
        np.testing.assert_array_equal(got[k].view(np.uint32), got[True, "auto"].view(np.uint32))


def _blocked_chain(n: int):
    """float16 Relu -> Mul -> Abs + x -> Neg: reads x twice, rounds to float16 after each op."""
    b = GraphBuilder("blocked")
    x = b.input("x", (3, n), np.float16)
    w = b.const("w", (rng.standard_normal(n) * 4).astype(np.float16))
    y = b.op("Abs", b.op("Mul", b.op("Relu", x), w))
    return b.build(b.op("Neg", b.op("Add", y, x)))


@pytest.mark.parametrize("n", [131, 40, 24])
def test_f16c_blocks_in_fused_loops_give_the_portable_bits(n):
    """A fused float16 loop on an F16C target converts its loads, round trips and stores 8 lanes at
    a time in blocks (64 elements for a row of 131: two blocks and a remainder of 3; 32 for 40; none
    for 24, shorter than ``f16c_min_block``); its bits are the plain C99 build's (portable helpers),
    over every float16 pattern (NaN, infinities, subnormals), and the reference's where not NaN."""
    g = _blocked_chain(n)
    every16 = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    plan = plan_model(g)
    assert plan.report["kernels_after"] == 1
    vec = build_native(plan, codegen_options=CodegenOptions(simd="auto"))
    plain = build_native(plan, codegen_options=CodegenOptions(simd="none"))
    assert ("_mm256_cvtps_ph(_mm256_loadu_ps" in vec.program.source) == (n >= 32)
    assert "_mm256" not in plain.program.source
    for start in range(0, 65536, 3 * n):
        feed = {"x": np.resize(np.roll(every16, -start), (3, n))}
        a, b = vec.run(feed)["neg"], plain.run(feed)["neg"]
        np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))
    with np.errstate(all="ignore"):
        _same_bits_or_nan(a, run(g, feed)["neg"])
