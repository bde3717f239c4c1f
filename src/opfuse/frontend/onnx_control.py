"""Control flow (If, Loop, Scan) folded at import.

opfuse compiles one static graph, so control flow is resolved while the model is imported,
when everything that decides it is known:

* ``If`` whose condition is a constant (or folds to one from constants and static shapes) is
  replaced by the branch it takes;
* ``Loop`` whose trip count ``M`` is a constant and whose condition is absent or a constant --
  the one given, and the one the body computes, in every iteration -- is unrolled: one copy of
  the body per iteration, loop-carried values passed from each copy to the next, each scan
  output the per-iteration values stacked along a new axis 0 (``Unsqueeze`` + ``Concat``);
* ``Scan`` (static shapes, so its sequence length is known) is unrolled likewise: iteration
  ``t`` reads element ``t`` of each scan input along its ``scan_input_axes`` entry (from the end
  when its ``scan_input_directions`` entry is 1) with a ``Gather``, and each scan output stacks
  the iterations' values along its ``scan_output_axes`` entry (in reverse when its direction is
  1). Scan-8 (batch axis 0, scan axis 1, optional ``sequence_lens``) is the Scan-9 scan of each
  batch element, stacked along axis 0; ``sequence_lens`` must cover the whole axis.

Importing a subgraph (``import_subgraph``): its inputs are bound to the given values, its
initializers become constants, and its nodes are imported like the graph's own (canonicalized,
shape-inferred, folded, function ops inlined, nested control flow folded in turn), each value
and node under a fresh name ``<node>/<iteration or branch>/<name>`` (deterministic: the same
model gives the same names). A subgraph reads the values of every scope around it by name
(``ImportContext.scope``); the enclosing graph orders the node after the values it reads so
(``onnx_protos.outer_reads``).

The general case is refused naming the node and why: a condition or trip count computed at run
time, an endless loop, a loop of zero iterations with scan outputs (empty tensors), and
unrolling beyond ``MAX_UNROLLED_NODES`` nodes. A condition or trip count computed from scalar
graph inputs only (flags, counts: ``SPECIALISE_MAX_ELEMENTS``) is a
``ShapeInputError`` naming them: giving their values specialises the model to them, as for a
Reshape's shape (``opfuse.compile`` does so for each run's values). One computed from larger
inputs (activations) is data-dependent control flow, refused outright.
"""
from __future__ import annotations

from collections import ChainMap
from typing import Callable

import numpy as np
import onnx
import onnx.defs

from opfuse.errors import ModelError, ShapeError, ShapeInputError, UnsupportedOpError
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.frontend.onnx_opsets import DEFAULT_DOMAINS, SCAN_AXES_SINCE
from opfuse.frontend.onnx_protos import attribute_value, outer_reads, sparse_to_array, tensor_to_array
from opfuse.frontend.onnx_sequences import kind_of
from opfuse.ir.graph import Value
from opfuse.ops.common import graph_inputs_behind

# The most subgraph nodes one model may import: every If branch taken and every iteration of
# every unrolled Loop and Scan counts its body's nodes (nested ones included). Unrolling is how
# opfuse compiles loops, and planning time grows faster than linearly in the graph's size (an
# RNN cell scanned into 2000 nodes compiles in about 9 s of CPU, into 3200 in about 48 s, on the
# 2-core development machine), so a longer loop is refused instead (it wants a loop kernel).
MAX_UNROLLED_NODES = 2000

# A condition or trip count computed at run time from graph inputs of at most this many elements
# each (scalars: flags, counts) makes the model specialise to those inputs' values; one computed
# from larger inputs (activations) is data-dependent control flow, and refused.
SPECIALISE_MAX_ELEMENTS = 1

# How deep subgraphs may nest (If in a Loop body in a Scan body...).
MAX_NESTING = 16

# ``import_node(ctx, node, inputs, depth, opset)``: imports one node (``onnx_functions.canonicalize``).
NodeImporter = Callable[[ImportContext, OnnxNode, list, int, int], list]
ControlFlow = Callable[[ImportContext, OnnxNode, list, int, int, NodeImporter], list]


def _refuse(ctx: ImportContext, node: OnnxNode, detail: str) -> UnsupportedOpError:
    return UnsupportedOpError(node.op_type, node.name, ctx.opset, detail=detail + "; opfuse folds control flow at "
                              "import, where its conditions and trip counts must be known")


def _known(ctx: ImportContext, node: OnnxNode, v, what: str) -> np.ndarray:
    """The constant data of ``v`` (a condition or trip count): else why it cannot be folded."""
    if not isinstance(v, Value):
        raise ModelError(f"node '{node.name}' ({node.op_type}): {what} is {kind_of(v)}, a tensor is expected")
    if v.const is None:
        raise _run_time(ctx, node, v, f"{what} ('{v.name}')")
    if v.const.size != 1:
        raise ModelError(f"node '{node.name}' ({node.op_type}): {what} has {v.const.size} elements, one is expected")
    return v.const.reshape(-1)


def _run_time(ctx: ImportContext, node: OnnxNode, v: Value, what: str) -> UnsupportedOpError:
    """Why ``v``, computed at run time, cannot decide control flow (see the module docstring)."""
    inputs = graph_inputs_behind(v)
    large = [name for name in inputs if ctx.graph.values[name].size > SPECIALISE_MAX_ELEMENTS]
    detail = f"{what} is computed at run time"
    if large or not inputs:
        return _refuse(ctx, node, f"{detail} from the data of {large or 'its inputs'} (data-dependent control flow)")
    return ShapeInputError(node.op_type, node.name, ctx.opset, inputs=inputs,
                           detail=f"{detail}; opfuse folds control flow at import, where its conditions and trip "
                                  f"counts must be known")


# Subgraphs ------------------------------------------------------------------------------------

def _reserve_unrolled(ctx: ImportContext, node: OnnxNode, count: int) -> None:
    if ctx.subgraph_nodes + count > MAX_UNROLLED_NODES:
        raise _refuse(ctx, node, f"unrolling it needs more than MAX_UNROLLED_NODES = {MAX_UNROLLED_NODES} subgraph "
                                 f"nodes in the model")


def import_subgraph(ctx: ImportContext, caller: OnnxNode, body: onnx.GraphProto, inputs: list, prefix: str,
                    opset: int, depth: int, import_node: NodeImporter) -> list:
    """Import ``body`` in place with its inputs bound to ``inputs``; its output values.

    Nodes and inner values are named ``<prefix>/<name>``; ``opset`` is the opset of the graph
    the body belongs to.
    """
    if depth >= MAX_NESTING:
        raise ModelError(f"node '{caller.name}' ({caller.op_type}): subgraphs nest more than {MAX_NESTING} deep")
    if len(body.input) != len(inputs):
        raise ModelError(f"node '{caller.name}' ({caller.op_type}): its subgraph '{body.name}' takes "
                         f"{len(body.input)} input(s), {len(inputs)} are given")
    _reserve_unrolled(ctx, caller, len(body.node))
    ctx.subgraph_nodes += len(body.node)
    local: dict[str, object] = {vi.name: v for vi, v in zip(body.input, inputs, strict=True)}
    for t in body.initializer:
        local[t.name] = ctx.const(ctx.fresh_value(f"{prefix}/{t.name}"),
                                  tensor_to_array(t, None, f"initializer '{t.name}' of node '{caller.name}'"))
    for st in body.sparse_initializer:
        name = st.values.name
        local[name] = ctx.const(ctx.fresh_value(f"{prefix}/{name}"),
                                sparse_to_array(st, None, f"sparse initializer '{name}' of node '{caller.name}'"))
    names = _inner_names(ctx, caller, body, prefix, set(local))
    ctx.add_uses(names[i] for n in body.node for i in list(n.input) + outer_reads(n) if i in names)
    ctx.add_uses(names[o.name] for o in body.output if o.name in names)
    outer = ctx.scope
    scope = ChainMap(local, outer)
    ctx.scope = scope
    try:
        for index, n in enumerate(body.node):
            onnx_node = _body_node(ctx, caller, n, index, prefix, names, opset)
            values = []
            for i in n.input:
                if i and i not in scope:
                    raise ModelError(f"node '{onnx_node.name}' ({n.op_type}) in a subgraph of '{caller.name}' reads "
                                     f"'{i}', which nothing defines before it")
                values.append(scope[i] if i else None)
            out = import_node(ctx, onnx_node, values, depth + 1, opset)
            for o, v in zip(n.output, out, strict=False):
                if o:
                    local[o] = v
        results = []
        for o in body.output:
            if o.name not in scope:
                raise ModelError(f"node '{caller.name}' ({caller.op_type}): its subgraph '{body.name}' has output "
                                 f"'{o.name}', which nothing defines")
            results.append(scope[o.name])
    finally:
        ctx.scope = outer
    return results


def _inner_names(ctx: ImportContext, caller: OnnxNode, body: onnx.GraphProto, prefix: str,
                 taken: set[str]) -> dict[str, str]:
    """Each value a body node defines -> its fresh name in the graph."""
    names: dict[str, str] = {}
    for n in body.node:
        for o in n.output:
            if not o:
                continue
            if o in names or o in taken:
                raise ModelError(f"node '{caller.name}' ({caller.op_type}): its subgraph '{body.name}' defines "
                                 f"'{o}' twice")
            names[o] = ctx.fresh_value(f"{prefix}/{o}")
    return names


def _body_node(ctx: ImportContext, caller: OnnxNode, n: onnx.NodeProto, index: int, prefix: str,
               names: dict[str, str], opset: int) -> OnnxNode:
    """One subgraph node as an ``OnnxNode`` under fresh names (its op version read at ``opset``)."""
    name = ctx.fresh_node(f"{prefix}/{n.name or n.op_type.lower() + '_' + str(index)}")
    if n.domain not in DEFAULT_DOMAINS:
        raise UnsupportedOpError(n.op_type, name, opset, detail=f"domain '{n.domain}' is not supported (only the "
                                                                f"default ONNX domain)")
    try:
        version = onnx.defs.get_schema(n.op_type, opset, "").since_version
    except onnx.defs.SchemaError:
        raise UnsupportedOpError(n.op_type, name, opset, detail="not an ONNX op at this opset") from None
    attrs = {}
    for a in n.attribute:
        if a.name in attrs:
            raise ModelError(f"node '{name}' ({n.op_type}) has attribute '{a.name}' twice")
        attrs[a.name] = attribute_value(a, n, name, opset, None)
    proto = onnx.NodeProto()
    proto.CopyFrom(n)
    proto.ClearField("input")
    proto.input.extend(names.get(i, i) for i in n.input)
    proto.ClearField("output")
    proto.output.extend(names.get(o, "") for o in n.output)
    proto.name = name
    return OnnxNode(name, n.op_type, version, list(proto.input), list(proto.output), attrs, proto)


def _graph_attr(node: OnnxNode, key: str) -> onnx.GraphProto:
    g = node.attrs.get(key)
    if not isinstance(g, onnx.GraphProto):
        raise ModelError(f"node '{node.name}' ({node.op_type}) has no subgraph attribute '{key}'")
    return g


# Stacking per-iteration values -------------------------------------------------------------

def _stack(ctx: ImportContext, node: OnnxNode, values: list, axis: int, name: str) -> Value:
    """``values`` (tensors of one shape) stacked along a new ``axis``, as the value ``name``."""
    for v in values:
        if not isinstance(v, Value):
            raise UnsupportedOpError(node.op_type, node.name, ctx.opset,
                                     detail=f"a scan output is {kind_of(v)}; scan outputs must be tensors")
    rank = len(values[0].shape) + 1
    if not -rank <= axis < rank:
        raise ModelError(f"node '{node.name}' ({node.op_type}): scan output axis {axis} is out of range for rank "
                         f"{rank}")
    axis %= rank
    if len(values) == 1:
        return ctx.emit("Unsqueeze", values, {"axes": [axis]}, name=ctx.fresh_node(f"{node.name}/stack"),
                        outputs=[name])[0]
    parts = [ctx.emit("Unsqueeze", [v], {"axes": [axis]}, name=ctx.fresh_node(f"{node.name}/stack"),
                      outputs=[ctx.fresh_value(f"{name}_{k}")])[0] for k, v in enumerate(values)]
    return ctx.emit("Concat", parts, {"axis": axis}, name=ctx.fresh_node(f"{node.name}/stack"), outputs=[name])[0]


def _out_name(ctx: ImportContext, node: OnnxNode, index: int) -> str:
    name = node.outputs[index] if index < len(node.outputs) else ""
    return name or ctx.fresh_value(f"{node.name}_unused{index}")


# If --------------------------------------------------------------------------------------------

def _if(ctx: ImportContext, node: OnnxNode, inputs: list, depth: int, opset: int, import_node: NodeImporter) -> list:
    cond = inputs[0] if inputs else None
    if cond is None:
        raise ModelError(f"node '{node.name}' (If) has no condition input")
    taken = bool(_known(ctx, node, cond, "its condition")[0])
    key = "then_branch" if taken else "else_branch"
    results = import_subgraph(ctx, node, _graph_attr(node, key), [], f"{node.name}/{key.split('_')[0]}",
                              opset, depth, import_node)
    if len(results) != len(node.outputs):
        raise ModelError(f"node '{node.name}' (If): its {key} has {len(results)} output(s), the node "
                         f"{len(node.outputs)}")
    return results


# Loop ------------------------------------------------------------------------------------------

def _loop(ctx: ImportContext, node: OnnxNode, inputs: list, depth: int, opset: int,
          import_node: NodeImporter) -> list:
    body = _graph_attr(node, "body")
    inputs = inputs + [None] * (2 - len(inputs))
    trip_v, cond_v, states = inputs[0], inputs[1], list(inputs[2:])
    n_scan = len(body.output) - 1 - len(states)
    if len(body.input) != 2 + len(states) or n_scan < 0:
        raise ModelError(f"node '{node.name}' (Loop): its body has {len(body.input)} inputs and {len(body.output)} "
                         f"outputs for {len(states)} loop-carried value(s)")
    trip = None if trip_v is None else int(_known(ctx, node, trip_v, "its trip count M")[0])
    cond = True if cond_v is None else bool(_known(ctx, node, cond_v, "its condition")[0])
    if trip is None and cond_v is None:
        raise _refuse(ctx, node, "it has neither a trip count nor a condition (an endless loop)")
    if cond and trip is not None and cond_v is None:
        _reserve_unrolled(ctx, node, max(trip, 0) * len(body.node))
    scans: list[list] = [[] for _ in range(n_scan)]
    k = 0
    while cond and (trip is None or k < trip):
        prefix = f"{node.name}/{k}"
        iteration = ctx.const(ctx.fresh_value(f"{prefix}/iteration"), np.array(k, np.int64))
        cond_in = ctx.const(ctx.fresh_value(f"{prefix}/cond"), np.array(cond, np.bool_))
        outs = import_subgraph(ctx, node, body, [iteration, cond_in, *states], prefix, opset, depth, import_node)
        if cond_v is not None:
            cond = bool(_known(ctx, node, outs[0], f"the condition its body computes in iteration {k}")[0])
        states = outs[1:1 + len(states)]
        for j, v in enumerate(outs[1 + len(states):]):
            scans[j].append(v)
        k += 1
    if n_scan and k == 0:
        raise _refuse(ctx, node, "it runs zero iterations, so its scan outputs are empty tensors (not supported)")
    stacked = [_stack(ctx, node, vs, 0, _out_name(ctx, node, len(states) + j)) for j, vs in enumerate(scans)]
    return states + stacked


# Scan ------------------------------------------------------------------------------------------

def _scan(ctx: ImportContext, node: OnnxNode, inputs: list, depth: int, opset: int,
          import_node: NodeImporter) -> list:
    body = _graph_attr(node, "body")
    m = int(node.attrs.get("num_scan_inputs", 0))
    if node.version < SCAN_AXES_SINCE:
        return _scan8(ctx, node, inputs, body, m, depth, opset, import_node)
    n = len(inputs) - m
    k = len(body.output) - n
    if m <= 0 or n < 0 or k < 0:
        raise ModelError(f"node '{node.name}' (Scan): {len(inputs)} inputs, num_scan_inputs {m} and a body of "
                         f"{len(body.output)} outputs do not fit together")
    in_axes = _ints(node, "scan_input_axes", m, 0)
    in_dirs = _ints(node, "scan_input_directions", m, 0)
    out_axes = _ints(node, "scan_output_axes", k, 0)
    out_dirs = _ints(node, "scan_output_directions", k, 0)
    states, scanned = _scan_iterations(ctx, node, body, inputs[:n], inputs[n:], in_axes, in_dirs, node.name,
                                       depth, opset, import_node)
    outs = [_stack(ctx, node, vs[::-1] if d else vs, a, _out_name(ctx, node, n + j))
            for j, (vs, a, d) in enumerate(zip(scanned, out_axes, out_dirs, strict=True))]
    return states + outs


def _ints(node: OnnxNode, key: str, count: int, default: int) -> list[int]:
    values = node.attrs.get(key)
    if values is None:
        return [default] * count
    values = [int(v) for v in values]
    if len(values) != count:
        raise ModelError(f"node '{node.name}' ({node.op_type}): '{key}' has {len(values)} entries, {count} are "
                         f"expected")
    return values


def _scan_iterations(ctx: ImportContext, node: OnnxNode, body: onnx.GraphProto, states: list, xs: list,
                     axes: list[int], directions: list[int], prefix: str, depth: int, opset: int,
                     import_node: NodeImporter) -> tuple[list, list[list]]:
    """The final states and each scan output's per-iteration values (in iteration order)."""
    length = None
    norm_axes = []
    for j, (x, axis) in enumerate(zip(xs, axes, strict=True)):
        if not isinstance(x, Value):
            raise ModelError(f"node '{node.name}' (Scan): scan input {j} is "
                             f"{'absent' if x is None else kind_of(x)}, a tensor is expected")
        rank = len(x.shape)
        if not -rank <= axis < rank:
            raise ModelError(f"node '{node.name}' (Scan): scan input axis {axis} is out of range for rank {rank}")
        norm_axes.append(axis % rank)
        if length is not None and x.shape[axis] != length:
            raise ShapeError(f"node '{node.name}' (Scan): scan inputs have sequence lengths {length} and "
                             f"{x.shape[axis]}")
        length = x.shape[axis]
    if not length:
        raise _refuse(ctx, node, "its sequence length is 0, so its scan outputs are empty tensors (not supported)")
    _reserve_unrolled(ctx, node, length * len(body.node))
    n_states = len(states)
    scanned: list[list] = [[] for _ in range(len(body.output) - n_states)]
    for t in range(length):
        step = f"{prefix}/{t}"
        elements = []
        for j, (x, axis, d) in enumerate(zip(xs, norm_axes, directions, strict=True)):
            index = ctx.const(ctx.fresh_value(f"{step}/index{j}"), np.array(length - 1 - t if d else t, np.int64))
            elements.append(ctx.emit("Gather", [x, index], {"axis": axis}, name=ctx.fresh_node(f"{step}/Gather"),
                                     outputs=[ctx.fresh_value(f"{step}/{body.input[n_states + j].name}")])[0])
        outs = import_subgraph(ctx, node, body, [*states, *elements], step, opset, depth, import_node)
        states = outs[:n_states]
        for j, v in enumerate(outs[n_states:]):
            scanned[j].append(v)
    return states, scanned


def _scan8(ctx: ImportContext, node: OnnxNode, inputs: list, body: onnx.GraphProto, m: int, depth: int, opset: int,
           import_node: NodeImporter) -> list:
    """Scan-8: axis 0 of every input is the batch, axis 1 of the scan inputs the sequence."""
    lens_v, rest = (inputs[0] if inputs else None), inputs[1:]
    n = len(rest) - m
    k = len(body.output) - n
    if m <= 0 or n < 0 or k < 0:
        raise ModelError(f"node '{node.name}' (Scan): {len(inputs)} inputs, num_scan_inputs {m} and a body of "
                         f"{len(body.output)} outputs do not fit together")
    directions = _ints(node, "directions", m, 0)
    tensors = [v for v in rest if isinstance(v, Value)]
    if len(tensors) != len(rest) or not tensors:
        raise ModelError(f"node '{node.name}' (Scan): its states and scan inputs must be tensors")
    batch = tensors[0].shape[0] if tensors[0].shape else 0
    if any(not v.shape or v.shape[0] != batch for v in tensors):
        raise ShapeError(f"node '{node.name}' (Scan): the inputs do not share batch axis 0")
    if not batch:
        raise _refuse(ctx, node, "its batch is empty")
    if lens_v is not None:
        lens = _known_all(ctx, node, lens_v)
        full = rest[n].shape[1] if len(rest[n].shape) > 1 else None
        if any(int(v) != full for v in lens):
            raise _refuse(ctx, node, f"its sequence_lens {[int(v) for v in lens]} do not all cover the scan axis "
                                     f"({full}); padded batches are not supported")
    per_batch: list[list] = []
    for b in range(batch):
        step = f"{node.name}/batch{b}"
        index = ctx.const(ctx.fresh_value(f"{step}/index"), np.array(b, np.int64))
        row = [ctx.emit("Gather", [v, index], {"axis": 0}, name=ctx.fresh_node(f"{step}/Gather"),
                        outputs=[ctx.fresh_value(f"{step}/input{j}")])[0] for j, v in enumerate(rest)]
        states, scanned = _scan_iterations(ctx, node, body, row[:n], row[n:], [0] * m, directions, step, depth,
                                           opset, import_node)
        per_batch.append(states + [_stack(ctx, node, vs, 0, ctx.fresh_value(f"{step}/output{j}"))
                                   for j, vs in enumerate(scanned)])
    return [_stack(ctx, node, [row[j] for row in per_batch], 0, _out_name(ctx, node, j)) for j in range(n + k)]


def _known_all(ctx: ImportContext, node: OnnxNode, v) -> np.ndarray:
    if not isinstance(v, Value):
        raise ModelError(f"node '{node.name}' (Scan): its sequence_lens are {kind_of(v)}, a tensor is expected")
    if v.const is None:
        raise _run_time(ctx, node, v, f"its sequence_lens ('{v.name}')")
    return v.const.reshape(-1)


CONTROL_FLOW: dict[str, ControlFlow] = {"If": _if, "Loop": _loop, "Scan": _scan}
