"""Op categories as fusion sees them (TVM's op pattern kinds, read from the op registry).

* elementwise: ``ELEMWISE`` and ``BROADCAST`` ops: one output element from the same-index
  (or broadcast) input elements; any number chain into one loop.
* injective: data movement (Reshape, Transpose, Slice, Split, Concat, Gather, Pad, Resize):
  each output element is one input element at a mapped index.
* out-elementwise-fusable (OEF): Conv, ConvTranspose, MatMul, Gemm; they take an elementwise
  epilogue, never a prologue, and two of them never share a kernel (TVM: no Conv -> Conv).
* reduction: Softmax, LayerNormalization, pooling, ReduceX; a *row normalization* is a
  reduction tagged ``normalization`` whose output has its input's shape (Softmax, LayerNorm).
* opaque: never fused with anything (Shape, ConstantOfShape).

After an anchor (an epilogue, finished one anchor result at a time) only ops that map one
element to one element may follow: *pointwise* ops (elementwise/broadcast, but not Expand,
which spreads one element over many) and *relabelling* data movement (Reshape family,
Transpose: bijections of the index, mapping ``REORGANIZE``/``SHUFFLE``). Slice, Pad, Gather,
Resize, Concat, Split do not (they drop, repeat or interleave elements).
"""
from __future__ import annotations

from opfuse.ir.graph import Node
from opfuse.ops.registry import Category, Mapping, get_spec

RELABEL_MAPPINGS = (Mapping.REORGANIZE, Mapping.SHUFFLE)


def category(node: Node) -> Category:
    return get_spec(node.op_type, node).category


def is_elementwise(node: Node) -> bool:
    return category(node) <= Category.BROADCAST


def is_pointwise(node: Node) -> bool:
    """Elementwise/broadcast and one output element per input element (not Expand)."""
    return get_spec(node.op_type, node).is_pointwise


def is_relabel(node: Node) -> bool:
    """Data movement that only renames each element's index (Reshape family, Transpose)."""
    spec = get_spec(node.op_type, node)
    return spec.category == Category.INJECTIVE and spec.mapping in RELABEL_MAPPINGS


def is_injective(node: Node) -> bool:
    return category(node) == Category.INJECTIVE


def is_oef(node: Node) -> bool:
    return category(node) == Category.OUT_ELEMWISE_FUSABLE


def is_reduction(node: Node) -> bool:
    return category(node) == Category.REDUCTION


def is_opaque(node: Node) -> bool:
    return category(node) == Category.OPAQUE


def is_anchor(node: Node) -> bool:
    """Ops a kernel is built around: OEF ops and reductions."""
    return category(node) in (Category.OUT_ELEMWISE_FUSABLE, Category.REDUCTION)


def is_row_normalization(node: Node) -> bool:
    spec = get_spec(node.op_type, node)
    return (spec.category == Category.REDUCTION and "normalization" in spec.tags
            and node.outputs[0].shape == node.input(0).shape)


def category_name(node: Node) -> str:
    return {Category.ELEMWISE: "elementwise", Category.BROADCAST: "broadcast",
            Category.INJECTIVE: "injective", Category.REDUCTION: "reduction",
            Category.OUT_ELEMWISE_FUSABLE: "out-elementwise-fusable",
            Category.OPAQUE: "opaque"}[category(node)]
