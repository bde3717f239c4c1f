"""Every zoo model through ``fuse``: same outputs as the original, and the expected kernels."""
import pytest

from opfuse import zoo
from opfuse.rules.plan_check import verify_plan
from fusion_cases import assert_same_outputs, fuse, kernels

# (kernels before, kernels after, groups after)
EXPECTED = {
    "bert_layer": (49, 7, 7),
    "ds_cnn": (31, 12, 13),
    "mobilenet_v1": (84, 29, 30),
    "mobilenet_v1_025_96": (85, 30, 31),
    "resnet18": (69, 23, 24),
    "resnet8": (30, 12, 13),
    "yolo_block": (28, 6, 8),  # Split and Concat move nothing
}


@pytest.fixture(scope="module")
def fused():
    cache = {}

    def get(name):
        if name not in cache:
            g0 = zoo.load(name)
            cache[name] = (g0,) + fuse(g0)
        return cache[name]
    return get


@pytest.mark.parametrize("name", zoo.list_models())
def test_outputs_and_kernel_counts(name, fused):
    g0, g, plan, _ = fused(name)
    verify_plan(plan)
    before, after, groups = EXPECTED[name]
    assert (len(g0.nodes), kernels(plan), len(plan.groups)) == (before, after, groups)
    assert_same_outputs(g0, g)


def test_mobilenet_every_conv_bn_relu_triple_is_one_group(fused):
    g0, g, plan, _ = fused("mobilenet_v1")
    triples = []
    for conv in (n for n in g0.nodes if n.op_type == "Conv"):
        bn = conv.output.uses[0][0]
        relu = bn.output.uses[0][0]
        assert (bn.op_type, relu.op_type) == ("BatchNormalization", "Relu")
        triples.append([conv.name, bn.name, relu.name])
    origins = [g.attrs["origin"] for g in plan.groups]
    assert len(triples) == 27
    for t in triples:
        assert t in origins, t
    assert all(g.kind == "conv_epilogue" for g in plan.groups if g.attrs["origin"] in triples)


def test_bert_qkv_merged_attention_two_kernels_layernorm_and_gelu_fused(fused):
    g0, g, plan, _ = fused("bert_layer")
    owner = {o: grp for grp in plan.groups for o in grp.attrs["origin"]}
    qkv = {owner[f"{p}_{op}"].name for p in ("query", "key", "value") for op in ("matmul", "add")}
    assert len(qkv) == 1 and owner["query_matmul"].kind == "gemm_epilogue"
    attention = owner["scores"]
    assert attention.kind == "attention"
    assert {"scores", "attention_probs", "context"} <= set(attention.attrs["origin"])
    # The seed's BERT case: Q, K, V, Q K^T, Softmax, (.)V -- six kernels become two.
    six = ["query_matmul", "key_matmul", "value_matmul", "scores", "attention_probs", "context"]
    assert len({owner[o].name for o in six}) == 2
    for ln in ("attention_ln", "output_ln"):
        grp = owner[f"{ln}_div"]
        assert grp.kind == "reduction" and "LayerNormalization" in grp.op_types
        assert len(grp.nodes) > 1  # fused with the bias and residual Adds before it
        assert {f"{ln}_mean", f"{ln}_shift"} <= set(grp.attrs["origin"])
    gelu = owner["gelu_erf"]
    assert gelu.kind == "gemm_epilogue" and gelu.op_types == ["MatMul", "Add", "Gelu"]


def test_resnet_residual_add_is_a_conv_epilogue(fused):
    g0, g, plan, _ = fused("resnet18")
    assert sum(1 for grp in plan.groups if grp.op_types == ["Conv", "Add", "Relu"]) == 8


def test_yolo_silu_epilogues_and_elided_concat(fused):
    g0, g, plan, _ = fused("yolo_block")
    assert sum(1 for grp in plan.groups if grp.op_types[:2] == ["Conv", "Silu"]) == 6
    concat = next(grp for grp in plan.groups if grp.op_types == ["Concat"])
    assert concat.kind == "concat" and concat.attrs["zero_copy"] == "concat"
    assert len(concat.attrs["alias_inputs"]) == 4
    # C2f's Split: its two outputs are the Concat's first two inputs, so cv1 writes into the Concat
    split = next(grp for grp in plan.groups if grp.op_types == ["Split"])
    assert split.attrs["zero_copy"] == "view" and split.attrs["through_concat"] == concat.nodes[0].name


def test_disabled_fusion_is_one_kernel_per_op():
    g0 = zoo.load("resnet8")
    g, plan, decisions = fuse(g0, enable=False)
    assert plan.num_kernels == len(g0.nodes) and decisions == []
    assert [n.op_type for n in g.nodes] == [n.op_type for n in g0.nodes]
