"""Integer convolutions recognized in QDQ models, before import (while the int8 weights are visible).

    x_q -> DequantizeLinear(xs, xz) ----------------+
    W_q -> DequantizeLinear(ws, wz, axis=0) --------+-> Conv -> [Add(DequantizeLinear(r_q, rs, rz))]
    B_q -> DequantizeLinear(xs * ws, 0) (optional) -+        -> [Relu] -> QuantizeLinear(ys, yz) -> y_q

becomes one ``QLinearConv(x_q, xs, xz, W_q, ws, wz, ys, yz, B_q)`` marked ``opfuse_requantize="fixed"``
(imported as an int32 Conv, the int32 bias add and a fixed-point ``Requantize``: ``onnx_quantized``),
with ``opfuse_residual=1`` and the residual's ``r_q, rs, rz`` as inputs 9-11 when a residual Add of
another 8-bit tensor (per tensor) sat after the Conv (its own scale: a second term of the fixed-point
requantization), and ``opfuse_relu=1`` when a Relu sat before the QuantizeLinear: ``Q(Relu(y)) = max(Q(y), yz)``,
since Q is monotone and ``Q(0) = yz``, so the Relu is the clamp's lower bound. This is the
float model's arithmetic done in integers, as onnxruntime fuses the same pattern into QLinearConv:
the float path rounds the float32 convolution of dequantized values, the integer one is exact, so
they differ by at most one quantization step where a value lies near a rounding tie.

Likewise ``DQ(a_q) -> [Flatten/Reshape] -> Gemm/MatMul(DQ(W_q)) -> [Add(DQ(B_q))] -> [Relu] -> Q`` (a
classifier's fc; the quantizer leaves the Flatten between the pool's DQ and the Gemm, the same per-tensor
scale on either side) becomes ``QLinearMatMul(a_q', as, az, W_kn, ws, wz, ys, yz, B_q)`` marked the same
way, ``a_q'`` the Flatten/Reshape applied to the 8-bit tensor, ``W_kn`` the weight as ``K x N`` (a Gemm's
``transB`` applied to the constant), the int32 bias as a private ninth input; imported as an int32
MatMul, the bias Add and a fixed-point ``Requantize`` per output column (``codegen/qmatmul.py``). A Gemm
needs ``alpha = beta = 1`` and no ``transA``, the input a matrix, the weight quantized per tensor or per
output column.

The rewritten model is the importer's own (its private attributes make it invalid ONNX to others).

Conditions, each refusal with its reason (``recognize_integer_convs(..., refusals=list)``): the
scales and zero points are constants, the activations per tensor, the weight an int8 or uint8
constant quantized per tensor or along its output channels, the bias (if any) an int32 constant with
zero point 0 and scale ``xs * ws`` (to float32 rounding), and the Conv's (and Relu's) output read
only by the next op of the pattern and not a graph output.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx
from onnx import helper, numpy_helper

QUANT_8BIT = (np.dtype(np.int8), np.dtype(np.uint8))
BIAS_SCALE_RTOL = 1e-6  # the bias scale must be xs * ws to float32 rounding


class _Model:
    def __init__(self, model: onnx.ModelProto):
        g = model.graph
        self.model_graph = g
        self.consts = {i.name: i for i in g.initializer}
        self.producer = {o: n for n in g.node for o in n.output}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for n in g.node:
            for i in n.input:
                self.consumers[i].append(n)
        self.outputs = {o.name for o in g.output}
        self.shapes: dict[str, tuple] = {}
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # noqa: BLE001 - an uninferable model keeps its residual Adds in float
            inferred = g
        for vi in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
            dims = vi.type.tensor_type.shape.dim
            if vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
                self.shapes[vi.name] = tuple(d.dim_value for d in dims)

    def shape(self, name: str) -> tuple | None:
        """The static shape of ``name`` as the model's value infos or shape inference give it."""
        return self.shapes.get(name)

    def const(self, name: str) -> np.ndarray | None:
        t = self.consts.get(name)
        return None if t is None else numpy_helper.to_array(t)

    def only_consumer(self, name: str) -> onnx.NodeProto | None:
        users = self.consumers.get(name, [])
        return users[0] if len(users) == 1 and name not in self.outputs else None


def _axis(node: onnx.NodeProto) -> int:
    for a in node.attribute:
        if a.name == "axis":
            return int(a.i)
    return 1


def _dq_parts(m: _Model, name: str, what: str):
    """``(dq node, q input, scale, zero point)`` of the DequantizeLinear producing ``name``, or a reason."""
    dq = m.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return f"{what} is not the output of a DequantizeLinear"
    if any(a.name == "block_size" and a.i for a in dq.attribute):
        return f"{what} is dequantized in blocks"
    scale = m.const(dq.input[1])
    zp = m.const(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if scale is None or (len(dq.input) > 2 and dq.input[2] and zp is None):
        return f"{what}'s scale or zero point is not a constant"
    return dq, dq.input[0], scale, zp


def _relu_then_quantize(m: _Model, nxt: onnx.NodeProto | None, not_quantized: str, kernel: str):
    """(Relu or None, the QuantizeLinear) that end an integer kernel's pattern from ``nxt`` (an optional
    Relu, then a QuantizeLinear per tensor to 8 bits with constant parameters), or the refusal."""
    relu = None
    if nxt is not None and nxt.op_type == "Relu":
        relu, nxt = nxt, m.only_consumer(nxt.output[0])
    if nxt is None or nxt.op_type != "QuantizeLinear":
        return not_quantized
    ys = m.const(nxt.input[1])
    yz = m.const(nxt.input[2]) if len(nxt.input) > 2 and nxt.input[2] else None
    if ys is None or yz is None or ys.size != 1 or yz.size != 1 or yz.dtype not in QUANT_8BIT:
        return "the output is not quantized per tensor to int8 or uint8 with constant parameters"
    if any(a.name in ("output_dtype", "saturate", "precision") for a in nxt.attribute):
        return f"the QuantizeLinear has attributes opfuse does not fold into {kernel}"
    return relu, nxt


def _match(m: _Model, conv: onnx.NodeProto):
    """The pattern's nodes and operands at ``conv``, or the reason it is not one."""
    if len(conv.input) < 2:
        return "not a Conv with a weight"
    x = _dq_parts(m, conv.input[0], "the input")
    if isinstance(x, str):
        return x
    x_dq, x_q, xs, xz = x
    if xs.size != 1 or xz is None or xz.size != 1:
        return "the input is not quantized per tensor with a zero point"
    w = _dq_parts(m, conv.input[1], "the weight")
    if isinstance(w, str):
        return w
    w_dq, w_q, ws, wz = w
    w_arr = m.const(w_q)
    if w_arr is None or w_arr.dtype not in QUANT_8BIT:
        return "the weight is not an int8 or uint8 constant"
    channels = w_arr.shape[0]
    if ws.size != 1 and (ws.shape != (channels,) or _axis(w_dq) % w_arr.ndim != 0):
        return "the weight is not quantized per tensor or per output channel"
    bias = None
    if len(conv.input) > 2 and conv.input[2]:
        b = _dq_parts(m, conv.input[2], "the bias")
        if isinstance(b, str):
            return b
        b_dq, b_q, bs, bz = b
        b_arr = m.const(b_q)
        if b_arr is None or b_arr.dtype != np.int32 or b_arr.shape != (channels,):
            return "the bias is not an int32 constant of one value per output channel"
        if bz is not None and np.any(bz != 0):
            return "the bias has a non-zero zero point"
        want = (np.float32(xs.reshape(())) * ws.astype(np.float32)).astype(np.float64)
        if not np.allclose(bs.astype(np.float64), np.broadcast_to(want, bs.shape), rtol=BIAS_SCALE_RTOL, atol=0):
            return "the bias scale is not input scale x weight scale"
        bias = b_q
    nxt = m.only_consumer(conv.output[0])
    residual = None
    if nxt is not None and nxt.op_type == "Add" and len(nxt.input) == 2 and nxt.input[0] != nxt.input[1]:
        other = nxt.input[1] if nxt.input[0] == conv.output[0] else nxt.input[0]
        r = _dq_parts(m, other, "the residual")
        if isinstance(r, str):
            return r
        r_dq, r_q, rs, rz = r
        if rs.size != 1 or rz is None or rz.size != 1 or rz.dtype not in QUANT_8BIT:
            return "the residual is not quantized per tensor to int8 or uint8 with a zero point"
        if m.shape(conv.output[0]) is None or m.shape(conv.output[0]) != m.shape(other):
            return "the residual's shape is not known to be the Conv's output shape"
        residual = {"r_q": r_q, "rs": r_dq.input[1], "rz": r_dq.input[2], "add": nxt}
        nxt = m.only_consumer(nxt.output[0])
    tail = _relu_then_quantize(m, nxt, "the Conv's output is not quantized by its only reader (through a "
                                        "residual Add and a Relu at most)", "an integer conv")
    if isinstance(tail, str):
        return tail
    relu, nxt = tail
    return {"x_q": x_q, "xs": x_dq.input[1], "xz": x_dq.input[2] if len(x_dq.input) > 2 else "", "w_q": w_q,
            "ws": w_dq.input[1], "wz": w_dq.input[2] if len(w_dq.input) > 2 else "", "ys": nxt.input[1],
            "yz": nxt.input[2], "bias": bias, "relu": relu, "q": nxt, "residual": residual}


INTEGER_CONV = "integer_conv"  # the recognitions' names in the decision log (``import_log``)
INTEGER_MATMUL = "integer_matmul"


def recognize_integer_convs(model: onnx.ModelProto, refusals: list | None = None,
                            log: list | None = None) -> onnx.ModelProto:
    """``model`` with each DQ -> Conv -> [Relu] -> Q replaced (see the module docstring); the model
    itself when nothing matches. ``refusals`` collects ``(conv name, reason)`` for the rest; ``log`` every
    decision as ``(rule, "rewritten" | "refused", node names, what was done or why not)``, which the
    importer keeps on the graph (``Graph.import_log``) for the decision log, the report and ``explain``."""

    if not any(n.op_type in ("Conv",) + MATMUL_OPS for n in model.graph.node) \
            or not any(n.op_type == "QuantizeLinear" for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)  # the caller's model is left as it is
    g = out.graph
    m = _Model(out)
    replace: dict[str, onnx.NodeProto] = {}  # the QuantizeLinear's output -> the QLinearConv standing for it
    drop: set[str] = set()  # first outputs of the Conv and Relu nodes that go
    before: dict[str, list[onnx.NodeProto]] = defaultdict(list)  # nodes to insert before a replaced one
    for conv in g.node:
        if conv.op_type in MATMUL_OPS:
            _recognize_matmul(m, conv, (replace, drop, before), refusals, log)
            continue
        if conv.op_type != "Conv":
            continue
        found = _match(m, conv)
        if isinstance(found, str):
            if refusals is not None:
                refusals.append((conv.name or conv.output[0], found))
            if log is not None:
                log.append((INTEGER_CONV, "refused", (conv.name or conv.output[0],), found))
            continue
        xz, wz = found["xz"], found["wz"]
        if not wz:  # QLinearConv needs every operand: an absent zero point is 0 of the weight's type
            wz = f"{conv.output[0]}_opfuse_w_zero_point"
            w_arr = m.const(found["w_q"])
            assert w_arr is not None  # _match checked it is a constant
            g.initializer.append(numpy_helper.from_array(np.array(0, w_arr.dtype), wz))
        inputs = [found["x_q"], found["xs"], xz, found["w_q"], found["ws"], wz, found["ys"], found["yz"]]
        res = found["residual"]
        if found["bias"] is not None or res is not None:
            inputs.append(found["bias"] or "")
        if res is not None:
            inputs += [res["r_q"], res["rs"], res["rz"]]
        q = found["q"]
        node = helper.make_node("QLinearConv", inputs, list(q.output), name=conv.name or q.name,
                                opfuse_requantize="fixed", opfuse_relu=int(found["relu"] is not None),
                                opfuse_residual=int(res is not None))
        node.attribute.extend(a for a in conv.attribute)
        replace[q.output[0]] = node
        if log is not None:
            parts = ["DequantizeLinear", conv.op_type] + (["Add(residual)"] if res is not None else []) \
                + (["Relu"] if found["relu"] is not None else []) + ["QuantizeLinear"]
            log.append((INTEGER_CONV, "rewritten", (conv.name or conv.output[0], q.name or q.output[0]),
                        f"{' -> '.join(parts)} as one integer conv (int32 accumulator, fixed-point Requantize)"))
        drop.add(conv.output[0])
        if res is not None:
            drop.add(res["add"].output[0])
        if found["relu"] is not None:
            drop.add(found["relu"].output[0])
    if not replace:
        return model
    kept = []
    for n in g.node:
        if n.output[0] not in drop:
            for extra in before.get(n.output[0], ()):  # the 8-bit input's Flatten / Reshape
                kept.append(extra)
            c = onnx.NodeProto()
            c.CopyFrom(replace.get(n.output[0], n))
            kept.append(c)
    used = {i for n in kept for i in n.input} | {o.name for o in g.output}
    # DequantizeLinear nodes the pattern absorbed (nobody else reads their output) go too
    kept = [n for n in kept if n.op_type != "DequantizeLinear" or any(o in used for o in n.output)]
    del g.node[:]
    g.node.extend(kept)
    return out


# Gemm / MatMul ---------------------------------------------------------------------------------------
MATMUL_OPS = ("Gemm", "MatMul")
RESHAPES = ("Flatten", "Reshape")  # data movement the quantizer leaves between a DQ and a Gemm (same scale)


def _gemm_attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _dq_through_reshape(m: _Model, name: str):
    """``(reshape node or None, dq parts)`` of an activation that is ``DQ(q)`` or ``Flatten/Reshape(DQ(q))``."""
    prod = m.producer.get(name)
    if prod is not None and prod.op_type in RESHAPES:
        if prod.op_type == "Reshape" and m.const(prod.input[1]) is None:
            return "the input is reshaped to a run-time shape"
        parts = _dq_parts(m, prod.input[0], "the input")
        return parts if isinstance(parts, str) else (prod, parts)
    parts = _dq_parts(m, name, "the input")
    return parts if isinstance(parts, str) else (None, parts)


def _match_matmul(m: _Model, mm: onnx.NodeProto):
    """The DQ -> Gemm/MatMul -> [Add(DQ bias)] -> [Relu] -> Q pattern at ``mm``, or the reason it is not one."""
    attrs = _gemm_attrs(mm)
    if mm.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0
                                 or attrs.get("beta", 1.0) != 1.0):
        return "a Gemm with transA or alpha, beta other than 1"
    x = _dq_through_reshape(m, mm.input[0])
    if isinstance(x, str):
        return x
    reshape, (x_dq, x_q, xs, xz) = x
    if xs.size != 1 or xz is None or xz.size != 1:
        return "the input is not quantized per tensor with a zero point"
    shape = m.shape(mm.input[0])
    if shape is None or len(shape) != 2:
        return "the input is not known to be a matrix"
    w = _dq_parts(m, mm.input[1], "the weight")
    if isinstance(w, str):
        return w
    w_dq, w_q, ws, wz = w
    w_arr = m.const(w_q)
    if w_arr is None or w_arr.dtype not in QUANT_8BIT or w_arr.ndim != 2:
        return "the weight is not an int8 or uint8 constant matrix"
    trans_b = mm.op_type == "Gemm" and bool(attrs.get("transB", 0))
    n_axis = 0 if trans_b else 1
    N = w_arr.shape[n_axis]
    for what, v in (("scale", ws), ("zero point", wz)):
        if v is not None and v.size != 1 and (v.shape != (N,) or _axis(w_dq) % 2 != n_axis):
            return f"the weight's {what} is not per tensor or per output column"
    bias_name, bias_add, nxt = None, None, m.only_consumer(mm.output[0])
    if mm.op_type == "Gemm" and len(mm.input) > 2 and mm.input[2]:
        bias_name = mm.input[2]
    elif nxt is not None and nxt.op_type == "Add" and len(nxt.input) == 2:
        other = nxt.input[1] if nxt.input[0] == mm.output[0] else nxt.input[0]
        if isinstance(_dq_parts(m, other, "the bias"), tuple):
            bias_name, bias_add, nxt = other, nxt, m.only_consumer(nxt.output[0])
    bias = None
    if bias_name is not None:
        b = _dq_parts(m, bias_name, "the bias")
        if isinstance(b, str):
            return b
        b_dq, b_q, bs, bz = b
        b_arr = m.const(b_q)
        if b_arr is None or b_arr.dtype != np.int32 or b_arr.shape not in ((N,), (1, N)):
            return "the bias is not an int32 constant of one value per output column"
        if bz is not None and np.any(bz != 0):
            return "the bias has a non-zero zero point"
        want = (np.float32(xs.reshape(())) * ws.astype(np.float32)).astype(np.float64)
        if not np.allclose(bs.astype(np.float64), np.broadcast_to(want, bs.shape), rtol=BIAS_SCALE_RTOL, atol=0):
            return "the bias scale is not input scale x weight scale"
        bias = b_arr.reshape(N)
    tail = _relu_then_quantize(m, nxt, "the product is not quantized by its only reader (through a bias Add "
                                        "and a Relu at most)", "an integer matmul")
    if isinstance(tail, str):
        return tail
    relu, nxt = tail
    return {"reshape": reshape, "x_q": x_q, "xs": x_dq.input[1], "xz": x_dq.input[2],
            "w": w_arr.T if trans_b else w_arr, "w_name": w_q, "ws": w_dq.input[1],
            "wz": w_dq.input[2] if len(w_dq.input) > 2 else "", "bias": bias,
            "bias_add": bias_add, "relu": relu, "q": nxt}


def _recognize_matmul(m: _Model, mm: onnx.NodeProto, edits: tuple, refusals: list | None,
                      log: list | None = None) -> None:
    """One ``QLinearMatMul`` (``opfuse_requantize="fixed"``, the int32 bias as input 8) for the pattern at
    ``mm``: the weight as ``K x N`` (a Gemm's ``transB`` applied to the constant), the 8-bit input's
    Flatten / Reshape moved before the dequantization (the same per-tensor scale either way)."""
    replace, drop, before = edits
    found = _match_matmul(m, mm)
    name = mm.name or mm.output[0]
    if isinstance(found, str):
        if refusals is not None:
            refusals.append((name, found))
        if log is not None:
            log.append((INTEGER_MATMUL, "refused", (name,), found))
        return
    g_init = m.model_graph.initializer
    base = mm.output[0]
    x_q = found["x_q"]
    q = found["q"]
    if found["reshape"] is not None:
        r = onnx.NodeProto()
        r.CopyFrom(found["reshape"])
        del r.input[:]
        r.input.extend([x_q, *found["reshape"].input[1:]])
        del r.output[:]
        x_q = f"{base}_opfuse_input_q"
        r.output.append(x_q)
        r.name = f"{name}_opfuse_input_reshape"
        before[q.output[0]].append(r)
        if m.only_consumer(found["reshape"].output[0]) is mm:  # the float reshape goes (and its DQ, unread)
            drop.add(found["reshape"].output[0])
    w_name = f"{base}_opfuse_weight_kn"
    g_init.append(numpy_helper.from_array(np.ascontiguousarray(found["w"]), w_name))
    wz = found["wz"]
    if not wz:
        wz = f"{base}_opfuse_w_zero_point"
        g_init.append(numpy_helper.from_array(np.array(0, found["w"].dtype), wz))
    inputs = [x_q, found["xs"], found["xz"], w_name, found["ws"], wz, q.input[1], q.input[2]]
    if found["bias"] is not None:
        b_name = f"{base}_opfuse_bias"
        g_init.append(numpy_helper.from_array(found["bias"].astype(np.int32), b_name))
        inputs.append(b_name)
    if log is not None:
        parts = ["DequantizeLinear"] + (["Flatten" if found["reshape"].op_type == "Flatten" else "Reshape"]
                                        if found["reshape"] is not None else []) + [mm.op_type] \
            + (["Add(bias)"] if found["bias"] is not None else []) + (["Relu"] if found["relu"] is not None else []) \
            + ["QuantizeLinear"]
        log.append((INTEGER_MATMUL, "rewritten", (name, q.name or q.output[0]),
                    f"{' -> '.join(parts)} as one integer matmul (int32 accumulator, fixed-point Requantize)"))
    replace[q.output[0]] = helper.make_node("QLinearMatMul", inputs, list(q.output), name=name,
                                            opfuse_requantize="fixed", opfuse_relu=int(found["relu"] is not None))
    drop.add(mm.output[0])
    if found["bias_add"] is not None:
        drop.add(found["bias_add"].output[0])
    if found["relu"] is not None:
        drop.add(found["relu"].output[0])
