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


def _linear_attention(rule, b=2, t=3, hq=4, hkv=2, dk=4, dv=3, past=False, decay_per="head", beta_per="head"):
    feeds = {"query": RNG.standard_normal((b, t, hq * dk)), "key": RNG.standard_normal((b, t, hkv * dk)) * 0.5,
             "value": RNG.standard_normal((b, t, hkv * dv))}
    names = ["query", "key", "value", "", "", ""]
    if past:
        feeds["past_state"], names[3] = RNG.standard_normal((b, hkv, dk, dv)), "past_state"
    if rule in ("gated", "gated_delta"):
        feeds["decay"], names[4] = -RNG.random((b, t, hkv if decay_per == "head" else hkv * dk)), "decay"
    if rule in ("delta", "gated_delta"):
        feeds["beta"], names[5] = RNG.random((b, t, hkv if beta_per == "head" else 1)), "beta"
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    m = one_node_model("LinearAttention", feeds, {"update_rule": rule, "q_num_heads": hq, "kv_num_heads": hkv},
                       opset=27, n_outputs=2)
    m.graph.node[0].input[:] = names
    return m, feeds


@pytest.mark.parametrize("rule,kw", [
    ("linear", {"past": True, "hkv": 4}), ("gated", {"decay_per": "dim"}), ("delta", {"beta_per": "one"}),
    ("gated_delta", {"past": True}), ("gated_delta", {"hkv": 1, "t": 1}),
])
def test_linear_attention_matches_the_onnx_reference(rule, kw):
    m, feeds = _linear_attention(rule, **kw)
    g, _ = check_against_onnx_reference(m, feeds, rtol=1e-4, atol=1e-5)
    assert "LinearAttention" not in [n.op_type for n in g.nodes]


def test_linear_attention_longer_than_the_unroll_limit_is_refused(monkeypatch):
    from opfuse.errors import UnsupportedOpError
    from opfuse.frontend import onnx_attention_ops
    monkeypatch.setattr(onnx_attention_ops, "LINEAR_ATTENTION_MAX_STEPS", 2)
    m, _ = _linear_attention("linear", t=3)
    with pytest.raises(UnsupportedOpError, match="a sequence of 3 steps is longer than the 2 opfuse unrolls"):
        import_model(m)


def test_linear_attention_rule_without_its_decay_is_refused():
    m, _ = _linear_attention("gated")
    m.graph.node[0].input[4] = ""
    with pytest.raises(ModelError, match="update_rule 'gated' needs decay and forbids beta"):
        import_model(m)
