"""Shared checks for ops imported as ordinary ops (Einsum, DFT/STFT, data-dependent shapes):
the ONNX reference (``onnx.reference.ReferenceEvaluator``) is the yardstick; opfuse's reference
executor, the fused C build and the portable C99 build (``simd="none"``) must match it."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from opfuse.codegen.options import CodegenOptions
from opfuse.compiler import CompileOptions, build_native, plan_model
from opfuse.frontend.onnx import import_model
from opfuse.runtime.reference import run


def one_node_model(op: str, inputs: dict, attrs: dict | None = None, opset: int = 21, n_outputs: int = 1,
                   initializers: dict | None = None) -> onnx.ModelProto:
    """A model of one ``op`` node; ``inputs`` maps graph-input names to example arrays (their
    shapes and types), ``initializers`` names constant operands."""
    initializers = initializers or {}
    names = list(inputs) + list(initializers)
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
           for k, v in inputs.items()]
    inits = [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in initializers.items()]
    g = helper.make_graph([node], "g", vis, [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None)
                                             for o in outs], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    return m


def check_against_onnx_reference(m: onnx.ModelProto, feeds: dict, rtol: float = 1e-5, atol: float = 1e-5,
                                 c: bool = True):
    """Every output of opfuse's reference run, and (``c``) of the fused C and portable C builds,
    equals ``onnx.reference`` within ``rtol``/``atol`` (shapes and dtypes exactly). Returns the
    imported graph and the fusion plan (``None`` without ``c``)."""
    want = ReferenceEvaluator(m).run(None, feeds)
    names = [o.name for o in m.graph.output]
    g = import_model(m)
    runs = {"reference": run(g, feeds)}
    plan = None
    if c:
        comp = plan_model(m, CompileOptions())
        plan = comp.plan
        runs["C"] = build_native(comp).run(feeds)
        runs["portable C"] = build_native(comp, codegen_options=CodegenOptions(simd="none")).run(feeds)
    for backend, got in runs.items():
        for name, w in zip(names, want, strict=True):
            w = np.asarray(w)
            assert got[name].shape == w.shape, (backend, name, got[name].shape, w.shape)
            assert got[name].dtype == w.dtype, (backend, name, got[name].dtype, w.dtype)
            np.testing.assert_allclose(got[name], w, rtol=rtol, atol=atol, err_msg=f"{backend}: {name}")
    return g, plan
