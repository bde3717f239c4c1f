"""A Concat's inputs take the Concat's output parameters (``quantization/qdq.py``'s ``share_concat_params``),
so the quantized model's Concat is exact in 8 bits and the ``int8_concat`` rule rewrites it (the producers
then write their int8 results in place). Positive: yolo_block's Concat (two Split parts, two residual
Adds) is rewritten exactly (the int8 Concat holds the reference's values), a smaller arena, C and
onnxruntime within a quantization step. Negative: ``share_concat_scales=False`` keeps each input's own
scale (the rule refuses, with its reason), and an input that is not quantized keeps the Concat apart, with
the reason."""
import numpy as np
import pytest

from opfuse.compiler import plan_model
from opfuse.ops import GraphBuilder
from opfuse.quantization import quantize
from opfuse.quantization.params import activation_params
from opfuse.quantization.qdq import share_concat_params
from opfuse.runtime.native import build
from opfuse.runtime.reference import random_inputs, run

ort = pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def yolo():
    return {share: quantize("zoo:yolo_block", calibration_random=4, share_concat_scales=share)
            for share in (True, False)}


def _decisions(model, rule="int8_concat"):
    comp = plan_model(model)
    return comp, [d for d in comp.decisions if d.rule == rule]


def test_the_concats_inputs_take_its_parameters_and_the_rule_fires(yolo):
    r = yolo[True]
    # the Split's parts carry cv1's scale: cv1 takes the Concat's; the residual Adds take it themselves
    assert r.shared == {"cv1_silu": "concat", "m0_add": "concat", "m1_add": "concat"} and r.kept_apart == {}
    assert {(float(r.activations[t].scale), r.activations[t].zero_point) for t in [*r.shared, "concat"]} == \
        {(float(r.activations["concat"].scale), r.activations["concat"].zero_point)}
    comp, fired = _decisions(r.model)
    assert [d.verdict for d in fired] == ["rewritten"]
    other, refused = _decisions(yolo[False].model)
    # the producers write their int8 results into the Concat's slices: no dequantize-copy-requantize
    assert comp.memory.arena_bytes < other.memory.arena_bytes
    feeds = random_inputs(comp.graph, 1)
    want = run(comp.original, feeds, keep=True)  # the imported QDQ model, its float Concat requantized
    (cat,) = [n.outputs[0] for n in comp.graph.nodes if n.op_type == "Concat"]
    assert cat.dtype == np.int8  # the rewrite's Concat of the 8-bit tensors keeps the quantized value's name
    np.testing.assert_array_equal(run(comp.graph, feeds, keep=True)[cat.name], want[cat.name])  # exact
    # C computes the float SiLUs with its own exp: a value at a rounding tie may land a step away
    got = build(comp.plan.graph, comp.plan, threads=1).run(feeds)
    step = max(float(p.scale) for p in r.activations.values())
    for out in comp.original.outputs:
        err = np.abs(got[out.name] - want[out.name])
        assert err.max() <= step and err.mean() < step / 100


def test_the_rewritten_model_stays_within_a_step_of_onnxruntime(yolo):
    r = yolo[True]
    comp = plan_model(r.model)
    feeds = random_inputs(comp.graph, 2)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(r.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    theirs = sess.run(None, feeds)[0]
    ours = build(comp.plan.graph, comp.plan, threads=1).run(feeds)[comp.graph.outputs[0].name]
    # float SiLUs between integer tensors: a value at a rounding tie may land a step of its tensor away
    step = max(float(p.scale) for p in r.activations.values())
    assert np.abs(ours - theirs).max() <= step and np.mean(np.abs(ours - theirs)) < step / 100


def test_own_scales_keep_the_requantizing_concat_with_the_reason(yolo):
    r = yolo[False]
    assert r.shared == {}
    # each its own calibrated range: cv1's is narrower than the Concat's (an input may hold its extremes)
    assert float(r.activations["cv1_silu"].scale) < float(r.activations["concat"].scale)
    _, refused = _decisions(r.model)
    assert [d.verdict for d in refused] == ["refused"] and "a requantization" in refused[0].reason


def _concat_graph(inner: bool = False):
    """a, b -> Relu each -> [Concat(a', b') -> c1] -> Concat(..., d) -> Relu -> y (names as the calibration sees)."""
    b = GraphBuilder("cat")
    x = b.input("x", (1, 2, 3, 3))
    a = b.op("Relu", x, name="a")
    bb = b.op("Neg", x, name="b")
    d = b.op("Sigmoid", x, name="d")
    first = b.op("Concat", a, bb, axis=1, name="c1") if inner else a
    outer = b.op("Concat", first, d, axis=1, name="c2") if inner else b.op("Concat", a, bb, d, axis=1, name="c2")
    return b.build(b.op("Relu", outer, name="y"))


def _params(graph, names):
    return {n: activation_params(-1.0 - i, 2.0 + i, np.dtype(np.int8)) for i, n in enumerate(names)}


def test_nested_concats_pass_the_outer_parameters_inward():
    g = _concat_graph(inner=True)
    names = {n.name: n.outputs[0].name for n in g.nodes}
    tensors = [names[k] for k in ("a", "b", "d", "c1", "c2")]
    params, shared, apart = share_concat_params(g, _params(g, tensors), {})
    outer = params[names["c2"]]
    assert apart == {} and all(params[t] == outer for t in tensors)
    assert shared == {names["c1"]: names["c2"], names["d"]: names["c2"], names["a"]: names["c1"],
                      names["b"]: names["c1"]}


def test_an_unquantized_input_keeps_the_concat_apart_with_the_reason():
    g = _concat_graph()
    names = {n.name: n.outputs[0].name for n in g.nodes}
    given = _params(g, [names[k] for k in ("a", "d", "c2")])  # b is not quantized (a graph output, say)
    params, shared, apart = share_concat_params(g, given, {})
    assert params == given and shared == {}
    assert apart == {names["c2"]: f"input '{names['b']}' is not quantized"}


def test_the_cli_says_which_tensors_take_a_concats_parameters(capsys, tmp_path):
    from opfuse.cli import main
    assert main(["quantize", "zoo:yolo_block", "--calibration-random", "1", "-o", str(tmp_path / "q.onnx")]) == 0
    out = capsys.readouterr().out
    assert "concat: cv1_silu takes the parameters of 'concat' (an exact int8 Concat)" in out
    assert main(["quantize", "zoo:yolo_block", "--calibration-random", "1", "--own-concat-scales", "-o",
                 str(tmp_path / "own.onnx")]) == 0
    assert "takes the parameters" not in capsys.readouterr().out
