"""The pattern library on the zoo models: expected match counts, then the whole rule pipeline.

Counts are facts about the models (see ``opfuse.zoo``): MobileNetV1 has 27 Conv+BN+ReLU
blocks, a BERT layer one Q/K/V triple, one attention, two LayerNorms and one GELU, ResNet-18
eight residual additions, the YOLOv8 C2f block six Conv+BN+SiLU.
"""
from __future__ import annotations

from collections import Counter

import pytest

from opfuse import zoo
from opfuse.patterns import Matcher
from opfuse.rules import apply_rules, build_plan, fusion_rules, recognition_rules, rule_by_name

from rule_helpers import same_outputs


@pytest.fixture(scope="module")
def graphs():
    return {name: zoo.load(name) for name in zoo.list_models()}


def count(graph, rule_name: str) -> int:
    return len(Matcher(graph).matches(rule_by_name(rule_name).pattern))


@pytest.mark.parametrize("model, rule, expected", [
    ("mobilenet_v1", "conv_bn_act", 27),
    ("mobilenet_v1_025_96", "conv_bn_act", 27),
    ("ds_cnn", "conv_bn_act", 9),
    ("bert_layer", "parallel_matmul", 1),
    ("bert_layer", "attention", 1),
    ("bert_layer", "recognize_layernorm", 2),
    ("bert_layer", "recognize_gelu_erf", 1),
    ("bert_layer", "matmul_epilogue", 6),        # Q, K, V, attention output, FFN in, FFN out
    ("yolo_block", "recognize_silu", 6),
    ("resnet18", "conv_bn_act", 9),              # stem + the first conv of each of 8 blocks
    ("resnet8", "conv_bn_act", 4),
    ("mobilenet_v1", "attention", 0),
    ("bert_layer", "conv_bn_act", 0),
    ("yolo_block", "recognize_hardswish", 0),
])
def test_match_counts(graphs, model, rule, expected):
    assert count(graphs[model], rule) == expected


def test_every_conv_bn_relu_of_mobilenet(graphs):
    g = graphs["mobilenet_v1"]
    ms = Matcher(g).matches(rule_by_name("conv_bn_act").pattern)
    assert Counter(tuple(n.op_type for n in m.nodes) for m in ms) == {("Conv", "BatchNormalization", "Relu"): 27}
    assert {id(m["conv"]) for m in ms} == {id(n) for n in g.nodes if n.op_type == "Conv"}


def test_bert_matches_name_the_right_nodes(graphs):
    g = graphs["bert_layer"]
    m = Matcher(g)
    (qkv,) = m.matches(rule_by_name("parallel_matmul").pattern)
    assert qkv.node_names == ["query_matmul", "key_matmul", "value_matmul"] and qkv["x"].name == "input"
    (att,) = m.matches(rule_by_name("attention").pattern)
    assert att.node_names == ["scores", "scores_scale", "attention_probs", "context"]
    (gelu,) = m.matches(rule_by_name("recognize_gelu_erf").pattern)
    assert gelu["x"].name == "intermediate_add"
    lns = m.matches(rule_by_name("recognize_layernorm").pattern)
    assert [ln["x"].name for ln in lns] == ["attention_residual", "output_residual"]


def test_resnet18_residual_adds(graphs):
    g = graphs["resnet18"]
    ms = Matcher(g).matches(rule_by_name("conv_residual_add").pattern)
    adds = {m["add"].name for m in ms}
    assert len(adds) == 8 == sum(n.op_type == "Add" for n in g.nodes)
    # downsampling blocks add two Conv+BN branches: either may be the fused one
    assert len(ms) == 11
    out = apply_rules(g.copy(), fusion_rules())
    fused = [d for d in out.decisions if d.rule == "conv_residual_add" and d.taken]
    assert len(fused) == 8


def test_yolo_silus_become_conv_epilogues(graphs):
    g = graphs["yolo_block"].copy()
    rec = apply_rules(g, recognition_rules())
    assert sum(d.taken for d in rec.decisions) == 6
    assert Counter(n.op_type for n in g.nodes)["Silu"] == 6
    fused = apply_rules(g, fusion_rules())
    assert sum(d.rule == "conv_bn_act" and d.taken for d in fused.decisions) == 6


@pytest.mark.parametrize("model", ["bert_layer", "yolo_block"])
def test_recognition_keeps_the_numbers(graphs, model):
    before = graphs[model]
    after = before.copy()
    apply_rules(after, recognition_rules())
    after.verify()
    assert len(after.nodes) < len(before.nodes)
    same_outputs(before, after, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("model, kernels", [
    ("mobilenet_v1", 84 - 2 * 27),
    ("ds_cnn", 31 - 2 * 9),
    ("resnet8", None),
    ("bert_layer", None),
])
def test_fusion_plans_are_valid(graphs, model, kernels):
    g = graphs[model].copy()
    apply_rules(g, recognition_rules())
    out = apply_rules(g, fusion_rules())
    plan = build_plan(g, out.groups)
    plan.verify()
    if kernels is not None:
        assert plan.num_kernels == kernels
    assert plan.num_kernels < len(g.nodes)
