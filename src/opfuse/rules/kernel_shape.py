"""What one kernel may hold: ``classify(nodes)`` names the kernel shape of a node set or refuses.

A fused group is legal when it is one of these shapes (TVM's rules by op category, plus the
two composite kernels the backend builds):

``single``         any one op.
``elementwise``    elementwise/broadcast ops only; every boundary output has one shape (the
                   loop's domain); values of other shapes inside are recomputed per element.
``injective``      data movement plus elementwise ops, evaluated through index maps; every
                   boundary output has one shape.
``conv_epilogue``  one Conv/ConvTranspose (``gemm_epilogue``: MatMul/Gemm; ``sampling_epilogue``:
                   GridSample, Col2Im, DeformConv, RoiAlign) and elementwise ops
                   after it, applied per output element while the result is in registers
                   (pointwise ones: no Expand, which spreads one element over many):
                   epilogue ops have the anchor's output shape; side computations feeding them
                   are elementwise; nothing in the group feeds the anchor except a dequantizing
                   prologue (an 8-bit tensor's Cast/Sub/Mul on the anchor's data operand,
                   ``opfuse.rules.quantized``), and a second out-elementwise-fusable op or any
                   reduction is refused (Conv -> Conv is never fused).
``reduction``      one reduction with an elementwise prologue (values read only by the group)
                   and a pointwise epilogue of the reduction's output shape.
``attention``      ``MatMul -> scale/mask -> Softmax -> MatMul`` with data-movement prologue and
                   epilogue (``opfuse.rules.attention``).

Opaque ops are never fused. The refusal's kind says why (category, or a rule's condition).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opfuse.rules.attention import attention_structure
from opfuse.rules.categories import (category_name, is_elementwise, is_oef, is_opaque,
                                      is_pointwise, is_reduction)
from opfuse.rules.decisions import RefusalKind, Refusal
from opfuse.rules.quantized import prologue_refusal, reads_8bit
from opfuse.ir.graph import Graph, Node, Value
from opfuse.ir.walk import ancestors_within, components_within, descendants_within

EPILOGUE_KINDS = {"Conv": "conv_epilogue", "ConvTranspose": "conv_epilogue",
                  "MatMul": "gemm_epilogue", "Gemm": "gemm_epilogue",
                  **{op: "sampling_epilogue" for op in ("GridSample", "Col2Im", "DeformConv", "RoiAlign")}}


@dataclass(frozen=True)
class GroupShape:
    kind: str
    anchor: Node | None
    attrs: dict = field(default_factory=dict, hash=False, compare=False)


def _forbid(msg: str) -> Refusal:
    return Refusal(RefusalKind.CATEGORY, msg)


def _refuse(msg: str) -> Refusal:
    return Refusal(RefusalKind.CONDITION, msg)


def _desc(n: Node, with_category: bool = False) -> str:
    return f"'{n.name}' ({n.op_type}, {category_name(n)})" if with_category else f"'{n.name}' ({n.op_type})"


descendants = descendants_within  # group nodes reachable from a node through values inside the group
ancestors = ancestors_within      # group nodes that reach a node through values inside the group


def output_ids(graph: Graph) -> frozenset[int]:
    return frozenset(id(v) for v in graph.outputs)


def boundary_outputs(nodes: list[Node], graph: Graph, outputs: frozenset[int] | None = None) -> list[Value]:
    """Values of ``nodes`` read outside them or graph outputs (``outputs``: the graph's output
    ids when the caller has them, see ``GraphIndex``)."""
    ids = {id(n) for n in nodes}
    outs = output_ids(graph) if outputs is None else outputs
    return [v for n in nodes for v in n.outputs
            if id(v) in outs or any(id(u) not in ids for u, _ in v.uses)]


def _connected(nodes: list[Node]) -> bool:
    return len(components_within(nodes)) == 1


def _one_domain(nodes: list[Node], graph: Graph, what: str, outputs: frozenset[int]) -> Refusal | None:
    shapes = {v.shape for v in boundary_outputs(nodes, graph, outputs)}
    if len(shapes) > 1:
        return _refuse(f"{what} outputs of different shapes {sorted(shapes)} cannot share one loop")
    return None


def classify(nodes: list[Node], graph: Graph, outputs: frozenset[int] | None = None) -> GroupShape | Refusal:
    """The kernel shape of ``nodes`` (in topological order) or why they cannot be one kernel.

    O(len(nodes)) given ``outputs``, the ids of the graph's outputs (computed when None).
    """
    if len(nodes) == 1:
        return GroupShape("single", nodes[0])
    outputs = output_ids(graph) if outputs is None else outputs
    for n in nodes:
        if is_opaque(n):
            return _forbid(f"{_desc(n)} is opaque: never fused")
    oefs = [n for n in nodes if is_oef(n)]
    reds = [n for n in nodes if is_reduction(n)]
    if len(oefs) == 2 and len(reds) == 1 and all(n.op_type == "MatMul" for n in oefs):
        info = attention_structure(nodes, graph, outputs)
        if isinstance(info, Refusal):
            return info
        return GroupShape("attention", info["qk"], info)
    if len(oefs) >= 2:  # name the outermost pair: the producer's anchor and the consumer's
        return _forbid(f"two out-elementwise-fusable ops {_desc(oefs[0])} and {_desc(oefs[-1])} are never "
                       f"fused into one kernel (no Conv -> Conv)")
    if oefs and reds:
        return _forbid(f"reduction {_desc(reds[0])} cannot share a kernel with out-elementwise-fusable "
                       f"{_desc(oefs[0])}")
    if len(reds) >= 2:
        return _forbid(f"two reductions {_desc(reds[0])} and {_desc(reds[1])} in one kernel")
    if not _connected(nodes):
        return _refuse("the ops are not connected by producer-consumer edges (siblings fuse horizontally)")
    if oefs:
        return _epilogue(nodes, graph, oefs[0], outputs)
    if reds:
        return _reduction(nodes, graph, reds[0], outputs)
    if all(is_elementwise(n) for n in nodes):
        r = _one_domain(nodes, graph, "elementwise", outputs)
        return r or GroupShape("elementwise", None)
    # every op left is elementwise or injective: opaque ops, anchors and reductions have returned above
    r = _one_domain(nodes, graph, "injective", outputs)
    return r or GroupShape("injective", None)


def _epilogue(nodes: list[Node], graph: Graph, anchor: Node, outputs: frozenset[int]) -> GroupShape | Refusal:
    ids = {id(n) for n in nodes}
    down = descendants(anchor, ids)
    up = ancestors(anchor, ids)
    domain = anchor.outputs[0].shape
    prologue = [n for n in nodes if id(n) in up]
    if prologue:
        r = prologue_refusal(prologue, anchor, ids)
        if r is not None and not reads_8bit(prologue, ids):
            return _forbid(f"{_desc(prologue[0])} would feed {_desc(anchor)}: out-elementwise-fusable ops take an "
                           f"epilogue, never a prologue")
        if r is not None:
            return _forbid(f"{_desc(prologue[0])} would feed {_desc(anchor)}: out-elementwise-fusable ops take "
                           f"an epilogue, and a prologue only to dequantize an 8-bit operand ({r.reason})")
    for n in nodes:
        if n is anchor or id(n) in up:
            continue
        if not is_elementwise(n):
            return _forbid(f"{_desc(n, True)} cannot follow {_desc(anchor)} in its kernel: "
                           f"only elementwise ops form an epilogue")
        if id(n) in down:
            r = _epilogue_op_refusal(n, anchor, domain, "anchor's",
                                     ": the epilogue runs once per output element")
            if r is not None:
                return r
    for v in boundary_outputs(nodes, graph, outputs):
        if v.shape != domain:
            return _refuse(f"'{v.name}' leaves the group with shape {v.shape}, not the anchor's {domain}")
    epilogue = [n.name for n in nodes if id(n) in down]
    attrs: dict = {"epilogue": epilogue}
    if prologue:
        attrs["prologue"] = [n.name for n in prologue]
    return GroupShape(EPILOGUE_KINDS[anchor.op_type], anchor, attrs)


def _epilogue_op_refusal(n: Node, anchor: Node, domain: tuple, whose: str, why: str = "") -> Refusal | None:
    """Why ``n``, downstream of ``anchor`` in its group, cannot run in the anchor's epilogue."""
    extra = next((v for v in n.input_values() if any(v is o for o in anchor.outputs[1:])), None)
    if extra is not None:  # MaxPool's Indices: the kernel stores them apart, the epilogue has the values only
        return _forbid(f"{_desc(n)} reads {_desc(anchor)}'s output '{extra.name}' (not its first): an "
                       f"epilogue computes from the anchor's first output only")
    if not is_pointwise(n):
        return _forbid(f"{_desc(n)} after {_desc(anchor)} would spread one result of the anchor over "
                       f"several output elements: an epilogue maps each anchor element to one element")
    if n.outputs[0].shape != domain:
        return _refuse(f"epilogue op {_desc(n)} has output shape {n.outputs[0].shape}, not the {whose} "
                       f"{domain}{why}")
    return None


def _reduction(nodes: list[Node], graph: Graph, anchor: Node, outputs: frozenset[int]) -> GroupShape | Refusal:
    ids = {id(n) for n in nodes}
    down = descendants(anchor, ids)
    up = ancestors(anchor, ids)
    domain = anchor.outputs[0].shape
    for n in nodes:
        if n is anchor:
            continue
        if not is_elementwise(n):
            where = "before" if id(n) in up else "after"
            return _forbid(f"{_desc(n, True)} cannot be fused {where} reduction {_desc(anchor)}: "
                           f"only elementwise ops form a prologue or epilogue")
        if id(n) in down:
            r = _epilogue_op_refusal(n, anchor, domain, "reduction's")
            if r is not None:
                return r
    outs = boundary_outputs(nodes, graph, outputs)
    for v in outs:
        if v.producer is not None and id(v.producer) in up:
            return _refuse(f"prologue value '{v.name}' is also read outside the group: the reduction "
                           f"reads its prologue through registers only")
        if v.shape != domain:
            return _refuse(f"'{v.name}' leaves the group with shape {v.shape}, not the reduction's {domain}")
    return GroupShape("reduction", anchor, {"prologue": [n.name for n in nodes if id(n) in up],
                                            "epilogue": [n.name for n in nodes if id(n) in down]})
