"""The op registry: one ``OpSpec`` per supported op.

An ``OpSpec`` is everything the compiler knows about an op, in one place:

* arity and attributes with their defaults;
* ``infer(node, attrs) -> [TensorType]``: static shape and dtype inference;
* ``compute(inputs, attrs, node) -> [ndarray]``: the NumPy reference (the oracle);
* FLOPs and bytes read/written, for the cost model and reports;
* the fusion category, both TVM-style (``Category``: which fusions may involve it) and
  DNNFusion-style (``Mapping``: how output elements depend on input elements);
* tags such as ``"activation"`` and ``"commutative"`` that patterns match on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Callable, Sequence

import numpy as np

from opfuse.errors import ModelError, ShapeError, UnsupportedOpError
from opfuse.ir.dtypes import EXTENSION_FLOATS
from opfuse.ir.graph import Graph, Node, TensorType
from opfuse.ir.verify import register_shape_checker
from opfuse.ops.limits import check_tensor_size


class Category(IntEnum):
    """TVM's op pattern kinds; a larger value is harder to fuse (the order matters)."""

    ELEMWISE = 0              # out[i] = f(in[i]); same shape in and out
    BROADCAST = 1             # elementwise with broadcasting of some input
    INJECTIVE = 2             # each output element reads one input element (reshape, transpose, ...)
    REDUCTION = 3             # reduces along axes (ReduceSum, Softmax, pooling)
    OUT_ELEMWISE_FUSABLE = 4  # complex op whose output can take an elementwise epilogue (Conv, MatMul)
    OPAQUE = 8                # never fused (shape computations, data-dependent ops)


class Mapping(Enum):
    """DNNFusion's mapping types between input and output elements."""

    ONE_TO_ONE = "one-to-one"
    ONE_TO_MANY = "one-to-many"
    MANY_TO_MANY = "many-to-many"
    REORGANIZE = "reorganize"
    SHUFFLE = "shuffle"


InferFn = Callable[[Node, dict], Sequence[TensorType]]
ComputeFn = Callable[[list, dict, Node], Sequence[np.ndarray]]
CountFn = Callable[[Node, dict], int]


@dataclass
class OpSpec:
    name: str
    category: Category
    mapping: Mapping
    infer: InferFn
    compute: ComputeFn
    num_inputs: tuple[int, int] = (1, 1)
    num_outputs: tuple[int, int] = (1, 1)
    attrs: dict = field(default_factory=dict)
    tags: frozenset = frozenset()
    flops_fn: CountFn | None = None
    flops_per_element: float = 1.0  # used when flops_fn is None: per output element
    dtypes: frozenset | None = None  # element types ONNX allows for input 0 (None: not checked here)

    def attrs_of(self, node: Node) -> dict:
        """The node's attributes with this op's defaults filled in."""
        unknown = set(node.attrs) - set(self.attrs)
        if unknown:
            raise UnsupportedOpError(self.name, node.name,
                                     detail=f"unknown attribute(s) {sorted(unknown)}")
        merged = dict(self.attrs)
        merged.update(node.attrs)
        return merged

    # Costs ------------------------------------------------------------------------
    def flops(self, node: Node) -> int:
        if self.flops_fn is not None:
            return int(self.flops_fn(node, self.attrs_of(node)))
        return int(self.flops_per_element * sum(v.size for v in node.outputs))

    def bytes_read(self, node: Node) -> int:
        """Bytes of every input tensor (weights included), each read once."""
        return sum(v.nbytes for v in node.input_values())

    def bytes_written(self, node: Node) -> int:
        return sum(v.nbytes for v in node.outputs)

    def has_tag(self, tag: str) -> bool:
        return tag in self.tags

    @property
    def is_pointwise(self) -> bool:
        """Elementwise/broadcast with one output element per input element (not Expand): the
        ops a kernel can apply in registers at the output's own index (epilogues, in place)."""
        return self.category <= Category.BROADCAST and self.mapping != Mapping.ONE_TO_MANY


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in REGISTRY:
        raise ValueError(f"op '{spec.name}' registered twice")
    REGISTRY[spec.name] = spec
    return spec


def get_spec(op_type: str, node: Node | None = None) -> OpSpec:
    spec = REGISTRY.get(op_type)
    if spec is None:
        raise UnsupportedOpError(op_type, node.name if node is not None else "")
    return spec


def is_supported(op_type: str) -> bool:
    return op_type in REGISTRY


# Graph-level helpers -------------------------------------------------------------------

def check_arity(spec: OpSpec, node: Node) -> None:
    lo, hi = spec.num_inputs
    n = len(node.inputs)
    while n and node.inputs[n - 1] is None:
        n -= 1
    if not lo <= n <= hi:
        raise ModelError(f"node '{node.name}' ({node.op_type}) has {n} inputs, expects {lo}..{hi}")
    lo, hi = spec.num_outputs
    if not lo <= len(node.outputs) <= hi:
        raise ModelError(f"node '{node.name}' ({node.op_type}) has {len(node.outputs)} outputs, "
                         f"expects {lo}..{hi}")


def infer_node(node: Node) -> list[TensorType]:
    """Infer a node's output types from its input types (and constant inputs)."""
    spec = get_spec(node.op_type, node)
    check_arity(spec, node)
    for v in node.input_values():
        if v.type is None:
            raise ModelError(f"input '{v.name}' of node '{node.name}' has no known shape")
    if spec.dtypes is not None and node.inputs and node.inputs[0] is not None \
            and node.inputs[0].dtype not in spec.dtypes:
        allowed = ", ".join(sorted(np.dtype(t).name for t in spec.dtypes))
        raise ModelError(f"node '{node.name}' ({node.op_type}): element type {node.inputs[0].dtype} is not "
                         f"allowed (ONNX's {node.op_type} takes {allowed})")
    try:
        types = list(spec.infer(node, spec.attrs_of(node)))
    except (ModelError, ShapeError, UnsupportedOpError):
        raise
    except Exception as e:  # a malformed model reaching an inference rule
        raise ShapeError(f"cannot infer shapes of node '{node.name}' ({node.op_type}): {e}") from e
    if len(types) != len(node.outputs):
        raise ModelError(f"node '{node.name}' ({node.op_type}) infers {len(types)} outputs, "
                         f"has {len(node.outputs)}")
    for v, t in zip(node.outputs, types, strict=True):
        check_tensor_size(t.shape, t.dtype, f"node '{node.name}' ({node.op_type}): output '{v.name}'")
    return types


def infer_shapes(graph: Graph) -> None:
    """Set the type of every node output, in topological order."""
    for node in graph.nodes:
        for v, t in zip(node.outputs, infer_node(node), strict=True):
            v.type = t


def _check_node_shapes(graph: Graph, node: Node) -> None:
    types = infer_node(node)
    for v, t in zip(node.outputs, types, strict=True):
        if v.type != t:
            raise ShapeError(f"node '{node.name}' ({node.op_type}) output '{v.name}' has type "
                             f"{v.type}, its op infers {t}")


register_shape_checker(_check_node_shapes)


# Ops that read ml_dtypes' values as they are: a bit view, and Cast (its saturation and
# rounding are its own, ``ops.elementwise``).
_EXTENSION_AS_IS = frozenset({"BitCast", "Cast"})


def run_node(node, args: list) -> list:
    """The NumPy reference result of one node on ``args`` (its inputs, ``None`` for absent ones).

    bfloat16 (and float8) is computed in float32 and rounded once per op (to nearest even, NaN
    kept NaN), as onnxruntime's CPU kernels do: its inputs are widened exactly to float32, the
    op's reference runs on those, and every such output is rounded from the result. (NumPy's
    ufuncs on ml_dtypes' types do the same per ufunc, but linear algebra and libm-based
    references do not take them.)"""
    spec = get_spec(node.op_type, node)
    if node.op_type in _EXTENSION_AS_IS or not any(isinstance(a, np.ndarray) and a.dtype in EXTENSION_FLOATS
                                                   for a in args):
        return list(spec.compute(args, spec.attrs_of(node), node))
    wide = [a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype in EXTENSION_FLOATS else a for a in args]
    outs = list(spec.compute(wide, spec.attrs_of(node), node))
    for k, v in enumerate(node.outputs[:len(outs)]):
        if v.type is not None and v.dtype in EXTENSION_FLOATS and isinstance(outs[k], np.ndarray):
            outs[k] = outs[k].astype(v.dtype)
    return outs

