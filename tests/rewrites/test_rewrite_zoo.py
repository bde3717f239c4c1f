"""The rewrite pipeline on every zoo model: the expected rewrites (outputs: tests/fusion/test_fusion_zoo.py)."""
from collections import Counter

import pytest

from opfuse import zoo
from rewrite_cases import applied, rewritten

EXPECTED = {  # rule -> applications
    "bert_layer": {"recognize_layernorm": 2, "recognize_gelu_erf": 1, "horizontal_matmul": 1},
    "mobilenet_v1": {"fold_batchnorm": 27},
    "mobilenet_v1_025_96": {"fold_batchnorm": 27},
    "resnet18": {"fold_batchnorm": 20},
    "resnet8": {"fold_batchnorm": 7},
    "ds_cnn": {"fold_batchnorm": 9},
    "yolo_block": {"fold_batchnorm": 6, "recognize_silu": 6},
}


@pytest.mark.parametrize("name", zoo.list_models())
def test_zoo_rewrites(name):
    g0, g1, res = rewritten(zoo.load(name))
    for rule, count in EXPECTED[name].items():
        assert applied(res, rule) == count, rule
    hist = Counter(n.op_type for n in g1.nodes)
    assert hist["BatchNormalization"] == 0 and hist["Sigmoid"] == 0 and hist["Erf"] == 0
