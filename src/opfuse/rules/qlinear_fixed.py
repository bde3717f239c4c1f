"""``qlinear_fixed_point`` and ``qlinear_add_float32``: a QOperator model's integer arithmetic as the fused integer
kernels of a QDQ model take it (both in the pipeline's first stage, ``recognize_integer``).

``qlinear_fixed_point``: the float requantization of an int32 accumulator, as the importer writes a QOperator
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

``qlinear_add_float32``: ``onnx_qoperator`` writes QLinearAdd as MLAS's fused multiply-adds, exactly, in float64
(``c = rint(fma(a, ra, fma(b, rb, k)))``); the part that reads ``b`` alone is a float64 chain that the fusion
rules hand to ``b``'s producer (which would then write float64). The rule writes it as a QDQ model's residual
Add in float32, ``rint(a * ra + (b - zb') * rb)`` with ``zb' = -k / rb``: two dequantizations (``Cast -> [Sub]
-> Mul``, which ``dequantize_prologue`` gives to their reader) and a quantization, so the Add joins the kernel
of the conv that produced ``a`` (conv, fixed-point Requantize and the residual Add in one kernel, the tensors
between kernels 8-bit) as in the QDQ form. Float32 rounding against MLAS's fmas: within one step. Operands of
one shape only (onnxruntime folds a broadcast scalar operand into ``k`` first); ``--disable
qlinear_add_float32`` keeps the bit-exact form.
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
from opfuse.rules.rule import Rule, Subgraph, refusal_of

QLINEAR_FIXED_POINT = "qlinear_fixed_point"
QLINEAR_ADD_FLOAT32 = "qlinear_add_float32"
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


refusal = refusal_of(_match)


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


# qlinear_add_float32 ---------------------------------------------------------------------------

def add_pattern():
    """``Cast(a, float64) -> Mul(ra) -> Add(inner) -> Cast(float32) -> Round -> Clip -> Cast``: the outer fma of
    ``onnx_qoperator``'s QLinearAdd."""
    return Op("Cast").named("a_cast") >> Op("Mul").named("a_mul") >> Op("Add").named("sum") \
        >> Op("Cast").named("to_f32") >> Op("Round").named("round") >> Op("Clip").named("clip") >> Op("Cast").named("q")


def _single_use(v: Value | None) -> bool:
    return v is not None and len(v.uses) == 1


def _add_match(m) -> dict | str:
    """``a``, ``b``, ``ra``, ``rb``, ``k`` and the clamp of a QLinearAdd as the importer writes it, or why not."""
    not_it = "not a QLinearAdd as the importer writes it"
    a_cast, a_mul, add, q = m["a_cast"], m["a_mul"], m["sum"], m["q"]
    a = a_cast.input(0)
    if a is None or a.dtype not in EIGHT_BIT or a_cast.outputs[0].dtype != np.float64:
        return not_it
    ra = _const_operand(a_mul, a_cast.outputs[0])
    inner = add.inputs[1] if add.inputs[0] is a_mul.outputs[0] else add.inputs[0]
    chain = []  # Cast(f64) <- Cast(f32) <- Add(k) <- Mul(rb) <- Cast(b, f64)
    v = inner
    for op in ("Cast", "Cast", "Add", "Mul", "Cast"):
        n = v.producer if _single_use(v) else None
        if n is None or n.op_type != op:
            return not_it
        chain.append(n)
        v = n.input(0) if op == "Cast" else next((x for x in n.inputs if x is not None and x.const is None), None)
    b = v
    k = _const_operand(chain[2], chain[3].outputs[0])
    rb = _const_operand(chain[3], chain[4].outputs[0])
    if b is None or b.dtype != a.dtype or ra is None or rb is None or k is None or any(
            c.size != 1 for c in (ra, rb, k)) or _escapes(m):
        return not_it
    if a.shape != b.shape:
        return "the operands broadcast (onnxruntime folds the scalar one differently)"
    bounds = [x.const for x in m["clip"].inputs[1:] if x is not None and x.const is not None]
    if q.outputs[0].dtype != a.dtype or len(bounds) != 2 or \
            (float(bounds[0]), float(bounds[1])) != QUANT_RANGES[a.dtype]:
        return "the clamp is not the output type's range"
    return {"a": a, "b": b, "ra": float(ra.reshape(())), "rb": float(rb.reshape(())), "k": float(k.reshape(())),
            "chain": chain}


add_refusal = refusal_of(_add_match)


def _add_action(m):
    found = _add_match(m)
    if isinstance(found, str):
        return found
    graph, q = m.graph, m["q"]
    a, b, target = found["a"], found["b"], q.outputs[0]
    base = m["sum"].name
    f32 = int(helper.np_dtype_to_tensor_dtype(np.dtype(np.float32)))
    to = int(helper.np_dtype_to_tensor_dtype(target.dtype))
    lo, hi = QUANT_RANGES[target.dtype]
    c = {f"{base}_ra": np.array(found["ra"], np.float32), f"{base}_rb": np.array(found["rb"], np.float32),
         f"{base}_b_zero": np.array(-found["k"] / found["rb"], np.float32),
         f"{base}_lo": np.array(lo, np.float32), f"{base}_hi": np.array(hi, np.float32)}
    ra, rb, bz, lo_n, hi_n = c
    t = [f"{base}/{s}" for s in ("a_f", "a_s", "b_f", "b_c", "b_s", "sum", "round", "clip")]
    ops = [OnnxNode(t[0], "Cast", 1, [a.name], [t[0]], {"to": f32}),
           OnnxNode(t[1], "Mul", 1, [t[0], ra], [t[1]]),
           OnnxNode(t[2], "Cast", 1, [b.name], [t[2]], {"to": f32}),
           OnnxNode(t[3], "Sub", 1, [t[2], bz], [t[3]]),
           OnnxNode(t[4], "Mul", 1, [t[3], rb], [t[4]]),
           OnnxNode(t[5], "Add", 1, [t[1], t[4]], [t[5]]),
           OnnxNode(t[6], "Round", 1, [t[5]], [t[6]]),
           OnnxNode(t[7], "Clip", 1, [t[6], lo_n, hi_n], [t[7]]),
           OnnxNode(q.name, "Cast", 1, [t[7]], [target.name], {"to": to})]
    inputs: dict = {a.name: a, b.name: b, **c}
    gone = list(m.nodes) + found["chain"]
    gone_values = {v.name for n in gone for v in n.outputs}
    scratch, env = write_onnx_nodes(ops, inputs, opset=graph.opset, reserved_values=set(graph.values) - gone_values,
                                    reserved_nodes={n.name for n in graph.nodes} - {n.name for n in gone})
    reason = "QLinearAdd (float64 fma form, bit-exact) as a QDQ residual Add in float32 (dequantize, add, " \
        "quantize; within one step)"
    return Subgraph(scratch, {a.name: a, b.name: b}, env[target.name], reason=reason, name=q.name,
                    absorbs=tuple(n.name for n in found["chain"]))


QLINEAR_ADD_FLOAT32_RULE = Rule(
    QLINEAR_ADD_FLOAT32, add_pattern(), condition=add_refusal, action=_add_action, priority=PRIORITY,
    kind="elementwise",
    description="a QOperator QLinearAdd's bit-exact float64 form -> the float32 dequantize-add-quantize of a QDQ "
                "residual Add, so it joins the producing conv's kernel")

__all__ = ["QLINEAR_FIXED_POINT", "QLINEAR_FIXED_POINT_RULE", "QLINEAR_ADD_FLOAT32", "QLINEAR_ADD_FLOAT32_RULE"]
