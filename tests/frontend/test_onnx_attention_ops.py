"""Opset 24+ attention ops imported as ops opfuse has (``frontend/onnx_attention_ops.py``), against
``onnx.reference`` in the reference executor, fused C and portable C."""
import numpy as np
import pytest

from misc_ops_support import check_against_onnx_reference, one_node_model
from opfuse.errors import ModelError
from opfuse.frontend.onnx import import_model

RNG = np.random.default_rng(24)


@pytest.mark.parametrize("cache,update,attrs,write", [
    ((2, 3, 6, 4), (2, 3, 2, 4), {"mode": "linear"}, [1, 4]),
    ((2, 3, 6, 4), (2, 3, 3, 4), {"mode": "circular"}, [5, 2]),
    ((3, 5, 2), (3, 2, 2), {"axis": 1}, [0, 3, 1]),
    ((2, 4, 3), (2, 4, 3), {}, None),                     # prefill: no write indices, the whole cache
])
def test_tensor_scatter_matches_the_onnx_reference(cache, update, attrs, write):
    feeds = {"past": RNG.standard_normal(cache).astype(np.float32),
             "update": RNG.standard_normal(update).astype(np.float32)}
    if write is not None:
        feeds["write"] = np.array(write, np.int64)
    g, plan = check_against_onnx_reference(one_node_model("TensorScatter", feeds, attrs, opset=24), feeds, 0, 0)
    assert "ScatterElements" in [n.op_type for n in g.nodes]


def test_tensor_scatter_on_the_batch_axis_is_refused():
    feeds = {"past": np.zeros((4, 3), np.float32), "update": np.zeros((2, 3), np.float32)}
    with pytest.raises(ModelError, match="the sequence axis comes after the batch axis"):
        import_model(one_node_model("TensorScatter", feeds, {"axis": 0}, opset=24))


def _flex_model(shapes, mods: dict, attrs: dict | None = None, dtype=np.float32):
    from onnx import TensorProto, helper
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graphs = {}
    for name, (op, const) in mods.items():
        inner = [helper.make_node(op, ["s", "c"], ["t"])]
        graphs[name] = helper.make_graph(inner, name, [helper.make_tensor_value_info("s", TensorProto.FLOAT, None)],
                                         [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
                                         initializer=[helper.make_tensor("c", TensorProto.FLOAT, [], [const])])
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview",
                            **graphs, **(attrs or {}))
    vis = [helper.make_tensor_value_info(n, elem, s) for n, s in zip("QKV", shapes, strict=True)]
    g = helper.make_graph([node], "flex", vis, [helper.make_tensor_value_info("Y", elem, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid("ai.onnx.preview", 1)])
    m.ir_version = 11
    return m


@pytest.mark.parametrize("shapes,mods,attrs", [
    ([(2, 4, 5, 8), (2, 4, 6, 8), (2, 4, 6, 3)], {}, {}),
    ([(2, 4, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8)], {}, {"scale": 0.2}),                    # grouped heads
    ([(1, 4, 5, 8), (1, 2, 6, 8), (1, 2, 6, 8)], {"score_mod": ("Add", 0.5)}, {}),     # grouped, modified
    ([(1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)], {"prob_mod": ("Mul", 2.0)}, {"scale": 0.3}),
    ([(1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)], {"score_mod": ("Sub", 1.0), "prob_mod": ("Mul", 0.5)}, {}),
])
def test_flex_attention_matches_the_onnx_reference(shapes, mods, attrs):
    m = _flex_model(shapes, mods, attrs)
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in zip("QKV", shapes, strict=True)}
    g, _ = check_against_onnx_reference(m, feeds, rtol=1e-4, atol=1e-5)
    ops = [n.op_type for n in g.nodes]
    assert ops.count("MatMul") == 2 and ops.count("Softmax") == 1
    assert ("Expand" in ops) == (shapes[0][1] != shapes[1][1])  # K, V repeated only for grouped heads


def test_flex_attention_modifier_with_two_inputs_is_refused():
    from onnx import TensorProto, helper
    m = _flex_model([(1, 2, 3, 4)] * 3, {"score_mod": ("Add", 1.0)})
    m.graph.node[0].attribute[0].g.input.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, None))
    with pytest.raises(ModelError, match="score_mod must have one input and one output, has 2 and 1"):
        import_model(m)
