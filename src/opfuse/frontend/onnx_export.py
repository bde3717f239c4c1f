"""opfuse ``Graph`` -> ONNX model at a chosen opset (11 to 21).

Each IR node becomes one or more ONNX nodes: canonical attribute forms are written back in the
target opset's form, and ops that are not ONNX ops at that opset (opfuse's ``Silu``; ``Gelu``
before 20, ``LayerNormalization`` before 17, ``HardSwish`` before 14) are expanded into standard
ops (``onnx_export_rules``). Constants become initializers; value, node, input and output names
are kept. Attributes are written with the types the ONNX schema declares; an attribute that the
target opset cannot express is dropped when it holds the value that means "old behaviour" and
is an ``UnsupportedOpError`` otherwise.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.defs
from onnx import helper

from opfuse.errors import InputError, ModelError, UnsupportedOpError
from opfuse.frontend.onnx_opsets import MAX_OPSET, MIN_OPSET
from opfuse.frontend.onnx_protos import array_to_tensor, make_attribute, onnx_elem_type
from opfuse.ir.graph import Graph, Node, Value
from opfuse.version import __version__

DEFAULT_EXPORT_OPSET = 17

# Models whose constants exceed this many bytes are saved with external data, because a
# serialized protobuf message cannot exceed 2 GiB.
EXTERNAL_DATA_THRESHOLD_BYTES = 1 << 30

# Attributes without a schema default whose neutral value still means "the old behaviour".
_NEUTRAL_LIST_ATTRS = {"dilations": 1, "strides": 1}


def export_opset(graph: Graph, opset: int | None) -> int:
    if opset is None:
        return min(max(DEFAULT_EXPORT_OPSET, graph.opset), MAX_OPSET)
    if not MIN_OPSET <= int(opset) <= MAX_OPSET:
        raise InputError(f"cannot export at opset {opset}: opfuse writes opsets {MIN_OPSET} to {MAX_OPSET}")
    return int(opset)


class ExportContext:
    """Collects ONNX nodes and initializers; export rules write through it."""

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

    def add(self, op_type: str, inputs: list[str | None], outputs: list[str], *, name: str,
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
        for key in sorted(attrs or {}):
            value = attrs[key]
            if value is None:
                continue
            if key in schema.attributes:
                proto.attribute.append(make_attribute(key, value, schema.attributes[key].type))
            elif not _means_default(op_type, key, value):
                raise UnsupportedOpError(op_type, origin_name, self.opset,
                                         detail=f"attribute {key}={value!r} cannot be written at opset "
                                                f"{self.opset}; export at a newer opset")
        self.nodes.append(proto)
        return outputs

    def emit(self, node: Node, inputs: list[str | None] | None = None, attrs: dict | None = None,
             op_type: str | None = None) -> None:
        """Write ``node`` as one ONNX node (optionally with other inputs/attributes/op)."""
        if inputs is None:
            inputs = [v.name if v is not None else None for v in node.inputs]
        self.add(op_type or node.op_type, inputs, [v.name for v in node.outputs], name=node.name,
                 attrs=node.attrs if attrs is None else attrs, origin=node)

    def op(self, node: Node, op_type: str, inputs: list[str | None], out: str | None = None, **attrs) -> str:
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
        newest = onnx.defs.get_schema(op_type, MAX_OPSET, "")
    except onnx.defs.SchemaError:
        return False
    attr = newest.attributes.get(key)
    if attr is None or attr.default_value.type == onnx.AttributeProto.UNDEFINED:
        return False
    default = helper.get_attribute_value(attr.default_value)
    if isinstance(default, bytes):
        default = default.decode("utf-8")
    return default == value


def _value_info(v: Value) -> onnx.ValueInfoProto:
    if v.type is None:
        raise ModelError(f"value '{v.name}' has no type; infer shapes before exporting")
    return helper.make_tensor_value_info(v.name, onnx_elem_type(v.dtype, f"value '{v.name}'"), list(v.shape))


def export_model(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """An ONNX model computing the same function as ``graph`` (see the module docstring)."""
    from opfuse.frontend.onnx_export_rules import EXPORT_RULES

    target = export_opset(graph, opset)
    ctx = ExportContext(graph, target)
    const_outputs = {id(v) for v in graph.outputs if v.const is not None}
    for v in graph.constants:
        if id(v) in const_outputs:
            # ONNX outputs are node outputs (or inputs): the constant's name goes to an Identity
            # of an initializer, so the nodes that read it still find it under its name.
            ctx.add("Identity", [ctx.const(v.name + "_value", v.const)], [v.name],
                    name=ctx.fresh(v.name + "_identity"))
        elif v.uses:
            ctx.initializers.append(array_to_tensor(v.const, v.name))
    for node in graph.nodes:
        if node.domain:
            raise UnsupportedOpError(node.op_type, node.name, target,
                                     detail=f"domain '{node.domain}' cannot be exported")
        EXPORT_RULES.get(node.op_type, _export_as_is)(ctx, node)

    outputs = []
    seen: set[str] = set()
    for v in graph.outputs:
        info = _value_info(v)
        if v.name in seen:  # ONNX output names are unique: a repeated output gets a copy
            info.name = ctx.fresh(v.name)
            ctx.add("Identity", [v.name], [info.name], name=ctx.fresh(info.name + "_identity"))
        seen.add(v.name)
        outputs.append(info)
    output_names = {v.name for v in graph.outputs}
    value_info = [_value_info(v) for n in graph.nodes for v in n.outputs if v.name not in output_names]
    g = helper.make_graph(ctx.nodes, graph.name, [_value_info(v) for v in graph.inputs], outputs,
                          initializer=ctx.initializers, value_info=value_info)
    opsets = [helper.make_opsetid("", target)]
    model = helper.make_model(g, opset_imports=opsets, producer_name="opfuse",
                              producer_version=__version__)
    model.ir_version = helper.find_min_ir_version_for(opsets)
    return model


def _export_as_is(ctx: ExportContext, node: Node) -> None:
    ctx.emit(node)


def save_model(graph: Graph, path: str | os.PathLike, opset: int | None = None) -> None:
    """Export ``graph`` and write it to ``path`` (weights beside it when they are very large)."""
    model = export_model(graph, opset)
    path = os.fspath(path)
    big = sum(v.nbytes for v in graph.constants) > EXTERNAL_DATA_THRESHOLD_BYTES
    try:
        if big:
            onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location=os.path.basename(path) + ".data")
        else:
            with open(path, "wb") as f:
                f.write(model.SerializeToString())
    except OSError as e:
        raise InputError(f"cannot write '{path}': {e.strerror or e}") from None
