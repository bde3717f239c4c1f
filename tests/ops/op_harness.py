"""Helpers for the op unit tests: run one op through opfuse, or through ONNX's reference.

``run_op`` builds a one-node Graph with ``GraphBuilder`` (so shape inference and the
verifier run), executes it with the reference executor and checks that the computed
outputs have exactly the inferred shapes and dtypes. ``onnx_ref`` runs the same node with
``onnx.reference.ReferenceEvaluator``, the independent oracle.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from opfuse.ops import GraphBuilder
from opfuse.runtime.reference import run

ONNX_OPSET = 18


def build_op(op_type: str, inputs: Sequence[np.ndarray | None], *, consts: Sequence[int] = (),
             num_outputs: int = 1, name: str = "node0", **attrs):
    """A one-node graph; inputs whose index is in ``consts`` become constants."""
    b = GraphBuilder(f"test_{op_type}")
    args = []
    for i, x in enumerate(inputs):
        if x is None:
            args.append(None)
        elif i in consts:
            args.append(b.const(f"c{i}", x))
        else:
            args.append(b.input(f"x{i}", np.shape(x), np.asarray(x).dtype))
    out = b.op(op_type, *args, name=name, num_outputs=num_outputs, **attrs)
    outs = out if isinstance(out, tuple) else (out,)
    return b.build(*outs)


def run_op(op_type: str, inputs: Sequence[np.ndarray | None], *, consts: Sequence[int] = (),
           num_outputs: int = 1, **attrs) -> list[np.ndarray]:
    g = build_op(op_type, inputs, consts=consts, num_outputs=num_outputs, **attrs)
    feeds = {f"x{i}": x for i, x in enumerate(inputs) if x is not None and i not in consts}
    res = run(g, feeds)
    outs = [res[v.name] for v in g.outputs]
    for v, r in zip(g.outputs, outs, strict=True):
        assert r.shape == v.shape, f"{op_type}: computed {r.shape}, inferred {v.shape}"
        assert r.dtype == v.dtype, f"{op_type}: computed {r.dtype}, inferred {v.dtype}"
    return outs


def run1(op_type: str, *inputs, consts: Sequence[int] = (), **attrs) -> np.ndarray:
    return run_op(op_type, list(inputs), consts=consts, **attrs)[0]


def onnx_ref(op_type: str, inputs: Sequence[np.ndarray | None], *, num_outputs: int = 1,
             opset: int = ONNX_OPSET, **attrs) -> list[np.ndarray]:
    """Run one ONNX node (ONNX operand forms, e.g. axes as inputs) in ONNX's reference."""
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"y{i}" for i in range(num_outputs)], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), np.shape(x))
         for n, x in zip(names, inputs, strict=True) if x is not None],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(num_outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: np.asarray(x) for n, x in zip(names, inputs, strict=True) if x is not None}
    return list(ReferenceEvaluator(model).run(None, feeds))


def ort_ref(op_type: str, inputs: Sequence[np.ndarray | None], *, num_outputs: int = 1,
            opset: int = ONNX_OPSET, **attrs) -> list[np.ndarray]:
    """Like ``onnx_ref`` but in onnxruntime, for the few cases where ONNX's reference is wrong."""
    import pytest
    ort = pytest.importorskip("onnxruntime")
    names = [f"x{i}" if x is not None else "" for i, x in enumerate(inputs)]
    node = helper.make_node(op_type, names, [f"y{i}" for i in range(num_outputs)], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(x).dtype), np.shape(x))
         for n, x in zip(names, inputs, strict=True) if x is not None],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(num_outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {n: np.asarray(x) for n, x in zip(names, inputs, strict=True) if x is not None})


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def tensor_attr(a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a))
