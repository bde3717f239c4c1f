"""Each zoo model has its real architecture's layers, shapes and parameter count.

Expected numbers come from the architectures (papers, published framework summaries), written
out as formulas where they are not a well-known published total.
"""
from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from opfuse import zoo


def params(model: onnx.ModelProto) -> int:
    """Learned parameters: elements of float initializers of rank >= 1 (BN running statistics
    included; 0-d scalars such as BERT's 8.0 are op constants, not parameters)."""
    return sum(int(np.prod(t.dims)) for t in model.graph.initializer
               if t.data_type == TensorProto.FLOAT and len(t.dims) > 0)


def histogram(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


def shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Every intermediate tensor's shape, by ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
            for vi in list(inferred.graph.value_info) + list(inferred.graph.output)}


def nodes(model: onnx.ModelProto, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == op_type]


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def conv_bn(cin: int, cout: int, k: int | tuple[int, int], group: int = 1, bias: bool = False) -> int:
    """Parameters of a Conv (+bias) followed by a BatchNorm (gamma, beta, mean, var)."""
    kh, kw = (k, k) if isinstance(k, int) else k
    return cout * (cin // group) * kh * kw + (cout if bias else 0) + 4 * cout


# MobileNetV1 ------------------------------------------------------------------------------------
MOBILENET_BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)] + [(512, 1)] * 5 \
    + [(1024, 2), (1024, 1)]
# Keras ``MobileNet(alpha=1.0, include_top=True)``: "Total params: 4,253,864" (same layers; its
# 1x1 conv classifier has exactly our Gemm's weights and bias).
KERAS_MOBILENET_V1_PARAMS = 4_253_864


def mobilenet_params(alpha: float, classes: int) -> int:
    c = int(32 * alpha)
    total = conv_bn(3, c, 3)
    for width, _ in MOBILENET_BLOCKS:
        cout = int(width * alpha)
        total += conv_bn(c, c, 3, group=c) + conv_bn(c, cout, 1)
        c = cout
    return total + c * classes + classes


def test_mobilenet_param_formula_matches_keras():
    assert mobilenet_params(1.0, 1000) == KERAS_MOBILENET_V1_PARAMS


@pytest.mark.parametrize("name, alpha, res, classes, softmax", [
    ("mobilenet_v1", 1.0, 224, 1000, False),
    ("mobilenet_v1_025_96", 0.25, 96, 2, True),
])
def test_mobilenet_v1(name, alpha, res, classes, softmax):
    m = zoo.build_onnx(name)
    expected = {"Conv": 27, "BatchNormalization": 27, "Relu": 27, "GlobalAveragePool": 1,
                "Flatten": 1, "Gemm": 1}
    if softmax:
        expected["Softmax"] = 1
    assert histogram(m) == expected
    assert params(m) == mobilenet_params(alpha, classes)
    depthwise = [n for n in nodes(m, "Conv") if attrs(n)["group"] > 1]
    assert [n.name for n in depthwise] == [f"dw{i}" for i in range(1, 14)]
    s = shapes(m)
    assert s["conv1_relu"] == [1, int(32 * alpha), res // 2, res // 2]
    assert s["pw13_relu"] == [1, int(1024 * alpha), res // 32, res // 32]
    assert s["output"] == [1, classes]
    # Unfolded Conv -> BN -> ReLU chains, ReLU (not Clip/ReLU6).
    by_output = {o: n for n in m.graph.node for o in n.output}
    for relu in nodes(m, "Relu"):
        bn = by_output[relu.input[0]]
        assert bn.op_type == "BatchNormalization" and by_output[bn.input[0]].op_type == "Conv"


# ResNets ----------------------------------------------------------------------------------------
# torchvision ``resnet18()``: 11,689,512 trainable parameters; our count adds the BatchNorm
# running mean and variance (2 per BN channel: 64 + 4*64 + 5*128 + 5*256 + 5*512 channels).
TORCHVISION_RESNET18_TRAINABLE = 11_689_512
RESNET18_BN_CHANNELS = 64 + 4 * 64 + 5 * 128 + 5 * 256 + 5 * 512


def test_resnet18():
    m = zoo.build_onnx("resnet18")
    assert histogram(m) == {"Conv": 20, "BatchNormalization": 20, "Relu": 17, "Add": 8, "MaxPool": 1,
                            "GlobalAveragePool": 1, "Flatten": 1, "Gemm": 1}
    assert params(m) == TORCHVISION_RESNET18_TRAINABLE + 2 * RESNET18_BN_CHANNELS
    s = shapes(m)
    assert s["maxpool"] == [1, 64, 56, 56]
    assert s["layer1_1_relu"] == [1, 64, 56, 56]
    assert s["layer2_1_relu"] == [1, 128, 28, 28]
    assert s["layer3_1_relu"] == [1, 256, 14, 14]
    assert s["layer4_1_relu"] == [1, 512, 7, 7]
    downsample = [n.name for n in nodes(m, "Conv") if attrs(n)["kernel_shape"] == [1, 1]]
    assert downsample == ["layer2_0_downsample", "layer3_0_downsample", "layer4_0_downsample"]
    # The residual Add feeds the block's ReLU.
    by_output = {o: n for n in m.graph.node for o in n.output}
    for add in nodes(m, "Add"):
        block = add.name[:-len("_add")]
        assert by_output[f"{block}_relu"].input == [add.output[0]]


def test_resnet8():
    m = zoo.build_onnx("resnet8")
    assert histogram(m) == {"Conv": 9, "BatchNormalization": 7, "Relu": 7, "Add": 3, "AveragePool": 1,
                            "Flatten": 1, "Gemm": 1, "Softmax": 1}
    expected = (conv_bn(3, 16, 3, bias=True)
                + 2 * conv_bn(16, 16, 3, bias=True)
                + conv_bn(16, 32, 3, bias=True) + conv_bn(32, 32, 3, bias=True) + 16 * 32 + 32
                + conv_bn(32, 64, 3, bias=True) + conv_bn(64, 64, 3, bias=True) + 32 * 64 + 64
                + 64 * 10 + 10)
    assert params(m) == expected
    s = shapes(m)
    assert s["stack1_relu"] == [1, 16, 32, 32]
    assert s["stack2_relu"] == [1, 32, 16, 16]
    assert s["stack3_relu"] == [1, 64, 8, 8]
    assert s["pool"] == [1, 64, 1, 1]
    for conv in nodes(m, "Conv"):
        a = attrs(conv)
        if a["strides"] == [2, 2] and a["kernel_shape"] == [3, 3]:
            assert a["pads"] == [0, 0, 1, 1], conv.name  # TensorFlow "same", extra pad at the end


# DS-CNN -----------------------------------------------------------------------------------------

def test_ds_cnn():
    m = zoo.build_onnx("ds_cnn")
    assert histogram(m) == {"Conv": 9, "BatchNormalization": 9, "Relu": 9, "AveragePool": 1,
                            "Flatten": 1, "Gemm": 1, "Softmax": 1}
    expected = conv_bn(1, 64, (10, 4), bias=True) + 4 * (
        conv_bn(64, 64, 3, group=64, bias=True) + conv_bn(64, 64, 1, bias=True)) + 64 * 12 + 12
    assert params(m) == expected
    stem = attrs(m.graph.node[0])
    assert (stem["kernel_shape"], stem["strides"], stem["pads"]) == ([10, 4], [2, 2], [4, 1, 5, 1])
    s = shapes(m)
    assert s["conv1_relu"] == [1, 64, 25, 5]
    assert s["pw4_relu"] == [1, 64, 25, 5]
    assert attrs(nodes(m, "AveragePool")[0])["kernel_shape"] == [24, 5]
    assert s["output"] == [1, 12]


# BERT -------------------------------------------------------------------------------------------
BERT_BASE_LAYER_PARAMS = 4 * (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768) + 2 * 2 * 768


def test_bert_layer():
    m = zoo.build_onnx("bert_layer")
    assert histogram(m) == {"MatMul": 8, "Add": 13, "Reshape": 4, "Transpose": 4, "Div": 4,
                            "Softmax": 1, "ReduceMean": 4, "Sub": 2, "Pow": 2, "Sqrt": 2, "Mul": 4,
                            "Erf": 1}
    assert params(m) == BERT_BASE_LAYER_PARAMS == 7_087_872
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    s = shapes(m)
    for proj in ("query", "key", "value", "attention_output"):
        assert inits[f"{proj}.weight"].shape == (768, 768)
    assert inits["intermediate.weight"].shape == (768, 3072)
    assert inits["output_dense.weight"].shape == (3072, 768)
    assert s["query_transpose"] == [1, 12, 128, 64]
    assert s["key_transpose"] == [1, 12, 64, 128]
    assert s["scores"] == [1, 12, 128, 128]
    assert s["context_reshape"] == [1, 128, 768]
    assert s["intermediate_add"] == [1, 128, 3072]
    assert s["output"] == [1, 128, 768]
    by_name = {n.name: n for n in m.graph.node}
    assert float(inits[by_name["scores_scale"].input[1]]) == 8.0
    assert attrs(by_name["attention_probs"])["axis"] == -1
    for rm in nodes(m, "ReduceMean"):
        assert attrs(rm)["axes"] == [-1]  # an attribute at opset 17
    # The decomposed LayerNorm and erf-GELU chains, in PyTorch's export order.
    chain = [n.op_type for n in m.graph.node if n.name.startswith("output_ln")]
    assert chain == ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]
    chain = [n.op_type for n in m.graph.node if n.name.startswith("gelu")]
    assert chain == ["Div", "Erf", "Add", "Mul", "Mul"]
    assert np.isclose(float(inits["gelu.sqrt2"]), np.sqrt(2.0))


# YOLO -------------------------------------------------------------------------------------------

def test_yolo_block():
    m = zoo.build_onnx("yolo_block")
    assert histogram(m) == {"Conv": 6, "BatchNormalization": 6, "Sigmoid": 6, "Mul": 6, "Split": 1,
                            "Add": 2, "Concat": 1}
    c = 16
    assert params(m) == conv_bn(32, 2 * c, 1) + 4 * conv_bn(c, c, 3) + conv_bn(4 * c, 32, 1)
    s = shapes(m)
    assert s["split_0"] == s["split_1"] == [1, c, 80, 80]
    assert s["concat"] == [1, 4 * c, 80, 80]
    assert s["output"] == [1, 32, 80, 80]
    # SiLU is Mul(x, Sigmoid(x)) on the BatchNorm output.
    by_output = {o: n for n in m.graph.node for o in n.output}
    for mul in nodes(m, "Mul"):
        x, sig = mul.input
        assert by_output[sig].op_type == "Sigmoid" and by_output[sig].input == [x]
        assert by_output[x].op_type == "BatchNormalization"
    # The bottleneck residuals add the bottleneck input to its output.
    assert list(by_output["m0_add"].input) == ["split_1", "m0_cv2_silu"]
    assert list(by_output["m1_add"].input) == ["m0_add", "m1_cv2_silu"]
