"""opfuse ``Graph`` -> ONNX model at a chosen opset (11 to 21; import reads 7 to 28).

Each IR node becomes one or more ONNX nodes: canonical attribute forms are written back in the
target opset's form, and ops that are not ONNX ops at that opset (opfuse's ``Silu``; ``Gelu``
before 20, ``Mish`` before 18, ``LayerNormalization`` before 17, ``HardSwish`` before 14) are
expanded into standard ops (``onnx_exporters``). Constants become initializers; value, node, input and output names
are kept. Attributes are written with the types the ONNX schema declares; an attribute that the
target opset cannot express is dropped when it holds the value that means "old behaviour" and
is an ``UnsupportedOpError`` otherwise.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import onnx
from onnx import helper

from opfuse.errors import InputError, ModelError, UnsupportedOpError
from opfuse.frontend.dequantized import dequantized
from opfuse.frontend.onnx_decompose import KEPT_DEQUANTIZED
from opfuse.frontend.onnx_export_context import ExportContext
from opfuse.frontend.onnx_exporters import EXPORTERS
from opfuse.frontend.onnx_opsets import EXPORT_MAX_OPSET, EXPORT_MIN_OPSET
from opfuse.frontend.onnx_protos import array_to_tensor, onnx_elem_type
from opfuse.ir.graph import Graph, Node, Value
from opfuse.version import __version__

DEFAULT_EXPORT_OPSET = 17

# Models whose constants exceed this many bytes are saved with external data, because a
# serialized protobuf message cannot exceed 2 GiB.
EXTERNAL_DATA_THRESHOLD_BYTES = 1 << 30
LOCAL_FUNCTIONS_IR_VERSION = 8  # model-local functions came with IR version 8 (ONNX 1.10)


def _defined_at(op_type: str, opset: int) -> bool:
    try:
        return not onnx.defs.get_schema(op_type, opset, "").deprecated
    except onnx.defs.SchemaError:
        return False


def export_opset(graph: Graph, opset: int | None) -> int:
    """The opset asked for, else ``DEFAULT_EXPORT_OPSET`` or the graph's own when newer, raised to
    the first opset that defines every ONNX op of the graph (BitwiseAnd needs 18, ...)."""
    if opset is None:
        chosen = min(max(DEFAULT_EXPORT_OPSET, graph.opset), EXPORT_MAX_OPSET)
        for op_type in sorted({n.op_type for n in graph.nodes}):
            if _defined_at(op_type, chosen):
                continue
            newer = [v for v in range(chosen + 1, EXPORT_MAX_OPSET + 1) if _defined_at(op_type, v)]
            chosen = newer[0] if newer else chosen  # none: an opfuse op the exporter expands
        return chosen
    if not EXPORT_MIN_OPSET <= int(opset) <= EXPORT_MAX_OPSET:
        raise InputError(f"cannot export at opset {opset}: opfuse writes opsets {EXPORT_MIN_OPSET} to "
                         f"{EXPORT_MAX_OPSET}")
    return int(opset)


def _value_info(v: Value) -> onnx.ValueInfoProto:
    if v.type is None:
        raise ModelError(f"value '{v.name}' has no type; infer shapes before exporting")
    return helper.make_tensor_value_info(v.name, onnx_elem_type(v.dtype, f"value '{v.name}'"), list(v.shape))


def export_model(graph: Graph, opset: int | None = None) -> onnx.ModelProto:
    """An ONNX model computing the same function as ``graph`` (see the module docstring)."""
    ex = export_graph(graph, opset)
    return ex.model(ex.ctx.nodes, ex.value_info)


@dataclass
class ExportedGraph:
    """One export before it becomes a model: the ONNX nodes in ``ctx.nodes``, and for every IR
    node the slice of ``ctx.nodes`` it became (``spans``), so a caller can regroup them (the
    fused model's local functions, ``onnx_fused``)."""

    graph: Graph
    ctx: ExportContext
    spans: dict[str, tuple[int, int]]  # IR node name -> [start, end) in ctx.nodes
    inputs: list[onnx.ValueInfoProto]
    outputs: list[onnx.ValueInfoProto]
    value_info: list[onnx.ValueInfoProto]

    def model(self, nodes: Sequence[onnx.NodeProto], value_info: Sequence[onnx.ValueInfoProto], *,
              functions: Sequence[onnx.FunctionProto] = (), function_domain: str = "") -> onnx.ModelProto:
        """The model of ``nodes``; ``functions`` are model-local functions of ``function_domain``."""
        g = helper.make_graph(nodes, self.graph.name, self.inputs, self.outputs,
                              initializer=self.ctx.initializers, value_info=value_info)
        opsets = [helper.make_opsetid("", self.ctx.opset)]
        ir_version = helper.find_min_ir_version_for(opsets)
        if functions:
            opsets.append(helper.make_opsetid(function_domain, 1))
            ir_version = max(ir_version, LOCAL_FUNCTIONS_IR_VERSION)
        model = helper.make_model(g, opset_imports=opsets, producer_name="opfuse",
                                  producer_version=__version__, functions=list(functions))
        model.ir_version = ir_version
        return model


def export_graph(graph: Graph, opset: int | None = None) -> ExportedGraph:
    """Every node of ``graph`` as ONNX nodes, with the graph's inputs, outputs and value infos."""
    target = export_opset(graph, opset)
    ctx = ExportContext(graph, target)
    chains = dequantize_chains(graph, target)
    folded = {id(n) for chain in chains.values() for n in chain.nodes[1:]}  # written by the chain's Cast
    const_outputs = {id(v) for v in graph.outputs if v.const is not None}
    for v in graph.constants:
        if v.uses and all(id(u) in folded for u, _ in v.uses) and id(v) not in const_outputs:
            continue  # a scale or zero point the DequantizeLinear holds in its own form
        if id(v) in const_outputs:
            # ONNX outputs are node outputs (or inputs): the constant's name goes to an Identity
            # of an initializer, so the nodes that read it still find it under its name.
            ctx.add("Identity", [ctx.const(v.name + "_value", v.const)], [v.name],
                    name=ctx.fresh(v.name + "_identity"))
        elif v.uses:
            assert v.const is not None  # graph.constants are the values with data
            ctx.initializers.append(array_to_tensor(v.const, v.name))
    spans: dict[str, tuple[int, int]] = {}
    for node in graph.nodes:
        if node.domain:
            raise UnsupportedOpError(node.op_type, node.name, target,
                                     detail=f"domain '{node.domain}' cannot be exported")
        start = len(ctx.nodes)
        if id(node) in chains:
            chains[id(node)].write(ctx)
        elif id(node) not in folded:
            EXPORTERS.get(node.op_type, _export_as_is)(ctx, node)
        spans[node.name] = (start, len(ctx.nodes))

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
    return ExportedGraph(graph, ctx, spans, [_value_info(v) for v in graph.inputs], outputs, value_info)


# A DequantizeLinear with one scale per element of an axis: opset 13's.
PER_AXIS_DEQUANTIZE_OPSET = 13


@dataclass
class DequantizeChain:
    """``Cast -> [Sub(zero point)] -> Mul(scale)`` over an integer constant, as the importer keeps a
    ``DequantizeLinear`` of a weight or a bias (``onnx_decompose.dequantize_linear``): written back as that
    ``DequantizeLinear``, so that an exported QDQ model imports as QDQ again (its integer weights then reach the
    integer kernels, ``rules/integer_ops``) instead of as a float constant."""

    nodes: tuple[Node, ...]       # the Cast, [the Sub,] the Mul
    scale: np.ndarray             # float32, a scalar or one per element of ``axis``
    zero_point: np.ndarray | None  # in the constant's type, shaped as ``scale``; None: no Sub (or int32's 0)
    axis: int

    def write(self, ctx: ExportContext) -> None:
        cast, last = self.nodes[0], self.nodes[-1]
        inputs = [cast.input(0).name, ctx.const(f"{last.name}_scale", self.scale)]
        if self.zero_point is not None:
            inputs.append(ctx.const(f"{last.name}_zero_point", self.zero_point))
        ctx.add("DequantizeLinear", inputs, [last.outputs[0].name], name=last.name,
                attrs={"axis": self.axis} if self.scale.ndim else None, origin=last)


def _only_reader(v: Value, graph_outputs: set[int]) -> bool:
    return len(v.uses) == 1 and id(v) not in graph_outputs


def dequantize_chains(graph: Graph, opset: int) -> dict[int, DequantizeChain]:
    """The kept dequantizations of integer constants in ``graph`` (``DequantizeChain``), by id of their Cast:
    each Mul that ``frontend.dequantized`` reads as a DequantizeLinear of a constant (int8, uint8 or int32; its
    zero point an integer of that type, per tensor or along one axis), where the DequantizeLinear computes
    exactly what the chain does: the Cast's and the Sub's results read by the chain alone, the result of the
    constant's shape, no zero point but 0 for int32, per axis from ``PER_AXIS_DEQUANTIZE_OPSET``."""
    outs = {id(v) for v in graph.outputs}
    chains: dict[int, DequantizeChain] = {}
    for mul in graph.nodes:
        if mul.op_type != "Mul":
            continue
        d = dequantized(mul.outputs[0], "")
        if isinstance(d, str) or d.q.const is None or d.q.dtype not in KEPT_DEQUANTIZED:
            continue
        if mul.outputs[0].shape != d.q.shape or not all(_only_reader(n.outputs[0], outs) for n in d.nodes[:-1]):
            continue
        if d.axis is not None and opset < PER_AXIS_DEQUANTIZE_OPSET:
            continue
        shape = (d.q.shape[d.axis],) if d.axis is not None else ()
        zero = None if d.zero is None else np.broadcast_to(d.zero.reshape(-1 if d.zero.size > 1 else ()), shape)
        if d.q.dtype == np.int32 and zero is not None:
            if np.any(zero != 0):
                continue  # DequantizeLinear of int32 has no zero point
            zero = None
        scale = np.broadcast_to(d.scale.reshape(-1 if d.scale.size > 1 else ()), shape).astype(np.float32)
        chains[id(d.nodes[0])] = DequantizeChain(d.nodes, np.array(scale),
                                                 None if zero is None else np.array(zero, d.q.dtype), d.axis or 0)
    return chains


def _export_as_is(ctx: ExportContext, node: Node) -> None:
    ctx.emit(node)


def save_model(graph: Graph, path: str | os.PathLike, opset: int | None = None) -> None:
    """Export ``graph`` and write it to ``path`` (weights beside it when they are very large)."""
    write_model(export_model(graph, opset), graph, path)


def write_model(model: onnx.ModelProto, graph: Graph, path: str | os.PathLike) -> None:
    """Write an exported ``model`` of ``graph`` to ``path``, its weights beside it when they are
    very large."""
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
