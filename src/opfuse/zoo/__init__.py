"""The model zoo: deterministic ONNX models built in code (no downloads, no torch).

Every model is an opset-17 float32 ``onnx.ModelProto`` with one input named ``input`` and one
output named ``output``, seeded random weights scaled so activations stay O(1), and BatchNorm /
LayerNorm with non-trivial statistics. Building a model twice gives byte-identical protos.

    >>> from opfuse import zoo
    >>> zoo.list_models()[:2]
    ['bert_layer', 'ds_cnn']
    >>> graph = zoo.load("resnet8")          # imported into the opfuse IR
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

import onnx

from opfuse.errors import ModelError
from opfuse.zoo.bert import build_bert_layer
from opfuse.zoo.ds_cnn import build_ds_cnn
from opfuse.zoo.mobilenet import build_mobilenet_v1, build_mobilenet_v1_025_96
from opfuse.zoo.resnet import build_resnet8, build_resnet18
from opfuse.zoo.yolo import build_yolo_block


class UnknownModelError(ModelError):
    """A zoo model name that does not exist."""


@dataclass(frozen=True)
class ZooModel:
    """A zoo entry: ``build()`` makes a fresh ModelProto (no caching)."""

    name: str
    build: Callable[[], onnx.ModelProto]
    description: str


# Every zoo model by name (read-only).
MODELS: Mapping[str, ZooModel] = MappingProxyType({m.name: m for m in (
    ZooModel("bert_layer", build_bert_layer,
             "one BERT-base encoder layer, 1x128x768, 12 heads, Q/K/V MatMul+Add, decomposed "
             "LayerNorm, erf GELU"),
    ZooModel("ds_cnn", build_ds_cnn,
             "MLPerf Tiny keyword spotting DS-CNN, 1x1x49x10 MFCC, 64 channels, 4 depthwise-separable "
             "blocks, 12-class Softmax"),
    ZooModel("mobilenet_v1", build_mobilenet_v1,
             "MobileNetV1 width 1.0, 1x3x224x224, Conv+BN+ReLU unfolded, 1000 logits (no Softmax)"),
    ZooModel("mobilenet_v1_025_96", build_mobilenet_v1_025_96,
             "MLPerf Tiny visual wake words MobileNetV1 width 0.25, 1x3x96x96, 2-class Softmax"),
    ZooModel("resnet18", build_resnet18,
             "ResNet-18, 1x3x224x224, BN unfolded, residual Add+ReLU, 1000 logits (no Softmax)"),
    ZooModel("resnet8", build_resnet8,
             "MLPerf Tiny CIFAR-10 ResNet-8, 1x3x32x32, 16/32/64 channels, 10-class Softmax"),
    ZooModel("yolo_block", build_yolo_block,
             "YOLOv8 C2f block, 1x32x80x80, Conv+BN+SiLU (Sigmoid*Mul), Split, residual Add, Concat"),
)})


def list_models() -> list[str]:
    """The names of every zoo model, sorted."""
    return sorted(MODELS)


def _entry(name: str) -> ZooModel:
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise UnknownModelError(f"unknown zoo model {name!r}; available: {', '.join(list_models())}") \
            from None


def describe(name: str) -> str:
    """A one-line description of the model."""
    return _entry(name).description


@functools.lru_cache(maxsize=None)
def _built(name: str) -> onnx.ModelProto:
    return _entry(name).build()


def build_onnx(name: str) -> onnx.ModelProto:
    """The model as a fresh ``onnx.ModelProto`` (built once per process; callers get a copy)."""
    _entry(name)  # validate before touching the cache
    model = onnx.ModelProto()
    model.CopyFrom(_built(name))
    return model


def load(name: str, input_shapes: Mapping[str, Sequence[int]] | None = None):
    """The model imported into the opfuse IR (``opfuse.ir.Graph``)."""
    # Imported here, not at the top: listing and building models needs only the onnx package.
    from opfuse.frontend.onnx_import import import_model

    return import_model(build_onnx(name), input_shapes=input_shapes)


__all__ = ["MODELS", "UnknownModelError", "ZooModel", "build_onnx", "describe", "list_models", "load"]
