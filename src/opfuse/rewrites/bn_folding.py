"""Fold an inference BatchNormalization into the linear op before it.

BatchNorm is a per-channel affine map. With ``s = gamma / sqrt(var + eps)``:

    BN(y) = (y - mean) * s + beta = y * s + (beta - mean * s)

When ``y = W (*) x + b`` is linear in ``W`` and the channel ``c`` of ``y`` is output channel ``c``
of the op, scaling the weights of output channel ``c`` by ``s[c]`` scales ``y[c]``:

    W'[c] = W[c] * s[c]
    b'    = (b - mean) * s + beta                 (b = 0 when the op has no bias)

so ``BN(op(x; W, b)) = op(x; W', b')`` and one kernel (and one weight read) disappears.
Where the output channel lives in the weight:

* Conv ``W: (M, C/g, k...)``: axis 0.
* ConvTranspose ``W: (C, M/g, k...)``: output channel ``m = gi * (M/g) + j`` for group ``gi``
  and column ``j``, so W is viewed as ``(g, C/g, M/g, k...)`` and scaled along axes (0, 2).
* Gemm ``Y = alpha A' B' + beta C`` with ``Y: (M, N)``: BN's channel axis is 1, the columns of
  ``B'``: ``B`` is scaled along axis 1 (axis 0 when ``transB``), and
  ``C' = (beta C) * s + (beta_bn - mean * s)`` with the attribute beta set to 1.
* MatMul with a constant 2-D ``B: (K, N)`` and a 2-D input: scale ``B`` along axis 1; the pair
  becomes ``Gemm(A, B', C = beta - mean * s)``.

Refusals (the rewrite would be wrong or would change other nodes): a BatchNorm parameter,
the weight or the bias is not a constant; the weight or bias is shared with another node; the
linear op's output is also read elsewhere (that reader needs the un-normalised value); the
BatchNorm channel axis is not the op's output channel axis (MatMul with rank > 2 output).
All arithmetic is done in float64 and cast back to the weight's dtype.
"""
from __future__ import annotations

import numpy as np

from opfuse.rules.decisions import Refusal, refuse
from opfuse.ir.graph import Graph, Node
from opfuse.ops.registry import get_spec
from opfuse.patterns import Op
from opfuse.rewrites.edit import shared_const
from opfuse.rules.rule import Replacement, Rule, outside_readers

LINEAR_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
BN_PARAMS = ("scale", "B", "mean", "var")


def bn_scale_shift(bn: Node) -> tuple[np.ndarray, np.ndarray]:
    """``s = gamma / sqrt(var + eps)`` and ``shift = beta - mean * s`` in float64."""
    eps = float(get_spec("BatchNormalization").attrs_of(bn)["epsilon"])
    gamma, beta, mean, var = (np.asarray(bn.input(i).const, dtype=np.float64).reshape(-1) for i in range(1, 5))
    s = gamma / np.sqrt(var + eps)
    return s, beta - mean * s


def _weight_refusal(op: Node, index: int, what: str) -> Refusal | None:
    v = op.inputs[index] if index < len(op.inputs) else None
    if v is None:
        return None
    if not v.is_const:
        return refuse(f"{op.op_type} {what} '{v.name}' is not a constant")
    return shared_const(v, op)


def linear_producer_refusal(graph: Graph, op: Node, consumer: Node) -> Refusal | None:
    """Conditions shared by BN folding and Mul/Add folding: constant, unshared weights, and the
    op's output read only by ``consumer``."""
    if op.op_type == "MatMul" and op.input(0).is_const and not op.input(1).is_const:
        return refuse("MatMul's constant operand is A, not the weight B")
    for index, what in ((1, "weight"), (2, "bias")):
        r = _weight_refusal(op, index, what)
        if r is not None:
            return r
    if op.op_type == "MatMul" and len(op.input(1).shape) != 2:
        return refuse(f"MatMul weight '{op.input(1).name}' is not 2-D")
    escape = outside_readers([op.output], {id(consumer)}, graph)
    if escape is not None:
        return refuse(f"{op.op_type} output {escape}")
    if not np.issubdtype(op.output.dtype, np.floating):
        return refuse(f"{op.op_type} output is {op.output.dtype}, not floating point")
    return None


def channel_axis_refusal(op: Node, axis: int) -> Refusal | None:
    """The output axis that indexes ``op``'s output channels must be ``axis`` of its output."""
    rank = len(op.output.shape)
    if op.op_type in ("Conv", "ConvTranspose"):
        ok = axis == 1
    else:  # Gemm, MatMul: the channel is the last axis (columns)
        ok = axis == rank - 1
    if not ok:
        return refuse(f"the per-channel axis {axis} is not the output-channel axis of "
                            f"{op.op_type} output {op.output.shape}")
    return None


def scale_weight(op: Node, s: np.ndarray) -> np.ndarray:
    """``op``'s weight with output channel ``c`` multiplied by ``s[c]`` (float64)."""
    w = np.asarray(op.input(1).const, dtype=np.float64)
    if op.op_type == "Conv":
        return w * s.reshape((-1,) + (1,) * (w.ndim - 1))
    if op.op_type == "ConvTranspose":
        g = int(get_spec("ConvTranspose").attrs_of(op)["group"])
        c, mg = w.shape[0], w.shape[1]
        wv = w.reshape((g, c // g, mg) + w.shape[2:])
        return (wv * s.reshape((g, 1, mg) + (1,) * (w.ndim - 2))).reshape(w.shape)
    if op.op_type == "Gemm" and int(get_spec("Gemm").attrs_of(op)["transB"]):
        return w * s.reshape(-1, 1)
    return w * s.reshape(1, -1)  # Gemm (B: K x N) and MatMul (B: K x N)


def current_bias(op: Node) -> np.ndarray:
    """``op``'s effective additive term in float64 (Gemm: ``beta * C``), 0 when absent."""
    b = op.inputs[2] if len(op.inputs) > 2 else None
    if b is None:
        return np.zeros(())
    c = np.asarray(b.const, dtype=np.float64)
    if op.op_type == "Gemm":
        c = c * float(get_spec("Gemm").attrs_of(op)["beta"])
    return c


def new_bias(op: Node, bias: np.ndarray) -> np.ndarray:
    """A bias for ``op``'s bias slot, in the op's dtype (Gemm: C with the attribute beta = 1)."""
    if op.op_type in ("Conv", "ConvTranspose"):
        bias = np.broadcast_to(bias, (op.output.shape[1],))
    return np.ascontiguousarray(bias).astype(op.output.dtype)


def replacement(op: Node, weight: np.ndarray, bias: np.ndarray, name: str) -> Replacement:
    """``op`` again, with a new weight and bias (a MatMul with a bias becomes a Gemm, C = bias)."""
    w = weight.astype(op.input(1).dtype)
    b = new_bias(op, bias)
    if op.op_type == "MatMul":
        if not np.any(b):
            return Replacement("MatMul", [op.inputs[0], w], {}, name=name)
        return Replacement("Gemm", [op.inputs[0], w, b], {}, name=name)
    attrs = dict(op.attrs)
    if op.op_type == "Gemm":
        attrs["beta"] = 1.0
    return Replacement(op.op_type, [op.inputs[0], w, b], attrs, name=name)


def _bn_condition(m) -> str | None:
    bn, op = m["bn"], m["op"]
    graph = m.graph
    for v, what in zip(bn.inputs[1:5], BN_PARAMS, strict=True):
        if v is None or not v.is_const:
            return f"BatchNorm parameter {what} '{v.name if v else '?'}' is not a constant"
    r = linear_producer_refusal(graph, op, bn) or channel_axis_refusal(op, 1)
    if r is not None:
        return r.reason
    if len(bn.output.shape) < 2:
        return "BatchNorm input has rank < 2"
    if op.op_type == "MatMul" and len(op.inputs[0].shape) != 2:
        return f"MatMul input '{op.inputs[0].name}' is not 2-D (the folded op is a Gemm)"
    return None


def _bn_action(m):
    bn, op = m["bn"], m["op"]
    s, shift = bn_scale_shift(bn)
    return replacement(op, scale_weight(op, s), current_bias(op) * s + shift, op.name)


def fold_batchnorm_rule() -> Rule:
    """``op -> BatchNormalization`` becomes ``op`` with folded weights (see the module docstring)."""
    op = Op(*LINEAR_OPS).named("op").keep()
    return Rule("fold_batchnorm", Op("BatchNormalization")(op).named("bn"), condition=_bn_condition,
                action=_bn_action, priority=2.0, kind="rewrite",
                description="BatchNorm folded into the weights and bias of the linear op before it")
