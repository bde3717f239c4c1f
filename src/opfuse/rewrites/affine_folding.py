"""Fold a multiply or add by a per-channel constant into the linear op before it.

PP-OCR style exports write BatchNorm as ``Mul(conv, a) -> Add(., b)``; this rule folds each
step. With ``y = W (*) x + b`` and a constant ``c`` that varies only along ``y``'s output-channel
axis (broadcast shape ``(1, M, 1, 1)``, ``(M, 1, 1)``, a scalar, or ``(N,)`` for Gemm/MatMul):

    y * c  =  (W * c) (*) x + b * c          W'[m] = W[m] * c[m],  b' = b * c
    y / c  =  y * (1 / c)                    (refused when c has a zero)
    y + c  =  W (*) x + (b + c)              b' = b + c
    y - c  =  y + (-c)                       (only ``y - c``; ``c - y`` negates y and is left alone)

MatMul has no bias slot, so only Mul/Div fold into it (an Add stays, as the MatMul's epilogue).
Refusals: the constant varies along another axis or would broadcast the output to a larger
shape; the weight/bias is not constant or is shared; the op's output is read elsewhere.
"""
from __future__ import annotations

import numpy as np

from opfuse.patterns import Const, Op
from opfuse.rewrites.bn_folding import (channel_axis_refusal, current_bias, linear_producer_refusal,
                                        replacement, scale_weight)
from opfuse.rules.rule import Rule

FOLD_INTO = ("Conv", "ConvTranspose", "Gemm", "MatMul")
SHIFT_INTO = ("Conv", "ConvTranspose", "Gemm")  # ops with a bias input
SCALING_OPS = ("Mul", "Div")
SHIFTING_OPS = ("Add", "Sub")


def per_channel_axis(c: np.ndarray, out_shape: tuple[int, ...]) -> int | None | str:
    """The single output axis along which constant ``c`` varies when broadcast to ``out_shape``.

    Returns an axis, None when ``c`` is one value everywhere, or a string saying why it is not
    a per-channel constant.
    """
    rank = len(out_shape)
    if c.ndim > rank:
        return f"constant of rank {c.ndim} would broadcast the rank-{rank} output"
    shape = (1,) * (rank - c.ndim) + tuple(c.shape)
    varying = [i for i, d in enumerate(shape) if d != 1]
    for i in varying:
        if shape[i] != out_shape[i]:
            return f"constant shape {tuple(c.shape)} would broadcast the output {out_shape}"
    if len(varying) > 1:
        return f"constant shape {tuple(c.shape)} varies along axes {varying}, not one channel axis"
    return varying[0] if varying else None


def _affine_condition(m) -> str | None:
    node, op, c = m["node"], m["op"], m["c"]
    r = linear_producer_refusal(m.graph, op, node)
    if r is not None:
        return r.reason
    axis = per_channel_axis(np.asarray(c.const), op.output.shape)
    if isinstance(axis, str):
        return axis
    if axis is not None:
        r = channel_axis_refusal(op, axis)
        if r is not None:
            return r.reason
    if node.op_type in SHIFTING_OPS and op.op_type == "MatMul":
        return "MatMul has no bias input to absorb an Add"
    if node.op_type == "Div" and np.any(np.asarray(c.const) == 0):
        return f"divisor '{c.name}' has zeros"
    if node.output.dtype != op.output.dtype or node.output.shape != op.output.shape:
        return "the constant changes the output dtype or shape"
    return None


def _affine_action(m):
    node, op, c = m["node"], m["op"], m["c"]
    vec = np.asarray(c.const, dtype=np.float64)
    channels = op.output.shape[1] if op.op_type in ("Conv", "ConvTranspose") else op.output.shape[-1]
    vec = np.broadcast_to(vec.reshape(-1) if vec.size > 1 else vec.reshape(()), (channels,))
    w = np.asarray(op.inputs[1].const, dtype=np.float64)
    bias = current_bias(op)
    if node.op_type in SCALING_OPS:
        s = 1.0 / vec if node.op_type == "Div" else vec
        w, bias = scale_weight(op, s), bias * s
    else:
        bias = bias + (-vec if node.op_type == "Sub" else vec)
    return replacement(op, w, bias, op.name)


def fold_affine_rule() -> Rule:
    """``op -> Mul/Div/Add/Sub(constant)`` becomes ``op`` with folded weights and bias."""
    scale = Op("Mul", "Div")(Op(*FOLD_INTO).named("op").keep(), Const(name="c")).named("node")
    shift = Op("Add", "Sub")(Op(*SHIFT_INTO).named("op").keep(), Const(name="c")).named("node")
    return Rule("fold_affine_constant", scale | shift, condition=_affine_condition, action=_affine_action,
                priority=2.0, kind="rewrite",
                description="a per-channel multiply or add folded into the linear op before it")
