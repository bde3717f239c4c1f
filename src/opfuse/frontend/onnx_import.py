"""ONNX -> opfuse ``Graph``.

The import is one pass over a validated, topologically sorted node list:

1. check the model (``onnx_files`` parsed it): a default-domain opset from 7 to the newest the
   installed onnx defines, every node a supported op of that opset (or an op ONNX defines as a
   function, whose body is inlined: ``onnx_functions``), subgraphs only on If, Loop and Scan,
   every value defined once and only read after it is defined somewhere (a node with subgraphs
   also reads the outer values they read), no cycle (nodes need not be sorted in the file);
2. constants: initializers (external data read safely from the model folder) and Constant
   nodes become ``Value.const``; graph inputs get concrete shapes from the user's bindings;
3. walk the nodes in topological order; each is rewritten to the canonical IR form
   (``onnx_canonical``), its output types inferred, and -- when all its inputs are constants and
   its outputs small, or when it is a ``Shape`` of a statically shaped value -- evaluated with
   the op's reference implementation and replaced by constants (``ImportContext.emit``, in
   ``onnx_import_context``). One walk therefore resolves PyTorch's
   ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains into a constant shape. A
   DequantizeLinear of a constant integer tensor (a QDQ model's int8 weight, int32 bias) is the
   exception: it stays ``Cast -> Sub -> Mul`` over the integer constant, so the pipeline's integer
   rules (``rules/integer_ops``) see the 8-bit weights; the pipeline, or the unfused build, folds
   the chains they leave as this walk would have (``rewrites/dequantized_constants``). Control
   flow whose conditions and trip counts are known by then is folded into the branch taken or
   the unrolled iterations (``onnx_control``), and sequences and optionals inside the graph into
   the tensors they hold (``onnx_sequences``);
4. graph outputs keep their ONNX names (each must be a tensor); dead nodes and unused constants
   are dropped.

Every problem with the file is an ``OpfuseError`` with a one-line message, never a protobuf
or onnx traceback.
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.defs

from opfuse.errors import InputError, ModelError, UnsupportedOpError
from opfuse.frontend.input_shapes import Dim, bind_input_shapes, symbolic_dim
from opfuse.frontend.onnx_files import read_model
from opfuse.frontend.onnx_control import CONTROL_FLOW
from opfuse.frontend.onnx_functions import canonicalize, has_function, is_importable
from opfuse.frontend.onnx_import_context import ImportContext, OnnxNode
from opfuse.frontend.onnx_opsets import DEFAULT_DOMAINS, MAX_OPSET, MIN_OPSET, REVIEWED_OPSET
from opfuse.frontend.onnx_preview import expand_preview_ops
from opfuse.frontend.onnx_qoperator import MS_CANONICALIZERS as MS_OPS, MS_DOMAIN, MS_VERSION, is_ms_op
from opfuse.frontend.onnx_protos import (attribute_value, numpy_dtype, outer_reads, sparse_to_array,
                                         tensor_to_array)
from opfuse.frontend.onnx_sequences import NON_TENSORS, kind_of
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.limits import check_tensor_size


# The model's opset ------------------------------------------------------------------------------

def default_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain, checked to be in the supported range."""
    versions = [int(o.version) for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise ModelError("the model imports no opset of the default ONNX domain (ai.onnx)")
    opset = max(versions)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        hint = "convert it with onnx.version_converter" if opset < MIN_OPSET else \
            f"the installed onnx {onnx.__version__} defines opsets up to {MAX_OPSET}"
        raise ModelError(f"the model uses opset {opset} of the default ONNX domain (ai.onnx); opfuse "
                         f"imports opsets {MIN_OPSET} to {MAX_OPSET} ({hint})")
    return opset


# The ONNX graph as checked plain records ------------------------------------------------------

def _node_names(nodes) -> list[str]:
    """Unique node names: ONNX names kept, missing or repeated ones made ``<name or op>_<k>``."""
    explicit = {n.name for n in nodes if n.name}
    used: set[str] = set()
    counters: dict[str, int] = {}
    names = []
    for n in nodes:
        name = n.name
        if not name or name in used:
            base = name or n.op_type.lower()
            k = counters.get(base, 0)
            while f"{base}_{k}" in explicit or f"{base}_{k}" in used:
                k += 1
            counters[base] = k + 1
            name = f"{base}_{k}"
        used.add(name)
        names.append(name)
    return names


# A schema's attribute type -> the AttributeProto type a node must give it (the same names).
_ATTRIBUTE_TYPES = {getattr(onnx.defs.OpSchema.AttrType, k): v for k, v in onnx.AttributeProto.AttributeType.items()
                    if hasattr(onnx.defs.OpSchema.AttrType, k)}


def _check_attributes(n: onnx.NodeProto, name: str, schema: onnx.defs.OpSchema) -> None:
    """The ONNX checker's rules for a node's attributes, which onnxruntime enforces too: each attribute the
    schema declares has the declared type (a LeakyRelu ``alpha`` written as a string or an int is refused,
    as they are), and every required one is there (a Cast without ``to``). Attributes the schema does not
    declare are the op spec's to refuse (``OpSpec.attrs_of``)."""
    op = f"{n.op_type}-{schema.since_version}"
    for a in n.attribute:
        declared = schema.attributes.get(a.name)
        expected = None if declared is None else _ATTRIBUTE_TYPES.get(declared.type)
        if expected is not None and a.type != expected:
            given, kind = (onnx.AttributeProto.AttributeType.Name(t) for t in (a.type, expected))
            raise ModelError(f"attribute '{a.name}' of node '{name}' ({n.op_type}) is of type {given}; "
                             f"{op} takes {kind}")
    present = {a.name for a in n.attribute}
    missing = sorted(k for k, declared in schema.attributes.items() if declared.required and k not in present)
    if missing:
        raise ModelError(f"node '{name}' ({n.op_type}) lacks the attribute(s) {op} requires: {', '.join(missing)}")


def _check_ops(graph: onnx.GraphProto, names: list[str], opset: int) -> list[int]:
    """The op version of every node; ``UnsupportedOpError`` for the first op opfuse cannot import."""
    versions: list[int] = []
    problems: list[tuple[str, str]] = []
    for n, name in zip(graph.node, names, strict=True):
        if n.domain == MS_DOMAIN and is_ms_op(n.op_type):  # onnxruntime's QOperator ops (onnx_qoperator)
            versions.append(MS_VERSION)
            continue
        if n.domain == MS_DOMAIN:
            raise UnsupportedOpError(n.op_type, name, opset, detail=f"not one of the com.microsoft ops opfuse imports "
                                                                    f"({', '.join(sorted(MS_OPS))})")
        if n.domain not in DEFAULT_DOMAINS:
            raise UnsupportedOpError(n.op_type, name, opset,
                                     detail=f"domain '{n.domain}' is not supported (only the default "
                                            f"ONNX domain and onnxruntime's com.microsoft QLinear ops)")
        for a in n.attribute:
            inlined = not is_importable(n.op_type) and has_function(n.op_type, opset)  # its body reads them
            if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) and n.op_type not in CONTROL_FLOW \
                    and not inlined:
                raise UnsupportedOpError(n.op_type, name, opset,
                                         detail=f"attribute '{a.name}' is a subgraph; control flow is supported "
                                                f"on If, Loop and Scan only")
        version = None
        if is_importable(n.op_type) or has_function(n.op_type, opset):
            try:
                schema = onnx.defs.get_schema(n.op_type, opset, "")
                if not schema.deprecated:
                    version = schema.since_version
            except onnx.defs.SchemaError:
                pass
            if version is not None and version > REVIEWED_OPSET:
                raise UnsupportedOpError(n.op_type, name, opset,
                                         detail=f"{n.op_type}-{version} is newer than the op versions opfuse "
                                                f"was checked against (opset {REVIEWED_OPSET} and older)")
            if version is not None:
                _check_attributes(n, name, schema)
        if version is None:
            problems.append((n.op_type, name))
        else:
            versions.append(version)
    if problems:
        op, name = problems[0]
        others = sorted({p[0] for p in problems} - {op})
        known = is_importable(op)
        detail = "not an ONNX op at this opset" if known else "not an op opfuse imports"
        if others:
            detail += f"; also unsupported: {', '.join(others)}"
        raise UnsupportedOpError(op, name, opset, detail=detail)
    return versions


def _declared_dims(vi: onnx.ValueInfoProto) -> tuple[list[Dim] | None, np.dtype]:
    t = vi.type
    if not t.HasField("tensor_type"):
        raise ModelError(f"graph input '{vi.name}' is not a tensor (sequences, maps and optionals "
                         f"are not supported)")
    dtype = numpy_dtype(t.tensor_type.elem_type, f"graph input '{vi.name}'")
    if not t.tensor_type.HasField("shape"):
        return None, dtype
    dims: list[Dim] = []
    for d in t.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        else:
            dims.append(symbolic_dim(d.dim_param))
    return dims, dtype


def declared_inputs(model: onnx.ModelProto) -> dict[str, list[Dim] | None]:
    """Each graph input (initializers listed as inputs excepted) -> its declared dims (``None`` for
    an unknown rank): what ``--input-shape`` or the arrays of a run must bind."""
    g = model.graph
    consts = {t.name for t in g.initializer} | {st.values.name for st in g.sparse_initializer}
    return {vi.name: _declared_dims(vi)[0] for vi in g.input if vi.name not in consts}


# The importer ----------------------------------------------------------------------------------

def import_model(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]] | None = None,
                 base_dir: str | None = None, input_values: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Import an ONNX model into a verified, shape-inferred, canonical ``Graph``.

    ``input_shapes`` binds graph inputs whose dims are symbolic or unknown; ``base_dir`` is the
    folder external data is read from (only files inside it are read). ``input_values`` makes
    the graph inputs it names constants with those values (checked against their declared
    dtype and shape): the graph is specialised to them and no longer takes them as inputs. It is
    how an input that decides a shape (``ShapeInputError.inputs``) is bound.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"import_model expects an onnx.ModelProto, got {type(model).__name__}")
    if not model.HasField("graph"):
        raise ModelError("the ONNX model has no graph")
    opset = default_opset(model)
    model = expand_preview_ops(model)  # FlexAttention (ai.onnx.preview) as default-domain ops (onnx_preview)
    g = model.graph
    node_names = _node_names(g.node)
    versions = _check_ops(g, node_names, opset)

    graph = Graph(g.name or "graph")
    graph.opset = opset
    _add_constants(graph, g, base_dir)
    _add_inputs(graph, g, dict(input_shapes or {}), dict(input_values or {}))
    nodes = _onnx_nodes(g, node_names, versions, opset, base_dir)
    ctx, env = _walk(graph, opset, nodes, [o.name for o in g.output])
    graph.outputs = _graph_outputs(ctx, env, [o.name for o in g.output])
    _remove_dead_nodes(graph)
    graph.remove_unused_values()
    graph.verify()
    return graph


def _add_constants(graph: Graph, g: onnx.GraphProto, base_dir: str | None) -> None:
    """Initializers (dense and sparse) become constant values."""
    for t in g.initializer:
        _define(graph, t.name, "initializer")
        graph.add_const(t.name, tensor_to_array(t, base_dir, f"initializer '{t.name}'"), unique=False)
    for st in g.sparse_initializer:
        name = st.values.name
        _define(graph, name, "sparse initializer")
        graph.add_const(name, sparse_to_array(st, base_dir, f"sparse initializer '{name}'"), unique=False)


def _add_inputs(graph: Graph, g: onnx.GraphProto, input_shapes: Mapping[str, Sequence[int]],
                input_values: Mapping[str, np.ndarray]) -> None:
    """Graph inputs with concrete shapes (old models also list initializers as inputs: those stay
    constants); those in ``input_values`` become constants."""
    declared: dict[str, list[Dim] | None] = {}
    dtypes: dict[str, np.dtype] = {}
    for vi in g.input:
        if vi.name in graph.values and graph.values[vi.name].is_const:
            continue
        if not vi.name:
            raise ModelError("a graph input has an empty name")
        if vi.name in declared:
            raise ModelError(f"graph input '{vi.name}' is declared twice")
        declared[vi.name], dtypes[vi.name] = _declared_dims(vi)
    unknown = sorted(set(input_values) - set(declared))
    if unknown:
        raise InputError(f"values given for unknown input(s) {unknown}; the model's inputs are {list(declared)}")
    values = {name: np.asarray(a) for name, a in input_values.items()}
    given = {**{name: a.shape for name, a in values.items()}, **input_shapes}
    for name, shape in bind_input_shapes(declared, given).items():
        check_tensor_size(shape, dtypes[name], f"graph input '{name}'")
        if name not in values:
            graph.add_input(name, shape, dtypes[name])
            continue
        a = values[name]
        if a.dtype != dtypes[name] or a.shape != shape:
            raise InputError(f"the value given for input '{name}' is {a.dtype}{list(a.shape)}, the model's input "
                             f"is {dtypes[name]}{list(shape)}")
        graph.add_const(name, a, unique=False)


def _walk(graph: Graph, opset: int, nodes: list[OnnxNode], output_names: list[str]):
    """Import every node in topological order; returns the context and the map from ONNX value
    names to the values that now carry them."""
    order = _topological_order(graph, nodes)
    use_counts: dict[str, int] = {}
    for name in [i for n in nodes for i in n.inputs + _outer_reads(n) if i] + output_names:
        use_counts[name] = use_counts.get(name, 0) + 1
    reserved_values = set(graph.values) | {o for n in nodes for o in n.outputs if o}
    ctx = ImportContext(graph, opset, reserved_values, {n.name for n in nodes}, use_counts)
    env: dict[str, Any] = dict(graph.values)  # Values, or sequences and optionals (onnx_sequences)
    ctx.scope = env  # what subgraphs read from the graph
    for n in order:
        inputs = [env[i] if i else None for i in n.inputs]
        values = canonicalize(ctx, n, inputs)
        for name, v in zip(n.outputs, values, strict=False):
            if name and v is not None:
                env[name] = v
    return ctx, env


def _outer_reads(n: OnnxNode) -> list[str]:
    return outer_reads(n.proto) if n.proto is not None else []


def _define(graph: Graph, name: str, kind: str) -> None:
    if not name:
        raise ModelError(f"an {kind} has an empty name")
    if name in graph.values:
        raise ModelError(f"value '{name}' is defined twice ({kind})")


def _onnx_nodes(g: onnx.GraphProto, names: list[str], versions: list[int], opset: int,
                base_dir: str | None) -> list[OnnxNode]:
    nodes = []
    for n, name, version in zip(g.node, names, versions, strict=True):
        attrs = {}
        for a in n.attribute:
            if a.name in attrs:
                raise ModelError(f"node '{name}' ({n.op_type}) has attribute '{a.name}' twice")
            attrs[a.name] = attribute_value(a, n, name, opset, base_dir)
        nodes.append(OnnxNode(name, n.op_type, version, list(n.input), list(n.output), attrs, n))
    return nodes


def _topological_order(graph: Graph, nodes: list[OnnxNode]) -> list[OnnxNode]:
    """The nodes in a topological order; checks single definitions, defined reads and acyclicity.

    The order is found on a skeleton ``Graph`` (types unknown) by ``Graph.toposort``, which
    keeps the file order where it is legal and raises ``ModelError`` on a cycle.
    """
    skeleton = Graph(graph.name)
    for name in graph.values:
        skeleton.add_value(Value(name))
    producers: dict[str, str] = {}
    for n in nodes:
        for o in n.outputs:
            if not o:
                continue
            if o in graph.values:
                raise ModelError(f"value '{o}' is defined twice (output of node '{n.name}' and a graph "
                                 f"input or initializer)")
            if o in producers:
                raise ModelError(f"value '{o}' is defined twice (outputs of nodes '{producers[o]}' and "
                                 f"'{n.name}')")
            producers[o] = n.name
            skeleton.add_value(Value(o))
    record: dict[int, OnnxNode] = {}
    for n in nodes:
        reads = n.inputs + _outer_reads(n)  # a node runs after the values its subgraphs read
        for i in reads:
            if i and i not in skeleton.values:
                raise ModelError(f"node '{n.name}' ({n.op_type}) reads '{i}', which no node, graph input "
                                 f"or initializer defines")
        outs = [skeleton.values[o] if o else Value("") for o in n.outputs]
        node = Node(n.name, n.op_type, [skeleton.values[i] if i else None for i in reads],
                    [v for v in outs if v.name])
        skeleton.insert_node(node)
        record[id(node)] = n
    skeleton.toposort()
    return [record[id(node)] for node in skeleton.nodes]


def _graph_outputs(ctx: ImportContext, env: dict[str, Any], names: list[str]) -> list[Value]:
    """The output values, each carrying its ONNX output name.

    A removed Identity/Dropout leaves its output name mapped to its input value; that value is
    renamed to the output name, or -- when its own name must stay (a graph input, or the value of
    another output) -- an ``Identity`` is kept to carry the name.
    """
    graph = ctx.graph
    input_ids = {id(v) for v in graph.inputs}
    named_elsewhere = set(names)
    claimed: set[int] = set()
    outputs = []
    for name in names:
        v = env.get(name)
        if v is None:
            raise ModelError(f"graph output '{name}' is not produced by any node, input or initializer")
        if isinstance(v, NON_TENSORS):
            raise ModelError(f"graph output '{name}' is {kind_of(v)}, not a tensor: opfuse compiles graphs whose "
                             f"inputs and outputs are tensors (sequences and optionals inside the graph are folded "
                             f"at import)")
        if v.name != name:
            if id(v) in input_ids or id(v) in claimed or v.name in named_elsewhere:
                v = ctx.emit("Identity", [v], {}, name=ctx.fresh_node(name + "_identity"), outputs=[name])[0]
            else:
                _rename(graph, v, name)
        claimed.add(id(v))
        outputs.append(v)
    return outputs


def _rename(graph: Graph, v: Value, name: str) -> None:
    if name in graph.values:
        raise ModelError(f"cannot name graph output '{name}': the name is taken")
    del graph.values[v.name]
    v.name = name
    graph.values[name] = v


def _remove_dead_nodes(graph: Graph) -> None:
    """Drop nodes none of whose outputs reach a graph output (walking backwards)."""
    outputs = {id(v) for v in graph.outputs}
    for node in reversed(list(graph.nodes)):
        if all(not v.uses and id(v) not in outputs for v in node.outputs):
            graph.remove_node(node)


def load_model(path: str | os.PathLike, input_shapes: Mapping[str, Sequence[int]] | None = None,
               input_values: Mapping[str, np.ndarray] | None = None) -> Graph:
    """Read and import an ONNX file; external data is read only from inside the file's folder."""
    model = read_model(path)
    return import_model(model, input_shapes, base_dir=os.path.dirname(os.path.abspath(os.fspath(path))),
                        input_values=input_values)
