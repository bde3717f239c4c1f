"""Ops opfuse has no OpSpec for, imported through their ONNX function bodies.

Many standard ops are defined by ONNX as *functions*: a body of simpler standard ops, fixed
(``OpSchema.function_body``, e.g. Shrink, Softsign) or built for the node's attributes and input
types (``get_context_dependent_function``, e.g. Attention, RMSNormalization,
NegativeLogLikelihoodLoss, RotaryEmbedding). When opfuse has no OpSpec of its own for such an
op, the importer inlines the body in the node's place and imports the body's nodes like any
others (canonicalized, shape-inferred, folded, and later fused: an inlined Attention is the
MatMul -> Softmax -> MatMul chain the attention rule matches). Ops opfuse implements itself are
never expanded (its own kernel is faster and at least as accurate).

Inlining, per body node:

* its inputs and outputs named by the function's formal parameters become the caller's
  actual values (an absent optional input stays absent); every other value gets a fresh name
  under the caller node's name;
* an attribute that refers to a function attribute (``ref_attr_name``) takes the caller's
  value, else the schema's default, else is left out;
* its op version is read at the body's own opset (``FunctionProto.opset_import``), which may
  differ from the model's;
* a body node that is itself a function op without an OpSpec is expanded in turn.

An op the body needs and opfuse lacks is refused naming both ops.

``canonicalize`` is the one entry for a node of the graph, of a function body or of a subgraph:
If/Loop/Scan go to ``onnx_control`` (which imports their subgraphs' nodes through it in turn),
and a sequence or optional (``onnx_sequences``) reaching an op that needs tensors is refused.
"""
from __future__ import annotations

from typing import Any

import onnx
import onnx.defs
from onnx import helper

from opfuse.errors import ModelError, ShapeInputError, UnsupportedOpError
from opfuse.frontend import (  # noqa: F401  (register their canonicalizers)
    onnx_attention_ops, onnx_data_shapes, onnx_decompose, onnx_einsum, onnx_quantized, onnx_spectral, onnx_tfidf)
from opfuse.frontend.onnx_canonical import CANONICALIZERS, REMOVED_OPS, REWRITTEN_OPS, emit_as_is
from opfuse.frontend.onnx_control import CONTROL_FLOW
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.frontend.onnx_opsets import DEFAULT_DOMAINS
from opfuse.frontend.onnx_qoperator import MS_CANONICALIZERS, MS_DOMAIN
from opfuse.frontend.onnx_protos import NUMPY_TO_ONNX, attribute_value, outer_reads
from opfuse.frontend.onnx_sequences import SEQUENCE_OPS, tensors_only
from opfuse.ops.registry import is_supported

# Expansions nested deeper than this are a malformed (recursive) definition.
MAX_DEPTH = 8


def has_function(op_type: str, opset: int) -> bool:
    """Whether ``op_type`` at ``opset`` is an ONNX function whose body opfuse can inline."""
    try:
        schema: Any = onnx.defs.get_schema(op_type, opset, "")  # the stubs lack the function API
    except onnx.defs.SchemaError:
        return False
    return not schema.deprecated and (schema.has_function or schema.has_context_dependent_function)


# Ops whose inputs may be sequences or optionals (``onnx_sequences``): the sequence ops, the
# control flow that carries them, and Identity.
NON_TENSOR_OPS = SEQUENCE_OPS | set(CONTROL_FLOW) | {"Identity"}


def is_importable(op_type: str) -> bool:
    """Ops the importer handles without a function body."""
    return (is_supported(op_type) or op_type in REMOVED_OPS or op_type in REWRITTEN_OPS or op_type in SEQUENCE_OPS
            or op_type in CONTROL_FLOW)


def canonicalize(ctx: ImportContext, node: OnnxNode, inputs: list, depth: int = 0, opset: int | None = None) -> list:
    """Import one ONNX node (of a graph at ``ctx.opset``, or of a function body at ``opset``): its
    canonicalizer, the op as it is, or its function body inlined."""
    opset = ctx.opset if opset is None else opset
    if node.op_type in CONTROL_FLOW:
        return CONTROL_FLOW[node.op_type](ctx, node, inputs, depth, opset, canonicalize)
    inlined = not is_importable(node.op_type) and node.proto is not None and has_function(node.op_type, opset)
    if node.op_type not in NON_TENSOR_OPS and not inlined:
        tensors_only(ctx, node, inputs)
    if node.proto is not None and node.proto.domain == MS_DOMAIN:
        return MS_CANONICALIZERS[node.op_type](ctx, node, inputs)
    if node.op_type in CANONICALIZERS:
        return CANONICALIZERS[node.op_type](ctx, node, inputs)
    if inlined:
        return _inline(ctx, node, inputs, depth, opset)
    if not is_importable(node.op_type):
        raise UnsupportedOpError(node.op_type, node.name, opset, detail="not an op opfuse imports")
    return emit_as_is(ctx, node, inputs)


def _pick_version(versions, opset: int) -> int | None:
    """The newest function version at or below ``opset`` (else the oldest one there is)."""
    versions = sorted(int(v) for v in versions)
    if not versions:
        return None
    below = [v for v in versions if v <= opset]
    return below[-1] if below else versions[0]


def _type_proto(v) -> bytes:
    if v is None or v.type is None:
        return onnx.TypeProto().SerializeToString()
    return helper.make_tensor_type_proto(NUMPY_TO_ONNX[v.dtype], list(v.shape)).SerializeToString()


def function_body(schema: Any, node: onnx.NodeProto, inputs: list, opset: int) -> onnx.FunctionProto:
    """The body of ``node``'s function, for its attributes and input types."""
    version = _pick_version(schema.context_dependent_function_opset_versions, opset) \
        if schema.has_context_dependent_function else None
    if version is not None:
        data = schema.get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), [_type_proto(v) for v in inputs])
        f = onnx.FunctionProto()
        f.ParseFromString(data)
        return f
    version = _pick_version(schema.function_opset_versions, opset)
    if version is None:
        return schema.function_body
    data = schema.get_function_with_opset_version(version)
    if isinstance(data, onnx.FunctionProto):
        return data
    f = onnx.FunctionProto()
    f.ParseFromString(data)
    return f


def _inline(ctx: ImportContext, node: OnnxNode, inputs: list, depth: int, opset: int) -> list:
    if depth >= MAX_DEPTH:
        raise ModelError(f"node '{node.name}' ({node.op_type}): its ONNX function body nests more than "
                         f"{MAX_DEPTH} levels deep")
    schema: Any = onnx.defs.get_schema(node.op_type, opset, "")
    assert node.proto is not None
    try:
        body = function_body(schema, node.proto, inputs, opset)
    except Exception as e:  # onnx's builders refuse attributes or types they do not handle
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UnsupportedOpError(node.op_type, node.name, ctx.opset,
                                 detail=f"its ONNX function body cannot be built here: {first}") from None
    body_opset = next((int(o.version) for o in body.opset_import if o.domain in DEFAULT_DOMAINS), opset)
    env: dict[str, object] = {}
    for formal, actual_name, value in zip(body.input, node.inputs, inputs, strict=False):
        env[formal] = value if actual_name else None
    outputs = dict(zip(body.output, node.outputs, strict=False))
    renamed = _renamer(ctx, node, body, outputs)
    _count_uses(ctx, body, renamed)
    outer_scope, ctx.scope = ctx.scope, env  # subgraphs in the body read the body's values
    try:
        for i, inner in enumerate(body.node):
            _import_body_node(ctx, node, schema, inner, i, env, renamed, body_opset, depth)
    except UnsupportedOpError as e:
        if e.op_type == node.op_type and e.node == node.name:
            raise
        if isinstance(e, ShapeInputError):  # keep the graph inputs that decide the shape (their values bind it)
            wrapped = ShapeInputError(node.op_type, node.name, ctx.opset, detail=f"in its ONNX function body, {e}")
            wrapped.inputs = e.inputs
            raise wrapped from None
        raise UnsupportedOpError(node.op_type, node.name, ctx.opset,
                                 detail=f"in its ONNX function body, {e}") from None
    finally:
        ctx.scope = outer_scope
    results = []
    for formal, actual in zip(body.output, node.outputs, strict=False):
        results.append(env.get(formal) if actual else None)
    return results + [None] * (len(node.outputs) - len(results))


def _renamer(ctx: ImportContext, node: OnnxNode, body: onnx.FunctionProto, outputs: dict[str, str]):
    """Body value name -> the name it gets in the graph (outputs keep the caller's names)."""
    names: dict[str, str] = {}

    def rename(name: str) -> str:
        if not name:
            return ""
        if name in outputs and outputs[name]:
            return outputs[name]
        if name not in names:
            names[name] = ctx.fresh_value(f"{node.name}/{name}")
        return names[name]
    return rename


def _count_uses(ctx: ImportContext, body: onnx.FunctionProto, rename) -> None:
    """Inner values read by body nodes count as used (optional outputs are kept for them)."""
    formals = set(body.input)
    ctx.add_uses(rename(i) for n in body.node for i in list(n.input) + outer_reads(n) if i and i not in formals)


def _import_body_node(ctx: ImportContext, caller: OnnxNode, schema, inner: onnx.NodeProto, index: int,
                      env: dict, rename, body_opset: int, depth: int) -> None:
    if inner.domain not in DEFAULT_DOMAINS:
        raise UnsupportedOpError(inner.op_type, caller.name, ctx.opset,
                                 detail=f"domain '{inner.domain}' in a function body")
    proto = onnx.NodeProto()
    proto.CopyFrom(inner)
    del proto.attribute[:]
    for a in inner.attribute:
        if a.ref_attr_name:
            given = _caller_attribute(caller, schema, a.ref_attr_name)
            if given is None:
                continue
            b = onnx.AttributeProto()
            b.CopyFrom(given)
            b.name = a.name
            proto.attribute.append(b)
        else:
            proto.attribute.append(a)
    name = ctx.fresh_node(f"{caller.name}/{inner.op_type}_{index}")
    try:
        version = onnx.defs.get_schema(inner.op_type, body_opset, "").since_version
    except onnx.defs.SchemaError:
        raise UnsupportedOpError(inner.op_type, name, body_opset, detail="not an ONNX op") from None
    attrs = {a.name: attribute_value(a, proto, name, ctx.opset, None) for a in proto.attribute}
    values = []
    for i in inner.input:
        if i and i not in env:
            raise ModelError(f"node '{caller.name}' ({caller.op_type}): its function body reads '{i}' before "
                             f"defining it")
        values.append(env.get(i) if i else None)
    proto.ClearField("input")
    proto.input.extend([rename(i) if i and env.get(i) is not None else "" for i in inner.input])
    proto.ClearField("output")
    proto.output.extend([rename(o) for o in inner.output])
    onnx_node = OnnxNode(name, inner.op_type, version, list(proto.input), list(proto.output), attrs, proto)
    if not is_importable(inner.op_type) and not has_function(inner.op_type, body_opset):
        raise UnsupportedOpError(inner.op_type, name, body_opset, detail="not an op opfuse imports")
    out = canonicalize(ctx, onnx_node, values, depth + 1, body_opset)
    for formal, v in zip(inner.output, out, strict=False):
        if formal:
            env[formal] = v


def _caller_attribute(caller: OnnxNode, schema, name: str) -> onnx.AttributeProto | None:
    assert caller.proto is not None
    for a in caller.proto.attribute:
        if a.name == name:
            return a
    attr = schema.attributes.get(name)
    if attr is not None and attr.default_value.type != onnx.AttributeProto.UNDEFINED:
        return attr.default_value
    return None
