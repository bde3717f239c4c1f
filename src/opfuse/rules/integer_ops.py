"""``integer_conv`` and ``integer_matmul``: a QDQ model's float Conv / Gemm / MatMul between dequantized
8-bit tensors and a quantization of its result is the integer op it stands for (and, where its result stays
float, ``integer_conv_dequantized`` / ``integer_matmul_dequantized``: the integer op dequantized once).

A QDQ model imported (``onnx_decompose``; the importer keeps a dequantized *constant* as
``Cast -> Sub -> Mul`` over the integer constant for these rules) reads

    x_q -> Cast -> Sub(xz) -> Mul(xs) ----------------+
    W_q -> Cast -> Sub(wz) -> Mul(ws)   (per tensor or -+-> Conv -> [Add(r_q -> Cast -> Sub(rz) -> Mul(rs))]
           per output channel)                        |        -> [Relu] -> Div(ys) -> Round -> Add(yz)
    B_q -> Cast -> Sub(0) -> Mul(xs * ws) (optional) -+        -> Clip(lo, hi) -> Cast(int8 | uint8) -> y_q

and ``integer_conv`` rewrites the match ``Conv -> [Add] -> [Relu] -> Div -> Round -> Add -> Clip -> Cast``
into what ``QLinearConv(x_q, xs, xz, W_q, ws, wz, ys, yz, B_q)`` with the fixed-point requantization is
(``frontend/onnx_quantized``): ``Cast -> Sub(xz)`` centring the 8-bit input, an int32 Conv over the
centred int32 weight, the int32 bias Add and one ``Requantize`` (multiplier and shift per output
channel; a residual's centred 8-bit tensor and its own multiplier as a second term; a Relu as the
clamp's lower bound at the zero point: ``Q(Relu(y)) = max(Q(y), yz)``, Q being monotone with
``Q(0) = yz``). The ops are written by the importer's own QLinearConv definition
(``frontend/onnx_writer``), so the integer graph is the one onnx_quantized defines, names included.
This is the float model's arithmetic in integers, as onnxruntime fuses the same pattern: the float
path rounds the float32 convolution of dequantized values, the integer one is exact, so the two differ
by at most one quantization step where a value lies near a rounding tie. The rewrite is a fusion: the
unfused build keeps the float QDQ graph, which is the oracle.

``integer_matmul`` does the same for ``Gemm | MatMul -> [Add(bias)] -> [Add(residual)] -> [Relu] -> quantize``
(the two Adds in either order; the residual as the conv's, a second term of the Requantize) whose input
is ``DQ(a_q)`` or ``Flatten/Reshape(DQ(a_q))`` (a classifier's fc: the quantizer leaves the Flatten
between the pool's DQ and the Gemm, one per-tensor scale on either side): ``QLinearMatMul`` of the
Flatten/Reshape of the 8-bit tensor and the weight as ``K x N`` (a Gemm's ``transB`` applied to the
constant), the int32 bias a ninth input, requantized per output column. A Gemm needs ``alpha = beta
= 1`` and no ``transA``, the input a matrix, the weight per tensor or per output column. A MatMul's
input may be a batch of matrices (``[..., M, K]``, a transformer's ``[1, S, H]``) times the one weight:
that is the product of its rows flattened into one matrix, so the rewrite reshapes the 8-bit input to
``[prod(...) M, K]`` before the ``QLinearMatMul`` (a residual's rows too) and its 8-bit result back after it
(data movement on 8-bit tensors, no arithmetic).

``integer_matmul_dequantized`` takes a product of the same operands that is *not* quantized after it
(``Gemm | MatMul -> [Add(int32 bias)]`` read as float: a classifier's logits, a transformer's FFN before
its GELU): ``MatMulInteger`` of the 8-bit input and weight, the int32 bias, a ``Cast`` to float and one
multiply by ``x_scale * w_scale`` (per tensor or per column: the bias's own scale). The float path sums
float32 products; the integer one is exact and rounds once, so the two differ by float rounding. Its
pattern only admits float products of two dequantizations whose result no quantization reads (those are
``integer_matmul``'s), so other MatMuls are not refused in the log.

``integer_conv_dequantized`` takes a Conv of the same operands whose float result no quantization reads the way
``integer_conv`` takes it (an activation the quantizer leaves in float before quantizing: YOLO's SiLU, a
HardSwish, a Sigmoid; a graph output; a second reader): ``ConvInteger`` of the 8-bit input and weight, the int32
bias (one value per output channel), a ``Cast`` to float and one multiply by ``x_scale * w_scale`` per output
channel; the activation and whatever follows stay as they are. The host GEMM runs that Cast and multiply in its
epilogue in place of a Requantize (``codegen/qgemm.py``).

Conditions, each refusal with its reason (the wording of the importer's former recognizer): the
scales and zero points constants, the activations per tensor, the weight an int8 or uint8 constant
quantized per tensor or along its output channels, the bias (if any) an int32 constant with zero
point 0 and scale ``xs * ws`` (to ``BIAS_SCALE_RTOL``), the quantization per tensor to 8 bits; the
pattern's *only used by* keeps every intermediate inside the match. The stage runs them only on a
graph that quantizes somewhere (a Cast to 8 bits), as a float model has nothing for them.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from opfuse.frontend.dequantized import Dequantized, dequantized
from opfuse.frontend.onnx_import_context import OnnxNode
from opfuse.frontend.onnx_writer import write_onnx_nodes
from opfuse.ir.graph import Node, Value
from opfuse.patterns import Op, check
from opfuse.rules.rule import Rule, Subgraph, refusal_of

INTEGER_CONV = "integer_conv"
INTEGER_MATMUL = "integer_matmul"
INTEGER_MATMUL_DEQUANTIZED = "integer_matmul_dequantized"
INTEGER_CONV_DEQUANTIZED = "integer_conv_dequantized"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
QUANT_RANGES = {np.dtype(t): (np.iinfo(t).min, np.iinfo(t).max) for t in (np.int8, np.uint8)}
BIAS_SCALE_RTOL = 1e-6  # the bias scale must be xs * ws to float32 rounding
MATMUL_OPS = ("Gemm", "MatMul")
ADDS_A_TENSOR = ("the Add after the product adds a dequantized 8-bit tensor (a residual), not an int32 constant "
                 "bias: a product left in float adds a bias only (a quantized one takes the residual)")
ONLY_READER = "the product is not quantized by its only reader (through a bias Add, a residual Add and a Relu at most)"
RESHAPES = ("Flatten", "Reshape")
QLINEAR_VERSION = 10  # QLinearConv / QLinearMatMul's since_version
PRIORITY = 1.0  # the two never claim the same ops


def _per(d: Dequantized, param: np.ndarray | None, axis: int, length: int) -> bool:
    """``param`` of ``d`` is one value, or one per index of ``axis`` (of ``length``)."""
    return param is None or param.size == 1 or (param.shape == (length,) and d.axis == axis)


def _int32_bias(value: Value | None, shapes: tuple[tuple[int, ...], ...], per: str, x: Dequantized,
                w: Dequantized) -> Dequantized | str:
    """The dequantized bias ``value`` if it is what the integer op adds as it is (an int32 constant of one value
    per output ``per`` in one of ``shapes``, zero point 0, scale ``xs * ws``), else the refusal's reason."""
    b = dequantized(value, "the bias")
    if isinstance(b, str):
        return b
    if b.q.const is None or b.q.dtype != np.int32 or b.q.shape not in shapes:
        return f"the bias is not an int32 constant of one value per output {per}"
    if b.zero is not None and np.any(b.zero != 0):
        return "the bias has a non-zero zero point"
    return _bias_scale_reason(b.scale, x.scale, w.scale) or b


def _bias_scale_reason(bs: np.ndarray, xs: np.ndarray, ws: np.ndarray) -> str | None:
    want = (np.float32(xs.reshape(())) * ws.astype(np.float32)).astype(np.float64)
    if not np.allclose(bs.astype(np.float64), np.broadcast_to(want, bs.shape), rtol=BIAS_SCALE_RTOL, atol=0):
        return "the bias scale is not input scale x weight scale"
    return None


def _one(m, key: str) -> Node | None:
    got = m.get(key)
    if isinstance(got, list):
        return got[0] if got else None
    return got


def _quantized(m) -> tuple[np.ndarray, np.ndarray] | str:
    """``(ys, yz)`` of the match's quantization (Div -> Round -> Add -> Clip -> Cast), or why it is not
    one per tensor to 8 bits with constant parameters."""
    bad = "the output is not quantized per tensor to int8 or uint8 with constant parameters"
    div, add, clip, q = m["div"], _one(m, "zp"), m["clip"], m["q"]
    target = q.outputs[0].dtype
    ys = div.inputs[1] if len(div.inputs) == 2 else None
    if target not in EIGHT_BIT or add is None or ys is None or ys.const is None or ys.size != 1:
        return bad
    zps = [v for v in add.input_values() if v.is_const]
    if len(zps) != 1 or zps[0].size != 1:
        return bad
    bounds = [v.const for v in clip.inputs[1:] if v is not None and v.const is not None]
    if len(bounds) != 2 or (float(bounds[0]), float(bounds[1])) != tuple(float(b) for b in QUANT_RANGES[target]):
        return bad
    return np.asarray(ys.const), np.asarray(zps[0].const).astype(target)


def quantize_tail():
    """``Div(scale) -> Round -> Add(zero point) -> Clip -> Cast``: a QuantizeLinear as imported."""
    return Op("Div").named("div") >> Op("Round") >> Op("Add").named("zp").opt() >> Op("Clip").named("clip") \
        >> Op("Cast").named("q")


# integer_conv ----------------------------------------------------------------------------------

def conv_pattern():
    """``Conv -> [Add] -> [Relu] -> Div -> Round -> [Add] -> Clip -> Cast``; the Conv, Add and Relu may have
    other readers (``keep``), so that the condition refuses such a match with its reason."""
    return Op("Conv").named("conv").keep() >> Op("Add").named("residual").keep().opt() \
        >> Op("Relu").named("relu").keep().opt() >> quantize_tail()


def _escapes(m, keys: tuple[str, ...]) -> bool:
    """Is the output of a captured node (other than the last) read outside the match or a graph output?"""
    inside = {id(n) for n in m.nodes}
    for key in keys:
        n = _one(m, key)
        if n is not None and any(v in m.graph.outputs or any(id(u) not in inside for u, _ in v.uses)
                                 for v in n.outputs):
            return True
    return False


def _conv_match(m) -> dict | str:
    """The operands of the integer conv at ``m``, or the reason it is not one."""
    conv = m["conv"]
    if len(conv.inputs) < 2 or conv.inputs[1] is None:
        return "not a Conv with a weight"
    if _escapes(m, ("conv", "residual", "relu")):
        return "the Conv's output is not quantized by its only reader (through a residual Add and a Relu at most)"
    found = _conv_operands(conv)
    if isinstance(found, str):
        return found
    residual = None
    add = _one(m, "residual")
    if add is not None:
        ins = add.inputs
        if len(ins) != 2 or ins[0] is ins[1]:
            return "the residual is not the output of a DequantizeLinear"
        other = ins[1] if ins[0] is conv.outputs[0] else ins[0]
        r = dequantized(other, "the residual")
        if isinstance(r, str):
            return r
        if r.scale.size != 1 or r.zero is None or r.zero.size != 1 or r.q.dtype not in EIGHT_BIT:
            return "the residual is not quantized per tensor to int8 or uint8 with a zero point"
        if other is None or other.shape != conv.outputs[0].shape:
            return "the residual's shape is not known to be the Conv's output shape"
        residual = r
    tail = _quantized(m)
    if isinstance(tail, str):
        return tail
    return {**found, "residual": residual, "y": tail}


def _conv_operands(conv: Node) -> dict | str:
    """``{"x", "w", "bias"}`` of a Conv of a dequantized 8-bit input (per tensor, with a zero point) and a
    dequantized 8-bit constant weight (per tensor or per output channel), the bias an int32 constant at scale
    ``xs * ws``; or the reason it is not one."""
    x = dequantized(conv.inputs[0], "the input")
    if isinstance(x, str):
        return x
    if x.scale.size != 1 or x.zero is None or x.zero.size != 1 or x.q.dtype not in EIGHT_BIT:
        return "the input is not quantized per tensor with a zero point"
    w = dequantized(conv.inputs[1], "the weight")
    if isinstance(w, str):
        return w
    if w.q.const is None or w.q.dtype not in EIGHT_BIT:
        return "the weight is not an int8 or uint8 constant"
    channels = w.q.shape[0]
    if not (_per(w, w.scale, 0, channels) and _per(w, w.zero, 0, channels)):
        return "the weight is not quantized per tensor or per output channel"
    bias = None
    if len(conv.inputs) > 2 and conv.inputs[2] is not None:
        b = _int32_bias(conv.inputs[2], ((channels,),), "channel", x, w)
        if isinstance(b, str):
            return b
        bias = b.q
    return {"x": x, "w": w, "bias": bias}


conv_refusal = refusal_of(_conv_match)


def _absorbed(m, candidates: list[Node]) -> tuple[str, ...]:
    """The ``candidates`` (dequantizations, a Flatten before the match) read only by the match or by
    candidates left dead themselves: the rewrite leaves them dead, and the new ops stand for them in the
    report. (A chain's Cast is not dead when its Mul has a reader outside: dropped until nothing changes.)"""
    inside = {id(n) for n in m.nodes}
    dead = {id(n) for n in candidates}
    changed = True
    while changed:
        changed = False
        for n in candidates:
            if id(n) in dead and (n.outputs[0] in m.graph.outputs or any(
                    id(u) not in inside and id(u) not in dead for v in n.outputs for u, _ in v.uses)):
                dead.discard(id(n))
                changed = True
    return tuple(n.name for n in candidates if id(n) in dead)


def _write(m, ops: list[OnnxNode], inputs: dict, bound: dict[str, Value], reason: str, name: str,
           absorbs: tuple[str, ...] = (), target: Value | None = None) -> Subgraph:
    """The ops written as the importer writes them, in a scratch graph whose names are fresh against
    the graph without the match (the match's nodes and values go: their names are free again).
    ``target``: the value the ops compute in the match's place (default: the quantization's output)."""
    graph = m.graph
    gone_values = {v.name for n in m.nodes for v in n.outputs}
    gone_nodes = {n.name for n in m.nodes}
    target = target if target is not None else m["q"].outputs[0]
    scratch, env = write_onnx_nodes(ops, inputs, opset=graph.opset,
                                    reserved_values=set(graph.values) - gone_values,
                                    reserved_nodes={n.name for n in graph.nodes} - gone_nodes)
    return Subgraph(scratch, bound, env[target.name], reason=reason, name=name, absorbs=absorbs)


def _params(prefix: str, d: Dequantized, what: str, zero_dtype=None) -> dict:
    """The scale and zero point of ``d`` as arrays named ``prefix``_scale / _zero_point (an absent zero
    point is 0 of ``zero_dtype``: the QLinear ops take every operand)."""
    zero = d.zero if d.zero is not None else np.array(0, zero_dtype or d.q.dtype)
    return {f"{prefix}_{what}_scale": d.scale, f"{prefix}_{what}_zero_point": zero}


def _conv_action(m):
    found = _conv_match(m)
    if isinstance(found, str):
        return found
    conv, q = m["conv"], m["q"]
    target = q.outputs[0]
    x, w, res = found["x"], found["w"], found["residual"]
    ys, yz = found["y"]
    base = conv.outputs[0].name
    inputs: dict = {x.q.name: x.q, w.q.name: w.q}
    bound = {x.q.name: x.q, w.q.name: w.q}
    xp, wp = _params(base, x, "x"), _params(base, w, "w")
    inputs.update(xp)
    inputs.update(wp)
    yp = {f"{base}_y_scale": ys, f"{base}_y_zero_point": yz}
    inputs.update(yp)
    names = [x.q.name, *xp, w.q.name, *wp, *yp]
    if found["bias"] is not None or res is not None:
        names.append(found["bias"].name if found["bias"] is not None else "")
        if found["bias"] is not None:
            inputs[found["bias"].name] = bound[found["bias"].name] = found["bias"]
    if res is not None:
        rp = _params(base, res, "r")
        inputs.update(rp)
        inputs[res.q.name] = bound[res.q.name] = res.q
        names += [res.q.name, *rp]
    relu = _one(m, "relu")
    attrs = {"opfuse_requantize": "fixed", "opfuse_relu": int(relu is not None),
             "opfuse_residual": int(res is not None), **conv.attrs}
    op = OnnxNode(conv.name, "QLinearConv", QLINEAR_VERSION, names, [target.name], attrs)
    parts = ["DequantizeLinear", "Conv"] + (["Add(residual)"] if res is not None else []) \
        + (["Relu"] if relu is not None else []) + ["QuantizeLinear"]
    reason = f"{' -> '.join(parts)} as one integer conv (int32 accumulator, fixed-point Requantize)"
    chains = list(x.nodes) + (list(res.nodes) if res is not None else [])
    return _write(m, [op], inputs, bound, reason, conv.name, _absorbed(m, chains))


INTEGER_CONV_RULE = Rule(
    INTEGER_CONV, conv_pattern(), condition=conv_refusal, action=_conv_action, priority=PRIORITY,
    kind="conv_epilogue",
    description="DequantizeLinear -> Conv -> [Add(residual)] -> [Relu] -> QuantizeLinear -> one integer conv "
                "(int32 accumulator, fixed-point Requantize)")


# The integer ops' tails written by the dequantizing rules (conv and matmul) ------------------------------------

def _bias_add(ops: list[OnnxNode], inputs: dict, name: str, base: str, acc: str, bias: np.ndarray) -> str:
    """Append the int32 bias Add to the accumulator ``acc``; the sum's name."""
    b_name = f"{base}_opfuse_bias"
    inputs[b_name] = bias
    ops.append(OnnxNode(f"{name}_opfuse_bias_add", "Add", 14, [acc, b_name], [f"{acc}_bias"], {}))
    return f"{acc}_bias"


def _dequantize(ops: list[OnnxNode], inputs: dict, name: str, base: str, acc: str, x: Dequantized,
                w_scale: np.ndarray, y_name: str) -> None:
    """Append ``y_name = Cast(acc, float) * (x_scale * w_scale)``: the accumulator dequantized once, ``w_scale`` per
    tensor or shaped to broadcast along the output's channels (columns): the bias's own scale."""
    scale = f"{base}_opfuse_scale"
    # an array even when both scales are per tensor (a NumPy scalar is not a constant to write_onnx_nodes)
    inputs[scale] = np.asarray(np.float32(x.scale.reshape(())) * w_scale, np.float32)
    ops.append(OnnxNode(f"{name}_opfuse_to_float", "Cast", 13, [acc], [f"{acc}_float"], {"to": TensorProto.FLOAT}))
    ops.append(OnnxNode(f"{name}_opfuse_dequantize", "Mul", 14, [f"{acc}_float", scale], [y_name], {}))


# integer_conv_dequantized ----------------------------------------------------------------------

def _dequantized_float_conv(node: Node) -> bool:
    """A float Conv of a dequantized input and a dequantized weight whose result no quantization reads the way
    ``integer_conv`` takes it (through a residual Add and a Relu): the candidates, so that no other Conv is
    refused in the log."""
    out = node.outputs[0]
    if out.dtype != np.float32 or len(node.inputs) < 2 or node.inputs[1] is None:
        return False
    if isinstance(dequantized(node.inputs[0], "the input"), str) \
            or isinstance(dequantized(node.inputs[1], "the weight"), str):
        return False
    return not _quantized_reader(out, (), adds=1)


def conv_dequantized_pattern():
    """``Conv``: a convolution of dequantized 8-bit operands left in float."""
    return Op("Conv").where(check(_dequantized_float_conv, "dequantized_float_conv")).named("conv").keep()


def _conv_dequantized_match(m) -> dict | str:
    """The operands (``_conv_operands``); the pattern's check already left out a Conv a quantization reads."""
    return _conv_operands(m["conv"])


conv_dequantized_refusal = refusal_of(_conv_dequantized_match)


def _conv_dequantized_action(m):
    found = _conv_dequantized_match(m)
    if isinstance(found, str):
        return found
    conv = m["conv"]
    target = conv.outputs[0]
    x, w = found["x"], found["w"]
    name, base = conv.name, target.name
    rank = len(target.shape)
    channels = w.q.shape[0]
    inputs: dict = {x.q.name: x.q, w.q.name: w.q}
    bound = {x.q.name: x.q, w.q.name: w.q}
    xz, wz = f"{base}_x_zero_point", f"{base}_opfuse_w_zero_point"
    inputs[xz] = x.zero
    w_zero = w.zero if w.zero is not None else np.array(0, w.q.dtype)
    inputs[wz] = w_zero.reshape(-1 if w_zero.size > 1 else ())  # ConvInteger's: a scalar or one per channel
    acc = f"{base}_opfuse_acc"
    ops = [OnnxNode(name, "ConvInteger", QLINEAR_VERSION, [x.q.name, w.q.name, xz, wz], [acc], dict(conv.attrs))]
    per_channel = (channels,) + (1,) * (rank - 2)  # broadcast along the output's channel axis
    if found["bias"] is not None:
        acc = _bias_add(ops, inputs, name, base, acc, found["bias"].const.astype(np.int32).reshape(per_channel))
    ws = w.scale.astype(np.float32)
    _dequantize(ops, inputs, name, base, acc, x, ws.reshape(per_channel) if ws.size > 1 else ws.reshape(()),
                target.name)
    parts = ["DequantizeLinear", "Conv"] + (["(int32 bias)"] if found["bias"] is not None else [])
    reason = f"{' -> '.join(parts)} as an integer conv (int32 accumulator) dequantized to float"
    return _write(m, ops, inputs, bound, reason, name, _absorbed(m, list(x.nodes)), target=target)


INTEGER_CONV_DEQUANTIZED_RULE = Rule(
    INTEGER_CONV_DEQUANTIZED, conv_dequantized_pattern(), condition=conv_dequantized_refusal,
    action=_conv_dequantized_action, priority=PRIORITY, kind="conv_epilogue",
    description="DequantizeLinear -> Conv left in float (its output read by an activation, not quantized) -> an "
                "integer conv (int32 accumulator, int32 bias) dequantized to float (x_scale * w_scale per channel)")

# integer_matmul --------------------------------------------------------------------------------

def matmul_pattern():
    """``Gemm | MatMul -> [Add] -> [Add] -> [Relu] -> Div -> Round -> [Add] -> Clip -> Cast``: the Adds a bias
    and a residual, in either order (``_matmul_operands`` tells them apart)."""
    return Op(*MATMUL_OPS).named("mm").keep() >> Op("Add").named("bias_add").keep().opt() \
        >> Op("Add").named("residual_add").keep().opt() >> Op("Relu").named("relu").keep().opt() >> quantize_tail()


def _matmul_match(m) -> dict | str:
    if _escapes(m, ("mm", "bias_add", "residual_add", "relu")):
        return ONLY_READER
    found = _matmul_operands(m, residual=True)
    if isinstance(found, str):
        return found
    tail = _quantized(m)
    if isinstance(tail, str):
        return tail
    return {**found, "y": tail}


def _matmul_operands(m, residual: bool = False) -> dict | str:
    """The integer matmul's operands at ``m`` (input, weight as ``K x N``, int32 bias, and with ``residual`` a
    dequantized 8-bit residual of the product's shape), or why not."""
    mm = m["mm"]
    attrs = mm.attrs
    if mm.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                                 or attrs.get("beta", 1.0) != 1.0):
        return "a Gemm with transA or alpha, beta other than 1"
    a = mm.inputs[0]
    if a is None:
        return "the input is not the output of a DequantizeLinear"
    reshape = a.producer if a is not None and a.producer is not None and a.producer.op_type in RESHAPES else None
    if reshape is not None:  # (a Reshape's shape is a constant: the IR's shapes are static)
        x = dequantized(reshape.inputs[0], "the input")
    else:
        x = dequantized(a, "the input")
    if isinstance(x, str):
        return x
    if x.scale.size != 1 or x.zero is None or x.zero.size != 1 or x.q.dtype not in EIGHT_BIT:
        return "the input is not quantized per tensor with a zero point"
    if len(a.shape) != 2 and (reshape is not None or len(a.shape) < 2):
        return "the input is not known to be a matrix"
    w = dequantized(mm.inputs[1], "the weight")
    if isinstance(w, str):
        return w
    if w.q.const is None or w.q.dtype not in EIGHT_BIT or len(w.q.shape) != 2:
        return "the weight is not an int8 or uint8 constant matrix"
    trans_b = mm.op_type == "Gemm" and bool(attrs.get("transB", 0))
    n_axis = 0 if trans_b else 1
    N = w.q.shape[n_axis]
    for what, v in (("scale", w.scale), ("zero point", w.zero)):
        if not _per(w, v, n_axis, N):
            return f"the weight's {what} is not per tensor or per output column"
    bias_value = mm.inputs[2] if mm.op_type == "Gemm" and len(mm.inputs) > 2 else None
    res = None
    before = mm.outputs[0]
    for add in (_one(m, "bias_add"), _one(m, "residual_add")):
        if add is None:
            continue
        if len(add.inputs) != 2 or add.inputs[0] is add.inputs[1]:
            return ONLY_READER
        other = add.inputs[1] if add.inputs[0] is before else add.inputs[0]
        before = add.outputs[0]
        added = dequantized(other, "the bias")
        if isinstance(added, str):
            return ONLY_READER
        if added.q.const is None:  # a dequantized 8-bit tensor: a residual
            if not residual:
                return ADDS_A_TENSOR
            if res is not None:
                return "two residual Adds after the product"
            if added.scale.size != 1 or added.zero is None or added.zero.size != 1 or added.q.dtype not in EIGHT_BIT:
                return "the residual is not quantized per tensor to int8 or uint8 with a zero point"
            if other is None or other.shape != mm.outputs[0].shape:
                return "the residual's shape is not known to be the product's output shape"
            res = added
            continue
        if bias_value is not None:
            return "a Gemm with a bias and a bias Add after it" if mm.op_type == "Gemm" and len(mm.inputs) > 2 \
                else "two bias Adds after the product"
        bias_value = other
    bias = None
    if bias_value is not None:
        b = _int32_bias(bias_value, ((N,), (1, N), (1,) * (len(a.shape) - 1) + (N,)), "column", x, w)
        if isinstance(b, str):
            return b
        bias = np.asarray(b.q.const).reshape(N)
    w_kn = np.asarray(w.q.const)
    return {"reshape": reshape, "x": x, "w": w, "w_kn": np.ascontiguousarray(w_kn.T if trans_b else w_kn),
            "bias": bias, "rows": tuple(a.shape[:-1]) if len(a.shape) > 2 else None, "residual": res}


def _input_ops(found: dict, name: str, base: str, inputs: dict, bound: dict) -> tuple[list[OnnxNode], str]:
    """The data movement on the 8-bit input before the integer matmul: the match's Flatten/Reshape, or a batch
    of matrices' rows flattened into one matrix; returns the ops and the name of the matrix they give."""
    x, reshape, rows = found["x"], found["reshape"], found["rows"]
    ops = []
    x_name = x.q.name
    if reshape is not None:  # the data movement on the 8-bit tensor (one per-tensor scale either side)
        rest = [v for v in reshape.inputs[1:] if v is not None]
        for v in rest:
            inputs[v.name] = bound[v.name] = v
        x_name = f"{base}_opfuse_input_q"
        ops.append(OnnxNode(f"{name}_opfuse_input_reshape", reshape.op_type, 13 if reshape.op_type == "Flatten"
                            else 14, [x.q.name, *(v.name for v in rest)], [x_name], dict(reshape.attrs)))
    if rows is not None:  # a batch of matrices times one weight: the rows flattened into one matrix, and back
        x_name = f"{base}_opfuse_input_q"
        shape_name = f"{base}_opfuse_input_shape"
        inputs[shape_name] = np.array([int(np.prod(rows)), x.q.shape[-1]], np.int64)
        ops.append(OnnxNode(f"{name}_opfuse_input_reshape", "Reshape", 14, [x.q.name, shape_name], [x_name], {}))
    return ops, x_name


matmul_refusal = refusal_of(_matmul_match)


def _matmul_action(m):
    found = _matmul_match(m)
    if isinstance(found, str):
        return found
    mm, q = m["mm"], m["q"]
    target = q.outputs[0]
    x, w = found["x"], found["w"]
    ys, yz = found["y"]
    name, base = mm.name, mm.outputs[0].name
    inputs: dict = {x.q.name: x.q}
    bound = {x.q.name: x.q}
    ops, x_name = _input_ops(found, name, base, inputs, bound)
    rows, reshape = found["rows"], found["reshape"]
    xp = _params(base, x, "x")
    w_name = f"{base}_opfuse_weight_kn"
    wp = {f"{base}_w_scale": w.scale,
          f"{base}_opfuse_w_zero_point": w.zero if w.zero is not None else np.array(0, w.q.dtype)}
    yp = {f"{base}_y_scale": ys, f"{base}_y_zero_point": yz}
    inputs.update(xp)
    inputs[w_name] = found["w_kn"]
    inputs.update(wp)
    inputs.update(yp)
    names = [x_name, *xp, w_name, *wp, *yp]
    res = found["residual"]
    if found["bias"] is not None:
        inputs[f"{base}_opfuse_bias"] = found["bias"].astype(np.int32)
        names.append(f"{base}_opfuse_bias")
    elif res is not None:
        names.append("")
    if res is not None:
        rp = _params(base, res, "r")
        inputs.update(rp)
        inputs[res.q.name] = bound[res.q.name] = res.q
        r_name = res.q.name
        if rows is not None:  # the residual's rows flattened as the input's (data movement on 8 bits)
            r_name, shape_name = f"{base}_opfuse_residual_q", f"{base}_opfuse_residual_shape"
            inputs[shape_name] = np.array([int(np.prod(rows)), res.q.shape[-1]], np.int64)
            ops.append(OnnxNode(f"{name}_opfuse_residual_reshape", "Reshape", 14, [res.q.name, shape_name], [r_name],
                                {}))
        names += [r_name, *rp]
    relu = _one(m, "relu")
    y_name = target.name if rows is None else f"{base}_opfuse_output_q"
    ops.append(OnnxNode(name, "QLinearMatMul", QLINEAR_VERSION, names, [y_name],
                        {"opfuse_requantize": "fixed", "opfuse_relu": int(relu is not None),
                         "opfuse_residual": int(res is not None)}))
    if rows is not None:
        shape_name = f"{base}_opfuse_output_shape"
        inputs[shape_name] = np.array(target.shape, np.int64)
        ops.append(OnnxNode(f"{name}_opfuse_output_reshape", "Reshape", 14, [y_name, shape_name], [target.name], {}))
    parts = ["DequantizeLinear"] + ([reshape.op_type] if reshape is not None else []) + [mm.op_type] \
        + (["Add(bias)"] if found["bias"] is not None else []) + (["Add(residual)"] if res is not None else []) \
        + (["Relu"] if relu is not None else []) + ["QuantizeLinear"]
    reason = f"{' -> '.join(parts)} as one integer matmul (int32 accumulator, fixed-point Requantize)"
    if rows is not None:
        reason += f", its {len(rows) + 1}-D input's rows flattened into one matrix"
    chains = list(x.nodes) + ([reshape] if reshape else []) + (list(res.nodes) if res is not None else [])
    return _write(m, ops, inputs, bound, reason, name, _absorbed(m, chains))


INTEGER_MATMUL_RULE = Rule(
    INTEGER_MATMUL, matmul_pattern(), condition=matmul_refusal, action=_matmul_action, priority=PRIORITY,
    kind="matmul_epilogue",
    description="DequantizeLinear -> [Flatten/Reshape] -> Gemm/MatMul -> [bias] -> [Add(residual)] -> [Relu] -> "
                "QuantizeLinear -> one integer matmul (int32 accumulator, fixed-point Requantize)")


# integer_matmul_dequantized ----------------------------------------------------------------------

def _dequantized_float_product(node: Node) -> bool:
    """A float Gemm / MatMul of a dequantized input (through a Flatten/Reshape) and a dequantized weight whose
    product (through an Add) is not quantized: the candidates, so that no other MatMul is refused in the log."""
    out = node.outputs[0]
    if out.dtype != np.float32 or len(node.inputs) < 2:
        return False
    a = node.inputs[0]
    if a is not None and a.producer is not None and a.producer.op_type in RESHAPES:
        a = a.producer.inputs[0]
    if isinstance(dequantized(a, "the input"), str) or isinstance(dequantized(node.inputs[1], "the weight"), str):
        return False
    users = [u for u, _ in out.uses]
    if len(users) == 1 and users[0].op_type == "Add":  # (integer_matmul's match refuses an Add it cannot take)
        return not _quantized_reader(users[0].outputs[0], (), adds=1)
    return not _quantized_reader(out, ())


def matmul_dequantized_pattern():
    """``Gemm | MatMul -> [Add]``: a product of dequantized 8-bit operands left in float."""
    return Op(*MATMUL_OPS).where(check(_dequantized_float_product, "dequantized_float_product")).named("mm").keep() \
        >> Op("Add").named("bias_add").keep().opt()


def _quantized_reader(v: Value, outputs, adds: int = 2) -> bool:
    """Is ``v`` read only by a quantization, directly or through Adds of dequantized tensors (a bias, a residual:
    ``adds`` at most) and a Relu (``integer_matmul``'s match)?"""
    users = [u for u, _ in v.uses]
    for _ in range(adds):
        add = users[0] if len(users) == 1 and users[0].op_type == "Add" and len(users[0].inputs) == 2 else None
        if add is None or add.outputs[0] in outputs:
            break
        other = add.inputs[1] if add.inputs[0] is v else add.inputs[0]
        if isinstance(dequantized(other, "the addend"), str):
            break
        v = add.outputs[0]
        users = [u for u, _ in v.uses]
    if len(users) == 1 and users[0].op_type == "Relu" and users[0].outputs[0] not in outputs:
        users = [u for u, _ in users[0].outputs[0].uses]
    return len(users) == 1 and users[0].op_type == "Div"


def _matmul_dequantized_match(m) -> dict | str:
    add = _one(m, "bias_add")
    last = (add if add is not None else m["mm"]).outputs[0]
    if add is not None:
        if _escapes(m, ("mm",)):
            return "the product is read besides its bias Add"
        other = add.inputs[1] if add.inputs[0] is m["mm"].outputs[0] else add.inputs[0]
        if len(add.inputs) != 2 or isinstance(dequantized(other, "the bias"), str):
            return "the bias is not an int32 constant behind a DequantizeLinear"
    if last not in m.graph.outputs and _quantized_reader(last, m.graph.outputs):
        return "the product is quantized (integer_matmul's match)"
    return _matmul_operands(m)


matmul_dequantized_refusal = refusal_of(_matmul_dequantized_match)


def _matmul_dequantized_action(m):
    found = _matmul_dequantized_match(m)
    if isinstance(found, str):
        return found
    mm, add = m["mm"], _one(m, "bias_add")
    target = (add if add is not None else mm).outputs[0]
    x, w, rows = found["x"], found["w"], found["rows"]
    name, base = mm.name, mm.outputs[0].name
    inputs: dict = {x.q.name: x.q}
    bound = {x.q.name: x.q}
    ops, x_name = _input_ops(found, name, base, inputs, bound)
    w_name, az, wz = f"{base}_opfuse_weight_kn", f"{base}_x_zero_point", f"{base}_opfuse_w_zero_point"
    inputs[w_name] = found["w_kn"]
    inputs[az] = x.zero
    inputs[wz] = w.zero if w.zero is not None else np.array(0, w.q.dtype)
    acc = f"{base}_opfuse_acc"
    ops.append(OnnxNode(name, "MatMulInteger", QLINEAR_VERSION, [x_name, w_name, az, wz], [acc], {}))
    if found["bias"] is not None:
        acc = _bias_add(ops, inputs, name, base, acc, found["bias"].astype(np.int32))
    y_name = target.name if rows is None else f"{base}_opfuse_dequantized"
    _dequantize(ops, inputs, name, base, acc, x, w.scale.astype(np.float32), y_name)
    if rows is not None:
        shape_name = f"{base}_opfuse_output_shape"
        inputs[shape_name] = np.array(target.shape, np.int64)
        ops.append(OnnxNode(f"{name}_opfuse_output_reshape", "Reshape", 14, [y_name, shape_name], [target.name], {}))
    parts = ["DequantizeLinear"] + ([found["reshape"].op_type] if found["reshape"] is not None else []) \
        + [mm.op_type] + (["Add(bias)"] if found["bias"] is not None else [])
    reason = f"{' -> '.join(parts)} as an integer matmul (int32 accumulator) dequantized to float"
    if rows is not None:
        reason += f", its {len(rows) + 1}-D input's rows flattened into one matrix"
    absorbs = _absorbed(m, list(x.nodes) + ([found["reshape"]] if found["reshape"] else []))
    return _write(m, ops, inputs, bound, reason, name, absorbs, target=target)


INTEGER_MATMUL_DEQUANTIZED_RULE = Rule(
    INTEGER_MATMUL_DEQUANTIZED, matmul_dequantized_pattern(), condition=matmul_dequantized_refusal,
    action=_matmul_dequantized_action, priority=PRIORITY, kind="matmul_epilogue",
    description="DequantizeLinear -> [Flatten/Reshape] -> Gemm/MatMul -> [bias] left in float -> an integer matmul "
                "(int32 accumulator, int32 bias) dequantized to float (x_scale * w_scale per column)")


def integer_rules() -> list[Rule]:
    return [INTEGER_CONV_RULE, INTEGER_CONV_DEQUANTIZED_RULE, INTEGER_MATMUL_RULE, INTEGER_MATMUL_DEQUANTIZED_RULE]


def quantizes(graph) -> bool:
    """Does the graph quantize anywhere (a Cast from a float to 8 bits)? The integer rules have nothing
    to match otherwise."""
    return any(n.op_type == "Cast" and n.outputs[0].dtype in EIGHT_BIT and n.inputs[0] is not None
               and n.inputs[0].dtype.kind == "f" for n in graph.nodes)


__all__ = ["INTEGER_CONV", "INTEGER_CONV_DEQUANTIZED", "INTEGER_MATMUL", "INTEGER_MATMUL_DEQUANTIZED",
           "INTEGER_CONV_RULE", "INTEGER_CONV_DEQUANTIZED_RULE", "INTEGER_MATMUL_RULE",
           "INTEGER_MATMUL_DEQUANTIZED_RULE", "integer_rules", "quantizes", "dequantized", "Dequantized",
           "conv_pattern", "conv_dequantized_pattern", "matmul_pattern", "matmul_dequantized_pattern",
           "BIAS_SCALE_RTOL"]
