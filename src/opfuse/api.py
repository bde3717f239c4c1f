"""The Python face of opfuse: load a model from wherever the user names it."""
from __future__ import annotations

import os
from typing import Mapping

import onnx

from opfuse.errors import ModelError
from opfuse.ir.graph import Graph

ZOO_PREFIX = "zoo:"


def load(model, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
         input_values: Mapping | None = None) -> Graph:
    """A Graph from ``zoo:NAME``, a path to an ``.onnx`` file, an ``onnx.ModelProto`` or a Graph.

    ``input_values`` makes the graph inputs it names constants (``import_model``): how inputs
    that decide shapes are bound. Names unsafe on a terminal are noted (``report.terminal``), so
    the CLI prints them escaped."""
    from opfuse.report.terminal import remember_names
    graph = _load(model, input_shapes, dict(input_values or {}))
    remember_names(graph)
    return graph


def model_source(model):
    """``model`` as the loaders take it: a Graph or an ``onnx.ModelProto`` as it is, serialized ONNX bytes
    parsed into a ModelProto (``ModelError`` when they are not one), a path or ``zoo:NAME`` as a str; a
    ``ModelError`` naming what was given for anything else (``None`` or a number was a ``TypeError``)."""
    if isinstance(model, (Graph, onnx.ModelProto)):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        from opfuse.frontend.onnx_files import parse_model
        return parse_model(bytes(model), "the model bytes")
    if isinstance(model, (str, os.PathLike)):
        spec = os.fspath(model)
        return spec if isinstance(spec, str) else os.fsdecode(spec)
    raise ModelError(f"a model is a path to an .onnx file, 'zoo:NAME', serialized ONNX bytes, an onnx.ModelProto "
                     f"or an opfuse Graph, not {type(model).__name__}")


def _load(model, input_shapes: Mapping[str, tuple[int, ...]] | None, input_values: Mapping | None = None) -> Graph:
    model = model_source(model)
    if isinstance(model, Graph):
        if input_values:
            raise ModelError("input values bind the inputs of an ONNX model, not of an imported Graph")
        return model
    if isinstance(model, onnx.ModelProto):
        from opfuse.frontend.onnx import import_model
        return import_model(model, input_shapes=dict(input_shapes or {}), input_values=input_values)
    spec = os.fspath(model)
    if spec.startswith(ZOO_PREFIX):
        from opfuse import zoo
        if input_values:
            from opfuse.frontend.onnx import import_model
            return import_model(zoo.build_onnx(spec[len(ZOO_PREFIX):]), input_shapes=dict(input_shapes or {}),
                                input_values=input_values)
        return zoo.load(spec[len(ZOO_PREFIX):], input_shapes=dict(input_shapes or {}) or None)
    if not os.path.exists(spec):
        raise ModelError(f"model '{spec}' not found (give a path to an .onnx file or zoo:NAME)")
    from opfuse.frontend.onnx import load_model
    return load_model(spec, input_shapes=dict(input_shapes or {}), input_values=input_values)


def onnx_proto(model) -> onnx.ModelProto:
    """The ONNX model behind ``model`` (for running it in onnxruntime side by side)."""
    model = model_source(model)
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, Graph):
        from opfuse.frontend.onnx import export_model
        return export_model(model)
    spec = os.fspath(model)
    if spec.startswith(ZOO_PREFIX):
        from opfuse import zoo
        return zoo.build_onnx(spec[len(ZOO_PREFIX):])
    from opfuse.frontend.onnx import read_model_with_data
    return read_model_with_data(spec)  # external data checked against path traversal


def declared_inputs(model) -> dict:
    """Each graph input of ``model`` -> its declared dims (ints, symbol names, ``None`` unknown).

    Empty for a Graph (its shapes are bound) and a zoo model (built with its shapes); a path
    is parsed here without its external data (the weights are not needed for the inputs)."""
    model = model_source(model)
    if isinstance(model, Graph):
        return {}
    from opfuse.frontend.onnx import declared_inputs as onnx_inputs
    if isinstance(model, onnx.ModelProto):
        return onnx_inputs(model)
    spec = os.fspath(model)
    if spec.startswith(ZOO_PREFIX) or not os.path.exists(spec):
        return {}
    from opfuse.frontend.onnx import read_model
    return onnx_inputs(read_model(spec))


def unbound_inputs(model, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[str]:
    """The inputs of ``model`` whose shapes ``input_shapes`` leaves open (symbolic or unknown dims
    no given shape binds): what the first run's arrays must bind."""
    from opfuse.frontend.onnx import unbound_inputs as unbound
    return unbound(declared_inputs(model), dict(input_shapes or {}))


def shapes_for_arrays(model, input_shapes: Mapping[str, tuple[int, ...]] | None, arrays: Mapping) -> dict:
    """``input_shapes`` plus the shapes of ``arrays`` (a run's inputs) for the inputs it leaves open;
    a ``ShapeError`` when an array's rank or fixed dims disagree with the model, or two arrays
    give one symbol two sizes."""
    from opfuse.frontend.onnx import shapes_from_arrays
    return shapes_from_arrays(declared_inputs(model), dict(input_shapes or {}), arrays)


def load_for_arrays(model, input_shapes: Mapping[str, tuple[int, ...]] | None, arrays: Mapping) -> tuple[Graph, dict]:
    """``(graph, values)``: ``model`` imported for a run on ``arrays``: its open dims bound by the
    arrays' shapes (``shapes_for_arrays``) and each graph input that decides a shape
    (``ShapeInputError.inputs``) bound to its array, which ``values`` holds (the graph no longer
    takes it as an input). The error stands when such an input has no array."""
    from opfuse.errors import ShapeInputError
    shapes = shapes_for_arrays(model, input_shapes, arrays) if arrays else dict(input_shapes or {})
    values: dict = {}
    while True:
        try:
            return load(model, shapes, values), values
        except ShapeInputError as e:
            wanted = set(e.inputs) - set(values)
            if not wanted or not wanted <= set(arrays):
                raise
            values.update({n: arrays[n] for n in sorted(wanted)})
