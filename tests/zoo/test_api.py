"""The zoo's public API: listing, describing, building (copies) and loading into the IR."""
import pytest

from opfuse import zoo
from opfuse.errors import OpfuseError
from opfuse.ir.graph import Graph

EXPECTED_MODELS = ["bert_layer", "ds_cnn", "mobilenet_v1", "mobilenet_v1_025_96", "resnet18", "resnet8",
                   "yolo_block"]
INPUT_SHAPES = {
    "bert_layer": (1, 128, 768),
    "ds_cnn": (1, 1, 49, 10),
    "mobilenet_v1": (1, 3, 224, 224),
    "mobilenet_v1_025_96": (1, 3, 96, 96),
    "resnet18": (1, 3, 224, 224),
    "resnet8": (1, 3, 32, 32),
    "yolo_block": (1, 32, 80, 80),
}


def test_list_models_is_sorted_and_complete():
    assert zoo.list_models() == EXPECTED_MODELS
    assert list(INPUT_SHAPES) == EXPECTED_MODELS


@pytest.mark.parametrize("name", EXPECTED_MODELS)
def test_describe_is_one_line(name):
    text = zoo.describe(name)
    assert text and "\n" not in text


@pytest.mark.parametrize("call", [zoo.describe, zoo.build_onnx, zoo.load])
def test_unknown_name_is_a_user_error_listing_the_models(call):
    with pytest.raises(OpfuseError) as info:
        call("resnet19")
    message = str(info.value)
    assert "resnet19" in message and "\n" not in message
    assert all(name in message for name in EXPECTED_MODELS)
    assert isinstance(info.value, zoo.UnknownModelError)


def test_non_string_name_is_a_user_error():
    with pytest.raises(zoo.UnknownModelError):
        zoo.build_onnx(["resnet8"])


def test_build_onnx_returns_an_independent_copy():
    first = zoo.build_onnx("resnet8")
    first.graph.node[0].name = "mutated"
    del first.graph.initializer[:]
    again = zoo.build_onnx("resnet8")
    assert again.graph.node[0].name == "conv1"
    assert len(again.graph.initializer) > 0


@pytest.mark.parametrize("name", EXPECTED_MODELS)
def test_load_imports_into_a_verified_graph(name):
    graph = zoo.load(name)
    assert isinstance(graph, Graph)
    graph.verify()
    assert [(v.name, v.shape) for v in graph.inputs] == [("input", INPUT_SHAPES[name])]
    assert [v.name for v in graph.outputs] == ["output"]
    onnx_ops = sorted({n.op_type for n in zoo.build_onnx(name).graph.node})
    assert sorted({n.op_type for n in graph.nodes}) == onnx_ops


def test_load_accepts_matching_input_shapes_and_rejects_others():
    graph = zoo.load("resnet8", input_shapes={"input": (1, 3, 32, 32)})
    assert graph.inputs[0].shape == (1, 3, 32, 32)
    with pytest.raises(OpfuseError):
        zoo.load("resnet8", input_shapes={"input": (1, 3, 64, 64)})
