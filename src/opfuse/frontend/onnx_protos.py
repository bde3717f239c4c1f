"""Conversions between ONNX protobuf messages and plain Python / NumPy values.

* ``TensorProto`` <-> ``np.ndarray`` (external data is resolved by ``external_data``; sparse
  tensors are densified);
* ``AttributeProto`` <-> plain Python (int, float, str, lists of those, ``np.ndarray`` for tensor
  attributes), the canonical attribute values of the IR; a subgraph (If's branches, Loop's and
  Scan's body) stays an ``onnx.GraphProto`` and a type (Optional's) an ``onnx.TypeProto``: the
  importer folds those ops away, so neither reaches the IR (``outer_reads`` lists the outer
  values a subgraph reads);
* ONNX element types <-> NumPy dtypes, limited to the dtypes opfuse computes with.

Every malformed message becomes a ``ModelError`` naming the tensor or attribute.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from opfuse.errors import ModelError, UnsupportedOpError
from opfuse.ir.dtypes import BFLOAT16, FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ
from opfuse.frontend.external_data import inline_external_data, uses_external_data

# The ONNX element types opfuse supports (no float4/float8e8m0/int4/int2/strings/complex: the
# reference executor and the C backend compute in these NumPy types only; bfloat16 and float8
# are ml_dtypes' types, computed in float32 and rounded per op, ``opfuse.ir.dtypes``).
ONNX_TO_NUMPY: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.BFLOAT16: BFLOAT16,
    TensorProto.FLOAT8E4M3FN: FLOAT8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ: FLOAT8E4M3FNUZ,
    TensorProto.FLOAT8E5M2: FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ: FLOAT8E5M2FNUZ,
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.BOOL: np.dtype(np.bool_),
}
NUMPY_TO_ONNX: dict[np.dtype, int] = {v: k for k, v in ONNX_TO_NUMPY.items()}


def elem_type_name(elem_type: int) -> str:
    try:
        return TensorProto.DataType.Name(elem_type)
    except ValueError:
        return f"#{elem_type}"


def numpy_dtype(elem_type: int, what: str) -> np.dtype:
    """The NumPy dtype of an ONNX element type; ``what`` names the tensor for the error."""
    dt = ONNX_TO_NUMPY.get(elem_type)
    if dt is None:
        raise ModelError(f"{what} has element type {elem_type_name(elem_type)}, which opfuse does not "
                         f"support (supported: {', '.join(elem_type_name(k) for k in ONNX_TO_NUMPY)})")
    return dt


def onnx_elem_type(dtype, what: str) -> int:
    dt = np.dtype(dtype)
    if dt not in NUMPY_TO_ONNX:
        raise ModelError(f"{what} has dtype {dt}, which has no supported ONNX element type")
    return NUMPY_TO_ONNX[dt]


# Tensors -----------------------------------------------------------------------------------

def tensor_to_array(tensor: TensorProto, base_dir: str | None, what: str | None = None) -> np.ndarray:
    """The dense NumPy array of a tensor, reading external data from inside ``base_dir``."""
    what = what or f"tensor '{tensor.name}'"
    numpy_dtype(tensor.data_type, what)
    if uses_external_data(tensor):
        tensor = inline_external_data(tensor, base_dir, what)
    try:
        arr = numpy_helper.to_array(tensor)
    except Exception as e:  # malformed payload: wrong byte count, bad dims, ...
        raise ModelError(f"{what} is malformed: {_one_line(e)}") from None
    # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
    return arr if arr.flags.c_contiguous else np.array(arr, order="C")


def sparse_to_array(sparse: onnx.SparseTensorProto, base_dir: str | None, what: str) -> np.ndarray:
    """Densify a COO sparse tensor: ``dense.flat[linear index] = value`` (zeros elsewhere)."""
    values = tensor_to_array(sparse.values, base_dir, f"{what} (values)")
    indices = tensor_to_array(sparse.indices, base_dir, f"{what} (indices)").astype(np.int64)
    shape = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(shape, dtype=values.dtype)
    size = dense.size
    if indices.ndim == 2:  # [NNZ, rank] coordinates
        if indices.shape[1] != len(shape):
            raise ModelError(f"{what}: sparse indices have {indices.shape[1]} coordinates, rank is {len(shape)}")
        if indices.size and ((indices < 0).any() or (indices >= np.array(shape)).any()):
            raise ModelError(f"{what}: sparse index out of range")
        linear = np.ravel_multi_index(tuple(indices.T), shape) if indices.size else indices[:, 0]
    elif indices.ndim == 1:  # [NNZ] linear indices
        linear = indices
    else:
        raise ModelError(f"{what}: sparse indices must be 1-D or 2-D")
    if linear.shape[0] != values.size or (linear.size and (linear.min() < 0 or linear.max() >= size)):
        raise ModelError(f"{what}: sparse indices do not match its values and shape")
    dense.reshape(-1)[linear] = values.reshape(-1)
    return dense


def array_to_tensor(arr: np.ndarray, name: str) -> TensorProto:
    arr = np.asarray(arr)
    onnx_elem_type(arr.dtype, f"constant '{name}'")
    return numpy_helper.from_array(np.array(arr, order="C"), name)


# Attributes --------------------------------------------------------------------------------

_UNSUPPORTED_ATTR_KINDS = {
    AttributeProto.GRAPHS: "a list of subgraphs",
    AttributeProto.TENSORS: "a list of tensors",
    AttributeProto.SPARSE_TENSORS: "a list of sparse tensors",
    AttributeProto.TYPE_PROTOS: "a list of types",
}


def attribute_value(attr: AttributeProto, node: onnx.NodeProto, node_name: str, opset: int,
                    base_dir: str | None):
    """The plain-Python value of an attribute (see the module docstring for the mapping)."""
    what = f"attribute '{attr.name}' of node '{node_name}' ({node.op_type})"
    if attr.ref_attr_name:
        raise ModelError(f"{what} refers to a function attribute; only plain graphs are supported")
    kind = attr.type
    if kind in _UNSUPPORTED_ATTR_KINDS:
        raise UnsupportedOpError(node.op_type, node_name, opset,
                                 detail=f"attribute '{attr.name}' is {_UNSUPPORTED_ATTR_KINDS[kind]}, "
                                        f"which opfuse does not support")
    try:
        if kind == AttributeProto.FLOAT:
            return float(attr.f)
        if kind == AttributeProto.INT:
            return int(attr.i)
        if kind == AttributeProto.STRING:
            return attr.s.decode("utf-8")
        if kind == AttributeProto.FLOATS:
            return [float(x) for x in attr.floats]
        if kind == AttributeProto.INTS:
            return [int(x) for x in attr.ints]
        if kind == AttributeProto.STRINGS:
            return [s.decode("utf-8") for s in attr.strings]
    except UnicodeDecodeError:
        raise ModelError(f"{what} is not valid UTF-8 text") from None
    if kind == AttributeProto.TENSOR:
        return tensor_to_array(attr.t, base_dir, what)
    if kind == AttributeProto.SPARSE_TENSOR:
        return sparse_to_array(attr.sparse_tensor, base_dir, what)
    if kind == AttributeProto.GRAPH:
        return attr.g
    if kind == AttributeProto.TYPE_PROTO:
        return attr.tp
    raise ModelError(f"{what} has no valid type (AttributeProto type {kind})")


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The subgraphs a node carries as attributes (If's branches, Loop's and Scan's body)."""
    graphs = [a.g for a in node.attribute if a.type == AttributeProto.GRAPH]
    return graphs + [g for a in node.attribute if a.type == AttributeProto.GRAPHS for g in a.graphs]


def outer_reads(node: onnx.NodeProto) -> list[str]:
    """The values of the enclosing graph that ``node``'s subgraphs read (at any depth), in the
    order first read: a subgraph sees every value of the scopes around it, and these implicit
    inputs must be defined before the node runs."""
    found: dict[str, None] = {}
    for g in subgraphs(node):
        for name in _graph_reads(g):
            found.setdefault(name, None)
    return list(found)


def _graph_reads(g: onnx.GraphProto) -> list[str]:
    defined = {vi.name for vi in g.input} | {t.name for t in g.initializer} | \
        {st.values.name for st in g.sparse_initializer}
    found: dict[str, None] = {}
    for n in g.node:
        for name in list(n.input) + outer_reads(n):
            if name and name not in defined:
                found.setdefault(name, None)
        defined.update(o for o in n.output if o)
    for o in g.output:
        if o.name not in defined:
            found.setdefault(o.name, None)
    return list(found)


def make_attribute(key: str, value, attr_type: int) -> AttributeProto:
    """An ``AttributeProto`` of the schema's ``attr_type`` (so ``alpha=1`` becomes a float)."""
    attr = AttributeProto(name=key, type=AttributeProto.AttributeType.ValueType(attr_type))
    if attr_type == AttributeProto.FLOAT:
        attr.f = float(value)
    elif attr_type == AttributeProto.INT:
        attr.i = int(value)
    elif attr_type == AttributeProto.STRING:
        attr.s = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    elif attr_type == AttributeProto.TENSOR:
        attr.t.CopyFrom(array_to_tensor(np.asarray(value), ""))
    elif attr_type == AttributeProto.FLOATS:
        attr.floats.extend(float(v) for v in _as_list(value))
    elif attr_type == AttributeProto.INTS:
        attr.ints.extend(int(v) for v in _as_list(value))
    elif attr_type == AttributeProto.STRINGS:
        attr.strings.extend(v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in _as_list(value))
    else:
        raise ModelError(f"cannot write attribute '{key}' of ONNX type "
                         f"{AttributeProto.AttributeType.Name(attr_type)}")
    return attr


def _as_list(value) -> list:
    if isinstance(value, np.ndarray):
        return value.reshape(-1).tolist()
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__
