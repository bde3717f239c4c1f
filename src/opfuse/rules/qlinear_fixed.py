"""``qlinear_fixed_point``: the float requantization of an int32 accumulator, as the importer writes a QOperator
model's ``QLinearConv`` / ``QLinearMatMul`` / ``QGemm`` (``frontend/onnx_quantized``, ``onnx_qoperator``:
onnxruntime's arithmetic, bit-exact), as one fixed-point ``Requantize``.

The imported chain reads

    acc (int32: Conv / MatMul [+ bias]) -> Cast(float32) -> Mul(m) -> Round -> [Add(yz)] -> Clip(lo, hi)
        -> Cast(int8 | uint8) -> y_q

with ``m`` a constant (per tensor, or one per output channel broadcast along one axis) and the clamp the
8-bit type's range; the rule puts ``Requantize(acc, multiplier, shift; yz, lo, hi)`` in its place, the
multiplier and shift per element of ``m`` (``fixed_point_multiplier``). The integer kernels (``qconv``,
``qdepthwise``, ``qmatmul`` on the host and the Cortex-M7) take an int32 Conv / MatMul with a ``Requantize``
epilogue, as ``integer_conv`` writes it for a QDQ model, so the QOperator form reaches the same kernels instead
of a float epilogue (on the M7: float32 multiply, round and clamp per output element).

This is the one place a QOperator model leaves onnxruntime's integers: ``round(acc * m)`` in float32 and the
31-bit fixed-point product differ only where ``acc * m`` lies within a few float32 ulps of a rounding tie, by
one step (``ops/quantized``). It runs in the fused build (default: the integer kernels are what the fused
build is for); ``--disable qlinear_fixed_point`` keeps the float requantization and with it the bit-exact
result, and the unfused build (``--no-fuse``) never runs it. The decision log names every rewrite.
Conditions, each refusal with its reason: the accumulator int32, the multiplier a positive finite float32
constant within the fixed-point range, the zero point an integer constant of one value, the clamp the output
type's full range, the chain's intermediates read only inside it.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from opfuse.errors import InputError
from opfuse.frontend.onnx_import_context import OnnxNode
from opfuse.frontend.onnx_writer import write_onnx_nodes
from opfuse.ir.graph import Value
from opfuse.ops.quantized import fixed_point_multiplier
from opfuse.patterns import Op
from opfuse.rules.rule import Rule, Subgraph

QLINEAR_FIXED_POINT = "qlinear_fixed_point"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
QUANT_RANGES = {t: (int(np.iinfo(t).min), int(np.iinfo(t).max)) for t in EIGHT_BIT}
PRIORITY = 1.0


def pattern():
    """``Cast -> Mul -> Round -> [Add] -> Clip -> Cast``."""
    return Op("Cast").named("to_float") >> Op("Mul").named("scale") >> Op("Round").named("round") \
        >> Op("Add").named("zp").opt() >> Op("Clip").named("clip") >> Op("Cast").named("q")


def _const_operand(node, other: Value) -> np.ndarray | None:
    """The constant operand of a two-operand ``node`` whose other operand is ``other``."""
    ins = node.inputs
    if len(ins) != 2 or any(v is None for v in ins):
        return None
    c = ins[1] if ins[0] is other else ins[0] if ins[1] is other else None
    return None if c is None or c.const is None else np.asarray(c.const)


def _escapes(m) -> bool:
    inside = {id(n) for n in m.nodes}
    last = m["q"]
    return any(v in m.graph.outputs or any(id(u) not in inside for u, _ in v.uses)
               for n in m.nodes if n is not last for v in n.outputs)


def _match(m) -> dict | str:
    cast, mul, clip, q = m["to_float"], m["scale"], m["clip"], m["q"]
    acc = cast.input(0)
    if acc is None or acc.dtype != np.int32 or cast.outputs[0].dtype != np.float32:
        return "not the float requantization of an int32 accumulator"
    target = q.outputs[0].dtype
    if target not in EIGHT_BIT:
        return "the result is not quantized to int8 or uint8"
    if _escapes(m):
        return "an intermediate of the requantization is read outside it"
    mult = _const_operand(mul, cast.outputs[0])
    if mult is None or mult.dtype != np.float32 or not np.all(np.isfinite(mult)) or np.any(mult <= 0):
        return "the multiplier is not a positive float32 constant"
    shape = mult.shape
    if len(shape) > len(acc.shape) or sum(d != 1 for d in shape) > 1:
        return "the multiplier is neither per tensor nor per channel"
    zp = 0
    add = m.get("zp")
    add = (add[0] if add else None) if isinstance(add, list) else add
    if add is not None:
        z = _const_operand(add, m["round"].outputs[0])
        if z is None or z.size != 1 or float(z.reshape(())) != round(float(z.reshape(()))):
            return "the zero point is not one integer constant"
        zp = int(float(z.reshape(())))
    bounds = [v.const for v in clip.inputs[1:] if v is not None and v.const is not None]
    lo, hi = QUANT_RANGES[target]
    if len(bounds) != 2 or (float(bounds[0]), float(bounds[1])) != (lo, hi) or not lo <= zp <= hi:
        return "the clamp is not the output type's range"
    try:
        pairs = [fixed_point_multiplier(float(v)) for v in mult.ravel()]
    except InputError as e:
        return str(e)
    return {"acc": acc, "zp": zp, "lo": lo, "hi": hi, "target": target,
            "multiplier": np.array([p[0] for p in pairs], np.int32).reshape(shape),
            "shift": np.array([p[1] for p in pairs], np.int32).reshape(shape)}


def refusal(m) -> str | None:
    got = _match(m)
    return got if isinstance(got, str) else None


def _action(m):
    found = _match(m)
    if isinstance(found, str):
        return found
    graph, q = m.graph, m["q"]
    target, acc = q.outputs[0], found["acc"]
    base = m["to_float"].name
    names = [acc.name, f"{base}_multiplier", f"{base}_shift"]
    inputs: dict = {acc.name: acc, names[1]: found["multiplier"], names[2]: found["shift"]}
    attrs = {"zero_point": found["zp"], "lo": found["lo"], "hi": found["hi"],
             "to": int(helper.np_dtype_to_tensor_dtype(found["target"]))}
    op = OnnxNode(q.name, "Requantize", 1, names, [target.name], attrs)
    gone_values = {v.name for n in m.nodes for v in n.outputs}
    scratch, env = write_onnx_nodes([op], inputs, opset=graph.opset,
                                    reserved_values=set(graph.values) - gone_values,
                                    reserved_nodes={n.name for n in graph.nodes} - {n.name for n in m.nodes})
    reason = "Cast -> Mul -> Round -> Add -> Clip -> Cast (float requantization of an int32 accumulator) as one " \
        "fixed-point Requantize (within one step of the float form)"
    return Subgraph(scratch, {acc.name: acc}, env[target.name], reason=reason, name=q.name)


QLINEAR_FIXED_POINT_RULE = Rule(
    QLINEAR_FIXED_POINT, pattern(), condition=refusal, action=_action, priority=PRIORITY, kind="requantize",
    description="int32 accumulator -> Cast -> Mul(m) -> Round -> [Add(zero point)] -> Clip -> Cast(8-bit) (a "
                "QOperator model's float requantization) -> one fixed-point Requantize")

__all__ = ["QLINEAR_FIXED_POINT", "QLINEAR_FIXED_POINT_RULE"]
