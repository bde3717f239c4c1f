"""onnxruntime's QOperator contrib ops (``frontend/onnx_qoperator.py``, domain com.microsoft): each imported as the
arithmetic of onnxruntime's CPU kernel, checked against onnxruntime on every 8-bit value (or pair of values) in
the reference executor and in the C backend; malformed scales and zero points refused in one line."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opfuse
from onnx_builders import init, op_types, ort_run, vi
from opfuse.errors import ShapeError, UnsupportedOpError
from opfuse.frontend.onnx import import_model
from opfuse.rules.qlinear_fixed import QLINEAR_ADD_FLOAT32, QLINEAR_FIXED_POINT
from opfuse.runtime.reference import run

pytest.importorskip("onnxruntime")
U8, I8, I32 = TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32
ELEM = {np.dtype(np.uint8): U8, np.dtype(np.int8): I8}
RNG = np.random.default_rng(15)
MS = "com.microsoft"
EXACT = (QLINEAR_FIXED_POINT, QLINEAR_ADD_FLOAT32)  # the fused build's rules that leave onnxruntime's arithmetic


def ms_model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])


def every_value(dt, shape=None) -> np.ndarray:
    info = np.iinfo(dt)
    v = np.arange(info.min, int(info.max) + 1).astype(dt)
    return v if shape is None else v.reshape(shape)


def _steps(m, feeds) -> dict[str, int]:
    """Per output: the largest |ours - onnxruntime's| in the reference and in C with the float forms kept
    (``EXACT`` disabled; 8-bit outputs compared as ints). The default fused build (its ``qlinear_*`` rules
    rewrite QLinearAdd and the requantizations) is checked within one step on the way."""
    theirs = ort_run(m, feeds)
    ours, native = run(import_model(m), feeds), opfuse.compile(m, disable=list(EXACT)).run(feeds)
    fused = opfuse.compile(m).run(feeds)
    out = {}
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype and native[name].dtype == t.dtype
        out[name] = max(int(np.abs(ours[name].astype(np.int64) - t.astype(np.int64)).max()),
                        int(np.abs(native[name].astype(np.int64) - t.astype(np.int64)).max()))
        assert np.abs(fused[name].astype(np.int64) - t.astype(np.int64)).max() <= max(out[name], 1)
    return out


def _params(dt, n: int):
    info = np.iinfo(dt)
    scales = [np.float32(RNG.uniform(0.004, 0.08)) for _ in range(n)]
    zeros = [np.array(RNG.integers(info.min // 2, info.max // 2 + 1), dt) for _ in range(n)]
    return scales, zeros


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_add_and_mul_equal_onnxruntime_on_every_pair(op, dt):
    """All 65536 (a, b) pairs: bit-exact (MLAS's AVX2 fma form for Add, its SSE2 form for Mul)."""
    a, b = np.meshgrid(every_value(dt), every_value(dt), indexing="ij")
    for _ in range(2):
        (sa, sb, sc), (za, zb, zc) = _params(dt, 3)
        inits = [init("sa", sa), init("za", za), init("sb", sb), init("zb", zb), init("sc", sc), init("zc", zc)]
        node = helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain=MS)
        elem = ELEM[np.dtype(dt)]
        m = ms_model([node], [vi("a", [256, 256], elem), vi("b", [256, 256], elem)], [vi("c", None, elem)], inits)
        assert _steps(m, {"a": a, "b": b}) == {"c": 0}


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_lookup_ops_on_every_value(dt):
    """QLinearLeakyRelu (an exact table) and QLinearConcat (identity tables) are bit-exact; QLinearSigmoid
    (onnxruntime's sigmoid is MLAS's approximation) is within one step and equal on nearly every value."""
    (xs, ys, cs), (xz, yz, cz) = _params(dt, 3)
    elem = ELEM[np.dtype(dt)]
    inits = [init("xs", xs), init("xz", xz), init("ys", np.float32(1 / 256)), init("yz", np.array(0, dt)),
             init("ls", ys), init("lz", yz), init("cs", cs), init("cz", cz)]
    nodes = [helper.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["sig"], domain=MS),
             helper.make_node("QLinearLeakyRelu", ["x", "xs", "xz", "ls", "lz"], ["leaky"], domain=MS, alpha=0.1),
             helper.make_node("QLinearConcat", ["cs", "cz", "x", "xs", "xz", "leaky", "ls", "lz", "x", "cs", "cz"],
                              ["cat"], domain=MS, axis=1)]
    m = ms_model(nodes, [vi("x", [1, 256], elem)], [vi(n, None, elem) for n in ("sig", "leaky", "cat")], inits)
    feeds = {"x": every_value(dt, (1, 256))}
    steps = _steps(m, feeds)
    assert steps["leaky"] == 0 and steps["cat"] == 0 and steps["sig"] <= 1
    theirs, ours = ort_run(m, feeds)["sig"], run(import_model(m), feeds)["sig"]
    assert (theirs != ours).sum() <= 4
    assert "Gather" in op_types(import_model(m))


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_pools_equal_onnxruntime(dt):
    (xs, ys, gs), (xz, yz, gz) = _params(dt, 3)
    elem = ELEM[np.dtype(dt)]
    inits = [init("xs", xs), init("xz", xz), init("ys", ys), init("yz", yz), init("gs", gs), init("gz", gz)]
    nodes = [helper.make_node("QLinearAveragePool", ["x", "xs", "xz", "ys", "yz"], ["avg"], domain=MS,
                              kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("QLinearGlobalAveragePool", ["x", "xs", "xz", "gs", "gz"], ["gap"], domain=MS)]
    m = ms_model(nodes, [vi("x", [1, 4, 9, 9], elem)], [vi("avg", None, elem), vi("gap", None, elem)], inits)
    info = np.iinfo(dt)
    feeds = {"x": RNG.integers(info.min, int(info.max) + 1, (1, 4, 9, 9)).astype(dt)}
    assert _steps(m, feeds) == {"avg": 0, "gap": 0}


@pytest.mark.parametrize("at, per_column, trans_b, quantized_out", [
    (np.uint8, True, True, True), (np.int8, False, False, True), (np.uint8, True, False, False)])
def test_qgemm_equals_onnxruntime(at, per_column, trans_b, quantized_out):
    k, n = 24, 10
    w = RNG.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    bs = RNG.uniform(0.002, 0.02, n if per_column else ()).astype(np.float32)
    bz = np.zeros(n if per_column else (), np.int8)
    inits = [init("as", np.float32(0.03)), init("az", np.array(9, at)), init("b", w), init("bs", bs),
             init("bz", bz), init("c", RNG.integers(-3000, 3000, n).astype(np.int32))]
    names = ["a", "as", "az", "b", "bs", "bz", "c"]
    elem = ELEM[np.dtype(at)]
    if quantized_out:
        inits += [init("ys", np.float32(0.15)), init("yz", np.array(3, at))]
        names += ["ys", "yz"]
    node = helper.make_node("QGemm", names, ["y"], domain=MS, transB=int(trans_b), alpha=1.0)
    m = ms_model([node], [vi("a", [3, k], elem)], [vi("y", None, elem if quantized_out else TensorProto.FLOAT)],
                 inits)
    info = np.iinfo(at)
    feeds = {"a": RNG.integers(info.min, int(info.max) + 1, (3, k)).astype(at)}
    if quantized_out:
        assert _steps(m, feeds) == {"y": 0}
        return
    theirs = ort_run(m, feeds)["y"]
    np.testing.assert_array_equal(run(import_model(m), feeds)["y"], theirs)
    np.testing.assert_array_equal(opfuse.compile(m).run(feeds)["y"], theirs)


@pytest.mark.parametrize("dt, yz", [(np.uint8, 0), (np.int8, -128)])
def test_qlinear_softmax_within_one_step(dt, yz):
    """onnxruntime's table-and-sum softmax; 100 rows of 10 (a classifier's): within one step (the float sum's
    order), and equal on nearly every element."""
    elem = ELEM[np.dtype(dt)]
    inits = [init("xs", np.float32(0.11)), init("xz", np.array(5, dt)), init("ys", np.float32(1 / 256)),
             init("yz", np.array(yz, dt))]
    node = helper.make_node("QLinearSoftmax", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, axis=-1, opset=13)
    m = ms_model([node], [vi("x", [100, 10], elem)], [vi("y", None, elem)], inits)
    info = np.iinfo(dt)
    x = RNG.integers(info.min, int(info.max) + 1, (100, 10)).astype(dt)
    x[0] = info.max  # a row of ties: 1/10 each
    assert _steps(m, {"x": x})["y"] <= 1
    assert (run(import_model(m), {"x": x})["y"] != ort_run(m, {"x": x})["y"]).sum() <= 10


# Refusals --------------------------------------------------------------------------------------

def _add_model(sa=None, za=None, elem=U8):
    sa = np.float32(0.1) if sa is None else sa
    za = np.array(3, np.uint8) if za is None else za
    inits = [init("sa", sa), init("za", za), init("sb", np.float32(0.1)), init("zb", np.array(1, np.uint8)),
             init("sc", np.float32(0.2)), init("zc", np.array(2, np.uint8))]
    node = helper.make_node("QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain=MS)
    return ms_model([node], [vi("a", [2, 4], elem), vi("b", [2, 4], U8)], [vi("c", None, U8)], inits)


@pytest.mark.parametrize("m, message", [
    (_add_model(sa=np.array([0.1, 0.2], np.float32)), "the A scale is float32[2]; expected a float32 scalar"),
    (_add_model(sa=np.float64(0.1)), "the A scale is float64[]"),
    (_add_model(za=np.array(3, np.int8)), "the A zero point is int8[]; expected a uint8 scalar"),
    (_add_model(elem=I8), "A is int8, B uint8"),
])
def test_malformed_scales_and_zero_points_are_one_line(m, message):
    with pytest.raises(ShapeError) as e:
        import_model(m)
    assert message in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 2


def test_run_time_scale_and_unknown_contrib_op_are_refused_with_the_reason():
    m = _add_model()
    m.graph.initializer.pop(0)
    m.graph.input.append(vi("sa", [], TensorProto.FLOAT))
    with pytest.raises(UnsupportedOpError, match="the A scale is computed at run time"):
        import_model(m)
    m = ms_model([helper.make_node("QLinearWhere", ["x"], ["y"], domain=MS)], [vi("x", [2], U8)], [vi("y", None, U8)])
    with pytest.raises(UnsupportedOpError, match="not one of the com.microsoft ops opfuse imports") as e:
        import_model(m)
    assert e.value.exit_code == 2
