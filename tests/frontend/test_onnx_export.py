"""Export: valid ONNX at opsets 11..21 that onnxruntime runs with the reference's outputs."""
import numpy as np
import pytest

from onnx_builders import assert_close, check_onnx, ort_run
from opfuse.errors import InputError, UnsupportedOpError
from opfuse.frontend.onnx import DEFAULT_EXPORT_OPSET, export_model, import_model, load_model, save_model
from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import random_inputs, run

EXPORT_OPSETS = [11, 12, 13, 14, 16, 17, 18, 19, 20, 21]


def _rng():
    return np.random.default_rng(11)


def _f32(*shape):
    return _rng().standard_normal(shape).astype(np.float32)


def _cnn(opset=17):
    """Conv+BN+ReLU, pooling, residual add, concat, flatten and a classifier."""
    b = GraphBuilder("cnn", opset=opset)
    x = b.input("x", (1, 3, 8, 8))
    c = b.op("Conv", x, b.const("w1", _f32(4, 3, 3, 3)), b.const("b1", _f32(4)), pads=[1, 1, 1, 1], name="conv1")
    bn = b.op("BatchNormalization", c, b.const("g", np.abs(_f32(4)) + 0.5), b.const("be", _f32(4)),
              b.const("mu", _f32(4)), b.const("var", np.abs(_f32(4)) + 0.1), epsilon=1e-3, name="bn1")
    r = b.op("Relu", bn, name="relu1")
    dw = b.op("Conv", r, b.const("w2", _f32(4, 1, 3, 3)), group=4, pads=[1, 1, 1, 1], name="dw")
    s = b.op("Add", r, b.op("Clip", dw, b.const("lo", np.float32(0)), b.const("hi", np.float32(6))), name="res")
    mp = b.op("MaxPool", s, kernel_shape=[2, 2], strides=[2, 2], name="pool")
    ap = b.op("AveragePool", s, kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=0)
    cat = b.op("Concat", mp, ap, axis=1, name="cat")
    gap = b.op("GlobalAveragePool", cat)
    flat = b.op("Flatten", gap, axis=1)
    fc = b.op("Gemm", flat, b.const("fw", _f32(5, 8)), b.const("fb", _f32(5)), transB=1, name="fc")
    return b.build(b.op("Softmax", fc, axis=-1, name="prob"))


def _export_and_compare(g, opset):
    m = export_model(g, opset)
    check_onnx(m)
    feeds = random_inputs(g, 0)
    assert_close(ort_run(m, feeds), run(g, feeds))
    return m


@pytest.mark.parametrize("opset", EXPORT_OPSETS)
def test_cnn_exports_at_every_opset(opset):
    m = _export_and_compare(_cnn(), opset)
    assert m.opset_import[0].version == opset


def test_names_are_kept():
    g = _cnn()
    m = export_model(g)
    assert [n.name for n in m.graph.node] == [n.name for n in g.nodes]
    assert [o.name for o in m.graph.output] == [v.name for v in g.outputs]
    assert {t.name for t in m.graph.initializer} == {v.name for v in g.constants if v.uses}
    assert [i.name for i in m.graph.input] == ["x"]


def test_import_of_an_export_is_the_same_graph():
    g = _cnn()
    assert str(import_model(export_model(g))) == str(g)


def test_default_opset_is_17_or_the_graphs_when_newer():
    assert DEFAULT_EXPORT_OPSET == 17
    assert export_model(_cnn(opset=13)).opset_import[0].version == 17
    assert export_model(_cnn(opset=19)).opset_import[0].version == 19


def test_default_opset_rises_to_the_first_that_defines_every_op():
    """BitwiseAnd came with opset 18: a graph using it exported at 17 was refused ("not an ONNX op at
    opset 17"); asked for opset 17 explicitly, it still is."""
    b = GraphBuilder("bits")
    x, y = b.input("x", (2, 3), np.int32), b.input("y", (3,), np.int32)
    g = b.build(b.op("BitwiseAnd", b.op("Add", x, y), y))
    m = export_model(g)
    assert m.opset_import[0].version == 18
    check_onnx(m)
    feeds = {"x": np.array([[1, -2, 7], [5, 6, 255]], np.int32), "y": np.array([3, -1, 12], np.int32)}
    np.testing.assert_array_equal(next(iter(ort_run(m, feeds).values())), (feeds["x"] + feeds["y"]) & feeds["y"])
    with pytest.raises(UnsupportedOpError, match="not an ONNX op at opset 17"):
        export_model(g, 17)


@pytest.mark.parametrize("opset", [9, 10, 22])
def test_unsupported_export_opset(opset):
    with pytest.raises(InputError, match="11 to 21"):
        export_model(_cnn(), opset)


def _transformer_block(opset=17):
    """LayerNorm, attention-style MatMuls with Split/Reshape/Transpose, Softmax, GELU (both forms)."""
    b = GraphBuilder("block", opset=opset)
    x = b.input("x", (2, 4, 8))
    ln = b.op("LayerNormalization", x, b.const("ls", _f32(8)), b.const("lb", _f32(8)), epsilon=1e-5, name="ln")
    qkv = b.op("MatMul", ln, b.const("wqkv", _f32(8, 24) * 0.3), name="qkv")
    q, k, v = b.op("Split", qkv, axis=-1, split=[8, 8, 8], num_outputs=3, name="split")
    heads = b.const("heads", np.array([2, 4, 2, 4], np.int64))
    qh = b.op("Transpose", b.op("Reshape", q, heads), perm=[0, 2, 1, 3])
    kh = b.op("Transpose", b.op("Reshape", k, heads), perm=[0, 2, 3, 1])
    vh = b.op("Transpose", b.op("Reshape", v, heads), perm=[0, 2, 1, 3])
    att = b.op("Softmax", b.op("MatMul", qh, kh), axis=-1, name="att")
    o = b.op("Reshape", b.op("Transpose", b.op("MatMul", att, vh), perm=[0, 2, 1, 3]),
             b.const("back", np.array([2, 4, 8], np.int64)))
    g1 = b.op("Gelu", o, name="gelu_erf")
    g2 = b.op("Gelu", o, approximate="tanh", name="gelu_tanh")
    ln2 = b.op("LayerNormalization", b.op("Add", g1, g2), b.const("s2", _f32(8)), axis=-1, name="ln_nobias")
    return b.build(b.op("Silu", ln2, name="silu"))


@pytest.mark.parametrize("opset", [11, 13, 17, 18, 20, 21])
def test_internal_and_new_ops_are_expanded_below_their_opset(opset):
    m = _export_and_compare(_transformer_block(), opset)
    types = {n.op_type for n in m.graph.node}
    assert "Silu" not in types and "Sigmoid" in types
    assert ("Gelu" in types) == (opset >= 20)
    assert ("Erf" in types) == (opset < 20)
    assert ("LayerNormalization" in types) == (opset >= 17)


@pytest.mark.parametrize("opset", [13, 14])
def test_hard_swish_below_14(opset):
    b = GraphBuilder("hs")
    y = b.op("HardSwish", b.input("x", (3, 5)))
    m = _export_and_compare(b.build(y), opset)
    assert ("HardSwish" in {n.op_type for n in m.graph.node}) == (opset >= 14)


def test_layer_norm_expansion_of_half_precision_keeps_float32_statistics():
    b = GraphBuilder("ln16")
    x = b.input("x", (2, 3, 16), "float16")
    y = b.op("LayerNormalization", x, b.const("s", np.ones(16, np.float16)), axis=1)
    m = export_model(b.build(y), 13)
    check_onnx(m)
    feeds = {"x": (_f32(2, 3, 16) * 3).astype(np.float16)}
    ours, theirs = run(b.graph, feeds)["layernormalization"], ort_run(m, feeds)["layernormalization"]
    np.testing.assert_allclose(ours.astype(np.float32), theirs.astype(np.float32), atol=2e-2)


@pytest.mark.parametrize("opset", [11, 12, 13, 17])
def test_softmax_on_an_inner_axis(opset):
    b = GraphBuilder("sm")
    y = b.op("Softmax", b.input("x", (2, 3, 4)), axis=1)
    m = _export_and_compare(b.build(y), opset)
    types = [n.op_type for n in m.graph.node]
    assert types == (["Transpose", "Softmax", "Transpose"] if opset < 13 else ["Softmax"])


@pytest.mark.parametrize("opset", [11, 12, 13, 17])
@pytest.mark.parametrize("op", ["LogSoftmax", "Hardmax"])
def test_log_softmax_and_hardmax_on_an_inner_axis(opset, op):
    """Found by the fuzzer's generator: below 13 they were written as they are, which there
    means normalising the flattened block from the axis on, not the axis."""
    b = GraphBuilder("lsm")
    y = b.op(op, b.input("x", (2, 3, 4)), axis=1)
    m = _export_and_compare(b.build(y), opset)
    types = [n.op_type for n in m.graph.node]
    assert types == (["Transpose", op, "Transpose"] if opset < 13 else [op])


REDUCE_OPS = ["ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
              "ReduceSumSquare"]


@pytest.mark.parametrize("opset", [11, 17, 18, 21])
def test_every_reduce_writes_its_axes_in_the_opset_form(opset):
    """Found by the fuzzer's generator: only ReduceSum/Mean/Max had the attribute-or-input
    exporter; the others could not be exported at 18 and later ("axes cannot be written")."""
    b = GraphBuilder("reduce")
    x = b.op("Add", b.op("Abs", b.input("x", (2, 3, 4))), b.const("one", np.float32(1.0)))
    ys = [b.op(op, x, axes=[1], keepdims=i % 2, name=op.lower()) for i, op in enumerate(REDUCE_OPS)]
    m = _export_and_compare(b.build(*ys), opset)
    n_inputs = {n.op_type: len(n.input) for n in m.graph.node}
    assert all(n_inputs[op] == (2 if opset >= 18 else 1) for op in REDUCE_OPS)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_canonical_axes_are_written_in_the_opset_form(opset):
    b = GraphBuilder("axes")
    x = b.input("x", (2, 1, 6))
    s = b.op("Squeeze", x, axes=[1])
    u = b.op("Unsqueeze", s, axes=[0])
    m1 = b.op("ReduceMean", u, axes=[2], keepdims=1)
    m2 = b.op("ReduceSum", u, axes=[-1], keepdims=0)
    m3 = b.op("ReduceMax", u)
    a, c = b.op("Split", u, axis=2, split=[2, 4], num_outputs=2)
    m = _export_and_compare(b.build(m1, m2, m3, a, c), opset)
    n_inputs = {n.op_type: len(n.input) for n in m.graph.node}
    assert n_inputs["Squeeze"] == n_inputs["Unsqueeze"] == (2 if opset >= 13 else 1)
    assert n_inputs["ReduceSum"] == (2 if opset >= 13 else 1)
    assert n_inputs["ReduceMean"] == (2 if opset >= 18 else 1)
    assert n_inputs["ReduceMax"] == 1
    assert n_inputs["Split"] == (2 if opset >= 13 else 1)


def test_equal_split_without_sizes_exports_explicit_sizes():
    b = GraphBuilder("split")
    outs = b.op("Split", b.input("x", (6, 2)), axis=0, num_outputs=3)
    for opset in (11, 13, 18):
        _export_and_compare(b.build(*outs), opset)


def test_shape_ops_round_trip():
    b = GraphBuilder("shapes")
    x = b.input("x", (2, 3, 4))
    p = b.op("Pad", x, b.const("pads", np.array([0, 1, 0, 0, 2, 1], np.int64)), b.const("pv", np.float32(0.5)))
    sl = b.op("Slice", p, b.const("st", np.array([1, 0], np.int64)), b.const("en", np.array([6, 4], np.int64)),
              b.const("ax", np.array([1, 2], np.int64)), b.const("sp", np.array([2, 1], np.int64)))
    e = b.op("Expand", b.op("Unsqueeze", sl, axes=[0]), b.const("es", np.array([2, 1, 1, 1], np.int64)))
    r = b.op("Resize", x, None, b.const("sc", np.array([1, 2, 2], np.float32)), mode="nearest")
    gi = b.op("Gather", x, b.const("gi", np.array([2, 0], np.int64)), axis=1)
    g = b.build(e, r, gi)
    for opset in (11, 13, 17):
        _export_and_compare(g, opset)


def test_pad_axes_input_is_spelled_out_before_18():
    b = GraphBuilder("pad")
    y = b.op("Pad", b.input("x", (2, 3)), b.const("pads", np.array([1, 2], np.int64)), None,
             b.const("axes", np.array([-1], np.int64)))
    for opset in (13, 17, 18):
        m = _export_and_compare(b.build(y), opset)
        assert len(m.graph.node[0].input) == (4 if opset >= 18 else 2)


def test_graph_output_that_is_a_constant_or_an_input():
    b = GraphBuilder("odd")
    x = b.input("x", (3,))
    c = b.const("c", np.arange(3, dtype=np.float32))
    g = b.build(x, c, b.op("Add", x, c))
    m = _export_and_compare(g, None)
    assert [o.name for o in m.graph.output] == ["x", "c", "add"]


def test_attribute_that_needs_a_newer_opset():
    b = GraphBuilder("rz")
    x = b.input("x", (2, 0))
    y = b.op("Reshape", x, b.const("s", np.array([0, 2], np.int64)), allowzero=1)
    with pytest.raises(UnsupportedOpError, match="allowzero") as e:
        export_model(b.build(y), 13)
    assert "opset 13" in str(e.value)
    check_onnx(export_model(b.graph, 14))


def test_attribute_at_its_old_meaning_is_dropped():
    b = GraphBuilder("cast")
    y = b.op("Cast", b.input("x", (3,)), to=7, saturate=1)
    m = _export_and_compare(b.build(y), 13)
    assert [a.name for a in m.graph.node[0].attribute] == ["to"]


def test_float_attribute_given_as_int_is_written_as_float():
    b = GraphBuilder("lr")
    y = b.op("LeakyRelu", b.input("x", (4,)), alpha=1)
    m = _export_and_compare(b.build(y), 17)
    assert m.graph.node[0].attribute[0].type == m.graph.node[0].attribute[0].FLOAT


def test_unknown_domain_cannot_be_exported():
    g = _cnn()
    g.nodes[0].domain = "com.example"
    with pytest.raises(UnsupportedOpError, match="com.example"):
        export_model(g)


def test_save_and_load(tmp_path):
    g = _transformer_block()
    path = tmp_path / "block.onnx"
    save_model(g, path, opset=18)
    back = load_model(path)
    feeds = random_inputs(g, 1)
    assert_close(run(back, feeds), run(g, feeds))


def test_save_to_an_unwritable_place(tmp_path):
    with pytest.raises(InputError, match="cannot write"):
        save_model(_cnn(), tmp_path / "missing_dir" / "m.onnx")


def test_very_large_models_are_saved_with_external_data(tmp_path, monkeypatch):
    import opfuse.frontend.onnx_export as onnx_export
    monkeypatch.setattr(onnx_export, "EXTERNAL_DATA_THRESHOLD_BYTES", 0)
    b = GraphBuilder("big")
    w = _f32(32, 32)
    g = b.build(b.op("MatMul", b.input("x", (2, 32)), b.const("w", w)))
    path = tmp_path / "big.onnx"
    save_model(g, path)
    assert (tmp_path / "big.onnx.data").stat().st_size == w.nbytes
    feeds = random_inputs(g, 2)
    assert_close(run(load_model(path), feeds), run(g, feeds))


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layout", [0, 1])
def test_recurrent_ops_round_trip(op, layout):
    """Below opset 14 a batch-first (layout=1) node is written in layout 0 between Transposes;
    onnxruntime (which refuses layout=1 itself) runs the export with the reference's outputs."""
    from opfuse.testing.recurrent_cases import onnx_model, random_case
    rng = np.random.default_rng({"LSTM": 1, "GRU": 2, "RNN": 3}[op] + 10 * layout)
    case = random_case(rng, op, layout=layout, seq_lens=True, clip=True, direction="bidirectional")
    case.opset = 14
    g = import_model(onnx_model(case))
    want = run(g, case.feeds())
    for opset in ([11, 13] if layout else [11, 14, 21]):
        m = export_model(g, opset)
        check_onnx(m)
        assert_close(ort_run(m, case.feeds()), want)
