"""Reading ONNX files: bytes -> ``ModelProto``, with a clear ``ModelError`` for anything else.

``read_model`` does not read external data (the importer reads it, from inside the model's
folder only); ``read_model_with_data`` inlines it after the same checks, for handing a user's
file to another runtime without trusting onnx's own loader.
"""
from __future__ import annotations

import os

import onnx

from opfuse.errors import ModelError
from opfuse.frontend.external_data import inline_external_data, uses_external_data


def read_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Parse an ONNX file (external data is *not* read here; ``import_model`` reads it safely)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ModelError(f"model file '{path}' does not exist")
    if os.path.isdir(path):
        raise ModelError(f"'{path}' is a directory, not an ONNX model file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelError(f"cannot read model file '{path}': {e.strerror or e}") from None
    return parse_model(data, path)


def parse_model(data: bytes, where: str = "model") -> onnx.ModelProto:
    """A ``ModelProto`` from serialized bytes, or a ``ModelError`` saying why it is not one."""
    if not data:
        raise ModelError(f"'{where}' is empty, not an ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf DecodeError and friends
        raise ModelError(f"'{where}' is not a valid ONNX model (truncated, or not an ONNX file)") from None
    if not model.HasField("graph") or not model.opset_import or model.ir_version <= 0:
        raise ModelError(f"'{where}' is not a valid ONNX model (no graph or no opset; truncated, or "
                         f"not an ONNX file)")
    return model


def read_model_with_data(path: str | os.PathLike) -> onnx.ModelProto:
    """The ONNX model of a file with its external data inlined (after the same safety checks).

    For handing a user's file to another runtime (onnxruntime) without trusting onnx's loader.
    """
    path = os.fspath(path)
    model = read_model(path)
    base_dir = os.path.dirname(os.path.abspath(path))
    for t in _all_tensors(model.graph):
        if uses_external_data(t):
            t.CopyFrom(inline_external_data(t, base_dir, f"tensor '{t.name}'"))
    return model


def _all_tensors(g: onnx.GraphProto):
    yield from g.initializer
    for st in g.sparse_initializer:
        yield st.values
        yield st.indices
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                yield a.t
            elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
