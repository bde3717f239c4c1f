"""A QDQ model's kept dequantizations (``Cast -> [Sub] -> Mul`` over an integer weight or bias, as the importer
keeps a ``DequantizeLinear`` of a constant) are exported as that ``DequantizeLinear`` again
(``onnx_export.dequantize_chains``): the exported model imports with the same integer weights, so its fused build
runs the same integer kernels, bit for bit. Where a chain is not exactly a ``DequantizeLinear`` it stays as it is."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto

import opfuse
from opfuse.frontend.onnx import export_model, import_model
from opfuse.ops.builder import GraphBuilder
from opfuse.runtime.reference import run
from test_onnx_qdq import qdq_conv

RNG = np.random.default_rng(5)


def _ops(m: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in m.graph.node]


def _x():
    return {"x": (RNG.standard_normal((1, 8, 10, 9)) * 2).astype(np.float32)}


@pytest.mark.parametrize("act, per_channel, bias", [
    (np.int8, True, True), (np.uint8, False, True), (np.uint8, True, False), (np.int8, False, False)])
def test_an_exported_qdq_model_imports_as_qdq_and_runs_the_same_integer_kernels(act, per_channel, bias):
    m = qdq_conv(act=act, per_channel=per_channel, bias=bias)
    e = export_model(import_model(m))
    onnx.checker.check_model(e, full_check=True)
    dq = [n for n in e.graph.node if n.op_type == "DequantizeLinear"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in e.graph.initializer}
    weights = [inits[n.input[0]] for n in dq if n.input[0] in inits]
    assert sorted(w.dtype.name for w in weights) == sorted(["int8"] + (["int32"] if bias else []))
    per_axis = [n for n in dq if any(a.name == "axis" for a in n.attribute)]
    assert len(per_axis) == (1 if per_channel else 0) + (1 if bias and per_channel else 0)
    assert "Sub" not in _ops(e) or _ops(e).count("Sub") == _ops(e).count("Cast") // 2  # activations' DQ only
    x = _x()
    a, b = opfuse.compile(m), opfuse.compile(e)
    assert a.report["int8"]["integer_accumulate"] >= 1
    assert b.report["int8"]["integer_accumulate"] == a.report["int8"]["integer_accumulate"]
    ra, rb = a.run(x), b.run(x)
    for k in ra:
        np.testing.assert_array_equal(ra[k], rb[k])
    g2 = import_model(e)  # the reference on the re-imported graph: the same float QDQ arithmetic
    for k, v in run(import_model(m), x).items():
        np.testing.assert_array_equal(run(g2, x)[k], v)


def test_a_per_channel_weight_stays_a_cast_chain_below_opset_13():
    g = import_model(qdq_conv(per_channel=True, bias=False))
    e = export_model(g, opset=12)
    onnx.checker.check_model(e, full_check=True)
    assert not [n for n in e.graph.node if n.op_type == "DequantizeLinear"]
    x = _x()
    np.testing.assert_array_equal(run(import_model(e), x)["y"], run(g, x)["y"])
    e13 = export_model(g, opset=13)
    assert [n.op_type for n in e13.graph.node].count("DequantizeLinear") == 1


def _chain(zero, scale, dtype=np.int8, reader=False):
    """y = (Cast(w) - zero) * scale, w an integer constant of shape (4, 3), and optionally Neg(Cast(w))."""
    b = GraphBuilder("chain")
    x = b.input("x", (4, 3))
    c = b.op("Cast", b.const("w", RNG.integers(-100, 100, (4, 3)).astype(dtype)), to=TensorProto.FLOAT)
    y = b.op("Mul", b.op("Sub", c, b.const("zero", np.asarray(zero, np.float32))),
             b.const("scale", np.asarray(scale, np.float32)))
    return b.build(b.op("Add", x, y), *([b.op("Neg", c)] if reader else []))


@pytest.mark.parametrize("why, graph", [
    ("a zero point that is not an integer", lambda: _chain(0.5, 0.25)),
    ("a zero point outside the weight's type", lambda: _chain(300.0, 0.25)),
    ("an int32 weight with a zero point", lambda: _chain(3.0, 0.25, np.int32)),
    ("a scale along two axes", lambda: _chain(0.0, np.full((4, 3), 0.5))),
    ("the Cast read elsewhere too", lambda: _chain(1.0, 0.25, reader=True)),
    ("a zero point along one axis, the scale along the other", lambda: _chain(
        np.arange(4, dtype=np.float32).reshape(4, 1), np.array([[0.5, 0.25, 1.0]]))),
])
def test_a_chain_that_is_not_exactly_a_dequantize_linear_is_exported_as_it_is(why, graph):
    g = graph()
    e = export_model(g)
    onnx.checker.check_model(e, full_check=True)
    assert "DequantizeLinear" not in _ops(e), why
    x = {"x": RNG.standard_normal((4, 3)).astype(np.float32)}
    for k, v in run(g, x).items():
        np.testing.assert_array_equal(run(import_model(e), x)[k], v)


@pytest.mark.parametrize("zero, scale, axis", [
    (3.0, 0.25, None), (0.0, np.array([[0.5], [0.25], [2.0], [1.0]]), 0),
    (np.array([[1.0, -2.0, 5.0]]), 0.125, 1), (None, np.array([[0.5, 0.25, 1.0]]), 1)])
def test_a_chain_per_tensor_or_along_one_axis_is_one_dequantize_linear(zero, scale, axis):
    g = _chain(zero if zero is not None else 0.0, scale)
    if zero is None:  # no Sub: Cast -> Mul
        sub = next(n for n in g.nodes if n.op_type == "Sub")
        g.replace_all_uses(sub.outputs[0], sub.input(0))
        g.remove_node(sub)
        g.remove_unused_values()
    e = export_model(g)
    onnx.checker.check_model(e, full_check=True)
    assert _ops(e) == ["DequantizeLinear", "Add"]
    dq = e.graph.node[0]
    attrs = {a.name: a.i for a in dq.attribute}
    assert attrs.get("axis") == axis
    assert len(dq.input) == (2 if zero is None else 3)
    assert {t.name for t in e.graph.initializer} == {"w", *dq.input[1:]}  # no orphaned scale or zero point
    x = {"x": RNG.standard_normal((4, 3)).astype(np.float32)}
    np.testing.assert_array_equal(run(import_model(e), x)[g.outputs[0].name], run(g, x)[g.outputs[0].name])
