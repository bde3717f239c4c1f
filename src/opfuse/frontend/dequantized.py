"""Reading a DequantizeLinear back from the graph the importer wrote: ``Cast -> [Sub(zero point)] -> Mul(scale)``
(``onnx_decompose.dequantize_linear``), its parameters in their broadcast form. One reader for every place that
needs the DequantizeLinear again: the integer rules (``rules/integer_ops``), the 8-bit Concat (``rules/qconcat``) and
the exporter, which writes a kept dequantization of an integer constant as the DequantizeLinear it was
(``onnx_export.dequantize_chains``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opfuse.ir.graph import Value

# what a DequantizeLinear dequantizes here: 8-bit activations and weights, int32 biases
INTEGER_SOURCES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32))


@dataclass
class Dequantized:
    """``v = (float(q) - zero) * scale`` as the importer writes a DequantizeLinear; ``scale`` and
    ``zero`` as the DequantizeLinear had them (a size-1 one in its own shape, one per ``axis`` as a
    vector), ``zero`` in ``q``'s type (None: no zero point)."""

    q: Value
    scale: np.ndarray
    zero: np.ndarray | None
    axis: int | None  # the axis a vector scale runs along (None: per tensor)
    nodes: tuple = ()  # Cast, [Sub], Mul


def per_axis_param(c: np.ndarray, rank: int) -> tuple[np.ndarray, int | None] | None:
    """A DequantizeLinear parameter back from its broadcast form: size 1 as it is, or a vector along
    one axis of a rank-``rank`` tensor (None when it is neither)."""
    if c.size == 1:
        return c, None
    axes = [i for i, d in enumerate(c.shape) if d != 1]
    if len(c.shape) != rank or len(axes) != 1:
        return None
    return c.reshape(-1), axes[0]


def dequantized(v: Value | None, what: str) -> Dequantized | str:
    """The dequantization producing ``v`` (the scale on either side of the Mul), or the reason it is not one. A zero
    point must be an integer of ``q``'s type, as a DequantizeLinear's is (another Sub is arithmetic, not a
    dequantization)."""
    mul = v.producer if v is not None else None
    if mul is None or mul.op_type != "Mul" or len(mul.input_values()) != 2:
        return f"{what} is not the output of a DequantizeLinear"
    a, s = mul.inputs
    if a is None or s is None:
        return f"{what} is not the output of a DequantizeLinear"
    if a.const is not None and s.const is None:  # Mul(scale, x): the same product
        a, s = s, a
    sub = a.producer if a.producer is not None and a.producer.op_type == "Sub" else None
    cast = (sub.inputs[0].producer if sub is not None and sub.inputs[0] is not None else a.producer)
    if cast is None or cast.op_type != "Cast" or cast.input(0).dtype not in INTEGER_SOURCES \
            or cast.outputs[0].dtype != np.float32 or s.dtype != np.float32:
        return f"{what} is not the output of a DequantizeLinear"
    q = cast.input(0)
    zp = sub.inputs[1] if sub is not None else None
    if s.const is None or (zp is not None and zp.const is None):
        return f"{what}'s scale or zero point is not a constant"
    rank = len(q.shape)
    scale = per_axis_param(np.asarray(s.const), rank)
    zero = per_axis_param(np.asarray(zp.const), rank) if zp is not None else (None, None)
    if scale is None or zero is None or (scale[1] is not None and zero[1] is not None and scale[1] != zero[1]):
        return f"{what} is dequantized in blocks"
    z = None
    if zero[0] is not None:
        raw = np.asarray(zero[0]).astype(np.float64)
        info = np.iinfo(q.dtype)
        if not (np.all(raw == np.round(raw)) and raw.min() >= info.min and raw.max() <= info.max):
            return f"{what}'s zero point is not an integer of its {q.dtype.name} range"
        z = raw.astype(q.dtype)
    axis = scale[1] if scale[1] is not None else zero[1]
    chain = tuple(n for n in (cast, sub, mul) if n is not None)
    return Dequantized(q, np.asarray(scale[0], np.float32), z, axis, chain)
