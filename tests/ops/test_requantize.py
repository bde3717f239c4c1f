"""``Requantize`` (``opfuse.ops.quantized``): the fixed-point requantization, against exact rational
arithmetic, in the reference and in C (plain C99 too)."""
from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto

import opfuse
from opfuse.codegen.options import CodegenOptions
from opfuse.errors import InputError, ShapeError
from opfuse.ops.builder import GraphBuilder
from opfuse.ops.quantized import MULTIPLIER_BITS, fixed_point_multiplier, requantize, residual_multiplier
from opfuse.runtime.native import build
from opfuse.runtime.reference import run

RNG = np.random.default_rng(5)


def _exact(acc: int, mult: int, shift: int, zp: int, lo: int, hi: int) -> int:
    v = Fraction(acc * mult, 1 << shift)
    q = round(v)  # Python's round on a Fraction: half to even
    return max(lo, min(hi, q + zp))


@pytest.mark.parametrize("m", [1e-6, 3.1e-4, 0.0123, 0.5, 0.999999, 1.0, 7.25])
def test_fixed_point_multiplier_has_31_bits(m):
    mult, shift = fixed_point_multiplier(m)
    assert 1 << (MULTIPLIER_BITS - 1) <= mult < 1 << MULTIPLIER_BITS
    assert abs(Fraction(mult, 1 << shift) - Fraction(m)) <= Fraction(m) / (1 << MULTIPLIER_BITS)


@pytest.mark.parametrize("m", [0.0, -0.5, float("inf"), 2.0 ** 40, 2.0 ** -40])
def test_a_multiplier_out_of_range_is_refused(m):
    with pytest.raises(InputError):
        fixed_point_multiplier(m)


def test_requantize_equals_exact_rounding_half_to_even():
    acc = np.concatenate([RNG.integers(-2 ** 31, 2 ** 31, 2000), [0, 1, -1, 3, -3, 5, -5, 2 ** 31 - 1, -2 ** 31]])
    acc = acc.astype(np.int32)
    mult, shift = fixed_point_multiplier(0.0037)
    got = requantize(acc, np.array(mult, np.int32), np.array(shift, np.int32), -3, -128, 127)
    assert [int(v) for v in got] == [_exact(int(a), mult, shift, -3, -128, 127) for a in acc]
    # ties: multiplier 2^30 with shift 31 is m = 1/2, so every odd accumulator is a tie
    ties = requantize(np.array([1, 3, 5, -1, -3], np.int32), np.array(1 << 30, np.int32), np.array(31, np.int32),
                      0, -128, 127)
    assert list(ties) == [0, 2, 2, 0, -2]


def _graph(per_channel: bool, out=TensorProto.INT8, zp=3, lo=-128, hi=127):
    b = GraphBuilder("rq")
    acc = b.input("acc", (2, 3, 5), "int32")
    ms = [0.0031, 0.047, 0.9] if per_channel else [0.0123]
    pairs = [fixed_point_multiplier(m) for m in ms]
    shape = (1, 3, 1) if per_channel else ()
    mult = b.const("mult", np.array([p[0] for p in pairs], np.int32).reshape(shape))
    shift = b.const("shift", np.array([p[1] for p in pairs], np.int32).reshape(shape))
    y = b.op("Requantize", acc, mult, shift, zero_point=zp, lo=lo, hi=hi, to=out)
    return b.build(y)


@pytest.mark.parametrize("simd", ["auto", "none"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_c_equals_the_reference(per_channel, simd):
    g = _graph(per_channel)
    acc = RNG.integers(-40000, 40000, (2, 3, 5)).astype(np.int32)
    acc[0, 0, :3] = [0, -2 ** 31, 2 ** 31 - 1]
    want = run(g, {"acc": acc})
    got = build(g, options=CodegenOptions(simd=simd)).run({"acc": acc})
    (name,) = want
    assert want[name].dtype == np.int8
    np.testing.assert_array_equal(got[name], want[name])


def test_uint8_output_and_a_relu_clamp():
    g = _graph(False, out=TensorProto.UINT8, zp=10, lo=10, hi=255)
    acc = np.linspace(-5000, 30000, 30).astype(np.int32).reshape(2, 3, 5)
    (y,) = run(g, {"acc": acc}).values()
    assert y.dtype == np.uint8 and y.min() == 10 and y.max() == 255
    np.testing.assert_array_equal(opfuse.compile(g).run({"acc": acc})[g.outputs[0].name], y)


def test_bad_operands_are_refused():
    b = GraphBuilder("rq")
    acc = b.input("acc", (4,), "float32")
    with pytest.raises(ShapeError, match="int32"):
        b.op("Requantize", acc, b.const("m", np.int32(1 << 30)), b.const("s", np.int32(31)))
    b = GraphBuilder("rq")
    acc = b.input("acc", (4,), "int32")
    with pytest.raises(ShapeError, match="clamp"):
        b.op("Requantize", acc, b.const("m", np.int32(1 << 30)), b.const("s", np.int32(31)), lo=5, hi=4)


@pytest.mark.parametrize("per_channel", [False, True])
def test_exported_as_int64_onnx_it_runs_in_onnxruntime_exactly(per_channel):
    ort = pytest.importorskip("onnxruntime")
    from opfuse.frontend.onnx import export_model
    g = _graph(per_channel)
    acc = RNG.integers(-2 ** 31, 2 ** 31, (2, 3, 5)).astype(np.int32)
    acc[0, 0, :4] = [0, -2 ** 31, 2 ** 31 - 1, -7]
    sess = ort.InferenceSession(export_model(g).SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = sess.run(None, {"acc": acc})
    (ours,) = run(g, {"acc": acc}).values()
    np.testing.assert_array_equal(theirs, ours)


def _residual_graph():
    """``Requantize(acc, m, s, res, rm)``: the residual Add of a ResNet block in integers."""
    b = GraphBuilder("rq_res")
    acc = b.input("acc", (2, 3, 5), "int32")
    res = b.input("res", (2, 3, 5), "int32")
    pairs = [fixed_point_multiplier(m) for m in (0.0031, 0.047, 0.5)]
    shift = np.array([p[1] for p in pairs], np.int32).reshape(1, 3, 1)
    rmult = np.array([residual_multiplier(0.8, int(s)) for s in shift.ravel()], np.int64).reshape(1, 3, 1)
    y = b.op("Requantize", acc, b.const("m", np.array([p[0] for p in pairs], np.int32).reshape(1, 3, 1)),
             b.const("s", shift), res, b.const("rm", rmult), zero_point=-4, lo=-128, hi=127, to=TensorProto.INT8)
    return b.build(y), pairs, shift, rmult


def _feeds():
    acc = RNG.integers(-60000, 60000, (2, 3, 5)).astype(np.int32)
    acc[0, 0, :3] = [0, -2 ** 31, 2 ** 31 - 1]
    res = RNG.integers(-255, 256, (2, 3, 5)).astype(np.int32)
    return {"acc": acc, "res": res}


def test_residual_requantize_equals_exact_rounding():
    g, pairs, shift, rmult = _residual_graph()
    feeds = _feeds()
    (got,) = run(g, feeds).values()
    for i in np.ndindex(feeds["acc"].shape):
        c = i[1]
        v = Fraction(int(feeds["acc"][i]) * pairs[c][0] + int(feeds["res"][i]) * int(rmult.ravel()[c]),
                     1 << int(shift.ravel()[c]))
        assert got[i] == max(-128, min(127, round(v) - 4)), i


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_residual_requantize_c_equals_the_reference(simd):
    g, *_ = _residual_graph()
    feeds = _feeds()
    want = run(g, feeds)
    got = build(g, options=CodegenOptions(simd=simd)).run(feeds)
    (name,) = want
    np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_ties_round_half_to_even_in_c(simd):
    b = GraphBuilder("ties")
    acc = b.input("acc", (8,), "int32")
    g = b.build(b.op("Requantize", acc, b.const("m", np.int32(1 << 30)), b.const("s", np.int32(31)),
                     zero_point=0, lo=-128, hi=127, to=TensorProto.INT8))
    x = np.array([1, 3, 5, -1, -3, -5, 7, -7], np.int32)  # m = 1/2: every odd accumulator is a tie
    got = build(g, options=CodegenOptions(simd=simd)).run({"acc": x})
    np.testing.assert_array_equal(next(iter(got.values())), [0, 2, 2, 0, -2, -2, 4, -4])


def test_a_residual_multiplier_out_of_range_is_refused():
    with pytest.raises(InputError, match="leaves int64"):
        residual_multiplier(2.0 ** 20, 40)


def test_residual_exported_as_int64_onnx_runs_in_onnxruntime_exactly():
    ort = pytest.importorskip("onnxruntime")
    from opfuse.frontend.onnx import export_model
    g, *_ = _residual_graph()
    feeds = _feeds()
    sess = ort.InferenceSession(export_model(g).SerializeToString(), providers=["CPUExecutionProvider"])
    (theirs,) = sess.run(None, feeds)
    (ours,) = run(g, feeds).values()
    np.testing.assert_array_equal(theirs, ours)


def _per_channel_ties_graph(shifts):
    """m = 1/2 in every channel (multiplier 2^(s-1) at shift s): odd accumulators are ties."""
    b = GraphBuilder("ties_pc")
    acc = b.input("acc", (1, len(shifts), 8), "int32")
    s = np.array(shifts, np.int32).reshape(1, -1, 1)
    m = np.array([1 << 30] * len(shifts), np.int32).reshape(1, -1, 1)
    shift = b.const("s", s)
    y = b.op("Requantize", acc, b.const("m", m), shift, zero_point=0, lo=-128, hi=127, to=TensorProto.INT8)
    return b.build(y)


@pytest.mark.parametrize("simd", ["auto", "none"])
def test_per_channel_shift_takes_precomputed_powers_bit_exactly(simd):
    """A static per-channel shift: the C uses ``opfuse_requantize_pc`` (its powers of two from the
    weights) and equals the reference, ties and the extreme shifts 31 and 62 included."""
    from opfuse.codegen.program import generate
    g = _per_channel_ties_graph([31, 62, 40])
    assert "opfuse_requantize_pc(" in generate(g).source
    x = np.array([1, 3, 5, -1, -3, -5, 2 ** 31 - 1, -2 ** 31], np.int32)
    feeds = {"acc": np.stack([x, x, x])[None]}
    want = next(iter(run(g, feeds).values()))
    np.testing.assert_array_equal(want[0, 0], [0, 2, 2, 0, -2, -2, 127, -128])
    got = next(iter(build(g, options=CodegenOptions(simd=simd)).run(feeds).values()))
    np.testing.assert_array_equal(got, want)


def test_a_scalar_shift_below_33_keeps_the_plain_helper():
    """Refused for both faster forms: a scalar shift (the C compiler folds its powers) under 33 (the
    high word alone cannot round it)."""
    from opfuse.codegen.program import generate
    b = GraphBuilder("rq")
    acc = b.input("acc", (4,), "int32")
    g = b.build(b.op("Requantize", acc, b.const("m", np.int32(1 << 30)), b.const("s", np.int32(32)),
                     zero_point=0, lo=-128, hi=127, to=TensorProto.INT8))
    src = generate(g).source
    assert "opfuse_requantize(" in src and "opfuse_requantize_pc(" not in src and "opfuse_requantize_hi(" not in src


@pytest.mark.parametrize("simd", ["auto", "none"])
@pytest.mark.parametrize("shifts", [[33], [33, 62, 40], [47, 34]])
def test_shifts_from_33_round_on_the_high_word_bit_exactly(shifts, simd):
    """Every shift in [33, 62]: ``opfuse_requantize_hi`` (32-bit arithmetic), equal to exact rounding
    half to even: ties (m = 2^30 / 2^s), values just off a tie (low word nonzero), the int32 extremes."""
    from opfuse.codegen.program import generate
    g = _per_channel_ties_graph(shifts) if len(shifts) > 1 else None
    if g is None:
        b = GraphBuilder("hi")
        acc = b.input("acc", (1, 1, 8), "int32")
        g = b.build(b.op("Requantize", acc, b.const("m", np.int32(1 << 30)), b.const("s", np.int32(shifts[0])),
                         zero_point=-3, lo=-128, hi=127, to=TensorProto.INT8))
    src = generate(g).source
    assert "opfuse_requantize_hi(" in src and "opfuse_requantize_pc(" not in src
    rows = []
    for s in shifts:
        tie = 1 << (s - 31)  # acc * 2^30 / 2^s = acc / 2^(s-30): a tie at odd multiples of 2^(s-31)
        rows.append([tie, 3 * tie, -tie, -3 * tie, tie + 1, 3 * tie - 1, 2 ** 31 - 1, -2 ** 31])
    x = np.array(rows, np.int64).clip(-2 ** 31, 2 ** 31 - 1).astype(np.int32)[None]
    want = next(iter(run(g, {"acc": x}).values()))
    zp = -3 if len(shifts) == 1 else 0
    for c, s in enumerate(shifts):
        exact = [_exact(int(a), 1 << 30, s, zp, -128, 127) for a in x[0, c]]
        assert list(want[0, c]) == exact
    got = next(iter(build(g, options=CodegenOptions(simd=simd)).run({"acc": x}).values()))
    np.testing.assert_array_equal(got, want)
