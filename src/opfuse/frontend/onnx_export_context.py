"""What exporters write through: ``ExportContext`` collects the ONNX nodes and initializers
of one export, gives fresh names, and writes each attribute with the type the target opset's
schema declares (dropping one the opset lacks only when it holds the "old behaviour" value).

``onnx_export`` drives the export; ``onnx_exporters`` holds the rules.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
import onnx.defs
from onnx import helper

from opfuse.errors import UnsupportedOpError
from opfuse.frontend.onnx_opsets import EXPORT_MAX_OPSET
from opfuse.frontend.onnx_protos import array_to_tensor, make_attribute
from opfuse.ir.graph import Graph, Node

# Attributes without a schema default whose neutral value still means "the old behaviour".
_NEUTRAL_LIST_ATTRS = {"dilations": 1, "strides": 1}


class ExportContext:
    """Collects ONNX nodes and initializers; exporters write through it."""

    def __init__(self, graph: Graph, opset: int):
        self.graph = graph
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._taken = set(graph.values) | {n.name for n in graph.nodes}
        self._counters: dict[str, int] = {}
        self._schemas: dict[str, onnx.defs.OpSchema | None] = {}

    def fresh(self, base: str) -> str:
        k = self._counters.get(base, 0)
        cand = base
        while cand in self._taken:
            k += 1
            cand = f"{base}_{k}"
        self._counters[base] = k
        self._taken.add(cand)
        return cand

    def const(self, base: str, data) -> str:
        """A new initializer holding ``data``; returns its (fresh) name."""
        name = self.fresh(base)
        self.initializers.append(array_to_tensor(np.asarray(data), name))
        return name

    def schema(self, op_type: str) -> onnx.defs.OpSchema | None:
        if op_type not in self._schemas:
            try:
                s = onnx.defs.get_schema(op_type, self.opset, "")
                self._schemas[op_type] = None if s.deprecated else s
            except onnx.defs.SchemaError:
                self._schemas[op_type] = None
        return self._schemas[op_type]

    def add(self, op_type: str, inputs: Sequence[str | None], outputs: list[str], *, name: str,
            attrs: dict | None = None, origin: Node | None = None) -> list[str]:
        """Append an ONNX node; ``origin`` is the IR node it comes from (named in errors)."""
        origin_name = origin.name if origin is not None else name
        schema = self.schema(op_type)
        if schema is None:
            raise UnsupportedOpError(op_type, origin_name, self.opset,
                                     detail=f"not an ONNX op at opset {self.opset} and opfuse has no "
                                            f"expansion for it")
        ins = [i or "" for i in inputs]
        while ins and not ins[-1]:
            ins.pop()
        proto = helper.make_node(op_type, ins, outputs, name=name)
        attrs = attrs or {}
        for key in sorted(attrs):
            value = attrs[key]
            if value is None:
                continue
            if key in schema.attributes:
                # The pybind enum converts with int(); onnx's type stub lacks its __int__.
                attr_type = int(schema.attributes[key].type)  # type: ignore[call-overload]
                proto.attribute.append(make_attribute(key, value, attr_type))
            elif not _means_default(op_type, key, value):
                raise UnsupportedOpError(op_type, origin_name, self.opset,
                                         detail=f"attribute {key}={value!r} cannot be written at opset "
                                                f"{self.opset}; export at a newer opset")
        self.nodes.append(proto)
        return outputs

    def emit(self, node: Node, inputs: Sequence[str | None] | None = None, attrs: dict | None = None,
             op_type: str | None = None) -> None:
        """Write ``node`` as one ONNX node (optionally with other inputs/attributes/op)."""
        if inputs is None:
            inputs = [v.name if v is not None else None for v in node.inputs]
        self.add(op_type or node.op_type, inputs, [v.name for v in node.outputs], name=node.name,
                 attrs=node.attrs if attrs is None else attrs, origin=node)

    def op(self, node: Node, op_type: str, inputs: Sequence[str | None], out: str | None = None, **attrs) -> str:
        """One step of an expansion of ``node``: a fresh ONNX node; returns its output name."""
        out = out or self.fresh(f"{node.name}_{op_type.lower()}")
        self.add(op_type, inputs, [out], name=self.fresh(f"{node.name}/{op_type}"), attrs=attrs,
                 origin=node)
        return out


def _means_default(op_type: str, key: str, value) -> bool:
    """Whether an attribute the target opset lacks holds the value meaning "old behaviour"."""
    if key in _NEUTRAL_LIST_ATTRS and isinstance(value, (list, tuple)):
        return all(int(v) == _NEUTRAL_LIST_ATTRS[key] for v in value)
    try:
        newest = onnx.defs.get_schema(op_type, EXPORT_MAX_OPSET, "")
    except onnx.defs.SchemaError:
        return False
    attr = newest.attributes.get(key)
    if attr is None or attr.default_value.type == onnx.AttributeProto.UNDEFINED:
        return False
    default = helper.get_attribute_value(attr.default_value)
    if isinstance(default, bytes):
        default = default.decode("utf-8")
    return default == value
