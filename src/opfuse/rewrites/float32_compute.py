"""float16, bfloat16 (and float8) ops computed in float32 between Casts, for the C backend.

The C backend keeps float16 and bfloat16 tensors 16 bits wide (``uint16_t`` in the arena and
the ABI; float8 8 bits) but has no arithmetic in them: every op reading or writing them, except ``Cast`` itself
and pure renaming views (``KEEPS_16_BITS``), is rewritten to compute in float32,

    y = op(x16, w16)   ->   y = Cast16(op(Cast32(x16), w32))

with one widening Cast per 16-bit value (shared by its readers; a constant is widened here,
exactly) and one rounding Cast per 16-bit output. This is onnxruntime's ``InsertCastTransformer``
(what its CPU provider does for the float16 ops it has no kernel for) and XLA's float
normalization.

Numerics: every op rounds its result to the 16-bit type, as the NumPy reference does for
float16 and as onnxruntime's float16 kernels do; fusion keeps that rounding (the Casts are
elementwise ops of the fused kernel, computed where they stand, never dropped), so a fused and an
unfused build give the same bits. The one exception changes no bit: an op that only selects,
moves, negates or rounds to integers (``EXACT_OPS``) gives a value of the narrow type when its
inputs are, so its readers take its float32 result and its Cast pair is left out. Inside one op
everything is float32: a reduction, Softmax, LayerNorm or GEMM accumulates in float32, as
onnxruntime does. Widening is exact and rounding is to nearest even (``codegen.half``).

The fusion rules then put the Casts into the kernels around them (a Cast is elementwise): a
GEMM's rounding Cast becomes its epilogue, a chain of elementwise ops loads float16 and stores
float16 in one loop. Between kernels tensors stay 16-bit (2 bytes per element in the cost model
and the arena) unless a kernel's anchor needs a float32 operand (a Conv or MatMul input), which
then is the widening Cast's output.

An op whose output type does not follow its inputs (its dtype comes from an attribute) is left as
it is; the C backend then refuses it naming the op (``codegen.program``).
"""
from __future__ import annotations

import numpy as np

from opfuse.errors import OpfuseError
from opfuse.ir.dtypes import (BFLOAT16, FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, FLOAT16,
                              FLOAT32, is_floating, is_narrow_float)
from opfuse.ir.graph import Graph, Node, TensorType, Value
from opfuse.ops.registry import get_spec, infer_node
from opfuse.rewrites.context import RewriteContext
from opfuse.rules.decisions import refuse

RULE = "float32_compute"

# Ops that move 16-bit values without reading them as numbers: a Cast converts them itself
# (``codegen.half``), a BitCast reads their bits as bits, the others rename a buffer (a view:
# no kernel).
KEEPS_16_BITS = frozenset({"Cast", "BitCast", "Identity", "Dropout", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})

# ONNX element type codes (TensorProto.DataType) of Cast's ``to``.
ONNX_CODE = {FLOAT16: 10, BFLOAT16: 16, FLOAT32: 1, FLOAT8E4M3FN: 17, FLOAT8E4M3FNUZ: 18, FLOAT8E5M2: 19,
             FLOAT8E5M2FNUZ: 20}

# Ops whose result, when every float input holds values of a narrow type exactly, is such a value
# too (they select, move, negate or round to integers): their rounding Cast changes nothing, so
# readers computing in float32 take their float32 result and skip the Cast pair (same bits,
# fewer conversions in the fused loop).
EXACT_OPS = frozenset({"Relu", "Neg", "Abs", "Max", "Min", "Clip", "Where", "Sign", "Floor", "Ceil", "Round",
                       "Transpose", "Concat", "Slice", "Gather", "Expand", "Tile", "Split", "DepthToSpace",
                       "SpaceToDepth", "MaxPool", "GlobalMaxPool", "ReduceMax", "ReduceMin"})


def needs_float32(node: Node) -> bool:
    """Whether ``node`` computes on float16/bfloat16 values (reads or writes them as numbers)."""
    if node.op_type in KEEPS_16_BITS:
        return False
    return any(v is not None and v.type is not None and is_narrow_float(v.dtype) for v in (*node.inputs, *node.outputs))


def _float32_types(node: Node) -> list[TensorType] | None:
    """The output types of ``node`` fed float32 for its 16-bit inputs, when every 16-bit output
    becomes float32 and the others keep their types; else None."""
    wide: list[Value | None] = []
    for v in node.inputs:
        if v is not None and v.type is not None and is_narrow_float(v.dtype):
            w = Value(v.name, TensorType(v.shape, FLOAT32), None if v.const is None else v.const.astype(FLOAT32))
            wide.append(w)
        else:
            wide.append(v)
    try:
        types = infer_node(Node(node.name, node.op_type, wide, node.outputs, node.attrs, node.domain))
    except OpfuseError:
        return None
    for v, t in zip(node.outputs, types, strict=True):
        want = TensorType(v.shape, FLOAT32) if is_narrow_float(v.dtype) else v.type
        if t != want:
            return None
    return types


def compute_in_float32(graph: Graph, rc: RewriteContext) -> bool:
    """Rewrite every op on narrow-float values to compute in float32 between Casts."""
    if rc.options.is_disabled(RULE):
        return False
    widened: dict[int, Value] = {}
    exact_in: dict[int, np.dtype] = {}  # float32 values that hold values of a narrow type exactly
    rounding: list[Node] = []
    done: list[str] = []
    for node in [n for n in graph.nodes if needs_float32(n)]:
        if _float32_types(node) is None:
            rc.log_refusal(RULE, [node.name], refuse(f"{node.op_type}'s output type does not follow its inputs' "
                                                     f"(fed float32, it does not give float32 where it gave 16 bits)"))
            continue
        for i, v in enumerate(node.inputs):
            if v is not None and is_narrow_float(v.dtype):
                graph.set_input(node, i, _widened(graph, v, widened, exact_in))
        exact = _exact_type(node, exact_in)
        for k, y in enumerate(node.outputs):
            if is_narrow_float(y.dtype):
                wide, cast = _round_output(graph, node, k)
                rounding.append(cast)
                if exact == np.dtype(y.dtype):  # rounding changes nothing: readers take the float32 result
                    widened[id(y)] = wide
                    exact_in[id(wide)] = exact
        done.append(node.name)
    if not done:
        return False
    for cast in rounding:  # a rounding Cast whose every reader took the float32 result
        if not cast.output.uses and cast.output not in graph.outputs:
            graph.remove_node(cast)
    graph.toposort()
    rc.log_applied(RULE, done, f"{len(done)} narrow-float op(s) computed in float32 between Casts")
    return True


def _exact_type(node: Node, exact_in: dict[int, np.dtype]) -> np.dtype | None:
    """The narrow type whose values ``node`` (rewritten to float32) gives exactly, when it selects,
    moves or negates its float inputs (``EXACT_OPS``) and each holds values of that type exactly."""
    if node.op_type not in EXACT_OPS:
        return None
    if node.op_type == "Clip":
        a = get_spec(node.op_type, node).attrs_of(node)
        if a.get("min") is not None or a.get("max") is not None:
            return None  # attribute bounds: a float32 bound need not be a value of the narrow type
    types = {exact_in.get(id(v)) for v in node.inputs if v is not None and is_floating(v.dtype)}
    return types.pop() if len(types) == 1 and None not in types else None


def _widened(graph: Graph, v: Value, widened: dict[int, Value], exact_in: dict[int, np.dtype]) -> Value:
    """The float32 copy of narrow ``v``: a constant converted here, else one Cast node."""
    if id(v) not in widened:
        if v.const is not None and v.producer is None:
            widened[id(v)] = graph.add_const(f"{v.name}_f32", v.const.astype(FLOAT32))
        else:
            cast = graph.add_node("Cast", [v], attrs={"to": ONNX_CODE[FLOAT32]}, name=f"{v.name}_to_f32",
                                  output_types=[TensorType(v.shape, FLOAT32)])
            widened[id(v)] = cast.output
        exact_in[id(widened[id(v)])] = np.dtype(v.dtype)
    return widened[id(v)]


def _round_output(graph: Graph, node: Node, k: int) -> tuple[Value, Node]:
    """Make ``node`` write output ``k`` in float32 and a Cast round it into the original value;
    returns the float32 value and the Cast (not saturating: the reference rounds as ``astype``)."""
    y = node.outputs[k]
    wide = graph.add_value(Value(graph.unique_name(f"{y.name}_f32"), TensorType(y.shape, FLOAT32)))
    wide.producer = node
    node.outputs[k] = wide
    y.producer = None
    name = graph.unique_name(f"{y.name}_to_{y.dtype.name}", for_node=True)
    cast = Node(name, "Cast", [wide], [y], {"to": ONNX_CODE[np.dtype(y.dtype)], "saturate": 0})
    graph.insert_node(cast, graph.nodes.index(node) + 1)
    return wide, cast
