"""A float Cast to an integer type is total, and the same in the reference and in C (issue 13); so are
OneHot's float and uint64 indices.

ONNX leaves a Cast of NaN or of an out-of-range float to an integer type undefined; in C a bare
``(uint8_t)x`` of such a value is undefined behaviour, and GCC used it: in a fused QuantizeLinear ->
DequantizeLinear (``Clip -> Cast(uint8) -> Cast(float)``) it dropped the conversion pair, so a NaN
input came out of the fused build as 0 where the unfused build and the reference had the zero point's
value (a hand probe of random QDQ models). opfuse defines the conversion as Arm's FPU, WebAssembly's
``trunc_sat`` and Rust's ``as`` do: truncation toward zero, beyond the range its nearest end, NaN 0.
The expectations below are worked out in Python integers, not by NumPy's conversion."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import opfuse
from opfuse.compiler import CompileOptions, plan_model
from opfuse.ops import GraphBuilder
from opfuse.ops.elementwise import float_to_int
from opfuse.ir.plan import FusionGroup, FusionPlan
from opfuse.runtime import reference
from opfuse.runtime.native import build
from opfuse.testing.fuzz_check import codegen_options

INT_TYPES = (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)
# next to every bound: a value one below the top (126.5 for int8, 254.5 for uint8) and one above the bottom
# (-127.0, -127.5; 1.0 for the unsigned types) truncate, they do not saturate
EDGES = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, -0.99, -1.0, 1.0, 1.5, -1.5, 126.5, 127.9, 128.0,
         -127.0, -127.5, -128.5, 254.5,
         -129.0, 255.5, 256.0, 32767.5, 32768.0, -32769.0, 65535.9, 65536.0, 2.0 ** 31, -2.0 ** 31,
         -2.0 ** 31 - 4096, 2.0 ** 32, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 1e30, -1e30, 65504.0]


def edges(src) -> np.ndarray:
    with np.errstate(over="ignore"):  # float16: the large ones are its infinities
        return np.array(EDGES, dtype=src)


def expected(values: np.ndarray, to) -> list[int]:
    """Each value (its exact float) truncated toward zero, held to ``to``'s range; NaN 0."""
    info = np.iinfo(to)
    out = []
    for v in values.astype(np.float64):
        if math.isnan(v):
            out.append(0)
        elif math.isinf(v):
            out.append(int(info.max) if v > 0 else int(info.min))
        else:
            out.append(min(max(math.trunc(v), int(info.min)), int(info.max)))
    return out


@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("to", INT_TYPES)
def test_the_reference_truncates_saturates_and_sends_nan_to_zero(src, to):
    x = edges(src)
    y = float_to_int(x, np.dtype(to))
    assert y.dtype == to
    assert [int(v) for v in y] == expected(x, to)


def _casts_model(src) -> bytes:
    """``x`` cast to every integer type (each an output), and the int8 one cast back to float and scaled:
    the conversion pair a fused kernel could drop."""
    st = helper.np_dtype_to_tensor_dtype(np.dtype(src))
    nodes, outputs = [], []
    for to in INT_TYPES:
        tt = helper.np_dtype_to_tensor_dtype(np.dtype(to))
        nodes.append(helper.make_node("Cast", ["x"], [f"y_{np.dtype(to).name}"], to=tt))
        outputs.append(helper.make_tensor_value_info(f"y_{np.dtype(to).name}", tt, [len(EDGES)]))
    nodes += [helper.make_node("Cast", ["y_int8"], ["back"], to=TensorProto.FLOAT),
              helper.make_node("Mul", ["back", "two"], ["scaled"])]
    outputs.append(helper.make_tensor_value_info("scaled", TensorProto.FLOAT, [len(EDGES)]))
    graph = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info("x", st, [len(EDGES)])], outputs,
                              [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model.SerializeToString()


@pytest.mark.parametrize("src", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("profile", ["default", "avx2", "portable"])
def test_c_casts_floats_to_every_integer_type_as_the_reference(src, profile, cache_dir):
    model = _casts_model(src)
    x = edges(src)
    want = reference.run(opfuse.load(model), {"x": x})
    for to in INT_TYPES:
        assert [int(v) for v in want[f"y_{np.dtype(to).name}"]] == expected(x, to)
    np.testing.assert_array_equal(want["scaled"], 2 * np.array(expected(x, np.int8), np.float32))
    for fuse in (False, True):
        comp = plan_model(model, CompileOptions(fuse=fuse))
        got = build(comp.graph, comp.plan, threads=1, memory=comp.memory, options=codegen_options(profile),
                    cache_dir=cache_dir).run({"x": x})
        for name, w in want.items():
            np.testing.assert_array_equal(got[name], w, err_msg=f"{name}, fused={fuse}, {profile}")


def _quantize_dequantize(b: GraphBuilder, x, scale: float, zero: int):
    """QuantizeLinear (uint8) then DequantizeLinear, as the importer writes them."""
    q = b.op("Div", x, b.const("s", np.array(scale, np.float32)))
    q = b.op("Add", b.op("Round", q), b.const("z", np.array(zero, np.float32)))
    q = b.op("Clip", q, b.const("lo", np.array(0, np.float32)), b.const("hi", np.array(255, np.float32)))
    q = b.op("Cast", q, to=TensorProto.UINT8)
    back = b.op("Cast", q, to=TensorProto.FLOAT)
    return b.op("Mul", b.op("Sub", back, b.const("z2", np.array(zero, np.float32))),
                b.const("s2", np.array(scale, np.float32)))


@pytest.mark.parametrize("threads", [1, 2])
def test_a_fused_quantize_dequantize_of_nan_is_the_unfused_value(threads, cache_dir):
    """NaN quantizes to 0, as -1e9 does (clipped), and dequantizes to ``-zero * scale``: fused as unfused (the
    fused kernel kept the NaN through the conversion pair, and the Add made the sum NaN)."""
    b = GraphBuilder("qdq_nan")
    x = b.input("x", (4, 40), "float32")
    r = b.input("r", (4, 40), "float32")
    y = b.op("Add", _quantize_dequantize(b, x, 0.0107, 102), _quantize_dequantize(b, r, 0.0343, 151))
    g = b.build(y)
    xs = np.random.default_rng(1).uniform(-2, 2, (2, 4, 40)).astype(np.float32)
    xs[0, 0, 0], xs[0, 1, 7], xs[0, 3, 39] = np.nan, np.inf, -1e30
    feeds = {"x": xs[0], "r": xs[1]}
    want = reference.run(g, feeds)[y.name]
    low = reference.run(g, {"x": np.where(np.isnan(xs[0]), np.float32(-1e9), xs[0]), "r": xs[1]})[y.name]
    np.testing.assert_array_equal(want, low)
    assert np.isfinite(want).all()
    fused = FusionPlan(g, [FusionGroup("all", list(g.nodes), "elementwise")])
    for plan in (None, fused):
        got = build(g, plan, threads=threads, cache_dir=cache_dir).run(feeds)[y.name]
        np.testing.assert_array_equal(got, want, err_msg="fused" if plan else "unfused")


def _onehot_model(dtype) -> bytes:
    it = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=-1)], "onehot",
        [helper.make_tensor_value_info("i", it, [10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [10, 5])],
        [helper.make_tensor("d", TensorProto.INT64, [], [5]),
         helper.make_tensor("v", TensorProto.FLOAT, [2], [0.0, 1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model.SerializeToString()


@pytest.mark.parametrize("dtype, values, hot", [
    (np.float32, [2.7, -1.5, -4.9, np.nan, np.inf, -np.inf, 1e30, -5.5, 4.99, 2.0 ** 62],
     [2, 4, 1, None, None, None, None, 0, 4, None]),
    (np.float64, [2.7, -1.5, -4.9, np.nan, np.inf, -np.inf, 1e300, -5.5, 4.99, -2.0 ** 62],
     [2, 4, 1, None, None, None, None, 0, 4, None]),
    (np.uint64, [2, 4, 5, 0, 2 ** 64 - 1, 2 ** 64 - 5, 2 ** 63, 1, 3, 2 ** 63 - 1],
     [2, 4, None, 0, None, None, None, 1, 3, None]),
])
def test_onehot_indices_out_of_range_match_nothing(dtype, values, hot, cache_dir):
    """Float indices truncate; NaN, infinities and huge floats match no position (their conversion to
    int64 was undefined in C), and so does a uint64 above the depth (2^64 - 1 wrapped to -1 and matched the
    last position, in the reference and in C)."""
    model = _onehot_model(dtype)
    i = np.array(values, dtype=dtype)
    want = np.zeros((10, 5), np.float32)
    for row, j in enumerate(hot):
        if j is not None:
            want[row, j] = 1
    np.testing.assert_array_equal(reference.run(opfuse.load(model), {"i": i})["y"], want)
    for fuse in (False, True):
        comp = plan_model(model, CompileOptions(fuse=fuse))
        got = build(comp.graph, comp.plan, threads=1, memory=comp.memory, cache_dir=cache_dir).run({"i": i})["y"]
        np.testing.assert_array_equal(got, want, err_msg=f"fused={fuse}")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_integer_gemm_with_a_fractional_scale_beyond_the_range_is_its_end(dtype, cache_dir):
    """An integer Gemm with a fractional beta scales in double and converts back: a sum beyond the type's
    range is its nearest end in both backends (C's conversion was undefined there: UBSan in a fuzz run)."""
    info = np.iinfo(dtype)
    big = (int(info.max) + 1) // 2  # 2^30, 2^62, 2^31: 3 x big is past the top, -2 x big the bottom
    b = GraphBuilder("gemm_scaled")
    a = b.input("a", (3, 2), np.dtype(dtype).name)
    w = b.const("w", np.array([[1], [1]], dtype))
    c = b.const("c", np.array([1], dtype))
    y = b.op("Gemm", a, w, c, alpha=3.0, beta=0.5)
    g = b.build(y)
    lows = [-big, -big] if info.min < 0 else [0, 0]
    x = np.array([[big, 0], lows, [5, 2]], dtype)
    want = np.array([[info.max], [info.min if info.min < 0 else 0], [21]], dtype)
    np.testing.assert_array_equal(reference.run(g, {"a": x})[y.name], want)
    for plan in (None, FusionPlan(g, [FusionGroup("all", list(g.nodes), "gemm")])):
        got = build(g, plan, threads=1, cache_dir=cache_dir).run({"a": x})[y.name]
        np.testing.assert_array_equal(got, want, err_msg="fused" if plan else "unfused")


@pytest.mark.parametrize("as_attributes", [False, True])
@pytest.mark.parametrize("bounds, helper", [((0.0, 255.0), "opfuse_cvt_float32_uint8_in_range"),
                                            ((-1000.0, 1000.0), "opfuse_cvt_float32_uint8("),
                                            ((0.0, 256.0), "opfuse_cvt_float32_uint8(")])
def test_a_cast_after_a_clip_inside_the_range_tests_only_nan(bounds, helper, as_attributes, cache_dir):
    """A Clip to constant bounds inside the integer type's range before the Cast (QuantizeLinear's) leaves only
    NaN to handle: the cheaper helper; bounds reaching past the range keep the saturating one. Same values. The
    bounds as inputs or, as opset 6 wrote them, attributes (``ops.elementwise.clip_bounds`` reads both)."""
    from opfuse.codegen import generate
    b = GraphBuilder("clip_cast")
    x = b.input("x", (6,), "float32")
    if as_attributes:  # opset 6's Clip
        q = b.op("Clip", x, min=bounds[0], max=bounds[1])
    else:
        q = b.op("Clip", x, b.const("lo", np.array(bounds[0], np.float32)),
                 b.const("hi", np.array(bounds[1], np.float32)))
    y = b.op("Cast", q, to=TensorProto.UINT8)
    g = b.build(y)
    fused = FusionPlan(g, [FusionGroup("all", list(g.nodes), "elementwise")])
    assert helper in generate(g, fused).source
    xs = np.array([300.0, -300.0, np.nan, 254.7, 0.5, -0.5], np.float32)
    want = np.array(expected(np.clip(xs, *bounds), np.uint8), np.uint8)
    np.testing.assert_array_equal(reference.run(g, {"x": xs})[y.name], want)
    for plan in (None, fused):
        np.testing.assert_array_equal(build(g, plan, threads=1, cache_dir=cache_dir).run({"x": xs})[y.name], want)
