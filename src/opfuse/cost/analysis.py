"""What a fused group does, independent of the target: FLOPs, boundary bytes, recomputation,
on-chip buffers and register streams.

Execution model of a fused group (the one a TVM-style schedule gives, and the one the C
backend is expected to follow; fitted correction factors absorb the difference):

* **Boundary tensors** are the only main-memory traffic: the group's inputs produced
  outside it (graph inputs and weights included) are read once, its outputs used outside
  (or graph outputs) are written once. Internal values never touch main memory.
* **Inlined producers.** A node of category elementwise/broadcast/injective whose outputs
  are all internal is *inlined* into its consumers, i.e. recomputed wherever they read
  it. Its execution count is

      exec(p) = max_{streamed uses c} exec(c) + sum_{other uses c} exec(c) * reads(c, v) / |v|

  where a *streamed* use is a one-to-one read of the same number of elements (a loop
  fused element by element shares the value in a register), and ``reads(c, v)`` is how
  many elements of ``v`` one run of ``c`` reads (below). ``exec > 1`` is **duplicated
  computation**: ``(exec(p) - 1) * FLOPs(p)`` extra.
* **Materialised stages.** Every other node (reductions, Conv/MatMul, ...) runs once.
  Its internal output is *streamed* into its consumers when they all read it one-to-one
  and run once (the out-elementwise-fusable + epilogue case); otherwise it is *buffered*
  whole on chip. The group's **working set** is the sum of its buffered values; when it
  exceeds the on-chip capacity the group spills (see ``opfuse.cost.model``).
* **Scalar prologues.** An inlined producer read by a reduction over fewer than
  ``VECTORISED_REDUCTION_MIN_RUN`` elements per output or by a ``SCALAR_WINDOW_OPS`` pooling
  (directly or through other such producers) runs in that reduction's scalar loop: its FLOPs
  are ``scalar_flops`` too, which the cost model prices at the scalar rate.
* **Epilogues of a compute-bound anchor.** An elementwise op after a Conv/MatMul of its group that
  ``EPILOGUE_STREAM_RATIO`` lists adds, on top of its FLOPs at peak, up to that ratio times its own
  stream (``2 x |out| bytes``) of arithmetic (``epilogue_flops``, ``epilogue_stream_bytes``; the cost
  model prices the larger of the two where the anchor alone is compute-bound: ``opfuse.cost.model``),
  where the anchor's reduction is at most ``EPILOGUE_EXPOSED_MAX_DEPTH`` multiply-adds per output element.
* **The same ops without an anchor.** In a group with no anchor (a standalone elementwise kernel, a chain) such
  an op's arithmetic is priced alike, ``arithmetic_flops`` and ``arithmetic_stream_bytes`` (the cost model takes
  the larger of the two as compute time, which overlaps the kernel's own stream): so the unfused side of an
  epilogue's decision carries the same measured arithmetic as the fused side.
* **Register streams.** Streamed and inlined internal values each occupy one vector
  register while live (from producer to last consumer in group order); the most live at
  once is the group's register pressure.

``reads(c, v)`` per run of consumer ``c`` (element counts):

* elementwise/broadcast, and injective ops that replicate (one-to-many): ``|out(c)|``;
* other injective ops (reshape, transpose, slice, concat, split): ``min(|out(c)|, |v|)``;
* a Conv's data input: ``max(|v|, N * C * kernel size * output positions)``, the im2col matrix
  (packed, or the window rows, once per tile: a dequantizing prologue runs that often);
* everything else: ``max(|v|, FLOPs(c) / FLOPS_PER_READ)``, with two FLOPs per read for
  multiply-accumulate ops (Conv, MatMul: each read feeds one MAC) and one otherwise
  (pooling reads ``k*k`` elements per output, a reduction reads each element once).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from opfuse.ir.dtypes import BFLOAT16, FLOAT16, FLOAT32, is_narrow_float
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ops.elementwise import epilogue_stream_ratio
from opfuse.ops.registry import Category, Mapping, OpSpec, get_spec, is_supported
from opfuse.rules.aliasing import aliasable_inputs, is_view

FLOPS_PER_READ = {Category.OUT_ELEMWISE_FUSABLE: 2.0}
DEFAULT_FLOPS_PER_READ = 1.0
# A reduction reads each output's elements in one loop with 16 partial results (vectorised) only
# from this many elements per output on; below, the loop is scalar, and so is every elementwise
# op of its prologue (``codegen/loops.lane_reduce``). Such prologue ops run at the scalar rate:
# a Relu fused into mobilenet's 3 x 3 global average pool took 3x the pool and the Relu unfused.
VECTORISED_REDUCTION_MIN_RUN = 32
# Window poolings whose window loop is scalar whatever its size, prologue included
# (``codegen/pool.py``; MaxPool is not here: a Relu before it is applied once per output, after the max).
SCALAR_WINDOW_OPS = frozenset({"AveragePool"})
WINDOW_OPS = frozenset({"AveragePool", "MaxPool"})  # their run is the window, not |input| / |output|

# Narrow-float Casts (float16, bfloat16, float8: ``codegen/half.py``) are no free renames: each element
# is converted by integer code. Their price, in operations per element (the helpers' integer and
# select operations, counted from the C), is counted with the group's float32 FLOPs. float16 <-> float32
# runs on F16C (one vector instruction per 8 elements, ``NARROW_CAST_HW_OPS``) in a group without an
# anchor (a Cast kernel, or a fused pointwise loop: ``codegen/pointwise.py:emit_f16c_blocks``); inside
# an anchor's epilogue or operand loads, and for every other type, the portable helpers run; in an
# anchor's group they are priced at the scalar rate (``GroupAnalysis.scalar_flops``): its epilogue loops
# are short (a Winograd or direct-convolution tile row, at most 56 elements on a 56x56 output) and ran
# mostly in gcc's scalar remainder (perf: the helpers' scalar instructions were the hot ones). Measured
# (Conv-Relu-Conv-Add-Relu, 32x56x56, 1 thread, kernel timers): the second Conv with its float16
# epilogue fused 2.5x the same ops unfused, with its bfloat16 one 1.35x.
NARROW_CAST_OPS = {"widen_float16": 12, "round_float16": 22, "widen_bfloat16": 1, "round_bfloat16": 6,
                   "widen_float8": 1, "round_float8": 30}
NARROW_CAST_ROUND_FROM_OTHER = 8  # a source other than float32 first goes to float32 rounded to odd
NARROW_CAST_HW_OPS = 1
# The deepest anchor reduction (multiply-adds per output element: a Conv's C/group x kernel size, a MatMul's K) whose
# epilogue is priced by ``EPILOGUE_STREAM_RATIO``. Past it the epilogue partly hides in the anchor's long K loop and
# fusing still paid: bert_layer's MatMul (K = 768) + Add + Gelu fused against MatMul | Add + Gelu, 1 thread, kernel
# CPU time, 200 interleaved runs, four times at load 5-7: 0.98-0.99 (129 against 150 us for the Add and Gelu). Conv
# 1x1 (K -> 64 at 200x152) + Gelu / Tanh, fused against unfused: K = 32 1.00-1.05, K = 128 1.02 / 1.03, K = 512
# 1.01 / 1.00 (one run each, 21 rounds, load 5).
EPILOGUE_EXPOSED_MAX_DEPTH = 512


def narrow_cast_ops(node: Node, anchored: bool) -> int:
    """Operations per output element of ``node`` when it is a Cast from or to a narrow float (0 for any
    other node): widening the source, then rounding to the destination (``NARROW_CAST_OPS``);
    float16 <-> float32 outside an anchor's group (``anchored`` False) at F16C's ``NARROW_CAST_HW_OPS``."""
    if node.op_type != "Cast" or not node.inputs or node.inputs[0] is None or not node.outputs:
        return 0
    src, dst = np.dtype(node.inputs[0].dtype), np.dtype(node.outputs[0].dtype)
    if src == dst or not (is_narrow_float(src) or is_narrow_float(dst)):
        return 0
    if not anchored and {src, dst} == {FLOAT16, FLOAT32}:
        return NARROW_CAST_HW_OPS

    def kind(dt) -> str:
        return "float16" if dt == FLOAT16 else "bfloat16" if dt == BFLOAT16 else "float8"
    ops = NARROW_CAST_OPS["widen_" + kind(src)] if is_narrow_float(src) else 0
    if is_narrow_float(dst):
        ops += NARROW_CAST_OPS["round_" + kind(dst)]
        if src != FLOAT32 and not is_narrow_float(src):
            ops += NARROW_CAST_ROUND_FROM_OTHER
    return ops


def category_of(node: Node) -> Category:
    """The op's TVM category; ops opfuse does not know are opaque (never fused)."""
    return get_spec(node.op_type, node).category if is_supported(node.op_type) else Category.OPAQUE


def node_flops(node: Node) -> int:
    return get_spec(node.op_type, node).flops(node) if is_supported(node.op_type) else 0


_GEMM_OPS = frozenset({"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "Einsum", "Attention"})
_POOL_OPS = frozenset({"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "LpPool",
                       "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
                       "ReduceL1", "ReduceSumSquare", "ReduceLogSumExp"})


def op_class(node: Node) -> str:
    """The op's class for an instruction-count model (``targets.profile.OP_CLASSES``): dense convolution, grouped
    (depthwise) convolution, matrix product, pooling/reduction, or elementwise (everything else)."""
    if node.op_type in ("Conv", "ConvTranspose", "QLinearConv", "ConvInteger"):
        return "depthwise" if int(node.attrs.get("group", 1) or 1) > 1 else "conv"
    if node.op_type in _GEMM_OPS:
        return "gemm"
    if node.op_type in _POOL_OPS:
        return "pool"
    return "elementwise"


_DTYPE_NAMES: dict = {}


def _dtype_name(dt) -> str:
    name = _DTYPE_NAMES.get(dt)
    if name is None:
        name = _DTYPE_NAMES[dt] = dt.name
    return name


def compute_dtype(node: Node) -> str:
    """The dtype the node computes in: its first input's, else its first output's."""
    for v in node.inputs:
        if v is not None and v.type is not None:
            return _dtype_name(v.type.dtype)
    if node.outputs and node.outputs[0].type is not None:
        return _dtype_name(node.outputs[0].type.dtype)
    return "float32"


NodeInfo = tuple  # (OpSpec | None, FLOPs, compute dtype)


def node_info(node: Node, cache: dict | None = None) -> NodeInfo:
    """(spec, FLOPs, compute dtype) of a node, memoised in ``cache`` (keyed by node id:
    the cache must not outlive the graph)."""
    if cache is not None:
        info = cache.get(id(node))
        if info is not None:
            return info
    spec = get_spec(node.op_type, node) if is_supported(node.op_type) else None
    info = (spec, spec.flops(node) if spec is not None else 0, compute_dtype(node))
    if cache is not None:
        cache[id(node)] = info
    return info


# ``cache`` key of the graph-output id set (node entries are keyed by int ids: no clash).
_GRAPH_OUTPUTS_KEY = "graph_outputs"


def graph_output_ids(graph: Graph, cache: dict | None = None) -> frozenset[int]:
    """Ids of ``graph``'s outputs, built once per graph when a ``cache`` is given (O(outputs)
    per call otherwise: quadratic over a plan of a graph with thousands of outputs).

    The cached set is reused while the graph object and its number of outputs are unchanged
    (the cache must not outlive the graph, nor the graph's outputs be edited while it lives).
    """
    if cache is None:
        return frozenset(id(v) for v in graph.outputs)
    entry = cache.get(_GRAPH_OUTPUTS_KEY)
    if entry is not None and entry[0] is graph and entry[1] == len(graph.outputs):
        return entry[2]
    ids = frozenset(id(v) for v in graph.outputs)
    cache[_GRAPH_OUTPUTS_KEY] = (graph, len(graph.outputs), ids)
    return ids


def numel(v: Value) -> int:
    """Elements of ``v`` (``math.prod``: much faster than NumPy on a short tuple)."""
    return math.prod(v.type.shape) if v.type is not None else 0


def nbytes(v: Value) -> int:
    return math.prod(v.type.shape) * v.type.dtype.itemsize if v.type is not None else 0


def _out_elems(node: Node) -> int:
    return sum(numel(v) for v in node.outputs)


def reads_per_run(consumer: Node, spec: OpSpec | None, v: Value, flops: int | None = None) -> float:
    """Elements of ``v`` that one run of ``consumer`` reads (see the module docstring);
    ``flops`` is the consumer's FLOP count when already known."""
    size = max(1, numel(v))
    cat = spec.category if spec is not None else Category.OPAQUE
    if cat <= Category.BROADCAST or (spec is not None and cat == Category.INJECTIVE
                                     and spec.mapping == Mapping.ONE_TO_MANY):
        return float(_out_elems(consumer))
    if cat == Category.INJECTIVE:
        return float(min(_out_elems(consumer), size))
    if consumer.op_type == "Conv" and consumer.inputs and consumer.inputs[0] is v and len(v.shape) >= 3:
        # the packed X_col (or the window rows) is built once per tile: C * kernel reads per output position
        w = consumer.inputs[1]
        ksize = math.prod(w.shape[2:]) if w is not None else 1
        positions = math.prod(consumer.outputs[0].shape[2:]) * v.shape[0]
        return float(max(size, positions * v.shape[1] * ksize))
    if flops is None:
        flops = spec.flops(consumer) if spec is not None else 0
    return max(float(size), flops / FLOPS_PER_READ.get(cat, DEFAULT_FLOPS_PER_READ))


def is_streamed_use(consumer: Node, spec: OpSpec | None, v: Value) -> bool:
    """One-to-one read of the same number of elements: the loops fuse element by element."""
    return (spec is not None and spec.mapping == Mapping.ONE_TO_ONE
            and spec.category <= Category.BROADCAST and _out_elems(consumer) == numel(v))


@dataclass(frozen=True)
class GroupAnalysis:
    nodes: tuple[Node, ...]
    inputs: tuple[Value, ...]  # boundary inputs, first-use order, constants included
    outputs: tuple[Value, ...]  # boundary outputs
    base_flops: int  # sum of the ops' FLOPs
    executed_flops: dict[str, float]  # by compute dtype, recomputation included
    buffered: tuple[Value, ...]  # internal values held whole on chip
    register_pressure: int  # most streamed/inlined values live at once
    stream_elements: int  # elements of the largest streamed value (the loop trip count)
    max_category: Category
    input_bytes: int
    output_bytes: int
    working_set_bytes: int  # sum of the buffered values
    zero_copy: bool = False  # moves no data at all (an elided Concat, a view): no kernel runs
    scalar_flops: float = 0.0  # of executed_flops, those run in scalar loops (scalar prologues)
    # FLOPs by op class (``op_class``), recomputation included: what an instruction-count model
    # (a fitted Cortex-M7 profile) prices per class.
    executed_by_class: dict[str, float] = field(default_factory=dict)
    # Of executed_flops, those of the ops after an anchor (Conv, MatMul) that ``EPILOGUE_STREAM_RATIO`` prices, and
    # their price as bytes of stream: ratio x (their output read once and written once), recomputation included.
    epilogue_flops: float = 0.0
    epilogue_stream_bytes: float = 0.0
    # The anchors of those epilogues as ops alone: FLOPs, and bytes read (weights included) and written. The cost
    # model prices the epilogues so only where these are compute-bound on its profile.
    epilogue_anchor_flops: float = 0.0
    epilogue_anchor_bytes: int = 0
    # In a group without an anchor (a standalone elementwise kernel, a chain), the same: the listed ops' FLOPs and
    # their measured arithmetic as bytes of stream (ratio x their output read once and written once).
    arithmetic_flops: float = 0.0
    arithmetic_stream_bytes: float = 0.0

    @property
    def boundary_bytes(self) -> int:
        return self.input_bytes + self.output_bytes

    @property
    def flops(self) -> float:
        return sum(self.executed_flops.values())

    @property
    def duplicated_flops(self) -> float:
        return max(0.0, self.flops - self.base_flops)


def analyze_group(graph: Graph, nodes, cache: dict | None = None) -> GroupAnalysis:
    """Analyse ``nodes`` (a FusionGroup's nodes, in topological order) as one kernel.

    ``cache`` memoises per-node facts and the graph-output set across calls on the same
    graph (see ``node_info`` and ``graph_output_ids``).
    """
    nodes = tuple(nodes)
    member = {id(n): i for i, n in enumerate(nodes)}
    graph_outs = graph_output_ids(graph, cache)
    infos = {id(n): node_info(n, cache) for n in nodes}
    specs = {k: info[0] for k, info in infos.items()}

    inputs: dict[int, Value] = {}
    produced = {id(v) for n in nodes for v in n.outputs}
    for n in nodes:
        for v in n.input_values():
            if id(v) not in produced:
                inputs.setdefault(id(v), v)
    outputs, internal = [], {}
    for n in nodes:
        for v in n.outputs:
            outside = id(v) in graph_outs or any(id(u) not in member for u, _ in v.uses)
            if outside:
                outputs.append(v)
            elif v.uses:
                internal[id(v)] = v

    # Execution counts, consumers first (reverse topological order).
    execs: dict[int, float] = {}
    inlined: set[int] = set()
    for n in reversed(nodes):
        spec = specs[id(n)]
        cat = spec.category if spec is not None else Category.OPAQUE
        if cat <= Category.INJECTIVE and n.outputs and all(id(v) in internal for v in n.outputs):
            inlined.add(id(n))
            execs[id(n)] = max(_value_exec(v, execs, infos) for v in n.outputs)
        else:
            execs[id(n)] = 1.0

    executed: dict[str, float] = {}
    by_class: dict[str, float] = {}
    base = 0
    for n in nodes:
        _, f, d = infos[id(n)]
        base += f
        executed[d] = executed.get(d, 0.0) + f * execs[id(n)]
        if f:
            cls = op_class(n)
            by_class[cls] = by_class.get(cls, 0.0) + f * execs[id(n)]
    anchored = any(specs[id(n)] is None or specs[id(n)].category > Category.INJECTIVE for n in nodes)
    for n in nodes:  # narrow-float conversions: integer work the FLOP counts leave out
        ops = narrow_cast_ops(n, anchored) * numel(n.outputs[0]) if n.op_type == "Cast" else 0
        if ops:
            base += ops  # counted as FLOPs of the node: recomputation only beyond one execution
            executed["float32"] = executed.get("float32", 0.0) + ops * execs[id(n)]
            by_class["elementwise"] = by_class.get("elementwise", 0.0) + ops * execs[id(n)]
    scalar = _scalar_prologue(nodes, inlined, member, specs)
    scalar_flops = sum(infos[id(n)][1] * execs[id(n)] for n in nodes if id(n) in scalar)
    if anchored:  # an anchor's epilogue conversions run at the scalar rate (``NARROW_CAST_OPS``)
        scalar_flops += sum(narrow_cast_ops(n, True) * numel(n.outputs[0]) * execs[id(n)] for n in nodes
                            if n.op_type == "Cast")

    epi_flops, epi_bytes, anchor_flops, anchor_bytes = _epilogue_prices(nodes, member, specs, infos, execs)
    alone_flops, alone_bytes = (0.0, 0.0) if anchored else _arithmetic_prices(nodes, infos, execs)

    buffered, streams = [], []
    for v in internal.values():
        if id(v.producer) in inlined:
            streams.append(v)
            continue
        readers = [(u, specs[id(u)]) for u, _ in v.uses]
        if all(is_streamed_use(u, s, v) and execs[id(u)] == 1.0 for u, s in readers):
            streams.append(v)
        else:
            buffered.append(v)

    pressure = _max_live(streams, member)
    input_bytes = sum(nbytes(v) for v in inputs.values())
    output_bytes = sum(nbytes(v) for v in outputs)
    zero_copy = False
    if len(nodes) == 1:  # a lone Concat whose producers write its slices, or a view, moves less
        input_bytes, output_bytes, zero_copy = _aliased_bytes(graph, nodes[0], input_bytes, output_bytes)
    max_cat = max((specs[id(n)].category if specs[id(n)] is not None else Category.OPAQUE) for n in nodes)
    return GroupAnalysis(nodes=nodes, inputs=tuple(inputs.values()), outputs=tuple(outputs),
                         base_flops=base, executed_flops=executed, buffered=tuple(buffered),
                         register_pressure=pressure,
                         stream_elements=max((numel(v) for v in streams), default=0),
                         max_category=max_cat, input_bytes=input_bytes, output_bytes=output_bytes,
                         working_set_bytes=sum(nbytes(v) for v in buffered), zero_copy=zero_copy,
                         scalar_flops=scalar_flops, executed_by_class=by_class, epilogue_flops=epi_flops,
                         epilogue_stream_bytes=epi_bytes, epilogue_anchor_flops=anchor_flops,
                         epilogue_anchor_bytes=anchor_bytes, arithmetic_flops=alone_flops,
                         arithmetic_stream_bytes=alone_bytes)


def _arithmetic_prices(nodes, infos, execs) -> tuple[float, float]:
    """(FLOPs, stream bytes x ratio) of the ops of an anchorless group that ``EPILOGUE_STREAM_RATIO`` lists: the
    same measured arithmetic as an epilogue's (module docstring)."""
    flops = stream = 0.0
    for n in nodes:
        ratio = epilogue_stream_ratio(n)
        if ratio is not None and n.outputs:
            flops += infos[id(n)][1] * execs[id(n)]
            stream += ratio * 2 * nbytes(n.outputs[0]) * execs[id(n)]
    return flops, stream


def _epilogue_prices(nodes, member: dict[int, int], specs, infos, execs) -> tuple[float, float, float, int]:
    """(FLOPs, stream bytes x ratio) of the elementwise ops downstream of an ``OUT_ELEMWISE_FUSABLE`` anchor of the
    group (one of at most ``EPILOGUE_EXPOSED_MAX_DEPTH`` multiply-adds per output) that ``EPILOGUE_STREAM_RATIO``
    lists (module docstring), and the FLOPs and bytes of those anchors alone."""
    anchor_of: dict[int, Node] = {}  # node id -> the anchor it is downstream of
    flops = stream = 0.0
    priced: dict[int, Node] = {}
    for n in nodes:
        spec = specs[id(n)]
        if spec is not None and spec.category == Category.OUT_ELEMWISE_FUSABLE:
            outs = sum(numel(v) for v in n.outputs)
            if outs and infos[id(n)][1] <= 2 * EPILOGUE_EXPOSED_MAX_DEPTH * outs:
                anchor_of[id(n)] = n
            continue
        anchor = next((anchor_of[id(v.producer)] for v in n.input_values()
                       if v.producer is not None and id(v.producer) in member and id(v.producer) in anchor_of), None)
        if anchor is None:
            continue
        anchor_of[id(n)] = anchor
        ratio = epilogue_stream_ratio(n) if spec is not None and spec.category <= Category.BROADCAST else None
        if ratio is not None and n.outputs:
            flops += infos[id(n)][1] * execs[id(n)]
            stream += ratio * 2 * nbytes(n.outputs[0]) * execs[id(n)]
            priced[id(anchor)] = anchor
    anchor_flops = sum(infos[id(a)][1] for a in priced.values())
    anchor_bytes = sum(nbytes(v) for a in priced.values() for v in [*a.input_values(), *a.outputs])
    return flops, stream, anchor_flops, anchor_bytes


def _scalar_prologue(nodes, inlined: set[int], member: dict[int, int], specs) -> set[int]:
    """Ids of the inlined nodes that run in a short reduction's scalar loop (consumers first)."""
    scalar: set[int] = set()
    for n in reversed(nodes):
        if id(n) not in inlined:
            continue
        for v in n.outputs:
            for u, _ in v.uses:
                if id(u) not in member:
                    continue
                s = specs[id(u)]
                short = (s is not None and s.category == Category.REDUCTION and u.outputs
                         and (u.op_type in SCALAR_WINDOW_OPS
                              or (u.op_type not in WINDOW_OPS and _reduces(u) and numel(u.input(0))
                                  < VECTORISED_REDUCTION_MIN_RUN * max(1, numel(u.outputs[0])))))
                if short or id(u) in scalar:
                    scalar.add(id(n))
    return scalar


def _reduces(node: Node) -> bool:
    """Whether ``node`` has fewer output elements than input elements (a ReduceX, a global pool):
    only then is |input| / |output| the run one output reads. A normalization of the reduction
    category (Softmax, LayerNormalization) writes as many elements as it reads; its rows are
    normalized by their own kernels (``codegen/norm.py``, the attention kernel's online softmax),
    not by the short-reduction scalar loop."""
    return numel(node.outputs[0]) < numel(node.input(0))


def _aliased_bytes(graph: Graph, node: Node, input_bytes: int, output_bytes: int) -> tuple[int, int, bool]:
    """(input bytes, output bytes, moves nothing?) of a one-op group, aliasing priced in: a Concat
    copies only the inputs its producers cannot write in place; a view copies nothing."""
    if node.op_type == "Concat":
        aliased = {id(v) for v in aliasable_inputs(graph, node)}
        if aliased:
            copied = sum(nbytes(v) for v in node.input_values() if id(v) not in aliased)
            return copied, copied, copied == 0
    elif is_view(graph, node):
        return 0, 0, True
    return input_bytes, output_bytes, False


def _value_exec(v: Value, execs: dict[int, float], infos: dict) -> float:
    size = max(1, numel(v))
    streamed, other = 0.0, 0.0
    seen: set[int] = set()
    for u, _ in v.uses:
        if id(u) in seen:  # Mul(x, x): one read of x per element
            continue
        seen.add(id(u))
        spec, flops, _ = infos[id(u)]
        if is_streamed_use(u, spec, v):
            streamed = max(streamed, execs[id(u)])
        else:
            other += execs[id(u)] * reads_per_run(u, spec, v, flops) / size
    return max(1.0, streamed + other)


def _max_live(values: list[Value], member: dict[int, int]) -> int:
    """Most of ``values`` live at once, a value living from its producer to its last reader."""
    if not values:
        return 0
    delta = [0] * (len(member) + 1)
    for v in values:
        start = member[id(v.producer)]
        end = max(member[id(u)] for u, _ in v.uses)
        delta[start] += 1
        delta[end] -= 1
    live = best = 0
    for d in delta:
        live += d
        best = max(best, live)
    return best
